"""Plots of a training run's telemetry (PNG): `python -m twell.plot RUN_DIR [RUN_DIR ...]`.

Reads each RUN_DIR/telemetry.jsonl (or telemetry.jsonl.xz, as results are kept) of twell.train and
writes into the first RUN_DIR (or --out):
  loss.png      training loss (and validation loss where measured) against the step, one line a run;
  sparsity.png  non-zeros per token per layer and the mean, against the step (log scale);
  dead.png      dead neurons per layer (silent for the run's dead_window tokens) and re-initialised ones;
  position.png  non-zeros per token by position in the sequence (runs with position_profile_every),
                the first profile dotted, the last solid.
Several runs on one figure compare them (e.g. dense ReLU against ReLU + L1).
--eval EVAL.json (bench/train/eval_checkpoints.py's output) adds
  val-eval.png  each checkpoint's validation loss, one line a run, and below it each run's ratio to
                the first run's at the same step.
--stats STATS.json (`twell stats --model DIR --text FILE --json STATS.json`) draws, without run
directories, into --out (default: beside the JSON):
  stats.png     a model's active FFN neurons on text: per layer (mean, dead and hot neurons), by
                position in the sequence (mean over layers), and per layer and token (a heat map).
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def read(run: str) -> list[dict]:
    import lzma

    path = os.path.join(run, "telemetry.jsonl")
    if not os.path.exists(path) and os.path.exists(path + ".xz"):
        path += ".xz"
    if not os.path.exists(path):
        raise FileNotFoundError(f"{run}: no telemetry.jsonl (not a twell.train run directory)")
    with (lzma.open(path, "rt") if path.endswith(".xz") else open(path)) as f:
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


def plot_eval(eval_json: str, out: str) -> str:
    """val-eval.png from eval_checkpoints.py's JSON: {"runs": {name: {step: loss}}, "data": …}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(eval_json) as f:
        d = json.load(f)
    runs = {name: sorted((int(s), v) for s, v in losses.items() if s.isdigit())
            for name, losses in d.get("runs", {}).items()}
    runs = {name: pts for name, pts in runs.items() if pts}
    if not runs:
        raise ValueError(f"{eval_json}: no run with checkpoint losses")
    base_name, base = next(iter(runs.items()))
    base = dict(base)
    os.makedirs(out, exist_ok=True)
    fig, (ax, rx) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(2, 1))
    for name, pts in runs.items():
        ax.plot(*zip(*pts), "o-", ms=3, label=name)
        ratio = [(s, v / base[s]) for s, v in pts if s in base and name != base_name]
        if ratio:
            rx.plot(*zip(*ratio), "o-", ms=3, label=f"{name} / {base_name}")
    ax.set(ylabel="validation loss", title=f"every checkpoint on {d.get('batches', '?')} batches of {d.get('data', '?')}")
    ax.legend()
    if len(runs) > 1:
        rx.axhline(1.02, color="grey", ls=":", lw=1, label="+2 %")
        rx.legend()
    rx.set(xlabel="step", ylabel=f"ratio to {base_name}")
    return _save(fig, out, "val-eval.png")


def plot_stats(stats_json: str, out: str) -> str:
    """stats.png from `twell stats --model … --json` output (see the module's docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    with open(stats_json) as f:
        j = json.load(f)
    for key in ("active", "position", "per_layer", "neurons"):
        if key not in j:
            raise ValueError(f"{stats_json}: no '{key}' (not `twell stats --model --json` output)")
    act = np.asarray(j["active"], dtype=float)  # [layers, tokens]
    n = float(j["neurons"])
    layers = np.arange(act.shape[0])
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6), gridspec_kw={"width_ratios": [1, 1, 1.6]})
    ax = axes[0]
    ax.bar(layers, 100 * act.mean(axis=1) / n, color="#1f77b4", label="active per token")
    ax.plot(layers, [100 * r["dead"] / n for r in j["per_layer"]], "k.-", label="dead (never active)")
    if all("hot_50pct" in r for r in j["per_layer"]):
        ax.plot(layers, [100 * r["hot_50pct"] / n for r in j["per_layer"]], "r.-", label="hot (≥ 50 % of tokens)")
    ax.set_xlabel("layer")
    ax.set_ylabel(f"% of the {int(n)} neurons")
    ax.set_title("per layer")
    ax.legend(fontsize=8)
    ax = axes[1]
    pos = np.asarray(j["position"])
    mean_tok = act.mean(axis=0)
    top = int(pos.max()) + 1
    by_pos = np.array([mean_tok[pos == p].mean() if np.any(pos == p) else np.nan for p in range(top)])
    ax.plot(np.arange(top), 100 * by_pos / n, lw=0.8)
    ax.set_xscale("symlog", linthresh=8)
    ax.set_xlabel("position in the sequence")
    ax.set_ylabel("% active (mean over layers)")
    ax.set_title("by position")
    ax = axes[2]
    shown = act[:, :512]
    im = ax.imshow(100 * shown / n, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel(f"token (first {shown.shape[1]} of {act.shape[1]})")
    ax.set_ylabel("layer")
    ax.set_title("per layer and token")
    fig.colorbar(im, ax=ax, label="% active")
    fig.suptitle(f"{j.get('model', '?')} ({j.get('activation', '?')}) on {act.shape[1]} tokens of {j.get('text', '?')}",
                 fontsize=10)
    return _save(fig, out, "stats.png")


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
    ap.add_argument("runs", nargs="*", help="twell.train run directories")
    ap.add_argument("--out", help="where the PNGs go (default: the first run directory, or beside --stats)")
    ap.add_argument("--eval", help="bench/train/eval_checkpoints.py's JSON: adds val-eval.png")
    ap.add_argument("--stats", help="`twell stats --model … --json` output: draws stats.png")
    a = ap.parse_args(argv)
    if not a.runs and not a.stats:
        ap.error("give run directories, or --stats STATS.json")
    try:
        if a.stats:
            out = a.out or os.path.dirname(os.path.abspath(a.stats))
            os.makedirs(out, exist_ok=True)
            print(plot_stats(a.stats, out))
        if a.runs:
            for p in plot(a.runs, a.out or a.runs[0]):
                print(p)
        if a.eval:
            print(plot_eval(a.eval, a.out or a.runs[0]))
    except (FileNotFoundError, ValueError) as e:
        print(f"twell.plot: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
