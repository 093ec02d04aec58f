#pragma once
// The split sparse remainder (DESIGN §4b): the up kernel (twell_up_down with an h-list output)
// writes each token's h values as a compact list, and a weight-stationary down kernel computes
// y = h·Wdᵀ one 16-column slice of K per CTA, with Wdᵀ[:, slice] resident in shared memory, so
// that each non-zero costs a 32-byte shared-memory read instead of a 4 KB weight row from L2.
// Exact, but measured no faster than the fused kernel where the sparse path is dispatched
// (docs/perf-notes-cuda.md, "Fourth session"): ContextOptions::split_remainder is off by default.
//
// The h list ("sliced ELL"). Tokens sit in groups of 16; a group has a length L (entries, a
// multiple of 4, ≥ every member's count) and a base offset (words); entry j of the token at
// position q of group g is word base[g] + (j / 4)·64 + q·4 + j % 4, so a warp's 16-byte loads of
// one step cover 256 contiguous bytes. Entries past a token's count are padding words
// (h = 0 at a zero row, see split_pad_word).
// An entry is (h rounded to fp32 with 10 mantissa bits) | slot: bits 13..31 are h's top 19 bits,
// bits 0..12 the neuron's shared-memory slot (see below). h thus keeps 2⁻¹¹ relative precision,
// 4× finer than the bf16 h of the dense path; a bf16 h (non-gated) is kept exactly.
//
// Bank conflicts. Wdᵀ[n, slice] (32 bytes) is stored at slot (n mod Q)·4 + n / Q, Q = quarter
// tiles · 256 ≥ N / 4: the four quarters of [0, N) interleave, so rows of different quarters never
// share a 128-byte line's banks. A token at group position q lists its entries from quarter q mod 4
// onward (rotated, wrapping), and a quarter-warp serves positions 4i…4i+3, so its four tokens
// mostly read different quarters: conflict-free except near quarter boundaries. The rotation
// depends on the token index (position q ≡ token mod 4), not on the plan's grouping, so results
// are bit-for-bit reproducible.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm80/twell_kernels.hpp"

namespace twell::cuda {

inline constexpr int kHListGroup = 16;        // tokens per group (one warp of the down kernel)
inline constexpr int kHListSlotBits = 13;     // slot field of an entry
inline constexpr int kSplitMaxQuarterTiles = 7;  // Q·128 bytes of shared memory ≤ 224 KB: N ≤ 7168

// Tiles per quarter of [0, N) for the bank layout above (T = 256 columns per tile).
__host__ __device__ inline int split_quarter_tiles(std::int64_t n) {
  const std::int64_t tiles = (n + kTwellTile - 1) / kTwellTile;
  return static_cast<int>((tiles + 3) / 4);
}
// Whether the split remainder supports N (its Wdᵀ slice must fit one SM's shared memory).
inline bool split_supported(std::int64_t n) { return n >= 1 && split_quarter_tiles(n) <= kSplitMaxQuarterTiles; }
// Shared-memory slot of neuron n's Wdᵀ row, quarter = split_quarter_tiles(N) · 256 (see above).
__host__ __device__ inline int split_slot(int n, int quarter) { return (n % quarter) * 4 + n / quarter; }
// Word offset of entry o of a token from its column start (base[g] + 4·position).
__host__ __device__ inline std::int64_t split_entry_word(int o) {
  return static_cast<std::int64_t>(o >> 2) * (kHListGroup * 4) + (o & 3);
}
inline constexpr std::uint32_t kHListSlotMask = (1u << kHListSlotBits) - 1u;
#ifdef __CUDACC__
// An entry: h rounded to its top 19 bits (to nearest, on the magnitude), then the slot.
__device__ __forceinline__ std::uint32_t split_encode(float h, int slot) {
  return ((__float_as_uint(h) + (1u << (kHListSlotBits - 1))) & ~kHListSlotMask) | static_cast<std::uint32_t>(slot);
}
__device__ __forceinline__ float split_entry_h(std::uint32_t e) { return __uint_as_float(e & ~kHListSlotMask); }
#endif
// The padding word: h = 0 at the slot just past the Wdᵀ rows, a zero row in shared memory, so
// the down kernel reads every word without a branch and a pad adds exactly +0.
__host__ __device__ inline std::uint32_t split_pad_word(std::int64_t n) {
  return static_cast<std::uint32_t>(split_quarter_tiles(n)) * kTwellTile * 4;
}
// Dynamic shared memory of the down kernel: Q rows of 128 bytes, then the 32-byte zero row.
inline std::size_t split_smem_bytes(std::int64_t n) {
  return static_cast<std::size_t>(split_quarter_tiles(n)) * kTwellTile * 128 + 32;
}
// The plan works on chunks of kSplitChunk consecutive tokens (one CTA each); a chunk owns
// kSplitChunk / 16 groups (the last chunk's surplus groups are empty).
inline constexpr int kSplitChunk = 2048;
inline constexpr int kSplitChunkGroups = kSplitChunk / kHListGroup;
__host__ __device__ inline std::int64_t split_chunks(std::int64_t m) { return (m + kSplitChunk - 1) / kSplitChunk; }
__host__ __device__ inline std::int64_t split_groups(std::int64_t m) { return split_chunks(m) * kSplitChunkGroups; }

// Plan: per chunk of 2048 tokens, a block radix sort (stable) orders the tokens by (token mod 4,
// count); the i-th token of class c = token mod 4 goes to the chunk's group i / 4, position
// 4·(i mod 4) + c, so a group holds 16 tokens of similar count and position ≡ token (mod 4) (the
// rotation of twell_split's bank layout). A group's length is its longest member's count rounded
// up to 4; a block scan offsets the chunk's groups, and the last CTA to finish (ticket) offsets
// the chunks, decides *enable = 1 iff the list fits `capacity` words (else the up kernel runs as
// the fused kernel and the down kernel does nothing) and writes *words_needed = Σ 16·L.
// Deterministic: the sort is stable.
struct SplitPlanParams {
  const std::uint32_t* row_nnz = nullptr;  // [M] true counts (from the packing)
  std::int64_t m = 0;
  std::int64_t capacity = 0;               // words of the h-list buffer
  int* pos = nullptr;                      // [M]: token → 16·group + position
  int* tok = nullptr;                      // [16·groups]: position → token, −1 if empty
  std::int64_t* base = nullptr;            // [groups] word offsets
  int* len = nullptr;                      // [groups] entries per member (multiple of 4)
  long long* chunk_words = nullptr;        // [chunks] scratch
  unsigned int* ticket = nullptr;          // [1], zero between launches (the last CTA resets it)
  std::uint32_t* enable = nullptr;         // [1]
  unsigned long long* words_needed = nullptr;  // [1]
};
void launch_split_plan(const SplitPlanParams& p, cudaStream_t stream);

// y[tok, :] = Σ_entries h · Wdᵀ[n, :], weight-stationary: grid = slices × splits, one CTA per
// (16-column slice of K, 1/splits of the groups); fp32 accumulation, y rounded to bf16 once.
// Does nothing when *enable == 0.
// Of the operands it reads w_down_t and writes y (m, n, k as usual; x and w_up unused).
struct TwellDownSlicedParams : FfnOperands {
  const std::uint32_t* words = nullptr;  // the h list
  const int* tok = nullptr;
  const std::int64_t* base = nullptr;
  const int* len = nullptr;
  std::int64_t groups = 0;
  const std::uint32_t* enable = nullptr;
  int sm_count = 0;                         // sizes the splits (0: one split)
};
void launch_twell_down_sliced(const TwellDownSlicedParams& p, cudaStream_t stream);

}  // namespace twell::cuda
