#!/usr/bin/env python3
"""The serving benchmark's tools, checked end to end on the CPU (loopback only, bounded in time).

    python3 tests/serve/bench_tools.py TWELL_BINARY SMOLLM2_DIR

- bench/serve/trim_tokenizer.py: SmolLM2's tokenizer trimmed to 512 and 4096 ids encodes text into ids
  below the bound and decodes it back unchanged (checked with the `tokenizers` library, not our
  tokenizer); a vocabulary whose kept id is made from a dropped one is refused.
- bench/serve/bench_serve.py against `twell serve` on a tiny synthetic checkpoint (`twell gen model`
  plus the trimmed tokenizer): every request completes, the output tokens it counts are exactly
  requests × max_tokens (ignore_eos), and its latencies are positive and ordered (TTFT ≤ E2E).
- bench/serve/compare.py: one result against itself gives 1.00× in every ratio and a row per point;
  results of different workloads are refused.
- bench/serve/kv_capacity.py: in a 128-position budget fixed caches run one request of up to 128
  tokens at a time, the paged cache several (one at a time with `--kv-headroom 7`), and every request
  completes either way.
Exit 77 (ctest: skipped) without the `tokenizers` package or SmolLM2's tokenizer.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "serve"))
from twell_server import TwellServer  # noqa: E402

TWELL, SMOL = sys.argv[1], sys.argv[2]
TOK = os.path.join(SMOL, "tokenizer.json")
try:
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
if not os.path.exists(TOK):
    print(f"skipped: no {TOK} (bash scripts/fetch-smollm2)")
    sys.exit(77)
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def tool(name, *args, **kw):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "serve", name), *map(str, args)],
                          capture_output=True, text=True, timeout=kw.get("timeout", 120))


TEXT = "The river runs through the old city, past 42 houses; Ünïcödé and 日本語 too.\n\tEnd."


def test_trim(tmp):
    for v in (512, 4096):
        out = os.path.join(tmp, f"tok{v}")
        r = tool("trim_tokenizer.py", TOK, v, out)
        check(r.returncode == 0, f"trim_tokenizer to {v} ids runs ({r.stderr.strip()[-200:]})")
        t = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        ids = t.encode(TEXT).ids
        check(max(ids) < v, f"trimmed to {v}: every id of the sample is below {v} (max {max(ids)})")
        check(t.decode(ids) == TEXT, f"trimmed to {v}: the sample decodes back unchanged")
    full = Tokenizer.from_file(TOK).encode(TEXT).ids
    small = Tokenizer.from_file(os.path.join(tmp, "tok512", "tokenizer.json")).encode(TEXT).ids
    check(len(small) > len(full), f"fewer merges give more tokens ({len(small)} > {len(full)})")
    # A vocabulary not in merge order: an id below the bound made from a part above it.
    bad = json.load(open(TOK, encoding="utf-8"))
    voc = bad["model"]["vocab"]
    a, b = bad["model"]["merges"][0] if isinstance(bad["model"]["merges"][0], list) else bad["model"]["merges"][0].split(" ")
    voc[a], voc["zzzz_high"] = 49000, voc[a]
    p = os.path.join(tmp, "bad.json")
    json.dump(bad, open(p, "w", encoding="utf-8"))
    r = tool("trim_tokenizer.py", p, 512, os.path.join(tmp, "badout"))
    check(r.returncode != 0 and "dropped part" in (r.stdout + r.stderr), "a kept id made from a dropped part is refused")


def test_bench(tmp):
    model = os.path.join(tmp, "tiny")
    g = subprocess.run([TWELL, "gen", "model", "--config", "tiny", "--out", model, "--check-tokens", "0"],
                       capture_output=True, text=True, timeout=120)
    check(g.returncode == 0, "twell gen model --config tiny")
    vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
    r = tool("trim_tokenizer.py", TOK, vocab, model)
    check(r.returncode == 0, f"tokenizer trimmed to the tiny model's {vocab} ids")
    try:
        srv = TwellServer(TWELL, model, "--model-name", "tiny", timeout=60)
    except RuntimeError as e:
        check(False, f"twell serve starts on a free port ({e})")
        return
    with srv:
        url = srv.url
        js = os.path.join(tmp, "run.json")
        r = tool("bench_serve.py", "--url", url, "--model", "tiny", "--concurrency", "1,3", "--requests", "2,5",
                 "--prompt-len", "9", "--max-tokens", "6", "--vocab", vocab, "--warmup", "1", "--label", "tiny",
                 "--json", js, timeout=300)
        check(r.returncode == 0, f"bench_serve runs against twell serve ({(r.stdout + r.stderr).strip()[-300:]})")
        res = json.load(open(js))
        for p, n in zip(res["points"], (2, 5)):
            c = p["concurrency"]
            check(p["completed"] == n and p["failed"] == 0, f"concurrency {c}: {n} of {n} requests complete")
            check(abs(p["output_throughput"] * p["wall_s"] - n * 6) < 1e-6,
                  f"concurrency {c}: output tokens counted = requests × max_tokens ({n * 6})")
            check(0 < p["ttft_s"]["median"] <= p["e2e_s"]["median"] and p["tpot_s"]["median"] > 0,
                  f"concurrency {c}: latencies positive and TTFT ≤ E2E")
        md = os.path.join(tmp, "cmp.md")
        r = tool("compare.py", js, js, "--md", md)
        table = open(md).read() if r.returncode == 0 else ""
        rows = [l for l in table.splitlines() if re.match(r"\| \d+ \|", l)]
        check(len(rows) == 2 and all(l.count("1.00×") == 2 for l in rows), "compare: a result against itself is 1.00× in both ratios, a row per point")
        other = dict(res, max_tokens=7)
        p2 = os.path.join(tmp, "other.json")
        json.dump(other, open(p2, "w"))
        r = tool("compare.py", js, p2, "--md", md)
        check(r.returncode != 0 and "not one workload" in r.stderr, "compare refuses results of different workloads")
    # kv_capacity.py: fixed caches hold one request of up to 128 tokens in a 128-position budget at a
    # time; the paged cache without admission headroom runs several at once and preempts; with 7
    # blocks of headroom a request in that 8-block pool leaves no room for a second one, so they run
    # one at a time and never preempt. Every request completes either way. (/metrics is polled every
    # 20 ms over runs of about a second.)
    r = tool("kv_capacity.py", "--twell", TWELL, "--model", model, "--kv-tokens", 128, "--requests", 8,
             "--max-running", 8, "--prompt-len", 8, "--min-len", 48, "--max-len", 128, "--kv-headroom", "0,7",
             "--json", os.path.join(tmp, "kv.json"), timeout=300)
    check(r.returncode == 0, f"kv_capacity runs ({(r.stdout + r.stderr).strip()[-300:]})")
    if r.returncode == 0:
        fixed, paged, roomy = json.load(open(os.path.join(tmp, "kv.json")))["runs"]
        check(fixed["peak_running"] == 1 and fixed["preemptions"] == 0 and fixed["completed"] == 8,
              f"fixed caches: one 128-token request at a time in 128 positions ({fixed['peak_running']:.0f})")
        check(paged["peak_running"] > 1 and paged["completed"] == 8,
              f"paged: {paged['peak_running']:.0f} at once in the same budget, all 8 complete ({paged['preemptions']:.0f} preemptions)")
        check(roomy["peak_running"] == 1 and roomy["preemptions"] == 0 and roomy["completed"] == 8,
              f"paged, headroom 7 of 8 blocks: one at a time, no preemption ({roomy['peak_running']:.0f} at once, "
              f"{roomy['preemptions']:.0f} preemptions)")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        test_trim(tmp)
        test_bench(tmp)
    print(f"{len(FAILS)} failure(s)" if FAILS else "all passed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
