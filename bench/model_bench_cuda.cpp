// `twell bench model` (bench/model_bench.h): the synthetic model, its gate calibration, the CPU
// reference check, and prefill/decode timing of the dense and the twell FFN in one process.
#include "model_bench.h"
#include "gpu_meter.h"
#include "progress.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <ostream>
#include <random>
#include <thread>

#include "twell_git_sha.h"

#if defined(TWELL_WITH_CUDA)
#include "cuda/cublaslt_gemm.h"
#include "cuda/cudnn_sdpa.h"
#include "cuda/kernels.h"
#include "twell/bf16.h"
#include "twell/cuda/llama.h"
#endif

namespace twell::bench {

void print_model_table(const std::vector<BenchRecord>& records, std::ostream& out) {
  // The name columns as wide as their longest entry (twell_no_gather, model_ragged), so the figures line up.
  int bench_w = 14, impl_w = 6;
  for (const BenchRecord& r : records) {
    bench_w = std::max(bench_w, static_cast<int>(r.bench.size()));
    impl_w = std::max(impl_w, static_cast<int>(r.impl.size()));
  }
  char line[320];
  std::snprintf(line, sizeof line, "%-*s %-*s %7s %7s %10s %8s %11s %9s %10s %7s %7s %9s %s\n", bench_w, "bench",
                impl_w, "impl", "tokens", "nnz/tok", "ms(median)", "x dense", "tokens/ms", "mem GB", "mJ/token",
                "SM MHz", "capped", "rel_err", "ok");
  out << line;
  for (const BenchRecord& r : records) {
    char mhz[16] = "n/a", capped[16] = "n/a", energy[16] = "n/a";  // NVML could not tell
    if (r.sm_clock_mhz >= 0) std::snprintf(mhz, sizeof mhz, "%.0f", r.sm_clock_mhz);
    if (r.power_capped >= 0) std::snprintf(capped, sizeof capped, "%.0f%%", 100 * r.power_capped);
    if (r.energy_mj_per_token >= 0) std::snprintf(energy, sizeof energy, "%.3f", r.energy_mj_per_token);
    // A record that failed its check has no time, ratio or rate to show (as the JSON's nulls).
    char ms[24] = "-", ratio[24] = "-", rate[24] = "-", mem[24] = "-";
    if (r.correct) {
      std::snprintf(ms, sizeof ms, "%.3f", r.ms_median);
      if (std::isfinite(r.ratio_to_dense)) std::snprintf(ratio, sizeof ratio, "%.3f", r.ratio_to_dense);
      std::snprintf(rate, sizeof rate, "%.2f", r.tokens_per_ms);
    }
    if (r.peak_mem_bytes >= 0) std::snprintf(mem, sizeof mem, "%.1f", r.peak_mem_bytes / 1e9);
    std::snprintf(line, sizeof line, "%-*s %-*s %7lld %7.1f %10s %8s %11s %9s %10s %7s %7s %9.2e %s\n", bench_w,
                  r.bench.c_str(), impl_w, r.impl.c_str(), static_cast<long long>(r.M), r.nnz_per_token_mean, ms,
                  ratio, rate, mem, energy, mhz, capped, r.rel_err, r.correct ? "yes" : "FAILED");
    out << line;
  }
}

#if !defined(TWELL_WITH_CUDA)

std::vector<BenchRecord> run_model_bench(const ModelBenchConfig&, std::ostream&, std::string*) {
  throw Error("twell bench model needs the CUDA backend: this build has none (configure with -DTWELL_CUDA=ON)");
}

#else

namespace {

using Clock = std::chrono::steady_clock;
using cuda::LlamaCuda;
using cuda::LlamaCudaOptions;
using cuda::LlamaCudaWeights;

constexpr float kConstantChannel = 4.0f;  // residual channel 0: the gates' "bias input"
constexpr int64_t kGatherTokens = 8;      // the gather path's batch limit for twell_gather and the check
constexpr int64_t kEnergyContext = 128;   // decode positions for the energy stretches, beyond the timed steps
constexpr int64_t kUntimedSteps = 4;      // decode: eager twice, the graph's capture, a checked replay
constexpr double kEnergyStretchMs = 500;  // an energy stretch of decode steps, at most
constexpr int kEnergyStretches = 8;       // stretches a model runs at most (until its power is measured over 1 s)

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

uint16_t* bits(const cuda::DeviceTensor& t) { return static_cast<uint16_t*>(t.view().data); }

io::ModelConfig model_config(const ModelBenchConfig& cfg) {
  io::ModelConfig c;
  c.hidden_size = cfg.hidden;
  c.intermediate_size = cfg.ffn;
  c.num_hidden_layers = cfg.layers;
  c.num_attention_heads = cfg.heads;
  c.num_key_value_heads = cfg.kv_heads;
  TWELL_REQUIRE(cfg.heads > 0, "--heads must be positive, got ", cfg.heads);
  TWELL_REQUIRE(cfg.hidden % cfg.heads == 0, "--heads ", cfg.heads, " must divide --hidden ", cfg.hidden);
  c.head_dim = cfg.hidden / cfg.heads;
  c.vocab_size = cfg.vocab;
  int64_t ctx = std::max(cfg.seq, cfg.check_tokens);
  if (!cfg.decode_batches.empty()) ctx = std::max(ctx, cfg.context + kUntimedSteps + cfg.steps + kEnergyContext);
  ctx = std::max(ctx, cfg.long_prompt);
  for (const int64_t n : cfg.turns) ctx = std::max(ctx, cfg.turn_context + n);
  c.max_position_embeddings = ctx;
  c.rope_theta = 1e5;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.hidden_act = "relu";
  c.torch_dtype = "bfloat16";
  c.validate("bench model (--layers, --hidden, --intermediate, --heads, --kv-heads, --vocab)");
  return c;
}

// Random weights on the device. Channel 0 of the residual stream is the constant
// kConstantChannel (the gates' bias input, thresholds in Wg's column 0), and channels
// [0, kTokenChannels) are written by the embedding only (attention and the FFN never write them).
// The gates read those channels at full weight and the rest at kContextWeight: which neurons fire
// then depends mostly on the token and a little on its context. Gates that read the whole
// residual stream at full weight are unstable: thresholds calibrated on one sequence gave the
// same density on that sequence only; on any other one the deeper layers fired 20-30% of their
// neurons (a little more output from one layer grows the next layer's inputs, whose 0.5% tail
// then holds far more; measured ~1500 non-zeros per token by layer 37, docs/perf.md).
constexpr int64_t kTokenChannels = 256;
constexpr double kContextWeight = 0.01;

std::shared_ptr<LlamaCudaWeights> make_weights(const io::ModelConfig& c, uint64_t seed) {
  auto w = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::allocate(c));
  const int64_t H = c.hidden_size, I = c.intermediate_size, q_dim = c.num_attention_heads * c.head_dim;
  const int64_t E = std::min(kTokenChannels, H / 2);
  auto uniform_block = [&](uint16_t* p, int64_t rows, int64_t cols, int64_t ld, double stddev) {
    const auto a = static_cast<float>(stddev * std::sqrt(3.0));  // uniform with this standard deviation
    cuda::fill_uniform_bf16(p, rows, cols, ld, -a, a, seed++, nullptr);
  };
  auto uniform = [&](const cuda::DeviceTensor& t, double stddev) {
    const int64_t cols = t.view().shape.back(), rows = t.view().numel() / cols;
    uniform_block(bits(t), rows, cols, cols, stddev);
  };
  auto constant = [](uint16_t* p, int64_t rows, int64_t cols, int64_t ld, float v) {
    cuda::fill_uniform_bf16(p, rows, cols, ld, v, v, 0, nullptr);
  };
  uniform(w->embed, 1.0);
  constant(bits(w->embed), c.vocab_size, 1, H, kConstantChannel);
  for (cuda::LlamaCudaLayer& l : w->layers) {
    constant(bits(l.input_norm), 1, H, H, 1.f);
    constant(bits(l.post_norm), 1, H, H, 1.f);
    uniform(l.wqkv, 1.0 / std::sqrt(double(H)));
    uniform(l.wo, 1.0 / std::sqrt(double(q_dim)));
    constant(bits(l.wo), E, q_dim, q_dim, 0.f);  // attention never writes the token channels
    // Gates: the token channels at full weight, the others at kContextWeight (the norm of a row
    // as if it read H channels at 1/sqrt(H)), column 0 the threshold, calibrated later.
    const double token_std = std::sqrt(1.0 / (double(E - 1) + kContextWeight * kContextWeight * double(H - E)));
    uniform_block(bits(l.wg), I, E, H, token_std);
    uniform_block(bits(l.wg) + E, I, H - E, H, kContextWeight * token_std);
    constant(bits(l.wg), I, 1, H, 0.f);
    uniform(l.wu, 1.0 / std::sqrt(double(H)));
    uniform(l.wd, 1.0 / std::sqrt(double(I)));
    constant(bits(l.wd), I, E, H, 0.f);  // nor does the FFN
  }
  constant(bits(w->final_norm), 1, H, H, 1.f);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  return w;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

// Non-zeros per token a layer of the tokens a record's runs took: the mean over layers, measured on
// those tokens where the bench counts them, else the calibration sample's; and the most of one token
// in one layer (nnz_per_token_max, as the FFN bench's records mean it), of the decode token at batch 1,
// else of the calibration sample.
struct LayerNnz {
  double mean = 0, max = 0;
};

struct Calibration {
  std::vector<double> density;  // per layer, on the calibration sample
  double mean_nnz = 0, max_layer_nnz = 0;
  double token_p99 = 0, token_max = 0;  // per-token counts, the largest over layers
  double first_token_max = 0;           // position 0 (attends to itself only)
  LayerNnz sample_nnz() const { return {mean_nnz, token_max}; }
};

// Layer by layer on `sequences` random sequences of `length` tokens (n in all): s = a·Wgᵀ without
// the threshold column, then Wg[j, 0] is set to the (k+1)-th smallest of −s/a₀ over the sample, so
// that g_j = s + a₀·Wg[j, 0] > 0 for the k tokens below it. The layer's FFN then runs with its
// thresholds in place, so the next layer is calibrated on the activations it will really see.
// k is chosen for the tokens the bench runs, not for the sample: on unseen tokens the (k+1)-th
// smallest of n is exceeded downwards with probability (k+1)/(n+1) on average, so k + 1 =
// density·(n+1). (k = density·n, as before the twenty-sixth session, fired ~9% more than the
// density at n = 2048: 31.5 non-zeros per token measured in the prefill for 28 asked.)
Calibration calibrate(const std::shared_ptr<LlamaCudaWeights>& w, double density, int64_t length, int64_t sequences,
                      uint64_t seed, std::ostream& progress) {
  const io::ModelConfig& c = w->config;
  const int64_t H = c.hidden_size, I = c.intermediate_size, tokens = length * sequences;
  cudaStream_t stream = nullptr;
  TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::LtGemm gemm;
  cuda::DeviceBuffer s_dev(static_cast<size_t>(tokens * I) * 2);
  // s is neuron-major ([I, tokens]: a neuron's scores contiguous); a₀ is channel 0 of each FFN input row.
  std::vector<uint16_t> s(static_cast<size_t>(tokens * I)), a0(static_cast<size_t>(tokens)), b(static_cast<size_t>(I));
  Calibration cal;
  const auto t0 = Clock::now();

  LlamaCudaOptions o;
  o.kv_cache = false;
  o.max_batch = sequences;
  o.max_context = length;
  o.ffn = cuda::FfnMode::dense;
  StepProgress steps(progress, "calibrating gate thresholds: layer ", c.num_hidden_layers);
  o.ffn_input_hook = [&](int64_t layer, const TensorView& in) {
    const cuda::LlamaCudaLayer& l = w->layers[static_cast<size_t>(layer)];
    gemm.run(l.wg.view().data, in.data, s_dev.get(), I, tokens, H, true, cuda::GemmEpilogue::none, stream);
    TWELL_CUDA_CHECK(cudaMemcpyAsync(s.data(), s_dev.get(), s.size() * 2, cudaMemcpyDeviceToHost, stream));
    TWELL_CUDA_CHECK(cudaMemcpy2DAsync(a0.data(), 2, in.data, static_cast<size_t>(H) * 2, 2,
                                       static_cast<size_t>(tokens), cudaMemcpyDeviceToHost, stream));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    const double n = static_cast<double>(tokens);
    const auto k = static_cast<size_t>(std::clamp<double>(std::round(density * (n + 1)) - 1, 0, n - 1));
    std::vector<int64_t> fired(8, 0);
    std::vector<std::vector<int32_t>> per_token(8, std::vector<int32_t>(static_cast<size_t>(tokens), 0));
    auto work = [&](int part) {
      std::vector<float> r(static_cast<size_t>(tokens));
      for (int64_t j = part; j < I; j += 8) {
        for (int64_t t = 0; t < tokens; ++t)
          r[t] = -bf16_bits_to_float(s[j * tokens + t]) / bf16_bits_to_float(a0[t]);
        std::vector<float> sorted = r;
        std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k), sorted.end());
        b[j] = float_to_bf16_bits(sorted[k]);
        const float bj = bf16_bits_to_float(b[j]);
        for (int64_t t = 0; t < tokens; ++t) {
          fired[part] += r[t] < bj;
          per_token[part][t] += r[t] < bj;
        }
      }
    };
    std::vector<std::thread> pool;
    for (int p = 0; p < 8; ++p) pool.emplace_back(work, p);
    for (auto& t : pool) t.join();
    TWELL_CUDA_CHECK(cudaMemcpy2DAsync(l.wg.view().data, static_cast<size_t>(H) * 2, b.data(), 2, 2,
                                       static_cast<size_t>(I), cudaMemcpyHostToDevice, stream));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    int64_t total = 0;
    for (int64_t f : fired) total += f;
    cal.density.push_back(double(total) / double(tokens * I));
    std::vector<int32_t> counts(static_cast<size_t>(tokens), 0);
    for (const auto& part : per_token)
      for (int64_t t = 0; t < tokens; ++t) counts[t] += part[t];
    std::vector<int32_t> sorted = counts;
    std::sort(sorted.begin(), sorted.end());
    cal.token_p99 = std::max<double>(cal.token_p99, sorted[static_cast<size_t>(0.99 * (tokens - 1))]);
    cal.token_max = std::max<double>(cal.token_max, sorted.back());
    for (int64_t q = 0; q < sequences; ++q)  // each sequence's position 0
      cal.first_token_max = std::max<double>(cal.first_token_max, counts[static_cast<size_t>(q * length)]);
    steps.step(layer + 1);
  };
  {
    const std::vector<int32_t> all = random_tokens(tokens, c.vocab_size, seed);
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t q = 0; q < sequences; ++q)
      prompts.emplace_back(all.begin() + q * length, all.begin() + (q + 1) * length);
    LlamaCuda m(w, o);
    m.prefill_batch(prompts);
  }
  cudaStreamDestroy(stream);
  for (double d : cal.density) {
    cal.mean_nnz += d * I / static_cast<double>(cal.density.size());
    cal.max_layer_nnz = std::max(cal.max_layer_nnz, d * I);
  }
  char line[160];
  steps.finish();
  std::snprintf(line, sizeof line,
                "calibrated %zu layers on %lld x %lld tokens: %.1f non-zeros per token there (max layer %.1f), "
                "%.1f s\n",
                cal.density.size(), static_cast<long long>(sequences), static_cast<long long>(length), cal.mean_nnz,
                cal.max_layer_nnz, seconds_since(t0));
  progress << line;
  std::snprintf(line, sizeof line, "  non-zeros per token, worst layer: p99 %.0f, max %.0f (position 0: %.0f)\n",
                cal.token_p99, cal.token_max, cal.first_token_max);
  progress << line;
  return cal;
}

// The decode bench's prompts and the tokens of its decode steps: a new random token for every
// sequence at every step, as in generation.
std::vector<int32_t> decode_prompt(const ModelBenchConfig& cfg, int64_t b) {
  return random_tokens(cfg.context, cfg.vocab, cfg.seed + 100 + static_cast<uint64_t>(b));
}
std::vector<int32_t> decode_step_tokens(const ModelBenchConfig& cfg, int64_t B, int64_t step) {
  return random_tokens(B, cfg.vocab, cfg.seed + 100000 + static_cast<uint64_t>(step));
}

// Non-zeros of the gate activation, per layer, of the tokens the decode steps run: sequence 0's
// prompt and its first `steps` decode tokens as one forward (the activations a decode step
// computes), counted at the decode positions. The calibration sample says how dense the average
// prompt token is; this says how dense the decode tokens are.
std::vector<double> decode_token_nnz(const std::shared_ptr<LlamaCudaWeights>& w, const ModelBenchConfig& cfg,
                                     int64_t steps) {
  const io::ModelConfig& c = w->config;
  const int64_t H = c.hidden_size, I = c.intermediate_size, T = cfg.context + steps;
  std::vector<int32_t> seq = decode_prompt(cfg, 0);
  for (int64_t k = 0; k < steps; ++k) seq.push_back(decode_step_tokens(cfg, 1, k)[0]);
  cuda::LtGemm gemm;
  cuda::DeviceBuffer g_dev(static_cast<size_t>(steps * I) * 2);
  std::vector<uint16_t> g(static_cast<size_t>(steps * I));
  std::vector<double> nnz;
  LlamaCudaOptions o;
  o.kv_cache = false;
  o.max_context = T;
  o.ffn = cuda::FfnMode::dense;
  o.ffn_input_hook = [&](int64_t layer, const TensorView& in) {
    const cuda::LlamaCudaLayer& l = w->layers[static_cast<size_t>(layer)];
    const auto* rows = static_cast<const uint16_t*>(in.data) + cfg.context * H;  // the decode positions
    gemm.run(rows, l.wg.view().data, g_dev.get(), steps, I, H, true, cuda::GemmEpilogue::relu, nullptr);
    TWELL_CUDA_CHECK(cudaMemcpy(g.data(), g_dev.get(), g.size() * 2, cudaMemcpyDeviceToHost));
    int64_t count = 0;
    for (uint16_t v : g) count += (v & 0x7fff) != 0;
    nnz.push_back(double(count) / double(steps));
  };
  LlamaCuda m(w, o);
  m.logits(seq);
  return nnz;
}

cuda::PrefillAttention attention_mode(const std::string& name) {
  if (name == "auto") return cuda::PrefillAttention::automatic;
  if (name == "cudnn") return cuda::PrefillAttention::cudnn;
  if (name == "twell") return cuda::PrefillAttention::twell;
  TWELL_FAIL("bench model: --attention must be auto, cudnn or twell, got '", name, "'");
}

// Each phase's options (its models then set `ffn`): one place for the phase and for check_memory.
LlamaCudaOptions phase_options(const ModelBenchConfig& cfg) {
  LlamaCudaOptions o;
  o.ffn_residual_norm = cfg.ffn_residual_norm;
  o.deferred_residual_add = cfg.deferred_residual_add;
  o.ffn_options.tile = cfg.tile;
  return o;
}

// The prefill's: batch × seq tokens in one forward, no KV cache.
LlamaCudaOptions prefill_options(const ModelBenchConfig& cfg) {
  LlamaCudaOptions o = phase_options(cfg);
  o.kv_cache = false;
  o.max_batch = cfg.batch;
  o.max_context = cfg.seq;
  o.max_tokens = cfg.batch * cfg.seq;
  o.prefill_attention = attention_mode(cfg.attention);
  o.fused_qkv_rope = cfg.fused_qkv_rope;
  return o;
}

// Decode at batch B: B prompts of --context tokens in one prefill, then the steps.
LlamaCudaOptions decode_options(const ModelBenchConfig& cfg, int64_t B) {
  LlamaCudaOptions o = phase_options(cfg);
  o.max_batch = B;
  o.max_context = cfg.context + kUntimedSteps + cfg.steps + kEnergyContext;
  o.max_tokens = B * cfg.context;
  o.cuda_graphs = cfg.cuda_graphs;
  o.fused_decode_ffn = cfg.fused_decode_ffn;
  o.decode_gemv = cfg.decode_gemv;
  o.few_token_gemm = cfg.few_token_gemm;
  o.decode_attention_splits = cfg.decode_attention_splits;
  o.decode_attention_warps = cfg.decode_attention_warps;
  return o;
}

// Whether decode at batch B times a third model, twell_gather: only where it differs from twell,
// at batches the default options send through the dense decode FFN but the gather path still takes
// (none with the defaults).
bool decode_gathers(const ModelBenchConfig& cfg, int64_t B) {
  return B <= cfg.gather_batches && B > LlamaCudaOptions{}.decode_gather_tokens;
}

constexpr int64_t kRaggedShortest = 64, kRaggedLongest = 511;  // the ragged prompts' lengths

// The ragged prefill's: --ragged prompts, padded to the longest in one forward.
LlamaCudaOptions ragged_options(const ModelBenchConfig& cfg) {
  LlamaCudaOptions o = phase_options(cfg);
  o.max_batch = cfg.ragged;
  o.max_context = kRaggedLongest;
  o.max_tokens = cfg.ragged * kRaggedLongest;  // the padded batch in one forward (the default caps it at kDefaultMaxTokens)
  o.prefill_attention = attention_mode(cfg.attention);
  o.fused_qkv_rope = cfg.fused_qkv_rope;
  return o;
}

// The long prompt's (its chunked model; the whole one sets max_tokens to the prompt).
LlamaCudaOptions long_options(const ModelBenchConfig& cfg) {
  LlamaCudaOptions o = phase_options(cfg);
  o.max_context = cfg.long_prompt;
  o.prefill_attention = attention_mode(cfg.attention);
  o.fused_qkv_rope = cfg.fused_qkv_rope;
  return o;
}

// A turn's: one sequence of --turn-context cached tokens and the n after them.
LlamaCudaOptions turn_options(const ModelBenchConfig& cfg, int64_t n) {
  LlamaCudaOptions o = phase_options(cfg);
  o.max_batch = 1;
  o.max_context = cfg.turn_context + n;
  o.cuda_graphs = cfg.cuda_graphs;  // a turn of a few tokens replays a graph (short_prefill_graph)
  o.prefill_attention = attention_mode(cfg.attention);
  o.fused_qkv_rope = cfg.fused_qkv_rope;
  o.few_token_gemm = cfg.few_token_gemm;  // turns of 2 to 32 tokens (--no-few-token-gemm: cuBLASLt)
  return o;
}

// Refuses, before the weights are made, a phase whose models (those it holds at once) need more
// GPU memory than is free beside the weights, so that it fails at once and not after the phases
// before it have run; says which phase and what to lower. The models' constructors check again.
void check_memory(const io::ModelConfig& c, const ModelBenchConfig& cfg) {
  using cuda::FfnMode;
  const cuda::DeviceMemory gpu = cuda::device_memory();
  const size_t weights = LlamaCudaWeights::bytes_for(c);
  const auto need = [&](LlamaCudaOptions o, std::initializer_list<FfnMode> modes) {
    size_t bytes = 0;
    for (FfnMode m : modes) o.ffn = m, bytes += LlamaCuda::memory_needed(c, o).total();
    return bytes;
  };
  const auto fits = [&](size_t bytes, const std::string& phase, const char* lower) {
    TWELL_REQUIRE(bytes <= gpu.free && gpu.free - bytes >= weights, "bench model: ", phase, " needs ",
                  bytes_str(bytes), " of GPU memory for its models' buffers beside the weights' ", bytes_str(weights),
                  ", and the GPU has ", gpu.str(), ": ", lower);
  };
  if (cfg.prefill) {
    // Beside the two timed models, in turn: the attention check's dense model (twell's attention, the
    // unfused QKV) and the twell model that counts the non-zeros.
    const LlamaCudaOptions o = prefill_options(cfg);
    LlamaCudaOptions own = o, probe = o;
    own.prefill_attention = cuda::PrefillAttention::twell, own.fused_qkv_rope = false;
    probe.record_ffn_stats = true;
    fits(need(o, {FfnMode::dense, FfnMode::twell}) + std::max(need(own, {FfnMode::dense}), need(probe, {FfnMode::twell})),
         "the prefill (dense and twell models, and a third in turn)", "lower --batch or --seq, or give --no-prefill");
  }
  if (cfg.decode)
    for (const int64_t B : cfg.decode_batches) {
      LlamaCudaOptions o = decode_options(cfg, B);
      size_t bytes = need(o, {FfnMode::dense, FfnMode::twell});
      if (decode_gathers(cfg, B)) {
        o.decode_gather_tokens = std::max(kGatherTokens, cfg.gather_batches);
        bytes += need(o, {FfnMode::twell});
      }
      o.max_batch = 1;  // the check's one-sequence model
      bytes += need(o, {FfnMode::dense});
      fits(bytes, str("decode at batch ", B, " (dense and twell models, ", cfg.context, " + ", o.max_context - cfg.context,
                      " positions a sequence)"),
           "lower --context or leave that --decode-batch out");
    }
  if (cfg.ragged > 0) {
    LlamaCudaOptions one = ragged_options(cfg);  // the check's one-sequence model
    one.ffn = FfnMode::dense, one.max_batch = 1, one.max_tokens = kRaggedLongest;
    const LlamaCudaOptions o = ragged_options(cfg);  // two models (runs, padded) of the default FFN
    fits(2 * need(o, {o.ffn}) + need(one, {FfnMode::dense}),
         str("the ragged prefill of ", cfg.ragged, " prompts"), "lower --ragged");
  }
  if (cfg.long_prompt > 0) {
    LlamaCudaOptions whole = long_options(cfg);
    whole.max_tokens = cfg.long_prompt;
    fits(need(long_options(cfg), {FfnMode::twell}) + need(whole, {FfnMode::twell}),
         str("the long prompt of ", cfg.long_prompt, " tokens"), "lower --long");
  }
  for (const int64_t n : cfg.turns) {
    LlamaCudaOptions o = turn_options(cfg, n), without = o;
    without.prefill_gather = false;
    fits(need(o, {FfnMode::dense, FfnMode::twell}) + need(without, {FfnMode::twell}),
         str("the turn of ", n, " tokens after ", cfg.turn_context), "lower --turn-context or that --turn");
  }
}

struct CheckResult {
  double prefill_dense = -1, prefill_twell = -1, decode_dense = -1, decode_twell = -1;
};

// GPU logits of a short sequence (full forward; prefill + one decode step) against the CPU
// backend on the same bf16 weights; the twell FFN is forced onto its sparse paths (TwELL in the
// forward, gather in the decode step).
// The full forward runs the prefill attention the timed runs use: cuDNN's SDPA (forced even at this
// size) unless `attention` is twell or cuDNN is unavailable; the models take the A/B switches of
// `cfg` the timed ones take.
CheckResult check_against_cpu(const std::shared_ptr<LlamaCudaWeights>& w, const ModelBenchConfig& cfg, int64_t T,
                              uint64_t seed, cuda::PrefillAttention attention, std::ostream& progress) {
  CheckResult r;
  TWELL_CHECK(T >= 2, "bench model: the reference check needs at least 2 tokens, got ", T);
  const auto t0 = Clock::now();
  progress << "reference check: downloading weights, CPU forward of " << T << " tokens ..." << std::flush;
  const model::LlamaCpu cpu(w->download());
  const auto tokens = random_tokens(T, w->config.vocab_size, seed + 7);
  const Tensor ref = cpu.logits(tokens);
  const int64_t V = w->config.vocab_size;
  const TensorView last_ref(ref.ptr<float>() + (T - 1) * V, DType::f32, {V});
  // cuDNN where it loads; if it then refuses (a plan it cannot build here), twell's kernel.
  cuda::PrefillAttention check_attention = attention == cuda::PrefillAttention::twell || !cuda::CudnnSdpa::available()
                                               ? cuda::PrefillAttention::twell
                                               : cuda::PrefillAttention::cudnn;
  std::string attention_note = check_attention == cuda::PrefillAttention::cudnn ? "cuDNN SDPA" : "twell's kernel";
  for (cuda::FfnMode mode : {cuda::FfnMode::dense, cuda::FfnMode::twell}) {
    LlamaCudaOptions o;
    o.ffn = mode;
    o.max_context = T;
    o.ffn_options.dispatch = cuda::Dispatch::always_sparse;
    o.ffn_options.gather_max_tokens = 0;     // the full forward checks the TwELL kernels,
    o.decode_gather_tokens = kGatherTokens;  // the decode step the gather path
    o.prefill_attention = check_attention;
    // The A/B switches the timed models run with.
    o.fused_qkv_rope = cfg.fused_qkv_rope;
    o.ffn_residual_norm = cfg.ffn_residual_norm;
    o.deferred_residual_add = cfg.deferred_residual_add;
    o.cuda_graphs = cfg.cuda_graphs;
    o.fused_decode_ffn = cfg.fused_decode_ffn;
    o.decode_gemv = cfg.decode_gemv;
    o.few_token_gemm = cfg.few_token_gemm;
    o.decode_attention_splits = cfg.decode_attention_splits;
    o.decode_attention_warps = cfg.decode_attention_warps;
    o.ffn_options.tile = cfg.tile;
    auto m = std::make_unique<LlamaCuda>(w, o);
    Tensor logits;
    try {
      logits = m->logits(tokens);
    } catch (const Error& e) {
      if (check_attention != cuda::PrefillAttention::cudnn) throw;
      check_attention = o.prefill_attention = cuda::PrefillAttention::twell;
      attention_note = std::string("twell's kernel (cuDNN refused: ") + e.what() + ")";
      m = std::make_unique<LlamaCuda>(w, o);
      logits = m->logits(tokens);
    }
    const double full = relative_error(logits, ref);
    m->prefill(std::vector<int32_t>(tokens.begin(), tokens.end() - 1));
    const double step = relative_error(m->decode_step(tokens.back()), last_ref);
    (mode == cuda::FfnMode::dense ? r.prefill_dense : r.prefill_twell) = full;
    (mode == cuda::FfnMode::dense ? r.decode_dense : r.decode_twell) = step;
  }
  char line[200];
  std::snprintf(line, sizeof line,
                " %.1f s\n  rel err vs CPU: full forward dense %.2e twell %.2e; decode step dense %.2e twell %.2e\n",
                seconds_since(t0), r.prefill_dense, r.prefill_twell, r.decode_dense, r.decode_twell);
  progress << line;
  std::string why;
  if (check_attention == cuda::PrefillAttention::twell && attention != cuda::PrefillAttention::twell &&
      !cuda::CudnnSdpa::available(&why))
    attention_note += " (" + why + ")";
  progress << "  attention of the check's full forward: " << attention_note << "\n";
  return r;
}

// Dense is correct within bf16 noise of a deep random model; twell within twice dense's error,
// plus 1e-3: on 16 tokens the two errors are a few 1e-3 each and move by ~1e-4 between runs.
constexpr double kDenseTolerance = 5e-2;
bool twell_ok(double twell, double dense) { return twell >= 0 && twell <= 2 * dense + 1e-3; }

struct Timing {
  std::vector<double> ms;
  MeterReading meter;          // summed over the prefill runs or the decode energy stretches
  double stretch_step_ms = 0;  // decode: a step of the energy stretches (sampler running), against the timed
  double median() const { return bench::median(ms); }
};

// One record; `err` and `dense_err` are the CPU check's relative errors of this implementation
// and of the dense one, `dense_ms` the dense median of the same run.
BenchRecord record(const char* bench, const char* impl, const ModelBenchConfig& cfg, int64_t tokens,
                   const Timing& t, double tokens_per_run, size_t mem, const LayerNnz& nnz, double dense_ms,
                   double dense_err, double err) {
  BenchRecord r;
  r.bench = bench;
  r.impl = impl;
  r.gpu = cuda::device_info().name;
  r.M = tokens;
  r.H = cfg.hidden;
  r.I = cfg.ffn;
  r.layers = cfg.layers;
  r.distribution = "calibrated";
  r.density = cfg.density;
  r.nnz_per_token_mean = nnz.mean;
  r.nnz_per_token_max = static_cast<int64_t>(std::ceil(nnz.max));
  if (!t.ms.empty()) {  // (none where a check failed before the timing: the caller clears `correct`)
    r.ms_median = t.median();
    r.ms_min = *std::min_element(t.ms.begin(), t.ms.end());
    r.ms_max = *std::max_element(t.ms.begin(), t.ms.end());
    r.tokens_per_ms = tokens_per_run / r.ms_median;
  }
  r.peak_mem_bytes = static_cast<int64_t>(mem);
  // The mean power times a run's time: a prefill run's mean, or a step of the decode energy stretches.
  // NVML's energy counter moves in coarse steps: runs too short for it to move twice have no figure.
  if (t.meter.watts() > 0) {
    double run_ms = t.stretch_step_ms;
    if (run_ms <= 0) {
      for (double m : t.ms) run_ms += m / static_cast<double>(t.ms.size());
    }
    r.energy_mj_per_token = t.meter.watts() * run_ms / tokens_per_run;  // W x ms = mJ
  }
  r.sm_clock_mhz = t.meter.mhz();  // -1 (unset) where no sample was taken
  r.power_capped = t.meter.capped();
  r.dense_rel_err = dense_err;
  r.rel_err = err;
  const bool dense = std::string(impl) == "dense";
  r.correct = dense_err >= 0 && dense_err <= kDenseTolerance && (dense || twell_ok(err, dense_err));
  // A ratio only between two records that passed (where the caller clears `correct` for its own
  // checks, it clears the ratio with it).
  const bool dense_ok = dense_err >= 0 && dense_err <= kDenseTolerance;
  r.ratio_to_dense = r.correct && dense_ok ? r.ms_median / dense_ms : NAN;
  r.commit = TWELL_GIT_SHA;
  r.command = cfg.command;
  return r;
}

// How the prefill's progress line and records say that --separate-ffn-norm was given.
constexpr const char* kSeparateFfnNormNote = "; the add + RMSNorm after the FFN separate (--separate-ffn-norm)";

void prefill_bench(const std::shared_ptr<LlamaCudaWeights>& w, const ModelBenchConfig& cfg, const Calibration& cal,
                   const CheckResult& check, GpuMeter& energy, std::vector<BenchRecord>& out,
                   std::ostream& progress) {
  const int64_t B = cfg.batch, S = cfg.seq, T = B * S;
  LlamaCudaOptions o = prefill_options(cfg);
  o.ffn = cuda::FfnMode::dense;
  LlamaCuda dense(w, o);
  o.ffn = cuda::FfnMode::twell;
  LlamaCuda twell(w, o);
  LlamaCuda* models[2] = {&dense, &twell};
  const std::vector<int32_t> host_tokens = random_tokens(T, cfg.vocab, cfg.seed + 11);
  cuda::DeviceBuffer tokens(static_cast<size_t>(T) * 4);
  TWELL_CUDA_CHECK(cudaMemcpy(tokens.get(), host_tokens.data(), tokens.bytes(), cudaMemcpyHostToDevice));

  // Full-size agreement of the two FFN modes: the final residual stream of a row sample. Each model
  // runs the shape twice, and the second is compared: a shape's first call may take twell's
  // attention where cuDNN's plan would not repay itself (PrefillAttention), the second takes the
  // kernels the timed runs take.
  std::vector<Tensor> hidden;
  for (LlamaCuda* m : models) {
    for (int pass = 0; pass < 2; ++pass) m->enqueue(tokens.as<int32_t>(), B, S, cuda::Head::none);
    TWELL_CUDA_CHECK(cudaStreamSynchronize(m->stream()));
    const int64_t rows = std::min<int64_t>(T, 256);
    Tensor h(DType::f32, {rows, cfg.hidden});
    const TensorView d = m->hidden_device();
    TWELL_CUDA_CHECK(cudaMemcpy(h.view().data, static_cast<const float*>(d.data) + (T - rows) * cfg.hidden, h.nbytes(),
                                cudaMemcpyDeviceToHost));
    hidden.push_back(std::move(h));
  }
  const double agreement = relative_error(hidden[1], hidden[0]);
  int sparse_layers = 0;
  for (cuda::FfnPath p : twell.ffn_paths()) sparse_layers += p == cuda::FfnPath::sparse || p == cuda::FfnPath::gather;
  char line[200];
  std::snprintf(line, sizeof line, "prefill %lld x %lld: twell vs dense final hidden state rel err %.2e; twell took the sparse path in %d/%lld layers\n",
                static_cast<long long>(B), static_cast<long long>(S), agreement, sparse_layers,
                static_cast<long long>(cfg.layers));
  progress << line;
  const LlamaCuda::PrefillKernels kernels = twell.prefill_kernels();
  const std::string kernels_note =
      "attention: " + kernels.attention + (kernels.fused_qkv_rope ? "; QKV+RoPE fused" : "; QKV, RoPE unfused") +
      (cfg.ffn_residual_norm ? "; the add + RMSNorm after the FFN in twell's down pass" : kSeparateFfnNormNote) +
      (cfg.deferred_residual_add ? "" : "; the attention's residual add before the FFN (--eager-residual-add)") +
      (cfg.tile != 0 ? "; TwELL tile " + std::to_string(cfg.tile) + " (--tile)" : std::string());
  progress << "  prefill " << kernels_note << "\n";

  // Full size, the attention and QKV kernels themselves (the CPU check's 16 tokens take neither
  // the fused QKV nor, in automatic mode, cuDNN): where the timed runs use cuDNN's SDPA or the
  // fused QKV+RoPE, the dense model's final hidden states against the same model with twell's
  // attention kernel and the cuBLASLt QKV GEMM + RoPE kernel.
  double attention_agreement = -1;
  if (kernels.attention.rfind("cudnn", 0) == 0 || kernels.fused_qkv_rope) {
    LlamaCudaOptions ao = o;
    ao.ffn = cuda::FfnMode::dense;
    ao.prefill_attention = cuda::PrefillAttention::twell;
    ao.fused_qkv_rope = false;
    LlamaCuda own(w, ao);
    own.enqueue(tokens.as<int32_t>(), B, S, cuda::Head::none);
    TWELL_CUDA_CHECK(cudaStreamSynchronize(own.stream()));
    const int64_t rows = hidden[0].shape()[0];
    Tensor h(DType::f32, {rows, cfg.hidden});
    TWELL_CUDA_CHECK(cudaMemcpy(h.view().data,
                                static_cast<const float*>(own.hidden_device().data) + (T - rows) * cfg.hidden,
                                h.nbytes(), cudaMemcpyDeviceToHost));
    attention_agreement = relative_error(hidden[0], h);
    std::snprintf(line, sizeof line,
                  "  against twell's attention and the unfused QKV + RoPE, dense model, final hidden state rel err %.2e\n",
                  attention_agreement);
    progress << line;
  }

  // The full-size checks decide what is timed: a model that fails one is reported, never timed. At
  // full size the twell run must agree with the dense one within the dense error, and cuDNN's
  // attention (or the fused QKV) with twell's own.
  const double full_size_bound = 2 * check.prefill_dense + 1e-3;
  const bool attention_ok = attention_agreement < 0 || attention_agreement <= full_size_bound;
  const bool timed[2] = {attention_ok, attention_ok && agreement <= full_size_bound};
  if (!timed[0] || !timed[1])
    progress << "  prefill: " << (timed[0] ? "twell" : "dense and twell")
             << " failed the full-size check (bound " << full_size_bound << "): not timed\n";

  cudaEvent_t start, stop;
  TWELL_CUDA_CHECK(cudaEventCreate(&start));
  TWELL_CUDA_CHECK(cudaEventCreate(&stop));
  Timing timing[2];
  std::mt19937 order_rng(static_cast<unsigned>(cfg.seed));
  StepProgress timing_steps(progress, "prefill timing: ", cfg.warmup + cfg.iters);
  for (int it = 0; it < cfg.warmup + cfg.iters; ++it) {
    int order[2] = {0, 1};
    if (order_rng() & 1) std::swap(order[0], order[1]);
    for (int k : order) {
      if (!timed[k]) continue;
      LlamaCuda& m = *models[k];
      energy.start();
      TWELL_CUDA_CHECK(cudaEventRecord(start, m.stream()));
      m.enqueue(tokens.as<int32_t>(), B, S, cuda::Head::none);
      TWELL_CUDA_CHECK(cudaEventRecord(stop, m.stream()));
      TWELL_CUDA_CHECK(cudaEventSynchronize(stop));
      const MeterReading reading = energy.stop();
      float ms = 0;
      TWELL_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (it < cfg.warmup) continue;
      timing[k].ms.push_back(ms);
      timing[k].meter.add(reading);
    }
    timing_steps.step(it + 1);
  }
  timing_steps.finish();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);

  // The twell FFN's measured non-zeros per token, layer by layer (a separate, untimed run: the
  // count waits for each layer).
  std::string measured;
  LayerNnz nnz = cal.sample_nnz();
  {
    LlamaCudaOptions so = o;
    so.record_ffn_stats = true;
    LlamaCuda probe(w, so);
    probe.enqueue(tokens.as<int32_t>(), B, S, cuda::Head::none);
    TWELL_CUDA_CHECK(cudaStreamSynchronize(probe.stream()));
    double sum = 0, lo = 1e300, hi = 0;
    int counted = 0;
    for (const cuda::FfnStats& st : probe.ffn_stats()) {
      const double n = st.nnz_per_token();
      if (n < 0) continue;  // dense path: not counted
      sum += n, lo = std::min(lo, n), hi = std::max(hi, n), ++counted;
    }
    char buf[160];
    if (counted > 0) {
      std::snprintf(buf, sizeof buf, "; measured non-zeros per token: %.1f a layer (min %.1f, max %.1f, %d layers counted)",
                    sum / counted, lo, hi, counted);
      nnz = {sum / counted, cal.token_max};  // (the run counts no token's own)
    } else
      std::snprintf(buf, sizeof buf, "; measured non-zeros per token: none counted (every layer dense)");
    measured = buf;
    progress << "  " << measured.substr(2) << "\n";
  }

  const char* names[2] = {"dense", "twell"};
  const double dense_ms = timing[0].median();
  for (int k = 0; k < 2; ++k) {
    BenchRecord r = record("model_prefill", names[k], cfg, T, timing[k], double(T),
                           w->bytes() + models[k]->workspace_bytes(), nnz, dense_ms, check.prefill_dense,
                           k == 0 ? check.prefill_dense : check.prefill_twell);
    if (!timed[k]) r.correct = false, r.ratio_to_dense = NAN;  // the full-size checks above
    std::snprintf(line, sizeof line, "twell vs dense final hidden state rel err %.2e (full size); sparse layers %d/%lld",
                  agreement, sparse_layers, static_cast<long long>(cfg.layers));
    const LlamaCuda::PrefillKernels mk = models[k]->prefill_kernels();
    r.note = line + measured + "; attention: " + mk.attention + (mk.fused_qkv_rope ? "; QKV+RoPE fused" : "");
    if (!timed[k]) r.note += str("; failed the full-size check (bound ", full_size_bound, "): not timed");
    if (!cfg.ffn_residual_norm) r.note += kSeparateFfnNormNote;
    if (cfg.tile != 0) r.note += "; TwELL tile " + std::to_string(cfg.tile) + " (--tile)";
    if (attention_agreement >= 0) {
      std::snprintf(line, sizeof line,
                    " (dense model against twell's attention and the unfused QKV at full size: rel err %.2e)",
                    attention_agreement);
      r.note += line;
    }
    out.push_back(r);
  }
}

void decode_bench(const std::shared_ptr<LlamaCudaWeights>& w, const ModelBenchConfig& cfg, int64_t B,
                  const Calibration& cal, const CheckResult& check, GpuMeter& energy,
                  std::vector<BenchRecord>& out, std::ostream& progress) {
  LlamaCudaOptions o = decode_options(cfg, B);
  o.ffn = cuda::FfnMode::dense;
  LlamaCuda dense(w, o);
  o.ffn = cuda::FfnMode::twell;
  LlamaCuda twell(w, o);
  const int n_models = decode_gathers(cfg, B) ? 3 : 2;
  o.decode_gather_tokens = std::max(kGatherTokens, cfg.gather_batches);
  std::unique_ptr<LlamaCuda> gather = n_models == 3 ? std::make_unique<LlamaCuda>(w, o) : nullptr;
  LlamaCuda* models[3] = {&dense, &twell, gather.get()};
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t b = 0; b < B; ++b) prompts.push_back(decode_prompt(cfg, b));
  for (int k = 0; k < n_models; ++k) models[k]->prefill_batch(prompts);
  int64_t step = 0;  // every model runs the same tokens at the same step
  for (; step < kUntimedSteps - 1; ++step)  // eager twice (plans, then cuBLASLt's autotune), the graph's capture
    for (int k = 0; k < n_models; ++k) models[k]->decode_batch(decode_step_tokens(cfg, B, step));

  // One more step, untimed, checked before any step is timed: the CPU check ran one sequence on the
  // one-token path, while a timed step runs B sequences (on the batch kernels where B > 1), replayed
  // from the graph as this one is. Its logits, sequences 0 and B - 1, against the last row of a full
  // forward over the same tokens (prompt and steps), by a one-sequence dense model, whose prefill path
  // the full-size check compared.
  Tensor checked_logits[3];  // each model's [B, V]
  const int64_t checked_step = step++;
  for (int k = 0; k < n_models; ++k)
    checked_logits[k] = models[k]->decode_batch(decode_step_tokens(cfg, B, checked_step));
  double step_err[3] = {0, 0, 0};
  {
    LlamaCudaOptions ro = o;
    ro.ffn = cuda::FfnMode::dense;
    ro.max_batch = 1;
    ro.max_context = ro.max_tokens = cfg.context + checked_step + 1;
    LlamaCuda ref(w, ro);
    const int64_t V = w->config.vocab_size;
    for (const int64_t b : {int64_t{0}, B - 1}) {
      std::vector<int32_t> seq = prompts[static_cast<size_t>(b)];
      for (int64_t st = 0; st <= checked_step; ++st) seq.push_back(decode_step_tokens(cfg, B, st)[static_cast<size_t>(b)]);
      const Tensor last = ref.prefill(seq);  // the full forward's last row [V]
      const TensorView want = last.view();
      for (int k = 0; k < n_models; ++k)
        step_err[k] = std::max(step_err[k], relative_error(TensorView(checked_logits[k].ptr<float>() + b * V,
                                                                      DType::f32, {V}), want));
      if (B == 1) break;
    }
  }
  // Each model against the reference within twice the larger of its own CPU decode error and the
  // reference path's (the full forward's), plus 1e-3: both sit that close to the CPU model.
  const bool twell_gathers = B <= LlamaCudaOptions{}.decode_gather_tokens;  // the default options'
  double cpu_err[3], step_tolerance[3];  // each model's CPU check error: its decode path's
  for (int k = 0; k < n_models; ++k) {
    const bool gathers = k == 2 || (k == 1 && twell_gathers);
    cpu_err[k] = gathers ? check.decode_twell : check.decode_dense;
    step_tolerance[k] = 2 * std::max(cpu_err[k], check.prefill_dense) + 1e-3;
  }
  const char* names[3] = {"dense", "twell", "twell_gather"};
  bool timed[3] = {false, false, false};  // a model over its bound (or with dense over its own) is not timed
  for (int k = 0; k < n_models; ++k) {
    timed[k] = step_err[k] <= step_tolerance[k] && step_err[0] <= step_tolerance[0];
    if (!timed[k])
      progress << "  decode batch " << B << ": " << names[k] << " failed the step check (rel err " << step_err[k]
               << ", bound " << step_tolerance[k] << "): not timed\n";
  }

  Timing timing[3];
  std::vector<double> gpu_ms[3];
  for (int64_t s = 0; s < cfg.steps; ++s, ++step) {
    const std::vector<int32_t> next = decode_step_tokens(cfg, B, step);
    for (int i = 0; i < n_models; ++i) {  // rotate which model goes first
      const int k = static_cast<int>((s + i) % n_models);
      if (!timed[k]) continue;
      const auto t0 = Clock::now();
      models[k]->decode_batch(next);  // tokens up, graph replay, logits down: a whole step
      timing[k].ms.push_back(seconds_since(t0) * 1e3);
      gpu_ms[k].push_back(models[k]->last_gpu_ms());
    }
  }
  // Energy of a step: the mean power of a stretch of steps (GpuMeter) times its mean step. A stretch
  // starts from a shorter prompt, so that its contexts are centred on the timed steps' (the
  // attention's cost grows with the context); stretches repeat until the counter's moves span about
  // a second.
  const int64_t center = cfg.context + kUntimedSteps + cfg.steps / 2, room = o.max_context - 1 - center;
  for (int k = 0; k < n_models; ++k) {
    if (!timed[k]) continue;
    // At least 2·(center - context) steps, so that the stretch's prompt is no longer than the
    // prompts (never more than the room left: room >= 127 + steps/2).
    const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(kEnergyStretchMs / timing[k].median()),
                                          2 * (center - cfg.context), 2 * std::min(room, center - 1));
    std::vector<std::vector<int32_t>> shorter;
    for (const auto& p : prompts) shorter.emplace_back(p.begin(), p.begin() + (center - n / 2));
    double stretch_ms = 0;
    int64_t stretch_steps = 0;
    for (int stretch = 0; energy.available() && stretch < kEnergyStretches && timing[k].meter.seconds < 1.0;
         ++stretch) {
      models[k]->prefill_batch(shorter);
      energy.start();
      const auto t0 = Clock::now();
      for (int64_t s = 0; s < n; ++s) models[k]->decode_batch(decode_step_tokens(cfg, B, step + s));
      stretch_ms += seconds_since(t0) * 1e3, stretch_steps += n;
      timing[k].meter.add(energy.stop());  // adds nothing where the counter moved less than twice
    }
    timing[k].stretch_step_ms = stretch_steps > 0 ? stretch_ms / static_cast<double>(stretch_steps) : 0;
  }
  // How dense the decode token is, layer by layer (batch element 0; for batch 1 only).
  std::string active;
  LayerNnz step_nnz = cal.sample_nnz();
  if (B == 1) {
    const std::vector<double> nnz = decode_token_nnz(w, cfg, 16);
    double mean = 0, lo = 1e300, hi = 0;
    for (double v : nnz) mean += v / static_cast<double>(nnz.size()), lo = std::min(lo, v), hi = std::max(hi, v);
    step_nnz = {mean, hi};
    const size_t half = nnz.size() / 2;
    double first = 0, second = 0;
    for (size_t k = 0; k < nnz.size(); ++k) (k < half ? first : second) += nnz[k];
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "; decode token: %.1f non-zeros per layer (min %.0f, max %.0f; first half of the layers %.1f, "
                  "second %.1f; calibration sample %.1f)",
                  mean, lo, hi, first / std::max<size_t>(half, 1), second / std::max<size_t>(nnz.size() - half, 1),
                  cal.mean_nnz);
    active = buf;
    progress << "  " << active.substr(2) << "\n";
  }
  const double dense_ms = timing[0].median();
  for (int k = 0; k < n_models; ++k) {
    BenchRecord r = record("model_decode", names[k], cfg, B, timing[k], double(B),
                           w->bytes() + models[k]->workspace_bytes(), step_nnz, dense_ms, check.decode_dense,
                           cpu_err[k]);
    char gpu[96] = "";
    if (timed[k]) std::snprintf(gpu, sizeof gpu, "; GPU %.3f ms/step", median(gpu_ms[k]));
    r.note = "batch " + std::to_string(B) + ", context " + std::to_string(cfg.context) +
             ", a new random token per sequence each step" +
             (cfg.cuda_graphs ? ", per step: tokens up, graph replay, logits down"
                              : ", per step: tokens up, kernels launched (no graph), logits down") +
             gpu;
    r.note += active;
    std::snprintf(gpu, sizeof gpu, "; a step before the timed ones against a full forward: rel err %.2e", step_err[k]);
    r.note += gpu;
    if (!timed[k]) {
      r.correct = false, r.ratio_to_dense = NAN;
      r.note += " (over the bound " + std::to_string(step_tolerance[k]) + ", or dense over its own): not timed";
    }
    if (timing[k].meter.seconds > 0) {
      char energy_note[160];
      std::snprintf(energy_note, sizeof energy_note,
                    "; energy: NVML's mean power over %.2f s of steps (%.3f ms a step there, beside the sampler)",
                    timing[k].meter.seconds, timing[k].stretch_step_ms);
      r.note += energy_note;
    }
    if (B == 1)
      r.note += cfg.decode_gemv
                    ? "; QKV and O projections, the LM head (and the dense FFN's gate and up): twell's one-token GEMV"
                    : "; projections: cuBLASLt (--cublas-decode-projections)";
    if (B > 1 && B <= cuda::kFewTokenGemmMaxTokens)
      r.note += !cfg.few_token_gemm ? "; projections: cuBLASLt (--no-few-token-gemm)"
                : B <= cuda::kTwellHeadMaxRows ? "; QKV and O projections, the LM head (and the dense FFN's gate and up): twell's few-token GEMM"
                         : "; QKV and O projections (and the dense FFN's gate and up): twell's few-token GEMM";
    if (cfg.decode_attention_splits > 0)
      r.note += "; decode attention: " + std::to_string(cfg.decode_attention_splits) + " key ranges a head (A/B)";
    if (cfg.decode_attention_warps > 0)
      r.note += "; decode attention: " + std::to_string(cfg.decode_attention_warps) + " warps a block (A/B)";
    if (k == 2) r.note += "; FFN through the gather path";
    if (k == 1)
      r.note += twell_gathers ? "; default options: FFN through the gather path" : "; default options: decode FFN dense";
    out.push_back(r);
  }
  char line[200];
  progress << "decode batch " << B << ":";
  for (int k = 0; k < n_models; ++k) {  // a model that failed its check was not timed
    if (timed[k])
      std::snprintf(line, sizeof line, "%s %s %.3f ms/step (GPU %.3f)", k ? "," : "", names[k], timing[k].median(),
                    median(gpu_ms[k]));
    else
      std::snprintf(line, sizeof line, "%s %s not timed", k ? "," : "", names[k]);
    progress << line;
  }
  std::snprintf(line, sizeof line,
                "\n  a step before the timed ones against a full forward: rel err dense %.2e (bound %.2e), twell %.2e "
                "(bound %.2e)\n",
                step_err[0], step_tolerance[0], step_err[1], step_tolerance[1]);
  progress << line;
}

// A ragged prefill, as generate_batch hands it over (prompts of 64-511 tokens ordered by length),
// on the twell model as runs of neighbouring prompts (the default) and as one batch padded to the
// longest (ragged_prefill_runs off): each call with new lengths (new GEMM and attention shapes, as
// a server meets them: nothing tuned, cuDNN's attention only where a call repays its plan), and
// one set of prompts repeated (shapes known, GEMMs tuned). Wall time of prefill_batch (logits on
// the host). Checked first, after an untimed call (the runs depend on the density the first call
// measures): the first and last sequences' logits against a one-sequence dense model's, within
// the CPU check's bound.
void ragged_bench(const std::shared_ptr<LlamaCudaWeights>& w, const ModelBenchConfig& cfg, const Calibration& cal,
                  const CheckResult& check, std::vector<BenchRecord>& out, std::ostream& progress) {
  const int64_t B = cfg.ragged, V = w->config.vocab_size;
  LlamaCudaOptions o = ragged_options(cfg);
  LlamaCuda runs(w, o);
  o.ragged_prefill_runs = false;
  LlamaCuda padded(w, o);
  LlamaCuda* models[2] = {&padded, &runs};
  std::mt19937_64 rng(cfg.seed + 77);
  auto prompt_set = [&]() {
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t b = 0; b < B; ++b)
      prompts.push_back(random_tokens(kRaggedShortest + static_cast<int64_t>(rng() % (kRaggedLongest - kRaggedShortest + 1)), V, rng()));
    std::stable_sort(prompts.begin(), prompts.end(), [](const auto& x, const auto& y) { return x.size() < y.size(); });
    return prompts;
  };
  // Checked: one set, both models, sequences 0 and B - 1 against one-sequence dense forwards.
  const std::vector<std::vector<int32_t>> fixed = prompt_set();
  double err[2] = {0, 0};
  int64_t rows[2] = {0, 0};
  {
    LlamaCudaOptions ro = o;
    ro.ffn = cuda::FfnMode::dense;
    ro.max_batch = 1;
    ro.max_tokens = kRaggedLongest;
    LlamaCuda ref(w, ro);
    Tensor got[2];
    for (int k = 0; k < 2; ++k) {
      models[k]->prefill_batch(fixed);  // measures the density the runs' costs read
      got[k] = models[k]->prefill_batch(fixed), rows[k] = models[k]->last_tokens();
    }
    for (const int64_t b : {int64_t{0}, B - 1}) {
      const Tensor want = ref.prefill(fixed[static_cast<size_t>(b)]);
      for (int k = 0; k < 2; ++k)
        err[k] = std::max(err[k], relative_error(TensorView(got[k].ptr<float>() + b * V, DType::f32, {V}), want.view()));
    }
  }
  int64_t real = 0;
  for (const auto& p : fixed) real += static_cast<int64_t>(p.size());
  char line[256];
  std::snprintf(line, sizeof line, "ragged prefill of %lld prompts (%lld tokens): %lld rows as runs, %lld as one batch; "
                "rel err against one-sequence forwards %.2e / %.2e\n", static_cast<long long>(B),
                static_cast<long long>(real), static_cast<long long>(rows[1]), static_cast<long long>(rows[0]), err[1],
                err[0]);
  progress << "  " << line;
  const double bound = 2 * check.prefill_dense + 1e-3;
  const bool ok[2] = {err[0] <= bound, err[1] <= bound};  // (NaN fails) a model that failed is not timed
  // New lengths every call, then the fixed set repeated; the models alternate which goes first.
  Timing fresh[2], repeated[2];
  const int calls = cfg.warmup + cfg.iters;
  StepProgress steps(progress, "ragged prefill timing: ", 2 * calls);
  for (int i = 0; i < 2 * calls; ++i) {
    const bool is_fresh = i < calls;
    const std::vector<std::vector<int32_t>> prompts = is_fresh ? prompt_set() : fixed;
    for (int j = 0; j < 2; ++j) {
      const int k = (i + j) % 2;
      if (!ok[k]) continue;
      const auto t0 = Clock::now();
      models[k]->prefill_batch(prompts);
      const double ms = seconds_since(t0) * 1e3;
      if (i % calls >= cfg.warmup) (is_fresh ? fresh : repeated)[k].ms.push_back(ms);
    }
    steps.step(i + 1);
  }
  steps.finish();
  const char* names[2] = {"padded", "runs"};
  for (const bool is_fresh : {true, false}) {
    Timing* t = is_fresh ? fresh : repeated;
    for (int k = 0; k < 2; ++k) {
      BenchRecord r = record("model_ragged", names[k], cfg, real, t[k], double(real), w->bytes() + models[k]->workspace_bytes(),
                             cal.sample_nnz(), t[0].median(), check.prefill_dense, err[k]);
      if (!ok[k]) r.correct = false, r.ratio_to_dense = NAN;
      if (!ok[0]) r.ratio_to_dense = NAN;
      std::snprintf(line, sizeof line, "%lld prompts of %lld-%lld tokens, ordered by length, %s; %lld rows computed for %lld "
                    "tokens (the checked set); ratio against the padded batch; wall time of prefill_batch",
                    static_cast<long long>(B), static_cast<long long>(kRaggedShortest), static_cast<long long>(kRaggedLongest),
                    is_fresh ? "new lengths every call (new shapes)" : "one set repeated (shapes known, GEMMs tuned)",
                    static_cast<long long>(rows[k]), static_cast<long long>(real));
      r.note = line;
      r.distribution = is_fresh ? "ragged_new_lengths" : "ragged_repeated";
      out.push_back(r);
    }
  }
}

// One long prompt (a document, a chat history) on the twell model, prefilled in chunks of at most
// kDefaultMaxTokens tokens (LlamaCudaOptions::max_tokens's default: the activations sized for a
// chunk) and in one forward (max_tokens = the prompt), with the device memory each holds. Checked
// first against a GPU model with the dense FFN in one forward (itself checked against the CPU
// backend at a short length): each model's second call's last-token logits (the first builds no
// cuDNN plan: automatic attention) within the CPU check's bound, and every position's next-token
// loss (next_token_nll) closer to the reference's, on average, than a quarter of what neighbouring
// positions' losses differ by (a chunk that lost the keys before it, or a shifted row, is not).
// Timed: the prefill's GPU time (CUDA events around its device work, last_gpu_ms), new tokens
// every call, the models alternating which goes first.
void long_bench(const std::shared_ptr<LlamaCudaWeights>& w, const ModelBenchConfig& cfg, const Calibration& cal,
                const CheckResult& check, std::vector<BenchRecord>& out, std::ostream& progress) {
  const int64_t N = cfg.long_prompt, V = w->config.vocab_size;
  LlamaCudaOptions o = long_options(cfg);
  std::mt19937_64 rng(cfg.seed + 91);
  const std::vector<int32_t> fixed = random_tokens(N, V, rng());
  // The reference first, and gone before the two models take their memory. next_token_nll runs from
  // position 0 with nothing cached: after a prefill, reset() first.
  Tensor want;
  std::vector<double> want_nll;
  {
    LlamaCudaOptions ro = o;
    ro.ffn = cuda::FfnMode::dense;
    ro.max_tokens = N;
    LlamaCuda ref(w, ro);
    want_nll = ref.next_token_nll(fixed);
    want = ref.prefill(fixed);
  }
  LlamaCuda chunked(w, o);  // the default max_tokens
  o.max_tokens = N;
  LlamaCuda whole(w, o);
  LlamaCuda* models[2] = {&whole, &chunked};
  const std::vector<int64_t> chunks = model::prefill_chunks(N, chunked.options().max_tokens);
  double err[2] = {0, 0}, off[2] = {0, 0}, apart = 0;
  size_t memory[2] = {0, 0};  // what a prefill holds: read before the loss check grows the logits
  for (size_t i = 0; i + 1 < want_nll.size(); ++i) apart += std::abs(want_nll[i + 1] - want_nll[i]);
  apart /= std::max<double>(1, double(want_nll.size()) - 1);
  for (int k = 0; k < 2; ++k) {
    models[k]->prefill(fixed);
    err[k] = relative_error(models[k]->prefill(fixed), want);
    memory[k] = w->bytes() + models[k]->workspace_bytes();
    models[k]->reset();
    const std::vector<double> nll = models[k]->next_token_nll(fixed);
    for (size_t i = 0; i < nll.size(); ++i) off[k] += std::abs(nll[i] - want_nll[i]) / double(nll.size());
  }
  std::string sizes;
  for (int64_t n : chunks) sizes += (sizes.empty() ? "" : " + ") + std::to_string(n);
  char line[512];
  if (sizes.size() > 60) sizes = std::to_string(chunks.size()) + " of " + std::to_string(chunks[0]) + " at most";
  std::snprintf(line, sizeof line, "long prompt of %lld tokens: in %zu chunk%s (%s) and in one forward; rel err against "
                "a dense forward %.2e / %.2e, its per-position losses %.3f / %.3f apart (neighbours: %.3f); buffers "
                "beside the weights %.2f GB / %.2f GB\n", static_cast<long long>(N), chunks.size(),
                chunks.size() == 1 ? "" : "s", sizes.c_str(), err[1], err[0], off[1], off[0], apart,
                (memory[1] - w->bytes()) / 1e9, (memory[0] - w->bytes()) / 1e9);
  progress << "  " << line;
  const double bound = 2 * check.prefill_dense + 1e-3;
  bool ok[2];
  for (int k = 0; k < 2; ++k) ok[k] = err[k] <= bound && off[k] <= 0.25 * apart;
  Timing t[2];
  const int calls = cfg.warmup + cfg.iters;
  StepProgress steps(progress, "long prompt timing: ", calls);
  for (int i = 0; i < calls; ++i) {
    const std::vector<int32_t> prompt = random_tokens(N, V, rng());
    for (int j = 0; j < 2; ++j) {
      const int k = (i + j) % 2;
      if (!ok[k]) continue;  // a model that failed its check is not timed
      models[k]->prefill(prompt);
      if (i >= cfg.warmup) t[k].ms.push_back(models[k]->last_gpu_ms());
    }
    steps.step(i + 1);
  }
  steps.finish();
  const char* names[2] = {"whole", "chunks"};
  for (int k = 0; k < 2; ++k) {
    BenchRecord r = record("model_long", names[k], cfg, N, t[k], double(N), memory[k],
                           cal.sample_nnz(), t[0].median(), check.prefill_dense, err[k]);
    if (!ok[k]) r.correct = false, r.ratio_to_dense = NAN;
    if (!ok[0]) r.ratio_to_dense = NAN;
    std::snprintf(line, sizeof line, "one prompt of %lld tokens, twell FFN; %s; ratio against one forward; GPU time of "
                  "prefill (the chunks' token copies included); memory: weights + the model's buffers; checked "
                  "against a dense-FFN GPU forward: last-token logits, every position's loss (%.3f apart, "
                  "neighbours %.3f)", static_cast<long long>(N),
                  k == 1 ? ("chunks of " + sizes).c_str() : "one forward", off[k], apart);
    r.note = line;
    r.distribution = "long_prompt";
    out.push_back(r);
  }
}

// A conversation's next turn (or a question after a cached document): N new tokens (--turn) after
// --turn-context cached ones (LanguageModel::prefill_from), as generate() runs them when its
// PromptCache holds the history, on three models: the dense FFN; twell's, whose FFN takes the gather
// path where the call's tokens times a layer's density is at most 0.25 (LlamaCudaOptions::prefill_gather:
// the gate's weights, then only the active rows of Wu and Wd); and twell's without that, whose FFN
// runs dense at this size (sparse_min_tokens). Checked first: each model's logits of the turn against
// the dense model's prefill of the whole conversation, within the CPU check's bound, at its first call
// and at its third (which launches the CUDA graph the timed calls replay, where the turn has one). Timed: the GPU
// time of prefill_from (last_gpu_ms), new turn tokens every call, the models taking turns to go first.
void turn_bench(const std::shared_ptr<LlamaCudaWeights>& w, const ModelBenchConfig& cfg, int64_t N,
                const Calibration& cal, const CheckResult& check, std::vector<BenchRecord>& out, std::ostream& progress) {
  const int64_t C = cfg.turn_context, V = w->config.vocab_size, L = w->config.num_hidden_layers;
  std::mt19937_64 rng(cfg.seed + 53);
  const std::vector<int32_t> history = random_tokens(C, V, rng());
  LlamaCudaOptions o = turn_options(cfg, N);
  o.ffn = cuda::FfnMode::dense;
  LlamaCuda dense(w, o);
  o.ffn = cuda::FfnMode::twell;
  LlamaCuda twell(w, o);
  o.prefill_gather = false;
  LlamaCuda no_gather(w, o);
  LlamaCuda* models[3] = {&dense, &twell, &no_gather};
  const char* names[3] = {"dense", "twell", "twell_no_gather"};
  // The reference: the dense model's prefill of the whole conversation (its second call: the shape's
  // first may take another attention kernel, PrefillAttention::automatic).
  const std::vector<int32_t> turn = random_tokens(N, V, rng());
  std::vector<int32_t> whole = history;
  whole.insert(whole.end(), turn.begin(), turn.end());
  dense.prefill(whole);
  const Tensor want = dense.prefill(whole);
  double err[3];
  int64_t gathered[3];
  bool graphed[3];
  for (int k = 0; k < 3; ++k) {
    models[k]->prefill(history);  // the history's FFN (dense by its size) measures each layer's density
    err[k] = relative_error(models[k]->prefill_from(C, turn), want);
    const std::vector<cuda::FfnPath> paths = models[k]->ffn_paths();
    gathered[k] = std::count(paths.begin(), paths.end(), cuda::FfnPath::gather);
    // A turn's third call of its length launches the graph that the timed calls replay
    // (LlamaCudaOptions::cuda_graphs): checked as well.
    models[k]->prefill_from(C, turn);
    const double again = relative_error(models[k]->prefill_from(C, turn), want);
    if (!(again <= err[k])) err[k] = again;  // the larger, or NaN
    graphed[k] = models[k]->prefill_kernels().graph;
  }
  char line[512];
  std::snprintf(line, sizeof line, "turn of %lld tokens after %lld cached: the FFN gathers in %lld/%lld layers (twell), "
                "%lld/%lld (twell_no_gather); rel err against a prefill of the whole: dense %.2e, twell %.2e / %.2e\n",
                static_cast<long long>(N), static_cast<long long>(C), static_cast<long long>(gathered[1]),
                static_cast<long long>(L), static_cast<long long>(gathered[2]), static_cast<long long>(L), err[0],
                err[1], err[2]);
  progress << "  " << line;
  const double bound = 2 * check.prefill_dense + 1e-3;
  bool ok[3];
  for (int k = 0; k < 3; ++k) ok[k] = err[k] <= bound;  // (NaN fails) a model that failed is not timed
  Timing t[3];
  const int calls = cfg.warmup + cfg.iters;
  StepProgress steps(progress, "turn timing: ", calls);
  for (int i = 0; i < calls; ++i) {
    const std::vector<int32_t> next = random_tokens(N, V, rng());
    for (int j = 0; j < 3; ++j) {
      const int k = (i + j) % 3;
      if (!ok[k]) continue;
      models[k]->prefill_from(C, next);
      if (i >= cfg.warmup) t[k].ms.push_back(models[k]->last_gpu_ms());
    }
    steps.step(i + 1);
  }
  steps.finish();
  for (int k = 0; k < 3; ++k) {
    BenchRecord r = record("model_turn", names[k], cfg, N, t[k], double(N), w->bytes() + models[k]->workspace_bytes(),
                           cal.sample_nnz(), t[0].median(), check.prefill_dense, err[k]);
    if (!ok[k]) r.correct = false, r.ratio_to_dense = NAN;
    if (!ok[0]) r.ratio_to_dense = NAN;
    std::snprintf(line, sizeof line, "one sequence: %lld new tokens after %lld cached (prefill_from); the FFN gathers in "
                  "%lld of %lld layers; %s; GPU time of prefill_from; its first and third calls (the third launches "
                  "the graph, where one is replayed) checked against the dense model's prefill of the whole conversation",
                  static_cast<long long>(N), static_cast<long long>(C), static_cast<long long>(gathered[k]),
                  static_cast<long long>(L), graphed[k] ? "replayed as a CUDA graph" : "its kernels launched one by one");
    r.note = line;
    if (N > 1 && N <= cuda::kFewTokenGemmMaxTokens)
      r.note += cfg.few_token_gemm ? "; QKV and O projections (and the FFN's gate): twell's few-token GEMM"
                                   : "; projections: cuBLASLt (--no-few-token-gemm)";
    r.distribution = "turn";
    out.push_back(r);
  }
}

}  // namespace

std::vector<BenchRecord> run_model_bench(const ModelBenchConfig& cfg, std::ostream& progress, std::string* failure) {
  // The arguments first, so that a typo fails at once, on any machine.
  TWELL_REQUIRE(cfg.prefill || cfg.decode || cfg.ragged > 0 || cfg.long_prompt > 0 || !cfg.turns.empty(),
                "bench model: --no-prefill and --no-decode together leave nothing to run (without --ragged, --long or "
                "--turn)");
  for (const int64_t n : cfg.turns)
    TWELL_REQUIRE(n >= 1, "bench model: --turn must be positive, got ", n);
  TWELL_REQUIRE(cfg.turn_context >= 1, "bench model: --turn-context must be positive, got ", cfg.turn_context);
  TWELL_REQUIRE(cfg.long_prompt == 0 || cfg.long_prompt >= 2, "bench model: --long must be 0 (none) or at least 2 "
                "tokens (its check compares each position's next-token loss), got ", cfg.long_prompt);
  TWELL_REQUIRE(cfg.iters >= 1 && cfg.warmup >= 0 && cfg.steps >= 1, "bench model: --iters and --steps must be "
                "positive and --warmup not negative, got ", cfg.iters, ", ", cfg.steps, " and ", cfg.warmup);
  const int32_t compression = cuda::FfnOptions{}.compression;
  TWELL_REQUIRE(cfg.tile == 0 || (cfg.tile >= 1 && cfg.tile % compression == 0), "bench model: --tile must be 0 (the "
                "FFN's default) or a multiple of the TwELL compression ", compression, ", got ", cfg.tile);
  TWELL_REQUIRE(cfg.batch >= 1 && cfg.seq >= 1 && cfg.context >= 1, "bench model: --batch, --seq and --context must be "
                "positive, got ", cfg.batch, ", ", cfg.seq, ", ", cfg.context);
  for (const int64_t b : cfg.decode_batches)
    TWELL_REQUIRE(b >= 1, "bench model: --decode-batch must be positive, got ", b);
  TWELL_REQUIRE(cfg.density > 0 && cfg.density <= 1, "bench model: --density must be in (0, 1], got ", cfg.density);
  TWELL_REQUIRE(cfg.check_tokens >= 2, "bench model: --check-tokens must be at least 2, got ", cfg.check_tokens);
  TWELL_REQUIRE(cfg.decode_attention_splits >= 0 && cfg.decode_attention_splits <= cuda::kMaxDecodeAttentionSplits,
                "bench model: --decode-attention-splits must lie in [0, ", cuda::kMaxDecodeAttentionSplits, "], got ",
                cfg.decode_attention_splits);
  TWELL_REQUIRE(cuda::valid_decode_attention_warps(cfg.decode_attention_warps),
                "bench model: --decode-attention-warps must be 0, 1, 2 or 4, got ", cfg.decode_attention_warps);
  const io::ModelConfig c = model_config(cfg);
  std::string why;
  TWELL_REQUIRE(cuda::hopper_available(&why), "twell bench model needs a Hopper GPU: ", why);
  check_memory(c, cfg);
  const auto t0 = Clock::now();
  auto w = make_weights(c, cfg.seed);
  char line[200];
  std::snprintf(line, sizeof line, "model: %lld layers, hidden %lld, FFN %lld, %lld heads (head_dim %lld), vocab %lld: %.2f GB of bf16 weights (%.1f s)\n",
                static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.intermediate_size), static_cast<long long>(c.num_attention_heads),
                static_cast<long long>(c.head_dim), static_cast<long long>(c.vocab_size), w->bytes() / 1e9,
                seconds_since(t0));
  progress << line;
  const Calibration cal =
      calibrate(w, cfg.density, std::min<int64_t>(2048, c.max_position_embeddings), 4, cfg.seed, progress);
  if (!cfg.save_dir.empty()) {
    const auto ts = Clock::now();
    w->download().save_dir(cfg.save_dir);
    std::snprintf(line, sizeof line, " (%.1f s): twell run / eval it with --byte-tokenizer\n", seconds_since(ts));
    progress << "wrote the calibrated model to " << cfg.save_dir << line;
  }
  const CheckResult check =
      check_against_cpu(w, cfg, cfg.check_tokens, cfg.seed, attention_mode(cfg.attention), progress);
  GpuMeter energy;
  std::vector<BenchRecord> out;
  const bool dense_ok = check.prefill_dense >= 0 && check.prefill_dense <= kDenseTolerance &&
                        check.decode_dense >= 0 && check.decode_dense <= kDenseTolerance;
  if (!dense_ok || !twell_ok(check.prefill_twell, check.prefill_dense) ||
      !twell_ok(check.decode_twell, check.decode_dense)) {  // reported, never timed
    for (const char* bench : {"model_prefill", "model_decode"})
      for (const char* impl : {"dense", "twell"}) {
        BenchRecord r;
        r.bench = bench, r.impl = impl, r.gpu = cuda::device_info().name, r.layers = cfg.layers;
        r.H = cfg.hidden, r.I = cfg.ffn, r.density = cfg.density, r.nnz_per_token_mean = cal.mean_nnz;
        const bool prefill = bench[6] == 'p';
        r.M = prefill ? cfg.batch * cfg.seq : cfg.decode_batches.empty() ? 1 : cfg.decode_batches.front();
        r.distribution = "calibrated";
        r.dense_rel_err = prefill ? check.prefill_dense : check.decode_dense;
        r.rel_err = impl[0] == 'd' ? r.dense_rel_err : prefill ? check.prefill_twell : check.decode_twell;
        r.note = "failed the CPU reference check: not timed";
        r.commit = TWELL_GIT_SHA;
        r.command = cfg.command;
        out.push_back(r);
      }
    return out;
  }
  std::string phase;
  try {
    if (cfg.prefill) {
      phase = "the prefill";
      prefill_bench(w, cfg, cal, check, energy, out, progress);
    }
    for (int64_t B : cfg.decode ? cfg.decode_batches : std::vector<int64_t>{}) {
      phase = str("decode at batch ", B);
      decode_bench(w, cfg, B, cal, check, energy, out, progress);
    }
    if (cfg.ragged > 0) {
      phase = "the ragged prefill";
      ragged_bench(w, cfg, cal, check, out, progress);
    }
    if (cfg.long_prompt > 0) {
      phase = "the long prompt";
      long_bench(w, cfg, cal, check, out, progress);
    }
    for (const int64_t n : cfg.turns) {
      phase = str("the turn of ", n, " tokens");
      turn_bench(w, cfg, n, cal, check, out, progress);
    }
  } catch (const std::exception& e) {  // the phases before it keep their records
    if (!failure || out.empty()) throw;
    *failure = str(phase, ": ", e.what());
    progress << "stopped in " << *failure << "\n";
  }
  return out;
}

#endif

}  // namespace twell::bench
