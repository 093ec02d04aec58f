// Byte-level BPE from a Hugging Face tokenizer.json, following the Rust `tokenizers` crate step by
// step so that ids match exactly:
//   added tokens (AddedVocabulary::extract_and_normalize) → pre-tokenizer stages → BPE per piece
//   (BPE::tokenize_with_cache, Word::merge_all) → post-processor template.
// Each piece flows depth-first through the stages, so no stage holds more than one level's pieces.
// Pieces stay raw bytes throughout: ByteLevel's byte→char mapping is a bijection, so the vocab is
// re-keyed by raw bytes once at load instead of mapping every piece (stages placed after ByteLevel,
// which HF runs on the mapped text, are the exception and map/unmap around themselves).
#include "twell/model/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "model/tokenizer_regex.hpp"
#include "twell/error.hpp"

namespace twell::model {
namespace {

using json = nlohmann::json;
using detail::kRustWordClass;
using detail::Regex;
using detail::translate_oniguruma;

// ---------------------------------------------------------------------------------------------
// UTF-8

// One step of strict UTF-8 decoding (Unicode Table 3-7: no overlongs, no surrogates, ≤ U+10FFFF).
// ok: `len` bytes form code point `cp`. invalid: the first `len` bytes are a maximal subpart that
// can never complete (from_utf8_lossy replaces them by one U+FFFD). truncated: the `len` bytes up
// to the end of the input are a valid prefix that more bytes could complete.
struct Utf8Step {
  enum Kind { ok, invalid, truncated } kind;
  int len;
  char32_t cp;
};

Utf8Step utf8_step(const unsigned char* p, std::size_t n) {
  const unsigned b0 = p[0];
  if (b0 < 0x80) return {Utf8Step::ok, 1, b0};
  int need = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return {Utf8Step::invalid, 1, 0};
  }
  char32_t cp = b0 & (need == 1 ? 0x1F : need == 2 ? 0x0F : 0x07);
  for (int k = 1; k <= need; ++k) {
    if (static_cast<std::size_t>(k) >= n) return {Utf8Step::truncated, k, 0};
    const unsigned b = p[k];
    if (b < lo || b > hi) return {Utf8Step::invalid, k, 0};
    lo = 0x80, hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Step::ok, need + 1, cp};
}

// The character starting at s[i]: its length, and its code point or -1 when s[i] starts no valid
// sequence (then it is taken as a one-byte character that no class contains).
struct Char {
  int len;
  std::int32_t cp;
};

Char char_at(std::string_view s, std::size_t i) {
  const auto st = utf8_step(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i);
  if (st.kind == Utf8Step::ok) return {st.len, static_cast<std::int32_t>(st.cp)};
  return {1, -1};
}

// The character ending at s[end) (end > 0), with the same conventions as char_at.
Char char_before(std::string_view s, std::size_t end) {
  for (std::size_t back = 1; back <= 4 && back <= end; ++back) {
    const auto b = static_cast<unsigned char>(s[end - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: the lead is further back
    const Char c = char_at(s, end - back);
    if (c.cp >= 0 && static_cast<std::size_t>(c.len) == back) return c;
    break;
  }
  return {1, -1};
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Unicode White_Space: what Rust's char::is_whitespace and regex `\s` take (HF strips these around
// lstrip/rstrip added tokens), and what Oniguruma's `\s` matches.
bool is_white_space(std::int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// ---------------------------------------------------------------------------------------------
// GPT-2's byte ↔ character alphabet (bytes_to_unicode): printable bytes stand for themselves, the
// 68 others for U+0100..U+0143 in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> utf8;        // byte → UTF-8 of its character
  std::array<std::int16_t, 0x144> byte_of;  // code point → byte, -1 when not in the alphabet

  ByteAlphabet() {
    byte_of.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(utf8[static_cast<std::size_t>(b)], cp);
      byte_of[cp] = static_cast<std::int16_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

std::string to_byte_level(std::string_view raw) {
  const auto& a = alphabet();
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char b : raw) out += a.utf8[b];
  return out;
}

// The raw bytes of a byte-level string, or nullopt when a character is outside the alphabet.
std::optional<std::string> from_byte_level(std::string_view s) {
  const auto& a = alphabet();
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const Char c = char_at(s, i);
    if (c.cp < 0 || c.cp >= static_cast<std::int32_t>(a.byte_of.size()) || a.byte_of[static_cast<std::size_t>(c.cp)] < 0)
      return std::nullopt;
    out += static_cast<char>(a.byte_of[static_cast<std::size_t>(c.cp)]);
    i += static_cast<std::size_t>(c.len);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// JSON access with errors that name the file and the field.
struct Ctx {
  const std::string& what;

  [[noreturn]] void corrupt(std::string_view field, std::string_view msg) const {
    fail(ErrorCode::corrupt, "{}: {}: {}", what, field, msg);
  }
  [[noreturn]] void unsupported(std::string_view field, std::string_view msg) const {
    fail(ErrorCode::unsupported, "{}: {}: {} (twell reads byte-level BPE tokenizers; see twell/model/tokenizer.hpp)", what,
         field, msg);
  }
  const json* member(const json& obj, const char* key) const {
    if (!obj.is_object()) return nullptr;
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  bool get_bool(const json& obj, const char* key, bool dflt, std::string_view field) const {
    const json* v = member(obj, key);
    if (!v) return dflt;
    if (!v->is_boolean()) corrupt(field, fmt::format("'{}' must be true or false", key));
    return v->get<bool>();
  }
  std::optional<std::string> get_opt_string(const json& obj, const char* key, std::string_view field) const {
    const json* v = member(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_string()) corrupt(field, fmt::format("'{}' must be a string", key));
    return v->get<std::string>();
  }
  std::string get_string(const json& obj, const char* key, std::string_view field) const {
    auto s = get_opt_string(obj, key, field);
    if (!s) corrupt(field, fmt::format("missing string '{}'", key));
    return *s;
  }
  std::string type_of(const json& obj, std::string_view field) const {
    if (!obj.is_object()) corrupt(field, "must be an object or null");
    return get_string(obj, "type", field);
  }
  // Token ids: non-negative and below 2^24, which keeps the dense per-id tables bounded for any
  // file (real vocabularies hold a few 10^5 tokens).
  std::int32_t id(const json& v, std::string_view field) const {
    constexpr std::int64_t kMaxId = std::int64_t{1} << 24;
    if (!v.is_number_integer()) corrupt(field, "a token id must be an integer");
    const std::int64_t x = v.is_number_unsigned() ? static_cast<std::int64_t>(std::min<std::uint64_t>(v.get<std::uint64_t>(), kMaxId))
                                                  : v.get<std::int64_t>();
    if (x < 0 || x >= kMaxId) corrupt(field, fmt::format("token id {} is outside [0, {})", v.dump(), kMaxId));
    return static_cast<std::int32_t>(x);
  }
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

template <typename V>
const V* lookup(const StringMap<V>& m, std::string_view key) {
  const auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------------------------
// Merge ranks: (left id, right id) → (rank, merged id), open addressing with linear probing.
class PairMap {
 public:
  struct Value {
    std::uint32_t rank;
    std::int32_t id;
  };

  explicit PairMap(std::size_t expected = 0) {
    std::size_t cap = 16;
    while (cap < expected * 2) cap *= 2;
    slots_.assign(cap, Slot{kEmpty, {0, 0}});
    mask_ = cap - 1;
  }
  // A later entry for the same pair replaces the earlier one, as HF's collect() into a HashMap.
  void insert_or_assign(std::int32_t a, std::int32_t b, Value v) {
    const std::uint64_t k = key(a, b);
    for (std::size_t i = hash(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == k) {
        slots_[i] = Slot{k, v};
        return;
      }
    }
  }
  const Value* find(std::int32_t a, std::int32_t b) const {
    const std::uint64_t k = key(a, b);
    for (std::size_t i = hash(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  struct Slot {
    std::uint64_t key;
    Value value;
  };
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};  // ids are ≥ 0: no pair keys to it
  static std::uint64_t key(std::int32_t a, std::int32_t b) {
    return (std::uint64_t{static_cast<std::uint32_t>(a)} << 32) | static_cast<std::uint32_t>(b);
  }
  std::size_t hash(std::uint64_t k) const { return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }

  std::vector<Slot> slots_;  // at most half full
  std::size_t mask_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Added-token matching: a byte trie searched leftmost first, longest at that start, without
// overlaps (daachorse's LeftmostLongest, which HF uses).
class TokenTrie {
 public:
  TokenTrie() : nodes_(1) { first_.fill(false); }
  bool empty() const { return nodes_.size() == 1; }

  void add(std::string_view s, std::int32_t id) {
    if (s.empty()) return;
    first_[static_cast<unsigned char>(s[0])] = true;
    std::size_t n = 0;
    for (unsigned char b : s) {
      auto& kids = nodes_[n].next;
      auto it = std::lower_bound(kids.begin(), kids.end(), b, [](const auto& kv, unsigned char x) { return kv.first < x; });
      if (it != kids.end() && it->first == b) {
        n = it->second;
      } else {
        const std::size_t child = nodes_.size();
        kids.insert(it, {b, static_cast<std::int32_t>(child)});
        nodes_.emplace_back();  // invalidates `kids`, used no more
        n = child;
      }
    }
    nodes_[n].id = id;
  }

  struct Match {
    std::size_t begin, end;
    std::int32_t id;
  };
  void find_all(std::string_view s, std::vector<Match>& out) const {
    out.clear();
    if (empty()) return;
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    for (std::size_t i = 0; i < s.size();) {
      if (!first_[p[i]]) {
        ++i;
        continue;
      }
      std::size_t n = 0, best_end = 0;
      std::int32_t best_id = -1;
      for (std::size_t j = i; j < s.size(); ++j) {
        const auto& kids = nodes_[n].next;
        auto it = std::lower_bound(kids.begin(), kids.end(), p[j], [](const auto& kv, unsigned char x) { return kv.first < x; });
        if (it == kids.end() || it->first != p[j]) break;
        n = static_cast<std::size_t>(it->second);
        if (nodes_[n].id >= 0) best_id = nodes_[n].id, best_end = j + 1;
      }
      if (best_id >= 0) {
        out.push_back({i, best_end, best_id});
        i = best_end;
      } else {
        ++i;
      }
    }
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::int32_t>> next;  // sorted by byte
    std::int32_t id = -1;
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> first_;  // bytes that start some token
};

// Per-id strings stored back to back (a vocab of 10^5 tokens costs a few allocations, not 10^5).
// Filled in increasing id order.
class StringTable {
 public:
  void start(std::size_t n) {
    data_.clear();
    off_.assign(n + 1, 0);
    has_.assign(n, 0);
    next_ = 0;
  }
  void push(std::size_t id, std::string_view s) {
    fill_to(id);
    data_ += s;
    if (data_.size() > std::numeric_limits<std::uint32_t>::max()) fail(ErrorCode::corrupt, "tokenizer: token strings exceed 4 GiB");
    has_[id] = 1;
    next_ = id + 1;
    off_[next_] = static_cast<std::uint32_t>(data_.size());
  }
  void finish() { fill_to(has_.size()); }
  bool has(std::size_t id) const { return id < has_.size() && has_[id]; }
  std::string_view get(std::size_t id) const { return std::string_view(data_).substr(off_[id], off_[id + 1] - off_[id]); }

 private:
  void fill_to(std::size_t id) {
    for (; next_ < id; ++next_) off_[next_ + 1] = off_[next_];
  }
  std::string data_;
  std::vector<std::uint32_t> off_;  // token i is data_[off_[i], off_[i + 1])
  std::vector<std::uint8_t> has_;
  std::size_t next_ = 0;
};

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// One pre-tokenizer step: a split by a pattern, or ByteLevel (optional prefix space + GPT-2 split).
struct Stage {
  enum class Kind { pattern, byte_level } kind = Kind::pattern;
  std::shared_ptr<const Regex> regex;  // null: `literal` is the pattern
  std::string literal;
  Behavior behavior = Behavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;
  bool use_regex = true;
};

// GPT-2's pre-tokenizer pattern, as HF's ByteLevel compiles it.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
  bool operator==(const AddedToken&) const = default;
};

struct TemplatePiece {
  bool is_sequence = false;  // the input's ids; otherwise the special token's ids
  std::vector<std::int32_t> ids;
};

// A stretch of text [begin, end), or an added token covering it when id ≥ 0.
struct Span {
  std::size_t begin, end;
  std::int32_t id;
};

using Segment = std::pair<std::size_t, std::size_t>;

// Scratch for one encode call: strings that pieces point into, and one piece list per stage.
struct EncodeScratch {
  std::deque<std::string> arena;
  std::vector<std::vector<std::string_view>> level;
  std::vector<Segment> segments, merged;
  std::vector<char> segment_match;
  std::vector<TokenTrie::Match> matches;
  std::string_view keep(std::string s) { return arena.emplace_back(std::move(s)); }
};

// BPE word state, as HF's Word: symbols in a linked list, each merge folding the right one into
// the left one.
struct Symbol {
  std::int32_t id;
  std::int32_t prev, next;
  std::int32_t len;  // bytes covered; 0 once merged into its left neighbour
};

struct QueuedMerge {
  std::uint32_t rank;
  std::int32_t pos;
  std::int32_t new_id;
};
// The BinaryHeap order of HF's Merge: lowest rank first, then leftmost position.
struct MergeAfter {
  bool operator()(const QueuedMerge& a, const QueuedMerge& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

constexpr std::size_t kCacheMaxWordBytes = 256;  // HF's MAX_LENGTH
constexpr std::size_t kCacheCapacity = 1 << 15;  // words; ~3 MB

}  // namespace

// =============================================================================================
struct Tokenizer::Impl {
  std::string what;

  // model
  StringMap<std::int32_t> vocab;             // keys as tokenizer.json writes them
  StringMap<std::int32_t> raw_vocab;         // byte-level mode: the same keys as raw bytes
  std::array<std::int32_t, 256> byte_id{};   // byte-level mode: a lone byte's id, or -1
  PairMap merges;
  bool byte_level = false;  // a ByteLevel pre-tokenizer maps pieces to its alphabet
  bool ignore_merges = false, byte_fallback = false, fuse_unk = false;
  std::optional<std::string> unk_token, subword_prefix, word_suffix;

  // added tokens
  std::map<std::int32_t, AddedToken> added;  // by id
  StringMap<std::int32_t> added_ids;         // by content
  std::unordered_set<std::string> special_contents;
  TokenTrie raw_trie, normalized_trie;
  std::unique_ptr<Regex> word_char;  // Rust regex's \w, for single_word tokens

  // pipeline
  std::vector<Stage> stages;
  std::ptrdiff_t byte_level_stage = -1;
  std::optional<std::vector<TemplatePiece>> post;  // the single-sequence template, if any

  // per id
  std::int64_t n_ids = 0;
  StringTable token_string;  // as tokenizer.json writes it
  StringTable token_bytes;   // what the ByteLevel decoder yields
  std::vector<std::uint8_t> special;

  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<std::int32_t>> cache;

  void load(const json& root);
  void load_normalizer(const Ctx& c, const json& n);
  void load_pre_tokenizer(const Ctx& c, const json& p, const std::string& field);
  void load_model(const Ctx& c, const json& m);
  void load_added_tokens(const Ctx& c, const json& a);
  void load_post_processor(const Ctx& c, const json& p, const std::string& field, int& templates);
  void load_decoder(const Ctx& c, const json& d, const std::string& field);
  void build_tables();

  void split_added(std::string_view s, const TokenTrie& trie, EncodeScratch& sc, std::vector<Span>& out) const;
  void split_stage(const Stage& st, std::string_view piece, EncodeScratch& sc, std::vector<std::string_view>& out) const;
  void pre_tokenize(std::string_view piece, std::size_t stage, EncodeScratch& sc, std::vector<std::int32_t>& out) const;
  void bpe(std::string_view word, std::vector<std::int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<std::int32_t>& out) const;
  bool is_word_char(std::string_view s, std::size_t at, Char ch) const;
  std::int32_t unk_id() const;
};

// ---- loading ----------------------------------------------------------------------------------

void Tokenizer::Impl::load(const json& root) {
  const Ctx c{what};
  if (!root.is_object()) c.corrupt("top level", "not a JSON object");
  if (const json* v = c.member(root, "version")) {
    if (!v->is_string() || v->get<std::string>() != "1.0")
      c.unsupported("version", fmt::format("unknown tokenizer.json version {}", v->dump()));
  }
  const json* model = c.member(root, "model");
  if (!model) c.corrupt("model", "missing");
  // Order matters: the pre-tokenizer decides byte-level mode, the model's vocab feeds the added
  // tokens' ids, and the per-id tables need both.
  if (const json* n = c.member(root, "normalizer")) load_normalizer(c, *n);
  if (const json* p = c.member(root, "pre_tokenizer")) load_pre_tokenizer(c, *p, "pre_tokenizer");
  load_model(c, *model);
  if (const json* a = c.member(root, "added_tokens")) load_added_tokens(c, *a);
  int templates = 0;
  if (const json* p = c.member(root, "post_processor")) load_post_processor(c, *p, "post_processor", templates);
  const json* d = c.member(root, "decoder");
  if (!d) c.unsupported("decoder", "no decoder (null): only the ByteLevel decoder is supported");
  load_decoder(c, *d, "decoder");
  build_tables();
}

void Tokenizer::Impl::load_normalizer(const Ctx& c, const json& n) {
  const std::string type = c.type_of(n, "normalizer");
  if (type == "Sequence") {
    const json* list = c.member(n, "normalizers");
    if (!list || !list->is_array()) c.corrupt("normalizer", "Sequence without a 'normalizers' list");
    for (const json& x : *list) load_normalizer(c, x);
    return;
  }
  c.unsupported("normalizer", fmt::format("normalizer '{}' is not supported (only none)", type));
}

void Tokenizer::Impl::load_pre_tokenizer(const Ctx& c, const json& p, const std::string& field) {
  const std::string type = c.type_of(p, field);
  if (type == "Sequence") {
    const json* list = c.member(p, "pretokenizers");
    if (!list || !list->is_array()) c.corrupt(field, "Sequence without a 'pretokenizers' list");
    for (std::size_t i = 0; i < list->size(); ++i)
      load_pre_tokenizer(c, (*list)[i], fmt::format("{}.pretokenizers[{}]", field, i));
    return;
  }
  Stage st;
  if (type == "ByteLevel") {
    if (byte_level_stage >= 0) c.unsupported(field, "a second ByteLevel pre-tokenizer");
    st.kind = Stage::Kind::byte_level;
    st.add_prefix_space = c.get_bool(p, "add_prefix_space", true, field);
    st.use_regex = c.get_bool(p, "use_regex", true, field);
    if (st.use_regex) st.regex = std::make_shared<const Regex>(translate_oniguruma(kGpt2Pattern, what), what);
    byte_level_stage = static_cast<std::ptrdiff_t>(stages.size());
    byte_level = true;
  } else if (type == "Digits") {
    // char::is_numeric is the N category; Contiguous over per-digit matches is one match per run.
    const bool individual = c.get_bool(p, "individual_digits", false, field);
    st.regex = std::make_shared<const Regex>(individual ? "\\p{N}" : "\\p{N}+", what);
  } else if (type == "Split") {
    const json* pat = c.member(p, "pattern");
    if (!pat || !pat->is_object() || pat->size() != 1) c.corrupt(field, "'pattern' must be {\"Regex\": ...} or {\"String\": ...}");
    if (const auto re = c.get_opt_string(*pat, "Regex", field)) {
      st.regex = std::make_shared<const Regex>(translate_oniguruma(*re, what), what);
    } else if (const auto lit = c.get_opt_string(*pat, "String", field)) {
      st.literal = *lit;
    } else {
      c.corrupt(field, "'pattern' must be {\"Regex\": ...} or {\"String\": ...}");
    }
    static const std::map<std::string, Behavior, std::less<>> kBehaviors = {
        {"Removed", Behavior::removed},
        {"Isolated", Behavior::isolated},
        {"MergedWithPrevious", Behavior::merged_with_previous},
        {"MergedWithNext", Behavior::merged_with_next},
        {"Contiguous", Behavior::contiguous}};
    const std::string b = c.get_string(p, "behavior", field);
    const auto it = kBehaviors.find(b);
    if (it == kBehaviors.end()) c.corrupt(field, fmt::format("unknown Split behavior '{}'", b));
    st.behavior = it->second;
    st.invert = c.get_bool(p, "invert", false, field);
  } else {
    c.unsupported(field, fmt::format("pre-tokenizer '{}' is not supported (only ByteLevel, Digits, Split, Sequence)", type));
  }
  stages.push_back(std::move(st));
}

void Tokenizer::Impl::load_model(const Ctx& c, const json& m) {
  if (!m.is_object()) c.corrupt("model", "must be an object");
  const auto type = c.get_opt_string(m, "type", "model");
  if (type && *type != "BPE") c.unsupported("model", fmt::format("model type '{}' is not supported (only BPE)", *type));
  if (!type && !m.contains("merges")) c.unsupported("model", "a model with neither 'type' nor 'merges' (not BPE)");
  if (const json* d = c.member(m, "dropout")) {
    if (!d->is_number()) c.corrupt("model.dropout", "must be a number or null");
    if (d->get<double>() != 0.0) c.unsupported("model.dropout", "BPE dropout (random merges) is not supported");
  }
  unk_token = c.get_opt_string(m, "unk_token", "model");
  subword_prefix = c.get_opt_string(m, "continuing_subword_prefix", "model");
  word_suffix = c.get_opt_string(m, "end_of_word_suffix", "model");
  fuse_unk = c.get_bool(m, "fuse_unk", false, "model");
  byte_fallback = c.get_bool(m, "byte_fallback", false, "model");
  ignore_merges = c.get_bool(m, "ignore_merges", false, "model");

  const json* v = c.member(m, "vocab");
  if (!v || !v->is_object()) c.corrupt("model.vocab", "missing or not an object of token → id");
  vocab.reserve(v->size());
  for (const auto& [tok, id] : v->items()) vocab.insert_or_assign(tok, c.id(id, "model.vocab"));

  // Merges: [a, b] pairs, or "a b" strings (split on single spaces into exactly two parts, lines
  // starting "#version" skipped), as HF's MergeType reads them.
  const json* ml = c.member(m, "merges");
  if (!ml || !ml->is_array()) c.corrupt("model.merges", "missing or not a list");
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(ml->size());
  const bool tuples = std::all_of(ml->begin(), ml->end(), [](const json& x) {
    return x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string();
  });
  if (tuples) {
    for (const json& x : *ml) pairs.emplace_back(x[0].get<std::string>(), x[1].get<std::string>());
  } else {
    for (const json& x : *ml) {
      if (!x.is_string()) c.corrupt("model.merges", "entries must all be \"a b\" strings or all [a, b] pairs");
      const std::string line = x.get<std::string>();
      if (line.rfind("#version", 0) == 0) continue;
      const std::size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        c.corrupt("model.merges", fmt::format("merge {} '{}' is not two tokens separated by one space", pairs.size(), line));
      pairs.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    }
  }
  const std::size_t prefix_len = subword_prefix ? subword_prefix->size() : 0;
  merges = PairMap(pairs.size());
  for (std::size_t rank = 0; rank < pairs.size(); ++rank) {
    const auto& [a, b] = pairs[rank];
    const std::int32_t* ia = lookup(vocab, a);
    const std::int32_t* ib = lookup(vocab, b);
    if (!ia || !ib) c.corrupt("model.merges", fmt::format("merge {} uses '{}', which is not in the vocab", rank, ia ? b : a));
    if (b.size() < prefix_len) c.corrupt("model.merges", fmt::format("merge {}: '{}' is shorter than the subword prefix", rank, b));
    const std::string merged = a + b.substr(prefix_len);
    const std::int32_t* im = lookup(vocab, merged);
    if (!im) c.corrupt("model.merges", fmt::format("merge {} makes '{}', which is not in the vocab", rank, merged));
    merges.insert_or_assign(*ia, *ib, {static_cast<std::uint32_t>(rank), *im});
  }

  byte_id.fill(-1);
  if (byte_level) {
    raw_vocab.reserve(vocab.size());
    for (const auto& [tok, id] : vocab)
      if (auto raw = from_byte_level(tok)) raw_vocab.insert_or_assign(std::move(*raw), id);
    for (std::size_t b = 0; b < 256; ++b)
      if (const std::int32_t* id = lookup(vocab, alphabet().utf8[b])) byte_id[b] = *id;
  }
}

void Tokenizer::Impl::load_added_tokens(const Ctx& c, const json& a) {
  if (!a.is_array()) c.corrupt("added_tokens", "must be a list");
  // HF (AddedVocabulary::add_tokens, run on load) does not take the ids in the file: a content
  // found in the vocab gets the vocab's id, any other content the next id counting from the
  // vocab's number of entries. We do the same, so ids equal HF's even for inconsistent files.
  auto next_id = static_cast<std::int64_t>(vocab.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string field = fmt::format("added_tokens[{}]", i);
    const json& t = a[i];
    if (!t.is_object()) c.corrupt(field, "must be an object");
    AddedToken tok;
    tok.content = c.get_string(t, "content", field);
    tok.special = c.get_bool(t, "special", false, field);
    tok.single_word = c.get_bool(t, "single_word", false, field);
    tok.lstrip = c.get_bool(t, "lstrip", false, field);
    tok.rstrip = c.get_bool(t, "rstrip", false, field);
    tok.normalized = c.get_bool(t, "normalized", !tok.special, field);
    if (const json* id = c.member(t, "id")) c.id(*id, field);  // checked, not used (see above)
    if (tok.content.empty()) continue;
    std::int32_t id = 0;
    if (const std::int32_t* known = lookup(added_ids, tok.content)) {
      if (added.at(*known) == tok) continue;
      id = *known;
    } else if (const std::int32_t* in_vocab = lookup(vocab, tok.content)) {
      id = *in_vocab;
    } else {
      if (next_id >= (std::int64_t{1} << 24)) c.corrupt(field, "too many added tokens");
      id = static_cast<std::int32_t>(next_id++);
    }
    added_ids.insert_or_assign(tok.content, id);
    if (tok.special) special_contents.insert(tok.content);
    added.insert_or_assign(id, tok);
  }
  for (const auto& [id, tok] : added) {
    (tok.normalized ? normalized_trie : raw_trie).add(tok.content, id);
    if (tok.single_word && !word_char)
      word_char = std::make_unique<Regex>(std::string("[") + kRustWordClass + "]", what, /*anchored=*/true);
  }
}

void Tokenizer::Impl::load_post_processor(const Ctx& c, const json& p, const std::string& field, int& templates) {
  const std::string type = c.type_of(p, field);
  if (type == "ByteLevel") return;  // it only trims offsets
  if (type == "Sequence") {
    const json* list = c.member(p, "processors");
    if (!list || !list->is_array()) c.corrupt(field, "Sequence without a 'processors' list");
    for (std::size_t i = 0; i < list->size(); ++i)
      load_post_processor(c, (*list)[i], fmt::format("{}.processors[{}]", field, i), templates);
    return;
  }
  // A template run after another sees the first one's pieces as a pair (HF's Sequence passes the
  // split encodings on): no tokenizer ships that, so it is refused rather than half-done.
  if (++templates > 1) c.unsupported(field, "more than one template post-processor in a Sequence");
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto token = [&](const char* key) {
      const json* v = c.member(p, key);
      if (!v || !v->is_array() || v->size() != 2 || !(*v)[0].is_string())
        c.corrupt(field, fmt::format("'{}' must be [token, id]", key));
      return TemplatePiece{false, {c.id((*v)[1], field)}};
    };
    post = std::vector<TemplatePiece>{token("cls"), TemplatePiece{true, {}}, token("sep")};
    return;
  }
  if (type != "TemplateProcessing")
    c.unsupported(field, fmt::format("post-processor '{}' is not supported (only TemplateProcessing, BertProcessing, "
                                     "RobertaProcessing, ByteLevel, Sequence)",
                                     type));
  std::map<std::string, std::vector<std::int32_t>, std::less<>> specials;
  if (const json* st = c.member(p, "special_tokens")) {
    if (!st->is_object()) c.corrupt(field, "'special_tokens' must be an object");
    for (const auto& [name, v] : st->items()) {
      const json* ids = c.member(v, "ids");
      if (!ids || !ids->is_array()) c.corrupt(field, fmt::format("special token '{}' has no 'ids' list", name));
      std::vector<std::int32_t> list;
      for (const json& id : *ids) list.push_back(c.id(id, field));
      specials[name] = std::move(list);
    }
  }
  const json* single = c.member(p, "single");
  if (!single) c.corrupt(field, "TemplateProcessing without 'single'");
  std::vector<json> pieces;
  if (single->is_string()) {  // "[CLS] $A [SEP]"
    std::istringstream words(single->get<std::string>());
    for (std::string word; words >> word;) pieces.emplace_back(word);
  } else if (single->is_array()) {
    pieces.assign(single->begin(), single->end());
  } else {
    c.corrupt(field, "'single' must be a list of pieces");
  }
  post.emplace();
  for (const json& piece : pieces) {
    std::string seq, special_name;
    if (piece.is_string()) {  // Piece::try_from: "$A", "$B", "$", "$1", "[CLS]", each with ":type_id"
      std::string s = piece.get<std::string>();
      s = s.substr(0, s.find(':'));
      if (!s.empty() && s[0] == '$') {
        const std::string r = s.substr(1);
        const bool type_id = !r.empty() && std::all_of(r.begin(), r.end(), [](char d) { return d >= '0' && d <= '9'; });
        seq = (r == "B" || r == "b") ? "B" : (r.empty() || r == "A" || r == "a" || type_id) ? "A" : r;
      } else {
        special_name = s;
      }
    } else if (const json* sq = c.member(piece, "Sequence")) {
      seq = c.get_string(*sq, "id", field);
    } else if (const json* sp = c.member(piece, "SpecialToken")) {
      special_name = c.get_string(*sp, "id", field);
    } else {
      c.corrupt(field, fmt::format("template piece {} is neither a Sequence nor a SpecialToken", piece.dump()));
    }
    if (!seq.empty()) {
      if (seq != "A") c.corrupt(field, fmt::format("the single-sequence template uses sequence '{}' (only A exists)", seq));
      post->push_back({true, {}});
    } else {
      const auto it = specials.find(special_name);
      if (it == specials.end()) c.corrupt(field, fmt::format("the template uses '{}', which is not in special_tokens", special_name));
      post->push_back({false, it->second});
    }
  }
}

void Tokenizer::Impl::load_decoder(const Ctx& c, const json& d, const std::string& field) {
  const std::string type = c.type_of(d, field);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json* list = c.member(d, "decoders");
    if (!list || !list->is_array() || list->size() != 1) c.unsupported(field, "a decoder Sequence other than [ByteLevel]");
    load_decoder(c, (*list)[0], field + ".decoders[0]");
    return;
  }
  c.unsupported(field, fmt::format("decoder '{}' is not supported (only ByteLevel)", type));
}

void Tokenizer::Impl::build_tables() {
  std::int64_t max_id = -1;
  for (const auto& [tok, id] : vocab) max_id = std::max<std::int64_t>(max_id, id);
  if (!added.empty()) max_id = std::max<std::int64_t>(max_id, added.rbegin()->first);
  n_ids = max_id + 1;
  const auto n = static_cast<std::size_t>(n_ids);
  // HF's id_to_token: the added token first, then the model's; of several vocab keys sharing an
  // id one is kept (HF leaves which one unspecified too).
  std::vector<std::pair<std::size_t, std::string_view>> entries;
  entries.reserve(vocab.size() + added.size());
  for (const auto& [tok, id] : vocab) entries.emplace_back(static_cast<std::size_t>(id), tok);
  for (const auto& [id, tok] : added) entries.emplace_back(static_cast<std::size_t>(id), tok.content);
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  token_string.start(n);
  token_bytes.start(n);
  special.assign(n, 0);
  for (std::size_t k = 0; k < entries.size(); ++k) {
    if (k + 1 < entries.size() && entries[k + 1].first == entries[k].first) continue;  // the last one wins
    const auto [id, s] = entries[k];
    token_string.push(id, s);
    // The ByteLevel decoder: a token whose characters are all in the alphabet yields their bytes,
    // any other token its UTF-8 as it is.
    const auto raw = from_byte_level(s);
    token_bytes.push(id, raw ? std::string_view(*raw) : s);
    special[id] = special_contents.count(std::string(s)) ? 1 : 0;
  }
  token_string.finish();
  token_bytes.finish();
}

// ---- encoding ---------------------------------------------------------------------------------

bool Tokenizer::Impl::is_word_char(std::string_view s, std::size_t at, Char ch) const {
  if (ch.cp < 0) return false;
  std::size_t b = 0, e = 0;
  return word_char->find(s.substr(at, static_cast<std::size_t>(ch.len)), 0, b, e);
}

// AddedVocabulary::find_matches: the trie's matches, dropped when single_word is violated, widened
// over White_Space by lstrip/rstrip, with the text between them. Mirrors HF even where a widened
// rstrip overlaps the next match.
void Tokenizer::Impl::split_added(std::string_view s, const TokenTrie& trie, EncodeScratch& sc, std::vector<Span>& out) const {
  out.clear();
  if (s.empty()) return;
  trie.find_all(s, sc.matches);
  std::size_t start_offset = 0;
  for (const auto& m : sc.matches) {
    std::size_t start = m.begin, stop = m.end;
    const AddedToken& tok = added.at(m.id);
    if (tok.single_word) {
      bool start_space = start == 0;
      if (!start_space) {
        const Char ch = char_before(s, start);
        start_space = !is_word_char(s, start - static_cast<std::size_t>(ch.len), ch);
      }
      const bool stop_space = stop == s.size() || !is_word_char(s, stop, char_at(s, stop));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      std::size_t new_start = start;
      while (new_start > 0) {
        const Char ch = char_before(s, new_start);
        if (!is_white_space(ch.cp)) break;
        new_start -= static_cast<std::size_t>(ch.len);
      }
      start = std::max(new_start, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        const Char ch = char_at(s, stop);
        if (!is_white_space(ch.cp)) break;
        stop += static_cast<std::size_t>(ch.len);
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, m.id});
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({start_offset, s.size(), -1});
}

// NormalizedString::split with the stage's pattern and behavior; empty pieces are dropped, as
// PreTokenizedString::split drops them.
void Tokenizer::Impl::split_stage(const Stage& st, std::string_view piece, EncodeScratch& sc,
                                  std::vector<std::string_view>& out) const {
  out.clear();
  std::string_view s = piece;
  if (st.kind == Stage::Kind::byte_level) {
    if (st.add_prefix_space && (s.empty() || s[0] != ' ')) {
      std::string spaced;
      spaced.reserve(s.size() + 1);
      spaced += ' ';
      spaced += s;
      s = sc.keep(std::move(spaced));
    }
    if (!st.use_regex) {
      if (!s.empty()) out.push_back(s);
      return;
    }
  }
  // Pattern::find_matches over onig's find_iter: an empty match right where the previous match
  // ended is skipped by advancing one character.
  auto& segs = sc.segments;
  auto& is_match = sc.segment_match;
  segs.clear();
  is_match.clear();
  auto push = [&](std::size_t b, std::size_t e, bool m) {
    segs.emplace_back(b, e);
    is_match.push_back(m != st.invert);
  };
  std::size_t prev = 0, last_end = 0;
  std::optional<std::size_t> last_match_end;
  while (last_end <= s.size()) {
    std::size_t b = 0, e = 0;
    if (st.regex) {
      if (!st.regex->find(s, last_end, b, e)) break;
    } else {
      b = s.find(st.literal, last_end);
      if (b == std::string_view::npos) break;
      e = b + st.literal.size();
    }
    if (b == e && last_match_end == e) {
      last_end += last_end < s.size() ? static_cast<std::size_t>(char_at(s, last_end).len) : 1;
      continue;
    }
    last_end = e;
    last_match_end = e;
    if (prev != b) push(prev, b, false);
    push(b, e, true);
    prev = e;
  }
  if (prev != s.size()) push(prev, s.size(), false);

  auto emit = [&](const Segment& seg) {
    if (seg.second > seg.first) out.push_back(s.substr(seg.first, seg.second - seg.first));
  };
  const Behavior bh = st.kind == Stage::Kind::byte_level ? Behavior::isolated : st.behavior;
  auto& acc = sc.merged;
  acc.clear();
  bool previous = false;
  switch (bh) {
    case Behavior::isolated:
      for (const Segment& seg : segs) emit(seg);
      break;
    case Behavior::removed:
      for (std::size_t i = 0; i < segs.size(); ++i)
        if (!is_match[i]) emit(segs[i]);
      break;
    case Behavior::contiguous:
    case Behavior::merged_with_previous:
      for (std::size_t i = 0; i < segs.size(); ++i) {
        const bool join = bh == Behavior::contiguous ? (is_match[i] != 0) == previous : (is_match[i] && !previous);
        if (join && !acc.empty()) acc.back().second = segs[i].second;
        else acc.push_back(segs[i]);
        previous = is_match[i] != 0;
      }
      for (const Segment& seg : acc) emit(seg);
      break;
    case Behavior::merged_with_next:
      for (std::size_t k = segs.size(); k-- > 0;) {
        if (is_match[k] && !previous && !acc.empty()) acc.back().first = segs[k].first;
        else acc.push_back(segs[k]);
        previous = is_match[k] != 0;
      }
      for (std::size_t k = acc.size(); k-- > 0;) emit(acc[k]);
      break;
  }
}

void Tokenizer::Impl::pre_tokenize(std::string_view piece, std::size_t stage, EncodeScratch& sc,
                                   std::vector<std::int32_t>& out) const {
  if (stage == stages.size()) {
    bpe(piece, out);
    return;
  }
  auto& parts = sc.level[stage];  // deeper stages use deeper levels, so this list stays put
  const Stage& st = stages[stage];
  if (byte_level_stage >= 0 && static_cast<std::ptrdiff_t>(stage) > byte_level_stage) {
    // HF runs this stage on the ByteLevel-mapped text; the pieces come back as raw bytes.
    split_stage(st, sc.keep(to_byte_level(piece)), sc, parts);
    for (auto& p : parts) {
      auto raw = from_byte_level(p);
      if (!raw) fail(ErrorCode::internal, "{}: a pattern split a byte-level character", what);
      p = sc.keep(std::move(*raw));
    }
  } else {
    split_stage(st, piece, sc, parts);
  }
  for (const std::string_view p : parts) pre_tokenize(p, stage + 1, sc, out);
}

std::int32_t Tokenizer::Impl::unk_id() const {
  const std::int32_t* id = lookup(vocab, *unk_token);
  if (!id) fail(ErrorCode::corrupt, "{}: model.unk_token '{}' is not in the vocab, and the text needs it", what, *unk_token);
  return *id;
}

// BPE::tokenize_with_cache.
void Tokenizer::Impl::bpe(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (const std::int32_t* id = lookup(byte_level ? raw_vocab : vocab, word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (const auto* hit = lookup(cache, word)) {
      out.insert(out.end(), hit->begin(), hit->end());
      return;
    }
  }
  const std::size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::vector<std::int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kCacheCapacity) cache.clear();  // results are pure: dropping them is safe
    cache.emplace(std::string(word), std::move(ids));
  }
}

// BPE::merge_word, then Word::merge_all.
void Tokenizer::Impl::merge_word(std::string_view w, std::vector<std::int32_t>& out) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<QueuedMerge> queue;
  symbols.clear();
  auto add = [&](std::int32_t id, std::int32_t len) {
    const auto n = static_cast<std::int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };

  // One initial symbol per character of the piece as the model sees it: per byte in byte-level
  // mode (each byte is one alphabet character), per UTF-8 character otherwise.
  const bool by_byte_table = byte_level && !subword_prefix && !word_suffix;
  std::int32_t unk = -1, unk_len = 0;  // a pending unknown token (id ≥ 0) and the bytes it covers
  std::string unit;
  for (std::size_t i = 0; i < w.size();) {
    const std::size_t len = byte_level ? 1 : static_cast<std::size_t>(char_at(w, i).len);
    const bool is_first = i == 0, is_last = i + len == w.size();
    std::int32_t id = by_byte_table ? byte_id[static_cast<unsigned char>(w[i])] : -1;
    if (id < 0) {
      unit.clear();
      if (!is_first && subword_prefix) unit += *subword_prefix;
      if (byte_level) unit += alphabet().utf8[static_cast<unsigned char>(w[i])];
      else unit += w.substr(i, len);
      if (is_last && word_suffix) unit += *word_suffix;
      if (!by_byte_table)
        if (const std::int32_t* v = lookup(vocab, unit)) id = *v;
    }
    const auto byte_len = static_cast<std::int32_t>(len);
    i += len;
    if (id >= 0) {
      if (unk >= 0) add(unk, unk_len), unk = -1;
      add(id, byte_len);
      continue;
    }
    if (byte_fallback) {
      std::vector<std::int32_t> ids;
      for (unsigned char b : unit) {
        const std::int32_t* v = lookup(vocab, fmt::format("<0x{:02X}>", b));
        if (!v) break;
        ids.push_back(*v);
      }
      if (ids.size() == unit.size()) {
        for (std::int32_t x : ids) add(x, 1);
        continue;
      }
    }
    if (unk_token) {
      if (unk >= 0 && fuse_unk) {
        unk_len += byte_len;
      } else {
        if (unk >= 0) add(unk, unk_len);
        unk = unk_id(), unk_len = byte_len;
      }
    }
    // Otherwise the character is dropped, as HF drops it.
  }
  if (unk >= 0) add(unk, unk_len);

  queue.clear();
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i)
    if (const auto* m = merges.find(symbols[i].id, symbols[i + 1].id))
      queue.push_back({m->rank, static_cast<std::int32_t>(i), m->id});
  std::make_heap(queue.begin(), queue.end(), MergeAfter{});
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), MergeAfter{});
    const QueuedMerge top = queue.back();
    queue.pop_back();
    Symbol& cur = symbols[static_cast<std::size_t>(top.pos)];
    if (cur.len == 0 || cur.next == -1) continue;
    const std::int32_t next_pos = cur.next;
    const Symbol right = symbols[static_cast<std::size_t>(next_pos)];
    const auto* now = merges.find(cur.id, right.id);
    if (!now || now->id != top.new_id) continue;  // a stale entry: a side has changed since
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[static_cast<std::size_t>(next_pos)].len = 0;
    if (right.next > -1 && static_cast<std::size_t>(right.next) < symbols.size())
      symbols[static_cast<std::size_t>(right.next)].prev = top.pos;
    const Symbol merged = symbols[static_cast<std::size_t>(top.pos)];
    if (merged.prev >= 0) {
      if (const auto* m = merges.find(symbols[static_cast<std::size_t>(merged.prev)].id, merged.id)) {
        queue.push_back({m->rank, merged.prev, m->id});
        std::push_heap(queue.begin(), queue.end(), MergeAfter{});
      }
    }
    if (merged.next >= 0 && static_cast<std::size_t>(merged.next) < symbols.size()) {
      if (const auto* m = merges.find(merged.id, symbols[static_cast<std::size_t>(merged.next)].id)) {
        queue.push_back({m->rank, top.pos, m->id});
        std::push_heap(queue.begin(), queue.end(), MergeAfter{});
      }
    }
  }
  for (const Symbol& s : symbols)
    if (s.len != 0) out.push_back(s.id);
}

// =============================================================================================
// Public API

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& what) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail(ErrorCode::corrupt, "{}: not valid JSON: {}", what, e.what());
  }
  auto impl = std::make_unique<Impl>();
  impl->what = what;
  try {
    impl->load(root);
  } catch (const json::exception& e) {  // a JSON shape the checks above did not foresee
    fail(ErrorCode::corrupt, "{}: unexpected JSON structure: {}", what, e.what());
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail(ErrorCode::io, "tokenizer file '{}' does not exist or is not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::io, "cannot open tokenizer file '{}': {}", path, std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) fail(ErrorCode::io, "cannot read tokenizer file '{}'", path);
  return from_json(buf.str(), path);
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  const Impl& m = *impl_;
  EncodeScratch sc;
  sc.level.resize(m.stages.size());
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  // extract_and_normalize: non-normalized added tokens on the raw text, then (the normalizer being
  // the identity) normalized ones on what is left; then the pre-tokenizer and the model.
  std::vector<Span> outer, inner;
  m.split_added(text, m.raw_trie, sc, outer);
  for (const Span& a : outer) {
    if (a.id >= 0) {
      ids.push_back(a.id);
      continue;
    }
    const std::string_view piece = text.substr(a.begin, a.end - a.begin);
    m.split_added(piece, m.normalized_trie, sc, inner);
    for (const Span& b : inner) {
      if (b.id >= 0) ids.push_back(b.id);
      else if (b.end > b.begin) m.pre_tokenize(piece.substr(b.begin, b.end - b.begin), 0, sc, ids);
    }
  }
  if (!m.post) return ids;
  // TemplateProcessing::apply_template: sequence pieces always, special pieces when add_special.
  std::vector<std::int32_t> out;
  out.reserve(ids.size() + 4);
  for (const TemplatePiece& p : *m.post) {
    if (p.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
    else if (add_special) out.insert(out.end(), p.ids.begin(), p.ids.end());
  }
  return out;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string out;
  for (const std::int32_t id : ids) {
    if (id < 0 || id >= m.n_ids) continue;
    const auto i = static_cast<std::size_t>(id);
    if (!m.token_bytes.has(i) || (skip_special && m.special[i])) continue;
    out += m.token_bytes.get(i);
  }
  return out;
}

std::string Tokenizer::token_bytes(std::int32_t id) const {
  if (id < 0 || id >= impl_->n_ids)
    fail(ErrorCode::invalid_argument, "token id {} is outside [0, {}) of {}", id, impl_->n_ids, impl_->what);
  const auto i = static_cast<std::size_t>(id);
  return impl_->token_bytes.has(i) ? std::string(impl_->token_bytes.get(i)) : std::string();
}

std::optional<std::string> Tokenizer::token_string(std::int32_t id) const {
  if (id < 0 || id >= impl_->n_ids || !impl_->token_string.has(static_cast<std::size_t>(id))) return std::nullopt;
  return std::string(impl_->token_string.get(static_cast<std::size_t>(id)));
}

std::int64_t Tokenizer::vocab_size() const noexcept { return impl_->n_ids; }

std::optional<std::int32_t> Tokenizer::token_id(std::string_view token) const {
  if (const std::int32_t* id = lookup(impl_->added_ids, token)) return *id;
  if (const std::int32_t* id = lookup(impl_->vocab, token)) return *id;
  return std::nullopt;
}

bool Tokenizer::is_special(std::int32_t id) const noexcept {
  return id >= 0 && id < impl_->n_ids && impl_->special[static_cast<std::size_t>(id)] != 0;
}

// ---- streaming decode -------------------------------------------------------------------------

namespace {
// Moves the complete UTF-8 prefix of `pending` out, invalid subparts as U+FFFD. With `final` a
// trailing incomplete sequence becomes U+FFFD too; otherwise it stays in `pending`.
std::string take_utf8(std::string& pending, bool final) {
  std::string out;
  out.reserve(pending.size());
  const auto* p = reinterpret_cast<const unsigned char*>(pending.data());
  std::size_t i = 0;
  while (i < pending.size()) {
    const auto st = utf8_step(p + i, pending.size() - i);
    if (st.kind == Utf8Step::truncated && !final) break;
    if (st.kind == Utf8Step::ok) out.append(pending, i, static_cast<std::size_t>(st.len));
    else out += "\xEF\xBF\xBD";
    i += static_cast<std::size_t>(st.len);
  }
  pending.erase(0, i);
  return out;
}
}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special) : tok_(&tok), skip_special_(skip_special) {}

std::string StreamDecoder::push(std::int32_t id) {
  const std::int32_t one[1] = {id};
  pending_ += tok_->decode(one, skip_special_);
  return take_utf8(pending_, false);
}

std::string StreamDecoder::flush() { return take_utf8(pending_, true); }

}  // namespace twell::model
