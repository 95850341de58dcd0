// twell: command-line tool. `twell --help` lists the subcommands.
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"twell: sparse-activation transformer FFNs (TwELL format and kernels)", "twell"};
  app.set_version_flag("--version", TWELL_VERSION);
  app.require_subcommand(1);
  std::string command_line = "twell";
  for (int i = 1; i < argc; ++i) command_line += std::string(" ") + argv[i];
  twell::cli::register_bench(app, command_line);
  twell::cli::register_inspect(app);
  twell::cli::register_run(app);
  twell::cli::register_eval(app);
  // CLI11 would say "A subcommand is required" for a misspelt one.
  bool known = true;
  if (argc > 1 && argv[1][0] != '-') {
    try {
      app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {
      known = false;
    }
  }
  if (!known) {
    std::fprintf(stderr, "twell: unknown command '%s' (commands: bench, inspect, run, eval; see twell --help)\n",
                 argv[1]);
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twell: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
