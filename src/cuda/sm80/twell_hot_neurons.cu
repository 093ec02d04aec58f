// Hot neurons (twell_hot_neurons.hpp): per-neuron counts of a gate, weight permutation gathers.
#include "cuda/sm80/twell_hot_neurons.hpp"

#include <algorithm>

#include "cuda/common/check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/sm80/twell_dense_rows.hpp"

namespace twell::cuda {
namespace {

constexpr int kCountThreads = 256;
constexpr int kCountRowsPerBlock = 256;

// Block (x, y): columns [x·256·8, +2048) (8 per thread), rows [y·256, +256). Each thread counts its
// 8 columns over the block's rows in registers (the TwELL keep rule, dev::keep_mask8), then adds
// them with one atomic per column.
__global__ void __launch_bounds__(kCountThreads) neuron_counts_kernel(const __nv_bfloat16* g, std::int64_t ld_g,
                                                                       std::int64_t m, std::int64_t n,
                                                                       const std::uint32_t* row_nnz,
                                                                       std::uint32_t row_cap,
                                                                       std::uint32_t* counts) {
  const std::int64_t c0 = (static_cast<std::int64_t>(blockIdx.x) * kCountThreads + threadIdx.x) * 8;
  if (c0 >= n) return;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kCountRowsPerBlock;
  const std::int64_t r1 = std::min<std::int64_t>(m, r0 + kCountRowsPerBlock);
  const bool vec_ok = ld_g % 8 == 0 && reinterpret_cast<std::uintptr_t>(g) % 16 == 0;
  std::uint32_t cnt[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::int64_t r = r0; r < r1; ++r) {
    if (row_nnz && dense_row_hot(row_nnz[r], row_cap)) continue;  // runs dense on the sparse path
    const unsigned keep = dev::keep_mask8(dev::load8_bf16(g + r * ld_g, c0, n, vec_ok));
#pragma unroll
    for (int e = 0; e < 8; ++e) cnt[e] += (keep >> e) & 1u;
  }
  for (int e = 0; e < 8 && c0 + e < n; ++e)
    if (cnt[e]) atomicAdd(&counts[c0 + e], cnt[e]);
}

// One warp per row; lane l reads columns [8l, 8l + 8) of each 256-column chunk.
__global__ void row_counts_kernel(const __nv_bfloat16* g, std::int64_t ld_g, std::int64_t m, std::int64_t n,
                                  const unsigned char* mask, std::uint32_t* row_nnz) {
  const std::int64_t r = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (r >= m) return;
  const int lane = threadIdx.x % 32;
  const bool vec_ok = ld_g % 8 == 0 && reinterpret_cast<std::uintptr_t>(g) % 16 == 0;
  std::uint32_t c = 0;
  for (std::int64_t c0 = static_cast<std::int64_t>(lane) * 8; c0 < n; c0 += 256) {
    const unsigned keep = dev::keep_mask8(dev::load8_bf16(g + r * ld_g, c0, n, vec_ok));
    for (int e = 0; e < 8; ++e)  // kept values lie below n (load8_bf16 reads zeros past it)
      if ((keep >> e) & 1u) c += !mask || mask[c0 + e];
  }
  c = dev::warp_sum(c);
  if (lane == 0) row_nnz[r] = c;
}

// One block per destination row; 16-byte copies when the strides and pointers allow.
__global__ void gather_rows_kernel(const __nv_bfloat16* src, std::int64_t ld_src, const int* idx, std::int64_t cols,
                                   __nv_bfloat16* dst, std::int64_t ld_dst) {
  const std::int64_t i = blockIdx.x;
  const __nv_bfloat16* s = src + static_cast<std::int64_t>(idx[i]) * ld_src;
  __nv_bfloat16* d = dst + i * ld_dst;
  const bool vec = cols % 8 == 0 && ld_src % 8 == 0 && ld_dst % 8 == 0 &&
                   reinterpret_cast<std::uintptr_t>(src) % 16 == 0 && reinterpret_cast<std::uintptr_t>(dst) % 16 == 0;
  if (vec) {
    for (std::int64_t c = threadIdx.x * 8; c < cols; c += blockDim.x * 8)
      *reinterpret_cast<uint4*>(d + c) = *reinterpret_cast<const uint4*>(s + c);
  } else {
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
  }
}

__global__ void gather_cols_kernel(const __nv_bfloat16* src, std::int64_t ld_src, const int* idx, std::int64_t rows,
                                   std::int64_t cols, __nv_bfloat16* dst, std::int64_t ld_dst) {
  const std::int64_t total = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, j = i % cols;
    dst[r * ld_dst + j] = src[r * ld_src + idx[j]];
  }
}

}  // namespace

void launch_neuron_counts(const __nv_bfloat16* g, std::int64_t ld_g, std::int64_t m, std::int64_t n,
                          const std::uint32_t* row_nnz, std::uint32_t row_cap, std::uint32_t* counts,
                          cudaStream_t stream) {
  TWELL_CU_REQUIRE(m >= 1 && n >= 1 && ld_g >= n, ErrorCode::invalid_argument,
                   "neuron counts: bad shape m={} n={} ld={}", m, n, ld_g);
  const std::int64_t bx = (n + kCountThreads * 8 - 1) / (kCountThreads * 8);
  const std::int64_t by = (m + kCountRowsPerBlock - 1) / kCountRowsPerBlock;
  TWELL_CU_REQUIRE(bx <= 0x7fffffff && by <= 65535, ErrorCode::unsupported,
                   "neuron counts: {} rows × {} neurons is too large for one launch", m, n);
  neuron_counts_kernel<<<dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by)), kCountThreads, 0, stream>>>(
      g, ld_g, m, n, row_nnz, row_cap, counts);
  TWELL_CUDA_CHECK_LAUNCH("neuron_counts_kernel");
}

std::vector<std::uint32_t> read_neuron_counts(const __nv_bfloat16* g, std::int64_t ld_g, std::int64_t m, std::int64_t n,
                                              const std::uint32_t* row_nnz, std::uint32_t row_cap, cudaStream_t stream) {
  DeviceBuffer<std::uint32_t> counts(static_cast<std::size_t>(n));
  TWELL_CUDA_CHECK(cudaMemsetAsync(counts.get(), 0, counts.bytes(), stream));
  launch_neuron_counts(g, ld_g, m, n, row_nnz, row_cap, counts.get(), stream);
  std::vector<std::uint32_t> host(static_cast<std::size_t>(n));
  TWELL_CUDA_CHECK(cudaMemcpyAsync(host.data(), counts.get(), counts.bytes(), cudaMemcpyDeviceToHost, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));  // counts dies here
  return host;
}

std::vector<std::uint32_t> read_neuron_counts_sparse_rows(const __nv_bfloat16* g, std::int64_t ld_g, std::int64_t m,
                                                          std::int64_t n, const std::vector<unsigned char>& cold,
                                                          std::uint32_t row_cap, std::uint32_t* row_nnz,
                                                          std::int64_t* rows_left_out, cudaStream_t stream) {
  TWELL_CU_REQUIRE(static_cast<std::int64_t>(cold.size()) == n && row_nnz, ErrorCode::invalid_argument,
                   "neuron counts over sparse rows: {} mask entries for N = {}", cold.size(), n);
  DeviceBuffer<unsigned char> d_cold(cold.size());
  TWELL_CUDA_CHECK(cudaMemcpyAsync(d_cold.get(), cold.data(), cold.size(), cudaMemcpyHostToDevice, stream));
  launch_row_counts(g, ld_g, m, n, d_cold.get(), row_nnz, stream);
  if (rows_left_out) {
    std::vector<std::uint32_t> rows(static_cast<std::size_t>(m));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(rows.data(), row_nnz, rows.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost,
                                     stream));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    *rows_left_out =
        std::count_if(rows.begin(), rows.end(), [row_cap](std::uint32_t c) { return dense_row_hot(c, row_cap); });
  }
  return read_neuron_counts(g, ld_g, m, n, row_nnz, row_cap, stream);  // synchronises: d_cold dies after
}

std::vector<std::int64_t> neurons_over(const std::vector<std::uint32_t>& counts, double density, std::int64_t m,
                                       double max_hot, OverShare over) {
  std::vector<std::int64_t> hot;
  if (!(density > 0)) return hot;  // the split is off
  const double limit = density * static_cast<double>(m);
  for (std::size_t i = 0; i < counts.size(); ++i)
    if (static_cast<double>(counts[i]) > limit) hot.push_back(static_cast<std::int64_t>(i));
  if (static_cast<double>(hot.size()) <= max_hot) return hot;
  if (over == OverShare::none || !(max_hot >= 1)) return {};
  const auto keep = static_cast<std::ptrdiff_t>(max_hot);  // < hot.size()
  std::stable_sort(hot.begin(), hot.end(), [&](std::int64_t a, std::int64_t b) {
    return counts[static_cast<std::size_t>(a)] > counts[static_cast<std::size_t>(b)];
  });
  hot.resize(static_cast<std::size_t>(keep));
  std::sort(hot.begin(), hot.end());
  return hot;
}

HotNeuronChoice choose_hot_neurons_calibrated(std::vector<std::uint32_t> counts, double density, std::int64_t m,
                                              double max_hot, std::int64_t min_rows_left_out,
                                              const SparseRowsRecount& recount, OverShare over) {
  HotNeuronChoice c;
  const std::vector<std::int64_t> guess = neurons_over(counts, density, m, static_cast<double>(counts.size()));
  if (!guess.empty() && recount) {
    std::vector<unsigned char> cold(counts.size(), 1);
    for (const std::int64_t i : guess) cold[static_cast<std::size_t>(i)] = 0;
    std::int64_t left_out = 0;
    std::vector<std::uint32_t> sparse = recount(cold, &left_out);
    if (left_out >= std::max<std::int64_t>(min_rows_left_out, 1)) {
      counts = std::move(sparse);
      c.rows_left_out = left_out;
    }
  }
  c.hot = neurons_over(counts, density, m, max_hot, over);
  c.counts = std::move(counts);
  return c;
}

void launch_row_counts(const __nv_bfloat16* g, std::int64_t ld_g, std::int64_t m, std::int64_t n,
                       const unsigned char* mask, std::uint32_t* row_nnz, cudaStream_t stream) {
  TWELL_CU_REQUIRE(m >= 1 && n >= 1 && ld_g >= n, ErrorCode::invalid_argument, "row counts: bad shape m={} n={} ld={}", m,
                   n, ld_g);
  TWELL_CU_REQUIRE(m <= 0x7fffffff, ErrorCode::unsupported, "row counts: M = {} out of range", m);
  row_counts_kernel<<<static_cast<unsigned>((m * 32 + 255) / 256), 256, 0, stream>>>(g, ld_g, m, n, mask, row_nnz);
  TWELL_CUDA_CHECK_LAUNCH("row_counts_kernel");
}

void launch_gather_rows(const __nv_bfloat16* src, std::int64_t ld_src, const int* idx, std::int64_t rows,
                        std::int64_t cols, __nv_bfloat16* dst, std::int64_t ld_dst, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  TWELL_CU_REQUIRE(rows <= 0x7fffffff, ErrorCode::unsupported, "gather rows: {} rows", rows);
  gather_rows_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(src, ld_src, idx, cols, dst, ld_dst);
  TWELL_CUDA_CHECK_LAUNCH("gather_rows_kernel");
}

void launch_gather_cols(const __nv_bfloat16* src, std::int64_t ld_src, const int* idx, std::int64_t rows,
                        std::int64_t cols, __nv_bfloat16* dst, std::int64_t ld_dst, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  gather_cols_kernel<<<grid_stride_blocks(rows * cols, 256), 256, 0, stream>>>(src, ld_src, idx, rows, cols, dst, ld_dst);
  TWELL_CUDA_CHECK_LAUNCH("gather_cols_kernel");
}

}  // namespace twell::cuda
