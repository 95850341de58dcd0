// The gated FFN's backward on the active set held in TwELL (the maths: DESIGN.md §2 and
// src/cpu/ffn_backward.cpp, the reference this is tested against):
//   dh pass (SDDMM over Wd)  per active (m, j): dh = bf16(dy[m] · Wd[j] + l1·sign(h)),
//                            du = bf16(dh·g), dg = bf16(dh·u), stored beside the format (dg_vals,
//                            du_vals, indexed like u_vals); g from the format, u from the forward
//   dx passes (SpMM)         dx[m] = Σ_j dg·Wg[j], then += Σ_j du·Wu[j] (f32)
//   transpose                the active set by neuron: counts, exclusive scan, fill, then each
//                            neuron's tokens sorted ascending (CUB), so the order is fixed
//   dW pass                  per neuron j, over its tokens m ascending: dWg[j] += dg·x[m],
//                            dWu[j] += du·x[m], dWd[j] += h·dy[m] (f32)
// The dh and dx passes reuse the forward's row-streaming machinery (twell_rows.cuh). Every sum has
// a fixed order, so the gradients are bitwise reproducible; nothing is dropped at any density.
// Covered by tests/cuda/test_twell_ffn.cu (FfnBackwardGpu).
#include <cub/device/device_scan.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include "cuda/kernels/ffn_grad.cuh"
#include "cuda/kernels/twell_rows.cuh"

namespace twell::cuda {
namespace {

// g of an active entry from its index into u_vals: the packed word, or the backup's value.
__device__ __forceinline__ float entry_g(const TwellDeviceView& a, uint32_t i) {
  const int64_t slot_size = a.layout.slot_size();
  return i < slot_size ? twell_entry_value(__ldg(a.slots + i)) : bf16_bits_to_float(__ldg(a.backup + (i - slot_size)));
}

// dh pass: dy[m] · Wd[j] for every active (m, j), then dh, du, dg as the bf16 reference rounds them.
template <int kChunks>
__global__ __launch_bounds__(threads_for(kChunks, true), 1) void twell_ffn_dh_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) char smem[];
  const int lane = threadIdx.x % 32;
  const WarpSmem s = warp_smem(smem, p, threadIdx.x / 32, blockDim.x / 32);
  init_barriers(s, p.ring_slots, lane);
  uint4 dyq[kChunks];  // p.x is dy here
  warp_loop<Aux::u_index>(
      p, p.wd, s, true, false, lane, [&](int64_t row) { load_x(p, row, lane, dyq); },
      [&](uint32_t i, const uint16_t* w) {
        const float dot = row_dot(dyq, w, p.H, lane);
        if (lane == 0) {
          float dg, du;
          gated_entry_grads(dot, entry_g(p.act, i), bf16_bits_to_float(p.u_vals[i]), p.l1, dg, du);
          p.du_vals[i] = float_to_bf16_bits(du);
          p.dg_vals[i] = float_to_bf16_bits(dg);
        }
      },
      [](int64_t) {}, [](int64_t) {});
}

// Transpose, warp per row: kFill = false counts each neuron's active tokens into `count`; true
// writes (token, u index) pairs at start[j] + a per-neuron cursor (order fixed by the sort after).
template <bool kFill>
__global__ __launch_bounds__(256) void transpose_kernel(const __grid_constant__ Params p, uint32_t* count,
                                                        const uint32_t* start, uint32_t* keys, uint32_t* vals) {
  extern __shared__ __align__(16) char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  int32_t* col = reinterpret_cast<int32_t*>(smem) + static_cast<int64_t>(warp) * 2 * p.list_cap;
  uint32_t* aux = reinterpret_cast<uint32_t*>(col + p.list_cap);
  const int64_t n_tiles = p.act.layout.n_tiles();
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * n_warps + warp; row < p.act.layout.rows;
       row += static_cast<int64_t>(gridDim.x) * n_warps) {
    for (int64_t t = 0; t < n_tiles;) {
      const uint32_t len = stage<Aux::u_index>(p, row, t, n_tiles, col, aux, lane);
      for (uint32_t k = lane; k < len; k += 32) {
        const uint32_t j = static_cast<uint32_t>(col[k]);
        if constexpr (kFill) {
          const uint32_t pos = start[j] + atomicAdd(count + j, 1u);
          keys[pos] = static_cast<uint32_t>(row);
          vals[pos] = aux[k];
        } else {
          atomicAdd(count + j, 1u);
        }
      }
      __syncwarp();  // the next stage overwrites the list
    }
  }
}

// dW pass: a block per neuron (grid-stride), thread t owns columns [8t, 8t + 8); tokens ascending.
struct DwArgs {
  const uint32_t* start;  // [I + 1]
  const uint32_t* keys;   // token of each entry, sorted within each neuron
  const uint32_t* vals;   // its index into u_vals / dg_vals / du_vals
  const uint16_t* x;
  const uint16_t* dy;
  float *dwg, *dwu, *dwd;  // null: not computed
  int64_t I;
};

__global__ __launch_bounds__(512) void twell_ffn_dw_kernel(const __grid_constant__ Params p, const __grid_constant__ DwArgs d) {
  const int64_t col = static_cast<int64_t>(threadIdx.x) * 8;
  if (col >= p.H) return;
  for (int64_t j = blockIdx.x; j < d.I; j += gridDim.x) {
    float ag[8] = {}, au[8] = {}, ad[8] = {};
    const uint32_t k1 = d.start[j + 1];
    for (uint32_t k = d.start[j]; k < k1; ++k) {
      const uint32_t m = __ldg(d.keys + k), i = __ldg(d.vals + k);
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(d.x + m * p.H + col));
      const uint4 dv = __ldg(reinterpret_cast<const uint4*>(d.dy + m * p.H + col));
      const float h = round_bf16(entry_g(p.act, i) * bf16_bits_to_float(__ldg(p.u_vals + i)));
      fma8(ag, bf16_bits_to_float(__ldg(p.dg_vals + i)), xv);
      fma8(au, bf16_bits_to_float(__ldg(p.du_vals + i)), xv);
      fma8(ad, h, dv);
    }
    auto store = [&](float* out, const float (&v)[8]) {
      if (!out) return;
      float4* dst = reinterpret_cast<float4*>(out + j * p.H + col);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    };
    store(d.dwg, ag);
    store(d.dwu, au);
    store(d.dwd, ad);
  }
}

template <int kChunks>
void launch_backward(const SparseBackwardArgs& a, Params p, int sm_count, cudaStream_t stream) {
  TWELL_CUDA_CHECK(cudaMemsetAsync(a.row_counters, 0, 4 * sizeof(uint32_t), stream));
  p.x = a.dy, p.wd = a.wd;
  p.next_row = a.row_counters, p.next_heavy = a.row_counters + 2;
  launch(twell_ffn_dh_kernel<kChunks>, p, true, sm_count, a.M, stream);
  if (a.dx) {
    p.out_f32 = a.dx;
    p.next_row = a.row_counters + 1, p.next_heavy = a.row_counters + 3;
    p.wd = a.wg;
    launch(twell_axpy_kernel<kChunks, Aux::dg, Out::f32_store>, p, false, sm_count, a.M, stream);
    TWELL_CUDA_CHECK(cudaMemsetAsync(a.row_counters, 0, 4 * sizeof(uint32_t), stream));
    p.wd = a.wu;
    launch(twell_axpy_kernel<kChunks, Aux::du, Out::f32_add>, p, false, sm_count, a.M, stream);
  }
}

constexpr int kTransposeThreads = 256;

}  // namespace

size_t twell_backward_temp_bytes(int64_t nnz, int64_t I) {
  size_t scan = 0, sort = 0;
  TWELL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), I + 1));
  TWELL_CUDA_CHECK(cub::DeviceSegmentedSort::SortPairs(
      nullptr, sort, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), nnz, I,
      static_cast<const uint32_t*>(nullptr), static_cast<const uint32_t*>(nullptr)));
  return std::max(scan, sort);
}

void launch_twell_ffn_backward(const SparseBackwardArgs& a, int sm_count, cudaStream_t stream) {
  check_rows_args("sparse FFN backward", a.act, a.M, a.H, a.I);
  TWELL_CHECK(a.x && a.dy && a.wg && a.wu && a.wd && a.u_vals && a.dg_vals && a.du_vals && a.row_counters,
              "sparse FFN backward: missing input or workspace pointer");
  if (a.M == 0) return;
  Params p{a.act,   a.x, a.wu, a.wd, const_cast<uint16_t*>(a.u_vals),  // read only here
           nullptr, a.H, 0,    list_cap_for(a.act.layout), nullptr, nullptr, a.rows};
  p.dg_vals = a.dg_vals, p.du_vals = a.du_vals, p.l1 = a.l1;
  const int64_t chunks = (a.H + 255) / 256;
  if (chunks <= 2) launch_backward<2>(a, p, sm_count, stream);
  else if (chunks <= 4) launch_backward<4>(a, p, sm_count, stream);
  else if (chunks <= 8) launch_backward<8>(a, p, sm_count, stream);
  else launch_backward<16>(a, p, sm_count, stream);

  if (!a.dwg && !a.dwu && !a.dwd) return;
  TWELL_CHECK(a.col_count && a.col_start && a.keys && a.vals && a.keys_sorted && a.vals_sorted && a.temp,
              "sparse FFN backward: missing transpose workspace");
  const int smem = kTransposeThreads / 32 * 2 * p.list_cap * 4;
  constexpr int kMaxTransposeSmem = kTransposeThreads / 32 * 2 * kMaxTile * 4;  // the attribute is set once
  allow_dynamic_smem(reinterpret_cast<const void*>(transpose_kernel<false>), kMaxTransposeSmem);
  allow_dynamic_smem(reinterpret_cast<const void*>(transpose_kernel<true>), kMaxTransposeSmem);
  const unsigned blocks = static_cast<unsigned>(
      std::min<int64_t>(int64_t{sm_count} * 8, (a.M + kTransposeThreads / 32 - 1) / (kTransposeThreads / 32)));
  TWELL_CUDA_CHECK(cudaMemsetAsync(a.col_count, 0, static_cast<size_t>(a.I + 1) * 4, stream));
  transpose_kernel<false><<<blocks, kTransposeThreads, smem, stream>>>(p, a.col_count, nullptr, nullptr, nullptr);
  TWELL_CUDA_CHECK(cudaGetLastError());
  size_t bytes = a.temp_bytes;
  TWELL_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(a.temp, bytes, a.col_count, a.col_start, a.I + 1, stream));
  TWELL_CUDA_CHECK(cudaMemsetAsync(a.col_count, 0, static_cast<size_t>(a.I + 1) * 4, stream));
  transpose_kernel<true><<<blocks, kTransposeThreads, smem, stream>>>(p, a.col_count, a.col_start, a.keys, a.vals);
  TWELL_CUDA_CHECK(cudaGetLastError());
  bytes = a.temp_bytes;
  TWELL_CUDA_CHECK(cub::DeviceSegmentedSort::SortPairs(a.temp, bytes, a.keys, a.keys_sorted, a.vals, a.vals_sorted,
                                                       a.nnz, a.I, a.col_start, a.col_start + 1, stream));
  const DwArgs d{a.col_start, a.keys_sorted, a.vals_sorted, a.x, a.dy, a.dwg, a.dwu, a.dwd, a.I};
  const int threads = static_cast<int>((a.H / 8 + 31) / 32 * 32);
  const unsigned dw_blocks = static_cast<unsigned>(std::min<int64_t>(a.I, int64_t{sm_count} * 16));
  twell_ffn_dw_kernel<<<dw_blocks, threads, 0, stream>>>(p, d);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
