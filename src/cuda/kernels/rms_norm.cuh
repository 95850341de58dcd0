// The RMSNorm arithmetic every kernel that normalises a row uses (the separate add + RMSNorm
// kernels and the down pass's fused one), so that their results agree bit for bit whatever the
// order their sums of squares were added in: out = bf16(w · (v · inv)), inv = 1/√(Σv²/H + eps).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace twell::cuda {

// inv of a row of H values whose squares sum to sum_sq.
__device__ __forceinline__ float rms_inv(float sum_sq, int64_t H, float eps) {
  return rsqrtf(sum_sq / static_cast<float>(H) + eps);
}

// One normalised value before its rounding to bf16: the weight times the scaled value.
__device__ __forceinline__ float rms_scaled(float w, float v, float inv) { return w * (v * inv); }

}  // namespace twell::cuda
