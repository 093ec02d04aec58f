// twell_bench_cuda: the lab's layer sweep. Times the CUDA FFN paths, and the kernel variants and
// thresholds that lost or are kept under watch, against the dense cuBLASLt FFN in one process on the
// same inputs, at the sweep's points — named cases of the shared table (bench/ffn/ffn_cases.hpp,
// ffn_sweep_cases: the benchmark generator, twell::generate_ffn, DESIGN §7) — and checks every point
// against the float64 oracle on sampled rows. Prints a table and writes JSON (--json PATH). A user's
// question "how fast is the layer here" is `twell bench ffn --cases sweep[-quick] --mode perf`.
//
//   twell_bench_cuda [--quick] [--no-train | --train-only] [--json out.json] [--reps 20] [--warmup 5]
//
// Per point: gate = gate GEMM + TwELL packing; gemm = the cuBLASLt GEMM of the gate's shape alone;
// rest = the sparse remainder (fused up+down, or sparse down); sparse = gate + rest (forced);
// auto = the dispatched path (includes the host read of the count); dense = cuBLASLt FFN.
// Times are medians over reps of CUDA-event intervals.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/common/check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/ffn_context.hpp"
#include "cuda/ops/gemv.hpp"
#include "bench_train.hpp"
#include "bench_util.hpp"
#include "ffn_cases.hpp"
#include "twell/cpu/reference.hpp"
#include "twell/sparsity_gen.hpp"

using namespace twell;
using namespace twell::cuda;
using namespace twell::cuda::bench;

namespace {

double sampled_error(const std::vector<float>& y, CMatrixF x, const FfnWeights& w, bool round_act,
                     const std::vector<std::int64_t>& rows) {
  ref::Options o;
  o.round_activation_bf16 = round_act;
  const auto r = ref::ffn_forward(x, w, rows, o);
  const std::int64_t k = w.hidden();
  double worst = 0;
  for (std::size_t i = 0; i < rows.size(); ++i)
    worst = std::max(worst, ref::rel_error(y.data() + rows[i] * k, r.data() + static_cast<std::int64_t>(i) * k, k));
  return worst;
}

// The `count` rows with the most non-zeros in ctx's last TwELL (true counts, from the count words).
std::vector<std::int64_t> heaviest_rows(const FfnContext& ctx, std::int64_t m, std::int64_t count) {
  const std::int64_t S = ctx.words_per_tile(), tiles = ctx.sparse_tiles(m);
  std::vector<std::uint32_t> words(static_cast<std::size_t>(m * tiles * S));
  TWELL_CUDA_CHECK(cudaMemcpy(words.data(), ctx.twell_words(), words.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<std::pair<std::uint64_t, std::int64_t>> c(static_cast<std::size_t>(m));
  for (std::int64_t r = 0; r < m; ++r) {
    std::uint64_t n = 0;
    for (std::int64_t t = 0; t < tiles; ++t) n += words[static_cast<std::size_t>((r * tiles + t) * S)];
    c[static_cast<std::size_t>(r)] = {n, r};
  }
  const auto top = static_cast<std::ptrdiff_t>(std::min(count, m));
  std::partial_sort(c.begin(), c.begin() + top, c.end(), std::greater<>());
  std::vector<std::int64_t> rows;
  for (std::ptrdiff_t i = 0; i < top; ++i) rows.push_back(c[static_cast<std::size_t>(i)].second);
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, train = true, infer = true;
  std::string json_path;
  int reps = 20, warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--no-train") train = false;
    else if (a == "--train-only") infer = false;
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc) warmup = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: twell_bench_cuda [--quick] [--no-train | --train-only] [--json PATH] [--reps N] [--warmup N]\n");
      return 2;
    }
  }
  try {
    const DeviceInfo dev = query_device();
    if (!dev.available) {
      std::fprintf(stderr, "twell_bench_cuda: no CUDA device (%s)\n", dev.reason.c_str());
      return 1;
    }
    cudaStream_t s;
    TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // Measured ceilings: device-to-device copy bandwidth (bytes read + written).
    double copy_tbs = 0;
    {
      const std::size_t bytes = std::size_t{1} << 30;
      DeviceBuffer<unsigned char> a(bytes), b(bytes);
      TWELL_CUDA_CHECK(cudaMemsetAsync(a.get(), 1, bytes, s));
      const double ms = median_ms(2, 10, s, [&] { TWELL_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s)); });
      copy_tbs = 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e12;
    }

    const std::int64_t K = 2048, N = 5632;
    std::vector<test::SweepCase> pts;
    for (const test::SweepCase& c : test::ffn_sweep_cases())
      if (c.quick || !quick) {
        TWELL_CHECK(c.f.k == K && c.f.n == N, ErrorCode::internal, "sweep case {} is not the 2B shape", c.f.name);
        pts.push_back(c);
      }
    if (!infer) pts.clear();

    std::printf("device %s, %d SMs, L2 %lld MB; D2D copy %.2f TB/s; K=%lld N=%lld; commit %s\n", dev.name.c_str(),
                dev.sm_count, static_cast<long long>(dev.l2_bytes >> 20), copy_tbs, static_cast<long long>(K),
                static_cast<long long>(N), git_commit().c_str());
    nlohmann::json out;
    out["device"] = dev.name;
    out["sm_count"] = dev.sm_count;
    out["l2_bytes"] = dev.l2_bytes;
    out["copy_tb_s"] = copy_tbs;
    out["commit"] = git_commit();
    {
      std::time_t now = std::time(nullptr);
      char buf[64];
      std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
      out["date"] = buf;
    }
    out["k"] = K;
    out["n"] = N;
    out["reps"] = reps;
    out["points"] = nlohmann::json::array();

    std::vector<std::string> lines;
    char hdr[512];
    std::snprintf(hdr, sizeof hdr, "%7s %-8s %6s | %7s %7s %7s %7s %7s %7s | %7s %7s %7s %7s | %6s %6s | %8s %8s | %6s %6s | %s", "M",
                  "mode", "nnz%", "gemm", "gate", "rest", "rest_v0", "rest_v1", "rest_v2", "sparse", "auto", "dense", "TF/s", "xsprs", "xauto", "err_sp",
                  "err_dn", "ovf_t", "ovf_r", "path");
    lines.push_back(hdr);
    for (const test::SweepCase& sc : pts) {
      const test::FfnCase& pt = sc.f;
      const test::FfnData f = test::make_ffn(pt);
      const std::vector<float>& x = f.x;
      const FfnWeights w = f.weights();
      const CMatrixF xv(x.data(), pt.m, K);

      ContextOptions copt;
      copt.autotune_gemm = true;
      FfnContext ctx(copt);
      ctx.upload_weights(w, s);
      std::vector<std::uint16_t> xb(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) xb[i] = to_bf16(x[i]).bits;
      DeviceBuffer<__nv_bfloat16> dx(xb.size()), y_sp(xb.size()), y_dn(xb.size()), y_auto(xb.size());
      TWELL_CUDA_CHECK(cudaMemcpy(dx.get(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
      // The hot-neuron split as the first sparse or automatic call would set it up (on this batch:
      // neuron popularity is a property of the weights), before anything is timed.
      ctx.calibrate_if_due(dx.get(), pt.m, s);
      for (auto* b : {&y_sp, &y_dn, &y_auto}) TWELL_CUDA_CHECK(cudaMemset(b->get(), 0xff, b->bytes()));  // NaN poison

      const std::int64_t m = pt.m;
      // A context's whole sparse path (gate GEMM + packing, then the remainder) into y.
      auto sparse_path = [&](FfnContext& c, __nv_bfloat16* y) {
        c.gate_twell(dx.get(), m, s);
        c.sparse_rest(dx.get(), m, y, s);
      };
      // A fresh context of this point's weights, with copt changed by `set` (diagnostics).
      auto variant = [&](auto&& set) {
        ContextOptions o = copt;
        set(o);
        auto c = std::make_unique<FfnContext>(o);
        c->upload_weights(w, s);
        c->calibrate_if_due(dx.get(), m, s);  // the same hot neurons as ctx (unless the variant turns them off)
        return c;
      };
      double t_dense = median_ms(warmup, reps, s, [&] { ctx.dense_forward(dx.get(), m, y_dn.get(), s); });
      const double t_gemm = median_ms(warmup, reps, s, [&] { ctx.dense_gate_gemm(dx.get(), m, s); });
      // Gate and remainder right after the dense timings: this read 0.03–0.1 ms slower per part than
      // the same kernels later in the point (0e1bd66, 4011fd1), so it is a diagnostic only
      // (gate_twell_early_ms); the table's gate and rest columns are timed below, alternately.
      const double t_gate_early = median_ms(warmup, reps, s, [&] { ctx.gate_twell(dx.get(), m, s); });
      // The GEMM the sparse path runs (ReLU epilogue, into the gate buffer), without the packing.
      const double t_gemm_relu = median_ms(warmup, reps, s, [&] { ctx.gate_gemm(dx.get(), m, s); });
      nlohmann::json gate_chunks = nlohmann::json::object();  // gate_twell in row chunks, packing overlapped
      if (m >= 16384)
        for (int ch : {1, 2, 4, 8}) {
          ContextOptions co = copt;
          co.gate_chunks = ch;
          co.gate_sm90 = false;  // the cuBLASLt gate + twell_pack (chunk count 1: the path the sm90 gate replaced)
          FfnContext cctx(co);
          cctx.upload_weights(w, s);
          gate_chunks[std::to_string(ch)] = median_ms(warmup, reps, s, [&] { cctx.gate_twell(dx.get(), m, s); });
          if (ch == 2 && pt.gated && pt.density <= 0.01)
            std::printf("          plans of a fresh 2-chunk context:\n%s", cctx.gemm().describe_plans().c_str());
        }
      nlohmann::json gate_clusters = nlohmann::json::object();  // the sm90 gate by cluster size (W multicast)
      if (m >= 16384)
        for (int cl : {1, 2, 4}) {
          ContextOptions co = copt;
          co.gate_sm90 = true;
          co.gate_sm90_cluster = cl;
          FfnContext cctx(co);
          if (!cctx.gate_sm90_active()) break;  // not a compute-capability-9.0 GPU (or no sm_90a code)
          cctx.upload_weights(w, s);
          gate_clusters[std::to_string(cl)] = median_ms(warmup, reps, s, [&] { cctx.gate_twell(dx.get(), m, s); });
        }
      // The fused kernel's variants, each timed alternately with this context's remainder (the
      // default variant): [variant's time, default's time in the same reps].
      nlohmann::json variants = nlohmann::json::object(), variants_alt = nlohmann::json::object();
      ctx.gate_twell(dx.get(), m, s);
      const int default_variant = m < copt.updown_occupancy_min_rows
                                      ? (pt.gated ? 1 : 0)  // what variants 3 and 4 run as at this M
                                      : (pt.gated ? copt.updown_variant : copt.updown_variant_nongated);
      for (int v = 0; v <= 4; ++v) {
        if (v == default_variant) continue;
        ContextOptions vo = copt;
        vo.updown_variant = vo.updown_variant_nongated = v;
        vo.updown_occupancy_min_rows = 0;
        FfnContext vctx(vo);
        vctx.upload_weights(w, s);
        vctx.calibrate_if_due(dx.get(), m, s);
        vctx.gate_twell(dx.get(), m, s);
        double tv = 0, td = 0;
        std::tie(tv, td) = alternating_medians_ms(
            warmup, reps, s, [&] { vctx.sparse_rest(dx.get(), m, y_sp.get(), s); },
            [&] { ctx.sparse_rest(dx.get(), m, y_sp.get(), s); });
        variants[std::to_string(v)] = tv;
        variants_alt[std::to_string(v)] = {tv, td};
      }
      // The sparse path's two parts alternately (gate, then remainder: the order the path runs them).
      double t_gate = 0, t_rest = 0;
      std::tie(t_gate, t_rest) = alternating_medians_ms(
          warmup, reps, s, [&] { ctx.gate_twell(dx.get(), m, s); }, [&] { ctx.sparse_rest(dx.get(), m, y_sp.get(), s); });
      const double t_sparse = median_ms(warmup, reps, s, [&] { sparse_path(ctx, y_sp.get()); });
      // Automatic and dense timed alternately (rep by rep), so that clock drift over the point hits
      // both alike; the dense time reported is this one (t_dense above warms the plans up).
      ForwardResult fr;
      double t_auto = 0, t_dense_alt = 0;
      std::tie(t_dense_alt, t_auto) = alternating_medians_ms(
          warmup, reps, s, [&] { ctx.dense_forward(dx.get(), m, y_dn.get(), s); },
          [&] { fr = ctx.forward(dx.get(), m, y_auto.get(), Path::automatic, s); });
      // Diagnostics: forced sparse vs automatic alternately, and automatic deciding afresh every
      // call (sticky_dispatch off: gate GEMM, sampled count, host wait).
      double t_sparse_alt = 0, t_auto_alt = 0, t_auto_fresh = 0;
      {
        std::tie(t_sparse_alt, t_auto_alt) = alternating_medians_ms(
            warmup, reps, s,
            [&] { sparse_path(ctx, y_sp.get()); },
            [&] { ctx.forward(dx.get(), m, y_auto.get(), Path::automatic, s); });
        ContextOptions fo = copt;
        fo.sticky_dispatch = false;
        FfnContext fctx(fo);
        fctx.upload_weights(w, s);
        t_auto_fresh = median_ms(warmup, reps, s, [&] { fctx.forward(dx.get(), m, y_auto.get(), Path::automatic, s); });
      }
      t_dense = t_dense_alt;
      // Diagnostic: dense rows (ContextOptions::dense_rows_density) at other thresholds and off,
      // each whole sparse path alternating with this context's (default threshold); and how many
      // rows this context ran dense.
      // A fresh context with copt changed by `set`, and this point's context, running `run`
      // alternately: {its median, ctx's median}.
      auto against_ctx = [&](auto&& set, auto&& run) {
        const auto c = variant(set);
        const auto [ta, tb] = alternating_medians_ms(warmup, reps, s, [&] { run(*c); }, [&] { run(ctx); });
        return nlohmann::json::array({ta, tb});
      };
      nlohmann::json dense_rows_alt = nlohmann::json::object();
      if (m >= 4096)
        for (double thr : {0.0, 0.01, 0.015, 0.03})
          dense_rows_alt[fmt::format("{:.3f}", thr)] = against_ctx(
              [&](ContextOptions& o) { o.dense_rows_density = thr; }, [&](FfnContext& c) { sparse_path(c, y_sp.get()); });
      sparse_path(ctx, y_sp.get());
      const FfnContext::DenseRowsInfo dense_rows = ctx.read_dense_rows(s);
      // Hot neurons (ContextOptions::hot_neurons_*) off against this context's, alternately: the
      // whole sparse path and automatic; and the gate + TwELL over every neuron (issue 3's gate
      // target compares that with the GEMM alone), whose counters give the table's density.
      nlohmann::json hot_sparse_alt, hot_auto_alt, hot_overlap_alt, hot_product_alt;
      nlohmann::json hot_thresholds = nlohmann::json::object();
      double t_gate_all = 0, t_gemm_alt = 0;
      TwellCounters cnt_all{};
      {
        const auto off = [](ContextOptions& o) { o.hot_neurons_auto = false; };
        if (ctx.sparse_n(m) < ctx.n()) {
          hot_sparse_alt = against_ctx(off, [&](FfnContext& c) { sparse_path(c, y_sp.get()); });
          hot_overlap_alt = against_ctx([](ContextOptions& o) { o.hot_overlap = false; },
                                        [&](FfnContext& c) { sparse_path(c, y_sp.get()); });
          if (pt.gated && copt.hot_product_sm90 && ctx.gate_sm90_active())  // the hot [g | u] by cuBLASLt + elementwise
            hot_product_alt = against_ctx([](ContextOptions& o) { o.hot_product_sm90 = false; },
                                          [&](FfnContext& c) { sparse_path(c, y_sp.get()); });
          hot_auto_alt = against_ctx(off, [&](FfnContext& c) { c.forward(dx.get(), m, y_auto.get(), Path::automatic, s); });
        }
        // Other thresholds against the default, whole sparse path alternately.
        if (m >= 16384)
          for (double thr : {0.008, 0.016, 0.024})
            hot_thresholds[fmt::format("{:.3f}", thr)] = against_ctx(
                [&](ContextOptions& o) { o.hot_neurons_density = o.hot_neurons_density_nongated = thr; },
                [&](FfnContext& c) { sparse_path(c, y_sp.get()); });
        const auto all = variant(off);
        // Issue 3's gate target: alternating with the GEMM alone (the same N columns), rep by rep,
        // so that clock and power drift weigh on both alike; t_gemm, timed early in the point
        // right after the dense FFN, read up to 10 % slower than the GEMM timed here (c0b0847).
        std::tie(t_gemm_alt, t_gate_all) = alternating_medians_ms(
            warmup, reps, s, [&] { ctx.dense_gate_gemm(dx.get(), m, s); }, [&] { all->gate_twell(dx.get(), m, s); });
        cnt_all = all->read_counters(s);
      }
      // The sm90 gate's heavy-row warp pass off against on (the default), alternately: the gate
      // + TwELL over the sparse path's columns, and the whole sparse path. Up to M = 16384 (at
      // 131072 the four pairs alone take ≈ 1 minute, and the full sweep ran past its time limit).
      nlohmann::json heavy_gate_alt, heavy_sparse_alt, masks_gate_alt, masks_sparse_alt;
      const bool gate_ab = ctx.gate_sm90_active() && m <= 16384;
      if (gate_ab && copt.gate_sm90_heavy_rows) {
        const auto lane_rows = [](ContextOptions& o) { o.gate_sm90_heavy_rows = false; };
        heavy_gate_alt = against_ctx(lane_rows, [&](FfnContext& c) { c.gate_twell(dx.get(), m, s); });
        heavy_sparse_alt = against_ctx(lane_rows, [&](FfnContext& c) { sparse_path(c, y_sp.get()); });
      }
      // The same for the consumers' word masks (off: the packers scan the staged rows).
      if (gate_ab && copt.gate_sm90_word_masks) {
        const auto scan = [](ContextOptions& o) { o.gate_sm90_word_masks = false; };
        masks_gate_alt = against_ctx(scan, [&](FfnContext& c) { c.gate_twell(dx.get(), m, s); });
        masks_sparse_alt = against_ctx(scan, [&](FfnContext& c) { sparse_path(c, y_sp.get()); });
      }
      sparse_path(ctx, y_sp.get());
      // The decode kernel beyond the default decode_max_rows (where automatic runs dense today).
      double t_decode_wide = 0;
      if (m > copt.decode_max_rows && m <= 1024) {
        ContextOptions dop = copt;
        dop.decode_max_rows = 1024;
        dop.decode_max_density = dop.decode_token_max_density = 1.0;
        FfnContext dctx(dop);
        dctx.upload_weights(w, s);
        t_decode_wide =
            median_ms(warmup, reps, s, [&] { dctx.forward(dx.get(), m, y_auto.get(), Path::automatic, s); });
      }
      // Decode sizes: the decode path with its gate as the GEMV kernel vs as the cuBLASLt ReLU GEMM,
      // alternately (both forced onto the decode kernel).
      double t_dec_gemv = 0, t_dec_lt = 0;
      if (m <= copt.decode_max_rows) {
        const auto gemv = variant([](ContextOptions& o) {
          o.decode_max_density = o.decode_token_max_density = 1.0;
          o.decode_gemv = true;
          o.decode_gemv_max_rows = kGemvMaxRows;
        });
        const auto lt = variant([](ContextOptions& o) {
          o.decode_max_density = o.decode_token_max_density = 1.0;
          o.decode_gemv = false;
        });
        std::tie(t_dec_gemv, t_dec_lt) = alternating_medians_ms(
            warmup, reps, s, [&] { gemv->forward(dx.get(), m, y_auto.get(), Path::automatic, s); },
            [&] { lt->forward(dx.get(), m, y_auto.get(), Path::automatic, s); });
      }
      // The same gate+pack again at the end of the point (compare with t_gate_early and t_gate).
      const double t_gate_late = median_ms(warmup, reps, s, [&] { ctx.gate_twell(dx.get(), m, s); });
      if (m >= 16384 && pt.gated && pt.density <= 0.01)
        std::printf("          gate+pack timed early / in the table / again at the end: %.3f / %.3f / %.3f ms; plans of this context:\n%s",
                    t_gate_early, t_gate, t_gate_late,
                    ctx.gemm().describe_plans().c_str());
      ctx.gate_twell(dx.get(), m, s);  // exact counts, whichever remainder dispatch chose
      const TwellCounters cnt = ctx.read_counters(s);

      std::vector<std::int64_t> rows;
      for (std::int64_t i = 0; i < std::min<std::int64_t>(m, 16); ++i) rows.push_back(i * m / std::min<std::int64_t>(m, 16));
      rows.back() = m - 1;
      for (std::int64_t r : heaviest_rows(ctx, m, 4)) rows.push_back(r);  // the rows dense rows take first
      std::sort(rows.begin(), rows.end());
      rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
      const double err_sp = sampled_error(download(y_sp.get(), xb.size()), xv, w, true, rows);
      const double err_dn = sampled_error(download(y_dn.get(), xb.size()), xv, w, false, rows);
      const double err_auto = sampled_error(download(y_auto.get(), xb.size()), xv, w, fr.sparse, rows);

      // Over every neuron (cnt: the cold neurons only when hot ones are split off).
      const double density = static_cast<double>(cnt_all.nnz) / (static_cast<double>(m) * static_cast<double>(N));
      const double cold_density = static_cast<double>(cnt.nnz) / (static_cast<double>(m) * static_cast<double>(ctx.sparse_n(m)));
      const double dense_flops = (pt.gated ? 6.0 : 4.0) * static_cast<double>(m) * K * N;
      const double tflops = dense_flops / (t_dense * 1e-3) / 1e12;
      const double gemm_tflops = 2.0 * static_cast<double>(m) * K * N / (t_gemm_alt * 1e-3) / 1e12;
      variants[std::to_string(default_variant)] = t_rest;  // rest_v0..v2: the default's column is t_rest
      char line[512];
      std::snprintf(line, sizeof line,
                    "%7lld %-8s %6.3f | %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f | %7.3f %7.3f %7.3f %7.0f | %6.2f %6.2f | %8.1e %8.1e | %6llu %6llu | %s",
                    static_cast<long long>(m), sc.mode.c_str(), 100 * density, t_gemm_alt, t_gate, t_rest,
                    variants["0"].get<double>(), variants["1"].get<double>(), variants["2"].get<double>(), t_sparse, t_auto,
                    t_dense, tflops, t_dense / t_sparse, t_dense / t_auto, std::max(err_sp, err_auto), err_dn,
                    static_cast<unsigned long long>(cnt_all.overflow_tiles), static_cast<unsigned long long>(cnt_all.overflow_rows),
                    fr.path().c_str());
      std::printf("%s\n", line);
      if (!gate_chunks.empty()) {
        std::printf("          cublasLt gate + twell_pack (ms) by row chunks (packing overlapped with the next chunk's GEMM):");
        for (const auto& [ch, ms] : gate_chunks.items()) std::printf(" %s: %.3f;", ch.c_str(), ms.get<double>());
        std::printf(" (GEMM alone %.3f early in the point, %.3f alternating with gate+TwELL; with the ReLU epilogue %.3f)\n",
                    t_gemm, t_gemm_alt, t_gemm_relu);
        std::printf("          gate_twell as run (%s, over %lld of %lld neurons): %.3f ms\n",
                    ctx.gate_sm90_active() ? "sm90 gate GEMM with TwELL epilogue" : "cublasLt gate + twell_pack",
                    static_cast<long long>(ctx.sparse_n(m)), static_cast<long long>(N), t_gate);
        if (!gate_clusters.empty()) {
          std::printf("          sm90 gate by cluster size (W multicast; x the GEMM timed alternately with gate+TwELL):");
          for (const auto& [cl, ms] : gate_clusters.items())
            std::printf(" %s: %.3f (%.3fx);", cl.c_str(), ms.get<double>(), ms.get<double>() / t_gemm_alt);
          std::printf("\n");
        }
      }
      std::printf("          remainder variant vs the default (variant %d), alternating:", default_variant);
      for (const auto& [v, t] : variants_alt.items()) std::printf(" v%s %.3f / %.3f;", v.c_str(), t[0].get<double>(), t[1].get<double>());
      std::printf("\n");
      std::printf("          alternating sparse / auto: %.3f / %.3f ms; auto deciding every call (not sticky): %.3f ms\n",
                  t_sparse_alt, t_auto_alt, t_auto_fresh);
      if (!dense_rows_alt.empty()) {
        std::printf("          dense rows: %llu of %llu rows over %.1f %% ran dense (capacity %lld); other thresholds vs %.3f, alternating:",
                    static_cast<unsigned long long>(dense_rows.dense), static_cast<unsigned long long>(dense_rows.hot),
                    100 * copt.dense_rows_density, static_cast<long long>(dense_rows.capacity), copt.dense_rows_density);
        for (const auto& [thr, t] : dense_rows_alt.items())
          std::printf(" %s %.3f / %.3f;", thr.c_str(), t[0].get<double>(), t[1].get<double>());
        std::printf("\n");
      }
      std::printf("          hot neurons: %lld of %lld dense (cold density %.3f %%); gate+TwELL of every neuron %.3f ms = %.3fx the GEMM "
                  "(%.3f ms, alternating)",
                  static_cast<long long>(ctx.n() - ctx.sparse_n(m)), static_cast<long long>(ctx.n()), 100 * cold_density,
                  t_gate_all, t_gate_all / t_gemm_alt, t_gemm_alt);
      if (!hot_sparse_alt.is_null())
        std::printf("; off / on, alternating: sparse %.3f / %.3f ms, auto %.3f / %.3f ms", hot_sparse_alt[0].get<double>(),
                    hot_sparse_alt[1].get<double>(), hot_auto_alt[0].get<double>(), hot_auto_alt[1].get<double>());
      if (!hot_overlap_alt.is_null())
        std::printf("; one stream / overlapped, alternating: sparse %.3f / %.3f ms", hot_overlap_alt[0].get<double>(),
                    hot_overlap_alt[1].get<double>());
      if (!hot_product_alt.is_null())
        std::printf("; hot product by cuBLASLt + elementwise / sm90 kernel (default), alternating: "
                    "sparse %.3f / %.3f ms",
                    hot_product_alt[0].get<double>(), hot_product_alt[1].get<double>());
      if (!heavy_gate_alt.is_null())
        std::printf("; heavy rows by lane / by warp (default), alternating: gate %.3f / %.3f ms, sparse %.3f / %.3f ms",
                    heavy_gate_alt[0].get<double>(), heavy_gate_alt[1].get<double>(), heavy_sparse_alt[0].get<double>(),
                    heavy_sparse_alt[1].get<double>());
      if (!masks_gate_alt.is_null())
        std::printf("; word masks off / on (default), alternating: gate %.3f / %.3f ms, sparse %.3f / %.3f ms",
                    masks_gate_alt[0].get<double>(), masks_gate_alt[1].get<double>(), masks_sparse_alt[0].get<double>(),
                    masks_sparse_alt[1].get<double>());
      if (!hot_thresholds.empty()) {
        std::printf("; other thresholds / default, alternating:");
        for (const auto& [thr, t] : hot_thresholds.items()) std::printf(" %s %.3f / %.3f;", thr.c_str(), t[0].get<double>(), t[1].get<double>());
      }
      std::printf("\n");
      if (t_decode_wide > 0) std::printf("          decode kernel at this M: %.3f ms\n", t_decode_wide);
      if (t_dec_gemv > 0)
        std::printf("          decode path, gate by GEMV kernel / by cuBLASLt, alternating: %.3f / %.3f ms\n", t_dec_gemv, t_dec_lt);
      std::fflush(stdout);
      lines.push_back(line);
      out["points"].push_back({{"m", m},
                               {"case", pt.name},
                               {"mode", sc.mode},
                               {"neuron_skew", pt.neuron_skew},
                               {"gated", pt.gated},
                               {"target_density", pt.density},
                               {"hot_rows", pt.hot_rows},
                               {"hot_density", pt.hot_density},
                               {"density", density},
                               {"nnz", cnt_all.nnz},
                               {"overflow_tiles", cnt_all.overflow_tiles},
                               {"overflow_rows", cnt_all.overflow_rows},
                               {"hot_neurons", ctx.n() - ctx.sparse_n(m)},
                               {"cold_density", cold_density},
                               {"gate_twell_all_neurons_ms", t_gate_all},
                               {"gate_heavy_rows_off_on_alternating_ms", heavy_gate_alt},
                               {"sparse_heavy_rows_off_on_alternating_ms", heavy_sparse_alt},
                               {"gate_word_masks_off_on_alternating_ms", masks_gate_alt},
                               {"sparse_word_masks_off_on_alternating_ms", masks_sparse_alt},
                               {"gate_gemm_alternating_ms", t_gemm_alt},
                               {"hot_neurons_off_on_sparse_alternating_ms", hot_sparse_alt},
                               {"hot_overlap_off_on_sparse_alternating_ms", hot_overlap_alt},
                               {"hot_product_lt_sm90_sparse_alternating_ms", hot_product_alt},
                               {"hot_neurons_off_on_auto_alternating_ms", hot_auto_alt},
                               {"hot_neurons_threshold_vs_default_alternating_ms", hot_thresholds},
                               {"gate_gemm_ms", t_gemm},
                               {"gate_gemm_tflops", gemm_tflops},
                               {"gate_twell_ms", t_gate},
                               {"gate_twell_sm90", ctx.gate_sm90_active()},
                               {"gate_twell_ms_by_cluster", gate_clusters},
                               {"gate_gemm_relu_ms", t_gemm_relu},
                               {"gate_twell_late_ms", t_gate_late},
                               {"gate_twell_early_ms", t_gate_early},
                               {"sparse_rest_ms", t_rest},
                               {"sparse_rest_variant_ms", variants},
                               {"sparse_rest_variant_vs_default_alternating_ms", variants_alt},
                               {"gate_twell_ms_by_chunks", gate_chunks},
                               {"sparse_auto_alternating_ms", {t_sparse_alt, t_auto_alt}},
                               {"auto_not_sticky_ms", t_auto_fresh},
                               {"decode_kernel_ms", t_decode_wide},
                               {"decode_gemv_vs_cublaslt_alternating_ms", {t_dec_gemv, t_dec_lt}},
                               {"dense_rows_threshold_vs_default_alternating_ms", dense_rows_alt},
                               {"dense_rows", {{"hot", dense_rows.hot}, {"dense", dense_rows.dense},
                                               {"capacity", dense_rows.capacity}, {"threshold", copt.dense_rows_density}}},
                               {"sparse_total_ms", t_sparse},
                               {"auto_total_ms", t_auto},
                               {"auto_path", fr.path()},
                               {"dense_ms", t_dense},
                               {"dense_tflops", tflops},
                               {"speedup_sparse", t_dense / t_sparse},
                               {"speedup_auto", t_dense / t_auto},
                               {"err_sparse", err_sp},
                               {"err_auto", err_auto},
                               {"err_dense", err_dn},
                               {"check_rows", rows.size()}});
    }
    if (train) {
      std::printf("\n");
      lines.push_back("");
      run_train_sweep(quick, warmup, reps, s, out, lines);
    }
    std::printf("\n== summary\n");
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
    if (!json_path.empty()) {
      std::ofstream f(json_path);
      f << out.dump(2) << "\n";
    }
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twell_bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
