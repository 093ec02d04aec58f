#!/usr/bin/env bash
# Two builds' graph-replayed decode steps kernel by kernel in one call (twell_probe_timeline, CUPTI,
# no phase stamps), alternating, then their links side by side (timeline_pair.py): the cheap check of
# a candidate before its A/B. Session 76 built a change on a phase-stamp reading that compared two
# calls; the same-call pair (≈ 45 s a run at 2B after ≈ 100 s of build on a fresh machine) showed
# the loss that the A/B then measured.
#   [OUT=…] [ROUNDS=1] [CASE=2b:0.005:1:32:512] bash lab/profiles/gpu_timeline_pair.sh A[=PATCH[+PATCH…]] B[=…]
# A, B: names, each the tree as it is or with lab patches applied (lab/ab/gpu_patch_builds.sh's
# syntax; the probe binaries go to /tmp/probe/NAME). CASE: CONFIG:DENSITY:BATCH:STEPS:PROMPT, as
# lab/profiles/gpu_decode_timeline.sh takes them. Writes $OUT/NAME-ROUND/decode-timeline.md and
# $OUT/timeline-pair.md (round 1 of A against round 1 of B; with ROUNDS=2 also round 2's, so the
# reader sees how much a link moves between runs of one build).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
[ $# -eq 2 ] || { sed -n 2,12p "$0"; exit 2; }
OUT=${OUT:-build/timeline-pair-out}
ROUNDS=${ROUNDS:-1}
IFS=: read -r config density batch steps prompt <<< "${CASE:-2b:0.005:1:32:512}"
mkdir -p "$OUT"
names=("${1%%=*}" "${2%%=*}")
[ "${names[0]}" != "${names[1]}" ] || { echo "gpu_timeline_pair: the two builds need two names"; exit 2; }
PROBE=1 BIN=/tmp/probe OUT="$OUT/builds" bash lab/ab/gpu_patch_builds.sh "$1" "$2" || exit $?
for r in $(seq 1 "$ROUNDS"); do
  for n in "${names[@]}"; do
    t0=$(date +%s)
    PROBE="/tmp/probe/$n" OUT="$OUT/$n-$r" bash lab/profiles/gpu_decode_timeline.sh \
      "$config" "$density" "$batch" "$steps" "$prompt" > "$OUT/$n-$r.log" 2>&1
    echo "gpu_timeline_pair: $n round $r: $(grep -m1 "twell_probe_timeline rc=" "$OUT/$n-$r.log") ($(( $(date +%s) - t0 )) s)"
  done
done
{
  for r in $(seq 1 "$ROUNDS"); do
    echo "## round $r: ${names[0]} against ${names[1]} ($config at $density, batch $batch, $prompt prompt tokens)"
    echo
    python3 lab/profiles/timeline_pair.py "$OUT/${names[0]}-$r/decode-timeline.md" "$OUT/${names[1]}-$r/decode-timeline.md" \
      --names "${names[0]},${names[1]}"
  done
} > "$OUT/timeline-pair.md"
grep -E "^## round|^step span" "$OUT/timeline-pair.md"
