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
  // CLI11 would say "A subcommand is required" for a misspelt one (`twell bnech`, `twell bench ffm`).
  CLI::App* level = &app;
  std::string path = "twell";
  for (int i = 1; i < argc && argv[i][0] != '-' && !level->get_subcommands({}).empty(); ++i) {
    CLI::App* sub = nullptr;
    try {
      sub = level->get_subcommand(argv[i]);
    } catch (const CLI::OptionNotFound&) {
    }
    if (!sub) {
      std::string names;
      for (const CLI::App* s : level->get_subcommands({})) names += (names.empty() ? "" : ", ") + s->get_name();
      std::fprintf(stderr, "%s: unknown command '%s' (commands: %s; see %s --help)\n", path.c_str(), argv[i],
                   names.c_str(), path.c_str());
      return 1;
    }
    level = sub;
    path += std::string(" ") + argv[i];
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
