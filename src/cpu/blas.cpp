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
  if (m == 1) {
    // One row (a decode step): a GEMV. sgemm packs b into a scratch copy on every call, which at one
    // row reads and writes the whole weight matrix again (half the time of a CPU decode step).
    // c[0, :] = alpha · op(a)[0, :] · op(b) + beta · c[0, :]: the row of op(a) is a's row 0, or
    // with trans_a its column 0 (stride a.ld).
    const blasint inc_a = trans_a ? static_cast<blasint>(a.ld) : 1;
    if (trans_b)  // op(b) = bᵀ, b [n, k]: c = b · x
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<blasint>(n), static_cast<blasint>(k), alpha, b.data,
                  static_cast<blasint>(b.ld), a.data, inc_a, beta, c.data, 1);
    else  // b [k, n]: c = bᵀ · x
      cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<blasint>(k), static_cast<blasint>(n), alpha, b.data,
                  static_cast<blasint>(b.ld), a.data, inc_a, beta, c.data, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a.data,
              static_cast<blasint>(a.ld), b.data, static_cast<blasint>(b.ld), beta, c.data, static_cast<blasint>(c.ld));
}

}  // namespace twell::cpu
