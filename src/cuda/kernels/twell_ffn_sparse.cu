// The sparse half of the FFN forward, over the active set held in TwELL, in two passes:
//   up   (SDDMM)  for each active (m, j): u[m, j] = bf16(x[m] · Wu[j])       (gated FFNs only)
//   down (SpMM)   y[m] = Σ_j h[m, j] · Wd[j],  h = g ⊙ u rounded as Precision says (gated)
//                                              h = act            (non-gated)
// x, y [M, H]; Wu, Wd [I, H] neuron-major rows, 16-byte aligned; bf16 in, fp32 accumulate.
// u is stored beside the format: `u_vals[i]` for slot word i of a packed tile and
// `u_vals[slot_size + b·T + c]` for column c of backup tile b (what the backward will reuse).
//
// Why two passes: the gather reads one 4 KB row of Wu and one of Wd per active pair, served from
// L2. Wu and Wd together (46 MB at H = 2048, I = 5632) do not stay resident in the H200's L2
// (ncu: 60% hit rate, 8 GB of DRAM traffic in the fused kernel); one of them at a time does. The
// price is a second read of the format (~0.4 GB at M = 131072). docs/perf.md has the numbers.
//
// Both kernels: one block per token. Its non-zeros are staged in shared memory in ascending
// column order (as many tiles at a time as fit kListCap entries; a spilled tile is scanned from
// its dense backup). up: each warp computes whole dot products for every 4th entry, two rows in
// flight. down: thread t owns columns [8t, 8t + 8) of y and keeps kDownBatch rows in flight. Weights are loaded with an L2 evict-last policy;
// x, the format and y stream through with evict-first. Summation orders are fixed (u: per-thread
// then shuffle tree then warps in order; y: ascending j per column): results are deterministic.
// Covered by tests/cuda/test_twell_ffn.cu; timed by `twell bench ffn`.
#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"

namespace twell::cuda {
namespace {

constexpr int kListCap = 1024;  // staged non-zeros (>= the widest tile, so one tile always fits)
// up: a warp computes whole dot products (lane holds 8 columns of every 256), 4 warps a token.
constexpr int kUpThreads = 128;
constexpr int kMaxUpChunks = 16;  // H <= 4096
// down: thread t owns columns [8t, 8t + 8) of y; kDownBatch rows of Wd in flight per thread.
constexpr int kDownCols = 8;
constexpr int kDownBatch = 8;
constexpr int kMaxDownThreads = 512;  // H <= 4096; the bound leaves 128 registers per thread

struct Params {
  TwellDeviceView act;
  const uint16_t* x;
  const uint16_t* wu;
  const uint16_t* wd;
  uint16_t* u_vals;
  uint16_t* y;
  int64_t H;
};

__device__ __forceinline__ uint64_t l2_keep_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint4 load_keep(const void* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

// A token's staged non-zeros: neuron index, activation value, and where its u lives.
struct StagedList {
  int32_t col[kListCap];
  float act[kListCap];
  uint32_t u_index[kListCap];  // index into u_vals
  uint32_t tile_offset[32];
  int n_tiles;
  uint32_t len;
};

// Stages the non-zeros of tiles [t_begin, t_begin + s.n_tiles) of `row` (as many as fit) in
// ascending column order; returns the next t_begin. Must be called by the whole block.
__device__ int64_t stage(const TwellDeviceView& a, int64_t row, int64_t t_begin, StagedList& s) {
  const TwellLayout& l = a.layout;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const int64_t n_tiles = l.n_tiles(), row_tiles = row * n_tiles;
  if (warp == 0) {  // scan up to 32 tile counts; keep the longest prefix that fits kListCap
    const int64_t t = t_begin + lane;
    const uint32_t count = t < n_tiles ? __ldcs(a.counts + row_tiles + t) : 0u;
    uint32_t incl = count;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const uint32_t o = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += o;
    }
    // A prefix of lanes: incl is non-decreasing, and one tile always fits (count <= T <= cap).
    const int n_fit = __popc(__ballot_sync(0xffffffffu, t < n_tiles && incl <= kListCap));
    const uint32_t total = __shfl_sync(0xffffffffu, incl, max(n_fit - 1, 0));
    if (lane < n_fit) s.tile_offset[lane] = incl - count;
    if (lane == 0) s.n_tiles = n_fit, s.len = total;
  }
  __syncthreads();
  const int n_stage = s.n_tiles;
  for (int i = warp; i < n_stage; i += n_warps) {
    const int64_t t = t_begin + i, tile_id = row_tiles + t;
    const uint32_t count = __ldcs(a.counts + tile_id);
    const uint32_t* words = a.slots + tile_id * l.slots();
    const int64_t base = t * l.tile;
    const uint32_t off = s.tile_offset[i];
    if (!twell_is_spilled(l, count)) {
      for (uint32_t k = lane; k < count; k += 32) {
        const uint32_t e = __ldcs(words + k);
        s.col[off + k] = static_cast<int32_t>(base + twell_entry_col(e));
        s.act[off + k] = twell_entry_value(e);
        s.u_index[off + k] = static_cast<uint32_t>(tile_id * l.slots() + k);
      }
    } else {
      const uint32_t b = __ldcs(words);
      const uint16_t* dense = a.backup + static_cast<int64_t>(b) * l.tile;
      const int32_t width = l.tile_width(t);
      uint32_t n = off;
      for (int c0 = 0; c0 < width; c0 += 32) {
        const int c = c0 + lane;
        const uint16_t v = c < width ? dense[c] : 0;
        const uint32_t mask = __ballot_sync(0xffffffffu, v != 0);
        if (v != 0) {
          const uint32_t k = n + __popc(mask & ((1u << lane) - 1));
          s.col[k] = static_cast<int32_t>(base + c);
          s.act[k] = bf16_bits_to_float(v);
          s.u_index[k] = static_cast<uint32_t>(l.slot_size() + static_cast<int64_t>(b) * l.tile + c);
        }
        n += __popc(mask);
      }
    }
  }
  __syncthreads();
  return t_begin + n_stage;
}

// up: u[m, j] = bf16(x[m] · Wu[j]) for every active (m, j). Warp w of the block takes entries
// w, w + 4, ... of the token's list and computes each dot product over all of H, two rows in
// flight; no barrier between entries. Lane order, then a fixed shuffle tree: deterministic.
template <int kChunks>  // ceil(H / 256): lane holds columns c·256 + 8·lane .. + 8 of chunk c
__global__ __launch_bounds__(kUpThreads) void twell_ffn_up_kernel(const __grid_constant__ Params p) {
  __shared__ StagedList s;
  const uint64_t keep = l2_keep_policy();
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  constexpr int kWarps = kUpThreads / 32;

  uint4 xq[kChunks];  // packed bf16: unpacked per use, to leave registers for rows in flight
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t col = c * 256 + lane * 8;
    xq[c] = col < p.H ? __ldcs(reinterpret_cast<const uint4*>(p.x + row * p.H + col)) : make_uint4(0, 0, 0, 0);
  }
  auto load = [&](uint4 (&w)[kChunks], uint32_t k) {
    const uint16_t* base = p.wu + static_cast<int64_t>(s.col[k]) * p.H + lane * 8;
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      w[c] = c * 256 + lane * 8 < p.H ? load_keep(base + c * 256, keep) : make_uint4(0, 0, 0, 0);
  };
  auto finish = [&](const uint4 (&w)[kChunks], uint32_t k) {
    float dot = 0.f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float wf[8], xf[8];
      unpack8(w[c], wf);
      unpack8(xq[c], xf);
#pragma unroll
      for (int i = 0; i < 8; ++i) dot = fmaf(xf[i], wf[i], dot);
    }
#pragma unroll
    for (int d = 16; d >= 1; d /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, d);
    if (lane == 0) p.u_vals[s.u_index[k]] = float_to_bf16_bits(dot);
  };

  for (int64_t t = 0; t < p.act.layout.n_tiles();) {
    t = stage(p.act, row, t, s);
    const uint32_t len = s.len;
    if constexpr (kChunks <= 8) {  // two rows in flight
      uint4 w0[kChunks], w1[kChunks];
      if (static_cast<uint32_t>(warp) < len) load(w0, warp);
      for (uint32_t k = warp; k < len; k += 2 * kWarps) {
        if (k + kWarps < len) load(w1, k + kWarps);
        finish(w0, k);
        if (k + 2 * kWarps < len) load(w0, k + 2 * kWarps);
        if (k + kWarps < len) finish(w1, k + kWarps);
      }
    } else {  // wide H: one row of 2·H bytes per warp already fills the registers
      uint4 w0[kChunks];
      for (uint32_t k = warp; k < len; k += kWarps) {
        load(w0, k);
        finish(w0, k);
      }
    }
    __syncthreads();  // the next stage overwrites the list
  }
}

// down: y[m] = Σ_j h[m, j] · Wd[j] over the active set, ascending j.
// NOTE: capped at 64 registers (two 512-thread blocks' worth): 4 resident blocks of 256 threads
// ran the down pass in 2.20 ms instead of 2.43 ms at 92 registers (M = 131072, 0.5%, ncu).
template <bool kGated, bool kHFp32>
__global__ __launch_bounds__(kMaxDownThreads, 2) void twell_ffn_down_kernel(const __grid_constant__ Params p) {
  __shared__ StagedList s;
  const uint64_t keep = l2_keep_policy();
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  const int64_t col0 = static_cast<int64_t>(tid) * kDownCols;
  const bool owns_cols = col0 < p.H;

  float acc[kDownCols] = {};
  for (int64_t t = 0; t < p.act.layout.n_tiles();) {
    t = stage(p.act, row, t, s);
    if (kGated) {  // h = g · u, rounded as a bf16 model does (h_fp32: kept in fp32)
      for (uint32_t k = tid; k < s.len; k += blockDim.x) {
        const float h = s.act[k] * bf16_bits_to_float(__ldcs(p.u_vals + s.u_index[k]));
        s.act[k] = kHFp32 ? h : round_bf16(h);
      }
      __syncthreads();
    }
    if (owns_cols) {
      for (uint32_t b0 = 0; b0 < s.len; b0 += kDownBatch) {
        const int nb = static_cast<int>(min(static_cast<uint32_t>(kDownBatch), s.len - b0));
        uint4 w[kDownBatch];
#pragma unroll
        for (int i = 0; i < kDownBatch; ++i)
          if (i < nb) w[i] = load_keep(p.wd + static_cast<int64_t>(s.col[b0 + i]) * p.H + col0, keep);
#pragma unroll
        for (int i = 0; i < kDownBatch; ++i) {
          if (i < nb) fma8(acc, s.act[b0 + i], w[i]);
        }
      }
    }
    __syncthreads();  // the next stage overwrites the list
  }

  if (owns_cols) {
    __stcs(reinterpret_cast<uint4*>(p.y + row * p.H + col0), pack8(acc));
  }
}

template <int kChunks>
void launch_up(const Params& p, int64_t M, cudaStream_t stream) {
  twell_ffn_up_kernel<kChunks><<<static_cast<unsigned>(M), kUpThreads, 0, stream>>>(p);
}

}  // namespace

int64_t twell_u_size(const TwellDeviceView& act) {
  return act.layout.slot_size() + act.backup_capacity * act.layout.tile;
}

void check_twell_ffn_sparse(const SparseFfnArgs& a) {
  const int64_t max_h = a.gated ? kMaxUpChunks * 256 : kMaxDownThreads * kDownCols;
  TWELL_CHECK(a.H % 64 == 0 && a.H <= max_h, "sparse FFN kernel: H = ", a.H, " must be a multiple of 64 and at most ",
              max_h);
  TWELL_CHECK(a.act.layout.tile <= kListCap, "sparse FFN kernel: TwELL tile width ", a.act.layout.tile,
              " above the supported ", kListCap);
  TWELL_CHECK(a.act.layout.rows == a.M && a.act.layout.cols == a.I, "sparse FFN kernel: activation is [",
              a.act.layout.rows, ", ", a.act.layout.cols, "], expected [", a.M, ", ", a.I, "]");
  TWELL_CHECK(twell_u_size(a.act) < (int64_t{1} << 32), "sparse FFN kernel: ", twell_u_size(a.act),
              " u values exceed 32-bit indexing; split the batch");
  TWELL_CHECK(a.precision != Precision::f64, "sparse FFN kernel: Precision::f64 is CPU-only");
  TWELL_CHECK(!a.gated || a.u_vals, "sparse FFN kernel: a gated FFN needs the u buffer");
}

void launch_twell_ffn_sparse(const SparseFfnArgs& a, cudaStream_t stream) {
  check_twell_ffn_sparse(a);
  if (a.M == 0) return;
  const Params p{a.act, a.x, a.wu, a.wd, a.u_vals, a.y, a.H};
  const int threads = static_cast<int>((a.H / kDownCols + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(a.M));
  if (a.gated) {
    const int64_t chunks = (a.H + 255) / 256;
    if (chunks <= 2) launch_up<2>(p, a.M, stream);
    else if (chunks <= 4) launch_up<4>(p, a.M, stream);
    else if (chunks <= 8) launch_up<8>(p, a.M, stream);
    else launch_up<16>(p, a.M, stream);
    TWELL_CUDA_CHECK(cudaGetLastError());
    if (a.precision == Precision::h_fp32)
      twell_ffn_down_kernel<true, true><<<grid, threads, 0, stream>>>(p);
    else
      twell_ffn_down_kernel<true, false><<<grid, threads, 0, stream>>>(p);
  } else {
    twell_ffn_down_kernel<false, false><<<grid, threads, 0, stream>>>(p);
  }
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
