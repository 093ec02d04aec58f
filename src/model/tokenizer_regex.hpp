#pragma once
// The tokenizer's regular expressions: Hugging Face compiles tokenizer.json's patterns with
// Oniguruma (Ruby syntax); twell runs them on PCRE2 (Debian's) with UTF + UCP after rewriting what
// the two engines read differently. The rewrites (each measured against HF over every code point,
// see tokenizer_parity.py's regex-class configurations):
//   \s \S       Oniguruma: White_Space. PCRE2's \s also takes U+180E → \p{White_Space}.
//   \w \W \b \B Oniguruma: Alphabetic, Mark, Nd, Pc; outside a class also ² ³ ¹ ¼ ½ ¾ (its
//               Latin-1 ctype table). PCRE2: L, N and '_'.
//   \h \H       Oniguruma: hex digit. PCRE2: horizontal space.
//   \v          Oniguruma: U+000B. PCRE2: vertical space.
//   \uHHHH      Oniguruma only → \x{HHHH}.
//   \p{Script}  Oniguruma: Script. PCRE2 (10.40+): Script_Extensions → \p{sc:Script}.
//   [:alpha:]…  POSIX brackets are Unicode properties in Oniguruma (alpha = Alphabetic, punct =
//               P + S, …); PCRE2 maps them differently.
//   (?m)        Ruby's m is PCRE2's s (dot matches newline); ^ and $ are always line anchors in
//               Ruby, hence PCRE2_MULTILINE.
// Nested classes and class intersections (&&) have no PCRE2 equivalent and are refused. What stays
// different is the Unicode version: PCRE2 10.42 knows Unicode 14, so characters assigned since
// (and the few whose properties changed) may split differently.
#include <cstddef>
#include <string>
#include <string_view>

namespace twell::model::detail {

// Rust regex's \w (UTS #18), which HF's single_word check uses.
inline constexpr const char* kRustWordClass = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}";

// An Oniguruma pattern as PCRE2 syntax; a construct with no PCRE2 equivalent is an
// ErrorCode::unsupported error naming `what`.
std::string translate_oniguruma(std::string_view pattern, const std::string& what);

// A compiled PCRE2 pattern (UTF, UCP, multiline; JIT where it compiles). Invalid UTF-8 in a subject
// simply does not match (PCRE2_MATCH_INVALID_UTF: no per-call validity scan, which would make
// iterating over matches quadratic). Matching is thread-safe (per-thread match state).
class Regex {
 public:
  // `pattern` is PCRE2 syntax (tokenizer.json's go through translate_oniguruma first); anchored:
  // matches only at the start position. A pattern that does not compile is an error naming `what`.
  Regex(const std::string& pattern, const std::string& what, bool anchored = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The leftmost match at or after byte `start`; false when there is none.
  bool find(std::string_view subject, std::size_t start, std::size_t& mbegin, std::size_t& mend) const;

 private:
  std::string source_;
  void* code_ = nullptr;  // pcre2_code (pcre2.h stays out of this header)
};

}  // namespace twell::model::detail
