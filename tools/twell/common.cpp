#include "common.hpp"
#include "twell/host_memory.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <cstring>

#include <fmt/ranges.h>

#include "twell/io/safetensors.hpp"
#if defined(TWELL_HAVE_CUDA)
#include "twell/cuda/ffn_cuda.hpp"
#endif

#include "twell_commit.hpp"  // generated at build time: TWELL_GIT_COMMIT

namespace twell::cli {

// ---------------------------------------------------------------------------------------------
// FFN inputs

FfnWeights FfnInputs::weights() const {
  return ffn_weights(gated ? w_gate.data<float>() : nullptr, w_up.data<float>(), w_down.data<float>(), n, k);
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

void check_finite(const std::string& name, const HostTensor& t) {
  TWELL_CHECK(t.dtype() == DType::f32, ErrorCode::internal, "check_finite expects f32");
  const float* p = t.data<float>();
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::isfinite(p[i])) continue;
    // Unravel the flat index into the tensor's coordinates.
    std::vector<std::int64_t> idx(t.shape().size());
    std::int64_t rem = i;
    for (std::size_t d = idx.size(); d-- > 0;) {
      idx[d] = rem % t.shape()[d];
      rem /= t.shape()[d];
    }
    fail(ErrorCode::non_finite, "tensor '{}' has a non-finite value ({}) at index {}; inputs must be finite", name,
         std::isnan(p[i]) ? "NaN" : (p[i] > 0 ? "+Inf" : "-Inf"), shape_string(idx));
  }
}

namespace {

const char* kFfnNames[] = {"x", "w_gate", "w_up", "w_down", "dy", "l1_coeff"};

HostTensor take_f32(const io::SafetensorsFile& f, const std::string& name, const std::string& path) {
  const HostTensor* t = f.find(name);
  TWELL_CHECK(t != nullptr, ErrorCode::internal, "tensor {} vanished", name);
  if (t->dtype() != DType::f32 && t->dtype() != DType::bf16)
    fail(ErrorCode::dtype_mismatch, "{}: tensor '{}' has dtype {}; twell reads F32 or BF16 tensors", path, name,
         to_string(t->dtype()));
  HostTensor out = t->to_f32();
  check_finite(name, out);
  return out;
}

void require_rank2(const HostTensor& t, const char* name, const char* layout) {
  if (t.rank() != 2)
    fail(ErrorCode::shape_mismatch, "tensor '{}' must be 2-D {}, got shape {}", name, layout, t.shape_string());
}

}  // namespace

FfnInputs load_ffn_inputs(const std::string& path, const LoadRules& rules) {
  const io::SafetensorsFile f = io::read_safetensors(path);

  // Unknown names are errors: a misnamed optional tensor (say "l1coeff") must not be silently
  // replaced by its default.
  for (const auto& name : f.names()) {
    bool known = false;
    for (const char* k : kFfnNames) known |= name == k;
    if (!known)
      fail(ErrorCode::invalid_argument, "{}: unexpected tensor '{}' (twell {} reads x, w_gate, w_up, w_down, dy, "
           "l1_coeff); is it misnamed?", path, name, rules.command);
  }
  for (const char* need : {"x", "w_up", "w_down"})
    if (!f.contains(need))
      fail(ErrorCode::invalid_argument, "{}: missing tensor '{}' (found: {})", path, need,
           f.tensors.empty() ? std::string("none") : fmt::format("{}", fmt::join(f.names(), ", ")));
  if (rules.gated && !f.contains("w_gate"))
    fail(ErrorCode::invalid_argument, "{}: missing tensor 'w_gate' (pass --no-gate for a non-gated FFN)", path);
  if (!rules.gated && f.contains("w_gate"))
    fail(ErrorCode::invalid_argument, "{}: tensor 'w_gate' is present but unused with --no-gate; remove it or drop "
         "--no-gate", path);
  if (rules.need_dy && !f.contains("dy"))
    fail(ErrorCode::invalid_argument, "{}: missing tensor 'dy' (the gradient of y, [M, K]), needed by --op train",
         path);

  FfnInputs in;
  in.source = path;
  in.gated = rules.gated;
  in.x = take_f32(f, "x", path);
  require_rank2(in.x, "x", "[M, K]");
  in.m = in.x.dim(0);
  in.k = in.x.dim(1);
  if (in.m == 0 || in.k == 0) fail(ErrorCode::shape_mismatch, "tensor 'x' is empty (shape {})", in.x.shape_string());

  in.w_up = take_f32(f, "w_up", path);
  require_rank2(in.w_up, "w_up", "[N, K]");
  in.n = in.w_up.dim(0);
  if (in.w_up.dim(1) != in.k)
    fail(ErrorCode::shape_mismatch, "tensor 'w_up' has shape {} but x has K = {} columns: w_up must be [N, {}]",
         in.w_up.shape_string(), in.k, in.k);
  if (in.n == 0) fail(ErrorCode::shape_mismatch, "tensor 'w_up' is empty (N = 0)");

  if (rules.gated) {
    in.w_gate = take_f32(f, "w_gate", path);
    require_rank2(in.w_gate, "w_gate", "[N, K]");
    if (in.w_gate.dim(1) != in.k)
      fail(ErrorCode::shape_mismatch, "tensor 'w_gate' has shape {} but x has K = {} columns: w_gate must be [N, {}]",
           in.w_gate.shape_string(), in.k, in.k);
    if (in.w_gate.dim(0) != in.n)
      fail(ErrorCode::shape_mismatch, "tensors 'w_gate' {} and 'w_up' {} disagree on N: both must be [N, K]",
           in.w_gate.shape_string(), in.w_up.shape_string());
  }

  in.w_down = take_f32(f, "w_down", path);
  require_rank2(in.w_down, "w_down", "[K, N]");
  if (in.w_down.dim(0) != in.k || in.w_down.dim(1) != in.n) {
    const bool transposed = in.w_down.dim(0) == in.n && in.w_down.dim(1) == in.k;
    fail(ErrorCode::shape_mismatch, "tensor 'w_down' has shape {} but must be [K, N] = [{}, {}] (Hugging Face "
         "down_proj layout){}", in.w_down.shape_string(), in.k, in.n,
         transposed ? "; it looks transposed" : "");
  }

  if (rules.need_dy) {
    in.dy = take_f32(f, "dy", path);
    require_rank2(in.dy, "dy", "[M, K]");
    if (in.dy.dim(0) != in.m || in.dy.dim(1) != in.k)
      fail(ErrorCode::shape_mismatch, "tensor 'dy' has shape {} but must match y: [M, K] = [{}, {}]",
           in.dy.shape_string(), in.m, in.k);
    in.has_dy = true;
  }
  if (f.contains("l1_coeff")) {
    const HostTensor c = take_f32(f, "l1_coeff", path);
    const bool scalar = c.rank() == 0 || (c.rank() == 1 && c.dim(0) == 1);
    if (!scalar)
      fail(ErrorCode::shape_mismatch, "tensor 'l1_coeff' must be a scalar (shape [] or [1]), got shape {}",
           c.shape_string());
    in.l1_coeff = static_cast<double>(*c.data<float>());
  }
  return in;
}

HostTensor random_normal(std::vector<std::int64_t> shape, std::uint64_t seed) {
  HostTensor t(DType::f32, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

FfnInputs generate_inputs(const SparsityParams& p, bool with_dy) {
  // The generator's fp32 tensors: x (and dy) [M, K], the three weights [N, K].
  const double m = static_cast<double>(p.m), k = static_cast<double>(p.k), n = static_cast<double>(p.n);
  check_host_memory(4.0 * ((with_dy ? 2 : 1) * m * k + 3 * n * k),
                    fmt::format("generating FFN inputs at M={} K={} N={}", p.m, p.k, p.n));
  GeneratedFfn g = generate_ffn(p);
  FfnInputs in;
  in.source = "generated";
  in.gated = p.gated;
  in.m = p.m;
  in.k = p.k;
  in.n = p.n;
  in.x = std::move(g.x);
  in.w_gate = std::move(g.w_gate);
  in.w_up = std::move(g.w_up);
  in.w_down = std::move(g.w_down);
  if (with_dy) {
    // A different stream from the generator's own (seed + a constant) so dy is independent of x.
    in.dy = random_normal({p.m, p.k}, p.seed ^ 0x9e3779b97f4a7c15ull);
    in.has_dy = true;
  }
  return in;
}

// ---------------------------------------------------------------------------------------------
// Flags

void GenFlags::add(CLI::App* app, bool with_m) {
  if (with_m) options.push_back(app->add_option("--m", p.m, "Tokens (rows of x)"));
  options.push_back(app->add_option("--k", p.k, "Hidden size K"));
  options.push_back(app->add_option("--n", p.n, "Intermediate size N"));
  options.push_back(app->add_option("--density", p.density, "Mean fraction of active neurons per row, in (0, 1]"));
  options.push_back(app->add_option("--row-spread", p.row_spread, "Sigma of the log-normal per-row density spread (0 = i.i.d. rows)"));
  options.push_back(app->add_option("--hot-rows", p.hot_rows, "Fraction of 'hot' rows, in [0, 1]"));
  options.push_back(app->add_option("--hot-density", p.hot_density, "Density of a hot row, in (0, 1]"));
  options.push_back(app->add_option("--neuron-skew", p.neuron_skew, "Sigma of the log-normal neuron popularity (0 = uniform)"));
  options.push_back(app->add_option("--dead-neurons", p.dead_neurons, "Fraction of neurons that never fire, in [0, 1)"));
  options.push_back(app->add_option("--seed", p.seed, "Random seed (same seed, same tensors)"));
}

void GenFlags::validate() const {
  auto bad = [](const char* flag, auto v, const char* range) {
    fail(ErrorCode::invalid_argument, "{} must be {}, got {}", flag, range, v);
  };
  if (p.m < 1) bad("--m", p.m, ">= 1");
  if (p.k < 1) bad("--k", p.k, ">= 1");
  if (p.n < 1) bad("--n", p.n, ">= 1");
  if (!(p.density > 0 && p.density <= 1)) bad("--density", p.density, "in (0, 1]");
  if (!(p.row_spread >= 0 && std::isfinite(p.row_spread))) bad("--row-spread", p.row_spread, ">= 0");
  if (!(p.hot_rows >= 0 && p.hot_rows <= 1)) bad("--hot-rows", p.hot_rows, "in [0, 1]");
  if (!(p.hot_density > 0 && p.hot_density <= 1)) bad("--hot-density", p.hot_density, "in (0, 1]");
  if (!(p.neuron_skew >= 0 && std::isfinite(p.neuron_skew))) bad("--neuron-skew", p.neuron_skew, ">= 0");
  if (!(p.dead_neurons >= 0 && p.dead_neurons < 1)) bad("--dead-neurons", p.dead_neurons, "in [0, 1)");
  p.validate();  // the generator's own limits (e.g. the smallest K it can build)
}

void FormatFlags::add(CLI::App* app, bool with_ell) {
  app->add_option("--tile", tile, "TwELL tile width T (columns per tile; 2..65536, a multiple of C)");
  app->add_option("--compression", compression, "TwELL compression factor C (T/C words per (row, tile), T/C >= 2)");
  if (with_ell) app->add_option("--ell-width", ell_width, "Hybrid ELL width E for training (rows with more go dense)");
}

TwellConfig FormatFlags::twell() const {
  if (tile < 2 || tile > 65536)
    fail(ErrorCode::invalid_argument, "--tile must be in [2, 65536] (tile-local indices are 16-bit), got {}", tile);
  if (compression < 1) fail(ErrorCode::invalid_argument, "--compression must be >= 1, got {}", compression);
  if (tile % compression != 0)
    fail(ErrorCode::invalid_argument, "--tile {} is not a multiple of --compression {}", tile, compression);
  if (tile / compression < 2)
    fail(ErrorCode::invalid_argument, "--tile / --compression must be >= 2 (a count word plus one value), got {}",
         tile / compression);
  TwellConfig c;
  c.tile = tile;
  c.compression = compression;
  c.validate();
  return c;
}

HybridConfig FormatFlags::hybrid() const {
  if (ell_width < 1) fail(ErrorCode::invalid_argument, "--ell-width must be >= 1, got {}", ell_width);
  HybridConfig c;
  c.ell_width = ell_width;
  c.validate();
  return c;
}

bool have_cuda_build() {
#if defined(TWELL_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

const char* to_string(DeviceKind d) { return d == DeviceKind::cuda ? "cuda" : "cpu"; }

DeviceKind resolve_device(const std::string& flag, std::string* why) {
  if (flag == "cpu") {
    if (why) *why = "requested";
    return DeviceKind::cpu;
  }
  if (flag != "" && flag != "cuda")
    fail(ErrorCode::invalid_argument, "--device must be cpu or cuda, got '{}'", flag);
#if defined(TWELL_HAVE_CUDA)
  const cuda::DeviceInfo info = cuda::query_device();
  if (info.available) {
    if (why) *why = info.name;
    return DeviceKind::cuda;
  }
  if (flag == "cuda") fail(ErrorCode::unsupported, "--device cuda: no usable CUDA device ({})", info.reason);
  if (why) *why = "no CUDA device: " + info.reason;
  return DeviceKind::cpu;
#else
  if (flag == "cuda")
    fail(ErrorCode::unsupported, "--device cuda: this twell was built without CUDA; use --device cpu or rebuild "
         "with nvcc present");
  if (why) *why = "built without CUDA";
  return DeviceKind::cpu;
#endif
}

void check_writable(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  if (path.empty()) fail(ErrorCode::invalid_argument, "{} needs a file name", flag);
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(ErrorCode::io, "cannot write '{}' ({}): it is a directory", path, flag);
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec))
    fail(ErrorCode::io, "cannot write '{}' ({}): directory '{}' does not exist", path, flag, parent.string());
}

// ---------------------------------------------------------------------------------------------
// Activation statistics

ActivationStats activation_stats(const TwellMatrix& g, int ell_width) {
  ActivationStats s;
  s.twell = twell_stats(g);
  s.config = g.config;
  s.ell_width = ell_width;
  const std::int64_t M = g.rows, N = g.cols, T = g.config.tile;
  s.row_nnz.assign(static_cast<std::size_t>(M), 0);
  s.neuron_fires.assign(static_cast<std::size_t>(N), 0);
  for (std::int64_t r = 0; r < M; ++r) {
    const std::int64_t b = g.backup_index(r);
    std::int64_t count = 0;
    if (b >= 0) {
      // Overflowed row: the block keeps only the first S − 1 entries; the backup row has them all.
      const float* row = g.backup.data() + b * N;
      for (std::int64_t c = 0; c < N; ++c)
        if (row[c] != 0.0f) {
          ++count;
          ++s.neuron_fires[static_cast<std::size_t>(c)];
        }
      // The true counts are authoritative (a value that rounded to a bf16 zero still fired).
      std::int64_t true_count = 0;
      for (std::int64_t t = 0; t < g.tiles; ++t) true_count += g.block(r, t)[0];
      count = true_count;
    } else {
      for (std::int64_t t = 0; t < g.tiles; ++t) {
        const std::uint32_t* blk = g.block(r, t);
        const std::uint32_t n = blk[0];
        count += n;
        for (std::uint32_t j = 1; j <= n; ++j)
          ++s.neuron_fires[static_cast<std::size_t>(t * T + twell_col(blk[j]))];
      }
    }
    s.row_nnz[static_cast<std::size_t>(r)] = count;
    if (count > ell_width) ++s.hybrid_tail_rows;
  }
  for (auto f : s.neuron_fires) s.dead_neurons += f == 0;

  std::vector<std::int64_t> sorted = s.row_nnz;
  std::sort(sorted.begin(), sorted.end());
  auto pct = [&](double q) {
    if (sorted.empty()) return std::int64_t{0};
    const auto i = static_cast<std::size_t>(std::min<double>(static_cast<double>(sorted.size() - 1),
                                                             std::floor(q * static_cast<double>(sorted.size()))));
    return sorted[i];
  };
  s.min_row = sorted.empty() ? 0 : sorted.front();
  s.p50 = pct(0.50);
  s.p90 = pct(0.90);
  s.p99 = pct(0.99);

  std::vector<std::int64_t> fires = s.neuron_fires;
  std::sort(fires.rbegin(), fires.rend());
  const std::size_t top = std::max<std::size_t>(1, fires.size() / 100);
  std::int64_t total = 0, top_sum = 0;
  for (std::size_t i = 0; i < fires.size(); ++i) {
    total += fires[i];
    if (i < top) top_sum += fires[i];
  }
  s.top1pct_share = total ? static_cast<double>(top_sum) / static_cast<double>(total) : 0.0;

  // Power-of-two buckets of the row nnz: 0, 1, 2-3, 4-7, ...
  const std::int64_t maxv = sorted.empty() ? 0 : sorted.back();
  s.histogram.emplace_back("0", 0);
  for (std::int64_t lo = 1; lo <= std::max<std::int64_t>(maxv, 1); lo *= 2) {
    const std::int64_t hi = lo * 2 - 1;
    s.histogram.emplace_back(lo == hi ? std::to_string(lo) : fmt::format("{}-{}", lo, hi), 0);
  }
  for (auto v : s.row_nnz) {
    std::size_t bucket = 0;
    if (v > 0) bucket = 1 + static_cast<std::size_t>(std::bit_width(static_cast<std::uint64_t>(v)) - 1);
    s.histogram[bucket].second++;
  }
  return s;
}

nlohmann::json ActivationStats::to_json() const {
  nlohmann::json j;
  j["rows"] = twell.rows;
  j["cols"] = twell.cols;
  j["nnz"] = twell.nnz;
  j["density"] = twell.rows && twell.cols ? static_cast<double>(twell.nnz) / static_cast<double>(twell.rows) /
                                                static_cast<double>(twell.cols)
                                          : 0.0;
  j["row_nnz"] = {{"mean", twell.mean_row_nnz}, {"min", min_row}, {"p50", p50},   {"p90", p90},
                  {"p99", p99},                 {"max", twell.max_row_nnz},        {"empty_rows", twell.empty_rows}};
  nlohmann::json hist = nlohmann::json::array();
  for (const auto& [label, count] : histogram) hist.push_back({{"bucket", label}, {"rows", count}});
  j["row_nnz_histogram"] = hist;
  j["twell"] = {{"tile", config.tile},
                {"compression", config.compression},
                {"capacity", config.capacity()},
                {"mean_tile_nnz", twell.mean_tile_nnz},
                {"max_tile_nnz", twell.max_tile_nnz},
                {"overflow_tiles", twell.overflow_tiles},
                {"overflow_rows", twell.overflow_rows}};
  j["hybrid"] = {{"ell_width", ell_width}, {"tail_rows", hybrid_tail_rows}};
  j["neurons"] = {{"dead", dead_neurons},
                  {"fired", static_cast<std::int64_t>(neuron_fires.size()) - dead_neurons},
                  {"top1pct_share", top1pct_share}};
  return j;
}

void print_activation_stats(const ActivationStats& s, std::FILE* out) {
  const auto& t = s.twell;
  const double density =
      t.rows && t.cols ? static_cast<double>(t.nnz) / static_cast<double>(t.rows) / static_cast<double>(t.cols) : 0;
  fmt::print(out, "  active neurons      {} of {} x {} ({:.3f}% density)\n", t.nnz, t.rows, t.cols, 100 * density);
  fmt::print(out, "  nnz per row         mean {:.1f}  min {}  p50 {}  p90 {}  p99 {}  max {}  empty rows {}\n",
             t.mean_row_nnz, s.min_row, s.p50, s.p90, s.p99, t.max_row_nnz, t.empty_rows);
  fmt::print(out, "  row nnz histogram  ");
  for (const auto& [label, count] : s.histogram)
    if (count) fmt::print(out, " {}:{}", label, count);
  fmt::print(out, "\n");
  fmt::print(out, "  {:<20}capacity {} per (row, tile); mean tile nnz {:.2f}, max {}\n",
             fmt::format("TwELL T={} C={}", s.config.tile, s.config.compression), s.config.capacity(), t.mean_tile_nnz,
             t.max_tile_nnz);
  fmt::print(out, "  overflow            {} tiles in {} rows (computed exactly through the backup rows)\n",
             t.overflow_tiles, t.overflow_rows);
  fmt::print(out, "  {:<20}{} rows over E go to the dense tail\n", fmt::format("hybrid E={}", s.ell_width),
             s.hybrid_tail_rows);
  fmt::print(out, "  neurons             {} dead (never fired in these rows) of {}; top 1% hold {:.1f}% of activations\n",
             s.dead_neurons, s.neuron_fires.size(), 100 * s.top1pct_share);
}

// ---------------------------------------------------------------------------------------------
// Misc

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string git_commit() {
  // TWELL_COMMIT (set by scripts/gpu-check and by hand on machines whose copy of the tree has no
  // .git of its own, where the build-time stamp may name some other repository's commit) wins over
  // the build-time stamp.
  const char* env = std::getenv("TWELL_COMMIT");
  if (env && *env) return env;
  return TWELL_GIT_COMMIT;
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown CPU";
}

std::string iso_time_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int host_threads() { return omp_get_max_threads(); }

void note(const std::string& message) {
  std::fprintf(stderr, "twell: %s\n", message.c_str());
  std::fflush(stderr);
}

void write_text_file(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::fflush(stdout);  // what was printed comes first where the file is stdout itself
  // A symlink, a device (/dev/stdout) or a pipe is written in place: a rename would replace it.
  if (fs::exists(fs::symlink_status(path, ec)) && !fs::is_regular_file(fs::symlink_status(path, ec))) {
    std::ofstream f(path, std::ios::binary);
    f << text;
    f.close();
    if (!f) fail(ErrorCode::io, "cannot write '{}'", path);
    return;
  }
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long long>(::getpid()));
  std::ofstream f(tmp, std::ios::binary);
  if (!f) fail(ErrorCode::io, "cannot write '{}': {}", tmp, std::strerror(errno));
  f << text;
  f.close();  // flushes; a failure here (a full disk) must not be renamed over a good file
  if (!f) {
    std::remove(tmp.c_str());
    fail(ErrorCode::io, "cannot write '{}'", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    fail(ErrorCode::io, "cannot rename '{}' to '{}': {}", tmp, path, std::strerror(e));
  }
}

void write_json_file(const std::string& path, const nlohmann::json& j) { write_text_file(path, j.dump(2) + "\n"); }

std::string read_text_file(const std::string& path, const char* flag) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(ErrorCode::io, "{}: '{}' is a directory", flag, path);
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorCode::io, "{}: cannot open '{}'", flag, path);
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) fail(ErrorCode::io, "{}: cannot read '{}'", flag, path);
  return s.str();
}

}  // namespace twell::cli
