// Deterministic fork-join parallel loop for the CPU reference backend.
//
//   parallel_for(n, f, cost_per_item)  calls f(begin, end) on disjoint contiguous ranges that
//                                      cover [0, n) exactly once, on up to num_threads() threads.
//
// Determinism is the caller's half of the contract: every output element must be computed by
// exactly one call of f, with a summation order that does not depend on the range it sits in.
// Then results are bit-identical for any thread count (tests/cpu/test_parallel.cpp and the
// thread-count tests of the FFN check this).
//
// Threads are plain std::threads started per call (no pool): the reference backend calls this a
// few times per op on large ranges, so the ~20 µs start-up per thread does not matter, and there
// is no global state to shut down. Small loops (n · cost_per_item below ~2^20) run serially on
// the caller. A parallel_for inside f runs serially (no nested oversubscription). An exception
// thrown by f in any thread is rethrown on the caller after all threads have joined. Where a thread
// cannot be started (a pid or memory limit), the ranges left run on the caller: fewer threads, same
// results.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "twell/cpu/threads.h"  // num_threads, set_num_threads

namespace twell::cpu {

namespace detail {
// True on a thread currently running the body of a parallel_for (nested loops run serially).
bool& in_parallel_region();
}  // namespace detail

// Work below this many "cost units" (roughly multiply-adds, ~0.2 ms) per thread is not worth
// starting a thread for (start-up and, on a loaded machine, waiting for the slowest thread).
inline constexpr int64_t kMinCostPerThread = int64_t{1} << 20;

template <class F>
void parallel_for(int64_t n, F&& f, int64_t cost_per_item = 4096) {
  if (n <= 0) return;
  const int64_t total_cost = n * std::max<int64_t>(cost_per_item, 1);
  int64_t threads = std::min<int64_t>(num_threads(), n);
  threads = std::min<int64_t>(threads, std::max<int64_t>(1, total_cost / kMinCostPerThread));
  if (threads <= 1 || detail::in_parallel_region()) {
    f(int64_t{0}, n);
    return;
  }
  // Static partition: thread t gets [t·chunk, min(n, (t+1)·chunk)).
  const int64_t chunk = (n + threads - 1) / threads;
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int64_t begin, int64_t end) {
    bool& flag = detail::in_parallel_region();
    const bool was = flag;
    flag = true;
    try {
      f(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
    flag = was;
  };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(threads - 1));
  int64_t on_caller = n;  // the ranges from here on run on the caller: no thread could be started for them
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t begin = t * chunk, end = std::min(n, begin + chunk);
    if (begin >= end) break;
    try {
      workers.emplace_back(run, begin, end);
    } catch (const std::system_error&) {  // out of threads (a container's pid limit, memory): go on with fewer
      on_caller = begin;
      break;
    }
  }
  run(0, std::min(n, chunk));
  if (on_caller < n) run(on_caller, n);
  for (auto& w : workers) w.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace twell::cpu
