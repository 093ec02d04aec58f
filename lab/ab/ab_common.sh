# Sourced by the A/B scripts beside it (gpu_decode_ab.sh, gpu_generate_ab.sh).
# ab_checkpoint NAME TWELL CONFIG DIR LOG: DIR holds `TWELL gen model --config CONFIG` (written once,
# ≈ 1 minute at 2B; LOG gets its output); exits the script on failure. NAME prefixes the messages.
ab_checkpoint() {
  local name=$1 twell=$2 config=$3 dir=$4 log=$5 t0
  [ -f "$dir/config.json" ] && return 0
  t0=$(date +%s)
  rm -rf "$dir"
  OMP_NUM_THREADS=$(nproc) "$twell" gen model --config "$config" --out "$dir" > "$log" 2>&1 ||
    { echo "$name: twell gen model failed"; tail -3 "$log"; exit 1; }
  echo "checkpoint $dir: $(( $(date +%s) - t0 )) s"
}

# ab_check_binaries NAME TWELL...: every argument is an executable, else exits with a message.
ab_check_binaries() {
  local name=$1 b
  shift
  for b in "$@"; do [ -x "$b" ] || { echo "$name: $b is not an executable"; exit 2; }; done
}
