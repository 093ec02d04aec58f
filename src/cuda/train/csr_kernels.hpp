#pragma once
// The sparse training state on the GPU: the active entries of a ReLU output in row-major CSR
// (built from the bf16 gate GEMM output) and its transposed index (per neuron: its entries,
// tokens ascending). CSR is exact for any distribution of non-zeros: no per-row capacity, no
// dense fallback, nothing dropped; its only limit is nnz < 2³¹ (checked, reported as an error).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device_buffer.hpp"

namespace twell::cuda {

struct CsrBuildParams {
  const __nv_bfloat16* src = nullptr;  // [m, n] activation, row stride ld_src; kept iff value > 0
  std::int64_t ld_src = 0, m = 0, n = 0;
  // Optional: the activation as TwELL instead ([m, ceil(n / 256) · words_per_tile] words, the
  // layout of twell_kernels.hpp, as the sm90 gate's epilogue writes it). A (row, tile) block's
  // entries are then read from its words, and only an overflowed block's (count > S − 1) from src,
  // which need hold nothing else. The count and the fill read 4 bytes per block word instead of 2
  // per column: at 0.5 % density a quarter of the bytes, and the same CSR (ascending columns).
  const std::uint32_t* words = nullptr;
  int words_per_tile = 0;  // S, in [2, 128] with 256 % S == 0
  // Optional column mask, one byte per 8 columns: bit e of skip8[c / 8] set = column c / 8 · 8 + e
  // is left out of the pattern (the hot neurons the training step runs dense). [ceil(n / 8)].
  const unsigned char* skip8 = nullptr;
  // Optional, with skip8 (count only): the left-out columns' values gathered in the same read, in
  // column order: hot_out[r · ld_hot + j] = src[r, c_j] for every row r (dense ones too), c_j the
  // j-th column whose skip bit is set, and 0 in columns [hot_count, round_up(hot_count, 8)). From
  // TwELL (words set): the kept values, 0 for the others (the same for a ReLU output).
  // hot_base8: [ceil(n / 8)], the number of left-out columns before column 8·i (of hot_count in
  // all). Each row's values are staged in shared memory and leave as 16-byte stores, so
  // hot_count ≤ kCsrMaxGatheredCols, ld_hot a multiple of 8 and hot_out 16-byte aligned
  // (csr_count_can_gather); otherwise the caller gathers them itself.
  const std::int32_t* hot_base8 = nullptr;
  __nv_bfloat16* hot_out = nullptr;
  std::int64_t ld_hot = 0, hot_count = 0;
  // Optional dense rows (dense_row_cap ≥ 0): the rows with more than dense_row_cap kept values
  // (after skip8) are listed, ascending, in dense_rows[0 .. *n_dense). When there are at least
  // dense_rows_min of them they are left out of the pattern (count 0, row_flags[r] = 1; every
  // other flag 0); with fewer, every flag is 0 and the pattern holds every row (the caller treats
  // *n_dense < dense_rows_min as none). The fill skips flagged rows.
  std::int64_t dense_row_cap = -1, dense_rows_min = 0;
  unsigned char* row_flags = nullptr;   // [m]
  std::int32_t* dense_rows = nullptr;   // [m]
  int* n_dense = nullptr;               // device scalar (an int, like the inference dense-row lists': m < 2³¹)
  std::int64_t* row_counts = nullptr;  // [m] scratch: kept values per row
  std::int64_t* offsets = nullptr;     // [m + 1]: row r's entries are offsets[r] .. offsets[r+1]
  std::int32_t* cols = nullptr;        // [nnz] columns, ascending within a row (fill only)
  __nv_bfloat16* vals = nullptr;       // [nnz] the kept values (fill only)
};

constexpr std::int64_t kCsrMaxGatheredCols = 2048;  // 8 warps · 4 KB of shared memory per block
inline bool csr_count_can_gather(std::int64_t hot_count, std::int64_t ld_hot, const void* hot_out) {
  return hot_count >= 1 && hot_count <= kCsrMaxGatheredCols && ld_hot % 8 == 0 &&
         (reinterpret_cast<std::uintptr_t>(hot_out) & 15) == 0;
}

// offsets[0] = 0, offsets[r + 1] = Σ_{i ≤ r} count(i). `scratch` is the CUB workspace (grown as needed).
// The total (offsets[m]) stays on the device; the caller reads it when it must size the fill.
void csr_count_and_scan(const CsrBuildParams& p, DeviceBuffer<unsigned char>& scratch, cudaStream_t stream);
// Writes cols/vals at the offsets computed by csr_count_and_scan (same src).
void launch_csr_fill(const CsrBuildParams& p, cudaStream_t stream);
// out[0] = *total (the CSR's offsets[m]), out[1] = *n_dense (0 when null), out[2], out[3] =
// overflow[0], overflow[1] (the TwELL gate's overflowed tiles and rows; −1 when null), by a
// one-thread kernel into host memory the device can write (out: its device address): the host reads
// them after the stream (or an event behind this) completes. A kernel, not cudaMemcpyAsync, so that no copy
// engine sits on the stream between the count and the fill (count_ring.hpp: 6–10 µs per copy).
void launch_csr_publish_totals(const std::int64_t* total, const int* n_dense, const unsigned long long* overflow,
                               std::int64_t* out, cudaStream_t stream);

// Transposed index of a CSR pattern with `nnz` entries over n columns:
//   entry_rows[e]  = the row of entry e;
//   order[i]       = entry indices sorted by column, stably (so rows ascend within a column);
//   col_offsets[c] = first position in `order` of column c; col_offsets[n] = nnz.
struct CscParams {
  const std::int64_t* offsets = nullptr;  // [m + 1]
  const std::int32_t* cols = nullptr;     // [nnz]
  std::int64_t m = 0, n = 0, nnz = 0;
  std::int32_t* entry_rows = nullptr;     // [nnz]
  std::int32_t* order = nullptr;          // [nnz]
  std::int64_t* col_offsets = nullptr;    // [n + 1]
  std::int32_t* tmp_keys = nullptr;       // [nnz] scratch (sorted columns)
  std::int32_t* tmp_vals = nullptr;       // [nnz] scratch (0, 1, …, nnz − 1)
};
void build_csc(const CscParams& p, DeviceBuffer<unsigned char>& scratch, cudaStream_t stream);

// Work items of the weight-gradient passes, so that a hot neuron's entries are shared among warps:
// neuron c's entries split into runs of at most `run` (an empty neuron still gets one item, which
// writes its zero rows). item_offsets[c] = first item of neuron c (item_offsets[n] = total),
// item_neuron[i] = the neuron of item i. Total ≤ n + nnz / run, the bound item_neuron is sized by.
struct WeightGradItemsParams {
  const std::int64_t* col_offsets = nullptr;  // [n + 1]
  std::int64_t n = 0, run = 0;
  std::int64_t* item_counts = nullptr;   // [n] scratch
  std::int64_t* item_offsets = nullptr;  // [n + 1]
  std::int32_t* item_neuron = nullptr;   // [n + nnz / run]
};
void build_weight_grad_items(const WeightGradItemsParams& p, DeviceBuffer<unsigned char>& scratch, cudaStream_t stream);

}  // namespace twell::cuda
