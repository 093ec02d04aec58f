// twell: the command-line tool. One line per error on stderr, non-zero exit on any failure:
//   1 = a twell error (bad input, I/O, unsupported request), 2 = bad command line,
//   3 = a benchmark whose correctness check failed, 4 = an unexpected exception.
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "common.hpp"

namespace {

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

void print_error(const std::string& message) { std::fprintf(stderr, "twell: error: %s\n", one_line(message).c_str()); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "twell: ReLU-sparse transformer language models: generation with Llama checkpoints, and FFNs dense vs\n"
      "TwELL/hybrid sparse, on the CPU and CUDA GPUs.\n"
      "Run `twell <command> --help` for each command's options."};
  app.name("twell");
  app.option_defaults()->always_capture_default();
  app.require_subcommand(1);
  std::vector<twell::cli::Command> commands;
  twell::cli::add_ffn_command(app, commands);
  twell::cli::add_bench_command(app, commands);
  twell::cli::add_stats_command(app, commands);
  twell::cli::add_gen_command(app, commands);
  twell::cli::add_generate_command(app, commands);
#if TWELL_HAVE_SERVE
  twell::cli::add_serve_command(app, commands);
#endif

  // CLI11 reports a mistyped command as "A subcommand is required"; name it instead.
  {
    CLI::App* level = &app;
    for (int i = 1; i < argc && level; ++i) {
      const std::string arg = argv[i];
      if (arg.empty() || arg[0] == '-') break;
      if (level->get_subcommands({}).empty()) break;
      CLI::App* next = nullptr;
      std::string names;
      for (CLI::App* s : level->get_subcommands({})) {
        names += (names.empty() ? "" : ", ") + s->get_name();
        if (s->get_name() == arg) next = s;
      }
      if (!next) {
        print_error("unknown command '" + arg + "' (commands: " + names + "; see `twell --help`)");
        return 2;
      }
      level = next;
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(std::string(e.what()) + " (see `twell --help`)");
    return 2;
  }

  try {
    for (const auto& c : commands)
      if (c.app->parsed()) return c.run();
    print_error("no command given (see `twell --help`)");
    return 2;
  } catch (const twell::Error& e) {
    print_error(e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    print_error("out of memory (try smaller shapes)");
    return 1;
  } catch (const std::exception& e) {
    print_error(std::string("unexpected: ") + e.what());
    return 4;
  }
}
