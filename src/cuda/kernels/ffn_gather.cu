// The gather path of the sparse FFN, for a few tokens (decode): after the dense gate GEMV, only
// the rows of Wu and Wd of each token's active neurons are read, and the work of one token is
// spread over S blocks, each owning a contiguous range of R = ⌈I/S⌉ neurons (the TwELL kernels
// give a token one block, which a token with thousands of active neurons would serialise).
//
// Block (token t, range s), 256 threads:
//   1. the non-zeros of g[t, range] (any bf16 pattern but 0x0000, as TwELL) in ascending order,
//      into shared memory (room for all R: exact at any density);
//   2. a warp per entry: h = bf16(g · bf16(x_t · Wu[j]))   (non-gated: h = g), all of a row's
//      loads in flight at once;
//   3. Σ h·Wd[j] over the range's entries in fp32, 8 columns a thread;
//   4. the range's partial sum goes to global memory; a second kernel adds the S partial sums
//      (block per token and 64 columns, in a fixed order) and writes y. Deterministic.
// Every step is a few dependent memory round trips, which is what a decode step waits on. (A
// token's last block adding all S sums itself was one round trip per range: 12 µs at S = 32 and
// 40 µs a layer for the heavier tokens of a model's deeper layers; docs/perf.md.)
// Covered by tests/cuda/test_twell_ffn.cu (FfnForward, gather path) and the model tests.
#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"
#include "cuda/kernels/bulk_copy.cuh"
#include "cuda/kernels/split_sum.cuh"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;

int64_t range_of(int64_t I, int splits) { return (I / 8 + splits - 1) / splits * 8; }

// kUp: ⌈H/256⌉ chunks of 8 columns per lane in the dot products; kDown: ⌈H/2048⌉ groups of 8
// columns per thread in the down sum.
template <int kUp, int kDown>
__global__ void __launch_bounds__(kThreads) gather_ffn_kernel(const GatherArgs a, int splits, int64_t R) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int32_t* col = reinterpret_cast<int32_t*>(smem_raw);  // [R]
  float* hv = reinterpret_cast<float*>(col + R);         // [R]

  const int64_t t = blockIdx.x;
  const int s = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j_begin = s * R, j_end = min(a.I, j_begin + R);
  const uint16_t* g = a.g + t * a.I;
  // The token's x, for phase 2: loaded now, its latency hidden behind phase 1.
  uint4 x[kUp];
  if (a.gated) {
    const uint4* xr = reinterpret_cast<const uint4*>(a.x + t * a.H);
#pragma unroll
    for (int c = 0; c < kUp; ++c) x[c] = c * 256 + lane * 8 < a.H ? xr[c * 32 + lane] : make_uint4(0, 0, 0, 0);
  }

  // 1. Ordered compaction of the range, 8 neurons (one 16-byte load) per thread per pass.
  int n = 0;
  for (int64_t base = j_begin; base < j_end; base += kThreads * 8) {
    const int64_t j0 = base + threadIdx.x * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (j0 < j_end) v = *reinterpret_cast<const uint4*>(g + j0);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    int mine = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) mine += ((w[i] & 0xffffu) != 0) + ((w[i] >> 16) != 0);
    int offset = 0, total = 0;
    Scan(scan).ExclusiveSum(mine, offset, total);
    offset += n;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t bits = i % 2 ? w[i / 2] >> 16 : w[i / 2] & 0xffffu;
      if (bits != 0) {
        col[offset] = static_cast<int32_t>(j0 + i - j_begin);
        hv[offset++] = bf16_bits_to_float(static_cast<uint16_t>(bits));  // g for now
      }
    }
    n += total;
    __syncthreads();  // the scan storage is reused; the list is complete
  }

  // The Wd rows of the first kPre entries: they do not depend on h, so their loads overlap phase 2's.
  constexpr int kPre = 8 / kDown;
  uint4 pre[kPre][kDown];
#pragma unroll
  for (int i = 0; i < kPre; ++i)
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      pre[i][c] = i < n && c0 < a.H ? __ldg(reinterpret_cast<const uint4*>(a.wd + (j_begin + col[i]) * a.H + c0))
                                    : make_uint4(0, 0, 0, 0);
    }

  // 2. u and h, a warp per entry; the token's x stays in registers.
  if (a.gated && n > 0) {
    for (int k = warp; k < n; k += kThreads / 32) {
      const uint4* wr = reinterpret_cast<const uint4*>(a.wu + (j_begin + col[k]) * a.H);
      uint4 w[kUp];
#pragma unroll
      for (int c = 0; c < kUp; ++c) w[c] = c * 256 + lane * 8 < a.H ? __ldg(wr + c * 32 + lane) : make_uint4(0, 0, 0, 0);
      float dot = 0.f;
#pragma unroll
      for (int c = 0; c < kUp; ++c) {
        float xf[8];
        unpack8(x[c], xf);
        dot = dot8(dot, xf, w[c]);
      }
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (lane == 0) {
        const float h = hv[k] * round_bf16(dot);  // u rounded as the bf16 up GEMM rounds it
        hv[k] = a.h_fp32 ? h : round_bf16(h);
      }
    }
    __syncthreads();
  }

  // 3. The range's part of y: columns (c·256 + tid)·8 .. +8.
  float acc[kDown][8] = {};
#pragma unroll
  for (int i = 0; i < kPre; ++i)
    if (i < n) {
#pragma unroll
      for (int c = 0; c < kDown; ++c) fma8(acc[c], hv[i], pre[i][c]);  // zero rows past H: no effect
    }
  int k = kPre;
  for (; k + 8 <= n; k += 8) {  // eight rows' loads in flight
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      if (c0 >= a.H) continue;
      uint4 w[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        w[i] = __ldg(reinterpret_cast<const uint4*>(a.wd + (j_begin + col[k + i]) * a.H + c0));
#pragma unroll
      for (int i = 0; i < 8; ++i) fma8(acc[c], hv[k + i], w[i]);
    }
  }
  for (; k < n; ++k) {
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      if (c0 < a.H) fma8(acc[c], hv[k], __ldg(reinterpret_cast<const uint4*>(a.wd + (j_begin + col[k]) * a.H + c0)));
    }
  }

  // 4. The range's partial sum (one range: y itself); gather_reduce_kernel adds them.
  if (splits == 1) {
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      if (c0 < a.H) *reinterpret_cast<uint4*>(a.y + t * a.H + c0) = pack8(acc[c]);
    }
    return;
  }
  float* part = a.partial + (t * splits + s) * a.H;
#pragma unroll
  for (int c = 0; c < kDown; ++c) {
    const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
    if (c0 >= a.H) continue;
    reinterpret_cast<float4*>(part + c0)[0] = make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]);
    reinterpret_cast<float4*>(part + c0)[1] = make_float4(acc[c][4], acc[c][5], acc[c][6], acc[c][7]);
  }
}

// y[t, c] = Σ_s partial[t, s, c]: block (token, 64 columns); thread (group q, column c) adds
// ranges q, q + 4, ... with eight loads in flight, then the four groups are added in order.
constexpr int kReduceCols = 64, kReduceGroups = kThreads / kReduceCols;

__global__ void __launch_bounds__(kThreads) gather_reduce_kernel(const GatherArgs a, int splits) {
  __shared__ float sums[kReduceGroups][kReduceCols];
  const int64_t t = blockIdx.x;
  const int q = threadIdx.x / kReduceCols, c = threadIdx.x % kReduceCols;
  const int64_t col = static_cast<int64_t>(blockIdx.y) * kReduceCols + c;
  float sum = 0.f;
  if (col < a.H) {
    const float* parts = a.partial + t * splits * a.H + col;
    int s = q;
    for (; s + 7 * kReduceGroups < splits; s += 8 * kReduceGroups) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = __ldcg(parts + (s + i * kReduceGroups) * a.H);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += v[i];
    }
    for (; s < splits; s += kReduceGroups) sum += __ldcg(parts + s * a.H);
  }
  sums[q][c] = sum;
  __syncthreads();
  if (q == 0 && col < a.H) {
    float y = sums[0][c];
#pragma unroll
    for (int i = 1; i < kReduceGroups; ++i) y += sums[i][c];
    a.y[t * a.H + col] = float_to_bf16_bits(y);
  }
}

template <int kUp, int kDown>
void launch(const GatherArgs& a, int splits, int64_t R, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(R) * 8;
  allow_dynamic_smem(reinterpret_cast<const void*>(gather_ffn_kernel<kUp, kDown>), 96 * 1024);
  gather_ffn_kernel<kUp, kDown>
      <<<dim3(static_cast<unsigned>(a.M), static_cast<unsigned>(splits)), kThreads, smem, stream>>>(a, splits, R);
  TWELL_CUDA_CHECK(cudaGetLastError());
  if (splits == 1) return;
  const dim3 grid(static_cast<unsigned>(a.M), static_cast<unsigned>((a.H + kReduceCols - 1) / kReduceCols));
  gather_reduce_kernel<<<grid, kThreads, 0, stream>>>(a, splits);
}

// ---- One token, gate GEMV included (launch_decode_ffn) --------------------------------------------
// A decode step waits on memory round trips, so everything that does not depend on the token is
// in flight before the token is known: a block's R rows of the gate matrix (R·H·2 bytes, ~88 KB
// at the paper's shape, two blocks an SM) are bulk-copied into shared memory at the block's start,
// each on its own mbarrier, while the kernel before it (the RMSNorm that produces x) is still
// running where the caller says the weights are fixed (early_weight_reads: the model's decode;
// otherwise after the wait); the last warp issues them, so the others load x meanwhile. Then a warp per row, as
// soon as that row has landed:
//   1. g = bf16(relu(x · W_j)) from shared memory, x in registers;
//   2. an active row starts the bulk copy of its Wd row into its own (consumed) slot and computes
//      h from x · Wu_j (one 2H-byte row from global memory), so the last rows' round trips
//      overlap the gate stream instead of following it;
//   3. the active rows in ascending order (a ballot over the rows);
//   4. Σ h·Wd_j over the active rows in order, fp32, from shared memory into parts[b], flags[b] = 1.
// The partial sums are added by the consumer (launch_add_rmsnorm's split form, or
// launch_split_sum), which is launched the same way.
constexpr int kDecodeWarps = kThreads / 32;
constexpr int kDecodeMaxRows = 256;               // rows a block owns, at most
constexpr int kDecodeRowBytes = 100 * 1024;       // shared memory for them: two blocks an SM
constexpr int kDecodeRowExtra = 20;               // bytes a row besides its weights: barrier, h, list, act

__device__ __forceinline__ float relu_nan(float v) { return (v > 0.f || v != v) ? v : 0.f; }

template <int kChunks>  // H <= kChunks·256: lane l holds x's columns c·256 + 8l .. + 8 (H > 2048: one block an SM)
__global__ void __launch_bounds__(kThreads, kChunks <= 8 ? 2 : 1) decode_ffn_kernel(const DecodeFfnArgs a, int R) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ int n_active;
  const int64_t H = a.H;
  uint16_t* rows = reinterpret_cast<uint16_t*>(smem_raw);  // [R][H]: the gate row, then Wd's row
  uint64_t* bar = reinterpret_cast<uint64_t*>(rows + R * H);  // [R]: phase 0 the gate row, 1 Wd's
  float* hv = reinterpret_cast<float*>(bar + R);           // [R]: h of the active rows
  int32_t* list = reinterpret_cast<int32_t*>(hv + R);      // [R]: active rows, ascending
  uint32_t* act = reinterpret_cast<uint32_t*>(list + R);   // [R]: row r active

  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * R;
  const int n_rows = static_cast<int>(min(static_cast<int64_t>(R), a.I - j0));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t row_bytes = static_cast<uint32_t>(H * 2);
  const uint64_t stream_once = l2_evict_first_policy();  // weights are read once a step
  for (int r = threadIdx.x; r < n_rows; r += kThreads) init_barrier(&bar[r]);
  __syncthreads();  // the barriers are initialised
  // The previous kernel's writes are visible only after the wait: the weights are copied before it
  // only where the caller vouches that the kernel before does not write them.
  if (!a.early_weight_reads) wait_for_previous_grid();
  // One thread of the last warp issues the copies: issuing stalls while the TMA unit is busy
  // (~5 µs for 44 rows an SM, measured), and the other warps must not wait for it to load x.
  if (threadIdx.x == kThreads - 32)
    for (int r = 0; r < n_rows; ++r) bulk_load(rows + r * H, a.w_act + (j0 + r) * H, row_bytes, &bar[r], stream_once);

  wait_for_previous_grid();  // x is the previous kernel's output (and parts/flags may still be read)
  uint4 xq[kChunks];
  load_row_chunks(a.x, H, lane, xq);

  for (int r = warp; r < n_rows; r += kDecodeWarps) {
    // 1. The gate.
    wait_parity(&bar[r], 0);
    const float dot = warp_row_dot(xq, rows + r * H, H, lane);
    const float pre = relu_nan(dot);
    const uint16_t bits = float_to_bf16_bits(pre);
    const bool active = bits != 0;  // the same in every lane
    // Gated: g, multiplied by u below. Non-gated: h itself (fp32 with h_fp32, as the CPU).
    float h = a.gated || !a.h_fp32 ? bf16_bits_to_float(bits) : pre;
    if (active) {
      // 2. Wd's row into the slot the gate row leaves, and h.
      __syncwarp();  // every lane has read the gate row
      if (lane == 0) {
        fence_proxy_async();
        bulk_load(rows + r * H, a.wd + (j0 + r) * H, row_bytes, &bar[r], stream_once);
      }
      if (a.gated) {
        const uint4* wr = reinterpret_cast<const uint4*>(a.wu + (j0 + r) * H);
        constexpr int kGroup = kChunks < 8 ? kChunks : 8;  // a row's loads in flight (H > 2048: two rounds, no spills)
        float u = 0.f;
#pragma unroll
        for (int c0 = 0; c0 < kChunks; c0 += kGroup) {
          uint4 wu[kGroup];
#pragma unroll
          for (int c = 0; c < kGroup; ++c)
            wu[c] = (c0 + c) * 256 + lane * 8 < H ? __ldg(wr + (c0 + c) * 32 + lane) : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int c = 0; c < kGroup; ++c) {
            float xf[8];
            unpack8(xq[c0 + c], xf);
            u = dot8(u, xf, wu[c]);
          }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) u += __shfl_xor_sync(0xffffffffu, u, o);
        h *= round_bf16(u);  // u rounded as the bf16 up GEMM rounds it
        if (!a.h_fp32) h = round_bf16(h);
      }
    }
    if (lane == 0) {
      act[r] = active;
      hv[r] = h;
    }
  }
  allow_dependent_launch();  // the consumer may be scheduled; it waits for this grid's end
  __syncthreads();

  // 3. The active rows in order.
  if (warp == 0) {
    int n = 0;
    for (int base = 0; base < n_rows; base += 32) {
      const bool on = base + lane < n_rows && act[base + lane];
      const uint32_t mask = __ballot_sync(0xffffffffu, on);
      if (on) list[n + __popc(mask & ((1u << lane) - 1))] = base + lane;
      n += __popc(mask);
    }
    if (lane == 0) n_active = n;
  }
  __syncthreads();
  const int n = n_active;
  if (n == 0) {
    if (threadIdx.x == 0) a.flags[blockIdx.x] = 0;
    return;
  }

  // 4. The block's part of y, rows in order (h = 0 adds nothing, as on the CPU). Every Wd copy
  // is waited for, so none is in flight when the block ends.
  constexpr int kDown = (kChunks + 7) / 8;  // groups of 8 columns a thread
  float acc[kDown][8] = {};
  for (int k = 0; k < n; ++k) {
    const int r = list[k];
    wait_parity(&bar[r], 1);
    const float h = hv[r];
    if (h == 0.f) continue;
#pragma unroll
    for (int c = 0; c < kDown; ++c) {
      const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
      if (c0 < H) fma8(acc[c], h, *reinterpret_cast<const uint4*>(rows + r * H + c0));
    }
  }
  float* part = a.parts + static_cast<int64_t>(blockIdx.x) * H;
#pragma unroll
  for (int c = 0; c < kDown; ++c) {
    const int64_t c0 = (c * kThreads + threadIdx.x) * 8;
    if (c0 >= H) continue;
    reinterpret_cast<float4*>(part + c0)[0] = make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]);
    reinterpret_cast<float4*>(part + c0)[1] = make_float4(acc[c][4], acc[c][5], acc[c][6], acc[c][7]);
  }
  if (threadIdx.x == 0) a.flags[blockIdx.x] = 1;
}

// Rows a block may own: its shared memory and kDecodeMaxRows.
int64_t decode_row_cap(int64_t H) {
  return std::min<int64_t>(std::max<int64_t>(1, kDecodeRowBytes / (2 * H)), kDecodeMaxRows);
}

// At most decode_row_cap, and few enough for two blocks on every SM.
int decode_rows_per_block(int64_t H, int64_t I, int sm_count) {
  const int64_t spread = (I + 2 * sm_count - 1) / (2 * static_cast<int64_t>(sm_count));
  return static_cast<int>(std::max<int64_t>(1, std::min(spread, decode_row_cap(H))));
}

// y = bf16(the split sum), H / kSplitBlocks columns a block (launch_split_sum).
__global__ void __launch_bounds__(kSplitThreads) split_sum_kernel(const SplitSum s, int64_t H, uint16_t* y) {
  wait_for_previous_grid();
  const float4 v = split_slice_sum(s, H);
  const int64_t c0 = blockIdx.x * (H / kSplitBlocks) + 4 * threadIdx.x;
  if (threadIdx.x < H / (4 * kSplitBlocks))
    *reinterpret_cast<uint2*>(y + c0) = make_uint2(pack2(v.x, v.y), pack2(v.z, v.w));
}

}  // namespace

// Ranges per token: 128 blocks in all up to 128 tokens (a decode step has the GPU to itself, and a
// token with hundreds of active neurons must not serialise in a few blocks), one from 128 on.
int gather_splits(int64_t M) { return static_cast<int>(std::clamp<int64_t>(128 / std::max<int64_t>(M, 1), 1, 128)); }

bool gather_supports(int64_t H, int64_t I) {  // x in registers; one range of neurons in shared memory
  return H % 8 == 0 && H <= 4096 && I % 8 == 0 && I <= 12288;
}

void launch_ffn_gather(const GatherArgs& a, cudaStream_t stream) {
  TWELL_CHECK(gather_supports(a.H, a.I), "FFN gather path: H = ", a.H, " and I = ", a.I,
              " must be multiples of 8 with H <= 4096 and I <= 12288");
  if (a.M == 0) return;
  const int splits = gather_splits(a.M);
  const int64_t R = range_of(a.I, splits);
  const bool two = a.H > 2048;
  switch ((a.H + 255) / 256) {
    case 1: launch<1, 1>(a, splits, R, stream); break;
    case 2: launch<2, 1>(a, splits, R, stream); break;
    case 3: case 4: launch<4, 1>(a, splits, R, stream); break;
    case 5: case 6: case 7: case 8: launch<8, 1>(a, splits, R, stream); break;
    default: two ? launch<16, 2>(a, splits, R, stream) : launch<8, 1>(a, splits, R, stream);
  }
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda

namespace twell::cuda {

bool decode_ffn_supported(int64_t H, int64_t I) {
  if (!split_sum_width_ok(H) || H > 4096 || I % 8 != 0 || I < 8) return false;
  const int64_t most_rows = decode_row_cap(H);  // fewest blocks; the spread over the SMs gives ~2 an SM
  return (I + most_rows - 1) / most_rows <= kMaxSplitParts;
}

int decode_ffn_blocks(int64_t H, int64_t I, int sm_count) {
  const int64_t R = decode_rows_per_block(H, I, sm_count);
  return static_cast<int>((I + R - 1) / R);
}

namespace {
template <int kChunks>
void launch_decode(const DecodeFfnArgs& a, int sm_count, cudaStream_t stream) {
  const int R = decode_rows_per_block(a.H, a.I, sm_count);
  const size_t smem = static_cast<size_t>(R) * (a.H * 2 + kDecodeRowExtra);
  allow_dynamic_smem(reinterpret_cast<const void*>(decode_ffn_kernel<kChunks>),
                     kDecodeRowBytes + kDecodeRowExtra * kDecodeMaxRows);
  launch_dependent(decode_ffn_kernel<kChunks>, dim3(static_cast<unsigned>(decode_ffn_blocks(a.H, a.I, sm_count))),
                   dim3(kThreads), smem, stream, a, R);
}
}  // namespace

void launch_decode_ffn(const DecodeFfnArgs& a, int sm_count, cudaStream_t stream) {
  TWELL_CHECK(decode_ffn_supported(a.H, a.I), "decode FFN: H = ", a.H, " must be a multiple of 32, at most 4096, and I = ",
              a.I, " a multiple of 8 (and I/H small enough for ", kMaxSplitParts, " blocks)");
  switch ((a.H + 255) / 256) {
    case 1: launch_decode<1>(a, sm_count, stream); break;
    case 2: launch_decode<2>(a, sm_count, stream); break;
    case 3: case 4: launch_decode<4>(a, sm_count, stream); break;
    case 5: case 6: case 7: case 8: launch_decode<8>(a, sm_count, stream); break;
    default: launch_decode<16>(a, sm_count, stream);
  }
}

DecodeFfn::DecodeFfn(int64_t H, int64_t I, int sm_count, DeviceArena* arena)
    : H_(H), I_(I), sm_count_(sm_count), blocks_(decode_ffn_blocks(H, I, sm_count)) {
  const size_t parts = static_cast<size_t>(blocks_) * static_cast<size_t>(H) * 4, flags = static_cast<size_t>(blocks_) * 4;
  DeviceArena own;  // without the caller's arena, an allocation each
  DeviceArena& from = arena ? *arena : own;
  parts_ = from.take(parts, "decode FFN partial sums");
  flags_ = from.take(flags, "decode FFN flags");
}

size_t DecodeFfn::bytes_for(int64_t H, int64_t I, int sm_count) {
  const auto blocks = static_cast<size_t>(decode_ffn_blocks(H, I, sm_count));
  return DeviceArena::piece(blocks * static_cast<size_t>(H) * 4) + DeviceArena::piece(blocks * 4);
}

SplitSum DecodeFfn::run(const uint16_t* x, const FfnWeights& w, bool h_fp32, bool early_weight_reads,
                        cudaStream_t stream) {
  DecodeFfnArgs a;
  a.x = x;
  a.gated = w.gated();
  a.w_act = static_cast<const uint16_t*>(a.gated ? w.wg.data : w.wu.data);
  a.wu = static_cast<const uint16_t*>(w.wu.data);
  a.wd = static_cast<const uint16_t*>(w.wd.data);
  a.parts = parts_.as<float>();
  a.flags = flags_.as<uint32_t>();
  a.H = H_, a.I = I_;
  a.h_fp32 = h_fp32;
  a.early_weight_reads = early_weight_reads;
  launch_decode_ffn(a, sm_count_, stream);
  return output();
}

void launch_split_sum(const SplitSum& s, int64_t H, uint16_t* y, cudaStream_t stream) {
  TWELL_CHECK(s.count >= 0 && s.count <= kMaxSplitParts && split_sum_width_ok(H), "split sum: ", s.count,
              " parts (at most ", kMaxSplitParts, "), H = ", H, " must be a multiple of ", 4 * kSplitBlocks,
              ", at most ", 4 * kSplitBlocks * kSplitThreads);
  launch_dependent(split_sum_kernel, dim3(kSplitBlocks), dim3(kSplitThreads), 0, stream, s, H, y);
}

}  // namespace twell::cuda
