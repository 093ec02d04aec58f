#pragma once
// Small device helpers shared by the CUDA kernels: bf16 unpacking, warp reductions and scans,
// 16-byte row chunk loads and the 8-wide dot/axpy on them.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace twell::cuda::dev {

// A 32-bit word holds two bf16: lo = bits 0..15, hi = bits 16..31.
__device__ __forceinline__ float lo_bf16(std::uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(std::uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// The 8 bf16 packed in v (the low half of each word first) as floats.
__device__ __forceinline__ void unpack8_bf16(const uint4& v, float (&f)[8]) {
  f[0] = lo_bf16(v.x);
  f[1] = hi_bf16(v.x);
  f[2] = lo_bf16(v.y);
  f[3] = hi_bf16(v.y);
  f[4] = lo_bf16(v.z);
  f[5] = hi_bf16(v.z);
  f[6] = lo_bf16(v.w);
  f[7] = hi_bf16(v.w);
}

// A gated FFN's activation of its gate value g, in twell::model::Activation's order: 0 ReLU (fmaxf,
// the TwELL engine's), 1 SiLU, 2 GELU (erf), 3 GELU (tanh). The one definition every kernel that
// forms h = act(g) ⊙ u takes (ops::gated_product), so that they give the same bits.
__device__ __forceinline__ float activate(int act, float g) {
  switch (act) {
    case 0: return fmaxf(g, 0.0f);
    case 1: return g / (1.0f + expf(-g));
    case 2: return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
    default: return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  }
}

// One neuron i of a gated FFN's up product from its gate and up sums (the one-token gated
// epilogues: gemv_kernel.cuh, rmsnorm_project.cu): g and u stored as bf16 at gu[i] and
// gu[up_row + i] (the bits the plain epilogue stores), then h[i] = bf16(act(g) · u) from those
// stored values where i < h_n (ops::gated_product's bits).
__device__ __forceinline__ void store_gated_neuron(float g_sum, float u_sum, std::int64_t i, std::int64_t up_row,
                                                   __nv_bfloat16* gu, __nv_bfloat16* h, std::int64_t h_n, int act) {
  const __nv_bfloat16 g = __float2bfloat16_rn(g_sum), u = __float2bfloat16_rn(u_sum);
  gu[i] = g;
  gu[up_row + i] = u;
  if (i < h_n) h[i] = __float2bfloat16_rn(activate(act, __bfloat162float(g)) * __bfloat162float(u));
}

// Raw 16 bits of bf16 element e (0..7; the low half of each word first) of the 8 packed in v.
// Selects, never an indexed register array: a run-time e costs a few instructions, a
// compile-time e (unrolled loops) folds away.
__device__ __forceinline__ std::uint32_t bf16_bits(const uint4& v, int e) {
  const std::uint32_t w = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
  return (e & 1) ? (w >> 16) : (w & 0xffffu);
}

// Keep decisions for the 8 bf16 packed in v: bit e set ⇔ element e is kept, i.e. value > 0
// (relu: the TwELL / CSR keep rule, NaN never kept) or value != 0 (NaN kept). Integer forms of
// exactly those float tests: > 0 ⇔ bits in [0x0001, 0x7f80] (positive finite or +inf);
// != 0 ⇔ bits & 0x7fff ≠ 0 (±0 are the only zeros).
__device__ __forceinline__ unsigned keep_mask8(const uint4& v, bool relu = true) {
  unsigned m = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const std::uint32_t b = bf16_bits(v, e);
    m |= (relu ? (b - 1u < 0x7f80u) : ((b & 0x7fffu) != 0u)) ? (1u << e) : 0u;
  }
  return m;
}

// The sum of v over lanes 0 … lane (T: int or unsigned long long, as __shfl_up_sync takes).
template <class T>
__device__ __forceinline__ T warp_inclusive_scan(T v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T o = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += o;
  }
  return v;
}

// The sum over the warp's 32 lanes, in every lane (T: any type __shfl_xor_sync takes).
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

// Thread `tid` of `nthreads` owns the 16-byte chunks {i·nthreads + tid : i < CH} of a row of
// `kchunks` chunks (8 bf16 each), so each warp reads contiguous 512-byte runs; chunks past the
// row's end read as zero.
template <int CH>
__device__ __forceinline__ void load_chunks(const __nv_bfloat16* row, int tid, int nthreads, int kchunks, uint4 (&v)[CH]) {
#pragma unroll
  for (int i = 0; i < CH; ++i) {
    const int c = i * nthreads + tid;
    v[i] = (c < kchunks) ? __ldg(reinterpret_cast<const uint4*>(row) + c) : make_uint4(0, 0, 0, 0);
  }
}

// Weight rows w[rows[j0 + q], :] for q < U (row stride k) into r[q], this thread's chunks as in
// load_chunks; entries past cnt read as zero. U loads per chunk are in flight before the first use.
template <int U, int CH>
__device__ __forceinline__ void load_row_group(const __nv_bfloat16* w, const int* rows, int j0, int cnt, std::int64_t k,
                                               int tid, int nthreads, int kchunks, uint4 (&r)[U][CH]) {
#pragma unroll
  for (int q = 0; q < U; ++q) {
    if (j0 + q < cnt) {
      load_chunks<CH>(w + static_cast<std::int64_t>(rows[j0 + q]) * k, tid, nthreads, kchunks, r[q]);
    } else {
#pragma unroll
      for (int i = 0; i < CH; ++i) r[q][i] = make_uint4(0, 0, 0, 0);
    }
  }
}

// The same, evict-first: for rows read once (x, dy), so the weight rows keep the L2.
template <int CH>
__device__ __forceinline__ void load_chunks_stream(const __nv_bfloat16* row, int tid, int nthreads, int kchunks,
                                                   uint4 (&v)[CH]) {
#pragma unroll
  for (int i = 0; i < CH; ++i) {
    const int c = i * nthreads + tid;
    v[i] = (c < kchunks) ? __ldcs(reinterpret_cast<const uint4*>(row) + c) : make_uint4(0, 0, 0, 0);
  }
}

__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  float s = lo_bf16(a.x) * lo_bf16(b.x);
  s = fmaf(hi_bf16(a.x), hi_bf16(b.x), s);
  s = fmaf(lo_bf16(a.y), lo_bf16(b.y), s);
  s = fmaf(hi_bf16(a.y), hi_bf16(b.y), s);
  s = fmaf(lo_bf16(a.z), lo_bf16(b.z), s);
  s = fmaf(hi_bf16(a.z), hi_bf16(b.z), s);
  s = fmaf(lo_bf16(a.w), lo_bf16(b.w), s);
  s = fmaf(hi_bf16(a.w), hi_bf16(b.w), s);
  return s;
}

// acc[0..8) += h · w (w: 8 bf16)
__device__ __forceinline__ void axpy8(float h, const uint4& w, float* acc) {
  acc[0] = fmaf(h, lo_bf16(w.x), acc[0]);
  acc[1] = fmaf(h, hi_bf16(w.x), acc[1]);
  acc[2] = fmaf(h, lo_bf16(w.y), acc[2]);
  acc[3] = fmaf(h, hi_bf16(w.y), acc[3]);
  acc[4] = fmaf(h, lo_bf16(w.z), acc[4]);
  acc[5] = fmaf(h, hi_bf16(w.z), acc[5]);
  acc[6] = fmaf(h, lo_bf16(w.w), acc[6]);
  acc[7] = fmaf(h, hi_bf16(w.w), acc[7]);
}

// 8 fp32 → 8 bf16 (round to nearest even) in one 16-byte word.
__device__ __forceinline__ uint4 pack8_bf16(const float* a) {
  __nv_bfloat162 o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) o[e] = __floats2bfloat162_rn(a[2 * e], a[2 * e + 1]);
  return *reinterpret_cast<const uint4*>(o);
}

// Elements [c0, c0 + 8) of a bf16 row of length n as one 16-byte word (zero past n); one vector
// load when the row is 16-byte aligned there: evict-first (STREAM), else through L1 (for data
// read twice in a row).
template <bool STREAM = true>
__device__ __forceinline__ uint4 load8_bf16(const __nv_bfloat16* src, std::int64_t c0, std::int64_t n, bool vec_ok) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (c0 >= n) return v;
  if (vec_ok && c0 + 8 <= n)
    return STREAM ? __ldcs(reinterpret_cast<const uint4*>(src + c0)) : __ldg(reinterpret_cast<const uint4*>(src + c0));
  std::uint16_t h[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) h[e] = (c0 + e < n) ? __bfloat16_as_ushort(src[c0 + e]) : std::uint16_t{0};
  v.x = h[0] | (std::uint32_t(h[1]) << 16);
  v.y = h[2] | (std::uint32_t(h[3]) << 16);
  v.z = h[4] | (std::uint32_t(h[5]) << 16);
  v.w = h[6] | (std::uint32_t(h[7]) << 16);
  return v;
}

// cp.async (sm_80+): 16 bytes global → shared (L2 only, bypassing L1), zero-filled when !valid;
// groups complete in commit order, wait_group<N> waits until at most N of this thread's groups
// are pending. dst is a shared-memory address (__cvta_generic_to_shared).
__device__ __forceinline__ void cp_async16(std::uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Asks L2 for the 128-byte lines holding p, p + 128, … below p + Bytes (where p is not line-aligned
// the range's last line may go unasked: speed, not values): a hint that loads nothing into
// registers and changes no value, for rows a later loop reads.
template <int Bytes>
__device__ __forceinline__ void prefetch_l2(const void* p) {
  const char* c = static_cast<const char*>(p);
#pragma unroll
  for (int b = 0; b < Bytes; b += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(c + b));
}

// D (16 × 8, fp32) += A (16 × 16, bf16, row) · B (16 × 8, bf16, col): mma.m16n8k16. Fragments (g =
// lane / 4, t = lane % 4): a0 = A[g][2t, 2t + 1], a1 = A[g + 8][same], a2 = A[g][2t + 8, 2t + 9],
// a3 = A[g + 8][same]; b0 = B[2t, 2t + 1][g], b1 = B[2t + 8, 2t + 9][g]; d0, d1 = D[g][2t, 2t + 1],
// d2, d3 = D[g + 8][same]. The products are exact; within a k16 step the sum aligns and truncates.
__device__ __forceinline__ void mma_16816_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
  __trap();  // no bf16 mma below sm_80: fail loudly rather than leave zeros
#endif
}

// ldmatrix (sm_80+): four 8 × 8 b16 matrices from shared memory, matrix j's 8 rows (16 bytes each)
// at the addresses lanes 8j … 8j + 7 give; register j of lane l holds row l / 4, elements 2(l % 4)
// and + 1 of matrix j (with .trans: column l / 4, rows 2(l % 4) and + 1).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                                  unsigned& r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

// The grid's fired-pair count. One thread of each of `ctas` CTAs calls this once with its CTA's
// share (0 allowed): the share goes into *nnz; the last caller (a ticket) publishes the total to
// *nnz_out (when given) and leaves *nnz and *ticket zero, so the next launch (or graph replay)
// starts from zero with no memset. Returns whether the caller was the last.
__device__ __forceinline__ bool grid_count_publish(unsigned long long* nnz, unsigned* ticket, unsigned ctas,
                                                   unsigned long long share, unsigned long long* nnz_out) {
  if (share) atomicAdd(nnz, share);
  __threadfence();  // the share (and the caller's earlier writes) before the ticket
  if (atomicAdd(ticket, 1u) != ctas - 1) return false;
  __threadfence();  // every other CTA's share is seen
  const unsigned long long total = atomicExch(nnz, 0ull);
  if (nnz_out) *nnz_out = total;
  *ticket = 0;
  return true;
}

}  // namespace twell::cuda::dev
