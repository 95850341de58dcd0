// The fused QKV GEMM + RoPE + KV-cache write (launch_qkv_rope) against the unfused path (cuBLASLt
// GEMM, then launch_rope_kv) on the same inputs: q in the QKV buffer, k and v in the caches at
// positions [p0, p0 + S) of each sequence, nothing else written (outputs poisoned first). Token
// counts that are not multiples of the row tile, a prefix in the cache, GQA, head_dim 64 (128 × 192
// tiles, which may span q and k or k and v) and 128 (64 × 256), widths that are not multiples of a
// tile.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/cublaslt_gemm.h"
#include "cuda/kernels.h"
#include "gpu_test.h"
#include "twell/bf16.h"

namespace twell::cuda {
namespace {

struct Case {
  int B, S, p0, nh, nkv, hd, H;
};

const Case kCases[] = {
    {1, 1000, 0, 32, 32, 64, 2048},  // the paper's head shape; 1000 tokens: a partial last tile
    {2, 300, 37, 8, 4, 64, 256},     // GQA, a prefix in the cache
    {3, 77, 0, 4, 2, 128, 512},      // head_dim 128
    {1, 1, 5, 4, 4, 64, 64},         // one token
    {1, 100, 3, 4, 4, 64, 200},      // H = 200: a partial K tile
    {1, 50, 0, 2, 1, 64, 256},       // q width 128, N = 256: q and k in one tile of 192, a partial last tile
    {1, 70, 0, 3, 1, 128, 256},      // head_dim 128, q width 384: a 256 tile across q and k, then v and past N
};

class QkvRope : public ::testing::TestWithParam<Case> {};

TEST_P(QkvRope, MatchesGemmThenRope) {
  TWELL_REQUIRE_HOPPER();
  const Case c = GetParam();
  const int64_t T = int64_t{c.B} * c.S, q_dim = int64_t{c.nh} * c.hd, kv_dim = int64_t{c.nkv} * c.hd;
  const int64_t N = q_dim + 2 * kv_dim, max_context = c.p0 + c.S + 3;
  ASSERT_TRUE(qkv_rope_supported(c.H, c.nh, c.nkv, c.hd));
  const DeviceBuffer x = upload(random_bf16(static_cast<size_t>(T * c.H), 1.f, 1));
  const DeviceBuffer w = upload(random_bf16(static_cast<size_t>(N * c.H), 1.f / std::sqrt(float(c.H)), 2));
  // RoPE table as LlamaCuda builds it (θ = 10000).
  std::vector<float> table(static_cast<size_t>(max_context * c.hd));
  for (int64_t p = 0; p < max_context; ++p)
    for (int i = 0; i < c.hd / 2; ++i) {
      const float angle = static_cast<float>(p) / std::pow(10000.f, float(2 * i) / float(c.hd));
      table[p * c.hd + i] = std::cos(angle), table[p * c.hd + c.hd / 2 + i] = std::sin(angle);
    }
  const std::vector<int32_t> starts(static_cast<size_t>(c.B), c.p0);  // every sequence at p0 (the fused kernel's rule)
  DeviceBuffer cos_sin(table.size() * 4), p0(starts.size() * 4);
  TWELL_CUDA_CHECK(cudaMemcpy(cos_sin.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  TWELL_CUDA_CHECK(cudaMemcpy(p0.get(), starts.data(), p0.bytes(), cudaMemcpyHostToDevice));
  const size_t cache_bytes = static_cast<size_t>(c.B * max_context * kv_dim) * 2;

  struct Out {
    DeviceBuffer qkv, k, v;
  } ref{DeviceBuffer(static_cast<size_t>(T * N) * 2), DeviceBuffer(cache_bytes), DeviceBuffer(cache_bytes)},
      got{DeviceBuffer(static_cast<size_t>(T * N) * 2), DeviceBuffer(cache_bytes), DeviceBuffer(cache_bytes)};
  for (Out* o : {&ref, &got})
    for (DeviceBuffer* b : {&o->qkv, &o->k, &o->v}) TWELL_CUDA_CHECK(cudaMemset(b->get(), 0x7f, b->bytes()));
  auto args = [&](Out& o) {
    RopeKvArgs r;
    r.qkv = o.qkv.as<uint16_t>(), r.k_cache = o.k.as<uint16_t>(), r.v_cache = o.v.as<uint16_t>();
    r.cos_sin = cos_sin.as<float>(), r.p0 = p0.as<int32_t>();
    r.T = T, r.S = c.S, r.max_context = max_context, r.nh = c.nh, r.nkv = c.nkv, r.hd = c.hd;
    return r;
  };
  LtGemm gemm;
  gemm.run(x.get(), w.get(), ref.qkv.get(), T, N, c.H, true, GemmEpilogue::none, nullptr);
  launch_rope_kv(args(ref), nullptr);
  QkvRopeArgs qa;
  qa.x = x.as<uint16_t>(), qa.w = w.as<uint16_t>(), qa.H = c.H, qa.rope = args(got);
  const int sms = device_info().sm_count;
  DeviceBuffer ws(std::max<size_t>(qkv_rope_workspace_bytes(qa, sms), 16));
  launch_qkv_rope(qa, ws.get(), ws.bytes(), sms, nullptr);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());

  // q columns, and every cache row (untouched rows must still hold the poison in both).
  const auto rq = download(ref.qkv), gq = download(got.qkv);
  const auto rk = download(ref.k), gk = download(got.k), rv = download(ref.v), gv = download(got.v);
  double num = 0, den = 0;
  int64_t same = 0, total = 0, poison_wrong = 0;
  auto compare = [&](uint16_t r, uint16_t g) {
    const double a = bf16_bits_to_float(r), b = bf16_bits_to_float(g);
    num += (a - b) * (a - b), den += a * a, same += r == g, ++total;
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < q_dim; ++j) compare(rq[t * N + j], gq[t * N + j]);
    for (int64_t j = q_dim; j < N; ++j) poison_wrong += gq[t * N + j] != 0x7f7f;  // k, v: only in the caches
  }
  for (size_t i = 0; i < rk.size(); ++i) {
    const int64_t pos = (static_cast<int64_t>(i) / kv_dim) % max_context;
    if (pos >= c.p0 && pos < c.p0 + c.S) {
      compare(rk[i], gk[i]), compare(rv[i], gv[i]);
    } else {
      poison_wrong += gk[i] != 0x7f7f || gv[i] != 0x7f7f;
    }
  }
  const double rel = std::sqrt(num / den);
  std::printf("T=%lld hd=%d: rel err %.2e, %.4f%% of values bitwise equal\n", static_cast<long long>(T), c.hd, rel,
              100.0 * double(same) / double(total));
  EXPECT_EQ(poison_wrong, 0) << "cache rows outside [p0, p0 + S), or the QKV buffer's k and v columns, were written";
  EXPECT_LT(rel, 2e-3);                          // bf16 rounding of a few summation-order differences
  EXPECT_GT(double(same) / double(total), 0.9);  // the same rounding steps: nearly all bits equal
}

INSTANTIATE_TEST_SUITE_P(Cases, QkvRope, ::testing::ValuesIn(kCases), [](const auto& info) {
  const Case& c = info.param;
  return "B" + std::to_string(c.B) + "_S" + std::to_string(c.S) + "_p" + std::to_string(c.p0) + "_h" +
         std::to_string(c.nh) + "kv" + std::to_string(c.nkv) + "_hd" + std::to_string(c.hd);
});

TEST(QkvRope, SaysWhichShapesItTakes) {  // host-only
  std::string why;
  EXPECT_TRUE(qkv_rope_supported(2048, 32, 32, 64, &why)) << why;
  EXPECT_FALSE(qkv_rope_supported(64, 4, 2, 16, &why));
  EXPECT_NE(why.find("head_dim"), std::string::npos) << why;
  EXPECT_TRUE(qkv_rope_supported(256, 2, 1, 64, &why)) << why;  // q width 128: tiles hold whole heads
  EXPECT_TRUE(qkv_rope_supported(256, 3, 1, 128, &why)) << why;  // q width 384
  EXPECT_FALSE(qkv_rope_supported(256, 0, 1, 64, &why));
  EXPECT_NE(why.find("0 query and 1 key/value heads"), std::string::npos) << why;
}

}  // namespace
}  // namespace twell::cuda
