#!/usr/bin/env python3
"""A whole model's training step (issue 29's model-level outcome): the same Hugging Face Llama, the
same step, with its MLPs through twell and through PyTorch's dense path, each in its own process.

    python3 bench/train/model_step.py --model DIR [--seq 2048 --micro-batch 4 --steps 10] [--out DIR]

DIR is a Hugging Face Llama checkpoint with ReLU MLPs, e.g. `twell gen model --config 1b --out DIR`
(a synthetic checkpoint whose FFNs fire at the paper's per-layer densities on random tokens).
Modes (--modes, each a fresh process so that memory peaks and compile caches do not mix):
  hf-eager        transformers' LlamaMLP as it is, eager: the paper's baseline
  dense-compiled  the same under torch.compile (default mode) of the loss function: the strongest
                  dense PyTorch step
  twell           twell.hf.sparsify(model), eager
  twell-compiled  twell.hf.sparsify(model) under torch.compile (twell's custom ops in the graph)
  twell-dense-compiled  the same with twell's ops held on their dense (cuBLASLt) path: what the
                  integration costs (weight copies, gradient copies, graph breaks) without the
                  sparse kernels' gain (not in the default --modes)
  no-ffn-compiled the bound any FFN can reach: dense-compiled with every MLP returning zeros (no
                  forward, no backward, nothing saved), its weights kept with zero gradients so that
                  clipping and AdamW do the same work and hold the same state (not in the default
                  --modes)
Every mode runs the same step: fp32 master weights, bf16 autocast, SDPA attention (flash), loss =
cross-entropy + l1_coeff · Σ_layers Σ|h| / tokens (the dense modes compute the L1 from h), gradient
clipping at 1.0, fused AdamW (β 0.9 / 0.95, weight decay 0.1 on matrices). Inputs: random token
ids (the distribution the synthetic checkpoint was calibrated on). The learning rate is 0 by
default (--lr): the optimiser does all its work (moments, the in-place update that makes twell copy
the weights again), but the checkpoint's density holds over the timed steps. With lr 1e-5 on the
synthetic 1b checkpoint (whose loss is huge: random weights) the density rose from 0.5 % to 6–8 %
within 11 steps and both paths ran dense.
Timing: --warmup steps (compilation included), then --steps steps back to back between two
synchronisations (as a training loop runs; the losses are read after). Memory: the peak of
PyTorch's allocator over the run plus, for twell, the device memory its layer contexts hold
beside it (weights in the kernels' layouts, workspaces, fp32 gradient buffers).
Several GPUs (--gpus G, issue 30): each mode runs under `torchrun --standalone --nproc-per-node G`,
its model wrapped in DDP (--parallel ddp: replicated weights, gradients all-reduced) or FSDP2
(--parallel fsdp: each decoder layer and the root `fully_shard`ed, so weights, gradients and AdamW
state are split over the ranks); each rank reads its own random micro-batches, so a step moves
G × micro-batch × seq tokens. tokens/s counts all ranks; peak memory is the largest rank's; the
densities are rank 0's. NCCL_NVLS_ENABLE=0 is set (NVLink multicast stays off).
Writes model_step-TAG.json and .md under --out and prints the table. --repeat N runs every mode N
times, interleaved, each run a process of its own (ratios against the dense modes' medians).
"""
import argparse
import contextlib
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("hf-eager", "dense-compiled", "twell", "twell-compiled", "twell-dense-compiled", "no-ffn-compiled")


def hold_twell_path(mode: str) -> str:
    """The path every CUDA call of twell's ops takes in this mode's process: "dense" for
    twell-dense-compiled (the integration's cost without the sparse kernels' gain), else
    "automatic". (Until session 44 this line sat in the module's docstring instead of the code, so
    twell-dense-compiled ran exactly what twell-compiled ran.)"""
    from twell import _cuda as twell_cuda

    twell_cuda.path = "dense" if mode == "twell-dense-compiled" else "automatic"
    return twell_cuda.path


def _over_linears(old):
    """A module base holding `old`'s gate_proj, up_proj and down_proj (the same Linear modules, so
    the same parameters) and an L1 term of its last forward in self.l1, as twell's SparseMLP."""
    import torch

    class OverLinears(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = old.gate_proj, old.up_proj, old.down_proj
            self.l1 = None

    return OverLinears


def dense_relu_mlp(mlp):
    """A module computing LlamaMLP's function, down(relu(gate x) ⊙ up x), over the same Linear
    modules, that keeps its L1 term (Σ|h| / tokens: h = ReLU(g) ⊙ u has either sign) in self.l1 as
    twell's SparseMLP does."""
    import torch

    class DenseReluMLP(_over_linears(mlp)):
        def forward(self, x):
            h = torch.relu(self.gate_proj(x)) * self.up_proj(x)
            self.l1 = h.float().abs().sum() / (h.numel() // h.shape[-1])
            return self.down_proj(h)

    return DenseReluMLP()


def no_ffn_mlp(mlp):
    """A module over the same Linear modules that computes nothing: zeros of x's shape (the layer's
    residual add keeps x), an L1 term of 0. What a step costs without any FFN work: the bound of
    every FFN implementation's step time and memory (the weights stay: zero_grads gives them their
    gradients, so the optimiser's work and state are the other modes')."""
    import torch

    class NoFFN(_over_linears(mlp)):
        def forward(self, x):
            self.l1 = x.new_zeros((), dtype=torch.float32)
            return torch.zeros_like(x)

        def zero_grads(self):
            for p in self.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)

    return NoFFN()


def measure_density(model, ids, dev) -> list:
    """Per layer, the share of h's entries that are non-zero on `ids` (a no-grad forward through
    transformers' own MLPs, hooked at down_proj's input)."""
    import torch

    counted = []
    hooks = [layer.mlp.down_proj.register_forward_pre_hook(
        lambda mod, args: counted.append(float((args[0] != 0).sum()) / args[0].numel())) for layer in model.model.layers]
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
        model(input_ids=ids[:, :-1])
    for h in hooks:
        h.remove()
    return counted


def one(a) -> dict:
    """Runs one mode in this process; returns its measurements."""
    import torch
    import torch.nn.functional as F
    import transformers

    import torch.distributed as dist

    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device(a.device)
    if world > 1:  # under torchrun: one rank a GPU
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if a.device == "cuda" else dev
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    cuda = dev.type == "cuda"
    model = transformers.LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa")
    if model.config.hidden_act != "relu":
        raise SystemExit(f"{a.model}: hidden_act is {model.config.hidden_act!r}; a ReLU checkpoint is needed")
    model.to(dev).train()
    g = torch.Generator(device="cpu").manual_seed(1 + rank)  # each rank its own micro-batches
    vocab = model.config.vocab_size
    batches = [torch.randint(0, vocab, (a.micro_batch, a.seq + 1), generator=g).to(dev) for _ in range(4)]
    density_start = measure_density(model, batches[0], dev)
    twell_mode = a.mode.startswith("twell")
    if twell_mode:
        import twell.hf
        from twell import _cuda as twell_cuda

        twell.hf.sparsify(model)
        hold_twell_path(a.mode)
        mlps = twell.hf.sparse_mlps(model)
        for m in mlps:
            m.count_neurons = False  # the per-neuron counts cost a gate GEMM; non-zeros per token are free
    elif a.mode == "hf-eager":
        mlps = []  # transformers' own module; its L1 from a hook on down_proj's input (h)
        terms: list = []

        def hook(module, args):
            h = args[0]
            terms.append(h.float().abs().sum() / (h.numel() // h.shape[-1]))

        for layer in model.model.layers:
            layer.mlp.down_proj.register_forward_pre_hook(hook)
    else:
        wrap = no_ffn_mlp if a.mode == "no-ffn-compiled" else dense_relu_mlp
        for layer in model.model.layers:
            layer.mlp = wrap(layer.mlp)
        mlps = [layer.mlp for layer in model.model.layers]
    core = model  # the HF module (its MLPs, its config); `model` may become its DDP wrapper
    if world > 1 and a.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in core.model.layers:
            fully_shard(layer)
        fully_shard(core)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev] if cuda else None)
    decay = [p for p in core.parameters() if p.dim() >= 2]
    no_decay = [p for p in core.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), fused=True)

    def loss_fn(ids):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids[:, :-1]).logits
            ce = F.cross_entropy(logits.float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
            if a.mode == "hf-eager":
                l1 = torch.stack(terms).sum()
                terms.clear()
            else:
                l1 = torch.stack([m.l1 for m in mlps]).sum()
            return ce + a.l1_coeff * l1, ce.detach(), l1.detach()

    fn = torch.compile(loss_fn) if a.mode.endswith("compiled") else loss_fn
    if a.mode.endswith("compiled"):
        from torch._dynamo.utils import counters

    params = list(core.parameters())
    fsdp = world > 1 and a.parallel == "fsdp"

    ddp = world > 1 and not fsdp
    accum = a.grad_accum

    def step(i):
        if fsdp and twell_mode:
            twell_cuda.weights_changed()  # FSDP refills the gathered weights without a version bump
        for micro in range(accum):  # gradients cross the ranks after the last micro-batch only
            last = micro + 1 == accum
            if fsdp:
                core.set_requires_gradient_sync(last)
            with model.no_sync() if ddp and not last else contextlib.nullcontext():
                loss, ce, l1 = fn(batches[(i * accum + micro) % len(batches)])
                (loss / accum if accum > 1 else loss).backward()
        if a.mode == "no-ffn-compiled":
            for m in mlps:
                m.zero_grads()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return ce, l1

    if world > 1:  # the ranks wait for each other at every collective; start them together
        def sync():
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
    else:
        sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    t_warm = time.perf_counter()
    for i in range(a.warmup):
        step(i)
    sync()
    warm_s = time.perf_counter() - t_warm
    out = []
    times = []
    # Each back-to-back step between two events on the stream (no host wait): their median is
    # robust to one slow step (an allocator retry near the memory limit moved a 6-step mean by 40 %).
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)] if cuda else []
    t0 = time.perf_counter()
    for i in range(a.steps):
        if cuda:
            marks[i].record()
        out.append(step(a.warmup + i))
    if cuda:
        marks[-1].record()
    sync()
    total = time.perf_counter() - t0
    each = [marks[i].elapsed_time(marks[i + 1]) for i in range(a.steps)] if cuda else []
    # Per step, one at a time (the host waits before each): the spread, and a check on the back-to-back mean.
    for i in range(min(3, a.steps)):
        sync()
        t = time.perf_counter()
        step(a.warmup + a.steps + i)
        sync()
        times.append(time.perf_counter() - t)
    if a.profile:  # one more step under torch.profiler: where the device waits (after the timing)
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        sync()
        with profile(activities=acts) as prof:
            step(a.warmup + a.steps + 3)
            sync()
        extra_profile = profile_summary(prof)
    peak = torch.cuda.max_memory_allocated(dev) if cuda else 0
    ctx = twell_cuda.context_bytes() if twell_mode and cuda else 0
    # Density of the last training step: twell's counts, or h's non-zeros on one batch (untimed).
    if twell_mode:
        density = [float(m.stats.l0.float().mean()) / core.config.intermediate_size for m in mlps if m.stats is not None]
    else:
        density = measure_density(core, batches[0], dev)  # every rank: under FSDP the forward gathers
    tokens = a.micro_batch * a.seq * world * accum
    extra = {}
    if world > 1:  # the largest rank's memory (FSDP's shards differ a little; DDP's replicas not at all)
        peaks = torch.tensor([float(peak), float(ctx)], dtype=torch.float64, device=dev if cuda else "cpu")
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
        peak, ctx = int(peaks[0]), int(peaks[1])
        extra.update(world=world, parallel=a.parallel)
    if a.profile:
        extra["profile"] = extra_profile
    if a.mode.endswith("compiled"):
        extra["dynamo_graphs"] = counters["stats"].get("unique_graphs", 0)
        extra["graph_breaks"] = sum(counters["graph_break"].values())
        extra["graph_break_reasons"] = sorted(counters["graph_break"])[:8]
    if twell_mode:
        extra["recomputes"] = sum(lay.recomputes for lay in twell_cuda._layers.values())
        extra["twell_path"] = twell_cuda.path  # what every CUDA call of the ops was asked for
        if cuda:  # the contexts' memory: shared by the layers, and each layer's own
            extra["twell_shared_gib"] = sum(x.bytes for x in twell_cuda._scratch.values()) / 2**30
            extra["twell_own_gib_per_layer"] = [lay.train.own_bytes / 2**30 for lay in twell_cuda._layers.values()
                                                if lay.train is not None]
    return {**extra, "mode": a.mode, "step_ms": 1e3 * total / a.steps, "tokens_per_s": tokens * a.steps / total,
            "step_ms_one_at_a_time": [1e3 * t for t in times], "step_ms_each": each,
            "step_ms_median": statistics.median(each) if each else 1e3 * total / a.steps, "warmup_s": warm_s,
            "peak_allocated_gib": peak / 2**30, "twell_context_gib": ctx / 2**30, "peak_gib": (peak + ctx) / 2**30,
            "ce": [float(c) for c, _ in out], "l1": [float(l) for _, l in out],
            "density_mean": statistics.fmean(density) if density else None, "density_per_layer": density,
            "density_start_mean": statistics.fmean(density_start), "density_start_per_layer": density_start,
            "path": (mlps[0].last_path if twell_mode and mlps else ""), "rank": rank}


# Host calls that wait for the device (a synchronisation the step makes, or a blocking copy).
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def profile_summary(prof, top: int = 8) -> dict:
    """One profiled step: the device's busy time (the union of its kernels and copies) against the
    span from the first to the last, the largest idle gaps with the operations on either side, and
    the host's synchronising calls by name (cudaMemcpy counts the blocking, non-Async copies)."""
    from torch.autograd import DeviceType

    events = list(prof.events())
    dev = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == DeviceType.CUDA)
    syncs: dict = {}
    for e in events:
        if e.device_type == DeviceType.CPU and e.name in SYNC_CALLS:
            syncs[e.name] = syncs.get(e.name, 0) + 1
    out = {"host_syncs": syncs}
    if not dev:
        return out
    busy, gaps, end = 0.0, [], dev[0][0]
    prev = ""
    for s, e, name in dev:
        if s > end:
            gaps.append((s - end, prev, name))
        busy += max(0.0, e - max(s, end))
        if e > end:
            end, prev = e, name
    span = end - dev[0][0]
    gaps.sort(reverse=True)
    out.update(span_ms=span / 1e3, busy_ms=busy / 1e3, idle_ms=(span - busy) / 1e3, device_ops=len(dev),
               gaps_over_50us=sum(1 for g in gaps if g[0] > 50),
               largest_gaps=[{"us": round(g, 1), "after": a[:80], "before": b[:80]} for g, a, b in gaps[:top]])
    return out


def table(res: dict) -> str:
    rows = res["modes"]
    runs: dict = {}  # mode → its runs without an error (several with --repeat)
    for r in rows:
        if "error" not in r:
            runs.setdefault(r["mode"], []).append(r)
    med = {m: (statistics.median(r["step_ms"] for r in rs), statistics.median(r["peak_gib"] for r in rs))
           for m, rs in runs.items()}  # mode → (median step, median peak)
    dense = [med[m][0] for m in ("hf-eager", "dense-compiled") if m in med]
    best = min(dense) if dense else None
    cfg = res["config"]
    lines = [f"# Training step of {cfg['name']} ({cfg['layers']} layers, hidden {cfg['hidden']}, FFN {cfg['ffn']}, "
             f"{cfg['params_m']:.0f} M parameters) — {res['gpu']}, commit {res['commit']}, {res['date']}", "",
             (f"{res['gpus']} GPUs ({res['parallel'].upper()}), each " if res.get("gpus", 1) > 1 else "") +
             f"micro-batch {res['micro_batch']} × sequence {res['seq']}"
             + (f" × {res['grad_accum']} micro-batches" if res.get("grad_accum", 1) > 1 else "")
             + f" = {res['micro_batch'] * res['seq'] * res.get('gpus', 1) * res.get('grad_accum', 1)} tokens a step; "
             f"bf16 autocast, fp32 master weights, fused AdamW, SDPA attention; l1_coeff {res['l1_coeff']}, lr {res['lr']}; "
             f"{res['steps']} steps back to back after {res['warmup']} warm-up steps.", "",
             "| mode | step (ms) | tokens/s | vs best dense | peak memory (GiB) | vs dense peak | FFN density (start → end) | loss (first → last) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        name = r["mode"] + (f" (run {r.get('run', 0) + 1})" if res.get("repeat", 1) > 1 else "")
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:120]} | | | | | | |")
            continue
        ref = med.get("dense-compiled" if r["mode"].endswith("compiled") else "hf-eager")
        speed = f"{best / r['step_ms']:.2f}×" if best else ""
        mem = f"{r['peak_gib'] / ref[1]:.2f}×" if ref and ref[1] else ""
        dens = (f"{100 * r['density_start_mean']:.2f} → {100 * r['density_mean']:.2f} %"
                if r["density_mean"] is not None else "")
        lines.append(f"| {name} | {r['step_ms']:.1f} | {r['tokens_per_s'] / 1e3:.1f} k | {speed} | "
                     f"{r['peak_gib']:.2f}" + (f" ({r['twell_context_gib']:.2f} twell contexts)" if r["twell_context_gib"] else "")
                     + f" | {mem} | {dens} | {r['ce'][0]:.3f} → {r['ce'][-1]:.3f} |")
    if res.get("repeat", 1) > 1:
        lines += ["", f"Each mode {res['repeat']} times, interleaved, a process each; the ratios above are against the dense modes' "
                  "medians. Per mode:", "",
                  "| mode | runs | median step (ms) | fastest – slowest | vs best dense (median) | median peak (GiB) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for m, rs in runs.items():
            steps = [r["step_ms"] for r in rs]
            lines.append(f"| {m} | {len(rs)} | {med[m][0]:.1f} | {min(steps):.1f} – {max(steps):.1f} | "
                         + (f"{best / med[m][0]:.2f}×" if best else "") + f" | {med[m][1]:.2f} |")
    lines += ["", "Memory ratios compare eager with eager (hf-eager) and compiled with compiled (dense-compiled), "
              "against the reference mode's median peak."]
    prof = [r for r in rows if "profile" in r and "span_ms" in r["profile"]]
    if prof:
        lines += ["", "One profiled step (torch.profiler; slower than the timed ones):", "",
                  "| mode | span (ms) | device busy (ms) | device idle (ms) | gaps > 50 µs | host syncs | largest gap |",
                  "|---|---:|---:|---:|---:|---|---|"]
        for r in prof:
            p = r["profile"]
            g = p["largest_gaps"][0] if p["largest_gaps"] else None
            syncs = ", ".join(f"{k} {v}" for k, v in sorted(p["host_syncs"].items())) or "none"
            lines.append(f"| {r['mode']} | {p['span_ms']:.1f} | {p['busy_ms']:.1f} | {p['idle_ms']:.1f} | {p['gaps_over_50us']} | "
                         f"{syncs} | " + (f"{g['us']:.0f} µs after {g['after'][:40]}" if g else "") + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--model", required=True, help="Hugging Face Llama checkpoint directory (ReLU MLPs)")
    ap.add_argument("--modes", default=",".join(MODES[:4]), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.0,
                    help="AdamW's learning rate (default 0: every step does the same work and the checkpoint's density holds)")
    ap.add_argument("--l1-coeff", type=float, help="Σ over layers (default: the paper's 2e-5 a layer × layers)")
    ap.add_argument("--tag", default="", help="name in the output files (default: the model directory's)")
    ap.add_argument("--out", default=".", help="directory for model_step-TAG.json / .md")
    ap.add_argument("--mode", help=argparse.SUPPRESS)  # one mode, in a child process: prints its JSON
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": a smoke test of the script
    ap.add_argument("--timeout", type=int, default=300, help="seconds per mode")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of every mode, interleaved (m1, m2, …, m1, m2, …), each a process of its own: compiled "
                         "steps of small models were seen to differ ≈ 1.7× between processes; ratios then use each "
                         "mode's median")
    ap.add_argument("--profile", action="store_true",
                    help="profile one more step (torch.profiler): the device's idle time in it, its largest gaps and "
                         "the host's synchronising calls, into the JSON and a table")
    ap.add_argument("--grad-accum", type=int, default=1,
                    help="micro-batches a step; the ranks exchange gradients after the last one (DDP no_sync)")
    ap.add_argument("--gpus", type=int, default=1, help="ranks (one GPU each) under torchrun; tokens/s counts them all")
    ap.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp", help="how the ranks share the model (with --gpus > 1)")
    a = ap.parse_args()
    if a.mode:
        if a.l1_coeff is None:
            a.l1_coeff = 2e-5 * json.load(open(os.path.join(a.model, "config.json")))["num_hidden_layers"]
        try:
            r = one(a)
        except Exception as e:  # reported, not a crash of the whole benchmark (e.g. out of memory)
            r = {"mode": a.mode, "error": f"{type(e).__name__}: {e}", "rank": int(os.environ.get("RANK", "0"))}
        if r["rank"] == 0 or "error" in r:
            print("RESULT " + json.dumps(r), flush=True)
        # Leave without the interpreter's teardown (NCCL's and the process group's threads): the
        # result is out; a rank that hangs there would hold the whole torchrun.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if a.gpus < 1 or a.grad_accum < 1 or a.repeat < 1:
        ap.error("--gpus, --grad-accum and --repeat must be ≥ 1")
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}; known: {', '.join(MODES)}")
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        ap.error(f"{a.model}: no config.json (a Hugging Face checkpoint directory is needed)")
    try:
        import torch
        if a.device == "cuda" and not torch.cuda.is_available():
            print("skipped: no CUDA device")
            return 77
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    K, N, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * K // cfg["num_attention_heads"]
    params = V * K * (1 if cfg.get("tie_word_embeddings", False) else 2) + L * (3 * K * N + 2 * K * K + 2 * K * kv + 2 * K) + K
    tag = a.tag or os.path.basename(os.path.normpath(a.model))
    if a.l1_coeff is None:
        a.l1_coeff = 2e-5 * L
    res = {"gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else "CPU", "commit": os.environ.get("TWELL_COMMIT", "unknown"),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "config": {"name": tag, "layers": L, "hidden": K, "ffn": N, "vocab": V, "params_m": params / 1e6},
           "seq": a.seq, "micro_batch": a.micro_batch, "grad_accum": a.grad_accum, "gpus": a.gpus, "parallel": a.parallel if a.gpus > 1 else "",
           "steps": a.steps, "warmup": a.warmup, "lr": a.lr,
           "l1_coeff": a.l1_coeff, "repeat": a.repeat, "modes": []}
    for run, m in ((run, m) for run in range(a.repeat) for m in modes):
        t = time.time()
        args = [sys.executable, __file__, "--mode", m, "--l1-coeff", repr(a.l1_coeff)] + sys.argv[1:]
        env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        if a.gpus > 1:  # a rendezvous of its own on a free port (--standalone), so runs may go side by side
            args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.gpus}"] + args[1:]
            env.setdefault("OMP_NUM_THREADS", "4")
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=a.timeout, env=env)
            line = [s for s in p.stdout.splitlines() if s.startswith("RESULT ")]
            r = json.loads(line[-1][7:]) if line else {"mode": m, "error": f"exit {p.returncode}: {p.stderr[-400:]}"}
        except subprocess.TimeoutExpired:
            r = {"mode": m, "error": f"ran past {a.timeout} s"}
        r["run"] = run
        res["modes"].append(r)
        what = r.get("error") or f"{r['step_ms']:.1f} ms a step, peak {r['peak_gib']:.2f} GiB"
        print(f"{m}{f' (run {run + 1})' if a.repeat > 1 else ''}: {time.time() - t:.0f} s; {what}", file=sys.stderr, flush=True)
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"model_step-{tag}")
    with open(base + ".json", "w") as f:
        json.dump(res, f, indent=1)
    md = table(res)
    with open(base + ".md", "w") as f:
        f.write(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
