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
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,10p "$0"; exit 2; }
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
rows=()
for r in $(seq 1 "$ROUNDS"); do
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
    rows+=("$name|$r|$j")
  done
done
python3 - "$OUT/decode-ab.md" "${rows[@]}" <<'PY'
import json, statistics, sys
out, rows = sys.argv[1], sys.argv[2:]
runs, names = [], []
for row in rows:
    name, rnd, path = row.split("|")
    if name not in names:
        names.append(name)
    try:
        j = json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"{path}: {e}")
        continue
    for r in j.get("rows", []):
        if r.get("phase") == "decode":
            p = r.get("sparse_runtime_path", {})
            share = f'{100 * p["sparse_rows"] / p["ffn_rows"]:.1f} %' if p.get("ffn_rows") else "n/a"
            runs.append((name, int(rnd), r["batch"], r["dense_tokens_per_s"], r["sparse_tokens_per_s"], share))
lines = ["| build | round | decode batch | dense tokens/s | sparse tokens/s | sparse / dense | sparse runtime's FFN rows on the sparse path |",
         "|---|---:|---:|---:|---:|---:|---:|"]
for name, rnd, b, d, s, share in runs:
    lines.append(f"| {name} | {rnd} | {b} | {d:.0f} | {s:.0f} | {s / d:.3f}× | {share} |")
lines += ["", "Medians over the rounds (and each build's sparse spread, lowest to highest, to judge a difference by):", "",
          "| build | decode batch | dense | sparse | sparse spread | sparse / dense | sparse / first build's |",
          "|---|---:|---:|---:|---:|---:|---:|"]
base = {}
for name in names:
    for b in sorted({r[2] for r in runs}):
        mine = [r for r in runs if r[0] == name and r[2] == b]
        if not mine:
            continue
        d = statistics.median(r[3] for r in mine)
        s = statistics.median(r[4] for r in mine)
        base.setdefault(b, s)
        lo, hi = min(r[4] for r in mine), max(r[4] for r in mine)
        lines.append(f"| {name} | {b} | {d:.0f} | {s:.0f} | {lo:.0f}–{hi:.0f} | {s / d:.3f}× | {s / base[b]:.3f}× |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
