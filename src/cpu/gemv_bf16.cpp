#include "cpu/gemv_bf16.hpp"

#include <algorithm>
#include <bit>
#if defined(__AVX512F__)
// GCC 12's AVX-512 headers build some intrinsics on _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports at every use; the values are never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
#include <cstring>

#include "cpu/parallel.hpp"
#include "twell/error.hpp"
#include "twell/host_memory.hpp"

namespace twell::cpu {

namespace {

inline float widen(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// Software prefetch of the weight rows a thread reads next: the hardware's stream prefetchers, with
// four rows a thread in flight, left a token's products at ≈ 16 GB/s; prefetching two row quads
// ahead took SmolLM2's from 17 to 10 ms (2 cores).
inline void prefetch(const std::uint16_t* p) { __builtin_prefetch(p, 0, 3); }

// y_r[j0 … j0 + 3] for one row x_r: four weight rows at once, so that each x chunk is loaded once for
// four products and the sums' horizontal adds are shared (one row at a time ran at ≈ 50 GB/s on
// cache-resident weights, below OpenBLAS's sgemv on the fp32 copy).
#if defined(__AVX512F__)
inline __m512 widen16(const std::uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline float lane_sum(__m512 a) {  // the 16 lanes in order
  alignas(64) float t[16];
  _mm512_store_ps(t, a);
  float s = 0.0f;
  for (float v : t) s += v;
  return s;
}
// 16 elements a step, the k % 16 tail in scalar code (masked loads in the loop ran the 2B-sized head
// at ≈ 2/3 of the speed). `ahead`: the rows two steps on, prefetched a cache line at a time (null at
// the end of the matrix).
inline void dot4(const float* xr, const std::uint16_t* w0, std::int64_t k, const std::uint16_t* ahead, float* out) {
  const std::uint16_t *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  std::int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    if (ahead && i % 32 == 0)
      for (int r = 0; r < 4; ++r) prefetch(ahead + r * k + i);
    const __m512 xv = _mm512_loadu_ps(xr + i);
    a0 = _mm512_fmadd_ps(xv, widen16(w0 + i), a0);
    a1 = _mm512_fmadd_ps(xv, widen16(w1 + i), a1);
    a2 = _mm512_fmadd_ps(xv, widen16(w2 + i), a2);
    a3 = _mm512_fmadd_ps(xv, widen16(w3 + i), a3);
  }
  out[0] = lane_sum(a0);
  out[1] = lane_sum(a1);
  out[2] = lane_sum(a2);
  out[3] = lane_sum(a3);
  for (; i < k; ++i) {
    out[0] += xr[i] * widen(w0[i]);
    out[1] += xr[i] * widen(w1[i]);
    out[2] += xr[i] * widen(w2[i]);
    out[3] += xr[i] * widen(w3[i]);
  }
}
#else
inline void dot4(const float* xr, const std::uint16_t* w0, std::int64_t k, const std::uint16_t* ahead, float* out) {
  const std::uint16_t *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
  if (ahead)
    for (int r = 0; r < 4; ++r)
      for (std::int64_t i = 0; i < k; i += 32) prefetch(ahead + r * k + i);
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
  for (std::int64_t i = 0; i < k; ++i) {
    const float xv = xr[i];
    a0 += xv * widen(w0[i]);
    a1 += xv * widen(w1[i]);
    a2 += xv * widen(w2[i]);
    a3 += xv * widen(w3[i]);
  }
  out[0] = a0;
  out[1] = a1;
  out[2] = a2;
  out[3] = a3;
}
#endif

}  // namespace

void gemv_bf16(const float* x, std::int64_t rows, const std::uint16_t* w, std::int64_t n, std::int64_t k, float* y) {
  TWELL_CHECK(rows >= 1 && rows <= kGemvBf16MaxRows && n >= 0 && k >= 0, ErrorCode::internal,
              "gemv_bf16: {} rows (1 … {}), n {}, k {}", rows, kGemvBf16MaxRows, n, k);
  const std::int64_t quads = n / 4;
#pragma omp parallel for schedule(static) if (rows * n * k >= kParallelMinWork)
  for (std::int64_t q = 0; q < quads; ++q)
    for (std::int64_t r = 0; r < rows; ++r) {
      float out[4];
      dot4(x + r * k, w + 4 * q * k, k, r == 0 && q + 2 < quads ? w + 4 * (q + 2) * k : nullptr, out);
      for (int e = 0; e < 4; ++e) y[r * n + 4 * q + e] = out[e];
    }
  for (std::int64_t j = 4 * quads; j < n; ++j)  // the last n % 4 rows
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * k;
      const std::uint16_t* wr = w + j * k;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (std::int64_t i = 0; i < k; ++i) acc += xr[i] * widen(wr[i]);
      y[r * n + j] = acc;
    }
}

std::vector<std::uint16_t> exact_bf16(const std::vector<float>& w) {
  // First whether every value is bf16 (low halves all zero: a branch-free scan in blocks, which the
  // compiler vectorises), then the high halves appended (append_converted: no zero fill of fresh
  // pages first — at model scale the kernel's page zeroing is most of the cost — and a vectorised
  // loop; push_back per element was 19 % of a SmolLM2 `twell generate` on 2 cores).
  constexpr std::size_t kBlock = 4096;
  const std::size_t n = w.size();
  for (std::size_t b = 0; b < n; b += kBlock) {
    std::uint32_t low = 0;
    for (std::size_t i = b, e = std::min(n, b + kBlock); i < e; ++i) low |= std::bit_cast<std::uint32_t>(w[i]) & 0xffffu;
    if (low != 0) return {};
  }
  std::vector<std::uint16_t> out;
  out.reserve(n);
  append_converted(out, w.data(), n, [](float x) { return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16); });
  return out;
}

}  // namespace twell::cpu
