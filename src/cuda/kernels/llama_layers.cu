// The model runtime's small kernels (src/cuda/llama_cuda.cpp): embedding lookup, residual add
// fused with RMSNorm, RoPE fused with the KV-cache write, the SiLU gate product, the next tokens'
// negative log-likelihoods from logits rows, and a counter-based random fill for synthetic
// weights. The residual stream is fp32; everything a GEMM reads is bf16. Covered by
// tests/cuda/test_llama_cuda.cpp (whole model vs the CPU backend).
#include <algorithm>

#include <cooperative_groups.h>

#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"
#include "cuda/kernels/bulk_copy.cuh"
#include "cuda/kernels/rms_norm.cuh"
#include "cuda/kernels/split_sum.cuh"

namespace twell::cuda {
namespace {

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  __syncthreads();  // scratch is reused by the next call
  return total;
}

// nll[r] = −log softmax(logits[r])[targets[r]] in double, as model::nll_from_logits computes it on
// the host: the row's maximum m, then m + log Σ exp(x − m) − x[target]; the sum in double, in a
// fixed order (deterministic). One block of kNllThreads a row.
constexpr int kNllThreads = 256;
__global__ void __launch_bounds__(kNllThreads) row_nll_kernel(const float* __restrict__ logits, int64_t V,
                                                              const int32_t* __restrict__ targets,
                                                              double* __restrict__ nll) {
  __shared__ float top_of[kNllThreads / 32];
  __shared__ double sum_of[kNllThreads / 32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float top = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += kNllThreads) top = fmaxf(top, row[i]);
  for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
  if (lane == 0) top_of[warp] = top;
  __syncthreads();
  for (int w = 0; w < kNllThreads / 32; ++w) top = fmaxf(top, top_of[w]);
  double sum = 0;
  for (int64_t i = threadIdx.x; i < V; i += kNllThreads) sum += exp(static_cast<double>(row[i]) - top);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) sum_of[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kNllThreads / 32; ++w) total += sum_of[w];
    nll[blockIdx.x] = static_cast<double>(top) + log(total) - static_cast<double>(row[targets[blockIdx.x]]);
  }
}

// Per row of h [rows, cols] bf16: the entries that are not zero (−0 is zero, NaN is not: `h != 0`,
// as cpu::ffn_forward counts) and Σ |h| in double, in a fixed order (deterministic). One block of
// kStatsThreads a row.
constexpr int kStatsThreads = 256;
__global__ void __launch_bounds__(kStatsThreads) row_activation_stats_kernel(const uint16_t* __restrict__ h,
                                                                             int64_t cols, int32_t* __restrict__ nnz,
                                                                             double* __restrict__ l1) {
  __shared__ int count_of[kStatsThreads / 32];
  __shared__ double sum_of[kStatsThreads / 32];
  const uint16_t* row = h + static_cast<int64_t>(blockIdx.x) * cols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int count = 0;
  double sum = 0;
  for (int64_t i = threadIdx.x; i < cols; i += kStatsThreads) {
    const uint16_t bits = row[i];
    if ((bits & 0x7fffu) != 0) {
      ++count;
      sum += fabs(static_cast<double>(bf16_bits_to_float(bits)));
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    count += __shfl_xor_sync(0xffffffffu, count, o);
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  if (lane == 0) count_of[warp] = count, sum_of[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    double l1_total = 0;
    for (int w = 0; w < kStatsThreads / 32; ++w) total += count_of[w], l1_total += sum_of[w];
    nnz[blockIdx.x] = total;
    l1[blockIdx.x] = l1_total;
  }
}

__global__ void embed_kernel(const int32_t* __restrict__ tokens, const uint16_t* __restrict__ table,
                             float* __restrict__ x, int64_t H) {
  const int64_t t = blockIdx.x;
  const uint16_t* row = table + static_cast<int64_t>(tokens[t]) * H;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) x[t * H + i] = bf16_bits_to_float(row[i]);
}

__global__ void gather_rows_kernel(const uint16_t* __restrict__ src, const int32_t* __restrict__ rows,
                                   uint16_t* __restrict__ dst, int64_t H) {
  const int64_t r = blockIdx.x;
  const uint4* from = reinterpret_cast<const uint4*>(src + static_cast<int64_t>(rows[r]) * H);
  uint4* to = reinterpret_cast<uint4*>(dst + r * H);
  for (int64_t i = threadIdx.x; i < H / 8; i += blockDim.x) to[i] = from[i];
}

// One block per output row r, reading residual row r·step + offset. A thread holds kChunks
// groups of 8 consecutive elements (16- and 32-byte accesses) in registers from the load to the
// store, and loads its norm weights before the block's reduction: one dependent round trip less
// than re-reading the row after it (a decode step runs this twice a layer on one row, where the
// round trips are the whole cost).
// It lets a dependent-launched successor (the decode FFN, the one-token GEMVs) start early, and can
// itself be launched as one (launch_add_rmsnorm's `dependent`: only after a kernel that does not
// write the norm weights, which it loads before waiting).
template <int kChunks>
__global__ void __launch_bounds__(256) add_rmsnorm_kernel(float* __restrict__ x, const uint16_t* __restrict__ before,
                                                          const uint16_t* __restrict__ delta, bool store_x,
                                                          const uint16_t* __restrict__ w, uint16_t* __restrict__ out,
                                                          int64_t H, int64_t step, int64_t offset, float eps) {
  __shared__ float scratch[32];
  allow_dependent_launch();
  const int64_t src = blockIdx.x * step + offset;
  float* xr = x + src * H;
  float v[kChunks][8];
  uint4 wq[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {  // the weights first: the kernel before does not write them
    const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * 8;
    if (i < H) wq[c] = *reinterpret_cast<const uint4*>(w + i);
  }
  wait_for_previous_grid();  // launched as a dependent (launch_add_rmsnorm's `dependent`): x, delta
  float sum_sq = 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * 8;
    if (i >= H) continue;
    float4* xv = reinterpret_cast<float4*>(xr + i);
    const float4 lo = xv[0], hi = xv[1];
    const float f[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    float d[8] = {};
    if (delta) unpack8(*reinterpret_cast<const uint4*>(delta + src * H + i), d);
    if (before) {  // the deferred add first (adding zeros instead could turn a -0 into +0)
      float b[8];
      unpack8(*reinterpret_cast<const uint4*>(before + src * H + i), b);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[c][e] = (f[e] + b[e]) + d[e];
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[c][e] = f[e] + d[e];
    }
    if (store_x && (delta || before)) {
      xv[0] = make_float4(v[c][0], v[c][1], v[c][2], v[c][3]);
      xv[1] = make_float4(v[c][4], v[c][5], v[c][6], v[c][7]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) sum_sq += v[c][e] * v[c][e];
  }
  const float inv = rms_inv(block_sum(sum_sq, scratch), H, eps);
  uint16_t* o = out + static_cast<int64_t>(blockIdx.x) * H;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * 8;
    if (i >= H) continue;
    float wf[8], r[8];
    unpack8(wq[c], wf);
#pragma unroll
    for (int e = 0; e < 8; ++e) r[e] = rms_scaled(wf[e], v[c][e], inv);
    *reinterpret_cast<uint4*>(o + i) = pack8(r);
  }
}

// The residual add + RMSNorm of one row whose delta is a SplitSum (the decode FFN's partial sums,
// added and rounded to bf16 as the unsplit path stores y): a cluster of kSplitBlocks blocks, each
// summing its slice of the columns (split_sum.cuh); the blocks' sums of squares are exchanged
// through distributed shared memory and added in rank order, so every block scales by the same
// factor. Launched with programmatic dependent launch: the norm weights are loaded before it
// waits for the FFN kernel.
__global__ void __cluster_dims__(kSplitBlocks, 1, 1) __launch_bounds__(kSplitThreads)
    add_rmsnorm_split_kernel(float* __restrict__ x, const SplitSum split, const uint16_t* __restrict__ w,
                             uint16_t* __restrict__ out, int64_t H, float eps) {
  __shared__ float scratch[32];
  __shared__ float block_sq[kSplitBlocks];  // by rank
  allow_dependent_launch();
  // Every block of the cluster has started before any writes into another's shared memory: this
  // barrier phase is waited for only then, long after all have arrived.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  const bool mine = threadIdx.x < H / (4 * kSplitBlocks);
  const int64_t c0 = blockIdx.x * (H / kSplitBlocks) + 4 * threadIdx.x;
  uint2 wq = make_uint2(0, 0);
  if (mine) wq = *reinterpret_cast<const uint2*>(w + c0);
  wait_for_previous_grid();
  float4 xv = make_float4(0.f, 0.f, 0.f, 0.f);
  if (mine) xv = *reinterpret_cast<const float4*>(x + c0);
  const float4 d = split_slice_sum(split, H);
  const float4 v = make_float4(xv.x + round_bf16(d.x), xv.y + round_bf16(d.y), xv.z + round_bf16(d.z),
                               xv.w + round_bf16(d.w));
  if (mine) *reinterpret_cast<float4*>(x + c0) = v;
  const float sq = block_sum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w, scratch);
  // Each block writes its sum of squares into every block's block_sq[rank]; after one cluster
  // barrier all are local (no block reads another's memory, so none has to wait before leaving).
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  if (threadIdx.x < kSplitBlocks) *cluster.map_shared_rank(&block_sq[cluster.block_rank()], threadIdx.x) = sq;
  cluster.sync();
  float total = 0.f;
  for (int r = 0; r < kSplitBlocks; ++r) total += block_sq[r];
  const float inv = rms_inv(total, H, eps);
  if (mine) {
    const float w0 = bf16_bits_to_float(static_cast<uint16_t>(wq.x & 0xffffu));
    const float w1 = bf16_bits_to_float(static_cast<uint16_t>(wq.x >> 16));
    const float w2 = bf16_bits_to_float(static_cast<uint16_t>(wq.y & 0xffffu));
    const float w3 = bf16_bits_to_float(static_cast<uint16_t>(wq.y >> 16));
    *reinterpret_cast<uint2*>(out + c0) = make_uint2(pack2(rms_scaled(w0, v.x, inv), rms_scaled(w1, v.y, inv)),
                                                     pack2(rms_scaled(w2, v.z, inv), rms_scaled(w3, v.w, inv)));
  }
}

// One block per token; a thread rotates 8 pairs (i, i + hd/2) of one head of q or k with 16-byte
// accesses (hd % 16 == 0), then the block copies v.
__global__ void rope_kv_kernel(const RopeKvArgs a) {
  const int64_t t = blockIdx.x, b = t / a.S, pos = a.p0[b] + t % a.S;
  const int half = a.hd / 2, chunks = half / 8, qkv_dim = (a.nh + 2 * a.nkv) * a.hd, kv_dim = a.nkv * a.hd;
  uint16_t* row = a.qkv + t * qkv_dim;
  const int64_t cache_row = (b * a.max_context + pos) * kv_dim;
  const float* cs = a.cos_sin + pos * a.hd;  // [cos · hd/2, sin · hd/2]
  const uint4* v = reinterpret_cast<const uint4*>(row + (a.nh + a.nkv) * a.hd);
  uint4* vc = reinterpret_cast<uint4*>(a.v_cache + cache_row);
  // Where the block holds all of v at once (decode's one token: kv_dim ≤ 8·blockDim), v is loaded
  // before the rotation's stores, which the compiler may not move it past (they could alias): one
  // round trip to memory instead of two.
  const bool v_first = kv_dim / 8 <= static_cast<int>(blockDim.x);
  uint4 v_held = make_uint4(0, 0, 0, 0);
  if (v_first && static_cast<int>(threadIdx.x) < kv_dim / 8) v_held = v[threadIdx.x];
  for (int j = threadIdx.x; j < (a.nh + a.nkv) * chunks; j += blockDim.x) {
    const int head = j / chunks, i = (j % chunks) * 8;
    uint16_t* src = row + head * a.hd + i;
    float x0[8], x1[8], r0[8], r1[8];
    unpack8(*reinterpret_cast<const uint4*>(src), x0);
    unpack8(*reinterpret_cast<const uint4*>(src + half), x1);
    const float4 c_lo = *reinterpret_cast<const float4*>(cs + i), c_hi = *reinterpret_cast<const float4*>(cs + i + 4);
    const float4 s_lo = *reinterpret_cast<const float4*>(cs + half + i);
    const float4 s_hi = *reinterpret_cast<const float4*>(cs + half + i + 4);
    const float c[8] = {c_lo.x, c_lo.y, c_lo.z, c_lo.w, c_hi.x, c_hi.y, c_hi.z, c_hi.w};
    const float s[8] = {s_lo.x, s_lo.y, s_lo.z, s_lo.w, s_hi.x, s_hi.y, s_hi.z, s_hi.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {  // not contracted into FMAs: as the CPU reference and qkv_rope.cu
      r0[e] = __fsub_rn(__fmul_rn(x0[e], c[e]), __fmul_rn(x1[e], s[e]));
      r1[e] = __fadd_rn(__fmul_rn(x1[e], c[e]), __fmul_rn(x0[e], s[e]));
    }
    uint16_t* dst = head < a.nh ? src : a.k_cache + cache_row + (head - a.nh) * a.hd + i;
    *reinterpret_cast<uint4*>(dst) = pack8(r0);
    *reinterpret_cast<uint4*>(dst + half) = pack8(r1);
  }
  if (v_first) {
    if (static_cast<int>(threadIdx.x) < kv_dim / 8) vc[threadIdx.x] = v_held;
    return;
  }
  for (int j = threadIdx.x; j < kv_dim / 8; j += blockDim.x) vc[j] = v[j];
}

// out may be g (in place): each element is read before it is written, by the same thread, so
// neither is __restrict__.
__global__ void silu_mul_kernel(const uint16_t* g, const uint16_t* __restrict__ u, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float gv = bf16_bits_to_float(g[i]);
    // silu rounded to bf16, then the product rounded: as a bf16 PyTorch `act_fn(g) * u`.
    const float s = round_bf16(gv / (1.f + __expf(-gv)));
    out[i] = float_to_bf16_bits(s * bf16_bits_to_float(u[i]));
  }
}

// SplitMix64 of (seed, index): the same values for any launch shape.
__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_uniform_kernel(uint16_t* __restrict__ out, int64_t n, int64_t cols, int64_t ld, float lo,
                                    float hi, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double r = static_cast<double>(mix(seed * 0x632be59bd9b4e019ull + static_cast<uint64_t>(i)) >> 11) *
                     (1.0 / 9007199254740992.0);
    out[(i / cols) * ld + i % cols] = float_to_bf16_bits(lo + static_cast<float>(r) * (hi - lo));
  }
}

unsigned grid_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 132 * 32)));
}

}  // namespace

void launch_row_nll(const float* logits, int64_t rows, int64_t V, const int32_t* targets, double* nll,
                    cudaStream_t stream) {
  TWELL_CHECK(rows >= 0 && rows <= 2147483647 && V >= 1, "row_nll: ", rows, " rows of ", V);
  if (rows == 0) return;
  row_nll_kernel<<<static_cast<unsigned>(rows), kNllThreads, 0, stream>>>(logits, V, targets, nll);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void launch_row_activation_stats(const uint16_t* h, int64_t rows, int64_t cols, int32_t* nnz, double* l1,
                                 cudaStream_t stream) {
  TWELL_CHECK(rows >= 0 && rows <= 2147483647 && cols >= 1 && cols <= 2147483647, "row_activation_stats: ", rows,
              " rows of ", cols);
  if (rows == 0) return;
  row_activation_stats_kernel<<<static_cast<unsigned>(rows), kStatsThreads, 0, stream>>>(h, cols, nnz, l1);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void launch_embed(const int32_t* tokens, int64_t T, const uint16_t* table, float* x, int64_t H,
                  cudaStream_t stream) {
  if (T == 0) return;
  embed_kernel<<<static_cast<unsigned>(T), 256, 0, stream>>>(tokens, table, x, H);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void launch_gather_rows(const uint16_t* src, const int32_t* rows, int64_t n, int64_t H, uint16_t* dst,
                        cudaStream_t stream) {
  TWELL_CHECK(H % 8 == 0, "gather_rows: H = ", H, " must be a multiple of 8");
  if (n == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(src, rows, dst, H);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void launch_add_rmsnorm(float* x, const uint16_t* before, const uint16_t* delta, bool store_x, const uint16_t* w,
                        uint16_t* out, int64_t rows, int64_t H, int64_t step, int64_t offset, float eps,
                        cudaStream_t stream, bool dependent) {
  TWELL_CHECK(H % 8 == 0 && H <= kMaxNormWidth, "add_rmsnorm: H = ", H, " must be a multiple of 8, at most ",
              kMaxNormWidth);
  if (rows == 0) return;
  auto kernel = H <= 256 * 8 ? add_rmsnorm_kernel<1> : H <= 2 * 256 * 8 ? add_rmsnorm_kernel<2>
                : H <= 4 * 256 * 8 ? add_rmsnorm_kernel<4> : add_rmsnorm_kernel<8>;
  const dim3 grid(static_cast<unsigned>(rows));
  if (dependent) {
    launch_dependent(kernel, grid, dim3(256), 0, stream, x, before, delta, store_x, w, out, H, step, offset, eps);
  } else {
    kernel<<<grid, 256, 0, stream>>>(x, before, delta, store_x, w, out, H, step, offset, eps);
    TWELL_CUDA_CHECK(cudaGetLastError());
  }
}

void launch_add_rmsnorm(float* x, const SplitSum& delta, const uint16_t* w, uint16_t* out, int64_t H, float eps,
                        cudaStream_t stream) {
  TWELL_CHECK(split_sum_width_ok(H), "add_rmsnorm of a split sum: H = ", H, " must be a multiple of ",
              4 * kSplitBlocks, ", at most ", 4 * kSplitBlocks * kSplitThreads);
  TWELL_CHECK(delta.count >= 0 && delta.count <= kMaxSplitParts, "add_rmsnorm: ", delta.count,
              " partial sums, at most ", kMaxSplitParts);
  launch_dependent(add_rmsnorm_split_kernel, dim3(kSplitBlocks), dim3(kSplitThreads), 0, stream, x, delta, w, out, H,
                   eps);
}

void launch_rope_kv(const RopeKvArgs& a, cudaStream_t stream) {
  TWELL_CHECK(a.hd % 16 == 0, "rope: head_dim ", a.hd, " is not a multiple of 16");
  if (a.T == 0) return;
  rope_kv_kernel<<<static_cast<unsigned>(a.T), 256, 0, stream>>>(a);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void launch_silu_mul(const uint16_t* g, const uint16_t* u, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  silu_mul_kernel<<<grid_for(n, 256), 256, 0, stream>>>(g, u, out, n);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

void fill_uniform_bf16(uint16_t* out, int64_t rows, int64_t cols, int64_t ld, float lo, float hi, uint64_t seed,
                       cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  fill_uniform_kernel<<<grid_for(n, 256), 256, 0, stream>>>(out, n, cols, ld, lo, hi, seed);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
