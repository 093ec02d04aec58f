#!/usr/bin/env python3
"""Write a random-weight, valid Hugging Face Llama checkpoint for tests.

    tiny_llama.py --out DIR [--layers 2 --hidden 64 --intermediate 176 --heads 4 --kv-heads 2
                  --head-dim D --vocab 300 --act relu --dtype bf16|f16|f32 --tied|--untied --shards N
                  --seed S --rope-theta 10000 --max-pos 256 --eps 1e-5
                  --sparse-bias [--density 0.08 --density-spread 0] [--block-gain G] [--quiet]]

Writes DIR/config.json, DIR/generation_config.json and DIR/model.safetensors (or N shards
model-0000k-of-0000N.safetensors + model.safetensors.index.json). Deterministic given the arguments
(the shard count does not change the weights). Then prints, measured with ref_llama's float64 forward
on random tokens (a fresh draw, not the calibration one), the share of positive gate pre-activations
per layer (the FFN density, for ReLU).

Initialisation (e = 2/sqrt(hidden), g = max(1, sqrt(hidden)/2); weights are rounded to --dtype before
anything is measured):
    embed ~ N(0, e)         v/gate/up ~ N(0, 1/sqrt(hidden))      q/k ~ N(0, 2/sqrt(hidden))
    o ~ N(0, g e/sqrt(heads*head_dim))     down ~ N(0, 1.5 g e/sqrt(intermediate))
    lm_head (untied) ~ N(0, 1/sqrt(hidden))      norm weights ~ U(0.9, 1.1)
Why: with a tied head, logit(token) ~ embed[token] . x, so while the token's own embedding dominates
the residual stream the model just predicts its input again (92-99 % of positions at g = 1). The
block gain g makes attention/FFN outputs outweigh the embedding (2-30 % self-prediction, max softmax
prob ~0.2, logit std ~2), and q/k at 2/sqrt(hidden) give attention scores of std ~4, so attention is
selective rather than a context-length average (which would make FFN density drift with position).

--sparse-bias (the "massive activation" trick of DESIGN.md §5): residual channel 0 is a constant c
(= e*sqrt(hidden)) in every token's embedding; o_proj and down_proj rows 0 are zero, so no block writes
to it, and q/k/v/up_proj columns 0 are zero, so only the gate reads it (a constant part in v would add
one shared vector to every position's residual and bias the logits towards a few tokens), and
down_proj is scaled by sqrt(0.5 / density) so the sparser FFN output keeps its size. After RMSNorm that channel is the same positive number times
1/rms for every token, so gate column 0 acts as a per-neuron threshold: neuron n fires iff
sum_{j>0} Wg[n,j] h[j] > -Wg[n,0] h[0]. Layer by layer, Wg[:,0] is set to the (1 - density_n)
quantile of -(that ratio) over random calibration tokens, so each neuron fires on ~density_n of
tokens. density_n = --density for all neurons, or log-normally spread around it with
--density-spread SIGMA (skewed neuron popularity). Calibration uses 32 random sequences of 64
tokens; density still depends on context length in a random-weight model (e.g. 0.11 / 0.08 / 0.06
at 16 / 64 / 200 tokens for the default shape, target 0.08). The checkpoint stays an ordinary Llama.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ next to the sources (not git-ignored)
import hf_rope_keys  # noqa: E402
import ref_llama  # noqa: E402
import safetensors_np as stnp  # noqa: E402


def _round(a: np.ndarray, st_dtype: str) -> np.ndarray:
    """Round to the storage dtype and back to float32 (what a reader of the file will see)."""
    a = np.asarray(a, dtype=np.float32)
    if st_dtype == "BF16":
        return stnp.bf16_bits_to_f32(stnp.f32_to_bf16_bits(a))
    if st_dtype == "F16":
        return a.astype(np.float16).astype(np.float32)
    return a


def tensor_order(cfg: dict) -> list:
    names = ["model.embed_tokens.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight",
                  p + "post_attention_layernorm.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                  p + "mlp.down_proj.weight"]
    names.append("model.norm.weight")
    if not cfg["tie_word_embeddings"]:
        names.append("lm_head.weight")
    return names


def random_tokens(rng, vocab: int, n_seq: int, length: int) -> list:
    return [rng.integers(0, vocab, size=length).tolist() for _ in range(n_seq)]


def gate_density(model, ids_list, layers) -> dict:
    caps = ref_llama.layer_inputs(model, ids_list, layers)
    return {i: float((caps[i]["gate"] > 0).mean()) for i in layers}


def make_model(out, layers=2, hidden=64, intermediate=176, heads=4, kv_heads=2, head_dim=None, vocab=300,
               act="relu", dtype="bf16", tied=True, shards=1, seed=0, rope_theta=10000.0, max_pos=256,
               eps=1e-5, sparse_bias=False, density=0.08, density_spread=0.0, quiet=False,
               block_gain=None) -> dict:
    if act not in ref_llama.ACTIVATIONS:
        raise SystemExit(f"tiny_llama: error: unsupported --act {act}")
    if heads % kv_heads:
        raise SystemExit("tiny_llama: error: --heads must be a multiple of --kv-heads")
    hd = head_dim or hidden // heads
    if hd % 2 or (head_dim is None and hidden % heads):
        raise SystemExit("tiny_llama: error: head_dim must be even (and hidden divisible by heads)")
    if not 0 < density < 1:
        raise SystemExit("tiny_llama: error: --density must be in (0, 1)")
    st = stnp.DTYPE_ALIASES[dtype]
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hd,
        "hidden_act": act, "rms_norm_eps": eps, **hf_rope_keys.rope_keys(rope_theta),
        "max_position_embeddings": max_pos, "vocab_size": vocab, "tie_word_embeddings": bool(tied),
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "initializer_range": 0.02,
        "pretraining_tp": 1, "use_cache": True, "bos_token_id": 0, "eos_token_id": 0,
        "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[st],
    }
    rng = np.random.default_rng(seed)
    e = 2.0 / np.sqrt(hidden)
    s_in = 1.0 / np.sqrt(hidden)
    gain = max(1.0, np.sqrt(hidden) / 2) if block_gain is None else float(block_gain)

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_w():
        return rng.uniform(0.9, 1.1, size=hidden).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((vocab, hidden), e)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_w()
        w[p + "self_attn.q_proj.weight"] = normal((heads * hd, hidden), 2 * s_in)
        w[p + "self_attn.k_proj.weight"] = normal((kv_heads * hd, hidden), 2 * s_in)
        w[p + "self_attn.v_proj.weight"] = normal((kv_heads * hd, hidden), s_in)
        w[p + "self_attn.o_proj.weight"] = normal((hidden, heads * hd), gain * e / np.sqrt(heads * hd))
        w[p + "post_attention_layernorm.weight"] = norm_w()
        w[p + "mlp.gate_proj.weight"] = normal((intermediate, hidden), s_in)
        w[p + "mlp.up_proj.weight"] = normal((intermediate, hidden), s_in)
        w[p + "mlp.down_proj.weight"] = normal((hidden, intermediate), 1.5 * gain * e / np.sqrt(intermediate))
    w["model.norm.weight"] = norm_w()
    if not tied:
        w["lm_head.weight"] = normal((vocab, hidden), s_in)
    # draw everything the sparse-bias path needs now, so the stream is the same with or without it
    per_neuron = rng.standard_normal((layers, intermediate))
    calib_rng = np.random.default_rng([seed, 1])
    measure_rng = np.random.default_rng([seed, 2])

    if sparse_bias:
        c = e * np.sqrt(hidden)
        w["model.embed_tokens.weight"][:, 0] = c
        for i in range(layers):
            p = f"model.layers.{i}."
            w[p + "self_attn.o_proj.weight"][0, :] = 0.0
            w[p + "mlp.down_proj.weight"][0, :] = 0.0
            w[p + "mlp.down_proj.weight"] *= np.sqrt(0.5 / density)  # keep the FFN output's size
            w[p + "mlp.up_proj.weight"][:, 0] = 0.0
            for n in ("q_proj", "k_proj", "v_proj"):  # else v gets a constant part and o_proj adds
                w[p + f"self_attn.{n}.weight"][:, 0] = 0.0  # the same vector to every position
            w[p + "mlp.gate_proj.weight"][:, 0] = 0.0
    w = {k: _round(v, st) for k, v in w.items()}

    if sparse_bias:
        targets = np.clip(density * np.exp(density_spread * per_neuron - density_spread ** 2 / 2),
                          1e-4, 0.9999)
        calib = random_tokens(calib_rng, vocab, 32, 64)
        m = ref_llama.Model(cfg, {k: v.astype(np.float64) for k, v in w.items()}, act)
        # Layer by layer, carrying each sequence's residual stream forward (O(layers), not O(layers^2)):
        # layer i's thresholds are fitted to inputs produced by the already-calibrated layers < i.
        xs = [m.w["model.embed_tokens.weight"][np.asarray(ids)] for ids in calib]
        rope = [ref_llama.rope_cos_sin(len(ids), m.head_dim, m.theta) for ids in calib]
        for i in range(layers):
            p = f"model.layers.{i}."
            key = p + "mlp.gate_proj.weight"
            hs = []
            for j, (cos, sin) in enumerate(rope):
                xs[j] = xs[j] + ref_llama.attention(m, i, ref_llama.rmsnorm(xs[j], m.w[p + "input_layernorm.weight"],
                                                                            m.eps), cos, sin)
                hs.append(ref_llama.rmsnorm(xs[j], m.w[p + "post_attention_layernorm.weight"], m.eps))
            h = np.concatenate(hs, axis=0)                   # [T_total, hidden] FFN input
            h0 = h[:, 0]                                     # > 0: c * w_norm[0] / rms(x)
            if (h0 <= 0).any():
                raise SystemExit("tiny_llama: error: channel 0 is not positive after RMSNorm")
            ratio = (h @ m.w[key].T) / h0[:, None]           # [T_total, ffn]; gate col 0 is 0 here
            ratio.sort(axis=0)
            # per-neuron (1 - density_n) quantile, linear interpolation between order statistics
            pos = (1.0 - targets[i]) * (ratio.shape[0] - 1)
            lo = np.floor(pos).astype(int)
            hi = np.minimum(lo + 1, ratio.shape[0] - 1)
            cols = np.arange(intermediate)
            thr = ratio[lo, cols] + (pos - lo) * (ratio[hi, cols] - ratio[lo, cols])
            w[key] = w[key].copy()
            w[key][:, 0] = _round(-thr, st)
            m.w[key] = w[key].astype(np.float64)
            xs = [x + ref_llama.mlp(m, i, hh) for x, hh in zip(xs, np.split(h, np.cumsum([len(q) for q in hs])[:-1]))]

    os.makedirs(out, exist_ok=True)
    names = tensor_order(cfg)
    assert set(names) == set(w)
    total = sum(int(w[n].size) for n in names)
    # remove what an earlier run with another shard count left behind
    for f in os.listdir(out):
        if f == "model.safetensors.index.json" or (f.startswith("model-") and f.endswith(".safetensors")):
            os.unlink(os.path.join(out, f))
    if shards <= 1:
        stnp.save_file(w, os.path.join(out, "model.safetensors"), dtype=st, metadata={"format": "pt"})
    else:
        shards = min(shards, len(names))
        itemsize = 4 if st == "F32" else 2
        sizes = np.array([w[n].size * itemsize for n in names], dtype=np.int64)
        # contiguous groups balanced by bytes; every shard gets at least one tensor
        group, k, in_k, cum, tot = [], 0, 0, 0, int(sizes.sum())
        for j, sz in enumerate(sizes):
            must = len(names) - j == shards - 1 - k          # one tensor left per remaining shard
            want = cum >= (k + 1) * tot / shards
            if in_k and k < shards - 1 and (must or want):
                k, in_k = k + 1, 0
            group.append(k)
            in_k += 1
            cum += int(sz)
        files = [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)]
        weight_map = {}
        for k in range(shards):
            part = {n: w[n] for n, g in zip(names, group) if g == k}
            if not part:
                raise SystemExit("tiny_llama: error: empty shard (more shards than tensors?)")
            stnp.save_file(part, os.path.join(out, files[k]), dtype=st, metadata={"format": "pt"})
            weight_map.update({n: files[k] for n in part})
        index = {"metadata": {"total_size": int(sizes.sum())}, "weight_map": weight_map}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
        if os.path.exists(os.path.join(out, "model.safetensors")):
            os.unlink(os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 0}, f, indent=2)

    info = {"params": total, "dtype": st, "shards": max(shards, 1)}
    if not quiet:
        mdl = ref_llama.load_model(out)  # measure on what was written
        probe = random_tokens(measure_rng, vocab, 8, 64)
        dens = gate_density(mdl, probe, list(range(layers)))
        info["gate_density"] = dens
        print(f"tiny_llama: wrote {out}: {total:,} params, {st}, {info['shards']} file(s), act {act}, "
              f"{'tied' if tied else 'untied'}, GQA {heads}/{kv_heads}, seed {seed}", file=sys.stderr)
        what = f"target {density:g}" if sparse_bias else "no --sparse-bias"
        print(f"tiny_llama: share of gate pre-activations > 0 on 8 x 64 random tokens "
              f"({what}): " + ", ".join(f"L{i} {d:.3f}" for i, d in dens.items()), file=sys.stderr)
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="random-weight HF Llama checkpoint for tests")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=176)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=None, help="default hidden / heads")
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--act", default="relu", choices=sorted(ref_llama.ACTIVATIONS))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tied", dest="tied", action="store_true", default=True, help="tie lm_head to the embedding (default)")
    g.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--max-pos", type=int, default=256)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--sparse-bias", action="store_true", help="calibrated per-neuron thresholds via a constant channel")
    ap.add_argument("--density", type=float, default=0.08, help="target FFN density with --sparse-bias")
    ap.add_argument("--density-spread", type=float, default=0.0, help="log-normal sigma of per-neuron density")
    ap.add_argument("--block-gain", type=float, default=None, help="scale of o/down outputs (default max(1, sqrt(hidden)/2))")
    ap.add_argument("--quiet", action="store_true", help="skip the density measurement and summary")
    a = ap.parse_args(argv)
    if a.sparse_bias and a.act != "relu":
        print(f"tiny_llama: warning: --sparse-bias with act {a.act}: thresholds set, but only ReLU gives zeros",
              file=sys.stderr)
    info = make_model(a.out, a.layers, a.hidden, a.intermediate, a.heads, a.kv_heads, a.head_dim, a.vocab,
                      a.act, a.dtype, a.tied, a.shards, a.seed, a.rope_theta, a.max_pos, a.eps, a.sparse_bias,
                      a.density, a.density_spread, a.quiet, a.block_gain)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
