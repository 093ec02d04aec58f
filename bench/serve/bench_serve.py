#!/usr/bin/env python3
"""A serving benchmark for any OpenAI-compatible server (twell serve, vLLM, llama-server, transformers serve).

    python3 bench/serve/bench_serve.py --url http://127.0.0.1:8080 --model NAME
        [--concurrency 1,8,32,64] [--rate inf] [--requests 64] [--prompt-len 128] [--max-tokens 128]
        [--shared-prefix 0] [--warmup N] [--json out.json] [--md out.md] [--label twell-sparse]

Each point sends --requests streamed completions with prompts of --prompt-len tokens (random token ids,
so every server sees the same token counts whatever its tokenizer; a server that takes only text gets
--text-prompts) and max_tokens = --max-tokens with ignore_eos. --shared-prefix N puts the same N tokens
(a system prompt) before every request's own --prompt-len: what a server's prefix cache can reuse.
Every point and every warm-up draws prompts of its own (a server that caches prefixes must not find
the measured prompts cached by a warm-up or an earlier point); the shared prefix is the same in all. Requests start as a Poisson process at
--rate requests/s (inf: all at once), at most --concurrency in flight. Metrics as vLLM's
`bench serve` defines them:
  TTFT  time to first token: from sending the request to its first streamed token
  TPOT  time per output token after the first: (E2E - TTFT) / (output tokens - 1), per request
  ITL   inter-token latency: every gap between consecutive streamed chunks, over all requests
  E2E   end-to-end latency of a request
  throughput: requests/s, output tokens/s and total (prompt + output) tokens/s over the point's wall time
mean, median and p99 of each latency. --requests may list one count per concurrency point; --warmup N
sends N unrecorded requests before each point, at its concurrency (CUDA graph captures, cuDNN plans and
a compiler's first shapes are per batch shape: one warm-up at the largest concurrency leaves the
batch-1 shapes cold for the first point). Output tokens are the server's usage count (include_usage), else
the number of streamed chunks. Needs only the Python standard library.
"""
import argparse
import json
import math
import random
import statistics
import threading
import time
import urllib.request


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    f, c = math.floor(k), math.ceil(k)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def one_request(url, headers, body, timeout):
    """Streams one completion; returns (ttft, e2e, chunk times, output tokens, error)."""
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers=headers, method="POST")
    t0 = time.perf_counter()
    times, usage, err = [], None, None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                j = json.loads(data)
                if "error" in j:
                    err = j["error"].get("message", "error")
                    break
                if j.get("usage"):
                    usage = j["usage"].get("completion_tokens")
                if j.get("choices") and j["choices"][0].get("text"):
                    times.append(time.perf_counter())
    except Exception as e:  # noqa: BLE001 (a failed request is counted, not fatal)
        err = f"{type(e).__name__}: {e}"
    t1 = time.perf_counter()
    n = usage if usage is not None else len(times)
    return (times[0] - t0 if times else float("nan")), t1 - t0, [t - t0 for t in times], n, err


def run_point(a, concurrency, rate, vocab, requests, draw):
    """draw: which draw of prompts (each point and each warm-up its own)."""
    rng = random.Random(a.seed * 1_000_003 + draw)
    shared = [random.Random(a.seed - 1).randrange(100, vocab) for _ in range(a.shared_prefix)]
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = f"Bearer {a.api_key}"
    bodies = []
    for _ in range(requests):
        if a.text_prompts:
            prompt = " ".join(rng.choice(["the", "a", "river", "house", "light", "city", "runs", "old"]) for _ in range(a.prompt_len))
        else:
            prompt = shared + [rng.randrange(100, vocab) for _ in range(a.prompt_len)]
        bodies.append({"model": a.model, "prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    results = [None] * requests
    sem = threading.Semaphore(concurrency)
    threads = []
    t_start = time.perf_counter()
    for i, b in enumerate(bodies):
        if rate != math.inf and i > 0:
            time.sleep(rng.expovariate(rate))
        sem.acquire()

        def work(i=i, b=b):
            try:
                results[i] = one_request(a.url, headers, b, a.timeout)
            finally:
                sem.release()

        t = threading.Thread(target=work)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    ok = [r for r in results if r and r[4] is None and r[3] > 0]
    ttft = [r[0] for r in ok]
    e2e = [r[1] for r in ok]
    tpot = [(r[1] - r[0]) / (r[3] - 1) for r in ok if r[3] > 1]
    itl = [y - x for r in ok for x, y in zip(r[2], r[2][1:])]
    out_tokens = sum(r[3] for r in ok)

    def stats(xs):
        return {"mean": statistics.fmean(xs) if xs else float("nan"), "median": percentile(xs, 50), "p99": percentile(xs, 99)}

    return {"concurrency": concurrency, "rate": None if rate == math.inf else rate, "requests": requests,
            "completed": len(ok), "failed": requests - len(ok),
            "errors": sorted({r[4] for r in results if r and r[4]})[:3], "wall_s": wall,
            "request_throughput": len(ok) / wall, "output_throughput": out_tokens / wall,
            "total_token_throughput": (out_tokens + (a.shared_prefix + a.prompt_len) * len(ok)) / wall,
            "ttft_s": stats(ttft), "tpot_s": stats(tpot), "itl_s": stats(itl), "e2e_s": stats(e2e)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--concurrency", default="1,8,32,64", help="comma-separated points")
    ap.add_argument("--rate", default="inf", help="requests/s (Poisson arrivals), comma-separated, or inf")
    ap.add_argument("--requests", default="64", help="requests a point: one count, or one per concurrency point")
    ap.add_argument("--warmup", type=int, default=0, help="unrecorded requests sent before each point, at its concurrency")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="tokens of one prefix (a system prompt) before every prompt (random ids only)")
    ap.add_argument("--vocab", type=int, default=32000, help="random prompt ids are drawn from [100, vocab)")
    ap.add_argument("--text-prompts", action="store_true", help="send words instead of token ids")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--label", default="")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    conc = [int(x) for x in a.concurrency.split(",")]
    reqs = [int(x) for x in a.requests.split(",")]
    if len(reqs) == 1:
        reqs *= len(conc)
    if len(reqs) != len(conc):
        ap.error("--requests lists one count, or one per --concurrency point")
    if min(reqs) < 1 or min(conc) < 1 or a.prompt_len < 1 or a.max_tokens < 1 or a.warmup < 0:
        ap.error("--requests, --concurrency, --prompt-len and --max-tokens must be positive")
    if a.shared_prefix < 0 or (a.shared_prefix and a.text_prompts):
        ap.error("--shared-prefix: a count of tokens ≥ 0, with token-id prompts (not --text-prompts)")
    points = []
    draw = 0
    for c, n in zip(conc, reqs):
        if a.warmup:
            draw += 1
            w = run_point(a, c, math.inf, a.vocab, max(a.warmup, c), draw)
            print(f"warm-up at {c}: {w['completed']}/{w['requests']} ok in {w['wall_s']:.1f} s"
                  + (f"  errors: {w['errors']}" if w["errors"] else ""), flush=True)
        for r in [float(x) for x in a.rate.split(",")]:
            draw += 1
            p = run_point(a, c, r, a.vocab, n, draw)
            points.append(p)
            print(f"concurrency {c:3d} rate {r:>5}: {p['completed']}/{p['requests']} ok, {p['output_throughput']:8.1f} out tok/s, "
                  f"TTFT median {1e3 * p['ttft_s']['median']:7.1f} ms p99 {1e3 * p['ttft_s']['p99']:7.1f}, "
                  f"TPOT median {1e3 * p['tpot_s']['median']:6.2f} ms, ITL p99 {1e3 * p['itl_s']['p99']:6.2f} ms"
                  + (f"  errors: {p['errors']}" if p["errors"] else ""), flush=True)
    out = {"label": a.label, "url": a.url, "model": a.model, "prompt_len": a.prompt_len, "max_tokens": a.max_tokens,
           "shared_prefix": a.shared_prefix,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "points": points}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            pre = f"a shared prefix of {a.shared_prefix} + " if a.shared_prefix else ""
            f.write(f"# bench_serve {a.label}: {a.model} at {a.url}, prompts {pre}{a.prompt_len} tokens, {a.max_tokens} out ({out['date']})\n\n")
            f.write("| concurrency | rate | ok | req/s | out tok/s | TTFT mean / median / p99 ms | TPOT median ms | ITL median / p99 ms | E2E median s |\n")
            f.write("|---:|---:|---:|---:|---:|---|---:|---|---:|\n")
            for p in points:
                f.write(f"| {p['concurrency']} | {p['rate'] or 'inf'} | {p['completed']}/{p['requests']} | {p['request_throughput']:.2f} | "
                        f"{p['output_throughput']:.1f} | {1e3 * p['ttft_s']['mean']:.1f} / {1e3 * p['ttft_s']['median']:.1f} / "
                        f"{1e3 * p['ttft_s']['p99']:.1f} | {1e3 * p['tpot_s']['median']:.2f} | "
                        f"{1e3 * p['itl_s']['median']:.2f} / {1e3 * p['itl_s']['p99']:.2f} | {p['e2e_s']['median']:.2f} |\n")
    return 1 if any(p["failed"] for p in points) else 0


if __name__ == "__main__":
    raise SystemExit(main())
