// `twell bench model` on the GPU at a small shape: every record checked, and the records' non-zeros
// per token are those of the timed tokens, at the density the gates were calibrated to.
#include <gtest/gtest.h>

#include <sstream>

#include "gpu_test.h"
#include "model_bench.h"

namespace twell {
namespace {

TEST(BenchModel, ASmallModelIsCheckedTimedAndAsSparseAsAsked) {
  TWELL_REQUIRE_HOPPER();
  bench::ModelBenchConfig cfg;
  cfg.layers = 4, cfg.hidden = 512, cfg.ffn = 2048, cfg.heads = 8, cfg.kv_heads = 8, cfg.vocab = 4096;
  cfg.batch = 16, cfg.seq = 512;  // 8192 tokens: FfnOptions::sparse_min_tokens, so the sparse path runs
  cfg.decode_batches = {1};
  cfg.context = 64, cfg.steps = 4;
  cfg.warmup = 1, cfg.iters = 3;
  cfg.density = 0.01;  // ~20 non-zeros per token
  std::ostringstream progress;
  const std::vector<bench::BenchRecord> records = bench::run_model_bench(cfg, progress);
  ASSERT_EQ(records.size(), 4u) << progress.str();  // prefill and decode, dense and twell each
  const double asked = cfg.density * static_cast<double>(cfg.ffn);
  for (const bench::BenchRecord& r : records) {
    SCOPED_TRACE(r.bench + " " + r.impl + ": " + r.note);
    EXPECT_TRUE(r.correct);
    EXPECT_GT(r.ms_median, 0);
    EXPECT_EQ(r.layers, cfg.layers);
    // Measured on the timed tokens (the prefill's 8192, or 16 decode tokens): the calibration's
    // thresholds hold on tokens it did not see. The decode figure is 16 tokens' mean, so noisier.
    const double tolerance = r.bench == "model_prefill" ? 0.10 : 0.30;
    EXPECT_NEAR(r.nnz_per_token_mean, asked, tolerance * asked);
  }
  // The prefill's figure is its own count, taken on the sparse path in every layer.
  EXPECT_NE(progress.str().find("sparse path in 4/4 layers"), std::string::npos) << progress.str();
  EXPECT_NE(progress.str().find("4 layers counted"), std::string::npos) << progress.str();
}

// --long: one prompt of 20000 tokens in two chunks of 10000 (the default max_tokens, 16384) and in one
// forward, both checked against a dense forward, the chunks' buffers smaller.
TEST(BenchModel, ALongPromptRunsInChunksAndInOneForward) {
  TWELL_REQUIRE_HOPPER();
  bench::ModelBenchConfig cfg;
  cfg.layers = 2, cfg.hidden = 512, cfg.ffn = 2048, cfg.heads = 8, cfg.kv_heads = 8, cfg.vocab = 4096;
  cfg.prefill = cfg.decode = false;
  cfg.decode_batches.clear();
  cfg.long_prompt = 20000;
  cfg.warmup = 1, cfg.iters = 2;
  cfg.density = 0.01;
  std::ostringstream progress;
  const std::vector<bench::BenchRecord> records = bench::run_model_bench(cfg, progress);
  ASSERT_EQ(records.size(), 2u) << progress.str();
  EXPECT_NE(progress.str().find("long prompt of 20000 tokens: in 2 chunks (10000 + 10000)"), std::string::npos)
      << progress.str();
  for (const bench::BenchRecord& r : records) {
    SCOPED_TRACE(r.impl + ": " + r.note);
    EXPECT_EQ(r.bench, "model_long");
    EXPECT_TRUE(r.correct);
    EXPECT_GT(r.ms_median, 0);
    EXPECT_EQ(r.M, 20000);
  }
  EXPECT_EQ(records[0].impl, "whole");
  EXPECT_EQ(records[1].impl, "chunks");
  EXPECT_LT(records[1].peak_mem_bytes, records[0].peak_mem_bytes);
}

// --turn: a conversation's next 8 tokens after 600 cached, on the dense model, the twell model (whose
// FFN gathers in every layer: 8 tokens × ~1% density) and the twell model without that, all checked
// (the first two also at the launch of the graph their timed calls replay).
TEST(BenchModel, AConversationsNextTurnGathersTheActiveRows) {
  TWELL_REQUIRE_HOPPER();
  bench::ModelBenchConfig cfg;
  cfg.layers = 2, cfg.hidden = 512, cfg.ffn = 2048, cfg.heads = 8, cfg.kv_heads = 8, cfg.vocab = 4096;
  cfg.prefill = cfg.decode = false;
  cfg.decode_batches.clear();
  cfg.turns = {8}, cfg.turn_context = 600;
  cfg.warmup = 1, cfg.iters = 3;
  cfg.density = 0.01;
  std::ostringstream progress;
  const std::vector<bench::BenchRecord> records = bench::run_model_bench(cfg, progress);
  ASSERT_EQ(records.size(), 3u) << progress.str();
  EXPECT_NE(progress.str().find("turn of 8 tokens after 600 cached: the FFN gathers in 2/2 layers (twell), 0/2 "
                                "(twell_no_gather)"),
            std::string::npos)
      << progress.str();
  const char* impls[3] = {"dense", "twell", "twell_no_gather"};
  for (size_t k = 0; k < 3; ++k) {
    const bench::BenchRecord& r = records[k];
    SCOPED_TRACE(r.impl + ": " + r.note);
    EXPECT_EQ(r.bench, "model_turn");
    EXPECT_EQ(r.impl, impls[k]);
    EXPECT_TRUE(r.correct);
    EXPECT_GT(r.ms_median, 0);
    EXPECT_EQ(r.M, 8);
    // The timed calls replay a graph, checked at its first launch, except where the FFN dispatches on
    // the density (twell_no_gather: its turn's kernels are launched one by one).
    EXPECT_NE(r.note.find(k == 2 ? "launched one by one" : "replayed as a CUDA graph"), std::string::npos);
  }
}

// A phase that cannot fit in the GPU's memory is refused before anything runs (no weights made, no
// calibration), naming the phase and what to lower; not after the phases before it have run.
TEST(BenchModel, APhaseThatCannotFitIsRefusedFirst) {
  TWELL_REQUIRE_HOPPER();
  bench::ModelBenchConfig cfg;
  cfg.layers = 2, cfg.hidden = 512, cfg.ffn = 2048, cfg.heads = 8, cfg.kv_heads = 8, cfg.vocab = 4096;
  cfg.prefill = false;
  cfg.decode_batches = {1, 16384};
  cfg.context = 4096;  // 16384 sequences of 4259 positions: ~286 GB of KV cache a model
  std::ostringstream progress;
  try {
    bench::run_model_bench(cfg, progress);
    ADD_FAILURE() << "expected a refusal";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("decode at batch 16384"), std::string::npos) << what;
    EXPECT_NE(what.find("lower --context or leave that --decode-batch out"), std::string::npos) << what;
  }
  EXPECT_EQ(progress.str(), "") << "ran before refusing";
}

}  // namespace
}  // namespace twell
