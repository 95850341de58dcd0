// `twell run` and `twell eval` end to end on a tiny random model (byte tokenizer): generation
// streams text and stops at the token limit, eval prints a perplexity, bad input fails cleanly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "core/io_test_util.h"
#include "model/llama_test_util.h"
#include "twell/model/llama.h"
#include "twell/model/tokenizer.h"

namespace twell::model {
namespace {

struct CliResult {
  int status = -1;
  std::string out;
};

// stdout of the CLI (and stderr too with `with_stderr`).
CliResult run_cli(const std::string& args, bool with_stderr = false) {
  CliResult r;
  FILE* p = popen((std::string(TWELL_CLI_PATH) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  r.status = pclose(p);
  return r;
}

class CliModel : public test::ScratchDirTest {
 protected:
  void SetUp() override {
    test::ScratchDirTest::SetUp();
    io::ModelConfig c = tiny_config("relu", true);
    c.vocab_size = 258;  // bytes + BOS + EOS
    c.max_position_embeddings = 64;
    write_hf(dir_, c, random_hf_tensors(c, 11));
  }
};

TEST_F(CliModel, RunGeneratesAtMostMaxTokens) {
  const CliResult r = run_cli("run " + dir_ + " --byte-tokenizer --no-stop -p 'hello' -n 7 --temperature 0.8 --seed 3");
  ASSERT_EQ(r.status, 0) << r.out;
  ASSERT_EQ(r.out.rfind("hello", 0), 0u) << r.out;  // the prompt, then the continuation
  // At most 7 characters and the newline, as valid UTF-8: bytes drawn that form no character print as
  // U+FFFD (three bytes), as Python's errors="replace" shows them.
  EXPECT_EQ(first_invalid_utf8(r.out), std::string::npos) << r.out;
  EXPECT_LE(std::count_if(r.out.begin() + 5, r.out.end(), [](char c) { return (c & 0xC0) != 0x80; }), 7 + 1) << r.out;
  const CliResult again = run_cli("run " + dir_ + " --byte-tokenizer --no-stop -p 'hello' -n 7 --temperature 0.8 --seed 3");
  EXPECT_EQ(again.out, r.out);  // seeded sampling is reproducible
}

// Several --prompt: one batch, each printed on its "[i] " line as its own run with seed + i - 1
// prints it (the CPU backend: the same bits), in the order given; the model directory may come last.
TEST_F(CliModel, RunGeneratesABatchOfPrompts) {
  const std::string opts = " --byte-tokenizer --no-stop -n 6 --temperature 0.8";
  const CliResult r = run_cli("run -p 'hello' -p 'a much longer prompt' -p 'x' " + dir_ + opts + " --seed 3", true);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<std::string> prompts = {"hello", "a much longer prompt", "x"};
  for (size_t i = 0; i < prompts.size(); ++i) {
    const CliResult alone =
        run_cli("run " + dir_ + " -p '" + prompts[i] + "'" + opts + " --seed " + std::to_string(3 + i));
    ASSERT_EQ(alone.status, 0);
    EXPECT_NE(r.out.find("[" + std::to_string(i + 1) + "] " + alone.out), std::string::npos)
        << "prompt " << i << ": " << alone.out << " in\n" << r.out;
  }
  EXPECT_NE(r.out.find("3 prompts (the longest 21 tokens)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("generated 18 tokens, the last 15 in"), std::string::npos) << r.out;
  // --prompts FILE: one a line, empty lines skipped, after any -p: the same batch (a Windows editor's
  // byte-order mark and line ends are not part of the prompts).
  const std::string file = dir_ + "/prompts.txt";
  std::ofstream(file) << "\xEF\xBB\xBF" "a much longer prompt\n\nx\r\n";
  const CliResult from_file = run_cli("run -p 'hello' --prompts " + file + " " + dir_ + opts + " --seed 3", true);
  ASSERT_EQ(from_file.status, 0) << from_file.out;
  EXPECT_EQ(from_file.out.substr(0, from_file.out.find("\n3 prompts")), r.out.substr(0, r.out.find("\n3 prompts")));
  std::ofstream(file) << "\n\n";
  EXPECT_NE(run_cli("run --prompts " + file + " " + dir_ + " --byte-tokenizer", true).out.find("no prompts"),
            std::string::npos);
}

TEST_F(CliModel, RunStopsAtTheContextLength) {
  const CliResult r = run_cli("run " + dir_ + " --byte-tokenizer --no-stop -p 'abc' -n 500", true);
  EXPECT_EQ(r.status, 0) << r.out;
  // Said on a line of its own, after the text and before the summary.
  EXPECT_NE(r.out.find("\n(stopped: the context of 64 positions is full)\nprompt 4 tokens"), std::string::npos) << r.out;
}

// A greedy run says which sampling options it ignored, and a run that ends at an end-of-sequence
// token says so.
TEST_F(CliModel, RunSaysWhatItIgnoredAndWhyItStopped) {
  const std::string hello = "run " + dir_ + " --byte-tokenizer --no-stop -p 'hello' -n 1";
  const CliResult greedy = run_cli(hello + " --top-p 0.5 --seed 3", true);
  ASSERT_EQ(greedy.status, 0) << greedy.out;
  EXPECT_NE(greedy.out.find("note: --top-p, --seed only shape sampling; at temperature 0 the run is greedy"),
            std::string::npos) << greedy.out;
  const CliResult sampled = run_cli(hello + " --temperature 0.5 --seed 3", true);
  EXPECT_EQ(sampled.out.find("note:"), std::string::npos) << sampled.out;

  // The greedy first token (a byte) made the config's end-of-sequence id: the run stops there.
  const CliResult first = run_cli(hello);
  ASSERT_EQ(first.status, 0);
  ASSERT_EQ(first.out.rfind("hello", 0), 0u) << first.out;
  const std::string continuation = first.out.substr(5, first.out.size() - 6);  // less the newline
  if (continuation.size() != 1) GTEST_SKIP() << "the first token is not a whole character here";
  io::ModelConfig c = io::read_config(dir_);
  const int id = static_cast<unsigned char>(continuation[0]);
  c.eos_token_ids = {id};
  io::write_config(dir_, c);
  const CliResult stopped = run_cli("run " + dir_ + " --byte-tokenizer -p 'hello' -n 5", true);
  ASSERT_EQ(stopped.status, 0) << stopped.out;
  EXPECT_NE(stopped.out.find("(stopped: end-of-sequence token " + std::to_string(id)), std::string::npos)
      << stopped.out;
  EXPECT_NE(stopped.out.find("with the first new token; generated 1 token\n"), std::string::npos) << stopped.out;

  // A stop id no token has is said once, not silently never met.
  c.eos_token_ids = {id, 5000};
  io::write_config(dir_, c);
  const CliResult outside = run_cli("run " + dir_ + " --byte-tokenizer -p 'hello' -n 1", true);
  ASSERT_EQ(outside.status, 0) << outside.out;
  EXPECT_NE(outside.out.find("note: stop id 5000 (an eos_token_id of config.json or generation_config.json) lies "
                             "outside the tokenizer's 258 ids: no generation stops on it"),
            std::string::npos) << outside.out;
}

// --min-p 1 keeps only the most likely token: a sampled run draws the greedy text. Out of [0, 1] it is
// refused before loading, and a greedy run says it ignored it. (And --repetition-penalty's edges.)
TEST_F(CliModel, RunMinPOneIsGreedy) {
  const std::string hello = "run " + dir_ + " --byte-tokenizer --no-stop -p 'hello' -n 10";
  const CliResult greedy = run_cli(hello);
  ASSERT_EQ(greedy.status, 0);
  const CliResult min_p = run_cli(hello + " --temperature 1.5 --seed 4 --min-p 1");
  ASSERT_EQ(min_p.status, 0);
  EXPECT_EQ(min_p.out, greedy.out);
  EXPECT_NE(run_cli(hello + " --temperature 1.5 --seed 4 --min-p 0.01").out, "");
  const CliResult bad = run_cli(hello + " --temperature 1 --min-p 1.5", true);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--min-p: must be in [0, 1]"), std::string::npos) << bad.out;
  const CliResult ignored = run_cli(hello + " --min-p 0.5", true);
  EXPECT_NE(ignored.out.find("note: --min-p only shapes sampling"), std::string::npos) << ignored.out;
  // --repetition-penalty applies to greedy runs too (no note): the text of the library's generate() with
  // it on the same model; 1 is off; 0 is refused before loading.
  EXPECT_EQ(run_cli(hello + " --repetition-penalty 1").out, greedy.out);
  const CliResult penalized = run_cli(hello + " --repetition-penalty 1.5", true);
  EXPECT_EQ(penalized.status, 0);
  EXPECT_EQ(penalized.out.find("note:"), std::string::npos) << penalized.out;
  LlamaCpu cpu(LlamaWeights::load_dir(dir_));
  SamplingOptions so;
  so.repetition_penalty = 1.5;
  so.vocab_limit = 258;
  ByteTokenizer bytes(true, true);
  const std::vector<int32_t> text = bytes.encode("hello");
  std::vector<int32_t> prompt = {*bytes.bos_to_add()};
  prompt.insert(prompt.end(), text.begin(), text.end());
  TextStream stream(bytes, text);
  std::string want = "hello";
  for (const int32_t t : generate(cpu, prompt, 10, so).tokens) want += stream.put(t);
  want += stream.finish();
  EXPECT_NE(penalized.out.find("\n" + want + "\n"), std::string::npos) << penalized.out << "\nwant: " << want;
  const CliResult zero = run_cli(hello + " --repetition-penalty 0", true);
  EXPECT_NE(zero.status, 0);
  EXPECT_NE(zero.out.find("--repetition-penalty: must be finite and above 0"), std::string::npos) << zero.out;
}

// A generation_config.json's sampling keys set the options not given, as transformers' generate() takes
// them (greedy unless do_sample; top_k 50 by default with it), said in a note; an option given wins,
// --generation-config ignore drops them all, and a value out of range is refused naming the file.
TEST_F(CliModel, RunTakesTheGenerationConfigsSampling) {
  const std::string hello = "run " + dir_ + " --byte-tokenizer --no-stop -p 'hello' -n 10";
  const std::string gen = dir_ + "/generation_config.json";
  const CliResult greedy = run_cli(hello);
  const CliResult sampled = run_cli(hello + " --temperature 1.5 --top-k 50 --top-p 0.9 --seed 2");
  const CliResult penalized = run_cli(hello + " --repetition-penalty 1.5");
  ASSERT_EQ(greedy.status, 0);
  ASSERT_NE(sampled.out, greedy.out) << "the test needs a sampled text unlike the greedy one";
  ASSERT_NE(penalized.out, greedy.out) << "the test needs a penalized text unlike the greedy one";

  test::write_file(gen, R"({"do_sample": true, "temperature": 1.5, "top_p": 0.9, "eos_token_id": 257})");
  const CliResult r = run_cli(hello + " --seed 2", true);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("note: --temperature 1.5, --top-k 50, --top-p 0.9 from " + gen), std::string::npos) << r.out;
  EXPECT_EQ(run_cli(hello + " --seed 2").out, sampled.out);
  const CliResult given = run_cli(hello + " --temperature 0", true);  // given: greedy, and no note of the others
  EXPECT_EQ(given.out.find("note:"), std::string::npos) << given.out;
  EXPECT_EQ(run_cli(hello + " --temperature 0").out, greedy.out);
  EXPECT_EQ(run_cli(hello + " --generation-config ignore").out, greedy.out);

  test::write_file(gen, R"({"do_sample": false, "temperature": 0.6, "repetition_penalty": 1.5})");  // greedy, penalized
  EXPECT_EQ(run_cli(hello).out, penalized.out);
  EXPECT_EQ(run_cli(hello + " --repetition-penalty 1").out, greedy.out);

  // A greedy file's top_p shapes a run told to sample, as transformers' generate(do_sample=True) takes it.
  test::write_file(gen, R"({"top_p": 0.9})");
  EXPECT_EQ(run_cli(hello + " --temperature 1.5 --top-k 50 --seed 2").out, sampled.out);

  test::write_file(gen, R"({"do_sample": true, "top_p": 0})");
  const CliResult bad = run_cli(hello, true);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find(gen + ": top_p must be in (0, 1], got 0 (give the option, or --generation-config ignore)"),
            std::string::npos) << bad.out;
  EXPECT_EQ(run_cli(hello + " --generation-config ignore").out, greedy.out);
  EXPECT_EQ(run_cli(hello + " --top-p 0.9 --temperature 1.5 --seed 2").out, sampled.out);  // the bad value given
  EXPECT_EQ(run_cli(hello + " --temperature 0").out, greedy.out);  // greedy: top_p not taken
  test::write_file(gen, R"({"do_sample": "yes"})");  // the model loads (eval, --generation-config ignore)
  const CliResult wrong = run_cli(hello, true);
  EXPECT_NE(wrong.status, 0);
  EXPECT_NE(wrong.out.find("key 'do_sample' must be true or false, got string"), std::string::npos) << wrong.out;
  EXPECT_EQ(run_cli(hello + " --generation-config ignore").out, greedy.out);
  EXPECT_NE(run_cli(hello + " --generation-config none", true).status, 0);
  // A file that cannot be read stops the run unless nothing is taken from it; where every option is
  // given, as with --generation-config ignore, a note says it and its eos_token_id are left out.
  test::write_file(gen, "{not json");
  EXPECT_NE(run_cli(hello, true).status, 0);
  const std::string all = " --temperature 0 --top-k 0 --top-p 1 --min-p 0 --repetition-penalty 1";
  for (const std::string& args : {all, std::string(" --generation-config ignore")}) {
    const CliResult unread = run_cli(hello + args, true);
    EXPECT_EQ(unread.status, 0) << args << "\n" << unread.out;
    EXPECT_NE(unread.out.find("the file is left out, its eos_token_id too"), std::string::npos) << args << "\n"
                                                                                                << unread.out;
  }
  test::write_file(gen, R"({"num_beams": 4, "do_sample": false})");
  const CliResult beams = run_cli(hello, true);
  EXPECT_NE(beams.out.find("note: " + gen + " sets num_beams 4, which twell does not apply"), std::string::npos)
      << beams.out;
}

// --stop: the text ends before the stop string, the run at the token that completes it, and it says
// so; a batch cuts each prompt's text on its own; an empty stop string is refused before loading.
TEST_F(CliModel, RunStopsAtAStopString) {
  const std::string hello = "run " + dir_ + " --byte-tokenizer --no-stop -p 'hello' -n 12";
  const CliResult free = run_cli(hello);
  ASSERT_EQ(free.status, 0);
  const std::string continuation = free.out.substr(5, free.out.size() - 6);  // less the prompt and newline
  // A letter or digit the greedy continuation holds after its first character (a byte token each).
  const auto at = std::find_if(continuation.begin() + 1, continuation.end(),
                               [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; });
  if (at == continuation.end()) GTEST_SKIP() << "no letter in this continuation: " << continuation;
  const std::string stop(1, *at);
  const size_t cut = continuation.find(stop);  // its first place, perhaps before `at`
  const CliResult stopped = run_cli(hello + " --stop '" + stop + "' --stop 'never met'", true);
  ASSERT_EQ(stopped.status, 0) << stopped.out;
  EXPECT_NE(stopped.out.find("\nhello" + continuation.substr(0, cut) + "\n(stopped: --stop \"" + stop + "\")\n"),
            std::string::npos) << stopped.out << "\nfree: " << free.out;
  EXPECT_EQ(stopped.out.find("generated 12 tokens"), std::string::npos) << stopped.out;  // it stopped early
  // The same in a batch: each prompt's line as its own run prints it.
  const CliResult batch = run_cli("run " + dir_ + " --byte-tokenizer --no-stop -n 12 -p 'hello' -p 'other' --stop '" +
                                      stop + "'",
                                  true);
  ASSERT_EQ(batch.status, 0) << batch.out;
  EXPECT_NE(batch.out.find("[1] hello" + continuation.substr(0, cut) + "\n"), std::string::npos) << batch.out;
  EXPECT_NE(batch.out.find("([1] stopped: --stop \"" + stop + "\")"), std::string::npos) << batch.out;
  const CliResult other = run_cli("run " + dir_ + " --byte-tokenizer --no-stop -n 12 -p 'other' --seed 1 --stop '" + stop + "'");
  EXPECT_NE(batch.out.find("[2] " + other.out), std::string::npos) << batch.out << "\nalone: " << other.out;
  // \xNN is a byte: the same stop as the letter itself; a control byte's note shows it as \xNN, which
  // --stop reads back.
  char hex[8];
  std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(stop[0]));
  const CliResult by_hex = run_cli(hello + " --stop '" + hex + "'", true);
  EXPECT_NE(by_hex.out.find("\nhello" + continuation.substr(0, cut) + "\n(stopped: --stop \"" + stop + "\")\n"),
            std::string::npos) << by_hex.out;
  const auto control = std::find_if(continuation.begin(), continuation.end(),
                                    [](char c) { return static_cast<unsigned char>(c) < 0x20 && c != '\n'; });
  if (control != continuation.end()) {
    std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(*control));
    const CliResult at_control = run_cli(hello + " --stop '" + hex + "'", true);
    EXPECT_NE(at_control.out.find("(stopped: --stop \"" + std::string(hex) + "\")"), std::string::npos)
        << at_control.out;
  }
  // Escapes: '\n' is a newline.
  const CliResult newline = run_cli(hello + " --stop '\\n'", true);
  const size_t line_end = continuation.find('\n');
  if (line_end == std::string::npos) {
    EXPECT_NE(newline.out.find(free.out), std::string::npos) << newline.out;
  } else {
    EXPECT_NE(newline.out.find("\nhello" + continuation.substr(0, line_end) + "\n(stopped: --stop \"\\n\")\n"),
              std::string::npos) << newline.out;
  }
  const CliResult empty = run_cli(hello + " --stop ''", true);
  EXPECT_NE(empty.status, 0);
  EXPECT_NE(empty.out.find("a stop string must not be empty"), std::string::npos) << empty.out;
}

TEST_F(CliModel, EvalPrintsPerplexity) {
  const std::string text = path("text.txt");
  std::ofstream(text) << "the quick brown fox jumps over the lazy dog. " << std::string(150, 'a');
  const CliResult r = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --context 32", true);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("perplexity"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens scored in"), std::string::npos) << r.out;  // the rate, on stderr
  const std::string json = path("eval.json");
  const CliResult s =
      run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --context 32 --sparsity --device cpu --json " + json);
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("nnz/token"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("\nmean "), std::string::npos) << s.out;
  // --json: the printed result and each layer's figures.
  const nlohmann::json j = nlohmann::json::parse(test::read_file(json));
  std::smatch printed;
  ASSERT_TRUE(std::regex_search(s.out, printed, std::regex("(\\d+) tokens predicted in (\\d+) windows.*perplexity ([0-9.]+)")))
      << s.out;
  EXPECT_EQ(j["tokens_scored"].get<int64_t>(), std::stoll(printed[1]));
  EXPECT_EQ(j["windows"].get<int64_t>(), std::stoll(printed[2]));
  EXPECT_NEAR(j["perplexity"].get<double>(), std::stod(printed[3]), 1e-4 * std::stod(printed[3]));
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["context"], 32);
  ASSERT_EQ(j["ffn_sparsity"].size(), 2u);  // the fixture's layers
  for (const auto& layer : j["ffn_sparsity"]) {
    // every token of each window: those scored, and each window's first (its context only)
    EXPECT_EQ(layer["tokens"].get<int64_t>(), j["tokens_scored"].get<int64_t>() + j["windows"].get<int64_t>());
    EXPECT_GT(layer["nnz_per_token"].get<double>(), 0);
    EXPECT_NEAR(layer["density"].get<double>(), layer["nnz_per_token"].get<double>() / j["intermediate_size"].get<double>(),
                1e-12);
  }
  // A --json path that cannot be written fails before the run.
  const CliResult bad = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --json " + path("no/such/dir/e.json"), true);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--json " + path("no/such/dir/e.json") + ": cannot write it"), std::string::npos) << bad.out;
  EXPECT_EQ(bad.out.find("loaded "), std::string::npos) << bad.out;
  // Nor may it be the text itself, which it would overwrite.
  const std::string before = test::read_file(text);
  const CliResult self = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --json " + text, true);
  EXPECT_NE(self.status, 0);
  EXPECT_NE(self.out.find("is the text file " + text + ": the results would overwrite it"), std::string::npos)
      << self.out;
  EXPECT_EQ(test::read_file(text), before);
  // Nor a file of the model (it replaced config.json or the weights, and said it wrote the result).
  for (const char* name : {"config.json", "model.safetensors"}) {
    const std::string model_file = dir_ + "/" + name, kept = test::read_file(model_file);
    const CliResult over = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --json " + model_file, true);
    EXPECT_NE(over.status, 0);
    EXPECT_NE(over.out.find("is a file of the model: " + model_file + ": the results would overwrite it"),
              std::string::npos) << over.out;
    EXPECT_EQ(test::read_file(model_file), kept);
  }
  // bench ffn's --json is not its --from input either, by any name (refused before the file is read)
  const std::string other_name = path("./text.txt");
  const CliResult from_self = run_cli("bench ffn --backend cpu --from " + text + " --json " + other_name, true);
  EXPECT_EQ(WEXITSTATUS(from_self.status), 1) << from_self.out;
  EXPECT_NE(from_self.out.find("--json " + other_name + " is the --from input " + text), std::string::npos)
      << from_self.out;
  EXPECT_EQ(test::read_file(text), before);
  // --batch: windows a forward on the GPU; the CPU backend takes them one at a time, the same figures.
  const CliResult batched =
      run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --context 32 --batch 3 --device cpu --json " + json);
  ASSERT_EQ(batched.status, 0) << batched.out;
  const nlohmann::json b = nlohmann::json::parse(test::read_file(json));
  EXPECT_EQ(b["windows_per_call"], 1);
  EXPECT_EQ(b["perplexity"], j["perplexity"]);
  EXPECT_NE(run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --batch 0").status, 0);
}

// --stride 1 slides a window of --context 8 one token at a time: each token is scored once, with the
// up to 7 tokens before it as context: the perplexity of those forwards on the CPU model, one a token.
// --stride equal to the window is the default; longer, or with --sparsity, is refused.
TEST_F(CliModel, EvalSlidesItsWindowByTheStride) {
  const std::string text = path("stride.txt");
  const std::string body = "the quick brown fox jumps over the lazy dog";
  std::ofstream(text) << body;
  const CliResult r = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --device cpu --context 8 --stride 1");
  ASSERT_EQ(r.status, 0) << r.out;
  const LlamaCpu cpu(LlamaWeights::load_dir(dir_));
  std::vector<int32_t> ids = {256};  // the byte tokenizer's BOS, then the bytes
  for (unsigned char ch : body) ids.push_back(ch);
  double sum = 0;
  for (size_t t = 1; t < ids.size(); ++t) {
    const size_t begin = t >= 7 ? t - 7 : 0;
    const std::vector<int32_t> window(ids.begin() + begin, ids.begin() + t + 1);
    sum += nll_from_logits(cpu.logits(window), window).back();
  }
  const double want = std::exp(sum / static_cast<double>(ids.size() - 1));
  char expected[64];
  std::snprintf(expected, sizeof expected, "perplexity %.4f", want);
  EXPECT_NE(r.out.find(expected), std::string::npos) << r.out << " (want " << expected << ")";
  EXPECT_NE(r.out.find(std::to_string(ids.size() - 1) + " tokens predicted in " + std::to_string(ids.size() - 7) +
                       " windows of up to 8 every 1"), std::string::npos) << r.out;
  const std::string plain = " --byte-tokenizer --device cpu --context 8";
  EXPECT_EQ(run_cli("eval " + dir_ + " " + text + plain + " --stride 8").out, run_cli("eval " + dir_ + " " + text + plain).out);
  const CliResult too_long = run_cli("eval " + dir_ + " " + text + plain + " --stride 9", true);
  EXPECT_NE(too_long.status, 0);
  EXPECT_NE(too_long.out.find("--stride 9 is longer than the window"), std::string::npos) << too_long.out;
  const CliResult sparsity = run_cli("eval " + dir_ + " " + text + plain + " --stride 4 --sparsity", true);
  EXPECT_NE(sparsity.status, 0);
  EXPECT_NE(sparsity.out.find("--sparsity counts every token"), std::string::npos) << sparsity.out;
}

// --max-windows says the result is part of the text's; a UTF-16 file is refused (its bytes are not its
// text); a --json path whose bytes are not UTF-8 still gets its record (dump() threw after the run).
TEST_F(CliModel, EvalSaysWhatItScoredAndRefusesUtf16) {
  const std::string text = path("part.txt");
  std::ofstream(text) << std::string(200, 'a');
  const std::string json = path("part.json");
  const std::string args = " --byte-tokenizer --device cpu --context 32";
  const CliResult part = run_cli("eval " + dir_ + " " + text + args + " --max-windows 2 --json " + json);
  ASSERT_EQ(part.status, 0) << part.out;
  EXPECT_NE(part.out.find("in 2 windows of up to 32 (the first 2 of the text's 7: --max-windows)"), std::string::npos)
      << part.out;
  const nlohmann::json j = nlohmann::json::parse(test::read_file(json));
  EXPECT_EQ(j["windows"], 2);
  EXPECT_EQ(j["windows_in_text"], 7);
  EXPECT_EQ(j["max_windows"], 2);
  const CliResult whole = run_cli("eval " + dir_ + " " + text + args + " --json " + json);
  ASSERT_EQ(whole.status, 0) << whole.out;
  EXPECT_EQ(whole.out.find("--max-windows"), std::string::npos) << whole.out;
  EXPECT_FALSE(nlohmann::json::parse(test::read_file(json)).contains("windows_in_text"));

  const std::string odd_name = path("odd\xff.txt");
  std::ofstream(odd_name) << std::string(40, 'b');
  const std::string odd_json = path("odd\xfe.json");
  const CliResult odd = run_cli("eval " + dir_ + " '" + odd_name + "'" + args + " --json '" + odd_json + "'", true);
  ASSERT_EQ(odd.status, 0) << odd.out;
  EXPECT_NE(nlohmann::json::parse(test::read_file(odd_json))["file"].get<std::string>().find("odd\xEF\xBF\xBD.txt"),
            std::string::npos);
  // So for bench's records, whose command holds the path.
  const CliResult bench = run_cli("bench ffn --backend cpu -M 4 -H 64 -I 256 -d 0.1 --iters 1 --json '" + odd_json + "'");
  ASSERT_EQ(bench.status, 0) << bench.out;
  EXPECT_NE(nlohmann::json::parse(test::read_file(odd_json))[0]["command"].get<std::string>().find("odd\xEF\xBF\xBD.json"),
            std::string::npos);

  for (const auto& [mark, name] : {std::pair<std::string, std::string>{"\xFF\xFE", "UTF-16"},
                                   {"\xFE\xFF", "UTF-16"},
                                   {std::string("\xFF\xFE\0\0", 4), "UTF-32"}}) {
    const std::string wide = path("wide.txt");
    std::ofstream(wide, std::ios::binary) << mark << std::string("h\0i\0", 4);
    const CliResult r = run_cli("eval " + dir_ + " " + wide + args, true);
    EXPECT_EQ(WEXITSTATUS(r.status), 1) << r.out;
    EXPECT_NE(r.out.find(wide + " is " + name + " (it starts with the byte-order mark"), std::string::npos) << r.out;
    const CliResult run = run_cli("run " + dir_ + " --byte-tokenizer --device cpu -n 1 --prompts " + wide, true);
    EXPECT_EQ(WEXITSTATUS(run.status), 1) << run.out;
    EXPECT_NE(run.out.find(wide + " is " + name), std::string::npos) << run.out;
  }
  // A device would be read until memory ran out: refused at once.
  const CliResult zero = run_cli("eval " + dir_ + " /dev/zero" + args, true);
  EXPECT_EQ(WEXITSTATUS(zero.status), 1) << zero.out;
  EXPECT_NE(zero.out.find("/dev/zero: a device, not a text file"), std::string::npos) << zero.out;
  const CliResult run = run_cli("run " + dir_ + " --byte-tokenizer --device cpu -n 1 --prompts /dev/zero", true);
  EXPECT_EQ(WEXITSTATUS(run.status), 1) << run.out;
  EXPECT_NE(run.out.find("/dev/zero: a device, not a text file"), std::string::npos) << run.out;
}

TEST_F(CliModel, DeviceSelection) {
  const std::string args = "run " + dir_ + " --byte-tokenizer --no-stop -p 'hi' -n 5";
  const CliResult cpu = run_cli(args + " --device cpu", true);
  EXPECT_EQ(cpu.status, 0) << cpu.out;
  EXPECT_NE(cpu.out.find("backend: CPU reference"), std::string::npos) << cpu.out;
  // --backend, as `twell bench ffn` spells it, is the same option.
  const CliResult alias = run_cli(args + " --backend cpu", true);
  EXPECT_EQ(alias.status, 0) << alias.out;
  EXPECT_NE(alias.out.find("backend: CPU reference"), std::string::npos) << alias.out;
  // the GPU's options given to the CPU backend are named as unused
  const CliResult gpu_options = run_cli(args + " --device cpu --gpu-memory 40GB --ffn dense --max-batch-tokens 64", true);
  EXPECT_EQ(gpu_options.status, 0) << gpu_options.out;
  EXPECT_NE(gpu_options.out.find("backend: CPU reference (--gpu-memory, --ffn, --max-batch-tokens: options for the GPU; "
                                 "the CPU backend does not use them)"),
            std::string::npos)
      << gpu_options.out;
  EXPECT_NE(run_cli(args + " --device tpu").status, 0);
  EXPECT_NE(run_cli(args + " --ffn sometimes").status, 0);
  // On a machine without a Hopper GPU (CI), asking for one fails and says why; with one, it runs.
  EXPECT_NE(cpu.out.find("generated 5 tokens"), std::string::npos) << cpu.out;
  const CliResult gpu = run_cli(args + " --device cuda", true);
  if (gpu.status != 0) {
    EXPECT_NE(gpu.out.find("--device (--backend) cuda: "), std::string::npos) << gpu.out;
  } else {  // sized for the prompt (3 tokens with BOS) and -n 5: all five come out
    EXPECT_NE(gpu.out.find("generated 5 tokens"), std::string::npos) << gpu.out;
  }
  // --sparsity on either backend (LlamaCuda.FfnStatisticsCountWhatTheCpuCounts compares the two).
  const std::string text = path("t.txt");
  std::ofstream(text) << "sparsity statistics on either backend";
  const CliResult on_cpu = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --sparsity --device cpu", true);
  EXPECT_EQ(on_cpu.status, 0) << on_cpu.out;
  EXPECT_NE(on_cpu.out.find("nnz/token"), std::string::npos) << on_cpu.out;
  const CliResult on_gpu = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --sparsity --device cuda", true);
  if (on_gpu.status != 0) {
    EXPECT_NE(on_gpu.out.find("--device (--backend) cuda: "), std::string::npos) << on_gpu.out;
  } else {
    EXPECT_NE(on_gpu.out.find("nnz/token"), std::string::npos) << on_gpu.out;
  }
}

// A model no GPU can hold: --device cuda refuses it, saying what it needs; --device auto would run it
// on the CPU, but this one (~3.3 TB of bf16 weights) fits on no host either, and is refused with both
// figures; --device cpu with the host's. The checks read config.json alone, before the weights (here the tiny ones).
TEST_F(CliModel, AModelTooLargeForTheGpuAndTheHostIsRefusedWithBothFigures) {
  io::ModelConfig c = io::read_config(dir_);
  c.hidden_size = 8192;  // within what the GPU runtime takes, so that only its size is in the way
  c.intermediate_size = int64_t{1} << 16;
  c.num_hidden_layers = 1024;  // ~3.3 TB of bf16 weights
  io::write_config(dir_, c);
  const std::string args = "run " + dir_ + " --byte-tokenizer --no-stop -p 'hi' -n 5";
  const CliResult cpu = run_cli(args + " --device cpu", true);  // refused before the load, not killed mid-way
  EXPECT_NE(cpu.status, 0) << cpu.out;
  EXPECT_NE(cpu.out.find(": the model does not fit in memory: the CPU backend's f32 weights need 6.6 TB"),
            std::string::npos) << cpu.out;
  const CliResult cuda = run_cli(args + " --device cuda", true);
  EXPECT_NE(cuda.status, 0) << cuda.out;
  if (cuda.out.find("weights need") == std::string::npos) GTEST_SKIP() << "no Hopper GPU here: " << cuda.out;
  EXPECT_NE(cuda.out.find("--device (--backend) cuda: the model's weights need "), std::string::npos) << cuda.out;
  EXPECT_NE(cuda.out.find("; --device cpu runs it on the CPU"), std::string::npos) << cuda.out;
  const CliResult automatic = run_cli(args + " --device auto", true);
  EXPECT_NE(automatic.status, 0) << automatic.out;
  EXPECT_NE(automatic.out.find("; nor does it fit on the CPU: the CPU backend's f32 weights need 6.6 TB"),
            std::string::npos)
      << automatic.out;
}

// --gpu-memory caps what the model may take on the GPU: below its needs, --device auto runs it on the
// CPU and says why, --device cuda refuses it naming the cap. A size that is none is refused first.
TEST_F(CliModel, AGpuMemoryCapBelowTheModelsNeedsRunsItOnTheCpu) {
  const std::string args = "run " + dir_ + " --byte-tokenizer --no-stop -p 'hi' -n 5 --gpu-memory 1KB";
  const CliResult automatic = run_cli(args, true);
  ASSERT_EQ(automatic.status, 0) << automatic.out;
  EXPECT_NE(automatic.out.find("using the CPU backend"), std::string::npos) << automatic.out;
  EXPECT_NE(automatic.out.find("backend: CPU reference"), std::string::npos) << automatic.out;
  EXPECT_NE(automatic.out.find("generated 5 tokens"), std::string::npos) << automatic.out;
  const CliResult cuda = run_cli(args + " --device cuda", true);
  EXPECT_NE(cuda.status, 0) << cuda.out;
  if (cuda.out.find("the model needs ") != std::string::npos || cuda.out.find("weights need ") != std::string::npos) {
    EXPECT_NE(automatic.out.find(", of which 1.0 KB may be used (--gpu-memory): using the CPU backend"),
              std::string::npos) << automatic.out;
    EXPECT_NE(cuda.out.find(", of which 1.0 KB may be used (--gpu-memory); --device cpu runs it on the CPU"),
              std::string::npos) << cuda.out;
  }
  const CliResult bad = run_cli("run " + dir_ + " --byte-tokenizer -p 'hi' --gpu-memory 12XB", true);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--gpu-memory: '12XB' is not a size"), std::string::npos) << bad.out;
  const CliResult zero = run_cli("run " + dir_ + " --byte-tokenizer -p 'hi' --gpu-memory 0.4", true);
  EXPECT_NE(zero.status, 0);
  EXPECT_NE(zero.out.find("--gpu-memory: must be at least 1 byte"), std::string::npos) << zero.out;
}

TEST_F(CliModel, MissingTokenizerAndBadModelFailCleanly) {
  const CliResult none = run_cli("run " + dir_ + " -p hi", true);  // no tokenizer.json, no --byte-tokenizer
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.out.find("trained on bytes runs with --byte-tokenizer"), std::string::npos) << none.out;
  // A bad TWELL_NUM_THREADS is said before the model loads (the prompt was echoed, the model read, first).
  setenv("TWELL_NUM_THREADS", "abc", 1);
  const CliResult threads = run_cli("run " + dir_ + " --byte-tokenizer -p hi", true);
  EXPECT_EQ(run_cli("--version").status, 0);  // --help and --version are answered all the same
  unsetenv("TWELL_NUM_THREADS");
  EXPECT_NE(threads.status, 0);
  EXPECT_EQ(threads.out.rfind("twell: error: TWELL_NUM_THREADS: expected an integer", 0), 0u) << threads.out;
  // ... which a vocabulary smaller than the byte tokenizer's cannot take: not suggested there.
  io::ModelConfig small = tiny_config("relu", true);
  write_hf(path("small"), small, random_hf_tensors(small, 5));
  const CliResult too_small = run_cli("run " + path("small") + " -p hi", true);
  EXPECT_NE(too_small.status, 0);
  EXPECT_NE(too_small.out.find("too small for --byte-tokenizer (258 ids): it needs its own tokenizer.json"),
            std::string::npos) << too_small.out;
  EXPECT_NE(run_cli("run " + path("nothing") + " --byte-tokenizer -p hi").status, 0);
  const CliResult file = run_cli("run " + dir_ + "/model.safetensors --byte-tokenizer -p hi", true);
  EXPECT_NE(file.status, 0);
  EXPECT_NE(file.out.find("must be a model directory"), std::string::npos) << file.out;
  // Output that cannot be written (a full disk) is an error, not a lost table.
  EXPECT_EQ(WEXITSTATUS(run_cli("inspect " + dir_).status), 0);
  EXPECT_EQ(WEXITSTATUS(run_cli("inspect " + dir_ + " >/dev/full").status), 1);
  EXPECT_EQ(WEXITSTATUS(run_cli("--help >/dev/full").status), 1);
  // a prompt of words that begins with a dash is a prompt, not an option
  const CliResult dashed = run_cli("run " + dir_ + " --byte-tokenizer -p '-n dashes and more' -n 2", true);
  EXPECT_EQ(dashed.status, 0) << dashed.out;
  EXPECT_NE(dashed.out.find("-n dashes and more"), std::string::npos) << dashed.out;  // echoed, then continued
  // run stops generating at the first piece it cannot write, and says why
  const std::string err = path("err.txt");
  const int status = std::system((std::string(TWELL_CLI_PATH) + " run " + dir_ +
                                  " --byte-tokenizer --no-stop -p hi -n 30 >/dev/full 2>" + err).c_str());
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string said = test::read_file(err);
  EXPECT_NE(said.find("twell: error: writing the standard output failed: No space left on device"), std::string::npos)
      << said;
  EXPECT_EQ(said.find("generated 30 tokens"), std::string::npos) << said;
}

// Without --context, eval's windows are the model's context up to 8192 tokens (a window's logits
// are 4·window·vocab bytes), and the summary says how many windows of what length it used.
TEST_F(CliModel, EvalWindowDefaultsToTheContextUpTo8192) {
  const std::string text = path("text.txt");
  std::ofstream(text) << std::string(150, 'a');
  const CliResult r = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("148 tokens predicted in 3 windows of up to 64,"), std::string::npos) << r.out;
  const std::string long_ctx = path("long");
  io::ModelConfig c = tiny_config("relu", true);
  c.vocab_size = 258;
  c.max_position_embeddings = 100000;
  write_hf(long_ctx, c, random_hf_tensors(c, 13));
  const CliResult l = run_cli("eval " + long_ctx + " " + text + " --byte-tokenizer");
  ASSERT_EQ(l.status, 0) << l.out;
  EXPECT_NE(l.out.find("150 tokens predicted in 1 window of up to 8192,"), std::string::npos) << l.out;
  // Text that is not UTF-8 is evaluated byte for byte, with a note on where it stops being UTF-8.
  const std::string bytes = path("bytes.txt");
  std::ofstream(bytes) << "abc\xff\xfe" << std::string(40, 'a');
  const CliResult b = run_cli("eval " + dir_ + " " + bytes + " --byte-tokenizer", true);
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("is not valid UTF-8 from byte 3 on"), std::string::npos) << b.out;
  // And so is a prompt, with the same note.
  const CliResult p = run_cli("run " + dir_ + " --byte-tokenizer -n 2 -p \"$(printf 'ab\\377c')\"", true);
  ASSERT_EQ(p.status, 0) << p.out;
  EXPECT_NE(p.out.find("note: the prompt is not valid UTF-8 from byte 2 on"), std::string::npos) << p.out;
}

// A misspelt command, at either level, is named with the ones that exist; a misspelt option is
// named first (not after its value, as CLI11 lists extras), with the nearest one.
TEST(Cli, UnknownCommandsAreNamed) {
  const struct {
    const char* args;
    const char* message;
  } cases[] = {
      {"bnech", "twell: unknown command 'bnech' (commands: bench, inspect, run, eval"},
      {"bench ffm -M 4", "twell bench: unknown command 'ffm' (commands: ffn, model"},
      {"bench ffn --backend cpu -M 4 -H 64 -I 256 --l1 0.1", "--l1 requires --train"},  // means nothing alone
      {"bench ffn --backnd cpu -M 4", "twell bench ffn: unknown option '--backnd' (did you mean --backend?)"},
      {"run . -p hi --temp 0.5", "twell run: unknown option '--temp' (did you mean --temperature?)"},  // abbreviated
      // CLI11's phrasings in ours: an option of several values took a word meant for another; no value at the end.
      {"bench ffn -d 0.005 out.json", "twell bench ffn: --density: cannot read '0.005 out.json' as its values (it "
                                      "takes every word after it, up to the next option)"},
      {"eval . f.txt --json", "twell eval: --json needs a value; see twell eval --help"},
      {"bench ffn -H abc", "twell bench ffn: --hidden: must be an integer, got abc; see twell bench ffn --help"},
      {"bench ffn --backend cpu -M 4,0", "twell bench ffn: --tokens: must be at least 1, got 0"},  // was "twell: error: -M"
      {"bench ffn --backend cpu -M 4 -d 0.1,1.5", "twell bench ffn: --density: must be a density in (0, 1], got 1.5"},
      {"run . -p hi --zzzzzz", "twell run: unknown option '--zzzzzz'; see twell run --help"},
      {"--bogus", "twell: unknown option '--bogus'; see twell --help"},
      // Arguments left over, in their order; an unquoted prompt is said to need quotes.
      {"run . tiny -p hi", "twell run: unexpected argument 'tiny'; see twell run --help"},  // no quoting hint: before -p
      {"run . -p The quick brown", "twell run: unexpected arguments 'quick brown' (a prompt of several words goes in "
                                   "quotes: -p \"...\"); see twell run --help"},
      {"inspect . extra", "twell inspect: unexpected argument 'extra'; see twell inspect --help"},
      {"run . -p hi -n 5 6", "twell run: unexpected argument '6'; see twell run --help"},  // a number: no prompt's
      // Every command-line error in one form, exit status 1.
      {"run .", "twell run: --prompt (or --prompts FILE, or --chat for a conversation on stdin) is required; see twell run --help"},
      {"", "twell: a command is required: bench, inspect, run, eval; see twell --help"},
      {"bench", "twell bench: a command is required: ffn, model; see twell bench --help"},
      {"run . -p a -n 1 -n 2", "twell run: --max-tokens is given more than once; see twell run --help"},
      // CLI11 would take the next argument as the value (the prompt "--no-stop", say).
      {"run . --prompt= --no-stop", "twell run: --prompt= has nothing after the '='; give a value"},
      {"eval . f.txt --context= --byte-tokenizer", "twell eval: --context= has nothing after the '='"},
      {"run . -p hi --no-stop=", "twell run: --no-stop is a flag and takes no value"},
      // ... and an option that takes a value does not take the next option as it.
      {"run . -p --no-stop -n 3",
       "twell run: -p needs a value, got the option --no-stop (a value that starts with '-': --prompt=--no-stop)"},
      {"eval . f.txt --json --sparsity", "twell eval: --json needs a value, got the option --sparsity"},
      {"eval . f.txt --json --context=8", "twell eval: --json needs a value, got the option --context=8"},
      {"run . -p -n3", "twell run: -p needs a value, got the option -n3"},
      {"run . -p -- -n 2", "twell run: -p needs a value, got the separator --"},
      // Values refused by the option's own rule, in one form; integers in decimal only.
      {"run . -p hi --top-p 1.5", "twell run: --top-p: must be in (0, 1], got 1.5; see twell run --help"},
      {"run . -p hi --temperature nan", "twell run: --temperature: must be finite and at least 0, got nan"},
      {"run . -p hi --top-k 1.5", "twell run: --top-k: must be an integer, got 1.5"},
      {"eval . /dev/null --batch abc", "twell eval: --batch: must be an integer, got abc"},  // CLI11: "not in range"
      {"bench model --gather-batches 0", "twell bench model: --gather-batches: must be in [1, 256], got 0"},
      {"bench ffn --energy --energy-seconds 0.1", "twell bench ffn: --energy-seconds: must be in [0.5, 60], got 0.1"},
      {"run . -p hi -n 0x10", "twell run: --max-tokens: must be an integer, got 0x10"},
      {"run . -p hi -n 99999999999999999999", "--max-tokens: must be an integer that fits in 64 bits"},
      {"inspect ''", "twell: error: expected a checkpoint path, got an empty one"},
      // An empty number is not 0 (a 0% density case, greedy sampling).
      {"bench ffn --backend cpu -M 4 -d ''", "twell bench ffn: --density: got an empty value; give a number"},
      {"bench ffn --backend cpu -M 4 -d 0.1 ''", "twell bench ffn: --density: got an empty value; give a number"},
      // ... nor is an empty item of a list (CLI11 drops it).
      {"bench ffn --backend cpu -M 4,,8", "twell bench ffn: -M: the list '4,,8' has an empty item"},
      {"bench ffn --backend cpu -M 4 --distribution=uniform,", "twell bench ffn: --distribution: the list 'uniform,' "
                                                             "has an empty item"},
      {"bench ffn --backend cpu -M 4 -d,0.1", "twell bench ffn: -d: the list ',0.1' has an empty item"},
      {"bench ffn --backend cpu -M 4 --tile=", "twell bench ffn: --tile= has nothing after the '='"},
      {"bench ffn --backend cpu -M 4 --iters ''", "twell bench ffn: --iters: got an empty value; give a number"},
      {"run . -p hi --temperature ''", "twell run: --temperature: got an empty value; give a number"},
      {"run . -p hi --seed ''", "twell run: --seed: got an empty value; give a number"},
      {"bench model --ragged ''", "twell bench model: --ragged: got an empty value; give a number"},  // a Range check
      {"eval . no-such-file.txt", "twell eval: file: no such file: no-such-file.txt; see twell eval --help"},
      {"eval . /", "twell eval: file: expected a file, got the directory /; see twell eval --help"},
      // The CPU backend's banner comes only once the options are good: an error is said alone.
      {"bench ffn --backend cpu --from no-such.safetensors", "--from: no such file: no-such.safetensors"},
      {"bench ffn --backend cpu --from ''", "--from: expected a file name, got an empty one"},  // not the default run
      {"bench ffn --json ''", "twell bench ffn: --json: expected a file name, got an empty one"},
      {"bench model --save ''", "twell bench model: --save: expected a directory, got an empty name"},
      {"bench model --save /dev/null", "twell bench model: --save: /dev/null exists and is not a directory"},
      {"bench ffn --json -", "twell bench ffn: --json: expected a file name, got '-'"},
      // Refused before the first case runs, in the options' own terms.
      {"bench ffn --backend cpu -M 4 -H 64 -I 256 --train", "twell: error: --train needs the CUDA backend"},
      {"bench ffn --backend cpu -M 99999999999 -H 64 -I 256", "M = 99999999999, H = 64, I = 256 (-M, -H, -I) needs at least 82400.0 GB"},
      {"bench ffn --backend cpu -M 2000000 -H 64 -I 176 --tile 65536 --compression 1",
       "(-M, -H, -I; --tile 65536 --compression 1 packs 65536 slots a token) needs at least 525."},
  };
  for (const auto& c : cases) {
    const CliResult r = run_cli(c.args, true);
    EXPECT_EQ(WEXITSTATUS(r.status), 1) << c.args;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << ": " << r.out;
    EXPECT_EQ(r.out.find(".cpp:"), std::string::npos) << c.args << ": a source location in " << r.out;
    EXPECT_EQ(r.out.find("checking against float64"), std::string::npos) << c.args << ": a case ran: " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << c.args << ": more than the error: " << r.out;
  }
}

// bench model --save does not replace a checkpoint (it did, after the run, without a word): refused first.
TEST_F(CliModel, BenchModelSaveRefusesADirectoryHoldingAModel) {
  const std::string kept = test::read_file(dir_ + "/config.json");
  const CliResult r = run_cli("bench model --save " + dir_, true);
  EXPECT_EQ(WEXITSTATUS(r.status), 1) << r.out;
  EXPECT_NE(r.out.find("--save: " + dir_ + " holds a model already (config.json): give a new directory"),
            std::string::npos) << r.out;
  EXPECT_EQ(test::read_file(dir_ + "/config.json"), kept);
}

// Values out of range fail before the model loads, with the option's name; nothing runs.
TEST_F(CliModel, BadOptionsFailBeforeLoading) {
  for (const char* bad : {"--temperature -1", "--temperature inf", "--top-p 0", "--top-p nan", "--top-k -3", "-n -1",
                          "--seed -1", "--seed 18446744073709551616", "--max-batch-tokens -1",
                          // 0 to strtod (greedy, unsaid), 16, 0.5: decimal forms a double holds only
                          "--temperature 1e-400", "--temperature 0x10", "--top-p ' 0.5'"}) {
    const CliResult r = run_cli("run " + dir_ + " --byte-tokenizer -p hi " + bad, true);
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_EQ(r.out.find("loaded "), std::string::npos) << bad << ": " << r.out;
  }
  // Fewer tokens a forward than prompts: a decode step could not take one token of each.
  const CliResult narrow = run_cli("run " + dir_ + " --byte-tokenizer -p hi -p ho --max-batch-tokens 1", true);
  EXPECT_NE(narrow.status, 0);
  EXPECT_NE(narrow.out.find("--max-batch-tokens must be at least the most sequences a call takes (2"), std::string::npos)
      << narrow.out;
  EXPECT_EQ(narrow.out.find("loaded "), std::string::npos) << narrow.out;
  const std::string text = path("t.txt");
  std::ofstream(text) << "some text";
  for (const char* bad : {"--context 0", "--context -5", "--max-windows -1"})
    EXPECT_NE(run_cli("eval " + dir_ + " " + text + " --byte-tokenizer " + bad).status, 0) << bad;
  // Longer than the model's context (64 positions): refused before the weights load.
  const CliResult long_window = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --context 65", true);
  EXPECT_NE(long_window.status, 0);
  EXPECT_NE(long_window.out.find("longer than the model's context of 64"), std::string::npos) << long_window.out;
  EXPECT_EQ(long_window.out.find("loaded "), std::string::npos) << long_window.out;
  const CliResult long_prompt = run_cli("run " + dir_ + " --byte-tokenizer -p " + std::string(70, 'a'), true);
  EXPECT_NE(long_prompt.status, 0);
  EXPECT_NE(long_prompt.out.find("the prompt is 71 tokens, longer than the model's context of 64"), std::string::npos)
      << long_prompt.out;
  EXPECT_EQ(long_prompt.out.find("loaded "), std::string::npos) << long_prompt.out;
  const std::string empty = path("empty.txt");
  std::ofstream(empty).flush();
  const CliResult e = run_cli("eval " + dir_ + " " + empty + " --byte-tokenizer", true);
  EXPECT_NE(e.status, 0);
  EXPECT_NE(e.out.find("encodes to no tokens"), std::string::npos) << e.out;
}

// A ReLU model of 400 embedding rows in `dir` with the 308-id byte-level BPE fixture (no BOS) as
// its tokenizer.
void write_bpe_model(const std::string& dir, uint64_t seed) {
  io::ModelConfig c = tiny_config("relu", true);
  c.vocab_size = 400;
  c.max_position_embeddings = 64;
  write_hf(dir, c, random_hf_tensors(c, seed));
  std::ofstream(dir + "/tokenizer.json")
      << test::read_file((std::filesystem::path(__FILE__).parent_path() / "data" / "bpe_gpt2.json").string());
}

// A model whose embedding rows are padded past its tokenizer (vocab_size 400, a 308-id byte-level
// BPE with no BOS): hot sampling never draws an id the tokenizer cannot print, an empty prompt is
// refused before loading (nothing to continue from), and the summary on stderr starts a line of
// its own after the streamed text.
TEST_F(CliModel, PaddedVocabularyAndEmptyPrompt) {
  const std::string padded = path("padded");
  write_bpe_model(padded, 12);
  for (int seed = 1; seed <= 4; ++seed) {
    const CliResult r =
        run_cli("run " + padded + " -p hello -n 40 --temperature 5 --seed " + std::to_string(seed), true);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("\nprompt "), std::string::npos) << r.out;
  }
  const CliResult empty = run_cli("run " + padded + " -p ''", true);
  EXPECT_NE(empty.status, 0);
  EXPECT_NE(empty.out.find("the prompt is empty"), std::string::npos) << empty.out;
  EXPECT_EQ(empty.out.find("loaded "), std::string::npos) << empty.out;
}

// --skip-special-tokens: the text of each sequence without its special tokens' (the fixture's
// <|endoftext|>, <mask> and <sep>), the rest as it was, in the prompt too; hot sampling over a batch
// draws some of them.
TEST_F(CliModel, SkipSpecialTokensLeavesThemOutOfTheText) {
  const std::string model = path("special");
  write_bpe_model(model, 14);
  std::string batch = "run " + model + " --no-stop -n 60 --temperature 50 --seed 5";
  for (int i = 0; i < 32; ++i) batch += " -p 'a<sep>b'";
  const CliResult kept = run_cli(batch), skipped = run_cli(batch + " --skip-special-tokens");
  ASSERT_EQ(kept.status, 0) << kept.out;
  ASSERT_EQ(skipped.status, 0) << skipped.out;
  std::string want = kept.out;
  size_t special = 0;
  for (const std::string s : {"<|endoftext|>", "<mask>", "<sep>"})
    for (size_t at; (at = want.find(s)) != std::string::npos; ++special) want.erase(at, s.size());
  EXPECT_GT(special, 32u) << "the test needs special tokens in the new text: " << kept.out;
  // The prompts are printed as given, their <sep> too.
  std::string skipped_out = skipped.out;
  for (size_t at = 0; (at = skipped_out.find("a<sep>b", at)) != std::string::npos;) skipped_out.erase(at + 1, 5);
  EXPECT_EQ(skipped_out, want);
}

// --chat: each prompt goes through the model's chat template as a user message (after --system's), the
// text it renders continued as it stands (no BOS added: the template writes its own) and only the reply
// printed: the plain run of the rendered text prints that text, then the same reply. A model without a
// template is refused before loading, with the way out; --chat-template gives one.
TEST_F(CliModel, ChatRendersTheTemplateAndPrintsTheReply) {
  const std::string model = path("chat");
  write_bpe_model(model, 15);
  const std::string opts = " --no-stop -n 12 --temperature 2 --seed 9";
  const CliResult none = run_cli("run " + model + " --chat -p hi" + opts, true);
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.out.find("has no chat template"), std::string::npos) << none.out;
  EXPECT_NE(none.out.find("--chat-template FILE"), std::string::npos) << none.out;
  EXPECT_EQ(none.out.find("loaded "), std::string::npos) << none.out;
  const CliResult inspect_none = run_cli("inspect " + model);
  EXPECT_NE(inspect_none.out.find("chat template: none"), std::string::npos) << inspect_none.out;
  std::ofstream(model + "/tokenizer_config.json")
      << R"({"eos_token": "<|endoftext|>", "chat_template": "{% for m in messages %}<sep>{{ m.role }}: )"
      << R"({{ m.content | trim }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<mask>{% endif %}"})";
  const CliResult inspect = run_cli("inspect " + model);
  EXPECT_NE(inspect.out.find("chat template: " + model + "/tokenizer_config.json (chat_template)"), std::string::npos)
      << inspect.out;
  const CliResult chat = run_cli("run " + model + " --chat -p ' hi '" + opts);
  ASSERT_EQ(chat.status, 0) << chat.out;
  const std::string rendered = "<sep>user: hi<|endoftext|><mask>";
  const CliResult plain = run_cli("run " + model + " -p '" + rendered + "'" + opts);
  ASSERT_EQ(plain.status, 0) << plain.out;
  EXPECT_EQ(plain.out, rendered + chat.out);
  const CliResult noted = run_cli("run " + model + " --chat -p ' hi '" + opts, true);
  EXPECT_NE(noted.out.find("chat template: " + model + "/tokenizer_config.json"), std::string::npos) << noted.out;
  // --system, and a batch: each reply alone after its number.
  const std::string with_system = "<sep>system: be brief<|endoftext|><sep>user: yo<|endoftext|><mask>";
  const CliResult batch = run_cli("run " + model + " --chat --system 'be brief' -p yo -p yo" + opts);
  const CliResult plain_system = run_cli("run " + model + " -p '" + with_system + "'" + opts);
  ASSERT_EQ(batch.status, 0) << batch.out;
  ASSERT_EQ(plain_system.status, 0) << plain_system.out;
  EXPECT_EQ(batch.out.substr(0, 4), "[1] ") << batch.out;
  EXPECT_EQ(batch.out.substr(4, batch.out.find('\n') - 4) + "\n", plain_system.out.substr(with_system.size()));
  // --chat-template FILE instead of the model's.
  const std::string file = path("t.jinja");
  std::ofstream(file) << "<sep>{{ messages[-1].content }}<mask>";
  const CliResult given = run_cli("run " + model + " --chat --chat-template " + file + " -p hi" + opts);
  const CliResult plain_given = run_cli("run " + model + " -p '<sep>hi<mask>'" + opts);
  ASSERT_EQ(given.status, 0) << given.out;
  EXPECT_EQ(plain_given.out, "<sep>hi<mask>" + given.out);
  // A template that refuses the conversation: its message, before loading.
  std::ofstream(file) << "{{ raise_exception('only one message, please') }}";
  const CliResult refused = run_cli("run " + model + " --chat --chat-template " + file + " -p hi" + opts, true);
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.out.find("only one message, please"), std::string::npos) << refused.out;
  EXPECT_EQ(refused.out.find("loaded "), std::string::npos) << refused.out;
  // --system without --chat: refused by the option parser.
  EXPECT_NE(run_cli("run " + model + " --system x -p hi", true).status, 0);
  EXPECT_NE(run_cli("run " + model + " -n 3", true).out.find("--chat for a conversation"), std::string::npos);
}

// --chat without a prompt: a conversation on stdin, a message a line (empty lines skipped), each reply on
// its own line, the history rendered whole each turn: the template here writes the number of messages and
// the length of each reply so far, so that each turn's text is known without the replies' own text.
TEST_F(CliModel, ChatConversationOnStdin) {
  const std::string model = path("conversation");
  write_bpe_model(model, 16);
  const std::string file = path("t.jinja"), input = path("in.txt");
  std::ofstream(file) << "<sep>{{ messages|length }}:{% for m in messages %}{% if m.role == 'assistant' %}"
                         "{{ m.content|length }},{% endif %}{% endfor %}:{{ messages[-1].content }}<mask>";
  std::ofstream(input) << "hi\n\nyo\r\n";
  const std::string opts = " --no-stop -n 10 --temperature 2 --seed 9";
  const CliResult talk = run_cli("run " + model + " --chat --chat-template " + file + opts + " < " + input);
  ASSERT_EQ(talk.status, 0) << talk.out;
  const std::string first_text = "<sep>1::hi<mask>";
  const CliResult first = run_cli("run " + model + " -p '" + first_text + "'" + opts);
  ASSERT_EQ(first.status, 0) << first.out;
  const std::string reply1 = first.out.substr(first_text.size(), first.out.size() - first_text.size() - 1);
  size_t length = 0;  // in characters, as the template's |length counts
  for (const char c : reply1) length += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  const std::string second_text = "<sep>3:" + std::to_string(length) + ",:yo<mask>";
  const CliResult second = run_cli("run " + model + " -p '" + second_text + "'" + opts);
  ASSERT_EQ(second.status, 0) << second.out;
  EXPECT_EQ(talk.out, reply1 + "\n" + second.out.substr(second_text.size()));
  // A history past the context ends the conversation with the reason.
  std::string lots;
  for (int i = 0; i < 8; ++i) lots += "a long message of many words, again and again\n";
  std::ofstream(input) << lots;
  std::ofstream(file) << "{% for m in messages %}<sep>{{ m.content }}{% endfor %}<mask>";
  const CliResult full = run_cli("run " + model + " --chat --chat-template " + file + opts + " < " + input, true);
  EXPECT_NE(full.status, 0);
  EXPECT_NE(full.out.find("start a new one"), std::string::npos) << full.out;
}

// A conversation whose history the template renders as it grows: each turn prefills only what the KV
// cache does not hold (its timing line says how much was cached), and replies what the plain run of the
// rendered history replies (the CPU backend: the same bits).
TEST_F(CliModel, ChatConversationReusesTheCachedHistory) {
  const std::string model = path("reuse");
  write_bpe_model(model, 16);
  const std::string file = path("t.jinja"), input = path("in.txt");
  std::ofstream(file) << "{% for m in messages %}<sep>{{ m.content }}{% endfor %}<mask>";
  std::ofstream(input) << "hi\nyo\n";
  const std::string opts = " --no-stop -n 6 --temperature 2 --seed 9";
  const CliResult talk = run_cli("run " + model + " --chat --chat-template " + file + opts + " < " + input);
  const CliResult noted = run_cli("run " + model + " --chat --chat-template " + file + opts + " < " + input, true);
  ASSERT_EQ(talk.status, 0) << talk.out;
  const size_t nl = talk.out.find('\n');
  ASSERT_NE(nl, std::string::npos) << talk.out;
  const std::string reply1 = talk.out.substr(0, nl);
  const std::string second_text = "<sep>hi<sep>" + reply1 + "<sep>yo<mask>";
  const CliResult second = run_cli("run " + model + " -p '" + second_text + "'" + opts);
  ASSERT_EQ(second.status, 0) << second.out;
  EXPECT_EQ(talk.out.substr(nl + 1), second.out.substr(second_text.size()));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(noted.out, m, std::regex("prompt (\\d+) tokens \\((\\d+) of them cached\\)")))
      << noted.out;
  EXPECT_GT(std::stoll(m[2]), 2) << "the first turn's prompt at least: " << noted.out;
  EXPECT_LT(std::stoll(m[2]), std::stoll(m[1])) << noted.out;
}

// A tokenizer that puts EOS after a text (add_eos_token): eval scores it, as HF's tokenizer(text)
// ends the text with it, one token more predicted; run does not end the prompt with it, and says so.
TEST_F(CliModel, EosAfterATextIsScoredByEvalNotAddedToAPrompt) {
  const std::string model = path("eos_model");
  write_bpe_model(model, 13);
  const std::string text = path("t.txt");
  std::ofstream(text) << "hello world";
  const CliResult plain = run_cli("eval " + model + " " + text, true);
  ASSERT_EQ(plain.status, 0) << plain.out;
  std::ofstream(model + "/tokenizer_config.json") << R"({"eos_token": "<|endoftext|>", "add_eos_token": true})";
  const CliResult with_eos = run_cli("eval " + model + " " + text, true);
  ASSERT_EQ(with_eos.status, 0) << with_eos.out;
  auto predicted = [](const std::string& out) {  // "<file>: N tokens predicted in ..."
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, std::regex(": (\\d+) tokens? predicted"))) << out;
    return m.empty() ? -1 : std::stoll(m[1]);
  };
  EXPECT_EQ(predicted(with_eos.out), predicted(plain.out) + 1) << plain.out << "\n" << with_eos.out;
  const CliResult run = run_cli("run " + model + " -p hello -n 2", true);
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("note: this tokenizer puts token 0 after a text; a prompt to continue does not get it"),
            std::string::npos)
      << run.out;
}

// NaN in the weights: refused at load by default, naming the tensor; with the scan skipped, the
// NaN logits stop eval and run with an error (exit status 1), not a NaN perplexity or NUL bytes.
TEST_F(CliModel, NonFiniteWeightsFail) {
  io::ModelConfig c = tiny_config("relu", true);
  c.vocab_size = 258;
  c.max_position_embeddings = 64;
  HfTensors hf = random_hf_tensors(c, 11);
  hf["model.layers.1.mlp.gate_proj.weight"].ptr<float>()[0] = NAN;
  const std::string bad = path("nan_model");
  write_hf(bad, c, hf);
  const std::string text = path("t.txt");
  std::ofstream(text) << "some text to evaluate";
  const CliResult load = run_cli("eval " + bad + " " + text + " --byte-tokenizer --device cpu", true);
  EXPECT_NE(load.status, 0);
  EXPECT_NE(load.out.find("model.layers.1.mlp.gate_proj.weight"), std::string::npos) << load.out;
  EXPECT_NE(load.out.find("NaN"), std::string::npos) << load.out;
  // --check-finite wins over --no-check-finite, in either order.
  for (const char* flags : {"--no-check-finite --check-finite", "--check-finite --no-check-finite"}) {
    const CliResult both = run_cli("eval " + bad + " " + text + " --byte-tokenizer --device cpu " + flags, true);
    EXPECT_NE(both.out.find("model.layers.1.mlp.gate_proj.weight"), std::string::npos) << flags << ": " << both.out;
  }
  const CliResult eval = run_cli("eval " + bad + " " + text + " --byte-tokenizer --device cpu --no-check-finite", true);
  EXPECT_NE(eval.status, 0);
  EXPECT_NE(eval.out.find("not finite"), std::string::npos) << eval.out;
  const CliResult run = run_cli("run " + bad + " --byte-tokenizer --device cpu --no-check-finite -p hi -n 4", true);
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.out.find("not finite"), std::string::npos) << run.out;
}

// A config with fewer layers than the checkpoint runs the first layers (as HF does), and says so.
TEST_F(CliModel, ConfigWithFewerLayersWarns) {
  io::ModelConfig c = io::read_config(dir_);
  c.num_hidden_layers -= 1;
  io::write_config(dir_, c);
  const std::string text = path("t.txt");
  std::ofstream(text) << "some text";
  const CliResult r = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --device cpu", true);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("warning: the checkpoint holds 2 layers; config.json's num_hidden_layers = 1 runs only the first 1"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace twell::model
