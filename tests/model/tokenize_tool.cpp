// tokenize_tool: the tokenizer from the command line, for tokenizer_parity.py and for measuring.
//
//   tokenize_tool encode TOKENIZER_JSON TEXT_FILE [--add-special]   ids of the file's text, one line
//   tokenize_tool decode TOKENIZER_JSON [--skip-special] ID...      the ids' bytes
//   tokenize_tool jsonl  TOKENIZER_JSON IN.jsonl OUT.jsonl
//       each input line {"text": str, "add_special": bool}; each output line
//       {"ids": [...], "decoded": hex, "decoded_skip": hex, "stream": hex} (hex: decode's raw bytes,
//       and StreamDecoder's output pushed id by id then flushed), or {"error": message}
//   tokenize_tool bench  TOKENIZER_JSON TEXT_FILE [--seconds S]     encode throughput, as JSON
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "twell/error.hpp"
#include "twell/model/tokenizer.hpp"

namespace {

using twell::model::StreamDecoder;
using twell::model::Tokenizer;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += digits[b >> 4], out += digits[b & 15];
  return out;
}

int usage() {
  std::cerr << "usage: tokenize_tool encode TOKENIZER_JSON TEXT_FILE [--add-special]\n"
               "       tokenize_tool decode TOKENIZER_JSON [--skip-special] ID...\n"
               "       tokenize_tool jsonl TOKENIZER_JSON IN.jsonl OUT.jsonl\n"
               "       tokenize_tool bench TOKENIZER_JSON TEXT_FILE [--seconds S]\n";
  return 2;
}

int run_jsonl(const Tokenizer& tok, const std::string& in_path, const std::string& out_path) {
  std::ifstream in(in_path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + in_path);
  std::ofstream out(out_path, std::ios::binary);
  if (!out) throw std::runtime_error("cannot write " + out_path);
  std::string line;
  while (std::getline(in, line)) {
    const auto doc = nlohmann::json::parse(line);
    nlohmann::json result;
    try {
      const auto ids = tok.encode(doc.at("text").get<std::string>(), doc.value("add_special", false));
      StreamDecoder stream(tok);
      std::string streamed;
      for (const std::int32_t id : ids) streamed += stream.push(id);
      streamed += stream.flush();
      result["ids"] = ids;
      result["decoded"] = hex(tok.decode(ids));
      result["decoded_skip"] = hex(tok.decode(ids, true));
      result["stream"] = hex(streamed);
    } catch (const twell::Error& e) {
      result = {{"error", e.what()}};
    }
    out << result.dump() << '\n';
  }
  return 0;
}

int run_bench(const std::string& tok_path, const std::string& text_path, double seconds) {
  const std::string text = read_file(text_path);
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };

  const auto t_load = clock::now();
  const Tokenizer tok = Tokenizer::from_file(tok_path);
  const double load_s = secs(clock::now() - t_load);

  // Cold: the first pass over the text, with the word cache empty.
  auto t0 = clock::now();
  std::size_t n_tokens = tok.encode(text).size();
  const double cold_s = secs(clock::now() - t0);

  // Warm: repeated passes, as a long-running process sees recurring words.
  int passes = 0;
  t0 = clock::now();
  do {
    n_tokens = tok.encode(text).size();
    ++passes;
  } while (secs(clock::now() - t0) < seconds);
  const double warm_s = secs(clock::now() - t0) / passes;

  // Decode of the same ids.
  const auto ids = tok.encode(text);
  t0 = clock::now();
  const std::size_t decoded = tok.decode(ids).size();
  const double decode_s = secs(clock::now() - t0);

  const double mb = static_cast<double>(text.size()) / 1e6;
  nlohmann::json r = {{"bytes", text.size()},         {"tokens", n_tokens},          {"load_s", load_s},
                      {"cold_mb_per_s", mb / cold_s}, {"warm_mb_per_s", mb / warm_s}, {"warm_passes", passes},
                      {"decode_mb_per_s", static_cast<double>(decoded) / 1e6 / decode_s}};
  std::cout << r.dump() << '\n';
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2) return usage();
  try {
    const std::string& cmd = args[0];
    if (cmd == "bench") {
      if (args.size() < 3) return usage();
      double seconds = 2.0;
      if (args.size() == 5 && args[3] == "--seconds") seconds = std::stod(args[4]);
      return run_bench(args[1], args[2], seconds);
    }
    const Tokenizer tok = Tokenizer::from_file(args[1]);
    if (cmd == "encode") {
      if (args.size() < 3) return usage();
      const bool add_special = args.size() > 3 && args[3] == "--add-special";
      const auto ids = tok.encode(read_file(args[2]), add_special);
      for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
      std::cout << '\n';
      return 0;
    }
    if (cmd == "decode") {
      bool skip = false;
      std::vector<std::int32_t> ids;
      for (std::size_t i = 2; i < args.size(); ++i) {
        if (args[i] == "--skip-special") skip = true;
        else ids.push_back(static_cast<std::int32_t>(std::stol(args[i])));
      }
      std::cout << tok.decode(ids, skip);
      return 0;
    }
    if (cmd == "jsonl") {
      if (args.size() < 4) return usage();
      return run_jsonl(tok, args[2], args[3]);
    }
    return usage();
  } catch (const std::exception& e) {
    std::cerr << "tokenize_tool: " << e.what() << '\n';
    return 1;
  }
}
