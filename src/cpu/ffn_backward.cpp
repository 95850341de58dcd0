// CPU reference FFN backward (include/twell/cpu/ffn.h, maths in DESIGN.md §2), all on the active
// set A (gated: g != 0; non-gated: h != 0; see src/cpu/ffn_common.h for rounding points):
//   dh = dy Wdᵀ + l1·sign(h)   du = dh ⊙ g   dg = dh ⊙ u        (per active (m, j))
//   dx = dg Wg + du Wu         dWg = dgᵀ x   dWu = duᵀ x   dWd = hᵀ dy
// Non-gated: dpre = dh on A (stored in the du slot), dx = dpre Wu, dWu = dpreᵀ x, dWd = hᵀ dy.
//
// Three phases, each deterministic for any thread count:
//   1. per token block (parallel over tokens): recompute g, u, h; dh, du, dg on A; dx rows.
//   2. transpose the active lists into per-neuron lists, tokens ascending (serial, O(|A|)).
//   3. per neuron (parallel over rows of dW): dWg, dWu, dWd rows, summed over tokens ascending.
// The forward quantities are recomputed here (no saved state).
// clang-format off
#include "cpu/fp_contract_off.h"  // must come first, see there
// clang-format on

#include <algorithm>
#include <vector>

#include "cpu/ffn_common.h"
#include "cpu/parallel.h"
#include "twell/cpu/ffn.h"

namespace twell::cpu {

using detail::FfnDims;
using detail::Rounding;
using detail::WeightRows;

namespace {

// One active (m, j) as seen from its token (j) or from its neuron (m).
template <class Acc>
struct ActiveEntry {
  int64_t index;  // j in the per-token lists, m in the per-neuron lists
  Acc h, dg, du;  // non-gated: du holds dpre = dh on A, dg is 0
};

template <class Acc>
struct BackwardInputs {
  const std::vector<Acc>& x;   // [M, H]
  const std::vector<Acc>& dy;  // [M, H]
  FfnDims d;
  bool gated;
  Rounding<Acc> r;
  Acc l1;
};

// Phase 1 for one token: the active entry (m, j), if any.
template <class Acc, class W>
inline bool active_entry(const BackwardInputs<Acc>& in, const WeightRows<W>& w, int64_t m,
                         int64_t j, ActiveEntry<Acc>* e) {
  const int64_t H = in.d.H;
  const Acc* xm = in.x.data() + m * H;
  const Acc* dym = in.dy.data() + m * H;
  const Rounding<Acc>& r = in.r;
  if (in.gated) {
    const Acc g = r.gate(detail::dot(xm, w.wg + j * H, H));
    if (g == 0) return false;
    const Acc u = r.up(detail::dot(xm, w.wu + j * H, H));
    const Acc h = r.gated_h(g, u);
    const Acc dh = r.grad(detail::dot(dym, w.wd + j * H, H) + in.l1 * detail::sign(h));
    *e = {j, h, r.grad(dh * u), r.grad(dh * g)};
    return true;
  }
  const Acc pre = detail::dot(xm, w.wu + j * H, H);
  const Acc stored = r.gate(pre);
  if (stored == 0) return false;
  const Acc h = r.non_gated_h(pre, stored);
  const Acc dh = r.grad(detail::dot(dym, w.wd + j * H, H) + in.l1 * detail::sign(h));
  *e = {j, h, Acc(0), dh};
  return true;
}

template <class Acc, class W>
void backward(const BackwardInputs<Acc>& in, const WeightRows<W>& w, const FfnGrads& grads) {
  const int64_t M = in.d.M, H = in.d.H, I = in.d.I;

  // ---- phase 1: per token ----------------------------------------------------------------------
  std::vector<std::vector<ActiveEntry<Acc>>> by_token(static_cast<size_t>(M));
  const int64_t block = detail::token_block(M, num_threads());
  parallel_for((M + block - 1) / block,
               [&](int64_t b0, int64_t b1) {
                 std::vector<Acc> dx(static_cast<size_t>(block * H));
                 std::vector<size_t> cursor(static_cast<size_t>(block));
                 for (int64_t b = b0; b < b1; ++b) {
                   const int64_t m0 = b * block, mb = std::min(block, M - m0);
                   ActiveEntry<Acc> e;
                   for (int64_t j = 0; j < I; ++j)  // neuron-outer: weight rows shared by the block
                     for (int64_t t = 0; t < mb; ++t)
                       if (active_entry(in, w, m0 + t, j, &e)) by_token[m0 + t].push_back(e);
                   if (grads.dx.empty()) continue;
                   // dx[m] = Σ_j dg·Wg_j + du·Wu_j over the token's active j, ascending.
                   std::fill(dx.begin(), dx.end(), Acc(0));
                   std::fill(cursor.begin(), cursor.end(), size_t{0});
                   for (int64_t j = 0; j < I; ++j)
                     for (int64_t t = 0; t < mb; ++t) {
                       const auto& list = by_token[m0 + t];
                       if (cursor[t] == list.size() || list[cursor[t]].index != j) continue;
                       const ActiveEntry<Acc>& a = list[cursor[t]++];
                       if (in.gated) detail::axpy(&dx[t * H], a.dg, w.wg + j * H, H);
                       detail::axpy(&dx[t * H], a.du, w.wu + j * H, H);
                     }
                   for (int64_t t = 0; t < mb; ++t) detail::store_row(grads.dx, m0 + t, &dx[t * H]);
                 }
               },
               block * I * H * (in.gated ? 2 : 1));

  // ---- phase 2: per-neuron lists (CSC), tokens ascending --------------------------------------
  std::vector<int64_t> start(static_cast<size_t>(I + 1), 0);
  for (const auto& list : by_token)
    for (const auto& e : list) ++start[e.index + 1];
  for (int64_t j = 0; j < I; ++j) start[j + 1] += start[j];
  std::vector<ActiveEntry<Acc>> by_neuron(static_cast<size_t>(start[I]));
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t m = 0; m < M; ++m)
      for (const auto& e : by_token[m]) by_neuron[fill[e.index]++] = {m, e.h, e.dg, e.du};
  }
  by_token.clear();
  by_token.shrink_to_fit();

  // ---- phase 3: per neuron ---------------------------------------------------------------------
  const int64_t mean_active = I ? start[I] / I + 1 : 1;
  parallel_for(
      I,
      [&](int64_t j0, int64_t j1) {
        std::vector<Acc> dwg(static_cast<size_t>(H)), dwu(static_cast<size_t>(H)),
            dwd(static_cast<size_t>(H));
        for (int64_t j = j0; j < j1; ++j) {
          std::fill(dwg.begin(), dwg.end(), Acc(0));
          std::fill(dwu.begin(), dwu.end(), Acc(0));
          std::fill(dwd.begin(), dwd.end(), Acc(0));
          for (int64_t k = start[j]; k < start[j + 1]; ++k) {
            const ActiveEntry<Acc>& e = by_neuron[k];
            const Acc* xm = in.x.data() + e.index * H;
            if (!grads.dwd.empty()) detail::axpy(dwd.data(), e.h, in.dy.data() + e.index * H, H);
            if (!grads.dwu.empty()) detail::axpy(dwu.data(), e.du, xm, H);
            if (!grads.dwg.empty()) detail::axpy(dwg.data(), e.dg, xm, H);
          }
          if (!grads.dwd.empty()) detail::store_row(grads.dwd, j, dwd.data());
          if (!grads.dwu.empty()) detail::store_row(grads.dwu, j, dwu.data());
          if (!grads.dwg.empty()) detail::store_row(grads.dwg, j, dwg.data());
        }
      },
      mean_active * H * 3 + H);
}

}  // namespace

void ffn_backward(const TensorView& x, const FfnWeights& w, const TensorView& dy, double l1_coeff,
                  const FfnGrads& grads, Precision p) {
  const char* op = "ffn_backward";
  const FfnDims d = detail::check_ffn_inputs(op, x, w, /*host=*/true);
  const std::initializer_list<DType> grad_types = {DType::f32, DType::f64};
  detail::check_precision(op, p);
  detail::check_input(op, "dy", dy, {d.M, d.H}, {DType::bf16, DType::f32, DType::f64}, true);
  check_optional(grads.dx, "ffn_backward: grads.dx");
  check_optional(grads.dwg, "ffn_backward: grads.dwg");
  check_optional(grads.dwu, "ffn_backward: grads.dwu");
  check_optional(grads.dwd, "ffn_backward: grads.dwd");
  if (!grads.dx.empty())
    detail::check_output(op, "grads.dx", grads.dx, {d.M, d.H}, grad_types, true);
  if (!grads.dwu.empty())
    detail::check_output(op, "grads.dwu", grads.dwu, {d.I, d.H}, grad_types, true);
  if (!grads.dwd.empty())
    detail::check_output(op, "grads.dwd", grads.dwd, {d.I, d.H}, grad_types, true);
  if (w.gated()) {
    if (!grads.dwg.empty())
      detail::check_output(op, "grads.dwg", grads.dwg, {d.I, d.H}, grad_types, true);
  } else {
    TWELL_REQUIRE(grads.dwg.empty(), op, ": grads.dwg: expected an empty view for a non-gated FFN ",
                  "(w.wg is empty), got shape ", shape_str(grads.dwg.shape));
  }
  check_l1_coefficient(l1_coeff, op);
  check_ffn_grads_disjoint(op, x, w, dy, grads);

  auto run = [&](auto acc_tag) {
    using Acc = decltype(acc_tag);
    const std::vector<Acc> xa = detail::to_acc<Acc>(x), dya = detail::to_acc<Acc>(dy);
    const BackwardInputs<Acc> in{
        xa, dya, d, w.gated(), Rounding<Acc>{p}, static_cast<Acc>(l1_coeff)};
    detail::with_weight_rows<Acc>(w, [&](const auto& rows) { backward(in, rows, grads); });
  };
  if (p == Precision::f64) {
    run(double{});
  } else {
    run(float{});
  }
}

}  // namespace twell::cpu
