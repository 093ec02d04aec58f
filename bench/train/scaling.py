#!/usr/bin/env python3
"""Training throughput over 1 … G GPUs (issue 30): the model-level step of `model_step.py`, sparse
(twell) against dense, under DDP or FSDP2, for each GPU count.

    python3 bench/train/scaling.py --model DIR --gpus 1,2,4 [--modes dense-compiled,twell-compiled]
                                   [--parallel ddp,fsdp] [--micro-batch 8] [--budget 540] --out DIR

Each (GPU count, engine, mode) is one `model_step.py --gpus G --parallel P --modes MODE` run (its
own torchrun, its own processes). Runs with the same GPU count may go side by side on disjoint
GPUs (CUDA_VISIBLE_DEVICES) when the machine has room, to fit a device call: their ratios are
then taken under the same conditions, which the table says (column "beside"). Runs of different
GPU counts never overlap. --budget (seconds) stops starting runs that could not finish in time;
results are written after every run (scaling-TAG.json / .md), so a call cut short keeps them.

Columns: tokens/s of all GPUs; per GPU; scaling efficiency = tokens/s(G) / (G · tokens/s(1)) of the
same mode (weak scaling: each GPU keeps its micro-batch); the ratio to the best dense mode at the
same G and engine; peak memory of the largest rank (PyTorch's allocator plus twell's contexts).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DENSE = ("dense-compiled", "hf-eager")


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.TimeoutExpired):
        return 0


def jobs_for(gpus, engines, modes):
    """(G, engine, mode) in the order they run: by G, then engine, dense first within each."""
    out = []
    for g in gpus:
        for p in (engines if g > 1 else ["single"]):
            out += [(g, p, m) for m in modes]
    return out


def key(g, p, m):
    return f"g{g}-{p}-{m}"


def step_ms(r: dict) -> float:
    """The step time the table reads: the median of the back-to-back steps (CUDA events), or for
    results from before those were recorded, the median of the steps timed one at a time. Both
    resist one slow step, which the mean of a few back-to-back steps does not."""
    if r.get("step_ms_each"):
        return statistics.median(r["step_ms_each"])
    return statistics.median(r["step_ms_one_at_a_time"]) if r.get("step_ms_one_at_a_time") else r["step_ms"]


def tokens_per_s(r: dict, res: dict) -> float:
    return r["gpus"] * res["micro_batch"] * res.get("grad_accum", 1) * res["seq"] / (step_ms(r) / 1e3)


def table(res: dict) -> str:
    rows = res["runs"]
    ok = {key(r["gpus"], r["parallel"], r["mode"]): r for r in rows if "error" not in r}
    lines = [f"# Training throughput over GPUs — {res['config']} — {res['gpu']} × {res['gpus_on_machine']}, "
             f"commit {res['commit']}, {res['date']}", "",
             f"Each GPU: micro-batch {res['micro_batch']} × sequence {res['seq']}"
             + (f" × {res['grad_accum']} micro-batches a step (gradients exchanged after the last)" if res.get("grad_accum", 1) > 1 else "")
             + "; bf16 autocast, fp32 master weights, "
             f"fused AdamW, SDPA attention; lr {res['lr']}; {res['steps']} timed steps after {res['warmup']} warm-up. "
             "tokens/s from the median step (see bench/train/scaling.py: step_ms); \"mean\" is the plain mean of the "
             "back-to-back steps, which one slow step can move. "
             "Scaling efficiency: tokens/s(G) / (G · tokens/s(1)) of the same mode. "
             "\"beside\": runs of the same G that shared the machine (on other GPUs) while this one ran.", "",
             "| GPUs | engine | mode | step ms (median) | step ms (mean) | tokens/s | per GPU | scaling eff. | vs best dense | peak GiB / GPU | density | beside |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        g, p, m = r["gpus"], r["parallel"], r["mode"]
        if "error" in r:
            lines.append(f"| {g} | {p} | {m} | failed: {r['error'][:100]} | | | | | | | | |")
            continue
        tps = tokens_per_s(r, res)
        one = ok.get(key(1, "single", m))
        eff = f"{100 * tps / (g * tokens_per_s(one, res)):.1f} %" if one else ""
        dense = [ok[key(g, p, d)] for d in DENSE if key(g, p, d) in ok]
        best = max((tokens_per_s(d, res) for d in dense), default=None)
        vs = f"{tps / best:.2f}×" if best else ""
        dens = f"{100 * r['density_mean']:.2f} %" if r.get("density_mean") is not None else ""
        lines.append(f"| {g} | {p} | {m} | {step_ms(r):.1f} | {r['step_ms']:.1f} | {tps / 1e3:.1f} k | {tps / g / 1e3:.1f} k | "
                     f"{eff} | {vs} | {r['peak_gib']:.2f} | {dens} | {r.get('beside', 0)} |")
    skipped = res.get("not_run", [])
    if skipped:
        lines += ["", "Not run (time budget or GPUs): " + ", ".join(skipped)]
    return "\n".join(lines)


def plot(paths: list, out: str) -> None:
    """tokens/s per GPU against the GPU count, one panel per result, a line per (engine, mode)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(paths), figsize=(5.5 * len(paths), 4), squeeze=False)
    for ax, path in zip(axes[0], paths):
        res = json.load(open(path))
        lines: dict = {}
        for r in res["runs"]:
            if "error" in r:
                continue
            engines = ["ddp", "fsdp"] if r["parallel"] == "single" else [r["parallel"]]
            for e in engines:
                lines.setdefault((e, r["mode"]), []).append((r["gpus"], tokens_per_s(r, res) / r["gpus"] / 1e3))
        for (e, m), pts in sorted(lines.items()):
            if len(pts) < 2 and e != "ddp":  # a one-GPU point alone is drawn once, on the DDP line
                continue
            pts.sort()
            ax.plot([g for g, _ in pts], [v for _, v in pts], marker="o", ls="-" if e == "ddp" else "--",
                    label=f"{m} ({e.upper()})")
        ax.set(xlabel="GPUs", ylabel="k tokens/s per GPU", title=f"{res['config']}: {res['gpu']}, {res['commit']}")
        ax.set_xticks(sorted({r["gpus"] for r in res["runs"]}))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--model", help="a Hugging Face Llama checkpoint with ReLU MLPs (twell gen model)")
    ap.add_argument("--gpus", default="1,2,4", help="comma-separated GPU counts")
    ap.add_argument("--parallel", default="ddp", help="comma-separated engines for G > 1: ddp, fsdp")
    ap.add_argument("--modes", default="dense-compiled,twell-compiled", help="model_step.py modes")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--grad-accum", type=int, default=1, help="micro-batches a step (model_step.py --grad-accum)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.0)
    ap.add_argument("--side-by-side", type=int, default=1, help="1: runs of the same G share the machine when GPUs allow")
    ap.add_argument("--budget", type=float, default=540, help="seconds: no run starts that its estimate would carry past this")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default=".")
    ap.add_argument("--table", help="print the table of an existing scaling-TAG.json (rewrites its .md) and exit")
    ap.add_argument("--plot", nargs="+", metavar="JSON", help="draw existing results into --plot-out and exit")
    ap.add_argument("--plot-out", default="scaling.png")
    a = ap.parse_args()
    if a.plot:
        plot(a.plot, a.plot_out)
        print(a.plot_out)
        return 0
    if a.table:
        res = json.load(open(a.table))
        md = table(res)
        with open(os.path.splitext(a.table)[0] + ".md", "w") as f:
            f.write(md + "\n")
        print(md)
        return 0
    if not a.model:
        ap.error("--model is required")
    gpus = [int(g) for g in a.gpus.split(",") if g]
    engines = [p for p in a.parallel.split(",") if p]
    if any(p not in ("ddp", "fsdp") for p in engines) or any(g < 1 for g in gpus):
        ap.error("--parallel takes ddp and fsdp; --gpus counts ≥ 1")
    have = gpu_count()
    if have == 0:
        print("skipped: no GPU")
        return 77
    tag = a.tag or os.path.basename(os.path.normpath(a.model))
    os.makedirs(a.out, exist_ok=True)
    scratch = os.path.join(a.out, f".scaling-{tag}")
    os.makedirs(scratch, exist_ok=True)
    name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                          capture_output=True, text=True).stdout.strip()
    res = {"config": tag, "gpu": name, "gpus_on_machine": have, "commit": os.environ.get("TWELL_COMMIT", "unknown"),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "micro_batch": a.micro_batch, "grad_accum": a.grad_accum, "seq": a.seq, "steps": a.steps, "warmup": a.warmup, "lr": a.lr,
           "modes": a.modes.split(","), "runs": [], "not_run": []}
    base = os.path.join(a.out, f"scaling-{tag}")

    def save():
        with open(base + ".json", "w") as f:
            json.dump(res, f, indent=1)
        with open(base + ".md", "w") as f:
            f.write(table(res) + "\n")

    start = time.time()
    took: dict[str, float] = {}  # mode → seconds its last run took (the estimate for the next)
    todo = jobs_for(gpus, engines, a.modes.split(","))
    for g in gpus:
        batch = [j for j in todo if j[0] == g]
        if g > have:
            res["not_run"] += [key(*j) + " (machine has fewer GPUs)" for j in batch]
            continue
        per_wave = max(1, have // g) if a.side_by_side else 1
        for w0 in range(0, len(batch), per_wave):
            wave = batch[w0:w0 + per_wave]
            est = max(took.get(m, 90.0) * (1.3 if g > 1 else 1.0) for _, _, m in wave)
            if time.time() - start + est > a.budget:
                res["not_run"] += [key(*j) + " (time budget)" for j in wave]
                continue
            procs = []
            for i, (gg, p, m) in enumerate(wave):
                ids = ",".join(str(i * g + k) for k in range(g))
                args = [sys.executable, os.path.join(HERE, "model_step.py"), "--model", a.model, "--modes", m,
                        "--gpus", str(g), "--parallel", "ddp" if p == "single" else p, "--micro-batch", str(a.micro_batch),
                        "--seq", str(a.seq), "--grad-accum", str(a.grad_accum), "--steps", str(a.steps), "--warmup", str(a.warmup), "--lr", repr(a.lr),
                        "--timeout", str(a.timeout), "--tag", key(gg, p, m), "--out", scratch]
                log = open(os.path.join(scratch, key(gg, p, m) + ".log"), "w")
                procs.append(((gg, p, m), subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                            env=dict(os.environ, CUDA_VISIBLE_DEVICES=ids)), time.time(), ids))
            for (gg, p, m), proc, t0, ids in procs:
                proc.wait()
                took[m] = time.time() - t0
                path = os.path.join(scratch, f"model_step-{key(gg, p, m)}.json")
                try:
                    r = json.load(open(path))["modes"][0]
                except (OSError, ValueError, IndexError, KeyError):
                    r = {"mode": m, "error": f"no result (exit {proc.returncode}; log {key(gg, p, m)}.log)"}
                r.update(gpus=gg, parallel=p, gpu_ids=ids, beside=len(procs) - 1, wall_s=took[m])
                res["runs"].append(r)
                print(f"{key(gg, p, m)} on GPUs {ids}: {took[m]:.0f} s; "
                      + (r.get("error") or f"{tokens_per_s(r, res) / 1e3:.1f} k tokens/s, peak {r['peak_gib']:.2f} GiB"),
                      file=sys.stderr, flush=True)
                save()
    save()
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
