// The C++ example of docs/runtime.md, compiled and run by ctest (example_generate) on
// SmolLM2 when scripts/fetch-smollm2 has fetched it (exit 77, skipped, otherwise).
#include <filesystem>
#include <iostream>

#include "twell/model/generate.hpp"
#include "twell/model/tokenizer.hpp"

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "assets/smollm2-135m-instruct";
  if (!std::filesystem::exists(dir + "/.complete")) return 77;
  // --- the example ---
  using namespace twell::model;
  const Model model = Model::load(dir);                      // config.json + model.safetensors
  const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  auto rt = make_runtime(model, "cpu");                      // or "cuda"
  GenerateOptions opt;
  opt.max_new_tokens = 32;                                   // greedy unless opt.sampling says otherwise
  const auto prompt = tok.encode(chat_prompt(dir, "What is the capital of France?"));
  const auto out = generate(*rt, {prompt}, opt);
  std::cout << tok.decode(out[0].tokens, /*skip_special=*/true) << "\n";
  // --- end of the example ---
  return tok.decode(out[0].tokens, true).find("Paris") == std::string::npos;
}
