// Causal grouped-query attention for the model runtime (src/cuda/llama_cuda.cpp).
//
// Prefill (S new tokens per sequence, S ≥ 1): a flash-attention kernel on the tensor cores
// (mma.sync m16n8k16 bf16, fp32 accumulation; K and V fragments through ldmatrix). A block of 4
// warps owns 128 query rows of one head of one sequence (64 at head_dim 128); each warp owns 32
// (16) rows. Key/value tiles of 64 rows stream through shared memory with cp.async, three in
// flight (two at head_dim 128). S = Q Kᵀ stays in registers, the online softmax runs in the exp2
// domain, P is rounded to bf16 (as every flash-attention kernel does) and feeds the P V product
// straight from the accumulator registers. For few rows (warps_split_keys) a block's 4 warps share
// 32 rows (16) and split each key tile; the blocks of a cluster may split the keys too (key_splits),
// their partial softmax states merged through distributed shared memory.
//
// Decode (one new token per sequence, launch_decode_attention): RoPE of the new token, its key
// and value into the cache, and the attention, in one kernel. A cluster of blocks per query head
// splits the keys; lanes in groups of hd/8 hold one key each (16-byte loads), and the ranges'
// partial softmax states are merged through distributed shared memory.
//
// Layouts (all bf16): q is read in place from the QKV GEMM output [T, (nh + 2 nkv)·hd], keys and
// values from the cache [B, max_context, nkv·hd], and o is written [T, nh·hd]. Each sequence's
// first new position, p0[b], is read from device memory so that a captured CUDA graph replays for
// every decode step, and so that the sequences of a batch may have different lengths.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"
#include "cuda/kernels/bulk_copy.cuh"
#include "cuda/kernels/mma_sync.cuh"

namespace twell::cuda {
namespace {

constexpr int kKeys = 64;  // keys per tile
constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

// 2^x with one MUFU instruction (exp2f adds range handling we do not need: arguments are ≤ 0,
// and −∞ or results below the normal range give 0, as softmax wants).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t lds32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Copies rows [row0, row0 + N) of a [*, HD] matrix (row stride `ld` elements) into a padded
// shared tile; rows at or past `valid` are zero-filled. Thread i copies 16 bytes of rows i / (HD/8),
// + kThreads / (HD/8), ...: a count fixed at compile time, so the copies unroll into straight code (a
// loop over the block's chunks took ~200 instructions a K/V tile, most of a warp's work there at S = 21).
template <int HD, int N>
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* src, int64_t ld, int row0, int valid) {
  constexpr int kChunks = HD / 8, kPitch = HD + 8, kStride = kThreads / kChunks;  // rows a pass of the block
  static_assert(kThreads % kChunks == 0, "a pass copies whole rows");
  const int r0 = threadIdx.x / kChunks, col = (threadIdx.x % kChunks) * 8;
  const uint16_t* from = src + static_cast<int64_t>(row0 + r0) * ld + col;
  uint16_t* to = tile + r0 * kPitch + col;
#pragma unroll
  for (int i = 0; i < (N + kStride - 1) / kStride; ++i) {
    const int r = r0 + i * kStride;
    if (N % kStride != 0 && r >= N) break;
    const bool ok = row0 + r < valid;
    cp_async16(to + i * kStride * kPitch, ok ? from + i * kStride * ld : src, ok);
  }
}

// The key ranges of a block's warps (W = 4: flash_prefill_kernel with KW) and of a cluster's blocks
// (key_splits > 1) merged into the output rows, as the decode kernel merges its ranges: o = Σ_j o_j
// 2^(m_j − M) / Σ_j l_j 2^(m_j − M), M = max_j m_j, with m the running maxima (base-2, scaled), l the
// sums and o the unnormalised outputs (a range whose keys a row may not see has m_j = −FLT_MAX and
// l_j = 0: weight 0). Each warp leaves its rows' m, l and o in its block's shared memory (`part`, the
// K/V tiles' space, free once the last tile is used). With W = 4 the block first merges its warps'
// ranges of each row (into the output where the keys are not split among blocks); then, after a
// cluster barrier, block r merges rows r, r + splits, ... of every block's. A second barrier keeps
// every block's shared memory until all have read it.
template <int HD, int MT, int W>
__device__ __forceinline__ void merge_key_ranges(const AttentionArgs& a, const float (&o)[MT][HD / 8][4],
                                                 const float (&m_run)[MT][2], const float (&l_run)[MT][2],
                                                 uint16_t* part, uint16_t* out, int64_t o_ld, int s0, int warp,
                                                 int g, int t) {
  namespace cg = cooperative_groups;
  constexpr int kRows = (W == 1 ? 4 : 1) * 16 * MT;  // the block's rows
  float* part_o = reinterpret_cast<float*>(part);  // [W][kRows][HD]
  float* part_m = part_o + W * kRows * HD;         // [W][kRows]
  float* part_l = part_m + W * kRows;              // [W][kRows]
  const int range = W == 1 ? 0 : warp, row0 = W == 1 ? warp * 16 * MT : 0;
  __syncthreads();  // every warp is done with the K/V tiles this overwrites
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const int r0 = range * kRows + row0 + m * 16 + g, r1 = r0 + 8;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int col = n * 8 + 2 * t;
      part_o[r0 * HD + col] = o[m][n][0], part_o[r0 * HD + col + 1] = o[m][n][1];
      part_o[r1 * HD + col] = o[m][n][2], part_o[r1 * HD + col + 1] = o[m][n][3];
    }
    if (t == 0) part_m[r0] = m_run[m][0], part_l[r0] = l_run[m][0], part_m[r1] = m_run[m][1], part_l[r1] = l_run[m][1];
  }
  const int splits = a.key_splits, rows = min(kRows, a.S - s0);
  // The block's ranges merged: one a row (block_o/m/l), or the output itself where splits == 1.
  float *block_o = part_o, *block_m = part_m, *block_l = part_l;
  if (W > 1) {
    block_o = part_l + W * kRows, block_m = block_o + kRows * HD, block_l = block_m + kRows;
    __syncthreads();
    for (int i = threadIdx.x; i < rows * HD; i += kThreads) {
      const int r = i / HD, d = i % HD;
      float mx = -FLT_MAX;
#pragma unroll
      for (int w = 0; w < W; ++w) mx = fmaxf(mx, part_m[w * kRows + r]);
      float sum = 0.f, acc = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float f = fast_exp2(part_m[w * kRows + r] - mx);
        sum += part_l[w * kRows + r] * f;
        acc += part_o[(w * kRows + r) * HD + d] * f;
      }
      if (splits == 1) {
        out[(s0 + r) * o_ld + d] = float_to_bf16_bits(acc / sum);
      } else {
        block_o[r * HD + d] = acc;
        if (d == 0) block_m[r] = mx, block_l[r] = sum;
      }
    }
    if (splits == 1) return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rank = static_cast<int>(cluster.block_rank()), mine = (rows - rank + splits - 1) / splits;  // rows rank, rank + splits, ...
  for (int i = threadIdx.x; i < mine * HD; i += kThreads) {
    const int r = rank + (i / HD) * splits, d = i % HD;
    float mx = -FLT_MAX;
    for (int j = 0; j < splits; ++j) mx = fmaxf(mx, *cluster.map_shared_rank(block_m + r, j));
    float sum = 0.f, acc = 0.f;
    for (int j = 0; j < splits; ++j) {
      const float f = fast_exp2(*cluster.map_shared_rank(block_m + r, j) - mx);
      sum += *cluster.map_shared_rank(block_l + r, j) * f;
      acc += *cluster.map_shared_rank(block_o + r * HD + d, j) * f;
    }
    out[(s0 + r) * o_ld + d] = float_to_bf16_bits(acc / sum);
  }
  cluster.sync();
}

// MT m-tiles of 16 rows per warp: each K/V fragment read from shared memory feeds MT mma.
// STAGES K/V tiles in flight (cp.async ring). KW (AttentionArgs::warps_split_keys): the 4 warps share
// the block's 16·MT rows and each takes 16 keys of every tile (NP = 1 pair of 8-key n-tiles, at
// key offset 16·warp), instead of each owning 16·MT of 64·MT rows over all 64 keys (NP = 4).
// (Three blocks an SM at head_dim 32, as before the key splits took registers.)
template <int HD, int MT, int STAGES, bool KW>
__global__ void __launch_bounds__(kThreads, HD == 32 ? 3 : 0) flash_prefill_kernel(const AttentionArgs a) {
  constexpr int kRows = (KW ? 1 : 4) * 16 * MT, kPitch = HD + 8, kTile = kKeys * kPitch;
  constexpr int NP = KW ? 1 : kKeys / 16;  // 16-key pairs of n-tiles a warp scores in a tile
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* qs = smem;                     // [kRows][kPitch]
  uint16_t* ks = smem + kRows * kPitch;    // [STAGES][kKeys][kPitch]
  uint16_t* vs = ks + STAGES * kTile;      // [STAGES][kKeys][kPitch]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // With key_splits > 1, blocks x·splits .. x·splits + splits − 1 form a cluster over one block of
  // rows, block (rank) r taking the r-th range of its key tiles.
  const int splits = a.key_splits, rank = blockIdx.x % splits;
  const int s0 = blockIdx.x / splits * kRows, h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (a.nh / a.nkv);
  const int p0 = a.p0[b];
  const int64_t q_ld = static_cast<int64_t>(a.nh + 2 * a.nkv) * HD, kv_ld = static_cast<int64_t>(a.nkv) * HD;
  const uint16_t* q = a.qkv + (static_cast<int64_t>(b) * a.S) * q_ld + h * HD;
  const uint16_t* k = a.k_cache + static_cast<int64_t>(b) * a.max_context * kv_ld + kvh * HD;
  const uint16_t* v = a.v_cache + static_cast<int64_t>(b) * a.max_context * kv_ld + kvh * HD;
  const int kv_valid = p0 + a.S;                                 // cached positions of this sequence
  const int kv_end = p0 + min(s0 + kRows, a.S);                  // keys any row of this block sees
  const int n_tiles = (kv_end + kKeys - 1) / kKeys;
  const int first = rank * n_tiles / splits, last = (rank + 1) * n_tiles / splits;  // this block's tiles

  // Commit groups: the first holds Q and the first tile, then one group per tile (empty past the
  // last), so that before a tile is used exactly STAGES − 1 newer groups may still be in flight.
  // Tile i sits in slot (i − first) % STAGES.
  load_tile<HD, kRows>(qs, q, q_ld, s0, a.S);
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (first + i < last) {
      load_tile<HD, kKeys>(ks + i * kTile, k, kv_ld, (first + i) * kKeys, kv_valid);
      load_tile<HD, kKeys>(vs + i * kTile, v, kv_ld, (first + i) * kKeys, kv_valid);
    }
    cp_async_commit();
  }

  // This thread's rows: warp_row0 + m·16 + g (+ 8). Rows past S compute harmlessly, unstored.
  // Its keys in a tile: key_off + 0 .. 16·NP − 1.
  const int warp_row0 = KW ? s0 : s0 + warp * 16 * MT, key_off = KW ? 16 * warp : 0;
  const float scale = a.scale * kLog2e;

  uint32_t qf[MT][HD / 16][4];
  float o[MT][HD / 8][4] = {};
  float m_run[MT][2], l_run[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) m_run[m][0] = m_run[m][1] = -FLT_MAX, l_run[m][0] = l_run[m][1] = 0.f;

  for (int tile = first; tile < last; ++tile) {
    const int buf = (tile - first) % STAGES;
    const int ahead = tile + STAGES - 1;  // prefetch into the slot the previous tile used
    if (ahead < last) {
      load_tile<HD, kKeys>(ks + ((ahead - first) % STAGES) * kTile, k, kv_ld, ahead * kKeys, kv_valid);
      load_tile<HD, kKeys>(vs + ((ahead - first) % STAGES) * kTile, v, kv_ld, ahead * kKeys, kv_valid);
    }
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    __syncthreads();
    if (tile == first) {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const uint16_t* qw = qs + (warp_row0 - s0 + m * 16) * kPitch;
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

    // S = Q Kᵀ, 16·MT rows × 16·NP keys: 2·NP n-tiles of 8 keys. K rows are keys, which is the
    // col-major B fragment already: one ldmatrix.x4 gives two n-tiles' fragments of a k-step
    // (matrices: keys +0..7 / +8..15 × dims +0..7 / +8..15).
    float s[MT][2 * NP][4] = {};
    const int k_row = key_off + (lane >> 4) * 8 + (lane & 7), k_col = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int np = 0; np < NP; ++np) {
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
    // MUFU per score. Key of s[m][n][j]: tile·64 + key_off + n·8 + 2t + (j & 1); row: warp_row0 +
    // m·16 + g + 8·(j/2).
    const int key0 = tile * kKeys + key_off;
    const bool masked = key0 + 16 * NP - 1 > p0 + warp_row0;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 2 * NP; ++n) {
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
      for (int n = 0; n < 2 * NP; ++n) {
        s[m][n][0] = fast_exp2(fmaf(s[m][n][0], scale, -n0)), s[m][n][1] = fast_exp2(fmaf(s[m][n][1], scale, -n0));
        s[m][n][2] = fast_exp2(fmaf(s[m][n][2], scale, -n1)), s[m][n][3] = fast_exp2(fmaf(s[m][n][3], scale, -n1));
        sum0 += s[m][n][0] + s[m][n][1];
        sum1 += s[m][n][2] + s[m][n][3];
      }
      l_run[m][0] = l_run[m][0] * c0 + sum0;  // per-thread partial sums; reduced across the quad at the end
      l_run[m][1] = l_run[m][1] * c1 + sum1;
      // (Once a row's maximum has settled, most tiles leave every row's c at 1: the warp skips the products.)
      if (__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f))
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) o[m][n][0] *= c0, o[m][n][1] *= c0, o[m][n][2] *= c1, o[m][n][3] *= c1;
    }

    // O += P V: P from the accumulators (two key n-tiles form one k16 A fragment), V through
    // ldmatrix.trans (rows are keys, so the transpose gives the col-major B fragment).
#pragma unroll
    for (int kk = 0; kk < NP; ++kk) {
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
        const int row = key_off + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col = dn * 16 + (lane >> 4) * 8;
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
  }
  if (KW || splits > 1) {
    merge_key_ranges<HD, MT, KW ? 4 : 1>(a, o, m_run, l_run, smem + kRows * kPitch, out, o_ld, s0, warp, g, t);
  } else {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
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
}

// ---- decode --------------------------------------------------------------------------------------
// One cluster of `splits` blocks per (query head h, sequence b); block (rank) r takes the r-th
// range of the keys the sequence has now. kWarps warps (1, 2 or 4: launch_decode); a group of
// L = hd/8 lanes holds one key (8 dims per lane), so a warp scores 32/L keys at once.
//
// RoPE of the new token is done here, in registers (launch_rope_kv's arithmetic: a lane's 8 dims
// and its partner's, hd/2 away, L/2 lanes over): every block rotates its q, and the new key,
// which the block whose range ends at p0 uses without a round trip through the cache. Rank 0 of
// the first query head of each KV group writes the new key and value into the cache at p0; no
// block of this launch reads that row from memory.
//
// Programmatic dependent launch: p0, the RoPE table and the first kAhead steps of cached keys and
// values (positions before p0, which no kernel of this step writes) are loaded before the kernel
// waits for the QKV projection, so its launch and its first DRAM round trip overlap that GEMV.
//
// Each block merges its warps' states, then writes its range's (max, sum, unnormalised output),
// base-2 domain, into rank 0's shared memory; after one cluster barrier rank 0 merges the ranges
// in rank order and writes o. (Two kernels before: the merge was its own launch, 1.7 µs a layer
// plus a launch gap, and RoPE another, 2.0 µs.)
template <int HD, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) decode_attention_kernel(const RopeKvArgs r, const AttentionArgs a) {
  constexpr int L = HD / 8, kGroups = 32 / L, kStep = kWarps * kGroups, kT = kWarps * 32;
  constexpr int kStates = kWarps * kGroups, kDims = (HD + kT - 1) / kT;  // a thread's output dims, kT apart
  __shared__ float sm[kStates], sl[kStates], sacc[kStates][HD];                        // this block's
  __shared__ float cm[kMaxDecodeAttentionSplits], cl[kMaxDecodeAttentionSplits], co[kMaxDecodeAttentionSplits][HD];  // rank 0: the ranges'
  // Every block of the cluster has started before any writes into rank 0's shared memory: this
  // barrier phase is waited for only then.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  // The output projection (launch_decode_gemv) may start now: it copies its weights meanwhile.
  allow_dependent_launch();
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int h = blockIdx.x, b = blockIdx.y, rank = static_cast<int>(cluster.block_rank()), splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / L, sub = lane % L;
  const int kvh = h / (a.nh / a.nkv);
  const int64_t q_ld = static_cast<int64_t>(a.nh + 2 * a.nkv) * HD, kv_ld = static_cast<int64_t>(a.nkv) * HD;
  const int p0 = a.p0[b], len = p0 + 1;  // keys 0..p0, the last one the new token's

  // The ranges split the keys the sequences have now (p0 is read on the device, so a replayed
  // graph follows the context as it grows), in whole steps of kStep keys; trailing ranges may be
  // empty.
  const int keys_per_split = ((len + splits - 1) / splits + kStep - 1) / kStep * kStep;
  const int k_begin = rank * keys_per_split, k_end = min(len, k_begin + keys_per_split);
  const uint16_t* kbase = a.k_cache + static_cast<int64_t>(b) * a.max_context * kv_ld + kvh * HD + sub * 8;
  const uint16_t* vbase = a.v_cache + static_cast<int64_t>(b) * a.max_context * kv_ld + kvh * HD + sub * 8;
  // kAhead steps of K/V are loaded before any of them is scored (their loads in flight together
  // instead of one dependent round trip a step). The loop bounds are warp-uniform (the shuffles
  // need every lane); keys past the range are loaded as zeros and skipped, and the new key (p0)
  // is taken from registers once it is known.
  constexpr int kAhead = 4;
  uint4 kr[kAhead], vr[kAhead];
  auto load_cached = [&](int base0) {
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      const int key = base0 + s * kStep + grp;
      kr[s] = vr[s] = make_uint4(0, 0, 0, 0);
      if (key < k_end && key != p0) {
        kr[s] = *reinterpret_cast<const uint4*>(kbase + static_cast<int64_t>(key) * kv_ld);
        vr[s] = *reinterpret_cast<const uint4*>(vbase + static_cast<int64_t>(key) * kv_ld);
      }
    }
  };
  // p0, the RoPE table and the cached keys before p0 are not written by the kernel before this
  // one (p0 is uploaded before the step's first kernel, and the cache rows by earlier steps), so
  // they are read before waiting for it: the first step's K/V loads and the launch itself overlap
  // the QKV projection.
  const int first = k_begin + warp * kGroups;
  if (first < k_end) load_cached(first);
  const bool low = sub < L / 2;
  const float* cs = r.cos_sin + static_cast<int64_t>(p0) * HD + (sub % (L / 2)) * 8;
  float c[8], sn[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) c[e] = cs[e], sn[e] = cs[HD / 2 + e];
  wait_for_previous_grid();  // q, k and v of the new token are the QKV projection's output

  const uint16_t* row = a.qkv + b * q_ld;  // one new token a sequence
  const uint4 q_raw = *reinterpret_cast<const uint4*>(row + h * HD + sub * 8);
  const uint4 k_raw = *reinterpret_cast<const uint4*>(row + (a.nh + kvh) * HD + sub * 8);
  const uint4 v_new = *reinterpret_cast<const uint4*>(row + (a.nh + a.nkv + kvh) * HD + sub * 8);

  // RoPE at p0: lanes sub < L/2 hold x0 (dims i..i+8 of the first half), their partners x1.
  auto rotate = [&](const uint4 mine) {
    uint4 other;
    other.x = __shfl_xor_sync(0xffffffffu, mine.x, L / 2), other.y = __shfl_xor_sync(0xffffffffu, mine.y, L / 2);
    other.z = __shfl_xor_sync(0xffffffffu, mine.z, L / 2), other.w = __shfl_xor_sync(0xffffffffu, mine.w, L / 2);
    float xm[8], xo[8], out[8];
    unpack8(mine, xm);
    unpack8(other, xo);
#pragma unroll
    for (int e = 0; e < 8; ++e)  // not contracted into FMAs: as rope_kv_kernel and the CPU reference
      out[e] = low ? __fsub_rn(__fmul_rn(xm[e], c[e]), __fmul_rn(xo[e], sn[e]))
                   : __fadd_rn(__fmul_rn(xm[e], c[e]), __fmul_rn(xo[e], sn[e]));
    return pack8(out);  // bf16, as the cache holds it
  };
  float qv[8];
  unpack8(rotate(q_raw), qv);
  const uint4 k_new = rotate(k_raw);
  if (rank == 0 && h % (a.nh / a.nkv) == 0 && warp == 0 && grp == 0) {
    const int64_t at = (static_cast<int64_t>(b) * a.max_context + p0) * kv_ld + kvh * HD + sub * 8;
    *reinterpret_cast<uint4*>(r.k_cache + at) = k_new;
    *reinterpret_cast<uint4*>(r.v_cache + at) = v_new;
  }

  const float scale = a.scale * kLog2e;
  float m = -FLT_MAX, l = 0.f, acc[8] = {};
  for (int base0 = first; base0 < k_end; base0 += kAhead * kStep) {
    if (base0 != first) load_cached(base0);
#pragma unroll
    for (int s = 0; s < kAhead; ++s)
      if (base0 + s * kStep + grp == p0) kr[s] = k_new, vr[s] = v_new;
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      const bool valid = base0 + s * kStep + grp < k_end;
      const uint32_t kw[4] = {kr[s].x, kr[s].y, kr[s].z, kr[s].w}, vw[4] = {vr[s].x, vr[s].y, vr[s].z, vr[s].w};
      float dot = 0.f;
      for (int i = 0; i < 4; ++i)
        dot += qv[2 * i] * bits_float(kw[i] << 16) + qv[2 * i + 1] * bits_float(kw[i] & 0xffff0000u);
      for (int off = 1; off < L; off <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      if (!valid) continue;
      const float sc = dot * scale, mn = fmaxf(m, sc), cf = exp2f(m - mn), p = exp2f(sc - mn);
      m = mn;
      l = l * cf + p;
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] = acc[2 * i] * cf + p * bits_float(vw[i] << 16);
        acc[2 * i + 1] = acc[2 * i + 1] * cf + p * bits_float(vw[i] & 0xffff0000u);
      }
    }
  }

  // Merge the block's kStates states (all lanes of a group hold the same m and l) into rank 0.
  const int state = warp * kGroups + grp;
  if (sub == 0) sm[state] = m, sl[state] = l;
  for (int i = 0; i < 8; ++i) sacc[state][sub * 8 + i] = acc[i];
  __syncthreads();
  float mx = -FLT_MAX, lt = 0.f, ot[kDims] = {};
  for (int s = 0; s < kStates; ++s) mx = fmaxf(mx, sm[s]);
  for (int s = 0; s < kStates; ++s) {
    const float cf = sl[s] > 0.f ? exp2f(sm[s] - mx) : 0.f;
    lt += sl[s] * cf;
#pragma unroll
    for (int i = 0; i < kDims; ++i)
      if (threadIdx.x + i * kT < HD) ot[i] += sacc[s][threadIdx.x + i * kT] * cf;
  }
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#pragma unroll
  for (int i = 0; i < kDims; ++i)
    if (threadIdx.x + i * kT < HD) *cluster.map_shared_rank(&co[rank][threadIdx.x + i * kT], 0) = ot[i];
  if (threadIdx.x == 0) *cluster.map_shared_rank(&cm[rank], 0) = mx, *cluster.map_shared_rank(&cl[rank], 0) = lt;
  cluster.sync();
  if (rank != 0) return;
  // Empty ranges (l = 0) add nothing; a NaN range (a NaN in q or a key) is added, so that it shows.
  mx = -FLT_MAX;
  for (int s = 0; s < splits; ++s)
    if (cl[s] != 0.f) mx = fmaxf(mx, cm[s]);
  for (int d = threadIdx.x; d < HD; d += kT) {
    float l_sum = 0.f, o_sum = 0.f;
    for (int s = 0; s < splits; ++s)
      if (cl[s] != 0.f) {
        const float cf = exp2f(cm[s] - mx);
        l_sum += cl[s] * cf;
        o_sum += co[s][d] * cf;
      }
    a.o[(static_cast<int64_t>(b) * a.nh + h) * HD + d] = float_to_bf16_bits(o_sum / l_sum);
  }
}

template <int HD, bool KW>
void launch_prefill(AttentionArgs a, cudaStream_t stream) {
  constexpr int MT = HD <= 64 ? 2 : 1;      // registers: 128-wide heads keep one m-tile per warp
  // Shared memory: 128-wide heads keep two tiles. (KW with 5 / 3 stages was 8% slower on the H100:
  // docs/perf.md, sixty-third session.)
  constexpr int STAGES = HD <= 64 ? 3 : 2;
  constexpr int kRows = (KW ? 1 : 4) * 16 * MT, kPitch = HD + 8, W = KW ? 4 : 1;
  constexpr int kMerged = W > 1 ? kRows * HD + 2 * kRows : 0;  // the block's ranges merged (W > 1)
  static_assert((W * kRows * HD + 2 * W * kRows + kMerged) * 4 <= 2 * STAGES * kKeys * kPitch * 2,
                "merge_key_ranges' partial results must fit the K/V tiles' shared memory");
  const auto kernel_fn = flash_prefill_kernel<HD, MT, STAGES, KW>;
  const void* kernel = reinterpret_cast<const void*>(kernel_fn);
  const int smem = (kRows + 2 * STAGES * kKeys) * kPitch * 2;
  allow_dynamic_smem(kernel, smem);
  if (a.key_splits > 1) a.key_splits = std::min(a.key_splits, max_cluster_blocks(kernel, kThreads, kMaxKeySplits));
  const unsigned row_blocks = static_cast<unsigned>((static_cast<int64_t>(a.S) + kRows - 1) / kRows);
  if (a.key_splits > 1) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(row_blocks * static_cast<unsigned>(a.key_splits), static_cast<unsigned>(a.nh),
                          static_cast<unsigned>(a.B));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    config.stream = stream;
    cudaLaunchAttribute cluster = {};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = static_cast<unsigned>(a.key_splits), cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    if (cudaLaunchKernelEx(&config, kernel_fn, a) == cudaSuccess) return;
    // max_cluster_blocks asks without this kernel's shared memory: where a slice of the GPU cannot hold
    // the cluster with it, the launch is refused (a configuration error, not sticky) and the keys go unsplit.
    cudaGetLastError();
    a.key_splits = 1;
  }
  const dim3 grid(row_blocks, static_cast<unsigned>(a.nh), static_cast<unsigned>(a.B));
  kernel_fn<<<grid, kThreads, smem, stream>>>(a);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

template <int HD>
void launch_prefill(const AttentionArgs& a, cudaStream_t stream) {
  if (a.warps_split_keys)
    launch_prefill<HD, true>(a, stream);
  else
    launch_prefill<HD, false>(a, stream);
}

// Blocks of decode_attention_kernel<HD, W> an SM holds at once (the runtime's occupancy calculator).
template <int HD, int W>
int decode_blocks_per_sm() {
  static const int blocks = [] {
    int n = 0;
    TWELL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_attention_kernel<HD, W>, 32 * W, 0));
    return n;
  }();
  return blocks;
}

template <int HD, int W>
void launch_decode(const RopeKvArgs& r, const AttentionArgs& a, int splits, bool dependent, cudaStream_t stream) {
  const auto kernel_fn = decode_attention_kernel<HD, W>;
  const void* kernel = reinterpret_cast<const void*>(kernel_fn);
  allow_non_portable_clusters(kernel);
  splits = std::min(splits, max_cluster_blocks(kernel, 32 * W, kMaxDecodeAttentionSplits));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(a.nh), static_cast<unsigned>(a.B), static_cast<unsigned>(splits));
  config.blockDim = dim3(32 * W);
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = 1, attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = static_cast<unsigned>(splits);
  attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;  // see wait_for_previous_grid in the kernel
  attribute[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent ? 2 : 1;
  TWELL_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel_fn, r, a));
}

// Warps a block: 2 where 4-warp blocks would not all be resident at once but 2-warp ones would, else
// 4. An SM holds 6 blocks of 4 warps (5 at the former 93 registers: 32 heads of 32 sequences, 1024
// blocks, then ran in 1.55 waves on 132 SMs; ncu: 58 µs at 71% of DRAM bandwidth); 2-warp blocks
// took the step of 32 sequences from 4.65 to 4.51 ms on an H100. One-warp blocks (the grid in one
// wave at 64 sequences) were slower than 4-warp ones, 7.75 against 7.18 ms: fewer warps an SM,
// fewer bytes in flight. So 1 is only taken when asked for (docs/perf.md, sixty-fourth session).
template <int HD>
void launch_decode(const RopeKvArgs& r, const AttentionArgs& a, int splits, int warps, int sm_count, bool dependent,
                   cudaStream_t stream) {
  if (warps == 0) {
    const int64_t blocks = int64_t{a.nh} * a.B * splits;
    const bool four_fit = decode_blocks_per_sm<HD, 4>() * int64_t{sm_count} >= blocks;
    warps = !four_fit && decode_blocks_per_sm<HD, 2>() * int64_t{sm_count} >= blocks ? 2 : 4;
  }
  switch (warps) {
    case 1: return launch_decode<HD, 1>(r, a, splits, dependent, stream);
    case 2: return launch_decode<HD, 2>(r, a, splits, dependent, stream);
    default: return launch_decode<HD, 4>(r, a, splits, dependent, stream);
  }
}

}  // namespace

// (Measured: at batch 64 one range a head took the step from 7.45 to 6.2 ms; at batch 1, 16 ranges
// cost what 5 did.)
int prefill_attention_splits(int64_t B, int64_t S, int64_t nh, int64_t hd, int64_t keys, int sm_count,
                             bool warps_split_keys) {
  const int64_t rows = (warps_split_keys ? 1 : 4) * (hd <= 64 ? 32 : 16);  // launch_prefill's rows a block
  const int64_t blocks = (S + rows - 1) / rows * nh * B, tiles = (keys + kKeys - 1) / kKeys;
  if (blocks <= 0 || sm_count <= 0) return 1;
  const int64_t fill = (sm_count + blocks - 1) / blocks;  // a block an SM
  return static_cast<int>(std::clamp<int64_t>(std::min(fill, tiles / 4), 1, kMaxKeySplits));  // ≥ 4 tiles a range
}

void plan_prefill_attention(AttentionArgs& a, int64_t keys, int sm_count) {
  a.warps_split_keys = a.S <= kWarpsSplitKeysMaxRows;
  a.key_splits = prefill_attention_splits(a.B, a.S, a.nh, a.hd, keys, sm_count, a.warps_split_keys);
}

int decode_attention_splits(int64_t max_context, int64_t B, int64_t nh, int sm_count) {
  const int64_t fill = (4 * int64_t{sm_count} + B * nh - 1) / (B * nh), longest = (max_context + 31) / 32;
  return static_cast<int>(std::clamp<int64_t>(std::min(fill, longest), 1, kMaxDecodeAttentionSplits));
}

void check_attention(int64_t head_dim) {
  TWELL_CHECK(head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128,
              "attention: head_dim must be 16, 32, 64 or 128, got ", head_dim);
}

void launch_attention(const AttentionArgs& a, cudaStream_t stream) {
  TWELL_CHECK(a.nkv > 0 && a.nh % a.nkv == 0, "attention: ", a.nh, " heads are not a multiple of ", a.nkv,
              " KV heads");
  TWELL_CHECK(a.key_splits >= 1 && a.key_splits <= kMaxKeySplits, "attention: key_splits must lie in [1, ",
              kMaxKeySplits, "], got ", a.key_splits);
  TWELL_CHECK(a.B <= 65535 && a.nh <= 65535,
              "attention: at most 65535 sequences and heads a call (the grid's y and z), got ", a.B, " and ", a.nh);
  if (a.B == 0 || a.S == 0) return;
  switch (a.hd) {
    case 16: return launch_prefill<16>(a, stream);
    case 32: return launch_prefill<32>(a, stream);
    case 64: return launch_prefill<64>(a, stream);
    case 128: return launch_prefill<128>(a, stream);
    default: check_attention(a.hd);
  }
}

void launch_decode_attention(const RopeKvArgs& r, const AttentionArgs& a, int sm_count, cudaStream_t stream,
                             bool dependent, int splits, int warps) {
  TWELL_CHECK(a.nkv > 0 && a.nh % a.nkv == 0, "attention: ", a.nh, " heads are not a multiple of ", a.nkv,
              " KV heads");
  TWELL_CHECK(a.S == 1 && r.S == 1 && r.T == a.B && r.nh == a.nh && r.nkv == a.nkv && r.hd == a.hd &&
                  r.qkv == a.qkv && r.k_cache == a.k_cache && r.v_cache == a.v_cache && r.p0 == a.p0 &&
                  r.max_context == a.max_context,
              "decode attention: the RoPE and attention arguments must describe the same step of one new token a "
              "sequence (S = ", a.S, ")");
  TWELL_CHECK(a.B <= 65535, "decode attention: at most 65535 sequences a step, got ", a.B);
  TWELL_CHECK(sm_count > 0, "decode attention: sm_count must be positive, got ", sm_count);
  TWELL_CHECK(splits >= 0 && splits <= kMaxDecodeAttentionSplits, "decode attention: splits must lie in [0, ",
              kMaxDecodeAttentionSplits, "], got ", splits);
  TWELL_CHECK(valid_decode_attention_warps(warps),
              "decode attention: warps a block must be 0 (the kernel's choice), 1, 2 or 4, got ", warps);
  if (a.B == 0) return;
  if (splits == 0) splits = decode_attention_splits(a.max_context, a.B, a.nh, sm_count);
  switch (a.hd) {
    case 16: return launch_decode<16>(r, a, splits, warps, sm_count, dependent, stream);
    case 32: return launch_decode<32>(r, a, splits, warps, sm_count, dependent, stream);
    case 64: return launch_decode<64>(r, a, splits, warps, sm_count, dependent, stream);
    case 128: return launch_decode<128>(r, a, splits, warps, sm_count, dependent, stream);
    default: check_attention(a.hd);
  }
}

}  // namespace twell::cuda
