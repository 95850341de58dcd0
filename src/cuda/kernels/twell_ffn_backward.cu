// The gated FFN's backward on the active set held in TwELL (the maths: DESIGN.md §2 and
// src/cpu/ffn_backward.cpp, the reference this is tested against):
//   dh pass (SDDMM over Wd)  per active (m, j): dh = bf16(dy[m] · Wd[j] + l1·sign(h)),
//                            du = bf16(dh·g), dg = bf16(dh·u), stored beside the format (dg_vals,
//                            du_vals, indexed like u_vals); g from the format, u from the forward
//   dx pass (SpMM)           dx[m] = Σ_j (dg·Wg[j] + du·Wu[j]) (f32), both rows of an entry
//                            through the same ring
//   transpose                the active set by neuron: each row's entries written at the row's
//                            offset (a scan of the pack's row counts), in row-major order, then a
//                            stable radix sort by neuron (CUB): each neuron's tokens ascending
//   dW pass                  per neuron j, over its tokens m: dWg[j] += dg·x[m], dWu[j] += du·x[m],
//                            dWd[j] += h·dy[m] (f32), hot neurons spread over several blocks
// The dh and dx passes reuse the forward's row-streaming machinery (twell_rows.cuh). Every sum has
// a fixed order, so the gradients are bitwise reproducible; nothing is dropped at any density.
// Covered by tests/cuda/test_twell_ffn.cu (FfnBackwardGpu).
#include <cub/device/device_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "cuda/kernels/ffn_grad.cuh"
#include "cuda/kernels/twell_rows.cuh"

namespace twell::cuda {
namespace {

// g of an active entry from its index into u_vals: the packed word, or the backup's value.
__device__ __forceinline__ float entry_g(const TwellDeviceView& a, uint32_t i) {
  const int64_t slot_size = a.layout.slot_size();
  return i < slot_size ? twell_entry_value(__ldg(a.slots + i)) : bf16_bits_to_float(__ldg(a.backup + (i - slot_size)));
}

// dh pass: dy[m] · Wd[j] for every active (m, j) on the tensor cores (sddmm_loop), then dh, du,
// dg as the bf16 reference rounds them.
__global__ __launch_bounds__(kSddmmMaxWarps * 32, 1) void twell_ffn_dh_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) char smem[];
  sddmm_loop<Aux::u_index>(p, p.wd, smem, threadIdx.x % 32,
                           [&](uint32_t i, float dot) {  // p.x is dy here
                             float dg, du;
                             gated_entry_grads(dot, entry_g(p.act, i), bf16_bits_to_float(p.u_vals[i]), p.l1, dg, du);
                             p.du_vals[i] = float_to_bf16_bits(du);
                             p.dg_vals[i] = float_to_bf16_bits(dg);
                           });
}

// Transpose, warp per row: row r's entries, in ascending column order, at row_start[r] ..:
// key = the neuron, pair = (r << 32) | the entry's u index. Every position is fixed by the data
// (no atomics), so the stable sort after leaves each neuron's tokens ascending.
__global__ __launch_bounds__(256) void transpose_fill_kernel(const __grid_constant__ Params p, const uint32_t* row_start,
                                                             uint32_t* keys, uint64_t* pairs) {
  extern __shared__ __align__(16) char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  int32_t* col = reinterpret_cast<int32_t*>(smem) + static_cast<int64_t>(warp) * 2 * p.list_cap;
  uint32_t* aux = reinterpret_cast<uint32_t*>(col + p.list_cap);
  const int64_t n_tiles = p.act.layout.n_tiles();
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * n_warps + warp; row < p.act.layout.rows;
       row += static_cast<int64_t>(gridDim.x) * n_warps) {
    uint32_t pos = __ldg(row_start + row);
    for (int64_t t = 0; t < n_tiles;) {
      const uint32_t len = stage<Aux::u_index>(p, row, t, n_tiles, col, aux, lane);
      for (uint32_t k = lane; k < len; k += 32) {
        keys[pos + k] = static_cast<uint32_t>(col[k]);
        pairs[pos + k] = static_cast<uint64_t>(row) << 32 | aux[k];
      }
      pos += len;
      __syncwarp();  // the next stage overwrites the list
    }
  }
}

// col_start[j] = the first position of neuron j in the sorted keys (j = I: nnz).
__global__ void column_starts_kernel(const uint32_t* keys_sorted, int64_t nnz, int64_t I, uint32_t* col_start) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j > I) return;
  int64_t lo = 0, hi = nnz;  // lower bound of j
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (__ldg(keys_sorted + mid) < static_cast<uint32_t>(j)) lo = mid + 1;
    else hi = mid;
  }
  col_start[j] = static_cast<uint32_t>(lo);
}

// dW pass. The transposed active set (each neuron's tokens ascending) is cut into pieces of at
// most `piece` tokens (~nnz / 2048: 225 at M = 16384, 0.5%; nnz / 512 left the skewed step's
// tail 70-110 µs longer), and the columns into slices (twell_dw_slice_columns). A (slice, piece)
// is one work item, taken by a block from a global counter, slice-major: every block works in
// the same slice, whose columns of x and dy stay in L2 (at M = 16384, H = 2048: four slices of
// 512 columns, 33.5 MB; whole rows, 134 MB, hit 37-52% and the pass was bound by the DRAM
// refills). A hot neuron (thousands of tokens, skewed distributions) is spread over many blocks
// instead of serialising one. The plan, from the per-neuron counts:
//   items[j]   = max(1, ⌈count_j / piece⌉)     (a neuron without tokens still writes its zeros)
//   splits[j]  = items[j] if > 1, else 0       (pieces whose partial sums go to the scratch)
// exclusive scans of both, and item_neuron[item] = j. A block of C threads runs an item: thread c
// owns columns [8c, 8c + 8) of the slice and adds the piece's tokens in order, two rows in
// flight; a split neuron's pieces are added in piece order by the reduce kernel. Every sum has a
// fixed order: bitwise reproducible. An item starts with a chain of dependent loads (the item,
// its neuron, its tokens and their coefficients, then the rows), so blocks of C threads, 1024
// threads an SM each on its own item, hide it better than blocks of 512 splitting an item in two
// token groups (docs/perf.md, training items 11-13).
struct DwPlan {  // views into SparseBackwardArgs::dw_plan
  uint32_t *items, *item_start, *splits, *split_start, *item_neuron, *next_item;
  static DwPlan in(uint32_t* w, int64_t I) {
    const int64_t n = I + 1;
    return {w, w + n, w + 2 * n, w + 3 * n, w + 4 * n + 1, w + 4 * n};
  }
};

struct DwArgs {
  const uint32_t* start;  // [I + 1]
  const uint64_t* pairs;  // (token << 32) | index into u_vals / dg_vals / du_vals, tokens ascending within a neuron
  const uint16_t* x;
  const uint16_t* dy;
  float *dwg, *dwu, *dwd;  // null: not computed
  float* scratch;          // [split pieces][3][H]
  DwPlan plan;
  int64_t I;
  uint32_t piece;
  int64_t width;    // columns of a slice: H / slices, a multiple of 8
  uint32_t slices;  // each piece runs once per slice, slice-major
};

__global__ void dw_plan_kernel(DwArgs d) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j > d.I) return;
  uint32_t n = 0;
  if (j < d.I) {
    const uint32_t count = d.start[j + 1] - d.start[j];
    n = count <= d.piece ? 1u : (count + d.piece - 1) / d.piece;
  }
  d.plan.items[j] = n;
  d.plan.splits[j] = n > 1 ? n : 0u;
  if (j == 0) *d.plan.next_item = 0;
}

__global__ void dw_item_map_kernel(DwArgs d) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d.I) return;
  const uint32_t first = d.plan.item_start[j], n = d.plan.items[j];
  for (uint32_t k = 0; k < n; ++k) d.plan.item_neuron[first + k] = static_cast<uint32_t>(j);
}

constexpr int kDwSmThreads = 1024;  // threads an SM: its blocks of C each, on their own items
constexpr int kDwMaxC = 512;        // C = a slice's columns / 8, rounded up to a warp
static_assert(kMaxChunks * 256 / 8 <= kDwMaxC, "a whole row of the widest H must fit a block");
constexpr int kDwBatch = 128;       // tokens staged in shared memory at a time

// At most 64 registers, so that 1024 threads an SM fit at every C: without the cap one barrier
// more took the kernel to 81 and 12 blocks of 64 an SM, and the step from 2.50 to 2.63 ms (skewed).
__global__ __launch_bounds__(kDwMaxC, kDwSmThreads / kDwMaxC) void twell_ffn_dw_kernel(const __grid_constant__ Params p,
                                                              const __grid_constant__ DwArgs d) {
  __shared__ uint32_t tok[kDwBatch];
  __shared__ float cg[kDwBatch], cu[kDwBatch], ch[kDwBatch];
  __shared__ uint32_t item_sh;
  const bool owns = threadIdx.x * 8 < d.width;
  const uint32_t n_items = d.plan.item_start[d.I];
  for (;;) {
    if (threadIdx.x == 0) item_sh = atomicAdd(d.plan.next_item, 1u);
    __syncthreads();
    const uint32_t slice_item = item_sh;
    if (slice_item >= n_items * d.slices) return;
    const uint32_t slice = slice_item / n_items, item = slice_item - slice * n_items;
    const int64_t col = slice * d.width + threadIdx.x * 8;
    const uint32_t j = d.plan.item_neuron[item], piece = item - d.plan.item_start[j];
    const uint32_t k0 = d.start[j] + piece * d.piece, k1 = min(d.start[j + 1], k0 + d.piece);
    float ag[8] = {}, au[8] = {}, ad[8] = {};
    for (uint32_t kb = k0; kb < k1; kb += kDwBatch) {
      const int n = static_cast<int>(min(static_cast<uint32_t>(kDwBatch), k1 - kb));
      for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const uint64_t e = __ldg(d.pairs + kb + t);
        const auto i = static_cast<uint32_t>(e);
        tok[t] = static_cast<uint32_t>(e >> 32);
        cg[t] = bf16_bits_to_float(__ldg(p.dg_vals + i));
        cu[t] = bf16_bits_to_float(__ldg(p.du_vals + i));
        ch[t] = round_bf16(entry_g(p.act, i) * bf16_bits_to_float(__ldg(p.u_vals + i)));
      }
      __syncthreads();
      if (owns) {
        int t = 0;
        for (; t + 1 < n; t += 2) {  // two tokens' rows in flight
          const uint4 x0 = __ldg(reinterpret_cast<const uint4*>(d.x + tok[t] * p.H + col));
          const uint4 y0 = __ldg(reinterpret_cast<const uint4*>(d.dy + tok[t] * p.H + col));
          const uint4 x1 = __ldg(reinterpret_cast<const uint4*>(d.x + tok[t + 1] * p.H + col));
          const uint4 y1 = __ldg(reinterpret_cast<const uint4*>(d.dy + tok[t + 1] * p.H + col));
          fma8(ag, cg[t], x0), fma8(au, cu[t], x0), fma8(ad, ch[t], y0);
          fma8(ag, cg[t + 1], x1), fma8(au, cu[t + 1], x1), fma8(ad, ch[t + 1], y1);
        }
        if (t < n) {
          const uint4 x0 = __ldg(reinterpret_cast<const uint4*>(d.x + tok[t] * p.H + col));
          const uint4 y0 = __ldg(reinterpret_cast<const uint4*>(d.dy + tok[t] * p.H + col));
          fma8(ag, cg[t], x0), fma8(au, cu[t], x0), fma8(ad, ch[t], y0);
        }
      }
      __syncthreads();  // the next batch overwrites the staged tokens
    }
    if (owns) {
      const uint32_t split0 = d.plan.split_start[j];
      const bool split = d.plan.split_start[j + 1] != split0;
      auto store = [&](float* out, int o, const float (&v)[8]) {
        if (split) out = d.scratch + (static_cast<int64_t>(split0 + piece) * 3 + o) * p.H;
        else if (!out) return;
        else out += static_cast<int64_t>(j) * p.H;
        float4* dst = reinterpret_cast<float4*>(out + col);
        dst[0] = make_float4(v[0], v[1], v[2], v[3]);
        dst[1] = make_float4(v[4], v[5], v[6], v[7]);
      };
      store(d.dwg, 0, ag);
      store(d.dwu, 1, au);
      store(d.dwd, 2, ad);
    }
    __syncthreads();  // item_sh is reused (an item without tokens has no barrier before)
  }
}

// A split neuron's gradient rows: its pieces' partial sums in piece order.
__global__ void dw_reduce_kernel(const __grid_constant__ DwArgs d, int64_t H) {
  const int64_t col = static_cast<int64_t>(threadIdx.x) * 8;
  if (col >= H) return;
  float* outs[3] = {d.dwg, d.dwu, d.dwd};
  for (int64_t j = blockIdx.x; j < d.I; j += gridDim.x) {
    const uint32_t s0 = d.plan.split_start[j], s1 = d.plan.split_start[j + 1];
    if (s0 == s1) continue;
    for (int o = 0; o < 3; ++o) {
      if (!outs[o]) continue;
      float v[8] = {};
      for (uint32_t s = s0; s < s1; ++s) {
        const float4* src = reinterpret_cast<const float4*>(d.scratch + (static_cast<int64_t>(s) * 3 + o) * H + col);
        const float4 lo = src[0], hi = src[1];
        v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w, v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
      }
      float4* dst = reinterpret_cast<float4*>(outs[o] + j * H + col);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
}

template <int kChunks>
void launch_backward(const SparseBackwardArgs& a, Params p, int sm_count, cudaStream_t stream) {
  TWELL_CUDA_CHECK(cudaMemsetAsync(a.row_counters, 0, 4 * sizeof(uint32_t), stream));
  p.x = a.dy, p.wd = a.wd;
  p.next_row = a.row_counters, p.next_heavy = a.row_counters + 2;
  launch_sddmm(twell_ffn_dh_kernel, p, sm_count, a.M, stream);
  if (a.dx) {
    p.out_f32 = a.dx;
    p.next_row = a.row_counters + 1, p.next_heavy = a.row_counters + 3;
    p.wd = a.wg, p.wu = a.wu;
    launch(twell_axpy_kernel<kChunks, Aux::dg_du, Out::f32_store>, p, sm_count, a.M, stream);
  }
}

constexpr int kTransposeThreads = 256;

}  // namespace

// Bits of a neuron index: the radix sort looks at no more.
static int neuron_bits(int64_t I) {
  int bits = 1;
  while ((int64_t{1} << bits) < I) ++bits;
  return bits;
}

size_t twell_backward_temp_bytes(int64_t nnz, int64_t M, int64_t I) {
  size_t scan = 0, sort = 0;
  TWELL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), std::max(M, I) + 1));
  TWELL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const uint32_t*>(nullptr),
                                                   static_cast<uint32_t*>(nullptr), static_cast<const uint64_t*>(nullptr),
                                                   static_cast<uint64_t*>(nullptr), nnz, 0, neuron_bits(I)));
  return std::max(scan, sort);
}

void launch_twell_ffn_backward(const SparseBackwardArgs& a, int sm_count, cudaStream_t stream) {
  check_rows_args("sparse FFN backward", a.act, a.M, a.H, a.I);
  TWELL_CHECK(a.x && a.dy && a.wg && a.wu && a.wd && a.u_vals && a.dg_vals && a.du_vals && a.row_counters,
              "sparse FFN backward: missing input or workspace pointer");
  TWELL_CHECK(a.dw_slice >= 0, "sparse FFN backward: dW slice of ", a.dw_slice, " columns");
  const int64_t width = a.dw_slice > 0 ? a.dw_slice : a.H;
  TWELL_CHECK(width % 8 == 0 && a.H % width == 0, "sparse FFN backward: dW slice of ", width,
              " columns must be a multiple of 8 dividing H = ", a.H);
  const int C = static_cast<int>((width / 8 + 31) / 32 * 32);  // <= kDwMaxC: check_rows_args holds H
  const int blocks_per_sm = std::min(32, kDwSmThreads / C);
  const bool need_dw = a.dwg || a.dwu || a.dwd;
  // The dW work counter runs to items · slices + the blocks (each takes one past the end).
  const int64_t max_items = a.I + a.nnz / twell_dw_piece_tokens(a.nnz);
  TWELL_CHECK(!need_dw || max_items * (a.H / width) + int64_t{sm_count} * blocks_per_sm < (int64_t{1} << 32),
              "sparse FFN backward: ", max_items, " dW items in ", a.H / width, " slices past 32-bit counting");
  if (a.M == 0) return;
  Params p{a.act,   a.x, a.wu, a.wd, const_cast<uint16_t*>(a.u_vals),  // read only here
           nullptr, a.H, 0,    list_cap_for(a.act.layout), nullptr, nullptr, a.rows};
  p.dg_vals = a.dg_vals, p.du_vals = a.du_vals, p.l1 = a.l1;
  DwArgs d{};
  if (need_dw) {
    // The transpose and the dW plan need only the forward's format: on the side stream (when
    // given) they run while the passes do, in their tails and gaps.
    TWELL_CHECK(a.row_start && a.col_start && a.keys && a.pairs && a.keys_sorted && a.pairs_sorted && a.temp,
                "sparse FFN backward: missing transpose workspace");
    TWELL_CHECK(a.rows.row_nnz, "sparse FFN backward: the transpose needs the pack's row counts");
    TWELL_CHECK(a.M < (int64_t{1} << 32) && a.nnz < (int64_t{1} << 32), "sparse FFN backward: M = ", a.M, ", nnz = ",
                a.nnz, " past 32-bit indexing");
    TWELL_CHECK(a.dw_plan && a.dw_scratch, "sparse FFN backward: missing dW workspace");
    TWELL_CHECK(!a.side || (a.packed && a.join), "sparse FFN backward: a side stream needs its two events");
    cudaStream_t s = stream;
    if (a.side) {
      TWELL_CUDA_CHECK(cudaStreamWaitEvent(a.side, a.packed, 0));
      s = a.side;
    }
    const int smem = kTransposeThreads / 32 * 2 * p.list_cap * 4;
    constexpr int kMaxTransposeSmem = kTransposeThreads / 32 * 2 * kMaxTile * 4;  // the attribute is set once
    allow_dynamic_smem(reinterpret_cast<const void*>(transpose_fill_kernel), kMaxTransposeSmem);
    const unsigned blocks = static_cast<unsigned>(
        std::min<int64_t>(int64_t{sm_count} * 8, (a.M + kTransposeThreads / 32 - 1) / (kTransposeThreads / 32)));
    // row_start = exclusive scan of the pack's row counts (the fill needs no total).
    size_t bytes = a.temp_bytes;
    TWELL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(a.temp, bytes, a.rows.row_nnz, a.row_start, a.M, s));
    transpose_fill_kernel<<<blocks, kTransposeThreads, smem, s>>>(p, a.row_start, a.keys, a.pairs);
    TWELL_CUDA_CHECK(cudaGetLastError());
    bytes = a.temp_bytes;
    TWELL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(a.temp, bytes, a.keys, a.keys_sorted, a.pairs, a.pairs_sorted,
                                                     a.nnz, 0, neuron_bits(a.I), s));
    column_starts_kernel<<<static_cast<unsigned>((a.I + 1 + 255) / 256), 256, 0, s>>>(a.keys_sorted, a.nnz, a.I,
                                                                                     a.col_start);
    TWELL_CUDA_CHECK(cudaGetLastError());
    d = DwArgs{a.col_start, a.pairs_sorted, a.x,  a.dy, a.dwg, a.dwu, a.dwd, a.dw_scratch,
               DwPlan::in(a.dw_plan, a.I), a.I, static_cast<uint32_t>(twell_dw_piece_tokens(a.nnz))};
    const unsigned plan_blocks = static_cast<unsigned>((a.I + 1 + 255) / 256);
    dw_plan_kernel<<<plan_blocks, 256, 0, s>>>(d);
    TWELL_CUDA_CHECK(cudaGetLastError());
    bytes = a.temp_bytes;
    TWELL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(a.temp, bytes, d.plan.items, d.plan.item_start, a.I + 1, s));
    bytes = a.temp_bytes;
    TWELL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(a.temp, bytes, d.plan.splits, d.plan.split_start, a.I + 1, s));
    dw_item_map_kernel<<<plan_blocks, 256, 0, s>>>(d);
    TWELL_CUDA_CHECK(cudaGetLastError());
    if (a.side) TWELL_CUDA_CHECK(cudaEventRecord(a.join, a.side));
  }

  const int64_t chunks = (a.H + 255) / 256;
  if (chunks <= 2) launch_backward<2>(a, p, sm_count, stream);
  else if (chunks <= 4) launch_backward<4>(a, p, sm_count, stream);
  else if (chunks <= 8) launch_backward<8>(a, p, sm_count, stream);
  else launch_backward<16>(a, p, sm_count, stream);
  if (!need_dw) return;

  if (a.side) TWELL_CUDA_CHECK(cudaStreamWaitEvent(stream, a.join, 0));
  d.slices = static_cast<uint32_t>(a.H / width);
  d.width = width;
  twell_ffn_dw_kernel<<<static_cast<unsigned>(sm_count * blocks_per_sm), C, 0, stream>>>(p, d);
  TWELL_CUDA_CHECK(cudaGetLastError());
  const int C_reduce = static_cast<int>((a.H / 8 + 31) / 32 * 32);
  const unsigned reduce_blocks = static_cast<unsigned>(std::min<int64_t>(a.I, int64_t{sm_count} * 8));
  dw_reduce_kernel<<<reduce_blocks, C_reduce, 0, stream>>>(d, a.H);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

int64_t twell_dw_slice_columns(int64_t M, int64_t H, size_t l2_bytes) {
  // Narrower than 512 the items' fixed costs (the dependent loads before an item's rows) outweigh
  // the hits: M = 16384, H = 2048, 0.5%, training step 2.44 ms at 256 against 2.40 at 512.
  int64_t w = H;
  while (w % 16 == 0 && w / 2 >= 512 && static_cast<double>(4 * M) * w > static_cast<double>(l2_bytes)) w /= 2;
  return w;
}

int64_t twell_dw_piece_tokens(int64_t nnz) { return std::clamp<int64_t>(nnz / 2048, 64, 4096); }

size_t twell_dw_plan_words(int64_t nnz, int64_t I) {
  // Four arrays of I + 1 words, the item counter, then the item map: at most I + nnz / piece
  // items (a neuron has max(1, ⌈count / piece⌉)).
  return static_cast<size_t>(4 * (I + 1) + 1 + I + nnz / twell_dw_piece_tokens(nnz));
}

size_t twell_dw_scratch_bytes(int64_t nnz, int64_t H) {
  // Split neurons have more than `piece` tokens, so their pieces number at most 2·nnz / piece
  // (tight: neurons of piece + 1 tokens). At nnz >= 131072 that is 4097 pieces, 12·H bytes each:
  // 100 MB at H = 2048, allocated whether or not anything splits.
  return static_cast<size_t>(2 * (nnz / twell_dw_piece_tokens(nnz)) + 1) * 3 * static_cast<size_t>(H) * 4;
}

}  // namespace twell::cuda
