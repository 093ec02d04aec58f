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
def report(span, links, stamps=False, changes=None):
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
    if changes is not None:  # the shared-memory splits (probes since session 87)
        text += f"""
shared-memory configuration (CUPTI's sharedMemoryExecuted: the SM's shared memory the driver set for the launch):

| kernel | registers a thread | shared memory a CTA, KB | function's carveout, % | SM configured, KB (share of launches) |
|---|---:|---:|---:|---|
| `ffn` | 64 | 21.0 | — | 100 (100 %) |

configuration changes between consecutive kernels: {changes} a step (median)

| after … | … starts under another configuration | times a step | from → to, KB |
|---|---|---:|---|
| `qkv` | `attention` | 38.0 | 100 → 164 |
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


def test_timeline_pair_shared_memory_split_changes(tmp_path):
    pair = load_lab("profiles/timeline_pair")
    a, b, old = tmp_path / "a.md", tmp_path / "b.md", tmp_path / "old.md"
    a.write_text(report(1186.7, [("gemv", "ffn", 38.0, 11.0)], changes=76.0))
    b.write_text(report(1150.2, [("gemv", "ffn", 38.0, 10.5)], changes=0.0))
    old.write_text(report(1186.7, [("gemv", "ffn", 38.0, 11.0)]))
    t = pair.table(pair.read(str(a)), pair.read(str(b)), ["base", "c100"])
    assert "shared-memory split changes a step: base 76.0, c100 0.0" in t
    assert "| `qkv` | `attention`" not in t                               # a split row is no link
    t = pair.table(pair.read(str(old)), pair.read(str(b)), ["old", "c100"])
    assert "shared-memory split changes a step: old —, c100 0.0" in t     # a report from before
    t = pair.table(pair.read(str(old)), pair.read(str(old)), ["x", "y"])
    assert "split changes" not in t


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


sass = load_lab("profiles/sass_load_chains")

SASS = """
        Function : _Z6kernelv
        /*0000*/                   LDG.E.128 R20, desc[UR4][R2.64] ;   /* 0x0 */
        /*0010*/                   LDGSTS.E.BYPASS.128 [R5], desc[UR4][R6.64] ;   /* 0x0 */
        /*0020*/                   ACQBULK ;   /* 0x0 */
        /*0030*/               @!P0 CCTL.E.PF1 [R8+0x1000] ;   /* 0x0 */
        /*0040*/                   LDG.E R4, desc[UR4][R8.64] ;   /* 0x0 */
        /*0050*/                   LDGSTS.E.BYPASS.128 [R5], desc[UR4][R6.64] ;   /* 0x0 */
        /*0060*/                   FFMA R10, R4, R11, R10 ;   /* 0x0 */
        /*0070*/               @P1 LDG.E.128.CONSTANT R12, desc[UR4][R8.64+0x10] ;   /* 0x0 */
        /*0080*/                   LD.E.64 R16, desc[UR4][R2.64] ;   /* 0x0 */
        /*0090*/                   IMAD R3, R14, R3, RZ ;   /* 0x0 */
        /*00a0*/                   STG.E desc[UR4][R6.64], R17 ;   /* 0x0 */
        Function : _Z8no_waitv
        /*0000*/                   LDG.E R4, desc[UR4][R8.64] ;   /* 0x0 */
        /*0010*/                   EXIT ;   /* 0x0 */
        Function : _Z9no_loadsv
        /*0000*/                   ACQBULK ;   /* 0x0 */
        /*0010*/                   EXIT ;   /* 0x0 */
"""


def test_sass_groups_end_where_a_loaded_register_is_read():
    (name, body), _, _ = sass.functions(SASS)
    groups, prefetches, waits = sass.chains(body)
    assert waits
    # the load before the wait and the cp.async copies are not counted; R4's use ends the first
    # group, R14 (inside the .128 load's R12–R15) the second, whose 64-bit load joined it
    assert [[a for a, _ in g] for g in groups] == [[0x40], [0x70, 0x80]]
    assert prefetches == [(0x30, "CCTL.E.PF1")]


def test_sass_report_lists_kernels_with_loads_and_says_where_it_starts():
    out = sass.report(SASS)
    assert "2 dependent group(s) of global loads after its wait, 1 prefetch(es)" in out
    assert "1 dependent group(s) of global loads from its start (no wait)" in out
    assert "no_loads" not in out and "_Z9no_loadsv" not in out
    assert "no_loads" in sass.report(SASS, show_all=True) or "_Z9no_loadsv" in sass.report(SASS, show_all=True)
    assert sass.report(SASS, pattern="no_such_kernel") == ""


def test_sass_says_why_cuobjdump_failed(tmp_path, monkeypatch):
    tool = tmp_path / "cuobjdump"
    tool.write_text("#!/bin/sh\necho \"cuobjdump fatal   : Could not find executable file 'nvdisasm'\" >&2\nexit 1\n")
    tool.chmod(0o755)
    obj = tmp_path / "k.o"
    obj.write_bytes(b"")
    monkeypatch.setenv("CUOBJDUMP", str(tool))
    monkeypatch.setattr("sys.argv", ["sass_load_chains.py", str(obj)])
    with pytest.raises(SystemExit) as e:
        sass.main()
    assert "failed (1)" in str(e.value) and "nvdisasm" in str(e.value)
