#!/usr/bin/env python3
"""Sums an ncu CSV of twell_probe_decode (one decode step per FFN path) or twell_probe_prefill (one
prefill per FFN path) kernel by kernel.

    ncu --profile-from-start off --clock-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv twell_probe_decode 2b > ncu.csv
    python3 lab/profiles/decode_profile.py ncu.csv [--md OUT.md]

The profiled launches split into steps at each argmax kernel (the last kernel of a decode step):
the first step is the dense FFN path's, the second the automatic path's. Per step and kernel name:
launches, summed kernel time (µs), DRAM bytes read and the rate they were read at. ncu serialises
the kernels, so the sum is kernel time alone, without the gaps between launches. --gemm-grids keeps
cuBLASLt's GEMMs apart by grid size (one row per projection shape: QKV, O, gate/up, down, LM head).
"""
import argparse
import csv
import io
import re
import sys
from collections import OrderedDict


def short(name: str) -> str:
    name = re.sub(r"\(.*$", "", name)  # drop the argument list
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"twell::cuda::(ops::)?(\(anonymous namespace\)::)?", "", name)
    if "cutlass" in name or "sm90_xmma" in name or name.startswith("nvjet") or "gemm" in name.lower():
        return "cuBLASLt GEMM" if "twell" not in name else name
    return name[:60]


def read(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"decode_profile: no ncu CSV header in {path}")
    launches = OrderedDict()
    for row in csv.DictReader(io.StringIO(text[start:])):
        k = launches.setdefault(row["ID"], {"name": row["Kernel Name"], "grid": row.get("Grid Size", "")})
        v = row["Metric Value"].replace(",", "")
        try:
            val = float(v)
        except ValueError:
            continue
        unit = row["Metric Unit"]
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "byte": 1.0,
                 "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit)
        if scale is None:
            sys.exit(f"decode_profile: unknown unit {unit!r} of {row['Metric Name']}")
        k[row["Metric Name"]] = val * scale
    return list(launches.values())


def split_steps(launches):
    steps, cur = [], []
    for k in launches:
        cur.append(k)
        if "argmax" in k["name"]:
            steps.append(cur)
            cur = []
    if cur:
        steps.append(cur)
    return steps


def table(step, title, gemm_grids=False):
    agg = OrderedDict()
    for k in step:
        name = short(k["name"])
        if gemm_grids and name == "cuBLASLt GEMM":
            name += f" grid {k['grid']}"
        a = agg.setdefault(name, [0, 0.0, 0.0])
        a[0] += 1
        a[1] += k.get("gpu__time_duration.sum", 0.0)
        a[2] += k.get("dram__bytes_read.sum", 0.0)
    total_t = sum(a[1] for a in agg.values())
    total_b = sum(a[2] for a in agg.values())
    lines = [f"### {title}: {len(step)} kernels, {total_t:.0f} µs of kernel time, {total_b / 1e6:.0f} MB read",
             "", "| kernel | launches | µs | share | MB read | GB/s |", "|---|---:|---:|---:|---:|---:|"]
    for name, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        rate = b / (t * 1e-6) / 1e9 if t > 0 else 0
        lines.append(f"| `{name}` | {n} | {t:.1f} | {100 * t / max(total_t, 1e-9):.1f} % | {b / 1e6:.1f} | {rate:.0f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--md", help="also write the tables here")
    ap.add_argument("--gemm-grids", action="store_true", help="a row per GEMM grid size (projection shape)")
    a = ap.parse_args()
    steps = split_steps(read(a.csv))
    titles = ["dense FFN path", "automatic (sparse) path"]
    out = "\n".join(table(s, titles[i] if i < len(titles) else f"step {i}", a.gemm_grids) for i, s in enumerate(steps))
    print(out)
    if a.md:
        with open(a.md, "w", encoding="utf-8") as f:
            f.write(out)


if __name__ == "__main__":
    main()
