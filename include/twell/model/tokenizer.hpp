#pragma once
// A byte-level BPE tokenizer read from a Hugging Face `tokenizer.json`, with the semantics of the
// `tokenizers` library: the ids equal HF's (tests/model/tokenizer_parity.py checks it).
//
// Supported, exactly as HF does it:
//   model          BPE: vocab, merges as "a b" strings or [a, b] pairs, ignore_merges, unk_token
//                  (+ fuse_unk), byte_fallback, continuing_subword_prefix, end_of_word_suffix
//   added_tokens   matched in the raw text first (leftmost, then longest), with lstrip, rstrip,
//                  single_word, normalized and special; ids assigned as HF assigns them on load
//   normalizer     none (null or an empty Sequence)
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex), Digits, Split (Regex or String
//                  pattern, every behavior, invert), Sequence of these; Oniguruma patterns are
//                  run on PCRE2 after rewriting what the two read differently (\s, \w, \b, \h,
//                  \v, \uHHHH, scripts, POSIX brackets, (?m)), checked per code point
//   post_processor TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence
//   decoder        ByteLevel (or a Sequence holding only it)
// Anything else (NFC and other normalizers, WordPiece/Unigram models, Metaspace, BPE dropout, ...)
// is refused on load with ErrorCode::unsupported naming it, never silently ignored. Malformed
// files throw ErrorCode::corrupt, unreadable ones ErrorCode::io; the message names the file.
// Ignored on purpose: `truncation` and `padding` (transformers overrides them on every call too).
//
// Known differences from HF, rare in real text: PCRE2 10.42 knows Unicode 14 and Oniguruma a
// later version, so characters assigned since (e.g. CJK extension H/I ideographs) and 43 whose
// Alphabetic or Lowercase property changed may split differently; and (?i) folds case one
// character to one (Oniguruma also matches "ss" against "ß"; contraction patterns such as
// 's|'t|'ll, the only (?i) in shipped tokenizers, are unaffected).
//
// Speed: about 20 MB/s on one core for a first pass over English (35 MB/s once its per-word cache
// is warm), some 10x HF's single-call encode.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace twell::model {

class Tokenizer {
 public:
  // Reads a tokenizer.json; `what` names the source in error messages.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json(std::string_view json, const std::string& what = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text to ids. Added and special tokens written in the text are matched as tokens (HF's default).
  // add_special applies the post-processor's template (e.g. Llama-3's <|begin_of_text|>).
  // Text that is not valid UTF-8 (HF cannot take it) is still tokenized: invalid bytes match no
  // pattern class and reach the byte-level BPE as themselves. Thread-safe.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special = false) const;

  // Ids to bytes: the concatenation of token_bytes() of each id. Ids with no token are dropped
  // (as HF does); special tokens are dropped when skip_special. Unlike HF, which replaces invalid
  // UTF-8 by U+FFFD, the bytes are returned as they are (a cut in the middle of a character stays
  // cut); use StreamDecoder for text that is always valid UTF-8.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;

  // The bytes one token stands for, as HF's ByteLevel decoder yields them: byte-level tokens give
  // their bytes, special and added tokens their content. Throws invalid_argument for an id outside
  // [0, vocab_size()); returns "" for an id inside it that names no token.
  std::string token_bytes(std::int32_t id) const;

  // The token's string as tokenizer.json writes it ("Ġthe", "<|im_end|>"), if the id has one.
  std::optional<std::string> token_string(std::int32_t id) const;

  // Max id + 1 over the model vocab and the added tokens.
  std::int64_t vocab_size() const noexcept;

  // The id of a token given as tokenizer.json writes it: an added token's content first, then a
  // vocab key (byte-level form, e.g. "Ġthe").
  std::optional<std::int32_t> token_id(std::string_view token) const;

  // Whether id is a special token (skipped by decode when skip_special).
  bool is_special(std::int32_t id) const noexcept;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming decode for printing tokens as they come. push() returns only complete UTF-8 and holds
// back a trailing partial multi-byte sequence until it completes; bytes that can never become valid
// UTF-8 come out as U+FFFD (one per maximal invalid subpart, as HF's from_utf8_lossy does), so the
// concatenation of all push() results and flush() equals HF's decode of the same ids. The tokenizer
// must outlive the decoder.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false);
  std::string push(std::int32_t id);
  // Returns what is held back (an incomplete sequence becomes U+FFFD) and resets the decoder.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace twell::model
