// `twell run MODEL --prompt TEXT`: generation on the GPU or the CPU backend, streamed token by token;
// with several --prompt, a batch generated together (model::generate_batch).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <unistd.h>

#include "commands.h"
#include "twell/model/chat_template.h"
#include "model_loading.h"
#include "progress.h"

namespace twell::cli {
namespace {

int hex_digit(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

// A --stop value with \n, \t, \r, \", \\ and \xNN (two hex digits: a byte) read as escapes (a newline
// is awkward to type in a shell); a backslash before anything else stays as it is.
std::string unescape_stop(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = i + 1 < s.size() && s[i] == '\\' ? s[i + 1] : '\0';
    if (c == 'x' && i + 3 < s.size() && hex_digit(s[i + 2]) >= 0 && hex_digit(s[i + 3]) >= 0) {
      out += static_cast<char>(hex_digit(s[i + 2]) * 16 + hex_digit(s[i + 3]));
      i += 3;
    } else if (c != '\0' && std::strchr("ntr\"\\", c) != nullptr) {
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A stop string as --stop takes it (unescape_stop's inverse): \n, \t, \r, \", \\ and \xNN for the other
// control bytes, so that the note stays on one line and can be pasted back.
std::string escape_stop(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// A piece of generated text on stdout; output that cannot be written (a full disk, a closed pipe) ends the
// generation there, with the cause.
void print_text(const std::string& text) {
  std::cout << text;
  if (const std::string why = stdout_failure(); !why.empty()) throw Error(why);
}

// One generation's summary on stderr: its prompt's time, which includes the first new token's draw, and
// the rate of the steps after it, and how much of the prompt the KV cache held (PromptCache).
void say_timing(const model::Generation& g, size_t prompt_tokens) {
  const long long generated = static_cast<long long>(g.tokens.size());
  char rate[96] = "", cached[64] = "";
  if (generated >= 2)
    std::snprintf(rate, sizeof rate, ", the last %lld in %.3f s (%.1f tokens/s)", generated - 1, g.decode_seconds,
                  g.decode_seconds > 0 ? (generated - 1) / g.decode_seconds : 0.0);
  if (g.reused > 0) std::snprintf(cached, sizeof cached, " (%lld of them cached)", static_cast<long long>(g.reused));
  std::fprintf(stderr, "prompt %zu token%s%s in %.3f s%s; generated %lld token%s%s\n", prompt_tokens,
               prompt_tokens == 1 ? "" : "s", cached, g.prefill_seconds,
               generated > 0 ? " with the first new token" : "", generated, generated == 1 ? "" : "s", rate);
}

// The text of a generation's new tokens after `prompt` as they come, cut at a stop string (TextStream).
model::TextStream text_stream(const model::Tokenizer& tok, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& stops, const std::vector<std::string>& stop_strings,
                              bool skip_special) {
  model::TextStream shown(tok, prompt, stops);
  shown.stop_at(stop_strings);
  if (skip_special) shown.skip_special_tokens();
  return shown;
}

// The GPU's context for a conversation on stdin (its length is not known up front): the model's, up to this.
constexpr int64_t kConversationContext = 8192;

// `twell run --chat` without prompts: a conversation on stdin, a user's message a line, each reply
// streamed as it comes, its timing on stderr; every turn renders the whole history through the template
// (the replies as their text), as a chat UI over transformers does, and prefills what the KV cache does not
// hold of it. It ends at the end of the input, or where the history no longer leaves room in the context.
void converse(model::LanguageModel& model, const model::Tokenizer& tok, const model::ChatTemplate& chat,
              const std::string& system, int64_t max_tokens, const model::SamplingOptions& sampling,
              const std::vector<int32_t>& stops, const std::vector<std::string>& stop_strings, bool skip_special) {
  std::vector<model::ChatMessage> history;
  if (!system.empty()) history.push_back({"system", system});
  model::PromptCache cache;  // what the KV cache holds of the conversation after each turn
  const bool tty = isatty(STDIN_FILENO) != 0;
  if (tty) std::fprintf(stderr, "a conversation: type a message, then Enter; Ctrl-D ends it\n");
  for (std::string line;;) {
    if (tty) {
      std::fprintf(stderr, "> ");
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // typed on Windows
    if (line.empty()) continue;
    note_if_not_utf8("the message", line);
    history.push_back({"user", line});
    const std::vector<int32_t> ids = tok.encode(chat.apply(history, /*add_generation_prompt=*/true));
    TWELL_REQUIRE(!ids.empty(), "the chat template made an empty text of the conversation: nothing to continue from");
    TWELL_REQUIRE(static_cast<int64_t>(ids.size()) < model.context(), "the conversation is now ", ids.size(),
                  " tokens, which leaves no room for a reply in the context of ", model.context(),
                  " positions: the conversation ends here (start a new one)");
    model::TextStream shown = text_stream(tok, ids, stops, stop_strings, skip_special);
    std::string reply;
    const auto stream = [&](int64_t, int32_t token) {
      const std::string piece = shown.put(token);
      reply += piece;
      if (!piece.empty()) print_text(piece);
      return shown.stopped();
    };
    const model::Generation g = model::generate_batch(model, {ids}, max_tokens, sampling, stops, stream, &cache)[0];
    const std::string tail = shown.finish();
    reply += tail;
    print_text(tail + "\n");
    std::cout.flush();
    if (g.reason == model::StopReason::context_full)
      std::fprintf(stderr, "(stopped: the context of %lld positions is full)\n", static_cast<long long>(model.context()));
    say_timing(g, ids.size());
    history.push_back({"assistant", reply});
  }
}

}  // namespace

void register_run(CLI::App& app) {
  CLI::App* run = app.add_subcommand("run", "Generate text from a Llama-style model (GPU, or the CPU backend)");
  auto args = std::make_shared<ModelArgs>();
  auto prompts = std::make_shared<std::vector<std::string>>();
  auto max_tokens = std::make_shared<int64_t>(64);
  auto sampling = std::make_shared<model::SamplingOptions>();
  auto no_stop = std::make_shared<bool>(false);
  auto stop_texts = std::make_shared<std::vector<std::string>>();
  args->add_to(run);
  auto prompts_file = std::make_shared<std::string>();
  run->add_option("-p,--prompt", *prompts,
                  "the text to continue; given more than once, a batch: the prompts are generated together "
                  "(each with seed + its index) and printed when all are done (meanwhile a count of the tokens drawn on "
                  "stderr)")
      ->allow_extra_args(false);
  CLI::Option* file_option =
      run->add_option("--prompts", *prompts_file, "a file of prompts, one a line (empty lines skipped): a batch, after any -p")
          ->check(existing_file());
  run->parse_complete_callback([run, file_option] {  // refused as a missing option, before anything runs
    if (run->count("--prompt") == 0 && file_option->count() == 0 && run->count("--chat") == 0)
      throw CLI::RequiredError("--prompt (or --prompts FILE, or --chat for a conversation on stdin)");
  });
  run->add_option("-n,--max-tokens", *max_tokens, "tokens to generate at most")
      ->check(at_least(0))
      ->capture_default_str();
  // Their defaults are the model's generation_config.json's (--generation-config), else twell's.
  CLI::Option* temperature = run->add_option("--temperature", sampling->temperature,
                                             "0 = greedy (default: where the model's generation_config.json sets do_sample, its "
                                             "temperature, or 1; else 0)")
                                  ->check(real_in(0, false, HUGE_VAL, "finite and at least 0"));
  CLI::Option* top_k = run->add_option("--top-k", sampling->top_k,
                                       "sample from the k most likely tokens (0 = all; default: the model's "
                                       "generation_config.json's top_k, or 50 where it sets do_sample; else 0)")
                           ->check(at_least(0));
  CLI::Option* top_p = run->add_option("--top-p", sampling->top_p,
                                       "nucleus sampling threshold (1 = all; default: the model's "
                                       "generation_config.json's, else 1)")
                           ->check(real_in(0, true, 1, "in (0, 1]"));
  CLI::Option* min_p = run->add_option("--min-p", sampling->min_p,
                                       "keep only tokens at least this many times as likely as the most likely one "
                                       "(after --top-k and --top-p, as transformers applies it; 0 = all; default: "
                                       "the model's generation_config.json's, else 0)")
                           ->check(real_in(0, false, 1, "in [0, 1]"));
  CLI::Option* seed = run->add_option("--seed", sampling->seed, "sampling seed (a run repeats its tokens unless it changes)")
                          ->check(seed_value())
                          ->capture_default_str();
  CLI::Option* penalty = run->add_option("--repetition-penalty", sampling->repetition_penalty,
                                         "divide the logit of every token the text holds so far by this where "
                                         "positive, multiply where negative (transformers' repetition_penalty, "
                                         "greedy runs included; 1 = off; default: the model's "
                                         "generation_config.json's, else 1)")
                             ->check(real_in(0, true, HUGE_VAL, "finite and above 0"));
  // Options that shape sampling only, so that a greedy run can say it ignored them.
  const std::vector<CLI::Option*> sampling_only = {top_k, top_p, min_p, seed};
  auto generation_config = std::make_shared<std::string>("auto");
  run->add_option("--generation-config", *generation_config,
                  "auto: the model's generation_config.json sets the sampling options not given here (do_sample, "
                  "temperature, top_k, top_p, min_p, repetition_penalty), as transformers' generate() takes them; "
                  "ignore: twell's defaults (greedy)")
      ->check(CLI::IsMember({"auto", "ignore"}))
      ->capture_default_str();
  run->add_flag("--no-stop", *no_stop, "keep generating past the end-of-sequence token");
  auto skip_special = std::make_shared<bool>(false);
  run->add_flag("--skip-special-tokens", *skip_special,
                "leave special tokens (BOS, EOS, a chat model's headers) out of the text, as transformers' "
                "decode(skip_special_tokens=True) does");
  run->add_option("--stop", *stop_texts,
                  "end the text just before this string and the generation at the token that completes it (given "
                  "more than once: at any of them); \\n, \\t, \\r, \\\", \\\\ and \\xNN are read as escapes; "
                  "the prompt is not searched")
      ->allow_extra_args(false);
  auto chat = std::make_shared<bool>(false);
  auto system = std::make_shared<std::string>();
  auto chat_template_file = std::make_shared<std::string>();
  CLI::Option* chat_flag = run->add_flag(
      "--chat", *chat,
      "each prompt is a user's message: the model's chat template (chat_template.jinja, else tokenizer_config.json's "
      "chat_template) makes the text the model continues, as transformers' apply_chat_template(..., "
      "add_generation_prompt=True) does, and only the reply is printed; without --prompt, a conversation: a "
      "message a line on stdin, each reply printed as it comes, the history kept");
  run->add_option("--system", *system, "with --chat: a system message before each prompt")->needs(chat_flag);
  run->add_option("--chat-template", *chat_template_file,
                  "with --chat: this Jinja file's template instead of the model's")
      ->check(CLI::ExistingFile)
      ->needs(chat_flag);
  args->gpu_only_options.push_back(run->add_option("--max-batch-tokens", args->gpu_max_tokens,
                  "GPU: the most tokens one forward computes (its activations' size); longer prompts run in chunks "
                  "(0: up to 16384, fewer where the GPU's memory needs it)")
      ->check(at_least(0))
      ->capture_default_str());

  run->callback([=] {
    if (!prompts_file->empty()) {
      refuse_device(*prompts_file);
      std::ifstream in(*prompts_file, std::ios::binary);
      TWELL_REQUIRE(in, *prompts_file, ": cannot read: ", std::strerror(errno));
      bool first = true;
      for (std::string line; std::getline(in, line); first = false) {
        if (first) refuse_utf16_or_32(*prompts_file, line);
        if (first && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 byte-order mark
        if (!line.empty() && line.back() == '\r') line.pop_back();  // a file written on Windows
        if (!line.empty()) prompts->push_back(line);
      }
      TWELL_REQUIRE(!in.bad(), *prompts_file, ": read failed: ", std::strerror(errno));
      TWELL_REQUIRE(!prompts->empty(), *prompts_file, ": no prompts (every line is empty)");
    }
    sampling->check();  // before the load, which can take a while
    std::vector<std::string> stop_strings;
    for (const std::string& s : *stop_texts) stop_strings.push_back(unescape_stop(s));
    model::TextStream::check_stop_strings(stop_strings);
    const io::ModelConfig config = io::read_config(args->dir);
    // Each option not given takes the model's value (--generation-config auto), said in a note where it
    // changes twell's default.
    const std::vector<std::pair<const CLI::Option*, model::SamplingField>> fields = {
        {temperature, model::kSampleTemperature}, {top_k, model::kSampleTopK}, {top_p, model::kSampleTopP},
        {min_p, model::kSampleMinP}, {penalty, model::kSampleRepetitionPenalty}};
    unsigned given = 0;
    for (const auto& [o, f] : fields) given |= o->count() > 0 ? f : 0u;
    // A file that cannot be read stops the run below unless nothing is taken from it: ignored, or every
    // sampling option given.
    if ((*generation_config != "auto" || given == model::kSampleAllFields) && !config.generation.unreadable.empty())
      std::fprintf(stderr, "note: %s; the file is left out, its eos_token_id too\n",
                   config.generation.unreadable.c_str());
    if (*generation_config == "auto") {
      if (given != model::kSampleAllFields && !config.generation.unapplied.empty())
        std::fprintf(stderr, "note: %s sets %s, which twell does not apply (it draws one sequence a prompt, by "
                             "temperature, top-k, top-p, min-p and the repetition penalty)\n",
                     config.generation.source.c_str(), config.generation.unapplied.c_str());
      const model::SamplingOptions before = *sampling;
      try {
        *sampling = model::with_generation_config(before, given, config.generation);
      } catch (const Error& e) {
        throw Error(str(e.what(), " (give the option, or --generation-config ignore)"));
      }
      std::string taken;
      const auto said = [&](const CLI::Option* o, auto was, auto now) {
        if (was != now) taken += str(taken.empty() ? "" : ", ", o->get_name(), " ", now);
      };
      said(temperature, before.temperature, sampling->temperature);
      said(top_k, before.top_k, sampling->top_k);
      said(top_p, before.top_p, sampling->top_p);
      said(min_p, before.min_p, sampling->min_p);
      said(penalty, before.repetition_penalty, sampling->repetition_penalty);
      if (!taken.empty())
        std::fprintf(stderr, "note: %s from %s (an option given here overrides its value; --generation-config "
                             "ignore: twell's defaults, greedy)\n",
                     taken.c_str(), config.generation.source.c_str());
    }
    if (sampling->temperature == 0) {
      std::string ignored;
      for (const CLI::Option* o : sampling_only)
        if (o->count() > 0) ignored += (ignored.empty() ? "" : ", ") + o->get_name();
      if (!ignored.empty())
        std::fprintf(stderr, "note: %s only shape%s sampling; at temperature 0 the run is greedy (argmax)\n",
                     ignored.c_str(), ignored.find(',') == std::string::npos ? "s" : "");
    }
    const auto tok = args->load_tokenizer(config);
    // With --chat, each prompt is a conversation of one user message (after the system's), which the
    // chat template writes out with its own special tokens: encoded as it stands, no BOS added
    // (transformers' apply_chat_template(tokenize=True)).
    std::optional<model::ChatTemplate> chat_template;
    if (*chat) {
      model::ChatTemplateChoice choice;
      choice.file = *chat_template_file;
      chat_template = model::load_chat_template(args->dir, choice);
      TWELL_REQUIRE(chat_template, args->dir, " has no chat template (no chat_template.jinja, no chat_template in "
                    "tokenizer_config.json): give one with --chat-template FILE, or leave out --chat to continue the "
                    "text as it stands");
      std::fprintf(stderr, "chat template: %s\n", chat_template->source().c_str());
    }
    // Each prompt's ids as HF's tokenizer(prompt) gives them (its BOS first), without the EOS some
    // tokenizers append: a prompt to continue does not end.
    const size_t B = prompts->size();
    std::vector<std::vector<int32_t>> texts, ids;
    int64_t longest = 0;
    for (size_t b = 0; b < B; ++b) {
      const std::string what = B == 1 ? "the prompt" : str("prompt ", b + 1);
      note_if_not_utf8(what, (*prompts)[b]);
      std::vector<int32_t> one;
      if (chat_template) {
        std::vector<model::ChatMessage> messages;
        if (!system->empty()) messages.push_back({"system", *system});
        messages.push_back({"user", (*prompts)[b]});
        texts.push_back(tok->encode(chat_template->apply(messages, /*add_generation_prompt=*/true)));
      } else {
        texts.push_back(tok->encode((*prompts)[b]));
        if (tok->bos_to_add()) one.push_back(*tok->bos_to_add());
      }
      one.insert(one.end(), texts.back().begin(), texts.back().end());
      TWELL_REQUIRE(!one.empty(), what, " is empty and this tokenizer puts no BOS token in front of a text: "
                    "there is nothing to continue from");
      TWELL_REQUIRE(static_cast<int64_t>(one.size()) <= config.max_position_embeddings, what, " is ", one.size(),
                    " tokens, longer than the model's context of ", config.max_position_embeddings);
      longest = std::max<int64_t>(longest, static_cast<int64_t>(one.size()));
      ids.push_back(std::move(one));
    }
    if (tok->eos_to_add() && !chat_template)  // transformers' tokenizer(prompt) would end the prompt with it
      std::fprintf(stderr, "note: this tokenizer puts token %d after a text; a prompt to continue does not get it\n",
                   static_cast<int>(*tok->eos_to_add()));
    // The GPU's buffers for this job, not the config's whole context (load_model caps it there).
    const bool conversation = B == 0;  // --chat without prompts
    args->gpu_context = conversation ? std::min(config.max_position_embeddings, kConversationContext)
                                     : longest + std::min(*max_tokens, config.max_position_embeddings);
    args->gpu_max_batch = std::max<int64_t>(1, static_cast<int64_t>(B));
    const std::unique_ptr<model::LanguageModel> model = args->load_model();
    const std::vector<int32_t> stops = *no_stop ? std::vector<int32_t>{} : model::default_stop_ids(config, *tok);
    // A model whose embedding is padded past the tokenizer must not draw ids it cannot print.
    sampling->vocab_limit = tok->vocab_size();
    for (const int32_t id : stops)  // one it never draws: said, as the run would not stop on it
      if (id < 0 || id >= sampling->vocab_limit)
        std::fprintf(stderr, "note: stop id %d (an eos_token_id of config.json or generation_config.json) lies "
                             "outside the tokenizer's %lld ids: no generation stops on it\n",
                     static_cast<int>(id), static_cast<long long>(sampling->vocab_limit));
    if (conversation) {
      converse(*model, *tok, *chat_template, *system, *max_tokens, *sampling, stops, stop_strings, *skip_special);
      return;
    }
    // Why a generation stopped, where it was not its token count: `label` names the sequence.
    const auto say_stop = [&](const model::Generation& g, const std::string& label) {
      if (g.reason == model::StopReason::stop_token) {
        // Its name where the tokenizer has a short printable one ("</s>", "<|eot_id|>"), else the id alone.
        std::string name;
        try {
          name = tok->id_to_token(g.tokens.back());
        } catch (const Error&) {  // a stop id with no token (a gap in the tokenizer's ids): the id alone
        }
        const bool plain = !name.empty() && name.size() <= 40 &&
                           std::all_of(name.begin(), name.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
        name = plain ? " " + name : "";
        std::fprintf(stderr, "(%sstopped: end-of-sequence token %d%s; --no-stop generates past it)\n", label.c_str(),
                     g.tokens.back(), name.c_str());
      }
      if (g.reason == model::StopReason::context_full)
        std::fprintf(stderr, "(%sstopped: the context of %lld positions is full)\n", label.c_str(),
                     static_cast<long long>(model->context()));
    };
    std::vector<model::TextStream> shown;  // each sequence's text
    for (size_t b = 0; b < B; ++b) shown.push_back(text_stream(*tok, texts[b], stops, stop_strings, *skip_special));
    const auto say_stop_string = [&](size_t b, const std::string& label) {
      if (shown[b].stopped())
        std::fprintf(stderr, "(%sstopped: --stop \"%s\")\n", label.c_str(), escape_stop(shown[b].stopped_by()).c_str());
    };

    if (B > 1) {  // generated together, printed when all are done; meanwhile a count of tokens drawn
      int64_t most = 0;  // each prompt's -n, or what its context leaves (a last token drawn without a position)
      for (const std::vector<int32_t>& p : ids)
        most += std::min<int64_t>(*max_tokens, model->context() - static_cast<int64_t>(p.size()) + 1);
      bench::StepProgress progress(std::cerr, "", std::max<int64_t>(1, most));
      int64_t drawn = 0;
      std::vector<std::string> text = chat_template ? std::vector<std::string>(B) : *prompts;  // --chat: the replies
      const auto count = [&](int64_t b, int32_t token) {
        ++drawn;
        progress.show(drawn, str("generating: ", drawn, " of at most ", most, " tokens (", B, " prompts)"));
        text[static_cast<size_t>(b)] += shown[static_cast<size_t>(b)].put(token);
        return shown[static_cast<size_t>(b)].stopped();
      };
      const std::vector<model::Generation> gens =
          model::generate_batch(*model, ids, *max_tokens, *sampling, stops, count);
      if (drawn > 0) progress.finish();
      long long after_first = 0, generated = 0;
      double decode = 0;
      for (size_t b = 0; b < B; ++b) {
        std::cout << "[" << b + 1 << "] " << text[b] << shown[b].finish() << "\n";
        generated += static_cast<long long>(gens[b].tokens.size());
        after_first += std::max<long long>(0, static_cast<long long>(gens[b].tokens.size()) - 1);
        decode = std::max(decode, gens[b].decode_seconds);
      }
      std::cout << std::flush;
      for (size_t b = 0; b < B; ++b) {
        say_stop(gens[b], str("[", b + 1, "] "));
        say_stop_string(b, str("[", b + 1, "] "));
      }
      char rate[128] = "";
      if (after_first > 0)
        std::snprintf(rate, sizeof rate, ", the last %lld in %.3f s (%.1f tokens/s over the batch)", after_first,
                      decode, decode > 0 ? after_first / decode : 0.0);
      std::fprintf(stderr, "%zu prompts (the longest %lld token%s) in %.3f s%s; generated %lld tokens%s\n", B,
                   static_cast<long long>(longest), longest == 1 ? "" : "s", gens[0].prefill_seconds,
                   generated > 0 ? " with the first new tokens" : "", generated, rate);
      return;
    }

    // What is printed of the continuation: decode(prompt + new tokens) past decode(prompt), so a
    // tokenizer whose decoder depends on context (Llama 2's strips one leading space) streams
    // the same text as a single decode of everything (TextStream: a window of recent ids a token;
    // a stop token is not part of the text, nor a stop string or what follows it).
    // Each piece as it comes (print_text).
    if (!chat_template) print_text((*prompts)[0]);  // --chat prints the reply alone
    const auto stream = [&](int64_t, int32_t token) {  // true: a stop string ends the generation here
      const std::string piece = shown[0].put(token);
      if (!piece.empty()) print_text(piece);
      return shown[0].stopped();
    };
    model::Generation g;
    try {  // an error ends the streamed line first, so that it is not glued to the text
      g = model::generate_batch(*model, ids, *max_tokens, *sampling, stops, stream)[0];  // generate() with a stop
    } catch (...) {
      std::cout << shown[0].finish() << std::endl;
      throw;
    }
    // Flushed before the summary on stderr, which may share a terminal or a pipe.
    std::cout << shown[0].finish() << std::endl;
    say_stop(g, "");
    say_stop_string(0, "");
    say_timing(g, ids[0].size());
  });
}

}  // namespace twell::cli
