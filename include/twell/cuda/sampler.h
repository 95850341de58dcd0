// Drawing tokens on the GPU from logits that are there already, by the rules of
// twell::model::Sampler: only the token ids come back to the host, not the [rows, V] logits.
//
//   twell::model::SamplingOptions o;
//   o.temperature = 0.8, o.top_p = 0.95, o.seed = 1;
//   twell::model::Sampler sampler(o);
//   twell::cuda::DeviceSampler on_gpu;
//   std::vector<int32_t> next = on_gpu.sample(device_logits, sampler, stream);  // one a row
//
// A row's token is the one sampler.sample() would draw from the same logits with the same random
// number, except where the draw or a top-p cut falls near a token's boundary: the GPU holds each
// softmax weight as a multiple of 2^-40 of the greatest (exact and order-independent sums), where
// the host sums doubles. Each weight is off by at most 2^-41 of the greatest, so the two totals
// differ by at most V · 2^-41 of it: ~2e-8 at a vocabulary of 49152, ~1.2e-7 at 256000. A token
// whose weight is below 2^-41 of the greatest is never drawn here. Greedy is the argmax either
// way, lowest id on ties. Deterministic for a seed.
//
// LlamaCuda's generation uses it (model::generate and generate_batch through
// LanguageModel::prefill_batch_sample and decode_batch_sample). Kernel: src/cuda/kernels/sample.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "twell/cuda/runtime.h"
#include "twell/model/llama.h"
#include "twell/tensor.h"

namespace twell::cuda {

class DeviceSampler {
 public:
  DeviceSampler() = default;
  // One token for each row of `logits`: [V] or [rows, V], f32, contiguous, in the current
  // device's memory, drawn with `sampler`'s options and random numbers: one next_uniform() a row,
  // in row order, unless greedy, as sampler.sample() on each row in turn would take them. Enqueued
  // on `stream` after the work that writes the logits; returns once the tokens are on the host.
  // Throws what sampler.sample() would for a row with a NaN or +inf logit, or with all -inf.
  // Device memory, kept for later calls: 8 bytes a logit (the fixed-point weights) unless greedy,
  // 1.5 MB for 4 rows of 49152; with a repetition penalty 4 bytes a logit more for a penalized copy
  // (`logits` are not written), unless penalize_in_place.
  std::vector<int32_t> sample(const TensorView& logits, model::Sampler& sampler, cudaStream_t stream);
  // The same with a sampler a row (a batch of sequences, each with its own random numbers):
  // samplers[r] draws row r, as samplers[r]->sample() would. All have the same options; a null
  // sampler's row is not drawn from: its token is model::kNoToken, whatever the row holds.
  std::vector<int32_t> sample(const TensorView& logits, const std::vector<model::Sampler*>& samplers,
                              cudaStream_t stream);
  // Allocates now what sample() needs for up to `rows` rows of V logits, so that such calls
  // allocate nothing (LlamaCuda does it at construction, counted in its memory plan).
  void reserve(int64_t rows, int64_t V);
  static size_t device_bytes(int64_t rows, int64_t V) { return static_cast<size_t>(rows * V) * 8; }
  size_t workspace_bytes() const { return weights_.bytes() + penalized_.bytes(); }  // device memory held now
  // The logits given are the caller's scratch (LlamaCuda's): the repetition penalty is applied to them
  // in place, with no copy (no memory beyond device_bytes).
  void penalize_in_place(bool on) { in_place_ = on; }

 private:
  DeviceBuffer weights_;    // the kernel's workspace
  PinnedBuffer staging_;    // uniforms in, results out, read and written by the kernel in place
  DeviceBuffer penalized_;  // the logits with the repetition penalty applied (only where it is on)
  PinnedBuffer seen_;       // the rows' seen ids for it, read by the kernel in place
  bool in_place_ = false;
};

}  // namespace twell::cuda
