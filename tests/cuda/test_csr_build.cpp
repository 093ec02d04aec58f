// The training CSR build from its two sources: the dense bf16 gate and TwELL (the sm90 gate's
// epilogue output, here packed by twell_pack from the same values). Both must give the same CSR,
// bit for bit, and the host's: counts, offsets, columns, values and the dense-row flags; the
// gathered hot columns as each source defines them. The TwELL build's dense buffer is poisoned outside the overflowed blocks, so
// reading any other block shows.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/sm80/twell_kernels.hpp"
#include "cuda/train/csr_kernels.hpp"
#include "cuda_test_util.hpp"
#include "twell/bf16.hpp"

namespace twell::cuda::test {
namespace {

struct CsrCase {
  std::int64_t m, n;
  int words_per_tile;
  double density;      // share of positive values (the rest: negative, ±0, a few NaN)
  int full_rows;       // rows 0 .. full_rows − 1 all positive (every block of them overflows for S < 257)
  int skip_every;      // every skip_every-th column left out (0: no mask)
  bool gather;         // the left-out columns gathered
  std::int64_t dense_row_cap;  // −1: no dense rows
};

std::ostream& operator<<(std::ostream& os, const CsrCase& c) {
  return os << "m" << c.m << "_n" << c.n << "_S" << c.words_per_tile << "_d" << c.density << "_full" << c.full_rows
            << "_skip" << c.skip_every << (c.gather ? "_gather" : "") << "_cap" << c.dense_row_cap;
}

template <typename T>
std::vector<T> download(const DeviceBuffer<T>& d, std::size_t count) {
  std::vector<T> h(count);
  if (count > 0) {
    EXPECT_EQ(cudaMemcpy(h.data(), d.get(), count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return h;
}

template <typename T>
void upload(DeviceBuffer<T>& d, const std::vector<T>& h) {
  d.resize(h.size());
  ASSERT_EQ(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}

bool kept(std::uint16_t b) { return b - 1u < 0x7f80u; }  // > 0: positive finite or +inf (the ReLU keep rule)

// One build's outputs, downloaded.
struct Built {
  std::vector<std::int64_t> counts, offsets;
  std::vector<std::int32_t> cols;
  std::vector<std::uint16_t> vals, hot;
  std::vector<unsigned char> flags;
  std::vector<std::int32_t> dense_rows;
  int n_dense = 0;
};

class CsrBuild : public ::testing::TestWithParam<CsrCase> {};

TEST_P(CsrBuild, TwellSourceMatchesDenseSourceAndHost) {
  TWELL_REQUIRE_GPU();
  const CsrCase c = GetParam();
  const std::int64_t m = c.m, n = c.n, ld = (n + 7) / 8 * 8 + 8;  // a padded row stride
  const int S = c.words_per_tile;
  const std::int64_t tiles = (n + kTwellTile - 1) / kTwellTile;
  std::mt19937_64 rng(static_cast<std::uint64_t>(m * 1000003 + n * 31 + S));
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  const std::uint16_t nan_bits = 0x7fc1, neg_zero = 0x8000;
  std::vector<std::uint16_t> g(static_cast<std::size_t>(m * ld), 0x3f80);  // padding: 1.0 (kept if ever read)
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t j = 0; j < n; ++j) {
      const float p = u01(rng);
      std::uint16_t b;
      if (r < c.full_rows || p < c.density) {
        b = to_bf16(0.01f + u01(rng)).bits;
      } else {
        const float q = u01(rng);
        b = q < 0.01f ? nan_bits : q < 0.05f ? neg_zero : q < 0.2f ? std::uint16_t{0} : to_bf16(-0.01f - u01(rng)).bits;
      }
      g[static_cast<std::size_t>(r * ld + j)] = b;
    }

  // The column mask, the places of the left-out columns, and the host's CSR.
  const std::int64_t groups = (n + 7) / 8;
  std::vector<unsigned char> skip8(static_cast<std::size_t>(groups), 0);
  std::vector<std::int32_t> base8(static_cast<std::size_t>(groups), 0);
  std::int64_t hot_count = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    if (j % 8 == 0) base8[static_cast<std::size_t>(j / 8)] = static_cast<std::int32_t>(hot_count);
    if (c.skip_every > 0 && j % c.skip_every == 0) {
      skip8[static_cast<std::size_t>(j / 8)] |= static_cast<unsigned char>(1u << (j % 8));
      ++hot_count;
    }
  }
  const std::int64_t ld_hot = (hot_count + 7) / 8 * 8;
  std::vector<std::int64_t> want_counts(static_cast<std::size_t>(m), 0);
  // The gathered columns: the dense source copies every value as it is (the training step's gate
  // has ReLU applied: no negative value, ±0 or NaN can only be there as 0); TwELL has the kept
  // values only, and 0 for the rest.
  std::vector<std::uint16_t> want_hot_dense(static_cast<std::size_t>(m * ld_hot), 0), want_hot(want_hot_dense);
  for (std::int64_t r = 0; r < m; ++r) {
    std::int64_t h = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::uint16_t b = g[static_cast<std::size_t>(r * ld + j)];
      if (skip8[static_cast<std::size_t>(j / 8)] >> (j % 8) & 1) {
        want_hot_dense[static_cast<std::size_t>(r * ld_hot + h)] = b;
        want_hot[static_cast<std::size_t>(r * ld_hot + h++)] = kept(b) ? b : std::uint16_t{0};
      } else if (kept(b)) {
        ++want_counts[static_cast<std::size_t>(r)];
      }
    }
  }

  // TwELL of the same values (twell_pack, the keep rule v > 0), then a dense buffer that holds the
  // values of the overflowed blocks only: the rest 1.0, which a build that read them would keep.
  cudaStream_t s = nullptr;
  DeviceBuffer<std::uint16_t> dense;
  upload(dense, g);
  DeviceBuffer<std::uint32_t> words(static_cast<std::size_t>(m * tiles * S)), row_ovf(static_cast<std::size_t>(m));
  DeviceBuffer<TwellCounters> counters(1);
  TwellPackParams pp;
  pp.src = reinterpret_cast<const __nv_bfloat16*>(dense.get());
  pp.ld_src = ld;
  pp.m = m;
  pp.n = n;
  pp.words_per_tile = S;
  pp.words = words.get();
  pp.row_overflow = row_ovf.get();
  pp.counters = counters.get();
  launch_twell_pack(pp, s);
  const std::vector<std::uint32_t> hw = download(words, static_cast<std::size_t>(m * tiles * S));
  std::vector<std::uint16_t> backup(g.size(), 0x3f80);
  std::int64_t overflowed = 0;
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t t = 0; t < tiles; ++t) {
      if (hw[static_cast<std::size_t>((r * tiles + t) * S)] <= static_cast<std::uint32_t>(S - 1)) continue;
      ++overflowed;
      for (std::int64_t j = t * kTwellTile; j < std::min(n, (t + 1) * kTwellTile); ++j)
        backup[static_cast<std::size_t>(r * ld + j)] = g[static_cast<std::size_t>(r * ld + j)];
    }
  if (c.full_rows > 0 && S < kTwellTile) {
    EXPECT_GE(overflowed, c.full_rows) << "the all-positive rows overflow";
  }
  DeviceBuffer<std::uint16_t> backup_d;
  upload(backup_d, backup);

  DeviceBuffer<unsigned char> skip_d, scratch;
  DeviceBuffer<std::int32_t> base_d;
  upload(skip_d, skip8);
  upload(base_d, base8);

  const auto build = [&](bool twell) {
    DeviceBuffer<std::int64_t> counts(static_cast<std::size_t>(m)), offsets(static_cast<std::size_t>(m + 1));
    DeviceBuffer<std::uint16_t> hot(static_cast<std::size_t>(std::max<std::int64_t>(m * ld_hot, 1)));
    DeviceBuffer<unsigned char> flags(static_cast<std::size_t>(m));
    DeviceBuffer<std::int32_t> dense_rows(static_cast<std::size_t>(m));
    DeviceBuffer<int> n_dense(1);
    // Poison: a value any kernel forgot to write shows.
    EXPECT_EQ(cudaMemset(hot.get(), 0xff, hot.bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(counts.get(), 0xff, counts.bytes()), cudaSuccess);
    CsrBuildParams p;
    p.src = reinterpret_cast<const __nv_bfloat16*>(twell ? backup_d.get() : dense.get());
    p.ld_src = ld;
    p.m = m;
    p.n = n;
    if (twell) {
      p.words = words.get();
      p.words_per_tile = S;
    }
    p.row_counts = counts.get();
    p.offsets = offsets.get();
    if (c.skip_every > 0) p.skip8 = skip_d.get();
    if (c.gather && hot_count > 0) {
      p.hot_base8 = base_d.get();
      p.hot_out = reinterpret_cast<__nv_bfloat16*>(hot.get());
      p.ld_hot = ld_hot;
      p.hot_count = hot_count;
    }
    if (c.dense_row_cap >= 0) {
      p.dense_row_cap = c.dense_row_cap;
      p.dense_rows_min = 1;
      p.row_flags = flags.get();
      p.dense_rows = dense_rows.get();
      p.n_dense = n_dense.get();
    }
    csr_count_and_scan(p, scratch, s);
    Built b;
    b.offsets = download(offsets, static_cast<std::size_t>(m + 1));
    const std::int64_t nnz = b.offsets.back();
    DeviceBuffer<std::int32_t> cols(static_cast<std::size_t>(std::max<std::int64_t>(nnz, 1)));
    DeviceBuffer<std::uint16_t> vals(static_cast<std::size_t>(std::max<std::int64_t>(nnz, 1)));
    p.cols = cols.get();
    p.vals = reinterpret_cast<__nv_bfloat16*>(vals.get());
    if (nnz > 0) launch_csr_fill(p, s);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    b.counts = download(counts, static_cast<std::size_t>(m));
    b.cols = download(cols, static_cast<std::size_t>(nnz));
    b.vals = download(vals, static_cast<std::size_t>(nnz));
    if (p.hot_out) b.hot = download(hot, static_cast<std::size_t>(m * ld_hot));
    if (p.row_flags) {
      b.flags = download(flags, static_cast<std::size_t>(m));
      b.n_dense = download(n_dense, 1)[0];
      b.dense_rows = download(dense_rows, static_cast<std::size_t>(b.n_dense));
    }
    return b;
  };
  const Built d = build(false), t = build(true);

  // The dense source against the host.
  std::int64_t want_dense = 0;
  for (std::int64_t r = 0; r < m; ++r) want_dense += c.dense_row_cap >= 0 && want_counts[static_cast<std::size_t>(r)] > c.dense_row_cap;
  std::int64_t at = 0;
  for (std::int64_t r = 0; r < m; ++r) {
    ASSERT_EQ(d.offsets[static_cast<std::size_t>(r)], at) << "row " << r;
    const bool flagged = want_dense > 0 && want_counts[static_cast<std::size_t>(r)] > c.dense_row_cap;
    if (flagged) continue;  // a dense row has no entries
    for (std::int64_t j = 0; j < n; ++j) {
      const std::uint16_t b = g[static_cast<std::size_t>(r * ld + j)];
      if (!kept(b) || (skip8[static_cast<std::size_t>(j / 8)] >> (j % 8) & 1)) continue;
      ASSERT_EQ(d.cols[static_cast<std::size_t>(at)], j) << "row " << r;
      ASSERT_EQ(d.vals[static_cast<std::size_t>(at)], b) << "row " << r;
      ++at;
    }
  }
  ASSERT_EQ(d.offsets.back(), at);
  if (c.gather && hot_count > 0) {
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t h = 0; h < ld_hot; ++h) {
        const std::size_t i = static_cast<std::size_t>(r * ld_hot + h);
        ASSERT_EQ(d.hot[i], want_hot_dense[i]) << "hot column " << h << " of row " << r << " (dense source)";
        ASSERT_EQ(t.hot[i], want_hot[i]) << "hot column " << h << " of row " << r << " (TwELL source)";
      }
  }
  if (c.dense_row_cap >= 0) {
    ASSERT_EQ(d.n_dense, want_dense);
  }

  // The TwELL source: the same, bit for bit.
  EXPECT_EQ(t.counts, d.counts);
  EXPECT_EQ(t.offsets, d.offsets);
  EXPECT_EQ(t.cols, d.cols);
  EXPECT_EQ(t.vals, d.vals);
  EXPECT_EQ(t.flags, d.flags);
  EXPECT_EQ(t.n_dense, d.n_dense);
  EXPECT_EQ(t.dense_rows, d.dense_rows);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CsrBuild,
    ::testing::Values(CsrCase{1, 5, 32, 0.5, 0, 0, false, -1}, CsrCase{7, 1000, 32, 0.01, 1, 3, true, -1},
                      CsrCase{64, 5632, 32, 0.005, 2, 17, true, 40}, CsrCase{37, 300, 2, 0.02, 0, 0, false, 3},
                      CsrCase{300, 1000, 8, 0.03, 3, 5, true, 20}, CsrCase{33, 2600, 64, 0.2, 1, 0, false, -1},
                      CsrCase{20, 700, 128, 0.6, 2, 2, true, 100}, CsrCase{50, 513, 32, 0.0, 0, 4, true, 0},
                      CsrCase{9, 3000, 16, 1.0, 0, 7, true, 2000}),
    [](const ::testing::TestParamInfo<CsrCase>& i) {
      std::ostringstream os;
      os << i.param;
      std::string name = os.str();
      for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

}  // namespace
}  // namespace twell::cuda::test
