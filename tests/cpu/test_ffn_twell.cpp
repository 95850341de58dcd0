// Sparse CPU FFN forward from TwELL activations (ffn_pack_activation + ffn_forward_twell) against
// the dense forward: bit-identical y and statistics at every density, for uniform and skewed
// activations, with tiles that fit and tiles that overflow into the dense backup.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "ffn_test_util.h"
#include "twell/cpu/ffn.h"
#include "twell/formats/twell_format.h"

namespace twell::cpu_test {
namespace {

enum class Dist { uniform, skewed };

// Upper-tail quantile of N(0, 1): t with P(z > t) = p, by bisection on erfc.
double normal_upper_quantile(double p) {
  double lo = -12, hi = 12;
  for (int k = 0; k < 200; ++k) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// A problem whose activation density is controlled: x[:, 0] = 1 and x[:, 1] = a per-token
// boost b_m; the activation's weight matrix (Wg, or Wu when non-gated) has A[j, 0] = −t_j and
// A[j, 1] = 1, the rest N(0, 1/(H−2)). So pre[m, j] = z − t_j + b_m with z ≈ N(0, 1), and
// neuron j fires with probability p_j = P(z > t_j − b_m).
//   uniform: p_j = density, b_m = 0.
//   skewed:  10% dead neurons; the others p_j = density · lognormal(σ = 1.5) (clipped to 1);
//            ~3% of tokens very dense (b_m = +12: every live neuron fires); ~5% empty (b = −1000).
Problem density_problem(int64_t M, int64_t H, int64_t I, bool gated, double density, Dist dist,
                        uint64_t seed) {
  Problem p = random_problem(M, H, I, gated, DType::bf16, seed);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::normal_distribution<double> nd(0.0, 1.0);
  const Tensor& a = gated ? p.wg : p.wu;
  const double scale = 1.0 / std::sqrt(static_cast<double>(H - 2));
  for (int64_t j = 0; j < I; ++j) {
    double pj = density;
    bool dead = false;
    if (dist == Dist::skewed) {
      dead = uni(rng) < 0.10;
      pj = std::min(1.0, density * std::exp(1.5 * nd(rng) - 1.125));  // mean factor 1
    }
    const double t = dead || pj <= 0 ? 1000.0 : pj >= 1 ? -12.0 : normal_upper_quantile(pj);
    store_from_double(a, j * H + 0, -t);
    store_from_double(a, j * H + 1, 1.0);
    for (int64_t k = 2; k < H; ++k) store_from_double(a, j * H + k, nd(rng) * scale);
  }
  for (int64_t m = 0; m < M; ++m) {
    double boost = 0;
    if (dist == Dist::skewed) {
      const double r = uni(rng);
      boost = r < 0.03 ? 12.0 : r < 0.08 ? -1000.0 : 0.0;
    }
    store_from_double(p.x, m * H + 0, 1.0);
    store_from_double(p.x, m * H + 1, boost);
  }
  return p;
}

// DESIGN.md §5's densities plus both sides of the 256/8 capacity (32 of 256 = 12.5%).
const double kDensities[] = {0.0, 0.005, 0.01, 0.02, 0.05, 0.10, 0.12, 0.13, 0.5, 1.0};

struct LayoutCase {
  int32_t tile, compression;
};
// 256/8: the reference layout (capacity 32 = 12.5%); 64/4: capacity 16 of 64, so 50% and 100%
// overflow most tiles; 48/4 leaves a partial last tile of I = 600.
const LayoutCase kLayouts[] = {{256, 8}, {64, 4}, {48, 4}};

class CpuFfnTwell : public ::testing::TestWithParam<std::tuple<bool, Precision>> {};

TEST_P(CpuFfnTwell, SparseForwardBitIdenticalToDenseAtEveryDensity) {
  const auto [gated, precision] = GetParam();
  const int64_t M = 41, H = 67, I = 600;
  int64_t spilled_cases = 0;
  for (Dist dist : {Dist::uniform, Dist::skewed})
    for (double density : kDensities) {
      const Problem p = density_problem(M, H, I, gated, density, dist, 100 + int(density * 1000));
      for (DType y_dtype : {DType::f32, DType::bf16}) {
        Tensor y_dense(y_dtype, {M, H});
        ActivationStats dense_stats;
        cpu::ffn_forward(p.x, p.weights(), y_dense, precision, &dense_stats);
        for (const LayoutCase& lc : kLayouts) {
          TwellLayout layout;
          layout.tile = lc.tile;
          layout.compression = lc.compression;
          const TwellMatrix act = cpu::ffn_pack_activation(p.x, p.weights(), layout);
          SCOPED_TRACE(str(dist == Dist::uniform ? "uniform" : "skewed", " density ", density,
                           " (measured ", double(dense_stats.nnz) / (M * I), "), tile ", lc.tile,
                           "/C=", lc.compression, ", y ", dtype_name(y_dtype)));
          ASSERT_EQ(act.layout.rows, M);
          ASSERT_EQ(act.layout.cols, I);
          twell_validate(act);
          const TwellOccupancy occ = twell_occupancy(act);
          spilled_cases += occ.spilled_tiles > 0;
          if (density >= 0.5) {
            EXPECT_GT(occ.spilled_tiles, 0) << "expected over-capacity tiles";
          }

          Tensor y_sparse(y_dtype, {M, H});
          poison(y_sparse);
          ActivationStats sparse_stats;
          cpu::ffn_forward_twell(p.x, act, p.weights(), y_sparse, precision, &sparse_stats);
          EXPECT_TRUE(test::bit_equal(y_sparse, y_dense));
          EXPECT_EQ(sparse_stats.tokens, dense_stats.tokens);
          EXPECT_EQ(sparse_stats.nnz, dense_stats.nnz);
          EXPECT_EQ(sparse_stats.max_nnz_per_token, dense_stats.max_nnz_per_token);
          EXPECT_EQ(sparse_stats.l1_sum, dense_stats.l1_sum);
        }
      }
    }
  EXPECT_GT(spilled_cases, 0);
}

INSTANTIATE_TEST_SUITE_P(GatedAndPrecision, CpuFfnTwell,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Precision::bf16, Precision::h_fp32)),
                         cpu_test::gated_precision_name);

// The packed activation is g = bf16(relu(x Wgᵀ)): the same bits as the h of a non-gated FFN whose
// up projection is Wg (its bf16 h is exactly that).
TEST(CpuFfnTwellPack, HoldsExactlyTheBf16Gate) {
  const int64_t M = 23, H = 40, I = 300;
  for (double density : {0.02, 0.3}) {
    SCOPED_TRACE(str("density ", density));
    const Problem p = density_problem(M, H, I, true, density, Dist::skewed, 7);
    TwellLayout layout;
    layout.tile = 64;
    layout.compression = 8;
    const TwellMatrix act = cpu::ffn_pack_activation(p.x, p.weights(), layout);
    Tensor unpacked(DType::bf16, {M, I});
    twell_unpack(act, unpacked);

    const FfnWeights as_non_gated{TensorView{}, p.wg.view(), p.wd.view()};
    Tensor y(DType::f32, {M, H}), g(DType::bf16, {M, I});
    cpu::ffn_forward(p.x, as_non_gated, y, Precision::bf16, nullptr, g);
    EXPECT_TRUE(test::bit_equal(unpacked, g));
    EXPECT_EQ(act.nnz(), cpu::activation_stats(g).nnz);
  }
}

TEST(CpuFfnTwellPack, KeepsTileAndCompressionAndFillsRowsAndCols) {
  const Problem p = random_problem(5, 16, 70, false, DType::f32, 3);
  TwellLayout layout;
  layout.rows = 999;  // overwritten from x and w
  layout.cols = 1;
  layout.tile = 32;
  layout.compression = 2;
  const TwellMatrix act = cpu::ffn_pack_activation(p.x, p.weights(), layout);
  EXPECT_EQ(act.layout.rows, 5);
  EXPECT_EQ(act.layout.cols, 70);
  EXPECT_EQ(act.layout.tile, 32);
  EXPECT_EQ(act.layout.compression, 2);
}

}  // namespace
}  // namespace twell::cpu_test
