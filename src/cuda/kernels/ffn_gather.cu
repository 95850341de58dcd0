// The gather path of the sparse FFN, for a few tokens (decode): after the dense gate GEMV, only
// the rows of Wu and Wd of each token's active neurons are read, and the work of one token is
// spread over S blocks, each owning a contiguous range of R = ⌈I/S⌉ neurons (the TwELL kernels
// give a token one block, which a token with thousands of active neurons would serialise).
//
// One kernel, block (token t, range s), 256 threads:
//   1. the non-zeros of g[t, range] (any bf16 pattern but 0x0000, as TwELL) in ascending order,
//      into shared memory (room for all R: exact at any density);
//   2. a warp per entry: h = bf16(g · bf16(x_t · Wu[j]))   (non-gated: h = g), all of a row's
//      loads in flight at once;
//   3. Σ h·Wd[j] over the range's entries in fp32, 8 columns a thread;
//   4. the range's partial sum goes to global memory; the last block of the token to finish
//      (a counter per token) adds the S partial sums in range order and writes y. Deterministic.
// Every step is a few dependent memory round trips, which is what a decode step waits on.
// Covered by tests/cuda/test_twell_ffn.cu (FfnForward, gather path) and the model tests.
#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;

int64_t range_of(int64_t I, int splits) { return (I / 8 + splits - 1) / splits * 8; }

// kUp: ⌈H/256⌉ chunks of 8 columns per lane in the dot products; kDown: ⌈H/2048⌉ groups of 8
// columns per thread in the down sum.
template <int kUp, int kDown>
__global__ void __launch_bounds__(kThreads) gather_ffn_kernel(const GatherArgs a, int splits, int64_t R) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ bool last_block;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int32_t* col = reinterpret_cast<int32_t*>(smem_raw);  // [R]
  float* hv = reinterpret_cast<float*>(col + R);         // [R]

  const int64_t t = blockIdx.x;
  const int s = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j_begin = s * R, j_end = min(a.I, j_begin + R);
  const uint16_t* g = a.g + t * a.I;

  // 1. Ordered compaction of the range, 8 neurons (one 16-byte load) per thread per pass.
  int n = 0;
  for (int64_t base = j_begin; base < j_end; base += kThreads * 8) {
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
        col[offset] = static_cast<int32_t>(j0 + i - j_begin);
        hv[offset++] = bf16_bits_to_float(static_cast<uint16_t>(bits));  // g for now
      }
    }
    n += total;
    __syncthreads();  // the scan storage is reused; the list is complete
  }

  // 2. u and h, a warp per entry; the token's x stays in registers.
  if (a.gated && n > 0) {
    uint4 x[kUp];
    const uint4* xr = reinterpret_cast<const uint4*>(a.x + t * a.H);
#pragma unroll
    for (int c = 0; c < kUp; ++c) x[c] = c * 256 + lane * 8 < a.H ? xr[c * 32 + lane] : make_uint4(0, 0, 0, 0);
    for (int k = warp; k < n; k += kThreads / 32) {
      const uint4* wr = reinterpret_cast<const uint4*>(a.wu + (j_begin + col[k]) * a.H);
      uint4 w[kUp];
#pragma unroll
      for (int c = 0; c < kUp; ++c) w[c] = c * 256 + lane * 8 < a.H ? __ldg(wr + c * 32 + lane) : make_uint4(0, 0, 0, 0);
      float dot = 0.f;
#pragma unroll
      for (int c = 0; c < kUp; ++c) {
        float xf[8];
        unpack8(x[c], xf);
        dot = dot8(dot, xf, w[c]);
      }
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (lane == 0) {
        const float h = hv[k] * round_bf16(dot);  // u rounded as the bf16 up GEMM rounds it
        hv[k] = a.h_fp32 ? h : round_bf16(h);
      }
    }
    __syncthreads();
  }

  // 3. The range's part of y: columns (c·256 + tid)·8 .. +8.
  float acc[kDown][8] = {};
  int k = 0;
  for (; k + 4 <= n; k += 4) {  // four rows' loads in flight
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      if (c0 >= a.H) continue;
      uint4 w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        w[i] = __ldg(reinterpret_cast<const uint4*>(a.wd + (j_begin + col[k + i]) * a.H + c0));
#pragma unroll
      for (int i = 0; i < 4; ++i) fma8(acc[c], hv[k + i], w[i]);
    }
  }
  for (; k < n; ++k) {
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      if (c0 < a.H) fma8(acc[c], hv[k], __ldg(reinterpret_cast<const uint4*>(a.wd + (j_begin + col[k]) * a.H + c0)));
    }
  }

  // 4. Partial sums; the token's last block adds them in range order.
  auto store_y = [&](int c, const float (&v)[8]) {
    const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
    *reinterpret_cast<uint4*>(a.y + t * a.H + c0) = pack8(v);
  };
  if (splits == 1) {
#pragma unroll
    for (int c = 0; c < kDown; ++c)
      if ((c * kThreads + threadIdx.x) * 8 < a.H) store_y(c, acc[c]);
    return;
  }
  float* part = a.partial + (t * splits + s) * a.H;
#pragma unroll
  for (int c = 0; c < kDown; ++c) {
    const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
    if (c0 >= a.H) continue;
    reinterpret_cast<float4*>(part + c0)[0] = make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]);
    reinterpret_cast<float4*>(part + c0)[1] = make_float4(acc[c][4], acc[c][5], acc[c][6], acc[c][7]);
  }
  __threadfence();  // publish the partial sum before counting this block as done
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(a.done + t, 1) == splits - 1;
  __syncthreads();
  if (!last_block) return;
  __threadfence();  // see every other block's partial sum
  const float* parts = a.partial + t * splits * a.H;
#pragma unroll
  for (int c = 0; c < kDown; ++c) {
    const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
    if (c0 >= a.H) continue;
    float sum[8] = {};
    for (int r = 0; r < splits; ++r) {
      const float4 lo = __ldcg(reinterpret_cast<const float4*>(parts + r * a.H + c0));
      const float4 hi = __ldcg(reinterpret_cast<const float4*>(parts + r * a.H + c0) + 1);
      sum[0] += lo.x, sum[1] += lo.y, sum[2] += lo.z, sum[3] += lo.w;
      sum[4] += hi.x, sum[5] += hi.y, sum[6] += hi.z, sum[7] += hi.w;
    }
    store_y(c, sum);
  }
  if (threadIdx.x == 0) a.done[t] = 0;  // ready for the next call (and the next graph replay)
}

template <int kUp, int kDown>
void launch(const GatherArgs& a, int splits, int64_t R, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(R) * 8;
  allow_dynamic_smem(reinterpret_cast<const void*>(gather_ffn_kernel<kUp, kDown>), 96 * 1024);
  gather_ffn_kernel<kUp, kDown>
      <<<dim3(static_cast<unsigned>(a.M), static_cast<unsigned>(splits)), kThreads, smem, stream>>>(a, splits, R);
}

}  // namespace

// Ranges per token: many for one token (a decode step at batch 1 has the GPU to itself), one
// from 32 tokens on (each range block loads its token's x once per warp).
int gather_splits(int64_t M) { return static_cast<int>(std::clamp<int64_t>(32 / std::max<int64_t>(M, 1), 1, 32)); }

bool gather_supports(int64_t H, int64_t I) {  // x in registers; one range of neurons in shared memory
  return H % 8 == 0 && H <= 4096 && I % 8 == 0 && I <= 12288;
}

void launch_ffn_gather(const GatherArgs& a, cudaStream_t stream) {
  TWELL_CHECK(gather_supports(a.H, a.I), "FFN gather path: H = ", a.H, " and I = ", a.I,
              " must be multiples of 8 with H <= 4096");
  if (a.M == 0) return;
  const int splits = gather_splits(a.M);
  const int64_t R = range_of(a.I, splits);
  const bool two = a.H > 2048;
  switch ((a.H + 255) / 256) {
    case 1: launch<1, 1>(a, splits, R, stream); break;
    case 2: launch<2, 1>(a, splits, R, stream); break;
    case 3: case 4: launch<4, 1>(a, splits, R, stream); break;
    case 5: case 6: case 7: case 8: launch<8, 1>(a, splits, R, stream); break;
    default: two ? launch<16, 2>(a, splits, R, stream) : launch<8, 1>(a, splits, R, stream);
  }
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
