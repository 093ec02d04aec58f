#!/usr/bin/env bash
# An A/B of two commits' model runtime on one GPU, alternately: `twell bench model` of both trees in
# ABBA rounds (old, new, new, old: a drift of the clocks cancels), for a change to the runtime's own
# kernels (e.g. a fusion at decode) measured against the commit before it in one call.
#
#   OLD_SRC=.carry/old-src.tar.xz OLD_NAME=<hash> NEW_NAME=<hash> bash lab/ab/ab_model.sh
#
# OLD_SRC: the old commit's source as a tarball, carried (the GPU machine has no .git):
#   git archive --prefix=old/ <hash> -- . ':!bench/results' | xz > .carry/old-src.tar.xz
# Builds twell (the CLI) from both trees, then runs rounds until AB_BUDGET seconds (default 480,
# counted from the start, builds included) would be passed. AB_ARGS: the `twell bench model`
# arguments for both (default: the synthetic 2B at 0.5 %, decode at batch 1 after 128 tokens, 128
# steps, prefill 1 × 128, no energy runs). Each run's JSON lands in $OUT/ab-model/, and the table of
# medians (lab/ab/ab_model_summary.py) is printed last and written to $OUT/ab-model/summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/ab-out}
D="$OUT/ab-model"
mkdir -p "$D"
source lab/ab/ab_build.sh
BUDGET=${AB_BUDGET:-480}
ARGS=${AB_ARGS:---config 2b --density 0.005 --decode-batch 1 --prefill-batch 1 --prefill-len 128 --context 128 --decode-steps 128 --no-energy}
log() { echo "[ab-model $(date -u +%T)] $*" | tee -a "$D/log.txt"; }

t0=$(date +%s)
ab_build_trees twell_cli "90a" "$D" || exit 1
bin_old=build/ab-old/tools/twell/twell
bin_new=build/gpu/tools/twell/twell

start=$(date +%s); last=0; round=0; seq=0
run_one() {  # side
  local side=$1 bin name s
  [ "$side" = old ] && { bin=$bin_old; name=$OLD_NAME; } || { bin=$bin_new; name=$NEW_NAME; }
  s=$(date +%s); seq=$((seq + 1))
  # shellcheck disable=SC2086
  "$bin" bench model $ARGS --json "$D/r${round}.${seq}-${side}-${name}.json" > "$D/r${round}.${seq}-${side}.txt" 2>&1
  local rc=$?
  log "round $round $side ($name): rc=$rc in $(( $(date +%s) - s )) s"
  # A run that fails fails every round alike (a bad argument, a crash): stop, not loop.
  [ $rc -ne 0 ] && { echo "ab: a run failed (rc=$rc):"; tail -5 "$D/r${round}.${seq}-${side}.txt"; exit 1; }
  last=$(( $(date +%s) - s ))
}
while :; do
  elapsed=$(( $(date +%s) - t0 ))
  [ $round -gt 0 ] && [ $(( elapsed + 4 * last )) -gt "$BUDGET" ] && break
  for side in old new new old; do run_one $side; done
  round=$((round + 1))
done
log "done: $round rounds in $(( $(date +%s) - start )) s"
python3 lab/ab/ab_model_summary.py "$D" | tee "$D/summary.md"
# Both sides must run the same prefill attention (a build without cuDNN is not comparable).
att_old=$(grep -h "^prefill attention" "$D"/r0.1-old.txt | cut -d';' -f1)
att_new=$(grep -h "^prefill attention" "$D"/r0.2-new.txt | cut -d';' -f1)
{ echo; echo "old: $att_old"; echo "new: $att_new"; } | tee -a "$D/summary.md"
[ "${att_old%% (*}" = "${att_new%% (*}" ] || echo "ab: WARNING: the two sides run different prefill attention" | tee -a "$D/summary.md"
