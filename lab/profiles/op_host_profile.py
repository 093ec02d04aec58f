#!/usr/bin/env python3
"""Where twell.torch's training step spends its host time on CUDA (lab; one layer, as ffn_step.py).

    python3 lab/profiles/op_host_profile.py [--m 16384 --k 2048 --n 5632 --density 0.005] [--steps 50]

Runs the op's training step back to back under cProfile (an in-place update of the weights before
each step, as an optimizer makes, so the layer copies them in again) and prints the functions by
their own time. The extension's forward waits on the host for its non-zero count (the GPU's work
queued before it), so its own time is mostly that wait; the rest is the host's Python and
launches, which the GPU waits for after that wait until the backward's first kernel. Also times,
without the profiler, the host alone from the forward's return to the backward's call into the
extension (perf_counter, median over the steps)."""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

try:
    import torch
    import twell.torch as tt
    from twell import _cuda

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "torch"))
    from ffn_step import make  # the same layer and inputs as the benchmark
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--n", type=int, default=5632)
    ap.add_argument("--density", type=float, default=0.005)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    if not (torch.cuda.is_available() and _cuda.AVAILABLE):
        print("skipped: needs a CUDA device and twell built with CUDA")
        sys.exit(77)
    m, k, n = args.m, args.k, args.n
    x, wg, wu, wd, dy = (t.cuda() for t in make(m, k, n, args.density))
    xg = x.requires_grad_()
    params = [t.requires_grad_() for t in (wg, wu, wd)]
    coeff = torch.tensor(1e-3, device="cuda")
    marks = {}
    real_fwd, real_bwd, real_caps = _cuda.train_forward, _cuda.train_backward, _cuda._caps
    real_fn_fwd, real_grads, real_ffn = tt._EagerTrain.forward, tt._grads, tt.ffn

    def fwd(*a, **kw):  # the forward's return: the host's clock starts
        out = real_fwd(*a, **kw)
        marks["fwd_return"] = time.perf_counter()
        return out

    def fn_fwd(*a, **kw):
        out = real_fn_fwd(*a, **kw)
        marks["function_forward_return"] = time.perf_counter()
        return out

    def ffn(*a, **kw):
        out = real_ffn(*a, **kw)
        marks["ffn_return"] = time.perf_counter()
        return out

    def grads(*a, **kw):
        marks["engine_calls_backward"] = time.perf_counter()
        return real_grads(*a, **kw)

    def bwd(*a, **kw):
        marks["bwd_enter"] = time.perf_counter()
        return real_bwd(*a, **kw)

    def caps(*a):  # its last call in a step: the backward's, right before the extension's backward
        out = real_caps(*a)
        marks["caps"] = time.perf_counter()
        return out

    def patch(on):
        _cuda.train_forward, _cuda.train_backward, _cuda._caps = (fwd, bwd, caps) if on else (real_fwd, real_bwd, real_caps)
        tt._EagerTrain.forward = staticmethod(fn_fwd if on else real_fn_fwd)
        tt._grads, tt.ffn = (grads, ffn) if on else (real_grads, real_ffn)

    def step():
        for t in params + [xg]:
            t.grad = None
        with torch.no_grad():
            for p in params:
                p.mul_(1.0)
        y, l1 = tt.ffn(xg, *params, stats=None)
        marks["backward_called"] = time.perf_counter()
        torch.autograd.backward([y, l1], [dy, coeff])

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    order = ["fwd_return", "function_forward_return", "ffn_return", "backward_called", "engine_calls_backward",
             "bwd_enter", "caps"]
    gaps, segments = [], {b: [] for b in order[1:]}
    patch(True)
    try:
        for _ in range(args.steps):
            step()
            gaps.append(1e6 * (marks["bwd_enter"] - marks["fwd_return"]))
            for a, b in zip(order, order[1:]):
                segments[b].append(1e6 * (marks[b] - marks[a]))
    finally:
        patch(False)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    wall = 1e3 * (time.perf_counter() - t0) / args.steps
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print(f"{torch.cuda.get_device_name()}; M = {m}, K = {k}, N = {n}, density {args.density}; {args.steps} steps")
    print(f"step, back to back: {wall:.3f} ms; host from the forward's return (after its wait) to the backward's call: "
          f"median {statistics.median(gaps):.0f} µs (min {min(gaps):.0f}, max {max(gaps):.0f}); the path: {_cuda._layers[(torch.cuda.current_device(), -1)].last_path()}")
    # PyTorch's own latency from torch.autograd.backward to a Function's backward, for comparison: a
    # trivial Function over a CUDA tensor, with the GPU idle and with ≈ 2 ms of GEMMs still queued.
    ref_marks = {}

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            ref_marks["backward"] = time.perf_counter()
            return g * 2

    a = xg.detach().clone().requires_grad_()
    w = params[0].detach()
    ref = {"gpu idle": [], "gpu busy": []}
    for busy in (False, True):
        for _ in range(args.steps):
            b = Twice.apply(a)
            torch.cuda.synchronize()
            if busy:
                for _ in range(4):
                    xg.detach() @ w.T  # ≈ 0.5 ms each at the default shape
            t = time.perf_counter()
            b.backward(dy)
            ref["gpu busy" if busy else "gpu idle"].append(1e6 * (ref_marks["backward"] - t))
    print("PyTorch alone, torch.autograd.backward → a trivial Function's backward, median µs: " + ", ".join(
        f"{k} {statistics.median(v):.0f}" for k, v in ref.items()))
    print("host segments after the forward's wait, median µs (each from the mark before): " + ", ".join(
        f"{b} {statistics.median(v):.0f}" for b, v in segments.items()))
    print(out.getvalue())


if __name__ == "__main__":
    main()
