// Micro-benchmark of the reuse design for the FFN's down pass (docs/perf.md, "Next steps for the
// FFN forward", 1): y[t] = Σ_e h[t, e] · Wd[n[t, e]] over each token's active entries, computed
//   gather  a warp per token, each entry's 4 KB row of Wd read from L2 (today's design's traffic)
//   reuse   a thread per token, T tokens a block, Wd streamed through shared memory 16 columns at a
//           time for all I rows: each chunk is read from L2 once per block and serves T·d entries
//           a row; entries in registers, the block's tokens sorted by entry count so that a warp's
//           loop bound is its own maximum.
// Both are checked against a float64 reference on sampled tokens before they are timed (CUDA
// events, warm-up, median of 20). Standalone, synthetic uniform entries (no TwELL, no u):
//   nvcc -O3 -std=c++17 -arch=sm_90a bench/micro/reuse_down.cu -o reuse_down && ./reuse_down [M] [E]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

constexpr int kH = 2048, kI = 5632;
constexpr int kMaxE = 40;  // entries a token at most (the real kernel sends heavier tokens elsewhere)
constexpr int kHc = 16;    // columns a chunk: 32 bytes a row, one L2 sector

__device__ __forceinline__ float bf(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

__device__ __forceinline__ void fma8(float* acc, float h, uint4 w) {
  const uint32_t v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc[2 * i] = fmaf(h, __uint_as_float(v[i] << 16), acc[2 * i]);
    acc[2 * i + 1] = fmaf(h, __uint_as_float(v[i] & 0xffff0000u), acc[2 * i + 1]);
  }
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}

// entries: [kMaxE][M] (entry i of token t at i·M + t: coalesced across threads), each
// (h bf16 bits << 16) | neuron; count[t] entries, ascending neurons.
template <int kT>
__global__ __launch_bounds__(kT, 1) void reuse_down(const uint32_t* entries, const uint8_t* count,
                                                    const uint16_t* wd, uint16_t* y, int M) {
  extern __shared__ uint4 chunk[];  // [kI][2]: 16 columns of every row
  for (int64_t group = blockIdx.x; group * kT < M; group += gridDim.x) {
    const int64_t t = group * kT + threadIdx.x;
    const bool live = t < M;
    const int cnt = live ? count[t] : 0;
    uint32_t e[kMaxE];
#pragma unroll
    for (int i = 0; i < kMaxE; ++i) e[i] = live && i < cnt ? __ldg(entries + int64_t{i} * M + t) : 0u;
    const int bound = __reduce_max_sync(0xffffffffu, cnt);  // warp-uniform loop bound
    for (int c = 0; c < kH; c += kHc) {
      __syncthreads();  // every thread done with the previous chunk
      for (int r = threadIdx.x; r < 2 * kI; r += kT)
        chunk[r] = __ldg(reinterpret_cast<const uint4*>(wd + int64_t{r / 2} * kH + c + (r % 2) * 8));
      __syncthreads();
      float acc[kHc] = {};
#pragma unroll
      for (int i = 0; i < kMaxE; ++i) {
        if (i < bound) {
          const uint32_t n = e[i] & 0xffffu;
          const float h = bf(e[i] >> 16);  // 0 past the token's count
          fma8(acc, h, chunk[2 * n]);
          fma8(acc + 8, h, chunk[2 * n + 1]);
        }
      }
      if (live) {
        uint4* dst = reinterpret_cast<uint4*>(y + t * kH + c);
        dst[0] = make_uint4(pack2(acc[0], acc[1]), pack2(acc[2], acc[3]), pack2(acc[4], acc[5]), pack2(acc[6], acc[7]));
        dst[1] = make_uint4(pack2(acc[8], acc[9]), pack2(acc[10], acc[11]), pack2(acc[12], acc[13]),
                            pack2(acc[14], acc[15]));
      }
    }
  }
}

// A warp per token, lane l owning columns 8l + 256k (k < 8): the gather of today's kernels.
__global__ __launch_bounds__(256) void gather_down(const uint32_t* entries, const uint8_t* count, const uint16_t* wd,
                                                   uint16_t* y, int M) {
  const int lane = threadIdx.x % 32;
  for (int64_t t = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32; t < M; t += int64_t{gridDim.x} * blockDim.x / 32) {
    float acc[64] = {};
    const int cnt = count[t];
    for (int i = 0; i < cnt; ++i) {
      const uint32_t e = __ldg(entries + int64_t{i} * M + t);
      const uint16_t* row = wd + int64_t(e & 0xffffu) * kH;
      const float h = bf(e >> 16);
#pragma unroll
      for (int k = 0; k < 8; ++k) fma8(acc + 8 * k, h, __ldg(reinterpret_cast<const uint4*>(row + 256 * k + 8 * lane)));
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float* a = acc + 8 * k;
      *reinterpret_cast<uint4*>(y + t * kH + 256 * k + 8 * lane) =
          make_uint4(pack2(a[0], a[1]), pack2(a[2], a[3]), pack2(a[4], a[5]), pack2(a[6], a[7]));
    }
  }
}

static uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

int main(int argc, char** argv) {
  const int M = argc > 1 ? std::atoi(argv[1]) : 131072;
  const int mean_e = argc > 2 ? std::atoi(argv[2]) : 28;
  constexpr int kT = 1024;  // tokens a group (counts sorted within it); blocks of 512 and 768 threads cover it in pieces
  std::mt19937_64 rng(1);
  // Weights and entries: uniform neurons, counts mean_e ± 8, h and w in [-1, 1].
  std::vector<uint16_t> wd(size_t(kI) * kH);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& v : wd) v = to_bf16(u(rng));
  std::vector<uint8_t> count(M);
  std::vector<uint32_t> entries(size_t(kMaxE) * size_t(M), 0u);
  std::uniform_int_distribution<int> cnt_d(std::max(1, std::min(kMaxE, mean_e) - 8), std::min(kMaxE, mean_e + 8));
  std::uniform_int_distribution<int> n_d(0, kI - 1);
  // Tokens of each group of kT sorted by count, descending (the real kernel would sort on the GPU).
  std::vector<int> counts_raw(M);
  for (auto& c : counts_raw) c = cnt_d(rng);
  for (int g = 0; g < M; g += kT) std::sort(counts_raw.begin() + g, counts_raw.begin() + std::min(M, g + kT), std::greater<>());
  for (int t = 0; t < M; ++t) {
    count[t] = static_cast<uint8_t>(counts_raw[t]);
    std::vector<int> ns;
    while (static_cast<int>(ns.size()) < counts_raw[t]) {
      const int n = n_d(rng);
      if (std::find(ns.begin(), ns.end(), n) == ns.end()) ns.push_back(n);
    }
    std::sort(ns.begin(), ns.end());
    for (int i = 0; i < counts_raw[t]; ++i) entries[size_t(i) * size_t(M) + size_t(t)] = uint32_t{to_bf16(u(rng))} << 16 | ns[i];
  }
  uint32_t* d_e;
  uint8_t* d_c;
  uint16_t *d_w, *d_y;
  CHECK(cudaMalloc(&d_e, entries.size() * 4));
  CHECK(cudaMalloc(&d_c, count.size()));
  CHECK(cudaMalloc(&d_w, wd.size() * 2));
  CHECK(cudaMalloc(&d_y, size_t(M) * kH * 2));
  CHECK(cudaMemcpy(d_e, entries.data(), entries.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_c, count.data(), count.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_w, wd.data(), wd.size() * 2, cudaMemcpyHostToDevice));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int smem = kI * 2 * 16;
  CHECK(cudaFuncSetAttribute(reuse_down<512>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(reuse_down<768>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(reuse_down<1024>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

  struct Impl {
    const char* name;
    void (*run)(const uint32_t*, const uint8_t*, const uint16_t*, uint16_t*, int, int, int);
  };
  const Impl impls[] = {
      {"gather (warp per token, rows from L2)",
       [](const uint32_t* e, const uint8_t* c, const uint16_t* w, uint16_t* y, int m, int n_sm, int) {
         gather_down<<<n_sm * 8, 256>>>(e, c, w, y, m);
       }},
      {"reuse, 512 tokens a block",
       [](const uint32_t* e, const uint8_t* c, const uint16_t* w, uint16_t* y, int m, int n_sm, int sh) {
         reuse_down<512><<<std::min(n_sm, (m + 511) / 512), 512, sh>>>(e, c, w, y, m);
       }},
      {"reuse, 768 tokens a block",
       [](const uint32_t* e, const uint8_t* c, const uint16_t* w, uint16_t* y, int m, int n_sm, int sh) {
         reuse_down<768><<<std::min(n_sm, (m + 767) / 768), 768, sh>>>(e, c, w, y, m);
       }},
      {"reuse, 1024 tokens a block",
       [](const uint32_t* e, const uint8_t* c, const uint16_t* w, uint16_t* y, int m, int n_sm, int sh) {
         reuse_down<1024><<<std::min(n_sm, (m + 1023) / 1024), 1024, sh>>>(e, c, w, y, m);
       }}};
  double pairs = std::accumulate(counts_raw.begin(), counts_raw.end(), 0.0);
  std::printf("M = %d, H = %d, I = %d, %.1f entries a token\n", M, kH, kI, pairs / M);
  for (const Impl& im : impls) {
    CHECK(cudaMemset(d_y, 0xff, size_t(M) * kH * 2));  // poison: NaN
    im.run(d_e, d_c, d_w, d_y, M, sms, smem);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    // Check 64 sampled tokens against float64.
    double err2 = 0, ref2 = 0;
    std::vector<uint16_t> row(kH);
    for (int s = 0; s < 64; ++s) {
      const int t = static_cast<int>((int64_t{s} * 2654435761u) % M);
      CHECK(cudaMemcpy(row.data(), d_y + size_t(t) * kH, kH * 2, cudaMemcpyDeviceToHost));
      for (int col = 0; col < kH; ++col) {
        double ref = 0;
        for (int i = 0; i < count[t]; ++i) {
          const uint32_t e = entries[size_t(i) * size_t(M) + size_t(t)];
          ref += double(from_bf16(e >> 16)) * from_bf16(wd[size_t(e & 0xffffu) * kH + col]);
        }
        const double d = from_bf16(row[col]) - ref;
        err2 += d * d, ref2 += ref * ref;
      }
    }
    const double rel = std::sqrt(err2 / ref2);
    const bool ok = rel < 8e-3;  // bf16 output rounding is ~2e-3
    if (!ok) {
      std::printf("%-42s rel_err %.2e: WRONG, not timed\n", im.name, rel);
      continue;
    }
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int w = 0; w < 3; ++w) im.run(d_e, d_c, d_w, d_y, M, sms, smem);
    std::vector<float> ms;
    for (int it = 0; it < 20; ++it) {
      CHECK(cudaEventRecord(a));
      im.run(d_e, d_c, d_w, d_y, M, sms, smem);
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float x;
      CHECK(cudaEventElapsedTime(&x, a, b));
      ms.push_back(x);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%-42s rel_err %.2e  median %.3f ms (min %.3f, max %.3f)\n", im.name, rel, ms[10], ms[0], ms[19]);
  }
  return 0;
}
