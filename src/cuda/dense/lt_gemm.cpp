#include "cuda/dense/lt_gemm.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "cuda/common/check.hpp"

namespace twell::cuda {

LtGemm::LtGemm(bool autotune, int candidates, std::size_t workspace_bytes, DeviceAllocator* mem)
    : tune_{autotune, std::max(1, candidates)} {
  workspace_.use(mem);
  workspace_.resize(workspace_bytes);
  TWELL_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (handle_) cublasLtDestroy(handle_);
}

void LtGemm::launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const __nv_bfloat16* first,
                    const __nv_bfloat16* second, void* c, cudaStream_t stream) {
  const float alpha = 1.0f;
  TWELL_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, first, p.a, second, p.b, &p.beta, c, p.c, c, p.c, &algo,
                                    workspace_.get(), workspace_.bytes(), stream));
}

LtGemm::Plan& LtGemm::plan_for(const MatmulShape& s, const __nv_bfloat16* first, const __nv_bfloat16* second, void* c,
                               cudaStream_t stream) {
  auto it = plans_.find(s.key());
  if (it != plans_.end()) return it->second;

  // Stored shapes: A is [m, k] (or [k, m] when trans_a), B is [k, n] (or [n, k] when trans_b).
  const std::int64_t a_cols = s.trans_a ? s.m : s.k, b_cols = s.trans_b ? s.k : s.n;
  TWELL_CHECK(s.m >= 1 && s.n >= 1 && s.k >= 1 && s.lda >= a_cols && s.ldb >= b_cols && s.ldc >= s.n,
              ErrorCode::invalid_argument, "LtGemm: bad shape m={} n={} k={} lda={} ldb={} ldc={}", s.m, s.n, s.k,
              s.lda, s.ldb, s.ldc);
  Plan p;
  p.beta = s.accumulate ? 1.0f : 0.0f;
  TWELL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  TWELL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  TWELL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (s.epilogue == GemmEpilogue::relu) {
    const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_RELU;
    TWELL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  }
  // Column-major views of the row-major storage: stored B is [b_cols, b_rows] (ld ldb), stored A is
  // [a_cols, a_rows] (ld lda), C is [n, m] (ld ldc); Cᵀ = op(B view)·op(A view).
  TWELL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, static_cast<std::uint64_t>(b_cols),
                                                static_cast<std::uint64_t>(s.trans_b ? s.n : s.k), s.ldb));
  TWELL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, static_cast<std::uint64_t>(a_cols),
                                                static_cast<std::uint64_t>(s.trans_a ? s.k : s.m), s.lda));
  TWELL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, s.c_fp32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<std::uint64_t>(s.n),
                                                static_cast<std::uint64_t>(s.m), s.ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  TWELL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws = workspace_.bytes();
  TWELL_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Split-K only with fp32 partials: C is then the fp32 sum rounded once, as the float64 bounds and
  // the ReLU's sign assume. The in-place and output-type schemes add bf16-rounded partials, which
  // can move a small positive sum to zero (an active neuron lost; seen at M = 16 on an H200).
  const std::uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  TWELL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                          sizeof(schemes)));
  // Whether this shape is timed: not accumulating (the timed launches would add into C again and
  // again), not inside a graph capture (the timing synchronises), not past tune_.max_m rows.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (tune_.on) TWELL_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  const bool tune = tune_.on && capturing == cudaStreamCaptureStatusNone && !s.accumulate && s.m <= tune_.max_m;
  std::vector<cublasLtMatmulHeuristicResult_t> heur(static_cast<std::size_t>(tune ? tune_.candidates : 1));
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref,
                                                           static_cast<int>(heur.size()), heur.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  TWELL_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, ErrorCode::unsupported,
              "cuBLASLt has no bf16 algorithm for m={} n={} k={} (status {})", s.m, s.n, s.k, static_cast<int>(st));
  p.algo = heur[0].algo;
  if (tune && found > 1 && heur[0].state == CUBLAS_STATUS_SUCCESS) {
    // Candidates are timed in interleaved rounds after a warm-up that brings the clocks up, and
    // each keeps its best round: one pass over them in a fixed order (the first ones timed while
    // the GPU ramps up from idle) picked algorithms up to 20 % slower than the best (measured,
    // perf notes).
    std::vector<int> ok;
    for (int i = 0; i < found; ++i)
      if (heur[static_cast<std::size_t>(i)].state == CUBLAS_STATUS_SUCCESS) ok.push_back(i);
    cudaEvent_t e0, e1;
    TWELL_CUDA_CHECK(cudaEventCreate(&e0));
    TWELL_CUDA_CHECK(cudaEventCreate(&e1));
    constexpr int kWarm = 10, kRounds = 3, kReps = 4;
    for (int r = 0; r < kWarm; ++r) launch(p, heur[0].algo, first, second, c, stream);
    std::vector<float> best(static_cast<std::size_t>(found), std::numeric_limits<float>::infinity());
    for (int round = 0; round < kRounds; ++round) {
      for (int i : ok) {
        const auto& algo = heur[static_cast<std::size_t>(i)].algo;
        launch(p, algo, first, second, c, stream);  // warm-up of this algorithm
        TWELL_CUDA_CHECK(cudaEventRecord(e0, stream));
        for (int r = 0; r < kReps; ++r) launch(p, algo, first, second, c, stream);
        TWELL_CUDA_CHECK(cudaEventRecord(e1, stream));
        TWELL_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        TWELL_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        best[static_cast<std::size_t>(i)] = std::min(best[static_cast<std::size_t>(i)], ms);
      }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    float t = std::numeric_limits<float>::infinity();
    for (int i : ok)
      if (best[static_cast<std::size_t>(i)] < t) {
        t = best[static_cast<std::size_t>(i)];
        p.algo = heur[static_cast<std::size_t>(i)].algo;
        p.tuned_ms = t / kReps;
      }
  }
  return plans_.emplace(s.key(), p).first->second;
}

std::string LtGemm::describe_plans() const {
  std::string out;
  for (const auto& [key, p] : plans_) {
    auto attr = [&](cublasLtMatmulAlgoConfigAttributes_t a) {
      std::uint32_t v = 0;
      std::size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&p.algo, a, &v, sizeof(v), &written);
      return v;
    };
    out += fmt::format(fmt::runtime("m={} n={} k={} epilogue={}: algo {} tile {} stages {} splitk {} reduction {} cluster {} tuned {:.4f} ms\n"),
                       std::get<2>(key), std::get<3>(key), std::get<4>(key), std::get<9>(key),
                       attr(CUBLASLT_ALGO_CONFIG_ID), attr(CUBLASLT_ALGO_CONFIG_TILE_ID),
                       attr(CUBLASLT_ALGO_CONFIG_STAGES_ID), attr(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                       attr(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                       attr(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), p.tuned_ms);
  }
  return out;
}

void LtGemm::matmul(const MatmulShape& s, const __nv_bfloat16* a, const __nv_bfloat16* b, void* c,
                    cudaStream_t stream) {
  const Plan& p = plan_for(s, b, a, c, stream);
  launch(p, p.algo, b, a, c, stream);
}

void LtGemm::run(const GemmShape& s, const __nv_bfloat16* w, const __nv_bfloat16* x, __nv_bfloat16* c,
                 cudaStream_t stream) {
  // C = X · Wᵀ: A = X [m, k], B = W stored [n_out, k] (transposed).
  MatmulShape ms;
  ms.trans_a = false;
  ms.trans_b = true;
  ms.m = s.m;
  ms.n = s.n_out;
  ms.k = s.k;
  ms.lda = s.ldx;
  ms.ldb = s.ldw;
  ms.ldc = s.ldc;
  ms.epilogue = s.epilogue;
  ms.accumulate = s.accumulate;
  matmul(ms, x, w, c, stream);
}

}  // namespace twell::cuda
