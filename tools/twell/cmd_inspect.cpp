#include "commands.h"
namespace twell::cli {
void register_inspect(CLI::App& app) { app.add_subcommand("inspect", "Print a checkpoint's config and tensors (TODO)"); }
}  // namespace twell::cli
