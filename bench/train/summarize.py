#!/usr/bin/env python3
"""The table of bench/train/gpu_runs.sh: a dense-MLP run and a twell run of the same config.

    python3 bench/train/summarize.py DENSE_TELEMETRY TWELL_TELEMETRY --config TWELL_CONFIG --out DIR

Speed is tokens/s (median over the dense run's steps after the 10th, and over the twell run's last
quarter, when its activations are as sparse as they get); memory is the step's peak (PyTorch's
allocator plus twell's layer contexts). Writes DIR/train.md and DIR/train.json.
"""
import argparse
import json
import os
import statistics


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dense")
    ap.add_argument("twell")
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dense, twell = read(a.dense), read(a.twell)
    cfg = json.load(open(a.config))
    tail = twell[len(twell) * 3 // 4:]
    vals = [r for r in twell if "val_loss" in r]
    last = twell[-1]
    res = {
        "config": cfg, "commit": os.environ.get("TWELL_COMMIT", ""), "gpu": os.environ.get("TWELL_GPU", ""),
        "dense": {"steps": len(dense), "tokens_per_s": statistics.median(r["tokens_per_s"] for r in dense[10:]),
                  "peak_memory_gib": max(r.get("peak_memory_gib", 0) for r in dense), "loss_at_end": dense[-1]["loss"],
                  "density_at_end": statistics.mean(dense[-1]["density"])},
        "twell": {"steps": len(twell), "tokens_per_s_last_quarter": statistics.median(r["tokens_per_s"] for r in tail),
                  "peak_memory_gib_last_quarter": max(r.get("peak_memory_gib", 0) for r in tail),
                  "loss_at_end": last["loss"], "val_loss": [(r["step"], r["val_loss"]) for r in vals],
                  "density_per_layer_at_end": last["density"], "nnz_per_token_at_end": last["nnz_per_token"],
                  "dead_at_end": last["dead"], "l1_at_end": last["l1"],
                  "loss_at_dense_steps": twell[min(len(dense), len(twell)) - 1]["loss"]},
    }
    res["twell_speedup"] = res["twell"]["tokens_per_s_last_quarter"] / res["dense"]["tokens_per_s"]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(res, f, indent=1)
    d, t = res["dense"], res["twell"]
    n = cfg["model"]
    lines = [
        f"# Training on the GPU: twell FFN vs PyTorch's dense MLP ({res['gpu']}, commit {res['commit']})",
        "",
        f"Llama, hidden {n.get('hidden_size')}, FFN {n.get('intermediate_size')}, {n.get('num_layers')} layers; "
        f"seq {cfg['seq_len']} × {cfg['micro_batch']} a step; bf16 autocast; l1_coeff {cfg['l1_coeff']}; "
        f"lr {cfg['lr']} (warm-up {cfg['warmup']}, cosine over {cfg['steps']} steps).",
        "",
        "| | steps | tokens/s | peak memory (GiB) | loss |",
        "|---|---:|---:|---:|---:|",
        f"| dense MLP (PyTorch) | {d['steps']} | {d['tokens_per_s']:.0f} | {d['peak_memory_gib']:.2f} | "
        f"{d['loss_at_end']:.3f} (step {d['steps']}) |",
        f"| twell FFN, last quarter | {t['steps']} | {t['tokens_per_s_last_quarter']:.0f} | "
        f"{t['peak_memory_gib_last_quarter']:.2f} | {t['loss_at_end']:.3f} (step {t['steps']}); "
        f"{t['loss_at_dense_steps']:.3f} at step {min(d['steps'], t['steps'])} |",
        "",
        f"- twell / dense tokens/s: {res['twell_speedup']:.2f}×",
        f"- non-zeros per token at the end, per layer: {', '.join(f'{v:.1f}' for v in t['nnz_per_token_at_end'])} "
        f"of {n.get('intermediate_size')} (mean density {100 * statistics.mean(t['density_per_layer_at_end']):.2f} %)",
        f"- dead neurons at the end (silent for {cfg['dead_window']} tokens), per layer: {t['dead_at_end']}",
        f"- validation loss (val-wiki): {', '.join(f'step {s}: {v:.3f}' for s, v in t['val_loss'])}",
    ]
    with open(os.path.join(a.out, "train.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
