#pragma once
// Thin wrappers over OpenBLAS sgemm for row-major matrices. Never call these from inside an
// OpenMP parallel region: OpenBLAS threads itself.
#include "twell/tensor.hpp"

namespace twell::cpu {

// C = alpha · op(A) · op(B) + beta · C, row-major; op(X) = Xᵀ when trans_X.
void gemm(bool trans_a, bool trans_b, float alpha, CMatrixF a, CMatrixF b, float beta, MatrixF c);

}  // namespace twell::cpu
