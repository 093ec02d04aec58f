#!/usr/bin/env python3
"""Where the time of PyTorch's best dense prefill goes, kernel by kernel (the counterpart of
twell_probe_prefill under ncu, for issue 27's prefill targets).

    python3 lab/profiles/torch_prefill_profile.py MODEL_DIR [--batch 8] [--len 512] [--md OUT.md]

Loads the checkpoint with transformers (bf16, CUDA), copies it into bench/model/fast_llama.py's lean
body without a KV cache, compiles its prefill (torch.compile, default mode, as the yardstick's
"prefill fast compile" row), warms it up, then runs one prefill of batch × len random tokens under
torch.profiler and sums the CUDA kernels' time by name and by kind (GEMM, attention, Triton fused
element-wise, other). Kernel time only: the gaps between kernels are not counted, as ncu's sums.
"""
import argparse
import os
import sys
import time
from collections import OrderedDict

import torch


def kind(name):
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "sdpa" in n:
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "gemv", "matmul")):
        return "GEMM"
    if n.startswith("triton"):
        return "Triton (fused element-wise, norms)"
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--md", help="also write the tables here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 77
    from transformers import AutoModelForCausalLM
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "model"))
    from fast_llama import FastLlama

    hf = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    fast = FastLlama.from_hf(hf, max_len=a.len, batch=a.batch, cache=False)
    del hf
    torch.cuda.empty_cache()
    ids = torch.randint(0, fast.embed.shape[0], (a.batch, a.len), device="cuda")
    step = torch.compile(fast.logits)
    with torch.inference_mode():
        for _ in range(3):
            step(ids)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(ids)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step(ids)
            torch.cuda.synchronize()
    per = OrderedDict()
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(e, "device_time", None)
        if us is None:
            us = e.cuda_time
        r = per.setdefault(e.name, [0, 0.0])
        r[0] += 1
        r[1] += us
    total = sum(t for _, t in per.values())
    kinds = OrderedDict()
    for name, (n, t) in per.items():
        k = kinds.setdefault(kind(name), [0, 0.0])
        k[0] += n
        k[1] += t
    tokens = a.batch * a.len
    lines = [f"### PyTorch lean body, torch.compile, prefill {a.batch} × {a.len}: {sum(n for n, _ in per.values())} kernels, "
             f"{total:.0f} µs of kernel time; one timed run {wall * 1e3:.2f} ms ({tokens / wall:.0f} tokens/s)", "",
             "| kind | launches | µs | share |", "|---|---:|---:|---:|"]
    for name, (n, t) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {name} | {n} | {t:.0f} | {100 * t / max(total, 1e-9):.1f} % |")
    lines += ["", "| kernel | launches | µs | share |", "|---|---:|---:|---:|"]
    for name, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:25]:
        lines.append(f"| `{name[:90]}` | {n} | {t:.0f} | {100 * t / max(total, 1e-9):.1f} % |")
    out = "\n".join(lines) + "\n"
    print(out)
    if a.md:
        with open(a.md, "w", encoding="utf-8") as f:
            f.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
