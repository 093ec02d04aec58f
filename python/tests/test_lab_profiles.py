"""The kernel-profile summaries of lab/profiles/ (decode_profile.py for twell's probes under ncu,
torch_prefill_profile.py's kernel kinds) on hand-made inputs: steps split at each argmax kernel,
times and bytes summed per kernel, units scaled, GEMMs apart by grid on request."""
import pytest

from bench_script import load_lab

profile = load_lab("profiles/decode_profile")

HEADER = '"ID","Kernel Name","Grid Size","Metric Name","Metric Unit","Metric Value"\n'


def row(i, name, grid, metric, unit, value):
    return f'"{i}","{name}","{grid}","{metric}","{unit}","{value}"\n'


def write_csv(tmp_path, rows):
    p = tmp_path / "ncu.csv"
    p.write_text("==PROF== noise before the table\n" + HEADER + "".join(rows))
    return str(p)


def launches(tmp_path):
    rows = []
    kernels = [("sm90_xmma_gemm_bf16", "(48, 1, 1)", 10.0, 4.0),   # dense step: two GEMM shapes
               ("sm90_xmma_gemm_bf16", "(16, 4, 1)", 20.0, 6.0),
               ("void twell::cuda::ops::argmax_kernel(float const*)", "(1, 1, 1)", 1.0, 1.0),
               ("sm90_xmma_gemm_bf16", "(48, 1, 1)", 8.0, 4.0),    # automatic step
               ("void twell::cuda::ops::argmax_kernel(float const*)", "(1, 1, 1)", 1.0, 1.0)]
    for i, (name, grid, us, mb) in enumerate(kernels):
        rows.append(row(i, name, grid, "gpu__time_duration.sum", "usecond", us))
        rows.append(row(i, name, grid, "dram__bytes_read.sum", "Mbyte", mb))
    return profile.read(write_csv(tmp_path, rows))


def test_steps_split_at_argmax_and_sums(tmp_path):
    steps = profile.split_steps(launches(tmp_path))
    assert [len(s) for s in steps] == [3, 2]
    t = profile.table(steps[0], "dense FFN path")
    assert "3 kernels, 31 µs of kernel time, 11 MB read" in t
    assert "| `cuBLASLt GEMM` | 2 | 30.0 |" in t
    assert "| `argmax_kernel` | 1 | 1.0 | 3.2 % | 1.0 |" in t


def test_gemm_grids_keep_shapes_apart(tmp_path):
    steps = profile.split_steps(launches(tmp_path))
    t = profile.table(steps[0], "dense FFN path", gemm_grids=True)
    assert "| `cuBLASLt GEMM grid (16, 4, 1)` | 1 | 20.0 |" in t
    assert "| `cuBLASLt GEMM grid (48, 1, 1)` | 1 | 10.0 |" in t


def test_nanoseconds_scale_and_unknown_units_stop(tmp_path):
    rows = [row(0, "k", "(1, 1, 1)", "gpu__time_duration.sum", "nsecond", "2,500")]
    (k,) = profile.read(write_csv(tmp_path, rows))
    assert k["gpu__time_duration.sum"] == pytest.approx(2.5)
    with pytest.raises(SystemExit):
        profile.read(write_csv(tmp_path, [row(0, "k", "(1, 1, 1)", "m", "furlong", "1")]))


def test_torch_kernel_kinds():
    torch_profile = load_lab("profiles/torch_prefill_profile")
    assert torch_profile.kind("nvjet_hsh_256x128_64x4_2x1_v_bz_coopB_TNT") == "GEMM"
    assert torch_profile.kind("sm90_xmma_gemm_bf16bf16_bf16f32") == "GEMM"
    assert torch_profile.kind("flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>") == "attention"
    assert torch_profile.kind("pytorch_flash::flash_fwd_kernel") == "attention"
    assert torch_profile.kind("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "Triton (fused element-wise, norms)"
    assert torch_profile.kind("void at::native::vectorized_elementwise_kernel") == "other"


# Two twell_probe_timeline reports as gpu_decode_timeline.sh writes them, hand-made: a section per
# FFN path (span, kernel table, links, a step's kernels), then phase-stamp tables whose rows must not
# be read as links.
def report(span, links, stamps=False):
    rows = "\n".join(f"| `{a}` | `{b}` | {t} | {us} | {t * us:.1f} |" for a, b, t, us in links)
    text = f"""# A graph-replayed decode step, kernel by kernel (CUPTI)

## automatic (sparse) FFN path: 32 steps traced, 157 kernels a step

step span (first start to argmax end) {span} us median; kernels' durations 2000.9 us; idle between kernels 1.8 us

| kernel | launches a step | us a step | us a launch | idle before it, us a step |
|---|---:|---:|---:|---:|
| `ffn` | 38.0 | 550.2 | 14.48 | 0.0 |

links: how long each kernel ends after the one before it ends (median over every occurrence):

| after … ends | … ends | times a step | µs, median | µs a step |
|---|---|---:|---:|---:|
{rows}

kernels 76 .. 83 of the median step (≈ 4 a layer), µs from the step's start:

| kernel | start | duration | gap after the previous one's end |
|---|---:|---:|---:|
| `ffn` | 669.18 | 17.44 | -3.84 |
"""
    if stamps:
        text += """
### phase stamps, automatic (sparse) FFN path: 16 steps with stamps on

#### `gemv` → `ffn`: 608 launches

| `0 entry` | `x` | 1.0 | 7.94 | 0.26 |
"""
    return text


def test_timeline_pair_sides_and_deltas(tmp_path):
    pair = load_lab("profiles/timeline_pair")
    a = tmp_path / "a.md"
    b = tmp_path / "b.md"
    a.write_text(report(1186.7, [("gemv", "ffn", 38.0, 11.0), ("qkv", "attention", 37.0, 6.9)]))
    b.write_text(report(1223.7, [("gemv", "ffn", 38.0, 11.25), ("ffn", "qkv", 37.0, 7.0)], stamps=True))
    t = pair.table(pair.read(str(a)), pair.read(str(b)), ["later", "new"])
    assert "### automatic (sparse) FFN path" in t
    assert "step span: later 1186.7 µs, new 1223.7 µs (+37.0 µs, 1.031×)" in t
    assert "| `gemv` | `ffn` | 38.0 | 11.00 | 11.25 | +0.25 | +9.5 |" in t
    assert "| `qkv` | `attention` | 37.0 | 6.90 | — | — | — |" in t   # only in A
    assert "| `ffn` | `qkv` | 37.0 | — | 7.00 | — | — |" in t         # only in B
    assert "`0 entry`" not in t                                          # a stamp row is no link
    lines = [l for l in t.splitlines() if l.startswith("| `")]
    assert lines[0].startswith("| `gemv`")                               # the longest link a step first


def test_timeline_pair_refuses_what_is_not_a_report(tmp_path):
    pair = load_lab("profiles/timeline_pair")
    p = tmp_path / "x.md"
    p.write_text("twell_probe_timeline rc=1\n")
    with pytest.raises(SystemExit):
        pair.read(str(p))
    a = tmp_path / "a.md"
    a.write_text(report(1.0, [("x", "y", 1.0, 1.0)]))
    with pytest.raises(SystemExit):
        pair.main([str(a), str(a), "--names", "only-one"])
