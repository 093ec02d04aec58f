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
