#!/usr/bin/env python3
"""Independent float64 NumPy reference forward pass of a Hugging Face Llama checkpoint.

    ref_llama.py --model DIR --tokens "1,2,3;4,5" --out FILE.npz [--all-positions] [--hidden-act ACT]
    ref_llama.py --model DIR (--tokens IDS | --prompt TEXT) --generate N [--stop-at-eos] [--out FILE.npz]
    ref_llama.py --self-test

The checkpoint is DIR/config.json plus DIR/model.safetensors, or shards listed in
DIR/model.safetensors.index.json ("weight_map"); tensors may be BF16, F16 or F32 and are widened to
float64. Sequences are separated by ';' and are independent (position ids restart at 0, no batching
or padding). Math, all in float64:
    x = embed[ids]
    per layer:  h = rmsnorm(x, w_in);  q,k,v = h Wq^T, h Wk^T, h Wv^T  (split into heads)
                q,k = rope(q), rope(k)      HF convention: rotate_half, non-interleaved halves,
                                            inv_freq[i] = theta^(-2i/head_dim), positions 0..T-1
                a = softmax(q k^T / sqrt(head_dim) + causal mask) v  (GQA: query head h reads
                                            KV head h // (n_heads / n_kv_heads), as HF's repeat_kv)
                x = x + a Wo^T
                h = rmsnorm(x, w_post);  x = x + (act(h Wg^T) * (h Wu^T)) Wd^T
    logits = rmsnorm(x, w_final) (lm_head or embed)^T        rmsnorm(x, w) = x / sqrt(mean(x^2) + eps) * w
act comes from config.json "hidden_act" (silu, relu, gelu [erf], gelu_pytorch_tanh) unless --hidden-act
overrides it (the SparseLM configs say "silu" for a ReLU MLP).

Output npz: logits_{i} (float64; [len_i, vocab] with --all-positions, else [vocab] for the last
position) and ids_{i} (int64 input ids); with --generate also gen_{i} (the new ids). --generate N runs
greedy decoding (argmax, recomputing the full forward per step) and prints one line per sequence:
"gen_{i}: id,id,..." and, if DIR/tokenizer.json and the `tokenizers` package are available, the
decoded text. --prompt TEXT tokenizes TEXT with DIR/tokenizer.json (special tokens such as
<|im_start|> are recognised in the text).

Importable: load_model(dir, hidden_act=None) -> Model; forward(model_or_dir, ids_list, hidden_act=None,
all_positions=False) -> list of arrays; greedy(model_or_dir, ids, n) -> list of ids;
layer_inputs(...) for the per-layer hooks tiny_llama.py uses to calibrate sparsity.
Errors (unsupported config, missing/mismatched tensors) raise RefError; the CLI prints them and exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ next to the sources (not git-ignored)
import safetensors_np as stnp  # noqa: E402


if __name__ == "__main__":  # let `import ref_llama` (tiny_llama in the self-test) get this same module
    sys.modules.setdefault("ref_llama", sys.modules[__name__])


class RefError(Exception):
    pass


# --------------------------------------------------------------------------------------------------
# activations (float64)

_erf = np.frompyfunc(math.erf, 1, 1)


def _gelu_erf(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _silu(x):
    # x * sigmoid(x), written to avoid overflow in exp for large |x|
    return x * np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


ACTIVATIONS = {
    "silu": _silu, "swish": _silu,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": _gelu_erf,
    "gelu_pytorch_tanh": _gelu_tanh, "gelu_new": _gelu_tanh,
}


# --------------------------------------------------------------------------------------------------
# checkpoint loading

class Model:
    """A loaded checkpoint: config values and float64 weights (HF names)."""

    def __init__(self, cfg: dict, weights: dict, hidden_act: str, path: str = ""):
        self.cfg = cfg
        self.w = weights
        self.path = path
        self.d = int(cfg["hidden_size"])
        self.ffn = int(cfg["intermediate_size"])
        self.n_layers = int(cfg["num_hidden_layers"])
        self.n_heads = int(cfg["num_attention_heads"])
        self.n_kv = int(cfg.get("num_key_value_heads") or self.n_heads)
        self.head_dim = int(cfg.get("head_dim") or self.d // self.n_heads)
        self.vocab = int(cfg["vocab_size"])
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.theta = rope_theta(cfg)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.act_name = hidden_act
        self.act = ACTIVATIONS[hidden_act]
        self.lm_head = self.w["model.embed_tokens.weight"] if self.tied else self.w["lm_head.weight"]


def rope_theta(cfg: dict) -> float:
    rp = cfg.get("rope_parameters")  # transformers >= 5 spelling
    if isinstance(rp, dict):
        if rp.get("rope_type", "default") != "default":
            raise RefError(f"unsupported rope_parameters.rope_type {rp.get('rope_type')!r} (only 'default')")
        if "rope_theta" in rp:
            return float(rp["rope_theta"])
    return float(cfg.get("rope_theta", 10000.0))


def check_config(cfg: dict) -> None:
    if cfg.get("model_type", "llama") != "llama":
        raise RefError(f"model_type {cfg.get('model_type')!r} is not 'llama'")
    if cfg.get("rope_scaling") not in (None, {}):
        raise RefError(f"rope_scaling {cfg['rope_scaling']!r} is not supported (must be null)")
    for k in ("attention_bias", "mlp_bias"):
        if cfg.get(k):
            raise RefError(f"{k}=true is not supported")
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if k not in cfg:
            raise RefError(f"config.json lacks {k}")
    H = int(cfg["num_attention_heads"])
    KV = int(cfg.get("num_key_value_heads") or H)
    if H % KV:
        raise RefError(f"num_attention_heads {H} is not a multiple of num_key_value_heads {KV}")
    hd = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // H)
    if hd % 2:
        raise RefError(f"head_dim {hd} is odd")
    if cfg.get("partial_rotary_factor", 1.0) not in (1, 1.0, None):
        raise RefError("partial_rotary_factor != 1 is not supported")


def expected_shapes(cfg: dict) -> dict:
    d, f, V = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["vocab_size"])
    H = int(cfg["num_attention_heads"])
    KV = int(cfg.get("num_key_value_heads") or H)
    hd = int(cfg.get("head_dim") or d // H)
    s = {"model.embed_tokens.weight": (V, d), "model.norm.weight": (d,)}
    if not cfg.get("tie_word_embeddings", False):
        s["lm_head.weight"] = (V, d)
    for i in range(int(cfg["num_hidden_layers"])):
        p = f"model.layers.{i}."
        s.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                  p + "self_attn.q_proj.weight": (H * hd, d), p + "self_attn.k_proj.weight": (KV * hd, d),
                  p + "self_attn.v_proj.weight": (KV * hd, d), p + "self_attn.o_proj.weight": (d, H * hd),
                  p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                  p + "mlp.down_proj.weight": (d, f)})
    return s


def _tensor_files(model_dir: str) -> dict:
    """name -> file, from the index (sharded) or the single model.safetensors."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(idx):
        with open(idx) as f:
            wm = json.load(f).get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise RefError(f"{idx}: no weight_map")
        return {k: os.path.join(model_dir, v) for k, v in wm.items()}
    if os.path.isfile(single):
        header, _, _ = stnp.read_header(single)
        return {k: single for k in header}
    raise RefError(f"{model_dir}: neither model.safetensors nor model.safetensors.index.json")


def load_model(model_dir: str, hidden_act: str | None = None) -> Model:
    cfg_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(cfg_path):
        raise RefError(f"{cfg_path}: not found")
    with open(cfg_path) as f:
        cfg = json.load(f)
    check_config(cfg)
    act = hidden_act or cfg.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise RefError(f"unsupported hidden_act {act!r} (have {', '.join(sorted(ACTIVATIONS))})")
    files = _tensor_files(model_dir)
    want = expected_shapes(cfg)
    missing = sorted(set(want) - set(files))
    if missing:
        raise RefError(f"checkpoint lacks {len(missing)} tensors, e.g. {', '.join(missing[:4])}")
    extra = sorted(set(files) - set(want))
    extra_ok = {"lm_head.weight"}  # a tied checkpoint may carry a copy; HF ignores it
    bad = [n for n in extra if n not in extra_ok and not n.endswith("rotary_emb.inv_freq")]
    if bad:
        raise RefError(f"checkpoint has {len(bad)} unexpected tensors, e.g. {', '.join(bad[:4])}")
    by_file: dict = {}
    for n in want:
        by_file.setdefault(files[n], []).append(n)
    weights = {}
    for path, names in by_file.items():
        if not os.path.isfile(path):
            raise RefError(f"shard {path} not found")
        for n, a in stnp.load_file(path, names).items():
            if tuple(a.shape) != tuple(want[n]):
                raise RefError(f"{n}: shape {tuple(a.shape)}, expected {tuple(want[n])} from config.json")
            if a.dtype.kind != "f":
                raise RefError(f"{n}: dtype {a.dtype} is not floating point")
            weights[n] = a.astype(np.float64)
    return Model(cfg, weights, act, model_dir)


_CACHE: dict = {}


def _model(model_or_dir, hidden_act=None) -> Model:
    if isinstance(model_or_dir, Model):
        if hidden_act and hidden_act != model_or_dir.act_name:
            return Model(model_or_dir.cfg, model_or_dir.w, hidden_act, model_or_dir.path)
        return model_or_dir
    key = (os.path.abspath(model_or_dir), hidden_act)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = load_model(model_or_dir, hidden_act)
    return _CACHE[key]


# --------------------------------------------------------------------------------------------------
# forward

def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_cos_sin(T: int, head_dim: int, theta: float):
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # [hd/2]
    freqs = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]          # [T, hd/2]
    emb = np.concatenate([freqs, freqs], axis=-1)                                # [T, hd]
    return np.cos(emb), np.sin(emb)


def rotate_half(x: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x: [T, heads, hd]; cos/sin: [T, hd]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def attention(m: Model, i: int, h: np.ndarray, cos, sin) -> np.ndarray:
    p = f"model.layers.{i}.self_attn."
    T = h.shape[0]
    hd, H, KV = m.head_dim, m.n_heads, m.n_kv
    q = (h @ m.w[p + "q_proj.weight"].T).reshape(T, H, hd)
    k = (h @ m.w[p + "k_proj.weight"].T).reshape(T, KV, hd)
    v = (h @ m.w[p + "v_proj.weight"].T).reshape(T, KV, hd)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rep = H // KV
    k = np.repeat(k, rep, axis=1)  # [T, H, hd]: query head j reads KV head j // rep
    v = np.repeat(v, rep, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    s = np.where(np.tril(np.ones((T, T), dtype=bool))[None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    pr = np.exp(s)
    pr /= pr.sum(axis=-1, keepdims=True)
    o = np.einsum("hqk,khd->qhd", pr, v).reshape(T, H * hd)
    return o @ m.w[p + "o_proj.weight"].T


def mlp(m: Model, i: int, h: np.ndarray, capture: dict | None = None) -> np.ndarray:
    p = f"model.layers.{i}.mlp."
    g = h @ m.w[p + "gate_proj.weight"].T
    if capture is not None:
        capture.setdefault("ffn_in", []).append(h)
        capture.setdefault("gate", []).append(g)
    ag = m.act(g)
    if getattr(m, "gate_bf16", False):
        # twell's TwELL format holds the gate values as bf16 (round to nearest even of the fp32 value)
        ag = stnp.bf16_bits_to_f32(stnp.f32_to_bf16_bits(ag.astype(np.float32))).astype(np.float64)
    a = ag * (h @ m.w[p + "up_proj.weight"].T)
    return a @ m.w[p + "down_proj.weight"].T


def hidden_states(m: Model, ids, capture_layers: dict | None = None, stop_layer: int | None = None):
    """Final-norm input [T, d] of one sequence. capture_layers: {layer: dict} filled by mlp()."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0:
        raise RefError("each sequence needs at least one token id")
    if ids.min() < 0 or ids.max() >= m.vocab:
        raise RefError(f"token id out of range [0, {m.vocab})")
    T = ids.size
    cos, sin = rope_cos_sin(T, m.head_dim, m.theta)
    x = m.w["model.embed_tokens.weight"][ids]
    for i in range(m.n_layers if stop_layer is None else stop_layer + 1):
        p = f"model.layers.{i}."
        x = x + attention(m, i, rmsnorm(x, m.w[p + "input_layernorm.weight"], m.eps), cos, sin)
        cap = None if capture_layers is None else capture_layers.get(i)
        x = x + mlp(m, i, rmsnorm(x, m.w[p + "post_attention_layernorm.weight"], m.eps), cap)
    return x


def logits_from_hidden(m: Model, x: np.ndarray) -> np.ndarray:
    return rmsnorm(x, m.w["model.norm.weight"], m.eps) @ m.lm_head.T


def forward(model_dir, ids_list, hidden_act=None, all_positions=False, gate_bf16=False):
    """Logits (float64) for each sequence: [len, vocab] if all_positions else [vocab] (last).
    gate_bf16: round act(gate) to bf16 before the product, as twell's TwELL sparse path stores it."""
    m = _model(model_dir, hidden_act)
    if gate_bf16:
        m = Model(m.cfg, m.w, m.act_name, m.path)
        m.gate_bf16 = True
    out = []
    for ids in ids_list:
        x = hidden_states(m, ids)
        lg = logits_from_hidden(m, x if all_positions else x[-1:])
        out.append(lg if all_positions else lg[0])
    return out


def layer_inputs(model_dir, ids_list, layers, hidden_act=None):
    """{layer: {"ffn_in": [T_total, d], "gate": [T_total, ffn]}} over all sequences (pre-activation)."""
    m = _model(model_dir, hidden_act)
    caps = {i: {} for i in layers}
    for ids in ids_list:
        hidden_states(m, ids, caps, stop_layer=max(layers))
    return {i: {k: np.concatenate(v, axis=0) for k, v in c.items()} for i, c in caps.items()}


def greedy(model_dir, ids, n: int, hidden_act=None, stop_ids=()):
    """Greedy continuation: n new ids (fewer if one of stop_ids is produced; it is included)."""
    m = _model(model_dir, hidden_act)
    seq = [int(t) for t in ids]
    new = []
    for _ in range(n):
        x = hidden_states(m, seq)
        nxt = int(np.argmax(logits_from_hidden(m, x[-1:])[0]))
        new.append(nxt)
        seq.append(nxt)
        if nxt in stop_ids:
            break
    return new


# --------------------------------------------------------------------------------------------------
# self-test

def self_test() -> int:
    import tiny_llama
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="ref_llama_selftest_") as tmp:
        single, sharded, mha = (os.path.join(tmp, n) for n in ("single", "sharded", "mha"))
        common = dict(layers=2, hidden=64, intermediate=176, heads=4, kv_heads=2, vocab=300, act="relu",
                      dtype="bf16", tied=False, seed=7, quiet=True)
        tiny_llama.make_model(single, shards=1, **common)
        tiny_llama.make_model(sharded, shards=3, **common)
        rng = np.random.default_rng(1)
        seqs = [rng.integers(0, 300, size=n).tolist() for n in (1, 5, 17)]

        # (b) sharded == single file
        a = forward(single, seqs, all_positions=True)
        b = forward(sharded, seqs, all_positions=True)
        assert os.path.isfile(os.path.join(sharded, "model.safetensors.index.json"))
        for x, y in zip(a, b):
            assert np.array_equal(x, y), "sharded and single-file checkpoints disagree"
        print("  (b) sharded (3 files) == single file: ok")

        # (c) causal, KV-free consistency: row t of the all-positions logits == last-position logits of
        #     the sequence truncated after t; and sequences in one call are independent.
        full = forward(single, [seqs[2]], all_positions=True)[0]
        worst = 0.0
        for t in range(len(seqs[2])):
            last = forward(single, [seqs[2][:t + 1]])[0]
            worst = max(worst, float(np.abs(full[t] - last).max()))
        assert worst < 1e-12, f"prefix consistency: max diff {worst}"
        alone = forward(single, [seqs[1]])[0]
        assert np.allclose(alone, forward(single, seqs)[1], rtol=0, atol=1e-13)
        assert np.abs(full).max() > 1e-2 and full.std() > 1e-3, "logits are degenerate"
        print(f"  (c) prefix t of all-positions == last position of truncated sequence: ok (max diff {worst:.1e})")

        # (d) GQA == the same model with K/V heads repeated to MHA
        cfg = json.load(open(os.path.join(single, "config.json")))
        w = stnp.load_file(os.path.join(single, "model.safetensors"))
        rep = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
        hd = cfg["head_dim"]
        assert rep > 1
        for i in range(cfg["num_hidden_layers"]):
            for n in ("k_proj", "v_proj"):
                key = f"model.layers.{i}.self_attn.{n}.weight"
                kv = w[key].reshape(cfg["num_key_value_heads"], hd, -1)
                w[key] = np.repeat(kv, rep, axis=0).reshape(cfg["num_attention_heads"] * hd, -1)
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
        os.makedirs(mha)
        json.dump(cfg, open(os.path.join(mha, "config.json"), "w"))
        stnp.save_file(w, os.path.join(mha, "model.safetensors"), dtype="bf16")  # exact: values are bf16
        c = forward(mha, seqs, all_positions=True)
        for x, y in zip(a, c):
            assert np.allclose(x, y, rtol=0, atol=1e-12), "GQA and repeated-MHA disagree"
        print("  (d) GQA (4 heads / 2 KV) == K/V repeated to MHA: ok")

        # (e) errors are reported, not silently wrong
        bad = dict(cfg, rope_scaling={"type": "linear", "factor": 2.0})
        json.dump(bad, open(os.path.join(mha, "config.json"), "w"))
        try:
            load_model(mha)
            raise AssertionError("rope_scaling accepted")
        except RefError:
            pass
        json.dump(dict(cfg, intermediate_size=177), open(os.path.join(mha, "config.json"), "w"))
        try:
            load_model(mha)
            raise AssertionError("shape mismatch accepted")
        except RefError:
            pass
        print("  (e) rope_scaling and shape mismatches rejected: ok")

        # (f) activations: gelu(erf) vs a known value, silu symmetric form, relu override
        x = np.array([-30.0, -1.0, 0.0, 0.5, 40.0])
        assert abs(_gelu_erf(np.array([1.0]))[0] - 0.8413447460685429) < 1e-15
        assert np.allclose(_silu(x), x / (1.0 + np.exp(-x)), rtol=1e-15, atol=1e-300)
        s = forward(single, seqs[:1], hidden_act="silu")[0]
        assert not np.allclose(s, a[0][-1]), "--hidden-act override had no effect"
        print("  (f) activations and the hidden_act override: ok")

        # (g) tiny_llama --sparse-bias reaches its target FFN density on fresh random tokens
        sp = os.path.join(tmp, "sparse")
        tiny_llama.make_model(sp, layers=2, sparse_bias=True, density=0.08, seed=3, quiet=True)
        dens = tiny_llama.gate_density(load_model(sp), [rng.integers(0, 300, 64).tolist() for _ in range(8)], [0, 1])
        assert all(0.04 < d < 0.14 for d in dens.values()), f"sparse-bias density {dens}"
        print("  (g) --sparse-bias density " + ", ".join(f"L{i} {d:.3f}" for i, d in dens.items()) + " (target 0.08): ok")
    print(f"ref_llama self-test: ok ({time.time() - t0:.1f} s)")
    return 0


# --------------------------------------------------------------------------------------------------
# CLI

def parse_tokens(s: str):
    seqs = []
    for part in s.split(";"):
        part = part.strip()
        if not part:
            continue
        try:
            seqs.append([int(t) for t in part.replace(" ", "").split(",") if t != ""])
        except ValueError:
            raise RefError(f"bad --tokens entry {part!r} (want comma-separated ints, ';' between sequences)")
    if not seqs or any(not q for q in seqs):
        raise RefError("--tokens: no (or an empty) sequence")
    return seqs


def load_tokenizer(model_dir: str):
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    return Tokenizer.from_file(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="float64 NumPy reference forward of a HF Llama checkpoint")
    ap.add_argument("--model", help="checkpoint directory (config.json + model.safetensors[.index.json])")
    ap.add_argument("--tokens", help='token ids: "1,2,3;4,5" (";" separates independent sequences)')
    ap.add_argument("--prompt", action="append",
                    help="text to tokenize with DIR/tokenizer.json (repeatable: one sequence each)")
    ap.add_argument("--hidden-act", choices=sorted(ACTIVATIONS), help="override config.json hidden_act")
    ap.add_argument("--out", help="output .npz")
    ap.add_argument("--all-positions", action="store_true", help="logits for every position, not just the last")
    ap.add_argument("--generate", type=int, default=0, metavar="N", help="greedy-decode N new tokens per sequence")
    ap.add_argument("--stop-at-eos", action="store_true", help="with --generate: stop after eos_token_id")
    ap.add_argument("--self-test", action="store_true", help="run the built-in consistency checks (<10 s)")
    a = ap.parse_args(argv)
    try:
        if a.self_test:
            return self_test()
        if not a.model:
            ap.error("--model is required")
        if not a.tokens and not a.prompt:
            ap.error("give --tokens or --prompt")
        if not a.out and not a.generate:
            ap.error("--out is required unless --generate is given")
        tok = load_tokenizer(a.model)
        seqs = parse_tokens(a.tokens) if a.tokens else []
        for p in a.prompt or []:
            if tok is None:
                raise RefError(f"--prompt needs {a.model}/tokenizer.json and the `tokenizers` package")
            seqs.append(tok.encode(p, add_special_tokens=False).ids)
            print(f"prompt_{len(seqs) - 1}: {','.join(map(str, seqs[-1]))}", file=sys.stderr)
        t0 = time.time()
        m = _model(a.model, a.hidden_act)
        t_load = time.time() - t0
        res = {}
        t0 = time.time()
        logits = forward(m, seqs, all_positions=a.all_positions)
        t_fwd = time.time() - t0
        n_tok = sum(len(s) for s in seqs)
        print(f"ref_llama: loaded in {t_load:.2f} s; forward of {len(seqs)} sequence(s), {n_tok} tokens: "
              f"{t_fwd:.3f} s ({1e3 * t_fwd / n_tok:.1f} ms/token, act {m.act_name})", file=sys.stderr)
        for i, (ids, lg) in enumerate(zip(seqs, logits)):
            res[f"logits_{i}"] = lg
            res[f"ids_{i}"] = np.asarray(ids, dtype=np.int64)
        if a.generate:
            eos = m.cfg.get("eos_token_id")
            stop = set(eos if isinstance(eos, list) else [eos]) if (a.stop_at_eos and eos is not None) else set()
            for i, ids in enumerate(seqs):
                t0 = time.time()
                new = greedy(m, ids, a.generate, stop_ids=stop)
                dt = time.time() - t0
                res[f"gen_{i}"] = np.asarray(new, dtype=np.int64)
                print(f"gen_{i}: {','.join(map(str, new))}")
                if tok is not None:
                    print(f"text_{i}: {json.dumps(tok.decode(new, skip_special_tokens=False), ensure_ascii=False)}")
                print(f"ref_llama: generated {len(new)} tokens in {dt:.2f} s "
                      f"({dt / max(len(new), 1):.2f} s/token, full recompute)", file=sys.stderr)
        if a.out:
            tmp = a.out + ".tmp.npz"
            np.savez(tmp, **res)
            os.replace(tmp, a.out)
            print(f"ref_llama: wrote {a.out}", file=sys.stderr)
        return 0
    except (RefError, stnp.SafetensorsError) as e:
        print(f"ref_llama: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
