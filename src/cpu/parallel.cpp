#include "cpu/parallel.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "twell/error.h"

namespace twell::cpu {

namespace {
std::atomic<int> g_override{0};
}  // namespace

int num_threads() {
  if (const int n = g_override.load(std::memory_order_relaxed); n > 0) return n;
  if (const char* env = std::getenv("TWELL_NUM_THREADS"); env && *env) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    TWELL_REQUIRE(end && *end == '\0' && n >= 0 && n <= 4096,
                  "TWELL_NUM_THREADS: expected an integer in [0, 4096] (0: every hardware thread), got '", env, "'");
    if (n > 0) return static_cast<int>(n);  // 0: the default, as set_num_threads(0)
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

int set_num_threads(int n) {
  TWELL_REQUIRE(n >= 0, "set_num_threads: expected n >= 0 (0 restores the default), got ", n);
  return g_override.exchange(n);
}

namespace detail {
bool& in_parallel_region() {
  thread_local bool flag = false;
  return flag;
}
}  // namespace detail

}  // namespace twell::cpu
