#pragma once
// The model runtime's non-FFN ops on the GPU (the FFN is the engine's, cuda/ffn_context.hpp).
// Activations: the residual stream x is fp32 [T, K]; GEMM operands are bf16; accumulation fp32.
// Each launcher validates its sizes, launches on `stream` and checks the launch. Their CPU
// references are the CPU runtime's loops (src/model/runtime.cpp), and tests/cuda/test_model_cuda.cpp
// compares the whole forward against it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace twell::cuda::ops {

// Rows of a KV block (model::kKvBlockTokens: the runtime checks they agree).
inline constexpr int kKvBlockRows = 16;

// Where one token row's keys and values go / come from. A cache is keys and values
// [layers, blocks, kKvBlockRows, kv_dim] bf16 each: layer l at + l·layer_stride elements, position p
// of the row's sequence in cache row slot(p) of its layer. A paged sequence's positions go through
// its block table (device memory, one entry per kKvBlockRows positions: table[p / 16]·16 + p % 16);
// a cache whose blocks lie in order (a sequence of fixed capacity) has no table, and slot(p) = p.
struct RowKv {
  __nv_bfloat16* k = nullptr;
  __nv_bfloat16* v = nullptr;
  std::int64_t layer_stride = 0;
  const std::int32_t* table = nullptr;  // null: blocks in order
  std::int32_t pos = 0;
  std::int32_t pad = 0;
  __host__ __device__ std::int64_t slot(std::int32_t p) const {
    const auto u = static_cast<std::uint32_t>(p);  // p ≥ 0
    return table ? static_cast<std::int64_t>(table[u / kKvBlockRows]) * kKvBlockRows + u % kKvBlockRows
                 : static_cast<std::int64_t>(p);
  }
  // One KV head's keys (values) in one layer, the head's columns starting at col (kvh · head_dim):
  // position p's row starts at head_k(layer, col) + slot(p) · kv_dim.
  __host__ __device__ const __nv_bfloat16* head_k(std::int64_t layer, std::int64_t col) const {
    return k + layer * layer_stride + col;
  }
  __host__ __device__ const __nv_bfloat16* head_v(std::int64_t layer, std::int64_t col) const {
    return v + layer * layer_stride + col;
  }
};

// x[r, :] = table[ids[r], :]  (bf16 → fp32)
void embedding(const std::int32_t* ids, std::int64_t rows, const __nv_bfloat16* table, std::int64_t k, float* x,
               cudaStream_t stream);

// y[i, :] = bf16( x[src_i, :] / sqrt(mean(x[src_i, :]²) + eps) ⊙ w ),  src_i = row_index ? row_index[i] : i
// The norms (rmsnorm, add_rmsnorm, rmsnorm_project) read rows of k % 4 == 0 up to 4096 four elements a
// load: there x and w must be 16-byte aligned and the bf16 deltas and y 8-byte aligned (else an
// invalid_argument error); other k, any alignment.
void rmsnorm(const float* x, const std::int32_t* row_index, std::int64_t rows, std::int64_t k, const float* w,
             float eps, __nv_bfloat16* y, cudaStream_t stream);

// residual_add then rmsnorm in one kernel: x[i, :] += first[i, :] (when given), then += delta[i, :]
// (fp32 += bf16, in that order), then y[i, :] = rmsnorm(x[i, :]) ⊙ w as above; bit-identical to the
// ops one after the other.
void add_rmsnorm(float* x, const __nv_bfloat16* delta, std::int64_t rows, std::int64_t k, const float* w, float eps,
                 __nv_bfloat16* y, cudaStream_t stream, const __nv_bfloat16* first = nullptr);

// One row, RMSNorm and a projection in one kernel (a decode step's attention input):
// y[j] = bf16(Σ_c xn[c] · W[j, c]) for j < n, with xn = bf16(rmsnorm(x + delta) ⊙ w) as add_rmsnorm
// computes it (delta may be null: x alone), fp32 accumulation. x is only read: the residual add
// stays for a later add_rmsnorm (its `first`). Bit-identical to add_rmsnorm on a copy of x, then
// the decode GEMV (cuda/ops/gemv.hpp, relu off). K a multiple of 8, ≤ kGemvMaxK; W [n, k]
// with 16-byte aligned rows.
// With `rope` (n = the QKV width, y = the row's qkv) the projection is followed by rope_store_kv's
// work on it, bit for bit: q rotated in place, k rotated into the row's cache (and into qkv with
// k_in_place), v into the cache — one kernel for a decode step's norm, QKV, RoPE and cache store.
// rmsnorm_project reads rows_kv[0], its block table and cos / sin before its programmatic wait:
// they must be written before the step's first kernel (a decode step's inputs, copied in by the
// host; tables built at load), never by a kernel of the chain.
struct RopeStore {
  const RowKv* rows_kv = nullptr;  // the row's cache (one row)
  std::int64_t layer = 0;
  int heads = 0, kv_heads = 0, d = 0;
  const float* cos = nullptr;  // [max_pos, d/2] fp32, as rope_store_kv's tables
  const float* sin = nullptr;
  bool k_in_place = false;
};
void rmsnorm_project(const float* x, const __nv_bfloat16* delta, std::int64_t k, const float* w, float eps,
                     const __nv_bfloat16* wproj, std::int64_t n, __nv_bfloat16* y, cudaStream_t stream,
                     const RopeStore* rope = nullptr);
// The same with delta the one-token FFN's fixed-point output (int64 [k], 16-byte aligned; added as
// bf16(delta · 2⁻³²), cuda/common/fixed_point.hpp): the bits of the bf16 form given that value.
void rmsnorm_project(const float* x, const std::int64_t* delta_fixed, std::int64_t k, const float* w, float eps,
                     const __nv_bfloat16* wproj, std::int64_t n, __nv_bfloat16* y, cudaStream_t stream,
                     const RopeStore* rope = nullptr);

// One row, the norm before a gated FFN and its up product in one kernel (a one-token dense FFN
// without the norm's own launch): xn = bf16(rmsnorm((x + first) + delta) ⊙ w) as add_rmsnorm
// computes it (first may be null), then gu = [g | u] = bf16(xn · w_guᵀ) (w_gu = [Wg; Wu], [2 ·
// up_row, k]) and h[i] = bf16(act(g_i) · u_i) for i < h_n: bit-identical to add_rmsnorm on a copy of
// x, then launch_twell_gemv's gated epilogue (gemv_gated_row). x is only read: the residual add is
// left to the caller (FfnContext::dense_token_folded: the down GEMV stores it).
struct GatedUp {
  __nv_bfloat16* h = nullptr;  // [h_n]
  std::int64_t up_row = 0;     // Wu's row i at up_row + i of w_gu
  std::int64_t h_n = 0;        // 1 ≤ h_n ≤ up_row
  int act = 0;                 // dev::activate's: 0 ReLU (model::Activation's order)
};
void rmsnorm_gated_up(const float* x, const __nv_bfloat16* first, const __nv_bfloat16* delta, std::int64_t k,
                      const float* w, float eps, const __nv_bfloat16* w_gu, const GatedUp& gated, __nv_bfloat16* gu,
                      cudaStream_t stream);

// qkv [T, Q + 2·KV] bf16 (q | k | v per row): RoPE (rotate_half; cos/sin from the table
// [max_pos, d/2] fp32 at the row's position) on q in place and on k, which goes with v into the
// row's cache for `layer` (and, with k_in_place, back into qkv too: for an attention that reads
// the call's keys from qkv). Where rope_store_kv_wide (d a multiple of 16, qkv and the tables
// 16-byte aligned) it moves 16 bytes a thread, and then each RowKv's k and v must be 16-byte aligned
// and its layer_stride a multiple of 8 elements, as attention() needs (cudaMalloc'd caches are; a
// misaligned one is a CUDA error, not a wrong result); else 2 bytes a thread. The same bits either way.
// rope_store_kv reads rows_kv, its block tables and cos / sin before its programmatic wait: they
// must be written before the step's first kernel, never by a kernel of the chain (as RopeStore's).
bool rope_store_kv_wide(const __nv_bfloat16* qkv, std::int64_t d, const float* cos_table, const float* sin_table);
void rope_store_kv(__nv_bfloat16* qkv, std::int64_t rows, std::int64_t heads, std::int64_t kv_heads, std::int64_t d,
                   const float* cos_table, const float* sin_table, const RowKv* rows_kv, std::int64_t layer,
                   cudaStream_t stream, bool k_in_place = false);

// Causal attention of each row's query heads (in qkv) over its sequence's cached keys 0…pos
// (pos − window + 1 … pos with a sliding window, window > 0):
// out[r, h·d:(h+1)·d] = softmax(q·Kᵀ / sqrt(d)) · V, query head h reading KV head h / (heads / kv_heads).
// max_keys: the most keys a row of the call sees (sizes the scores' shared memory). Each RowKv's k and v
// must be 16-byte aligned (cudaMalloc'd caches are; with d a multiple of 8 so are all their rows).
// The most keys attention() takes at head_dim d on the current device (its scores sit in shared memory).
std::int64_t attention_max_keys(std::int64_t d);
// old_keys_ready: every row is its sequence's only new token in this call (a decode step), so the
// keys before each row's position were written by earlier calls and head_dim 64 / 128 load the first
// of them before waiting for the previous kernel (programmatic launches). Same bits either way.
// grouped_min_rows: calls of that many rows or more (0: none) run one CTA a (row, KV head) on
// tensor cores rather than a (row, query head). Other bits than the per-head kernel's (which every
// call of fewer rows runs): a row's bits then depend on whether its call has that many rows, never
// on which other rows it has. attention_runs_grouped: whether attention() takes that kernel for this
// call's shape (rows ≥ grouped_min_rows ≥ 1, groups of 1, 2, 4 or 8 query heads, head_dim 64 or
// 128). Its shared memory holds key tiles, not scores, but attention() still
// takes max_keys only up to attention_max_keys (the per-head kernel's bound, which calls of fewer
// rows need). There qkv must be 4-byte aligned.
// kAttentionGroupedMinRows: since 0232832's tile loads the tensor-core form is faster than the
// per-head kernel from 8 rows at every shape measured (2B MHA, 2b-gqa, 7B-GQA at 145, 513 and 2049
// keys: at 8 rows 34.2 against 40.7 µs on the MHA 2B at 2049 keys, 25.7 against 32.0 on the
// 2b-gqa; lab/probes/probe_decode_attention.cu at b9bc052, H200), and in the step at 8 and 12 rows
// on both 2B models (2b-gqa +9.5 % / +27 % sparse tokens/s at 8 / 12 rows, MHA +14 % at 12 and
// within the spread at 8: bench/results/model/2026-12-03-h200-*-grouped-min-rows-8-*/). At one
// row it loses at 513 keys and more; 2–7 rows are not measured since 0232832 (before it, 4 rows
// lost 5–10 %).
// TWELL_TUNING=grouped-attention-min-rows=N moves it, no-grouped-attention sets it to 0.
inline constexpr std::int64_t kAttentionGroupedMinRows = 8;
void attention(const __nv_bfloat16* qkv, std::int64_t rows, std::int64_t heads, std::int64_t kv_heads,
               std::int64_t d, const RowKv* rows_kv, std::int64_t layer, std::int64_t max_keys, __nv_bfloat16* out,
               cudaStream_t stream, bool old_keys_ready = false, std::int64_t window = 0,
               std::int64_t grouped_min_rows = kAttentionGroupedMinRows);
bool attention_runs_grouped(std::int64_t rows, std::int64_t heads, std::int64_t kv_heads, std::int64_t d,
                            std::int64_t max_keys, std::int64_t grouped_min_rows = kAttentionGroupedMinRows);

// Prefill attention on tensor cores: the same function as attention() for the rows of `blocks`.
// A block is up to 64 consecutive rows of one sequence (consecutive positions). head_dim 64 or 128.
struct FlashBlock {
  std::int64_t row0 = 0;  // first row (index into qkv, rows_kv, out)
  std::int32_t rows = 0;  // 1 … 64
  std::int32_t pad = 0;
};
// Whether flash_attention runs head_dim d on the current device (its shared memory suffices).
bool flash_attention_supported(std::int64_t d) noexcept;
void flash_attention(const __nv_bfloat16* qkv, std::int64_t nblocks, std::int64_t heads, std::int64_t kv_heads,
                     std::int64_t d, const FlashBlock* blocks, const RowKv* rows_kv, std::int64_t layer,
                     __nv_bfloat16* out, cudaStream_t stream);

// out[r] = the index of row r's largest value (the lowest index among equal ones); logits [rows, v].
// A row holding a NaN or an infinity gives −1 (the caller reports it).
void argmax(const float* logits, std::int64_t rows, std::int64_t v, std::int32_t* out, cudaStream_t stream);

// Top-k sampling's selection where the logits are: row r's k best tokens by z — its logits with
// the repetition penalty applied to the tokens in hist[hist_off[r], hist_off[r + 1]) (z = l / p
// where l > 0, else l · p, fp32; −0 becomes 0), the lower id first among equal z — into z_out and
// id_out [rows, k], in no particular order within a row: twell::model::top_candidates' set.
// bad[r] = the lowest index of a non-finite logit in row r, else −1 (the row's candidates are then
// meaningless: the caller reports it). hist null: no penalty. 1 ≤ k ≤ v ≤ kTopMaxVocab (its bitmap
// of the history lives in shared memory).
inline constexpr std::int64_t kTopMaxVocab = std::int64_t{1} << 18;
void top_candidates(const float* logits, std::int64_t rows, std::int64_t v, std::int64_t k, float penalty,
                    const std::int32_t* hist, const std::int64_t* hist_off, float* z_out, std::int32_t* id_out,
                    std::int32_t* bad, cudaStream_t stream);

// A sampled decode step's draw on the device: out[r] = the token twell::model::sample_fixed_point
// picks from row r of logits [rows, v] with the history hist[hist_off[r], hist_off[r + 1]) (null:
// none) and the sequence's draw r[r] ∈ [0, 1) (the caller checks it; the kernel clamps); bad[r] =
// the lowest index of a logit that is non-finite or becomes so with the penalty (out[r] then −1),
// v if no token was found (a fault), else −1. temperature > 0 (greedy is argmax); v ≤ kTopMaxVocab.
struct SampleRowsOptions {
  double temperature = 1.0;
  std::int64_t top_k = 0;  // 0: no cut
  double top_p = 1.0;
  double repetition_penalty = 1.0;
};
void sample_rows(const float* logits, std::int64_t rows, std::int64_t v, const SampleRowsOptions& o,
                 const std::int32_t* hist, const std::int64_t* hist_off, const double* r, std::int32_t* out,
                 std::int32_t* bad, cudaStream_t stream);

// x += y  (fp32 += bf16), n elements
void residual_add(float* x, const __nv_bfloat16* y, std::int64_t n, cudaStream_t stream);
// x[i] += bf16(y_fixed[i] · 2⁻³²), then y_fixed[i] = 0 (the one-token FFN's fixed-point output,
// cuda/common/fixed_point.hpp, added as residual_add adds its bf16 value; the buffer left ready
// for the next sum).
void residual_add_fixed(float* x, std::int64_t* y_fixed, std::int64_t n, cudaStream_t stream);

// h[r, j] = bf16(act(g[r, j]) · u[r, j]) for m rows and n columns (row strides ld_gu for g and u,
// ld_h for h; h may be g itself with ld_h = ld_gu); act in twell::model::Activation's order: 0
// ReLU, 1 SiLU, 2 GELU (erf), 3 GELU (tanh) (dev::activate). Where ld_gu and ld_h are both
// multiples of 8, g, u and h must be 16-byte aligned (8 columns a thread; refused otherwise). A
// gated FFN's middle step: the engine's dense and hot-neuron FFNs (ReLU) and the runtime's own
// FFN for other activations.
void gated_product(const __nv_bfloat16* g, const __nv_bfloat16* u, std::int64_t ld_gu, __nv_bfloat16* h,
                   std::int64_t ld_h, std::int64_t m, std::int64_t n, int act, cudaStream_t stream);

}  // namespace twell::cuda::ops
