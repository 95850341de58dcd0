// Comparators for tests: element-wise |a − r| ≤ atol + rtol·|r| and bit equality, with a report
// that says where (row, column), by how much, and the first few mismatches. (The relative error
// ‖out − ref‖/‖ref‖ is twell::relative_error in tensor.h.)
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "twell/tensor.h"

namespace twell::test {

// Element-wise closeness of two [rows, cols] (or any-shape, treated as flat) host tensors.
testing::AssertionResult all_close(const TensorView& out, const TensorView& ref, double atol,
                                   double rtol, int max_report = 5);

// Exact equality of the raw bytes, reporting the first differing elements.
testing::AssertionResult bit_equal(const TensorView& out, const TensorView& ref, int max_report = 5);

}  // namespace twell::test
