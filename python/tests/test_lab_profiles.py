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
