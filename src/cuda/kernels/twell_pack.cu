// twell_pack: dense activation g [M, I] bf16 (device) -> TwELL hybrid (twell_format.h).
// One warp per (row, tile), grid-stride over all tiles: lanes load 8 columns each (16 B), count
// non-zeros, and either write the packed entries at their warp-prefix offsets (ascending column
// order, deterministic) or, when the tile holds more than `slots` values, claim a backup tile
// with one atomic and copy the dense values there. Non-zeros are summed per block and added to
// `nnz_total` once per block (a single hot address would serialise millions of atomics).
// Stand-in for the fused gate-GEMM epilogue; covered by tests/cuda/test_twell_ffn.cu.
#include "cuda/kernels.h"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColsPerLane = 8;  // one 16-byte load
constexpr int kColsPerPass = 32 * kColsPerLane;

__global__ __launch_bounds__(kThreads) void twell_pack_kernel(const uint16_t* __restrict__ dense, TwellDeviceView m,
                                                             unsigned long long* __restrict__ nnz_total,
                                                             unsigned int* __restrict__ overflow) {
  const TwellLayout& l = m.layout;
  const int lane = threadIdx.x % 32;
  const int64_t n_tiles = l.n_tiles();
  const int64_t total = l.count_size();
  const int64_t warp_global = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int64_t warp_stride = static_cast<int64_t>(gridDim.x) * kThreads / 32;
  const uint32_t slots = static_cast<uint32_t>(l.slots());
  unsigned long long my_nnz = 0;

  for (int64_t tile_id = warp_global; tile_id < total; tile_id += warp_stride) {
    const int64_t row = tile_id / n_tiles, t = tile_id % n_tiles;
    const int32_t width = l.tile_width(t);
    const uint16_t* in = dense + row * l.cols + t * l.tile;
    uint32_t* words = m.slots + tile_id * slots;

    // Pass 1: count (a tile wider than 256 columns takes several passes).
    uint32_t count = 0;
    for (int c0 = 0; c0 < width; c0 += kColsPerPass) {
      const int c = c0 + lane * kColsPerLane;
      uint32_t n = 0;
      if (c < width) {
        const uint4 v = *reinterpret_cast<const uint4*>(in + c);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) n += ((w[i] & 0xffffu) != 0) + ((w[i] >> 16) != 0);
      }
      count += __reduce_add_sync(0xffffffffu, n);
    }
    if (lane == 0) m.counts[tile_id] = count;
    my_nnz += lane == 0 ? count : 0;

    if (!twell_is_spilled(l, count)) {
      // Pass 2: write entries in ascending column order at warp-prefix offsets; zero the rest.
      uint32_t base = 0;
      for (int c0 = 0; c0 < width; c0 += kColsPerPass) {
        const int c = c0 + lane * kColsPerLane;
        uint16_t v[kColsPerLane] = {};
        if (c < width) {
          const uint4 q = *reinterpret_cast<const uint4*>(in + c);
          const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) v[2 * i] = w[i] & 0xffffu, v[2 * i + 1] = w[i] >> 16;
        }
        uint32_t n = 0;
#pragma unroll
        for (int i = 0; i < kColsPerLane; ++i) n += v[i] != 0;
        uint32_t prefix = n;  // inclusive warp scan
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const uint32_t o = __shfl_up_sync(0xffffffffu, prefix, d);
          if (lane >= d) prefix += o;
        }
        uint32_t k = base + prefix - n;
#pragma unroll
        for (int i = 0; i < kColsPerLane; ++i)
          if (v[i] != 0) words[k++] = twell_entry(v[i], static_cast<uint32_t>(c + i));
        base += __shfl_sync(0xffffffffu, prefix, 31);
      }
      for (uint32_t k = count + lane; k < slots; k += 32) words[k] = 0;
      continue;
    }

    // Spilled: claim a backup tile and copy the dense values (zero-padded past the width).
    uint32_t b = 0;
    if (lane == 0) b = atomicAdd(m.n_backup, 1u);
    b = __shfl_sync(0xffffffffu, b, 0);
    if (b >= m.backup_capacity) {  // cannot happen with the default capacity; never write out of bounds
      if (lane == 0) atomicExch(overflow, 1u);
      continue;
    }
    uint16_t* out = m.backup + static_cast<int64_t>(b) * l.tile;
    for (int c = lane * kColsPerLane; c < l.tile; c += kColsPerPass) {
      const uint4 v = c < width ? *reinterpret_cast<const uint4*>(in + c) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(out + c) = v;
    }
    if (lane == 0) m.backup_owner[b] = static_cast<uint32_t>(tile_id);
    for (uint32_t k = lane; k < slots; k += 32) words[k] = k == 0 ? b : 0u;
  }

  // One atomic per block for the non-zero total.
  __shared__ unsigned long long block_nnz[kThreads / 32];
  if (lane == 0) block_nnz[threadIdx.x / 32] = my_nnz;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long s = 0;
    for (int w = 0; w < kThreads / 32; ++w) s += block_nnz[w];
    if (s) atomicAdd(nnz_total, s);
  }
}

}  // namespace

void check_twell_pack(const TwellLayout& l) {
  l.check();
  TWELL_CHECK(l.tile % kColsPerLane == 0 && l.cols % kColsPerLane == 0, "GPU TwELL pack: tile width ", l.tile,
              " and I = ", l.cols, " must be multiples of ", kColsPerLane);
}

void launch_twell_pack(const uint16_t* dense, const TwellDeviceView& m, unsigned long long* nnz_total,
                       unsigned int* overflow, int sm_count, cudaStream_t stream) {
  check_twell_pack(m.layout);
  const int64_t warps = m.layout.count_size();
  if (warps == 0) return;
  const int64_t blocks = std::min<int64_t>((warps * 32 + kThreads - 1) / kThreads, int64_t{sm_count} * 8);
  twell_pack_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(dense, m, nnz_total, overflow);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
