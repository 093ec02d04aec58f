#pragma once
// One FFN layer's device weights in the kernels' layouts (bf16), and nothing else: the state that
// inference (FfnContext) and training (TrainContext) both hold, each its own. It owns the shape
// checks and the two ways weights arrive (host fp32, converted and uploaded; device bf16 or fp32,
// copied by one kernel). Who permutes the neurons (the inference context's hot split) swaps in a
// gathered copy (`gathered`).
//
// Layouts (N neurons, K hidden, ldn = N rounded up to 8; padding rows and columns are zero):
//   gate_up()  gated: [Wg; 0; Wu; 0] as [2·ldn, K]; non-gated: [Wu; 0] as [ldn, K]
//   down()     Wd as [K, ldn]
//   down_t()   Wdᵀ as [N, K]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/device_buffer.hpp"
#include "twell/cuda/weight_type.hpp"
#include "twell/ffn.hpp"

namespace twell::cuda {

// Device weights (bf16 or fp32) in nn.Linear's layouts, row-major and contiguous: w_gate, w_up
// [N, K] (w_gate null: a non-gated FFN), w_down [K, N].
struct DeviceFfnWeights {
  const void* w_gate = nullptr;  // [n, k] or null (non-gated)
  const void* w_up = nullptr;    // [n, k]
  const void* w_down = nullptr;  // [k, n]
  std::int64_t n = 0, k = 0;
  WeightType type = WeightType::bf16;  // of all three
};

class PackedWeights {
 public:
  // Converts fp32 host weights to bf16 and uploads them (synchronous on `stream`). Returns whether
  // the shape (gated, N, K) is the one held before; then the same buffers are written, in `stream`'s
  // order: work on other streams that reads the old weights must be ordered before it by the caller.
  bool upload(const FfnWeights& w, cudaStream_t stream);
  // Copies device weights into the layouts on `stream` (no host wait; allocates only when the shape
  // changes). Returns whether the shape is the one held before.
  bool load(const DeviceFfnWeights& w, cudaStream_t stream);
  // A copy whose neuron j is this one's neuron idx[j] (idx: device [N], a permutation), enqueued on
  // `stream`; this object stays valid until the stream has run it.
  PackedWeights gathered(const int* idx, cudaStream_t stream) const;

  bool empty() const noexcept { return n_ == 0; }
  bool gated() const noexcept { return gated_; }
  std::int64_t n() const noexcept { return n_; }
  std::int64_t k() const noexcept { return k_; }
  std::int64_t ldn() const noexcept { return ldn_; }
  const __nv_bfloat16* gate_up() const noexcept { return gate_up_.get(); }
  // The up projection's rows: the second half of gate_up() (gated) or all of it (non-gated).
  const __nv_bfloat16* up() const noexcept { return gate_up_.get() + (gated_ ? ldn_ * k_ : 0); }
  const __nv_bfloat16* down() const noexcept { return down_.get(); }
  const __nv_bfloat16* down_t() const noexcept { return down_t_.get(); }
  std::size_t bytes() const noexcept { return gate_up_.bytes() + down_.bytes() + down_t_.bytes(); }

 private:
  // Checks the shape (the kernels' limits on K and N) and sizes the three buffers for it; returns
  // whether it is the one held before (then nothing is reallocated).
  bool set_shape(bool gated, std::int64_t n, std::int64_t k);

  bool gated_ = true;
  std::int64_t n_ = 0, k_ = 0, ldn_ = 0;
  DeviceBuffer<__nv_bfloat16> gate_up_, down_, down_t_;
};

}  // namespace twell::cuda
