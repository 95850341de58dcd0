// The C interface's description (twell/c_api.h) of a TensorView, for the tests of that interface.
#pragma once

#include "twell/c_api.h"
#include "twell/tensor.h"

namespace twell::test {

inline twell_tensor c_tensor(const TensorView& v) {
  twell_tensor t{};
  t.data = v.data;
  t.dtype = static_cast<int32_t>(v.dtype);
  t.device = static_cast<int32_t>(v.device);
  t.ndim = v.rank();
  for (int d = 0; d < v.rank(); ++d) t.shape[d] = v.shape[d];
  return t;
}

}  // namespace twell::test
