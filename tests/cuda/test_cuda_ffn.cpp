// CUDA FFN inference vs the float64 CPU oracle (twell::ref::ffn_forward), and the GPU-built TwELL
// words vs the host encoder (twell::twell_encode), over shapes that hit the edges: one row, rows
// straddling 256, N not a multiple of the tile, K not a multiple of 64, empty rows, all-active rows,
// hot rows that overflow tiles, S = 32 and 64.
//
// Tolerance (max over compared rows of ‖y − y_ref‖₂ / ‖y_ref‖₂): 1e-2. Reasoning: inputs are
// bf16-exact, so the GPU differs from the float64 reference only by (a) fp32 accumulation over
// K ≤ 4096 or N terms (~1e-6 relative), (b) y rounded to bf16 once (≤ 2⁻⁹ per element), (c) on the
// dense path h = g ⊙ u stored in bf16 (≤ 2⁻⁹ per term, reference run without activation rounding),
// (d) on the sparse path g rounded to bf16 from an fp32 rather than fp64 value (the reference rounds
// g too, round_activation_bf16 = true): at most one bf16 ulp (2⁻⁸) on rare terms. (b)+(c)+(d) stay
// below ~5e-3 per row; 1e-2 leaves a 2× margin while a single wrong or missing non-zero (each term
// carries ~1/sqrt(nnz) of the row's norm) or a garbage row fails by orders of magnitude. An empty
// row must be exactly zero (rel_error is then ∞ for any non-zero output).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <limits>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/ffn_context.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/ops/gemv.hpp"
#include "cuda/sm90/union_ffn.hpp"
#include "cuda_test_util.hpp"
#include "twell/cpu/reference.hpp"
#include "twell/twell_format.hpp"

namespace twell::cuda::test {
namespace {

constexpr double kTol = 1e-2;
constexpr std::size_t kGuard = 256;              // guard elements after every output buffer
constexpr std::uint16_t kGuardBits = 0x7e7e;     // a bf16 sentinel no kernel writes by chance
constexpr std::uint16_t kPoisonBits = 0xffff;    // bf16 NaN

// The host's active sets of d's first `rows` rows (cases made with exact_preactivation): row r,
// neuron j active iff its exact pre-activation — x · Wg, or x · Wu non-gated — is positive.
std::vector<std::vector<char>> exact_active(const FfnData& d, std::int64_t rows) {
  const std::vector<float>& w1 = d.gated ? d.wg : d.wu;
  std::vector<std::vector<char>> active(static_cast<std::size_t>(rows), std::vector<char>(static_cast<std::size_t>(d.n)));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < d.n; ++j) {
      double a = 0;
      for (std::int64_t kk = 0; kk < d.k; ++kk)
        a += static_cast<double>(d.x[static_cast<std::size_t>(r * d.k + kk)]) * w1[static_cast<std::size_t>(j * d.k + kk)];
      active[static_cast<std::size_t>(r)][static_cast<std::size_t>(j)] = a > 0;
    }
  return active;
}
// How many of them are active in all.
std::int64_t count_active(const std::vector<std::vector<char>>& active) {
  std::int64_t t = 0;
  for (const auto& row : active)
    for (const char a : row) t += a != 0;
  return t;
}

struct Outputs {
  std::vector<float> y;
  bool guard_ok = true;
};

// Whether the current device runs the union FFN (sm90/union_ffn.hpp; false without a device).
bool union_ffn_here() {
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && union_ffn_available(dev);
}

// Runs `body(y)` on a poisoned y [m, k] followed by guard elements, downloads y and checks guards.
template <typename F>
Outputs run_poisoned(std::int64_t m, std::int64_t k, cudaStream_t s, F&& body) {
  const std::size_t n = static_cast<std::size_t>(m * k);
  DeviceBuffer<__nv_bfloat16> y(n + kGuard);
  std::vector<std::uint16_t> init(n + kGuard, kPoisonBits);
  std::fill(init.begin() + static_cast<std::ptrdiff_t>(n), init.end(), kGuardBits);
  EXPECT_EQ(::twell::cuda::test::h2d(y.get(), init.data(), init.size() * 2), cudaSuccess);
  body(y.get());
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<std::uint16_t> out(n + kGuard);
  EXPECT_EQ(cudaMemcpy(out.data(), y.get(), out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  Outputs o;
  o.y.resize(n);
  for (std::size_t i = 0; i < n; ++i) o.y[i] = to_float(bf16{out[i]});
  for (std::size_t i = n; i < out.size(); ++i) o.guard_ok &= out[i] == kGuardBits;
  return o;
}

double max_err_rows(const std::vector<float>& y, const std::vector<double>& ref, const std::vector<std::int64_t>& rows,
                    std::int64_t k, std::int64_t* worst_row) {
  double worst = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double e = ref::rel_error(y.data() + rows[i] * k, ref.data() + static_cast<std::int64_t>(i) * k, k);
    if (!(e <= worst)) {
      worst = e;
      *worst_row = rows[i];
    }
  }
  return worst;
}

class CudaFfn : public ::testing::TestWithParam<FfnCase> {
 protected:
  void SetUp() override { TWELL_REQUIRE_GPU(); }
};

// The context's gate buffer (rows [0, m), columns [0, N)) as fp32 on the host.
std::vector<float> download_gate(const FfnContext& ctx, std::int64_t m) {
  std::vector<std::uint16_t> gb(static_cast<std::size_t>(m * ctx.ldn()));
  EXPECT_EQ(cudaMemcpy(gb.data(), ctx.gate_values(), gb.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> g(static_cast<std::size_t>(m * ctx.n()));
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t col = 0; col < ctx.n(); ++col)
      g[static_cast<std::size_t>(r * ctx.n() + col)] = to_float(bf16{gb[static_cast<std::size_t>(r * ctx.ldn() + col)]});
  return g;
}

// One gate_twell's results, downloaded: TwELL words, counters, flagged rows.
struct GateWords {
  std::vector<std::uint32_t> words;
  TwellCounters counters{};
  std::vector<std::int64_t> flagged;
};

GateWords download_gate_words(FfnContext& ctx, std::int64_t m, cudaStream_t s) {
  GateWords g;
  g.counters = ctx.read_counters(s);
  g.words.resize(static_cast<std::size_t>(m * ctx.tiles() * ctx.words_per_tile()));
  EXPECT_EQ(cudaMemcpy(g.words.data(), ctx.twell_words(), g.words.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<std::uint32_t> flags(static_cast<std::size_t>(m));
  EXPECT_EQ(cudaMemcpy(flags.data(), ctx.row_overflow(), flags.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (std::int64_t r = 0; r < m; ++r)
    if (flags[static_cast<std::size_t>(r)]) g.flagged.push_back(r);
  return g;
}

// Two gate_twell results of the same input are identical: words, counters and flagged rows.
void expect_same_gate_words(const GateWords& a, const GateWords& b, const char* what) {
  EXPECT_TRUE(a.words == b.words) << what << ": TwELL words differ";
  EXPECT_EQ(a.counters.nnz, b.counters.nnz) << what;
  EXPECT_EQ(a.counters.overflow_tiles, b.counters.overflow_tiles) << what;
  EXPECT_EQ(a.counters.overflow_rows, b.counters.overflow_rows) << what;
  EXPECT_EQ(a.flagged, b.flagged) << what;
}

// gate_twell of a fresh context with options `o` (whose gate buffer must end up holding every
// value: the cuBLASLt gate does, the sm90 gate with gate_store_values): its words, counters and
// flags equal the host encoder's on the downloaded gate.
GateWords check_gate_words(const FfnCase& c, const FfnWeights& w, const __nv_bfloat16* x, const ContextOptions& o,
                           cudaStream_t s) {
  FfnContext ctx(o);
  ctx.upload_weights(w, s);
  ctx.gate_twell(x, c.m, s);
  const GateWords g = download_gate_words(ctx, c.m, s);
  const char* which = ctx.gate_sm90_active() ? "sm90 gate GEMM + TwELL epilogue" : "cublasLt gate + twell_pack";
  const std::vector<float> gv = download_gate(ctx, c.m);
  const TwellMatrix host = twell_encode(CMatrixF(gv.data(), c.m, c.n), o.twell, /*relu=*/true);
  twell_validate(host);
  EXPECT_EQ(host.words.size(), g.words.size());
  std::size_t first_bad = g.words.size();
  for (std::size_t i = 0; i < std::min(g.words.size(), host.words.size()); ++i)
    if (g.words[i] != host.words[i]) {
      first_bad = i;
      break;
    }
  EXPECT_EQ(first_bad, g.words.size()) << which << ": TwELL word differs from the host encoder at word " << first_bad;
  EXPECT_EQ(static_cast<std::int64_t>(g.counters.nnz), host.nnz()) << which;
  EXPECT_EQ(static_cast<std::int64_t>(g.counters.overflow_tiles), host.overflow_tiles) << which;
  EXPECT_EQ(static_cast<std::int64_t>(g.counters.overflow_rows), static_cast<std::int64_t>(host.overflow_rows.size())) << which;
  EXPECT_EQ(g.flagged, host.overflow_rows) << which;
  return g;
}

// The sm90 gate GEMM + TwELL epilogue (the context's default on sm_90):
// (1) its gate values against float64 x·Wᵀ on sampled rows. Bound per element: fp32 accumulation
//     over K terms, |Σ̂ − Σ| ≤ K·2⁻²⁴·Σ|x·w| (the classic γ_K bound), then one bf16 rounding,
//     ≤ 2⁻⁹·|g|; checked as |g − ReLU(ref)| ≤ 2⁻⁸·ReLU(ref) + K·2⁻²⁴·Σ|x·w| + 1e-30, which also
//     pins the keep decision wherever the reference is clear of zero;
// (2) its words, counters and flags equal the host encoder's on those values (check_gate_words);
// (3) without gate_store_values (how the sparse path runs it: `ctx`), the same words, counters and
//     flags, and the gate buffer's overflowed blocks hold exactly the values (the fused kernel's
//     overflow fallback reads them there); y through the sparse path is exact.
void check_gate_sm90(const FfnCase& c, const FfnData& d, const FfnWeights& w, const __nv_bfloat16* x,
                     const ContextOptions& opt, FfnContext& ctx, const std::vector<double>& ref_sparse,
                     const std::vector<std::int64_t>& rows, cudaStream_t s) {
  ContextOptions so = opt;
  so.gate_store_values = true;
  FfnContext sc(so);
  sc.upload_weights(w, s);
  sc.gate_twell(x, c.m, s);
  const std::vector<float> g = download_gate(sc, c.m);
  const CMatrixF wt = d.gated ? w.w_gate : w.w_up;
  double worst = 0;
  std::int64_t bad = 0;
  for (std::int64_t r : sample_rows(d, 16, c.seed + 3)) {
    for (std::int64_t col = 0; col < c.n; ++col) {
      double acc = 0, mag = 0;
      for (std::int64_t kk = 0; kk < c.k; ++kk) {
        const double t = static_cast<double>(d.x[static_cast<std::size_t>(r * c.k + kk)]) * static_cast<double>(wt(col, kk));
        acc += t;
        mag += std::abs(t);
      }
      const double ref = std::max(acc, 0.0);
      const double got = g[static_cast<std::size_t>(r * c.n + col)];
      const double bound = std::ldexp(ref, -8) + static_cast<double>(c.k) * std::ldexp(mag, -24) + 1e-30;
      worst = std::max(worst, std::abs(got - ref) / bound);
      bad += std::abs(got - ref) > bound;
    }
  }
  EXPECT_EQ(bad, 0) << "sm90 gate values outside the fp32-accumulation + bf16-rounding bound (worst ratio " << worst << ")";
  const GateWords sw = check_gate_words(c, w, x, so, s);
  ctx.gate_twell(x, c.m, s);
  const GateWords cw = download_gate_words(ctx, c.m, s);
  expect_same_gate_words(cw, sw, "sm90 gate with and without the stored gate");
  const std::vector<float> backup = download_gate(ctx, c.m);
  const std::int64_t S = ctx.words_per_tile(), tiles = ctx.tiles();
  std::int64_t blocks = 0, wrong = 0;
  for (std::int64_t r : cw.flagged)
    for (std::int64_t t = 0; t < tiles; ++t) {
      if (cw.words[static_cast<std::size_t>((r * tiles + t) * S)] <= static_cast<std::uint32_t>(S - 1)) continue;
      ++blocks;
      for (std::int64_t col = t * kTwellTile; col < std::min<std::int64_t>(c.n, (t + 1) * kTwellTile); ++col) {
        const std::size_t i = static_cast<std::size_t>(r * c.n + col);
        wrong += std::memcmp(&backup[i], &g[i], sizeof(float)) != 0;
      }
    }
  EXPECT_EQ(wrong, 0) << "sm90 gate: overflowed blocks' values in the gate buffer";
  ForwardResult fr;
  const Outputs o = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = ctx.forward(x, c.m, y, Path::sparse, s); });
  EXPECT_TRUE(o.guard_ok) << "sm90 gate: write past the end of y";
  std::int64_t worst_row = -1;
  const double err = max_err_rows(o.y, ref_sparse, rows, c.k, &worst_row);
  EXPECT_LE(err, kTol) << "sparse path with the sm90 gate (" << fr.path() << "): worst row " << worst_row;
  std::printf("[case %s] sm90 gate (%s staging, heavy rows by %s, words from %s): values within bound (worst ratio %.3f), words as the host encoder's, %lld overflowed blocks backed up; y max row rel err %.2e\n",
              c.name.c_str(), opt.gate_sm90_stmatrix ? "stmatrix" : "st.shared", opt.gate_sm90_heavy_rows ? "warp" : "lane",
              opt.gate_sm90_word_masks ? "masks" : "a scan", worst,
              static_cast<long long>(blocks), err);
}

// `calls` automatic forwards of ctx on x into a poisoned y, each in bounds and exact on `rows` (the
// reference of the path it ran); returns the last call's path.
std::string check_automatic_calls(const FfnCase& c, FfnContext& ctx, const __nv_bfloat16* x, int calls, const char* what,
                                  const std::vector<double>& ref_sparse, const std::vector<double>& ref_dense,
                                  const std::vector<std::int64_t>& rows, cudaStream_t s) {
  ForwardResult fr;
  for (int call = 0; call < calls; ++call) {
    const Outputs o = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = ctx.forward(x, c.m, y, Path::automatic, s); });
    std::int64_t worst_row = -1;
    const double err = max_err_rows(o.y, fr.sparse ? ref_sparse : ref_dense, rows, c.k, &worst_row);
    EXPECT_TRUE(o.guard_ok) << what << ": write past the end of y";
    EXPECT_LE(err, kTol) << what << ", call " << call << " (" << fr.path() << "): worst row " << worst_row;
  }
  return fr.path();
}

// Dense rows (sm80/twell_dense_rows.hpp) with the threshold at ~0 (every non-empty row is hot) and
// at 1.5 % of N, the capacity at M (every hot row dense) and at 3 (the rest stay sparse; padding
// rows when fewer): the plan's counts equal the host's from the TwELL count words, y is within the
// tolerance on the sampled rows plus rows that ran dense and hot rows past the capacity, and a
// second call gives the same y bit for bit. Then automatic calls that learn the capacity.
void check_dense_rows(const FfnCase& c, const FfnData& d, const FfnWeights& w, const __nv_bfloat16* x,
                      const ContextOptions& opt, const std::vector<double>& ref_sparse,
                      const std::vector<double>& ref_dense, const std::vector<std::int64_t>& rows, cudaStream_t s) {
  ref::Options rounded;
  rounded.round_activation_bf16 = true;
  for (const double density : {1e-9, 0.015}) {
    for (const std::int64_t cap : {c.m, std::int64_t{3}}) {
      ContextOptions o = opt;
      o.dense_rows_density = density;
      o.dense_rows_capacity = cap;
      FfnContext ctx(o);
      ctx.upload_weights(w, s);
      ForwardResult fr;
      const Outputs o1 = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = ctx.forward(x, c.m, y, Path::sparse, s); });
      const FfnContext::DenseRowsInfo info = ctx.read_dense_rows(s);
      const GateWords gw = download_gate_words(ctx, c.m, s);
      const std::int64_t S = ctx.words_per_tile(), tiles = ctx.tiles();
      const auto row_cap = static_cast<std::uint64_t>(density * static_cast<double>(c.n));
      std::vector<std::int64_t> hot;
      for (std::int64_t r = 0; r < c.m; ++r) {
        std::uint64_t cnt = 0;
        for (std::int64_t t = 0; t < tiles; ++t) cnt += gw.words[static_cast<std::size_t>((r * tiles + t) * S)];
        if (cnt > row_cap) hot.push_back(r);
      }
      const auto dense = std::min<std::int64_t>(static_cast<std::int64_t>(hot.size()), cap);
      EXPECT_TRUE(info.counted) << "dense rows not planned (" << fr.path() << ")";
      EXPECT_EQ(info.capacity, std::min(cap, c.m));
      EXPECT_EQ(info.hot, hot.size()) << "rows over " << row_cap << " non-zeros";
      EXPECT_EQ(static_cast<std::int64_t>(info.dense), dense);
      EXPECT_EQ(info.nnz, gw.counters.nnz);
      // The first rows that ran dense and the first hot rows past the capacity (still sparse).
      std::vector<std::int64_t> extra;
      for (std::int64_t i = 0; i < std::min<std::int64_t>(dense, 3); ++i) extra.push_back(hot[static_cast<std::size_t>(i)]);
      for (std::int64_t i = dense; i < std::min<std::int64_t>(dense + 2, static_cast<std::int64_t>(hot.size())); ++i)
        extra.push_back(hot[static_cast<std::size_t>(i)]);
      std::int64_t worst_row = -1;
      double err = max_err_rows(o1.y, ref_sparse, rows, c.k, &worst_row);
      if (!extra.empty()) {
        const auto ref_extra = ref::ffn_forward(d.xv(), w, extra, rounded);
        std::int64_t wr = -1;
        const double e = max_err_rows(o1.y, ref_extra, extra, c.k, &wr);
        if (!(e <= err)) {
          err = e;
          worst_row = wr;
        }
      }
      EXPECT_TRUE(o1.guard_ok) << "dense rows: write past the end of y";
      EXPECT_LE(err, kTol) << "dense rows (threshold " << row_cap << ", capacity " << cap << ", " << fr.path()
                           << "): worst row " << worst_row;
      const Outputs o2 = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { ctx.forward(x, c.m, y, Path::sparse, s); });
      EXPECT_TRUE(std::memcmp(o1.y.data(), o2.y.data(), o1.y.size() * sizeof(float)) == 0) << "dense rows: not reproducible";
      std::printf("[case %s] dense rows (over %llu non-zeros, capacity %lld): %llu hot, %llu dense, max row rel err %.2e\n",
                  c.name.c_str(), static_cast<unsigned long long>(row_cap), static_cast<long long>(cap),
                  static_cast<unsigned long long>(info.hot), static_cast<unsigned long long>(info.dense), err);
    }
  }
  // Automatic, capacity learned from the counts of earlier calls (any share of hot rows engages).
  ContextOptions a = opt;
  a.dense_rows_min = 1;
  FfnContext ac(a);
  ac.upload_weights(w, s);
  const std::string path = check_automatic_calls(c, ac, x, 3, "automatic with dense rows", ref_sparse, ref_dense, rows, s);
  std::printf("[case %s] automatic with dense rows: \"%s\"\n", c.name.c_str(), path.c_str());
}

// Hot neurons (sm80/twell_hot_neurons.hpp). count_neurons equals the host's count of the gate it
// leaves behind, in the original numbering also after the weights were permuted; choose_hot_neurons
// takes exactly the neurons over its threshold (when they are more than the maximum share, the
// densest that many or none, as hot_neurons_densest_share says). Then, with the split at every M, for hot sets of
// the most active quarter (cold count rounded by counts), a random third (rounded by position), every
// neuron and none: hot_count() and hot_neurons() as documented, and y within the tolerance through
// the sparse, automatic (twice) and dense paths, with dense rows on the cold part; the sparse path
// reproducible bit for bit. Last, automatic calls that calibrate the split themselves.
void check_hot_neurons(const FfnCase& c, const FfnWeights& w, const __nv_bfloat16* x, const ContextOptions& opt,
                       const std::vector<double>& ref_sparse, const std::vector<double>& ref_dense,
                       const std::vector<std::int64_t>& rows, cudaStream_t s) {
  ContextOptions o = opt;
  o.hot_neurons_auto = false;
  o.hot_neurons_min_rows = 1;
  o.dense_rows_min = 1;
  FfnContext ctx(o);
  ctx.upload_weights(w, s);
  const std::vector<std::uint32_t> counts = ctx.count_neurons(x, c.m, s);
  {
    const std::vector<float> g = download_gate(ctx, c.m);
    std::vector<std::uint32_t> host(static_cast<std::size_t>(c.n), 0);
    for (std::int64_t r = 0; r < c.m; ++r)
      for (std::int64_t col = 0; col < c.n; ++col) host[static_cast<std::size_t>(col)] += g[static_cast<std::size_t>(r * c.n + col)] > 0;
    EXPECT_TRUE(counts == host) << "count_neurons differs from the host's count of the gate";
  }
  std::vector<std::int64_t> by_count(static_cast<std::size_t>(c.n));
  for (std::int64_t i = 0; i < c.n; ++i) by_count[static_cast<std::size_t>(i)] = i;
  std::stable_sort(by_count.begin(), by_count.end(), [&](std::int64_t a, std::int64_t b) {
    return counts[static_cast<std::size_t>(a)] > counts[static_cast<std::size_t>(b)];
  });
  // The threshold rule: hot iff count > density · m, at a threshold a quarter and three quarters of
  // the way down; over the maximum share, none or the densest (ties to the lower index).
  for (const std::int64_t at : {c.n / 4, 3 * c.n / 4})
    for (const bool densest : {false, true}) {
      const std::uint32_t q = counts[static_cast<std::size_t>(by_count[static_cast<std::size_t>(at)])];
      ContextOptions to = o;
      to.hot_neurons_density = to.hot_neurons_density_nongated = (static_cast<double>(q) + 0.5) / static_cast<double>(c.m);  // count > q
      to.hot_neurons_densest_share = densest;
      FfnContext tc(to);
      tc.upload_weights(w, s);
      std::vector<std::int64_t> want;
      for (std::int64_t i = 0; i < c.n; ++i)
        if (counts[static_cast<std::size_t>(i)] > q) want.push_back(i);
      const double max_hot = std::min(to.hot_neurons_max_share * static_cast<double>(c.n), static_cast<double>((c.n + 7) / 8 * 4 - 16));
      if (static_cast<double>(want.size()) > max_hot) {
        // by_count is ordered by count (descending), then index: the qualifying neurons are its prefix.
        want.assign(by_count.begin(), by_count.begin() + (densest && max_hot >= 1 ? static_cast<std::ptrdiff_t>(max_hot) : 0));
        std::sort(want.begin(), want.end());
      }
      EXPECT_EQ(tc.choose_hot_neurons(counts, c.m), want) << "threshold at position " << at << ", densest " << densest;
    }
  std::mt19937_64 rng(c.seed + 99);
  std::vector<std::int64_t> third;
  for (std::int64_t i = 0; i < c.n; ++i)
    if (rng() % 3 == 0) third.push_back(i);
  std::vector<std::int64_t> all(static_cast<std::size_t>(c.n));
  for (std::int64_t i = 0; i < c.n; ++i) all[static_cast<std::size_t>(i)] = i;
  struct Set {
    const char* name;
    std::vector<std::int64_t> hot;
    bool with_counts;
  };
  const std::vector<Set> sets = {
      {"most active quarter", std::vector<std::int64_t>(by_count.begin(), by_count.begin() + c.n / 4), true},
      {"random third", third, false},
      {"every neuron", all, false},
      {"none", {}, false}};
  for (const Set& set : sets) {
    ctx.set_hot_neurons(set.hot, s, set.with_counts ? &counts : nullptr);
    const auto requested = static_cast<std::int64_t>(set.hot.size());
    const std::int64_t cold = (c.n - requested) / 8 * 8;
    const std::int64_t want_hot = requested == 0 || cold == 0 ? 0 : c.n - cold;
    EXPECT_EQ(ctx.hot_count(), want_hot) << set.name;
    const std::vector<std::int64_t> got = ctx.hot_neurons();
    EXPECT_EQ(static_cast<std::int64_t>(got.size()), want_hot) << set.name;
    if (want_hot > 0) {
      for (const std::int64_t i : set.hot)
        EXPECT_TRUE(std::binary_search(got.begin(), got.end(), i)) << set.name << ": neuron " << i << " not hot";
    }
    // The per-neuron counts survive the permutation.
    EXPECT_TRUE(ctx.count_neurons(x, c.m, s) == counts) << set.name << ": counts after the permutation";
    // The last two calls: the same dense-row capacity (learned by the calls before), so bit for bit.
    std::vector<std::vector<float>> sparse_y;
    for (Path path : {Path::sparse, Path::automatic, Path::automatic, Path::dense, Path::sparse, Path::sparse}) {
      ForwardResult fr;
      const Outputs out = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = ctx.forward(x, c.m, y, path, s); });
      EXPECT_TRUE(out.guard_ok) << "hot neurons (" << set.name << "): write past the end of y";
      std::int64_t worst_row = -1;
      const double err = max_err_rows(out.y, fr.sparse ? ref_sparse : ref_dense, rows, c.k, &worst_row);
      EXPECT_LE(err, kTol) << "hot neurons (" << set.name << ", " << fr.path() << "): worst row " << worst_row;
      if (path == Path::sparse) {
        sparse_y.push_back(out.y);
        if (sparse_y.size() == 1) {
          EXPECT_EQ(ctx.sparse_n(c.m), c.n - want_hot);
          EXPECT_EQ(fr.path().find("neurons (the hot ones) dense") != std::string::npos, want_hot > 0) << fr.path();
          std::printf("[case %s] hot neurons (%s): %lld hot, \"%s\", max row rel err %.2e\n", c.name.c_str(), set.name,
                      static_cast<long long>(want_hot), fr.path().c_str(), err);
        }
      }
    }
    ASSERT_EQ(sparse_y.size(), 3u);
    EXPECT_TRUE(std::memcmp(sparse_y[1].data(), sparse_y[2].data(), sparse_y[1].size() * sizeof(float)) == 0)
        << "hot neurons (" << set.name << "): sparse path not reproducible";
  }
  {  // The hot part on one stream gives the same bits as beside the cold part (hot_overlap, the
     // default); a fixed dense-row capacity, so that both calls plan the same rows.
    std::vector<std::vector<float>> ys;
    for (const bool overlap : {true, false}) {
      ContextOptions vo = o;
      vo.hot_overlap = overlap;
      vo.dense_rows_capacity = c.m;
      FfnContext v(vo);
      v.upload_weights(w, s);
      v.set_hot_neurons(third, s);
      ys.push_back(run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { v.forward(x, c.m, y, Path::sparse, s); }).y);
    }
    EXPECT_TRUE(std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * sizeof(float)) == 0)
        << "hot neurons (random third): one stream and overlapped differ";
    // The hot [g | u] GEMM and product by cuBLASLt + the elementwise kernel instead of the sm90
    // gated-product kernel (hot_product_sm90, the default where it runs): the same arithmetic with
    // the GEMM's sums in another order, so within the tolerance, not bit for bit.
    ContextOptions lo = o;
    lo.hot_product_sm90 = !o.hot_product_sm90;
    lo.dense_rows_capacity = c.m;
    FfnContext lt(lo);
    lt.upload_weights(w, s);
    lt.set_hot_neurons(third, s);
    ForwardResult fr;
    const Outputs out = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = lt.forward(x, c.m, y, Path::sparse, s); });
    EXPECT_TRUE(out.guard_ok) << "hot neurons (random third, other hot product): write past the end of y";
    std::int64_t worst_row = -1;
    EXPECT_LE(max_err_rows(out.y, ref_sparse, rows, c.k, &worst_row), kTol)
        << "hot neurons (random third, hot_product_sm90 " << lo.hot_product_sm90 << "): worst row " << worst_row;
  }
  // Automatic calibration on the first automatic call (threshold at the quarter's count).
  ContextOptions ao = o;
  ao.hot_neurons_auto = true;
  const std::uint32_t q = counts[static_cast<std::size_t>(by_count[static_cast<std::size_t>(c.n / 4)])];
  ao.hot_neurons_density = ao.hot_neurons_density_nongated = (static_cast<double>(q) + 0.5) / static_cast<double>(c.m);  // count > q
  FfnContext ac(ao);
  ac.upload_weights(w, s);
  check_automatic_calls(c, ac, x, 2, "automatic with calibrated hot neurons", ref_sparse, ref_dense, rows, s);
  // Chosen over all rows, then again over the rows still sparse after the first choice (hot tokens
  // left out): the second set is within the first's candidates, up to the ≤ 7 that round the cold
  // count to a multiple of 8, and at most half of the neurons.
  std::int64_t over = 0;
  for (const std::uint32_t v : counts) over += v > q;
  const std::vector<std::int64_t> got = ac.hot_neurons();
  std::int64_t outside = 0;
  for (const std::int64_t i : got) outside += counts[static_cast<std::size_t>(i)] <= q;
  EXPECT_LE(outside, 7) << "automatic calibration: hot neurons under the threshold";
  EXPECT_LE(static_cast<std::int64_t>(got.size()), std::min(over + 7, (c.n + 7) / 8 * 4)) << "automatic calibration";
  EXPECT_EQ(ac.hot_count(), static_cast<std::int64_t>(got.size()));
  std::printf("[case %s] automatic calibration: %zu hot neurons (%lld over the threshold in all rows)\n", c.name.c_str(),
              got.size(), static_cast<long long>(over));
}

TEST_P(CudaFfn, MatchesReferenceAndHostEncoder) {
  const FfnCase c = GetParam();
  const FfnData d = make_ffn(c);
  const FfnWeights w = d.weights();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);

  ContextOptions opt;
  opt.twell.compression = c.compression;
  opt.dispatch_min_rows = 0;  // exercise the sampled-count dispatch at every M
  opt.updown_variant = opt.updown_variant_nongated = 0;
  opt.gate_chunks = 1;  // the unchunked gate here; the chunked one is compared with it below
  opt.hot_neurons_auto = false;  // every neuron sparse here; check_hot_neurons splits them
  FfnContext ctx(opt);
  ctx.upload_weights(w, s);
  const auto xb = to_bf16_bits(d.x);
  DeviceBuffer<__nv_bfloat16> x(xb.size());
  ASSERT_EQ(::twell::cuda::test::h2d(x.get(), xb.data(), xb.size() * 2), cudaSuccess);

  // --- gate → TwELL: words, counts and overflow flags must equal the host encoder's on the same g,
  // for the cuBLASLt gate + twell_pack and (on sm_90) the gate GEMM with the packing in its epilogue ---
  {
    ContextOptions lo = opt;
    lo.gate_sm90 = false;
    const GateWords lw = check_gate_words(c, w, x.get(), lo, s);
    // Chunked gate (GEMM chunk i + 1 overlapping the packing of chunk i): the same words and counts.
    if (c.m >= 4096) {
      ContextOptions co = lo;
      co.gate_chunks = 4;
      FfnContext cc(co);
      cc.upload_weights(w, s);
      cc.gate_twell(x.get(), c.m, s);
      const GateWords cw = download_gate_words(cc, c.m, s);
      expect_same_gate_words(cw, lw, "chunked gate vs one pass");
    }
    RecordProperty("nnz", std::to_string(lw.counters.nnz));
    RecordProperty("overflow_rows", std::to_string(lw.counters.overflow_rows));
    std::printf("[case %s] nnz %llu (%.3f%%), overflow tiles %llu, overflow rows %llu\n", c.name.c_str(),
                static_cast<unsigned long long>(lw.counters.nnz),
                100.0 * static_cast<double>(lw.counters.nnz) / static_cast<double>(c.m * c.n),
                static_cast<unsigned long long>(lw.counters.overflow_tiles),
                static_cast<unsigned long long>(lw.counters.overflow_rows));
  }
  // --- y through each path vs the float64 oracle on sampled rows ---
  const auto rows = sample_rows(d, c.n * c.k > 20'000'000 ? 24 : 64, c.seed + 7);
  ref::Options rounded;
  rounded.round_activation_bf16 = true;
  const auto ref_sparse = ref::ffn_forward(d.xv(), w, rows, rounded);
  const auto ref_dense = ref::ffn_forward(d.xv(), w, rows, {});
  struct P {
    const char* name;
    Path path;
    const std::vector<double>* ref;
  };
  for (const P& p : {P{"sparse", Path::sparse, &ref_sparse}, P{"dense", Path::dense, &ref_dense},
                     P{"automatic", Path::automatic, nullptr}}) {
    ForwardResult fr;
    const Outputs o = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = ctx.forward(x.get(), c.m, y, p.path, s); });
    EXPECT_TRUE(o.guard_ok) << p.name << ": write past the end of y";
    const std::vector<double>& r = p.ref ? *p.ref : (fr.sparse ? ref_sparse : ref_dense);
    std::int64_t worst_row = -1;
    const double err = max_err_rows(o.y, r, rows, c.k, &worst_row);
    EXPECT_LE(err, kTol) << p.name << " path (" << fr.path() << "): worst row " << worst_row;
    std::printf("[case %s] %-9s path \"%s\": max row rel err %.2e over %zu rows\n", c.name.c_str(), p.name,
                fr.path().c_str(), err, rows.size());
  }
  // The sm90 gate GEMM with the TwELL epilogue, where the GPU runs it: values, words, counters,
  // flags, backup blocks, and y through the sparse path with only the overflowed blocks backed up.
  // Both ways its consumers stage a tile (32-bit shared stores; stmatrix), with its packers' heavy
  // rows by the whole warp (the default) and every row by its own lane, and with their non-zero
  // words from the consumers' masks (the default) and from their own scan of the staged rows.
  for (int v : {0, 1, 2, 3}) {
    ContextOptions so = opt;
    so.gate_sm90 = true;
    so.gate_sm90_stmatrix = v > 0;
    so.gate_sm90_heavy_rows = v != 2;
    so.gate_sm90_word_masks = v != 3;
    FfnContext sc(so);
    sc.upload_weights(w, s);
    if (sc.gate_sm90_active()) check_gate_sm90(c, d, w, x.get(), so, sc, ref_sparse, rows, s);
  }
  // The other fused-kernel variants (benchmark knobs) must be exact too.
  for (int v = 1; v <= 4; ++v) {  // variant 0 ran above
    ContextOptions vo = opt;
    vo.updown_variant = vo.updown_variant_nongated = v;
    vo.updown_occupancy_min_rows = 0;  // variants 3 and 4 at every M
    FfnContext vc(vo);
    vc.upload_weights(w, s);
    const Outputs o = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { vc.forward(x.get(), c.m, y, Path::sparse, s); });
    EXPECT_TRUE(o.guard_ok) << "variant " << v << ": write past the end of y";
    std::int64_t worst_row = -1;
    const double err = max_err_rows(o.y, ref_sparse, rows, c.k, &worst_row);
    EXPECT_LE(err, kTol) << "up/down variant " << v << ": worst row " << worst_row;
  }
  check_dense_rows(c, d, w, x.get(), opt, ref_sparse, ref_dense, rows, s);
  check_hot_neurons(c, w, x.get(), opt, ref_sparse, ref_dense, rows, s);
  cudaStreamDestroy(s);
}

// The cases of the shared table (bench/ffn/ffn_cases.hpp) that run on CUDA.
std::vector<FfnCase> cases() {
  std::vector<FfnCase> v;
  for (FfnCase& c : ffn_cases())
    if (c.cuda) v.push_back(std::move(c));
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFfn, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<FfnCase>& i) { return i.param.name; });

// The host API (what the CLI calls): exact result, path and counts reported.
TEST(CudaHostApi, InferHostMatchesReference) {
  TWELL_REQUIRE_GPU();
  FfnCase c{"host_api", 129, 2000, 520, 0.03, true, 0.1, 0.5, 1, 1};
  const FfnData d = make_ffn(c);
  std::vector<float> y(static_cast<std::size_t>(c.m * c.k), std::nanf(""));
  InferenceOptions opt;
  opt.path = Path::sparse;
  const InferenceReport rep = ffn_infer_host(d.xv(), d.weights(), MatrixF(y.data(), c.m, c.k), opt);
  ref::Options rounded;
  rounded.round_activation_bf16 = true;
  const auto r = ref::ffn_forward(d.xv(), d.weights(), {}, rounded);
  EXPECT_LE(ref::max_row_rel_error(y.data(), r.data(), c.m, c.k), kTol);
  EXPECT_GT(rep.nnz, 0);
  EXPECT_GT(rep.overflow_rows, 0);  // the hot rows overflow S − 1 = 31
  EXPECT_FALSE(rep.path.empty());
}

// Shared set-up of the dispatch tests: a layer with its input x (its density set by the case) and
// an all-zero input (density 0), the float64 references on `rows`, and a context under test.
class CudaDispatch : public ::testing::Test {
 protected:
  void SetUp() override { TWELL_REQUIRE_GPU(); }
  void TearDown() override {
    if (s_) cudaStreamDestroy(s_);
  }
  // rows: sample_rows(·, max_rows, seed) of the generated case.
  void set_up(const FfnCase& c, const ContextOptions& opt, std::int64_t max_rows, std::uint64_t seed) {
    c_ = c;
    d_ = make_ffn(c);
    w_ = d_.weights();
    ASSERT_EQ(cudaStreamCreate(&s_), cudaSuccess);
    ctx_ = std::make_unique<FfnContext>(opt);
    ctx_->upload_weights(w_, s_);
    const auto xb = to_bf16_bits(d_.x);
    x_.resize(xb.size());
    zero_.resize(xb.size());
    ASSERT_EQ(::twell::cuda::test::h2d(x_.get(), xb.data(), xb.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMemset(zero_.get(), 0, xb.size() * 2), cudaSuccess);  // every gate inactive: density 0
    rows_ = sample_rows(d_, max_rows, seed);
    ref::Options rounded;
    rounded.round_activation_bf16 = true;
    ref_sparse_ = ref::ffn_forward(d_.xv(), w_, rows_, rounded);
    ref_dense_ = ref::ffn_forward(d_.xv(), w_, rows_, {});
  }
  // One automatic call on `in` (x or zero) into a poisoned y: in bounds, and exact (y = 0 for zero).
  ForwardResult automatic(const __nv_bfloat16* in) {
    ForwardResult fr;
    const Outputs o =
        run_poisoned(c_.m, c_.k, s_, [&](__nv_bfloat16* y) { fr = ctx_->forward(in, c_.m, y, Path::automatic, s_); });
    EXPECT_TRUE(o.guard_ok) << fr.path();
    expect_exact(o.y, fr, in);
    return fr;
  }
  // A fresh context of `opt`: three automatic calls on x (measured dense), then calls on zero until
  // one runs sparse; that call's index among them (-1: none of 40), each call waited for.
  int calls_until_sparse(const ContextOptions& opt) {
    FfnContext ctx(opt);
    ctx.upload_weights(w_, s_);
    DeviceBuffer<__nv_bfloat16> y(static_cast<std::size_t>(c_.m * c_.k));
    for (int j = 0; j < 3; ++j) ctx.forward(x_.get(), c_.m, y.get(), Path::automatic, s_);
    EXPECT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
    for (int j = 0; j < 40; ++j) {
      const ForwardResult fr = ctx.forward(zero_.get(), c_.m, y.get(), Path::automatic, s_);
      EXPECT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
      if (fr.sparse) return j;
    }
    return -1;
  }
  void expect_exact(const std::vector<float>& y, const ForwardResult& fr, const __nv_bfloat16* in) const {
    if (in == x_.get()) {
      std::int64_t worst_row = -1;
      EXPECT_LE(max_err_rows(y, fr.sparse ? ref_sparse_ : ref_dense_, rows_, c_.k, &worst_row), kTol)
          << fr.path() << ": worst row " << worst_row;
    } else {
      for (float v : y) ASSERT_EQ(v, 0.0f) << fr.path();
    }
  }

  FfnCase c_;
  FfnData d_;
  FfnWeights w_;
  cudaStream_t s_ = nullptr;
  std::unique_ptr<FfnContext> ctx_;
  DeviceBuffer<__nv_bfloat16> x_, zero_;
  std::vector<std::int64_t> rows_;
  std::vector<double> ref_sparse_, ref_dense_;
};

// Sticky dispatch: the first call counts and decides with a host wait; later calls follow the
// latest count of the layer (sparse: the packing's exact count; dense: a sampled count of the
// stacked GEMM's gate) without one. Every call stays exact.
TEST_F(CudaDispatch, StickyFollowsTheMeasuredDensity) {
  const FfnCase c{"sticky", 1000, 1000, 1024, 0.20};
  ContextOptions opt;
  opt.dispatch_min_rows = 0;
  opt.dense_count_period = 1;  // every dense call counts (the default period: below)
  ASSERT_NO_FATAL_FAILURE(set_up(c, opt, 32, c.seed + 3));

  struct Step {
    const __nv_bfloat16* in;
    bool counted, sparse;  // expected
  };
  // 20 % → counted, dense; sticky dense (counts 20 %); zeros under sticky dense (counts 0 %);
  // zeros, sticky sparse (counts 0 %); 20 % under sticky sparse (counts 20 %); 20 %, sticky dense.
  const Step steps[] = {{x_.get(), true, false},     {x_.get(), false, false}, {zero_.get(), false, false},
                        {zero_.get(), false, true},  {x_.get(), false, true},  {x_.get(), false, false}};
  int i = 0;
  for (const Step& st : steps) {
    SCOPED_TRACE(::testing::Message() << "call " << i++);
    const ForwardResult fr = automatic(st.in);
    EXPECT_EQ(fr.counted, st.counted) << fr.path();
    EXPECT_EQ(fr.sparse, st.sparse) << fr.path();
  }
  // Back-to-back calls without a host wait (the host runs ahead; the count ring fills and waits
  // for its oldest slot): the last result is still exact.
  {
    ForwardResult fr;
    const Outputs o = run_poisoned(c.m, c.k, s_, [&](__nv_bfloat16* y) {
      for (int j = 0; j < 20; ++j) fr = ctx_->forward(j % 2 ? x_.get() : zero_.get(), c.m, y, Path::automatic, s_);
    });
    expect_exact(o.y, fr, x_.get());  // the last call (j = 19) ran on x
  }
  // New weights are a new layer: its first automatic call counts and decides again.
  ctx_->upload_weights(w_, s_);
  EXPECT_TRUE(automatic(x_.get()).counted);
  // With the default count period (8) a dense layer counts every 8th dense call: a layer that turns
  // sparse is back on the sparse path within 9 calls.
  ContextOptions d;
  d.dispatch_min_rows = 0;
  ASSERT_GT(d.dense_count_period, 1);
  const int back = calls_until_sparse(d);
  EXPECT_GE(back, 0) << "never returned to the sparse path";
  EXPECT_LE(back, static_cast<int>(d.dense_count_period) + 1);
}

// From dispatch_large_rows rows on, the gated threshold is max_sparse_density_gated_large: at the
// same density (20 %) a call at M ≥ dispatch_large_rows runs sparse, one below runs dense.
TEST_F(CudaDispatch, LargeBatchesUseTheirOwnThreshold) {
  const FfnCase c{"large_rows", 1000, 1000, 1024, 0.20};
  ContextOptions opt;
  opt.dispatch_min_rows = 0;
  opt.max_sparse_density_gated = 0.1;
  opt.max_sparse_density_gated_large = 0.3;
  opt.dispatch_large_rows = 1000;
  opt.dense_rows_density = 0;  // the raw density decides here (dense rows would count heavy rows at their dense cost)
  ASSERT_NO_FATAL_FAILURE(set_up(c, opt, 32, c.seed + 5));
  const ForwardResult large = automatic(x_.get());
  EXPECT_TRUE(large.counted);
  EXPECT_TRUE(large.sparse) << large.path();
  ContextOptions below = opt;
  below.dispatch_large_rows = 1001;
  ctx_ = std::make_unique<FfnContext>(below);
  ctx_->upload_weights(w_, s_);
  const ForwardResult small = automatic(x_.get());
  EXPECT_TRUE(small.counted);
  EXPECT_FALSE(small.sparse) << small.path();
}

// Decode (M ≤ decode_max_rows, default options): sparse without a host wait until a count shows
// the layer dense; the dense calls keep counting, so a sparse input brings the sparse path back.
TEST_F(CudaDispatch, DecodeRunsSparseUntilTheLayerMeasuresDense) {
  const FfnCase c{"decode", 1, 1000, 1024, 0.20};
  ContextOptions opt;  // defaults (decode_max_rows 16, decode_max_density 0.8 %), counting every dense call
  opt.decode_dense_count_period = 1;
  ASSERT_NO_FATAL_FAILURE(set_up(c, opt, c.m, c.seed));  // every row

  struct Step {
    const __nv_bfloat16* in;
    bool sparse;  // expected
  };
  // nothing measured → sparse (counts 20 %); dense (counts 20 %); zeros, dense (counts 0 %);
  // zeros → sparse; 20 % → sparse (counts 20 %); 20 % → dense.
  const Step steps[] = {{x_.get(), true},     {x_.get(), false}, {zero_.get(), false},
                        {zero_.get(), true},  {x_.get(), true},  {x_.get(), false}};
  int i = 0;
  for (const Step& st : steps) {
    SCOPED_TRACE(::testing::Message() << "call " << i++);
    const ForwardResult fr = automatic(st.in);
    EXPECT_EQ(fr.sparse, st.sparse) << fr.path();
    EXPECT_FALSE(fr.counted) << fr.path();  // no host wait in decode
  }
  // With the default count period a dense decode layer counts every 16th call: a layer that
  // turns sparse is back on the decode kernel within 17 calls.
  const int back = calls_until_sparse(ContextOptions{});
  EXPECT_GE(back, 0) << "never returned to the decode kernel";
  EXPECT_LE(back, 17);
}

// One token on the fused one-token kernel follows decode_token_max_density, other decode sizes
// decode_max_density: at 20 % density, between the two thresholds set here, one token keeps the
// decode kernel call after call while four tokens go dense once their first call has counted.
TEST_F(CudaDispatch, OneTokenDecodeFollowsItsOwnThreshold) {
  for (const std::int64_t m : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    const FfnCase c{"decode_token_threshold", m, 1000, 1024, 0.20};
    ContextOptions opt;
    opt.decode_max_density = 0.1;
    opt.decode_token_max_density = 0.3;
    ctx_.reset();  // a second set_up: the first layer and its stream go first
    if (s_) {
      ASSERT_EQ(cudaStreamDestroy(std::exchange(s_, nullptr)), cudaSuccess);
    }
    ASSERT_NO_FATAL_FAILURE(set_up(c, opt, c.m, c.seed));
    for (int i = 0; i < 4; ++i) {
      const ForwardResult fr = automatic(x_.get());
      EXPECT_EQ(fr.sparse, m == 1 || i == 0) << "call " << i << ": " << fr.path();
      ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);  // its count is back before the next call
    }
  }
}

// The decode-size GEMV against float64 ReLU(x·Wᵀ), and x·Wᵀ without the ReLU (the model runtime's
// projections): every element within the fp32-accumulation + bf16-rounding bound of
// check_gate_sm90, padding columns of the output rows untouched, at every token count 1 … 16 it
// serves (one token on the CUDA-core kernel, 2–8 and 9–16 on the tensor-core one's two widths),
// ragged N, K (K not a multiple of the tensor-core kernel's 64-element blocks; K = 1096: a second
// load window, staged in shared memory with w_before_wait, that runs past the row), and both
// one-token shapes (4 rows a warp for N > 4096, else 1: N = 4096 and 4097 at the boundary).
TEST(CudaGemv, MatchesFloat64WithinBound) {
  TWELL_REQUIRE_GPU();
  struct Shape {
    std::int64_t m, n, k;
  };
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::mt19937_64 rng(20261121);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Shape sh : {Shape{1, 5632, 2048}, Shape{2, 1003, 520}, Shape{3, 1000, 8192}, Shape{5, 70000, 264},
                         Shape{8, 17, 8}, Shape{11, 5632, 2048}, Shape{16, 1001, 1024}, Shape{1, 2048, 2048},
                         Shape{1, 4096, 520}, Shape{1, 4097, 520}, Shape{1, 2048, 5632}, Shape{1, 999, 4096},
                         Shape{1, 3, 8}, Shape{4, 1003, 1096}})
   for (const bool relu : {true, false})
    for (const bool out32 : {false, true}) {  // bf16 output (g), or the fp32 sums (g32: the LM head's)
    SCOPED_TRACE(::testing::Message() << "m " << sh.m << " n " << sh.n << " k " << sh.k << (relu ? ", ReLU" : ", no ReLU")
                                      << (out32 ? ", fp32 out" : ""));
    std::vector<float> x(static_cast<std::size_t>(sh.m * sh.k)), wt(static_cast<std::size_t>(sh.n * sh.k));
    for (float& v : x) v = round_bf16(nd(rng));
    const float ws = 1.0f / std::sqrt(static_cast<float>(sh.k));
    for (float& v : wt) v = round_bf16(nd(rng) * ws);
    const auto xb = to_bf16_bits(x), wb = to_bf16_bits(wt);
    const std::int64_t ldg = sh.n + 8;  // 8 padding columns per row must stay as poisoned
    DeviceBuffer<__nv_bfloat16> dx(xb.size()), dw(wb.size()), dg(static_cast<std::size_t>(sh.m * ldg));
    DeviceBuffer<float> dg32(out32 ? static_cast<std::size_t>(sh.m * ldg) : 0);
    ASSERT_EQ(::twell::cuda::test::h2d(dx.get(), xb.data(), xb.size() * 2), cudaSuccess);
    ASSERT_EQ(::twell::cuda::test::h2d(dw.get(), wb.data(), wb.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMemset(dg.get(), 0xff, dg.bytes()), cudaSuccess);
    if (out32) {
      ASSERT_EQ(cudaMemset(dg32.get(), 0xff, dg32.bytes()), cudaSuccess);  // NaN poison
    }
    TwellGemvParams p;
    p.x = dx.get();
    p.ld_x = sh.k;
    p.w = dw.get();
    if (out32)
      p.g32 = dg32.get();
    else
      p.g = dg.get();
    p.ld_g = ldg;
    p.m = sh.m;
    p.n = sh.n;
    p.k = sh.k;
    p.relu = relu;
    launch_twell_gemv(p, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<std::uint16_t> gb(static_cast<std::size_t>(sh.m * ldg));
    std::vector<float> g32(out32 ? gb.size() : 0);
    ASSERT_EQ(cudaMemcpy(gb.data(), dg.get(), gb.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    if (out32) {
      ASSERT_EQ(cudaMemcpy(g32.data(), dg32.get(), g32.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    std::int64_t bad = 0, touched = 0;
    double worst = 0;
    for (std::int64_t r = 0; r < sh.m; ++r) {
      for (std::int64_t col = 0; col < sh.n; ++col) {
        double acc = 0, mag = 0;
        for (std::int64_t kk = 0; kk < sh.k; ++kk) {
          const double t = static_cast<double>(x[static_cast<std::size_t>(r * sh.k + kk)]) *
                           static_cast<double>(wt[static_cast<std::size_t>(col * sh.k + kk)]);
          acc += t;
          mag += std::abs(t);
        }
        const double ref = relu ? std::max(acc, 0.0) : acc;
        const std::size_t at = static_cast<std::size_t>(r * ldg + col);
        const double got = out32 ? static_cast<double>(g32[at]) : to_float(bf16{gb[at]});
        // bf16 output: its rounding (2⁻⁹ relative, 2⁻⁸ with slack) plus fp32 accumulation (k · 2⁻²⁴ of
        // the terms' magnitude); fp32 output: the accumulation alone.
        const double bound = (out32 ? 0.0 : std::ldexp(std::abs(ref), -8)) + static_cast<double>(sh.k) * std::ldexp(mag, -24) + 1e-30;
        worst = std::max(worst, std::abs(got - ref) / bound);
        bad += !(std::abs(got - ref) <= bound);  // NaN (never written) counts as bad
      }
      for (std::int64_t col = sh.n; col < ldg; ++col) {
        const std::size_t at = static_cast<std::size_t>(r * ldg + col);
        touched += out32 ? !std::isnan(g32[at]) : gb[at] != 0xffffu;
      }
    }
    // The other output stays untouched: the bf16 buffer keeps its poison when fp32 sums were asked for.
    if (out32)
      for (const std::uint16_t v : gb) touched += v != 0xffffu;
    EXPECT_EQ(bad, 0) << "gemv values outside the bound (worst ratio " << worst << ")";
    EXPECT_EQ(touched, 0) << "gemv wrote past N";
    // W loaded before the programmatic wait (w_before_wait; its own shape at one token): the same
    // bits, padding untouched.
    ASSERT_EQ(cudaMemset(dg.get(), 0xff, dg.bytes()), cudaSuccess);
    if (out32) {
      ASSERT_EQ(cudaMemset(dg32.get(), 0xff, dg32.bytes()), cudaSuccess);
    }
    p.w_before_wait = true;
    launch_twell_gemv(p, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<std::uint16_t> gb2(gb.size());
    std::vector<float> g32b(g32.size());
    ASSERT_EQ(cudaMemcpy(gb2.data(), dg.get(), gb2.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    if (out32) {
      ASSERT_EQ(cudaMemcpy(g32b.data(), dg32.get(), g32b.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    EXPECT_EQ(gb2, gb) << "w_before_wait changed the bf16 output";
    EXPECT_EQ(std::memcmp(g32b.data(), g32.data(), g32.size() * sizeof(float)), 0) << "w_before_wait changed the fp32 sums";
  }
  cudaStreamDestroy(s);
}

// The tensor-core GEMV (2–16 tokens) gives each token the same bits whatever the batch around it:
// token t's outputs at M tokens equal its outputs at 16 tokens, with the other tokens' x
// different random values (a kernel that mixed tokens, or summed in an order that depended on M,
// would differ), bf16 and fp32 output, K with a partial last block, x rows with a stride past K
// whose padding is NaN (a read of it would show as a non-finite output).
TEST(CudaGemv, ATokensBitsDoNotDependOnTheBatch) {
  TWELL_REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::mt19937_64 rng(20261129);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::int64_t n = 1037, k = 2056;
  std::vector<float> w(static_cast<std::size_t>(n * k));
  for (float& v : w) v = round_bf16(nd(rng) * 0.03f);
  const std::int64_t ldx = k + 24;
  DeviceBuffer<__nv_bfloat16> dw(w.size()), dx(static_cast<std::size_t>(16 * ldx)), dg(static_cast<std::size_t>(16 * n));
  DeviceBuffer<float> dg32(static_cast<std::size_t>(16 * n));
  const auto wb = to_bf16_bits(w);
  ASSERT_EQ(::twell::cuda::test::h2d(dw.get(), wb.data(), wb.size() * 2), cudaSuccess);
  const auto run = [&](std::int64_t m, const std::vector<float>& x, bool out32) {
    std::vector<float> padded(static_cast<std::size_t>(m * ldx), std::numeric_limits<float>::quiet_NaN());
    for (std::int64_t r = 0; r < m; ++r) std::copy_n(x.begin() + r * k, k, padded.begin() + r * ldx);
    const auto xb = to_bf16_bits(padded);
    EXPECT_EQ(::twell::cuda::test::h2d(dx.get(), xb.data(), xb.size() * 2), cudaSuccess);
    TwellGemvParams p = gemv_rows(dx.get(), m, dw.get(), n, k);
    p.ld_x = ldx;
    if (out32)
      p.g32 = dg32.get();
    else
      p.g = dg.get();
    launch_twell_gemv(p, s);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<std::uint32_t> out(static_cast<std::size_t>(m * n));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = 0;
    if (out32) {
      EXPECT_EQ(cudaMemcpy(out.data(), dg32.get(), out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
      std::vector<std::uint16_t> o16(out.size());
      EXPECT_EQ(cudaMemcpy(o16.data(), dg.get(), o16.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = o16[i];
    }
    return out;
  };
  const auto random_x = [&](std::int64_t m) {
    std::vector<float> x(static_cast<std::size_t>(m * k));
    for (float& v : x) v = round_bf16(nd(rng));
    return x;
  };
  for (const bool out32 : {false, true}) {
    const std::vector<float> x16 = random_x(16);
    const auto want = run(16, x16, out32);
    for (const std::uint32_t b : want) {  // finite: the padding was not read
      const bool finite = out32 ? (b & 0x7f800000u) != 0x7f800000u : (b & 0x7f80u) != 0x7f80u;
      ASSERT_TRUE(finite) << "a non-finite output: the kernel read x's padding";
    }
    for (const std::int64_t m : {2, 3, 8, 9, 15}) {
      SCOPED_TRACE(::testing::Message() << "m " << m << (out32 ? ", fp32 out" : ", bf16 out"));
      // Token t of x16 sits at row t % m among other random tokens.
      for (const std::int64_t t : {std::int64_t{0}, m - 1, std::int64_t{15}}) {
        std::vector<float> x = random_x(m);
        const std::int64_t at = t % m;
        std::copy_n(x16.begin() + t * k, k, x.begin() + at * k);
        const auto got = run(m, x, out32);
        EXPECT_TRUE(std::equal(got.begin() + at * n, got.begin() + (at + 1) * n, want.begin() + t * n))
            << "token " << t << " at row " << at << " changed with the batch";
      }
    }
  }
  cudaStreamDestroy(s);
}

// The decode kernel (a token's non-zeros spread over N/256 CTAs, partials added in tile order by a
// ticketed last CTA) against the float64 oracle, at decode sizes (up to 200 rows with
// decode_max_rows raised) and densities from 0 to 100 %,
// twice per context (its tickets and count must be left zero for the next launch).
TEST(CudaDecode, MatchesReferenceAtEveryDensity) {
  TWELL_REQUIRE_GPU();
  // name, m, n, k, density, gated, hot_rows, hot_density, zero_rows, full_rows
  const FfnCase cases[] = {
      {"dec_m1_n1000_k520_d5", 1, 1000, 520, 0.05},
      {"dec_m3_n5632_k2048_d0p5", 3, 5632, 2048, 0.005},
      {"dec_m8_n70000_k520_d2", 8, 70000, 520, 0.02},
      {"dec_m5_n1003_k1024_d20_full", 5, 1003, 1024, 0.20, true, 0.0, 0.3, 1, 1},
      {"dec_m2_n1000_k8192_d5", 2, 1000, 8192, 0.05},
      {"dec_m4_n1000_k520_d0", 4, 1000, 520, 0.0},
      {"dec_nongated_m6_n5632_k2048_d1_full", 6, 5632, 2048, 0.01, false, 0.0, 0.3, 1, 1},
      {"dec_m16_n5632_k2048_d1", 16, 5632, 2048, 0.01},
      {"dec_m11_n1003_k8192_d3_full", 11, 1003, 8192, 0.03, true, 0.0, 0.3, 1, 1},
      // past the default decode size (FfnLayer::set_decode_max_rows: batched decode measured)
      {"dec_m64_n5632_k2048_d0p5", 64, 5632, 2048, 0.005},
      {"dec_nongated_m200_n1003_k1024_d3_full", 200, 1003, 1024, 0.03, false, 0.0, 0.3, 1, 1},
  };
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  for (const FfnCase& c : cases) {
    SCOPED_TRACE(c.name);
    const FfnData d = make_ffn(c);
    const FfnWeights w = d.weights();
    ContextOptions opt;
    opt.decode_max_rows = std::max<std::int64_t>(16, c.m);
    opt.union_min_rows = 0;  // the decode kernel, not the union, at 8–32 rows
    opt.decode_max_density = opt.decode_token_max_density = 1.0;  // the decode kernel at every density
    opt.decode_gemv_max_rows = (c.m % 2 == 0) ? kGemvMaxRows : 0;  // its gate by the GEMV kernel, or by cuBLASLt
    FfnContext ctx(opt);
    ctx.upload_weights(w, s);
    const auto xb = to_bf16_bits(d.x);
    DeviceBuffer<__nv_bfloat16> x(xb.size());
    ASSERT_EQ(::twell::cuda::test::h2d(x.get(), xb.data(), xb.size() * 2), cudaSuccess);
    std::vector<std::int64_t> rows(static_cast<std::size_t>(c.m));
    for (std::int64_t r = 0; r < c.m; ++r) rows[static_cast<std::size_t>(r)] = r;
    ref::Options rounded;
    rounded.round_activation_bf16 = true;
    const auto r = ref::ffn_forward(d.xv(), w, rows, rounded);
    std::vector<float> first;
    for (int call = 0; call < 2; ++call) {
      ForwardResult fr;
      const Outputs o = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = ctx.forward(x.get(), c.m, y, Path::automatic, s); });
      EXPECT_TRUE(o.guard_ok);
      EXPECT_NE(fr.path().find("decode kernel"), std::string::npos) << fr.path();
      std::int64_t worst_row = -1;
      EXPECT_LE(max_err_rows(o.y, r, rows, c.k, &worst_row), kTol) << fr.path() << ": worst row " << worst_row;
      if (call == 0) {
        first = o.y;
      } else {
        EXPECT_TRUE(o.y == first) << "second call differs (deterministic order expected)";
      }
    }
    if (c.density == 0 && c.full_rows == 0) {
      for (float v : first) ASSERT_EQ(v, 0.0f);
    }
  }
  cudaStreamDestroy(s);
}

// The union FFN (sm90/union_ffn.hpp) as the automatic decode path at 2–64 rows (union_min_rows 2,
// union_max_rows 64), on a GPU that runs it: against the float64 oracle at densities from 0 to 100 % (every neuron of N = 8192 in every
// row: the largest union), N not a multiple of 256, K from 128; its count of fired pairs exact
// (exact pre-activations: the host knows every active set); three calls, the third launched
// programmatically, with the same bits (the count and ticket left zero, the early reads of the
// programmatic launches); up clusters that take the blocks in turn (ContextOptions::
// union_up_clusters) with the same bits again, other splits within the bound. At 2 and 8 rows the
// gate runs on the GEMV kernel (decode_gemv_max_rows; its weights read before the programmatic
// wait), elsewhere on cuBLASLt. A non-gated layer and a K off its grid at 17 rows do not take it.
TEST(CudaDecode, UnionMatchesReferenceAndCountsExactly) {
  TWELL_REQUIRE_GPU();
  if (!union_ffn_here()) GTEST_SKIP() << "the union FFN runs on compute capability 9.0 only";
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ContextOptions opt;
  opt.decode_max_density = opt.decode_token_max_density = 1.0;  // the sparse decode path at every density
  opt.union_max_rows = 64;
  opt.union_min_rows = 2;  // 2–16 rows too, in place of the decode kernel
  opt.decode_gemv_max_rows = 1;  // the gate on cuBLASLt (the default's GEMV gate covers 2–3 rows); the cases below up to 8 rows ask for the GEMV
  for (FfnCase c : {ffn_case("uni_m2_n1000_k512_d5", 2, 1000, 512, true, 0.05, 59),
                    ffn_case("uni_m8_n5632_k2048_d0p5", 8, 5632, 2048, true, 0.005, 60),
                    ffn_case("uni_m16_n4100_k1024_d30", 16, 4100, 1024, true, 0.30, 61),
                    ffn_case("uni_m17_n5632_k2048_d0p5", 17, 5632, 2048, true, 0.005, 51),
                    ffn_case("uni_m32_n1000_k512_d5", 32, 1000, 512, true, 0.05, 52),
                    ffn_case("uni_m24_n4100_k1024_d30", 24, 4100, 1024, true, 0.30, 53),
                    ffn_case("uni_m64_n5632_k2048_d1", 64, 5632, 2048, true, 0.01, 54),
                    ffn_case("uni_m20_n1000_k256_d0", 20, 1000, 256, true, 0.0, 55),
                    ffn_case("uni_m40_n8192_k128_d100", 40, 8192, 128, true, 1.0, 56)}) {
    SCOPED_TRACE(c.name);
    c.exact_preactivation = true;
    const FfnData d = make_ffn(c);
    const FfnWeights w = d.weights();
    const std::int64_t expect_nnz = count_active(exact_active(d, c.m));  // every row's
    ContextOptions o_case = opt;
    const bool gemv_gate = c.m <= 8;
    if (gemv_gate) o_case.decode_gemv_max_rows = kGemvMaxRows;
    FfnContext ctx(o_case);
    ctx.upload_weights(w, s);
    const auto xb = to_bf16_bits(d.x);
    DeviceBuffer<__nv_bfloat16> x(xb.size());
    ASSERT_EQ(::twell::cuda::test::h2d(x.get(), xb.data(), xb.size() * 2), cudaSuccess);
    std::vector<std::int64_t> rows(static_cast<std::size_t>(c.m));
    std::iota(rows.begin(), rows.end(), std::int64_t{0});
    ref::Options rounded;
    rounded.round_activation_bf16 = true;
    const auto r = ref::ffn_forward(d.xv(), w, rows, rounded);
    std::vector<float> first;
    for (int call = 0; call < 3; ++call) {
      const ProgrammaticLaunch programmatic(call == 2 && programmatic_launch_supported());
      ForwardResult fr;
      const Outputs o = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = ctx.forward(x.get(), c.m, y, Path::automatic, s); });
      EXPECT_TRUE(o.guard_ok);
      EXPECT_NE(fr.path().find(gemv_gate ? "union FFN (GEMV gate" : "union FFN (cublasLt gate"), std::string::npos) << fr.path();
      std::int64_t worst_row = -1;
      EXPECT_LE(max_err_rows(o.y, r, rows, c.k, &worst_row), kTol) << fr.path() << ": worst row " << worst_row;
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      const FfnContext::Measured me = ctx.measured();
      EXPECT_NEAR(me.active * static_cast<double>(c.m) * static_cast<double>(c.n), static_cast<double>(expect_nnz), 1e-6)
          << "call " << call << "; the gate's plans:\n" << ctx.gemm().describe_plans();
      if (call == 0) first = o.y;
      else EXPECT_TRUE(o.y == first) << "call " << call << " differs (the union's sums have a fixed order)";
    }
    if (expect_nnz == 0) {
      for (float v : first) ASSERT_EQ(v, 0.0f);
    }
    if (gemv_gate) {  // the GEMV gate before the union: with g's bits equal to cuBLASLt's, y's are too
      FfnContext listed(opt);  // the cuBLASLt gate, then the list kernel
      listed.upload_weights(w, s);
      ForwardResult fr;
      const Outputs o = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = listed.forward(x.get(), c.m, y, Path::automatic, s); });
      EXPECT_TRUE(o.guard_ok);
      EXPECT_NE(fr.path().find("union FFN (cublasLt gate"), std::string::npos) << fr.path();
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      const auto gsize = static_cast<std::size_t>(c.m * ctx.ldn());
      std::vector<std::uint16_t> g_gemv(gsize), g_listed(gsize);
      ASSERT_EQ(cudaMemcpy(g_gemv.data(), ctx.gate_values(), gsize * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(g_listed.data(), listed.gate_values(), gsize * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      bool g_same = true;
      for (std::int64_t r = 0; r < c.m; ++r)
        for (std::int64_t j = 0; j < c.n; ++j) {
          const auto i = static_cast<std::size_t>(r * ctx.ldn() + j);
          g_same = g_same && g_gemv[i] == g_listed[i];
        }
      // Exact pre-activations: both gates' fp32 sums are exact, so their g has the same bits.
      EXPECT_TRUE(g_same) << "the GEMV's and cuBLASLt's g differ on exact pre-activations";
      EXPECT_TRUE(o.y == first) << "the same g through the GEMV and cuBLASLt gates gave other bits";
    }
    // Up clusters that take the 64-slot blocks in turn (3: up to 43 passes at N = 8192, every
    // neuron fired; 1: one cluster, every block), plainly and programmatically launched: the same
    // sums as a cluster a block, so the same bits; other splits: other sums, within the bound.
    std::vector<float> split24;  // the 2 × 4 splits' bits on a cluster a block
    for (const auto& [up_split, down_split, clusters, pdl] :
         {std::tuple{8, 8, 3, false}, std::tuple{8, 8, 3, true}, std::tuple{2, 4, 0, false}, std::tuple{2, 4, 1, false},
          std::tuple{2, 4, 1, true}, std::tuple{4, 2, 0, false}}) {
      SCOPED_TRACE(::testing::Message() << "splits " << up_split << " x " << down_split << ", up clusters " << clusters
                                        << (pdl ? ", programmatic" : ""));
      const ProgrammaticLaunch programmatic(pdl && programmatic_launch_supported());
      ContextOptions o2 = o_case;  // the same gate as the calls above
      o2.union_up_split = up_split;
      o2.union_down_split = down_split;
      o2.union_up_clusters = clusters;
      FfnContext c2(o2);
      c2.upload_weights(w, s);
      ForwardResult fr;
      const Outputs o = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = c2.forward(x.get(), c.m, y, Path::automatic, s); });
      EXPECT_TRUE(o.guard_ok);
      EXPECT_NE(fr.path().find("union FFN"), std::string::npos) << fr.path();
      std::int64_t worst_row = -1;
      EXPECT_LE(max_err_rows(o.y, r, rows, c.k, &worst_row), kTol) << fr.path() << ": worst row " << worst_row;
      if (up_split == 8 && down_split == 8) {
        EXPECT_TRUE(o.y == first) << "capped up clusters changed the bits";
      } else if (up_split == 2 && clusters == 0) {
        split24 = o.y;
      } else if (up_split == 2) {
        EXPECT_TRUE(o.y == split24) << "one up cluster changed the bits";
      }
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_NEAR(c2.measured().active * static_cast<double>(c.m) * static_cast<double>(c.n), static_cast<double>(expect_nnz), 1e-6);
    }
  }
  // Off its limits: not the union (non-gated; K not a multiple of 128).
  for (const FfnCase& c : {ffn_case("uni_off_nongated_m17", 17, 1000, 512, false, 0.05, 57),
                           ffn_case("uni_off_k520_m17", 17, 1000, 520, true, 0.05, 58)}) {
    SCOPED_TRACE(c.name);
    const FfnData d = make_ffn(c);
    FfnContext ctx(opt);
    ctx.upload_weights(d.weights(), s);
    const auto xb = to_bf16_bits(d.x);
    DeviceBuffer<__nv_bfloat16> x(xb.size());
    ASSERT_EQ(::twell::cuda::test::h2d(x.get(), xb.data(), xb.size() * 2), cudaSuccess);
    ForwardResult fr;
    const Outputs o = run_poisoned(c.m, c.k, s, [&](__nv_bfloat16* y) { fr = ctx.forward(x.get(), c.m, y, Path::automatic, s); });
    EXPECT_TRUE(o.guard_ok);
    EXPECT_EQ(fr.path().find("union"), std::string::npos) << fr.path();
  }
  cudaStreamDestroy(s);
}

// The one-token decode kernels (the gate fused in; flagged neurons listed in order by each CTA of
// the down kernel) through the context's automatic path at M = 1, against the float64 oracle, at
// densities from 0 to 100 %: lists longer than one pass (5000 at 100 %: passes of 2048 entries;
// N = 70000 at 40 %: ≈ 3300 active in each of 9 rounds of 8192 flags), K up to 8192, N not a
// multiple of 8 or 32, non-gated. Twice per context, with the same bits; the count that comes back
// is exact (exact pre-activations: the active set is known on the host). Then one context
// reloaded with N = 1010, then 1000 (the same 32-neuron group: its scratch must follow N).
TEST(CudaDecodeToken, MatchesReferenceAtEveryDensity) {
  TWELL_REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ContextOptions opt;
  opt.decode_max_density = opt.decode_token_max_density = 1.0;  // the decode kernels at every density
  // Uploads c's weights into ctx and checks `calls` one-token forwards of its x.
  const auto check = [&](FfnContext& ctx, FfnCase c, int calls) {
    SCOPED_TRACE(c.name);
    c.exact_preactivation = true;
    const FfnData d = make_ffn(c);
    const FfnWeights w = d.weights();
    const std::int64_t expect_nnz = count_active(exact_active(d, 1));  // the first GEMM's, exact on this grid
    ctx.upload_weights(w, s);
    const auto xb = to_bf16_bits(d.x);
    DeviceBuffer<__nv_bfloat16> x(xb.size());
    ASSERT_EQ(::twell::cuda::test::h2d(x.get(), xb.data(), xb.size() * 2), cudaSuccess);
    const std::vector<std::int64_t> rows = {0};
    ref::Options rounded;
    rounded.round_activation_bf16 = true;
    const auto r = ref::ffn_forward(d.xv(), w, rows, rounded);
    std::vector<float> first;
    for (int call = 0; call < calls; ++call) {
      ForwardResult fr;
      const Outputs o = run_poisoned(1, c.k, s, [&](__nv_bfloat16* y) { fr = ctx.forward(x.get(), 1, y, Path::automatic, s); });
      EXPECT_TRUE(o.guard_ok);
      EXPECT_NE(fr.path().find("one token, gate fused in"), std::string::npos) << fr.path();
      std::int64_t worst_row = -1;
      EXPECT_LE(max_err_rows(o.y, r, rows, c.k, &worst_row), kTol) << fr.path();
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      const FfnContext::Measured me = ctx.measured();
      EXPECT_NEAR(me.active * static_cast<double>(c.n), static_cast<double>(expect_nnz), 1e-6) << "call " << call;
      if (call == 0) first = o.y;
      else EXPECT_TRUE(o.y == first) << "call " << call << " differs (deterministic order expected)";
    }
    if (expect_nnz == 0) {
      for (float v : first) ASSERT_EQ(v, 0.0f);
    }
  };
  for (const FfnCase& c : {ffn_case("tok_n1000_k520_d5", 1, 1000, 520, true, 0.05, 11),
                           ffn_case("tok_n5632_k2048_d0p5", 1, 5632, 2048, true, 0.005, 12),
                           ffn_case("tok_n70000_k520_d40", 1, 70000, 520, true, 0.40, 13),
                           ffn_case("tok_n1003_k8192_d3", 1, 1003, 8192, true, 0.03, 14),
                           ffn_case("tok_n4100_k4096_d1", 1, 4100, 4096, true, 0.01, 15),
                           ffn_case("tok_n1000_k1024_d0", 1, 1000, 1024, true, 0.0, 16),
                           ffn_case("tok_n17_k8_d50", 1, 17, 8, true, 0.5, 17),
                           ffn_case("tok_n5000_k264_d100", 1, 5000, 264, true, 1.0, 18),
                           ffn_case("tok_nongated_n5632_k2048_d1", 1, 5632, 2048, false, 0.01, 19),
                           ffn_case("tok_nongated_n3001_k1032_d60", 1, 3001, 1032, false, 0.6, 20)}) {
    FfnContext ctx(opt);
    check(ctx, c, 2);
  }
  FfnContext reloaded(opt);  // N = 1010, then 1000: the same 32-neuron group
  check(reloaded, ffn_case("tok_reload_n1010", 1, 1010, 264, true, 0.3, 41), 1);
  check(reloaded, ffn_case("tok_reload_n1000", 1, 1000, 264, true, 0.3, 42), 1);
  cudaStreamDestroy(s);
}

// The one-token kernel's neuron order follows its schedule and restarts with new weights. 20
// one-token forward() calls count 20 steps; the order is then the stable sort of the neurons by
// ⌊log2⌋ of their activations in the 15 steps before the reorder at step 16 (exact
// pre-activations: the host knows every active set). A hot split renumbers the neurons: the steps
// that follow (advance_decode_order + decode_step, as a graph-replaying caller runs them) count from
// 1 on the identity order with the counts started again (their sum is the new steps' activations,
// whatever the numbering), and step 8 sorts by the counts of steps 1–7. A new upload restarts them
// once more, through forward().
TEST(CudaDecodeToken, NeuronOrderRestartsWithNewWeights) {
  TWELL_REQUIRE_GPU();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const std::int64_t rows = 30, n = 5632, k = 2048;
  FfnCase c = ffn_case("order_epoch", rows, n, k, true, 0.02, 44);
  c.exact_preactivation = true;
  const FfnData d = make_ffn(c);
  const FfnWeights w = d.weights();
  const std::vector<std::vector<char>> active = exact_active(d, rows);  // the host's active sets
  const auto actives = [&](std::int64_t from, std::int64_t to) {  // activations of rows [from, to)
    std::uint64_t t = 0;
    for (std::int64_t r = from; r < to; ++r)
      for (char a : active[static_cast<std::size_t>(r)]) t += a != 0;
    return t;
  };
  const auto sorted_by = [&](const std::vector<std::uint32_t>& hits) {  // launch_decode_token_reorder's order
    std::vector<std::int32_t> o(static_cast<std::size_t>(n));
    std::iota(o.begin(), o.end(), 0);
    std::stable_sort(o.begin(), o.end(), [&](std::int32_t a, std::int32_t b) {
      return std::bit_width(hits[static_cast<std::size_t>(a)]) > std::bit_width(hits[static_cast<std::size_t>(b)]);
    });
    return o;
  };
  std::vector<std::int32_t> identity(static_cast<std::size_t>(n));
  std::iota(identity.begin(), identity.end(), 0);

  ContextOptions opt;
  opt.decode_max_density = opt.decode_token_max_density = 1.0;  // the one-token kernels at any count
  FfnContext ctx(opt);
  ctx.upload_weights(w, s);
  const auto xb = to_bf16_bits(d.x);
  DeviceBuffer<__nv_bfloat16> x(xb.size()), y(static_cast<std::size_t>(k));
  ASSERT_EQ(::twell::cuda::test::h2d(x.get(), xb.data(), xb.size() * 2), cudaSuccess);
  const auto order = [&] {
    std::vector<std::int32_t> o(static_cast<std::size_t>(n));
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(o.data(), ctx.decode_order(), o.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return o;
  };
  const auto hits = [&] {
    std::vector<std::uint32_t> h(static_cast<std::size_t>(n));
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), ctx.decode_hits(), h.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  };
  const auto sum = [](const std::vector<std::uint32_t>& h) { return std::accumulate(h.begin(), h.end(), std::uint64_t{0}); };

  for (std::int64_t r = 0; r < 20; ++r) {
    const ForwardResult fr = ctx.forward(x.get() + r * k, 1, y.get(), Path::automatic, s);
    ASSERT_NE(fr.path().find("one token"), std::string::npos) << fr.path();
  }
  EXPECT_EQ(ctx.decode_order_steps(), 20);
  std::vector<std::uint32_t> first15(static_cast<std::size_t>(n), 0);
  for (std::int64_t r = 0; r < 15; ++r)
    for (std::int64_t j = 0; j < n; ++j) first15[static_cast<std::size_t>(j)] += active[static_cast<std::size_t>(r)][static_cast<std::size_t>(j)];
  const std::vector<std::int32_t> sorted15 = sorted_by(first15);
  ASSERT_NE(sorted15, identity) << "the case's activity does not move the order: the test would not see a restart";
  EXPECT_EQ(order(), sorted15) << "the order after 20 steps is not the sort by the counts of steps 1–15";
  EXPECT_EQ(sum(hits()), actives(0, 20));

  std::vector<std::int64_t> hot;  // split the 64 most active neurons off: the neurons are renumbered
  for (std::int64_t i = 0; i < 64; ++i) hot.push_back(sorted15[static_cast<std::size_t>(i)]);
  const std::uint64_t epoch = ctx.weights_epoch();
  ctx.set_hot_neurons(hot, s);
  ASSERT_NE(ctx.weights_epoch(), epoch);
  ASSERT_GT(ctx.hot_count(), 0);
  const auto replay_step = [&](std::int64_t r) {  // a graph-replaying caller's step (here launched plainly)
    ctx.advance_decode_order(s);
    ctx.decode_step(x.get() + r * k, 1, y.get(), true, s);
  };
  for (std::int64_t r = 20; r < 25; ++r) replay_step(r);
  EXPECT_EQ(ctx.decode_order_steps(), 5);
  EXPECT_EQ(order(), identity) << "a hot split must restart the order";
  EXPECT_EQ(sum(hits()), actives(20, 25)) << "a hot split must restart the counts";
  replay_step(25);
  replay_step(26);
  const std::vector<std::uint32_t> seven = hits();
  replay_step(27);  // step 8: sorted by the counts of steps 1–7
  EXPECT_EQ(ctx.decode_order_steps(), 8);
  EXPECT_EQ(order(), sorted_by(seven));
  EXPECT_NE(sorted_by(seven), identity);

  ctx.upload_weights(w, s);
  const ForwardResult fr = ctx.forward(x.get() + 28 * k, 1, y.get(), Path::automatic, s);
  ASSERT_NE(fr.path().find("one token"), std::string::npos) << fr.path();
  EXPECT_EQ(ctx.decode_order_steps(), 1);
  EXPECT_EQ(order(), identity) << "new weights must restart the order";
  EXPECT_EQ(sum(hits()), actives(28, 29));
  cudaStreamDestroy(s);
}

// The calibration leaves out the rows that will run dense (the training context's test of the
// same rule: CudaTrainHotNeurons.CalibrationLeavesOutDenseRows), on make_calibration_gate().
// Over every row neurons 0..90 qualify (over the threshold 0.03 · 512), more than the cap of
// ldn/2 − 16 = 36 hot neurons: a choice with the cap alone takes none. The guess 0..90 leaves
// 91..99 cold, rows 0..9 then hold more than ⌊0.02 · 9⌋ = 0 cold non-zeros and run dense; counted
// without them only 60..90 (31) qualify. Rounding the cold count down to 64 keeps the coldest by
// those counts (91..99 at 0, then 0..54 of 0..59 at 10, in order), so 55..90 run dense.
// Without dense rows, none (hot_neurons_densest_share off) or the 36 densest of 0..90 (on): 90 (512
// rows), then 0..34 (20 rows each, ties to the lower index) ahead of 35..59 (20) and 60..89 (17–18).
TEST(CudaHotNeurons, CalibrationLeavesOutDenseRows) {
  TWELL_REQUIRE_GPU();
  const CalibrationGate gate = make_calibration_gate();
  constexpr std::int64_t M = CalibrationGate::M, K = CalibrationGate::K;
  const std::vector<float>& x = gate.x;
  const FfnWeights w = gate.weights();
  const std::vector<double> ref = ref::ffn_forward(CMatrixF(x.data(), M, K), w);
  std::vector<std::int64_t> all_rows(M);
  for (std::int64_t r = 0; r < M; ++r) all_rows[static_cast<std::size_t>(r)] = r;

  std::vector<std::uint16_t> xb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = to_bf16(x[i]).bits;
  DeviceBuffer<__nv_bfloat16> xd(xb.size());
  ASSERT_EQ(::twell::cuda::test::h2d(xd.get(), xb.data(), xb.size() * 2), cudaSuccess);
  auto calibrate = [&](double dense_rows_density, bool densest = true) {
    ContextOptions o;
    o.hot_neurons_densest_share = densest;
    o.hot_neurons_min_rows = 1;
    o.hot_neurons_density = 0.03;
    o.dense_rows_density = dense_rows_density;
    o.dense_rows_min = 1;
    FfnContext ctx(o);
    ctx.upload_weights(w, nullptr);
    ForwardResult fr;
    const Outputs out = run_poisoned(M, K, nullptr, [&](__nv_bfloat16* y) { fr = ctx.forward(xd.get(), M, y, Path::sparse, nullptr); });
    EXPECT_TRUE(out.guard_ok) << fr.path();
    std::int64_t worst_row = -1;
    EXPECT_LE(max_err_rows(out.y, ref, all_rows, K, &worst_row), kTol) << fr.path() << ": worst row " << worst_row;
    return ctx.hot_neurons();
  };
  std::vector<std::int64_t> want;
  for (std::int64_t i = 55; i <= 90; ++i) want.push_back(i);
  EXPECT_EQ(calibrate(0.02), want);
  // No dense rows: 91 neurons qualify, more than the cap of 36.
  EXPECT_TRUE(calibrate(0.0, false).empty());
  std::vector<std::int64_t> densest;
  for (std::int64_t i = 0; i <= 34; ++i) densest.push_back(i);
  densest.push_back(90);
  EXPECT_EQ(calibrate(0.0, true), densest);
}

TEST(CudaHostApi, RejectsKNotMultipleOf8) {
  TWELL_REQUIRE_GPU();
  FfnCase c{"bad_k", 4, 300, 20, 0.1};
  const FfnData d = make_ffn(c);
  std::vector<float> y(static_cast<std::size_t>(c.m * c.k));
  try {
    ffn_infer_host(d.xv(), d.weights(), MatrixF(y.data(), c.m, c.k));
    FAIL() << "K = 20 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
  }
}

TEST(CudaHostApi, QueryDeviceReportsProperties) {
  const DeviceInfo d = query_device();
  if (!d.available) {
    EXPECT_FALSE(d.reason.empty());
    GTEST_SKIP() << d.reason;
  }
  EXPECT_GT(d.sm_count, 0);
  EXPECT_GT(d.l2_bytes, 0);
  EXPECT_FALSE(d.name.empty());
}

}  // namespace
}  // namespace twell::cuda::test
