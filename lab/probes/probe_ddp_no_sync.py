#!/usr/bin/env python3
"""Probe: does DDP under torch.compile skip the gradient all-reduce in `no_sync` micro-batches?

    python3 lab/probes/probe_ddp_no_sync.py [--ranks 2] [--accum 4]

Two CPU processes (gloo) train a small MLP with DDP, eager and `torch.compile`d, one step of one
micro-batch and one of --accum micro-batches (all but the last under `no_sync`, as twell.train and
model_step.py do), and count gloo all-reduce calls in each step with the PyTorch profiler. Equal
counts: the exchange happens once a step. (Written for lab/notes/2026-11-multi-gpu-log.md: a 4-GPU step of 8
micro-batches costs ≈ 17–28 ms a micro-batch more than one GPU's; this rules communication in or out.)
"""
import argparse
import contextlib
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank, world, port, accum, compiled, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]), bucket_cap_mb=1)
    fwd = torch.compile(model) if compiled else model
    x = torch.randn(16, 256)

    def step(n):
        for i in range(n):
            with model.no_sync() if i + 1 < n else contextlib.nullcontext():
                fwd(x).square().mean().backward()

    step(accum)  # warm-up (and compilation)
    counts = []
    for n in (1, accum):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
            step(n)
        counts.append(sum(1 for e in p.events() if e.name == "gloo:all_reduce"))
    if rank == 0:
        out.put(counts)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--accum", type=int, default=4)
    a = ap.parse_args()
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    ok = True
    for compiled in (False, True):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        q = ctx.Queue()
        mp.start_processes(worker, args=(a.ranks, port, a.accum, compiled, q), nprocs=a.ranks, start_method="spawn")
        one, many = q.get()
        ok &= one == many
        print(f"{'compiled' if compiled else 'eager':8s}: all-reduce calls in a step of 1 micro-batch: {one}, "
              f"of {a.accum}: {many} -> {'once a step' if one == many else 'MORE THAN ONCE A STEP'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
