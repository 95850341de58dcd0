// twell_ffn_updown: the sparse half of the FFN forward, over the active set held in TwELL.
//   gated:     for each active (m, j): u = bf16(x[m] · Wu[j]), h = bf16(g[m, j] · u); y[m] += h · Wd[j]
//   non-gated: for each active (m, j): h = act[m, j];                               y[m] += h · Wd[j]
// x, y [M, H]; Wu, Wd [I, H] (neuron-major rows, 16-byte aligned); bf16 in, fp32 accumulate, bf16 out.
//
// One block per token; thread t owns columns [16t, 16t + 16) of H (two 16-byte vectors), so a
// weight row is read by the block as one coalesced 2·H-byte stream. The token's non-zeros are
// walked in ascending column order (their list is staged in shared
// memory, as many tiles at a time as fit kListCap entries; a spilled tile is scanned from its
// dense backup), in batches of kBatch neurons:
//   load_up:   each thread loads its 16 columns of kBatch rows of Wu (2·kBatch loads in flight),
//   dot:       partial dots, reduced per warp by shuffles, then across warps in shared memory,
//   load_down: the kBatch rows of Wd are loaded while the cross-warp reduction waits,
//   axpy:      acc += h · Wd[j] in fp32.
// The summation order is fixed (per column: ascending j), so results are deterministic.
// Covered by tests/cuda/test_twell_ffn.cu; timed by `twell bench ffn`.
#include <cuda_bf16.h>

#include "cuda/kernels.h"

namespace twell::cuda {
namespace {

constexpr int kColsPerThread = 16;
constexpr int kBatch = 8;
constexpr int kMaxThreads = 512;  // H <= 8192; the bound leaves 128 registers per thread
constexpr int kListCap = 1024;     // staged non-zeros (>= the widest tile, so one tile always fits)

struct Params {
  TwellDeviceView act;
  const uint16_t* x;
  const uint16_t* wu;
  const uint16_t* wd;
  uint16_t* y;
  int64_t H;
};

__device__ __forceinline__ void load16(const uint16_t* p, uint4 (&v)[2]) {
  v[0] = __ldg(reinterpret_cast<const uint4*>(p));
  v[1] = __ldg(reinterpret_cast<const uint4*>(p) + 1);
}

__device__ __forceinline__ void unpack16(const uint4 (&v)[2], float (&f)[kColsPerThread]) {
  const uint32_t w[8] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    f[2 * i] = bits_float(w[i] << 16);
    f[2 * i + 1] = bits_float(w[i] & 0xffff0000u);
  }
}

template <bool kGated, bool kHFp32>
__global__ __launch_bounds__(kMaxThreads) void twell_ffn_updown_kernel(const __grid_constant__ Params p) {
  const TwellLayout& l = p.act.layout;
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n_warps = blockDim.x / 32;
  const int64_t col0 = static_cast<int64_t>(tid) * kColsPerThread;
  const bool owns_cols = col0 < p.H;

  __shared__ int32_t list_col[kListCap];  // neuron index j
  __shared__ float list_act[kListCap];    // g (gated) or h (non-gated)
  __shared__ uint32_t tile_offset[32];
  __shared__ int stage_tiles;
  __shared__ uint32_t stage_len;
  __shared__ float partial[2][kMaxThreads / 32][kBatch];

  float xr[kColsPerThread] = {};
  if (kGated && owns_cols) {
    uint4 v[2];
    load16(p.x + row * p.H + col0, v);
    unpack16(v, xr);
  }
  float acc[kColsPerThread] = {};
  int buf = 0;

  const int64_t n_tiles = l.n_tiles();
  const int64_t row_tiles = row * n_tiles;
  for (int64_t t_begin = 0; t_begin < n_tiles;) {
    // ---- stage the non-zeros of tiles [t_begin, t_end) in shared memory, ascending column ----
    // Warp 0 scans up to 32 tile counts and keeps the longest prefix that fits kListCap entries
    // (one tile always fits: count <= tile <= kListCap).
    if (warp == 0) {
      const int64_t t = t_begin + lane;
      const uint32_t count = t < n_tiles ? p.act.counts[row_tiles + t] : 0u;
      uint32_t incl = count;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const uint32_t o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
      }
      const uint32_t fits = __ballot_sync(0xffffffffu, t < n_tiles && incl <= kListCap);
      const int n_fit = __popc(fits);  // fits is a prefix of lanes: incl is non-decreasing
      const uint32_t total = __shfl_sync(0xffffffffu, incl, max(n_fit - 1, 0));
      if (lane < n_fit) tile_offset[lane] = incl - count;
      if (lane == 0) stage_tiles = n_fit, stage_len = total;
    }
    __syncthreads();
    const int n_stage = stage_tiles;
    const uint32_t count = stage_len;
    for (int i = warp; i < n_stage; i += n_warps) {
      const int64_t t = t_begin + i;
      const uint32_t tile_count = p.act.counts[row_tiles + t];
      const uint32_t* words = p.act.slots + (row_tiles + t) * l.slots();
      const int64_t base = t * l.tile;
      const uint32_t off = tile_offset[i];
      if (!twell_is_spilled(l, tile_count)) {
        for (uint32_t k = lane; k < tile_count; k += 32) {
          const uint32_t e = words[k];
          list_col[off + k] = static_cast<int32_t>(base + twell_entry_col(e));
          list_act[off + k] = twell_entry_value(e);
        }
      } else {
        const uint16_t* dense = p.act.backup + static_cast<int64_t>(words[0]) * l.tile;
        const int32_t width = l.tile_width(t);
        uint32_t n = off;
        for (int c0 = 0; c0 < width; c0 += 32) {
          const int c = c0 + lane;
          const uint16_t v = c < width ? dense[c] : 0;
          const uint32_t mask = __ballot_sync(0xffffffffu, v != 0);
          if (v != 0) {
            const uint32_t k = n + __popc(mask & ((1u << lane) - 1));
            list_col[k] = static_cast<int32_t>(base + c);
            list_act[k] = bf16_bits_to_float(v);
          }
          n += __popc(mask);
        }
      }
    }
    t_begin += n_stage;
    __syncthreads();

    // ---- batches of kBatch neurons ----
    for (uint32_t b0 = 0; b0 < count; b0 += kBatch) {
      const int nb = static_cast<int>(min(static_cast<uint32_t>(kBatch), count - b0));
      float h[kBatch];
      uint4 wv[kBatch][2];
      if constexpr (kGated) {
        // load_up + dot
        float dot[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
          if (i < nb && owns_cols) load16(p.wu + static_cast<int64_t>(list_col[b0 + i]) * p.H + col0, wv[i]);
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          dot[i] = 0.f;
          if (i < nb && owns_cols) {
            float w[kColsPerThread];
            unpack16(wv[i], w);
#pragma unroll
            for (int c = 0; c < kColsPerThread; ++c) dot[i] = fmaf(xr[c], w[c], dot[i]);
          }
#pragma unroll
          for (int d = 16; d >= 1; d /= 2) dot[i] += __shfl_xor_sync(0xffffffffu, dot[i], d);
        }
        if (lane == 0)
#pragma unroll
          for (int i = 0; i < kBatch; ++i) partial[buf][warp][i] = dot[i];
        // load_down while the block meets at the barrier
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
          if (i < nb && owns_cols) load16(p.wd + static_cast<int64_t>(list_col[b0 + i]) * p.H + col0, wv[i]);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          float u = 0.f;
          for (int w = 0; w < n_warps; ++w) u += partial[buf][w][i];
          u = round_bf16(u);
          const float g = i < nb ? list_act[b0 + i] : 0.f;
          h[i] = kHFp32 ? g * u : round_bf16(g * u);
        }
        buf ^= 1;
      } else {
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          h[i] = i < nb ? list_act[b0 + i] : 0.f;
          if (i < nb && owns_cols) load16(p.wd + static_cast<int64_t>(list_col[b0 + i]) * p.H + col0, wv[i]);
        }
      }
      // axpy: ascending j, one fp32 FMA per column.
      if (owns_cols) {
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          if (i < nb) {
            float w[kColsPerThread];
            unpack16(wv[i], w);
#pragma unroll
            for (int c = 0; c < kColsPerThread; ++c) acc[c] = fmaf(h[i], w[c], acc[c]);
          }
        }
      }
    }
    __syncthreads();  // the next stage overwrites the list
  }

  if (owns_cols) {
    uint32_t out[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      out[i] = static_cast<uint32_t>(float_to_bf16_bits(acc[2 * i])) |
               (static_cast<uint32_t>(float_to_bf16_bits(acc[2 * i + 1])) << 16);
    uint4* dst = reinterpret_cast<uint4*>(p.y + row * p.H + col0);
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
  }
}

}  // namespace

void check_twell_ffn_updown(const UpDownArgs& a) {
  TWELL_CHECK(a.H % 64 == 0 && a.H <= kMaxThreads * kColsPerThread, "sparse FFN kernel: H = ", a.H,
              " must be a multiple of 64 and at most ", kMaxThreads * kColsPerThread);
  TWELL_CHECK(a.act.layout.tile <= kListCap, "sparse FFN kernel: TwELL tile width ", a.act.layout.tile,
              " above the supported ", kListCap);
  TWELL_CHECK(a.act.layout.rows == a.M && a.act.layout.cols == a.I, "sparse FFN kernel: activation is [",
              a.act.layout.rows, ", ", a.act.layout.cols, "], expected [", a.M, ", ", a.I, "]");
  TWELL_CHECK(a.precision != Precision::f64, "sparse FFN kernel: Precision::f64 is CPU-only");
}

void launch_twell_ffn_updown(const UpDownArgs& a, cudaStream_t stream) {
  check_twell_ffn_updown(a);
  if (a.M == 0) return;
  const Params p{a.act, a.x, a.wu, a.wd, a.y, a.H};
  const int threads = static_cast<int>((a.H / kColsPerThread + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(a.M));
  if (a.gated && a.precision == Precision::h_fp32)
    twell_ffn_updown_kernel<true, true><<<grid, threads, 0, stream>>>(p);
  else if (a.gated)
    twell_ffn_updown_kernel<true, false><<<grid, threads, 0, stream>>>(p);
  else
    twell_ffn_updown_kernel<false, false><<<grid, threads, 0, stream>>>(p);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
