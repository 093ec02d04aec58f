#!/usr/bin/env bash
# `pip install .` as a user runs it, into a scratch directory: builds the wheel with the installed
# scikit-build-core and nanobind (no network: --no-build-isolation), installs it there, and runs
# twell.torch.ffn once from the installed copy. Exit 77 (skipped) without those packages or torch.
set -euo pipefail
py=$1 src=$2 work=$3
"$py" -c "import scikit_build_core, nanobind, torch" 2>/dev/null || { echo "SKIP: needs scikit-build-core, nanobind, torch"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
"$py" -m pip wheel --no-build-isolation --no-deps -q -w "$work/wheel" "$src" \
  --config-settings=build-dir="$work/build"
"$py" -m pip install --no-deps -q --target "$work/site" "$work"/wheel/twell-*.whl
cd "$work"
PYTHONPATH="$work/site" "$py" - <<'PY'
import torch, twell, twell.torch as tt
assert twell.__file__.startswith(__import__("os").getcwd()), twell.__file__  # the installed copy
x, wg, wu, wd = torch.randn(5, 16), torch.randn(40, 16), torch.randn(40, 16), torch.randn(16, 40)
y, l1 = tt.ffn(x.requires_grad_(), wg, wu, wd)
want = (torch.relu(x @ wg.T) * (x @ wu.T)) @ wd.T
assert (y - want).abs().max() <= 1e-4 * want.abs().max(), "wrong result from the installed package"
import twell.model  # the native runtime is in the wheel
assert hasattr(twell._twell, "NativeModel"), "the wheel has no model runtime"
print("pip install . ok:", twell.__file__)
PY
