// y = x Wᵀ for one token (a decode step at batch 1), bf16 in and out, fp32 accumulation, an
// optional ReLU: the model's QKV and output projections, and the dense FFN's gate and up products
// (FfnOptions::one_token_gemv). cuBLASLt's kernels for M = 1 start reading the weights
// only once the kernel before them has finished, and its 8 MB output projection ran at 1.5 TB/s
// (5.6 µs). This kernel is launched with programmatic dependent launch: with early_weight_reads
// (the model's fixed weights) each block bulk-copies its R rows of W (TMA, one mbarrier a row) into
// shared memory while the previous kernel (attention, RMSNorm) still runs, and waits for that kernel
// only to read x; without it, it waits first. A warp then takes a row as soon
// as it has landed: the dot product in registers, a butterfly over the lanes, y[j] in bf16 (or f32:
// the LM head's logits).
#include <algorithm>

#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"
#include "cuda/kernels/bulk_copy.cuh"

namespace twell::cuda {
namespace {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvRowBytes = 100 * 1024;  // shared memory for a block's rows: two blocks an SM

template <int kChunks>  // K <= kChunks·256: lane l holds x's columns c·256 + 8l .. + 8
__global__ void __launch_bounds__(kGemvThreads) decode_gemv_kernel(const DecodeGemvArgs a, int R) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int64_t K = a.K;
  uint16_t* rows = reinterpret_cast<uint16_t*>(smem_raw);     // [R][K]
  uint64_t* bar = reinterpret_cast<uint64_t*>(rows + R * K);  // [R]
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * R;
  const int n_rows = static_cast<int>(min(static_cast<int64_t>(R), a.N - j0));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = threadIdx.x; r < n_rows; r += kGemvThreads) init_barrier(&bar[r]);
  __syncthreads();
  if (!a.early_weight_reads) wait_for_previous_grid();  // W may be the previous kernel's output
  // The last warp's first thread issues the copies (issuing stalls while the TMA unit is busy;
  // the other warps load x meanwhile).
  if (threadIdx.x == kGemvThreads - 32) {
    const uint64_t stream_once = l2_evict_first_policy();  // weights are read once a step
    for (int r = 0; r < n_rows; ++r)
      bulk_load(rows + r * K, a.w + (j0 + r) * K, static_cast<uint32_t>(K * 2), &bar[r], stream_once);
  }
  allow_dependent_launch();
  wait_for_previous_grid();  // x is the previous kernel's output
  uint4 xq[kChunks];
  load_row_chunks(a.x, K, lane, xq);
  for (int r = warp; r < n_rows; r += kGemvWarps) {
    wait_parity(&bar[r], 0);
    const float dot = warp_row_dot(xq, rows + r * K, K, lane);
    // The ReLU keeps NaN (a NaN in x or W must not vanish).
    const float v = a.relu && !(dot > 0.f || dot != dot) ? 0.f : dot;
    if (lane == 0) {
      if (a.y_f32 != nullptr) a.y_f32[j0 + r] = v;
      else a.y[j0 + r] = float_to_bf16_bits(v);
    }
  }
}

// Rows a block owns: about two blocks an SM, within kGemvRowBytes.
int gemv_rows_per_block(int64_t N, int64_t K, int sm_count) {
  const int64_t spread = (N + 2 * sm_count - 1) / (2 * static_cast<int64_t>(sm_count));
  const int64_t fit = (kGemvRowBytes) / (K * 2 + 8);
  return static_cast<int>(std::max<int64_t>(1, std::min(spread, fit)));
}

template <int kChunks>
void launch_gemv(const DecodeGemvArgs& a, int sm_count, cudaStream_t stream) {
  const int R = gemv_rows_per_block(a.N, a.K, sm_count);
  const int smem = static_cast<int>(R * (a.K * 2 + 8));
  allow_dynamic_smem(reinterpret_cast<const void*>(decode_gemv_kernel<kChunks>), smem);
  launch_dependent(decode_gemv_kernel<kChunks>, dim3(static_cast<unsigned>((a.N + R - 1) / R)), dim3(kGemvThreads),
                   static_cast<size_t>(smem), stream, a, R);
}

}  // namespace

bool decode_gemv_supported(int64_t N, int64_t K) { return N >= 1 && K >= 8 && K % 8 == 0 && K <= 4096; }

void launch_decode_gemv(const DecodeGemvArgs& a, int sm_count, cudaStream_t stream) {
  TWELL_CHECK(decode_gemv_supported(a.N, a.K), "decode GEMV: K = ", a.K, " must be a multiple of 8, at most 4096 (N = ",
              a.N, ")");
  TWELL_CHECK(reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0,
              "decode GEMV: x and W must be 16-byte aligned");
  TWELL_CHECK(sm_count > 0, "decode GEMV: sm_count must be positive, got ", sm_count);
  TWELL_CHECK((a.y == nullptr) != (a.y_f32 == nullptr), "decode GEMV: exactly one of y and y_f32 must be set");
  const int64_t chunks = (a.K + 255) / 256;
  if (chunks <= 1) launch_gemv<1>(a, sm_count, stream);
  else if (chunks <= 2) launch_gemv<2>(a, sm_count, stream);
  else if (chunks <= 4) launch_gemv<4>(a, sm_count, stream);
  else if (chunks <= 8) launch_gemv<8>(a, sm_count, stream);
  else launch_gemv<16>(a, sm_count, stream);
}

}  // namespace twell::cuda
