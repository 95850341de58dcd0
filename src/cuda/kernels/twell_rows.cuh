// The sparse FFN kernels over TwELL (launched by twell_ffn_sparse.cu: the forward; and
// twell_ffn_backward.cu: the backward's dh and dx): a warp takes a token (row_schedule) and
// stages its non-zeros from the format into a shared-memory list. The fused kernel then runs the
// SDDMM half over the list (16 entries at a time on the tensor cores, through a cp.async ring:
// u, or dh/dg/du) and the accumulate half (the entries' weight rows through a TMA-filled ring,
// summed into the token's output row: y, or dx); the non-gated down kernel only the second. The
// design and its measurements: the head of twell_ffn_sparse.cu and docs/perf.md.
#pragma once

#include <algorithm>

#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"
#include "cuda/kernels/bulk_copy.cuh"
#include "cuda/kernels/ffn_grad.cuh"
#include "cuda/kernels/mma_sync.cuh"

namespace twell::cuda {
namespace {

constexpr int kMaxChunks = 16;     // H <= 4096: lane l holds columns c·256 + 8l .. + 8, c < kMaxChunks
constexpr int kMaxTile = 1024;     // widest TwELL tile the list takes whole
constexpr int kMaxSlots = 8;       // ring depth cap
constexpr int kSmemBytes = 227 * 1024 - 256;  // the per-block maximum, less room for static shared memory

struct Params {
  TwellDeviceView act;
  const uint16_t* x;
  const uint16_t* wu;
  const uint16_t* wd;
  uint16_t* u_vals;
  uint16_t* y;
  int64_t H;
  int32_t ring_slots;  // D
  int32_t list_cap;    // entries of a warp's list (>= the tile width)
  uint32_t* next_row;    // the pass's light-row counter (zero at launch)
  uint32_t* next_heavy;  // the pass's heavy-row counter (zero at launch)
  RowCounts rows;
  // The backward (twell_ffn_backward.cu): dg and du of every active entry beside the format (bf16,
  // indexed like u_vals), the L1 coefficient, and the f32 rows of dx.
  uint16_t* dg_vals = nullptr;
  uint16_t* du_vals = nullptr;
  float l1 = 0.f;
  float* out_f32 = nullptr;
  const uint16_t* wg = nullptr;  // the dx pass's first weight
  float* row_scratch = nullptr;  // a warp's partial row (twell_row_scratch_bytes), for rows longer than a list
};

// What a staged list entry carries besides its column: its index into u_vals (the passes with an
// SDDMM half), its activation value as float bits (the non-gated down pass), or its dg and du as
// bf16 bits, dg low (the dx pass).
enum class Aux { u_index, h_plain, dg_du };

template <Aux kAux>
__device__ __forceinline__ uint32_t entry_aux(const Params& p, float act, uint32_t u_index) {
  if constexpr (kAux == Aux::u_index) return u_index;
  if constexpr (kAux == Aux::h_plain) return __float_as_uint(act);
  return __ldcs(p.dg_vals + u_index) | uint32_t{__ldcs(p.du_vals + u_index)} << 16;
}

// g of an active entry from its index into u_vals: the packed word, or the backup's value.
__device__ __forceinline__ float entry_g(const TwellDeviceView& a, uint32_t i) {
  const int64_t slot_size = a.layout.slot_size();
  return i < slot_size ? twell_entry_value(__ldg(a.slots + i)) : bf16_bits_to_float(__ldg(a.backup + (i - slot_size)));
}

__device__ __forceinline__ uint32_t warp_inclusive_scan(uint32_t v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t o = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += o;
  }
  return v;
}

// Stages the non-zeros of `row` from tile `t` on, as many whole tiles as fit the list, in
// ascending column order; advances t and returns the number staged. Whole warp. Lane i takes
// tile t + i; the packed entries of all of them are then read 32 at a time, lane e finding its
// tile by a binary search over the prefix sums (a lane walking its own tile serially costs a
// memory round trip per entry: 2x slower on skewed activations, whose hot tiles hold up to 32).
template <Aux kAux>
__device__ uint32_t stage(const Params& p, int64_t row, int64_t& t, int64_t t_stop, int32_t* col, uint32_t* aux,
                          int lane) {
  const TwellLayout& l = p.act.layout;
  const int64_t n_tiles = t_stop, row_tiles = row * l.n_tiles(), slots = l.slots();
  const uint32_t cap = static_cast<uint32_t>(p.list_cap);
  uint32_t len = 0;
  while (t < n_tiles) {
    const int64_t tt = t + lane;
    const uint32_t count = tt < n_tiles ? __ldcs(p.act.counts + row_tiles + tt) : 0u;
    const uint32_t incl = warp_inclusive_scan(count, lane);
    // A prefix of lanes (incl is non-decreasing); a whole tile always fits an empty list.
    const int n_fit = __popc(__ballot_sync(0xffffffffu, tt < n_tiles && len + incl <= cap));
    if (n_fit == 0) break;
    const uint32_t off = len + incl - count;  // list position of this tile's first entry
    const bool mine = lane < n_fit, spilled = mine && twell_is_spilled(l, count);
    const uint32_t packed = mine && !spilled ? count : 0u;
    const uint32_t packed_incl = warp_inclusive_scan(packed, lane), packed_excl = packed_incl - packed;
    const uint32_t n_packed = __shfl_sync(0xffffffffu, packed_incl, 31);
    for (uint32_t e0 = 0; e0 < n_packed; e0 += 32) {
      const uint32_t e = e0 + lane;
      int i = 0;  // the first lane whose packed_incl exceeds e
#pragma unroll
      for (int step = 16; step >= 1; step /= 2)
        if (__shfl_sync(0xffffffffu, packed_incl, i + step - 1) <= e) i += step;
      const uint32_t k = e - __shfl_sync(0xffffffffu, packed_excl, i);
      const uint32_t dst = __shfl_sync(0xffffffffu, off, i) + k;
      if (e < n_packed) {
        const int64_t word = (row_tiles + t + i) * slots + k;
        const uint32_t v = __ldcs(p.act.slots + word);
        col[dst] = static_cast<int32_t>((t + i) * l.tile + twell_entry_col(v));
        aux[dst] = entry_aux<kAux>(p, twell_entry_value(v), static_cast<uint32_t>(word));
      }
    }
    // Spilled tiles, one at a time, the whole warp over its dense backup, 8 columns a lane. Each
    // lane first reads its own tile's backup index and asks L2 for the tile, so that the loop
    // below waits on L2 once per tile rather than on DRAM twice.
    uint32_t backup = 0;
    if (spilled) {
      backup = __ldcs(p.act.slots + (row_tiles + tt) * slots);
      const uint16_t* dense = p.act.backup + static_cast<int64_t>(backup) * l.tile;
      for (int c = 0; c < l.tile; c += 64)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(dense + c));
    }
    for (uint32_t spills = __ballot_sync(0xffffffffu, spilled); spills; spills &= spills - 1) {
      const int src = __ffs(spills) - 1;
      const int64_t ts = t + src;
      const uint32_t b = __shfl_sync(0xffffffffu, backup, src);
      const uint16_t* dense = p.act.backup + static_cast<int64_t>(b) * l.tile;
      const int32_t width = l.tile_width(ts);
      uint32_t n = __shfl_sync(0xffffffffu, off, src);
      for (int c0 = 0; c0 < width; c0 += 256) {
        const int c = c0 + lane * 8;
        const uint4 q = c < width ? __ldcs(reinterpret_cast<const uint4*>(dense + c)) : make_uint4(0, 0, 0, 0);
        // Two 64-bit halves shifted by a run-time amount (indexing a uint32_t[4] by i / 2 at run
        // time put the array on the stack).
        const uint64_t lo = q.x | static_cast<uint64_t>(q.y) << 32, hi = q.z | static_cast<uint64_t>(q.w) << 32;
        uint32_t nz = 0;  // bit i: column c + i is non-zero
#pragma unroll
        for (int i = 0; i < 8; ++i) nz |= uint32_t{((i < 4 ? lo >> (16 * i) : hi >> (16 * (i - 4))) & 0xffffu) != 0} << i;
        const uint32_t cnt = __popc(nz), lane_incl = warp_inclusive_scan(cnt, lane);
        uint32_t k = n + lane_incl - cnt;
        for (uint32_t m = nz; m; m &= m - 1) {
          const int i = __ffs(m) - 1;
          const uint16_t v = static_cast<uint16_t>(i < 4 ? lo >> (16 * i) : hi >> (16 * (i - 4)));
          col[k] = static_cast<int32_t>(ts * l.tile + c + i);
          aux[k] = entry_aux<kAux>(p, bf16_bits_to_float(v),
                                     static_cast<uint32_t>(l.slot_size() + static_cast<int64_t>(b) * l.tile + c + i));
          ++k;
        }
        n += __shfl_sync(0xffffffffu, lane_incl, 31);
      }
    }
    len += __shfl_sync(0xffffffffu, incl, n_fit - 1);
    t += n_fit;
  }
  __syncwarp();
  return len;
}

// Asks L2 for what staging `row` will read (its counts and packed words; x or dy for the fused
// passes' SDDMM half), one token ahead, so that staging waits on L2 rather
// than DRAM. Lane i covers tile i (a tile's 32 slot words are one 128-byte line at C = 8).
__device__ __forceinline__ void prefetch_row(const Params& p, int64_t row, bool x_too, int lane) {
  if (row >= p.act.layout.rows) return;
  const TwellLayout& l = p.act.layout;
  const int64_t n_tiles = l.n_tiles();
  auto prefetch = [](const void* a) { asm volatile("prefetch.global.L2 [%0];" ::"l"(a)); };
  if (lane == 0) prefetch(p.act.counts + row * n_tiles);
  for (int64_t tt = lane; tt < n_tiles; tt += 32) {
    const int64_t word = (row * n_tiles + tt) * l.slots();
    prefetch(p.act.slots + word);
  }
  if (x_too)
    for (int64_t c = lane * 64; c < p.H; c += 32 * 64) prefetch(p.x + row * p.H + c);
}

// The next token for this warp: dynamic, because token costs vary 10-20x in skewed activations
// (a static round-robin measured 2x slower there: the warp with the most dense tokens decides).
// Heavy rows (listed by the pack) are skipped here: phase 1 of row_schedule took them.
__device__ __forceinline__ int64_t grab_row(const Params& p, int lane) {
  uint32_t r = 0;
  if (lane == 0) {
    do r = atomicAdd(p.next_row, 1u);
    while (p.rows.row_nnz && r < p.act.layout.rows && __ldcs(p.rows.row_nnz + r) > kHeavyRowEntries);
  }
  return __shfl_sync(0xffffffffu, r, 0);
}

// Threads a block of the row kernels: 16 warps, 8 at H > 2048 (the accumulators need the
// registers).
constexpr int threads_for(int chunks) { return chunks > 8 ? 256 : 512; }

// The warps that share a heavy row (row_schedule): their tile shares are equal but for the last,
// so the most even split of n_tiles over a group that divides the block's warps, from n_warps
// down to 4 (H = 2048, 16 warps, 22 tiles: 8 warps of 3 tiles each, 92% busy, where the whole
// block took 2 tiles a warp with 5 of its 16 warps idle).
struct HeavyGroup {
  int index, warp, warps;  // the group's index in the block, this warp's place in it, its size
  int64_t t0, t1;          // this warp's tiles of the row
};
__device__ __forceinline__ HeavyGroup heavy_group(int64_t n_tiles) {
  const int n_warps = blockDim.x / 32, warp = threadIdx.x / 32;
  auto busy = [&](int g) { return float(n_tiles) / float(g * ((n_tiles + g - 1) / g)); };
  int g = n_warps;
  for (int c = n_warps / 2; c >= 4 && n_warps % c == 0; c /= 2)
    if (busy(c) > busy(g) + 0.05f) g = c;
  HeavyGroup h{warp / g, warp % g, g, 0, 0};
  const int64_t share = (n_tiles + g - 1) / g;
  h.t0 = min(n_tiles, h.warp * share), h.t1 = min(n_tiles, h.t0 + share);
  return h;
}
__device__ __forceinline__ void group_sync(const HeavyGroup& h) {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + h.index), "r"(32 * h.warps) : "memory");
}

// Which rows a warp works on, shared by the row kernels. Phase 1, the heavy rows (10-20x the mean
// count in skewed activations: one warp would take as long on one of them as on ~15 ordinary
// rows, and the last ones to start set the kernel's end): a group of warps (heavy_group) takes a
// row, each warp a contiguous share of its tiles, and end_heavy(row, group) combines the shares
// in warp order (deterministic). Phase 2, the other rows, a warp each, from a global counter.
// work(row, t, t_stop, group) does the warp's work on tiles [t, t_stop) of a row, group null but
// for a heavy row's share.
template <typename Work>
__device__ __forceinline__ void row_schedule(const Params& p, bool prefetch_x, int lane, Work&& work) {
  const int64_t rows = p.act.layout.rows, n_tiles = p.act.layout.n_tiles();
  if (p.rows.row_nnz) {
    const uint32_t n_heavy = *p.rows.heavy_count;
    __shared__ int64_t heavy_row[4];  // a group's row (groups of >= 4 warps, <= 16 warps a block)
    const HeavyGroup g = heavy_group(n_tiles);
    for (;;) {
      if (g.warp == 0 && lane == 0) {
        const uint32_t i = atomicAdd(p.next_heavy, 1u);
        heavy_row[g.index] = i < n_heavy ? static_cast<int64_t>(p.rows.heavy_rows[i]) : -1;
      }
      group_sync(g);
      const int64_t row = heavy_row[g.index];
      group_sync(g);
      if (row < 0) break;
      work(row, g.t0, g.t1, &g);
    }
  }
  for (int64_t row = grab_row(p, lane), next; row < rows; row = next) {
    next = grab_row(p, lane);  // grabbed early so that its data can be prefetched
    prefetch_row(p, next, prefetch_x, lane);
    work(row, int64_t{0}, n_tiles, static_cast<const HeavyGroup*>(nullptr));
  }
}

// A warp's ring of D weight rows in shared memory, filled by the TMA engine (the accumulate
// passes). `issued` and `consumed` count rows over the whole kernel: slot i % D is on its
// (i / D)-th use, the parity its barrier completes with.
// NOTE: the passes' time scaled with 1/warps at a fixed ring size (6 to 12 warps, 3 to 8 slots,
// M = 131072: 4.74 -> 2.65 ms), so warps matter more than rows in flight; staging the next
// token's list during the current token's rows (double-buffered lists, fewer warps for the
// room) measured slower (docs/perf.md).
struct TmaRing {
  char* ring;
  uint64_t* full;
  uint32_t D, row_bytes;
  uint64_t keep;
  uint32_t issued = 0, consumed = 0;

  // For every entry k < n of a staged list, in order, use(aux[k], row, 0) with its row of w in
  // shared memory and, with kRows = 2, then use(aux[k], row, 1) with its row of w2; up to D rows
  // in flight.
  template <int kRows, typename Use>
  __device__ __forceinline__ void run(const Params& p, const uint16_t* w, const uint16_t* w2, const int32_t* col,
                                      const uint32_t* aux, uint32_t n, int lane, Use&& use) {
    static_assert(kRows == 1 || kRows == 2);
    const uint32_t len = kRows * n;
    auto issue = [&](uint32_t k) {
      if (lane == 0) {
        const uint32_t slot = issued % D;
        const uint16_t* src = kRows == 2 && k % 2 ? w2 : w;
        bulk_load(ring + slot * row_bytes, src + static_cast<int64_t>(col[k / kRows]) * p.H, row_bytes, full + slot,
                  keep);
      }
      ++issued;
    };
    uint32_t k_issue = 0;
    for (; k_issue < len && k_issue < D; ++k_issue) issue(k_issue);
    for (uint32_t k = 0; k < len; ++k) {
      const uint32_t slot = consumed % D;
      wait_parity(full + slot, (consumed / D) & 1u);
      use(aux[k / kRows], reinterpret_cast<const uint16_t*>(ring + slot * row_bytes), static_cast<int>(k % kRows));
      ++consumed;
      __syncwarp();  // every lane is done with the slot before the TMA overwrites it
      if (k_issue < len) issue(k_issue++);
    }
  }
};

__device__ __forceinline__ void init_barriers(uint64_t* full, int slots, int lane) {
  if (lane < slots) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(full + lane)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
}

// The SDDMM half of a pass (the forward's up, the backward's dh): for every entry e of a staged
// list, dot = x[m] · W[col[e]] in f32 on the tensor cores, then epilogue(e, dot) by one lane.
// The entries run 16 at a time as the rows of an m16n8k16 A operand against x, which is every
// column of B (so every column of D holds the 16 dot products). x is in the warp's shared memory
// (copy_x); the 16 rows stream through a ring of kSddmmStages stages of 64 columns (2 KB: 16 rows
// x one 128-byte line), filled by cp.async with a full line a row per instruction (eight lanes x
// 16 bytes: loads straight into registers in the fragment layout cover only 64 bytes of a row,
// and the L2 then ran out of tag lookups, perf.md item 20), read by ldmatrix, 16-byte chunks
// XOR-swizzled by row so that both are free of bank conflicts. The stages of all the list's
// groups form one sequence, so the next group's rows load while the current one finishes. Fixed
// summation order (the tensor core's, even and odd k16 steps in two accumulators, then added):
// deterministic.
constexpr int kSddmmStages = 4;
constexpr int kSddmmStageBytes = 16 * 128;

struct Sddmm {
  uint16_t* xs;  // x, H bf16
  char* ring;    // kSddmmStages x kSddmmStageBytes
  uint64_t keep;

  // Starts copying x (H bf16) into xs; the copy completes with run's first stage.
  __device__ __forceinline__ void copy_x(const Params& p, const uint16_t* x, int lane) const {
    for (int c = lane; c < p.H / 8; c += 32) cp_async16(xs + 8 * c, x + 8 * c, true);
  }

  template <typename Epilogue>
  __device__ __forceinline__ void run(const Params& p, const uint16_t* w, const int32_t* col, uint32_t len, int lane,
                                      Epilogue&& epilogue) const {
    // cp.async: lane copies 16-byte chunk copy_chunk of rows copy_row + 4i (4 rows an
    // instruction); ldmatrix of A: lane gives row frag_row, chunk 2s + frag_chunk of k16 step s.
    // Chunks are XOR-swizzled by row within a row's 128 bytes.
    const int copy_row = lane / 8, copy_chunk = lane % 8;
    const int frag_row = lane % 8 + 8 * (lane / 8 % 2), frag_chunk = lane / 16, frag_off = frag_row * 128;
    int dst_off[4], frag_chunk_off[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = copy_row + 4 * i;
      dst_off[i] = r * 128 + (copy_chunk ^ (r % 8)) * 16;
      frag_chunk_off[i] = ((2 * i + frag_chunk) ^ (frag_row % 8)) * 16;
    }
    const int groups = static_cast<int>((len + 15) / 16);
    // The copy side runs kSddmmStages - 1 stages ahead: group `ig`, columns `ik`, buffer `ibuf`;
    // src[i] is this lane's piece of row copy_row + 4i of group ig (zeros past the list).
    int ig = 0, ik = 0, ibuf = 0;
    const uint16_t* src[4];
    bool valid[4];
    auto rows_of = [&](int g) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t e = static_cast<uint32_t>(g * 16 + copy_row + 4 * i);
        valid[i] = e < len;
        src[i] = w + static_cast<int64_t>(col[valid[i] ? e : 0]) * p.H + 8 * copy_chunk;
      }
    };
    if (groups > 0) rows_of(0);  // an empty list reads no row
    auto issue = [&] {
      if (ig < groups) {
        char* buf = ring + ibuf * kSddmmStageBytes;
#pragma unroll
        for (int i = 0; i < 4; ++i) cp_async16(buf + dst_off[i], src[i] + ik, valid[i], keep);
        ik += 64;
        if (ik == p.H) {
          ik = 0;
          if (++ig < groups) rows_of(ig);
        }
        ibuf = ibuf + 1 == kSddmmStages ? 0 : ibuf + 1;
      }
      cp_async_commit();  // empty groups past the end keep the wait count uniform
    };
#pragma unroll
    for (int j = 0; j < kSddmmStages - 1; ++j) issue();
    int buf_i = 0;
    for (int g = 0; g < groups; ++g) {
      float d[4] = {}, e[4] = {};
      for (int k0 = 0; k0 < p.H; k0 += 64) {
        cp_async_wait<kSddmmStages - 2>();
        __syncwarp();  // this stage (and x) visible to every lane; the previous stage's buffer read by all
        issue();
        const char* frag = ring + buf_i * kSddmmStageBytes + frag_off;
        const uint16_t* xk = xs + k0 + 8 * (lane / 8);
        buf_i = buf_i + 1 == kSddmmStages ? 0 : buf_i + 1;
#pragma unroll
        for (int s = 0; s < 4; s += 2) {  // two k16 steps: x for both in one ldmatrix (every row the same)
          uint32_t xb[4], a[4];
          ldmatrix_x4(xb, xk + 16 * s);
          ldmatrix_x4(a, frag + frag_chunk_off[s]);
          mma_bf16(d, a, xb[0], xb[1]);
          ldmatrix_x4(a, frag + frag_chunk_off[s + 1]);
          mma_bf16(e, a, xb[2], xb[3]);
        }
      }
      // The group's 16 dot products: entry g·16 + lane/4 in d[0], + 8 in d[2].
      const uint32_t ia = static_cast<uint32_t>(g * 16 + lane / 4), ib = ia + 8;
      if (lane % 4 == 0) {
        if (ia < len) epilogue(ia, d[0] + e[0]);
        if (ib < len) epilogue(ib, d[2] + e[2]);
      }
    }
    cp_async_wait<0>();
    __syncwarp();  // the list, x and the ring are rewritten next
  }
};

// Where an accumulate pass writes its rows: bf16 into y (the forward's down pass), or f32 into
// out_f32 (the backward's dx pass).
enum class Out { bf16, f32_store };

template <Out kOut>
__device__ __forceinline__ void write_out8(const Params& p, int64_t row, int64_t col, const float (&v)[8]) {
  if constexpr (kOut == Out::bf16) {
    __stcs(reinterpret_cast<uint4*>(p.y + row * p.H + col), pack8(v));
  } else {
    float4* dst = reinterpret_cast<float4*>(p.out_f32 + row * p.H + col);
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

template <Out kOut>
__device__ __forceinline__ void write_out2(const Params& p, int64_t row, int64_t col, float lo, float hi) {
  if constexpr (kOut == Out::bf16) {
    reinterpret_cast<uint32_t*>(p.y + row * p.H)[col / 2] = pack2(lo, hi);
  } else {
    *reinterpret_cast<float2*>(p.out_f32 + row * p.H + col) = make_float2(lo, hi);
  }
}

// A token's output row in f32 registers: lane l holds columns c·256 + 8l .. + 8 for c < kChunks.
template <int kChunks>
struct RowAcc {
  float v[kChunks][8] = {};

  __device__ __forceinline__ void add(const Params& p, float a, const uint16_t* w, int lane) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      if (c * 256 + lane * 8 < p.H) fma8(v[c], a, *reinterpret_cast<const uint4*>(w + c * 256 + lane * 8));
  }
  // The whole accumulator, unconditionally (so that it is dead in registers between the two):
  // the partial sum of a row longer than one list, carried over its next staging.
  __device__ __forceinline__ void store(float* scratch, int lane) const {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float4* dst = reinterpret_cast<float4*>(scratch + c * 256 + lane * 8);
      dst[0] = make_float4(v[c][0], v[c][1], v[c][2], v[c][3]);
      dst[1] = make_float4(v[c][4], v[c][5], v[c][6], v[c][7]);
    }
  }
  __device__ __forceinline__ void load(const float* scratch, int lane) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const float4* src = reinterpret_cast<const float4*>(scratch + c * 256 + lane * 8);
      const float4 a = __ldcg(src), b = __ldcg(src + 1);
      v[c][0] = a.x, v[c][1] = a.y, v[c][2] = a.z, v[c][3] = a.w, v[c][4] = b.x, v[c][5] = b.y, v[c][6] = b.z, v[c][7] = b.w;
    }
  }
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int e = 0; e < 8; ++e) v[c][e] = 0.f;
  }
  template <Out kOut>
  __device__ __forceinline__ void write(const Params& p, int64_t row, int lane) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t col = c * 256 + lane * 8;
      if (col < p.H) write_out8<kOut>(p, row, col, v[c]);
    }
    clear();
  }
  // The group's shares of a heavy row, summed in warp order through `part` (g.warps x H f32 over
  // the group's drained rings).
  template <Out kOut>
  __device__ __forceinline__ void write_heavy(const Params& p, int64_t row, const HeavyGroup& g, float* part, int lane) {
    group_sync(g);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t col = c * 256 + lane * 8;
      if (col < p.H) {  // two 16-byte stores: conflict-free
        float4* dst = reinterpret_cast<float4*>(part + g.warp * p.H + col);
        dst[0] = make_float4(v[c][0], v[c][1], v[c][2], v[c][3]);
        dst[1] = make_float4(v[c][4], v[c][5], v[c][6], v[c][7]);
      }
    }
    clear();
    group_sync(g);
    for (int64_t col = 2 * (g.warp * 32 + lane); col < p.H; col += 2 * 32 * g.warps) {
      float lo = 0.f, hi = 0.f;
      for (int w = 0; w < g.warps; ++w) lo += part[w * p.H + col], hi += part[w * p.H + col + 1];
      write_out2<kOut>(p, row, col, lo, hi);
    }
    group_sync(g);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // before the TMA writes the rings again
  }
};

// The row kernels, one template: a warp takes a token, stages its list, then runs the SDDMM half
// over it (Sddmm: the entries' dot products with x, or dy, and what the epilogue derives from
// them, stored and left in the list's aux) and/or the accumulate half over the same list
// (TmaRing: the entries' rows of one or two weights, summed into the token's output row).
//   Pass::down_plain       y = Σ_j act·Wd[j]                       (the non-gated forward)
//   Pass::up_down[_fp32]   u = bf16(x·Wu[j]) (stored for the backward), h = g·u (bf16, or f32),
//                          then y = Σ_j h·Wd[j] (bf16): the gated forward in one pass, no second
//                          staging of the list, no round trip of u, one tail instead of two
//   Pass::dh               from dy·Wd[j]: dh, du, dg of the bf16 backward (ffn_grad.cuh), dg and
//                          du stored for the dx and dW passes
//   Pass::dx               dx = Σ_j (dg·Wg[j] + du·Wu[j]) (f32), one sum in the order dg·Wg[j0],
//                          du·Wu[j0], dg·Wg[j1], ...
// dh and dx stay two passes: Wd, Wg and Wu together (69 MB at H = 2048, I = 5632) do not stay in
// the H200's L2, where Wu and Wd (46 MB, like dx's Wg and Wu) do (docs/perf.md).
// Shared memory of warp w: a region that holds x and the SDDMM ring for the first half and the
// TMA ring for the second (region_bytes), then every warp's list, then the barriers.
enum class Pass { down_plain, up_down, up_down_fp32, dh, dx };

constexpr bool has_sddmm(Pass k) { return k == Pass::up_down || k == Pass::up_down_fp32 || k == Pass::dh; }
constexpr bool has_accumulate(Pass k) { return k != Pass::dh; }

constexpr int64_t region_bytes(Pass k, int64_t H, int slots) {
  const int64_t sddmm = has_sddmm(k) ? H * 2 + kSddmmStages * kSddmmStageBytes : 0;
  return std::max<int64_t>(sddmm, has_accumulate(k) ? slots * H * 2 : 0);
}

template <int kChunks, Pass kPass>
__global__ __launch_bounds__(threads_for(kChunks), 1) void twell_rows_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) char smem[];
  constexpr bool kForward = kPass == Pass::down_plain || kPass == Pass::up_down || kPass == Pass::up_down_fp32;
  constexpr Aux kAux = kPass == Pass::down_plain ? Aux::h_plain : kPass == Pass::dx ? Aux::dg_du : Aux::u_index;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const int64_t region = region_bytes(kPass, p.H, p.ring_slots);
  char* mine = smem + warp * region;
  char* lists = smem + n_warps * region;
  int32_t* col = reinterpret_cast<int32_t*>(lists) + int64_t{warp} * 2 * p.list_cap;
  uint32_t* aux = reinterpret_cast<uint32_t*>(col + p.list_cap);
  uint64_t* full = reinterpret_cast<uint64_t*>(lists + int64_t{n_warps} * 2 * p.list_cap * 4) + warp * p.ring_slots;
  if constexpr (has_accumulate(kPass)) init_barriers(full, p.ring_slots, lane);
  const uint64_t keep = l2_keep_policy();
  const Sddmm sddmm{reinterpret_cast<uint16_t*>(mine), mine + p.H * 2, keep};
  TmaRing ring{mine, full, static_cast<uint32_t>(p.ring_slots), static_cast<uint32_t>(p.H * 2), keep};
  // The SDDMM half's result for entry e (aux[e] comes in as its index into u_vals): u stored and
  // h left in aux as float bits (forward), or dg and du stored (backward).
  auto epilogue = [&](uint32_t e, float dot) {
    const uint32_t i = aux[e];
    const float g = entry_g(p.act, i);
    if constexpr (kForward) {
      const uint16_t u = float_to_bf16_bits(dot);
      p.u_vals[i] = u;
      const float h = g * bf16_bits_to_float(u);
      aux[e] = __float_as_uint(kPass == Pass::up_down_fp32 ? h : round_bf16(h));
    } else {
      float dg, du;
      gated_entry_grads(dot, g, bf16_bits_to_float(p.u_vals[i]), p.l1, dg, du);
      p.dg_vals[i] = float_to_bf16_bits(dg);
      p.du_vals[i] = float_to_bf16_bits(du);
    }
  };
  auto write = [&](RowAcc<kChunks>& acc, int64_t row, const HeavyGroup* g) {
    constexpr Out kOut = kForward ? Out::bf16 : Out::f32_store;
    if (g) acc.template write_heavy<kOut>(p, row, *g, reinterpret_cast<float*>(smem + int64_t{g->index} * g->warps * region), lane);
    else acc.template write<kOut>(p, row, lane);
  };
  // The SDDMM passes' lists carry u indices; the accumulate half wants h, as the epilogue made it
  // (a row longer than the list is staged again: h from the u stored by the SDDMM half, read past L1).
  auto to_h = [&](uint32_t n) {
    if constexpr (has_sddmm(kPass)) {
      for (uint32_t k = lane; k < n; k += 32) {
        const float h = entry_g(p.act, aux[k]) * bf16_bits_to_float(__ldcg(p.u_vals + aux[k]));
        aux[k] = __float_as_uint(kPass == Pass::up_down_fp32 ? h : round_bf16(h));
      }
      __syncwarp();
    }
  };
  // The accumulate half after an SDDMM half: the list holds n entries staged up to tile t of
  // [.., t_stop); the token's row (or share) is summed in registers that live only around the
  // rows' use, then written (a heavy row's share: summed with its group's). A row longer than one
  // list carries its partial sum through the warp's scratch row while the next part is staged,
  // so that staging never runs with the accumulators live (16 warps leave 128 registers a
  // thread: the SDDMM half's state and the accumulators did not fit together).
  auto accumulate = [&](int64_t row, int64_t t, int64_t t_stop, const HeavyGroup* g, uint32_t n) {
    float* scratch = p.row_scratch + (int64_t{blockIdx.x} * n_warps + warp) * kChunks * 256;
    for (bool first = true;; first = false) {
      RowAcc<kChunks> acc;
      if (!first) acc.load(scratch, lane);
      auto use = [&](uint32_t a, const uint16_t* w, int which) {
        const float v = kPass == Pass::dx ? bf16_bits_to_float(static_cast<uint16_t>(which ? a >> 16 : a & 0xffffu))
                                          : __uint_as_float(a);
        acc.add(p, v, w, lane);
      };
      if constexpr (kPass == Pass::dx) ring.run<2>(p, p.wg, p.wu, col, aux, n, lane, use);
      else ring.run<1>(p, p.wd, nullptr, col, aux, n, lane, use);
      if (t >= t_stop) return write(acc, row, g);
      acc.store(scratch, lane);
      __syncwarp();
      n = stage<kAux>(p, row, t, t_stop, col, aux, lane);
      to_h(n);
    }
  };
  auto work = [&](int64_t row, int64_t t, int64_t t_stop, const HeavyGroup* g) {
    if constexpr (!has_sddmm(kPass)) {
      // Staging with the accumulators live costs no spills here (no SDDMM half beside them).
      RowAcc<kChunks> acc;
      auto use = [&](uint32_t a, const uint16_t* w, int which) {
        const float v = kPass == Pass::dx ? bf16_bits_to_float(static_cast<uint16_t>(which ? a >> 16 : a & 0xffffu))
                                          : __uint_as_float(a);
        acc.add(p, v, w, lane);
      };
      while (t < t_stop) {
        const uint32_t n = stage<kAux>(p, row, t, t_stop, col, aux, lane);
        if constexpr (kPass == Pass::dx) ring.run<2>(p, p.wg, p.wu, col, aux, n, lane, use);
        else ring.run<1>(p, p.wd, nullptr, col, aux, n, lane, use);
      }
      write(acc, row, g);
    } else {
      // Every SDDMM stage of the row (or share) first; x stays in the region throughout.
      const int64_t t0 = t;
      uint32_t n = 0, stages = 0;
      while (t < t_stop) {
        n = stage<kAux>(p, row, t, t_stop, col, aux, lane);
        if (n == 0) continue;  // an empty row or share (its tiles all fit one stage)
        if (stages++ == 0) sddmm.copy_x(p, p.x + row * p.H, lane);  // completes with the first SDDMM stage
        sddmm.run(p, kForward ? p.wu : p.wd, col, n, lane, epilogue);
      }
      if constexpr (has_accumulate(kPass)) {
        // The region's generic-proxy accesses (cp.async, ldmatrix) before the TMA's writes.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncwarp();
        if (stages > 1) {  // the list holds the last part only: from the first again
          t = t0;
          n = stage<kAux>(p, row, t, t_stop, col, aux, lane);
          to_h(n);
        }
        accumulate(row, t, t_stop, g, n);  // (an empty row: zeros written)
      }
    }
  };
  row_schedule(p, has_sddmm(kPass), lane, work);
}

int list_cap_for(const TwellLayout& l) { return std::max<int>(l.tile, 256); }

// The kernels' kChunks for H: 256-column chunks a lane walks, rounded up to 2, 4, 8 or 16.
int64_t chunks_for(int64_t H) {
  const int64_t c = (H + 255) / 256;
  return c <= 2 ? 2 : c <= 4 ? 4 : c <= 8 ? 8 : 16;
}

// What the row-streaming kernels take: H, the tile width and I, the activation's shape, and
// u indices within 32 bits. `what` names the caller in the message.
void check_rows_args(const char* what, const TwellDeviceView& act, int64_t M, int64_t H, int64_t I) {
  const int64_t max_h = kMaxChunks * 256;
  TWELL_CHECK(H % 64 == 0 && H <= max_h, what, ": H = ", H, " must be a multiple of 64 and at most ", max_h);
  TWELL_CHECK(act.layout.tile <= kMaxTile && act.layout.tile % 8 == 0 && I % 8 == 0, what, ": TwELL tile width ",
              act.layout.tile, " and I = ", I, " must be multiples of 8, the tile at most ", kMaxTile);
  TWELL_CHECK(act.layout.rows == M && act.layout.cols == I, what, ": activation is [", act.layout.rows, ", ",
              act.layout.cols, "], expected [", M, ", ", I, "]");
  TWELL_CHECK(twell_u_size(act) < (int64_t{1} << 32), what, ": ", twell_u_size(act),
              " u values exceed 32-bit indexing; split the batch");
}
// Block shape of the accumulate kernels: the most warps (up to the kernel's register bound) that
// leave room for two ring slots each, then as many slots as fit. The passes' time measured
// ~1/warps and flat in the slots beyond two (docs/perf.md). H = 2048, tile 256: 16 warps x 3
// slots in both kernels. per_warp(slots): a warp's shared memory.
struct Config {
  int warps = 0, slots = 0;
  int64_t smem = 0;
};
template <typename PerWarp>
Config config_for(int max_warps, PerWarp&& per_warp) {
  auto slots_for = [&](int warps) {
    int slots = 0;
    while (slots < kMaxSlots && per_warp(slots + 1) * warps <= kSmemBytes) ++slots;
    return slots;
  };
  int warps = max_warps;
  while (warps > 1 && slots_for(warps) < 2) --warps;
  const int slots = slots_for(warps);
  return {warps, slots, warps * per_warp(slots)};
}

// Launches twell_rows_kernel<kChunks, kPass>, persistent, with its block shape.
template <int kChunks, Pass kPass>
void launch(Params p, int sm_count, int64_t M, cudaStream_t stream) {
  const auto kernel = twell_rows_kernel<kChunks, kPass>;
  const int64_t H = p.H, list = int64_t{p.list_cap} * 8;
  const Config c = config_for(threads_for(kChunks) / 32,
                              [&](int slots) { return region_bytes(kPass, H, slots) + list + slots * 8; });
  // >= 2: a heavy row's shares (warps x H f32) are summed over the rings.
  TWELL_CHECK(c.slots >= 2, "sparse FFN kernel: no room for two weight rows a warp in shared memory (H = ", p.H, ")");
  p.ring_slots = c.slots;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmemBytes);
  const int64_t blocks = std::min<int64_t>(sm_count, (M + c.warps - 1) / c.warps);
  kernel<<<static_cast<unsigned>(blocks), c.warps * 32, static_cast<int>(c.smem), stream>>>(p);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace
}  // namespace twell::cuda
