// `twell bench ffn` (forward, or forward + backward with --train) and `twell bench model`
// (shared/BENCHMARKS.md): table on stdout, JSON to --json.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "ffn_bench.h"
#include "model_bench.h"

namespace twell::cli {

void register_bench(CLI::App& app, const std::string& command_line) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: correctness first, then timing against dense");
  bench->require_subcommand(1);

  auto cfg = std::make_shared<bench::FfnBenchConfig>();
  auto distributions = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"uniform", "skewed"});
  auto json_path = std::make_shared<std::string>();
  auto non_gated = std::make_shared<bool>(false);
  auto timing = std::make_shared<std::string>("gpu");

  CLI::App* ffn = bench->add_subcommand("ffn", "FFN forward (or forward + backward with --train): dense vs TwELL sparse at chosen densities");
  ffn->add_option("--backend,--device", cfg->backend, "cpu, cuda or auto (cuda when a Hopper GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  ffn->add_option("-M,--tokens", cfg->tokens,
                  "token counts M, repeated or a list: -M 128,2048 (default: the backend's standard set)")
      ->delimiter(',')
      ->check(numeric_items(at_least(1)));
  ffn->add_option("-H,--hidden", cfg->H, "model width H")->check(at_least(3))->capture_default_str();
  ffn->add_option("-I,--intermediate", cfg->I, "FFN width I (HF: intermediate_size)")
      ->check(at_least(1))
      ->capture_default_str();
  ffn->add_option("-d,--density", cfg->densities,
                  "activation densities, non-zeros per token / I (e.g. 0.005, or a list: 0.005,0.01; default: the "
                  "backend's standard set)")
      ->delimiter(',')
      ->check(numeric_items(real_in(0, true, 1, "a density in (0, 1]")));
  ffn->add_option("--distribution", *distributions, "uniform and/or skewed (a list: uniform,skewed)")
      ->delimiter(',')
      ->check(CLI::IsMember({"uniform", "skewed"}))
      ->capture_default_str();
  ffn->add_flag("--non-gated", *non_gated, "h = relu(x Wuᵀ) instead of relu(x Wgᵀ) ⊙ (x Wuᵀ)");
  ffn->add_option("--tile", cfg->tile,
                  "TwELL tile width T; 0: the FFN's default (176 where --compression divides 176, outside --train; "
                  "else 256)")
      ->check(int_in(0, 65536))
      ->capture_default_str();
  ffn->add_option("--compression", cfg->compression, "TwELL compression factor C (capacity T/C per tile)")
      ->check(int_in(1, 65536))
      ->capture_default_str();
  ffn->add_option("--warmup", cfg->warmup, "warm-up runs (default: backend's)")->check(at_least(0));
  ffn->add_option("--iters", cfg->iters, "timed runs, median reported (default: backend's)")->check(at_least(1));
  ffn->add_option("--seed", cfg->seed, "random seed of the synthetic problem")
      ->check(seed_value())
      ->capture_default_str();
  CLI::Option* from = ffn->add_option("--from", cfg->from_file,
                                      "safetensors file: x [M, H], gate, up and down [I, H] (down neuron-major: the "
                                      "transpose of down_proj.weight; no gate for a non-gated FFN); M, H, I, the "
                                      "density and gating come from the file; BF16, F16, F32 or F64, rounded to "
                                      "bf16 once")
                       ->check(existing_file());
  CLI::Option* timing_option = ffn->add_option("--timing", *timing,
                  "gpu: each call is enqueued behind a kernel that holds the stream, so the CUDA events time the "
                  "GPU's work alone (nvbench's method; a model's host runs ahead like this); host: from an idle "
                  "GPU, the host's launch work included. --train always times host, and so does the CPU "
                  "backend")
      ->check(CLI::IsMember({"gpu", "host"}))
      ->capture_default_str();
  ffn->add_option("--json", *json_path, "write the JSON records here")->check(file_name());
  CLI::Option* energy = ffn->add_flag(
      "--energy", cfg->energy,
      "after timing a case, run each implementation back to back (twice, in order and in reverse) and read the "
      "GPU's power through NVML: energy per token, the sustained time a call, the SM clock and the time at the "
      "power cap (CUDA backend)");
  ffn->add_option("--energy-seconds", cfg->energy_seconds, "with --energy: seconds each implementation runs, each time")
      ->check(real_in(0.5, false, 60.0, "in [0.5, 60]"))
      ->needs(energy)
      ->capture_default_str();
  ffn->add_flag("--split", cfg->split,
                "also time twell_split: the neurons that fire in >= 1.2% of a calibration sample's tokens (min(M, "
                "16384) fresh ones of the case's distribution; with --from the file's first rows, which are timed "
                "too) run as a dense FFN, in 704-neuron steps, the rest sparse (twell::cuda::SplitFfn; CUDA "
                "backend, forward only)");
  ffn->add_flag("--train", cfg->train,
                "time forward + backward (all four gradients, L1 term on) instead of the forward; checks dx on "
                "sampled tokens and dWg, dWu, dWd on sampled neurons against float64 first (CUDA backend)");
  ffn->add_option("--l1", cfg->l1, "with --train: coefficient of the L1 penalty's gradient l1·sign(h)")
      ->needs(ffn->get_option("--train"))
      ->capture_default_str();

  for (const char* shape_option : {"-M", "-H", "-I", "-d", "--distribution", "--non-gated"})
    from->excludes(ffn->get_option(shape_option));
  ffn->callback([=] {
    bench::check_records_path(*json_path, {{cfg->from_file, "the --from input"}});  // before a run of minutes, not after it
    cfg->command = command_line;
    cfg->gated = !*non_gated;
    cfg->timing = *timing == "host" ? bench::Timing::host : bench::Timing::gpu;
    cfg->timing_given = timing_option->count() > 0;
    cfg->distributions.clear();
    for (const auto& d : *distributions) cfg->distributions.push_back(bench::distribution_from_name(d));
    // A case that fails to run does not throw away the cases done before it (run_saving_records).
    const auto records = bench::run_saving_records(
        [&](std::vector<bench::BenchRecord>* done) { bench::run_ffn_bench(*cfg, std::cerr, done); }, *json_path,
        std::cout, std::cerr);
    for (const auto& r : records)
      TWELL_REQUIRE(r.correct, "case M=", r.M, " density=", r.density * 100, "% ", r.distribution, " impl ", r.impl,
                    " failed its correctness check: ", r.note);
  });

  auto mcfg = std::make_shared<bench::ModelBenchConfig>();
  auto model_json = std::make_shared<std::string>();
  auto no_prefill = std::make_shared<bool>(false), no_decode = std::make_shared<bool>(false),
       no_graphs = std::make_shared<bool>(false), unfused_qkv = std::make_shared<bool>(false),
       unfused_decode_ffn = std::make_shared<bool>(false), cublas_projections = std::make_shared<bool>(false),
       separate_ffn_norm = std::make_shared<bool>(false), eager_residual = std::make_shared<bool>(false),
       few_token_gemm = std::make_shared<bool>(true);
  CLI::App* model = bench->add_subcommand(
      "model", "Whole model on the GPU, dense vs twell FFN: prefill tokens/ms, decode tokens/s, memory, energy");
  model->add_option("--layers", mcfg->layers, "decoder layers")->capture_default_str();
  model->add_option("-H,--hidden", mcfg->hidden, "hidden size")->capture_default_str();
  model->add_option("-I,--intermediate", mcfg->ffn, "FFN width (HF: intermediate_size)")->capture_default_str();
  model->add_option("--heads", mcfg->heads, "attention heads")->capture_default_str();
  model->add_option("--kv-heads", mcfg->kv_heads, "key/value heads")->capture_default_str();
  model->add_option("--vocab", mcfg->vocab, "vocabulary size")->capture_default_str();
  model->add_option("--batch", mcfg->batch, "prefill: sequences")->capture_default_str();
  model->add_option("--seq", mcfg->seq, "prefill: tokens per sequence")->capture_default_str();
  model->add_option("--decode-batch", mcfg->decode_batches, "decode: sequences per step (repeatable, or a list: 1,8)")
      ->delimiter(',')
      ->capture_default_str();
  model->add_option("--context", mcfg->context, "decode: prompt tokens before the timed steps")->capture_default_str();
  model->add_option("--steps", mcfg->steps, "decode: timed steps")->capture_default_str();
  model->add_option("-d,--density", mcfg->density, "FFN activation density the gate thresholds are calibrated to")
      ->capture_default_str();
  model->add_option("--warmup", mcfg->warmup, "prefill: warm-up runs")->check(at_least(0))->capture_default_str();
  model->add_option("--iters", mcfg->iters, "prefill: timed runs (median reported)")
      ->check(at_least(1))
      ->capture_default_str();
  model->add_option("--check-tokens", mcfg->check_tokens, "tokens of the CPU reference check (at least 2)")
      ->capture_default_str();
  model->add_flag("--no-prefill", *no_prefill, "skip the prefill benchmark");
  model->add_flag("--no-decode", *no_decode, "skip the decode benchmark");
  model->add_flag("--unfused-qkv", *unfused_qkv,
                  "prefill: run the QKV GEMM (cuBLASLt) and RoPE as separate kernels (A/B of the fused kernel)");
  model->add_flag("--separate-ffn-norm", *separate_ffn_norm,
                  "the residual add + RMSNorm after each FFN as a kernel of its own, not in the twell FFN's down "
                  "pass (A/B; LlamaCudaOptions::ffn_residual_norm)");
  model->add_flag("--eager-residual-add", *eager_residual,
                  "prefill: add the attention's output into the f32 residual in the norm before the FFN, not in the "
                  "one after it (A/B; LlamaCudaOptions::deferred_residual_add)");
  model->add_flag("--unfused-decode-ffn", *unfused_decode_ffn,
                  "decode, batch 1: the FFN's partial sums added by their own kernel, then the plain residual add + "
                  "RMSNorm, instead of inside the RMSNorm (A/B)");
  model->add_flag("--cublas-decode-projections", *cublas_projections,
                  "decode, batch 1: the QKV and output projections, the LM head and the dense FFN's gate and up through "
                  "cuBLASLt instead of twell's GEMV (A/B)");
  model->add_flag("--few-token-gemm,!--no-few-token-gemm", *few_token_gemm,
                  "decode steps and --turn calls of 2 to 32 tokens: the QKV and output projections, the LM head of up to 8 "
                  "rows and the FFN's gate (the dense FFN's up too) through twell's few-token GEMM (the default; LlamaCudaOptions::few_token_gemm), "
                  "or through cuBLASLt (--no-few-token-gemm, A/B)");
  model->add_flag("--no-graphs", *no_graphs, "decode and --turn: launch every step's (turn's) kernels instead of replaying a CUDA graph");
  model->add_option("--decode-attention-splits", mcfg->decode_attention_splits,
                    "decode: key ranges a head of the attention, 1 to 16, in both models (A/B); 0: each model's own "
                    "(LlamaCudaOptions::decode_attention_splits)")
      ->capture_default_str();
  model->add_option("--decode-attention-warps", mcfg->decode_attention_warps,
                    "decode: warps a block of the attention, 1, 2 or 4, in both models (A/B); 0: 2 where that keeps "
                    "every block resident at once and 4 would not, else 4 (LlamaCudaOptions::decode_attention_warps)")
      ->capture_default_str();
  model->add_option("--gather-batches", mcfg->gather_batches,
                    "decode: batches up to this size are also timed with the gather FFN where the default options "
                    "take the dense one (twell_gather records; A/B of LlamaCudaOptions::decode_gather_tokens)")
      ->check(int_in(1, 256))
      ->capture_default_str();
  model->add_option("--ragged", mcfg->ragged,
                    "ragged prefill: batches of this many prompts of random lengths (64 to 511 tokens, new lengths "
                    "each call, as a server sees them, and one set repeated) on the twell model, as runs of "
                    "neighbouring prompts and as one padded batch (LlamaCudaOptions::ragged_prefill_runs; "
                    "model_ragged records); 0: none")
      ->check(int_in(0, 256))
      ->capture_default_str();
  model->add_option("--long", mcfg->long_prompt,
                    "one prompt of this many tokens on the twell model, prefilled in even chunks of at most the default max_tokens "
                    "(16384: 20000 tokens run as 10000 + 10000) and in one forward, with the memory each holds (model_long records); 0: none")
      ->check(int_in(0, 1 << 20))
      ->capture_default_str();
  model->add_option("--turn", mcfg->turns,
                    "a conversation's next turn: this many new tokens after --turn-context cached ones (prefill_from, "
                    "as twell run --chat runs each turn), on the dense model, the twell model (its FFN gathers the "
                    "active rows where that reads less: LlamaCudaOptions::prefill_gather) and the twell model without "
                    "that (model_turn records); repeatable, or a list: 1,21")
      ->delimiter(',')
      ->check(int_in(1, 1 << 20));
  model->add_option("--turn-context", mcfg->turn_context, "the turn's cached history, in tokens")
      ->check(int_in(1, 1 << 20))
      ->capture_default_str();
  model->add_option("--attention", mcfg->attention,
                    "prefill attention: auto (cuDNN's fused SDPA where libcudnn 9 loads, from 2048 tokens a call, from a "
                    "shape's second call or where one call repays its plan), cudnn, twell")
      ->check(CLI::IsMember({"auto", "cudnn", "twell"}))
      ->capture_default_str();
  model->add_option("--tile", mcfg->tile,
                    "the twell FFN's TwELL tile width T; 0: the FFN's default (176)")
      ->check(int_in(0, 65536))
      ->capture_default_str();
  model->add_option("--save", mcfg->save_dir,
                    "also write the calibrated synthetic model to this directory as an HF checkpoint (config.json, "
                    "model.safetensors; bf16), a sparse model for twell run and eval (--byte-tokenizer)")
      ->check(CLI::Validator(
          [](std::string& dir) {
            namespace fs = std::filesystem;
            if (dir.empty()) return std::string("expected a directory, got an empty name");
            std::error_code ec;
            if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) return dir + " exists and is not a directory";
            // A checkpoint there is not replaced (found after a run of minutes, it was, without a word)
            for (const char* name : {"config.json", "model.safetensors"})  // (a dangling link too: not replaced)
              if (fs::exists(fs::symlink_status(fs::path(dir) / name, ec)))
                return dir + " holds a model already (" + name + "): give a new directory (twell does not replace one)";
            // Writable: the directory, or the nearest one above it that exists (save_dir creates the rest)
            fs::path probe = fs::absolute(dir, ec);
            while (!ec && probe.has_relative_path() && !fs::exists(probe, ec)) probe = probe.parent_path();
            if (::access(probe.c_str(), W_OK | X_OK) != 0)
              return "cannot write in " + probe.string() + ": " + std::strerror(errno);
            // Files run and eval would read with the saved model (its stop ids, a tokenizer, other weights)
            std::string stale;
            for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                     "model.safetensors.index.json"})
              if (std::filesystem::exists(std::filesystem::path(dir) / name)) stale += (stale.empty() ? "" : ", ") + std::string(name);
            return stale.empty() ? std::string()
                                 : dir + " holds " + stale + ", which twell run and eval would read with the saved "
                                         "model: give a new directory (or remove them)";
          },
          "DIR"));
  model->add_option("--seed", mcfg->seed, "random seed of the synthetic model")
      ->check(seed_value())
      ->capture_default_str();
  model->add_option("--json", *model_json, "write the JSON records here")->check(file_name());
  model->callback([=] {
    bench::check_records_path(*model_json);
    mcfg->command = command_line;
    mcfg->prefill = !*no_prefill;
    mcfg->decode = !*no_decode;
    mcfg->cuda_graphs = !*no_graphs;
    mcfg->fused_qkv_rope = !*unfused_qkv;
    mcfg->ffn_residual_norm = !*separate_ffn_norm;
    mcfg->deferred_residual_add = !*eager_residual;
    if (*unfused_decode_ffn) mcfg->fused_decode_ffn = false;
    if (*cublas_projections) mcfg->decode_gemv = false;
    mcfg->few_token_gemm = *few_token_gemm;
    std::string failure;  // a later phase's error: the earlier phases' records are printed and written first
    const auto records = bench::run_model_bench(*mcfg, std::cerr, &failure);
    bench::print_model_table(records, std::cout);
    bench::save_records(records, *model_json, std::cout);
    TWELL_CHECK(failure.empty(), "bench model stopped in ", failure, " (the records of the phases before it are above)");
    for (const auto& r : records)
      TWELL_CHECK(r.correct, r.bench, " impl ", r.impl, " failed its correctness check: ", r.note);
  });
}

}  // namespace twell::cli
