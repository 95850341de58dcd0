// Tensor basics a library user relies on: sizes that cannot be allocated are refused by name, and
// a default or moved-from tensor is empty instead of one phantom element or a view of memory it no
// longer owns.
#include <gtest/gtest.h>

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
