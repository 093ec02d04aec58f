"""Two builds' decode timelines side by side (twell_probe_timeline's reports, as
lab/profiles/gpu_decode_timeline.sh writes them): per FFN path, the step span and each link (how
long a kernel ends after the kernel before it ends, median) of build A, of build B and B − A, the
links ordered by their µs a step in A; and, where the reports have it, how often a step changes
the SMs' shared-memory split. Read before an A/B: a change that moves no link of its own
kernel, or moves the step span the wrong way, need not be A/B'd.

    python3 lab/profiles/timeline_pair.py A.md B.md [--names A,B] > pair.md

A and B come from one call (a pair across calls differs by the machine's drift: session 76). Links
that one report has and the other lacks are listed with "—" on the missing side.
"""
import argparse
import re
import sys

SECTION = re.compile(r"^## (.+?): \d+ steps traced")
SPAN = re.compile(r"^step span \(first start to argmax end\) ([0-9.]+) us median")
LINK = re.compile(r"^\| `(.+?)` \| `(.+?)` \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$")
CHANGES = re.compile(r"^configuration changes between consecutive kernels: ([0-9.]+) a step")


def read(path):
    """{path name: {"span": µs, "links": {(after, ends): (times a step, µs median, µs a step)}}}."""
    paths, cur, in_links = {}, None, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            m = SECTION.match(line)
            if m:
                cur = paths.setdefault(m.group(1), {"span": None, "links": {}, "changes": None})
                in_links = False
                continue
            if line.startswith("### ") or line.startswith("#### "):
                cur, in_links = None, False  # the phase-stamp tables that may follow are not links
                continue
            if cur is None:
                continue
            m = SPAN.match(line)
            if m:
                cur["span"] = float(m.group(1))
            elif CHANGES.match(line):
                cur["changes"] = float(CHANGES.match(line).group(1))
            elif line.startswith("links:"):
                in_links = True
            elif in_links and line.startswith("kernels "):
                in_links = False
            elif in_links:
                m = LINK.match(line)
                if m:
                    cur["links"][(m.group(1), m.group(2))] = tuple(float(m.group(i)) for i in (3, 4, 5))
    if not paths:
        sys.exit(f"timeline_pair: {path} holds no '## … steps traced' section (not a twell_probe_timeline report?)")
    return paths


def fmt(v, digits=2):
    return "—" if v is None else f"{v:.{digits}f}"


def table(a, b, names):
    na, nb = names
    out = []
    for path in list(a) + [p for p in b if p not in a]:
        pa, pb = a.get(path), b.get(path)
        out.append(f"### {path}\n")
        sa, sb = pa and pa["span"], pb and pb["span"]
        ratio = f", {sb / sa:.3f}×" if sa and sb else ""
        delta = f" ({sb - sa:+.1f} µs{ratio})" if sa and sb else ""
        out.append(f"step span: {na} {fmt(sa, 1)} µs, {nb} {fmt(sb, 1)} µs{delta}\n")
        ca, cb = pa and pa.get("changes"), pb and pb.get("changes")
        if ca is not None or cb is not None:  # reports since the probe printed the shared-memory splits
            out.append(f"shared-memory split changes a step: {na} {fmt(ca, 1)}, {nb} {fmt(cb, 1)}\n")
        la, lb = (pa or {}).get("links", {}), (pb or {}).get("links", {})
        keys = sorted(set(la) | set(lb), key=lambda k: -(la.get(k) or lb.get(k))[2])
        out.append(f"| after … ends | … ends | times a step | {na}, µs | {nb}, µs | {nb} − {na}, µs | "
                   f"{nb} − {na}, µs a step |")
        out.append("|---|---|---:|---:|---:|---:|---:|")
        for k in keys:
            x, y = la.get(k), lb.get(k)
            times = (x or y)[0]
            d = f"{y[1] - x[1]:+.2f}" if x and y else "—"
            ds = f"{y[2] - x[2]:+.1f}" if x and y else "—"
            out.append(f"| `{k[0]}` | `{k[1]}` | {times:.1f} | {fmt(x and x[1])} | {fmt(y and y[1])} | {d} | {ds} |")
        out.append("")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--names", default="A,B", help="the two builds' names, comma-separated (default A,B)")
    args = ap.parse_args(argv)
    names = args.names.split(",")
    if len(names) != 2 or not all(names):
        sys.exit("timeline_pair: --names takes two names, e.g. base,new")
    print(table(read(args.a), read(args.b), names))


if __name__ == "__main__":
    main()
