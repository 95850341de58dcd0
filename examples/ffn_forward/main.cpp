// One sparse FFN layer through twell's public API, from a program built against the installed
// package (CMakeLists.txt beside this file): the CPU reference backend, then, where twell was built
// with CUDA and a Hopper GPU is present, the GPU entry point FfnForward, checked against it.
//
// The weights are random, with a gate made sparse the way BENCHMARKS.md calibrates synthetic
// models: x has a constant channel (x[m][0] = 1) whose gate weight is a negative threshold, so that
// about 0.6% of g = relu(x Wgᵀ) is non-zero, ~9 of I = 1536 neurons a token.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>

#include "twell/cpu/ffn.h"
#include "twell/model/load.h"
#include "twell/tensor.h"
#include "twell/version.h"
#ifdef TWELL_WITH_CUDA
#include "twell/cuda/ffn.h"
#include "twell/cuda/runtime.h"
#endif

namespace {

// A bf16 tensor of N(0, sigma²) values.
twell::Tensor random_bf16(const twell::Shape& shape, float sigma, std::mt19937& rng) {
  twell::Tensor t = twell::Tensor::of<twell::bf16>(shape);
  std::normal_distribution<float> normal(0.f, sigma);
  twell::bf16* p = t.ptr<twell::bf16>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = twell::bf16(normal(rng));
  return t;
}

int run() {
  // Where twell::model::load_model would run a model (twell::runtime): the GPU or the CPU, and why.
  std::string no_gpu;
  const bool gpu = twell::model::gpu_chosen(twell::model::DeviceChoice::automatic, &no_gpu);
  std::printf("models would run on the %s%s%s\n", gpu ? "GPU" : "CPU", gpu ? "" : ": ", gpu ? "" : no_gpu.c_str());

  const int64_t M = 300, H = 512, I = 1536;  // M: any number of tokens; H and I: multiples of 64
  std::mt19937 rng(7);
  twell::Tensor x = random_bf16({M, H}, 1.f, rng);
  twell::Tensor wg = random_bf16({I, H}, 1.f / 22.6f, rng);  // x·wg over H - 1 channels: ~N(0, 1)
  twell::Tensor wu = random_bf16({I, H}, 1.f / 22.6f, rng);
  twell::Tensor wd = random_bf16({I, H}, 1.f / 39.2f, rng);  // neuron-major: row j is neuron j's
  for (int64_t m = 0; m < M; ++m) x.ptr<twell::bf16>()[m * H] = twell::bf16(1.f);
  for (int64_t j = 0; j < I; ++j) wg.ptr<twell::bf16>()[j * H] = twell::bf16(-2.5f);
  const twell::FfnWeights w{wg, wu, wd};

  // The CPU reference: y = (relu(x Wgᵀ) ⊙ x Wuᵀ) Wd, bf16 roundings as a PyTorch bf16 model.
  twell::Tensor y_cpu = twell::Tensor::of<twell::bf16>({M, H});
  twell::ActivationStats stats;
  twell::cpu::ffn_forward(x, w, y_cpu, twell::Precision::bf16, &stats);
  std::printf("twell %s: FFN of %lld tokens, H = %lld, I = %lld: %.1f non-zeros a token on the CPU\n",
              TWELL_VERSION_STRING, static_cast<long long>(M), static_cast<long long>(H), static_cast<long long>(I),
              stats.mean_nnz_per_token());

#ifdef TWELL_WITH_CUDA
  std::string why;
  if (!twell::cuda::hopper_available(&why)) {
    std::printf("GPU: not run (%s)\n", why.c_str());
    return 0;
  }
  namespace tc = twell::cuda;
  const tc::DeviceTensor dx = tc::DeviceTensor::upload(x), dwg = tc::DeviceTensor::upload(wg),
                         dwu = tc::DeviceTensor::upload(wu), dwd = tc::DeviceTensor::upload(wd);
  tc::DeviceTensor dy(twell::DType::bf16, {M, H});
  cudaStream_t stream = nullptr;
  TWELL_CUDA_CHECK(cudaStreamCreate(&stream));
  // FfnForward picks the path from the density it observes and the call's size: a call this small
  // (below FfnOptions::sparse_min_tokens) runs dense. always_sparse forces the TwELL path. Both
  // are exact: no value is dropped on either.
  tc::FfnOptions sparse;
  sparse.dispatch = tc::Dispatch::always_sparse;
  int failures = 0;
  for (const tc::FfnOptions& options : {tc::FfnOptions{}, sparse}) {
    tc::FfnForward ffn(tc::FfnShape{M, H, I}, options);  // owns its workspace; any M up to max_tokens
    ffn.forward(dx, twell::FfnWeights{dwg, dwu, dwd}, dy, stream);
    const twell::Tensor y_gpu = dy.download(stream);
    const tc::FfnStats s = ffn.last_stats();
    const double err = twell::relative_error(y_gpu, y_cpu);
    std::printf("GPU (%s): %s path", options.dispatch == tc::Dispatch::always_sparse ? "always_sparse" : "default",
                tc::to_string(s.path));
    if (s.nnz_per_token() >= 0) std::printf(", %.1f non-zeros a token", s.nnz_per_token());
    std::printf(", relative error against the CPU %.2e\n", err);
    failures += !(err <= 1e-2);
  }
  TWELL_CUDA_CHECK(cudaStreamDestroy(stream));
  if (failures) {
    std::fprintf(stderr, "ffn_forward: the GPU's result differs from the CPU reference\n");
    return 1;
  }
#else
  std::printf("GPU: not run (twell was built without CUDA)\n");
#endif
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {  // twell::Error says which argument and why
    std::fprintf(stderr, "ffn_forward: %s\n", e.what());
    return 1;
  }
}
