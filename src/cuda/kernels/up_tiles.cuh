// The forward's up pass by tiles of tokens x neurons (UpKernel::tiles): u[m, j] = bf16(x[m] · Wu[j])
// for every active (m, j), reading each row of x and of Wu once for a whole tile instead of once
// per active pair.
//
// Why: the row kernel (sddmm_loop) reads one 4 KB row of Wu from L2 for every active pair,
// 15 GB at M = 131072, 0.5%, which is what bounds it (the crossbar). A block here takes kTB
// tokens and kNT TwELL tiles of neurons (kNT·256 rows of Wu) and streams their rows through shared
// memory kKC columns at a time: (kTB + 256·kNT) rows a tile instead of its ~kTB·256·kNT·density
// pairs' rows (512 + 1024 rows for ~2600 pairs at 0.5%: about 0.6x the bytes).
//
// The block lists its tile's active pairs in token order (descriptors in shared memory, exact
// counts from the format, a spilled tile's entries from its dense backup), up to kCap of them a
// round (a denser tile takes several rounds, each streaming the rows again: slower, never wrong).
// A round's pairs are cut into 64 equal contiguous runs, one for each group of 4 threads; a
// group keeps a run's dot products in registers over all column chunks, each thread summing its
// 8 columns of every chunk (dot8), and adds its 4 partial sums at the end (butterfly, fixed
// order). A group reads one pair's 64-byte row chunks of x and Wu as 4 x 16 bytes; x only when
// the pair's token differs from the one before (runs are in token order).
//
// Deterministic: every sum's order depends only on the data, not on scheduling. The bits of u
// can differ from the row kernel's (another summation order) by a rounding.
#pragma once

#include "cuda/kernels/twell_rows.cuh"

namespace twell::cuda {
namespace {

constexpr int kTileThreads = 256;
constexpr int kTileGroups = kTileThreads / 4;
constexpr int kTilePairs = 48;                          // a group's run, in registers
constexpr int kTileBatch = 4;                           // pairs a step
constexpr int kTileCap = kTileGroups * kTilePairs;      // pairs a round
constexpr int kTileKC = 32;                             // columns a chunk: 64-byte row chunks

template <int kTB, int kNT>
constexpr int up_tiles_smem() {
  return (kTB + kNT * 256) * kTileKC * 2 + kTileCap * 4;
}

// Descriptor of a pair, laid out so that the inner loop finds its two row chunks in one operation
// each: bits 0-5 the slot of a packed entry, 6-14 the token in the tile times 64 (the byte offset
// of its row chunk in xs), 15 spilled, 16-31 the neuron in the tile times 64 (its offset in ws).
template <int kTB, int kNT>
struct TileDesc {
  static_assert(kTB <= 512 && kNT * 256 <= 1024, "offsets of 15 and 16 bits");
  static constexpr uint32_t kSpilled = 1u << 15;
  __device__ static uint32_t make(int tok, int neuron, int slot, bool spilled) {
    return static_cast<uint32_t>(slot) | static_cast<uint32_t>(tok) << 6 | (spilled ? kSpilled : 0u) |
           static_cast<uint32_t>(neuron) << 22;
  }
  __device__ static uint32_t x_off(uint32_t d) { return d & 0x7fc0u; }
  // Masked to 64 bytes: a batch's reads past its run may decode a stale word, and must stay aligned.
  __device__ static uint32_t w_off(uint32_t d) { return (d >> 16) & 0xffc0u; }
  __device__ static int tok(uint32_t d) { return (d >> 6) & 511; }
  __device__ static int neuron(uint32_t d) { return d >> 22; }
  __device__ static int slot(uint32_t d) { return d & 63; }
};

template <int kTB, int kNT>
__global__ __launch_bounds__(kTileThreads, 2) void twell_ffn_up_tiles_kernel(const __grid_constant__ Params p) {
  using Desc = TileDesc<kTB, kNT>;
  constexpr int kTokPerThread = kTB / kTileThreads;
  static_assert(kTokPerThread >= 1 && kTB % kTileThreads == 0);
  extern __shared__ __align__(128) char smem[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);  // [kTB][kTileKC]
  uint16_t* ws = xs + kTB * kTileKC;                 // [kNT·256][kTileKC]
  uint32_t* desc = reinterpret_cast<uint32_t*>(ws + kNT * 256 * kTileKC);  // [kTileCap]
  // Two blocks an SM: 2 x (this + the dynamic 112 KB + 1 KB reserved) must stay within 228 KB, so the
  // scan is hand-made (cub's BlockScan took 1.2 KB).
  __shared__ uint32_t warp_sums[kTileThreads / 32];

  start_pass(p);
  const TwellLayout& l = p.act.layout;
  const int64_t n_tiles = l.n_tiles(), slots = l.slots(), H = p.H;
  const int64_t groups = (n_tiles + kNT - 1) / kNT;
  const int64_t g = blockIdx.x % groups, m0 = (blockIdx.x / groups) * kTB, t0 = g * kNT;
  const int nt = static_cast<int>(min(int64_t{kNT}, n_tiles - t0));
  const int n_tok = static_cast<int>(min(int64_t{kTB}, l.rows - m0));
  const int n_neu = static_cast<int>(min(int64_t{kNT} * 256, l.cols - t0 * 256));

  // Each thread's tokens (contiguous, so that the scan's order is token order) and their pairs.
  uint32_t mine = 0;
#pragma unroll
  for (int i = 0; i < kTokPerThread; ++i) {
    const int tok = threadIdx.x * kTokPerThread + i;
    if (tok < n_tok)
      for (int t = 0; t < nt; ++t) mine += __ldg(p.act.counts + (m0 + tok) * n_tiles + t0 + t);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t incl = warp_inclusive_scan(mine, lane);
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  uint32_t first = incl - mine, P = 0;
#pragma unroll
  for (int w = 0; w < kTileThreads / 32; ++w) {
    if (w < warp) first += warp_sums[w];
    P += warp_sums[w];
  }

  const int grp = threadIdx.x / 4, j = threadIdx.x % 4;
  const uint64_t keep = l2_keep_policy();
  for (uint32_t base = 0; base < P; base += kTileCap) {
    // The round's descriptors: pairs [base, base + kTileCap) of the tile, in token order.
    const uint32_t end = base + kTileCap;
    uint32_t pos = first;
#pragma unroll
    for (int i = 0; i < kTokPerThread; ++i) {
      const int tok = threadIdx.x * kTokPerThread + i;
      if (tok >= n_tok) continue;
      for (int t = 0; t < nt && pos < end; ++t) {
        const int64_t tile = (m0 + tok) * n_tiles + t0 + t;
        const uint32_t count = __ldg(p.act.counts + tile);
        if (pos + count > base) {
          if (!twell_is_spilled(l, count)) {
            for (uint32_t k = 0; k < count; ++k)
              if (pos + k >= base && pos + k < end) {
                const uint32_t v = __ldg(p.act.slots + tile * slots + k);
                desc[pos + k - base] = Desc::make(tok, t * 256 + twell_entry_col(v), k, false);
              }
          } else {
            const uint32_t b = __ldg(p.act.slots + tile * slots);
            const uint16_t* dense = p.act.backup + static_cast<int64_t>(b) * l.tile;
            const int width = l.tile_width(t0 + t);
            uint32_t k = 0;
            for (int c = 0; c < width && pos + k < end; ++c)
              if (__ldg(dense + c) != 0) {
                if (pos + k >= base) desc[pos + k - base] = Desc::make(tok, t * 256 + c, 0, true);
                ++k;
              }
          }
        }
        pos += count;
      }
    }
    const int n_round = static_cast<int>(min(static_cast<uint32_t>(kTileCap), P - base));
    const int run = (n_round + kTileGroups - 1) / kTileGroups;
    const int my0 = grp * run, my_n = max(0, min(run, n_round - my0));

    float acc[kTilePairs];
#pragma unroll
    for (int i = 0; i < kTilePairs; ++i) acc[i] = 0.f;
    for (int64_t c0 = 0; c0 < H; c0 += kTileKC) {
      __syncthreads();  // the descriptors are written; the chunk before is read
      const int n_rows = n_tok + n_neu;
      for (int e = threadIdx.x; e < n_rows * 4; e += kTileThreads) {
        const int r = e / 4, q = e % 4;
        if (r < n_tok)
          cp_async16(xs + r * kTileKC + q * 8, p.x + (m0 + r) * H + c0 + q * 8, true);
        else
          cp_async16(ws + (r - n_tok) * kTileKC + q * 8, p.wu + (t0 * 256 + r - n_tok) * H + c0 + q * 8, true, keep);
      }
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
      // kTileBatch pairs at a time, without branches inside a batch, so that their loads and sums
      // interleave. A batch may run past the group's run (my_n): those descriptors are other
      // groups' or stale (desc stays in bounds: my0 + i < kTileCap), their sums never written.
      const char* xs_j = reinterpret_cast<const char*>(xs + j * 8);
      const char* ws_j = reinterpret_cast<const char*>(ws + j * 8);
#pragma unroll
      for (int i0 = 0; i0 < kTilePairs; i0 += kTileBatch) {
        if (i0 < my_n) {
          uint4 xq[kTileBatch], wq[kTileBatch];
#pragma unroll
          for (int b = 0; b < kTileBatch; ++b) {
            const uint32_t d = desc[my0 + i0 + b];
            xq[b] = *reinterpret_cast<const uint4*>(xs_j + Desc::x_off(d));
            wq[b] = *reinterpret_cast<const uint4*>(ws_j + Desc::w_off(d));
          }
#pragma unroll
          for (int b = 0; b < kTileBatch; ++b) {
            float xf[8], wf[8];
            unpack8(xq[b], xf);
            unpack8(wq[b], wf);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[i0 + b] = fmaf(xf[e], wf[e], acc[i0 + b]);
          }
        }
      }
    }
    // The group's four partial sums of each pair, then u. Thread j writes pairs i ≡ j (mod 4).
#pragma unroll
    for (int i = 0; i < kTilePairs; ++i) {
      float v = acc[i];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (i < my_n && i % 4 == j) {
        const uint32_t d = desc[my0 + i];
        const int64_t m = m0 + Desc::tok(d), t = t0 + Desc::neuron(d) / 256;
        const int64_t tile = m * n_tiles + t;
        int64_t out;
        if (d & Desc::kSpilled)
          out = l.slot_size() + static_cast<int64_t>(__ldg(p.act.slots + tile * slots)) * l.tile + Desc::neuron(d) % 256;
        else
          out = tile * slots + Desc::slot(d);
        p.u_vals[out] = float_to_bf16_bits(v);
      }
    }
    __syncthreads();  // the descriptors are rewritten by the next round
  }
}

template <int kTB, int kNT>
void launch_up_tiles(const Params& p, cudaStream_t stream, bool dependent) {
  const auto kernel = twell_ffn_up_tiles_kernel<kTB, kNT>;
  constexpr int smem = up_tiles_smem<kTB, kNT>();
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  // Two blocks an SM need the largest shared-memory carveout.
  TWELL_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  const int64_t groups = (p.act.layout.n_tiles() + kNT - 1) / kNT;
  const int64_t blocks = (p.act.layout.rows + kTB - 1) / kTB * groups;
  TWELL_CHECK(blocks < (int64_t{1} << 31), "sparse FFN kernel: too many tiles for the tiled up pass");
  launch_kernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kTileThreads), smem, stream, dependent, p);
}

}  // namespace
}  // namespace twell::cuda
