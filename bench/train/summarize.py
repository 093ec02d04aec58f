#!/usr/bin/env python3
"""Compare twell.train runs from their telemetry: a table (Markdown) and the numbers (JSON).

    python3 bench/train/summarize.py NAME=TELEMETRY.jsonl [NAME=TELEMETRY.jsonl ...] --out DIR [--title T]

The first run is the baseline of the relative columns. Per run: steps, tokens/s (median over the
last quarter, when sparsity has settled), peak memory (PyTorch's allocator plus twell's contexts),
training loss (mean of the last 100 steps), the last validation loss and its ratio to the
baseline's, mean FFN density and the sparsity (1 − density) at the end, dead neurons.
Writes DIR/train.md and DIR/train.json.
"""
import argparse
import json
import os
import statistics


def read(path):
    import lzma
    with (lzma.open(path, "rt") if path.endswith(".xz") else open(path)) as f:  # results are kept xz'd
        return [json.loads(line) for line in f if line.strip()]


def summary(recs):
    tail = recs[len(recs) * 3 // 4:]
    vals = [r for r in recs if "val_loss" in r]
    last = recs[-1]
    return {
        "steps": last["step"],
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in tail),
        "peak_memory_gib": max(r.get("peak_memory_gib", 0.0) for r in tail),
        "train_loss": statistics.mean(r["loss"] for r in recs[-100:]),
        "val_loss": vals[-1]["val_loss"] if vals else None,
        "val_curve": [(r["step"], r["val_loss"]) for r in vals],
        "density": statistics.mean(last["density"]),
        "density_per_layer": last["density"],
        "dead": sum(last["dead"]),
        "l1": last["l1"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="NAME=TELEMETRY.jsonl, the baseline first")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="twell.train runs")
    a = ap.parse_args()
    res = {"commit": os.environ.get("TWELL_COMMIT", ""), "gpu": os.environ.get("TWELL_GPU", ""), "runs": {}}
    for spec in a.runs:
        name, path = spec.split("=", 1)
        res["runs"][name] = summary(read(path))
    names = list(res["runs"])
    base = res["runs"][names[0]]
    lines = [f"# {a.title} ({res['gpu']}, commit {res['commit']})", "",
             "| run | steps | tokens/s | × baseline | peak GiB | train loss | val loss | val / baseline | density | sparsity | dead |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in names:
        r = res["runs"][n]
        vr = r["val_loss"] / base["val_loss"] if r["val_loss"] and base["val_loss"] else None
        r["val_vs_baseline"] = vr
        r["speed_vs_baseline"] = r["tokens_per_s"] / base["tokens_per_s"]
        val = "—" if r["val_loss"] is None else f"{r['val_loss']:.3f}"
        ratio = "—" if vr is None else f"{vr:.3f}"
        lines.append(f"| {n} | {r['steps']} | {r['tokens_per_s']:.0f} | {r['speed_vs_baseline']:.2f} | "
                     f"{r['peak_memory_gib']:.2f} | {r['train_loss']:.3f} | {val} | {ratio} | "
                     f"{100 * r['density']:.2f} % | {100 * (1 - r['density']):.2f} % | {r['dead']} |")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(a.out, "train.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
