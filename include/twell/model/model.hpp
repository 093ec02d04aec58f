#pragma once
// A Llama model's weights on the host, loaded from a Hugging Face checkpoint directory
// (config.json + model.safetensors, or shards listed by model.safetensors.index.json).
// Tensors may be bf16, fp16 or fp32; they are held as fp32 (or, bf16_only, as bf16 bits viewing the
// file where it holds bf16). Every tensor's name and shape is
// checked against the config at load time: a missing, extra or misshaped tensor is an error
// naming it, never a silently wrong model.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "twell/io/safetensors.hpp"
#include "twell/model/config.hpp"

namespace twell::model {

// A weight matrix as bf16 bits, row-major, in pieces laid end to end (a QKV projection: q, k and
// v as the file holds them). A piece views the checkpoint's file mapped read-only (a bf16 tensor:
// no copy, no fresh pages) or a vector of its own (rounded from fp32); its owner keeps either
// alive, so copies share and nothing is ever written through a piece. Views are for reading soon
// after the load (the GPU's upload): a file truncated in place while mapped faults on access, so
// nothing that lives on (the CPU runtime's weights) keeps reading them.
struct Bf16Matrix {
  struct Piece {
    std::shared_ptr<const void> owner;
    const std::uint16_t* bits = nullptr;
    std::size_t size = 0;
    bool mapped = false;  // a view of the file (page cache), not memory of the process's own
  };
  std::vector<Piece> pieces;

  std::size_t size() const noexcept;
  bool empty() const noexcept { return size() == 0; }
  std::vector<std::uint16_t> to_vector() const;  // the pieces concatenated
  // This matrix's pieces, then b's: [a; b] stacked by rows (no bits copied).
  Bf16Matrix then(const Bf16Matrix& b) const;
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [K]
  std::vector<float> wqkv;       // [q_dim + 2·kv_dim, K]: q_proj, k_proj, v_proj rows stacked (one GEMM)
  std::vector<float> wo;         // [K, q_dim]
  std::vector<float> ffn_norm;   // [K]
  std::vector<float> w_gate;     // [N, K]
  std::vector<float> w_up;       // [N, K]
  std::vector<float> w_down;     // [K, N]
  // (The CPU runtime's sparse path also needs Wdᵀ: it prepares its own, so a model bound for the
  // GPU never holds that copy.)
  // A model loaded with LoadOptions::bf16_only holds the five matrices as bf16 bits here instead
  // (the fp32 vectors above stay empty; the norms stay fp32).
  Bf16Matrix wqkv16, wo16, w_gate16, w_up16, w_down16;

  LayerWeights() = default;
  LayerWeights(LayerWeights&&) = default;  // vectors move their buffers: views into them stay valid
  LayerWeights& operator=(LayerWeights&&) = default;
  LayerWeights(const LayerWeights&) = delete;
  LayerWeights& operator=(const LayerWeights&) = delete;
};

struct LoadOptions {
  // Overrides config.json's hidden_act (the paper's released ReLU models say "silu").
  std::optional<std::string> hidden_act;
  // Keep the weight matrices (embedding, head, projections, FFN) as bf16 only, rounded to nearest
  // even from an fp32 file as the GPU's upload rounds: the bits the CUDA runtime holds either way,
  // with 2 bytes a parameter on the host instead of 4 (plus the file's) and no conversions. The
  // CPU runtime refuses such a model (it computes in fp32).
  bool bf16_only = false;
};

struct Model {
  LlamaConfig config;
  std::string dir;
  std::vector<float> embed;       // [V, K]
  std::vector<float> final_norm;  // [K]
  std::vector<float> lm_head;     // [V, K]; empty when tied to embed
  std::vector<LayerWeights> layers;
  bool bf16_only = false;              // LoadOptions::bf16_only: the matrices are in the *16 fields
  Bf16Matrix embed16;    // [V, K] bf16 bits (bf16_only)
  Bf16Matrix lm_head16;  // [V, K]; empty when tied (bf16_only)

  // The fp32 head (an fp32 model's; null for a bf16_only one).
  const float* head() const noexcept { return lm_head.empty() ? embed.data() : lm_head.data(); }
  // Host bytes of the weights the process holds (views of the mapped file not counted: the page
  // cache holds those).
  std::int64_t weight_bytes() const noexcept;

  static Model load(const std::string& dir, const LoadOptions& opt = {});

  // The files whose mapped bytes the bf16 matrices view (bf16_only loads), as they were when mapped.
  struct MappedFile {
    std::string path;
    io::SafetensorsReader::FileId id;
  };
  std::vector<MappedFile> mapped_files;
  // Throws ErrorCode::io naming the file if one of mapped_files was changed in place since the load
  // (the same inode, another size or time: reading its mapping could fault or give other bytes). A
  // file replaced by another (renamed over it) is fine: the mapping keeps the old one. Callers that
  // read the views (the CUDA runtime's upload) check first.
  void check_mapped_files() const;
};

}  // namespace twell::model
