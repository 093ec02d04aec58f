#!/usr/bin/env python3
"""Summarise lab/ab/ab_commits.sh's runs: per benchmark point, the median of each side's runs and
NEW / OLD, as a Markdown table (and JSON with --json).

usage: lab/ab/ab_summary.py DIR [--json OUT.json] [--m 16384]

DIR holds r<round>.<run>-<infer|train>-<old|new>-<name>.json (twell_bench_cuda --json). Points are matched
by (mode, gated, M, target density). Inference compares the dispatched layer (auto_total_ms), the
forced sparse path (sparse_total_ms) and cuBLASLt's dense FFN (dense_ms, the control: the same
library code on both sides, so its ratio shows the run's noise); training likewise with the step
(auto_step_ms, sparse_step_ms, dense_step_ms).
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

KEYS = {"infer": ("points", ["auto_total_ms", "sparse_total_ms", "dense_ms"]),
        "train": ("train_points", ["auto_step_ms", "sparse_step_ms", "dense_step_ms"])}
NAME = re.compile(r"r(\d+)(?:\.\d+)?-(infer|train)-(old|new)-(.+)\.json$")


def load(folder):
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "r*-*.json"))):
        m = NAME.search(os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            runs.append((int(m.group(1)), m.group(2), m.group(3), m.group(4), json.load(f)))
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--json", help="write the table's values here")
    ap.add_argument("--m", type=int, default=0, help="only points of this M (0: all)")
    a = ap.parse_args()
    runs = load(a.dir)
    if not runs:
        sys.exit(f"ab_summary: no r*-{{infer,train}}-{{old,new}}-NAME.json in {a.dir}")
    names = {side: sorted({r[3] for r in runs if r[2] == side}) for side in ("old", "new")}
    devices = sorted({r[4].get("device", "?") for r in runs})
    vals = {}  # (part, point key, metric) -> side -> [values]
    for _, part, side, _, d in runs:
        field, metrics = KEYS[part]
        for p in d.get(field, []):
            if a.m and p["m"] != a.m:
                continue
            key = (p["mode"], bool(p["gated"]), p["m"], p["target_density"])
            for k in metrics:
                if p.get(k) is not None:
                    vals.setdefault((part, key, k), {}).setdefault(side, []).append(float(p[k]))
    print(f"old {', '.join(names['old'])} against new {', '.join(names['new'])}; device(s): {'; '.join(devices)}")
    print(f"runs: {len(runs)} ({sum(r[2] == 'old' for r in runs)} old, {sum(r[2] == 'new' for r in runs)} new)\n")
    print("| part | mode | gated | M | density | metric | old ms (median, n) | new ms (median, n) | new / old |")
    print("|---|---|---|---:|---:|---|---:|---:|---:|")
    rows = []
    for (part, key, k), sides in sorted(vals.items(), key=lambda t: (t[0][0], t[0][1][2], t[0][1][0], t[0][1][3], t[0][2])):
        if "old" not in sides or "new" not in sides:
            continue
        o, n = statistics.median(sides["old"]), statistics.median(sides["new"])
        rows.append({"part": part, "mode": key[0], "gated": key[1], "m": key[2], "density": key[3], "metric": k,
                     "old_ms": o, "new_ms": n, "old_n": len(sides["old"]), "new_n": len(sides["new"]),
                     "ratio": n / o if o > 0 else None})
        r = rows[-1]
        print(f"| {part} | {key[0]} | {'yes' if key[1] else 'no'} | {key[2]} | {key[3] * 100:g} % | {k} | "
              f"{o:.4f} ({len(sides['old'])}) | {n:.4f} ({len(sides['new'])}) | {r['ratio']:.3f} |")
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump({"old": names["old"], "new": names["new"], "devices": devices, "rows": rows}, f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
