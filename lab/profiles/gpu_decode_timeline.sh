#!/usr/bin/env bash
# A graph-replayed decode step kernel by kernel as it runs (issue 27's decode): twell_probe_timeline
# (CUPTI activity records: real start/end times, programmatic launches' overlap and the idle gaps
# visible; ncu serialises, nsys is not usable on the GPU machines) for the dense and automatic FFN
# paths, into $OUT/decode-timeline.md.
#   [BUILD=build/gpu] [PROBE=$BUILD/lab/twell_probe_timeline] [OUT=…] bash lab/profiles/gpu_decode_timeline.sh [CONFIG [DENSITY [BATCH [STEPS [PROMPT [PATHS]]]]]]   (2b 0.005 1 32 128 dense,automatic)
# PATHS: the FFN paths to trace, in the order they run (dense,automatic; automatic,dense; or one): the
# second runs on a GPU warmed by the first, so a gap between them is checked in the other order too.
# Needs a build configured with -DTWELL_BUILD_LAB=ON and CUPTI (CMake's CUDA::cupti: the toolkit's
# libcupti; twell_probe_timeline is left out without it). Where the toolkit's libcupti is not on
# the loader's path, PyTorch's copy (nvidia/cu13/lib in its venv) is used. ≈ 1.5 minutes at 2B (the synthetic model's build).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/gpu}
OUT=${OUT:-build/decode-timeline-out}
mkdir -p "$OUT"
P=${PROBE:-$BUILD/lab/twell_probe_timeline}  # PROBE: a copy (lab/ab/gpu_patch_builds.sh PROBE=1)
[ -x "$P" ] || { echo "gpu_decode_timeline: no $P (a build without -DTWELL_BUILD_LAB=ON, or without CUPTI?)"; exit 1; }
if ldd "$P" | grep -q "libcupti.*not found"; then
  for d in /usr/local/cuda/extras/CUPTI/lib64 /usr/local/cuda/lib64 $(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null); do
    [ -e "$d/libcupti.so.13" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
  done
fi
timeout 400 "$P" "${1:-2b}" "${2:-0.005}" "${3:-1}" "${4:-32}" "${5:-128}" "${6:-dense,automatic}" > "$OUT/decode-timeline.md" 2> "$OUT/decode-timeline.err"
echo "twell_probe_timeline rc=$?"
cat "$OUT/decode-timeline.md"
tail -3 "$OUT/decode-timeline.err"
