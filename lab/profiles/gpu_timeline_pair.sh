#!/usr/bin/env bash
# Builds' graph-replayed decode steps kernel by kernel in one call (twell_probe_timeline, CUPTI, no
# phase stamps), alternating, then each build's links beside the first's (timeline_pair.py): the
# cheap check of candidates before their A/B. Session 76 built a change on a phase-stamp reading that
# compared two calls; the same-call pair (≈ 45 s a run at 2B after ≈ 100 s of build on a fresh
# machine, ≈ 10 s more a patch set) showed the loss that the A/B then measured.
#   [OUT=…] [ROUNDS=1] [CASE=2b:0.005:1:32:512] bash lab/profiles/gpu_timeline_pair.sh A[=PATCH[+PATCH…]] B[=…] [C[=…] …]
# A, B, …: names, each the tree as it is or with lab patches applied (lab/ab/gpu_patch_builds.sh's
# syntax; the probe binaries go to /tmp/probe/NAME); A is the reference. CASE: CONFIG:DENSITY:BATCH:
# STEPS:PROMPT, as lab/profiles/gpu_decode_timeline.sh takes them. Writes $OUT/NAME-ROUND/decode-
# timeline.md and $OUT/timeline-pair.md (round 1 of each build against round 1 of A; with ROUNDS=2
# also round 2's, so the reader sees how much a link moves between runs of one build). Six builds
# at one round fit a 600 s call at 2B's batch 1.
# TUNINGS="NAME=ITEMS;NAME2=ITEMS2": those builds' probes run with TWELL_TUNING=ITEMS (an A/B of a
# TWELL_TUNING switch: give the tree twice, e.g. `TUNINGS="c100=smem-carveout=100" … base c100`).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
[ $# -ge 2 ] || { sed -n 2,16p "$0"; exit 2; }
OUT=${OUT:-build/timeline-pair-out}
ROUNDS=${ROUNDS:-1}
IFS=: read -r config density batch steps prompt <<< "${CASE:-2b:0.005:1:32:512}"
mkdir -p "$OUT"
names=()
for arg in "$@"; do names+=("${arg%%=*}"); done
[ "$(printf '%s\n' "${names[@]}" | sort -u | wc -l)" -eq $# ] || { echo "gpu_timeline_pair: each build needs a name of its own"; exit 2; }
PROBE=1 BIN=/tmp/probe OUT="$OUT/builds" bash lab/ab/gpu_patch_builds.sh "$@" || exit $?
# tuning_of NAME: the TWELL_TUNING items TUNINGS gives NAME ("" where none).
tuning_of() {
  local entry entries
  [ -n "${TUNINGS:-}" ] || return 0
  IFS=';' read -r -a entries <<< "${TUNINGS:-}"
  for entry in "${entries[@]}"; do
    [ "${entry%%=*}" = "$1" ] && { printf '%s' "${entry#*=}"; return; }
  done
}
for r in $(seq 1 "$ROUNDS"); do
  for n in "${names[@]}"; do
    t0=$(date +%s)
    tuning=$(tuning_of "$n")
    [ -n "$tuning" ] && [ "$r" = 1 ] && echo "gpu_timeline_pair: $n runs with TWELL_TUNING=$tuning"
    env ${tuning:+TWELL_TUNING="$tuning"} PROBE="/tmp/probe/$n" OUT="$OUT/$n-$r" bash lab/profiles/gpu_decode_timeline.sh \
      "$config" "$density" "$batch" "$steps" "$prompt" > "$OUT/$n-$r.log" 2>&1
    echo "gpu_timeline_pair: $n round $r: $(grep -m1 "twell_probe_timeline rc=" "$OUT/$n-$r.log") ($(( $(date +%s) - t0 )) s)"
  done
done
{
  for r in $(seq 1 "$ROUNDS"); do
    for n in "${names[@]:1}"; do
      echo "## round $r: ${names[0]} against $n ($config at $density, batch $batch, $prompt prompt tokens)"
      echo
      python3 lab/profiles/timeline_pair.py "$OUT/${names[0]}-$r/decode-timeline.md" "$OUT/$n-$r/decode-timeline.md" \
        --names "${names[0]},$n"
    done
  done
} > "$OUT/timeline-pair.md"
grep -E "^## round|^step span" "$OUT/timeline-pair.md"
