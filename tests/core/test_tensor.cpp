// Tensor basics a library user relies on: sizes that cannot be allocated are refused by name, and
// a default or moved-from tensor is empty instead of one phantom element or a view of memory it no
// longer owns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "core/io_test_util.h"
#include "twell/tensor.h"

namespace twell {
namespace {

using test::expect_error;

TEST(BytesStr, DecimalUnitsForPeople) {
  EXPECT_EQ(bytes_str(0), "0 bytes");
  EXPECT_EQ(bytes_str(1), "1 byte");
  EXPECT_EQ(bytes_str(999), "999 bytes");
  EXPECT_EQ(bytes_str(1000), "1.0 KB");
  EXPECT_EQ(bytes_str(99949), "99.9 KB");
  EXPECT_EQ(bytes_str(123456), "123 KB");
  EXPECT_EQ(bytes_str(999499), "999 KB");
  EXPECT_EQ(bytes_str(999500), "1.0 MB");  // not "1000 KB"
  EXPECT_EQ(bytes_str(size_t{17} << 30), "18.3 GB");
  EXPECT_EQ(bytes_str(SIZE_MAX), "18.4 EB");
}

TEST(Tensor, OverflowingAndNegativeShapesAreRefused) {
  expect_error([] { Tensor(DType::f32, {int64_t{1} << 33, int64_t{1} << 33}); },
               {"[8589934592, 8589934592]", "f32", "too large"});
  expect_error([] { Tensor(DType::bf16, {int64_t{1} << 62, 2}); }, {"too large"});
  expect_error([] { Tensor(DType::f32, {4, -1}); }, {"negative dimension in shape [4, -1]"});
  EXPECT_EQ(checked_nbytes(DType::f32, {int64_t{1} << 62, 0}), 0u);  // a zero dimension: no bytes
  EXPECT_EQ(checked_nbytes(DType::bf16, {3, 5}), 30u);
  EXPECT_EQ(Tensor(DType::f32, {0, int64_t{1} << 40}).numel(), 0);
}

TEST(Tensor, MovedFromIsEmpty) {
  Tensor a(DType::f32, {2, 3});
  a.ptr<float>()[5] = 7.0f;
  const void* data = a.view().data;
  Tensor b(std::move(a));
  EXPECT_EQ(b.view().data, data);
  EXPECT_EQ(b.ptr<float>()[5], 7.0f);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the contract under test
  EXPECT_EQ(a.view().data, nullptr);
  EXPECT_EQ(a.numel(), 0);
  EXPECT_EQ(a.nbytes(), 0u);
  EXPECT_TRUE(a.clone().empty());  // copying nothing, not memcpy from null
  Tensor c(DType::f32, {1});
  c = std::move(b);
  EXPECT_EQ(c.view().data, data);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
}

TEST(Tensor, DefaultIsEmpty) {  // as a moved-from one: no data and no bytes, not one phantom element
  const Tensor t;
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(t.shape(), (Shape{0}));
  EXPECT_TRUE(t.clone().empty());
  Tensor b(DType::bf16, {2});
  Tensor moved(std::move(b));
  EXPECT_EQ(b.clone().dtype(), DType::bf16);  // NOLINT(bugprone-use-after-move): an empty copy keeps the dtype
}

TEST(TensorView, DefaultIsEmptyAsTensorsIs) {  // it was rank 0: one element at a null pointer
  const TensorView v;
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.numel(), 0);
  EXPECT_EQ(v.nbytes(), 0u);
  EXPECT_EQ(v.shape, Tensor().shape());
  float x = 1;
  EXPECT_EQ(TensorView(&x, DType::f32, {}).numel(), 1);  // a scalar, asked for, is still one
}

}  // namespace
}  // namespace twell

namespace twell {
namespace {

// memory_overlaps reads the views' strides: rows of a strided view that land in another are found
// (a span of shape × element size would miss them), rows between them and the two column halves of
// one buffer are apart, and a negative stride reaches below its data pointer.
TEST(MemoryOverlaps, FollowsStrides) {
  Tensor buf(DType::f32, {8, 64});
  float* base = buf.ptr<float>();
  const TensorView first_rows(base, DType::f32, {2, 32});  // bytes [0, 256)
  TensorView strided(base + 64 * 4, DType::f32, {2, 32});  // rows 4 and 6, 32 columns each
  strided.strides = {128, 1};
  const TensorView row5(base + 64 * 5, DType::f32, {64});
  const TensorView row6(base + 64 * 6, DType::f32, {64});
  EXPECT_FALSE(memory_overlaps(first_rows, strided));
  EXPECT_FALSE(memory_overlaps(strided, row5)) << "row 5 lies between the strided view's two rows";
  EXPECT_TRUE(memory_overlaps(strided, row6)) << "the strided view's second row is row 6";
  TensorView left(base, DType::f32, {8, 32}), right(base + 32, DType::f32, {8, 32});
  left.strides = right.strides = {64, 1};
  EXPECT_FALSE(memory_overlaps(left, right)) << "two column halves of one buffer";
  TensorView last_of_left(base + 64 * 7 + 31, DType::f32, {1, 1});
  last_of_left.strides = {64, 1};
  EXPECT_TRUE(memory_overlaps(left, last_of_left));
  EXPECT_FALSE(memory_overlaps(right, last_of_left));
  EXPECT_FALSE(memory_overlaps(right, TensorView(base + 64 * 7 + 31, DType::f32, {1})));
  TensorView every_other(base, DType::f32, {256});  // not rows: taken as overlapping where the spans meet
  every_other.strides = {2};
  EXPECT_TRUE(memory_overlaps(every_other, TensorView(base + 1, DType::f32, {1})));
  TensorView backwards(base + 64 * 7, DType::f32, {8, 64});  // rows 7 down to 0
  backwards.strides = {-64, 1};
  EXPECT_TRUE(memory_overlaps(backwards, first_rows)) << "a negative stride reaches below the data pointer";
  EXPECT_FALSE(memory_overlaps(TensorView(), first_rows));
  // no elements, no bytes (and no division by a zero pitch)
  const TensorView row(base, DType::f32, {64});
  EXPECT_FALSE(memory_overlaps(row, TensorView(base + 10, DType::f32, {0})));
  EXPECT_FALSE(memory_overlaps(TensorView(base, DType::f32, {1, 64}), TensorView(base, DType::f32, {2, 0})));
  EXPECT_FALSE(memory_overlaps(TensorView(base, DType::f32, {4, 0, 3}), first_rows));
}

TEST(OverlapsItself, ZeroAndShortStridesButNotTransposesOrPitches) {
  Tensor buf(DType::f32, {4, 8});
  TensorView v(buf.ptr<float>(), DType::f32, {4, 8});
  EXPECT_FALSE(overlaps_itself(v));
  v.strides = {0, 1};  // every row the same memory
  EXPECT_TRUE(overlaps_itself(v));
  v.strides = {4, 1};  // rows of 8 every 4: each runs into the next
  EXPECT_TRUE(overlaps_itself(v));
  v.strides = {16, 1};  // a pitch past the row
  EXPECT_FALSE(overlaps_itself(v));
  TensorView t(buf.ptr<float>(), DType::f32, {8, 4});  // the transpose of a [4, 8] buffer
  t.strides = {1, 8};
  EXPECT_FALSE(overlaps_itself(t));
  t.strides = {-1, -8};
  EXPECT_FALSE(overlaps_itself(t));
  EXPECT_FALSE(overlaps_itself(TensorView(buf.ptr<float>(), DType::f32, {1, 8})));
  TensorView one_column(buf.ptr<float>(), DType::f32, {4, 1});
  one_column.strides = {0, 0};
  EXPECT_TRUE(overlaps_itself(one_column));
  TensorView none(buf.ptr<float>(), DType::f32, {0, 8});
  none.strides = {0, 0};
  EXPECT_FALSE(overlaps_itself(none)) << "no elements";
}

TEST(CheckOptional, ShapeWithoutDataIsATensorThatWasMeantToBeGiven) {
  check_optional(TensorView(), "t");
  check_optional(TensorView(nullptr, DType::f32, {0, 4}), "t");
  Tensor a(DType::f32, {2, 2});
  check_optional(a.view(), "t");
  try {
    check_optional(TensorView(nullptr, DType::f32, {2, 2}), "op: w.wg");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op: w.wg: shape [2, 2] but no data"), std::string::npos) << e.what();
  }
}

TEST(DoubleToHalf, RoundsOnceToNearestEven) {
  const double just_above = 1 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);  // past bf16's midpoint by 2^-30
  EXPECT_EQ(double_to_bf16_bits(just_above), float_to_bf16_bits(1.0078125f));
  EXPECT_EQ(float_to_bf16_bits(static_cast<float>(just_above)), float_to_bf16_bits(1.0f)) << "through float: twice";
  EXPECT_EQ(double_to_bf16_bits(-just_above), float_to_bf16_bits(-1.0078125f));
  EXPECT_EQ(double_to_bf16_bits(1 + std::ldexp(1.0, -8)), float_to_bf16_bits(1.0f)) << "a tie: to even";
  const double f16_above = 1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30);
  EXPECT_EQ(double_to_f16_bits(f16_above), float_to_f16_bits(1 + std::ldexp(1.0f, -10)));
  EXPECT_EQ(double_to_bf16_bits(1e300), 0x7f80) << "past float's range: Inf";
  EXPECT_EQ(double_to_bf16_bits(-1e-300), 0x8000) << "below every subnormal: -0";
  EXPECT_EQ(double_to_f16_bits(70000.0), 0x7c00);
  EXPECT_EQ(double_to_bf16_bits(0.1), float_to_bf16_bits(0.1f));
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(double_to_bf16_bits(std::nan("")))));
  Tensor t(DType::bf16, {1});
  store_from_double(t.view(), 0, just_above);
  EXPECT_EQ(t.ptr<bf16>()[0].bits, float_to_bf16_bits(1.0078125f));
}

}  // namespace
}  // namespace twell
