"""Hugging Face `transformers` integration: a Llama model's MLPs through twell, and back.

    model = LlamaForCausalLM(config)            # config.hidden_act == "relu"
    twell.hf.sparsify(model)                    # every LlamaMLP → twell.torch.SparseMLP, in place
    loss = model(ids, labels=ids).loss + 1e-3 * twell.hf.l1_loss(model)
    model.save_pretrained(out)                  # a plain HF checkpoint: the parameters never moved
    twell.hf.unsparsify(model)                  # the original modules back

SparseMLP keeps the original `gate_proj` / `up_proj` / `down_proj` Linear modules (the same
Parameter objects), so state_dict keys, optimizers built before the swap, `save_pretrained` and
`from_pretrained` all see the model unchanged. A SiLU (or other) model is refused unless
`convert_silu=True`, which sets `hidden_act = "relu"`: the model computes a different function
then and needs fine-tuning (ReLU-fication, as ProSparse and TurboSparse did).
"""
from __future__ import annotations

import torch

from .torch import SparseMLP

__all__ = ["sparsify", "unsparsify", "l1_loss", "sparse_mlps", "telemetry"]


def _is_llama_mlp(m: torch.nn.Module) -> bool:
    return all(isinstance(getattr(m, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")) \
        and not isinstance(m, SparseMLP)


def sparsify(model: torch.nn.Module, *, convert_silu: bool = False, ell_width: int = 128) -> torch.nn.Module:
    """Swaps every Llama-style MLP (gate_proj, up_proj, down_proj) of `model` for a SparseMLP sharing
    its Linear modules. Returns `model`. Raises ValueError for a non-ReLU model (unless
    convert_silu), MLP projections with biases, or a model without any such MLP."""
    config = getattr(model, "config", None)
    act = getattr(config, "hidden_act", None)
    if act != "relu":
        if not convert_silu:
            raise ValueError(f"twell.hf.sparsify: the model's hidden_act is {act!r}; twell's FFN is ReLU-gated. "
                             "Pass convert_silu=True to switch it to ReLU (the model then needs fine-tuning)")
        config.hidden_act = "relu"
    swaps = []
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            if _is_llama_mlp(child):
                swaps.append((module, child_name, child, f"{name}.{child_name}" if name else child_name))
    if not swaps:
        raise ValueError("twell.hf.sparsify: no Llama-style MLP (gate_proj, up_proj, down_proj) in this model")
    for parent, child_name, old, full in swaps:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            if getattr(old, proj).bias is not None:
                raise ValueError(f"twell.hf.sparsify: {full}.{proj} has a bias; twell's FFN takes none")
    for parent, child_name, old, _ in swaps:
        new = SparseMLP.of(old.gate_proj, old.up_proj, old.down_proj, ell_width)
        object.__setattr__(new, "_twell_original", old)  # not a registered submodule: no duplicate keys
        setattr(parent, child_name, new)
    return model


def sparse_mlps(model: torch.nn.Module) -> list[SparseMLP]:
    return [m for m in model.modules() if isinstance(m, SparseMLP)]


def unsparsify(model: torch.nn.Module) -> torch.nn.Module:
    """Puts back the modules sparsify() replaced (with the current weights). Returns `model`."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            original = getattr(child, "_twell_original", None)
            if isinstance(child, SparseMLP) and original is not None:
                setattr(module, child_name, original)
    return model


def l1_loss(model: torch.nn.Module) -> torch.Tensor:
    """Σ over the sparsified MLPs of their last forward's l1 (Σ|h| / tokens each; NaN after a
    forward without gradients). Add `coeff * l1_loss(model)` to the loss."""
    terms = [m.l1 for m in sparse_mlps(model) if m.l1 is not None]
    if not terms:
        raise RuntimeError("twell.hf.l1_loss: no sparsified MLP has run a forward yet")
    return torch.stack(terms).sum()


def telemetry(model: torch.nn.Module) -> list[dict]:
    """Per sparsified MLP, in module order, what its last training forward counted: `nnz_per_token`
    (0-dim tensor) and `neuron_counts` (int64 [N]: tokens in which each neuron fired; a neuron at 0
    over a window of steps is dead). Tensors, so collecting them waits for nothing; None entries for
    MLPs that have not run a training forward. On CUDA also the dispatch facts the forward had on the
    host anyway (`SparseMLP.last_train_info`): `sparse`, `hot_neurons`, `dense_rows`, `csr_nnz`,
    `overflow_rows`."""
    out = []
    for m in sparse_mlps(model):
        s = m.stats
        rec = {"nnz_per_token": None if s is None else s.l0, "neuron_counts": None if s is None else s.neuron_counts}
        info = m.last_train_info
        if info:
            rec.update(sparse=info["sparse"], hot_neurons=info["hot_neurons"], dense_rows=info["dense_rows"],
                       csr_nnz=info["nnz"], overflow_rows=info.get("overflow_rows", -1))
        out.append(rec)
    return out
