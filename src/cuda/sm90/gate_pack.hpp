#pragma once
// Hopper (sm_90a) gate GEMM with the TwELL packing in its epilogue (DESIGN §3, inference step 1):
// g = ReLU(x·Wᵀ) in bf16 with fp32 accumulation, packed to TwELL straight from the accumulators,
// so the [M, N] gate never makes the round trip through device memory that cuBLASLt + twell_pack
// costs. Only the values of overflowed (row, tile) blocks are written to the dense gate buffer,
// where the fused up+down kernel's overflow fallback reads them (store_gate writes every value).
//
// Kernel: persistent grid (one CTA per SM, from the device's SM count), 384 threads. Warp 0
// lane 0 issues TMA loads of x [128, 64] and W [256, 64] tiles (128-byte swizzle) into a 3-stage
// mbarrier ring; two consumer warpgroups run wgmma m64n256k16 (64 rows each). A CTA tile is
// 128 rows × 256 columns = exactly one TwELL tile per row. Clusters of `cluster` CTAs along M
// split each W tile's load and multicast it (less L2 traffic per FLOP). Tiles are dealt n-fastest
// so that the CTAs in flight share W (which stays in L2) and a few row blocks of x.
// Epilogue: the consumers write ReLU + bf16 values into a swizzled 64 KB staging tile, with a
// mask per row of its non-zero 16-byte words, and go on to the next tile's wgmmas; warps 1..3 of
// the load warpgroup pack the staged tile, one lane per row (the keep rule on the mask's words
// only; rows with many words by the whole warp, one word per lane), each block leaving from a
// shared-memory row stage by one bulk copy (cp.async.bulk): the same words, counts and flags as
// twell_pack on the same values.
//
// launch_gated_product_sm90 runs the same kernel with another epilogue, for the hot neurons' dense
// part of the sparse path: W holds blocks of 128 gate rows followed by the 128 up rows of the same
// neurons, so a CTA tile's accumulators hold g and u of 128 neurons side by side; the consumers
// stage h = ReLU(g) ⊙ u (g and u rounded to bf16 first, as ops::gated_product on a GEMM's bf16
// output) and warps 1..3 store the staged rows into h. No TwELL, no counters.
//
// Supports: any M ≥ 1, any N ≥ 1 (TMA zero-fills the tails; columns ≥ N are never kept), any
// K ≥ 8 with K % 8 == 0 (16-byte row strides for TMA), S = words per tile in [2, 128]. Needs a
// GPU of compute capability 9.0 exactly (sm_90a code) and kGatePackSmemBytes of shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/sm80/twell_kernels.hpp"

namespace twell::cuda {

struct GatePackParams {
  const __nv_bfloat16* x = nullptr;  // [m, k], row stride k
  const __nv_bfloat16* w = nullptr;  // [n, k], row stride k (Wg, or Wu for the non-gated FFN)
  std::int64_t m = 0, n = 0, k = 0;
  int words_per_tile = 32;              // S
  std::uint32_t* words = nullptr;       // [m, tiles · S] TwELL of ReLU(x·Wᵀ)
  std::uint32_t* row_overflow = nullptr;  // [m], zeroed by the launcher: 1 iff the row has an overflowed block
  std::uint32_t* row_nnz = nullptr;     // optional [m], zeroed by the launcher: each row's true count
  TwellCounters* counters = nullptr;    // zeroed by the launcher
  __nv_bfloat16* gate = nullptr;        // [m, ld_gate] (ld_gate ≥ round_up(n, 8), % 8 == 0): overflowed blocks
  std::int64_t ld_gate = 0;
  bool store_gate = false;              // also store every other block (tests, diagnostics)
  int sm_count = 0;                     // persistent grid size (the device's SM count)
  int cluster = 2;                      // CTAs per cluster along M sharing each W tile by TMA multicast: 1, 2 or 4
  // The consumers stage the tile with 16 stmatrix.x4 per thread instead of 64 32-bit shared
  // stores (the same bytes at the same places; the staging is ≈ 5 % of the kernel, section
  // "Thirteenth session" of lab/notes/2026-11-cuda-perf-log.md): 1.067x vs 1.104x the GEMM on the H100
  // (section "Fourteenth session").
  bool stage_stmatrix = true;
  // Rows with many non-zero 16-byte words in a tile (hot tokens, high density) are packed by the
  // whole packing warp, one word per lane, instead of by their own lane, which would hold up the
  // warp's other 31 rows; false: every row by its lane (the same words either way).
  bool heavy_rows = true;
  // The consumers also write, per tile row, which 16-byte words hold a non-zero (2 KB per tile),
  // so the packers read one 16-byte mask per row instead of scanning the row's 512 bytes of the
  // staged tile (64 KB per tile of shared-memory reads beside the mainloop's); false: the scan.
  bool word_masks = true;
  // Diagnostics only (lab/probes/probe_gate_sm90.cpp through launch_twell_gate_pack_sm90_lab; the
  // production launcher refuses them and its kernels have no such code), outputs left undefined
  // unless 0: 1 = no epilogue at all; 2 = the tile is staged but not packed; 3 = packed without
  // any global store.
  int timing_mode = 0;
  // Diagnostics only (as timing_mode): when set, [grid][kGatePackProfileSlots] clock64 sums per
  // CTA, added to: packing warp w's (w = 1, 2, 3) cycles from `staged` to `freed` (slots w − 1),
  // packing warp 1's cycles waiting for `staged` (3), consumer warp 4's cycles waiting for `freed`
  // (4), the CTA's tiles (5) and its cycles from start to end (6).
  unsigned long long* profile = nullptr;
};
inline constexpr int kGatePackProfileSlots = 8;

// Alignment slack, 3 stages of A + B, the staging tile, the packers' row stages, the mbarriers and
// the per-row word masks.
inline constexpr std::size_t kGatePackSmemBytes =
    1024 + 3 * (128 + 256) * 64 * 2 + 128 * 256 * 2 + 3 * 1152 * 4 + 64 + 128 * 16;

// True iff this build carries the sm_90a kernel and `device` can run it (compute capability 9.0
// and enough opt-in shared memory).
bool gate_pack_sm90_available(int device);

void launch_twell_gate_pack_sm90(const GatePackParams& p, cudaStream_t stream);
// The lab's build of the same kernel, with timing_mode and profile compiled in (probe_gate_sm90).
void launch_twell_gate_pack_sm90_lab(const GatePackParams& p, cudaStream_t stream);

// Rows of W for the gated product over `hot` neurons: 256 per block of 128 neurons.
constexpr std::int64_t gated_product_rows(std::int64_t hot) { return (hot + 127) / 128 * 256; }

// W for the gated product, [gated_product_rows(hot), k] in dst: block b = the gate rows
// wg[128b .. 128b + 127] then the up rows wu[128b .. 128b + 127] (row stride k), zero rows past
// hot. Enqueued on `stream` (device-to-device copies).
void pack_gated_product_weights(const __nv_bfloat16* wg, const __nv_bfloat16* wu, std::int64_t hot, std::int64_t k,
                                __nv_bfloat16* dst, cudaStream_t stream);

struct GatedProductParams {
  const __nv_bfloat16* x = nullptr;  // [m, k], row stride k
  const __nv_bfloat16* w = nullptr;  // [n, k] as pack_gated_product_weights lays it out
  std::int64_t m = 0, n = 0, k = 0;  // n = gated_product_rows(h_cols)
  // h[r, j] = ReLU(g[r, j]) · u[r, j] for j < h_cols (≤ n / 2), written in 8-column chunks up to
  // round_up(h_cols, 8) (W's rows there should be zero); other columns of h are left alone.
  __nv_bfloat16* h = nullptr;  // [m, ld_h], ld_h ≥ round_up(h_cols, 8), % 8 == 0, 16-byte aligned
  std::int64_t ld_h = 0;
  std::int64_t h_cols = 0;
  int sm_count = 0;  // persistent grid size
  int cluster = 2;   // as GatePackParams::cluster
};

// The hot neurons' [g | u] GEMM with h = ReLU(g) ⊙ u in its epilogue (needs gate_pack_sm90_available).
void launch_gated_product_sm90(const GatedProductParams& p, cudaStream_t stream);

}  // namespace twell::cuda
