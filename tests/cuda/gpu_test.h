// GPU tests skip, with the reason, where no Hopper GPU is present (CI has none).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "twell/cuda/runtime.h"

#define TWELL_REQUIRE_HOPPER()                                          \
  do {                                                                  \
    std::string twell_why_;                                             \
    if (!::twell::cuda::hopper_available(&twell_why_))                  \
      GTEST_SKIP() << "GPU test skipped: " << twell_why_;               \
  } while (0)
