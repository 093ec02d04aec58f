#pragma once
// Host-facing entry points of the CUDA backend. No CUDA types here: streams are passed as void*
// (a cudaStream_t) by the lower-level API in src/cuda; these wrappers own their handles/workspaces.
// Only declared when the library was built with CUDA (TWELL_HAVE_CUDA); query_device() works in
// every CUDA build and reports available = false on a machine without a GPU or driver.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "twell/ffn.hpp"
#include "twell/twell_format.hpp"

namespace twell::cuda {

struct DeviceInfo {
  bool available = false;
  std::string name;         // e.g. "NVIDIA H100 80GB HBM3"
  std::string reason;       // why not available
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  std::int64_t l2_bytes = 0;
  std::int64_t smem_per_block_optin = 0;
};
DeviceInfo query_device() noexcept;

enum class Path { automatic, dense, sparse };

struct InferenceOptions {
  TwellConfig twell{};
  Path path = Path::automatic;
};

struct InferenceReport {
  std::string path;              // which path ran, e.g. "sm90 twell", "dense cublasLt", "sm80 twell"
  std::int64_t nnz = 0;          // active neurons counted by the gate epilogue
  std::int64_t overflow_tiles = 0;
  std::int64_t overflow_rows = 0;
};

// Runs the FFN (gated or not, per w) on the GPU: converts x and weights to bf16, uploads, runs,
// downloads y as fp32. Exact: overflowed rows are computed through the fallback.
InferenceReport ffn_infer_host(CMatrixF x, const FfnWeights& w, MatrixF y, const InferenceOptions& opt = {});

struct BenchOptions {
  TwellConfig twell{};
  int warmup = 5;
  int reps = 20;
  Path path = Path::automatic;  // the path bench_ffn_host times as `total` and returns as y_sparse
};

struct BenchTimes {
  double gate_ms = 0;         // gate GEMM + TwELL epilogue alone
  double sparse_ms = 0;       // fused up+down (or sparse down) alone
  double total_ms = 0;        // the whole sparse FFN as dispatched
  double dense_ms = 0;        // the dense cuBLASLt FFN
  double dense_gate_ms = 0;   // the cuBLASLt bf16 GEMM of the gate's shape alone
  std::string path;           // the path dispatch chose
  std::int64_t nnz = 0, overflow_tiles = 0, overflow_rows = 0;
  std::vector<float> y_sparse;  // [M, K] from the sparse/dispatched path
  std::vector<float> y_dense;   // [M, K] from the dense path
};
// Times both paths in one process on the same inputs (CUDA events, median of reps); the gate
// against the GEMM alone and the dispatched FFN against the dense one alternately, rep by rep.
BenchTimes bench_ffn_host(CMatrixF x, const FfnWeights& w, const BenchOptions& opt = {});

// ---- training (one FFN layer, forward + backward) ----
struct TrainOptions {
  Path path = Path::automatic;
  // Weight-gradient tuning knobs of the sparse step (exact for any value; for tests and
  // benchmarks): the L2 budget of a pass and the entries per work item (0: automatic).
  double weight_grad_l2_fraction = 0.7;  // TrainContextOptions::weight_grad_l2_fraction
  std::int64_t weight_grad_run = 0;
  int token_min_blocks = 6;  // the token-major kernels built for 6 or 8 blocks per SM (K ≤ 2048); 0: no bound
  // Hot neurons of the sparse step (neurons run as dense GEMM columns, the rest through the CSR):
  // when set, exactly these (empty: no split); else the context calibrates on the step itself if
  // hot_neurons_auto and M is large enough (docs/engine.md).
  std::optional<std::vector<std::int64_t>> hot_neurons;
  bool hot_neurons_auto = true;
  bool gate_sm90 = true;  // Hopper: the sparse step's gate through the sm90 TwELL kernel, the CSR from its words
  bool dense_rows = true;  // rows with many non-zeros run dense inside the sparse step
  std::int64_t dense_rows_min = 256;  // ... when there are at least this many of them
};

struct TrainReport {
  std::string path;             // which path ran
  std::int64_t nnz = 0;         // exact active count (every path counts)
  FfnTrainScalars scalars;      // l1 = Σ|h| / M, l0 = active / M
  std::int64_t saved_bytes = 0;   // kept from forward for backward, beyond x and y
  std::int64_t device_bytes = 0;  // device memory the step's context held at its peak
  std::int64_t hot_neurons = 0;   // neurons the sparse step ran as dense columns (0: none)
  std::int64_t dense_rows = 0;    // rows the sparse step ran dense (0: none)
};

// One training step on the GPU: x, dy and the weights are rounded to bf16 and uploaded; fp32
// accumulation throughout; y and dx come back from bf16, the weight gradients are fp32.
TrainReport ffn_train_host(CMatrixF x, CMatrixF dy, const FfnWeights& w, double l1_coeff, MatrixF y,
                           const FfnGrads& grads, const TrainOptions& opt = {});

struct TrainBenchTimes {
  double dense_fwd_ms = 0, dense_step_ms = 0;    // cuBLASLt forward; forward + backward
  double sparse_fwd_ms = 0, sparse_step_ms = 0;  // as dispatched (Path::automatic)
  std::string path;
  std::int64_t nnz = 0;
  std::int64_t dense_saved_bytes = 0, sparse_saved_bytes = 0;
  std::int64_t dense_device_bytes = 0, sparse_device_bytes = 0;
  std::vector<float> y_sparse, dx_sparse;  // [M, K] from the last timed dispatched step
};
// Times dense and dispatched training steps in one process on the same inputs (medians of reps;
// whole steps alternate dense / dispatched rep by rep).
TrainBenchTimes bench_train_host(CMatrixF x, CMatrixF dy, const FfnWeights& w, double l1_coeff,
                                 const BenchOptions& opt = {});

}  // namespace twell::cuda
