// GpuMeter: the GPU's energy, SM clock and clock-limit reasons through NVML, loaded at run time
// (CI machines have no driver), for `twell bench model` and `twell bench ffn --energy`. A long
// run at these sizes holds the board at its power limit, where time follows energy rather than
// work (docs/perf.md), so each measured stretch also reports the mean SM clock and the share of
// samples throttled by the power cap. CUDA builds only.
//
// Energy: on the H200 (driver 580) the cumulative counter moves every 100 ms, and reading it takes
// ~4 ms (`nvml_probe.txt`). A reading before and after a stretch is therefore off by up to a move
// (0.16 s decode stretches read 290 or 640 mJ a step), and a reading between decode steps stalls
// them. So a sampler thread polls the counter during start() .. stop() and keeps its moves; the
// mean power is the energy between the first and the last move over the time between them (each
// end seen up to one read late), and a stretch's energy is that power times its length. The
// counter is the whole board's: other processes on the GPU count too.
#pragma once

#if defined(TWELL_WITH_CUDA)
#include <atomic>
#include <cstdint>
#include <thread>

namespace twell::bench {

class GpuMeter {
 public:
  GpuMeter();  // of the current CUDA device; available(): NVML read its energy counter once
  ~GpuMeter();
  GpuMeter(const GpuMeter&) = delete;
  GpuMeter& operator=(const GpuMeter&) = delete;
  bool available() const { return device_ != nullptr; }

  // What the sampler saw between start() and stop(): clock samples every 10 ms, and the counter's
  // first and last moves.
  struct Clocks {
    double mhz_sum = 0, capped = 0;  // sums over the samples; capped: power-cap reason set
    int64_t samples = 0;
    void add(const Clocks& o) { mhz_sum += o.mhz_sum, capped += o.capped, samples += o.samples; }
  };
  struct Reading {
    Clocks clocks;
    double mj = 0, seconds = 0;  // energy and time between the counter's first and last move; 0: fewer than 2
    double watts() const { return seconds > 0 ? mj / 1e3 / seconds : -1; }
    void add(const Reading& o) { clocks.add(o.clocks), mj += o.mj, seconds += o.seconds; }
  };
  void start();
  Reading stop();

 private:
  void* lib_ = nullptr;
  void* device_ = nullptr;
  int (*energy_)(void*, unsigned long long*) = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*reasons_)(void*, unsigned long long*) = nullptr;
  std::thread sampler_;
  std::atomic<bool> running_{false};
  Reading last_;
};

}  // namespace twell::bench
#endif
