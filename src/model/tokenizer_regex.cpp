// Oniguruma patterns on PCRE2 (tokenizer_regex.hpp).
#include "model/tokenizer_regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <map>
#include <new>
#include <utility>
#include <unordered_set>

#include <fmt/format.h>

#include "twell/error.hpp"

namespace twell::model::detail {
namespace {

constexpr const char* kOnigWordClass = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
constexpr const char* kOnigLatin1Word = "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";

std::string canonical_property(std::string_view name) {
  std::string out;
  for (char c : name)
    if (c != '_' && c != '-' && c != ' ') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_general_category(std::string_view name) {
  static const std::unordered_set<std::string> kCategories = {
      "l", "lu", "ll", "lt", "lm", "lo", "lc", "l&", "m", "mn", "mc", "me", "n", "nd", "nl", "no", "p", "pc", "pd",
      "ps", "pe", "pi", "pf", "po", "s", "sm", "sc", "sk", "so", "z", "zs", "zl", "zp", "c", "cc", "cf", "cs", "co",
      "cn", "any", "letter", "casedletter", "uppercaseletter", "lowercaseletter", "titlecaseletter", "modifierletter",
      "otherletter", "mark", "combiningmark", "nonspacingmark", "spacingmark", "enclosingmark", "number",
      "decimalnumber", "letternumber", "othernumber", "punctuation", "connectorpunctuation", "dashpunctuation",
      "openpunctuation", "closepunctuation", "initialpunctuation", "finalpunctuation", "otherpunctuation", "symbol",
      "mathsymbol", "currencysymbol", "modifiersymbol", "othersymbol", "separator", "spaceseparator",
      "lineseparator", "paragraphseparator", "other", "control", "format", "surrogate", "privateuse", "unassigned"};
  return kCategories.count(canonical_property(name)) != 0;
}

bool pcre2_compiles(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &offset, nullptr);
  pcre2_code_free(code);
  return code != nullptr;
}

// Per-thread PCRE2 match state: one ovector pair is all we read (rc 0 still fills it), and a JIT
// stack larger than the 32 KiB default for deep backtracking.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (!data || !context) throw std::bad_alloc();
    jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

MatchScratch& match_scratch() {
  thread_local MatchScratch s;
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return fmt::format("PCRE2 error {}", code);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string translate_oniguruma(std::string_view p, const std::string& what) {
  const std::string w = std::string(kOnigWordClass) + kOnigLatin1Word;  // standalone \w
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  std::size_t class_body = 0;  // index in p of the class body's first character
  auto refuse = [&](std::string_view construct) {
    fail(ErrorCode::unsupported, "{}: the regex construct {} in pattern '{}' has no PCRE2 equivalent", what, construct, p);
  };
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      switch (e) {
        case 's': out += "\\p{White_Space}"; break;
        case 'S': out += "\\P{White_Space}"; break;
        case 'w': out += in_class ? std::string(kOnigWordClass) : "[" + w + "]"; break;
        case 'W':
          if (in_class) refuse("\\W inside a class");
          out += "[^" + w + "]";
          break;
        case 'h': out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"; break;
        case 'H':
          if (in_class) refuse("\\H inside a class");
          out += "[^0-9a-fA-F]";
          break;
        case 'v': out += "\\x{0B}"; break;
        case 'b':
          if (in_class) out += "\\b";  // backspace
          else out += "(?:(?<=[" + w + "])(?![" + w + "])|(?<![" + w + "])(?=[" + w + "]))";
          break;
        case 'B':
          if (in_class) refuse("\\B inside a class");
          out += "(?:(?<=[" + w + "])(?=[" + w + "])|(?<![" + w + "])(?![" + w + "]))";
          break;
        case 'u': {  // \uHHHH
          const bool hex4 = i + 4 < p.size() && std::all_of(p.begin() + static_cast<std::ptrdiff_t>(i + 1),
                                                            p.begin() + static_cast<std::ptrdiff_t>(i + 5),
                                                            [](char h) { return std::isxdigit(static_cast<unsigned char>(h)) != 0; });
          if (hex4) {
            out += "\\x{";
            out += p.substr(i + 1, 4);
            out += '}';
            i += 4;
          } else {
            out += "\\u";  // PCRE2 reports it
          }
          break;
        }
        case 'p':
        case 'P': {  // \p{Name}, \p{^Name}: scripts mean Script, not Script_Extensions
          const std::size_t close = i + 1 < p.size() && p[i + 1] == '{' ? p.find('}', i + 2) : std::string_view::npos;
          if (close == std::string_view::npos) {
            out += '\\';
            out += e;
            break;
          }
          std::string_view name = p.substr(i + 2, close - i - 2);
          bool negated = e == 'P';
          if (!name.empty() && name[0] == '^') negated = !negated, name.remove_prefix(1);
          std::string prop(name);
          if (!is_general_category(name) && name.find_first_of(":=") == std::string_view::npos &&
              pcre2_compiles("\\p{sc:" + prop + "}"))
            prop = "sc:" + prop;
          out += negated ? "\\P{" : "\\p{";
          out += prop;
          out += '}';
          i = close;
          break;
        }
        default:
          out += '\\';
          out += e;
      }
      continue;
    }
    if (in_class) {
      if (c == ']' && i > class_body) {
        in_class = false;
      } else if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {  // a POSIX bracket, [:alpha:] or [:^alpha:]
          const std::size_t close = p.find(":]", i + 2);
          if (close == std::string_view::npos) refuse("'[:' without ':]'");
          std::string_view name = p.substr(i + 2, close - i - 2);
          const bool negated = !name.empty() && name[0] == '^';
          if (negated) name.remove_prefix(1);
          static const std::map<std::string, std::pair<std::string, std::string>, std::less<>> kPosix = {
              // name → (class body, negated class body or "" when there is no single-escape form)
              {"alpha", {"\\p{Alphabetic}", "\\P{Alphabetic}"}},
              {"digit", {"\\p{Nd}", "\\P{Nd}"}},
              {"alnum", {"\\p{Alphabetic}\\p{Nd}", ""}},
              {"punct", {"\\p{P}\\p{S}", ""}},
              {"upper", {"\\p{Uppercase}", "\\P{Uppercase}"}},
              {"lower", {"\\p{Lowercase}", "\\P{Lowercase}"}},
              {"space", {"\\p{White_Space}", "\\P{White_Space}"}},
              {"cntrl", {"\\p{Cc}", "\\P{Cc}"}},
              {"blank", {"\\p{Zs}\\t", ""}},
              {"xdigit", {"0-9A-Fa-f", ""}},
              {"word", {kOnigWordClass, ""}},
          };
          const auto it = kPosix.find(name);
          if (it == kPosix.end() || (negated && it->second.second.empty()))
            refuse(fmt::format("[:{}{}:]", negated ? "^" : "", name));
          out += negated ? it->second.second : it->second.first;
          i = close + 1;
          continue;
        }
        refuse("a nested character class");
      } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        refuse("class intersection &&");
      }
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      class_body = i + 1;
      if (class_body < p.size() && p[class_body] == '^') {
        out += '^';
        ++i;
        ++class_body;
      }
      continue;
    }
    if (c == '(' && i + 2 < p.size() && p[i + 1] == '?') {  // (?imx-imx) and (?imx-imx:...)
      std::size_t j = i + 2;
      while (j < p.size() && (p[j] == 'i' || p[j] == 'm' || p[j] == 'x' || p[j] == '-')) ++j;
      if (j > i + 2 && j < p.size() && (p[j] == ':' || p[j] == ')')) {
        out += "(?";
        for (std::size_t k = i + 2; k < j; ++k) out += p[k] == 'm' ? 's' : p[k];
        i = j - 1;
        continue;
      }
    }
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& what, bool anchored) : source_(pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  const std::uint32_t options =
      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE | (anchored ? PCRE2_ANCHORED : 0u);
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err, &offset, nullptr);
  if (!code)  // invalid in Oniguruma too, or a construct PCRE2 lacks
    fail(ErrorCode::unsupported, "{}: regex '{}' (as translated for PCRE2) does not compile at offset {}: {}", what, pattern,
         offset, pcre2_message(err));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // on failure pcre2_match interprets
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::find(std::string_view subject, std::size_t start, std::size_t& mbegin, std::size_t& mend) const {
  MatchScratch& s = match_scratch();
  auto* code = static_cast<const pcre2_code*>(code_);
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = pcre2_match(code, subj, subject.size(), start, 0, s.data, s.context);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking on the heap
    rc = pcre2_match(code, subj, subject.size(), start, PCRE2_NO_JIT, s.data, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0)
    fail(ErrorCode::invalid_argument, "tokenizer: matching regex '{}' on a {}-byte piece failed: {}", source_, subject.size(),
         pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
  mbegin = ov[0];
  mend = std::max(ov[0], ov[1]);  // \K in a lookahead can report end < begin
  return true;
}

}  // namespace twell::model::detail
