// The CPU model runtime: loading and its errors, KV-cache consistency, batching, the sparse FFN
// path against the dense one, sampling and generation. Parity with an independent float64
// reference is in model_parity.py.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <filesystem>
#include <fstream>

#include "tiny_model.hpp"
#include "twell/model/activation_profile.hpp"
#include "twell/model/generate.hpp"
#include "twell/model/runtime.hpp"

#include <nlohmann/json.hpp>

namespace twell::test {
namespace {

using model::CpuRuntime;
using model::Sequence;
using model::Model;
using model::SeqStep;

std::vector<std::int32_t> random_tokens(Rng& rng, std::int64_t n, std::int64_t vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& e : t) e = static_cast<std::int32_t>(rng.below(vocab));
  return t;
}

// max |a − b| / max |b|
double rel_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0, m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
    m = std::max(m, static_cast<double>(std::fabs(b[i])));
  }
  return d / std::max(m, 1e-30);
}

// Logits of every position, fed in one call or in chunks of `chunk` tokens (exercises the cache).
std::vector<float> run(model::Runtime& rt, const std::vector<std::int32_t>& toks, std::size_t chunk) {
  auto kv = rt.new_sequence(static_cast<std::int64_t>(toks.size()));
  std::vector<float> all;
  for (std::size_t i = 0; i < toks.size(); i += chunk) {
    std::span<const std::int32_t> part(toks.data() + i, std::min(chunk, toks.size() - i));
    SeqStep s{kv.get(), part};
    auto l = rt.forward(std::span<const SeqStep>(&s, 1), /*all_positions=*/true);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

// fp32 throughout: feeding tokens one at a time through the cache, in chunks, or all at once
// changes only the order of fp32 sums (GEMM blocking), so the logits agree to a few fp32 ulps of
// their magnitude accumulated over the layers: 1e-5 relative is > 50× that.
TEST(ModelCpu, CacheChunksMatchOneCall) {
  TinySpec s;
  s.act = "silu";
  s.seed = fresh_seed();
  const Model m = Model::load(write_tiny("chunks", s).string());
  CpuRuntime rt(m);
  Rng rng(s.seed);
  const auto toks = random_tokens(rng, 37, s.vocab);
  const auto full = run(rt, toks, toks.size());
  for (std::size_t chunk : {1u, 5u, 16u}) {
    const auto part = run(rt, toks, chunk);
    ASSERT_EQ(part.size(), full.size());
    EXPECT_LT(rel_diff(part, full), 1e-5) << "chunk " << chunk;
  }
}

// RuntimeTuning::cpu_bf16_weights: a bf16 checkpoint's matrices are bf16 values, so steps of ≤ 8
// rows read their bf16 copies; the products are the same, only the fp32 sums' order differs (as
// between chunkings above: 1e-5 relative). Chunks of 1 and 5 tokens take the bf16 copies, a whole
// 37-token prompt OpenBLAS's fp32 GEMM. Weights that are not bf16 values, or a runtime with an
// ffn_input_hook (which may change them), keep fp32 alone; weight_storage() says which.
TEST(ModelCpu, Bf16WeightCopiesGiveTheSameLogits) {
  for (const char* act : {"silu", "relu"}) {
    TinySpec s;
    s.act = act;
    s.bf16 = true;
    s.tied = false;
    s.seed = fresh_seed();
    SCOPED_TRACE(act);
    const Model m = Model::load(write_tiny(std::string("bf16_") + act, s).string());
    model::RuntimeTuning on, off;  // explicit: not TWELL_TUNING's
    off.cpu_bf16_weights = false;
    const model::RuntimeOptions dense(model::FfnPath::dense);
    CpuRuntime with(m, dense, on), without(m, dense, off);
    const std::string storage = with.weight_storage();
    EXPECT_NE(storage.find("11 of 11 matrices also as bf16"), std::string::npos) << storage;  // 2 layers × 5 + head
    EXPECT_EQ(without.weight_storage(), "fp32");
    Rng rng(s.seed);
    const auto toks = random_tokens(rng, 37, s.vocab);
    const auto want = run(without, toks, toks.size());
    for (std::size_t chunk : {1u, 5u, 37u}) {
      const auto got = run(with, toks, chunk);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_LT(rel_diff(got, want), 1e-5) << "chunk " << chunk;
    }
  }
  TinySpec f32;
  f32.seed = fresh_seed();
  const Model m = Model::load(write_tiny("f32_weights", f32).string());
  EXPECT_EQ(CpuRuntime(m, {}, model::RuntimeTuning{}).weight_storage(), "fp32 (the weights are not bf16 values)");
  TinySpec b;
  b.bf16 = true;
  const Model mb = Model::load(write_tiny("bf16_hook", b).string());
  model::RuntimeOptions hooked;
  hooked.ffn_input_hook = [](std::int64_t, CMatrixF) {};
  EXPECT_EQ(CpuRuntime(mb, hooked, model::RuntimeTuning{}).weight_storage(), "fp32");
}

// A bf16-only load's matrices view the mapped file; a reader of the views (the CUDA runtime's
// upload) asks check_mapped_files() first: a file changed in place since the load (here grown by a
// byte, which cannot fault the test itself) is refused by name; a file replaced by another (a new
// file renamed over it, as twell's writers do) is fine — the mapping keeps the old one.
TEST(ModelCpu, MappedFilesChangedInPlaceAreRefused) {
  TinySpec s;
  s.bf16 = true;
  s.seed = fresh_seed();
  const auto dir = write_tiny("mapped_changed", s);
  const std::string path = (dir / "model.safetensors").string();
  model::LoadOptions lo;
  lo.bf16_only = true;
  {
    const Model m = Model::load(dir.string(), lo);
    ASSERT_EQ(m.mapped_files.size(), 1u);
    EXPECT_NO_THROW(m.check_mapped_files());
    std::ofstream(path, std::ios::binary | std::ios::app) << ' ';
    try {
      m.check_mapped_files();
      ADD_FAILURE() << "a file changed in place was not noticed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("changed in place"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  const auto fresh = write_tiny("mapped_changed", s);  // the same directory, written anew
  const Model m = Model::load(fresh.string(), lo);
  const std::vector<std::uint16_t> before = m.embed16.to_vector();
  const io::SafetensorsFile f = io::read_safetensors(path);
  std::vector<io::TensorRef> refs;
  for (const auto& [n, h] : f.tensors) refs.push_back({n, &h});
  io::write_safetensors(path, refs);  // a temporary file renamed over the old one
  EXPECT_NO_THROW(m.check_mapped_files());
  EXPECT_EQ(m.embed16.to_vector(), before);
  EXPECT_TRUE(Model::load(dir.string()).mapped_files.empty());  // an fp32 load maps nothing it keeps
  TinySpec f32 = s;
  f32.bf16 = false;
  const auto dir32 = write_tiny("mapped_fp32", f32);
  EXPECT_TRUE(Model::load(dir32.string(), lo).mapped_files.empty());  // bf16-only of an fp32 file: its own copies
}

// A mapped file truncated in place under a bf16-only model: reading the views (to_vector, as the
// runtimes' copies do) is an io Error naming the change, not a SIGBUS that ends the process.
TEST(ModelCpu, TruncatedMappedFileIsAnErrorNotACrash) {
  TinySpec s;
  s.bf16 = true;
  s.seed = fresh_seed();
  const auto dir = write_tiny("mapped_truncated", s);
  const std::string path = (dir / "model.safetensors").string();
  model::LoadOptions lo;
  lo.bf16_only = true;
  const Model m = Model::load(dir.string(), lo);
  ASSERT_EQ(m.mapped_files.size(), 1u);
  ASSERT_TRUE(m.embed16.pieces.at(0).mapped);
  EXPECT_NO_THROW((void)m.layers.back().w_down16.to_vector());
  std::filesystem::resize_file(path, 0);
  try {
    (void)m.layers.back().w_down16.to_vector();
    ADD_FAILURE() << "a read past the truncated file's end did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

// A file whose data buffer starts at an odd offset (a writer that does not pad its header, as the
// format allows): its bf16 and fp32 tensors cannot be viewed in place (misaligned), so both load
// forms read them instead — the same model either way.
TEST(ModelCpu, MisalignedTensorsAreReadNotViewed) {
  for (const bool bf16_file : {false, true}) {
    SCOPED_TRACE(bf16_file ? "bf16 file" : "fp32 file");
    TinySpec s;
    s.bf16 = bf16_file;
    s.seed = fresh_seed();
    const auto dir = write_tiny("aligned", s);
    const auto odd = tiny_dir("misaligned");
    std::filesystem::copy_file(dir / "config.json", odd / "config.json");
    // The same bytes with one more space at the header's end: every tensor one byte further on.
    std::ifstream in(dir / "model.safetensors", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    ASSERT_EQ(n % 2, 0u);
    bytes.insert(bytes.begin() + static_cast<long>(8 + n), ' ');
    ++n;
    std::memcpy(bytes.data(), &n, 8);
    std::ofstream(odd / "model.safetensors", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    for (const bool b16 : {false, true}) {
      model::LoadOptions lo;
      lo.bf16_only = b16;
      const Model a = Model::load(dir.string(), lo), b = Model::load(odd.string(), lo);
      EXPECT_EQ(a.embed, b.embed);
      for (std::size_t l = 0; l < a.layers.size(); ++l) {
        EXPECT_EQ(a.layers[l].w_down, b.layers[l].w_down) << "layer " << l;
        EXPECT_EQ(a.layers[l].wqkv, b.layers[l].wqkv) << "layer " << l;
      }
      if (b16) {
        EXPECT_EQ(a.embed16.to_vector(), b.embed16.to_vector());
        for (std::size_t l = 0; l < a.layers.size(); ++l) {
          EXPECT_EQ(a.layers[l].wqkv16.to_vector(), b.layers[l].wqkv16.to_vector()) << "layer " << l;
          EXPECT_EQ(a.layers[l].w_down16.to_vector(), b.layers[l].w_down16.to_vector()) << "layer " << l;
          for (const auto& p : b.layers[l].w_down16.pieces) EXPECT_FALSE(p.mapped) << "layer " << l;
          for (const auto& p : a.layers[l].w_down16.pieces) EXPECT_EQ(p.mapped, bf16_file) << "layer " << l;
        }
      }
    }
  }
}

// The CPU runtime's bf16 decode weights are taken from the model's fp32 values when it is made
// (its own copies, never views of the file, which could change under a long-lived runtime):
// weights changed after the load (here doubled: still bf16 values) are decoded as changed — the
// runtime on the changed model gives the bits of a runtime on a model loaded from a file that
// holds the changed weights, and not those of the unchanged model.
TEST(ModelCpu, ChangedWeightsAreDecodedAsChanged) {
  TinySpec s;
  s.bf16 = true;
  s.tied = false;
  s.seed = fresh_seed();
  const auto dir = write_tiny("bf16_views", s);
  Model changed = Model::load(dir.string());
  const Model original = Model::load(dir.string());
  EXPECT_TRUE(changed.layers[0].w_gate16.empty());  // an fp32 load keeps no bf16 form
  // Double layer 0's gate and layer 1's QKV, in the model and in a second file.
  for (float& v : changed.layers[0].w_gate) v *= 2.0f;
  for (float& v : changed.layers[1].wqkv) v *= 2.0f;
  io::SafetensorsFile f = io::read_safetensors((dir / "model.safetensors").string());
  std::vector<io::TensorRef> refs;
  for (auto& [n, h] : f.tensors) {
    if (n == "model.layers.0.mlp.gate_proj.weight" || n.starts_with("model.layers.1.self_attn.q_proj") ||
        n.starts_with("model.layers.1.self_attn.k_proj") || n.starts_with("model.layers.1.self_attn.v_proj"))
      for (std::int64_t i = 0; i < h.numel(); ++i) h.data<bf16>()[i] = to_bf16(2.0f * to_float(h.data<bf16>()[i]));
    refs.push_back({n, &h});
  }
  const auto dir2 = tiny_dir("bf16_views_changed");
  std::filesystem::copy_file(dir / "config.json", dir2 / "config.json");
  io::write_safetensors((dir2 / "model.safetensors").string(), refs);
  const Model reloaded = Model::load(dir2.string());
  CpuRuntime a(changed), b(reloaded), c(original);
  EXPECT_NE(a.weight_storage().find("11 of 11 matrices also as bf16"), std::string::npos) << a.weight_storage();
  Rng rng(s.seed);
  const auto toks = random_tokens(rng, 12, s.vocab);
  const auto got = run(a, toks, 1), want = run(b, toks, 1), old = run(c, toks, 1);
  EXPECT_EQ(got, want);
  EXPECT_NE(got, old);
}

// The sparse FFN path's decode steps (≤ 8 rows) compute the gate from the bf16 copy too (half the
// bytes of the step's largest read), then pack and multiply as before. Against the same runtime
// on fp32 weights alone: the gate's pre-activations are the same products summed in another order
// (≈ 1e-6 relative), so a stored bf16 gate value differs only where that moves it across a bf16
// rounding boundary (one ulp, 2⁻⁸ relative, for a few of the ≈ 450 active values here); each such
// flip moves one neuron's share of one FFN output by 2⁻⁸, a few 1e-4 of the logits' scale at most.
// A wrong gate (another matrix, rows swapped) moves them by O(1). The ReLU pattern of layer 0,
// whose inputs are identical, is the same on both (a sign flip needs a sum within 1e-6 of 0).
TEST(ModelCpu, SparseDecodeReadsTheGateFromBf16Copies) {
  TinySpec s;
  s.bf16 = true;
  s.tied = false;
  s.bias_channel = true;
  s.gate_threshold = -0.45f;  // ≈ 1 % density
  s.intermediate = 600;
  s.seed = fresh_seed();
  const Model m = Model::load(write_tiny("bf16_sparse", s).string());
  const model::RuntimeOptions sparse(model::FfnPath::sparse);
  model::RuntimeTuning on, off;  // explicit: not TWELL_TUNING's
  off.cpu_bf16_weights = false;
  CpuRuntime with(m, sparse, on), without(m, sparse, off);
  Rng rng(s.seed);
  const auto toks = random_tokens(rng, 37, s.vocab);
  const auto want = run(without, toks, 1);
  for (std::size_t chunk : {1u, 5u}) {
    with.reset_stats();
    const auto got = run(with, toks, chunk);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(rel_diff(got, want), 2e-3) << "chunk " << chunk;
    EXPECT_EQ(with.ffn_stats()[0].active, without.ffn_stats()[0].active) << "chunk " << chunk;
    EXPECT_EQ(with.ffn_stats()[0].sparse_rows, 37);
  }
}

TEST(ModelCpu, BatchMatchesSeparateSequences) {
  TinySpec s;
  s.act = "silu";
  s.tied = false;
  s.seed = fresh_seed();
  const Model m = Model::load(write_tiny("batch", s).string());
  CpuRuntime rt(m);
  Rng rng(s.seed);
  std::vector<std::vector<std::int32_t>> seqs = {random_tokens(rng, 1, s.vocab), random_tokens(rng, 19, s.vocab),
                                                 random_tokens(rng, 7, s.vocab)};
  std::vector<std::unique_ptr<Sequence>> kv;
  std::vector<SeqStep> steps;
  for (std::size_t i = 0; i < seqs.size(); ++i) kv.push_back(rt.new_sequence(32));
  for (std::size_t i = 0; i < seqs.size(); ++i) steps.push_back({kv[i].get(), seqs[i]});
  const auto batched = rt.forward(steps);
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const auto alone = run(rt, seqs[i], seqs[i].size());
    std::span<const float> last(alone.data() + alone.size() - static_cast<std::size_t>(s.vocab), static_cast<std::size_t>(s.vocab));
    std::span<const float> row(batched.data() + i * static_cast<std::size_t>(s.vocab), static_cast<std::size_t>(s.vocab));
    EXPECT_LT(rel_diff(row, last), 1e-5) << "sequence " << i;
  }
  // A decode step for two of them, batched, equals their separate continuations.
  std::int32_t next[2] = {3, 5};
  std::vector<SeqStep> dec = {{kv[0].get(), std::span<const std::int32_t>(&next[0], 1)}, {kv[2].get(), std::span<const std::int32_t>(&next[1], 1)}};
  const auto step = rt.forward(dec);
  auto s0 = seqs[0];
  s0.push_back(3);
  const auto a0 = run(rt, s0, s0.size());
  EXPECT_LT(rel_diff(std::span<const float>(step.data(), static_cast<std::size_t>(s.vocab)),
                     std::span<const float>(a0.data() + a0.size() - static_cast<std::size_t>(s.vocab), static_cast<std::size_t>(s.vocab))),
            1e-5);
}

// The paged KV cache: sequences that grow block by block from one pool, their blocks interleaved
// with another sequence's (so no sequence's keys lie in order), give the logits of sequences of
// fixed capacity bit for bit: the same products in the same order (runs of a block add up as one
// run would; a prefill of ≥ 16 rows gathers the keys for its GEMMs). Prompts of 37 and 21 tokens
// in chunks of 16 (the GEMM path) and 5 (the loops), then 20 decode steps past block boundaries,
// batched together; with and without a sliding window smaller than the prompts.
TEST(ModelCpu, PagedSequencesMatchFixedOnesBitForBit) {
  for (const bool window : {false, true}) {
    TinySpec s;
    s.act = "silu";
    s.seed = fresh_seed();
    Model m = Model::load(write_tiny(window ? "paged-window" : "paged", s).string());
    if (window) m.config.sliding_window = 13;  // a window smaller than the prompts
    CpuRuntime rt(m);
    Rng rng(s.seed);
    const std::vector<std::vector<std::int32_t>> prompts = {random_tokens(rng, 37, s.vocab), random_tokens(rng, 21, s.vocab)};
    auto pool = rt.make_kv_pool(12);
    std::vector<std::unique_ptr<Sequence>> fixed, paged;
    for (std::size_t i = 0; i < 2; ++i) {
      fixed.push_back(rt.new_sequence(64));
      paged.push_back(rt.new_paged_sequence(pool));
    }
    auto both = [&](std::vector<std::unique_ptr<Sequence>>& kv, const std::vector<std::span<const std::int32_t>>& toks) {
      std::vector<SeqStep> steps;
      for (std::size_t i = 0; i < kv.size(); ++i)
        if (!toks[i].empty()) {
          EXPECT_TRUE(kv[i]->reserve(static_cast<std::int64_t>(toks[i].size())));
          steps.push_back({kv[i].get(), toks[i]});
        }
      return rt.forward(steps, /*all_positions=*/true);
    };
    // Chunks taken in turn, so the two paged sequences' blocks interleave in the pool.
    for (std::size_t at : {0u, 16u, 32u}) {
      std::vector<std::span<const std::int32_t>> toks(2);
      for (std::size_t i = 0; i < 2; ++i) {
        const std::size_t n = prompts[i].size();
        const std::size_t len = at < n ? std::min<std::size_t>(at == 32 ? 5 : 16, n - at) : 0;
        toks[i] = std::span<const std::int32_t>(prompts[i].data() + std::min(at, n), len);
      }
      const auto a = both(fixed, toks), b = both(paged, toks);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "prefill from " << at;
    }
    // Decode steps of both over block boundaries.
    for (int step = 0; step < 20; ++step) {
      const std::int32_t t0 = static_cast<std::int32_t>(rng.below(s.vocab)), t1 = static_cast<std::int32_t>(rng.below(s.vocab));
      const std::vector<std::span<const std::int32_t>> toks = {std::span<const std::int32_t>(&t0, 1), std::span<const std::int32_t>(&t1, 1)};
      const auto a = both(fixed, toks), b = both(paged, toks);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "decode step " << step;
    }
    EXPECT_EQ(paged[0]->length(), 57);
    EXPECT_EQ(paged[0]->blocks(), 4);  // 57 positions in blocks of 16
    EXPECT_EQ(paged[1]->blocks(), 3);  // 41
    EXPECT_EQ(pool->free_blocks(), 12 - 7);
  }
}

// Prefix sharing: a paged sequence whose prompt starts with the tokens of another's full blocks
// starts on those blocks (one more reference each, no new blocks, no prefill of them) and computes
// what a fixed sequence fed the same calls computes, bit for bit: A and the fixed C prefill the same
// 32 tokens in one call (the same keys and values), B takes A's two blocks and feeds its own 8 tokens
// as C does. Sharing stops at the first block that differs and leaves at least one token to compute;
// a block leaves the index when its last holder lets it go, and cleared sequences give blocks back.
TEST(ModelCpu, PagedSequencesShareFullPrefixBlocks) {
  TinySpec s;
  s.act = "silu";
  s.seed = fresh_seed();
  const Model m = Model::load(write_tiny("prefix", s).string());
  CpuRuntime rt(m);
  Rng rng(s.seed);
  const auto head = random_tokens(rng, 32, s.vocab), tail_a = random_tokens(rng, 8, s.vocab),
             tail_b = random_tokens(rng, 8, s.vocab);
  std::vector<std::int32_t> pa = head, pb = head;
  pa.insert(pa.end(), tail_a.begin(), tail_a.end());
  pb.insert(pb.end(), tail_b.begin(), tail_b.end());
  auto pool = rt.make_kv_pool(16);
  auto a = rt.new_paged_sequence(pool, pa);
  EXPECT_EQ(a->length(), 0);  // nothing published yet
  auto feed = [&](Sequence& q, std::span<const std::int32_t> toks) {
    EXPECT_TRUE(q.reserve(static_cast<std::int64_t>(toks.size())));
    SeqStep st{&q, toks};
    return rt.forward(std::span<const SeqStep>(&st, 1), /*all_positions=*/true);
  };
  feed(*a, std::span<const std::int32_t>(pa).first(32));
  feed(*a, std::span<const std::int32_t>(pa).subspan(32));
  EXPECT_EQ(pool->free_blocks(), 16 - 3);  // 40 positions
  auto b = rt.new_paged_sequence(pool, pb);
  EXPECT_EQ(b->length(), 32);  // A's two full blocks (the third differs, and is not full)
  EXPECT_EQ(b->blocks(), 2);
  EXPECT_EQ(pool->free_blocks(), 16 - 3);  // shared, not taken
  auto c = rt.new_sequence(64);
  feed(*c, std::span<const std::int32_t>(pb).first(32));
  const auto lb = feed(*b, std::span<const std::int32_t>(pb).subspan(32));
  const auto lc = feed(*c, std::span<const std::int32_t>(pb).subspan(32));
  ASSERT_EQ(lb.size(), lc.size());
  EXPECT_EQ(std::memcmp(lb.data(), lc.data(), lb.size() * sizeof(float)), 0) << "B on A's blocks vs C computing them";
  EXPECT_EQ(pool->free_blocks(), 16 - 4);  // B's own third block
  // At least one token is left to compute: a prefix of exactly 32 shares one block; one that
  // differs in its first block shares none.
  EXPECT_EQ(rt.new_paged_sequence(pool, std::span<const std::int32_t>(pa).first(32))->length(), 16);
  std::vector<std::int32_t> other = pa;
  other[3] = (other[3] + 1) % static_cast<std::int32_t>(s.vocab);
  EXPECT_EQ(rt.new_paged_sequence(pool, other)->length(), 0);
  // A goes: its blocks stay while B holds them. B cleared: they stay published but free (the prefix
  // cache), and serve the next prompt that starts with them, until their memory is needed.
  a.reset();
  EXPECT_EQ(pool->free_blocks(), 16 - 3);  // A's third block back
  EXPECT_EQ(rt.new_paged_sequence(pool, pb)->length(), 32);
  b->clear();
  EXPECT_EQ(b->length(), 0);
  EXPECT_EQ(b->blocks(), 0);
  EXPECT_EQ(pool->free_blocks(), 16);
  EXPECT_EQ(pool->cached_blocks(), 2);
  auto d = rt.new_paged_sequence(pool, pb);
  EXPECT_EQ(d->length(), 32) << "a finished sequence's prefix";
  EXPECT_EQ(pool->cached_blocks(), 0);
  const auto ld = feed(*d, std::span<const std::int32_t>(pb).subspan(32));
  EXPECT_EQ(std::memcmp(ld.data(), lc.data(), ld.size() * sizeof(float)), 0) << "D on cached blocks vs C computing them";
  d.reset();
  // Sequences that need every block take the cached ones too: the prefix is gone.
  std::vector<std::unique_ptr<Sequence>> all;
  for (int i = 0; i < 4; ++i) {
    all.push_back(rt.new_paged_sequence(pool));
    EXPECT_TRUE(all.back()->reserve(4 * model::kKvBlockTokens));
  }
  EXPECT_EQ(pool->free_blocks(), 0);
  EXPECT_EQ(pool->cached_blocks(), 0);
  all.clear();
  EXPECT_EQ(rt.new_paged_sequence(pool, pb)->length(), 0);
}

// The pool's accounting: a reserve the pool cannot meet fails and takes nothing; blocks come back
// when a sequence is destroyed; a sequence never grows past the context; a pool is its runtime's.
TEST(ModelCpu, KvPoolRefusesWhatItCannotHoldAndTakesBlocksBack) {
  TinySpec s;
  s.act = "silu";
  s.seed = fresh_seed();
  const Model m = Model::load(write_tiny("pool", s).string());
  CpuRuntime rt(m), other(m);
  auto pool = rt.make_kv_pool(3);
  EXPECT_EQ(pool->total_blocks(), 3);
  EXPECT_GT(pool->block_bytes(), 0);
  auto a = rt.new_paged_sequence(pool), b = rt.new_paged_sequence(pool);
  EXPECT_EQ(a->capacity(), 0);
  EXPECT_TRUE(a->reserve(17));  // two blocks
  EXPECT_EQ(a->blocks(), 2);
  EXPECT_EQ(a->capacity(), 32);
  EXPECT_FALSE(b->reserve(17));  // needs two, one is free: takes none
  EXPECT_EQ(b->blocks(), 0);
  EXPECT_EQ(pool->free_blocks(), 1);
  EXPECT_TRUE(b->reserve(16));
  EXPECT_EQ(pool->free_blocks(), 0);
  // forward without a reserve is refused before anything changes
  const std::int32_t t[17] = {};
  SeqStep st{b.get(), std::span<const std::int32_t>(t, 17)};
  EXPECT_THROW(rt.forward(std::span<const SeqStep>(&st, 1)), Error);
  EXPECT_EQ(b->length(), 0);
  a.reset();
  EXPECT_EQ(pool->free_blocks(), 2);
  EXPECT_TRUE(b->reserve(40));  // 40 positions: three blocks in all
  EXPECT_EQ(b->blocks(), 3);
  EXPECT_FALSE(b->reserve(m.config.max_position + 1));  // never past the context
  EXPECT_THROW(other.new_paged_sequence(pool), Error);
  EXPECT_THROW(rt.make_kv_pool(0), Error);
  // TWELL_TUNING=no-paged-kv: pools refused as unsupported (the server's fallback to fixed caches).
  model::RuntimeTuning fixed_only;
  fixed_only.paged_kv = false;
  CpuRuntime nopaged(m, {}, fixed_only);
  try {
    (void)nopaged.make_kv_pool(4);
    ADD_FAILURE() << "no-paged-kv made a pool";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
  }
}

// Sparse (TwELL) against dense FFN path on a ReLU model: the TwELL path holds each gate value as
// bf16 (relative rounding ≤ 2⁻⁹), so each active h = g·u moves by ≤ 2⁻⁹ relative and each FFN
// output by ≤ 2⁻⁹ of Σ|h·wd|; through two layers and the head the logits move by a few 2⁻⁹ of
// their scale: 2e-2 relative bounds it with room, and a wrong index or a dropped non-zero moves
// them by O(1).
TEST(ModelCpu, SparsePathMatchesDense) {
  for (float thr : {-0.45f, -0.2f, 0.0f}) {  // ≈ 1 %, ≈ 10 % and ≈ 50 % density (overflowing tiles)
    TinySpec s;
    s.bias_channel = true;
    s.gate_threshold = thr;
    s.intermediate = 600;  // three TwELL tiles, the last one partial
    s.seed = fresh_seed();
    const Model m = Model::load(write_tiny("sparse", s).string());
    CpuRuntime dense(m, {model::FfnPath::dense});
    CpuRuntime sparse(m, {model::FfnPath::sparse});
    Rng rng(s.seed);
    const auto toks = random_tokens(rng, 40, s.vocab);
    const auto a = run(dense, toks, 8), b = run(sparse, toks, 8);
    EXPECT_LT(rel_diff(b, a), 2e-2) << "gate threshold " << thr;
    const auto& st = sparse.ffn_stats();
    EXPECT_EQ(st[0].rows, 40);
    EXPECT_EQ(st[0].sparse_rows, 40);
    EXPECT_GT(st[0].active, 0);
    // Layer 0 sees identical inputs on both paths, so the same ReLU pattern; layer 1's inputs
    // differ by the bf16 rounding above, which may flip gates within that rounding of zero.
    EXPECT_EQ(dense.ffn_stats()[0].active, st[0].active) << "both paths count the same ReLU pattern";
    EXPECT_NEAR(static_cast<double>(dense.ffn_stats()[1].active), static_cast<double>(st[1].active),
                1e-3 * static_cast<double>(st[1].active) + 2);
    if (thr == 0.0f) {
      EXPECT_GT(st[0].overflow_rows, 0) << "half-dense rows must overflow 31-entry TwELL tiles";
    }
    RecordProperty("density_" + std::to_string(thr), std::to_string(st[0].last_density));
  }
}

// An ffn_input_hook may change a layer's weights before its FFN runs, and the FFN runs on the
// changed ones, also on the sparse path (whose Wdᵀ copy the runtime prepares itself): doubling
// layer 1's w_down from the hook gives the logits of a runtime built on the doubled weights.
TEST(ModelCpu, HookChangesReachTheSparsePath) {
  TinySpec s;
  s.bias_channel = true;
  s.gate_threshold = -0.45f;
  s.seed = fresh_seed();
  const auto dir = write_tiny("hook", s).string();
  Model hooked_model = Model::load(dir), doubled = Model::load(dir);
  for (auto& w : doubled.layers[1].w_down) w *= 2.0f;
  model::RuntimeOptions ro(model::FfnPath::sparse);
  bool done = false;
  ro.ffn_input_hook = [&](std::int64_t layer, CMatrixF) {
    if (layer != 1 || done) return;
    for (auto& w : hooked_model.layers[1].w_down) w *= 2.0f;
    done = true;
  };
  CpuRuntime hooked(hooked_model, ro), want(doubled, {model::FfnPath::sparse});
  Rng rng(s.seed);
  const auto toks = random_tokens(rng, 12, s.vocab);
  const auto a = run(hooked, toks, 12), b = run(want, toks, 12);
  ASSERT_TRUE(done);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "max rel diff " << rel_diff(a, b);
}

TEST(ModelCpu, AutomaticDispatchFollowsDensity) {
  TinySpec s;
  s.bias_channel = true;
  s.gate_threshold = 0.0f;  // ≈ 50 % density: automatic must move to the dense path after measuring
  s.seed = fresh_seed();
  const Model m = Model::load(write_tiny("auto", s).string());
  CpuRuntime rt(m);
  Rng rng(s.seed);
  const auto toks = random_tokens(rng, 12, s.vocab);
  run(rt, toks, 4);
  const auto& st = rt.ffn_stats()[0];
  EXPECT_EQ(st.sparse_rows, 4) << "first call measures through the sparse path, later calls run dense";
  EXPECT_GT(st.last_density, 0.2);
  EXPECT_DOUBLE_EQ(st.active_per_token(), static_cast<double>(st.active) / static_cast<double>(st.rows));
}

// A runtime that sums no counts (the GPU's: active −1) reports none per token, not 0 (which
// `twell generate` once printed as "0.0 active neurons per token" on the GPU).
TEST(Model, ActivePerTokenNeedsSummedCounts) {
  model::FfnLayerStats s;
  EXPECT_EQ(s.active_per_token(), -1) << "nothing measured";
  s.rows = 8;
  s.active = 24;
  s.last_density = 0.1;
  EXPECT_DOUBLE_EQ(s.active_per_token(), 3.0);
  s.active = -1;
  EXPECT_EQ(s.active_per_token(), -1) << "measured (last_density) but not summed";
}

// The activation profile (`twell stats --model`) counts what the runtime's FFN counts: per layer,
// its sum over the tokens equals the dense CPU runtime's active count over the same sequences, and
// at layer 0 (identical inputs on both paths) the TwELL path's too — an independent count, by the
// sparse kernels' packing. Per-neuron hits add up to the same totals, dead neurons are the ones
// without a hit, positions restart with each sequence, and a token's count depends only on its
// prefix (a sequence's first tokens profiled alone count the same). A SiLU model counts act(g) ≠ 0.
TEST(ActivationProfile, CountsWhatTheRuntimeCounts) {
  TinySpec s;
  s.bias_channel = true;
  s.gate_threshold = -0.3f;  // a few % active
  s.intermediate = 600;
  s.seed = fresh_seed();
  const Model m = Model::load(write_tiny("profile", s).string());
  Rng rng(s.seed);
  const std::vector<std::vector<std::int32_t>> seqs = {random_tokens(rng, 5, s.vocab), random_tokens(rng, 17, s.vocab),
                                                       random_tokens(rng, 1, s.vocab)};
  const model::ActivationProfile p = model::profile_activations(m, seqs);
  ASSERT_EQ(p.token_count(), 23);
  ASSERT_EQ(p.layers, s.layers);
  ASSERT_EQ(p.neurons, s.intermediate);
  CpuRuntime dense(m, {model::FfnPath::dense}), sparse(m, {model::FfnPath::sparse});
  for (const auto& q : seqs) {
    run(dense, q, q.size());
    run(sparse, q, q.size());
  }
  std::int64_t t = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i)
    for (std::size_t j = 0; j < seqs[i].size(); ++j, ++t) {
      EXPECT_EQ(p.sequence[static_cast<std::size_t>(t)], static_cast<std::int64_t>(i));
      EXPECT_EQ(p.position[static_cast<std::size_t>(t)], static_cast<std::int64_t>(j));
      EXPECT_EQ(p.tokens[static_cast<std::size_t>(t)], seqs[i][j]);
    }
  for (std::int64_t l = 0; l < p.layers; ++l) {
    std::int64_t sum = 0, hits = 0, dead = 0;
    for (std::int64_t k = 0; k < p.token_count(); ++k) sum += p.at(l, k);
    for (std::int64_t n = 0; n < p.neurons; ++n) {
      hits += p.neuron_hits[static_cast<std::size_t>(l * p.neurons + n)];
      dead += p.neuron_hits[static_cast<std::size_t>(l * p.neurons + n)] == 0;
    }
    EXPECT_EQ(sum, dense.ffn_stats()[static_cast<std::size_t>(l)].active) << "layer " << l;
    EXPECT_EQ(hits, sum) << "layer " << l;
    EXPECT_EQ(p.dead(l), dead) << "layer " << l;
    for (const double share : {0.0, 0.3, 0.5, 1.0}) {
      std::int64_t hot = 0;
      for (std::int64_t n = 0; n < p.neurons; ++n)
        hot += static_cast<double>(p.neuron_hits[static_cast<std::size_t>(l * p.neurons + n)]) >= share * 23.0;
      EXPECT_EQ(p.hot(l, share), hot) << "layer " << l << ", share " << share;
    }
    EXPECT_EQ(p.hot(l, 0.0), p.neurons);
    EXPECT_GT(sum, 0) << "layer " << l;
    EXPECT_LT(sum, p.token_count() * p.neurons / 2) << "layer " << l;
  }
  std::int64_t layer0 = 0;
  for (std::int64_t k = 0; k < p.token_count(); ++k) layer0 += p.at(0, k);
  EXPECT_EQ(layer0, sparse.ffn_stats()[0].active) << "layer 0: the TwELL path's own count";
  // keep_sets: each token's set of fired neurons; a union over tokens (the rows a batched step reads).
  const model::ActivationProfile ks = model::profile_activations(m, seqs, /*keep_sets=*/true);
  EXPECT_TRUE(p.fired.empty());
  for (std::int64_t l = 0; l < ks.layers; ++l) {
    std::int64_t most = 0, sum = 0;
    for (std::int64_t k = 0; k < ks.token_count(); ++k) {
      EXPECT_EQ(ks.fired_union(l, k, 1), ks.at(l, k)) << "layer " << l << ", token " << k;
      if (k >= 3 && k < 11) most = std::max<std::int64_t>(most, ks.at(l, k)), sum += ks.at(l, k);
    }
    EXPECT_EQ(ks.fired_union(l, 0, ks.token_count()), ks.neurons - ks.dead(l)) << "layer " << l << ": every neuron that fired";
    const std::int64_t u = ks.fired_union(l, 3, 8);
    EXPECT_GE(u, most) << "layer " << l;
    EXPECT_LE(u, sum) << "layer " << l;
  }
  {  // any tokens: the union of tokens 2, 9 and 20 (three sequences) is the neurons any of them fired
    const std::vector<std::int64_t> which = {2, 9, 20};
    std::int64_t want = 0;  // neuron by neuron: fired at any of the three
    const std::int64_t T = ks.token_count(), W = (ks.neurons + 63) / 64;
    for (std::int64_t j = 0; j < ks.neurons; ++j) {
      bool any = false;
      for (const std::int64_t t : which) any |= (ks.fired[static_cast<std::size_t>((1 * T + t) * W + j / 64)] >> (j % 64)) & 1;
      want += any;
    }
    EXPECT_EQ(ks.fired_union(1, which), want);
    EXPECT_GE(want, std::max({ks.at(1, 2), ks.at(1, 9), ks.at(1, 20)}));
    std::vector<std::int64_t> all(static_cast<std::size_t>(ks.token_count()));
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(all.size() - 1 - i);  // any order
    EXPECT_EQ(ks.fired_union(1, all), ks.neurons - ks.dead(1));
    const std::vector<std::int64_t> past = {0, 23};
    EXPECT_THROW((void)ks.fired_union(1, past), Error);
  }
  EXPECT_THROW((void)p.fired_union(0, 0, 1), Error);    // no sets kept
  EXPECT_THROW((void)ks.fired_union(0, 20, 4), Error);  // past the tokens
  const std::vector<std::vector<std::int32_t>> prefix = {std::vector<std::int32_t>(seqs[1].begin(), seqs[1].begin() + 6)};
  const model::ActivationProfile q = model::profile_activations(m, prefix);
  for (std::int64_t l = 0; l < p.layers; ++l)
    for (std::int64_t k = 0; k < 6; ++k) EXPECT_EQ(q.at(l, k), p.at(l, 5 + k)) << "layer " << l << ", token " << k;
  // A smooth activation is zero only where its input is: every gate counts.
  TinySpec silu;
  silu.act = "silu";
  silu.seed = fresh_seed();
  const Model ms = Model::load(write_tiny("profile_silu", silu).string());
  const model::ActivationProfile ps = model::profile_activations(ms, prefix);
  for (std::int64_t l = 0; l < ps.layers; ++l)
    for (std::int64_t k = 0; k < ps.token_count(); ++k) EXPECT_GT(ps.at(l, k), ps.neurons * 9 / 10);
  EXPECT_THROW(model::profile_activations(m, std::vector<std::vector<std::int32_t>>{{}}), Error);
}

// LoadOptions::bf16_only keeps the matrices as bf16 bits — a bf16 file's as they are, an fp32
// file's rounded to nearest even, which is what the GPU's upload of the fp32 load holds — and the
// norms in fp32, at about half the host bytes; the CPU runtime refuses such a model. (That the CUDA
// runtime then computes the same logits bit for bit: ModelCuda.Bf16OnlyLoadGivesTheSameLogits.)
TEST(ModelCpu, Bf16OnlyLoadKeepsTheBitsTheGpuHolds) {
  auto bits = [](const std::vector<float>& v) {
    std::vector<std::uint16_t> r;
    for (const float x : v) r.push_back(to_bf16(x).bits);
    return r;
  };
  for (const bool bf16_file : {false, true})
    for (const bool tied : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (bf16_file ? "bf16" : "fp32") << " file, " << (tied ? "tied" : "untied"));
      TinySpec s;
      s.bf16 = bf16_file;
      s.tied = tied;
      s.seed = fresh_seed();
      const auto dir = write_tiny("bf16_only", s).string();
      const Model a = Model::load(dir);
      model::LoadOptions lo;
      lo.bf16_only = true;
      const Model b = Model::load(dir, lo);
      EXPECT_TRUE(b.bf16_only);
      EXPECT_FALSE(a.bf16_only);
      EXPECT_TRUE(b.embed.empty() && b.lm_head.empty());
      EXPECT_EQ(b.embed16.to_vector(), bits(a.embed));
      EXPECT_EQ(b.lm_head16.to_vector(), bits(a.lm_head));  // both empty when tied
      EXPECT_EQ(b.lm_head16.empty(), tied);
      EXPECT_EQ(b.final_norm, a.final_norm);
      ASSERT_EQ(b.layers.size(), a.layers.size());
      for (std::size_t l = 0; l < a.layers.size(); ++l) {
        const model::LayerWeights &x = a.layers[l], &y = b.layers[l];
        EXPECT_TRUE(y.wqkv.empty() && y.wo.empty() && y.w_gate.empty() && y.w_up.empty() && y.w_down.empty());
        EXPECT_EQ(y.wqkv16.to_vector(), bits(x.wqkv)) << "layer " << l;
        EXPECT_EQ(y.wo16.to_vector(), bits(x.wo)) << "layer " << l;
        EXPECT_EQ(y.w_gate16.to_vector(), bits(x.w_gate)) << "layer " << l;
        EXPECT_EQ(y.w_up16.to_vector(), bits(x.w_up)) << "layer " << l;
        EXPECT_EQ(y.w_down16.to_vector(), bits(x.w_down)) << "layer " << l;
        EXPECT_EQ(y.attn_norm, x.attn_norm);
        EXPECT_EQ(y.ffn_norm, x.ffn_norm);
      }
      EXPECT_LT(b.weight_bytes(), 0.51 * static_cast<double>(a.weight_bytes()));
      if (bf16_file) {
        // The bits view the mapped file: they outlive the file's name (the mapping keeps it) — and
        // the pieces of the QKV matrix are the file's three tensors, not a copy.
        EXPECT_EQ(b.layers[0].wqkv16.pieces.size(), 3u);
        const std::vector<std::uint16_t> before = b.embed16.to_vector();
        std::filesystem::remove_all(dir);
        EXPECT_EQ(b.embed16.to_vector(), before);
        EXPECT_EQ(b.layers.back().w_down16.to_vector(), bits(a.layers.back().w_down));
      }
      try {
        CpuRuntime rt(b);
        ADD_FAILURE() << "the CPU runtime took a bf16-only model";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("bf16 weights only"), std::string::npos) << e.what();
      }
    }
  // A config that says tied over a checkpoint whose lm_head differs: refused either way (the file's
  // values compared, before any rounding).
  TinySpec s;
  s.tied = false;
  const auto dir = write_tiny("tie_mismatch", s, "", "", R"(, "tie_word_embeddings": true)").string();
  for (const bool b16 : {false, true}) {
    model::LoadOptions lo;
    lo.bf16_only = b16;
    try {
      (void)Model::load(dir, lo);
      ADD_FAILURE() << "a differing tied head was accepted (bf16_only " << b16 << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("differs from model.embed_tokens.weight"), std::string::npos) << e.what();
    }
  }
}

// A non-finite weight is refused by name and flat index, in either load form and file dtype; a
// finite fp32 value that rounds to ±Inf in bf16 is refused by the bf16-only load only (the GPU
// could not hold it) — at every position of a scan block, the block's edges included.
TEST(ModelCpu, NonFiniteWeightsAreRefusedWhereTheyAre) {
  for (const bool bf16_file : {false, true})
    for (const std::int64_t at : {0, 4095, 4096, 5000, 176 * 64 - 1}) {
      SCOPED_TRACE(::testing::Message() << (bf16_file ? "bf16" : "fp32") << " file, flat index " << at);
      TinySpec s;
      s.bf16 = bf16_file;
      const auto dir = write_tiny("nonfinite", s);
      const std::string path = (dir / "model.safetensors").string();
      io::SafetensorsFile f = io::read_safetensors(path);
      const std::string name = "model.layers.1.mlp.up_proj.weight";  // [176, 64]
      std::vector<io::TensorRef> refs;
      for (auto& [n, h] : f.tensors) {
        if (n == name) {
          if (bf16_file)
            h.data<bf16>()[at] = to_bf16(NAN);
          else
            h.data<float>()[at] = -INFINITY;
        }
        refs.push_back({n, &h});
      }
      io::write_safetensors(path, refs);
      for (const bool b16 : {false, true}) {
        model::LoadOptions lo;
        lo.bf16_only = b16;
        try {
          (void)Model::load(dir.string(), lo);
          ADD_FAILURE() << "a non-finite weight was accepted (bf16_only " << b16 << ")";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(name + " in"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find(fmt::format("at flat index {}", at)), std::string::npos) << e.what();
        }
      }
      if (!bf16_file) {  // a finite fp32 weight past bf16's range
        for (auto& [n, h] : f.tensors)
          if (n == name) h.data<float>()[at] = 3.4e38f;
        io::write_safetensors(path, refs);
        EXPECT_NO_THROW((void)Model::load(dir.string()));
        model::LoadOptions lo;
        lo.bf16_only = true;
        EXPECT_THROW((void)Model::load(dir.string(), lo), Error);
      }
    }
}

// A tensor large enough that its finite scan is split over threads (≥ 2 blocks of 4 Mi elements):
// the error names the first non-finite element, whichever block's thread finds one first.
TEST(ModelCpu, NonFiniteScanOverThreadsNamesTheFirst) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(std::max(threads, 2));  // at least two blocks scanned by two threads
  TinySpec s;
  s.bf16 = true;
  s.vocab = 140000;  // the tied embedding [140000, 64]: 8.96 M elements
  const auto dir = write_tiny("nonfinite_threads", s);
  const std::string path = (dir / "model.safetensors").string();
  const io::SafetensorsFile clean = io::read_safetensors(path);
  const std::string name = "model.embed_tokens.weight";
  for (const std::vector<std::int64_t>& at : {std::vector<std::int64_t>{8'000'000}, {8'000'000, 3'000'000}, {8'959'999, 4'480'000}}) {
    io::SafetensorsFile f = clean;
    std::vector<io::TensorRef> refs;
    for (auto& [n, h] : f.tensors) {
      if (n == name)
        for (std::int64_t i : at) h.data<bf16>()[i] = to_bf16(i % 2 ? INFINITY : NAN);
      refs.push_back({n, &h});
    }
    io::write_safetensors(path, refs);
    const std::int64_t first = *std::min_element(at.begin(), at.end());
    model::LoadOptions lo;
    lo.bf16_only = true;
    try {
      (void)Model::load(dir.string(), lo);
      ADD_FAILURE() << "a non-finite weight was accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(std::string(e.what()).ends_with(fmt::format("at flat index {}", first))) << e.what();
    }
  }
  omp_set_num_threads(threads);
}

TEST(ModelCpu, LoadErrorsNameTheProblem) {
  TinySpec s;
  auto expect_error = [](const std::filesystem::path& dir, const std::string& needle) {
    try {
      Model::load(dir.string());
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(write_tiny("e1", s, "model.layers.1.mlp.up_proj.weight"), "model.layers.1.mlp.up_proj.weight");
  expect_error(write_tiny("e2", s, "", "model.layers.0.mlp.extra"), "model.layers.0.mlp.extra");
  expect_error(write_tiny("e3", s, "", "", R"(, "rope_scaling": {"type": "longrope", "factor": 2.0})"), "longrope");
  expect_error(write_tiny("e4", s, "", "", R"(, "attention_bias": true)"), "attention_bias");
  expect_error(std::filesystem::temp_directory_path() / "twell_no_such_model_dir", "not a directory");
  {
    auto d = write_tiny("e5", s);
    std::ofstream(d / "config.json") << R"({"vocab_size": 10, "hidden_size": 64})";
    expect_error(d, "intermediate_size");
  }
  {
    TinySpec w = s;
    auto d = write_tiny("e6", w);
    w.intermediate = 100;  // config says 100, tensors hold 176
    std::ofstream(d / "config.json") << fmt::format(
        R"({{"vocab_size": {}, "hidden_size": {}, "intermediate_size": 100, "num_hidden_layers": {},
        "num_attention_heads": {}, "num_key_value_heads": {}, "tie_word_embeddings": true}})",
        s.vocab, s.hidden, s.layers, s.heads, s.kv_heads);
    expect_error(d, "mlp.gate_proj.weight");
  }
  {
    auto d = write_tiny("e7", s);
    std::filesystem::resize_file(d / "model.safetensors", 100);
    EXPECT_THROW(Model::load(d.string()), Error);
  }
}

// config.json's two RoPE layouts (transformers ≥ 5's rope_parameters, the legacy top-level keys)
// read identically; a value given in both that disagrees, and every unimplemented setting, is
// refused naming the key; unknown keys are listed, not silently dropped.
TEST(ModelConfig, BothRopeLayoutsReadIdentically) {
  const std::string base = R"("vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
      "num_attention_heads": 2, "max_position_embeddings": 4096)";
  auto parse = [&](const std::string& extra) { return model::parse_llama_config("{" + base + extra + "}"); };
  struct Pair {
    const char* legacy;
    const char* current;
  };
  const Pair pairs[] = {
      {R"(, "rope_theta": 50000.0)", R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0})"},
      {R"(, "rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 4.0})",
       R"(, "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6})"},
      {R"(, "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 1024})",
       R"(, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 1024, "rope_theta": 5e5})"},
      {R"(, "rope_theta": 1e4, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
           "beta_fast": 16, "mscale": 0.707, "mscale_all_dim": 1.0})",
       R"(, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
           "beta_fast": 16, "mscale": 0.707, "mscale_all_dim": 1.0, "rope_theta": 1e4})"},
  };
  for (const auto& p : pairs) {
    const auto a = parse(p.legacy), b = parse(p.current);
    EXPECT_EQ(a.rope_theta, b.rope_theta) << p.current;
    const auto fa = a.rope(a.max_position), fb = b.rope(b.max_position);
    EXPECT_EQ(fa.inv_freq, fb.inv_freq) << p.current;
    EXPECT_EQ(fa.attention_scaling, fb.attention_scaling) << p.current;
    EXPECT_TRUE(a.unknown_keys.empty() && b.unknown_keys.empty()) << p.current;
  }
  // Plain RoPE: θ^(−2i/d); linear divides it by the factor; yarn's default attention factor.
  const auto plain = parse(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0})").rope(4096);
  EXPECT_DOUBLE_EQ(plain.inv_freq[3], std::pow(50000.0, -6.0 / 32.0));
  const auto lin = parse(pairs[1].current).rope(4096);
  EXPECT_DOUBLE_EQ(lin.inv_freq[5], std::pow(1e6, -10.0 / 32.0) / 4.0);
  const auto y = parse(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})");
  EXPECT_DOUBLE_EQ(y.rope(4096).attention_scaling, 0.1 * std::log(4.0) + 1.0);
  // Dynamic RoPE is plain up to max_position and grows θ past it.
  const auto dyn = parse(R"(, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})");
  EXPECT_EQ(dyn.rope(100).inv_freq, dyn.rope(4096).inv_freq);
  EXPECT_DOUBLE_EQ(dyn.rope(4096).inv_freq[1], std::pow(1e4, -2.0 / 32.0));
  EXPECT_LT(dyn.rope(8192).inv_freq[1], dyn.rope(4096).inv_freq[1]);

  auto refused = [&](const std::string& extra, const std::string& needle) {
    try {
      (void)parse(extra);
      ADD_FAILURE() << "accepted: " << extra;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(R"(, "rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5})", "rope_theta");
  refused(R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0}, "rope_scaling": {"type": "linear", "factor": 4.0})",
          "factor");
  refused(R"(, "rope_parameters": {"rope_type": "longrope", "short_factor": [1], "long_factor": [1]})", "longrope");
  refused(R"(, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})", "partial_rotary_factor");
  refused(R"(, "partial_rotary_factor": 0.5)", "partial_rotary_factor");
  refused(R"(, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0})", "low_freq_factor");
  refused(R"(, "rope_parameters": {"rope_type": "linear"})", "factor");
  refused(R"(, "final_logit_softcapping": 30.0)", "final_logit_softcapping");
  refused(R"(, "quantization_config": {"quant_method": "awq"})", "quantization_config");
  refused(R"(, "mlp_bias": true)", "mlp_bias");
  refused(R"(, "model_type": "gemma")", "gemma");

  // Keys nobody reads are listed; inert ones and explicit defaults are not.
  const auto u = parse(R"(, "use_cache": true, "pad_token_id": null, "my_extension": 3, "layer_types": null,
      "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "factor": 2.0}, "sliding_window": 16)");
  EXPECT_EQ(u.unknown_keys, (std::vector<std::string>{"my_extension", "rope_parameters.factor", "sliding_window"}));
  EXPECT_EQ(u.sliding_window, 0);  // LlamaForCausalLM does not apply a window (nor does transformers)
  EXPECT_NE(model::unknown_keys_warning(u).find("my_extension"), std::string::npos);
  const auto mis = parse(R"(, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 16)");
  EXPECT_EQ(mis.sliding_window, 16);
  EXPECT_EQ(mis.first_key(15), 0);
  EXPECT_EQ(mis.first_key(16), 1);
  EXPECT_EQ(mis.first_key(100), 85);
}

TEST(ModelCpu, ForwardRejectsBadCallsWithoutChangingCaches) {
  TinySpec s;
  const Model m = Model::load(write_tiny("bad", s).string());
  CpuRuntime rt(m);
  auto kv = rt.new_sequence(4);
  std::vector<std::int32_t> five = {1, 2, 3, 4, 5}, bad = {1, static_cast<std::int32_t>(s.vocab)};
  SeqStep a{kv.get(), five};
  EXPECT_THROW(rt.forward(std::span<const SeqStep>(&a, 1)), Error);
  SeqStep b{kv.get(), bad};
  EXPECT_THROW(rt.forward(std::span<const SeqStep>(&b, 1)), Error);
  SeqStep twice[2] = {{kv.get(), std::span<const std::int32_t>(five.data(), 1)}, {kv.get(), std::span<const std::int32_t>(five.data(), 1)}};
  EXPECT_THROW(rt.forward(twice), Error);
  EXPECT_EQ(kv->length(), 0);
  EXPECT_THROW(rt.new_sequence(s.max_pos + 1), Error);
  CpuRuntime other(m);
  SeqStep foreign{kv.get(), std::span<const std::int32_t>(five.data(), 1)};
  EXPECT_THROW(other.forward(std::span<const SeqStep>(&foreign, 1)), Error);
  EXPECT_THROW(CpuRuntime(m, {model::FfnPath::sparse, 0.05}).forward({}), Error);
}

// The sampler sorts only the prefix of the candidates its top-p cut and its walk reach: it must
// pick what a full sort picks. The oracle below is the sampler as it was (every candidate sorted
// by logit, ties to the lower id; sums in that order). Random vocabularies of 1–3000 with tied
// logits, every option combination, 12 seeded draws each: the same tokens (the normaliser's sum
// runs in another order, which moves the draw's boundaries by double rounding only: continuous
// logits never sit on one).
std::int32_t full_sort_sample(std::span<const float> logits, std::span<const std::int32_t> history,
                              const model::SamplingOptions& o, std::mt19937_64& rng) {
  const auto V = static_cast<std::int64_t>(logits.size());
  std::vector<double> z(logits.begin(), logits.end());
  if (o.repetition_penalty != 1.0)
    for (std::int64_t i = 0; i < V; ++i)
      if (std::find(history.begin(), history.end(), static_cast<std::int32_t>(i)) != history.end()) {
        const float l = logits[static_cast<std::size_t>(i)], p = static_cast<float>(o.repetition_penalty);
        z[static_cast<std::size_t>(i)] = l > 0 ? l / p : l * p;  // fp32, as transformers on fp32 logits
      }
  std::vector<std::int32_t> idx(static_cast<std::size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](std::int32_t a, std::int32_t b) {
    return z[static_cast<std::size_t>(a)] > z[static_cast<std::size_t>(b)] ||
           (z[static_cast<std::size_t>(a)] == z[static_cast<std::size_t>(b)] && a < b);
  });
  if (o.temperature == 0.0) return idx[0];
  idx.resize(static_cast<std::size_t>(o.top_k > 0 ? std::min(o.top_k, V) : V));
  std::vector<double> p(idx.size());
  double sum = 0;
  for (std::size_t i = 0; i < idx.size(); ++i)
    sum += p[i] = std::exp((z[static_cast<std::size_t>(idx[i])] - z[static_cast<std::size_t>(idx[0])]) / o.temperature);
  std::size_t keep = idx.size();
  double acc = 0;
  for (std::size_t i = 0; o.top_p < 1.0 && i < idx.size(); ++i)
    if ((acc += p[i] / sum) >= o.top_p) {
      keep = i + 1;
      break;
    }
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) total += p[i];
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (std::size_t i = 0; i < keep; ++i) {
    if (u < p[i]) return idx[i];
    u -= p[i];
  }
  return idx[keep - 1];
}

// Trials 300 … 339 draw vocabularies of 4 097 … 60 000 tokens: without a top-k cut the sampler
// then draws by log-weight buckets (sampler.cpp), with flat (σ 0.3) and spread (σ 3) logits, so
// the buckets reached run from the first to the last, a far outlier (past the buckets' span cap)
// and rows of one value (every token in one bucket).
TEST(Sampler, PicksWhatAFullSortPicks) {
  Rng rng(fresh_seed());
  std::int64_t draws = 0;
  for (int trial = 0; trial < 340; ++trial) {
    const bool large = trial >= 300;
    const std::int64_t V = large ? 4097 + rng.below(56000) : 1 + rng.below(3000);
    std::vector<float> logits(static_cast<std::size_t>(V));
    const float sigma = large && trial % 2 ? 0.3f : 3.0f;
    for (auto& v : logits) v = rng.normal(sigma);
    for (std::int64_t i = 0; i < V / 10; ++i)  // ties
      logits[static_cast<std::size_t>(rng.below(V))] = logits[static_cast<std::size_t>(rng.below(V))];
    if (trial % 3 == 0) logits[static_cast<std::size_t>(rng.below(V))] = 20.0f;  // a peaked head
    if (large && trial % 5 == 0) logits[static_cast<std::size_t>(rng.below(V))] = -1e4f;  // an outlier far below
    if (large && trial % 7 == 0) std::fill(logits.begin(), logits.end(), 0.5f);    // one value: a single bucket
    std::vector<std::int32_t> history;
    for (int i = 0; i < 30; ++i) history.push_back(static_cast<std::int32_t>(rng.below(V)));
    model::SamplingOptions o;
    const double temps[] = {0.0, 0.3, 0.7, 1.0, 1.6};
    const std::int64_t ks[] = {0, 1, 5, V / 2 + 1, V};
    const double ps[] = {1.0, 0.9, 0.37, 1e-3};
    o.temperature = temps[rng.below(5)];
    o.top_k = ks[rng.below(5)];
    o.top_p = ps[rng.below(4)];
    o.repetition_penalty = rng.below(2) ? 1.0 : 1.3;
    o.seed = static_cast<std::uint64_t>(rng.below(1 << 30));
    model::Sampler s(o);
    std::mt19937_64 oracle_rng(o.seed);
    for (int d = 0; d < 12; ++d, ++draws)
      ASSERT_EQ(s.sample(logits, history), full_sort_sample(logits, history, o, oracle_rng))
          << "V " << V << ", T " << o.temperature << ", top-k " << o.top_k << ", top-p " << o.top_p << ", penalty "
          << o.repetition_penalty << ", draw " << d;
  }
  RecordProperty("draws", std::to_string(draws));
}

// A draw from a row's best candidates (what a GPU selects and copies back) picks what the draw from
// the whole row picks, generator state included: top-k cuts below V and greedy with a penalty, the
// candidates handed over in a shuffled order. top_candidates against a full sort by (z, id).
TEST(Sampler, SampleTopPicksWhatSamplePicks) {
  Rng rng(fresh_seed());
  std::int64_t draws = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t V = 2 + rng.below(trial < 180 ? 3000 : 60000);
    std::vector<float> logits(static_cast<std::size_t>(V));
    for (auto& v : logits) v = trial % 4 == 0 ? static_cast<float>(rng.below(7)) - 3.0f : rng.normal(3.0f);  // ties, zeros
    if (trial % 5 == 0) logits[static_cast<std::size_t>(rng.below(V))] = -0.0f;
    std::vector<std::int32_t> history;
    for (int i = 0; i < 40; ++i) history.push_back(static_cast<std::int32_t>(rng.below(V)));
    model::SamplingOptions o;
    const double temps[] = {0.0, 0.3, 1.0, 1.6};
    o.temperature = temps[rng.below(4)];
    const std::int64_t ks[] = {1, 2, 50, V - 1};
    o.top_k = ks[rng.below(4)];
    const double ps[] = {1.0, 0.9, 1e-3};
    o.top_p = ps[rng.below(3)];
    o.repetition_penalty = rng.below(3) ? 1.3 : 1.0;
    o.seed = static_cast<std::uint64_t>(rng.below(1 << 30));
    const std::int64_t k = model::candidates_needed(o, V);
    if (k == 0) {  // greedy without a penalty (the argmax path) or no cut below V: the whole row
      ASSERT_TRUE(o.temperature == 0.0 ? o.repetition_penalty == 1.0 : o.top_k >= V);
      continue;
    }
    ASSERT_EQ(k, o.temperature == 0.0 ? 1 : o.top_k);
    const auto top = model::top_candidates(logits, history, k, o.repetition_penalty);
    // The reference set: every token's z by the same rule, fully sorted.
    std::vector<model::Candidate> all(static_cast<std::size_t>(V));
    for (std::int64_t i = 0; i < V; ++i) {
      float z = logits[static_cast<std::size_t>(i)];
      if (o.repetition_penalty != 1.0 &&
          std::find(history.begin(), history.end(), static_cast<std::int32_t>(i)) != history.end())
        z = z > 0 ? z / 1.3f : z * 1.3f;
      all[static_cast<std::size_t>(i)] = {z == 0 ? 0.0f : z, static_cast<std::int32_t>(i)};
    }
    std::sort(all.begin(), all.end(), [](auto a, auto b) { return a.z > b.z || (a.z == b.z && a.id < b.id); });
    ASSERT_EQ(top.size(), static_cast<std::size_t>(k));
    for (std::size_t i = 0; i < top.size(); ++i) {
      ASSERT_EQ(top[i].id, all[i].id) << "V " << V << ", k " << k << ", rank " << i;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(top[i].z), std::bit_cast<std::uint32_t>(all[i].z));
    }
    model::Sampler whole(o), part(o);
    for (int d = 0; d < 8; ++d, ++draws) {
      auto shuffled = top;
      std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(static_cast<unsigned>(d)));
      ASSERT_EQ(part.sample_top(shuffled), whole.sample(logits, history))
          << "V " << V << ", T " << o.temperature << ", top-k " << o.top_k << ", top-p " << o.top_p << ", draw " << d;
    }
  }
  RecordProperty("draws", std::to_string(draws));
  std::vector<float> nan = {0.0f, NAN};
  EXPECT_THROW(model::top_candidates(nan, {}, 1, 1.0), Error);
  EXPECT_THROW(model::top_candidates(nan, {}, 3, 1.0), Error);
  model::Sampler s({});
  EXPECT_THROW(s.sample_top({}), Error);
}

// The device sampler's rule on the host (sample_fixed_point): r walks the kept tokens in order by
// their integer weights. Over a grid of N evenly spaced draws r = (j + ½)/N each token is picked
// ⌊its share of the kept weight · N⌉ times up to one draw either way (the grid, not chance: this
// cannot flake), the share being softmax(z/T) renormalised over the top-k and top-p cut; r = 0
// picks the first token, r just below 1 the last kept one; the cuts keep what they should.
TEST(Sampler, FixedPointRuleDrawsTheSoftmaxOverTheCut) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 2.5f, 0.0f, 2.5f, -0.0f};  // a tie (3, 5), ±0
  model::SamplingOptions o;
  o.temperature = 0.7;
  const auto share = [&](const model::SamplingOptions& so, const std::vector<int>& kept) {
    std::vector<double> p(logits.size(), 0.0);
    double sum = 0;
    for (int i : kept) sum += p[static_cast<std::size_t>(i)] = std::exp((logits[static_cast<std::size_t>(i)] - 3.0) / so.temperature);
    for (auto& x : p) x /= sum;
    return p;
  };
  struct Case {
    std::int64_t top_k;
    double top_p;
    std::vector<int> kept;  // in order: z descending, the lower id first
  };
  // Shares at T = 0.7 over all: 1: 0.484, 3 and 5: 0.237 each, 0: 0.028, 4 and 6: 0.0067, 2:
  // 0.0004; the top-p 0.6 cut keeps 1 and 3 (0.721 ≥ 0.6).
  const Case cases[] = {{0, 1.0, {1, 3, 5, 0, 4, 6, 2}}, {3, 1.0, {1, 3, 5}}, {0, 0.6, {1, 3}}, {2, 1.0, {1, 3}},
                        {1, 1.0, {1}}};
  for (const auto& cs : cases) {
    model::SamplingOptions so = o;
    so.top_k = cs.top_k;
    so.top_p = cs.top_p;
    const auto want = share(so, cs.kept);
    constexpr int N = 20000;
    std::vector<int> got(logits.size(), 0);
    for (int j = 0; j < N; ++j) ++got[static_cast<std::size_t>(model::sample_fixed_point(logits, {}, so, (j + 0.5) / N))];
    for (std::size_t i = 0; i < logits.size(); ++i)
      EXPECT_NEAR(got[i], want[i] * N, 1.5) << "top-k " << cs.top_k << ", top-p " << cs.top_p << ", token " << i;
    EXPECT_EQ(model::sample_fixed_point(logits, {}, so, 0.0), cs.kept.front());
    EXPECT_EQ(model::sample_fixed_point(logits, {}, so, std::nextafter(1.0, 0.0)), cs.kept.back());
  }
  // The penalty moves token 1 (3 → 3 / 2) below 3 and 5: r = 0 picks 3 (the lower id of the tie).
  o.repetition_penalty = 2.0;
  const std::int32_t seen = 1;
  EXPECT_EQ(model::sample_fixed_point(logits, std::span<const std::int32_t>(&seen, 1), o, 0.0), 3);
  std::vector<float> nan = logits;
  nan[4] = NAN;
  EXPECT_THROW(model::sample_fixed_point(nan, {}, o, 0.5), Error);
  EXPECT_THROW(model::sample_fixed_point(logits, {}, o, 1.0), Error);
  model::SamplingOptions greedy;
  EXPECT_THROW(model::sample_fixed_point(logits, {}, greedy, 0.5), Error);
}

// The device's rule picks what Sampler::sample picks from the same generator: both use one
// canonical draw a token (sample's u = draw · kept mass), and their weights differ only by the
// fixed point's rounding (2⁻⁴⁰ of the largest), so a pick differs only where a draw falls within
// that of a boundary — never, over these rows (flat and peaked, 2 … 60 000 tokens, top-p cuts,
// penalties, with the bucket draw of large rows on sample's side).
TEST(Sampler, FixedPointRulePicksWhatSamplePicks) {
  Rng rng(fresh_seed());
  std::int64_t draws = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const std::int64_t V = 2 + rng.below(trial < 100 ? 3000 : 60000);
    std::vector<float> logits(static_cast<std::size_t>(V));
    const float sigma = trial % 2 ? 0.3f : 3.0f;
    for (auto& v : logits) v = rng.normal(sigma);
    std::vector<std::int32_t> history;
    for (int i = 0; i < 30; ++i) history.push_back(static_cast<std::int32_t>(rng.below(V)));
    model::SamplingOptions o;
    const double temps[] = {0.3, 0.8, 1.6};
    o.temperature = temps[rng.below(3)];
    const double ps[] = {1.0, 0.9, 0.37, 1e-3};
    o.top_p = ps[rng.below(4)];
    o.repetition_penalty = rng.below(2) ? 1.3 : 1.0;
    o.seed = static_cast<std::uint64_t>(rng.below(1 << 30));
    model::Sampler a(o), b(o);
    for (int d = 0; d < 8; ++d, ++draws)
      ASSERT_EQ(model::sample_fixed_point(logits, history, o, b.next_draw()), a.sample(logits, history))
          << "V " << V << ", σ " << sigma << ", T " << o.temperature << ", top-p " << o.top_p << ", draw " << d;
  }
  RecordProperty("draws", std::to_string(draws));
}

TEST(Sampler, GreedyTopKTopPAndSeeds) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
  model::Sampler greedy({});
  EXPECT_EQ(greedy.sample(logits, {}), 1);
  model::SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 1;
  model::Sampler k1(o);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.sample(logits, {}), 1);
  o.top_k = 0;
  o.top_p = 1e-6;
  model::Sampler p0(o);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(p0.sample(logits, {}), 1);
  o.top_p = 1.0;
  o.top_k = 2;
  o.seed = 7;
  model::Sampler a(o), b(o);
  int ones = 0;
  for (int i = 0; i < 400; ++i) {
    const auto x = a.sample(logits, {});
    EXPECT_EQ(x, b.sample(logits, {}));
    EXPECT_TRUE(x == 1 || x == 3);
    ones += x == 1;
  }
  // P(1) = e^2 / (e^2 + e^1.9) = 0.525; 400 draws: 5 σ ≈ 0.125.
  EXPECT_NEAR(ones / 400.0, 0.525, 0.125);
  model::SamplingOptions r;
  r.repetition_penalty = 10.0;
  model::Sampler rep(r);
  const std::int32_t seen = 1;
  EXPECT_EQ(rep.sample(logits, std::span<const std::int32_t>(&seen, 1)), 3);
  model::SamplingOptions bad;
  bad.top_p = 0;
  EXPECT_THROW(model::Sampler{bad}, Error);
  bad = {};
  bad.temperature = -1;
  EXPECT_THROW(model::Sampler{bad}, Error);
  std::vector<float> nan = {0.0f, NAN};
  EXPECT_THROW(greedy.sample(nan, {}), Error);
  std::vector<float> long_nan(20000, 0.5f);  // a row long enough for the parallel passes
  long_nan[12345] = NAN;
  long_nan[17000] = INFINITY;
  EXPECT_THROW(greedy.sample(long_nan, {}), Error);
  o.top_k = 0;
  o.top_p = 0.9;
  model::Sampler flat(o);
  EXPECT_THROW(flat.sample(long_nan, {}), Error);
  long_nan[12345] = long_nan[17000] = 0.5f;
  const auto id = flat.sample(long_nan, {});
  EXPECT_TRUE(id >= 0 && id < 20000);
}

TEST(Generate, BatchedEqualsSeparateAndStops) {
  TinySpec s;
  s.act = "silu";
  s.seed = fresh_seed();
  const Model m = Model::load(write_tiny("gen", s).string());
  CpuRuntime rt(m);
  Rng rng(s.seed);
  std::vector<std::vector<std::int32_t>> prompts = {random_tokens(rng, 5, s.vocab), random_tokens(rng, 11, s.vocab)};
  model::GenerateOptions o;
  o.max_new_tokens = 9;
  o.ignore_eos = true;
  const auto both = model::generate(rt, prompts, o);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto one = model::generate(rt, {prompts[i]}, o);
    EXPECT_EQ(one[0].tokens, both[i].tokens) << "prompt " << i;
    EXPECT_EQ(both[i].tokens.size(), 9u);
    EXPECT_EQ(both[i].stop_reason, "max tokens");
  }
  // Stop at the first token greedy picks after the prompt: exactly one token, reason "stop token".
  o.stop_ids = {both[0].tokens[0]};
  const auto stopped = model::generate(rt, {prompts[0]}, o);
  EXPECT_EQ(stopped[0].tokens.size(), 1u);
  EXPECT_EQ(stopped[0].stop_reason, "stop token");
  // Streaming sees every token in order.
  std::vector<std::int32_t> streamed;
  o.stop_ids.clear();
  model::generate(rt, {prompts[1]}, o, [&](std::size_t, std::int32_t id) { streamed.push_back(id); });
  EXPECT_EQ(streamed, both[1].tokens);
  // The context limit ends generation with its own reason.
  o.max_new_tokens = 1000;
  const auto full = model::generate(rt, {prompts[1]}, o);
  EXPECT_EQ(full[0].stop_reason, "context full");
  EXPECT_EQ(static_cast<std::int64_t>(prompts[1].size() + full[0].tokens.size()), s.max_pos + 1)
      << "the model reads max_pos positions and picks one token after the last";
}

// A runtime that returns the CPU runtime's logits with one row's first logit made NaN from the
// n-th forward on (the sampler must report it as an error, from whichever thread samples that row).
class NanRowRuntime : public model::Runtime {
 public:
  NanRowRuntime(model::Runtime& inner, std::size_t row, int from_call) : in_(inner), row_(row), from_(from_call) {}
  const Model& model() const noexcept override { return in_.model(); }
  std::string device() const override { return in_.device(); }
  std::unique_ptr<Sequence> new_sequence(std::int64_t capacity) override { return in_.new_sequence(capacity); }
  std::vector<float> forward(std::span<const SeqStep> steps, bool all_positions = false) override {
    auto logits = in_.forward(steps, all_positions);
    if (++calls_ >= from_ && row_ < steps.size())
      logits[row_ * static_cast<std::size_t>(in_.model().config.vocab_size)] = std::nanf("");
    return logits;
  }
  const std::vector<model::FfnLayerStats>& ffn_stats() const noexcept override { return in_.ffn_stats(); }
  void reset_stats() override { in_.reset_stats(); }

 private:
  model::Runtime& in_;
  std::size_t row_;
  int from_, calls_ = 0;
};

// Several sequences sample at once (generate runs their samplers in parallel: each has its own RNG,
// seeded seed + i, and history): the same tokens as each prompt generated alone with its seed, with
// top-p, top-k, a temperature and a repetition penalty. A NaN logit in one row of a decode step is
// an Error from generate, not a crash of the parallel region.
TEST(Generate, BatchedSamplingEqualsSeparate) {
  TinySpec s;
  s.act = "silu";
  s.seed = fresh_seed();
  const Model m = Model::load(write_tiny("gen_sample", s).string());
  CpuRuntime rt(m);
  Rng rng(s.seed);
  std::vector<std::vector<std::int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(random_tokens(rng, 3 + 2 * i, s.vocab));
  // top-k 40 < V: the runtime's k best a row (forward_top); top-k 0: whole rows, sampled in parallel.
  for (const std::int64_t top_k : {40, 0}) {
    model::GenerateOptions o;
    o.max_new_tokens = 12;
    o.ignore_eos = true;
    o.sampling.temperature = 0.9;
    o.sampling.top_p = 0.95;
    o.sampling.top_k = top_k;
    o.sampling.repetition_penalty = 1.1;
    o.sampling.seed = 1234;
    ASSERT_EQ(model::candidates_needed(o.sampling, s.vocab), top_k);
    const auto all = model::generate(rt, prompts, o);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      model::GenerateOptions one = o;
      one.sampling.seed = o.sampling.seed + i;
      EXPECT_EQ(model::generate(rt, {prompts[i]}, one)[0].tokens, all[i].tokens) << "top-k " << top_k << ", prompt " << i;
    }
    NanRowRuntime bad(rt, 3, 2);  // the first decode step's row 3
    EXPECT_THROW(model::generate(bad, prompts, o), Error);
  }
}

}  // namespace
}  // namespace twell::test

namespace twell::test {
namespace {

std::filesystem::path chat_dir(const std::string& name, const std::string& config_json) {
  const auto d = tiny_dir("chat_" + name);
  std::ofstream(d / "tokenizer_config.json") << config_json;
  return d;
}

TEST(ChatPrompt, ChatMLWithTheTemplatesDefaultSystemTurn) {
  // SmolLM2's template (from its GGUF), with real newlines in the Jinja string literals.
  const std::string tpl =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
      "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  const auto d = chat_dir("chatml", nlohmann::json{{"chat_template", tpl}}.dump());
  EXPECT_EQ(model::chat_prompt(d.string(), "Hi?"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(model::chat_prompt(d.string(), "Hi?", "Be brief."),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n");
  // The same default written with Jinja escapes (\n as two characters) in the template text.
  std::string escaped = tpl;
  for (std::size_t p = 0; (p = escaped.find('\n', p)) != std::string::npos; p += 2) escaped.replace(p, 1, "\\n");
  const auto e = chat_dir("chatml_escaped", nlohmann::json{{"chat_template", escaped}}.dump());
  EXPECT_EQ(model::chat_prompt(e.string(), "Hi?"), model::chat_prompt(d.string(), "Hi?"));
  // A conversation (the server's messages): the default system turn once, then every turn in order.
  const std::vector<model::ChatMessage> conv = {{"user", "Hi?"}, {"assistant", "Hello."}, {"user", "Bye?"}};
  EXPECT_EQ(model::chat_prompt(d.string(), conv),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\nBye?<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<model::ChatMessage> bad_role = {{"tool", "x"}};
  EXPECT_THROW(model::chat_prompt(d.string(), bad_role), Error);
}

TEST(ChatPrompt, Llama3AndErrors) {
  const auto l3 = chat_dir("llama3", R"({"chat_template": "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}"})");
  EXPECT_EQ(model::chat_prompt(l3.string(), "Hi?"),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const auto other = chat_dir("other", R"({"chat_template": "[INST] {{ message['content'] }} [/INST]"})");
  EXPECT_THROW(model::chat_prompt(other.string(), "Hi?"), Error);
  const auto none = chat_dir("none", R"({"bos_token": "<s>"})");
  EXPECT_THROW(model::chat_prompt(none.string(), "Hi?"), Error);
  const auto bad = chat_dir("bad", "{not json");
  EXPECT_THROW(model::chat_prompt(bad.string(), "Hi?"), Error);
  EXPECT_THROW(model::chat_prompt((bad / "missing").string(), "Hi?"), Error);
}

}  // namespace
}  // namespace twell::test
