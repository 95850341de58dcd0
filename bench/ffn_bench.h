// `twell bench ffn`: the FFN benchmark of shared/BENCHMARKS.md. For every case (M, density,
// distribution) it builds a synthetic problem (or loads one with --from), checks every
// implementation against a float64 reference on sampled rows, and only then times them,
// interleaved, reporting the median and each one's ratio to the dense baseline.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "gpu_meter.h"
#include "synthetic.h"
#include "twell/formats/twell_format.h"

namespace twell::bench {

enum class Timing { gpu, host };
const char* timing_name(Timing t);

struct FfnBenchConfig {
  std::string backend = "auto";  // cpu | cuda | auto (cuda when a Hopper GPU is present)
  std::vector<int64_t> tokens;   // M values; empty = the backend's default
  int64_t H = 2048, I = 5632;
  std::vector<double> densities;  // empty = the backend's default
  std::vector<Distribution> distributions{Distribution::uniform, Distribution::skewed};
  bool gated = true;
  int32_t tile = 0, compression = 8;  // tile 0: default_ffn_tile (twell_format.h), the FFN's own choice
  int warmup = -1, iters = -1;  // -1 = the backend's default
  uint64_t seed = 1;
  std::string from_file;  // safetensors with x, gate, up, down (DESIGN.md §2 layouts)
  bool train = false;     // forward + backward (records "ffn_train")
  double l1 = 1e-3;       // with train: the L1 penalty's coefficient in dh = dy Wdᵀ + l1·sign(h)
  // How a GPU call is timed. Timing::gpu: the whole call is enqueued behind a kernel that holds the
  // stream, then released (nvbench's blocking kernel), so the events time the GPU's work alone,
  // as in a model whose host runs ahead. Timing::host: from an idle GPU, so the host's work before
  // the first kernel counts too. --train always times host: the backward synchronises once.
  Timing timing = Timing::gpu;
  bool timing_given = false;  // --timing was on the command line: a backend that cannot honour it is an error
  // After timing a case: each implementation run back to back for energy_seconds, twice (in order,
  // then in reverse, so that each one's mean place in the run is the same: the board heats as it
  // goes), its mean power read through NVML (CUDA backend): energy per token, the sustained time a
  // call, the SM clock and the share of time at the power cap. Where the board sits at its cap,
  // time follows energy.
  bool energy = false;
  double energy_seconds = 1.0;
  // Also time twell_split (CUDA backend, forward only): twell::cuda::SplitFfn, the neurons that fire
  // in >= 1.2% of a calibration sample's tokens run dense.
  bool split = false;
  std::string command;    // the full command line, recorded in every record
};

// One JSON record of shared/BENCHMARKS.md.
struct BenchRecord {
  std::string bench = "ffn", impl, gpu;
  int64_t M = 0, H = 0, I = 0;
  std::string distribution;
  double density = 0, nnz_per_token_mean = 0;
  int64_t nnz_per_token_max = 0;
  double ms_median = 0, ms_min = 0, ms_max = 0, ratio_to_dense = NAN;  // NAN: no ratio (written as null)
  double rel_err = 0, dense_rel_err = 0;
  bool correct = false;
  // Whole-model benchmarks (twell bench model); unset ones are written as null.
  int64_t layers = 0;                 // 0: not a model benchmark
  double tokens_per_ms = -1;          // < 0: unset
  int64_t peak_mem_bytes = -1;
  double energy_mj_per_token = -1;
  double ms_sustained = -1;  // FFN --energy: the mean time a call, run back to back
  double sm_clock_mhz = -1;  // mean SM clock (NVML samples): the model's timed runs, an FFN's --energy stretches
  double power_capped = -1;  // share of those samples with the power-cap clock limit active
  std::string note;  // why a case failed, or what was not timed
  std::string timing;  // "gpu" or "host" (FfnBenchConfig::timing); empty: not recorded (CPU, model)
  // FFN benchmarks: gated or not (-1: not an FFN record), and the run's warm-up and timed runs.
  int gated = -1;
  int tile = -1, compression = -1;  // FFN benchmarks: the TwELL layout asked for (-1: not an FFN record)
  int warmup = -1, iters = -1;
  std::string commit, command;
};

// A problem as the backends see it: the host tensors and the rotating token sets.
struct FfnProblem {
  SyntheticFfn ffn;                      // weights and x (token set 0)
  std::vector<Tensor> extra_token_sets;  // token sets 1.. for rotation
  std::string distribution;
  double density = 0;
  int64_t case_id = 0;  // unique within a run: backends may cache per problem

  int n_token_sets() const { return 1 + static_cast<int>(extra_token_sets.size()); }
  const Tensor& x(int set) const { return set == 0 ? ffn.x : extra_token_sets.at(set - 1); }
};

// One implementation under test.
struct FfnRunner {
  std::string impl;
  std::function<void(int token_set)> run;  // the timed work
  std::function<Tensor()> output;          // y [M, H] of the last run, on the host
  // Training runners: dx [M, H], dWg, dWu, dWd [I, H] of the last run (f32, host). Any runner: a note
  // for its records (e.g. the bytes the forward keeps for the backward).
  std::function<std::vector<Tensor>()> grads = nullptr;
  std::function<std::string()> note = nullptr;
  // Fills this runner's outputs with NaN, so that the checked run must write every value.
  std::function<void()> poison = nullptr;
};

// A backend: the device it runs on, its implementations, and how it times one call.
class FfnBackend {
 public:
  virtual ~FfnBackend() = default;
  virtual std::string device_name() const = 0;
  virtual std::vector<int64_t> default_tokens() const = 0;
  virtual std::vector<double> default_densities() const = 0;
  virtual int default_warmup() const = 0;
  virtual int default_iters() const = 0;
  // Bytes of x per token set below which inputs are rotated (so that timed data is not cached).
  virtual size_t rotate_below_bytes() const = 0;
  // Whether the case's [M, I] activations live in host memory (the CPU backend) or the device's.
  virtual bool activations_on_host() const { return true; }
  // Whether a call depends on the calls before it (the GPU FFN dispatches on the previous call's
  // density): then each implementation runs once before its checked run, so that the check sees
  // the path the timed calls take.
  virtual bool stateful() const { return false; }
  // Occupancy of the packed activation of the problem's token set `set`, computed by this backend.
  virtual TwellOccupancy occupancy(const FfnProblem& p, const FfnBenchConfig& cfg, int set) = 0;
  // The first runner is the dense baseline.
  virtual std::vector<FfnRunner> runners(const FfnProblem& p, const FfnBenchConfig& cfg) = 0;
  virtual bool train_available() const { return false; }
  // Forward + backward with upstream gradient dy [M, H] (bf16, host); the first is the dense baseline.
  virtual std::vector<FfnRunner> train_runners(const FfnProblem&, const FfnBenchConfig&, const Tensor& /*dy*/) {
    TWELL_FAIL("--train needs the CUDA backend (a Hopper GPU)");  // run_ffn_bench checks train_available first
  }
  // --energy (CUDA backend): a stretch of calls, with what the GPU meter (gpu_meter.h) saw meanwhile.
  // Sums, so that stretches add up; the derived values are < 0 where nothing was read.
  struct EnergySums {
    double gpu_ms = 0;  // the calls' GPU time
    int64_t calls = 0;
    MeterReading meter;
    void add(const EnergySums& o) { gpu_ms += o.gpu_ms, calls += o.calls, meter.add(o.meter); }
    double ms_per_call() const { return calls > 0 ? gpu_ms / static_cast<double>(calls) : -1; }
    double mj_per_call() const { return meter.watts() > 0 && calls > 0 ? meter.watts() * ms_per_call() : -1; }  // W x ms
  };
  // Whether the energy can be read here; if not, why.
  virtual bool energy_available(std::string* why) {
    if (why) *why = "energy needs the CUDA backend (a Hopper GPU, NVML)";
    return false;
  }
  // fn(call) run back to back for about `seconds` > 0 (call = 0, 1, ...), metered.
  virtual EnergySums sustained(const std::function<void(int call)>& /*fn*/, double /*seconds*/) { return {}; }
  // The meter alone, around whatever runs between the two calls (the interleaved timing).
  virtual void meter_start() {}
  virtual MeterReading meter_stop() { return {}; }
  // One timed call of fn, in ms. Timing::gpu where the backend can (the CUDA one), else host.
  virtual double time_ms(const std::function<void()>& fn, Timing timing) = 0;
  // The timing time_ms really used for `requested` (the CPU backend always times host).
  virtual Timing timing_used(Timing requested) const { return requested; }
  // Forgets a fallback timing_used reported: the next calls are timed as requested again.
  virtual void reset_timing() {}
  // Whether a case takes long enough here (seconds, on the CPU) to be announced when it starts.
  virtual bool slow() const { return false; }
};

std::unique_ptr<FfnBackend> make_cpu_backend();
#if defined(TWELL_WITH_CUDA)
std::unique_ptr<FfnBackend> make_cuda_backend();  // nullptr without a suitable GPU
bool cuda_backend_available(std::string* why);
#endif

// Runs every case; `finished`, when given, gets each case's records as soon as the case is done,
// so that a caller that catches an error from a later case still has them.
std::vector<BenchRecord> run_ffn_bench(const FfnBenchConfig& cfg, std::ostream& progress,
                                       std::vector<BenchRecord>* finished = nullptr);
// The same on a given backend, `cfg.backend` not read (tests' stand-ins); `backend_notes` is printed
// once the options are checked, and `no_gpu` says why --train and --energy have no GPU (empty: not asked).
std::vector<BenchRecord> run_ffn_bench_on(FfnBackend& backend, const FfnBenchConfig& cfg, std::ostream& progress,
                                          std::vector<BenchRecord>* finished = nullptr,
                                          const std::string& backend_notes = "", const std::string& no_gpu = "");
void print_table(const std::vector<BenchRecord>& records, std::ostream& out);
std::string records_to_json(const std::vector<BenchRecord>& records);
// Writes the records atomically (temporary file + rename).
void write_records(const std::vector<BenchRecord>& records, const std::string& path);
// Writes `text` to `path` atomically (temporary file + rename): a reader never sees half a file.
void write_json_file(const std::string& path, const std::string& text);
// The median of timings (the mean of the two middle ones of an even count; NAN of none): every bench's.
double median(std::vector<double> v);
// Throws unless a file can be created at `path` (its folder exists and is writable) and `path` is none
// of the `inputs` (file, what it is: "the --from input"), by any name: run before a benchmark, so that
// a bad --json path fails at once, not after minutes of measuring. Empty: no-op.
void check_records_path(const std::string& path,
                        const std::vector<std::pair<std::string, std::string>>& inputs = {});
// --json: writes the records to `path` (nothing when empty) and says so on `out`: "wrote N records to
// PATH", `which` inserted after "records".
void save_records(const std::vector<BenchRecord>& records, const std::string& path, std::ostream& out,
                  const char* which = "");
// Runs `run`, which appends each case's records to its argument as the case finishes, then prints
// the table to `out` and saves the records to `json_path`; returns them. When `run` throws after some
// cases finished, those are printed and saved, said to be the cases done before the error (a failed
// save is reported on `err`), and the case's error is rethrown: minutes of results are not lost.
std::vector<BenchRecord> run_saving_records(const std::function<void(std::vector<BenchRecord>*)>& run,
                                            const std::string& json_path, std::ostream& out, std::ostream& err);

}  // namespace twell::bench
