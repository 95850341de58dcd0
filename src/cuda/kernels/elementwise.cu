// Element-wise kernels of the dense FFN paths: h = bf16(g · u) and an in-place ReLU, 16-byte
// vectors, grid-stride. Covered by tests/cuda/test_twell_ffn.cu (dense path vs CPU).
#include <cuda_bf16.h>

#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
  // fp32 product of two bf16 pairs, rounded once to bf16 (as a bf16 PyTorch `g * u`).
  const float lo = bits_float(a << 16) * bits_float(b << 16);
  const float hi = bits_float(a & 0xffff0000u) * bits_float(b & 0xffff0000u);
  return pack2(lo, hi);
}

__device__ __forceinline__ uint32_t relu2(uint32_t a) {
  const uint32_t lo = (a & 0x8000u) && (a & 0x7fffu) <= 0x7f80u ? 0u : a & 0xffffu;  // keep NaN
  const uint32_t hi = (a & 0x80000000u) && ((a >> 16) & 0x7fffu) <= 0x7f80u ? 0u : a & 0xffff0000u;
  return lo | hi;
}

__global__ void mul_bf16_kernel(const uint4* __restrict__ g, const uint4* __restrict__ u, uint4* __restrict__ out,
                                int64_t n_vec) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n_vec; i += int64_t{gridDim.x} * kThreads) {
    const uint4 a = g[i], b = u[i];
    out[i] = make_uint4(mul2(a.x, b.x), mul2(a.y, b.y), mul2(a.z, b.z), mul2(a.w, b.w));
  }
}

__global__ void relu_bf16_kernel(uint4* __restrict__ g, int64_t n_vec) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n_vec; i += int64_t{gridDim.x} * kThreads) {
    const uint4 a = g[i];
    g[i] = make_uint4(relu2(a.x), relu2(a.y), relu2(a.z), relu2(a.w));
  }
}

unsigned blocks_for(int64_t n_vec) {
  return static_cast<unsigned>(std::min<int64_t>((n_vec + kThreads - 1) / kThreads, 132 * 16));
}

}  // namespace

void launch_mul_bf16(const uint16_t* g, const uint16_t* u, uint16_t* out, int64_t n, cudaStream_t stream) {
  TWELL_CHECK(n % 8 == 0, "mul_bf16: element count ", n, " is not a multiple of 8");
  if (n == 0) return;
  mul_bf16_kernel<<<blocks_for(n / 8), kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(g),
                                                               reinterpret_cast<const uint4*>(u),
                                                               reinterpret_cast<uint4*>(out), n / 8);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void launch_relu_bf16(uint16_t* g, int64_t n, cudaStream_t stream) {
  TWELL_CHECK(n % 8 == 0, "relu_bf16: element count ", n, " is not a multiple of 8");
  if (n == 0) return;
  relu_bf16_kernel<<<blocks_for(n / 8), kThreads, 0, stream>>>(reinterpret_cast<uint4*>(g), n / 8);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
