// Micro-benchmark: where does the fused gate+pack lose to cuBLASLt's gate? (docs/perf.md, FFN
// item 42.) cuBLASLt, autotuned, runs g = ReLU(x Wgᵀ) as nvjet_sm90_tst_176x128 and writes all of g;
// our gate+pack writes only the TwELL, yet took 11% longer at M = 131072 (64 × 256 tiles). This
// separates the GEMM from its epilogue, at both tile shapes of launch_gate_pack:
//   lt        cuBLASLt's gate + ReLU, bf16 g [M, I] written (the dense FFN's first GEMM)
//   pack256   launch_gate_pack, TwELL tile 256: 64 × 256 ping-pong tiles
//   pack176   launch_gate_pack, TwELL tile 176: 128 × 176 ping-pong tiles
//   bare256   the same GEMM kernel as pack256 with an epilogue that writes nothing (the mainloop alone)
//   bare176   the same for pack176
//   relu176   the 128 × 176 GEMM writing ReLU(g) in bf16 from its registers, as lt does
//   relu176l2 relu176 folded onto 128 rows of g (L2-resident: its stores never reach DRAM)
//   alu176    the pack epilogue's register and shuffle work at 128 × 176, nothing stored
//   bulk176   relu176's values staged in shared memory and copied to g by the TMA engine (no st.global)
//   nocount176  pack176 without the row counts (no returning atomics: RowCounts left null)
//   pack176c11, pack256c16  the packs at compression 11 and 16: 16 slots a tile, 64 bytes, whole
//             32-byte sectors (22 slots at C = 8 and T = 176 are 88 bytes: tiles share sectors, which
//             then take partial writes from two CTAs)
// And the attention's QKV GEMM of the 2B model (x Wqkvᵀ, N = 6144: q, k, v of 32 heads of 64; docs/perf.md,
// model items 25-28), whose fused kernel runs the pack's GEMM at 128 × 192 tiles:
//   lt_qkv    cuBLASLt's x Wqkvᵀ, bf16 [M, 6144] written (the unfused path's GEMM, before its RoPE kernel)
//   qkv192    launch_qkv_rope: q rotated, k rotated and v written to the caches (sequences of 2048)
//   bare192   the same GEMM kernel with no epilogue
// Wqkv is the gate's 5632 rows and the up projection's first 512.
// Correct first: the two packs' TwELL must be bitwise equal to each other tile by tile for the
// first rows, both non-zero totals within 0.1% of lt's g (the GEMMs add in different orders), and
// relu176's g within one bf16 rounding of lt's on the first rows, bulk176's g bitwise relu176's,
// and qkv192's v (not rotated) within one bf16 rounding of lt_qkv's. Then two timings, CUDA events
// around each launch:
//   hot   the kernels in turn, call by call, back to back (3 warm-ups, the median of 25 calls each):
//         all at the same clocks, at this size the board's power cap;
//   cold  each call after 100 ms idle (the median of 8 each): at the clocks of an idle board, so
//         an epilogue that costs time only through the power it draws costs little here, and
//         one that stalls the tensor cores costs the same.
// Built as twell_micro_gate_tiles with TWELL_CUDA; run: twell_micro_gate_tiles [M = 131072].
#include "cuda/kernels/bulk_copy.cuh"
#include "cuda/kernels/sm90_register_epilogue.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cublaslt_gemm.h"
#include "synthetic.h"
#include "twell/cuda/twell_device.h"

namespace twell {
namespace {

using namespace cute;

struct SinkParams {
  uint16_t* g = nullptr;  // relu: g [M, ld] written; bare: never written (see below)
  int64_t M = 0, ld = 0;
};

// What the sink epilogues do with a tile's accumulators:
//   bare    nothing leaves the registers. The store under a condition no accumulator meets (TMA
//           reads x and W as they are; none is 3.0e38) keeps the compiler from seeing them unused.
//   relu    ReLU(acc) in bf16 to g, from the registers (a quad's 4 lanes: 16 contiguous bytes a row).
//   relu_l2 the same stores into 128 rows of g only (row mod 128): 1.4 MB that stay in L2.
//   relu_bulk the same values through shared memory: each warp writes 8 rows of its tile (st.shared,
//           rows padded to 368 bytes: no bank conflicts), then 8 of its lanes copy a row each to g by
//           the TMA engine (cp.async.bulk, 352 bytes); no st.global. 128 × 176 tiles only.
//   alu     the pack epilogue's register work as item 42 measured it (bf16 pairs by compares and
//           selects, the quad's masks by shuffles, the count, each non-zero's rank) with no store:
//           what its instructions cost without its memory (item 43 made the kernel's cheaper).
enum class Sink { bare, relu, relu_l2, alu, relu_bulk };

__device__ __forceinline__ uint64_t bits_below(int n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

template <Sink kSink>
class SinkEpilogue : public cuda::sm90::RegisterEpilogue<SinkParams> {
 public:
  // relu_bulk's stage: 8 rows of 176 bf16 (352 bytes, padded to 368) for each of the 8 consumer warps.
  static constexpr int kBulkPitch = 176 * 2 + 16;
  struct SharedStorage {
    alignas(128) char stage[kSink == Sink::relu_bulk ? 8 * 8 * kBulkPitch : 16];
  };
  CUTLASS_HOST_DEVICE SinkEpilogue(Params const& p, SharedStorage const&) : p_(p) {}
  CUTLASS_HOST_DEVICE explicit SinkEpilogue(Params const& p) : p_(p) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL, BlockShapeMNK, BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& acc, TiledMma tiled_mma, ResidueMNK,
                                 int thread_idx, char* smem) {
    constexpr int kTileM = size<0>(BlockShapeMNK{}), kTileN = size<1>(BlockShapeMNK{});
    if constexpr (kSink == Sink::relu_bulk) {
      static_assert(kTileN == 176, "relu_bulk: 128 x 176 tiles");
      constexpr int kGroups = kTileN / 8, kBlocksM = kTileM / 64;
      const int lane = threadIdx.x % 32, q = lane % 4, r8 = lane / 4;
      const uint32_t stage = cuda::smem_addr(smem) + (threadIdx.x / 32 % 8) * (8 * kBulkPitch);
      auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
      cute::Tensor coords = thr_mma.partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
      const int64_t m0 = int64_t{get<0>(blk_coord_mnkl)} * kTileM, n0 = int64_t{get<1>(blk_coord_mnkl)} * kTileN;
      if (n0 >= p_.ld) return;
      const uint32_t bytes = static_cast<uint32_t>(min(int64_t{kTileN}, p_.ld - n0) * 2);
#pragma unroll
      for (int b = 0; b < kBlocksM; ++b)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // The warp's 8 rows of this (block, half): lane l's row is the warp's first + l / 4.
          const int64_t first = m0 + get<0>(coords(make_coord(make_coord(0, h, 0), b, 0))) - r8;
          if (lane < 8) cuda::wait_bulk_stores_read();  // the stage is free
          __syncwarp();
#pragma unroll
          for (int j = 0; j < kGroups; ++j) {
            const float x = acc(make_coord(make_coord(0, h, j), b, 0)), y = acc(make_coord(make_coord(1, h, j), b, 0));
            const __nv_bfloat162 v = __floats2bfloat162_rn(fmaxf(x, 0.f), fmaxf(y, 0.f));
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(stage + r8 * kBulkPitch + 16 * j + 4 * q),
                         "r"(*reinterpret_cast<const uint32_t*>(&v))
                         : "memory");
          }
          cuda::fence_proxy_async();
          __syncwarp();
          if (lane < 8 && first + lane < p_.M)
            cuda::bulk_store(p_.g + (first + lane) * p_.ld + n0, stage + lane * kBulkPitch, bytes);
        }
      if (lane < 8) cuda::wait_bulk_stores_read();
      __syncwarp();
    } else if constexpr (kSink == Sink::bare) {
      float any = 0.f;
#pragma unroll
      for (int i = 0; i < size(acc); ++i) any = fmaxf(any, acc(i));
      if (any == 3.0e38f) p_.g[0] = 1;
    } else if constexpr (kSink == Sink::alu) {
      constexpr int kGroups = kTileN / 8, kBlocksM = kTileM / 64;
      const int lane = threadIdx.x % 32;
      auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
      cute::Tensor coords = thr_mma.partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
      const int q = get<1>(coords(0)) / 2;
      uint32_t sink = 0;
#pragma unroll
      for (int b = 0; b < kBlocksM; ++b)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t pairs[kGroups];
          uint64_t mask = 0;
#pragma unroll
          for (int j = 0; j < kGroups; ++j) {
            const float x = acc(make_coord(make_coord(0, h, j), b, 0)), y = acc(make_coord(make_coord(1, h, j), b, 0));
            const __nv_bfloat162 v = __floats2bfloat162_rn(x > 0.f || x != x ? x : 0.f, y > 0.f || y != y ? y : 0.f);
            pairs[j] = *reinterpret_cast<const uint32_t*>(&v);
            mask |= uint64_t{(pairs[j] & 0xffffu) != 0} << (2 * j) | uint64_t{(pairs[j] >> 16) != 0} << (2 * j + 1);
          }
          uint64_t quad[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int src = (lane & ~3) | k;
            quad[k] = uint64_t{__shfl_sync(0xffffffffu, static_cast<uint32_t>(mask), src)} |
                      uint64_t{__shfl_sync(0xffffffffu, static_cast<uint32_t>(mask >> 32), src)} << 32;
          }
          sink += __popcll(quad[0]) + __popcll(quad[1]) + __popcll(quad[2]) + __popcll(quad[3]);
          for (uint64_t m = mask; m; m &= m - 1) {
            const int bit = __ffsll(static_cast<long long>(m)) - 1, j = bit / 2;
            uint32_t pos = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) pos += __popcll(quad[k] & bits_below(k < q ? 2 * j + 2 : k == q ? bit : 2 * j));
            uint32_t pair = 0;
#pragma unroll
            for (int jj = 0; jj < kGroups; ++jj) pair = jj == j ? pairs[jj] : pair;
            sink += pos ^ pair;
          }
        }
      if (sink == 0xdeadbeefu) p_.g[0] = 1;
    } else {
      auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
      cute::Tensor coords = thr_mma.partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
      const int64_t m0 = int64_t{get<0>(blk_coord_mnkl)} * kTileM, n0 = int64_t{get<1>(blk_coord_mnkl)} * kTileN;
#pragma unroll
      for (int i = 0; i < size(acc); i += 2) {
        int64_t r = m0 + get<0>(coords(i));
        const int64_t c = n0 + get<1>(coords(i));
        if constexpr (kSink == Sink::relu_l2) r %= 128;
        if (r < p_.M && c < p_.ld) {
          const __nv_bfloat162 v = __floats2bfloat162_rn(fmaxf(acc(i), 0.f), fmaxf(acc(i + 1), 0.f));
          *reinterpret_cast<__nv_bfloat162*>(p_.g + r * p_.ld + c) = v;
        }
      }
    }
  }

 private:
  Params p_;
};

template <int TileM, int TileN, Sink kSink>
using SinkGemm = typename cuda::sm90::PingPongGemm<SinkEpilogue<kSink>, TileM, TileN>::Gemm;

template <class Gemm>
struct SinkRun {
  cuda::DeviceBuffer workspace;
  typename Gemm::Arguments args;
  SinkRun(const void* x, const void* w, int M, int I, int H, SinkParams p, int sms)
      : args(cuda::sm90::gemm_arguments<Gemm>(x, w, M, I, H, p, sms)) {
    workspace = cuda::DeviceBuffer(std::max<size_t>(Gemm::get_workspace_size(args), 1));
  }
  void operator()(cudaStream_t s) {
    cuda::sm90::run_gemm<Gemm>(args, workspace.get(), workspace.bytes(), s, "micro GEMM");
  }
};

// One launch_gate_pack setup: the TwELL, its counters (zeroed before each call, untimed).
struct PackRun {
  cuda::TwellDeviceMatrix act;
  cuda::DeviceBuffer counters, row_nnz, heavy, workspace;
  cuda::GatePackArgs a;
  PackRun(const void* x, const void* w, int64_t M, int64_t H, int64_t I, int32_t tile, int sms, int32_t c = 8)
      : act(TwellLayout{M, I, tile, c}),
        counters((cuda::kNnzCounters + 2) * 8),
        row_nnz(M * 4),
        heavy(M * 4) {
    auto* nnz = counters.as<unsigned long long>();
    a.x = static_cast<const uint16_t*>(x), a.w = static_cast<const uint16_t*>(w);
    a.M = M, a.H = H, a.I = I;
    a.act = act.view();
    a.nnz_total = nnz;
    a.overflow = reinterpret_cast<unsigned int*>(nnz + cuda::kNnzCounters);
    a.rows = {row_nnz.as<uint32_t>(), heavy.as<uint32_t>(), reinterpret_cast<uint32_t*>(nnz + cuda::kNnzCounters + 1)};
    workspace = cuda::DeviceBuffer(std::max<size_t>(cuda::gate_pack_workspace_bytes(a, sms), 1));
  }
  void reset(cudaStream_t s) {
    TWELL_CUDA_CHECK(cudaMemsetAsync(counters.get(), 0, counters.bytes(), s));
    TWELL_CUDA_CHECK(cudaMemsetAsync(row_nnz.get(), 0, row_nnz.bytes(), s));
    TWELL_CUDA_CHECK(cudaMemsetAsync(act.view().n_backup, 0, 4, s));
  }
  void operator()(cudaStream_t s) {
    cuda::launch_gate_pack(a, workspace.get(), workspace.bytes(), cuda::device_info().sm_count, s);
  }
  int64_t nnz() const {
    std::vector<unsigned long long> c(cuda::kNnzCounters + 2);
    TWELL_CUDA_CHECK(cudaMemcpy(c.data(), counters.get(), counters.bytes(), cudaMemcpyDeviceToHost));
    int64_t n = 0;
    for (int i = 0; i < cuda::kNnzCounters; ++i) n += static_cast<int64_t>(c[i]);
    TWELL_REQUIRE(c[cuda::kNnzCounters] == 0, "gate+pack: the backup overflowed");
    return n;
  }
};

struct Kernel {
  std::string name;
  std::function<void(cudaStream_t)> reset, run;
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

std::vector<uint16_t> rows_of(const uint16_t* g, int64_t row0, int64_t rows, int64_t cols) {
  std::vector<uint16_t> h(rows * cols);
  TWELL_CUDA_CHECK(cudaMemcpy(h.data(), g + row0 * cols, h.size() * 2, cudaMemcpyDeviceToHost));
  return h;
}

int run(int argc, char** argv) {
  const int64_t M = argc > 1 ? std::atoll(argv[1]) : 131072, H = 2048, I = 5632;
  TWELL_REQUIRE(M >= 128, "usage: twell_micro_gate_tiles [M >= 128]");
  const int sms = cuda::device_info().sm_count;
  std::printf("gate tiles: M = %lld, H = %lld, I = %lld, 0.5%% uniform (synthetic, as twell bench ffn)\n",
              static_cast<long long>(M), static_cast<long long>(H), static_cast<long long>(I));
  const bench::SyntheticFfn f = bench::make_synthetic_ffn({M, H, I, 0.005, bench::Distribution::uniform, true, 1});
  cuda::DeviceTensor x = cuda::DeviceTensor::upload(f.x), wg = cuda::DeviceTensor::upload(f.wg);
  const void* xp = x.view().data;
  const void* wp = wg.view().data;
  cuda::DeviceBuffer g_lt(M * I * 2), g_relu(M * I * 2), g_bulk(M * I * 2);
  TWELL_CUDA_CHECK(cudaMemset(g_bulk.get(), 0xff, g_bulk.bytes()));  // NaNs where it would not write
  cudaStream_t s = nullptr;
  cuda::LtGemm lt;
  PackRun p256(xp, wp, M, H, I, 256, sms), p176(xp, wp, M, H, I, 176, sms), nocount(xp, wp, M, H, I, 176, sms);
  nocount.a.rows = {};
  PackRun p176c11(xp, wp, M, H, I, 176, sms, 11), p256c16(xp, wp, M, H, I, 256, sms, 16);
  SinkRun<SinkGemm<64, 256, Sink::bare>> bare256(xp, wp, int(M), int(I), int(H), {g_relu.as<uint16_t>(), M, I}, sms);
  SinkRun<SinkGemm<128, 176, Sink::bare>> bare176(xp, wp, int(M), int(I), int(H), {g_relu.as<uint16_t>(), M, I}, sms);
  SinkRun<SinkGemm<128, 176, Sink::relu>> relu176(xp, wp, int(M), int(I), int(H), {g_relu.as<uint16_t>(), M, I}, sms);
  SinkRun<SinkGemm<128, 176, Sink::relu_l2>> relu176l2(xp, wp, int(M), int(I), int(H), {g_relu.as<uint16_t>(), M, I},
                                                        sms);
  SinkRun<SinkGemm<128, 176, Sink::relu_bulk>> bulk176(xp, wp, int(M), int(I), int(H),
                                                       {g_bulk.as<uint16_t>(), M, I}, sms);
  SinkRun<SinkGemm<128, 176, Sink::alu>> alu176(xp, wp, int(M), int(I), int(H), {g_relu.as<uint16_t>(), M, I}, sms);
  auto run_lt = [&](cudaStream_t st) {
    lt.run(xp, wp, g_lt.get(), M, I, H, true, cuda::GemmEpilogue::relu, st);
  };

  // The QKV GEMM: Wqkv = Wg's rows, then Wu's first 512.
  const int64_t N = 6144, hd = 64, S = std::min<int64_t>(M, 2048);
  TWELL_REQUIRE(M % S == 0, "gate tiles: M must be a multiple of ", S, " (the QKV GEMM's sequences)");
  cuda::DeviceBuffer wqkv(N * H * 2), qkv_lt(M * N * 2), qkv_out(M * N * 2), k_cache(M * 2048 * 2),
      v_cache(M * 2048 * 2), cos_sin(S * hd * 4), p0(4);
  TWELL_CUDA_CHECK(cudaMemcpy(wqkv.get(), f.wg.view().data, I * H * 2, cudaMemcpyHostToDevice));
  TWELL_CUDA_CHECK(cudaMemcpy(wqkv.as<uint16_t>() + I * H, f.wu.view().data, (N - I) * H * 2, cudaMemcpyHostToDevice));
  {
    std::vector<float> cs(S * hd);
    for (int64_t pos = 0; pos < S; ++pos)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double a = double(pos) * std::pow(10000.0, -2.0 * double(i) / double(hd));
        cs[pos * hd + i] = float(std::cos(a)), cs[pos * hd + hd / 2 + i] = float(std::sin(a));
      }
    TWELL_CUDA_CHECK(cudaMemcpy(cos_sin.get(), cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    TWELL_CUDA_CHECK(cudaMemset(p0.get(), 0, 4));
  }
  cuda::QkvRopeArgs qa;
  qa.x = static_cast<const uint16_t*>(xp), qa.w = wqkv.as<uint16_t>(), qa.H = H;
  qa.rope.qkv = qkv_out.as<uint16_t>();
  qa.rope.k_cache = k_cache.as<uint16_t>(), qa.rope.v_cache = v_cache.as<uint16_t>();
  qa.rope.cos_sin = cos_sin.as<float>(), qa.rope.p0 = p0.as<int32_t>();
  qa.rope.T = M, qa.rope.S = S, qa.rope.max_context = S, qa.rope.nh = 32, qa.rope.nkv = 32, qa.rope.hd = int(hd);
  cuda::DeviceBuffer qkv_ws(std::max<size_t>(cuda::qkv_rope_workspace_bytes(qa, sms), 1));
  auto run_lt_qkv = [&](cudaStream_t st) {
    lt.run(xp, wqkv.get(), qkv_lt.get(), M, N, H, true, cuda::GemmEpilogue::none, st);
  };
  auto run_qkv = [&](cudaStream_t st) { cuda::launch_qkv_rope(qa, qkv_ws.get(), qkv_ws.bytes(), sms, st); };
  SinkRun<SinkGemm<128, 192, Sink::bare>> bare192(xp, wqkv.get(), int(M), int(N), int(H),
                                                  {qkv_lt.as<uint16_t>(), M, N}, sms);
  auto none = [](cudaStream_t) {};

  // Correctness first.
  run_lt(s);
  p256.reset(s), p256(s), p176.reset(s), p176(s), nocount.reset(s), nocount(s), relu176(s), bulk176(s);
  p176c11.reset(s), p176c11(s), p256c16.reset(s), p256c16(s);
  run_lt_qkv(s), run_qkv(s);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  cuda::DeviceBuffer count(8);
  TWELL_CUDA_CHECK(cudaMemset(count.get(), 0, 8));
  cuda::launch_count_sampled_nonzeros(g_lt.as<uint16_t>(), M, I, M, count.as<unsigned long long>(), s);
  unsigned long long n_lt = 0;
  TWELL_CUDA_CHECK(cudaMemcpy(&n_lt, count.get(), 8, cudaMemcpyDeviceToHost));
  const int64_t n256 = p256.nnz(), n176 = p176.nnz(), n_nocount = nocount.nnz(), n176c11 = p176c11.nnz(),
                n256c16 = p256c16.nnz();
  std::printf("non-zeros: lt %llu (%.3f%%), pack256 %lld, pack176 %lld\n", n_lt, 100.0 * n_lt / double(M * I),
              static_cast<long long>(n256), static_cast<long long>(n176));
  bool ok = n256 == n176 && n_nocount == n176 && n176c11 == n176 && n256c16 == n176 &&
            std::fabs(double(n256) - double(n_lt)) <= 1e-3 * double(n_lt);
  // The two packs' values, row by row (their GEMMs add in the same order): unpack the first rows.
  {
    const int64_t rows = 256;
    const TwellMatrix a = p256.act.download(), b = p176.act.download();
    for (int64_t m = 0; m < rows && ok; ++m) {
      std::vector<std::pair<int64_t, uint16_t>> ea, eb;
      a.for_each_in_row(m, [&](int64_t c, uint16_t v) { ea.push_back({c, v}); });
      b.for_each_in_row(m, [&](int64_t c, uint16_t v) { eb.push_back({c, v}); });
      std::sort(ea.begin(), ea.end()), std::sort(eb.begin(), eb.end());
      if (ea != eb) std::printf("row %lld: pack256 and pack176 differ\n", static_cast<long long>(m)), ok = false;
    }
    const std::vector<uint16_t> gl = rows_of(g_lt.as<uint16_t>(), 0, rows, I),
                                gr = rows_of(g_relu.as<uint16_t>(), 0, rows, I);
    int64_t far = 0;
    for (size_t i = 0; i < gl.size(); ++i) {
      const float u = float(bf16::from_bits(gl[i])), v = float(bf16::from_bits(gr[i]));
      if (std::fabs(u - v) > std::ldexp(std::fabs(u), -7) + 1e-3f) ++far;
    }
    if (far) std::printf("relu176: %lld of %zu values beyond a bf16 rounding of lt's\n", static_cast<long long>(far),
                         gl.size()), ok = false;
    // qkv192's v of the first sequence's first rows (cache rows 0..) against lt_qkv's columns 4096..
    const std::vector<uint16_t> ql = rows_of(qkv_lt.as<uint16_t>(), 0, rows, N),
                                vc = rows_of(v_cache.as<uint16_t>(), 0, rows, 2048);
    int64_t far_v = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < 2048; ++c) {
        const float u = float(bf16::from_bits(ql[r * N + 4096 + c])), v = float(bf16::from_bits(vc[r * 2048 + c]));
        if (std::fabs(u - v) > std::ldexp(std::fabs(u), -7) + 1e-3f) ++far_v;
      }
    if (far_v) std::printf("qkv192: %lld of %lld v values beyond a bf16 rounding of lt_qkv's\n",
                           static_cast<long long>(far_v), static_cast<long long>(rows * 2048)), ok = false;
  }
  {  // relu_bulk wrote what relu176 wrote, bit for bit, everywhere
    std::vector<uint16_t> a(M * I), b(M * I);
    TWELL_CUDA_CHECK(cudaMemcpy(a.data(), g_relu.get(), a.size() * 2, cudaMemcpyDeviceToHost));
    TWELL_CUDA_CHECK(cudaMemcpy(b.data(), g_bulk.get(), b.size() * 2, cudaMemcpyDeviceToHost));
    if (a != b) std::printf("relu_bulk: its g differs from relu176's\n"), ok = false;
  }
  TWELL_REQUIRE(ok, "gate tiles: the kernels disagree; not timed");
  std::printf("correct: the packs agree with each other and with lt's count; relu176 matches lt's g, qkv192's v "
              "lt_qkv's\n");

  std::vector<Kernel> ks = {{"lt (cuBLASLt gate + ReLU)", none, run_lt},
                            {"pack256 (64 x 256)", [&](cudaStream_t st) { p256.reset(st); }, std::ref(p256)},
                            {"pack176 (128 x 176)", [&](cudaStream_t st) { p176.reset(st); }, std::ref(p176)},
                            {"bare256", none, std::ref(bare256)},
                            {"bare176", none, std::ref(bare176)},
                            {"relu176", none, std::ref(relu176)}};
  ks.push_back({"nocount176", [&](cudaStream_t st) { nocount.reset(st); }, std::ref(nocount)});
  ks.push_back({"pack176c11", [&](cudaStream_t st) { p176c11.reset(st); }, std::ref(p176c11)});
  ks.push_back({"pack256c16", [&](cudaStream_t st) { p256c16.reset(st); }, std::ref(p256c16)});
  ks.push_back({"relu176l2", none, std::ref(relu176l2)});
  ks.push_back({"alu176", none, std::ref(alu176)});
  ks.push_back({"bulk176 (relu176 by TMA)", none, std::ref(bulk176)});
  ks.push_back({"lt_qkv (cuBLASLt, N = 6144)", none, run_lt_qkv});
  ks.push_back({"qkv192 (fused QKV + RoPE)", none, run_qkv});
  ks.push_back({"bare192 (N = 6144)", none, std::ref(bare192)});
  cudaEvent_t e0, e1;
  TWELL_CUDA_CHECK(cudaEventCreate(&e0));
  TWELL_CUDA_CHECK(cudaEventCreate(&e1));
  auto time_one = [&](Kernel& k) {
    k.reset(s);
    TWELL_CUDA_CHECK(cudaEventRecord(e0, s));
    k.run(s);
    TWELL_CUDA_CHECK(cudaEventRecord(e1, s));
    TWELL_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TWELL_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return ms;
  };
  std::vector<std::vector<float>> hot(ks.size()), cold(ks.size());
  for (int i = 0; i < 3 + 25; ++i)
    for (size_t k = 0; k < ks.size(); ++k) {
      const float ms = time_one(ks[k]);
      if (i >= 3) hot[k].push_back(ms);
    }
  for (int i = 0; i < 8; ++i)
    for (size_t k = 0; k < ks.size(); ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      cold[k].push_back(time_one(ks[k]));
    }
  const float hot_base = median(hot[0]), cold_base = median(cold[0]);
  std::printf("%-28s %9s %6s %9s %6s\n", "kernel (ms, median)", "hot", "x lt", "cold", "x lt");
  for (size_t k = 0; k < ks.size(); ++k)
    std::printf("%-28s %9.3f %6.3f %9.3f %6.3f\n", ks[k].name.c_str(), median(hot[k]), median(hot[k]) / hot_base,
                median(cold[k]), median(cold[k]) / cold_base);
  return 0;
}

}  // namespace
}  // namespace twell

int main(int argc, char** argv) {
  try {
    return twell::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
