// Layers sharing one TrainScratch (the contexts of a model's FFN layers, run in model order:
// every forward, then every backward in reverse, each layer's gradients read right after its
// backward) give the same bits as contexts with scratch sets of their own: nothing a backward
// needs lives in the shared set. Shapes differ between the layers (gated and non-gated, other N
// and K), the paths cover sparse, dense and automatic (which at 5 % density turns dense after
// the gate on the first step, Saved::dense_split, and runs the stacked dense step on the second),
// with hot neurons where automatic calibrates them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/train/train_context.hpp"
#include "cuda_test_util.hpp"
#include "device_test_util.hpp"

namespace twell::cuda::test {
namespace {

using Bits = std::vector<std::uint16_t>;



struct Layer {
  FfnData d;
  DeviceBuffer<__nv_bfloat16> x, dy, y, dx;
};

struct LayerBits {
  Bits y, dx;
  std::vector<float> dw_gu, dw_down;
};

FfnCase case_of(std::int64_t m, std::int64_t n, std::int64_t k, bool gated, double density, std::uint64_t seed) {
  return ffn_case("layer", m, n, k, gated, density, seed);
}

// Two training steps of the model; per step and layer, y, dx and the gradients.
std::vector<std::vector<LayerBits>> run_model(std::vector<Layer>& layers, std::vector<std::unique_ptr<TrainContext>>& ctx,
                                              Path path) {
  std::vector<std::vector<LayerBits>> out;
  for (int s = 0; s < 2; ++s) {
    std::vector<LayerBits> bits(layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i)
      ctx[i]->forward(layers[i].x.get(), layers[i].d.m, layers[i].y.get(), path, nullptr);
    for (std::size_t j = layers.size(); j-- > 0;) {
      Layer& l = layers[j];
      TrainContext& c = *ctx[j];
      c.backward(l.x.get(), l.dy.get(), l.d.m, 0.25, l.dx.get(), nullptr);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      bits[j].y = download<std::uint16_t>(l.y.get(), l.y.size());
      bits[j].dx = download<std::uint16_t>(l.dx.get(), l.dx.size());
      const std::size_t nk = static_cast<std::size_t>(l.d.n * l.d.k);
      if (l.d.gated) bits[j].dw_gu = download<float>(c.dw_gate(), nk);
      const auto up = download<float>(c.dw_up(), nk);
      bits[j].dw_gu.insert(bits[j].dw_gu.end(), up.begin(), up.end());
      const auto full = download<float>(c.dw_down(), static_cast<std::size_t>(l.d.k * c.ldn()));
      for (std::int64_t r = 0; r < l.d.k; ++r)
        bits[j].dw_down.insert(bits[j].dw_down.end(), full.begin() + r * c.ldn(), full.begin() + r * c.ldn() + l.d.n);
    }
    out.push_back(std::move(bits));
  }
  return out;
}

template <typename T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(TrainScratch, SharedSetGivesTheBitsOfOwnSets) {
  TWELL_REQUIRE_GPU();
  const std::vector<FfnCase> cases = {case_of(4096, 2048, 512, true, 0.006, 11), case_of(4096, 1003, 264, true, 0.05, 12),
                                      case_of(4096, 640, 128, false, 0.004, 13), case_of(4096, 2048, 512, true, 0.008, 14)};
  std::vector<Layer> layers;
  for (const FfnCase& c : cases) {
    Layer l;
    l.d = make_ffn(c);
    l.x = upload_bits(to_bf16_bits(l.d.x));
    Bits dyb(l.d.x.size());
    for (std::size_t i = 0; i < dyb.size(); ++i)
      dyb[i] = to_bf16(static_cast<float>((i * 7919 + c.seed) % 1001 / 500.0 - 1.0)).bits;
    l.dy = upload_bits(dyb);
    l.y = DeviceBuffer<__nv_bfloat16>(l.d.x.size());
    l.dx = DeviceBuffer<__nv_bfloat16>(l.d.x.size());
    layers.push_back(std::move(l));
  }
  for (const Path path : {Path::sparse, Path::dense, Path::automatic}) {
    SCOPED_TRACE(path == Path::sparse ? "sparse" : path == Path::dense ? "dense" : "automatic");
    auto shared = std::make_shared<TrainScratch>();
    std::vector<std::unique_ptr<TrainContext>> own, sharing;
    for (const Layer& l : layers) {
      own.push_back(std::make_unique<TrainContext>());
      sharing.push_back(std::make_unique<TrainContext>(TrainContextOptions{}, shared));
      own.back()->upload_weights(l.d.weights(), nullptr);
      sharing.back()->upload_weights(l.d.weights(), nullptr);
    }
    const auto a = run_model(layers, own, path), b = run_model(layers, sharing, path);
    for (std::size_t s = 0; s < a.size(); ++s)
      for (std::size_t j = 0; j < layers.size(); ++j) {
        SCOPED_TRACE(testing::Message() << "step " << s << ", layer " << j);
        EXPECT_TRUE(same(a[s][j].y, b[s][j].y)) << "y";
        EXPECT_TRUE(same(a[s][j].dx, b[s][j].dx)) << "dx";
        EXPECT_TRUE(same(a[s][j].dw_gu, b[s][j].dw_gu)) << "dw_gate, dw_up";
        EXPECT_TRUE(same(a[s][j].dw_down, b[s][j].dw_down)) << "dw_down";
      }
    // The set is shared: the layers together hold less than their own sets.
    std::size_t own_total = 0, shared_total = shared->bytes();
    for (std::size_t j = 0; j < layers.size(); ++j) {
      own_total += own[j]->device_bytes();
      shared_total += sharing[j]->own_bytes();
    }
    EXPECT_LT(shared_total, own_total);
  }
}

}  // namespace
}  // namespace twell::cuda::test
