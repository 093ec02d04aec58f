// Probe (not part of the library): does cuBLASLt's RELU_AUX epilogue (ReLU + a 1-bit-per-element
// sign mask) cost anything over the plain RELU epilogue for the gate GEMM's shape, and what is the
// mask's bit layout? Built as twell_probe_gemm_relu_aux with -DTWELL_BUILD_LAB=ON.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <random>

#define CK(x) do { auto e_ = (x); if (e_ != 0) { std::printf("error %d at %s:%d\n", int(e_), __FILE__, __LINE__); std::exit(1); } } while (0)

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? atoll(argv[1]) : 16384, N = 5632, K = 2048;
  const int64_t ldmask = (N + 127) / 128 * 128;  // bits
  std::vector<__nv_bfloat16> hx(M * K), hw(N * K);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : hx) v = __float2bfloat16(nd(rng));
  for (auto& v : hw) v = __float2bfloat16(nd(rng) * 0.02f - 0.05f);  // mostly negative: sparse-ish
  __nv_bfloat16 *x, *w, *c;
  uint32_t* mask;
  CK(cudaMalloc(&x, M * K * 2)); CK(cudaMalloc(&w, N * K * 2)); CK(cudaMalloc(&c, M * N * 2));
  CK(cudaMalloc(&mask, M * ldmask / 8));
  CK(cudaMemcpy(x, hx.data(), M * K * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w, hw.data(), N * K * 2, cudaMemcpyHostToDevice));
  cublasLtHandle_t h; CK(cublasLtCreate(&h));
  void* ws; size_t wsb = 64 << 20; CK(cudaMalloc(&ws, wsb));
  cudaStream_t s; CK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const char* names[3] = {"none", "relu", "relu_aux"};
  cublasLtEpilogue_t eps[3] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_RELU_AUX};
  for (int round = 0; round < 2; ++round)
  for (int ei = 0; ei < 3; ++ei) {
    cublasLtMatmulDesc_t d; CK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &eps[ei], sizeof eps[ei]));
    if (ei == 2) {
      CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &mask, sizeof mask));
      CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldmask, sizeof ldmask));
    }
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
    CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t hr[8]; int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, pref, 8, hr, &found));
    float alpha = 1, beta = 0, best = 1e9; int besti = -1;
    for (int i = 0; i < found; ++i) {
      auto run = [&] { return cublasLtMatmul(h, d, &alpha, w, la, x, lb, &beta, c, lc, c, lc, &hr[i].algo, ws, wsb, s); };
      if (run() != CUBLAS_STATUS_SUCCESS) continue;
      cudaEventRecord(e0, s);
      for (int r = 0; r < 20; ++r) run();
      cudaEventRecord(e1, s); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); ms /= 20;
      if (i == 0 && round == 1) std::printf("%-9s M=%lld heuristic#0 %.4f ms\n", names[ei], (long long)M, ms);
      if (ms < best) { best = ms; besti = i; }
    }
    if (round == 1) std::printf("%-9s M=%lld best of %d: %.4f ms (#%d)  %.0f TF/s\n", names[ei], (long long)M, found, best, besti, 2.0 * M * N * K / best / 1e9);
    if (ei == 2 && round == 1) {
      CK(cudaStreamSynchronize(s));
      std::vector<__nv_bfloat16> hc(M * N); std::vector<uint32_t> hm(M * ldmask / 32);
      CK(cudaMemcpy(hc.data(), c, M * N * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hm.data(), mask, M * ldmask / 8, cudaMemcpyDeviceToHost));
      long long lsb_ok = 0, msb_ok = 0, pos = 0, tot = 0;
      for (int64_t t = 0; t < M; t += 97)
        for (int64_t n = 0; n < N; ++n) {
          const bool p = __bfloat162float(hc[t * N + n]) > 0.f;
          const uint32_t wd = hm[t * (ldmask / 32) + n / 32];
          lsb_ok += ((wd >> (n % 32)) & 1u) == (p ? 1u : 0u);
          msb_ok += ((wd >> (31 - n % 32)) & 1u) == (p ? 1u : 0u);
          pos += p; ++tot;
        }
      std::printf("mask layout check: %lld values, %lld positive (%.2f%%); LSB-first matches %lld, MSB-first matches %lld\n",
                  tot, pos, 100.0 * pos / tot, lsb_ok, msb_ok);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(d);
  }
  return 0;
}
