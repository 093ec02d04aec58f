#!/usr/bin/env bash
# The decode step's kernels phase by phase: applies the phase-stamp patch (thread 0 of each CTA
# stamps %globaltimer and clock64 at its kernel's wait and phases; the patch's header lists them),
# builds twell_probe_timeline with it, runs lab/profiles/gpu_decode_timeline.sh for each case, and
# reverses the patch (the build directory keeps the stamped objects: the next call's
# gpu_patch_builds.sh touches the sources, so nothing stale is linked).
#   [OUT=…] [BUILD=build/gpu] [PATCH=lab/patches/…-phase-stamps.patch] bash lab/profiles/gpu_phase_stamps.sh [CASE …]
# CASE: CONFIG:DENSITY:BATCH:STEPS:PROMPT (default 2b:0.005:1:32:512 2b:0.005:8:16:512). Each case's
# report (CUPTI tables, then the phase tables) goes to $OUT/CONFIG-bBATCH/decode-timeline.md.
# ≈ 70 s to configure and build on the H200 machine, then ≈ 40–60 s a case at 2B.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-build/phase-stamps-out}
BUILD=${BUILD:-build/gpu}
PATCH=${PATCH:-lab/patches/2026-12-01-h200-phase-stamps.patch}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
source scripts/gpu-env
CMAKE=${CMAKE:-$(command -v cmake || echo /opt/torch/.venv/bin/cmake)}
[ $# -ge 1 ] || set -- 2b:0.005:1:32:512 2b:0.005:8:16:512

if ! { patch -p1 --dry-run -s -i "$PATCH" && patch -p1 -s -i "$PATCH"; } > "$OUT/patch.log" 2>&1; then
  echo "gpu_phase_stamps: $PATCH does not apply (see $OUT/patch.log)"
  exit 3
fi
trap 'patch -p1 -R -s -i "$PATCH" >> "$OUT/patch.log" 2>&1 || echo "gpu_phase_stamps: could not reverse $PATCH"' EXIT
t0=$(date +%s)
# A warm machine's objects may be newer than this call's copy of the tree (lab/ab/gpu_patch_builds.sh).
[ -d "$BUILD" ] && git ls-files -z src include tools tests bench python lab | xargs -0 touch && touch src/cuda/common/phase_stamp.*
"$CMAKE" -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DTWELL_BUILD_LAB=ON \
  > "$OUT/build.log" 2>&1 && "$CMAKE" --build "$BUILD" -j "$(nproc)" --target twell_probe_timeline >> "$OUT/build.log" 2>&1 ||
  { echo "gpu_phase_stamps: build failed"; grep -E "error|FAILED" "$OUT/build.log" | tail -10; exit 4; }
echo "gpu_phase_stamps: built in $(( $(date +%s) - t0 )) s"
for c in "$@"; do
  IFS=: read -r config density batch steps prompt <<< "$c"
  dir="$OUT/$config-b$batch"
  mkdir -p "$dir"
  t0=$(date +%s)
  BUILD=$BUILD OUT=$dir bash lab/profiles/gpu_decode_timeline.sh "$config" "$density" "$batch" "$steps" "$prompt" > "$dir/run.log" 2>&1
  echo "gpu_phase_stamps: $c $(( $(date +%s) - t0 )) s, $(head -1 "$dir/run.log")"
  grep -E "^### phase stamps|^records:" "$dir/decode-timeline.md" | head -6
done
