#!/usr/bin/env bash
# `pip install .` as a user runs it, into a scratch directory: builds the wheel with the installed
# scikit-build-core and nanobind (no network: --no-build-isolation), installs it there, and runs
# twell.torch.ffn once from the installed copy. Exit 77 (skipped) without those packages or torch.
#   bash pip_install_check.sh PYTHON SOURCE WORKDIR [cpu|cuda]
# cpu (default): the CPU-only wheel (TWELL_ENABLE_CUDA=OFF, also where nvcc is found: ≈ 40 s on 2
# cores). cuda: the wheel `pip install .` builds where nvcc is found (every CUDA kernel: ≈ 2.5 minutes
# on 2 cores); it must hold the CUDA classes, and where PyTorch sees a GPU the op runs on CUDA
# tensors too.
set -euo pipefail
py=$1 src=$2 work=$3 kind=${4:-cpu}
"$py" -c "import scikit_build_core, nanobind, torch" 2>/dev/null || { echo "SKIP: needs scikit-build-core, nanobind, torch"; exit 77; }
case "$kind" in
  cpu) cuda_flag=OFF ;;
  cuda) command -v nvcc >/dev/null || { echo "SKIP: the cuda wheel needs nvcc"; exit 77; }; cuda_flag=ON ;;
  *) echo "pip_install_check: kind is cpu or cuda, not '$kind'" >&2; exit 2 ;;
esac
rm -rf "$work" && mkdir -p "$work"
"$py" -m pip wheel --no-build-isolation --no-deps -q -w "$work/wheel" "$src" \
  --config-settings=build-dir="$work/build" --config-settings=cmake.define.TWELL_ENABLE_CUDA=$cuda_flag
"$py" -m pip install --no-deps -q --target "$work/site" "$work"/wheel/twell-*.whl
cd "$work"
PYTHONPATH="$work/site" TWELL_PIP_KIND=$kind "$py" - <<'PY'
import os
import torch, twell, twell.torch as tt
assert twell.__file__.startswith(os.getcwd()), twell.__file__  # the installed copy
kind = os.environ["TWELL_PIP_KIND"]
devices = ["cpu"]
if kind == "cuda":
    assert hasattr(twell._twell, "CudaFfnInfer") and hasattr(twell._twell, "CudaFfnTrain"), "the cuda wheel has no CUDA ops"
    if torch.cuda.is_available():
        devices.append("cuda")
else:
    assert not hasattr(twell._twell, "CudaFfnInfer"), "the cpu wheel was built with CUDA"
for dev in devices:
    g = torch.Generator().manual_seed(0)
    x, wg, wu, wd = (torch.randn(*s, generator=g).to(dev) for s in ((5, 64), (128, 64), (128, 64), (64, 128)))
    if dev == "cuda":  # bf16 on the GPU; the reference from the same bf16 values in fp32
        x, wg, wu, wd = (t.bfloat16() for t in (x, wg, wu, wd))
    y, l1 = tt.ffn(x.requires_grad_(), wg, wu, wd)
    xf, gf, uf, df = (t.detach().float() for t in (x, wg, wu, wd))
    want = (torch.relu(xf @ gf.T) * (xf @ uf.T)) @ df.T
    tol = 1e-4 if dev == "cpu" else 2e-2  # bf16 h and y on the GPU: ≈ 3 roundings of 2⁻⁹
    assert (y.float() - want).abs().max() <= tol * want.abs().max(), f"wrong result from the installed package on {dev}"
import twell.model  # the native runtime is in the wheel
assert hasattr(twell._twell, "NativeModel"), "the wheel has no model runtime"
print(f"pip install . ({kind} wheel) ok on {', '.join(devices)}:", twell.__file__)
PY
