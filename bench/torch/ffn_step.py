#!/usr/bin/env python3
"""One FFN layer through twell.torch against PyTorch's own dense FFN and twell's native C++ calls,
in one process on one GPU: the training step (forward + backward) and inference.

    python3 bench/torch/ffn_step.py [--m 16384 --k 2048 --n 5632 --density 0.005] [--out DIR]

Columns (medians of --reps, CUDA events, after --warmup):
  torch dense          F.linear(gate) → ReLU ⊙ F.linear(up) → F.linear(down), bf16, eager autograd
  torch dense compiled the same function under torch.compile (default mode; the backward through
                       AOTAutograd): the strongest dense PyTorch path
  twell op             twell.torch.ffn (the custom ops, autograd, the L1 term's gradient too);
                       before each timed training step the weights are updated in place (outside
                       the timed region), so the op copies them in again, as after an optimizer step
  twell native         twell's own benchmark of the same layer (the C++ calls without PyTorch:
                       TrainContext / FfnContext, sparse as dispatched, and its cuBLASLt dense path)
Each training column is timed one step at a time (events around each step, the GPU idle before
it: the host's own time before the first kernel counts) and back to back (one pair of events
around all reps, as a training loop runs; the native column there is the same C++ through the
binding, without autograd).
Mixed precision (as models train): fp32 master weights under bf16 autocast with an update each step
on both sides, back to back; and the weights' load alone, fp32 as they are against cast first.
Memory: a training step's peak of PyTorch's allocator above what was allocated before it, plus for
twell the device memory its layer context holds (weights in its layouts, workspaces, fp32 weight
gradients: allocated before the step, the workspaces from PyTorch's pool and the rest outside it,
so counted separately and added).
Inputs: bf16 x, weights and dy; column 0 of x is 1 and column 0 of the gate a per-neuron bias that
makes each neuron fire with probability --density (no hot neurons: the uniform case).
Writes ffn_step.json and ffn_step.md under --out and prints the table.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys

try:
    import torch
    import torch.nn.functional as F
    import twell.torch as tt
    from twell import _cuda, _twell
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)


def make(m, k, n, density, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[:, 0] = 1.0
    wg = torch.randn(n, k, generator=g) / math.sqrt(k)
    wu = torch.randn(n, k, generator=g) / math.sqrt(k)
    wd = torch.randn(k, n, generator=g) / math.sqrt(n)
    wg[:, 0] = 0
    wg[:, 0] = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(density)).item() * wg[:, 1:].norm(dim=1).mean()
    dy = torch.randn(m, k, generator=g) / math.sqrt(k)
    return [t.bfloat16() for t in (x, wg, wu, wd, dy)]


def timed(fn, warmup, reps, before=None):
    """Median milliseconds of fn() over reps (CUDA events around each call; `before` runs untimed)."""
    for _ in range(warmup):
        if before:
            before()
        fn()
    times = []
    for _ in range(reps):
        if before:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def throughput(fn, warmup, reps, before=None):
    """Milliseconds a call of fn() over reps calls back to back (one pair of CUDA events around them
    all: the host runs ahead as in a training loop; `before` runs inside, as an optimizer would)."""
    for _ in range(warmup):
        if before:
            before()
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        if before:
            before()
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def dense_ffn(x, wg, wu, wd):
    return F.linear(torch.relu(F.linear(x, wg)) * F.linear(x, wu), wd)


def peak_bytes(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=16384, help="rows (tokens) per step")
    ap.add_argument("--k", type=int, default=2048, help="hidden size")
    ap.add_argument("--n", type=int, default=5632, help="intermediate size (neurons)")
    ap.add_argument("--density", type=float, default=0.005, help="probability that a neuron fires")
    ap.add_argument("--l1", type=float, default=1e-3, help="the L1 coefficient of the training step")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="where ffn_step.json / .md go")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not getattr(_twell, "has_cuda", False):
        print("skipped: needs a CUDA device and twell built with CUDA")
        sys.exit(77)

    m, k, n = args.m, args.k, args.n
    host = make(m, k, n, args.density)
    x, wg, wu, wd, dy = (t.cuda() for t in host)
    params = [t.clone().requires_grad_() for t in (wg, wu, wd)]
    xg = x.clone().requires_grad_()
    coeff = torch.tensor(args.l1, device="cuda")
    res = {"shape": {"m": m, "k": k, "n": n}, "density_target": args.density, "l1": args.l1,
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "commit": os.environ.get("TWELL_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                                      capture_output=True, text=True).stdout.strip(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}

    def clear():
        for t in params + [xg]:
            t.grad = None

    def bump():  # an optimizer step's in-place update: the op must copy the weights in again
        with torch.no_grad():
            for p in params:
                p.mul_(1.0)

    compiled = torch.compile(dense_ffn)

    def dense_step(f):
        def run():
            clear()
            f(xg, *params).backward(dy)
        return run

    def twell_step():
        clear()
        y, l1 = tt.ffn(xg, *params, stats=None)
        torch.autograd.backward([y, l1], [dy, coeff])

    print(f"shape M={m} K={k} N={n}, density {args.density}: warming up (torch.compile takes a while)", flush=True)
    # A twell step first: its layer context exists and its path settles before anything is timed.
    twell_step()
    stats = []
    tt.ffn(xg, *params, stats=stats)  # l0: the measured density
    torch.cuda.synchronize()
    res["density_measured"] = stats[0].l0.item() / n
    res["twell_path_train"] = _cuda._layers[(torch.cuda.current_device(), -1)].last_path()

    train = {}
    train["torch_dense_ms"] = timed(dense_step(dense_ffn), args.warmup, args.reps)
    train["torch_dense_compiled_ms"] = timed(dense_step(compiled), args.warmup, args.reps)
    train["twell_op_ms"] = timed(twell_step, args.warmup, args.reps, before=bump)
    train["twell_op_cached_weights_ms"] = timed(twell_step, args.warmup, args.reps)
    # Steps back to back (the host running ahead, as in training): the op against the same layer's
    # native calls through the binding (no autograd; the same C++ as twell's own benchmark).
    lay = _twell.CudaFfnTrain(torch.cuda.current_device())
    s = torch.cuda.current_stream().cuda_stream
    dl = torch.utils.dlpack.to_dlpack
    lay.load(dl(wg), dl(wu), dl(wd), s)
    yb, dxb = torch.empty_like(x), torch.empty_like(x)
    l1s, l0s = torch.empty((), device="cuda"), torch.empty((), device="cuda")
    dws = [torch.empty_like(p) for p in params]
    c32 = coeff.float().reshape(1)

    def native_step():
        lay.forward(dl(x), dl(yb), dl(l1s), dl(l0s), s)
        lay.backward(dl(x), dl(dy), dl(c32), dl(dxb), *(dl(t) for t in dws), s)

    def native_step_reload():  # what the op does after an optimizer step: the weights copied in again
        lay.load(*(dl(p.detach()) for p in params), s)
        native_step()

    # Like for like: the op with its weights unchanged against the native calls; the op after each
    # bump (an optimizer's in-place update, inside the timed loop here: ≈ 46 µs of the GPU's time at
    # the default shape, and the op's copy of the weights into its layouts) against the native calls
    # after the same bump and a load of the same weights.
    train["back_to_back"] = {
        "torch_dense_ms": throughput(dense_step(dense_ffn), args.warmup, args.reps),
        "torch_dense_compiled_ms": throughput(dense_step(compiled), args.warmup, args.reps),
        "twell_op_ms": throughput(twell_step, args.warmup, args.reps, before=bump),
        "twell_native_binding_ms": throughput(native_step, args.warmup, args.reps),
        "twell_op_weights_unchanged_ms": throughput(twell_step, args.warmup, args.reps),
        "twell_native_binding_bump_reload_ms": throughput(native_step_reload, args.warmup, args.reps, before=bump),
    }
    del lay

    # Mixed precision, as models train: fp32 master weights under bf16 autocast, and an update of the
    # weights each step on both sides (an optimizer's, inside the timed loop), back to back. PyTorch
    # casts the weights to bf16 in each forward; the op hands them to its layer as they are, which
    # rounds them while copying them into its layouts ("cast then load": the op as it was before,
    # PyTorch's bf16 temporaries first).
    p32 = [p.detach().float().requires_grad_() for p in params]

    def bump32():
        with torch.no_grad():
            for p in p32:
                p.mul_(1.0)

    def clear32():
        for t in p32 + [xg]:
            t.grad = None

    def dense32(f):
        def run():
            clear32()
            with torch.autocast("cuda", torch.bfloat16):
                y = f(xg, *p32)
            y.backward(dy)
        return run

    def twell32():
        clear32()
        with torch.autocast("cuda", torch.bfloat16):
            y, l1 = tt.ffn(xg, *p32, stats=None)
        torch.autograd.backward([y, l1], [dy, coeff])

    def cast_then_load(ws):
        return tuple(_cuda.bf16(w) for w in ws)

    mixed = {"torch_dense_ms": throughput(dense32(dense_ffn), args.warmup, args.reps, before=bump32),
             "torch_dense_compiled_ms": throughput(dense32(compiled), args.warmup, args.reps, before=bump32),
             "twell_op_ms": throughput(twell32, args.warmup, args.reps, before=bump32)}
    direct, _cuda._as_loaded = _cuda._as_loaded, cast_then_load
    try:
        mixed["twell_op_cast_then_load_ms"] = throughput(twell32, args.warmup, args.reps, before=bump32)
    finally:
        _cuda._as_loaded = direct
    # The load alone (a layer of its own): fp32 weights as they are, cast to bf16 first, bf16 weights.
    lay = _twell.CudaFfnTrain(torch.cuda.current_device())
    w32 = [p.detach() for p in p32]
    w16 = [p.detach() for p in params]
    mixed["load"] = {
        "fp32_ms": throughput(lambda: lay.load(*(dl(w) for w in w32), s), args.warmup, args.reps),
        "fp32_cast_then_load_ms": throughput(lambda: lay.load(*(dl(w) for w in cast_then_load(w32)), s), args.warmup,
                                             args.reps),
        "bf16_ms": throughput(lambda: lay.load(*(dl(w) for w in w16), s), args.warmup, args.reps),
    }
    del lay
    train["mixed"] = mixed
    nat = _twell.bench_train(*(t.float().numpy() for t in (host[0], host[4], host[1], host[2], host[3])), args.l1,
                             args.warmup, args.reps)
    train["twell_native_ms"] = nat["sparse_step_ms"]
    train["native_dense_cublaslt_ms"] = nat["dense_step_ms"]
    train["native_path"] = nat["path"]
    mem = {"torch_dense_peak": peak_bytes(dense_step(dense_ffn)),
           "twell_op_peak": peak_bytes(twell_step),
           "twell_context_bytes": _cuda._layers[(torch.cuda.current_device(), -1)].train.device_bytes}
    mem["twell_total"] = mem["twell_op_peak"] + mem["twell_context_bytes"]

    infer = {}
    with torch.no_grad():
        infer["torch_dense_ms"] = timed(lambda: dense_ffn(x, wg, wu, wd), args.warmup, args.reps)
        infer["torch_dense_compiled_ms"] = timed(lambda: compiled(x, wg, wu, wd), args.warmup, args.reps)
        infer["twell_op_ms"] = timed(lambda: tt.ffn(x, wg, wu, wd), args.warmup, args.reps)
        res["twell_path_infer"] = _cuda._layers[(torch.cuda.current_device(), -1)].last_path()
    nat = _twell.bench_infer(*(t.float().numpy() for t in host[:4]), args.warmup, args.reps)
    infer["twell_native_ms"] = nat["sparse_ms"]
    infer["native_dense_cublaslt_ms"] = nat["dense_ms"]
    infer["native_path"] = nat["path"]
    res["train"], res["infer"], res["memory"] = train, infer, mem

    best_dense_t = min(train["torch_dense_ms"], train["torch_dense_compiled_ms"])
    best_dense_i = min(infer["torch_dense_ms"], infer["torch_dense_compiled_ms"])
    res["ratios"] = {
        "train_op_vs_native": train["twell_op_ms"] / train["twell_native_ms"],
        # (until 2026-11-27 the only back-to-back ratio: the op's side had the bump and the weights'
        # copy, the native side neither)
        "train_op_vs_native_back_to_back": train["back_to_back"]["twell_op_ms"] / train["back_to_back"]["twell_native_binding_ms"],
        "train_op_vs_native_back_to_back_weights_unchanged":
            train["back_to_back"]["twell_op_weights_unchanged_ms"] / train["back_to_back"]["twell_native_binding_ms"],
        "train_op_vs_native_back_to_back_bump_reload":
            train["back_to_back"]["twell_op_ms"] / train["back_to_back"]["twell_native_binding_bump_reload_ms"],
        "train_speedup_vs_best_torch_dense": best_dense_t / train["twell_op_ms"],
        "train_mixed_speedup_vs_best_torch_dense":
            min(train["mixed"]["torch_dense_ms"], train["mixed"]["torch_dense_compiled_ms"]) / train["mixed"]["twell_op_ms"],
        "infer_op_vs_native": infer["twell_op_ms"] / infer["twell_native_ms"],
        "infer_speedup_vs_best_torch_dense": best_dense_i / infer["twell_op_ms"],
        "train_memory_twell_over_dense": mem["twell_total"] / mem["torch_dense_peak"],
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ffn_step.json"), "w") as f:
        json.dump(res, f, indent=2)
    r = res["ratios"]
    mx = train["mixed"]
    lines = [
        f"# twell.torch FFN layer vs PyTorch dense ({res['gpu']}, commit {res['commit']}, {res['date']})",
        "",
        f"M = {m}, K = {k}, N = {n}; measured density {100 * res['density_measured']:.3f} % "
        f"(target {100 * args.density:.3f} %); bf16; medians of {args.reps}.",
        "",
        "| | training step (ms) | inference (ms) |",
        "|---|---:|---:|",
        f"| torch dense (eager) | {train['torch_dense_ms']:.3f} | {infer['torch_dense_ms']:.3f} |",
        f"| torch dense (torch.compile) | {train['torch_dense_compiled_ms']:.3f} | {infer['torch_dense_compiled_ms']:.3f} |",
        f"| twell native dense (cuBLASLt) | {train['native_dense_cublaslt_ms']:.3f} | {infer['native_dense_cublaslt_ms']:.3f} |",
        f"| twell native sparse | {train['twell_native_ms']:.3f} | {infer['twell_native_ms']:.3f} |",
        f"| **twell.torch op** | **{train['twell_op_ms']:.3f}** | **{infer['twell_op_ms']:.3f}** |",
        f"| twell.torch op, weights unchanged | {train['twell_op_cached_weights_ms']:.3f} | |",
        "",
        "Steps back to back (the host runs ahead, as in a training loop), ms a step: " + ", ".join(
            f"{k.removesuffix('_ms').replace('_', ' ')} {v:.3f}" for k, v in train["back_to_back"].items()),
        "",
        f"- op / native: training {r['train_op_vs_native']:.3f} one step at a time, "
        f"{r['train_op_vs_native_back_to_back_weights_unchanged']:.3f} back to back with the weights unchanged, "
        f"{r['train_op_vs_native_back_to_back_bump_reload']:.3f} back to back after an update each step (both sides "
        f"bumped and reloaded) (target ≤ 1.05); {r['train_op_vs_native_back_to_back']:.3f} op-with-updates / native-without; "
        f"inference {r['infer_op_vs_native']:.3f}",
        f"- speed-up over the best PyTorch dense: training {r['train_speedup_vs_best_torch_dense']:.2f}× "
        f"(target ≥ 1.8×), inference {r['infer_speedup_vs_best_torch_dense']:.2f}×",
        f"- mixed precision (fp32 master weights, bf16 autocast, an update each step on both sides; back to back, "
        f"ms a step): torch dense {mx['torch_dense_ms']:.3f}, compiled {mx['torch_dense_compiled_ms']:.3f}, "
        f"**twell op {mx['twell_op_ms']:.3f}** ({mx['twell_op_cast_then_load_ms']:.3f} with the weights cast to bf16 "
        f"before the load): **{r['train_mixed_speedup_vs_best_torch_dense']:.2f}×** the best dense",
        f"- the weights' load alone, ms: fp32 {mx['load']['fp32_ms']:.3f} (cast to bf16 first "
        f"{mx['load']['fp32_cast_then_load_ms']:.3f}), bf16 {mx['load']['bf16_ms']:.3f}",
        f"- training-step memory: torch dense peak {mem['torch_dense_peak'] / 2**20:.0f} MiB; twell op peak "
        f"{mem['twell_op_peak'] / 2**20:.0f} MiB + its context {mem['twell_context_bytes'] / 2**20:.0f} MiB = "
        f"{mem['twell_total'] / 2**20:.0f} MiB ({r['train_memory_twell_over_dense']:.2f}× dense)",
        f"- paths: training {res['twell_path_train']!r}; inference {res['twell_path_infer']!r}",
    ]
    with open(os.path.join(args.out, "ffn_step.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
