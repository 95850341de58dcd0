// The C interface's models and tokenizers (twell/c_api.h) against the C++ calls they wrap, on the CPU
// backend: the same bits, the same tokens, and refusals that say why and leave nothing behind.
#include <gtest/gtest.h>
#include <pthread.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/io_test_util.h"
#include "model/llama_test_util.h"
#include "twell/c_api.h"
#include "twell/model/llama.h"
#include "twell/model/load.h"

namespace twell::model {
namespace {

std::string error_text() { return twell_last_error(); }

class CApiModel : public test::ScratchDirTest {
 protected:
  void SetUp() override {
    test::ScratchDirTest::SetUp();
    config_ = tiny_config("relu", false);
    write_hf(dir_, config_, random_hf_tensors(config_, 41));
  }

  // The model through the C interface on the CPU, with its log lines.
  twell_model* load(std::vector<std::string>* log = nullptr) {
    twell_model_options o;
    twell_model_options_init(&o);
    o.device = TWELL_CHOOSE_CPU;
    if (log != nullptr) {
      o.log = [](const char* line, void* user) { static_cast<std::vector<std::string>*>(user)->push_back(line); };
      o.log_user = log;
    }
    twell_model* m = nullptr;
    EXPECT_EQ(twell_model_load(dir_.c_str(), &o, &m), TWELL_OK) << error_text();
    return m;
  }

  LlamaCpu reference() const { return LlamaCpu(LlamaWeights::load_dir(dir_)); }

  io::ModelConfig config_;
  const std::vector<int32_t> prompt_ = {3, 14, 15, 92, 65, 35};
};

TEST_F(CApiModel, LogitsPrefillAndDecodeAreTheCppCallsBits) {
  std::vector<std::string> log;
  twell_model* m = load(&log);
  ASSERT_NE(m, nullptr);
  ASSERT_GE(log.size(), 2u);
  EXPECT_EQ(log.front().rfind("loaded " + dir_ + ": 2 layers, hidden 64, FFN 176 (relu)", 0), 0u) << log.front();
  EXPECT_EQ(log.back(), "backend: CPU reference");

  twell_model_info info;
  ASSERT_EQ(twell_model_get_info(m, &info), TWELL_OK);
  EXPECT_EQ(info.vocab_size, 97);
  EXPECT_EQ(info.hidden_size, 64);
  EXPECT_EQ(info.intermediate_size, 176);
  EXPECT_EQ(info.num_layers, 2);
  EXPECT_EQ(info.num_heads, 4);
  EXPECT_EQ(info.num_kv_heads, 2);
  EXPECT_EQ(info.head_dim, 16);
  EXPECT_EQ(info.context, 32);
  EXPECT_EQ(info.device, TWELL_DEVICE_CPU);
  EXPECT_EQ(info.relu, 1);

  LlamaCpu ref = reference();
  std::vector<ActivationStats> ref_stats;
  const Tensor expected = ref.logits(prompt_, &ref_stats);
  const int64_t T = static_cast<int64_t>(prompt_.size()), V = 97;
  std::vector<float> logits(T * V, std::nanf(""));
  twell_activation_stats stats[2];
  ASSERT_EQ(twell_model_logits(m, prompt_.data(), T, logits.data(), stats), TWELL_OK) << error_text();
  EXPECT_EQ(std::memcmp(logits.data(), expected.ptr<float>(), logits.size() * sizeof(float)), 0);
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(stats[l].tokens, T);
    EXPECT_EQ(stats[l].nnz, ref_stats[l].nnz);
    EXPECT_EQ(stats[l].l1_sum, ref_stats[l].l1_sum);
  }

  std::vector<float> last(V);
  ASSERT_EQ(twell_model_prefill(m, prompt_.data(), T - 1, last.data()), TWELL_OK) << error_text();
  ASSERT_EQ(twell_model_decode_step(m, prompt_.back(), last.data()), TWELL_OK) << error_text();
  EXPECT_EQ(std::memcmp(last.data(), ref.prefill(prompt_).ptr<float>(), V * sizeof(float)), 0);
  int64_t cached = 0;
  ASSERT_EQ(twell_model_cached_tokens(m, &cached), TWELL_OK);
  EXPECT_EQ(cached, T);
  ASSERT_EQ(twell_model_reset(m), TWELL_OK);
  ASSERT_EQ(twell_model_cached_tokens(m, &cached), TWELL_OK);
  EXPECT_EQ(cached, 0);

  double nll = 0, ppl = 0;
  ASSERT_EQ(twell_model_perplexity(m, prompt_.data(), T, &nll, &ppl), TWELL_OK) << error_text();
  const Perplexity p = perplexity(ref, prompt_);
  EXPECT_EQ(nll, p.mean_nll);
  EXPECT_EQ(ppl, p.perplexity);
  std::vector<double> losses(static_cast<size_t>(T - 1));
  ASSERT_EQ(twell_model_token_nll(m, prompt_.data(), T, losses.data()), TWELL_OK) << error_text();
  EXPECT_EQ(losses, ref.next_token_nll(prompt_));
  EXPECT_EQ(twell_model_token_nll(m, prompt_.data(), 1, losses.data()), TWELL_ERROR);
  EXPECT_NE(error_text().find("at least 2 tokens"), std::string::npos) << error_text();
  EXPECT_EQ(twell_model_token_nll(m, prompt_.data(), T, nullptr), TWELL_ERROR);

  // FFN statistics in windows: one window of the whole prompt is its forward's.
  std::vector<twell_activation_stats> windows(static_cast<size_t>(config_.num_hidden_layers));
  ASSERT_EQ(twell_model_ffn_stats(m, prompt_.data(), T, T, windows.data()), TWELL_OK) << error_text();
  for (size_t l = 0; l < windows.size(); ++l) {
    EXPECT_EQ(windows[l].tokens, ref_stats[l].tokens);
    EXPECT_EQ(windows[l].nnz, ref_stats[l].nnz);
    EXPECT_EQ(windows[l].max_nnz_per_token, ref_stats[l].max_nnz_per_token);
    EXPECT_EQ(windows[l].l1_sum, ref_stats[l].l1_sum);
  }
  // Windows of w tokens: each one's forward, summed, the last one's shorter (T = k·w + 1: one token).
  for (int64_t w : {int64_t{1}, int64_t{2}, T - 1, int64_t{3}}) {
    SCOPED_TRACE("window " + std::to_string(w));
    ASSERT_EQ(twell_model_ffn_stats(m, prompt_.data(), T, w, windows.data()), TWELL_OK) << error_text();
    std::vector<ActivationStats> sum(windows.size());
    for (int64_t a = 0; a < T; a += w) {
      std::vector<ActivationStats> part;
      ref.logits(std::vector<int32_t>(prompt_.begin() + a, prompt_.begin() + std::min(T, a + w)), &part);
      for (size_t l = 0; l < sum.size(); ++l) {
        sum[l].tokens += part[l].tokens, sum[l].nnz += part[l].nnz, sum[l].l1_sum += part[l].l1_sum;
        sum[l].max_nnz_per_token = std::max(sum[l].max_nnz_per_token, part[l].max_nnz_per_token);
      }
    }
    for (size_t l = 0; l < windows.size(); ++l) {
      EXPECT_EQ(windows[l].tokens, T);
      EXPECT_EQ(windows[l].nnz, sum[l].nnz);
      EXPECT_EQ(windows[l].max_nnz_per_token, sum[l].max_nnz_per_token);
      EXPECT_NEAR(windows[l].l1_sum, sum[l].l1_sum, 1e-9 * sum[l].l1_sum);
    }
  }
  ASSERT_EQ(twell_model_ffn_stats(m, prompt_.data(), 1, 8, windows.data()), TWELL_OK) << error_text();
  EXPECT_EQ(windows[0].tokens, 1);
  EXPECT_EQ(twell_model_ffn_stats(m, prompt_.data(), T, 0, windows.data()), TWELL_ERROR);
  EXPECT_NE(error_text().find("at least 1 token"), std::string::npos) << error_text();
  EXPECT_EQ(twell_model_ffn_stats(m, prompt_.data(), T, T, nullptr), TWELL_ERROR);
  EXPECT_NE(error_text().find("layer_stats is NULL"), std::string::npos) << error_text();
  twell_model_destroy(m);
}

TEST_F(CApiModel, GenerationDrawsTheCppTokensAndStopsWhereTheCallbackSays) {
  twell_model* m = load();
  ASSERT_NE(m, nullptr);
  LlamaCpu ref = reference();
  twell_sampling s;
  twell_sampling_init(&s);
  s.temperature = 0.8;
  s.top_k = 20;
  s.top_p = 0.9;
  s.seed = 7;
  s.vocab_limit = 90;
  s.min_p = 0.05;
  s.repetition_penalty = 1.25;
  SamplingOptions so;
  so.temperature = 0.8;
  so.top_k = 20;
  so.top_p = 0.9;
  so.seed = 7;
  so.vocab_limit = 90;
  so.min_p = 0.05;
  so.repetition_penalty = 1.25;
  const Generation expected = generate(ref, prompt_, 10, so);

  std::vector<int32_t> tokens(10, -1), seen;
  twell_generation g;
  const twell_token_fn record = [](int32_t t, void* user) {
    static_cast<std::vector<int32_t>*>(user)->push_back(t);
    return 0;
  };
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), 6, 10, &s, nullptr, 0, record, &seen, tokens.data(), &g),
            TWELL_OK)
      << error_text();
  EXPECT_EQ(g.reason, TWELL_STOP_MAX_TOKENS);
  ASSERT_EQ(g.n_tokens, 10);
  EXPECT_EQ(tokens, expected.tokens);
  EXPECT_EQ(seen, expected.tokens);
  // A repetition penalty of 0, what a caller built before the field leaves in that word, is off, as 1 is.
  for (const double off : {0.0, 1.0}) {
    twell_sampling plain = s;
    plain.repetition_penalty = off;
    SamplingOptions plain_so = so;
    plain_so.repetition_penalty = 1.0;
    ASSERT_EQ(twell_model_generate(m, prompt_.data(), 6, 10, &plain, nullptr, 0, nullptr, nullptr, tokens.data(), &g),
              TWELL_OK);
    EXPECT_EQ(tokens, generate(ref, prompt_, 10, plain_so).tokens) << off;
  }

  // A stop token (a callback asking to stop at it too: still TWELL_STOP_TOKEN), then a callback that
  // asks to stop after the third token.
  const int32_t stop[] = {expected.tokens[4]};
  const twell_token_fn always = [](int32_t, void*) { return 1; };
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), 6, 10, &s, stop, 1, nullptr, nullptr, tokens.data(), &g),
            TWELL_OK);
  EXPECT_EQ(g.reason, TWELL_STOP_TOKEN);
  EXPECT_LE(g.n_tokens, 5);
  EXPECT_EQ(tokens[g.n_tokens - 1], stop[0]);
  const int32_t no_token[] = {-7};  // refused: no token has it
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), 6, 10, &s, no_token, 1, nullptr, nullptr, tokens.data(), &g),
            TWELL_ERROR);
  EXPECT_NE(error_text().find("(stop tokens): -7 is not a token id"), std::string::npos) << error_text();
  const int32_t first_stop[] = {expected.tokens[0]};
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), 6, 10, &s, first_stop, 1, always, nullptr, tokens.data(), &g),
            TWELL_OK);
  EXPECT_EQ(g.reason, TWELL_STOP_TOKEN);
  EXPECT_EQ(g.n_tokens, 1);
  int count = 0;
  const twell_token_fn third = [](int32_t, void* user) { return ++*static_cast<int*>(user) == 3 ? 1 : 0; };
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), 6, 10, &s, nullptr, 0, third, &count, tokens.data(), &g),
            TWELL_OK);
  EXPECT_EQ(g.reason, TWELL_STOP_CALLBACK);
  ASSERT_EQ(g.n_tokens, 3);
  EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.begin() + 3),
            std::vector<int32_t>(expected.tokens.begin(), expected.tokens.begin() + 3));
  EXPECT_GE(g.prefill_seconds, 0);
  EXPECT_GE(g.decode_seconds, 0);

  // Greedy by default (sampling NULL), as model::generate with default options.
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), 6, 4, nullptr, nullptr, 0, nullptr, nullptr, tokens.data(), &g),
            TWELL_OK);
  const Generation greedy = generate(ref, prompt_, 4, {});
  EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.begin() + 4), greedy.tokens);
  twell_model_destroy(m);
}

// Prefix reuse (twell_model_set_prefix_reuse): a conversation's second turn takes the first turn's
// positions from the cache and draws the C++ tokens of its whole prompt (the CPU: the same bits);
// anything else on the model in between (a prefill), or reuse off, takes none.
TEST_F(CApiModel, PrefixReuseTakesTheCachedTurnAndDrawsTheSameTokens) {
  twell_model* m = load();
  ASSERT_NE(m, nullptr);
  LlamaCpu ref = reference();
  std::vector<int32_t> tokens(5, -1);
  twell_generation g;
  ASSERT_EQ(twell_model_set_prefix_reuse(m, 1), TWELL_OK);
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), 6, 5, nullptr, nullptr, 0, nullptr, nullptr, tokens.data(), &g),
            TWELL_OK)
      << error_text();
  EXPECT_EQ(g.reused, 0);
  std::vector<int32_t> turn = prompt_;
  turn.insert(turn.end(), tokens.begin(), tokens.end());
  turn.insert(turn.end(), {7, 8, 9});
  for (const bool reuse : {true, false}) {
    ASSERT_EQ(twell_model_set_prefix_reuse(m, reuse ? 1 : 0), TWELL_OK);
    if (reuse) {  // the first turn again, then the second
      ASSERT_EQ(twell_model_generate(m, prompt_.data(), 6, 5, nullptr, nullptr, 0, nullptr, nullptr, tokens.data(), &g),
                TWELL_OK);
    }
    std::vector<int32_t> second(4, -1);
    ASSERT_EQ(twell_model_generate(m, turn.data(), int64_t(turn.size()), 4, nullptr, nullptr, 0, nullptr, nullptr,
                                   second.data(), &g),
              TWELL_OK)
        << error_text();
    EXPECT_EQ(g.reused, reuse ? 6 + 5 - 1 : 0);
    EXPECT_EQ(second, generate(ref, turn, 4, {}).tokens);
  }
  ASSERT_EQ(twell_model_set_prefix_reuse(m, 1), TWELL_OK);
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), 6, 5, nullptr, nullptr, 0, nullptr, nullptr, tokens.data(), &g),
            TWELL_OK);
  std::vector<float> logits(size_t(config_.vocab_size));
  ASSERT_EQ(twell_model_prefill(m, turn.data(), 3, logits.data()), TWELL_OK);
  ASSERT_EQ(twell_model_generate(m, turn.data(), int64_t(turn.size()), 4, nullptr, nullptr, 0, nullptr, nullptr,
                                 tokens.data(), &g),
            TWELL_OK);
  EXPECT_EQ(g.reused, 0) << "a prefill ran in between";
  EXPECT_EQ(twell_model_set_prefix_reuse(nullptr, 1), TWELL_ERROR);
  twell_model_destroy(m);
}

// A twell_sampling completed from generation_config.json as model::with_generation_config does: the
// fields given kept; nothing taken where there is no file; a value taken out of range refused, leaving
// *sampling as it was.
TEST_F(CApiModel, GenerationSamplingCompletesFromTheGenerationConfig) {
  twell_model* m = load();
  ASSERT_NE(m, nullptr);
  twell_sampling s;
  twell_sampling_init(&s);
  uint32_t taken = 99;
  const char* unapplied = nullptr;
  ASSERT_EQ(twell_model_generation_sampling(m, &s, 0, &taken, &unapplied), TWELL_OK) << error_text();
  EXPECT_EQ(taken, 0u);
  EXPECT_STREQ(unapplied, "");
  EXPECT_EQ(s.temperature, 0);
  twell_model_destroy(m);
  test::write_file(dir_ + "/generation_config.json", R"({"do_sample": true, "temperature": 0.7, "min_p": 0.1,
      "repetition_penalty": 1.1, "num_beams": 2})");
  m = load();
  ASSERT_NE(m, nullptr);
  twell_sampling_init(&s);
  s.seed = 5;
  s.top_p = 0.5;
  ASSERT_EQ(twell_model_generation_sampling(m, &s, TWELL_SAMPLE_TOP_P, &taken, &unapplied), TWELL_OK) << error_text();
  EXPECT_EQ(taken, unsigned{TWELL_SAMPLE_TEMPERATURE | TWELL_SAMPLE_TOP_K | TWELL_SAMPLE_MIN_P |
                            TWELL_SAMPLE_REPETITION_PENALTY});
  EXPECT_STREQ(unapplied, "num_beams 2");
  EXPECT_EQ(s.temperature, 0.7);
  EXPECT_EQ(s.top_k, 50);
  EXPECT_EQ(s.top_p, 0.5);  // given
  EXPECT_EQ(s.min_p, 0.1);
  EXPECT_EQ(s.repetition_penalty, 1.1);
  EXPECT_EQ(s.seed, 5u);
  EXPECT_EQ(twell_model_generation_sampling(m, nullptr, 0, nullptr, nullptr), TWELL_ERROR);
  EXPECT_NE(error_text().find("sampling is NULL"), std::string::npos) << error_text();
  EXPECT_EQ(twell_model_generation_sampling(m, &s, 64, nullptr, nullptr), TWELL_ERROR);
  EXPECT_NE(error_text().find("no TWELL_SAMPLE_ field"), std::string::npos) << error_text();
  twell_model_destroy(m);
  test::write_file(dir_ + "/generation_config.json", R"({"do_sample": true, "temperature": -1})");
  m = load();
  ASSERT_NE(m, nullptr);
  twell_sampling_init(&s);
  s.top_k = 77;
  EXPECT_EQ(twell_model_generation_sampling(m, &s, 0, nullptr, nullptr), TWELL_ERROR);
  EXPECT_NE(error_text().find("generation_config.json: temperature must be finite and >= 0"), std::string::npos)
      << error_text();
  EXPECT_EQ(s.top_k, 77);
  s.temperature = 0.5;  // given: the file's bad temperature is not taken
  EXPECT_EQ(twell_model_generation_sampling(m, &s, TWELL_SAMPLE_TEMPERATURE, nullptr, nullptr), TWELL_OK)
      << error_text();
  twell_model_destroy(m);
}

// A batch of prompts of different lengths: model::generate_batch's tokens, laid out max_new_tokens
// a sequence; a callback that stops one sequence; offsets that do not describe prompts are refused.
TEST_F(CApiModel, BatchGenerationIsTheCppBatch) {
  twell_model* m = load();
  ASSERT_NE(m, nullptr);
  twell_model_info info;
  ASSERT_EQ(twell_model_get_info(m, &info), TWELL_OK);
  EXPECT_EQ(info.max_batch, LlamaCpu::kMaxBatch);
  LlamaCpu ref = reference();
  const std::vector<int32_t> flat = {3, 14, 15, 92, 65, 35, 7, 8, 9};
  const int64_t offsets[] = {0, 6, 7, 9};
  const std::vector<std::vector<int32_t>> prompts = {{3, 14, 15, 92, 65, 35}, {7}, {8, 9}};
  twell_sampling s;
  twell_sampling_init(&s);
  s.temperature = 0.8;
  s.seed = 5;
  SamplingOptions so;
  so.temperature = 0.8;
  so.seed = 5;
  const std::vector<Generation> expected = generate_batch(ref, prompts, 5, so);
  std::vector<int32_t> tokens(15, -1);
  twell_generation g[3];
  ASSERT_EQ(twell_model_generate_batch(m, flat.data(), offsets, 3, 5, &s, nullptr, 0, nullptr, nullptr, tokens.data(), g),
            TWELL_OK)
      << error_text();
  for (int b = 0; b < 3; ++b) {
    ASSERT_EQ(g[b].n_tokens, 5) << b;
    EXPECT_EQ(g[b].reason, TWELL_STOP_MAX_TOKENS);
    EXPECT_EQ(std::vector<int32_t>(tokens.begin() + b * 5, tokens.begin() + b * 5 + 5), expected[b].tokens) << b;
  }
  const twell_batch_token_fn second = [](int64_t b, int32_t, void*) { return b == 1 ? 1 : 0; };
  ASSERT_EQ(twell_model_generate_batch(m, flat.data(), offsets, 3, 5, &s, nullptr, 0, second, nullptr, tokens.data(), g),
            TWELL_OK);
  EXPECT_EQ(g[1].reason, TWELL_STOP_CALLBACK);
  EXPECT_EQ(g[1].n_tokens, 1);
  EXPECT_EQ(g[2].n_tokens, 5);
  const int64_t empty[] = {0, 6, 6, 9}, shifted[] = {1, 6, 7, 9};
  EXPECT_EQ(twell_model_generate_batch(m, flat.data(), empty, 3, 5, &s, nullptr, 0, nullptr, nullptr, tokens.data(), g),
            TWELL_ERROR);
  EXPECT_NE(error_text().find("prompt 1 is empty"), std::string::npos) << error_text();
  EXPECT_EQ(g[0].n_tokens, 5);  // a refused call writes nothing
  EXPECT_EQ(
      twell_model_generate_batch(m, flat.data(), shifted, 3, 5, &s, nullptr, 0, nullptr, nullptr, tokens.data(), g),
      TWELL_ERROR);
  EXPECT_EQ(twell_model_generate_batch(m, flat.data(), offsets, 0, 5, &s, nullptr, 0, nullptr, nullptr, tokens.data(), g),
            TWELL_ERROR);
  EXPECT_EQ(twell_model_generate_batch(m, nullptr, offsets, 3, 5, &s, nullptr, 0, nullptr, nullptr, tokens.data(), g),
            TWELL_ERROR);
  twell_model_destroy(m);
}

TEST_F(CApiModel, BadModelsAndArgumentsAreRefusedWithTheReason) {
  twell_model* m = reinterpret_cast<twell_model*>(&config_);  // must come back NULL
  EXPECT_EQ(twell_model_load((dir_ + "/missing").c_str(), nullptr, &m), TWELL_ERROR);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(error_text().find(dir_ + "/missing"), std::string::npos) << error_text();

  twell_model_options o;
  twell_model_options_init(&o);
  o.device = TWELL_CHOOSE_CPU;
  o.reserved[0] = 1;
  EXPECT_EQ(twell_model_load(dir_.c_str(), &o, &m), TWELL_ERROR);
  EXPECT_NE(error_text().find("reserved fields must be 0"), std::string::npos) << error_text();
  twell_model_options_init(&o);
  o.device = TWELL_CHOOSE_CPU;
  o.max_batch = -1;
  EXPECT_EQ(twell_model_load(dir_.c_str(), &o, &m), TWELL_ERROR);
  EXPECT_NE(error_text().find("max_batch must lie in [0, 65535]"), std::string::npos) << error_text();
  twell_model_options_init(&o);
  o.device = TWELL_CHOOSE_CPU;
  o.max_batch = 4;
  for (int64_t bad : {int64_t{-1}, int64_t{3}}) {
    o.max_tokens = bad;
    EXPECT_EQ(twell_model_load(dir_.c_str(), &o, &m), TWELL_ERROR);
    EXPECT_NE(error_text().find(bad < 0 ? "max_tokens must be at least 0" : "max_tokens must be at least the most sequences a call takes (4"),
              std::string::npos)
        << error_text();
  }
  twell_model_options_init(&o);
  o.device = 7;
  EXPECT_EQ(twell_model_load(dir_.c_str(), &o, &m), TWELL_ERROR);
  EXPECT_NE(error_text().find("device must be TWELL_CHOOSE_AUTO, _CPU or _CUDA, got 7"), std::string::npos);
  char why[256];
  if (!twell_cuda_available(why, sizeof why)) {
    twell_model_options_init(&o);
    o.device = TWELL_CHOOSE_CUDA;
    EXPECT_EQ(twell_model_load(dir_.c_str(), &o, &m), TWELL_ERROR);
    EXPECT_EQ(error_text().rfind("device cuda: ", 0), 0u) << error_text();
  }

  // NaN in a weight: refused by default, naming the tensor; taken with check_finite 0.
  HfTensors t = random_hf_tensors(config_, 41);
  t["model.layers.1.mlp.up_proj.weight"].ptr<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  write_hf(dir_, config_, t);
  twell_model_options_init(&o);
  o.device = TWELL_CHOOSE_CPU;
  EXPECT_EQ(twell_model_load(dir_.c_str(), &o, &m), TWELL_ERROR);
  EXPECT_NE(error_text().find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << error_text();
  o.check_finite = 0;
  ASSERT_EQ(twell_model_load(dir_.c_str(), &o, &m), TWELL_OK) << error_text();

  // Ids outside the vocabulary, an empty prompt, NULL buffers: refused, the cache untouched.
  std::vector<float> logits(97 * 3);
  const int32_t bad[] = {1, 97, 2};
  EXPECT_EQ(twell_model_decode_step(m, 1, logits.data()), TWELL_ERROR);  // before any prefill
  ASSERT_EQ(twell_model_prefill(m, bad, 1, logits.data()), TWELL_OK) << error_text();
  EXPECT_EQ(twell_model_logits(m, bad, 3, logits.data(), nullptr), TWELL_ERROR);
  EXPECT_NE(error_text().find("97"), std::string::npos) << error_text();
  EXPECT_EQ(twell_model_prefill(m, bad, 0, logits.data()), TWELL_ERROR);
  EXPECT_EQ(twell_model_logits(m, bad, 1, nullptr, nullptr), TWELL_ERROR);
  EXPECT_NE(error_text().find("logits buffer is NULL"), std::string::npos) << error_text();
  EXPECT_EQ(twell_model_decode_step(m, 97, logits.data()), TWELL_ERROR);
  EXPECT_EQ(twell_model_decode_step(m, 2, nullptr), TWELL_ERROR);
  int64_t cached = -1;
  ASSERT_EQ(twell_model_cached_tokens(m, &cached), TWELL_OK);
  EXPECT_EQ(cached, 1);
  twell_sampling s;
  twell_sampling_init(&s);
  s.top_p = 0;
  twell_generation g;
  int32_t out[4];
  EXPECT_EQ(twell_model_generate(m, bad, 1, 4, &s, nullptr, 0, nullptr, nullptr, out, &g), TWELL_ERROR);
  EXPECT_NE(error_text().find("top_p"), std::string::npos) << error_text();
  twell_sampling_init(&s);
  s.min_p = 2;
  EXPECT_EQ(twell_model_generate(m, bad, 1, 4, &s, nullptr, 0, nullptr, nullptr, out, &g), TWELL_ERROR);
  EXPECT_NE(error_text().find("min_p must be in [0, 1]"), std::string::npos) << error_text();
  twell_sampling_init(&s);
  s.repetition_penalty = -1;
  EXPECT_EQ(twell_model_generate(m, bad, 1, 4, &s, nullptr, 0, nullptr, nullptr, out, &g), TWELL_ERROR);
  EXPECT_NE(error_text().find("repetition_penalty must be finite and > 0"), std::string::npos) << error_text();
  twell_sampling_init(&s);
  s.reserved[0] = 1;
  EXPECT_EQ(twell_model_generate(m, bad, 1, 4, &s, nullptr, 0, nullptr, nullptr, out, &g), TWELL_ERROR);
  EXPECT_NE(error_text().find("reserved fields must be 0"), std::string::npos) << error_text();
  EXPECT_EQ(twell_model_generate(m, bad, 1, -1, nullptr, nullptr, 0, nullptr, nullptr, out, &g), TWELL_ERROR);
  EXPECT_EQ(twell_model_get_info(nullptr, nullptr), TWELL_ERROR);
  EXPECT_NE(error_text().find("twell_model: NULL"), std::string::npos) << error_text();
  twell_model_destroy(m);
  twell_model_destroy(nullptr);
}

// A thread that ends inside a token callback (pthread_exit, a forced unwind; Python's daemon threads at
// exit) ends: the C API's exception barrier lets the unwind through rather than swallowing it, which
// aborted the process ("FATAL: exception not rethrown"), and the model is usable after.
// Chat templates through the C interface: the C++ ChatTemplate's text, its description and special tokens; a
// directory without a template gives NULL, bad arguments and a template's refusal an error, and a failed
// apply leaves the last text as it was.
TEST_F(CApiModel, ChatTemplates) {
  twell_chat_template* none = reinterpret_cast<twell_chat_template*>(this);
  ASSERT_EQ(twell_chat_template_load(dir_.c_str(), nullptr, nullptr, 0, &none), TWELL_OK) << error_text();
  EXPECT_EQ(none, nullptr);  // the test model has no template
  EXPECT_EQ(twell_chat_template_load(nullptr, nullptr, nullptr, 0, &none), TWELL_ERROR);
  test::write_file(path("tokenizer_config.json"),
                   R"({"eos_token": "</s>", "chat_template": "{% for m in messages %}{{ m.content }}{{ eos_token }})"
                   R"({% endfor %}{% if add_generation_prompt %}>{% endif %}"})");
  twell_chat_template* t = nullptr;
  ASSERT_EQ(twell_chat_template_load(dir_.c_str(), nullptr, nullptr, 0, &t), TWELL_OK) << error_text();
  ASSERT_NE(t, nullptr);
  const char* text = nullptr;
  size_t len = 0;
  ASSERT_EQ(twell_chat_template_apply(t, R"([{"role": "user", "content": "hi"}])", 1, nullptr, &text, &len), TWELL_OK)
      << error_text();
  EXPECT_EQ(std::string(text, len), "hi</s>>");
  EXPECT_EQ(twell_chat_template_apply(t, "[1]", 1, nullptr, &text, &len), TWELL_ERROR);
  EXPECT_NE(error_text().find("JSON object"), std::string::npos) << error_text();
  EXPECT_EQ(std::string(text, len), "hi</s>>");  // unchanged
  const char* source = nullptr;
  size_t source_len = 0;
  ASSERT_EQ(twell_chat_template_describe(t, &source, &source_len, nullptr, nullptr), TWELL_OK);
  EXPECT_EQ(std::string(source, source_len), path("tokenizer_config.json") + " (chat_template)");
  EXPECT_EQ(twell_chat_template_describe(t, &source, nullptr, nullptr, nullptr), TWELL_ERROR);
  char json[64];
  ASSERT_EQ(twell_chat_template_special_tokens(dir_.c_str(), json, sizeof json, &len), TWELL_OK);
  EXPECT_EQ(std::string(json, len), R"({"eos_token":"</s>"})");
  EXPECT_EQ(twell_chat_template_special_tokens((dir_ + "/missing").c_str(), json, sizeof json, &len), TWELL_ERROR);
  EXPECT_NE(error_text().find("missing: not a directory"), std::string::npos) << error_text();
  twell_chat_template_destroy(t);
  twell_chat_template* own = nullptr;
  ASSERT_EQ(twell_chat_template_create("{{ raise_exception('no') }}", nullptr, &own), TWELL_OK);
  EXPECT_EQ(twell_chat_template_apply(own, "[]", 0, nullptr, &text, &len), TWELL_ERROR);
  EXPECT_NE(error_text().find("the template refused the input: no"), std::string::npos) << error_text();
  twell_chat_template_destroy(own);
  EXPECT_EQ(twell_chat_template_create("{% if %}", nullptr, &own), TWELL_ERROR);
  EXPECT_EQ(own, nullptr);
  twell_chat_template_destroy(nullptr);
}

TEST_F(CApiModel, AThreadEndingInsideATokenCallbackEnds) {
  twell_model* m = load();
  ASSERT_NE(m, nullptr);
  struct Job {
    twell_model* m;
    const std::vector<int32_t>* prompt;
    int calls = 0;
  } job{m, &prompt_};
  pthread_t thread;
  ASSERT_EQ(pthread_create(
                &thread, nullptr,
                [](void* p) -> void* {
                  Job& j = *static_cast<Job*>(p);
                  std::vector<int32_t> out(8);
                  twell_generation g;
                  twell_model_generate(j.m, j.prompt->data(), static_cast<int64_t>(j.prompt->size()), 8, nullptr, nullptr,
                                       0,
                                       [](int32_t, void* user) -> int {
                                         if (++*static_cast<int*>(user) == 2) pthread_exit(nullptr);
                                         return 0;
                                       },
                                       &j.calls, out.data(), &g);
                  return p;  // not reached
                },
                &job),
            0);
  void* result = &job;
  ASSERT_EQ(pthread_join(thread, &result), 0);
  EXPECT_EQ(result, nullptr);  // pthread_exit's value: the thread ended in the callback
  EXPECT_EQ(job.calls, 2);
  std::vector<int32_t> out(4);
  twell_generation g;
  EXPECT_EQ(twell_model_generate(m, prompt_.data(), static_cast<int64_t>(prompt_.size()), 4, nullptr, nullptr, 0,
                                 nullptr, nullptr, out.data(), &g),
            TWELL_OK)
      << error_text();
  twell_model_destroy(m);
}

// A token callback that calls its own generating model is refused (it would change the cache under
// the generation), and the generation goes on as without it; after a generation the cache holds all
// but the last token, which a decode step continues; after a batch a decode step is refused in the
// C call's words; bad prompts are named as the C call's; the CPU's threads are set through the C API.
TEST_F(CApiModel, CallbacksCannotReenterAndTheCacheAfterAGenerationIsSaid) {
  twell_model* m = load();
  ASSERT_NE(m, nullptr);
  const int64_t T = static_cast<int64_t>(prompt_.size());
  std::vector<int32_t> plain(4, -1), reentered(4, -1);
  twell_generation g;
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), T, 4, nullptr, nullptr, 0, nullptr, nullptr, plain.data(), &g),
            TWELL_OK);
  struct Seen {
    twell_model* m;
    std::vector<int> status;
    std::string error;
  } seen{m, {}, {}};
  const twell_token_fn reenter = [](int32_t, void* user) {
    Seen& s = *static_cast<Seen*>(user);
    const int32_t ids[] = {5, 6};
    std::vector<int32_t> out(2);
    twell_generation inner;
    s.status.push_back(twell_model_generate(s.m, ids, 2, 2, nullptr, nullptr, 0, nullptr, nullptr, out.data(), &inner));
    s.status.push_back(twell_model_reset(s.m));
    s.error = twell_last_error();
    return 0;
  };
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), T, 4, nullptr, nullptr, 0, reenter, &seen, reentered.data(), &g),
            TWELL_OK)
      << error_text();
  EXPECT_EQ(reentered, plain);
  EXPECT_EQ(seen.status, std::vector<int>(8, TWELL_ERROR));
  EXPECT_NE(seen.error.find("called from this model's token callback"), std::string::npos) << seen.error;
  int64_t cached = -1;
  ASSERT_EQ(twell_model_cached_tokens(m, &cached), TWELL_OK);
  EXPECT_EQ(cached, T + 4 - 1);  // the prompt and every new token but the last
  std::vector<float> logits(97);
  EXPECT_EQ(twell_model_decode_step(m, plain[3], logits.data()), TWELL_OK) << error_text();

  // a refused generate writes nothing; its bad prompt id is named as the C call's
  const int32_t bad[] = {3, 97};
  g.n_tokens = 42;
  EXPECT_EQ(twell_model_generate(m, bad, 2, 4, nullptr, nullptr, 0, nullptr, nullptr, plain.data(), &g), TWELL_ERROR);
  EXPECT_NE(error_text().find("twell_model_generate: prompt: token 97 at index 1"), std::string::npos) << error_text();
  EXPECT_EQ(g.n_tokens, 42);
  const std::vector<int32_t> long_prompt(33, 1);  // the model's context is 32
  EXPECT_EQ(twell_model_generate(m, long_prompt.data(), 33, 1, nullptr, nullptr, 0, nullptr, nullptr, plain.data(), &g),
            TWELL_ERROR);
  EXPECT_NE(error_text().find("twell_model_generate: prompt of 33 tokens exceeds the model's context of 32"),
            std::string::npos)
      << error_text();

  // after a batch, a decode step of one token is refused in the C API's words
  const int32_t flat[] = {3, 14, 7};
  const int64_t offsets[] = {0, 2, 3};
  std::vector<int32_t> tokens(4);
  twell_generation gs[2];
  ASSERT_EQ(twell_model_generate_batch(m, flat, offsets, 2, 2, nullptr, nullptr, 0, nullptr, nullptr, tokens.data(), gs),
            TWELL_OK);
  EXPECT_EQ(twell_model_decode_step(m, 1, logits.data()), TWELL_ERROR);
  EXPECT_NE(error_text().find("twell_model_decode_step: the KV cache holds the 2 sequences of "
                              "twell_model_generate_batch"),
            std::string::npos)
      << error_text();
  EXPECT_EQ(twell_model_prefill(m, flat, 0, logits.data()), TWELL_ERROR);
  EXPECT_NE(error_text().find("twell_model_prefill: need at least 1 token, got 0"), std::string::npos) << error_text();

  // more prompts than the model batches: refused in the C call's words, results untouched
  const int64_t too_many = LlamaCpu::kMaxBatch + 1;
  std::vector<int32_t> ones(static_cast<size_t>(too_many), 1);
  std::vector<int64_t> each(static_cast<size_t>(too_many + 1));
  for (int64_t b = 0; b <= too_many; ++b) each[static_cast<size_t>(b)] = b;
  std::vector<twell_generation> untouched(static_cast<size_t>(too_many));
  untouched[0].n_tokens = 42;
  EXPECT_EQ(twell_model_generate_batch(m, ones.data(), each.data(), too_many, 1, nullptr, nullptr, 0, nullptr, nullptr,
                                       ones.data(), untouched.data()),
            TWELL_ERROR);
  EXPECT_NE(error_text().find("twell_model_generate_batch: 65536 prompts exceed the model's max_batch of 65535"),
            std::string::npos)
      << error_text();
  EXPECT_EQ(untouched[0].n_tokens, 42);
  // destroying the model from its own callback leaves it alone (the generation still runs on it)
  const twell_token_fn destroy = [](int32_t, void* user) {
    twell_model_destroy(static_cast<twell_model*>(user));
    return 1;
  };
  ASSERT_EQ(twell_model_generate(m, prompt_.data(), T, 2, nullptr, nullptr, 0, destroy, m, plain.data(), &g), TWELL_OK);
  EXPECT_EQ(g.reason, TWELL_STOP_CALLBACK);
  ASSERT_EQ(twell_model_cached_tokens(m, &cached), TWELL_OK);

  // threads: the same bits with one as with the default
  std::vector<float> one(T * 97), many(T * 97);
  int32_t previous = -1;
  ASSERT_EQ(twell_cpu_set_num_threads(1, &previous), TWELL_OK);
  ASSERT_EQ(twell_model_logits(m, prompt_.data(), T, one.data(), nullptr), TWELL_OK);
  ASSERT_EQ(twell_cpu_set_num_threads(previous, nullptr), TWELL_OK);
  ASSERT_EQ(twell_model_logits(m, prompt_.data(), T, many.data(), nullptr), TWELL_OK);
  EXPECT_EQ(one, many);
  EXPECT_EQ(twell_cpu_set_num_threads(-1, nullptr), TWELL_ERROR);
  twell_model_destroy(m);
}

TEST_F(CApiModel, TokenizersEncodeAndDecodeAsTheCppOnes) {
  twell_tokenizer* t = nullptr;
  EXPECT_EQ(twell_tokenizer_load(dir_.c_str(), 0, 0, &t), TWELL_ERROR);  // this model ships none
  EXPECT_EQ(t, nullptr);
  EXPECT_NE(error_text().find("tokenizer.json"), std::string::npos) << error_text();
  EXPECT_EQ(twell_tokenizer_load(dir_.c_str(), 97, 1, &t), TWELL_ERROR);  // 258 ids do not fit 97 rows
  EXPECT_NE(error_text().find("the tokenizer has 258 ids (its last id, 257, is '<eos>') but the model's vocabulary "
                              "is 97"),
            std::string::npos)
      << error_text();
  ASSERT_EQ(twell_tokenizer_load(nullptr, 0, 1, &t), TWELL_OK) << error_text();
  twell_tokenizer_info info;
  ASSERT_EQ(twell_tokenizer_get_info(t, &info), TWELL_OK);
  EXPECT_EQ(info.vocab_size, 258);
  EXPECT_EQ(info.bos_id, 256);
  EXPECT_EQ(info.eos_id, 257);
  EXPECT_EQ(info.bos_to_add, 256);
  EXPECT_EQ(info.eos_to_add, -1);

  const std::string text = "héllo";
  int64_t n = 0;
  ASSERT_EQ(twell_tokenizer_encode(t, text.data(), text.size(), nullptr, 0, &n), TWELL_OK);  // the count alone
  ASSERT_EQ(n, 6);
  std::vector<int32_t> ids(n);
  ASSERT_EQ(twell_tokenizer_encode(t, text.data(), text.size(), ids.data(), n, &n), TWELL_OK);
  EXPECT_EQ(ids, ByteTokenizer(true, true).encode(text));
  size_t len = 0;
  ASSERT_EQ(twell_tokenizer_decode(t, ids.data(), n, nullptr, 0, &len), TWELL_OK);  // the length alone
  EXPECT_EQ(len, text.size());
  char buf[4];
  ASSERT_EQ(twell_tokenizer_decode(t, ids.data(), n, buf, sizeof buf, &len), TWELL_OK);  // cut at the room
  EXPECT_EQ(len, text.size());
  EXPECT_EQ(std::string(buf, 4), text.substr(0, 4));
  std::string back(len, '\0');
  ASSERT_EQ(twell_tokenizer_decode(t, ids.data(), n, back.data(), back.size(), &len), TWELL_OK);
  EXPECT_EQ(back, text);
  const int32_t unknown[] = {300};
  EXPECT_EQ(twell_tokenizer_decode(t, unknown, 1, buf, sizeof buf, &len), TWELL_ERROR);
  EXPECT_NE(error_text().find("300"), std::string::npos) << error_text();
  twell_tokenizer_destroy(t);
  twell_tokenizer_destroy(nullptr);
}

// A text stream gives whole characters (é's two bytes come with its second id), nothing for a stop
// id, and at finish U+FFFD for a character that never ended; bad arguments are refused.
TEST_F(CApiModel, TextStreamsGiveWholeCharacters) {
  twell_tokenizer* t = nullptr;
  ASSERT_EQ(twell_tokenizer_load(nullptr, 0, 1, &t), TWELL_OK) << error_text();
  const int32_t context[] = {256, 'a'}, stops[] = {257};
  twell_text_stream* s = nullptr;
  ASSERT_EQ(twell_text_stream_create(t, context, 2, stops, 1, &s), TWELL_OK) << error_text();
  auto put = [&](int32_t id) {
    const char* text = nullptr;
    size_t len = 0;
    EXPECT_EQ(twell_text_stream_put(s, id, &text, &len), TWELL_OK) << error_text();
    return std::string(text, len);
  };
  EXPECT_EQ(put('b'), "b");
  EXPECT_EQ(put(0xC3), "");
  EXPECT_EQ(put(0xA9), "\xc3\xa9");
  EXPECT_EQ(put(257), "");  // a stop id
  EXPECT_EQ(put(0xE4), "");
  const char* text = nullptr;
  size_t len = 0;
  ASSERT_EQ(twell_text_stream_finish(s, &text, &len), TWELL_OK);
  EXPECT_EQ(std::string(text, len), "\xef\xbf\xbd");
  ASSERT_EQ(twell_text_stream_finish(s, &text, &len), TWELL_OK);
  EXPECT_EQ(len, 0u);
  EXPECT_EQ(twell_text_stream_put(s, 'c', nullptr, &len), TWELL_ERROR);
  EXPECT_NE(error_text().find("text or len is NULL"), std::string::npos) << error_text();
  EXPECT_EQ(twell_text_stream_put(nullptr, 'c', &text, &len), TWELL_ERROR);
  EXPECT_EQ(twell_text_stream_put(s, 300, &text, &len), TWELL_ERROR);  // past the vocabulary
  EXPECT_NE(error_text().find("300"), std::string::npos) << error_text();
  EXPECT_EQ(put('c'), "c");  // the refused id changed nothing
  twell_text_stream_destroy(s);
  twell_text_stream_destroy(nullptr);
  // A refused first put leaves the stream unstarted: what may come only before the first token still can.
  ASSERT_EQ(twell_text_stream_create(t, context, 2, stops, 1, &s), TWELL_OK);
  EXPECT_EQ(twell_text_stream_put(s, 300, &text, &len), TWELL_ERROR);
  EXPECT_EQ(twell_text_stream_skip_special_tokens(s), TWELL_OK) << error_text();
  twell_text_stream_destroy(s);
  s = nullptr;
  EXPECT_EQ(twell_text_stream_create(nullptr, context, 2, stops, 1, &s), TWELL_ERROR);
  EXPECT_EQ(s, nullptr);
  EXPECT_EQ(twell_text_stream_create(t, nullptr, 2, stops, 1, &s), TWELL_ERROR);
  const int32_t bad[] = {300};
  EXPECT_EQ(twell_text_stream_create(t, bad, 1, stops, 1, &s), TWELL_ERROR);
  EXPECT_NE(error_text().find("context id 300"), std::string::npos) << error_text();
  ASSERT_EQ(twell_text_stream_create(t, context, 2, bad, 1, &s), TWELL_OK);  // a stop id is only compared
  EXPECT_EQ(twell_text_stream_put(s, 300, &text, &len), TWELL_OK);
  EXPECT_EQ(len, 0u);
  twell_text_stream_destroy(s);
  twell_tokenizer_destroy(t);
}

// Stop strings on a text stream: the text before the first one met, the index of the one met, nothing
// after it; refused: an empty or non-UTF-8 string, NULL arrays, and stop strings after the first put.
TEST_F(CApiModel, TextStreamsStopAtStopStrings) {
  twell_tokenizer* t = nullptr;
  ASSERT_EQ(twell_tokenizer_load(nullptr, 0, 1, &t), TWELL_OK) << error_text();
  twell_text_stream* s = nullptr;
  ASSERT_EQ(twell_text_stream_create(t, nullptr, 0, nullptr, 0, &s), TWELL_OK) << error_text();
  const char* strings[] = {"never", "o w"};
  const size_t lengths[] = {5, 3};
  ASSERT_EQ(twell_text_stream_stop_at(s, strings, lengths, 2), TWELL_OK) << error_text();
  std::string shown;
  int stopped = -1;
  int64_t which = -2;
  for (const char c : std::string("hello world")) {
    const char* text = nullptr;
    size_t len = 0;
    ASSERT_EQ(twell_text_stream_put(s, static_cast<unsigned char>(c), &text, &len), TWELL_OK) << error_text();
    shown.append(text, len);
    ASSERT_EQ(twell_text_stream_stopped(s, &stopped, &which), TWELL_OK);
    if (c != 'w') {
      EXPECT_EQ(stopped, 0) << c;
      EXPECT_EQ(which, -1);
    }
    if (stopped) break;
  }
  EXPECT_EQ(shown, "hell");
  EXPECT_EQ(stopped, 1);
  EXPECT_EQ(which, 1);
  const char* text = nullptr;
  size_t len = 7;
  ASSERT_EQ(twell_text_stream_put(s, 'x', &text, &len), TWELL_OK);
  EXPECT_EQ(len, 0u);  // nothing after the stop
  ASSERT_EQ(twell_text_stream_finish(s, &text, &len), TWELL_OK);
  EXPECT_EQ(len, 0u);
  EXPECT_EQ(twell_text_stream_stop_at(s, strings, lengths, 1), TWELL_ERROR);  // after a put
  EXPECT_NE(error_text().find("before the first token"), std::string::npos) << error_text();
  EXPECT_EQ(twell_text_stream_stopped(s, nullptr, &which), TWELL_ERROR);
  twell_text_stream_destroy(s);
  ASSERT_EQ(twell_text_stream_create(t, nullptr, 0, nullptr, 0, &s), TWELL_OK);
  const size_t empty[] = {0};
  EXPECT_EQ(twell_text_stream_stop_at(s, strings, empty, 1), TWELL_ERROR);
  EXPECT_NE(error_text().find("must not be empty"), std::string::npos) << error_text();
  const char* bad[] = {"\xff"};
  const size_t one[] = {1};
  EXPECT_EQ(twell_text_stream_stop_at(s, bad, one, 1), TWELL_ERROR);
  EXPECT_NE(error_text().find("not valid UTF-8"), std::string::npos) << error_text();
  EXPECT_EQ(twell_text_stream_stop_at(s, nullptr, one, 1), TWELL_ERROR);
  EXPECT_EQ(twell_text_stream_stop_at(s, strings, lengths, -1), TWELL_ERROR);
  ASSERT_EQ(twell_text_stream_stop_at(s, nullptr, nullptr, 0), TWELL_OK);  // none: the text as it is
  ASSERT_EQ(twell_text_stream_put(s, 'o', &text, &len), TWELL_OK);
  EXPECT_EQ(std::string(text, len), "o");
  twell_text_stream_destroy(s);
  twell_tokenizer_destroy(t);
}

}  // namespace
}  // namespace twell::model
