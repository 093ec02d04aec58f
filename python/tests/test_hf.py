"""twell.hf on a tiny random LlamaForCausalLM (CPU, fp32): sparsify keeps the function (training
path ≤ 1e-4 of the logit scale: float32 against float32 in another order; inference path ≤ 1e-2:
TwELL holds gate values as bf16, 2⁻⁹ relative each, through 2 layers), trains step for step like
the dense model, saves a checkpoint that plain transformers loads with the same logits, and undoes.
"""
import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import twell.hf  # noqa: E402
from twell.torch import SparseMLP  # noqa: E402


def tiny(act="relu", seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   hidden_act=act, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg).eval()


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_sparsify_keeps_the_function_and_the_parameters():
    model = tiny()
    ids = torch.randint(0, 128, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
    names = [n for n, _ in model.named_parameters()]
    params = [id(p) for p in model.parameters()]
    twell.hf.sparsify(model)
    assert len(twell.hf.sparse_mlps(model)) == 2
    assert [n for n, _ in model.named_parameters()] == names and [id(p) for p in model.parameters()] == params
    with torch.no_grad():
        assert rel(model(ids).logits, want) < 1e-2  # inference path (bf16 gate values)
    model.train()
    got = model(ids).logits  # gradients on: the training path
    assert rel(got.detach(), want) < 1e-4
    twell.hf.unsparsify(model)
    assert not twell.hf.sparse_mlps(model)
    assert type(model.model.layers[0].mlp).__name__ == "LlamaMLP"


def test_training_steps_match_the_dense_model():
    dense = tiny(seed=2)
    sparse = twell.hf.sparsify(copy.deepcopy(dense))
    ids = torch.randint(0, 128, (4, 24), generator=torch.Generator().manual_seed(3))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (dense, sparse)]
    for step in range(3):
        losses = []
        for m, opt in zip((dense, sparse), opts):
            m.train()
            opt.zero_grad()
            loss = m(ids, labels=ids).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 1e-4 * abs(losses[0]), (step, losses)
    # The L1 term: finite, positive, and its gradient reaches the gate weights.
    sparse.zero_grad()
    out = sparse(ids, labels=ids)
    l1 = twell.hf.l1_loss(sparse)
    assert torch.isfinite(l1) and l1.item() > 0
    l1.backward()
    assert sparse.model.layers[0].mlp.gate_proj.weight.grad.abs().sum() > 0


def test_saved_checkpoint_loads_in_plain_transformers(tmp_path):
    model = twell.hf.sparsify(tiny(seed=4))
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5))
    model.train()
    want = model(ids).logits.detach()
    model.save_pretrained(tmp_path)
    plain = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert not any(isinstance(m, SparseMLP) for m in plain.modules())
    with torch.no_grad():
        assert rel(plain(ids).logits, want) < 1e-4


def test_refusals_and_silu_conversion():
    silu = tiny("silu")
    with pytest.raises(ValueError, match="hidden_act is 'silu'"):
        twell.hf.sparsify(silu)
    twell.hf.sparsify(silu, convert_silu=True)
    assert silu.config.hidden_act == "relu" and len(twell.hf.sparse_mlps(silu)) == 2
    bare = torch.nn.Module()
    bare.config = transformers.LlamaConfig(hidden_act="relu")
    bare.lin = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="no Llama-style MLP"):
        twell.hf.sparsify(bare)
    biased = tiny()
    biased.model.layers[1].mlp.up_proj.bias = torch.nn.Parameter(torch.zeros(176))
    with pytest.raises(ValueError, match="has a bias"):
        twell.hf.sparsify(biased)
    assert not twell.hf.sparse_mlps(biased)  # refused before any swap
    fresh = tiny()
    with pytest.raises(RuntimeError, match="no sparsified MLP has run"):
        twell.hf.l1_loss(twell.hf.sparsify(fresh))



def test_telemetry_per_layer():
    model = twell.hf.sparsify(tiny(seed=6)).train()
    assert all(t["neuron_counts"] is None for t in twell.hf.telemetry(model))
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(7))
    model(ids)
    tel = twell.hf.telemetry(model)
    assert len(tel) == 2
    for t in tel:
        assert t["neuron_counts"].shape == (176,) and t["neuron_counts"].dtype == torch.int64
        assert t["nnz_per_token"].item() == pytest.approx(t["neuron_counts"].sum().item() / 20)
