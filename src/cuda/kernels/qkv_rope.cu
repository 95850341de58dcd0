// qkv_rope: the attention's input projection [q | k | v] = a Wqkvᵀ by a CUTLASS 3 Hopper GEMM (the
// gate_pack.cu kernel: TMA, wgmma, persistent ping-pong, 2-CTA clusters) whose epilogue applies
// RoPE to the accumulators and writes k and v straight into the KV cache (at head_dim 64 through
// shared memory and the TMA engine, model item 29). It replaces
// cuBLASLt's GEMM followed by rope_kv_kernel, which read the 1.5 GB GEMM output back and wrote
// 1.5 GB again at 131072 tokens. Tiles: 128 × 192 at head_dim 64 (three heads; the shape whose
// operands cost the fewest L2 bytes a MAC, as the gate's 128 × 176: docs/perf.md, model item 25),
// 64 × 256 at head_dim 128 (two heads).
//
// Rounding: every value is first rounded to bf16 (what the GEMM wrote before), then rotated in
// fp32 without contraction (as rope_kv_kernel and the CPU reference do), then rounded again: the
// unfused path's steps, so the two differ only where the GEMMs' summation orders do.
//
// wgmma's accumulator layout gives a thread columns 8j + 2q + e (j < TileN / 8, e < 2) of rows r and
// r + 8 of each 64-row block of the tile; RoPE pairs column i of a head with column i + hd/2, i.e.
// group j with j + hd/16: the same thread. A tile holds whole heads (TileN is a multiple of hd),
// each in one of q, k, v.
#include "cuda/kernels.h"

#include "cuda/kernels/bulk_copy.cuh"
#include "cuda/kernels/sm90_register_epilogue.cuh"

#include <cuda_bf16.h>

#include "twell/error.h"

namespace twell::cuda {
namespace {

using namespace cute;

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
  // At head_dim 64 the values leave through shared memory (model item 29): each consumer warp
  // writes 8 rows of its tile (st.shared, rows padded to 400 bytes: no bank conflicts), then 24 of
  // its lanes copy a head's 128 bytes of a row each to q or the caches by the TMA engine
  // (cp.async.bulk). Stores from the registers cost a GEMM ~7% over its bare mainloop, copies by the
  // TMA engine nothing (twell_micro_gate_tiles, bulk176); here the epilogue's cost over the bare GEMM
  // fell from +0.23 to +0.19 ms, and to +0.15 with place_of below (the RoPE's loads and arithmetic
  // remain). 25 KB: the mainloop keeps its 5 stages.
  static constexpr bool kStaged = HD == 64;
  static constexpr int kPitch = 3 * HD * 2 + 16;
  struct SharedStorage {
    alignas(128) char stage[kStaged ? 8 * 8 * kPitch : 16];
  };
  CUTLASS_HOST_DEVICE RopeKvEpilogue(Params const& p, SharedStorage const&) : p_(p) {}
  CUTLASS_HOST_DEVICE explicit RopeKvEpilogue(Params const& p) : p_(p) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL, BlockShapeMNK, BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& acc, TiledMma tiled_mma, ResidueMNK,
                                 int thread_idx, char* smem) {
    constexpr int kTileM = size<0>(BlockShapeMNK{}), kTileN = size<1>(BlockShapeMNK{});
    constexpr int kGroups = kTileN / 8, kBlocksM = kTileM / 64;  // column groups; 64-row wgmma blocks
    static_assert(kTileN % HD == 0 && kTileM % 64 == 0);
    static_assert(decltype(size<0, 0>(acc))::value == 2 && decltype(size<0, 1>(acc))::value == 2 &&
                  decltype(size<0, 2>(acc))::value == kGroups && decltype(size<1>(acc))::value == kBlocksM);
    constexpr int kHeadGroups = HD / 8, kHeads = kTileN / HD;

    const auto m_coord = get<0>(blk_coord_mnkl), n_coord = get<1>(blk_coord_mnkl);
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    cute::Tensor coords = thr_mma.partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    const int c0 = get<1>(coords(0));
    const int n0 = n_coord * kTileN, N = p_.q_dim + 2 * p_.kv_dim;
    if (n0 >= N) return;  // a tile past N (see gate_pack.cu) writes nothing
    const int p0 = *p_.p0;
    if constexpr (kStaged) {
      static_assert(kHeads == 3, "the staged epilogue: 128 x 192 tiles");
      staged(m_coord, n0, p0, c0, acc, coords, smem);
    } else {
#pragma unroll
      for (int blk = 0; blk < kBlocksM; ++blk) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = int64_t{m_coord} * kTileM + get<0>(coords(make_coord(make_coord(0, h, 0), blk, 0)));
          if (row >= p_.M) continue;
          const Place at = place_of(row, p0);
          float2 cos_[kPair], sin_[kPair];
          load_cos_sin(at.pos, c0, cos_, sin_);
#pragma unroll
          for (int head = 0; head < kHeads; ++head) {
            const int hc = n0 + head * HD;  // the head's first column of [q | k | v]
            if (hc >= N) break;             // the last tile's heads past N (TMA read zeros there)
            uint32_t out[kHeadGroups];
            head_values(acc, blk, h, head, hc < p_.q_dim + p_.kv_dim, cos_, sin_, out);
            uint32_t* dst = reinterpret_cast<uint32_t*>(destination(row, hc, at) + c0);
#pragma unroll
            for (int j = 0; j < kHeadGroups; ++j) dst[4 * j] = out[j];
          }
        }
      }
    }
  }

 private:
  static constexpr int kPair = HD / 16;  // RoPE pairs column group j with j + kPair

  // A row's sequence and position in it: by 32-bit division (launch_qkv_rope checks T < 2^31), once a
  // row. The 64-bit divisions before were, by estimate, a third of the staged epilogue's instructions
  // (model item 30).
  struct Place {
    uint32_t b, pos;
  };
  CUTLASS_DEVICE Place place_of(int64_t row, int p0) const {
    const uint32_t r = static_cast<uint32_t>(row), S = static_cast<uint32_t>(p_.S), b = r / S;
    return {b, static_cast<uint32_t>(p0) + (r - b * S)};
  }

  // cos and sin of this thread's frequencies at position pos: columns 8k + c0 + e of a head's first half.
  // Loaded once a row for all the tile's heads: global loads in the epilogue cost the GEMM as stores do.
  CUTLASS_DEVICE void load_cos_sin(uint32_t pos, int c0, float2 (&cos_)[kPair], float2 (&sin_)[kPair]) const {
    const float* cs = p_.cos_sin + int64_t{pos} * HD;
#pragma unroll
    for (int k = 0; k < kPair; ++k) {
      cos_[k] = *reinterpret_cast<const float2*>(cs + 8 * k + c0);
      sin_[k] = *reinterpret_cast<const float2*>(cs + HD / 2 + 8 * k + c0);
    }
  }

  // The head's values of this thread's row-half h of block blk as bf16 pairs: rounded to bf16 (what
  // the GEMM wrote before), then, in q and k, rotated in fp32 and rounded again.
  template <class Acc>
  CUTLASS_DEVICE static void head_values(Acc const& acc, int blk, int h, int head, bool rotate,
                                         const float2 (&cos_)[kPair], const float2 (&sin_)[kPair],
                                         uint32_t (&out)[HD / 8]) {
    constexpr int kHeadGroups = HD / 8;
    float x[kHeadGroups][2];
#pragma unroll
    for (int j = 0; j < kHeadGroups; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        x[j][e] = to_bf16_and_back(acc(make_coord(make_coord(e, h, head * kHeadGroups + j), blk, 0)));
    if (rotate) {
#pragma unroll
      for (int k = 0; k < kPair; ++k) {  // group k of the first half with k + kPair of the second
        const float co[2] = {cos_[k].x, cos_[k].y}, si[2] = {sin_[k].x, sin_[k].y};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float a = x[k][e], bb = x[k + kPair][e];
          x[k][e] = __fsub_rn(__fmul_rn(a, co[e]), __fmul_rn(bb, si[e]));
          x[k + kPair][e] = __fadd_rn(__fmul_rn(bb, co[e]), __fmul_rn(a, si[e]));
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kHeadGroups; ++j) out[j] = pack_bf16x2(x[j][0], x[j][1]);
  }

  // Where row `row` (at `at`) of head column hc (of [q | k | v]) goes.
  CUTLASS_DEVICE uint16_t* destination(int64_t row, int hc, Place at) const {
    if (hc < p_.q_dim) return p_.qkv + row * p_.ld + hc;
    const bool is_k = hc < p_.q_dim + p_.kv_dim;
    const int c = hc - p_.q_dim - (is_k ? 0 : p_.kv_dim);
    return (is_k ? p_.k_cache : p_.v_cache) + (int64_t{at.b} * p_.max_context + at.pos) * p_.kv_dim + c;
  }

  template <class Acc, class Coords>
  CUTLASS_DEVICE void staged(int m_coord, int n0, int p0, int c0, Acc const& acc, Coords const& coords,
                             char* smem) const {
    constexpr int kTileM = 128, kHeads = 3, kHeadGroups = HD / 8;
    const int N = p_.q_dim + 2 * p_.kv_dim;
    const int lane = threadIdx.x % 32, r8 = lane / 4, q = lane % 4;
    const uint32_t stage = smem_addr(smem) + (threadIdx.x / 32 % 8) * (8 * kPitch);
    // The copy lane l issues: row l % 8 of the warp's 8, head l / 8 of the tile's 3.
    const int copy_head = lane / 8, copy_hc = n0 + copy_head * HD;
#pragma unroll
    for (int blk = 0; blk < kTileM / 64; ++blk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = int64_t{m_coord} * kTileM + get<0>(coords(make_coord(make_coord(0, h, 0), blk, 0)));
        const Place at = place_of(row < p_.M ? row : 0, p0);
        float2 cos_[kPair], sin_[kPair];
        load_cos_sin(at.pos, c0, cos_, sin_);
        if (lane < 24) wait_bulk_stores_read();  // the stage is free
        __syncwarp();
#pragma unroll
        for (int head = 0; head < kHeads; ++head) {
          const int hc = n0 + head * HD;
          uint32_t out[kHeadGroups];
          head_values(acc, blk, h, head, hc < p_.q_dim + p_.kv_dim, cos_, sin_, out);
#pragma unroll
          for (int j = 0; j < kHeadGroups; ++j)
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(stage + r8 * kPitch + head * HD * 2 + 16 * j + 4 * q),
                         "r"(out[j])
                         : "memory");
        }
        fence_proxy_async();
        __syncwarp();
        // The copy's row is lane 4 · (lane % 8)'s.
        const int64_t copy_row = row - r8 + lane % 8;
        const Place copy_at = {__shfl_sync(0xffffffffu, at.b, 4 * (lane % 8)),
                               __shfl_sync(0xffffffffu, at.pos, 4 * (lane % 8))};
        if (lane < 24 && copy_row < p_.M && copy_hc < N)
          bulk_store(destination(copy_row, copy_hc, copy_at), stage + (lane % 8) * kPitch + copy_head * HD * 2,
                     HD * 2);
      }
    if (lane < 24) wait_bulk_stores_read();
    __syncwarp();
  }

  Params p_;
};

// gate_pack.cu's kernel configuration. Ping-pong 64 × 256 (4.54 ms at 131072 × 6144 × 2048, ncu)
// beat the cooperative 128 × 256 kernel with this epilogue (4.79-4.85 ms); docs/perf.md, model
// item 13. At head_dim 64, 128 × 192 tiles (model item 25).
template <int HD>
using Gemm = typename sm90::PingPongGemm<RopeKvEpilogue<HD>, HD == 64 ? 128 : 64, HD == 64 ? 192 : 256>::Gemm;

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
  else if (nh < 1 || nkv < 1)
    r = str(nh, " query and ", nkv, " key/value heads");
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
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  TWELL_CHECK(aligned(a.x) && aligned(a.w), "fused QKV+RoPE: x and W must be 16-byte aligned");
  TWELL_CHECK(aligned(a.rope.qkv) && aligned(a.rope.k_cache) && aligned(a.rope.v_cache),
              "fused QKV+RoPE: q and the KV caches must be 16-byte aligned (the TMA engine writes them)");
  if (a.rope.hd == 64)
    run<64>(a, workspace, workspace_bytes, sm_count, stream);
  else
    run<128>(a, workspace, workspace_bytes, sm_count, stream);
}

}  // namespace twell::cuda
