// `twell run MODEL --prompt TEXT`: generation on the GPU or the CPU backend, streamed token by token.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>

#include "commands.h"
#include "model_loading.h"

namespace twell::cli {

void register_run(CLI::App& app) {
  CLI::App* run = app.add_subcommand("run", "Generate text from a Llama-style model (GPU, or the CPU backend)");
  auto args = std::make_shared<ModelArgs>();
  auto prompt = std::make_shared<std::string>();
  auto max_tokens = std::make_shared<int64_t>(64);
  auto sampling = std::make_shared<model::SamplingOptions>();
  auto no_stop = std::make_shared<bool>(false);
  args->add_to(run);
  run->add_option("-p,--prompt", *prompt, "the text to continue")->required();
  run->add_option("-n,--max-tokens", *max_tokens, "tokens to generate at most")
      ->check(at_least(0))
      ->capture_default_str();
  run->add_option("--temperature", sampling->temperature, "0 = greedy")
      ->check(real_in(0, false, HUGE_VAL, "finite and at least 0"))
      ->capture_default_str();
  // Options that shape sampling only, so that a greedy run can say it ignored them.
  const std::vector<CLI::Option*> sampling_only = {
      run->add_option("--top-k", sampling->top_k, "sample from the k most likely tokens (0 = all)")
          ->check(at_least(0))
          ->capture_default_str(),
      run->add_option("--top-p", sampling->top_p, "nucleus sampling threshold (1 = all)")
          ->check(real_in(0, true, 1, "in (0, 1]"))
          ->capture_default_str(),
      run->add_option("--seed", sampling->seed, "sampling seed")->check(seed_value())->capture_default_str()};
  run->add_flag("--no-stop", *no_stop, "keep generating past the end-of-sequence token");

  run->callback([=] {
    sampling->check();  // before the load, which can take a while
    if (sampling->temperature == 0) {
      std::string ignored;
      for (const CLI::Option* o : sampling_only)
        if (o->count() > 0) ignored += (ignored.empty() ? "" : ", ") + o->get_name();
      if (!ignored.empty())
        std::fprintf(stderr, "note: %s only shape%s sampling; at --temperature 0 the run is greedy (argmax)\n",
                     ignored.c_str(), ignored.find(',') == std::string::npos ? "s" : "");
    }
    const io::ModelConfig config = io::read_config(args->dir);
    const auto tok = args->load_tokenizer(config);
    std::vector<int32_t> ids;
    if (tok->bos_to_add()) ids.push_back(*tok->bos_to_add());
    note_if_not_utf8("the prompt", *prompt);
    const std::vector<int32_t> text = tok->encode(*prompt);
    ids.insert(ids.end(), text.begin(), text.end());
    if (tok->eos_to_add())  // transformers' tokenizer(prompt) would end the prompt with it
      std::fprintf(stderr, "note: this tokenizer puts token %d after a text; a prompt to continue does not get it\n",
                   static_cast<int>(*tok->eos_to_add()));
    TWELL_REQUIRE(!ids.empty(), "the prompt is empty and this tokenizer puts no BOS token in front of a text: "
                  "there is nothing to continue from");
    const int64_t n_prompt = static_cast<int64_t>(ids.size());
    TWELL_REQUIRE(n_prompt <= config.max_position_embeddings, "the prompt is ", n_prompt,
                  " tokens, longer than the model's context of ", config.max_position_embeddings);
    // The GPU's buffers for this job, not the config's whole context (load_model caps it there).
    args->gpu_context = n_prompt + std::min(*max_tokens, config.max_position_embeddings);
    const std::unique_ptr<model::LanguageModel> model = args->load_model();
    // What is printed of the continuation: decode(prompt + new tokens) past decode(prompt), so a
    // tokenizer whose decoder depends on context (Llama 2's strips one leading space) streams
    // the same text as a single decode of everything (TextStream: a window of recent ids a token).
    model::TextStream shown(*tok, text);
    // End of sequence: the tokenizer's EOS and config.json's / generation_config.json's ids
    // (Llama 3 Instruct ends a turn with any of three).
    std::vector<int32_t> stops;
    if (!*no_stop) {
      stops = config.eos_token_ids;
      if (tok->eos_id()) stops.push_back(*tok->eos_id());
    }
    // A model whose embedding is padded past the tokenizer must not draw ids it cannot print.
    sampling->vocab_limit = tok->vocab_size();

    std::cout << *prompt << std::flush;
    const std::function<void(int32_t)> stream = [&](int32_t token) {
      if (std::find(stops.begin(), stops.end(), token) != stops.end()) return;  // not part of the text
      const std::string piece = shown.put(token);  // bytes: a character may end in a later piece
      if (!piece.empty()) std::cout << piece << std::flush;
    };
    model::Generation g;
    try {  // an error ends the streamed line first, so that it is not glued to the text
      g = model::generate(*model, ids, *max_tokens, *sampling, stops, stream);
    } catch (...) {
      std::cout << std::endl;
      throw;
    }
    std::cout << std::endl;  // flushed before the summary on stderr, which may share a terminal or a pipe
    if (g.reason == model::StopReason::stop_token) {
      // Its name where the tokenizer has a short printable one ("</s>", "<|eot_id|>"), else the id alone.
      std::string name = tok->id_to_token(g.tokens.back());
      const bool plain = !name.empty() && name.size() <= 40 &&
                         std::all_of(name.begin(), name.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
      name = plain ? " " + name : "";
      std::fprintf(stderr, "(stopped: end-of-sequence token %d%s; --no-stop generates past it)\n", g.tokens.back(),
                   name.c_str());
    }
    if (g.reason == model::StopReason::context_full)
      std::fprintf(stderr, "(stopped: the context of %lld positions is full)\n",
                   static_cast<long long>(model->cached_tokens()));
    // The prompt's time includes the first new token's draw; the rate is that of the steps after it.
    const long long generated = static_cast<long long>(g.tokens.size());
    char rate[96] = "";
    if (generated >= 2)
      std::snprintf(rate, sizeof rate, ", the last %lld in %.3f s (%.1f tokens/s)", generated - 1, g.decode_seconds,
                    g.decode_seconds > 0 ? (generated - 1) / g.decode_seconds : 0.0);
    std::fprintf(stderr, "prompt %zu token%s in %.3f s%s; generated %lld token%s%s\n", ids.size(), ids.size() == 1 ? "" : "s",
                 g.prefill_seconds, generated > 0 ? " with the first new token" : "", generated, generated == 1 ? "" : "s",
                 rate);
  });
}

}  // namespace twell::cli
