#!/usr/bin/env python3
"""Configuration fuzz of twell's runtime against Hugging Face `transformers` itself.

    python3 tests/model/hf_config_fuzz.py --tool MODEL_LOGITS [--device cpu|cuda] [--fresh N]
                                          [--seed S | --case NAME] [--no-refusals | --refusals-only] [--keep DIR]

Each case is a random tiny Llama (LlamaConfig + LlamaForCausalLM) or Mistral (MistralConfig +
MistralForCausalLM) made by transformers with random weights and saved by transformers' own
save_pretrained (bf16 / fp16 / fp32, sometimes sharded), never by the project's writers. Drawn per
case: head_dim (64, 80, 96, 128, 256; not hidden/heads), query/KV head ratio (MHA … MQA), tied or
untied head, odd vocabulary, rope_theta (log-uniform 1e4 … 1e6), RoPE type (default, linear,
dynamic, llama3, yarn with their parameters), rms_norm_eps, ReLU (dense / sparse / automatic FFN
path) or SiLU, Mistral's sliding_window (none, shorter than the prompt, longer), 2-3 prompts of
different lengths in one batch (1 … 2048 tokens), fed whole or in small chunks through the KV cache.

Reference: the saved checkpoint loaded back by transformers in float64 (so it sees the same rounded
weights), eager attention on the CPU, each sequence alone (no padding), logits at every position;
greedy continuations from transformers' generate(do_sample=False). twell: tests/model/model_logits
(all sequences as one batch). Measure per sequence: max |twell - ref| / max |ref|.
Greedy: twell's tokens must equal transformers'; a first difference where transformers' own top-2
margin is within 2 * bound * max|logit| (either could flip) is reported as a tie, not a failure.
Cases with `legacy` also rewrite config.json to the pre-5 layout (top-level rope_theta, rope_scaling
with "type" or "rope_type", no rope_parameters; transformers reads it back to the same
rope_parameters, which is checked) and twell's output must be the same bit for bit.

A second part rewrites the config.json of one small checkpoint. Settings the runtime does not
implement (longrope, partial_rotary_factor, attention / MLP biases, logit soft-caps, rope_parameters
disagreeing with a top-level rope_theta or rope_scaling) must be refused: model_logits exits 1 with
one line "model_logits: <message>" naming the key. Edits that transformers reads as the same network
(checked on its logits: an agreeing rope_theta / rope_scaling next to rope_parameters,
pretraining_tp 1 or 2, a sliding_window on a Llama) must be accepted with the same output bit for bit.

Bounds (derived above TOL_CPU_DENSE below): CPU dense 2e-5 + 4 * 2^-24 * P (P: the longest prompt +
the greedy tokens; the second term is transformers' float32 RoPE angles, not twell's error), CPU
ReLU on the TwELL path 1e-2 + the same, CUDA 6e-2.
Exit 1 if anything fails; 77 (ctest: skipped) without torch / transformers / numpy.
"""
import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories only
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
try:
    import numpy as np
    import torch
    import transformers
    from transformers import (AutoConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM)
except ImportError as e:
    print(f"skipped: {e} (pip install torch transformers numpy)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "convert"))
import safetensors_np as stnp  # noqa: E402

transformers.logging.set_verbosity_error()  # yarn's factor-vs-ratio and similar notices are expected here
transformers.logging.disable_progress_bar()

GREEDY_N = 8
HEAD_DIMS = (64, 80, 96, 128, 256)
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# ---------------------------------------------------------------------------------------------------
# Bounds (max |twell - ref| / max |ref| per sequence), P = the longest prompt + GREEDY_N tokens.
#
# The reference is not float64 throughout: transformers computes RoPE's inv_freq, the angles
# position * inv_freq and their cos / sin in float32 (LlamaRotaryEmbedding.forward), RMSNorm in
# float32 (LlamaRMSNorm) and the eager softmax in float32, whatever the model's dtype; twell computes
# the angles in double. The norm and softmax roundings are 2^-24 relative and do not grow (against
# tools/convert/ref_llama.py, all float64: 1.3e-7 at short positions). The RoPE ones grow with the
# position: inv_freq carries up to 6-10 u of relative rounding (u = 2^-24; measured over 300 drawn
# configurations for every rope type, against the same transformers functions run in float64: its
# theta ** (i / d) in float32 rounds the exponent, which ln(theta) ~ 14 amplifies), so the relative
# rotation of a query at p and a key at p' is off by ~(p - p') * 10u rad, plus u * p from rounding the
# angle itself. Measured on 3-layer models at P = 2048 (q, k up to 256 wide, init 0.1):
#   twell vs transformers with the angles patched to float64: <= 4.8e-6 at every position (flat);
#   transformers vs its float64-angle self / vs ref_llama.py:  grows ~linearly with the position;
#   so twell vs transformers = k * u * P with k <= 1.4 over ~45 drawn configurations (yarn, init 0.1;
#   llama3 <= 0.6, default / linear / dynamic <= 0.3), i.e. up to 1.7e-4 at P = 2048.
# Hence every CPU bound is base + 4 u P (3x the worst k seen; at P = 2048 that is 4.9e-4, at P <= 64
# it is below 1.6e-5), with base:
#   dense FFN path 2e-5: model_parity.py's fp32 bound (accumulation over K <= 1536 at u each, over
#       2-3 layers; here K <= 512) against a reference whose non-growing roundings are ~1e-7;
#       measured <= 7e-6 on short prompts. A wrong rope parameter, position, window or head moves the
#       logits by 1e-3 ... O(1).
#   ReLU on the TwELL path (sparse, automatic) 1e-2: TwELL stores act(gate) as bf16 (2^-9 relative).
#       In sparse mode the reference models that rounding (Bf16Gate, as ref_llama.py's gate_bf16), so
#       what is left is a gate value within fp32 noise of a bf16 rounding boundary rounding the other
#       way, amplified through the layers (measured <= 1.6e-3 over 3 layers; model_parity.py saw 3e-3);
#       automatic mode's first call runs the TwELL path unmodelled (measured <= 4.1e-3).
# CUDA (bf16 weights, activations, KV cache): hf_parity.py's 6e-2.
U = 2.0 ** -24
TOL_CPU_DENSE = 2e-5
TOL_CPU_TWELL = 1e-2
TOL_ROPE_K = 4
TOL_CUDA = 6e-2


# ---------------------------------------------------------------------------------------------------
# Case drawing


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


HIDDEN_MULTIPLE = 1  # hidden sizes are drawn as multiples of this (8 for --device cuda: see draw)


def draw(seed, ov=None):
    """One case from its seed; `ov` overrides named draws (the other draws are unchanged: every
    draw consumes the generator whether or not it is overridden)."""
    ov = dict(ov or {})
    given = set(ov)
    r = random.Random(seed)

    def pick(key, fn):
        v = fn()
        return ov.pop(key, v)

    c = {"seed": seed}
    c["arch"] = pick("arch", lambda: r.choice(["llama", "mistral"]))
    c["dtype"] = pick("dtype", lambda: r.choice(list(DTYPES)))
    c["layers"] = pick("layers", lambda: r.randint(1, 3))
    c["head_dim"] = pick("head_dim", lambda: r.choice(HEAD_DIMS))
    c["heads"] = pick("heads", lambda: r.randint(1, 4))
    c["kv_heads"] = pick("kv_heads", lambda: r.choice(divisors(c["heads"])))
    # transformers requires hidden_size % num_attention_heads == 0 even with an explicit head_dim.
    c["hidden"] = pick("hidden", lambda: c["heads"] * r.randint(-(-64 // c["heads"]), 256 // c["heads"]))
    if HIDDEN_MULTIPLE > 1:  # the CUDA runtime refuses K not a multiple of 8 by name (16-byte row loads)
        m = math.lcm(c["heads"], HIDDEN_MULTIPLE)
        c["hidden"] = -(-c["hidden"] // m) * m
    c["intermediate"] = pick("intermediate", lambda: r.randint(128, 512))
    c["vocab"] = pick("vocab", lambda: r.randint(97, 1000))
    c["tied"] = pick("tied", lambda: r.random() < 0.5)
    c["eps"] = pick("eps", lambda: r.choice([1e-5, 1e-6, 1e-8]))
    c["act"] = pick("act", lambda: r.choice(["relu", "silu"]))
    c["mode"] = pick("mode", lambda: r.choice(["dense", "sparse", "auto"]) if c["act"] == "relu" else "auto")
    c["init"] = pick("init", lambda: round(r.uniform(0.05, 0.1), 3))
    # Prompts: 2-3 distinct lengths, log-uniform up to 256 (up to 2048 one case in eight).
    n_seqs = pick("n_seqs", lambda: r.randint(2, 3))
    top = 2048 if r.random() < 0.125 else 256
    lengths = sorted({max(1, int(round(math.exp(r.uniform(0, math.log(top)))))) for _ in range(n_seqs)})
    while len(lengths) < n_seqs:
        lengths = sorted(set(lengths) | {r.randint(1, top)})
    c["lengths"] = pick("lengths", lambda: lengths)
    c["chunk"] = pick("chunk", lambda: r.choice([0, 0, 0, 1, 2, 3, 5, 8, 16]))
    c["window"] = None
    if c["arch"] == "mistral":
        kind = r.choice(["none", "short", "long"])
        if kind == "short":
            w = r.randint(8, 64)
            if max(c["lengths"]) <= w and "lengths" not in given:
                c["lengths"] = sorted(set(c["lengths"][:-1]) | {w + r.randint(1, 64)})
            c["window"] = w
        elif kind == "long":
            c["window"] = max(c["lengths"]) + GREEDY_N + r.randint(0, 300)
        c["window"] = pick("window", lambda: c["window"])
    need = max(c["lengths"]) + GREEDY_N
    c["max_pos"] = pick("max_pos", lambda: need + r.randint(0, 512) if r.random() < 0.5 else
                        max(2048, 1 << (need - 1).bit_length()))
    c["theta"] = pick("theta", lambda: float(f"{10 ** r.uniform(4, 6):.6g}"))
    rt = pick("rope_type", lambda: r.choice(ROPE_TYPES))
    rope = {"rope_type": rt, "rope_theta": c["theta"]}
    factor = round(r.uniform(1.0, 8.0), 3)
    if rt in ("linear", "dynamic"):
        rope["factor"] = factor
    elif rt == "llama3":
        rope["factor"] = factor
        if r.random() < 0.5:
            rope["low_freq_factor"], rope["high_freq_factor"] = 1.0, 4.0
        else:
            lo = round(r.uniform(0.5, 2.0), 3)
            rope["low_freq_factor"], rope["high_freq_factor"] = lo, round(lo + r.uniform(0.5, 4.0), 3)
        rope["original_max_position_embeddings"] = r.randint(16, c["max_pos"] - 1)
    elif rt == "yarn":
        rope["factor"] = factor
        rope["original_max_position_embeddings"] = r.randint(16, c["max_pos"])
        if r.random() < 0.4:
            rope["beta_fast"], rope["beta_slow"] = round(r.uniform(8, 64), 3), round(r.uniform(0.5, 4), 3)
        u = r.random()
        if u < 0.25:
            rope["attention_factor"] = round(r.uniform(0.5, 1.5), 4)
        elif u < 0.55:
            rope["mscale"], rope["mscale_all_dim"] = round(r.uniform(0.5, 1.5), 3), round(r.uniform(0.5, 1.5), 3)
        if r.random() < 0.3:
            rope["truncate"] = False
    rope_extra = ov.pop("rope", {})
    rope.update(rope_extra)
    c["rope"] = {k: v for k, v in rope.items() if v is not None}
    c["shard"] = pick("shard", lambda: r.random() < 0.3)
    c["legacy"] = pick("legacy", lambda: r.choice([None, None, None, "type", "rope_type"]))
    # Chunked feeding of long prompts: at most ~512 calls.
    if c["chunk"] and max(c["lengths"]) / c["chunk"] > 512:
        c["chunk"] = -(-max(c["lengths"]) // 512)
    if ov:
        raise SystemExit(f"unknown override(s) {sorted(ov)}")
    return c


# Named cases: a seed plus overrides, together covering every axis at least once. Bounded sizes:
# the whole CPU run (these, 4 fresh draws and the refusals) stays within a few minutes on 2 cores.
CASES = [
    ("llama-default-gqa", 11, dict(arch="llama", rope_type="default", theta=10000.0, act="silu", mode="auto",
                                   head_dim=64, heads=4, kv_heads=2, hidden=128, dtype="bf16", lengths=[1, 17, 40],
                                   chunk=0, eps=1e-5, tied=True, legacy=None)),
    ("llama-default-mha-theta", 12, dict(arch="llama", rope_type="default", act="relu", mode="dense", head_dim=80,
                                         heads=3, kv_heads=3, hidden=192, dtype="fp32", lengths=[5, 33], chunk=3,
                                         eps=1e-6, tied=False, shard=True, legacy="rope_type")),
    ("llama-long-2048", 13, dict(arch="llama", rope_type="default", act="silu", mode="auto", head_dim=64, heads=2,
                                 kv_heads=1, hidden=64, intermediate=128, layers=2, dtype="bf16",
                                 lengths=[3, 2040], chunk=0, vocab=257, theta=500000.0, max_pos=2048, legacy=None)),
    ("llama-mqa-hd256-relu-sparse", 14, dict(arch="llama", rope_type="linear", act="relu", mode="sparse",
                                             head_dim=256, heads=4, kv_heads=1, hidden=128, layers=2, dtype="bf16",
                                             lengths=[2, 29, 64], chunk=5, eps=1e-8, legacy="type")),
    ("llama-hd96-relu-auto-fp16", 15, dict(arch="llama", rope_type="dynamic", act="relu", mode="auto", head_dim=96,
                                           heads=2, kv_heads=2, hidden=96, layers=2, dtype="fp16", lengths=[7, 100],
                                           chunk=0, shard=True, legacy=None)),
    ("llama3-default-freqs", 16, dict(arch="llama", rope_type="llama3", act="silu", head_dim=128, heads=2,
                                      kv_heads=1, hidden=128, dtype="bf16", lengths=[9, 300], chunk=16, max_pos=2048,
                                      rope=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                original_max_position_embeddings=256), legacy="rope_type")),
    ("llama3-random-freqs", 17, dict(arch="llama", rope_type="llama3", act="relu", mode="dense", head_dim=64,
                                     heads=4, kv_heads=4, hidden=256, dtype="fp32", lengths=[1, 50, 129], chunk=2,
                                     rope=dict(factor=3.5, low_freq_factor=0.75, high_freq_factor=2.5,
                                               original_max_position_embeddings=64), legacy=None)),
    ("yarn-plain", 18, dict(arch="llama", rope_type="yarn", act="silu", head_dim=64, heads=2, kv_heads=2, hidden=64,
                            dtype="bf16", lengths=[4, 90], chunk=0, max_pos=512,
                            rope=dict(factor=4.0, original_max_position_embeddings=128, beta_fast=None,
                                      beta_slow=None, attention_factor=None, mscale=None, mscale_all_dim=None,
                                      truncate=None), legacy="type")),
    ("yarn-beta-mscale-notrunc", 19, dict(arch="llama", rope_type="yarn", act="silu", head_dim=128, heads=1,
                                          kv_heads=1, hidden=128, dtype="fp32", lengths=[12, 77], chunk=3,
                                          rope=dict(factor=2.5, original_max_position_embeddings=200,
                                                    beta_fast=24.0, beta_slow=2.0, attention_factor=None,
                                                    mscale=1.2, mscale_all_dim=0.8, truncate=False),
                                          legacy=None)),
    ("yarn-attention-factor", 20, dict(arch="mistral", rope_type="yarn", act="relu", mode="dense", head_dim=80,
                                       heads=2, kv_heads=1, hidden=160, dtype="bf16", lengths=[30, 31], chunk=0,
                                       window=None, rope=dict(factor=6.0, original_max_position_embeddings=64,
                                                              attention_factor=0.85, mscale=None,
                                                              mscale_all_dim=None), legacy="rope_type")),
    ("mistral-window-short", 21, dict(arch="mistral", rope_type="default", act="silu", head_dim=64, heads=4,
                                      kv_heads=2, hidden=128, dtype="bf16", lengths=[6, 40, 150], chunk=0, window=16,
                                      legacy=None)),
    ("mistral-window-short-chunked", 22, dict(arch="mistral", rope_type="linear", act="relu", mode="sparse",
                                              head_dim=128, heads=2, kv_heads=1, hidden=64, layers=2, dtype="fp16",
                                              lengths=[3, 70], chunk=7, window=33, legacy=None)),
    ("mistral-window-long", 23, dict(arch="mistral", rope_type="default", act="silu", head_dim=96, heads=3,
                                     kv_heads=1, hidden=96, dtype="fp32", lengths=[2, 60], chunk=1, window=500,
                                     shard=True, legacy=None)),
    ("mistral-odd-vocab-tied", 24, dict(arch="mistral", rope_type="dynamic", act="silu", head_dim=256, heads=1,
                                        kv_heads=1, hidden=64, dtype="bf16", lengths=[1, 2, 45], chunk=0, vocab=997,
                                        tied=True, window=None, eps=1e-8, legacy="type")),
    # Long prompts where the scaled RoPE and the window matter most (positions up to ~2000).
    ("yarn-long-chunked", 25, dict(arch="llama", rope_type="yarn", act="relu", mode="dense", head_dim=128, heads=4,
                                   kv_heads=2, hidden=128, layers=2, intermediate=256, dtype="bf16",
                                   lengths=[700, 1990], chunk=64, max_pos=2048, theta=500000.0,
                                   rope=dict(factor=4.0, original_max_position_embeddings=512, beta_fast=None,
                                             beta_slow=None, attention_factor=None, mscale=None,
                                             mscale_all_dim=None, truncate=None), legacy="type")),
    ("mistral-window-long-prompt", 26, dict(arch="mistral", rope_type="llama3", act="silu", head_dim=80, heads=2,
                                            kv_heads=1, hidden=128, layers=2, intermediate=256, dtype="fp16",
                                            lengths=[64, 1100], chunk=37, window=50, max_pos=4096,
                                            rope=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                      original_max_position_embeddings=256),
                                            legacy="rope_type")),
]


# ---------------------------------------------------------------------------------------------------
# Checkpoints (transformers only)


def hf_config(c):
    kw = dict(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["intermediate"],
              num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
              head_dim=c["head_dim"], hidden_act=c["act"], max_position_embeddings=c["max_pos"],
              rms_norm_eps=c["eps"], tie_word_embeddings=c["tied"], initializer_range=c["init"],
              rope_parameters=dict(c["rope"]))
    if c["arch"] == "mistral":
        return MistralConfig(sliding_window=c["window"], **kw), MistralForCausalLM
    return LlamaConfig(**kw), LlamaForCausalLM


def save_checkpoint(c, d):
    cfg, cls = hf_config(c)
    torch.manual_seed(c["seed"])
    with torch.no_grad():
        m = cls(cfg).eval()
        # RMSNorm weights start at 1: perturb them so that a norm weight applied wrongly shows.
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.6, 1.4)
    m = m.to(DTYPES[c["dtype"]])
    kw = {}
    if c["shard"]:
        nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
        kw["max_shard_size"] = max(nbytes // 3, 1)
    m.save_pretrained(d, **kw)
    return cls


def legacy_config(d_src, d_dst, style):
    """A copy of d_src whose config.json has the pre-5 layout: top-level rope_theta, rope_scaling with
    the type under `style` ("type" or "rope_type"; null for default RoPE), no rope_parameters."""
    os.makedirs(d_dst)
    for f in os.listdir(d_src):
        if f != "config.json":
            os.symlink(os.path.join(d_src, f), os.path.join(d_dst, f))
    j = json.load(open(os.path.join(d_src, "config.json")))
    rp = dict(j.pop("rope_parameters"))
    j["rope_theta"] = rp.pop("rope_theta")
    t = rp.pop("rope_type")
    rp.pop("type", None)
    j["rope_scaling"] = None if t == "default" else {style: t, **rp}
    json.dump(j, open(os.path.join(d_dst, "config.json"), "w"), indent=2)


class Bf16Gate(torch.nn.Module):
    """act(gate) rounded to bf16, as twell's TwELL (sparse) path stores it (nearest even of fp32)."""

    def __init__(self, act):
        super().__init__()
        self.act = act

    def forward(self, g):
        return self.act(g).to(torch.float32).to(torch.bfloat16).to(g.dtype)


def hf_reference(cls, d, c, seqs):
    """float64 logits [len, V] per sequence (each alone), greedy tokens and their per-step raw logits."""
    m = cls.from_pretrained(d, dtype=torch.float64, attn_implementation="eager").eval()
    if c["mode"] == "sparse":
        for layer in m.model.layers:
            layer.mlp.act_fn = Bf16Gate(layer.mlp.act_fn)
    # twell's greedy ignores end-of-sequence ids: so must transformers (a None in the call's
    # GenerationConfig would be filled from the model's, which has eos_token_id 2).
    m.generation_config.eos_token_id = None
    gc = GenerationConfig(max_new_tokens=GREEDY_N, do_sample=False, eos_token_id=None, bos_token_id=None,
                          pad_token_id=0)
    logits, gen, steps = [], [], []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s])
            logits.append(m(ids).logits[0].numpy())
            # An explicit mask: without one generate() infers it from pad_token_id and would mask out
            # any prompt token that happens to equal it.
            out = m.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc, output_logits=True,
                             return_dict_in_generate=True)
            toks = out.sequences[0, len(s):].tolist()
            sl = [x[0].numpy() for x in out.logits]
            if len(toks) != GREEDY_N or any(int(np.argmax(sl[k])) != toks[k] for k in range(GREEDY_N)):
                raise RuntimeError(f"harness: transformers' generate is not plain greedy here ({toks})")
            gen.append(toks)
            steps.append(sl)
    return logits, gen, steps


# ---------------------------------------------------------------------------------------------------
# twell


def twell(tool, d, seqs, mode, chunk, device, greedy_n, timeout=600):
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "o.safetensors")
        ids = ";".join(",".join(map(str, s)) for s in seqs)
        r = subprocess.run([tool, d, ids, out, mode, str(chunk), "-", str(greedy_n), device], capture_output=True,
                           text=True, timeout=timeout)
        if r.returncode:
            return None, (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return stnp.load_file(out), None


def bound(c, device):
    if device == "cuda":
        return TOL_CUDA
    base = TOL_CPU_TWELL if c["act"] == "relu" and c["mode"] in ("sparse", "auto") else TOL_CPU_DENSE
    return base + TOL_ROPE_K * U * (max(c["lengths"]) + GREEDY_N)


def run_case(name, c, args, work):
    d = os.path.join(work, name)
    cls = save_checkpoint(c, d)
    r = random.Random(c["seed"] ^ 0x5EED)
    seqs = [[r.randrange(c["vocab"]) for _ in range(n)] for n in c["lengths"]]
    tol = bound(c, args.device)
    row = dict(name=name, c=c, tol=tol, err=float("nan"), greedy="-", layout="", ok=False, note="")
    got, why = twell(args.tool, d, seqs, c["mode"], c["chunk"], args.device, GREEDY_N)
    if got is None:
        row["note"] = why
        return row
    ref, ref_gen, ref_steps = hf_reference(cls, d, c, seqs)
    errs = [float(np.max(np.abs(got[f"logits_{i}"].astype(np.float64) - ref[i])) / np.max(np.abs(ref[i])))
            for i in range(len(seqs))]
    row["err"] = max(errs)
    ok = row["err"] <= tol
    marks = []
    for i in range(len(seqs)):
        g = [int(t) for t in got[f"greedy_{i}"]]
        if g == ref_gen[i]:
            marks.append("=")
            continue
        k = next((k for k in range(min(len(g), GREEDY_N)) if g[k] != ref_gen[i][k]), min(len(g), GREEDY_N))
        if k >= len(g) or k >= GREEDY_N:
            marks.append(f"short({len(g)})")
            ok = False
            continue
        top = np.sort(ref_steps[i][k])[-2:]
        margin = float(top[1] - top[0])
        tie = margin <= 2 * tol * float(np.max(np.abs(ref_steps[i][k])))
        marks.append(f"tie@{k}" if tie else f"DIFF@{k}")
        ok = ok and tie
    row["greedy"] = ",".join(marks)
    if c["legacy"]:
        dl = d + "-legacy"
        legacy_config(d, dl, c["legacy"])
        hf_rp = AutoConfig.from_pretrained(dl).rope_parameters
        want = dict(AutoConfig.from_pretrained(d).rope_parameters)
        if {k: v for k, v in hf_rp.items() if k != "type"} != want:
            row["note"] = f"harness: transformers reads the legacy layout as {hf_rp}, not {want}"
            ok = False
        got2, why = twell(args.tool, dl, seqs, c["mode"], c["chunk"], args.device, GREEDY_N)
        if got2 is None:
            row["layout"] = "REFUSED"
            row["note"] = f"legacy layout: {why}"
            ok = False
        elif set(got2) != set(got) or any(not np.array_equal(got[k], got2[k]) for k in got):
            row["layout"] = "DIFFERS"
            ok = False
        else:
            row["layout"] = "same"
    row["ok"] = ok
    return row


# ---------------------------------------------------------------------------------------------------
# Refusals


def refusal_cases(base):
    """(name, config.json edit, words of which the error must name one)."""
    rp = base["rope_parameters"]
    half = base["head_dim"] // 2
    return [
        ("longrope", lambda j: j.update(rope_parameters={**rp, "rope_type": "longrope", "short_factor": [1.0] * half,
                                                         "long_factor": [2.0] * half,
                                                         "original_max_position_embeddings": 64}), ["longrope"]),
        ("longrope-legacy", lambda j: (j.pop("rope_parameters"), j.update(
            rope_theta=rp["rope_theta"], rope_scaling={"type": "longrope", "short_factor": [1.0] * half,
                                                       "long_factor": [2.0] * half,
                                                       "original_max_position_embeddings": 64})), ["longrope"]),
        ("partial-rotary-in-rope", lambda j: j["rope_parameters"].update(partial_rotary_factor=0.5),
         ["partial_rotary_factor"]),
        ("partial-rotary-top", lambda j: j.update(partial_rotary_factor=0.5), ["partial_rotary_factor"]),
        ("attention-bias", lambda j: j.update(attention_bias=True), ["attention_bias"]),
        ("mlp-bias", lambda j: j.update(mlp_bias=True), ["mlp_bias"]),
        ("final-logit-softcap", lambda j: j.update(final_logit_softcapping=30.0), ["final_logit_softcapping"]),
        ("attn-logit-softcap", lambda j: j.update(attn_logit_softcapping=50.0), ["attn_logit_softcapping"]),
        ("rope-theta-disagrees", lambda j: j.update(rope_theta=rp["rope_theta"] * 2), ["rope_theta"]),
        ("rope-scaling-disagrees", lambda j: (j["rope_parameters"].update(rope_type="linear", factor=2.0),
                                              j.update(rope_scaling={"rope_type": "linear", "factor": 4.0})),
         ["rope_scaling", "rope_parameters"]),
    ]


ACCEPTED = [
    # Controls: edits that transformers 5 reads as the same network (checked here on its float64
    # logits); twell must load them and give the base's output bit for bit.
    ("rope-theta-agrees", lambda j: j.update(rope_theta=j["rope_parameters"]["rope_theta"])),
    ("rope-scaling-agrees", lambda j: j.update(rope_scaling=dict(j["rope_parameters"]))),
    ("pretraining-tp-1", lambda j: j.update(pretraining_tp=1)),
    # pretraining_tp > 1: transformers 4.x sliced the same products into that many pieces; 5.x ignores
    # the key. Either way the same function, so it is accepted rather than refused.
    ("pretraining-tp-2", lambda j: j.update(pretraining_tp=2)),
    # LlamaForCausalLM has no sliding window (only Mistral's model applies the key).
    ("llama-sliding-window", lambda j: j.update(sliding_window=4)),
]


def edited_copy(base, base_j, d, edit):
    os.makedirs(d)
    for f in os.listdir(base):
        if f != "config.json":
            os.symlink(os.path.join(base, f), os.path.join(d, f))
    j = json.loads(json.dumps(base_j))
    edit(j)
    json.dump(j, open(os.path.join(d, "config.json"), "w"), indent=2)


def run_refusals(args, work):
    c = draw(99, dict(arch="llama", layers=1, head_dim=64, heads=2, kv_heads=1, hidden=64, intermediate=128,
                      vocab=101, dtype="fp32", rope_type="default", theta=10000.0, act="silu", lengths=[2, 3],
                      shard=False, legacy=None))
    base = os.path.join(work, "refusal-base")
    save_checkpoint(c, base)
    base_j = json.load(open(os.path.join(base, "config.json")))
    ids = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [5, 6]]

    def hf_logits(d):
        with torch.no_grad():
            m = LlamaForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="eager").eval()
            return m(torch.tensor([ids[0]])).logits[0].numpy()

    base_hf = hf_logits(base)
    base_tw, why = twell(args.tool, base, ids, "auto", 0, args.device, 2)
    fails = 0
    print(f"\n{'config edit':24s} {'result':6s} twell")
    if base_tw is None:
        print(f"{'base':24s} FAIL   {why}")
        return 1
    for name, edit in ACCEPTED:
        d = os.path.join(work, "accept-" + name)
        edited_copy(base, base_j, d, edit)
        if not np.array_equal(hf_logits(d), base_hf):
            ok, msg = False, "harness: transformers reads this edit as a different network"
        else:
            got, why = twell(args.tool, d, ids, "auto", 0, args.device, 2)
            ok = got is not None and set(got) == set(base_tw) and all(np.array_equal(got[k], base_tw[k]) for k in got)
            msg = ("accepted, same output as the base" if ok else
                   f"refused: {why}" if got is None else "accepted but the output differs from the base")
        fails += not ok
        print(f"{name:24s} {'ok' if ok else 'FAIL':6s} {msg}")
    for name, edit, words in refusal_cases(base_j):
        d = os.path.join(work, "refuse-" + name)
        edited_copy(base, base_j, d, edit)
        r = subprocess.run([args.tool, d, "1,2", os.path.join(d, "o.safetensors"), "auto", "0", "-", "0",
                            args.device], capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        ok = (r.returncode == 1 and len(lines) == 1 and lines[0].startswith("model_logits: ")
              and any(w in lines[0] for w in words))
        msg = (r.stderr.strip().replace(d + "/", "") if r.returncode else
               "accepted (should be refused, naming " + " or ".join(words) + ")")
        fails += not ok
        print(f"{name:24s} {'ok' if ok else 'FAIL':6s} {msg[:160]}")
    return fails


# ---------------------------------------------------------------------------------------------------


def describe_rope(rope):
    t = rope["rope_type"]
    extra = {k: v for k, v in rope.items() if k not in ("rope_type", "rope_theta")}
    short = {"factor": "f", "original_max_position_embeddings": "orig", "low_freq_factor": "lo",
             "high_freq_factor": "hi", "beta_fast": "bf", "beta_slow": "bs", "attention_factor": "af",
             "mscale": "ms", "mscale_all_dim": "msa", "truncate": "trunc"}
    return f"{t}" + ("(" + ",".join(f"{short.get(k, k)}={v}" for k, v in extra.items()) + ")" if extra else "") + \
        f" θ={rope['rope_theta']:.3g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", required=True, help="tests/model/model_logits")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--fresh", type=int, default=None, help="fresh random draws (default 4 on CPU, 8 on CUDA)")
    ap.add_argument("--seed", type=int, action="append", help="run only the draw of this seed (repeatable)")
    ap.add_argument("--case", action="append", help="run only this named case (repeatable)")
    ap.add_argument("--no-refusals", action="store_true")
    ap.add_argument("--refusals-only", action="store_true")
    ap.add_argument("--keep", help="write the checkpoints under this directory and keep them")
    ap.add_argument("--list", action="store_true", help="list the named cases and exit")
    args = ap.parse_args()
    global HIDDEN_MULTIPLE
    HIDDEN_MULTIPLE = 8 if args.device == "cuda" else 1
    if args.list:
        for name, seed, ov in CASES:
            print(f"{name:30s} seed {seed:3d}  {draw(seed, ov)}")
        return 0
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 4)))
    names = {n for n, _, _ in CASES}
    for n in args.case or []:
        if n not in names:
            raise SystemExit(f"unknown case {n!r} (--list)")
    todo = []
    if args.case or args.seed:
        todo += [(n, s, ov) for n, s, ov in CASES if n in (args.case or [])]
        todo += [(f"seed-{s}", s, {}) for s in args.seed or []]
    elif not args.refusals_only:
        todo += CASES
        fresh = args.fresh if args.fresh is not None else (4 if args.device == "cpu" else 8)
        sys_rng = random.SystemRandom()
        seeds = [sys_rng.randrange(1 << 31) for _ in range(fresh)]
        if seeds:
            print("fresh seeds: " + " ".join(map(str, seeds)) + "  (reproduce: --seed S)")
        todo += [(f"seed-{s}", s, {}) for s in seeds]
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    work = tempfile.mkdtemp(prefix="hf_config_fuzz-", dir=args.keep)
    if args.keep:
        print(f"checkpoints kept under {work}")
    t0 = time.time()
    fails = 0
    try:
        if todo:
            hdr = (f"{'case':30s} {'arch':7s} {'dtype':5s} {'L':>1s} {'hd':>3s} {'h/kv':>5s} {'rope':48s} "
                   f"{'window':>6s} {'lengths':14s} {'chunk':>5s} {'mode':6s} {'max rel err':>11s} {'bound':>8s} "
                   f"{'greedy':14s} {'legacy':8s} result")
            print(hdr)
        for name, seed, ov in todo:
            c = draw(seed, ov)
            t1 = time.time()
            try:
                row = run_case(name, c, args, work)
            except Exception as e:  # noqa: BLE001 (a transformers error on a drawn config: report, go on)
                row = dict(err=float("nan"), tol=float("nan"), greedy="-", layout="", ok=False,
                           note=f"error: {type(e).__name__}: {e}")
            fails += not row["ok"]
            lay = f"{c['legacy']}:{row['layout']}" if c["legacy"] else ""
            print(f"{name:30s} {c['arch']:7s} {c['dtype']:5s} {c['layers']:1d} {c['head_dim']:3d} "
                  f"{c['heads']:>2d}/{c['kv_heads']:<2d} {describe_rope(c['rope'])[:48]:48s} "
                  f"{str(c['window']) if c['window'] else '-':>6s} {','.join(map(str, c['lengths'])):14s} "
                  f"{c['chunk']:5d} {c['act'][:1]}:{c['mode']:4s} {row['err']:11.2e} {row['tol']:8.1e} "
                  f"{row['greedy']:14s} {lay:8s} {'ok' if row['ok'] else 'FAIL'} ({time.time() - t1:.1f} s)"
                  + (f"  {row['note']}" if row["note"] else ""))
            if not row["ok"]:
                print(f"    reproduce: {'--case ' + name if ov else '--seed ' + str(seed)}; config {c}")
        if not args.no_refusals and not (args.case or args.seed):
            fails += run_refusals(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'FAILED' if fails else 'passed'}: {fails} failure(s), {time.time() - t0:.0f} s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
