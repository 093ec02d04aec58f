#!/usr/bin/env python3
"""Dense PyTorch yardsticks for `twell bench model`, on the same checkpoint and the same GPU.

    python3 bench/model/torch_yardstick.py MODEL_DIR [--json OUT] [--prefill-batch 8 --prefill-len 512]
                                             [--context 128 --decode-steps 128 --reps 3] [--decode-batch 1 8 32 64]

Hugging Face `transformers`' LlamaForCausalLM in bf16 with PyTorch's SDPA attention, three ways:
  eager       the paper's baseline;
  compile     torch.compile (default mode) of the forward, for prefill;
  compile+graphs  decode with a static KV cache and torch.compile(mode="reduce-overhead",
              fullgraph=True), which replays CUDA graphs;
and the same checkpoint through bench/model/fast_llama.py ("fast"): a lean gpt-fast-style body
(stacked QKV and gate-up GEMMs, static cache, the greedy pick inside the step), compiled the same
ways — the strongest dense PyTorch we can write (transformers' general model decodes the 2B shape
at ≈ 258 tokens/s on an H100, a compiled lean body at ≈ 376: ../shared/reference/model_anchors.md).
Its greedy tokens are compared with transformers' (agreement reported: bf16 near-ties may differ).
Prefill: one forward of B prompts of L random tokens with only the last position's logits (as
twell's runtime computes them), medians of --reps after warm-up. Decode: greedy, a prompt of
--context tokens then --decode-steps new tokens; time per step = (generate(steps) − generate(1)) /
(steps − 1), so the prompt's prefill is not counted. Batch 1 runs every row; larger batches
(--decode-batch) run the lean body's rows (B prompts of random tokens, one static cache of B
sequences, B tokens a step: tokens/s = B / time per step), as `twell bench model --decode-batch B`
decodes B sequences of the same context. Same conventions as `twell
bench model` (random tokens, greedy pick included). Each phase is timed separately and reported as
it finishes; one that fails (an old transformers, a compile error) is reported with its error and
the others still run. The JSON holds every number and the versions.
"""
import argparse
import json
import statistics
import sys
import time

try:
    import torch
    import transformers
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)


def sync_time(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def last_logits_kwargs(model, ids):
    """The keyword that keeps only the last position's logits, in this transformers version."""
    for kw in ("logits_to_keep", "num_logits_to_keep"):
        try:
            with torch.inference_mode():
                model(ids[:, :8], use_cache=False, **{kw: 1})
            return {kw: 1}
        except TypeError:
            continue
    return {}


def prefill_rate(fn, tokens, reps):
    for _ in range(2):
        sync_time(fn)
    times = [sync_time(fn) for _ in range(reps)]
    return tokens / statistics.median(times), times


def decode_rate(model, prompt, steps, reps, **gen):
    def run(n):
        with torch.inference_mode():
            return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                  pad_token_id=0, **gen)
    return per_token_rate(run, steps, reps, warmup=2)


def per_token_rate(run, steps, reps, warmup):
    """tokens/s from (T(run(steps)) − T(run(1))) / (steps − 1), medians of reps after warm-up runs."""
    for _ in range(warmup):
        run(steps)
        run(1)
    per_token = []
    for _ in range(reps):
        full = sync_time(lambda: run(steps))
        one = sync_time(lambda: run(1))
        per_token.append((full - one) / (steps - 1))
    return 1.0 / statistics.median(per_token), per_token


def decode_rate_graphs(model, prompt, steps, reps, mode="reduce-overhead"):
    """Greedy decode through a StaticCache with one compiled step (torch.compile, CUDA graphs under
    mode "reduce-overhead"), our own loop: transformers' generate() with a compiled forward reads
    a CUDA-graph output after the next replay in transformers 5 (its cache's step counter), so
    each step here starts with torch.compiler.cudagraph_mark_step_begin() and keeps only the
    argmax. Time per token as decode_rate: (T(steps) − T(1)) / (steps − 1), prefill excluded."""
    from transformers import StaticCache

    ctx = prompt.shape[1]
    cache = StaticCache(config=model.config, max_cache_len=ctx + steps + 1)

    def step(ids, pos):
        out = model(input_ids=ids, past_key_values=cache, cache_position=pos, position_ids=pos.unsqueeze(0),
                    use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    compiled = torch.compile(step, mode=mode, fullgraph=True, dynamic=False)  # static shapes (fast_decode_rate)

    def run(n):
        with torch.inference_mode():
            cache.reset()
            nxt = step(prompt, torch.arange(ctx, device=prompt.device))  # the prompt, eagerly
            for i in range(n - 1):
                torch.compiler.cudagraph_mark_step_begin()
                nxt = compiled(nxt, torch.tensor([ctx + i], device=prompt.device)).clone()
        return nxt

    return per_token_rate(run, steps, reps, warmup=3)  # the warm-up compiles and records


def fast_model(model, max_len, batch, cache=True, attn="sdpa"):
    """bench/model/fast_llama.py's FastLlama with a copy of model's weights (cache=False: for
    prefill only, as transformers' prefill here runs with use_cache=False; attn: its attention over
    the cache, "sdpa" or "math")."""
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fast_llama import FastLlama
    return FastLlama.from_hf(model, max_len=max_len, batch=batch, cache=cache, attn=attn)


def capture_step(compiled, ids_in, pos_in):
    """Compiles and warms up compiled(ids_in, pos_in) on a side stream (3 calls), then captures one
    call into a torch.cuda.CUDAGraph: (the graph, the call's output buffer)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            compiled(ids_in, pos_in)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = compiled(ids_in, pos_in)
    return g, out


def fast_decode_rate(fast, prompt, steps, reps, mode="reduce-overhead", graph=False):
    """Greedy decode through FastLlama, one compiled step (CUDA graphs under "reduce-overhead");
    time per token as decode_rate. graph: the compiled step (a mode without CUDA graphs) captured
    once into a torch.cuda.CUDAGraph of our own over static id and position buffers and replayed
    each step, rather than inductor's graph trees. Returns (rate, per-token seconds, the greedy ids
    of one run)."""
    ctx = prompt.shape[1]
    # Static shapes: FastLlama.decode is one code object for every instance, and a compilation after
    # another batch's without torch._dynamo.reset() (the caller resets before each row) would be a
    # recompilation with the batch made symbolic (TORCH_LOGS=dynamic on the CPU: "marking L['ids']
    # as dynamic").
    compiled = torch.compile(fast.decode, mode=mode, fullgraph=True, dynamic=False)
    ids = []
    step = compiled
    if graph:
        ids_in = torch.zeros(prompt.shape[0], 1, dtype=torch.long, device=prompt.device)
        pos_in = torch.zeros(1, dtype=torch.long, device=prompt.device)
        held = {}  # the captured graph and its output buffer, made at the first step

        def step(nxt_col, pos):
            ids_in.copy_(nxt_col)
            pos_in.copy_(pos)
            if "graph" not in held:
                # The warm-up steps write the cache at this position with these ids, as the step
                # itself does: the same bytes.
                held["graph"], held["out"] = capture_step(compiled, ids_in, pos_in)
            held["graph"].replay()
            return held["out"]

    def run(n):
        ids.clear()
        with torch.inference_mode():
            nxt = fast.prefill(prompt)  # the prompt, eagerly
            ids.append(nxt)
            for i in range(n - 1):
                if not graph:
                    torch.compiler.cudagraph_mark_step_begin()
                nxt = step(nxt[:, None], torch.tensor([ctx + i], device=prompt.device)).clone()
                ids.append(nxt)
        return nxt

    rate, per = per_token_rate(run, steps, reps, warmup=3)
    run(steps)
    return rate, per, torch.stack(ids, dim=1)


def compile_mode(mode):
    """A --fast-modes entry → (torch.compile mode, inductor's coordinate_descent_tuning, own graph).
    "X+cdt" is mode X with coordinate-descent tuning of the generated Triton kernels — gpt-fast's
    setting for its decode step (reduce-overhead, CUDA graphs, tuned GEMV-like reductions);
    max-autotune tunes too. "X+graph" captures mode X's compiled step into a CUDA graph of our own
    (fast_decode_rate); X must not make graphs itself (default or max-autotune-no-cudagraphs)."""
    base, *suffixes = mode.split("+")
    unknown = [x for x in suffixes if x not in ("cdt", "graph")]
    if unknown or len(set(suffixes)) != len(suffixes):
        raise ValueError(f"unknown or repeated suffix in fast mode {mode!r} (known: +cdt, +graph)")
    graph = "graph" in suffixes
    if graph and base not in ("default", "max-autotune-no-cudagraphs"):
        raise ValueError(f"fast mode {mode!r}: +graph captures a step compiled without CUDA graphs "
                         "(default or max-autotune-no-cudagraphs)")
    return base, "cdt" in suffixes or base.startswith("max-autotune"), graph


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--json")
    ap.add_argument("--prefill-batch", type=int, default=8)
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--decode-steps", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode-batch", type=int, nargs="+", default=[1],
                    help="decode batch sizes (default 1); batches above 1 run the lean body's rows only")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-prefill", action="store_true", help="only the decode phases")
    ap.add_argument("--skip-decode", action="store_true", help="only the prefill phases")
    ap.add_argument("--decode-compile-mode", default="reduce-overhead", help="torch.compile mode of the decode step")
    ap.add_argument("--skip-fast", action="store_true", help="leave out the lean body (bench/model/fast_llama.py)")
    ap.add_argument("--skip-hf-decode", action="store_true",
                    help="leave out transformers' decode rows (eager, compiled + graphs; minutes of compilation): "
                         "the lean body's rows alone, e.g. its slow-compiling +cdt mode in a call of its own")
    ap.add_argument("--fast-modes", default="reduce-overhead",
                    help="comma-separated torch.compile modes for the lean body's decode step, one row each "
                         "(e.g. reduce-overhead,reduce-overhead+cdt,max-autotune: '+cdt' adds inductor's "
                         "coordinate-descent tuning of the generated kernels, gpt-fast's decode setting; "
                         "max-autotune tunes too; '+graph' on default or max-autotune-no-cudagraphs captures "
                         "the compiled step into a CUDA graph of our own; all replay CUDA graphs)")
    ap.add_argument("--fast-attn", default="sdpa,math",
                    help="comma-separated attentions for the lean body's decode, a row each with every mode: "
                         "sdpa (scaled_dot_product_attention with the position mask) or math (q·Kᵀ, softmax, ·V "
                         "written out for inductor to fuse)")
    a = ap.parse_args()
    if any(b < 1 for b in a.decode_batch):
        ap.error(f"--decode-batch: batch sizes are at least 1, not {a.decode_batch}")
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 77
    torch.manual_seed(a.seed)
    out = {"model": a.model, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "transformers": transformers.__version__, "prefill_batch": a.prefill_batch,
           "prefill_len": a.prefill_len, "context": a.context, "decode_steps": a.decode_steps,
           "reps": a.reps, "decode_batches": a.decode_batch, "results": {}}

    def report(name, value, extra):
        out["results"][name] = dict(tokens_per_s=value, **extra)
        print(f"{name:<32} {value:12.1f} tokens/s", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)

    def fail(name, e):
        out["results"][name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        print(f"{name:<32} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.cuda().eval()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (a.prefill_batch, a.prefill_len), device="cuda")
    kw = last_logits_kwargs(model, ids)
    tokens = a.prefill_batch * a.prefill_len

    def prefill(m):
        with torch.inference_mode():
            m(ids, use_cache=False, **kw)

    if not a.skip_prefill:
        rate, times = prefill_rate(lambda: prefill(model), tokens, a.reps)
        report("prefill eager", rate, {"seconds": times})
        try:
            t0 = time.perf_counter()
            compiled = torch.compile(model)
            prefill(compiled)
            warm = time.perf_counter() - t0
            rate, times = prefill_rate(lambda: prefill(compiled), tokens, a.reps)
            report("prefill compile", rate, {"seconds": times, "compile_seconds": warm})
            del compiled
        except Exception as e:  # noqa: BLE001 — reported, the other phases still run
            fail("prefill compile", e)

    if not a.skip_prefill and not a.skip_fast:
        try:
            fast = fast_model(model, a.prefill_len, a.prefill_batch, cache=False)
            t0 = time.perf_counter()
            fast_prefill = torch.compile(fast.logits)
            with torch.inference_mode():
                fast_prefill(ids)
            warm = time.perf_counter() - t0

            def run_fast_prefill():
                with torch.inference_mode():
                    fast_prefill(ids)

            rate, times = prefill_rate(run_fast_prefill, tokens, a.reps)
            report("prefill fast compile", rate, {"seconds": times, "compile_seconds": warm})
            del fast, fast_prefill
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            fail("prefill fast compile", e)

    if a.skip_decode:
        return 0
    prompt = torch.randint(0, vocab, (1, a.context), device="cuda")
    if not a.skip_hf_decode:
        rate, per = decode_rate(model, prompt, a.decode_steps, a.reps)
        report("decode b1 eager", rate, {"seconds_per_token": per})
    with torch.inference_mode():  # the lean body's greedy tokens are checked against these
        hf_ids = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=a.decode_steps,
                                min_new_tokens=a.decode_steps, do_sample=False, pad_token_id=0)[:, a.context:]
    if not a.skip_hf_decode:
        try:
            torch._dynamo.reset()
            rate, per = decode_rate_graphs(model, prompt, a.decode_steps, a.reps, mode=a.decode_compile_mode)
            report("decode b1 compile+graphs", rate, {"seconds_per_token": per, "mode": a.decode_compile_mode})
        except Exception as e:  # noqa: BLE001
            fail("decode b1 compile+graphs", e)
    fast_rows = [(m, at) for m in a.fast_modes.split(",") if m for at in a.fast_attn.split(",") if at]
    for batch in sorted(set(a.decode_batch)):
        prompts = prompt if batch == 1 else torch.randint(0, vocab, (batch, a.context), device="cuda")
        for mode, attn in ([] if a.skip_fast else fast_rows):
            name = (f"decode b{batch} fast compile+graphs" + ("" if mode == "reduce-overhead" else f" {mode}") +
                    ("" if attn == "sdpa" else f" {attn} attention"))
            print(f"{name}: compiling and timing ...", flush=True)  # compilations take minutes: say which
            try:
                torch._dynamo.reset()
                base, cdt, own_graph = compile_mode(mode)
                torch._inductor.config.coordinate_descent_tuning = cdt
                fast = fast_model(model, a.context + a.decode_steps + 1, batch, attn=attn)
                skips = counters["inductor"]["cudagraph_skips"]
                rate, per, fast_ids = fast_decode_rate(fast, prompts, a.decode_steps, a.reps, mode=base, graph=own_graph)
                # Inductor falls back to plain launches where it cannot capture a graph, and says so
                # only in the perf_hints log: a row whose step was not one CUDA graph is no yardstick.
                skipped = counters["inductor"]["cudagraph_skips"] - skips
                extra = {"seconds_per_step": per, "batch": batch, "mode": mode, "attention": attn,
                         "cudagraph_skips": skipped}
                if skipped:
                    print(f"  WARNING: inductor skipped CUDA graphs {skipped} time(s) in this row: its step ran "
                          "as plain launches (TORCH_LOGS=perf_hints says why)", flush=True)
                if batch == 1:  # transformers' greedy tokens are of the batch-1 prompt
                    same = int((fast_ids.cpu() == hf_ids.cpu()).cumprod(dim=1).sum())
                    extra["greedy_tokens_equal_to_transformers"] = f"{same} of {a.decode_steps} (leading)"
                    print(f"  fast decode's greedy tokens ({mode}, {attn}): the first {same} of {a.decode_steps} "
                          "equal transformers' eager", flush=True)
                report(name, batch * rate, extra)  # steps/s × tokens a step
                del fast
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001
                fail(name, e)
            finally:
                torch._inductor.config.coordinate_descent_tuning = False
    return 0


if __name__ == "__main__":
    sys.exit(main())
