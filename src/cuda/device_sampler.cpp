// twell::cuda::DeviceSampler (include/twell/cuda/sampler.h): the host side of launch_sample.
#include <cstring>

#include "cuda/kernels.h"
#include "twell/cuda/sampler.h"

namespace twell::cuda {

std::vector<int32_t> DeviceSampler::sample(const TensorView& logits, model::Sampler& sampler, cudaStream_t stream) {
  TWELL_CHECK(logits.rank() == 1 || logits.rank() == 2, "DeviceSampler::sample: logits must be [V] or [rows, V], got ",
              shape_str(logits.shape));
  check_dtype(logits, DType::f32, "DeviceSampler::sample: logits");
  check_device(logits, Device::cuda, "DeviceSampler::sample: logits");
  check_contiguous(logits, "DeviceSampler::sample: logits");
  const int64_t rows = logits.rank() == 2 ? logits.shape[0] : 1, V = logits.shape[logits.rank() - 1];
  TWELL_CHECK(rows >= 1 && V >= 1, "DeviceSampler::sample: empty logits ", shape_str(logits.shape));
  const model::SamplingOptions& o = sampler.options();
  const int64_t n = o.vocab_limit > 0 && o.vocab_limit < V ? o.vocab_limit : V;

  const size_t io_bytes = static_cast<size_t>(rows) * (sizeof(double) + sizeof(SampleResult));
  if (io_.bytes() < io_bytes) io_ = DeviceBuffer(io_bytes);
  if (staging_.bytes() < io_bytes) staging_.reserve(io_bytes);
  const size_t weight_bytes = static_cast<size_t>(rows * n) * sizeof(unsigned long long);
  const bool greedy = o.temperature == 0;
  if (!greedy && weights_.bytes() < weight_bytes) weights_ = DeviceBuffer(weight_bytes);

  auto* uniforms = staging_.as<double>();
  auto* results = reinterpret_cast<SampleResult*>(uniforms + rows);
  auto* d_uniforms = io_.as<double>();
  auto* d_results = reinterpret_cast<SampleResult*>(d_uniforms + rows);
  SampleArgs a;
  if (!greedy) {
    double* u = rows <= kSampleInlineRows ? a.inline_uniforms : uniforms;
    for (int64_t r = 0; r < rows; ++r) u[r] = sampler.next_uniform();
    if (rows > kSampleInlineRows)
      TWELL_CUDA_CHECK(cudaMemcpyAsync(d_uniforms, uniforms, rows * sizeof(double), cudaMemcpyHostToDevice, stream));
  }
  a.logits = static_cast<const float*>(logits.data);
  a.ld = V;
  a.n = n;
  a.temperature = o.temperature;
  a.top_k = o.top_k;
  a.top_p = o.top_p;
  a.uniforms = d_uniforms;
  a.weights = weights_.as<unsigned long long>();
  a.results = d_results;
  launch_sample(a, rows, stream);
  TWELL_CUDA_CHECK(cudaMemcpyAsync(results, d_results, rows * sizeof(SampleResult), cudaMemcpyDeviceToHost, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));

  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const SampleResult& x = results[r];
    if (x.status == kSampleBadLogit) model::throw_unsampleable(x.index, x.value, n);
    if (x.status == kSampleAllRuledOut) model::throw_unsampleable(-1, 0, n);
    TWELL_CHECK(x.status == kSampleOk && x.token >= 0 && x.token < n, "DeviceSampler::sample: row ", r,
                " gave no token (status ", x.status, ", token ", x.token, ", stage ", x.index, ")");
    tokens[static_cast<size_t>(r)] = x.token;
  }
  return tokens;
}

}  // namespace twell::cuda
