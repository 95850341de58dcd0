// twell::cuda::DeviceSampler against model::Sampler on the host: the same token from the same
// logits and seed, over vocabulary sizes from 1 to 50257, every sampling mode, ties, -inf entries
// and extreme ranges; the host's errors for rows it cannot draw from; and LlamaCuda's generation,
// which draws on the GPU, against the same model drawing on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "gpu_test.h"
#include "model/llama_test_util.h"
#include "twell/cuda/llama.h"
#include "twell/cuda/sampler.h"
#include "twell/model/llama.h"

namespace twell::cuda {
namespace {

using model::Sampler;
using model::SamplingOptions;

SamplingOptions options(double t, int64_t k = 0, double p = 1, uint64_t seed = 7, int64_t limit = 0,
                        double min_p = 0) {
  SamplingOptions o;
  o.temperature = t, o.top_k = k, o.top_p = p, o.seed = seed, o.vocab_limit = limit, o.min_p = min_p;
  return o;
}

std::string str_of(const SamplingOptions& o) {
  return str("T=", o.temperature, " top_k=", o.top_k, " top_p=", o.top_p, " seed=", o.seed, " limit=", o.vocab_limit,
             " min_p=", o.min_p);
}

// Rows of logits of several kinds, [rows, V] f32.
enum class Kind { normal, ties, with_minus_inf, equal, extreme, peaked };
Tensor make_logits(Kind kind, int64_t rows, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_int_distribution<int> small(0, 3);
  Tensor t(DType::f32, {rows, V});
  float* x = t.ptr<float>();
  for (int64_t i = 0; i < rows * V; ++i) {
    switch (kind) {
      case Kind::normal: x[i] = normal(rng); break;
      case Kind::ties: x[i] = static_cast<float>(small(rng)); break;  // many equal logits at every cut
      case Kind::with_minus_inf: x[i] = (i % V) % 3 == 1 ? -HUGE_VALF : normal(rng); break;  // never a whole row
      case Kind::equal: x[i] = 1.5f; break;
      case Kind::extreme: {
        const float picks[] = {3e38f, -3e38f, 1e-40f, -1e-40f, 0.f, -0.f, 1.f, 3e38f};
        x[i] = picks[rng() % 8];
        break;
      }
      case Kind::peaked: x[i] = normal(rng) + ((i % V) == 3 ? 40.f : 0.f); break;
    }
  }
  return t;
}

DeviceBuffer upload_f32(const Tensor& t) {
  DeviceBuffer d(t.nbytes());
  TWELL_CUDA_CHECK(cudaMemcpy(d.get(), t.view().data, t.nbytes(), cudaMemcpyHostToDevice));
  return d;
}

TensorView device_view(const DeviceBuffer& d, Shape s) { return TensorView(d.get(), DType::f32, std::move(s), Device::cuda); }

// The host's tokens for each row in turn, and its candidates.
std::vector<int32_t> host_tokens(const Tensor& t, const SamplingOptions& o) {
  Sampler s(o);
  const int64_t rows = t.shape()[0], V = t.shape()[1];
  std::vector<int32_t> out;
  for (int64_t r = 0; r < rows; ++r) out.push_back(s.sample(TensorView(t.ptr<float>() + r * V, DType::f32, {V})));
  return out;
}

TEST(DeviceSampler, DrawsTheHostsTokens) {
  TWELL_REQUIRE_HOPPER();
  const int64_t vocabs[] = {1, 2, 97, 1000, 49152, 50257};
  const Kind kinds[] = {Kind::normal, Kind::ties, Kind::with_minus_inf, Kind::equal, Kind::extreme, Kind::peaked};
  const SamplingOptions modes[] = {
      options(0),           options(0.8),           options(1.3, 1),        options(1, 5),
      options(0.7, 50),     options(1, 0, 0.5),     options(0.8, 0, 0.95),  options(1, 0, 0.999),
      options(1, 40, 0.9),  options(2, 3, 0.3),     options(1e-300),        options(1, 0, 1e-9),
      options(0.9, 0, 0.9, 11, 40), options(1, 0, 1, 12, 0, 0.05), options(0.8, 30, 0.95, 13, 0, 0.3),
      options(1.5, 0, 1, 14, 0, 1.0),
  };
  DeviceSampler gpu;
  int64_t draws = 0;
  for (int64_t V : vocabs)
    for (Kind kind : kinds) {
      const int64_t rows = V >= 49152 ? 3 : 16;
      const Tensor logits = make_logits(kind, rows, V, static_cast<uint32_t>(V * 10 + static_cast<int>(kind)));
      const DeviceBuffer d = upload_f32(logits);
      for (const SamplingOptions& o : modes) {
        const std::string where = str("V=", V, " kind=", static_cast<int>(kind), " ", str_of(o));
        const std::vector<int32_t> want = host_tokens(logits, o);
        Sampler s(o);
        std::vector<int32_t> got;
        try {
          got = gpu.sample(device_view(d, {rows, V}), s, nullptr);
        } catch (const Error& e) {
          FAIL() << where << ": " << e.what();
        }
        ASSERT_EQ(got, want) << where;
        draws += rows;
      }
    }
  std::printf("%lld rows drawn, every one the host's token\n", static_cast<long long>(draws));
}

// The repetition penalty on the GPU: each row's sampler's seen ids penalized in a copy (the logits
// unchanged), the host's tokens drawn, greedy and sampled.
TEST(DeviceSampler, RepetitionPenaltyDrawsTheHostsTokens) {
  TWELL_REQUIRE_HOPPER();
  DeviceSampler gpu;
  for (const int64_t V : {97, 49152}) {
    const int64_t rows = 5;
    const Tensor logits = make_logits(Kind::peaked, rows, V, 77);
    const DeviceBuffer d = upload_f32(logits);
    for (SamplingOptions o : {options(0), options(1.0, 0, 0.9, 31), options(0.7, 20, 1, 32)})
      for (const double penalty : {1.3, 0.7, 50.0, 2.0}) {
        o.repetition_penalty = penalty;
        std::vector<Sampler> host(static_cast<size_t>(rows), Sampler(o)), dev = host;
        std::vector<Sampler*> by_row;
        std::vector<int32_t> want;
        for (int64_t r = 0; r < rows; ++r) {
          // Row r has seen ids 3 (the peak), r, and a few more, some past V's end for the small rows; the
          // last row none, and at penalty 2 no row any (the penalty then changes nothing).
          std::vector<int32_t> seen = {3, static_cast<int32_t>(r), static_cast<int32_t>((r * 31) % V), 96, 5000};
          if (r == rows - 1 || penalty == 2.0) seen.clear();
          host[r].seen(seen), dev[r].seen(seen);
          want.push_back(host[r].sample(TensorView(logits.ptr<float>() + r * V, DType::f32, {V})));
          by_row.push_back(&dev[r]);
        }
        const std::vector<int32_t> got = gpu.sample(device_view(d, {rows, V}), by_row, nullptr);
        EXPECT_EQ(got, want) << "V=" << V << " " << str_of(o) << " penalty " << penalty;
        if (o.temperature == 0 && penalty == 50.0)  // the rows that saw it (not the last)
          for (int64_t r = 0; r + 1 < rows; ++r) EXPECT_NE(got[r], 3) << "the peak, seen, divided by 50";
      }
    Tensor back(DType::f32, {rows, V});  // the logits were not written
    TWELL_CUDA_CHECK(cudaMemcpy(back.ptr<float>(), d.get(), back.nbytes(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(back.ptr<float>(), logits.ptr<float>(), back.nbytes()), 0);
  }
}

// Past kSampleInlineRows rows the random numbers reach the kernel through memory instead of its
// arguments; a bad row among good ones gives the error the host gives for it.
TEST(DeviceSampler, ManyRowsTakeTheirNumbersInRowOrder) {
  TWELL_REQUIRE_HOPPER();
  DeviceSampler gpu;
  for (int64_t rows : {15, 16, 17, 40, 300}) {
    const Tensor logits = make_logits(Kind::normal, rows, 1000, static_cast<uint32_t>(rows));
    const DeviceBuffer d = upload_f32(logits);
    for (const SamplingOptions& o : {options(0.9, 0, 0.9, 21), options(1.1, 30, 1, 22), options(0)}) {
      Sampler s(o);
      EXPECT_EQ(gpu.sample(device_view(d, {rows, 1000}), s, nullptr), host_tokens(logits, o)) << rows << " rows, "
                                                                                               << str_of(o);
    }
  }
  Tensor mixed = make_logits(Kind::normal, 20, 100, 9);
  mixed.ptr<float>()[7 * 100 + 42] = NAN;
  mixed.ptr<float>()[12 * 100 + 3] = HUGE_VALF;
  const DeviceBuffer d = upload_f32(mixed);
  std::string host_error, gpu_error;
  try {
    host_tokens(mixed, options(0.8));
  } catch (const Error& e) {
    host_error = e.what();
  }
  try {
    Sampler s(options(0.8));
    gpu.sample(device_view(d, {20, 100}), s, nullptr);
  } catch (const Error& e) {
    gpu_error = e.what();
  }
  EXPECT_NE(host_error.find("logit 42 is nan"), std::string::npos) << host_error;
  EXPECT_EQ(gpu_error, host_error);
}

// Row after row from one sampler takes the random numbers in the order the host's would.
TEST(DeviceSampler, OneSamplerOverManyCallsFollowsTheHost) {
  TWELL_REQUIRE_HOPPER();
  const Tensor logits = make_logits(Kind::normal, 1, 4096, 3);
  const DeviceBuffer d = upload_f32(logits);
  Sampler host(options(1.0, 0, 0.9, 123)), device(options(1.0, 0, 0.9, 123));
  DeviceSampler gpu;
  std::vector<int32_t> a, b;
  for (int i = 0; i < 200; ++i) {
    a.push_back(host.sample(logits.view()));
    b.push_back(gpu.sample(device_view(d, {4096}), device, nullptr)[0]);
  }
  EXPECT_EQ(a, b);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 5u) << "the draws should vary";
}

TEST(DeviceSampler, RowsItCannotDrawFromGiveTheHostsErrors) {
  TWELL_REQUIRE_HOPPER();
  DeviceSampler gpu;
  const auto message = [&](const Tensor& t, const SamplingOptions& o, bool on_gpu) {
    Sampler s(o);
    try {
      if (on_gpu) {
        const DeviceBuffer d = upload_f32(t);
        gpu.sample(device_view(d, t.shape()), s, nullptr);
      } else {
        s.sample(t.view());
      }
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Tensor nan = make_logits(Kind::normal, 1, 1000, 1);
  nan.ptr<float>()[700] = NAN;
  nan.ptr<float>()[5] = HUGE_VALF;
  Tensor none(DType::f32, {1, 300});
  for (int64_t i = 0; i < 300; ++i) none.ptr<float>()[i] = -HUGE_VALF;
  for (const SamplingOptions& o : {options(0), options(0.8, 10, 0.9)}) {
    const std::string want_bad = message(nan, o, false), want_none = message(none, o, false);
    EXPECT_NE(want_bad.find("logit 5 is inf"), std::string::npos) << want_bad;
    EXPECT_NE(want_none.find("all 300 logits are -inf"), std::string::npos) << want_none;
    EXPECT_EQ(message(nan, o, true), want_bad);
    EXPECT_EQ(message(none, o, true), want_none);
  }
  // Past vocab_limit nothing is read: a NaN there is no error.
  Tensor tail = make_logits(Kind::normal, 1, 100, 2);
  tail.ptr<float>()[90] = NAN;
  EXPECT_EQ(message(tail, options(0.8, 0, 1, 1, 90), true), "no error");
  // Wrong dtype, device or rank.
  Sampler s(options(0));
  EXPECT_THROW(gpu.sample(tail.view(), s, nullptr), Error);  // host memory
  const DeviceBuffer d = upload_f32(tail);
  EXPECT_THROW(gpu.sample(TensorView(d.get(), DType::bf16, {100}, Device::cuda), s, nullptr), Error);
  EXPECT_THROW(gpu.sample(TensorView(d.get(), DType::f32, {1, 1, 100}, Device::cuda), s, nullptr), Error);
}

// LlamaCuda's generation draws on the GPU; the same model seen only through prefill and
// decode_step (the LanguageModel defaults) draws on the host. Both give the same tokens.
class HostDrawn final : public model::LanguageModel {
 public:
  explicit HostDrawn(LlamaCuda& m) : m_(m) {}
  const io::ModelConfig& config() const override { return m_.config(); }
  Tensor logits(const std::vector<int32_t>& t, std::vector<ActivationStats>* s) const override { return m_.logits(t, s); }
  Tensor prefill(const std::vector<int32_t>& t) override { return m_.prefill(t); }
  Tensor decode_step(int32_t t) override { return m_.decode_step(t); }
  int64_t cached_tokens() const override { return m_.cached_tokens(); }
  int64_t context() const override { return m_.context(); }
  void reset() override { m_.reset(); }

 private:
  LlamaCuda& m_;
};

TEST(DeviceSampler, LlamaCudaGeneratesTheHostDrawnTokens) {
  TWELL_REQUIRE_HOPPER();
  io::ModelConfig c = model::tiny_config("relu", true);
  c.hidden_size = 128, c.intermediate_size = 256, c.head_dim = 32, c.vocab_size = 300, c.max_position_embeddings = 96;
  const std::string dir = ::testing::TempDir() + "twell_device_sampler_model";
  model::write_hf(dir, c, model::random_hf_tensors(c, 5));
  auto w = std::make_shared<LlamaCudaWeights>(LlamaCudaWeights::upload(model::LlamaWeights::load_dir(dir)));
  std::filesystem::remove_all(dir);
  LlamaCudaOptions lo;
  lo.max_context = 96;
  LlamaCuda gpu(w, lo);
  std::string why;
  EXPECT_TRUE(sample_kernel_runs(&why)) << why;
  EXPECT_TRUE(gpu.samples_on_gpu());
  HostDrawn host(gpu);
  lo.sample_on_gpu = false;  // prefill_batch_sample and decode_batch_sample copy the rows back
  LlamaCuda on_host(w, lo);
  EXPECT_FALSE(on_host.samples_on_gpu());
  const std::vector<int32_t> prompt = {5, 17, 200, 3, 99};
  SamplingOptions penalized = options(0.9, 0, 1, 7), greedy_penalized = options(0);
  penalized.repetition_penalty = 1.4, greedy_penalized.repetition_penalty = 2.0;
  for (const SamplingOptions& o : {options(0), options(0.9, 0, 0.95, 3), options(1.2, 20, 1, 4), options(1, 0, 1, 5, 250),
                                   options(1.1, 0, 1, 6, 0, 0.1), penalized, greedy_penalized}) {
    const model::Generation a = model::generate(gpu, prompt, 40, o);
    const model::Generation b = model::generate(host, prompt, 40, o);
    EXPECT_EQ(a.tokens, b.tokens) << str_of(o);
    EXPECT_EQ(model::generate(on_host, prompt, 40, o).tokens, a.tokens) << str_of(o);
    EXPECT_EQ(a.tokens.size(), 40u);
    if (o.vocab_limit > 0)
      for (int32_t t : a.tokens) EXPECT_LT(t, o.vocab_limit);
  }
}

}  // namespace
}  // namespace twell::cuda
