#!/usr/bin/env python3
"""How many sequences of up to 2k tokens a KV budget serves at once: fixed caches against the paged one.

    python3 bench/serve/kv_capacity.py --twell BIN --model DIR [--device cpu] [--kv-tokens 32768]
        [--max-running 256] [--requests 128] [--prompt-len 64] [--max-len 2048] [--min-len 128]
        [--seed 0] [--kv-headroom 0,1,4] [--json out.json] [--md out.md]

Every request may grow to --max-len tokens (max_tokens = max-len − prompt-len, so a server must be
ready to hold all of them), but each client stops reading at a length drawn uniformly from
[--min-len, --max-len] and closes its stream, as users stop a generation: the server cancels the
request and frees its cache. All requests are sent at once. The same workload runs twice against
`twell serve --kv-tokens N`: with TWELL_TUNING=no-paged-kv (one cache of prompt + max_tokens a
request, reserved at admission) and with the paged cache (blocks of 16 positions taken as tokens are
written, the most recent request preempted when the pool runs out). /metrics is read every 20 ms:
the peak and mean number of requests running, the positions held, and the preemptions; the wall
time and the tokens received give the throughput. The model's context must hold --max-len tokens.
"""
import argparse
import json
import os
import random
import sys
import threading
import time
import urllib.request

from twell_server import TwellServer


def client(url, body, stop_at, out, i):
    """Streams one completion and closes the connection after stop_at tokens (or at its end)."""
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    got, t0 = 0, time.time()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if line == "data: [DONE]":
                    break
                if line.startswith("data: ") and '"text"' in line:
                    got += 1
                    if got >= stop_at:
                        break  # leaving the with-block closes the stream: the server cancels it
        out[i] = (got, None)
    except Exception as e:  # noqa: BLE001 (counted, not fatal)
        out[i] = (got, f"{type(e).__name__}: {e}")
        print(f"kv_capacity: request {i} failed after {got} tokens and {time.time() - t0:.1f} s: "
              f"{type(e).__name__}: {e}", file=sys.stderr)


def run(a, paged, headroom=None):
    env = dict(os.environ)
    items = [x for x in env.get("TWELL_TUNING", "").split(",") if x and x != "no-paged-kv"]
    if not paged:
        items.append("no-paged-kv")
    env["TWELL_TUNING"] = ",".join(items)
    extra = ["--kv-headroom", str(headroom)] if paged and headroom is not None else []
    with TwellServer(a.twell, a.model, "--kv-tokens", str(a.kv_tokens), "--max-running", str(a.max_running),
                     "--max-queue", str(a.requests + 8), "--model-name", "m", *extra, device=a.device, env=env,
                     timeout=300) as srv:
        url = srv.url
        rng = random.Random(a.seed)
        vocab = a.vocab
        bodies, stops = [], []
        for _ in range(a.requests):
            bodies.append({"model": "m", "prompt": [rng.randrange(100, vocab) for _ in range(a.prompt_len)],
                           "max_tokens": a.max_len - a.prompt_len, "temperature": 0, "ignore_eos": True, "stream": True})
            stops.append(rng.randint(a.min_len, a.max_len) - a.prompt_len)
        out = [None] * a.requests
        running, held, done = [], [], threading.Event()
        def poll():
            while not done.is_set():
                r, k = srv.metric("twell_requests_running"), srv.metric("twell_kv_tokens_used")
                if r is not None:
                    running.append(r)
                    held.append(k)
                time.sleep(0.02)
        poller = threading.Thread(target=poll)
        pre0 = srv.metric("twell_preemptions_total") or 0
        t1 = time.time()
        poller.start()
        ts = [threading.Thread(target=client, args=(url, bodies[i], stops[i], out, i)) for i in range(a.requests)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(900)
        wall = time.time() - t1
        done.set()
        poller.join()
        if any(o is None or o[1] for o in out):  # the server's side of it
            print("kv_capacity: the server's last log lines:\n" + "".join(srv.lines[-20:]), file=sys.stderr)
        tokens = sum(o[0] for o in out if o)
        errors = sorted({o[1] for o in out if o and o[1]})[:3]
        busy = [r for r in running if r > 0]
        mode = "fixed (prompt + max_tokens reserved)"
        if paged:
            mode = "paged" if headroom is None else f"paged, headroom {headroom} block(s) a request"
        return {"mode": mode,
                "kv_tokens_total": srv.metric("twell_kv_tokens_total"),
                "peak_running": max(running) if running else 0,
                "mean_running": sum(busy) / len(busy) if busy else 0,
                "peak_positions_held": max(held) if held else 0,
                "preemptions": (srv.metric("twell_preemptions_total") or 0) - pre0,
                "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
                "completed": sum(1 for o in out if o and not o[1]), "errors": errors}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--twell", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kv-tokens", type=int, default=32768)
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--min-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=0, help="prompt ids from [100, vocab) (0: the model's config)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-headroom", default="", help="paged runs at these `twell serve --kv-headroom` values, "
                    "comma-separated (default: one run at the server's default)")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    if not (0 < a.prompt_len < a.min_len <= a.max_len) or a.requests < 1:
        ap.error("need 0 < prompt-len < min-len <= max-len and requests >= 1")
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    if cfg.get("max_position_embeddings", 0) < a.max_len:
        ap.error(f"the model's context ({cfg.get('max_position_embeddings')}) is shorter than --max-len {a.max_len}")
    a.vocab = a.vocab or cfg["vocab_size"]
    heads = [int(h) for h in a.kv_headroom.split(",")] if a.kv_headroom else [None]
    rows = [run(a, paged=False)] + [run(a, paged=True, headroom=h) for h in heads]
    for r in rows:
        print(json.dumps(r), flush=True)
    res = {"model": a.model, "device": a.device, "kv_tokens": a.kv_tokens, "requests": a.requests,
           "prompt_len": a.prompt_len, "lengths": [a.min_len, a.max_len], "max_running": a.max_running,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": rows}
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    lines = [f"KV budget {a.kv_tokens} positions; {a.requests} requests of up to {a.max_len} tokens (prompts {a.prompt_len}), "
             f"each read to a length drawn from [{a.min_len}, {a.max_len}]; max-running {a.max_running}.\n",
             "| cache | peak running | mean running | peak positions held | preemptions | tokens/s | wall s | completed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['peak_running']:.0f} | {r['mean_running']:.1f} | {r['peak_positions_held']:.0f} | "
                     f"{r['preemptions']:.0f} | {r['tokens_per_s']:.0f} | {r['wall_s']:.1f} | {r['completed']}/{a.requests} |")
    print("\n".join(lines))
    if a.md:
        open(a.md, "w").write("\n".join(lines) + "\n")
    return 0 if all(not r["errors"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
