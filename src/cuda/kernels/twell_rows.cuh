// The machinery shared by the sparse FFN kernels over TwELL (twell_ffn_sparse.cu: forward up and
// down passes; twell_ffn_backward.cu: the backward's dh and dx passes): a warp takes a token
// (row_schedule) and stages its non-zeros from the format into a shared-memory list; the
// accumulate passes (down, dx) stream the weight rows those name through the warp's TMA-filled
// ring (warp_loop), the SDDMM passes (up, dh) run them 16 at a time on the tensor cores through a
// cp.async ring (sddmm_loop). The design and its measurements: the head of twell_ffn_sparse.cu
// and docs/perf.md.
#pragma once

#include <algorithm>

#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"
#include "cuda/kernels/bulk_copy.cuh"
#include "cuda/kernels/mma_sync.cuh"
#include "cuda/kernels/pack_report.cuh"
#include "cuda/kernels/rms_norm.cuh"

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
  // indexed like u_vals), the L1 coefficient, and the f32 rows the dx pass writes.
  uint16_t* dg_vals = nullptr;
  uint16_t* du_vals = nullptr;
  float l1 = 0.f;
  float* out_f32 = nullptr;
  // The forward's down pass with Out::residual_norm: the residual add + RMSNorm in place of y.
  ResidualNormOut then;
  PackReport report;  // made by the pass (start_pass), where set
};

// Shared memory of warp w: ring [D][H] bf16, list col [cap] and aux [cap], D mbarriers.
struct WarpSmem {
  char* ring;
  int32_t* col;
  uint32_t* aux;  // up: index into u_vals; down: h as float bits
  uint64_t* full;
};

__device__ __forceinline__ WarpSmem warp_smem(char* smem, const Params& p, int warp, int n_warps) {
  const int64_t ring_bytes = p.H * 2 * p.ring_slots;
  WarpSmem s;
  s.ring = smem + warp * ring_bytes;
  char* lists = smem + n_warps * ring_bytes;
  s.col = reinterpret_cast<int32_t*>(lists) + static_cast<int64_t>(warp) * 2 * p.list_cap;
  s.aux = reinterpret_cast<uint32_t*>(s.col + p.list_cap);
  s.full = reinterpret_cast<uint64_t*>(lists + static_cast<int64_t>(n_warps) * 2 * p.list_cap * 4) + warp * p.ring_slots;
  return s;
}

enum class Aux { u_index, h_gated, h_gated_fp32, h_plain, dg_du };

// The value a list entry carries, from its activation value and its index into u_vals.
template <Aux kAux>
__device__ __forceinline__ uint32_t entry_aux(const Params& p, float act, uint32_t u_index) {
  if constexpr (kAux == Aux::u_index) return u_index;
  if constexpr (kAux == Aux::h_plain) return __float_as_uint(act);
  if constexpr (kAux == Aux::dg_du) return __ldcs(p.dg_vals + u_index) | uint32_t{__ldcs(p.du_vals + u_index)} << 16;
  const float h = act * bf16_bits_to_float(__ldcs(p.u_vals + u_index));
  return __float_as_uint(kAux == Aux::h_gated_fp32 ? h : round_bf16(h));
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

// Asks L2 for what staging `row` will read (its counts, packed words and, for the gated down
// pass, their u values; x for the up pass), one token ahead, so that staging waits on L2 rather
// than DRAM. Lane i covers tile i (a tile's 32 slot words are one 128-byte line at C = 8).
__device__ __forceinline__ void prefetch_row(const Params& p, int64_t row, bool x_too, bool u_too, int lane) {
  if (row >= p.act.layout.rows) return;
  const TwellLayout& l = p.act.layout;
  const int64_t n_tiles = l.n_tiles();
  auto prefetch = [](const void* a) { asm volatile("prefetch.global.L2 [%0];" ::"l"(a)); };
  if (lane == 0) prefetch(p.act.counts + row * n_tiles);
  for (int64_t tt = lane; tt < n_tiles; tt += 32) {
    const int64_t word = (row * n_tiles + tt) * l.slots();
    prefetch(p.act.slots + word);
    if (u_too) prefetch(p.u_vals + word);
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

// Threads a block of the ring kernels (the accumulate passes): 16 warps, 8 at H > 2048 (their
// accumulators need the registers).
constexpr int threads_for(int chunks) { return chunks > 8 ? 256 : 512; }

// The warps that share a heavy row (row_schedule, kReduce): their tile shares are equal but for
// the last, so the most even split of n_tiles over a group that divides the block's warps, from
// n_warps down to 4 (H = 2048, 16 warps, 22 tiles: 8 warps of 3 tiles each, 92% busy, where the
// whole block took 2 tiles a warp with 5 of its 16 warps idle).
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

// Which rows a warp works on, shared by every row kernel. Phase 1, the heavy rows (10-20x the
// mean count in skewed activations: one warp would take as long on one of them as on ~15
// ordinary rows, and the last ones to start set the kernel's end): with kReduce (the accumulate
// passes, whose row is one sum) a group of warps (heavy_group) takes a row, each warp a
// contiguous share of its tiles, and end_heavy(row, group) combines the shares in warp order
// (deterministic); without (the SDDMM passes, whose entries are independent) a warp takes one
// share of kHeavyShareTiles tiles of a row at a time, from a global counter. Phase 2, the other
// rows, a warp each, from a global counter. run_tiles(row, t, t_stop) does the warp's work on
// tiles [t, t_stop) of a row.
constexpr int64_t kHeavyShareTiles = 2;
template <bool kReduce, typename Begin, typename RunTiles, typename End, typename EndHeavy>
__device__ __forceinline__ void row_schedule(const Params& p, bool prefetch_x, bool prefetch_u, int lane, Begin&& begin,
                                             RunTiles&& run_tiles, End&& end, EndHeavy&& end_heavy) {
  const int64_t rows = p.act.layout.rows, n_tiles = p.act.layout.n_tiles();
  if (p.rows.row_nnz) {
    const uint32_t n_heavy = *p.rows.heavy_count;
    if constexpr (kReduce) {
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
        begin(row);
        run_tiles(row, g.t0, g.t1);
        end_heavy(row, g);
      }
    } else {
      const int64_t pieces = (n_tiles + kHeavyShareTiles - 1) / kHeavyShareTiles;
      for (;;) {
        uint32_t i = 0;
        if (lane == 0) i = atomicAdd(p.next_heavy, 1u);
        i = __shfl_sync(0xffffffffu, i, 0);
        if (int64_t{i} >= int64_t{n_heavy} * pieces) break;
        const int64_t row = p.rows.heavy_rows[i / pieces], t0 = (i % pieces) * kHeavyShareTiles;
        begin(row);
        run_tiles(row, t0, min(n_tiles, t0 + kHeavyShareTiles));
        end_heavy(row, HeavyGroup{});
      }
    }
  }
  for (int64_t row = grab_row(p, lane), next; row < rows; row = next) {
    next = grab_row(p, lane);  // grabbed early so that its data can be prefetched
    prefetch_row(p, next, prefetch_x, prefetch_u, lane);
    begin(row);
    run_tiles(row, 0, n_tiles);
    end(row);
  }
}

// The ring kernels' work loop (the down pass, the backward's dx pass): for each token it grabs,
// begin(row), then for every active entry, in order, use(aux, row_in_smem, 0) with the entry's
// row of w in shared memory and, when w2 is given (the dx pass: Wg then Wu), use(aux,
// row_of_w2, 1) after it, then end(row). The token's list is staged as many tiles at a time
// as the list holds; its weight rows go through a ring of D slots filled by the TMA engine, up to
// D in flight, in slot order over the whole kernel: a slot's barrier completes with parity 0 on
// its first use, 1 on its second, and so on. The list's k-th row is entry k / kRows's row of w (k
// even or kRows = 1) or of w2.
// NOTE: the time of both passes scaled with 1/warps at a fixed ring size (6 to 12 warps, 3 to 8
// slots, M = 131072: 4.74 -> 2.65 ms for up), so warps matter more than rows in flight; staging
// the next token's list during the current token's rows (double-buffered lists, fewer warps for
// the room) measured slower (docs/perf.md).
template <Aux kAux, int kRows, typename Begin, typename Use, typename End, typename EndHeavy>
__device__ __forceinline__ void warp_loop(const Params& p, const uint16_t* w, const uint16_t* w2, const WarpSmem& s,
                                          bool prefetch_x, bool prefetch_u, int lane, Begin&& begin, Use&& use,
                                          End&& end, EndHeavy&& end_heavy) {
  static_assert(kRows == 1 || kRows == 2);
  const uint32_t D = static_cast<uint32_t>(p.ring_slots), row_bytes = static_cast<uint32_t>(p.H * 2);
  const uint64_t keep = l2_keep_policy();
  // The ring's next slot to fill, next slot to use and the parity that use waits for, kept as
  // counters (no division by D: two of them an entry were ~25 of its ~316 instructions).
  uint32_t issue_slot = 0, use_slot = 0, use_parity = 0;
  auto issue = [&](uint32_t k) {
    if (lane == 0) {
      const uint16_t* src = kRows == 2 && k % 2 ? w2 : w;
      // 32-bit product: check_rows_args holds I * H below 2^32.
      bulk_load(s.ring + issue_slot * row_bytes, src + static_cast<uint32_t>(s.col[k / kRows]) * (row_bytes / 2),
                row_bytes, s.full + issue_slot, keep);
    }
    issue_slot = issue_slot + 1 == D ? 0 : issue_slot + 1;
  };
  auto run_tiles = [&](int64_t row, int64_t t, int64_t t_stop) {
    while (t < t_stop) {
      const uint32_t len = kRows * stage<kAux>(p, row, t, t_stop, s.col, s.aux, lane);
      uint32_t k_issue = 0;
      for (; k_issue < len && k_issue < D; ++k_issue) issue(k_issue);
      for (uint32_t k = 0; k < len; ++k) {
        wait_parity(s.full + use_slot, use_parity);
        use(s.aux[k / kRows], reinterpret_cast<const uint16_t*>(s.ring + use_slot * row_bytes), k % kRows);
        if (++use_slot == D) use_slot = 0, use_parity ^= 1u;
        __syncwarp();  // every lane is done with the slot before the TMA overwrites it
        if (k_issue < len) issue(k_issue++);
      }
    }
  };
  row_schedule<true>(p, prefetch_x, prefetch_u, lane, begin, run_tiles, end, end_heavy);
}

// The SDDMM kernels' work (the forward's up pass, the backward's dh pass): for every active
// (m, j), dot = x[m] · W[j] in f32 on the tensor cores, then epilogue(aux, dot) by one lane.
// A warp takes a token (row_schedule), stages its entries (at most list_cap at a time) in its
// list col/aux, and runs them 16 at a time as the rows of an m16n8k16 A operand against x, which
// is every column of B (so every column of D holds the 16 dot products). x goes into the warp's
// shared memory once per token; the 16 rows stream through a ring of kSddmmStages stages of 64
// columns (2 KB: 16 rows x one 128-byte line), filled by cp.async with a full line a row per
// instruction (eight lanes x 16 bytes: loads straight into registers in the fragment layout
// cover only 64 bytes of a row, and the L2 then ran out of tag lookups, perf.md item 20), read
// by ldmatrix, 16-byte chunks XOR-swizzled by row so that both are free of bank conflicts.
// The stages of all the list's groups form one sequence, so the next group's rows load while
// the current one finishes. Fixed summation order (the tensor core's, even and odd k16 steps in
// two accumulators, then added): deterministic.
constexpr int kSddmmStages = 4;
constexpr int kSddmmStageBytes = 16 * 128;
constexpr int kSddmmMaxWarps = 16;
// Shared memory of one warp: the list (col, aux), x, the ring.
constexpr int64_t sddmm_warp_bytes(int64_t H, int cap) { return int64_t{cap} * 8 + H * 2 + kSddmmStages * kSddmmStageBytes; }

template <Aux kAux, typename Epilogue>
__device__ __forceinline__ void sddmm_loop(const Params& p, const uint16_t* w, char* smem, int lane, Epilogue&& epilogue) {
  char* base = smem + (threadIdx.x / 32) * sddmm_warp_bytes(p.H, p.list_cap);
  int32_t* col = reinterpret_cast<int32_t*>(base);
  uint32_t* aux = reinterpret_cast<uint32_t*>(col + p.list_cap);
  uint16_t* xs = reinterpret_cast<uint16_t*>(aux + p.list_cap);
  char* ring = reinterpret_cast<char*>(xs + p.H);
  const int H = static_cast<int>(p.H);  // <= kMaxChunks * 256: 32-bit loop tests (64-bit ones cost two instructions)
  const uint64_t keep = l2_keep_policy();
  // cp.async: lane copies 16-byte chunk copy_chunk of rows copy_row + 4i (4 rows an instruction);
  // ldmatrix of A: lane gives row frag_row, chunk 2s + frag_chunk of k16 step s. Chunks are
  // XOR-swizzled by row within a row's 128 bytes.
  const int copy_row = lane / 8, copy_chunk = lane % 8;
  const int frag_row = lane % 8 + 8 * (lane / 8 % 2), frag_chunk = lane / 16;
  int dst_off[4], frag_chunk_off[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = copy_row + 4 * i;
    dst_off[i] = r * 128 + (copy_chunk ^ (r % 8)) * 16;
    frag_chunk_off[i] = ((2 * i + frag_chunk) ^ (frag_row % 8)) * 16;
  }
  const int frag_off = frag_row * 128;
  auto run_tiles = [&](int64_t row, int64_t t, int64_t t_stop) {
    if (t >= t_stop) return;  // an empty share of a heavy row: x is not copied (nothing would wait for it)
    const uint16_t* x = p.x + row * p.H;
    for (int c = lane; c < p.H / 8; c += 32) cp_async16(xs + 8 * c, x + 8 * c, true);  // with stage 0's group
    while (t < t_stop) {
      const uint32_t len = stage<kAux>(p, row, t, t_stop, col, aux, lane);
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
          src[i] = w + static_cast<uint32_t>(col[valid[i] ? e : 0]) * static_cast<uint32_t>(H) + 8 * copy_chunk;
        }
      };
      if (groups > 0) rows_of(0);  // an empty list (all tiles of a share empty) reads no row
      auto issue = [&] {
        if (ig < groups) {
          char* buf = ring + ibuf * kSddmmStageBytes;
#pragma unroll
          for (int i = 0; i < 4; ++i) cp_async16(buf + dst_off[i], src[i] + ik, valid[i], keep);
          ik += 64;
          if (ik == H) {
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
        for (int k0 = 0; k0 < H; k0 += 64) {
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
          if (ia < len) epilogue(aux[ia], d[0] + e[0]);
          if (ib < len) epilogue(aux[ib], d[2] + e[2]);
        }
      }
      cp_async_wait<0>();
      __syncwarp();  // the list and the ring are rewritten by the next stage
    }
  };
  row_schedule<false>(p, true, false, lane, [](int64_t) {}, run_tiles, [](int64_t) {}, [](int64_t, const HeavyGroup&) {});
}

// The forward's passes (twell_ffn_sparse.cu) call this before they touch global memory (after
// setting up their own shared memory at most). Launched as programmatic dependents (launch_sddmm,
// launch: `dependent`), they wait here for the kernel before, then let the next pass launch onto
// the SMs their blocks leave. The last warp of block 0 makes the pack's report (Params::report) on
// the side before it takes rows; its copy of the counters sees the passes' own work counters
// mid-count (the host reads only the pack's).
__device__ __forceinline__ void start_pass(const Params& p) {
  wait_for_previous_grid();
  allow_dependent_launch();
  if (p.report.any() && blockIdx.x == 0 && threadIdx.x / 32 == blockDim.x / 32 - 1)
    make_report(p.report, threadIdx.x % 32, 32);
}

__device__ __forceinline__ void init_barriers(const WarpSmem& s, int slots, int lane) {
  if (lane < slots) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(s.full + lane)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
}

// Where an accumulate pass writes its rows: bf16 into y (the forward's down pass), f32 into
// out_f32 (the backward's dx pass), or, for the forward's down pass with Params::then, added into
// the residual and normalised (y not written).
enum class Out { bf16, f32_store, residual_norm };

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

// Out::residual_norm for a row the warp holds whole (lane l: columns c·256 + 8l .. + 8 of y in
// acc[c]): resid[row] = (resid[row] + before[row]) + bf16(y[row]) (before where not null),
// normed[row] = bf16(w · resid[row] / √(mean(resid[row]²) + eps)), the sum of squares over the
// lanes by a butterfly (every lane gets the same total). The arithmetic of add_rmsnorm_kernel
// (rms_norm.cuh) but for the sum's order. Leaves acc zeroed.
template <int kChunks>
__device__ __forceinline__ void residual_norm_row(const Params& p, int64_t row, float (&acc)[kChunks][8], int lane) {
  float* xr = p.then.resid + row * p.H;
  float sum_sq = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t col = c * 256 + lane * 8;
    if (col >= p.H) continue;
    float4* xv = reinterpret_cast<float4*>(xr + col);
    const float4 lo = __ldcs(xv), hi = __ldcs(xv + 1);  // read once here, next by the next layer
    float f[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    if (p.then.before) {  // the add the caller deferred, first (launch_add_rmsnorm's `before`)
      float b[8];
      unpack8(__ldcs(reinterpret_cast<const uint4*>(p.then.before + row * p.H + col)), b);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] += b[e];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[c][e] = f[e] + round_bf16(acc[c][e]);
    __stcs(xv, make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]));
    __stcs(xv + 1, make_float4(acc[c][4], acc[c][5], acc[c][6], acc[c][7]));
#pragma unroll
    for (int e = 0; e < 8; ++e) sum_sq += acc[c][e] * acc[c][e];
  }
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, d);
  const float inv = rms_inv(sum_sq, p.H, p.then.eps);
  uint16_t* o = p.then.normed + row * p.H;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t col = c * 256 + lane * 8;
    if (col < p.H) {
      float wf[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(p.then.w + col)), wf);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[c][e] = rms_scaled(wf[e], acc[c][e], inv);
      *reinterpret_cast<uint4*>(o + col) = pack8(acc[c]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[c][e] = 0.f;
  }
}

// Accumulate pass (SpMM): out[m] = Σ_j a[m, j] · W[j] over the active set, ascending j, with W = wd
// and a = the entry's aux value (h in the forward). The backward's dx (Aux::dg_du, W = wd holding
// Wg): out[m] = Σ_j (dg·Wg[j] + du·Wu[j]), one f32 sum in the order dg·Wg[j0], du·Wu[j0], dg·Wg[j1], ...
template <int kChunks, Aux kAux, Out kOut>
__global__ __launch_bounds__(threads_for(kChunks), 1) void twell_axpy_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) char smem[];
  const int lane = threadIdx.x % 32;
  const WarpSmem s = warp_smem(smem, p, threadIdx.x / 32, blockDim.x / 32);
  init_barriers(s, p.ring_slots, lane);
  start_pass(p);
  float acc[kChunks][8] = {};
  constexpr int kRows = kAux == Aux::dg_du ? 2 : 1;
  warp_loop<kAux, kRows>(
      p, p.wd, kRows == 2 ? p.wu : nullptr, s, false, kAux == Aux::h_gated || kAux == Aux::h_gated_fp32, lane,
      [](int64_t) {},
      [&](uint32_t a_bits, const uint16_t* w, int which) {
        const float a = kRows == 1 ? __uint_as_float(a_bits)
                                   : bf16_bits_to_float(static_cast<uint16_t>(which ? a_bits >> 16 : a_bits & 0xffffu));
        if (p.H == kChunks * 256) {  // every chunk whole: no test and branch around each (4 instructions)
#pragma unroll
          for (int c = 0; c < kChunks; ++c) fma8(acc[c], a, *reinterpret_cast<const uint4*>(w + c * 256 + lane * 8));
        } else {
#pragma unroll
          for (int c = 0; c < kChunks; ++c)
            if (c * 256 + lane * 8 < p.H) fma8(acc[c], a, *reinterpret_cast<const uint4*>(w + c * 256 + lane * 8));
        }
      },
      [&](int64_t row) {
        if constexpr (kOut == Out::residual_norm) {
          residual_norm_row<kChunks>(p, row, acc, lane);
        } else {
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int64_t col = c * 256 + lane * 8;
            if (col < p.H) write_out8<kOut>(p, row, col, acc[c]);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[c][e] = 0.f;
          }
        }
      },
      [&](int64_t row, const HeavyGroup& g) {  // the group's shares of a heavy row: summed in warp order
        // g.warps x H f32 over the group's (drained) rings
        float* part = reinterpret_cast<float*>(smem + int64_t{g.index} * g.warps * p.H * 2 * p.ring_slots);
        group_sync(g);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int64_t col = c * 256 + lane * 8;
          if (col < p.H) {  // two 16-byte stores: conflict-free
            float4* dst = reinterpret_cast<float4*>(part + g.warp * p.H + col);
            dst[0] = make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]);
            dst[1] = make_float4(acc[c][4], acc[c][5], acc[c][6], acc[c][7]);
          }
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[c][e] = 0.f;
        }
        group_sync(g);
        const int64_t col0 = 2 * (g.warp * 32 + lane), col_step = 2 * 32 * g.warps;
        float sum_sq = 0.f;  // Out::residual_norm: this lane's part of the row's sum of squares
        for (int64_t col = col0; col < p.H; col += col_step) {
          float lo = 0.f, hi = 0.f;
          for (int v = 0; v < g.warps; ++v) lo += part[v * p.H + col], hi += part[v * p.H + col + 1];
          if constexpr (kOut == Out::residual_norm) {
            float2* xv = reinterpret_cast<float2*>(p.then.resid + row * p.H + col);
            float2 r = *xv;
            if (p.then.before) {  // the deferred add first, as residual_norm_row
              const uint32_t b2 = *reinterpret_cast<const uint32_t*>(p.then.before + row * p.H + col);
              r.x += bits_float(b2 << 16), r.y += bits_float(b2 & 0xffff0000u);
            }
            r.x += round_bf16(lo), r.y += round_bf16(hi);
            *xv = r;
            sum_sq += r.x * r.x + r.y * r.y;
          } else {
            write_out2<kOut>(p, row, col, lo, hi);
          }
        }
        if constexpr (kOut == Out::residual_norm) {
          // The warps' sums, added in warp order through the first words of `part` (once every
          // warp has read its shares from there), then each lane normalises the columns it added.
#pragma unroll
          for (int d = 16; d >= 1; d /= 2) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, d);
          group_sync(g);
          if (lane == 0) part[g.warp] = sum_sq;
          group_sync(g);
          float total = 0.f;
          for (int v = 0; v < g.warps; ++v) total += part[v];
          const float inv = rms_inv(total, p.H, p.then.eps);
          for (int64_t col = col0; col < p.H; col += col_step) {
            const float2 r = *reinterpret_cast<const float2*>(p.then.resid + row * p.H + col);
            const uint32_t w2 = __ldg(reinterpret_cast<const uint32_t*>(p.then.w + col));
            reinterpret_cast<uint32_t*>(p.then.normed + row * p.H)[col / 2] =
                pack2(rms_scaled(bits_float(w2 << 16), r.x, inv), rms_scaled(bits_float(w2 & 0xffff0000u), r.y, inv));
          }
        }
        group_sync(g);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // before the TMA writes the rings again
      });
}

int list_cap_for(const TwellLayout& l) { return std::max<int>(l.tile, 256); }

// What the row-streaming kernels take: H, the tile width and I, the activation's shape, u
// indices within 32 bits and weight-row offsets (I · H) within 32 bits. Returns why not, naming
// the caller (`what`), or "" where they take it.
std::string rows_args_problem(const char* what, const TwellDeviceView& act, int64_t M, int64_t H, int64_t I) {
  const int64_t max_h = kMaxChunks * 256;
  if (!(H % 64 == 0 && H <= max_h)) return str(what, ": H = ", H, " must be a multiple of 64 and at most ", max_h);
  if (!(act.layout.tile <= kMaxTile && act.layout.tile % 8 == 0 && I % 8 == 0))
    return str(what, ": TwELL tile width ", act.layout.tile, " and I = ", I,
               " must be multiples of 8, the tile at most ", kMaxTile);
  if (!(act.layout.rows == M && act.layout.cols == I))
    return str(what, ": activation is [", act.layout.rows, ", ", act.layout.cols, "], expected [", M, ", ", I, "]");
  if (twell_u_size(act) >= (int64_t{1} << 32))
    return str(what, ": ", twell_u_size(act), " u values exceed 32-bit indexing; split the batch");
  if (I * H >= (int64_t{1} << 32)) return str(what, ": I * H = ", I * H, " weights exceed 32-bit row offsets");
  return {};
}
void check_rows_args(const char* what, const TwellDeviceView& act, int64_t M, int64_t H, int64_t I) {
  const std::string problem = rows_args_problem(what, act, M, H, I);
  TWELL_CHECK(problem.empty(), problem);
}
int64_t smem_per_warp(int64_t H, int slots, int cap) { return slots * (H * 2 + 8) + int64_t{cap} * 8; }

// Warps per block and ring depth: the most warps (up to the kernel's register bound) that leave
// room for two ring slots each, then as many slots as fit. Both passes' time measured ~1/warps and
// flat in the slots beyond two (docs/perf.md). H = 2048, tile 256: 16 warps x 3 slots.
struct Config {
  int warps = 0, slots = 0;
};
Config config_for(int64_t H, int cap, int max_warps) {
  auto slots_for = [&](int warps) {
    const int64_t per_warp = kSmemBytes / warps - int64_t{cap} * 8;
    return static_cast<int>(std::min<int64_t>(kMaxSlots, per_warp / (H * 2 + 8)));
  };
  int warps = max_warps;
  while (warps > 1 && slots_for(warps) < 2) --warps;
  return {warps, slots_for(warps)};
}

// The SDDMM kernels (sddmm_loop, launch bounds kSddmmMaxWarps·32): as many warps as their shared
// memory allows (16 at H = 2048, 12 at H = 4096).
// `dependent`: a programmatic dependent of the kernel before it (start_pass).
template <typename Kernel>
void launch_sddmm(Kernel kernel, const Params& p, int sm_count, int64_t M, cudaStream_t stream,
                  bool dependent = false) {
  const int64_t per_warp = sddmm_warp_bytes(p.H, p.list_cap);
  const int warps = static_cast<int>(std::min<int64_t>(kSddmmMaxWarps, kSmemBytes / per_warp));
  TWELL_CHECK(warps >= 1, "sparse FFN kernel: no room for one warp's shared memory (H = ", p.H, ")");
  const int smem = static_cast<int>(warps * per_warp);
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  const int64_t blocks = std::min<int64_t>(sm_count, (M + warps - 1) / warps);
  launch_kernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(warps * 32), smem, stream, dependent, p);
}

template <typename Kernel>
void launch(Kernel kernel, Params p, int sm_count, int64_t M, cudaStream_t stream, bool dependent = false) {
  const int chunks = static_cast<int>((p.H + 255) / 256);
  Config c = config_for(p.H, p.list_cap, threads_for(chunks) / 32);
  // >= 2: the accumulate kernel sums a heavy row's shares (warps x H f32) over the rings.
  TWELL_CHECK(c.slots >= 2, "sparse FFN kernel: no room for two weight rows a warp in shared memory (H = ", p.H, ")");
  p.ring_slots = c.slots;
  const int smem = static_cast<int>(c.warps * smem_per_warp(p.H, c.slots, p.list_cap));
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmemBytes);
  const int64_t blocks = std::min<int64_t>(sm_count, (M + c.warps - 1) / c.warps);
  launch_kernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(c.warps * 32), smem, stream, dependent, p);
}


}  // namespace
}  // namespace twell::cuda
