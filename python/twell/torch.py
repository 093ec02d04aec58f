"""twell's FFN as PyTorch ops: `ffn` (inference and training), `SparseMLP` (a Llama MLP drop-in).

    y, l1 = twell.torch.ffn(x, w_gate, w_up, w_down)   # y = (ReLU(x·Wgᵀ) ⊙ x·Wuᵀ)·Wdᵀ
    loss = criterion(y) + l1_coeff * l1                # l1 = Σ|h| / rows, the paper's L1 term

Three ops in the `twell` namespace, registered through torch.library (schema, fake/meta
implementation, autograd), so they run under torch.compile(fullgraph=True) without graph breaks:
  twell::ffn_infer      y from x (TwELL sparse inference; exact at any density)
  twell::ffn_train      y, l1, l0, the sparse state (the hybrid ELL + tail format, as a uint8
                        tensor whose length depends on the data) saved for backward, and each
                        neuron's count of rows it fired in (int64 [N], for dead-neuron telemetry)
  twell::ffn_train_backward  dx, dW_gate, dW_up, dW_down of ⟨y, dy⟩ + dl1 · l1, reading the state
`ffn` runs ffn_train when autograd needs gradients, else ffn_infer (whose l1 is not computed: NaN).
CPU tensors only in this version (float32 math; float64/bfloat16/float16 inputs are computed in
float32 and returned in their own dtype); CUDA tensors raise NotImplementedError. A gated FFN takes w_gate
[N, K]; pass None for a non-gated one (h = ReLU(x·Wuᵀ)).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _twell

__all__ = ["ffn", "FfnStats", "SparseMLP", "ffn_infer", "ffn_train", "ffn_train_backward"]

_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _d(t: Optional[Tensor]) -> Optional[Tensor]:
    """A view without autograd history: DLPack refuses tensors that require grad."""
    return None if t is None else t.detach()


def _empty_like_grad(w: Optional[Tensor]) -> Tensor:
    return torch.empty(0) if w is None else torch.empty_like(w)


@torch.library.custom_op("twell::ffn_infer", mutates_args=(), device_types="cpu")
def ffn_infer(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor) -> Tensor:
    y = x.new_empty(x.shape[0], w_down.shape[0])
    if x.shape[0]:
        _twell.ffn_infer(_d(x), _d(w_gate), _d(w_up), _d(w_down), y)
    return y


@ffn_infer.register_fake
def _(x, w_gate, w_up, w_down):
    return x.new_empty(x.shape[0], w_down.shape[0])


@torch.library.custom_op("twell::ffn_train", mutates_args=(), device_types="cpu")
def ffn_train(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor,
              ell_width: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    y = x.new_empty(x.shape[0], w_down.shape[0])
    counts = torch.zeros(w_up.shape[0], dtype=torch.int64)
    if not x.shape[0]:
        z = x.new_zeros(())
        return y, z, z.clone(), torch.empty(0, dtype=torch.uint8), counts
    state, l1, l0 = _twell.ffn_train_forward(_d(x), _d(w_gate), _d(w_up), _d(w_down), y, ell_width, counts)
    return y, x.new_tensor(l1), x.new_tensor(l0), state, counts


@ffn_train.register_fake
def _(x, w_gate, w_up, w_down, ell_width):
    n = torch.library.get_ctx().new_dynamic_size()
    return (x.new_empty(x.shape[0], w_down.shape[0]), x.new_empty(()), x.new_empty(()),
            x.new_empty(n, dtype=torch.uint8), x.new_empty(w_up.shape[0], dtype=torch.int64))


@torch.library.custom_op("twell::ffn_train_backward", mutates_args=(), device_types="cpu")
def ffn_train_backward(x: Tensor, dy: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor,
                       state: Tensor, dl1: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dx = torch.empty_like(x)
    dwg = _empty_like_grad(w_gate)
    dwu, dwd = torch.empty_like(w_up), torch.empty_like(w_down)
    if not x.shape[0]:
        dx.zero_(), dwg.zero_(), dwu.zero_(), dwd.zero_()
        return dx, dwg, dwu, dwd
    _twell.ffn_train_backward(_d(x), _d(dy), _d(w_gate), _d(w_up), _d(w_down), _d(state), float(dl1), dx,
                              dwg if w_gate is not None else None, dwu, dwd)
    return dx, dwg, dwu, dwd


@ffn_train_backward.register_fake
def _(x, dy, w_gate, w_up, w_down, state, dl1):
    return torch.empty_like(x), _empty_like_grad(w_gate), torch.empty_like(w_up), torch.empty_like(w_down)


def _setup_context(ctx, inputs, output):
    x, w_gate, w_up, w_down, _ = inputs
    ctx.save_for_backward(x, w_gate, w_up, w_down, output[3])
    ctx.gated = w_gate is not None


def _backward(ctx, dy, dl1, dl0, dstate, dcounts):
    x, w_gate, w_up, w_down, state = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy.contiguous()
    dl1 = x.new_zeros(()) if dl1 is None else dl1
    dx, dwg, dwu, dwd = ffn_train_backward(x, dy, w_gate, w_up, w_down, state, dl1)
    return dx, (dwg if ctx.gated else None), dwu, dwd, None


ffn_train.register_autograd(_backward, setup_context=_setup_context)


def _check(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor) -> None:
    named = [("x", x), ("w_up", w_up), ("w_down", w_down)] + ([("w_gate", w_gate)] if w_gate is not None else [])
    for name, t in named:
        if not isinstance(t, Tensor):
            raise TypeError(f"twell.torch.ffn: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOATS:
            raise TypeError(f"twell.torch.ffn: {name} has dtype {t.dtype}; a floating-point dtype expected")
        if t.device != x.device:
            raise ValueError(f"twell.torch.ffn: {name} is on {t.device} but x is on {x.device}")
    if x.device.type != "cpu":
        raise NotImplementedError(f"twell.torch.ffn: {x.device.type} tensors are not supported yet (CPU only)")
    for name, t in named[1:]:
        if t.dim() != 2:
            raise ValueError(f"twell.torch.ffn: {name} must be 2-D, got shape {tuple(t.shape)}")
    n, k = w_up.shape
    if tuple(w_down.shape) != (k, n):
        raise ValueError(f"twell.torch.ffn: w_down is {tuple(w_down.shape)}; with w_up {(n, k)} it must be {(k, n)}")
    if w_gate is not None and tuple(w_gate.shape) != (n, k):
        raise ValueError(f"twell.torch.ffn: w_gate is {tuple(w_gate.shape)}; it must match w_up {(n, k)}")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"twell.torch.ffn: x is {tuple(x.shape)}; its last dimension must be K = {k}")


class FfnStats:
    """What one training forward counted, as tensors (reading them is the only synchronisation):
    l0 = non-zeros of h per row (token), neuron_counts[n] = rows in which neuron n fired."""

    def __init__(self, l0: Tensor, neuron_counts: Tensor):
        self.l0, self.neuron_counts = l0, neuron_counts


def ffn(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor, *, ell_width: int = 128,
        stats: Optional[list] = None) -> tuple[Tensor, Tensor]:
    """y = FFN(x) over x's last dimension, and l1 = Σ|h| / rows (NaN when no gradient is needed).
    With `stats` (a list), a training forward appends its FfnStats to it.

    w_gate, w_up: [N, K]; w_down: [K, N] (nn.Linear's weight layouts). ell_width: the training
    state's ELL width E (rows with more than E non-zeros go whole to its dense tail; exact either way).
    """
    _check(x, w_gate, w_up, w_down)
    dtype = x.dtype
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).float().contiguous()
    ws = [None if w is None else w.float().contiguous() for w in (w_gate, w_up, w_down)]
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or any(w is not None and w.requires_grad for w in
                                                                        (w_gate, w_up, w_down)))
    if needs_grad:
        y, l1, l0, _, counts = ffn_train(x2, ws[0], ws[1], ws[2], ell_width)
        if stats is not None:
            stats.append(FfnStats(l0, counts))
    else:
        y, l1 = ffn_infer(x2, ws[0], ws[1], ws[2]), x2.new_full((), float("nan"))
    return y.reshape(*lead, y.shape[-1]).to(dtype), l1


class SparseMLP(torch.nn.Module):
    """A Llama MLP with ReLU (gate_proj, up_proj, down_proj without bias) through twell.

    forward(x) returns y; the L1 term of the last forward is in `self.l1` (a tensor in the autograd
    graph: add l1_coeff · mlp.l1 to the loss) and, after a training forward, its counts in
    `self.stats` (FfnStats: non-zeros per token, per-neuron fire counts; tensors, no host wait)."""

    def __init__(self, hidden_size: int, intermediate_size: int, gated: bool = True, ell_width: int = 128):
        super().__init__()

        def linear(i, o):
            return torch.nn.Linear(i, o, bias=False)

        self._attach(linear(hidden_size, intermediate_size) if gated else None,
                     linear(hidden_size, intermediate_size), linear(intermediate_size, hidden_size), ell_width)

    @classmethod
    def of(cls, gate_proj: Optional[torch.nn.Linear], up_proj: torch.nn.Linear, down_proj: torch.nn.Linear,
           ell_width: int = 128) -> "SparseMLP":
        """A SparseMLP over existing Linear modules (shared, not copied: same parameters)."""
        m = cls.__new__(cls)
        torch.nn.Module.__init__(m)
        m._attach(gate_proj, up_proj, down_proj, ell_width)
        return m

    def _attach(self, gate_proj, up_proj, down_proj, ell_width: int) -> None:
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.ell_width = ell_width
        self.l1: Optional[Tensor] = None
        self.stats: Optional[FfnStats] = None

    def forward(self, x: Tensor) -> Tensor:
        got: list = []
        y, self.l1 = ffn(x, None if self.gate_proj is None else self.gate_proj.weight, self.up_proj.weight,
                         self.down_proj.weight, ell_width=self.ell_width, stats=got)
        self.stats = got[0] if got else None
        return y
