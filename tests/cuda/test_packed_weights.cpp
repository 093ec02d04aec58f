// PackedWeights (src/cuda/packed_weights.hpp), the one owner of a layer's device weight layouts,
// against layouts written out here on the host from the definition: [Wg; 0; Wu; 0] (or [Wu; 0]) with
// ldn = N rounded up to 8, Wd as [K, ldn] with zero padding columns, Wdᵀ as [N, K]; every value
// rounded to bf16 by the host's rounding. Then: a device load (fp32 and bf16 sources) gives the same
// bits, a gathered copy is the permuted weights' layout, and a refused shape leaves the held
// weights as they were.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/packed_weights.hpp"
#include "cuda_test_util.hpp"
#include "device_test_util.hpp"
#include "twell/bf16.hpp"
#include "twell/error.hpp"

namespace twell::cuda::test {
namespace {

using Bits = std::vector<std::uint16_t>;
std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

struct Host {
  std::int64_t n, k;
  bool gated;
  std::vector<float> wg, wu, wd;  // [n, k], [n, k], [k, n]
  FfnWeights view() const { return ffn_weights(gated ? wg.data() : nullptr, wu.data(), wd.data(), n, k); }
};

Host make_host(std::int64_t n, std::int64_t k, bool gated, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.3f);
  Host h{n, k, gated, {}, {}, {}};
  for (auto* v : {&h.wg, &h.wu, &h.wd}) {
    v->resize(sz(n * k));
    for (float& x : *v) x = dist(rng);
  }
  return h;
}

// Neuron j of the result is neuron perm[j] of h.
Host permuted(const Host& h, const std::vector<int>& perm) {
  Host r = h;
  for (std::int64_t j = 0; j < h.n; ++j) {
    const std::int64_t s = perm[sz(j)];
    std::copy_n(h.wg.begin() + s * h.k, h.k, r.wg.begin() + j * h.k);
    std::copy_n(h.wu.begin() + s * h.k, h.k, r.wu.begin() + j * h.k);
    for (std::int64_t kk = 0; kk < h.k; ++kk) r.wd[sz(kk * h.n + j)] = h.wd[sz(kk * h.n + s)];
  }
  return r;
}

// The three layouts from the definition.
std::vector<Bits> expected(const Host& h) {
  const std::int64_t ldn = (h.n + 7) / 8 * 8;
  const auto b = [](float v) { return to_bf16(v).bits; };
  Bits gu(sz((h.gated ? 2 : 1) * ldn * h.k), 0), down(sz(h.k * ldn), 0), down_t(sz(h.n * h.k));
  for (std::int64_t r = 0; r < h.n; ++r)
    for (std::int64_t c = 0; c < h.k; ++c) {
      if (h.gated) {
        gu[sz(r * h.k + c)] = b(h.wg[sz(r * h.k + c)]);
        gu[sz((ldn + r) * h.k + c)] = b(h.wu[sz(r * h.k + c)]);
      } else {
        gu[sz(r * h.k + c)] = b(h.wu[sz(r * h.k + c)]);
      }
    }
  for (std::int64_t kk = 0; kk < h.k; ++kk)
    for (std::int64_t nn = 0; nn < h.n; ++nn) {
      down[sz(kk * ldn + nn)] = b(h.wd[sz(kk * h.n + nn)]);
      down_t[sz(nn * h.k + kk)] = b(h.wd[sz(kk * h.n + nn)]);
    }
  return {gu, down, down_t};
}

std::vector<Bits> layouts(const PackedWeights& w) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {download<std::uint16_t>(w.gate_up(), sz((w.gated() ? 2 : 1) * w.ldn() * w.k())),
          download<std::uint16_t>(w.down(), sz(w.k() * w.ldn())), download<std::uint16_t>(w.down_t(), sz(w.n() * w.k()))};
}

void expect_layouts(const PackedWeights& w, const Host& h, const char* what) {
  ASSERT_EQ(w.n(), h.n) << what;
  ASSERT_EQ(w.k(), h.k) << what;
  ASSERT_EQ(w.gated(), h.gated) << what;
  EXPECT_EQ(w.ldn(), (h.n + 7) / 8 * 8) << what;
  const std::vector<Bits> got = layouts(w), want = expected(h);
  const char* names[] = {"[Wg; Wu]", "Wd", "Wdᵀ"};
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(got[i] == want[i]) << what << ": " << names[i];
  EXPECT_EQ(w.up(), w.gate_up() + (h.gated ? w.ldn() * h.k : 0)) << what;
}

struct Shape {
  std::int64_t n, k;
  bool gated;
};
constexpr Shape kShapes[] = {{1003, 264, true}, {5, 8, false}, {640, 128, true}, {33, 40, false}};

TEST(PackedWeights, UploadWritesTheDefinedLayouts) {
  TWELL_REQUIRE_GPU();
  PackedWeights w;
  EXPECT_TRUE(w.empty());
  std::uint32_t seed = 1;
  for (const Shape s : kShapes) {  // one object through every shape: reshaping, then the same shape again
    SCOPED_TRACE(::testing::Message() << "n = " << s.n << ", k = " << s.k << (s.gated ? ", gated" : ""));
    const Host a = make_host(s.n, s.k, s.gated, seed++), b = make_host(s.n, s.k, s.gated, seed++);
    EXPECT_FALSE(w.upload(a.view(), nullptr)) << "a new shape";
    expect_layouts(w, a, "upload");
    EXPECT_TRUE(w.upload(b.view(), nullptr)) << "the same shape";
    expect_layouts(w, b, "second upload of the shape");
    EXPECT_EQ(w.bytes(), 2 * ((s.gated ? 2 : 1) * w.ldn() * s.k + s.k * w.ldn() + s.n * s.k));
  }
}

TEST(PackedWeights, DeviceLoadsMatchTheDefinedLayouts) {
  TWELL_REQUIRE_GPU();
  std::uint32_t seed = 100;
  for (const Shape s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n = " << s.n << ", k = " << s.k << (s.gated ? ", gated" : ""));
    const Host h = make_host(s.n, s.k, s.gated, seed++);
    DeviceBuffer<float> g(h.wg.size()), u(h.wu.size()), d(h.wd.size());
    for (auto [dst, src] : {std::pair{&g, &h.wg}, std::pair{&u, &h.wu}, std::pair{&d, &h.wd}})
      ASSERT_EQ(cudaMemcpy(dst->get(), src->data(), src->size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    Bits g16(h.wg.size()), u16(h.wu.size()), d16(h.wd.size());
    std::transform(h.wg.begin(), h.wg.end(), g16.begin(), [](float v) { return to_bf16(v).bits; });
    std::transform(h.wu.begin(), h.wu.end(), u16.begin(), [](float v) { return to_bf16(v).bits; });
    std::transform(h.wd.begin(), h.wd.end(), d16.begin(), [](float v) { return to_bf16(v).bits; });
    const auto g_b = upload_bits(g16), u_b = upload_bits(u16), d_b = upload_bits(d16);
    PackedWeights from32, from16;
    EXPECT_FALSE(from32.load({s.gated ? g.get() : nullptr, u.get(), d.get(), s.n, s.k, WeightType::f32}, nullptr));
    EXPECT_FALSE(from16.load({s.gated ? g_b.get() : nullptr, u_b.get(), d_b.get(), s.n, s.k, WeightType::bf16}, nullptr));
    expect_layouts(from32, h, "fp32 source");
    expect_layouts(from16, h, "bf16 source");
    // Over weights uploaded from the host (padding already written): the same bits again.
    PackedWeights over;
    over.upload(make_host(s.n, s.k, s.gated, 7).view(), nullptr);
    EXPECT_TRUE(over.load({s.gated ? g.get() : nullptr, u.get(), d.get(), s.n, s.k, WeightType::f32}, nullptr));
    expect_layouts(over, h, "load over an upload of the shape");
  }
}

TEST(PackedWeights, GatheredIsThePermutedWeightsLayout) {
  TWELL_REQUIRE_GPU();
  std::uint32_t seed = 200;
  for (const Shape s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n = " << s.n << ", k = " << s.k << (s.gated ? ", gated" : ""));
    const Host h = make_host(s.n, s.k, s.gated, seed++);
    std::vector<int> perm(sz(s.n));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
    PackedWeights w;
    w.upload(h.view(), nullptr);
    DeviceBuffer<int> idx(perm.size());
    ASSERT_EQ(cudaMemcpy(idx.get(), perm.data(), perm.size() * sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
    const PackedWeights g = w.gathered(idx.get(), nullptr);
    expect_layouts(g, permuted(h, perm), "gathered");
    expect_layouts(w, h, "the source, unchanged");
  }
}

TEST(PackedWeights, ARefusedShapeLeavesTheWeightsHeld) {
  TWELL_REQUIRE_GPU();
  const Host h = make_host(40, 16, true, 300);
  PackedWeights w;
  w.upload(h.view(), nullptr);
  const Host bad_k = make_host(40, 12, true, 301);  // K not a multiple of 8
  EXPECT_THROW(w.upload(bad_k.view(), nullptr), Error);
  DeviceBuffer<float> u(40 * 12), d(40 * 12);
  EXPECT_THROW(w.load({nullptr, u.get(), d.get(), 40, 12, WeightType::f32}, nullptr), Error);
  EXPECT_THROW(w.load({nullptr, u.get(), d.get(), 40, 16, static_cast<WeightType>(7)}, nullptr), Error)
      << "an unknown source type";
  expect_layouts(w, h, "after the refusals");
  PackedWeights none;
  DeviceBuffer<int> idx(1);
  EXPECT_THROW((void)none.gathered(idx.get(), nullptr), Error);
}

}  // namespace
}  // namespace twell::cuda::test
