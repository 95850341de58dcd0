// parallel_for (src/cpu/parallel.h) and the thread-count independence of the CPU FFN: the same
// bits with 1, 2 and 5 threads, whether set by set_num_threads or by TWELL_NUM_THREADS.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#include "cpu/parallel.h"
#include "ffn_test_util.h"
#include "twell/cpu/ffn.h"

namespace twell::cpu_test {
namespace {

// Restores the thread count override and TWELL_NUM_THREADS when a test ends.
class ThreadsGuard {
 public:
  ThreadsGuard() : previous_(cpu::set_num_threads(0)) {
    if (const char* e = std::getenv("TWELL_NUM_THREADS")) env_ = e, had_env_ = true;
  }
  ~ThreadsGuard() {
    cpu::set_num_threads(previous_);
    if (had_env_) {
      setenv("TWELL_NUM_THREADS", env_.c_str(), 1);
    } else {
      unsetenv("TWELL_NUM_THREADS");
    }
  }

 private:
  int previous_;
  std::string env_;
  bool had_env_ = false;
};

TEST(CpuParallelFor, CoversEveryIndexExactlyOnce) {
  ThreadsGuard guard;
  for (int threads : {1, 2, 3, 7})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1000}, int64_t{1001}}) {
      cpu::set_num_threads(threads);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      cpu::parallel_for(
          n,
          [&](int64_t b, int64_t e) {
            ASSERT_LE(0, b);
            ASSERT_LE(b, e);
            ASSERT_LE(e, n);
            for (int64_t i = b; i < e; ++i) hits[i]++;
          },
          /*cost_per_item=*/1 << 20);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
}

TEST(CpuParallelFor, SmallLoopsAndNestedLoopsRunOnTheCaller) {
  ThreadsGuard guard;
  cpu::set_num_threads(4);
  int calls = 0;  // not atomic: a serial loop makes exactly one call on this thread
  cpu::parallel_for(
      100,
      [&](int64_t b, int64_t e) {
        calls++;
        EXPECT_EQ(e - b, 100);
      },
      1);
  EXPECT_EQ(calls, 1);
  std::atomic<int> inner_calls{0};
  cpu::parallel_for(
      4,
      [&](int64_t, int64_t) {
        cpu::parallel_for(
            1000,
            [&](int64_t b, int64_t e) {
              inner_calls++;
              EXPECT_EQ(e - b, 1000);
            },
            1 << 20);
      },
      1 << 20);
  EXPECT_EQ(inner_calls.load(), 4);
}

TEST(CpuParallelFor, RethrowsAWorkerExceptionOnTheCaller) {
  ThreadsGuard guard;
  cpu::set_num_threads(3);
  EXPECT_THROW(cpu::parallel_for(
                   300,
                   [](int64_t b, int64_t) {
                     if (b > 0) throw std::runtime_error("worker failed");
                   },
                   1 << 20),
               std::runtime_error);
}

TEST(CpuParallelFor, EnvironmentVariableSetsTheThreadCount) {
  ThreadsGuard guard;
  setenv("TWELL_NUM_THREADS", "3", 1);
  EXPECT_EQ(cpu::num_threads(), 3);
  cpu::set_num_threads(2);  // the explicit override wins
  EXPECT_EQ(cpu::num_threads(), 2);
  cpu::set_num_threads(0);
  setenv("TWELL_NUM_THREADS", "zero", 1);
  EXPECT_THROW(cpu::num_threads(), Error);
  setenv("TWELL_NUM_THREADS", "-1", 1);
  EXPECT_THROW(cpu::num_threads(), Error);
  unsetenv("TWELL_NUM_THREADS");
  const int hardware = cpu::num_threads();
  EXPECT_GE(hardware, 1);
  setenv("TWELL_NUM_THREADS", "0", 1);  // the default, as set_num_threads(0)
  EXPECT_EQ(cpu::num_threads(), hardware);
}

// Everything the FFN computes, for one thread setting.
struct Outputs {
  Tensor y_dense, y_sparse, dx, dwg, dwu, dwd;
  ActivationStats stats;
  TwellMatrix act;
};

Outputs run_all(const Problem& p, const Tensor& dy, Precision precision) {
  Outputs o;
  o.y_dense = Tensor(DType::f32, {p.M, p.H});
  o.y_sparse = Tensor(DType::f32, {p.M, p.H});
  cpu::ffn_forward(p.x, p.weights(), o.y_dense, precision, &o.stats);
  if (precision != Precision::f64) {
    TwellLayout layout;
    layout.tile = 64;
    layout.compression = 8;
    o.act = cpu::ffn_pack_activation(p.x, p.weights(), layout);
    cpu::ffn_forward_twell(p.x, o.act, p.weights(), o.y_sparse, precision);
  }
  const DType gd = precision == Precision::f64 ? DType::f64 : DType::f32;
  o.dx = Tensor(gd, {p.M, p.H});
  o.dwg = Tensor(gd, {p.I, p.H});
  o.dwu = Tensor(gd, {p.I, p.H});
  o.dwd = Tensor(gd, {p.I, p.H});
  cpu::ffn_backward(p.x, p.weights(), dy, 1e-3, {o.dx, o.dwg, o.dwu, o.dwd}, precision);
  return o;
}

TEST(CpuFfnThreads, ResultsAreBitIdenticalForAnyThreadCount) {
  ThreadsGuard guard;
  const Problem p = random_problem(64, 128, 520, true, DType::bf16, 61);
  const Tensor dy = random_tensor(DType::bf16, {64, 128}, 62);
  for (Precision precision : {Precision::bf16, Precision::h_fp32, Precision::f64}) {
    SCOPED_TRACE(precision == Precision::bf16     ? "bf16"
                 : precision == Precision::h_fp32 ? "h_fp32"
                                                  : "f64");
    setenv("TWELL_NUM_THREADS", "1", 1);
    const Outputs one = run_all(p, dy, precision);
    unsetenv("TWELL_NUM_THREADS");
    const Outputs dflt = run_all(p, dy, precision);  // hardware_concurrency threads
    cpu::set_num_threads(5);                         // uneven partitions
    const Outputs five = run_all(p, dy, precision);
    cpu::set_num_threads(0);
    for (const Outputs* o : {&dflt, &five}) {
      EXPECT_TRUE(test::bit_equal(o->y_dense, one.y_dense));
      EXPECT_TRUE(test::bit_equal(o->y_sparse, one.y_sparse));
      EXPECT_TRUE(test::bit_equal(o->dx, one.dx));
      EXPECT_TRUE(test::bit_equal(o->dwg, one.dwg));
      EXPECT_TRUE(test::bit_equal(o->dwu, one.dwu));
      EXPECT_TRUE(test::bit_equal(o->dwd, one.dwd));
      EXPECT_EQ(o->stats.l1_sum, one.stats.l1_sum);
      EXPECT_EQ(o->stats.nnz, one.stats.nnz);
      EXPECT_TRUE(o->act.counts == one.act.counts && o->act.slots == one.act.slots &&
                  o->act.backup == one.act.backup && o->act.backup_owner == one.act.backup_owner);
    }
  }
}

}  // namespace
}  // namespace twell::cpu_test
