// twell_pack: dense activation g [M, I] bf16 (device) -> TwELL hybrid (twell_format.h), for the
// sparse path when the gate GEMM is not fused with the pack (gate_pack.cu), and for tests.
// One warp per row, grid-stride, several tiles' loads in flight. Per tile, the warp loads 8
// columns a lane (16 B), counts the non-zeros, and either writes the packed entries at warp-prefix
// offsets (ascending column order, deterministic) or claims a backup tile with one atomic and
// copies the values there.
// Non-zeros are summed per block and added to `nnz_total` once per block (a single hot address
// would serialise millions of atomics). Also: count_sampled_nonzeros for dispatch.
// Covered by tests/cuda/test_twell_ffn.cu.
#include "cuda/kernels.h"
#include "cuda/kernels/bulk_copy.cuh"
#include "cuda/kernels/pack_report.cuh"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColsPerLane = 8;  // one 16-byte load
constexpr int kColsPerPass = 32 * kColsPerLane;

// Loads this lane's 8 columns [c, c + 8) of a tile (zeros past its width).
__device__ __forceinline__ uint4 load_cols(const uint16_t* in, int c, int width) {
  return c < width ? __ldcs(reinterpret_cast<const uint4*>(in + c)) : make_uint4(0, 0, 0, 0);
}

// Bit i set when column c + i of this lane's 8 columns is non-zero (bf16 bits != 0).
__device__ __forceinline__ uint32_t nonzero_mask(const uint4& q) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) m |= uint32_t{(w[i] & 0xffffu) != 0} << (2 * i) | uint32_t{(w[i] >> 16) != 0} << (2 * i + 1);
  return m;
}

// Writes this lane's non-zeros of one pass (`mask` from nonzero_mask) at their warp-prefix offset,
// ascending column order; returns the pass's total. The store loop runs once per non-zero, not
// once per column (NOTE: the per-column loop made the pack kernel issue-bound, 250 instructions
// per tile, ncu: 0.71 issued warps per scheduler cycle at 0.98 ms for M = 131072).
__device__ __forceinline__ uint32_t write_entries(const uint4& q, uint32_t mask, int c, uint32_t base, uint32_t* words,
                                                  int lane) {
  const uint32_t n = __popc(mask);
  uint32_t prefix = n;  // inclusive warp scan
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t o = __shfl_up_sync(0xffffffffu, prefix, d);
    if (lane >= d) prefix += o;
  }
  uint32_t k = base + prefix - n;
  const uint64_t lo = q.x | static_cast<uint64_t>(q.y) << 32, hi = q.z | static_cast<uint64_t>(q.w) << 32;
  while (mask) {
    const int i = __ffs(mask) - 1;
    mask &= mask - 1;
    const uint16_t v = static_cast<uint16_t>((i < 4 ? lo >> (16 * i) : hi >> (16 * (i - 4))) & 0xffffu);
    words[k++] = twell_entry(v, static_cast<uint32_t>(c + i));
  }
  return __shfl_sync(0xffffffffu, prefix, 31);
}

// Packs one (row, tile). `first` holds this lane's columns of the first pass, already loaded.
__device__ __forceinline__ uint32_t pack_tile(const uint16_t* dense, const TwellDeviceView& m, int64_t row,
                                              int64_t t, uint4 first, unsigned int* overflow, int lane) {
  const TwellLayout& l = m.layout;
  const int64_t tile_id = l.tile_id(row, t);
  const int32_t width = l.tile_width(t);
  const uint16_t* in = dense + row * l.cols + t * l.tile;
  uint32_t* words = m.slots + tile_id * l.slots();
  const uint32_t slots = static_cast<uint32_t>(l.slots());
  const int c_lane = lane * kColsPerLane;

  const uint32_t first_mask = nonzero_mask(first);
  uint32_t count = __reduce_add_sync(0xffffffffu, __popc(first_mask));
  for (int c0 = kColsPerPass; c0 < width; c0 += kColsPerPass)  // tiles wider than one pass
    count += __reduce_add_sync(0xffffffffu, __popc(nonzero_mask(load_cols(in, c0 + c_lane, width))));
  if (lane == 0) m.counts[tile_id] = count;

  if (!twell_is_spilled(l, count)) {
    if (count > 0) {
      uint32_t base = write_entries(first, first_mask, c_lane, 0, words, lane);
      for (int c0 = kColsPerPass; c0 < width; c0 += kColsPerPass) {
        const uint4 q = load_cols(in, c0 + c_lane, width);
        base += write_entries(q, nonzero_mask(q), c0 + c_lane, base, words, lane);
      }
    }
    for (uint32_t k = count + lane; k < slots; k += 32) words[k] = 0;
    return count;
  }
  // Spilled: claim a backup tile and copy the dense values (zero-padded past the width).
  uint32_t b = 0;
  if (lane == 0) b = atomicAdd(m.n_backup, 1u);
  b = __shfl_sync(0xffffffffu, b, 0);
  if (b >= m.backup_capacity) {  // cannot happen with the default capacity; never write out of bounds
    if (lane == 0) atomicExch(overflow, 1u);
    return count;
  }
  uint16_t* out = m.backup + static_cast<int64_t>(b) * l.tile;
  for (int c = c_lane; c < l.tile; c += kColsPerPass)
    *reinterpret_cast<uint4*>(out + c) = c == c_lane ? first : load_cols(in, c, width);
  if (lane == 0) m.backup_owner[b] = static_cast<uint32_t>(tile_id);
  for (uint32_t k = lane; k < slots; k += 32) words[k] = k == 0 ? b : 0u;
  return count;
}

// Grid-stride over rows, one warp per row; a row's tiles go kTilesInFlight at a time, their
// first loads issued together so that each warp keeps several 16-byte loads in flight. (Walking
// rows rather than flat tile ids avoids a 64-bit division per tile, measured at ~10% of the time.)
constexpr int kTilesInFlight = 4;

// NOTE: 4 blocks of 256 threads (64 registers) resident per SM; the first version ran at 64
// registers in 0.98 ms, a later one at 80 registers in ~1.2 ms (M = 131072, ncu).
__global__ __launch_bounds__(kThreads, 4) void twell_pack_kernel(const uint16_t* __restrict__ dense, TwellDeviceView m,
                                                             unsigned long long* __restrict__ nnz_total,
                                                             unsigned int* __restrict__ overflow, RowCounts rc) {
  const TwellLayout& l = m.layout;
  const int lane = threadIdx.x % 32;
  const int64_t n_tiles = l.n_tiles();
  const int64_t warp_global = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int64_t warp_stride = static_cast<int64_t>(gridDim.x) * kThreads / 32;
  unsigned long long my_nnz = 0;

  for (int64_t row = warp_global; row < l.rows; row += warp_stride) {
    const uint16_t* in = dense + row * l.cols;
    uint32_t row_nnz = 0;
    for (int64_t t0 = 0; t0 < n_tiles; t0 += kTilesInFlight) {
      uint4 v[kTilesInFlight];
#pragma unroll
      for (int i = 0; i < kTilesInFlight; ++i) {
        const int64_t t = t0 + i;
        v[i] = t < n_tiles ? load_cols(in + t * l.tile, lane * kColsPerLane, l.tile_width(t)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kTilesInFlight; ++i)
        if (t0 + i < n_tiles) row_nnz += pack_tile(dense, m, row, t0 + i, v[i], overflow, lane);
    }
    my_nnz += row_nnz;
    if (rc.row_nnz && lane == 0) {
      rc.row_nnz[row] = row_nnz;
      if (row_nnz > kHeavyRowEntries) rc.heavy_rows[atomicAdd(rc.heavy_count, 1u)] = static_cast<uint32_t>(row);
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
  for (int64_t v = threadIdx.x; v < cols / kColsPerLane; v += kSampleThreads) n += __popc(nonzero_mask(__ldg(in + v)));
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

__global__ void report_kernel(PackReport r) { make_report(r, threadIdx.x, blockDim.x); }

__global__ void zero_words_kernel(ZeroWords z) {
  allow_dependent_launch();  // the fused gate's loads wait for this kernel anyway
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int r = 0; r < z.n; ++r)
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < z.range[r].words; i += stride)
      z.range[r].ptr[i] = 0;
}

}  // namespace

void launch_zero_words(const ZeroWords& z, cudaStream_t stream) {
  TWELL_CHECK(z.n >= 0 && z.n <= ZeroWords::kMax, "zero_words: ", z.n, " ranges, at most ", ZeroWords::kMax);
  int64_t most = 0;
  for (int r = 0; r < z.n; ++r) {
    TWELL_CHECK(z.range[r].words >= 0 && (z.range[r].ptr || z.range[r].words == 0), "zero_words: range ", r,
                " is null or negative");
    most = std::max(most, z.range[r].words);
  }
  if (most == 0) return;
  const int64_t blocks = std::min<int64_t>((most + 255) / 256, 512);
  zero_words_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(z);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void launch_report(const PackReport& report, cudaStream_t stream) {
  if (!report.any()) return;
  report_kernel<<<1, 64, 0, stream>>>(report);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

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
                       unsigned int* overflow, const RowCounts& rows, int sm_count, cudaStream_t stream) {
  check_twell_pack(m.layout);
  const int64_t warps = m.layout.rows;  // one per row
  if (warps == 0) return;
  const int64_t blocks = std::min<int64_t>((warps * 32 + kThreads - 1) / kThreads, int64_t{sm_count} * 4);
  twell_pack_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(dense, m, nnz_total, overflow, rows);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
