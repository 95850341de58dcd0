// CPU reference FFN forward (include/twell/cpu/ffn.h):
//   ffn_forward           dense:   y = h Wd with h from the gate/up projections of x
//   ffn_pack_activation   g = bf16(relu(x Wgᵀ)) (non-gated: h) packed as hybrid TwELL
//   ffn_forward_twell     sparse:  u, h and y only on the entries the TwELL matrix holds
//   activation_stats      statistics of a dense [M, I] activation
// Rounding points and summation orders: src/cpu/ffn_common.h. The sparse path evaluates the same
// per-element functions in the same order as the dense one, so its y is bit-identical
// (tests/cpu/test_ffn_twell.cpp). Parallel over tokens; results do not depend on the thread count.
// clang-format off
#include "cpu/fp_contract_off.h"  // must come first, see there
// clang-format on

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/ffn_common.h"
#include "cpu/parallel.h"
#include "twell/cpu/ffn.h"

namespace twell::cpu {

using detail::FfnDims;
using detail::Rounding;
using detail::WeightRows;

namespace {

// Per-token statistics, reduced in token order so the sums do not depend on the thread count.
struct TokenStats {
  int64_t nnz = 0;
  double l1 = 0;

  void add(double h) {
    if (h != 0) {
      ++nnz;
      l1 += std::fabs(h);
    }
  }
};

ActivationStats reduce_stats(const std::vector<TokenStats>& per_token) {
  ActivationStats s;
  s.tokens = static_cast<int64_t>(per_token.size());
  for (const TokenStats& t : per_token) {
    s.nnz += t.nnz;
    s.max_nnz_per_token = std::max(s.max_nnz_per_token, t.nnz);
    s.l1_sum += t.l1;
  }
  return s;
}

// h[m, j] of one active-or-not entry, dense path. Returns 0 off the active set.
template <class Acc, class W>
inline Acc dense_h(const Acc* xm, const WeightRows<W>& w, int64_t j, int64_t H, bool gated,
                   const Rounding<Acc>& r) {
  if (gated) {
    const Acc g = r.gate(detail::dot(xm, w.wg + j * H, H));
    if (g == 0) return 0;
    const Acc u = r.up(detail::dot(xm, w.wu + j * H, H));
    return r.gated_h(g, u);
  }
  const Acc pre = detail::dot(xm, w.wu + j * H, H);
  const Acc stored = r.gate(pre);
  return stored == 0 ? Acc(0) : r.non_gated_h(pre, stored);
}

template <class Acc, class W>
void forward_dense(const std::vector<Acc>& x, const WeightRows<W>& w, const FfnDims& d, bool gated,
                   Precision p, const TensorView& y, const TensorView& h_out,
                   std::vector<TokenStats>& stats) {
  const int64_t M = d.M, H = d.H, I = d.I;
  const Rounding<Acc> r{p};
  const int64_t block = detail::token_block(M, num_threads());
  const int64_t n_blocks = (M + block - 1) / block;
  parallel_for(
      n_blocks,
      [&](int64_t b0, int64_t b1) {
        std::vector<Acc> h(static_cast<size_t>(block * I)), acc(static_cast<size_t>(block * H));
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t m0 = b * block, mb = std::min(block, M - m0);
          // h for the block, neuron-outer so each weight row serves every token of the block.
          for (int64_t j = 0; j < I; ++j)
            for (int64_t t = 0; t < mb; ++t)
              h[t * I + j] = dense_h(x.data() + (m0 + t) * H, w, j, H, gated, r);
          // y = Σ_j h[:, j] Wd_j over non-zero h, ascending j.
          std::fill(acc.begin(), acc.end(), Acc(0));
          for (int64_t j = 0; j < I; ++j)
            for (int64_t t = 0; t < mb; ++t)
              if (const Acc hv = h[t * I + j]; hv != 0)
                detail::axpy(&acc[t * H], hv, w.wd + j * H, H);
          for (int64_t t = 0; t < mb; ++t) {
            detail::store_row(y, m0 + t, &acc[t * H]);
            if (!h_out.empty()) detail::store_row(h_out, m0 + t, &h[t * I]);
            TokenStats& s = stats[m0 + t];
            for (int64_t j = 0; j < I; ++j) s.add(static_cast<double>(h[t * I + j]));
          }
        }
      },
      /*cost_per_item=*/block * I * H * (gated ? 3 : 2));
}

template <class W>
void pack_gate(const std::vector<float>& x, const WeightRows<W>& w, const FfnDims& d, bool gated,
               uint16_t* g_bits) {
  const int64_t M = d.M, H = d.H, I = d.I;
  const Rounding<float> r{Precision::bf16};
  const W* wa = gated ? w.wg : w.wu;  // the matrix whose ReLU output the format holds
  const int64_t block = detail::token_block(M, num_threads());
  parallel_for((M + block - 1) / block,
               [&](int64_t b0, int64_t b1) {
                 for (int64_t b = b0; b < b1; ++b) {
                   const int64_t m0 = b * block, mb = std::min(block, M - m0);
                   for (int64_t j = 0; j < I; ++j)
                     for (int64_t t = 0; t < mb; ++t) {
                       // g is already a bf16 value: the conversion to bits is exact.
                       const float g = r.gate(detail::dot(x.data() + (m0 + t) * H, wa + j * H, H));
                       g_bits[(m0 + t) * I + j] = float_to_bf16_bits(g);
                     }
                 }
               },
               block * I * H);
}

template <class W>
void forward_sparse(const std::vector<float>& x, const TwellMatrix& act, const WeightRows<W>& w,
                    const FfnDims& d, bool gated, Precision p, const TensorView& y,
                    std::vector<TokenStats>& stats) {
  const int64_t M = d.M, H = d.H;
  const Rounding<float> r{p};
  const int64_t mean_nnz = M ? act.nnz() / M + 1 : 1;
  parallel_for(
      M,
      [&](int64_t m0, int64_t m1) {
        std::vector<float> acc(static_cast<size_t>(H));
        for (int64_t m = m0; m < m1; ++m) {
          const float* xm = x.data() + m * H;
          std::fill(acc.begin(), acc.end(), 0.0f);
          TokenStats& s = stats[m];
          act.for_each_in_row(m, [&](int64_t j, uint16_t bits) {
            const float stored = bf16_bits_to_float(bits);  // g, or non-gated bf16(relu(pre))
            float h;
            if (gated) {
              h = r.gated_h(stored, r.up(detail::dot(xm, w.wu + j * H, H)));
            } else {
              h = p == Precision::h_fp32 ? r.non_gated_h(detail::dot(xm, w.wu + j * H, H), stored)
                                         : stored;
            }
            if (h != 0) detail::axpy(acc.data(), h, w.wd + j * H, H);
            s.add(h);
          });
          detail::store_row(y, m, acc.data());
        }
      },
      mean_nnz * H * (gated ? 2 : 1) + H);
}

}  // namespace

void ffn_forward(const TensorView& x, const FfnWeights& w, const TensorView& y, Precision p,
                 ActivationStats* stats, const TensorView& h_out) {
  const FfnDims d = detail::check_ffn_inputs("ffn_forward", x, w, /*host=*/true);
  detail::check_output("ffn_forward", "y", y, {d.M, d.H}, {DType::bf16, DType::f32, DType::f64},
                       true);
  detail::check_precision("ffn_forward", p);
  check_optional(h_out, "ffn_forward: h_out");
  if (!h_out.empty())
    detail::check_output("ffn_forward", "h_out", h_out, {d.M, d.I},
                         {DType::bf16, DType::f16, DType::f32, DType::f64}, true);
  check_ffn_outputs_disjoint("ffn_forward", x, w, y, h_out);
  std::vector<TokenStats> per_token(static_cast<size_t>(d.M));
  auto run = [&](auto acc_tag) {
    using Acc = decltype(acc_tag);
    const std::vector<Acc> xa = detail::to_acc<Acc>(x);
    detail::with_weight_rows<Acc>(w, [&](const auto& rows) {
      forward_dense(xa, rows, d, w.gated(), p, y, h_out, per_token);
    });
  };
  if (p == Precision::f64) {
    run(double{});
  } else {
    run(float{});
  }
  if (stats) *stats = reduce_stats(per_token);
}

TwellMatrix ffn_pack_activation(const TensorView& x, const FfnWeights& w, TwellLayout layout) {
  const FfnDims d = detail::check_ffn_inputs("ffn_pack_activation", x, w, /*host=*/true);
  layout.rows = d.M;
  layout.cols = d.I;
  layout.check();
  Tensor g(DType::bf16, {d.M, d.I});
  const std::vector<float> xa = to_f32(x);
  detail::with_weight_rows<float>(w, [&](const auto& rows) {
    pack_gate(xa, rows, d, w.gated(), static_cast<uint16_t*>(g.view().data));
  });
  return twell_pack(g, layout, Spill::allow);
}

void ffn_forward_twell(const TensorView& x, const TwellMatrix& act, const FfnWeights& w,
                       const TensorView& y, Precision p, ActivationStats* stats) {
  const FfnDims d = detail::check_ffn_inputs("ffn_forward_twell", x, w, /*host=*/true);
  detail::check_output("ffn_forward_twell", "y", y, {d.M, d.H},
                       {DType::bf16, DType::f32, DType::f64}, true);
  detail::check_precision("ffn_forward_twell", p);
  TWELL_REQUIRE(p != Precision::f64,
                "ffn_forward_twell: Precision::f64 is not supported: the TwELL "
                "activation holds bf16 values; use ffn_forward for the f64 oracle");
  TWELL_REQUIRE(act.layout.rows == d.M && act.layout.cols == d.I,
                "ffn_forward_twell: act: expected a TwELL matrix of [M, I] = ", shape_str({d.M, d.I}),
                ", got ", shape_str({act.layout.rows, act.layout.cols}));
  check_ffn_outputs_disjoint("ffn_forward_twell", x, w, y);
  twell_validate(act);
  std::vector<TokenStats> per_token(static_cast<size_t>(d.M));
  const std::vector<float> xa = to_f32(x);
  detail::with_weight_rows<float>(
      w, [&](const auto& rows) { forward_sparse(xa, act, rows, d, w.gated(), p, y, per_token); });
  if (stats) *stats = reduce_stats(per_token);
}

ActivationStats activation_stats(const TensorView& h) {
  TWELL_REQUIRE(h.rank() == 2, "activation_stats: h: expected a 2-d tensor [M, I], got shape ",
                shape_str(h.shape));
  TWELL_REQUIRE(!h.empty() || h.numel() == 0, "activation_stats: h: missing (null data), shape ", shape_str(h.shape));
  check_device(h, Device::cpu, "activation_stats: h");
  check_dtype(h, {DType::bf16, DType::f16, DType::f32, DType::f64}, "activation_stats: h");
  const int64_t M = h.shape[0], I = h.shape[1];
  std::vector<TokenStats> per_token(static_cast<size_t>(M));
  parallel_for(
      M,
      [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m)
          for (int64_t j = 0; j < I; ++j) per_token[m].add(load_as_double(h, m * I + j));
      },
      I * 4);
  return reduce_stats(per_token);
}

}  // namespace twell::cpu
