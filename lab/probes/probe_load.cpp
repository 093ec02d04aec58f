// twell_probe_load: how long a checkpoint takes to load, phase by phase: Model::load as fp32 (the
// CPU runtime's form) and bf16 only (the GPU's), then, where a GPU is usable, the CUDA runtime's
// construction from the bf16 model (the upload) and its first forward calls. Each load REPS times (the page cache warm after
// the first); prints seconds and the model's host bytes.
//   build/…/lab/twell_probe_load DIR [REPS]   (configured with -DTWELL_BUILD_LAB=ON)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "twell/model/model.hpp"
#include "twell/model/runtime.hpp"

namespace {
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) try {
  using namespace twell;
  if (argc < 2) {
    std::fprintf(stderr, "usage: twell_probe_load DIR [REPS]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int reps = argc > 2 ? std::atoi(argv[2]) : 2;
  const bool gpu = model::cuda_usable();
  for (int r = 0; r < reps; ++r) {
    for (const bool bf16 : {false, true}) {
      model::LoadOptions lo;
      lo.bf16_only = bf16;
      auto t0 = std::chrono::steady_clock::now();
      const model::Model m = model::Model::load(dir, lo);
      const double load = since(t0);
      double upload = -1;
      std::string calls;
      if (bf16 && gpu) {
        t0 = std::chrono::steady_clock::now();
        auto rt = model::make_runtime(m, "cuda");
        upload = since(t0);
        // The first calls of a fresh runtime, one after another: which costs are once per process
        // (the same shape again is fast) and which once per shape (a new length is slow again).
        std::vector<std::unique_ptr<model::Sequence>> seqs;
        auto call = [&](const char* what, std::int64_t len) {
          std::vector<std::int32_t> toks(static_cast<std::size_t>(len));
          for (std::int64_t i = 0; i < len; ++i) toks[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7919) % m.config.vocab_size);
          seqs.push_back(rt->new_sequence(256));
          const model::SeqStep step{seqs.back().get(), toks};
          const auto c0 = std::chrono::steady_clock::now();
          (void)rt->forward_argmax(std::span(&step, 1));
          calls += fmt::format("{}{} {:.1f} ms", calls.empty() ? "" : ", ", what, 1e3 * since(c0));
        };
        call("prefill 16", 16);
        call("prefill 16 again", 16);
        call("prefill 17", 17);
        call("prefill 40", 40);
        call("prefill 40 again", 40);
        call("prefill 1", 1);
        call("prefill 1 again", 1);
      }
      std::printf("rep %d %-9s load %.3f s (%.2f GB on the host)", r, bf16 ? "bf16-only" : "fp32", load,
                  static_cast<double>(m.weight_bytes()) / 1e9);
      if (upload >= 0) std::printf(", CUDA runtime %.3f s; first calls: %s", upload, calls.c_str());
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "twell_probe_load: %s\n", e.what());
  return 1;
}
