"""A lean dense Llama in PyTorch for the yardsticks: the strongest dense decode PyTorch code can
write, not transformers' general-purpose one.

Why: `transformers`' LlamaForCausalLM under torch.compile + CUDA graphs decodes the 2B shape at
≈ 258 tokens/s on an H100 (f211fd2), while a hand-written body of the same shape, compiled, runs at
376 (`../shared/reference/model_anchors.md`, 48 % of the memory bandwidth). Speed-ups must be
measured against the stronger one. This module is that body, in the style of gpt-fast: the
checkpoint's projections stacked (one [Q + 2·KV, K] QKV GEMM, one [2N, K] gate-and-up GEMM), a static
KV cache of fixed shape updated in place, RoPE from precomputed tables, SDPA over the cache with a
position mask, the LM head and the greedy pick in the same step, so one decode step is one
torch.compile graph (mode "reduce-overhead": replayed as a CUDA graph).

It computes what transformers' Llama computes (RMSNorm in fp32 then the weight, rotate-half RoPE
with inv_freq = θ^(−2i/d), GQA, act(gate) · up) — tests/test_bench_fast_llama.py checks its logits
against transformers' on CPU in float32 — for Llama checkpoints without biases or rope scaling,
with relu, silu or gelu FFNs (anything else is refused with the reason).

    from fast_llama import FastLlama
    m = FastLlama.from_hf(hf_model, max_len=512)   # weights copied into the stacked layout
    nxt = m.prefill(prompt_ids)                     # [B] greedy next ids; fills the cache
    nxt = m.decode(nxt[:, None], pos)               # one step at position pos (a 1-element tensor)
"""
import math

import torch
import torch.nn.functional as F

_ACTS = {"relu": F.relu, "silu": F.silu, "gelu": lambda t: F.gelu(t), "gelu_pytorch_tanh": lambda t: F.gelu(t, approximate="tanh")}


class FastLlama(torch.nn.Module):
    def __init__(self, cfg, dtype, device, max_len, batch=1, cache=True, attn="sdpa"):
        super().__init__()
        if attn not in ("sdpa", "math"):
            raise ValueError(f"fast_llama: attn is 'sdpa' or 'math', not {attn!r}")
        # Attention over the cache with a position mask (decode steps, prompts into a part-filled
        # cache): "sdpa" calls scaled_dot_product_attention (with a mask: its memory-efficient or
        # math kernel, not flash); "math" writes q·Kᵀ, the masked softmax (fp32) and ·V out, which
        # torch.compile fuses into its own kernels — for one query over a few hundred keys possibly
        # the faster. The yardstick measures both.
        self.attn = attn
        self.k, self.n, self.layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or self.k // self.heads
        self.eps = cfg.rms_norm_eps
        act = getattr(cfg, "hidden_act", "silu")
        if act not in _ACTS:
            raise ValueError(f"fast_llama: hidden_act {act!r} is not one of {sorted(_ACTS)}")
        self.act = _ACTS[act]
        # transformers 5 keeps θ and the scaling in rope_parameters (rope_scaling reads the same
        # dict); 4.x has rope_theta and rope_scaling (None when plain).
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"fast_llama: rope scaling {rope} is not supported")
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
            raise ValueError("fast_llama: biases in attention or MLP are not supported")
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        q, kv = self.heads * self.d, self.kv_heads * self.d
        self.q, self.kv = q, kv
        kw = dict(dtype=dtype, device=device)
        self.embed = torch.nn.Parameter(torch.empty(cfg.vocab_size, self.k, **kw), requires_grad=False)
        self.head = torch.nn.Parameter(torch.empty(cfg.vocab_size, self.k, **kw), requires_grad=False)
        self.final_norm = torch.nn.Parameter(torch.empty(self.k, **kw), requires_grad=False)
        L = self.layers
        self.wqkv = torch.nn.Parameter(torch.empty(L, q + 2 * kv, self.k, **kw), requires_grad=False)
        self.wo = torch.nn.Parameter(torch.empty(L, self.k, q, **kw), requires_grad=False)
        self.wgu = torch.nn.Parameter(torch.empty(L, 2 * self.n, self.k, **kw), requires_grad=False)
        self.wd = torch.nn.Parameter(torch.empty(L, self.k, self.n, **kw), requires_grad=False)
        self.norm1 = torch.nn.Parameter(torch.empty(L, self.k, **kw), requires_grad=False)
        self.norm2 = torch.nn.Parameter(torch.empty(L, self.k, **kw), requires_grad=False)
        self.max_len, self.batch, self.cache = max_len, batch, cache
        if cache:  # without: prompts from position 0 only (a prefill benchmark), nothing kept
            # A buffer a layer, as gpt-fast's KVCache: the step's in-place write (index_put_ at pos)
            # is then a mutation of a whole graph input, which inductor does in place. Written into
            # a view of one [L, …] buffer instead, it became a functional copy of the layer's whole
            # cache, copied back at the step's end (TORCH_LOGS=output_code on the CPU): several passes
            # over the cache a step, which made the compiled step 4.2 ms at batch 1 and 25 ms at
            # batch 8 on an H200 at context 512 (cac9a4e), about 8× the weights' read time at batch 8.
            for i in range(L):
                self.register_buffer(f"kc{i}", torch.zeros(batch, self.kv_heads, max_len, self.d, **kw), persistent=False)
                self.register_buffer(f"vc{i}", torch.zeros(batch, self.kv_heads, max_len, self.d, **kw), persistent=False)
        # As transformers computes them: inv_freq and the angles in fp32, cos and sin cast to dtype.
        inv = 1.0 / (theta ** (torch.arange(0, self.d, 2, dtype=torch.int64, device=device).float() / self.d))
        ang = torch.arange(max_len, device=device).float()[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)  # rotate_half's layout: [d/2 | d/2]
        self.register_buffer("cos", ang.cos().to(dtype), persistent=False)
        self.register_buffer("sin", ang.sin().to(dtype), persistent=False)

    @classmethod
    def from_hf(cls, hf, max_len, batch=1, cache=True, attn="sdpa"):
        """A FastLlama holding a copy of a transformers LlamaForCausalLM's weights (its dtype and
        device); cache=False: no KV cache (prompts from position 0 only, e.g. a prefill benchmark);
        attn: "sdpa" or "math" for attention over the cache with a mask (see __init__)."""
        cfg = hf.config
        p = next(hf.parameters())
        m = cls(cfg, p.dtype, p.device, max_len, batch, cache, attn)
        base = hf.model
        with torch.no_grad():
            m.embed.copy_(base.embed_tokens.weight)
            m.head.copy_(hf.lm_head.weight)
            m.final_norm.copy_(base.norm.weight)
            for i, layer in enumerate(base.layers):
                a, f = layer.self_attn, layer.mlp
                m.wqkv[i].copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
                m.wo[i].copy_(a.o_proj.weight)
                m.wgu[i].copy_(torch.cat([f.gate_proj.weight, f.up_proj.weight]))
                m.wd[i].copy_(f.down_proj.weight)
                m.norm1[i].copy_(layer.input_layernorm.weight)
                m.norm2[i].copy_(layer.post_attention_layernorm.weight)
        return m

    def rmsnorm(self, x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(x.dtype)

    @staticmethod
    def rotate(t, cos, sin):
        h = t.shape[-1] // 2
        return t * cos + torch.cat([-t[..., h:], t[..., :h]], dim=-1) * sin

    def body(self, ids, pos, mask):
        """Logits of the last position of ids [B, T] at positions pos [T], keys masked by mask
        (bool [T, max_len]: True where a query may attend; None: plain causal attention, for a
        prompt that fills the whole cache from position 0); writes the cache at pos."""
        B, T = ids.shape
        if B != self.batch:
            raise ValueError(f"fast_llama: a batch of {B} sequences into a cache made for {self.batch}")
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]
        for i in range(self.layers):
            h = self.rmsnorm(x, self.norm1[i])
            qkv = h @ self.wqkv[i].t()
            q = qkv[..., :self.q].view(B, T, self.heads, self.d).transpose(1, 2)
            k = qkv[..., self.q:self.q + self.kv].view(B, T, self.kv_heads, self.d).transpose(1, 2)
            v = qkv[..., self.q + self.kv:].view(B, T, self.kv_heads, self.d).transpose(1, 2)
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
            gqa = self.heads != self.kv_heads
            if not self.cache:  # a prompt from position 0, attending to itself
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            else:
                kc, vc = getattr(self, f"kc{i}"), getattr(self, f"vc{i}")
                kc[:, :, pos] = k
                vc[:, :, pos] = v
                if mask is None:
                    o = F.scaled_dot_product_attention(q, kc, vc, is_causal=True, enable_gqa=gqa)
                elif self.attn == "math":
                    o = self.masked_attention(q, kc, vc, mask)
                else:
                    o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask[None, None],
                                                       enable_gqa=gqa)
            x = x + o.transpose(1, 2).reshape(B, T, self.q) @ self.wo[i].t()
            h = self.rmsnorm(x, self.norm2[i])
            g, u = (h @ self.wgu[i].t()).split(self.n, dim=-1)
            x = x + (self.act(g) * u) @ self.wd[i].t()
        x = self.rmsnorm(x[:, -1], self.final_norm)
        return x @ self.head.t()

    def masked_attention(self, q, k, v, mask):
        """softmax(q·Kᵀ / √d, keys where mask) · V written out: q [B, H, T, d], k and v [B, KVH, L, d],
        mask [T, L]; a KV head's query heads as one matrix (GQA without copying K or V)."""
        B, H, T, d = q.shape
        kvh, group = self.kv_heads, H // self.kv_heads
        qg = q.reshape(B, kvh, group * T, d)
        s = (qg @ k.transpose(-1, -2)).float() * (1.0 / math.sqrt(d))
        s = s.view(B, kvh, group, T, -1).masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1).to(q.dtype).view(B, kvh, group * T, -1)
        return (p @ v).view(B, H, T, d)

    def mask_for(self, pos):
        return torch.arange(self.max_len, device=pos.device)[None, :] <= pos[:, None]

    def logits(self, ids, start=0):
        """Last-position logits of a prompt ids [B, T] written into the cache from position start
        (a prompt that fills the cache runs SDPA's causal kernel, as transformers' prefill does)."""
        pos = torch.arange(start, start + ids.shape[1], device=ids.device)
        if not self.cache and (start != 0 or ids.shape[1] > self.max_len):
            raise ValueError("fast_llama: without a cache, prompts start at 0 and fit max_len")
        full = start == 0 and (ids.shape[1] == self.max_len or not self.cache)
        return self.body(ids, pos, None if full else self.mask_for(pos))

    def prefill(self, ids):
        """The prompt into the cache from position 0; the greedy next ids [B]."""
        return self.logits(ids).argmax(-1)

    def decode(self, ids, pos):
        """One step: ids [B, 1] at position pos (a 1-element long tensor); the greedy next ids [B]."""
        return self.body(ids, pos, self.mask_for(pos)).argmax(-1)

    def weight_bytes(self):
        return sum(p.numel() * p.element_size() for p in self.parameters())


def attention_flops(layers, heads, d, batch, length):
    """Causal attention's multiply-adds × 2 of a prefill (for TFLOP/s reports)."""
    return 2 * layers * heads * d * batch * length * (length + 1)


def decode_bytes_floor_ms(model, tb_per_s=3.35):
    """The weights' read time at tb_per_s TB/s: the batch-1 decode floor (ms)."""
    return model.weight_bytes() / (tb_per_s * 1e12) * 1e3 if tb_per_s > 0 else math.inf
