#!/usr/bin/env python3
"""Issue 59's decode picture from yardstick runs (bench/model/gpu_decode_yardstick.sh): per model,
tokens/s against the batch for PyTorch's best dense step, twell dense and twell sparse, each from the
same call's torch.json and twell.json; and beside it twell's sparse / dense against the byte ceiling
(dense bytes / sparse bytes a step, twell.json's decode_byte_floor) and 0.9 × that ceiling, the
issue's target. Runs of several calls (one batch or two a call) are merged by batch; every point is
labelled with its run's tag, so a reader sees which commit each comes from.

    python3 bench/model/yardstick_plot.py OUT.png MODEL=DIR[@TAG] [MODEL=DIR[@TAG] ...]

DIR holds torch.json and twell.json; TAG (default: the part of DIR's name after its last '-', the
commit in the results' naming) labels its points. A later run's batch replaces an earlier one's.
Needs matplotlib.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from yardstick_table import load, pytorch_decode, twell_decode  # noqa: E402


def run_points(path):
    """{batch: {pytorch, dense, sparse, ceiling}} of one yardstick call (None where a side is missing)."""
    t, w = load(os.path.join(path, "torch.json")), load(os.path.join(path, "twell.json"))
    torch_rows, twell_rows = pytorch_decode(t), twell_decode(w)
    floors = {int(f["batch"]): f for f in (w or {}).get("decode_byte_floor", []) if "batch" in f}
    out = {}
    for b in sorted(set(torch_rows) | set(twell_rows)):
        dense, sparse = twell_rows.get(b, (None, None))
        f = floors.get(b, {})
        ceiling = f.get("ceiling_ratio")
        if ceiling is None and f.get("dense_bytes_per_step") and f.get("sparse_bytes_per_step"):
            ceiling = f["dense_bytes_per_step"] / f["sparse_bytes_per_step"]
        best = max((v for _, v in torch_rows.get(b, [])), default=None)
        out[b] = {"pytorch": best, "dense": dense, "sparse": sparse, "ceiling": ceiling}
    return out


def parse(args):
    """{model: {batch: point + tag}} in argument order (a later run's batch replaces an earlier one's)."""
    models = {}
    for a in args:
        if "=" not in a:
            raise SystemExit(f"yardstick_plot: '{a}' is not MODEL=DIR[@TAG]")
        model, rest = a.split("=", 1)
        path, _, tag = rest.partition("@")
        path = path.rstrip("/")
        if not os.path.isdir(path):
            raise SystemExit(f"yardstick_plot: {path}: not a directory")
        tag = tag or os.path.basename(os.path.dirname(path) if os.path.basename(path).lower() == model.lower() else path).rsplit("-", 1)[-1]
        points = run_points(path)
        if not points:
            raise SystemExit(f"yardstick_plot: {path}: no decode rows in torch.json or twell.json")
        for b, p in points.items():
            models.setdefault(model, {})[b] = dict(p, tag=tag)
    return models


def frame(ax, batches, ylabel, title):
    """A panel's axes: the batches on a log-2 axis, labels, grid and legend."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("decode batch (sequences a step)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def plot(models, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4.2 * len(models)), squeeze=False)
    for row, (model, pts) in enumerate(models.items()):
        batches = sorted(pts)
        ax = axes[row][0]
        for key, label, style in (("pytorch", "PyTorch (torch.compile + CUDA graph)", "s--"),
                                  ("dense", "twell dense", "o-"), ("sparse", "twell sparse", "^-")):
            xs = [b for b in batches if pts[b][key]]
            ax.plot(xs, [pts[b][key] for b in xs], style, label=label)
        for b in batches:
            top = max(v for v in (pts[b]["pytorch"], pts[b]["dense"], pts[b]["sparse"]) if v) if any(
                pts[b][k] for k in ("pytorch", "dense", "sparse")) else None
            if top:
                ax.annotate(pts[b]["tag"], (b, top), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ax.margins(y=0.12)
        frame(ax, batches, "tokens/s", f"{model}: decode throughput, each batch's run in one process")
        ax = axes[row][1]
        xs = [b for b in batches if pts[b]["dense"] and pts[b]["sparse"]]
        ax.plot(xs, [pts[b]["sparse"] / pts[b]["dense"] for b in xs], "^-", label="twell sparse / dense, measured")
        xc = [b for b in batches if pts[b]["ceiling"]]
        ax.plot(xc, [pts[b]["ceiling"] for b in xc], "k:", label="byte ceiling (dense / sparse bytes)")
        ax.plot(xc, [0.9 * pts[b]["ceiling"] for b in xc], "r--", label="0.9 × ceiling (issue 59's target)")
        ax.axhline(1.0, color="gray", lw=0.8)
        frame(ax, batches, "speed ratio", f"{model}: the sparse gain against what its bytes allow")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    models = parse(argv[2:])
    plot(models, argv[1])
    for model, pts in models.items():
        for b in sorted(pts):
            p = pts[b]
            cells = [f"{k} {p[k]:.0f}" if p[k] else f"{k} —" for k in ("pytorch", "dense", "sparse")]
            ceil = f", ceiling {p['ceiling']:.2f}" if p["ceiling"] else ""
            print(f"{model} batch {b} ({p['tag']}): " + ", ".join(cells) + ceil)
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
