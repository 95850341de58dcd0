// The gather path of the sparse FFN, for a few tokens (decode): after the dense gate GEMV, only
// the rows of Wu and Wd of each token's active neurons are read, and the work of one token is
// spread over many blocks (the TwELL kernels give a token one block, which a token with thousands
// of active neurons would serialise).
//
//   compact   one block per token: ascending indices of g[t, :] ≠ 0 (any bf16 pattern but
//             0x0000, as TwELL), exact at any density (room for all I)
//   up        warp per entry: h = bf16(g · bf16(x_t · Wu[j]))   (non-gated: h = g)
//   down      block (token, split): a contiguous range of the token's entries, 8 columns a
//             thread, fp32; the splits' partial sums are added in split order (deterministic)
// Covered by tests/cuda/test_twell_ffn.cu (FfnForward, gather path) and the model tests.
#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "cuda/kernels.h"

namespace twell::cuda {
namespace {

constexpr int kCompactThreads = 256, kUpThreads = 256;

__global__ void __launch_bounds__(kCompactThreads) compact_kernel(const GatherArgs a) {
  using Scan = cub::BlockScan<int, kCompactThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int64_t t = blockIdx.x;
  const uint16_t* g = a.g + t * a.I;
  const int64_t per = (a.I + kCompactThreads - 1) / kCompactThreads;  // contiguous segment per thread
  const int64_t j0 = threadIdx.x * per, j1 = min(a.I, j0 + per);
  int n = 0;
  for (int64_t j = j0; j < j1; ++j) n += g[j] != 0;
  int offset = 0, total = 0;
  Scan(scan).ExclusiveSum(n, offset, total);
  int32_t* idx = a.idx + t * a.I;
  for (int64_t j = j0; j < j1; ++j)
    if (g[j] != 0) idx[offset++] = static_cast<int32_t>(j);
  if (threadIdx.x == 0) a.count[t] = total;
}

// Block (token t, split s): warps take entries s·8 + w, stepping by splits·8.
__global__ void __launch_bounds__(kUpThreads) up_kernel(const GatherArgs a, int splits) {
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = a.count[t];
  const int32_t* idx = a.idx + t * a.I;
  const uint16_t* g = a.g + t * a.I;
  float* h = a.h + t * a.I;
  const uint4* x = reinterpret_cast<const uint4*>(a.x + t * a.H);
  const int64_t chunks = a.H / 8;
  for (int k = blockIdx.y * (kUpThreads / 32) + warp; k < n; k += splits * (kUpThreads / 32)) {
    const int64_t j = idx[k];
    const float gv = bf16_bits_to_float(g[j]);
    if (!a.gated) {
      if (lane == 0) h[k] = gv;
      continue;
    }
    const uint4* w = reinterpret_cast<const uint4*>(a.wu + j * a.H);
    float dot = 0.f;
    for (int64_t c = lane; c < chunks; c += 32) {
      const uint4 xv = x[c], wv = __ldg(w + c);
      const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w}, ws[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        dot += bits_float(xs[i] << 16) * bits_float(ws[i] << 16) +
               bits_float(xs[i] & 0xffff0000u) * bits_float(ws[i] & 0xffff0000u);
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (lane == 0) {
      const float hv = gv * round_bf16(dot);  // u rounded as the bf16 up GEMM rounds it
      h[k] = a.h_fp32 ? hv : round_bf16(hv);
    }
  }
}

// Block (token t, split s), thread = 8 columns; entries [s·chunk, (s+1)·chunk) of the token.
__global__ void down_kernel(const GatherArgs a, int splits) {
  const int64_t t = blockIdx.x;
  const int s = blockIdx.y;
  const int64_t col0 = static_cast<int64_t>(threadIdx.x) * 8;
  if (col0 >= a.H) return;
  const int n = a.count[t], chunk = (n + splits - 1) / splits;
  const int k0 = s * chunk, k1 = min(n, k0 + chunk);
  const int32_t* idx = a.idx + t * a.I;
  const float* h = a.h + t * a.I;
  float acc[8] = {};
  for (int k = k0; k < k1; ++k) {
    const float hv = h[k];
    const uint4 wv = __ldg(reinterpret_cast<const uint4*>(a.wd + static_cast<int64_t>(idx[k]) * a.H + col0));
    const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[2 * i] = fmaf(hv, bits_float(ws[i] << 16), acc[2 * i]);
      acc[2 * i + 1] = fmaf(hv, bits_float(ws[i] & 0xffff0000u), acc[2 * i + 1]);
    }
  }
  if (splits == 1) {
    uint32_t out[4];
    for (int i = 0; i < 4; ++i)
      out[i] = static_cast<uint32_t>(float_to_bf16_bits(acc[2 * i])) |
               (static_cast<uint32_t>(float_to_bf16_bits(acc[2 * i + 1])) << 16);
    *reinterpret_cast<uint4*>(a.y + t * a.H + col0) = make_uint4(out[0], out[1], out[2], out[3]);
    return;
  }
  float4* p = reinterpret_cast<float4*>(a.partial + (static_cast<int64_t>(s) * a.M + t) * a.H + col0);
  p[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  p[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
}

__global__ void reduce_kernel(const GatherArgs a, int splits) {
  const int64_t n = a.M * a.H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < splits; ++s) v += a.partial[s * n + i];
    a.y[i] = float_to_bf16_bits(v);
  }
}

}  // namespace

int gather_down_splits(int64_t M) { return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(32, 1024 / std::max<int64_t>(M, 1)))); }

void launch_ffn_gather(const GatherArgs& a, cudaStream_t stream) {
  TWELL_CHECK(a.H % 8 == 0 && a.H <= 8192, "FFN gather path: H = ", a.H, " must be a multiple of 8 and at most 8192");
  if (a.M == 0) return;
  const unsigned M = static_cast<unsigned>(a.M);
  compact_kernel<<<M, kCompactThreads, 0, stream>>>(a);
  TWELL_CUDA_CHECK(cudaGetLastError());
  const int up_splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(16, 512 / a.M)));
  up_kernel<<<dim3(M, up_splits), kUpThreads, 0, stream>>>(a, up_splits);
  TWELL_CUDA_CHECK(cudaGetLastError());
  const int splits = gather_down_splits(a.M);
  const int threads = static_cast<int>((a.H / 8 + 31) / 32 * 32);
  down_kernel<<<dim3(M, splits), threads, 0, stream>>>(a, splits);
  TWELL_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    const int64_t n = a.M * a.H;
    reduce_kernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 132 * 8)), 256, 0, stream>>>(a, splits);
    TWELL_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace twell::cuda
