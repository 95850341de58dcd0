// Comparators for tests: relative error ‖out − ref‖/‖ref‖ and element-wise |a − r| ≤ atol + rtol·|r|,
// with a report that says where (row, column), by how much, and the first few mismatches.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "twell/tensor.h"

namespace twell::test {

// ‖out − ref‖₂ / ‖ref‖₂ over all elements (any float dtypes, host). 0 when both are zero.
// NaN anywhere gives +inf, so a NaN never passes a tolerance.
double rel_err(const TensorView& out, const TensorView& ref);

// Element-wise closeness of two [rows, cols] (or any-shape, treated as flat) host tensors.
testing::AssertionResult all_close(const TensorView& out, const TensorView& ref, double atol,
                                   double rtol, int max_report = 5);

// Exact equality of the raw bytes, reporting the first differing elements.
testing::AssertionResult bit_equal(const TensorView& out, const TensorView& ref, int max_report = 5);

}  // namespace twell::test
