#!/usr/bin/env bash
# Model-level training on the GPU machine: the paper's recipe (ReLU + L1) on a small Llama with
# twell's FFN, against the same model with PyTorch's dense MLP, from one config.
#   bash bench/train/gpu_runs.sh [CONFIG] [SECONDS]     (default bench/train/gpu-50m.json, 240)
# Needs the carried corpus (.carry/gpu-corpus.tar.xz: 12 M tokens of twell.corpus's train split,
# val-wiki and the tokenizer) and twell built in build/gpu (PYTHONPATH build/gpu/python).
#   1. dense: 60 steps (its tokens/s and peak memory do not depend on the data's sparsity);
#   2. twell: as many steps as SECONDS allow at the dense step time (it starts on the dense path
#      while activations are dense and moves to the sparse kernels as the L1 term sparsifies them);
#   3. twell generate on the twell checkpoint (the runtime on a model trained here);
#   4. a summary table (bench/train/summarize.py) into $OUT/train.md and $OUT/train.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${1:-bench/train/gpu-50m.json}
SECONDS_BUDGET=${2:-240}
OUT=${OUT:-build/train-out}
mkdir -p "$OUT" data
[ -d data/gpu-corpus ] || { mkdir -p data/gpu-corpus && xz -dc .carry/gpu-corpus.tar.xz | tar xf - -C data/gpu-corpus; } || exit 1
BUILD=${BUILD:-build/gpu}
export PYTHONPATH=$BUILD/python
RUNS=build/train-runs
rm -rf "$RUNS"; mkdir -p "$RUNS"
python3 - "$CONFIG" "$RUNS" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
json.dump({**cfg, "ffn": "dense", "steps": int(__import__("os").environ.get("DENSE_STEPS", "60")), "val_every": 0,
           "save_every": 0}, open(f"{sys.argv[2]}/dense.json", "w"))
PY
t0=$(date +%s)
timeout 200 python3 -m twell.train "$RUNS/dense.json" --out "$RUNS/dense" > /tmp/train-dense.log 2>&1
echo "dense probe rc=$? ($(( $(date +%s) - t0 )) s)"; tail -3 /tmp/train-dense.log
steps=$(python3 - "$RUNS/dense/telemetry.jsonl" "$SECONDS_BUDGET" "$CONFIG" <<'PY'
import json, sys, statistics
recs = [json.loads(l) for l in open(sys.argv[1])]
cfg = json.load(open(sys.argv[3]))
dt = statistics.median(1 / r["tokens_per_s"] for r in recs[10:]) * cfg["seq_len"] * cfg["micro_batch"]
print(max(100, int(float(sys.argv[2]) / dt) // 50 * 50))
PY
)
echo "twell run: $steps steps"
python3 - "$CONFIG" "$RUNS" "$steps" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
n = int(sys.argv[3])
json.dump({**cfg, "steps": n, "val_every": max(50, n // 4), "save_every": max(50, n // 4)}, open(f"{sys.argv[2]}/twell.json", "w"))
PY
t0=$(date +%s)
timeout $(( SECONDS_BUDGET + 120 )) python3 -m twell.train "$RUNS/twell.json" --out "$RUNS/twell" > /tmp/train-twell.log 2>&1
echo "twell run rc=$? ($(( $(date +%s) - t0 )) s)"; tail -3 /tmp/train-twell.log
ck="$RUNS/twell/$(cat "$RUNS/twell/latest" 2>/dev/null)"
if [ -x $BUILD/tools/twell/twell ] && [ -f "$ck/config.json" ]; then
  timeout 60 $BUILD/tools/twell/twell generate --model "$ck" --prompt "The dictionary defines a river as" \
    --max-new-tokens 40 > "$OUT/train-generate.txt" 2>&1
  echo "twell generate rc=$?"; cat "$OUT/train-generate.txt" | tail -5
fi
cp "$RUNS/dense/telemetry.jsonl" "$OUT/telemetry-dense.jsonl" 2>/dev/null
cp "$RUNS/twell/telemetry.jsonl" "$OUT/telemetry-twell.jsonl" 2>/dev/null
python3 bench/train/summarize.py "$RUNS/dense/telemetry.jsonl" "$RUNS/twell/telemetry.jsonl" --config "$RUNS/twell.json" \
  --out "$OUT" && cat "$OUT/train.md"
