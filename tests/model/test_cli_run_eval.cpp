// `twell run` and `twell eval` end to end on a tiny random model (byte tokenizer): generation
// streams text and stops at the token limit, eval prints a perplexity, bad input fails cleanly.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/io_test_util.h"
#include "model/llama_test_util.h"

namespace twell::model {
namespace {

struct CliResult {
  int status = -1;
  std::string out;
};

CliResult run_cli(const std::string& args) {
  CliResult r;
  FILE* p = popen((std::string(TWELL_CLI_PATH) + " " + args + " 2>/dev/null").c_str(), "r");
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
  EXPECT_EQ(r.out.rfind("hello", 0), 0u) << r.out;  // the prompt, then the continuation
  EXPECT_LE(r.out.size(), std::string("hello").size() + 7 + 1);
  const CliResult again = run_cli("run " + dir_ + " --byte-tokenizer --no-stop -p 'hello' -n 7 --temperature 0.8 --seed 3");
  EXPECT_EQ(again.out, r.out);  // seeded sampling is reproducible
}

TEST_F(CliModel, RunStopsAtTheContextLength) {
  const CliResult r = run_cli("run " + dir_ + " --byte-tokenizer --no-stop -p 'abc' -n 500");
  EXPECT_EQ(r.status, 0) << r.out;
}

TEST_F(CliModel, EvalPrintsPerplexity) {
  const std::string text = path("text.txt");
  std::ofstream(text) << "the quick brown fox jumps over the lazy dog. " << std::string(150, 'a');
  const CliResult r = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --context 32");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("perplexity"), std::string::npos) << r.out;
  const CliResult s = run_cli("eval " + dir_ + " " + text + " --byte-tokenizer --context 32 --sparsity");
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("nnz/token"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("\nmean "), std::string::npos) << s.out;
}

TEST_F(CliModel, MissingTokenizerAndBadModelFailCleanly) {
  EXPECT_NE(run_cli("run " + dir_ + " -p hi").status, 0);  // no tokenizer.json, no --byte-tokenizer
  EXPECT_NE(run_cli("run " + path("nothing") + " --byte-tokenizer -p hi").status, 0);
}

}  // namespace
}  // namespace twell::model
