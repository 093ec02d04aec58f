#!/usr/bin/env bash
# Issues 27 and 59's decode targets in one call on the GPU machine: twell's decode (batch 1, or DECODE_BATCHES) against
# PyTorch's best dense decode on the same synthetic checkpoint, same GPU, same call: transformers +
# torch.compile(mode="reduce-overhead") + static cache (CUDA graphs), and the same weights through
# a lean gpt-fast-style body (bench/model/fast_llama.py) compiled alike; "best" is the faster.
#   [BUILD=build/gpu] [OUT=…] [TORCH_TIMEOUT=420] [PREFILL=1 [DECODE=0]] [MODEL=DIR] [DECODE_BATCHES="1 8"] [FAST_MODES=reduce-overhead+cdt,reduce-overhead,default+graph,max-autotune] [FAST_ATTN=sdpa,math] [HF_DECODE=0] [DECODE_WARMUP=N] [CONTEXT=128] bash bench/model/gpu_decode_yardstick.sh [CONFIG [DENSITY]]   (2b 0.005)
# DECODE_BATCHES="1 8 32 64": the decode batches on both sides (default 1; above 1 PyTorch runs the lean
# body's rows only), one table row each: issue 59's "twell dense ≥ 1.0×, sparse ≥ 1.1× PyTorch".
# DECODE_WARMUP=N: twell's untimed decode steps before its timed ones (default 2; 600 is a server's
# state past its first tokens: the one-token FFN's neuron order sorted by counts over hundreds of
# steps; it pays from its first reorders at steps 8–32 already, fcdba84's A/B).
# HF_DECODE=0 leaves out transformers' decode rows (its compiled row takes minutes): with
# FAST_MODES=reduce-overhead+cdt the gpt-fast row has the call to itself (its compilation outlasted
# the ≈ 5 minutes left after transformers' rows at 8c8578f).
# Needs a built twell (e.g. scripts/gpu-check earlier in the same call). Writes torch.json,
# twell.json and decode-yardstick.md (the table) under $OUT. PREFILL=1 adds the prefill of 8 × 512
# (PREFILL_BATCH × PREFILL_LEN: e.g. the paper's 64 × 2048)
# tokens on both sides (PyTorch eager and torch.compile; twell with the prefill attention it
# builds in, and again with TWELL_TUNING=no-cudnn-attention: twell-own-attention.json) to the same table.
# DECODE=0 (with PREFILL=1) leaves out PyTorch's decode rows (their compilations take minutes) and
# twell's own-attention run: a prefill of 64 × 2048 fits a call then.
set -uo pipefail
[ -n "${MODEL:-}" ] && MODEL=$(realpath "$MODEL")  # before the cd: relative to the caller
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/gpu}
OUT=${OUT:-build/yardstick-out}
CONFIG=${1:-2b}
DENSITY=${2:-0.005}
DECODE_BATCHES=${DECODE_BATCHES:-1}
CONTEXT=${CONTEXT:-128}  # prompt tokens before the timed decode steps, both sides (issue 59: 512)
mkdir -p "$OUT"
rm -f "$OUT"/torch.json "$OUT"/twell.json "$OUT"/twell-own-attention.json  # no table from an older run
# MODEL=DIR: an existing checkpoint instead (e.g. the converted SmolLM2: its SiLU FFN runs dense,
# so twell's two rows measure the same path, against transformers on the same weights; on the GPU
# machine scripts/smollm2-from-carry puts it in assets/smollm2-135m-instruct).
M=${MODEL:-/tmp/twell-yardstick-$CONFIG}
t0=$(date +%s)
if [ -n "${MODEL:-}" ] && [ ! -f "$M/config.json" ]; then
  echo "gpu_decode_yardstick: MODEL=$M has no config.json"; exit 1
fi
if [ ! -f "$M/config.json" ]; then
  rm -rf "$M"
  "$BUILD/tools/twell/twell" gen model --config "$CONFIG" --density "$DENSITY" --out "$M" > "$OUT/gen.log" 2>&1 ||
    { echo "gpu_decode_yardstick: twell gen model failed"; tail -5 "$OUT/gen.log"; exit 1; }
fi
echo "checkpoint: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
PREFILL=${PREFILL:-0}
# The lean body's decode under these torch.compile modes, a row each: reduce-overhead+cdt is
# gpt-fast's decode setting (CUDA graphs, inductor's coordinate-descent tuning of its kernels; the
# reference notes' 376 tokens/s for this shape came from a compiled body, never reproduced with
# reduce-overhead alone: 252–268 here). max-autotune adds minutes of compilation and did not finish
# inside a call (7967f30): name it in FAST_MODES to have it. With PREFILL=1 the call's 600 s leave
# room for reduce-overhead alone.
# Several decode batches: default+graph alone (each batch is a compilation of its own, ≈ 60 s on an
# H200 at 3898bfa; with reduce-overhead+cdt, DECODE_BATCHES="1 8 32 64" printed nothing in 570 s,
# 4b0c082's call). default+graph is issue 59's setup: the step compiled, captured into one CUDA graph.
nb=$(echo $DECODE_BATCHES | wc -w)
FAST_MODES=${FAST_MODES:-$([ "$PREFILL" = 1 ] && echo reduce-overhead || { [ "$nb" -gt 1 ] && echo default+graph || echo reduce-overhead+cdt,reduce-overhead; })}
# … and with these attentions over the cache, a row each with every mode (fast_llama.py: sdpa, math;
# math ran 0.66–0.90× sdpa in every call so far, so it is left out unless named).
FAST_ATTN=${FAST_ATTN:-sdpa}
PB=${PREFILL_BATCH:-8}
PL=${PREFILL_LEN:-512}
skip=--skip-prefill
[ "$PREFILL" = 1 ] && skip=
[ "$PREFILL" = 1 ] && [ "${DECODE:-1}" = 0 ] && skip=--skip-decode
pf="--prefill-batch 1 --prefill-len 128"
[ "$PREFILL" = 1 ] && pf="--prefill-batch $PB --prefill-len $PL"
"$BUILD/tools/twell/twell" bench model --model "$M" --decode-batch $DECODE_BATCHES --context "$CONTEXT" --decode-steps 128 --no-energy \
  --decode-warmup "${DECODE_WARMUP:-2}" $pf --json "$OUT/twell.json" > "$OUT/twell.log" 2>&1
echo "twell bench rc=$? ($(( $(date +%s) - t0 )) s)"
# twell first (a minute), then PyTorch under TORCH_TIMEOUT (default 420 s): its JSON is written row
# by row, so the rows that finished make the table even when a compilation outlasts the call.
t0=$(date +%s)
timeout "${TORCH_TIMEOUT:-420}" python3 bench/model/torch_yardstick.py "$M" $skip --prefill-batch "$PB" --prefill-len "$PL" --context "$CONTEXT" --decode-steps 128 \
  --decode-batch $DECODE_BATCHES \
  --fast-modes "$FAST_MODES" --fast-attn "$FAST_ATTN" $([ "${HF_DECODE:-1}" = 0 ] && echo --skip-hf-decode) --json "$OUT/torch.json" \
  > "$OUT/torch.log" 2>&1
echo "torch yardstick rc=$? ($(( $(date +%s) - t0 )) s)"
if [ "$PREFILL" = 1 ] && [ "${DECODE:-1}" != 0 ]; then
  t0=$(date +%s)
  TWELL_TUNING="${TWELL_TUNING:+$TWELL_TUNING,}no-cudnn-attention" \
    "$BUILD/tools/twell/twell" bench model --model "$M" --decode-batch 1 --context 128 --decode-steps 8 --no-energy \
    $pf --json "$OUT/twell-own-attention.json" > "$OUT/twell-own-attention.log" 2>&1
  echo "twell bench, own attention, rc=$? ($(( $(date +%s) - t0 )) s)"
fi
python3 bench/model/yardstick_table.py "$OUT" "$PB" "$PL"
