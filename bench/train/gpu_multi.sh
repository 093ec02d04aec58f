#!/usr/bin/env bash
# Issue 30 on a machine with several GPUs, one device call (600 s) per part:
#   bash bench/train/gpu_multi.sh check
#       build; the GPU tests (scripts/gpu-check's tests part, sanitizer skipped) on the machine's
#       GPUs beside bench/train/ranks_equal.py (G ranks × B/G against one rank × B, DDP and FSDP2,
#       a G-rank checkpoint resumed on G/2 ranks); carry ".debs" ".carry/gpu-corpus.tar.xz"
#       ".deps/cudnn-frontend"
#   bash bench/train/gpu_multi.sh scaling CONFIG [SCALING_ARGS...]
#       build; `twell gen model --config CONFIG` (synthetic sparse checkpoint); bench/train/scaling.py
#       over 1, 2, 4, 8 GPUs (those the machine has), sparse against dense; carry ".debs"
# Outputs under $OUT (default build/gpu-multi-out): 00-summary.txt first, the results' JSON and
# markdown, logs.tar.xz (the device tool returns 8 files). Pass TWELL_COMMIT=<hash> (no .git there).
set -uo pipefail
cd "$(dirname "$0")/../.."
PART=${1:-}
case "$PART" in check|scaling) ;; *) sed -n 2,13p "$0"; exit 2 ;; esac
shift
OUT=${OUT:-build/gpu-multi-out}
mkdir -p "$OUT"
BUILD=build/gpu
export PATH="/usr/local/cuda/bin:$PATH" NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TWELL_COMMIT=${TWELL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
SUMMARY="$OUT/00-summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
note "== gpu_multi $PART $(date -u +%FT%TZ) commit $TWELL_COMMIT"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
nvidia-smi topo -m 2>&1 | head -8 >> "$SUMMARY"
source scripts/gpu-env
CMAKE=$(command -v cmake || echo /opt/torch/.venv/bin/cmake)
t0=$(date +%s)
{ "$CMAKE" -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a;80" &&
  "$CMAKE" --build "$BUILD" -j "$(nproc)"; } > "$OUT/build.log" 2>&1
rc=$?
note "build rc=$rc ($(( $(date +%s) - t0 )) s)"
[ $rc -ne 0 ] && { grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
export PYTHONPATH=$PWD/$BUILD/python
logs=(build.log)

if [ "$PART" = check ]; then
  mkdir -p data
  [ -d data/gpu-corpus ] || { mkdir -p data/gpu-corpus && xz -dc .carry/gpu-corpus.tar.xz | tar xf - -C data/gpu-corpus; } ||
    { note "no .carry/gpu-corpus.tar.xz (bench/train/make_gpu_corpus.sh makes it)"; exit 1; }
  t0=$(date +%s)
  # The tests need no GPU of their own: correctness, not timing.
  (GPU_CHECK_BUILD_LOG="$OUT/build.log" OUT="$OUT/check" GPU_CHECK_PART=tests GPU_CHECK_SKIP_SANITIZER=1 GPU_CHECK_SKIP_BUILD=1 bash scripts/gpu-check > "$OUT/gpu-check.txt" 2>&1) &
  check_pid=$!
  timeout 500 python3 bench/train/ranks_equal.py --corpus data/gpu-corpus --gpus 2,4 --out "$OUT" \
    --work build/ranks-equal > "$OUT/ranks-equal.txt" 2>&1
  note "ranks_equal rc=$? ($(( $(date +%s) - t0 )) s)"
  tar -C build -cJf "$OUT/ranks-equal-logs.tar.xz" --exclude='checkpoint-*' ranks-equal 2>/dev/null
  wait $check_pid
  note "gpu-check (tests) done ($(( $(date +%s) - t0 )) s)"
  cat "$OUT/check/00-summary.txt" >> "$SUMMARY" 2>/dev/null
  logs+=(gpu-check.txt ranks-equal.txt)
  cat "$OUT/ranks_equal.md" 2>/dev/null
else
  CONFIG=${1:?scaling needs a CONFIG: 0.5b, 1b, 1.5b or 2b}
  shift
  DIR=/tmp/syn-$CONFIG
  if [ ! -f "$DIR/config.json" ]; then
    t0=$(date +%s)
    rm -rf "$DIR"
    OMP_NUM_THREADS=$(nproc) "$BUILD/tools/twell/twell" gen model --config "$CONFIG" --out "$DIR" > "$OUT/gen.log" 2>&1
    note "gen model --config $CONFIG rc=$? ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/gen.log")"
    logs+=(gen.log)
  fi
  case "$CONFIG" in 2b|1.5b) MB=4 ;; *) MB=8 ;; esac
  g=$(nvidia-smi -L | grep -c '^GPU ')
  gs=1; for n in 2 4 8; do [ "$n" -le "$g" ] && gs="$gs,$n"; done
  t0=$(date +%s)
  python3 bench/train/scaling.py --model "$DIR" --tag "$CONFIG" --gpus "$gs" --micro-batch "$MB" --out "$OUT" "$@" \
    > "$OUT/scaling.txt" 2>&1
  note "scaling rc=$? ($(( $(date +%s) - t0 )) s)"
  tar -C "$OUT" -cJf "$OUT/scaling-logs.tar.xz" ".scaling-$CONFIG" 2>/dev/null && rm -rf "$OUT/.scaling-$CONFIG"
  logs+=(scaling.txt)
  cat "$OUT/scaling-$CONFIG.md" 2>/dev/null
fi
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" "${logs[@]}" 2>/dev/null && (cd "$OUT" && rm -f "${logs[@]}")
echo
cat "$SUMMARY"
