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
// The list path (inference, gated, bf16: twell_ffn_list_supported) changes what lies between the
// passes and what the down pass reads. The up pass writes each active entry as one word, its
// neuron j and its h = bf16(g · bf16(x · Wu[j])), into a list that holds every row's entries
// contiguously in ascending j (row m's at row_off[m], the exclusive scan of the pack's row counts).
// The down pass then needs no TwELL staging and no ring: a warp reads a row's list 32 words at a
// time and each entry's row of Wd straight into registers, 12-bit packed where the row packs
// (packed_rows.cuh: a quarter fewer bytes from L2, decoded by ~20 instructions for 8 weights), as
// the micro-benchmark bench/micro/packed_rows.cu measured it fastest. The ring pass could not
// afford the decode (docs/perf.md, items 26 and 29: it was issue-bound once its bytes fell). Its
// sums are the ring pass's for light rows (same order, same bits); a heavy row is split over a
// whole block's warps by entries and their shares are added in warp order.
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

constexpr int kListWarps = 16;

// Weight loads that ask L2 to keep their lines (evict_last, as the ring pass's TMA loads do): Wd
// must stay resident against y's stream and the up pass's evict_last Wu lines.
__device__ __forceinline__ uint2 ldg_keep(const uint2* p, uint64_t policy) {
  uint2 r;
  asm("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;" : "=r"(r.x), "=r"(r.y) : "l"(p), "l"(policy));
  return r;
}
__device__ __forceinline__ uint32_t ldg_keep(const uint32_t* p, uint64_t policy) {
  uint32_t r;
  asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(r) : "l"(p), "l"(policy));
  return r;
}
__device__ __forceinline__ uint4 ldg_keep(const uint4* p, uint64_t policy) {
  uint4 r;
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "l"(policy));
  return r;
}

// acc += Σ h · Wd[j] over the list's entries [b, e), in order; lane l holds columns c·256 + 8l .. + 8.
template <int kChunks>
__device__ __forceinline__ void list_accumulate(const Params& p, const uint2* tables, uint32_t b, uint32_t e,
                                                float (&acc)[kChunks][8], int lane) {
  constexpr int H = kChunks * 256;
  const uint64_t keep = l2_keep_policy();
  for (uint32_t e0 = b; e0 < e; e0 += 32) {
    const uint32_t n = min(32u, e - e0);
    const uint32_t mine = lane < n ? __ldcs(p.entries + e0 + lane) : 0u;  // read once: evict first
    const uint2 mine_table = tables && lane < n ? __ldg(tables + (mine & 0xffffu)) : make_uint2(kUnpackedRow, 0u);
    for (uint32_t k = 0; k < n; ++k) {
      const uint32_t ent = __shfl_sync(0xffffffffu, mine, k);
      const uint32_t t0 = __shfl_sync(0xffffffffu, mine_table.x, k), t1 = __shfl_sync(0xffffffffu, mine_table.y, k);
      const float h = __uint_as_float(ent & 0xffff0000u);
      const uint32_t j = ent & 0xffffu;
      if (t0 != kUnpackedRow) {
        const uint8_t* row = p.wd_packed + j * static_cast<uint32_t>(packed_row_bytes(H));  // < 2^32: I < 2^16
        uint2 lo[kChunks];
        uint32_t sel[kChunks];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          lo[c] = ldg_keep(reinterpret_cast<const uint2*>(row) + c * 32 + lane, keep);
          sel[c] = ldg_keep(reinterpret_cast<const uint32_t*>(row + H) + c * 32 + lane, keep);
        }
#pragma unroll
        for (int c = 0; c < kChunks; ++c) fma8(acc[c], h, unpack_packed8(lo[c], sel[c], t0, t1));
      } else {
        const uint4* row = reinterpret_cast<const uint4*>(p.wd + j * static_cast<uint32_t>(H));
        uint4 w[kChunks];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) w[c] = ldg_keep(row + c * 32 + lane, keep);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) fma8(acc[c], h, w[c]);
      }
    }
  }
}

// down, list path: y[m] = Σ h · Wd[j] over row m's list. Heavy rows first, a block each (warp w
// takes the w-th of kListWarps contiguous shares of the entries; the shares are added in warp
// order through shared memory), then the other rows, a warp each, from the global counter.
template <int kChunks>
__global__ __launch_bounds__(kListWarps * 32, 1) void twell_ffn_down_list_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) float part[];  // heavy rows: [kListWarps][H]
  constexpr int H = kChunks * 256;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t I = p.act.layout.cols;
  const uint2* tables = p.wd_packed ? reinterpret_cast<const uint2*>(p.wd_packed + I * packed_row_bytes(H)) : nullptr;
  float acc[kChunks][8];
  auto zero = [&] {
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[c][i] = 0.f;
  };
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
    zero();
    list_accumulate<kChunks>(p, tables, off + static_cast<uint32_t>(uint64_t{n} * warp / kListWarps),
                             off + static_cast<uint32_t>(uint64_t{n} * (warp + 1) / kListWarps), acc, lane);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {  // two 16-byte stores: conflict-free
      float4* dst = reinterpret_cast<float4*>(part + warp * H + c * 256 + lane * 8);
      dst[0] = make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]);
      dst[1] = make_float4(acc[c][4], acc[c][5], acc[c][6], acc[c][7]);
    }
    __syncthreads();
    for (int col = 2 * threadIdx.x; col < H; col += 2 * blockDim.x) {
      float lo = 0.f, hi = 0.f;
      for (int v = 0; v < kListWarps; ++v) lo += part[v * H + col], hi += part[v * H + col + 1];
      write_out2<Out::bf16>(p, row, col, lo, hi);
    }
    __syncthreads();
  }
  // The next row and its place in the list are read one row ahead.
  int64_t row = grab_row(p, lane);
  uint32_t n = row < p.act.layout.rows ? __ldg(p.rows.row_nnz + row) : 0u;
  uint32_t off = row < p.act.layout.rows ? __ldg(p.row_off + row) : 0u;
  while (row < p.act.layout.rows) {
    const int64_t next = grab_row(p, lane);
    const uint32_t next_n = next < p.act.layout.rows ? __ldg(p.rows.row_nnz + next) : 0u;
    const uint32_t next_off = next < p.act.layout.rows ? __ldg(p.row_off + next) : 0u;
    zero();
    list_accumulate<kChunks>(p, tables, off, off + n, acc, lane);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) write_out8<Out::bf16>(p, row, c * 256 + lane * 8, acc[c]);
    row = next, n = next_n, off = next_off;
  }
}

template <int kChunks>
void launch_down_list(const Params& p, int sm_count, int64_t M, cudaStream_t stream) {
  const int smem = kListWarps * kChunks * 256 * 4;
  auto kernel = twell_ffn_down_list_kernel<kChunks>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  const int64_t blocks = std::min<int64_t>(sm_count, (M + kListWarps - 1) / kListWarps);
  kernel<<<static_cast<unsigned>(blocks), kListWarps * 32, smem, stream>>>(p);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void launch_list_passes(const SparseFfnArgs& a, Params p, int sm_count, cudaStream_t stream) {
  size_t temp_bytes = a.scan_temp_bytes;
  TWELL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(a.scan_temp, temp_bytes, a.rows.row_nnz, a.row_off, a.M, stream));
  p.entries = a.entries, p.row_off = a.row_off, p.wd_packed = a.wd_packed;
  p.next_row = a.row_counters, p.next_heavy = a.row_counters + 2;
  launch_sddmm(twell_ffn_up_list_kernel, p, sm_count, a.M, stream);
  p.next_row = a.row_counters + 1, p.next_heavy = a.row_counters + 3;
  switch (a.H / 256) {
    case 1: return launch_down_list<1>(p, sm_count, a.M, stream);
    case 2: return launch_down_list<2>(p, sm_count, a.M, stream);
    case 3: return launch_down_list<3>(p, sm_count, a.M, stream);
    case 4: return launch_down_list<4>(p, sm_count, a.M, stream);
    case 5: return launch_down_list<5>(p, sm_count, a.M, stream);
    case 6: return launch_down_list<6>(p, sm_count, a.M, stream);
    case 7: return launch_down_list<7>(p, sm_count, a.M, stream);
    default: return launch_down_list<8>(p, sm_count, a.M, stream);
  }
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
  return a.gated && a.precision == Precision::bf16 && a.H % 256 == 0 && a.H <= 2048 && a.I <= 65536 &&
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
                "256 up to 2048, I <= 65536 and row counts; got H = ", a.H, ", I = ", a.I);
    TWELL_CHECK(a.row_off && a.scan_temp && a.scan_temp_bytes >= twell_list_scan_temp_bytes(a.M),
                "sparse FFN kernel: the list path needs row_off and the scan's workspace");
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
