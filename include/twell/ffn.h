// The FFN problem, independent of backend: weights, options, saved state and statistics.
// Notation (DESIGN.md §2): x [M, H]; Wg, Wu [I, H]; Wd [I, H] (neuron-major, the transpose of
// PyTorch's down_proj.weight); h [M, I]; y [M, H].
//   gated:     g = relu(x Wgᵀ), u = x Wuᵀ, h = g ⊙ u, y = h Wd
//   non-gated: h = relu(x Wuᵀ),                     y = h Wd
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "twell/tensor.h"

namespace twell {

struct FfnWeights {
  TensorView wg;  // [I, H]; empty for a non-gated FFN
  TensorView wu;  // [I, H]
  TensorView wd;  // [I, H] neuron-major

  bool gated() const { return !wg.empty(); }
  int64_t hidden() const { return wu.size(1); }  // H
  int64_t ffn() const { return wu.size(0); }     // I
};

// Gradients of the FFN's inputs and weights, same shapes as the tensors they differentiate; dwg is
// empty for a non-gated FFN. An empty view is not computed (e.g. dx of the first layer).
struct FfnGrads {
  TensorView dx, dwg, dwu, dwd;
};

// Where values are rounded (DESIGN.md §2). `bf16` rounds g, u, h and y to bf16 as a dense bf16
// PyTorch model does, with fp32 accumulation. `h_fp32` ("highest precision") keeps h in fp32.
// `f64` rounds nothing and accumulates in double: the oracle for tests.
enum class Precision { bf16, h_fp32, f64 };

// Checks the shapes/dtypes of an FFN call; throws an Error naming the first bad argument.
// x and y are [M, H]; dtypes must be bf16, f32 or f64 (the same for all weights).
void check_ffn_args(const TensorView& x, const FfnWeights& w, const TensorView& y);
// Throws an Error (from `op`) if an output's memory (y, and h_out where not empty) overlaps x or a
// weight, or the other output: the forward writes them while it still reads its inputs.
void check_ffn_outputs_disjoint(const char* op, const TensorView& x, const FfnWeights& w, const TensorView& y,
                                const TensorView& h_out = {});
// Throws an Error (from `op`) if a gradient's memory overlaps x, dy, a weight or another
// gradient: each gradient is written while they are still read. Empty views are skipped.
void check_ffn_grads_disjoint(const char* op, const TensorView& x, const FfnWeights& w, const TensorView& dy,
                              const FfnGrads& grads);

// Activation statistics of h (or g) over the M tokens of one layer.
struct ActivationStats {
  int64_t tokens = 0;
  int64_t nnz = 0;                // non-zeros of h over all tokens
  int64_t max_nnz_per_token = 0;
  double l1_sum = 0;              // Σ_m Σ_j |h[m, j]|
  double mean_nnz_per_token() const { return tokens ? double(nnz) / tokens : 0.0; }
  double l1_per_token() const { return tokens ? l1_sum / tokens : 0.0; }  // (1/M) Σ|h|
  // The statistics of both token sets together.
  ActivationStats& operator+=(const ActivationStats& o) {
    tokens += o.tokens, nnz += o.nnz, l1_sum += o.l1_sum;
    max_nnz_per_token = max_nnz_per_token > o.max_nnz_per_token ? max_nnz_per_token : o.max_nnz_per_token;
    return *this;
  }
};

// Coefficient of Σ|h| in the loss L = CE + λ · mean over layers of (1/M) Σ|h|; 0 for no tokens (an
// empty batch adds no penalty), as python/twell's l1_coefficient.
inline double l1_coefficient(double lambda, int64_t tokens, int64_t layers) {
  TWELL_REQUIRE(tokens >= 0 && layers >= 1, "l1_coefficient: expected tokens >= 0 and layers >= 1, got tokens ",
                tokens, ", layers ", layers);
  return tokens == 0 ? 0.0 : lambda / (static_cast<double>(tokens) * static_cast<double>(layers));
}

// The backwards' check of their l1_coeff: finite, >= 0, and within float's range (the kernels multiply
// in float, where a larger value is inf, and inf · sign(0) NaN). Not a guarantee of finite gradients:
// a value near the bound still overflows dh, and bf16's (Precision::bf16) at ~3.39e38.
inline void check_l1_coefficient(double l1_coeff, const char* op) {
  TWELL_REQUIRE(std::isfinite(l1_coeff) && l1_coeff >= 0 && l1_coeff <= std::numeric_limits<float>::max(), op,
                ": l1_coeff: expected a finite value in [0, 3.4e+38] (float's range), got ", l1_coeff);
}

}  // namespace twell
