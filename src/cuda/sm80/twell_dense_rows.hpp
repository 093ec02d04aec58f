#pragma once
// Dense rows: the hot/cold split of the sparse remainder by token row. Through the fused kernel a
// row costs about one pair of 4 KB weight rows from L2 per non-zero; as a row of a cuBLASLt GEMM it
// costs a fixed 4·K·N flops (2·K·N non-gated) on tensor cores. Rows whose count exceeds `row_cap`
// (hot tokens, heavy rows of a skewed distribution, rows with overflowed blocks) are cheaper dense.
// Up to `capacity` of them, in ascending row order, are gathered and run dense:
//   gated:     u = x_h·Wuᵀ (GEMM), h = g ⊙ u (g from the TwELL blocks, overflowed blocks from the
//              backup), y_h = h·Wdᵀ (GEMM), scattered into y;
//   non-gated: h = the TwELL values themselves, y_h = h·Wdᵀ, scattered into y.
// The fused kernel skips exactly the rows run dense (its row filter). Rows past the capacity stay
// on the sparse path, so the capacity (a host-side GEMM size, chosen from an earlier call's count)
// costs speed, never a value.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace twell::cuda {

// The rule the plan and the dispatch count share: a row is hot (runs dense) iff its count exceeds
// row_cap, and a hot row weighs row_cost in the dispatch measure instead of its count.
__host__ __device__ inline bool dense_row_hot(std::uint64_t count, std::uint32_t row_cap) { return count > row_cap; }
__host__ __device__ inline std::uint64_t dense_row_weight(std::uint64_t count, std::uint32_t row_cap, std::uint32_t row_cost) {
  return dense_row_hot(count, row_cap) ? row_cost : count;
}

// Written by the plan (zeroed by its launcher) and the gather.
struct DenseRowsStats {
  unsigned long long cost;      // Σ_rows (count ≤ row_cap ? count : row_cost): the dispatch's measure
  unsigned long long hot;       // rows with count > row_cap
  unsigned long long dense;     // rows run dense: min(hot, capacity) (written by the gather)
  unsigned long long nnz;       // Σ_rows count
};

struct DenseRowsPlanParams {
  const std::uint32_t* row_nnz = nullptr;  // [m] true non-zero count of each row
  std::int64_t m = 0;
  std::uint32_t row_cap = 0;   // a row is hot iff its count > row_cap
  std::uint32_t row_cost = 0;  // a hot row's weight in stats->cost (non-zero equivalents)
  DenseRowsStats* stats = nullptr;  // required
  // Optional (null: statistics only): the hot rows, ascending, and how many there are.
  int* list = nullptr;      // [m]
  int* selected = nullptr;  // [1]
  void* temp = nullptr;     // CUB scratch of dense_rows_plan_temp_bytes(m) bytes
  std::size_t temp_bytes = 0;
};
std::size_t dense_rows_plan_temp_bytes(std::int64_t m);
void launch_dense_rows_plan(const DenseRowsPlanParams& p, cudaStream_t stream);

// Rows i < capacity: row list[i] of x into x_h[i] (zeros for i ≥ min(*selected, capacity), or no
// copy when x is null: non-gated), row_dense[list[i]] = 1 (row_dense zeroed by the launcher), and
// stats->dense = min(*selected, capacity).
struct DenseRowsGatherParams {
  const int* list = nullptr;
  const int* selected = nullptr;
  std::int64_t capacity = 0;
  const __nv_bfloat16* x = nullptr;  // [m, k], row stride ld_x; null: flags only
  std::int64_t ld_x = 0, k = 0, m = 0;
  __nv_bfloat16* x_h = nullptr;      // [capacity, k]
  std::uint32_t* row_dense = nullptr;  // [m]
  DenseRowsStats* stats = nullptr;
};
void launch_dense_rows_gather(const DenseRowsGatherParams& p, cudaStream_t stream);

// h[i, :] for i < capacity: the TwELL row list[i] expanded (overflowed blocks from backup with the
// keep rule), times u[i, :] when u is set; zero rows for i ≥ min(*selected, capacity); columns
// [n, ld_h) zero. h rounded to bf16 once (as the dense path's h).
struct DenseRowsHParams {
  const int* list = nullptr;
  const int* selected = nullptr;
  std::int64_t capacity = 0;
  const std::uint32_t* words = nullptr;  // TwELL [m, tiles · S]
  int words_per_tile = 32;
  const __nv_bfloat16* backup = nullptr;  // [m, n] dense values of overflowed blocks, stride ld_backup
  std::int64_t ld_backup = 0;
  bool relu = true;
  std::int64_t n = 0;
  const __nv_bfloat16* u = nullptr;  // optional [capacity, n], stride ld_u
  std::int64_t ld_u = 0;
  __nv_bfloat16* h = nullptr;        // [capacity, ld_h]
  std::int64_t ld_h = 0;
};
void launch_dense_rows_h(const DenseRowsHParams& p, cudaStream_t stream);

// y[list[i], :] = y_h[i, :] for i < min(*selected, capacity).
struct DenseRowsScatterParams {
  const int* list = nullptr;
  const int* selected = nullptr;
  std::int64_t capacity = 0;
  const __nv_bfloat16* y_h = nullptr;  // [capacity, k]
  __nv_bfloat16* y = nullptr;          // [m, k], row stride ld_y
  std::int64_t ld_y = 0, k = 0;
};
void launch_dense_rows_scatter(const DenseRowsScatterParams& p, cudaStream_t stream);

}  // namespace twell::cuda
