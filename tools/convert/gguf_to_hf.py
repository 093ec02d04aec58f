#!/usr/bin/env python3
"""Convert a llama.cpp GGUF (architecture "llama") into a Hugging Face Llama checkpoint.

    gguf_to_hf.py --gguf FILE --out DIR [--dtype bf16|f32] [--no-tokenizer] [--force]
    gguf_to_hf.py --self-test

Writes DIR/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json} (transformers' LlamaForCausalLM layout). Quantized tensors are dequantized
with gguf.quants.dequantize; q_proj/k_proj rows are un-permuted from llama.cpp's interleaved-RoPE
order back to HF's rotate_half order. Every tensor's shape is checked against the config, and the
written file is re-read and compared. Output files are written atomically (temp + rename), but the
directory itself is not: callers that need an all-or-nothing directory (scripts/fetch-smollm2) write
into a temp dir and rename it.

Requires numpy, and `gguf` (0.17.1) and `tokenizers` (0.23.x) for the tokenizer. If `import gguf`
fails, a pure-Python wheel `.whl/gguf-*.whl` under the repository root is put on sys.path (a wheel is
a zip and imports as one) -- this is how the GPU machine, which has no package index, gets it.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ next to the sources (not git-ignored)
import safetensors_np as stnp  # noqa: E402
import hf_rope_keys  # noqa: E402
from ref_llama import expected_shapes, rope_theta  # noqa: E402  (the HF Llama tensor names and shapes; θ from either layout)


def log(msg: str) -> None:
    print(f"gguf_to_hf: {msg}", file=sys.stderr, flush=True)


def import_gguf():
    try:
        import gguf  # noqa: F401
        return gguf
    except ImportError:
        pass
    wheels = sorted(glob.glob(os.path.join(REPO, ".whl", "gguf-*.whl")))
    if not wheels:
        raise SystemExit("gguf_to_hf: error: python package `gguf` not importable and no "
                         f"{os.path.join(REPO, '.whl', 'gguf-*.whl')} to fall back on "
                         "(pip install gguf==0.17.1, or pip download --no-deps gguf==0.17.1 -d .whl)")
    sys.path.insert(0, wheels[-1])
    log(f"`import gguf` failed; importing it from the wheel {os.path.relpath(wheels[-1], REPO)}")
    import gguf
    return gguf


# --------------------------------------------------------------------------------------------------
# llama.cpp's q/k row permutation (convert_hf_to_gguf.py LlamaModel.permute) and its inverse.

def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF (rotate_half) row order -> llama.cpp (interleaved pairs) row order."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp row order -> HF row order; exact inverse of permute()."""
    if w.shape[0] % (2 * n_head):
        raise ValueError(f"cannot un-permute {w.shape[0]} rows into {n_head} heads of even size")
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))


# --------------------------------------------------------------------------------------------------

def field(reader, key, default=None, required=True):
    f = reader.fields.get(key)
    if f is None:
        if required and default is None:
            raise SystemExit(f"gguf_to_hf: error: GGUF metadata lacks {key}")
        return default
    return f.contents()


def read_config(reader) -> dict:
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"gguf_to_hf: error: architecture {arch!r} is not 'llama'")
    p = "llama."
    n_embd = int(field(reader, p + "embedding_length"))
    n_head = int(field(reader, p + "attention.head_count"))
    n_kv = int(field(reader, p + "attention.head_count_kv", n_head))
    head_dim = int(field(reader, p + "attention.key_length", n_embd // n_head, required=False))
    rope_dim = int(field(reader, p + "rope.dimension_count", head_dim, required=False))
    if rope_dim != head_dim:
        raise SystemExit(f"gguf_to_hf: error: partial RoPE (dimension_count {rope_dim} != head_dim "
                         f"{head_dim}) is not supported")
    if field(reader, p + "rope.scaling.type", "none", required=False) not in ("none", None):
        raise SystemExit("gguf_to_hf: error: RoPE scaling is not supported")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(field(reader, p + "vocab_size", len(tokens.data) if tokens else None))
    tied = "output.weight" not in {t.name for t in reader.tensors}
    eps = float(np.float32(field(reader, p + "attention.layer_norm_rms_epsilon")))
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": n_embd,
        "intermediate_size": int(field(reader, p + "feed_forward_length")),
        "num_hidden_layers": int(field(reader, p + "block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        # float32 in the GGUF: print the shortest decimal that round-trips through float32 (1e-05)
        "rms_norm_eps": float(np.format_float_positional(np.float32(eps), unique=True, trim="-")),
        **hf_rope_keys.rope_keys(float(np.float32(field(reader, p + "rope.freq_base", 10000.0, required=False)))),
        "max_position_embeddings": int(field(reader, p + "context_length")),
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id", 1, required=False)),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id", 2, required=False)),
    }
    pad = field(reader, "tokenizer.ggml.padding_token_id", None, required=False)
    if pad is not None:
        cfg["pad_token_id"] = int(pad)
    return cfg


_NAME_MAP = {  # GGUF per-block suffix -> HF per-layer suffix
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gname: str) -> str | None:
    if gname == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gname == "output_norm.weight":
        return "model.norm.weight"
    if gname == "output.weight":
        return "lm_head.weight"
    parts = gname.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in _NAME_MAP:
        return f"model.layers.{int(parts[1])}.{_NAME_MAP[parts[2]]}.weight"
    return None


def convert_tensors(reader, gguf, cfg: dict) -> dict:
    want = expected_shapes(cfg)
    out = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            if t.name == "rope_freqs.weight":
                raise SystemExit("gguf_to_hf: error: rope_freqs.weight (Llama-3 RoPE scaling) not supported")
            raise SystemExit(f"gguf_to_hf: error: unexpected GGUF tensor {t.name}")
        if name in out:
            raise SystemExit(f"gguf_to_hf: error: duplicate tensor {t.name}")
        # GGUF lists dims fastest-first; numpy order reversed is HF's [out_features, in_features].
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if name.endswith("q_proj.weight"):
            w = unpermute(w, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, cfg["num_key_value_heads"])
        if name not in want:
            raise SystemExit(f"gguf_to_hf: error: tensor {name} is not expected for this config")
        if w.shape != tuple(want[name]):
            raise SystemExit(f"gguf_to_hf: error: {t.name} -> {name}: shape {w.shape}, expected {want[name]}")
        if not np.isfinite(w).all():
            raise SystemExit(f"gguf_to_hf: error: {t.name} holds non-finite values")
        out[name] = w
    missing = sorted(set(want) - set(out))
    if missing:
        raise SystemExit(f"gguf_to_hf: error: GGUF lacks {len(missing)} tensors, e.g. {missing[:3]}")
    return out


def build_tokenizer(reader, cfg: dict):
    """Return (tokenizer.json text, tokenizer_config dict) from the GGUF vocab, or raise."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tmodel = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre", "default", required=False)
    if tmodel != "gpt2":
        raise SystemExit(f"gguf_to_hf: error: tokenizer model {tmodel!r} is not byte-level BPE ('gpt2')")
    if pre not in ("smollm", "default", "gpt-2"):
        log(f"warning: pre-tokenizer {pre!r}: using the SmolLM split (Digits + ByteLevel GPT-2 regex)")
    tokens = list(field(reader, "tokenizer.ggml.tokens"))
    types = [int(x) for x in field(reader, "tokenizer.ggml.token_type")]
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    if len(tokens) != cfg["vocab_size"]:
        raise SystemExit(f"gguf_to_hf: error: {len(tokens)} tokens but vocab_size {cfg['vocab_size']}")
    if any(len(m) != 2 for m in merges):
        raise SystemExit("gguf_to_hf: error: malformed merge entry")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise SystemExit("gguf_to_hf: error: duplicate token strings in the GGUF vocab")
    tok = Tokenizer(models.BPE(vocab, merges, dropout=None, unk_token=None, fuse_unk=False,
                               byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [i for i, t in enumerate(types) if t == 3]  # 3 = CONTROL
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False, lstrip=False,
                                       rstrip=False, single_word=False) for i in special])
    for i in special:
        if tok.token_to_id(tokens[i]) != i:
            raise SystemExit(f"gguf_to_hf: error: special token {tokens[i]!r} got id "
                             f"{tok.token_to_id(tokens[i])}, expected {i}")

    def tokstr(key):
        v = field(reader, key, None, required=False)
        return None if v is None else tokens[int(v)]

    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False, required=False)),
        "add_eos_token": bool(field(reader, "tokenizer.ggml.add_eos_token", False, required=False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg["max_position_embeddings"],
        "bos_token": tokstr("tokenizer.ggml.bos_token_id"),
        "eos_token": tokstr("tokenizer.ggml.eos_token_id"),
        "pad_token": tokstr("tokenizer.ggml.padding_token_id"),
        "unk_token": tokstr("tokenizer.ggml.unknown_token_id"),
        "additional_special_tokens": [tokens[i] for i in special
                                      if tokens[i] not in (tokstr("tokenizer.ggml.bos_token_id"),
                                                           tokstr("tokenizer.ggml.eos_token_id"),
                                                           tokstr("tokenizer.ggml.padding_token_id"),
                                                           tokstr("tokenizer.ggml.unknown_token_id"))],
        "added_tokens_decoder": {str(i): {"content": tokens[i], "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
                                 for i in special},
    }
    tmpl = field(reader, "tokenizer.chat_template", None, required=False)
    if tmpl is not None:
        tcfg["chat_template"] = tmpl
    return tok, tcfg, len(special), len(merges)


def write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def convert(gguf_path: str, out_dir: str, dtype: str = "bf16", tokenizer: bool = True) -> dict:
    gguf = import_gguf()
    t0 = time.time()
    log(f"reading {gguf_path}")
    reader = gguf.GGUFReader(gguf_path)
    cfg = read_config(reader)
    st_dtype = stnp.DTYPE_ALIASES[dtype]
    cfg["torch_dtype"] = {"BF16": "bfloat16", "F32": "float32", "F16": "float16"}[st_dtype]
    log(f"config: {cfg['num_hidden_layers']} layers, d {cfg['hidden_size']}, ffn {cfg['intermediate_size']}, "
        f"{cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} KV, head_dim {cfg['head_dim']}, "
        f"vocab {cfg['vocab_size']}, theta {rope_theta(cfg):g}, eps {cfg['rms_norm_eps']:g}, "
        f"tied {cfg['tie_word_embeddings']}")
    qtypes: dict = {}
    for t in reader.tensors:
        qtypes[t.tensor_type.name] = qtypes.get(t.tensor_type.name, 0) + 1
    log(f"dequantizing {len(reader.tensors)} tensors ({', '.join(f'{n} {k}' for k, n in sorted(qtypes.items()))})")
    tensors = convert_tensors(reader, gguf, cfg)
    log(f"dequantized in {time.time() - t0:.1f} s")

    os.makedirs(out_dir, exist_ok=True)
    if tokenizer:
        tok, tcfg, n_special, n_merges = build_tokenizer(reader, cfg)
        tmp = os.path.join(out_dir, "tokenizer.json.tmp")
        tok.save(tmp, pretty=False)
        os.replace(tmp, os.path.join(out_dir, "tokenizer.json"))
        write_json(os.path.join(out_dir, "tokenizer_config.json"), tcfg)
        special_map = {k: tcfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if tcfg[k]}
        special_map["additional_special_tokens"] = tcfg["additional_special_tokens"]
        write_json(os.path.join(out_dir, "special_tokens_map.json"), special_map)
        log(f"tokenizer: {cfg['vocab_size']} tokens, {n_merges} merges, {n_special} special tokens")

    st_path = os.path.join(out_dir, "model.safetensors")
    log(f"writing {st_path} ({st_dtype})")
    nbytes = stnp.save_file(tensors, st_path, dtype=st_dtype, metadata={"format": "pt"})
    write_json(os.path.join(out_dir, "config.json"), cfg)
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}
    if "pad_token_id" in cfg:
        gen["pad_token_id"] = cfg["pad_token_id"]
    write_json(os.path.join(out_dir, "generation_config.json"), gen)

    # Verify: re-read every tensor and compare against what we meant to write.
    back = stnp.load_file(st_path)
    if set(back) != set(tensors):
        raise SystemExit("gguf_to_hf: error: verification: tensor set differs after re-reading")
    max_rel = 0.0
    for name, w in tensors.items():
        r = back[name]
        if r.shape != w.shape:
            raise SystemExit(f"gguf_to_hf: error: verification: {name} shape {r.shape} != {w.shape}")
        if st_dtype == "BF16":
            want = stnp.bf16_bits_to_f32(stnp.f32_to_bf16_bits(w))
        else:
            want = w.astype(stnp._STORAGE[st_dtype])
        if not np.array_equal(np.asarray(r, dtype=np.float32), np.asarray(want, dtype=np.float32)):
            raise SystemExit(f"gguf_to_hf: error: verification: {name} differs after re-reading")
        denom = float(np.abs(w).max()) or 1.0
        max_rel = max(max_rel, float(np.abs(np.asarray(r, np.float32) - w).max()) / denom)
    n_params = sum(int(w.size) for w in tensors.values())
    summary = {"params": n_params, "tensors": len(tensors), "dtype": st_dtype, "bytes": nbytes,
               "max_rel_rounding_error": max_rel, "seconds": round(time.time() - t0, 1)}
    log(f"verified: {n_params:,} params in {len(tensors)} tensors, {st_dtype}, {nbytes:,} bytes, "
        f"max |rounding error| / max|w| = {max_rel:.2e}, {time.time() - t0:.1f} s total")
    return summary


def self_test() -> None:
    rng = np.random.default_rng(0)
    for n_head, hd in ((9, 64), (3, 64), (4, 16), (1, 8)):
        w = rng.standard_normal((n_head * hd, 24)).astype(np.float32)
        assert np.array_equal(unpermute(permute(w, n_head), n_head), w)
        assert np.array_equal(permute(unpermute(w, n_head), n_head), w)
    # The permuted layout pairs HF's rotate_half partners (i, i + hd/2) as adjacent rows (2j, 2j+1).
    hd = 8
    w = np.arange(hd, dtype=np.float32)[:, None]
    assert permute(w, 1)[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    # bf16 rounding: ties to even, overflow to inf, NaN kept.
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 3.4e38, np.inf, np.nan], dtype=np.float32)
    b = stnp.bf16_bits_to_f32(stnp.f32_to_bf16_bits(x))
    assert b[0] == 1.0 and b[1] == 1.0 and b[2] == 1.0 + 4 * 2**-8 and b[3] == -2.5
    assert np.isinf(b[4]) and np.isinf(b[5]) and np.isnan(b[6])
    print("gguf_to_hf self-test: ok")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="input GGUF file (architecture llama)")
    ap.add_argument("--out", help="output directory")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32", "f16"],
                    help="storage dtype of model.safetensors (default bf16)")
    ap.add_argument("--no-tokenizer", action="store_true", help="skip tokenizer.json / tokenizer_config.json")
    ap.add_argument("--self-test", action="store_true", help="check the permutation and bf16 rounding")
    a = ap.parse_args(argv)
    if a.self_test:
        self_test()
        return 0
    if not a.gguf or not a.out:
        ap.error("--gguf and --out are required")
    if not os.path.isfile(a.gguf):
        ap.error(f"no such file: {a.gguf}")
    summary = convert(a.gguf, a.out, a.dtype, tokenizer=not a.no_tokenizer)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
