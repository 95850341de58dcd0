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
// backup). Heavy tokens (more than kHeavyRowEntries non-zeros, listed by the pack) go first, a
// whole block each, its warps taking contiguous shares of the tiles. The next token's counts,
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
// per column; a heavy row: its warps' shares added in warp order): results are deterministic,
// whichever warp or block takes a token.
// Covered by tests/cuda/test_twell_ffn.cu; timed by `twell bench ffn`.
#include "cuda/kernels/twell_rows.cuh"

namespace twell::cuda {
namespace {

// up: u[m, j] = bf16(x[m] · Wu[j]) for every active (m, j), on the tensor cores (sddmm_loop).
__global__ __launch_bounds__(kSddmmMaxWarps * 32, 1) void twell_ffn_up_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) char smem[];
  sddmm_loop<Aux::u_index>(p, p.wu, smem, threadIdx.x % 32,
                           [&](uint32_t u_index, float dot) { p.u_vals[u_index] = float_to_bf16_bits(dot); });
}

// The reuse down pass (docs/perf.md, "Next steps for the FFN forward", 1). UNTESTED DRAFT.
// Compaction, warp per row: a row with at most kReuseMaxEntries entries writes them, in ascending
// column order, to entries[i·M + row] as (h bf16 bits << 16) | column, and its count; a longer row
// goes to the fallback list (count kReuseFallback) for the ring kernel.
constexpr uint8_t kReuseFallback = 0xff;
constexpr int kReuseThreads = 512;  // tokens a block (88 registers: entries and 16 accumulators)
constexpr int kReuseColumns = 16;   // a chunk: 32 bytes of every row of Wd

template <Aux kAux>
__global__ __launch_bounds__(256) void reuse_compact_kernel(const __grid_constant__ Params p, SparseFfnArgs::Reuse o) {
  extern __shared__ __align__(16) char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  int32_t* col = reinterpret_cast<int32_t*>(smem) + static_cast<int64_t>(warp) * 2 * p.list_cap;
  uint32_t* aux = reinterpret_cast<uint32_t*>(col + p.list_cap);
  const int64_t M = p.act.layout.rows, n_tiles = p.act.layout.n_tiles();
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * n_warps + warp; row < M;
       row += static_cast<int64_t>(gridDim.x) * n_warps) {
    if (__ldg(p.rows.row_nnz + row) > static_cast<uint32_t>(kReuseMaxEntries)) {
      if (lane == 0) {
        o.count[row] = kReuseFallback;
        o.fallback[atomicAdd(o.fallback_count, 1u)] = static_cast<uint32_t>(row);
      }
      continue;
    }
    int64_t t = 0;  // one list holds the whole row: list_cap >= 256 > kReuseMaxEntries
    const uint32_t len = stage<kAux>(p, row, t, n_tiles, col, aux, lane);
    if (len > static_cast<uint32_t>(kReuseMaxEntries)) {  // the pack's count disagrees: never write past the buffer
      if (lane == 0) {
        o.count[row] = kReuseFallback;
        o.fallback[atomicAdd(o.fallback_count, 1u)] = static_cast<uint32_t>(row);
      }
      __syncwarp();
      continue;
    }
    for (uint32_t k = lane; k < len; k += 32)
      o.entries[k * M + row] = (aux[k] & 0xffff0000u) | static_cast<uint32_t>(col[k]);  // h is bf16-exact
    if (lane == 0) o.count[row] = static_cast<uint8_t>(len);
    __syncwarp();  // the list is rewritten for the next row
  }
}

// y[row] = Σ h·Wd[j] for the block's kReuseThreads rows, a thread per row, Wd streamed through shared
// memory 16 columns (all I rows) at a time. The block's rows are ordered by entry count so that a
// warp's loop bound is its own longest row. Per column the sum runs over ascending j from 0, by
// FMA, as the ring kernel's: the same bits.
__global__ __launch_bounds__(kReuseThreads, 1) void reuse_down_kernel(const __grid_constant__ Params p,
                                                                     SparseFfnArgs::Reuse o) {
  extern __shared__ uint4 chunk[];  // [2][I]: columns c0 .. c0 + 8 of every row, then c0 + 8 .. c0 + 16
  __shared__ uint32_t perm[kReuseThreads];
  __shared__ uint32_t bucket_start[kReuseMaxEntries + 2], bucket_fill[kReuseMaxEntries + 2];
  const int64_t M = p.act.layout.rows, I = p.act.layout.cols, H = p.H;
  for (int64_t group = blockIdx.x; group * kReuseThreads < M; group += gridDim.x) {
    const int64_t row0 = group * kReuseThreads;
    // Counting sort of the group's rows by entry count, descending (fallback rows and rows past M
    // count as 0; they write nothing).
    const int64_t mine = row0 + threadIdx.x;
    const uint8_t c_raw = mine < M ? o.count[mine] : kReuseFallback;
    const int bucket = c_raw == kReuseFallback ? 0 : c_raw;
    __syncthreads();  // perm and the buckets are free (the previous group is done with them)
    if (threadIdx.x < kReuseMaxEntries + 2) bucket_fill[threadIdx.x] = 0;
    __syncthreads();
    atomicAdd(&bucket_fill[bucket], 1u);
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t sum = 0;
      for (int b = kReuseMaxEntries; b >= 0; --b) bucket_start[b] = sum, sum += bucket_fill[b], bucket_fill[b] = 0;
    }
    __syncthreads();
    perm[bucket_start[bucket] + atomicAdd(&bucket_fill[bucket], 1u)] = threadIdx.x;
    __syncthreads();
    const int64_t row = row0 + perm[threadIdx.x];
    const uint8_t c = row < M ? o.count[row] : kReuseFallback;
    const bool live = c != kReuseFallback;
    const int cnt = live ? c : 0;
    uint32_t e[kReuseMaxEntries];
#pragma unroll
    for (int i = 0; i < kReuseMaxEntries; ++i) e[i] = i < cnt ? __ldg(o.entries + i * M + row) : 0u;
    const int bound = __reduce_max_sync(0xffffffffu, cnt);
    for (int64_t c0 = 0; c0 < H; c0 += kReuseColumns) {
      __syncthreads();  // every thread done with the previous chunk
      for (int64_t r = threadIdx.x; r < 2 * I; r += kReuseThreads)  // neighbours read one row's 32 bytes
        chunk[(r % 2) * I + r / 2] = __ldg(reinterpret_cast<const uint4*>(p.wd + (r / 2) * H + c0 + (r % 2) * 8));
      __syncthreads();
      float acc[2][8] = {};  // columns c0 .. c0 + 8, c0 + 8 .. c0 + 16
#pragma unroll
      for (int i = 0; i < kReuseMaxEntries; ++i) {
        // i < bound: the warp's loop; i < cnt: this row's entries only (no padding product, which
        // would turn a non-finite weight of row 0 into a NaN for rows that do not use it).
        if (i < bound && i < cnt) {
          const uint32_t j = e[i] & 0xffffu;
          const float h = __uint_as_float(e[i] & 0xffff0000u);
          fma8(acc[0], h, chunk[j]);
          fma8(acc[1], h, chunk[I + j]);
        }
      }
      if (live) {
        uint4* dst = reinterpret_cast<uint4*>(p.y + row * H + c0);
        dst[0] = pack8(acc[0]);
        dst[1] = pack8(acc[1]);
      }
    }
  }
}

// The down pass with reuse: compaction, the reuse kernel, then the ring kernel over the fallback
// rows (its heavy-row phase as usual).
template <int kChunks, Aux kAux>
void launch_reuse_down(const SparseFfnArgs& a, Params p, int sm_count, cudaStream_t stream) {
  TWELL_CUDA_CHECK(cudaMemsetAsync(a.reuse.fallback_count, 0, sizeof(uint32_t), stream));
  const int compact_smem = 256 / 32 * 2 * p.list_cap * 4;
  allow_dynamic_smem(reinterpret_cast<const void*>(reuse_compact_kernel<kAux>), compact_smem);
  const unsigned compact_blocks = static_cast<unsigned>(std::min<int64_t>(int64_t{sm_count} * 8, (a.M + 7) / 8));
  reuse_compact_kernel<kAux><<<compact_blocks, 256, compact_smem, stream>>>(p, a.reuse);
  TWELL_CUDA_CHECK(cudaGetLastError());
  const int chunk_smem = static_cast<int>(a.I * 2 * 16);
  allow_dynamic_smem(reinterpret_cast<const void*>(reuse_down_kernel), chunk_smem);
  const int64_t groups = (a.M + kReuseThreads - 1) / kReuseThreads;
  reuse_down_kernel<<<static_cast<unsigned>(std::min<int64_t>(sm_count, groups)), kReuseThreads, chunk_smem, stream>>>(
      p, a.reuse);
  TWELL_CUDA_CHECK(cudaGetLastError());
  p.row_list = a.reuse.fallback, p.row_list_count = a.reuse.fallback_count;
  launch(twell_axpy_kernel<kChunks, kAux, Out::bf16>, p, sm_count, a.M, stream);
}

template <int kChunks>
void launch_passes(const SparseFfnArgs& a, Params p, int sm_count, cudaStream_t stream) {
  TWELL_CUDA_CHECK(cudaMemsetAsync(a.row_counters, 0, 4 * sizeof(uint32_t), stream));
  p.next_row = a.row_counters + 1, p.next_heavy = a.row_counters + 3;
  // Below ~a group of 512 rows per SM the blocks that stream all of Wd are too few to fill the GPU.
  const bool reuse = a.reuse.entries && a.rows.row_nnz && a.M >= a.reuse.min_tokens &&
                     twell_reuse_down_supported(a.H, a.I, a.precision);
  if (!a.gated) {
    if (reuse) return launch_reuse_down<kChunks, Aux::h_plain>(a, p, sm_count, stream);
    return launch(twell_axpy_kernel<kChunks, Aux::h_plain, Out::bf16>, p, sm_count, a.M, stream);
  }
  p.next_row = a.row_counters, p.next_heavy = a.row_counters + 2;
  launch_sddmm(twell_ffn_up_kernel, p, sm_count, a.M, stream);
  p.next_row = a.row_counters + 1, p.next_heavy = a.row_counters + 3;
  if (a.precision == Precision::h_fp32)
    launch(twell_axpy_kernel<kChunks, Aux::h_gated_fp32, Out::bf16>, p, sm_count, a.M, stream);
  else if (reuse)
    launch_reuse_down<kChunks, Aux::h_gated>(a, p, sm_count, stream);
  else
    launch(twell_axpy_kernel<kChunks, Aux::h_gated, Out::bf16>, p, sm_count, a.M, stream);
}

}  // namespace

bool twell_reuse_down_supported(int64_t H, int64_t I, Precision precision) {
  // h in bf16 (the entries carry its bits), neuron indices in 16 bits, the chunk in shared memory.
  return precision == Precision::bf16 && I <= 65536 && I * 32 + 4096 <= kSmemBytes && H % kReuseColumns == 0;
}

int64_t twell_u_size(const TwellDeviceView& act) {
  return act.layout.slot_size() + act.backup_capacity * act.layout.tile;
}

void check_twell_ffn_sparse(const SparseFfnArgs& a) {
  check_rows_args("sparse FFN kernel", a.act, a.M, a.H, a.I);
  TWELL_CHECK(a.precision != Precision::f64, "sparse FFN kernel: Precision::f64 is CPU-only");
  TWELL_CHECK(!a.gated || a.u_vals, "sparse FFN kernel: a gated FFN needs the u buffer");
  TWELL_CHECK(a.row_counters, "sparse FFN kernel: needs two device counters (row_counters)");
}

void launch_twell_ffn_sparse(const SparseFfnArgs& a, int sm_count, cudaStream_t stream) {
  check_twell_ffn_sparse(a);
  if (a.M == 0) return;
  const Params p{a.act, a.x, a.wu, a.wd, a.u_vals, a.y, a.H, 0, list_cap_for(a.act.layout), nullptr, nullptr, a.rows};
  const int64_t chunks = (a.H + 255) / 256;
  if (chunks <= 2) launch_passes<2>(a, p, sm_count, stream);
  else if (chunks <= 4) launch_passes<4>(a, p, sm_count, stream);
  else if (chunks <= 8) launch_passes<8>(a, p, sm_count, stream);
  else launch_passes<16>(a, p, sm_count, stream);
}

}  // namespace twell::cuda
