#include "common/random.h"

#include <algorithm>
#include <random>

namespace twell::test {

static bf16 nonzero_bf16(std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  for (;;) {
    bf16 v(normal(rng));
    if (v.bits != 0) return v;
  }
}

Tensor random_sparse_bf16(int64_t rows, int64_t cols, double density, bool skewed, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0, 1);
  std::lognormal_distribution<double> rate(0, 1);
  std::vector<double> col_p(static_cast<size_t>(cols), density);
  if (skewed) {
    double sum = 0;
    for (auto& p : col_p) sum += (p = unit(rng) < 0.3 ? 0.0 : rate(rng));
    for (auto& p : col_p) p = sum > 0 ? std::min(1.0, p * density * cols / sum) : 0.0;
  }
  Tensor t = Tensor::of<bf16>({rows, cols});
  auto* p = t.ptr<bf16>();
  for (int64_t r = 0; r < rows; ++r) {
    double boost = 1;
    if (skewed && unit(rng) < 0.02) boost = 10;
    if (skewed && r % 17 == 5) boost = 0;
    for (int64_t c = 0; c < cols; ++c)
      if (unit(rng) < col_p[c] * boost) p[r * cols + c] = nonzero_bf16(rng);
  }
  return t;
}

Tensor random_normal(DType dtype, Shape shape, double stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0, stddev);
  Tensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v;
    do v = normal(rng);
    while (v == 0);
    store_from_double(t.view(), i, v);
  }
  return t;
}

}  // namespace twell::test
