// Weight rows packed losslessly to 12 bits a weight (docs/perf.md, FFN items 24-26, 33): the down
// pass moves its weight rows at the L2's bandwidth, so a 3 KB row instead of a 4 KB one is a
// quarter fewer bytes an entry. A bf16 weight is sign (1) | exponent (8) | mantissa (7); its low
// byte (the lowest exponent bit and the mantissa) is kept as it is; of its high byte, the sign is
// kept and the 7 upper exponent bits become a 3-bit index into the row's table of at most 8
// distinct values. A row with more than 8 distinct upper exponent values (weights spread over
// more than ~16 octaves besides zeros) is not packed: its table is kUnpackedRow and the bf16 row
// is read instead.
//
// Row j of a prepared matrix [I, H] (H a multiple of 64) has a slot of 2H bytes at j · 2H. A
// packed row fills 3/4 of it, 64-column block by block (the unit the passes stage): block b at
// 96b holds its 64 low bytes, then 8 selector words, word g for columns 64b + 8g .. + 8. In the
// selector word of those 8 weights, bits 4k .. 4k + 2 hold weight k's table index, and the free
// bits 4k + 3 hold the signs where the decode wants them: weight i < 4's at bit 8i + 7, weight
// 4 + i's at bit 8i + 3. A row that does not pack is its bf16 row (block b at 128b). The tables
// follow the I slots: 8 bytes a row, entry i in byte i (the upper exponent bits, below 128).
//
// The decode of 8 weights is 12 instructions: two byte permutes look the 4 + 4 upper exponent
// bits up in the table (a permute picks bytes of its two 32-bit operands by 3-bit selectors: the
// table's 8 bytes are its operands, the indices its selectors), two logic operations put the
// signs in, and four permutes interleave high and low bytes into bf16 pairs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace twell::cuda {

constexpr uint32_t kUnpackedRow = 0xffffffffu;  // a table's first word: the row is bf16

constexpr int kPackedBlockBytes = 96;  // a packed 64-column block: 64 low bytes, 8 selector words

// The 8 bf16 weights (as a uint4, lower index in the low half of each word) from their 8 low
// bytes, their selector word and the row's table (t0: entries 0-3, t1: entries 4-7).
__device__ __forceinline__ uint4 unpack_packed8(uint2 lo, uint32_t sel, uint32_t t0, uint32_t t1) {
  // __byte_perm(x, y, s): byte n of the result is byte (s >> 4n) & 7 of y:x (x the low word); the
  // selector's bit 3s are cleared first (in the hardware's default mode they would sign-fill).
  const uint32_t h03 = __byte_perm(t0, t1, sel & 0x7777u) | (sel & 0x80808080u);
  const uint32_t h47 = __byte_perm(t0, t1, (sel >> 16) & 0x7777u) | ((sel << 4) & 0x80808080u);
  return make_uint4(__byte_perm(lo.x, h03, 0x5140u), __byte_perm(lo.x, h03, 0x7362u), __byte_perm(lo.y, h47, 0x5140u),
                    __byte_perm(lo.y, h47, 0x7362u));
}

}  // namespace twell::cuda
