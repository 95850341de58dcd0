// Causal grouped-query attention for the model runtime (src/cuda/llama_cuda.cpp).
//
// Prefill (S new tokens per sequence, S ≥ 1): a flash-attention kernel on the tensor cores
// (mma.sync m16n8k16 bf16, fp32 accumulation; K and V fragments through ldmatrix). A block of 4
// warps owns 128 query rows of one head of one sequence (64 at head_dim 128); each warp owns 32
// (16) rows. Key/value tiles of 64 rows stream through shared memory with cp.async, three in
// flight (two at head_dim 128). S = Q Kᵀ stays in registers, the online softmax runs in the exp2
// domain, P is rounded to bf16 (as every flash-attention kernel does) and feeds the P V product
// straight from the accumulator registers.
//
// Decode (one new token per sequence): split over the cached keys. Each block takes one query head
// and one range of keys, lanes in groups of hd/8 hold one key each (16-byte loads), and a second
// kernel merges the partial softmax states of the ranges.
//
// Layouts (all bf16): q is read in place from the QKV GEMM output [T, (nh + 2 nkv)·hd], keys and
// values from the cache [B, max_context, nkv·hd], and o is written [T, nh·hd]. The first position
// of the new tokens, p0, is read from device memory so that a captured CUDA graph replays for
// every decode step.
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"

namespace twell::cuda {
namespace {

constexpr int kKeys = 64;  // keys per tile
constexpr int kMaxDecodeSplits = 16;  // key ranges of a decode step (decode_attention_splits)
constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// 2^x with one MUFU instruction (exp2f adds range handling we do not need: arguments are ≤ 0,
// and −∞ or results below the normal range give 0, as softmax wants).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t lds32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Copies rows [row0, row0 + n) of a [*, HD] matrix (row stride `ld` elements) into a padded
// shared tile; rows at or past `valid` are zero-filled.
template <int HD, int N>
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* src, int64_t ld, int row0, int valid) {
  constexpr int kChunks = HD / 8, kPitch = HD + 8;
  for (int c = threadIdx.x; c < N * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = row0 + r < valid;
    cp_async16(tile + r * kPitch + col, ok ? src + static_cast<int64_t>(row0 + r) * ld + col : src, ok);
  }
}

// MT m-tiles of 16 rows per warp: each K/V fragment read from shared memory feeds MT mma.
// STAGES K/V tiles in flight (cp.async ring).
template <int HD, int MT, int STAGES>
__global__ void __launch_bounds__(kThreads) flash_prefill_kernel(const AttentionArgs a) {
  constexpr int kRows = 4 * 16 * MT, kPitch = HD + 8, kTile = kKeys * kPitch;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* qs = smem;                     // [kRows][kPitch]
  uint16_t* ks = smem + kRows * kPitch;    // [STAGES][kKeys][kPitch]
  uint16_t* vs = ks + STAGES * kTile;      // [STAGES][kKeys][kPitch]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int s0 = blockIdx.x * kRows, h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (a.nh / a.nkv);
  const int p0 = *a.p0;
  const int64_t q_ld = static_cast<int64_t>(a.nh + 2 * a.nkv) * HD, kv_ld = static_cast<int64_t>(a.nkv) * HD;
  const uint16_t* q = a.qkv + (static_cast<int64_t>(b) * a.S) * q_ld + h * HD;
  const uint16_t* k = a.k_cache + static_cast<int64_t>(b) * a.max_context * kv_ld + kvh * HD;
  const uint16_t* v = a.v_cache + static_cast<int64_t>(b) * a.max_context * kv_ld + kvh * HD;
  const int kv_valid = p0 + a.S;                                 // cached positions of this sequence
  const int kv_end = p0 + min(s0 + kRows, a.S);                  // keys any row of this block sees
  const int n_tiles = (kv_end + kKeys - 1) / kKeys;

  // Commit groups: the first holds Q and tile 0, then one group per tile (empty past the last),
  // so that before tile i is used exactly STAGES − 1 newer groups may still be in flight.
  load_tile<HD, kRows>(qs, q, q_ld, s0, a.S);
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < n_tiles) {
      load_tile<HD, kKeys>(ks + i * kTile, k, kv_ld, i * kKeys, kv_valid);
      load_tile<HD, kKeys>(vs + i * kTile, v, kv_ld, i * kKeys, kv_valid);
    }
    cp_async_commit();
  }

  // This thread's rows: warp_row0 + m·16 + g (+ 8). Rows past S compute harmlessly, unstored.
  const int warp_row0 = s0 + warp * 16 * MT;
  const float scale = a.scale * kLog2e;

  uint32_t qf[MT][HD / 16][4];
  float o[MT][HD / 8][4] = {};
  float m_run[MT][2], l_run[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) m_run[m][0] = m_run[m][1] = -FLT_MAX, l_run[m][0] = l_run[m][1] = 0.f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile % STAGES;
    const int ahead = tile + STAGES - 1;  // prefetch into the slot the previous tile used
    if (ahead < n_tiles) {
      load_tile<HD, kKeys>(ks + (ahead % STAGES) * kTile, k, kv_ld, ahead * kKeys, kv_valid);
      load_tile<HD, kKeys>(vs + (ahead % STAGES) * kTile, v, kv_ld, ahead * kKeys, kv_valid);
    }
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    __syncthreads();
    if (tile == 0) {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const uint16_t* qw = qs + (warp * 16 * MT + m * 16) * kPitch;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
          qf[m][kk][0] = lds32(qw + g * kPitch + kk * 16 + 2 * t);
          qf[m][kk][1] = lds32(qw + (g + 8) * kPitch + kk * 16 + 2 * t);
          qf[m][kk][2] = lds32(qw + g * kPitch + kk * 16 + 8 + 2 * t);
          qf[m][kk][3] = lds32(qw + (g + 8) * kPitch + kk * 16 + 8 + 2 * t);
        }
      }
    }
    const uint16_t* kt = ks + buf * kTile;
    const uint16_t* vt = vs + buf * kTile;

    // S = Q Kᵀ, 16·MT rows × 64 keys: 8 n-tiles of 8 keys. K rows are keys, which is the
    // col-major B fragment already: one ldmatrix.x4 gives two n-tiles' fragments of a k-step
    // (matrices: keys +0..7 / +8..15 × dims +0..7 / +8..15).
    float s[MT][kKeys / 8][4] = {};
    const int k_row = (lane >> 4) * 8 + (lane & 7), k_col = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t kb[4];
        ldmatrix_x4(kb, kt + (np * 16 + k_row) * kPitch + kk * 16 + k_col);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma_bf16(s[m][2 * np], qf[m][kk], kb[0], kb[1]);
          mma_bf16(s[m][2 * np + 1], qf[m][kk], kb[2], kb[3]);
        }
      }
    }

    // Causal mask (only where the tile reaches past this warp's first row) and online softmax,
    // base 2: p = 2^(s·scale − m) with m the running row maximum of s·scale, one FFMA and one
    // MUFU per score. Key of s[m][n][j]: tile·64 + n·8 + 2t + (j & 1); row: warp_row0 + m·16 +
    // g + 8·(j/2).
    const int key0 = tile * kKeys;
    const bool masked = key0 + kKeys - 1 > p0 + warp_row0;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        if (masked) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int key = key0 + n * 8 + 2 * t + (j & 1);
            const int pos = p0 + warp_row0 + m * 16 + g + 8 * (j / 2);
            if (key > pos) s[m][n][j] = -INFINITY;
          }
        }
        mx[0] = fmaxf(mx[0], fmaxf(s[m][n][0], s[m][n][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[m][n][2], s[m][n][3]));
      }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {
        mx[0] = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], off));
        mx[1] = fmaxf(mx[1], __shfl_xor_sync(0xffffffffu, mx[1], off));
      }
      // New running maxima in scaled units (scale > 0 commutes with max). A row whose keys are
      // all masked so far keeps −FLT_MAX: its p are 0 and its correction is 1.
      const float n0 = fmaxf(m_run[m][0], mx[0] * scale), n1 = fmaxf(m_run[m][1], mx[1] * scale);
      const float c0 = fast_exp2(m_run[m][0] - n0), c1 = fast_exp2(m_run[m][1] - n1);
      m_run[m][0] = n0, m_run[m][1] = n1;
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        s[m][n][0] = fast_exp2(fmaf(s[m][n][0], scale, -n0)), s[m][n][1] = fast_exp2(fmaf(s[m][n][1], scale, -n0));
        s[m][n][2] = fast_exp2(fmaf(s[m][n][2], scale, -n1)), s[m][n][3] = fast_exp2(fmaf(s[m][n][3], scale, -n1));
        sum0 += s[m][n][0] + s[m][n][1];
        sum1 += s[m][n][2] + s[m][n][3];
      }
      l_run[m][0] = l_run[m][0] * c0 + sum0;  // per-thread partial sums; reduced across the quad at the end
      l_run[m][1] = l_run[m][1] * c1 + sum1;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) o[m][n][0] *= c0, o[m][n][1] *= c0, o[m][n][2] *= c1, o[m][n][3] *= c1;
    }

    // O += P V: P from the accumulators (two key n-tiles form one k16 A fragment), V through
    // ldmatrix.trans (rows are keys, so the transpose gives the col-major B fragment).
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        pa[m][0] = pack2(s[m][2 * kk][0], s[m][2 * kk][1]);
        pa[m][1] = pack2(s[m][2 * kk][2], s[m][2 * kk][3]);
        pa[m][2] = pack2(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        pa[m][3] = pack2(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dn = 0; dn < HD / 16; ++dn) {
        uint32_t vb[4];
        const int row = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col = dn * 16 + (lane >> 4) * 8;
        ldmatrix_x4_trans(vb, vt + row * kPitch + col);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma_bf16(o[m][2 * dn], pa[m], vb[0], vb[1]);
          mma_bf16(o[m][2 * dn + 1], pa[m], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // this slot is refilled by the next iteration's prefetch
  }
  cp_async_wait<0>();

  const int64_t o_ld = static_cast<int64_t>(a.nh) * HD;
  uint16_t* out = a.o + static_cast<int64_t>(b) * a.S * o_ld + h * HD;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      l_run[m][0] += __shfl_xor_sync(0xffffffffu, l_run[m][0], off);
      l_run[m][1] += __shfl_xor_sync(0xffffffffu, l_run[m][1], off);
    }
    const float inv0 = 1.f / l_run[m][0], inv1 = 1.f / l_run[m][1];
    const int r0 = warp_row0 + m * 16 + g, r1 = r0 + 8;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int col = n * 8 + 2 * t;
      if (r0 < a.S)
        *reinterpret_cast<uint32_t*>(out + r0 * o_ld + col) = pack2(o[m][n][0] * inv0, o[m][n][1] * inv0);
      if (r1 < a.S)
        *reinterpret_cast<uint32_t*>(out + r1 * o_ld + col) = pack2(o[m][n][2] * inv1, o[m][n][3] * inv1);
    }
  }
}

// ---- decode --------------------------------------------------------------------------------------
// Block (head h, sequence b, key range r): 4 warps; a group of L = hd/8 lanes holds one key (8
// dims per lane), so a warp scores 32/L keys at once. Writes the range's (max, sum, unnormalised
// output) in the base-2 domain to `partial`.
template <int HD>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(const AttentionArgs a, float* __restrict__ partial) {
  constexpr int L = HD / 8, kGroups = 32 / L, kWarps = kThreads / 32, kStep = kWarps * kGroups;
  const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / L, sub = lane % L;
  const int kvh = h / (a.nh / a.nkv);
  const int len = *a.p0 + 1;  // keys 0..p0 (the new token's own key is cached already)
  const int64_t q_ld = static_cast<int64_t>(a.nh + 2 * a.nkv) * HD, kv_ld = static_cast<int64_t>(a.nkv) * HD;
  // The ranges split the keys the sequences have now (p0 is read on the device, so a replayed
  // graph follows the context as it grows), in whole steps of kStep keys; trailing ranges may be
  // empty. Sizing them from max_context instead left most blocks idle: at 600 of 4096 positions,
  // 3 of 16 ranges held every key.
  const int keys_per_split = ((len + splits - 1) / splits + kStep - 1) / kStep * kStep;
  const int k_begin = split * keys_per_split, k_end = min(len, k_begin + keys_per_split);

  float qv[8];
  {
    const uint4 raw = *reinterpret_cast<const uint4*>(a.qkv + b * q_ld + h * HD + sub * 8);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    for (int i = 0; i < 4; ++i) qv[2 * i] = bits_float(w[i] << 16), qv[2 * i + 1] = bits_float(w[i] & 0xffff0000u);
  }
  const float scale = a.scale * kLog2e;
  const uint16_t* kbase = a.k_cache + static_cast<int64_t>(b) * a.max_context * kv_ld + kvh * HD + sub * 8;
  const uint16_t* vbase = a.v_cache + static_cast<int64_t>(b) * a.max_context * kv_ld + kvh * HD + sub * 8;

  float m = -FLT_MAX, l = 0.f, acc[8] = {};
  // kAhead steps of K/V are loaded before any of them is scored (their loads in flight together
  // instead of one dependent round trip a step); the scoring order is unchanged, so the results
  // are the same bit for bit. The loop bounds are warp-uniform (the shuffles need every lane);
  // keys past the range are loaded as zeros and skipped.
  constexpr int kAhead = 4;
  for (int base0 = k_begin + warp * kGroups; base0 < k_end; base0 += kAhead * kStep) {
    uint4 kr[kAhead], vr[kAhead];
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      const int key = base0 + s * kStep + grp;
      kr[s] = vr[s] = make_uint4(0, 0, 0, 0);
      if (key < k_end) {
        kr[s] = *reinterpret_cast<const uint4*>(kbase + static_cast<int64_t>(key) * kv_ld);
        vr[s] = *reinterpret_cast<const uint4*>(vbase + static_cast<int64_t>(key) * kv_ld);
      }
    }
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      const bool valid = base0 + s * kStep + grp < k_end;
      const uint32_t kw[4] = {kr[s].x, kr[s].y, kr[s].z, kr[s].w}, vw[4] = {vr[s].x, vr[s].y, vr[s].z, vr[s].w};
      float dot = 0.f;
      for (int i = 0; i < 4; ++i)
        dot += qv[2 * i] * bits_float(kw[i] << 16) + qv[2 * i + 1] * bits_float(kw[i] & 0xffff0000u);
      for (int off = 1; off < L; off <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      if (!valid) continue;
      const float sc = dot * scale, mn = fmaxf(m, sc), c = exp2f(m - mn), p = exp2f(sc - mn);
      m = mn;
      l = l * c + p;
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] = acc[2 * i] * c + p * bits_float(vw[i] << 16);
        acc[2 * i + 1] = acc[2 * i + 1] * c + p * bits_float(vw[i] & 0xffff0000u);
      }
    }
  }

  // Merge the kGroups·kWarps states of this block (all lanes of a group hold the same m and l).
  __shared__ float sm[kWarps * kGroups], sl[kWarps * kGroups], sacc[kWarps * kGroups][HD];
  const int state = warp * kGroups + grp;
  if (sub == 0) sm[state] = m, sl[state] = l;
  for (int i = 0; i < 8; ++i) sacc[state][sub * 8 + i] = acc[i];
  __syncthreads();
  float* out = partial + ((static_cast<int64_t>(b) * a.nh + h) * splits + split) * (HD + 2);
  if (threadIdx.x < HD) {
    float mx = -FLT_MAX;
    for (int s = 0; s < kWarps * kGroups; ++s) mx = fmaxf(mx, sm[s]);
    float lt = 0.f, ot = 0.f;
    for (int s = 0; s < kWarps * kGroups; ++s) {
      const float c = sl[s] > 0.f ? exp2f(sm[s] - mx) : 0.f;
      lt += sl[s] * c;
      ot += sacc[s][threadIdx.x] * c;
    }
    out[2 + threadIdx.x] = ot;
    if (threadIdx.x == 0) out[0] = mx, out[1] = lt;
  }
}

// One block per (head, sequence): merges the splits' states and writes o. Every split's state is
// loaded before any is used (one L2 round trip, not one a split); the merge order is the splits'.
template <int HD>
__global__ void decode_combine_kernel(const AttentionArgs a, const float* __restrict__ partial, int splits) {
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
  const float* p = partial + (static_cast<int64_t>(b) * a.nh + h) * splits * (HD + 2);
  float sm[kMaxDecodeSplits], sl[kMaxDecodeSplits], so[kMaxDecodeSplits];
#pragma unroll
  for (int s = 0; s < kMaxDecodeSplits; ++s) {
    sl[s] = 0.f, sm[s] = so[s] = 0.f;
    if (s < splits) sm[s] = p[s * (HD + 2)], sl[s] = p[s * (HD + 2) + 1], so[s] = p[s * (HD + 2) + 2 + d];
  }
  float mx = -FLT_MAX;
#pragma unroll
  for (int s = 0; s < kMaxDecodeSplits; ++s)
    if (sl[s] > 0.f) mx = fmaxf(mx, sm[s]);
  float lt = 0.f, ot = 0.f;
#pragma unroll
  for (int s = 0; s < kMaxDecodeSplits; ++s) {
    if (sl[s] > 0.f) {
      const float c = exp2f(sm[s] - mx);
      lt += sl[s] * c;
      ot += so[s] * c;
    }
  }
  a.o[(static_cast<int64_t>(b) * a.nh + h) * HD + d] = float_to_bf16_bits(ot / lt);
}

template <int HD>
void launch_prefill(const AttentionArgs& a, cudaStream_t stream) {
  constexpr int MT = HD <= 64 ? 2 : 1;      // registers: 128-wide heads keep one m-tile per warp
  constexpr int STAGES = HD <= 64 ? 3 : 2;  // shared memory: 128-wide heads keep two tiles
  constexpr int kRows = 4 * 16 * MT, kPitch = HD + 8;
  const int smem = (kRows + 2 * STAGES * kKeys) * kPitch * 2;
  allow_dynamic_smem(reinterpret_cast<const void*>(flash_prefill_kernel<HD, MT, STAGES>), smem);
  const dim3 grid(static_cast<unsigned>((a.S + kRows - 1) / kRows), static_cast<unsigned>(a.nh),
                  static_cast<unsigned>(a.B));
  flash_prefill_kernel<HD, MT, STAGES><<<grid, kThreads, smem, stream>>>(a);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

template <int HD>
void launch_decode(const AttentionArgs& a, float* partial, int splits, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.nh), static_cast<unsigned>(a.B), static_cast<unsigned>(splits));
  decode_split_kernel<HD><<<grid, kThreads, 0, stream>>>(a, partial);
  TWELL_CUDA_CHECK(cudaGetLastError());
  decode_combine_kernel<HD><<<dim3(a.nh, a.B), HD, 0, stream>>>(a, partial, splits);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void check_attention(int64_t head_dim) {
  TWELL_CHECK(head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128,
              "attention: head_dim must be 16, 32, 64 or 128, got ", head_dim);
}

int decode_attention_splits(int64_t max_context) {
  // Enough blocks to cover the GPU at batch 1 with 32 heads, ranges of at least 128 keys.
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kMaxDecodeSplits, (max_context + 127) / 128)));
}

void launch_attention(const AttentionArgs& a, float* decode_partial, cudaStream_t stream) {
  TWELL_CHECK(a.nkv > 0 && a.nh % a.nkv == 0, "attention: ", a.nh, " heads are not a multiple of ", a.nkv,
              " KV heads");
  if (a.B == 0 || a.S == 0) return;
  const bool decode = a.S == 1 && decode_partial != nullptr;
  const int splits = decode_attention_splits(a.max_context);
  switch (a.hd) {
    case 16: return decode ? launch_decode<16>(a, decode_partial, splits, stream) : launch_prefill<16>(a, stream);
    case 32: return decode ? launch_decode<32>(a, decode_partial, splits, stream) : launch_prefill<32>(a, stream);
    case 64: return decode ? launch_decode<64>(a, decode_partial, splits, stream) : launch_prefill<64>(a, stream);
    case 128: return decode ? launch_decode<128>(a, decode_partial, splits, stream) : launch_prefill<128>(a, stream);
    default: check_attention(a.hd);
  }
}

}  // namespace twell::cuda
