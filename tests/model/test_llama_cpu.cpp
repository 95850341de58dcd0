// Tests of the CPU Llama model (include/twell/model/llama.h):
//  - a tiny random model written here in HF format (config.json + model.safetensors) against a
//    naive float64 implementation in this file (relu/silu × tied/untied);
//  - KV-cache decoding equals the full forward, bit for bit; thread count changes nothing;
//  - corrupt or mismatched checkpoints give one-line errors naming the tensor;
//  - sampling, generation and perplexity;
//  - parity with HuggingFace transformers on the fixtures of tests/model/make_hf_fixture.py
//    (tests/model/data/llama/<name>/: config.json, model.safetensors, logits.safetensors).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/random.h"
#include "core/io_test_util.h"
#include "model/llama_test_util.h"
#include "cpu/parallel.h"
#include "twell/io/config.h"
#include "twell/io/safetensors.h"
#include "twell/model/llama.h"
#include "twell/model/load.h"
#include "twell/model/tokenizer.h"
#include "twell/model/load.h"

namespace twell::model {
namespace {

using test::expect_error;


// ---- the naive float64 reference: straight from the HF modelling code ----------------------
using Mat = std::vector<double>;  // row-major

Mat vec(const HfTensors& t, const std::string& name) {
  return to_f64(t.at(name));
}

// out [T, N] = x [T, K] · w[N, K]ᵀ
Mat matmul_t(const Mat& x, int64_t T, const Mat& w, int64_t N, int64_t K) {
  Mat out(T * N, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[t * K + k] * w[n * K + k];
      out[t * N + n] = s;
    }
  return out;
}

Mat rms_norm(const Mat& x, int64_t T, int64_t H, const Mat& w, double eps) {
  Mat out(T * H);
  for (int64_t t = 0; t < T; ++t) {
    double ms = 0;
    for (int64_t i = 0; i < H; ++i) ms += x[t * H + i] * x[t * H + i] / double(H);
    for (int64_t i = 0; i < H; ++i) out[t * H + i] = w[i] * x[t * H + i] / std::sqrt(ms + eps);
  }
  return out;
}

void rope(Mat& x, int64_t T, int64_t heads, int64_t hd, double theta) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      double* r = &x[(t * heads + h) * hd];
      std::vector<double> rotated(hd);  // rotate_half(r) = cat(-r2, r1)
      for (int64_t i = 0; i < hd / 2; ++i) {
        rotated[i] = -r[i + hd / 2];
        rotated[i + hd / 2] = r[i];
      }
      for (int64_t i = 0; i < hd; ++i) {
        const double f = std::pow(theta, -double(2 * (i % (hd / 2))) / double(hd));
        r[i] = r[i] * std::cos(t * f) + rotated[i] * std::sin(t * f);
      }
    }
}

Mat naive_logits(const io::ModelConfig& c, const HfTensors& w, const std::vector<int32_t>& tok) {
  const int64_t T = tok.size(), H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const Mat embed = vec(w, "model.embed_tokens.weight");
  Mat x(T * H);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) x[t * H + i] = embed[tok[t] * H + i];
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Mat a = rms_norm(x, T, H, vec(w, p + "input_layernorm.weight"), c.rms_norm_eps);
    Mat q = matmul_t(a, T, vec(w, p + "self_attn.q_proj.weight"), nh * hd, H);
    Mat k = matmul_t(a, T, vec(w, p + "self_attn.k_proj.weight"), nkv * hd, H);
    Mat v = matmul_t(a, T, vec(w, p + "self_attn.v_proj.weight"), nkv * hd, H);
    rope(q, T, nh, hd, c.rope_theta);
    rope(k, T, nkv, hd, c.rope_theta);
    Mat attn(T * nh * hd, 0.0);
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / (nh / nkv);  // repeat_kv
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -INFINITY, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i)
            d += q[(t * nh + h) * hd + i] * k[(u * nkv + g) * hd + i];
          s[u] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[u]);
        }
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t i = 0; i < hd; ++i)
            attn[(t * nh + h) * hd + i] += s[u] / sum * v[(u * nkv + g) * hd + i];
      }
    }
    const Mat o = matmul_t(attn, T, vec(w, p + "self_attn.o_proj.weight"), H, nh * hd);
    for (int64_t i = 0; i < T * H; ++i) x[i] += o[i];
    a = rms_norm(x, T, H, vec(w, p + "post_attention_layernorm.weight"), c.rms_norm_eps);
    const Mat gate = matmul_t(a, T, vec(w, p + "mlp.gate_proj.weight"), I, H);
    Mat h = matmul_t(a, T, vec(w, p + "mlp.up_proj.weight"), I, H);
    for (int64_t i = 0; i < T * I; ++i) {
      const double gi = gate[i];
      h[i] *= c.hidden_act == "relu" ? std::max(gi, 0.0) : gi / (1 + std::exp(-gi));
    }
    const Mat y = matmul_t(h, T, vec(w, p + "mlp.down_proj.weight"), H, I);  // down_proj [H, I]
    for (int64_t i = 0; i < T * H; ++i) x[i] += y[i];
  }
  const Mat a = rms_norm(x, T, H, vec(w, "model.norm.weight"), c.rms_norm_eps);
  return matmul_t(
      a, T, vec(w, c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"), V, H);
}

Tensor f64_tensor(const Mat& m, Shape shape) {
  Tensor t(DType::f64, std::move(shape));
  std::copy(m.begin(), m.end(), t.ptr<double>());
  return t;
}

// Row `r` of a [T, V] tensor as a [V] view.
TensorView row_of(const Tensor& t, int64_t r) {
  const int64_t V = t.shape()[1];
  return TensorView(static_cast<uint8_t*>(t.view().data) + r * V * dtype_size(t.dtype()), t.dtype(),
                    {V});
}

const std::vector<int32_t> kTokens = {3, 96, 0, 41, 41, 7, 88, 15, 60, 2, 33, 71, 19, 50};

// ---- forward vs the naive reference -------------------------------------------------------
struct Variant {
  const char* act;
  bool tied;
};

class LlamaTiny : public test::ScratchDirTest, public testing::WithParamInterface<Variant> {};

// Tolerances: the f64 path differs from the naive one only in summation order (~1e-15 per op);
// the f32 path carries fp32 rounding through 2 layers of width 64/176 (measured ~1e-6 relative,
// ~2e-7 per op times depth and softmax/norm amplification), so 2e-5 leaves margin without hiding
// a wrong formula, whose error would be O(1).
TEST_P(LlamaTiny, ForwardMatchesNaiveFloat64Reference) {
  const io::ModelConfig c = tiny_config(GetParam().act, GetParam().tied);
  const HfTensors hf = random_hf_tensors(c, 100);
  write_hf(dir_, c, hf);
  const Tensor ref =
      f64_tensor(naive_logits(c, hf, kTokens), {int64_t(kTokens.size()), c.vocab_size});

  LlamaCpu f64(LlamaWeights::load_dir(dir_), {DType::f64});
  const Tensor out64 = f64.logits(kTokens);
  EXPECT_EQ(out64.dtype(), DType::f64);
  const double err64 = relative_error(out64, ref);
  EXPECT_LT(err64, 1e-12);

  LlamaCpu f32(LlamaWeights::load_dir(dir_));
  const Tensor out32 = f32.logits(kTokens);
  ASSERT_EQ(out32.dtype(), DType::f32);
  ASSERT_EQ(out32.shape(), (Shape{int64_t(kTokens.size()), c.vocab_size}));
  const double err32 = relative_error(out32, ref);
  EXPECT_LT(err32, 2e-5);
  std::printf("[ accuracy ] f32 rel err %.3g, f64 rel err %.3g\n", err32, err64);
  EXPECT_TRUE(test::all_close(out32, ref, 1e-4, 1e-4));
}

// prefill(prompt) + decode_step(t) for each further token gives, at every step, the last row of
// the full forward of the sequence so far: the same per-row arithmetic, so bit for bit.
TEST_P(LlamaTiny, KvCacheDecodeEqualsFullForward) {
  const io::ModelConfig c = tiny_config(GetParam().act, GetParam().tied);
  write_hf(dir_, c, random_hf_tensors(c, 200));
  for (DType math : {DType::f32, DType::f64}) {
    LlamaCpu model(LlamaWeights::load_dir(dir_), {math});
    const Tensor full = model.logits(kTokens);
    const size_t prompt = 5;
    Tensor step = model.prefill({kTokens.begin(), kTokens.begin() + prompt});
    EXPECT_TRUE(test::bit_equal(step, row_of(full, prompt - 1))) << dtype_name(math);
    for (size_t t = prompt; t < kTokens.size(); ++t) {
      step = model.decode_step(kTokens[t]);
      EXPECT_EQ(model.cached_tokens(), int64_t(t + 1));
      EXPECT_TRUE(test::bit_equal(step, row_of(full, t))) << dtype_name(math) << " step " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, LlamaTiny,
                         testing::Values(Variant{"relu", true}, Variant{"relu", false},
                                         Variant{"silu", true}, Variant{"silu", false}),
                         [](const auto& variant) {
                           return std::string(variant.param.act) +
                                  (variant.param.tied ? "_tied" : "_untied");
                         });

class LlamaCpuTest : public test::ScratchDirTest {
 protected:
  // Writes a tiny relu model and returns it loaded.
  LlamaCpu tiny(bool tied = true, LlamaOptions options = {}) {
    const io::ModelConfig c = tiny_config("relu", tied);
    write_hf(dir_, c, random_hf_tensors(c, 300));
    return LlamaCpu(LlamaWeights::load_dir(dir_), options);
  }
};

// save_dir writes what load_dir reads back bit for bit (wd back to HF's [H, I] on disk), untied and
// tied, f32 and bf16, with the same logits; a directory that cannot be made is refused.
TEST_F(LlamaCpuTest, SaveDirWritesWhatLoadDirReads) {
  for (const bool tied : {false, true}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(str(tied ? "tied " : "untied ", dtype_name(dtype)));
      const io::ModelConfig c = tiny_config("relu", tied);
      write_hf(dir_, c, random_hf_tensors(c, 310));
      LlamaLoadOptions o;
      o.dtype = dtype;
      const LlamaWeights w = LlamaWeights::load_dir(dir_, o);
      const std::string copy = path(str("copy_", tied, "_", dtype_name(dtype)));
      w.save_dir(copy);
      EXPECT_TRUE(io::Checkpoint::open(copy).has("model.layers.1.mlp.down_proj.weight"));
      EXPECT_EQ(io::Checkpoint::open(copy).info("model.layers.1.mlp.down_proj.weight").shape,
                (Shape{c.hidden_size, c.intermediate_size}));
      const LlamaWeights back = LlamaWeights::load_dir(copy, o);
      EXPECT_TRUE(back.unused.empty());
      EXPECT_TRUE(test::bit_equal(back.embed.view(), w.embed.view()));
      EXPECT_TRUE(test::bit_equal(back.final_norm.view(), w.final_norm.view()));
      if (!tied) {
        EXPECT_TRUE(test::bit_equal(back.lm_head.view(), w.lm_head.view()));
      }
      ASSERT_EQ(back.layers.size(), w.layers.size());
      for (size_t l = 0; l < w.layers.size(); ++l) {
        const LlamaLayerWeights &a = back.layers[l], &b = w.layers[l];
        for (const auto& [x, y] : std::vector<std::pair<const Tensor*, const Tensor*>>{
                 {&a.input_norm, &b.input_norm}, {&a.wq, &b.wq}, {&a.wk, &b.wk}, {&a.wv, &b.wv}, {&a.wo, &b.wo},
                 {&a.post_norm, &b.post_norm}, {&a.wg, &b.wg}, {&a.wu, &b.wu}, {&a.wd, &b.wd}})
          EXPECT_TRUE(test::bit_equal(x->view(), y->view())) << "layer " << l;
      }
      if (dtype == DType::f32) {
        const std::vector<int32_t> tokens = {1, 5, 9, 2, 7};
        EXPECT_TRUE(test::bit_equal(LlamaCpu(LlamaWeights::load_dir(copy)).logits(tokens).view(),
                                    LlamaCpu(LlamaWeights::load_dir(dir_)).logits(tokens).view()));
      }
    }
  }
  const LlamaWeights w = LlamaWeights::load_dir(dir_);
  size_t held = w.embed.nbytes() + w.final_norm.nbytes() + w.lm_head.nbytes();  // what the load's memory check counts
  for (const LlamaLayerWeights& l : w.layers)
    for (const Tensor* t : {&l.input_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.post_norm, &l.wg, &l.wu, &l.wd})
      held += t->nbytes();
  EXPECT_EQ(LlamaWeights::bytes_for(w.config, DType::f32), held);
  EXPECT_EQ(LlamaWeights::bytes_for(w.config, DType::bf16), held / 2);
  std::ofstream(path("a_file")) << "x";
  expect_error([&] { w.save_dir(path("a_file") + "/model"); }, {"cannot create the directory"});
  // config.json's path is checked before the weights are written: where it cannot be written, no new
  // weights sit beside an old (or no) config
  const std::string blocked = path("blocked");
  std::filesystem::create_directories(blocked + "/config.json");
  expect_error([&] { w.save_dir(blocked); }, {"config.json"});
  EXPECT_FALSE(std::filesystem::exists(blocked + "/model.safetensors"));
  // the weights that cannot be written leave the earlier config as it was, and no temporary behind
  const std::string earlier = path("earlier");
  w.save_dir(earlier);
  const std::string config_before = test::read_file(earlier + "/config.json");
  std::filesystem::remove(earlier + "/model.safetensors");
  std::filesystem::create_directories(earlier + "/model.safetensors");
  expect_error([&] { w.save_dir(earlier); }, {"model.safetensors"});
  EXPECT_EQ(test::read_file(earlier + "/config.json"), config_before);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(earlier), std::filesystem::directory_iterator()), 2);
  // load_dir and load_model take the directory: a file in it, nothing, or an empty path is named as such
  for (const std::string& file : {path("config.json"), path("model.safetensors")}) {
    expect_error([&] { LlamaWeights::load_dir(file); }, {"must be a model directory", "got the file " + file});
    expect_error([&] { load_model(file); }, {"must be a model directory", "got the file " + file});
  }
  expect_error([&] { LlamaWeights::load_dir(path("none")); }, {"no such directory: " + path("none")});
  expect_error([&] { load_model(""); }, {"expected a model directory, got an empty path"});
}

// The ids a generation stops at by default: the config's, then the tokenizer's EOS where it is not
// among them already.
TEST(DefaultStopIds, AreTheConfigsAndTheTokenizersEos) {
  io::ModelConfig c = tiny_config("relu", true);
  c.eos_token_ids = {5, 257};
  EXPECT_EQ(default_stop_ids(c, ByteTokenizer(true, true)), (std::vector<int32_t>{5, 257}));  // its EOS is 257
  c.eos_token_ids = {};
  EXPECT_EQ(default_stop_ids(c, ByteTokenizer(true, true)), (std::vector<int32_t>{257}));
  EXPECT_TRUE(default_stop_ids(c, ByteTokenizer()).empty());
}

// A model wide enough that parallel_for really splits the projections, the LM head and the FFN
// (the tiny one stays under its per-thread threshold and runs serially).
TEST_F(LlamaCpuTest, ResultsDoNotDependOnThreadCount) {
  io::ModelConfig c = tiny_config("relu", true);
  c.hidden_size = 256;
  c.intermediate_size = 1024;
  c.head_dim = 64;
  c.num_hidden_layers = 1;
  c.vocab_size = 4096;
  write_hf(dir_, c, random_hf_tensors(c, 700));
  const LlamaCpu model(LlamaWeights::load_dir(dir_));
  const int before = cpu::set_num_threads(1);
  const Tensor one = model.logits(kTokens);
  cpu::set_num_threads(4);
  const Tensor four = model.logits(kTokens);
  cpu::set_num_threads(before);
  EXPECT_TRUE(test::bit_equal(four, one));
}

TEST_F(LlamaCpuTest, DownProjIsStoredNeuronMajor) {
  const io::ModelConfig c = tiny_config("relu", true);
  const HfTensors hf = random_hf_tensors(c, 400);
  write_hf(dir_, c, hf);
  const LlamaWeights w = LlamaWeights::load_dir(dir_);
  const Tensor& disk = hf.at("model.layers.1.mlp.down_proj.weight");  // [H, I]
  const Tensor& wd = w.layers[1].wd;                                  // [I, H]
  ASSERT_EQ(wd.shape(), (Shape{c.intermediate_size, c.hidden_size}));
  for (int64_t j : {0, 5, 175})
    for (int64_t h : {0, 17, 63})
      EXPECT_EQ(wd.ptr<float>()[j * c.hidden_size + h],
                disk.ptr<float>()[h * c.intermediate_size + j]);
}

// head_dim given, the heads need not span H (q_proj [heads · head_dim, H]; 64 is not a multiple of
// 3): the model loads and its f32 forward agrees with the f64 one (the GPU test compares backends).
TEST_F(LlamaCpuTest, HeadsNeedNotSpanTheHiddenSize) {
  io::ModelConfig c = tiny_config("relu", true);
  c.num_attention_heads = 3, c.num_key_value_heads = 1, c.head_dim = 32;
  write_hf(dir_, c, random_hf_tensors(c, 320));
  const LlamaWeights w = LlamaWeights::load_dir(dir_);
  EXPECT_EQ(w.layers[0].wq.shape(), (Shape{96, 64}));
  LlamaOptions f64;
  f64.math = DType::f64;
  const LlamaCpu model(LlamaWeights::load_dir(dir_)), oracle(LlamaWeights::load_dir(dir_), f64);
  EXPECT_LT(relative_error(model.logits(kTokens), oracle.logits(kTokens)), 1e-5);
}

// Weights built by hand are checked as a checkpoint is: a wrong shape, a mixed dtype or an lm_head
// beside tied embeddings is refused by name, before anything runs.
TEST_F(LlamaCpuTest, HandBuiltWeightsAreValidated) {
  tiny();
  auto weights = [&] { return LlamaWeights::load_dir(dir_); };
  LlamaWeights w = weights();
  w.layers[1].wq = Tensor(DType::f32, {32, 64});
  expect_error([&] { LlamaCpu{std::move(w)}; }, {"LlamaWeights: layers[1].wq: expected shape [64, 64], got [32, 64]"});
  w = weights();
  w.layers[0].wd = Tensor(DType::f32, {64, 176});  // down_proj as on disk, not neuron-major
  expect_error([&] { LlamaCpu{std::move(w)}; }, {"layers[0].wd (neuron-major", "expected shape [176, 64]"});
  w = weights();
  w.final_norm = Tensor(DType::bf16, {64});
  expect_error([&] { LlamaCpu{std::move(w)}; }, {"final_norm: dtype bf16, embed's is f32"});
  w = weights();
  w.lm_head = Tensor(DType::f32, {97, 64});
  expect_error([&] { LlamaCpu{std::move(w)}; }, {"lm_head must be empty when the config ties the embeddings"});
  w = weights();
  w.config.hidden_act = "gelu";  // config.validate() takes it; the Llama runtime runs relu and silu
  expect_error([&] { LlamaCpu{std::move(w)}; }, {"hidden_act 'gelu' is not supported by the Llama runtime"});
  w = weights();
  w.layers.pop_back();
  expect_error([&] { LlamaCpu{std::move(w)}; }, {"LlamaWeights: 1 layers, the config has 2"});
  EXPECT_NO_THROW(LlamaCpu{weights()});
}

// An F64 checkpoint (transformers saves one from a float64 model) loads as its F32 rounding does:
// the same logits, bit for bit.
TEST_F(LlamaCpuTest, F64CheckpointLoadsAsItsF32Rounding) {
  const io::ModelConfig c = tiny_config("relu", false);
  const HfTensors f32 = random_hf_tensors(c, 310);
  HfTensors f64;
  for (const auto& [name, t] : f32) {
    Tensor d(DType::f64, t.shape());
    // Doubles that round to the f32 values: the f32 value plus less than half of its ulp.
    for (int64_t i = 0; i < t.numel(); ++i)
      d.ptr<double>()[i] = double(t.ptr<float>()[i]) * (1 + 0x1p-30);
    f64[name] = std::move(d);
  }
  write_hf(dir_, c, f32);
  const Tensor want = LlamaCpu(LlamaWeights::load_dir(dir_)).logits(kTokens);
  write_hf(dir_, c, f64);
  EXPECT_TRUE(test::bit_equal(LlamaCpu(LlamaWeights::load_dir(dir_)).logits(kTokens), want));
}

// bf16 storage: weights rounded once (relative ~2^-9 each), the maths still fp32.
TEST_F(LlamaCpuTest, Bf16StorageIsCloseToF32) {
  const LlamaCpu f32 = tiny();
  LlamaLoadOptions opts;
  opts.dtype = DType::bf16;
  const LlamaCpu bf16(LlamaWeights::load_dir(dir_, opts));
  EXPECT_EQ(bf16.weights().dtype(), DType::bf16);
  const double err = relative_error(bf16.logits(kTokens), f32.logits(kTokens));
  EXPECT_GT(err, 0.0);
  EXPECT_LT(err, 3e-2);
}

// The ReLU FFN with bf16 rounding points (DESIGN.md §2) stays close to the unrounded one.
TEST_F(LlamaCpuTest, ReluFfnBf16RoundingIsClose) {
  LlamaOptions rounded;
  rounded.relu_ffn = Precision::bf16;
  const LlamaCpu exact = tiny();
  const LlamaCpu bf16 = LlamaCpu(LlamaWeights::load_dir(dir_), rounded);
  const double err = relative_error(bf16.logits(kTokens), exact.logits(kTokens));
  EXPECT_GT(err, 0.0);
  EXPECT_LT(err, 3e-2);
}

// ---- bad checkpoints ----------------------------------------------------------------------
class LlamaLoadErrors : public test::ScratchDirTest {
 protected:
  io::ModelConfig c = tiny_config("relu", false);
  HfTensors hf = random_hf_tensors(c, 500);
  void load() { LlamaWeights::load_dir(dir_); }
};

TEST_F(LlamaLoadErrors, MissingTensor) {
  hf.erase("model.layers.1.self_attn.v_proj.weight");
  write_hf(dir_, c, hf);
  expect_error([&] { load(); },
               {"missing tensor 'model.layers.1.self_attn.v_proj.weight'", "[32, 64]"});
}

TEST_F(LlamaLoadErrors, MissingLmHeadWhenUntied) {
  hf.erase("lm_head.weight");
  write_hf(dir_, c, hf);
  expect_error([&] { load(); },
               {"missing tensor 'lm_head.weight'", "tie_word_embeddings is false, the default when absent"});
}

TEST_F(LlamaLoadErrors, WrongShape) {
  hf["model.layers.0.mlp.up_proj.weight"] = Tensor(DType::f32, {176, 63});
  write_hf(dir_, c, hf);
  expect_error([&] { load(); }, {"tensor 'model.layers.0.mlp.up_proj.weight'",
                                 "expected shape [176, 64], got [176, 63]"});
}

// In a sharded checkpoint the problem names the shard that holds the tensor, as a NaN's does.
TEST_F(LlamaLoadErrors, WrongShapeInAShardNamesTheShard) {
  hf["model.layers.1.mlp.up_proj.weight"] = Tensor(DType::f32, {64, 176});
  std::filesystem::create_directories(dir_);
  io::write_config(dir_, c);
  std::vector<std::pair<std::string, TensorView>> shard[2];
  std::string map;
  for (const auto& [name, tensor] : hf) {
    const int k = name.find("layers.1.") != std::string::npos ? 1 : 0;
    shard[k].emplace_back(name, tensor.view());
    map += str(map.empty() ? "" : ", ", "\"", name, "\": \"model-0000", k + 1, "-of-00002.safetensors\"");
  }
  for (int k = 0; k < 2; ++k) io::write_safetensors(str(dir_, "/model-0000", k + 1, "-of-00002.safetensors"), shard[k]);
  std::ofstream(dir_ + "/model.safetensors.index.json") << "{\"metadata\": {}, \"weight_map\": {" << map << "}}";
  expect_error([&] { load(); }, {"tensor 'model.layers.1.mlp.up_proj.weight' (in ", "model-00002-of-00002.safetensors)",
                                 "expected shape [176, 64], got [64, 176]"});
}

// A checkpoint for another config: every mismatching tensor is named.
TEST_F(LlamaLoadErrors, ConfigDoesNotMatchCheckpoint) {
  write_hf(dir_, c, hf);
  io::ModelConfig other = c;
  other.num_key_value_heads = 4;  // no GQA: k_proj would be [64, 64]
  io::write_config(dir_, other);
  expect_error([&] { load(); }, {"tensor 'model.layers.0.self_attn.k_proj.weight'",
                                 "expected shape [64, 64], got [32, 64]"});
}

TEST_F(LlamaLoadErrors, WrongDtype) {
  hf["model.norm.weight"] = Tensor(DType::i32, {64});
  write_hf(dir_, c, hf);
  expect_error([&] { load(); },
               {"tensor 'model.norm.weight'", "expected dtype BF16, F16, F32 or F64, got I32"});
}

// A tensor of a dtype twell does not read (FP8, BOOL, ...): where the model does not need it, the
// checkpoint loads and lists it as unused; where it does, the tensor and its dtype are named.
TEST_F(LlamaLoadErrors, DtypesTwellDoesNotRead) {
  hf["model.extra.mask"] = Tensor(DType::u8, {4});
  write_hf(dir_, c, hf);
  test::retype(dir_ + "/model.safetensors", "U8", "BOOL");
  EXPECT_EQ(LlamaWeights::load_dir(dir_).unused, std::vector<std::string>{"model.extra.mask"});

  hf.erase("model.extra.mask");
  hf["model.norm.weight"] = Tensor(DType::u8, {64});
  write_hf(dir_, c, hf);
  test::retype(dir_ + "/model.safetensors", "U8", "F8_E4M3");
  expect_error([&] { load(); },
               {"tensor 'model.norm.weight'", "expected dtype BF16, F16, F32 or F64, got F8_E4M3"});
}

TEST_F(LlamaLoadErrors, TruncatedFile) {
  write_hf(dir_, c, hf);
  const std::string file = dir_ + "/model.safetensors";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 100);
  expect_error([&] { load(); }, {"model.safetensors", "truncated"});
}

TEST_F(LlamaLoadErrors, NonFiniteWeightWhenChecked) {
  hf["model.layers.1.mlp.gate_proj.weight"].ptr<float>()[7] = NAN;
  write_hf(dir_, c, hf);
  expect_error([&] { load(); }, {"model.layers.1.mlp.gate_proj.weight"});  // checked by default
  LlamaLoadOptions opts;
  opts.check_finite = false;
  EXPECT_NO_THROW(LlamaWeights::load_dir(dir_, opts));
}

// Several problems in one checkpoint are named in one error (one line), so that one round fixes
// them all; NaN and Inf likewise, when checked.
TEST_F(LlamaLoadErrors, EveryProblemIsNamedAtOnce) {
  hf.erase("model.layers.1.self_attn.v_proj.weight");
  hf["model.layers.0.mlp.up_proj.weight"] = Tensor(DType::f32, {176, 63});
  hf["model.layers.0.self_attn.q_proj.bias"] = Tensor(DType::f32, {64});
  write_hf(dir_, c, hf);
  expect_error([&] { load(); }, {dir_ + ": 3 problems with the checkpoint's tensors: ",
                                 "missing tensor 'model.layers.1.self_attn.v_proj.weight'",
                                 "tensor 'model.layers.0.mlp.up_proj.weight': expected shape [176, 64], got [176, 63]",
                                 "tensor 'model.layers.0.self_attn.q_proj.bias'"});
}

TEST_F(LlamaLoadErrors, EveryNonFiniteTensorIsNamedAtOnce) {
  hf["model.layers.1.mlp.gate_proj.weight"].ptr<float>()[7] = NAN;
  hf["model.norm.weight"].ptr<float>()[3] = -INFINITY;
  write_hf(dir_, c, hf);
  LlamaLoadOptions opts;
  opts.check_finite = true;
  expect_error([&] { LlamaWeights::load_dir(dir_, opts); },
               {"2 tensors hold NaN or Inf: " + dir_ +
                    "/model.safetensors: tensor 'model.layers.1.mlp.gate_proj.weight': element 7",
                "is NaN", "model.safetensors: tensor 'model.norm.weight': element 3", "is -Inf"});
}

// A long list stops at 20 problems and says how many more.
TEST_F(LlamaLoadErrors, ALongListOfProblemsIsCut) {
  for (auto it = hf.begin(); it != hf.end();)
    it = LlamaWeights::layer_of(it->first) >= 0 ? hf.erase(it) : std::next(it);
  io::ModelConfig more = c;
  more.num_hidden_layers = 3;  // 27 layer tensors missing
  write_hf(dir_, more, hf);
  try {
    load();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("27 problems with the checkpoint's tensors:"), std::string::npos) << m;
    EXPECT_NE(m.find("; ... and 7 more"), std::string::npos) << m;
    EXPECT_EQ(std::count(m.begin(), m.end(), ';'), 20) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

// A config.json claiming far more layers than the checkpoint holds (a typo: 300000 for 30) fails at
// once, the layers it lacks counted rather than listed: it took seconds and a gigabyte (minutes and
// tens of GB at 10^7 layers) to build every missing tensor's name.
TEST_F(LlamaLoadErrors, ConfigWithFarMoreLayersFailsAtOnce) {
  write_hf(dir_, c, hf);
  io::ModelConfig more = c;
  more.num_hidden_layers = 300000;
  io::write_config(dir_, more);
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { load(); }, {dir_ + ": 2699982 problems with the checkpoint's tensors: ",
                                 "missing tensor 'model.layers.2.input_layernorm.weight' with shape [64]",
                                 "; ... and 2699962 more"});
  // (0.07 s here; 5.5 s without the fix. 2 s leaves room for the sanitizer build on a loaded machine.)
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// The same where one stray tensor of the last layer is in the checkpoint: every layer up to it was
// listed tensor by tensor (4 GB and 22 s for a config of 2^20 layers and a 100 KB checkpoint).
TEST_F(LlamaLoadErrors, AStrayTensorOfAFarLayerFailsAtOnce) {
  io::ModelConfig more = c;
  more.num_hidden_layers = 1 << 20;
  hf["model.layers.1048575.input_layernorm.weight"] = Tensor(DType::f32, {64});
  write_hf(dir_, more, hf);
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { load(); }, {dir_ + ": 9437165 problems with the checkpoint's tensors: ",
                                 "missing tensor 'model.layers.1048575.self_attn.q_proj.weight'",
                                 "missing tensor 'model.layers.2.input_layernorm.weight' with shape [64]",
                                 "; ... and 9437145 more"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// Layers past the config's num_hidden_layers load as a shorter model (HF does the same), listed in
// `unused` so that a caller can say so.
TEST_F(LlamaLoadErrors, LayersPastTheConfigAreListed) {
  write_hf(dir_, c, hf);
  io::ModelConfig fewer = c;
  fewer.num_hidden_layers = 1;
  io::write_config(dir_, fewer);
  const LlamaWeights w = LlamaWeights::load_dir(dir_);
  EXPECT_EQ(w.layers.size(), 1u);
  ASSERT_EQ(w.unused.size(), 9u);  // layer 1's nine tensors
  for (const std::string& name : w.unused) EXPECT_EQ(LlamaWeights::layer_of(name), 1) << name;
  EXPECT_EQ(LlamaWeights::layer_of("model.layers.12.mlp.up_proj.weight"), 12);
  EXPECT_EQ(LlamaWeights::layer_of("model.layers.x.y"), -1);
  EXPECT_EQ(LlamaWeights::layer_of("lm_head.weight"), -1);
}

// A tensor the Llama layer does not have, inside a layer the model runs (a Qwen2-style attention
// bias): that model would run wrong without it, so it is refused, naming the tensor.
TEST_F(LlamaLoadErrors, ForeignTensorInALayerIsRefused) {
  hf["model.layers.0.self_attn.q_proj.bias"] = Tensor(DType::f32, {64});
  write_hf(dir_, c, hf);
  expect_error([&] { load(); }, {"tensor 'model.layers.0.self_attn.q_proj.bias'", "is not part of the Llama layer"});
  // Many: one problem, by name with the layer as '*', each with its count (not one explanation a tensor).
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const char* p : {"q", "k", "v"}) hf[str("model.layers.", l, ".self_attn.", p, "_proj.bias")] = Tensor(DType::f32, {64});
  write_hf(dir_, c, hf);
  const int64_t n = c.num_hidden_layers;
  expect_error([&] { load(); }, {str(3 * n, " tensors 'model.layers.*.self_attn.k_proj.bias' (", n, " layer"),
                                 str("'model.layers.*.self_attn.q_proj.bias' (", n, " layer"),
                                 "are not part of the Llama layer twell runs"});
  try {
    load();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("would run wrong"), what.rfind("would run wrong")) << what;  // said once
  }
}

// A converted model saved with twell.FFN's parameter names (a plain state_dict): the refusal says how
// to save it as HF's checkpoint.
TEST_F(LlamaLoadErrors, TwellsOwnFfnNamesSayHowToSave) {
  c.num_hidden_layers = 9;  // said first, not after the 27 missing HF tensors' problems
  hf = random_hf_tensors(c, 501);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (const char* n : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) hf.erase(str("model.layers.", l, ".mlp.", n));
    for (const char* n : {"wg", "wu", "wd"})
      hf[str("model.layers.", l, ".mlp.", n)] = Tensor(DType::f32, {c.intermediate_size, c.hidden_size});
  }
  write_hf(dir_, c, hf);
  expect_error([&] { load(); }, {"27 tensors have twell.FFN's names, not HF's (e.g. 'model.layers.",
                                 "save_pretrained(dir, state_dict=twell.hf_state_dict(model))"});
}

// Other tensors the model does not read are listed (rotary_emb.inv_freq, which HF recomputes, is not).
TEST_F(LlamaLoadErrors, UnusedTensorsAreListed) {
  hf["model.layers.0.self_attn.rotary_emb.inv_freq"] = Tensor(DType::f32, {8});
  hf["model.extra.weight"] = Tensor(DType::f32, {4});
  write_hf(dir_, c, hf);
  const LlamaWeights w = LlamaWeights::load_dir(dir_);
  EXPECT_EQ(w.unused, std::vector<std::string>{"model.extra.weight"});
}

// config.json ties the embeddings, yet the checkpoint holds a head of its own: where its values
// differ from the embedding's the model uses it, as transformers 5 does (and says so); where they are
// the same it is the tied head, listed as unused.
TEST_F(LlamaLoadErrors, ATiedConfigsOwnHeadIsUsedWhereItDiffers) {
  c.tie_word_embeddings = true;
  write_hf(dir_, c, hf);  // lm_head.weight included
  const LlamaWeights own = LlamaWeights::load_dir(dir_);
  EXPECT_TRUE(own.head_untied);
  EXPECT_FALSE(own.config.tie_word_embeddings);
  EXPECT_TRUE(own.unused.empty());
  const Tensor& want = hf.at("lm_head.weight");
  ASSERT_EQ(own.head().nbytes(), want.nbytes());
  EXPECT_EQ(std::memcmp(own.head().data, want.view().data, want.nbytes()), 0);
  LlamaLoadOptions checked;  // the head it takes is scanned as an untied one is (checked by default)
  hf["lm_head.weight"].ptr<float>()[5] = NAN;
  write_hf(dir_, c, hf);
  expect_error([&] { LlamaWeights::load_dir(dir_, checked); }, {"tensor 'lm_head.weight'", "NaN"});

  hf["lm_head.weight"] = Tensor(DType::f32, want.shape());
  std::memcpy(hf["lm_head.weight"].view().data, hf.at("model.embed_tokens.weight").view().data, want.nbytes());
  write_hf(dir_, c, hf);
  const LlamaWeights same = LlamaWeights::load_dir(dir_);
  EXPECT_FALSE(same.head_untied);
  EXPECT_TRUE(same.config.tie_word_embeddings);
  EXPECT_EQ(same.unused, std::vector<std::string>{"lm_head.weight"});
}

TEST_F(LlamaLoadErrors, UnsupportedActivation) {
  c.hidden_act = "gelu";
  write_hf(dir_, c, hf);
  // The message names the file to fix.
  expect_error([&] { load(); }, {dir_ + "/config.json: hidden_act 'gelu' is not supported", "relu", "silu"});
}

TEST_F(LlamaCpuTest, BadTokensAndPositionsAreRejected) {
  LlamaCpu model = tiny();
  expect_error([&] { model.logits({1, 97}); }, {"token 97", "[0, 97)"});
  expect_error([&] { model.logits({-1}); }, {"token -1"});
  expect_error([&] { model.logits(std::vector<int32_t>(33, 1)); }, {"max_position_embeddings 32"});
  expect_error([&] { model.decode_step(1); }, {"prefill"});
  model.prefill(std::vector<int32_t>(32, 1));
  expect_error([&] { model.decode_step(1); }, {"max_position_embeddings"});
  EXPECT_EQ(model.cached_tokens(), 32);  // a rejected step leaves the cache as it was
  expect_error([&] { model.prefill({1, 97}); }, {"token 97"});
  EXPECT_EQ(model.cached_tokens(), 32);  // and so does a rejected prompt
}

// ---- sampling, generation, perplexity ---------------------------------------------------
Tensor logit_row(std::vector<float> v) {
  Tensor t(DType::f32, {int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

TEST(LlamaSampling, GreedyIsArgmaxLowestIndexOnTies) {
  Sampler s({});
  EXPECT_EQ(s.sample(logit_row({0.1f, 2.0f, -1.0f, 2.0f})), 1);
}

TEST(LlamaSampling, TopKOneAndTinyTopPAreGreedy) {
  const Tensor row = logit_row({0.5f, 0.2f, 0.9f, 0.8f});
  Sampler k1({/*temperature=*/1.0, /*top_k=*/1, 1.0, 7});
  Sampler p0({/*temperature=*/1.0, 0, /*top_p=*/1e-6, 7});
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(k1.sample(row), 2);
    EXPECT_EQ(p0.sample(row), 2);
  }
}

TEST(LlamaSampling, FrequenciesFollowSoftmaxAndFilters) {
  // p = softmax([0, log 3]) = [0.25, 0.75]; 20000 draws: σ ≈ 0.003, tolerance 0.015.
  Sampler s({1.0, 0, 1.0, 42});
  const Tensor two = logit_row({0.0f, std::log(3.0f)});
  int ones = 0;
  for (int i = 0; i < 20000; ++i) ones += s.sample(two);
  EXPECT_NEAR(ones / 20000.0, 0.75, 0.015);

  // Temperature 2 flattens: p ∝ [1, √3] -> 0.634 for token 1.
  Sampler hot({2.0, 0, 1.0, 43});
  ones = 0;
  for (int i = 0; i < 20000; ++i) ones += hot.sample(two);
  EXPECT_NEAR(ones / 20000.0, std::sqrt(3.0) / (1 + std::sqrt(3.0)), 0.015);

  // top_k = 2 and top_p = 0.6 (p = [.1, .2, .3, .4] -> keeps {3, 2}) never leave their sets.
  const Tensor four = logit_row({std::log(.1f), std::log(.2f), std::log(.3f), std::log(.4f)});
  Sampler k2({1.0, 2, 1.0, 44}), p6({1.0, 0, 0.6, 45});
  for (int i = 0; i < 2000; ++i) {
    EXPECT_GE(k2.sample(four), 2);
    EXPECT_GE(p6.sample(four), 2);
  }
}

// min-p keeps the tokens at least min_p times as likely as the most likely one (HF's MinPLogitsWarper,
// after top-p): p = [.1, .2, .3, .4] at min_p 0.45 keeps {1, 2, 3}, drawn in proportion; min_p 1 is
// greedy but for ties.
// generation_config.json's keys as transformers' generate() takes them: greedy unless do_sample, which
// brings temperature 1 and top_k 50 where unset; repetition_penalty either way; top_k, top_p and min_p
// where the run samples; a field given is the caller's, and only the values taken are checked, naming
// the file.
TEST(LlamaSampling, WithGenerationConfigCompletesAsTransformers) {
  io::GenerationDefaults g;
  g.source = "m/generation_config.json";
  const SamplingOptions mine;
  unsigned taken = 99;
  EXPECT_TRUE(with_generation_config(mine, 0, g, &taken).same_rules(mine));
  g.temperature = 0.6, g.top_p = 0.9, g.repetition_penalty = 1.2;
  SamplingOptions o = with_generation_config(mine, 0, g, &taken);  // no do_sample: greedy, penalized
  EXPECT_EQ(o.temperature, 0);
  EXPECT_EQ(o.top_p, 1);
  EXPECT_EQ(o.repetition_penalty, 1.2);
  EXPECT_EQ(taken, kSampleTemperature | kSampleRepetitionPenalty);
  SamplingOptions hot;
  hot.temperature = 0.8;
  o = with_generation_config(hot, kSampleTemperature, g, &taken);  // told to sample: the file's top_p
  EXPECT_EQ(o.temperature, 0.8);
  EXPECT_EQ(o.top_k, 0);
  EXPECT_EQ(o.top_p, 0.9);
  EXPECT_EQ(taken, kSampleTopK | kSampleTopP | kSampleMinP | kSampleRepetitionPenalty);
  g.do_sample = true;
  o = with_generation_config(mine, 0, g);
  EXPECT_EQ(o.temperature, 0.6);
  EXPECT_EQ(o.top_k, 50);
  EXPECT_EQ(o.top_p, 0.9);
  EXPECT_EQ(o.min_p, 0);
  g.temperature.reset(), g.top_k = 0, g.min_p = 0.05;
  o = with_generation_config(mine, 0, g);
  EXPECT_EQ(o.temperature, 1);
  EXPECT_EQ(o.top_k, 0);
  EXPECT_EQ(o.min_p, 0.05);
  g.top_p = 0;  // refused where taken; a top_p given, or a greedy run, does not take it
  expect_error([&] { with_generation_config(mine, 0, g); }, {"m/generation_config.json: top_p must be in (0, 1], got 0"});
  EXPECT_EQ(with_generation_config(mine, kSampleTopP, g).top_p, 1);
  EXPECT_EQ(with_generation_config(mine, kSampleTemperature, g).temperature, 0);
  g.top_p.reset(), g.top_k = -3;
  expect_error([&] { with_generation_config(mine, 0, g); }, {"m/generation_config.json: top_k must be >= 0, got -3"});
  g.top_k.reset(), g.repetition_penalty = -1;
  expect_error([&] { with_generation_config(mine, 0, g); },
               {"m/generation_config.json: repetition_penalty must be finite and > 0"});
  g.repetition_penalty.reset(), g.temperature = 0;
  expect_error([&] { with_generation_config(mine, 0, g); },
               {"do_sample is true with temperature 0, which transformers refuses"});
  EXPECT_EQ(with_generation_config(hot, kSampleTemperature, g).temperature, 0.8);
  g.do_sample = false;
  EXPECT_EQ(with_generation_config(mine, 0, g).temperature, 0);
  g.errors = {{"top_p", "m/generation_config.json: key 'top_p' must be a number, got string \"x\""}};
  EXPECT_EQ(with_generation_config(mine, 0, g).top_p, 1);  // greedy: top_p not taken
  expect_error([&] { with_generation_config(hot, kSampleTemperature, g); }, {g.errors[0].second});
  EXPECT_EQ(with_generation_config(hot, kSampleTemperature | kSampleTopP, g).top_p, 1);
  // A file that could not be read stops every call that would take a value from it, none that gives them all.
  io::GenerationDefaults unreadable;
  unreadable.source = "m/generation_config.json";
  unreadable.unreadable = "m/generation_config.json: not valid JSON";
  expect_error([&] { with_generation_config(mine, 0, unreadable); }, {"m/generation_config.json: not valid JSON"});
  expect_error([&] { with_generation_config(hot, kSampleTemperature, unreadable); }, {"not valid JSON"});
  EXPECT_TRUE(with_generation_config(hot, kSampleAllFields, unreadable).same_rules(hot));
  // A key's error counts only where its value is used: a greedy file's temperature never is; do_sample
  // decides top_k only where the file gives none.
  io::GenerationDefaults greedy_file;
  greedy_file.errors = {{"temperature", "m: key 'temperature' must be a number"}};
  EXPECT_EQ(with_generation_config(mine, 0, greedy_file).temperature, 0);
  io::GenerationDefaults bad_flag;
  bad_flag.errors = {{"do_sample", "m: key 'do_sample' must be true or false"}};
  bad_flag.top_k = 40;
  EXPECT_EQ(with_generation_config(hot, kSampleTemperature, bad_flag).top_k, 40);
  expect_error([&] { with_generation_config(mine, 0, bad_flag); }, {"'do_sample' must be true or false"});
}

TEST(LlamaSampling, MinPKeepsTokensNearTheMostLikely) {
  const Tensor four = logit_row({std::log(.1f), std::log(.2f), std::log(.3f), std::log(.4f)});
  EXPECT_EQ(Sampler({1.0, 0, 1.0, 0, 0, 0.45}).candidates(four), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(Sampler({1.0, 0, 1.0, 0, 0, 0.76}).candidates(four), (std::vector<int32_t>{3}));
  EXPECT_EQ(Sampler({1.0, 0, 1.0, 0, 0, 0.6}).candidates(four), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(Sampler({2.0, 0, 1.0, 0, 0, 0.6}).candidates(four), (std::vector<int32_t>{1, 2, 3}));  // after T: √½
  EXPECT_EQ(Sampler({1.0, 0, 0.4, 0, 0, 0.1}).candidates(four), (std::vector<int32_t>{3}));  // after top-p
  Sampler half({1.0, 0, 1.0, 47, 0, 0.45});
  int count[4] = {};
  for (int i = 0; i < 9000; ++i) ++count[half.sample(four)];
  EXPECT_EQ(count[0], 0);
  for (int t = 1; t <= 3; ++t) EXPECT_NEAR(count[t] / 9000.0, (t + 1) / 9.0, 0.02) << "token " << t;
  const Tensor tied = logit_row({1.0f, 2.0f, 0.5f, 2.0f});
  EXPECT_EQ(Sampler({1.0, 0, 1.0, 0, 0, 1.0}).candidates(tied), (std::vector<int32_t>{1, 3}));
}

// The repetition penalty as HF's RepetitionPenaltyLogitsProcessor: a seen id's logit divided by the
// penalty where positive, multiplied where negative (f32), before greedy as before sampling; with 1
// nothing is kept or changed.
TEST(LlamaSampling, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOfSeenIds) {
  const Tensor row = logit_row({2.0f, -1.0f, 0.5f, 1.9f, 0.0f});
  SamplingOptions o;
  o.repetition_penalty = 2.0;
  Sampler greedy(o);
  EXPECT_EQ(greedy.sample(row), 0);
  greedy.seen(std::vector<int32_t>{0, 1, 4, 0, -1});  // each once; no negative id (kNoToken)
  EXPECT_EQ(greedy.seen_ids(), (std::vector<int32_t>{0, 1, 4}));
  Tensor copy;
  const TensorView p = greedy.penalized(row.view(), copy);
  const float* v = p.ptr<float>();
  EXPECT_EQ(std::vector<float>(v, v + 5), (std::vector<float>{1.0f, -2.0f, 0.5f, 1.9f, 0.0f}));
  EXPECT_EQ(row.ptr<float>()[0], 2.0f);  // the logits are not written
  EXPECT_EQ(greedy.sample(row), 3);
  greedy.seen(3);
  EXPECT_EQ(greedy.sample(row), 0);  // 1.0 against 0.95
  o.temperature = 1.0;
  Sampler drawn(o);
  drawn.seen(3);
  EXPECT_EQ(drawn.candidates(row), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  o.top_k = 1;
  Sampler top1(o);
  top1.seen(0);
  EXPECT_EQ(top1.candidates(row), std::vector<int32_t>{3});  // 1.9 against the halved 1.0
  Sampler off({});
  off.seen(std::vector<int32_t>{0, 1});
  EXPECT_TRUE(off.seen_ids().empty());
  for (const double bad : {0.0, -1.0, double{NAN}, double{INFINITY}, 1e-50, 1e300}) {  // f32 makes 0 and inf
    SamplingOptions b;
    b.repetition_penalty = bad;
    expect_error([&] { Sampler s(b); }, {"repetition_penalty must be finite and > 0"});
  }
}

// top_k keeps every token tied with the k-th largest logit, as HF's TopKLogitsWarper does: with
// logits {1, 2, 2, 2, 0} and top_k = 1, tokens 1, 2 and 3 are each drawn about a third of the time.
TEST(LlamaSampling, TopKKeepsTiesAtTheCut) {
  const Tensor row = logit_row({1.0f, 2.0f, 2.0f, 2.0f, 0.0f});
  Sampler k1({1.0, 1, 1.0, 46});
  int count[5] = {};
  for (int i = 0; i < 3000; ++i) ++count[k1.sample(row)];
  EXPECT_EQ(count[0] + count[4], 0);
  for (int t = 1; t <= 3; ++t) EXPECT_NEAR(count[t] / 3000.0, 1.0 / 3, 0.05) << "token " << t;
}

// NaN or +inf logits (non-finite weights, an overflow) stop generation with an error instead of
// picking token 0; -inf, a token ruled out, is fine. Bad options are refused, NaN included.
TEST(LlamaSampling, NonFiniteLogitsAndBadOptionsAreRefused) {
  Sampler greedy({}), hot({1.0, 0, 1.0, 5});
  expect_error([&] { greedy.sample(logit_row({0.1f, NAN, 0.3f})); }, {"logit 1 is nan", "not finite"});
  expect_error([&] { hot.sample(logit_row({INFINITY, 0.3f})); }, {"logit 0 is inf"});
  EXPECT_EQ(greedy.sample(logit_row({-INFINITY, 0.3f, 0.1f})), 1);
  EXPECT_EQ(hot.sample(logit_row({-INFINITY, 0.3f})), 1);
  // Every token ruled out is an error, not token 0; so is every token below vocab_limit.
  expect_error([&] { greedy.sample(logit_row({-INFINITY, -INFINITY})); }, {"all 2 logits are -inf"});
  expect_error([&] { hot.sample(logit_row({-INFINITY, -INFINITY})); }, {"all 2 logits are -inf"});
  expect_error([] { Sampler({0.0, 0, 1.0, 0, 1}).sample(logit_row({-INFINITY, 1.0f})); }, {"all 1 logits are -inf"});
  expect_error([] { Sampler({-1.0, 0, 1.0, 0}); }, {"temperature must be finite and >= 0"});
  expect_error([] { Sampler({NAN, 0, 1.0, 0}); }, {"temperature"});
  expect_error([] { Sampler({INFINITY, 0, 1.0, 0}); }, {"temperature must be finite"});
  expect_error([] { Sampler({1.0, 0, 1.0, 0, -1}); }, {"vocab_limit must be >= 0"});
  expect_error([] { Sampler({1.0, -3, 1.0, 0}); }, {"top_k must be >= 0"});
  expect_error([] { Sampler({1.0, 0, 1.5, 0}); }, {"top_p must be in (0, 1]"});
  expect_error([] { Sampler({1.0, 0, NAN, 0}); }, {"top_p"});
  expect_error([] { Sampler({1.0, 0, 1.0, 0, 0, 1.5}); }, {"min_p must be in [0, 1]"});
  expect_error([] { Sampler({1.0, 0, 1.0, 0, 0, -0.1}); }, {"min_p must be in [0, 1]"});
  expect_error([] { Sampler({1.0, 0, 1.0, 0, 0, NAN}); }, {"min_p"});
  Tensor ints(DType::i32, {3});  // whole numbers are no logits
  expect_error([&] { greedy.sample(ints); }, {"sample: logits", "f32 or f64", "i32"});
}

// A temperature so small that logit / temperature overflows samples the most likely token (the
// draw saw NaN probabilities and returned the least likely one). The greatest logit's weight must
// be exactly 1: with logit / temperature - max contracted into an FMA (aarch64, -march=x86-64-v3),
// it was exp(the product's rounding error), 0 past ~1e18, and no token was drawn.
TEST(LlamaSampling, TinyTemperatureIsGreedy) {
  const std::pair<std::vector<float>, int32_t> cases[] = {
      {{0.5f, -2.0f, 3.0f, 1.0f}, 2}, {{0.0f, 0.7f, -1.0f}, 1}, {{7.1f, 25.3f, 25.0f, -3.0f}, 1}};
  for (const auto& [logits, want] : cases) {
    const Tensor row = logit_row(logits);
    for (double t : {1e-320, 1e-300, 1e-30, 1e-20, 1e-18}) {
      Sampler s({t, 0, 1.0, 9});
      for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(row), want) << "temperature " << t;
    }
  }
}

// vocab_limit keeps draws below the tokenizer's vocabulary when the model's rows are padded.
TEST(LlamaSampling, VocabLimitExcludesPaddedIds) {
  const Tensor row = logit_row({0.0f, 0.1f, 9.0f, 9.5f});
  Sampler greedy({0.0, 0, 1.0, 0, 2}), hot({5.0, 0, 1.0, 3, 2});
  EXPECT_EQ(greedy.sample(row), 1);
  for (int i = 0; i < 200; ++i) EXPECT_LT(hot.sample(row), 2);
  EXPECT_EQ(Sampler({0.0, 0, 1.0, 0, 9}).sample(row), 3);  // a limit past V changes nothing
}

// The tokens a draw can return are exactly those of the definition, computed here by a full sort:
// top-k keeps every logit at least the k-th largest, top-p the shortest prefix in the order (logit
// descending, ties by the lower id) whose probability reaches top_p. Rows of 40 to 20000 logits,
// with runs of ties, a far outlier and top_p near 0 and 1, exercise the bucketing's every branch.
std::vector<int32_t> reference_candidates(const std::vector<float>& v, double temperature, int64_t top_k,
                                          double top_p, double min_p = 0) {
  const size_t V = v.size();
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  size_t keep = V;
  if (top_k > 0 && static_cast<size_t>(top_k) < V) {
    keep = static_cast<size_t>(top_k);
    while (keep < V && v[order[keep]] == v[order[keep - 1]]) ++keep;
  }
  std::vector<double> p(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((double(v[order[i]]) - v[order[0]]) / temperature);
  size_t n = keep;
  if (top_p < 1) {
    double mass = 0;
    n = 0;
    while (n < keep && mass < top_p * sum) mass += p[n++];
    n = std::max<size_t>(n, 1);
  }
  while (n > 1 && p[n - 1] < min_p * p[0]) --n;  // min-p, after top-p (a prefix too: p descends)
  std::vector<int32_t> ids(order.begin(), order.begin() + n);
  std::sort(ids.begin(), ids.end());
  return ids;
}

TEST(LlamaSampling, CandidatesAreThoseOfTheDefinition) {
  std::mt19937_64 rng(3);
  int checked = 0;
  for (const size_t V : {40, 257, 1000, 20000}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> v(V);
      std::normal_distribution<float> normal(0.0f, trial % 2 ? 1.0f : 4.0f);
      for (float& x : v) x = normal(rng);
      if (trial == 2 || trial == 3)  // runs of equal logits, so that ties fall on cuts
        for (float& x : v) x = std::round(x * 2) / 2;
      if (trial >= 4) v[V / 3] = -1000.0f;  // one far-low logit: the rest crowd a few buckets, taken further
      const Tensor row = logit_row(v);
      for (const double top_p : {1e-6, 0.3, 0.9, 0.999, 1.0})
        for (const int64_t top_k : {int64_t{0}, int64_t{1}, int64_t{50}})
          for (const double min_p : {0.0, 0.02, 0.3}) {
            const double temperature = 0.8;
            const Sampler s({temperature, top_k, top_p, 1, 0, min_p});
            // Weights that round alike: the reference sums in sorted order and the sampler otherwise,
            // so a cut within rounding of top_p (or min_p) may differ by a token; such rows are not asserted.
            const std::vector<int32_t> want = reference_candidates(v, temperature, top_k, top_p, min_p);
            const std::vector<int32_t> got = s.candidates(row);
            const std::vector<int32_t> wider =
                reference_candidates(v, temperature, top_k, std::min(1.0, top_p + 1e-9), min_p * (1 - 1e-9));
            const std::vector<int32_t> narrower =
                reference_candidates(v, temperature, top_k, std::max(1e-12, top_p - 1e-9), min_p * (1 + 1e-9));
            if (wider != want || narrower != want) continue;
            EXPECT_EQ(got, want) << "V " << V << ", trial " << trial << ", top_k " << top_k << ", top_p " << top_p
                                 << ", min_p " << min_p;
            ++checked;
          }
    }
  }
  EXPECT_GT(checked, 600);
  // A draw never leaves them.
  std::vector<float> v(3000);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& x : v) x = normal(rng);
  Sampler s({1.0, 0, 0.5, 9});
  const Tensor row = logit_row(v);
  const std::vector<int32_t> allowed = s.candidates(row);
  for (int i = 0; i < 300; ++i) EXPECT_TRUE(std::binary_search(allowed.begin(), allowed.end(), s.sample(row)));
}

// f64 logits whose spread no bucket width can take, within a few denormals or beyond ±1e307, are
// sorted instead.
TEST(LlamaSampling, ExtremeF64SpreadsAreSortedInstead) {
  Tensor tiny(DType::f64, {100});
  for (int i = 0; i < 100; ++i) tiny.ptr<double>()[i] = i * 5e-324;  // equal weights, ordered by id
  std::vector<int32_t> upper(50);
  std::iota(upper.begin(), upper.end(), 50);
  EXPECT_EQ(Sampler({0.8, 0, 0.5, 1}).candidates(tiny), upper);
  Tensor huge(DType::f64, {100});
  for (int i = 0; i < 100; ++i) huge.ptr<double>()[i] = (i % 2 ? 1 : -1) * 1e306 * i;  // a spread past DBL_MAX
  EXPECT_EQ(Sampler({1.0, 0, 0.5, 1}).candidates(huge), std::vector<int32_t>{99});
}

// Logits that are a strided view (a column of a matrix) are read through their strides.
TEST(LlamaSampling, StridedLogitsAreReadThroughTheirStrides) {
  Tensor m = logit_row({5, 0, 0, 0, 0, 0, 9, 0});
  TensorView column(m.ptr<float>(), DType::f32, {4});
  column.strides = {2};  // 5, 0, 0, 9
  EXPECT_EQ(Sampler({}).sample(column), 3);
  EXPECT_EQ(Sampler({1.0, 1, 1.0, 2}).sample(column), 3);
  TensorView gpu(m.ptr<float>(), DType::f32, {8}, Device::cuda);
  expect_error([&] { Sampler({}).sample(gpu); }, {"sample: logits"});
}

TEST(LlamaSampling, SameSeedSameTokens) {
  const Tensor row = logit_row({0.1f, 0.3f, 0.2f, 0.25f, 0.0f});
  Sampler a({0.8, 4, 0.95, 123}), b({0.8, 4, 0.95, 123}), c({0.8, 4, 0.95, 124});
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 64; ++i) {
    ta.push_back(a.sample(row));
    tb.push_back(b.sample(row));
    tc.push_back(c.sample(row));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

// Greedy generation with the KV cache picks, at each step, the argmax of the full forward.
TEST_F(LlamaCpuTest, GreedyGenerationFollowsFullForward) {
  LlamaCpu model = tiny(false);
  const std::vector<int32_t> prompt = {5, 9, 11};
  const Generation g = generate(model, prompt, 8, {});
  EXPECT_EQ(g.reason, StopReason::max_tokens);
  const std::vector<int32_t>& out = g.tokens;
  ASSERT_EQ(out.size(), 8u);
  std::vector<int32_t> seq = prompt;
  for (int32_t token : out) {
    const Tensor logits = model.logits(seq);
    const std::vector<float> last = to_f32(row_of(logits, int64_t(seq.size()) - 1));
    EXPECT_EQ(token, std::max_element(last.begin(), last.end()) - last.begin());
    seq.push_back(token);
  }
  // Stops right after the first of the end-of-sequence tokens, and when the context is full,
  // keeping what it made (the last token drawn needs no position of its own).
  // The callback sees every token, the stop token included, in order.
  std::vector<int32_t> seen;
  const Generation stopped = generate(model, prompt, 8, {}, {-5, out[2]}, [&](int32_t t) { seen.push_back(t); });
  EXPECT_EQ(stopped.tokens.size(), size_t(std::find(out.begin(), out.end(), out[2]) - out.begin() + 1));
  EXPECT_EQ(stopped.reason, StopReason::stop_token);
  EXPECT_EQ(seen, stopped.tokens);
  const int64_t room = model.context() - int64_t(prompt.size());
  ASSERT_GT(room, 0);
  ASSERT_LT(room, 1000);
  const Generation full = generate(model, prompt, 1000, {});
  EXPECT_EQ(full.tokens.size(), size_t(room + 1));
  EXPECT_EQ(full.reason, StopReason::context_full);
  // The token limit wins over a full context when both are reached by the same token.
  EXPECT_EQ(generate(model, prompt, room + 1, {}).reason, StopReason::max_tokens);
  // 0 new tokens still runs the prompt (`twell run -n 0` times it); a negative count is an error.
  const Generation none = generate(model, prompt, 0, {});
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(model.cached_tokens(), int64_t(prompt.size()));
  EXPECT_THROW(generate(model, prompt, -1, {}), Error);
  // An exception from the callback propagates and stops the generation.
  int calls = 0;
  EXPECT_THROW(generate(model, prompt, 8, {}, {}, [&](int32_t) { if (++calls == 3) throw Error("stop"); }), Error);
  EXPECT_EQ(calls, 3);
}

// A batch of prompts of different lengths: each row has the bits of its sequence run alone, a
// sequence that sits a step out (kNoToken) stays as it was, and bad calls change nothing.
TEST_F(LlamaCpuTest, BatchesOfAnyLengthsMatchSequencesRunAlone) {
  LlamaCpu model = tiny(false);
  LlamaCpu alone = tiny(false);
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 11}, {7}, {3, 96, 0, 41, 41, 7}};
  const int64_t V = model.config().vocab_size;
  const Tensor first = model.prefill_batch(prompts);
  ASSERT_EQ(first.shape(), (Shape{3, V}));
  EXPECT_EQ(model.cached_lengths(), (std::vector<int64_t>{3, 1, 6}));
  EXPECT_EQ(model.cached_tokens(), 6);
  const std::vector<std::vector<int32_t>> steps = {{1, 2, 3}, {kNoToken, 4, 5}, {6, kNoToken, kNoToken}};
  std::vector<Tensor> rows;
  for (const auto& step : steps) rows.push_back(model.decode_batch(step));
  EXPECT_EQ(model.cached_lengths(), (std::vector<int64_t>{5, 3, 8}));
  for (size_t b = 0; b < prompts.size(); ++b) {
    EXPECT_TRUE(test::bit_equal(Tensor::copy_of(row_of(first, b)), alone.prefill(prompts[b]))) << b;
    for (size_t i = 0; i < steps.size(); ++i) {
      const Tensor got = Tensor::copy_of(row_of(rows[i], b));
      if (steps[i][b] == kNoToken)
        EXPECT_TRUE(test::bit_equal(got, Tensor(DType::f32, {V}))) << "a row that sat out is zeros";
      else
        EXPECT_TRUE(test::bit_equal(got, alone.decode_step(steps[i][b]))) << b << " step " << i;
    }
  }
  // Refused, changing nothing: a wrong count, a bad id, a sequence past the context, no prompts.
  EXPECT_THROW(model.decode_batch({1, 2}), Error);
  EXPECT_THROW(model.decode_batch({1, int32_t(V), 2}), Error);
  EXPECT_THROW(model.decode_batch({1, -2, 2}), Error);
  EXPECT_THROW(model.prefill_batch({}), Error);
  EXPECT_THROW(model.prefill_batch({{1}, {}}), Error);
  EXPECT_THROW(model.prefill_batch({{1}, std::vector<int32_t>(size_t(model.context() + 1), 1)}), Error);
  EXPECT_EQ(model.cached_lengths(), (std::vector<int64_t>{5, 3, 8}));
  // decode_step runs one sequence, and says so of a batch; prefill makes a batch of one.
  expect_error([&] { model.decode_step(1); }, {"LlamaCpu::decode_step: the cache holds 3 sequences (prefill_batch)"});
  EXPECT_THROW(model.decode_step(kNoToken), Error);
  EXPECT_EQ(model.cached_lengths(), (std::vector<int64_t>{5, 3, 8}));
  model.reset();
  expect_error([&] { generate(model, {1, int32_t(V)}, 2, SamplingOptions{}); },
               {"generate: prompt: token ", " at index 1 "});  // named as generate's, not generate_batch's
  model.prefill({5, 9});
  EXPECT_EQ(model.cached_lengths(), (std::vector<int64_t>{2}));
  model.reset();
  EXPECT_TRUE(model.cached_lengths().empty());
  EXPECT_THROW(model.decode_batch({1}), Error);
}

// generate_batch: sequence b's tokens are generate()'s with seed + b, each stopping on its own.
TEST_F(LlamaCpuTest, BatchGenerationIsEachSequenceGeneratedAlone) {
  LlamaCpu model = tiny(false);
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 11}, {7}, {3, 96, 0, 41, 41, 7}, {2, 2}};
  for (const SamplingOptions& o : {SamplingOptions{}, SamplingOptions{0.9, 20, 0.9, 17}}) {
    std::vector<std::pair<int64_t, int32_t>> seen;
    const std::vector<Generation> gens =
        generate_batch(model, prompts, 7, o, {}, [&](int64_t b, int32_t t) {
          seen.emplace_back(b, t);
          return false;
        });
    ASSERT_EQ(gens.size(), prompts.size());
    size_t total = 0;
    for (size_t b = 0; b < prompts.size(); ++b) {
      SamplingOptions ob = o;
      ob.seed = o.seed + b;
      const Generation g = generate(model, prompts[b], 7, ob);
      EXPECT_EQ(gens[b].tokens, g.tokens) << b;
      EXPECT_EQ(gens[b].reason, StopReason::max_tokens);
      std::vector<int32_t> mine;
      for (const auto& [sb, t] : seen)
        if (sb == int64_t(b)) mine.push_back(t);
      EXPECT_EQ(mine, gens[b].tokens) << "the callback sees each sequence's tokens in order";
      total += gens[b].tokens.size();
    }
    EXPECT_EQ(seen.size(), total);
  }
  // Stops per sequence: sequence 1 at its stop token, the others run on; a full context stops the
  // longest prompt first (the last token drawn needs no position).
  const std::vector<Generation> greedy = generate_batch(model, prompts, 7, {});
  const int32_t stop = greedy[1].tokens[2];
  const std::vector<Generation> stopped = generate_batch(model, prompts, 7, {}, {stop});
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto& t = greedy[b].tokens;
    const auto at = std::find(t.begin(), t.end(), stop);
    EXPECT_EQ(stopped[b].tokens, std::vector<int32_t>(t.begin(), at == t.end() ? at : at + 1)) << b;
    EXPECT_EQ(stopped[b].reason, at == t.end() ? StopReason::max_tokens : StopReason::stop_token) << b;
  }
  const std::vector<Generation> full = generate_batch(model, prompts, 1000, {});
  for (size_t b = 0; b < prompts.size(); ++b) {
    EXPECT_EQ(full[b].reason, StopReason::context_full) << b;
    EXPECT_EQ(int64_t(full[b].tokens.size()), model.context() - int64_t(prompts[b].size()) + 1) << b;
  }
  EXPECT_LE(full[2].decode_seconds, full[1].decode_seconds) << "the longest prompt fills its context first";
  // The callback stops the sequence it asks for after that token; the others go on.
  const std::vector<Generation> asked =
      generate_batch(model, prompts, 7, {}, {}, [](int64_t b, int32_t) { return b == 0; });
  EXPECT_EQ(asked[0].tokens, std::vector<int32_t>(greedy[0].tokens.begin(), greedy[0].tokens.begin() + 1));
  EXPECT_EQ(asked[0].reason, StopReason::callback);
  EXPECT_EQ(asked[1].tokens, greedy[1].tokens);
  // Bad calls.
  EXPECT_THROW(generate_batch(model, {}, 4, {}), Error);
  EXPECT_THROW(generate_batch(model, {{1}, {}}, 4, {}), Error);
  EXPECT_THROW(generate_batch(model, prompts, -1, {}), Error);
  const std::vector<Generation> none = generate_batch(model, prompts, 0, {});
  EXPECT_TRUE(none[3].tokens.empty());
  // The cache holds the sequences ordered by prompt length (prefill_runs), the results the caller's order.
  EXPECT_EQ(model.cached_lengths(), (std::vector<int64_t>{1, 2, 3, 6}));
}

// prefill_from keeps a prefix of the cached sequence and runs the rest after it: the bits of a
// whole prefill; refused calls (no single sequence, keep past the cache, the context, bad ids)
// change nothing.
TEST_F(LlamaCpuTest, PrefillFromAPrefixHasTheBitsOfAWholePrefill) {
  LlamaCpu model = tiny(false);
  LlamaCpu whole = tiny(false);
  const std::vector<int32_t> first = {5, 9, 11, 3, 96, 0, 41};
  model.prefill(first);
  model.decode_step(8);  // the cache: first + 8, 8 positions
  for (int64_t keep : {8, 7, 4, 1, 0}) {
    std::vector<int32_t> seq(first.begin(), first.end());
    seq.push_back(8);
    seq.resize(size_t(keep));
    const std::vector<int32_t> rest = {keep == 8 ? 2 : 1, 44, 7};
    seq.insert(seq.end(), rest.begin(), rest.end());
    const Tensor got = model.prefill_from(keep, rest);
    EXPECT_TRUE(test::bit_equal(got, whole.prefill(seq))) << "keep " << keep;
    EXPECT_EQ(model.cached_lengths(), (std::vector<int64_t>{int64_t(seq.size())}));
    EXPECT_TRUE(test::bit_equal(model.decode_step(3), whole.decode_step(3))) << "keep " << keep;
    model.prefill(first);
    model.decode_step(8);
  }
  const int64_t V = model.config().vocab_size;
  expect_error([&] { model.prefill_from(9, {1}); }, {"keep 9 is outside the 8 cached positions"});
  EXPECT_THROW(model.prefill_from(-1, {1}), Error);
  EXPECT_THROW(model.prefill_from(4, {}), Error);
  EXPECT_THROW(model.prefill_from(4, {1, int32_t(V)}), Error);
  EXPECT_THROW(model.prefill_from(4, std::vector<int32_t>(size_t(model.context() - 3), 1)), Error);
  EXPECT_EQ(model.cached_lengths(), (std::vector<int64_t>{8}));
  EXPECT_TRUE(test::bit_equal(model.decode_step(3), whole.prefill({5, 9, 11, 3, 96, 0, 41, 8, 3})))
      << "the refusals changed nothing";
  model.prefill_batch({{1, 2}, {3}});
  expect_error([&] { model.prefill_from(1, {4}); }, {"the cache holds 2 sequences"});
  model.reset();
  expect_error([&] { model.prefill_from(1, {4}); }, {"the cache holds 0 sequences"});
}

// A PromptCache reuses what the cache holds from the generation before: each turn of a conversation
// draws the tokens a generation from scratch draws (the same bits on the CPU), prefilling only what
// is new; where anything else ran on the model in between, it reuses nothing and is still right.
TEST_F(LlamaCpuTest, PromptCacheReusesTheCachedPrefixAndNothingStale) {
  LlamaCpu model = tiny(false);
  LlamaCpu fresh = tiny(false);
  const SamplingOptions sampled{0.9, 20, 0.9, 17};
  PromptCache cache;
  std::vector<int32_t> conversation = {5, 9, 11};
  for (int turn = 0; turn < 3; ++turn) {
    const Generation g = generate(model, conversation, 5, sampled, {}, {}, &cache);
    EXPECT_EQ(g.tokens, generate(fresh, conversation, 5, sampled).tokens) << "turn " << turn;
    // Turn 0 had nothing cached; later ones the previous turn's prompt and its tokens but the last
    // (which no step ran), not the new message.
    EXPECT_EQ(g.reused, turn == 0 ? 0 : int64_t(conversation.size()) - 4) << "turn " << turn;
    conversation.insert(conversation.end(), g.tokens.begin(), g.tokens.end());
    EXPECT_EQ(cache.ids, std::vector<int32_t>(conversation.begin(), conversation.end() - 1));
    conversation.insert(conversation.end(), {2, 7, 1});  // the next message
  }
  // A prompt that departs from the cached ids early reuses the shared part; an identical prompt
  // runs its last token again (its logits are needed); max_new_tokens 0 caches the prompt alone.
  std::vector<int32_t> other(cache.ids.begin(), cache.ids.begin() + 4);
  other.push_back(60);
  const Generation g = generate(model, other, 3, {}, {}, {}, &cache);
  EXPECT_EQ(g.reused, 4);
  EXPECT_EQ(g.tokens, generate(fresh, other, 3, {}).tokens);
  const std::vector<int32_t> held = cache.ids;
  const Generation again = generate(model, held, 2, {}, {}, {}, &cache);
  EXPECT_EQ(again.tokens, generate(fresh, held, 2, {}).tokens);
  EXPECT_EQ(again.reused, int64_t(held.size()) - 1);
  generate(model, {5, 9, 11, 3}, 0, {}, {}, {}, &cache);
  EXPECT_EQ(cache.ids, (std::vector<int32_t>{5, 9, 11, 3}));
  // Anything else on the model between two generations, or inside one (its callback), or another
  // model in its place (moved in: the same address, another cache): nothing reused, the right tokens.
  const std::vector<int32_t> next = {5, 9, 11, 3, 8};
  const std::vector<int32_t> want = generate(fresh, next, 4, {}).tokens;
  for (const auto& other_use : std::vector<std::function<void()>>{
           [&] { model.prefill({5, 9, 11, 4}); },  // the same length, another token
           [&] { model.decode_step(1); }, [&] { model.reset(); }}) {
    generate(model, {5, 9, 11, 3}, 0, {}, {}, {}, &cache);
    other_use();
    const Generation after = generate(model, next, 4, {}, {}, {}, &cache);
    EXPECT_EQ(after.tokens, want);
    EXPECT_EQ(after.reused, 0);
  }
  const std::string other_dir = dir_ + "/other";
  write_hf(other_dir, tiny_config("relu", false), random_hf_tensors(tiny_config("relu", false), 301));
  LlamaCpu other_weights(LlamaWeights::load_dir(other_dir)), other_fresh(LlamaWeights::load_dir(other_dir));
  generate(model, {5, 9, 11, 3}, 0, {}, {}, {}, &cache);
  generate(other_weights, {5, 9, 11, 3}, 0, {});  // the same calls since loading, the same cache length
  model = std::move(other_weights);
  const Generation moved = generate(model, next, 4, {}, {}, {}, &cache);
  EXPECT_EQ(moved.reused, 0);
  EXPECT_EQ(moved.tokens, generate(other_fresh, next, 4, {}).tokens);
  model = tiny(false);
  generate(model, {5, 9, 11, 3}, 0, {}, {}, {}, &cache);
  int drawn = 0;  // at the last token, the callback fills the cache with as many other positions
  const Generation meddled = generate(model, {5, 9, 11, 3, 8, 8}, 3, {}, {}, [&](int32_t) {
    if (++drawn == 3) model.prefill(std::vector<int32_t>(8, 1));
  }, &cache);
  EXPECT_EQ(meddled.reused, 4);
  EXPECT_TRUE(cache.ids.empty()) << "the callback wrote the cache: nothing is known of it";
  // What each way of stopping leaves cached: the prompt and the tokens but the last.
  const int32_t stop = generate(fresh, next, 4, {}).tokens[1];
  for (const auto& [n, stops] : {std::pair{int64_t{4}, std::vector<int32_t>{stop}},
                                 std::pair{int64_t{1000}, std::vector<int32_t>{}}}) {  // a stop token; a full context
    const Generation ended = generate(model, next, n, {}, stops, {}, &cache);
    EXPECT_EQ(ended.reason, stops.empty() ? StopReason::context_full : StopReason::stop_token);
    std::vector<int32_t> held_now = next;
    held_now.insert(held_now.end(), ended.tokens.begin(), ended.tokens.end() - 1);
    EXPECT_EQ(cache.ids, held_now);
    std::vector<int32_t> more(held_now.begin(), held_now.end() - 1);
    more.push_back(2);
    const Generation on = generate(model, more, 1, {}, {}, {}, &cache);
    EXPECT_EQ(on.reused, int64_t(more.size()) - 1);
    EXPECT_EQ(on.tokens, generate(fresh, more, 1, {}).tokens);
  }
  // A generation that throws leaves the cache unknown: the next one starts afresh.
  generate(model, {5, 9, 11, 3}, 0, {}, {}, {}, &cache);
  EXPECT_THROW(generate(model, next, 4, {}, {}, [](int32_t) { throw Error("stop"); }, &cache), Error);
  EXPECT_TRUE(cache.ids.empty());
  // One prompt a cache.
  expect_error([&] { generate_batch(model, {{1}, {2}}, 2, {}, {}, {}, &cache); },
               {"a PromptCache serves one prompt at a time, got 2"});
}

// The runs a ragged batch prefills as: the least cost (rows plus `group` a run; or rows below 10
// costing twice), none of several prompts above max_tokens (a longer prompt runs alone, in chunks),
// checked against every split of small batches.
TEST(PrefillRuns, LeastCostOfAnySplit) {
  using V = std::vector<int64_t>;
  auto plus = [](int64_t group) { return [group](int64_t rows) { return double(rows + group); }; };
  EXPECT_EQ(prefill_runs({5, 5, 5}, 100, plus(256)), (V{0, 3}));
  V mixed(64, 100);
  mixed.back() = 2000;  // 63 prompts of 100 tokens, then one of 2000: 8300 rows, not 128000
  EXPECT_EQ(prefill_runs(mixed, 1 << 20, plus(256)), (V{0, 63, 64}));
  EXPECT_EQ(prefill_runs({4, 4, 4, 4}, 8, plus(256)), (V{0, 2, 4})) << "no run above max_tokens";
  EXPECT_EQ(prefill_runs({3, 1}, 100, plus(2)), (V{0, 2})) << "a tie: the longer run";
  EXPECT_EQ(prefill_runs({3, 1}, 100, plus(1)), (V{0, 1, 2}));
  EXPECT_EQ(prefill_runs({3, 9, 2}, 8, plus(0)), (V{0, 1, 2, 3})) << "a prompt above max_tokens runs alone (chunked)";
  EXPECT_EQ(prefill_runs({9, 9}, 8, plus(0)), (V{0, 1, 2}));
  expect_error([&] { prefill_runs({3, 0}, 8, plus(0)); }, {"prompt 1 holds 0 tokens"});
  expect_error([&] { prefill_runs({}, 8, plus(0)); }, {"no prompts"});
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t B = 1 + static_cast<int64_t>(rng() % 8), max_tokens = 20 + static_cast<int64_t>(rng() % 60),
                  group = static_cast<int64_t>(rng() % 30);
    const bool small_dear = trial % 2 == 1;  // as a sparse model's runs below sparse_min_tokens
    auto run_cost = [&](int64_t rows) { return double(rows) * (small_dear && rows < 10 ? 2.0 : 1.0) + double(group); };
    V lens;
    for (int64_t b = 0; b < B; ++b)  // one in ten longer than max_tokens can be
      lens.push_back(1 + static_cast<int64_t>(rng() % 10 == 0 ? rng() % 100 : rng() % 20));
    auto cost_of = [&](const V& bounds) {  // -1: a run of several prompts above max_tokens
      double cost = 0;
      for (size_t r = 0; r + 1 < bounds.size(); ++r) {
        const int64_t n = bounds[r + 1] - bounds[r];
        const int64_t rows = n * *std::max_element(lens.begin() + bounds[r], lens.begin() + bounds[r + 1]);
        if (rows > max_tokens && n > 1) return -1.0;
        cost += run_cost(rows);
      }
      return cost;
    };
    double best = -1;
    for (uint32_t cuts = 0; cuts < (1u << (B - 1)); ++cuts) {  // bit i: a run ends after prompt i
      V bounds{0};
      for (int64_t i = 0; i + 1 < B; ++i)
        if (cuts >> i & 1) bounds.push_back(i + 1);
      bounds.push_back(B);
      const double c = cost_of(bounds);
      if (c >= 0 && (best < 0 || c < best)) best = c;
    }
    const V got = prefill_runs(lens, max_tokens, run_cost);
    ASSERT_GE(got.size(), 2u);
    EXPECT_EQ(got.front(), 0);
    EXPECT_EQ(got.back(), B);
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end()) && std::adjacent_find(got.begin(), got.end()) == got.end());
    EXPECT_EQ(cost_of(got), best) << "trial " << trial;
  }
}

// The chunks of a prompt longer than max_tokens: the fewest, as even as can be (the first ones one
// longer), none above max_tokens nor below half of it, summing to the prompt.
TEST(PrefillChunks, FewestEvenChunks) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(prefill_chunks(100, 100), (V{100}));
  EXPECT_EQ(prefill_chunks(20000, 16384), (V{10000, 10000}));
  EXPECT_EQ(prefill_chunks(16385, 16384), (V{8193, 8192}));  // both on the sparse FFN's path
  EXPECT_EQ(prefill_chunks(32768, 16384), (V{16384, 16384}));
  EXPECT_EQ(prefill_chunks(10, 4), (V{4, 3, 3}));
  EXPECT_EQ(prefill_chunks(300, 1), V(300, 1));
  expect_error([] { prefill_chunks(0, 8); }, {"at least one token"});
  expect_error([] { prefill_chunks(8, 0); }, {"max_tokens must be at least 1"});
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t max_tokens = 1 + static_cast<int64_t>(rng() % 5000), tokens = 1 + static_cast<int64_t>(rng() % 40000);
    const V c = prefill_chunks(tokens, max_tokens);
    const int64_t fewest = (tokens + max_tokens - 1) / max_tokens;
    ASSERT_EQ(static_cast<int64_t>(c.size()), fewest) << tokens << " at " << max_tokens;
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), int64_t{0}), tokens);
    for (size_t i = 0; i < c.size(); ++i) {
      EXPECT_LE(c[i], max_tokens);
      EXPECT_TRUE(c[i] == c[0] || c[i] == c[0] - 1) << i;
      if (i > 0) {
        EXPECT_LE(c[i], c[i - 1]);
      }
      if (c.size() > 1) {
        EXPECT_GE(2 * c[i], max_tokens) << tokens << " at " << max_tokens;
      }
    }
  }
}

// The tokens a forward load_model sizes the GPU's activations for where the default does not fit:
// the preferred count where it fits, else the largest that fits, rounded down to a multiple of 256
// where that keeps it at least `least`; 0 where not even `least` fits.
TEST(FitMaxTokens, TheLargestCountThatFits) {
  auto below = [](int64_t limit) { return [limit](int64_t t) { return t <= limit; }; };
  EXPECT_EQ(model::fit_max_tokens(1, 16384, below(20000)), 16384);
  EXPECT_EQ(model::fit_max_tokens(1, 16384, below(16384)), 16384);
  EXPECT_EQ(model::fit_max_tokens(1, 16384, below(16383)), 16128);
  EXPECT_EQ(model::fit_max_tokens(1, 16384, below(5000)), 4864);
  EXPECT_EQ(model::fit_max_tokens(1, 16384, below(255)), 255);   // no multiple of 256 fits
  EXPECT_EQ(model::fit_max_tokens(300, 16384, below(500)), 500);  // 256 is below `least`
  EXPECT_EQ(model::fit_max_tokens(300, 16384, below(299)), 0);
  EXPECT_EQ(model::fit_max_tokens(7, 7, below(7)), 7);
  EXPECT_EQ(model::fit_max_tokens(7, 7, below(6)), 0);
  int calls = 0;
  EXPECT_EQ(model::fit_max_tokens(1, 131072, [&](int64_t t) { return ++calls, t <= 70000; }), 69888);
  EXPECT_LE(calls, 20);
  expect_error([] { model::fit_max_tokens(0, 8, [](int64_t) { return true; }); }, {"1 <= least <= preferred"});
  expect_error([] { model::fit_max_tokens(9, 8, [](int64_t) { return true; }); }, {"1 <= least <= preferred"});
}

// The windows of `twell eval`: at stride = window, windows that do not overlap, each one's first
// token unscored; less, every token from the second on scored exactly once, with at least
// window − stride tokens before it in its window (but in the first); none longer than the window or
// shorter than 2.
// nll_from_logits takes its rows on the threads: the same bits at 1 and 4 threads, and a token
// outside the vocabulary refused before any row runs.
TEST(NllFromLogits, TheSameBitsForAnyThreadCount) {
  const int64_t T = 300, V = 4096;
  Tensor logits(DType::f32, {T, V});
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0, 3);
  for (int64_t i = 0; i < T * V; ++i) logits.ptr<float>()[i] = normal(rng);
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
  const int before = cpu::set_num_threads(1);
  const std::vector<double> one = nll_from_logits(logits, tokens);
  cpu::set_num_threads(4);
  const std::vector<double> four = nll_from_logits(logits, tokens);
  tokens.back() = static_cast<int32_t>(V);
  expect_error([&] { nll_from_logits(logits, tokens); }, {"token 4096 outside [0, 4096)"});
  cpu::set_num_threads(before);
  ASSERT_EQ(one.size(), static_cast<size_t>(T - 1));
  EXPECT_EQ(one, four);
}

TEST(EvalWindows, EachTokenScoredOnceWithItsContext) {
  using W = std::vector<std::pair<int64_t, int64_t>>;
  auto spans = [](const std::vector<EvalWindow>& v) {
    W out;
    for (const EvalWindow& w : v) out.push_back({w.begin, w.from}), out.push_back({w.end, -1});
    return out;
  };
  EXPECT_EQ(spans(eval_windows(100, 32, 32)), (W{{0, 1}, {32, -1}, {32, 33}, {64, -1}, {64, 65}, {96, -1}, {96, 97}, {100, -1}}));
  EXPECT_EQ(eval_windows(65, 32, 32).size(), 2u);  // the last token alone: nothing to predict it from
  EXPECT_EQ(spans(eval_windows(12, 8, 4)), (W{{0, 1}, {8, -1}, {4, 8}, {12, -1}}));
  expect_error([] { eval_windows(10, 8, 9); }, {"stride must lie in [1, window = 8]"});
  expect_error([] { eval_windows(10, 8, 0); }, {"stride must lie in [1, window = 8]"});
  expect_error([] { eval_windows(10, 1, 1); }, {"at least 2 tokens"});
  std::mt19937 rng(5);
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t n = 2 + static_cast<int64_t>(rng() % 300), window = 2 + static_cast<int64_t>(rng() % 40),
                  stride = 1 + static_cast<int64_t>(rng() % window);
    const std::vector<EvalWindow> v = eval_windows(n, window, stride);
    std::vector<int> scored(static_cast<size_t>(n), 0);
    for (size_t i = 0; i < v.size(); ++i) {
      const EvalWindow& w = v[i];
      ASSERT_TRUE(w.end - w.begin >= 2 && w.end - w.begin <= window && w.end <= n) << trial;
      EXPECT_EQ(w.begin, static_cast<int64_t>(i) * stride);
      ASSERT_TRUE(w.from > w.begin && w.from < w.end) << trial;
      if (i > 0) {
        EXPECT_GE(w.from - w.begin, window - stride) << trial;
      }
      for (int64_t q = w.from; q < w.end; ++q) ++scored[static_cast<size_t>(q)];
    }
    EXPECT_EQ(scored[0], 0);
    for (int64_t q = 1; q < n; ++q) {
      const bool skipped = stride == window && q % window == 0;  // a window's first token
      EXPECT_EQ(scored[static_cast<size_t>(q)], skipped ? 0 : 1) << "token " << q << " of " << n << ", window " << window
                                                                 << ", stride " << stride;
    }
  }
}

TEST_F(LlamaCpuTest, PerplexityIsExpOfMeanNll) {
  const io::ModelConfig c = tiny_config("relu", true);
  const HfTensors hf = random_hf_tensors(c, 600);
  write_hf(dir_, c, hf);
  const LlamaCpu model(LlamaWeights::load_dir(dir_), {DType::f64});
  const Mat ref = naive_logits(c, hf, kTokens);
  double nll = 0;
  for (size_t t = 0; t + 1 < kTokens.size(); ++t) {
    double sum = 0;
    for (int64_t v = 0; v < c.vocab_size; ++v) sum += std::exp(ref[t * c.vocab_size + v]);
    nll -= ref[t * c.vocab_size + kTokens[t + 1]] - std::log(sum);
  }
  nll /= double(kTokens.size() - 1);
  const Perplexity p = perplexity(model, kTokens);
  EXPECT_EQ(p.predictions, int64_t(kTokens.size()) - 1);
  EXPECT_NEAR(p.mean_nll, nll, 1e-10);
  EXPECT_NEAR(p.perplexity, std::exp(nll), 1e-8 * std::exp(nll));
}

// next_token_nll_batch's default runs next_token_nll of each sequence (the same bits), sums their
// statistics and checks every sequence before any runs; windowed_perplexity gives the same figures
// however many windows go to one call.
TEST_F(LlamaCpuTest, NextTokenNllBatchIsEachSequencesAndWindowsPerCallChangeNothing) {
  const LlamaCpu model = tiny();
  const std::vector<std::vector<int32_t>> seqs = {{1, 5, 9, 2}, {7, 7, 3, 4}, {2, 8}};
  std::vector<ActivationStats> stats;
  const std::vector<std::vector<double>> got = model.next_token_nll_batch(seqs, &stats);
  ASSERT_EQ(got.size(), seqs.size());
  std::vector<ActivationStats> want, one;
  for (size_t b = 0; b < seqs.size(); ++b) {
    EXPECT_EQ(got[b], model.next_token_nll(seqs[b], &one)) << "sequence " << b;
    add_layer_stats(want, one);
  }
  ASSERT_EQ(stats.size(), want.size());
  for (size_t l = 0; l < want.size(); ++l) {
    EXPECT_EQ(stats[l].tokens, 10);
    EXPECT_EQ(stats[l].nnz, want[l].nnz);
    EXPECT_EQ(stats[l].max_nnz_per_token, want[l].max_nnz_per_token);
    EXPECT_DOUBLE_EQ(stats[l].l1_sum, want[l].l1_sum);
  }
  EXPECT_TRUE(model.next_token_nll_batch({}).empty());
  std::vector<ActivationStats> untouched(1);
  untouched[0].tokens = 7;
  expect_error([&] { model.next_token_nll_batch({{1, 2}, std::vector<int32_t>(model.context() + 1, 1)}, &untouched); },
               {"perplexity: sequence 1 of ", "exceeds the model's context"});
  EXPECT_EQ(untouched[0].tokens, 7) << "a refused call ran the sequences before the bad one";
  expect_error([&] { model.next_token_nll_batch({{1, 2}, {3}}); }, {"sequence 1 needs at least 2 tokens"});
  const int32_t V = static_cast<int32_t>(model.config().vocab_size);
  expect_error([&] { model.next_token_nll_batch({{1, 2}, {3, V}}); }, {"perplexity: sequence 1: token ", " at index 1"});
  LlamaCpu generating = tiny();
  expect_error([&] { generate_batch(generating, {{1}, {V}}, 2, SamplingOptions{}); },
               {"generate_batch: prompt 1: token "});
  expect_error([&] { generate_batch(generating, {{1}, {}}, 2, SamplingOptions{}); },
               {"generate_batch: prompt 1 needs at least 1 token, got 0"});

  std::vector<int32_t> text;
  for (int i = 0; i < 61; ++i) text.push_back((i * 7 + 3) % static_cast<int>(model.config().vocab_size));
  std::vector<int64_t> done;
  std::vector<ActivationStats> s1, s4;
  const Perplexity one_a_call = windowed_perplexity(model, text, 8, 8, 0, &s1);
  const Perplexity four = windowed_perplexity(
      model, text, 8, 8, 0, &s4, [&](int64_t d, int64_t, const Perplexity&) { done.push_back(d); }, "the text", 4);
  EXPECT_EQ(four.mean_nll, one_a_call.mean_nll);
  EXPECT_EQ(four.predictions, one_a_call.predictions);
  EXPECT_EQ(done, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));  // every window reported, in order
  ASSERT_EQ(s4.size(), s1.size());
  EXPECT_EQ(s4[0].tokens, 61);
  EXPECT_EQ(s4[0].nnz, s1[0].nnz);
  // 57 tokens: 7 windows of 8 and the last token alone, which predicts nothing but is counted as
  // ffn_stats_in_windows counts it (not where max_windows stops before it)
  const std::vector<int32_t> text57(text.begin(), text.begin() + 57);
  std::vector<ActivationStats> s57;
  EXPECT_EQ(windowed_perplexity(model, text57, 8, 8, 0, &s57, {}, "the text", 4).predictions, 49);
  EXPECT_EQ(s57[0].tokens, 57);
  EXPECT_EQ(s57[0].nnz, ffn_stats_in_windows(model, text57, 8)[0].nnz);
  windowed_perplexity(model, text57, 8, 8, 7, &s57);  // all 7 windows: the text's end reached
  EXPECT_EQ(s57[0].tokens, 57);
  windowed_perplexity(model, text57, 8, 8, 3, &s57);
  EXPECT_EQ(s57[0].tokens, 24);
  const Perplexity sliding = windowed_perplexity(model, text, 8, 3, 0, nullptr, {}, "the text", 3);
  EXPECT_EQ(sliding.mean_nll, windowed_perplexity(model, text, 8, 3).mean_nll);
  expect_error([&] { windowed_perplexity(model, text, 8, 8, 0, nullptr, {}, "the text", -1); },
               {"windows_per_call must be at least 0"});
  // The statistics alone, 3 windows a call (57 = 7 × 8 + 1: two calls of 3, one of 1, the lone
  // token's forward): the counts of one window a call.
  EXPECT_EQ(model.sequences_a_forward(), 1);
  const std::vector<ActivationStats> by3 = ffn_stats_in_windows(model, text57, 8, 3), by1 = ffn_stats_in_windows(model, text57, 8, 1);
  ASSERT_EQ(by3.size(), by1.size());
  for (size_t l = 0; l < by1.size(); ++l) {
    EXPECT_EQ(by3[l].tokens, 57);
    EXPECT_EQ(by3[l].nnz, by1[l].nnz);
    EXPECT_EQ(by3[l].max_nnz_per_token, by1[l].max_nnz_per_token);
  }
  EXPECT_EQ(ffn_stats_in_windows(model, text57, 1, 4)[0].tokens, 57);  // each token alone, at position 0
  const std::vector<int32_t> text20(text.begin(), text.begin() + 20);
  const std::vector<ActivationStats> whole = ffn_stats_in_windows(model, text20, INT64_MAX);  // one window
  ASSERT_EQ(whole.size(), by1.size());
  EXPECT_EQ(whole[0].tokens, 20);
  EXPECT_EQ(whole[0].nnz, ffn_stats_in_windows(model, text20, 20)[0].nnz);
  expect_error([&] { ffn_stats_in_windows(model, text57, 8, -1); }, {"windows_per_call must be at least 0"});
}

TEST_F(LlamaCpuTest, PerplexityFromLogitsMatchesTheModelAndChecksShapes) {
  const LlamaCpu model = tiny();
  const io::ModelConfig& c = model.config();
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 7, 7, 3};
  const Perplexity a = perplexity(model, tokens);
  const Perplexity b = perplexity_from_logits(model.logits(tokens), tokens);
  EXPECT_EQ(a.predictions, 6);
  EXPECT_DOUBLE_EQ(a.mean_nll, b.mean_nll);
  const Tensor logits = model.logits(tokens);
  EXPECT_THROW(perplexity_from_logits(logits, {1, 5, 9}), Error);  // rows != tokens
  std::vector<int32_t> bad = tokens;
  bad.back() = static_cast<int32_t>(c.vocab_size);
  EXPECT_THROW(perplexity_from_logits(logits, bad), Error);  // next token outside the vocabulary
  // A mean NLL past ~709.8 nats is finite, its exp not: the NLL is returned exact, the perplexity as +inf
  // (torch.exp's answer); `twell eval` prints both and says so.
  Tensor wild = Tensor::of<float>({2, 2});
  wild.ptr<float>()[0] = 1000.f;  // row 0 predicts token 1 with logit 0 against 1000: NLL 1000 nats
  const Perplexity w = perplexity_from_logits(wild, {0, 1});
  EXPECT_EQ(w.predictions, 1);
  EXPECT_NEAR(w.mean_nll, 1000.0, 1e-9);
  EXPECT_TRUE(std::isinf(w.perplexity) && w.perplexity > 0);
}

// ---- parity with HuggingFace transformers ----------------------------------------------------
std::string fixture_dir(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path() / "data" / "llama" / name).string();
}

class LlamaHfParity : public testing::TestWithParam<const char*> {};

// Tolerances (relative, ‖Δ‖/‖ref‖): f32 against HF's fp32 logits 1e-5, as the issue asks; they
// differ only in summation order and our double-accumulated ReLU FFN (measured ~5e-7).
// f64 against HF's float64 model 1e-6: HF computes the RoPE angles in fp32 even for a float64
// model (LlamaRotaryEmbedding casts inv_freq and positions to float), ours in double, so the two
// differ by fp32 rounding of cos/sin (measured ~2.3e-7); a wrong formula would be O(1).
TEST_P(LlamaHfParity, LogitsMatchTransformers) {
  const std::string dir = fixture_dir(GetParam());
  ASSERT_TRUE(std::filesystem::exists(dir + "/config.json"))
      << dir << " missing: run tests/model/make_hf_fixture.py";
  const io::SafetensorsFile ref = io::SafetensorsFile::open(dir + "/logits.safetensors");
  const TensorView tok = ref.view("tokens");
  const std::vector<int32_t> tokens(tok.ptr<int32_t>(), tok.ptr<int32_t>() + tok.numel());

  const LlamaCpu f32(LlamaWeights::load_dir(dir, {DType::f32, /*check_finite=*/true}));
  const Tensor out32 = f32.logits(tokens);
  ASSERT_EQ(out32.shape(), ref.info("logits").shape);
  const double err32 = relative_error(out32, ref.view("logits"));
  EXPECT_LE(err32, 1e-5);

  const LlamaCpu f64(LlamaWeights::load_dir(dir), {DType::f64});
  const double err64 = relative_error(f64.logits(tokens), ref.view("logits_f64"));
  EXPECT_LE(err64, 1e-6);
  std::printf("[ parity   ] %s: f32 rel err %.3g, f64 rel err %.3g\n", GetParam(), err32, err64);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaHfParity, testing::Values("relu_tied", "silu_untied", "llama3_rope"));

}  // namespace
}  // namespace twell::model
