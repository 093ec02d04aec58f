#!/usr/bin/env python3
"""G ranks train like one rank (issue 30's test, on a machine with several GPUs): `twell.train` under
`torchrun --nproc-per-node G` with micro-batch B/G against one process with micro-batch B, for DDP
and FSDP2, and a checkpoint written by G ranks resumed on G/2.

    python3 bench/train/ranks_equal.py --corpus data/gpu-corpus --gpus 2,4 --out DIR [--steps 20]

The bound is bf16's own noise, measured in the same call: a second one-process run whose only
difference is the order of the sums (micro-batch B/Gmax with grad_accum Gmax: the same gradients in
exact arithmetic, other bf16 roundings). With d_X(t) = |loss_X(t) − loss_ref(t)|, a run passes when,
at every step t, d_G(t) ≤ 3 · max_{s ≤ t} d_noise(s) + 1e-4 · loss_ref(t) (the floor: fp32 rounding of
a mean over the batch's tokens where the noise is still exactly zero); the same for the L1 term.
Dead-neuron re-initialisation: the families "ddp+reinit" and "fsdp+reinit" train with a strong L1
term and a one-step window, so rows are re-initialised from the first steps on. The decisions come
from counts reduced over the ranks and the rows from a generator seeded by (seed, step, layer), so
G ranks (DDP replicas, FSDP2 shards) draw what one rank draws: their runs must stay within the bound
of the +reinit families' one-rank runs (the same arithmetic under either engine; --reinit-orders
more, each summing in another order, since a trajectory branches on single decisions), and a family whose reference
re-initialised nothing fails (it tested nothing). DDP runs check that the replicas agree before each save. --path sparse holds twell's ops on their sparse path
(the default: a from-scratch model starts near 50 % density, where automatic dispatch runs dense).
Writes ranks_equal.json / .md under --out; loss curves: python3 bench/train/ranks_equal.py --plot JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
NOISE_FACTOR = 3.0
REL_FLOOR = 1e-4


def worker(argv) -> int:
    """Inside torchrun (or alone): twell.train.main with twell's CUDA path held."""
    path, rest = argv[0], argv[1:]
    import twell.torch as tt
    from twell.train import main as train_main

    with tt.cuda_path(path):
        rc = train_main(rest)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # past NCCL's teardown: the run's files are written


def base_config(a, corpus: str) -> dict:
    return {"model": {"hidden_size": 256, "intermediate_size": 704, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
                      "max_position": a.seq},
            "ffn": "twell", "train_data": os.path.join(corpus, "train"), "seq_len": a.seq, "steps": a.steps,
            "lr": 1e-3, "warmup": 5, "l1_coeff": 1e-3, "bf16": True, "device": a.device, "neuron_counts_every": 1,
            "dead_window": 4 * a.seq * a.batch, "save_every": a.steps // 2, "seed": 0}


def launch(name, cfg, ranks, gpu_ids, a, resume_dir=None):
    """Starts one run; returns (name, Popen, out_dir)."""
    out = resume_dir or os.path.join(a.work, name)
    if resume_dir is None:
        shutil.rmtree(out, ignore_errors=True)
    os.makedirs(a.work, exist_ok=True)
    cfg_path = os.path.join(a.work, name + ".json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    cmd = [sys.executable]
    if ranks > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    cmd += [HERE, "--worker", a.path, cfg_path, "--out", out] + (["--resume"] if resume_dir else [])
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, gpu_ids)), NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1", OMP_NUM_THREADS="4")
    log = open(os.path.join(a.work, name + ".log"), "w")
    return name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), out


def wait_all(procs, runs):
    for name, p, out in procs:
        rc = p.wait()
        tel = os.path.join(out, "telemetry.jsonl")
        recs = [json.loads(line) for line in open(tel)] if os.path.exists(tel) else []
        runs[name] = {"rc": rc, "telemetry": recs}
        print(f"  {name}: exit {rc}, {len(recs)} steps", file=sys.stderr, flush=True)


def compare(run, ref, others, what) -> dict:
    """Per step: the difference to ref, and the bound from the one-rank runs of the same
    arithmetic (ref and `others`): the largest difference between any two of them so far."""
    one = [{x["step"]: x[what] for x in t} for t in [ref] + others]
    r = one[0]
    env, worst, ok, rows = 0.0, 0.0, True, []
    for x in sorted(run, key=lambda x: x["step"]):
        s = x["step"]
        if any(s not in o for o in one):
            ok = False
            continue
        vals = [o[s] for o in one]
        env = max(env, max(vals) - min(vals))
        bound = NOISE_FACTOR * env + REL_FLOOR * abs(r[s])
        d = abs(x[what] - r[s])
        worst = max(worst, d / bound)
        ok &= d <= bound
        rows.append({"step": s, "diff": d, "noise_envelope": env, "bound": bound})
    return {"ok": ok and bool(rows), "worst_diff_over_bound": worst, "steps": rows}


def one_rank(name: str) -> bool:
    return "-ref-" in name or "-noise-" in name or "-repeat" in name


def analyse(res: dict) -> None:
    """res["checks"] from res["runs"]: each multi-rank run against its family's one-rank reference,
    bounded by the spread of the one-rank runs of the same arithmetic: its family's (reference,
    grad-accumulation run, repeat of the reference), and every family's when no re-initialisation
    fired in any of them (the families then differ in nothing a one-rank run computes)."""
    runs, engines = res["runs"], res["engines"]

    def fired(e):  # re-initialisations in the family's one-rank runs
        return sum(reinits(r) for n, r in runs.items() if one_rank(n) and n.startswith(e + "-"))

    # Families whose one-rank runs compute the same thing pool their noise: the plain ones when no
    # re-initialisation fired in them (DDP's and FSDP's one-rank runs then differ in nothing), and
    # the +reinit ones (one L1 coefficient, the same seeded draws; 2d03d93 saw a DDP and an FSDP
    # one-rank run agree bit for bit through 3318 re-initialisations).
    plain = [e for e in engines if "+reinit" not in e]
    reinit = [e for e in engines if "+reinit" in e]
    res["pooled"] = len(plain) > 1 and all(fired(e) == 0 for e in plain)
    res["checks"], res["noise_max"], res["noise_runs"] = {}, {}, {}
    for e in engines:
        ref_name = f"{e}-ref-1x{res['batch']}"
        ref = runs[ref_name]["telemetry"]
        group = plain if (res["pooled"] and e in plain) else reinit if e in reinit else [e]
        pool = [n for n in runs if one_rank(n) and n != ref_name and any(n.startswith(q + "-") for q in group)]
        others = [runs[n]["telemetry"] for n in pool]
        res["noise_runs"][e] = pool
        res["noise_max"][e] = max((abs(x["loss"] - y["loss"]) for o in others for x, y in zip(ref, o)), default=float("nan"))
        for name, run in runs.items():
            if not name.startswith(e + "-") or one_rank(name):
                continue
            tel = run["telemetry"]
            want = res["steps"] - (res["steps"] // 2 if "-resume-" in name else 0)
            loss, l1 = compare(tel, ref, others, "loss"), compare(tel, ref, others, "l1")
            tested = "+reinit" not in e or (fired(e) > 0 and reinits(run) > 0)
            res["checks"][name] = {"shape": name.split("-")[-1], "reference": ref_name, "noise_runs": pool,
                                   "loss": loss, "l1": l1, "reinit_tested": tested,
                                   "ok": run["rc"] == 0 and len(tel) == want and loss["ok"] and l1["ok"] and tested}


def reinits(run: dict) -> int:
    return sum(sum(x.get("reinit", [])) for x in run["telemetry"])


def plot(path: str) -> int:
    """Three panels: the losses (one-rank runs grey), each G-rank run's |Δloss| against the noise
    envelope, and the L1 term of the +reinit families, where trajectories branch."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.load(open(path))
    runs = res["runs"]
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))

    def curve(axis, name, what, **kw):
        t = runs[name]["telemetry"]
        axis.plot([x["step"] for x in t], [x[what] for x in t], lw=1, **kw)

    for name in runs:
        if one_rank(name):
            curve(ax[0], name, "loss", color="0.7")
    for name in res["checks"]:
        curve(ax[0], name, "loss", label=name)
    for name, c in res["checks"].items():
        ax[1].semilogy([s["step"] for s in c["loss"]["steps"]], [max(s["diff"], 1e-9) for s in c["loss"]["steps"]], label=name, lw=1)
    first = next(iter(res["checks"].values()))["loss"]["steps"]
    ax[1].semilogy([s["step"] for s in first], [s["noise_envelope"] for s in first], "k--", label="bf16 noise envelope")
    reinit_runs = [n for n in runs if "+reinit" in n]
    for name in reinit_runs:
        if one_rank(name):
            curve(ax[2], name, "l1", color="0.6", label="one rank" if name == reinit_runs[0] else None)
    for name in reinit_runs:
        if not one_rank(name):
            curve(ax[2], name, "l1", label=name)
    ax[0].set(xlabel="step", ylabel="training loss", title="loss (grey: one-rank runs)")
    ax[1].set(xlabel="step", ylabel="|loss − one-rank loss|", title="difference to one rank")
    ax[2].set(xlabel="step", ylabel="L1 term", title="L1, re-initialising families (grey: one rank)")
    for axis in ax:
        axis.legend(fontsize=6)
    fig.suptitle(f"G ranks × B/G vs 1 rank × B — {res['gpu']}, commit {res['commit']}")
    fig.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    fig.savefig(out, dpi=110)
    print(out)
    return 0


def table(res) -> str:
    lines = [f"# G ranks train like one rank — {res['gpu']} × {res['gpus_on_machine']}, commit {res['commit']}, {res['date']}", "",
             f"twell.train, {res['steps']} steps, global batch {res['batch']} × {res['seq']} tokens, bf16 autocast, "
             f"twell ops on the {res['path']} path; bound = {NOISE_FACTOR:g} × the noise envelope (the largest loss "
             f"difference so far between one-rank runs of the same arithmetic: the reference, micro-batch "
             f"B/{res['gmax']} × grad_accum {res['gmax']}, a repeat of the reference"
             + (", and in the +reinit families micro-batch B/k × grad_accum k for more k" if any("+reinit" in e for e in res["engines"]) else "")
             + ("; pooled over the plain families, in which no re-initialisation fired" if res.get("pooled") else "")
             + ("; the +reinit families pool theirs" if any("+reinit" in e for e in res["engines"]) else "")
             + f") + {REL_FLOOR:g} × loss.", "",
             "| run | ranks × micro-batch | reference | loss: max diff | worst diff / bound | L1: worst diff / bound | re-inits (total; reference) | ok |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for name, c in res["checks"].items():
        run = res["runs"][name]
        t = run["telemetry"]
        md = max((s["diff"] for s in c["loss"]["steps"]), default=float("nan"))
        verdict = "yes" if c["ok"] else ("**no** (no re-initialisation fired)" if not c.get("reinit_tested", True) else "**no**")
        lines.append(f"| {name} | {c['shape']} | {c['reference']} | {md:.2e} | {c['loss']['worst_diff_over_bound']:.2f} | "
                     f"{c['l1']['worst_diff_over_bound']:.2f} | {reinits(run)}; {reinits(res['runs'][c['reference']])} | {verdict} |")
    lines += ["", "Noise (the bound's source), the largest |Δloss| between the reference and another one-rank run: " + ", ".join(
        f"{k}: {v:.2e} (over {', '.join(res['noise_runs'][k])})"
        for k, v in res["noise_max"].items())]
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    if len(sys.argv) > 2 and sys.argv[1] == "--plot":
        return plot(sys.argv[2])
    if len(sys.argv) > 2 and sys.argv[1] == "--analyse":  # the checks of a result again (rewrites its JSON and .md)
        res = json.load(open(sys.argv[2]))
        res.setdefault("engines", sorted({n.split("-")[0] for n in res["runs"]}))
        analyse(res)
        with open(sys.argv[2], "w") as f:
            json.dump(res, f, indent=1)
        md = table(res)
        with open(os.path.splitext(sys.argv[2])[0] + ".md", "w") as f:
            f.write(md + "\n")
        print(md)
        return 0 if all(c["ok"] for c in res["checks"].values()) else 1
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--corpus", required=True, help="a directory holding the twell corpus train/ (e.g. data/gpu-corpus)")
    ap.add_argument("--gpus", default="2,4", help="rank counts to compare with one rank")
    ap.add_argument("--engines", default="ddp,fsdp,ddp+reinit,fsdp+reinit",
                    help="families: ddp, fsdp, and each with +reinit (strong L1, dead rows re-initialised every step)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reinit-orders", type=int, default=3,
                    help="more one-rank runs in the +reinit families, each with another order of the sums "
                         "(micro-batch B/k × grad_accum k, k = 2, 8, 16, … other than the largest G)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32, help="global batch (sequences a step)")
    ap.add_argument("--path", default="sparse", choices=("automatic", "sparse", "dense"))
    ap.add_argument("--work", default="build/ranks-equal")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": a smoke test of the script (gloo)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    import torch

    have = torch.cuda.device_count() if a.device == "cuda" else 4
    gpus = [g for g in (int(x) for x in a.gpus.split(",")) if g <= have]
    engines = a.engines.split(",")
    if have < 2 or not gpus:
        print(f"skipped: {have} GPU(s); this needs at least 2")
        return 77
    gmax = max(gpus)
    if a.batch % gmax or a.steps % 2:
        ap.error("--batch must divide by every rank count, --steps must be even")
    t0 = time.time()
    base = base_config(a, a.corpus)
    window = 2 * a.seq * a.batch  # two steps' tokens: a from-scratch model at this L1 re-initialises nothing in 20 steps
    fam = {"ddp": {**base, "reinit_window": window}, "fsdp": {**base, "parallel": "fsdp", "reinit_window": window}}
    for e in ("ddp", "fsdp"):  # rows silent for one step's tokens, under an L1 term strong enough to silence them
        fam[e + "+reinit"] = {**fam[e], "l1_coeff": 0.05, "reinit_window": a.seq * a.batch}
    unknown = set(engines) - set(fam)
    if unknown:
        ap.error(f"unknown --engines {sorted(unknown)}; known: {sorted(fam)}")
    runs: dict = {}
    # Wave 1: the one-process references and noise runs, side by side on separate GPUs.
    procs, gpu = [], 0
    for e in engines:
        ones = [(f"{e}-ref-1x{a.batch}", {**fam[e], "micro_batch": a.batch}),
                (f"{e}-noise-1x{a.batch // gmax}x{gmax}acc", {**fam[e], "micro_batch": a.batch // gmax, "grad_accum": gmax}),
                (f"{e}-repeat-1x{a.batch}", {**fam[e], "micro_batch": a.batch})]
        # Re-initialisation makes the trajectories branch on single decisions: more one-rank samples,
        # each summing in another order, as G ranks do (f211fd2 ran plain repeats of the reference
        # instead: 6 of the 10 one-rank runs took the reference's trajectory bit for bit, and the
        # envelope held 3 branches).
        if "+reinit" in e:
            ks = [k for k in (2, 8, 16, 32, 64) if k != gmax and a.batch % k == 0][:a.reinit_orders]
            ones += [(f"{e}-noise-1x{a.batch // k}x{k}acc", {**fam[e], "micro_batch": a.batch // k, "grad_accum": k})
                     for k in ks]
        for name, cfg in ones:
            procs.append(launch(name, cfg, 1, [gpu % have], a))
            gpu += 1
            if len(procs) == have:
                wait_all(procs, runs)
                procs = []
    wait_all(procs, runs)
    # Then G ranks, each engine; runs of the same G side by side when the GPUs allow.
    for g in gpus:
        procs, first = [], 0
        for e in engines:
            if first + g > have:
                wait_all(procs, runs)
                procs, first = [], 0
            procs.append(launch(f"{e}-{g}x{a.batch // g}", {**fam[e], "micro_batch": a.batch // g}, g, range(first, first + g), a))
            first += g
        wait_all(procs, runs)
    # Resume: Gmax's checkpoint at the half, on Gmax/2 ranks (one when Gmax is 2), to the end.
    procs, first = [], 0
    g2 = max(1, gmax // 2)
    for e in (e for e in engines if "+reinit" not in e):
        src = os.path.join(a.work, f"{e}-{gmax}x{a.batch // gmax}")
        half = f"checkpoint-{a.steps // 2}"
        name = f"{e}-resume-{gmax}to{g2}x{a.batch // g2}"
        dst = os.path.join(a.work, name)
        shutil.rmtree(dst, ignore_errors=True)
        if not os.path.isdir(os.path.join(src, half)):
            runs[name] = {"rc": -1, "telemetry": [], "error": f"{src}/{half} missing"}
            continue
        os.makedirs(dst)
        shutil.copytree(os.path.join(src, half), os.path.join(dst, half))
        with open(os.path.join(dst, "latest"), "w") as f:
            f.write(half + "\n")
        if first + g2 > have:
            wait_all(procs, runs)
            procs, first = [], 0
        procs.append(launch(name, {**fam[e], "micro_batch": a.batch // g2}, g2, range(first, first + g2), a, resume_dir=dst))
        first += g2
    wait_all(procs, runs)

    name_gpu = torch.cuda.get_device_name(0) if a.device == "cuda" else "CPU"
    res = {"gpu": name_gpu, "gpus_on_machine": have, "commit": os.environ.get("TWELL_COMMIT", "unknown"),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "steps": a.steps,
           "batch": a.batch, "seq": a.seq, "gmax": gmax, "path": a.path, "engines": engines, "runs": runs,
           "seconds": time.time() - t0}
    analyse(res)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ranks_equal.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = table(res)
    with open(os.path.join(a.out, "ranks_equal.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return 0 if all(c["ok"] for c in res["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
