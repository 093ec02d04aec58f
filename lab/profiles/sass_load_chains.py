#!/usr/bin/env python3
"""Dependent global loads after a kernel's programmatic wait, read from its SASS.

    python3 lab/profiles/sass_load_chains.py FILE [--function PATTERN] [--all]

FILE: the text of `cuobjdump -sass OBJ` (lab/README.md, "SASS without a GPU"), or an object file,
which is passed to cuobjdump ($CUOBJDUMP, else the one on PATH). For each kernel (those whose name
contains PATTERN), from its first ACQBULK (griddepcontrol.wait; the kernel's start where it has
none) to its end, in program order: global loads (LDG, and LD on generic addresses; not LDGSTS,
whose copies no register waits for) are gathered into groups, a group ending where an instruction
reads a register that one of its loads writes. Loads of one group are in flight together; each
group after the first waits for the one before, so N groups after the wait are N dependent round
trips if each misses L1 — the chains that a loop guarded by a bounds test makes (a load in a block
of its own behind the math on the previous one). It reads the listing as text, in program order,
once: a loop's body counts once, and what a branch skips is counted anyway. A reading to check with
the source, not a verdict.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
REGISTER = re.compile(r"\bR(\d+)\b")
WIDTH = re.compile(r"\.(64|128)\b")


def demangle(names):
    """c++filt's names where it is installed, else the mangled ones."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return names
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=False).stdout
    lines = out.splitlines()
    return lines if len(lines) == len(names) else names


def functions(text):
    """[(mangled name, [(address, opcode, operands)])] in the listing's order."""
    out = []
    for line in text.splitlines():
        m = FUNCTION.match(line)
        if m:
            out.append((m.group(1), []))
            continue
        m = INSTRUCTION.match(line)
        if m and out:
            out[-1][1].append((int(m.group(1), 16), m.group(2), m.group(3).strip()))
    return out


def is_global_load(op):
    return (op.startswith("LDG") and not op.startswith("LDGSTS") and not op.startswith("LDGDEPBAR")) or \
        op == "LD" or op.startswith("LD.")


def written(op, operands):
    """The registers a load writes: its first operand, widened by .64 / .128."""
    m = REGISTER.search(operands.split(",")[0])
    if not m:
        return set()
    w = WIDTH.search(op)
    n = {"64": 2, "128": 4}.get(w.group(1), 1) if w else 1
    return {int(m.group(1)) + i for i in range(n)}


def read(operands):
    """The registers an instruction reads: every register operand after its first (the destination);
    a store's or a branch's first operand is read too, which only ends a group earlier."""
    parts = operands.split(",")
    return {int(r) for p in parts[1:] for r in REGISTER.findall(p)} | \
        ({int(r) for r in REGISTER.findall(parts[0])} if "[" in parts[0] else set())


def chains(body):
    """The groups of global loads after the first ACQBULK, [[(address, opcode), …], …], and the
    prefetches (CCTL) among them, [(address, opcode), …]."""
    start = next((i + 1 for i, (_, op, _) in enumerate(body) if op == "ACQBULK"), 0)
    groups, pending, regs, prefetches = [], [], set(), []
    for addr, op, operands in body[start:]:
        if pending and read(operands) & regs:
            groups.append(pending)
            pending, regs = [], set()
        if is_global_load(op):
            pending.append((addr, op))
            regs |= written(op, operands)
        elif op.startswith("CCTL") and ".PF" in op:
            prefetches.append((addr, op))
    if pending:
        groups.append(pending)
    return groups, prefetches, start > 0


def report(text, pattern=None, show_all=False):
    fns = functions(text)
    names = demangle([name for name, _ in fns])
    lines = []
    for (_, body), name in zip(fns, names):
        if pattern and pattern not in name:
            continue
        groups, prefetches, waits = chains(body)
        if not groups and not show_all:
            continue
        where = "after its wait" if waits else "from its start (no wait)"
        lines.append(f"{name}: {len(groups)} dependent group(s) of global loads {where}"
                     + (f", {len(prefetches)} prefetch(es)" if prefetches else ""))
        rows = [(g[0][0], f"{len(g)} load(s) {', '.join(sorted({op for _, op in g}))}") for g in groups]
        rows += [(a, f"prefetch {op}") for a, op in prefetches]
        lines += [f"  {a:#06x}: {what}" for a, what in sorted(rows)]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="cuobjdump -sass text, or an object file")
    ap.add_argument("--function", help="only kernels whose (demangled) name contains this")
    ap.add_argument("--all", action="store_true", help="list kernels without loads after the wait too")
    a = ap.parse_args()
    if a.file.endswith((".o", ".cubin", ".so", ".fatbin")):
        tool = shutil.which(os.environ.get("CUOBJDUMP", "cuobjdump"))
        if not tool:
            sys.exit("sass_load_chains: no cuobjdump (set CUOBJDUMP; lab/README.md says where to get one)")
        run = subprocess.run([tool, "-sass", a.file], capture_output=True, text=True, check=False)
        if run.returncode != 0:  # e.g. PyPI's cuobjdump without nvdisasm beside it (lab/README.md)
            sys.exit(f"sass_load_chains: {tool} -sass {a.file} failed ({run.returncode}): {run.stderr.strip()}")
        text = run.stdout
    else:
        with open(a.file, encoding="utf-8") as f:
            text = f.read()
    out = report(text, a.function, a.all)
    print(out if out else "sass_load_chains: no kernel with global loads matched")


if __name__ == "__main__":
    main()
