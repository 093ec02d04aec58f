"""twell's FFN as PyTorch ops: `ffn` (inference and training), `SparseMLP` (a Llama MLP drop-in).

    y, l1 = twell.torch.ffn(x, w_gate, w_up, w_down)   # y = (ReLU(x·Wgᵀ) ⊙ x·Wuᵀ)·Wdᵀ
    loss = criterion(y) + l1_coeff * l1                # l1 = Σ|h| / rows, the paper's L1 term

Three ops in the `twell` namespace, registered through torch.library (schema, fake/meta
implementation, autograd), so they run under torch.compile(fullgraph=True) without graph breaks:
  twell::ffn_infer      y from x (TwELL sparse inference; exact at any density)
  twell::ffn_train      y, l1, l0 (float32 scalars), the sparse state saved for backward, and each
                        neuron's count of rows it fired in (int64 [N], for dead-neuron telemetry)
  twell::ffn_train_backward  dx, dW_gate, dW_up, dW_down of ⟨y, dy⟩ + dl1 · l1, reading the state
`ffn` runs ffn_train when autograd needs gradients, else ffn_infer (whose l1 is not computed: NaN).

CPU tensors run twell's CPU ops (float32 math; other float dtypes are computed in float32 and
returned in their own dtype); the state is the hybrid ELL + tail format as a uint8 tensor whose
length depends on the data. CUDA tensors run twell's CUDA kernels on PyTorch's current stream, in
bf16 with fp32 accumulation (inputs of other float dtypes are rounded to bf16; outputs return in
the inputs' dtypes; weight gradients are accumulated in fp32); the state stays in a per-layer
context on the device and the op returns a 16-byte token for it (twell/_cuda.py: a backward whose
forward was followed by another forward of the same layer recomputes it first, exactly). `layer`
names that context: SparseMLP passes its own id; -1 is a shared one per device. On CUDA the
per-neuron counts cost one extra gate GEMM, so they are computed only with count_neurons=True
(else they are -1); on the CPU they are always exact. A gated FFN takes w_gate [N, K]; pass None
for a non-gated one (h = ReLU(x·Wuᵀ)).
"""
from __future__ import annotations

import contextlib
import itertools
import weakref
from typing import Optional

import torch
from torch import Tensor

from . import _cuda, _twell

__all__ = ["ffn", "FfnStats", "SparseMLP", "cuda_path", "weights_changed", "ffn_infer", "ffn_train",
           "ffn_train_backward"]

weights_changed = _cuda.weights_changed

_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_layer_ids = itertools.count()  # SparseMLP ids (the CUDA contexts' keys); -1 is the shared one


def _contiguous_like(t: Tensor) -> Tensor:
    """A buffer the op writes: t's shape and dtype, C-contiguous whatever t's strides."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _empty_like_grad(w: Optional[Tensor]) -> Tensor:
    return torch.empty(0) if w is None else _contiguous_like(w)


_dl = torch.utils.dlpack.to_dlpack


def _c(t: Optional[Tensor]):
    """An input, detached and C-contiguous (what the compiled ops take), as a DLPack capsule: nanobind
    imports it straight from C++, where a tensor would go through Tensor.__dlpack__'s Python (≈ 7 µs
    each; a small CPU training step passes 16)."""
    return None if t is None else _dl(t.detach().contiguous())


def _out(t: Tensor):
    """An output the op writes, as a DLPack capsule over its own storage (never a copy: a copy would
    take the result with it)."""
    if not t.is_contiguous():
        raise AssertionError("twell: an output buffer must be allocated C-contiguous")
    return _dl(t)


def _scalar(x: Tensor, v: float) -> Tensor:
    return torch.tensor(v, dtype=torch.float32, device=x.device)


# The implementations, shared by the custom ops (what torch.compile sees) and the eager path (a
# plain autograd.Function: the same calls with less Python dispatch between them).

def _infer_impl(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor, layer: int) -> Tensor:
    if not x.shape[0]:
        return x.new_empty(0, w_down.shape[0])
    if x.device.type == "cuda":
        return _cuda.infer(x, w_gate, w_up, w_down, layer)
    y = x.new_empty(x.shape[0], w_down.shape[0])
    _twell.ffn_infer(_c(x), _c(w_gate), _c(w_up), _c(w_down), _out(y))
    return y


def _train_impl(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor, ell_width: int, layer: int,
                count_neurons: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    if not x.shape[0]:
        z = _scalar(x, 0.0)
        return (x.new_empty(0, w_down.shape[0]), z, z.clone(), torch.zeros(16, dtype=torch.uint8, device=x.device),
                torch.zeros(w_up.shape[0], dtype=torch.int64, device=x.device))
    if x.device.type == "cuda":
        return _cuda.train_forward(x, w_gate, w_up, w_down, layer, count_neurons)
    y = x.new_empty(x.shape[0], w_down.shape[0])
    counts = torch.zeros(w_up.shape[0], dtype=torch.int64)
    state, l1, l0 = _twell.ffn_train_forward(_c(x), _c(w_gate), _c(w_up), _c(w_down), _out(y), ell_width, _out(counts))
    return y, _scalar(x, l1), _scalar(x, l0), state, counts


def _backward_impl(x: Tensor, dy: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor, state: Tensor,
                   dl1: Tensor, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    if not x.shape[0]:
        return (torch.zeros_like(x), torch.zeros_like(w_gate) if w_gate is not None else x.new_empty(0),
                torch.zeros_like(w_up), torch.zeros_like(w_down))
    if x.device.type == "cuda":
        return _cuda.train_backward(x, dy, w_gate, w_up, w_down, state, dl1, layer)
    dx, dwg, dwu, dwd = _contiguous_like(x), _empty_like_grad(w_gate), _contiguous_like(w_up), _contiguous_like(w_down)
    _twell.ffn_train_backward(_c(x), _c(dy), _c(w_gate), _c(w_up), _c(w_down), _c(state), float(dl1), _out(dx),
                              _out(dwg) if w_gate is not None else None, _out(dwu), _out(dwd))
    return dx, dwg, dwu, dwd


@torch.library.custom_op("twell::ffn_infer", mutates_args=(), device_types=("cpu", "cuda"))
def ffn_infer(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor, layer: int = -1) -> Tensor:
    return _infer_impl(x, w_gate, w_up, w_down, layer)


@ffn_infer.register_fake
def _(x, w_gate, w_up, w_down, layer=-1):
    return x.new_empty(x.shape[0], w_down.shape[0])


@torch.library.custom_op("twell::ffn_train", mutates_args=(), device_types=("cpu", "cuda"))
def ffn_train(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor, ell_width: int, layer: int = -1,
              count_neurons: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _train_impl(x, w_gate, w_up, w_down, ell_width, layer, count_neurons)


@ffn_train.register_fake
def _(x, w_gate, w_up, w_down, ell_width, layer=-1, count_neurons=True):
    # CUDA: the state is a token of fixed size (the sparse state stays in the layer's context), so
    # Dynamo traces through the op without a graph break; CPU: the state itself, of data-dependent size.
    n = _cuda.TOKEN_BYTES if x.device.type == "cuda" else torch.library.get_ctx().new_dynamic_size()
    return (x.new_empty(x.shape[0], w_down.shape[0]), x.new_empty((), dtype=torch.float32),
            x.new_empty((), dtype=torch.float32), x.new_empty(n, dtype=torch.uint8),
            x.new_empty(w_up.shape[0], dtype=torch.int64))


@torch.library.custom_op("twell::ffn_train_backward", mutates_args=(), device_types=("cpu", "cuda"))
def ffn_train_backward(x: Tensor, dy: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor,
                       state: Tensor, dl1: Tensor, layer: int = -1) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _backward_impl(x, dy, w_gate, w_up, w_down, state, dl1, layer)


@ffn_train_backward.register_fake
def _(x, dy, w_gate, w_up, w_down, state, dl1, layer=-1):
    return _contiguous_like(x), _empty_like_grad(w_gate), _contiguous_like(w_up), _contiguous_like(w_down)


def _setup_context(ctx, inputs, output):
    x, w_gate, w_up, w_down, _, layer, _ = inputs
    ctx.save_for_backward(x, w_gate, w_up, w_down, output[3])
    ctx.gated = w_gate is not None
    ctx.layer = layer


def _grads(ctx, dy, dl1, backward):
    """ffn_train's input gradients from the saved tensors, through `backward` (the op or its impl)."""
    x, w_gate, w_up, w_down, state = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy.contiguous()
    dl1 = _scalar(x, 0.0) if dl1 is None else dl1
    dx, dwg, dwu, dwd = backward(x, dy, w_gate, w_up, w_down, state, dl1, ctx.layer)
    return dx, (dwg if ctx.gated else None), dwu, dwd, None, None, None


def _backward(ctx, dy, dl1, dl0, dstate, dcounts):
    return _grads(ctx, dy, dl1, ffn_train_backward)


ffn_train.register_autograd(_backward, setup_context=_setup_context)


class _EagerTrain(torch.autograd.Function):
    """ffn_train's autograd outside torch.compile: the same implementations, without the custom
    ops' dispatch (a few hundred microseconds of host time a step, which the GPU waits for after
    the training forward's host synchronisation)."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, ell_width, layer, count_neurons):
        y, l1, l0, state, counts = _train_impl(x, w_gate, w_up, w_down, ell_width, layer, count_neurons)
        ctx.save_for_backward(x, w_gate, w_up, w_down, state)
        ctx.gated, ctx.layer = w_gate is not None, layer
        ctx.mark_non_differentiable(l0, state, counts)
        return y, l1, l0, state, counts

    @staticmethod
    def backward(ctx, dy, dl1, dl0, dstate, dcounts):
        return _grads(ctx, dy, dl1, _backward_impl)


def _check(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor) -> None:
    named = [("x", x), ("w_up", w_up), ("w_down", w_down)] + ([("w_gate", w_gate)] if w_gate is not None else [])
    for name, t in named:
        if not isinstance(t, Tensor):
            raise TypeError(f"twell.torch.ffn: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOATS:
            raise TypeError(f"twell.torch.ffn: {name} has dtype {t.dtype}; a floating-point dtype expected")
        if t.device != x.device:
            raise ValueError(f"twell.torch.ffn: {name} is on {t.device} but x is on {x.device}")
    if x.device.type == "cuda" and not _cuda.AVAILABLE:
        raise RuntimeError("twell.torch.ffn: CUDA tensors need twell built with CUDA (this build has the CPU ops "
                           "only: rebuild where nvcc and a CUDA toolkit are found)")
    if x.device.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"twell.torch.ffn: {x.device.type} tensors are not supported (CPU and CUDA only)")
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
    if x.device.type == "cuda" and k % 8:
        raise ValueError(f"twell.torch.ffn: the CUDA kernels need the hidden size K to be a multiple of 8 (got {k})")


@contextlib.contextmanager
def cuda_path(path: str):
    """Within the block, every CUDA call of the ops takes `path` ("sparse", "dense" or "automatic",
    the default: twell's dispatch by measured density). For tests and benchmarks; exact on any path."""
    if path not in ("automatic", "sparse", "dense"):
        raise ValueError(f"twell.torch.cuda_path: path must be 'automatic', 'sparse' or 'dense', got {path!r}")
    old, _cuda.path = _cuda.path, path
    try:
        yield
    finally:
        _cuda.path = old


class FfnStats:
    """What one training forward counted, as tensors (reading them is the only synchronisation):
    l0 = non-zeros of h per row (token), neuron_counts[n] = rows in which neuron n fired."""

    def __init__(self, l0: Tensor, neuron_counts: Tensor):
        self.l0, self.neuron_counts = l0, neuron_counts


if hasattr(torch, "get_autocast_dtype"):  # torch ≥ 2.4
    def _autocast_bf16(device_type: str) -> bool:
        """Whether autocast to bfloat16 is on for `device_type` here."""
        return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16
else:
    def _autocast_bf16(device_type: str) -> bool:
        """Whether autocast to bfloat16 is on for `device_type` (CUDA only before torch 2.4)."""
        return device_type == "cuda" and torch.is_autocast_enabled() and torch.get_autocast_gpu_dtype() == torch.bfloat16


def ffn(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor, *, ell_width: int = 128,
        stats: Optional[list] = None, count_neurons: bool = True, layer: int = -1) -> tuple[Tensor, Tensor]:
    """y = FFN(x) over x's last dimension, and l1 = Σ|h| / rows (NaN when no gradient is needed).
    With `stats` (a list), a training forward appends its FfnStats to it; its per-neuron counts
    are computed when count_neurons (on CUDA one extra gate GEMM; without it they are -1 there).

    y has x's dtype, except on CUDA under bf16 autocast, where it is bf16 (as a Linear's output is
    there; the op computes in bf16 either way, with the same values).
    w_gate, w_up: [N, K]; w_down: [K, N] (nn.Linear's weight layouts). ell_width: the CPU training
    state's ELL width E (rows with more than E non-zeros go whole to its dense tail; exact either
    way). layer: the CUDA context to use (SparseMLP passes its own; -1: one shared per device).
    """
    _check(x, w_gate, w_up, w_down)
    dtype = x.dtype
    lead = x.shape[:-1]
    if x.device.type == "cuda":
        # x rounded to bf16 here, in the caller's graph, not inside the op (the same rounding): under
        # torch.compile the cast joins the kernel that makes x (an RMSNorm's) and its gradient's cast
        # the backward's neighbours, and the op saves x in bf16 for its backward. Under bf16 autocast
        # y stays bf16, as a Linear's output does there. The weights pass as they are (the context
        # copies them into its layouts only when they change).
        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
        ws = [None if w is None else w.contiguous() for w in (w_gate, w_up, w_down)]
        if _autocast_bf16("cuda"):
            dtype = torch.bfloat16
    else:
        x2 = x.reshape(-1, x.shape[-1]).float().contiguous()
        ws = [None if w is None else w.float().contiguous() for w in (w_gate, w_up, w_down)]
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or any(w is not None and w.requires_grad for w in
                                                                        (w_gate, w_up, w_down)))
    compiling = torch.compiler.is_compiling()  # the custom ops there; their implementations directly in eager
    if needs_grad:
        train = ffn_train if compiling else _EagerTrain.apply
        y, l1, l0, _, counts = train(x2, ws[0], ws[1], ws[2], ell_width, layer, count_neurons and stats is not None)
        if stats is not None:
            stats.append(FfnStats(l0, counts))
    else:
        infer = ffn_infer if compiling else _infer_impl
        y, l1 = infer(x2, ws[0], ws[1], ws[2], layer), x2.new_full((), float("nan"), dtype=torch.float32)
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
        self.count_neurons = True  # per-neuron fire counts in self.stats (on CUDA: one more gate GEMM a forward)
        self.l1: Optional[Tensor] = None
        self.stats: Optional[FfnStats] = None
        self.layer_id = next(_layer_ids)  # this module's CUDA contexts, freed with it
        weakref.finalize(self, _cuda.forget, self.layer_id)

    def forward(self, x: Tensor) -> Tensor:
        got: list = []
        y, self.l1 = ffn(x, None if self.gate_proj is None else self.gate_proj.weight, self.up_proj.weight,
                         self.down_proj.weight, ell_width=self.ell_width, stats=got, count_neurons=self.count_neurons,
                         layer=self.layer_id)
        self.stats = got[0] if got else None
        return y

    def _cuda_layer(self):
        """This module's CUDA layer state on the current device (None before a CUDA call)."""
        return _cuda._layers.get((torch.cuda.current_device() if torch.cuda.is_available() else 0, self.layer_id))

    @property
    def last_path(self) -> str:
        """The path the last CUDA call of this layer dispatched ('' before one, or on the CPU)."""
        lay = self._cuda_layer()
        return "" if lay is None else lay.last_path()

    @property
    def infer_stats(self) -> dict:
        """The CUDA inference context's dispatch statistics, read without waiting for the GPU: calls,
        sparse_calls, hot_neurons, density (what the automatic dispatch follows, rows the sparse path
        would run dense weighed at their dense cost; -1: none yet), active (the same count's true share
        of non-zero activations, exact over the rows it counted; -1: none yet), and
        the newest counted TwELL call's counted_rows, nnz, overflow_tiles and overflow_rows (-1: none
        came back yet; counts come back when their kernels complete, so they may trail the newest
        call), path. Only the automatic path counts. {} before a CUDA inference call, or on the CPU."""
        lay = self._cuda_layer()
        return {} if lay is None or lay.infer is None else lay.infer.stats()

    @property
    def last_train_info(self) -> dict:
        """The last CUDA training forward's dispatch facts, host values read without a device
        synchronisation: sparse (which step ran), nnz (non-zeros in the sparse step's CSR; -1 for
        a dense step that did not count), hot_neurons and dense_rows (neurons and token rows split
        off the sparse step and run as dense GEMMs), overflow_tiles and overflow_rows (the TwELL
        gate's (row, tile) blocks and rows beyond its width, computed exactly through the fallback;
        -1 when no TwELL gate ran), rows, path. {} before one, or on the CPU."""
        lay = self._cuda_layer()
        return {} if lay is None else dict(lay.info)
