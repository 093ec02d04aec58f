// The sparsity generator hits its targets and is reproducible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "test_util.hpp"
#include "twell/cpu/ffn_ops.hpp"
#include "twell/sparsity_gen.hpp"

using namespace twell;

namespace {

TwellStats stats_of(const GeneratedFfn& g, const SparsityParams& p, std::vector<std::int64_t>* per_neuron = nullptr) {
  const CMatrixF x(g.x.data<float>(), p.m, p.k);
  const CMatrixF w(p.gated ? g.w_gate.data<float>() : g.w_up.data<float>(), p.n, p.k);
  const TwellMatrix t = cpu::ffn_gate_twell(x, w, TwellConfig{256, 1});  // capacity 255: never overflows
  if (per_neuron) {
    per_neuron->assign(static_cast<std::size_t>(p.n), 0);
    for (std::int64_t r = 0; r < t.rows; ++r)
      for (std::int64_t tt = 0; tt < t.tiles; ++tt) {
        const std::uint32_t* b = t.block(r, tt);
        for (std::uint32_t j = 0; j < b[0]; ++j) ++(*per_neuron)[static_cast<std::size_t>(tt * 256 + twell_col(b[1 + j]))];
      }
  }
  return twell_stats(t);
}

TEST(SparsityGen, ReproducibleFromSeed) {
  SparsityParams p;
  p.m = 64;
  p.k = 128;
  p.n = 512;
  p.seed = test::fresh_seed();
  const GeneratedFfn a = generate_ffn(p), b = generate_ffn(p);
  EXPECT_EQ(std::memcmp(a.x.bytes(), b.x.bytes(), a.x.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.w_gate.bytes(), b.w_gate.bytes(), a.w_gate.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.w_down.bytes(), b.w_down.bytes(), a.w_down.nbytes()), 0);
  p.seed += 1;
  const GeneratedFfn c = generate_ffn(p);
  EXPECT_NE(std::memcmp(a.x.bytes(), c.x.bytes(), a.x.nbytes()), 0);
}

TEST(SparsityGen, HitsMeanDensityAndKillsDeadNeurons) {
  for (double density : {0.005, 0.02, 0.1}) {
    SparsityParams p;
    p.m = 512;
    p.k = 256;
    p.n = 2048;
    p.density = density;
    p.dead_neurons = 0.1;
    p.seed = test::fresh_seed();
    const GeneratedFfn g = generate_ffn(p);
    std::vector<std::int64_t> per_neuron;
    const TwellStats s = stats_of(g, p, &per_neuron);
    const double achieved = s.mean_row_nnz / static_cast<double>(p.n);
    // M·N Bernoulli-ish draws: sampling noise is tiny; the Gaussian approximation of the gate noise
    // (a χ² over K−2 terms) costs more, so allow ±25 % of the target.
    EXPECT_NEAR(achieved, density, 0.25 * density) << "density " << density;
    const auto dead = std::count(per_neuron.begin(), per_neuron.end(), 0);
    EXPECT_GE(dead, static_cast<std::int64_t>(0.1 * static_cast<double>(p.n)));  // the dead ones at least
    EXPECT_GT(s.max_row_nnz, static_cast<std::int64_t>(1.5 * s.mean_row_nnz));     // heavy-tailed rows
  }
}

TEST(SparsityGen, HotRowsOverflowTiles) {
  SparsityParams p;
  p.m = 400;
  p.k = 256;
  p.n = 5632;
  p.density = 0.013;
  p.hot_rows = 0.03;
  p.hot_density = 0.12;
  p.seed = test::fresh_seed();
  const GeneratedFfn g = generate_ffn(p);
  const CMatrixF x(g.x.data<float>(), p.m, p.k);
  const TwellMatrix t = cpu::ffn_gate_twell(x, CMatrixF(g.w_gate.data<float>(), p.n, p.k), TwellConfig{});
  const TwellStats s = twell_stats(t);
  EXPECT_GT(s.overflow_rows, 0);
  EXPECT_GT(s.max_row_nnz, static_cast<std::int64_t>(0.06 * static_cast<double>(p.n)));
  EXPECT_NEAR(s.mean_row_nnz / static_cast<double>(p.n), p.density, 0.3 * p.density);
}

TEST(SparsityGen, RejectsBadParameters) {
  SparsityParams p;
  p.density = 0;
  EXPECT_THROW(generate_ffn(p), Error);
  p = {};
  p.k = 2;
  EXPECT_THROW(generate_ffn(p), Error);
  p = {};
  p.hot_rows = 0.5;
  p.hot_density = 0.5;
  p.density = 0.01;
  EXPECT_THROW(generate_ffn(p), Error);
  p = {};
  p.dead_neurons = 1.0;
  EXPECT_THROW(generate_ffn(p), Error);
}

}  // namespace
