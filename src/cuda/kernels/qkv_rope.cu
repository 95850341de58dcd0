// qkv_rope: the attention's input projection [q | k | v] = a Wqkvᵀ by a CUTLASS 3 Hopper GEMM (the
// gate_pack.cu kernel: TMA, wgmma, persistent ping-pong, 64 × 256 tiles, 2-CTA clusters) whose
// epilogue applies RoPE and writes k and v straight into the KV cache, from the accumulator
// registers. It replaces cuBLASLt's GEMM followed by rope_kv_kernel, which read the 1.5 GB GEMM
// output back and wrote 1.5 GB again at 131072 tokens.
//
// Rounding: every value is first rounded to bf16 (what the GEMM wrote before), then rotated in
// fp32 without contraction (as rope_kv_kernel and the CPU reference do), then rounded again: the
// unfused path's steps, so the two differ only where the GEMMs' summation orders do.
//
// wgmma's accumulator layout gives a thread columns 8j + 2q + e (j < 32, e < 2) of rows r and r + 8
// of the 64 × 256 tile; RoPE pairs column i of a head with column i + hd/2, i.e. group j with
// j + hd/16: the same thread. A tile lies in one of q, k, v when nh·hd and nkv·hd are multiples
// of 256 (qkv_rope_supported).
#include "cuda/kernels.h"

#include "cuda/kernels/sm90_register_epilogue.cuh"

#include <cuda_bf16.h>

#include "twell/error.h"

namespace twell::cuda {
namespace {

using namespace cute;
using sm90::kTileN;

struct RopeParams {
  uint16_t* qkv = nullptr;  // q goes here (row stride ld); k and v to the caches
  uint16_t* k_cache = nullptr;
  uint16_t* v_cache = nullptr;
  const float* cos_sin = nullptr;
  const int32_t* p0 = nullptr;
  int64_t M = 0;
  int32_t S = 0, max_context = 0, ld = 0, q_dim = 0, kv_dim = 0;
};

__device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float to_bf16_and_back(float a) { return __bfloat162float(__float2bfloat16_rn(a)); }

template <int HD>
class RopeKvEpilogue : public sm90::RegisterEpilogue<RopeParams> {
 public:
  CUTLASS_HOST_DEVICE RopeKvEpilogue(Params const& p, SharedStorage const& = SharedStorage()) : p_(p) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL, BlockShapeMNK, BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& acc, TiledMma tiled_mma, ResidueMNK,
                                 int thread_idx, char*) {
    constexpr int kTileM = size<0>(BlockShapeMNK{});
    static_assert(size<1>(BlockShapeMNK{}) == kTileN);
    static_assert(decltype(size<0, 0>(acc))::value == 2 && decltype(size<0, 1>(acc))::value == 2 &&
                  decltype(size<0, 2>(acc))::value == 32);
    constexpr int kHalf = HD / 2, kPair = kHalf / 8;  // partner column group: j + kPair

    const auto m_coord = get<0>(blk_coord_mnkl), n_coord = get<1>(blk_coord_mnkl);
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    cute::Tensor coords = thr_mma.partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    const int r0 = get<0>(coords(0)), c0 = get<1>(coords(0));
    const int n0 = n_coord * kTileN;
    if (n0 >= p_.q_dim + 2 * p_.kv_dim) return;  // a tile past N (see gate_pack.cu) writes nothing
    // 0: q, 1: k, 2: v (a tile lies in one of them); c: the tile's first column in that part.
    const int part = n0 < p_.q_dim ? 0 : n0 < p_.q_dim + p_.kv_dim ? 1 : 2;
    const int c = part == 0 ? n0 : part == 1 ? n0 - p_.q_dim : n0 - p_.q_dim - p_.kv_dim;
    const int p0 = *p_.p0;

#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = int64_t{m_coord} * kTileM + r0 + 8 * h;
      if (row >= p_.M) continue;
      const int64_t b = row / p_.S;
      const int pos = p0 + static_cast<int>(row % p_.S);
      float x[32][2];
#pragma unroll
      for (int j = 0; j < 32; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) x[j][e] = to_bf16_and_back(acc(make_coord(make_coord(e, h, j), 0, 0)));
      if (part < 2) {
        // cos and sin of this thread's frequencies: columns 8j + c0 + e of a head's first half.
        const float* cs = p_.cos_sin + int64_t{pos} * HD;
        float2 cos_[kPair], sin_[kPair];
#pragma unroll
        for (int k = 0; k < kPair; ++k) {
          cos_[k] = *reinterpret_cast<const float2*>(cs + 8 * k + c0);
          sin_[k] = *reinterpret_cast<const float2*>(cs + kHalf + 8 * k + c0);
        }
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          if ((8 * j) % HD >= kHalf) continue;  // second halves are written with their partners
          const int k = ((8 * j) % HD) / 8;
          const float co[2] = {cos_[k].x, cos_[k].y}, si[2] = {sin_[k].x, sin_[k].y};
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float a = x[j][e], bb = x[j + kPair][e];
            x[j][e] = __fsub_rn(__fmul_rn(a, co[e]), __fmul_rn(bb, si[e]));
            x[j + kPair][e] = __fadd_rn(__fmul_rn(bb, co[e]), __fmul_rn(a, si[e]));
          }
        }
      }
      uint16_t* dst = part == 0 ? p_.qkv + row * p_.ld
                                : (part == 1 ? p_.k_cache : p_.v_cache) + (b * p_.max_context + pos) * p_.kv_dim;
      dst += c + c0;
#pragma unroll
      for (int j = 0; j < 32; ++j) *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack_bf16x2(x[j][0], x[j][1]);
    }
  }

 private:
  Params p_;
};

// gate_pack.cu's kernel configuration. Ping-pong 64 × 256 (4.54 ms at 131072 × 6144 × 2048, ncu)
// beat the cooperative 128 × 256 kernel with this epilogue (4.79-4.85 ms); docs/perf.md, model
// item 13.
template <int HD>
using Gemm = typename sm90::PingPongGemm<RopeKvEpilogue<HD>>::Gemm;

template <int HD>
typename Gemm<HD>::Arguments make_arguments(const QkvRopeArgs& a, int sm_count) {
  const int q_dim = a.rope.nh * a.rope.hd, kv_dim = a.rope.nkv * a.rope.hd;
  const int M = static_cast<int>(a.rope.T), N = q_dim + 2 * kv_dim, K = static_cast<int>(a.H);
  RopeParams p;
  p.qkv = a.rope.qkv, p.k_cache = a.rope.k_cache, p.v_cache = a.rope.v_cache;
  p.cos_sin = a.rope.cos_sin, p.p0 = a.rope.p0, p.M = a.rope.T;
  p.S = static_cast<int32_t>(a.rope.S), p.max_context = static_cast<int32_t>(a.rope.max_context);
  p.ld = N, p.q_dim = q_dim, p.kv_dim = kv_dim;
  return sm90::gemm_arguments<Gemm<HD>>(a.x, a.w, M, N, K, p, sm_count);
}

template <int HD>
size_t workspace_of(const QkvRopeArgs& a, int sm_count) {
  return Gemm<HD>::get_workspace_size(make_arguments<HD>(a, sm_count));
}

template <int HD>
void run(const QkvRopeArgs& a, void* workspace, size_t workspace_bytes, int sm_count, cudaStream_t stream) {
  sm90::run_gemm<Gemm<HD>>(make_arguments<HD>(a, sm_count), workspace, workspace_bytes, stream, "fused QKV+RoPE");
}

}  // namespace

bool qkv_rope_supported(int64_t H, int nh, int nkv, int hd, std::string* why) {
  std::string r;
  if (hd != 64 && hd != 128)
    r = str("head_dim ", hd, " (64 or 128)");
  else if ((int64_t{nh} * hd) % kTileN != 0 || (int64_t{nkv} * hd) % kTileN != 0)
    r = str("q width ", nh * hd, " and k/v width ", nkv * hd, " must be multiples of ", kTileN);
  else if (H % 8 != 0)
    r = str("hidden size ", H, " (a multiple of 8)");
  if (why) *why = r;
  return r.empty();
}

size_t qkv_rope_workspace_bytes(const QkvRopeArgs& a, int sm_count) {
  return a.rope.hd == 64 ? workspace_of<64>(a, sm_count) : workspace_of<128>(a, sm_count);
}

void launch_qkv_rope(const QkvRopeArgs& a, void* workspace, size_t workspace_bytes, int sm_count,
                     cudaStream_t stream) {
  std::string why;
  TWELL_CHECK(qkv_rope_supported(a.H, a.rope.nh, a.rope.nkv, a.rope.hd, &why), "fused QKV+RoPE does not take ", why);
  TWELL_CHECK(a.rope.T >= 1 && a.rope.T <= INT32_MAX && a.H <= INT32_MAX && a.rope.S >= 1 && a.rope.T % a.rope.S == 0,
              "fused QKV+RoPE: ", a.rope.T, " tokens in sequences of ", a.rope.S);
  TWELL_CHECK(reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0,
              "fused QKV+RoPE: x and W must be 16-byte aligned");
  if (a.rope.hd == 64)
    run<64>(a, workspace, workspace_bytes, sm_count, stream);
  else
    run<128>(a, workspace, workspace_bytes, sm_count, stream);
}

}  // namespace twell::cuda
