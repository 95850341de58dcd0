// qkv_rope: the attention's input projection [q | k | v] = a Wqkvᵀ by a CUTLASS 3 Hopper GEMM (the
// gate_pack.cu kernel: TMA, wgmma, persistent ping-pong, 2-CTA clusters) whose epilogue applies
// RoPE and writes k and v straight into the KV cache, from the accumulator registers. It replaces
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

// The warp's staging of one head's 16 rows (kStaged below): HD / 8 chunks of 16 bytes a row, chunk k
// of row r at position k ^ (r % 8), so that stmatrix's 8 rows and the 16-byte reads are free of bank
// conflicts.
__device__ __forceinline__ uint32_t staged_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row % 8)) * 16));
}

template <int HD>
class RopeKvEpilogue : public sm90::RegisterEpilogue<RopeParams> {
 public:
  // At head_dim 64 each consumer warp stages a head's 16 x 64 values in shared memory (stmatrix), then
  // writes them as whole 128-byte lines of 16-byte stores (the registers' 4-byte stores wrote each
  // line in eight 16-byte pieces). 16 KB for the 8 consumer warps: the 128 x 192 mainloop keeps its
  // 5 stages. At head_dim 128 the stores stay in registers.
  static constexpr bool kStaged = HD == 64;
  struct SharedStorage {
    alignas(128) char stage[kStaged ? 8 * 16 * HD * 2 : 16];
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
    constexpr int kHalf = HD / 2, kPair = kHalf / 8;  // partner column group: j + kPair
    constexpr int kHeadGroups = HD / 8, kHeads = kTileN / HD;

    const auto m_coord = get<0>(blk_coord_mnkl), n_coord = get<1>(blk_coord_mnkl);
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    cute::Tensor coords = thr_mma.partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    const int c0 = get<1>(coords(0));
    const int n0 = n_coord * kTileN, N = p_.q_dim + 2 * p_.kv_dim;
    if (n0 >= N) return;  // a tile past N (see gate_pack.cu) writes nothing
    const int p0 = *p_.p0;
    const int lane = threadIdx.x % 32;
    // This warp's stage (consumer warps 4-11), as a shared-memory address.
    const uint32_t stage = smem_addr(smem) + (threadIdx.x / 32 % 8) * (16 * HD * 2);

    // Where row `row` of part 0 (q), 1 (k) or 2 (v) goes, less the head's column.
    auto destination = [&](int64_t row, int part) {
      if (part == 0) return p_.qkv + row * p_.ld;
      const int64_t b = row / p_.S;
      const int pos = p0 + static_cast<int>(row % p_.S);
      return (part == 1 ? p_.k_cache : p_.v_cache) + (b * p_.max_context + pos) * p_.kv_dim;
    };
    // cos and sin of this thread's frequencies at `row`: columns 8k + c0 + e of a head's first half.
    auto load_cos_sin = [&](int64_t row, float2 (&cos_)[kPair], float2 (&sin_)[kPair]) {
      const float* cs = p_.cos_sin + int64_t{p0 + static_cast<int>(row % p_.S)} * HD;
#pragma unroll
      for (int k = 0; k < kPair; ++k) {
        cos_[k] = *reinterpret_cast<const float2*>(cs + 8 * k + c0);
        sin_[k] = *reinterpret_cast<const float2*>(cs + kHalf + 8 * k + c0);
      }
    };
    // The head's values in this thread's row-half h of block blk, as bf16 pairs: rounded to bf16
    // (what the GEMM wrote before), then, in q and k, rotated in fp32 and rounded again.
    auto head_values = [&](int blk, int h, int head, int part, const float2 (&cos_)[kPair],
                           const float2 (&sin_)[kPair], uint32_t (&out)[kHeadGroups]) {
      float x[kHeadGroups][2];
#pragma unroll
      for (int j = 0; j < kHeadGroups; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          x[j][e] = to_bf16_and_back(acc(make_coord(make_coord(e, h, head * kHeadGroups + j), blk, 0)));
      if (part < 2) {
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
    };

#pragma unroll
    for (int blk = 0; blk < kBlocksM; ++blk) {
      // This thread's rows: h = 0, 1 (tile rows r and r + 8 of its warp's 16).
      int64_t row[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        row[h] = int64_t{m_coord} * kTileM + get<0>(coords(make_coord(make_coord(0, h, 0), blk, 0)));
      if constexpr (kStaged) {
        const int64_t warp_row = row[0] - lane / 4;  // the warp's first row
        // Lane l writes chunk l % 8 of rows l / 8 + 4i of the warp's 16; their KV-cache rows.
        // (below 2^32: launch_qkv_rope checks the cache's rows)
        uint32_t kv_row[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t g = warp_row + lane / 8 + 4 * i;
          const uint32_t gi = static_cast<uint32_t>(g < p_.M ? g : 0), S = static_cast<uint32_t>(p_.S);
          kv_row[i] = gi / S * static_cast<uint32_t>(p_.max_context) + static_cast<uint32_t>(p0) + gi % S;
        }
#pragma unroll
        for (int head = 0; head < kHeads; ++head) {
          const int hc = n0 + head * HD;  // the head's first column of [q | k | v]
          if (hc >= N) break;             // the last tile's heads past N (TMA read zeros there)
          const int part = hc < p_.q_dim ? 0 : hc < p_.q_dim + p_.kv_dim ? 1 : 2;
          const int c = part == 0 ? hc : part == 1 ? hc - p_.q_dim : hc - p_.q_dim - p_.kv_dim;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float2 cos_[kPair], sin_[kPair];  // again for each head (from L1): fewer registers
            if (part < 2) load_cos_sin(row[h] < p_.M ? row[h] : 0, cos_, sin_);
            uint32_t out[kHeadGroups];
            head_values(blk, h, head, part, cos_, sin_, out);
            // Column groups j .. j + 3 of rows 8h .. 8h + 7 as the four 8 x 8 matrices of stmatrix.x4:
            // lane 8i + r names row r of matrix i, and a thread's register i holds its pair of matrix i
            // (row lane / 4, columns 2 (lane % 4) and the next), as the accumulator layout has it.
#pragma unroll
            for (int j = 0; j < kHeadGroups; j += 4) {
              const uint32_t addr = stage + staged_offset(8 * h + lane % 8, j + lane / 8);
              asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                           "r"(out[j]), "r"(out[j + 1]), "r"(out[j + 2]), "r"(out[j + 3])
                           : "memory");
            }
          }
          __syncwarp();
          // Four whole rows a store instruction.
          uint16_t* base = part == 0 ? p_.qkv : part == 1 ? p_.k_cache : p_.v_cache;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int r = lane / 8 + 4 * i, chunk = lane % 8;
            const int64_t g = warp_row + r;
            uint4 v;
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "r"(stage + staged_offset(r, chunk))
                         : "memory");
            const int64_t dst_row = part == 0 ? g * p_.ld : int64_t{kv_row[i]} * p_.kv_dim;
            if (g < p_.M)
              asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(base + dst_row + c + 8 * chunk), "r"(v.x),
                           "r"(v.y), "r"(v.z), "r"(v.w)
                           : "memory");
          }
          __syncwarp();  // every lane has read the stage before the next head writes it
        }
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (row[h] >= p_.M) continue;
          float2 cos_[kPair], sin_[kPair];
          load_cos_sin(row[h], cos_, sin_);
#pragma unroll
          for (int head = 0; head < kHeads; ++head) {
            const int hc = n0 + head * HD;
            if (hc >= N) break;
            const int part = hc < p_.q_dim ? 0 : hc < p_.q_dim + p_.kv_dim ? 1 : 2;
            const int c = part == 0 ? hc : part == 1 ? hc - p_.q_dim : hc - p_.q_dim - p_.kv_dim;
            uint32_t out[kHeadGroups];
            head_values(blk, h, head, part, cos_, sin_, out);
            uint16_t* dst = destination(row[h], part) + c + c0;
#pragma unroll
            for (int j = 0; j < kHeadGroups; ++j) *reinterpret_cast<uint32_t*>(dst + 8 * j) = out[j];
          }
        }
      }
    }
  }

 private:
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
  TWELL_CHECK(aligned(a.x) && aligned(a.w) && aligned(a.rope.qkv) && aligned(a.rope.k_cache) && aligned(a.rope.v_cache),
              "fused QKV+RoPE: x, W, the output and the caches must be 16-byte aligned");
  TWELL_CHECK(a.rope.T / a.rope.S * a.rope.max_context < (int64_t{1} << 32), "fused QKV+RoPE: ", a.rope.T / a.rope.S,
              " sequences of ", a.rope.max_context, " cache rows (2^32 at most)");
  if (a.rope.hd == 64)
    run<64>(a, workspace, workspace_bytes, sm_count, stream);
  else
    run<128>(a, workspace, workspace_bytes, sm_count, stream);
}

}  // namespace twell::cuda
