#include <limits>

#include "twell/cpu/ffn_ops.hpp"

namespace twell {

void ffn_check_shapes(CMatrixF x, const FfnWeights& w) {
  const std::int64_t K = w.w_up.cols, N = w.w_up.rows;
  TWELL_CHECK(x.data && w.w_up.data && w.w_down.data, ErrorCode::invalid_argument,
              "FFN needs x, w_up and w_down (w_gate only for a gated FFN)");
  TWELL_CHECK(x.rows >= 1 && K >= 1 && N >= 1, ErrorCode::invalid_argument,
              "FFN shapes must be non-empty: x is [{}, {}], w_up is [{}, {}]", x.rows, x.cols, N, K);
  TWELL_CHECK(x.cols == K, ErrorCode::shape_mismatch, "x is [{}, {}] but w_up is [{}, {}]: x's K ({}) must equal w_up's K ({})",
              x.rows, x.cols, N, K, x.cols, K);
  if (w.gated())
    TWELL_CHECK(w.w_gate.rows == N && w.w_gate.cols == K, ErrorCode::shape_mismatch,
                "w_gate is [{}, {}] but w_up is [{}, {}]: both must be [N, K]", w.w_gate.rows, w.w_gate.cols, N, K);
  TWELL_CHECK(w.w_down.rows == K && w.w_down.cols == N, ErrorCode::shape_mismatch,
              "w_down is [{}, {}] but must be [K, N] = [{}, {}] (Hugging Face down_proj layout)", w.w_down.rows,
              w.w_down.cols, K, N);
  TWELL_CHECK(N < std::numeric_limits<std::int32_t>::max() && x.rows < std::numeric_limits<std::int32_t>::max(),
              ErrorCode::overflow, "FFN with M = {} tokens and N = {} neurons exceeds the int32 index range", x.rows, N);
}

namespace cpu {

PreparedFfn prepare_ffn(const FfnWeights& w) {
  ffn_check_shapes(CMatrixF(w.w_up.data, 1, w.w_up.cols), w);  // the weights alone (x of one row)
  PreparedFfn p;
  p.w = w;
  const std::int64_t K = w.hidden(), N = w.intermediate();
  p.down_t.resize(static_cast<std::size_t>(N * K));
  // Blocked transpose of Wd [K, N] into [N, K].
  constexpr std::int64_t B = 64;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t n0 = 0; n0 < N; n0 += B)
    for (std::int64_t k0 = 0; k0 < K; k0 += B)
      for (std::int64_t n = n0; n < std::min(n0 + B, N); ++n)
        for (std::int64_t k = k0; k < std::min(k0 + B, K); ++k)
          p.down_t[static_cast<std::size_t>(n * K + k)] = w.w_down(k, n);
  return p;
}

}  // namespace cpu
}  // namespace twell
