// The bf16 backward's rounding rule for one active (m, j), shared by the sparse backward
// (twell_ffn_backward.cu) and the dense training baseline (elementwise.cu); the same rule as
// cpu::ffn_backward (src/cpu/ffn_common.h):
//   h = bf16(g·u), dh = bf16(dot + l1·sign(h)), du = bf16(dh·g), dg = bf16(dh·u)
// with dot = dy[m]·Wd[j] in f32 and sign(±0) = ±0, sign(NaN) = NaN. dg and du come back as floats
// that hold bf16 values.
#pragma once

#include <cuda_runtime.h>

#include "twell/bf16.h"

namespace twell::cuda {

__device__ __forceinline__ void gated_entry_grads(float dot, float g, float u, float l1, float& dg, float& du) {
  const float h = round_bf16(g * u);
  const float sign = h > 0.f ? 1.f : h < 0.f ? -1.f : h;
  const float dh = round_bf16(dot + l1 * sign);
  du = round_bf16(dh * g);
  dg = round_bf16(dh * u);
}

}  // namespace twell::cuda
