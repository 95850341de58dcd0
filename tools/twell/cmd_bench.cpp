#include "commands.h"
namespace twell::cli {
void register_bench(CLI::App& app) { app.add_subcommand("bench", "Benchmarks (TODO)"); }
}  // namespace twell::cli
