// twell::cuda::SplitFfn (the hot neurons dense, the rest sparse) against the CPU reference at awkward
// shapes and every kind of density; count_active_neurons against the CPU's gate; choose_hot_neurons'
// rule; and bad input. Tolerance as test_twell_ffn.cu's (DESIGN.md §5): relative error against
// float64 at most twice the CPU bf16 pipeline's, and element-wise |gpu − cpu| ≤ 0.05·rms(y) + 0.02·|cpu|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/compare.h"
#include "gpu_test.h"
#include "synthetic.h"
#include "twell/cpu/ffn.h"
#include "twell/cuda/split_ffn.h"

namespace twell {
namespace {

using cuda::DeviceTensor;
using cuda::Dispatch;

// choose_hot_neurons runs on the host: these run without a GPU.
TEST(ChooseHotNeurons, TakesTheFrequentOnesInSteps) {
  std::vector<int64_t> counts(5632, 0);
  for (int j = 0; j < 500; ++j) counts[size_t(7 * j + 3)] = 50 + j;  // 500 neurons at >= 5%
  const std::vector<int32_t> hot = cuda::choose_hot_neurons(counts, 1000, 0.012);
  ASSERT_EQ(hot.size(), 704u);  // 500 above the rate, rounded to the nearest multiple of 704
  EXPECT_EQ(hot[0], 7 * 499 + 3);  // most frequent first
  for (size_t i = 0; i < 500; ++i) EXPECT_GE(counts[size_t(hot[i])], 50);
  EXPECT_EQ(hot[500], 0);  // then the zero counts, lowest index first
  EXPECT_EQ(hot[501], 1);
  for (const auto& [above, expect] : {std::pair{351, 0}, {352, 704}, {1100, 1408}, {5632, 4928}}) {
    std::vector<int64_t> c(5632, 0);
    for (int j = 0; j < above; ++j) c[size_t(j)] = 100;
    EXPECT_EQ(cuda::choose_hot_neurons(c, 1000).size(), size_t(expect)) << above << " above the rate";
  }
  // At most I - 64, so that the sparse part keeps some: none where no step fits.
  EXPECT_EQ(cuda::choose_hot_neurons(std::vector<int64_t>(1408, 1000), 1000).size(), 704u);
  EXPECT_TRUE(cuda::choose_hot_neurons(std::vector<int64_t>(704, 1000), 1000).empty());
  EXPECT_TRUE(cuda::choose_hot_neurons(std::vector<int64_t>(640, 1000), 1000).empty());
}

TEST(ChooseHotNeurons, RefusesBadArguments) {
  const std::vector<int64_t> counts(128, 5);
  EXPECT_THROW(cuda::choose_hot_neurons(counts, 0), Error);
  EXPECT_THROW(cuda::choose_hot_neurons(counts, 4), Error);  // a count above the tokens
  EXPECT_THROW(cuda::choose_hot_neurons(counts, 10, 0.0), Error);
  EXPECT_THROW(cuda::choose_hot_neurons(counts, 10, std::nan("")), Error);
  EXPECT_THROW(cuda::choose_hot_neurons({-1, 2}, 10), Error);
}

struct SplitCase {
  int64_t M, H, I;
  double density;
  bool skewed, gated;
};

std::string split_name(const testing::TestParamInfo<SplitCase>& info) {
  const auto& c = info.param;
  return str("M", c.M, "_H", c.H, "_I", c.I, "_d", static_cast<int>(std::lround(c.density * 1000)), "permille_",
             c.skewed ? "skewed" : "uniform", c.gated ? "_gated" : "_plain");
}

double rms(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += load_as_double(t, i) * load_as_double(t, i);
  return std::sqrt(s / std::max<int64_t>(t.numel(), 1));
}

struct Problem {
  bench::SyntheticFfn f;
  DeviceTensor x, wg, wu, wd;
  FfnWeights w() const { return {wg.view(), wu.view(), wd.view()}; }
  explicit Problem(const SplitCase& c)
      : f(bench::make_synthetic_ffn({c.M, c.H, c.I, c.density,
                                     c.skewed ? bench::Distribution::skewed : bench::Distribution::uniform, c.gated,
                                     11})),
        x(DeviceTensor::upload(f.x)),
        wg(c.gated ? DeviceTensor::upload(f.wg) : DeviceTensor()),
        wu(DeviceTensor::upload(f.wu)),
        wd(DeviceTensor::upload(f.wd)) {}
};

class SplitFfnGpu : public testing::TestWithParam<SplitCase> {};

TEST_P(SplitFfnGpu, MatchesCpuReference) {
  TWELL_REQUIRE_HOPPER();
  const SplitCase& c = GetParam();
  const Problem p(c);
  Tensor y_cpu = Tensor::of<bf16>({c.M, c.H}), y64 = Tensor::of<double>({c.M, c.H});
  cpu::ffn_forward(p.f.x, p.f.weights(), y_cpu, Precision::bf16);
  cpu::ffn_forward(p.f.x, p.f.weights(), y64, Precision::f64);
  const double cpu_err = relative_error(y_cpu, y64), scale = rms(y_cpu);

  // Hot sets: the 128 neurons that fire most (as choose_hot_neurons orders them), and a fixed
  // scattered set in a scrambled order.
  const std::vector<int64_t> counts = cuda::count_active_neurons(p.x, p.w(), nullptr);
  std::vector<int32_t> chosen(size_t(c.I));
  std::iota(chosen.begin(), chosen.end(), 0);
  std::stable_sort(chosen.begin(), chosen.end(), [&](int32_t a, int32_t b) { return counts[size_t(a)] > counts[size_t(b)]; });
  chosen.resize(128);
  std::vector<int32_t> scattered;
  for (int64_t j = c.I - 1; j >= 0 && scattered.size() < 64; j -= 3) scattered.push_back(static_cast<int32_t>(j));
  std::swap(scattered[0], scattered[40]);
  // And the rule's own set, end to end (at a rate every firing neuron passes; 704-neuron steps, so
  // only where I - 64 holds one), and the most the constructor takes, all but 64.
  const std::vector<int32_t> ruled = cuda::choose_hot_neurons(counts, c.M, 1e-9);
  std::vector<int32_t> all_but_64(size_t(c.I - 64));
  std::iota(all_but_64.begin(), all_but_64.end(), 64);
  std::vector<std::pair<std::vector<int32_t>, const char*>> sets{{chosen, "chosen"}, {scattered, "scattered"},
                                                                 {all_but_64, "all but 64"}};
  if (!ruled.empty()) sets.emplace_back(ruled, "choose_hot_neurons'");
  for (const auto& [hot, hot_name] : sets) {
    for (const Dispatch d : {Dispatch::always_sparse, Dispatch::always_dense, Dispatch::previous}) {
      SCOPED_TRACE(str(hot_name, " hot set of ", hot.size(), ", dispatch ", static_cast<int>(d)));
      cuda::FfnOptions o;
      o.dispatch = d;
      o.sparse_min_tokens = 0;
      cuda::SplitFfn ffn({c.M + 5, c.H, c.I, c.gated}, p.w(), hot, o, nullptr);
      DeviceTensor y(DType::bf16, {c.M, c.H});
      for (int call = 0; call < 2; ++call) {  // previous: the second call decides on the first's sample
        cuda::fill_bytes(y.view().data, y.nbytes(), 0xff, nullptr);  // poison: NaN
        ffn.forward(p.x, y, nullptr);
      }
      TWELL_CUDA_CHECK(cudaDeviceSynchronize());
      const Tensor y_gpu = y.download();
      EXPECT_LE(relative_error(y_gpu, y64), 2 * cpu_err + 1e-4) << "cpu bf16 rel_err " << cpu_err;
      EXPECT_TRUE(test::all_close(y_gpu, y_cpu, 0.05 * scale + 1e-6, 0.02));
    }
  }
}

std::vector<SplitCase> split_cases() {
  std::vector<SplitCase> cases;
  for (double d : {0.0, 0.005, 0.02, 0.1, 1.0}) cases.push_back({300, 256, 1344, d, true, true});
  cases.push_back({1, 256, 640, 0.05, true, true});       // one token: the cold part's one-token kernel
  cases.push_back({7, 512, 1536, 0.05, false, true});     // a few tokens: the gather path
  cases.push_back({67, 192, 640, 0.1, false, false});     // non-gated, H not a power of two
  cases.push_back({65, 2048, 5632, 0.005, true, true});   // the paper's shape
  cases.push_back({2100, 256, 1408, 0.01, true, true});   // the TwELL path (past gather_max_tokens)
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, SplitFfnGpu, testing::ValuesIn(split_cases()), split_name);

// The split holds its own copy of the weights: the caller's may change (here to NaN) or go once the
// constructor returns; and a call of no tokens writes nothing.
TEST(SplitFfnGpuBits, OwnsItsWeightsAndTakesNoTokens) {
  TWELL_REQUIRE_HOPPER();
  const SplitCase c{300, 256, 1344, 0.02, true, true};
  Problem p(c);
  std::vector<int32_t> hot(128);
  for (int32_t i = 0; i < 128; ++i) hot[size_t(i)] = 10 * i + 3;
  cuda::FfnOptions o;
  o.dispatch = Dispatch::always_sparse;
  cuda::SplitFfn split({c.M, c.H, c.I}, p.w(), hot, o, nullptr);
  DeviceTensor y_before(DType::bf16, {c.M, c.H}), y_after(DType::bf16, {c.M, c.H});
  split.forward(p.x, y_before, nullptr);
  for (DeviceTensor* t : {&p.wg, &p.wu, &p.wd}) cuda::fill_bytes(t->view().data, t->nbytes(), 0xff, nullptr);
  split.forward(p.x, y_after, nullptr);
  EXPECT_TRUE(test::bit_equal(y_after.download(), y_before.download()));
  DeviceTensor x0(DType::bf16, {0, c.H}), y0(DType::bf16, {0, c.H});
  EXPECT_NO_THROW(split.forward(x0, y0, nullptr));
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
}

// With no hot neurons the split is FfnForward on a copy of the weights: the same bits.
TEST(SplitFfnGpuBits, NoHotNeuronsIsFfnForward) {
  TWELL_REQUIRE_HOPPER();
  const Problem p({300, 256, 1344, 0.02, true, true});
  cuda::FfnOptions o;
  o.dispatch = Dispatch::always_sparse;
  cuda::FfnForward plain({300, 256, 1344}, o);
  cuda::SplitFfn split({300, 256, 1344}, p.w(), {}, o, nullptr);
  DeviceTensor y1(DType::bf16, {300, 256}), y2(DType::bf16, {300, 256});
  plain.forward(p.x, p.w(), y1, nullptr);
  split.forward(p.x, y2, nullptr);
  EXPECT_TRUE(test::bit_equal(y1.download(), y2.download()));
}

// count_active_neurons against the CPU's gate: a pre-activation within rounding of 0 may go either
// way, so a few counts may differ by one.
TEST(SplitFfnGpuBits, CountsMatchTheCpuGate) {
  TWELL_REQUIRE_HOPPER();
  const SplitCase c{500, 256, 1344, 0.02, true, true};
  const Problem p(c);
  const std::vector<int64_t> counts = cuda::count_active_neurons(p.x, p.w(), nullptr);
  ASSERT_EQ(counts.size(), size_t(c.I));
  const TwellMatrix act = cpu::ffn_pack_activation(p.f.x, p.f.weights(), TwellLayout{});
  std::vector<int64_t> cpu_counts(size_t(c.I), 0);
  for (int64_t m = 0; m < c.M; ++m) act.for_each_in_row(m, [&](int64_t col, uint16_t) { ++cpu_counts[size_t(col)]; });
  int64_t differ = 0, total = 0;
  for (int64_t j = 0; j < c.I; ++j) {
    differ += std::abs(cpu_counts[size_t(j)] - counts[size_t(j)]);
    total += cpu_counts[size_t(j)];
  }
  EXPECT_GT(total, 0);
  EXPECT_LE(differ, std::max<int64_t>(2, total / 500)) << "of " << total << " non-zeros";
}

TEST(SplitFfnGpuBits, RefusesBadInput) {
  TWELL_REQUIRE_HOPPER();
  const Problem p({64, 256, 640, 0.02, true, true});
  cuda::FfnOptions o;
  std::vector<int32_t> hot(64);
  std::iota(hot.begin(), hot.end(), 0);
  auto make = [&](const std::vector<int32_t>& h, const cuda::FfnOptions& opts, const FfnWeights& w) {
    cuda::SplitFfn s({64, 256, 640}, w, h, opts, nullptr);
  };
  EXPECT_NO_THROW(make(hot, o, p.w()));
  EXPECT_THROW(make(std::vector<int32_t>(hot.begin(), hot.begin() + 32), o, p.w()), Error);  // not a multiple of 64
  auto dup = hot;
  dup[5] = 7;
  EXPECT_THROW(make(dup, o, p.w()), Error);
  auto outside = hot;
  outside[5] = 640;
  EXPECT_THROW(make(outside, o, p.w()), Error);
  std::vector<int32_t> all(640);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_THROW(make(all, o, p.w()), Error);  // nothing left sparse
  cuda::FfnOptions training = o;
  training.training = true;
  EXPECT_THROW(make(hot, training, p.w()), Error);
  cuda::FfnOptions fp32 = o;
  fp32.precision = Precision::h_fp32;
  EXPECT_THROW(make(hot, fp32, p.w()), Error);
  EXPECT_THROW(make(hot, o, FfnWeights{TensorView{}, p.wu.view(), p.wd.view()}), Error);  // gated shape, no wg
  {  // a non-gated shape with an empty wu
    auto plain = [&](const FfnWeights& w) { cuda::SplitFfn s({64, 256, 640, false}, w, hot, o, nullptr); };
    EXPECT_THROW(plain(FfnWeights{TensorView{}, TensorView{}, p.wd.view()}), Error);
  }
  const TensorView wd_reshaped(p.wd.view().data, DType::bf16, {320, 512}, Device::cuda);  // same bytes, wrong shape
  EXPECT_THROW(make(hot, o, FfnWeights{p.wg.view(), p.wu.view(), wd_reshaped}), Error);
  const TensorView wu_misaligned(static_cast<char*>(p.wu.view().data) + 2, DType::bf16, {640, 256}, Device::cuda);
  EXPECT_THROW(make(hot, o, FfnWeights{p.wg.view(), wu_misaligned, p.wd.view()}), Error);  // not 16-byte aligned
  auto negative = hot;
  negative[3] = -1;
  EXPECT_THROW(make(negative, o, p.w()), Error);
  const Tensor host_wu = p.wu.download();
  EXPECT_THROW(make(hot, o, FfnWeights{p.wg.view(), host_wu, p.wd.view()}), Error);  // on the host

  // forward: a y of the wrong shape is refused before anything is written.
  cuda::SplitFfn s({64, 256, 640}, p.w(), hot, o, nullptr);
  DeviceTensor y(DType::bf16, {64, 256}), bad(DType::bf16, {64, 128});
  cuda::fill_bytes(bad.view().data, bad.nbytes(), 0x11, nullptr);
  EXPECT_THROW(s.forward(p.x, bad, nullptr), Error);
  const Tensor after = bad.download();
  for (int64_t i = 0; i < after.numel(); ++i) ASSERT_EQ(after.ptr<bf16>()[i].bits, 0x1111) << i;
  DeviceTensor too_many(DType::bf16, {65, 256});
  EXPECT_THROW(s.forward(too_many, y, nullptr), Error);
}

}  // namespace
}  // namespace twell
