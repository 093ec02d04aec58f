"""The CUDA side of twell.torch's ops: one FFN context pair per (device, layer), weights loaded
when they change, the training forward's sparse state kept in the context.

A layer id names the context: SparseMLP takes a fresh id each, the functional `twell.torch.ffn`
uses -1 (one shared context per device). The training forward's state stays in the context (the
CSR of the non-zeros and what the backward needs beside it); the op returns a 16-byte token tensor
and the context remembers the token's address. A backward whose token is not the context's last
(another forward of the same layer ran in between: two micro-batches before their backwards, an
evaluation forward, activation checkpointing's recomputation) runs its forward again first, over
the inputs autograd saved — exact, and counted in `recomputes`. The address is a sound identity:
autograd holds the token alive until the backward, so no other tensor can take its memory.

Weights are copied into the context only when they changed: the context remembers each weight
tensor (a weak reference) and its version counter, which every in-place update (an optimizer step)
bumps. Other tensors, or the same tensor after an update, are copied again (device to device, a few
tens of microseconds for a 2B model's layer). A write the version counter does not see (through
`.data`) needs `twell.torch.weights_changed()`.
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from . import _twell

AVAILABLE = bool(getattr(_twell, "has_cuda", False))
_dl = torch.utils.dlpack.to_dlpack  # a DLPack capsule straight from C++ (Tensor.__dlpack__'s Python wrapper costs µs a tensor)


def _caps(*ts):
    return [None if t is None else _dl(t) for t in ts]


@dataclass
class Layer:
    device: int
    infer: Optional[object] = None   # _twell.CudaFfnInfer
    train: Optional[object] = None   # _twell.CudaFfnTrain
    keys: dict = field(default_factory=dict)  # "infer" / "train" → the weights last loaded
    state_ptr: int = 0               # the token of the last training forward
    last: str = ""                   # which context ran the last call: "infer", "train" or ""
    train_path: str = "automatic"    # the path requested by the last training forward (a recompute repeats it)
    recomputes: int = 0              # backwards that ran their forward again
    # The last training forward's host-side facts (no extra synchronisation: the forward waited for
    # its non-zero count anyway): sparse (bool), nnz (the CSR's non-zeros, -1 for a dense step that
    # did not count), hot_neurons and dense_rows (split off the sparse step and run dense),
    # overflow_tiles and overflow_rows (the TwELL gate's blocks and rows beyond its width; -1 without
    # a TwELL gate), path.
    info: dict = field(default_factory=dict)

    def last_path(self) -> str:
        """The path the last call dispatched ('' before one); the inference text is made on request."""
        if self.last == "infer":
            return self.infer.last_path()
        return self.info.get("path", "") if self.last == "train" else ""


_layers: dict[tuple[int, int], Layer] = {}
TOKEN_BYTES = 16  # the training forward's state on CUDA: a fixed shape, so torch.compile keeps one graph
path = "automatic"  # which path every CUDA call takes: "automatic", "sparse" or "dense" (twell.torch.cuda_path)


def layer(device: torch.device, layer_id: int) -> Layer:
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, layer_id)
    got = _layers.get(key)
    if got is None:
        got = _layers[key] = Layer(index)
    return got


def weights_changed() -> None:
    """The next CUDA call of every layer copies its weights in again. For writes PyTorch's version
    counter does not see (through `.data`, or a collective into `.data`); in-place updates on the
    parameters themselves (optimizer steps, `load_state_dict`, `torch.nn.init`) need nothing."""
    for lay in _layers.values():
        lay.keys.clear()


def forget(layer_id: int) -> None:
    """Frees a layer's contexts on every device (its module is gone)."""
    for key in [k for k in _layers if k[1] == layer_id]:
        del _layers[key]
    for shared in (_scratch, _workspace):
        for device in [d for d in shared if not any(k[0] == d for k in _layers)]:
            del shared[device]  # no layer left on the device: its shared workspaces go too


_scratch: dict[int, object] = {}  # device → _twell.CudaTrainScratch, shared by its training contexts
_workspace: dict[int, object] = {}  # device → _twell.CudaFfnWorkspace, shared by its inference contexts
# Where the shared workspaces' memory comes from: "torch" (PyTorch's caching allocator, one pool for
# both, counted by torch.cuda.memory_allocated) or "cuda" (cudaMalloc, twell's own). Read when a
# device's workspace is made (after twell.torch.forget of every layer, a new setting takes effect).
workspace_allocator = "torch"


def torch_allocator(device: int) -> tuple:
    """(allocate, deallocate) for a workspace: PyTorch's caching allocator, on the stream current when
    twell grows a buffer — the stream of the twell call (twell.torch runs on PyTorch's current
    stream), so a block handed back is reused in that stream's order, as the caching allocator
    guarantees. Plain torch functions on purpose: the workspace holds them where Python's garbage
    collector cannot see, so a closure over this module would make a cycle that keeps every
    workspace and layer alive until the process ends (nanobind reported them leaked at exit)."""
    return functools.partial(torch.cuda.caching_allocator_alloc, device=device), torch.cuda.caching_allocator_delete


def _shared(table: dict, device: int, make):
    """The device's workspace set in `table`, made on first use. One per device: a model's layers
    run one after another on PyTorch's stream, and each backward copies its gradients out before
    the next one runs."""
    got = table.get(device)
    if got is None:
        if workspace_allocator not in ("torch", "cuda"):
            raise ValueError(f"twell._cuda.workspace_allocator must be 'torch' or 'cuda', got {workspace_allocator!r}")
        got = table[device] = make(device, *(torch_allocator(device) if workspace_allocator == "torch" else (None, None)))
    return got


def context_bytes() -> int:
    """Device memory twell's training contexts hold outside PyTorch's allocator: each layer's own
    (weights in the kernels' layouts, the state saved for backward), and the workspaces the layers of
    a device share when they are not drawn from PyTorch's allocator (workspace_allocator "cuda")."""
    own = sum(lay.train.own_bytes for lay in _layers.values() if lay.train is not None)
    return own + sum(s.bytes for s in _scratch.values() if not s.from_allocator)


# PyTorch's current stream of a device as a raw cudaStream_t, without a torch.cuda.Stream object
# (microseconds of Python each, on the host path between a training forward's synchronisation
# and its backward's first launch, where the GPU waits); the public call where the private one is gone.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_of(t: Tensor) -> int:
    if _raw_stream is not None:
        return _raw_stream(t.device.index if t.device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def bf16(t: Optional[Tensor]) -> Optional[Tensor]:
    if t is None:
        return None
    t = t.detach()
    return t if t.dtype == torch.bfloat16 and t.is_contiguous() else t.to(torch.bfloat16).contiguous()


def _same(old, w: Optional[Tensor]) -> bool:
    if old is None or w is None:
        return old is None and w is None
    ref, version = old
    return ref() is w and w._version == version


def _as_loaded(ws: tuple) -> tuple:
    """The weights as a layer takes them: all bf16 or all fp32, contiguous. fp32 weights (a trainer's
    master weights) go in as they are, and the layer rounds them to bf16 while it copies them into
    its layouts (the bits of .to(torch.bfloat16), without the bf16 temporaries); anything else is
    rounded to bf16 here."""
    ws = tuple(None if w is None else w.detach() for w in ws)
    if all(w is None or (w.dtype == torch.float32 and w.is_contiguous()) for w in ws):
        return ws
    return tuple(bf16(w) for w in ws)


def load(lay: Layer, which: str, ctx, ws: tuple, stream: int) -> None:
    old = lay.keys.get(which)
    if old is not None and all(_same(o, w) for o, w in zip(old, ws)):
        return
    lay.keys.pop(which, None)  # a failed load leaves no stale key behind
    ctx.load(*_caps(*_as_loaded(ws)), stream)
    lay.keys[which] = tuple(None if w is None else (weakref.ref(w), w._version) for w in ws)


def infer(x: Tensor, w_gate, w_up, w_down, layer_id: int) -> Tensor:
    lay = layer(x.device, layer_id)
    if lay.infer is None:
        lay.infer = _twell.CudaFfnInfer(lay.device, _shared(_workspace, lay.device, _twell.CudaFfnWorkspace))
    s = stream_of(x)
    load(lay, "infer", lay.infer, (w_gate, w_up, w_down), s)
    xb = bf16(x)
    yb = torch.empty_like(xb)
    lay.infer.forward(*_caps(xb, yb), s, path)
    lay.last = "infer"
    return yb.to(x.dtype)


def _train_ctx(lay: Layer):
    if lay.train is None:
        lay.train = _twell.CudaFfnTrain(lay.device, _shared(_scratch, lay.device, _twell.CudaTrainScratch))
    return lay.train


def neuron_counts(xb: Tensor, w_act: Tensor) -> Tensor:
    """Rows in which each neuron fired (its gate, or its up projection when non-gated, > 0): one bf16
    GEMM in row chunks (the CUDA training state keeps no per-neuron index in every path)."""
    w = bf16(w_act)
    counts = torch.zeros(w.shape[0], dtype=torch.int64, device=xb.device)
    for r0 in range(0, xb.shape[0], 8192):
        counts += (xb[r0:r0 + 8192] @ w.T > 0).sum(0)
    return counts


def train_forward(x: Tensor, w_gate, w_up, w_down, layer_id: int, count_neurons: bool):
    lay = layer(x.device, layer_id)
    ctx = _train_ctx(lay)
    s = stream_of(x)
    load(lay, "train", ctx, (w_gate, w_up, w_down), s)
    xb = bf16(x)
    # Everything but the call itself before it: the call waits on the host (its non-zero count), and
    # what follows it runs while the GPU has only the forward's tail left.
    yb = torch.empty_like(xb)
    l1 = torch.empty((), dtype=torch.float32, device=x.device)
    l0 = torch.empty((), dtype=torch.float32, device=x.device)
    token = torch.zeros(TOKEN_BYTES, dtype=torch.uint8, device=x.device)  # its content is never read: its address is the token
    if count_neurons:
        counts = neuron_counts(xb, w_gate if w_gate is not None else w_up)
    else:
        counts = torch.full((w_up.shape[0],), -1, dtype=torch.int64, device=x.device)
    took, sparse, nnz, hot, rows, ovf_tiles, ovf_rows = ctx.forward(*_caps(xb, yb, l1, l0), s, path)
    lay.info = {"sparse": sparse, "nnz": nnz, "hot_neurons": hot, "dense_rows": rows, "rows": xb.shape[0],
                "overflow_tiles": ovf_tiles, "overflow_rows": ovf_rows, "path": took}
    lay.last = "train"
    lay.train_path = path
    lay.state_ptr = token.data_ptr()
    return (yb if x.dtype == torch.bfloat16 else yb.to(x.dtype)), l1, l0, token, counts


def train_backward(x: Tensor, dy: Tensor, w_gate, w_up, w_down, token: Tensor, dl1: Tensor, layer_id: int):
    lay = layer(x.device, layer_id)
    ctx = _train_ctx(lay)
    s = stream_of(x)
    xb = bf16(x)
    if lay.state_ptr != token.data_ptr():  # another forward of this layer ran since: this one again
        load(lay, "train", ctx, (w_gate, w_up, w_down), s)
        scratch = torch.empty((), dtype=torch.float32, device=x.device)
        ctx.forward(*_caps(xb, torch.empty_like(xb), scratch, scratch.clone()), s, lay.train_path)
        lay.state_ptr = token.data_ptr()
        lay.recomputes += 1
    dxb = torch.empty_like(xb)
    # Weight gradients straight in bf16 or fp32 parameters' dtype (twell rounds its fp32 sums once);
    # other dtypes through fp32.
    dwg, dwu, dwd = (None if w is None else torch.empty_like(w, dtype=_grad_dtype(w), memory_format=torch.contiguous_format)
                     for w in (w_gate, w_up, w_down))
    coeff = dl1.detach().reshape(1)
    if coeff.dtype != torch.float32:
        coeff = coeff.to(torch.float32)
    ctx.backward(*_caps(xb, bf16(dy), coeff, dxb, dwg, dwu, dwd), s)
    return (dxb.to(x.dtype), torch.empty(0, device=x.device) if dwg is None else dwg.to(w_gate.dtype),
            dwu.to(w_up.dtype), dwd.to(w_down.dtype))


def _grad_dtype(w: Tensor) -> torch.dtype:
    return w.dtype if w.dtype in (torch.bfloat16, torch.float32) else torch.float32
