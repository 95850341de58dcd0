// `twell bench ffn --energy` on the GPU: every implementation's sustained time and, where NVML can
// read the board's energy counter, its energy per token, clock and power-cap share.
#include <gtest/gtest.h>

#include <sstream>

#include "ffn_bench.h"
#include "gpu_test.h"
#include "twell/error.h"

namespace twell {
namespace {

TEST(BenchFfnEnergy, EveryImplementationGetsItsSustainedTimeAndEnergy) {
  TWELL_REQUIRE_HOPPER();
  bench::FfnBenchConfig cfg;
  cfg.backend = "cuda";
  cfg.tokens = {8192};
  cfg.densities = {0.005};
  cfg.distributions = {bench::Distribution::uniform};
  cfg.warmup = 1, cfg.iters = 3;
  cfg.energy = true;
  cfg.energy_seconds = 0.5;
  std::ostringstream progress;
  std::vector<bench::BenchRecord> records;
  try {
    records = bench::run_ffn_bench(cfg, progress);
  } catch (const Error& e) {
    if (std::string(e.what()).find("NVML") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  ASSERT_EQ(records.size(), 4u);
  for (const bench::BenchRecord& r : records) {
    ASSERT_TRUE(r.correct) << r.impl << ": " << r.note;
    // Back to back, a call takes about what a timed call does (the clock differs, not the work).
    EXPECT_GT(r.ms_sustained, 0.3 * r.ms_median) << r.impl;
    EXPECT_LT(r.ms_sustained, 3.0 * r.ms_median) << r.impl;
    EXPECT_GT(r.energy_mj_per_token, 0) << r.impl;  // 0.5 s: several moves of the 100 ms counter
    EXPECT_LT(r.energy_mj_per_token, 10) << r.impl;  // ~0.05 mJ a token for a 2048 x 5632 FFN
    EXPECT_GT(r.sm_clock_mhz, 100) << r.impl;
    EXPECT_GE(r.power_capped, 0) << r.impl;
    EXPECT_LE(r.power_capped, 1) << r.impl;
  }
  std::ostringstream table;
  bench::print_table(records, table);
  EXPECT_NE(table.str().find("mJ/token"), std::string::npos) << table.str();
}

}  // namespace
}  // namespace twell
