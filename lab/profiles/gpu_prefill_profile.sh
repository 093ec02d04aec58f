#!/usr/bin/env bash
# Where an 8 × 512 prefill's time goes, twell against PyTorch's best, kernel by kernel, in one call on
# the GPU machine (issue 27's prefill targets): one synthetic checkpoint; twell_probe_prefill on it
# under ncu (kernel time and DRAM bytes per kernel, dense and automatic FFN paths; GEMMs apart by
# grid), summed by lab/profiles/decode_profile.py; the lean compiled PyTorch body's prefill under
# torch.profiler (lab/profiles/torch_prefill_profile.py).
#   [BUILD=build/gpu] [OUT=…] [PREFILL_BATCH=8 PREFILL_LEN=512] [DECODE=1] bash lab/profiles/gpu_prefill_profile.sh [CONFIG [DENSITY]]
# Needs a built twell configured with -DTWELL_BUILD_LAB=ON (twell, twell_probe_prefill). Writes prefill-profile-twell.md,
# prefill-profile-torch.md and the logs under $OUT. ≈ 3.5 minutes at 2B on an H100 after the build.
# DECODE=1 also profiles one eager decode step at batch 1 (twell_probe_decode, its own synthetic
# model: ≈ 1.5 minutes more) into decode-profile-twell.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/gpu}
OUT=${OUT:-build/prefill-profile-out}
CONFIG=${1:-2b}
DENSITY=${2:-0.005}
PB=${PREFILL_BATCH:-8}
PL=${PREFILL_LEN:-512}
mkdir -p "$OUT"
M=/tmp/twell-yardstick-$CONFIG  # shared with gpu_decode_yardstick.sh: made once per machine
t0=$(date +%s)
if [ ! -f "$M/config.json" ]; then
  rm -rf "$M"
  "$BUILD/tools/twell/twell" gen model --config "$CONFIG" --density "$DENSITY" --out "$M" > "$OUT/gen.log" 2>&1 ||
    { echo "gpu_prefill_profile: twell gen model failed"; tail -5 "$OUT/gen.log"; exit 1; }
fi
echo "checkpoint: $(( $(date +%s) - t0 )) s"
PROBE="$BUILD/lab/twell_probe_prefill"
[ -x "$PROBE" ] || { echo "gpu_prefill_profile: no $PROBE (configured without -DTWELL_BUILD_LAB=ON, or without the model runtime?)"; exit 1; }
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
t0=$(date +%s)
if [ -n "$NCU" ]; then
  # The probe's timed prefills run outside the profiled range, at full speed: its lines (before the
  # CSV) are the wall-clock times.
  timeout 300 "$NCU" --profile-from-start off --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv "$PROBE" "$M" "$DENSITY" "$PB" "$PL" 3 \
    > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  echo "probe under ncu rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^(dense|automatic) +prefill" "$OUT/ncu.csv"
  python3 lab/profiles/decode_profile.py "$OUT/ncu.csv" --gemm-grids --md "$OUT/prefill-profile-twell.md" | head -60
else
  "$PROBE" "$M" "$DENSITY" "$PB" "$PL" 3 > "$OUT/probe.log" 2>&1
  echo "probe rc=$? ($(( $(date +%s) - t0 )) s; no ncu on this machine: times only)"
  grep -v "^probe_prefill:" "$OUT/probe.log"
fi
t0=$(date +%s)
python3 lab/profiles/torch_prefill_profile.py "$M" --batch "$PB" --len "$PL" --md "$OUT/prefill-profile-torch.md" \
  > "$OUT/torch-profile.log" 2>&1
echo "torch profile rc=$? ($(( $(date +%s) - t0 )) s)"
cat "$OUT/prefill-profile-torch.md" 2>/dev/null || tail -20 "$OUT/torch-profile.log"
if [ "${DECODE:-0}" = 1 ] && [ -n "$NCU" ] && [ -x "$BUILD/lab/twell_probe_decode" ]; then
  t0=$(date +%s)
  timeout 240 "$NCU" --profile-from-start off --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv "$BUILD/lab/twell_probe_decode" "$CONFIG" "$DENSITY" 1 16 \
    > "$OUT/ncu-decode.csv" 2> "$OUT/ncu-decode.err"
  echo "decode probe under ncu rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "decode step" "$OUT/ncu-decode.csv"
  python3 lab/profiles/decode_profile.py "$OUT/ncu-decode.csv" --md "$OUT/decode-profile-twell.md" | head -50
fi
# The device tool returns 8 files: the logs travel as one archive.
(cd "$OUT" && tar -cJf logs.tar.xz --remove-files $(ls gen.log *.err torch-profile.log 2>/dev/null) 2>/dev/null)
ls "$OUT"
