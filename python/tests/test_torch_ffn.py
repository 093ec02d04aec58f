"""twell.torch on the CPU: forward and gradients against a float64 reference, gradcheck, opcheck
(schema, fake tensors, autograd registration, AOT dispatch), torch.compile(fullgraph=True) against
eager, SparseMLP as a Llama MLP, bad input.

Bounds. Training path: float32 GEMMs and sums against float64, relative to the output's scale:
≤ 1e-4 (K ≤ 300 terms of rounding 2⁻²⁴ each, far inside). Inference path: TwELL stores gate values
as bf16 (the format's storage), so its reference rounds g to bf16 first; an element-wise bound
covers the one-ulp rounding flips between the kernel's float32 g and the reference's float64 g.
A wrong index, a missed neuron or a dropped tail row moves outputs by O(1) relative.
"""
import math

import pytest

torch = pytest.importorskip("torch")
tt = pytest.importorskip("twell.torch")

from twell import _twell  # noqa: E402


def make(m, k, n, gated=True, density_bias=0.0, seed=0, dtype=torch.float32):
    """x [m, k] and weights whose gate pre-activations are shifted by density_bias (negative: sparser)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g, dtype=torch.float64)
    x[:, 0] = 1.0  # a constant channel: column 0 of the gate is a per-neuron bias
    wg = torch.randn(n, k, generator=g, dtype=torch.float64) / math.sqrt(k)
    wu = torch.randn(n, k, generator=g, dtype=torch.float64) / math.sqrt(k)
    wd = torch.randn(k, n, generator=g, dtype=torch.float64) / math.sqrt(n)
    gate = wg if gated else wu
    gate[:, 0] += density_bias
    return [t.to(dtype) for t in (x, wg if gated else None, wu, wd) if t is not None] if gated else \
        [x.to(dtype), None, wu.to(dtype), wd.to(dtype)]


def reference(x, wg, wu, wd, round_gate_bf16=False):
    x, wu, wd = x.double(), wu.double(), wd.double()
    if wg is None:
        h = torch.relu(x @ wu.T)
        if round_gate_bf16:  # non-gated: TwELL holds h itself
            h = h.to(torch.bfloat16).double()
    else:
        g = torch.relu(x @ wg.double().T)
        if round_gate_bf16:
            g = g.to(torch.bfloat16).double()
        h = g * (x @ wu.T)
    return h @ wd.T, h.abs().sum() / x.shape[0], h


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


CASES = [  # m, k, n, gated, bias, ell_width
    (1, 64, 176, True, -1.5, 128),
    (37, 64, 176, True, -1.0, 128),
    (300, 96, 520, True, -2.0, 8),      # rows over E = 8 non-zeros go to the dense tail
    (64, 64, 256, True, 0.5, 16),        # dense-ish: most rows in the tail
    (50, 72, 200, False, -1.0, 128),     # non-gated
    (33, 40, 130, False, 0.0, 4),
]


@pytest.mark.parametrize("m,k,n,gated,bias,ell", CASES)
def test_training_forward_and_gradients_match_float64(m, k, n, gated, bias, ell):
    x, wg, wu, wd = make(m, k, n, gated, bias, seed=m + n)
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, wg, wu, wd)]
    y, l1 = tt.ffn(*leaves, ell_width=ell)
    yr, l1r, h = reference(x, wg, wu, wd)
    assert (h != 0).any() and (h == 0).any()
    assert rel(y, yr) < 1e-4
    assert abs(l1.item() - l1r.item()) <= 1e-4 * l1r.item()
    coeff = 0.37
    dy = torch.randn(m, k, generator=torch.Generator().manual_seed(7))
    (y * dy).sum().add(coeff * l1).backward()
    ref = [t.double().clone().requires_grad_() if t is not None else None for t in (x, wg, wu, wd)]
    yd, l1d, _ = reference(*ref)
    (yd * dy.double()).sum().add(coeff * l1d).backward()
    for got, want, name in zip(leaves, ref, ("x", "w_gate", "w_up", "w_down")):
        if want is None:
            continue
        assert rel(got.grad, want.grad) < 1e-4, name


@pytest.mark.parametrize("m,k,n,gated,bias,ell", CASES)
def test_inference_matches_bf16_gate_reference(m, k, n, gated, bias, ell):
    x, wg, wu, wd = make(m, k, n, gated, bias, seed=m * 3 + n)
    with torch.no_grad():
        y, l1 = tt.ffn(x, wg, wu, wd)
    assert math.isnan(l1.item())
    yr, _, _ = reference(x, wg, wu, wd, round_gate_bf16=True)
    # The kernel rounds its float32 g to bf16, the reference its float64 g: at a rounding boundary
    # the two may land one bf16 ulp (≤ 2⁻⁷ relative) apart, so each output may differ by up to
    # Σₙ 2⁻⁷·|gₙ uₙ|·|Wd[k, n]| beyond the float32 noise (1e-4 of the output scale).
    x64, wu64, wd64 = x.double(), wu.double(), wd.double()
    gu = (torch.relu(x64 @ wg.double().T) * (x64 @ wu64.T)).abs() if gated else torch.relu(x64 @ wu64.T)
    bound = 2.0 ** -7 * gu @ wd64.abs().T + 1e-4 * yr.abs().max()
    assert ((y.double() - yr).abs() <= bound).all()
    assert rel(y, yr) < 2e-3  # and the whole stays within a few flips of the output scale


def test_backward_op_with_non_contiguous_operands():
    """The public backward op called on tensors stored transposed (`ffn` makes its operands
    contiguous first; a direct caller need not): it reads them through contiguous copies and writes
    its gradients into contiguous buffers of its own, never into a copy that would take them away.
    Against the same op on contiguous operands, each computed into memory poisoned with NaN first, so
    a gradient left unwritten cannot pass by holding a freed buffer's bits."""
    x, wg, wu, wd = make(24, 64, 176, True, -1.0)
    _, _, _, state, _ = tt.ffn_train(x, wg, wu, wd, 128)
    dy = torch.randn(24, 64, generator=torch.Generator().manual_seed(1))
    dl1 = torch.tensor(0.5)
    want = tt.ffn_train_backward(x, dy, wg, wu, wd, state, dl1)
    for _ in range(4):  # NaN into whatever the allocator hands out next
        torch.full((176 * 64,), float("nan"))
    strided = [t.T.contiguous().T for t in (x, dy, wg, wu, wd)]
    assert not any(t.is_contiguous() for t in strided)
    sx, sdy, swg, swu, swd = strided
    got = tt.ffn_train_backward(sx, sdy, swg, swu, swd, state, dl1)
    for g, w in zip(got, want):
        assert g.is_contiguous() and torch.equal(g, w)


def test_leading_dimensions_dtypes_and_empty_batches():
    x, wg, wu, wd = make(24, 64, 176, True, -1.0)
    y2, _ = tt.ffn(x, wg, wu, wd)
    y3, _ = tt.ffn(x.reshape(2, 3, 4, 64), wg, wu, wd)
    assert y3.shape == (2, 3, 4, 64) and torch.equal(y3.reshape(24, 64), y2)
    yb, _ = tt.ffn(x.bfloat16(), wg.bfloat16(), wu.bfloat16(), wd.bfloat16())
    assert yb.dtype == torch.bfloat16 and rel(yb, y2) < 3e-2  # bf16 inputs and output rounding
    xt = torch.randn(64, 24).T  # non-contiguous
    assert torch.equal(tt.ffn(xt, wg, wu, wd)[0], tt.ffn(xt.contiguous(), wg, wu, wd)[0])
    empty = x[:0].clone().requires_grad_()
    y0, l10 = tt.ffn(empty, wg, wu, wd)
    assert y0.shape == (0, 64)
    y0.sum().backward()
    assert empty.grad.shape == (0, 64)


def test_gradcheck_small_shapes():
    # float32 inside: central differences with eps 1e-3 carry ~1e-4 rounding noise, hence atol 1e-2;
    # the inputs keep every gate pre-activation ≥ 0.05 away from ReLU's kink (eps cannot flip one).
    for gated in (True, False):
        for seed in range(50):
            x, wg, wu, wd = make(5, 8, 12, gated, -0.3, seed=seed, dtype=torch.float64)
            pre = x @ (wg if gated else wu).T
            if pre.abs().min() > 0.05 and (pre > 0).any() and (pre < 0).any():
                break
        ins = tuple(t.requires_grad_() for t in (x, wg, wu, wd) if t is not None)

        def f(*a):
            y, l1 = tt.ffn(a[0], a[1] if gated else None, a[-2], a[-1])
            return y, l1

        assert torch.autograd.gradcheck(f, ins, eps=1e-3, atol=1e-2, rtol=1e-2)


def test_opcheck_all_ops():
    x, wg, wu, wd = make(37, 64, 176, True, -1.0)
    torch.library.opcheck(torch.ops.twell.ffn_infer.default, (x, wg, wu, wd))
    leaves = [t.clone().requires_grad_() for t in (x, wg, wu, wd)]
    torch.library.opcheck(torch.ops.twell.ffn_train.default, (*leaves, 128))
    xn, _, wun, wdn = make(20, 40, 100, False, -1.0)
    torch.library.opcheck(torch.ops.twell.ffn_train.default, (xn.requires_grad_(), None, wun.requires_grad_(),
                                                              wdn.requires_grad_(), 8))
    y, l1, l0, state, _ = torch.ops.twell.ffn_train(x, wg, wu, wd, 128)
    torch.library.opcheck(torch.ops.twell.ffn_train_backward.default, (x, torch.randn_like(y), wg, wu, wd, state,
                                                                       torch.tensor(0.5)))


def test_torch_compile_fullgraph_equals_eager():
    """Compiled (the custom ops) and eager (their implementations through an autograd.Function)
    give the same bits: y, l1 and, for the same upstream gradients, every gradient. (A loss reduced
    after the op is Inductor's to reorder, so the comparison stops at the op's outputs.)"""
    x, wg, wu, wd = make(40, 64, 176, True, -1.0)
    dy = torch.randn(40, 64, generator=torch.Generator().manual_seed(2))

    def fwd(x, wg, wu, wd):
        return tt.ffn(x, wg, wu, wd)

    results = []
    for fn in (fwd, torch.compile(fwd, fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (x, wg, wu, wd)]
        y, l1 = fn(*leaves)
        torch.autograd.backward([y, l1], [dy, torch.tensor(0.1)])
        results.append([y.detach(), l1.detach()] + [t.grad for t in leaves])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_sparse_mlp_is_a_relu_llama_mlp():
    torch.manual_seed(3)
    mlp = tt.SparseMLP(64, 176)
    with torch.no_grad():
        mlp.gate_proj.weight[:, 0] -= 0.5
    x = torch.randn(2, 9, 64)
    y = mlp(x)
    want = mlp.down_proj(torch.relu(mlp.gate_proj(x)) * mlp.up_proj(x))
    assert rel(y, want) < 1e-4
    (y.sum() + 0.01 * mlp.l1).backward()
    assert mlp.gate_proj.weight.grad is not None and mlp.down_proj.weight.grad.abs().sum() > 0


def test_bad_input_raises_clear_errors():
    x, wg, wu, wd = make(8, 64, 176, True, -1.0)
    with pytest.raises(TypeError, match="dtype"):
        tt.ffn(x.int(), wg, wu, wd)
    with pytest.raises(ValueError, match="w_down"):
        tt.ffn(x, wg, wu, wd[:, :10])
    with pytest.raises(ValueError, match="w_gate"):
        tt.ffn(x, wg[:10], wu, wd)
    with pytest.raises(ValueError, match="last dimension"):
        tt.ffn(x[:, :10], wg, wu, wd)
    with pytest.raises(ValueError, match="is on"):
        tt.ffn(x, wg.to("meta"), wu, wd)
    with pytest.raises(NotImplementedError):
        tt.ffn(x.to("meta"), wg.to("meta"), wu.to("meta"), wd.to("meta"))
    with pytest.raises(TypeError):
        tt.ffn(x.numpy(), wg, wu, wd)
    # A state that is not twell's, or is for other shapes, is refused by the extension.
    y = torch.empty(8, 64)
    dx, dwg, dwu, dwd = torch.empty_like(x), torch.empty_like(wg), torch.empty_like(wu), torch.empty_like(wd)
    with pytest.raises(ValueError, match="training state"):
        _twell.ffn_train_backward(x, y, wg, wu, wd, torch.zeros(100, dtype=torch.uint8), 0.0, dx, dwg, dwu, dwd)
    _, _, _, state, _ = torch.ops.twell.ffn_train(x, wg, wu, wd, 128)
    x2 = torch.randn(9, 64)
    with pytest.raises(ValueError, match="training state is for"):
        _twell.ffn_train_backward(x2, torch.empty(9, 64), wg, wu, wd, state, 0.0, torch.empty(9, 64), dwg, dwu, dwd)
    with pytest.raises(ValueError, match="truncated|array"):
        _twell.ffn_train_backward(x, y, wg, wu, wd, state[:-5].clone(), 0.0, dx, dwg, dwu, dwd)


def test_readme_example_runs_as_written():
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## From PyTorch", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["x"].grad is not None and scope["y"].shape == (8, 64)


@pytest.mark.parametrize("gated,ell", [(True, 128), (True, 4), (False, 8)])
def test_training_stats_count_nonzeros_and_neurons(gated, ell):
    x, wg, wu, wd = make(60, 64, 176, gated, -1.0, seed=11)
    (wg if gated else wu)[:3, 0] = -50.0  # three dead neurons (x[:, 0] = 1)
    stats = []
    tt.ffn(x.requires_grad_(), wg, wu, wd, ell_width=ell, stats=stats)
    _, _, h = reference(x.detach(), wg, wu, wd)
    fired = h != 0
    assert stats[0].l0.item() == pytest.approx(fired.sum().item() / 60, rel=1e-6)
    assert torch.equal(stats[0].neuron_counts, fired.sum(0))
    assert (stats[0].neuron_counts[:3] == 0).all() and (stats[0].neuron_counts > 0).any()


def test_cuda_weight_cache_reloads_exactly_when_weights_change():
    """twell._cuda.load (the CUDA ops' weight cache; its logic runs anywhere): a copy on the first
    call, none for the same unchanged tensors, one after an in-place update (the version counter),
    one for another tensor, and one after weights_changed() (writes through .data)."""
    from twell import _cuda

    class Ctx:
        loads = 0

        def load(self, *args):
            Ctx.loads += 1

    lay = _cuda.Layer(device=0)
    ctx = Ctx()
    w = [torch.randn(16, 8), torch.randn(16, 8), torch.randn(8, 16)]
    steps = [("first", 1), ("same", 0), ("in-place", 1), ("same", 0), ("other", 1), ("data", 0),
             ("data + weights_changed", 1)]
    expected = 0
    for change, copies in steps:
        if change == "in-place":
            with torch.no_grad():
                w[1].mul_(2)
        elif change == "other":
            w[2] = w[2].clone()
        elif change == "data":
            w[0].data.mul_(2)  # invisible to the version counter
        elif change == "data + weights_changed":
            w[0].data.mul_(2)
            _cuda._layers[(0, -99)] = lay
            tt.weights_changed()
            del _cuda._layers[(0, -99)]
        expected += copies
        _cuda.load(lay, "train", ctx, tuple(w), 0)
        assert Ctx.loads == expected, change
