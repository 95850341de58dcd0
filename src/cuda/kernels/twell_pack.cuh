// Warp-level TwELL packing of one (row, tile), shared by the pack kernel (twell_pack.cu) and the
// fused up+pack kernel (twell_ffn_sparse.cu). A warp loads the tile 8 columns a lane (16 B),
// counts its non-zeros, and either writes the packed entries at warp-prefix offsets (ascending
// column order, deterministic) or claims a backup tile with one atomic and copies the values.
#pragma once

#include "cuda/kernels.h"

namespace twell::cuda::pack {

constexpr int kColsPerLane = 8;  // one 16-byte load
constexpr int kColsPerPass = 32 * kColsPerLane;

// Loads this lane's 8 columns [c, c + 8) of a tile (zeros past its width).
__device__ __forceinline__ uint4 load_cols(const uint16_t* in, int c, int width) {
  return c < width ? __ldcs(reinterpret_cast<const uint4*>(in + c)) : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ uint32_t nonzeros(const uint4& q) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  uint32_t n = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) n += ((w[i] & 0xffffu) != 0) + ((w[i] >> 16) != 0);
  return n;
}

// Writes this lane's non-zeros of one pass at their warp-prefix offset (ascending column order);
// returns the pass's total.
__device__ __forceinline__ uint32_t write_entries(const uint4& q, int c, uint32_t base, uint32_t* words, int lane) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  const uint32_t n = nonzeros(q);
  uint32_t prefix = n;  // inclusive warp scan
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t o = __shfl_up_sync(0xffffffffu, prefix, d);
    if (lane >= d) prefix += o;
  }
  uint32_t k = base + prefix - n;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint16_t v = i % 2 ? static_cast<uint16_t>(w[i / 2] >> 16) : static_cast<uint16_t>(w[i / 2] & 0xffffu);
    if (v != 0) words[k++] = twell_entry(v, static_cast<uint32_t>(c + i));
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

  uint32_t count = __reduce_add_sync(0xffffffffu, nonzeros(first));
  for (int c0 = kColsPerPass; c0 < width; c0 += kColsPerPass)  // tiles wider than one pass
    count += __reduce_add_sync(0xffffffffu, nonzeros(load_cols(in, c0 + c_lane, width)));
  if (lane == 0) m.counts[tile_id] = count;

  if (!twell_is_spilled(l, count)) {
    uint32_t base = write_entries(first, c_lane, 0, words, lane);
    for (int c0 = kColsPerPass; c0 < width; c0 += kColsPerPass)
      base += write_entries(load_cols(in, c0 + c_lane, width), c0 + c_lane, base, words, lane);
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

}  // namespace twell::cuda::pack
