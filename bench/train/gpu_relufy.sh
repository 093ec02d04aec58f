#!/usr/bin/env bash
# Issue 29's ReLU-fication of SmolLM2-135M on the GPU machine (the second of two device calls):
#   call 1: carry ".debs" ".carry/gguf.part00", build twell (e.g. with GPU_CHECK_PART=tests scripts/gpu-check)
#   call 2: carry ".carry/gguf.part01" ".carry/gpu-corpus.tar.xz" ".whl", then
#           [TRAIN_TIMEOUT=S] bash bench/train/gpu_relufy.sh [KEY=JSON ...]   (overrides of bench/train/gpu-relufy-smollm2.json)
# (one call carries at most 64 MiB: the 98 MB GGUF travels in two halves, `split -n 2 -d -a 2 GGUF
# .carry/gguf.part`; the machine keeps the first while it stays warm, so call 2 must come within its
# idle window. With the tree's 17 MB, call 2 fits only when bench/results does not travel: untrack it
# for the calls (git rm -r --cached bench/results, listed in .git/info/exclude), then git reset it.) Reassembles and converts the GGUF (scripts/fetch-smollm2, sha256
# checked), evaluates the SiLU model and the same weights with ReLU on val-wiki, fine-tunes with
# ReLU + L1 through twell (bench/train/gpu_run.sh: telemetry, `twell generate` on the result), and
# evaluates every checkpoint (EVAL_BATCHES batches of 16 × 512 tokens, default 16). Outputs under
# $OUT: telemetry-relufy.jsonl, generate-relufy.txt, eval-relufy.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/train-out}
BUILD=${BUILD:-build/gpu}
export PYTHONPATH=$BUILD/python
mkdir -p "$OUT"
M=assets/smollm2-135m-instruct
if [ ! -f "$M/.complete" ]; then
  for p in .carry/gguf.part00 .carry/gguf.part01; do
    [ -f "$p" ] || { echo "gpu_relufy: $p missing (carry it: see the header)"; exit 2; }
  done
  cat .carry/gguf.part00 .carry/gguf.part01 > /tmp/smollm2.gguf
  bash scripts/fetch-smollm2 --gguf /tmp/smollm2.gguf --out "$M" || exit 1
fi
[ -d data/gpu-corpus ] || { mkdir -p data/gpu-corpus && xz -dc .carry/gpu-corpus.tar.xz | tar xf - -C data/gpu-corpus; } || exit 1
t0=$(date +%s)
python3 bench/train/eval_checkpoints.py --data data/gpu-corpus/val-wiki --batches "${EVAL_BATCHES:-16}" --seq-len 512 --micro-batch 16 \
  "$M" --json "$OUT/eval-before-silu.json" || exit 1
python3 bench/train/eval_checkpoints.py --data data/gpu-corpus/val-wiki --batches "${EVAL_BATCHES:-16}" --seq-len 512 --micro-batch 16 \
  --as-relu "$M" --json "$OUT/eval-before-relu.json" || exit 1
echo "evaluation before: $(( $(date +%s) - t0 )) s"
bash bench/train/gpu_run.sh relufy bench/train/gpu-relufy-smollm2.json "$@"
rc=$?
python3 bench/train/eval_checkpoints.py --data data/gpu-corpus/val-wiki --batches "${EVAL_BATCHES:-16}" build/train-runs/relufy \
  --json "$OUT/eval-relufy.json"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
parts = {}
for name in ("eval-before-silu", "eval-before-relu", "eval-relufy"):
    try:
        parts[name] = json.load(open(f"{out}/{name}.json"))["runs"]
    except (OSError, KeyError, ValueError):
        pass
json.dump(parts, open(f"{out}/eval-relufy.json", "w"), indent=1)
PY
rm -f "$OUT/eval-before-silu.json" "$OUT/eval-before-relu.json"
exit $rc
