#!/usr/bin/env python3
"""`twell serve` driven by the official `openai` client and by raw HTTP (loopback only).

    python3 tests/serve/serve_openai.py TWELL_BINARY MODEL_DIR

On SmolLM2-135M-Instruct (scripts/fetch-smollm2) on the CPU: the server is started by this test on a
free port; models, completions and chat, streaming and not (a stream's pieces join to the
non-streamed text; include_usage); 24 concurrent greedy requests each equal to the same request
served alone; stop strings; the errors of bad requests (JSON error bodies with the right status,
never a crash); a bounded fuzz of request bodies; the API key; a full queue answered 503 at once; a
client that goes away mid-stream frees its KV cache (read from /metrics); SIGTERM while requests run
drains them and exits 0. Every loop is bounded in count and time.
Exit 77 (ctest: skipped) without the openai package or the model.
"""
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench", "serve"))
from twell_server import TwellServer  # noqa: E402

try:
    import openai
except ImportError as e:
    print(f"skipped: {e} (pip install -r scripts/requirements.txt)")
    sys.exit(77)

TWELL, MODEL = sys.argv[1], sys.argv[2]
if not os.path.exists(os.path.join(MODEL, "tokenizer.json")):
    print(f"skipped: no model at {MODEL} (bash scripts/fetch-smollm2)")
    sys.exit(77)
NAME = os.path.basename(os.path.normpath(MODEL))
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


SERVERS = []  # every server this test started: main() kills any still running when it ends


class Server(TwellServer):
    """`twell serve` on SmolLM2 on a free loopback port, ready within 60 s, with the test's HTTP helpers."""

    def __init__(self, *args):
        super().__init__(TWELL, MODEL, *args, timeout=60)
        SERVERS.append(self)

    def request(self, method, path, body=None, headers=None, raw=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json", **(headers or {})}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def get(self, path, headers=None):
        try:
            return self.request("GET", path, headers=headers)
        except OSError:
            return 0, ""

    def post(self, path, body=None, raw=None, headers=None):
        return self.request("POST", path, body, headers, raw)


def main():
    t_start = time.time()
    s = Server()
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    # Models, completions and chat.
    ids = [m.id for m in client.models.list().data]
    check(ids == [NAME], f"models.list: {ids}")

    # The listening socket: a backlog deeper than cpp-httplib's 5 (beyond it, clients connecting at
    # once were reset), and no SO_REUSEPORT: a second server on the port is refused, not let in.
    ss = subprocess.run(["ss", "-ltnH", f"sport = :{s.port}"], capture_output=True, text=True, timeout=10)
    backlog = [int(f.split()[2]) for f in ss.stdout.splitlines() if f.split()]
    check(ss.returncode == 0 and backlog and min(backlog) >= 128, f"listen backlog {backlog} (ss: {ss.stderr.strip()})")
    second = subprocess.run([TWELL, "serve", "--model", MODEL, "--device", "cpu", "--port", str(s.port)],
                            capture_output=True, text=True, timeout=60)
    check(second.returncode != 0 and "cannot listen" in second.stderr,
          f"a second server on port {s.port}: rc {second.returncode}, {second.stderr.strip()[-200:]!r}")
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "What is the capital of France?"}],
                                          max_tokens=24, temperature=0)
    text = chat.choices[0].message.content
    check("Paris" in text and chat.choices[0].finish_reason in ("stop", "length"), f"chat answers {text!r}")
    check(chat.usage.prompt_tokens > 0 and chat.usage.completion_tokens > 0, f"chat usage {chat.usage}")
    pieces, finish, usage = [], None, None
    for ch in client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "What is the capital of France?"}],
                                             max_tokens=24, temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        if ch.choices:
            pieces.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    check("".join(pieces) == text and finish == chat.choices[0].finish_reason, "a stream's pieces join to the same answer")
    check(usage is not None and usage.completion_tokens == chat.usage.completion_tokens, "stream_options.include_usage")

    # Prefix sharing and the prefix cache. A finished request's full prompt blocks stay cached: the
    # same 50-token prompt again takes three blocks of 16 (48 tokens; the last token is always
    # computed) instead of prefilling them. So does a request whose prompt starts with a running
    # request's blocks. Each answers as the first request did alone.
    long_prompt = list(range(300, 350))
    lbody = lambda n, stream=False: {"model": NAME, "prompt": long_prompt, "max_tokens": n, "temperature": 0,
                                     "ignore_eos": True, "stream": stream}
    c0 = s.metric("twell_prompt_tokens_cached_total")
    code, solo_body = s.post("/v1/completions", body=lbody(8))
    solo_text = json.loads(solo_body)["choices"][0]["text"] if code == 200 else None
    c1 = s.metric("twell_prompt_tokens_cached_total")
    check(c1 == c0, f"a new prompt computes every block: {c1 - c0:.0f} prompt tokens taken from the cache")
    t0 = time.time()  # the scheduler gives a finished request's blocks back at the end of its last step
    while time.time() - t0 < 30 and s.metric("twell_kv_blocks_cached") < 3:
        time.sleep(0.05)
    check(s.metric("twell_kv_blocks_cached") >= 3, f"the finished request's blocks cached: {s.metric('twell_kv_blocks_cached'):.0f}")
    req = urllib.request.Request(s.url + "/v1/completions", data=json.dumps(lbody(400, True)).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as first:
        for raw in first:  # its first token: it runs, on the cached blocks
            if raw.startswith(b"data: ") and b'"text"' in raw:
                break
        c2 = s.metric("twell_prompt_tokens_cached_total")
        code, shared_body = s.post("/v1/completions", body=lbody(8))
    shared_text = json.loads(shared_body)["choices"][0]["text"] if code == 200 else None
    c3 = s.metric("twell_prompt_tokens_cached_total")
    check(c2 - c1 == 48, f"a finished request's prompt blocks reused from the cache: {c2 - c1:.0f} prompt tokens not prefilled")
    check(c3 - c2 == 48, f"a running request's prompt blocks shared: {c3 - c2:.0f} prompt tokens not prefilled")
    check(shared_text == solo_text and solo_text, f"the request on shared blocks answers as alone ({shared_text!r} vs {solo_text!r})")

    # Concurrency: each greedy request equals the same request alone (continuous batching with
    # prompts of different lengths joining and leaving).
    prompts = [f"Write a short note number {i} about {w}." for i, w in
               enumerate(["rivers", "bread", "stars", "music", "trains", "cats", "rain", "paper"] * 3)]
    def complete(p, n=10):
        return client.completions.create(model=NAME, prompt=p, max_tokens=n, temperature=0).choices[0].text
    solo = [complete(p) for p in prompts[:8]]
    got = [None] * len(prompts)
    def worker(i):
        got[i] = complete(prompts[i])
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    dt = time.time() - t0
    same = all(got[i] == solo[i % 8] for i in range(len(prompts)))
    check(same, f"24 concurrent greedy completions each equal to their solo run ({dt:.1f} s)")
    if not same:
        for i in range(len(prompts)):
            if got[i] != solo[i % 8]:
                print(f"     {i}: batched {got[i]!r} vs solo {solo[i % 8]!r}")
    # A request's last event goes out before the scheduler frees its cache at the end of that step:
    # the metrics reach zero within the step, not necessarily before the reply arrives.
    t0 = time.time()
    while time.time() - t0 < 30 and not (s.metric("twell_kv_tokens_used") == 0 and s.metric("twell_requests_running") == 0):
        time.sleep(0.02)
    check(s.metric("twell_kv_tokens_used") == 0 and s.metric("twell_requests_running") == 0, "all caches freed after")

    # Stop strings, across token boundaries: stop at a piece of the solo answer.
    full = complete("Once upon a time", 24)
    cut = full[len(full) // 2: len(full) // 2 + 3]
    check(len(cut) == 3, f"a 24-token continuation to cut: {full!r}")
    r = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=24, temperature=0, stop=["\u2603", cut])
    check(r.choices[0].text == full[:full.index(cut)] and r.choices[0].finish_reason == "stop",
          f"stop {cut!r}: {r.choices[0].text!r}")

    # Seeded sampling is reproducible.
    a = client.completions.create(model=NAME, prompt="Hello", max_tokens=8, temperature=0.9, top_p=0.9, seed=5).choices[0].text
    b = client.completions.create(model=NAME, prompt="Hello", max_tokens=8, temperature=0.9, top_p=0.9, seed=5).choices[0].text
    check(a == b, "the same seed samples the same text")

    # Bad requests: a JSON error with the right status, never a crash.
    cases = [
        ("invalid JSON", dict(raw=b"{not json"), 400, None),
        ("invalid UTF-8", dict(raw=b'{"prompt": "\xff\xfe", "max_tokens": 2}'), 400, None),
        ("wrong type", dict(body={"prompt": "a", "max_tokens": "ten"}), 400, "max_tokens"),
        ("unknown parameter", dict(body={"prompt": "a", "frobnicate": 1}), 400, "frobnicate"),
        ("unsupported parameter", dict(body={"prompt": "a", "presence_penalty": 0.5}), 400, "presence_penalty"),
        ("unknown model", dict(body={"model": "gpt-9", "prompt": "a"}), 404, "model"),
        ("max_tokens past the context", dict(body={"prompt": "a", "max_tokens": 10 ** 6}), 400, "max_tokens"),
        ("prompt past the context", dict(body={"prompt": list(range(1, 9000))}), 413, "prompt"),
        ("token id outside the vocabulary", dict(body={"prompt": [1, 10 ** 7]}), 400, "prompt"),
        ("no messages", dict(body={"messages": []}, path="/v1/chat/completions"), 400, "messages"),
        ("bad role", dict(body={"messages": [{"role": "tool", "content": "x"}]}, path="/v1/chat/completions"), 400, "messages"),
        ("body too large", dict(raw=b'{"prompt": "' + b"a" * (2 << 20) + b'"}'), 413, None),
        ("no such endpoint", dict(body={}, path="/v1/embeddings"), 404, None),
    ]
    for what, kw, status, param in cases:
        path = kw.pop("path", "/v1/completions")
        code, body = s.post(path, **kw)
        try:
            err = json.loads(body)["error"]
            ok = code == status and (param is None or err.get("param") == param)
        except (ValueError, KeyError, TypeError):
            ok, err = False, body[:200]
        check(ok, f"{what}: HTTP {code} {err}")

    # A bounded fuzz of bodies: mutated valid requests; every answer is JSON, the server stays up.
    rng = random.Random(1234)
    base = {"prompt": "Hi", "max_tokens": 2, "temperature": 0.5, "top_p": 0.9, "stop": ["x"], "stream": False, "seed": 1}
    junk = [None, True, -1, 0, 1.5, 1e308, "", "a" * 300, [], [1, "a"], {}, {"a": 1}, -2 ** 63, "\u00e9"]
    bad_answers = 0
    for _ in range(150):
        b = dict(base)
        for _ in range(rng.randint(1, 3)):
            k = rng.choice(list(base) + ["model", "messages", "n", "echo", rng.choice(["zz", "prompt"])])
            b[k] = rng.choice(junk)
        code, body = s.post(rng.choice(["/v1/completions", "/v1/chat/completions"]), body=b)
        try:
            json.loads(body)
            good = code in (200, 400, 404, 413)
        except ValueError:
            good = False
        if not good:
            bad_answers += 1
            print(f"     fuzz: {b} -> {code} {body[:120]!r}")
    check(bad_answers == 0 and s.get("/health")[0] == 200, "150 fuzzed bodies: JSON answers, the server alive")

    # A client that goes away mid-stream: its request is cancelled and its cache freed.
    cancelled0 = s.metric("twell_requests_cancelled_total")
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)  # every recv below waits 10 s at most
    body = json.dumps({"prompt": "Tell me a long story", "max_tokens": 400, "temperature": 0, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    t0 = time.time()
    while got.count(b"data: ") < 3 and time.time() - t0 < 30:
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            break
        if not chunk:
            break
        got += chunk
    sock.close()
    t0 = time.time()
    while time.time() - t0 < 30 and not (s.metric("twell_requests_cancelled_total") > cancelled0
                                         and s.metric("twell_kv_tokens_used") == 0):
        time.sleep(0.2)
    check(s.metric("twell_requests_cancelled_total") > cancelled0 and s.metric("twell_kv_tokens_used") == 0,
          "a client gone mid-stream: cancelled, its KV cache freed")
    text = s.get("/metrics")[1]
    for name in ("twell_time_to_first_token_seconds_count", "twell_inter_token_latency_seconds_bucket",
                 "twell_generation_tokens_total", "twell_ffn_sparse_row_share", "twell_requests_queued"):
        check(name in text, f"/metrics has {name}")

    # SIGTERM while requests run: they end (finished or told), the server exits 0. A client of its own,
    # with no pooled connections: the shared one's idle keep-alive connections may be closed by the
    # server (cpp-httplib: 5 s idle) just as a stream reuses one, which with max_retries=0 fails that
    # stream at once (seen once in CI: one APIConnectionError before any token) for a reason that
    # has nothing to do with shutting down.
    sig_client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    results = []
    def streamer():
        try:
            n = 0
            for ch in sig_client.completions.create(model=NAME, prompt="Count slowly:", max_tokens=60, temperature=0,
                                                    stream=True):
                n += 1
            results.append(("done", n))
        except Exception as e:  # noqa: BLE001 (any ending is fine, a hang is not)
            results.append(("error", type(e).__name__))
    ts = [threading.Thread(target=streamer) for _ in range(4)]
    for t in ts:
        t.start()
    time.sleep(1.0)
    rc = s.stop(timeout=90)
    for t in ts:
        t.join(30)
    check(rc == 0, f"SIGTERM with 4 streams running: exit {rc}; streams {results}")
    check(len(results) == 4 and all(r[0] == "done" for r in results), "the running streams were drained to their end")

    # The API key, and a full queue answered at once.
    s2 = Server("--api-key", "sekrit", "--max-running", "1", "--max-queue", "1")
    check(s2.get("/health")[0] == 200 and s2.get("/v1/models")[0] == 401, "API key: /health open, /v1/models 401 without it")
    check(s2.get("/v1/models", headers={"Authorization": "Bearer sekrit"})[0] == 200, "API key: 200 with it")
    auth = {"Authorization": "Bearer sekrit", "Content-Type": "application/json"}
    codes = []
    def long_req():
        codes.append(s2.post("/v1/completions", body={"prompt": "a", "max_tokens": 200, "temperature": 0,
                                                      "ignore_eos": True}, headers=auth)[0])
    def wait_metric(name, value):  # up to 30 s: the scheduler admits between its steps
        t0 = time.time()
        while time.time() - t0 < 30 and s2.metric(name, auth) != value:
            time.sleep(0.02)
        return s2.metric(name, auth) == value
    ts = [threading.Thread(target=long_req) for _ in range(4)]
    ts[0].start()
    running = wait_metric("twell_requests_running", 1)
    ts[1].start()
    queued = wait_metric("twell_requests_queued", 1)
    for t in ts[2:]:  # the slot and the queue are taken: both are refused at once
        t.start()
        t.join(30)
    early = sorted(codes)
    for t in ts[:2]:
        t.join(180)
    check(running and queued and early == [503, 503] and sorted(codes) == [200, 200, 503, 503],
          f"max-running 1, max-queue 1: the third and fourth refused at once ({early}), the first two served ({sorted(codes)})")
    check(s2.stop() == 0, "second server exits 0")

    # The paged KV cache: a budget of 150 positions is 10 blocks of 16. Five requests of 10 + 60
    # positions (5 blocks each when done) are all admitted on their prompts' blocks and grow: the
    # pool runs out, the most recent ones are preempted (their blocks freed) and recomputed later,
    # and each answer still equals the same request served alone. The blocks held never pass the
    # pool; a request that could never fit is refused up front.
    s3 = Server("--kv-tokens", "150", "--max-running", "8")
    total3 = s3.metric("twell_kv_tokens_total")
    check(total3 == 160 and s3.metric("twell_kv_blocks_total") == 10, f"KV budget 150: a pool of 10 blocks of 16 ({total3})")
    kv_body = lambda i: {"prompt": list(range(10 + i, 20 + i)), "max_tokens": 60, "temperature": 0, "ignore_eos": True}
    solo3 = []
    for i in range(5):
        code, body = s3.post("/v1/completions", body=kv_body(i))
        solo3.append(json.loads(body)["choices"][0]["text"] if code == 200 else None)
    pre0 = s3.metric("twell_preemptions_total")
    peak, stop_poll = [0.0], threading.Event()
    def poll():
        while not stop_poll.is_set():
            v = s3.metric("twell_kv_tokens_used")
            if v is not None:
                peak[0] = max(peak[0], v)
            time.sleep(0.02)
    poller = threading.Thread(target=poll)
    poller.start()
    res3 = [None] * 5
    def kv_req(i):
        res3[i] = s3.post("/v1/completions", body=kv_body(i))
    ts = [threading.Thread(target=kv_req, args=(i,)) for i in range(5)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(180)
    stop_poll.set()
    poller.join()
    codes3 = [r[0] if r else None for r in res3]
    texts3 = [json.loads(r[1])["choices"][0]["text"] if r and r[0] == 200 else None for r in res3]
    preempted = s3.metric("twell_preemptions_total") - pre0
    check(codes3 == [200] * 5 and 0 < peak[0] <= 160, f"KV pool of 160 positions: 5 requests of 70 all served, peak {peak[0]:.0f} held")
    check(preempted > 0, f"the pool ran out: {preempted:.0f} preemption(s)")
    check(texts3 == solo3, "each preempted-and-recomputed answer equals its solo run")
    if texts3 != solo3:
        for i in range(5):
            if texts3[i] != solo3[i]:
                print(f"     {i}: served {texts3[i]!r} vs solo {solo3[i]!r}")
    t0 = time.time()
    while time.time() - t0 < 30 and s3.metric("twell_kv_blocks_used") != 0:
        time.sleep(0.02)
    check(s3.metric("twell_kv_blocks_used") == 0, "every block back in the pool after")
    code, body = s3.post("/v1/completions", body={"prompt": "a", "max_tokens": 200})
    check(code == 400 and "KV budget" in body, f"a request past the KV budget: HTTP {code} {body[:120]}")
    check(s3.stop() == 0, "third server exits 0")
    print(f"{'FAILED: ' + str(len(FAILS)) + ' check(s)' if FAILS else 'passed'} ({time.time() - t_start:.0f} s)")
    return 1 if FAILS else 0


if __name__ == "__main__":
    try:
        rc = main()
    finally:
        for srv in SERVERS:  # a check that raised leaves no server behind
            srv.kill()
    sys.exit(rc)
