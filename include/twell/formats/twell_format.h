// TwELL: tile-wise ELLPACK for a sparse activation matrix g [rows, cols] (rows = tokens M,
// cols = FFN width I), with a dense per-tile backup so that it holds any density exactly.
// docs/format.md has the full specification and a worked example.
//
//   cols are cut into n_tiles tiles of `tile` columns (the last one may be partial).
//   every (row, tile) owns `slots = tile / compression` 32-bit words:
//     count[row, tile]            true number of non-zeros of that tile (u32)
//     if count <= slots  (packed):  words 0..count-1 = (bf16 bits << 16) | local column,
//                                   local columns strictly ascending; words count.. are 0
//     if count >  slots  (spilled): word 0 = index b of a backup tile; other words are 0;
//                                   backup[b, 0..tile) holds the tile's dense bf16 values and
//                                   backup_owner[b] = row * n_tiles + tile.
//   A value is "non-zero" when its bf16 bit pattern is not 0x0000, so -0.0 and NaN are kept:
//   pack -> unpack is bit-exact for any input.
//
// Capacity is the full `slots` (the count lives in its own array, not in word 0), so at
// tile 256 / compression 8 a tile holds 32 values, one 128-byte line.  Local column indices are
// tile-relative (< 65536), so any I works. Plain TwELL is this format with no spilled tile;
// packing data that would spill into plain TwELL is an error, never a silent drop.
//
// Everything here compiles for host and device; the CPU reference and the CUDA kernels index
// the format through these functions only.
#pragma once

#include <cstdint>
#include <vector>

#include "twell/bf16.h"
#include "twell/tensor.h"

namespace twell {

// The TwELL tile width twell's FFNs use when none is asked for (FfnOptions::tile = 0): 176 where
// `compression` divides 176, outside training, since the fused gate then runs 128 × 176 GEMM tiles,
// the fastest measured, at any FFN width: I = 5632 = 32 × 176, the FFN 0.60× against 0.616× at
// T = 256 (docs/perf.md, FFN items 42-43); and with a partial last tile, 0.25%, M = 131072 on an H100,
// I = 4992 5.63 against 6.55 ms, I = 8192 9.40 against 10.19 (sixty-eighth session). Otherwise 256,
// the reference's (and training's: its backward was tuned and measured at 256).
int32_t default_ffn_tile(int32_t compression, bool training);

struct TwellLayout {
  int64_t rows = 0;         // M
  int64_t cols = 0;         // I
  int32_t tile = 256;       // T
  int32_t compression = 8;  // C

  TWELL_HD int32_t slots() const { return tile / compression; }
  TWELL_HD int64_t n_tiles() const { return (cols + tile - 1) / tile; }
  TWELL_HD int32_t tile_width(int64_t t) const {
    int64_t rest = cols - t * tile;
    return static_cast<int32_t>(rest < tile ? rest : tile);
  }
  TWELL_HD int64_t tile_id(int64_t row, int64_t t) const { return row * n_tiles() + t; }
  TWELL_HD int64_t count_size() const { return rows * n_tiles(); }
  TWELL_HD int64_t slot_size() const { return rows * n_tiles() * slots(); }
  TWELL_HD int64_t slot_offset(int64_t row, int64_t t) const { return tile_id(row, t) * slots(); }

  // Throws twell::Error describing the first unsupported parameter.
  void check() const;
};

// Entry of a packed tile: value in the high half, tile-local column in the low half.
TWELL_HD uint32_t twell_entry(uint16_t value_bits, uint32_t local_col) {
  return (static_cast<uint32_t>(value_bits) << 16) | (local_col & 0xffffu);
}
TWELL_HD uint16_t twell_entry_value_bits(uint32_t e) { return static_cast<uint16_t>(e >> 16); }
TWELL_HD float twell_entry_value(uint32_t e) { return bits_float(e & 0xffff0000u); }
TWELL_HD uint32_t twell_entry_col(uint32_t e) { return e & 0xffffu; }
TWELL_HD bool twell_is_spilled(const TwellLayout& l, uint32_t count) {
  return count > static_cast<uint32_t>(l.slots());
}

// Host-side owning TwELL matrix (the hybrid: packed tiles + dense backup tiles).
struct TwellMatrix {
  TwellLayout layout;
  std::vector<uint32_t> counts;        // [rows * n_tiles]
  std::vector<uint32_t> slots;         // [rows * n_tiles * slots]
  std::vector<uint16_t> backup;        // [n_backup * tile] bf16 bits
  std::vector<uint32_t> backup_owner;  // [n_backup] tile id = row * n_tiles + tile

  int64_t n_backup() const { return static_cast<int64_t>(backup_owner.size()); }
  int64_t nnz() const;

  // Calls f(col, value_bits) for every non-zero of `row`, in ascending column order.
  template <class F>
  void for_each_in_row(int64_t row, F&& f) const;
};

enum class Spill { forbid, allow };

// Packs a dense bf16 [rows, cols] matrix. With Spill::forbid (plain TwELL) a tile over capacity
// throws an Error naming the row, tile and count; with Spill::allow (hybrid) it goes to backup.
TwellMatrix twell_pack(const TensorView& dense, TwellLayout layout, Spill spill = Spill::allow);
// Writes the dense bf16 [rows, cols] matrix the format holds (every element is written), after
// twell_validate(m): a broken matrix throws and writes nothing.
void twell_unpack(const TwellMatrix& m, const TensorView& dense);
// Checks every invariant of the format; throws an Error naming the first violation.
void twell_validate(const TwellMatrix& m);

struct TwellOccupancy {
  int64_t nnz = 0;
  int64_t spilled_tiles = 0;
  int64_t max_tile_count = 0;
  int64_t max_row_count = 0;
  int64_t densest_row = -1;  // a row holding max_row_count non-zeros
  int64_t empty_rows = 0;
  std::vector<int64_t> spilled_rows;  // the first rows (at most kSpilledRowsKept) with a spilled tile
  static constexpr size_t kSpilledRowsKept = 8;
};
TwellOccupancy twell_occupancy(const TwellMatrix& m);

// ---- implementation of the row iterator -----------------------------------------------------
template <class F>
void TwellMatrix::for_each_in_row(int64_t row, F&& f) const {
  const int64_t nt = layout.n_tiles();
  for (int64_t t = 0; t < nt; ++t) {
    const uint32_t count = counts[layout.tile_id(row, t)];
    const uint32_t* words = slots.data() + layout.slot_offset(row, t);
    const int64_t base = t * layout.tile;
    if (!twell_is_spilled(layout, count)) {
      for (uint32_t k = 0; k < count; ++k) f(base + twell_entry_col(words[k]), twell_entry_value_bits(words[k]));
    } else {
      const uint16_t* dense = backup.data() + static_cast<int64_t>(words[0]) * layout.tile;
      const int32_t width = layout.tile_width(t);
      for (int32_t c = 0; c < width; ++c)
        if (dense[c] != 0) f(base + c, dense[c]);
    }
  }
}

}  // namespace twell
