#pragma once
// twell._twell.NativeModel: the native model runtime (load, tokenize, forward, generate) for Python.
#include <nanobind/nanobind.h>

namespace twell::python {
void bind_model(nanobind::module_& m);
}
