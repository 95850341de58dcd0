// CPU backend of `twell bench ffn`: the reference implementations, timed with a steady clock.
#include <chrono>
#include <fstream>
#include <thread>

#include "ffn_bench.h"
#include "twell/cpu/ffn.h"

namespace twell::bench {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

class CpuBackend : public FfnBackend {
 public:
  std::string device_name() const override {
    return str("CPU: ", cpu_model(), " (", std::thread::hardware_concurrency(), " threads)");
  }
  std::vector<int64_t> default_tokens() const override { return {512}; }
  std::vector<double> default_densities() const override { return {0.005, 0.02, 0.1}; }
  int default_warmup() const override { return 1; }
  int default_iters() const override { return 5; }
  size_t rotate_below_bytes() const override { return 0; }  // CPU timings are of the whole FFN anyway

  TwellOccupancy occupancy(const FfnProblem& p, const FfnBenchConfig& cfg, int set) override {
    const TwellLayout layout{p.ffn.spec.M, p.ffn.spec.I, cfg.tile, cfg.compression};
    return twell_occupancy(cpu::ffn_pack_activation(p.x(set), p.ffn.weights(), layout));
  }

  std::vector<FfnRunner> runners(const FfnProblem& p, const FfnBenchConfig& cfg) override {
    auto y_dense = std::make_shared<Tensor>(Tensor::of<bf16>({p.ffn.spec.M, p.ffn.spec.H}));
    auto y_twell = std::make_shared<Tensor>(Tensor::of<bf16>({p.ffn.spec.M, p.ffn.spec.H}));
    const FfnWeights w = p.ffn.weights();
    const TwellLayout layout{p.ffn.spec.M, p.ffn.spec.I, cfg.tile, cfg.compression};
    FfnRunner dense{"dense_cpu", [&p, w, y_dense](int set) { cpu::ffn_forward(p.x(set), w, *y_dense, Precision::bf16); },
                    [y_dense] { return y_dense->clone(); }};
    FfnRunner twell{"twell_cpu",
                    [&p, w, y_twell, layout](int set) {
                      const TwellMatrix act = cpu::ffn_pack_activation(p.x(set), w, layout);
                      cpu::ffn_forward_twell(p.x(set), act, w, *y_twell, Precision::bf16);
                    },
                    [y_twell] { return y_twell->clone(); }};
    return {dense, twell};
  }

  Timing timing_used(Timing) const override { return Timing::host; }
  bool slow() const override { return true; }
  double time_ms(const std::function<void()>& fn, Timing) override {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

}  // namespace

std::unique_ptr<FfnBackend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace twell::bench
