"""bench/model/fast_llama.py (the lean dense PyTorch Llama of the decode yardstick) computes what
transformers' LlamaForCausalLM computes: on CPU in float32, the prompt's last logits, every greedy
decode step through its static cache against transformers recomputing the whole sequence, and the
greedy tokens of generate(); GQA and MHA, ReLU and SiLU, tied and untied heads. Unsupported
configurations are refused with the reason."""
import pytest

from bench_script import load_bench

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def load():
    return load_bench("model/fast_llama")


def tiny(act="relu", kv_heads=2, tied=False, seed=0, **extra):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=kv_heads, hidden_act=act,
                                   max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=tied, **extra)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms off 1 so that a swapped norm weight shows
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("act,kv_heads,tied,attn", [("relu", 2, False, "sdpa"), ("silu", 4, True, "sdpa"),
                                                    ("relu", 1, True, "sdpa"), ("relu", 2, False, "math"),
                                                    ("silu", 4, True, "math")])
def test_logits_and_greedy_steps_match_transformers(act, kv_heads, tied, attn):
    fl = load()
    hf = tiny(act, kv_heads, tied)
    fast = fl.FastLlama.from_hf(hf, max_len=40, batch=2, attn=attn)
    prompt = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(prompt).logits[:, -1]
        got = fast.logits(prompt)
        assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()
        # Greedy steps through the static cache against transformers recomputing everything.
        seq = prompt
        nxt = fast.prefill(prompt)
        for step in range(6):
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            full = hf(seq).logits[:, -1]
            pos = torch.tensor([seq.shape[1] - 1])
            got = fast.body(seq[:, -1:], pos, fast.mask_for(pos))
            assert torch.allclose(got, full, atol=2e-5, rtol=1e-4), (step, (got - full).abs().max())
            nxt = got.argmax(-1)
        gen = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False,
                          pad_token_id=0)
    assert torch.equal(gen[:, 9:], seq[:, 9:])


def test_a_prompt_that_fills_the_cache_runs_causal_attention_alike():
    fl = load()
    hf = tiny("silu", 2)
    prompt = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf(prompt).logits[:, -1]
        full = fl.FastLlama.from_hf(hf, max_len=12).logits(prompt)  # is_causal, no mask
        masked = fl.FastLlama.from_hf(hf, max_len=20).logits(prompt)
        uncached = fl.FastLlama.from_hf(hf, max_len=12, cache=False).logits(prompt)
    assert torch.allclose(full, want, atol=2e-5, rtol=1e-4)
    assert torch.allclose(masked, want, atol=2e-5, rtol=1e-4)
    assert torch.allclose(uncached, want, atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="without a cache"):
        fl.FastLlama.from_hf(hf, max_len=8, cache=False).logits(prompt)


def test_decode_returns_the_greedy_ids():
    fl = load()
    hf = tiny()
    fast = fl.FastLlama.from_hf(hf, max_len=24)
    prompt = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        nxt = fast.prefill(prompt)
        ids = [int(nxt)]
        for i in range(4):
            nxt = fast.decode(nxt[:, None], torch.tensor([5 + i]))
            ids.append(int(nxt))
        gen = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5, do_sample=False,
                          pad_token_id=0)
    assert ids == gen[0, 5:].tolist()


def test_refuses_what_it_does_not_compute():
    fl = load()
    with pytest.raises(ValueError, match="hidden_act"):
        fl.FastLlama.from_hf(tiny("tanh"), max_len=8)
    with pytest.raises(ValueError, match="biases"):
        fl.FastLlama.from_hf(tiny(attention_bias=True), max_len=8)


def test_math_attention_is_sdpa_with_the_mask():
    """The written-out masked attention against SDPA's on random q, K, V and a ragged causal mask,
    GQA (two query heads a KV head), two query rows; an unknown attn name is refused."""
    fl = load()
    fast = fl.FastLlama.from_hf(tiny("relu", 2), max_len=16, attn="math")
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 2, 16, generator=g)
    k = torch.randn(2, 2, 16, 16, generator=g)
    v = torch.randn(2, 2, 16, 16, generator=g)
    mask = torch.arange(16)[None, :] <= torch.tensor([6, 7])[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None], enable_gqa=True)
    assert torch.allclose(fast.masked_attention(q, k, v, mask), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="attn"):
        fl.FastLlama.from_hf(tiny(), max_len=8, attn="flash")


def test_yardstick_compile_modes():
    """torch_yardstick.py's --fast-modes entries: a torch.compile mode, and whether inductor's
    coordinate-descent tuning is on (gpt-fast's "+cdt"; max-autotune tunes too); typos refused."""
    ty = load_bench("model/torch_yardstick")
    assert ty.compile_mode("reduce-overhead") == ("reduce-overhead", False, False)
    assert ty.compile_mode("reduce-overhead+cdt") == ("reduce-overhead", True, False)
    assert ty.compile_mode("max-autotune") == ("max-autotune", True, False)
    assert ty.compile_mode("max-autotune-no-cudagraphs") == ("max-autotune-no-cudagraphs", True, False)
    assert ty.compile_mode("default+graph") == ("default", False, True)
    assert ty.compile_mode("default+cdt+graph") == ("default", True, True)
    with pytest.raises(ValueError, match="unknown or repeated suffix"):
        ty.compile_mode("reduce-overhead+cdtt")
    with pytest.raises(ValueError, match="unknown or repeated suffix"):
        ty.compile_mode("default+graph+graph")
    with pytest.raises(ValueError, match=r"\+graph captures"):
        ty.compile_mode("reduce-overhead+graph")  # graphs twice
