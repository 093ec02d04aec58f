// twell._twell.NativeModel: a Hugging Face Llama checkpoint on twell's native runtime (CPU, or CUDA in a
// CUDA build), its tokenizer when the directory has tokenizer.json, and generation. The GIL is released
// while the model runs; a streaming callback takes it back for each token. twell/model.py wraps it.
#include "model_api.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "twell/error.hpp"
#include "twell/model/generate.hpp"
#include "twell/model/model.hpp"
#include "twell/model/runtime.hpp"
#include "twell/model/tokenizer.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace twell::python {
namespace {

using Ids = std::vector<std::int32_t>;

class NativeModel {
 public:
  NativeModel(const std::string& dir, const std::string& device, const std::optional<std::string>& hidden_act,
              const std::string& ffn) {
    model::LoadOptions lo;
    lo.hidden_act = hidden_act;
    model::RuntimeOptions ro;
    if (ffn == "dense")
      ro.ffn_path = model::FfnPath::dense;
    else if (ffn == "sparse")
      ro.ffn_path = model::FfnPath::sparse;
    else
      TWELL_CHECK(ffn == "auto", ErrorCode::invalid_argument, "ffn must be 'auto', 'dense' or 'sparse', got '{}'", ffn);
    TWELL_CHECK(device == "auto" || device == "cpu" || device == "cuda", ErrorCode::invalid_argument,
                "device must be 'auto', 'cpu' or 'cuda', got '{}'", device);
    {
      nb::gil_scoped_release release;
      // The GPU holds bf16 weights: a model bound for it is loaded as bf16 only (half the host memory).
      const bool gpu = device == "cuda" || (device == "auto" && model::cuda_usable());
      lo.bf16_only = gpu;
      // (A weight that bf16 cannot hold, ±Inf once rounded, is refused here: the GPU could not hold it.)
      model_ = std::make_unique<model::Model>(model::Model::load(dir, lo));
      const std::string tok = (std::filesystem::path(dir) / "tokenizer.json").string();
      if (std::filesystem::exists(tok)) {
        tokenizer_.emplace(model::Tokenizer::from_file(tok));
        TWELL_CHECK(tokenizer_->vocab_size() <= model_->config.vocab_size, ErrorCode::corrupt,
                    "tokenizer.json has {} tokens but the model's vocabulary holds {}", tokenizer_->vocab_size(),
                    model_->config.vocab_size);
      }
      // "auto": the GPU where this build has CUDA and one is usable (and the model fits), else the CPU.
      try {
        runtime_ = model::make_runtime(*model_, gpu ? "cuda" : "cpu", ro);
      } catch (const Error&) {
        if (device != "auto" || !gpu) throw;
        lo.bf16_only = false;  // the CPU computes in fp32: load again (the bf16 copy freed first)
        model_.reset();
        model_ = std::make_unique<model::Model>(model::Model::load(dir, lo));
        runtime_ = model::make_runtime(*model_, "cpu", ro);
      }
    }
    dir_ = dir;
  }

  std::string device() const { return runtime_->device() == "cpu" ? "cpu" : "cuda"; }
  std::string device_name() const { return runtime_->device(); }
  nb::dict config() const {
    const auto& c = model_->config;
    nb::dict d;
    d["vocab_size"] = c.vocab_size;
    d["hidden_size"] = c.hidden_size;
    d["intermediate_size"] = c.intermediate_size;
    d["num_layers"] = c.num_layers;
    d["num_heads"] = c.num_heads;
    d["num_kv_heads"] = c.num_kv_heads;
    d["head_dim"] = c.head_dim;
    d["max_position"] = c.max_position;
    d["hidden_act"] = std::string(model::to_string(c.act));
    d["tied_embeddings"] = c.tied_embeddings;
    d["eos_ids"] = c.eos_ids;
    d["bos_ids"] = c.bos_ids;
    d["parameters"] = c.parameters();
    d["architecture"] = c.architecture;
    d["rope_theta"] = c.rope_theta;
    d["rope_type"] = std::string(model::to_string(c.rope_scaling.type));
    d["sliding_window"] = c.sliding_window;
    d["unknown_keys"] = c.unknown_keys;  // config.json keys twell does not read (ignored)
    return d;
  }
  bool has_tokenizer() const { return tokenizer_.has_value(); }

  Ids encode(const std::string& text, bool add_special) const {
    return tok().encode(text, add_special);
  }
  nb::bytes decode(const Ids& ids, bool skip_special) const {
    const std::string s = tok().decode(ids, skip_special);
    return nb::bytes(s.data(), s.size());
  }
  std::optional<std::int32_t> token_id(const std::string& token) const { return tok().token_id(token); }
  model::StreamDecoder stream_decoder(bool skip_special) const { return model::StreamDecoder(tok(), skip_special); }
  std::string chat_prompt(const std::string& user, const std::string& system) const {
    return model::chat_prompt(dir_, user, system);
  }

  // Logits of every position of one sequence (a fresh cache), [len, V] float32.
  nb::ndarray<nb::numpy, float, nb::ndim<2>> logits(const Ids& ids) {
    TWELL_CHECK(!ids.empty(), ErrorCode::invalid_argument, "logits: no tokens");
    auto out = std::make_unique<std::vector<float>>();
    {
      nb::gil_scoped_release release;
      auto seq = runtime_->new_sequence(static_cast<std::int64_t>(ids.size()));
      const model::SeqStep step{seq.get(), ids};
      *out = runtime_->forward(std::span<const model::SeqStep>(&step, 1), true);
    }
    const std::size_t rows = ids.size(), v = static_cast<std::size_t>(model_->config.vocab_size);
    float* data = out->data();
    nb::capsule owner(out.release(), [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    return nb::ndarray<nb::numpy, float, nb::ndim<2>>(data, {rows, v}, owner);
  }

  // Generations of a batch of prompts: ([(tokens, stop_reason)], times).
  std::tuple<std::vector<std::tuple<Ids, std::string>>, nb::dict> generate(
      const std::vector<Ids>& prompts, std::int64_t max_new_tokens, double temperature, std::int64_t top_k,
      double top_p, double repetition_penalty, std::uint64_t seed, const Ids& stop_ids, bool ignore_eos,
      const std::optional<std::function<void(std::size_t, std::int32_t)>>& on_token) {
    model::GenerateOptions o;
    o.max_new_tokens = max_new_tokens;
    o.sampling = {temperature, top_k, top_p, repetition_penalty, seed};
    o.stop_ids = stop_ids;
    o.ignore_eos = ignore_eos;
    model::check_sampling(o.sampling);
    model::TokenCallback cb;
    if (on_token)
      cb = [&](std::size_t i, std::int32_t id) {
        nb::gil_scoped_acquire acquire;
        (*on_token)(i, id);  // a Python exception propagates out of generate (nb::python_error)
      };
    std::vector<model::Generation> gens;
    model::GenerateTimes t;
    {
      nb::gil_scoped_release release;
      gens = model::generate(*runtime_, prompts, o, cb, &t);
    }
    std::vector<std::tuple<Ids, std::string>> out;
    for (auto& g : gens) out.emplace_back(std::move(g.tokens), g.stop_reason);
    nb::dict times;
    times["prefill_seconds"] = t.prefill_seconds;
    times["decode_seconds"] = t.decode_seconds;
    times["prefill_tokens"] = t.prefill_tokens;
    times["decode_tokens"] = t.decode_tokens;
    return {std::move(out), times};
  }

 private:
  const model::Tokenizer& tok() const {
    TWELL_CHECK(tokenizer_.has_value(), ErrorCode::invalid_argument,
                "{} has no tokenizer.json: pass token ids instead of text", dir_);
    return *tokenizer_;
  }

  std::string dir_;
  std::unique_ptr<model::Model> model_;  // the runtime keeps a pointer to it
  std::unique_ptr<model::Runtime> runtime_;
  std::optional<model::Tokenizer> tokenizer_;
};

}  // namespace

void bind_model(nb::module_& m) {
  nb::class_<model::StreamDecoder>(m, "StreamDecoder",
                                   "Token ids to text as they come: push(id) returns the bytes that are complete UTF-8 so "
                                   "far, flush() the rest (an incomplete character as U+FFFD).")
      .def("push",
           [](model::StreamDecoder& d, std::int32_t id) {
             const std::string s = d.push(id);
             return nb::bytes(s.data(), s.size());
           },
           "id"_a)
      .def("flush", [](model::StreamDecoder& d) {
        const std::string s = d.flush();
        return nb::bytes(s.data(), s.size());
      });
  nb::class_<NativeModel>(m, "NativeModel",
                          "A Hugging Face Llama checkpoint directory on twell's native runtime (see twell.model.Model).")
      .def(nb::init<const std::string&, const std::string&, const std::optional<std::string>&, const std::string&>(),
           "path"_a, "device"_a = "auto", "hidden_act"_a.none() = nb::none(), "ffn"_a = "auto")
      .def_prop_ro("device", &NativeModel::device)
      .def_prop_ro("device_name", &NativeModel::device_name)
      .def_prop_ro("config", &NativeModel::config)
      .def_prop_ro("has_tokenizer", &NativeModel::has_tokenizer)
      .def("encode", &NativeModel::encode, "text"_a, "add_special"_a = false)
      .def("decode", &NativeModel::decode, "ids"_a, "skip_special"_a = false)
      .def("token_id", &NativeModel::token_id, "token"_a)
      .def("chat_prompt", &NativeModel::chat_prompt, "user"_a, "system"_a = "")
      .def("stream_decoder", &NativeModel::stream_decoder, "skip_special"_a = true, nb::keep_alive<0, 1>())
      .def("logits", &NativeModel::logits, "ids"_a)
      .def("generate", &NativeModel::generate, "prompts"_a, "max_new_tokens"_a, "temperature"_a, "top_k"_a, "top_p"_a,
           "repetition_penalty"_a, "seed"_a, "stop_ids"_a, "ignore_eos"_a, "on_token"_a.none());
}

}  // namespace twell::python
