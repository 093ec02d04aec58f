// twell_probe_timeline: where a graph-replayed decode step's time goes, kernel by kernel, from the
// kernels' own start and end times (CUPTI's concurrent-kernel activity records): nothing is
// serialised, so programmatic launches' overlap and the gaps between kernels show as they run —
// what ncu cannot show (it serialises every kernel) and nsys cannot here (not usable on the GPU
// machines, device KINDS.md). Diagnostics for issue 27's decode targets.
//   twell_probe_timeline [config [density [batch [steps [prompt [paths]]]]]]   (defaults: 2b 0.005 1 32 128 dense,automatic)
// paths: which FFN paths run and in which order (dense, automatic, comma-separated): a path that runs
// second does so after the first one's steps on a warm GPU, so a difference between the two can be
// checked against the other order.
// For the dense FFN path and the automatic one in turn: a runtime with CUDA graphs, a prefill of
// `prompt` tokens a sequence (argument 5, default 128), 8 warm-up decode steps, then `steps` traced steps. A step is the kernels
// up to and including the LM head's argmax. Prints, per path: the step's GPU span (first kernel's
// start to the argmax's end, median), the sum of kernel durations, the idle time between kernels
// and the overlap (a kernel starting before the one before it ended); per kernel name: launches a
// step, µs a step and a launch, the idle time before it; the links (how long each kernel ends after
// the one before it, by pair: what sets the period); and one layer's kernels in order (the
// median step's middle layer) with their start offsets; last, the shared-memory configuration each
// kernel ran under and the links across which it changed (report_smem_config).
#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "probe_decoder.hpp"

using namespace twell;

namespace {

struct Kernel {
  std::uint64_t start, end;  // ns
  std::string name;
  int regs = 0;                  // registers a thread
  std::int64_t cta_smem = 0;     // static + dynamic shared memory a CTA, bytes
  int carveout_asked = -1;       // the function's carveout attribute, % (-1: none; CUPTI reports no launch attribute's)
  std::uint32_t sm_smem = 0;     // the SM's shared memory as the driver configured it for this launch, bytes
};

std::mutex g_mutex;
std::vector<Kernel> g_kernels;

#define CUPTI_CK(e)                                                              \
  do {                                                                           \
    const CUptiResult r_ = (e);                                                  \
    if (r_ != CUPTI_SUCCESS) {                                                   \
      const char* s_ = nullptr;                                                  \
      cuptiGetResultString(r_, &s_);                                             \
      std::fprintf(stderr, "%s:%d: CUPTI: %s\n", __FILE__, __LINE__, s_ ? s_ : "?"); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

// "void twell::(anonymous namespace)::twell_gemv_kernel<1>(twell::cuda::TwellGemvParams)" →
// "twell_gemv_kernel<1>": the demangled name without its namespaces and parameters.
std::string short_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  if (!s.empty() && s.back() == ')') {  // the parameter list: back to its matching '('
    int open = 0;
    for (std::size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++open;
      if (s[i] == '(' && --open == 0) {
        s.resize(i);
        break;
      }
    }
  }
  int depth = 0;
  std::size_t cut = 0;  // after the last "::" outside template arguments
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (depth == 0 && s[i] == ':' && i + 1 < s.size() && s[i + 1] == ':') cut = i + 2;
  }
  s = s.substr(cut);
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  return s.size() > 60 ? s.substr(0, 60) : s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 16u << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      g_kernels.push_back({k->start, k->end, short_name(k->name), k->registersPerThread,
                           static_cast<std::int64_t>(k->staticSharedMemory) + k->dynamicSharedMemory,
                           k->isSharedMemoryCarveoutRequested ? k->sharedMemoryCarveoutRequested : -1,
                           k->sharedMemoryExecuted});
    }
  }
  std::free(buffer);
}

std::vector<Kernel> take_kernels() {
  cudaDeviceSynchronize();
  CUPTI_CK(cuptiActivityFlushAll(1));
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<Kernel> k;
  k.swap(g_kernels);
  std::sort(k.begin(), k.end(), [](const Kernel& a, const Kernel& b) { return a.start < b.start; });
  return k;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The shared-memory configuration each launch ran under. An SM's L1 / shared-memory split is one
// value for every CTA on it: a launch whose CTAs need more shared memory than the split the SM runs
// with waits until the SM's resident CTAs (of the kernel before, still running under a programmatic
// launch) have left before the driver changes it, so the overlap that programmatic launches buy is
// lost at such a link. Per kernel: its registers and shared memory a CTA, the carveout set on the
// function (cudaFuncAttributePreferredSharedMemoryCarveout: CUPTI does not report a launch
// attribute's, so TWELL_TUNING=smem-carveout shows only in the configurations) and the
// configurations the driver chose (KB, share of launches); then the links across which the
// configuration changed within a step, and how many changes a step has.
void report_smem_config(const std::vector<std::vector<Kernel>>& steps) {
  struct PerName {
    int regs = 0, asked = -1;
    std::int64_t cta_smem = 0, launches = 0;
    std::map<std::uint32_t, std::int64_t> configs;
  };
  std::map<std::string, PerName> by_name;
  std::map<std::pair<std::string, std::string>, std::map<std::pair<std::uint32_t, std::uint32_t>, std::int64_t>> changes;
  std::vector<double> per_step;
  for (const auto& st : steps) {
    double c = 0;
    for (std::size_t i = 0; i < st.size(); ++i) {
      PerName& p = by_name[st[i].name];
      p.regs = st[i].regs;
      p.asked = st[i].carveout_asked;
      p.cta_smem = std::max(p.cta_smem, st[i].cta_smem);
      ++p.launches;
      ++p.configs[st[i].sm_smem];
      if (i > 0 && st[i].sm_smem != st[i - 1].sm_smem) {
        ++changes[{st[i - 1].name, st[i].name}][{st[i - 1].sm_smem, st[i].sm_smem}];
        ++c;
      }
    }
    per_step.push_back(c);
  }
  const double n = static_cast<double>(steps.size());
  const auto kb = [](double bytes) { return bytes / 1024.0; };
  std::printf("\nshared-memory configuration (CUPTI's sharedMemoryExecuted: the SM's shared memory the driver set "
              "for the launch):\n\n");
  std::printf("| kernel | registers a thread | shared memory a CTA, KB | function's carveout, %% | SM configured, KB "
              "(share of launches) |\n|---|---:|---:|---:|---|\n");
  for (const auto& [name, p] : by_name) {
    std::string cfg;
    for (const auto& [bytes, count] : p.configs) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%.0f (%.0f %%)", cfg.empty() ? "" : ", ", kb(static_cast<double>(bytes)),
                    100.0 * static_cast<double>(count) / static_cast<double>(p.launches));
      cfg += buf;
    }
    std::printf("| `%s` | %d | %.1f | %s | %s |\n", name.c_str(), p.regs, kb(static_cast<double>(p.cta_smem)),
                p.asked < 0 ? "—" : std::to_string(p.asked).c_str(), cfg.c_str());
  }
  std::printf("\nconfiguration changes between consecutive kernels: %.1f a step (median)\n\n", median(per_step));
  if (changes.empty()) return;
  std::printf("| after … | … starts under another configuration | times a step | from → to, KB |\n|---|---|---:|---|\n");
  for (const auto& [names, by_change] : changes)
    for (const auto& [fromto, count] : by_change)
      std::printf("| `%s` | `%s` | %.1f | %.0f → %.0f |\n", names.first.c_str(), names.second.c_str(),
                  static_cast<double>(count) / n, kb(static_cast<double>(fromto.first)),
                  kb(static_cast<double>(fromto.second)));
}

void report(const char* path, const std::vector<Kernel>& all, std::int64_t layers) {
  // Steps: the kernels up to and including each argmax.
  std::vector<std::vector<Kernel>> steps(1);
  for (const Kernel& k : all) {
    steps.back().push_back(k);
    if (k.name.find("argmax") != std::string::npos) steps.emplace_back();
  }
  if (steps.back().empty()) steps.pop_back();
  if (steps.empty()) {
    std::printf("%s: no kernels traced\n", path);
    return;
  }
  std::vector<double> span, busy, idle, overlap;
  struct PerName {
    double us = 0, idle_us = 0;
    std::int64_t launches = 0;
  };
  std::map<std::string, PerName> by_name;
  for (const auto& st : steps) {
    double b = 0, i = 0, o = 0;
    std::uint64_t prev_end = st.front().start;
    for (const Kernel& k : st) {
      const double gap = (static_cast<double>(k.start) - static_cast<double>(prev_end)) / 1e3;
      b += static_cast<double>(k.end - k.start) / 1e3;
      if (gap >= 0)
        i += gap;
      else
        o -= gap;
      PerName& p = by_name[k.name];
      p.us += static_cast<double>(k.end - k.start) / 1e3;
      p.idle_us += gap > 0 ? gap : 0;
      ++p.launches;
      prev_end = std::max(prev_end, k.end);
    }
    span.push_back(static_cast<double>(prev_end - st.front().start) / 1e3);
    busy.push_back(b);
    idle.push_back(i);
    overlap.push_back(o);
  }
  const double n = static_cast<double>(steps.size());
  std::printf("\n## %s path: %zu steps traced, %zu kernels a step\n\n", path, steps.size(), steps[steps.size() / 2].size());
  std::printf("step span (first start to argmax end) %.1f us median; kernels' durations %.1f us; idle between "
              "kernels %.1f us; overlap %.1f us\n\n",
              median(span), median(busy), median(idle), median(overlap));
  std::vector<std::pair<std::string, PerName>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  std::printf("| kernel | launches a step | us a step | us a launch | idle before it, us a step |\n|---|---:|---:|---:|---:|\n");
  for (const auto& [name, p] : rows)
    std::printf("| `%s` | %.1f | %.1f | %.2f | %.1f |\n", name.c_str(), static_cast<double>(p.launches) / n, p.us / n,
                p.us / static_cast<double>(p.launches), p.idle_us / n);
  // The chain's links: how long each kernel runs past the end of the kernel that started before it
  // (on the step's one stream, the one it waits for), by (previous, kernel) pair over every traced
  // step. Under programmatic launches kernels overlap, so durations do not add up to the period;
  // the links do (a step's links sum to its last end less its first kernel's end).
  std::map<std::pair<std::string, std::string>, std::vector<double>> links;
  for (const auto& st : steps)
    for (std::size_t i = 1; i < st.size(); ++i)
      links[{st[i - 1].name, st[i].name}].push_back(
          (static_cast<double>(st[i].end) - static_cast<double>(st[i - 1].end)) / 1e3);
  struct LinkRow {
    const std::pair<std::string, std::string>* names;
    double per_step, median_us;
  };
  std::vector<LinkRow> link_rows;
  for (const auto& [names, us] : links) link_rows.push_back({&names, static_cast<double>(us.size()) / n, median(us)});
  std::sort(link_rows.begin(), link_rows.end(),
            [](const LinkRow& a, const LinkRow& b) { return a.per_step * a.median_us > b.per_step * b.median_us; });
  std::printf("\nlinks: how long each kernel ends after the one before it ends (median over every occurrence):\n\n");
  std::printf("| after … ends | … ends | times a step | µs, median | µs a step |\n|---|---|---:|---:|---:|\n");
  for (const LinkRow& r : link_rows)
    std::printf("| `%s` | `%s` | %.1f | %.2f | %.1f |\n", r.names->first.c_str(), r.names->second.c_str(), r.per_step,
                r.median_us, r.per_step * r.median_us);
  // One layer of the median-span step: its kernels from the middle of the step.
  std::vector<std::size_t> order(steps.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return span[a] < span[b]; });
  const auto& st = steps[order[order.size() / 2]];
  const std::size_t per_layer = layers > 0 ? st.size() / static_cast<std::size_t>(layers) : st.size();
  const std::size_t from = st.size() / 2 - st.size() / 2 % std::max<std::size_t>(per_layer, 1);
  std::printf("\nkernels %zu .. %zu of the median step (≈ %zu a layer), µs from the step's start:\n\n", from,
              std::min(st.size(), from + 2 * per_layer) - 1, per_layer);
  std::printf("| kernel | start | duration | gap after the previous one's end |\n|---|---:|---:|---:|\n");
  for (std::size_t i = from; i < std::min(st.size(), from + 2 * per_layer); ++i) {
    const double t0 = static_cast<double>(st.front().start);
    const double gap = i == 0 ? 0 : (static_cast<double>(st[i].start) - static_cast<double>(st[i - 1].end)) / 1e3;
    std::printf("| `%s` | %.2f | %.2f | %.2f |\n", st[i].name.c_str(), (static_cast<double>(st[i].start) - t0) / 1e3,
                static_cast<double>(st[i].end - st[i].start) / 1e3, gap);
  }
  report_smem_config(steps);
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string config = argc > 1 ? argv[1] : "2b";
  const double density = argc > 2 ? std::stod(argv[2]) : 0.005;
  const std::int64_t batch = argc > 3 ? std::stoll(argv[3]) : 1;
  const int steps = argc > 4 ? std::stoi(argv[4]) : 32;
  const int prompt = argc > 5 ? std::stoi(argv[5]) : 128;  // keys before the warm-up steps
  std::vector<model::FfnPath> paths;
  bool paths_ok = true;
  const std::string list = argc > 6 ? argv[6] : "dense,automatic";
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, end - at);
    if (name == "dense") paths.push_back(model::FfnPath::dense);
    else if (name == "automatic") paths.push_back(model::FfnPath::automatic);
    else paths_ok = false;
    at = end + 1;
  }
  if (batch < 1 || steps < 1 || prompt < 1 || prompt > 65536 || !paths_ok) {
    std::fprintf(stderr, "usage: twell_probe_timeline [config [density [batch >= 1 [steps >= 1 [prompt tokens, 1-65536 "
                         "[paths: dense,automatic (either or both, in the order to run)]]]]]]\n");
    return 2;
  }
  const model::Model m = probe::synthetic_model(config, density, "probe_timeline");
  // Tracing is on before any graph exists (kernels of graphs made earlier may not be recorded).
  CUPTI_CK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  CUPTI_CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  std::mt19937_64 rng(7);
  const std::int64_t capacity = prompt + steps + 16;
  std::printf("# A graph-replayed decode step, kernel by kernel (CUPTI), %s at %.3f %%, batch %lld, %d prompt tokens + 8 warm-up steps\n",
              config.c_str(), 100 * density, static_cast<long long>(batch), prompt);
  for (const model::FfnPath path : paths) {
    probe::Decoder d = probe::start(m, path, true, batch, capacity, rng, prompt);
    for (int s = 0; s < 8; ++s) d.step();
    take_kernels();  // the prefill and warm-up steps' records
    std::vector<double> wall;
    for (int s = 0; s < steps; ++s) wall.push_back(d.step());
    const std::vector<Kernel> k = take_kernels();
    std::printf("\nwall time a step (host, incl. the token's copy back): %.3f ms median\n", median(wall));
    report(path == model::FfnPath::dense ? "dense FFN" : "automatic (sparse) FFN", k, m.config.num_layers);
  }
  CUPTI_CK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "probe_timeline: %s\n", e.what());
  return 1;
}
