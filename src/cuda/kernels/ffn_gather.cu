// The gather path of the sparse FFN, for a few tokens (decode): after the dense gate GEMV, only
// the rows of Wu and Wd of each token's active neurons are read, and the work of one token is
// spread over S blocks, each owning a contiguous range of R = ⌈I/S⌉ neurons (the TwELL kernels
// give a token one block, which a token with thousands of active neurons would serialise).
//
//   up     block (token t, range s): finds the non-zeros of g[t, range] (any bf16 pattern but
//          0x0000, as TwELL) in ascending order, writes them to the segment (t, s) of the index
//          list (room for all R: exact at any density), then a warp per entry computes
//          h = bf16(g · bf16(x_t · Wu[j]))   (non-gated: h = g)
//   down   block (token t, range s), 8 columns a thread: Σ h·Wd[j] over the segment in fp32;
//          the ranges' partial sums are then added in range order (deterministic)
// Covered by tests/cuda/test_twell_ffn.cu (FfnForward, gather path) and the model tests.
#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "cuda/kernels.h"

namespace twell::cuda {
namespace {

constexpr int kUpThreads = 256;

int64_t range_of(int64_t I, int splits) { return (I / 8 + splits - 1) / splits * 8; }

__global__ void __launch_bounds__(kUpThreads) up_kernel(const GatherArgs a, int splits, int64_t R) {
  using Scan = cub::BlockScan<int, kUpThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int64_t t = blockIdx.x;
  const int s = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j_begin = s * R, j_end = min(a.I, j_begin + R);
  const int64_t seg = t * splits + s;
  int32_t* idx = a.idx + seg * R;
  float* h = a.h + seg * R;
  const uint16_t* g = a.g + t * a.I;

  // 1. Ordered compaction of the range, 8 neurons (one 16-byte load) per thread per pass.
  int n = 0;
  for (int64_t base = j_begin; base < j_end; base += kUpThreads * 8) {
    const int64_t j0 = base + threadIdx.x * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (j0 < j_end) v = *reinterpret_cast<const uint4*>(g + j0);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    int mine = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) mine += ((w[i] & 0xffffu) != 0) + ((w[i] >> 16) != 0);
    int offset = 0, total = 0;
    Scan(scan).ExclusiveSum(mine, offset, total);
    offset += n;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t bits = i % 2 ? w[i / 2] >> 16 : w[i / 2] & 0xffffu;
      if (bits != 0) {
        idx[offset] = static_cast<int32_t>(j0 + i);
        h[offset++] = bf16_bits_to_float(static_cast<uint16_t>(bits));  // g for now
      }
    }
    n += total;
    __syncthreads();  // the scan storage is reused
  }
  if (threadIdx.x == 0) a.count[seg] = n;
  if (!a.gated) return;  // h = g
  __syncthreads();       // the list is read back by other warps

  // 2. u and h, a warp per entry.
  const uint4* x = reinterpret_cast<const uint4*>(a.x + t * a.H);
  const int64_t chunks = a.H / 8;
  for (int k = warp; k < n; k += kUpThreads / 32) {
    const uint4* wrow = reinterpret_cast<const uint4*>(a.wu + static_cast<int64_t>(idx[k]) * a.H);
    float dot = 0.f;
    for (int64_t c = lane; c < chunks; c += 32) {
      const uint4 xv = x[c], wv = __ldg(wrow + c);
      const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w}, ws[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        dot += bits_float(xs[i] << 16) * bits_float(ws[i] << 16) +
               bits_float(xs[i] & 0xffff0000u) * bits_float(ws[i] & 0xffff0000u);
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (lane == 0) {
      const float hv = h[k] * round_bf16(dot);  // u rounded as the bf16 up GEMM rounds it
      h[k] = a.h_fp32 ? hv : round_bf16(hv);
    }
  }
}

// Block (token t, range s), thread = 8 columns.
__global__ void down_kernel(const GatherArgs a, int splits, int64_t R) {
  const int64_t t = blockIdx.x;
  const int s = blockIdx.y;
  const int64_t col0 = static_cast<int64_t>(threadIdx.x) * 8;
  if (col0 >= a.H) return;
  const int64_t seg = t * splits + s;
  const int n = a.count[seg];
  const int32_t* idx = a.idx + seg * R;
  const float* h = a.h + seg * R;
  float acc[8] = {};
  int k = 0;
  for (; k + 4 <= n; k += 4) {  // four rows' loads in flight
    uint4 wv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      wv[i] = __ldg(reinterpret_cast<const uint4*>(a.wd + static_cast<int64_t>(idx[k + i]) * a.H + col0));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float hv = h[k + i];
      const uint32_t ws[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        acc[2 * q] = fmaf(hv, bits_float(ws[q] << 16), acc[2 * q]);
        acc[2 * q + 1] = fmaf(hv, bits_float(ws[q] & 0xffff0000u), acc[2 * q + 1]);
      }
    }
  }
  for (; k < n; ++k) {
    const float hv = h[k];
    const uint4 wv = __ldg(reinterpret_cast<const uint4*>(a.wd + static_cast<int64_t>(idx[k]) * a.H + col0));
    const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      acc[2 * q] = fmaf(hv, bits_float(ws[q] << 16), acc[2 * q]);
      acc[2 * q + 1] = fmaf(hv, bits_float(ws[q] & 0xffff0000u), acc[2 * q + 1]);
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

int gather_splits(int64_t M) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(32, 2048 / std::max<int64_t>(M, 1))));
}

int64_t gather_list_size(int64_t M, int64_t I) { return M * gather_splits(M) * range_of(I, gather_splits(M)); }

void launch_ffn_gather(const GatherArgs& a, cudaStream_t stream) {
  TWELL_CHECK(a.H % 8 == 0 && a.H <= 8192 && a.I % 8 == 0, "FFN gather path: H = ", a.H, " and I = ", a.I,
              " must be multiples of 8, H at most 8192");
  if (a.M == 0) return;
  const int splits = gather_splits(a.M);
  const int64_t R = range_of(a.I, splits);
  const dim3 grid(static_cast<unsigned>(a.M), static_cast<unsigned>(splits));
  up_kernel<<<grid, kUpThreads, 0, stream>>>(a, splits, R);
  TWELL_CUDA_CHECK(cudaGetLastError());
  down_kernel<<<grid, static_cast<unsigned>((a.H / 8 + 31) / 32 * 32), 0, stream>>>(a, splits, R);
  TWELL_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    const int64_t n = a.M * a.H;
    reduce_kernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 132 * 8)), 256, 0, stream>>>(a, splits);
    TWELL_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace twell::cuda
