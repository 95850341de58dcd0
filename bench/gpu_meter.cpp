// GpuMeter (gpu_meter.h).
#include "gpu_meter.h"

#if defined(TWELL_WITH_CUDA)
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>

namespace twell::bench {
namespace {
using Clock = std::chrono::steady_clock;
constexpr int kClockSm = 1;                                // NVML_CLOCK_SM
constexpr unsigned long long kPowerCapReasons = 0x4        // software power cap
                                                | 0x80;    // hardware power brake
}  // namespace

GpuMeter::GpuMeter() {
  lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib_) return;
  auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
  auto by_bus = reinterpret_cast<int (*)(const char*, void**)>(dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
  energy_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(dlsym(lib_, "nvmlDeviceGetTotalEnergyConsumption"));
  clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
  void* reasons = dlsym(lib_, "nvmlDeviceGetCurrentClocksEventReasons");  // the older name below
  reasons_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(
      reasons ? reasons : dlsym(lib_, "nvmlDeviceGetCurrentClocksThrottleReasons"));
  char bus[32] = {};
  int dev = 0;
  unsigned long long probe = 0;  // a board or container may give a handle but not the counter
  if (!init || !by_bus || !energy_ || init() != 0 || cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess || by_bus(bus, &device_) != 0 ||
      energy_(device_, &probe) != 0)
    device_ = nullptr;
}

GpuMeter::~GpuMeter() {
  stop();
  if (lib_) {
    if (auto shutdown = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlShutdown")); shutdown && device_) shutdown();
    dlclose(lib_);
  }
}

void GpuMeter::start() {
  stop();
  if (!device_) return;
  running_ = true;
  sampler_ = std::thread([this] {
    MeterReading r;
    double prev = -1, first_mj = -1, last_mj = -1;  // the last value read; the values at the first and last move
    Clock::time_point first_t, last_t, next_clock = Clock::now();
    while (running_) {
      unsigned long long mj = 0;
      if (energy_(device_, &mj) == 0) {
        const double v = static_cast<double>(mj);
        if (prev >= 0 && v != prev) {
          const Clock::time_point now = Clock::now();
          if (first_mj < 0) first_mj = v, first_t = now;
          last_mj = v, last_t = now;
        }
        prev = v;
      }
      if (clock_ && Clock::now() >= next_clock) {
        unsigned mhz = 0;
        unsigned long long why = 0;
        if (clock_(device_, kClockSm, &mhz) == 0) {
          r.mhz_sum += mhz;
          r.capped_sum += reasons_ && reasons_(device_, &why) == 0 && (why & kPowerCapReasons) ? 1 : 0;
          ++r.samples;
        }
        next_clock = Clock::now() + std::chrono::milliseconds(10);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // where a read is quick, no busy loop
    }
    if (first_mj >= 0 && last_t > first_t) {
      r.mj = last_mj - first_mj;
      r.seconds = std::chrono::duration<double>(last_t - first_t).count();
    }
    last_ = r;
  });
}

MeterReading GpuMeter::stop() {
  if (!sampler_.joinable()) return {};
  running_ = false;
  sampler_.join();
  return last_;
}

}  // namespace twell::bench
#endif
