// The one-token GEMV (launch_decode_gemv, the model's QKV and output projections at batch 1)
// against float64 and against cuBLASLt on the same inputs, at shapes that are not multiples of
// its 256-column chunks or of its rows per block (N = 1, 7, 300; K = 8, 72, 1000), at the model's
// (2048 × 2048, 6144 × 2048) and at the largest K (4096), with and without the ReLU (the dense
// FFN's gate at one token); outputs poisoned first, and the rows
// past N never written. Shapes it does not take are rejected before any launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda/cublaslt_gemm.h"
#include "cuda/kernels.h"
#include "gpu_test.h"
#include "twell/bf16.h"
#include "twell/error.h"

namespace twell::cuda {
namespace {

TEST(DecodeGemv, MatchesFloat64AndCublasLt) {
  TWELL_REQUIRE_HOPPER();
  int sm_count = 0;
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const struct {
    int64_t N, K;
  } shapes[] = {{1, 8}, {7, 72}, {300, 1000}, {2048, 2048}, {6144, 2048}, {513, 4096}, {5, 4096}};
  for (const bool relu : {false, true})
  for (const auto& [N, K] : shapes) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " K=" << K << (relu ? " relu" : ""));
    const auto x = random_bf16(static_cast<size_t>(K), 1.f, static_cast<unsigned>(K));
    const auto w = random_bf16(static_cast<size_t>(N * K), 0.05f, static_cast<unsigned>(N + 7 * K));
    std::vector<double> ref(static_cast<size_t>(N));
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k)
        ref[j] += double(bf16_bits_to_float(x[k])) * bf16_bits_to_float(w[static_cast<size_t>(j * K + k)]);
    if (relu)
      for (double& r : ref) r = std::max(r, 0.0);
    DeviceBuffer dx = upload(x), dw = upload(w), dy(static_cast<size_t>(N + 8) * 2), dref(static_cast<size_t>(N) * 2);
    TWELL_CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.bytes()));  // bf16 NaN, and 8 guard values past N
    DecodeGemvArgs a;
    a.x = dx.as<uint16_t>(), a.w = dw.as<uint16_t>(), a.y = dy.as<uint16_t>(), a.N = N, a.K = K, a.relu = relu;
    launch_decode_gemv(a, sm_count, nullptr);
    LtGemm gemm;
    gemm.run(dx.get(), dw.get(), dref.get(), 1, N, K, true, relu ? GemmEpilogue::relu : GemmEpilogue::none, nullptr);
    TWELL_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> y = download(dy);
    for (int64_t j = N; j < N + 8; ++j) EXPECT_EQ(y[static_cast<size_t>(j)], 0xffff) << "written past N at " << j;
    y.resize(static_cast<size_t>(N));
    const double err = bf16_error(y, ref), err_lt = bf16_error(download(dref), ref);
    std::printf("N=%lld K=%lld%s: GEMV rel err %.2e, cuBLASLt %.2e\n", static_cast<long long>(N),
                static_cast<long long>(K), relu ? " relu" : "", err, err_lt);
    EXPECT_LE(err, 2 * err_lt + 1e-6);  // both round the fp32 sum to bf16 once
  }
}

TEST(DecodeGemv, NaNIsNotLostInTheRelu) {  // a NaN in x reaches every output, ReLU or not
  TWELL_REQUIRE_HOPPER();
  const int64_t N = 40, K = 264;
  auto x = random_bf16(static_cast<size_t>(K), 1.f, 3);
  x[100] = 0x7fc0;  // bf16 NaN
  DeviceBuffer dx = upload(x), dw = upload(random_bf16(static_cast<size_t>(N * K), 0.1f, 4)), dy(N * 2);
  for (const bool relu : {false, true}) {
    TWELL_CUDA_CHECK(cudaMemset(dy.get(), 0, dy.bytes()));
    DecodeGemvArgs a;
    a.x = dx.as<uint16_t>(), a.w = dw.as<uint16_t>(), a.y = dy.as<uint16_t>(), a.N = N, a.K = K, a.relu = relu;
    launch_decode_gemv(a, 132, nullptr);
    for (const uint16_t v : download(dy)) EXPECT_TRUE(std::isnan(bf16_bits_to_float(v))) << (relu ? "relu" : "plain");
  }
}

TEST(DecodeGemv, ShapesItDoesNotTakeAreRejected) {  // host-only: runs without a GPU too
  EXPECT_TRUE(decode_gemv_supported(2048, 2048));
  EXPECT_TRUE(decode_gemv_supported(1, 4096));
  EXPECT_FALSE(decode_gemv_supported(2048, 4104));  // K above 4096
  EXPECT_FALSE(decode_gemv_supported(2048, 100));   // K not a multiple of 8
  EXPECT_FALSE(decode_gemv_supported(0, 64));
  DecodeGemvArgs a;
  a.N = 16, a.K = 4100;
  EXPECT_THROW(launch_decode_gemv(a, 132, nullptr), Error);
}

}  // namespace
}  // namespace twell::cuda
