#!/usr/bin/env python3
"""The PyTorch-side yardstick for bench_serve.py: transformers' continuous batching behind a small
OpenAI-compatible HTTP front end (Python's standard library only).

    python3 bench/serve/torch_server.py --model DIR [--port 8090] [--device cuda] [--dtype bf16]
        [--attn sdpa] [--max-batch-tokens N]

`transformers serve` needs FastAPI, uvicorn and the openai package, which the GPU machine lacks; its
engine is the same one used here: `model.init_continuous_batching()` (transformers' paged KV cache,
its scheduler, chunked prefill, one background thread stepping the batch). This file adds only HTTP:
`POST /v1/completions` (prompt as token ids or text; max_tokens; temperature 0, i.e. greedy; stream with
stream_options.include_usage; ignore_eos), `GET /v1/models`, `GET /health`. Other parameters are
refused with a 400 that names them, so a benchmark never measures something other than it asked.
One router thread moves the manager's outputs to per-request queues (transformers' own
`request_id_iter` re-queues every foreign result it sees, which costs O(streams) a token).
"""
import argparse
import json
import queue
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ALLOWED = {"model", "prompt", "max_tokens", "temperature", "stream", "stream_options", "ignore_eos", "seed", "n"}


class Engine:
    def __init__(self, a):
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
        t0 = time.time()
        self.model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation=a.attn)
        self.model = self.model.to(a.device).eval()
        self.tokenizer = None
        try:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(a.model)
        except Exception:  # noqa: BLE001 (token-id prompts need none)
            pass
        eos = self.model.config.eos_token_id
        self.eos = -1 if eos is None else eos
        gc = GenerationConfig(max_new_tokens=a.max_new_tokens, do_sample=False, eos_token_id=self.eos,
                              pad_token_id=0 if self.model.config.pad_token_id is None else self.model.config.pad_token_id)
        if a.max_batch_tokens:
            gc.max_batch_tokens = a.max_batch_tokens
        self.manager = self.model.init_continuous_batching(generation_config=gc)
        self.manager.start()
        self.lock = threading.Lock()
        self.queues = {}
        self.counter = 0
        threading.Thread(target=self._route, daemon=True).start()
        print(f"torch_server: {a.model} on {a.device} ({a.dtype}, attention {a.attn}) loaded in "
              f"{time.time() - t0:.1f} s; transformers continuous batching", flush=True)

    def _route(self):
        while True:
            r = self.manager.get_result(timeout=0.1)
            if r is None:
                continue
            with self.lock:
                q = self.queues.get(r.request_id)
            if q is not None:
                q.put(r)

    def submit(self, ids, max_tokens, ignore_eos):
        with self.lock:
            rid = f"r{self.counter}"
            self.counter += 1
            q = self.queues[rid] = queue.Queue()
        self.manager.add_request(ids, request_id=rid, max_new_tokens=max_tokens, streaming=True,
                                 eos_token_id=-1 if ignore_eos else self.eos)
        return rid, q

    def release(self, rid, finished):
        if not finished:
            self.manager.cancel_request(rid)
        with self.lock:
            self.queues.pop(rid, None)

    def text(self, ids):
        return self.tokenizer.decode(ids) if self.tokenizer else "".join(f" {i}" for i in ids)


ENGINE = None
MODEL_NAME = ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, code, msg):
        self.reply(code, {"error": {"message": msg, "type": "invalid_request_error", "code": code}})

    def do_GET(self):
        if self.path == "/health":
            self.reply(200 if ENGINE else 503, {"status": "ok" if ENGINE else "loading"})
        elif self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "transformers"}]})
        else:
            self.error(404, f"no route {self.path}")

    def do_POST(self):
        if self.path != "/v1/completions":
            return self.error(404, f"no route {self.path}")
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        except (ValueError, UnicodeDecodeError) as e:
            return self.error(400, f"the body is not JSON: {e}")
        if not isinstance(body, dict):
            return self.error(400, "the body must be a JSON object")
        unknown = sorted(set(body) - ALLOWED)
        if unknown:
            return self.error(400, f"unsupported parameters: {', '.join(unknown)}")
        if body.get("temperature", 1.0) != 0:
            return self.error(400, "only greedy decoding (temperature 0) is served")
        if body.get("n", 1) != 1:
            return self.error(400, "n must be 1")
        p = body.get("prompt")
        if isinstance(p, str):
            if ENGINE.tokenizer is None:
                return self.error(400, "this model has no tokenizer: send token ids")
            ids = ENGINE.tokenizer.encode(p)
        elif isinstance(p, list) and p and all(isinstance(i, int) for i in p):
            ids = p
        else:
            return self.error(400, "prompt must be a string or a non-empty list of token ids")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return self.error(400, "max_tokens must be a positive integer")
        rid, q = ENGINE.submit(ids, max_tokens, bool(body.get("ignore_eos", False)))
        stream = bool(body.get("stream", False))
        usage_chunk = bool((body.get("stream_options") or {}).get("include_usage", False))
        sent, finished = 0, False
        created = int(time.time())
        try:
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
            out = []
            while True:
                r = q.get(timeout=600)
                if r.error:
                    raise RuntimeError(r.error)
                new = list(r.generated_tokens[sent:])
                sent += len(new)
                out += new
                finished = r.is_finished()
                if stream and new:
                    chunk = {"id": rid, "object": "text_completion", "created": created, "model": MODEL_NAME,
                             "choices": [{"index": 0, "text": ENGINE.text(new), "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                if finished:
                    break
            reason = "length" if len(out) >= max_tokens else "stop"
            usage = {"prompt_tokens": len(ids), "completion_tokens": len(out), "total_tokens": len(ids) + len(out)}
            if stream:
                end = {"id": rid, "object": "text_completion", "created": created, "model": MODEL_NAME,
                       "choices": [{"index": 0, "text": "", "finish_reason": reason}]}
                self.wfile.write(f"data: {json.dumps(end)}\n\n".encode())
                if usage_chunk:
                    u = {"id": rid, "object": "text_completion", "created": created, "model": MODEL_NAME,
                         "choices": [], "usage": usage}
                    self.wfile.write(f"data: {json.dumps(u)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True
            else:
                self.reply(200, {"id": rid, "object": "text_completion", "created": created, "model": MODEL_NAME,
                                 "choices": [{"index": 0, "text": ENGINE.text(out), "finish_reason": reason}],
                                 "usage": usage})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # noqa: BLE001 (one request's failure is its reply, not the server's end)
            if not stream:
                self.error(500, f"{type(e).__name__}: {e}")
        finally:
            ENGINE.release(rid, finished)


def main():
    global ENGINE, MODEL_NAME
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-name", default="")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8090)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--attn", default="sdpa", help="transformers attn_implementation (continuous batching switches it to its paged form)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="default when a request gives none")
    ap.add_argument("--max-batch-tokens", type=int, default=0, help="tokens a step may hold (0: transformers' choice)")
    a = ap.parse_args()
    MODEL_NAME = a.model_name or a.model.rstrip("/").split("/")[-1]
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    server.daemon_threads = True
    print(f"torch_server: listening on http://{a.host}:{server.server_address[1]}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ENGINE = Engine(a)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
