#pragma once
// Portable (sm_80+) TwELL kernels: packing a dense pre-activation matrix into TwELL, the fused
// gated up+down product and the non-gated sparse down product. Plain parameter structs, one
// launch wrapper per kernel that validates, configures, launches and checks (STYLE "Kernels").
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ffn_operands.hpp"

namespace twell::cuda {

// TwELL on the GPU uses T = 256 columns per tile (the GEMM tile width along N). C may be any
// divisor of 256 with S = 256 / C ≥ 2. Word layout is exactly the host format's
// (twell/twell_format.hpp): word 0 = true count, words 1..min(count, S−1) = (bf16 << 16 | local
// col) in ascending column order, remaining words zero.
inline constexpr int kTwellTile = 256;

// Device-side counters written by the packing step (zeroed by the launcher on the same stream).
struct TwellCounters {
  unsigned long long nnz;             // Σ true counts
  unsigned long long overflow_tiles;  // (row, tile) blocks with count > S − 1
  unsigned long long overflow_rows;   // rows with ≥ 1 overflowed block
  unsigned long long pad;
};

struct TwellPackParams {
  const __nv_bfloat16* src = nullptr;  // [M, N] values (the gate GEMM output), row stride ld_src
  std::int64_t ld_src = 0;
  std::int64_t m = 0, n = 0;
  int words_per_tile = 32;             // S
  bool relu = true;                    // keep v > 0 (fused ReLU); else keep v != 0
  std::uint32_t* words = nullptr;      // [M, tiles · S]
  std::uint32_t* row_overflow = nullptr;  // [M]: 1 iff the row has an overflowed block (required)
  std::uint32_t* row_nnz = nullptr;    // optional [M]: each row's true count (zeroed by the launcher)
  TwellCounters* counters = nullptr;   // required; zeroed by launch_twell_pack unless !reset_counters
  bool reset_counters = true;          // false: add to the counters (packing a matrix in row chunks)
  const std::uint32_t* enable = nullptr;  // optional device flag: when *enable == 0 the kernel does nothing
};
void launch_twell_pack(const TwellPackParams& p, cudaStream_t stream);

// Dispatch support: counts kept values (v > 0) in rows 0, stride, 2·stride, … of src [M, N] and
// sets *decision = 1 iff count ≤ max_density · sampled_rows · N (the sparse remainder pays), else 0.
// A sampled row with more than row_cap kept values (one the sparse path runs dense, see
// twell_dense_rows.hpp) counts row_cost instead, and adds 1 to *hot.
struct TwellSampleParams {
  const __nv_bfloat16* src = nullptr;
  std::int64_t ld_src = 0, m = 0, n = 0, stride = 1;
  double max_density = 0.0;
  unsigned long long* count = nullptr;  // [1], zeroed by the launcher
  std::uint32_t* decision = nullptr;    // [1]
  std::uint32_t row_cap = 0xffffffffu;  // default: no row is dense
  std::uint32_t row_cost = 0;
  unsigned long long* hot = nullptr;    // optional [1], zeroed by the launcher
  // optional [1], zeroed by the launcher: the sampled rows' true non-zeros (count weighs rows over
  // row_cap at row_cost instead)
  unsigned long long* nnz = nullptr;
};
void launch_twell_sample_decide(const TwellSampleParams& p, cudaStream_t stream);

// Overflow fallback, used by both consumers: a (row, tile) block whose count exceeds S − 1 is
// read in full from `backup` (the dense [M, N] pre-activation the TwELL was packed from, same
// keep rule), so overflowed rows are exact. Non-overflowed blocks never touch `backup`.
struct TwellUpDownParams : FfnOperands {
  const std::uint32_t* words = nullptr;   // TwELL [M, tiles · S] of g (gated) or h (non-gated)
  const __nv_bfloat16* backup = nullptr;  // [M, N] dense values for overflowed blocks, stride ld_backup
  std::int64_t ld_backup = 0;
  int words_per_tile = 32;
  bool relu = true;                       // keep rule for backup blocks
  int variant = 0;  // 0: 2 chunks/thread, 4 rows in flight; 1: 2 chunks, 8 rows; 2: 4 chunks, 2 rows;
                    // K ≤ 2048 only (else as 0): 3: as 0, compiled for 6 blocks/SM; 4: as 0, for 8
  // Optional row filter (the dense rows, which run elsewhere): row m is computed iff
  // (row_filter[m] != 0) == filter_keep_flagged; the other rows' y is left alone.
  const std::uint32_t* row_filter = nullptr;
  bool filter_keep_flagged = false;
};
// Gated: y[m,:] = Σ_n g[m,n] · ⟨x[m,:], Wu[n,:]⟩ · Wdᵀ[n,:]; non-gated: y[m,:] = Σ_n h[m,n] · Wdᵀ[n,:].
// Accumulation in fp32, y rounded to bf16 once. h never leaves the chip.
void launch_twell_up_down(const TwellUpDownParams& p, cudaStream_t stream);

}  // namespace twell::cuda
