// The one-token GEMV (launch_decode_gemv, the model's QKV and output projections at batch 1)
// against float64 and against cuBLASLt on the same inputs, at shapes that are not multiples of
// its 256-column chunks or of its rows per block (N = 1, 7, 300; K = 8, 72, 1000), at the model's
// (2048 × 2048, 6144 × 2048) and at the largest K (4096), with and without the ReLU (the dense
// FFN's gate at one token); outputs poisoned first, and the rows
// past N never written; f32 outputs (the LM head's logits). Calls it does not take are rejected
// before any launch.
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

// f32 outputs (the LM head's logits at batch 1) against float64 and cuBLASLt's f32 C, at a small N
// and at one of several waves of blocks (the 2B model's head: 49152 rows); 8 guard values past N.
TEST(DecodeGemv, F32OutputsMatchFloat64AndCublasLt) {
  TWELL_REQUIRE_HOPPER();
  int sm_count = 0;
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  for (const int64_t N : {7, 20000}) {
    const int64_t K = 2048;
    SCOPED_TRACE(testing::Message() << "N=" << N);
    const auto x = random_bf16(static_cast<size_t>(K), 1.f, 5), w = random_bf16(static_cast<size_t>(N * K), 0.02f, 6);
    const std::vector<double> ref = product_xwt(x, w, 1, N, K);
    DeviceBuffer dx = upload(x), dw = upload(w), dy(static_cast<size_t>(N + 8) * 4), dref(static_cast<size_t>(N) * 4);
    TWELL_CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.bytes()));  // f32 NaN
    DecodeGemvArgs a;
    a.x = dx.as<uint16_t>(), a.w = dw.as<uint16_t>(), a.y_f32 = dy.as<float>(), a.N = N, a.K = K;
    a.early_weight_reads = true;
    launch_decode_gemv(a, sm_count, nullptr);
    LtGemm gemm;
    gemm.run(dx.get(), dw.get(), dref.get(), 1, N, K, true, GemmEpilogue::none, nullptr, GemmOut::f32);
    TWELL_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> y = download_f32(dy), y_lt = download_f32(dref);
    for (int64_t j = N; j < N + 8; ++j) EXPECT_TRUE(std::isnan(y[static_cast<size_t>(j)])) << "written past N at " << j;
    const double err = micro::relative_error(y.data(), ref), err_lt = micro::relative_error(y_lt.data(), ref);
    std::printf("f32 N=%lld: GEMV rel err %.2e, cuBLASLt %.2e\n", static_cast<long long>(N), err, err_lt);
    EXPECT_LE(err, 2 * err_lt + 1e-6);
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
  uint16_t bf16_out[1];
  float f32_out[1];
  DecodeGemvArgs a;
  a.y = bf16_out, a.N = 16, a.K = 4100;
  EXPECT_THROW(launch_decode_gemv(a, 132, nullptr), Error);
  a.K = 64, a.y_f32 = f32_out;  // both outputs (host checks only: never read)
  EXPECT_THROW(launch_decode_gemv(a, 132, nullptr), Error);
  a.y = nullptr, a.y_f32 = nullptr;  // neither
  EXPECT_THROW(launch_decode_gemv(a, 132, nullptr), Error);
}

}  // namespace
}  // namespace twell::cuda
