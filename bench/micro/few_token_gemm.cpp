// Micro-benchmark: y [M, N] = x [M, K] Wᵀ at a few tokens (a decode step of M sequences, a short
// prefill), cuBLASLt (LtGemm, as the model calls it) against launch_few_token_gemm: "few" waits for the
// GEMM before it (still launched as a programmatic dependent), "early" loads its first weights under
// that GEMM's tail (early_weight_reads, as the model runs it after a norm or the attention), both at
// the launcher's 16 rows a block, and "early32" at 32 rows (rows_per_block). Shapes: the 2B model's QKV
// (6144 × 2048), output (2048 × 2048) and FFN gate / up (5632 × 2048) projections, and its LM head
// (49152 × 2048, f32 logits: cuBLASLt, "early", and at one token "gemv", launch_decode_gemv). Each kernel's
// output is first checked against float64 (the first layer's weights, every output; "ok" where its
// error is at most twice cuBLASLt's), then timed: CUDA events around a pass over `layers` copies of W
// (together more than twice the L2, as a forward reads them), 3 warm-up passes, median of 30, divided
// by the layers; GB/s counts W's bytes.
// Built as twell_micro_few_token_gemm with TWELL_CUDA; run:
//   twell_micro_few_token_gemm [M list = 1,2,4,8,16,21,32] (1: the head only)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/cublaslt_gemm.h"
#include "cuda/kernels.h"
#include "twell/bf16.h"
#include "twell/cuda/runtime.h"
#include "micro_util.h"

using namespace twell;
using namespace twell::cuda;
using namespace twell::micro;

int main(int argc, char** argv) {
  const std::vector<int> Ms = parse_list(argc > 1 ? argv[1] : "1,2,4,8,16,21,32");
  cudaDeviceProp prop{};
  TWELL_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  std::printf("%-7s %5s %5s %3s %-10s %9s %9s %9s %3s\n", "shape", "N", "K", "M", "kernel", "us", "W GB/s", "rel_err", "ok");
  cudaStream_t stream = nullptr;
  TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LtGemm gemm;
  const struct {
    const char* name;
    int64_t N, K;
    bool f32;  // the LM head: f32 logits
  } shapes[] = {{"qkv", 6144, 2048, false}, {"out", 2048, 2048, false}, {"gate", 5632, 2048, false},
                {"head", 49152, 2048, true}};
  bool all_ok = true;
  for (const auto& [name, N, K, f32] : shapes) {
    const size_t wn = static_cast<size_t>(N * K);
    const int layers = static_cast<int>(std::max<int64_t>(8, 2 * static_cast<int64_t>(prop.l2CacheSize) / (wn * 2) + 2));
    const std::vector<uint16_t> w = random_bf16(wn, 0.02f, static_cast<unsigned>(N));
    uint16_t* dw = nullptr;
    TWELL_CUDA_CHECK(cudaMalloc(&dw, wn * 2 * layers));
    for (int l = 0; l < layers; ++l) TWELL_CUDA_CHECK(cudaMemcpy(dw + l * wn, w.data(), wn * 2, cudaMemcpyHostToDevice));
    for (const int M : Ms) {
      if (M == 1 && !f32) continue;  // one token's projections: the decode GEMV's micro (bench model)
      const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(M * K), 1.f, static_cast<unsigned>(M));
      const std::vector<double> ref = product_xwt(x, w, M, N, K);
      const size_t out_bytes = ref.size() * (f32 ? 4 : 2);
      uint16_t* dx = nullptr;
      void* dy = nullptr;
      TWELL_CUDA_CHECK(cudaMalloc(&dx, x.size() * 2));
      TWELL_CUDA_CHECK(cudaMalloc(&dy, out_bytes));
      TWELL_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
      double lt_err = 0;
      const char* names[] = {"cublaslt", "few", "early", "early32", "gemv"};
      for (int kernel = 0; kernel < 5; ++kernel) {
        const char* kname = names[kernel];
        if ((kernel == 1 || kernel == 2 || kernel == 3) && !few_token_gemm_supported(M, N, K)) continue;
        if (f32 && (kernel == 1 || kernel == 3)) continue;  // the head: early reads, 16 rows (the model's)
        if (kernel == 4 && (M != 1 || !decode_gemv_supported(N, K))) continue;
        auto run = [&](int l) {
          if (kernel == 0) {
            gemm.run(dx, dw + l * wn, dy, M, N, K, true, GemmEpilogue::none, stream, f32 ? GemmOut::f32 : GemmOut::bf16);
          } else if (kernel == 4) {
            DecodeGemvArgs a;
            a.x = dx, a.w = dw + l * wn, a.N = N, a.K = K, a.early_weight_reads = true;
            if (f32) a.y_f32 = static_cast<float*>(dy);
            else a.y = static_cast<uint16_t*>(dy);
            launch_decode_gemv(a, sms, stream);
          } else {
            FewTokenGemmArgs a;
            a.x = dx, a.w = dw + l * wn, a.M = M, a.N = N, a.K = K, a.early_weight_reads = kernel >= 2;
            if (f32) a.y_f32 = static_cast<float*>(dy);
            else a.y = static_cast<uint16_t*>(dy);
            a.rows_per_block = kernel == 3 ? 32 : 0;
            launch_few_token_gemm(a, sms, stream);
          }
        };
        TWELL_CUDA_CHECK(cudaMemsetAsync(dy, 0xff, out_bytes, stream));
        run(0);
        run(0);  // (cuBLASLt tunes at a problem's second call)
        std::vector<unsigned char> y(out_bytes);
        TWELL_CUDA_CHECK(cudaMemcpyAsync(y.data(), dy, out_bytes, cudaMemcpyDeviceToHost, stream));
        TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
        const double err = f32 ? relative_error(reinterpret_cast<const float*>(y.data()), ref)
                               : relative_error(reinterpret_cast<const uint16_t*>(y.data()), ref);
        if (kernel == 0) lt_err = err;
        const bool ok = err <= 2 * lt_err + 1e-6;
        all_ok = all_ok && ok;
        const double us = median_us_per_launch(stream, layers, run);
        std::printf("%-7s %5lld %5lld %3d %-10s %9.2f %9.0f %9.2e %3s\n", name, static_cast<long long>(N),
                    static_cast<long long>(K), M, kname, us, wn * 2 / (us * 1e3), err, ok ? "yes" : "NO");
        if (!ok) break;  // a wrong kernel's time means nothing
      }
      cudaFree(dx);
      cudaFree(dy);
    }
    cudaFree(dw);
  }
  std::printf(all_ok ? "all outputs match\n" : "WRONG: some output does not match float64\n");
  return all_ok ? 0 : 1;
}
