// Micro-benchmark of the reuse design for the FFN's sparse passes (docs/perf.md, "Next steps for
// the FFN forward", 1). Down: y[t] = Σ_e h[t, e] · Wd[n[t, e]] over each token's active entries;
// up: u[t, e] = x[t] · Wu[n[t, e]] for each of them (the same weights stand for both). Each is computed
//   gather  a warp per token, each entry's 4 KB row of Wd read from L2 (today's design's traffic)
//   reuse   a thread per token, T tokens a block, Wd streamed through shared memory 16 columns at a
//           time for all I rows: each chunk is read from L2 once per block and serves T·d entries
//           a row; entries in registers, the block's tokens sorted by entry count so that a warp's
//           loop bound is its own maximum.
// (For up: the gather holds x in registers and reduces each dot product across the warp; the reuse
// kernel keeps a token's 16-column x chunk and up to kMaxE dot products in registers, 512 threads.)
// All are checked against a float64 reference on sampled tokens before they are timed (CUDA
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

// 16-byte slot of chunk piece r (row r / 2, half r % 2): without the swizzle the two halves of a
// row only ever use 4 of the 8 slots of a 128-byte bank line. swz(2n + 1) = swz(2n) ^ 1.
__device__ __forceinline__ uint32_t swz(uint32_t r) { return r ^ ((r >> 3) & 1u); }

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
template <int kT, bool kSwizzle>
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
        chunk[kSwizzle ? swz(r) : r] = __ldg(reinterpret_cast<const uint4*>(wd + int64_t{r / 2} * kH + c + (r % 2) * 8));
      __syncthreads();
      float acc[kHc] = {};
#pragma unroll
      for (int i = 0; i < kMaxE; ++i) {
        if (i < bound) {
          const uint32_t first = 2 * (e[i] & 0xffffu), slot = kSwizzle ? swz(first) : first;  // second: slot ^ 1
          const float h = bf(e[i] >> 16);  // 0 past the token's count
          fma8(acc, h, chunk[slot]);
          fma8(acc + 8, h, chunk[slot ^ 1u]);
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

// up, reuse: a thread per token keeps its dot products in registers across the chunks.
template <int kT, bool kSwizzle>
__global__ __launch_bounds__(kT, 1) void reuse_up(const uint32_t* entries, const uint8_t* count, const uint16_t* wu,
                                                  const uint16_t* x, float* u, int M) {
  extern __shared__ uint4 chunk[];  // [kI][2]
  for (int64_t group = blockIdx.x; group * kT < M; group += gridDim.x) {
    const int64_t t = group * kT + threadIdx.x;
    const bool live = t < M;
    const int cnt = live ? count[t] : 0;
    uint32_t e[kMaxE];
    float dot[kMaxE];
#pragma unroll
    for (int i = 0; i < kMaxE; ++i) {
      e[i] = live && i < cnt ? __ldg(entries + int64_t{i} * M + t) : 0u;
      dot[i] = 0.f;
    }
    const int bound = __reduce_max_sync(0xffffffffu, cnt);
    for (int c = 0; c < kH; c += kHc) {
      __syncthreads();
      for (int r = threadIdx.x; r < 2 * kI; r += kT)
        chunk[kSwizzle ? swz(r) : r] = __ldg(reinterpret_cast<const uint4*>(wu + int64_t{r / 2} * kH + c + (r % 2) * 8));
      __syncthreads();
      float xf[kHc];
      {
        const uint4* xp = reinterpret_cast<const uint4*>(x + (live ? t : 0) * kH + c);
        const uint4 q[2] = {__ldg(xp), __ldg(xp + 1)};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t v[4] = {q[h].x, q[h].y, q[h].z, q[h].w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            xf[8 * h + 2 * i] = __uint_as_float(v[i] << 16);
            xf[8 * h + 2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kMaxE; ++i) {
        if (i < bound) {
          const uint32_t first = 2 * (e[i] & 0xffffu), slot = kSwizzle ? swz(first) : first;  // second: slot ^ 1
          const uint4 w[2] = {chunk[slot], chunk[slot ^ 1u]};
          float s = dot[i];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t v[4] = {w[h].x, w[h].y, w[h].z, w[h].w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              s = fmaf(xf[8 * h + 2 * k], __uint_as_float(v[k] << 16), s);
              s = fmaf(xf[8 * h + 2 * k + 1], __uint_as_float(v[k] & 0xffff0000u), s);
            }
          }
          dot[i] = s;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kMaxE; ++i)
      if (live && i < cnt) u[int64_t{i} * M + t] = dot[i];
  }
}

// up, gather: a warp per token, x in registers (lane l: columns 8l + 256k), a row per entry.
__global__ __launch_bounds__(256) void gather_up(const uint32_t* entries, const uint8_t* count, const uint16_t* wu,
                                                 const uint16_t* x, float* u, int M) {
  const int lane = threadIdx.x % 32;
  for (int64_t t = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32; t < M; t += int64_t{gridDim.x} * blockDim.x / 32) {
    uint4 xq[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) xq[k] = __ldg(reinterpret_cast<const uint4*>(x + t * kH + 256 * k + 8 * lane));
    const int cnt = count[t];
    for (int i = 0; i < cnt; ++i) {
      const uint32_t e = __ldg(entries + int64_t{i} * M + t);
      const uint16_t* row = wu + int64_t(e & 0xffffu) * kH;
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(row + 256 * k + 8 * lane));
        const uint32_t wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {xq[k].x, xq[k].y, xq[k].z, xq[k].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          s = fmaf(__uint_as_float(xv[j] << 16), __uint_as_float(wv[j] << 16), s);
          s = fmaf(__uint_as_float(xv[j] & 0xffff0000u), __uint_as_float(wv[j] & 0xffff0000u), s);
        }
      }
#pragma unroll
      for (int d = 16; d >= 1; d /= 2) s += __shfl_xor_sync(0xffffffffu, s, d);
      if (lane == 0) u[int64_t{i} * M + t] = s;
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
  const int mean_e = std::clamp(argc > 2 ? std::atoi(argv[2]) : 28, 9, kMaxE - 8);
  constexpr int kT = 1024;  // tokens a group (counts sorted within it); blocks of 512 and 768 threads cover it in pieces
  std::mt19937_64 rng(1);
  // Weights and entries: uniform neurons, counts mean_e ± 8, h and w in [-1, 1].
  std::vector<uint16_t> wd(size_t(kI) * kH);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& v : wd) v = to_bf16(u(rng));
  std::vector<uint8_t> count(M);
  std::vector<uint32_t> entries(size_t(kMaxE) * size_t(M), 0u);
  std::uniform_int_distribution<int> cnt_d(mean_e - 8, mean_e + 8);
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
  CHECK(cudaFuncSetAttribute(reuse_down<512, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(reuse_down<512, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(reuse_down<768, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(reuse_down<1024, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

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
         reuse_down<512, false><<<std::min(n_sm, (m + 511) / 512), 512, sh>>>(e, c, w, y, m);
       }},
      {"reuse, 512 tokens a block, swizzled",
       [](const uint32_t* e, const uint8_t* c, const uint16_t* w, uint16_t* y, int m, int n_sm, int sh) {
         reuse_down<512, true><<<std::min(n_sm, (m + 511) / 512), 512, sh>>>(e, c, w, y, m);
       }},
      {"reuse, 768 tokens a block",
       [](const uint32_t* e, const uint8_t* c, const uint16_t* w, uint16_t* y, int m, int n_sm, int sh) {
         reuse_down<768, false><<<std::min(n_sm, (m + 767) / 768), 768, sh>>>(e, c, w, y, m);
       }},
      {"reuse, 1024 tokens a block",
       [](const uint32_t* e, const uint8_t* c, const uint16_t* w, uint16_t* y, int m, int n_sm, int sh) {
         reuse_down<1024, false><<<std::min(n_sm, (m + 1023) / 1024), 1024, sh>>>(e, c, w, y, m);
       }}};
  double pairs = std::accumulate(counts_raw.begin(), counts_raw.end(), 0.0);
  std::printf("M = %d, H = %d, I = %d, %.1f entries a token, %d SMs\n", M, kH, kI, pairs / M, sms);
  for (int t : {512, 768, 1024}) {  // a block per SM (176 KB of shared memory): groups per SM decide the balance
    const int groups = (M + t - 1) / t, rounds = (groups + sms - 1) / sms;
    std::printf("  reuse at %4d tokens a block: %d groups over %d SMs, %.0f%% of the SM time busy\n", t, groups, sms,
                100.0 * groups / (double(rounds) * sms));
  }
  for (const Impl& im : impls) {
    CHECK(cudaMemset(d_y, 0xff, size_t(M) * kH * 2));  // poison: NaN
    im.run(d_e, d_c, d_w, d_y, M, sms, smem);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    // Check 64 sampled tokens against float64.
    double err2 = 0, ref2 = 0;
    std::vector<uint16_t> row(kH);
    for (int s = 0; s < 66; ++s) {  // 64 spread tokens, the last one and the last of the first group
      const int t = s == 64 ? M - 1 : s == 65 ? std::min(M, 1024) - 1 : static_cast<int>((int64_t{s} * 2654435761u) % M);
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
    // Every output written: no poison (0xffff) left anywhere in y.
    std::vector<uint16_t> all(size_t(M) * kH);
    CHECK(cudaMemcpy(all.data(), d_y, all.size() * 2, cudaMemcpyDeviceToHost));
    const auto unwritten = std::count(all.begin(), all.end(), uint16_t{0xffff});
    const bool ok = rel < 8e-3 && unwritten == 0;  // bf16 output rounding is ~2e-3
    if (!ok) {
      std::printf("%-42s rel_err %.2e, %lld outputs unwritten: WRONG, not timed\n", im.name, rel,
                  static_cast<long long>(unwritten));
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
    CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    std::printf("%-42s rel_err %.2e  median %.3f ms (min %.3f, max %.3f)\n", im.name, rel, ms[10], ms[0], ms[19]);
  }
  // up: x [M, H] in [-1, 1], u [kMaxE][M] f32.
  {
    std::vector<uint16_t> x(size_t(M) * kH);
    for (auto& v : x) v = to_bf16(u(rng));
    uint16_t* d_x;
    float* d_u;
    CHECK(cudaMalloc(&d_x, x.size() * 2));
    CHECK(cudaMalloc(&d_u, size_t(kMaxE) * M * 4));
    CHECK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaFuncSetAttribute(reuse_up<512, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(reuse_up<512, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    struct UpImpl {
      const char* name;
      void (*run)(const uint32_t*, const uint8_t*, const uint16_t*, const uint16_t*, float*, int, int, int);
    };
    const UpImpl ups[] = {
        {"up gather (warp per token, rows from L2)",
         [](const uint32_t* e, const uint8_t* c, const uint16_t* w, const uint16_t* xx, float* uu, int m, int n_sm, int) {
           gather_up<<<n_sm * 8, 256>>>(e, c, w, xx, uu, m);
         }},
        {"up reuse, 512 tokens a block",
         [](const uint32_t* e, const uint8_t* c, const uint16_t* w, const uint16_t* xx, float* uu, int m, int n_sm, int sh) {
           reuse_up<512, false><<<std::min(n_sm, (m + 511) / 512), 512, sh>>>(e, c, w, xx, uu, m);
         }},
        {"up reuse, 512 tokens a block, swizzled",
         [](const uint32_t* e, const uint8_t* c, const uint16_t* w, const uint16_t* xx, float* uu, int m, int n_sm, int sh) {
           reuse_up<512, true><<<std::min(n_sm, (m + 511) / 512), 512, sh>>>(e, c, w, xx, uu, m);
         }}};
    for (const UpImpl& im : ups) {
      CHECK(cudaMemset(d_u, 0xff, size_t(kMaxE) * M * 4));  // poison: NaN
      im.run(d_e, d_c, d_w, d_x, d_u, M, sms, smem);
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      double err2 = 0, ref2 = 0;
      for (int s = 0; s < 258; ++s) {
        const int t = s == 256 ? M - 1 : s == 257 ? std::min(M, 512) - 1 : static_cast<int>((int64_t{s} * 2654435761u) % M);
        for (int i = 0; i < count[t]; ++i) {
          float got;
          CHECK(cudaMemcpy(&got, d_u + size_t(i) * M + t, 4, cudaMemcpyDeviceToHost));
          const uint32_t e = entries[size_t(i) * size_t(M) + size_t(t)];
          double ref = 0;
          for (int k = 0; k < kH; ++k) ref += double(from_bf16(x[size_t(t) * kH + k])) * from_bf16(wd[size_t(e & 0xffffu) * kH + k]);
          err2 += (got - ref) * (got - ref), ref2 += ref * ref;
        }
      }
      const double rel = std::sqrt(err2 / ref2);
      if (!(rel < 1e-4)) {  // f32 sums of 2048 exact products: ~1e-6
        std::printf("%-42s rel_err %.2e: WRONG, not timed\n", im.name, rel);
        continue;
      }
      cudaEvent_t a, b;
      CHECK(cudaEventCreate(&a));
      CHECK(cudaEventCreate(&b));
      for (int w = 0; w < 3; ++w) im.run(d_e, d_c, d_w, d_x, d_u, M, sms, smem);
      std::vector<float> ms;
      for (int it = 0; it < 20; ++it) {
        CHECK(cudaEventRecord(a));
        im.run(d_e, d_c, d_w, d_x, d_u, M, sms, smem);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float v;
        CHECK(cudaEventElapsedTime(&v, a, b));
        ms.push_back(v);
      }
      CHECK(cudaGetLastError());
      std::sort(ms.begin(), ms.end());
      std::printf("%-42s rel_err %.2e  median %.3f ms (min %.3f, max %.3f)\n", im.name, rel, ms[10], ms[0], ms[19]);
    }
  }
  return 0;
}
