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
// Both kernels are persistent (one block per SM, 16 warps) and work warp by warp: a warp takes the
// next token from a global counter (token costs vary 10-20x in skewed activations) and stages its
// non-zeros in its own shared-memory list (ascending column order, as many tiles at a time as
// the list holds; packed entries read 32 at a time, a spilled tile scanned from its dense
// backup). Heavy tokens (more than kHeavyRowEntries non-zeros, listed by the pack) go first: in
// the down pass a group of warps each (its warps taking contiguous shares of the tiles, summed in
// shared memory), in the up pass a warp for every 2-tile share (row_schedule). The next token's counts,
// packed words and x are prefetched into L2 while the current one runs. Weights are fetched
// with an L2 evict-last hint.
//   up: 16 entries of the token at a time are the rows of an m16n8k16 tensor-core product with x
//     (sddmm_loop in twell_rows.cuh), streamed through shared memory 64 columns at a time by
//     cp.async, read by ldmatrix. It replaced CUDA-core dot products that were bound by
//     instruction issue (docs/perf.md, item 20).
//   down: the entries' rows stream through a ring of D row-sized shared-memory slots a warp,
//     filled by the TMA engine (cp.async.bulk, completion on one mbarrier per slot); lane l owns
//     columns c·256 + 8l .. + 8 of every 256 (conflict-free 16-byte reads) and accumulates in f32.
// Summation orders are fixed (u: the tensor core's, then two accumulators added; y: ascending j
// per column; a heavy row: its group's shares added in warp order): results are deterministic,
// whichever warp or block takes a token.
// Covered by tests/cuda/test_twell_ffn.cu; timed by `twell bench ffn`.
//
// The list path (inference with prepared weights, gated, bf16: twell_ffn_list_supported) changes
// what lies between the passes and what the down pass reads. The up pass writes each active entry
// as one word, its neuron j and its h = bf16(g · bf16(x · Wu[j])), into a list that holds every
// row's entries contiguously in ascending j (row m's at row_off[m], the exclusive scan of the
// pack's row counts). The down pass then needs no TwELL staging and no TMA ring: it runs on the
// tensor cores (list_mma below) over Wd's rows packed losslessly to 12 bits where they pack
// (packed_rows.cuh: 28% fewer L2 bytes), decoded in shared memory between the cp.async and the
// ldmatrix. Why the tensor cores: a lane-direct CUDA-core pass over the same packed rows was
// issue-bound (docs/perf.md, FFN item 34: the bf16 -> f32 conversions and FMAs cost more than the
// decode), and the tensor cores take both away. Its sums are the tensor core's, in a fixed order.
#include "cuda/kernels/packed_rows.cuh"
#include "cuda/kernels/twell_rows.cuh"

#include <cub/device/device_scan.cuh>

namespace twell::cuda {
namespace {

// up: u[m, j] = bf16(x[m] · Wu[j]) for every active (m, j), on the tensor cores (sddmm_loop).
__global__ __launch_bounds__(kSddmmMaxWarps * 32, 1) void twell_ffn_up_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) char smem[];
  sddmm_loop<Aux::u_index>(p, p.wu, nullptr, smem, threadIdx.x % 32, [&](uint32_t u_index, float dot, uint32_t, uint32_t) {
    p.u_vals[u_index] = float_to_bf16_bits(dot);
  });
}

// up, list path: entries[rank] = j | bf16(h) << 16 with h rounded as the ring down pass rounds it
// (entry_aux<Aux::h_gated>).
__global__ __launch_bounds__(kSddmmMaxWarps * 32, 1) void twell_ffn_up_list_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) char smem[];
  sddmm_loop<Aux::h_plain>(p, p.wu, p.row_off, smem, threadIdx.x % 32,
                           [&](uint32_t act_bits, float dot, uint32_t j, uint32_t rank) {
                             const float h = round_bf16(__uint_as_float(act_bits) * round_bf16(dot));
                             p.entries[rank] = j | (__float_as_uint(h) & 0xffff0000u);
                           });
}

// The list down pass on the tensor cores. A warp takes a row (a token): per 64 columns of y (a
// block b), D (16 columns x 8) += A (16 columns x 16 entries: the entries' prepared rows' block b,
// transposed by ldmatrix) · B (16 entries x 8: h in column 0), over the row's entries 32 at a time
// (a group: two k16 steps). Each (block, group) is a stage of 32 rows x 128 bytes in the warp's
// ring, filled by cp.async (a lane a row: a packed block's 96 bytes, or an unpacked row's 128),
// then decoded in place by its lane to bf16 (packed_rows.cuh), then read by ldmatrix.trans. The
// entries' descriptors (row offset with an unpacked flag, table, h) are staged in the warp's list
// first, up to kListSegment at a time. A heavy row is split over a block's warps by columns (warp
// w takes blocks w, w + 16, ...), so that every column of every row is summed in the same order
// whichever warp runs it: no reduction, deterministic.
constexpr int kListWarps = 16, kListStages = 3, kListSegment = 128;
constexpr int kListStageBytes = 32 * 128;
constexpr int kListWarpBytes = kListStages * kListStageBytes + 128 + kListSegment * 16;  // ring, y block, list

struct ListWarp {
  char* ring;
  uint16_t* out;      // a block of y as bf16 (64 values)
  uint32_t* off;      // [kListSegment] the entry's row: byte offset into the prepared matrix, bit 31 unpacked
  uint2* table;       // [kListSegment]
  uint32_t* h;        // [kListSegment] bf16 bits of h
};

__device__ __forceinline__ ListWarp list_warp(char* smem, int warp) {
  char* base = smem + warp * kListWarpBytes;
  ListWarp w;
  w.ring = base;
  w.out = reinterpret_cast<uint16_t*>(base + kListStages * kListStageBytes);
  w.off = reinterpret_cast<uint32_t*>(base + kListStages * kListStageBytes + 128);
  w.table = reinterpret_cast<uint2*>(w.off + kListSegment);
  w.h = reinterpret_cast<uint32_t*>(w.table + kListSegment);
  return w;
}

// Stages the descriptors of list entries [e0, e0 + n), n <= kListSegment.
__device__ __forceinline__ void list_descriptors(const Params& p, const uint2* tables, uint32_t row_bytes, uint32_t e0,
                                                 uint32_t n, const ListWarp& w, int lane) {
  __syncwarp();  // the previous segment's descriptors are no longer read
  for (uint32_t i = lane; i < n; i += 32) {
    const uint32_t ent = __ldg(p.entries + e0 + i), j = ent & 0xffffu;
    const uint2 t = __ldg(tables + j);
    w.off[i] = j * row_bytes | (t.x == kUnpackedRow ? 0x80000000u : 0u);
    w.table[i] = t;
    w.h[i] = ent >> 16;
  }
  __syncwarp();
}

// D for blocks b0, b0 + bs, ... < nb over the staged descriptors' n entries: zeroed at a block's
// first group when `first`, handed to done(b, d) after its last group when `last`.
template <typename Done>
__device__ __forceinline__ void list_mma(const Params& p, const ListWarp& w, uint32_t n, int b0, int bs, int nb,
                                         bool first, bool last, float (&d)[4][4], int lane, Done&& done) {
  const int G = static_cast<int>((n + 31) / 32), n_blocks = b0 < nb ? (nb - b0 + bs - 1) / bs : 0;
  const int total = n_blocks * G;
  if (total == 0) return;
  const uint64_t keep = l2_keep_policy();
  const int r = lane, swz = lane % 8;  // this lane's row of each stage (copy and decode)
  const int frag_k = lane % 8 + 8 * (lane / 16), frag_half = (lane / 8) % 2, q = lane % 4;
  auto issue = [&](int t) {
    if (t < total) {
      const int b = b0 + (t / G) * bs;
      const uint32_t e = static_cast<uint32_t>((t % G) * 32 + r);
      char* dst = w.ring + (t % kListStages) * kListStageBytes + r * 128;
      if (e < n) {
        const uint32_t off = w.off[e];
        const char* src = reinterpret_cast<const char*>(p.wd_packed) + (off & 0x7fffffffu);
        if (off < 0x80000000u) {
#pragma unroll
          for (int k = 0; k < 6; ++k) cp_async16(dst + ((k ^ swz) * 16), src + b * kPackedBlockBytes + 16 * k, true, keep);
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) cp_async16(dst + ((k ^ swz) * 16), src + b * 128 + 16 * k, true, keep);
        }
      }
    }
    cp_async_commit();  // empty groups past the end keep the wait count uniform
  };
#pragma unroll
  for (int t = 0; t < kListStages - 1; ++t) issue(t);
  for (int t = 0; t < total; ++t) {
    cp_async_wait<kListStages - 2>();
    __syncwarp();  // stage t visible to every lane; stage t - 1 read by all (its buffer is refilled next)
    issue(t + kListStages - 1);
    const int g = t % G, b = b0 + (t / G) * bs;
    char* stage = w.ring + (t % kListStages) * kListStageBytes;
    char* row = stage + r * 128;
    const uint32_t e = static_cast<uint32_t>(g * 32 + r);
    // This lane's row in place: decoded (packed), zeros (past the list) or left (bf16).
    if (e >= n) {
#pragma unroll
      for (int k = 0; k < 8; ++k) *reinterpret_cast<uint4*>(row + k * 16) = make_uint4(0, 0, 0, 0);
    } else if (w.off[e] < 0x80000000u) {
      const uint2 tab = w.table[e];
      uint4 raw[6];
#pragma unroll
      for (int k = 0; k < 6; ++k) raw[k] = *reinterpret_cast<const uint4*>(row + ((k ^ swz) * 16));
      const uint32_t sel[8] = {raw[4].x, raw[4].y, raw[4].z, raw[4].w, raw[5].x, raw[5].y, raw[5].z, raw[5].w};
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const uint4& lo = raw[c / 2];
        const uint2 lo8 = c % 2 ? make_uint2(lo.z, lo.w) : make_uint2(lo.x, lo.y);
        *reinterpret_cast<uint4*>(row + ((c ^ swz) * 16)) = unpack_packed8(lo8, sel[c], tab.x, tab.y);
      }
    }
    __syncwarp();  // the stage decoded
    if (g == 0 && first) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) d[mt][i] = 0.f;
    }
    const int steps = n - g * 32 > 16 ? 2 : 1;
#pragma unroll
    for (int sidx = 0; sidx < 2; ++sidx) {
      if (sidx == 1 && steps == 1) break;
      // B: h in column 0 (lanes 0-3): entries k = 2q, 2q + 1 (b0) and 2q + 8, 2q + 9 (b1) of the step.
      uint32_t b0v = 0, b1v = 0;
      if (lane < 4) {
        auto hv = [&](int k) {
          const uint32_t ek = static_cast<uint32_t>(g * 32 + sidx * 16 + k);
          return ek < n ? w.h[ek] : 0u;
        };
        b0v = hv(2 * q) | hv(2 * q + 1) << 16;
        b1v = hv(2 * q + 8) | hv(2 * q + 9) << 16;
      }
      const int rr = 16 * sidx + frag_k;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, stage + rr * 128 + (((2 * mt + frag_half) ^ (rr % 8)) * 16));
        mma_bf16(d[mt], a, b0v, b1v);
      }
    }
    if (g == G - 1 && last) done(b, d);
  }
  cp_async_wait<0>();
  __syncwarp();  // the ring is refilled by the next call
}

// D's column 0 (lanes 4g': y columns 64b + 16mt + g' in d[mt][0], + 8 in d[mt][2]) as bf16 into
// row `row` of y, through the warp's 128-byte block.
__device__ __forceinline__ void list_write_block(const Params& p, const ListWarp& w, int64_t row, int b,
                                                 const float (&d)[4][4], int lane) {
  if (lane % 4 == 0) {
    const int g = lane / 4;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      w.out[16 * mt + g] = float_to_bf16_bits(d[mt][0]);
      w.out[16 * mt + g + 8] = float_to_bf16_bits(d[mt][2]);
    }
  }
  __syncwarp();
  __stcs(reinterpret_cast<uint32_t*>(p.y + row * p.H + b * 64) + lane, reinterpret_cast<const uint32_t*>(w.out)[lane]);
  __syncwarp();  // out is rewritten by the next block
}

// down, list path: y[m] = Σ h · Wd[j] over row m's list on the tensor cores (list_mma). Heavy
// rows first, a block each, split by columns over its warps; then the other rows, a warp each,
// from the global counter.
__global__ __launch_bounds__(kListWarps * 32, 1) void twell_ffn_down_list_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const ListWarp w = list_warp(smem, warp);
  const int nb = static_cast<int>(p.H / 64);
  const uint32_t row_bytes = static_cast<uint32_t>(2 * p.H);
  const uint2* tables = reinterpret_cast<const uint2*>(p.wd_packed + p.act.layout.cols * 2 * p.H);
  float d[4][4];
  auto write = [&](int64_t row) { return [&, row](int b, const float (&dd)[4][4]) { list_write_block(p, w, row, b, dd, lane); }; };
  const uint32_t n_heavy = *p.rows.heavy_count;
  __shared__ uint32_t heavy_i;
  for (;;) {
    if (threadIdx.x == 0) heavy_i = atomicAdd(p.next_heavy, 1u);
    __syncthreads();
    const uint32_t i = heavy_i;
    __syncthreads();
    if (i >= n_heavy) break;
    const int64_t row = p.rows.heavy_rows[i];
    const uint32_t n = p.rows.row_nnz[row], off = p.row_off[row];
    for (int b = warp; b < nb; b += kListWarps)
      for (uint32_t s0 = 0; s0 < n; s0 += kListSegment) {
        const uint32_t sn = min(static_cast<uint32_t>(kListSegment), n - s0);
        list_descriptors(p, tables, row_bytes, off + s0, sn, w, lane);
        list_mma(p, w, sn, b, kListWarps, b + 1, s0 == 0, s0 + sn == n, d, lane, write(row));
      }
  }
  for (int64_t row = grab_row(p, lane); row < p.act.layout.rows; row = grab_row(p, lane)) {
    const uint32_t n = __ldg(p.rows.row_nnz + row), off = __ldg(p.row_off + row);  // n <= kHeavyRowEntries
    if (n == 0) {
      for (int64_t c = lane * 8; c < p.H; c += 256) __stcs(reinterpret_cast<uint4*>(p.y + row * p.H + c), make_uint4(0, 0, 0, 0));
      continue;
    }
    list_descriptors(p, tables, row_bytes, off, n, w, lane);
    list_mma(p, w, n, 0, 1, nb, true, true, d, lane, write(row));
  }
}

void launch_down_list(const Params& p, int sm_count, int64_t M, cudaStream_t stream) {
  static_assert(kHeavyRowEntries <= kListSegment, "a light row's descriptors fit one segment");
  static_assert(kListWarps * kListWarpBytes + 1024 <= 227 * 1024, "the list pass's shared memory (and static room)");
  const int smem = kListWarps * kListWarpBytes;
  allow_dynamic_smem(reinterpret_cast<const void*>(twell_ffn_down_list_kernel), smem);
  const int64_t blocks = std::min<int64_t>(sm_count, (M + kListWarps - 1) / kListWarps);
  twell_ffn_down_list_kernel<<<static_cast<unsigned>(blocks), kListWarps * 32, smem, stream>>>(p);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void launch_list_passes(const SparseFfnArgs& a, Params p, int sm_count, cudaStream_t stream) {
  size_t temp_bytes = a.scan_temp_bytes;
  TWELL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(a.scan_temp, temp_bytes, a.rows.row_nnz, a.row_off, a.M, stream));
  p.entries = a.entries, p.row_off = a.row_off, p.wd_packed = a.wd_packed;
  p.next_row = a.row_counters, p.next_heavy = a.row_counters + 2;
  launch_sddmm(twell_ffn_up_list_kernel, p, sm_count, a.M, stream);
  p.next_row = a.row_counters + 1, p.next_heavy = a.row_counters + 3;
  launch_down_list(p, sm_count, a.M, stream);
}

template <int kChunks>
void launch_passes(const SparseFfnArgs& a, Params p, int sm_count, cudaStream_t stream) {
  p.next_row = a.row_counters + 1, p.next_heavy = a.row_counters + 3;
  if (!a.gated) return launch(twell_axpy_kernel<kChunks, Aux::h_plain, Out::bf16>, p, sm_count, a.M, stream);
  p.next_row = a.row_counters, p.next_heavy = a.row_counters + 2;
  launch_sddmm(twell_ffn_up_kernel, p, sm_count, a.M, stream);
  p.next_row = a.row_counters + 1, p.next_heavy = a.row_counters + 3;
  if (a.precision == Precision::h_fp32)
    launch(twell_axpy_kernel<kChunks, Aux::h_gated_fp32, Out::bf16>, p, sm_count, a.M, stream);
  else
    launch(twell_axpy_kernel<kChunks, Aux::h_gated, Out::bf16>, p, sm_count, a.M, stream);
}

}  // namespace

bool twell_ffn_list_supported(const SparseFfnArgs& a) {
  return a.gated && a.precision == Precision::bf16 && a.H % 64 == 0 && a.I <= 65536 &&
         a.rows.row_nnz && a.rows.heavy_rows && a.rows.heavy_count;
}

size_t twell_list_scan_temp_bytes(int64_t M) {
  size_t bytes = 0;
  TWELL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), std::max<int64_t>(M, 1)));
  return bytes;
}

int64_t twell_u_size(const TwellDeviceView& act) {
  return act.layout.slot_size() + act.backup_capacity * act.layout.tile;
}

void check_twell_ffn_sparse(const SparseFfnArgs& a) {
  check_rows_args("sparse FFN kernel", a.act, a.M, a.H, a.I);
  TWELL_CHECK(a.precision != Precision::f64, "sparse FFN kernel: Precision::f64 is CPU-only");
  TWELL_CHECK(!a.gated || a.u_vals, "sparse FFN kernel: a gated FFN needs the u buffer");
  TWELL_CHECK(a.row_counters, "sparse FFN kernel: needs four device counters, zero at launch (row_counters)");
  if (a.entries) {
    TWELL_CHECK(twell_ffn_list_supported(a), "sparse FFN kernel: the list path needs a gated bf16 FFN, H a multiple of "
                "64, I <= 65536 and row counts; got H = ", a.H, ", I = ", a.I);
    TWELL_CHECK(a.row_off && a.scan_temp && a.scan_temp_bytes >= twell_list_scan_temp_bytes(a.M) && a.wd_packed,
                "sparse FFN kernel: the list path needs row_off, the scan's workspace and Wd's prepared rows");
    TWELL_CHECK(a.I * 2 * a.H < (int64_t{1} << 31), "sparse FFN kernel: the list path's row offsets need I * 2H < 2^31");
  }
}

void launch_twell_ffn_sparse(const SparseFfnArgs& a, int sm_count, cudaStream_t stream) {
  check_twell_ffn_sparse(a);
  if (a.M == 0) return;
  const Params p{a.act, a.x, a.wu, a.wd, a.u_vals, a.y, a.H, 0, list_cap_for(a.act.layout), nullptr, nullptr, a.rows};
  if (a.entries) return launch_list_passes(a, p, sm_count, stream);
  const int64_t chunks = (a.H + 255) / 256;
  if (chunks <= 2) launch_passes<2>(a, p, sm_count, stream);
  else if (chunks <= 4) launch_passes<4>(a, p, sm_count, stream);
  else if (chunks <= 8) launch_passes<8>(a, p, sm_count, stream);
  else launch_passes<16>(a, p, sm_count, stream);
}

}  // namespace twell::cuda
