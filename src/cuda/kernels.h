// Launchers of twell's CUDA kernels (internal). Each checks what it supports, then launches on the
// given stream and checks the launch. Kernel files: src/cuda/kernels/<stem>.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "twell/cuda/twell_device.h"
#include "twell/ffn.h"

namespace twell::cuda {

// twell_pack.cu: dense bf16 g [rows, cols] -> TwELL; adds the non-zero count to *nnz_total and
// sets *overflow if the backup ran out of room (never with the default, worst-case capacity).
void check_twell_pack(const TwellLayout& layout);
void launch_twell_pack(const uint16_t* dense, const TwellDeviceView& m, unsigned long long* nnz_total,
                       unsigned int* overflow, int sm_count, cudaStream_t stream);

// twell_ffn_updown.cu: y = h Wd over the active set held by `act`, with h = g ⊙ bf16(x Wuᵀ)
// (gated) or h = act (non-gated). x, y [M, H]; wu, wd [I, H]; all bf16, row-major.
struct UpDownArgs {
  TwellDeviceView act;
  const uint16_t* x = nullptr;
  const uint16_t* wu = nullptr;
  const uint16_t* wd = nullptr;
  uint16_t* y = nullptr;
  int64_t M = 0, H = 0, I = 0;
  bool gated = true;
  Precision precision = Precision::bf16;
};
void check_twell_ffn_updown(const UpDownArgs& a);
void launch_twell_ffn_updown(const UpDownArgs& a, cudaStream_t stream);

// elementwise.cu (dense paths), n elements, 16-byte aligned, n % 8 == 0:
//   out = bf16(g · u)           (g already ReLU'd by the GEMM epilogue)
//   g   = relu(g) in place       (the unfused, PyTorch-style pipeline)
void launch_mul_bf16(const uint16_t* g, const uint16_t* u, uint16_t* out, int64_t n, cudaStream_t stream);
void launch_relu_bf16(uint16_t* g, int64_t n, cudaStream_t stream);

}  // namespace twell::cuda
