// Checkpoint loading: HF safetensors (single file or sharded) → Model, every tensor checked.
#include "twell/model/model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <omp.h>
#include <nlohmann/json.hpp>

#include "twell/bf16.hpp"
#include "twell/error.hpp"
#include "twell/host_memory.hpp"
#include "twell/io/mapped_reads.hpp"
#include "twell/io/safetensors.hpp"

namespace twell::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The checkpoint's files, opened (headers validated), and the tensors not yet taken by name, each
// with its file. Tensors are read one at a time as they are taken, straight into the model's
// vectors where the dtype allows (no copy of the whole file is ever held).
struct Tensors {
  std::vector<io::SafetensorsReader> files;
  std::map<std::string, std::size_t> by_name;  // → files[i]
  std::map<std::string, std::string> file_of;
  std::vector<std::byte> scratch;  // a tensor's file bytes before conversion
};

void add_file(Tensors& t, const std::string& path) {
  io::ReadOptions ro;
  ro.f16_to_f32 = true;
  t.files.emplace_back(path, ro);
  for (const auto& info : t.files.back().tensors()) {
    TWELL_CHECK(!t.by_name.count(info.name), ErrorCode::corrupt, "{}: tensor {} also appears in {}", path, info.name,
                t.file_of[info.name]);
    t.file_of[info.name] = path;
    t.by_name.emplace(info.name, t.files.size() - 1);
  }
}

Tensors read_checkpoint(const fs::path& dir) {
  Tensors t;
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream f(index);
    TWELL_CHECK(f.good(), ErrorCode::io, "cannot open {}", index.string());
    json j;
    try {
      j = json::parse(f);
    } catch (const json::exception& e) {
      fail(ErrorCode::corrupt, "{}: not valid JSON ({})", index.string(), e.what());
    }
    TWELL_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), ErrorCode::corrupt,
                "{}: no \"weight_map\" object", index.string());
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      TWELL_CHECK(file.is_string(), ErrorCode::corrupt, "{}: weight_map[{}] is not a file name", index.string(), name);
      const auto s = file.get<std::string>();
      TWELL_CHECK(s.find('/') == std::string::npos && s.find("..") == std::string::npos, ErrorCode::corrupt,
                  "{}: shard name \"{}\" must be a plain file name in the checkpoint directory", index.string(), s);
      shards.insert(s);
    }
    for (const auto& s : shards) add_file(t, (dir / s).string());
    // Every tensor must sit in the shard the index names, and the index must name every tensor.
    for (const auto& [name, file] : j["weight_map"].items()) {
      auto it = t.file_of.find(name);
      TWELL_CHECK(it != t.file_of.end(), ErrorCode::corrupt, "{}: {} is listed in shard {} but not found there",
                  index.string(), name, file.get<std::string>());
      TWELL_CHECK(fs::path(it->second).filename() == file.get<std::string>(), ErrorCode::corrupt,
                  "{}: {} is listed in {} but found in {}", index.string(), name, file.get<std::string>(), it->second);
    }
    for (const auto& [name, file] : t.file_of)
      TWELL_CHECK(j["weight_map"].contains(name), ErrorCode::corrupt, "{}: {} (in {}) is missing from the index",
                  index.string(), name, file);
  } else if (fs::exists(single)) {
    add_file(t, single.string());
  } else {
    fail(ErrorCode::io, "{}: neither model.safetensors nor model.safetensors.index.json found", dir.string());
  }
  return t;
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Takes `name` out of t as fp32 values of exactly `shape`.
// The tensor `name`'s file, its shape and dtype (fp32 or bf16) checked.
io::SafetensorsReader& find(Tensors& t, const std::string& name, const std::vector<std::int64_t>& shape) {
  auto it = t.by_name.find(name);
  TWELL_CHECK(it != t.by_name.end(), ErrorCode::corrupt, "checkpoint has no tensor {} (expected shape {})", name,
              shape_str(shape));
  io::SafetensorsReader& f = t.files[it->second];
  const io::SafetensorsReader::Info& h = *f.find(name);
  TWELL_CHECK(h.shape == shape, ErrorCode::shape_mismatch, "{} in {} has shape {}, the config implies {}", name,
              t.file_of[name], shape_str(h.shape), shape_str(shape));
  TWELL_CHECK(h.dtype == DType::f32 || h.dtype == DType::bf16, ErrorCode::dtype_mismatch,
              "{} in {} is {}, expected a floating-point tensor", name, t.file_of[name], to_string(h.dtype));
  return f;
}

// The tensor's bytes into t.scratch (its dtype as the file holds it, F16 as f32).
DType read_scratch(Tensors& t, io::SafetensorsReader& f, const std::string& name) {
  const io::SafetensorsReader::Info& h = *f.find(name);
  t.scratch.resize(h.bytes);
  f.read_into(name, t.scratch);
  return h.dtype;
}

void check_finite(Tensors& t, const std::string& name, bool finite, std::size_t i) {
  TWELL_CHECK(finite, ErrorCode::non_finite, "{} in {} holds a non-finite value at flat index {}", name, t.file_of[name], i);
}

// read: whether the reads of the tensor's mapped bytes ran to the end (io::read_guarded).
void check_read(Tensors& t, const std::string& name, bool read) {
  TWELL_CHECK(read, ErrorCode::io, "{} changed while {} was read from it (truncated in place?): load the model again",
              t.file_of[name], name);
}

// The tensor's bytes viewed in the mapped file where they are aligned for `align`-byte elements;
// else empty (then they are read).
io::SafetensorsReader::View aligned_view(io::SafetensorsReader& f, const std::string& name, std::size_t align) {
  io::SafetensorsReader::View v = f.view(name);
  if (v.bytes.empty() || reinterpret_cast<std::uintptr_t>(v.bytes.data()) % align != 0) return {};
  return v;
}

// The tensor's values as fp32, the tensor left in t. Straight into the vector (no fp32 tensor in
// between: loading is mostly the kernel's zeroing of fresh pages, so every copy avoided shows).
std::vector<float> values(Tensors& t, const std::string& name, const std::vector<std::int64_t>& shape) {
  io::SafetensorsReader& f = find(t, name, shape);
  const io::SafetensorsReader::Info& h = *f.find(name);
  const std::size_t n = h.bytes / dtype_size(h.dtype);
  // The vector is built from the file's bytes viewed in place (mapped) where they can be: no
  // zero-filled vector overwritten afterwards. Else an fp32 (or F16) tensor is read straight into
  // it, a bf16 one into scratch first.
  const io::SafetensorsReader::View view = aligned_view(f, name, alignof(float));
  if (view.bytes.empty() && h.dtype == DType::f32) {
    std::vector<float> v(n);
    f.read_into(name, std::as_writable_bytes(std::span(v)));
    return v;
  }
  if (view.bytes.empty()) read_scratch(t, f, name);
  const std::byte* bytes = view.bytes.empty() ? t.scratch.data() : view.bytes.data();
  std::vector<float> v;
  v.reserve(n);  // outside the guard: nothing is allocated where a fault may abandon the copy
  // Reads of the mapping under the guard: a file truncated in place meanwhile is an error, not a
  // SIGBUS.
  const bool read = io::read_guarded([&] {
    if (h.dtype == DType::f32) {
      const auto* p = reinterpret_cast<const float*>(bytes);
      v.insert(v.end(), p, p + n);  // within the capacity; no zero-filled buffer overwritten afterwards
    } else {
      append_converted(v, reinterpret_cast<const bf16*>(bytes), n, [](bf16 b) { return to_float(b); });
    }
  });
  check_read(t, name, read);
  return v;
}

// The index of the first element of v[0, n) for which bad() holds, or n: a branch-free scan in
// blocks (the compiler vectorises it), the index looked for only in a block that has one.
template <class T, class Bad>
std::size_t first_where(const T* v, std::size_t n, Bad bad) {
  constexpr std::size_t kBlock = 4096;
  for (std::size_t b = 0; b < n; b += kBlock) {
    const std::size_t e = std::min(n, b + kBlock);
    unsigned any = 0;
    for (std::size_t i = b; i < e; ++i) any |= static_cast<unsigned>(bad(v[i]));
    if (any)
      for (std::size_t i = b; i < e; ++i)
        if (bad(v[i])) return i;
  }
  return n;
}

// first_where over v[0, n) in blocks read by several threads at once (a 2B checkpoint's 4.4 GB of
// mapped bf16 scanned by one thread took ≈ 0.5 s, most of a load), each block under the SIGBUS
// guard (v may view a mapped file); the smallest index found, or n. read: whether every block
// ran to its end.
template <class T, class Bad>
std::size_t first_where_parallel(const T* v, std::size_t n, Bad bad, bool& read) {
  constexpr std::size_t kPerThread = std::size_t{1} << 22;  // elements; fewer: one thread
  const int team = static_cast<int>(std::clamp<std::size_t>(n / kPerThread, 1, static_cast<std::size_t>(omp_get_max_threads())));
  const std::size_t part = (n + static_cast<std::size_t>(team) - 1) / static_cast<std::size_t>(team);
  std::vector<std::size_t> first(static_cast<std::size_t>(team), n);
  std::vector<char> ok(static_cast<std::size_t>(team), 1);
#pragma omp parallel for num_threads(team) schedule(static) if (team > 1)
  for (int t = 0; t < team; ++t) {
    const std::size_t b = static_cast<std::size_t>(t) * part, e = std::min(n, b + part);
    if (b >= e) continue;
    std::size_t f = e - b;
    ok[static_cast<std::size_t>(t)] = io::read_guarded([&] { f = first_where(v + b, e - b, bad); });
    if (f < e - b) first[static_cast<std::size_t>(t)] = b + f;
  }
  read = std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; });
  return *std::min_element(first.begin(), first.end());
}

// Non-finite: the exponent all ones (Inf, NaN), in fp32 and in bf16 bits.
bool nonfinite(float x) { return (std::bit_cast<std::uint32_t>(x) & 0x7f800000u) == 0x7f800000u; }
bool nonfinite16(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u; }

// The tensor as fp32, finite, then released from t.
std::vector<float> take(Tensors& t, const std::string& name, std::vector<std::int64_t> shape) {
  std::vector<float> v = values(t, name, shape);
  bool read = true;  // (the model's own memory: always read to the end)
  const std::size_t bad = first_where_parallel(v.data(), v.size(), [](float x) { return nonfinite(x); }, read);
  check_finite(t, name, bad == v.size(), bad);
  t.by_name.erase(name);
  return v;
}

// As take, as bf16 bits: a bf16 tensor's own — viewed in the mapped file where it can be (no copy,
// no fresh pages: most of a load's time was the kernel zeroing pages for copies), else read — an
// fp32 one's rounded to nearest even (to_bf16, the rounding of the GPU's upload of fp32 weights).
// A finite fp32 value that rounds to ±Inf is non-finite.
Bf16Matrix take16(Tensors& t, const std::string& name, std::vector<std::int64_t> shape) {
  io::SafetensorsReader& f = find(t, name, shape);
  const io::SafetensorsReader::Info& h = *f.find(name);
  const std::size_t n = h.bytes / dtype_size(h.dtype);
  Bf16Matrix::Piece piece;
  piece.size = n;
  if (h.dtype == DType::bf16) {
    io::SafetensorsReader::View view = aligned_view(f, name, alignof(std::uint16_t));
    if (!view.bytes.empty()) {
      piece.bits = reinterpret_cast<const std::uint16_t*>(view.bytes.data());
      piece.owner = std::move(view.owner);
      piece.mapped = true;
    }
  }
  if (!piece.owner) {  // read (an unaligned or unmappable bf16 tensor) or converted (fp32)
    auto own = std::make_shared<std::vector<std::uint16_t>>(n);
    if (h.dtype == DType::bf16) {
      f.read_into(name, std::as_writable_bytes(std::span(*own)));
    } else {
      read_scratch(t, f, name);
      const auto* in = reinterpret_cast<const float*>(t.scratch.data());
      for (std::size_t i = 0; i < n; ++i) (*own)[i] = to_bf16(in[i]).bits;
    }
    piece.bits = own->data();
    piece.owner = std::move(own);
  }
  bool read = true;
  // (a lambda, not the function's pointer: inlined and vectorised inside the threads' outlined loop)
  const std::size_t bad = first_where_parallel(piece.bits, n, [](std::uint16_t b) { return nonfinite16(b); }, read);
  check_read(t, name, read);
  check_finite(t, name, bad == n, bad);
  t.by_name.erase(name);
  Bf16Matrix m;
  m.pieces.push_back(std::move(piece));
  return m;
}

}  // namespace

std::size_t Bf16Matrix::size() const noexcept {
  std::size_t n = 0;
  for (const Piece& p : pieces) n += p.size;
  return n;
}

std::vector<std::uint16_t> Bf16Matrix::to_vector() const {
  std::vector<std::uint16_t> v(size());
  std::size_t at = 0;
  for (const Piece& p : pieces) {
    TWELL_CHECK(io::copy_guarded(v.data() + at, p.bits, p.size * sizeof(std::uint16_t)), ErrorCode::io,
                "a mapped checkpoint file changed while it was read (truncated in place?): load the model again");
    at += p.size;
  }
  return v;
}

Bf16Matrix Bf16Matrix::then(const Bf16Matrix& b) const {
  Bf16Matrix m = *this;
  m.pieces.insert(m.pieces.end(), b.pieces.begin(), b.pieces.end());
  return m;
}

void Model::check_mapped_files() const {
  for (const MappedFile& was : mapped_files) {
    const std::optional<io::SafetensorsReader::FileId> now = io::SafetensorsReader::stat_file(was.path);
    // Gone, or another file under the name (replaced): the mapping keeps the file it maps, whose
    // inode cannot be reused while mapped.
    if (!now || now->inode != was.id.inode || now->device != was.id.device) continue;
    TWELL_CHECK(now->size == was.id.size && now->mtime_ns == was.id.mtime_ns, ErrorCode::io,
                "{} was changed in place since the model was loaded from it ({} → {} bytes): load the model again",
                was.path, was.id.size, now->size);
  }
}

std::int64_t Model::weight_bytes() const noexcept {
  auto own16 = [](const Bf16Matrix& b) {
    std::size_t n = 0;
    for (const Bf16Matrix::Piece& p : b.pieces) n += p.mapped ? 0 : p.size;
    return n;
  };
  std::size_t n = embed.size() + final_norm.size() + lm_head.size(), n16 = own16(embed16) + own16(lm_head16);
  for (const auto& l : layers) {
    n += l.attn_norm.size() + l.wqkv.size() + l.wo.size() + l.ffn_norm.size() + l.w_gate.size() + l.w_up.size() +
         l.w_down.size();
    n16 += own16(l.wqkv16) + own16(l.wo16) + own16(l.w_gate16) + own16(l.w_up16) + own16(l.w_down16);
  }
  return static_cast<std::int64_t>(n * sizeof(float) + n16 * sizeof(std::uint16_t));
}

Model Model::load(const std::string& dir_str, const LoadOptions& opt) {
  const fs::path dir(dir_str);
  TWELL_CHECK(fs::is_directory(dir), ErrorCode::io, "{} is not a directory (expected a Hugging Face checkpoint)",
              dir_str);
  Model m;
  m.dir = dir_str;
  m.config = load_llama_config(dir_str);
  if (opt.hidden_act) {
    m.config.act = parse_activation(*opt.hidden_act);
  }
  const LlamaConfig& c = m.config;
  // Peak host memory: the fp32 copies (4 bytes a parameter; bf16_only: at most 2, none for a bf16
  // file's tensors, which stay in the page cache) and one tensor's bytes at a time in the reading
  // scratch (the largest tensor, as fp32).
  m.bf16_only = opt.bf16_only;
  Tensors t = read_checkpoint(dir);  // the headers
  std::uint64_t largest = 0;
  for (const io::SafetensorsReader& f : t.files)
    for (const io::SafetensorsReader::Info& info : f.tensors()) largest = std::max(largest, info.bytes);
  check_host_memory((opt.bf16_only ? 2.0 : 4.0) * static_cast<double>(c.parameters()) + static_cast<double>(largest),
                    fmt::format("loading {} ({:.2f} B parameters)", dir_str, static_cast<double>(c.parameters()) / 1e9));
  const std::int64_t K = c.hidden_size, N = c.intermediate_size, V = c.vocab_size;
  // A weight matrix into its fp32 vector, or (bf16_only) its bf16 one.
  auto matrix = [&](const std::string& name, std::vector<std::int64_t> shape, std::vector<float>& f32,
                    Bf16Matrix& b16) {
    if (opt.bf16_only)
      b16 = take16(t, name, std::move(shape));
    else
      f32 = take(t, name, std::move(shape));
  };

  if (c.tied_embeddings && t.by_name.count("lm_head.weight")) {
    // Some exporters also write the tied head; it must then equal the embedding (as the file's
    // values, whatever the model keeps).
    TWELL_CHECK(values(t, "lm_head.weight", {V, K}) == values(t, "model.embed_tokens.weight", {V, K}), ErrorCode::corrupt,
                "config.json says tie_word_embeddings but lm_head.weight differs from model.embed_tokens.weight");
    t.by_name.erase("lm_head.weight");
  }
  matrix("model.embed_tokens.weight", {V, K}, m.embed, m.embed16);
  m.final_norm = take(t, "model.norm.weight", {K});
  if (!c.tied_embeddings) {
    matrix("lm_head.weight", {V, K}, m.lm_head, m.lm_head16);
  }
  m.layers.resize(static_cast<std::size_t>(c.num_layers));
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = m.layers[static_cast<std::size_t>(i)];
    const std::string p = fmt::format("model.layers.{}.", i);
    l.attn_norm = take(t, p + "input_layernorm.weight", {K});
    l.ffn_norm = take(t, p + "post_attention_layernorm.weight", {K});
    // q_proj, k_proj and v_proj rows stacked into one matrix.
    auto stack = [&](auto& out, auto&& q, auto&& k, auto&& v) {
      out.reserve(q.size() + k.size() + v.size());
      out.insert(out.end(), q.begin(), q.end());
      out.insert(out.end(), k.begin(), k.end());
      out.insert(out.end(), v.begin(), v.end());
    };
    const std::string q = p + "self_attn.q_proj.weight", k = p + "self_attn.k_proj.weight", v = p + "self_attn.v_proj.weight";
    if (opt.bf16_only)
      l.wqkv16 = take16(t, q, {c.q_dim(), K}).then(take16(t, k, {c.kv_dim(), K})).then(take16(t, v, {c.kv_dim(), K}));
    else
      stack(l.wqkv, take(t, q, {c.q_dim(), K}), take(t, k, {c.kv_dim(), K}), take(t, v, {c.kv_dim(), K}));
    matrix(p + "self_attn.o_proj.weight", {K, c.q_dim()}, l.wo, l.wo16);
    matrix(p + "mlp.gate_proj.weight", {N, K}, l.w_gate, l.w_gate16);
    matrix(p + "mlp.up_proj.weight", {N, K}, l.w_up, l.w_up16);
    matrix(p + "mlp.down_proj.weight", {K, N}, l.w_down, l.w_down16);
    // RoPE's frequency table, which older exports saved; computed here from rope_theta instead.
    t.by_name.erase(p + "self_attn.rotary_emb.inv_freq");
  }
  // The files the model's matrices still view, as they were when opened (the header's file).
  for (const io::SafetensorsReader& f : t.files)
    if (f.viewed()) m.mapped_files.push_back({f.path(), f.file_id()});
  if (!t.by_name.empty()) {
    std::string names;
    int shown = 0;
    for (const auto& [name, _] : t.by_name) {
      if (shown++ == 5) {
        names += ", ...";
        break;
      }
      names += (names.empty() ? "" : ", ") + name;
    }
    fail(ErrorCode::corrupt, "{}: {} tensor(s) this Llama config does not use: {}", dir_str, t.by_name.size(), names);
  }
  return m;
}

}  // namespace twell::model
