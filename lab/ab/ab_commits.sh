#!/usr/bin/env bash
# An A/B of two commits' FFN benchmark on one GPU, alternately (issue 26's "no speed regression":
# the current tree against an older commit, measured in one run so that clocks and the machine match).
#
#   OLD_SRC=.carry/old-src.tar.xz OLD_NAME=eee918c NEW_NAME=<hash> bash lab/ab/ab_commits.sh
#
# OLD_SRC: the old commit's source as a tarball (make it here, the GPU machine has no .git:
#   git archive --prefix=old/ eee918c -- . ':!bench/results' | xz > .carry/old-src.tar.xz), carried.
# Builds twell_bench_cuda from both trees, then runs rounds until AB_BUDGET seconds (default 520)
# (counted from the start, builds included) would be passed: each round is old, new, new, old (ABBA, so that a drift of the clocks cancels),
# each run `--quick --no-train` or `--quick --train-only` (AB_PART: infer, train, both: alternate
# per round); AB_ARGS: more arguments for both (e.g. "--reps 10"). Every run's JSON lands in $OUT/ab/; lab/ab/ab_summary.py reads them.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/ab-out}
mkdir -p "$OUT/ab"
source lab/ab/ab_build.sh
BUDGET=${AB_BUDGET:-520}
PART=${AB_PART:-both}
log() { echo "[ab $(date -u +%T)] $*" | tee -a "$OUT/ab/log.txt"; }

t0=$(date +%s)
ab_build_trees twell_bench_cuda "90a;80" "$OUT/ab" || exit 1
# In the lab build (lab/bench) since it moved there; an older tree has it under bench/cuda. Decided
# by the old tree's source (build/ab-old may hold a binary of another commit's layout from an
# earlier A/B on the same machine).
if [ -f build/ab-old-src/old/lab/bench/bench_cuda.cpp ]; then
  bin_old=build/ab-old/lab/twell_bench_cuda
else
  bin_old=build/ab-old/bench/cuda/twell_bench_cuda
fi
bin_new=build/gpu/lab/twell_bench_cuda

start=$(date +%s); last=0; round=0; seq=0
run_one() {  # side part
  local side=$1 part=$2 bin name flags s
  [ "$side" = old ] && { bin=$bin_old; name=$OLD_NAME; } || { bin=$bin_new; name=$NEW_NAME; }
  [ "$part" = infer ] && flags="--quick --no-train" || flags="--quick --train-only"
  s=$(date +%s); seq=$((seq + 1))
  "$bin" $flags ${AB_ARGS:-} --json "$OUT/ab/r${round}.${seq}-${part}-${side}-${name}.json" \
    > "$OUT/ab/r${round}.${seq}-${part}-${side}.txt" 2>&1
  local rc=$?
  log "round $round $part $side ($name): rc=$rc in $(( $(date +%s) - s )) s"
  # A run that fails fails every round alike (a bad argument, a crash): stop, not loop.
  [ $rc -ne 0 ] && { echo "ab: a run failed (rc=$rc):"; tail -5 "$OUT/ab/r${round}.${seq}-${part}-${side}.txt"; exit 1; }
  last=$(( $(date +%s) - s ))
}
while :; do
  case "$PART" in infer|train) part=$PART ;; *) [ $((round % 2)) = 0 ] && part=infer || part=train ;; esac
  # A round is four runs; start it only if four of the last run's length fit.
  elapsed=$(( $(date +%s) - t0 ))
  [ $round -gt 0 ] && [ $(( elapsed + 4 * last )) -gt "$BUDGET" ] && break
  for side in old new new old; do run_one $side $part; done
  round=$((round + 1))
done
log "done: $round rounds in $(( $(date +%s) - start )) s"
