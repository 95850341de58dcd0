// gate_pack: g = ReLU(x Wᵀ) computed by a CUTLASS 3 Hopper GEMM (TMA loads, wgmma, warp-specialised
// persistent ping-pong kernel, 2-CTA clusters multicasting the weight tile) whose epilogue packs g
// straight into TwELL from the accumulator registers: g is never written to memory (the
// cuBLASLt-gate-then-pack path writes 1.5 GB of g and reads it back at M = 131072).
//
// Two tile shapes, one per TwELL tile width T (the GEMM's N tile is one TwELL tile):
//   T = 256: 64 tokens × 256 neurons a warpgroup (wgmma m64n256), the first kernel;
//   T = 176: 128 tokens × 176 neurons a warpgroup (two m64n176 a k-step), the shape cuBLASLt's
//            fastest gate runs (nvjet 176x128): 31% fewer operand bytes a MAC into shared memory
//            (docs/perf.md, FFN item 42). I = 5632 is 32 × 176.
// The epilogue (TwellPackEpilogue) sees one output tile per call: the 128 threads of one consumer
// warpgroup, each holding, for every 64-row block of the tile, two rows' T / 4 values in wgmma's
// accumulator layout. In that layout a row's T columns live in the four lanes of a quad: lane q
// holds columns 8j + 2q + e (j < T / 8, e < 2) of rows r and r + 8. So a quad owns a whole
// (row, TwELL tile):
//   - each lane builds a mask of its non-zero bf16 values (bit 2j + e, at most 64 bits), the quad
//     trades masks with shuffles, and every lane knows the tile's count;
//   - fitting tile: a lane writes each of its non-zeros at its rank in ascending column order (popc
//     of the four masks below it), so entries are deterministic and bitwise the same as the
//     separate pack kernel's (twell_pack.cu), and zero-fills a quarter of the unused slots;
//   - spilled tile: one atomic claims a backup tile and the quad copies its T values there.
// Per row, the tile counts are added to row_nnz (atomics), and the tile whose count takes the row
// past kHeavyRowEntries appends it to heavy_rows. Covered by tests/cuda/test_gate_pack.cu.
#include "cuda/kernels.h"

#include "cuda/kernels/sm90_register_epilogue.cuh"
#include "twell/error.h"

namespace twell::cuda {
namespace {

using namespace cute;

struct PackParams {
  TwellDeviceView act;
  unsigned long long* nnz_total = nullptr;
  unsigned int* overflow = nullptr;
  RowCounts rows;
  int32_t n_tiles = 0, slots = 0;  // of act.layout (no divisions in the epilogue)
};

// Bits [0, n) of a 64-bit mask (n ≤ 64).
__device__ __forceinline__ uint64_t below(int n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

// ReLU and the bf16 rounding of two values in one instruction: lo in bits [0, 16), hi in [16, 32);
// negatives become 0 (a negative zero may stay -0: see nonzero_halves), NaN stays NaN.
__device__ __forceinline__ uint32_t relu_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// 0xffff in each half of p whose bf16 is non-zero, 0 in each that is +0 or -0 (so a -0 from
// relu_bf16x2 counts as zero); NaN is unordered, so non-zero. One instruction (HSET2) for what
// took three integer operations (item 44) and, before, a compare and a select a value.
__device__ __forceinline__ uint32_t nonzero_halves(uint32_t p) {
  uint32_t r;
  asm("set.neu.u32.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(p), "r"(0u));
  return r;
}

// v[j] for a run-time j < M without local memory: a tree of selects on j's bits, one test a level
// (M - 1 selects; comparing j with every index took 2M instructions). Call with Lo = 0 and Size a
// power of two at least M.
template <int Lo, int Size, int M>
__device__ __forceinline__ uint32_t select_by_index(const uint32_t (&v)[M], int j) {
  if constexpr (Size == 1) {
    return v[Lo];
  } else if constexpr (Lo + Size / 2 >= M) {
    return select_by_index<Lo, Size / 2>(v, j);
  } else {
    const uint32_t lo = select_by_index<Lo, Size / 2>(v, j), hi = select_by_index<Lo + Size / 2, Size / 2>(v, j);
    return j & (Size / 2) ? hi : lo;
  }
}

// An sm70-style epilogue (operator() per output tile, accumulators in registers), run by the
// Hopper kernels through CUTLASS's Sm90TmaWarpSpecializedAdapter. It has no shared storage.
class TwellPackEpilogue : public sm90::RegisterEpilogue<PackParams> {
#ifdef __CUDA_ARCH__
  // launch_gate_pack's `dependent` launch needs the producer's wait (sm90_register_epilogue.cuh).
  static_assert(cutlass::arch::IsGdcGloballyEnabled, "CUTLASS built without grid-dependency control");
#endif

 public:
  CUTLASS_HOST_DEVICE TwellPackEpilogue(Params const& p, SharedStorage const& = SharedStorage()) : p_(p) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& acc,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    constexpr int kTileM = size<0>(BlockShapeMNK{}), kTileN = size<1>(BlockShapeMNK{});
    constexpr int kGroups = kTileN / 8, kBlocksM = kTileM / 64;  // column groups; 64-row wgmma blocks
    // wgmma m64nT accumulators: per thread ((2 columns, 2 row halves, T / 8 column groups), 64-row
    // blocks, 1).
    static_assert(kTileN % 8 == 0 && 2 * kGroups <= 64 && kTileM % 64 == 0);
    static_assert(decltype(size<0>(acc))::value == kTileN / 2 && decltype(size<1>(acc))::value == kBlocksM &&
                  decltype(size<2>(acc))::value == 1);
    static_assert(decltype(size<0, 0>(acc))::value == 2 && decltype(size<0, 1>(acc))::value == 2 &&
                  decltype(size<0, 2>(acc))::value == kGroups);

    const TwellLayout& l = p_.act.layout;
    const auto m_coord = get<0>(blk_coord_mnkl), n_coord = get<1>(blk_coord_mnkl);
    // This thread's elements' positions in the tile: rows r0(b) and r0(b) + 8 of 64-row block b,
    // columns c0 + 8j + e.
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    cute::Tensor coords = thr_mma.partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    const int c0 = get<1>(coords(0));
    const int lane = threadIdx.x % 32, q = c0 / 2;  // q: the lane's place in its quad (c0 = 2q)
    const int t = n_coord;                          // the TwELL tile (kTileN == layout.tile)
    // A tile past I writes nothing. The scheduler hands such tiles out when it rounds its grid up
    // to the cluster's N or to a swizzle (neither in this configuration: a swizzle of 4 did, and
    // its tiles wrote over the next row's; docs/perf.md, FFN item 39).
    if (t >= p_.n_tiles) return;
    const int width = min(kTileN, static_cast<int>(l.cols) - t * kTileN);
    // Column groups j with 8j + c0 < width. (TMA reads past I as zeros, so those accumulators are 0
    // anyway; the mask keeps the packing right whatever the GEMM leaves there.)
    const uint64_t in_width = below(2 * ((width - c0 + 7) / 8));
    uint32_t my_nnz = 0;

#pragma unroll
    for (int b = 0; b < kBlocksM; ++b) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        __syncwarp();  // the lanes that skipped the rest of the previous row meet again (defensive:
                       // the shuffles below name the whole warp anyway)
        const int64_t row = int64_t{m_coord} * kTileM + get<0>(coords(make_coord(make_coord(0, h, 0), b, 0)));
        // bf16 values, ReLU'd (NaN kept: never silently turned into zeros), and their non-zero mask
        // (bit 2j + e), built a 32-bit half at a time: four instructions a pair (the cvt, HSET2, a
        // shift and a three-input logic op moving its bits 15 and 16 to 2j and 2j + 1). The
        // epilogue's instructions cost the GEMM time even though the other warpgroup's MMA runs
        // under them (docs/perf.md, FFN items 42-44).
        uint32_t pairs[kGroups];
        uint32_t mask_half[2] = {0, 0};
#pragma unroll
        for (int j = 0; j < kGroups; ++j) {
          pairs[j] =
              relu_bf16x2(acc(make_coord(make_coord(0, h, j), b, 0)), acc(make_coord(make_coord(1, h, j), b, 0)));
          const uint32_t nz = nonzero_halves(pairs[j]);
          const int at = (2 * j) % 32;  // of mask_half[j / 16]
          mask_half[j / 16] |= (at <= 15 ? nz >> (15 - at) : nz << (at - 15)) & (3u << at);
        }
        const uint64_t mask = (mask_half[0] | uint64_t{mask_half[1]} << 32) & in_width;
        // The other three masks of the quad, of lanes q ^ 1, q ^ 2, q ^ 3 (every lane of the warp
        // takes part in the shuffles).
        uint64_t other[3];
#pragma unroll
        for (int x = 1; x < 4; ++x) {
          other[x - 1] = uint64_t{__shfl_xor_sync(0xffffffffu, static_cast<uint32_t>(mask), x)};
          if constexpr (2 * kGroups > 32)
            other[x - 1] |= uint64_t{__shfl_xor_sync(0xffffffffu, static_cast<uint32_t>(mask >> 32), x)} << 32;
        }
        const uint32_t count = __popcll(mask) + __popcll(other[0]) + __popcll(other[1]) + __popcll(other[2]);
        // Past M: skip the row. Below, only quad-wide shuffles (spilled tiles), and a quad's four
        // lanes hold the same row, so they skip or take them together.
        if (row >= l.rows) continue;

        const int64_t tile_id = row * p_.n_tiles + t;
        const uint32_t slots = static_cast<uint32_t>(p_.slots);
        uint32_t* words = p_.act.slots + tile_id * slots;
        if (q == 0) p_.act.counts[tile_id] = count;
        if (count <= slots) {
          for (uint64_t m = mask; m; m &= m - 1) {
            const int bit = __ffsll(static_cast<long long>(m)) - 1, j = bit / 2, e = bit % 2;
            // The non-zeros of the quad's columns below this one (8j + 2q + e): this lane's below
            // bit 2j + e; a lower lane's in groups up to j, a higher lane's in groups below j.
            const uint64_t low = 1ull << (2 * j);  // bit 2j (j < 32; low << 2 wraps to 0 at j = 31)
            const uint64_t to_j = low - 1, through_j = (low << 2) - 1;
            uint32_t pos = __popcll(mask & (e ? to_j | low : to_j));
#pragma unroll
            for (int x = 1; x < 4; ++x) pos += __popcll(other[x - 1] & ((q ^ x) < q ? through_j : to_j));
            const uint32_t pair = select_by_index<0, 64>(pairs, j);
            const uint16_t bits = static_cast<uint16_t>(e ? pair >> 16 : pair & 0xffffu);
            words[pos] = twell_entry(bits, static_cast<uint32_t>(c0 + 8 * j + e));
          }
          for (uint32_t k = q; k < slots; k += 4)
            if (k >= count) words[k] = 0;
        } else {
          // Spilled: lane 0 of the quad claims a backup tile; the quad copies the T values.
          uint32_t bk = 0;
          if (q == 0) bk = atomicAdd(p_.act.n_backup, 1u);
          // The quad's four lanes (same row, same count) all get here; the rest of the warp may not.
          bk = __shfl_sync(0xfu << (lane & ~3), bk, lane & ~3);
          if (bk >= p_.act.backup_capacity) {  // cannot happen with the default capacity
            if (q == 0) atomicExch(p_.overflow, 1u);
          } else {
            uint32_t* out = reinterpret_cast<uint32_t*>(p_.act.backup + static_cast<int64_t>(bk) * l.tile);
#pragma unroll
            for (int j = 0; j < kGroups; ++j) {  // a -0 from relu_bf16x2 stored as +0 (nonzero_halves)
              const uint32_t kept = pairs[j] & nonzero_halves(pairs[j]);
              out[(c0 + 8 * j) / 2] = c0 + 8 * j < width ? kept : 0u;
            }
            if (q == 0) p_.act.backup_owner[bk] = static_cast<uint32_t>(tile_id);
            for (uint32_t k = q; k < slots; k += 4) words[k] = k == 0 ? bk : 0u;
          }
        }
        if (q == 0 && count) {
          my_nnz += count;
          // The tile whose count takes the row past kHeavyRowEntries lists it (once: the counts only
          // grow). The round trip hides under the other warpgroup's MMA; a kernel of its own to list
          // them after the gate cost 4 µs a call (perf.md, FFN item 37).
          if (p_.rows.row_nnz) {
            const uint32_t before = atomicAdd(p_.rows.row_nnz + row, count);
            if (before <= kHeavyRowEntries && before + count > kHeavyRowEntries)
              p_.rows.heavy_rows[atomicAdd(p_.rows.heavy_count, 1u)] = static_cast<uint32_t>(row);
          }
        }
      }
    }
    // One atomic per warp and tile for the total (at most 16 rows a 64-row block, T each, here),
    // spread over the counters.
    __syncwarp();
    my_nnz = __reduce_add_sync(0xffffffffu, my_nnz);
    if (lane == 0 && my_nnz)
      atomicAdd(p_.nnz_total + (m_coord * 8 + threadIdx.x / 32 + n_coord) % kNnzCounters,
                static_cast<unsigned long long>(my_nnz));
  }

 private:
  Params p_;
};

// Ping-pong: two consumer warpgroups take alternate tiles, so one packs while the other's tensor
// cores run (docs/perf.md, item 18: the cooperative 128 × 256 kernel ran 0.5 ms of epilogue with
// its tensor cores idle and measured 0.68× against this kernel's 0.64×); 2-CTA clusters multicast
// the weight tile. One kernel per TwELL tile width.
using Gemm256 = sm90::PingPongGemm<TwellPackEpilogue, 64, 256>::Gemm;
using Gemm176 = sm90::PingPongGemm<TwellPackEpilogue, 128, 176>::Gemm;

// Calls f(Kernel<Gemm>{}) with the GEMM of a's TwELL tile width (check_gate_pack: one of the two).
template <class Gemm>
struct Kernel {
  using type = Gemm;
};
template <class F>
decltype(auto) with_gemm(const GatePackArgs& a, F&& f) {
  if (a.act.layout.tile == 176) return f(Kernel<Gemm176>{});
  return f(Kernel<Gemm256>{});
}

template <class Gemm>
typename Gemm::Arguments make_arguments(const GatePackArgs& a, int sm_count) {
  return sm90::gemm_arguments<Gemm>(a.x, a.w, static_cast<int>(a.M), static_cast<int>(a.I), static_cast<int>(a.H),
                                    PackParams{a.act, a.nnz_total, a.overflow, a.rows,
                                               static_cast<int32_t>(a.act.layout.n_tiles()), a.act.layout.slots()},
                                    sm_count);
}

}  // namespace

void check_gate_pack(const GatePackArgs& a) {
  a.act.layout.check();
  TWELL_CHECK(gate_pack_supports_tile(a.act.layout.tile),
              "fused gate+pack: the TwELL tile width must be 256 or 176, got ", a.act.layout.tile);
  TWELL_CHECK(a.act.layout.rows == a.M && a.act.layout.cols == a.I, "fused gate+pack: TwELL layout ",
              a.act.layout.rows, " x ", a.act.layout.cols, " does not match M = ", a.M, ", I = ", a.I);
  TWELL_CHECK(a.H % 8 == 0 && a.I % 8 == 0, "fused gate+pack: H = ", a.H, " and I = ", a.I,
              " must be multiples of 8 (16-byte rows for TMA)");
  TWELL_CHECK(a.M <= INT32_MAX && a.H <= INT32_MAX && a.I <= INT32_MAX, "fused gate+pack: dimensions past 2^31");
  TWELL_CHECK(reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0,
              "fused gate+pack: x and W must be 16-byte aligned");
}

bool gate_pack_supports_tile(int64_t tile) { return tile == 256 || tile == 176; }

size_t gate_pack_workspace_bytes(const GatePackArgs& a, int sm_count) {
  check_gate_pack(a);
  return with_gemm(a, [&](auto kernel) -> size_t {
    using Gemm = typename decltype(kernel)::type;
    return Gemm::get_workspace_size(make_arguments<Gemm>(a, sm_count));
  });
}

void launch_gate_pack(const GatePackArgs& a, void* workspace, size_t workspace_bytes, int sm_count,
                      cudaStream_t stream, bool dependent) {
  check_gate_pack(a);
  if (a.M == 0) return;
  with_gemm(a, [&](auto kernel) {
    using Gemm = typename decltype(kernel)::type;
    sm90::run_gemm<Gemm>(make_arguments<Gemm>(a, sm_count), workspace, workspace_bytes, stream, "fused gate+pack",
                         dependent);
  });
}

}  // namespace twell::cuda
