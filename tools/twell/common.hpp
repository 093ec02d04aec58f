#pragma once
// Pieces shared by the twell subcommands: input loading and checking, generator and format flags,
// device choice, timing, sparsity statistics. Everything here throws twell::Error on bad input;
// main() turns that into one line on stderr and a non-zero exit.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "twell/ffn.hpp"
#include "twell/hybrid_format.hpp"
#include "twell/sparsity_gen.hpp"
#include "twell/tensor.hpp"
#include "twell/twell_format.hpp"

namespace twell::cli {

// A subcommand: its CLI11 node and what to run once it was parsed. run() returns the exit code.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

void add_ffn_command(CLI::App& root, std::vector<Command>& out);
void add_bench_command(CLI::App& root, std::vector<Command>& out);
void add_stats_command(CLI::App& root, std::vector<Command>& out);
void add_gen_command(CLI::App& root, std::vector<Command>& out);
void add_generate_command(CLI::App& root, std::vector<Command>& out);
void add_serve_command(CLI::App& root, std::vector<Command>& out);  // only where cpp-httplib was found (TWELL_HAVE_SERVE)
void add_gen_model_command(CLI::App& gen, std::vector<Command>& out);
void add_bench_model_command(CLI::App& bench, std::vector<Command>& out);

// ---- FFN inputs ----

struct FfnInputs {
  HostTensor x, w_gate, w_up, w_down, dy;  // fp32; w_gate empty when !gated, dy empty unless loaded
  bool gated = true;
  bool has_dy = false;
  std::optional<double> l1_coeff;
  std::int64_t m = 0, k = 0, n = 0;
  std::string source;  // file name or "generated"

  CMatrixF x_view() const { return {x.data<float>(), m, k}; }
  CMatrixF dy_view() const { return {dy.data<float>(), m, k}; }
  FfnWeights weights() const;
};

struct LoadRules {
  bool gated = true;     // false: --no-gate; a w_gate tensor is then an error
  bool need_dy = false;  // train: dy required
  const char* command = "ffn";
};
// Reads IN, checks names, dtypes (F32/BF16), ranks, shapes and finiteness, converts to fp32.
FfnInputs load_ffn_inputs(const std::string& path, const LoadRules& rules);
// Generated inputs (fp32), with dy ~ N(0, 1) when with_dy.
FfnInputs generate_inputs(const SparsityParams& p, bool with_dy);
HostTensor random_normal(std::vector<std::int64_t> shape, std::uint64_t seed);

// Throws ErrorCode::non_finite naming the tensor and the index of its first NaN/Inf.
void check_finite(const std::string& name, const HostTensor& t);

// ---- flags shared by several subcommands ----

struct GenFlags {
  SparsityParams p;
  std::vector<CLI::Option*> options;  // the flags added, e.g. for `--in` to exclude them
  void add(CLI::App* app, bool with_m = true);
  void validate() const;  // names the offending flag
};

struct FormatFlags {
  int tile = 256;
  int compression = 8;
  int ell_width = 128;
  void add(CLI::App* app, bool with_ell = true);
  TwellConfig twell() const;   // validated
  HybridConfig hybrid() const; // validated
};

enum class DeviceKind { cpu, cuda };
// "" = automatic (cuda when this build has CUDA and a usable GPU, else cpu). Throws on an
// unusable explicit choice. `why` receives a short reason for the choice.
DeviceKind resolve_device(const std::string& flag, std::string* why = nullptr);
const char* to_string(DeviceKind d);
bool have_cuda_build();

// Checks that OUT can be created (its directory exists and is a directory), before long work.
void check_writable(const std::string& path, const char* flag);

// ---- statistics of an activation pattern ----

struct ActivationStats {
  TwellStats twell;
  TwellConfig config;
  int ell_width = 0;
  std::int64_t hybrid_tail_rows = 0;        // rows with nnz > E
  std::vector<std::int64_t> row_nnz;        // [M]
  std::vector<std::int64_t> neuron_fires;   // [N]
  std::int64_t dead_neurons = 0;            // never fired in these rows
  double top1pct_share = 0;                 // share of activations held by the top 1% of neurons
  std::int64_t p50 = 0, p90 = 0, p99 = 0, min_row = 0;
  std::vector<std::pair<std::string, std::int64_t>> histogram;  // row-nnz buckets: "0", "1", "2-3", ...

  nlohmann::json to_json() const;
};
ActivationStats activation_stats(const TwellMatrix& g, int ell_width);
void print_activation_stats(const ActivationStats& s, std::FILE* out);

// ---- timing and misc ----

double now_seconds();
double median(std::vector<double> v);
std::string git_commit();
std::string cpu_name();
std::string iso_time_utc();
int host_threads();
// Prints "twell: <message>" on stderr (progress and notes), flushed.
void note(const std::string& message);
// Writes `text` to `path` through a temporary file beside it and a rename: a reader never sees a
// half-written file, and a failed write leaves the old one.
void write_text_file(const std::string& path, const std::string& text);
void write_json_file(const std::string& path, const nlohmann::json& j);  // through write_text_file
// The whole file; `flag` names the option in the error.
std::string read_text_file(const std::string& path, const char* flag);
std::string shape_string(const std::vector<std::int64_t>& shape);

}  // namespace twell::cli
