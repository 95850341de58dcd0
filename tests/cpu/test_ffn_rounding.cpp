// The rounding points of Precision::bf16 and h_fp32 (src/cpu/ffn_common.h), checked bit for bit.
// Inputs are small integers (|w| <= 8, |x| <= 16, H = 32), so every dot product is an exact integer
// in any order and every product below is exact in fp32; the only roundings left are the documented
// ones, which this file re-implements independently: bf16 at g, u, h (bf16 only), dh, du, dg,
// and fp32 sums in the documented order (ascending j for y and dx, ascending m for dW).
#include <gtest/gtest.h>

#include <cmath>

#include "ffn_test_util.h"
#include "twell/cpu/ffn.h"

namespace twell::cpu_test {
namespace {

Problem integer_problem(int64_t M, int64_t H, int64_t I, bool gated, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> v(-8, 8), vx(-16, 16);  // pre-activations reach > 256
  Problem p;
  p.M = M, p.H = H, p.I = I, p.gated = gated;
  p.x = Tensor(DType::f32, {M, H});
  p.wu = Tensor(DType::bf16, {I, H});
  p.wd = Tensor(DType::bf16, {I, H});
  if (gated) p.wg = Tensor(DType::bf16, {I, H});
  for (int64_t i = 0; i < p.x.numel(); ++i) store_from_double(p.x, i, vx(rng));
  for (const Tensor* t : {&p.wg, &p.wu, &p.wd})
    if (!t->view().empty())
      for (int64_t i = 0; i < t->numel(); ++i) store_from_double(*t, i, v(rng));
  return p;
}

float bf(float v) {
  return round_bf16(v);
}

// The forward quantities of one (m, j), by the rules of the comment block in ffn_common.h.
struct Entry {
  bool active = false;
  float g = 0, u = 0, h = 0;
  bool needs_rounding = false;  // some value at a bf16 rounding point has more than 8 bits
};

Entry expected_entry(const Problem& p, Precision prec, int64_t m, int64_t j) {
  const auto dot = [&](const Tensor& w) {
    double s = 0;  // exact: integers
    for (int64_t k = 0; k < p.H; ++k)
      s += load_as_double(p.x, m * p.H + k) * load_as_double(w, j * p.H + k);
    return static_cast<float>(s);
  };
  Entry e;
  if (p.gated) {
    const float pre_g = std::max(dot(p.wg), 0.0f), pre_u = dot(p.wu);
    e.g = bf(pre_g);
    e.active = e.g != 0;
    if (!e.active) return e;
    e.u = bf(pre_u);
    e.h = prec == Precision::bf16 ? bf(e.g * e.u) : e.g * e.u;
    e.needs_rounding = e.g != pre_g || e.u != pre_u || bf(e.g * e.u) != e.g * e.u;
  } else {
    const float pre = std::max(dot(p.wu), 0.0f);
    e.active = bf(pre) != 0;
    e.h = prec == Precision::bf16 ? bf(pre) : pre;
    e.needs_rounding = bf(pre) != pre;
  }
  return e;
}

class CpuFfnRounding : public ::testing::TestWithParam<std::tuple<bool, Precision>> {};

TEST_P(CpuFfnRounding, ForwardAndBackwardRoundExactlyWhereDocumented) {
  const auto [gated, prec] = GetParam();
  const int64_t M = 6, H = 32, I = 40;
  const Problem p = integer_problem(M, H, I, gated, gated ? 5 : 6);
  const Tensor dy = [&] {
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<int> v(-8, 8);
    Tensor t(DType::f32, {M, H});
    for (int64_t i = 0; i < t.numel(); ++i) store_from_double(t, i, v(rng));
    return t;
  }();
  const float l1 = 0.5f;

  std::vector<Entry> e(static_cast<size_t>(M * I));
  int64_t needs_rounding = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < I; ++j) {
      e[m * I + j] = expected_entry(p, prec, m, j);
      needs_rounding += e[m * I + j].needs_rounding;
    }
  ASSERT_GT(needs_rounding, 10) << "the integer ranges do not exercise the rounding points";

  // Forward: y = fp32 Σ_j h·Wd_j over non-zero h, ascending j.
  std::vector<float> y_want(static_cast<size_t>(M * H), 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < I; ++j)
      if (const float h = e[m * I + j].h; h != 0)
        for (int64_t c = 0; c < H; ++c)
          y_want[m * H + c] += h * static_cast<float>(load_as_double(p.wd, j * H + c));
  Tensor y(DType::f32, {M, H}), h_out(DType::f32, {M, I});
  cpu::ffn_forward(p.x, p.weights(), y, prec, nullptr, h_out);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < I; ++j)
      ASSERT_EQ(h_out.ptr<float>()[m * I + j], e[m * I + j].h) << "h at (" << m << ", " << j << ")";
  for (int64_t i = 0; i < M * H; ++i)
    ASSERT_EQ(y.ptr<float>()[i], y_want[i]) << "y at (" << i / H << ", " << i % H << ")";

  // Backward: dh = bf16(dot(dy, Wd_j) + l1·sign(h)), du = bf16(dh·g), dg = bf16(dh·u) (bf16 only).
  const auto rnd = [&, prec = prec](float v) { return prec == Precision::bf16 ? bf(v) : v; };
  std::vector<float> dg(e.size(), 0.0f), du(e.size(), 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < I; ++j) {
      const Entry& x = e[m * I + j];
      if (!x.active) continue;
      double s = 0;
      for (int64_t c = 0; c < H; ++c)
        s += load_as_double(dy, m * H + c) * load_as_double(p.wd, j * H + c);
      const float sgn = x.h > 0 ? 1.0f : x.h < 0 ? -1.0f : 0.0f;
      const float dh = rnd(static_cast<float>(s) + l1 * sgn);
      du[m * I + j] = gated ? rnd(dh * x.g) : dh;
      dg[m * I + j] = gated ? rnd(dh * x.u) : 0.0f;
    }
  std::vector<float> dx_want(static_cast<size_t>(M * H), 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < I; ++j) {
      if (!e[m * I + j].active) continue;
      for (int64_t c = 0; c < H; ++c) {
        if (gated)
          dx_want[m * H + c] += dg[m * I + j] * static_cast<float>(load_as_double(p.wg, j * H + c));
        dx_want[m * H + c] += du[m * I + j] * static_cast<float>(load_as_double(p.wu, j * H + c));
      }
    }
  std::vector<float> dwg_want(static_cast<size_t>(I * H), 0.0f), dwu_want = dwg_want,
                                                                 dwd_want = dwg_want;
  for (int64_t j = 0; j < I; ++j)
    for (int64_t m = 0; m < M; ++m) {
      if (!e[m * I + j].active) continue;
      for (int64_t c = 0; c < H; ++c) {
        const float xv = p.x.ptr<float>()[m * H + c], dyv = dy.ptr<float>()[m * H + c];
        dwg_want[j * H + c] += dg[m * I + j] * xv;
        dwu_want[j * H + c] += du[m * I + j] * xv;
        dwd_want[j * H + c] += e[m * I + j].h * dyv;
      }
    }
  Tensor dx(DType::f32, {M, H}), dwg(DType::f32, {I, H}), dwu(DType::f32, {I, H}),
      dwd(DType::f32, {I, H});
  cpu::ffn_backward(p.x, p.weights(), dy, l1, {dx, gated ? dwg.view() : TensorView{}, dwu, dwd},
                    prec);
  for (int64_t i = 0; i < M * H; ++i)
    ASSERT_EQ(dx.ptr<float>()[i], dx_want[i]) << "dx at (" << i / H << ", " << i % H << ")";
  for (int64_t i = 0; i < I * H; ++i) {
    if (gated) {
      ASSERT_EQ(dwg.ptr<float>()[i], dwg_want[i]) << "dwg at (" << i / H << ", " << i % H << ")";
    }
    ASSERT_EQ(dwu.ptr<float>()[i], dwu_want[i]) << "dwu at (" << i / H << ", " << i % H << ")";
    ASSERT_EQ(dwd.ptr<float>()[i], dwd_want[i]) << "dwd at (" << i / H << ", " << i % H << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(GatedAndPrecision, CpuFfnRounding,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Precision::bf16, Precision::h_fp32)),
                         cpu_test::gated_precision_name);

}  // namespace
}  // namespace twell::cpu_test
