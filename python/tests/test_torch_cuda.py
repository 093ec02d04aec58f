"""twell.torch on CUDA tensors (skipped without a GPU or without twell's CUDA build): forward and
gradients against a float64 reference on every path at small and large shapes, bf16 and fp32
inputs; torch.compile(fullgraph=True); a second forward before the backward (the recompute);
activation checkpointing; bad input; and a 4-layer HF Llama trained 20 steps against the dense
PyTorch model.

Bounds. The inputs are rounded to bf16 first and the reference runs in float64 on those values, so
what remains is twell's bf16 storage: on the sparse path g (or h) and y / dx are rounded once
(2⁻⁹ relative each), on the dense path g, u, h, dh, dg and du too — independent roundings of a few
1e-3 over a matrix (the C++ tests' 1e-2 relative Frobenius bound, same reasoning). A ReLU
pre-activation within fp32 noise of 0 may land on the other side: one whole term of a gradient,
1/√nnz of its norm, far below the bound at these sizes. A wrong index, a dropped row or a
mis-copied weight moves a norm by O(1).
"""
import copy
import math

import pytest

torch = pytest.importorskip("torch")
tt = pytest.importorskip("twell.torch")

import twell.hf  # noqa: E402
from twell import _cuda, _twell  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and getattr(_twell, "has_cuda", False)),
                                reason="needs a CUDA device and twell built with CUDA")
TOL = 1e-2


def make(m, k, n, gated, density, seed):
    """bf16-exact x and weights (float64 copies) whose ReLU inputs are active with about `density`:
    column 0 of x is 1 and column 0 of the activation weight a bias of Φ⁻¹(density)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g, dtype=torch.float64)
    x[:, 0] = 1.0
    wg = torch.randn(n, k, generator=g, dtype=torch.float64) / math.sqrt(k)
    wu = torch.randn(n, k, generator=g, dtype=torch.float64) / math.sqrt(k)
    wd = torch.randn(k, n, generator=g, dtype=torch.float64) / math.sqrt(n)
    act = wg if gated else wu
    act[:, 0] = 0
    act[:, 0] = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(density)).item() * math.sqrt(
        (act[:, 1:] ** 2).sum(1).mean().item())
    out = [t.to(torch.bfloat16).double() for t in (x, wg, wu, wd)]
    if not gated:
        out[1] = None
    return out


def reference(x, wg, wu, wd):
    if wg is None:
        h = torch.relu(x @ wu.T)
    else:
        h = torch.relu(x @ wg.T) * (x @ wu.T)
    return h @ wd.T, h.abs().sum() / x.shape[0], h


def frob(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    assert torch.isfinite(a).all()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


CASES = [  # m, k, n, gated, density
    (1, 64, 1000, True, 0.02),
    (7, 264, 1003, True, 0.01),
    (300, 128, 640, False, 0.01),
    (4096, 512, 2048, True, 0.005),
    (16384, 2048, 5632, True, 0.005),  # a 1.5B layer at the paper's density
]


@pytest.mark.parametrize("path", ["sparse", "dense", "automatic"])
@pytest.mark.parametrize("m,k,n,gated,density", CASES)
def test_forward_and_gradients_match_float64(m, k, n, gated, density, path):
    x, wg, wu, wd = make(m, k, n, gated, density, seed=m + n)
    dev = [None if t is None else t.to("cuda", torch.bfloat16).requires_grad_() for t in (x, wg, wu, wd)]
    dy = torch.randn(m, k, generator=torch.Generator().manual_seed(5), dtype=torch.float64).to(torch.bfloat16).double()
    coeff = 0.37
    with tt.cuda_path(path):
        y, l1 = tt.ffn(*dev)
        (y.float() * dy.to("cuda", torch.float32)).sum().add(coeff * l1).backward()
    ref = [None if t is None else t.clone().requires_grad_() for t in (x, wg, wu, wd)]
    yr, l1r, h = reference(*ref)
    assert (h != 0).any()
    (yr * dy).sum().add(coeff * l1r).backward()
    assert y.dtype == torch.bfloat16 and frob(y, yr) < TOL
    assert abs(l1.item() - l1r.item()) <= TOL * l1r.item()
    for got, want, name in zip(dev, ref, ("x", "w_gate", "w_up", "w_down")):
        if want is not None:
            assert got.grad.dtype == torch.bfloat16
            assert frob(got.grad, want.grad) < TOL, name
    with torch.no_grad(), tt.cuda_path(path):
        yi, _ = tt.ffn(*dev)
    assert frob(yi, yr) < TOL  # the inference path


def test_float32_inputs_and_leading_dimensions():
    x, wg, wu, wd = make(96, 64, 512, True, 0.02, seed=3)
    leaves = [t.to("cuda", torch.float32).requires_grad_() for t in (x, wg, wu, wd)]
    y, l1 = tt.ffn(leaves[0].reshape(4, 24, 64), *leaves[1:])
    assert y.shape == (4, 24, 64) and y.dtype == torch.float32 and l1.dtype == torch.float32
    y.sum().backward()
    assert all(t.grad.dtype == torch.float32 for t in leaves)
    ref = [t.clone().requires_grad_() for t in (x, wg, wu, wd)]
    yr, _, _ = reference(*ref)
    yr.sum().backward()
    assert frob(y.reshape(96, 64), yr) < TOL
    for got, want in zip(leaves, ref):
        assert frob(got.grad, want.grad) < TOL


def test_bf16_autocast_keeps_y_in_bf16_with_the_same_values():
    """Under bf16 autocast, fp32 x gives y in bf16 (as a Linear's output there) with the bits of the
    plain call's fp32 y, and the same gradients (x is rounded to bf16 either way, outside the op),
    eager and under torch.compile(fullgraph=True)."""
    x, wg, wu, wd = make(256, 128, 640, True, 0.02, seed=5)

    def run(autocast, compiled):
        leaves = [t.to("cuda", torch.float32).requires_grad_() for t in (x, wg, wu, wd)]

        def f(*ts):
            with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
                return tt.ffn(*ts)

        y, l1 = (torch.compile(f, fullgraph=True) if compiled else f)(*leaves)
        (y.float().square().sum() + l1).backward()
        return y, [t.grad for t in leaves]

    y0, g0 = run(False, False)
    assert y0.dtype == torch.float32
    for compiled in (False, True):
        y, g = run(True, compiled)
        assert y.dtype == torch.bfloat16
        assert torch.equal(y.float(), y0)
        for a, b in zip(g, g0):
            assert a.dtype == torch.float32 and torch.equal(a, b)


@pytest.mark.parametrize("path", ["sparse", "dense"])
@pytest.mark.parametrize("gated", [True, False])
def test_fp32_weights_load_as_their_bf16_rounding(path, gated):
    """fp32 weights (a trainer's master weights) go into the layer as they are and are rounded there:
    y, l1, dx equal, bit for bit, those of the same weights rounded by .to(torch.bfloat16) first, and
    the fp32 weight gradients round to the bf16 ones (both come from the same fp32 sums). The weights
    are off the bf16 grid, N = 1003 is no multiple of 8 (padding rows) and the inference op too."""
    g = torch.Generator().manual_seed(7)
    m, k, n = 300, 264, 1003
    x = torch.randn(m, k, generator=g).bfloat16().cuda()
    w32 = [torch.randn(n, k, generator=g).cuda() / 16, torch.randn(n, k, generator=g).cuda() / 16,
           torch.randn(k, n, generator=g).cuda() / 32]
    if not gated:
        w32[0] = None
    assert not torch.equal(w32[1], w32[1].bfloat16().float())  # off the grid: the load must round

    def run(ws):
        leaves = [x.clone().requires_grad_()] + [None if w is None else w.clone().requires_grad_() for w in ws]
        with tt.cuda_path(path):
            y, l1 = tt.ffn(*leaves)
            (y.float().square().sum() + l1).backward()
            yi = tt.ffn_infer(*(t.detach() if t is not None else None for t in leaves))
        return y, l1, yi, [None if t is None else t.grad for t in leaves]

    y32, l132, yi32, g32 = run(w32)
    y16, l116, yi16, g16 = run([None if w is None else w.bfloat16() for w in w32])
    assert torch.equal(y32, y16) and torch.equal(l132, l116) and torch.equal(yi32, yi16)
    assert torch.equal(g32[0], g16[0])  # dx
    for a, b in zip(g32[1:], g16[1:]):
        if a is not None:
            assert a.dtype == torch.float32 and b.dtype == torch.bfloat16 and torch.equal(a.bfloat16(), b)


def test_neuron_counts_and_l0():
    x, wg, wu, wd = make(512, 128, 700, True, 0.03, seed=4)
    dev = [t.to("cuda", torch.bfloat16).requires_grad_() for t in (x, wg, wu, wd)]
    stats = []
    tt.ffn(*dev, stats=stats)
    fired = (x @ wg.T > 0)
    assert torch.equal(stats[0].neuron_counts.cpu(), fired.sum(0))
    assert abs(stats[0].l0.item() - fired.sum().item() / 512) < 1e-6 * fired.sum().item()
    stats = []
    tt.ffn(*dev, stats=stats, count_neurons=False)
    assert (stats[0].neuron_counts == -1).all()  # not counted: said so, not zeros


def test_compile_fullgraph_matches_eager():
    """The ops under torch.compile(fullgraph=True) give the eager path's bits: the forward (y, l1)
    and, for the same upstream gradients, every gradient (twell's kernels are deterministic)."""
    mlp = tt.SparseMLP(128, 512).cuda().to(torch.bfloat16)
    x = torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16)
    coeff = torch.tensor(1e-3, device="cuda")

    def fwd(m, x):
        y = m(x)
        return y, m.l1

    results = []
    for f in (fwd, torch.compile(fwd, fullgraph=True)):
        for p in list(mlp.parameters()) + [x]:
            p.grad = None
        y, l1 = f(mlp, x)
        torch.autograd.backward([y, l1], [dy, coeff])
        results.append([y.detach(), l1.detach()] + [p.grad.clone() for p in mlp.parameters()] + [x.grad.clone()])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def sparse_mlp(wg, wu, wd):
    """A CUDA SparseMLP holding these (gated) weights."""
    mlp = tt.SparseMLP(wg.shape[1], wg.shape[0]).cuda()
    with torch.no_grad():
        for p, w in zip((mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight), (wg, wu, wd)):
            p.copy_(w)
    return mlp


def test_last_train_info_reports_the_dispatch_without_a_sync():
    """SparseMLP.last_train_info: the sparse step's CSR non-zeros equal l0 · rows (no hot neurons
    or dense rows below their minimum sizes); the TwELL gate's overflow counts (0 at 1 % density:
    no tile overflows; -1 where the gate is not TwELL); a forced dense step reports sparse False,
    nnz -1 and no overflow counts; twell.hf.telemetry carries the same facts."""
    x, wg, wu, wd = make(300, 128, 640, True, 0.01, seed=9)
    mlp = sparse_mlp(wg, wu, wd)
    x = x.to("cuda", torch.float32).requires_grad_()
    with tt.cuda_path("sparse"):
        y = mlp(x)
    info = mlp.last_train_info
    assert info["sparse"] and info["rows"] == 300 and info["hot_neurons"] == 0 and info["dense_rows"] == 0
    assert info["nnz"] == round(float(mlp.stats.l0) * 300)
    if "TwELL" in info["path"]:
        assert info["overflow_rows"] == 0 and info["overflow_tiles"] == 0, info
    else:
        assert info["overflow_rows"] == -1 and info["overflow_tiles"] == -1, info
    rec = twell.hf.telemetry(mlp)[0]
    assert rec["sparse"] and rec["csr_nnz"] == info["nnz"] and rec["hot_neurons"] == 0
    assert rec["overflow_rows"] == info["overflow_rows"]
    y.sum().backward()
    with tt.cuda_path("dense"):
        mlp(x)
    assert mlp.last_train_info["sparse"] is False and mlp.last_train_info["nnz"] == -1
    assert mlp.last_train_info["overflow_rows"] == -1


def test_infer_stats_come_back_without_a_sync():
    """SparseMLP.infer_stats: the automatic inference path's counts come back through mapped memory
    (no synchronisation): after three calls and a synchronize, the newest counted TwELL call's rows,
    non-zeros (about the density asked for) and overflow (none at 0.5 %); a forced dense call
    counts nothing."""
    x, wg, wu, wd = make(2048, 128, 640, True, 0.005, seed=10)
    mlp = sparse_mlp(wg, wu, wd)
    x = x.to("cuda", torch.bfloat16)
    assert mlp.infer_stats == {}
    with torch.no_grad():
        with tt.cuda_path("dense"):
            mlp(x)
        torch.cuda.synchronize()
        s = mlp.infer_stats
        assert s["calls"] == 1 and s["sparse_calls"] == 0 and s["nnz"] == -1 and s["density"] == -1, s
        assert s["active"] == -1, s
        for _ in range(3):
            mlp(x)
    torch.cuda.synchronize()
    s = mlp.infer_stats
    assert s["calls"] == 4 and s["sparse_calls"] == 3, s
    assert s["counted_rows"] == 2048 and s["overflow_rows"] == 0 and s["overflow_tiles"] == 0, s
    cold = 640 - s["hot_neurons"]
    assert 0.002 * 2048 * cold < s["nnz"] < 0.01 * 2048 * cold, s
    assert 0 < s["density"] < 0.01 and s["path"] == mlp.last_path, s
    # active: the same count's true share, over the counted rows and the cold neurons
    assert s["active"] == pytest.approx(s["nnz"] / (s["counted_rows"] * cold), rel=1e-12), s


def test_workspaces_come_from_torchs_allocator():
    """twell.torch's shared workspaces draw on PyTorch's caching allocator (one pool, counted by
    torch.cuda.memory_allocated, handed back when the last layer of the device goes); the results
    are those of twell's own cudaMalloc'd workspaces, bit for bit."""
    x, wg, wu, wd = make(512, 128, 640, True, 0.02, seed=12)
    dev = torch.cuda.current_device()
    outs = {}
    old = _cuda.workspace_allocator
    try:
        for kind in ("cuda", "torch"):
            _cuda.workspace_allocator = kind
            for key in list(_cuda._layers):
                _cuda.forget(key[1])
            assert not _cuda._scratch and not _cuda._workspace
            mlp = sparse_mlp(wg, wu, wd)
            xc = x.to("cuda", torch.float32).requires_grad_()
            with tt.cuda_path("sparse"):
                y = mlp(xc)
            y.square().sum().backward()
            with torch.no_grad(), tt.cuda_path("sparse"):
                yi = mlp(xc)
            torch.cuda.synchronize()
            scratch, ws = _cuda._scratch[dev], _cuda._workspace[dev]
            assert scratch.from_allocator == ws.from_allocator == (kind == "torch")
            assert scratch.bytes > 0 and ws.bytes > 0
            own = sum(lay.train.own_bytes for lay in _cuda._layers.values() if lay.train is not None)
            assert _cuda.context_bytes() == own + (0 if kind == "torch" else scratch.bytes)
            outs[kind] = [t.detach().clone() for t in (y, yi, xc.grad, mlp.gate_proj.weight.grad, mlp.down_proj.weight.grad)]
            held = scratch.bytes + ws.bytes
            del scratch, ws
            before = torch.cuda.memory_allocated(dev)
            _cuda.forget(mlp.layer_id)  # the layer goes, and with it the device's workspaces
            freed = before - torch.cuda.memory_allocated(dev)
            if kind == "torch":  # the caching allocator rounds each block up to 512 bytes
                assert held <= freed <= held + 512 * 64, (held, freed)
            else:
                assert freed == 0
            del mlp
    finally:
        _cuda.workspace_allocator = old
    for a, b in zip(outs["cuda"], outs["torch"]):
        assert torch.equal(a, b)


def test_compile_keeps_one_graph_through_the_layers():
    """Without fullgraph, Dynamo traces through the training op (a fixed-size state on CUDA) rather
    than breaking the graph at every layer, which would cost a model every fusion across its MLPs."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    mlps = torch.nn.ModuleList([tt.SparseMLP(128, 512) for _ in range(3)]).cuda()
    x = torch.randn(2, 64, 128, device="cuda", requires_grad=True)

    def loss(x):
        for m in mlps:
            x = x + m(torch.nn.functional.rms_norm(x, (128,)))
        return x.square().mean() + 1e-3 * sum(m.l1 for m in mlps)

    torch.compile(loss)(x).backward()
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert x.grad is not None and all(m.up_proj.weight.grad is not None for m in mlps)


def test_a_second_forward_before_the_backward_recomputes_the_first():
    x, wg, wu, wd = make(256, 128, 640, True, 0.02, seed=6)
    mlp = sparse_mlp(wg, wu, wd)
    a = x.to("cuda", torch.float32).requires_grad_()
    b = (x.flip(0) * 0.5).to("cuda", torch.float32).requires_grad_()
    with tt.cuda_path("sparse"):
        ya, yb = mlp(a), mlp(b)  # yb's forward replaces ya's state in the layer's context
        before = _cuda._layers[(torch.cuda.current_device(), mlp.layer_id)].recomputes
        (ya.sum() + 2 * yb.sum()).backward()
    assert _cuda._layers[(torch.cuda.current_device(), mlp.layer_id)].recomputes > before
    for inp, scale in ((a, 1.0), (b, 2.0)):
        r = [inp.detach().cpu().double().clone().requires_grad_()] + [w.clone() for w in (wg, wu, wd)]
        (scale * reference(*r)[0]).sum().backward()
        assert frob(inp.grad, r[0].grad) < TOL


def test_activation_checkpointing():
    mlp = tt.SparseMLP(64, 256).cuda()
    x = torch.randn(40, 64, device="cuda", requires_grad=True)
    y = torch.utils.checkpoint.checkpoint(mlp, x, use_reentrant=False)
    y.square().sum().backward()
    g_ckpt = x.grad.clone()
    x.grad = None
    mlp(x).square().sum().backward()
    assert torch.equal(g_ckpt, x.grad)


def test_bad_input_raises_clear_errors():
    x = torch.randn(4, 64, device="cuda")
    w = torch.randn(256, 64, device="cuda")
    wd = torch.randn(64, 256, device="cuda")
    with pytest.raises(ValueError, match="is on cpu but x is on cuda"):
        tt.ffn(x, w.cpu(), w, wd)
    with pytest.raises(ValueError, match="multiple of 8"):
        tt.ffn(torch.randn(4, 60, device="cuda"), None, torch.randn(256, 60, device="cuda"),
               torch.randn(60, 256, device="cuda"))
    with pytest.raises(TypeError, match="dtype"):
        tt.ffn(x.int(), w, w, wd)
    with pytest.raises(ValueError, match="w_down"):
        tt.ffn(x, w, w, wd.T.contiguous())
    with pytest.raises(ValueError, match="path"):
        with tt.cuda_path("fast"):
            pass
    layer = _twell.CudaFfnTrain(torch.cuda.current_device())
    with pytest.raises(ValueError, match="load the layer's weights first"):
        s = torch.empty((), device="cuda")
        layer.forward(x.bfloat16(), x.bfloat16(), s, s, 0)
    with pytest.raises(ValueError, match="share one dtype"):
        layer.load(None, w, wd.bfloat16(), 0)
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        layer.load(None, w.half(), wd.half(), 0)


def test_hf_llama_trains_like_the_dense_model():
    """20 AdamW steps of a 4-layer Llama (ReLU), bf16 autocast: twell's MLPs (forced onto the sparse
    path, and on twell's dispatch) against PyTorch's own. The tolerance is derived, not chosen: the
    dense bf16-autocast run's distance to the same run in fp32 is bf16's noise on this model; twell
    computes the MLPs with other bf16 roundings, so its distance to the dense bf16 run must stay
    within a small multiple of that noise (3×; the floor 1e-3 keeps a lucky near-zero noise from
    making the bound vanish)."""
    transformers = pytest.importorskip("transformers")
    import twell.hf

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   hidden_act="relu", tie_word_embeddings=False)
    base = transformers.LlamaForCausalLM(cfg).cuda()
    ids = torch.randint(0, 512, (20, 8, 128), generator=torch.Generator().manual_seed(1)).cuda()

    def run(model, autocast, path=None):
        model = copy.deepcopy(model)
        if path:
            twell.hf.sparsify(model)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
        losses = []
        for step in range(20):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", torch.bfloat16, enabled=autocast), tt.cuda_path(path or "automatic"):
                loss = model(ids[step], labels=ids[step]).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return torch.tensor(losses)

    fp32 = run(base, autocast=False)
    dense = run(base, autocast=True)
    noise = (dense - fp32).abs().max().item()
    tol = max(3 * noise, 1e-3)
    for path in ("sparse", "automatic"):
        got = run(base, autocast=True, path=path)
        assert (got - dense).abs().max().item() <= tol, (path, (got - dense).abs().max().item(), noise)
    assert dense[-1] < dense[0]  # it trains


def test_opcheck_cuda_ops():
    x, wg, wu, wd = (t.to("cuda", torch.bfloat16) for t in make(64, 64, 256, True, 0.05, seed=8))
    torch.library.opcheck(torch.ops.twell.ffn_infer.default, (x, wg, wu, wd))
    leaves = [t.clone().requires_grad_() for t in (x, wg, wu, wd)]
    torch.library.opcheck(torch.ops.twell.ffn_train.default, (*leaves, 128))
    y, l1, l0, state, _ = torch.ops.twell.ffn_train(x, wg, wu, wd, 128)
    torch.library.opcheck(torch.ops.twell.ffn_train_backward.default,
                          (x, torch.randn_like(y), wg, wu, wd, state, torch.tensor(0.5, device="cuda")))
