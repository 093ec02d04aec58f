// The tokenizer on small hand-written tokenizer.json files: merge order, added and special tokens,
// pre-tokenizers, post-processor, decoding and streaming, and every kind of bad file. Parity with
// HF on real-shaped tokenizers is tokenizer_parity.py's job.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "twell/error.hpp"
#include "twell/model/tokenizer.hpp"

namespace {

using json = nlohmann::json;
using twell::Error;
using twell::ErrorCode;
using twell::model::StreamDecoder;
using twell::model::Tokenizer;
using Ids = std::vector<std::int32_t>;

// GPT-2's byte → character map, written independently of the library's: printable bytes stand
// for themselves, the others for U+0100 on, in byte order (all below U+0800: two UTF-8 bytes).
std::string byte_char(int b) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t;
    int n = 0;
    for (int x = 0; x < 256; ++x) {
      const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
      const int cp = printable ? x : 256 + n++;
      std::string s;
      if (cp < 0x80) s += static_cast<char>(cp);
      else s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
      t.push_back(s);
    }
    return t;
  }();
  return table[static_cast<std::size_t>(b)];
}

std::string byte_level(std::string_view raw) {
  std::string s;
  for (unsigned char c : raw) s += byte_char(c);
  return s;
}

// A byte-level BPE: ids 0..255 are the bytes (id == byte value), then one id per merge result in
// order, then `extra` vocab entries. Merges are given on raw text ("a b") and written byte-level.
struct Spec {
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> extra;
  json pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json added_tokens = json::array();
  json post_processor = nullptr;
  bool ignore_merges = false;
};

json make(const Spec& spec) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json merges = json::array();
  for (const auto& [a, b] : spec.merges) {
    merges.push_back(byte_level(a) + " " + byte_level(b));
    const std::string m = byte_level(a + b);
    if (!vocab.contains(m)) vocab[m] = vocab.size();
  }
  for (const auto& e : spec.extra) vocab[e] = vocab.size();
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", spec.added_tokens},
          {"normalizer", nullptr},
          {"pre_tokenizer", spec.pre_tokenizer},
          {"post_processor", spec.post_processor},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", spec.ignore_merges},
            {"vocab", vocab},
            {"merges", merges}}}};
}

Tokenizer load(const Spec& spec) { return Tokenizer::from_json(make(spec).dump(), "test.json"); }

json added(int id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
           bool single_word = false, bool normalized = false) {
  return {{"id", id},         {"content", content},         {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

std::vector<std::string> pieces(const Tokenizer& t, const Ids& ids) {
  std::vector<std::string> out;
  for (auto id : ids) out.push_back(t.token_bytes(id));
  return out;
}

// ---- BPE ------------------------------------------------------------------------------------

TEST(Tokenizer, MergesApplyInRankOrder) {
  // "b c" ranks before "a b": "abc" becomes a + bc, and with the ranks swapped ab + c.
  Spec s;
  s.merges = {{"b", "c"}, {"a", "b"}};
  s.extra = {byte_level("abc")};
  const Tokenizer t1 = load(s);
  EXPECT_EQ(pieces(t1, t1.encode("abc")), (std::vector<std::string>{"a", "bc"}));
  std::swap(s.merges[0], s.merges[1]);
  const Tokenizer t2 = load(s);
  EXPECT_EQ(pieces(t2, t2.encode("abc")), (std::vector<std::string>{"ab", "c"}));
  // A later merge builds on earlier results.
  s.merges.push_back({"ab", "c"});
  const Tokenizer t3 = load(s);
  EXPECT_EQ(pieces(t3, t3.encode("abc")), (std::vector<std::string>{"abc"}));
}

TEST(Tokenizer, EqualRanksMergeLeftmostFirst) {
  Spec s;
  s.merges = {{"a", "a"}};
  const Tokenizer t = load(s);
  EXPECT_EQ(pieces(t, t.encode("aaa")), (std::vector<std::string>{"aa", "a"}));
  EXPECT_EQ(pieces(t, t.encode("aaaa")), (std::vector<std::string>{"aa", "aa"}));
  EXPECT_EQ(pieces(t, t.encode("aaaaa")), (std::vector<std::string>{"aa", "aa", "a"}));
}

TEST(Tokenizer, MergesInBothFileFormats) {
  Spec s;
  s.merges = {{"h", "i"}, {" ", "hi"}};
  json j = make(s);
  const Tokenizer legacy = Tokenizer::from_json(j.dump());
  json pairs = json::array();
  for (const auto& m : j["model"]["merges"]) {
    const std::string line = m.get<std::string>();
    pairs.push_back({line.substr(0, line.find(' ')), line.substr(line.find(' ') + 1)});
  }
  j["model"]["merges"] = pairs;
  const Tokenizer tuples = Tokenizer::from_json(j.dump());
  EXPECT_EQ(legacy.encode("hi hi"), tuples.encode("hi hi"));
  EXPECT_EQ(pieces(legacy, legacy.encode("hi hi")), (std::vector<std::string>{"hi", " hi"}));
}

TEST(Tokenizer, IgnoreMergesTakesWholeWordsFromTheVocab) {
  Spec s;
  s.merges = {{"h", "e"}};
  s.extra = {byte_level("hello")};  // in the vocab, but no merge chain builds it
  s.ignore_merges = true;
  const Tokenizer with = load(s);
  EXPECT_EQ(pieces(with, with.encode("hello")), (std::vector<std::string>{"hello"}));
  s.ignore_merges = false;
  const Tokenizer without = load(s);
  EXPECT_EQ(pieces(without, without.encode("hello")), (std::vector<std::string>{"he", "l", "l", "o"}));
}

TEST(Tokenizer, ByteLevelSplitsWordsAndRoundTrips) {
  Spec s;
  s.merges = {{" ", "w"}, {" w", "o"}, {"'", "s"}};
  const Tokenizer t = load(s);
  // The GPT-2 split: "'s" alone, " wo" keeps its space, whitespace runs leave the last space.
  EXPECT_EQ(pieces(t, t.encode("it's wo")), (std::vector<std::string>{"i", "t", "'s", " wo"}));
  EXPECT_EQ(pieces(t, t.encode("a   wo")), (std::vector<std::string>{"a", " ", " ", " wo"}));
  for (const std::string text : {"", " ", "Hello, world!\n", "naïve café — 中文 🤗👩‍👩‍👧", "\t\r\n  x  ", "\xff\xfe bad \xc3"}) {
    const Ids ids = t.encode(text);
    EXPECT_EQ(t.decode(ids), text) << "round trip of '" << text << "'";
  }
}

TEST(Tokenizer, DigitsSplitsNumbers) {
  Spec s;
  s.merges = {{"1", "2"}, {"12", "3"}};
  s.pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers",
                      {{{"type", "Digits"}, {"individual_digits", true}},
                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
  const Tokenizer single = load(s);
  EXPECT_EQ(pieces(single, single.encode("x123")), (std::vector<std::string>{"x", "1", "2", "3"}));
  s.pre_tokenizer["pretokenizers"][0]["individual_digits"] = false;
  const Tokenizer runs = load(s);
  EXPECT_EQ(pieces(runs, runs.encode("x123")), (std::vector<std::string>{"x", "123"}));
  // Digits of other scripts are numbers too (char::is_numeric): Arabic-Indic ٣ is split alone.
  EXPECT_EQ(single.encode("1٣").size(), 1u + 2u);  // "1", then ٣'s two bytes
}

TEST(Tokenizer, EmptyInput) {
  Spec s;
  s.post_processor = {{"type", "TemplateProcessing"},
                      {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                      {"pair", json::array()},
                      {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {256}}, {"tokens", {"<bos>"}}}}}}};
  s.added_tokens = json::array({added(256, "<bos>", true)});
  const Tokenizer t = load(s);
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_EQ(t.encode("", true), Ids{256});
  EXPECT_EQ(t.decode(Ids{}), "");
  StreamDecoder d(t);
  EXPECT_EQ(d.flush(), "");
}

// ---- added and special tokens ------------------------------------------------------------------

Spec chat_spec() {
  Spec s;
  s.merges = {{"h", "i"}};
  s.added_tokens = json::array({added(0, "<|endoftext|>", true), added(1, "<|im_start|>", true),
                                added(2, "<|im_end|>", true)});
  // HF keeps the ids of added tokens already in the vocab.
  s.extra = {};
  return s;
}

TEST(Tokenizer, SpecialTokensInTheTextAreMatched) {
  Spec s = chat_spec();
  json j = make(s);
  // Put the specials in the vocab at ids 256.. as SmolLM2 does at 0..
  j["model"]["vocab"]["<|endoftext|>"] = 300, j["model"]["vocab"]["<|im_start|>"] = 301, j["model"]["vocab"]["<|im_end|>"] = 302;
  const Tokenizer t = Tokenizer::from_json(j.dump());
  const Ids ids = t.encode("<|im_start|>hi<|im_end|>x<|im_start");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 301);
  EXPECT_EQ(t.token_bytes(ids[1]), "hi");
  EXPECT_EQ(ids[2], 302);
  EXPECT_EQ(t.decode(ids), "<|im_start|>hi<|im_end|>x<|im_start");
  EXPECT_EQ(t.decode(ids, true), "hix<|im_start");
  EXPECT_TRUE(t.is_special(301));
  EXPECT_FALSE(t.is_special(ids[1]));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_FALSE(t.is_special(1 << 30));
  EXPECT_EQ(t.token_id("<|im_end|>"), 302);
  EXPECT_EQ(t.token_id(byte_level(" ")), 32);
  EXPECT_EQ(t.token_id("Ġ"), 32);
  EXPECT_EQ(t.token_id("no such token"), std::nullopt);
  EXPECT_EQ(t.vocab_size(), 303);
  EXPECT_EQ(t.token_string(302), "<|im_end|>");
  EXPECT_EQ(t.token_string(32), "Ġ");
  EXPECT_EQ(t.token_string(299), std::nullopt);  // a hole in the ids
  EXPECT_EQ(t.token_bytes(299), "");
  EXPECT_THROW(t.token_bytes(303), Error);
  EXPECT_THROW(t.token_bytes(-1), Error);
}

TEST(Tokenizer, AddedTokenIdsAreDerivedAsHfDoes) {
  // Not in the vocab: HF numbers added tokens from the vocab's entry count on, whatever the file says.
  Spec s = chat_spec();
  const Tokenizer t = load(s);
  const std::int64_t n_vocab = 256 + 1;  // the bytes and "hi"
  EXPECT_EQ(t.token_id("<|endoftext|>"), n_vocab);
  EXPECT_EQ(t.token_id("<|im_start|>"), n_vocab + 1);
  EXPECT_EQ(t.token_id("<|im_end|>"), n_vocab + 2);
  EXPECT_EQ(t.vocab_size(), n_vocab + 3);
}

TEST(Tokenizer, LongestAddedTokenWins) {
  Spec s;
  s.added_tokens = json::array({added(0, "<a>", true), added(0, "<a><b>", true), added(0, "<a><b", false)});
  const Tokenizer t = load(s);
  const auto a = *t.token_id("<a>"), ab = *t.token_id("<a><b>"), ab_ = *t.token_id("<a><b");
  EXPECT_EQ(t.encode("<a><b>"), Ids{ab});
  EXPECT_EQ(t.encode("<a><b>>"), (Ids{ab, '>'}));
  EXPECT_EQ(t.encode("<a><c"), (Ids{a, '<', 'c'}));
  EXPECT_EQ(t.encode("<a><bc"), (Ids{ab_, 'c'}));
}

TEST(Tokenizer, LstripAndRstripAbsorbWhitespace) {
  Spec s;
  s.added_tokens = json::array({added(0, "<l>", true, /*lstrip=*/true), added(0, "<r>", true, false, /*rstrip=*/true),
                                added(0, "<n>", true)});
  const Tokenizer t = load(s);
  const auto l = *t.token_id("<l>"), r = *t.token_id("<r>"), n = *t.token_id("<n>");
  EXPECT_EQ(t.encode("x \t <l>y"), (Ids{'x', l, 'y'}));
  EXPECT_EQ(t.encode("x<r> \n y"), (Ids{'x', r, 'y'}));
  EXPECT_EQ(t.encode("x\u3000<l>"), (Ids{'x', l}));  // any White_Space, not only ASCII
  EXPECT_EQ(t.encode("x <n> y"), (Ids{'x', ' ', n, ' ', 'y'}));
  // The stripped text is part of the token: decode gives the token's content only.
  EXPECT_EQ(t.decode(t.encode("x  <l>")), "x<l>");
}

TEST(Tokenizer, SingleWordTokensMatchOnlyWholeWords) {
  Spec s;
  s.added_tokens = json::array({added(0, "cat", false, false, false, /*single_word=*/true, /*normalized=*/true)});
  const Tokenizer t = load(s);
  const auto cat = *t.token_id("cat");
  EXPECT_EQ(t.encode("a cat!"), (Ids{'a', ' ', cat, '!'}));
  EXPECT_EQ(t.encode("cats"), (Ids{'c', 'a', 't', 's'}));
  EXPECT_EQ(t.encode("_cat"), (Ids{'_', 'c', 'a', 't'}));
}

TEST(Tokenizer, TemplateAddsBosOnlyWhenAsked) {
  Spec s;
  s.added_tokens = json::array({added(0, "<|begin_of_text|>", true)});
  s.post_processor = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", json::array()},
         {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {256}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  const Tokenizer t = load(s);
  EXPECT_EQ(t.encode("hi"), (Ids{'h', 'i'}));
  EXPECT_EQ(t.encode("hi", true), (Ids{256, 'h', 'i'}));
}

// ---- streaming decode ---------------------------------------------------------------------------

TEST(TokenizerStream, HoldsBackAPartialCharacter) {
  const Tokenizer t = load(Spec{});
  const std::string emoji = "🤗";  // F0 9F A4 97: four byte tokens, no merges
  const Ids ids = t.encode("a" + emoji + "b");
  ASSERT_EQ(ids.size(), 6u);
  StreamDecoder d(t);
  std::vector<std::string> out;
  for (auto id : ids) out.push_back(d.push(id));
  EXPECT_EQ(out, (std::vector<std::string>{"a", "", "", "", emoji, "b"}));
  EXPECT_EQ(d.flush(), "");
}

TEST(TokenizerStream, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer t = load(Spec{});
  const std::string fffd = "\xEF\xBF\xBD";
  StreamDecoder d(t);
  EXPECT_EQ(d.push(0x80), fffd);  // a lone continuation byte can never complete
  EXPECT_EQ(d.push(0xE2), "");    // a valid start: held back
  EXPECT_EQ(d.push(0x82), "");
  EXPECT_EQ(d.push('a'), fffd + "a");  // E2 82 then 'a': one U+FFFD for the maximal subpart
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.flush(), fffd);  // flush gives up on the incomplete sequence
  EXPECT_EQ(d.push('z'), "z");  // and starts afresh
  EXPECT_EQ(d.push(0xED), "");
  EXPECT_EQ(d.push(0xA0), fffd + fffd);  // ED A0: a surrogate, invalid at its second byte
}

TEST(TokenizerStream, SkipsSpecialTokensWhenAsked) {
  Spec s = chat_spec();
  const Tokenizer t = load(s);
  const Ids ids = t.encode("<|im_start|>hi");
  StreamDecoder keep(t), skip(t, true);
  std::string a, b;
  for (auto id : ids) a += keep.push(id), b += skip.push(id);
  EXPECT_EQ(a, "<|im_start|>hi");
  EXPECT_EQ(b, "hi");
}

// ---- concurrency -----------------------------------------------------------------------------------

TEST(Tokenizer, ConcurrentEncodesAgree) {
  Spec s;
  s.merges = {{"t", "h"}, {"th", "e"}, {" ", "the"}, {"e", "r"}};
  const Tokenizer t = load(s);
  std::string text;
  for (int i = 0; i < 300; ++i) text += "the other " + std::to_string(i) + " theater\n";
  const Ids want = t.encode(text);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < got.size(); ++k)
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 5; ++rep) got[k] = t.encode(text);
    });
  for (auto& th : threads) th.join();
  for (const Ids& g : got) EXPECT_EQ(g, want);
}

// ---- bad files -------------------------------------------------------------------------------------

// Expects loading to throw twell::Error with `code` and a message naming the source and `phrase`.
void expect_error(const std::function<void()>& load_it, ErrorCode code, const std::string& phrase, const std::string& source) {
  try {
    load_it();
    FAIL() << "no error; expected one containing '" << phrase << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << "message: " << e.what();
    EXPECT_NE(std::string(e.what()).find(source), std::string::npos) << "message names no source: " << e.what();
  }
}

struct BadFileCase {
  std::string name;
  std::function<void(json&)> edit;
  ErrorCode code;
  std::string phrase;
};

const std::vector<BadFileCase>& bad_file_cases() {
  static const std::vector<BadFileCase> cases = {
      {"unknown model type", [](json& j) { j["model"]["type"] = "WordPiece"; }, ErrorCode::unsupported, "WordPiece"},
      {"unigram model", [](json& j) { j["model"] = {{"type", "Unigram"}, {"vocab", json::array()}}; }, ErrorCode::unsupported, "Unigram"},
      {"no model", [](json& j) { j.erase("model"); }, ErrorCode::corrupt, "model"},
      {"NFC normalizer", [](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, ErrorCode::unsupported, "NFC"},
      {"normalizer in a sequence",
       [](json& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Lowercase"}}}}}; },
       ErrorCode::unsupported, "Lowercase"},
      {"metaspace", [](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}}; }, ErrorCode::unsupported,
       "Metaspace"},
      {"two ByteLevel",
       [](json& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {j["pre_tokenizer"], j["pre_tokenizer"]}}}; },
       ErrorCode::unsupported, "second ByteLevel"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, ErrorCode::unsupported, "dropout"},
      {"no decoder", [](json& j) { j["decoder"] = nullptr; }, ErrorCode::unsupported, "decoder"},
      {"wordpiece decoder", [](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, ErrorCode::unsupported, "WordPiece"},
      {"bad version", [](json& j) { j["version"] = "2.0"; }, ErrorCode::unsupported, "version"},
      {"vocab as a list", [](json& j) { j["model"]["vocab"] = json::array({"a"}); }, ErrorCode::corrupt, "model.vocab"},
      {"negative id", [](json& j) { j["model"]["vocab"]["x"] = -3; }, ErrorCode::corrupt, "-3"},
      {"huge id", [](json& j) { j["model"]["vocab"]["x"] = 1ll << 40; }, ErrorCode::corrupt, "outside"},
      {"string id", [](json& j) { j["model"]["vocab"]["x"] = "7"; }, ErrorCode::corrupt, "integer"},
      {"merge of unknown token", [](json& j) { j["model"]["merges"].push_back("zz q"); }, ErrorCode::corrupt, "'zz'"},
      {"merge result missing",
       [](json& j) {
         j["model"]["vocab"]["QQ"] = 999;
         j["model"]["merges"].push_back("QQ Q");
       },
       ErrorCode::corrupt, "QQQ"},
      {"merge with three parts", [](json& j) { j["model"]["merges"].push_back("a b c"); }, ErrorCode::corrupt, "a b c"},
      {"merges of mixed formats", [](json& j) { j["model"]["merges"].push_back(json::array({"a", "b"})); }, ErrorCode::corrupt,
       "merges"},
      {"added token without content", [](json& j) { j["added_tokens"] = {{{"id", 5}, {"special", true}}}; }, ErrorCode::corrupt,
       "content"},
      {"bad split behavior",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}, {"invert", false}};
       },
       ErrorCode::corrupt, "Sideways"},
      {"regex that does not compile",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}, {"invert", false}};
       },
       ErrorCode::unsupported, "(a"},
      {"class intersection",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "[a-z&&[^aeiou]]"}}}, {"behavior", "Isolated"}, {"invert", false}};
       },
       ErrorCode::unsupported, "&&"},
      {"template with sequence B",
       [](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", {"$A", "$B"}}, {"pair", json::array()}, {"special_tokens", json::object()}};
       },
       ErrorCode::corrupt, "'B'"},
      {"template with unknown special",
       [](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", {"<s>", "$A"}}, {"pair", json::array()}, {"special_tokens", json::object()}};
       },
       ErrorCode::corrupt, "<s>"},
      {"unknown post-processor", [](json& j) { j["post_processor"] = {{"type", "Frobnicate"}}; }, ErrorCode::unsupported, "Frobnicate"},
      {"top level is a list", [](json& j) { j = json::array({1, 2}); }, ErrorCode::corrupt, "not a JSON object"},
  };
  return cases;
}

TEST(TokenizerErrors, BadFilesThrowNamedErrors) {
  for (const auto& c : bad_file_cases()) {
    SCOPED_TRACE(c.name);
    json j = make(Spec{});
    c.edit(j);
    expect_error([&] { Tokenizer::from_json(j.dump(), "bad.json"); }, c.code, c.phrase, "bad.json");
  }
}

TEST(TokenizerErrors, InvalidJson) {
  const std::string good = make(Spec{}).dump();
  for (const std::string& text : {std::string(""), std::string("{"), good.substr(0, good.size() / 2), std::string("\xff\xfe{}"),
                                 std::string("{\"model\": }")}) {
    expect_error([&] { Tokenizer::from_json(text, "broken.json"); }, ErrorCode::corrupt, "not valid JSON", "broken.json");
  }
}

TEST(TokenizerErrors, UnkTokenMissingFromVocabFailsWhenNeeded) {
  json j = make(Spec{});
  j["model"]["vocab"].erase(byte_char(0xFF));
  j["model"]["unk_token"] = "<unk>";  // not in the vocab
  const Tokenizer t = Tokenizer::from_json(j.dump(), "unk.json");
  EXPECT_EQ(t.encode("ok").size(), 2u);  // loads, and text without the missing byte works
  expect_error([&] { t.encode("\xff"); }, ErrorCode::corrupt, "<unk>", "unk.json");
}

TEST(TokenizerErrors, Files) {
  const auto dir = std::filesystem::temp_directory_path() / ("twell_tok_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string missing = (dir / "missing.json").string();
  expect_error([&] { Tokenizer::from_file(missing); }, ErrorCode::io, "does not exist", missing);
  expect_error([&] { Tokenizer::from_file(dir.string()); }, ErrorCode::io, "not a regular file", dir.string());
  const std::string good = (dir / "tokenizer.json").string();
  std::ofstream(good) << make(chat_spec()).dump();
  const Tokenizer t = Tokenizer::from_file(good);
  EXPECT_EQ(t.decode(t.encode("<|im_end|>hi")), "<|im_end|>hi");
  const std::string bad = (dir / "bad.json").string();
  std::ofstream(bad) << "{\"model\": [";
  expect_error([&] { Tokenizer::from_file(bad); }, ErrorCode::corrupt, "not valid JSON", bad);
  std::filesystem::remove_all(dir);
}

// ---- unk and byte fallback -----------------------------------------------------------------------

TEST(Tokenizer, MissingBytesBecomeUnkOrFallBackOrVanish) {
  json j = make(Spec{});
  auto& vocab = j["model"]["vocab"];
  vocab.erase(byte_char('x'));
  vocab.erase(byte_char('y'));
  vocab["<unk>"] = 400;
  {
    json u = j;
    u["model"]["unk_token"] = "<unk>";
    u["model"]["fuse_unk"] = true;
    const Tokenizer t = Tokenizer::from_json(u.dump());
    EXPECT_EQ(t.encode("axyb"), (Ids{'a', 400, 'b'}));
    u["model"]["fuse_unk"] = false;
    const Tokenizer t2 = Tokenizer::from_json(u.dump());
    EXPECT_EQ(t2.encode("axyb"), (Ids{'a', 400, 400, 'b'}));
  }
  {
    json f = j;  // byte_fallback looks up <0xHH> for the bytes of the byte-level character ('x' is one byte)
    f["model"]["byte_fallback"] = true;
    f["model"]["vocab"]["<0x78>"] = 401;
    const Tokenizer t = Tokenizer::from_json(f.dump());
    EXPECT_EQ(t.encode("axyb"), (Ids{'a', 401, 'b'}));  // 'y' has no fallback token and no unk: dropped
  }
  const Tokenizer t = Tokenizer::from_json(j.dump());
  EXPECT_EQ(t.encode("axyb"), (Ids{'a', 'b'}));  // HF drops characters it cannot encode
}

}  // namespace
