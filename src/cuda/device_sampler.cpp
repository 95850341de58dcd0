// twell::cuda::DeviceSampler (include/twell/cuda/sampler.h): the host side of launch_sample.
#include <algorithm>
#include <cstring>

#include "cuda/kernels.h"
#include "twell/cuda/sampler.h"

namespace twell::cuda {

namespace {
// The pinned staging of `rows` rows: a uniform in, a result out, each.
size_t staging_bytes(int64_t rows) { return static_cast<size_t>(rows) * (sizeof(double) + sizeof(SampleResult)); }
}  // namespace

void DeviceSampler::reserve(int64_t rows, int64_t V) {
  TWELL_CHECK(rows >= 1 && V >= 1, "DeviceSampler::reserve: rows ", rows, ", V ", V);
  if (weights_.bytes() < device_bytes(rows, V)) weights_ = DeviceBuffer(device_bytes(rows, V));
  if (staging_.bytes() < staging_bytes(rows)) staging_.reserve(staging_bytes(rows));
}

std::vector<int32_t> DeviceSampler::sample(const TensorView& logits, model::Sampler& sampler, cudaStream_t stream) {
  const int64_t rows = logits.rank() == 2 ? logits.shape[0] : 1;
  return sample(logits, std::vector<model::Sampler*>(static_cast<size_t>(std::max<int64_t>(rows, 1)), &sampler),
                stream);
}

std::vector<int32_t> DeviceSampler::sample(const TensorView& logits, const std::vector<model::Sampler*>& samplers,
                                           cudaStream_t stream) {
  TWELL_CHECK(logits.rank() == 1 || logits.rank() == 2, "DeviceSampler::sample: logits must be [V] or [rows, V], got ",
              shape_str(logits.shape));
  check_dtype(logits, DType::f32, "DeviceSampler::sample: logits");
  check_device(logits, Device::cuda, "DeviceSampler::sample: logits");
  check_contiguous(logits, "DeviceSampler::sample: logits");
  const int64_t rows = logits.rank() == 2 ? logits.shape[0] : 1, V = logits.shape[logits.rank() - 1];
  TWELL_CHECK(rows >= 1 && V >= 1, "DeviceSampler::sample: empty logits ", shape_str(logits.shape));
  TWELL_CHECK(static_cast<int64_t>(samplers.size()) == rows, "DeviceSampler::sample: ", samplers.size(),
              " samplers for ", rows, " rows");
  const model::Sampler* first = nullptr;
  for (const model::Sampler* s : samplers)
    if (s && !first) first = s;
  std::vector<int32_t> tokens(static_cast<size_t>(rows), model::kNoToken);
  if (!first) return tokens;  // no row to draw
  const model::SamplingOptions& o = first->options();
  for (const model::Sampler* s : samplers)
    TWELL_CHECK(!s || s->options().same_rules(o),
                "DeviceSampler::sample: the samplers of one call must have the same options (their seeds may differ)");
  const int64_t n = o.drawable(V);

  // The uniforms (past kSampleInlineRows rows) and the results live in pinned host memory, which
  // the kernel reads and writes in place (unified addressing): no copy to enqueue either way.
  if (staging_.bytes() < staging_bytes(rows)) staging_.reserve(staging_bytes(rows));
  const bool greedy = o.temperature == 0;
  if (!greedy && weights_.bytes() < device_bytes(rows, n)) weights_ = DeviceBuffer(device_bytes(rows, n));

  auto* uniforms = staging_.as<double>();
  auto* results = reinterpret_cast<SampleResult*>(uniforms + rows);
  SampleArgs a;
  if (!greedy) {
    double* u = rows <= kSampleInlineRows ? a.inline_uniforms : uniforms;
    for (int64_t r = 0; r < rows; ++r) u[r] = samplers[r] ? samplers[r]->next_uniform() : 0.0;
  }
  a.logits = static_cast<const float*>(logits.data);
  size_t count = 0;  // the seen ids, for the repetition penalty (kept only where it is on)
  for (const model::Sampler* s : samplers) count += s ? s->seen_ids().size() : 0;
  if (count > 0) {  // the rows (or a copy) with each sampler's seen ids penalized, as model::Sampler::penalized
    const size_t bytes = static_cast<size_t>(rows + 1) * sizeof(int64_t) + count * sizeof(int32_t);
    if (seen_.bytes() < bytes) seen_.reserve(std::max(bytes, 2 * seen_.bytes()));  // grows a token at a time
    auto* offsets = seen_.as<int64_t>();
    auto* ids = reinterpret_cast<int32_t*>(offsets + rows + 1);
    offsets[0] = 0;
    for (int64_t r = 0; r < rows; ++r) {
      int64_t k = offsets[r];
      if (samplers[r])
        for (const int32_t id : samplers[r]->seen_ids())
          if (id < V) ids[k++] = id;
      offsets[r + 1] = k;
    }
    float* out = static_cast<float*>(logits.data);
    if (!in_place_) {
      const size_t row_bytes = static_cast<size_t>(V) * sizeof(float);
      if (penalized_.bytes() < static_cast<size_t>(rows) * row_bytes)
        penalized_ = DeviceBuffer(static_cast<size_t>(rows) * row_bytes);
      TWELL_CUDA_CHECK(cudaMemcpyAsync(penalized_.get(), logits.data, static_cast<size_t>(rows) * row_bytes,
                                       cudaMemcpyDeviceToDevice, stream));
      out = penalized_.as<float>();
    }
    launch_repetition_penalty(out, V, rows, offsets, ids, static_cast<float>(o.repetition_penalty), stream);
    a.logits = out;
  }
  a.ld = V;
  a.n = n;
  a.temperature = o.temperature;
  a.top_k = o.top_k;
  a.top_p = o.top_p;
  a.min_p = o.min_p;
  a.uniforms = uniforms;
  a.weights = weights_.as<unsigned long long>();
  a.results = results;
  launch_sample(a, rows, stream);
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));

  for (int64_t r = 0; r < rows; ++r) {
    if (!samplers[r]) continue;
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
