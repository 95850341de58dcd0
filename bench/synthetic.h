// Synthetic FFN problems with a controlled activation density (shared/BENCHMARKS.md):
// column 0 of x is a constant 1 and column 0 of the gate weight (Wu for a non-gated FFN) holds a
// per-neuron negative threshold, so neuron j fires with a chosen probability p_j.
//
// x[m, 2:] is i.i.d. with mean 0 and variance 1 (uniform on [-√3, √3]: cheap to draw in
// parallel). With the rest of the gate row w_j fixed, the pre-activation without the bias
// columns is a sum of H - 2 independent terms of total variance |w_j|², normal to within a
// fraction of a percent in the firing rate by the central limit theorem at the widths we bench
// (H ≥ 512), so the threshold comes from the normal quantile instead of a calibration sample:
// Wg[j, 0] = -|w_j| Φ⁻¹(1 - p_j), with |w_j| measured on the bf16-rounded row.
// Column 1 is a per-token "heat" channel: x[m, 1] = heat_m, Wg[j, 1] = |w_j|, which shifts every
// pre-activation of token m by heat_m standard deviations (a few dense tokens in `skewed`).
//
// Distributions:
//   uniform  every neuron fires with probability `density`; every token has heat 0.
//   skewed   30% dead neurons; the others' rates log-normal (σ = 1); 2% of tokens have heat in
//            [1.0, 1.5] (about 10-20x the mean count at 0.5%); the rates are scaled so that the
//            expected non-zeros per token over all tokens, hot ones included, is density · I.
//            (Before the eleventh session the scale made `density` the mean of the tokens without
//            heat only, and the hot tokens raised the mean by ~26% at 0.5%: 35.4 for 28.2.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "twell/ffn.h"
#include "twell/tensor.h"

namespace twell::bench {

enum class Distribution { uniform, skewed };
Distribution distribution_from_name(const std::string& name);
const char* distribution_name(Distribution d);

struct SyntheticSpec {
  int64_t M = 128, H = 2048, I = 5632;
  double density = 0.005;  // expected non-zeros per token / I, over all tokens
  Distribution distribution = Distribution::uniform;
  bool gated = true;
  uint64_t seed = 1;
};

struct SyntheticFfn {
  SyntheticSpec spec;
  Tensor x;           // [M, H] bf16
  Tensor wg, wu, wd;  // [I, H] bf16 (wg empty when not gated)
  std::vector<double> fire_prob;  // p_j per neuron

  FfnWeights weights() const { return {spec.gated ? wg.view() : TensorView{}, wu.view(), wd.view()}; }
};

SyntheticFfn make_synthetic_ffn(const SyntheticSpec& spec);

// skewed: the share of neurons that never fire, and the rate the others' are clipped at.
constexpr double kDeadNeurons = 0.3, kMaxRate = 0.95;

// The largest density below 1 that `spec.distribution` gives at spec.I and spec.seed (spec.density
// is ignored): 1 for uniform; for skewed its live neurons (70%, so a little more or less at a
// small I) all at their clipped rate (95%), ~0.67 at I = 5632 with the hot tokens. Densities
// between it and 1 would give it, not what was asked; 1 itself is every neuron.
double max_synthetic_density(const SyntheticSpec& spec);

// Fresh activations x [M, H] for an existing problem (same firing structure, new tokens).
Tensor make_synthetic_tokens(const SyntheticSpec& spec, uint64_t seed);

// Standard normal quantile Φ⁻¹(q), q in (0, 1).
double normal_quantile(double q);

}  // namespace twell::bench
