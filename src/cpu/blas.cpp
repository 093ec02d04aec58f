#include "cpu/blas.hpp"

#include <cblas.h>

namespace twell::cpu {

void gemm(bool trans_a, bool trans_b, float alpha, CMatrixF a, CMatrixF b, float beta, MatrixF c) {
  const std::int64_t m = trans_a ? a.cols : a.rows;
  const std::int64_t k = trans_a ? a.rows : a.cols;
  const std::int64_t kb = trans_b ? b.cols : b.rows;
  const std::int64_t n = trans_b ? b.rows : b.cols;
  TWELL_CHECK(k == kb && c.rows == m && c.cols == n, ErrorCode::internal,
              "gemm: [{}, {}] x [{}, {}] -> [{}, {}] does not fit", m, k, kb, n, c.rows, c.cols);
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a.data,
              static_cast<blasint>(a.ld), b.data, static_cast<blasint>(b.ld), beta, c.data, static_cast<blasint>(c.ld));
}

}  // namespace twell::cpu
