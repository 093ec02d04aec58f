#!/usr/bin/env bash
# One `twell` binary per build of this tree with lab patches applied, for lab/ab/gpu_decode_ab.sh in
# the same or a later call on a warm GPU machine (build dirs and /tmp survive while it is held).
#   [OUT=…] [BIN=/tmp] [TESTS=name:PATCH+PATCH] [CTEST_J=4] bash lab/ab/gpu_patch_builds.sh NAME[=PATCH[+PATCH…]] …
# NAME alone: the tree as it is (the base). NAME=a.patch+b.patch: those patches applied together
# (`patch -p1 -i`, each checked by a dry run first), the CLI (CMake target twell_cli) rebuilt
# incrementally in build/gpu, copied to $BIN/NAME, and the patches reversed. With TESTS=name:…
# that set is applied once more at the end, every target built, and `ctest -L gpu` run on it
# (test binaries are left in that state; the sources are restored). The tree must be clean of the
# patches when it starts. The first build configures build/gpu (Release, sm_90a, no lab), ≈ 70 s on
# the H200 machine; each patch set then 6–25 s; `ctest -L gpu -j 4` ≈ 115 s.
# The binaries' commit label is git's on the device, whose .git can be older than the tree it was
# sent (session 71): start the command with `export TWELL_COMMIT=<this machine's short hash>`.
# Example: bash lab/ab/gpu_patch_builds.sh base att=lab/patches/x.patch && \
#          BATCHES=1 bash lab/ab/gpu_decode_ab.sh /tmp/base /tmp/att
# PROBE=1: the lab's twell_probe_timeline instead of the CLI (build/gpu configured with the lab; for
# lab/profiles/gpu_timeline_pair.sh), copied to $BIN/NAME likewise.
set -uo pipefail
[ $# -ge 1 ] || { sed -n 2,16p "$0"; exit 2; }
OUT=${OUT:-build/patch-builds-out}
BIN=${BIN:-/tmp}
if [ "${PROBE:-0}" = 1 ]; then
  target=twell_probe_timeline binary=lab/twell_probe_timeline lab=ON
else
  target=twell_cli binary=tools/twell/twell lab=OFF
fi
mkdir -p "$OUT" "$BIN"
export PATH="/usr/local/cuda/bin:$PATH"
source scripts/gpu-env
CMAKE=${CMAKE:-$(command -v cmake || echo /opt/torch/.venv/bin/cmake)}
LOG="$OUT/patch-builds.log"
note() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/summary.txt"; }

# apply_set DIRECTION PATCH+PATCH…: applies (or, with -R, reverses in the opposite order) each patch.
apply_set() {
  local dir=$1 set=$2 f list=()
  IFS=+ read -r -a list <<< "$set"
  if [ "$dir" = -R ]; then
    local rev=()
    for ((i = ${#list[@]} - 1; i >= 0; i--)); do rev+=("${list[i]}"); done
    list=("${rev[@]}")
  fi
  for f in "${list[@]}"; do
    # shellcheck disable=SC2086  # $dir is empty or -R
    { patch -p1 --dry-run -s $dir -i "$f" && patch -p1 -s $dir -i "$f"; } >> "$LOG" 2>&1 ||
      { note "gpu_patch_builds: $f does not apply ($dir); see $LOG"; exit 3; }
  done
}

build() {
  local t0 rc
  t0=$(date +%s)
  "$CMAKE" --build build/gpu -j "$(nproc)" ${1:+--target "$1"} >> "$LOG" 2>&1
  rc=$?
  note "build ${1:-all} rc=$rc ($(( $(date +%s) - t0 )) s)"
  [ $rc -eq 0 ] || { grep -E "error|FAILED" "$LOG" | tail -10; exit 4; }
}

# Each device call copies the tree with this machine's mtimes, older than objects a previous call
# built (perhaps from patched sources) that a warm machine keeps: ninja would link those stale
# objects. Touching the sources makes every call rebuild what they feed (≈ 70 s, a fresh start's cost).
[ -d build/gpu ] && git ls-files -z src include tools tests bench python lab | xargs -0 touch
# Configured anew when absent or when the lab's presence must change (a configure alone is seconds).
if [ ! -f build/gpu/build.ninja ] || ! grep -q "TWELL_BUILD_LAB:BOOL=$lab" build/gpu/CMakeCache.txt; then
  "$CMAKE" -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DTWELL_BUILD_LAB=$lab >> "$LOG" 2>&1 || { note "gpu_patch_builds: configure failed"; tail -20 "$LOG"; exit 2; }
fi
for arg in "$@"; do
  name=${arg%%=*}
  set=""; [ "$name" != "$arg" ] && set=${arg#*=}
  [ -n "$set" ] && apply_set "" "$set"
  build "$target"
  cp "build/gpu/$binary" "$BIN/$name"
  [ -n "$set" ] && apply_set -R "$set"
  note "$BIN/$name: ${set:-the tree as it is}"
done
if [ -n "${TESTS:-}" ]; then
  set=${TESTS#*:}
  apply_set "" "$set"
  build
  t0=$(date +%s)
  (cd build/gpu && OMP_NUM_THREADS=4 timeout 280 ctest --output-on-failure -L gpu -j "${CTEST_J:-4}" --timeout 270) > "$OUT/ctest-gpu.log" 2>&1
  note "ctest -L gpu with ${TESTS%%:*} ($set): rc=$? ($(( $(date +%s) - t0 )) s), $(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log")"
  apply_set -R "$set"
fi
