#!/usr/bin/env python3
"""Summarise lab/ab/ab_model.sh's runs: per (phase, batch) row of `twell bench model`, the median
tokens/s of each side's runs, dense and sparse FFN, and NEW / OLD, as a Markdown table.

usage: lab/ab/ab_model_summary.py DIR [--json OUT.json]

DIR holds r<round>.<run>-<old|new>-<name>.json (twell bench model --json). Both FFN paths run the
same attention, norms and LM head, so a change to those moves both columns alike; a change to the
FFN moves the sparse one.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

NAME = re.compile(r"r(\d+)\.\d+-(old|new)-(.+)\.json$")


def load(folder):
    """{(phase, batch): {side: {"dense": [...], "sparse": [...]}}}, and {side: name}."""
    rows, names = {}, {}
    for path in sorted(glob.glob(os.path.join(folder, "r*-*.json"))):
        m = NAME.search(os.path.basename(path))
        if not m:
            continue
        side, name = m.group(2), m.group(3)
        names[side] = name
        try:
            res = json.load(open(path))
        except (OSError, ValueError) as e:
            print(f"ab_model_summary: {path}: {e}", file=sys.stderr)
            continue
        for r in res.get("rows", []):
            cell = rows.setdefault((r["phase"], r["batch"]), {}).setdefault(side, {"dense": [], "sparse": []})
            cell["dense"].append(r["dense_tokens_per_s"])
            cell["sparse"].append(r["sparse_tokens_per_s"])
    return rows, names


def table(rows, names):
    old, new = names.get("old", "old"), names.get("new", "new")
    lines = [f"| phase | batch | runs (old, new) | dense tokens/s {old} | {new} | new / old | "
             f"sparse tokens/s {old} | {new} | new / old | sparse / dense {old} | {new} |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out = []
    for (phase, batch), sides in sorted(rows.items()):
        if "old" not in sides or "new" not in sides:
            continue
        med = {s: {k: statistics.median(v) for k, v in sides[s].items()} for s in ("old", "new")}
        o, n = med["old"], med["new"]
        out.append({"phase": phase, "batch": batch, "old": o, "new": n,
                    "dense_new_over_old": n["dense"] / o["dense"], "sparse_new_over_old": n["sparse"] / o["sparse"]})
        lines.append(f"| {phase} | {batch} | {len(sides['old']['dense'])}, {len(sides['new']['dense'])} | "
                     f"{o['dense']:.0f} | {n['dense']:.0f} | {n['dense'] / o['dense']:.3f}× | "
                     f"{o['sparse']:.0f} | {n['sparse']:.0f} | {n['sparse'] / o['sparse']:.3f}× | "
                     f"{o['sparse'] / o['dense']:.3f}× | {n['sparse'] / n['dense']:.3f}× |")
    return "\n".join(lines), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows, names = load(a.dir)
    md, out = table(rows, names)
    if not out:
        print(f"ab_model_summary: no row with runs on both sides in {a.dir}", file=sys.stderr)
        return 1
    print(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"names": names, "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
