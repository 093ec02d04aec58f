#!/usr/bin/env python3
"""Compares bench_serve.py results of several servers on one workload: a table and a plot.

    python3 bench/serve/compare.py RESULT.json [RESULT.json ...] --md out.md [--png out.png] [--title T]

The first result is the reference of the ratio columns (e.g. twell sparse first, then twell dense and
the PyTorch server). Per concurrency point: output tokens/s, TTFT and TPOT medians, ITL p99, and the
reference's output throughput over each other server's. Results must share prompt and output lengths
(refused otherwise: their numbers would not compare). The plot shows output throughput and TPOT
against concurrency, one line per server.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--md", required=True)
    ap.add_argument("--png")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    runs = [json.load(open(p)) for p in a.results]
    shape = {(r["prompt_len"], r["max_tokens"]) for r in runs}
    if len(shape) != 1:
        sys.exit(f"compare: the results differ in prompt/output lengths {sorted(shape)}: not one workload")
    labels = [r.get("label") or f"run{i}" for i, r in enumerate(runs)]
    conc = sorted({p["concurrency"] for r in runs for p in r["points"]})

    def point(r, c):
        ps = [p for p in r["points"] if p["concurrency"] == c and p["rate"] is None]
        return ps[0] if ps else None

    pl, mt = shape.pop()
    lines = [f"# Serving: {a.title or runs[0]['model']} — prompts {pl} tokens, {mt} out, all requests at once\n",
             "Each cell: output tokens/s · TTFT median ms · TPOT median ms · ITL p99 ms. "
             f"Ratios: {labels[0]}'s output throughput over the other server's, and the other's TPOT median over "
             f"{labels[0]}'s (its per-token speed-up, which a slow first request does not move).\n",
             "| concurrency | " + " | ".join(labels) + " | " + " | ".join(f"{labels[0]} / {l}" for l in labels[1:]) + " |",
             "|---:|" + "---|" * len(labels) + "---:|" * (len(labels) - 1)]
    for c in conc:
        cells, ratios = [], []
        ref = point(runs[0], c)
        for r in runs:
            p = point(r, c)
            if p is None or not p["completed"]:
                cells.append("—")
                continue
            bad = f" ({p['failed']} failed)" if p["failed"] else ""
            cells.append(f"{p['output_throughput']:.0f} · {1e3 * p['ttft_s']['median']:.0f} · "
                         f"{1e3 * p['tpot_s']['median']:.2f} · {1e3 * p['itl_s']['p99']:.1f}{bad}")
        for r in runs[1:]:
            p = point(r, c)
            ok = ref and p and ref["completed"] and p["completed"]
            ratios.append(f"{ref['output_throughput'] / p['output_throughput']:.2f}× · "
                          f"{p['tpot_s']['median'] / ref['tpot_s']['median']:.2f}×" if ok else "—")
        lines.append(f"| {c} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    with open(a.md, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if a.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        for r, l in zip(runs, labels):
            ps = [point(r, c) for c in conc]
            xs = [c for c, p in zip(conc, ps) if p and p["completed"]]
            ps = [p for p in ps if p and p["completed"]]
            ax1.plot(xs, [p["output_throughput"] for p in ps], marker="o", label=l)
            ax2.plot(xs, [1e3 * p["tpot_s"]["median"] for p in ps], marker="o", label=l)
        for ax, y in ((ax1, "output tokens/s"), (ax2, "TPOT median (ms)")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(conc, [str(c) for c in conc])
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel(y)
            ax.grid(alpha=0.3)
        ax1.legend()
        fig.suptitle(f"{a.title or runs[0]['model']}: prompts {pl}, {mt} out")
        fig.tight_layout()
        fig.savefig(a.png, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
