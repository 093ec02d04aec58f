#pragma once
// The CUDA FFN classes of twell._twell (only in a build with CUDA): see cuda_ffn.cpp.
#include <nanobind/nanobind.h>

namespace twell::python {

void bind_cuda(nanobind::module_& m);

}  // namespace twell::python
