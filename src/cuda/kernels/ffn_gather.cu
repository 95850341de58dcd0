// The gather path of the sparse FFN, for a few tokens (decode): after the dense gate GEMV, only
// the rows of Wu and Wd of each token's active neurons are read, and the work of one token is
// spread over S blocks, each owning a contiguous range of R = ⌈I/S⌉ neurons (the TwELL kernels
// give a token one block, which a token with thousands of active neurons would serialise).
//
// Block (token t, range s), 256 threads:
//   1. the non-zeros of g[t, range] (any bf16 pattern but 0x0000, as TwELL) in ascending order,
//      into shared memory (room for all R: exact at any density);
//   2. a warp per entry: h = bf16(g · bf16(x_t · Wu[j]))   (non-gated: h = g), all of a row's
//      loads in flight at once;
//   3. Σ h·Wd[j] over the range's entries in fp32, 8 columns a thread;
//   4. the range's partial sum goes to global memory; a second kernel adds the S partial sums
//      (block per token and 64 columns, in a fixed order) and writes y. Deterministic.
// Every step is a few dependent memory round trips, which is what a decode step waits on. (A
// token's last block adding all S sums itself was one round trip per range: 12 µs at S = 32 and
// 40 µs a layer for the heavier tokens of a model's deeper layers; docs/perf.md.)
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
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int32_t* col = reinterpret_cast<int32_t*>(smem_raw);  // [R]
  float* hv = reinterpret_cast<float*>(col + R);         // [R]

  const int64_t t = blockIdx.x;
  const int s = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j_begin = s * R, j_end = min(a.I, j_begin + R);
  const uint16_t* g = a.g + t * a.I;
  // The token's x, for phase 2: loaded now, its latency hidden behind phase 1.
  uint4 x[kUp];
  if (a.gated) {
    const uint4* xr = reinterpret_cast<const uint4*>(a.x + t * a.H);
#pragma unroll
    for (int c = 0; c < kUp; ++c) x[c] = c * 256 + lane * 8 < a.H ? xr[c * 32 + lane] : make_uint4(0, 0, 0, 0);
  }

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

  // The Wd rows of the first kPre entries: they do not depend on h, so their loads overlap phase 2's.
  constexpr int kPre = 8 / kDown;
  uint4 pre[kPre][kDown];
#pragma unroll
  for (int i = 0; i < kPre; ++i)
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      pre[i][c] = i < n && c0 < a.H ? __ldg(reinterpret_cast<const uint4*>(a.wd + (j_begin + col[i]) * a.H + c0))
                                    : make_uint4(0, 0, 0, 0);
    }

  // 2. u and h, a warp per entry; the token's x stays in registers.
  if (a.gated && n > 0) {
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
#pragma unroll
  for (int i = 0; i < kPre; ++i)
    if (i < n) {
#pragma unroll
      for (int c = 0; c < kDown; ++c) fma8(acc[c], hv[i], pre[i][c]);  // zero rows past H: no effect
    }
  int k = kPre;
  for (; k + 8 <= n; k += 8) {  // eight rows' loads in flight
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      if (c0 >= a.H) continue;
      uint4 w[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        w[i] = __ldg(reinterpret_cast<const uint4*>(a.wd + (j_begin + col[k + i]) * a.H + c0));
#pragma unroll
      for (int i = 0; i < 8; ++i) fma8(acc[c], hv[k + i], w[i]);
    }
  }
  for (; k < n; ++k) {
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      if (c0 < a.H) fma8(acc[c], hv[k], __ldg(reinterpret_cast<const uint4*>(a.wd + (j_begin + col[k]) * a.H + c0)));
    }
  }

  // 4. The range's partial sum (one range: y itself); gather_reduce_kernel adds them.
  if (splits == 1) {
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      if (c0 < a.H) *reinterpret_cast<uint4*>(a.y + t * a.H + c0) = pack8(acc[c]);
    }
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
}

// y[t, c] = Σ_s partial[t, s, c]: block (token, 64 columns); thread (group q, column c) adds
// ranges q, q + 4, ... with eight loads in flight, then the four groups are added in order.
constexpr int kReduceCols = 64, kReduceGroups = kThreads / kReduceCols;

__global__ void __launch_bounds__(kThreads) gather_reduce_kernel(const GatherArgs a, int splits) {
  __shared__ float sums[kReduceGroups][kReduceCols];
  const int64_t t = blockIdx.x;
  const int q = threadIdx.x / kReduceCols, c = threadIdx.x % kReduceCols;
  const int64_t col = static_cast<int64_t>(blockIdx.y) * kReduceCols + c;
  float sum = 0.f;
  if (col < a.H) {
    const float* parts = a.partial + t * splits * a.H + col;
    int s = q;
    for (; s + 7 * kReduceGroups < splits; s += 8 * kReduceGroups) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = __ldcg(parts + (s + i * kReduceGroups) * a.H);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += v[i];
    }
    for (; s < splits; s += kReduceGroups) sum += __ldcg(parts + s * a.H);
  }
  sums[q][c] = sum;
  __syncthreads();
  if (q == 0 && col < a.H) {
    float y = sums[0][c];
#pragma unroll
    for (int i = 1; i < kReduceGroups; ++i) y += sums[i][c];
    a.y[t * a.H + col] = float_to_bf16_bits(y);
  }
}

template <int kUp, int kDown>
void launch(const GatherArgs& a, int splits, int64_t R, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(R) * 8;
  allow_dynamic_smem(reinterpret_cast<const void*>(gather_ffn_kernel<kUp, kDown>), 96 * 1024);
  gather_ffn_kernel<kUp, kDown>
      <<<dim3(static_cast<unsigned>(a.M), static_cast<unsigned>(splits)), kThreads, smem, stream>>>(a, splits, R);
  TWELL_CUDA_CHECK(cudaGetLastError());
  if (splits == 1) return;
  const dim3 grid(static_cast<unsigned>(a.M), static_cast<unsigned>((a.H + kReduceCols - 1) / kReduceCols));
  gather_reduce_kernel<<<grid, kThreads, 0, stream>>>(a, splits);
}

}  // namespace

// Ranges per token: 128 blocks in all up to 128 tokens (a decode step has the GPU to itself, and a
// token with hundreds of active neurons must not serialise in a few blocks), one from 128 on.
int gather_splits(int64_t M) { return static_cast<int>(std::clamp<int64_t>(128 / std::max<int64_t>(M, 1), 1, 128)); }

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
