#pragma once
// cuBLASLt bf16 GEMMs in the FFN's row-major layouts, fp32 accumulation:
//   C[M, n_out] (row stride ldc) = epilogue( X[M, k] (stride ldx) · W[n_out, k]ᵀ (stride ldw) )
// In cuBLAS's column-major terms this is the "TN" product Cᵀ = W · Xᵀ, the layout its fastest
// Hopper kernels use. Plans (descriptors + chosen algorithm) are cached per shape in the handle,
// never in process-global state.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <tuple>

#include "cuda/common/device_buffer.hpp"

namespace twell::cuda {

enum class GemmEpilogue { none, relu };

struct GemmShape {
  std::int64_t m = 0;      // rows of X and C (tokens)
  std::int64_t n_out = 0;  // rows of W, columns of C
  std::int64_t k = 0;
  std::int64_t ldx = 0, ldw = 0, ldc = 0;
  GemmEpilogue epilogue = GemmEpilogue::none;
  bool accumulate = false;  // C += product (β = 1; C read in its own type) instead of C = product
};

// General row-major product C[m, n] = op(A)·op(B), A and B bf16, fp32 accumulation, C bf16 or
// fp32. op(A) is [m, k] (A stored [k, m] when trans_a), op(B) is [k, n] (B stored [n, k] when
// trans_b); lda/ldb/ldc are the row strides of the matrices as stored.
struct MatmulShape {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  bool c_fp32 = false;
  GemmEpilogue epilogue = GemmEpilogue::none;
  bool accumulate = false;  // C += op(A)·op(B) (β = 1)
  auto key() const {
    return std::make_tuple(trans_a, trans_b, m, n, k, lda, ldb, ldc, c_fp32, static_cast<int>(epilogue), accumulate);
  }
};

class LtGemm {
 public:
  // autotune: on first use of a shape, time up to `candidates` heuristic algorithms on the actual
  // operands and keep the fastest (synchronises once per shape); else take the top heuristic. A
  // shape first used while its stream is capturing a CUDA graph takes the top heuristic for good
  // (timing would synchronise inside the capture). The choice depends on timing: two processes may
  // pick different algorithms (not the same bits).
  // mem: where the cuBLASLt workspace comes from (null: cudaMalloc); must outlive the LtGemm.
  explicit LtGemm(bool autotune = false, int candidates = 8, std::size_t workspace_bytes = 64u << 20,
                  DeviceAllocator* mem = nullptr);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  void run(const GemmShape& s, const __nv_bfloat16* w, const __nv_bfloat16* x, __nv_bfloat16* c, cudaStream_t stream);
  // C = op(A)·op(B) (see MatmulShape); c points to bf16 or float per s.c_fp32.
  void matmul(const MatmulShape& s, const __nv_bfloat16* a, const __nv_bfloat16* b, void* c, cudaStream_t stream);
  // The autotune policy for shapes not planned yet: on or off, how many heuristic candidates it times
  // (≥ 1), and the most rows (m) a shape may have to be timed (larger ones take the top heuristic:
  // a runtime's prefills meet a new m at every prompt length).
  struct Autotune {
    bool on = false;
    int candidates = 8;
    std::int64_t max_m = std::numeric_limits<std::int64_t>::max();
  };
  void set_autotune(const Autotune& a) noexcept {
    tune_ = a;
    if (tune_.candidates < 1) tune_.candidates = 1;
  }
  const Autotune& autotune() const noexcept { return tune_; }
  // One line per cached plan: shape (m n k), cuBLASLt algorithm id, tile, stages, split-K and
  // cluster-shape ids, and the autotuned time (ms, 0 without autotune). For benchmarks.
  std::string describe_plans() const;
  std::size_t workspace_bytes() const noexcept { return workspace_.bytes(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    float beta = 0;      // 1 when the shape accumulates into C
    float tuned_ms = 0;  // best round of the chosen algorithm (autotune), per kReps launches
  };
  // In cuBLASLt's column-major terms every product is Cᵀ = op(B_stored)·op(A_stored): `first` is
  // the stored B, `second` the stored A.
  Plan& plan_for(const MatmulShape& s, const __nv_bfloat16* first, const __nv_bfloat16* second, void* c,
                 cudaStream_t stream);
  void launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const __nv_bfloat16* first,
              const __nv_bfloat16* second, void* c, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<unsigned char> workspace_;
  Autotune tune_;
  std::map<decltype(MatmulShape{}.key()), Plan> plans_;
};

}  // namespace twell::cuda
