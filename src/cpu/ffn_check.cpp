// Argument checks of the FFN ops: twell::check_ffn_args (backend-independent, include/twell/ffn.h)
// and the helpers the CPU ops use. Every message names the argument and says what was expected
// and what was given, e.g. "ffn_forward: w.wd: expected shape [300, 67], got [300, 66]".
// clang-format off
#include "cpu/fp_contract_off.h"  // must come first, see there
// clang-format on

#include <initializer_list>

#include "cpu/ffn_common.h"
#include "twell/error.h"
#include "twell/ffn.h"

namespace twell {
namespace cpu::detail {

namespace {

constexpr std::initializer_list<DType> kFloatTypes = {DType::bf16, DType::f32, DType::f64};

std::string where(const char* op, const char* name) {
  return str(op, ": ", name);
}

void check_matrix(const char* op, const char* name, const TensorView& t, const Shape& expected,
                  std::initializer_list<DType> allowed, bool host) {
  const std::string n = where(op, name);
  // No data is fine for no elements (M = 0: PyTorch's data_ptr() of an empty tensor is null); a
  // default view (TensorView{}, shape [0]) is missing.
  TWELL_REQUIRE(!t.empty() || (t.rank() == 2 && t.numel() == 0), n, ": missing (null data), expected a tensor of shape ",
                shape_str(expected));
  check_shape(t, expected, n.c_str());
  check_dtype(t, allowed, n.c_str());
  if (host) check_device(t, Device::cpu, n.c_str());
}

}  // namespace

FfnDims check_ffn_inputs(const char* op, const TensorView& x, const FfnWeights& w, bool host) {
  TWELL_REQUIRE(!x.empty() || (x.rank() == 2 && x.numel() == 0), op, ": x: missing (null data), expected a tensor [M, H]");
  TWELL_REQUIRE(x.rank() == 2, op, ": x: expected a 2-d tensor [M, H], got shape ",
              shape_str(x.shape));
  TWELL_REQUIRE(!w.wu.empty() || (w.wu.rank() == 2 && w.wu.numel() == 0), op,
                ": w.wu: missing (null data), expected a tensor [I, H]");
  TWELL_REQUIRE(w.wu.rank() == 2, op, ": w.wu: expected a 2-d tensor [I, H], got shape ",
              shape_str(w.wu.shape));
  const int64_t M = x.shape[0], H = x.shape[1], I = w.wu.shape[0];
  TWELL_REQUIRE(M >= 0, op, ": x: expected M >= 0 tokens, got shape ", shape_str(x.shape));
  TWELL_REQUIRE(H >= 1, op, ": x: expected H >= 1, got shape ", shape_str(x.shape));
  TWELL_REQUIRE(I >= 1, op, ": w.wu: expected I >= 1, got shape ", shape_str(w.wu.shape));
  TWELL_REQUIRE(w.wu.shape[1] == H, op, ": x is ", shape_str(x.shape), ", w.wu ", shape_str(w.wu.shape),
                ": their widths H (", H, " and ", w.wu.shape[1], ") differ");
  check_matrix(op, "x", x, {M, H}, kFloatTypes, host);
  check_matrix(op, "w.wu", w.wu, {I, H}, kFloatTypes, host);
  check_matrix(op, "w.wd", w.wd, {I, H}, {w.wu.dtype}, host);
  check_optional(w.wg, where(op, "w.wg (empty for a non-gated FFN)").c_str());
  if (w.gated()) check_matrix(op, "w.wg", w.wg, {I, H}, {w.wu.dtype}, host);
  return {M, H, I};
}

void check_input(const char* op, const char* name, const TensorView& t, const Shape& expected,
                 std::initializer_list<DType> allowed, bool host) {
  check_matrix(op, name, t, expected, allowed, host);
}

void check_output(const char* op, const char* name, const TensorView& t, const Shape& expected,
                  std::initializer_list<DType> allowed, bool host) {
  check_matrix(op, name, t, expected, allowed, host);
  TWELL_REQUIRE(!overlaps_itself(t), op, ": ", name, ": strides [", t.stride(0), ", ", t.stride(1), "] of shape ",
                shape_str(t.shape), " put elements in the same memory: an output must hold each value apart");
}

void check_precision(const char* op, Precision p) {
  TWELL_REQUIRE(p == Precision::bf16 || p == Precision::h_fp32 || p == Precision::f64, op,
                ": precision must be Precision::bf16, h_fp32 or f64, got the value ", static_cast<int>(p));
}

}  // namespace cpu::detail

void check_ffn_args(const TensorView& x, const FfnWeights& w, const TensorView& y) {
  const auto d = cpu::detail::check_ffn_inputs("ffn", x, w, /*host=*/false);
  cpu::detail::check_output("ffn", "y", y, {d.M, d.H}, cpu::detail::kFloatTypes, /*host=*/false);
}

namespace {

// Throws (from `op`) if one of the first `n_written` views overlaps any other of the `n`: those are
// written while the rest are read. Empty views never overlap.
void check_written_disjoint(const char* op, const TensorView* const* views, const char* const* names, int n_written,
                            int n, const char* why) {
  for (int g = 0; g < n_written; ++g)
    for (int o = 0; o < n; ++o)
      TWELL_REQUIRE(o == g || !memory_overlaps(*views[g], *views[o]), op, ": ", names[g], "'s memory overlaps ", names[o],
                  "'s (", why, ")");
}

}  // namespace

void check_ffn_outputs_disjoint(const char* op, const TensorView& x, const FfnWeights& w, const TensorView& y,
                                const TensorView& h_out) {
  const TensorView* views[] = {&y, &h_out, &x, &w.wg, &w.wu, &w.wd};
  const char* names[] = {"y", "h_out", "x", "w.wg", "w.wu", "w.wd"};
  check_written_disjoint(op, views, names, 2, 6, "an output is written while the inputs are read");
}

void check_ffn_grads_disjoint(const char* op, const TensorView& x, const FfnWeights& w, const TensorView& dy,
                              const FfnGrads& grads) {
  const TensorView* views[] = {&grads.dx, &grads.dwg, &grads.dwu, &grads.dwd, &x, &dy, &w.wg, &w.wu, &w.wd};
  const char* names[] = {"grads.dx", "grads.dwg", "grads.dwu", "grads.dwd", "x", "dy", "w.wg", "w.wu", "w.wd"};
  check_written_disjoint(op, views, names, 4, 9, "a gradient is written while the other arguments are read");
}

}  // namespace twell
