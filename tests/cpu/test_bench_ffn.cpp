// `twell bench ffn` harness on the CPU backend: records are checked before timing, --from loads
// a problem from a safetensors file, and bad input is refused with a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/io_test_util.h"
#include "ffn_bench.h"
#include "model_bench.h"
#include "progress.h"
#include "synthetic.h"
#include "twell/bf16.h"
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

// The CPU backend as a GPU-like one for the bench's own logic: inputs rotated over several token sets (as
// the CUDA backend does below 2 × L2), and a GPU timing whose hold "fails" on the calls `failing` picks.
class RotatingBackend : public bench::FfnBackend {
 public:
  std::function<bool(int attempt_call)> failing = [](int) { return false; };
  std::vector<std::pair<int, TwellOccupancy>> seen;  // occupancy()'s token sets and answers, in order
  int calls = 0;                  // time_ms calls since the last reset_timing()

  std::string device_name() const override { return cpu_->device_name(); }
  std::vector<int64_t> default_tokens() const override { return cpu_->default_tokens(); }
  std::vector<double> default_densities() const override { return cpu_->default_densities(); }
  int default_warmup() const override { return 0; }
  int default_iters() const override { return 2; }
  size_t rotate_below_bytes() const override { return size_t{1} << 40; }  // every case: the most sets (8)
  TwellOccupancy occupancy(const bench::FfnProblem& p, const bench::FfnBenchConfig& cfg, int set) override {
    seen.emplace_back(set, cpu_->occupancy(p, cfg, set));
    return seen.back().second;
  }
  std::vector<bench::FfnRunner> runners(const bench::FfnProblem& p, const bench::FfnBenchConfig& cfg) override {
    return cpu_->runners(p, cfg);
  }
  double time_ms(const std::function<void()>& fn, bench::Timing timing) override {
    if (timing == bench::Timing::gpu && failing(calls++)) failed_ = true;
    return cpu_->time_ms(fn, bench::Timing::host);
  }
  bench::Timing timing_used(bench::Timing requested) const override {
    return failed_ ? bench::Timing::host : requested;
  }
  void reset_timing() override { failed_ = false, calls = 0; }

 private:
  std::unique_ptr<bench::FfnBackend> cpu_ = bench::make_cpu_backend();
  bool failed_ = false;
};

// Where the timed calls rotate through several token sets, the records' non-zero counts are those of
// every set (M = 1: one token's count said little of the eight timed), and the densest row is the
// densest of them all.
TEST(BenchFfn, NonZeroCountsCoverEveryTokenSetTimed) {
  bench::FfnBenchConfig cfg = small_config();
  cfg.tokens = {1};
  cfg.H = 64;
  cfg.I = 320;
  cfg.densities = {0.1};
  cfg.distributions = {bench::Distribution::uniform};
  RotatingBackend backend;
  std::ostringstream progress;
  const auto records = bench::run_ffn_bench_on(backend, cfg, progress);
  ASSERT_EQ(backend.seen.size(), 8u);
  int64_t nnz = 0, most = 0;
  for (size_t set = 0; set < 8; ++set) {
    EXPECT_EQ(backend.seen[set].first, static_cast<int>(set));
    nnz += backend.seen[set].second.nnz, most = std::max(most, backend.seen[set].second.max_row_count);
  }
  EXPECT_NE(backend.seen[0].second.nnz * 8, nnz) << "the sets' counts are all alike: the test would show nothing";
  ASSERT_EQ(records.size(), 2u);
  for (const bench::BenchRecord& r : records) {
    EXPECT_DOUBLE_EQ(r.nnz_per_token_mean, static_cast<double>(nnz) / 8) << r.impl;
    EXPECT_EQ(r.nnz_per_token_max, most) << r.impl;
  }
}

// A timed call that outlasts the GPU timing's hold (a host stall) times its case again as asked; failing
// again, that case alone is timed from the host, and the next case is timed as asked.
TEST(BenchFfn, AFailedHoldRetimesItsCaseAndFallsBackForItAlone) {
  bench::FfnBenchConfig cfg = small_config();
  cfg.tokens = {1};
  cfg.H = 64;
  cfg.I = 320;
  cfg.densities = {0.1, 0.2};
  cfg.distributions = {bench::Distribution::uniform};
  {
    RotatingBackend once;  // the first call of the first attempt fails, then none
    bool failed = false;
    once.failing = [&](int) { return !failed && (failed = true); };
    std::ostringstream progress;
    const auto records = bench::run_ffn_bench_on(once, cfg, progress);
    ASSERT_EQ(records.size(), 4u);
    for (const bench::BenchRecord& r : records) EXPECT_EQ(r.timing, "gpu") << r.impl;
    EXPECT_NE(progress.str().find("timing the case again"), std::string::npos) << progress.str();
    EXPECT_EQ(progress.str().find("timed from an idle GPU"), std::string::npos) << progress.str();
  }
  RotatingBackend first_case;  // the first case's two attempts fail, none after
  int attempts = 0;
  first_case.failing = [&](int call) {
    attempts += call == 0;  // time_ms's count restarts with each attempt (reset_timing)
    return attempts <= 2;
  };
  std::ostringstream progress;
  const auto records = bench::run_ffn_bench_on(first_case, cfg, progress);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].timing, "host");
  EXPECT_EQ(records[1].timing, "host");
  EXPECT_EQ(records[2].timing, "gpu") << progress.str();
  EXPECT_EQ(records[3].timing, "gpu");
  EXPECT_NE(progress.str().find("this case is timed from an idle GPU (--timing host)"), std::string::npos)
      << progress.str();
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
    EXPECT_EQ(r.timing, "host");  // the CPU backend has no GPU timing: the records say what it used
  }
  EXPECT_NE(progress.str().find("[4/4]"), std::string::npos) << progress.str();
  EXPECT_NE(bench::records_to_json(records).find("\"ratio_to_dense\""), std::string::npos);
  EXPECT_NE(bench::records_to_json(records).find("\"timing\": \"host\""), std::string::npos);
  // What was run is in the record, not only in its command line.
  EXPECT_NE(bench::records_to_json(records).find("\"gated\": true"), std::string::npos);
  EXPECT_NE(bench::records_to_json(records).find("\"iters\": 2"), std::string::npos);
  EXPECT_NE(bench::records_to_json(records).find("\"tile\": 176"), std::string::npos);
  EXPECT_NE(bench::records_to_json(records).find("\"compression\": 8"), std::string::npos);
}

// A synthetic case whose activations miss the density asked says so (at a small -H the gate's few
// columns have no normal tail); one that holds it says nothing; a density too small for 1 − d to
// differ from 1 runs (no non-zeros) instead of failing in the middle of the run.
TEST(BenchFfn, SyntheticDensityMissedIsNoted) {
  bench::FfnBenchConfig cfg = small_config();
  cfg.tokens = {64};
  cfg.I = 5632;
  cfg.densities = {0.005};
  cfg.distributions = {bench::Distribution::uniform};
  cfg.iters = 1;
  for (const int64_t H : {8, 64}) {
    cfg.H = H;
    std::ostringstream progress;
    bench::run_ffn_bench(cfg, progress);
    EXPECT_EQ(progress.str().find("non-zeros a token, not the 28.2 asked") != std::string::npos, H == 8)
        << progress.str();
  }
  cfg.H = 64;
  cfg.densities = {1e-17};
  cfg.distributions = {bench::Distribution::uniform, bench::Distribution::skewed};
  std::ostringstream progress;
  for (const bench::BenchRecord& r : bench::run_ffn_bench(cfg, progress)) {
    EXPECT_TRUE(r.correct) << r.impl;
    EXPECT_EQ(r.nnz_per_token_mean, 0) << r.impl;
  }
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
  // Shapes from the header, before any tensor is read: a weight whose H is not x's is named with x.
  io::write_safetensors(path, {{"x", f.x}, {"gate", f.wg}, {"up", Tensor(DType::bf16, {256, 32})}, {"down", f.wd}});
  try {
    bench::run_ffn_bench(cfg, progress);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x is [17, 64] but up is [256, 32]"), std::string::npos) << e.what();
  }
  // A finite F32 value beyond bf16's range would be Inf once rounded: refused as such, not run
  // into a failed correctness check.
  Tensor x32(DType::f32, {17, 64});
  for (int64_t i = 0; i < x32.numel(); ++i) x32.ptr<float>()[i] = float(f.x.ptr<bf16>()[i]);
  x32.ptr<float>()[3] = 3.4e38f;
  io::write_safetensors(path, {{"x", x32}, {"gate", f.wg}, {"up", f.wu}, {"down", f.wd}});
  try {
    bench::run_ffn_bench(cfg, progress);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'x': element 3 (index [0, 3]) is 3.4e+38, which overflows BF16"),
              std::string::npos)
        << e.what();
  }
  // A small file whose shapes would need terabytes on the host: refused from its header at once.
  {
    const int64_t n = 1000000;  // x [n, 1] and the weights [n, 1]: 8 MB of file, an [n, n] activation
    Tensor col(DType::bf16, {n, 1});
    io::write_safetensors(path, {{"x", col}, {"gate", col}, {"up", col}, {"down", col}});
    try {
      bench::run_ffn_bench(cfg, progress);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("of host memory"), std::string::npos) << e.what();
    }
  }
  // No tokens: refused, not a row of NaN ratios.
  io::write_safetensors(path, {{"x", Tensor(DType::bf16, {0, 64})}, {"gate", f.wg}, {"up", f.wu}, {"down", f.wd}});
  try {
    bench::run_ffn_bench(cfg, progress);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least one token"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

// --energy needs the CUDA backend's NVML reading: refused up front on the CPU backend, nothing run.
TEST(BenchFfn, EnergyIsRefusedWithoutTheCudaBackend) {
  bench::FfnBenchConfig cfg = small_config();
  cfg.tokens = {9};
  cfg.H = 64;
  cfg.I = 320;
  cfg.energy = true;
  std::ostringstream progress;
  try {
    bench::run_ffn_bench(cfg, progress);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--energy"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  EXPECT_EQ(progress.str().find("M=9"), std::string::npos) << "a case ran: " << progress.str();
}

// The table's energy columns appear only where a record has them, "n/a" for what was not measured.
TEST(BenchFfn, TableShowsEnergyColumnsOnlyWhenMeasured) {
  bench::BenchRecord r;
  r.M = 16, r.H = 64, r.I = 320, r.impl = "twell", r.distribution = "uniform", r.correct = true;
  std::ostringstream plain;
  bench::print_table({r}, plain);
  EXPECT_EQ(plain.str().substr(0, plain.str().find('\n')),
            "M             H      I density dist       nnz/tok      max impl             ms(median)  x dense   rel_err ok");
  EXPECT_EQ(plain.str().find("mJ/token"), std::string::npos) << plain.str();
  bench::BenchRecord e = r;
  e.ms_sustained = 1.25, e.energy_mj_per_token = 0.0421, e.sm_clock_mhz = 1650, e.power_capped = 0.5;
  std::ostringstream with;
  bench::print_table({e, r}, with);
  EXPECT_NE(with.str().find("mJ/token"), std::string::npos) << with.str();
  EXPECT_NE(with.str().find("0.0421"), std::string::npos) << with.str();
  EXPECT_NE(with.str().find("50%"), std::string::npos) << with.str();
  EXPECT_NE(with.str().find("n/a"), std::string::npos) << with.str();  // the second record's
  // Each value ends where its header does.
  const std::string table = with.str();
  const size_t row = table.find('\n') + 1;
  EXPECT_EQ(table.find("sustained") + 9, table.find("1.250", row) + 5 - row) << table;
  EXPECT_EQ(table.find("mJ/token") + 8, table.find("0.0421", row) + 6 - row) << table;
  // A --from case's long distribution name widens its column for every row.
  bench::BenchRecord f = r;
  f.distribution = "file:from_a_checkpoint.safetensors";
  std::ostringstream from;
  bench::print_table({f, r}, from);
  const std::string ft = from.str();
  const size_t r1 = ft.find('\n') + 1, r2 = ft.find('\n', r1) + 1;
  EXPECT_EQ(ft.find("impl"), ft.find("twell", r1) - r1) << ft;
  EXPECT_EQ(ft.find("impl"), ft.find("twell", r2) - r2) << ft;
  const std::string json = bench::records_to_json({e});
  EXPECT_NE(json.find("\"ms_sustained\": 1.25"), std::string::npos) << json;
  EXPECT_NE(json.find("\"energy_mj_per_token\": 0.0421"), std::string::npos) << json;
}

// Timed runs below 1 are refused (they were replaced by the backend's default, while the record's
// command said otherwise); a --json path that cannot be written fails before anything runs.
TEST(BenchFfn, BadRunCountsAndJsonPathAreRefused) {
  bench::FfnBenchConfig cfg = small_config();
  cfg.tokens = {9};
  cfg.H = 64;
  cfg.I = 320;
  std::ostringstream progress;
  for (const auto& [warmup, iters] : {std::pair{0, 0}, {0, -3}, {-2, 2}}) {
    cfg.warmup = warmup, cfg.iters = iters;
    EXPECT_THROW(bench::run_ffn_bench(cfg, progress), Error) << warmup << " " << iters;
  }
  EXPECT_THROW(bench::check_records_path("/nonexistent-folder/twell.json"), Error);
  EXPECT_THROW(bench::check_records_path(testing::TempDir()), Error);  // a directory, not a file
  const std::string ok = testing::TempDir() + "/twell_bench_records.json";
  EXPECT_NO_THROW(bench::check_records_path(ok));
  EXPECT_FALSE(std::ifstream(ok).good());  // the probe leaves nothing behind
  EXPECT_NO_THROW(bench::check_records_path(""));
  EXPECT_THROW(bench::check_records_path("/dev/null"), Error);  // would be replaced by a plain file
}

// A bad value anywhere in the lists fails before the first case runs, naming its option.
TEST(BenchFfn, EveryCaseIsCheckedBeforeAnyRuns) {
  const auto refused = [](auto edit, const std::string& what) {
    bench::FfnBenchConfig cfg = small_config();
    cfg.tokens = {9};
    cfg.H = 64;
    cfg.I = 320;
    edit(cfg);
    std::ostringstream progress;
    test::expect_error([&] { bench::run_ffn_bench(cfg, progress); }, {what});
    EXPECT_EQ(progress.str().find("[1/"), std::string::npos) << progress.str();
  };
  refused([](bench::FfnBenchConfig& c) { c.tokens = {9, 0}; }, "-M must be at least 1, got 0");
  refused([](bench::FfnBenchConfig& c) { c.densities = {0.01, 1.5}; }, "-d must be a density in (0, 1], got 1.5");
  refused([](bench::FfnBenchConfig& c) { c.densities = {0}; }, "-d must be a density in (0, 1], got 0");
  refused([](bench::FfnBenchConfig& c) { c.densities = {NAN}; }, "-d must be a density");
  refused([](bench::FfnBenchConfig& c) { c.H = 2; }, "-H must be at least 3");
  refused([](bench::FfnBenchConfig& c) { c.tile = -1; }, "--tile must be 0 (the FFN's default) or in [1, 65536]");
  refused([](bench::FfnBenchConfig& c) { c.compression = 0; }, "--compression must be at least 1, got 0");
  refused([](bench::FfnBenchConfig& c) { c.tile = 256, c.compression = 3; }, "--compression must divide --tile (256)");
  // The default tile (256 at I = 320) that --compression does not divide.
  refused([](bench::FfnBenchConfig& c) { c.compression = 3; }, "--compression must divide the tile width (256");
  refused([](bench::FfnBenchConfig& c) { c.l1 = -1; }, "--l1 must be finite and >= 0");
  // A density the skewed problem cannot give (its dead neurons cap it near 66%), not run at less.
  refused([](bench::FfnBenchConfig& c) {
    c.densities = {0.01, 0.9};
    c.distributions = {bench::Distribution::uniform, bench::Distribution::skewed};
  }, "-d 0.9 is more than --distribution skewed gives at -I 320: at most 0.6");
  // --timing gpu asked for on the CPU backend, which times on the host: said, not recorded as host.
  refused([](bench::FfnBenchConfig& c) { c.timing_given = true; }, "--timing gpu: this backend times every call");
}

// A case that fails after others finished: the finished cases are printed and saved, said to be
// partial, and the case's error is what the caller gets; a failed save does not hide that error.
class BenchRecords : public test::ScratchDirTest {};

TEST_F(BenchRecords, CasesDoneBeforeAnErrorAreSavedAndTheErrorFollows) {
  bench::FfnBenchConfig cfg = small_config();
  cfg.tokens = {9};
  cfg.H = 64;
  cfg.I = 320;
  cfg.densities = {0.05};
  cfg.distributions = {bench::Distribution::uniform};
  std::ostringstream progress;
  const std::vector<bench::BenchRecord> first = bench::run_ffn_bench(cfg, progress);  // one real case
  ASSERT_FALSE(first.empty());
  auto fails_second = [&](std::vector<bench::BenchRecord>* done) {
    done->insert(done->end(), first.begin(), first.end());
    throw Error("case 2 could not run");
  };
  std::ostringstream out, err;
  test::expect_error([&] { bench::run_saving_records(fails_second, path("r.json"), out, err); },
                     {"case 2 could not run"});
  EXPECT_NE(out.str().find("wrote " + std::to_string(first.size()) + " records of the cases done before the error"),
            std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("twell"), std::string::npos) << out.str();  // the table of the finished case
  std::ifstream saved(path("r.json"));
  ASSERT_TRUE(saved.good());
  std::stringstream text;
  text << saved.rdbuf();
  EXPECT_EQ(text.str(), bench::records_to_json(first));
  EXPECT_TRUE(err.str().empty()) << err.str();

  // The save fails (a folder where the file should go): the case's error still comes out.
  std::filesystem::create_directories(path("taken.json"));
  std::ostringstream out2, err2;
  test::expect_error([&] { bench::run_saving_records(fails_second, path("taken.json"), out2, err2); },
                     {"case 2 could not run"});
  EXPECT_NE(err2.str().find("could not save the finished cases"), std::string::npos) << err2.str();

  // Nothing finished: the error alone, no file.
  std::ostringstream out3, err3;
  test::expect_error([&] { bench::run_saving_records([](auto*) { throw Error("case 1 could not run"); },
                                                     path("none.json"), out3, err3); },
                     {"case 1 could not run"});
  EXPECT_FALSE(std::ifstream(path("none.json")).good());
  EXPECT_TRUE(out3.str().empty()) << out3.str();

  // No error: every record, printed and saved.
  std::ostringstream out4, err4;
  const auto all = bench::run_saving_records([&](std::vector<bench::BenchRecord>* done) { *done = first; },
                                             path("all.json"), out4, err4);
  EXPECT_EQ(all.size(), first.size());
  EXPECT_NE(out4.str().find("wrote " + std::to_string(first.size()) + " records to"), std::string::npos) << out4.str();
}

// Into a file or pipe, a counted loop's progress is a line at each tenth of the way, the last
// step always included; no carriage returns.
TEST(BenchProgress, LinesAtTenthsWhenNotATerminal) {
  std::ostringstream out;
  bench::StepProgress steps(out, "layer ", 38);
  for (int64_t i = 1; i <= 38; ++i) steps.step(i);
  steps.finish();
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 10) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_NE(text.find("layer 38/38\n"), std::string::npos) << text;
  std::ostringstream few;
  bench::StepProgress three(few, "step ", 3);
  for (int64_t i = 1; i <= 3; ++i) three.step(i);
  EXPECT_EQ(few.str(), "step 1/3\nstep 2/3\nstep 3/3\n");
}

// On a terminal the line is redrawn in place, at most ten times a second: a fast loop draws its
// first step, its last, and few between; a loop that stops short has its last line drawn by finish().
TEST(BenchProgress, RedrawsATerminalAtMostTenTimesASecond) {
  std::ostringstream out;
  bench::StepProgress steps(out, "token ", 100000, true);
  for (int64_t i = 1; i <= 100000; ++i) steps.step(i);
  steps.finish();
  const std::string text = out.str();
  const auto redraws = std::count(text.begin(), text.end(), '\r');
  EXPECT_GE(redraws, 2);
  EXPECT_LE(redraws, 20) << "a loop of well under a second";
  const std::string last = "\rtoken 100000/100000\x1b[K\n";
  EXPECT_EQ(text.rfind(last), text.size() - last.size()) << text;
  std::ostringstream short_out;
  bench::StepProgress stopped(short_out, "token ", 1000, true);
  for (int64_t i = 1; i <= 500; ++i) stopped.step(i);
  stopped.finish();
  EXPECT_NE(short_out.str().find("\rtoken 500/1000\x1b[K\n"), std::string::npos) << short_out.str();
}

// A loop left by an error (no finish()) ends its drawn line as the progress goes out of scope, so the
// error that follows starts a line of its own; a finished one adds nothing more.
TEST(BenchProgress, AnUnfinishedLineEndsWhenTheProgressGoes) {
  std::ostringstream out;
  try {
    bench::StepProgress steps(out, "window ", 10, true);
    steps.step(1);
    throw Error("window 2: the mean NLL is NaN");
  } catch (const Error& e) {
    out << "twell: error: " << e.what() << "\n";
  }
  EXPECT_EQ(out.str(), "\rwindow 1/10\x1b[K\ntwell: error: window 2: the mean NLL is NaN\n");
  std::ostringstream done;
  {
    bench::StepProgress steps(done, "window ", 1, true);
    steps.step(1);
    steps.finish();
  }
  EXPECT_EQ(done.str(), "\rwindow 1/1\x1b[K\n");
}

// An energy NVML could not measure (its counter did not move) is "n/a" in the table, not 0 or -1.
TEST(BenchModel, UnknownEnergyIsNotANumber) {
  bench::BenchRecord r;
  r.bench = "model_decode", r.impl = "twell", r.M = 1, r.ms_median = 1.25, r.ratio_to_dense = 0.66, r.correct = true;
  std::ostringstream table;
  bench::print_model_table({r}, table);
  EXPECT_NE(table.str().find(" n/a "), std::string::npos) << table.str();
  EXPECT_EQ(table.str().find("-1.000"), std::string::npos) << table.str();
  EXPECT_NE(bench::records_to_json({r}).find("\"energy_mj_per_token\": null"), std::string::npos);
}

// The table's columns line up whatever the names' lengths (twell_no_gather is longer than the header's "impl").
TEST(BenchModel, TheTablesColumnsLineUp) {
  bench::BenchRecord a, b;
  a.bench = b.bench = "model_turn", a.impl = "twell", b.impl = "twell_no_gather";
  a.M = b.M = 21, a.ms_median = 4.25, b.ms_median = 4.71, a.correct = b.correct = true;
  std::ostringstream table;
  bench::print_model_table({a, b}, table);
  std::istringstream lines(table.str());
  std::string header, one, two;
  std::getline(lines, header), std::getline(lines, one), std::getline(lines, two);
  EXPECT_EQ(one.size(), two.size()) << table.str();
  EXPECT_EQ(header.find("tokens") + 6, one.find("21") + 2) << table.str();  // right-aligned under its header
  EXPECT_EQ(one.find("4.250"), two.find("4.710")) << table.str();
}

// A record that failed its check has no time, ratio or rate: "-" in the table, null in the JSON, whatever
// its fields hold (a model the full-size check failed was not timed).
TEST(BenchModel, AFailedRecordShowsNoFigures) {
  bench::BenchRecord r;
  r.bench = "model_prefill", r.impl = "twell", r.M = 131072, r.ms_median = 0, r.tokens_per_ms = 7;
  r.correct = false, r.rel_err = 0.5;
  std::ostringstream table;
  bench::print_model_table({r}, table);
  EXPECT_NE(table.str().find(" FAILED"), std::string::npos) << table.str();
  EXPECT_EQ(table.str().find("0.000"), std::string::npos) << table.str();
  EXPECT_EQ(table.str().find("7.00"), std::string::npos) << table.str();
  const std::string json = bench::records_to_json({r});
  for (const char* field : {"\"ratio_to_dense\": null", "\"ms_median\": null", "\"tokens_per_ms\": null"})
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  EXPECT_TRUE(std::isnan(bench::BenchRecord{}.ratio_to_dense));  // no ratio unless one is computed
}

// `twell bench model`'s arguments are checked before it looks for a GPU, so a typo fails at once
// on any machine, with the option's name.
TEST(BenchModel, BadArgumentsFailFirst) {
  const auto fails_with = [](bench::ModelBenchConfig cfg, const std::string& part) {
    std::ostringstream progress;
    try {
      bench::run_model_bench(cfg, progress);
      ADD_FAILURE() << "expected an error with '" << part << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      // A build without CUDA refuses first, whatever the arguments.
      if (what.find("needs the CUDA backend") == std::string::npos) {
        EXPECT_NE(what.find(part), std::string::npos) << what;
      }
    }
  };
  bench::ModelBenchConfig cfg;
  cfg.layers = 0;
  fails_with(cfg, "num_hidden_layers must be positive");
  cfg = {};
  cfg.heads = 3;
  fails_with(cfg, "--heads 3 must divide --hidden 2048");
  cfg = {};
  cfg.decode_batches = {1, 0};
  fails_with(cfg, "--decode-batch must be positive");
  cfg = {};
  cfg.density = 0;
  fails_with(cfg, "--density must be in (0, 1]");
  cfg = {};
  cfg.check_tokens = 1;
  fails_with(cfg, "--check-tokens must be at least 2");
  cfg = {};
  cfg.decode_attention_splits = 17;
  fails_with(cfg, "--decode-attention-splits must lie in [0, 16], got 17");
  cfg = {};
  cfg.decode_attention_warps = 3;
  fails_with(cfg, "--decode-attention-warps must be 0, 1, 2 or 4, got 3");
}

// The synthetic activations' density is the mean over all tokens, hot ones included
// (shared/BENCHMARKS.md: non-zeros per token / I), and `skewed` keeps its shape: dead neurons, and
// hot tokens with 10-20x the mean count.
// The skewed problem's ceiling: its live neurons all at the clipped rate, hot tokens included; what
// the problem then gives is that, not more (and uniform has none below 1).
TEST(BenchSynthetic, SkewedDensityHasACeiling) {
  const bench::SyntheticSpec uniform{64, 256, 1024, 0, bench::Distribution::uniform, true, 5};
  EXPECT_EQ(bench::max_synthetic_density(uniform), 1.0);
  bench::SyntheticSpec skewed = uniform;
  skewed.distribution = bench::Distribution::skewed;
  const double most = bench::max_synthetic_density(skewed);
  EXPECT_GT(most, 0.6);
  EXPECT_LT(most, 0.75);  // ~70% live x 95%, a little more from the hot tokens
  skewed.density = 0.99;  // asked past the ceiling: make_synthetic_ffn gives the ceiling's rates
  const bench::SyntheticFfn f = bench::make_synthetic_ffn(skewed);
  for (double p : f.fire_prob) ASSERT_TRUE(p == 0 || p == 0.95) << p;
}

TEST(BenchSynthetic, DensityIsTheMeanOverAllTokens) {
  const int64_t M = 2048, H = 256, I = 1024;
  for (const auto dist : {bench::Distribution::uniform, bench::Distribution::skewed}) {
    SCOPED_TRACE(bench::distribution_name(dist));
    const bench::SyntheticFfn f = bench::make_synthetic_ffn({M, H, I, 0.01, dist, true, 5});
    const auto* x = f.x.ptr<bf16>();
    const auto* w = f.wg.ptr<bf16>();
    std::vector<float> xf(static_cast<size_t>(M * H)), wf(static_cast<size_t>(I * H));
    for (size_t i = 0; i < xf.size(); ++i) xf[i] = float(x[i]);
    for (size_t i = 0; i < wf.size(); ++i) wf[i] = float(w[i]);
    std::vector<int64_t> per_token(static_cast<size_t>(M));
    std::vector<int64_t> per_neuron(static_cast<size_t>(I));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < I; ++j) {
        float dot = 0;
        for (int64_t k = 0; k < H; ++k) dot += xf[static_cast<size_t>(m * H + k)] * wf[static_cast<size_t>(j * H + k)];
        if (dot > 0) ++per_token[static_cast<size_t>(m)], ++per_neuron[static_cast<size_t>(j)];
      }
    int64_t total = 0, max_token = 0, dead = 0;
    for (int64_t c : per_token) total += c, max_token = std::max(max_token, c);
    for (int64_t c : per_neuron) dead += c == 0;
    const double mean = double(total) / double(M);
    EXPECT_NEAR(mean, 0.01 * I, 0.06 * 0.01 * I);  // 10.24 expected
    if (dist == bench::Distribution::skewed) {
      EXPECT_GE(max_token, 8 * mean);
      EXPECT_GT(dead, I / 5);  // 30% are dead by construction (a few live ones may not fire)
    } else {
      EXPECT_LT(max_token, 4 * mean);
    }
  }
}

}  // namespace
}  // namespace twell
