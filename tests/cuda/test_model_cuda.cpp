// The CUDA model runtime against the CPU runtime (itself checked against a float64 reference in
// tests/model/model_parity.py) on tiny random Llama checkpoints: every position's logits, batches
// of sequences of different lengths fed in chunks through the KV caches, SiLU / GELU (dense FFN)
// and ReLU (the FFN engine: dense, sparse, automatic), MHA and GQA; greedy generation; bad calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>

#include "cuda/sm90/union_ffn.hpp"
#include "cuda_test_util.hpp"
#include "model/tiny_model.hpp"
#include "twell/model/generate.hpp"
#include "twell/model/runtime.hpp"
#include "twell/model/synthetic.hpp"

namespace twell::test {
namespace {

using model::FfnPath;
using model::Runtime;
using model::SeqStep;
using model::Sequence;

// Logits of every position of several sequences, fed together in chunks of `chunk` tokens.
std::vector<std::vector<float>> run_batch(Runtime& rt, const std::vector<std::vector<std::int32_t>>& seqs, std::size_t chunk) {
  std::vector<std::unique_ptr<Sequence>> kv;
  for (auto& s : seqs) kv.push_back(rt.new_sequence(static_cast<std::int64_t>(s.size())));
  std::vector<std::vector<float>> out(seqs.size());
  const auto V = static_cast<std::size_t>(rt.model().config.vocab_size);
  for (std::size_t off = 0;; off += chunk) {
    std::vector<SeqStep> steps;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < seqs.size(); ++i)
      if (off < seqs[i].size()) {
        steps.push_back({kv[i].get(), std::span<const std::int32_t>(seqs[i].data() + off, std::min(chunk, seqs[i].size() - off))});
        who.push_back(i);
      }
    if (steps.empty()) break;
    const auto l = rt.forward(steps, true);
    std::size_t row = 0;
    for (std::size_t j = 0; j < who.size(); ++j) {
      const std::size_t n = steps[j].tokens.size();
      out[who[j]].insert(out[who[j]].end(), l.begin() + static_cast<long>(row * V), l.begin() + static_cast<long>((row + n) * V));
      row += n;
    }
  }
  return out;
}

// The GPU holds weights, GEMM operands, q/k/v, attention outputs and the FFN's h as bf16
// (relative rounding 2⁻⁹ each) where the CPU runtime holds fp32: per layer the outputs move by a
// few 2⁻⁹ of their magnitude, compounding over the layers into the logits. 3e-2 of the logit scale
// bounds 2–3 layers of that with room; a wrong head, position, cache slot or index moves logits
// by O(1) (the tests' random models have logits of order 1).
constexpr double kTol = 3e-2;

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
    m = std::max(m, static_cast<double>(std::fabs(b[i])));
  }
  return d / std::max(m, 1e-30);
}

struct Case {
  const char* name;
  TinySpec spec;
  FfnPath path;
};

TEST(ModelCuda, LogitsMatchCpuRuntime) {
  TWELL_REQUIRE_GPU();
  std::vector<Case> cases;
  {
    TinySpec s;
    s.act = "silu";
    s.bf16 = true;
    cases.push_back({"silu-gqa", s, FfnPath::automatic});
    s.act = "gelu";
    s.kv_heads = 4;
    s.tied = false;
    cases.push_back({"gelu-mha-untied", s, FfnPath::automatic});
    TinySpec r;
    r.bf16 = true;
    r.bias_channel = true;
    r.gate_threshold = -0.45f;  // ≈ 1 % density
    r.intermediate = 600;
    cases.push_back({"relu-sparse", r, FfnPath::sparse});
    cases.push_back({"relu-auto", r, FfnPath::automatic});
    cases.push_back({"relu-dense", r, FfnPath::dense});
    r.gate_threshold = 0.0f;  // ≈ 50 %: overflowing TwELL tiles
    cases.push_back({"relu-sparse-50pct", r, FfnPath::sparse});
  }
  for (auto& c : cases) {
    c.spec.seed = fresh_seed();
    const model::Model m = model::Model::load(write_tiny(std::string("cuda_") + c.name, c.spec).string());
    auto cpu = model::make_runtime(m, "cpu", {FfnPath::dense, 0.05});
    auto gpu = model::make_runtime(m, "cuda", {c.path, 0.05});
    Rng rng(c.spec.seed);
    std::vector<std::vector<std::int32_t>> seqs;
    for (std::int64_t n : {1, 9, 40}) {
      seqs.emplace_back();
      for (std::int64_t i = 0; i < n; ++i) seqs.back().push_back(static_cast<std::int32_t>(rng.below(c.spec.vocab)));
    }
    const auto want = run_batch(*cpu, seqs, 40);
    for (std::size_t chunk : {40u, 7u}) {
      const auto got = run_batch(*gpu, seqs, chunk);
      for (std::size_t i = 0; i < seqs.size(); ++i)
        EXPECT_LT(rel_diff(got[i], want[i]), kTol) << c.name << ", sequence " << i << ", chunk " << chunk;
    }
    if (c.path == FfnPath::sparse) {
      EXPECT_EQ(gpu->ffn_stats()[0].sparse_rows, gpu->ffn_stats()[0].rows) << c.name;
    }
    EXPECT_EQ(gpu->ffn_stats()[0].active, -1) << c.name << ": the GPU runtime sums no counts";
    EXPECT_EQ(gpu->ffn_stats()[0].active_per_token(), -1) << c.name;
    if (c.path == FfnPath::dense) {
      EXPECT_EQ(gpu->ffn_stats()[0].sparse_rows, 0) << c.name;
    }
  }
}

// A model loaded with bf16 weights only (LoadOptions::bf16_only: what `twell generate` and
// twell.model load for the GPU) gives the CUDA runtime the very weights the fp32 load's upload
// gives it: the same logits bit for bit, prefill and decode, ReLU (the FFN engine's device load) and
// SiLU (the runtime's own matrices), tied and untied heads, fp32 and bf16 files.
TEST(ModelCuda, Bf16OnlyLoadGivesTheSameLogits) {
  TWELL_REQUIRE_GPU();
  std::vector<Case> cases;
  {
    TinySpec s;
    s.act = "silu";
    cases.push_back({"silu-fp32-tied", s, FfnPath::automatic});
    s.bf16 = true;
    s.tied = false;
    cases.push_back({"silu-bf16-untied", s, FfnPath::automatic});
    TinySpec r;
    r.bias_channel = true;
    r.gate_threshold = -0.45f;  // ≈ 1 % density
    r.intermediate = 600;
    cases.push_back({"relu-fp32-auto", r, FfnPath::automatic});
    r.bf16 = true;
    cases.push_back({"relu-bf16-sparse", r, FfnPath::sparse});
  }
  for (auto& c : cases) {
    c.spec.seed = fresh_seed();
    const std::string dir = write_tiny(std::string("cuda_bf16_only_") + c.name, c.spec).string();
    model::LoadOptions lo;
    lo.bf16_only = true;
    const model::Model a = model::Model::load(dir), b = model::Model::load(dir, lo);
    auto ra = model::make_runtime(a, "cuda", {c.path}), rb = model::make_runtime(b, "cuda", {c.path});
    Rng rng(c.spec.seed);
    std::vector<std::vector<std::int32_t>> seqs;
    for (std::int64_t n : {1, 9, 40}) {
      seqs.emplace_back();
      for (std::int64_t i = 0; i < n; ++i) seqs.back().push_back(static_cast<std::int32_t>(rng.below(c.spec.vocab)));
    }
    for (std::size_t chunk : {40u, 1u}) {  // one prefill call; then token by token (decode steps)
      const auto x = run_batch(*ra, seqs, chunk), y = run_batch(*rb, seqs, chunk);
      for (std::size_t i = 0; i < seqs.size(); ++i) {
        ASSERT_EQ(x[i].size(), y[i].size());
        EXPECT_EQ(std::memcmp(x[i].data(), y[i].data(), x[i].size() * sizeof(float)), 0)
            << c.name << ", sequence " << i << ", chunk " << chunk << ": max rel diff " << rel_diff(y[i], x[i]);
      }
    }
  }
}

// Prefill attention by cuDNN's fused SDPA (where this build has it: every sequence of a call
// starting empty, ≥ 16 tokens each) and by the runtime's own tensor-core kernel, both against the
// CPU runtime: head_dim 64 with GQA and 128 with MHA (the shapes the tensor-core path takes),
// sequences of different lengths in one call; fed whole (one fresh call: cuDNN) and in chunks of
// 32 (a fresh first call, then continuations that read the caches the first call wrote, by the
// runtime's kernels). The two GPU backends also against each other.
TEST(ModelCuda, PrefillAttentionBackendsMatchCpu) {
  TWELL_REQUIRE_GPU();
  for (const auto& [heads, kv_heads] : {std::pair<std::int64_t, std::int64_t>{4, 2}, {2, 2}}) {
    TinySpec spec;
    spec.act = "silu";
    spec.bf16 = true;
    spec.hidden = 256;
    spec.heads = heads;
    spec.kv_heads = kv_heads;
    spec.max_pos = 160;
    spec.seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "heads " << heads << "/" << kv_heads << ", head_dim " << spec.hidden / heads);
    const model::Model m = model::Model::load(write_tiny("cudnn_prefill", spec).string());
    auto cpu = model::make_runtime(m, "cpu", {FfnPath::dense, 0.05});
    model::RuntimeTuning with, without;  // explicit: not TWELL_TUNING's
    without.cudnn_attention = false;
    with.cudnn_build_at = 1;  // every shape on cuDNN from its first call
    auto a = model::make_runtime(m, "cuda", {FfnPath::automatic}, with);
    auto b = model::make_runtime(m, "cuda", {FfnPath::automatic}, without);
    RecordProperty("prefill_attention", a->prefill_attention());
    std::fprintf(stderr, "[prefill attention] %s\n", a->prefill_attention().c_str());
    EXPECT_EQ(b->prefill_attention().find("cuDNN SDPA"), std::string::npos) << b->prefill_attention();
    Rng rng(spec.seed);
    // Sequences of different lengths (cuDNN's ragged graph), of one bucket length (its plain graph
    // in 128-token chunks, ragged ones in 32-token chunks), and one sequence of an odd length.
    for (const std::vector<std::int64_t>& lengths : {std::vector<std::int64_t>{16, 70, 128, 33},
                                                     std::vector<std::int64_t>{128, 128, 128}, std::vector<std::int64_t>{77}}) {
      SCOPED_TRACE(::testing::Message() << lengths.size() << " sequences, the first of " << lengths[0] << " tokens");
      std::vector<std::vector<std::int32_t>> seqs;
      for (std::int64_t n : lengths) {
        seqs.emplace_back();
        for (std::int64_t i = 0; i < n; ++i) seqs.back().push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
      }
      const auto want = run_batch(*cpu, seqs, 128);
      for (std::size_t chunk : {128u, 32u}) {
        const auto got_a = run_batch(*a, seqs, chunk), got_b = run_batch(*b, seqs, chunk);
        // Where cuDNN is said to run (and refused no shape), it did: other kernels cannot agree with
        // the own ones on every bit of every logit (a silent fallback would).
        const std::string att = a->prefill_attention();
        if (chunk == 32) std::fprintf(stderr, "[prefill attention, after the runs] %s\n", att.c_str());
        // A refusal of a plain graph names its exact row count ("of 128 rows"), a ragged one "of ≤ …".
        EXPECT_FALSE(att.find("cuDNN refused") != std::string::npos && att.find("≤") == std::string::npos)
            << "cuDNN refused the plain graph: " << att;
        if (att.find("cuDNN SDPA") != std::string::npos && att.find("cuDNN refused") == std::string::npos) {
          bool differ = false;
          for (std::size_t i = 0; i < seqs.size(); ++i) differ = differ || got_a[i] != got_b[i];
          EXPECT_TRUE(differ) << "cuDNN's attention did not run (bit-identical to the own kernels), chunk " << chunk;
        }
        for (std::size_t i = 0; i < seqs.size(); ++i) {
          EXPECT_LT(rel_diff(got_a[i], want[i]), kTol) << a->prefill_attention() << ", chunk " << chunk << ", sequence " << i;
          EXPECT_LT(rel_diff(got_b[i], want[i]), kTol) << "own kernels, chunk " << chunk << ", sequence " << i;
          EXPECT_LT(rel_diff(got_a[i], got_b[i]), kTol) << "cuDNN against own, chunk " << chunk << ", sequence " << i;
        }
      }
    }
  }
}

// By default a prefill shape's cuDNN graph is built at its second call (a build takes 0.2–1.7 s, a
// one-off prompt's attention microseconds): the first call runs the own kernels (bit-identical to a
// runtime without cuDNN), the second builds and runs cuDNN's (other bits, same values), a call of
// another shape starts over.
TEST(ModelCuda, CudnnGraphIsBuiltAtAShapesSecondCall) {
  TWELL_REQUIRE_GPU();
  TinySpec spec;
  spec.act = "silu";
  spec.bf16 = true;
  spec.hidden = 256;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.max_pos = 160;
  spec.seed = fresh_seed();
  const model::Model m = model::Model::load(write_tiny("cudnn_build_at", spec).string());
  model::RuntimeTuning without;  // and the defaults (not TWELL_TUNING's) for a
  without.cudnn_attention = false;
  auto a = model::make_runtime(m, "cuda", {FfnPath::automatic}, model::RuntimeTuning{});
  auto b = model::make_runtime(m, "cuda", {FfnPath::automatic}, without);
  if (a->prefill_attention().find("cuDNN SDPA") == std::string::npos)
    GTEST_SKIP() << "no cuDNN attention here: " << a->prefill_attention();
  EXPECT_NE(a->prefill_attention().find("0 graphs built"), std::string::npos) << a->prefill_attention();
  Rng rng(spec.seed);
  for (const std::int64_t n : {77, 130}) {
    SCOPED_TRACE(::testing::Message() << "a prompt of " << n << " tokens");
    std::vector<std::vector<std::int32_t>> seqs(1);
    for (std::int64_t i = 0; i < n; ++i) seqs[0].push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
    const auto own = run_batch(*b, seqs, 256);
    const auto first = run_batch(*a, seqs, 256);
    EXPECT_EQ(first, own) << "the first call of a shape ran cuDNN: " << a->prefill_attention();
    const auto second = run_batch(*a, seqs, 256);
    EXPECT_NE(second, own) << "the second call of a shape did not run cuDNN: " << a->prefill_attention();
    EXPECT_LT(rel_diff(second[0], own[0]), kTol);
    const auto third = run_batch(*a, seqs, 256);
    EXPECT_EQ(third, second) << "a built graph's calls differ";
  }
  EXPECT_NE(a->prefill_attention().find("2 graphs built"), std::string::npos) << a->prefill_attention();
}

// Greedy picks may differ only where the top two logits are within the bf16 noise: the tokens a and
// b agree up to their first difference (returned: the count that agree), where the CPU runtime's
// top-2 margin on the prompt and the agreed tokens must be a tie (kTol of the logit scale).
std::size_t expect_difference_at_a_tie(Runtime& cpu, const std::vector<std::int32_t>& prompt,
                                       const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b,
                                       const std::string& what) {
  EXPECT_EQ(a.size(), b.size()) << what;
  std::size_t same = 0;
  while (same < a.size() && same < b.size() && a[same] == b[same]) ++same;
  if (same == a.size()) return same;
  std::vector<std::int32_t> ctx = prompt;
  ctx.insert(ctx.end(), a.begin(), a.begin() + static_cast<long>(same));
  auto seq = cpu.new_sequence(static_cast<std::int64_t>(ctx.size()));
  SeqStep st{seq.get(), ctx};
  auto l = cpu.forward(std::span<const SeqStep>(&st, 1));
  std::sort(l.begin(), l.end());
  const double scale = std::max(std::fabs(l.front()), std::fabs(l.back()));
  EXPECT_LT(l[l.size() - 1] - l[l.size() - 2], kTol * scale)
      << what << ": greedy differs at token " << same << " where the CPU's top-2 margin is not a tie";
  return same;
}

TEST(ModelCuda, GreedyGenerationMatchesCpu) {
  TWELL_REQUIRE_GPU();
  TinySpec s;
  s.act = "silu";
  s.seed = fresh_seed();
  const model::Model m = model::Model::load(write_tiny("cuda_gen", s).string());
  auto cpu = model::make_runtime(m, "cpu");
  auto gpu = model::make_runtime(m, "cuda");
  Rng rng(s.seed);
  std::vector<std::vector<std::int32_t>> prompts(3);
  for (std::size_t i = 0; i < prompts.size(); ++i)
    for (std::size_t j = 0; j < 3 + 5 * i; ++j) prompts[i].push_back(static_cast<std::int32_t>(rng.below(s.vocab)));
  model::GenerateOptions o;
  o.max_new_tokens = 16;
  o.ignore_eos = true;
  const auto a = model::generate(*cpu, prompts, o), b = model::generate(*gpu, prompts, o);
  for (std::size_t i = 0; i < prompts.size(); ++i)
    expect_difference_at_a_tie(*cpu, prompts[i], a[i].tokens, b[i].tokens, "prompt " + std::to_string(i));
}

// Sampled generation on the GPU picks exactly the tokens that the whole logits copied back pick on
// the host (forward over the same batch of steps on another runtime of the same model: the same
// logits bit for bit): top-k draws (with top-p and a penalty, and alone) and greedy with a penalty
// select their candidates on the device (Runtime::forward_top) against Sampler::sample; top-p
// without a top-k cut draws on the device (Runtime::forward_sample) against sample_fixed_point with
// the sequence's own draws; a vocabulary above the kernels' block and one that is not a multiple of it.
TEST(ModelCuda, SamplingOnTheDevicePicksWhatTheHostPicks) {
  TWELL_REQUIRE_GPU();
  for (const std::int64_t vocab : {97, 3001}) {
    TinySpec s;
    s.vocab = vocab;
    s.seed = fresh_seed();
    const model::Model m = model::Model::load(write_tiny("cuda_topk", s).string());
    auto gpu = model::make_runtime(m, "cuda");
    auto ref = model::make_runtime(m, "cuda");
    Rng rng(s.seed);
    std::vector<std::vector<std::int32_t>> prompts(3);
    for (std::size_t i = 0; i < prompts.size(); ++i)
      for (std::size_t j = 0; j < 2 + 7 * i; ++j) prompts[i].push_back(static_cast<std::int32_t>(rng.below(vocab)));
    model::SamplingOptions topk;
    topk.temperature = 1.3;
    topk.top_k = 20;
    topk.top_p = 0.9;
    topk.repetition_penalty = 1.4;
    topk.seed = 11;
    model::SamplingOptions plain = topk;  // no penalty: no history goes to the device
    plain.repetition_penalty = 1.0;
    plain.top_p = 1.0;
    model::SamplingOptions greedy;
    greedy.repetition_penalty = 2.0;
    model::SamplingOptions nucleus;  // top-p alone: no top-k cut
    nucleus.temperature = 0.9;
    nucleus.top_p = 0.8;
    nucleus.seed = 5;
    for (const auto& so : {topk, plain, nucleus, greedy}) {
      ASSERT_TRUE(gpu->samples_on_device());
      model::GenerateOptions o;
      o.max_new_tokens = 24;
      o.ignore_eos = true;
      o.sampling = so;
      const auto got = model::generate(*gpu, prompts, o);
      // The reference: generate's whole-row path written out, every sequence stepped together.
      std::vector<model::Sampler> samplers;
      std::vector<std::unique_ptr<Sequence>> kv;
      std::vector<std::vector<std::int32_t>> hist = prompts, out(prompts.size());
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        model::SamplingOptions si = so;
        si.seed += i;
        samplers.emplace_back(si);
        kv.push_back(ref->new_sequence(static_cast<std::int64_t>(prompts[i].size()) + o.max_new_tokens));
      }
      std::vector<std::int32_t> last(prompts.size());
      for (int t = 0; t < o.max_new_tokens; ++t) {
        std::vector<SeqStep> steps;
        for (std::size_t i = 0; i < prompts.size(); ++i)
          steps.push_back({kv[i].get(), t == 0 ? std::span<const std::int32_t>(prompts[i])
                                               : std::span<const std::int32_t>(&last[i], 1)});
        const auto l = ref->forward(steps);
        for (std::size_t i = 0; i < prompts.size(); ++i) {
          const auto V = static_cast<std::size_t>(vocab);
          const std::span<const float> row(l.data() + i * V, V);
          const bool whole_row = so.temperature > 0 && model::candidates_needed(so, vocab) == 0;  // drawn on the device
          last[i] = whole_row ? model::sample_fixed_point(row, hist[i], so, samplers[i].next_draw())
                              : samplers[i].sample(row, hist[i]);
          hist[i].push_back(last[i]);
          out[i].push_back(last[i]);
        }
      }
      for (std::size_t i = 0; i < prompts.size(); ++i)
        EXPECT_EQ(got[i].tokens, out[i]) << "vocab " << vocab << ", prompt " << i << ", T " << so.temperature;
    }
  }
}

// Decode steps replayed from CUDA graphs give the same logits, bit for bit, as the same steps
// launched one kernel at a time (one plan schedule either way, so a layer whose count crosses
// decode_max_density switches path at the same step): batch 1, 3 and 20 sequences of different lengths, a SiLU model (the
// runtime's own GEMMs) and ReLU models whose layers decode sparse (≈ 0.5 %) or, once counted, dense
// (≈ 50 %), and the dense FFN path forced, over 100 steps (so the first capture, replays, a re-plan after 64 steps and new
// key buckets at 256 keys are all crossed).
TEST(ModelCuda, DecodeGraphsAreBitIdentical) {
  TWELL_REQUIRE_GPU();
  std::vector<std::tuple<const char*, TinySpec, FfnPath>> cases;
  TinySpec s;
  s.act = "silu";
  s.bf16 = true;
  s.max_pos = 320;
  cases.emplace_back("silu", s, FfnPath::automatic);
  s.act = "relu";
  s.bias_channel = true;
  s.gate_threshold = -0.6f;
  s.intermediate = 600;
  cases.emplace_back("relu-sparse", s, FfnPath::automatic);
  cases.emplace_back("relu-dense-path", s, FfnPath::dense);
  s.gate_threshold = 0.0f;
  cases.emplace_back("relu-50pct", s, FfnPath::automatic);
  for (auto& [name, spec, path] : cases) {
    spec.seed = fresh_seed();
    const model::Model m = model::Model::load(write_tiny(std::string("graphs_") + name, spec).string());
    model::RuntimeTuning eager_tuning, graph_tuning;  // explicit: not TWELL_TUNING's
    eager_tuning.cuda_graphs = false;
    auto eager = model::make_runtime(m, "cuda", {path}, eager_tuning);
    auto graphed = model::make_runtime(m, "cuda", {path}, graph_tuning);
    Rng rng(spec.seed);
    for (std::size_t batch : {1u, 3u, 20u}) {  // 20: above decode sizes (automatic runs the plain dense FFN)
      std::vector<std::vector<std::int32_t>> prompts(batch);
      for (std::size_t i = 0; i < batch; ++i)
        for (std::size_t j = 0; j < 150 + 7 * (i % 4); ++j) prompts[i].push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
      std::vector<std::unique_ptr<Sequence>> a, b;
      std::vector<SeqStep> sa, sb;
      for (std::size_t i = 0; i < batch; ++i) {
        a.push_back(eager->new_sequence(spec.max_pos));
        b.push_back(graphed->new_sequence(spec.max_pos));
        sa.push_back({a.back().get(), prompts[i]});
        sb.push_back({b.back().get(), prompts[i]});
      }
      ASSERT_EQ(eager->forward(sa), graphed->forward(sb)) << name << ": prefill";
      const std::int64_t before = graphed->graph_launches();
      std::vector<std::int32_t> next(batch);
      for (int step = 0; step < 100; ++step) {
        for (std::size_t i = 0; i < batch; ++i) {
          next[i] = static_cast<std::int32_t>(rng.below(spec.vocab));
          sa[i].tokens = std::span<const std::int32_t>(&next[i], 1);
          sb[i].tokens = sa[i].tokens;
        }
        const std::vector<float> la = eager->forward(sa), lb = graphed->forward(sb);
        ASSERT_EQ(la.size(), lb.size());
        ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0)
            << name << ", batch " << batch << ": decode step " << step << " differs";
      }
      EXPECT_GE(graphed->graph_launches() - before, 90) << name << ", batch " << batch << ": graphs not replayed";
    }
    EXPECT_EQ(eager->graph_launches(), 0);
    // ffn_stats' last_density: the newest count each layer's engine read back (the automatic
    // path's decode kernel, or its dense calls' sampled count); none for a forced path or SiLU.
    for (const Runtime* rt : {eager.get(), graphed.get()})
      for (std::size_t l = 0; l < rt->ffn_stats().size(); ++l) {
        const double d = rt->ffn_stats()[l].last_density;
        if (std::string(name) == "relu-sparse") {
          EXPECT_GE(d, 0.0) << name << ", layer " << l << ": a count came back";  // 0: a count of none
          EXPECT_LT(d, 0.05) << name << ", layer " << l;
        } else if (std::string(name) == "relu-50pct") {
          EXPECT_GT(d, 0.2) << name << ", layer " << l;
          EXPECT_LT(d, 0.8) << name << ", layer " << l;
        } else {
          EXPECT_EQ(d, -1.0) << name << ", layer " << l << ": nothing counts";
        }
      }
  }
}

// Two runtimes of one model agree bit for bit: a prefill of 20 tokens, then 60 decode steps
// (graphed after the first), for 1 and 3 sequences.
void expect_bit_identical(const TinySpec& spec, model::Runtime& a, model::Runtime& b) {
  Rng rng(spec.seed);
  for (std::size_t batch : {1u, 3u}) {
    std::vector<std::vector<std::int32_t>> prompts(batch);
    for (auto& p : prompts)
      for (int j = 0; j < 20; ++j) p.push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
    std::vector<std::unique_ptr<Sequence>> ka, kb;
    std::vector<SeqStep> sa, sb;
    for (std::size_t i = 0; i < batch; ++i) {
      ka.push_back(a.new_sequence(spec.max_pos));
      kb.push_back(b.new_sequence(spec.max_pos));
      sa.push_back({ka.back().get(), prompts[i]});
      sb.push_back({kb.back().get(), prompts[i]});
    }
    ASSERT_EQ(a.forward(sa, true), b.forward(sb, true)) << "prefill, batch " << batch;
    std::vector<std::int32_t> next(batch);
    for (int step = 0; step < 60; ++step) {
      for (std::size_t i = 0; i < batch; ++i) {
        next[i] = static_cast<std::int32_t>(rng.below(spec.vocab));
        sa[i].tokens = std::span<const std::int32_t>(&next[i], 1);
        sb[i].tokens = sa[i].tokens;
      }
      ASSERT_EQ(a.forward(sa), b.forward(sb)) << "decode step " << step << ", batch " << batch;
    }
  }
}

// A sparse ReLU model and a SiLU one, bf16, head_dim 64 (the decode attention's specialised kernel).
TinySpec agreement_spec(const char* act) {
  TinySpec spec;
  spec.act = act;
  spec.bf16 = true;
  spec.bias_channel = std::string(act) == "relu";
  spec.gate_threshold = -0.6f;
  spec.intermediate = 600;
  spec.hidden = 256;
  spec.max_pos = 160;
  spec.seed = fresh_seed();
  return spec;
}

// RuntimeTuning::programmatic_launch (Hopper; elsewhere it stays off, and the test skips) changes
// when the runtime's kernels are scheduled, never what they compute.
TEST(ModelCuda, ProgrammaticLaunchesAreBitIdentical) {
  TWELL_REQUIRE_GPU();
  for (const char* act : {"relu", "silu"}) {
    const TinySpec spec = agreement_spec(act);
    SCOPED_TRACE(act);
    const model::Model m = model::Model::load(write_tiny(std::string("pdl_") + act, spec).string());
    model::RuntimeTuning on, off;  // explicit: not TWELL_TUNING's
    on.programmatic_launch = true;
    off.programmatic_launch = false;
    auto a = model::make_runtime(m, "cuda", {FfnPath::automatic}, on);
    auto b = model::make_runtime(m, "cuda", {FfnPath::automatic}, off);
    if (!a->programmatic_launch()) GTEST_SKIP() << "this GPU or build does not take programmatic launches";
    EXPECT_FALSE(b->programmatic_launch());
    expect_bit_identical(spec, *a, *b);
    EXPECT_GT(a->graph_launches(), 0);
  }
}

// RuntimeTuning::smem_carveout (the L1 / shared-memory split every launch of the runtime's kernels
// asks for: the most shared memory, and the least, against none asked) changes where the driver
// splits an SM, never what the kernels compute: the same logits, prefill and every decode step,
// with and without programmatic launches. The kernels that need much shared memory (the one-row
// decode attention's staged keys) must still get it at a split of 0 %: the attribute is a hint.
// The union FFN from 2 rows, so that the 3-row steps take its clustered launches (the default
// starts it at 4 rows, and expect_bit_identical runs batches 1 and 3).
TEST(ModelCuda, SharedMemoryCarveoutIsBitIdentical) {
  TWELL_REQUIRE_GPU();
  for (const char* act : {"relu", "silu"}) {
    const TinySpec spec = agreement_spec(act);
    SCOPED_TRACE(act);
    const model::Model m = model::Model::load(write_tiny(std::string("carveout_") + act, spec).string());
    for (const bool pdl : {true, false})
      for (const int percent : {100, 0}) {
        SCOPED_TRACE(::testing::Message() << "smem-carveout=" << percent << (pdl ? ", programmatic" : ", plain"));
        model::RuntimeTuning asked, none;  // explicit: not TWELL_TUNING's
        asked.programmatic_launch = none.programmatic_launch = pdl;
        asked.union_min_rows = none.union_min_rows = 2;
        asked.smem_carveout = percent;
        auto a = model::make_runtime(m, "cuda", {FfnPath::automatic}, asked);
        auto b = model::make_runtime(m, "cuda", {FfnPath::automatic}, none);
        expect_bit_identical(spec, *a, *b);
        EXPECT_GT(a->graph_launches(), 0);
      }
  }
}

// RuntimeTuning::fused_decode (one-row forwards: the attention's add + RMSNorm, QKV, RoPE and cache
// store in one kernel, the FFN's residual add deferred, and on planned steps the add + RMSNorm
// before the FFN inside its step: folded into the one-token FFN kernels on a sparse ReLU layer, a
// separate add_rmsnorm before a dense plan) computes the same bits as the separate ops: the same
// logits, prefill and every decode step, on and off. ReLU at ≈ 2 % (the one-token kernels) and at
// 50 % (dense plans once measured), SiLU.
TEST(ModelCuda, FusedDecodeIsBitIdentical) {
  TWELL_REQUIRE_GPU();
  for (const char* act : {"relu", "relu-50pct", "silu"}) {
    TinySpec spec = agreement_spec(std::string(act) == "silu" ? "silu" : "relu");
    if (std::string(act) == "relu-50pct") spec.gate_threshold = 0.0f;
    SCOPED_TRACE(act);
    const model::Model m = model::Model::load(write_tiny(std::string("fused_") + act, spec).string());
    model::RuntimeTuning on, off;  // explicit: not TWELL_TUNING's
    on.fused_decode = true;
    on.fixed_point_decode = false;  // another summation of the FFN's output (FixedPointDecode... below)
    off.fused_decode = false;
    auto a = model::make_runtime(m, "cuda", {FfnPath::automatic}, on);
    auto b = model::make_runtime(m, "cuda", {FfnPath::automatic}, off);
    EXPECT_TRUE(a->fused_decode());
    EXPECT_FALSE(b->fused_decode());
    expect_bit_identical(spec, *a, *b);
    EXPECT_GT(a->graph_launches(), 0);
  }
}

// RuntimeTuning::dense_fold_norm (a batch-1 dense plan's norm inside its [Wg; Wu] GEMV, the down
// GEMV storing the residual; FfnLayer.DenseFoldedNormKeepsTheBits checks the layer takes it) gives
// the same logits as add_rmsnorm before the step, prefill and every decode step: ReLU at 50 % (dense
// plans once measured), with the fixed-point output setting on (no step takes it: the plans are
// dense) and off.
TEST(ModelCuda, DenseFoldNormIsBitIdentical) {
  TWELL_REQUIRE_GPU();
  {
    TinySpec spec = agreement_spec("relu");
    spec.gate_threshold = 0.0f;  // ≈ 50 % active: dense plans
    const model::Model m = model::Model::load(write_tiny("dense_fold_relu-50pct", spec).string());
    for (const bool fixed : {true, false}) {
      SCOPED_TRACE(fixed ? "fixed-point output on" : "off");
      model::RuntimeTuning on, off;  // explicit: not TWELL_TUNING's
      on.fixed_point_decode = off.fixed_point_decode = fixed;
      on.dense_fold_norm = 1;
      off.dense_fold_norm = 0;
      auto a = model::make_runtime(m, "cuda", {FfnPath::automatic}, on);
      auto b = model::make_runtime(m, "cuda", {FfnPath::automatic}, off);
      expect_bit_identical(spec, *a, *b);
      EXPECT_GT(a->graph_launches(), 0);
    }
  }
}

// RuntimeTuning::decode_neuron_order (the one-token FFN kernels' neurons most active first,
// reordered at decode steps 8, 16 and 32 of the 60 here) is a schedule: the same logits as the
// identity order, prefill and every decode step, with the fixed-point output and without it.
TEST(ModelCuda, DecodeNeuronOrderIsBitIdentical) {
  TWELL_REQUIRE_GPU();
  const TinySpec spec = agreement_spec("relu");
  const model::Model m = model::Model::load(write_tiny("neuron_order", spec).string());
  for (const bool fixed : {true, false}) {
    SCOPED_TRACE(fixed ? "fixed-point output" : "two kernels");
    model::RuntimeTuning on, off;  // explicit: not TWELL_TUNING's
    on.fixed_point_decode = off.fixed_point_decode = fixed;
    off.decode_neuron_order = false;
    auto a = model::make_runtime(m, "cuda", {FfnPath::automatic}, on);
    auto b = model::make_runtime(m, "cuda", {FfnPath::automatic}, off);
    expect_bit_identical(spec, *a, *b);
    EXPECT_GT(a->graph_launches(), 0);
    EXPECT_EQ(a->fixed_point_decode(), fixed);
  }
}

// The CUDA runtime of m with the fixed-point one-token FFN output (default) and without it.
std::pair<std::unique_ptr<Runtime>, std::unique_ptr<Runtime>> fixed_point_on_off(const model::Model& m) {
  model::RuntimeTuning on, off;  // explicit: not TWELL_TUNING's
  off.fixed_point_decode = false;
  return {model::make_runtime(m, "cuda", {FfnPath::automatic}, on), model::make_runtime(m, "cuda", {FfnPath::automatic}, off)};
}

// RuntimeTuning::fixed_point_decode: the one-token FFN's output as an exact fixed-point sum (one
// kernel a layer fewer) against the two-kernel FFN. Not the same bits: the fixed-point sum is
// exact before y's bf16 rounding where the down kernel rounds fp32 partial sums, so a column of y
// may land one bf16 step (2⁻⁸ relative) away, and that moves the next layers' inputs as any bf16
// rounding does; the logits stay within the GPU tests' bound (kTol, above). Prefill (many rows)
// is untouched: equal bits. The sparse layers took the one-token kernels on both.
TEST(ModelCuda, FixedPointDecodeAgreesWithTheTwoKernelFfn) {
  TWELL_REQUIRE_GPU();
  TinySpec spec = agreement_spec("relu");
  spec.layers = 3;
  const model::Model m = model::Model::load(write_tiny("fixed_decode", spec).string());
  auto [a, b] = fixed_point_on_off(m);
  ASSERT_TRUE(a->fixed_point_decode());
  EXPECT_FALSE(b->fixed_point_decode());
  Rng rng(spec.seed);
  std::vector<std::int32_t> prompt;
  for (int j = 0; j < 20; ++j) prompt.push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
  auto ka = a->new_sequence(spec.max_pos), kb = b->new_sequence(spec.max_pos);
  std::vector<SeqStep> sa{{ka.get(), prompt}}, sb{{kb.get(), prompt}};
  ASSERT_EQ(a->forward(sa, true), b->forward(sb, true)) << "prefill";
  double worst = 0;
  int differ = 0;
  std::int32_t next = 0;
  for (int step = 0; step < 100; ++step) {
    next = static_cast<std::int32_t>(rng.below(spec.vocab));
    sa[0].tokens = sb[0].tokens = std::span<const std::int32_t>(&next, 1);
    const auto la = a->forward(sa), lb = b->forward(sb);
    worst = std::max(worst, rel_diff(la, lb));
    differ += la != lb;
  }
  EXPECT_LE(worst, kTol);
  EXPECT_TRUE(a->fixed_point_decode()) << "a step overflowed";
  EXPECT_GT(a->graph_launches(), 50);
  for (const Runtime* rt : {a.get(), b.get()})
    for (const auto& s : rt->ffn_stats()) EXPECT_GE(s.sparse_rows, 90) << "the one-token kernels did not run";
  std::printf("fixed-point against two-kernel decode: %d of 100 steps' logits differ, worst %.2e of the logit scale\n",
              differ, worst);
}

// A step takes the fixed point only where every layer's plan does (all or nothing): a model whose
// first and last layers measure ≈ 50 % dense (dense plans) and whose middle one is sparse never
// does, and its decode equals the two-kernel runtime's bit for bit.
TEST(ModelCuda, FixedPointDecodeStaysOffForMixedPlans) {
  TWELL_REQUIRE_GPU();
  TinySpec spec = agreement_spec("relu");
  spec.layers = 3;
  spec.layer_gate_threshold = {0.0f, -0.6f, 0.0f};
  const model::Model m = model::Model::load(write_tiny("fixed_mixed", spec).string());
  auto [a, b] = fixed_point_on_off(m);
  expect_bit_identical(spec, *a, *b);
  EXPECT_TRUE(a->fixed_point_decode());
  const auto stats = a->ffn_stats();
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_GT(stats[1].sparse_rows, 0) << "the middle layer ran its one-token kernels";
  EXPECT_LT(stats[0].sparse_rows, stats[0].rows / 2) << "the first layer measured dense";
}

// A one-token FFN output past the fixed-point range (down projections scaled by 2³⁰: terms of
// ≈ 10⁷, past 2^(31 − ⌈log2 600⌉) = 2²¹) raises the flag; the runtime runs that step again the
// two-kernel way and keeps to it: every logit equals the runtime that never used the fixed point,
// bit for bit (the sequences rewound, their cache rows rewritten), and nothing is lost. The
// decode threshold is 1 on both runtimes: the first layer's scaled output makes the second layer's
// density seed-dependent (16 % on some seeds: a dense plan there would keep every step off the
// fixed point, and no step could overflow; 1 seed in 6 did until session 48).
TEST(ModelCuda, FixedPointOverflowRunsTheStepAgain) {
  TWELL_REQUIRE_GPU();
  TinySpec spec = agreement_spec("relu");
  spec.down_scale = 1073741824.0f;
  const model::Model m = model::Model::load(write_tiny("fixed_overflow", spec).string());
  model::RuntimeTuning on, off;  // explicit: not TWELL_TUNING's
  on.decode_max_density = off.decode_max_density = 1.0;  // every layer's decode steps sparse
  off.fixed_point_decode = false;
  auto a = model::make_runtime(m, "cuda", {FfnPath::automatic}, on);
  auto b = model::make_runtime(m, "cuda", {FfnPath::automatic}, off);
  ASSERT_TRUE(a->fixed_point_decode());
  expect_bit_identical(spec, *a, *b);
  std::string layers;  // what each layer ran, for a failure's message
  for (const auto& st : a->ffn_stats())
    layers += " [" + std::to_string(st.sparse_rows) + " of " + std::to_string(st.rows) + " rows sparse, density " +
              std::to_string(st.last_density) + "]";
  EXPECT_FALSE(a->fixed_point_decode()) << "no step overflowed: the test's model does not reach the range;" << layers;
  EXPECT_GT(a->graph_launches(), 0);
}

// A prefill of ≥ 2048 rows lets the FFN engine split hot neurons off, which moves each layer's
// weights to new buffers; decode graphs captured before must be captured again, not replayed
// against the freed ones. A 50 % dense ReLU model (every neuron qualifies as hot, so the split
// happens): decode steps of 3 sequences (captured, replayed), a prefill of 9 × 240 other tokens
// (2160 rows), then more decode steps of the first 3, graphed against eager, bit for bit.
TEST(ModelCuda, DecodeGraphsFollowWeightsThatMove) {
  TWELL_REQUIRE_GPU();
  TinySpec spec;
  spec.bf16 = true;
  spec.max_pos = 320;
  spec.act = "relu";
  spec.bias_channel = true;
  spec.gate_threshold = 0.0f;
  spec.intermediate = 600;
  spec.seed = fresh_seed();
  const model::Model m = model::Model::load(write_tiny("graphs_moving_weights", spec).string());
  model::RuntimeTuning eager_tuning, graph_tuning;  // explicit: not TWELL_TUNING's
  eager_tuning.cuda_graphs = false;
  auto eager = model::make_runtime(m, "cuda", {FfnPath::automatic}, eager_tuning);
  auto graphed = model::make_runtime(m, "cuda", {FfnPath::automatic}, graph_tuning);
  Rng rng(spec.seed);
  const auto tokens = [&](std::size_t n) {
    std::vector<std::int32_t> t(n);
    for (auto& v : t) v = static_cast<std::int32_t>(rng.below(spec.vocab));
    return t;
  };
  std::vector<std::vector<std::int32_t>> prompts = {tokens(20), tokens(27), tokens(34)};
  std::vector<std::unique_ptr<Sequence>> a, b;
  std::vector<SeqStep> sa, sb;
  for (const auto& p : prompts) {
    a.push_back(eager->new_sequence(spec.max_pos));
    b.push_back(graphed->new_sequence(spec.max_pos));
    sa.push_back({a.back().get(), p});
    sb.push_back({b.back().get(), p});
  }
  ASSERT_EQ(eager->forward(sa), graphed->forward(sb));
  std::vector<std::int32_t> next(prompts.size());
  const auto decode = [&](int steps, const char* when) {
    for (int step = 0; step < steps; ++step) {
      for (std::size_t i = 0; i < next.size(); ++i) {
        next[i] = static_cast<std::int32_t>(rng.below(spec.vocab));
        sa[i].tokens = std::span<const std::int32_t>(&next[i], 1);
        sb[i].tokens = sa[i].tokens;
      }
      const std::vector<float> la = eager->forward(sa), lb = graphed->forward(sb);
      ASSERT_EQ(la.size(), lb.size());
      ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << when << ", decode step " << step;
    }
  };
  decode(6, "before the long prefill");
  const std::int64_t replays = graphed->graph_launches();
  EXPECT_GE(replays, 3) << "graphs replayed before the prefill";
  {  // 9 × 240 = 2160 rows in one call: the engine calibrates hot neurons and moves the weights
    std::vector<std::unique_ptr<Sequence>> la, lb;
    std::vector<SeqStep> pa, pb;
    std::vector<std::vector<std::int32_t>> long_prompts;
    for (int i = 0; i < 9; ++i) long_prompts.push_back(tokens(240));
    for (const auto& p : long_prompts) {
      la.push_back(eager->new_sequence(spec.max_pos));
      lb.push_back(graphed->new_sequence(spec.max_pos));
      pa.push_back({la.back().get(), p});
      pb.push_back({lb.back().get(), p});
    }
    ASSERT_EQ(eager->forward(pa), graphed->forward(pb)) << "the long prefill";
  }
  decode(6, "after the long prefill");
  EXPECT_GE(graphed->graph_launches() - replays, 3) << "graphs captured again and replayed";
}

// A model whose weights cannot fit the GPU is refused by a size estimate before any upload (the
// weights are never read: a 2B config with 100 000 layers claims ≈ 8 TB).
TEST(ModelCuda, RefusesAModelLargerThanTheGpu) {
  TWELL_REQUIRE_GPU();
  model::Model m;
  m.config = model::preset_config("2b");
  m.config.num_layers = 100000;
  try {
    model::make_runtime(m, "cuda");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("GB of GPU memory"), std::string::npos) << e.what();
  }
}

// How much a sequence's logits move with the company it is decoded in (the server batches whatever
// requests are running): one sequence decoded alone, and the same sequence with the same tokens
// decoded among 7 and among 19 others (batch 20: past the one-token FFN kernels' row limit, so the
// batched GEMM paths), in runtimes of their own (the same dispatch history). The GPU runs other
// kernels by batch size with bf16 activations, so the bits may differ; they must stay within the
// bf16 bound that holds against the CPU runtime (kTol). Prints the largest difference and how many
// steps were bit-identical (docs/serving.md "Determinism" quotes them).
TEST(ModelCuda, BatchCompanyMovesLogitsWithinTheBf16Bound) {
  TWELL_REQUIRE_GPU();
  for (const char* act : {"relu", "silu"}) {
    SCOPED_TRACE(act);
    const TinySpec spec = agreement_spec(act);
    const model::Model m = model::Model::load(write_tiny(std::string("company_") + act, spec).string());
    const auto V = static_cast<std::size_t>(spec.vocab);
    for (const std::size_t batch : {8u, 20u}) {
      auto solo = model::make_runtime(m, "cuda", {FfnPath::automatic}, model::RuntimeTuning{});
      auto crowd = model::make_runtime(m, "cuda", {FfnPath::automatic}, model::RuntimeTuning{});
      Rng rng(spec.seed + batch);
      std::vector<std::vector<std::int32_t>> prompts(batch);
      for (std::size_t i = 0; i < batch; ++i)
        for (std::size_t j = 0; j < 24 + 5 * (i % 12); ++j)  // at most 79 tokens: + 61 calls fit max_pos
          prompts[i].push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
      auto alone = solo->new_sequence(spec.max_pos);
      std::vector<std::unique_ptr<Sequence>> kv;
      std::vector<SeqStep> steps;
      for (std::size_t i = 0; i < batch; ++i) {
        kv.push_back(crowd->new_sequence(spec.max_pos));
        steps.push_back({kv.back().get(), prompts[i]});
      }
      SeqStep one{alone.get(), prompts[0]};
      double worst = 0;
      int identical = 0, same_argmax = 0;
      constexpr int kSteps = 60;
      std::vector<std::int32_t> next(batch);
      for (int s = 0; s <= kSteps; ++s) {  // s = 0: the prefill
        if (s > 0)
          for (std::size_t i = 0; i < batch; ++i) {
            next[i] = static_cast<std::int32_t>(rng.below(spec.vocab));
            steps[i].tokens = std::span<const std::int32_t>(&next[i], 1);
          }
        one.tokens = steps[0].tokens;
        const std::vector<float> a = solo->forward(std::span<const SeqStep>(&one, 1));
        const std::vector<float> all = crowd->forward(steps);
        const std::vector<float> b(all.begin(), all.begin() + static_cast<long>(V));  // sequence 0's row
        worst = std::max(worst, rel_diff(a, b));
        identical += a == b;
        same_argmax += std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin();
      }
      std::printf("[company] %s, batch %zu: %d of %d calls bit-identical to the solo run, argmax equal in %d, largest "
                  "difference %.3g of the logit scale\n",
                  act, batch, identical, kSteps + 1, same_argmax, worst);
      EXPECT_LE(worst, kTol) << "batch " << batch;
    }
  }
}

// Batched sparse decode keeps the dense path's greedy tokens. A ReLU model at ≈ 0.1–0.9 % (the CPU
// runtime's count over 12 seeds) generates greedily on two GPU runtimes: the dense FFN everywhere,
// and the sparse decode paths at every step (decode-max-density 1, so no count sends a step
// dense): 3 rows the decode kernel, 4–24 rows the union FFN on a compute-capability-9.0 GPU
// (elsewhere the decode kernel up to 16 rows and the dispatch past them), N = 1024 and K = 256 on
// the union's grid; the gate on cuBLASLt, then up to 16 rows on the GEMV (decode-gemv-max-rows 16:
// before the union as well). Every decode row of every layer
// must have run sparse where the step is decode-sized; the tokens must agree up to a first
// difference where the CPU runtime's top two logits are a tie (the GPU paths sum in other orders,
// each within its float64 bound).
TEST(ModelCuda, BatchedSparseDecodeKeepsTheDenseGreedyTokens) {
  TWELL_REQUIRE_GPU();
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  const bool union_gpu = cuda::union_ffn_available(dev);
  TinySpec spec;
  spec.act = "relu";
  spec.bf16 = true;
  spec.bias_channel = true;
  spec.gate_threshold = -0.45f;
  spec.intermediate = 1024;
  spec.hidden = 256;
  spec.max_pos = 160;
  spec.seed = fresh_seed();
  const model::Model m = model::Model::load(write_tiny("batched_sparse", spec).string());
  auto cpu = model::make_runtime(m, "cpu");
  auto dense = model::make_runtime(m, "cuda", {FfnPath::dense}, model::RuntimeTuning{});
  model::RuntimeTuning always_sparse;
  always_sparse.decode_max_density = 1.0;
  model::GenerateOptions o;
  o.max_new_tokens = 20;
  o.ignore_eos = true;
  for (const bool gemv_gate : {false, true}) {
    for (const std::size_t batch : {3u, 4u, 8u, 24u}) {
      SCOPED_TRACE(::testing::Message() << "batch " << batch << (gemv_gate ? ", GEMV gate" : ""));
      always_sparse.decode_gemv_max_rows = gemv_gate ? 16 : 1;  // 1: cuBLASLt's gate from 2 rows
      auto sparse = model::make_runtime(m, "cuda", {FfnPath::automatic}, always_sparse);
      Rng rng(spec.seed + batch);
      std::vector<std::vector<std::int32_t>> prompts(batch);
      for (std::size_t i = 0; i < batch; ++i)
        for (std::size_t j = 0; j < 5 + 3 * (i % 7); ++j) prompts[i].push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
      const auto a = model::generate(*dense, prompts, o), b = model::generate(*sparse, prompts, o);
      // The decode steps: max_new_tokens − 1 of them (the prefill gives the first token), batch rows each.
      const auto decode_rows = static_cast<std::int64_t>(batch) * (o.max_new_tokens - 1);
      const auto decode_sized = [&](std::int64_t rows) { return rows <= 16 || (union_gpu && rows <= 32); };
      // The prompts' prefill is one call of all their rows: decode-sized (so sparse) up to 16 rows,
      // 32 with the union; a layer's sparse rows count it too.
      std::int64_t prefill_rows = 0;
      for (const auto& pr : prompts) prefill_rows += static_cast<std::int64_t>(pr.size());
      const std::int64_t sparse_prefill = decode_sized(prefill_rows) ? prefill_rows : 0;
      std::int64_t least_sparse = -1;
      for (const model::FfnLayerStats& st : sparse->ffn_stats()) {
        least_sparse = least_sparse < 0 ? st.sparse_rows : std::min(least_sparse, st.sparse_rows);
      }
      if (decode_sized(static_cast<std::int64_t>(batch))) {
        EXPECT_GE(least_sparse, decode_rows + sparse_prefill) << "a layer ran some decode rows dense";
      }
      std::size_t agree = 0, total = 0;
      for (std::size_t i = 0; i < batch; ++i) {
        agree += expect_difference_at_a_tie(*cpu, prompts[i], a[i].tokens, b[i].tokens,
                                            "sequence " + std::to_string(i) + ", sparse against dense");
        total += a[i].tokens.size();
      }
      const char* ffn = batch < 4                      ? "decode kernel"
                        : union_gpu && batch <= 32       ? "union FFN"
                        : batch <= 16                    ? "decode kernel"
                                                         : "dispatch";
      std::printf("[batched sparse] batch %zu (%s, gate on %s): %zu of %zu tokens agree before a first difference; sparse "
                  "rows a layer at least %lld of %lld (decode rows, and the prefill's where it is decode-sized)\n",
                  batch, ffn, gemv_gate && batch <= 16 ? "the GEMV" : "cuBLASLt", agree, total,
                  static_cast<long long>(least_sparse), static_cast<long long>(decode_rows + sparse_prefill));
    }
  }
}

// A paged sequence (blocks from a pool, in whatever order the pool hands them out) computes what a
// sequence of fixed capacity computes, bit for bit: the same kernels read and write the same values
// through its block table. Two runtimes given the same calls (so the FFN engine dispatches alike),
// one with fixed caches, one with three paged sequences whose blocks interleave: a fresh prefill by
// cuDNN (built at a shape's first call; the runtime's tensor-core kernel where there is no cuDNN),
// chunks of 16 (tensor-core attention) and 5 (the plain kernel) over block boundaries, then 60
// decode steps (planned and graph-captured). ReLU (the FFN engine), SiLU, and SiLU with a sliding
// window shorter than the prompts.
TEST(ModelCuda, PagedSequencesMatchFixedOnesBitForBit) {
  TWELL_REQUIRE_GPU();
  for (const char* act : {"relu", "silu", "silu-window"}) {
    SCOPED_TRACE(act);
    const TinySpec spec = agreement_spec(std::string(act) == "relu" ? "relu" : "silu");
    model::Model m = model::Model::load(write_tiny(std::string("paged_") + act, spec).string());
    if (std::string(act) == "silu-window") m.config.sliding_window = 13;
    model::RuntimeTuning t;  // explicit: not TWELL_TUNING's
    t.cudnn_build_at = 1;
    auto a = model::make_runtime(m, "cuda", {FfnPath::automatic}, t);
    auto b = model::make_runtime(m, "cuda", {FfnPath::automatic}, t);
    auto pool = b->make_kv_pool(40);
    constexpr std::size_t kSeqs = 3;
    std::vector<std::unique_ptr<Sequence>> fixed, paged;
    for (std::size_t i = 0; i < kSeqs; ++i) {
      fixed.push_back(a->new_sequence(spec.max_pos));
      paged.push_back(b->new_paged_sequence(pool));
    }
    auto step = [&](const std::vector<std::span<const std::int32_t>>& toks, bool all) {
      std::vector<SeqStep> sa, sb;
      for (std::size_t i = 0; i < kSeqs; ++i) {
        if (toks[i].empty()) continue;
        EXPECT_TRUE(paged[i]->reserve(static_cast<std::int64_t>(toks[i].size())));
        sa.push_back({fixed[i].get(), toks[i]});
        sb.push_back({paged[i].get(), toks[i]});
      }
      return std::pair(a->forward(sa, all), b->forward(sb, all));
    };
    Rng rng(spec.seed);
    std::vector<std::vector<std::int32_t>> prompts(kSeqs);
    for (std::size_t i = 0; i < kSeqs; ++i)
      for (std::size_t j = 0; j < 32 + 11 * i; ++j) prompts[i].push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
    // 32 / 43 / 54 tokens: a fresh chunk of 16 each, then 16, 16 and 5 as far as each prompt goes.
    std::size_t at = 0;
    for (const std::size_t len : {16u, 16u, 16u, 5u}) {
      std::vector<std::span<const std::int32_t>> toks(kSeqs);
      for (std::size_t i = 0; i < kSeqs; ++i) {
        const std::size_t n = prompts[i].size();
        toks[i] = std::span<const std::int32_t>(prompts[i].data() + std::min(at, n), at < n ? std::min(len, n - at) : 0);
      }
      const auto [x, y] = step(toks, true);
      ASSERT_EQ(x.size(), y.size());
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << "prefill chunk from " << at;
      at += len;
    }
    std::vector<std::int32_t> next(kSeqs);
    for (int s = 0; s < 60; ++s) {
      std::vector<std::span<const std::int32_t>> toks(kSeqs);
      for (std::size_t i = 0; i < kSeqs; ++i) {
        next[i] = static_cast<std::int32_t>(rng.below(spec.vocab));
        toks[i] = std::span<const std::int32_t>(&next[i], 1);
      }
      const auto [x, y] = step(toks, false);
      ASSERT_EQ(x, y) << "decode step " << s;
    }
    EXPECT_GT(b->graph_launches(), 0);
    // 92 / 103 / 114 positions: 6 + 7 + 8 blocks of 16.
    EXPECT_EQ(paged[0]->blocks() + paged[1]->blocks() + paged[2]->blocks(), 21);
    EXPECT_EQ(pool->free_blocks(), 40 - 21);
    paged.clear();
    EXPECT_EQ(pool->free_blocks(), 40);
  }
}

// Prefix sharing on the GPU (the CPU test's case, ModelCpu.PagedSequencesShareFullPrefixBlocks): B
// starts on A's two full blocks of the same 32 tokens and computes, bit for bit, what a fixed
// sequence fed the same calls computes; the shared blocks reach the device through B's block table.
TEST(ModelCuda, PagedSequencesShareFullPrefixBlocks) {
  TWELL_REQUIRE_GPU();
  const TinySpec spec = agreement_spec("silu");
  const model::Model m = model::Model::load(write_tiny("cuda_prefix", spec).string());
  // One prefill attention for A's and C's 32-token calls (cuDNN would take a shape's second call
  // only, and its outputs differ from the own kernel's in the last bits, so would later layers' keys).
  model::RuntimeTuning t;
  t.cudnn_attention = false;
  auto rt = model::make_runtime(m, "cuda", {FfnPath::automatic}, t);
  Rng rng(spec.seed);
  std::vector<std::int32_t> pa, pb;
  for (int i = 0; i < 32; ++i) pa.push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
  pb = pa;
  for (int i = 0; i < 8; ++i) {
    pa.push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
    pb.push_back(static_cast<std::int32_t>(rng.below(spec.vocab)));
  }
  auto pool = rt->make_kv_pool(16);
  auto feed = [&](Sequence& q, std::span<const std::int32_t> toks) {
    EXPECT_TRUE(q.reserve(static_cast<std::int64_t>(toks.size())));
    SeqStep st{&q, toks};
    return rt->forward(std::span<const SeqStep>(&st, 1), /*all_positions=*/true);
  };
  auto a = rt->new_paged_sequence(pool, pa);
  feed(*a, std::span<const std::int32_t>(pa).first(32));
  feed(*a, std::span<const std::int32_t>(pa).subspan(32));
  auto b = rt->new_paged_sequence(pool, pb);
  EXPECT_EQ(b->length(), 32);
  EXPECT_EQ(pool->free_blocks(), 16 - 3);
  auto c = rt->new_sequence(64);
  feed(*c, std::span<const std::int32_t>(pb).first(32));
  const auto lb = feed(*b, std::span<const std::int32_t>(pb).subspan(32));
  const auto lc = feed(*c, std::span<const std::int32_t>(pb).subspan(32));
  ASSERT_EQ(lb.size(), lc.size());
  EXPECT_EQ(std::memcmp(lb.data(), lc.data(), lb.size() * sizeof(float)), 0) << "B on A's blocks vs C computing them";
  a.reset();
  b.reset();
  // Both gone: A's two full blocks stay published and free (the prefix cache), and a sequence that
  // starts on them computes what C computed, bit for bit.
  EXPECT_EQ(pool->free_blocks(), 16);
  EXPECT_EQ(pool->cached_blocks(), 2);
  auto d = rt->new_paged_sequence(pool, pb);
  EXPECT_EQ(d->length(), 32);
  const auto ld = feed(*d, std::span<const std::int32_t>(pb).subspan(32));
  EXPECT_EQ(std::memcmp(ld.data(), lc.data(), ld.size() * sizeof(float)), 0) << "D on cached blocks vs C";
  d.reset();
  // Sequences that need every block take the cached ones too: the prefix is gone.
  std::vector<std::unique_ptr<Sequence>> all;
  for (int i = 0; i < 4; ++i) {
    all.push_back(rt->new_paged_sequence(pool));
    EXPECT_TRUE(all.back()->reserve(4 * model::kKvBlockTokens));
  }
  EXPECT_EQ(pool->free_blocks(), 0);
  all.clear();
  EXPECT_EQ(pool->cached_blocks(), 0);
  EXPECT_EQ(rt->new_paged_sequence(pool, pb)->length(), 0);
}

// The GPU pool's accounting and refusals: a reserve the pool cannot meet takes nothing; a pool
// larger than the GPU's free memory is an error that says so; another runtime's pool is refused;
// TWELL_TUNING=no-paged-kv refuses pools as unsupported (the server's fallback).
TEST(ModelCuda, KvPoolRefusesWhatItCannotHold) {
  TWELL_REQUIRE_GPU();
  TinySpec s;
  const model::Model m = model::Model::load(write_tiny("cuda_pool", s).string());
  auto gpu = model::make_runtime(m, "cuda", {}, model::RuntimeTuning{});
  auto other = model::make_runtime(m, "cuda", {}, model::RuntimeTuning{});
  auto pool = gpu->make_kv_pool(3);
  EXPECT_EQ(pool->total_blocks(), 3);
  auto x = gpu->new_paged_sequence(pool), y = gpu->new_paged_sequence(pool);
  EXPECT_TRUE(x->reserve(17));
  EXPECT_EQ(x->blocks(), 2);
  EXPECT_EQ(x->capacity(), 32);
  EXPECT_FALSE(y->reserve(17));
  EXPECT_EQ(y->blocks(), 0);
  EXPECT_EQ(pool->free_blocks(), 1);
  EXPECT_FALSE(x->reserve(s.max_pos + 1));  // past the context
  EXPECT_THROW(other->new_paged_sequence(pool), Error);
  try {
    (void)gpu->make_kv_pool(std::int64_t{1} << 40);
    ADD_FAILURE() << "a pool larger than the GPU was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("GB of GPU memory"), std::string::npos) << e.what();
  }
  model::RuntimeTuning fixed_only;
  fixed_only.paged_kv = false;
  auto nopage = model::make_runtime(m, "cuda", {}, fixed_only);
  try {
    (void)nopage->make_kv_pool(3);
    ADD_FAILURE() << "no-paged-kv made a pool";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
  }
}

TEST(ModelCuda, RejectsForeignSequencesAndBadTokens) {
  TWELL_REQUIRE_GPU();
  TinySpec s;
  const model::Model m = model::Model::load(write_tiny("cuda_bad", s).string());
  auto cpu = model::make_runtime(m, "cpu");
  auto gpu = model::make_runtime(m, "cuda");
  auto cs = cpu->new_sequence(8);
  std::vector<std::int32_t> t = {1, 2}, bad = {static_cast<std::int32_t>(s.vocab)};
  SeqStep foreign{cs.get(), t};
  EXPECT_THROW(gpu->forward(std::span<const SeqStep>(&foreign, 1)), Error);
  auto gs = gpu->new_sequence(8);
  SeqStep b{gs.get(), bad};
  EXPECT_THROW(gpu->forward(std::span<const SeqStep>(&b, 1)), Error);
  EXPECT_EQ(gs->length(), 0);
  EXPECT_THROW(gpu->new_sequence(s.max_pos + 1), Error);
}

}  // namespace
}  // namespace twell::test
