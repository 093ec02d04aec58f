// twell_probe_cudnn_decode: decode attention (one query a row) through cuDNN's fused SDPA over
// twell's paged KV layout, against the library's kernel (cuda::ops::attention, as a decode step runs
// it) on the same caches, at the batches a server runs. Why: at batch 64 and context 512 PyTorch's
// compiled step spends 25.7 µs a layer in cuDNN's flash kernel where twell's grouped kernel takes
// 36.9 (the 2b-gqa, bench/results/model/2026-11-30-h200-2b-gqa-torch-vs-twell-kernels-b64-30728fe.md):
// the largest single gap of the step.
//
// The caches are one pool a layer, [blocks, 16, KV heads · D] bf16 for K and for V (the runtime's
// block layout, kKvBlockRows rows a block); each row's sequence holds `keys` positions in blocks
// scattered over the pool through its block table (a shuffled permutation, as a paged pool hands
// them out). cuDNN reads them through its paged-cache load: containers [blocks, KV heads, 16, D] with
// the layout's strides, page tables [rows, 1, pages, 1], seq_len_q = 1, seq_len_kv = keys, the
// padding mask. Two graphs a shape: the heuristic's first engine, and the first engine left after
// those cuDNN notes as nondeterministic are deselected (a decode step's replays must give the same
// bits). Each side is timed as CUDA-graph replays of `layers` launches over `layers` pools launched
// in turn (together past the L2), and cuDNN also with plain launches.
// Checks on the last layer, every head of the last row: the library within its derived bound
// (probe_decode_attention's), cuDNN against the float64 softmax with its error beside the same
// bound and beside that bound widened by the rounding of the probabilities to bf16 before P·V
// (2⁻⁸ Σ p|v|: flash attention's P·V runs on bf16 tensor cores), which it must meet; 8 more runs of
// each cuDNN graph against its first (the deterministic one must repeat its bits; the heuristic's
// differences are reported); every output finite.
//   twell_probe_cudnn_decode [max GB of caches (default 12)]
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/ops/model_ops.hpp"
#include "probe_check.hpp"
#include "probe_timing.hpp"

#define CUDNN_FRONTEND_SKIP_JSON_LIB 1
#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;
using namespace twell::cuda;
using namespace twell::probe;


namespace {

enum Uid : fe::graph::Tensor_attributes::uid_t { kQ = 1, kK, kV, kO, kSeqQ, kSeqKv, kPageK, kPageV };


// The decode SDPA graph for `rows` rows of one query each over paged caches of `blocks` blocks and
// `pages` pages a row; null with the reason printed where cuDNN refuses it.
// deterministic: engines cuDNN notes as nondeterministic left out (deselect_numeric_notes).
std::shared_ptr<fe::graph::Graph> build(cudnnHandle_t h, int rows, int heads, int kv_heads, int d, std::int64_t blocks,
                                        int pages, bool deterministic, std::int64_t* workspace, std::string* engine) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::int64_t row = static_cast<std::int64_t>(heads + 2 * kv_heads) * d, kv_dim = static_cast<std::int64_t>(kv_heads) * d;
  auto ints = [&](const char* name, Uid uid, std::vector<std::int64_t> dim, std::vector<std::int64_t> stride) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride).set_data_type(
        fe::DataType_t::INT32));
  };
  auto q = g->tensor(fe::graph::Tensor_attributes().set_name("q").set_uid(kQ).set_dim({rows, heads, 1, d}).set_stride(
      {row, d, row, 1}));
  const std::vector<std::int64_t> cdim = {blocks, kv_heads, ops::kKvBlockRows, d},
                                  cstride = {ops::kKvBlockRows * kv_dim, d, kv_dim, 1};
  auto k = g->tensor(fe::graph::Tensor_attributes().set_name("k").set_uid(kK).set_dim(cdim).set_stride(cstride));
  auto v = g->tensor(fe::graph::Tensor_attributes().set_name("v").set_uid(kV).set_dim(cdim).set_stride(cstride));
  auto opts = fe::graph::SDPA_attributes()
                  .set_name("decode")
                  .set_generate_stats(false)
                  .set_attn_scale(1.0f / std::sqrt(static_cast<float>(d)))
                  .set_padding_mask(true)
                  .set_seq_len_q(ints("seq_q", kSeqQ, {rows, 1, 1, 1}, {1, 1, 1, 1}))
                  .set_seq_len_kv(ints("seq_kv", kSeqKv, {rows, 1, 1, 1}, {1, 1, 1, 1}))
                  .set_paged_attention_k_table(ints("page_k", kPageK, {rows, 1, pages, 1}, {pages, pages, 1, 1}))
                  .set_paged_attention_v_table(ints("page_v", kPageV, {rows, 1, pages, 1}, {pages, pages, 1, 1}))
                  .set_paged_attention_max_seq_len_kv(pages * ops::kKvBlockRows);
  auto out = g->sdpa(q, k, v, opts);
  out[0]->set_output(true).set_uid(kO).set_dim({rows, heads, 1, d}).set_stride({heads * d, d, heads * d, 1});
  const auto failed = [&](const char* step, fe::error_t e) {
    if (e.is_good()) return false;
    *engine = std::string("refused at ") + step + ": " + e.get_message();
    return true;
  };
  if (failed("validate", g->validate()) || failed("build_operation_graph", g->build_operation_graph(h)) ||
      failed("create_execution_plans", g->create_execution_plans({fe::HeurMode_t::A})))
    return nullptr;
  if (deterministic) g->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
  if (failed("check_support", g->check_support(h)) || failed("build_plans", g->build_plans(h)) ||
      failed("get_workspace_size", g->get_workspace_size(*workspace)) || failed("get_plan_name", g->get_plan_name(*engine)))
    return nullptr;
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  char* end = nullptr;
  const double max_gb = argc > 1 ? std::strtod(argv[1], &end) : 12.0;
  if (argc > 2 || (argc > 1 && (end == argv[1] || *end != '\0')) || !(max_gb > 0.1 && max_gb < 1e4)) {
    std::fprintf(stderr, "usage: twell_probe_cudnn_decode [max GB of caches (0.1, 1e4), default 12]\n");
    return 2;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  cudnnHandle_t h;
  if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) {
    std::printf("cudnnCreate failed: no cuDNN on this device\n");
    return 1;
  }
  if (cudnnSetStream(h, s) != CUDNN_STATUS_SUCCESS) return 1;
  const double copy = copy_gbps(s);  // bytes read + written a second, as twell bench model reports it
  std::printf("device %s, %d SMs, L2 %.0f MB, cuDNN %zu; copy bandwidth %.0f GB/s\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6, cudnnGetVersion(), copy);
  // A pattern of random bf16 values in [-1, 1), copied over the pools at shifting offsets.
  std::mt19937 rng(7);
  std::vector<unsigned short> pattern(1 << 23);
  for (auto& x : pattern) {
    const float f = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    const __nv_bfloat16 b = __float2bfloat16(f);
    std::memcpy(&x, &b, 2);
  }
  DeviceBuffer<unsigned short> dpattern(pattern.size());
  CK(cudaMemcpy(dpattern.get(), pattern.data(), dpattern.bytes(), cudaMemcpyHostToDevice));
  const auto fill = [&](void* dst, std::size_t elems, std::size_t shift) {
    auto* p = static_cast<unsigned short*>(dst);
    for (std::size_t at = 0; at < elems;) {
      const std::size_t from = (at + shift) % pattern.size(), n = std::min(elems - at, pattern.size() - from);
      CK(cudaMemcpyAsync(p + at, dpattern.get() + from, n * 2, cudaMemcpyDeviceToDevice, s));
      at += n;
    }
  };
  struct Model {
    const char* name;
    int heads, kv_heads, d;
  };
  bool all_ok = true;
  for (const Model md : {Model{"2B (MHA, 32 heads of 64)", 32, 32, 64}, Model{"2b-gqa (32/8 heads of 64)", 32, 8, 64},
                         Model{"7B-GQA (32/8 heads of 128)", 32, 8, 128}}) {
    std::printf("\n%s\n%5s %6s %7s %8s | %9s %7s %7s | %9s %7s %7s %9s %9s | %9s %7s %7s %9s %9s | %s\n", md.name, "rows", "keys",
                "layers", "KV MB", "lib us", "GB/s", "of copy", "cuDNN us", "GB/s", "of copy", "plain us", "lib/cuDNN",
                "det. us", "GB/s", "of copy", "plain us", "lib/det.", "checks (error / bound), engines");
    const std::int64_t kv_dim = static_cast<std::int64_t>(md.kv_heads) * md.d, q_dim = static_cast<std::int64_t>(md.heads) * md.d,
                       row = q_dim + 2 * kv_dim;
    for (const int rows : {8, 32, 64})
      for (const int keys : {145, 513, 2049}) {
        if (keys > ops::attention_max_keys(md.d)) continue;
        const int pages = (keys + ops::kKvBlockRows - 1) / ops::kKvBlockRows;
        const std::int64_t blocks = static_cast<std::int64_t>(rows) * pages;
        const double kv_bytes = 2.0 * 2.0 * rows * keys * kv_dim;  // the K and V rows a launch must read
        const std::int64_t layer_stride = blocks * ops::kKvBlockRows * kv_dim;
        int layers = static_cast<int>(std::ceil(4.0 * prop.l2CacheSize / kv_bytes));
        layers = std::max(1, std::min(layers, static_cast<int>(max_gb * 1e9 / (4.0 * layer_stride))));
        DeviceBuffer<__nv_bfloat16> kc(static_cast<std::size_t>(layers * layer_stride)), vc(kc.size());
        fill(kc.get(), kc.size(), 0);
        fill(vc.get(), vc.size(), 12345);
        // Block tables: a shuffled permutation of the pool's blocks, `pages` a row.
        std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), rng);
        DeviceBuffer<std::int32_t> dtable(table.size()), seq_q(static_cast<std::size_t>(rows)), seq_kv(seq_q.size());
        CK(cudaMemcpyAsync(dtable.get(), table.data(), dtable.bytes(), cudaMemcpyHostToDevice, s));
        const std::vector<std::int32_t> ones(static_cast<std::size_t>(rows), 1), lens(static_cast<std::size_t>(rows), keys);
        CK(cudaMemcpyAsync(seq_q.get(), ones.data(), seq_q.bytes(), cudaMemcpyHostToDevice, s));
        CK(cudaMemcpyAsync(seq_kv.get(), lens.data(), seq_kv.bytes(), cudaMemcpyHostToDevice, s));
        std::vector<ops::RowKv> hrows(static_cast<std::size_t>(rows));
        for (int r = 0; r < rows; ++r) {
          hrows[r].k = kc.get();
          hrows[r].v = vc.get();
          hrows[r].layer_stride = layer_stride;
          hrows[r].table = dtable.get() + static_cast<std::int64_t>(r) * pages;
          hrows[r].pos = keys - 1;
        }
        DeviceBuffer<ops::RowKv> drows(hrows.size());
        CK(cudaMemcpyAsync(drows.get(), hrows.data(), drows.bytes(), cudaMemcpyHostToDevice, s));
        DeviceBuffer<__nv_bfloat16> qkv(static_cast<std::size_t>(rows * row)), out(static_cast<std::size_t>(rows * q_dim));
        // Two cuDNN graphs: the heuristic's first engine, and the first engine cuDNN does not note as
        // nondeterministic.
        struct Variant {
          std::shared_ptr<fe::graph::Graph> graph;
          std::string engine;
          DeviceBuffer<unsigned char> workspace;
          DeviceBuffer<__nv_bfloat16> out;
          bool exec_ok = true, same_bits = true;
          double worst = 0, worst_p = 0, max_diff = 0;  // error / bounds; largest replay difference / largest |value|
          int differ = 0;                               // elements of the worst replay unlike the first run's
        };
        Variant var[2];
        for (int vi = 0; vi < 2; ++vi) {
          std::int64_t ws = 0;
          var[vi].graph = build(h, rows, md.heads, md.kv_heads, md.d, blocks, pages, vi == 1, &ws, &var[vi].engine);
          var[vi].workspace.resize(static_cast<std::size_t>(std::max<std::int64_t>(ws, 1)));
          var[vi].out.resize(out.size());
        }
        const auto launch = [&](int l) {
          ops::attention(qkv.get(), rows, md.heads, md.kv_heads, md.d, drows.get(), l, keys, out.get(), s,
                         /*old_keys_ready=*/true);
        };
        const auto launch_cudnn = [&](Variant& v, int l) {
          std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack = {
              {kQ, qkv.get()},        {kK, kc.get() + l * layer_stride}, {kV, vc.get() + l * layer_stride},
              {kO, v.out.get()},      {kSeqQ, seq_q.get()},              {kSeqKv, seq_kv.get()},
              {kPageK, dtable.get()}, {kPageV, dtable.get()}};
          auto e = v.graph->execute(h, pack, v.workspace.get());
          if (!e.is_good() && v.exec_ok) std::printf("  cuDNN execute: %s\n", e.get_message().c_str());
          v.exec_ok = v.exec_ok && e.is_good();
        };
        // Checks: the last layer, every head of the last row, queries at unit scale and at 40×.
        const int lc = layers - 1, r = rows - 1;
        // The library at kAttentionGroupedMinRows rows or more runs its grouped tensor-core kernel: its own bound.
        const bool lib_grouped = ops::attention_runs_grouped(rows, md.heads, md.kv_heads, md.d, keys);
        double worst_lib = 0;
        bool finite = true;
        for (const float qs : {1.0f, 40.0f}) {
          std::vector<unsigned short> hq(static_cast<std::size_t>(rows * row));
          for (auto& x : hq) {
            const __nv_bfloat16 b = __float2bfloat16(qs * std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng));
            std::memcpy(&x, &b, 2);
          }
          CK(cudaMemcpyAsync(qkv.get(), hq.data(), qkv.bytes(), cudaMemcpyHostToDevice, s));
          CK(cudaMemsetAsync(out.get(), 0xff, out.bytes(), s));
          launch(lc);
          std::vector<unsigned short> ho(out.size()), hc[2];
          CK(cudaStreamSynchronize(s));
          CK(cudaMemcpy(ho.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
          for (auto& x : ho) finite = finite && (x & 0x7f80u) != 0x7f80u;
          for (int vi = 0; vi < 2; ++vi) {
            Variant& v = var[vi];
            if (!v.graph) continue;
            CK(cudaMemsetAsync(v.out.get(), 0xff, v.out.bytes(), s));
            launch_cudnn(v, lc);
            CK(cudaStreamSynchronize(s));
            hc[vi].resize(out.size());
            CK(cudaMemcpy(hc[vi].data(), v.out.get(), v.out.bytes(), cudaMemcpyDeviceToHost));
            for (auto& x : hc[vi]) finite = finite && (x & 0x7f80u) != 0x7f80u;
            // Replays: 8 more runs, each against the first.
            double mag = 0;
            for (auto& x : hc[vi]) mag = std::max(mag, static_cast<double>(std::abs(bf16_to_float(x))));
            for (int rep = 0; rep < 8; ++rep) {
              launch_cudnn(v, lc);
              std::vector<unsigned short> again(out.size());
              CK(cudaStreamSynchronize(s));
              CK(cudaMemcpy(again.data(), v.out.get(), v.out.bytes(), cudaMemcpyDeviceToHost));
              int n = 0;
              for (std::size_t i = 0; i < again.size(); ++i)
                if (again[i] != hc[vi][i]) {
                  ++n;
                  v.max_diff = std::max(v.max_diff, std::abs(bf16_to_float(again[i]) - bf16_to_float(hc[vi][i])) / mag);
                }
              v.differ = std::max(v.differ, n);
              v.same_bits = v.same_bits && n == 0;
            }
          }
          // The last row's keys and values, gathered through its block table.
          std::vector<unsigned short> hk(static_cast<std::size_t>(keys * kv_dim)), hv(hk.size());
          for (int t = 0; t < keys; ++t) {
            const std::int64_t slot = static_cast<std::int64_t>(table[static_cast<std::size_t>(r * pages + t / ops::kKvBlockRows)]) *
                                          ops::kKvBlockRows + t % ops::kKvBlockRows;
            CK(cudaMemcpy(hk.data() + t * kv_dim, kc.get() + lc * layer_stride + slot * kv_dim, kv_dim * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hv.data() + t * kv_dim, vc.get() + lc * layer_stride + slot * kv_dim, kv_dim * 2, cudaMemcpyDeviceToHost));
          }
          for (int hd = 0; hd < md.heads; ++hd) {
            const int kvh = hd / (md.heads / md.kv_heads);
            // The library's bound (probe_check.hpp), and the same with the probabilities rounded to
            // bf16 before P·V (one more 2⁻⁸ relative on each term: 2⁻⁸ Σ p|v|).
            const AttentionF64 ref = attention_f64_head(hq.data() + r * row + hd * md.d, hk.data(), hv.data(), keys, md.d,
                                                        kv_dim, kvh * md.d);
            for (int i = 0; i < md.d; ++i) {
              const std::size_t at = static_cast<std::size_t>(r * q_dim + hd * md.d + i);
              const double el = std::abs(bf16_to_float(ho[at]) - ref.want[i]);
              worst_lib = std::max(worst_lib, std::isnan(el) ? 1e30 : el / (lib_grouped ? ref.bound_tc[i] : ref.bound[i]));
              for (int vi = 0; vi < 2; ++vi) {
                if (!var[vi].graph) continue;
                const double ec = std::abs(bf16_to_float(hc[vi][at]) - ref.want[i]);
                var[vi].worst = std::max(var[vi].worst, std::isnan(ec) ? 1e30 : ec / ref.bound[i]);
                var[vi].worst_p = std::max(var[vi].worst_p, std::isnan(ec) ? 1e30 : ec / (ref.bound[i] + std::ldexp(ref.mag[i], -8)));
              }
            }
          }
        }
        const auto gbs = [&](double us) { return kv_bytes / (us * 1e-6) / 1e9; };
        const double us_lib = time_graph(s, 20, layers, [&] {
          for (int l = 0; l < layers; ++l) launch(l);
        });
        bool ok = finite && worst_lib <= 1.0;
        std::printf("%5d %6d %7d %8.1f | %9.2f %7.0f %6.0f%% |", rows, keys, layers, kv_bytes / 1e6, us_lib, gbs(us_lib),
                    100 * gbs(us_lib) / copy);
        std::string notes;
        for (int vi = 0; vi < 2; ++vi) {
          Variant& v = var[vi];
          const char* tag = vi == 0 ? "heuristic" : "deterministic";
          if (!v.graph) {
            std::printf(" %9s %7s %7s %9s %9s |", "-", "-", "-", "-", "-");
            notes += std::string(" [") + tag + ": " + v.engine + "]";
            if (vi == 0) ok = false;
            continue;
          }
          const double us = time_graph(s, 20, layers, [&] {
            for (int l = 0; l < layers; ++l) launch_cudnn(v, l);
          });
          const double us_plain = 1000.0 * elapsed_ms(s, [&] {
                                    for (int rep = 0; rep < 5; ++rep)
                                      for (int l = 0; l < layers; ++l) launch_cudnn(v, l);
                                  }) / (5 * layers);
          std::printf(" %9.2f %7.0f %6.0f%% %9.2f %8.2fx |", us, gbs(us), 100 * gbs(us) / copy, us_plain, us_lib / us);
          char buf[400];
          std::snprintf(buf, sizeof buf, " [%s: %s; error/bound %.2f, with bf16 P %.2f; replays %s]", tag, v.engine.c_str(),
                        v.worst, v.worst_p,
                        v.same_bits ? "bit-identical"
                                    : ("DIFFER in up to " + std::to_string(v.differ) + " elements, by up to " +
                                       std::to_string(v.max_diff) + " of the largest |value|").c_str());
          notes += buf;
          ok = ok && v.exec_ok && v.worst_p <= 1.0 && (vi == 0 || v.same_bits);
        }
        all_ok = all_ok && ok;
        std::printf(" %s  lib %.2f%s\n", ok ? "ok" : "FAIL", worst_lib, notes.c_str());
        std::fflush(stdout);
      }
  }
  std::printf("\nchecks: %s\n", all_ok ? "pass" : "FAIL");
  cudnnDestroy(h);
  return all_ok ? 0 : 1;
}
