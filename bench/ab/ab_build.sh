# Sourced by bench/ab/ab_commits.sh and ab_model.sh: the old tree unpacked and both trees built.
#   ab_build_trees OLD_SRC TARGET CUDA_ARCHS LOGDIR
# unpacks OLD_SRC (a tarball of old/) under build/ab-old-src, then builds TARGET from it into
# build/ab-old and from this tree into build/gpu, at once (half the cores each). Returns non-zero
# after printing the failing log's tail. Needs CMAKE, and scripts/gpu-env sourced (PCRE2).
ab_build_trees() {
  local src=$1 target=$2 archs=$3 logs=$4 jobs old_pid old_rc new_rc
  jobs=$(( $(nproc) / 2 + 1 ))
  rm -rf build/ab-old-src && mkdir -p build/ab-old-src && tar -xJf "$src" -C build/ab-old-src || return 1
  [ -f build/ab-old-src/old/CMakeLists.txt ] || { echo "ab: no old/CMakeLists.txt in $src"; return 1; }
  local cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$archs")
  ( "$CMAKE" -S build/ab-old-src/old -B build/ab-old "${cfg[@]}" && "$CMAKE" --build build/ab-old -j "$jobs" --target "$target" ) \
    > "$logs/build-old.log" 2>&1 &
  old_pid=$!
  ( "$CMAKE" -S . -B build/gpu "${cfg[@]}" && "$CMAKE" --build build/gpu -j "$jobs" --target "$target" ) \
    > "$logs/build-new.log" 2>&1
  new_rc=$?
  wait $old_pid; old_rc=$?
  [ $old_rc -ne 0 ] && { echo "ab: the old tree's build failed"; tail -20 "$logs/build-old.log"; return 1; }
  [ $new_rc -ne 0 ] && { echo "ab: this tree's build failed"; tail -20 "$logs/build-new.log"; return 1; }
  return 0
}
