"""Plots of a training run's telemetry (PNG): `python -m twell.plot RUN_DIR [RUN_DIR ...]`.

Reads each RUN_DIR/telemetry.jsonl (twell.train) and writes into the first RUN_DIR (or --out):
  loss.png      training loss (and validation loss where measured) against the step, one line a run;
  sparsity.png  non-zeros per token per layer and the mean, against the step (log scale);
  dead.png      dead neurons per layer (silent for the run's dead_window tokens) and re-initialised ones;
  position.png  non-zeros per token by position in the sequence (runs with position_profile_every),
                the first profile dotted, the last solid.
Several runs on one figure compare them (e.g. dense ReLU against ReLU + L1).
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def read(run: str) -> list[dict]:
    path = os.path.join(run, "telemetry.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{run}: no telemetry.jsonl (not a twell.train run directory)")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise ValueError(f"{path} is empty")
    return rows


def plot(runs: list[str], out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {os.path.basename(os.path.normpath(r)) or r: read(r) for r in runs}
    os.makedirs(out, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in data.items():
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=f"{name} train")
        val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
        if val:
            ax.plot(*zip(*val), "o--", label=f"{name} validation")
    ax.set(xlabel="step", ylabel="cross-entropy", title="loss")
    ax.legend()
    written.append(_save(fig, out, "loss.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in data.items():
        steps = [r["step"] for r in rows]
        layers = len(rows[0]["nnz_per_token"])
        for i in range(layers):
            ax.plot(steps, [r["nnz_per_token"][i] for r in rows], lw=0.8, alpha=0.5)
        ax.plot(steps, [sum(r["nnz_per_token"]) / layers for r in rows], lw=2.2, label=f"{name} mean of {layers} layers")
    ax.set(xlabel="step", ylabel="non-zeros per token", yscale="log", title="FFN activations per token (thin: each layer)")
    ax.legend()
    written.append(_save(fig, out, "sparsity.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in data.items():
        steps = [r["step"] for r in rows]
        ax.plot(steps, [sum(r["dead"]) for r in rows], label=f"{name} dead (all layers)")
        if any(sum(r["reinit"]) for r in rows):
            total, acc = [], 0
            for r in rows:
                acc += sum(r["reinit"])
                total.append(acc)
            ax.plot(steps, total, "--", label=f"{name} re-initialised (cumulative)")
    ax.set(xlabel="step", ylabel="neurons", title="dead and re-initialised neurons")
    ax.legend()
    written.append(_save(fig, out, "dead.png"))

    profiled = {name: [r for r in rows if "nnz_by_position" in r] for name, rows in data.items()}
    if any(profiled.values()):  # runs with position_profile_every > 0
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, rows in profiled.items():
            if not rows:
                continue
            for r, style in ((rows[0], ":"), (rows[-1], "-")) if len(rows) > 1 else ((rows[-1], "-"),):
                ax.plot(range(len(r["nnz_by_position"])), r["nnz_by_position"], style, label=f"{name} step {r['step']}")
        ax.set(xlabel="position in the sequence", ylabel="non-zeros per token (mean of the layers)", yscale="log",
               title="FFN activations by position")
        ax.legend()
        written.append(_save(fig, out, "position.png"))
    return written


def _save(fig, out: str, name: str) -> str:
    import matplotlib.pyplot as plt

    path = os.path.join(out, name)
    tmp = os.path.join(out, f".{name}.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m twell.plot", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="twell.train run directories")
    ap.add_argument("--out", help="where the PNGs go (default: the first run directory)")
    a = ap.parse_args(argv)
    try:
        for p in plot(a.runs, a.out or a.runs[0]):
            print(p)
    except (FileNotFoundError, ValueError) as e:
        print(f"twell.plot: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
