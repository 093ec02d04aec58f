#!/usr/bin/env python3
"""Validation loss of every checkpoint of training runs on more batches than the trainer's
periodic estimate (8 batches: too noisy to compare runs within a few per cent).

    python3 bench/train/eval_checkpoints.py --data DIR --batches 64 RUN_DIR [RUN_DIR ...] [--json FILE]

Each checkpoint-STEP of each run is loaded with transformers (a twell run's checkpoint is a plain
HF one) and evaluated in bf16 autocast on the same --batches batches of the corpus DIR (seq_len and
micro_batch from the run's trainer state); prints a table, writes JSON. A directory that is itself
a checkpoint (config.json in it: e.g. the model a fine-tuning started from) is evaluated once, at
--seq-len × --micro-batch; --as-relu evaluates such models with their MLP activation swapped for
ReLU (a SiLU model before ReLU-fication).
"""
import argparse
import glob
import json
import os
import re
import sys

import torch
import transformers

from twell.data import Loader


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--data", required=True, help="twell corpus directory (e.g. a val split)")
    ap.add_argument("--batches", type=int, default=64)
    ap.add_argument("--json")
    ap.add_argument("--seq-len", type=int, default=512, help="for plain model directories")
    ap.add_argument("--micro-batch", type=int, default=16, help="for plain model directories")
    ap.add_argument("--as-relu", action="store_true", help="plain model directories: evaluate with ReLU MLPs")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = {}
    for run in a.runs:
        plain = os.path.isfile(os.path.join(run, "config.json"))
        if plain:
            cks, seq, micro = [run], a.seq_len, a.micro_batch
        else:
            cks = sorted(glob.glob(os.path.join(run, "checkpoint-*")), key=lambda p: int(re.sub(r".*-", "", p)))
            if not cks:
                print(f"{run}: no checkpoints and no config.json", file=sys.stderr)
                return 2
            cfg = torch.load(os.path.join(cks[-1], "trainer_state.pt"), weights_only=False, map_location="cpu")["config"]
            seq, micro = cfg["seq_len"], cfg["micro_batch"]
        data = Loader(a.data, seq, micro, seed=12345)
        curve = {}
        for ck in cks:
            model = transformers.LlamaForCausalLM.from_pretrained(ck, dtype=torch.float32).to(dev).eval()
            if plain and a.as_relu:
                for layer in model.model.layers:
                    layer.mlp.act_fn = torch.nn.ReLU()
            total = 0.0
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
                for b in range(a.batches):
                    ids = torch.from_numpy(data.batch(b)).to(dev)
                    logits = model(input_ids=ids[:, :-1]).logits
                    total += torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                               ids[:, 1:].reshape(-1)).item()
            curve[0 if plain else int(re.sub(r".*-", "", ck))] = total / a.batches
            del model
        name = os.path.basename(os.path.normpath(run)) + (" (ReLU)" if plain and a.as_relu else "")
        out[name] = curve
        print(name, " ".join(f"{s}:{v:.3f}" for s, v in curve.items()), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"data": a.data, "batches": a.batches, "runs": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
