// twell_pack: dense activation g [M, I] bf16 (device) -> TwELL hybrid (twell_format.h), for the
// non-gated FFN and for tests; the gated forward packs inside its up kernel instead.
// One warp per row, grid-stride, several tiles' loads in flight (per-tile work: twell_pack.cuh).
// Non-zeros are summed per block and added to `nnz_total` once per block (a single hot address
// would serialise millions of atomics). Also: count_sampled_nonzeros for dispatch.
// Covered by tests/cuda/test_twell_ffn.cu.
#include "cuda/kernels/twell_pack.cuh"

namespace twell::cuda {
namespace {

using namespace pack;
constexpr int kThreads = 256;
// Grid-stride over rows, one warp per row; a row's tiles go kTilesInFlight at a time, their
// first loads issued together so that each warp keeps several 16-byte loads in flight. (Walking
// rows rather than flat tile ids avoids a 64-bit division per tile, measured at ~10% of the time.)
constexpr int kTilesInFlight = 4;

// NOTE: 4 blocks of 256 threads (64 registers) resident per SM; the first version ran at 64
// registers in 0.98 ms, a later one at 80 registers in ~1.2 ms (M = 131072, ncu).
__global__ __launch_bounds__(kThreads, 4) void twell_pack_kernel(const uint16_t* __restrict__ dense, TwellDeviceView m,
                                                             unsigned long long* __restrict__ nnz_total,
                                                             unsigned int* __restrict__ overflow) {
  const TwellLayout& l = m.layout;
  const int lane = threadIdx.x % 32;
  const int64_t n_tiles = l.n_tiles();
  const int64_t warp_global = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int64_t warp_stride = static_cast<int64_t>(gridDim.x) * kThreads / 32;
  unsigned long long my_nnz = 0;

  for (int64_t row = warp_global; row < l.rows; row += warp_stride) {
    const uint16_t* in = dense + row * l.cols;
    for (int64_t t0 = 0; t0 < n_tiles; t0 += kTilesInFlight) {
      uint4 v[kTilesInFlight];
#pragma unroll
      for (int i = 0; i < kTilesInFlight; ++i) {
        const int64_t t = t0 + i;
        v[i] = t < n_tiles ? load_cols(in + t * l.tile, lane * kColsPerLane, l.tile_width(t)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kTilesInFlight; ++i)
        if (t0 + i < n_tiles) my_nnz += pack_tile(dense, m, row, t0 + i, v[i], overflow, lane);
    }
  }

  // One atomic per block for the non-zero total.
  __shared__ unsigned long long block_nnz[kThreads / 32];
  if (lane == 0) block_nnz[threadIdx.x / 32] = my_nnz;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long sum = 0;
    for (int w = 0; w < kThreads / 32; ++w) sum += block_nnz[w];
    if (sum) atomicAdd(nnz_total + blockIdx.x % kNnzCounters, sum);
  }
}

// One block per sampled row: row i of the sample is row i·rows/n_sample of g.
constexpr int kSampleThreads = 256;

__global__ __launch_bounds__(kSampleThreads) void count_sampled_kernel(const uint16_t* __restrict__ g, int64_t rows,
                                                                      int64_t cols, int64_t n_sample,
                                                                      unsigned long long* __restrict__ out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * rows / n_sample;
  const uint4* in = reinterpret_cast<const uint4*>(g + row * cols);
  uint32_t n = 0;
  for (int64_t v = threadIdx.x; v < cols / kColsPerLane; v += kSampleThreads) n += nonzeros(__ldg(in + v));
  n = __reduce_add_sync(0xffffffffu, n);
  __shared__ uint32_t warp_sum[kSampleThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = n;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long total = 0;
    for (int w = 0; w < kSampleThreads / 32; ++w) total += warp_sum[w];
    atomicAdd(out, total);
  }
}

}  // namespace

void launch_count_sampled_nonzeros(const uint16_t* g, int64_t rows, int64_t cols, int64_t n_sample,
                                   unsigned long long* out, cudaStream_t stream) {
  TWELL_CHECK(cols % kColsPerLane == 0, "count_sampled_nonzeros: cols = ", cols, " is not a multiple of 8");
  if (rows == 0 || n_sample == 0) return;
  count_sampled_kernel<<<static_cast<unsigned>(n_sample), kSampleThreads, 0, stream>>>(g, rows, cols, n_sample, out);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void check_twell_pack(const TwellLayout& l) {
  l.check();
  TWELL_CHECK(l.tile % kColsPerLane == 0 && l.cols % kColsPerLane == 0, "GPU TwELL pack: tile width ", l.tile,
              " and I = ", l.cols, " must be multiples of ", kColsPerLane);
}

void launch_twell_pack(const uint16_t* dense, const TwellDeviceView& m, unsigned long long* nnz_total,
                       unsigned int* overflow, int sm_count, cudaStream_t stream) {
  check_twell_pack(m.layout);
  const int64_t warps = m.layout.rows;  // one per row
  if (warps == 0) return;
  const int64_t blocks = std::min<int64_t>((warps * 32 + kThreads - 1) / kThreads, int64_t{sm_count} * 4);
  twell_pack_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(dense, m, nnz_total, overflow);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
