# Sourced (from the repository root) by lab/ab/ab_commits.sh and ab_model.sh: what both A/B
# scripts set up, and the two trees built.
#   OLD_SRC   the old commit's source as a tarball of old/ (required; see the scripts' headers)
#   OLD_NAME, NEW_NAME   the two sides' names in the results (default old, new)
#   CMAKE     cmake to use (default: the one on PATH, else the GPU machine's venv)
export PATH="/usr/local/cuda/bin:$PATH"
source scripts/gpu-env
CMAKE=${CMAKE:-$(command -v cmake || echo /opt/torch/.venv/bin/cmake)}
OLD_SRC=${OLD_SRC:?OLD_SRC: the old commit as a tarball (see the header)}
OLD_NAME=${OLD_NAME:-old}
NEW_NAME=${NEW_NAME:-new}

#   ab_build_trees TARGET CUDA_ARCHS LOGDIR
# unpacks OLD_SRC under build/ab-old-src, then builds TARGET from it into build/ab-old and from this
# tree into build/gpu, at once (half the cores each); the time goes to LOGDIR/log.txt. Returns
# non-zero after printing the failing log's tail.
ab_build_trees() {
  local target=$1 archs=$2 logs=$3 jobs old_pid old_rc new_rc t0
  t0=$(date +%s)
  jobs=$(( $(nproc) / 2 + 1 ))
  rm -rf build/ab-old-src && mkdir -p build/ab-old-src && tar -xJf "$OLD_SRC" -C build/ab-old-src || return 1
  [ -f build/ab-old-src/old/CMakeLists.txt ] || { echo "ab: no old/CMakeLists.txt in $OLD_SRC"; return 1; }
  # The old tree sees this tree's fetched dependencies (cudnn-frontend under .deps/): without them it
  # configures without cuDNN attention and its prefill is not comparable.
  [ -d .deps ] && ln -sfn "$PWD/.deps" build/ab-old-src/old/.deps
  # The lab on in both trees (twell_bench_cuda is a lab bench now; an older tree, which
  # lacks the option, only warns about it).
  local cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DTWELL_BUILD_LAB=ON)
  ( "$CMAKE" -S build/ab-old-src/old -B build/ab-old "${cfg[@]}" && "$CMAKE" --build build/ab-old -j "$jobs" --target "$target" ) \
    > "$logs/build-old.log" 2>&1 &
  old_pid=$!
  ( "$CMAKE" -S . -B build/gpu "${cfg[@]}" && "$CMAKE" --build build/gpu -j "$jobs" --target "$target" ) \
    > "$logs/build-new.log" 2>&1
  new_rc=$?
  wait $old_pid; old_rc=$?
  echo "[ab $(date -u +%T)] builds of $target: old rc=$old_rc, new rc=$new_rc ($(( $(date +%s) - t0 )) s)" | tee -a "$logs/log.txt"
  [ $old_rc -ne 0 ] && { echo "ab: the old tree's build failed"; tail -20 "$logs/build-old.log"; return 1; }
  [ $new_rc -ne 0 ] && { echo "ab: this tree's build failed"; tail -20 "$logs/build-new.log"; return 1; }
  return 0
}
