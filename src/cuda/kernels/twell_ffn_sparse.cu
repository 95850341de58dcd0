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
//   down with SparseFfnArgs::then: a warp holds its token's whole row of y at the end, so it adds
//     the row into the f32 residual and normalises it (the transformer block's next step) instead
//     of writing y; a heavy row's group adds its warps' sums of squares in warp order. In the 2B
//     model's prefill this saved the separate kernel (0.78 ms a layer) but made the pass 0.5 ms
//     slower: the residual's extra L2 traffic and a dependent load at each token's end (perf.md,
//     model item 24).
// Summation orders are fixed (u: the tensor core's, then two accumulators added; y: ascending j
// per column; a heavy row: its group's shares added in warp order): results are deterministic,
// whichever warp or block takes a token.
// Covered by tests/cuda/test_twell_ffn.cu; timed by `twell bench ffn`.
#include "cuda/kernels/twell_rows.cuh"

#include <cmath>

namespace twell::cuda {
namespace {

// up: u[m, j] = bf16(x[m] · Wu[j]) for every active (m, j), on the tensor cores (sddmm_loop).
__global__ __launch_bounds__(kSddmmMaxWarps * 32, 1) void twell_ffn_up_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) char smem[];
  start_pass(p);
  sddmm_loop<Aux::u_index>(p, p.wu, smem, threadIdx.x % 32,
                           [&](uint32_t u_index, float dot) { p.u_vals[u_index] = float_to_bf16_bits(dot); });
}

// down: y written, or added into the residual and normalised (SparseFfnArgs::then).
template <int kChunks, Aux kAux>
void launch_down(const Params& p, int sm_count, int64_t M, cudaStream_t stream, bool dependent) {
  if (p.then.resid)
    launch(twell_axpy_kernel<kChunks, kAux, Out::residual_norm>, p, sm_count, M, stream, dependent);
  else
    launch(twell_axpy_kernel<kChunks, kAux, Out::bf16>, p, sm_count, M, stream, dependent);
}

// The first pass makes the report and is a dependent of the kernel before where the caller says;
// the down pass of a gated FFN always is one of the up pass (both call start_pass).
template <int kChunks>
void launch_passes(const SparseFfnArgs& a, Params p, int sm_count, cudaStream_t stream) {
  p.report = a.report;
  p.next_row = a.row_counters + 1, p.next_heavy = a.row_counters + 3;
  if (!a.gated) return launch_down<kChunks, Aux::h_plain>(p, sm_count, a.M, stream, a.dependent);
  p.next_row = a.row_counters, p.next_heavy = a.row_counters + 2;
  launch_sddmm(twell_ffn_up_kernel, p, sm_count, a.M, stream, a.dependent);
  p.report = PackReport{};
  p.next_row = a.row_counters + 1, p.next_heavy = a.row_counters + 3;
  if (a.precision == Precision::h_fp32)
    launch_down<kChunks, Aux::h_gated_fp32>(p, sm_count, a.M, stream, true);
  else
    launch_down<kChunks, Aux::h_gated>(p, sm_count, a.M, stream, true);
}

}  // namespace

int64_t twell_u_size(const TwellDeviceView& act) {
  return act.layout.slot_size() + act.backup_capacity * act.layout.tile;
}

std::string twell_ffn_sparse_unsupported(const TwellDeviceView& act, int64_t H, int64_t I) {
  return rows_args_problem("the sparse FFN kernels", act, act.layout.rows, H, I);
}

void check_twell_ffn_sparse(const SparseFfnArgs& a) {
  check_rows_args("sparse FFN kernel", a.act, a.M, a.H, a.I);
  TWELL_CHECK(a.precision != Precision::f64, "sparse FFN kernel: Precision::f64 is CPU-only");
  TWELL_CHECK(!a.gated || a.u_vals, "sparse FFN kernel: a gated FFN needs the u buffer");
  TWELL_CHECK(a.row_counters, "sparse FFN kernel: needs four device counters, zero at launch (row_counters)");
  if (a.then.resid) {
    auto aligned = [](const void* q) { return q && reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    TWELL_CHECK(aligned(a.then.resid) && aligned(a.then.w) && aligned(a.then.normed) &&
                    (!a.then.before || aligned(a.then.before)),
                "sparse FFN kernel: the residual, its deferred add, the norm weights and the normed rows must be "
                "16-byte aligned");
    TWELL_CHECK(std::isfinite(a.then.eps) && a.then.eps >= 0.f, "sparse FFN kernel: RMSNorm eps ", a.then.eps,
                " must be finite and >= 0");
  }
}

void launch_twell_ffn_sparse(const SparseFfnArgs& a, int sm_count, cudaStream_t stream) {
  check_twell_ffn_sparse(a);
  if (a.M == 0) return launch_report(a.report, stream);
  Params p{a.act, a.x, a.wu, a.wd, a.u_vals, a.y, a.H, 0, list_cap_for(a.act.layout), nullptr, nullptr, a.rows};
  p.then = a.then;
  const int64_t chunks = (a.H + 255) / 256;
  if (chunks <= 2) launch_passes<2>(a, p, sm_count, stream);
  else if (chunks <= 4) launch_passes<4>(a, p, sm_count, stream);
  else if (chunks <= 8) launch_passes<8>(a, p, sm_count, stream);
  else launch_passes<16>(a, p, sm_count, stream);
}

}  // namespace twell::cuda
