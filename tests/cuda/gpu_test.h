// GPU tests skip, with the reason, where no Hopper GPU is present (CI has none).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../../bench/micro/micro_util.h"  // random_bf16, relative_error, product_xwt
#include "twell/bf16.h"
#include "twell/cuda/runtime.h"

#define TWELL_REQUIRE_HOPPER()                                          \
  do {                                                                  \
    std::string twell_why_;                                             \
    if (!::twell::cuda::hopper_available(&twell_why_))                  \
      GTEST_SKIP() << "GPU test skipped: " << twell_why_;               \
  } while (0)

namespace twell::cuda {

// Normal random bf16 values, the float64 x · Wᵀ (the micro-benchmarks' helpers), and host <-> device
// copies of bf16 bits (and downloads of f32 values), for the kernel tests.
using micro::product_xwt;
using micro::random_bf16;

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

inline std::vector<float> download_f32(const DeviceBuffer& d) {
  std::vector<float> h(d.bytes() / 4);
  TWELL_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

// Relative Frobenius error of the bf16 values y [0, ref.size()) against a float64 reference
// (micro::relative_error: absolute where the reference is all zeros; infinite at a NaN or Inf).
inline double bf16_error(const std::vector<uint16_t>& y, const std::vector<double>& ref) {
  return micro::relative_error(y.data(), ref);
}

}  // namespace twell::cuda
