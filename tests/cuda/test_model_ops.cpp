// The model runtime's attention kernels against a float64 CPU reference: the plain kernel
// (attention) for any rows, the tensor-core one (flash_attention) for blocks of consecutive rows,
// GQA and MHA, head_dim 64 and 128, sequences whose caches already hold earlier positions, and
// partial blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/fixed_point.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/ops/gemv.hpp"
#include "cuda/ops/model_ops.hpp"
#include "cuda/sm80/twell_decode_token.hpp"
#include "cuda_test_util.hpp"
#include "late_writer.hpp"
#include "test_util.hpp"
#include "twell/bf16.hpp"
#include "twell/model/sampler.hpp"

namespace twell::test {
namespace {

using cuda::DeviceBuffer;

// A row of a cache whose blocks lie in order (no block table): layer l at + l·layer_stride.
cuda::ops::RowKv row_kv(__nv_bfloat16* k, __nv_bfloat16* v, std::int64_t layer_stride, std::int32_t pos) {
  cuda::ops::RowKv r;
  r.k = k;
  r.v = v;
  r.layer_stride = layer_stride;
  r.pos = pos;
  return r;
}

// One buffer holding a T-row step's qkv [T, ld] (qkv_n elements), then each row's K cache, then
// each row's V cache (cache_n elements each, layer l at + l·layer_stride). Paged (tables not null):
// row r's cache through its `blocks` table entries at tables + r · blocks. pos(r): row r's position.
template <typename Pos>
std::vector<cuda::ops::RowKv> rows_of_step_buffer(__nv_bfloat16* buf, int T, std::size_t qkv_n, std::size_t cache_n,
                                                   std::int64_t layer_stride, const std::int32_t* tables, int blocks,
                                                   Pos pos) {
  std::vector<cuda::ops::RowKv> rows;
  for (int r = 0; r < T; ++r) {
    rows.push_back(row_kv(buf + qkv_n + static_cast<std::size_t>(r) * cache_n,
                          buf + qkv_n + static_cast<std::size_t>(T + r) * cache_n, layer_stride,
                          static_cast<std::int32_t>(pos(r))));
    if (tables) rows.back().table = tables + static_cast<std::size_t>(r) * blocks;
  }
  return rows;
}

// `rows` block tables of `blocks` entries, each a shuffle of its own cache's blocks (position p in
// cache row table[p / kKvBlockRows] · kKvBlockRows + p % kKvBlockRows).
std::vector<std::int32_t> shuffled_block_tables(Rng& rng, int rows, int blocks) {
  std::vector<std::int32_t> tables(static_cast<std::size_t>(rows) * blocks);
  for (int r = 0; r < rows; ++r) {
    auto* t = tables.data() + static_cast<std::size_t>(r) * blocks;
    for (int j = 0; j < blocks; ++j) t[j] = j;
    for (int j = blocks - 1; j > 0; --j) std::swap(t[j], t[rng.below(j + 1)]);
  }
  return tables;
}

// A device copy of v as elements of type D (same size: bf16 ↔ __nv_bfloat16).
template <typename D = void, typename S>
auto upload(const std::vector<S>& v) {
  using T = std::conditional_t<std::is_void_v<D>, S, D>;
  static_assert(sizeof(T) == sizeof(S));
  DeviceBuffer<T> d(v.size());
  EXPECT_EQ(::twell::cuda::test::h2d(d.get(), v.data(), v.size() * sizeof(S)), cudaSuccess);
  return d;
}

// A host copy of a device buffer as elements of type H (same size: __nv_bfloat16 ↔ bf16).
template <typename H, typename T>
std::vector<H> download(const DeviceBuffer<T>& d) {
  static_assert(sizeof(H) == sizeof(T));
  std::vector<H> h(d.size());
  EXPECT_EQ(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

std::vector<bf16> random_bf16(Rng& rng, std::size_t n) {
  std::vector<bf16> v(n);
  for (auto& e : v) e = to_bf16(rng.normal());
  return v;
}

// A one-token FFN launch (twell_decode_token) over these weights and scratch; x (or the norm) unset.
cuda::TwellDecodeTokenParams token_params(std::int64_t n, std::int64_t k, bool gated,
                                          const DeviceBuffer<__nv_bfloat16>& w_first,
                                          const DeviceBuffer<__nv_bfloat16>& w_up,
                                          const DeviceBuffer<__nv_bfloat16>& w_down_t, DeviceBuffer<float>& h,
                                          DeviceBuffer<unsigned char>& flags, __nv_bfloat16* y,
                                          unsigned long long* count) {
  cuda::TwellDecodeTokenParams p;
  p.ld_x = k;
  p.w_up = gated ? w_up.get() : nullptr;
  p.w_down_t = w_down_t.get();
  p.y = y;
  p.ld_y = k;
  p.m = 1;
  p.n = n;
  p.k = k;
  p.gated = gated;
  p.w_first = w_first.get();
  p.h = h.get();
  p.flags = flags.get();
  p.nnz_out = count;
  return p;
}

// The FFN activations in float64, by the kernels' code (dev::activate: 0 ReLU, 1 SiLU, 2 exact
// GELU, 3 tanh GELU): the reference the gated products are checked against.
double activation_f64(int act, double g) {
  switch (act) {
    case 0: return std::max(g, 0.0);
    case 1: return g / (1.0 + std::exp(-g));
    case 2: return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0)));
    default: return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (g + 0.044715 * g * g * g)));
  }
}

// RoPE's cos and sin tables [positions, d/2] (θ = 10000), as the runtime builds them.
std::pair<std::vector<float>, std::vector<float>> rope_tables(int positions, int d) {
  const int half = d / 2;
  std::vector<float> c(static_cast<std::size_t>(positions * half)), s(c.size());
  for (int p = 0; p < positions; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / d);
      c[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::cos(a));
      s[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::sin(a));
    }
  return {c, s};
}

// One row's inputs for rmsnorm_project: the residual x (fp32, N(0, 9)), the norm weight, a bf16
// delta, and a bf16 projection W [n, k] scaled to keep the outputs O(1).
struct NormProjectInputs {
  std::vector<float> x, w;
  std::vector<bf16> delta, wp;
};
NormProjectInputs norm_project_inputs(Rng& rng, int k, int n) {
  NormProjectInputs in;
  in.x.resize(static_cast<std::size_t>(k));
  in.w.resize(static_cast<std::size_t>(k));
  for (auto& e : in.x) e = static_cast<float>(rng.normal() * 3);
  for (auto& e : in.w) e = static_cast<float>(rng.normal());
  in.delta = random_bf16(rng, in.x.size());
  in.wp.resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(k));
  for (auto& e : in.wp) e = to_bf16(rng.normal() / std::sqrt(static_cast<double>(k)));
  return in;
}

struct Shape {
  int heads, kv_heads, d;
  std::vector<std::pair<int, int>> seqs;  // (tokens already cached, new rows)
  int window = 0;                         // sliding window (0: none); the plain kernel only
};

// Bounds: the plain kernel sums in fp32 and rounds once to bf16 (2⁻⁹ relative of the output's
// scale, plus fp32 noise); the flash kernel also rounds each probability to bf16 (2⁻⁹ relative per
// weight, which averages out over the keys): 1.5e-2 of the largest output bounds both; a wrong key,
// position, head or mask moves outputs by O(1) (values are N(0, 1)).
// One query head's attention in float64: softmax(q·Kᵀ / √d over the keys [first, keys)) · V, d values.
// q: the head's d query values; K and V: a layer's cached rows of kv_dim elements, this head's KV head
// from column kv_col.
std::vector<double> attention_f64(const bf16* q, const bf16* K, const bf16* V, int first, int keys, int d, int kv_dim,
                                  int kv_col) {
  std::vector<double> w(static_cast<std::size_t>(keys), 0.0);
  double mx = -1e300, sum = 0;
  for (int t = first; t < keys; ++t) {
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += static_cast<double>(to_float(q[i])) * to_float(K[t * kv_dim + kv_col + i]);
    w[static_cast<std::size_t>(t)] = dot / std::sqrt(static_cast<double>(d));
    mx = std::max(mx, w[static_cast<std::size_t>(t)]);
  }
  for (int t = first; t < keys; ++t) sum += w[static_cast<std::size_t>(t)] = std::exp(w[static_cast<std::size_t>(t)] - mx);
  std::vector<double> o(static_cast<std::size_t>(d));
  for (int i = 0; i < d; ++i) {
    double acc = 0;
    for (int t = first; t < keys; ++t) acc += w[static_cast<std::size_t>(t)] * to_float(V[t * kv_dim + kv_col + i]);
    o[static_cast<std::size_t>(i)] = acc / sum;
  }
  return o;
}

TEST(ModelOps, AttentionKernelsMatchFloat64) {
  TWELL_REQUIRE_GPU();
  const std::vector<Shape> shapes = {
      {4, 2, 64, {{0, 64}, {0, 1}, {5, 70}, {130, 3}}},
      {8, 8, 64, {{0, 200}, {63, 65}}},
      {2, 1, 128, {{0, 17}, {100, 130}}},
      {4, 4, 64, {{300, 2}, {600, 1}}},  // more keys than the block's 256 threads: several score rounds
      {3, 1, 32, {{0, 5}, {40, 2}}},     // a head_dim without a specialised kernel (the generic one)
      // Sliding windows (Mistral): rows before, at and past the window's end, a window of 1.
      {4, 2, 64, {{0, 64}, {100, 3}}, 16},
      {2, 1, 128, {{300, 2}, {0, 40}}, 33},
      {4, 4, 64, {{600, 1}, {10, 1}}, 300},
      {3, 1, 32, {{40, 2}, {0, 9}}, 4},
      {2, 2, 64, {{7, 2}}, 1},
  };
  Rng rng(fresh_seed());
  for (const Shape& s : shapes) {
    const int Q = s.heads * s.d, KV = s.kv_heads * s.d, ld = Q + 2 * KV;
    const int layers = 2, layer = 1;
    std::vector<DeviceBuffer<__nv_bfloat16>> kbuf, vbuf;
    std::vector<std::vector<bf16>> kh, vh;
    std::vector<cuda::ops::RowKv> rows;
    std::vector<cuda::ops::FlashBlock> blocks;
    int T = 0, max_keys = 0;
    for (auto [cached, n] : s.seqs) {
      const int cap = cached + n;
      kh.push_back(random_bf16(rng, static_cast<std::size_t>(layers * cap * KV)));
      vh.push_back(random_bf16(rng, kh.back().size()));
      kbuf.push_back(upload<__nv_bfloat16>(kh.back()));
      vbuf.push_back(upload<__nv_bfloat16>(vh.back()));
      for (int j = 0; j < n; j += 64) blocks.push_back({T + j, std::min(64, n - j), 0});
      for (int j = 0; j < n; ++j)
        rows.push_back(row_kv(kbuf.back().get(), vbuf.back().get(), static_cast<std::int64_t>(cap) * KV, cached + j));
      T += n;
      max_keys = std::max(max_keys, cap);
    }
    const auto qkv_h = random_bf16(rng, static_cast<std::size_t>(T * ld));
    auto qkv = upload<__nv_bfloat16>(qkv_h);
    auto d_rows = upload(rows);
    auto d_blocks = upload(blocks);
    DeviceBuffer<__nv_bfloat16> o1(static_cast<std::size_t>(T * Q)), o2(o1.size());
    cuda::ops::attention(qkv.get(), T, s.heads, s.kv_heads, s.d, d_rows.get(), layer, max_keys, o1.get(), nullptr,
                         false, s.window);
    const bool flash = s.window == 0 && cuda::ops::flash_attention_supported(s.d);
    if (flash)
      cuda::ops::flash_attention(qkv.get(), static_cast<std::int64_t>(blocks.size()), s.heads, s.kv_heads, s.d,
                                 d_blocks.get(), d_rows.get(), layer, o2.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // o2 is written only where the flash kernel ran (an unwritten buffer is not read: initcheck).
    const auto g1 = download<bf16>(o1), g2 = flash ? download<bf16>(o2) : std::vector<bf16>{};
    // float64 reference (the flash kernel: head_dim 64 and 128 only)
    double e1 = 0, e2 = 0, scale = 0;
    int r = 0;
    for (std::size_t q = 0; q < s.seqs.size(); ++q) {
      const auto [cached, n] = s.seqs[q];
      const int cap = cached + n;
      const bf16* K = kh[q].data() + static_cast<std::size_t>(layer * cap * KV);
      const bf16* V = vh[q].data() + static_cast<std::size_t>(layer * cap * KV);
      for (int j = 0; j < n; ++j, ++r)
        for (int h = 0; h < s.heads; ++h) {
          const int kvh = h / (s.heads / s.kv_heads), keys = cached + j + 1;
          const int first = s.window > 0 && keys > s.window ? keys - s.window : 0;  // keys [first, keys)
          const auto want = attention_f64(qkv_h.data() + static_cast<std::size_t>(r * ld + h * s.d), K, V, first, keys,
                                          s.d, KV, kvh * s.d);
          for (int i = 0; i < s.d; ++i) {
            const double o = want[static_cast<std::size_t>(i)];
            const auto idx = static_cast<std::size_t>(r * Q + h * s.d + i);
            e1 = std::max(e1, std::fabs(to_float(g1[idx]) - o));
            if (flash) e2 = std::max(e2, std::fabs(to_float(g2[idx]) - o));
            scale = std::max(scale, std::fabs(o));
          }
        }
    }
    EXPECT_LT(e1 / scale, 1.5e-2) << "plain kernel, heads " << s.heads << "/" << s.kv_heads << " d " << s.d
                                  << " window " << s.window;
    EXPECT_LT(e2 / scale, 1.5e-2) << "flash kernel, heads " << s.heads << "/" << s.kv_heads << " d " << s.d;
    RecordProperty("err_plain_d" + std::to_string(s.d), std::to_string(e1 / scale));
    RecordProperty("err_flash_d" + std::to_string(s.d), std::to_string(e2 / scale));
  }
}


// One query head's attention in float64 with each output's derived error bound. The per-head
// kernel (tensor_cores false): the output's bf16 rounding, 2⁻⁸ |o|; the fp32 sums over the keys,
// keys · 2⁻²⁴ Σ p|v|; the scores' fp32 error, which moves each probability by a factor
// e^(±(e_t + max e)), e_t = (d + 2) · 2⁻²⁴ Σ_i |q_i k_i| / √d, twice; __expf's (2 + 1.2 |s_t − max|)
// ulps, twice (a probability's error moves the normalised output both through the numerator and the
// denominator). The grouped tensor-core kernel (tensor_cores true): its sums may truncate (2⁻²³ a
// step: the scores' term doubled, the keys' sum at 2⁻²³), P's two bf16 halves (2⁻¹⁶ Σ p|v|), and the
// online softmax's rescalings, each (2 + 1.2 |Δm|) ulps plus a rounding, the Δm adding up to the
// scores' range at most, twice (the tiles' and the warps' combination), and all of it twice again.
struct Bounded {
  std::vector<double> want, bound;
};
Bounded attention_f64_bounded(const bf16* q, const bf16* K, const bf16* V, int first, int keys, int d, int kv_dim,
                              int kv_col, bool tensor_cores) {
  const int n = keys - first;
  std::vector<double> w(static_cast<std::size_t>(n));
  double mx = -1e300, e_score = 0;
  for (int t = 0; t < n; ++t) {
    double dot = 0, mag = 0;
    for (int i = 0; i < d; ++i) {
      const double term = static_cast<double>(to_float(q[i])) * to_float(K[(first + t) * kv_dim + kv_col + i]);
      dot += term;
      mag += std::fabs(term);
    }
    w[static_cast<std::size_t>(t)] = dot / std::sqrt(static_cast<double>(d));
    e_score = std::max(e_score, (d + 2) * std::ldexp(mag / std::sqrt(static_cast<double>(d)), -24));
    mx = std::max(mx, w[static_cast<std::size_t>(t)]);
  }
  double z = 0, e_exp = 0, range = 0;
  for (double& v : w) {
    range = std::max(range, mx - v);
    e_exp = std::max(e_exp, (2.0 + 1.2 * (mx - v)) * std::ldexp(1.0, -23));
    z += (v = std::exp(v - mx));
  }
  e_exp = std::min(e_exp, 1.0);
  const int tiles = (keys - 1) / 64 - first / 64 + 1;  // the grouped kernel's tiles of 64 keys
  // Each probability's relative error δ moves the normalised output by up to 2δ Σ p|v| (numerator
  // and denominator err in opposite directions): the exps' terms count twice, as the scores' do.
  const double rel = tensor_cores ? n * std::ldexp(1.0, -23) + std::ldexp(1.0, -16) + 4 * e_score + 2 * e_exp +
                                        2 * (3.0 * (tiles + 2) + 2.4 * range) * std::ldexp(1.0, -23)
                                  : n * std::ldexp(1.0, -24) + 2 * e_score + 2 * e_exp;
  Bounded out{std::vector<double>(static_cast<std::size_t>(d)), std::vector<double>(static_cast<std::size_t>(d))};
  for (int i = 0; i < d; ++i) {
    double acc = 0, mag = 0;
    for (int t = 0; t < n; ++t) {
      const double pv = w[static_cast<std::size_t>(t)] / z * to_float(V[(first + t) * kv_dim + kv_col + i]);
      acc += pv;
      mag += std::fabs(pv);
    }
    out.want[static_cast<std::size_t>(i)] = acc;
    out.bound[static_cast<std::size_t>(i)] = std::ldexp(std::fabs(acc), -8) + mag * rel + 1e-30;
  }
  return out;
}

// Calls of kAttentionGroupedMinRows (8) rows or more run the grouped tensor-core kernel (a CTA a
// (row, KV head)); fewer rows, and a threshold of 0, the per-head one. Each within its derived float64 bound, element by
// element. A row's bits must not depend on the other rows of its call: a 33-row grouped call equals,
// row for row, the same rows in reverse order, itself run again, and the same caches paged (each
// row's blocks shuffled through its block table); the per-head kernel's 33-row call equals each row
// attended alone (directly and through its block table), and so does the grouped call each row alone
// with grouped_min_rows 1. Groups 1 (MHA), 2, 4 and 8 at head_dim 64 and 128, sliding windows, one
// group the grouped kernel does not take (3: the per-head kernel at any rows), every row its own
// sequence of 0–800 cached keys (several tiles and score rounds; past the staged 640 at head_dim
// 64), decode and not.
// One test a shape (GroupedAttention/…), so that a sanitizer run can split them over processes
// (gtest's GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX; scripts/gpu-check).
struct GroupedShape {
  int heads, kv_heads, d, window;
};
class GroupedAttention : public ::testing::TestWithParam<GroupedShape> {};

TEST_P(GroupedAttention, MatchesFloat64AndItsRowsAlone) {
  TWELL_REQUIRE_GPU();
  const GroupedShape s = GetParam();
  Rng rng(fresh_seed());
  const int Q = s.heads * s.d, KV = s.kv_heads * s.d, ld = Q + 2 * KV, layers = 2, layer = 1, R = 33;
  std::vector<DeviceBuffer<__nv_bfloat16>> kbuf, vbuf;
  std::vector<std::vector<bf16>> kh, vh;
  std::vector<cuda::ops::RowKv> rows;
  int max_keys = 0;
  for (int r = 0; r < R; ++r) {
    const int pos = static_cast<int>(rng.below(801)), cap = pos + 1;
    kh.push_back(random_bf16(rng, static_cast<std::size_t>(layers * cap * KV)));
    vh.push_back(random_bf16(rng, kh.back().size()));
    kbuf.push_back(upload<__nv_bfloat16>(kh.back()));
    vbuf.push_back(upload<__nv_bfloat16>(vh.back()));
    rows.push_back(row_kv(kbuf.back().get(), vbuf.back().get(), static_cast<std::int64_t>(cap) * KV, pos));
    max_keys = std::max(max_keys, cap);
  }
  const auto qkv_h = random_bf16(rng, static_cast<std::size_t>(R * ld));
  // The same rows in reverse order: qkv rows and caches.
  std::vector<bf16> qkv_rev(qkv_h.size());
  std::vector<cuda::ops::RowKv> rows_rev(rows.rbegin(), rows.rend());
  for (int r = 0; r < R; ++r)
    std::copy_n(qkv_h.begin() + static_cast<std::ptrdiff_t>(r) * ld, ld,
                qkv_rev.begin() + static_cast<std::ptrdiff_t>(R - 1 - r) * ld);
  auto qkv = upload<__nv_bfloat16>(qkv_h), qkv_r = upload<__nv_bfloat16>(qkv_rev);
  auto d_rows = upload(rows), d_rows_r = upload(rows_rev);
  // The same caches paged: row r's blocks of kKvBlockRows positions in a shuffled order (its block
  // table), each layer [blocks · 16, KV].
  constexpr int kB = cuda::ops::kKvBlockRows;
  std::vector<DeviceBuffer<__nv_bfloat16>> kpaged, vpaged;
  std::vector<DeviceBuffer<std::int32_t>> tables;
  std::vector<cuda::ops::RowKv> rows_paged;
  for (int r = 0; r < R; ++r) {
    const int cap = rows[static_cast<std::size_t>(r)].pos + 1, nb = (cap + kB - 1) / kB;
    std::vector<std::int32_t> t(static_cast<std::size_t>(nb));
    for (int j = 0; j < nb; ++j) t[static_cast<std::size_t>(j)] = j;
    for (int j = nb - 1; j > 0; --j) std::swap(t[static_cast<std::size_t>(j)], t[static_cast<std::size_t>(rng.below(j + 1))]);
    std::vector<bf16> kp(static_cast<std::size_t>(layers) * nb * kB * KV), vp(kp.size());
    for (int l = 0; l < layers; ++l)
      for (int p = 0; p < cap; ++p) {
        const std::size_t from = (static_cast<std::size_t>(l) * cap + p) * KV;
        const std::size_t to = (static_cast<std::size_t>(l) * nb * kB + static_cast<std::size_t>(t[static_cast<std::size_t>(p / kB)]) * kB + p % kB) * KV;
        std::copy_n(kh[static_cast<std::size_t>(r)].begin() + static_cast<std::ptrdiff_t>(from), KV, kp.begin() + static_cast<std::ptrdiff_t>(to));
        std::copy_n(vh[static_cast<std::size_t>(r)].begin() + static_cast<std::ptrdiff_t>(from), KV, vp.begin() + static_cast<std::ptrdiff_t>(to));
      }
    kpaged.push_back(upload<__nv_bfloat16>(kp));
    vpaged.push_back(upload<__nv_bfloat16>(vp));
    tables.push_back(upload(t));
    rows_paged.push_back(row_kv(kpaged.back().get(), vpaged.back().get(), static_cast<std::int64_t>(nb) * kB * KV, rows[static_cast<std::size_t>(r)].pos));
    rows_paged.back().table = tables.back().get();
  }
  auto d_rows_p = upload(rows_paged);
  const bool grouped = s.heads / s.kv_heads != 3;
  // The 33-row call must take the grouped kernel (groups 1, 2, 4, 8), else every side is per-head.
  EXPECT_EQ(cuda::ops::attention_runs_grouped(R, s.heads, s.kv_heads, s.d, max_keys), grouped);
  EXPECT_FALSE(cuda::ops::attention_runs_grouped(1, s.heads, s.kv_heads, s.d, max_keys));
  constexpr std::int64_t kMin = cuda::ops::kAttentionGroupedMinRows;
  static_assert(kMin > 1 && kMin < 33, "the 33-row call and a row alone sit on either side of the default");
  EXPECT_FALSE(cuda::ops::attention_runs_grouped(kMin - 1, s.heads, s.kv_heads, s.d, max_keys));
  EXPECT_EQ(cuda::ops::attention_runs_grouped(kMin, s.heads, s.kv_heads, s.d, max_keys), grouped);
  // grouped_min_rows moves the threshold (TWELL_TUNING=grouped-attention-min-rows=N).
  EXPECT_EQ(cuda::ops::attention_runs_grouped(1, s.heads, s.kv_heads, s.d, max_keys, 1), grouped);
  EXPECT_FALSE(cuda::ops::attention_runs_grouped(15, s.heads, s.kv_heads, s.d, max_keys, 16));
  EXPECT_EQ(cuda::ops::attention_runs_grouped(16, s.heads, s.kv_heads, s.d, max_keys, 16), grouped);
  EXPECT_FALSE(cuda::ops::attention_runs_grouped(R, s.heads, s.kv_heads, s.d, max_keys, 0));  // no-grouped-attention
  for (const bool decode : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "decode " << decode);
    DeviceBuffer<__nv_bfloat16> all(static_cast<std::size_t>(R * Q)), again(all.size()), rev(all.size()),
        per_head(all.size()), one(all.size()), paged(all.size()), one_grouped(all.size()), one_paged(all.size());
    for (auto* b : {&all, &again, &rev, &per_head, &one, &paged, &one_grouped, &one_paged})
      ASSERT_EQ(cudaMemset(b->get(), 0xff, b->bytes()), cudaSuccess);  // NaN: an unwritten output fails
    const auto call = [&](const DeviceBuffer<__nv_bfloat16>& q, const DeviceBuffer<cuda::ops::RowKv>& rk,
                          DeviceBuffer<__nv_bfloat16>& o, bool g) {
      cuda::ops::attention(q.get(), R, s.heads, s.kv_heads, s.d, rk.get(), layer, max_keys, o.get(), nullptr, decode,
                           s.window, g ? cuda::ops::kAttentionGroupedMinRows : 0);
    };
    call(qkv, d_rows, all, true);
    call(qkv, d_rows, again, true);
    call(qkv_r, d_rows_r, rev, true);
    call(qkv, d_rows, per_head, false);
    call(qkv, d_rows_p, paged, true);
    for (int r = 0; r < R; ++r) {
      cuda::ops::attention(qkv.get() + static_cast<std::size_t>(r * ld), 1, s.heads, s.kv_heads, s.d, d_rows.get() + r,
                           layer, max_keys, one.get() + static_cast<std::size_t>(r * Q), nullptr, decode, s.window);
      // The same row alone with the threshold at one row: the grouped kernel's bits at any rows.
      cuda::ops::attention(qkv.get() + static_cast<std::size_t>(r * ld), 1, s.heads, s.kv_heads, s.d, d_rows.get() + r,
                           layer, max_keys, one_grouped.get() + static_cast<std::size_t>(r * Q), nullptr, decode, s.window,
                           /*grouped_min_rows=*/1);
      // The same row alone through its block table (a decode row alone stages its keys in shared memory).
      cuda::ops::attention(qkv.get() + static_cast<std::size_t>(r * ld), 1, s.heads, s.kv_heads, s.d, d_rows_p.get() + r,
                           layer, max_keys, one_paged.get() + static_cast<std::size_t>(r * Q), nullptr, decode, s.window);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto ga = download<std::uint16_t>(all), gg = download<std::uint16_t>(again), gr = download<std::uint16_t>(rev),
               gp = download<std::uint16_t>(per_head), go = download<std::uint16_t>(one),
               gpaged = download<std::uint16_t>(paged);
    EXPECT_EQ(ga, gg) << "the grouped call's bits differ from run to run";
    EXPECT_EQ(ga, gpaged) << "the paged caches (the same values through block tables) give other bits";
    bool same_rev = true;
    for (int r = 0; r < R; ++r)
      same_rev = same_rev && std::equal(ga.begin() + static_cast<std::ptrdiff_t>(r) * Q, ga.begin() + static_cast<std::ptrdiff_t>(r + 1) * Q,
                                        gr.begin() + static_cast<std::ptrdiff_t>(R - 1 - r) * Q);
    EXPECT_TRUE(same_rev) << "a row's bits depend on the other rows of its call";
    EXPECT_EQ(gp, go) << "the per-head kernel's rows depend on the call's rows";
    EXPECT_EQ(download<std::uint16_t>(one_paged), go) << "a row alone through its block table gives other bits";
    EXPECT_EQ(download<std::uint16_t>(one_grouped), grouped ? ga : go)
        << "a row alone under grouped_min_rows 1 differs from its row in the 33-row call";
    // float64, element by element within the derived bounds.
    double worst_all = 0, worst_one = 0;
    for (int r = 0; r < R; ++r) {
      const int keys = rows[static_cast<std::size_t>(r)].pos + 1, cap = keys;
      const int first = s.window > 0 && keys > s.window ? keys - s.window : 0;
      const bf16* K = kh[static_cast<std::size_t>(r)].data() + static_cast<std::size_t>(layer * cap * KV);
      const bf16* V = vh[static_cast<std::size_t>(r)].data() + static_cast<std::size_t>(layer * cap * KV);
      for (int h = 0; h < s.heads; ++h) {
        const int kvh = h / (s.heads / s.kv_heads);
        const bf16* q = qkv_h.data() + static_cast<std::size_t>(r * ld + h * s.d);
        const auto tc = attention_f64_bounded(q, K, V, first, keys, s.d, KV, kvh * s.d, grouped);
        const auto ph = attention_f64_bounded(q, K, V, first, keys, s.d, KV, kvh * s.d, false);
        for (int i = 0; i < s.d; ++i) {
          const auto at = static_cast<std::size_t>(r * Q + h * s.d + i);
          bf16 a, o;
          a.bits = ga[at];
          o.bits = go[at];
          const double ea = std::fabs(to_float(a) - tc.want[static_cast<std::size_t>(i)]) / tc.bound[static_cast<std::size_t>(i)];
          const double eo = std::fabs(to_float(o) - ph.want[static_cast<std::size_t>(i)]) / ph.bound[static_cast<std::size_t>(i)];
          worst_all = std::max(worst_all, std::isnan(ea) ? INFINITY : ea);
          worst_one = std::max(worst_one, std::isnan(eo) ? INFINITY : eo);
        }
      }
    }
    EXPECT_LE(worst_all, 1.0) << "the 33-row call (grouped: " << grouped << ") against its bound";
    EXPECT_LE(worst_one, 1.0) << "one row at a time (the per-head kernel) against its bound";
    RecordProperty("worst_error_of_bound_grouped", std::to_string(worst_all));
    RecordProperty("worst_error_of_bound_per_head", std::to_string(worst_one));
  }
}

// Groups 1 (MHA), 2, 4 and 8 at head_dim 64 and 128, sliding windows, and group 3 (per-head only).
INSTANTIATE_TEST_SUITE_P(Shapes, GroupedAttention,
                         ::testing::Values(GroupedShape{8, 4, 64, 0}, GroupedShape{8, 2, 64, 0}, GroupedShape{16, 2, 64, 0},
                                           GroupedShape{8, 2, 128, 0}, GroupedShape{16, 2, 128, 0}, GroupedShape{8, 4, 128, 0},
                                           GroupedShape{8, 2, 64, 40}, GroupedShape{8, 4, 128, 100}, GroupedShape{6, 2, 64, 0},
                                           GroupedShape{8, 8, 64, 0}, GroupedShape{4, 4, 128, 0}, GroupedShape{8, 8, 64, 40}),
                         [](const ::testing::TestParamInfo<GroupedShape>& i) {
                           const GroupedShape& g = i.param;
                           return "h" + std::to_string(g.heads) + "_kv" + std::to_string(g.kv_heads) + "_d" + std::to_string(g.d) +
                                  (g.window > 0 ? "_w" + std::to_string(g.window) : std::string());
                         });

// A decode step's attention (every row its sequence's one new token) with old_keys_ready loads the
// keys below each row's position before waiting for the kernel before it; the row's own key and
// value, and q, must still be read after. The kernel before it here is a late writer (late_writer.hpp:
// it lets the attention start, then spins ≈ 100 µs before copying in the rotated qkv and the caches
// with the new rows), launched programmatically on a non-blocking stream: an attention that read
// anything new before its wait would see the old bytes. Against rope_store_kv then attention without
// the flag or programmatic launches, bit for bit, at positions around the first loop step's ends
// (255, 256, the V step's 64 / 128 keys; the grouped kernel's tiles of 64 keys, the row's own key in
// a first tile or a later one), head_dim 64 and 128, GQA and MHA, sliding windows; 33 rows, so that
// every case runs the grouped kernel, and again with grouped off (the per-head kernel, which calls
// of fewer rows run); each with the caches in order and paged (every row's blocks shuffled
// through its block table, which is written before the step, as the runtime's are). With grouped
// off, also one row a call: the per-head kernel's staged form (its old keys copied into shared
// memory before the wait), which only grids on a quarter of the SMs take. (Without sm_90 the
// launches are plain and the test checks the values only.)
TEST(ModelOps, DecodeAttentionReadsOldKeysEarlyAndTheNewOneAfter) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  struct Case {
    int heads, kv_heads, d, window;
  };
  std::vector<int> positions;
  for (int k = 0; k < 3; ++k)
    for (int p : {0, 1, 63, 64, 127, 128, 129, 255, 256, 300, 700}) positions.push_back(p + k);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const Case cs : {Case{4, 2, 64, 0}, Case{8, 8, 64, 0}, Case{4, 1, 128, 0}, Case{2, 2, 128, 0}, Case{4, 2, 64, 40},
                        Case{4, 1, 128, 100}})
    for (const bool grouped : {true, false})
      for (const bool paged : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d << " window "
                                          << cs.window << " grouped " << grouped << " paged " << paged);
        const int Q = cs.heads * cs.d, KV = cs.kv_heads * cs.d, ld = Q + 2 * KV;
        const int layers = 2, layer = 1, T = static_cast<int>(positions.size());
        int cap = 0;
        for (int p : positions) cap = std::max(cap, p + 1);
        const int blocks = (cap + cuda::ops::kKvBlockRows - 1) / cuda::ops::kKvBlockRows;
        const int cap16 = blocks * cuda::ops::kKvBlockRows;  // a row's cache rows (whole blocks)
        const auto [cos_t, sin_t] = rope_tables(cap, cs.d);
        auto dcos = upload(cos_t), dsin = upload(sin_t);
        // One buffer: qkv [T, ld], then each row's K cache, then each row's V cache ([layers, cap16, KV]).
        const std::size_t qkv_n = static_cast<std::size_t>(T) * ld, cache_n = static_cast<std::size_t>(layers) * cap16 * KV;
        const std::size_t total = qkv_n + 2 * static_cast<std::size_t>(T) * cache_n;
        const auto init = random_bf16(rng, total);
        auto a = upload<__nv_bfloat16>(init), b = upload<__nv_bfloat16>(init);
        // Paged: row r's blocks in a shuffled order within its own cache.
        auto d_tables = upload(shuffled_block_tables(rng, T, blocks));
        auto rows_in = [&](DeviceBuffer<__nv_bfloat16>& buf) {
          return upload(rows_of_step_buffer(buf.get(), T, qkv_n, cache_n, static_cast<std::int64_t>(cap16) * KV,
                                            paged ? d_tables.get() : nullptr, blocks,
                                            [&](int r) { return positions[static_cast<std::size_t>(r)]; }));
        };
        auto rows_a = rows_in(a), rows_b = rows_in(b);
        EXPECT_TRUE(cuda::ops::attention_runs_grouped(T, cs.heads, cs.kv_heads, cs.d, cap));
        DeviceBuffer<__nv_bfloat16> out_ref(static_cast<std::size_t>(T) * Q), out_early(out_ref.size());
        // Reference: a's new rows written, then the attention reads them (plain launches, flag off).
        cuda::ops::rope_store_kv(a.get(), T, cs.heads, cs.kv_heads, cs.d, dcos.get(), dsin.get(), rows_a.get(), layer, stream);
        cuda::ops::attention(a.get(), T, cs.heads, cs.kv_heads, cs.d, rows_a.get(), layer, cap, out_ref.get(), stream, false,
                             cs.window, grouped ? cuda::ops::kAttentionGroupedMinRows : 0);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        {  // b gets a's state late, then the attention with the flag, launched programmatically
          const cuda::ProgrammaticLaunch programmatic(cuda::programmatic_launch_supported());
          late_copy(a.get(), b.get(), total * sizeof(__nv_bfloat16), 100, stream);
          cuda::ops::attention(b.get(), T, cs.heads, cs.kv_heads, cs.d, rows_b.get(), layer, cap, out_early.get(), stream,
                               true, cs.window, grouped ? cuda::ops::kAttentionGroupedMinRows : 0);
        }
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const auto want = download<bf16>(out_ref), got = download<bf16>(out_early);
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(bf16)), 0);
        if (grouped) continue;
        // One row a call (rows · heads · 4 ≤ the SMs): the per-head kernel's staged form, its old
        // keys copied into shared memory before the wait and its own key after; the first 11 rows
        // (positions 0 … 700, inside and past the stage), each late as above, against the same rows
        // of the 33-row reference.
        auto init_d = upload<__nv_bfloat16>(init);
        DeviceBuffer<__nv_bfloat16> out_one(static_cast<std::size_t>(Q));
        for (int r = 0; r < 11; ++r) {
          SCOPED_TRACE(::testing::Message() << "one row: " << r << " at position " << positions[static_cast<std::size_t>(r)]);
          ASSERT_EQ(cudaMemcpyAsync(b.get(), init_d.get(), total * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice, stream),
                    cudaSuccess);
          {
            const cuda::ProgrammaticLaunch programmatic(cuda::programmatic_launch_supported());
            late_copy(a.get(), b.get(), total * sizeof(__nv_bfloat16), 100, stream);
            cuda::ops::attention(b.get() + static_cast<std::size_t>(r) * ld, 1, cs.heads, cs.kv_heads, cs.d,
                                 rows_b.get() + r, layer, cap, out_one.get(), stream, true, cs.window, 0);
          }
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          const auto one = download<bf16>(out_one);
          EXPECT_EQ(std::memcmp(want.data() + static_cast<std::size_t>(r) * Q, one.data(), one.size() * sizeof(bf16)), 0);
        }
      }
  cudaStreamDestroy(stream);
}

// The decode GEMV (twell_gemv: the projections and logits at a few tokens) and the one-token FFN
// kernels (twell_decode_token) read x only once the kernel before them is done, under programmatic
// launches too — the guard for any version that moves its weight loads ahead of the wait (one did:
// a75eded, measured no faster, not kept). x arrives late (late_copy spins 100 µs after the kernel
// before it lets the next one start), and the outputs must equal plain launches' over the final x
// bit for bit: a kernel that read x early would see the buffer's earlier contents (another random
// x) every time. Shapes: tails of a warp's rows (N = 2053), rows of several load windows (K = 4096,
// 8192), 1, 3, 5 and 12 tokens (W before the wait at 1 token, as the runtime's output projection
// and the dense down GEMV load it, and on the tensor-core kernel from 2 at 5 and 12), fp32 and bf16
// output; the FFN gated and non-gated (≈ half the neurons active).
TEST(ModelOps, WeightFirstKernelsReadXAfterTheWait) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const bool pdl = cuda::programmatic_launch_supported();
  struct GemvCase {
    std::int64_t m, n, k;
    bool f32;
  };
  // One token at K = 5632: the dense down GEMV's shape (three load windows, the first before the wait).
  for (const GemvCase c : {GemvCase{1, 2053, 2048, false}, GemvCase{1, 2053, 5632, false}, GemvCase{3, 2053, 8192, true},
                           GemvCase{1, 64, 4096, true}, GemvCase{5, 2053, 2048, false}, GemvCase{12, 1000, 4096, false}}) {
    SCOPED_TRACE(::testing::Message() << "gemv m " << c.m << " n " << c.n << " k " << c.k);
    auto w = upload<__nv_bfloat16>(random_bf16(rng, static_cast<std::size_t>(c.n * c.k)));
    const auto xv = random_bf16(rng, static_cast<std::size_t>(c.m * c.k));
    auto x = upload<__nv_bfloat16>(xv), late = upload<__nv_bfloat16>(random_bf16(rng, xv.size()));
    DeviceBuffer<float> ref32(static_cast<std::size_t>(c.m * c.n)), got32(ref32.size());
    DeviceBuffer<__nv_bfloat16> ref(ref32.size()), got(ref32.size());
    const auto run = [&](const __nv_bfloat16* xp, float* y32, __nv_bfloat16* y) {
      if (c.f32) {
        cuda::launch_twell_gemv_f32(xp, c.m, w.get(), c.n, c.k, y32, stream);
      } else if (c.m == 1) {  // as the runtime's output projection: W's window before the wait
        cuda::launch_twell_gemv_row(xp, w.get(), c.n, c.k, y, stream, /*w_before_wait=*/true);
      } else {  // the runtime's batched projections: W's first window before the wait, x after it
        cuda::TwellGemvParams p = cuda::gemv_rows(xp, c.m, w.get(), c.n, c.k);
        p.g = y;
        p.w_before_wait = true;
        cuda::launch_twell_gemv(p, stream);
      }
    };
    run(x.get(), ref32.get(), ref.get());
    {
      const cuda::ProgrammaticLaunch programmatic(pdl);
      late_copy(x.get(), late.get(), xv.size() * sizeof(bf16), 100, stream);
      run(late.get(), got32.get(), got.get());
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    if (c.f32) {
      const auto want = download<float>(ref32), have = download<float>(got32);
      EXPECT_EQ(std::memcmp(want.data(), have.data(), want.size() * sizeof(float)), 0);
    } else {
      const auto want = download<bf16>(ref), have = download<bf16>(got);
      EXPECT_EQ(std::memcmp(want.data(), have.data(), want.size() * sizeof(bf16)), 0);
    }
  }
  struct TokenCase {
    std::int64_t n, k;
    bool gated;
  };
  for (const TokenCase c : {TokenCase{5632, 2048, true}, TokenCase{1003, 4096, false}, TokenCase{70, 8192, true}}) {
    SCOPED_TRACE(::testing::Message() << "decode_token n " << c.n << " k " << c.k << (c.gated ? " gated" : " non-gated"));
    const auto nk = static_cast<std::size_t>(c.n * c.k);
    auto w_first = upload<__nv_bfloat16>(random_bf16(rng, nk)), w_up = upload<__nv_bfloat16>(random_bf16(rng, nk)),
         w_down_t = upload<__nv_bfloat16>(random_bf16(rng, nk));
    const auto xv = random_bf16(rng, static_cast<std::size_t>(c.k));
    auto x = upload<__nv_bfloat16>(xv), late = upload<__nv_bfloat16>(random_bf16(rng, xv.size()));
    DeviceBuffer<__nv_bfloat16> ref(static_cast<std::size_t>(c.k)), got(ref.size());
    DeviceBuffer<float> h(static_cast<std::size_t>(c.n));
    DeviceBuffer<unsigned char> flags(static_cast<std::size_t>(cuda::decode_token_flag_bytes(c.n)));
    ASSERT_EQ(cudaMemsetAsync(flags.get(), 0, flags.bytes(), stream), cudaSuccess);
    DeviceBuffer<unsigned long long> nnz(2);
    const auto run = [&](const __nv_bfloat16* xp, __nv_bfloat16* y, unsigned long long* count) {
      cuda::TwellDecodeTokenParams p = token_params(c.n, c.k, c.gated, w_first, w_up, w_down_t, h, flags, y, count);
      p.x = xp;
      cuda::launch_twell_decode_token(p, stream);
    };
    run(x.get(), ref.get(), nnz.get());
    {
      const cuda::ProgrammaticLaunch programmatic(pdl);
      late_copy(x.get(), late.get(), xv.size() * sizeof(bf16), 100, stream);
      run(late.get(), got.get(), nnz.get() + 1);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto want = download<bf16>(ref), have = download<bf16>(got);
    EXPECT_EQ(std::memcmp(want.data(), have.data(), want.size() * sizeof(bf16)), 0);
    const auto counts = download<unsigned long long>(nnz);
    EXPECT_EQ(counts[0], counts[1]);
    // Some neuron fired (else the comparison above proves little). With n = 5 random gates none
    // fires in 1 run of 32 (TWELL_TEST_SEED=5547865905559125050 did so): there the all-zero row is
    // the edge case checked above; from n = 70 up the chance of no active neuron is below 2^-70.
    if (c.n >= 64) {
      EXPECT_GT(counts[0], 0u);
    }
  }
  cudaStreamDestroy(stream);
}

// ops::gated_product for each activation: h = bf16(act(g) · u) within 2⁻⁸ (with slack near the
// activation's zeros) of float64 on the same bf16 g and u; the vector path (both strides multiples
// of 8, a scalar tail where n is not) bit for bit the scalar path (odd strides) on the same values;
// in place (h = g, the engine's hot neurons) bit for bit out of place, the u half and the g rows'
// padding left as they were; h's columns past n untouched. Then what it cannot take is refused.
TEST(ModelOps, GatedProductMatchesFloat64OnEveryPath) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const std::uint16_t kSentinel = 0x4b1d;
  struct Case {
    std::int64_t m, n, ld;  // ld ≥ n: the vector layout's strides ([g | u] rows of 2 · ld, h rows of ld)
  };
  for (const Case c : {Case{1, 5632, 5632}, Case{3, 1003, 1008}, Case{2, 37, 40}, Case{4, 8, 8}}) {
    // g and u of every row (m × n each), as bf16 bits
    const auto gv = random_bf16(rng, static_cast<std::size_t>(c.m * c.n)), uv = random_bf16(rng, gv.size());
    // vector layout: row r of [g | u] at r · 2·ld (u at + ld); scalar layout: strides 2·n + 1 and n + 1
    const std::int64_t ld_vec = 2 * c.ld, ld_odd = 2 * c.n + 1;
    std::vector<bf16> vec(static_cast<std::size_t>(c.m * ld_vec), std::bit_cast<bf16>(kSentinel)),
        odd(static_cast<std::size_t>(c.m * ld_odd), std::bit_cast<bf16>(kSentinel));
    for (std::int64_t r = 0; r < c.m; ++r)
      for (std::int64_t j = 0; j < c.n; ++j) {
        const auto e = static_cast<std::size_t>(r * c.n + j);
        vec[static_cast<std::size_t>(r * ld_vec + j)] = gv[e];
        vec[static_cast<std::size_t>(r * ld_vec + c.ld + j)] = uv[e];
        odd[static_cast<std::size_t>(r * ld_odd + j)] = gv[e];
        odd[static_cast<std::size_t>(r * ld_odd + c.n + j)] = uv[e];
      }
    auto d_vec = upload<__nv_bfloat16>(vec), d_odd = upload<__nv_bfloat16>(odd), d_inplace = upload<__nv_bfloat16>(vec);
    const std::vector<std::uint16_t> fill_vec(static_cast<std::size_t>(c.m * c.ld), kSentinel),
        fill_odd(static_cast<std::size_t>(c.m * (c.n + 1)), kSentinel);
    DeviceBuffer<__nv_bfloat16> h_vec(fill_vec.size()), h_odd(fill_odd.size());
    for (int act = 0; act < 4; ++act) {
      SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " ld " << c.ld << " act " << act);
      ASSERT_EQ(::twell::cuda::test::h2d(h_vec.get(), fill_vec.data(), h_vec.bytes()), cudaSuccess);
      ASSERT_EQ(::twell::cuda::test::h2d(h_odd.get(), fill_odd.data(), h_odd.bytes()), cudaSuccess);
      ASSERT_EQ(::twell::cuda::test::h2d(d_inplace.get(), vec.data(), vec.size() * sizeof(bf16)), cudaSuccess);
      cuda::ops::gated_product(d_vec.get(), d_vec.get() + c.ld, ld_vec, h_vec.get(), c.ld, c.m, c.n, act, stream);
      cuda::ops::gated_product(d_odd.get(), d_odd.get() + c.n, ld_odd, h_odd.get(), c.n + 1, c.m, c.n, act, stream);
      cuda::ops::gated_product(d_inplace.get(), d_inplace.get() + c.ld, ld_vec, d_inplace.get(), ld_vec, c.m, c.n, act,
                               stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto hv = download<bf16>(h_vec), ho = download<bf16>(h_odd), hi = download<bf16>(d_inplace);
      std::int64_t bad = 0, paths = 0, inplace = 0, padding = 0;
      for (std::int64_t r = 0; r < c.m; ++r) {
        for (std::int64_t j = 0; j < c.n; ++j) {
          const auto e = static_cast<std::size_t>(r * c.n + j);
          const double g = to_float(gv[e]), u = to_float(uv[e]), want = activation_f64(act, g) * u;
          const auto v = std::bit_cast<std::uint16_t>(hv[static_cast<std::size_t>(r * c.ld + j)]);
          bad += !(std::abs(to_float(std::bit_cast<bf16>(v)) - want) <=
                   std::ldexp(std::abs(want), -8) + std::abs(u) * std::abs(g) * std::ldexp(1.0, -20));
          paths += v != std::bit_cast<std::uint16_t>(ho[static_cast<std::size_t>(r * (c.n + 1) + j)]);
          inplace += v != std::bit_cast<std::uint16_t>(hi[static_cast<std::size_t>(r * ld_vec + j)]);
        }
        for (std::int64_t j = c.n; j < ld_vec; ++j)  // in place: the g row's padding and the u half as they were
          inplace += std::bit_cast<std::uint16_t>(hi[static_cast<std::size_t>(r * ld_vec + j)]) !=
                     std::bit_cast<std::uint16_t>(vec[static_cast<std::size_t>(r * ld_vec + j)]);
        for (std::int64_t j = c.n; j < c.ld; ++j)
          padding += std::bit_cast<std::uint16_t>(hv[static_cast<std::size_t>(r * c.ld + j)]) != kSentinel;
        padding += std::bit_cast<std::uint16_t>(ho[static_cast<std::size_t>(r * (c.n + 1) + c.n)]) != kSentinel;
      }
      EXPECT_EQ(bad, 0) << "against float64";
      EXPECT_EQ(paths, 0) << "vector path against scalar path";
      EXPECT_EQ(inplace, 0) << "in place against out of place";
      EXPECT_EQ(padding, 0) << "columns past n written";
    }
  }
  DeviceBuffer<__nv_bfloat16> b(64);
  const auto refused = [&](const char* what, const __nv_bfloat16* g, std::int64_t ld_gu, std::int64_t ld_h, int act,
                           std::int64_t m = 1, std::int64_t n = 8, const __nv_bfloat16* u = nullptr,
                           __nv_bfloat16* h = nullptr) {
    try {
      cuda::ops::gated_product(g, u ? u : b.get() + 8, ld_gu, h ? h : b.get() + 32, ld_h, m, n, act, stream);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << what << ": " << e.what();
    }
  };
  refused("activation 4", b.get(), 16, 8, 4);
  refused("activation -1", b.get(), 16, 8, -1);
  refused("ld_gu < n", b.get(), 7, 8, 0);
  refused("ld_h < n", b.get(), 16, 7, 0);
  refused("null g", nullptr, 16, 8, 0);
  refused("m = 0", b.get(), 16, 8, 0, 0);
  refused("n = 0", b.get(), 16, 8, 0, 1, 0);
  refused("u misaligned on the vector path", b.get(), 16, 8, 0, 1, 8, b.get() + 9);
  refused("h misaligned on the vector path", b.get(), 16, 8, 0, 1, 8, nullptr, b.get() + 33);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
}

// The one-token GEMV's gated epilogue (TwellGemvParams::h: W = [Wg; Wu], a warp holding gate row i
// and up row i) for each activation. [g | u] as the plain GEMV stores it, bit for bit; each stored
// g and u within the bf16 bound of its float64 dot product; h bit for bit what ops::gated_product
// (the kernel the epilogue replaces at one row) makes of that [g | u],
// and within 2⁻⁸ (with slack near the activation's zeros) of float64 act(g) · u on the stored g, u;
// h past h_n untouched (the engine's padded neurons). Both one-token shapes (2 · up_row > 4096: two
// neurons a warp, a last warp with one), K on both sides of the first window, W before the wait or
// not; then under programmatic launches behind a late writer of x: the same bits.
TEST(ModelOps, GemvGatedEpilogueIsTheStoredProduct) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const bool pdl = cuda::programmatic_launch_supported();
  struct Case {
    std::int64_t up_row, h_n, k;
  };
  const std::uint16_t kSentinel = 0x4b1d;  // a bf16 no epilogue stores past h_n
  for (const Case c : {Case{5632, 5632, 2048}, Case{2048, 2048, 5632}, Case{2051, 2049, 4096}, Case{1008, 1000, 520},
                       Case{3, 3, 8}}) {
    const std::int64_t rows = 2 * c.up_row;
    const auto wv = random_bf16(rng, static_cast<std::size_t>(rows * c.k));
    const auto xv = random_bf16(rng, static_cast<std::size_t>(c.k));
    auto w = upload<__nv_bfloat16>(wv), x = upload<__nv_bfloat16>(xv), late = upload<__nv_bfloat16>(xv);
    // float64 dot products of every row, and their magnitudes (the bound's terms)
    std::vector<double> dot(static_cast<std::size_t>(rows)), mag(dot.size());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < c.k; ++j) {
        const double t = static_cast<double>(to_float(wv[static_cast<std::size_t>(r * c.k + j)])) *
                         to_float(xv[static_cast<std::size_t>(j)]);
        dot[static_cast<std::size_t>(r)] += t;
        mag[static_cast<std::size_t>(r)] += std::abs(t);
      }
    DeviceBuffer<__nv_bfloat16> gu_plain(static_cast<std::size_t>(rows)), gu(gu_plain.size()),
        h_want(static_cast<std::size_t>(c.h_n)), h(static_cast<std::size_t>(c.up_row));
    cuda::TwellGemvParams plain = cuda::gemv_rows(x.get(), 1, w.get(), rows, c.k);
    plain.g = gu_plain.get();
    cuda::launch_twell_gemv(plain, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto plain_v = download<bf16>(gu_plain);
    std::int64_t bad_gu = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto i = static_cast<std::size_t>(r);
      bad_gu += !(std::abs(to_float(plain_v[i]) - dot[i]) <=
                  std::ldexp(std::abs(dot[i]), -8) + mag[i] * static_cast<double>(c.k) * std::ldexp(1.0, -24) + 1e-30);
    }
    EXPECT_EQ(bad_gu, 0) << "[g | u] against float64 (up_row " << c.up_row << ", k " << c.k << ")";
    for (int act = 0; act < 4; ++act) {
      SCOPED_TRACE(::testing::Message() << "up_row " << c.up_row << " h_n " << c.h_n << " k " << c.k << " act " << act);
      // the stored product on [g | u]'s first h_n neurons
      cuda::ops::gated_product(gu_plain.get(), gu_plain.get() + c.up_row, rows, h_want.get(), c.h_n, 1, c.h_n, act, stream);
      const std::vector<std::uint16_t> fill(static_cast<std::size_t>(c.up_row), kSentinel);
      const auto clear = [&] {  // h all sentinels, [g | u] all NaN, before a launch
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        ASSERT_EQ(::twell::cuda::test::h2d(h.get(), fill.data(), fill.size() * sizeof(std::uint16_t)), cudaSuccess);
        ASSERT_EQ(cudaMemsetAsync(gu.get(), 0xff, gu.bytes(), stream), cudaSuccess);
      };
      const auto gated = [&](const __nv_bfloat16* xp, bool early) {
        cuda::TwellGemvParams p = cuda::gemv_rows(xp, 1, w.get(), rows, c.k);
        p.g = gu.get();
        p.h = h.get();
        p.up_row = c.up_row;
        p.h_n = c.h_n;
        p.act = act;
        p.w_before_wait = early;
        cuda::launch_twell_gemv(p, stream);
      };
      const auto check = [&](const char* what) {
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const auto guv = download<bf16>(gu), hv = download<bf16>(h), want = download<bf16>(h_want);
        EXPECT_EQ(std::memcmp(guv.data(), plain_v.data(), guv.size() * sizeof(bf16)), 0) << what << ": [g | u]";
        EXPECT_EQ(std::memcmp(hv.data(), want.data(), want.size() * sizeof(bf16)), 0) << what << ": h against gated_product";
        std::int64_t past = 0, bad_h = 0, nonzero = 0;
        for (std::int64_t i = c.h_n; i < c.up_row; ++i) past += std::bit_cast<std::uint16_t>(hv[static_cast<std::size_t>(i)]) != kSentinel;
        for (std::int64_t i = 0; i < c.h_n; ++i) {
          const double g = to_float(guv[static_cast<std::size_t>(i)]), u = to_float(guv[static_cast<std::size_t>(c.up_row + i)]);
          const double want_h = activation_f64(act, g) * u, got_h = to_float(hv[static_cast<std::size_t>(i)]);
          bad_h += !(std::abs(got_h - want_h) <= std::ldexp(std::abs(want_h), -8) + std::abs(u) * std::abs(g) * std::ldexp(1.0, -20));
          nonzero += got_h != 0.0;
        }
        EXPECT_EQ(past, 0) << what << ": h past h_n written";
        EXPECT_EQ(bad_h, 0) << what << ": h against float64 act(g) · u";
        if (c.h_n >= 64) {
          EXPECT_GT(nonzero, 0) << what;
        }
      };
      for (const bool early : {false, true}) {
        clear();
        gated(x.get(), early);
        check(early ? "W before the wait" : "W after the wait");
      }
      for (const bool early : {false, true}) {
        // late holds other random values until late_copy lands x in it
        const auto other = random_bf16(rng, xv.size());
        ASSERT_EQ(::twell::cuda::test::h2d(late.get(), other.data(), other.size() * sizeof(bf16)), cudaSuccess);
        clear();
        {
          const cuda::ProgrammaticLaunch programmatic(pdl);
          late_copy(x.get(), late.get(), xv.size() * sizeof(bf16), 100, stream);
          gated(late.get(), early);
        }
        check(early ? "behind a late writer of x, W before the wait" : "behind a late writer of x");
      }
    }
  }
  // What the epilogue cannot take is refused by its own checks (invalid_argument; the general
  // shape check would say unsupported), not run
  DeviceBuffer<__nv_bfloat16> w(64 * 8), x(16), gu(64), h(32);
  DeviceBuffer<float> g32(64), r(64);
  const auto params = [&] {
    cuda::TwellGemvParams p = cuda::gemv_rows(x.get(), 1, w.get(), 64, 8);
    p.g = gu.get();
    p.h = h.get();
    p.up_row = 32;
    p.h_n = 32;
    return p;
  };
  const auto refused = [&](const cuda::TwellGemvParams& p, const char* what) {
    try {
      cuda::launch_twell_gemv(p, stream);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << what << ": " << e.what();
    }
  };
  auto p = params();
  p.up_row = 31;
  refused(p, "N ≠ 2 · up_row");
  p = params();
  p.h_n = 33;
  refused(p, "h_n > up_row");
  p = params();
  p.h_n = 0;
  refused(p, "h_n = 0");
  p = params();
  p.relu = true;
  refused(p, "ReLU on [g | u]");
  p = params();
  p.act = 4;
  refused(p, "activation 4");
  p = params();
  p.m = 2;
  p.ld_g = 64;
  refused(p, "two tokens");
  p = params();
  p.g = nullptr;
  p.g32 = g32.get();
  refused(p, "fp32 output");
  p = params();
  p.residual = r.get();
  refused(p, "a residual add");
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
}

// The one-token FFN kernels with the add + RMSNorm before them folded in (DecodeTokenNorm: each CTA
// of the first kernel normalises r + first + delta, the down kernel stores that sum into r) against
// add_rmsnorm, then the same kernels on its output: y and r bit for bit, the same count. K on both
// sides of 4096 (norm_row's 4-wide branch and its element-wise one), K = 8, N smaller than a CTA's
// warps, gated and non-gated, without `first`, and y aliasing `first` (as the runtime calls it).
// The folded run goes under programmatic launches with delta arriving late (late_copy): a first
// kernel that read the residual stream before its wait would see another random delta.
TEST(ModelOps, DecodeTokenFoldsTheResidualNormBitForBit) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const bool pdl = cuda::programmatic_launch_supported();
  struct Case {
    std::int64_t n, k;
    bool gated, first, alias;
  };
  for (const Case c : {Case{5632, 2048, true, true, true}, Case{1003, 4104, false, true, false}, Case{70, 8192, true, false, false},
                       Case{5, 8, true, true, true}, Case{300, 264, false, true, true}, Case{2053, 4096, true, true, false}}) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << " k " << c.k << (c.gated ? " gated" : " non-gated")
                                      << (c.first ? " first" : "") << (c.alias ? " y = first" : ""));
    const auto nk = static_cast<std::size_t>(c.n * c.k), k = static_cast<std::size_t>(c.k);
    auto w_first = upload<__nv_bfloat16>(random_bf16(rng, nk)), w_up = upload<__nv_bfloat16>(random_bf16(rng, nk)),
         w_down_t = upload<__nv_bfloat16>(random_bf16(rng, nk));
    std::vector<float> rv(k), wv(k);
    for (auto& e : rv) e = static_cast<float>(3.0 * rng.normal());
    for (auto& e : wv) e = static_cast<float>(1.0 + 0.25 * rng.normal());
    const auto firstv = random_bf16(rng, k), deltav = random_bf16(rng, k);
    auto r_ref = upload(rv), r_got = upload(rv), w = upload(wv);
    auto first = upload<__nv_bfloat16>(firstv), delta = upload<__nv_bfloat16>(deltav);
    auto late = upload<__nv_bfloat16>(random_bf16(rng, k));  // delta's values arrive here late
    auto first_got = upload<__nv_bfloat16>(firstv);           // y aliases it in the folded run
    DeviceBuffer<__nv_bfloat16> xn(k), y_ref(k), y_sep(k);
    DeviceBuffer<float> h(static_cast<std::size_t>(c.n));
    DeviceBuffer<unsigned char> flags(static_cast<std::size_t>(cuda::decode_token_flag_bytes(c.n)));
    ASSERT_EQ(cudaMemsetAsync(flags.get(), 0, flags.bytes(), stream), cudaSuccess);
    DeviceBuffer<unsigned long long> nnz(2);
    const auto params = [&](__nv_bfloat16* y, unsigned long long* count) {
      return token_params(c.n, c.k, c.gated, w_first, w_up, w_down_t, h, flags, y, count);
    };
    const float eps = 1e-5f;
    cuda::ops::add_rmsnorm(r_ref.get(), delta.get(), 1, c.k, w.get(), eps, xn.get(), stream, c.first ? first.get() : nullptr);
    cuda::TwellDecodeTokenParams ref = params(y_ref.get(), nnz.get());
    ref.x = xn.get();
    cuda::launch_twell_decode_token(ref, stream);
    __nv_bfloat16* y_got = c.alias ? first_got.get() : y_sep.get();
    {
      const cuda::ProgrammaticLaunch programmatic(pdl);
      late_copy(delta.get(), late.get(), k * sizeof(bf16), 100, stream);
      cuda::TwellDecodeTokenParams p = params(y_got, nnz.get() + 1);
      p.norm.r = r_got.get();
      p.norm.first = c.first ? first_got.get() : nullptr;
      p.norm.delta = late.get();
      p.norm.w = w.get();
      p.norm.eps = eps;
      cuda::launch_twell_decode_token(p, stream);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto want = download<bf16>(y_ref), have = download<bf16>(c.alias ? first_got : y_sep);
    EXPECT_EQ(std::memcmp(want.data(), have.data(), want.size() * sizeof(bf16)), 0) << "y";
    const auto r_want = download<float>(r_ref), r_have = download<float>(r_got);
    EXPECT_EQ(std::memcmp(r_want.data(), r_have.data(), r_want.size() * sizeof(float)), 0) << "r";
    EXPECT_NE(std::memcmp(r_want.data(), rv.data(), rv.size() * sizeof(float)), 0) << "r was not updated";
    const auto counts = download<unsigned long long>(nnz);
    EXPECT_EQ(counts[0], counts[1]);
    // Some neuron fired (else the comparison above proves little). With n = 5 random gates none
    // fires in 1 run of 32 (TWELL_TEST_SEED=5547865905559125050 did so): there the all-zero row is
    // the edge case checked above; from n = 70 up the chance of no active neuron is below 2^-70.
    if (c.n >= 64) {
      EXPECT_GT(counts[0], 0u);
    }
  }
  // Bad input: the norm's operands misaligned, or missing.
  {
    DeviceBuffer<float> r(64), w(64), h(64);
    DeviceBuffer<__nv_bfloat16> d(64), y(64), wt(64 * 64);
    DeviceBuffer<unsigned char> flags(64);
    cuda::TwellDecodeTokenParams p;
    p.w_up = wt.get();
    p.w_down_t = wt.get();
    p.w_first = wt.get();
    p.y = y.get();
    p.ld_y = p.ld_x = 64;
    p.m = 1;
    p.n = 64;
    p.k = 64;
    p.h = h.get();
    p.flags = flags.get();
    p.norm.r = r.get() + 1;  // 4-byte aligned only
    p.norm.delta = d.get();
    p.norm.w = w.get();
    EXPECT_THROW(cuda::launch_twell_decode_token(p, stream), Error);
    p.norm.r = r.get();
    p.norm.delta = nullptr;
    EXPECT_THROW(cuda::launch_twell_decode_token(p, stream), Error);
  }
  cudaStreamDestroy(stream);
}

// argmax: the lowest index of each row's largest value, as std::max_element on the host; a row
// holding NaN or an infinity gives −1. Rows whose length is a multiple of 4 and that start 16-byte
// aligned take the kernel's 16-byte loads (49 152, the 2B's vocabulary, three whole batches of
// 512 threads × 8 loads; 49 156, whose last 16 bytes fall in a fourth batch that most threads skip;
// a tie across two loads' lanes), the others its scalar loop (49 157; 49 152 from a start one float
// past the allocation's). Short rows after: most threads hold no element.
TEST(ModelOps, ArgmaxMatchesHostAndFlagsNonFinite) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  struct Case {
    std::int64_t v, offset;
  };
  for (const Case c : {Case{49157, 0}, Case{49152, 0}, Case{49156, 0}, Case{49152, 1}}) {
    const std::int64_t rows = 7, v = c.v;
    std::vector<float> logits(static_cast<std::size_t>(rows * v + c.offset));
    for (auto& x : logits) x = rng.normal();
    float* l = logits.data() + c.offset;
    l[2 * v + 100] = l[2 * v + 9000] = l[2 * v + 9001] = 50.0f;  // a tie: the lower index wins
    l[3 * v + 4099] = l[3 * v + 2050] = 55.0f;                  // a tie inside one thread's batch
    l[4 * v + v - 1] = 60.0f;                                   // the last element
    l[5 * v + 7] = NAN;
    l[6 * v + 3] = INFINITY;
    auto d = upload(logits);
    DeviceBuffer<std::int32_t> out(static_cast<std::size_t>(rows));
    cuda::ops::argmax(d.get() + c.offset, rows, v, out.get(), nullptr);
    const auto got = download<std::int32_t>(out);
    for (std::int64_t r = 0; r < 5; ++r) {
      const float* row = l + r * v;
      EXPECT_EQ(got[static_cast<std::size_t>(r)], std::max_element(row, row + v) - row) << "v " << v << ", row " << r;
    }
    EXPECT_EQ(got[2], 100) << "v " << v;
    EXPECT_EQ(got[3], 2050) << "v " << v;
    EXPECT_EQ(got[4], v - 1) << "v " << v;
    EXPECT_EQ(got[5], -1) << "v " << v;
    EXPECT_EQ(got[6], -1) << "v " << v;
  }
  for (const std::int64_t v : {8, 12, 4100}) {
    const std::int64_t rows = 3;
    std::vector<float> logits(static_cast<std::size_t>(rows * v));
    for (auto& x : logits) x = rng.normal();
    logits[static_cast<std::size_t>(v - 1)] = logits[static_cast<std::size_t>(v - 2)] = 40.0f;  // a tie at the row's end
    auto d = upload(logits);
    DeviceBuffer<std::int32_t> out(static_cast<std::size_t>(rows));
    cuda::ops::argmax(d.get(), rows, v, out.get(), nullptr);
    const auto got = download<std::int32_t>(out);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = logits.data() + r * v;
      EXPECT_EQ(got[static_cast<std::size_t>(r)], std::max_element(row, row + v) - row) << "v " << v << ", row " << r;
    }
    EXPECT_EQ(got[0], v - 2) << "v " << v;
  }
}


// top_candidates: each row's k best (z, id) under the repetition penalty, as the host's
// model::top_candidates selects them (the same set, z bit for bit), at vocabularies around the
// block's width and the real ones, k from 1 to V, logits with heavy ties (small integers, ±0, the
// same value across a whole row) or continuous, histories with repeats and out-of-range ids, with
// and without a penalty; a row holding NaN or an infinity reports its lowest such index.
TEST(ModelOps, TopCandidatesAreTheHostsSet) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  const std::int64_t vs[] = {1, 2, 1023, 1025, 5000, 49152, 50257, 128256};
  int checked = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const std::int64_t v = vs[trial % 8];
    if (v > test_max_vocab()) continue;
    const std::int64_t rows = 1 + rng.below(5);
    const std::int64_t ks[] = {1, 2, 50, std::max<std::int64_t>(1, v / 3), v};
    const std::int64_t k = std::min(v, ks[rng.below(5)]);
    const int shape = trial / 8 % 3;  // 0: continuous, 1: small integers and ±0, 2: one value a row
    std::vector<float> logits(static_cast<std::size_t>(rows * v));
    for (auto& x : logits)
      x = shape == 0 ? rng.normal(4.0f) : shape == 1 ? static_cast<float>(rng.below(5)) - 2.0f : 1.5f;
    if (shape == 1)
      for (std::int64_t i = 0; i < rows * v; i += 7) logits[static_cast<std::size_t>(i)] = -0.0f;
    const bool penalty = trial / 8 % 2 == 1;  // with shape: all six pairs, at every vocabulary
    const float p = 1.3f;
    std::vector<std::int64_t> off(static_cast<std::size_t>(rows) + 1, 0);
    std::vector<std::int32_t> hist;
    for (std::int64_t r = 0; r < rows; ++r) {
      const int n = static_cast<int>(rng.below(3)) * 40;  // some rows with an empty history
      for (int i = 0; i < n; ++i) hist.push_back(static_cast<std::int32_t>(rng.below(v)));
      if (n) {
        hist.push_back(hist.back());                         // a repeat: penalised once
        hist.push_back(static_cast<std::int32_t>(v + 3));    // out of range: ignored
        hist.push_back(-1);
      }
      off[static_cast<std::size_t>(r) + 1] = static_cast<std::int64_t>(hist.size());
    }
    auto d_logits = upload(logits);
    auto d_hist = upload(hist.empty() ? std::vector<std::int32_t>{0} : hist);
    auto d_off = upload(off);
    DeviceBuffer<float> z(static_cast<std::size_t>(rows * k));
    DeviceBuffer<std::int32_t> id(static_cast<std::size_t>(rows * k)), bad(static_cast<std::size_t>(rows));
    cuda::ops::top_candidates(d_logits.get(), rows, v, k, p, penalty ? d_hist.get() : nullptr,
                              penalty ? d_off.get() : nullptr, z.get(), id.get(), bad.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto hz = download<float>(z);
    const auto hid = download<std::int32_t>(id);
    const auto hbad = download<std::int32_t>(bad);
    for (std::int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(hbad[static_cast<std::size_t>(r)], -1);
      const std::span<const float> row(logits.data() + r * v, static_cast<std::size_t>(v));
      const std::span<const std::int32_t> h(hist.data() + off[static_cast<std::size_t>(r)],
                                            static_cast<std::size_t>(off[r + 1] - off[r]));
      const auto want = model::top_candidates(row, h, k, penalty ? p : 1.0);
      std::vector<model::Candidate> got(static_cast<std::size_t>(k));
      for (std::int64_t j = 0; j < k; ++j)
        got[static_cast<std::size_t>(j)] = {hz[static_cast<std::size_t>(r * k + j)], hid[static_cast<std::size_t>(r * k + j)]};
      std::sort(got.begin(), got.end(), [](auto a, auto b) { return a.z > b.z || (a.z == b.z && a.id < b.id); });
      for (std::int64_t j = 0; j < k; ++j) {
        const auto& g = got[static_cast<std::size_t>(j)];
        const auto& w = want[static_cast<std::size_t>(j)];
        ASSERT_EQ(g.id, w.id) << "V " << v << ", k " << k << ", shape " << shape << ", penalty " << penalty << ", row "
                              << r << ", rank " << j;
        ASSERT_EQ(std::bit_cast<std::uint32_t>(g.z), std::bit_cast<std::uint32_t>(w.z)) << "token " << g.id;
      }
      ++checked;
    }
  }
  RecordProperty("rows", std::to_string(checked));
  // Non-finite logits: the lowest such index of the row.
  const std::int64_t v = 3000;
  std::vector<float> logits(static_cast<std::size_t>(3 * v), 1.0f);
  logits[static_cast<std::size_t>(v + 2500)] = NAN;
  logits[static_cast<std::size_t>(v + 2600)] = INFINITY;
  logits[static_cast<std::size_t>(2 * v + 17)] = -INFINITY;
  auto d_logits = upload(logits);
  DeviceBuffer<float> z(static_cast<std::size_t>(3 * 4));
  DeviceBuffer<std::int32_t> id(static_cast<std::size_t>(3 * 4)), bad(3);
  cuda::ops::top_candidates(d_logits.get(), 3, v, 4, 1.0f, nullptr, nullptr, z.get(), id.get(), bad.get(), nullptr);
  const auto hbad = download<std::int32_t>(bad);
  EXPECT_EQ(hbad[0], -1);
  EXPECT_EQ(hbad[1], 2500);
  EXPECT_EQ(hbad[2], 17);
  EXPECT_THROW(cuda::ops::top_candidates(d_logits.get(), 3, v, v + 1, 1.0f, nullptr, nullptr, z.get(), id.get(),
                                         bad.get(), nullptr),
               Error);
}

// sample_rows: the device's draw equals model::sample_fixed_point's on the same logits, history
// and r, row by row, at vocabularies around the block's width and the real ones, with heavy ties
// (small integers and ±0), peaked and flat rows, every combination of top-k (none, 1, 50, V − 1),
// top-p (1, 0.9, 0.3) and the penalty, r from 0 to just below 1; a non-finite logit reports its
// lowest index. (W = ⌊exp(·) · 2⁴⁰⌋ uses the device's exp: a 1-ulp difference from the host's moves
// a W by 1 at most, which changes a pick only if r lands within 2⁻⁴⁰ of a boundary.)
TEST(ModelOps, SampleRowsDrawsWhatTheHostRuleDraws) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  const std::int64_t vs[] = {1, 2, 1023, 1025, 5000, 49152, 50257, 128256};
  int checked = 0;
  for (int trial = 0; trial < 8 * 12; ++trial) {  // every (top-k, top-p) pair at every vocabulary
    const std::int64_t v = vs[trial % 8];
    if (v > test_max_vocab()) continue;
    const std::int64_t rows = 1 + rng.below(4);
    const int shape = rng.below(3);  // 0: N(0, 3²), 1: small integers and ±0, 2: N(0, 0.3²)
    std::vector<float> logits(static_cast<std::size_t>(rows * v));
    for (auto& x : logits)
      x = shape == 0 ? rng.normal(3.0f) : shape == 1 ? static_cast<float>(rng.below(5)) - 2.0f : rng.normal(0.3f);
    if (shape == 1)
      for (std::int64_t i = 0; i < rows * v; i += 7) logits[static_cast<std::size_t>(i)] = -0.0f;
    model::SamplingOptions o;
    const double temps[] = {0.3, 0.8, 1.5};
    o.temperature = temps[rng.below(3)];
    const std::int64_t ks[] = {0, 1, 50, std::max<std::int64_t>(1, v - 1)};
    o.top_k = ks[trial / 8 % 4];
    const double ps[] = {1.0, 0.9, 0.3};
    o.top_p = ps[trial / 32];
    o.repetition_penalty = rng.below(2) ? 1.3 : 1.0;
    std::vector<std::int64_t> off(static_cast<std::size_t>(rows) + 1, 0);
    std::vector<std::int32_t> hist;
    std::vector<double> r(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) {
      for (int j = 0; j < 30; ++j) hist.push_back(static_cast<std::int32_t>(rng.below(v)));
      off[static_cast<std::size_t>(i) + 1] = static_cast<std::int64_t>(hist.size());
      r[static_cast<std::size_t>(i)] = i == 0 ? 0.0 : i == 1 ? std::nextafter(1.0, 0.0) : rng.uniform();
    }
    auto d_logits = upload(logits);
    auto d_hist = upload(hist);
    auto d_off = upload(off);
    auto d_r = upload(r);
    DeviceBuffer<std::int32_t> out(static_cast<std::size_t>(rows)), bad(static_cast<std::size_t>(rows));
    cuda::ops::SampleRowsOptions so{o.temperature, o.top_k, o.top_p, o.repetition_penalty};
    const bool penalty = o.repetition_penalty != 1.0;
    cuda::ops::sample_rows(d_logits.get(), rows, v, so, penalty ? d_hist.get() : nullptr, penalty ? d_off.get() : nullptr,
                           d_r.get(), out.get(), bad.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = download<std::int32_t>(out);
    const auto got_bad = download<std::int32_t>(bad);
    for (std::int64_t i = 0; i < rows; ++i) {
      ASSERT_EQ(got_bad[static_cast<std::size_t>(i)], -1);
      const std::span<const float> row(logits.data() + i * v, static_cast<std::size_t>(v));
      const std::span<const std::int32_t> h(hist.data() + off[static_cast<std::size_t>(i)], 30);
      EXPECT_EQ(got[static_cast<std::size_t>(i)], model::sample_fixed_point(row, h, o, r[static_cast<std::size_t>(i)]))
          << "V " << v << ", shape " << shape << ", T " << o.temperature << ", top-k " << o.top_k << ", top-p " << o.top_p
          << ", penalty " << o.repetition_penalty << ", row " << i << ", r " << r[static_cast<std::size_t>(i)];
      ++checked;
    }
  }
  RecordProperty("rows", std::to_string(checked));
  const std::int64_t v = 3000;
  std::vector<float> logits(static_cast<std::size_t>(2 * v), 1.0f);
  logits[static_cast<std::size_t>(v + 2500)] = NAN;
  logits[static_cast<std::size_t>(v + 2600)] = INFINITY;
  auto d_logits = upload(logits);
  auto d_r = upload(std::vector<double>{0.5, 0.5});
  DeviceBuffer<std::int32_t> out(2), bad(2);
  cuda::ops::sample_rows(d_logits.get(), 2, v, {}, nullptr, nullptr, d_r.get(), out.get(), bad.get(), nullptr);
  const auto got_bad = download<std::int32_t>(bad);
  EXPECT_EQ(got_bad[0], -1);
  EXPECT_EQ(got_bad[1], 2500);
  EXPECT_EQ(download<std::int32_t>(out)[0], 1500);  // equal weights: r = ½ picks the middle token
  EXPECT_EQ(download<std::int32_t>(out)[1], -1);
  // A finite logit that a penalty below 1 carries past the float range (history: token 7).
  std::vector<float> big(static_cast<std::size_t>(v), 1.0f);
  big[7] = 3e38f;
  auto d_big = upload(big);
  auto d_h = upload(std::vector<std::int32_t>{7});
  auto d_o = upload(std::vector<std::int64_t>{0, 1});
  cuda::ops::sample_rows(d_big.get(), 1, v, {1.0, 0, 1.0, 0.5}, d_h.get(), d_o.get(), d_r.get(), out.get(), bad.get(),
                         nullptr);
  EXPECT_EQ(download<std::int32_t>(bad)[0], 7);
  cuda::ops::SampleRowsOptions greedy{0.0, 0, 1.0, 1.0};
  EXPECT_THROW(cuda::ops::sample_rows(d_logits.get(), 2, v, greedy, nullptr, nullptr, d_r.get(), out.get(), bad.get(),
                                      nullptr),
               Error);
}

// add_rmsnorm equals residual_add then rmsnorm bit for bit (x and y), and rmsnorm equals a float64
// host reference within bf16 rounding (2⁻⁸ relative per output, the last bit included).
TEST(ModelOps, AddRmsnormIsResidualAddThenRmsnorm) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  // k = 4104: rows past the registers' 4096 (norm_row's streamed path, with one delta and two);
  // k = 1002 and 1: held rows element by element (k % 4 != 0); the rest 4 elements a load, k = 4096
  // and 3076 in every one of a thread's 4 groups (3076: only thread 0's fourth group inside k).
  for (auto [rows, k] : {std::pair<int, int>{1, 2048}, {3, 576}, {17, 1000}, {2, 1}, {2, 4104}, {5, 1002}, {4096, 2048},
                         {3, 4096}, {2, 3076}}) {
    std::vector<float> x(static_cast<std::size_t>(rows * k)), w(static_cast<std::size_t>(k));
    for (auto& e : x) e = static_cast<float>(rng.normal() * 3);
    for (auto& e : w) e = static_cast<float>(rng.normal());
    const auto delta = random_bf16(rng, x.size());
    auto x1 = upload(x), x2 = upload(x), dw = upload(w);
    auto dd = upload<__nv_bfloat16>(delta);
    DeviceBuffer<__nv_bfloat16> y1(x.size()), y2(x.size());
    cuda::ops::residual_add(x1.get(), dd.get(), rows * k, nullptr);
    cuda::ops::rmsnorm(x1.get(), nullptr, rows, k, dw.get(), 1e-5f, y1.get(), nullptr);
    cuda::ops::add_rmsnorm(x2.get(), dd.get(), rows, k, dw.get(), 1e-5f, y2.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto hx1 = download<float>(x1), hx2 = download<float>(x2);
    const auto hy1 = download<bf16>(y1), hy2 = download<bf16>(y2);
    EXPECT_EQ(std::memcmp(hx1.data(), hx2.data(), hx1.size() * sizeof(float)), 0) << rows << "x" << k;
    EXPECT_EQ(std::memcmp(hy1.data(), hy2.data(), hy1.size() * sizeof(bf16)), 0) << rows << "x" << k;
    double err = 0;
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int c = 0; c < k; ++c) {
        const double v = static_cast<double>(x[static_cast<std::size_t>(r * k + c)]) + to_float(delta[static_cast<std::size_t>(r * k + c)]);
        ss += v * v;
      }
      const double inv = 1.0 / std::sqrt(ss / k + 1e-5);
      for (int c = 0; c < k; ++c) {
        const std::size_t i = static_cast<std::size_t>(r * k + c);
        const double want = (static_cast<double>(x[i]) + to_float(delta[i])) * inv * w[static_cast<std::size_t>(c)];
        err = std::max(err, std::fabs(to_float(hy2[i]) - want) / std::max(std::fabs(want), 1e-3));
      }
    }
    EXPECT_LT(err, 1.0 / 256) << rows << "x" << k;
    // With a first delta: x += first, then += delta, in that order, as two residual adds.
    const auto first = random_bf16(rng, x.size());
    auto x3 = upload(x), x4 = upload(x);
    auto df = upload<__nv_bfloat16>(first);
    DeviceBuffer<__nv_bfloat16> y3(x.size()), y4(x.size());
    cuda::ops::residual_add(x3.get(), df.get(), rows * k, nullptr);
    cuda::ops::residual_add(x3.get(), dd.get(), rows * k, nullptr);
    cuda::ops::rmsnorm(x3.get(), nullptr, rows, k, dw.get(), 1e-5f, y3.get(), nullptr);
    cuda::ops::add_rmsnorm(x4.get(), dd.get(), rows, k, dw.get(), 1e-5f, y4.get(), nullptr, df.get());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto hx3 = download<float>(x3), hx4 = download<float>(x4);
    const auto hy3 = download<bf16>(y3), hy4 = download<bf16>(y4);
    EXPECT_EQ(std::memcmp(hx3.data(), hx4.data(), hx3.size() * sizeof(float)), 0) << rows << "x" << k << " (first)";
    EXPECT_EQ(std::memcmp(hy3.data(), hy4.data(), hy3.size() * sizeof(bf16)), 0) << rows << "x" << k << " (first)";
    // Rows read 4 elements a load need aligned buffers: an offset x is refused, not misread.
    if (k % 4 == 0 && k <= 4096) {
      EXPECT_THROW(cuda::ops::add_rmsnorm(x2.get() + 1, dd.get(), 1, k, dw.get(), 1e-5f, y2.get(), nullptr), Error)
          << rows << "x" << k;
    }
  }
}

// rmsnorm_project (a decode step's attention norm inside its QKV projection) equals add_rmsnorm on a
// copy of x (rmsnorm without a delta), then the decode GEMV, bit for bit — at K held in registers
// (≤ 4096) and streamed, ragged n (a CTA's last rows past n), with and without the delta — and
// leaves x as it was; y against a float64 product of the normalised row within bf16 rounding.
TEST(ModelOps, RmsnormProjectIsNormThenGemv) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  // k = 4096 and 3080: the 4-wide norm's fourth group of a thread (every thread's; threads 0 and 1
  // only); 4104 and 8192 stream.
  for (auto [k, n] : {std::pair<int, int>{2048, 2560}, {8, 1}, {576, 17}, {4096, 40}, {3080, 24}, {4104, 33}, {8192, 100}}) {
    for (bool with_delta : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "k " << k << " n " << n << (with_delta ? " with delta" : " without"));
      const auto [x, w, delta, wp] = norm_project_inputs(rng, k, n);
      auto x1 = upload(x), x2 = upload(x), dw = upload(w);
      auto dd = upload<__nv_bfloat16>(delta);
      auto dwp = upload<__nv_bfloat16>(wp);
      DeviceBuffer<__nv_bfloat16> xn(x.size()), y1(static_cast<std::size_t>(n)), y2(static_cast<std::size_t>(n));
      if (with_delta)
        cuda::ops::add_rmsnorm(x1.get(), dd.get(), 1, k, dw.get(), 1e-5f, xn.get(), nullptr);
      else
        cuda::ops::rmsnorm(x1.get(), nullptr, 1, k, dw.get(), 1e-5f, xn.get(), nullptr);
      cuda::launch_twell_gemv_row(xn.get(), dwp.get(), n, k, y1.get(), nullptr);  // the unfused reference
      cuda::ops::rmsnorm_project(x2.get(), with_delta ? dd.get() : nullptr, k, dw.get(), 1e-5f, dwp.get(), n, y2.get(),
                                 nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto hy1 = download<bf16>(y1), hy2 = download<bf16>(y2), hxn = download<bf16>(xn);
      const auto hx2 = download<float>(x2);
      EXPECT_EQ(std::memcmp(hy1.data(), hy2.data(), hy1.size() * sizeof(bf16)), 0);
      EXPECT_EQ(std::memcmp(hx2.data(), x.data(), x.size() * sizeof(float)), 0) << "x was written";
      double err = 0, scale = 0;
      std::vector<double> want(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) {
        double acc = 0;
        for (int c = 0; c < k; ++c)
          acc += static_cast<double>(to_float(hxn[static_cast<std::size_t>(c)])) *
                 to_float(wp[static_cast<std::size_t>(j) * static_cast<std::size_t>(k) + static_cast<std::size_t>(c)]);
        want[static_cast<std::size_t>(j)] = acc;
        scale = std::max(scale, std::fabs(acc));
      }
      for (int j = 0; j < n; ++j) {
        const double d = std::fabs(to_float(hy2[static_cast<std::size_t>(j)]) - want[static_cast<std::size_t>(j)]);
        err = std::max(err, d / (std::fabs(want[static_cast<std::size_t>(j)]) + 1e-3 * scale));
      }
      EXPECT_LT(err, 1.0 / 128);  // bf16's rounding of y (2⁻⁹) plus fp32 accumulation noise
    }
  }
}

// rmsnorm_gated_up (a one-token dense FFN's norm and [Wg; Wu] product in one kernel) equals
// add_rmsnorm on a copy of x (with and without its first term), then the decode GEMV's gated
// epilogue, bit for bit: [g | u] and h, x left alone; g against float64 on the stored norm. Then the
// down GEMV's residual store (TwellGemvParams::store_r) leaves x as add_rmsnorm stored it and y as
// the plain GEMV writes it, also when its first term is y's own buffer (the runtime's aliasing).
// Then both again under programmatic launches, each after a late writer (late_writer.hpp) of the
// delta it must read after its wait.
// k = 2048 (the 2B; the 4-wide norm), 576 and 4104 (streamed norm); up_row 5632 (a wide GEMV, 352
// CTAs of two neurons a warp), 41 (a warp's second neuron past up_row) and 24 (a CTA's last warps
// idle); h_n < up_row (padding neurons, as the engine's ldn pads N; their h stays unwritten), a
// multiple of 8 (the down GEMV's reduction: Wd is [k, h_n]).
TEST(ModelOps, RmsnormGatedUpIsNormThenGatedGemvAndTheDownStoresTheResidual) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  struct C {
    int k, up_row, h_n;
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const bool pdl = cuda::programmatic_launch_supported();
  for (const C c : {C{2048, 5632, 5632}, C{576, 41, 32}, C{4104, 24, 24}}) {
    for (const bool with_first : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "k " << c.k << " up_row " << c.up_row << " h_n " << c.h_n
                                        << (with_first ? " with first" : " without"));
      const int n2 = 2 * c.up_row;
      const auto [x, w, delta, wgu] = norm_project_inputs(rng, c.k, n2);
      const auto first = random_bf16(rng, x.size());
      std::vector<bf16> wd(static_cast<std::size_t>(c.k) * static_cast<std::size_t>(c.h_n));  // Wd [k, h_n]
      for (auto& e : wd) e = to_bf16(rng.normal() / std::sqrt(static_cast<double>(c.h_n)));
      auto x1 = upload(x), x2 = upload(x), dw = upload(w);
      auto dd = upload<__nv_bfloat16>(delta), df = upload<__nv_bfloat16>(first);
      auto dwgu = upload<__nv_bfloat16>(wgu), dwd = upload<__nv_bfloat16>(wd);
      const __nv_bfloat16* f = with_first ? df.get() : nullptr;
      DeviceBuffer<__nv_bfloat16> xn(x.size()), gu1(static_cast<std::size_t>(n2)), gu2(gu1.size()),
          h1(static_cast<std::size_t>(c.up_row)), h2(h1.size());
      for (auto* b : {&gu2, &h2}) ASSERT_EQ(cudaMemset(b->get(), 0xff, b->bytes()), cudaSuccess);  // NaN where unwritten
      ASSERT_EQ(cudaMemset(h1.get(), 0xff, h1.bytes()), cudaSuccess);
      // The unfused reference: add_rmsnorm (stores x1), then the gated GEMV.
      cuda::ops::add_rmsnorm(x1.get(), dd.get(), 1, c.k, dw.get(), 1e-5f, xn.get(), nullptr, f);
      cuda::launch_twell_gemv(cuda::gemv_gated_row(xn.get(), dwgu.get(), c.up_row, c.h_n, c.k, gu1.get(), h1.get(), 0), nullptr);
      cuda::ops::GatedUp g;
      g.h = h2.get();
      g.up_row = c.up_row;
      g.h_n = c.h_n;
      cuda::ops::rmsnorm_gated_up(x2.get(), f, dd.get(), c.k, dw.get(), 1e-5f, dwgu.get(), g, gu2.get(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(download<std::uint16_t>(gu2), download<std::uint16_t>(gu1)) << "[g | u] differ";
      const auto hh1 = download<std::uint16_t>(h1), hh2 = download<std::uint16_t>(h2);
      EXPECT_TRUE(std::equal(hh1.begin(), hh1.begin() + c.h_n, hh2.begin())) << "h differs";
      EXPECT_TRUE(std::all_of(hh2.begin() + c.h_n, hh2.end(), [](std::uint16_t b) { return b == 0xffff; }))
          << "h written past h_n";
      const auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      EXPECT_TRUE(bits_equal(download<float>(x2), x)) << "x was written";
      // g against float64 on the norm as stored (xn), as RmsnormProjectIsNormThenGemv checks.
      const auto hxn = download<bf16>(xn), hgu = download<bf16>(gu2);
      double err = 0, scale = 0;
      std::vector<double> want(static_cast<std::size_t>(n2));
      for (int j = 0; j < n2; ++j) {
        double acc = 0;
        for (int e = 0; e < c.k; ++e)
          acc += static_cast<double>(to_float(hxn[static_cast<std::size_t>(e)])) *
                 to_float(wgu[static_cast<std::size_t>(j) * static_cast<std::size_t>(c.k) + static_cast<std::size_t>(e)]);
        want[static_cast<std::size_t>(j)] = acc;
        scale = std::max(scale, std::fabs(acc));
      }
      for (int j = 0; j < n2; ++j)
        err = std::max(err, std::fabs(to_float(hgu[static_cast<std::size_t>(j)]) - want[static_cast<std::size_t>(j)]) /
                                (std::fabs(want[static_cast<std::size_t>(j)]) + 1e-3 * scale));
      EXPECT_LT(err, 1.0 / 128);  // bf16's rounding (2⁻⁹) plus fp32 accumulation noise
      // The down GEMV: plain into y1; with the residual store into y2 on x2 (which must become x1),
      // y2 first holding the first term itself where with_first (the runtime's ffn_y is its `first`).
      DeviceBuffer<__nv_bfloat16> y1(static_cast<std::size_t>(c.k)), y2(y1.size());
      if (with_first) {
        ASSERT_EQ(cudaMemcpy(y2.get(), df.get(), y2.bytes(), cudaMemcpyDeviceToDevice), cudaSuccess);
      }
      cuda::TwellGemvParams p1 = cuda::gemv_rows(h1.get(), 1, dwd.get(), c.k, c.h_n);
      p1.g = y1.get();
      cuda::launch_twell_gemv(p1, nullptr);
      cuda::TwellGemvParams p2 = cuda::gemv_rows(h2.get(), 1, dwd.get(), c.k, c.h_n);
      p2.g = y2.get();
      p2.w_before_wait = true;
      p2.store_r = x2.get();
      p2.store_first = with_first ? y2.get() : nullptr;
      p2.store_delta = dd.get();
      cuda::launch_twell_gemv(p2, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(download<std::uint16_t>(y2), download<std::uint16_t>(y1)) << "y differs with the residual store";
      EXPECT_TRUE(bits_equal(download<float>(x2), download<float>(x1))) << "the stored residual is not add_rmsnorm's";
      // Under programmatic launches: late_d and late_d2 hold other values until the late writer just
      // before each kernel copies delta in, after that kernel has started (x, first and delta are
      // read at the same place in each kernel, so delta's order stands for all three).
      auto x3 = upload(x);
      auto late_d = upload<__nv_bfloat16>(random_bf16(rng, x.size())), late_d2 = upload<__nv_bfloat16>(random_bf16(rng, x.size()));
      DeviceBuffer<__nv_bfloat16> gu3(gu1.size()), h3(h1.size()), y3(y1.size());
      ASSERT_EQ(cudaMemset(h3.get(), 0xff, h3.bytes()), cudaSuccess);
      if (with_first) {
        ASSERT_EQ(cudaMemcpy(y3.get(), df.get(), y3.bytes(), cudaMemcpyDeviceToDevice), cudaSuccess);
      }
      {
        const cuda::ProgrammaticLaunch programmatic(pdl);
        late_copy(dd.get(), late_d.get(), x.size() * sizeof(bf16), 100, stream);
        cuda::ops::GatedUp g3 = g;
        g3.h = h3.get();
        cuda::ops::rmsnorm_gated_up(x3.get(), f, late_d.get(), c.k, dw.get(), 1e-5f, dwgu.get(), g3, gu3.get(), stream);
        late_copy(dd.get(), late_d2.get(), x.size() * sizeof(bf16), 100, stream);
        cuda::TwellGemvParams p3 = p2;
        p3.x = h3.get();
        p3.g = y3.get();
        p3.store_r = x3.get();
        p3.store_first = with_first ? y3.get() : nullptr;
        p3.store_delta = late_d2.get();
        cuda::launch_twell_gemv(p3, stream);
      }
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(download<std::uint16_t>(gu3), download<std::uint16_t>(gu1)) << "[g | u] differ under programmatic launches";
      const auto hh3 = download<std::uint16_t>(h3);
      EXPECT_TRUE(std::equal(hh1.begin(), hh1.begin() + c.h_n, hh3.begin())) << "h differs under programmatic launches";
      EXPECT_EQ(download<std::uint16_t>(y3), download<std::uint16_t>(y1)) << "y differs under programmatic launches";
      EXPECT_TRUE(bits_equal(download<float>(x3), download<float>(x1))) << "the residual differs under programmatic launches";
    }
  }
  cudaStreamDestroy(stream);
}

// rmsnorm_project with a RopeStore (a decode step's norm, QKV, RoPE and cache store in one kernel)
// equals add_rmsnorm on a copy of x, the decode GEMV, then rope_store_kv, bit for bit: the whole
// qkv row and both caches (every layer's slots, so a write to the wrong layer, position or head
// shows), GQA and MHA, head_dim 64 and 128, k rotated in place or not.
TEST(ModelOps, RmsnormProjectWithRopeIsNormGemvRope) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  struct Case {
    int heads, kv_heads, d, k, pos;
    bool k_in_place;
  };
  // The last two: n not a multiple of a CTA's 16 rows (inactive warps), head_dim 6 and 2.
  for (const Case cs : {Case{4, 2, 64, 256, 5, false}, Case{2, 2, 128, 512, 130, true}, Case{32, 32, 64, 2048, 77, false},
                        Case{8, 1, 128, 1024, 0, true}, Case{3, 1, 6, 64, 9, false}, Case{2, 1, 2, 8, 3, true}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d << " k " << cs.k
                                      << " pos " << cs.pos << (cs.k_in_place ? " k in place" : ""));
    const int k = cs.k, kv_dim = cs.kv_heads * cs.d;
    const int n = (cs.heads + 2 * cs.kv_heads) * cs.d;
    const int layers = 2, layer = 1, capacity = 160;
    const auto [x, w, delta, wp] = norm_project_inputs(rng, k, n);
    const auto [cos_t, sin_t] = rope_tables(capacity, cs.d);
    // Caches prefilled with values, so a slot written by mistake shows.
    const std::size_t cache_elems = static_cast<std::size_t>(layers) * capacity * kv_dim;
    const auto kc0 = random_bf16(rng, cache_elems), vc0 = random_bf16(rng, cache_elems);
    auto x1 = upload(x), x2 = upload(x), dw = upload(w), dcos = upload(cos_t), dsin = upload(sin_t);
    auto dd = upload<__nv_bfloat16>(delta);
    auto dwp = upload<__nv_bfloat16>(wp);
    auto k1 = upload<__nv_bfloat16>(kc0), k2 = upload<__nv_bfloat16>(kc0), v1 = upload<__nv_bfloat16>(vc0),
         v2 = upload<__nv_bfloat16>(vc0);
    auto rows_of = [&](DeviceBuffer<__nv_bfloat16>& kc, DeviceBuffer<__nv_bfloat16>& vc) {
      cuda::ops::RowKv r;
      r.k = kc.get();
      r.v = vc.get();
      r.layer_stride = static_cast<std::int64_t>(capacity) * kv_dim;
      r.pos = cs.pos;
      return upload(std::vector<cuda::ops::RowKv>{r});
    };
    auto r1 = rows_of(k1, v1), r2 = rows_of(k2, v2);
    DeviceBuffer<__nv_bfloat16> xn(x.size()), q1(static_cast<std::size_t>(n)), q2(static_cast<std::size_t>(n));
    for (auto* q : {&q1, &q2}) ASSERT_EQ(cudaMemset(q->get(), 0xff, q->bytes()), cudaSuccess);  // NaN poison
    cuda::ops::add_rmsnorm(x1.get(), dd.get(), 1, k, dw.get(), 1e-5f, xn.get(), nullptr);
    cuda::launch_twell_gemv_row(xn.get(), dwp.get(), n, k, q1.get(), nullptr);
    cuda::ops::rope_store_kv(q1.get(), 1, cs.heads, cs.kv_heads, cs.d, dcos.get(), dsin.get(), r1.get(), layer, nullptr,
                             cs.k_in_place);
    cuda::ops::RopeStore rope;
    rope.rows_kv = r2.get();
    rope.layer = layer;
    rope.heads = cs.heads;
    rope.kv_heads = cs.kv_heads;
    rope.d = cs.d;
    rope.cos = dcos.get();
    rope.sin = dsin.get();
    rope.k_in_place = cs.k_in_place;
    cuda::ops::rmsnorm_project(x2.get(), dd.get(), k, dw.get(), 1e-5f, dwp.get(), n, q2.get(), nullptr, &rope);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto hq1 = download<bf16>(q1), hq2 = download<bf16>(q2);
    const auto hk1 = download<bf16>(k1), hk2 = download<bf16>(k2), hv1 = download<bf16>(v1), hv2 = download<bf16>(v2);
    EXPECT_EQ(std::memcmp(hq1.data(), hq2.data(), hq1.size() * sizeof(bf16)), 0) << "qkv";
    EXPECT_EQ(std::memcmp(hk1.data(), hk2.data(), hk1.size() * sizeof(bf16)), 0) << "k cache";
    EXPECT_EQ(std::memcmp(hv1.data(), hv2.data(), hv1.size() * sizeof(bf16)), 0) << "v cache";
    // The reference path did write the slot (the comparison above is not between two untouched caches).
    const std::size_t slot = (static_cast<std::size_t>(layer) * capacity + static_cast<std::size_t>(cs.pos)) * kv_dim;
    EXPECT_NE(std::memcmp(hv1.data() + slot, vc0.data() + slot, static_cast<std::size_t>(kv_dim) * sizeof(bf16)), 0);
  }
}

// rope_store_kv reads each row's RowKv, its block table and the angles before its programmatic
// wait (a step's inputs and tables, written before its first kernel), and the row's q, k and v
// only after it: here q, k and v arrive late (late_copy spins ≈ 100 µs, then copies them in), and
// the rotated qkv and both caches must equal a plain launch's bit for bit. Rows in order and paged
// (blocks shuffled through a table); head_dim 64 and 128 (the 16-byte kernel) and 6 (the scalar
// one), k rotated into qkv too or not. (Without sm_90 the launches are plain and the test checks
// the values only.)
TEST(ModelOps, RopeStoreKvReadsItsRowAfterTheWait) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct Case {
    int heads, kv_heads, d;
    bool k_in_place;
  };
  for (const Case cs : {Case{4, 2, 64, false}, Case{8, 8, 128, true}, Case{3, 1, 6, true}})
    for (const bool paged : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d << " paged "
                                        << paged << (cs.k_in_place ? " k in place" : ""));
      const int Q = cs.heads * cs.d, KV = cs.kv_heads * cs.d, ld = Q + 2 * KV, layers = 2, layer = 1, T = 9;
      const int blocks = 4, cap = blocks * cuda::ops::kKvBlockRows;
      const auto [cos_t, sin_t] = rope_tables(cap, cs.d);
      auto dcos = upload(cos_t), dsin = upload(sin_t);
      // One buffer: qkv [T, ld], then each row's K cache, then each row's V cache ([layers, cap, KV]).
      const std::size_t qkv_n = static_cast<std::size_t>(T) * ld, cache_n = static_cast<std::size_t>(layers) * cap * KV;
      const std::size_t total = qkv_n + 2 * static_cast<std::size_t>(T) * cache_n;
      const auto init = random_bf16(rng, total);
      auto ref = upload<__nv_bfloat16>(init), src = upload<__nv_bfloat16>(init);
      auto late = upload<__nv_bfloat16>(random_bf16(rng, total));  // other bytes until late_copy lands init
      auto d_tables = upload(shuffled_block_tables(rng, T, blocks));
      auto rows_in = [&](DeviceBuffer<__nv_bfloat16>& buf) {
        return upload(rows_of_step_buffer(buf.get(), T, qkv_n, cache_n, static_cast<std::int64_t>(cap) * KV,
                                          paged ? d_tables.get() : nullptr, blocks,
                                          [&](int r) { return (7 * r + 3) % cap; }));
      };
      auto rows_ref = rows_in(ref), rows_late = rows_in(late);
      cuda::ops::rope_store_kv(ref.get(), T, cs.heads, cs.kv_heads, cs.d, dcos.get(), dsin.get(), rows_ref.get(), layer,
                               stream, cs.k_in_place);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      {
        const cuda::ProgrammaticLaunch programmatic(cuda::programmatic_launch_supported());
        late_copy(src.get(), late.get(), total * sizeof(bf16), 100, stream);
        cuda::ops::rope_store_kv(late.get(), T, cs.heads, cs.kv_heads, cs.d, dcos.get(), dsin.get(), rows_late.get(),
                                 layer, stream, cs.k_in_place);
      }
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto want = download<bf16>(ref), got = download<bf16>(late);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(bf16)), 0);
    }
  cudaStreamDestroy(stream);
}

// rope_store_kv against a host reference, bit for bit: many rows of three sequences at scattered
// positions, every layer's cache slots compared whole (a write to a wrong slot, head or layer
// shows), q rotated in place, k rotated into the cache (and into qkv with k_in_place), v copied.
// Shapes for both kernels: head_dim a multiple of 16 (16-byte accesses) and not (2 bytes a thread),
// and a qkv pointer off 16-byte alignment, which must fall back to the 2-byte kernel, same bits.
TEST(ModelOps, RopeStoreKvMatchesHost) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  struct Case {
    int heads, kv_heads, d, rows;
    bool k_in_place, misaligned;
  };
  for (const Case cs : {Case{32, 32, 64, 300, true, false}, Case{8, 2, 128, 129, false, false}, Case{4, 1, 16, 37, true, false},
                        Case{3, 1, 6, 50, false, false}, Case{2, 2, 8, 20, true, false}, Case{2, 1, 2, 5, false, false},
                        Case{4, 2, 64, 33, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d << " rows " << cs.rows
                                      << (cs.k_in_place ? " k in place" : "") << (cs.misaligned ? " misaligned" : ""));
    const int half = cs.d / 2, q_dim = cs.heads * cs.d, kv_dim = cs.kv_heads * cs.d, width = q_dim + 2 * kv_dim;
    const int seqs = 3, layers = 2, layer = 1, capacity = cs.rows / seqs + 40;
    const auto [cos_t, sin_t] = rope_tables(capacity, cs.d);
    const std::size_t cache_elems = static_cast<std::size_t>(layers) * capacity * kv_dim;
    std::vector<std::vector<bf16>> kc(seqs), vc(seqs);
    for (int q = 0; q < seqs; ++q) {
      kc[static_cast<std::size_t>(q)] = random_bf16(rng, cache_elems);  // prefilled: a stray write shows
      vc[static_cast<std::size_t>(q)] = random_bf16(rng, cache_elems);
    }
    std::vector<DeviceBuffer<__nv_bfloat16>> dk, dv;
    for (int q = 0; q < seqs; ++q) {
      dk.push_back(upload<__nv_bfloat16>(kc[static_cast<std::size_t>(q)]));
      dv.push_back(upload<__nv_bfloat16>(vc[static_cast<std::size_t>(q)]));
    }
    // Row r: sequence r % 3 at position 7 + r / 3 (distinct slots, rows of a sequence interleaved).
    std::vector<cuda::ops::RowKv> rows(static_cast<std::size_t>(cs.rows));
    for (int r = 0; r < cs.rows; ++r) {
      auto& rk = rows[static_cast<std::size_t>(r)];
      rk.k = dk[static_cast<std::size_t>(r % seqs)].get();
      rk.v = dv[static_cast<std::size_t>(r % seqs)].get();
      rk.layer_stride = static_cast<std::int64_t>(capacity) * kv_dim;
      rk.pos = 7 + r / seqs;
    }
    const std::vector<bf16> qkv0 = random_bf16(rng, static_cast<std::size_t>(cs.rows) * width);
    // Host reference: each product and sum rounded to fp32 on its own (rope_pair's contract).
    auto rounded = [](float v) {
      volatile float r = v;
      return static_cast<float>(r);
    };
    std::vector<bf16> want_qkv = qkv0;
    std::vector<std::vector<bf16>> want_k = kc, want_v = vc;
    for (int r = 0; r < cs.rows; ++r) {
      const auto& rk = rows[static_cast<std::size_t>(r)];
      bf16* row = want_qkv.data() + static_cast<std::size_t>(r) * width;
      const bf16* in = qkv0.data() + static_cast<std::size_t>(r) * width;
      const std::size_t slot = (static_cast<std::size_t>(layer) * capacity + static_cast<std::size_t>(rk.pos)) * kv_dim;
      for (int h = 0; h < cs.heads + cs.kv_heads; ++h) {
        const bool is_q = h < cs.heads;
        const int off = is_q ? h * cs.d : q_dim + (h - cs.heads) * cs.d;
        for (int i = 0; i < half; ++i) {
          const float x1 = to_float(in[off + i]), x2 = to_float(in[off + i + half]);
          const float c = cos_t[static_cast<std::size_t>(rk.pos * half + i)], sn = sin_t[static_cast<std::size_t>(rk.pos * half + i)];
          const bf16 o1 = to_bf16(rounded(rounded(x1 * c) - rounded(x2 * sn)));
          const bf16 o2 = to_bf16(rounded(rounded(x2 * c) + rounded(x1 * sn)));
          if (is_q || cs.k_in_place) {
            row[off + i] = o1;
            row[off + i + half] = o2;
          }
          if (!is_q) {
            bf16* dst = want_k[static_cast<std::size_t>(r % seqs)].data() + slot + (h - cs.heads) * cs.d;
            dst[i] = o1;
            dst[i + half] = o2;
          }
        }
      }
      for (int e = 0; e < kv_dim; ++e) want_v[static_cast<std::size_t>(r % seqs)][slot + static_cast<std::size_t>(e)] = in[q_dim + kv_dim + e];
    }
    // The device call (one element in front of qkv when misaligned).
    const std::size_t lead = cs.misaligned ? 1 : 0;
    std::vector<bf16> padded(lead, bf16{});
    padded.insert(padded.end(), qkv0.begin(), qkv0.end());
    auto dqkv = upload<__nv_bfloat16>(padded);
    auto drows = upload(rows);
    auto dcos = upload(cos_t), dsin = upload(sin_t);
    // Which kernel runs: 16 bytes a thread exactly where d is a multiple of 16 and qkv aligned.
    EXPECT_EQ(cuda::ops::rope_store_kv_wide(dqkv.get() + lead, cs.d, dcos.get(), dsin.get()), cs.d % 16 == 0 && !cs.misaligned);
    cuda::ops::rope_store_kv(dqkv.get() + lead, cs.rows, cs.heads, cs.kv_heads, cs.d, dcos.get(), dsin.get(), drows.get(),
                             layer, nullptr, cs.k_in_place);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = download<bf16>(dqkv);
    EXPECT_EQ(std::memcmp(got.data() + lead, want_qkv.data(), want_qkv.size() * sizeof(bf16)), 0) << "qkv";
    for (int q = 0; q < seqs; ++q) {
      const auto gk = download<bf16>(dk[static_cast<std::size_t>(q)]), gv = download<bf16>(dv[static_cast<std::size_t>(q)]);
      EXPECT_EQ(std::memcmp(gk.data(), want_k[static_cast<std::size_t>(q)].data(), cache_elems * sizeof(bf16)), 0)
          << "k cache of sequence " << q;
      EXPECT_EQ(std::memcmp(gv.data(), want_v[static_cast<std::size_t>(q)].data(), cache_elems * sizeof(bf16)), 0)
          << "v cache of sequence " << q;
    }
  }
}

// ---- The one-token FFN's fixed-point output (cuda/common/fixed_point.hpp) and its readers ----

// The host's sum of one column: Σ over the active neurons of round(fl(h · w) · 2³²), exactly as
// the kernel forms each term (one fp32 product, a power-of-two scale, round to nearest even).
std::vector<std::int64_t> fixed_sums(const std::vector<float>& h, const std::vector<unsigned char>& flags,
                                     const std::vector<bf16>& w_down_t, std::int64_t n, std::int64_t k) {
  std::vector<std::int64_t> acc(static_cast<std::size_t>(k), 0);
  for (std::int64_t j = 0; j < n; ++j) {
    if (!flags[static_cast<std::size_t>(j)]) continue;
    for (std::int64_t c = 0; c < k; ++c) {
      const float t = h[static_cast<std::size_t>(j)] * to_float(w_down_t[static_cast<std::size_t>(j * k + c)]);
      acc[static_cast<std::size_t>(c)] += static_cast<std::int64_t>(std::llrint(t * 4294967296.0f));
    }
  }
  return acc;
}

// TwellDecodeTokenParams::y_fixed: one kernel adds every active neuron's h · Wdᵀ[n, :] into the
// accumulator, and the sum is the host's sum of the same terms exactly (integers: any order), for
// the h and the active set the two-kernel path computes (its scratch, read back). Gated and not,
// x given or formed from the residual stream (a norm without deltas), K past 4096 (the norm's
// streamed branch) and K = 8, N below a CTA's warps. A second launch adds to what the
// accumulator holds. Terms past the range (huge down weights) raise the flag.
TEST(ModelOps, DecodeTokenFixedPointIsTheExactSumOfItsTerms) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct Case {
    std::int64_t n, k;
    bool gated, norm;
  };
  for (const Case c : {Case{5632, 2048, true, true}, Case{1003, 4104, false, true}, Case{70, 8192, true, false},
                       Case{5, 8, true, true}, Case{300, 264, false, false}, Case{2053, 4096, true, false}}) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << " k " << c.k << (c.gated ? " gated" : " non-gated")
                                      << (c.norm ? " norm" : " x"));
    const auto nk = static_cast<std::size_t>(c.n * c.k), k = static_cast<std::size_t>(c.k);
    const auto wd = random_bf16(rng, nk);
    auto w_first = upload<__nv_bfloat16>(random_bf16(rng, nk)), w_up = upload<__nv_bfloat16>(random_bf16(rng, nk)),
         w_down_t = upload<__nv_bfloat16>(wd);
    std::vector<float> rv(k), wv(k);
    for (auto& e : rv) e = static_cast<float>(3.0 * rng.normal());
    for (auto& e : wv) e = static_cast<float>(1.0 + 0.25 * rng.normal());
    auto r = upload(rv), w = upload(wv);
    auto x = upload<__nv_bfloat16>(random_bf16(rng, k));
    const float eps = 1e-5f;
    if (c.norm) cuda::ops::rmsnorm(r.get(), nullptr, 1, c.k, w.get(), eps, x.get(), stream);  // the two-kernel run's x
    DeviceBuffer<__nv_bfloat16> y(k);
    DeviceBuffer<float> h(static_cast<std::size_t>(c.n));
    DeviceBuffer<unsigned char> flags(static_cast<std::size_t>(cuda::decode_token_flag_bytes(c.n)));
    ASSERT_EQ(cudaMemsetAsync(flags.get(), 0, flags.bytes(), stream), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(h.get(), 0, h.bytes(), stream), cudaSuccess);
    cuda::TwellDecodeTokenParams ref = token_params(c.n, c.k, c.gated, w_first, w_up, w_down_t, h, flags, y.get(), nullptr);
    ref.x = x.get();
    cuda::launch_twell_decode_token(ref, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto want = fixed_sums(download<float>(h), download<unsigned char>(flags), wd, c.n, c.k);
    DeviceBuffer<long long> acc(k);
    DeviceBuffer<unsigned> overflow(1);
    ASSERT_EQ(cudaMemsetAsync(acc.get(), 0, acc.bytes(), stream), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(overflow.get(), 0, overflow.bytes(), stream), cudaSuccess);
    cuda::TwellDecodeTokenParams p = token_params(c.n, c.k, c.gated, w_first, w_up, w_down_t, h, flags, nullptr, nullptr);
    p.h = nullptr;
    p.flags = nullptr;
    p.y_fixed = acc.get();
    p.overflow = overflow.get();
    if (c.norm) {
      p.norm.r = r.get();
      p.norm.w = w.get();
      p.norm.eps = eps;
    } else {
      p.x = x.get();
    }
    for (int launch = 1; launch <= 2; ++launch) {
      cuda::launch_twell_decode_token(p, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto have = download<long long>(acc);
      std::int64_t bad = -1;
      for (std::size_t i = 0; i < k && bad < 0; ++i)
        if (have[i] != launch * want[i]) bad = static_cast<std::int64_t>(i);
      EXPECT_EQ(bad, -1) << "launch " << launch << ": column " << bad << " differs";
      EXPECT_EQ(download<unsigned>(overflow)[0], 0u);
    }
    EXPECT_EQ(std::memcmp(download<float>(r).data(), rv.data(), k * sizeof(float)), 0) << "r was written";
  }
  // Out of range: down weights of 2³⁰ make every active term reach past 2^(31 − ⌈log2 300⌉) = 2²².
  {
    const std::int64_t n = 300, kk = 264;
    const auto nk = static_cast<std::size_t>(n * kk);
    std::vector<bf16> big(nk, to_bf16(1073741824.0f));
    auto w_first = upload<__nv_bfloat16>(random_bf16(rng, nk)), w_down_t = upload<__nv_bfloat16>(big);
    auto x = upload<__nv_bfloat16>(random_bf16(rng, static_cast<std::size_t>(kk)));
    DeviceBuffer<float> h(static_cast<std::size_t>(n));
    DeviceBuffer<unsigned char> flags(static_cast<std::size_t>(cuda::decode_token_flag_bytes(n)));
    DeviceBuffer<long long> acc(static_cast<std::size_t>(kk));
    DeviceBuffer<unsigned> overflow(1);
    ASSERT_EQ(cudaMemsetAsync(acc.get(), 0, acc.bytes(), stream), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(overflow.get(), 0, overflow.bytes(), stream), cudaSuccess);
    cuda::TwellDecodeTokenParams p = token_params(n, kk, false, w_first, w_first, w_down_t, h, flags, nullptr, nullptr);
    p.x = x.get();
    p.y_fixed = acc.get();
    p.overflow = overflow.get();
    cuda::launch_twell_decode_token(p, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(download<unsigned>(overflow)[0], 1u);
    // Bad input: a norm with a delta (nothing would store r'), a misaligned accumulator.
    DeviceBuffer<float> r(static_cast<std::size_t>(kk)), w(static_cast<std::size_t>(kk));
    p.norm.r = r.get();
    p.norm.w = w.get();
    p.norm.delta = x.get();
    EXPECT_THROW(cuda::launch_twell_decode_token(p, stream), Error);
    p.norm = {};
    p.y_fixed = acc.get() + 1;
    EXPECT_THROW(cuda::launch_twell_decode_token(p, stream), Error);
  }
  cudaStreamDestroy(stream);
}

// decode_token_reorder's order on the host: the neurons by ⌊log2 hits⌋ descending, hits 0 last,
// ascending index within a class.
std::vector<std::int32_t> reorder_on_host(const std::vector<std::uint32_t>& hits) {
  std::vector<std::int32_t> order(hits.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return std::bit_width(hits[static_cast<std::size_t>(a)]) > std::bit_width(hits[static_cast<std::size_t>(b)]);
  });
  return order;
}

// decode_token_reorder against the host's stable sort: N within one round of the CTA, at its edges
// and over many rounds; hits all zero, all one class, spread over every class (0 and 2³² − 1
// included), and skewed as decode counts are (most zero, a few large). hits is left as it was.
TEST(ModelOps, DecodeTokenReorderIsAStableSortByActivity) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const std::int64_t n : {1, 5, 31, 1023, 1024, 1025, 5632, 14336, 70001}) {
    for (int kind = 0; kind < 4; ++kind) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " kind " << kind);
      std::vector<std::uint32_t> hits(static_cast<std::size_t>(n));
      for (auto& h : hits) {
        switch (kind) {
          case 0: h = 0; break;
          case 1: h = 5 + static_cast<std::uint32_t>(rng.below(3)); break;  // one class: [4, 8)
          case 2: {
            const int bits = static_cast<int>(rng.below(33));
            h = bits == 0 ? 0u : bits == 32 ? 0xffffffffu - static_cast<std::uint32_t>(rng.below(1000))
                                            : static_cast<std::uint32_t>(rng.below(std::int64_t{1} << bits));
            break;
          }
          default: h = rng.uniform() < 0.7 ? 0u : static_cast<std::uint32_t>(rng.below(64) * rng.below(64));
        }
      }
      auto d_hits = upload(hits);
      DeviceBuffer<std::int32_t> order(hits.size());
      ASSERT_EQ(cudaMemsetAsync(order.get(), 0xff, order.bytes(), stream), cudaSuccess);
      cuda::launch_decode_token_reorder(d_hits.get(), order.get(), n, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(download<std::int32_t>(order), reorder_on_host(hits));
      EXPECT_EQ(download<std::uint32_t>(d_hits), hits);
    }
  }
  DeviceBuffer<std::uint32_t> hits(4);
  DeviceBuffer<std::int32_t> order(4);
  EXPECT_THROW(cuda::launch_decode_token_reorder(hits.get(), order.get(), 0, stream), Error);
  EXPECT_THROW(cuda::launch_decode_token_reorder(nullptr, order.get(), 4, stream), Error);
  cudaStreamDestroy(stream);
}

// The one-token kernels' neuron order (TwellDecodeTokenParams::order) is a schedule only: under a
// random permutation, the reverse, and the order decode_token_reorder makes from the counts, y,
// the flags, the active neurons' h, the count and the fixed-point sums equal the identity order's
// bit for bit, and hits gains one for each active neuron a launch. x given and normalised from r,
// gated and non-gated, N smaller than a CTA's warps and not a multiple of them.
TEST(ModelOps, DecodeTokenNeuronOrderIsASchedule) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct Case {
    std::int64_t n, k;
    bool gated, norm;
  };
  for (const Case c : {Case{5632, 2048, true, true}, Case{1003, 4104, false, false}, Case{5, 8, true, true},
                       Case{2053, 264, true, false}}) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << " k " << c.k << (c.gated ? " gated" : " non-gated")
                                      << (c.norm ? " norm" : " x"));
    const auto nk = static_cast<std::size_t>(c.n * c.k), k = static_cast<std::size_t>(c.k), n = static_cast<std::size_t>(c.n);
    auto w_first = upload<__nv_bfloat16>(random_bf16(rng, nk)), w_up = upload<__nv_bfloat16>(random_bf16(rng, nk)),
         w_down_t = upload<__nv_bfloat16>(random_bf16(rng, nk));
    std::vector<float> rv(k), wv(k);
    for (auto& e : rv) e = static_cast<float>(3.0 * rng.normal());
    for (auto& e : wv) e = static_cast<float>(1.0 + 0.25 * rng.normal());
    auto r = upload(rv), w = upload(wv);
    auto x = upload<__nv_bfloat16>(random_bf16(rng, k));
    const float eps = 1e-5f;
    if (c.norm) cuda::ops::rmsnorm(r.get(), nullptr, 1, c.k, w.get(), eps, x.get(), stream);  // the fixed run's x
    DeviceBuffer<std::uint32_t> hits(n);
    ASSERT_EQ(cudaMemsetAsync(hits.get(), 0, hits.bytes(), stream), cudaSuccess);
    struct Out {
      std::vector<bf16> y;
      std::vector<unsigned char> flags;
      std::vector<float> h;
      unsigned long long count;
      std::vector<long long> acc;
    };
    // Both kernels' outputs under `order` (null: the identity), counting into hits if given.
    const auto run = [&](const std::int32_t* order, std::uint32_t* hit) {
      DeviceBuffer<__nv_bfloat16> y(k);
      DeviceBuffer<float> h(n);
      DeviceBuffer<unsigned char> flags(static_cast<std::size_t>(cuda::decode_token_flag_bytes(c.n)));
      DeviceBuffer<unsigned long long> nnz(1);
      DeviceBuffer<long long> acc(k);
      DeviceBuffer<unsigned> overflow(1);
      EXPECT_EQ(cudaMemsetAsync(flags.get(), 0, flags.bytes(), stream), cudaSuccess);
      EXPECT_EQ(cudaMemsetAsync(h.get(), 0, h.bytes(), stream), cudaSuccess);
      EXPECT_EQ(cudaMemsetAsync(acc.get(), 0, acc.bytes(), stream), cudaSuccess);
      EXPECT_EQ(cudaMemsetAsync(overflow.get(), 0, overflow.bytes(), stream), cudaSuccess);
      cuda::TwellDecodeTokenParams p = token_params(c.n, c.k, c.gated, w_first, w_up, w_down_t, h, flags, y.get(), nnz.get());
      p.x = x.get();
      p.order = order;
      p.hits = hit;
      cuda::launch_twell_decode_token(p, stream);
      p.h = nullptr;
      p.flags = nullptr;
      p.y = nullptr;
      p.nnz_out = nullptr;
      p.y_fixed = acc.get();
      p.overflow = overflow.get();
      if (c.norm) {
        p.x = nullptr;
        p.norm.r = r.get();
        p.norm.w = w.get();
        p.norm.eps = eps;
      }
      cuda::launch_twell_decode_token(p, stream);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(download<unsigned>(overflow)[0], 0u);
      Out o{download<bf16>(y), download<unsigned char>(flags), download<float>(h), download<unsigned long long>(nnz)[0],
            download<long long>(acc)};
      for (std::size_t i = 0; i < n; ++i)
        if (!o.flags[i]) o.h[i] = 0;  // scratch: only the active neurons' entries are written
      return o;
    };
    const Out want = run(nullptr, nullptr);
    ASSERT_GT(want.count, 0u);
    std::vector<std::int32_t> perm(n);
    for (std::size_t i = 0; i < n; ++i) perm[i] = static_cast<std::int32_t>(i);
    for (std::size_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(i)))]);
    std::vector<std::int32_t> reversed(perm.rbegin(), perm.rend());
    int launches = 0;
    const auto expect_same = [&](const std::vector<std::int32_t>& order, const char* what) {
      SCOPED_TRACE(what);
      auto d_order = upload(order);
      const Out have = run(d_order.get(), hits.get());
      launches += 2;
      EXPECT_EQ(std::memcmp(have.y.data(), want.y.data(), k * sizeof(bf16)), 0) << "y";
      EXPECT_EQ(std::memcmp(have.flags.data(), want.flags.data(), n), 0) << "flags";
      EXPECT_EQ(std::memcmp(have.h.data(), want.h.data(), n * sizeof(float)), 0) << "h";
      EXPECT_EQ(have.count, want.count);
      EXPECT_EQ(have.acc, want.acc) << "the fixed-point sums";
      const auto hv = download<std::uint32_t>(hits);
      std::int64_t bad = -1;
      for (std::size_t i = 0; i < n && bad < 0; ++i)
        if (hv[i] != static_cast<std::uint32_t>(launches * want.flags[i])) bad = static_cast<std::int64_t>(i);
      EXPECT_EQ(bad, -1) << "hits of neuron " << bad;
    };
    expect_same(perm, "random permutation");
    expect_same(reversed, "reversed");
    DeviceBuffer<std::int32_t> sorted(n);
    cuda::launch_decode_token_reorder(hits.get(), sorted.get(), c.n, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto order = download<std::int32_t>(sorted);
    EXPECT_EQ(order, reorder_on_host(download<std::uint32_t>(hits)));
    expect_same(order, "by activity");
  }
  cudaStreamDestroy(stream);
}

// Fixed-point values for the readers: sums of a few terms of normal-sized y, zero, ±1, and values
// past 2⁵³ (the double's rounding first).
std::vector<long long> random_fixed(Rng& rng, std::size_t k) {
  std::vector<long long> v(k);
  for (std::size_t i = 0; i < k; ++i) v[i] = std::llrint(rng.normal() * 3 * 4294967296.0);
  if (k >= 6) {
    v[0] = 0;
    v[1] = 1;
    v[2] = -1;
    v[3] = (1ll << 60) + 12345;
    v[4] = -(1ll << 55) - 7;
    v[5] = 3ll << 31;  // 1.5: a bf16 value exactly
  }
  return v;
}

// The fixed-point values as the bf16 deltas the readers must add.
std::vector<bf16> fixed_as_bf16(const std::vector<long long>& v) {
  std::vector<bf16> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = to_bf16(cuda::fixed_to_float_bf16(v[i]));
  return b;
}

// rmsnorm_project with the fixed-point delta equals rmsnorm_project with that delta as bf16 (the
// host's conversion), bit for bit: both norm branches (4-wide, and the streamed one at k = 4104);
// and again with the delta written late under programmatic launches (it must be read after the
// wait).
TEST(ModelOps, RmsnormProjectTakesTheFixedPointDelta) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  // 2048, 576, 8: the norm's 4-wide row; 3072, 4096: 4-wide, over 2048; 4104, 8192: element by element.
  for (auto [k, n] :
       {std::pair<int, int>{2048, 2560}, {8, 1}, {576, 17}, {3072, 40}, {4096, 24}, {4104, 33}, {8192, 100}}) {
    SCOPED_TRACE(::testing::Message() << "k " << k << " n " << n);
    const auto [x, w, delta, wp] = norm_project_inputs(rng, k, n);
    const auto fixed = random_fixed(rng, x.size());
    auto dx = upload(x), dw = upload(w);
    auto dfixed = upload(fixed);
    auto dd = upload<__nv_bfloat16>(fixed_as_bf16(fixed));
    auto dwp = upload<__nv_bfloat16>(wp);
    DeviceBuffer<__nv_bfloat16> y1(static_cast<std::size_t>(n)), y2(static_cast<std::size_t>(n));
    cuda::ops::rmsnorm_project(dx.get(), dd.get(), k, dw.get(), 1e-5f, dwp.get(), n, y1.get(), nullptr);
    cuda::ops::rmsnorm_project(dx.get(), reinterpret_cast<const std::int64_t*>(dfixed.get()), k, dw.get(), 1e-5f,
                               dwp.get(), n, y2.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto a = download<bf16>(y1), b = download<bf16>(y2);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)), 0);
    EXPECT_EQ(download<long long>(dfixed), fixed) << "the delta was written";
    {  // the fixed-point delta arriving late under programmatic launches: it is read after the wait
      cudaStream_t stream = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      auto late = upload(random_fixed(rng, fixed.size()));  // other values until late_copy lands fixed
      DeviceBuffer<__nv_bfloat16> y3(y1.size());
      {
        const cuda::ProgrammaticLaunch programmatic(cuda::programmatic_launch_supported());
        late_copy(dfixed.get(), late.get(), fixed.size() * sizeof(long long), 100, stream);
        cuda::ops::rmsnorm_project(dx.get(), reinterpret_cast<const std::int64_t*>(late.get()), k, dw.get(), 1e-5f,
                                   dwp.get(), n, y3.get(), stream);
      }
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      cudaStreamDestroy(stream);
      const auto c = download<bf16>(y3);
      EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(bf16)), 0) << "late delta";
    }
  }
}

// The GEMV's residual add (launch_twell_gemv_row_residual: a decode step's attention output
// projection storing the residual stream): y as the plain GEMV's bits, r = (r + first) + y in
// fp32 in that order, first fixed-point (then zeroed) or none; residual_add_fixed adds the
// fixed-point values as residual_add adds bf16 ones and zeroes them.
TEST(ModelOps, ResidualAddsTakeTheFixedPointOutput) {
  TWELL_REQUIRE_GPU();
  Rng rng(fresh_seed());
  for (auto [k, n] : {std::pair<int, int>{2048, 2048}, {8, 17}, {4096, 2560}}) {
    for (const bool with_first : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "k " << k << " n " << n << (with_first ? " first" : " without first"));
      const auto [xin, w, delta, wp] = norm_project_inputs(rng, k, n);
      const auto xb = random_bf16(rng, static_cast<std::size_t>(k));
      std::vector<float> rv(static_cast<std::size_t>(n));
      for (auto& e : rv) e = static_cast<float>(3.0 * rng.normal());
      const auto fixed = random_fixed(rng, rv.size());
      const auto first = fixed_as_bf16(fixed);
      auto dx = upload<__nv_bfloat16>(xb), dwp = upload<__nv_bfloat16>(wp);
      auto dr = upload(rv);
      auto dfixed = upload(fixed);
      DeviceBuffer<__nv_bfloat16> y1(rv.size()), y2(rv.size());
      cuda::launch_twell_gemv_row(dx.get(), dwp.get(), n, k, y1.get(), nullptr, true);
      cuda::launch_twell_gemv_row_residual(dx.get(), dwp.get(), n, k, y2.get(), dr.get(),
                                           with_first ? reinterpret_cast<std::int64_t*>(dfixed.get()) : nullptr, nullptr, true);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto ya = download<bf16>(y1), yb = download<bf16>(y2);
      EXPECT_EQ(std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(bf16)), 0) << "y";
      const auto r = download<float>(dr);
      std::int64_t bad = -1;
      for (std::size_t j = 0; j < rv.size() && bad < 0; ++j) {
        float e = rv[j];
        if (with_first) e += to_float(first[j]);
        e += to_float(ya[j]);
        if (std::memcmp(&e, &r[j], sizeof(float)) != 0) bad = static_cast<std::int64_t>(j);
      }
      EXPECT_EQ(bad, -1) << "r differs at column " << bad;
      const auto after = download<long long>(dfixed);
      if (with_first)
        EXPECT_EQ(std::count(after.begin(), after.end(), 0ll), static_cast<long>(after.size())) << "not zeroed";
      else
        EXPECT_EQ(after, fixed);
    }
  }
  for (std::int64_t n : {1, 2048, 100003}) {
    SCOPED_TRACE(n);
    std::vector<float> xv(static_cast<std::size_t>(n));
    for (auto& e : xv) e = static_cast<float>(3.0 * rng.normal());
    const auto fixed = random_fixed(rng, xv.size());
    const auto fb = fixed_as_bf16(fixed);
    auto dx = upload(xv);
    auto dfixed = upload(fixed);
    cuda::ops::residual_add_fixed(dx.get(), reinterpret_cast<std::int64_t*>(dfixed.get()), n, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto x = download<float>(dx);
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const float e = xv[i] + to_float(fb[i]);
      ASSERT_EQ(std::memcmp(&e, &x[i], sizeof(float)), 0) << i;
    }
    const auto after = download<long long>(dfixed);
    EXPECT_EQ(std::count(after.begin(), after.end(), 0ll), static_cast<long>(after.size()));
  }
}

}  // namespace
}  // namespace twell::test
