// y [M, N] = x [M, K] · Wᵀ (W [N, K] row-major) for a few tokens (M ≤ 32): bf16 in and out (or f32
// out), fp32 accumulation, an optional ReLU. The model's QKV and output projections and the dense
// FFN's gate and up products in a decode step of a few sequences or a short prefill (a
// conversation's next turn), and its LM head (f32 logits).
// Such calls only stream W: cuBLASLt's kernels read it at 1.4–2.1 TB/s of the H100's 3.35
// (docs/perf.md, forty-ninth session). Here every weight byte goes from global memory straight into
// mma.sync's A fragments, no shared memory, each warp a 16-row slice of W over its share of K's
// 64-wide chunks, several chunks in flight; a block's warps take interleaved chunks of the same 16
// rows and add their partial sums through shared memory in warp order (deterministic).
//
// The k order inside a chunk is permuted, identically for W and x, so that a thread's operands are
// two 16-byte loads: lane (g, t) holds elements 8t .. 8t + 7 and 32 + 8t .. 32 + 8t + 7 of the chunk,
// eight pairs, and k-step s (of four) takes pairs 2s and 2s + 1 as the pairs {2t, 2t+1} and
// {2t+8, 2t+9} of the m16n8k16 fragment. A dot product does not care which pair is which, only that
// W's and x's agree.
#include <algorithm>
#include <array>

#include "cuda/kernels.h"
#include "cuda/kernels/bf16_vec.cuh"
#include "cuda/kernels/bulk_copy.cuh"
#include "cuda/kernels/mma_sync.cuh"

namespace twell::cuda {
namespace {

constexpr int kChunk = 64;     // k elements a warp takes at a time
constexpr int kMaxWarps = 8;   // a block's warps, over K
// Chunks a warp has in flight (D below): 2, or where there are registers to spare (below) as many as they
// hold, 24 a chunk at one 8-token tile, 32 at two, 48 at four (x's fragments are the larger part), so 4, 3,
// then 2. With early weight reads the first D chunks' weights load under the previous kernel: at 4 the
// output projection's warps (4 chunks each at 8 warps a block) have all of theirs in flight before the wait.
template <int NT>
constexpr int kDeep = NT == 1 ? 4 : NT == 2 ? 3 : 2;

__device__ __forceinline__ uint32_t word(const uint4 (&v)[2], int q) {
  const uint4& h = v[q / 4];
  const int i = q % 4;
  return i == 0 ? h.x : i == 1 ? h.y : i == 2 ? h.z : h.w;
}

// One chunk's operands of a lane: W's rows g and g + 8 of each of the warp's MT 16-row tiles, x's
// tokens g of each 8-token tile (NT tiles).
template <int MT, int NT>
struct Operands {
  uint4 w[MT][2][2];
  uint4 x[NT][2];
};

template <int MT, int NT>
__device__ __forceinline__ void load_w(Operands<MT, NT>& o, const uint16_t* const (&wr)[MT][2], int64_t k) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      o.w[m][h][0] = __ldcs(reinterpret_cast<const uint4*>(wr[m][h] + k));  // weights: read once, streaming
      o.w[m][h][1] = __ldcs(reinterpret_cast<const uint4*>(wr[m][h] + k + 32));
    }
}
template <int MT, int NT>
__device__ __forceinline__ void load_x(Operands<MT, NT>& o, const uint16_t* const (&xr)[NT], int64_t k) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    o.x[n][0] = *reinterpret_cast<const uint4*>(xr[n] + k);
    o.x[n][1] = *reinterpret_cast<const uint4*>(xr[n] + k + 32);
  }
}
template <int MT, int NT>
__device__ __forceinline__ void multiply(const Operands<MT, NT>& o, float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const uint32_t a[4] = {word(o.w[m][0], 2 * s), word(o.w[m][1], 2 * s), word(o.w[m][0], 2 * s + 1),
                             word(o.w[m][1], 2 * s + 1)};
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_bf16(acc[m][n], a, word(o.x[n], 2 * s), word(o.x[n], 2 * s + 1));
    }
}

// Block b: rows 16·MT·b .. + 16·MT − 1 of W (outputs n), blockDim.x / 32 warps over K's chunks, D chunks
// in flight a warp. Each x fragment a lane loads feeds MT tiles of W: MT = 2 halves x's reads (from L2) a
// weight byte.
template <int MT, int NT, int D>
__global__ void __launch_bounds__(kMaxWarps * 32) few_token_gemm_kernel(const FewTokenGemmArgs a) {
  constexpr int R = 16 * MT;
  __shared__ float partial[kMaxWarps][R][8 * NT + 1];  // (+1: the rows' stores and reads in distinct banks)
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * R;
  // Rows past N and tokens past M read the last one (in bounds) and are not stored.
  const uint16_t* wr[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) wr[m][h] = a.w + min(n0 + 16 * m + 8 * h + g, a.N - 1) * a.K + 8 * t;
  const uint16_t* xr[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) xr[n] = a.x + min(static_cast<int64_t>(8 * n + g), a.M - 1) * a.K + 8 * t;
  const int chunks = static_cast<int>(a.K / kChunk);
  const int mine = chunks > warp ? (chunks - warp + warps - 1) / warps : 0;  // chunks warp, warp + warps, ...
  auto k_of = [&](int i) { return static_cast<int64_t>(warp + i * warps) * kChunk; };

  Operands<MT, NT> op[D];
  if (a.early_weight_reads) {  // W is fixed: its first chunks load while the previous kernel runs
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (d < mine) load_w(op[d], wr, k_of(d));
  }
  allow_dependent_launch();
  wait_for_previous_grid();  // x is the previous kernel's output (and W may be, without early reads)
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < mine) {
      if (!a.early_weight_reads) load_w(op[d], wr, k_of(d));
      load_x(op[d], xr, k_of(d));
    }

  float acc[MT][NT][4] = {};
  for (int i = 0; i < mine; i += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      if (i + d < mine) {
        multiply(op[d], acc);
        if (i + d + D < mine) {
          load_w(op[d], wr, k_of(i + d + D));
          load_x(op[d], xr, k_of(i + d + D));
        }
      }
    }
  }

  // acc[m][n]: rows 16m + g (0, 1) and 16m + g + 8 (2, 3), tokens 8n + 2t, + 1.
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      partial[warp][16 * m + g][8 * n + 2 * t] = acc[m][n][0];
      partial[warp][16 * m + g][8 * n + 2 * t + 1] = acc[m][n][1];
      partial[warp][16 * m + g + 8][8 * n + 2 * t] = acc[m][n][2];
      partial[warp][16 * m + g + 8][8 * n + 2 * t + 1] = acc[m][n][3];
    }
  __syncthreads();
  for (int e = threadIdx.x; e < R * 8 * NT; e += blockDim.x) {
    const int r = e % R, m = e / R;
    if (m >= a.M || n0 + r >= a.N) continue;
    float sum = 0.f;
    for (int w = 0; w < warps; ++w) sum += partial[w][r][m];
    // The ReLU keeps NaN (a NaN in x or W must not vanish), as the decode GEMV's.
    const float v = a.relu && !(sum > 0.f || sum != sum) ? 0.f : sum;
    if (a.y_f32 != nullptr) a.y_f32[m * a.N + n0 + r] = v;
    else a.y[m * a.N + n0 + r] = float_to_bf16_bits(v);
  }
}

// Blocks of w warps an SM holds at once, w = 0 .. kMaxWarps (the runtime's occupancy calculator:
// registers are allocated per SM sub-partition, a quarter of the file each, so 65536 / (32 · registers)
// overcounts. That count put the 16-row kernels at 9 to 24 tokens in two waves: 13.7 and 15.4 µs
// for the 2B model's QKV against 10.0 at 8 tokens, 11.2 and 11.8 in one; docs/perf.md, sixty-third session).
template <int MT, int NT, int D>
const std::array<int, kMaxWarps + 1>& blocks_per_sm() {
  static const std::array<int, kMaxWarps + 1> blocks = [] {
    std::array<int, kMaxWarps + 1> b{};
    for (int w = 1; w <= kMaxWarps; ++w)
      TWELL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b[w], few_token_gemm_kernel<MT, NT, D>, 32 * w, 0));
    return b;
  }();
  return blocks;
}

// The grid: a block per 16·MT rows of W.
template <int MT>
int64_t grid_blocks(int64_t N) {
  return (N + 16 * MT - 1) / (16 * MT);
}

template <int MT, int NT, int D>
void launch(const FewTokenGemmArgs& a, int sm_count, cudaStream_t stream) {
  const auto kernel = few_token_gemm_kernel<MT, NT, D>;
  const std::array<int, kMaxWarps + 1>& per_sm = blocks_per_sm<MT, NT, D>();
  const int64_t blocks = grid_blocks<MT>(a.N), chunks = a.K / kChunk;
  // Warps a block: the most (8 down to 2) that keep the whole grid resident at once (one wave), but
  // at least 2 chunks each (so 1 at K = 64 or 128). A grid no block size fits in one wave (the LM
  // head's 3072 blocks) takes 8: several waves of blocks either way, the fewest there.
  int64_t warps = static_cast<int64_t>(per_sm[2]) * sm_count >= blocks ? 2 : kMaxWarps;
  for (int w = kMaxWarps; w > 2; --w)
    if (static_cast<int64_t>(per_sm[w]) * sm_count >= blocks) {
      warps = w;
      break;
    }
  warps = std::max<int64_t>(1, std::min(warps, chunks / 2));
  launch_dependent(kernel, dim3(static_cast<unsigned>(blocks)), dim3(static_cast<unsigned>(32 * warps)), 0, stream, a);
}

// 16 rows a block unless asked for 32 (rows_per_block; x read once for two tiles of W). Measured on
// the H100 at N = 5632 and 6144, K = 2048 once the grid is one wave (sixty-third session): 16 rows
// are as fast or faster at every token count, 10.0 against 10.3 µs for the QKV at 8 tokens, 11.8
// against 12.2 at 21, 12.7 against 14.1 at 32.
//
// The deeper kernel (kDeep: 122 registers at up to 8 tokens, 117 at 9-16) only where the whole grid stays
// resident at 8 warps a block: the output projection's 128 blocks, one an SM. Measured on the H100 (micro,
// early weight reads; sixty-fifth session, `h100/s65/depth/`), it took that projection from 5.51 / 5.56 /
// 5.96 to 4.83 / 5.31 / 5.83 µs at 2 / 8 / 16 tokens, but cost the QKV and the gate (384 and 352 blocks,
// three an SM, so fewer warps) 0.3-0.8 µs.
template <int NT>
void launch_rows(const FewTokenGemmArgs& a, int sm_count, cudaStream_t stream) {
  if (a.rows_per_block == 32) return launch<2, NT, 2>(a, sm_count, stream);
  if constexpr (kDeep<NT> > 2) {
    if (int64_t{blocks_per_sm<1, NT, kDeep<NT>>()[kMaxWarps]} * sm_count >= grid_blocks<1>(a.N))
      return launch<1, NT, kDeep<NT>>(a, sm_count, stream);
  }
  launch<1, NT, 2>(a, sm_count, stream);
}

}  // namespace

bool few_token_gemm_supported(int64_t M, int64_t N, int64_t K) {
  return M >= 1 && M <= kFewTokenGemmMaxTokens && N >= 1 && K >= kChunk && K % kChunk == 0;
}

void launch_few_token_gemm(const FewTokenGemmArgs& a, int sm_count, cudaStream_t stream) {
  TWELL_CHECK(few_token_gemm_supported(a.M, a.N, a.K), "few-token GEMM: M = ", a.M, " must be 1 to ",
              kFewTokenGemmMaxTokens, " and K = ", a.K, " a positive multiple of ", kChunk, " (N = ", a.N, ")");
  TWELL_CHECK(reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0,
              "few-token GEMM: x and W must be 16-byte aligned");
  TWELL_CHECK(sm_count > 0, "few-token GEMM: sm_count must be positive, got ", sm_count);
  TWELL_CHECK((a.y == nullptr) != (a.y_f32 == nullptr), "few-token GEMM: exactly one of y and y_f32 must be set");
  TWELL_CHECK(a.rows_per_block == 0 || a.rows_per_block == 16 || a.rows_per_block == 32,
              "few-token GEMM: rows_per_block must be 0, 16 or 32, got ", a.rows_per_block);
  if (a.M <= 8) launch_rows<1>(a, sm_count, stream);
  else if (a.M <= 16) launch_rows<2>(a, sm_count, stream);
  else if (a.M <= 24) launch_rows<3>(a, sm_count, stream);
  else launch_rows<4>(a, sm_count, stream);
}

}  // namespace twell::cuda
