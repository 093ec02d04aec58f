#!/usr/bin/env bash
# One training run on the GPU machine, for comparisons across calls (each call has 10 minutes):
#   bash bench/train/gpu_run.sh NAME CONFIG [KEY=JSON ...]
# trains CONFIG with the overrides (e.g. ffn='"dense"' l1_coeff=0 steps=3700) into build/train-runs/NAME,
# copies its telemetry to $OUT/telemetry-NAME.jsonl and, for a twell run, runs `twell generate` on
# the last checkpoint ($OUT/generate-NAME.txt). Then `bench/train/summarize.py` compares runs:
#   python3 bench/train/summarize.py baseline=telemetry-a.jsonl sparse=telemetry-b.jsonl --out DIR
# Needs the carried corpus (GPU_CORPUS, default .carry/gpu-corpus.tar.xz: the first 12 M tokens of
# twell.corpus's train split, val-heldout, val-wiki, the tokenizer; make_gpu_corpus.sh makes it) and twell built in $BUILD (default build/gpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { sed -n 2,9p "$0"; exit 2; }
NAME=$1 CONFIG=$2
shift 2
OUT=${OUT:-build/train-out}
BUILD=${BUILD:-build/gpu}
export PYTHONPATH=$BUILD/python
mkdir -p "$OUT" data build/train-runs
# Unpacked once per machine: a later call with another GPU_CORPUS needs rm -rf data/gpu-corpus.
[ -d data/gpu-corpus ] || { mkdir -p data/gpu-corpus && xz -dc "${GPU_CORPUS:-.carry/gpu-corpus.tar.xz}" | tar xf - -C data/gpu-corpus; } || exit 1
RUN=build/train-runs/$NAME
rm -rf "$RUN"
python3 - "$CONFIG" "$RUN.json" "$@" <<'PY' || exit 2
import json, sys
cfg = json.load(open(sys.argv[1]))
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    cfg[k] = json.loads(v)
json.dump(cfg, open(sys.argv[2], "w"), indent=1)
print("config:", json.dumps(cfg))
PY
t0=$(date +%s)
# TRAIN_TIMEOUT (seconds, 0: none) stops the training so that what follows still fits the device
# call; the checkpoints saved by then are what the evaluation and `twell generate` see.
timeout "${TRAIN_TIMEOUT:-0}" python3 -m twell.train "$RUN.json" --out "$RUN" > "/tmp/train-$NAME.log" 2>&1
rc=$?
echo "$NAME: rc=$rc ($(( $(date +%s) - t0 )) s)"; tail -c 700 "/tmp/train-$NAME.log"; echo
cp "$RUN/telemetry.jsonl" "$OUT/telemetry-$NAME.jsonl" 2>/dev/null
ck="$RUN/$(cat "$RUN/latest" 2>/dev/null)"
if [ -x "$BUILD/tools/twell/twell" ] && [ -f "$ck/config.json" ] && grep -q '"ffn": "twell"' "$RUN.json"; then
  timeout 60 "$BUILD/tools/twell/twell" generate --model "$ck" --prompt "The dictionary defines a river as" \
    --max-new-tokens 40 > "$OUT/generate-$NAME.txt" 2>&1
  tail -4 "$OUT/generate-$NAME.txt"
fi
exit $rc
