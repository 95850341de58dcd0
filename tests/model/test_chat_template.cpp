// Chat templates: model::ChatTemplate renders what transformers' apply_chat_template(tokenize=False)
// renders (jinja2's texts in tests/model/data/chat_templates.json, made by
// make_chat_template_fixtures.py there: templates after common chat models' and expressions one feature
// at a time), fails where jinja2 fails, refuses what it does not evaluate with an error naming it, and
// load_chat_template finds a model's template where transformers looks.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/io_test_util.h"
#include "twell/model/chat_template.h"

namespace twell::model {
namespace {

using test::expect_error;
using test::read_file;
using test::write_file;

nlohmann::ordered_json fixtures() {
  const std::string path = (std::filesystem::path(__FILE__).parent_path() / "data" / "chat_templates.json").string();
  const std::string text = read_file(path);
  EXPECT_FALSE(text.empty()) << "missing fixture " << path;
  return nlohmann::ordered_json::parse(text);
}

TEST(ChatTemplate, RendersAsJinja2) {
  const nlohmann::ordered_json f = fixtures();
  ASSERT_GT(f["cases"].size(), 300u);
  size_t errors = 0;
  for (const auto& c : f["cases"]) {
    const std::string name = c["name"];
    const std::string source = f["templates"][c["template"].get<std::string>()];
    std::string got, error;
    try {
      ChatTemplate t(source, name);
      t.set_special_tokens(f["special_tokens"].dump());
      got = t.apply(c["messages"].dump(), c["add_generation_prompt"].get<bool>(), c["variables"].dump());
    } catch (const Error& e) {
      error = e.what();
    }
    if (c.contains("error")) {
      ++errors;
      EXPECT_FALSE(error.empty()) << name << ": jinja2 raised (" << c["error"].get<std::string>()
                                  << ") but twell rendered: " << got;
      EXPECT_EQ(error.find('\n'), std::string::npos) << name << ": the message spans lines: " << error;
    } else {
      EXPECT_EQ(error, "") << name;
      EXPECT_EQ(got, c["text"].get<std::string>()) << name;
    }
  }
  EXPECT_GT(errors, 20u);  // the cases include templates that refuse their input
}

// Errors name the template, the line and the cause: at parse time for what twell does not have.
TEST(ChatTemplate, ErrorsNameTheTemplateAndLine) {
  expect_error([] { ChatTemplate("a\n{{ x | nosuchfilter }}", "t.jinja"); }, {"t.jinja:2:", "nosuchfilter"});
  expect_error([] { ChatTemplate("{% if x %}a", "t"); }, {"t:1:", "endif"});
  expect_error([] { ChatTemplate("{{ x", "t"); }, {"not closed"});
  expect_error([] { ChatTemplate("{% include 'other' %}", "t"); }, {"include", "not supported"});
  expect_error([] { ChatTemplate("{{ x is nosuchtest }}", "t"); }, {"nosuchtest"});
  expect_error([] { ChatTemplate("{% break %}", "t"); }, {"outside a for loop"});
  expect_error([] { ChatTemplate("{% for x in y %}{% endif %}", "t"); }, {"unexpected '{% endif %}', expected"});
  expect_error([] { ChatTemplate("{{ " + std::string(300, '-') + "1 }}", "t"); }, {"nested more than 200 levels"});
  expect_error([] { ChatTemplate("{{ 2 ** 64 }}", "t").apply("[]", false); }, {"integer overflow"});
  const ChatTemplate refuse("x\n{{ raise_exception('roles must alternate') }}", "t");
  expect_error([&] { refuse.apply("[]", false); }, {"t: the template refused the input: roles must alternate"});
  const ChatTemplate method("\n\n{{ messages[0].content.zfill(3) }}", "m");
  expect_error([&] { method.apply(R"([{"role": "user", "content": "x"}])", false); }, {"m:3:", "zfill"});
  const ChatTemplate plain("{{ messages[0].content }}");
  expect_error([&] { plain.apply("{}", false); }, {"must be a JSON array"});
  expect_error([&] { plain.apply("[1]", false); }, {"JSON object"});
  expect_error([&] { plain.apply("[", false); }, {"not valid JSON"});
  expect_error([&] { plain.apply("[]", false, "[]"); }, {"JSON object"});
  expect_error([&] { ChatTemplate("x").set_special_tokens(R"({"bos_token": 1})"); }, {"bos_token", "string"});
}

// The variables a template sees: messages, add_generation_prompt, tools and documents (None unless
// given), the special tokens, and the caller's, which override them.
TEST(ChatTemplate, Variables) {
  ChatTemplate t("{{ bos_token }}|{{ tools }}|{{ documents is none }}|{{ add_generation_prompt }}|{{ flag }}|"
                 "{{ messages|length }}");
  t.set_special_tokens(R"({"bos_token": "<s>"})");
  EXPECT_EQ(t.apply("[{}]", true), "<s>|None|True|True||1");
  EXPECT_EQ(t.apply("[]", false, R"({"bos_token": "B", "flag": 7, "tools": [1]})"), "B|[1]|True|False|7|0");
  EXPECT_EQ(t.apply({{"user", "a"}, {"assistant", "b"}}, false), "<s>|None|True|False||2");
}

class ChatTemplateFiles : public test::ScratchDirTest {};

TEST_F(ChatTemplateFiles, FoundWhereTransformersLooks) {
  EXPECT_FALSE(load_chat_template(dir_));  // no files: none
  write_file(path("tokenizer_config.json"), R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
    "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"})");
  const std::optional<ChatTemplate> config = load_chat_template(dir_);
  ASSERT_TRUE(config);
  EXPECT_EQ(config->apply({{"user", "hi"}}, true), "<s>[user]hi</s>");
  EXPECT_NE(config->source().find("tokenizer_config.json"), std::string::npos);
  // A list of named templates: "default", or "tool_use" where tools are offered, or one by name.
  write_file(path("tokenizer_config.json"), R"({"eos_token": "</s>", "chat_template": [
    {"name": "tool_use", "template": "T{{ eos_token }}"}, {"name": "default", "template": "D{{ eos_token }}"}]})");
  EXPECT_EQ(load_chat_template(dir_)->apply("[]", false), "D</s>");
  ChatTemplateChoice tools;
  tools.tools = true;
  EXPECT_EQ(load_chat_template(dir_, tools)->apply("[]", false), "T</s>");
  ChatTemplateChoice named;
  named.name = "tool_use";
  EXPECT_EQ(load_chat_template(dir_, named)->apply("[]", false), "T</s>");
  named.name = "other";
  EXPECT_FALSE(load_chat_template(dir_, named));
  // chat_template.jinja first, and additional_chat_templates/NAME.jinja beside it.
  write_file(path("chat_template.jinja"), "J{{ eos_token }}{{ unk_token }}\n");
  std::filesystem::create_directories(path("additional_chat_templates"));
  write_file(path("additional_chat_templates/tool_use.jinja"), "A");
  EXPECT_EQ(load_chat_template(dir_)->apply("[]", false), "J</s>");  // one trailing newline dropped, as jinja2
  EXPECT_EQ(load_chat_template(dir_, tools)->apply("[]", false), "A");
  // The special tokens: special_tokens_map.json's over tokenizer_config.json's, unless the config lists its
  // added tokens; the model's own named tokens too; null ones left out.
  write_file(path("special_tokens_map.json"), R"({"eos_token": "<other>", "unk_token": "<unk>"})");
  EXPECT_EQ(load_chat_template(dir_)->apply("[]", false), "J<other><unk>");
  write_file(path("tokenizer_config.json"), R"({"eos_token": "</s>", "added_tokens_decoder": {}, "bos_token": null,
    "image_token": "<img>", "extra_special_tokens": {"audio_token": "<aud>"}, "add_bos_token": true})");
  EXPECT_EQ(chat_special_tokens(dir_), R"({"eos_token":"</s>","audio_token":"<aud>","image_token":"<img>"})");
  // A file given instead.
  write_file(path("other.jinja"), "O{{ eos_token }}");
  ChatTemplateChoice file;
  file.file = path("other.jinja");
  EXPECT_EQ(load_chat_template(dir_, file)->apply("[]", false), "O</s>");
  EXPECT_EQ(load_chat_template("", file)->apply("[]", false), "O");
  // chat_template.json is a processor's, not the tokenizer's: transformers' tokenizer leaves it.
  std::filesystem::remove(path("chat_template.jinja"));
  std::filesystem::remove_all(path("additional_chat_templates"));
  write_file(path("chat_template.json"), R"({"chat_template": "C{{ eos_token }}"})");
  EXPECT_FALSE(load_chat_template(dir_));
}

TEST_F(ChatTemplateFiles, BadFilesAreNamed) {
  write_file(path("tokenizer_config.json"), R"({"chat_template": "{% for m in messages %}"})");
  expect_error([&] { load_chat_template(dir_); }, {"tokenizer_config.json", "endfor"});
  write_file(path("tokenizer_config.json"), R"({"chat_template": 3})");
  expect_error([&] { load_chat_template(dir_); }, {"tokenizer_config.json", "chat_template must be"});
  write_file(path("tokenizer_config.json"), R"({"chat_template": [{"name": "x", "template": "y"}]})");
  expect_error([&] { load_chat_template(dir_); }, {"\"default\"", "(x)"});
  write_file(path("tokenizer_config.json"), R"({"chat_template": [{"name": "x"}]})");
  expect_error([&] { load_chat_template(dir_); }, {"list entries"});
  expect_error([&] { load_chat_template(path("nowhere")); }, {"nowhere", "not a directory"});
  write_file(path("tokenizer_config.json"), R"({"chat_template": )");
  expect_error([&] { load_chat_template(dir_); }, {"tokenizer_config.json", "not valid JSON"});
  write_file(path("tokenizer_config.json"), "{}");
  ChatTemplateChoice missing;
  missing.file = path("missing.jinja");
  expect_error([&] { load_chat_template(dir_, missing); }, {"missing.jinja"});
}

}  // namespace
}  // namespace twell::model
