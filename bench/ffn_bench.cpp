#include "ffn_bench.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>

#include "core/atomic_file.h"
#include "twell/io/safetensors.h"
#include "twell/cpu/ffn.h"
#include "twell_git_sha.h"

namespace twell::bench {

namespace {

// Rows checked against the float64 reference: spread over the batch, plus the densest token and the
// first tokens with a tile over capacity (the backup path). Every row is checked to be finite apart
// (check_all_written).
std::vector<int64_t> sample_rows(int64_t M, const TwellOccupancy& occ) {
  const int64_t n = std::min<int64_t>(M, 16);
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < n; ++i) rows.push_back(i * (M - 1) / std::max<int64_t>(n - 1, 1));
  if (occ.densest_row >= 0) rows.push_back(occ.densest_row);
  rows.insert(rows.end(), occ.spilled_rows.begin(), occ.spilled_rows.end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

Tensor gather_rows(const TensorView& t, const std::vector<int64_t>& rows) {
  const int64_t cols = t.size(1);
  Tensor out(t.dtype, {static_cast<int64_t>(rows.size()), cols});
  const size_t row_bytes = cols * dtype_size(t.dtype);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<char*>(out.view().data) + i * row_bytes,
                static_cast<const char*>(t.data) + rows[i] * row_bytes, row_bytes);
  return out;
}

// Why `t` (an output written over poison) holds a NaN or Inf, where the float64 reference's sampled
// rows miss it (an unwritten row), or "".
std::string check_all_written(const char* quantity, const Tensor& t) {
  const int64_t bad = io::first_non_finite(t.view());
  if (bad < 0) return {};
  const int64_t cols = t.shape().size() >= 2 ? t.shape()[1] : 1;
  return str(quantity, "[", bad / cols, ", ", bad % cols, "] is not finite (unwritten, or an overflow)");
}

// The CPU backend, said to be what it is: it checks the arithmetic, not the speed-up.
std::unique_ptr<FfnBackend> cpu_backend(std::ostream& progress) {
  progress << "CPU reference backend: it is the oracle the GPU kernels are checked against, and its dense FFN "
              "skips zero activations too, so expect twell at about 1.0x here; the speed-ups are the GPU's\n";
  return make_cpu_backend();
}

// `no_gpu`: why the CPU backend runs where it does (what --train and --energy say they miss); empty
// where the CUDA backend does.
std::unique_ptr<FfnBackend> pick_backend(const std::string& name, std::ostream& progress, std::string& no_gpu) {
  no_gpu = "--backend cpu";
  if (name == "cpu") return cpu_backend(progress);
  no_gpu.clear();
#if defined(TWELL_WITH_CUDA)
  std::string why;
  if (name == "cuda" || name == "auto") {
    if (cuda_backend_available(&why)) return make_cuda_backend();
    TWELL_REQUIRE(name == "auto", "--backend cuda: ", why);
    progress << "no usable GPU (" << why << "): running the CPU backend\n";
    no_gpu = why;
    return cpu_backend(progress);
  }
#else
  TWELL_REQUIRE(name == "auto", "--backend ", name, ": this build has no CUDA backend (configure with -DTWELL_CUDA=ON)");
  no_gpu = "this build has no CUDA backend (configure with -DTWELL_CUDA=ON)";
  if (name == "auto") return cpu_backend(progress);
#endif
  TWELL_FAIL("unknown backend '", name, "' (expected cpu, cuda or auto)");
}

// MemAvailable of /proc/meminfo in bytes; 0 where it cannot be read.
double available_host_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  double kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

// One decimal, without touching a stream's format flags.
std::string fixed1(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", v);
  return text;
}

std::string format_gb(double bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << bytes / 1e9 << " GB";
  return os.str();
}

// At least what a problem's tensors take on the host (the sampled rows are small beside these): x
// [M, H] and the weights [I, H] in bf16, and where the backend keeps them there (the CPU's) one
// [M, I] activation in bf16 and, once the tile is known (> 0), its TwELL packing: tile / compression
// 32-bit slots and a count a row and tile (a tile wider than I still holds all its slots). Checked
// against what the machine has free before the first case, so that a mistyped size fails at once
// with its numbers, not by the out-of-memory killer minutes later. `what` names the sizes.
void check_host_memory(const std::vector<int64_t>& tokens, int64_t H, int64_t I, bool gated, bool activations,
                       const std::string& what, int64_t tile, int64_t compression) {
  const double available = available_host_bytes();
  if (available <= 0) return;  // unknown here
  for (int64_t M : tokens) {
    const double m = static_cast<double>(M), h = static_cast<double>(H), i = static_cast<double>(I);
    const double tiles = tile > 0 ? std::ceil(i / static_cast<double>(tile)) : 0;
    const double packed = tile > 0 ? 4 * m * tiles * (static_cast<double>(tile / compression) + 1) : 0;
    const double need = 2 * (m * h + (gated ? 3 : 2) * i * h) + (activations ? 2 * m * i + packed : 0);
    const bool by_tile = activations && packed > 2 * m * i;  // the packing, not the sizes, is what is large
    TWELL_REQUIRE(need <= available, "M = ", M, ", H = ", H, ", I = ", I, " (", what,
                  by_tile ? str("; --tile ", tile, " --compression ", compression, " packs ",
                                static_cast<int64_t>(tiles) * (tile / compression), " slots a token") : "",
                  ") needs at least ", format_gb(need), " of host memory; ", format_gb(available), " is available");
  }
}

// Loads a problem from a safetensors file: x [M, H], up [I, H], down [I, H] (neuron-major, the
// transpose of PyTorch's down_proj.weight) and, for a gated FFN, gate [I, H]; BF16, F16, F32 or F64,
// converted to bf16 once. The shapes and the memory they need are checked from the header, before
// any tensor is read; NaN and Inf in the file are refused, and read_as refuses a finite value that
// bf16 cannot hold.
FfnProblem load_problem(const std::string& path, bool activations_on_host) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(path);
  for (const char* name : {"x", "up", "down"})
    TWELL_REQUIRE(f.has(name), path, ": no tensor '", name, "' (--from needs x [M, H], up and down [I, H], "
                "and gate [I, H] for a gated FFN)");
  const bool gated = f.has("gate");
  const Shape& xs = f.info("x").shape;
  TWELL_REQUIRE(xs.size() == 2, path, ": x must be [M, H], got ", shape_str(xs));
  const int64_t M = xs[0], H = xs[1];
  const Shape& us = f.info("up").shape;
  TWELL_REQUIRE(us.size() == 2, path, ": up must be [I, H], got ", shape_str(us));
  const int64_t I = us[0];
  TWELL_REQUIRE(M >= 1 && H >= 1 && I >= 1, path, ": --from needs at least one token, one input and one neuron: x is ",
                shape_str(xs), ", up ", shape_str(us));
  for (const char* name : {"gate", "up", "down"}) {
    if (!f.has(name)) continue;
    const Shape& ws = f.info(name).shape;
    TWELL_REQUIRE(ws.size() == 2 && ws[1] == H, path, ": x is ", shape_str(xs), " but ", name, " is ", shape_str(ws),
                  ": a weight must be [I, H] with x's H = ", H,
                  std::string(name) == "down" ? " (down neuron-major: the transpose of down_proj.weight)" : "");
    TWELL_REQUIRE(ws[0] == I, path, ": up is ", shape_str(us), " but ", name, " is ", shape_str(ws),
                  ": the weights' I differ");
  }
  check_host_memory({M}, H, I, gated, activations_on_host, "from " + path, 0, 1);
  for (const char* name : {"x", "gate", "up", "down"})
    if (f.has(name)) f.check_finite(name);  // a NaN would fail every correctness check anyway: say why
  FfnProblem p;  // read_as refuses a finite value that bf16, the dtype the benchmark runs in, cannot hold
  p.ffn.x = f.read_as("x", DType::bf16);
  p.ffn.wu = f.read_as("up", DType::bf16);
  p.ffn.wd = f.read_as("down", DType::bf16);
  if (gated) p.ffn.wg = f.read_as("gate", DType::bf16);
  p.ffn.spec = SyntheticSpec{M, H, I, 0.0, Distribution::uniform, gated, 0};
  const size_t slash = path.find_last_of('/');
  p.distribution = "file:" + path.substr(slash == std::string::npos ? 0 : slash + 1);
  return p;
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char* timing_name(Timing t) { return t == Timing::gpu ? "gpu" : "host"; }

// Every value a case will use, checked before the first case runs (a bad one found at case 7 of
// 12 would throw away minutes of results), in the options' own names.
static void check_config(const FfnBenchConfig& cfg) {
  for (int64_t M : cfg.tokens) TWELL_REQUIRE(M >= 1, "-M must be at least 1, got ", M);
  for (double d : cfg.densities)  // 0 would time an FFN of zeros
    TWELL_REQUIRE(d > 0 && d <= 1, "-d must be a density in (0, 1], got ", d);
  if (cfg.from_file.empty())
    TWELL_REQUIRE(cfg.H >= 3 && cfg.I >= 1, "-H must be at least 3 and -I at least 1, got ", cfg.H, " and ", cfg.I);
  TWELL_REQUIRE(cfg.tile >= 0 && cfg.tile <= 65536, "--tile must be 0 (the FFN's default) or in [1, 65536], got ",
                cfg.tile);
  TWELL_REQUIRE(cfg.compression >= 1 && cfg.compression <= 65536, "--compression must be at least 1, got ",
                cfg.compression);
  TWELL_REQUIRE(cfg.tile == 0 || cfg.tile % cfg.compression == 0, "--compression must divide --tile (", cfg.tile,
                "), got ", cfg.compression);
  TWELL_REQUIRE(std::isfinite(cfg.l1) && cfg.l1 >= 0, "--l1 must be finite and >= 0, got ", cfg.l1);
}

// Densities a synthetic distribution cannot give (skewed's dead neurons cap it; the cap is lower at
// a small -I), checked for the densities the run will use, the backend's defaults included.
static void check_densities_reachable(const FfnBenchConfig& cfg, const std::vector<double>& densities,
                                      const std::vector<Distribution>& distributions) {
  for (const Distribution dist : distributions) {
    const double most = max_synthetic_density({1, cfg.H, cfg.I, 0, dist, cfg.gated, cfg.seed});
    char most_text[32];
    std::snprintf(most_text, sizeof most_text, "%.4f", std::floor(most * 1e4) / 1e4);
    for (double d : densities)
      TWELL_REQUIRE(d <= most || d == 1, "-d ", d, " is more than --distribution ", distribution_name(dist),
                    " gives at -I ", cfg.I, ": at most ", most_text,
                    " (", kDeadNeurons * 100, "% of its neurons never fire, the others at most ", kMaxRate * 100,
                    "% of the time), or 1; use --distribution uniform for denser cases");
  }
}

std::vector<BenchRecord> run_ffn_bench(const FfnBenchConfig& asked, std::ostream& progress,
                                       std::vector<BenchRecord>* finished) {
  check_config(asked);
  // What the backend says of itself is shown once the options are known to be good: an error
  // alone on stderr otherwise.
  std::ostringstream backend_notes;
  std::string no_gpu;
  std::unique_ptr<FfnBackend> backend = pick_backend(asked.backend, backend_notes, no_gpu);
  return run_ffn_bench_on(*backend, asked, progress, finished, backend_notes.str(), no_gpu);
}

std::vector<BenchRecord> run_ffn_bench_on(FfnBackend& backend_ref, const FfnBenchConfig& asked, std::ostream& progress,
                                          std::vector<BenchRecord>* finished, const std::string& backend_notes,
                                          const std::string& no_gpu) {
  check_config(asked);
  FfnBenchConfig cfg = asked;  // with the tile width chosen, once I is known
  FfnBackend* const backend = &backend_ref;
  TWELL_REQUIRE(!cfg.train || backend->train_available(), "--train needs the CUDA backend (a Hopper GPU)",
                no_gpu.empty() ? "" : ": " + no_gpu);
  TWELL_REQUIRE(!cfg.split || !cfg.train, "--split times the forward only: not with --train");
  TWELL_REQUIRE(!cfg.split || backend->train_available(), "--split needs the CUDA backend (a Hopper GPU)",
                no_gpu.empty() ? "" : ": " + no_gpu);
  // Each case once, in the order given (-M 16 -M 16 is one case, and so for -d and --distribution).
  auto once = [](auto values) {
    auto end = values.begin();
    for (auto it = values.begin(); it != values.end(); ++it)
      if (std::find(values.begin(), end, *it) == end) *end++ = *it;
    values.erase(end, values.end());
    return values;
  };
  const auto tokens = once(cfg.tokens.empty() ? backend->default_tokens() : cfg.tokens);
  const auto densities = once(cfg.densities.empty() ? backend->default_densities() : cfg.densities);
  const auto distributions = once(cfg.distributions);
  TWELL_REQUIRE(cfg.warmup >= -1 && (cfg.iters == -1 || cfg.iters >= 1), "--warmup must be >= 0 and --iters >= 1, got ",
              cfg.warmup, " and ", cfg.iters);  // -1: the backend's default
  const int warmup = cfg.warmup >= 0 ? cfg.warmup : backend->default_warmup();
  const int iters = cfg.iters > 0 ? cfg.iters : backend->default_iters();
  const bool from_file = !cfg.from_file.empty();
  const Timing timing_asked = backend->timing_used(cfg.train ? Timing::host : cfg.timing);
  TWELL_REQUIRE(!cfg.timing_given || cfg.train || timing_asked == cfg.timing, "--timing ", timing_name(cfg.timing),
                ": this backend times every call from the host (--timing host); the GPU's timing needs the CUDA "
                "backend");
  TWELL_REQUIRE(!from_file || (cfg.tokens.empty() && cfg.densities.empty()),
              "--from takes M, H, I and the density from the file; drop -M and -d");
  auto choose_tile = [&] {
    if (cfg.tile != 0) return;
    cfg.tile = default_ffn_tile(cfg.compression, cfg.train);
    TWELL_REQUIRE(cfg.tile % cfg.compression == 0, "--compression must divide the tile width (", cfg.tile,
                  ", the default here: give --tile), got ", cfg.compression);
  };
  // The memory first: the reach check draws I-sized rates, minutes at a mistyped -I.
  if (!from_file) {
    choose_tile();
    check_host_memory(tokens, cfg.H, cfg.I, cfg.gated, backend->activations_on_host(), "-M, -H, -I", cfg.tile,
                      cfg.compression);
    check_densities_reachable(cfg, densities, distributions);
  }
  if (cfg.energy) {
    std::string why;
    TWELL_REQUIRE(backend->energy_available(&why), "--energy: ", why, no_gpu.empty() ? "" : ": " + no_gpu);
    TWELL_REQUIRE(cfg.energy_seconds >= 0.5 && cfg.energy_seconds <= 60, "--energy-seconds must be in [0.5, 60], got ",
                  cfg.energy_seconds, " (the H200's energy counter moves every 100 ms)");
  }

  std::optional<FfnProblem> given;  // --from's tensors, read and checked before anything is said
  if (from_file) {
    given = load_problem(cfg.from_file, backend->activations_on_host());
    const SyntheticSpec& g = given->ffn.spec;
    choose_tile();
    check_host_memory({g.M}, g.H, g.I, g.gated, backend->activations_on_host(), "from " + cfg.from_file, cfg.tile,
                      cfg.compression);
  }
  progress << backend_notes;

  std::vector<BenchRecord> records;
  const size_t n_cases = from_file ? 1 : tokens.size() * densities.size() * distributions.size();
  for (size_t case_no = 1; case_no <= n_cases; ++case_no) {
        FfnProblem p;
        // The case said before it is made (a skewed problem's rates take a while at a large -I).
        auto announce = [&](int64_t M, const std::string& what) {
          if (backend->slow())
            progress << "[" << case_no << "/" << n_cases << "] M=" << M << what << ": checking against float64, then "
                     << warmup << " + " << iters << " runs of each implementation ..." << std::endl;
        };
        if (from_file) {
          p = std::move(*given);
          announce(p.ffn.spec.M, " from " + cfg.from_file);
        } else {
          const size_t c = case_no - 1, n_dist = distributions.size(), n_dens = densities.size();
          const Distribution dist = distributions[c % n_dist];
          const SyntheticSpec spec{tokens[c / (n_dist * n_dens)], cfg.H, cfg.I, densities[(c / n_dist) % n_dens], dist,
                                   cfg.gated, cfg.seed};
          announce(spec.M, str(" density=", spec.density * 100, "% ", distribution_name(dist)));
          p.ffn = make_synthetic_ffn(spec);
          p.distribution = distribution_name(dist);
          p.density = spec.density;
          const size_t x_bytes = p.ffn.x.nbytes();
          const size_t sets =
              std::clamp<size_t>(backend->rotate_below_bytes() / std::max<size_t>(x_bytes, 1) + 1, 1, 8);
          for (size_t s = 1; s < sets; ++s)
            p.extra_token_sets.push_back(make_synthetic_tokens(spec, cfg.seed * 1000 + s));
        }
        p.case_id = static_cast<int64_t>(case_no);
        const int64_t M = p.ffn.spec.M, H = p.ffn.spec.H, I = p.ffn.spec.I;

        // Reference: float64 FFN on sampled rows of token set 0.
        const TwellOccupancy occ = backend->occupancy(p, cfg, 0);
        if (from_file) p.density = double(occ.nnz) / double(M * I);
        // The records' non-zero counts are those of every token set the timed calls rotate through (up to
        // 8 at small M: at M = 1, one token's count alone said little of the eight timed).
        int64_t nnz_timed = occ.nnz, max_row_timed = occ.max_row_count;
        for (int set = 1; set < p.n_token_sets(); ++set) {
          const TwellOccupancy o = backend->occupancy(p, cfg, set);
          nnz_timed += o.nnz;
          max_row_timed = std::max(max_row_timed, o.max_row_count);
        }
        const double tokens_timed = double(M) * p.n_token_sets();
        const double asked_nnz = p.density * double(I), got_nnz = double(nnz_timed) / tokens_timed;
        // (a few thousand tokens or more: skewed's rare hot tokens make a short batch's mean wander)
        if (!from_file && (M >= 2048 || H < 64) && asked_nnz * double(M) >= 1000 &&
            std::abs(got_nnz - asked_nnz) > 0.15 * asked_nnz)
          progress << "note: case " << case_no << "'s activations hold " << fixed1(got_nnz)
                   << " non-zeros a token, not the " << fixed1(asked_nnz) << " asked"
                   << (H < 64 ? str(" (at -H ", H, " the synthetic gate's few columns miss its normal tail)") : "")
                   << "; the table's density column is the one asked, nnz/token the one measured" << std::endl;
        const auto rows = sample_rows(M, occ);
        const Tensor x_sample = gather_rows(p.ffn.x, rows);
        Tensor y_ref = Tensor::of<double>({static_cast<int64_t>(rows.size()), H});
        cpu::ffn_forward(x_sample, p.ffn.weights(), y_ref, Precision::f64);

        // --train: an upstream gradient, and float64 references for dx on the sampled tokens and for
        // the weight gradients on sampled neurons (a neuron's rows of dWg, dWu, dWd depend on its
        // own weights only, so the FFN restricted to those neurons gives them exactly).
        Tensor dy;
        std::vector<int64_t> neurons;
        std::vector<Tensor> grad_ref;  // dx rows, dWg rows, dWu rows, dWd rows
        if (cfg.train) {
          TWELL_REQUIRE(p.ffn.spec.gated, "--train: only the gated FFN has a backward so far");
          dy = make_synthetic_tokens(p.ffn.spec, cfg.seed * 7919 + 3);
          for (int64_t i = 0; i < 16; ++i) neurons.push_back(i * (I - 1) / 15);
          neurons.erase(std::unique(neurons.begin(), neurons.end()), neurons.end());
          const int64_t S = static_cast<int64_t>(neurons.size());
          const Tensor wg_s = gather_rows(p.ffn.wg, neurons), wu_s = gather_rows(p.ffn.wu, neurons),
                       wd_s = gather_rows(p.ffn.wd, neurons);
          grad_ref.emplace_back(DType::f64, Shape{static_cast<int64_t>(rows.size()), H});
          for (int k = 0; k < 3; ++k) grad_ref.emplace_back(DType::f64, Shape{S, H});
          cpu::ffn_backward(x_sample, p.ffn.weights(), gather_rows(dy, rows), cfg.l1, {grad_ref[0], {}, {}, {}},
                            Precision::f64);
          cpu::ffn_backward(p.ffn.x, {wg_s, wu_s, wd_s}, dy, cfg.l1, {{}, grad_ref[1], grad_ref[2], grad_ref[3]},
                            Precision::f64);
        }

        std::vector<FfnRunner> runners = cfg.train ? backend->train_runners(p, cfg, dy) : backend->runners(p, cfg);
        std::vector<BenchRecord> recs(runners.size());
        std::vector<std::vector<double>> errs(runners.size());  // y, then (train) dx, dWg, dWu, dWd
        std::vector<std::string> unwritten(runners.size());     // a non-finite output element, or ""
        for (size_t i = 0; i < runners.size(); ++i) {
          BenchRecord& r = recs[i];
          r.impl = runners[i].impl;
          r.gpu = backend->device_name();
          r.M = M, r.H = H, r.I = I;
          r.distribution = p.distribution;
          r.density = p.density;
          r.nnz_per_token_mean = got_nnz;
          r.nnz_per_token_max = max_row_timed;
          r.commit = TWELL_GIT_SHA;
          r.command = cfg.command;
          // Correctness first: a case that fails is reported, never timed. The checked run is one
          // the timed calls resemble (after a first call where dispatch depends on it), and writes
          // into poisoned outputs.
          if (cfg.train) r.bench = "ffn_train";
          if (backend->stateful()) runners[i].run(0);
          if (runners[i].poison) runners[i].poison();
          runners[i].run(0);
          const Tensor y = runners[i].output();
          errs[i].push_back(relative_error(gather_rows(y, rows), y_ref));
          unwritten[i] = check_all_written("y", y);
          if (cfg.train) {
            const std::vector<Tensor> g = runners[i].grads();
            errs[i].push_back(relative_error(gather_rows(g[0], rows), grad_ref[0]));
            for (int k = 1; k < 4; ++k) errs[i].push_back(relative_error(gather_rows(g[k], neurons), grad_ref[k]));
            static constexpr const char* kGrad[] = {"dx", "dWg", "dWu", "dWd"};
            for (int k = 0; k < 4 && unwritten[i].empty(); ++k) unwritten[i] = check_all_written(kGrad[k], g[k]);
          }
          if (runners[i].note) r.note = runners[i].note();
          if (!cfg.train && !r.note.empty())
            progress << "note: case " << case_no << ", " << r.impl << ": " << r.note << std::endl;
          r.rel_err = unwritten[i].empty() ? *std::max_element(errs[i].begin(), errs[i].end()) : INFINITY;
        }
        const double dense_err = recs[0].rel_err;
        for (size_t i = 0; i < recs.size(); ++i) {
          BenchRecord& r = recs[i];
          r.dense_rel_err = dense_err;
          // bf16 outputs: the dense pipeline lands near 4e-3; a fused kernel may be 2x as far. Each
          // quantity (y, and with --train every gradient) against the dense pipeline's own error.
          bool ok = std::isfinite(r.rel_err);
          std::string why = unwritten[i];
          for (size_t k = 0; k < errs[i].size(); ++k) {
            // Twice the dense pipeline's error, and never more than twice the bound dense itself has
            // to meet (a broken baseline must not let the others through).
            const double bound = i == 0 ? 2e-2 : std::min(std::max(2 * errs[0][k], 1e-5), 4e-2);
            static constexpr const char* kQuantity[] = {"y", "dx", "dWg", "dWu", "dWd"};  // errs[i][k]'s
            if (!(errs[i][k] <= bound))
              ok = false, why += str(why.empty() ? "" : "; ", kQuantity[k], " rel_err ", errs[i][k],
                                     " above the bound ", bound);
          }
          if (cfg.train) {
            char e[160];
            std::snprintf(e, sizeof e, "rel_err y %.2e dx %.2e dWg %.2e dWu %.2e dWd %.2e", errs[i][0], errs[i][1],
                          errs[i][2], errs[i][3], errs[i][4]);
            r.note = r.note.empty() ? std::string(e) : std::string(e) + "; " + r.note;
          }
          r.correct = ok;
          if (!ok) r.note = r.note.empty() ? why : why + "; " + r.note;
        }

        // Timing: warm-up, then interleaved runs over rotating token sets, the implementations in
        // a fresh random order every iteration, so that none always follows the same neighbour
        // (with a fixed order, twell's dense fallback always ran right after the unfused dense FFN
        // and measured 3-7% slower than the identical dense_cublas at M = 131072).
        // A case whose calls turn out not to allow Timing::gpu (one outlasted the hold: it synchronised
        // inside, or the host stalled) is timed again as asked, then, failing again, with the timing the
        // backend falls back to, so that no case mixes the two. The next case starts as asked: one stall
        // does not move the rest of the run to host timing.
        std::vector<std::vector<double>> times;
        // A backward grows its buffers to the largest count of non-zeros it has met (a cudaFree and a
        // cudaMalloc): the warm-up runs every token set, so that no timed call meets a new largest.
        const int case_warmup = cfg.train ? std::max(warmup, p.n_token_sets()) : warmup;
        Timing timing = timing_asked;
        backend->reset_timing();
        if (cfg.energy) backend->meter_start();  // the clock the interleaved timing ran at
        for (int attempt = 1;; ++attempt) {
          times.assign(runners.size(), {});
          std::vector<size_t> order(runners.size());
          std::iota(order.begin(), order.end(), size_t{0});
          std::mt19937 shuffle_rng(static_cast<uint32_t>(cfg.seed));
          for (int it = -case_warmup; it < iters; ++it) {
            std::shuffle(order.begin(), order.end(), shuffle_rng);
            for (size_t i : order) {
              if (!recs[i].correct) continue;
              const int set = static_cast<int>((it + case_warmup) % p.n_token_sets());
              const double ms = backend->time_ms([&] { runners[i].run(set); }, timing);
              if (it >= 0) times[i].push_back(ms);
            }
          }
          const Timing used = backend->timing_used(timing);
          if (used == timing) break;
          if (attempt == 1) {
            progress << "a timed call outlasted the hold on the GPU's stream (the host stalled, or the call "
                        "synchronised inside): timing the case again"
                     << std::endl;
            backend->reset_timing();
            continue;
          }
          progress << "a timed call outlasted the hold again, so this case is timed from an idle GPU (--timing "
                   << timing_name(used) << ")" << std::endl;
          timing = used;
        }
        for (BenchRecord& r : recs) {
          r.timing = timing_name(timing);
          r.gated = p.ffn.spec.gated ? 1 : 0;
          r.tile = cfg.tile, r.compression = cfg.compression;
          r.warmup = case_warmup, r.iters = iters;
        }
        for (size_t i = 0; i < runners.size(); ++i) {
          if (!recs[i].correct) continue;
          recs[i].ms_median = median(times[i]);
          recs[i].ms_min = *std::min_element(times[i].begin(), times[i].end());
          recs[i].ms_max = *std::max_element(times[i].begin(), times[i].end());
        }
        for (BenchRecord& r : recs)
          r.ratio_to_dense = r.correct && recs[0].correct ? r.ms_median / recs[0].ms_median : NAN;
        // --energy: each implementation back to back, after all of them were timed (so that the
        // interleaved timing above does not see one's heat more than another's), in order and then
        // in reverse (the board heats over the stretches: each one's mean place is the same).
        MeterReading mix;  // during the interleaved timing
        if (cfg.energy) {
          mix = backend->meter_stop();
          std::vector<FfnBackend::EnergySums> sums(runners.size());
          std::vector<size_t> order(runners.size());
          std::iota(order.begin(), order.end(), size_t{0});
          for (int pass = 0; pass < 2; ++pass, std::reverse(order.begin(), order.end()))
            for (size_t i : order)
              if (recs[i].correct)
                sums[i].add(backend->sustained([&](int call) { runners[i].run(call % p.n_token_sets()); },
                                               cfg.energy_seconds));
          for (size_t i = 0; i < runners.size(); ++i) {
            if (!recs[i].correct) continue;
            recs[i].ms_sustained = sums[i].ms_per_call();
            if (sums[i].mj_per_call() > 0)
              recs[i].energy_mj_per_token = sums[i].mj_per_call() / static_cast<double>(recs[i].M);
            recs[i].sm_clock_mhz = sums[i].meter.mhz();
            recs[i].power_capped = sums[i].meter.capped();
          }
        }

        progress << "[" << case_no << "/" << n_cases << "] M=" << M << " density=" << p.density * 100 << "% "
                 << p.distribution << " (" << std::fixed << std::setprecision(1) << recs[0].nnz_per_token_mean << " nnz/token):";
        for (const BenchRecord& r : recs) {
          progress << "  " << r.impl << " ";
          if (r.correct)
            progress << std::setprecision(3) << r.ms_median << " ms";
          else
            progress << "FAILED (not timed)";
          if (r.energy_mj_per_token >= 0) progress << " (" << std::setprecision(4) << r.energy_mj_per_token << " mJ/token)";
        }
        if (mix.mhz() >= 0)
          progress << "; timed interleaved at " << std::setprecision(0) << mix.mhz() << " MHz, "
                   << 100 * mix.capped() << "% at the power cap";
        progress << std::defaultfloat << std::setprecision(6) << std::endl;  // the stream's defaults again
        records.insert(records.end(), recs.begin(), recs.end());
        if (finished) finished->insert(finished->end(), recs.begin(), recs.end());
      }
  return records;
}

void print_table(const std::vector<BenchRecord>& records, std::ostream& out) {
  // --energy's columns where a record has them.
  const bool energy = std::any_of(records.begin(), records.end(), [](const BenchRecord& r) { return r.ms_sustained >= 0; });
  int dist_w = 8;  // --from's "file:NAME" can be longer than uniform / skewed
  for (const BenchRecord& r : records)
    dist_w = std::max(dist_w, static_cast<int>(std::min<size_t>(r.distribution.size(), 64)));
  char line[400];
  std::snprintf(line, sizeof line, "%-8s %6s %6s %7s %-*s %9s %8s %-16s %10s %8s %9s %s", "M", "H", "I", "density",
                dist_w, "dist", "nnz/tok", "max", "impl", "ms(median)", "x dense", "rel_err", "ok");
  out << line;
  if (energy) {  // after "ok" padded as the rows' "yes" / "FAILED" are
    std::snprintf(line, sizeof line, "%-4s %10s %9s %7s %7s", "", "sustained", "mJ/token", "SM MHz", "capped");
    out << line;
  }
  out << "\n";
  for (const BenchRecord& r : records) {
    char ms[24] = "-", ratio[24] = "-";  // a failed implementation is not timed
    if (r.correct) {
      std::snprintf(ms, sizeof ms, "%.3f", r.ms_median);
      if (std::isfinite(r.ratio_to_dense)) std::snprintf(ratio, sizeof ratio, "%.3f", r.ratio_to_dense);
    }
    std::snprintf(line, sizeof line, "%-8lld %6lld %6lld %6.2f%% %-*.*s %9.1f %8lld %-16s %10s %8s %9.2e %-*s",
                  static_cast<long long>(r.M), static_cast<long long>(r.H), static_cast<long long>(r.I),
                  r.density * 100, dist_w, dist_w, r.distribution.c_str(), r.nnz_per_token_mean,
                  static_cast<long long>(r.nnz_per_token_max), r.impl.c_str(), ms, ratio, r.rel_err, energy ? 6 : 0,
                  r.correct ? "yes" : "FAILED");
    out << line;
    if (energy) {
      char sustained[16] = "n/a", mj[16] = "n/a", mhz[16] = "n/a", capped[16] = "n/a";  // not measured
      if (r.ms_sustained >= 0) std::snprintf(sustained, sizeof sustained, "%.3f", r.ms_sustained);
      if (r.energy_mj_per_token >= 0) std::snprintf(mj, sizeof mj, "%.4f", r.energy_mj_per_token);
      if (r.sm_clock_mhz >= 0) std::snprintf(mhz, sizeof mhz, "%.0f", r.sm_clock_mhz);
      if (r.power_capped >= 0) std::snprintf(capped, sizeof capped, "%.0f%%", 100 * r.power_capped);
      std::snprintf(line, sizeof line, " %10s %9s %7s %7s", sustained, mj, mhz, capped);
      out << line;
    }
    out << "\n";
  }
}

static nlohmann::ordered_json number_or_null(double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(); }

std::string records_to_json(const std::vector<BenchRecord>& records) {
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const BenchRecord& r : records) {
    nlohmann::ordered_json j;
    j["bench"] = r.bench;
    j["impl"] = r.impl;
    j["gpu"] = r.gpu;
    j["M"] = r.M;
    j["H"] = r.H;
    j["I"] = r.I;
    j["layers"] = r.layers > 0 ? nlohmann::ordered_json(r.layers) : nlohmann::ordered_json();
    j["distribution"] = r.distribution;
    j["density"] = r.density;
    j["nnz_per_token_mean"] = r.nnz_per_token_mean;
    j["nnz_per_token_max"] = r.nnz_per_token_max;
    j["ms_median"] = r.correct ? number_or_null(r.ms_median) : nlohmann::ordered_json();
    j["ms_min"] = r.correct ? number_or_null(r.ms_min) : nlohmann::ordered_json();
    j["ms_max"] = r.correct ? number_or_null(r.ms_max) : nlohmann::ordered_json();
    j["ratio_to_dense"] = r.correct ? number_or_null(r.ratio_to_dense) : nlohmann::ordered_json();
    j["rel_err"] = number_or_null(r.rel_err);
    j["dense_rel_err"] = number_or_null(r.dense_rel_err);
    j["correct"] = r.correct;
    j["tokens_per_ms"] = r.tokens_per_ms >= 0 && r.correct ? number_or_null(r.tokens_per_ms) : nlohmann::ordered_json();
    j["peak_mem_bytes"] = r.peak_mem_bytes >= 0 ? nlohmann::ordered_json(r.peak_mem_bytes) : nlohmann::ordered_json();
    j["energy_mj_per_token"] =
        r.energy_mj_per_token >= 0 && r.correct ? number_or_null(r.energy_mj_per_token) : nlohmann::ordered_json();
    if (r.ms_sustained >= 0) j["ms_sustained"] = number_or_null(r.ms_sustained);
    if (r.sm_clock_mhz >= 0) j["sm_clock_mhz"] = number_or_null(r.sm_clock_mhz);
    if (r.power_capped >= 0) j["power_capped"] = number_or_null(r.power_capped);
    if (!r.timing.empty()) j["timing"] = r.timing;
    if (r.gated >= 0) j["gated"] = r.gated == 1;
    if (r.tile > 0) j["tile"] = r.tile, j["compression"] = r.compression;
    if (r.iters >= 0) j["warmup"] = r.warmup, j["iters"] = r.iters;
    if (!r.note.empty()) j["note"] = r.note;
    j["commit"] = r.commit;
    j["command"] = r.command;
    all.push_back(std::move(j));
  }
  // The command's bytes that are not UTF-8 (a path's) become U+FFFD: dump() would throw, the run lost.
  return all.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void write_records(const std::vector<BenchRecord>& records, const std::string& path) {
  write_json_file(path, records_to_json(records));
}

void write_json_file(const std::string& path, const std::string& text) { io::detail::write_file_atomically(path, text); }

void check_records_path(const std::string& path, const std::vector<std::pair<std::string, std::string>>& inputs) {
  if (path.empty()) return;
  struct stat st;
  TWELL_REQUIRE(path.back() != '/' && !(::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)), "--json ", path,
                ": is a directory; name a file");
  for (const auto& [input, what] : inputs) {
    struct stat in;  // the same file by another name (a link, a relative path) too
    TWELL_REQUIRE(input.empty() || ::stat(path.c_str(), &st) != 0 || ::stat(input.c_str(), &in) != 0 ||
                      st.st_dev != in.st_dev || st.st_ino != in.st_ino,
                  "--json ", path, " is ", what, " ", input, ": the results would overwrite it");
  }
  try {
    io::detail::AtomicFile probe(path);  // creates the temporary next to `path`; removed, as it is never committed
  } catch (const Error& e) {
    throw Error(str("--json ", e.what()));
  }
}

void save_records(const std::vector<BenchRecord>& records, const std::string& path, std::ostream& out,
                  const char* which) {
  if (path.empty()) return;
  write_records(records, path);
  out << "wrote " << records.size() << " records" << which << " to " << path << "\n";
}

std::vector<BenchRecord> run_saving_records(const std::function<void(std::vector<BenchRecord>*)>& run,
                                            const std::string& json_path, std::ostream& out, std::ostream& err) {
  std::vector<BenchRecord> records;
  try {
    run(&records);
  } catch (const std::exception&) {
    if (records.empty()) throw;
    try {
      print_table(records, out);
      save_records(records, json_path, out, " of the cases done before the error");
    } catch (const std::exception& e) {  // the case's error is the one to report
      err << "could not save the finished cases: " << e.what() << "\n";
    }
    throw;
  }
  print_table(records, out);
  save_records(records, json_path, out);
  return records;
}

}  // namespace twell::bench
