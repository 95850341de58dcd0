// bf16 vectors in registers, shared by the kernels of this folder: 8 values in a uint4 (one
// 16-byte access) or 2 in a uint32_t, the element with the lower index in the low half. Packing
// rounds to nearest even (float_to_bf16_bits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "twell/bf16.h"

namespace twell::cuda {

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = bits_float(w[i] << 16);
    f[2 * i + 1] = bits_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16_bits(lo)) | (static_cast<uint32_t>(float_to_bf16_bits(hi)) << 16);
}

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
}

// acc[e] = fma(h, w[e], acc[e]) for the 8 elements of w.
__device__ __forceinline__ void fma8(float (&acc)[8], float h, const uint4& w) {
  float wf[8];
  unpack8(w, wf);
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = fmaf(h, wf[e], acc[e]);
}

// dot + Σ x[e]·w[e], added a pair of elements at a time in element order.
__device__ __forceinline__ float dot8(float dot, const float (&x)[8], const uint4& w) {
  float wf[8];
  unpack8(w, wf);
#pragma unroll
  for (int i = 0; i < 4; ++i) dot += x[2 * i] * wf[2 * i] + x[2 * i + 1] * wf[2 * i + 1];
  return dot;
}

// One row of K ≤ kChunks·256 bf16 values spread over a warp: lane l holds columns c·256 + 8l ..
// + 8 of chunk c (zeros past K). The decode kernels keep x so, and take a row of weights a warp.
template <int kChunks>
__device__ __forceinline__ void load_row_chunks(const uint16_t* row, int64_t K, int lane, uint4 (&q)[kChunks]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    q[c] = c * 256 + lane * 8 < K ? *reinterpret_cast<const uint4*>(row + c * 256 + lane * 8) : make_uint4(0, 0, 0, 0);
}

// x · w for x held as load_row_chunks leaves it and w a row of K values (shared or global
// memory): every piece of w is loaded before any is used (a guard around each load made each
// its own round trip), the lane's sum runs in column order, then a butterfly over the warp;
// every lane returns the same sum.
template <int kChunks>
__device__ __forceinline__ float warp_row_dot(const uint4 (&xq)[kChunks], const uint16_t* w, int64_t K, int lane) {
  uint4 wq[kChunks];
  load_row_chunks(w, K, lane, wq);
  float dot = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    if (c * 256 + lane * 8 < K) {
      float xf[8];
      unpack8(xq[c], xf);
      dot = dot8(dot, xf, wq[c]);
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  return dot;
}

}  // namespace twell::cuda
