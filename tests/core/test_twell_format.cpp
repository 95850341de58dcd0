// TwELL format: pack -> unpack is bit-exact at every density (tiles over capacity included),
// entry order is ascending, plain TwELL refuses to drop values, validate() catches corruption.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/compare.h"
#include "common/random.h"
#include "core/io_test_util.h"
#include "twell/formats/twell_format.h"

namespace twell {
namespace {

struct RoundTripCase {
  double density;
  bool skewed;
  int64_t rows, cols;
  int32_t tile, compression;
};

std::string case_name(const testing::TestParamInfo<RoundTripCase>& info) {
  const auto& c = info.param;
  return str(c.skewed ? "skewed" : "uniform", "_d", static_cast<int>(std::lround(c.density * 1000)), "permille_",
             c.rows, "x", c.cols, "_T", c.tile, "C", c.compression);
}

// gtest prints a case (and CMake 3.25's test discovery keeps it in the CTest name) as this, not as its bytes.
void PrintTo(const RoundTripCase& c, std::ostream* os) {
  *os << case_name(testing::TestParamInfo<RoundTripCase>(c, 0));
}

class TwellRoundTrip : public testing::TestWithParam<RoundTripCase> {};

TEST_P(TwellRoundTrip, PackUnpackIsBitExactAndValid) {
  const auto& c = GetParam();
  Tensor dense = test::random_sparse_bf16(c.rows, c.cols, c.density, c.skewed, 42 + c.cols);
  TwellLayout layout{c.rows, c.cols, c.tile, c.compression};
  TwellMatrix m = twell_pack(dense, layout, Spill::allow);
  ASSERT_NO_THROW(twell_validate(m));

  Tensor back = Tensor::of<bf16>({c.rows, c.cols});
  for (int64_t i = 0; i < back.numel(); ++i) back.ptr<bf16>()[i] = bf16::from_bits(0x7fc1);  // poison
  twell_unpack(m, back);
  EXPECT_TRUE(test::bit_equal(back, dense));

  int64_t nnz = 0;
  for (int64_t i = 0; i < dense.numel(); ++i) nnz += dense.ptr<bf16>()[i].bits != 0;
  EXPECT_EQ(m.nnz(), nnz);
  const TwellOccupancy occ = twell_occupancy(m);
  EXPECT_EQ(occ.nnz, nnz);
  EXPECT_EQ(occ.spilled_tiles, m.n_backup());
  // The first rows with a spilled tile (the benchmark checks them against float64), in order.
  std::vector<int64_t> spilled_rows;
  for (int64_t b = 0; b < m.n_backup() && spilled_rows.size() < TwellOccupancy::kSpilledRowsKept; ++b) {
    const int64_t row = m.backup_owner[b] / layout.n_tiles();
    if (spilled_rows.empty() || spilled_rows.back() != row) spilled_rows.push_back(row);
  }
  EXPECT_EQ(occ.spilled_rows, spilled_rows);
}

std::vector<RoundTripCase> round_trip_cases() {
  std::vector<RoundTripCase> cases;
  for (double d : {0.0, 0.005, 0.02, 0.12, 0.13, 0.5, 1.0})
    for (bool skewed : {false, true}) {
      cases.push_back({d, skewed, 64, 5632, 256, 8});   // the paper's shape, C = 8: capacity 32
      cases.push_back({d, skewed, 33, 1000, 256, 4});   // partial last tile, capacity 64
      cases.push_back({d, skewed, 1, 300, 64, 8});      // M = 1, tiny tiles (capacity 8)
    }
  cases.push_back({0.001, false, 3, 70000, 256, 8});  // I beyond 65535: tile-local indices
  cases.push_back({0.05, true, 5, 70000, 65536, 8});  // largest tile width
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Densities, TwellRoundTrip, testing::ValuesIn(round_trip_cases()), case_name);

TEST(TwellFormat, OverCapacityTileSpillsAndKeepsEveryValue) {
  // One row, one 256-wide tile, 40 non-zeros > capacity 32 at C = 8.
  Tensor dense = Tensor::of<bf16>({1, 256});
  for (int c = 0; c < 40; ++c) dense.ptr<bf16>()[c * 6] = bf16(float(c + 1));
  TwellMatrix m = twell_pack(dense, {1, 256, 256, 8}, Spill::allow);
  EXPECT_EQ(m.counts[0], 40u);
  EXPECT_EQ(m.n_backup(), 1);
  EXPECT_EQ(m.slots[0], 0u);  // backup index 0
  Tensor back = Tensor::of<bf16>({1, 256});
  twell_unpack(m, back);
  EXPECT_TRUE(test::bit_equal(back, dense));
}

TEST(TwellFormat, PlainTwellRefusesToDropValues) {
  Tensor dense = Tensor::of<bf16>({2, 512});
  for (int c = 0; c < 33; ++c) dense.ptr<bf16>()[512 + 256 + c] = bf16(1.f);
  try {
    twell_pack(dense, {2, 512, 256, 8}, Spill::forbid);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1, tile 1 holds 33 non-zeros"), std::string::npos) << e.what();
  }
}

TEST(TwellFormat, ExactlyAtCapacityStaysPacked) {
  Tensor dense = Tensor::of<bf16>({1, 256});
  for (int c = 0; c < 32; ++c) dense.ptr<bf16>()[255 - c] = bf16(-float(c + 1));
  TwellMatrix m = twell_pack(dense, {1, 256, 256, 8}, Spill::forbid);
  EXPECT_EQ(m.n_backup(), 0);
  for (int k = 1; k < 32; ++k) EXPECT_LT(twell_entry_col(m.slots[k - 1]), twell_entry_col(m.slots[k]));
}

TEST(TwellFormat, NegativeZeroAndNanAreKept) {
  Tensor dense = Tensor::of<bf16>({1, 8});
  dense.ptr<bf16>()[1] = bf16::from_bits(0x8000);  // -0.0
  dense.ptr<bf16>()[6] = bf16::from_bits(0x7fc0);  // NaN
  TwellMatrix m = twell_pack(dense, {1, 8, 8, 2}, Spill::forbid);
  EXPECT_EQ(m.nnz(), 2);
  Tensor back = Tensor::of<bf16>({1, 8});
  twell_unpack(m, back);
  EXPECT_TRUE(test::bit_equal(back, dense));
}

TEST(TwellFormat, EntryEncoding) {
  const uint32_t e = twell_entry(bf16(1.5f).bits, 65535);
  EXPECT_EQ(twell_entry_col(e), 65535u);
  EXPECT_EQ(twell_entry_value(e), 1.5f);
  EXPECT_EQ(TwellLayout({10, 5632, 256, 8}).n_tiles(), 22);
  EXPECT_EQ(TwellLayout({10, 5633, 256, 8}).n_tiles(), 23);
  EXPECT_EQ(TwellLayout({10, 5633, 256, 8}).tile_width(22), 1);
  EXPECT_EQ(TwellLayout({10, 5632, 256, 8}).slots(), 32);
}

// The FFNs' default tile: 176 (the fused gate's 128 × 176 GEMM tiles) where the compression divides
// it, outside training; else the reference's 256.
TEST(TwellFormat, DefaultFfnTile) {
  EXPECT_EQ(default_ffn_tile(8, false), 176);
  EXPECT_EQ(default_ffn_tile(11, false), 176);
  EXPECT_EQ(default_ffn_tile(8, true), 256);   // training
  EXPECT_EQ(default_ffn_tile(32, false), 256);  // 32 does not divide 176
}

TEST(TwellFormat, RejectsBadLayoutsAndInputs) {
  Tensor dense = Tensor::of<bf16>({4, 100});
  EXPECT_THROW(twell_pack(dense, {4, 100, 100, 8}), Error);      // tile not a multiple of C
  EXPECT_THROW(twell_pack(dense, {4, 100, 131072, 8}), Error);   // tile too wide for 16-bit columns
  EXPECT_THROW(twell_pack(dense, {4, 101, 256, 8}), Error);      // shape mismatch
  Tensor f32 = Tensor::of<float>({4, 100});
  EXPECT_THROW(twell_pack(f32, {4, 100, 256, 8}), Error);        // dtype
  // A width whose tile count n_tiles() would compute past int64 (no rows: no tile id to bound it).
  test::expect_error([] { TwellLayout{0, std::numeric_limits<int64_t>::max(), 256, 8}.check(); }, {"cols", "too large"});
  TwellLayout{0, std::numeric_limits<int64_t>::max() - 256, 256, 8}.check();
}

// Corrupting any part of a valid matrix is caught by validate().
class TwellCorruption : public testing::Test {
 protected:
  void SetUp() override {
    Tensor dense = test::random_sparse_bf16(8, 600, 0.1, true, 7);
    // A guaranteed spilled tile in row 2.
    for (int c = 0; c < 100; ++c) dense.ptr<bf16>()[2 * 600 + c] = bf16(float(c + 1));
    m = twell_pack(dense, {8, 600, 256, 8}, Spill::allow);
    twell_validate(m);
    ASSERT_GE(m.n_backup(), 1);
  }
  void expect_invalid(const char* what) {
    try {
      twell_validate(m);
      ADD_FAILURE() << "validate() accepted: " << what;
    } catch (const Error& e) {
      SUCCEED() << e.what();
    }
  }
  // First packed tile with at least two entries.
  size_t packed_tile() const {
    for (size_t i = 0; i < m.counts.size(); ++i)
      if (m.counts[i] >= 2 && m.counts[i] <= 32) return i;
    return 0;
  }
  TwellMatrix m;
};

TEST_F(TwellCorruption, CountAboveTileWidth) { m.counts[packed_tile()] = 257; expect_invalid("count"); }
TEST_F(TwellCorruption, CountOffByOne) { m.counts[packed_tile()] += 1; expect_invalid("count+1"); }
TEST_F(TwellCorruption, ColumnOutOfOrder) {
  uint32_t* w = &m.slots[packed_tile() * 32];
  std::swap(w[0], w[1]);
  expect_invalid("order");
}
TEST_F(TwellCorruption, ColumnBeyondPartialTile) {
  // Last tile of row 0 is 600 - 512 = 88 wide.
  const size_t tile = 2;
  m.counts[tile] = 1;
  std::fill(&m.slots[tile * 32], &m.slots[tile * 32] + 32, 0u);
  m.slots[tile * 32] = twell_entry(bf16(1.f).bits, 100);
  expect_invalid("column beyond width");
}
TEST_F(TwellCorruption, ZeroValueInSlot) {
  uint32_t* w = &m.slots[packed_tile() * 32];
  w[0] &= 0xffffu;
  expect_invalid("zero value");
}
TEST_F(TwellCorruption, GarbageInUnusedSlot) { m.slots[packed_tile() * 32 + 31] = 0xdeadbeef; expect_invalid("unused slot"); }
TEST_F(TwellCorruption, BackupIndexOutOfRange) {
  m.slots[m.backup_owner[0] * 32] = static_cast<uint32_t>(m.n_backup());
  expect_invalid("backup index");
}
TEST_F(TwellCorruption, BackupOwnerMismatch) { m.backup_owner[0] += 1; expect_invalid("owner"); }
TEST_F(TwellCorruption, BackupValuesDisagreeWithCount) {
  uint16_t* b = &m.backup[0];
  for (int c = 0; c < 256; ++c)
    if (b[c] != 0) { b[c] = 0; break; }
  expect_invalid("backup nnz");
}
TEST_F(TwellCorruption, TruncatedArrays) { m.slots.pop_back(); expect_invalid("slots size"); }

// Unpacking a broken matrix throws before it writes: a column past the tile width would land in
// the next tile (or past the buffer in the last one).
TEST_F(TwellCorruption, UnpackRefusesABrokenMatrixAndWritesNothing) {
  const size_t tile = packed_tile();
  m.slots[tile * 32 + m.counts[tile] - 1] = twell_entry(bf16(1.f).bits, 300);
  Tensor dense = Tensor::of<bf16>({8, 600});
  std::fill(dense.ptr<bf16>(), dense.ptr<bf16>() + 8 * 600, bf16(7.f));
  EXPECT_THROW(twell_unpack(m, dense), Error);
  for (int64_t i = 0; i < 8 * 600; ++i) ASSERT_EQ(float(dense.ptr<bf16>()[i]), 7.f) << i;
}

}  // namespace
}  // namespace twell
