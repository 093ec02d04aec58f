#!/usr/bin/env bash
# Issue 58's serving benchmark on the GPU machine: one workload against `twell serve` on its automatic
# (sparse where measured sparse) path, the same server with --ffn dense, and transformers' continuous
# batching behind bench/serve/torch_server.py, each started alone on the GPU in turn, measured by
# bench/serve/bench_serve.py (vLLM's bench-serve metrics), compared by bench/serve/compare.py.
#   [BUILD=build/gpu] [OUT=build/serve-out] [MODEL=DIR] [SERVERS=auto,dense,torch]
#   [CONCURRENCY=1,8,32,64] [REQUESTS=16,32,64,128] [PROMPT_LEN=128] [MAX_TOKENS=128] [WARMUP=64]
#   [TOKENIZER=FILE] [LABEL_SUFFIX=" (fixed KV)"] bash bench/serve/gpu_serve.sh [CONFIG [DENSITY]]   (2b 0.005)
# Needs a built twell with the server (scripts/gpu-check with GPU_CHECK_PART=build in the same call,
# .debs carried for cpp-httplib). Without MODEL, `twell gen model` writes CONFIG at DENSITY; a
# synthetic checkpoint has no tokenizer, so TOKENIZER (default assets/smollm2-135m-instruct's, or
# .carry/bench-tokenizer.json) is trimmed to its vocabulary (bench/serve/trim_tokenizer.py): prompts
# are token ids, so the tokenizer only names the generated ids. Writes under $OUT: NAME.json and
# NAME.log per server, serve.md and serve.png (the comparison).
set -uo pipefail
[ -n "${MODEL:-}" ] && MODEL=$(realpath "$MODEL")
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/gpu}
OUT=${OUT:-build/serve-out}
CONFIG=${1:-2b}
DENSITY=${2:-0.005}
SERVERS=${SERVERS:-auto,dense,torch}
CONC=${CONCURRENCY:-1,8,32,64}
REQS=${REQUESTS:-16,32,64,128}
PL=${PROMPT_LEN:-128}
MT=${MAX_TOKENS:-128}
WARMUP=${WARMUP:-16}  # before each point (at least its concurrency)
PORT=${PORT:-18600}
DEVICE=${DEVICE:-cuda}  # cpu: a dry run of this script on a small model
mkdir -p "$OUT"
TWELL=$BUILD/tools/twell/twell
"$TWELL" serve --help > /dev/null 2>&1 || { echo "gpu_serve: $TWELL has no serve command (cpp-httplib missing at build?)"; exit 1; }
if [ -n "${MODEL:-}" ]; then
  M=$MODEL
else
  M=/tmp/twell-serve-$CONFIG
  if [ ! -f "$M/tokenizer.json" ]; then
    rm -rf "$M"
    t0=$(date +%s)
    "$TWELL" gen model --config "$CONFIG" --density "$DENSITY" --out "$M" > "$OUT/gen.log" 2>&1 ||
      { echo "gpu_serve: twell gen model failed"; tail -5 "$OUT/gen.log"; exit 1; }
    TOK=${TOKENIZER:-}
    [ -z "$TOK" ] && for t in assets/smollm2-135m-instruct/tokenizer.json .carry/bench-tokenizer.json; do
      [ -f "$t" ] && TOK=$t && break
    done
    [ -n "$TOK" ] || { echo "gpu_serve: no tokenizer to trim (set TOKENIZER)"; exit 1; }
    V=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$M/config.json")
    python3 bench/serve/trim_tokenizer.py "$TOK" "$V" "$M" || exit 1
    echo "checkpoint $CONFIG at $DENSITY: $(( $(date +%s) - t0 )) s"
  fi
fi
V=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$M/config.json")
MAXC=$(echo "$CONC" | tr ',' '\n' | sort -n | tail -1)
pid=
stop_server() {
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  pid=
}
trap stop_server EXIT
results=()
for s in ${SERVERS//,/ }; do
  PORT=$((PORT + 1))
  case $s in
    auto|dense|sparse)
      label="twell $s${LABEL_SUFFIX:-}"  # e.g. a run under TWELL_TUNING=no-paged-kv
      "$TWELL" serve --model "$M" --model-name bench --device "$DEVICE" --ffn "$s" --port "$PORT" \
        --max-running "$MAXC" --max-queue 4096 > "$OUT/$s.log" 2>&1 &
      pid=$! ;;
    torch)
      label="transformers CB"
      PYTHONUNBUFFERED=1 python3 bench/serve/torch_server.py --model "$M" --model-name bench --port "$PORT" --device "$DEVICE" \
        --dtype "$([ "$DEVICE" = cpu ] && echo fp32 || echo bf16)" --max-new-tokens "$MT" > "$OUT/$s.log" 2>&1 &
      pid=$! ;;
    *) echo "gpu_serve: unknown server '$s' (auto, dense, sparse, torch)"; exit 1 ;;
  esac
  t0=$(date +%s)
  up=0
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && { up=1; break; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if [ "$up" != 1 ]; then
    echo "gpu_serve: $label did not come up"; tail -20 "$OUT/$s.log"; stop_server; continue
  fi
  echo "== $label up in $(( $(date +%s) - t0 )) s"
  python3 bench/serve/bench_serve.py --url "http://127.0.0.1:$PORT" --model bench --concurrency "$CONC" \
    --requests "$REQS" --prompt-len "$PL" --max-tokens "$MT" --vocab "$V" --warmup "$WARMUP" --timeout 300 \
    --label "$label" --json "$OUT/$s.json" --md "$OUT/$s.md"
  [ "$s" != torch ] && curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^twell_(ffn|kv|steps)" > "$OUT/$s.metrics"
  stop_server
  [ -f "$OUT/$s.json" ] && results+=("$OUT/$s.json")
done
[ ${#results[@]} -gt 0 ] || exit 1
python3 bench/serve/compare.py "${results[@]}" --md "$OUT/serve.md" --png "$OUT/serve.png" --title "$(basename "$M") on $( [ "$DEVICE" = cpu ] && echo CPU || nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
