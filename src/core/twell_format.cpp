// TwELL pack / unpack / validate on the host (the format is specified in twell_format.h).
#include "twell/formats/twell_format.h"

#include <algorithm>
#include <limits>

namespace twell {

int32_t default_ffn_tile(int32_t compression, bool training) {
  return !training && compression >= 1 && 176 % compression == 0 ? 176 : 256;
}

void TwellLayout::check() const {
  TWELL_CHECK(rows >= 0, "TwELL: rows must be >= 0, got ", rows);
  TWELL_CHECK(cols >= 1, "TwELL: cols must be >= 1, got ", cols);
  TWELL_CHECK(compression >= 1, "TwELL: compression factor must be >= 1, got ", compression);
  TWELL_CHECK(tile >= 1 && tile <= 65536, "TwELL: tile width must be in [1, 65536], got ", tile);
  TWELL_CHECK(tile % compression == 0, "TwELL: tile width ", tile,
              " is not a multiple of the compression factor ", compression);
  // n_tiles() computes cols + tile - 1 (cols + tile first): defined for every layout that passes (with
  // no rows the tile ids' bound below holds at any cols).
  TWELL_CHECK(cols <= std::numeric_limits<int64_t>::max() - tile, "TwELL: cols ", cols, " too large");
  const int64_t tiles = n_tiles();
  TWELL_CHECK(rows <= ((int64_t{1} << 32) - 1) / tiles, "TwELL: ", rows, " rows x ", tiles,
              " tiles exceed 2^32 tile ids");  // rows · tiles < 2^32, without the product's overflow
}

int64_t TwellMatrix::nnz() const {
  int64_t n = 0;
  for (uint32_t c : counts) n += c;
  return n;
}

TwellMatrix twell_pack(const TensorView& dense, TwellLayout layout, Spill spill) {
  check_device(dense, Device::cpu, "twell_pack: dense");
  check_dtype(dense, DType::bf16, "twell_pack: dense");
  check_contiguous(dense, "twell_pack: dense");
  check_shape(dense, {layout.rows, layout.cols}, "twell_pack: dense");
  layout.check();

  TwellMatrix m;
  m.layout = layout;
  m.counts.assign(static_cast<size_t>(layout.count_size()), 0);
  m.slots.assign(static_cast<size_t>(layout.slot_size()), 0);
  const auto* src = static_cast<const uint16_t*>(dense.data);
  const int64_t nt = layout.n_tiles();
  for (int64_t r = 0; r < layout.rows; ++r) {
    for (int64_t t = 0; t < nt; ++t) {
      const uint16_t* in = src + r * layout.cols + t * layout.tile;
      const int32_t width = layout.tile_width(t);
      uint32_t count = 0;
      for (int32_t c = 0; c < width; ++c) count += in[c] != 0;
      m.counts[layout.tile_id(r, t)] = count;
      uint32_t* words = m.slots.data() + layout.slot_offset(r, t);
      if (!twell_is_spilled(layout, count)) {
        uint32_t k = 0;
        for (int32_t c = 0; c < width; ++c)
          if (in[c] != 0) words[k++] = twell_entry(in[c], static_cast<uint32_t>(c));
        continue;
      }
      TWELL_CHECK(spill == Spill::allow, "TwELL: row ", r, ", tile ", t, " holds ", count,
                  " non-zeros, more than its capacity of ", layout.slots(),
                  "; pack it as the hybrid format (Spill::allow) or use a smaller compression");
      words[0] = static_cast<uint32_t>(m.n_backup());
      m.backup_owner.push_back(static_cast<uint32_t>(layout.tile_id(r, t)));
      m.backup.insert(m.backup.end(), in, in + width);
      m.backup.resize(m.backup.size() + (layout.tile - width), 0);  // pad a partial tile
    }
  }
  return m;
}

void twell_unpack(const TwellMatrix& m, const TensorView& dense) {
  twell_validate(m);  // a column or backup index out of range would write outside its tile
  const TwellLayout& l = m.layout;
  check_device(dense, Device::cpu, "twell_unpack: dense");
  check_dtype(dense, DType::bf16, "twell_unpack: dense");
  check_contiguous(dense, "twell_unpack: dense");
  check_shape(dense, {l.rows, l.cols}, "twell_unpack: dense");
  auto* out = static_cast<uint16_t*>(dense.data);
  std::fill(out, out + l.rows * l.cols, uint16_t{0});
  for (int64_t r = 0; r < l.rows; ++r)
    m.for_each_in_row(r, [&](int64_t col, uint16_t v) { out[r * l.cols + col] = v; });
}

void twell_validate(const TwellMatrix& m) {
  const TwellLayout& l = m.layout;
  l.check();
  const int64_t nt = l.n_tiles();
  TWELL_CHECK(static_cast<int64_t>(m.counts.size()) == l.count_size(), "TwELL: counts hold ",
              m.counts.size(), " entries, expected ", l.count_size());
  TWELL_CHECK(static_cast<int64_t>(m.slots.size()) == l.slot_size(), "TwELL: slots hold ",
              m.slots.size(), " words, expected ", l.slot_size());
  TWELL_CHECK(static_cast<int64_t>(m.backup.size()) == m.n_backup() * l.tile, "TwELL: backup holds ",
              m.backup.size(), " values, expected ", m.n_backup(), " tiles of ", l.tile);
  std::vector<uint8_t> backup_used(static_cast<size_t>(m.n_backup()), 0);
  for (int64_t r = 0; r < l.rows; ++r) {
    for (int64_t t = 0; t < nt; ++t) {
      const uint32_t count = m.counts[l.tile_id(r, t)];
      const uint32_t* words = m.slots.data() + l.slot_offset(r, t);
      const int32_t width = l.tile_width(t);
      TWELL_CHECK(count <= static_cast<uint32_t>(width), "TwELL: row ", r, ", tile ", t, ": count ",
                  count, " exceeds the tile width ", width);
      if (!twell_is_spilled(l, count)) {
        for (uint32_t k = 0; k < count; ++k) {
          const uint32_t col = twell_entry_col(words[k]);
          TWELL_CHECK(col < static_cast<uint32_t>(width), "TwELL: row ", r, ", tile ", t, ", slot ", k,
                      ": column ", col, " outside the tile width ", width);
          TWELL_CHECK(k == 0 || col > twell_entry_col(words[k - 1]), "TwELL: row ", r, ", tile ", t,
                      ", slot ", k, ": column ", col, " not above the previous ",
                      twell_entry_col(words[k - 1]));
          TWELL_CHECK(twell_entry_value_bits(words[k]) != 0, "TwELL: row ", r, ", tile ", t, ", slot ",
                      k, ": stored value is zero");
        }
        for (int32_t k = static_cast<int32_t>(count); k < l.slots(); ++k)
          TWELL_CHECK(words[k] == 0, "TwELL: row ", r, ", tile ", t, ", slot ", k,
                      ": unused slot is not zero");
        continue;
      }
      const uint32_t b = words[0];
      TWELL_CHECK(b < static_cast<uint32_t>(m.n_backup()), "TwELL: row ", r, ", tile ", t,
                  ": backup index ", b, " out of range (", m.n_backup(), " backup tiles)");
      TWELL_CHECK(!backup_used[b], "TwELL: backup tile ", b, " referenced twice");
      backup_used[b] = 1;
      TWELL_CHECK(m.backup_owner[b] == l.tile_id(r, t), "TwELL: backup tile ", b, " is owned by tile id ",
                  m.backup_owner[b], ", referenced by row ", r, ", tile ", t);
      for (int32_t k = 1; k < l.slots(); ++k)
        TWELL_CHECK(words[k] == 0, "TwELL: row ", r, ", tile ", t, ", slot ", k,
                    ": spilled tile has a non-zero slot");
      const uint16_t* dense = m.backup.data() + static_cast<int64_t>(b) * l.tile;
      uint32_t nz = 0;
      for (int32_t c = 0; c < width; ++c) nz += dense[c] != 0;
      for (int32_t c = width; c < l.tile; ++c)
        TWELL_CHECK(dense[c] == 0, "TwELL: backup tile ", b, ": padding column ", c, " is not zero");
      TWELL_CHECK(nz == count, "TwELL: row ", r, ", tile ", t, ": count ", count, " but backup tile ", b,
                  " holds ", nz, " non-zeros");
    }
  }
  for (int64_t b = 0; b < m.n_backup(); ++b)
    TWELL_CHECK(backup_used[b], "TwELL: backup tile ", b, " is not referenced by any tile");
}

TwellOccupancy twell_occupancy(const TwellMatrix& m) {
  TwellOccupancy o;
  const TwellLayout& l = m.layout;
  for (int64_t r = 0; r < l.rows; ++r) {
    int64_t row = 0, spilled = 0;
    for (int64_t t = 0; t < l.n_tiles(); ++t) {
      const uint32_t c = m.counts[l.tile_id(r, t)];
      row += c;
      o.max_tile_count = std::max<int64_t>(o.max_tile_count, c);
      spilled += twell_is_spilled(l, c);
    }
    o.spilled_tiles += spilled;
    if (spilled && o.spilled_rows.size() < TwellOccupancy::kSpilledRowsKept) o.spilled_rows.push_back(r);
    o.nnz += row;
    if (row > o.max_row_count || o.densest_row < 0) o.max_row_count = row, o.densest_row = r;
    o.empty_rows += row == 0;
  }
  return o;
}

}  // namespace twell
