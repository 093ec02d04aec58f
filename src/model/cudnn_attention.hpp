#pragma once
// Prefill attention through cuDNN's fused SDPA (flash attention; cudnn-frontend's graph API), for
// calls whose every sequence starts at position 0: the keys are then the call's own rows, so cuDNN
// reads q, k and v straight from the runtime's packed qkv rows (ragged offsets per sequence, a
// padding mask for the lengths, causal top-left; sequences of one bucket length — 64, 128, 256, …
// — packed from row 0, a batch of equal prompts, as plain [b, h, s, d] strides without offsets or
// mask). Built only with cuDNN and cudnn-frontend
// (TWELL_HAVE_CUDNN); the runtime's own tensor-core kernel serves every other prefill.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace twell::model {

class CudnnAttention {
 public:
  // Null, with the reason in *why, where cuDNN cannot serve these heads (no cuDNN in this build,
  // no handle on this device, head_dim over 128 or not a multiple of 8).
  static std::unique_ptr<CudnnAttention> create(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                                                std::string* why);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // out[r, h·d:(h+1)·d] = softmax(q·Kᵀ / sqrt(d)) · V for every row r of the sequences, sequence b
  // being rows [row0[b], row0[b] + len[b]) of qkv ([rows, (heads + 2·kv_heads)·d]: q | k | v, q and
  // k with RoPE applied) and its row i attending to its rows 0…i; out [rows, heads·d]. False, with
  // nothing enqueued, if cuDNN refuses the shape (then the caller runs its own kernel).
  // Rows each sequence is padded to in the graph when the longest has `longest` (the padding mask
  // covers the rest): callers keep that many rows of qkv and out allocated past their last row.
  static std::int64_t padded_rows(std::int64_t longest);

  // Whether a fresh prefill of these sequences should run here: yes where its graph is built (or
  // was refused: run() then says so), or at the `build_at`-th call of its graph's shape, or at once
  // with build_now. A graph build costs 0.2–1.7 s on an H100 (cuDNN 9.14) against microseconds of
  // the runtime's own kernel for a short prompt: a one-off prompt of a new length keeps the own
  // kernel, a shape that comes back (a server, a benchmark) gets cuDNN. Counts the call.
  bool wanted(std::span<const std::int64_t> row0, std::span<const std::int64_t> len, int build_at, bool build_now);
  // Graphs built so far (refused shapes included).
  std::int64_t graphs() const;

  // The cuDNN library's version (cudnnGetVersion(), e.g. 91400).
  std::string version() const;
  // Why cuDNN refused the latest shape it refused (its frontend's message), or "".
  std::string refusal() const;

  bool run(const __nv_bfloat16* qkv, std::span<const std::int64_t> row0, std::span<const std::int64_t> len,
           __nv_bfloat16* out, cudaStream_t stream);

 private:
  struct Impl;
  explicit CudnnAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell::model
