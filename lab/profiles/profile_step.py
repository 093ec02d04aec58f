#!/usr/bin/env python3
"""Lab probe: where a twell.torch training step's time goes (torch.profiler over a few steps of the
op and of the same layer's native calls through _twell.CudaFfnTrain, no autograd): GPU kernel time
per kernel, the GPU's busy time against the wall time of a step, and the host time per step.

    python3 lab/profiles/profile_step.py [--m 16384 --k 2048 --n 5632 --density 0.005]
"""
import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "torch"))
from ffn_step import make  # noqa: E402

import twell.torch as tt  # noqa: E402
from twell import _twell  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--n", type=int, default=5632)
    ap.add_argument("--density", type=float, default=0.005)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    x, wg, wu, wd, dy = (t.cuda() for t in make(a.m, a.k, a.n, a.density))
    params = [t.clone().requires_grad_() for t in (wg, wu, wd)]
    xg = x.clone().requires_grad_()
    coeff = torch.tensor(1e-3, device="cuda")
    s = torch.cuda.current_stream().cuda_stream

    def op_step():
        for t in params + [xg]:
            t.grad = None
        y, l1 = tt.ffn(xg, *params)
        torch.autograd.backward([y, l1], [dy, coeff])

    layer = _twell.CudaFfnTrain(torch.cuda.current_device())
    layer.load(wg, wu, wd, s)
    y = torch.empty_like(x)
    l1s, l0s = torch.empty((), device="cuda"), torch.empty((), device="cuda")
    dx = torch.empty_like(x)
    dws = [torch.empty(a.n, a.k, device="cuda", dtype=torch.bfloat16), torch.empty(a.n, a.k, device="cuda", dtype=torch.bfloat16),
           torch.empty(a.k, a.n, device="cuda", dtype=torch.bfloat16)]
    c32 = coeff.float().reshape(1)

    def native_step():
        layer.forward(x, y, l1s, l0s, s)
        layer.backward(x, dy, c32, dx, *dws, s)

    # The host's time from the training forward's return (its sync is inside) to the backward's
    # call: the GPU has only the forward's tail queued meanwhile, so this is where it can idle.
    from twell import _cuda
    op_step()
    lay = _cuda._layers[(torch.cuda.current_device(), -1)]

    class Proxy:
        def __init__(self, inner):
            self.inner, self.marks = inner, []

        def load(self, *a):
            return self.inner.load(*a)

        def forward(self, *a):
            t0 = time.perf_counter()
            r = self.inner.forward(*a)
            self.marks.append(("fwd", t0, time.perf_counter()))
            return r

        def backward(self, *a):
            t0 = time.perf_counter()
            self.inner.backward(*a)
            self.marks.append(("bwd", t0, time.perf_counter()))

    proxy = Proxy(lay.train)
    lay.train = proxy
    for _ in range(10):
        t_step = time.perf_counter()
        op_step()
        proxy.marks.append(("end", t_step, time.perf_counter()))
    torch.cuda.synchronize()
    rows = [m for m in proxy.marks]
    gaps, fwd_in, bwd_in, tails = [], [], [], []
    for i in range(0, len(rows) - 2, 3):
        (f, f0, f1), (b, b0, b1), (e, e0, e1) = rows[i:i + 3]
        gaps.append((b0 - f1) * 1e3)
        fwd_in.append((f1 - f0) * 1e3)
        bwd_in.append((b1 - b0) * 1e3)
        tails.append((e1 - b1) * 1e3)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    print(f"host ms per op step (medians): forward call {med(fwd_in):.3f} (its sync inside), forward return → "
          f"backward call {med(gaps):.3f}, backward call {med(bwd_in):.3f}, after the backward call {med(tails):.3f}")
    lay.train = proxy.inner

    for name, fn in (("op", op_step), ("native (binding, no autograd)", native_step)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / a.steps * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(a.steps):
                fn()
            torch.cuda.synchronize()
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in events) / a.steps / 1e3
        print(f"\n== {name}: wall {wall:.3f} ms/step, GPU kernel+copy time {busy:.3f} ms/step, "
              f"{len(events) / a.steps:.0f} GPU activities/step")
        print(prof.key_averages().table(sort_by="device_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
