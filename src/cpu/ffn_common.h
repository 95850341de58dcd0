// Shared pieces of the CPU reference FFN (ffn_forward.cpp, ffn_backward.cpp): the rounding
// points, the two inner kernels (dot, axpy), input conversion and output stores.
//
// ---- Rounding points (DESIGN.md §2) ---------------------------------------------------------
// Acc is the accumulation type: double for Precision::f64, float otherwise. Inputs are used as
// given: x, dy and the weights are read exactly (bf16 -> float is exact; f64 inputs are rounded
// once to float when Acc = float). "dot" is the fp32 (Acc) dot product defined below.
//
//                 Precision::bf16            Precision::h_fp32          Precision::f64
//   gate  g       bf16(relu(dot(x, Wg_j)))   bf16(relu(dot(x, Wg_j)))   relu(dot), double
//   up    u       bf16(dot(x, Wu_j))         bf16(dot(x, Wu_j))         dot, double
//   gated h       bf16(g · u)                g · u  (fp32)              g · u, double
//   non-gated h   bf16(relu(dot(x, Wu_j)))   relu(dot(x, Wu_j)) (fp32)  relu(dot), double
//   y             fp32 Σ_j h·Wd_j, then rounded once to y's dtype       double
//   backward      dh = bf16(dot(dy, Wd_j) + l1·sign(h)), du = bf16(dh·g), dg = bf16(dh·u);
//                 non-gated: dpre = dh. h_fp32 keeps dh, du, dg in fp32; f64 rounds nothing.
//                 dx, dWg, dWu, dWd are fp32 (double) sums, rounded once to the view's dtype.
// dh is rounded once, after the L1 term is added in fp32; a bf16 PyTorch model rounds the
// matmul output and the L1 gradient separately and adds them in bf16 (at most ~1 ulp apart).
//
// Active set: (m, j) is active when the bf16-rounded activation is non-zero, bf16(g) for a gated
// FFN and bf16(relu(dot(x, Wu_j))) for a non-gated one, in every precision except f64 (where it
// is relu(dot) > 0). That is exactly the set of entries the TwELL format holds, so the sparse
// path sees the same set. u, h, dh, du, dg are computed only on the active set; elsewhere they
// are 0 (the dense and sparse paths agree even where Wu holds Inf/NaN or an up product overflows
// outside the active set; Wd must be finite there, since the dense path's down GEMM multiplies
// every row of Wd by h, zeros included).
// relu propagates NaN (as torch.relu does): relu(NaN) = NaN, which is non-zero, so active.
//
// Summation order (fixed, so results do not depend on threads or on dense vs sparse):
//   dot(a, b, n): 8 interleaved partial sums, s_k = Σ_{i ≡ k mod 8} a_i·b_i in ascending i,
//                 combined as ((s0+s1)+(s2+s3)) + ((s4+s5)+(s6+s7)).
//   y[m, :]     : ascending j over the non-zero h[m, j] (zero terms are skipped, not added).
//   dx[m, :]    : ascending j over active (m, j): += dg·Wg_j, then += du·Wu_j.
//   dW*[j, :]   : ascending m over active (m, j).
// Every product is rounded before it is added: floating-point contraction (FMA) is switched off
// (src/cpu/fp_contract_off.h), so the results do not depend on -march flags. GPU kernels are not
// expected to reproduce these orders bit for bit; they are compared with tolerances (DESIGN.md §5).
#pragma once

#ifndef TWELL_CPU_FP_CONTRACT_OFF
#error "include cpu/fp_contract_off.h first in every file that includes cpu/ffn_common.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

#include "twell/bf16.h"
#include "twell/ffn.h"
#include "twell/tensor.h"

namespace twell::cpu::detail {

// ---- element conversion ------------------------------------------------------------------------
// Weights are read in their storage type W: uint16_t (bf16 bits), float or double.
template <class Acc>
inline Acc widen(uint16_t bf16_bits) {
  return static_cast<Acc>(bf16_bits_to_float(bf16_bits));
}
template <class Acc>
inline Acc widen(float v) {
  return static_cast<Acc>(v);
}
template <class Acc>
inline Acc widen(double v) {
  return static_cast<Acc>(v);
}

// ---- inner kernels
// -------------------------------------------------------------------------------
inline constexpr int kDotLanes = 8;

// dot(a, b, n) with the fixed order documented above. a and b are contiguous.
template <class Acc, class W>
inline Acc dot(const Acc* a, const W* b, int64_t n) {
  Acc s[kDotLanes] = {};
  int64_t i = 0;
  for (; i + kDotLanes <= n; i += kDotLanes)
    for (int k = 0; k < kDotLanes; ++k) s[k] += a[i + k] * widen<Acc>(b[i + k]);
  for (int k = 0; i + k < n; ++k) s[k] += a[i + k] * widen<Acc>(b[i + k]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// y[0, n) += alpha · b[0, n); element-wise, so any vectorisation gives the same bits.
template <class Acc, class W>
inline void axpy(Acc* y, Acc alpha, const W* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * widen<Acc>(b[i]);
}

// ---- the rounding points -----------------------------------------------------------------------
template <class Acc>
inline Acc to_bf16_unless_f64(Acc v) {
  if constexpr (std::is_same_v<Acc, double>) {
    return v;
  } else {
    return round_bf16(v);
  }
}

template <class Acc>
inline Acc relu(Acc v) {
  return (v > 0 || v != v) ? v : Acc(0);  // NaN propagates, like torch.relu
}

template <class Acc>
inline Acc sign(Acc v) {
  return v > 0 ? Acc(1) : v < 0 ? Acc(-1) : v;  // sign(±0) = ±0, sign(NaN) = NaN
}

// Rounding policy of one precision; Acc = double exactly when p == Precision::f64.
template <class Acc>
struct Rounding {
  Precision p;

  // bf16(relu(pre)): the gate g, and the non-gated activation as the sparse format holds it.
  Acc gate(Acc pre) const { return to_bf16_unless_f64(relu(pre)); }
  // bf16(pre): the up projection u.
  Acc up(Acc pre) const { return to_bf16_unless_f64(pre); }
  // h of a gated FFN from g and u.
  Acc gated_h(Acc g, Acc u) const {
    return p == Precision::bf16 ? to_bf16_unless_f64(g * u) : g * u;
  }
  // h of a non-gated FFN from its pre-activation, given that gate(pre) != 0.
  Acc non_gated_h(Acc pre, Acc stored) const { return p == Precision::h_fp32 ? relu(pre) : stored; }
  // Backward intermediates dh, du, dg.
  Acc grad(Acc v) const { return p == Precision::bf16 ? to_bf16_unless_f64(v) : v; }
};

// ---- inputs and outputs ------------------------------------------------------------------------
// A contiguous copy of a host tensor in Acc.
template <class Acc>
std::vector<Acc> to_acc(const TensorView& t) {
  if constexpr (std::is_same_v<Acc, double>) {
    return to_f64(t);
  } else {
    return to_f32(t);
  }
}

// The three weight matrices as contiguous rows of one storage type W.
template <class W>
struct WeightRows {
  const W* wg = nullptr;  // [I, H]; null for a non-gated FFN
  const W* wu = nullptr;  // [I, H]
  const W* wd = nullptr;  // [I, H]
};

// Calls fn(WeightRows<W>) with W the weights' storage type when all three are contiguous (no
// copy: the sparse path then touches only the rows it needs), else with a contiguous Acc copy.
template <class Acc, class Fn>
void with_weight_rows(const FfnWeights& w, Fn&& fn) {
  const bool contiguous =
      w.wu.is_contiguous() && w.wd.is_contiguous() && (!w.gated() || w.wg.is_contiguous());
  if (contiguous) {
    auto rows = [&](auto tag) {
      using W = decltype(tag);
      return WeightRows<W>{w.gated() ? static_cast<const W*>(w.wg.data) : nullptr,
                           static_cast<const W*>(w.wu.data), static_cast<const W*>(w.wd.data)};
    };
    switch (w.wu.dtype) {
      case DType::bf16:
        fn(rows(uint16_t{}));
        return;
      case DType::f32:
        fn(rows(float{}));
        return;
      case DType::f64:
        fn(rows(double{}));
        return;
      default:
        break;  // rejected by check_ffn_inputs
    }
  }
  const std::vector<Acc> wg = w.gated() ? to_acc<Acc>(w.wg) : std::vector<Acc>{};
  const std::vector<Acc> wu = to_acc<Acc>(w.wu), wd = to_acc<Acc>(w.wd);
  fn(WeightRows<Acc>{w.gated() ? wg.data() : nullptr, wu.data(), wd.data()});
}

// Writes src[0, n) to row `row` of a 2-d host view of any float dtype and any strides.
// Rounded once to the view's dtype (doubles too: Precision::f64 into a bf16 or f16 view).
inline uint16_t to_bf16_bits(float v) { return float_to_bf16_bits(v); }
inline uint16_t to_bf16_bits(double v) { return double_to_bf16_bits(v); }
inline uint16_t to_f16_bits(float v) { return float_to_f16_bits(v); }
inline uint16_t to_f16_bits(double v) { return double_to_f16_bits(v); }

template <class Acc>
void store_row(const TensorView& t, int64_t row, const Acc* src) {
  const int64_t n = t.shape[1], s0 = t.stride(0), s1 = t.stride(1);
  switch (t.dtype) {
    case DType::bf16: {
      auto* p = static_cast<uint16_t*>(t.data) + row * s0;
      for (int64_t c = 0; c < n; ++c) p[c * s1] = to_bf16_bits(src[c]);
      return;
    }
    case DType::f16: {
      auto* p = static_cast<uint16_t*>(t.data) + row * s0;
      for (int64_t c = 0; c < n; ++c) p[c * s1] = to_f16_bits(src[c]);
      return;
    }
    case DType::f32: {
      auto* p = static_cast<float*>(t.data) + row * s0;
      for (int64_t c = 0; c < n; ++c) p[c * s1] = static_cast<float>(src[c]);
      return;
    }
    case DType::f64: {
      auto* p = static_cast<double*>(t.data) + row * s0;
      for (int64_t c = 0; c < n; ++c) p[c * s1] = static_cast<double>(src[c]);
      return;
    }
    default:
      TWELL_FAIL("store_row: ", dtype_name(t.dtype), " is not a float dtype");
  }
}

// ---- argument checks (ffn_check.cpp) -----------------------------------------------------------
// Shapes, dtypes and device of x and the weights; messages start with `op`. Returns {M, H, I}.
struct FfnDims {
  int64_t M, H, I;
};
FfnDims check_ffn_inputs(const char* op, const TensorView& x, const FfnWeights& w, bool host);
// `t` is a 2-d [rows, cols] tensor of one of the float dtypes `allowed` (any strides: a broadcast dy too).
void check_input(const char* op, const char* name, const TensorView& t, const Shape& expected,
                 std::initializer_list<DType> allowed, bool host);
// The same, and no two of its elements share memory: each written value is kept.
void check_output(const char* op, const char* name, const TensorView& t, const Shape& expected,
                  std::initializer_list<DType> allowed, bool host);
void check_precision(const char* op, Precision p);

// Token block for the dense passes: tokens of a block share each weight row while it is in
// cache. Blocking never changes results (each element has its own fixed order).
inline int64_t token_block(int64_t M, int threads) {
  const int64_t per_thread = (M + threads - 1) / threads;
  return std::max<int64_t>(1, std::min<int64_t>(16, per_thread));
}

}  // namespace twell::cpu::detail
