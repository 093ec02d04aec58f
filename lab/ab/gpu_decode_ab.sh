#!/usr/bin/env bash
# Decode tokens/s of several twell builds on the same checkpoint, in one device call, alternating
# (A B … A B …) so that the machine's drift falls on every build alike; a markdown table of each
# run's dense and sparse tokens/s per decode batch, then the medians, into $OUT/decode-ab.md.
#   [OUT=…] [MODEL=DIR] [CONFIG=2b] [BATCHES="1 8"] [CONTEXT=128] [STEPS=32] [ROUNDS=2] [REPS=3] bash lab/ab/gpu_decode_ab.sh TWELL_A TWELL_B [...]
# TWELL_*: paths of `twell` binaries (e.g. carried as xz and unpacked: build/cuda/tools/twell/twell.<commit>),
# each optionally followed by +TUNING: that binary run with TWELL_TUNING=TUNING (e.g.
# /tmp/base+gemm-autotune=8: an A/B switch of docs/runtime.md against the same binary without it).
# Without MODEL, the first binary writes `twell gen model --config $CONFIG` to /tmp/twell-ab-$CONFIG
# once (≈ 1 minute at 2B); each run loads it (≈ 40–50 s a run at 2B with batches 1 and 8).
# Every run is `twell bench model --decode-batch $BATCHES --prefill-batch 1 --prefill-len 16
# --context $CONTEXT --decode-steps $STEPS --reps $REPS --no-energy`: both FFN paths in one process.
# Rounds that do not fit one device call: the next call on the warm machine continues them with
# FIRST_ROUND=N (its rounds numbered from N) and PREVIOUS=the earlier call's OUT (kept in /tmp, e.g.
# OUT=/tmp/ab1 then OUT=/tmp/ab2 PREVIOUS=/tmp/ab1): its table holds both calls' runs
# (lab/ab/decode_ab_table.py; $OUT/rows.txt lists a call's runs).
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,16p "$0"; exit 2; }
OUT=${OUT:-build/decode-ab-out}
CONFIG=${CONFIG:-2b}
BATCHES=${BATCHES:-1 8}
CONTEXT=${CONTEXT:-128}
STEPS=${STEPS:-32}
ROUNDS=${ROUNDS:-2}
REPS=${REPS:-3}
mkdir -p "$OUT"
# shellcheck source=lab/ab/ab_common.sh
source "$(dirname "$0")/ab_common.sh"
bins=()
for b in "$@"; do bins+=("${b%%+*}"); done
ab_check_binaries gpu_decode_ab "${bins[@]}"
M=${MODEL:-/tmp/twell-ab-$CONFIG}
ab_checkpoint gpu_decode_ab "${bins[0]}" "$CONFIG" "$M" "$OUT/gen.log"
FIRST_ROUND=${FIRST_ROUND:-1}
: > "$OUT/rows.txt"
for r in $(seq "$FIRST_ROUND" $((FIRST_ROUND + ROUNDS - 1))); do
  for b in "$@"; do
    bin=${b%%+*} tuning=""
    [ "$bin" != "$b" ] && tuning=${b#*+}
    name=$(basename "$bin")${tuning:++$tuning}
    file=$(printf '%s' "$name" | tr -c 'A-Za-z0-9._-' '_')  # the files' names: letters, digits, . _ -
    j="$OUT/ab-$file-$r.json"
    t0=$(date +%s)
    # shellcheck disable=SC2086  # BATCHES is a list
    env ${tuning:+TWELL_TUNING="$tuning"} "$bin" bench model --model "$M" --decode-batch $BATCHES --prefill-batch 1 \
      --prefill-len 16 --context "$CONTEXT" --decode-steps "$STEPS" --reps "$REPS" --no-energy --json "$j" \
      > "$OUT/ab-$file-$r.log" 2>&1
    echo "$name round $r: rc=$? ($(( $(date +%s) - t0 )) s)"
    echo "$name|$r|$(basename "$j")" >> "$OUT/rows.txt"
  done
done
python3 "$(dirname "$0")/decode_ab_table.py" "$OUT/decode-ab.md" ${PREVIOUS:+"$PREVIOUS/rows.txt"} "$OUT/rows.txt"
