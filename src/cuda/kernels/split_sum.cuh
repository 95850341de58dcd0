// Reading a SplitSum (kernels.h: one token's FFN output as ordered fp32 partial sums): the block
// lists the flagged parts in ascending order, then each thread adds its 8 columns over that list
// in the same order, so the sum does not depend on timing. Used by launch_split_sum (ffn_gather.cu)
// and by the split form of launch_add_rmsnorm (llama_layers.cu).
#pragma once

#include <cub/block/block_scan.cuh>

#include "cuda/kernels.h"

namespace twell::cuda {
namespace {

constexpr int kMaxSplitParts = 2048;  // parts a SplitSum may have (the list lives in shared memory)

// The flagged parts of `s` in ascending order into list[0..n); returns n. Every thread of the
// block (kThreads of them) must call it; it ends with a barrier.
template <int kThreads>
__device__ int collect_split_list(const SplitSum& s, int32_t* list) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  int n = 0;
  for (int base = 0; base < s.count; base += kThreads) {
    const int b = base + static_cast<int>(threadIdx.x);
    const int on = b < s.count && s.flags[b] != 0;
    int offset = 0, total = 0;
    Scan(scan).ExclusiveSum(on, offset, total);
    if (on) list[n + offset] = b;
    n += total;
    __syncthreads();  // the scan storage is reused; the list is complete
  }
  return n;
}

// v[e] = Σ_k parts[list[k]][c0 + e], k ascending, fp32; four parts' loads in flight.
__device__ __forceinline__ void split_sum8(const SplitSum& s, const int32_t* list, int n, int64_t H, int64_t c0,
                                           float (&v)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = 0.f;
  int k = 0;
  for (; k + 4 <= n; k += 4) {
    float4 q[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4* p = reinterpret_cast<const float4*>(s.parts + static_cast<int64_t>(list[k + i]) * H + c0);
      q[i][0] = __ldcg(p);
      q[i][1] = __ldcg(p + 1);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[0] += q[i][0].x, v[1] += q[i][0].y, v[2] += q[i][0].z, v[3] += q[i][0].w;
      v[4] += q[i][1].x, v[5] += q[i][1].y, v[6] += q[i][1].z, v[7] += q[i][1].w;
    }
  }
  for (; k < n; ++k) {
    const float4* p = reinterpret_cast<const float4*>(s.parts + static_cast<int64_t>(list[k]) * H + c0);
    const float4 lo = __ldcg(p), hi = __ldcg(p + 1);
    v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w;
    v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
  }
}

}  // namespace
}  // namespace twell::cuda
