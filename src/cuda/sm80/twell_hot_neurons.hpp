#pragma once
// Hot neurons: the hot/cold split of the FFN by neuron (column of the gate). The FFN is a sum over
// neurons, y = Σ_n h[:, n]·Wd[:, n]ᵀ, so it splits exactly into any two neuron sets. Through the
// fused TwELL kernel a neuron costs about one pair of 4 KB weight rows from L2 per token it is
// active in; as columns of cuBLASLt GEMMs it costs a fixed 6·M·K flops (4·M·K non-gated) whatever
// its count. Trained ReLU models (and the generator, DESIGN §7) have skewed neuron popularity, so
// the few neurons active in more than ~1 % of tokens carry a large share of the non-zeros; those
// run dense and the rest through the sparse path.
//
// The context keeps its weights permuted so that the cold neurons come first (positions [0, Nc))
// and the hot ones last ([Nc, N)); Nc is a multiple of 8 so that both halves of Wd stay 16-byte
// aligned for cuBLASLt. The permutation changes only the order of a sum, never a value.
// These kernels count a gate's non-zeros per neuron (the calibration) and gather weight rows and
// columns into permuted order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace twell::cuda {

// counts[c] += #{r < m : g[r, c] > 0 and r sparse} for c < n, where row r is sparse unless
// row_nnz is given and row_nnz[r] > row_cap (a row the sparse path runs dense: its non-zeros cost
// nothing per neuron). g is [m, n] with row stride ld_g; counts is [n], accumulated into (the
// caller zeroes it).
void launch_neuron_counts(const __nv_bfloat16* g, std::int64_t ld_g, std::int64_t m, std::int64_t n,
                          const std::uint32_t* row_nnz, std::uint32_t row_cap, std::uint32_t* counts,
                          cudaStream_t stream);

// The same counts on the host: a zeroed [n] device buffer, launch_neuron_counts, the copy back
// (synchronises `stream`).
std::vector<std::uint32_t> read_neuron_counts(const __nv_bfloat16* g, std::int64_t ld_g, std::int64_t m, std::int64_t n,
                                              const std::uint32_t* row_nnz, std::uint32_t row_cap, cudaStream_t stream);

// The same counts over the rows that stay sparse once the columns c with cold[c] == 0 (cold: [n],
// host) run dense: a row with more than row_cap kept values among the cold columns (a row the
// sparse path runs dense; its non-zeros cost nothing per neuron) is left out. row_nnz: an [m]
// device workspace, left holding each row's cold count. rows_left_out (optional) receives the
// number of rows left out (one more copy back). Synchronises `stream`.
std::vector<std::uint32_t> read_neuron_counts_sparse_rows(const __nv_bfloat16* g, std::int64_t ld_g, std::int64_t m,
                                                          std::int64_t n, const std::vector<unsigned char>& cold,
                                                          std::uint32_t row_cap, std::uint32_t* row_nnz,
                                                          std::int64_t* rows_left_out, cudaStream_t stream);

// What neurons_over does when more than max_hot neurons qualify: choose none, or the max_hot
// densest of them (ties to the lower index).
enum class OverShare { none, densest };

// The hot-neuron rule of the inference and training contexts: the neurons (ascending) whose count
// exceeds density·m; none when density ≤ 0; when more than max_hot of them qualify, as `over` says.
std::vector<std::int64_t> neurons_over(const std::vector<std::uint32_t>& counts, double density, std::int64_t m,
                                       double max_hot, OverShare over = OverShare::none);

// The calibration rule of the inference and training contexts, from every row's counts:
//  1. a first guess, the neurons over density·m without the max-share rule (hot tokens can push
//     most neurons over the threshold, and the rule alone would then choose none);
//  2. when the guess is not empty and `recount` is given, recount(cold) counts again over the rows
//     that stay sparse once the guessed neurons run dense (cold: [n], 1 for a cold neuron) and
//     reports how many rows it left out: rows the sparse path runs dense cost nothing per neuron;
//  3. if at least min_rows_left_out (≥ 1) rows were left out, the choice is made from the new
//     counts, else from every row's; the choice is neurons_over with the max_hot rule and `over`.
struct HotNeuronChoice {
  std::vector<std::int64_t> hot;      // ascending
  std::vector<std::uint32_t> counts;  // the counts the choice was made from
  std::int64_t rows_left_out = 0;     // by the recount (0 when it did not run or was not used)
};
using SparseRowsRecount =
    std::function<std::vector<std::uint32_t>(const std::vector<unsigned char>& cold, std::int64_t* rows_left_out)>;
HotNeuronChoice choose_hot_neurons_calibrated(std::vector<std::uint32_t> counts, double density, std::int64_t m,
                                              double max_hot, std::int64_t min_rows_left_out,
                                              const SparseRowsRecount& recount, OverShare over = OverShare::none);

// row_nnz[r] = #{c < n : g[r, c] > 0 and (no mask or mask[c])} for r < m (one warp per row).
void launch_row_counts(const __nv_bfloat16* g, std::int64_t ld_g, std::int64_t m, std::int64_t n,
                       const unsigned char* mask, std::uint32_t* row_nnz, cudaStream_t stream);

// dst[i, 0:cols] = src[idx[i], 0:cols] for i < rows (row strides ld_src, ld_dst).
void launch_gather_rows(const __nv_bfloat16* src, std::int64_t ld_src, const int* idx, std::int64_t rows,
                        std::int64_t cols, __nv_bfloat16* dst, std::int64_t ld_dst, cudaStream_t stream);

// dst[r, j] = src[r, idx[j]] for r < rows, j < cols (row strides ld_src, ld_dst).
void launch_gather_cols(const __nv_bfloat16* src, std::int64_t ld_src, const int* idx, std::int64_t rows,
                        std::int64_t cols, __nv_bfloat16* dst, std::int64_t ld_dst, cudaStream_t stream);

}  // namespace twell::cuda
