#!/usr/bin/env bash
# The model-level training step on the GPU machine, one device call per config (a call has 600 s):
#   bash bench/train/gpu_model_step.sh CONFIG [MICRO_BATCH [MODES]]
# CONFIG: 0.5b, 1b, 1.5b or 2b (twell gen model's presets; the checkpoint is built once per machine
# in /tmp/syn-CONFIG: ≈ 20 s for 1b, ≈ 45 s for 2b on 16 cores). MICRO_BATCH defaults to 8 (16384
# tokens a step; at 2b the dense step's peak is 72.1 GiB, which fits an 80 GB H100: pass 4 for a
# smaller card — fp32 master weights and AdamW take 33 GB before activations), 4 for 1.5b. MODES: model_step.py's
# --modes (default: its four). Needs twell built in $BUILD (default build/gpu) with the Python
# extension; writes model_step-CONFIG.{json,md} to $OUT. PROFILE=1: model_step.py --profile (one
# more step of each mode under torch.profiler: the device's idle time and the host's syncs).
# REPEAT=N: every mode N times, interleaved, a process each (model_step.py --repeat).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n 2,8p "$0"; exit 2; }
CONFIG=$1
case "$CONFIG" in 1.5b) MB=${2:-4} ;; *) MB=${2:-8} ;; esac
MODES=${3:-}
OUT=${OUT:-build/model-step-out}
BUILD=${BUILD:-build/gpu}
export PYTHONPATH=$BUILD/python
# The device copy of the tree has no .git: TWELL_COMMIT=<hash> names the commit in the results.
export TWELL_COMMIT=${TWELL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
mkdir -p "$OUT"
DIR=/tmp/syn-$CONFIG
if [ ! -f "$DIR/config.json" ]; then
  t0=$(date +%s)
  rm -rf "$DIR"
  OMP_NUM_THREADS=$(nproc) "$BUILD/tools/twell/twell" gen model --config "$CONFIG" --out "$DIR" 2>&1 | tail -1 || exit 1
  echo "gen model --config $CONFIG: $(( $(date +%s) - t0 )) s"
fi
python3 bench/train/model_step.py --model "$DIR" --tag "$CONFIG" --micro-batch "$MB" --steps 8 --warmup 3 \
  --timeout 170 ${MODES:+--modes "$MODES"} ${PROFILE:+--profile} ${REPEAT:+--repeat "$REPEAT"} --out "$OUT"
