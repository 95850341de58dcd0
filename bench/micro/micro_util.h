// Helpers the GPU micro-benchmarks of this folder share, and the GPU tests (tests/cuda/gpu_test.h):
// argument lists, random bf16 inputs, the float64 product x · Wᵀ, and the error of a bf16 output
// against a float64 reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "twell/bf16.h"
#include "twell/cuda/runtime.h"

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

inline double value_of(uint16_t bf16_bits) { return bf16_bits_to_float(bf16_bits); }
inline double value_of(float f) { return f; }

// Relative Frobenius error of the values y [0, ref.size()) (bf16 bits or f32) against ref (absolute
// where ref is all zeros, as after a ReLU of negative rows; infinite where y holds a NaN or Inf).
template <typename T>
double relative_error(const T* y, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t j = 0; j < ref.size(); ++j) {
    const double v = value_of(y[j]);
    if (!std::isfinite(v)) return INFINITY;
    num += (v - ref[j]) * (v - ref[j]), den += ref[j] * ref[j];
  }
  return std::sqrt(den > 0 ? num / den : num);
}

// (relu) x Wᵀ in float64: x [M, K], W [N, K] bf16, the result [M, N].
inline std::vector<double> product_xwt(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int64_t M,
                                       int64_t N, int64_t K, bool relu = false) {
  std::vector<double> ref(static_cast<size_t>(M * N));
  std::vector<float> xf(x.size()), wf(w.size());  // converted once (the LM head's W: 100 M values)
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_bits_to_float(x[i]);
  for (size_t i = 0; i < w.size(); ++i) wf[i] = bf16_bits_to_float(w[i]);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < N; ++j) {
      const float* xr = xf.data() + m * K;
      const float* wr = wf.data() + j * K;
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(xr[k]) * wr[k];
      ref[static_cast<size_t>(m * N + j)] = relu ? std::max(s, 0.0) : s;
    }
  return ref;
}

// The GPU time of a pass that launches launch(0) .. launch(n − 1) on `stream` (n layers' inputs, together
// larger than the L2, as a forward reads them): 3 warm-up passes, then the median of 30, per launch, in µs.
template <class Launch>
double median_us_per_launch(cudaStream_t stream, int n, Launch&& launch) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  TWELL_CUDA_CHECK(cudaEventCreate(&e0));
  TWELL_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> times;
  for (int pass = 0; pass < 33; ++pass) {
    TWELL_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int l = 0; l < n; ++l) launch(l);
    TWELL_CUDA_CHECK(cudaEventRecord(e1, stream));
    TWELL_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TWELL_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (pass >= 3) times.push_back(ms * 1000.f / static_cast<float>(n));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace twell::micro
