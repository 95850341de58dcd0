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
  // object of names and strings, e.g. {"bos_token": "<s>", "eos_token": "</s>"}. load_chat_template sets
  // them from tokenizer_config.json.
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

// The chat template a model directory ships, where transformers looks: chat_template.jinja, else
// tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"} of which the one
// named "default"), else chat_template.json's; with tokenizer_config.json's special tokens (bos_token,
// eos_token, unk_token, pad_token, sep_token, cls_token, mask_token). nullopt where the model has none.
// `template_file` (a Jinja file) given: its template instead of the model's, with the model's special
// tokens (model_dir may then be empty: none). Throws twell::Error for a file that cannot be read or
// parsed, naming it.
std::optional<ChatTemplate> load_chat_template(const std::string& model_dir, const std::string& template_file = "");

// The special tokens load_chat_template gives a template: tokenizer_config.json's bos_token, eos_token,
// unk_token, sep_token, pad_token, cls_token and mask_token (a string or {"content": ...}), then
// special_tokens_map.json's for those it lacks; a JSON object ("{}" where there are none).
std::string chat_special_tokens(const std::string& model_dir);

}  // namespace twell::model
