// Weights loaded from device bf16 memory (FfnContext / TrainContext::load_weights, the path the
// PyTorch ops take) give the same bits as the host upload of the same values, for inference and
// for a training step, gated and non-gated, sparse and dense; a second load of other weights of the
// same shape equals a fresh context given those weights; and the L1 coefficient read on the device
// equals the host's (a power of two, so (1/M)·c and c/M round alike).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/ffn_context.hpp"
#include "cuda/train/train_context.hpp"
#include "cuda_test_util.hpp"
#include "device_test_util.hpp"

namespace twell::cuda::test {
namespace {

using Bits = std::vector<std::uint16_t>;



// Device bf16 copies of a case's weights, in nn.Linear layouts.
struct DeviceWeights {
  DeviceBuffer<__nv_bfloat16> wg, wu, wd;
  DeviceFfnWeights view(const FfnData& d) const {
    return {d.gated ? wg.get() : nullptr, wu.get(), wd.get(), d.n, d.k};
  }
};
DeviceWeights to_device(const FfnData& d) {
  DeviceWeights w;
  if (d.gated) w.wg = upload_bits(to_bf16_bits(d.wg));
  w.wu = upload_bits(to_bf16_bits(d.wu));
  w.wd = upload_bits(to_bf16_bits(d.wd));
  return w;
}

struct StepBits {
  Bits y, dx;
  std::vector<float> dwg, dwu, dwd;
};

// One training step; the coefficient from the host (l1_dev null) or the device.
StepBits step(TrainContext& ctx, const FfnData& d, const DeviceBuffer<__nv_bfloat16>& x,
              const DeviceBuffer<__nv_bfloat16>& dy, Path path, double l1, const float* l1_dev) {
  const std::int64_t M = d.m, K = d.k, N = d.n;
  DeviceBuffer<__nv_bfloat16> y(static_cast<std::size_t>(M * K)), dx(y.size());
  ctx.forward(x.get(), M, y.get(), path, nullptr);
  if (l1_dev)
    ctx.backward(x.get(), dy.get(), M, l1_dev, dx.get(), nullptr);
  else
    ctx.backward(x.get(), dy.get(), M, l1, dx.get(), nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  StepBits s;
  s.y = download<std::uint16_t>(y.get(), y.size());
  s.dx = download<std::uint16_t>(dx.get(), dx.size());
  if (d.gated) s.dwg = download<float>(ctx.dw_gate(), static_cast<std::size_t>(N * K));
  s.dwu = download<float>(ctx.dw_up(), static_cast<std::size_t>(N * K));
  // dw_down has row stride ldn: compare the N meaningful columns of each row.
  const auto full = download<float>(ctx.dw_down(), static_cast<std::size_t>(K * ctx.ldn()));
  for (std::int64_t r = 0; r < K; ++r)
    s.dwd.insert(s.dwd.end(), full.begin() + r * ctx.ldn(), full.begin() + r * ctx.ldn() + N);
  return s;
}

template <typename T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void expect_same(const StepBits& a, const StepBits& b, const char* what) {
  EXPECT_TRUE(same(a.y, b.y)) << "y: " << what;
  EXPECT_TRUE(same(a.dx, b.dx)) << "dx: " << what;
  EXPECT_TRUE(same(a.dwg, b.dwg)) << "dw_gate: " << what;
  EXPECT_TRUE(same(a.dwu, b.dwu)) << "dw_up: " << what;
  EXPECT_TRUE(same(a.dwd, b.dwd)) << "dw_down: " << what;
}

FfnCase case_of(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, bool gated, std::uint64_t seed) {
  return ffn_case(name, m, n, k, gated, 0.01, seed);
}

TEST(DeviceWeights, TrainStepMatchesTheHostUpload) {
  TWELL_REQUIRE_GPU();
  const double l1 = 0.5;
  DeviceBuffer<float> l1_dev(1);
  const float l1f = static_cast<float>(l1);
  ASSERT_EQ(cudaMemcpy(l1_dev.get(), &l1f, sizeof l1f, cudaMemcpyHostToDevice), cudaSuccess);
  for (const FfnCase& c : {case_of("gated", 300, 1003, 264, true, 3), case_of("non-gated", 257, 640, 128, false, 4),
                           case_of("gated, M = 4096", 4096, 2048, 512, true, 5)}) {
    SCOPED_TRACE(c.name);
    const FfnData d = make_ffn(c);
    FfnCase c2 = c;
    c2.seed += 100;
    const FfnData d2 = make_ffn(c2);  // other weights of the same shape
    const auto x = upload_bits(to_bf16_bits(d.x));
    Bits dyb(d.x.size());
    for (std::size_t i = 0; i < dyb.size(); ++i) dyb[i] = to_bf16(static_cast<float>((i * 7919 % 1001) / 500.0 - 1.0)).bits;
    const auto dy = upload_bits(dyb);
    const DeviceWeights w = to_device(d), w2 = to_device(d2);
    for (const Path path : {Path::sparse, Path::dense, Path::automatic}) {
      SCOPED_TRACE(path == Path::sparse ? "sparse" : path == Path::dense ? "dense" : "automatic");
      TrainContext host, dev;
      host.upload_weights(d.weights(), nullptr);
      dev.load_weights(w.view(d), nullptr);
      expect_same(step(dev, d, x, dy, path, l1, l1_dev.get()), step(host, d, x, dy, path, l1, nullptr),
                  "device load and coefficient vs host upload");
      // New weights of the same shape into the used context == a fresh context given them (on a
      // fixed path and below the hot-neuron calibration's M: the used context keeps its dispatch
      // statistics and hot set by design, a fresh one starts without).
      if (path == Path::automatic || d.m >= 2048) continue;
      TrainContext fresh;
      fresh.upload_weights(d2.weights(), nullptr);
      dev.load_weights(w2.view(d2), nullptr);
      expect_same(step(dev, d2, x, dy, path, l1, l1_dev.get()), step(fresh, d2, x, dy, path, l1, nullptr),
                  "a second load of the same shape");
    }
    // A backward needs the forward of the weights it is given.
    TrainContext ctx;
    ctx.load_weights(w.view(d), nullptr);
    DeviceBuffer<__nv_bfloat16> y(d.x.size()), dx(d.x.size());
    ctx.forward(x.get(), d.m, y.get(), Path::sparse, nullptr);
    ctx.load_weights(w2.view(d2), nullptr);
    EXPECT_THROW(ctx.backward(x.get(), dy.get(), d.m, l1_dev.get(), dx.get(), nullptr), Error);
  }
}

TEST(DeviceWeights, InferenceMatchesTheHostUpload) {
  TWELL_REQUIRE_GPU();
  for (const FfnCase& c : {case_of("gated", 300, 1003, 264, true, 6), case_of("non-gated", 5, 640, 128, false, 7),
                           case_of("gated, M = 8192", 8192, 2048, 512, true, 8)}) {
    SCOPED_TRACE(c.name);
    const FfnData d = make_ffn(c);
    FfnCase c2 = c;
    c2.seed += 100;
    const FfnData d2 = make_ffn(c2);
    const auto x = upload_bits(to_bf16_bits(d.x));
    const DeviceWeights w = to_device(d), w2 = to_device(d2);
    for (const Path path : {Path::sparse, Path::dense, Path::automatic}) {
      FfnContext host, dev;
      DeviceBuffer<__nv_bfloat16> y1(d.x.size()), y2(d.x.size());
      host.upload_weights(d.weights(), nullptr);
      dev.load_weights(w.view(d), nullptr);
      // Twice: the second call runs after any calibration the first made (hot neurons permuted).
      for (int rep = 0; rep < 2; ++rep) {
        host.forward(x.get(), d.m, y1.get(), path, nullptr);
        dev.forward(x.get(), d.m, y2.get(), path, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(same(download<std::uint16_t>(y1.get(), y1.size()), download<std::uint16_t>(y2.get(), y2.size())))
            << "call " << rep;
      }
      // Reloading (after a calibration may have permuted the rows) equals a fresh upload (on a
      // fixed path: the used context keeps its dispatch statistics by design).
      if (path == Path::automatic) continue;
      FfnContext fresh;
      fresh.upload_weights(d2.weights(), nullptr);
      dev.load_weights(w2.view(d2), nullptr);
      fresh.forward(x.get(), d.m, y1.get(), path, nullptr);
      dev.forward(x.get(), d.m, y2.get(), path, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(same(download<std::uint16_t>(y1.get(), y1.size()), download<std::uint16_t>(y2.get(), y2.size())))
          << "a second load of the same shape";
    }
  }
}

// fp32 values that exercise every rounding case: full mantissas, exact ties (either parity),
// ±0, subnormals, values that round up to the next binade and to infinity, ±infinity.
std::vector<float> rounding_values(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const float specials[] = {0.0f, -0.0f, 1e-40f, -3e-39f, std::bit_cast<float>(0x3f808000u),
                            std::bit_cast<float>(0x3f818000u), std::bit_cast<float>(0x3fffffffu),
                            std::bit_cast<float>(0x7f7fffffu), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::infinity()};
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i)
    v[i] = i % 97 < std::size(specials) ? specials[i % 97] : static_cast<float>(normal(gen) * std::exp2(uniform(gen) * 40 - 20));
  return v;
}

template <typename T>
DeviceBuffer<T> upload_at(const std::vector<T>& v, std::size_t offset) {  // offset elements in: misaligned sources
  DeviceBuffer<T> d(v.size() + offset);
  EXPECT_EQ(cudaMemcpy(d.get() + offset, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// The context's layouts ([Wg; Wu] with its zero padding rows, Wd with its zero padding columns, Wdᵀ)
// after a load from device fp32, from device bf16 and (fp32, bf16) from misaligned addresses: the
// bits of the host upload of the same fp32 values, which rounds on the host (to_bf16).
TEST(DeviceWeights, LoadsFp32AndBf16IntoTheHostUploadsLayouts) {
  TWELL_REQUIRE_GPU();
  struct Shape {
    std::int64_t n, k;
    bool gated;
  };
  for (const Shape sh : {Shape{1003, 264, true}, Shape{5, 8, false}, Shape{640, 128, true}, Shape{33, 40, false},
                         Shape{2048, 72, true}}) {
    SCOPED_TRACE(::testing::Message() << "n = " << sh.n << ", k = " << sh.k << (sh.gated ? ", gated" : ""));
    const auto nk = static_cast<std::size_t>(sh.n * sh.k);
    const std::vector<float> wg = rounding_values(nk, 11), wu = rounding_values(nk, 12), wd = rounding_values(nk, 13);
    const FfnWeights host_w = ffn_weights(sh.gated ? wg.data() : nullptr, wu.data(), wd.data(), sh.n, sh.k);
    FfnContext host;
    host.upload_weights(host_w, nullptr);
    const auto layouts = [&](const FfnContext& c) {
      return std::vector<Bits>{
          download<std::uint16_t>(c.w_gate_up(), static_cast<std::size_t>((sh.gated ? 2 : 1) * c.ldn() * c.k())),
          download<std::uint16_t>(c.w_down(), static_cast<std::size_t>(c.k() * c.ldn())),
          download<std::uint16_t>(c.w_down_t(), nk)};
    };
    const std::vector<Bits> want = layouts(host);
    const auto bits = [](const std::vector<float>& v) { return to_bf16_bits(v); };
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      SCOPED_TRACE(::testing::Message() << "sources " << offset << " element(s) past an allocation");
      const auto g32 = upload_at(wg, offset), u32 = upload_at(wu, offset), d32 = upload_at(wd, offset);
      const auto g16 = upload_at(bits(wg), offset), u16 = upload_at(bits(wu), offset), d16 = upload_at(bits(wd), offset);
      FfnContext f32_ctx, bf16_ctx;
      f32_ctx.load_weights({sh.gated ? g32.get() + offset : nullptr, u32.get() + offset, d32.get() + offset, sh.n, sh.k,
                            WeightType::f32},
                           nullptr);
      bf16_ctx.load_weights({sh.gated ? g16.get() + offset : nullptr, u16.get() + offset, d16.get() + offset, sh.n,
                             sh.k, WeightType::bf16},
                            nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<Bits> got32 = layouts(f32_ctx), got16 = layouts(bf16_ctx);
      for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(same(got32[i], want[i])) << "fp32 source, layout " << i << " ([Wg; Wu], Wd, Wdᵀ)";
        EXPECT_TRUE(same(got16[i], want[i])) << "bf16 source, layout " << i << " ([Wg; Wu], Wd, Wdᵀ)";
      }
      // A second load of the same shape into the used context (no padding reset) gives the same.
      f32_ctx.load_weights({sh.gated ? g32.get() + offset : nullptr, u32.get() + offset, d32.get() + offset, sh.n,
                            sh.k, WeightType::f32},
                           nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(same(layouts(f32_ctx)[0], want[0])) << "reload";
    }
  }
}

// A NaN weight stays a NaN (its payload is the device's canonical one, not the host's).
TEST(DeviceWeights, Fp32NanStaysNan) {
  TWELL_REQUIRE_GPU();
  std::vector<float> w(8 * 16, 0.5f);
  w[3] = std::numeric_limits<float>::quiet_NaN();
  const auto u = upload_at(w, 0);
  std::vector<float> wdv(16 * 8, 0.25f);
  const auto d = upload_at(wdv, 0);
  FfnContext ctx;
  ctx.load_weights({nullptr, u.get(), d.get(), 8, 16, WeightType::f32}, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Bits got = download<std::uint16_t>(ctx.w_gate_up(), static_cast<std::size_t>(ctx.ldn() * 16));
  EXPECT_TRUE(std::isnan(to_float(bf16{got[3]})));
  EXPECT_EQ(got[4], to_bf16(0.5f).bits);
}

// A training step over weights loaded from device fp32 equals the host upload's, on every path.
TEST(DeviceWeights, TrainStepFromFp32MatchesTheHostUpload) {
  TWELL_REQUIRE_GPU();
  const FfnCase c = case_of("gated", 300, 1003, 264, true, 21);
  const FfnData d = make_ffn(c);
  const auto x = upload_bits(to_bf16_bits(d.x));
  Bits dyb(d.x.size());
  for (std::size_t i = 0; i < dyb.size(); ++i) dyb[i] = to_bf16(static_cast<float>((i * 7919 % 1001) / 500.0 - 1.0)).bits;
  const auto dy = upload_bits(dyb);
  // fp32 weights off the bf16 grid (the case's are on it): the rounding happens in the load.
  std::vector<float> wg = d.wg, wu = d.wu, wd = d.wd;
  for (std::vector<float>* v : {&wg, &wu, &wd})
    for (std::size_t i = 0; i < v->size(); ++i) (*v)[i] *= 1.0f + 1e-3f * static_cast<float>(i % 7);
  FfnData d32 = d;
  d32.wg = wg;
  d32.wu = wu;
  d32.wd = wd;
  const auto g = upload_at(wg, 0), u = upload_at(wu, 0), w = upload_at(wd, 0);
  for (const Path path : {Path::sparse, Path::dense}) {
    TrainContext host, dev;
    host.upload_weights(d32.weights(), nullptr);
    dev.load_weights({g.get(), u.get(), w.get(), d.n, d.k, WeightType::f32}, nullptr);
    expect_same(step(dev, d32, x, dy, path, 0.5, nullptr), step(host, d32, x, dy, path, 0.5, nullptr),
                path == Path::sparse ? "sparse" : "dense");
  }
}

}  // namespace
}  // namespace twell::cuda::test
