#pragma once
// The decode FFN's union on tensor cores (docs/runtime.md, "The union's third form"): after the
// gate's ReLU output g [m, n] (the cuBLASLt ReLU GEMM's), each neuron that some row fired has its Wu
// and Wdᵀ rows read once for the whole batch, where the decode kernel reads them once a row that
// fired them. Three kernels, each a CUDA-graph node with nothing read on the host:
//   list  a CTA a tile of 256 neurons: the tile's fired neurons (g > 0 in some row) in ascending
//         order at slots t · 256 + i, padded to a multiple of 16 with −1, the tile's count, and
//         (with nnz) its fired (row, neuron) pairs added into nnz;
//   up    a thread-block cluster of up_split CTAs a block of 64 listed slots (4 groups of 16 in tile
//         order), rank r the r-th share of K on tensor cores; the ranks' partial tiles added in
//         rank order through distributed shared memory: h[row, slot] = bf16(g[row, n] · ⟨x[row],
//         Wu[n]⟩) (0 in a padding slot). The grid holds a cluster for every block the list could
//         fill, or up_clusters clusters that take the blocks in turn (fewer CTAs to wait on a
//         programmatic launch's slots; the same sums, so the same bits);
//   down  a cluster of down_split CTAs 128 columns of y, rank r the union's groups r, r + split, …;
//         the ranks' partial tiles added in rank order, y rounded to bf16 once; (with nnz) one
//         thread moves the list's count to nnz_out, leaving nnz zero.
// h is rounded to bf16 as the dense FFN rounds it. The order of every sum is fixed by the union and
// the splits (never by timing), so replays give the same bits; a row's bits depend on which neurons
// the other rows fired (its 16-slot groups), as the dense path's depend on M. Within the float64
// bound of twell_probe_decode_rows: the up's sums over K of 2⁻²³ a step, h's bf16 rounding, the
// down's sums over the padded union's slots and ≤ 8 ranks, y's rounding.
// Programmatic launches (launch.hpp, inside a ProgrammaticLaunch scope): each kernel waits for the
// one before it before it reads what that one writes. Before its wait the up stages x (written
// before the gate), and the down reads the counts and the list and stages its first groups' Wdᵀ
// rows: the list kernel wrote them two launches back, and the down starts only after every up CTA
// has passed its own wait, which returns once the list kernel has finished; they are read past L1.
// That holds because each up CTA lets the next kernel launch (griddepcontrol.launch_dependents,
// dev::pdl_begin) only after its own wait, before any early exit: a trigger moved earlier in the up
// kernel would break it.
// Needs a device of compute capability 9.0 running this build's sm_90a code (union_ffn_available).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ffn_operands.hpp"

namespace twell::cuda {

inline constexpr std::int64_t kUnionMaxRows = 64;
inline constexpr std::int64_t kUnionMaxN = 8192;
inline constexpr std::int64_t kUnionTileNeurons = 256;

struct UnionFfnParams : FfnOperands {  // gated only: x, w_up, w_down_t, y (rows ld_x, ld_y apart)
  const __nv_bfloat16* g = nullptr;  // [m, n] the gate after ReLU, rows ld_g apart
  std::int64_t ld_g = 0;
  int* list = nullptr;               // [union_list_size(n)] a slot's neuron (−1: padding)
  int* counts = nullptr;             // [tiles] the tile's listed neurons
  __nv_bfloat16* h = nullptr;        // [m, union_list_size(n)], rows ld_h = union_list_size(n) apart
  unsigned long long* nnz = nullptr;       // optional: [1], zero on entry (left zero): the pairs' count
  unsigned long long* nnz_out = nullptr;   // with nnz: receives the fired (row, neuron) pairs
  int up_split = 8;                  // CTAs an up cluster (1, 2, 4, 8)
  int down_split = 8;                // CTAs a down cluster (1, 2, 4, 8)
  int up_clusters = 0;               // > 0: at most this many up clusters (0: one a 64-slot block of the whole list)
};

// Slots of the list and of an h row: n rounded up to whole tiles.
constexpr std::int64_t union_list_size(std::int64_t n) noexcept {
  return (n + kUnionTileNeurons - 1) / kUnionTileNeurons * kUnionTileNeurons;
}
constexpr std::int64_t union_tiles(std::int64_t n) noexcept { return union_list_size(n) / kUnionTileNeurons; }

// Whether the kernels take this shape: gated, 1 ≤ m ≤ 64, 4 ≤ n ≤ 8192 with n % 4 == 0, k ≥ 128
// with k % 128 == 0 (and, at launch, ld_g % 4 == 0, ld_x and ld_y multiples of 8).
constexpr bool union_ffn_fits(std::int64_t m, std::int64_t n, std::int64_t k, bool gated) noexcept {
  return gated && m >= 1 && m <= kUnionMaxRows && n >= 4 && n <= kUnionMaxN && n % 4 == 0 && k >= 128 && k % 128 == 0;
}

// The kernel shapes launch_union_ffn takes: 1, 2, 4 or 8 CTAs an up and a down cluster, up_clusters ≥ 0.
constexpr bool union_shape_ok(int up_split, int down_split, int up_clusters) noexcept {
  const auto split_ok = [](int v) { return v == 1 || v == 2 || v == 4 || v == 8; };
  return split_ok(up_split) && split_ok(down_split) && up_clusters >= 0;
}

// True iff this build carries the sm_90a kernels and `device` runs them (compute capability 9.0).
bool union_ffn_available(int device);

// parts: bit 0 the list and up kernels, bit 1 the down kernel (one alone: a probe's timing split);
// with kUnionSkipList the list kernel is left out, the list and counts holding this g's already (a
// probe's measure of what the list kernel adds to the chain). nnz needs parts 3 without
// kUnionSkipList: the list kernel counts, the down kernel publishes.
// Throws twell::Error (unsupported) on a shape union_ffn_fits refuses or a bad split.
inline constexpr int kUnionSkipList = 4;
void launch_union_ffn(const UnionFfnParams& p, cudaStream_t stream, int parts = 3);

}  // namespace twell::cuda
