// PackReport (kernels.h) made by threads [0, n) of whichever kernel runs it: launch_report's own
// kernel, or a warp of the sparse FFN's first pass (twell_rows.cuh).
#pragma once

#include "cuda/kernels.h"

namespace twell::cuda {

__device__ __forceinline__ void make_report(const PackReport& r, int thread, int n) {
  for (int i = thread; r.copy_dst && i < r.copy_words; i += n)
    r.copy_dst[i] = r.patch && i == r.patch_at ? *r.patch : r.copy_src[i];
  if (thread == 0 && r.sum_out) {
    unsigned long long s = 0;
    for (int i = 0; i < r.sum_n; ++i) s += r.sum_in[i];
    *r.sum_out = s;
  }
  __threadfence_system();  // host memory: visible there once the kernel is done
}

}  // namespace twell::cuda
