#!/usr/bin/env python3
"""PyTorch's compiled dense decode step, kernel by kernel: the yardstick's row as twell's timeline
probe (lab/probes/probe_timeline.cpp) shows twell's, so the two can be read side by side.

    python3 lab/profiles/torch_decode_kernels.py MODEL_DIR [--batch 64] [--context 512] [--steps 16]
                                                 [--mode default+graph] [--attn sdpa] [--out FILE.md]

The model is bench/model/fast_llama.py's lean body over the checkpoint (bf16), compiled and captured
as bench/model/torch_yardstick.py's `fast compile+graphs` row (the same functions), a prompt of
--context random tokens a sequence, 8 warm-up steps, then --steps graph replays under
torch.profiler (CUPTI kernel records of the replayed graph). Prints, per kernel name: launches a
step, µs a step and a launch; the step's GPU span (first kernel's start to the last one's end,
median) and the idle time between kernels; and one layer's kernels in order from the middle of
the median step. Needs a GPU; exits 77 without one.
"""
import argparse
import os
import statistics
import sys

try:
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "model"))
from torch_yardstick import capture_step, compile_mode, fast_model  # noqa: E402


def kernel_records(prof):
    """(name, start µs, end µs) of every GPU kernel the profiler saw, in start order."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            out.append((e.name, e.time_range.start, e.time_range.end))
    return sorted(out, key=lambda k: k[1])


def split_steps(kernels, per_step):
    """The records cut into steps of per_step kernels (a replayed graph launches the same kernels
    in the same order every step)."""
    n = len(kernels) // per_step
    return [kernels[i * per_step:(i + 1) * per_step] for i in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=16, help="profiled graph replays (default 16)")
    ap.add_argument("--mode", default="default+graph", help="a torch_yardstick --fast-modes entry (default+graph)")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "math"])
    ap.add_argument("--out", help="also write the tables to this markdown file")
    a = ap.parse_args()
    if a.batch < 1 or a.context < 1 or a.steps < 2:
        ap.error("--batch and --context are at least 1, --steps at least 2")
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 77
    torch.manual_seed(1)
    hf = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    layers = hf.config.num_hidden_layers
    vocab = hf.config.vocab_size
    base, cdt, own_graph = compile_mode(a.mode)
    if not own_graph:
        ap.error(f"--mode {a.mode!r}: this profile replays a graph of its own (a '+graph' mode)")
    torch._inductor.config.coordinate_descent_tuning = cdt
    fast = fast_model(hf, a.context + 8 + a.steps + 2, a.batch, attn=a.attn)
    del hf
    torch.cuda.empty_cache()
    prompt = torch.randint(0, vocab, (a.batch, a.context), device="cuda")
    compiled = torch.compile(fast.decode, mode=base, fullgraph=True, dynamic=False)
    ids_in = torch.zeros(a.batch, 1, dtype=torch.long, device="cuda")
    pos_in = torch.zeros(1, dtype=torch.long, device="cuda")
    with torch.inference_mode():
        nxt = fast.prefill(prompt)
        ids_in.copy_(nxt[:, None])
        pos_in.fill_(a.context)
        g, out = capture_step(compiled, ids_in, pos_in)  # as the yardstick's row captures it

        def step(i):
            pos_in.fill_(a.context + i)
            g.replay()
            ids_in.copy_(out.view(a.batch, 1))

        for i in range(8):
            step(i)
        torch.cuda.synchronize()
        # One replay alone first: how many kernels a step launches.
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as one:
            g.replay()
            torch.cuda.synchronize()
        per_step = len(kernel_records(one))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for i in range(a.steps):
                g.replay()  # the same position each replay: the same bytes every step
            torch.cuda.synchronize()
    steps = split_steps(kernel_records(prof), per_step) if per_step else []
    if len(steps) < 2:
        print(f"torch_decode_kernels: the profiler returned {per_step} kernels for one replay; no table")
        return 1
    spans = [s[-1][2] - s[0][1] for s in steps]
    idles = [sum(max(0.0, s[i][1] - max(k[2] for k in s[:i])) for i in range(1, len(s))) for s in steps]
    med = sorted(range(len(steps)), key=lambda i: spans[i])[len(steps) // 2]
    lines = [f"# PyTorch's compiled decode step, kernel by kernel: {os.path.basename(os.path.normpath(a.model))}, "
             f"batch {a.batch}, {a.context} prompt tokens + 8 steps, {a.mode}, {a.attn} attention, "
             f"{torch.cuda.get_device_name()}, torch {torch.__version__}",
             "",
             f"{len(steps)} steps profiled, {per_step} kernels a step; step span {statistics.median(spans):.1f} us median "
             f"(first kernel's start to the last one's end); idle between kernels {statistics.median(idles):.1f} us",
             "", "| kernel | launches a step | us a step | us a launch |", "|---|---:|---:|---:|"]
    agg = {}
    for s in steps:
        for name, t0, t1 in s:
            c = agg.setdefault(name, [0, 0.0])
            c[0] += 1
            c[1] += t1 - t0
    for name, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| `{name[:90]}` | {n / len(steps):.1f} | {us / len(steps):.1f} | {us / n:.2f} |")
    s = steps[med]
    per_layer = max(1, per_step // layers)
    first = (layers // 2) * per_layer
    lines += ["", f"kernels {first} .. {first + 2 * per_layer - 1} of the median step (≈ {per_layer} a layer), "
              "µs from the step's start:", "", "| kernel | start | duration | gap after the previous one's end |",
              "|---|---:|---:|---:|"]
    for i in range(first, min(len(s), first + 2 * per_layer)):
        name, t0, t1 = s[i]
        gap = t0 - s[i - 1][2] if i > 0 else 0.0
        lines.append(f"| `{name[:90]}` | {t0 - s[0][1]:.2f} | {t1 - t0:.2f} | {gap:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
