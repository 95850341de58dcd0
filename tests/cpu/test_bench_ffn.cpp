// `twell bench ffn` harness on the CPU backend: records are checked before timing, --from loads
// a problem from a safetensors file, and bad input is refused with a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "ffn_bench.h"
#include "twell/io/safetensors.h"

namespace twell {
namespace {

bench::FfnBenchConfig small_config() {
  bench::FfnBenchConfig cfg;
  cfg.backend = "cpu";
  cfg.warmup = 0;
  cfg.iters = 2;
  return cfg;
}

TEST(BenchFfn, SyntheticCasesAreCheckedAndTimed) {
  bench::FfnBenchConfig cfg = small_config();
  cfg.tokens = {9};
  cfg.H = 64;
  cfg.I = 320;
  cfg.densities = {0.02, 0.5};
  std::ostringstream progress;
  const auto records = bench::run_ffn_bench(cfg, progress);
  ASSERT_EQ(records.size(), 2u * 2u * 2u);  // densities x distributions x implementations
  for (const auto& r : records) {
    EXPECT_TRUE(r.correct) << r.impl << " " << r.note;
    EXPECT_GT(r.ms_median, 0);
    EXPECT_EQ(r.M, 9);
  }
  EXPECT_NE(progress.str().find("[4/4]"), std::string::npos) << progress.str();
  EXPECT_NE(bench::records_to_json(records).find("\"ratio_to_dense\""), std::string::npos);
}

TEST(BenchFfn, FromFileRunsTheGivenTensors) {
  const bench::SyntheticFfn f = bench::make_synthetic_ffn({17, 64, 256, 0.05, bench::Distribution::skewed, true, 3});
  const std::string path = testing::TempDir() + "/twell_bench_from.safetensors";
  io::write_safetensors(path, {{"x", f.x}, {"gate", f.wg}, {"up", f.wu}, {"down", f.wd}});
  bench::FfnBenchConfig cfg = small_config();
  cfg.from_file = path;
  std::ostringstream progress;
  const auto records = bench::run_ffn_bench(cfg, progress);
  ASSERT_EQ(records.size(), 2u);
  for (const auto& r : records) {
    EXPECT_TRUE(r.correct) << r.note;
    EXPECT_EQ(r.M, 17);
    EXPECT_EQ(r.I, 256);
    EXPECT_EQ(r.distribution, "file:twell_bench_from.safetensors");
    EXPECT_NEAR(r.density, r.nnz_per_token_mean / 256, 1e-12);
  }

  io::write_safetensors(path, {{"x", f.x}, {"gate", f.wg}, {"up", f.wu}});  // no "down"
  try {
    bench::run_ffn_bench(cfg, progress);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor 'down'"), std::string::npos) << e.what();
  }
  io::write_safetensors(path, {{"x", f.x}, {"gate", f.wg}, {"up", f.wu}, {"down", f.x}});  // wrong shape
  EXPECT_THROW(bench::run_ffn_bench(cfg, progress), Error);
  Tensor bad = f.wd.clone();
  bad.ptr<bf16>()[5] = bf16(NAN);
  io::write_safetensors(path, {{"x", f.x}, {"gate", f.wg}, {"up", f.wu}, {"down", bad}});
  try {
    bench::run_ffn_bench(cfg, progress);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("down"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace twell
