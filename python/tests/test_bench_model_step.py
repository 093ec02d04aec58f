"""bench/train/model_step.py's dense modes compute the same loss as its twell modes: the dense MLP's
L1 term equals twell.torch.ffn's (Σ|h| / rows, h = ReLU(x·Wgᵀ) ⊙ x·Wuᵀ of either sign) and a
float64 hand computation, and its output equals transformers' LlamaMLP with ReLU (CPU). Its
twell-dense-compiled mode holds twell's CUDA calls on their dense path, the other twell modes not.
Its no-ffn-compiled MLP computes nothing and leaves the optimiser the same parameters to update."""
import pytest

from bench_script import load_bench

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tt = pytest.importorskip("twell.torch")


def test_dense_mlp_l1_is_twells_l1():
    ms = load_bench("train/model_step")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=96, hidden_act="relu")
    mlp = transformers.models.llama.modeling_llama.LlamaMLP(cfg)
    x = torch.randn(2, 7, 32)
    dense = ms.dense_relu_mlp(mlp)
    y = dense(x)
    torch.testing.assert_close(y, mlp(x), rtol=0, atol=0)
    x64 = x.reshape(-1, 32).double()
    wg, wu = mlp.gate_proj.weight.double(), mlp.up_proj.weight.double()
    h = torch.relu(x64 @ wg.T) * (x64 @ wu.T)
    assert (h < 0).any(), "the check needs h of both signs"
    want = h.abs().sum() / h.shape[0]
    torch.testing.assert_close(dense.l1.double(), want, rtol=1e-5, atol=0)
    _, l1 = tt.ffn(x.reshape(-1, 32), mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight.detach().requires_grad_())
    torch.testing.assert_close(dense.l1, l1, rtol=1e-5, atol=0)


def test_twell_dense_compiled_holds_the_dense_path():
    ms = load_bench("train/model_step")
    from twell import _cuda

    try:
        assert ms.hold_twell_path("twell-dense-compiled") == "dense" and _cuda.path == "dense"
        for mode in ("twell", "twell-compiled"):
            assert ms.hold_twell_path(mode) == "automatic" and _cuda.path == "automatic"
    finally:
        _cuda.path = "automatic"


def test_no_ffn_mlp_computes_nothing_and_keeps_its_weights_in_the_step():
    ms = load_bench("train/model_step")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=40, hidden_act="relu")
    mlp = transformers.models.llama.modeling_llama.LlamaMLP(cfg)
    none = ms.no_ffn_mlp(mlp)
    assert [id(p) for p in none.parameters()] == [id(p) for p in mlp.parameters()]
    x = torch.randn(3, 5, 32, requires_grad=True)
    y = none(x)
    assert y.shape == x.shape and not y.any() and float(none.l1) == 0.0
    (x + y).sum().backward()  # the layer's residual add: x's gradient passes, the MLP's weights get none
    assert all(p.grad is None for p in none.parameters())
    none.zero_grads()
    for p in none.parameters():
        assert p.grad is not None and p.grad.shape == p.shape and not p.grad.any()


def test_repeated_runs_compare_medians():
    """With --repeat, every run gets its row, the ratios are against the dense modes' medians, and a
    per-mode summary gives each mode's median and range."""
    ms = load_bench("train/model_step")

    def run(mode, i, step, peak):
        return {"mode": mode, "run": i, "step_ms": step, "tokens_per_s": 1e6, "peak_gib": peak, "twell_context_gib": 0.0,
                "density_start_mean": None, "density_mean": None, "ce": [1.0, 1.0]}

    res = {"gpu": "test", "commit": "x", "date": "d", "seq": 8, "micro_batch": 1, "steps": 2, "warmup": 1, "lr": 0.0,
           "l1_coeff": 0.0, "repeat": 3,
           "config": {"name": "t", "layers": 1, "hidden": 8, "ffn": 16, "vocab": 10, "params_m": 0.1},
           "modes": [run("dense-compiled", 0, 100.0, 10.0), run("twell-compiled", 0, 50.0, 5.0),
                     run("dense-compiled", 1, 300.0, 10.0), run("twell-compiled", 1, 80.0, 6.0),
                     run("dense-compiled", 2, 120.0, 12.0), run("twell-compiled", 2, 60.0, 7.0)]}
    md = ms.table(res)
    assert "| twell-compiled (run 1) | 50.0 |" in md and "| 2.40× |" in md  # 120 (dense median) / 50
    assert "| twell-compiled | 3 | 60.0 | 50.0 – 80.0 | 2.00× | 6.00 |" in md
    assert "| dense-compiled | 3 | 120.0 | 100.0 – 300.0 | 1.00× | 10.00 |" in md
