// GPU tests skip, with the reason, where no Hopper GPU is present (CI has none).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "twell/bf16.h"
#include "twell/cuda/runtime.h"

#define TWELL_REQUIRE_HOPPER()                                          \
  do {                                                                  \
    std::string twell_why_;                                             \
    if (!::twell::cuda::hopper_available(&twell_why_))                  \
      GTEST_SKIP() << "GPU test skipped: " << twell_why_;               \
  } while (0)

namespace twell::cuda {

// Host <-> device copies of bf16 bits, and normal random bf16 values, for the kernel tests.
inline std::vector<uint16_t> random_bf16(size_t n, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16_bits(d(rng));
  return v;
}

inline DeviceBuffer upload(const std::vector<uint16_t>& h) {
  DeviceBuffer d(h.size() * 2);
  TWELL_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

inline std::vector<uint16_t> download(const DeviceBuffer& d) {
  std::vector<uint16_t> h(d.bytes() / 2);
  TWELL_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

// Relative Frobenius error of the bf16 values y [0, ref.size()) against a float64 reference
// (absolute where the reference is all zeros, as after a ReLU of negative rows; infinite where y
// holds a NaN or Inf).
inline double bf16_error(const std::vector<uint16_t>& y, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t j = 0; j < ref.size(); ++j) {
    const double v = bf16_bits_to_float(y[j]);
    if (!std::isfinite(v)) return INFINITY;
    num += (v - ref[j]) * (v - ref[j]), den += ref[j] * ref[j];
  }
  return std::sqrt(den > 0 ? num / den : num);
}

}  // namespace twell::cuda
