// model_logits: the CPU runtime's logits for the parity test (model_parity.py).
//   model_logits DIR "1,2,3;4,5" OUT.safetensors [dense|sparse|auto] [chunk] [hidden_act|-] [greedy_n] [cpu|cuda]
// Writes logits_{i} [len_i, V] (f32, every position) per sequence. The sequences run as one batch,
// each fed in chunks of `chunk` tokens (0: whole), so the batching and the KV cache are exercised.
// With greedy_n > 0 it also generates greedy_n tokens greedily from each sequence (greedy_{i}, i32).
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "twell/io/safetensors.hpp"
#include "twell/model/generate.hpp"

using namespace twell;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: model_logits DIR \"1,2;3\" OUT [dense|sparse|auto] [chunk] [hidden_act|-] [greedy_n] [cpu|cuda]\n");
    return 2;
  }
  try {
    model::LoadOptions lo;
    if (argc > 6 && std::string(argv[6]) != "-") lo.hidden_act = argv[6];
    const model::Model m = model::Model::load(argv[1], lo);
    if (const auto w = model::unknown_keys_warning(m.config); !w.empty()) std::fprintf(stderr, "warning: %s\n", w.c_str());
    model::RuntimeOptions ro;
    const std::string mode = argc > 4 ? argv[4] : "auto";
    ro.ffn_path = mode == "dense" ? model::FfnPath::dense : mode == "sparse" ? model::FfnPath::sparse : model::FfnPath::automatic;
    const std::size_t chunk = argc > 5 ? std::stoul(argv[5]) : 0;
    const long greedy_n = argc > 7 ? std::stol(argv[7]) : 0;
    std::vector<std::vector<std::int32_t>> seqs;
    std::stringstream all(argv[2]);
    for (std::string s; std::getline(all, s, ';');) {
      seqs.emplace_back();
      std::stringstream ss(s);
      for (std::string t; std::getline(ss, t, ',');) seqs.back().push_back(static_cast<std::int32_t>(std::stol(t)));
    }
    const std::string device = argc > 8 ? argv[8] : "cpu";
    auto rt = model::make_runtime(m, device, ro);
    const std::int64_t V = m.config.vocab_size;
    std::vector<std::unique_ptr<model::Sequence>> kv;
    for (auto& s : seqs) kv.push_back(rt->new_sequence(static_cast<std::int64_t>(s.size())));
    std::vector<std::vector<float>> logits(seqs.size());
    for (std::size_t off = 0;; off += chunk) {
      std::vector<model::SeqStep> steps;
      std::vector<std::size_t> who;
      for (std::size_t i = 0; i < seqs.size(); ++i) {
        if (off >= seqs[i].size() || (chunk == 0 && off > 0)) continue;
        const std::size_t n = chunk == 0 ? seqs[i].size() : std::min(chunk, seqs[i].size() - off);
        steps.push_back({kv[i].get(), std::span<const std::int32_t>(seqs[i].data() + off, n)});
        who.push_back(i);
      }
      if (steps.empty()) break;
      const auto l = rt->forward(steps, true);
      std::size_t row = 0;
      for (std::size_t j = 0; j < who.size(); ++j) {
        const std::size_t n = steps[j].tokens.size();
        logits[who[j]].insert(logits[who[j]].end(), l.begin() + static_cast<long>(row * V), l.begin() + static_cast<long>((row + n) * V));
        row += n;
      }
      if (chunk == 0) break;
    }
    std::vector<HostTensor> out;
    std::vector<std::string> names;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      out.push_back(HostTensor::from_f32({static_cast<std::int64_t>(seqs[i].size()), V}, logits[i]));
      names.push_back(fmt::format("logits_{}", i));
    }
    if (greedy_n > 0) {
      model::GenerateOptions g;
      g.max_new_tokens = greedy_n;
      g.ignore_eos = true;
      const auto gen = model::generate(*rt, seqs, g);
      for (std::size_t i = 0; i < seqs.size(); ++i) {
        HostTensor t(DType::i32, {static_cast<std::int64_t>(gen[i].tokens.size())});
        std::copy(gen[i].tokens.begin(), gen[i].tokens.end(), t.data<std::int32_t>());
        out.push_back(std::move(t));
        names.push_back(fmt::format("greedy_{}", i));
      }
    }
    std::vector<io::TensorRef> refs;
    for (std::size_t i = 0; i < out.size(); ++i) refs.push_back({names[i], &out[i]});
    std::map<std::string, std::string> meta;
    for (std::size_t l = 0; l < rt->ffn_stats().size(); ++l)
      meta[fmt::format("active_{}", l)] = std::to_string(rt->ffn_stats()[l].active);
    io::write_safetensors(argv[3], refs, meta);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_logits: %s\n", e.what());
    return 1;
  }
}
