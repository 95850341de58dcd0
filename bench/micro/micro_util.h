// Helpers the GPU micro-benchmarks of this folder share: their argument lists, random inputs and the
// error of a bf16 output against a float64 reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "twell/bf16.h"

namespace twell::micro {

// "1,2,4" -> {1, 2, 4}.
inline std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) v.push_back(std::atoi(x.c_str()));
  return v;
}

// n bf16 values drawn from N(0, scale²).
inline std::vector<uint16_t> random_bf16(size_t n, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = float_to_bf16_bits(d(rng));
  return v;
}

// Relative Frobenius error of the bf16 values y against ref (infinite where y holds a NaN or Inf).
inline double relative_error(const uint16_t* y, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t j = 0; j < ref.size(); ++j) {
    const double v = bf16_bits_to_float(y[j]);
    if (!std::isfinite(v)) return INFINITY;
    num += (v - ref[j]) * (v - ref[j]), den += ref[j] * ref[j];
  }
  return std::sqrt(num / den);
}

}  // namespace twell::micro
