// Random test tensors with fixed seeds. Values are never exactly zero unless meant to be.
#pragma once

#include <cstdint>

#include "twell/tensor.h"

namespace twell::test {

// Dense bf16 [rows, cols] with the given fraction of non-zeros. `skewed`: 30% dead columns,
// column rates log-normal around the mean, 2% of rows ten times denser, and every 17th row empty.
Tensor random_sparse_bf16(int64_t rows, int64_t cols, double density, bool skewed, uint64_t seed);

// Dense bf16/f32 tensor with N(0, stddev²) entries (non-zero).
Tensor random_normal(DType dtype, Shape shape, double stddev, uint64_t seed);

}  // namespace twell::test
