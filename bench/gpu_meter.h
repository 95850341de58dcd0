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

#include <cstdint>

namespace twell::bench {

// What a GpuMeter saw between start() and stop(): sums, so that readings add up. Declared in every
// build, since the benchmarks' records are built from it without CUDA too.
struct MeterReading {
  double mj = 0, seconds = 0;  // energy and time between the counter's first and last move; 0: fewer than 2
  double mhz_sum = 0, capped_sum = 0;  // over the clock samples (every 10 ms); capped: power-cap reason set
  int64_t samples = 0;
  void add(const MeterReading& o) {
    mj += o.mj, seconds += o.seconds, mhz_sum += o.mhz_sum, capped_sum += o.capped_sum, samples += o.samples;
  }
  // The derived values; < 0 where nothing was read.
  double watts() const { return seconds > 0 && mj > 0 ? mj / 1e3 / seconds : -1; }
  double mhz() const { return samples > 0 ? mhz_sum / static_cast<double>(samples) : -1; }
  double capped() const { return samples > 0 ? capped_sum / static_cast<double>(samples) : -1; }
};

}  // namespace twell::bench

#if defined(TWELL_WITH_CUDA)
#include <atomic>
#include <thread>

namespace twell::bench {

class GpuMeter {
 public:
  GpuMeter();  // of the current CUDA device; available(): NVML read its energy counter once
  ~GpuMeter();
  GpuMeter(const GpuMeter&) = delete;
  GpuMeter& operator=(const GpuMeter&) = delete;
  bool available() const { return device_ != nullptr; }

  void start();
  MeterReading stop();

 private:
  void* lib_ = nullptr;
  void* device_ = nullptr;
  int (*energy_)(void*, unsigned long long*) = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*reasons_)(void*, unsigned long long*) = nullptr;
  std::thread sampler_;
  std::atomic<bool> running_{false};
  MeterReading last_;
};

}  // namespace twell::bench
#endif
