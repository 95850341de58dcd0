// Packs weight rows to 12 bits a weight (the format: packed_rows.cuh), a warp a row: the set of
// the row's upper exponent values (a 128-bit mask, OR-reduced over the warp) decides whether it
// packs and makes its table, then each lane writes its 8-weight groups' low bytes and selector
// words. Rows that do not pack get the table kUnpackedRow and their bf16 row in the slot.
#include <algorithm>

#include "cuda/kernels.h"
#include "cuda/kernels/packed_rows.cuh"

namespace twell::cuda {
namespace {

// The index of upper exponent value e in a row whose values are the set bits of m[0..4) (128
// bits): how many values below e the row has.
__device__ __forceinline__ uint32_t table_index(const uint32_t (&m)[4], uint32_t e) {
  uint32_t below = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = 32u * i;
    below += e >= lo + 32 ? __popc(m[i]) : e > lo ? __popc(m[i] & ((1u << (e - lo)) - 1u)) : 0u;
  }
  return below;
}

__global__ void pack_rows_kernel(const uint16_t* __restrict__ w, int64_t I, int64_t H, uint8_t* __restrict__ rows,
                                 uint2* __restrict__ tables, uint32_t* __restrict__ n_unpacked) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t j = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32; j < I; j += warps) {
    const uint4* row = reinterpret_cast<const uint4*>(w + j * H);
    uint32_t m[4] = {0, 0, 0, 0};  // the upper exponent values present in the row
    for (int64_t g = lane; g < H / 8; g += 32) {
      const uint4 q = row[g];
      const uint32_t v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t e = (v[i / 2] >> (16 * (i % 2) + 8)) & 0x7fu;
#pragma unroll
        for (int k = 0; k < 4; ++k) m[k] |= e / 32 == static_cast<uint32_t>(k) ? 1u << (e % 32) : 0u;
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int d = 16; d >= 1; d /= 2) m[k] |= __shfl_xor_sync(0xffffffffu, m[k], d);
    const bool packs = __popc(m[0]) + __popc(m[1]) + __popc(m[2]) + __popc(m[3]) <= 8;
    if (lane == 0) {
      uint8_t t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int n = 0;
      for (uint32_t e = 0; e < 128; ++e)
        if (n < 8 && (m[e / 32] >> (e % 32) & 1u)) t[n++] = static_cast<uint8_t>(e);
      uint2 tw = make_uint2(kUnpackedRow, kUnpackedRow);
      if (packs) {
        tw.x = t[0] | t[1] << 8 | t[2] << 16 | uint32_t{t[3]} << 24;
        tw.y = t[4] | t[5] << 8 | t[6] << 16 | uint32_t{t[7]} << 24;
      } else {
        atomicAdd(n_unpacked, 1u);
      }
      tables[j] = tw;
    }
    uint8_t* out = rows + j * H * 2;
    if (!packs) {  // the bf16 row as it is
      for (int64_t g = lane; g < H / 8; g += 32) reinterpret_cast<uint4*>(out)[g] = row[g];
      continue;
    }
    for (int64_t g = lane; g < H / 8; g += 32) {  // 8 weights: block g / 8, group g % 8
      const uint4 q = row[g];
      const uint32_t v[4] = {q.x, q.y, q.z, q.w};
      uint32_t low[2] = {0, 0}, sel = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t b = (v[k / 2] >> (16 * (k % 2))) & 0xffffu;
        low[k / 4] |= (b & 0xffu) << (8 * (k % 4));
        sel |= table_index(m, (b >> 8) & 0x7fu) << (4 * k);
        sel |= (b >> 15) << (k < 4 ? 8 * k + 7 : 8 * (k - 4) + 3);
      }
      uint8_t* block = out + (g / 8) * kPackedBlockBytes;
      reinterpret_cast<uint2*>(block)[g % 8] = make_uint2(low[0], low[1]);
      reinterpret_cast<uint32_t*>(block + 64)[g % 8] = sel;
    }
  }
}

}  // namespace

int64_t packed_rows_bytes(int64_t I, int64_t H) { return I * H * 2 + I * 8; }

void launch_pack_rows(const uint16_t* w, int64_t I, int64_t H, uint8_t* packed, uint32_t* n_unpacked,
                      cudaStream_t stream) {
  TWELL_CHECK(H % 64 == 0 && H > 0 && I > 0, "pack_rows: H = ", H, " must be a positive multiple of 64, I = ", I,
              " positive");
  const int64_t blocks = std::min<int64_t>((I + 7) / 8, 4096);
  pack_rows_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      w, I, H, packed, reinterpret_cast<uint2*>(packed + I * H * 2), n_unpacked);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
