// Each subcommand of the `twell` CLI lives in its own file and registers itself here.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace twell::cli {

// `command_line` is the full invocation, recorded in benchmark results.
void register_bench(CLI::App& app, const std::string& command_line);
void register_inspect(CLI::App& app);
void register_run(CLI::App& app);
void register_eval(CLI::App& app);

}  // namespace twell::cli
