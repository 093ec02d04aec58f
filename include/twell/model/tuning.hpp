#pragma once
// The runtimes' A/B switches: each turns one optimization off (or moves one threshold) for
// measurement and checks. Not user choices (those are RuntimeOptions): a process takes them from
// the environment variable TWELL_TUNING, read once and logged once (RuntimeTuning::from_env), and
// tests that compare both sides in one process pass a RuntimeTuning of their own.
//
//   TWELL_TUNING=no-cuda-graphs,no-cudnn-attention,cudnn-build-at=1,decode-max-rows=8 twell bench model ...
//
// The items are listed in docs/runtime.md ("A/B switches: TWELL_TUNING").
#include <cstdint>
#include <string>
#include <string_view>

namespace twell::model {

struct RuntimeTuning {
  // CUDA runtime only: decode steps (one token per sequence; ReLU models under the automatic path:
  // up to 2047 sequences, where the FFN engine's dispatch needs no statistics) replay a captured
  // CUDA graph of the whole forward instead of launching ~10 kernels per layer.
  // Bit-identical to the launches; off for A/B measurement.
  bool cuda_graphs = true;  // no-cuda-graphs
  // CUDA runtime only: prefill calls whose every sequence starts empty run their attention through
  // cuDNN's fused SDPA where this build has cuDNN (see Runtime::prefill_attention()); off: the
  // runtime's own tensor-core kernel always (for A/B measurement and checks).
  bool cudnn_attention = true;  // no-cudnn-attention
  // CUDA runtime only: cuDNN builds a graph per prefill shape (sequence count, longest length's
  // bucket), 0.2–1.7 s each on an H100. A shape's prefills run the runtime's own kernel until its
  // `cudnn_build_at`-th call, which builds the graph (1: at the first; a call whose attention would
  // keep the own kernel busy ≈ 0.5 s or more builds at once). Default 2: a one-off prompt answers in
  // milliseconds, a shape that recurs (a server, a benchmark's repetitions) gets cuDNN.
  int cudnn_build_at = 2;  // cudnn-build-at=N
  // CUDA runtime only: the runtime's own kernels (norms, RoPE, attention, the one-token
  // projections, embedding, argmax) as programmatic dependent launches on Hopper — each may be
  // scheduled while the one before it still runs and waits for it on the device — to hide launch
  // latency between the ≈ 10 small kernels a layer of a decode step runs. Same results, bit for
  // bit; 2B decode at batch 1 +6.6 % on an H100 (docs/runtime.md). Off: for A/B measurement.
  bool programmatic_launch = true;  // no-pdl
  // CUDA runtime only: the SM's L1 / shared-memory split that the runtime's own kernels ask for
  // (cuda::LaunchCarveout), as a percentage of the most shared memory an SM takes (0–100; < 0, the
  // default: none asked, the driver's choice per kernel). An SM changes its split only once its
  // running CTAs have left, so a kernel that needs more shared memory than its predecessor's split
  // loses the programmatic overlap at that link; one split for the whole step avoids it. A
  // schedule: the same bits. For A/B measurement (docs/runtime.md).
  int smem_carveout = -1;  // smem-carveout=N
  // CUDA runtime only: at one row (a batch-1 decode step) the attention's add + RMSNorm, QKV
  // projection, RoPE and KV-cache store run as one kernel (cuda::ops::rmsnorm_project) and the FFN's
  // residual add joins the next add + RMSNorm: 2 kernels fewer a layer, the same bits; 2B decode at
  // batch 1 +3.4-3.8 % on an H100 (docs/runtime.md). Off: for A/B measurement.
  bool fused_decode = true;  // no-fused-decode
  // CUDA runtime only, with fused_decode: a batch-1 decode step's ReLU FFN on the one-token kernels
  // leaves its output as a fixed-point sum (int64 reductions, exact in any order, rounded to bf16
  // by its readers) instead of running its down kernel, and the attention output projection after
  // it stores the residual stream: one kernel fewer a layer (docs/runtime.md). Deterministic;
  // not the two-kernel path's bits (another summation of the same products, exact before the bf16
  // rounding). A term past the range (cuda/common/fixed_point.hpp) reruns the step the two-kernel
  // way and turns this off. Off: for A/B measurement.
  bool fixed_point_decode = true;  // no-fixed-point-decode
  // CUDA runtime only: the one-token FFN kernels run their neurons most active first, as counted
  // over the decode steps so far (cuda::FfnLayer::advance_decode_order), so that the active ones'
  // work overlaps the gate's stream instead of trailing it. A schedule: the same bits either way.
  // Off: for A/B measurement.
  bool decode_neuron_order = true;  // no-decode-neuron-order
  // CUDA runtime only: 1: a batch-1 decode step's dense ReLU FFN forms the norm before it inside its
  // [Wg; Wu] GEMV, and its down GEMV stores the residual stream (cuda::FfnLayer::set_dense_fold_norm):
  // the same bits, one kernel fewer a layer. A candidate: < 0 (the default) and 0 leave it off until
  // its A/B is measured (docs/runtime.md, plan step 3).
  int dense_fold_norm = -1;  // dense-fold-norm=N
  // CUDA runtime only: calls of 2–16 rows (batched decode steps, short prompts and chunks) run their
  // attention projections on the decode GEMV's tensor-core kernel (cuda/ops/gemv.hpp), which streams
  // the weights once for all rows; off: cuBLASLt's small-M GEMMs. Exact either way (fp32 sums,
  // rounded once), not the same bits. 2B decode +8.6–10.0 % dense at batches 2–8 on an H200
  // (docs/runtime.md; measured with the LM head on the same kernel, which now runs on cuBLASLt at
  // 2–16 rows in both settings). For A/B measurement.
  bool batched_gemv = true;  // no-batched-gemv
  // CUDA runtime only: attention calls of 16 rows or more (batched decode steps) run one CTA a (row,
  // KV head) on tensor cores, each key and value row loaded once for its query heads; off: a CTA a
  // (row, query head). Other bits (each within its float64 bound). For A/B measurement.
  bool grouped_attention = true;  // no-grouped-attention
  // CUDA runtime only: the rows from which attention calls take that grouped kernel; < 0: the
  // kernel's default (16, cuda/ops/model_ops.hpp). Other bits below 16 rows (each within its
  // float64 bound). Below 16 rows the kernel lost in the step on both 2B models (4 and 8 rows, H200).
  std::int64_t grouped_attention_min_rows = -1;  // grouped-attention-min-rows=N
  // CUDA runtime only: the density up to which a ReLU layer's decode steps run the sparse decode
  // kernels (the layer's newest count decides; both paths exact); < 0: the engine's measured default.
  double decode_max_density = -1;  // decode-max-density=X
  // CUDA runtime only: steps of up to this many rows run as decode steps (the decode kernels while
  // a layer's count allows); < 0: the engine's default (16). For measuring batched decode.
  std::int64_t decode_max_rows = -1;  // decode-max-rows=N
  // CUDA runtime only: a ReLU layer's decode steps of 2 up to this many rows (≤ 16) compute their
  // gate on the decode GEMV's tensor-core kernel, which reads its first weights before the
  // programmatic wait (cuda::FfnLayer::set_decode_gemv_max_rows); < 0: the engine's default (3:
  // the GEMV below the union's rows, cuBLASLt's ReLU GEMM from 4). Exact either way, not the same
  // bits. For A/B measurement.
  std::int64_t decode_gemv_max_rows = -1;  // decode-gemv-max-rows=N
  // CUDA runtime only, on a compute-capability-9.0 GPU: decode steps of union-min-rows up to this
  // many rows run a ReLU layer's union FFN (each neuron some row fired read once for the batch)
  // while its count allows; 0: never (the decode kernel up to decode-max-rows, the dense FFN past
  // it); < 0: the engine's default (32).
  std::int64_t union_max_rows = -1;  // union-max-rows=N
  // CUDA runtime only, the same GPUs: the union FFN from this many rows (2 ≤ N ≤ 64; 0: never),
  // in place of the decode kernel up to 16 rows; < 0: the engine's default (4). For measuring where
  // the union wins at 2–16 rows.
  std::int64_t union_min_rows = -1;  // union-min-rows=N
  // CUDA runtime only, the same GPUs: the union FFN's kernel shape (FfnLayer::UnionKernels): CTAs
  // an up and a down cluster (1, 2, 4 or 8), and at most this many up clusters (0: one for each
  // 64-slot block the list could fill); < 0: the engine's default (8, 8, 0). For A/B measurement.
  int union_up_split = -1;     // union-up-split=N
  int union_down_split = -1;   // union-down-split=N
  int union_up_clusters = -1;  // union-up-clusters=N
  // CPU runtime only: the weight matrices whose values are all bf16 exactly (a bf16 checkpoint) are
  // also kept as bf16, and steps of ≤ 8 rows (decode) read those — half the bytes of the fp32 copy
  // that bounds a CPU decode step; the same products in fp32 sums (another order than OpenBLAS's).
  // Costs half the weights' memory again. Only without an ffn_input_hook (a hook may change the
  // weights); off: fp32 everywhere.
  bool cpu_bf16_weights = true;  // no-cpu-bf16
  // make_kv_pool gives a paged KV cache (CPU and GPU); off, it refuses as unsupported, and `twell
  // serve` falls back to one cache of prompt + max_tokens per request. For the A/B count of
  // docs/serving.md (sequences that fit a memory budget).
  bool paged_kv = true;  // no-paged-kv
  // A paged pool keeps the published blocks of finished sequences for the next prompt that starts
  // with their tokens (the prefix cache, docs/serving.md); off, a block leaves the index when its
  // last holder gives it back (sharing among running sequences only). For the A/B of the cache.
  bool prefix_cache = true;  // no-prefix-cache
  // CUDA runtime only: every GEMM on the runtime's cuBLASLt (the projections, the dense FFN and its
  // side stream's, the LM head) of up to 64 rows takes the fastest of N heuristic candidates, timed
  // on the shape's first use, instead of the first candidate; a shape first met inside a CUDA graph
  // capture keeps the first candidate for good, and larger shapes (prefills) are not timed. 0: off
  // (the default). The timing reuses one weight, so it may favour algorithms that shine with the
  // weight in L2 (lab/probes/probe_gemv.cu times both on weights past the L2 and checks them
  // against float64), and the choice depends on timing: two processes may pick different
  // algorithms (not the same bits). For A/B measurement at batches 17–64, where cuBLASLt's first
  // candidates reach 31–67 % of the copy bandwidth (docs/runtime.md).
  int gemm_autotune = 0;  // gemm-autotune=N

  // The settings that differ from the defaults, as TWELL_TUNING items in a fixed order
  // ("no-cuda-graphs,decode-max-rows=8"; parse_tuning reads them back to this value); "" when
  // every setting is the default.
  std::string describe() const;

  // The tuning this process runs with: TWELL_TUNING parsed by parse_tuning at the first call (the
  // defaults where it is unset), and, where it is set, the result logged once to stderr
  // ("twell: TWELL_TUNING: ..."). Thread-safe. A malformed TWELL_TUNING throws at every call.
  static const RuntimeTuning& from_env();

  bool operator==(const RuntimeTuning&) const = default;
};

// TWELL_TUNING's value: items separated by commas (blanks around them and empty items ignored),
// each a switch (`no-cuda-graphs`) or a setting (`decode-max-rows=8`); a later item overrides an
// earlier one. An unknown item, a value on a switch, or a setting's value that is not a number in
// its range throws Error(invalid_argument) naming the item and listing the valid ones.
RuntimeTuning parse_tuning(std::string_view items);

}  // namespace twell::model
