// CPU reference backend for the FFN: the oracle every GPU kernel is tested against.
// Plain, readable loops; fp32 (or fp64) accumulation; the rounding points of twell::Precision.
// Multi-threaded over tokens (and over neurons for weight gradients), deterministic: results do
// not depend on the thread count (twell/cpu/threads.h: set_num_threads, else TWELL_NUM_THREADS, else
// all hardware threads).
// Rounding points and summation orders of every precision: src/cpu/ffn_common.h.
// Argument errors throw twell::Error naming the argument, e.g.
// "ffn_forward: w.wd: expected shape [300, 67], got [300, 66]".
#pragma once

#include "twell/cpu/threads.h"
#include "twell/ffn.h"
#include "twell/formats/twell_format.h"

namespace twell::cpu {

// Dense forward: y [M, H] (bf16, f32 or f64). With `h_out` non-empty ([M, I], any float dtype)
// the hidden activation h is also written there. `stats`, if given, receives h's statistics.
void ffn_forward(const TensorView& x, const FfnWeights& w, const TensorView& y, Precision p,
                 ActivationStats* stats = nullptr, const TensorView& h_out = {});

// The activation the sparse format holds, packed as TwELL (hybrid, never drops):
// gated: g = bf16(relu(x Wgᵀ)); non-gated: h = bf16(relu(x Wuᵀ)).
// `layout.rows` and `layout.cols` are filled in from x and w; tile and compression are kept.
TwellMatrix ffn_pack_activation(const TensorView& x, const FfnWeights& w, TwellLayout layout);

// Sparse forward from packed activations (the output of ffn_pack_activation): computes u only on
// the active set. Bit-identical to ffn_forward with the same precision (bf16 or h_fp32; f64 is
// rejected, the format holds bf16 values). `act` must be [M, I]; it is validated first.
void ffn_forward_twell(const TensorView& x, const TwellMatrix& act, const FfnWeights& w,
                       const TensorView& y, Precision p, ActivationStats* stats = nullptr);

// Backward (gradients in FfnGrads, twell/ffn.h, f32 or f64 here) on the active set, with the L1
// penalty's gradient `l1_coeff · sign(h)` added to dh
// (l1_coeff = l1_coefficient(λ, M, layers)). Precision::bf16 rounds dh, dg, du to bf16 as a bf16
// PyTorch model does (h_fp32 keeps them in fp32); gradients are accumulated in fp32 (f64 with
// Precision::f64) and written over what the outputs held (not added to it). dy is [M, H], bf16, f32 or
// f64. Forward quantities are recomputed.
void ffn_backward(const TensorView& x, const FfnWeights& w, const TensorView& dy, double l1_coeff,
                  const FfnGrads& grads, Precision p);

// Statistics of a dense activation matrix [M, I] (any float dtype); a value counts when != 0.
ActivationStats activation_stats(const TensorView& h);

}  // namespace twell::cpu
