#!/usr/bin/env bash
# Issue 29's ReLU-fication of SmolLM2-135M on the GPU machine (the second of two device calls):
#   call 1: carry ".debs" ".carry/gguf.part00", build twell (GPU_CHECK_PART=build scripts/gpu-check: ≈ 110 s)
#   call 2: carry ".carry/gguf.part01" ".carry/gpu-corpus.tar.xz" ".whl", then
#           [TRAIN_TIMEOUT=S] bash bench/train/gpu_relufy.sh [KEY=JSON ...]   (overrides of bench/train/gpu-relufy-smollm2.json)
# (one call carries at most 64 MiB: the 98 MB GGUF travels in two halves, `split -n 2 -d -a 2 GGUF
# .carry/gguf.part`; the machine keeps the first while it stays warm, so call 2 must come within its
# idle window. With the tree's 17 MB, call 2 fits only when bench/results does not travel: untrack it
# for the calls (git rm -r --cached bench/results, listed in .git/info/exclude), then git reset it.) Reassembles and converts the GGUF (scripts/fetch-smollm2, sha256
# checked), evaluates the SiLU model and the same weights with ReLU on val-wiki, fine-tunes with
# ReLU + L1 through twell (bench/train/gpu_run.sh: telemetry, `twell generate` on the result), and
# evaluates every checkpoint (EVAL_BATCHES batches of 16 × 512 tokens, default 16). Outputs under
# $OUT: telemetry-NAME.jsonl, generate-NAME.txt, eval-NAME.json (RELUFY_NAME, default relufy).
# Two runs in one call (each ≈ 3–4 minutes at 1600 steps): run the script twice, the second with
# RELUFY_SKIP_BEFORE=1 (the models before fine-tuning are evaluated once), e.g. a dense ReLU
# fine-tune as the loss baseline, then ReLU + L1 with the coefficient ramped:
#   RELUFY_NAME=relu-dense bash bench/train/gpu_relufy.sh ffn='"dense"' l1_coeff=0 steps=1600 &&
#   RELUFY_SKIP_BEFORE=1 RELUFY_NAME=relu-l1-ramp bash bench/train/gpu_relufy.sh l1_coeff=0.003 l1_warmup=1200 steps=1600
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/train-out}
BUILD=${BUILD:-build/gpu}
export PYTHONPATH=$BUILD/python
mkdir -p "$OUT"
M=assets/smollm2-135m-instruct
bash scripts/smollm2-from-carry "$M" || exit 1
[ -d data/gpu-corpus ] || { mkdir -p data/gpu-corpus && xz -dc .carry/gpu-corpus.tar.xz | tar xf - -C data/gpu-corpus; } || exit 1
t0=$(date +%s)
# Validation before and after on two sets: val-wiki (Wikipedia leads: the pretrained model's kind of
# text, not the fine-tuning corpus's) and val-heldout (held-out text of the fine-tuning corpus).
EVAL="python3 bench/train/eval_checkpoints.py --batches ${EVAL_BATCHES:-16} --seq-len 512 --micro-batch 16"
if [ "${RELUFY_SKIP_BEFORE:-0}" != 1 ]; then
  for v in val-wiki val-heldout; do
    $EVAL --data data/gpu-corpus/$v "$M" --json "$OUT/eval-before-silu-$v.json" || exit 1
    $EVAL --data data/gpu-corpus/$v --as-relu "$M" --json "$OUT/eval-before-relu-$v.json" || exit 1
  done
  echo "evaluation before: $(( $(date +%s) - t0 )) s"
fi
NAME=${RELUFY_NAME:-relufy}
bash bench/train/gpu_run.sh "$NAME" bench/train/gpu-relufy-smollm2.json "$@"
rc=$?
for v in val-wiki val-heldout; do
  $EVAL --data data/gpu-corpus/$v "build/train-runs/$NAME" --json "$OUT/eval-after-$v.json"
done
python3 - "$OUT" "$NAME" <<'PY'
import json, sys
out, name = sys.argv[1], sys.argv[2]
parts = {}
for v in ("val-wiki", "val-heldout"):
    for what in ("before-silu", "before-relu", "after"):
        try:
            parts.setdefault(v, {})[what] = json.load(open(f"{out}/eval-{what}-{v}.json"))["runs"]
        except (OSError, KeyError, ValueError):
            pass
json.dump(parts, open(f"{out}/eval-{name}.json", "w"), indent=1)
PY
for v in val-wiki val-heldout; do rm -f "$OUT/eval-before-silu-$v.json" "$OUT/eval-before-relu-$v.json" "$OUT/eval-after-$v.json"; done
exit $rc
