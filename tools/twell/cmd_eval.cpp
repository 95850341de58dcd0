// `twell eval MODEL FILE`: perplexity of a text file on the GPU or the CPU backend, in windows of
// the model's context, with a progress bar on stderr.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "ffn_bench.h"
#include "model_loading.h"
#include "progress.h"
#if TWELL_WITH_CUDA
#include "twell/cuda/llama.h"
#endif

namespace twell::cli {

namespace {

// The rows of one forward eval's default batch of windows fills: those of the GPU runtime's default
// forward (none without it: one window a call).
int64_t default_rows_a_forward() {
#if TWELL_WITH_CUDA
  return cuda::kDefaultMaxTokens;
#else
  return 0;
#endif
}

// The files of `dir` a model's load reads (its config and generation config, tokenizer files, weights and
// their index), as --json's inputs: the results must not overwrite one.
std::vector<std::pair<std::string, std::string>> model_files(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "config.json" || name == "generation_config.json" || name == "special_tokens_map.json" ||
        name.rfind("tokenizer", 0) == 0 || ends_with(name, ".safetensors") || ends_with(name, ".safetensors.index.json"))
      files.emplace_back(it->path().string(), "a file of the model:");
  }
  return files;
}

}  // namespace

// One line per layer: non-zeros of h per token (mean and max), density, and the L1 of h per
// token (the quantity the training penalty drives down).
static void print_sparsity(const std::vector<ActivationStats>& layers, const io::ModelConfig& c) {
  if (layers.empty() || layers[0].tokens == 0) {
    std::printf("FFN sparsity: needs a ReLU-gated FFN (this model's hidden_act is %s)\n", c.hidden_act.c_str());
    return;
  }
  std::printf("FFN activation h, per layer over %lld tokens (I = %lld):\n%-6s %10s %8s %9s %12s\n",
              static_cast<long long>(layers[0].tokens), static_cast<long long>(c.intermediate_size), "layer",
              "nnz/token", "max", "density", "L1/token");
  double sum = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const ActivationStats& s = layers[l];
    sum += s.mean_nnz_per_token();
    std::printf("%-6zu %10.1f %8lld %8.3f%% %12.4g\n", l, s.mean_nnz_per_token(),
                static_cast<long long>(s.max_nnz_per_token), 100 * s.mean_nnz_per_token() / c.intermediate_size,
                s.l1_per_token());
  }
  const double mean = sum / static_cast<double>(layers.size());
  std::printf("%-6s %10.1f %8s %8.3f%%\n", "mean", mean, "", 100 * mean / c.intermediate_size);
}

void register_eval(CLI::App& app) {
  CLI::App* eval = app.add_subcommand("eval", "Perplexity of a text file under a Llama-style model (GPU, or the CPU backend)");
  auto args = std::make_shared<ModelArgs>();
  auto file = std::make_shared<std::string>();
  auto context = std::make_shared<int64_t>(0);
  auto max_windows = std::make_shared<int64_t>(0);
  auto stride = std::make_shared<int64_t>(0);
  auto sparsity = std::make_shared<bool>(false);
  auto json_path = std::make_shared<std::string>();
  auto batch = std::make_shared<int64_t>(0);
  args->add_to(eval);
  eval->add_flag("--sparsity", *sparsity,
                 "also print each layer's FFN activation sparsity (ReLU models; on the GPU from dense GEMMs beside the "
                 "FFN, which slows the run)");
  eval->add_option("file", *file, "text file (UTF-8)")->required()->check(existing_file());
  eval->add_option("--context", *context,
                   "tokens per window (default: max_position_embeddings, at most 8192: on the CPU backend a "
                   "window's logits are 4·window·vocab bytes); windows do not overlap unless --stride says, so "
                   "each window's first token is context, not predicted")
      ->check(at_least(2));
  eval->add_option("--stride", *stride,
                   "tokens from one window's start to the next (default: the window, --context); less slides the "
                   "window as HuggingFace's perplexity guide does: every token scored once, with at least "
                   "context - stride tokens before it outside the first window, at context / stride times the "
                   "forwards")
      ->check(at_least(1));
  eval->add_option("--max-windows", *max_windows, "evaluate at most this many windows (0 = all)")
      ->check(at_least(0))
      ->capture_default_str();
  args->gpu_only_options.push_back(eval->add_option("--batch", *batch,
                   "GPU: windows of one length a forward (default: as many as make 16384 tokens, so that short "
                   "windows fill the GPU and take the sparse FFN; fewer where the GPU's memory asks)")
      ->check(int_in(1, 65535)));
  eval->add_option("--json", *json_path,
                   "also write the result here as JSON (with --sparsity, each layer's figures too; "
                   "bench/plot.py draws them)")
      ->check(file_name());

  eval->callback([=] {
    // Everything that can be wrong with the arguments, the tokenizer or the text is found before
    // the weights load.
    const io::ModelConfig config = io::read_config(args->dir);
    TWELL_REQUIRE(!*sparsity || config.hidden_act == "relu",
                  "--sparsity needs a ReLU-gated FFN; this model's hidden_act is ", config.hidden_act);
    const auto tok = args->load_tokenizer(config);
    const int64_t ctx = *context > 0 ? *context : std::min<int64_t>(config.max_position_embeddings, 8192);
    TWELL_REQUIRE(ctx >= 2, *context > 0 ? str("--context must be at least 2, got ", ctx)
                                         : str("the model's context (config.json's max_position_embeddings, ", ctx,
                                               ") holds one token: a perplexity needs at least 2"));
    TWELL_REQUIRE(ctx <= config.max_position_embeddings, "--context ", ctx, " is longer than the model's context of ",
                  config.max_position_embeddings);
    const int64_t step = *stride > 0 ? *stride : ctx;
    TWELL_REQUIRE(step <= ctx, "--stride ", step, " is longer than the window (",
                  *context > 0 ? str("--context ", ctx)
                  : ctx < config.max_position_embeddings ? str(ctx, " tokens, the model's context capped at 8192; --context sets it")
                                                         : str(ctx, " tokens, the model's context; --context sets it"),
                  "): the tokens between windows would not be scored");
    TWELL_REQUIRE(!*sparsity || step == ctx, "--sparsity counts every token of each window: it takes windows that "
                  "do not overlap (--stride equal to the window)");
    std::vector<std::pair<std::string, std::string>> inputs = model_files(args->dir);
    inputs.emplace_back(*file, "the text file");
    bench::check_records_path(*json_path, inputs);  // a bad --json path fails now, not after the run
    refuse_device(*file);
    std::ifstream in(*file, std::ios::binary);
    TWELL_REQUIRE(in, *file, ": cannot read: ", std::strerror(errno));
    std::string text;
    char chunk[1 << 16];
    while (in.read(chunk, sizeof chunk) || in.gcount() > 0) text.append(chunk, static_cast<size_t>(in.gcount()));
    TWELL_REQUIRE(!in.bad(), *file, ": read failed: ", std::strerror(errno));
    refuse_utf16_or_32(*file, text);
    const bool valid_utf8 = note_if_not_utf8(*file, text);
    std::vector<int32_t> ids;
    if (tok->bos_to_add()) ids.push_back(*tok->bos_to_add());
    const std::vector<int32_t> body = tok->encode(text);
    TWELL_REQUIRE(!body.empty(), *file, ": no text to evaluate (it encodes to no tokens)");
    ids.insert(ids.end(), body.begin(), body.end());
    if (tok->eos_to_add()) ids.push_back(*tok->eos_to_add());  // as HF's tokenizer(text) ends it
    TWELL_REQUIRE(ids.size() >= 2, *file, ": needs at least 2 tokens, has ", ids.size(),
                " (one token of text, and no BOS token to predict it from)");
    // Windows per call: --batch, or as many as make the default rows of a forward (at least one, at
    // most the windows there are).
    const int64_t windows_in_text =
        static_cast<int64_t>(model::eval_windows(static_cast<int64_t>(ids.size()), ctx, step).size());
    const int64_t windows = *max_windows > 0 ? std::min(windows_in_text, *max_windows) : windows_in_text;
    const int64_t per_call = std::min(windows, *batch > 0 ? *batch : std::max<int64_t>(1, default_rows_a_forward() / ctx));
    // The GPU's buffers for that many windows (a forward for them all: no KV cache), none longer than
    // the text; fewer windows where they do not fit.
    args->gpu_context = std::min(ctx, static_cast<int64_t>(ids.size()));
    args->gpu_kv_cache = false;
    args->gpu_max_batch = per_call;
    args->gpu_shrink_to_fit = true;
    args->max_tokens_option = "";
    const std::unique_ptr<model::LanguageModel> model = args->load_model();
    const model::LanguageModel& m = *model;
    const bool on_cpu = dynamic_cast<const model::LlamaCpu*>(&m) != nullptr;
    const int64_t windows_per_call = m.sequences_a_forward();  // the CPU: one, its progress a window at a time

    // Said before the first window ends (a window of the 2B model's 2048 tokens takes ~45 s on two CPU cores).
    std::fprintf(stderr, "scoring %lld window%s of up to %lld tokens, %lld a forward%s\n", static_cast<long long>(windows),
                 windows == 1 ? "" : "s", static_cast<long long>(ctx), static_cast<long long>(windows_per_call),
                 on_cpu ? " (the CPU backend: slow for a large model)" : "");
    bench::StepProgress progress(std::cerr, "", windows);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<ActivationStats> layer_total;
    const model::Perplexity p = model::windowed_perplexity(
        m, ids, ctx, step, *max_windows, *sparsity ? &layer_total : nullptr,
        [&](int64_t done, int64_t total, const model::Perplexity& so_far) {
          const int bar = static_cast<int>(30 * done / total);
          char line[160];
          std::snprintf(line, sizeof line, "[%-30s] %lld/%lld windows, perplexity so far %.4f",
                        std::string(bar, '#').c_str(), static_cast<long long>(done), static_cast<long long>(total),
                        so_far.perplexity);
          progress.show(done, line);  // redrawn on a terminal, a line each tenth of the way into a file
        },
        *file, windows_per_call);
    const int64_t predictions = p.predictions;
    progress.finish();
    const std::string every = step < ctx && windows > 1 ? str(" every ", step) : "";
    const std::string part = windows < windows_in_text
                                 ? str(" (the first ", windows, " of the text's ", windows_in_text, ": --max-windows)")
                                 : "";
    // Past ~709.8 nats the perplexity overflows a double: the NLL is the figure then.
    const std::string ppl = std::isfinite(p.perplexity) ? str(std::fixed, std::setprecision(4), p.perplexity)
                                                        : std::string("inf (its exp overflows a double)");
    std::printf("%s: %lld token%s predicted in %lld window%s of up to %lld%s%s, mean NLL %.6f nats, perplexity %s\n",
                file->c_str(), static_cast<long long>(predictions), predictions == 1 ? "" : "s",
                static_cast<long long>(windows), windows == 1 ? "" : "s", static_cast<long long>(ctx), every.c_str(),
                part.c_str(), p.mean_nll, ppl.c_str());
    std::fflush(stdout);  // the result before the rate where both go to one pipe
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%lld token%s scored in %.2f s (%.0f tokens/s)\n", static_cast<long long>(predictions),
                 predictions == 1 ? "" : "s", seconds, seconds > 0 ? static_cast<double>(predictions) / seconds : 0.0);
    if (*sparsity) print_sparsity(layer_total, m.config());
    if (!json_path->empty()) {
      nlohmann::ordered_json j;
      j["file"] = *file;
      j["model"] = args->dir;
      j["backend"] = on_cpu ? "cpu" : "cuda";
      j["tokens_scored"] = predictions;
      j["windows"] = windows;
      if (windows < windows_in_text) {
        j["windows_in_text"] = windows_in_text;  // --max-windows: a part of the text, not all of it
        j["max_windows"] = *max_windows;
      }
      j["context"] = ctx;
      j["stride"] = step;
      j["windows_per_call"] = windows_per_call;
      j["mean_nll"] = p.mean_nll;
      if (std::isfinite(p.perplexity)) {
        j["perplexity"] = p.perplexity;
      } else {
        j["perplexity"] = nullptr;  // JSON has no infinity
        j["perplexity_overflows"] = true;
      }
      if (!valid_utf8) j["valid_utf8"] = false;  // its bytes were encoded as they are (noted on stderr)
      j["seconds"] = seconds;
      if (*sparsity) {
        const int64_t I = m.config().intermediate_size;
        nlohmann::ordered_json layers = nlohmann::ordered_json::array();
        for (size_t l = 0; l < layer_total.size(); ++l) {
          const ActivationStats& s = layer_total[l];
          layers.push_back({{"layer", l},
                            {"tokens", s.tokens},
                            {"nnz_per_token", s.mean_nnz_per_token()},
                            {"max_nnz_per_token", s.max_nnz_per_token},
                            {"density", s.mean_nnz_per_token() / static_cast<double>(I)},
                            {"l1_per_token", s.l1_per_token()}});
        }
        j["intermediate_size"] = I;
        j["ffn_sparsity"] = layers;
      }
      // A path's bytes that are not UTF-8 become U+FFFD in the record (dump() would throw, the run lost).
      bench::write_json_file(*json_path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
      std::fprintf(stderr, "wrote the result to %s\n", json_path->c_str());
    }
  });
}

}  // namespace twell::cli
