// Chat templates: the Jinja templates HuggingFace models ship (tokenizer_config.json's "chat_template",
// chat_template.jinja) that turn a conversation into the prompt text the model was tuned on.
//
//   std::optional<twell::model::ChatTemplate> t = twell::model::load_chat_template("models/smol-instruct");
//   std::string prompt = t->apply(R"([{"role": "user", "content": "Hi!"}])", /*add_generation_prompt=*/true);
//   // then tokenizer.encode(prompt, /*add_special=*/false): the template writes BOS itself where it wants one
//
// The text is the one transformers' apply_chat_template(messages, tokenize=False) gives: Jinja with
// trim_blocks and lstrip_blocks, loop controls, HF's tojson (ensure_ascii=False), raise_exception and
// strftime_now, and the tokenizer's special tokens (bos_token, eos_token, ...) as variables.
//
// Twell evaluates the subset of Jinja that chat templates use: text, {{ }}, {# #}, whitespace control,
// if/elif/else, for (with an else, a filter, unpacking, loop.*), set (names, namespace attributes,
// blocks), macro, break/continue, generation; Python-like expressions (literals, lists, dicts,
// slices, arithmetic, comparisons, in, is, ~, conditional expressions), the string, dict and list
// methods templates call, and Jinja's common filters and tests. Anything else is an error naming it,
// when the template is parsed (a statement, filter or test twell does not have) or rendered (a
// method, %-formatting, case conversion beyond ASCII), not a different text. One difference is left:
// tuples are lists, so that printing one (rather than iterating or unpacking it, as templates do)
// gives [a, b] where Python gives (a, b).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace twell::model {

// A message of plain text (the JSON form takes any content a template reads: parts, tool calls).
struct ChatMessage {
  std::string role, content;
};

class ChatTemplate {
 public:
  // Parses `text`; throws twell::Error "<source>:<line>: ..." for a syntax error or a construct twell
  // does not evaluate. `source` names the template in messages.
  explicit ChatTemplate(std::string_view text, std::string source = "chat template");

  // The special tokens given to the template as variables (transformers' special_tokens_map): a JSON
  // object of names and strings, e.g. {"bos_token": "<s>", "eos_token": "</s>"} (null ones left out).
  // load_chat_template sets the model's (chat_special_tokens).
  void set_special_tokens(std::string_view json_object);

  // The prompt text of `messages_json` (a JSON array of {"role": ..., "content": ...} objects; contents
  // may be any JSON the template reads), with the assistant's header after it where
  // add_generation_prompt (and the template writes one). `variables_json`: a JSON object of further
  // variables (tools, documents, a template's own flags), which override the special tokens. Throws
  // twell::Error for bad JSON, an error the template raises (raise_exception), or one in evaluating it.
  std::string apply(std::string_view messages_json, bool add_generation_prompt,
                    std::string_view variables_json = {}) const;

  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  // The whole rendering: `variables_json` (a JSON object) are all the variables the template sees
  // besides the special tokens (messages, add_generation_prompt, ...).
  std::string render(std::string_view variables_json) const;

  const std::string& source() const;
  const std::string& text() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
  std::string special_tokens_json_ = "{}";
};

// Which of a model's chat templates load_chat_template takes.
struct ChatTemplateChoice {
  std::string file;   // a Jinja file's template instead of the model's (with the model's special tokens)
  std::string name;   // the model's template of this name (nullopt where it has none of it)
  bool tools = false;  // the conversation offers tools: the template named "tool_use" where there is one
};

// The chat template a model directory ships, where transformers looks: chat_template.jinja (named
// "default"), else tokenizer_config.json's "chat_template" (a string, the default; or a list of
// {"name", "template"}), and additional_chat_templates/NAME.jinja; the one named "default" unless the
// choice says otherwise. With the directory's special tokens (chat_special_tokens). nullopt where the
// model has none (or none of the name asked); throws twell::Error for a file that cannot be read or
// parsed, naming it, for a directory that is not one, and where several templates have no default.
std::optional<ChatTemplate> load_chat_template(const std::string& model_dir, const ChatTemplateChoice& choice = {});

// A model directory's templates as (name, text), in that order of precedence; `sources` (if given)
// receives where each comes from.
std::vector<std::pair<std::string, std::string>> chat_templates(const std::string& model_dir,
                                                                 std::vector<std::string>* sources = nullptr);

// The special tokens a template sees as variables, as transformers 5 gives them (its special_tokens_map):
// tokenizer_config.json's bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token (a
// string or {"content": ...}; null: left out), its extra_special_tokens dict and other keys ending in
// _token; special_tokens_map.json's over them where tokenizer_config.json has no added_tokens_decoder.
// A JSON object ("{}" where there are none).
std::string chat_special_tokens(const std::string& model_dir);

}  // namespace twell::model
