// The GPU model runtime (twell::cuda::LlamaCuda) against the CPU backend on the same bf16 weights,
// and against HuggingFace transformers on the gpu_* fixtures of tests/model/make_hf_fixture.py:
// full forward, KV-cache prefill + decode (eager and graph-replayed), batches, the twell and the
// dense FFN, head_dim 16/32/64/128, sequences crossing attention tiles, and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/io_test_util.h"
#include "cpu/parallel.h"
#include "cuda/cudnn_sdpa.h"
#include "cuda/kernels.h"
#include "gpu_test.h"
#include "model/llama_test_util.h"
#include "twell/cuda/llama.h"
#include "twell/model/load.h"

namespace twell::cuda {
namespace {

using model::LlamaCpu;
using model::LlamaWeights;

struct Shape {
  const char* name;
  int64_t H, I, heads, kv_heads, head_dim, vocab, max_pos;
  const char* act;
  bool tied;
};

// The FFN widths are multiples of 64 (FfnForward) except "odd_ffn" (the dense fallback).
const Shape kShapes[] = {
    {"hd16_gqa_relu", 64, 192, 4, 2, 16, 97, 160, "relu", true},
    {"hd32_relu_untied", 128, 256, 4, 4, 32, 130, 160, "relu", false},
    {"hd64_silu", 128, 320, 2, 1, 64, 97, 160, "silu", true},
    {"hd128_gqa_relu", 256, 512, 4, 2, 128, 256, 160, "relu", true},
    {"odd_ffn_relu", 64, 176, 4, 2, 16, 97, 160, "relu", false},
    // Heads that do not span H (head_dim given: q_proj [96, 64]; 64 is not a multiple of 3).
    {"heads3_hd32_relu", 64, 192, 3, 1, 32, 97, 160, "relu", true},
};

io::ModelConfig config_of(const Shape& s) {
  io::ModelConfig c = model::tiny_config(s.act, s.tied);
  c.hidden_size = s.H, c.intermediate_size = s.I, c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads, c.head_dim = s.head_dim, c.vocab_size = s.vocab;
  c.max_position_embeddings = s.max_pos;
  return c;
}

// Random HF tensors, loaded as bf16 (the GPU's storage), so both backends see the same weights.
// q_proj and k_proj are scaled down: at the shared generator's scale the attention scores have a
// standard deviation of ~16, softmax is nearly one-hot, and bf16 rounding of q and k alone moves
// the logits by 5% (HF's own bf16 model differs from its fp32 one by as much); trained models
// are far better conditioned.
// The model directory of such weights (the caller removes it).
std::string write_test_model(const io::ModelConfig& c, uint64_t seed) {
  const std::string dir = ::testing::TempDir() + "twell_llama_cuda_" + std::to_string(seed);
  model::HfTensors t = model::random_hf_tensors(c, seed);
  for (auto& [name, tensor] : t)
    if (name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos)
      for (int64_t i = 0; i < tensor.numel(); ++i) tensor.ptr<float>()[i] *= 0.2f;
  model::write_hf(dir, c, t);
  return dir;
}

LlamaWeights load_bf16(const std::string& dir) {
  model::LlamaLoadOptions lo;
  lo.dtype = DType::bf16;
  return LlamaWeights::load_dir(dir, lo);
}

LlamaWeights bf16_weights(const io::ModelConfig& c, uint64_t seed) {
  const std::string dir = write_test_model(c, seed);
  LlamaWeights w = load_bf16(dir);
  std::filesystem::remove_all(dir);
  return w;
}

// One model on both backends: the GPU's weights and the CPU reference, over the same bf16 weights.
struct BothBackends {
  std::shared_ptr<LlamaCudaWeights> gpu;
  LlamaCpu cpu;
};
BothBackends both_backends(const io::ModelConfig& c, uint64_t seed) {
  LlamaWeights w = bf16_weights(c, seed);
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(w));
  return {std::move(dw), LlamaCpu(std::move(w))};
}

std::vector<int32_t> some_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((seed * 131 + i * i * 7 + i * 3) % vocab);
  return t;
}

Tensor rows(const Tensor& t, int64_t r0, int64_t n) {
  const int64_t V = t.shape()[1];
  return Tensor::copy_of(TensorView(t.ptr<float>() + r0 * V, DType::f32, {n, V}));
}

// bf16 activations through two layers against the fp32 CPU model on the same bf16 weights:
// measured up to 9e-3 over whole logit matrices, and single rows fluctuate more.
constexpr double kTol = 1.5e-2;

// Whether cuDNN's SDPA can be loaded; prints why not, and fails the test when TWELL_REQUIRE_CUDNN
// is set (scripts/gpu-check.sh sets it where PyTorch's cuDNN is present).
bool cudnn_or_skip_note() {
  std::string why;
  if (CudnnSdpa::available(&why)) return true;
  if (std::getenv("TWELL_REQUIRE_CUDNN")) ADD_FAILURE() << "TWELL_REQUIRE_CUDNN is set, but " << why;
  std::printf("cuDNN runs skipped: %s\n", why.c_str());
  return false;
}

class LlamaCudaShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(LlamaCudaShapes, FullForwardMatchesCpu) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(GetParam());
  const auto [dw, cpu] = both_backends(c, 11);
  // twell forced onto its sparse paths at every size: TwELL (gather off), and gather (default,
  // up to 256 tokens); then dense.
  // The prefill attention: twell's kernel, and cuDNN's SDPA at every size where it loads.
  const struct {
    FfnMode mode;
    int64_t gather;
    PrefillAttention attention;
    const char* name;
  } runs[] = {{FfnMode::twell, 0, PrefillAttention::twell, "twell"},
              {FfnMode::twell, 256, PrefillAttention::twell, "gather"},
              {FfnMode::dense, 0, PrefillAttention::twell, "dense"},
              {FfnMode::twell, 0, PrefillAttention::cudnn, "twell+cudnn"}};
  for (const auto& run : runs) {
    if (run.attention == PrefillAttention::cudnn && !cudnn_or_skip_note()) continue;
    LlamaCudaOptions o;
    o.ffn = run.mode;
    o.prefill_attention = run.attention;
    o.ffn_options.dispatch = Dispatch::always_sparse;
    o.ffn_options.gather_max_tokens = run.gather;
    LlamaCuda gpu(dw, o);
    for (int64_t T : {1, 21, 63, 64, 65, 150}) {
      const auto tokens = some_tokens(T, c.vocab_size, T);
      const double err = relative_error(gpu.logits(tokens), cpu.logits(tokens));
      std::printf("%s %s T=%lld: rel err %.2e\n", GetParam().name, run.name, static_cast<long long>(T), err);
      EXPECT_LT(err, kTol) << run.name << " T=" << T;
    }
  }
}

TEST_P(LlamaCudaShapes, PrefillDecodeMatchesFullForward) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(GetParam());
  const auto [dw, cpu] = both_backends(c, 12);
  const auto tokens = some_tokens(70, c.vocab_size, 5);
  const Tensor ref = cpu.logits(tokens);
  Tensor fused_steps, unfused_steps;
  // Decode FFN: dense, the gather path's one-kernel FFN (batch 1), and its gate GEMV + gather
  // kernels.
  for (const auto& [gather, fused] : {std::pair{0, true}, std::pair{8, true}, std::pair{8, false}}) {
    LlamaCudaOptions o;
    o.decode_gather_tokens = gather;
    o.fused_decode_ffn = fused;
    // The prompt's attention through cuDNN (where it loads) with the dense decode FFN; the decode
    // steps read the cache either way.
    if (gather == 0 && cudnn_or_skip_note()) o.prefill_attention = PrefillAttention::cudnn;
    LlamaCuda gpu(dw, o);
    // Prompt of 60, then 10 decode steps: the first two eager, the third captured, the rest replayed.
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 60);
    Tensor last = gpu.prefill(prompt);
    EXPECT_LT(relative_error(TensorView(last.view().data, DType::f32, {1, c.vocab_size}), rows(ref, 59, 1)), kTol);
    for (int64_t t = 60; t < 70; ++t) {
      last = gpu.decode_step(tokens[t]);
      const double err =
          relative_error(TensorView(last.view().data, DType::f32, {1, c.vocab_size}), rows(ref, t, 1));
      EXPECT_LT(err, kTol) << "decode position " << t << ", gather up to " << gather << (fused ? ", fused" : "");
    }
    EXPECT_EQ(gpu.cached_tokens(), 70);
    if (gather > 0) (fused ? fused_steps : unfused_steps) = std::move(last);
  }
  // The two gather forms add the same products in other orders: close, not bitwise.
  EXPECT_LT(relative_error(fused_steps, unfused_steps), 2e-2);
}

TEST_P(LlamaCudaShapes, BatchEqualsSingleSequences) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(GetParam());
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 13)));
  LlamaCudaOptions o;
  o.max_batch = 3;
  o.decode_gather_tokens = 2;  // single sequences decode through the gather path, the batch densely
  std::vector<std::vector<int32_t>> prompts;
  for (uint64_t s = 0; s < 3; ++s) prompts.push_back(some_tokens(33, c.vocab_size, 40 + s));
  const std::vector<int32_t> next = {1, 2, 3};
  // Each sequence alone: its prefill's logits, then four decode steps' (as the batch's below).
  std::vector<std::vector<Tensor>> alone;
  {
    LlamaCuda single(dw, o);
    for (int64_t s = 0; s < 3; ++s) {
      alone.emplace_back();
      alone.back().push_back(single.prefill_batch({prompts[s]}));
      for (int step = 0; step < 4; ++step) alone.back().push_back(single.decode_batch({next[s]}));
    }
  }
  for (const bool few : {false, true}) {  // the batch's projections through cuBLASLt, then the few-token GEMM
    SCOPED_TRACE(few ? "few-token GEMM" : "cuBLASLt");
    o.few_token_gemm = few;
    LlamaCuda batched(dw, o);
    const Tensor b0 = batched.prefill_batch(prompts);
    const Tensor b0e = batched.decode_batch(next);  // eager (plans)
    const Tensor b1 = batched.decode_batch(next);   // eager (cuBLASLt's autotune)
    const Tensor b2 = batched.decode_batch(next);   // captured
    const Tensor b3 = batched.decode_batch(next);   // replayed
    for (int64_t s = 0; s < 3; ++s) {
      const std::vector<Tensor>& a = alone[static_cast<size_t>(s)];
      // Batched GEMMs may sum in another order than single ones: kTol, not bitwise.
      EXPECT_LT(relative_error(rows(b0, s, 1), a[0]), kTol) << "sequence " << s;
      EXPECT_LT(relative_error(rows(b0e, s, 1), a[1]), kTol);
      EXPECT_LT(relative_error(rows(b1, s, 1), a[2]), kTol);
      EXPECT_LT(relative_error(rows(b2, s, 1), a[3]), kTol);
      EXPECT_LT(relative_error(rows(b3, s, 1), a[4]), kTol);
    }
  }
}

// Prompts of different lengths in one batch (padded to the longest in the prefill), then decode
// steps at each sequence's own position, some sequences sitting steps out (kNoToken): every row as
// the sequence's own run gives it, rows that sat out zeros; the steps eager, captured and replayed.
TEST_P(LlamaCudaShapes, RaggedBatchEqualsSingleSequences) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(GetParam());
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 14)));
  // By default these random (about half dense) models decode their batches on the dense FFN; forced
  // sparse, ReLU models decode them on the gather path.
  for (const Dispatch dispatch : {Dispatch::previous, Dispatch::always_sparse}) {
    SCOPED_TRACE(dispatch == Dispatch::previous ? "default dispatch" : "always_sparse");
    LlamaCudaOptions o;
    o.max_batch = 4;
    o.ffn_options.dispatch = dispatch;
    LlamaCuda batched(dw, o), single(dw, o);
    const std::vector<int64_t> lengths = {33, 5, 1, 20};
    std::vector<std::vector<int32_t>> prompts;
    for (size_t s = 0; s < lengths.size(); ++s) prompts.push_back(some_tokens(lengths[s], c.vocab_size, 50 + s));
    const Tensor b0 = batched.prefill_batch(prompts);
    EXPECT_EQ(batched.cached_lengths(), lengths);
    const int32_t no = model::kNoToken;
    const std::vector<std::vector<int32_t>> steps = {
        {1, 2, 3, 4}, {no, 5, 6, 7}, {8, no, 9, 10}, {11, no, 12, 13}, {14, no, 15, 16}, {17, 18, 19, 20}};
    std::vector<Tensor> b;
    for (const auto& step : steps) {
      b.push_back(batched.decode_batch(step));
      if (dispatch == Dispatch::always_sparse && c.hidden_act == "relu" && c.intermediate_size % 64 == 0)
        EXPECT_EQ(batched.ffn_paths()[0], FfnPath::gather);
    }
    EXPECT_EQ(batched.cached_lengths(), (std::vector<int64_t>{38, 8, 7, 26}));
    for (size_t s = 0; s < prompts.size(); ++s) {
      SCOPED_TRACE(testing::Message() << "sequence " << s);
      EXPECT_LT(relative_error(rows(b0, s, 1), single.prefill_batch({prompts[s]})), kTol);
      for (size_t i = 0; i < steps.size(); ++i) {
        if (steps[i][s] == no) {
          EXPECT_EQ(relative_error(rows(b[i], s, 1), Tensor(DType::f32, {1, c.vocab_size})), 0.0) << "step " << i;
          continue;
        }
        EXPECT_LT(relative_error(rows(b[i], s, 1), single.decode_batch({steps[i][s]})), kTol) << "step " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LlamaCudaShapes, ::testing::ValuesIn(kShapes),
                         [](const auto& info) { return std::string(info.param.name); });

// Calls of 512 tokens or more take the fused QKV GEMM + RoPE (qkv_rope.cu) where the shape allows:
// against the CPU model and against the unfused path, then decode steps from the cache it wrote.
TEST(LlamaCuda, FusedQkvRopeMatchesCpuAndUnfused) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of({"fused_qkv", 256, 512, 4, 4, 64, 97, 640, "relu", true});
  ASSERT_TRUE(qkv_rope_supported(c.hidden_size, 4, 4, 64));
  const auto [dw, cpu] = both_backends(c, 21);
  const auto tokens = some_tokens(603, c.vocab_size, 9);
  const Tensor ref = cpu.logits(tokens);
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 600);
  Tensor last[2];
  for (bool fused : {false, true}) {
    LlamaCudaOptions o;
    o.fused_qkv_rope = fused;
    LlamaCuda gpu(dw, o);
    const double full = relative_error(gpu.logits(prompt), rows(ref, 0, 600));
    EXPECT_EQ(gpu.prefill_kernels().fused_qkv_rope, fused);
    last[fused] = gpu.prefill(prompt);
    std::printf("fused %d: full forward rel err %.2e\n", fused, full);
    EXPECT_LT(full, kTol) << "fused " << fused;
    for (int64_t t = 600; t < 603; ++t) {
      const Tensor step = gpu.decode_step(tokens[t]);
      EXPECT_LT(relative_error(TensorView(step.view().data, DType::f32, {1, c.vocab_size}), rows(ref, t, 1)), kTol)
          << "fused " << fused << ", decode position " << t;
    }
  }
  EXPECT_LT(relative_error(last[1], last[0]), 2e-3);
}

// The residual add + RMSNorm after each FFN run by the FFN (LlamaCudaOptions::ffn_residual_norm:
// on twell's TwELL path by its down pass, heavy rows included at this density) against the separate
// kernel: prefill and decode steps, both against the CPU model and close to each other (only the
// sum of squares is added in another order).
TEST(LlamaCuda, FfnResidualNormMatchesTheSeparateKernel) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of({"ffn_norm", 256, 1024, 4, 4, 64, 97, 640, "relu", false});
  const auto [dw, cpu] = both_backends(c, 23);
  const auto tokens = some_tokens(203, c.vocab_size, 5);
  const Tensor ref = cpu.logits(tokens);
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 200);
  Tensor full[2], steps[2];
  for (bool fused : {false, true}) {
    LlamaCudaOptions o;
    o.ffn_residual_norm = fused;
    o.ffn_options.dispatch = Dispatch::always_sparse;
    o.ffn_options.gather_max_tokens = 0;  // TwELL for the decode steps too
    LlamaCuda gpu(dw, o);
    full[fused] = gpu.logits(prompt);
    const double err = relative_error(full[fused], rows(ref, 0, 200));
    std::printf("ffn_residual_norm %d: full forward rel err %.2e\n", fused, err);
    EXPECT_LT(err, kTol) << "fused " << fused;
    (void)gpu.prefill(prompt);
    steps[fused] = Tensor::of<float>({3, c.vocab_size});
    for (int64_t t = 200; t < 203; ++t) {
      const Tensor step = gpu.decode_step(tokens[t]);
      EXPECT_LT(relative_error(TensorView(step.view().data, DType::f32, {1, c.vocab_size}), rows(ref, t, 1)), kTol)
          << "fused " << fused << ", decode position " << t;
      std::memcpy(steps[fused].ptr<float>() + (t - 200) * c.vocab_size, step.view().data, c.vocab_size * 4);
    }
  }
  EXPECT_LT(relative_error(full[1], full[0]), 2e-3);
  EXPECT_LT(relative_error(steps[1], steps[0]), 2e-3);
}

// Model item 31: the attention's residual add deferred to the norm after the FFN (the default)
// gives the bits of adding it where it is computed, on every FFN ending: twell's down pass with
// the norm, the separate norm after twell's FFN, and the dense FFN (whose norm FfnForward runs).
TEST(LlamaCuda, DeferredResidualAddKeepsTheBits) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of({"deferred_add", 256, 1024, 4, 4, 64, 97, 640, "relu", false});
  const auto [dw, cpu] = both_backends(c, 29);
  const auto tokens = some_tokens(200, c.vocab_size, 7);
  const Tensor ref = cpu.logits(tokens);
  for (const FfnMode mode : {FfnMode::twell, FfnMode::dense})
    for (bool fused_norm : {true, false}) {
      Tensor out[2];
      for (bool deferred : {false, true}) {
        LlamaCudaOptions o;
        o.ffn = mode;
        o.ffn_residual_norm = fused_norm;
        o.deferred_residual_add = deferred;
        if (mode == FfnMode::twell) o.ffn_options.dispatch = Dispatch::always_sparse;
        LlamaCuda gpu(dw, o);
        out[deferred] = gpu.logits(tokens);
      }
      EXPECT_LT(relative_error(out[1], ref), kTol);
      ASSERT_EQ(out[0].nbytes(), out[1].nbytes());
      EXPECT_EQ(std::memcmp(out[0].view().data, out[1].view().data, out[0].nbytes()), 0)
          << "twell " << (mode == FfnMode::twell) << ", the norm in the FFN " << fused_norm;
    }
}

// Llama 3.2 1B's shape in two layers: GQA 32:8, a 128256-token vocabulary (ids past 65535), a
// SiLU FFN of 8192, RoPE theta 5e5 with llama3 scaling, a tied head, and the 131072-position context
// the config declares (the KV cache and the RoPE table at full length). Weights are built in memory
// (uniform, standard deviation 1/sqrt(fan-in); q and k halved) from a counter-based hash, which is
// fast at 400 M weights. Full forward, prefill and graph-replayed decode against the CPU backend.
// Both backends build their RoPE tables from ModelConfig::rope_inv_freq, so this checks the shapes,
// not the scaling: the gpu_relu_llama3 fixture (HF parity, below) and ModelConfig's tests do that.
TEST(LlamaCuda, Llama32ShapeMatchesCpu) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = model::tiny_config("silu", true);
  c.hidden_size = 2048, c.intermediate_size = 8192, c.num_attention_heads = 32, c.num_key_value_heads = 8;
  c.head_dim = 64, c.vocab_size = 128256, c.max_position_embeddings = 131072, c.rope_theta = 5e5;
  c.rope_scaling.type = "llama3", c.rope_scaling.factor = 32, c.rope_scaling.low_freq_factor = 1;
  c.rope_scaling.high_freq_factor = 4, c.rope_scaling.original_max_position_embeddings = 8192;
  c.validate();
  uint64_t stream = 0x5eed;
  auto filled = [&](twell::Shape shape, double stddev, double mean = 0) {
    Tensor t(DType::bf16, std::move(shape));
    bf16* p = t.ptr<bf16>();
    const uint64_t base = ++stream << 40;
    const double half_width = stddev * std::sqrt(3.0);
    cpu::parallel_for(t.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        uint64_t z = base + static_cast<uint64_t>(i) + 0x9e3779b97f4a7c15ull;  // splitmix64
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const double u = static_cast<double>(z >> 11) * 0x1.0p-53 * 2 - 1;  // [-1, 1)
        p[i] = bf16(static_cast<float>(mean + half_width * u));
      }
    });
    return t;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size, q_dim = 32 * 64, kv_dim = 8 * 64;
  LlamaWeights w;
  w.config = c;
  w.embed = filled({c.vocab_size, H}, 1.0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    model::LlamaLayerWeights L;
    L.input_norm = filled({H}, 0.1, 1.0);
    L.wq = filled({q_dim, H}, 0.5 / std::sqrt(double(H)));
    L.wk = filled({kv_dim, H}, 0.5 / std::sqrt(double(H)));
    L.wv = filled({kv_dim, H}, 1 / std::sqrt(double(H)));
    L.wo = filled({H, q_dim}, 1 / std::sqrt(double(q_dim)));
    L.post_norm = filled({H}, 0.1, 1.0);
    L.wg = filled({I, H}, 1 / std::sqrt(double(H)));
    L.wu = filled({I, H}, 1 / std::sqrt(double(H)));
    L.wd = filled({I, H}, 1 / std::sqrt(double(I)));  // neuron-major
    w.layers.push_back(std::move(L));
  }
  w.final_norm = filled({H}, 0.1, 1.0);
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(w));
  const LlamaCpu cpu(std::move(w));
  std::vector<int32_t> tokens = some_tokens(44, c.vocab_size, 3);
  tokens[5] = 128255, tokens[17] = 65536, tokens[30] = 100000;  // ids past 16 bits
  const Tensor ref = cpu.logits(tokens);
  LlamaCuda gpu(dw);
  const double full = relative_error(gpu.logits(tokens), ref);
  Tensor last = gpu.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + 40));
  const double prefill = relative_error(TensorView(last.view().data, DType::f32, {1, c.vocab_size}), rows(ref, 39, 1));
  double decode = 0;
  for (int64_t t = 40; t < 44; ++t) {  // eager, eager, captured, replayed
    last = gpu.decode_step(tokens[t]);
    decode = std::max(decode, relative_error(TensorView(last.view().data, DType::f32, {1, c.vocab_size}), rows(ref, t, 1)));
  }
  std::printf("Llama 3.2 shape, 2 layers: rel err full %.2e, prefill %.2e, decode (worst of 4) %.2e\n", full, prefill,
              decode);
  EXPECT_LT(full, kTol);
  EXPECT_LT(prefill, kTol);
  EXPECT_LT(decode, kTol);
  EXPECT_EQ(gpu.cached_tokens(), 44);
  // What the declared context costs: the buffers for 131072 positions against those `twell run`
  // allocates for a 40-token prompt and 64 new tokens.
  LlamaCudaOptions sized;
  sized.max_context = 104;
  std::printf("buffers beside the weights: %.2f GB for the config's context, %.3f GB for 104 positions\n",
              gpu.workspace_bytes() / 1e9, LlamaCuda(dw, sized).workspace_bytes() / 1e9);
}

// cuDNN's attention over a cached prefix (past > 0, the causal diagonal aligned bottom-right):
// prefill 60 tokens, then enqueue 40 more in one call, against the CPU model's full forward.
TEST(LlamaCuda, CudnnAttentionOverACachedPrefix) {
  TWELL_REQUIRE_HOPPER();
  if (!cudnn_or_skip_note()) return;
  for (const Shape& shape : {kShapes[2], kShapes[3]}) {  // head_dim 64 (GQA 2:1), 128 (GQA 2:1)
    SCOPED_TRACE(shape.name);
    const io::ModelConfig c = config_of(shape);
    const auto [dw, cpu] = both_backends(c, 23);
    const auto tokens = some_tokens(100, c.vocab_size, 3);
    const Tensor ref = cpu.logits(tokens);
    LlamaCudaOptions o;
    o.prefill_attention = PrefillAttention::cudnn;
    LlamaCuda gpu(dw, o);
    gpu.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + 60));
    DeviceBuffer next(40 * 4);
    TWELL_CUDA_CHECK(cudaMemcpy(next.get(), tokens.data() + 60, 40 * 4, cudaMemcpyHostToDevice));
    gpu.enqueue(next.as<int32_t>(), 1, 40, Head::all);
    EXPECT_EQ(gpu.prefill_kernels().attention.rfind("cudnn", 0), 0u) << gpu.prefill_kernels().attention;
    Tensor got(DType::f32, {40, c.vocab_size});
    TWELL_CUDA_CHECK(cudaStreamSynchronize(gpu.stream()));
    TWELL_CUDA_CHECK(cudaMemcpy(got.view().data, gpu.logits_device(), got.nbytes(), cudaMemcpyDeviceToHost));
    const double err = relative_error(got, rows(ref, 60, 40));
    std::printf("%s: 40 tokens after a cached prefix of 60, cuDNN attention: rel err %.2e\n", shape.name, err);
    EXPECT_LT(err, kTol);
    EXPECT_EQ(gpu.cached_tokens(), 100);
  }
}

// prefill_from keeps a prefix of the cached sequence and runs the rest after it: the CPU model's
// logits for the whole sequence, with twell's attention and cuDNN's, in one forward and in chunks
// of max_tokens; refused calls change nothing. A PromptCache's second turn reuses the first's
// positions, and draws on the GPU (prefill_from_sample) what the host draws from the same logits.
TEST(LlamaCuda, PrefillFromAKeptPrefixMatchesCpu) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[3]);  // head_dim 128, GQA 2:1, 160 positions
  const auto [dw, cpu] = both_backends(c, 31);
  const auto tokens = some_tokens(150, c.vocab_size, 7);
  const Tensor ref = cpu.logits(tokens);
  const bool cudnn = cudnn_or_skip_note();
  for (const auto& [max_tokens, attention] :
       {std::pair{int64_t{0}, PrefillAttention::twell}, std::pair{int64_t{32}, PrefillAttention::twell},
        std::pair{int64_t{0}, PrefillAttention::cudnn}}) {
    if (attention == PrefillAttention::cudnn && !cudnn) continue;
    LlamaCudaOptions o;
    o.max_tokens = max_tokens;
    o.prefill_attention = attention;
    o.max_batch = 2;
    LlamaCuda gpu(dw, o);
    const std::vector<int32_t> first(tokens.begin(), tokens.begin() + 100);
    for (int64_t keep : {101, 60, 1}) {
      SCOPED_TRACE(testing::Message() << "max_tokens " << max_tokens << ", keep " << keep
                                      << (attention == PrefillAttention::cudnn ? ", cuDNN" : ""));
      gpu.prefill(first);
      gpu.decode_step(tokens[100]);  // the cache: tokens[0..100]
      const Tensor last = gpu.prefill_from(keep, std::vector<int32_t>(tokens.begin() + keep, tokens.end()));
      EXPECT_LT(relative_error(TensorView(last.view().data, DType::f32, {1, c.vocab_size}), rows(ref, 149, 1)), kTol);
      EXPECT_EQ(gpu.cached_lengths(), std::vector<int64_t>{150});
    }
    // Refused, changing nothing: keep past the cache, past the context, bad ids, a batch cached.
    gpu.decode_step(tokens[0]);  // position 150
    EXPECT_THROW(gpu.prefill_from(152, {1}), Error);
    EXPECT_THROW(gpu.prefill_from(140, std::vector<int32_t>(30, 1)), Error);
    EXPECT_THROW(gpu.prefill_from(10, {1, int32_t(c.vocab_size)}), Error);
    EXPECT_THROW(gpu.prefill_from(10, {}), Error);
    EXPECT_EQ(gpu.cached_lengths(), std::vector<int64_t>{151});
    gpu.prefill_batch({{1, 2}, {3}});
    EXPECT_THROW(gpu.prefill_from(1, {4}), Error);
    EXPECT_EQ(gpu.cached_lengths(), (std::vector<int64_t>{2, 1}));
  }
  // Two turns through a PromptCache, sampled on the GPU.
  LlamaCuda gpu(dw);
  ASSERT_TRUE(gpu.samples_on_gpu());
  model::PromptCache cache;
  const model::SamplingOptions sampled{0.9, 20, 0.9, 17};
  std::vector<int32_t> conversation(tokens.begin(), tokens.begin() + 40);
  const model::Generation one = model::generate(gpu, conversation, 6, sampled, {}, {}, &cache);
  EXPECT_EQ(one.reused, 0);
  conversation.insert(conversation.end(), one.tokens.begin(), one.tokens.end());
  conversation.insert(conversation.end(), tokens.begin() + 50, tokens.begin() + 60);
  const model::Generation two = model::generate(gpu, conversation, 6, sampled, {}, {}, &cache);
  EXPECT_EQ(two.reused, 40 + 6 - 1);
  EXPECT_EQ(two.tokens.size(), 6u);
  EXPECT_EQ(cache.ids.size(), conversation.size() + 5);
  EXPECT_EQ(gpu.cached_lengths(), std::vector<int64_t>{int64_t(cache.ids.size())});
  // The first token of the second turn: the GPU's draw from the kept prefix's logits is the host
  // sampler's from the same logits (the draw of a Sampler seeded alike, that has seen the same ids),
  // the cache rebuilt as the first turn built it (a prefill of 40, then decode steps).
  gpu.prefill(std::vector<int32_t>(conversation.begin(), conversation.begin() + 40));
  for (int i = 0; i < 5; ++i) gpu.decode_step(one.tokens[size_t(i)]);
  const Tensor logits = gpu.prefill_from(45, std::vector<int32_t>(conversation.begin() + 45, conversation.end()));
  model::Sampler host(sampled);
  host.seen(conversation);
  EXPECT_EQ(host.sample(logits.view()), two.tokens[0]);
}

// A few tokens after a cached prefix (a conversation's next turn) on a sparse model take the gather
// FFN in the layers where the call's tokens times the density an earlier prefill measured is at most
// 0.25 (LlamaCudaOptions::prefill_gather), as do a batch of short prompts; the logits are the CPU
// model's and those of the same model without the option, whose FFN runs such calls dense. Not where
// no density was measured yet, nor on a model that is not sparse, nor in a whole-sequence call
// (logits). One token takes the prefill FFN's one-token kernel (reported as gather) either way.
TEST(LlamaCuda, FewTokensAfterACachedPrefixGatherOnASparseModel) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[3]);  // H 256, I 512
  LlamaWeights w = bf16_weights(c, 41);
  auto as_drawn = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(w));
  const int64_t H = c.hidden_size, I = c.intermediate_size, kept = 8;  // gate rows left: density <= 8/512
  for (model::LlamaLayerWeights& l : w.layers) {
    auto* g = static_cast<uint16_t*>(l.wg.view().data);
    std::fill(g + kept * H, g + I * H, uint16_t{0});  // ReLU(0) = 0: those neurons never fire
  }
  auto sparse = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(w));
  LlamaCpu cpu(std::move(w));
  const auto tokens = some_tokens(120, c.vocab_size, 5);
  const Tensor ref = cpu.logits(tokens);
  const std::vector<int32_t> history(tokens.begin(), tokens.begin() + 100);
  auto paths_are = [](const LlamaCuda& m, FfnPath want) {
    for (FfnPath p : m.ffn_paths())
      if (p != want) return false;
    return true;
  };
  auto row = [&](int64_t r) { return rows(ref, r, 1); };
  auto one = [&](const Tensor& t) { return TensorView(t.view().data, DType::f32, {1, c.vocab_size}); };
  LlamaCudaOptions o;
  o.max_batch = 2;
  LlamaCuda gathers(sparse, o), drawn(as_drawn, o);
  o.prefill_gather = false;
  LlamaCuda without(sparse, o);
  // Ten tokens with no density measured: the dense FFN (which measures it).
  const std::vector<int32_t> ten(tokens.begin(), tokens.begin() + 10);
  EXPECT_LT(relative_error(one(gathers.prefill(ten)), row(9)), kTol);
  EXPECT_TRUE(paths_are(gathers, FfnPath::dense));
  for (LlamaCuda* m : {&gathers, &without, &drawn}) m->prefill(history);  // dense by its size; measures
  const std::vector<int32_t> turn(tokens.begin() + 100, tokens.begin() + 110);  // 10 × <= 1.6%: <= 0.16
  const Tensor got = gathers.prefill_from(100, turn);
  EXPECT_TRUE(paths_are(gathers, FfnPath::gather));
  EXPECT_LT(relative_error(one(got), row(109)), kTol);
  const Tensor plain = without.prefill_from(100, turn);
  EXPECT_TRUE(paths_are(without, FfnPath::dense));
  EXPECT_LT(relative_error(got, plain), kTol);
  drawn.prefill_from(100, turn);  // ~50% dense: 10 × 0.5 > 0.25
  EXPECT_TRUE(paths_are(drawn, FfnPath::dense));
  // One token: the one-token kernel, both models; the next turn after it gathers again.
  drawn.prefill_from(110, {tokens[110]});
  EXPECT_TRUE(paths_are(drawn, FfnPath::gather));
  EXPECT_LT(relative_error(one(gathers.prefill_from(110, {tokens[110]})), row(110)), kTol);
  EXPECT_TRUE(paths_are(gathers, FfnPath::gather));
  EXPECT_LT(relative_error(one(gathers.prefill_from(111, std::vector<int32_t>(tokens.begin() + 111, tokens.end()))), row(119)),
            kTol);
  EXPECT_TRUE(paths_are(gathers, FfnPath::gather));
  EXPECT_EQ(gathers.cached_lengths(), std::vector<int64_t>{120});
  // A batch of two short prompts (one run of 2 × 6 rows) gathers, each row the CPU model's.
  const std::vector<int32_t> a(tokens.begin(), tokens.begin() + 6), b(tokens.begin() + 20, tokens.begin() + 25);
  const Tensor both = gathers.prefill_batch({a, b});
  EXPECT_TRUE(paths_are(gathers, FfnPath::gather));
  EXPECT_LT(relative_error(rows(both, 0, 1), row(5)), kTol);
  EXPECT_LT(relative_error(rows(both, 1, 1), rows(cpu.logits(b), 4, 1)), kTol);
  // A whole-sequence call of as few tokens runs the dense FFN, as the option's off.
  gathers.reset();
  EXPECT_LT(relative_error(gathers.logits(ten), rows(ref, 0, 10)), kTol);
  EXPECT_TRUE(paths_are(gathers, FfnPath::dense));
}

// A forward of one sequence of a few tokens (a conversation's next turn) replays a graph from its
// shape's third call (short_prefill_graph): the same turn run five times is launched as a graph from
// the third call on (prefill_kernels().graph) with the second call's logits bit for bit (the first
// runs before cuBLASLt's tune); a turn at a later position replays it, a turn of another length gets
// its own, each with the CPU model's logits, and a decode step after them reads the cache they wrote.
// After 600 cached positions the attention's keys split among two blocks of a cluster (captured too).
// On a sparse model (the gather FFN in every layer) and on the dense FFN.
TEST(LlamaCuda, ShortPrefillsReplayAGraph) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = config_of(kShapes[3]);  // H 256, I 512, head_dim 128
  c.max_position_embeddings = 1024;
  LlamaWeights w = bf16_weights(c, 43);
  const int64_t H = c.hidden_size, I = c.intermediate_size, kept = 8;  // density <= 8/512
  for (model::LlamaLayerWeights& l : w.layers) {
    auto* g = static_cast<uint16_t*>(l.wg.view().data);
    std::fill(g + kept * H, g + I * H, uint16_t{0});
  }
  auto sparse = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(w));
  LlamaCpu cpu(std::move(w));
  const auto tokens = some_tokens(640, c.vocab_size, 6);
  const Tensor ref = cpu.logits(tokens);
  auto row = [&](int64_t r) { return rows(ref, r, 1); };
  auto one = [&](const Tensor& t) { return TensorView(t.view().data, DType::f32, {1, c.vocab_size}); };
  auto span = [&](int64_t from, int64_t n) {
    return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + n);
  };
  for (const FfnMode mode : {FfnMode::twell, FfnMode::dense}) {
    SCOPED_TRACE(mode == FfnMode::twell ? "twell" : "dense");
    LlamaCudaOptions o;
    o.ffn = mode;
    LlamaCuda m(sparse, o);
    m.prefill(span(0, 600));  // measures the densities
    EXPECT_FALSE(m.prefill_kernels().graph);
    Tensor second;
    for (int call = 0; call < 5; ++call) {
      const Tensor got = m.prefill_from(600, span(600, 10));
      EXPECT_LT(relative_error(one(got), row(609)), kTol) << "call " << call;
      EXPECT_EQ(m.prefill_kernels().graph, call >= 2) << "call " << call;
      EXPECT_EQ(m.prefill_kernels().attention.rfind("twell", 0), 0u) << m.prefill_kernels().attention;
      if (call == 1) second = Tensor::copy_of(got.view());
      if (call > 1) EXPECT_EQ(std::memcmp(got.view().data, second.view().data, got.nbytes()), 0) << "call " << call;
    }
    for (FfnPath p : m.ffn_paths()) EXPECT_EQ(p, mode == FfnMode::twell ? FfnPath::gather : FfnPath::dense);
    EXPECT_LT(relative_error(one(m.prefill_from(610, span(610, 10))), row(619)), kTol);
    EXPECT_TRUE(m.prefill_kernels().graph);
    for (int call = 0; call < 3; ++call) {  // another length: its own graph from its third call
      EXPECT_LT(relative_error(one(m.prefill_from(620, span(620, 6))), row(625)), kTol) << "6 tokens, call " << call;
      EXPECT_EQ(m.prefill_kernels().graph, call >= 2) << "6 tokens, call " << call;
    }
    for (int call = 0; call < 3; ++call) {  // one token: twell's on its prefill FFN's one-token kernel
      EXPECT_LT(relative_error(one(m.prefill_from(626, span(626, 1))), row(626)), kTol) << "1 token, call " << call;
      EXPECT_EQ(m.prefill_kernels().graph, call >= 2) << "1 token, call " << call;
    }
    EXPECT_LT(relative_error(one(m.decode_step(tokens[627])), row(627)), kTol);
  }
}

// Automatic attention: a shape's first call of 2048+ tokens runs twell's kernel (a small model's
// attention saves far less than cuDNN's plan build), its second builds the plan and runs cuDNN's;
// the logits agree either way. A new length starts again.
TEST(LlamaCuda, AutomaticAttentionTakesCudnnFromAShapesSecondCall) {
  TWELL_REQUIRE_HOPPER();
  if (!cudnn_or_skip_note()) return;
  io::ModelConfig c = config_of(kShapes[3]);
  c.max_position_embeddings = 2200;
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 31)));
  LlamaCuda gpu(dw);
  const std::vector<int32_t> a = some_tokens(2100, c.vocab_size, 1), b = some_tokens(2100, c.vocab_size, 2);
  const Tensor first = gpu.prefill(a);
  EXPECT_NE(gpu.prefill_kernels().attention.find("first call of this shape"), std::string::npos)
      << gpu.prefill_kernels().attention;
  gpu.prefill(b);
  EXPECT_EQ(gpu.prefill_kernels().attention.rfind("cudnn", 0), 0u) << gpu.prefill_kernels().attention;
  const Tensor again = gpu.prefill(a);
  EXPECT_EQ(gpu.prefill_kernels().attention.rfind("cudnn", 0), 0u) << gpu.prefill_kernels().attention;
  EXPECT_LT(relative_error(again, first), kTol);
  gpu.prefill(std::vector<int32_t>(a.begin(), a.begin() + 2050));
  EXPECT_EQ(gpu.prefill_kernels().attention.rfind("twell", 0), 0u) << gpu.prefill_kernels().attention;
}

// The decode FFN's partial sums (SplitSum) added by launch_split_sum and by the split form of
// launch_add_rmsnorm (a cluster of 8 blocks), against a float64 sum of the flagged parts on the
// host: widths from the smallest slice (H = 64: two float4 a block) to the largest (H = 8192), no
// part flagged, one, every third, all 2048. y and the new residual within one bf16 rounding of
// the float64 sum; the norm's output as the host computes it from the GPU's residual; two runs
// give the same bits; widths and counts it cannot take are refused.
TEST(SplitSum, AddedAsTheHostAddsThem) {
  TWELL_REQUIRE_HOPPER();
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t H : {64, 96, 1088, 2048, 4096, 8192})
    for (int count : {1, 7, 256, 2048}) {
      std::vector<float> parts(static_cast<size_t>(count) * H), x(H);
      std::vector<uint16_t> w(H);
      for (float& v : parts) v = normal(rng);
      for (float& v : x) v = 4 * normal(rng);
      for (uint16_t& v : w) v = float_to_bf16_bits(1 + 0.1f * normal(rng));
      DeviceBuffer d_parts(parts.size() * 4), d_flags(count * 4), d_x(H * 4), d_w(H * 2), d_out(H * 2), d_y(H * 2);
      TWELL_CUDA_CHECK(cudaMemcpy(d_parts.get(), parts.data(), d_parts.bytes(), cudaMemcpyHostToDevice));
      TWELL_CUDA_CHECK(cudaMemcpy(d_w.get(), w.data(), d_w.bytes(), cudaMemcpyHostToDevice));
      for (int pattern = 0; pattern < 4; ++pattern) {  // none, the first, every third, all
        SCOPED_TRACE(str("H ", H, " parts ", count, " pattern ", pattern));
        std::vector<uint32_t> flags(count);
        for (int b = 0; b < count; ++b)
          flags[b] = pattern == 3 || (pattern == 1 && b == 0) || (pattern == 2 && b % 3 == 0) ? 1u + b % 5 : 0u;
        TWELL_CUDA_CHECK(cudaMemcpy(d_flags.get(), flags.data(), d_flags.bytes(), cudaMemcpyHostToDevice));
        const SplitSum split{d_parts.as<float>(), d_flags.as<uint32_t>(), count};

        std::vector<double> sum(H, 0.0);
        for (int b = 0; b < count; ++b)
          if (flags[b])
            for (int64_t i = 0; i < H; ++i) sum[i] += parts[static_cast<size_t>(b) * H + i];
        std::vector<uint16_t> y(H), out(H), first_out, first_y;
        std::vector<float> x_new(H), first_x;
        for (int run = 0; run < 2; ++run) {
          TWELL_CUDA_CHECK(cudaMemcpy(d_x.get(), x.data(), d_x.bytes(), cudaMemcpyHostToDevice));
          fill_bytes(d_out.get(), d_out.bytes(), 0xff, nullptr);  // poison: NaN
          fill_bytes(d_y.get(), d_y.bytes(), 0xff, nullptr);
          launch_split_sum(split, H, d_y.as<uint16_t>(), nullptr);
          launch_add_rmsnorm(d_x.as<float>(), split, d_w.as<uint16_t>(), d_out.as<uint16_t>(), H, 1e-5f, nullptr);
          TWELL_CUDA_CHECK(cudaDeviceSynchronize());
          TWELL_CUDA_CHECK(cudaMemcpy(y.data(), d_y.get(), H * 2, cudaMemcpyDeviceToHost));
          TWELL_CUDA_CHECK(cudaMemcpy(out.data(), d_out.get(), H * 2, cudaMemcpyDeviceToHost));
          TWELL_CUDA_CHECK(cudaMemcpy(x_new.data(), d_x.get(), H * 4, cudaMemcpyDeviceToHost));
          if (run == 1) {
            EXPECT_EQ(y, first_y);
            EXPECT_EQ(out, first_out);
            EXPECT_EQ(0, std::memcmp(x_new.data(), first_x.data(), H * 4));
          }
          first_y = y;
          first_out = out;
          first_x = x_new;
        }
        int bad_y = 0, bad_x = 0, bad_out = 0;
        double sum_sq = 0;
        for (int64_t i = 0; i < H; ++i) sum_sq += static_cast<double>(x_new[i]) * x_new[i];
        const double inv = 1 / std::sqrt(sum_sq / H + 1e-5);
        for (int64_t i = 0; i < H; ++i) {
          // one bf16 rounding (half an ulp: 2^-8 relative) of an fp32 sum (+ slack for its own
          // rounding); written as !(err <= tol) so that NaN (the poison) counts as wrong
          const double tol = std::abs(sum[i]) / 256 + 1e-5 * count;
          if (!(std::abs(bf16_bits_to_float(y[i]) - sum[i]) <= tol)) ++bad_y;
          if (!(std::abs(x_new[i] - (x[i] + sum[i])) <= tol + 1e-6 * std::abs(x[i]))) ++bad_x;
          const double expect = bf16_bits_to_float(w[i]) * (x_new[i] * inv);
          if (!(std::abs(bf16_bits_to_float(out[i]) - expect) <= std::abs(expect) / 128 + 1e-6)) ++bad_out;
        }
        EXPECT_EQ(bad_y, 0);
        EXPECT_EQ(bad_x, 0);
        EXPECT_EQ(bad_out, 0);
      }
    }
  DeviceBuffer any(64 * 4);
  const SplitSum one{any.as<float>(), any.as<uint32_t>(), 1};
  EXPECT_THROW(launch_split_sum(one, 100, any.as<uint16_t>(), nullptr), Error);  // H not a multiple of 32
  EXPECT_THROW(launch_add_rmsnorm(any.as<float>(), one, any.as<uint16_t>(), any.as<uint16_t>(), 16384, 1e-5f, nullptr),
               Error);  // wider than 8 blocks × 256 threads × 4
  const SplitSum too_many{any.as<float>(), any.as<uint32_t>(), 2049};
  EXPECT_THROW(launch_split_sum(too_many, 64, any.as<uint16_t>(), nullptr), Error);
}

// Each row's non-zeros and Σ|h| as cpu::ffn_forward counts them (h != 0: −0 is zero, NaN is not;
// Σ|h| in double): widths below, at and past the block's 256 threads, rows of one entry, an all-zero
// row and a row holding a NaN.
TEST(RowActivationStats, CountsWhatTheCpuCounts) {
  TWELL_REQUIRE_HOPPER();
  std::mt19937 rng(12);
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{3, 1}, {5, 255}, {4, 256}, {7, 5632},
                                                                             {2, 70000}}) {
    SCOPED_TRACE(str(rows, " × ", cols));
    std::vector<uint16_t> h(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < h.size(); ++i) {
      const uint32_t r = rng() % 8;
      h[i] = r < 4 ? 0 : r == 4 ? 0x8000 /* −0 */ : float_to_bf16_bits(std::normal_distribution<float>()(rng));
    }
    std::fill(h.begin(), h.begin() + cols, uint16_t{0});  // row 0: all zeros
    h.back() = 0x7fc0;                                     // the last row: a NaN
    const DeviceBuffer dh = upload(h);
    DeviceBuffer nnz(static_cast<size_t>(rows) * 4), l1(static_cast<size_t>(rows) * 8);
    launch_row_activation_stats(dh.as<uint16_t>(), rows, cols, nnz.as<int32_t>(), l1.as<double>(), nullptr);
    std::vector<int32_t> got_nnz(static_cast<size_t>(rows));
    std::vector<double> got_l1(static_cast<size_t>(rows));
    TWELL_CUDA_CHECK(cudaMemcpy(got_nnz.data(), nnz.get(), got_nnz.size() * 4, cudaMemcpyDeviceToHost));
    TWELL_CUDA_CHECK(cudaMemcpy(got_l1.data(), l1.get(), got_l1.size() * 8, cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < rows; ++r) {
      int32_t want_nnz = 0;
      double want_l1 = 0;
      for (int64_t j = 0; j < cols; ++j)
        if (const float v = bf16_bits_to_float(h[static_cast<size_t>(r * cols + j)]); v != 0)
          ++want_nnz, want_l1 += std::fabs(static_cast<double>(v));
      EXPECT_EQ(got_nnz[r], want_nnz) << "row " << r;
      if (std::isnan(want_l1)) {
        EXPECT_TRUE(std::isnan(got_l1[r])) << "row " << r;
      } else {
        EXPECT_NEAR(got_l1[r], want_l1, 1e-12 * (1 + want_l1)) << "row " << r;
      }
    }
    EXPECT_EQ(got_nnz[0], 0);
  }
  EXPECT_THROW(launch_row_activation_stats(nullptr, 1, 0, nullptr, nullptr, nullptr), Error);
}

TEST(SplitSum, DecodeShapesItTakes) {  // host-only: runs without a GPU too
  EXPECT_TRUE(decode_ffn_supported(2048, 5632));
  EXPECT_TRUE(decode_ffn_supported(4096, 14336));
  EXPECT_TRUE(decode_ffn_supported(64, 64));
  EXPECT_FALSE(decode_ffn_supported(2048 + 8, 5632));  // H: whole float4 slices of 8 blocks
  EXPECT_FALSE(decode_ffn_supported(8192, 64));        // x in registers: H <= 4096
  EXPECT_FALSE(decode_ffn_supported(2048, 5636));      // I a multiple of 8
  // 256 rows a block at most: 600000 rows would need 2344 partial sums (2048 at most)
  EXPECT_FALSE(decode_ffn_supported(64, 600000));
  EXPECT_TRUE(decode_ffn_supported(64, 2048 * 256));
}

TEST(LlamaCuda, SupportsSaysWhatItLacks) {  // host-only: runs without a GPU too
  io::ModelConfig c = config_of(kShapes[2]);
  std::string why;
  EXPECT_TRUE(LlamaCuda::supports(c, &why)) << why;
  c.head_dim = 100;  // e.g. OpenLLaMA-3B
  EXPECT_FALSE(LlamaCuda::supports(c, &why));
  EXPECT_NE(why.find("head_dim 100"), std::string::npos) << why;
  c = config_of(kShapes[2]);
  c.hidden_act = "gelu";
  EXPECT_FALSE(LlamaCuda::supports(c, &why));
  EXPECT_NE(why.find("gelu"), std::string::npos) << why;
}

// record_ffn_stats: each layer's non-zero count of a prefill, against the CPU model's (the GPU's
// bf16 activations can flip a gate value that sits at zero, hence the small tolerance).
TEST(LlamaCuda, RecordsEachLayersFfnStats) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[1]);  // ReLU, H = 128, I = 256
  const auto [dw, cpu] = both_backends(c, 21);
  const auto tokens = some_tokens(150, c.vocab_size, 9);
  std::vector<ActivationStats> want;
  cpu.logits(tokens, &want);
  LlamaCudaOptions o;
  o.ffn_options.dispatch = Dispatch::always_sparse;
  o.ffn_options.gather_max_tokens = 0;
  {
    LlamaCuda quiet(dw, o);
    quiet.logits(tokens);
    EXPECT_TRUE(quiet.ffn_stats().empty());  // not recorded without the option
  }
  o.record_ffn_stats = true;
  LlamaCuda gpu(dw, o);
  gpu.logits(tokens);
  const std::vector<cuda::FfnStats> got = gpu.ffn_stats();
  ASSERT_EQ(got.size(), want.size());
  for (size_t l = 0; l < got.size(); ++l) {
    EXPECT_EQ(got[l].path, FfnPath::sparse);
    EXPECT_EQ(got[l].tokens, 150);
    EXPECT_NEAR(double(got[l].nnz), double(want[l].nnz), 4 + 0.02 * double(want[l].nnz)) << "layer " << l;
  }
}

TEST(LlamaCuda, GraphReplayIsBitIdenticalToEager) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[0]);
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 14)));
  LlamaCudaOptions eager_o;
  eager_o.cuda_graphs = false;
  LlamaCuda graphed(dw), eager(dw, eager_o);
  const auto prompt = some_tokens(20, c.vocab_size, 9);
  graphed.prefill(prompt);
  eager.prefill(prompt);
  for (int32_t t = 0; t < 6; ++t) {
    const Tensor a = graphed.decode_step(t), b = eager.decode_step(t);
    ASSERT_EQ(std::memcmp(a.view().data, b.view().data, a.nbytes()), 0) << "step " << t;
  }
}


// A caller's stream: every kind of stream gives the bits of the model's own, in prefill and in
// decode steps eager, captured and replayed, while another thread uses the legacy stream (the
// graphs are captured on the model's own stream and launched on the caller's: a capture on a
// blocking stream would be invalidated by that thread's copies); the stream outlives the model.
TEST(LlamaCuda, RunsOnTheCallersStream) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[0]);
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 16)));
  const auto prompt = some_tokens(24, c.vocab_size, 5);
  constexpr int kSteps = 5;  // eager twice, captured, replayed twice
  auto run = [&](LlamaCuda& m) {
    std::vector<Tensor> out;
    out.push_back(m.prefill(prompt));
    for (int32_t t = 0; t < kSteps; ++t) out.push_back(m.decode_step(t + 3));
    return out;
  };
  LlamaCuda own(dw);
  const std::vector<Tensor> expected = run(own);
  cudaStream_t blocking = nullptr, non_blocking = nullptr;
  TWELL_CUDA_CHECK(cudaStreamCreate(&blocking));
  TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking));
  const std::pair<const char*, cudaStream_t> streams[] = {{"blocking", blocking},
                                                          {"non-blocking", non_blocking},
                                                          {"legacy", cudaStreamLegacy},
                                                          {"per-thread", cudaStreamPerThread}};
  // Another thread uses the legacy stream all along (as a second model's upload would).
  DeviceBuffer scratch(4);
  struct Other {
    std::atomic<bool> stop{false};
    std::thread thread;
    ~Other() {  // also where an assertion returns early
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } other;
  other.thread = std::thread([&] {
    const int32_t v = 1;
    while (!other.stop) cudaMemcpy(scratch.get(), &v, 4, cudaMemcpyHostToDevice);
  });
  for (const auto& [name, st] : streams) {
    SCOPED_TRACE(name);
    LlamaCudaOptions o;
    o.stream = st;
    LlamaCuda m(dw, o);
    EXPECT_EQ(m.stream(), st);
    std::vector<Tensor> got;
    try {
      got = run(m);
    } catch (const Error& e) {
      FAIL() << e.what();
    }
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(std::memcmp(got[i].view().data, expected[i].view().data, got[i].nbytes()), 0) << "call " << i;
  }
  EXPECT_EQ(cudaStreamQuery(blocking), cudaSuccess);  // valid streams after their models are gone
  TWELL_CUDA_CHECK(cudaStreamDestroy(blocking));
  TWELL_CUDA_CHECK(cudaStreamDestroy(non_blocking));
}

// The model's work is queued on the caller's stream, behind the caller's earlier work: while a host
// function holds that stream, enqueue()'s logits are not written; once it lets go they are.
TEST(LlamaCuda, WaitsForTheCallersEarlierWork) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[0]);
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 17)));
  cudaStream_t mine = nullptr, side = nullptr;
  TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
  TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  LlamaCudaOptions o;
  o.stream = mine;
  auto model = std::make_unique<LlamaCuda>(dw, o);
  LlamaCuda& m = *model;
  const auto prompt = some_tokens(16, c.vocab_size, 6);
  DeviceBuffer tokens(prompt.size() * 4);
  TWELL_CUDA_CHECK(cudaMemcpy(tokens.get(), prompt.data(), prompt.size() * 4, cudaMemcpyHostToDevice));
  const int64_t S = static_cast<int64_t>(prompt.size());
  const size_t bytes = static_cast<size_t>(c.vocab_size) * 4;
  auto logits = [&] {  // read on another stream, not ordered after `mine`
    std::vector<float> h(static_cast<size_t>(c.vocab_size));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(h.data(), m.logits_device(), bytes, cudaMemcpyDeviceToHost, side));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(side));
    return h;
  };
  for (int warm = 0; warm < 2; ++warm) {  // plans at the first call, cuBLASLt's autotune at the second
    m.reset();
    m.enqueue(tokens.as<int32_t>(), 1, S, Head::last);
  }
  TWELL_CUDA_CHECK(cudaStreamSynchronize(mine));
  const std::vector<float> first = logits();
  m.reset();
  fill_bytes(const_cast<float*>(m.logits_device()), bytes, 0xff, side);  // NaN
  TWELL_CUDA_CHECK(cudaStreamSynchronize(side));

  std::atomic<bool> go{false};
  TWELL_CUDA_CHECK(cudaLaunchHostFunc(
      mine,
      [](void* flag) {
        while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
      },
      &go));
  std::atomic<bool> done{false};
  std::thread watchdog([&] {  // lets the stream go should enqueue() wait for it (a deadlock otherwise)
    for (int i = 0; i < 1000 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    go = true;
  });
  m.enqueue(tokens.as<int32_t>(), 1, S, Head::last);
  EXPECT_FALSE(go.load()) << "enqueue() waited for the caller's held stream";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::vector<float> held = logits();
  go = true;
  done = true;
  watchdog.join();
  TWELL_CUDA_CHECK(cudaStreamSynchronize(mine));
  const std::vector<float> after = logits();
  EXPECT_TRUE(std::isnan(held[0]) && std::isnan(held.back())) << "written while the caller's stream was held";
  EXPECT_EQ(std::memcmp(after.data(), first.data(), bytes), 0);
  model.reset();  // before its stream goes
  TWELL_CUDA_CHECK(cudaStreamDestroy(side));
  TWELL_CUDA_CHECK(cudaStreamDestroy(mine));
}

TEST(LlamaCuda, DefaultDeviceTensorIsEmpty) {  // host-only: runs without a GPU too
  const DeviceTensor d;
  EXPECT_TRUE(d.view().empty());
  EXPECT_EQ(d.nbytes(), 0u);
  EXPECT_EQ(d.view().shape, (twell::Shape{0}));
}

TEST(LlamaCuda, TiedWeightsCountNoLmHead) {  // bytes() once counted the empty lm_head as one f32
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[0]);
  ASSERT_TRUE(c.tie_word_embeddings);
  const LlamaCudaWeights w = LlamaCudaWeights::allocate(c);
  EXPECT_EQ(w.lm_head.nbytes(), 0u);
  size_t n = w.embed.nbytes() + w.final_norm.nbytes();
  for (const LlamaCudaLayer& l : w.layers)
    n += l.input_norm.nbytes() + l.wqkv.nbytes() + l.wo.nbytes() + l.post_norm.nbytes() + l.wg.nbytes() +
         l.wu.nbytes() + l.wd.nbytes();
  EXPECT_EQ(w.bytes(), n);
  EXPECT_EQ(&w.head(), &w.embed);
}

TEST(LlamaCuda, WeightBytesForTheConfigAreWhatIsAllocated) {
  TWELL_REQUIRE_HOPPER();
  for (const Shape& s : kShapes) {
    const io::ModelConfig c = config_of(s);
    EXPECT_EQ(LlamaCudaWeights::bytes_for(c), LlamaCudaWeights::allocate(c).bytes()) << s.name;
  }
}

size_t free_gpu_bytes() { return device_memory().free; }

// memory_needed() is what the constructor allocates, part by part as workspace_bytes() counts it,
// and what the device's free memory loses, for every FFN the model can build.
TEST(LlamaCuda, MemoryNeededIsWhatTheConstructorAllocates) {
  TWELL_REQUIRE_HOPPER();
  struct Case {
    const char* name;
    LlamaCudaOptions o;
  };
  std::vector<Case> cases(6);
  cases[0].name = "defaults";
  cases[1].name = "dense", cases[1].o.ffn = FfnMode::dense;
  cases[2].name = "no cache, batch 3", cases[2].o.kv_cache = false, cases[2].o.max_batch = 3;
  cases[3].name = "batch 12, context 100", cases[3].o.max_batch = 12, cases[3].o.max_context = 100;
  cases[4].name = "max_tokens 64", cases[4].o.max_batch = 2, cases[4].o.max_tokens = 64;
  cases[5].name = "no fused decode FFN", cases[5].o.fused_decode_ffn = false, cases[5].o.fused_qkv_rope = false;
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  // The decode FFN's block count is no multiple of 64 here (214 on an H200): its flags buffer is
  // rounded up as an arena's piece, in the estimate and in workspace_bytes() alike.
  shapes.push_back({"decode_ffn_odd_blocks", 64, 640, 4, 2, 16, 97, 160, "relu", true});
  for (const Shape& s : shapes) {
    const io::ModelConfig c = config_of(s);
    auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::allocate(c));
    for (const Case& k : cases) {
      SCOPED_TRACE(std::string(s.name) + ", " + k.name);
      const LlamaCudaMemory m = LlamaCuda::memory_needed(c, k.o);
      const size_t kv_dim = static_cast<size_t>(c.num_key_value_heads * c.head_dim);
      const size_t batch = static_cast<size_t>(k.o.max_batch);
      const size_t context = static_cast<size_t>(k.o.max_context ? k.o.max_context : c.max_position_embeddings);
      EXPECT_EQ(m.kv_cache, 2 * (k.o.kv_cache ? c.num_hidden_layers : 1) * batch * context * kv_dim * 2);
      EXPECT_GT(m.activations, 0u);
      EXPECT_EQ(m.ffn > 0, s.act == std::string("relu") && c.hidden_size % 64 == 0 && c.intermediate_size % 64 == 0);
      const size_t before = free_gpu_bytes();
      LlamaCuda gpu(dw, k.o);
      const size_t after = free_gpu_bytes();
      EXPECT_EQ(gpu.workspace_bytes(), m.total());
      // Allocations are rounded up (to 2 MiB pages for large ones); streams and events take a little.
      EXPECT_GE(before - after + (size_t{4} << 20), m.total());
      EXPECT_LE(before - after, m.total() + (size_t{128} << 20));
    }
  }
}

// Options whose buffers do not fit in the GPU's free memory are refused before they are allocated,
// with the parts named; memory_needed() says so without allocating.
TEST(LlamaCuda, OptionsBeyondTheFreeMemoryAreRefused) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = config_of(kShapes[0]);
  c.max_position_embeddings = int64_t{1} << 20;
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::allocate(c));
  LlamaCudaOptions o;
  o.max_batch = 4096;  // 4096 × 2^20 positions × 32 × 2 bytes, twice a layer: 1.1 TB of cache
  o.max_tokens = 4096;
  const LlamaCudaMemory m = LlamaCuda::memory_needed(c, o);
  EXPECT_EQ(m.kv_cache, size_t{2} * 2 * 4096 * (size_t{1} << 20) * 32 * 2);
  const size_t before = free_gpu_bytes();
  try {
    LlamaCuda gpu(dw, o);
    ADD_FAILURE() << "constructed with " << bytes_str(m.total()) << " of buffers";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("KV cache 1.1 TB for max_batch 4096 × max_context 1048576"), std::string::npos) << what;
    EXPECT_NE(what.find("lower max_context, max_batch or max_tokens"), std::string::npos) << what;
  }
  EXPECT_LE(before - std::min(before, free_gpu_bytes()), size_t{2} << 20);  // nothing kept
  o.max_context = 2048;  // what a job needs: fits
  LlamaCuda fits(dw, o);
  EXPECT_EQ(fits.workspace_bytes(), LlamaCuda::memory_needed(c, o).total());
}

TEST(LlamaCuda, BadCallsThrowAndChangeNothing) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[0]);
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 16)));
  LlamaCuda gpu(dw);
  EXPECT_THROW(gpu.decode_step(1), Error);                        // before prefill
  EXPECT_THROW(gpu.prefill({1, 2, static_cast<int32_t>(c.vocab_size)}), Error);  // token out of range
  EXPECT_THROW(gpu.prefill({-1}), Error);
  EXPECT_THROW(gpu.prefill({}), Error);
  EXPECT_THROW(gpu.prefill_batch({{}}), Error);                   // an empty prompt
  EXPECT_THROW(gpu.prefill_batch({{1}, {2}}), Error);             // more than max_batch
  EXPECT_THROW(gpu.prefill(some_tokens(c.max_position_embeddings + 1, c.vocab_size, 1)), Error);
  std::vector<ActivationStats> stats;  // a refused call with statistics leaves them as they were
  EXPECT_THROW(gpu.logits({1, static_cast<int32_t>(c.vocab_size)}, &stats), Error);
  EXPECT_TRUE(stats.empty());
  const auto prompt = some_tokens(c.max_position_embeddings - 1, c.vocab_size, 2);
  const Tensor a = gpu.prefill(prompt);
  gpu.decode_step(3);  // fills the context
  EXPECT_THROW(gpu.decode_step(4), Error);
  EXPECT_THROW(gpu.decode_step(model::kNoToken), Error);  // decode_batch's "sits out", not a token
  EXPECT_EQ(gpu.cached_tokens(), c.max_position_embeddings);
  EXPECT_THROW(gpu.decode_batch({1, 2}), Error);  // the cache holds one sequence
  EXPECT_THROW(gpu.prefill_batch({{1}, {2}}), Error);  // rejected before the cache is touched
  EXPECT_EQ(gpu.cached_tokens(), c.max_position_embeddings);
  // logits() would overwrite the generation in progress: refused until reset().
  const auto short_prompt = some_tokens(6, c.vocab_size, 3);
  (void)gpu.prefill(short_prompt);
  EXPECT_THROW(gpu.logits({1, 2}), Error);
  EXPECT_EQ(gpu.cached_tokens(), 6);
  const Tensor next = gpu.decode_step(7);  // the cache is intact: as a fresh model's step
  {
    LlamaCuda fresh(dw);
    fresh.prefill(short_prompt);
    EXPECT_EQ(relative_error(fresh.decode_step(7), next), 0.0);
  }
  gpu.reset();
  EXPECT_EQ(gpu.logits({1, 2}).shape()[0], 2);

  LlamaCudaOptions fp32_h;
  fp32_h.ffn_options.precision = Precision::h_fp32;  // sparse-only: the dense FFNs cannot honour it
  EXPECT_THROW(LlamaCuda(dw, fp32_h), Error);
  DeviceBuffer lt_workspace(size_t{1} << 20);
  LlamaCudaOptions lt;
  lt.ffn_options.cublaslt_workspace = lt_workspace.get();  // the model's FFNs share its own
  lt.ffn_options.cublaslt_workspace_bytes = lt_workspace.bytes();
  test::expect_error([&] { LlamaCuda(dw, lt); }, {"cublaslt_workspace must be left null"});
  LlamaCudaOptions ranges;
  ranges.decode_attention_splits = 17;  // at most 16 (a cluster)
  EXPECT_THROW(LlamaCuda(dw, ranges), Error);
  LlamaCudaOptions warps;
  warps.decode_attention_warps = 3;  // 1, 2 or 4
  test::expect_error([&] { LlamaCuda(dw, warps); }, {"decode_attention_warps must be 0"});

  LlamaCudaOptions no_cache;
  no_cache.kv_cache = false;
  LlamaCuda prefill_only(dw, no_cache);
  prefill_only.prefill(prompt);
  EXPECT_THROW(prefill_only.decode_step(1), Error);
  test::expect_error([&] { model::generate_batch(prefill_only, {{1, 2}}, 4, {}); }, {"keeps no KV cache"});
  EXPECT_EQ(model::generate_batch(prefill_only, {{1, 2}}, 1, {})[0].tokens.size(), 1u);  // one token needs no cache
  EXPECT_EQ(relative_error(prefill_only.prefill(prompt), a), 0.0);  // every call starts at 0

  io::ModelConfig bad = c;
  bad.head_dim = 8;
  bad.num_attention_heads = 8, bad.num_key_value_heads = 4;
  EXPECT_THROW(LlamaCuda(std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::allocate(bad))), Error);

  // Hand-made weights that do not fit their config are refused, not copied short or past the end.
  LlamaWeights untied = bf16_weights(c, 16);
  untied.config.tie_word_embeddings = false;  // and no lm_head
  EXPECT_THROW(LlamaCudaWeights::upload(untied), Error);
  LlamaWeights short_q = bf16_weights(c, 16);
  short_q.layers[0].wq = Tensor(DType::bf16, {short_q.layers[0].wq.shape()[0] - 1, c.hidden_size});
  EXPECT_THROW(LlamaCudaWeights::upload(short_q), Error);

  // prefill_kernels() describes the last call, also a call of one token a sequence.
  gpu.prefill(some_tokens(5, c.vocab_size, 4));
  EXPECT_EQ(gpu.prefill_kernels().attention.find("one token"), std::string::npos);
  gpu.prefill({5});
  EXPECT_NE(gpu.prefill_kernels().attention.find("one token"), std::string::npos) << gpu.prefill_kernels().attention;
}

// A model that is not sparse (random weights: about half the neurons active) decodes batches on the
// dense FFN, where the gather path would read more weight rows than dense does; one sequence keeps
// the gather path, which never reads more. The density comes from the prefill's sample, also below
// sparse_min_tokens (where the prefill itself runs dense).
TEST(LlamaCuda, DecodeBatchesOfADenseModelTakeTheDenseFfn) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[3]);
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 18)));
  LlamaCudaOptions o;
  o.max_batch = 4;
  LlamaCuda gpu(dw, o);
  gpu.prefill_batch({some_tokens(40, c.vocab_size, 1), some_tokens(20, c.vocab_size, 2)});
  for (int step = 0; step < 4; ++step) {  // eager twice, captured, replayed
    gpu.decode_batch({1, 2});
    for (FfnPath p : gpu.ffn_paths()) EXPECT_EQ(p, FfnPath::dense) << "step " << step;
  }
  gpu.prefill(some_tokens(40, c.vocab_size, 3));
  gpu.decode_step(1);
  for (FfnPath p : gpu.ffn_paths()) EXPECT_EQ(p, FfnPath::gather);
  // Forced onto the sparse paths, the batch takes the gather path whatever the density.
  LlamaCudaOptions sparse = o;
  sparse.ffn_options.dispatch = Dispatch::always_sparse;
  LlamaCuda forced(dw, sparse);
  forced.prefill_batch({some_tokens(40, c.vocab_size, 1), some_tokens(20, c.vocab_size, 2)});
  forced.decode_batch({1, 2});
  for (FfnPath p : forced.ffn_paths()) EXPECT_EQ(p, FfnPath::gather);
}

// A batch's decode FFN follows the density each prefill measures: with all but 1/32 of each layer's
// gate rows zeroed (~2% active: B × density well under 0.25) the gather FFN, with them restored
// (~50%) the dense one, then the gather FFN again. Each change re-records the batch's graph (a
// replay of the old one would report, and run, the old paths), and every step's logits match the
// sequences decoded alone.
TEST(LlamaCuda, BatchDecodePathFollowsEachPrefillsDensity) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[3]);
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 23)));
  const size_t H = static_cast<size_t>(c.hidden_size), I = static_cast<size_t>(c.intermediate_size), keep = I / 32;
  std::vector<std::vector<uint16_t>> gates;  // each layer's gate rows as uploaded
  for (const LlamaCudaLayer& l : dw->layers) {
    gates.emplace_back(I * H);
    ASSERT_EQ(cudaMemcpy(gates.back().data(), l.wg.view().data, I * H * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  auto set_gates = [&](bool sparse) {
    for (size_t l = 0; l < dw->layers.size(); ++l) {
      auto* wg = static_cast<uint16_t*>(dw->layers[l].wg.view().data);
      ASSERT_EQ(cudaMemcpy(wg, gates[l].data(), I * H * 2, cudaMemcpyHostToDevice), cudaSuccess);
      if (sparse) ASSERT_EQ(cudaMemset(wg + keep * H, 0, (I - keep) * H * 2), cudaSuccess);
    }
  };
  LlamaCudaOptions o;
  o.max_batch = 2;
  o.ffn_options.sparse_min_tokens = 64;  // every prefill below measures its density
  LlamaCuda batched(dw, o), single(dw, o);
  const std::vector<std::vector<int32_t>> prompts = {some_tokens(100, c.vocab_size, 7), some_tokens(90, c.vocab_size, 8)};
  for (bool sparse : {true, false, true}) {
    SCOPED_TRACE(sparse ? "gates mostly zero" : "gates as drawn");
    set_gates(sparse);
    std::vector<std::vector<Tensor>> alone(prompts.size());
    for (size_t b = 0; b < prompts.size(); ++b) {
      single.prefill_batch({prompts[b]});
      for (int32_t t = 0; t < 4; ++t) alone[b].push_back(single.decode_batch({t + 2 * static_cast<int32_t>(b)}));
    }
    batched.prefill_batch(prompts);
    for (int32_t t = 0; t < 4; ++t) {  // eager twice, captured, replayed
      const Tensor step = batched.decode_batch({t, t + 2});
      for (FfnPath p : batched.ffn_paths()) EXPECT_EQ(p, sparse ? FfnPath::gather : FfnPath::dense) << "step " << t;
      for (size_t b = 0; b < prompts.size(); ++b)
        EXPECT_LT(relative_error(rows(step, b, 1), alone[b][t]), kTol) << "sequence " << b << ", step " << t;
    }
  }
}

// Ragged batches where the long calls take other kernels: prompts of 700, 300 and 17 tokens run as
// 3 × 700 (ragged_prefill_runs off; the fused QKV GEMM: all sequences start at 0; cuDNN's attention
// where it loads, forced);
// a sequence whose context is full sits steps out while the others go on, and is refused a token.
// The GPU sampler draws a batch as the host does from the same logits (generate_batch both ways).
TEST(LlamaCuda, RaggedBatchesOfLongPromptsAndFullContexts) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = config_of(kShapes[3]);  // head_dim 128: the fused QKV GEMM takes it
  c.max_position_embeddings = 720;
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 17)));
  LlamaCudaOptions o;
  o.max_batch = 3;
  LlamaCudaOptions one_batch = o;
  one_batch.ragged_prefill_runs = false;
  // cuDNN's attention at the first call too (automatic would build its plan at a second).
  if (cudnn_or_skip_note()) one_batch.prefill_attention = PrefillAttention::cudnn;
  LlamaCuda batched(dw, one_batch), single(dw, o);
  const std::vector<std::vector<int32_t>> prompts = {some_tokens(700, c.vocab_size, 1), some_tokens(300, c.vocab_size, 2),
                                                     some_tokens(17, c.vocab_size, 3)};
  const Tensor b0 = batched.prefill_batch(prompts);
  EXPECT_TRUE(batched.prefill_kernels().fused_qkv_rope);
  EXPECT_EQ(batched.last_tokens(), 3 * 700);
  for (size_t s = 0; s < prompts.size(); ++s)
    EXPECT_LT(relative_error(rows(b0, s, 1), single.prefill_batch({prompts[s]})), kTol) << "sequence " << s;
  // Fill sequence 0's context, the others sitting out.
  const int32_t no = model::kNoToken;
  for (int64_t i = 700; i < c.max_position_embeddings; ++i) batched.decode_batch({5, no, no});
  EXPECT_EQ(batched.cached_lengths(), (std::vector<int64_t>{720, 300, 17}));
  EXPECT_THROW(batched.decode_batch({5, 6, 7}), Error);  // sequence 0 has no room: refused, nothing changes
  EXPECT_EQ(batched.cached_lengths(), (std::vector<int64_t>{720, 300, 17}));
  single.prefill_batch({prompts[1]});
  const Tensor s1 = single.decode_batch({6});
  single.prefill_batch({prompts[2]});
  const Tensor s2 = single.decode_batch({7});
  for (int round = 0; round < 3; ++round) {  // replayed: the fill loop's unaligned steps recorded the graph
    const Tensor step = batched.decode_batch({no, 6, 7});
    EXPECT_EQ(relative_error(rows(step, 0, 1), Tensor(DType::f32, {1, c.vocab_size})), 0.0);
    if (round == 0) {
      EXPECT_LT(relative_error(rows(step, 1, 1), s1), kTol);
      EXPECT_LT(relative_error(rows(step, 2, 1), s2), kTol);
    }
  }
  EXPECT_EQ(batched.cached_lengths(), (std::vector<int64_t>{720, 303, 20}));

  // Sampling a batch on the GPU and on the host: the same tokens from the same logits.
  LlamaCudaOptions host = o;
  host.sample_on_gpu = false;
  LlamaCuda on_gpu(dw, o), on_host(dw, host);
  ASSERT_TRUE(on_gpu.samples_on_gpu());
  const std::vector<std::vector<int32_t>> short_prompts = {some_tokens(9, c.vocab_size, 4), some_tokens(2, c.vocab_size, 5),
                                                           some_tokens(30, c.vocab_size, 6)};
  model::SamplingOptions so;
  so.temperature = 0.9, so.top_p = 0.95, so.seed = 11;
  const std::vector<model::Generation> g = model::generate_batch(on_gpu, short_prompts, 12, so);
  const std::vector<model::Generation> h = model::generate_batch(on_host, short_prompts, 12, so);
  for (size_t s = 0; s < g.size(); ++s) {
    EXPECT_EQ(g[s].tokens, h[s].tokens) << "sequence " << s;
    EXPECT_EQ(g[s].tokens.size(), 12u);
  }
}

// A ragged batch prefills as runs of neighbouring prompts (ragged_prefill_runs): 20, 25, 30 | 600 | 3
// tokens compute 90 + 600 + 3 rows, not 5 × 600. Each run writes its own sequences' cache rows and
// logits: the batch matches each prompt alone, with and without a KV cache, and so do the decode
// steps after it (every sequence at its own position). Forced onto the sparse paths too.
TEST(LlamaCuda, RaggedPrefillRunsAsBatchesOfNeighbours) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = config_of(kShapes[3]);
  c.max_position_embeddings = 640;
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 19)));
  const std::vector<int64_t> lengths = {20, 25, 30, 600, 3};
  std::vector<std::vector<int32_t>> prompts;
  for (size_t b = 0; b < lengths.size(); ++b) prompts.push_back(some_tokens(lengths[b], c.vocab_size, 30 + b));
  for (bool forced : {false, true}) {
    SCOPED_TRACE(forced ? "always sparse" : "default dispatch");
    LlamaCudaOptions o;
    o.max_batch = 5;
    if (forced) o.ffn_options.dispatch = Dispatch::always_sparse;
    LlamaCudaOptions no_cache = o, one_batch = o;
    no_cache.kv_cache = false;
    one_batch.ragged_prefill_runs = false;
    LlamaCuda runs(dw, o), single(dw, o), prefill_only(dw, no_cache), padded(dw, one_batch);
    const Tensor got = runs.prefill_batch(prompts);
    EXPECT_EQ(runs.last_tokens(), 3 * 30 + 600 + 3);
    EXPECT_EQ(runs.cached_lengths(), lengths);
    const Tensor got_no_cache = prefill_only.prefill_batch(prompts);
    const Tensor got_padded = padded.prefill_batch(prompts);
    EXPECT_EQ(padded.last_tokens(), 5 * 600);
    for (size_t b = 0; b < prompts.size(); ++b) {
      const Tensor alone = single.prefill_batch({prompts[b]});
      EXPECT_LT(relative_error(rows(got, b, 1), alone), kTol) << "sequence " << b;
      EXPECT_LT(relative_error(rows(got_no_cache, b, 1), alone), kTol) << "sequence " << b << ", no cache";
      EXPECT_LT(relative_error(rows(got_padded, b, 1), alone), kTol) << "sequence " << b << ", one batch";
    }
    std::vector<std::vector<Tensor>> steps(prompts.size());  // each sequence's decode steps alone
    for (size_t b = 0; b < prompts.size(); ++b) {
      single.prefill_batch({prompts[b]});
      for (int32_t t = 0; t < 4; ++t) steps[b].push_back(single.decode_batch({t + static_cast<int32_t>(b)}));
    }
    for (int32_t t = 0; t < 4; ++t) {  // eager twice, captured, replayed
      const Tensor step = runs.decode_batch({t, t + 1, t + 2, t + 3, t + 4});
      for (size_t b = 0; b < prompts.size(); ++b)
        EXPECT_LT(relative_error(rows(step, b, 1), steps[b][t]), kTol) << "sequence " << b << ", step " << t;
    }
  }
}

// A prompt longer than max_tokens runs in chunks at increasing positions, each attending to the keys
// the chunks before it cached (twell's attention and cuDNN's; the fused QKV GEMM from 512 tokens a
// chunk): logits() of 600 tokens at max_tokens 256 (chunks of 200) and of 1200 at 1100 (two of 600)
// against the CPU model, a prefill and its decode steps against the CPU's rows, a ragged batch whose
// long prompt runs alone in chunks between batches of short ones, automatic attention over chunks of
// 2100 tokens (cuDNN's from each shape's second call); without a KV cache such a prompt is refused.
TEST(LlamaCuda, LongPromptsRunInChunksOfMaxTokens) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = config_of(kShapes[3]);
  c.max_position_embeddings = 1300;
  const auto [dw, cpu] = both_backends(c, 31);
  const std::vector<int32_t> tokens = some_tokens(1201, c.vocab_size, 5);
  const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 600);
  const Tensor ref = cpu.logits(tokens);
  auto as_row = [](const Tensor& t) {  // [V] as [1, V]
    return Tensor::copy_of(TensorView(t.view().data, DType::f32, {1, t.numel()}));
  };
  for (PrefillAttention attention : {PrefillAttention::twell, PrefillAttention::cudnn}) {
    if (attention == PrefillAttention::cudnn && !cudnn_or_skip_note()) continue;
    for (int64_t max_tokens : {int64_t{256}, int64_t{1100}}) {  // 1100: chunks of 600, the fused QKV GEMM
      SCOPED_TRACE(str(attention == PrefillAttention::cudnn ? "cudnn" : "twell", " attention, max_tokens ", max_tokens));
      LlamaCudaOptions o;
      o.max_batch = 3;
      o.max_tokens = max_tokens;
      o.prefill_attention = attention;
      LlamaCuda gpu(dw, o);
      const int64_t n = max_tokens == 256 ? 600 : 1200;  // 3 × 200, or 2 × 600
      const Tensor all = gpu.logits(std::vector<int32_t>(tokens.begin(), tokens.begin() + n));
      EXPECT_EQ(gpu.last_tokens(), n);
      EXPECT_GT(gpu.last_gpu_ms(), 0.f);  // this call's, the first of the model
      EXPECT_EQ(gpu.cached_tokens(), 0);
      EXPECT_LT(relative_error(all, rows(ref, 0, n)), kTol) << "logits()";
      if (attention == PrefillAttention::cudnn)
        EXPECT_EQ(gpu.prefill_kernels().attention.rfind("cudnn", 0), 0u) << gpu.prefill_kernels().attention;
      // prefill of n - 1 tokens, then two decode steps.
      const Tensor last = gpu.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + n - 1));
      EXPECT_EQ(gpu.last_tokens(), n - 1);
      EXPECT_EQ(gpu.cached_tokens(), n - 1);
      EXPECT_EQ(gpu.prefill_kernels().fused_qkv_rope, max_tokens == 1100);  // its last chunk: 599 tokens
      EXPECT_LT(relative_error(as_row(last), rows(ref, n - 2, 1)), kTol) << "prefill";
      EXPECT_LT(relative_error(as_row(gpu.decode_step(tokens[n - 1])), rows(ref, n - 1, 1)), kTol) << "first step";
      EXPECT_LT(relative_error(as_row(gpu.decode_step(tokens[n])), rows(ref, n, 1)), kTol) << "second step";
      if (max_tokens != 256) continue;
      // Short, long, short: runs 30 | 600 (chunked) | 50 (the long prompt cannot share a batch).
      const std::vector<std::vector<int32_t>> prompts = {some_tokens(30, c.vocab_size, 6), head,
                                                         some_tokens(50, c.vocab_size, 7)};
      const Tensor got = gpu.prefill_batch(prompts);
      EXPECT_EQ(gpu.last_tokens(), 30 + 600 + 50);
      EXPECT_EQ(gpu.cached_lengths(), (std::vector<int64_t>{30, 600, 50}));
      const Tensor step = gpu.decode_batch({1, tokens[600], 2});
      for (size_t b = 0; b < prompts.size(); ++b) {
        const Tensor seq_ref = cpu.logits([&] {
          std::vector<int32_t> t = prompts[b];
          t.push_back(b == 1 ? tokens[600] : static_cast<int32_t>(b / 2 + 1));
          return t;
        }());
        const int64_t len = static_cast<int64_t>(prompts[b].size());
        EXPECT_LT(relative_error(rows(got, b, 1), rows(seq_ref, len - 1, 1)), kTol) << "sequence " << b;
        EXPECT_LT(relative_error(rows(step, b, 1), rows(seq_ref, len, 1)), kTol) << "sequence " << b << ", step";
      }
    }
  }
  {  // One forward of 1200 tokens (the default max_tokens: the context), its head 1024 + 176 rows.
    LlamaCuda whole(dw);
    EXPECT_LT(relative_error(whole.logits(std::vector<int32_t>(tokens.begin(), tokens.begin() + 1200)), rows(ref, 0, 1200)),
              kTol);
    EXPECT_EQ(whole.last_tokens(), 1200);
  }
  if (cudnn_or_skip_note()) {  // automatic attention past position 0: two chunks of 2100 tokens
    io::ModelConfig c2 = c;
    c2.max_position_embeddings = 4300;
    auto [dw2, cpu2] = both_backends(c2, 32);
    const std::vector<int32_t> prompt = some_tokens(4200, c2.vocab_size, 8);
    const Tensor want = as_row(cpu2.prefill(prompt));
    LlamaCudaOptions o;
    o.max_tokens = 2100;
    LlamaCuda gpu(dw2, o);
    for (int call = 0; call < 2; ++call) {  // twell's kernel at each shape's first call, cuDNN's at its second
      EXPECT_LT(relative_error(as_row(gpu.prefill(prompt)), want), kTol) << "call " << call;
      EXPECT_EQ(gpu.last_tokens(), 4200);
      EXPECT_EQ(gpu.prefill_kernels().attention.rfind(call == 0 ? "twell" : "cudnn", 0), 0u)
          << gpu.prefill_kernels().attention;
    }
  }
  // Without a KV cache the chunks would lose each other's keys: refused, with the reason.
  LlamaCudaOptions no_cache;
  no_cache.kv_cache = false;
  no_cache.max_tokens = 256;
  LlamaCuda prefill_only(dw, no_cache);
  test::expect_error([&] { prefill_only.prefill(head); }, {"600 tokens exceed max_tokens 256", "kv_cache = true"});
  test::expect_error([&] { prefill_only.logits(head); }, {"600 tokens exceed max_tokens 256", "kv_cache = true"});
  EXPECT_EQ(relative_error(prefill_only.prefill(std::vector<int32_t>(head.begin(), head.begin() + 256)),
                           LlamaCuda(dw).prefill(std::vector<int32_t>(head.begin(), head.begin() + 256))),
            0.0);
  // The default cap: max_batch · max_context up to kDefaultMaxTokens, with the cache only.
  LlamaCudaOptions wide;
  wide.max_batch = 64;
  EXPECT_EQ(LlamaCuda::memory_needed(c, wide).activations,
            LlamaCuda::memory_needed(c, [&] { LlamaCudaOptions x = wide; x.max_tokens = kDefaultMaxTokens; return x; }())
                .activations);
  wide.kv_cache = false;
  EXPECT_EQ(LlamaCuda::memory_needed(c, wide).activations,
            LlamaCuda::memory_needed(c, [&] { LlamaCudaOptions x = wide; x.max_tokens = 64 * 1300; return x; }())
                .activations);
}

// Where the GPU memory given holds the weights and the KV cache but not activations of the default
// tokens a forward, load_model sizes them for fewer (leaving what logits() adds and
// kGpuHeadroomBytes free), says so in its log, and a longer prompt runs in chunks with the logits of
// one forward; without the KV cache, the cache goes on so that a sequence runs in chunks. A count
// given is used as it is; one below max_batch is refused. One layer of the 2B
// model's widths, so that the activations of 16384 tokens (~1 GB) dwarf the headroom.
TEST(LoadModel, FitsTheActivationsToTheGpuMemoryGiven) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = model::tiny_config("relu", true);
  c.hidden_size = 2048, c.intermediate_size = 5632, c.num_hidden_layers = 1;
  c.num_attention_heads = c.num_key_value_heads = 16, c.head_dim = 128;
  c.vocab_size = 256, c.max_position_embeddings = 16384;
  const std::string dir = write_test_model(c, 41);
  const size_t weights = LlamaCudaWeights::bytes_for(c);
  auto needs = [&](int64_t max_tokens) {  // what the fit keeps within the memory given
    LlamaCudaOptions co;
    co.max_tokens = max_tokens;
    const LlamaCudaMemory m = LlamaCuda::memory_needed(c, co);
    return weights + m.total() + m.logits_growth + model::kGpuHeadroomBytes;
  };
  const LlamaCudaMemory whole = LlamaCuda::memory_needed(c);
  ASSERT_EQ(whole.max_tokens, 16384);
  ASSERT_LT(needs(4096), weights + whole.total());  // else the default would fit what is given

  std::vector<std::string> lines;
  model::ModelLoadOptions o;
  o.device = model::DeviceChoice::cuda;
  o.gpu_memory = (needs(4096) + weights + whole.total()) / 2;
  o.log = [&](const std::string& line) { lines.push_back(line); };
  {
    const std::unique_ptr<model::LanguageModel> m = model::load_model(dir, o);
    const auto* gpu = dynamic_cast<const LlamaCuda*>(m.get());
    ASSERT_NE(gpu, nullptr);
    const int64_t t = gpu->options().max_tokens;
    EXPECT_GT(t, 4096);
    EXPECT_LT(t, 16384);
    EXPECT_EQ(t % 256, 0);
    EXPECT_LE(needs(t), o.gpu_memory);
    EXPECT_GT(needs(t + 256), o.gpu_memory);  // the largest multiple of 256 that fits
    const std::string note = str("activations sized for ", t, " tokens a forward, not 16384");
    EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(note) != std::string::npos; }))
        << "no log line says: " << note;
    const int64_t n = std::min<int64_t>(t + 1000, 16384);  // two chunks
    const std::vector<int32_t> tokens = some_tokens(n, c.vocab_size, 9);
    LlamaCuda one_forward(std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(load_bf16(dir))));
    const Tensor chunked = m->logits(tokens);
    EXPECT_EQ(gpu->last_tokens(), n);
    EXPECT_LT(relative_error(chunked, one_forward.logits(tokens)), kTol);
  }
  {  // without the KV cache (`twell eval`): one forward of the context does not fit, so the cache goes
     // on and the count is fitted as with it; next_token_nll runs in chunks
    model::ModelLoadOptions no_cache = o;
    no_cache.kv_cache = false;
    test::expect_error([&] { model::load_model(dir, no_cache); }, {"the model needs "});  // not without shrink_to_fit
    no_cache.shrink_to_fit = true;
    lines.clear();
    const std::unique_ptr<model::LanguageModel> m = model::load_model(dir, no_cache);
    const auto& gpu = dynamic_cast<const LlamaCuda&>(*m);
    const int64_t t = gpu.options().max_tokens;
    EXPECT_TRUE(gpu.options().kv_cache);
    EXPECT_GT(t, 4096);
    EXPECT_LT(t, 16384);
    EXPECT_LE(needs(t), no_cache.gpu_memory);
    EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
      return l.find("with the KV cache on") != std::string::npos;
    })) << "no log line says the KV cache went on";
    const std::vector<int32_t> tokens = some_tokens(t + 1000, c.vocab_size, 12);
    LlamaCuda one_forward(std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(load_bf16(dir))));
    const std::vector<double> chunked = m->next_token_nll(tokens), whole = one_forward.next_token_nll(tokens);
    ASSERT_EQ(chunked.size(), whole.size());
    double diff = 0, size = 0;
    for (size_t i = 0; i < whole.size(); ++i) diff += std::abs(chunked[i] - whole[i]), size += std::abs(whole[i]);
    EXPECT_LT(diff, kTol * size) << "per-token losses of the chunked forward against one forward's";
  }
  {  // shrink_to_fit halves the sequences a call until they fit, with logits() and the headroom
     // room to spare, and says so
    model::ModelLoadOptions windows = o;
    windows.kv_cache = false, windows.shrink_to_fit = true, windows.context = 4096, windows.max_batch = 4;
    lines.clear();
    const std::unique_ptr<model::LanguageModel> m = model::load_model(dir, windows);
    const LlamaCudaOptions& got = dynamic_cast<const LlamaCuda&>(*m).options();
    EXPECT_LT(got.max_batch, 4);
    const LlamaCudaMemory mem = LlamaCuda::memory_needed(c, got);
    // Halved no further than the room to spare asks (one sequence a call too, since load_model leaves it
    // beside any model it puts on the GPU).
    EXPECT_LE(weights + mem.total() + mem.logits_growth + model::kGpuHeadroomBytes, windows.gpu_memory);
    const std::string note = str(got.max_batch, " sequence", got.max_batch == 1 ? "" : "s", " a call, not 4");
    EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(note) != std::string::npos; }))
        << "no log line says: " << note;
  }
  {  // given: used as it is, whatever fits
    o.gpu_memory = 0;
    o.max_tokens = 300;
    const std::unique_ptr<model::LanguageModel> m = model::load_model(dir, o);
    EXPECT_EQ(dynamic_cast<const LlamaCuda&>(*m).options().max_tokens, 300);
    o.max_tokens = 1 << 20;  // more than a call can take: a context's
    EXPECT_EQ(dynamic_cast<const LlamaCuda&>(*model::load_model(dir, o)).options().max_tokens, 16384);
    o.max_tokens = 300;
    o.max_batch = 301;
    test::expect_error([&] { model::load_model(dir, o); }, {"max_tokens must be at least the most sequences a call takes (301"});
  }
  {  // not even the KV cache fits: the shortfall names the tokens a forward it was figured for
    model::ModelLoadOptions tight;
    tight.device = model::DeviceChoice::cuda;
    tight.gpu_memory = weights + whole.kv_cache / 2;
    test::expect_error([&] { model::load_model(dir, tight); }, {"KV cache", "for 16384 tokens a forward"});
  }
  std::filesystem::remove_all(dir);
}

// next_token_nll reduces each piece of the logits on the GPU: against nll_from_logits of logits()
// (the same forward's logits, reduced on the host: the same doubles but for the order of the sum) and
// the CPU model's row by row (closer than neighbouring rows are to each other: a row or target
// shifted by one would not be), at 2, 100, 1025 (the head's last piece of one row, which predicts
// nothing) and 1200 tokens, in one forward, in chunks (max_tokens 256) and without a KV cache
// (`twell eval`'s); a vocabulary of 4099, so the kernel's threads stride its rows; model::perplexity
// takes it; refused where logits() is.
TEST(LlamaCuda, NextTokenNllReducesTheLogitsOnTheGpu) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = config_of(kShapes[1]);  // untied head
  c.max_position_embeddings = 1300;
  c.vocab_size = 4099;
  const auto [dw, cpu] = both_backends(c, 33);
  const std::vector<int32_t> tokens = some_tokens(1200, c.vocab_size, 9);
  LlamaCudaOptions small, no_cache;
  small.max_tokens = 256;
  no_cache.kv_cache = false;
  LlamaCuda whole(dw), chunked(dw, small), prefill_only(dw, no_cache);
  for (const int64_t T : {int64_t{2}, int64_t{100}, int64_t{1025}, int64_t{1200}}) {
    const std::vector<int32_t> t(tokens.begin(), tokens.begin() + T);
    const std::vector<double> want = model::nll_from_logits(cpu.logits(t), t);
    double apart = 0;  // how far neighbouring rows' losses are apart
    for (size_t i = 0; i + 1 < want.size(); ++i) apart += std::abs(want[i + 1] - want[i]);
    apart /= std::max<double>(1, double(want.size()) - 1);
    for (LlamaCuda* m : {&whole, &chunked, &prefill_only}) {
      SCOPED_TRACE(str(T, " tokens, max_tokens ", m->options().max_tokens, m->options().kv_cache ? "" : ", no cache"));
      const std::vector<double> got = m->next_token_nll(t);
      const std::vector<double> host = model::nll_from_logits(m->logits(t), t);
      ASSERT_EQ(got.size(), static_cast<size_t>(T - 1));
      double worst = 0, off = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::abs(got[i] - host[i]) / (1 + std::abs(host[i])));
        off += std::abs(got[i] - want[i]) / double(got.size());
      }
      EXPECT_LT(worst, 1e-9) << "against the host's reduction of the same forward's logits";
      if (T > 2) {
        EXPECT_LT(off, 0.25 * apart) << "against the CPU model's rows";
      }
      const model::Perplexity p = model::perplexity(*m, t);
      EXPECT_EQ(p.predictions, T - 1);
      EXPECT_NEAR(p.mean_nll, std::accumulate(got.begin(), got.end(), 0.0) / double(T - 1), 1e-9);
      EXPECT_NEAR(p.mean_nll, model::perplexity(cpu, t).mean_nll, kTol * p.mean_nll) << "against the CPU model";
      EXPECT_EQ(m->cached_tokens(), 0);
      EXPECT_EQ(m->last_tokens(), T);
    }
  }
  EXPECT_THROW(whole.next_token_nll({1}), Error);
  EXPECT_THROW(whole.next_token_nll({1, static_cast<int32_t>(c.vocab_size)}), Error);
  whole.prefill({1, 2, 3});
  test::expect_error([&] { whole.next_token_nll({1, 2}); }, {"generation in progress"});
  EXPECT_EQ(whole.cached_tokens(), 3);
}

// next_token_nll_batch runs neighbouring sequences of one length in one forward (up to max_batch of
// them and max_tokens rows; `twell eval`'s windows, no KV cache), each sequence's losses those of
// next_token_nll alone up to the batched arithmetic's rounding and its own rows against the CPU
// model's (closer than neighbouring rows are: a row shifted by one sequence would not be); the FFN
// statistics summed; every sequence checked before any runs; refused during a generation; and
// windowed_perplexity gives the same perplexity with 4 windows a call as with one.
TEST(LlamaCuda, NextTokenNllBatchRunsSequencesOfOneLengthTogether) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = config_of(kShapes[3]);  // the twell FFN
  c.max_position_embeddings = 400;
  const auto [dw, cpu] = both_backends(c, 36);
  LlamaCudaOptions batched;
  batched.kv_cache = false, batched.max_batch = 4, batched.max_context = 200;
  LlamaCuda m(dw, batched), single(dw);
  std::vector<std::vector<int32_t>> seqs;
  for (const int64_t len : {150, 150, 150, 150, 150, 90, 90, 150})  // forwards of 4, 1, 2 and 1
    seqs.push_back(some_tokens(len, c.vocab_size, 100 + seqs.size()));
  std::vector<ActivationStats> stats, one, want_stats, cpu_one;
  const std::vector<std::vector<double>> got = m.next_token_nll_batch(seqs, &stats);
  EXPECT_EQ(m.last_tokens(), 150) << "the last forward's rows";
  ASSERT_EQ(got.size(), seqs.size());
  for (size_t b = 0; b < seqs.size(); ++b) {
    SCOPED_TRACE(str("sequence ", b));
    const std::vector<double> alone = single.next_token_nll(seqs[b], &one);
    model::add_layer_stats(want_stats, one);
    const std::vector<double> want = cpu.next_token_nll(seqs[b]);
    ASSERT_EQ(got[b].size(), seqs[b].size() - 1);
    double apart = 0, off = 0, diff = 0, size = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (i + 1 < want.size()) apart += std::abs(want[i + 1] - want[i]) / double(want.size() - 1);
      off += std::abs(got[b][i] - want[i]) / double(want.size());
      diff += std::abs(got[b][i] - alone[i]), size += std::abs(alone[i]);
    }
    EXPECT_LT(off, 0.25 * apart) << "against the CPU model's rows";
    EXPECT_LT(diff, kTol * size) << "against next_token_nll of the sequence alone";
  }
  ASSERT_EQ(stats.size(), want_stats.size());
  for (size_t l = 0; l < stats.size(); ++l) {
    EXPECT_EQ(stats[l].tokens, 1080) << "layer " << l;
    EXPECT_NEAR(double(stats[l].nnz), double(want_stats[l].nnz), 0.02 * double(want_stats[l].nnz) + 1) << "layer " << l;
  }
  // checked first: a bad id in the seventh sequence runs none of them
  std::vector<std::vector<int32_t>> bad = seqs;
  bad[6][5] = static_cast<int32_t>(c.vocab_size);
  m.next_token_nll(seqs[5]);
  test::expect_error([&] { m.next_token_nll_batch(bad); }, {"perplexity: sequence 6: token "});
  EXPECT_EQ(m.last_tokens(), 90) << "a refused call ran a forward";
  test::expect_error([&] { m.next_token_nll_batch({seqs[0], {1}}); }, {"sequence 1 needs at least 2 tokens"});
  test::expect_error([&] { m.next_token_nll_batch({some_tokens(201, c.vocab_size, 5), seqs[0]}); }, {"context"});
  single.prefill({1, 2, 3});
  test::expect_error([&] { single.next_token_nll_batch(seqs); }, {"generation in progress"});
  EXPECT_EQ(single.cached_tokens(), 3);
  single.reset();
  // with the KV cache (Python's Model(max_batch=4)): the same forwards in the cache's memory, which
  // they leave empty
  LlamaCudaOptions cached = batched;
  cached.kv_cache = true;
  LlamaCuda with_cache(dw, cached);
  const std::vector<std::vector<double>> again = with_cache.next_token_nll_batch(seqs);
  ASSERT_EQ(again.size(), got.size());
  for (size_t b = 0; b < got.size(); ++b) {
    double diff = 0, size = 0;
    for (size_t i = 0; i < got[b].size(); ++i) diff += std::abs(again[b][i] - got[b][i]), size += std::abs(got[b][i]);
    EXPECT_LT(diff, kTol * size) << "sequence " << b << " with the KV cache";
  }
  EXPECT_EQ(with_cache.cached_tokens(), 0);
  // eval's windows, 4 a call against one
  std::vector<int32_t> text;
  for (const auto& s : seqs) text.insert(text.end(), s.begin(), s.end());
  const model::Perplexity four = model::windowed_perplexity(m, text, 200, 200, 0, nullptr, {}, "the text", 4),
                          one_a_call = model::windowed_perplexity(single, text, 200, 200);
  EXPECT_EQ(four.predictions, one_a_call.predictions);
  EXPECT_NEAR(four.mean_nll, one_a_call.mean_nll, 1e-3 * one_a_call.mean_nll);
  // by default as many windows a call as the model batches (max_batch), for the statistics too
  // (Python's ffn_stats): 1080 tokens, five windows of 200 (a call of 4, one of 1) and one of 80
  EXPECT_EQ(m.sequences_a_forward(), 4);
  EXPECT_EQ(single.sequences_a_forward(), 1);
  EXPECT_EQ(model::windowed_perplexity(m, text, 200, 200).mean_nll, four.mean_nll);
  const std::vector<ActivationStats> batched_stats = model::ffn_stats_in_windows(m, text, 200),
                                     single_stats = model::ffn_stats_in_windows(single, text, 200);
  ASSERT_EQ(batched_stats.size(), single_stats.size());
  for (size_t l = 0; l < single_stats.size(); ++l) {
    EXPECT_EQ(batched_stats[l].tokens, 1080) << "layer " << l;
    EXPECT_NEAR(double(batched_stats[l].nnz), double(single_stats[l].nnz), 0.02 * double(single_stats[l].nnz) + 1)
        << "layer " << l;
  }
  EXPECT_EQ(m.last_tokens(), 80) << "the text's last, shorter window alone";
}

// logits and next_token_nll with FFN statistics count what the CPU model counts, layer by layer:
// the tokens exactly (summed over chunks), the non-zeros, the most of a token and Σ|h| within 2%
// (the GPU's FFN input is rounded to bf16, which moves a few gates near zero across it), in one
// forward of more rows than the GPU counts at a time and in chunks, on the twell FFN's model and on one whose FFN runs on the dense cuBLASLt path (I = 176); the logits the
// bits they are without the counting, whose buffers a model that never counts never allocates; a
// SiLU model's left at zero, as the CPU leaves them; and `twell eval --sparsity`'s windows
// (model::windowed_perplexity) take them.
TEST(LlamaCuda, FfnStatisticsCountWhatTheCpuCounts) {
  TWELL_REQUIRE_HOPPER();
  auto near = [](double got, double w) { return std::abs(got - w) <= 0.02 * std::abs(w) + 1; };
  constexpr int64_t kT = 2200;  // more rows than the GPU counts at a time (kStatsRows, 2048)
  for (const Shape& shape : {kShapes[3], kShapes[4]}) {  // the twell FFN; the dense cuBLASLt FFN
    SCOPED_TRACE(shape.name);
    io::ModelConfig c = config_of(shape);
    c.max_position_embeddings = 2300;
    const auto [dw, cpu] = both_backends(c, 34);
    const std::vector<int32_t> tokens = some_tokens(kT, c.vocab_size, 10);
    std::vector<ActivationStats> want;
    const Tensor ref = cpu.logits(tokens, &want);
    ASSERT_EQ(want.size(), static_cast<size_t>(c.num_hidden_layers));
    LlamaCudaOptions small;
    small.max_tokens = 1024;  // chunks of 734, 733 and 733
    LlamaCuda whole(dw), chunked(dw, small);
    whole.logits(tokens);
    whole.logits(tokens);  // a shape's second call builds cuDNN's attention plan and tunes cuBLASLt
    const size_t before = whole.workspace_bytes();
    whole.logits(tokens, nullptr);
    EXPECT_EQ(whole.workspace_bytes(), before) << "no statistics asked: nothing more allocated";
    std::vector<ActivationStats> warm;
    whole.logits(tokens, &warm);  // every GEMM's shape seen twice at least: cuBLASLt's choices settled
    const Tensor plain = whole.logits(tokens);
    for (LlamaCuda* m : {&whole, &chunked}) {
      SCOPED_TRACE(str("max_tokens ", m->options().max_tokens));
      std::vector<ActivationStats> got, from_nll;
      const Tensor logits = m->logits(tokens, &got);
      EXPECT_LT(relative_error(logits, ref), kTol);
      if (m == &whole) {
        EXPECT_EQ(std::memcmp(logits.view().data, plain.view().data, plain.nbytes()), 0) << "the counting moved the logits";
      }
      m->next_token_nll(tokens, &from_nll);
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(from_nll.size(), want.size());
      for (size_t l = 0; l < want.size(); ++l) {
        SCOPED_TRACE(str("layer ", l));
        EXPECT_EQ(got[l].tokens, kT);
        EXPECT_EQ(from_nll[l].tokens, kT);
        EXPECT_GT(want[l].nnz, 0);
        EXPECT_PRED2(near, double(got[l].nnz), double(want[l].nnz));
        EXPECT_PRED2(near, double(got[l].max_nnz_per_token), double(want[l].max_nnz_per_token));
        EXPECT_PRED2(near, got[l].l1_sum, want[l].l1_sum);
        EXPECT_PRED2(near, double(from_nll[l].nnz), double(want[l].nnz));
        EXPECT_PRED2(near, from_nll[l].l1_sum, want[l].l1_sum);
      }
      EXPECT_EQ(m->cached_tokens(), 0);
    }
    // eval's windows: two of 1100, summed
    std::vector<ActivationStats> windows, cpu_windows;
    model::windowed_perplexity(whole, tokens, 1100, 1100, 0, &windows);
    model::windowed_perplexity(cpu, tokens, 1100, 1100, 0, &cpu_windows);
    ASSERT_EQ(windows.size(), cpu_windows.size());
    for (size_t l = 0; l < windows.size(); ++l) {
      EXPECT_EQ(windows[l].tokens, kT) << "layer " << l;
      EXPECT_PRED2(near, double(windows[l].nnz), double(cpu_windows[l].nnz)) << "layer " << l;
    }
  }
  // SiLU: zeros, as on the CPU
  const auto [silu_w, silu_cpu] = both_backends(config_of(kShapes[2]), 35);
  LlamaCuda silu(silu_w);
  std::vector<ActivationStats> got;
  silu.logits(some_tokens(50, kShapes[2].vocab, 11), &got);
  ASSERT_EQ(got.size(), static_cast<size_t>(config_of(kShapes[2]).num_hidden_layers));
  for (const ActivationStats& s : got) EXPECT_EQ(s.tokens, 0);
}

// Where the prefill FFN is sparse, a run below sparse_min_tokens (whose FFN runs dense by its size)
// costs 1.3 rows a row: prompts of 150, 40, 40, 40 tokens split into 150 | 3 × 40 (270 rows) while
// the model's density is unknown or high, but run as one batch of 600 rows on the sparse FFN once
// a prefill has measured every layer below dense_above_density (all but 1/128 of the gate rows
// zeroed: ~0.4% active).
TEST(LlamaCuda, RaggedPrefillKeepsTheSparseFfnOfASparseModel) {
  TWELL_REQUIRE_HOPPER();
  const io::ModelConfig c = config_of(kShapes[3]);
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(bf16_weights(c, 29)));
  const size_t H = static_cast<size_t>(c.hidden_size), I = static_cast<size_t>(c.intermediate_size);
  LlamaCudaOptions o;
  o.max_batch = 4;
  o.ffn_options.sparse_min_tokens = 256;
  std::vector<std::vector<int32_t>> prompts = {some_tokens(150, c.vocab_size, 1)};
  for (uint64_t b = 2; b <= 4; ++b) prompts.push_back(some_tokens(40, c.vocab_size, b));
  {
    LlamaCuda random(dw, o);  // ~50% active
    for (int call = 0; call < 2; ++call) {
      random.prefill_batch(prompts);
      EXPECT_EQ(random.last_tokens(), 150 + 3 * 40) << "call " << call;
    }
  }
  for (const LlamaCudaLayer& l : dw->layers)
    ASSERT_EQ(cudaMemset(static_cast<uint16_t*>(l.wg.view().data) + I / 128 * H, 0, (I - I / 128) * H * 2), cudaSuccess);
  LlamaCuda sparse(dw, o), single(dw, o);
  sparse.prefill_batch(prompts);  // no density yet: split; its small runs sample one
  EXPECT_EQ(sparse.last_tokens(), 150 + 3 * 40);
  const Tensor got = sparse.prefill_batch(prompts);
  EXPECT_EQ(sparse.last_tokens(), 4 * 150);
  for (FfnPath p : sparse.ffn_paths()) EXPECT_EQ(p, FfnPath::sparse);
  for (size_t b = 0; b < prompts.size(); ++b)
    EXPECT_LT(relative_error(rows(got, b, 1), single.prefill_batch({prompts[b]})), kTol) << "sequence " << b;
}

// A ReLU model wider than the TwELL and gather kernels take (H > 4096): FfnMode::twell runs its
// prefill and its decode steps on the dense FFN (its first decode step used to throw). The decode
// steps match the GPU's own full forward; against the CPU's fp32 model these random weights move
// by 2-4% in bf16 at this width on every path (the SiLU model and H = 4096 too, measured).
TEST(LlamaCuda, ReluModelWiderThanTheSparseKernelsRunsDense) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = config_of({"wide_relu", 4160, 128, 4, 2, 64, 97, 64, "relu", true});
  ASSERT_TRUE(LlamaCuda::supports(c));
  BothBackends m = both_backends(c, 21);
  LlamaCuda gpu(m.gpu);
  const std::vector<int32_t> tokens = some_tokens(12, c.vocab_size, 5);
  const Tensor ref = m.cpu.logits(tokens), full = gpu.logits(tokens);
  EXPECT_LT(relative_error(full, ref), 0.1);  // the same model, not its bf16 rounding (2-5% here)
  Tensor last = gpu.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + 9));
  EXPECT_LT(relative_error(TensorView(last.view().data, DType::f32, {1, c.vocab_size}), rows(full, 8, 1)), kTol);
  for (int64_t t = 9; t < 12; ++t) {
    last = gpu.decode_step(tokens[t]);
    EXPECT_LT(relative_error(TensorView(last.view().data, DType::f32, {1, c.vocab_size}), rows(full, t, 1)), kTol)
        << "decode step at " << t;
  }
}

// HuggingFace transformers' logits on the gpu_* fixtures (made by tests/model/make_hf_fixture.py):
// our bf16 model against HF's fp32 one, within the issue's 1e-2. gpu_relu_llama3 checks the RoPE
// table with llama3 scaling (the CPU backend's fixture llama3_rope checks the formula to 1e-5;
// without the scaling the error is ~0.1); the bf16 rounding of its weights alone moves HF's own
// logits by 1.3e-2, so there the bound is HF's bf16 model's distance from fp32.
struct HfFixture {
  const char* name;
  bool bound_by_hf_bf16;
};
std::ostream& operator<<(std::ostream& os, const HfFixture& f) { return os << f.name; }
class LlamaCudaHfParity : public ::testing::TestWithParam<HfFixture> {};

TEST_P(LlamaCudaHfParity, LogitsMatchTransformers) {
  TWELL_REQUIRE_HOPPER();
  // Next to this source file, or (binaries built elsewhere, run from the repository root) in ./tests.
  const char* name = GetParam().name;
  std::string dir = (std::filesystem::path(__FILE__).parent_path().parent_path() / "model/data/llama" / name).string();
  if (!std::filesystem::exists(dir)) dir = std::string("tests/model/data/llama/") + name;
  ASSERT_TRUE(std::filesystem::exists(dir + "/logits.safetensors"))
      << dir << " missing: run tests/model/make_hf_fixture.py " << name;
  const io::SafetensorsFile ref = io::SafetensorsFile::open(dir + "/logits.safetensors");
  const TensorView tok = ref.view("tokens");
  const std::vector<int32_t> tokens(tok.ptr<int32_t>(), tok.ptr<int32_t>() + tok.numel());
  model::LlamaLoadOptions lo;
  lo.dtype = DType::bf16;
  auto dw = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(LlamaWeights::load_dir(dir, lo)));
  LlamaCuda gpu(dw);
  const Tensor out = gpu.logits(tokens);
  const double err32 = relative_error(out, ref.view("logits")), err_bf16 = relative_error(out, ref.view("logits_bf16"));
  const double hf_bf16 = relative_error(ref.view("logits_bf16"), ref.view("logits"));
  std::printf("%s: rel err vs HF fp32 %.2e, vs HF bf16 %.2e (HF bf16 vs HF fp32: %.2e)\n", name, err32, err_bf16,
              hf_bf16);
  EXPECT_LT(err32, GetParam().bound_by_hf_bf16 ? hf_bf16 : 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaCudaHfParity,
                         ::testing::Values(HfFixture{"gpu_relu_tied", false}, HfFixture{"gpu_silu_untied", false},
                                           HfFixture{"gpu_relu_llama3", true}),
                         [](const ::testing::TestParamInfo<HfFixture>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace twell::cuda

