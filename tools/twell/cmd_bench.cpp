// `twell bench ffn`: FFN forward benchmark (shared/BENCHMARKS.md), table on stdout, JSON to --json.
#include <iostream>

#include "commands.h"
#include "ffn_bench.h"

namespace twell::cli {

void register_bench(CLI::App& app, const std::string& command_line) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: correctness first, then timing against dense");
  bench->require_subcommand(1);

  auto cfg = std::make_shared<bench::FfnBenchConfig>();
  auto distributions = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"uniform", "skewed"});
  auto json_path = std::make_shared<std::string>();
  auto non_gated = std::make_shared<bool>(false);

  CLI::App* ffn = bench->add_subcommand("ffn", "FFN forward: dense vs TwELL sparse at chosen densities");
  ffn->add_option("--backend", cfg->backend, "cpu, cuda or auto (cuda when a Hopper GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  ffn->add_option("-M,--tokens", cfg->tokens, "token counts M (default: backend's standard set)");
  ffn->add_option("-H,--hidden", cfg->H, "model width H")->capture_default_str();
  ffn->add_option("-I,--ffn", cfg->I, "FFN width I")->capture_default_str();
  ffn->add_option("-d,--density", cfg->densities, "activation densities, non-zeros per token / I (e.g. 0.005)");
  ffn->add_option("--distribution", *distributions, "uniform and/or skewed")
      ->check(CLI::IsMember({"uniform", "skewed"}))
      ->capture_default_str();
  ffn->add_flag("--non-gated", *non_gated, "h = relu(x Wuᵀ) instead of relu(x Wgᵀ) ⊙ (x Wuᵀ)");
  ffn->add_option("--tile", cfg->tile, "TwELL tile width T")->capture_default_str();
  ffn->add_option("--compression", cfg->compression, "TwELL compression factor C (capacity T/C per tile)")
      ->capture_default_str();
  ffn->add_option("--warmup", cfg->warmup, "warm-up runs (default: backend's)");
  ffn->add_option("--iters", cfg->iters, "timed runs, median reported (default: backend's)");
  ffn->add_option("--seed", cfg->seed, "random seed of the synthetic problem")->capture_default_str();
  ffn->add_option("--from", cfg->from_file,
                  "safetensors file: x [M, H], gate, up and down [I, H] (down neuron-major: the transpose of "
                  "down_proj.weight; no gate for a non-gated FFN)");
  ffn->add_option("--json", *json_path, "write the JSON records here");

  ffn->callback([=] {
    cfg->command = command_line;
    cfg->gated = !*non_gated;
    cfg->distributions.clear();
    for (const auto& d : *distributions) cfg->distributions.push_back(bench::distribution_from_name(d));
    const auto records = bench::run_ffn_bench(*cfg, std::cerr);
    bench::print_table(records, std::cout);
    if (!json_path->empty()) {
      bench::write_records(records, *json_path);
      std::cout << "wrote " << records.size() << " records to " << *json_path << "\n";
    }
    for (const auto& r : records)
      TWELL_CHECK(r.correct, "case M=", r.M, " density=", r.density, " ", r.distribution, " impl ", r.impl,
                  " failed its correctness check: ", r.note);
  });
}

}  // namespace twell::cli
