// Micro-benchmark: the prefill attention of a few new tokens over a long cached history (a
// conversation's next turn: `twell bench model --turn`). A ktrace of such a turn on the 2B shape (21
// tokens after 4096, sixtieth session) found twell's flash kernel at 47 µs of a layer's ~116: its
// blocks of 128 query rows held 21, so three of their four warps scored rows past S, and each block
// walked a fifth of the 4096 keys alone. This compares, for S new tokens of B sequences after C cached:
//   rows   the default blocks (each warp owns a quarter of 64·MT rows over all the keys)
//   keys   AttentionArgs::warps_split_keys (the warps share 16·MT rows and take 16 keys of each tile)
// each with key_splits 1, 2, 4, 8 and plan_prefill_attention's choice ("plan"). Every configuration is
// first checked against float64 (three heads, every row, the first of the rotating layers), then timed:
// CUDA events around a pass over `layers` layers' caches (together more than the L2, as a forward
// reads them), 3 warm-up passes, median of 30, divided by the layers.
// Built as twell_micro_turn_attention with TWELL_CUDA; run:
//   twell_micro_turn_attention [C = 4096] [S list = 1,2,4,8,16,21,32,48,64,96,128,256] [B = 1]
//                              [heads = 32] [kv heads = 32] [head_dim = 64]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "twell/bf16.h"
#include "twell/cuda/runtime.h"
#include "micro_util.h"

using namespace twell;
using namespace twell::cuda;
using micro::median_us_per_launch;
using micro::parse_list;

namespace {

std::vector<uint16_t> download(const uint16_t* d, size_t n) {
  std::vector<uint16_t> h(n);
  TWELL_CUDA_CHECK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  const int C = argc > 1 ? std::atoi(argv[1]) : 4096;
  const std::vector<int> S_list = parse_list(argc > 2 ? argv[2] : "1,2,4,8,16,21,32,48,64,96,128,256");
  const int B = argc > 3 ? std::atoi(argv[3]) : 1, nh = argc > 4 ? std::atoi(argv[4]) : 32;
  const int nkv = argc > 5 ? std::atoi(argv[5]) : 32, hd = argc > 6 ? std::atoi(argv[6]) : 64;
  check_attention(hd);
  cudaDeviceProp prop{};
  TWELL_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs: B = %d, C = %d cached, %d heads, %d KV heads, head_dim %d\n", prop.name, sms, B, C, nh,
              nkv, hd);
  std::printf("%5s %5s %6s %9s %9s %9s\n", "S", "warps", "splits", "us", "KV GB/s", "rel_err");
  cudaStream_t stream = nullptr;
  TWELL_CUDA_CHECK(cudaStreamCreate(&stream));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  bool all_ok = true;
  for (const int S : S_list) {
    const int ctx = C + S;  // the cache's rows: the history and the new tokens
    const int64_t qkv_ld = int64_t{nh + 2 * nkv} * hd, kv_ld = int64_t{nkv} * hd;
    const size_t qkv_n = static_cast<size_t>(int64_t{B} * S * qkv_ld), kv_n = static_cast<size_t>(int64_t{B} * ctx * kv_ld);
    // Layers of caches (K and V, kv_n bf16 each): 256 MB at least, at most 64 layers.
    const int R = static_cast<int>(std::min<int64_t>(64, (int64_t{256} << 20) / static_cast<int64_t>(kv_n * 4) + 1));
    std::vector<DeviceBuffer> qkv, k, v;
    for (int l = 0; l < R; ++l) {
      qkv.emplace_back(qkv_n * 2), k.emplace_back(kv_n * 2), v.emplace_back(kv_n * 2);
      fill_uniform_bf16(qkv[l].as<uint16_t>(), int64_t{B} * S, qkv_ld, qkv_ld, -2.f, 2.f, 3 * l + 1, stream);
      fill_uniform_bf16(k[l].as<uint16_t>(), int64_t{B} * ctx, kv_ld, kv_ld, -2.f, 2.f, 3 * l + 2, stream);
      fill_uniform_bf16(v[l].as<uint16_t>(), int64_t{B} * ctx, kv_ld, kv_ld, -1.f, 1.f, 3 * l + 3, stream);
    }
    DeviceBuffer o(static_cast<size_t>(int64_t{B} * S * nh * hd) * 2), p0(static_cast<size_t>(B) * 4);
    const std::vector<int32_t> starts(static_cast<size_t>(B), C);
    TWELL_CUDA_CHECK(cudaMemcpy(p0.get(), starts.data(), p0.bytes(), cudaMemcpyHostToDevice));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));

    // float64 reference of layer 0, heads 0, nh/2 and nh − 1, every row of sequence B − 1.
    const std::vector<uint16_t> hq = download(qkv[0].as<uint16_t>(), qkv_n), hk = download(k[0].as<uint16_t>(), kv_n),
                                hv = download(v[0].as<uint16_t>(), kv_n);
    const int b = B - 1, heads[3] = {0, nh / 2, nh - 1};
    std::vector<double> ref;
    for (const int h : heads)
      for (int s = 0; s < S; ++s) {
        const int kvh = h / (nh / nkv), n = C + s + 1;
        const uint16_t* q = &hq[static_cast<size_t>((int64_t{b} * S + s) * qkv_ld + int64_t{h} * hd)];
        std::vector<double> p(static_cast<size_t>(n));
        double mx = -1e300, sum = 0;
        for (int j = 0; j < n; ++j) {
          const uint16_t* kr = &hk[static_cast<size_t>((int64_t{b} * ctx + j) * kv_ld + int64_t{kvh} * hd)];
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(bf16_bits_to_float(q[d])) * bf16_bits_to_float(kr[d]);
          mx = std::max(mx, p[j] = dot * scale);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int d = 0; d < hd; ++d) {
          double acc = 0;
          for (int j = 0; j < n; ++j)
            acc += p[j] / sum * bf16_bits_to_float(hv[static_cast<size_t>((int64_t{b} * ctx + j) * kv_ld + int64_t{kvh} * hd + d)]);
          ref.push_back(acc);
        }
      }

    AttentionArgs base;
    base.o = o.as<uint16_t>(), base.p0 = p0.as<int32_t>();
    base.B = B, base.S = S, base.nh = nh, base.nkv = nkv, base.hd = hd, base.max_context = ctx, base.scale = scale;
    AttentionArgs plan = base;
    plan_prefill_attention(plan, ctx, sms);
    struct Config {
      bool warps;
      int splits;  // 0: the plan
    };
    std::vector<Config> configs;
    for (const bool warps : {false, true})
      for (const int splits : {1, 2, 4, 8}) configs.push_back({warps, splits});
    configs.push_back({plan.warps_split_keys, 0});
    for (const Config& cfg : configs) {
      AttentionArgs a = base;
      a.warps_split_keys = cfg.warps, a.key_splits = cfg.splits ? cfg.splits : plan.key_splits;
      const auto launch = [&](int l) {
        a.qkv = qkv[l].as<uint16_t>(), a.k_cache = k[l].as<uint16_t>(), a.v_cache = v[l].as<uint16_t>();
        launch_attention(a, stream);
      };
      TWELL_CUDA_CHECK(cudaMemsetAsync(o.get(), 0xff, o.bytes(), stream));  // NaN: every row must be written
      launch(0);
      const std::vector<uint16_t> out = download(o.as<uint16_t>(), o.bytes() / 2);
      double num = 0, den = 0;
      size_t i = 0;
      for (const int h : heads)
        for (int s = 0; s < S; ++s)
          for (int d = 0; d < hd; ++d, ++i) {
            const double x = bf16_bits_to_float(out[static_cast<size_t>((int64_t{b} * S + s) * nh * hd + int64_t{h} * hd + d)]);
            num += std::isfinite(x) ? (x - ref[i]) * (x - ref[i]) : INFINITY, den += ref[i] * ref[i];
          }
      const double err = std::sqrt(num / den);
      const bool ok = err <= 1e-2;
      all_ok = all_ok && ok;
      const double us = median_us_per_launch(stream, R, launch), bytes = 2.0 * double(B) * ctx * double(kv_ld) * 2;
      std::printf("%5d %5s %6s %9.2f %9.0f %9.2e%s\n", S, cfg.warps ? "keys" : "rows",
                  cfg.splits ? std::to_string(cfg.splits).c_str() : ("plan " + std::to_string(plan.key_splits)).c_str(),
                  us, bytes / us / 1e3, err, ok ? "" : "  WRONG");
    }
  }
  std::printf(all_ok ? "all configurations match float64 (rel err <= 1e-2)\n" : "SOME CONFIGURATIONS ARE WRONG\n");
  return all_ok ? 0 : 1;
}
