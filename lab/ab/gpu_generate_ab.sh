#!/usr/bin/env bash
# Sampled generation's decode tokens/s of several twell builds, alternating in one device call:
# `twell generate` on one checkpoint, greedy and sampled (top-k, top-k + top-p + a repetition
# penalty), batches of 1 and 8 prompts, into $OUT/generate-ab.md (a table: median of ROUNDS runs).
#   [OUT=…] [MODEL=DIR] [CONFIG=2b] [TOKENIZER=assets/smollm2-135m-instruct/tokenizer.json] [ROUNDS=2] [NEW=128]
#   bash lab/ab/gpu_generate_ab.sh TWELL_A TWELL_B [...]
# Without MODEL, the first binary writes `twell gen model --config $CONFIG` to /tmp/twell-ab-$CONFIG
# (as gpu_decode_ab.sh does); the synthetic checkpoint has no tokenizer, so TOKENIZER (a
# tokenizer.json of the same vocabulary size: SmolLM2's 49152 for the synthetic configs) is copied
# in. Every run: --ignore-eos -n $NEW, a fixed prompt; decode tokens/s from --json (decode tokens
# over decode seconds: steps after the prefill, sampling and the host's loop included).
set -uo pipefail
[ $# -ge 1 ] || { sed -n 2,11p "$0"; exit 2; }
OUT=${OUT:-build/generate-ab-out}
CONFIG=${CONFIG:-2b}
ROUNDS=${ROUNDS:-2}
NEW=${NEW:-128}
TOKENIZER=${TOKENIZER:-assets/smollm2-135m-instruct/tokenizer.json}
mkdir -p "$OUT"
# shellcheck source=lab/ab/ab_common.sh
source "$(dirname "$0")/ab_common.sh"
ab_check_binaries gpu_generate_ab "$@"
M=${MODEL:-/tmp/twell-ab-$CONFIG}
ab_checkpoint gpu_generate_ab "$1" "$CONFIG" "$M" "$OUT/gen.log"
if [ ! -f "$M/tokenizer.json" ]; then
  [ -f "$TOKENIZER" ] || { echo "gpu_generate_ab: $M has no tokenizer.json and TOKENIZER=$TOKENIZER is missing"; exit 1; }
  cp "$TOKENIZER" "$M/tokenizer.json"
fi
PROMPT="The history of the region begins with the first settlements along the river, where farmers"
modes=("greedy|" "top-k 50|--temperature 0.8 --top-k 50" "top-k 50, top-p 0.9, penalty 1.1|--temperature 0.8 --top-k 50 --top-p 0.9 --repetition-penalty 1.1" "top-p 0.9|--temperature 0.8 --top-p 0.9")
rows=()
for r in $(seq 1 "$ROUNDS"); do
  for batch in 1 8; do
    prompts=()
    for _ in $(seq 1 "$batch"); do prompts+=(--prompt "$PROMPT"); done
    for mode in "${modes[@]}"; do
      label=${mode%%|*}
      # shellcheck disable=SC2206  # the mode's flags are words
      flags=(${mode#*|})
      for b in "$@"; do
        name=$(basename "$b")
        j="$OUT/gen-$name-$r-$batch-${#rows[@]}.json"
        "$b" generate --model "$M" "${prompts[@]}" -n "$NEW" --ignore-eos -q --seed 3 "${flags[@]}" --json "$j" \
          > /dev/null 2> "$OUT/gen-last.err" || { echo "$name $label b$batch: failed"; tail -2 "$OUT/gen-last.err"; }
        rows+=("$name|$label|$batch|$j")
      done
    done
  done
  echo "round $r done"
done
python3 - "$OUT/generate-ab.md" "${rows[@]}" <<'PY'
import json, statistics, sys
out, rows = sys.argv[1], sys.argv[2:]
res, names, labels = {}, [], []
for row in rows:
    name, label, batch, path = row.split("|")
    names += [name] if name not in names else []
    labels += [label] if label not in labels else []
    try:
        d = json.load(open(path))["decode"]
        res.setdefault((name, label, int(batch)), []).append(d["tokens"] / d["seconds"])
    except (OSError, ValueError, KeyError, ZeroDivisionError) as e:
        print(f"{path}: {e}")
lines = ["| sampling | batch | " + " | ".join(f"{n} tokens/s" for n in names) + " | last / first |",
         "|---|---:|" + "---:|" * (len(names) + 1)]
for label in labels:
    for batch in (1, 8):
        v = [statistics.median(res[(n, label, batch)]) if (n, label, batch) in res else float("nan") for n in names]
        lines.append(f"| {label} | {batch} | " + " | ".join(f"{x:.1f}" for x in v) + f" | {v[-1] / v[0]:.3f}× |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
