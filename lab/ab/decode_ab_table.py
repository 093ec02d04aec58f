#!/usr/bin/env python3
"""The table of lab/ab/gpu_decode_ab.sh's runs: each run's dense and sparse decode tokens/s per
batch, then each build's medians over its rounds, its sparse spread (lowest to highest, to judge a
difference by) and sparse / the first build's, as Markdown.

usage: lab/ab/decode_ab_table.py OUT.md ROWS.txt [ROWS.txt ...]

Each ROWS.txt line is NAME|ROUND|JSON (a `twell bench model --json` file; a relative path is
taken from the ROWS file's folder). Several ROWS files make one table: the rounds of one A/B run in
two device calls (a call's 600 s hold about eight 2B runs), the second with FIRST_ROUND=2 and
PREVIOUS=the first call's OUT on the same warm machine. The first build named is the reference.
"""
import json
import os
import statistics
import sys


def read_rows(paths):
    """[(name, round, json path)] in file order, and the builds' names in first-seen order."""
    rows, names = [], []
    for rows_file in paths:
        folder = os.path.dirname(os.path.abspath(rows_file))
        with open(rows_file, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                name, rnd, path = line.split("|")
                if name not in names:
                    names.append(name)
                rows.append((name, int(rnd), path if os.path.isabs(path) else os.path.join(folder, path)))
    return rows, names


def runs_of(rows):
    """[(name, round, batch, dense, sparse, sparse-path share)] from the decode rows of each JSON."""
    runs = []
    for name, rnd, path in rows:
        try:
            with open(path, encoding="utf-8") as f:
                j = json.load(f)
        except (OSError, ValueError) as e:
            print(f"{path}: {e}")
            continue
        for r in j.get("rows", []):
            if r.get("phase") == "decode":
                p = r.get("sparse_runtime_path", {})
                share = f'{100 * p["sparse_rows"] / p["ffn_rows"]:.1f} %' if p.get("ffn_rows") else "n/a"
                runs.append((name, rnd, r["batch"], r["dense_tokens_per_s"], r["sparse_tokens_per_s"], share))
    return runs


def table(runs, names):
    lines = ["| build | round | decode batch | dense tokens/s | sparse tokens/s | sparse / dense | sparse runtime's FFN rows on the sparse path |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, rnd, b, d, s, share in sorted(runs, key=lambda r: (r[1], names.index(r[0]), r[2])):
        lines.append(f"| {name} | {rnd} | {b} | {d:.0f} | {s:.0f} | {s / d:.3f}× | {share} |")
    lines += ["", "Medians over the rounds (and each build's sparse spread, lowest to highest, to judge a difference by):", "",
              "| build | decode batch | dense | sparse | sparse spread | sparse / dense | sparse / first build's |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    base = {}
    for name in names:
        for b in sorted({r[2] for r in runs}):
            mine = [r for r in runs if r[0] == name and r[2] == b]
            if not mine:
                continue
            d = statistics.median(r[3] for r in mine)
            s = statistics.median(r[4] for r in mine)
            base.setdefault(b, s)
            lo, hi = min(r[4] for r in mine), max(r[4] for r in mine)
            lines.append(f"| {name} | {b} | {d:.0f} | {s:.0f} | {lo:.0f}–{hi:.0f} | {s / d:.3f}× | {s / base[b]:.3f}× |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        sys.exit(__doc__.strip().splitlines()[3])
    rows, names = read_rows(argv[1:])
    runs = runs_of(rows)
    if not runs:
        sys.exit("decode_ab_table: no decode rows in " + ", ".join(argv[1:]))
    md = table(runs, names)
    with open(argv[0], "w", encoding="utf-8") as f:
        f.write(md)
    print(md, end="")


if __name__ == "__main__":
    main()
