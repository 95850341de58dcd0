// Launchers of twell's CUDA kernels (internal). Each checks what it supports, then launches on the
// given stream and checks the launch. Kernel files: src/cuda/kernels/<stem>.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "twell/cuda/twell_device.h"
#include "twell/ffn.h"

namespace twell::cuda {

// Non-zero totals are accumulated in kNnzCounters counters (blocks spread their atomics over
// them; one hot address would serialise ~10^5 atomics): the total is their sum.
constexpr int kNnzCounters = 64;

// twell_pack.cu: dense bf16 g [rows, cols] -> TwELL; adds the non-zero count to nnz_total[0..64)
// and sets *overflow if the backup ran out of room (never with the default, worst-case capacity).
void check_twell_pack(const TwellLayout& layout);
void launch_twell_pack(const uint16_t* dense, const TwellDeviceView& m, unsigned long long* nnz_total,
                       unsigned int* overflow, int sm_count, cudaStream_t stream);
// Adds the non-zero count of n_sample rows spread evenly over g [rows, cols] to *out (dispatch's
// density estimate: a few MB read instead of the whole activation).
void launch_count_sampled_nonzeros(const uint16_t* g, int64_t rows, int64_t cols, int64_t n_sample,
                                   unsigned long long* out, cudaStream_t stream);

// twell_ffn_sparse.cu: y = h Wd over the active set held by `act`. Gated: an up pass writes
// u = bf16(x Wuᵀ) for every active entry into `u_vals` (twell_u_size(act) values), then the down
// pass uses h = g ⊙ u. Non-gated: h = act. x, y [M, H]; wu, wd [I, H]; all bf16, row-major.
struct SparseFfnArgs {
  TwellDeviceView act;
  const uint16_t* x = nullptr;
  const uint16_t* wu = nullptr;
  const uint16_t* wd = nullptr;
  uint16_t* u_vals = nullptr;
  uint16_t* y = nullptr;
  int64_t M = 0, H = 0, I = 0;
  bool gated = true;
  Precision precision = Precision::bf16;
};
int64_t twell_u_size(const TwellDeviceView& act);
void check_twell_ffn_sparse(const SparseFfnArgs& a);
void launch_twell_ffn_sparse(const SparseFfnArgs& a, cudaStream_t stream);

// elementwise.cu (dense paths), n elements, 16-byte aligned, n % 8 == 0:
//   out = bf16(g · u)           (g already ReLU'd by the GEMM epilogue)
//   g   = relu(g) in place       (the unfused, PyTorch-style pipeline)
void launch_mul_bf16(const uint16_t* g, const uint16_t* u, uint16_t* out, int64_t n, cudaStream_t stream);
void launch_relu_bf16(uint16_t* g, int64_t n, cudaStream_t stream);

}  // namespace twell::cuda
