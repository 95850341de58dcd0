// CPU FFN backward (src/cpu/ffn_backward.cpp): float64 gradients against central finite
// differences of L = Σ y⊙r + l1·Σ|h|, and the bf16 pipeline against the float64 one.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "ffn_test_util.h"
#include "twell/cpu/ffn.h"

namespace twell::cpu_test {
namespace {

struct Grads {
  Tensor dx, dwg, dwu, dwd;
  FfnGrads views() const { return {dx, dwg, dwu, dwd}; }
};

Grads make_grads(const Problem& p, DType dtype) {
  Grads g;
  g.dx = Tensor(dtype, {p.M, p.H});
  g.dwu = Tensor(dtype, {p.I, p.H});
  g.dwd = Tensor(dtype, {p.I, p.H});
  if (p.gated) g.dwg = Tensor(dtype, {p.I, p.H});
  for (const Tensor* t : {&g.dx, &g.dwg, &g.dwu, &g.dwd})
    if (!t->view().empty()) poison(*t);
  return g;
}

// L = Σ y⊙r + l1·Σ|h| evaluated by the f64 forward.
double loss(const Problem& p, const Tensor& r, double l1) {
  Tensor y(DType::f64, {p.M, p.H});
  ActivationStats stats;
  cpu::ffn_forward(p.x, p.weights(), y, Precision::f64, &stats);
  double l = 0;
  for (int64_t i = 0; i < y.numel(); ++i) l += load_as_double(y, i) * load_as_double(r, i);
  return l + l1 * stats.l1_sum;
}

// Central differences of L with respect to every element of `param` (a tensor of p).
std::vector<double> finite_difference(Problem& p, const Tensor& param, const Tensor& r, double l1) {
  // L is a cubic polynomial in each coordinate between ReLU kinks, so the truncation error of a
  // central difference is ~ε²·L'''; with ε = 1e-5 it and the rounding error ~1e-16·|L|/ε are
  // both ~1e-10, far below the 1e-6 tolerance.
  const double eps = 1e-5;
  std::vector<double> g(static_cast<size_t>(param.numel()));
  for (int64_t i = 0; i < param.numel(); ++i) {
    const double v = load_as_double(param, i);
    store_from_double(param, i, v + eps);
    const double lp = loss(p, r, l1);
    store_from_double(param, i, v - eps);
    const double lm = loss(p, r, l1);
    store_from_double(param, i, v);
    g[i] = (lp - lm) / (2 * eps);
  }
  return g;
}

// A random f64 problem whose pre-activations all keep |pre| >= 1e-3, so that no ReLU kink (and
// no kink of |h|) lies within the finite-difference step.
Problem problem_away_from_kinks(int64_t M, int64_t H, int64_t I, bool gated, uint64_t seed) {
  for (uint64_t attempt = 0;; ++attempt) {
    Problem p = random_problem(M, H, I, gated, DType::f64, seed + 7919 * attempt);
    const NaiveForward ref = naive_forward(p);
    bool ok = true;
    for (size_t i = 0; i < ref.pre_u.size(); ++i)
      ok = ok && std::fabs(ref.pre_u[i]) >= 1e-3 && (!gated || std::fabs(ref.pre_g[i]) >= 1e-3);
    if (ok) return p;
  }
}

class CpuFfnBackwardFd : public ::testing::TestWithParam<std::tuple<bool, double>> {};

TEST_P(CpuFfnBackwardFd, F64GradientsMatchCentralDifferences) {
  const auto [gated, l1] = GetParam();
  Problem p = problem_away_from_kinks(3, 5, 7, gated, gated ? 11 : 12);
  const Tensor r = random_tensor(DType::f64, {3, 5}, 99);
  Grads g = make_grads(p, DType::f64);
  cpu::ffn_backward(p.x, p.weights(), r, l1, g.views(), Precision::f64);

  int64_t active = 0;
  for (double h : naive_forward(p).h) active += h != 0;
  ASSERT_GT(active, 3) << "degenerate sample: too few active neurons";

  struct Case {
    const char* name;
    const Tensor* param;
    const Tensor* grad;
  };
  std::vector<Case> cases = {{"dx", &p.x, &g.dx}, {"dwu", &p.wu, &g.dwu}, {"dwd", &p.wd, &g.dwd}};
  if (gated) cases.push_back({"dwg", &p.wg, &g.dwg});
  for (const Case& c : cases) {
    const std::vector<double> fd = finite_difference(p, *c.param, r, l1);
    const std::vector<double> an = to_f64(*c.grad);
    EXPECT_LE(rel_error(an, fd), 1e-6) << c.name;
    std::vector<double> bound(fd.size());
    for (size_t i = 0; i < fd.size(); ++i) bound[i] = 1e-6 * std::fabs(fd[i]) + 1e-8;
    EXPECT_TRUE(within_bounds(an, fd, bound, p.H)) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(GatedAndL1, CpuFfnBackwardFd,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0.0, 0.3)),
                         [](const auto& test_info) {
                           return str(std::get<0>(test_info.param) ? "gated" : "non_gated",
                                      std::get<1>(test_info.param) > 0 ? "_l1" : "_no_l1");
                         });

// bf16 backward against f64 backward on the same bf16 inputs. Every term of every gradient
// carries at most three bf16 roundings (e.g. dWu: du = bf16(bf16(dh)·g) with g rounded; dWd:
// h = bf16(g·u)), i.e. <= 3u = 1.2% per term; they are independent, so norm-wise they partly
// cancel (measured ~0.3%, see the printed errors). Tolerance 2u = 0.78%: comfortably above the
// measured error, and well below the 1-5% a wrong rounding point or a dropped term would give.
TEST(CpuFfnBackward, Bf16WithinRoundingErrorOfF64) {
  for (bool gated : {true, false}) {
    SCOPED_TRACE(gated ? "gated" : "non-gated");
    const Problem p = random_problem(32, 96, 200, gated, DType::bf16, gated ? 21 : 22);
    const Tensor dy = random_tensor(DType::bf16, {32, 96}, 23);
    const double l1 = 0.05;  // comparable to |dh| ~ 1, so the sign(h) term matters
    Grads g64 = make_grads(p, DType::f64), g32 = make_grads(p, DType::f32);
    cpu::ffn_backward(p.x, p.weights(), dy, l1, g64.views(), Precision::f64);
    cpu::ffn_backward(p.x, p.weights(), dy, l1, g32.views(), Precision::bf16);
    std::vector<std::pair<const char*, std::pair<const Tensor*, const Tensor*>>> cases = {
        {"dx", {&g32.dx, &g64.dx}}, {"dwu", {&g32.dwu, &g64.dwu}}, {"dwd", {&g32.dwd, &g64.dwd}}};
    if (gated) cases.push_back({"dwg", {&g32.dwg, &g64.dwg}});
    for (const auto& [name, t] : cases) {
      const double err = rel_error(to_f64(*t.first), to_f64(*t.second));
      EXPECT_LE(err, 2 * kBf16Eps) << name;
      std::printf("    bf16 vs f64 %s %s: relative error %.2e\n", gated ? "gated" : "non-gated",
                  name, err);
    }
  }
}

// h_fp32 keeps dh, du, dg (and h) in fp32: closer to f64 than the bf16 pipeline.
TEST(CpuFfnBackward, HFp32IsCloserToF64ThanBf16) {
  const Problem p = random_problem(16, 64, 120, true, DType::bf16, 31);
  const Tensor dy = random_tensor(DType::f32, {16, 64}, 32);
  Grads g64 = make_grads(p, DType::f64), gh = make_grads(p, DType::f32),
        gb = make_grads(p, DType::f32);
  cpu::ffn_backward(p.x, p.weights(), dy, 0.01, g64.views(), Precision::f64);
  cpu::ffn_backward(p.x, p.weights(), dy, 0.01, gh.views(), Precision::h_fp32);
  cpu::ffn_backward(p.x, p.weights(), dy, 0.01, gb.views(), Precision::bf16);
  for (auto member : {&Grads::dx, &Grads::dwg, &Grads::dwu, &Grads::dwd})
    EXPECT_LT(rel_error(to_f64(gh.*member), to_f64(g64.*member)),
              rel_error(to_f64(gb.*member), to_f64(g64.*member)));
}

// Inactive neurons get exactly zero weight-gradient rows; empty views are skipped.
TEST(CpuFfnBackward, DeadNeuronsGetZeroRowsAndEmptyViewsAreSkipped) {
  Problem p = random_problem(6, 12, 20, true, DType::f32, 41);
  for (int64_t k = 0; k < 12; ++k) store_from_double(p.wg, 3 * 12 + k, 0.0);  // neuron 3: g = 0
  const Tensor dy = random_tensor(DType::f32, {6, 12}, 42);
  Grads g = make_grads(p, DType::f32);
  FfnGrads views = g.views();
  views.dx = TensorView{};
  cpu::ffn_backward(p.x, p.weights(), dy, 0.0, views, Precision::bf16);
  for (int64_t k = 0; k < 12; ++k) {
    EXPECT_EQ(load_as_double(g.dwg, 3 * 12 + k), 0.0);
    EXPECT_EQ(load_as_double(g.dwu, 3 * 12 + k), 0.0);
    EXPECT_EQ(load_as_double(g.dwd, 3 * 12 + k), 0.0);
  }
  for (int64_t i = 0; i < g.dx.numel(); ++i) ASSERT_TRUE(std::isnan(load_as_double(g.dx, i)));
  for (int64_t i = 0; i < g.dwd.numel(); ++i) ASSERT_FALSE(std::isnan(load_as_double(g.dwd, i)));
}

// l1_coefficient is 0 for no tokens (it was λ/0 = inf, which the backward refuses), so an empty batch's
// backward runs as the recipe says; no layers is refused.
TEST(CpuFfnBackward, L1CoefficientOfNoTokensIsZero) {
  EXPECT_EQ(l1_coefficient(0.1, 0, 3), 0.0);
  EXPECT_EQ(l1_coefficient(0.0, 0, 1), 0.0);
  EXPECT_DOUBLE_EQ(l1_coefficient(0.3, 10, 3), 0.01);
  EXPECT_THROW(l1_coefficient(0.1, 10, 0), Error);
  EXPECT_THROW(l1_coefficient(0.1, -1, 1), Error);
  Problem p = random_problem(0, 12, 20, true, DType::f32, 43);
  const Tensor dy(DType::f32, {0, 12});
  Grads g = make_grads(p, DType::f32);
  cpu::ffn_backward(p.x, p.weights(), dy, l1_coefficient(0.1, 0, 1), g.views(), Precision::bf16);
  for (int64_t i = 0; i < g.dwd.numel(); ++i) ASSERT_EQ(load_as_double(g.dwd, i), 0.0);
}

}  // namespace
}  // namespace twell::cpu_test
