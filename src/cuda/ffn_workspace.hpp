#pragma once
// The FFN engine's per-call scratch: what one forward of one layer needs and no later call reads.
// One FfnWorkspace can serve every layer of a model (FfnContext's constructor takes it shared), so
// device memory for scratch depends on the largest M served, never on the number of layers.
// Buffers only grow (DeviceBuffer::reserve); contents are not kept between calls.
// Layers sharing a workspace must run one after another in stream order (one stream, or streams the
// caller orders): a layer's results in it (FfnContext::twell_words(), gate_values(), ...) are valid
// until the next call of any layer that shares it.
#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "cuda/common/device_buffer.hpp"
#include "cuda/dense/lt_gemm.hpp"

namespace twell::cuda {

struct FfnWorkspace {
  // mem: where every buffer here comes from (null: cudaMalloc).
  explicit FfnWorkspace(bool autotune_gemm = false, std::shared_ptr<DeviceAllocator> mem_ = nullptr)
      : mem(std::move(mem_)), gemm(autotune_gemm, 8, 64u << 20, mem.get()) {
    for (auto* b : {&g, &gu, &h, &x_h, &y_h}) b->use(mem.get());
    for (auto* b : {&words, &row_ovf, &row_nnz, &row_dense}) b->use(mem.get());
    dense_list.use(mem.get());
    dense_temp.use(mem.get());
    decode_partials.use(mem.get());
    for (auto* b : {&union_list, &union_counts}) b->use(mem.get());
    union_h.use(mem.get());
  }

  std::shared_ptr<DeviceAllocator> mem;  // first: the buffers below give their memory back to it
  LtGemm gemm;                        // the layers' GEMMs (plans cached per shape; its own workspace)
  std::unique_ptr<LtGemm> side_gemm;  // GEMMs on the hot neurons' second stream; created on first use

  DeviceBuffer<__nv_bfloat16> g;      // [m, ldn]  gate (gated) or ReLU(up) (non-gated)
  DeviceBuffer<__nv_bfloat16> gu;     // [m, 2·ldn] stacked gate|up output; second half: the hot neurons' workspace
  DeviceBuffer<__nv_bfloat16> h;      // [m, ldn]  dense h
  DeviceBuffer<std::uint32_t> words;  // [m, tiles · S] TwELL words
  DeviceBuffer<std::uint32_t> row_ovf;  // [m]
  DeviceBuffer<std::uint32_t> row_nnz;  // [m] the packing's row counts (the dense rows' input)
  DeviceBuffer<int> dense_list;         // [m + 1]: dense rows ascending, then at [m] their count
  DeviceBuffer<unsigned char> dense_temp;  // CUB scratch
  DeviceBuffer<std::uint32_t> row_dense;   // [m] 1 iff the row ran dense
  DeviceBuffer<__nv_bfloat16> x_h, y_h;    // [capacity, K] gathered x rows, their y rows
  DeviceBuffer<float> decode_partials;     // [m, tiles, K]
  DeviceBuffer<int> union_list;            // [union_list_size(N)] the union FFN's slots (sm90/union_ffn.hpp)
  DeviceBuffer<int> union_counts;          // [union_tiles(N)]
  DeviceBuffer<__nv_bfloat16> union_h;     // [m, union_list_size(N)]

  LtGemm& side() {
    if (!side_gemm) {  // gemm's autotune policy, so that both pick alike
      side_gemm = std::make_unique<LtGemm>(false, 8, gemm.workspace_bytes(), mem.get());
      side_gemm->set_autotune(gemm.autotune());
    }
    return *side_gemm;
  }
  std::size_t bytes() const noexcept {
    return gemm.workspace_bytes() + (side_gemm ? side_gemm->workspace_bytes() : 0) + g.bytes() + gu.bytes() +
           h.bytes() + words.bytes() + row_ovf.bytes() + row_nnz.bytes() +
           dense_list.bytes() + dense_temp.bytes() + row_dense.bytes() + x_h.bytes() + y_h.bytes() +
           decode_partials.bytes() + union_list.bytes() + union_counts.bytes() + union_h.bytes();
  }
};

}  // namespace twell::cuda
