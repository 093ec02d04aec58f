// The public per-layer API (twell/cuda/ffn_layer.hpp), used as a framework would: only public
// headers, the caller's device memory and stream, layers sharing one workspace in model order.
// Its results equal the host API's (ffn_infer_host / ffn_train_host, the same kernels through an
// upload) bit for bit on forced paths; gradients_to writes fp32 as is and bf16 rounded once; bad
// use is an Error, not a crash.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "twell/cuda/ffn_layer.hpp"
#include "twell/error.hpp"

namespace twell::cuda::test {
namespace {

using Bits = std::vector<std::uint16_t>;

// A device array of T, freed with the object (the test's own: the library's buffers are private).
template <typename T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t count) : n(count) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

template <typename T, typename H>
void up(Dev<T>& d, const std::vector<H>& h) {
  ASSERT_EQ(h.size() * sizeof(H), d.n * sizeof(T));
  ASSERT_EQ(::twell::cuda::test::h2d(d.p, h.data(), d.n * sizeof(T)), cudaSuccess);
}

template <typename H, typename T>
std::vector<H> down(const Dev<T>& d) {
  std::vector<H> h(d.n * sizeof(T) / sizeof(H));
  EXPECT_EQ(cudaMemcpy(h.data(), d.p, d.n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

std::vector<float> floats_of(const Bits& b) {
  std::vector<float> f(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) f[i] = to_float(bf16{b[i]});
  return f;
}

FfnCase case_of(std::int64_t m, std::int64_t n, std::int64_t k, bool gated, std::uint64_t seed) {
  return ffn_case("layer", m, n, k, gated, 0.01, seed);
}

// dy for a case: a fixed pattern, bf16-exact.
std::vector<float> dy_of(const FfnData& d) {
  std::vector<float> dy(d.x.size());
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = round_bf16(static_cast<float>((i * 7919 % 1001) / 500.0 - 1.0));
  return dy;
}

// What `enqueue` launches on s, captured and instantiated; null (with a test failure naming
// `what`) if it throws while capturing.
cudaGraphExec_t capture_graph(cudaStream_t s, const std::function<void()>& enqueue, const char* what) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  bool threw = false;
  try {
    enqueue();
  } catch (const Error& e) {
    threw = true;
    ADD_FAILURE() << what << " is not capturable: " << e.what();
  }
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  if (!threw && graph) {
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  }
  if (graph) cudaGraphDestroy(graph);
  return exec;
}

TEST(FfnLayer, SharedWorkspaceInferenceEqualsTheHostApi) {
  TWELL_REQUIRE_GPU();
  const std::vector<FfnData> data = {make_ffn(case_of(300, 1003, 264, true, 1)), make_ffn(case_of(257, 640, 128, false, 2))};
  InferWorkspace ws;
  for (const Path path : {Path::sparse, Path::dense, Path::automatic}) {
    std::vector<FfnLayer> layers;
    for (const FfnData& d : data) {
      layers.emplace_back(&ws);
      layers.back().upload_weights(d.weights(), nullptr);
    }
    for (std::size_t i = 0; i < data.size(); ++i) {
      const FfnData& d = data[i];
      Dev<bf16> x(d.x.size()), y(d.x.size());
      up(x, to_bf16_bits(d.x));
      layers[i].forward(x.p, d.m, y.p, path, nullptr);
      std::vector<float> want(d.x.size());
      InferenceOptions o;
      o.path = path;
      ffn_infer_host(d.xv(), d.weights(), MatrixF(want.data(), d.m, d.k), o);
      EXPECT_EQ(floats_of(down<std::uint16_t>(y)), want) << "layer " << i;
    }
  }
}

TEST(FfnLayer, SharedWorkspaceTrainingEqualsTheHostApi) {
  TWELL_REQUIRE_GPU();
  const std::vector<FfnData> data = {make_ffn(case_of(300, 1003, 264, true, 3)), make_ffn(case_of(257, 640, 128, false, 4)),
                                     make_ffn(case_of(1024, 2048, 512, true, 5))};
  const double l1 = 0.5;
  for (const Path path : {Path::sparse, Path::dense}) {
    SCOPED_TRACE(path == Path::sparse ? "sparse" : "dense");
    TrainWorkspace ws;
    std::vector<FfnTrainLayer> layers;
    std::vector<std::unique_ptr<Dev<bf16>>> xs, ys;
    for (const FfnData& d : data) {
      layers.emplace_back(&ws);
      layers.back().upload_weights(d.weights(), nullptr);
      xs.push_back(std::make_unique<Dev<bf16>>(d.x.size()));
      ys.push_back(std::make_unique<Dev<bf16>>(d.x.size()));
      up(*xs.back(), to_bf16_bits(d.x));
    }
    for (std::size_t i = 0; i < data.size(); ++i) layers[i].forward(xs[i]->p, data[i].m, ys[i]->p, path, nullptr);
    for (std::size_t i = data.size(); i-- > 0;) {  // model order: the last layer's backward first
      SCOPED_TRACE(testing::Message() << "layer " << i);
      const FfnData& d = data[i];
      const std::size_t nk = static_cast<std::size_t>(d.n * d.k);
      const std::vector<float> dyv = dy_of(d);
      Dev<bf16> dy(d.x.size()), dx(d.x.size());
      up(dy, to_bf16_bits(dyv));
      layers[i].backward(xs[i]->p, dy.p, d.m, l1, dx.p, nullptr);
      Dev<float> g32(nk), u32(nk), d32(nk);
      Dev<bf16> g16(nk), u16(nk), d16(nk);
      layers[i].gradients_to({g32.p, GradOut::Type::f32}, {u32.p, GradOut::Type::f32}, {d32.p, GradOut::Type::f32}, nullptr);
      layers[i].gradients_to({g16.p, GradOut::Type::bf16}, {u16.p, GradOut::Type::bf16}, {d16.p, GradOut::Type::bf16},
                             nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> y(d.x.size()), gx(d.x.size()), gg(nk), gu(nk), gd(nk);
      TrainOptions o;
      o.path = path;
      ffn_train_host(d.xv(), CMatrixF(dyv.data(), d.m, d.k), d.weights(), l1, MatrixF(y.data(), d.m, d.k),
                     FfnGrads{MatrixF(gx.data(), d.m, d.k), MatrixF(gg.data(), d.n, d.k), MatrixF(gu.data(), d.n, d.k),
                              MatrixF(gd.data(), d.k, d.n)},
                     o);
      EXPECT_EQ(floats_of(down<std::uint16_t>(*ys[i])), y) << "y";
      EXPECT_EQ(floats_of(down<std::uint16_t>(dx)), gx) << "dx";
      if (d.gated) {
        EXPECT_EQ(down<float>(g32), gg) << "dw_gate";
      }
      EXPECT_EQ(down<float>(u32), gu) << "dw_up";
      EXPECT_EQ(down<float>(d32), gd) << "dw_down";
      // bf16 gradients: each fp32 value rounded once.
      const auto rounded = [](std::vector<float> v) {
        for (float& f : v) f = round_bf16(f);
        return v;
      };
      if (d.gated) {
        EXPECT_EQ(floats_of(down<std::uint16_t>(g16)), rounded(gg)) << "dw_gate bf16";
      }
      EXPECT_EQ(floats_of(down<std::uint16_t>(u16)), rounded(gu)) << "dw_up bf16";
      EXPECT_EQ(floats_of(down<std::uint16_t>(d16)), rounded(gd)) << "dw_down bf16";
    }
    EXPECT_GT(ws.bytes(), 0);
    for (const FfnTrainLayer& l : layers) EXPECT_LT(l.own_bytes(), l.device_bytes());
  }
}

// Issue 26's CUDA-graph outcome: after warm-up calls at a shape (buffers grown, dispatch settled),
// L layers' inference forwards make no host synchronisation and no allocation, so they can be
// captured into one graph; replayed on fresh inputs, the graph gives the uncaptured run's bits.
TEST(FfnLayer, CapturedLayersReplayBitIdentically) {
  TWELL_REQUIRE_GPU();
  constexpr int L = 4;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  for (const std::int64_t m : {std::int64_t{64}, std::int64_t{4096}}) {
    for (const Path path : {Path::sparse, Path::dense, Path::automatic}) {
      SCOPED_TRACE(testing::Message() << "M = " << m << ", path " << static_cast<int>(path));
      const FfnData d = make_ffn(ffn_case("capture", m, 2048, 512, true, 0.005, 21));
      const FfnData fresh_in = make_ffn(ffn_case("capture", m, 2048, 512, true, 0.005, 22));  // other x, same shape
      InferWorkspace ws;
      std::vector<FfnLayer> layers;
      for (int i = 0; i < L; ++i) {
        layers.emplace_back(&ws);
        layers.back().upload_weights(d.weights(), s);  // the same weights each layer: activations stay in range
      }
      // acts[0] = x; acts[i + 1] = layer i's output.
      std::vector<std::unique_ptr<Dev<bf16>>> acts;
      for (int i = 0; i <= L; ++i) acts.push_back(std::make_unique<Dev<bf16>>(d.x.size()));
      std::vector<std::string> paths(L);  // the last run's dispatch, layer by layer
      const auto run = [&] {
        for (int i = 0; i < L; ++i) {
          layers[i].forward(acts[i]->p, m, acts[i + 1]->p, path, s);
          paths[i] = layers[i].last_path();
        }
      };
      const auto joined = [&] {
        std::string j;
        for (const std::string& p : paths) j += "\n    " + p;
        return j;
      };
      // s does not wait for the legacy default stream that up() and cudaMemset run on: a pageable
      // cudaMemcpy may return before its DMA lands, and cudaMemset returns before it runs. So the
      // device is synchronised after each, before s reads or writes the same memory.
      up(*acts[0], to_bf16_bits(d.x));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (int w = 0; w < 3; ++w) run();  // warm-up: buffers, dispatch statistics, cuBLASLt plans
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaGraphExec_t exec = capture_graph(s, run, "a forward");
      if (!exec) continue;
      const std::string captured = joined();
      // Fresh input: uncaptured, then replayed.
      up(*acts[0], to_bf16_bits(fresh_in.x));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      run();
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      const auto want = down<std::uint16_t>(*acts[L]);
      const auto want_first = down<std::uint16_t>(*acts[1]);
      ASSERT_EQ(cudaMemsetAsync(acts[L]->p, 0xff, acts[L]->n * sizeof(bf16), s), cudaSuccess);  // before the replay, on s
      ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      const auto got = down<std::uint16_t>(*acts[L]);
      std::size_t differ = 0, first = got.size();
      for (std::size_t i = 0; i < got.size(); ++i)
        if (got[i] != want[i]) {
          ++differ;
          first = std::min(first, i);
        }
      EXPECT_EQ(differ, 0u) << differ << " of " << got.size() << " values differ, the first at row " << first / 512
                            << "; layer 1's output " << (down<std::uint16_t>(*acts[1]) == want_first ? "equal" : "differs")
                            << "\n  captured with:" << captured << "\n  uncaptured run:" << joined();
      cudaGraphExecDestroy(exec);
    }
  }
  cudaStreamDestroy(s);
}

// A caller's allocator over cudaMalloc that counts what it holds; `skew` bytes past an aligned
// block (a broken allocator) when set, `refuse` to throw instead.
class CountingAllocator final : public DeviceAllocator {
 public:
  std::size_t skew = 0;
  bool refuse = false;
  std::int64_t live = 0, calls = 0;

  void* allocate(std::size_t bytes) override {
    if (refuse) throw std::bad_alloc();
    void* p = nullptr;
    if (cudaMalloc(&p, bytes + skew) != cudaSuccess) throw std::bad_alloc();
    live += static_cast<std::int64_t>(bytes);
    ++calls;
    return static_cast<char*>(p) + skew;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    cudaFree(static_cast<char*>(p) - skew);
    live -= static_cast<std::int64_t>(bytes);
  }
};

// Issue 26 / 28: a framework's allocator can own the shared workspaces. Every byte a workspace
// holds comes from the caller's allocator and goes back to it; results equal the host API's.
TEST(FfnLayer, WorkspacesDrawFromTheCallersAllocator) {
  TWELL_REQUIRE_GPU();
  auto mem = std::make_shared<CountingAllocator>();
  const FfnData d = make_ffn(case_of(300, 1003, 264, true, 7));
  const std::vector<float> dyv = dy_of(d);
  Dev<bf16> x(d.x.size()), y(d.x.size()), dy(d.x.size()), dx(d.x.size());
  up(x, to_bf16_bits(d.x));
  up(dy, to_bf16_bits(dyv));
  {
    InferWorkspace ws(mem);
    FfnLayer a(&ws), b(&ws);
    a.upload_weights(d.weights(), nullptr);
    b.upload_weights(d.weights(), nullptr);
    for (const Path path : {Path::sparse, Path::dense, Path::automatic}) {
      for (FfnLayer* l : {&a, &b}) {
        l->forward(x.p, d.m, y.p, path, nullptr);
        std::vector<float> want(d.x.size());
        InferenceOptions o;
        o.path = path;
        ffn_infer_host(d.xv(), d.weights(), MatrixF(want.data(), d.m, d.k), o);
        EXPECT_EQ(floats_of(down<std::uint16_t>(y)), want);
      }
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_GT(ws.bytes(), 0);
    EXPECT_EQ(mem->live, ws.bytes());  // all of the workspace, and nothing else
  }
  EXPECT_EQ(mem->live, 0);
  for (const Path path : {Path::sparse, Path::dense}) {
    TrainWorkspace ws(mem);
    FfnTrainLayer t(&ws);
    t.upload_weights(d.weights(), nullptr);
    t.forward(x.p, d.m, y.p, path, nullptr);
    t.backward(x.p, dy.p, d.m, 0.5, dx.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> want_y(d.x.size()), gx(d.x.size()), gg(d.n * d.k), gu(d.n * d.k), gd(d.k * d.n);
    TrainOptions o;
    o.path = path;
    ffn_train_host(d.xv(), CMatrixF(dyv.data(), d.m, d.k), d.weights(), 0.5, MatrixF(want_y.data(), d.m, d.k),
                   FfnGrads{MatrixF(gx.data(), d.m, d.k), MatrixF(gg.data(), d.n, d.k), MatrixF(gu.data(), d.n, d.k),
                            MatrixF(gd.data(), d.k, d.n)},
                   o);
    EXPECT_EQ(floats_of(down<std::uint16_t>(y)), want_y);
    EXPECT_EQ(floats_of(down<std::uint16_t>(dx)), gx);
    EXPECT_EQ(mem->live, ws.bytes());
    EXPECT_LT(t.own_bytes(), t.device_bytes());  // the layer's own memory stays its own
  }
  EXPECT_EQ(mem->live, 0);
  // A broken allocator is an error, never a kernel on misaligned or missing memory.
  auto skewed = std::make_shared<CountingAllocator>();
  skewed->skew = 16;
  EXPECT_THROW(InferWorkspace{skewed}, Error);
  EXPECT_EQ(skewed->live, 0);
  auto refusing = std::make_shared<CountingAllocator>();
  refusing->refuse = true;
  EXPECT_THROW(
      {
        TrainWorkspace ws(refusing);
        FfnTrainLayer t(&ws);  // the first layer of a set makes its cuBLASLt workspace
      },
      std::bad_alloc);
}

// N = 1024, K = 256, gated, 0.5 % density, with three all-active rows (each overflows every one
// of the four TwELL tiles); exact pre-activations, so every backend agrees on the pattern.
FfnData overflow_data(const char* name, std::int64_t m, std::uint64_t seed) {
  FfnCase c = ffn_case(name, m, 1024, 256, true, 0.005, seed);
  c.full_rows = 3;
  c.exact_preactivation = true;
  return make_ffn(c);
}

// stats(): counts come back without a wait. A forced call counts nothing; the automatic path's
// counted TwELL calls bring their exact counters, equal to what the host API reads (with a wait)
// from a fresh layer on the same input. Rows forced all-active overflow every TwELL tile.
TEST(FfnLayer, StatsComeBackWithoutAWait) {
  TWELL_REQUIRE_GPU();
  const FfnData d = overflow_data("stats", 2048, 11);
  FfnLayer layer;
  const LayerStats none = layer.stats();  // no weights yet
  EXPECT_EQ(none.calls, 0);
  EXPECT_EQ(none.density, -1);
  EXPECT_EQ(none.active, -1);
  EXPECT_EQ(none.nnz, -1);
  EXPECT_EQ(none.overflow_rows, -1);
  EXPECT_EQ(none.path, "");
  EXPECT_EQ(layer.last_path(), "");
  layer.upload_weights(d.weights(), nullptr);
  Dev<bf16> x(d.x.size()), y(d.x.size());
  up(x, to_bf16_bits(d.x));
  layer.forward(x.p, d.m, y.p, Path::dense, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const LayerStats dense = layer.stats();
  EXPECT_EQ(dense.calls, 1);
  EXPECT_EQ(dense.sparse_calls, 0);
  EXPECT_EQ(dense.density, -1);  // a forced path measures nothing
  EXPECT_EQ(dense.active, -1);
  EXPECT_EQ(dense.nnz, -1);
  EXPECT_EQ(dense.path, "dense cublasLt");
  // Automatic: the first call counts on the device and waits for its flag; the next two run sticky
  // and send their counters back through the ring.
  EXPECT_EQ(layer.last_path(), "dense cublasLt");
  for (int i = 0; i < 3; ++i) layer.forward(x.p, d.m, y.p, Path::automatic, nullptr);
  const std::string last = layer.last_path();
  EXPECT_NE(last.find("(the previous call measured"), std::string::npos) << last;  // the third call ran sticky
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const LayerStats s = layer.stats();
  std::vector<float> want(d.x.size());
  InferenceOptions o;
  o.path = Path::sparse;
  const InferenceReport rep = ffn_infer_host(d.xv(), d.weights(), MatrixF(want.data(), d.m, d.k), o);
  EXPECT_EQ(s.calls, 4);
  EXPECT_EQ(s.sparse_calls, 3) << s.path;
  EXPECT_EQ(s.path, last);
  EXPECT_EQ(s.counted_rows, d.m);
  EXPECT_EQ(s.nnz, rep.nnz);
  EXPECT_EQ(s.overflow_tiles, rep.overflow_tiles);
  EXPECT_EQ(s.overflow_rows, rep.overflow_rows);
  EXPECT_GE(s.overflow_rows, 3) << "the all-active rows overflow";
  EXPECT_GT(s.density, 0);
  EXPECT_LT(s.density, 0.05);
  EXPECT_GE(s.hot_neurons, 0);
  // active: the same count's true share, over the counted rows and the cold neurons.
  EXPECT_DOUBLE_EQ(s.active, static_cast<double>(s.nnz) / (static_cast<double>(s.counted_rows) *
                                                           static_cast<double>(d.n - s.hot_neurons)));
  const LayerStats again = layer.stats();  // nothing new came back: the same measurements
  EXPECT_EQ(again.nnz, s.nnz);
  EXPECT_EQ(again.density, s.density);
  EXPECT_EQ(again.overflow_tiles, s.overflow_tiles);
}

// A dense layer (≈ 30 % non-zeros): every row is over the dense-row threshold (2 %), so the
// dispatch's measure (density) weighs each at its dense cost (1.5 %) and reads far below that, which keeps
// the layer dense; active reads the true share, from the first call's sampled count (a host wait)
// and then from the dense calls' sampled counts that come back through the ring.
TEST(FfnLayer, StatsReadADenseLayersTrueShare) {
  TWELL_REQUIRE_GPU();
  const FfnData d = make_ffn(ffn_case("stats-dense", 4096, 2048, 512, true, 0.3, 13));
  // The true share of x·Wgᵀ > 0 over the rows the dispatch samples (every (M / 2048)-th), per
  // neuron, on the host. Values near zero may land on either side on the GPU (another summation order).
  const std::int64_t stride = std::max<std::int64_t>(1, d.m / 2048);  // ContextOptions::dispatch_sample_rows
  std::vector<std::int64_t> per_neuron(static_cast<std::size_t>(d.n), 0);
  std::int64_t rows = 0;
  for (std::int64_t r = 0; r < d.m; r += stride, ++rows)
    for (std::int64_t j = 0; j < d.n; ++j) {
      float g = 0;
      for (std::int64_t i = 0; i < d.k; ++i) g += d.x[static_cast<std::size_t>(r * d.k + i)] * d.wg[static_cast<std::size_t>(j * d.k + i)];
      per_neuron[static_cast<std::size_t>(j)] += g > 0;
    }
  std::sort(per_neuron.begin(), per_neuron.end(), std::greater<>());
  // The share over the neurons left after the `hot` most active (the layer splits its densest
  // neurons off as hot ones at this density, and then counts the others only).
  const auto cold_share = [&](std::int64_t hot) {
    std::int64_t positive = 0;
    for (std::size_t j = static_cast<std::size_t>(hot); j < per_neuron.size(); ++j) positive += per_neuron[j];
    return static_cast<double>(positive) / (static_cast<double>(rows) * static_cast<double>(d.n - hot));
  };
  const double share = cold_share(0);
  ASSERT_GT(share, 0.05) << "the data should be far over the dense-row threshold";
  FfnLayer layer;
  layer.upload_weights(d.weights(), nullptr);
  Dev<bf16> x(d.x.size()), y(d.x.size());
  up(x, to_bf16_bits(d.x));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  layer.forward(x.p, d.m, y.p, Path::sparse, nullptr);  // a forced call (no count): the row counts' workspace grows
  for (int i = 0; i < 2; ++i) {  // the first call counts and waits; after 9 more, a dense call's count came back
    for (int c = 0; c < (i == 0 ? 1 : 9); ++c) layer.forward(x.p, d.m, y.p, Path::automatic, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const LayerStats s = layer.stats();
    SCOPED_TRACE(testing::Message() << "after " << s.calls << " calls, path " << s.path);
    EXPECT_EQ(s.sparse_calls, 1) << "the forced call only";
    EXPECT_GT(s.density, 0.009) << "over the dispatch's threshold";
    EXPECT_LT(s.density, 0.5 * share) << "rows at their dense cost";
    EXPECT_NEAR(s.active, cold_share(s.hot_neurons), 0.005)
        << "the sampled rows' true share over the cold neurons (" << s.hot_neurons << " hot)";
    EXPECT_EQ(s.nnz, -1) << "no TwELL call counted";
  }
}

// The training forward's overflow counts (they travel with the count it waits for anyway): the
// sm90 TwELL gate reports exactly the all-active rows, every tile of each; a cuBLASLt gate or a
// dense step reports −1.
TEST(FfnLayer, TrainingForwardReportsTwellOverflow) {
  TWELL_REQUIRE_GPU();
  const FfnData d = overflow_data("train-overflow", 1000, 12);
  FfnTrainLayer layer;
  layer.upload_weights(d.weights(), nullptr);
  Dev<bf16> x(d.x.size()), y(d.x.size());
  up(x, to_bf16_bits(d.x));
  const TrainForwardInfo sparse = layer.forward(x.p, d.m, y.p, Path::sparse, nullptr);
  EXPECT_TRUE(sparse.sparse);
  if (sparse.path.find("TwELL") != std::string::npos) {
    EXPECT_EQ(sparse.overflow_rows, 3) << sparse.path;
    EXPECT_EQ(sparse.overflow_tiles, 3 * (1024 / 256)) << sparse.path;
  } else {  // no sm90 TwELL gate on this GPU
    EXPECT_EQ(sparse.overflow_rows, -1) << sparse.path;
    EXPECT_EQ(sparse.overflow_tiles, -1) << sparse.path;
  }
  const TrainForwardInfo dense = layer.forward(x.p, d.m, y.p, Path::dense, nullptr);
  EXPECT_FALSE(dense.sparse);
  EXPECT_EQ(dense.overflow_rows, -1);
  EXPECT_EQ(dense.overflow_tiles, -1);
}

// The step API (plan_step / prepare_step / run_step), as the model runtime drives its decode
// steps: every capturable plan — automatic at decode sizes (1 row: the one-token kernels; 3: the
// GEMV gate + decode kernel; 5: the cuBLASLt gate + the union FFN on compute capability 9.0, else
// the decode kernel), automatic between them and the dispatch minimum (100: the plain dense
// FFN), the dense path (1, 300) — captured into a graph and replayed on fresh input gives bit for
// bit the same step run eagerly, and what forward() on the same path gives. A forced sparse path
// and an automatic size at the dispatch minimum or above are not capturable: prepare_step and
// run_step refuse them.
TEST(FfnLayer, PlannedStepsReplayBitIdentically) {
  TWELL_REQUIRE_GPU();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  struct Step {
    std::int64_t m;
    Path path;
    bool sparse;
  };
  for (const Step c : {Step{1, Path::automatic, true}, Step{3, Path::automatic, true}, Step{5, Path::automatic, true},
                       Step{100, Path::automatic, false},
                       Step{1, Path::dense, false}, Step{300, Path::dense, false}}) {
    SCOPED_TRACE(testing::Message() << "M = " << c.m << ", path " << static_cast<int>(c.path));
    // 0.2 %: ≈ 11 of 5632 a row, far under the decode kernels' 0.8 % (the plan stays sparse).
    const FfnData d = make_ffn(ffn_case("steps", c.m, 5632, 2048, true, 0.002, 31));
    const FfnData fresh = make_ffn(ffn_case("steps", c.m, 5632, 2048, true, 0.002, 32));
    InferWorkspace ws;
    FfnLayer layer(&ws);
    layer.upload_weights(d.weights(), s);
    Dev<bf16> x(d.x.size()), y(d.x.size());
    up(x, to_bf16_bits(d.x));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int w = 0; w < 3; ++w) layer.forward(x.p, c.m, y.p, c.path, s);  // buffers, counts, cuBLASLt plans
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const FfnLayer::StepPlan plan = layer.plan_step(c.m, c.path);
    ASSERT_TRUE(plan.capturable);
    EXPECT_EQ(plan.sparse, c.sparse);
    EXPECT_EQ(plan.m, c.m);
    layer.prepare_step(plan, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaGraphExec_t exec = capture_graph(s, [&] { layer.run_step(x.p, y.p, plan, s); }, "run_step");
    if (!exec) continue;
    up(x, to_bf16_bits(fresh.x));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    layer.run_step(x.p, y.p, plan, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const auto want = down<std::uint16_t>(y);
    layer.forward(x.p, c.m, y.p, c.path, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_TRUE(down<std::uint16_t>(y) == want) << "forward() and run_step differ";
    ASSERT_EQ(cudaMemsetAsync(y.p, 0xff, y.n * sizeof(bf16), s), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_TRUE(down<std::uint16_t>(y) == want) << "the replay differs from the eager step";
    cudaGraphExecDestroy(exec);
  }
  const FfnData d = make_ffn(ffn_case("steps", 8, 1024, 256, true, 0.01, 33));
  FfnLayer layer;
  layer.upload_weights(d.weights(), s);
  Dev<bf16> x(d.x.size()), y(d.x.size());
  for (const auto& [m, path] : {std::pair<std::int64_t, Path>{1, Path::sparse}, {4096, Path::automatic}}) {
    const FfnLayer::StepPlan plan = layer.plan_step(m, path);
    EXPECT_FALSE(plan.capturable) << "M = " << m;
    EXPECT_THROW(layer.prepare_step(plan, s), Error);
    EXPECT_THROW(layer.run_step(x.p, y.p, plan, s), Error);
  }
  EXPECT_THROW(layer.plan_step(0, Path::automatic), Error);
  cudaStreamDestroy(s);
}

// Step graphs of several row counts on one layer, as a server's decode batches come and go: a graph
// captured at 5 rows (the decode kernel) before any larger decode step, and one at 20 rows (the
// union FFN on a compute-capability-9.0 GPU, else the plain dense FFN) captured after the first
// union step, still replay their eager steps' bits after steps of 24 and 32 rows ran in between:
// those move no buffer the graphs read (the layer's decode tickets and the union's h are sized for
// every decode size at their first use), and step_addresses() says so from the 20-row capture on.
TEST(FfnLayer, StepGraphsSurviveLargerSteps) {
  TWELL_REQUIRE_GPU();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const std::int64_t rows = 32, k = 2048;
  const FfnData d = make_ffn(ffn_case("graphs", rows, 5632, k, true, 0.002, 34));
  InferWorkspace ws;
  FfnLayer layer(&ws);
  layer.upload_weights(d.weights(), s);
  Dev<bf16> x(d.x.size()), y(d.x.size());
  up(x, to_bf16_bits(d.x));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  layer.forward(x.p, rows, y.p, Path::dense, s);  // the shared gate and dense buffers at 32 rows
  struct Captured {
    std::int64_t m;
    cudaGraphExec_t exec;
    Bits want;
  };
  std::vector<Captured> graphs;
  std::vector<const void*> addresses;
  std::int64_t bytes = 0;
  const auto capture_at = [&](std::int64_t m) {
    SCOPED_TRACE(testing::Message() << "capture at M = " << m);
    layer.forward(x.p, m, y.p, Path::automatic, s);  // the step's first call: its buffers, its count
    const FfnLayer::StepPlan plan = layer.plan_step(m, Path::automatic);
    ASSERT_TRUE(plan.capturable);
    layer.prepare_step(plan, s);
    layer.run_step(x.p, y.p, plan, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    Bits want = down<std::uint16_t>(y);
    want.resize(static_cast<std::size_t>(m * k));
    addresses = ws.step_addresses();
    bytes = ws.bytes();
    cudaGraphExec_t exec = capture_graph(s, [&] { layer.run_step(x.p, y.p, plan, s); }, "run_step");
    ASSERT_NE(exec, nullptr);
    graphs.push_back({m, exec, std::move(want)});
  };
  capture_at(5);
  capture_at(20);
  for (const std::int64_t m : {std::int64_t{24}, rows}) {  // larger steps, eagerly and through their plans
    layer.forward(x.p, m, y.p, Path::automatic, s);
    const FfnLayer::StepPlan plan = layer.plan_step(m, Path::automatic);
    ASSERT_TRUE(plan.capturable);
    layer.prepare_step(plan, s);
    layer.run_step(x.p, y.p, plan, s);
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(ws.step_addresses() == addresses) << "a larger step moved a buffer the captured steps read";
  EXPECT_EQ(ws.bytes(), bytes) << "a larger step grew the shared scratch (a freed buffer may come back at its old address)";
  for (Captured& g : graphs) {
    SCOPED_TRACE(testing::Message() << "replay at M = " << g.m);
    ASSERT_EQ(cudaMemsetAsync(y.p, 0xff, y.n * sizeof(bf16), s), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(g.exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    Bits got = down<std::uint16_t>(y);
    got.resize(g.want.size());
    EXPECT_TRUE(got == g.want) << "the replay differs from its eager step";
    cudaGraphExecDestroy(g.exec);
  }
  cudaStreamDestroy(s);
}

// The one-token kernel's neuron order (reorder_decode_neurons: forward() reorders at calls 8, 16,
// …, 256 by the counts so far) changes the schedule, not the bits: 300 one-token calls on
// different rows give the same y as a layer with the order off, and so does a captured run_step
// replayed after an explicit reorder.
TEST(FfnLayer, DecodeNeuronOrderKeepsTheBits) {
  TWELL_REQUIRE_GPU();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const std::int64_t rows = 300, n = 5632, k = 2048;
  const FfnData d = make_ffn(ffn_case("order", rows, n, k, true, 0.005, 41));
  FfnLayer on, off;
  on.upload_weights(d.weights(), s);
  off.upload_weights(d.weights(), s);
  off.set_decode_reorder(false, s);
  Dev<bf16> x(d.x.size()), y_on(d.x.size()), y_off(d.x.size());
  up(x, to_bf16_bits(d.x));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (std::int64_t r = 0; r < rows; ++r) {
    on.forward(x.p + r * k, 1, y_on.p + r * k, Path::automatic, s);
    off.forward(x.p + r * k, 1, y_off.p + r * k, Path::automatic, s);
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(on.last_sparse()) << "the one-token kernels did not run";
  const auto want = down<std::uint16_t>(y_off);
  const auto have = down<std::uint16_t>(y_on);
  std::int64_t bad = -1;
  for (std::size_t i = 0; i < want.size() && bad < 0; ++i)
    if (want[i] != have[i]) bad = static_cast<std::int64_t>(i);
  EXPECT_EQ(bad, -1) << "row " << bad / k << " differs";
  const FfnLayer::StepPlan plan = on.plan_step(1, Path::automatic);
  ASSERT_TRUE(plan.capturable && plan.sparse);
  on.prepare_step(plan, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraphExec_t exec = capture_graph(s, [&] { on.run_step(x.p, y_on.p, plan, s); }, "run_step");
  ASSERT_NE(exec, nullptr);
  for (int replay = 0; replay < 3; ++replay) {
    on.reorder_decode_neurons(s);
    ASSERT_EQ(cudaMemsetAsync(y_on.p, 0xff, static_cast<std::size_t>(k) * sizeof(bf16), s), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  const auto replayed = down<std::uint16_t>(y_on);
  EXPECT_TRUE(std::equal(want.begin(), want.begin() + k, replayed.begin())) << "the replay after a reorder differs";
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(s);
}

// set_dense_fold_norm (a one-token dense step's norm inside its [Wg; Wu] GEMV, the down GEMV storing
// r) changes the kernels, not the bits: run_step with a ResidualNorm on a dense plan of one row
// gives the y and the stored r that the layer with the fold off gives (add_rmsnorm, then the step),
// with a first term and without, y aliasing first as the model runtime's does, and so does a
// captured replay. The fold is taken only where asked (folds_dense_norm).
TEST(FfnLayer, DenseFoldedNormKeepsTheBits) {
  TWELL_REQUIRE_GPU();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const std::int64_t n = 5632, k = 2048;
  const FfnData d = make_ffn(ffn_case("dense_fold", 4, n, k, true, 0.3, 43));
  FfnLayer on, off;
  on.upload_weights(d.weights(), s);
  off.upload_weights(d.weights(), s);
  on.set_dense_fold_norm(true);
  const FfnLayer::StepPlan plan = on.plan_step(1, Path::dense);
  ASSERT_TRUE(plan.capturable && !plan.sparse);
  EXPECT_TRUE(on.folds_dense_norm(plan));
  EXPECT_FALSE(off.folds_dense_norm(plan));
  on.prepare_step(plan, s);
  off.prepare_step(plan, s);
  // r, first and delta: rows 0, 1 and 2 of the case's x (bf16-exact values; r as fp32 × 3).
  std::vector<float> r(static_cast<std::size_t>(k)), w(static_cast<std::size_t>(k));
  for (std::int64_t c = 0; c < k; ++c) {
    r[static_cast<std::size_t>(c)] = 3.0f * d.x[static_cast<std::size_t>(c)];
    w[static_cast<std::size_t>(c)] = 0.5f + static_cast<float>(c % 7) / 7.0f;
  }
  const Bits xb = to_bf16_bits(d.x);
  const Bits first(xb.begin() + k, xb.begin() + 2 * k), delta(xb.begin() + 2 * k, xb.begin() + 3 * k);
  Dev<float> r_on(r.size()), r_off(r.size()), dw(w.size());
  Dev<bf16> y_on(static_cast<std::size_t>(k)), y_off(y_on.n), dd(y_on.n), x_scratch(y_on.n);
  up(dw, w);
  up(dd, delta);
  for (const bool with_first : {true, false}) {
    SCOPED_TRACE(with_first ? "with first" : "without first");
    up(r_on, r);
    up(r_off, r);
    up(y_on, first);  // y aliases first (the runtime's ffn_y)
    up(y_off, first);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto norm = [&](Dev<float>& rr, Dev<bf16>& yy) {
      FfnLayer::ResidualNorm in;
      in.r = rr.p;
      in.first = with_first ? yy.p : nullptr;
      in.delta = dd.p;
      in.w = dw.p;
      in.eps = 1e-5f;
      return in;
    };
    on.run_step(norm(r_on, y_on), x_scratch.p, y_on.p, plan, s);
    off.run_step(norm(r_off, y_off), x_scratch.p, y_off.p, plan, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_TRUE(down<std::uint16_t>(y_on) == down<std::uint16_t>(y_off)) << "y differs with the fold";
    EXPECT_TRUE(down<std::uint32_t>(r_on) == down<std::uint32_t>(r_off)) << "the stored r differs with the fold";
    EXPECT_FALSE(down<float>(r_on) == r) << "r was not stored";
  }
  // A captured replay of the folded step on fresh r and y gives the eager step's bits.
  up(r_on, r);
  up(y_on, first);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  FfnLayer::ResidualNorm in;
  in.r = r_on.p;
  in.first = y_on.p;
  in.delta = dd.p;
  in.w = dw.p;
  in.eps = 1e-5f;
  on.run_step(in, x_scratch.p, y_on.p, plan, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  const auto want_y = down<std::uint16_t>(y_on);
  const auto want_r = down<std::uint32_t>(r_on);
  up(r_on, r);
  up(y_on, first);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaGraphExec_t exec = capture_graph(s, [&] { on.run_step(in, x_scratch.p, y_on.p, plan, s); }, "run_step");
  ASSERT_NE(exec, nullptr);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(down<std::uint16_t>(y_on) == want_y) << "the replay's y differs";
  EXPECT_TRUE(down<std::uint32_t>(r_on) == want_r) << "the replay's r differs";
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(s);
}

TEST(FfnLayer, MisuseIsAnError) {
  TWELL_REQUIRE_GPU();
  FfnTrainLayer t;
  Dev<bf16> x(64 * 128), y(64 * 128);
  EXPECT_THROW(t.forward(x.p, 64, y.p, Path::automatic, nullptr), Error);  // no weights yet
  EXPECT_THROW(t.load_weights(DeviceWeights{}, nullptr), Error);            // null weights
  const FfnData d = make_ffn(case_of(64, 256, 128, true, 6));
  t.upload_weights(d.weights(), nullptr);
  Dev<float> g(256 * 128);
  EXPECT_THROW(t.gradients_to({g.p}, {g.p}, {g.p}, nullptr), Error);  // no backward yet
  EXPECT_THROW(t.backward(x.p, x.p, 64, 0.0, y.p, nullptr), Error);     // no forward yet
  FfnLayer f;
  EXPECT_THROW(f.forward(x.p, 64, y.p, Path::automatic, nullptr), Error);
  for (const std::int64_t rows : {std::int64_t{-1}, std::int64_t{1}, std::int64_t{65}}) EXPECT_THROW(f.set_union_min_rows(rows), Error) << rows;
  for (const std::int64_t rows : {std::int64_t{-1}, std::int64_t{65}}) EXPECT_THROW(f.set_union_max_rows(rows), Error) << rows;
  f.set_union_min_rows(0);
  f.set_union_min_rows(8);
  f.set_union_max_rows(0);
  EXPECT_EQ(f.union_min_rows(), 8);
  EXPECT_EQ(f.union_max_rows(), 0);
  using UK = FfnLayer::UnionKernels;
  for (const UK& k : {UK{3, 8, 0}, UK{8, 0, 0}, UK{16, 8, 0}, UK{8, 8, -1}})
    EXPECT_THROW(f.set_union_kernels(k), Error) << k.up_split << " " << k.down_split << " " << k.up_clusters;
  EXPECT_EQ(f.union_kernels().up_split, 8);  // unchanged by the refusals
  f.set_union_kernels({4, 2, 16});
  EXPECT_EQ(f.union_kernels().up_split, 4);
  EXPECT_EQ(f.union_kernels().down_split, 2);
  EXPECT_EQ(f.union_kernels().up_clusters, 16);
  EXPECT_EQ(f.decode_gemv_max_rows(), 3);  // the default: the GEMV's gate below the union's 4 rows, cuBLASLt's from there
  for (const std::int64_t rows : {std::int64_t{0}, std::int64_t{17}}) EXPECT_THROW(f.set_decode_gemv_max_rows(rows), Error) << rows;
  EXPECT_EQ(f.decode_gemv_max_rows(), 3);  // unchanged by the refusals
  f.set_decode_gemv_max_rows(16);
  EXPECT_EQ(f.decode_gemv_max_rows(), 16);
}

}  // namespace
}  // namespace twell::cuda::test
