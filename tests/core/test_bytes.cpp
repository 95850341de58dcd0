// Sizes for people and back: bytes_str and parse_bytes (twell/error.h).
#include <gtest/gtest.h>

#include "core/io_test_util.h"
#include "twell/error.h"

namespace twell {
namespace {

TEST(Bytes, ParseTakesDecimalUnitsWithOrWithoutB) {
  EXPECT_EQ(parse_bytes("1000"), 1000u);
  EXPECT_EQ(parse_bytes("0"), 0u);
  EXPECT_EQ(parse_bytes("512M"), 512000000u);
  EXPECT_EQ(parse_bytes("40GB"), 40000000000u);
  EXPECT_EQ(parse_bytes("40 gb"), 40000000000u);
  EXPECT_EQ(parse_bytes("1.5T"), 1500000000000u);
  EXPECT_EQ(parse_bytes("2kB"), 2000u);
  EXPECT_EQ(parse_bytes("7B"), 7u);
  EXPECT_EQ(parse_bytes("40GB "), 40000000000u);
  EXPECT_EQ(parse_bytes("0.5k"), 500u);
  for (const char* text : {"", "GB", "12XB", "-1G", "1GiB", "nan", "inf", "1e30", "0x1B", "1.2.3M", ".", " 5"})
    test::expect_error([&] { parse_bytes(text); }, {std::string("'") + text + "' is not a size"});
  test::expect_error([] { parse_bytes("10000000T"); }, {"'10000000T' is too large a size"});
}

TEST(Bytes, WhatBytesStrPrintsParsesBack) {
  for (const size_t n : {size_t{999}, size_t{3100000}, size_t{17200000000}})
    EXPECT_EQ(parse_bytes(bytes_str(n)), n) << bytes_str(n);
}

}  // namespace
}  // namespace twell
