"""Train a ReLU Llama with the paper's recipe: cross-entropy + L1 on the FFN activations.

    python -m twell.train CONFIG.json --out RUN_DIR [--resume] [--steps N]

CONFIG is JSON (unknown keys are an error; `python -m twell.train --print-defaults` lists them):
the model (a preset or explicit sizes), the FFN path ("twell": twell.hf.sparsify, or "dense":
transformers' own MLP with ReLU), the corpus directories (twell.data), and the optimisation:
AdamW (β 0.9 / 0.95, weight decay 0.1), cosine schedule with linear warm-up, gradient clipping,
gradient accumulation, bf16 autocast, activation checkpointing. Every step appends a JSON line to
RUN_DIR/telemetry.jsonl (loss, L1, non-zeros per token per layer, dead neurons, re-initialised
neurons, tokens/s; validation loss when due; "dead" counts neurons silent for dead_window tokens). Checkpoints are plain Hugging Face directories
(RUN_DIR/checkpoint-STEP: save_pretrained + trainer_state.pt with the optimiser, the step and the
dead-neuron counters), written to a temporary directory and renamed, so a half-written one never
replaces a good one; RUN_DIR/latest names the newest. Under torchrun (WORLD_SIZE > 1) each rank
reads its own micro-batches (twell.data.Loader's rank split) and DDP averages the gradients: G ranks
at micro_batch b train like one rank at G·b; telemetry is reduced over the ranks and written by
rank 0, which also saves; re-initialisation decisions come from the reduced counts, so every rank
makes the same ones. --resume continues from it: the data order
is a function of the step (twell.data.Loader), so the next step equals the uninterrupted run's.

L1 term: per layer Σ|h| / tokens of the micro-batch (h the FFN's hidden activations, input of
down_proj), summed over layers, times l1_coeff (ramped up from 0 over the first l1_warmup steps when
that is set: progressive regularisation, as ProSparse). Dead-neuron re-initialisation (reinit_window > 0):
a neuron that has not fired for reinit_window tokens gets its gate row redrawn from N(0, init_std²)
(drawn from a generator seeded by the run's seed, the step and the layer: every rank the same)
and its AdamW moments zeroed (the paper's targeted gate re-init), counted in telemetry.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from typing import Any

import numpy as np
import torch

DEFAULTS: dict[str, Any] = {
    "init_from": "",  # a Hugging Face Llama checkpoint to start from instead of "model"
    "relufy": False,  # with init_from: a non-ReLU model's activation becomes ReLU (then fine-tune)
    "model": {"preset": "tiny"},  # or sizes: hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, vocab_size, max_position
    "ffn": "twell",
    "train_data": "",
    "val_data": "",
    "seq_len": 128,
    "micro_batch": 8,
    "grad_accum": 1,
    "steps": 100,
    "lr": 3e-4,
    "min_lr_ratio": 0.1,
    "warmup": 10,
    "weight_decay": 0.1,
    "betas": [0.9, 0.95],
    "clip": 1.0,
    "l1_coeff": 0.0,
    "l1_warmup": 0,  # steps over which the L1 coefficient ramps linearly from 0 to l1_coeff (progressive, as ProSparse); 0: full from step 1
    "bf16": False,
    "device": "auto",
    "parallel": "ddp",  # with several ranks: "ddp" (replicated weights) or "fsdp" (FSDP2: sharded weights and optimiser state)  # "cuda" (under torchrun: cuda:LOCAL_RANK), "cpu", or "auto": cuda when there is one
    "neuron_counts_every": 1,  # steps between per-neuron fire counts (dead neurons); on CUDA each costs a gate GEMM
    "position_profile_every": 0,  # steps between per-position non-zero profiles (0: never); each costs a gate GEMM
    "checkpointing": False,
    "compile": False,  # torch.compile the model's forward (and so its backward); the first steps compile
    "val_every": 0,
    "val_batches": 4,
    "save_every": 0,
    "dead_window": 4096,  # telemetry: a neuron silent for this many tokens counts as dead
    "reinit_window": 0,
    "init_std": 0.02,
    "seed": 0,
}

PRESETS = {  # hidden, intermediate, layers, heads (MHA), as twell's synthetic presets; vocab from the corpus
    "tiny": (64, 176, 2, 4),
    "small": (256, 704, 4, 4),
    "0.5b": (2048, 5632, 8, 32),
    "1b": (2048, 5632, 18, 32),
    "1.5b": (2048, 5632, 28, 32),
    "2b": (2048, 5632, 38, 32),
}


class ConfigError(ValueError):
    pass


def load_config(path_or_dict) -> dict:
    raw = path_or_dict
    if isinstance(path_or_dict, str):
        try:
            with open(path_or_dict) as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path_or_dict}: no such config file") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path_or_dict}: not valid JSON ({e})") from None
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown config keys {unknown}; known: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **raw}
    if cfg["ffn"] not in ("twell", "dense"):
        raise ConfigError(f"ffn must be 'twell' or 'dense', got {cfg['ffn']!r}")
    for k in ("seq_len", "micro_batch", "grad_accum", "steps"):
        if not isinstance(cfg[k], int) or cfg[k] < 1:
            raise ConfigError(f"{k} must be an integer ≥ 1, got {cfg[k]!r}")
    if not cfg["train_data"]:
        raise ConfigError("train_data (a twell corpus directory) is required")
    if cfg["l1_coeff"] < 0 or cfg["lr"] <= 0 or cfg["warmup"] < 0:
        raise ConfigError("l1_coeff ≥ 0, lr > 0 and warmup ≥ 0 are required")
    if not isinstance(cfg["l1_warmup"], int) or cfg["l1_warmup"] < 0:
        raise ConfigError(f"l1_warmup must be an integer ≥ 0 (steps), got {cfg['l1_warmup']!r}")
    if cfg["parallel"] not in ("ddp", "fsdp"):
        raise ConfigError(f"parallel must be 'ddp' or 'fsdp', got {cfg['parallel']!r}")
    if not isinstance(cfg["compile"], bool):
        raise ConfigError(f"compile must be true or false, got {cfg['compile']!r}")
    if cfg["device"] not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device must be 'auto', 'cpu' or 'cuda', got {cfg['device']!r}")
    if not isinstance(cfg["neuron_counts_every"], int) or cfg["neuron_counts_every"] < 1:
        raise ConfigError(f"neuron_counts_every must be an integer ≥ 1, got {cfg['neuron_counts_every']!r}")
    if not isinstance(cfg["position_profile_every"], int) or cfg["position_profile_every"] < 0:
        raise ConfigError(f"position_profile_every must be an integer ≥ 0, got {cfg['position_profile_every']!r}")
    m = cfg["model"]
    if "preset" in m and m["preset"] not in PRESETS:
        raise ConfigError(f"model preset {m['preset']!r} unknown; presets: {sorted(PRESETS)}")
    return cfg


def build_model(cfg: dict, vocab_size: int):
    import transformers

    if cfg["init_from"]:
        model = transformers.LlamaForCausalLM.from_pretrained(cfg["init_from"], dtype=torch.float32)
        act = model.config.hidden_act
        if act != "relu":
            if not cfg["relufy"]:
                raise ConfigError(f"{cfg['init_from']} uses {act!r}; set relufy: true to train it as a ReLU model")
            from transformers.activations import ACT2FN

            model.config.hidden_act = "relu"  # ReLU-fication: the config and every MLP's activation
            for layer in model.model.layers:
                layer.mlp.act_fn = ACT2FN["relu"]
        return model

    m = dict(cfg["model"])
    hidden, inter, layers, heads = PRESETS[m.pop("preset")] if "preset" in m else (
        m.pop("hidden_size"), m.pop("intermediate_size"), m.pop("num_layers"), m.pop("num_heads"))
    lc = transformers.LlamaConfig(
        vocab_size=m.pop("vocab_size", vocab_size), hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=m.pop("num_kv_heads", heads),
        max_position_embeddings=m.pop("max_position", max(cfg["seq_len"], 128)), hidden_act="relu",
        tie_word_embeddings=True, initializer_range=cfg["init_std"])
    if m:
        raise ConfigError(f"unknown model keys {sorted(m)}")
    torch.manual_seed(cfg["seed"])
    return transformers.LlamaForCausalLM(lc)


def pick_device(cfg: dict) -> torch.device:
    want = cfg["device"]
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device 'cuda' asked for, but PyTorch sees no CUDA device")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def l1_at(cfg: dict, step: int) -> float:
    """The L1 coefficient of step `step` (0-based): l1_coeff · (step + 1) / l1_warmup during the
    ramp, l1_coeff after it. A function of the step alone, so a resumed run continues the ramp."""
    ramp = cfg["l1_warmup"]
    if ramp <= 0 or step + 1 >= ramp:
        return cfg["l1_coeff"]
    return cfg["l1_coeff"] * (step + 1) / ramp


def lr_at(cfg: dict, step: int) -> float:
    if step < cfg["warmup"]:
        return cfg["lr"] * (step + 1) / cfg["warmup"]
    span = max(1, cfg["steps"] - cfg["warmup"])
    t = min(1.0, (step - cfg["warmup"]) / span)
    lo = cfg["lr"] * cfg["min_lr_ratio"]
    return lo + (cfg["lr"] - lo) * 0.5 * (1 + math.cos(math.pi * t))


class FfnProbe:
    """Per layer, the L1 term and the counts of one forward, for either FFN path: SparseMLP's own
    (twell) or a hook on down_proj's input h (dense); and, when asked (`profile_positions`), each
    layer's non-zeros per token by position in the sequence, averaged over the batch."""

    def __init__(self, model, path: str):
        self.layers = [layer.mlp for layer in model.model.layers]
        self.path = path
        self.dense = [None] * len(self.layers)
        self.profiling = False
        self.positions: list = [None] * len(self.layers)
        for i, mlp in enumerate(self.layers):
            if path == "dense":
                mlp.down_proj.register_forward_pre_hook(self._hook(i))
            else:  # the pattern from the MLP's input: one gate GEMM, only while profiling
                mlp.register_forward_pre_hook(self._input_hook(i))

    def _hook(self, i):
        def hook(module, args):
            h = args[0].reshape(-1, args[0].shape[-1])
            fired = h.detach() != 0
            self.dense[i] = (h.float().abs().sum() / h.shape[0], fired.sum() / h.shape[0], fired.sum(0))
            if self.profiling and args[0].dim() == 3:
                self.positions[i] = (args[0].detach() != 0).sum(-1).float().mean(0)
        return hook

    def _input_hook(self, i):
        def hook(module, args):
            if self.profiling and args[0].dim() == 3:
                act = module.gate_proj if module.gate_proj is not None else module.up_proj
                with torch.no_grad():
                    pre = torch.nn.functional.linear(args[0].detach(), act.weight.detach().to(args[0].dtype))
                    self.positions[i] = (pre > 0).sum(-1).float().mean(0)
        return hook

    def profile_positions(self, on: bool) -> None:
        """Whether the forwards from now on record each layer's non-zeros by position (on: the
        previous profile is dropped)."""
        self.profiling = on
        if on:
            self.positions = [None] * len(self.layers)

    def position_profile(self) -> list | None:
        """Non-zeros per token by position, the mean over the layers, of the last profiled forward."""
        if any(p is None for p in self.positions):
            return None
        return (torch.stack(self.positions).mean(0)).tolist()

    def count_neurons(self, on: bool) -> None:
        """Whether the next forwards count each neuron's firings (twell on CUDA: one gate GEMM each)."""
        for m in self.layers:
            if hasattr(m, "count_neurons"):
                m.count_neurons = on

    def l1(self) -> torch.Tensor:
        if self.path == "twell":
            return torch.stack([m.l1 for m in self.layers]).sum()
        return torch.stack([d[0] for d in self.dense]).sum()

    def counts(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(non-zeros per token, per-neuron fire counts) of each layer's last training forward, as
        tensors: reading them is left to the caller, once a step."""
        if self.path == "twell":
            return [(m.stats.l0, m.stats.neuron_counts) for m in self.layers]
        return [(d[1], d[2].to(torch.int64)) for d in self.dense]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def full_state(model, opt, sharded: bool):
    """The model's and the optimiser's whole state, as one process holds it. FSDP: gathered from
    the ranks (every rank must call this), onto the CPU; the optimiser state keyed by names."""
    if not sharded:
        return None, opt.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    o = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=o), get_optimizer_state_dict(model, opt, options=o)


def atomic_save(model, opt_state, state: dict, out: str, step: int, model_state=None) -> str:
    final = os.path.join(out, f"checkpoint-{step}")
    tmp = os.path.join(out, f".tmp-checkpoint-{step}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=model_state)
    # The tokenizer (init_from's, else the one the corpus names, when the corpus holds it), so that
    # `twell generate --model` runs on the checkpoint.
    src = state["config"].get("init_from") or state["config"].get("train_data")
    for name in TOKENIZER_FILES if src else ():
        if os.path.exists(os.path.join(src, name)) and not os.path.exists(os.path.join(tmp, name)):
            shutil.copy(os.path.join(src, name), os.path.join(tmp, name))
    torch.save({"optimizer": opt_state, **state}, os.path.join(tmp, "trainer_state.pt"))
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = os.path.join(out, ".latest.tmp")
    with open(latest_tmp, "w") as f:
        f.write(os.path.basename(final) + "\n")
    os.replace(latest_tmp, os.path.join(out, "latest"))
    return final


def train(cfg: dict, out: str, *, resume: bool = False, progress: bool = True, stop_after: int | None = None) -> dict:
    """Runs (or resumes) the training of `cfg` into `out`; returns the last step's telemetry record.
    stop_after: stop after this step (an interruption, for tests) without a final checkpoint."""
    import transformers

    import twell.hf
    from twell import _cuda as twell_cuda
    from twell.data import Loader

    import torch.distributed as dist

    # Several ranks: torchrun's environment (WORLD_SIZE, RANK, MASTER_ADDR/PORT) or a process group
    # the caller made. Each rank reads its own micro-batches; DDP averages the gradients.
    own_group = False
    device = pick_device(cfg)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        own_group = True
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        os.makedirs(out, exist_ok=True)
    torch.manual_seed(cfg["seed"])
    train_data = Loader(cfg["train_data"], cfg["seq_len"], cfg["micro_batch"], accum=cfg["grad_accum"], seed=cfg["seed"],
                        rank=rank, world=world)
    vocab = train_data.manifest["vocab_size"]
    val_data = Loader(cfg["val_data"], cfg["seq_len"], cfg["micro_batch"], seed=cfg["seed"] + 1) if cfg["val_data"] else None
    start, state = 0, {}
    latest = os.path.join(out, "latest")
    if resume:
        if not os.path.exists(latest):
            raise FileNotFoundError(f"--resume: {out} has no checkpoint (no 'latest')")
        ckpt = os.path.join(out, open(latest).read().strip())
        model = transformers.LlamaForCausalLM.from_pretrained(ckpt)
        state = torch.load(os.path.join(ckpt, "trainer_state.pt"), weights_only=False, map_location="cpu")
        # steps may grow (a longer run); micro_batch and grad_accum may change with the rank count as
        # long as the global batch stays; anything else would not continue the same run.
        changed = sorted(k for k in cfg if k not in ("steps", "micro_batch", "grad_accum", "device", "neuron_counts_every", "compile")
                         and state["config"].get(k, DEFAULTS.get(k)) != cfg[k])
        if changed:
            raise ConfigError(f"--resume: {ckpt} was trained with other values of {changed}")
        old = state["config"]["micro_batch"] * state["config"]["grad_accum"] * state.get("world", 1)
        new = cfg["micro_batch"] * cfg["grad_accum"] * world
        if old != new:
            raise ConfigError(f"--resume: {ckpt} was trained with {old} sequences a step (micro_batch × grad_accum × "
                              f"ranks); this run would take {new}")
        start = state["step"]
    else:
        if os.path.exists(latest):
            raise FileExistsError(f"{out} already holds a run (pass --resume to continue it)")
        if world > 1:
            dist.barrier()  # every rank has checked before rank 0 writes anything
        model = build_model(cfg, vocab)
    if model.config.vocab_size < vocab:
        raise ConfigError(f"the corpus has ids up to {vocab - 1}; the model's vocabulary is {model.config.vocab_size}")
    model.to(device)
    if cfg["ffn"] == "twell":
        twell.hf.sparsify(model)
    if cfg["checkpointing"]:
        model.gradient_checkpointing_enable()
    model.train()
    probe = FfnProbe(model, cfg["ffn"])
    core = model  # the HF model itself (saving, re-init); `model` may become its DDP wrapper
    sharded = cfg["parallel"] == "fsdp"
    if sharded and world > 1:
        # FSDP2: each decoder layer's parameters sharded over the ranks (gathered for its forward
        # and backward), then the rest (embeddings, final norm, head) at the root.
        from torch.distributed.fsdp import fully_shard

        for layer in core.model.layers:
            fully_shard(layer)
        fully_shard(core)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    # Compiled after the DDP / FSDP wrapping, as PyTorch recommends; `core` (saving, evaluation,
    # re-initialisation) stays the plain module, whose parameters the compiled one shares.
    forward = torch.compile(model) if cfg["compile"] else model
    decay = [p for p in core.parameters() if p.dim() >= 2]
    no_decay = [p for p in core.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg["lr"], betas=tuple(cfg["betas"]))
    layers = len(probe.layers)
    silent = [torch.zeros(core.config.intermediate_size, dtype=torch.int64, device=device) for _ in range(layers)]
    if resume and sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(core, opt, optim_state_dict=state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
    if resume:
        if not sharded:
            opt.load_state_dict(state["optimizer"])  # moved to the parameters' device
        silent = [t.to(device) for t in state["silent_tokens"]]
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
    log = open(os.path.join(out, "telemetry.jsonl"), "a") if rank == 0 else None
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=cfg["steps"], initial=start, desc="train", unit="step", file=sys.stderr)
    record: dict = {}
    tokens_per_step = cfg["seq_len"] * cfg["micro_batch"] * cfg["grad_accum"] * world
    for step in range(start, cfg["steps"]):
        if sharded and world > 1:
            # FSDP gathers each step's weights into the same unsharded tensors, possibly without a
            # version bump: twell's CUDA contexts copy them again (a no-op on the CPU).
            twell_cuda.weights_changed()
        t0 = time.perf_counter()
        lr = lr_at(cfg, step)
        for g in opt.param_groups:
            g["lr"] = lr
        # ce, l1 and each layer's non-zeros per token, averaged over the micro-batches; read once a step.
        sums = torch.zeros(2 + layers, dtype=torch.float64, device=device)
        l1_coeff = l1_at(cfg, step)
        fired = [torch.zeros_like(s) for s in silent]
        counting = step % cfg["neuron_counts_every"] == 0 or step + 1 == cfg["steps"]
        probe.count_neurons(counting)
        every = cfg["position_profile_every"]
        profiling = every > 0 and ((step + 1) % every == 0 or step + 1 == cfg["steps"])
        for micro in range(cfg["grad_accum"]):
            # Gradients cross the ranks once a step, after the last micro-batch: DDP's no_sync and
            # FSDP2's set_requires_gradient_sync keep the others local (the sum is the same).
            last_micro = micro + 1 == cfg["grad_accum"]
            if sharded and world > 1:
                core.set_requires_gradient_sync(last_micro)
            no_sync = model.no_sync() if world > 1 and not sharded and not last_micro else contextlib.nullcontext()
            probe.profile_positions(profiling and micro == 0)  # the step's first micro-batch
            ids = torch.from_numpy(train_data.batch(step, micro)).to(device, non_blocking=True)
            with no_sync:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg["bf16"]):
                    logits = forward(input_ids=ids[:, :-1]).logits
                    probe.profile_positions(False)  # not again in a checkpointed recomputation
                    ce = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
                    l1 = probe.l1()
                    loss = (ce + l1_coeff * l1) / cfg["grad_accum"]
                loss.backward()
            counts = probe.counts()
            sums += torch.stack([t.detach().double() for t in (ce, l1, *(c[0] for c in counts))]) / cfg["grad_accum"]
            if counting:
                for f, (_, per_neuron) in zip(fired, counts):
                    f += per_neuron
        if world > 1:  # telemetry over all ranks: means of the scalars, sums of the counts
            dist.all_reduce(sums)
            sums /= world
            for f in fired:
                dist.all_reduce(f)
        ce_sum, l1_sum, *nnz = sums.tolist()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        grad_norm = (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()  # FSDP: a DTensor
        opt.step()
        opt.zero_grad(set_to_none=True)
        # Dead neurons: tokens since each neuron last fired (counted on the steps that count; the
        # others add nothing); re-initialise those past the window.
        reinit = [0] * layers
        dead = [0] * layers
        for i in range(layers):
            if counting:
                silent[i] = torch.where(fired[i] > 0, torch.zeros_like(silent[i]), silent[i] + tokens_per_step)
            dead[i] = int((silent[i] >= cfg["dead_window"]).sum())
            if cfg["reinit_window"] > 0:
                rows = (silent[i] >= cfg["reinit_window"]).nonzero().flatten()
                if rows.numel():
                    # The counts were reduced over the ranks and the draws are seeded by (seed, step,
                    # layer): every rank re-initialises the same rows with the same values.
                    reinit[i] = reinit_gate_rows(probe.layers[i].gate_proj.weight, rows, cfg["init_std"], opt,
                                                 seed=reinit_seed(cfg["seed"], step, i))
                    # twell's weight caches see the write: the parameter's version counter moves
                    # (FSDP: the shard changes; every FSDP step drops the caches anyway).
                    silent[i][rows] = 0
        dt = time.perf_counter() - t0
        record = {"step": step + 1, "lr": lr, "l1_coeff": l1_coeff, "loss": ce_sum, "l1": l1_sum, "grad_norm": grad_norm,
                  "nnz_per_token": nnz, "density": [v / core.config.intermediate_size for v in nnz],
                  "dead": dead, "reinit": reinit, "tokens_per_s": tokens_per_step / dt}
        if profiling:
            record["nnz_by_position"] = [round(v, 3) for v in probe.position_profile()]
        if cfg["ffn"] == "twell" and device.type == "cuda":  # host values the forwards had anyway (this rank's)
            infos = [m.last_train_info for m in probe.layers]
            record["hot_neurons"] = [i.get("hot_neurons", 0) for i in infos]
            record["dense_rows"] = [i.get("dense_rows", 0) for i in infos]
            record["sparse_step"] = [i.get("sparse", False) for i in infos]
            record["overflow_rows"] = [i.get("overflow_rows", -1) for i in infos]
        if device.type == "cuda":  # PyTorch's allocator peak plus what twell's layer contexts hold beside it
            record["peak_memory_gib"] = (torch.cuda.max_memory_allocated(device) + twell_cuda.context_bytes()) / 2**30
        if val_data is not None and cfg["val_every"] and ((step + 1) % cfg["val_every"] == 0 or step + 1 == cfg["steps"]):
            record["val_loss"] = evaluate(core, val_data, cfg)  # each rank the same batches
        if log is not None:
            log.write(json.dumps(record) + "\n")
            log.flush()
        if bar is not None:
            bar.set_postfix(loss=f"{ce_sum:.3f}", l1=f"{l1_sum:.3g}", nnz=f"{sum(nnz) / layers:.1f}")
            bar.update(1)
        last = step + 1 == cfg["steps"]
        if (cfg["save_every"] and (step + 1) % cfg["save_every"] == 0) or last:
            if world > 1 and not sharded:  # DDP replicas must be bit-identical before rank 0 saves them
                check_replicas(core, step + 1)
            model_state, opt_state = full_state(core, opt, sharded)  # FSDP: every rank takes part
            if rank == 0:  # the ranks' (gathered) weights, optimiser states and counters are identical
                atomic_save(core, opt_state, {"step": step + 1, "config": cfg, "world": world,
                                              "silent_tokens": [t.cpu() for t in silent],
                                              "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()},
                            out, step + 1, model_state)
            if world > 1:
                dist.barrier()
        if stop_after is not None and step + 1 >= stop_after:
            break
    if bar is not None:
        bar.close()
    if log is not None:
        log.close()
    if own_group:
        dist.destroy_process_group()
    return record


def replica_fingerprint(model) -> torch.Tensor:
    """Two float64 sums per parameter (its even and its odd elements; strided views, no copies):
    equal on every rank when the replicas agree (DDP replicas apply the same averaged gradients in
    the same kernels: bit-identical), and any change to one rank's weights shows, in practice."""
    out = []
    for p in model.parameters():
        v = p.detach().reshape(-1)
        out += [v[0::2].sum(dtype=torch.float64), v[1::2].sum(dtype=torch.float64)]
    return torch.stack(out)


def check_replicas(model, step: int) -> None:
    """Raises if the ranks' copies of the model differ (a re-initialisation drawn differently, a
    write one rank alone made): a silently diverged run would save rank 0's weights as if they were
    everyone's. Collective: every rank calls it."""
    import torch.distributed as dist

    mine = replica_fingerprint(model)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    bad = [r for r, f in enumerate(every) if not torch.equal(f, every[0])]
    if bad:
        raise RuntimeError(f"twell.train: at step {step} the weights of ranks {bad} differ from rank 0's "
                           "(DDP replicas must stay identical); not saving a diverged model")


def reinit_seed(seed: int, step: int, layer: int) -> int:
    """The seed of one re-initialisation's draws: a function of the run's seed, the step and the
    layer, so every rank draws the same rows without talking to the others (and a resumed run the
    same as the uninterrupted one)."""
    return int.from_bytes(hashlib.sha256(f"twell-reinit/{seed}/{step}/{layer}".encode()).digest()[:8], "little") >> 1


def _local_rows(t: torch.Tensor):
    """(the tensor whose rows this process holds, the global index of its first row): the tensor
    itself, or for an FSDP2 parameter (a DTensor sharded on dim 0 in torch.chunk's way) the local
    shard and its offset."""
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:  # an older PyTorch: no DTensor, nothing sharded
        return t, 0
    if not isinstance(t, DTensor):
        return t, 0
    if len(t.placements) != 1 or t.placements[0] != Shard(0):
        raise NotImplementedError(f"re-initialising rows of a DTensor placed as {t.placements} (FSDP2 shards dim 0)")
    local = t.to_local()
    world, rank = t.device_mesh.size(), t.device_mesh.get_local_rank()
    chunk = -(-t.shape[0] // world)
    first = rank * chunk
    if local.shape[0] != max(0, min(t.shape[0], first + chunk) - first):
        raise RuntimeError(f"shard of {local.shape[0]} rows at rank {rank} of {world} is not torch.chunk's split of {t.shape[0]}")
    return local, first


def reinit_gate_rows(w: torch.Tensor, rows: torch.Tensor, std: float, opt, seed: int = 0) -> int:
    """Redraws w[rows] from N(0, std²) and zeroes their AdamW moments. Returns the row count.
    The draws come from a generator seeded with `seed` (see reinit_seed): identical on every rank.
    An FSDP2-sharded w (and its moments) is written where this rank holds the rows."""
    rows = rows.to("cpu", torch.int64)
    g = torch.Generator(device="cpu").manual_seed(seed)
    draws = torch.randn(rows.numel(), w.shape[1], generator=g, dtype=torch.float32) * std
    with torch.no_grad():
        local, first = _local_rows(w)
        mine = (rows >= first) & (rows < first + local.shape[0])
        at = (rows[mine] - first).to(local.device)
        local[at] = draws[mine].to(local.device, local.dtype)
        st = opt.state.get(w)
        for key in ("exp_avg", "exp_avg_sq") if st else ():
            if key in st:
                moment, m_first = _local_rows(st[key])
                assert m_first == first
                moment[at] = 0
    return int(rows.numel())


@torch.no_grad()
def evaluate(model, data, cfg) -> float:
    was = model.training
    model.eval()
    total = 0.0
    device = next(model.parameters()).device
    for b in range(cfg["val_batches"]):
        ids = torch.from_numpy(data.batch(b)).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg["bf16"]):
            logits = model(input_ids=ids[:, :-1]).logits
        total += torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()
    model.train(was)
    return total / cfg["val_batches"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m twell.train", description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", help="JSON config (see --print-defaults)")
    ap.add_argument("--out", help="run directory (telemetry.jsonl, checkpoint-STEP/, latest)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    ap.add_argument("--steps", type=int, help="override the config's steps")
    ap.add_argument("--print-defaults", action="store_true", help="print every config key with its default")
    a = ap.parse_args(argv)
    if a.print_defaults:
        print(json.dumps(DEFAULTS, indent=1))
        return 0
    if not a.config or not a.out:
        ap.error("CONFIG and --out are required")
    try:
        cfg = load_config(a.config)
        if a.steps:
            cfg["steps"] = a.steps
        rec = train(cfg, a.out, resume=a.resume, progress=sys.stderr.isatty())
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"twell.train: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
