// Reading a SplitSum (kernels.h: one token's FFN output as fp32 partial sums, ~30 flagged parts of
// H columns at the paper's shape). One block reading them all waits on its own L2 bandwidth and
// round trips (10.7 µs a layer measured, docs/perf.md model item 15), so the columns are spread
// over kSplitBlocks blocks: each lists the flagged parts in ascending order, and in its slice of
// H / kSplitBlocks columns, group g of its threads adds parts g, g + G, g + 2G, ... with
// kSplitInFlight loads in flight, then the groups' sums are added in group order. The order
// depends only on the flags, so the sum does not depend on timing. Used by launch_split_sum
// (ffn_gather.cu) and by the split form of launch_add_rmsnorm (llama_layers.cu, one cluster).
#pragma once

#include <cub/block/block_scan.cuh>

#include "cuda/kernels.h"

namespace twell::cuda {
namespace {

constexpr int kMaxSplitParts = 2048;  // parts a SplitSum may have (the list lives in shared memory)
constexpr int kSplitBlocks = 8;       // blocks sharing one split sum's columns (a portable cluster)
constexpr int kSplitThreads = 256;
constexpr int kSplitInFlight = 8;

// H a split sum supports: slices of whole float4 quads, at most one quad a thread.
constexpr bool split_sum_width_ok(int64_t H) {
  return H > 0 && H % (4 * kSplitBlocks) == 0 && H / (4 * kSplitBlocks) <= kSplitThreads;
}

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

// This block's slice of the split sum: thread q < H / (4·kSplitBlocks) gets columns
// blockIdx.x·H/kSplitBlocks + 4q .. + 4 (fp32, not rounded). Every thread of the block
// (kSplitThreads) must call it; it waits on the flags and ends with a barrier.
__device__ float4 split_slice_sum(const SplitSum& s, int64_t H) {
  __shared__ int32_t list[kMaxSplitParts];
  __shared__ float4 group_sum[kSplitThreads];
  const int n = collect_split_list<kSplitThreads>(s, list);
  const int t = static_cast<int>(threadIdx.x);
  const int quads = static_cast<int>(H / (4 * kSplitBlocks)), groups = kSplitThreads / quads;
  const int q = t % quads, g = t / quads;
  const float* base = s.parts + blockIdx.x * (H / kSplitBlocks) + 4 * q;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (g < groups)
    for (int k = g; k < n; k += kSplitInFlight * groups) {
      // Up to kSplitInFlight loads in flight, then added in list order. (A tail loop of one load
      // at a time made ~28 parts seven serial L2 round trips: the norm took 0.7 µs longer.)
      float4 v[kSplitInFlight];
#pragma unroll
      for (int i = 0; i < kSplitInFlight; ++i)
        if (k + i * groups < n)
          v[i] = __ldcg(reinterpret_cast<const float4*>(base + static_cast<int64_t>(list[k + i * groups]) * H));
#pragma unroll
      for (int i = 0; i < kSplitInFlight; ++i)
        if (k + i * groups < n) acc.x += v[i].x, acc.y += v[i].y, acc.z += v[i].z, acc.w += v[i].w;
    }
  group_sum[t] = acc;
  __syncthreads();
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  if (t < quads)
    for (int i = 0; i < groups; ++i) {
      const float4 v = group_sum[i * quads + t];
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
  __syncthreads();
  return sum;
}

}  // namespace
}  // namespace twell::cuda
