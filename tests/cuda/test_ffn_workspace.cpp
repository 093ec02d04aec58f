// One FfnWorkspace shared by many layers (the model runtime's setup): every layer's output is bit
// for bit what the same layer computes with a workspace of its own, on every path (automatic,
// sparse, dense; prefill-sized, small and decode M), whatever the other layers ran in between; and
// the shared scratch is no bigger than one layer's (≤ 1.1×).
#include <gtest/gtest.h>

#include <memory>

#include "cuda/ffn_context.hpp"
#include "cuda/ffn_workspace.hpp"
#include "cuda_test_util.hpp"

namespace twell::cuda::test {
namespace {

struct Layer {
  FfnData d;
  DeviceBuffer<__nv_bfloat16> x, y_own, y_shared;
  std::unique_ptr<FfnContext> own, shared;
};

TEST(FfnWorkspace, SharedScratchIsBitIdenticalAndNoBigger) {
  TWELL_REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto ws = std::make_shared<FfnWorkspace>();
  std::vector<Layer> layers;
  const std::int64_t M = 16384;
  const double densities[] = {0.005, 0.01, 0.03, 0.005};  // sparse, sparse, dense by dispatch, sparse
  for (int i = 0; i < 4; ++i) {
    FfnCase c;
    c.m = M;
    c.density = densities[i];
    c.hot_rows = i == 1 ? 0.02 : 0.0;
    c.hot_neurons = i == 3 ? 0.02 : 0.0;
    c.seed = 100 + static_cast<std::uint64_t>(i);
    Layer l;
    l.d = make_ffn(c);
    const auto bits = to_bf16_bits(l.d.x);
    l.x = DeviceBuffer<__nv_bfloat16>(bits.size());
    ASSERT_EQ(cudaMemcpy(l.x.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    l.y_own = DeviceBuffer<__nv_bfloat16>(static_cast<std::size_t>(M * c.k));
    l.y_shared = DeviceBuffer<__nv_bfloat16>(l.y_own.size());
    l.own = std::make_unique<FfnContext>();
    l.shared = std::make_unique<FfnContext>(ContextOptions{}, ws);
    l.own->upload_weights(l.d.weights(), stream);
    l.shared->upload_weights(l.d.weights(), stream);
    layers.push_back(std::move(l));
  }
  auto compare = [&](std::int64_t m, Path path, int call) {
    // The stream is drained after every call, so that each automatic call sees its previous count
    // (the dispatch follows the newest count that has come back: without the wait, host timing
    // could pick different, equally exact paths for the two contexts).
    for (std::size_t i = 0; i < layers.size(); ++i) {
      Layer& l = layers[i];
      l.own->forward(l.x.get(), m, l.y_own.get(), path, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      l.shared->forward(l.x.get(), m, l.y_shared.get(), path, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const std::size_t n = static_cast<std::size_t>(m * layers[i].d.k);
      std::vector<std::uint16_t> a(n), b(n);
      cudaMemcpy(a.data(), layers[i].y_own.get(), n * 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(b.data(), layers[i].y_shared.get(), n * 2, cudaMemcpyDeviceToHost);
      EXPECT_EQ(a, b) << "layer " << i << ", m " << m << ", path " << static_cast<int>(path) << ", call " << call;
    }
  };
  // Several calls each: the automatic dispatch's counts come back and later calls follow them.
  for (std::int64_t m : {M, std::int64_t{3000}, std::int64_t{64}, std::int64_t{1}, std::int64_t{7}})
    for (Path p : {Path::automatic, Path::sparse, Path::dense})
      for (int call = 0; call < 3; ++call) compare(m, p, call);
  std::size_t biggest_own = 0;
  for (const Layer& l : layers) biggest_own = std::max(biggest_own, l.own->workspace().bytes());
  EXPECT_LE(static_cast<double>(ws->bytes()), 1.1 * static_cast<double>(biggest_own))
      << "shared " << ws->bytes() << " bytes, one layer's own up to " << biggest_own;
  RecordProperty("shared_workspace_bytes", std::to_string(ws->bytes()));
  RecordProperty("own_workspace_bytes_max", std::to_string(biggest_own));
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace twell::cuda::test
