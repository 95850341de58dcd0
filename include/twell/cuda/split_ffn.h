// An FFN split by neuron: the neurons that fire most often run as a small dense FFN (cuBLASLt), the
// rest through FfnForward's sparse path.
//
//   auto counts = twell::cuda::count_active_neurons(x_sample, w, stream);  // a calibration sample
//   auto hot = twell::cuda::choose_hot_neurons(counts, x_sample.size(0));
//   twell::cuda::SplitFfn ffn(twell::cuda::FfnShape{M, H, I}, w, hot, {}, stream);  // copies w
//   ffn.forward(x, y, stream);
//
// Why: the sparse path pays for a neuron twice, a column of the gate GEMM for every token and a
// weight row of Wu and of Wd for every token it fires in; the dense path pays three GEMM columns for
// every token. A neuron that fires in more than ~1.2% of tokens (H200, H = 2048: a dense FFN's
// neuron costs ~3.1 gate columns, a firing ~0.98 ns against a gate column's ~5.8 ps a token) is
// cheaper dense. Trained models, and `twell bench ffn`'s skewed activations, have such neurons:
// there the ~700 that fire most hold about half of all non-zeros.
//
// Exact, as FfnForward is: no value is dropped. The cold part runs first and writes
// y_cold = bf16(Σ_cold h_j Wd_j); the hot part's down GEMM then adds to it, y = bf16(Σ_hot h_j Wd_j +
// y_cold) in f32: one more bf16 rounding of y than FfnForward's (within DESIGN.md §5's twice the
// dense bf16 FFN's error; the GPU tests check it). g, u and h are rounded as on FfnForward's bf16
// paths. Not for training (no backward) nor Precision::h_fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "twell/cuda/ffn.h"
#include "twell/tensor.h"

namespace twell::cuda {

// How often each neuron of the FFN fires on the rows of x ([M, H] bf16 on the device): counts[j] =
// the tokens with g_j > 0 (non-gated: relu(x Wuᵀ)_j > 0). Runs FfnForward's sparse path on x (an
// object sized for M: ~3.4 · M · I · 2 bytes and cuBLASLt's 64 MiB, freed on return; x within the
// TwELL path's reach, FfnForward::sparse_supported) and counts on the host; synchronises `stream`.
std::vector<int64_t> count_active_neurons(const TensorView& x, const FfnWeights& w, cudaStream_t stream);

// The neurons to run dense, from count_active_neurons' counts over `tokens` tokens: those that fire
// in at least `dense_above_rate` of the tokens, most frequent first (ties to the lower index, so the
// choice is deterministic), their number rounded to the nearest multiple of 704 = lcm(64, 176), so
// that the sparse part's last 176-wide tile (default_ffn_tile; a tile asked for in FfnOptions is not
// seen here) is as full as I's: a partial one costs the gate GEMM a whole tile's work (on an H100,
// twell at I = 4992 took 5.63 ms against 5.49 at I = 4928, whose 28 tiles are whole). So 351 neurons
// above the rate give none, 352 give 704. At most I - 64; empty where no step fits.
std::vector<int32_t> choose_hot_neurons(const std::vector<int64_t>& counts, int64_t tokens,
                                        double dense_above_rate = 0.012);

class SplitFfn {
 public:
  // Copies the weights into the object's device memory, permuted: `hot` (distinct neuron indices,
  // a multiple of 64 of them, fewer than I; empty: everything through FfnForward, which may still
  // dispatch dense) as the dense part, the others in ascending order as FfnForward(shape with
  // I - |hot|, options). The weights: bf16 [I, H] on the current GPU, contiguous, 16-byte aligned, as
  // FfnForward takes them. The copies run on `stream`, which the constructor synchronises: w may be
  // freed or changed when it returns. options: as FfnForward's, but training and Precision::h_fp32
  // are refused; one cuBLASLt workspace serves both parts (options.cublaslt_workspace, or the cold
  // part's own 64 MiB).
  SplitFfn(const FfnShape& shape, const FfnWeights& w, const std::vector<int32_t>& hot, const FfnOptions& options,
           cudaStream_t stream);
  ~SplitFfn();
  SplitFfn(SplitFfn&&) noexcept;
  SplitFfn& operator=(SplitFfn&&) noexcept;

  // y = FFN(x): x, y [M, H] bf16 on the device, M <= max_tokens; checked as FfnForward::forward checks
  // them, before anything is enqueued.
  void forward(const TensorView& x, const TensorView& y, cudaStream_t stream);

  const std::vector<int32_t>& hot_neurons() const;
  // The sparse part (last_stats(), observed_density(), ... of the cold neurons).
  FfnForward& cold();
  // Device memory the object holds: the permuted weights, the hot part's [max_tokens, |hot|] buffers
  // and the cold part's workspace (FfnForward::workspace_bytes; not cuBLASLt's 64 MiB).
  size_t device_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell::cuda
