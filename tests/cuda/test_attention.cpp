// The prefill attention: cuDNN's fused SDPA (CudnnSdpa) and twell's own flash kernel
// (launch_attention) against a float64 reference, on the runtime's buffers (q inside the QKV GEMM
// output, k and v in the KV cache at positions [0, past + S)), with GQA, head_dim 32/64/128,
// sequences that are not multiples of any tile, and a prefix already in the cache (past > 0: the
// causal diagonal aligned to the bottom right). The decode step (launch_decode_attention: RoPE,
// the cache write and the attention in one kernel) against the unfused path and float64, head_dim
// 16 to 128 (DecodeAttention below).
//
// Where libcudnn cannot be loaded the cuDNN half skips with the reason, unless TWELL_REQUIRE_CUDNN
// is set (scripts/gpu-check.sh sets it where PyTorch's cuDNN is present): then it fails.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/cudnn_sdpa.h"
#include "cuda/kernels.h"
#include "gpu_test.h"
#include "twell/bf16.h"

namespace twell::cuda {
namespace {

struct Case {
  int B, S, past, nh, nkv, hd;
  int spare = 5;    // cache rows past the new tokens
  int stagger = 0;  // sequence b's new tokens start at past − b·stagger (p0[b]): a batch of ragged lengths
};

int past_of(const Case& c, int b) { return c.past - b * c.stagger; }

struct Buffers {
  std::vector<uint16_t> qkv, k, v;  // host copies, bf16 bits
  DeviceBuffer d_qkv, d_k, d_v, d_o;
};

uint16_t rnd_bf16(std::mt19937& rng, float scale) {
  std::normal_distribution<float> n(0.f, scale);
  return float_to_bf16_bits(n(rng));
}

// The cache has unused rows past the end, as in the runtime.
int max_context(const Case& c) { return c.past + c.S + c.spare; }

Buffers make(const Case& c, uint64_t seed) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  Buffers b;
  const int64_t qkv_ld = int64_t{c.nh + 2 * c.nkv} * c.hd, kv_ld = int64_t{c.nkv} * c.hd;
  b.qkv.resize(static_cast<size_t>(int64_t{c.B} * c.S * qkv_ld));
  b.k.resize(static_cast<size_t>(int64_t{c.B} * max_context(c) * kv_ld));
  b.v.resize(b.k.size());
  for (auto& x : b.qkv) x = rnd_bf16(rng, 1.0f);
  for (auto& x : b.k) x = rnd_bf16(rng, 1.0f);
  for (auto& x : b.v) x = rnd_bf16(rng, 1.0f);
  // Cache rows past the new tokens: large finite values, so a kernel that attended to them would
  // be far off (NaN could trip kernels that legitimately load masked rows).
  for (size_t i = 0; i < b.k.size(); ++i)
    if ((static_cast<int64_t>(i) / kv_ld) % max_context(c) >= past_of(c, static_cast<int>(i / kv_ld / max_context(c))) + c.S)
      b.k[i] = float_to_bf16_bits(64.f), b.v[i] = float_to_bf16_bits(1e4f);
  b.d_qkv = upload(b.qkv), b.d_k = upload(b.k), b.d_v = upload(b.v);
  b.d_o = DeviceBuffer(static_cast<size_t>(int64_t{c.B} * c.S * c.nh * c.hd) * 2);
  return b;
}

// o[b·S + s, h·hd + d] in float64: softmax over cache positions [0, past + s].
std::vector<double> reference(const Case& c, const Buffers& b, float scale) {
  const int64_t qkv_ld = int64_t{c.nh + 2 * c.nkv} * c.hd, kv_ld = int64_t{c.nkv} * c.hd;
  std::vector<double> o(static_cast<size_t>(int64_t{c.B} * c.S * c.nh * c.hd));
  std::vector<double> p;
  for (int bi = 0; bi < c.B; ++bi)
    for (int s = 0; s < c.S; ++s)
      for (int h = 0; h < c.nh; ++h) {
        const int kvh = h / (c.nh / c.nkv), n = past_of(c, bi) + s + 1;
        const uint16_t* q = &b.qkv[static_cast<size_t>((int64_t{bi} * c.S + s) * qkv_ld + int64_t{h} * c.hd)];
        p.assign(static_cast<size_t>(n), 0.0);
        double mx = -1e300;
        for (int j = 0; j < n; ++j) {
          const uint16_t* k = &b.k[static_cast<size_t>((int64_t{bi} * max_context(c) + j) * kv_ld + kvh * c.hd)];
          double dot = 0;
          for (int d = 0; d < c.hd; ++d) dot += double(bf16_bits_to_float(q[d])) * bf16_bits_to_float(k[d]);
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        double* out = &o[static_cast<size_t>((int64_t{bi} * c.S + s) * c.nh * c.hd + int64_t{h} * c.hd)];
        for (int j = 0; j < n; ++j) {
          const uint16_t* v = &b.v[static_cast<size_t>((int64_t{bi} * max_context(c) + j) * kv_ld + kvh * c.hd)];
          for (int d = 0; d < c.hd; ++d) out[d] += p[j] / sum * bf16_bits_to_float(v[d]);
        }
      }
  return o;
}

// Relative Frobenius error of the device output against the reference; NaN anywhere fails it.
double error_of(const DeviceBuffer& d_o, const std::vector<double>& ref) {
  std::vector<uint16_t> o(ref.size());
  TWELL_CUDA_CHECK(cudaMemcpy(o.data(), d_o.get(), o.size() * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    const double x = bf16_bits_to_float(o[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - ref[i]) * (x - ref[i]), den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// p0 on the device: each sequence's first new position.
DeviceBuffer positions(const Case& c) {
  std::vector<int32_t> p0(static_cast<size_t>(c.B));
  for (int b = 0; b < c.B; ++b) p0[b] = past_of(c, b);
  DeviceBuffer d(p0.size() * 4);
  TWELL_CUDA_CHECK(cudaMemcpy(d.get(), p0.data(), d.bytes(), cudaMemcpyHostToDevice));
  return d;
}

AttentionArgs args_of(const Case& c, const Buffers& b, const DeviceBuffer& p0) {
  AttentionArgs a;
  a.qkv = b.d_qkv.as<uint16_t>(), a.k_cache = b.d_k.as<uint16_t>(), a.v_cache = b.d_v.as<uint16_t>();
  a.o = b.d_o.as<uint16_t>(), a.p0 = p0.as<int32_t>();
  a.B = c.B, a.S = c.S, a.nh = c.nh, a.nkv = c.nkv, a.hd = c.hd, a.max_context = max_context(c);
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  return a;
}

void poison(const DeviceBuffer& d) { TWELL_CUDA_CHECK(cudaMemset(d.get(), 0xff, d.bytes())); }  // bf16 NaN

const Case kCases[] = {
    {2, 300, 0, 4, 2, 64},    // GQA, S not a multiple of 64 or 128
    {1, 129, 70, 2, 2, 128},  // a prefix in the cache
    {3, 17, 0, 8, 1, 32},     // multi-query, a short prompt
    {1, 1024, 0, 2, 2, 64},   // many key tiles
    {2, 65, 200, 4, 2, 64},   // GQA and a prefix longer than the new tokens
    {3, 90, 80, 4, 2, 64, 5, 40},  // ragged: the sequences' new tokens at 80, 40 and 0 (twell's kernel only)
    {1, 21, 2000, 8, 8, 64},       // a conversation's next turn: few rows over many keys (key_splits)
    {2, 5, 700, 4, 2, 128},
    {1, 3, 300, 2, 1, 16},
    {1, 150, 900, 2, 2, 32},       // two blocks of rows over many keys
};

// cuDNN's half: false (after SKIP or FAIL) where cuDNN cannot run here. TWELL_REQUIRE_CUDNN turns
// every skip into a failure.
bool cudnn_runs(CudnnSdpa& sdpa, const AttentionArgs& a, int64_t past) {
  std::string why;
  if (!CudnnSdpa::available(&why) || !sdpa.run(a, past, nullptr, &why)) {
    if (std::getenv("TWELL_REQUIRE_CUDNN")) ADD_FAILURE() << "TWELL_REQUIRE_CUDNN is set, but " << why;
    std::printf("cuDNN half skipped: %s\n", why.c_str());
    return false;
  }
  return true;
}

class PrefillAttention : public ::testing::TestWithParam<Case> {};

TEST_P(PrefillAttention, CudnnAndTwellMatchFloat64) {
  TWELL_REQUIRE_HOPPER();
  const Case c = GetParam();
  Buffers b = make(c, 1000 + c.S + c.hd);
  const std::vector<double> ref = reference(c, b, 1.0f / std::sqrt(static_cast<float>(c.hd)));
  const DeviceBuffer p0 = positions(c);
  const AttentionArgs a = args_of(c, b, p0);

  poison(b.d_o);
  launch_attention(a, nullptr);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  const double own = error_of(b.d_o, ref);
  std::printf("B=%d S=%d past=%d nh=%d nkv=%d hd=%d: twell kernel rel err %.2e\n", c.B, c.S, c.past, c.nh, c.nkv,
              c.hd, own);
  EXPECT_LT(own, 1e-2);
  // The keys split among the blocks of a cluster (key_splits), ranges empty for some blocks of rows
  // where there are more splits than their tiles, and among the warps of a block (warps_split_keys,
  // over blocks of 32 or 16 rows: several at most S here): the same result, up to the merge's rounding
  // (the outputs within a bf16 rounding or two of the unsplit kernel's).
  std::vector<double> unsplit(ref.size());
  {
    std::vector<uint16_t> o(ref.size());
    TWELL_CUDA_CHECK(cudaMemcpy(o.data(), b.d_o.get(), o.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < o.size(); ++i) unsplit[i] = bf16_bits_to_float(o[i]);
  }
  for (const bool warps : {false, true})
    for (const int splits : {1, 2, 3, 8}) {
      if (!warps && splits == 1) continue;  // the kernel above
      AttentionArgs split = a;
      split.key_splits = splits, split.warps_split_keys = warps;
      poison(b.d_o);
      launch_attention(split, nullptr);
      TWELL_CUDA_CHECK(cudaDeviceSynchronize());
      const double err = error_of(b.d_o, ref), apart = error_of(b.d_o, unsplit);
      std::printf("  key_splits %d%s: rel err %.2e, %.2e from the unsplit kernel's\n", splits,
                  warps ? ", warps_split_keys" : "", err, apart);
      EXPECT_LT(err, 1e-2) << "key_splits " << splits << (warps ? ", warps_split_keys" : "");
      EXPECT_LT(apart, 5e-3) << "key_splits " << splits << (warps ? ", warps_split_keys" : "");
    }

  if (c.stagger != 0) return;  // cuDNN's half takes one position for all sequences
  CudnnSdpa sdpa;
  poison(b.d_o);
  if (!cudnn_runs(sdpa, a, c.past)) return;
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  const double dnn = error_of(b.d_o, ref);
  std::printf("  cuDNN %lld SDPA rel err %.2e\n", static_cast<long long>(CudnnSdpa::version()), dnn);
  EXPECT_LT(dnn, 2 * own + 1e-3);
  // A second call reuses the plan and gives the same bits.
  std::vector<uint16_t> first(static_cast<size_t>(b.d_o.bytes() / 2)), second(first.size());
  TWELL_CUDA_CHECK(cudaMemcpy(first.data(), b.d_o.get(), b.d_o.bytes(), cudaMemcpyDeviceToHost));
  poison(b.d_o);
  std::string why;
  ASSERT_TRUE(sdpa.run(a, c.past, nullptr, &why)) << why;
  TWELL_CUDA_CHECK(cudaMemcpy(second.data(), b.d_o.get(), b.d_o.bytes(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(first, second);
}

// One CudnnSdpa through every case, twice over: each shape (including the same S at another
// position) gets its own plan, and the workspace grows under the earlier plans.
TEST(CudnnSdpa, OneInstanceKeepsAPlanPerShape) {
  TWELL_REQUIRE_HOPPER();
  CudnnSdpa sdpa;
  DeviceBuffer p0(4);
  for (int round = 0; round < 2; ++round)
    for (Case c : kCases)
      for (int past : {c.past, c.past + 3}) {
        if (c.stagger != 0) continue;
        c.past = past;
        SCOPED_TRACE(testing::Message() << "round " << round << " S=" << c.S << " past=" << c.past);
        Buffers b = make(c, 77 + c.S);
        const std::vector<double> ref = reference(c, b, 1.0f / std::sqrt(static_cast<float>(c.hd)));
        poison(b.d_o);
        const auto t0 = std::chrono::steady_clock::now();
        if (!cudnn_runs(sdpa, args_of(c, b, p0), c.past)) return;
        TWELL_CUDA_CHECK(cudaDeviceSynchronize());
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        std::printf("round %d B=%d S=%d past=%d: %.1f ms (%s)\n", round, c.B, c.S, c.past, ms,
                    round == 0 ? "plan built" : "plan reused");
        EXPECT_LT(error_of(b.d_o, ref), 3e-3);
      }
}

INSTANTIATE_TEST_SUITE_P(Cases, PrefillAttention, ::testing::ValuesIn(kCases), [](const auto& info) {
  const Case& c = info.param;
  return "B" + std::to_string(c.B) + "_S" + std::to_string(c.S) + "_past" + std::to_string(c.past) + "_h" +
         std::to_string(c.nh) + "kv" + std::to_string(c.nkv) + "_hd" + std::to_string(c.hd) +
         (c.stagger ? "_stagger" + std::to_string(c.stagger) : "");
});

// A decode step: launch_decode_attention against launch_rope_kv + the flash kernel at S = 1 (the
// caches bit for bit, the QKV buffer left as it was) and against float64 (from the rotated q and
// the caches the unfused path wrote), at contexts that leave key ranges empty, fill one, or span
// all 16 ranges of the cluster; one range; a batch; GQA and MQA; every head_dim. Run twice, the
// second time launched as a programmatic dependent: the same bits.
struct DecodeCase {
  int B, past, nh, nkv, hd, max_context;
  int stagger = 0;  // Case::stagger
};
const DecodeCase kDecodeCases[] = {  // ranges: decode_attention_splits on 132 SMs
    {1, 0, 4, 2, 64, 2048},      // the first token: one key, 15 of 16 ranges empty
    {3, 70, 8, 2, 32, 96},       // 3 ranges, GQA, three sequences
    {1, 543, 32, 32, 64, 576},   // the benchmark's step: 16 ranges of 48 keys, 12 busy
    {2, 2047, 4, 1, 128, 2048},  // the last position: all 16 ranges, multi-query
    {1, 300, 2, 2, 16, 1000},    // head_dim 16
    {2, 129, 4, 4, 64, 130},     // 5 ranges, the new key at the very end of the cache
    {1, 20, 4, 4, 64, 24},       // one range: no cluster partner
    {40, 33, 4, 2, 64, 64},      // a batch: 2 ranges
    {4, 300, 4, 2, 64, 512, 97},  // a ragged batch: keys 0..300, 0..203, 0..106 and 0..9
};

DeviceBuffer copy_of(const DeviceBuffer& d) {
  DeviceBuffer c(d.bytes());
  TWELL_CUDA_CHECK(cudaMemcpy(c.get(), d.get(), d.bytes(), cudaMemcpyDeviceToDevice));
  return c;
}

TEST(DecodeAttention, MatchesRopeThenFlashAndFloat64) {
  TWELL_REQUIRE_HOPPER();
  const int sm_count = device_info().sm_count;
  for (const DecodeCase& dc : kDecodeCases) {
    SCOPED_TRACE(testing::Message() << "B=" << dc.B << " past=" << dc.past << " stagger=" << dc.stagger << " nh=" << dc.nh << " nkv=" << dc.nkv
                                    << " hd=" << dc.hd << " max_context=" << dc.max_context);
    Case c{dc.B, 1, dc.past, dc.nh, dc.nkv, dc.hd};
    c.spare = dc.max_context - dc.past - 1;
    c.stagger = dc.stagger;
    Buffers fused = make(c, 500 + dc.past);
    Buffers unfused;
    unfused.d_qkv = copy_of(fused.d_qkv), unfused.d_k = copy_of(fused.d_k), unfused.d_v = copy_of(fused.d_v);
    unfused.d_o = DeviceBuffer(fused.d_o.bytes());
    std::vector<float> table(static_cast<size_t>(dc.max_context) * dc.hd);  // as the runtime's, θ = 10⁴
    for (int p = 0; p < dc.max_context; ++p)
      for (int i = 0; i < dc.hd / 2; ++i) {
        const double angle = p * std::pow(1e4, -2.0 * i / dc.hd);
        table[static_cast<size_t>(p) * dc.hd + i] = static_cast<float>(std::cos(angle));
        table[static_cast<size_t>(p) * dc.hd + dc.hd / 2 + i] = static_cast<float>(std::sin(angle));
      }
    DeviceBuffer cos_sin(table.size() * 4);
    const DeviceBuffer p0 = positions(c);
    TWELL_CUDA_CHECK(cudaMemcpy(cos_sin.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    auto rope_of = [&](Buffers& b) {
      RopeKvArgs r;
      r.qkv = b.d_qkv.as<uint16_t>(), r.k_cache = b.d_k.as<uint16_t>(), r.v_cache = b.d_v.as<uint16_t>();
      r.cos_sin = cos_sin.as<float>(), r.p0 = p0.as<int32_t>();
      r.T = dc.B, r.S = 1, r.max_context = dc.max_context, r.nh = dc.nh, r.nkv = dc.nkv, r.hd = dc.hd;
      return r;
    };
    poison(unfused.d_o);
    launch_rope_kv(rope_of(unfused), nullptr);
    launch_attention(args_of(c, unfused, p0), nullptr);
    const std::vector<uint16_t> qkv_before = download(fused.d_qkv);
    std::vector<uint16_t> first;
    for (int run = 0; run < 2; ++run) {
      poison(fused.d_o);
      launch_decode_attention(rope_of(fused), args_of(c, fused, p0), sm_count, nullptr, /*dependent=*/run == 1);
      TWELL_CUDA_CHECK(cudaDeviceSynchronize());
      if (run == 0) first = download(fused.d_o);
    }
    EXPECT_EQ(download(fused.d_o), first) << "a second run gave other bits";
    EXPECT_EQ(download(fused.d_qkv), qkv_before) << "the QKV buffer was modified";
    EXPECT_EQ(download(fused.d_k), download(unfused.d_k)) << "key cache";
    EXPECT_EQ(download(fused.d_v), download(unfused.d_v)) << "value cache";
    // float64 from what the unfused path rotated and cached.
    unfused.qkv = download(unfused.d_qkv), unfused.k = download(unfused.d_k), unfused.v = download(unfused.d_v);
    const std::vector<double> ref = reference(c, unfused, 1.0f / std::sqrt(static_cast<float>(dc.hd)));
    const double err = error_of(fused.d_o, ref), err_flash = error_of(unfused.d_o, ref);
    std::printf("B=%d past=%d nh=%d nkv=%d hd=%d max_context=%d: decode kernel rel err %.2e (rope + flash %.2e)\n",
                dc.B, dc.past, dc.nh, dc.nkv, dc.hd, dc.max_context, err, err_flash);
    EXPECT_LT(err, 5e-3);
    EXPECT_LT(err_flash, 1e-2);
    // Key ranges the caller chooses (LlamaCudaOptions::decode_attention_splits): other merge
    // orders, the same accuracy.
    for (const int splits : {1, 3, 8, 16}) {
      poison(fused.d_o);
      launch_decode_attention(rope_of(fused), args_of(c, fused, p0), sm_count, nullptr, false, splits);
      TWELL_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_LT(error_of(fused.d_o, ref), 5e-3) << splits << " ranges";
    }
    EXPECT_THROW(launch_decode_attention(rope_of(fused), args_of(c, fused, p0), sm_count, nullptr, false, 17), Error);
    // Warps a block the caller chooses (LlamaCudaOptions::decode_attention_warps; the kernel's choice
    // is 4 at these grids on 132 SMs): each warp over more keys, the block's states merged over fewer.
    for (const int warps : {1, 2, 4})
      for (const int splits : {0, 16}) {
        poison(fused.d_o);
        launch_decode_attention(rope_of(fused), args_of(c, fused, p0), sm_count, nullptr, warps == 2, splits, warps);
        TWELL_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_LT(error_of(fused.d_o, ref), 5e-3) << warps << " warps, " << splits << " ranges";
        EXPECT_EQ(download(fused.d_k), download(unfused.d_k)) << warps << " warps: key cache";
      }
    EXPECT_THROW(launch_decode_attention(rope_of(fused), args_of(c, fused, p0), sm_count, nullptr, false, 0, 3), Error);
  }
}

// A NaN in one cached key (head 0's KV head, in one of 16 ranges) makes that head's output NaN,
// whichever range holds it; the other heads stay finite.
TEST(DecodeAttention, NaNInTheCacheIsNotLost) {
  TWELL_REQUIRE_HOPPER();
  const int sm_count = device_info().sm_count;
  for (const int key : {5, 150, 298}) {  // ranges 0, 4 and 9 of 16 (32 keys each); 299 is the new key
    Case c{1, 1, 299, 4, 4, 64};
    c.spare = 1000 - 300;
    Buffers b = make(c, 9);
    std::vector<uint16_t> k = download(b.d_k);
    k[static_cast<size_t>(key) * 4 * 64 + 3] = 0x7fc0;  // key `key`, KV head 0, dim 3
    b.d_k = upload(k);
    std::vector<float> table(static_cast<size_t>(max_context(c)) * 64, 0.f);  // cos 1, sin 0: no rotation
    for (int p = 0; p < max_context(c); ++p)
      for (int i = 0; i < 32; ++i) table[static_cast<size_t>(p) * 64 + i] = 1.f;
    DeviceBuffer cos_sin(table.size() * 4), p0(4);
    TWELL_CUDA_CHECK(cudaMemcpy(cos_sin.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    TWELL_CUDA_CHECK(cudaMemcpy(p0.get(), &c.past, 4, cudaMemcpyHostToDevice));
    RopeKvArgs r;
    r.qkv = b.d_qkv.as<uint16_t>(), r.k_cache = b.d_k.as<uint16_t>(), r.v_cache = b.d_v.as<uint16_t>();
    r.cos_sin = cos_sin.as<float>(), r.p0 = p0.as<int32_t>();
    r.T = 1, r.S = 1, r.max_context = max_context(c), r.nh = 4, r.nkv = 4, r.hd = 64;
    launch_decode_attention(r, args_of(c, b, p0), sm_count, nullptr);
    const std::vector<uint16_t> o = download(b.d_o);
    for (int h = 0; h < 4; ++h)
      for (int d = 0; d < 64; ++d)
        EXPECT_EQ(std::isnan(bf16_bits_to_float(o[static_cast<size_t>(h) * 64 + d])), h == 0)
            << "NaN at key " << key << ": head " << h << " dim " << d;
  }
}

// prefill_attention_splits: blocks enough for one an SM where the rows' blocks are few, each range
// at least 4 tiles of 64 keys, at most kMaxKeySplits, none where the rows fill the GPU; launch_attention
// refuses a key_splits outside [1, kMaxKeySplits] before any launch.
TEST(PrefillAttentionSplits, FillTheGpuWithRangesOfAtLeastFourTiles) {  // host-only: runs without a GPU too
  EXPECT_EQ(prefill_attention_splits(1, 21, 32, 64, 4036, 132), 5);     // 32 blocks of rows
  EXPECT_EQ(prefill_attention_splits(1, 21, 32, 64, 1000, 132), 4);     // 16 tiles
  EXPECT_EQ(prefill_attention_splits(1, 21, 32, 64, 300, 132), 1);      // 5 tiles
  EXPECT_EQ(prefill_attention_splits(1, 21, 8, 64, 4036, 132), kMaxKeySplits);
  EXPECT_EQ(prefill_attention_splits(1, 200, 8, 128, 4036, 132), 5);    // 64 rows a block at head_dim 128: 32 blocks
  EXPECT_EQ(prefill_attention_splits(64, 2048, 32, 64, 2048, 132), 1);  // a prefill fills the GPU
  EXPECT_EQ(prefill_attention_splits(1, 48, 32, 64, 4117, 132, true), 3);  // 2 blocks of 32 rows a head
  // plan_prefill_attention: the warps split the keys for few rows, the blocks where the keys are known.
  AttentionArgs p;
  p.B = 1, p.S = 21, p.nh = 32, p.nkv = 32, p.hd = 64;
  plan_prefill_attention(p, 4117, 132);
  EXPECT_TRUE(p.warps_split_keys);
  EXPECT_EQ(p.key_splits, 5);  // 32 blocks of 32 rows
  plan_prefill_attention(p, 0, 132);  // sequences that end at different positions
  EXPECT_TRUE(p.warps_split_keys);
  EXPECT_EQ(p.key_splits, 1);
  p.S = static_cast<int>(kWarpsSplitKeysMaxRows) + 1;
  plan_prefill_attention(p, 4117, 132);
  EXPECT_FALSE(p.warps_split_keys);
  EXPECT_EQ(p.key_splits, 5);
  AttentionArgs a;
  a.B = 1, a.S = 2, a.nh = 4, a.nkv = 2, a.hd = 64, a.max_context = 8;
  for (const int bad : {0, kMaxKeySplits + 1}) {  // refused by name, before any CUDA call
    a.key_splits = bad;
    try {
      launch_attention(a, nullptr);
      ADD_FAILURE() << "key_splits " << bad << " was not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("key_splits must lie in [1, 8]"), std::string::npos) << e.what();
    }
  }
}

TEST(DecodeAttention, MismatchedArgumentsAreRejected) {  // host-only checks, before any launch
  RopeKvArgs r;
  AttentionArgs a;
  r.T = a.B = 1, r.S = a.S = 1, r.nh = a.nh = 4, r.nkv = a.nkv = 2, r.hd = a.hd = 64, r.max_context = a.max_context = 8;
  a.S = 2;
  EXPECT_THROW(launch_decode_attention(r, a, 132, nullptr), Error);
  a.S = 1, a.nkv = 3;
  EXPECT_THROW(launch_decode_attention(r, a, 132, nullptr), Error);
  a.nkv = 2, r.hd = 32;
  EXPECT_THROW(launch_decode_attention(r, a, 132, nullptr), Error);
  r.hd = 64;
  EXPECT_THROW(launch_decode_attention(r, a, 0, nullptr), Error);  // no SM count
}

TEST(CudnnSdpa, ContextOverflowIsRejected) {
  TWELL_REQUIRE_HOPPER();
  const Case c{1, 8, 0, 2, 2, 64};
  Buffers b = make(c, 5);
  DeviceBuffer p0(4);
  AttentionArgs a = args_of(c, b, p0);
  CudnnSdpa sdpa;
  std::string why;
  if (!CudnnSdpa::available(&why)) GTEST_SKIP() << why;
  EXPECT_THROW(sdpa.run(a, a.max_context - 3, nullptr), Error);  // past + S beyond the cache
}

}  // namespace
}  // namespace twell::cuda
