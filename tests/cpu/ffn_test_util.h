// Helpers of the CPU FFN tests: random problems, a naive float64 FFN (three plain loops) and
// comparators that print where and by how much results differ.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/compare.h"
#include "twell/cpu/ffn.h"
#include "twell/ffn.h"
#include "twell/tensor.h"

namespace twell::cpu_test {

inline constexpr double kBf16Eps = 1.0 / 256;  // unit roundoff of bf16 (8 significant bits)

// An FFN problem owning its tensors. Values are stored in `dtype`, so every backend reads the
// same numbers (bf16 problems are generated already rounded).
struct Problem {
  int64_t M = 0, H = 0, I = 0;
  bool gated = true;
  Tensor x, wg, wu, wd;

  FfnWeights weights() const { return {gated ? wg.view() : TensorView{}, wu.view(), wd.view()}; }
};

inline void fill_normal(const Tensor& t, std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> nd(0.0, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_double(t, i, nd(rng));
}

// x ~ N(0, 1), weights ~ N(0, 1/H): pre-activations are O(1).
inline Problem random_problem(int64_t M, int64_t H, int64_t I, bool gated, DType dtype,
                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  Problem p;
  p.M = M, p.H = H, p.I = I, p.gated = gated;
  p.x = Tensor(dtype, {M, H});
  p.wu = Tensor(dtype, {I, H});
  p.wd = Tensor(dtype, {I, H});
  if (gated) p.wg = Tensor(dtype, {I, H});
  const double ws = 1.0 / std::sqrt(static_cast<double>(H));
  fill_normal(p.x, rng, 1.0);
  if (gated) fill_normal(p.wg, rng, ws);
  fill_normal(p.wu, rng, ws);
  fill_normal(p.wd, rng, ws);
  return p;
}

inline Tensor random_tensor(DType dtype, Shape shape, uint64_t seed, double stddev = 1.0) {
  std::mt19937_64 rng(seed);
  Tensor t(dtype, std::move(shape));
  fill_normal(t, rng, stddev);
  return t;
}

// ---- naive float64 reference: three plain loops ------------------------------------------------
struct NaiveForward {
  std::vector<double> pre_g, pre_u, h, y;  // [M, I], [M, I], [M, I], [M, H]
  std::vector<double> y_abs;               // Σ_j |h[m, j] · wd[j, c]|: the scale of y's error
};

inline NaiveForward naive_forward(const Problem& p) {
  const int64_t M = p.M, H = p.H, I = p.I;
  const std::vector<double> x = to_f64(p.x), wu = to_f64(p.wu), wd = to_f64(p.wd);
  const std::vector<double> wg = p.gated ? to_f64(p.wg) : std::vector<double>{};
  NaiveForward r;
  r.pre_g.assign(M * I, 0.0);
  r.pre_u.assign(M * I, 0.0);
  r.h.assign(M * I, 0.0);
  r.y.assign(M * H, 0.0);
  r.y_abs.assign(M * H, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < I; ++j) {
      double sg = 0, su = 0;
      for (int64_t k = 0; k < H; ++k) {
        if (p.gated) sg += x[m * H + k] * wg[j * H + k];
        su += x[m * H + k] * wu[j * H + k];
      }
      r.pre_g[m * I + j] = sg;
      r.pre_u[m * I + j] = su;
      r.h[m * I + j] = p.gated ? std::max(sg, 0.0) * su : std::max(su, 0.0);
    }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < H; ++c)
      for (int64_t j = 0; j < I; ++j) {
        r.y[m * H + c] += r.h[m * I + j] * wd[j * H + c];
        r.y_abs[m * H + c] += std::fabs(r.h[m * I + j] * wd[j * H + c]);
      }
  return r;
}

// ---- comparators -------------------------------------------------------------------------------
// ‖a − r‖ / ‖r‖ (0 when both are 0).
inline double rel_error(const std::vector<double>& a, const std::vector<double>& r) {
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    num += (a[i] - r[i]) * (a[i] - r[i]);
    den += r[i] * r[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Element-wise |a − r| <= bound[i]; on failure lists where (row, col) and by how much.
inline ::testing::AssertionResult within_bounds(const std::vector<double>& a,
                                                const std::vector<double>& r,
                                                const std::vector<double>& bound, int64_t cols) {
  int64_t bad = 0;
  std::ostringstream os;
  os.precision(17);
  for (size_t i = 0; i < r.size(); ++i) {
    const double err = std::fabs(a[i] - r[i]);
    if (err <= bound[i]) continue;
    if (bad++ < 5)
      os << "\n  (" << int64_t(i) / cols << ", " << int64_t(i) % cols << "): got " << a[i]
         << ", expected " << r[i] << ", |diff| " << err << " > bound " << bound[i];
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << r.size() << " elements out of bounds" << os.str();
}

// Fills a tensor with NaN so that an element the op forgets to write shows up.
inline void poison(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) store_from_double(t, i, std::nan(""));
}

// Test-name suffix for parameters (gated, precision): "gated_bf16", "non_gated_h_fp32", ...
inline std::string gated_precision_name(const ::testing::TestParamInfo<std::tuple<bool, Precision>>& info) {
  return str(std::get<0>(info.param) ? "gated" : "non_gated", "_",
             std::get<1>(info.param) == Precision::bf16 ? "bf16" : "h_fp32");
}

}  // namespace twell::cpu_test
