#!/usr/bin/env python3
"""scripts/bench-baseline on a temporary copy of bench/baselines/: list, compare a baseline with
itself (1.000× everywhere) and with a changed copy (the changed ratio shows), an unknown kind and a
result without a baseline refused, replace refusing a JSON without a commit and replacing one with it.
Standard library only: ctest runs it as `bench_baseline` (label cpu)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SCRIPT = os.path.join(REPO, "scripts", "bench-baseline")
failures = []


def run(root, *args):
    p = subprocess.run([sys.executable, SCRIPT, "--root", root, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)
        if detail:
            print("     " + detail.strip().replace("\n", "\n     ")[:2000])


def ratios(out):
    return re.findall(r"(\d+\.\d+)×", out)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "baselines")
        shutil.copytree(os.path.join(REPO, "bench", "baselines"), root)

        rc, out, err = run(root, "list")
        check("list exits 0 and names h100/ffn-quick and h200/serve-2b with their commits",
              rc == 0 and re.search(r"\| ffn-quick \| h100 \|.*\| 7967f30 \|", out) is not None
              and re.search(r"\| serve-2b \| h200 \|.*\| 06aad5b \|", out) is not None, out + err)
        check("list takes commit and device from a sidecar when the file has none (h100/ffn-full.md)",
              re.search(r"\| ffn-full \| h100 \| NVIDIA H100[^|]*\| 1097535 \|", out) is not None, out)

        sweep = os.path.join(root, "h100", "ffn-quick.json")
        rc, out, err = run(root, "compare", sweep)
        r = ratios(out)
        check("a layer sweep against itself: its baseline found, every ratio 1.000×",
              rc == 0 and "h100/ffn-quick" in out and r and all(x == "1.000" for x in r), out + err)

        serve = os.path.join(root, "h200", "serve-2b.json")
        rc, out, err = run(root, "compare", serve)
        r = ratios(out)
        check("a serve result against itself: h200/serve-2b chosen among three serve baselines, every ratio 1.000×",
              rc == 0 and "Baseline h200/serve-2b " in out and r and all(x == "1.000" for x in r), out + err)

        # A copy with one number changed: decode b1's sparse tokens/s of the 7B run, times 1.25.
        with open(os.path.join(root, "h200", "model-7b.json")) as f:
            d = json.load(f)
        row = next(x for x in d["rows"] if x["phase"] == "decode")
        row["sparse_tokens_per_s"] *= 1.25
        changed = os.path.join(tmp, "model-7b-changed.json")
        with open(changed, "w") as f:
            json.dump(d, f)
        rc, out, err = run(root, "compare", changed)
        line = next((ln for ln in out.splitlines() if "phase=decode" in ln and ln.split("|")[1].strip().endswith(".sparse_tokens_per_s")), "")
        others = [x for ln in out.splitlines() if ln != line and ln.startswith("| rows") for x in ratios(ln)]
        check("a changed copy: the changed key shows 1.250×, the rest 1.000×",
              rc == 0 and line.rstrip().endswith("| 1.250× |") and others and all(x == "1.000" for x in others), f"changed line: {line!r}\n" + out + err)

        rc, out, err = run(root, "compare", sweep, "--gpu", "h200", "--kind", "ffn-quick")
        check("another GPU kind's baseline: said before the table", rc == 0 and "**Different GPU kinds**" in out, out + err)

        rc, out, err = run(root, "compare", sweep, "--kind", "no-such-kind")
        check("an unknown kind: exit 2 with a message naming it",
              rc == 2 and "no baseline of kind 'no-such-kind' on h100" in err, out + err)

        odd = os.path.join(tmp, "odd.json")
        with open(odd, "w") as f:
            json.dump({"device": "NVIDIA H100 80GB HBM3", "commit": "abc1234", "date": "2026-12-01", "x": 1}, f)
        rc, out, err = run(root, "compare", odd)
        check("a result of no known shape: exit 2 asking for --kind", rc == 2 and "--kind" in err, out + err)

        os.remove(os.path.join(root, "cpu-2core", "serve-kv-capacity-tiny.json"))
        kv = os.path.join(root, "h200", "serve-kv-capacity-2b.json")
        rc, out, err = run(root, "compare", kv, "--gpu", "cpu-2core")
        check("no baseline of the shape on that GPU kind: exit 2 naming the ones elsewhere",
              rc == 2 and "no serve-kv-capacity baseline on cpu-2core" in err and "h200/serve-kv-capacity-2b" in err, out + err)

        with open(sweep) as f:
            d = json.load(f)
        del d["commit"]
        nocommit = os.path.join(tmp, "nocommit.json")
        with open(nocommit, "w") as f:
            json.dump(d, f)
        before = open(sweep).read()
        rc, out, err = run(root, "replace", nocommit, sweep.replace(".json", ".md"), "--kind", "ffn-quick", "--gpu", "h100")
        check("replace refuses a JSON without a commit and leaves the baseline as it was",
              rc == 2 and "no commit" in err and open(sweep).read() == before, out + err)

        rc, out, err = run(root, "replace", os.path.join(root, "h200", "ffn-quick.json"), "--kind", "ffn-quick", "--gpu", "h100")
        check("replace refuses an H200 result as the H100 baseline", rc == 2 and "not a h100" in err, out + err)

        d["commit"] = "abc1234"
        d["points"][0]["dense_ms"] *= 2
        newer = os.path.join(tmp, "newer.json")
        with open(newer, "w") as f:
            json.dump(d, f)
        newer_md = os.path.join(tmp, "newer.md")
        with open(newer_md, "w") as f:
            f.write("# tables\n")
        rc, out, err = run(root, "compare", newer)
        p0 = d["points"][0]
        head = f"| {p0['mode']} | {bool(p0['gated'])} | {p0['m']} | {p0['target_density']:.4g} |"
        first = next((ln for ln in out.splitlines() if ln.startswith(head)), "")
        check("a layer sweep with one point's dense time doubled: that point's dense_ms shows 2.000×",
              rc == 0 and ratios(first)[:1] == ["2.000"], out + err)
        rc, out, err = run(root, "replace", newer, newer_md, "--kind", "ffn-quick", "--gpu", "h100")
        rc2, out2, _ = run(root, "list")
        check("replace copies over the fixed name, prints the git add, and list shows the new commit",
              rc == 0 and "git add" in out and "ffn-quick.json" in out and "ffn-quick.md" in out
              and json.load(open(sweep))["commit"] == "abc1234"
              and re.search(r"\| ffn-quick \| h100 \|.*\| abc1234 \|", out2) is not None, out + err + out2)
        rc, out, err = run(root, "compare", sweep)
        check("compare after replace: 1.000× against itself", rc == 0 and ratios(out) and all(x == "1.000" for x in ratios(out)), out + err)

    rc, out, err = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True).returncode, "", ""
    check("--help exits 0", rc == 0)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
