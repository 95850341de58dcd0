// Each subcommand of the `twell` CLI lives in its own file and registers itself here.
#pragma once

#include <CLI/CLI.hpp>

namespace twell::cli {

void register_bench(CLI::App& app);
void register_inspect(CLI::App& app);

}  // namespace twell::cli
