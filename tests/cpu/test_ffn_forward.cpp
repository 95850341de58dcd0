// Dense CPU FFN forward (src/cpu/ffn_forward.cpp) against a naive float64 FFN written here, at
// awkward shapes (M = 1, odd H, I not a multiple of any tile), gated and non-gated.
#include <gtest/gtest.h>

#include <cmath>

#include "ffn_test_util.h"
#include "twell/cpu/ffn.h"

namespace twell::cpu_test {
namespace {

struct Shape3 {
  int64_t M, H, I;
};
const Shape3 kShapes[] = {{1, 64, 256}, {7, 67, 300}, {13, 5, 33},
                          {1, 1, 1},    {3, 128, 1},  {2, 9, 513}};

std::string describe(const Shape3& s, bool gated) {
  return str("M=", s.M, " H=", s.H, " I=", s.I, gated ? " gated" : " non-gated");
}

// Σ_j |h| per token and the non-zero count of the naive h, for the statistics.
ActivationStats naive_stats(const NaiveForward& ref, int64_t M, int64_t I) {
  ActivationStats s;
  s.tokens = M;
  for (int64_t m = 0; m < M; ++m) {
    int64_t n = 0;
    for (int64_t j = 0; j < I; ++j) {
      n += ref.h[m * I + j] != 0;
      s.l1_sum += std::fabs(ref.h[m * I + j]);
    }
    s.nnz += n;
    s.max_nnz_per_token = std::max(s.max_nnz_per_token, n);
  }
  return s;
}

TEST(CpuFfnForward, F64MatchesNaiveFloat64To1e12) {
  for (bool gated : {true, false})
    for (const Shape3& s : kShapes) {
      SCOPED_TRACE(describe(s, gated));
      const Problem p = random_problem(s.M, s.H, s.I, gated, DType::f64, 1000 + s.M * 31 + s.I);
      const NaiveForward ref = naive_forward(p);
      Tensor y(DType::f64, {s.M, s.H}), h(DType::f64, {s.M, s.I});
      poison(y);
      poison(h);
      ActivationStats stats;
      cpu::ffn_forward(p.x, p.weights(), y, Precision::f64, &stats, h);

      // Both sides sum the same double products in different orders: the difference is a few
      // ulps of Σ|terms|, far below 1e-12 of it.
      std::vector<double> bound(ref.y.size());
      for (size_t i = 0; i < bound.size(); ++i) bound[i] = 1e-12 * ref.y_abs[i] + 1e-300;
      EXPECT_TRUE(within_bounds(to_f64(y), ref.y, bound, s.H));
      EXPECT_LE(rel_error(to_f64(y), ref.y), 1e-12);
      EXPECT_LE(rel_error(to_f64(h), ref.h), 1e-12);

      const ActivationStats want = naive_stats(ref, s.M, s.I);
      EXPECT_EQ(stats.tokens, s.M);
      EXPECT_EQ(stats.nnz, want.nnz);
      EXPECT_EQ(stats.max_nnz_per_token, want.max_nnz_per_token);
      EXPECT_NEAR(stats.l1_sum, want.l1_sum, 1e-12 * want.l1_sum);
      const ActivationStats from_h = cpu::activation_stats(h);
      EXPECT_EQ(from_h.nnz, stats.nnz);
      EXPECT_EQ(from_h.l1_sum, stats.l1_sum);  // same values, same order
    }
}

// bf16 pipeline: inputs are bf16 (so both sides read the same numbers); g, u and h are each
// rounded to bf16 (relative error <= u = 2^-8 each), so h carries <= 3u (+ O(u²)) relative error;
// the fp32 pre-activations add ~H·2^-24 of Σ|x·w|, and the fp32 sum over j ~I·2^-24 of Σ|h·Wd|.
// Hence |y − y64| <= 4u · Σ_j |h_j · Wd_jc| (3u for h, 1u of margin for the fp32 terms), plus
// one more u·|y| when y itself is stored as bf16.
TEST(CpuFfnForward, Bf16WithinRoundingBoundOfNaiveFloat64) {
  for (bool gated : {true, false})
    for (DType y_dtype : {DType::f32, DType::bf16})
      for (const Shape3& s : kShapes) {
        SCOPED_TRACE(describe(s, gated) + " y " + dtype_name(y_dtype));
        const Problem p = random_problem(s.M, s.H, s.I, gated, DType::bf16, 2000 + s.M * 31 + s.I);
        const NaiveForward ref = naive_forward(p);
        Tensor y(y_dtype, {s.M, s.H});
        poison(y);
        cpu::ffn_forward(p.x, p.weights(), y, Precision::bf16);
        std::vector<double> bound(ref.y.size());
        for (size_t i = 0; i < bound.size(); ++i)
          bound[i] = 4 * kBf16Eps * ref.y_abs[i] +
                     (y_dtype == DType::bf16 ? kBf16Eps * std::fabs(ref.y[i]) : 0.0) + 1e-30;
        EXPECT_TRUE(within_bounds(to_f64(y), ref.y, bound, s.H));
        // Norm-wise the independent roundings partly cancel: ~u, well inside 2u.
        EXPECT_LE(rel_error(to_f64(y), ref.y), 2 * kBf16Eps);
      }
}

// h_fp32 keeps h = g·u unrounded: its y is at least as close to float64 as bf16's, and h itself
// is within 2u (g and u rounded) of the float64 h.
TEST(CpuFfnForward, HFp32KeepsHUnroundedAndIsCloserThanBf16) {
  const Problem p = random_problem(9, 67, 300, true, DType::bf16, 77);
  const NaiveForward ref = naive_forward(p);
  Tensor y32(DType::f32, {9, 67}), y16(DType::f32, {9, 67}), h32(DType::f32, {9, 300});
  cpu::ffn_forward(p.x, p.weights(), y32, Precision::h_fp32, nullptr, h32);
  cpu::ffn_forward(p.x, p.weights(), y16, Precision::bf16);
  const std::vector<double> h = to_f64(h32);
  int64_t not_bf16 = 0;
  for (double v : h) not_bf16 += static_cast<double>(round_bf16(static_cast<float>(v))) != v;
  EXPECT_GT(not_bf16, 0) << "h_fp32 produced only bf16 values";
  std::vector<double> hb(h.size());
  for (size_t i = 0; i < h.size(); ++i)
    hb[i] = 2.2 * kBf16Eps * std::fabs(ref.h[i]) + 1e-5;  // + fp32 pre-activation error
  EXPECT_TRUE(within_bounds(h, ref.h, hb, 300));
  EXPECT_LE(rel_error(to_f64(y32), ref.y), rel_error(to_f64(y16), ref.y));
}

TEST(CpuFfnForward, WritesEveryElementAndHandlesEmptyRows) {
  // All gates negative for token 1: its y row must be written as zeros, not left poisoned.
  Problem p = random_problem(3, 16, 40, true, DType::f32, 5);
  for (int64_t c = 0; c < 16; ++c) store_from_double(p.x, 16 + c, 0.0);
  Tensor y(DType::f32, {3, 16});
  poison(y);
  ActivationStats stats;
  cpu::ffn_forward(p.x, p.weights(), y, Precision::bf16, &stats);
  for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(load_as_double(y, 16 + c), 0.0) << "column " << c;
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_FALSE(std::isnan(load_as_double(y, i))) << i;
  EXPECT_GT(stats.nnz, 0);
}

TEST(CpuFfnForward, AcceptsStridedAndMixedDtypeInputs) {
  // x as a column-strided view of a wider f64 buffer; f32 weights; bf16 y.
  const Problem p = random_problem(5, 33, 70, true, DType::f32, 9);
  Tensor wide(DType::f64, {5, 66});
  for (int64_t m = 0; m < 5; ++m)
    for (int64_t c = 0; c < 33; ++c)
      store_from_double(wide, m * 66 + 2 * c, load_as_double(p.x, m * 33 + c));
  TensorView xs(wide.view().data, DType::f64, {5, 33});
  xs.strides = {66, 2};
  Tensor y_ref(DType::bf16, {5, 33}), y(DType::bf16, {5, 33});
  cpu::ffn_forward(p.x, p.weights(), y_ref, Precision::bf16);
  cpu::ffn_forward(xs, p.weights(), y, Precision::bf16);
  EXPECT_TRUE(test::bit_equal(y, y_ref));
}

TEST(CpuFfnForward, ZeroTokensIsANoOp) {
  const Problem p = random_problem(0, 8, 16, true, DType::bf16, 1);
  Tensor y(DType::f32, {0, 8});
  ActivationStats stats;
  cpu::ffn_forward(p.x, p.weights(), y, Precision::bf16, &stats);
  EXPECT_EQ(stats.tokens, 0);
  EXPECT_EQ(stats.nnz, 0);
}

}  // namespace
}  // namespace twell::cpu_test
