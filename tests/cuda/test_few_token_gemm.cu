// The few-token GEMM (launch_few_token_gemm: the model's projections and the dense FFN's gate and up
// products at 2 to 32 tokens) against float64 and against cuBLASLt on the same inputs: every token
// count class (1, 2, 7, 8, 9, 16, 21, 24, 32: its 8-token tiles full and partial), N not a multiple of
// its 16-row blocks (1, 7, 300, 513), K one chunk to the FFN's 5632 (576: 9 chunks over 4 warps), the
// model's shapes, with and without the ReLU, and 1 to 8 warps a block (the launcher's choice follows
// the SM count it is given); outputs poisoned first and nothing written past M × N. Then x written by a
// kernel just before that lets it start early (programmatic dependent launch) while its weights'
// loads start, a NaN kept through the ReLU, f32 outputs (the LM head), and the calls it refuses.
#include <cuda_runtime.h>
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

int sms() {
  int sm_count = 0;
  TWELL_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  return sm_count;
}

// Lets its dependent start at once, then (after ~100k cycles, ~50 µs) copies src into dst: a dependent
// that read dst before waiting for it would read the zeros there.
__global__ void slow_copy(const uint16_t* src, uint16_t* dst, int64_t n) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (const long long start = clock64(); clock64() - start < 100000;) {
  }
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

TEST(FewTokenGemm, MatchesFloat64AndCublasLt) {
  TWELL_REQUIRE_HOPPER();
  const int sm_count = sms();
  const struct {
    int64_t N, K;
  } shapes[] = {{1, 64}, {7, 128}, {300, 1024}, {40, 576}, {2048, 2048}, {6144, 2048}, {513, 5632}};
  for (const int64_t M : {1, 2, 7, 8, 9, 16, 21, 24, 32})
    for (const auto& [N, K] : shapes)
      for (const bool relu : {false, true})
      for (const int rows : {0, 32}) {  // 0: the launcher's 16
        if (relu && N > 2048 && M != 21) continue;  // the ReLU's cases at one large shape suffice
        if (rows != 0 && N < 300) continue;         // 32 rows a block: at the shapes of several blocks
        // Warps a block follow the SM count given (at N = 2048 fewer SMs give fewer warps, 2 to 8).
        const int sm_arg = N == 2048 ? std::vector<int>{20, 40, 60, 70, 80, sm_count}[static_cast<size_t>(M) % 6] : sm_count;
        SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " K=" << K << (relu ? " relu" : "")
                                        << " sm_count " << sm_arg << " rows a block " << rows);
        const auto x = random_bf16(static_cast<size_t>(M * K), 1.f, static_cast<unsigned>(M + K));
        const auto w = random_bf16(static_cast<size_t>(N * K), 0.05f, static_cast<unsigned>(N + 7 * K));
        const std::vector<double> ref = product_xwt(x, w, M, N, K, relu);
        const size_t out = static_cast<size_t>(M * N);
        DeviceBuffer dx = upload(x), dw = upload(w), dy((out + 16) * 2), dref(out * 2);
        TWELL_CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.bytes()));  // bf16 NaN, and 16 guard values past M × N
        FewTokenGemmArgs a;
        a.x = dx.as<uint16_t>(), a.w = dw.as<uint16_t>(), a.y = dy.as<uint16_t>();
        a.M = M, a.N = N, a.K = K, a.relu = relu, a.rows_per_block = rows;
        launch_few_token_gemm(a, sm_arg, nullptr);
        LtGemm gemm;
        gemm.run(dx.get(), dw.get(), dref.get(), M, N, K, true, relu ? GemmEpilogue::relu : GemmEpilogue::none, nullptr);
        TWELL_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> y = download(dy);
        for (size_t j = out; j < out + 16; ++j) ASSERT_EQ(y[j], 0xffff) << "written past M × N at " << j;
        y.resize(out);
        const double err = bf16_error(y, ref), err_lt = bf16_error(download(dref), ref);
        // (A few outputs: one rounding of a bf16 ulp, 2⁻⁸, can decide it; allowed there.)
        const double floor = out < 64 ? 8e-3 : 0.0;
        EXPECT_LE(err, std::max(2 * err_lt, floor) + 1e-6) << "few-token GEMM " << err << ", cuBLASLt " << err_lt;
        if ((N == 6144 || N == 513) && rows == 0) std::printf("M=%lld N=%lld K=%lld%s: rel err %.2e, cuBLASLt %.2e\n",
                                                static_cast<long long>(M), static_cast<long long>(N),
                                                static_cast<long long>(K), relu ? " relu" : "", err, err_lt);
      }
}

// The weights' first loads start before the kernel ahead has finished (early_weight_reads), x only
// after: x written by the kernel just before on the stream, which lets it start at once and writes x
// ~50 µs later, must be the x multiplied. And the same bits as a launch that waits first, at every
// call (deterministic).
TEST(FewTokenGemm, ReadsXOnlyAfterTheWorkBeforeAndRepeatsItsBits) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 21, N = 2048, K = 2048;
  const auto x = random_bf16(static_cast<size_t>(M * K), 1.f, 11), w = random_bf16(static_cast<size_t>(N * K), 0.05f, 12);
  DeviceBuffer staged = upload(x), dx(x.size() * 2), dw = upload(w), dy(static_cast<size_t>(M * N) * 2);
  cudaStream_t stream = nullptr;
  TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<uint16_t> first;
  for (int call = 0; call < 4; ++call) {
    TWELL_CUDA_CHECK(cudaMemsetAsync(dx.get(), 0, dx.bytes(), stream));
    TWELL_CUDA_CHECK(cudaMemsetAsync(dy.get(), 0xff, dy.bytes(), stream));
    slow_copy<<<8, 256, 0, stream>>>(staged.as<uint16_t>(), dx.as<uint16_t>(), M * K);
    TWELL_CUDA_CHECK(cudaGetLastError());
    FewTokenGemmArgs a;
    a.x = dx.as<uint16_t>(), a.w = dw.as<uint16_t>(), a.y = dy.as<uint16_t>(), a.M = M, a.N = N, a.K = K;
    a.early_weight_reads = call % 2 == 1;
    launch_few_token_gemm(a, sms(), stream);
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<uint16_t> y = download(dy);
    if (call == 0) {
      first = y;
      EXPECT_LT(bf16_error(y, product_xwt(x, w, M, N, K, false)), 1e-2);
    } else {
      EXPECT_EQ(y, first) << "call " << call;
    }
  }
  cudaStreamDestroy(stream);
}

TEST(FewTokenGemm, NaNIsNotLostInTheRelu) {  // a NaN in a token's x reaches that token's every output
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 5, N = 40, K = 256;
  auto x = random_bf16(static_cast<size_t>(M * K), 1.f, 3);
  x[static_cast<size_t>(3 * K + 100)] = 0x7fc0;  // bf16 NaN in token 3
  DeviceBuffer dx = upload(x), dw = upload(random_bf16(static_cast<size_t>(N * K), 0.1f, 4)), dy(M * N * 2);
  for (const bool relu : {false, true}) {
    TWELL_CUDA_CHECK(cudaMemset(dy.get(), 0, dy.bytes()));
    FewTokenGemmArgs a;
    a.x = dx.as<uint16_t>(), a.w = dw.as<uint16_t>(), a.y = dy.as<uint16_t>(), a.M = M, a.N = N, a.K = K, a.relu = relu;
    launch_few_token_gemm(a, 132, nullptr);
    const std::vector<uint16_t> y = download(dy);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < N; ++j)
        EXPECT_EQ(std::isnan(bf16_bits_to_float(y[static_cast<size_t>(m * N + j)])), m == 3)
            << (relu ? "relu" : "plain") << " token " << m << " output " << j;
  }
}

// f32 outputs (the LM head's logits) against float64 and cuBLASLt's f32 C: at N = 20000, a grid no
// block size fits in one wave (the 2B model's head: 49152), and at a small N; guard values past
// M × N untouched.
TEST(FewTokenGemm, F32OutputsMatchFloat64AndCublasLt) {
  TWELL_REQUIRE_HOPPER();
  for (const int64_t N : {20000, 40})
    for (const int64_t M : {1, 2, 9, 32}) {
      const int64_t K = 2048;
      SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N);
      const auto x = random_bf16(static_cast<size_t>(M * K), 1.f, static_cast<unsigned>(M + 5));
      const auto w = random_bf16(static_cast<size_t>(N * K), 0.02f, static_cast<unsigned>(N));
      const std::vector<double> ref = product_xwt(x, w, M, N, K);
      const size_t out = static_cast<size_t>(M * N);
      DeviceBuffer dx = upload(x), dw = upload(w), dy((out + 16) * 4), dref(out * 4);
      TWELL_CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.bytes()));  // f32 NaN, and 16 guard values past M × N
      FewTokenGemmArgs a;
      a.x = dx.as<uint16_t>(), a.w = dw.as<uint16_t>(), a.y_f32 = dy.as<float>(), a.M = M, a.N = N, a.K = K;
      a.early_weight_reads = true;
      launch_few_token_gemm(a, sms(), nullptr);
      LtGemm gemm;
      gemm.run(dx.get(), dw.get(), dref.get(), M, N, K, true, GemmEpilogue::none, nullptr, GemmOut::f32);
      TWELL_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> y = download_f32(dy), y_lt = download_f32(dref);
      for (size_t j = out; j < out + 16; ++j) ASSERT_TRUE(std::isnan(y[j])) << "written past M × N at " << j;
      const double err = micro::relative_error(y.data(), ref), err_lt = micro::relative_error(y_lt.data(), ref);
      std::printf("f32 M=%lld N=%lld: rel err %.2e, cuBLASLt %.2e\n", static_cast<long long>(M),
                  static_cast<long long>(N), err, err_lt);
      EXPECT_LE(err, 2 * err_lt + 1e-6);  // fp32 sums in a different order, no bf16 rounding
    }
}

TEST(FewTokenGemm, ShapesItDoesNotTakeAreRejected) {  // host-only: runs without a GPU too
  EXPECT_TRUE(few_token_gemm_supported(2, 6144, 2048));
  EXPECT_TRUE(few_token_gemm_supported(32, 1, 64));
  EXPECT_FALSE(few_token_gemm_supported(33, 2048, 2048));  // more tokens than its tiles hold
  EXPECT_FALSE(few_token_gemm_supported(0, 2048, 2048));
  EXPECT_FALSE(few_token_gemm_supported(4, 2048, 2000));   // K not a multiple of 64
  EXPECT_FALSE(few_token_gemm_supported(4, 0, 2048));
  // (Host checks only: the pointers are never read.)
  uint16_t bf16_out[1];
  float f32_out[1];
  FewTokenGemmArgs a;
  a.y = bf16_out, a.M = 4, a.N = 16, a.K = 100;
  EXPECT_THROW(launch_few_token_gemm(a, 132, nullptr), Error);
  a.K = 128, a.rows_per_block = 24;  // 16 or 32 (0: 16)
  EXPECT_THROW(launch_few_token_gemm(a, 132, nullptr), Error);
  a.rows_per_block = 0, a.M = 33;
  EXPECT_THROW(launch_few_token_gemm(a, 132, nullptr), Error);
  a.M = 4, a.y_f32 = f32_out;  // both outputs
  EXPECT_THROW(launch_few_token_gemm(a, 132, nullptr), Error);
  a.y = nullptr, a.y_f32 = nullptr;  // neither
  EXPECT_THROW(launch_few_token_gemm(a, 132, nullptr), Error);
}

}  // namespace
}  // namespace twell::cuda
