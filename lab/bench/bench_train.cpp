// Training sweep of twell_bench_cuda: one FFN training step (forward + backward) through the
// sparse CSR path and through the dense cuBLASLt path, same process, same inputs. Per point:
// forward and forward+backward times of both, the dispatched step, bytes saved for backward and
// device memory held, and y / dx on sampled rows against the float64 oracle.
#include "bench_train.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench_util.hpp"
#include "cuda/common/device_buffer.hpp"
#include "ffn_cases.hpp"
#include "cuda/train/train_context.hpp"
#include "twell/cpu/reference.hpp"
#include "twell/sparsity_gen.hpp"

namespace twell::cuda::bench {
namespace {

DeviceBuffer<__nv_bfloat16> upload(const std::vector<float>& v) {
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = to_bf16(v[i]).bits;
  DeviceBuffer<__nv_bfloat16> d(b.size());
  TWELL_CUDA_CHECK(cudaMemcpy(d.get(), b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

// Worst per-row relative error of y and dx on `rows` against ref::ffn_train of those rows as a
// sub-batch (both are row-local; l1_coeff is rescaled so c = l1_coeff / M matches).
double sampled_train_error(const std::vector<float>& y, const std::vector<float>& dx, const std::vector<float>& x,
                           const std::vector<float>& dy, const FfnWeights& w, std::int64_t m, double l1_coeff,
                           const std::vector<std::int64_t>& rows) {
  const std::int64_t K = w.hidden(), S = static_cast<std::int64_t>(rows.size());
  std::vector<float> xs(static_cast<std::size_t>(S * K)), dys(static_cast<std::size_t>(S * K));
  for (std::int64_t i = 0; i < S; ++i) {
    std::copy_n(x.data() + rows[static_cast<std::size_t>(i)] * K, K, xs.data() + i * K);
    std::copy_n(dy.data() + rows[static_cast<std::size_t>(i)] * K, K, dys.data() + i * K);
  }
  const ref::TrainResult r = ref::ffn_train(CMatrixF(xs.data(), S, K), CMatrixF(dys.data(), S, K), w,
                                            l1_coeff * static_cast<double>(S) / static_cast<double>(m));
  double worst = 0;
  for (std::int64_t i = 0; i < S; ++i) {
    const std::int64_t row = rows[static_cast<std::size_t>(i)];
    worst = std::max(worst, ref::rel_error(y.data() + row * K, r.y.data() + i * K, K));
    worst = std::max(worst, ref::rel_error(dx.data() + row * K, r.dx.data() + i * K, K));
  }
  return worst;
}

// Times a training step's phases: a CUDA event after each phase's launches (TrainContext's phase
// observer), then the intervals between them. "start" (a forward's first mark) begins a new list.
class EventPhases : public TrainContext::PhaseObserver {
 public:
  ~EventPhases() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void phase_done(const char* phase, cudaStream_t stream) override {
    if (std::string(phase) == "start") {
      used_ = 0;
      names_.clear();
    }
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      TWELL_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    TWELL_CUDA_CHECK(cudaEventRecord(events_[used_++], stream));
    names_.emplace_back(phase);
  }
  // Synchronises; (phase, ms) since the previous mark, for every phase after "start".
  std::vector<std::pair<std::string, float>> ms() {
    std::vector<std::pair<std::string, float>> out;
    if (used_ < 2) return out;
    TWELL_CUDA_CHECK(cudaEventSynchronize(events_[used_ - 1]));
    for (std::size_t i = 1; i < used_; ++i) {
      float t = 0;
      TWELL_CUDA_CHECK(cudaEventElapsedTime(&t, events_[i - 1], events_[i]));
      out.emplace_back(names_[i], t);
    }
    return out;
  }

 private:
  std::vector<cudaEvent_t> events_;  // a pool, grown as needed
  std::vector<std::string> names_;   // names_[i] ends at events_[i]
  std::size_t used_ = 0;
};

}  // namespace

void run_train_sweep(bool quick, int warmup, int reps, cudaStream_t s, nlohmann::json& out,
                     std::vector<std::string>& lines) {
  const std::int64_t K = 2048, N = 5632;
  std::vector<test::TrainSweepCase> pts;
  for (const test::TrainSweepCase& c : test::ffn_train_sweep_cases())
    if (c.quick || !quick) {
      TWELL_CHECK(c.t.f.k == K && c.t.f.n == N, ErrorCode::internal, "sweep case {} is not the 2B shape", c.t.f.name);
      pts.push_back(c);
    }

  char hdr[512];
  std::snprintf(hdr, sizeof hdr, "%7s %-8s %6s %5s | %7s %7s | %7s %7s %7s | %6s %6s | %8s %8s %6s | %8s %8s | %8s | %s", "M",
                "mode", "nnz%", "hot", "dn_fwd", "dn_step", "sp_fwd", "sp_step", "auto", "xsprs", "xauto", "saved_sp",
                "saved_dn", "ratio", "mem_sp", "mem_dn", "err", "path");
  lines.push_back("training step (forward + backward), times in ms, memory in MB:");
  lines.push_back(hdr);
  std::printf("%s\n%s\n", lines[lines.size() - 2].c_str(), hdr);
  out["train_points"] = nlohmann::json::array();
  for (const test::TrainSweepCase& sc : pts) {
    const test::FfnCase& pt = sc.t.f;
    const double l1_coeff = sc.t.l1_coeff;
    const test::FfnData f = test::make_ffn(pt);
    const std::vector<float>&x = f.x, &dy = f.dy;
    const FfnWeights w = f.weights();
    const std::int64_t m = pt.m;
    auto dev_x = upload(x), dev_dy = upload(dy);
    DeviceBuffer<__nv_bfloat16> dev_y(x.size()), dev_dx(x.size());

    TrainContextOptions copt;
    copt.autotune_gemm = true;
    double dn_fwd, dn_step, sp_fwd, sp_step, auto_step_ms;
    std::size_t saved_dn, mem_dn, saved_sp, mem_sp;
    TrainForwardResult fr_auto, fr_sp;
    nlohmann::json phases = nlohmann::json::object();
    nlohmann::json wg_variants = nlohmann::json::object();  // L2 fraction → sparse step ms
    // Dense and dispatched steps are timed alternately (rep by rep), so that clock and thermal
    // drift over the run affect both alike; the forced sparse step runs in between.
    TrainContext dense(copt), aut(copt);
    dense.upload_weights(w, s);
    aut.upload_weights(w, s);
    dn_fwd = median_ms(warmup, reps, s, [&] { dense.forward(dev_x.get(), m, dev_y.get(), Path::dense, s); });
    {
      TrainContext sparse(copt);
      sparse.upload_weights(w, s);
      sp_fwd = median_ms(warmup, reps, s, [&] { fr_sp = sparse.forward(dev_x.get(), m, dev_y.get(), Path::sparse, s); });
      sp_step = median_ms(warmup, reps, s, [&] {
        sparse.forward(dev_x.get(), m, dev_y.get(), Path::sparse, s);
        sparse.backward(dev_x.get(), dev_dy.get(), m, l1_coeff, dev_dx.get(), s);
      });
      saved_sp = sparse.saved_bytes();
      mem_sp = sparse.device_bytes();
      EventPhases timed;  // one more step, timed per phase (events between launches)
      sparse.set_phase_observer(&timed);
      sparse.forward(dev_x.get(), m, dev_y.get(), Path::sparse, s);
      sparse.backward(dev_x.get(), dev_dy.get(), m, l1_coeff, dev_dx.get(), s);
      sparse.set_phase_observer(nullptr);
      for (const auto& [name, ms] : timed.ms()) phases[name] = ms;
    }
    // One whole sparse training step of context c (forward, then backward), as a callable.
    const auto step = [&](TrainContext& c) {
      return [&] {
        c.forward(dev_x.get(), m, dev_y.get(), Path::sparse, s);
        c.backward(dev_x.get(), dev_dy.get(), m, l1_coeff, dev_dx.get(), s);
      };
    };
    // Weight-gradient passes: the sparse step with other L2 fractions (0 = widest slices, one block) and item runs.
    if (!quick && pt.m >= 16384 && sc.mode == "uni" && pt.density <= 0.01) {
      struct Variant {
        double frac;
        std::int64_t run;
      };
      const double f0 = copt.weight_grad_l2_fraction;  // the default's budget with other runs
      const Variant variants[] = {{0.0, 0}, {1.0, 0}, {f0, 64}, {f0, 256}};
      for (const auto& [frac, run] : variants) {
        TrainContextOptions o = copt;
        o.weight_grad_l2_fraction = frac;
        o.weight_grad_run = run;
        TrainContext v(o);
        v.upload_weights(w, s);
        char key[48];
        std::snprintf(key, sizeof key, "%.1f%s", frac, run > 0 ? ("/run" + std::to_string(run)).c_str() : "");
        wg_variants[key] = median_ms(warmup, reps, s, step(v));
      }
    }
    // A context with copt changed by `set`, its whole sparse step timed alternately with that of
    // `def` (the default options): [variant ms, default ms].
    const auto against_default = [&](TrainContext& def, auto&& set) {
      TrainContextOptions o = copt;
      set(o);
      TrainContext v(o);
      v.upload_weights(w, s);
      const auto [v_ms, d_ms] = host::alternating_medians_ms(warmup, reps, s, step(v), step(def));
      return nlohmann::json::array({v_ms, d_ms});
    };
    nlohmann::json wg_alt = nlohmann::json::object();  // fraction → [variant ms, default ms]
    nlohmann::json gate_alt = nlohmann::json::object();  // gate kind → [variant ms, default ms]
    if (pt.m >= 16384 && pt.density <= 0.015) {
      TrainContext def(copt);
      def.upload_weights(w, s);
      // The weight-gradient passes' L2 budget: 0.7 gives the H100 (50 MB L2) 512-column slices at
      // M = 16384 (0.6 did only the H200, 60 MB); 0.0 is the widest slices in one block of every row.
      for (double frac : {0.7, 0.0}) {
        char key[16];
        std::snprintf(key, sizeof key, "%.1f", frac);
        wg_alt[key] = against_default(def, [&](TrainContextOptions& o) { o.weight_grad_l2_fraction = frac; });
      }
      // The gate: cuBLASLt + ReLU with the CSR built from its bf16 output, against the default
      // (the sm90 gate with the TwELL epilogue, the CSR from its words, where the GPU runs it).
      gate_alt["cublaslt"] = against_default(def, [](TrainContextOptions& o) { o.gate_sm90 = false; });
      // The sm90 gate with every row packed by its own lane (no heavy-row warp pass); and the
      // cuBLASLt gate after steps with dense rows (the hot point), as before the seventeenth session.
      if (copt.gate_sm90) {
        gate_alt["sm90, rows by lane"] = against_default(def, [](TrainContextOptions& o) { o.gate_sm90_heavy_rows = false; });
        if (pt.hot_rows > 0)
          gate_alt["cublaslt after dense rows"] =
              against_default(def, [](TrainContextOptions& o) { o.gate_sm90_dense_rows = false; });
      }
    }
    // Hot neurons: the sparse step without and with the split, timed alternately; and the split at
    // other thresholds than the default.
    nlohmann::json hot_json = nlohmann::json::object();
    if (pt.m >= 16384 && pt.density <= 0.015) {
      TrainContext on(copt);
      on.upload_weights(w, s);
      hot_json["off_on_sparse_alternating_ms"] = against_default(on, [](TrainContextOptions& o) { o.hot_neurons_auto = false; });
      hot_json["hot_neurons_default"] = on.hot_count();
      // dense rows off / on, hot neurons on in both
      hot_json["dense_rows_off_on_sparse_alternating_ms"] =
          against_default(on, [](TrainContextOptions& o) { o.dense_rows_density = 0; });
      for (int mb : {0, 6, 8}) {  // the token-major kernels compiled for mb blocks per SM (0: no bound), against the default
        if (mb == copt.token_min_blocks) continue;
        hot_json["token_min_blocks_vs_default_alternating_ms"][std::to_string(mb)] =
            against_default(on, [&](TrainContextOptions& o) { o.token_min_blocks = mb; });
      }
      if (pt.density >= 0.01) {
        for (double th : {0.008, 0.025}) {
          TrainContextOptions o = copt;
          o.hot_neurons_density = o.hot_neurons_density_nongated = th;
          TrainContext v(o);
          v.upload_weights(w, s);
          const double ms = median_ms(warmup, reps, s, step(v));
          char key[32];
          std::snprintf(key, sizeof key, "%.3f", th);
          hot_json["sparse_step_ms_by_threshold"][key] = {{"ms", ms}, {"hot_neurons", v.hot_count()}};
        }
      }
    }
    const auto dense_step = [&] {
      dense.forward(dev_x.get(), m, dev_y.get(), Path::dense, s);
      dense.backward(dev_x.get(), dev_dy.get(), m, l1_coeff, dev_dx.get(), s);
    };
    const auto auto_step = [&] {
      fr_auto = aut.forward(dev_x.get(), m, dev_y.get(), Path::automatic, s);
      aut.backward(dev_x.get(), dev_dy.get(), m, l1_coeff, dev_dx.get(), s);
    };
    std::tie(dn_step, auto_step_ms) = host::alternating_medians_ms(warmup, reps, s, dense_step, auto_step);
    // The ratios above divide the dense step timed alternately with the dispatched one; for
    // comparison, the dense step on its own and the forced sparse step alternating with the
    // dispatched one (what alternation itself costs each side).
    const double dn_alone = median_ms(warmup, reps, s, dense_step);
    double sp_alt = 0, auto_alt = 0;
    {
      TrainContext sparse(copt);
      sparse.upload_weights(w, s);
      const auto sparse_step = [&] {
        sparse.forward(dev_x.get(), m, dev_y.get(), Path::sparse, s);
        sparse.backward(dev_x.get(), dev_dy.get(), m, l1_coeff, dev_dx.get(), s);
      };
      std::tie(sp_alt, auto_alt) = host::alternating_medians_ms(warmup, reps, s, sparse_step, auto_step);
    }
    saved_dn = dense.saved_bytes();
    mem_dn = dense.device_bytes();
    // Checked run: the dispatched step on poisoned outputs.
    TWELL_CUDA_CHECK(cudaMemset(dev_y.get(), 0xff, dev_y.bytes()));
    TWELL_CUDA_CHECK(cudaMemset(dev_dx.get(), 0xff, dev_dx.bytes()));
    auto_step();
    std::vector<std::int64_t> rows;
    for (std::int64_t i = 0; i < std::min<std::int64_t>(m, 12); ++i) rows.push_back(i * m / std::min<std::int64_t>(m, 12));
    rows.back() = m - 1;
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    const double err = sampled_train_error(download(dev_y.get(), x.size()), download(dev_dx.get(), x.size()), x, dy, w, m,
                                           l1_coeff, rows);
    // Every neuron's density (the dense step counts them all); fr_sp.density is the dispatch's measure.
    const double density = dense.read_scalars(s).l0 / static_cast<double>(N);
    const double mb = 1.0 / (1 << 20);
    char line[512];
    std::snprintf(line, sizeof line,
                  "%7lld %-8s %6.3f %5lld | %7.3f %7.3f | %7.3f %7.3f %7.3f | %6.2f %6.2f | %8.1f %8.1f %5.1f%% | %8.0f %8.0f | %8.1e | %s",
                  static_cast<long long>(m), sc.mode.c_str(), 100 * density, static_cast<long long>(fr_sp.hot_neurons), dn_fwd, dn_step, sp_fwd, sp_step, auto_step_ms,
                  dn_step / sp_step, dn_step / auto_step_ms, static_cast<double>(saved_sp) * mb, static_cast<double>(saved_dn) * mb,
                  100.0 * static_cast<double>(saved_sp) / static_cast<double>(saved_dn), static_cast<double>(mem_sp) * mb,
                  static_cast<double>(mem_dn) * mb, err, fr_auto.path.c_str());
    std::printf("%s\n", line);
    std::string ph = "          sparse phases (ms):";
    for (const auto& [name, ms] : phases.items()) {
      char b[96];
      std::snprintf(b, sizeof b, " %s %.3f;", name.c_str(), ms.get<double>());
      ph += b;
    }
    std::printf("%s\n", ph.c_str());
    std::printf("          timing: dense alone %.3f ms (alternating with auto %.3f); sparse / auto alternating %.3f / %.3f ms\n",
                dn_alone, dn_step, sp_alt, auto_alt);
    if (!hot_json.empty()) {
      std::string v = "          hot neurons: " + hot_json.dump();
      std::printf("%s\n", v.c_str());
    }
    // Pairs timed against the default: "<title> / default (<value>), whole sparse step
    // alternating: key: variant / default; …".
    const auto print_pairs = [](const char* title, const std::string& def, const nlohmann::json& pairs) {
      if (pairs.empty()) return;
      std::string v = std::string("          ") + title + " / default (" + def + "), whole sparse step alternating:";
      for (const auto& [key, t] : pairs.items()) {
        char b[64];
        std::snprintf(b, sizeof b, " %s: %.3f / %.3f;", key.c_str(), t[0].get<double>(), t[1].get<double>());
        v += b;
      }
      std::printf("%s\n", v.c_str());
    };
    print_pairs("weight-gradient L2 fraction", std::to_string(copt.weight_grad_l2_fraction).substr(0, 4), wg_alt);
    print_pairs("gate", copt.gate_sm90 ? "sm90 + TwELL where it runs" : "cublaslt", gate_alt);
    if (!wg_variants.empty()) {
      std::string v = "          sparse step by weight-gradient L2 fraction[/run] (default 0.7, run max(128, nnz/8192), rows read in place):";
      for (const auto& [frac, ms] : wg_variants.items()) {
        char b[64];
        std::snprintf(b, sizeof b, " %s: %.3f;", frac.c_str(), ms.get<double>());
        v += b;
      }
      std::printf("%s\n", v.c_str());
    }
    std::fflush(stdout);
    lines.push_back(line);
    out["train_points"].push_back({{"m", m},
                                   {"case", pt.name},
                                   {"mode", sc.mode},
                                   {"gated", pt.gated},
                                   {"target_density", pt.density},
                                   {"hot_rows", pt.hot_rows},
                                   {"density", density},
                                   {"nnz", static_cast<std::int64_t>(std::llround(density * static_cast<double>(m * N)))},
                                   {"hot_neurons", fr_sp.hot_neurons},
                                   {"dense_rows", fr_sp.dense_rows},
                                   {"cold_nnz", fr_sp.nnz},
                                   {"dispatch_density", fr_sp.density},
                                   {"hot_neuron_variants", hot_json},
                                   {"l1_coeff", l1_coeff},
                                   {"dense_fwd_ms", dn_fwd},
                                   {"dense_step_ms", dn_step},
                                   {"sparse_fwd_ms", sp_fwd},
                                   {"sparse_step_ms", sp_step},
                                   {"auto_step_ms", auto_step_ms},
                                   {"dense_step_alone_ms", dn_alone},
                                   {"sparse_auto_alternating_ms", {sp_alt, auto_alt}},
                                   {"auto_path", fr_auto.path},
                                   {"speedup_sparse", dn_step / sp_step},
                                   {"speedup_auto", dn_step / auto_step_ms},
                                   {"saved_bytes_sparse", saved_sp},
                                   {"saved_bytes_dense", saved_dn},
                                   {"device_bytes_sparse", mem_sp},
                                   {"device_bytes_dense", mem_dn},
                                   {"err_y_dx_sampled", err},
                                   {"sparse_phases_ms", phases},
                                   {"sparse_step_ms_by_wg_l2_fraction", wg_variants},
                                   {"wg_l2_fraction_vs_default_alternating_ms", wg_alt},
                                   {"gate_vs_default_alternating_ms", gate_alt},
                                   {"check_rows", rows.size()}});
  }
}

}  // namespace twell::cuda::bench
