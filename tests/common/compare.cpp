#include "common/compare.h"

#include <cmath>
#include <cstring>

namespace twell::test {

static std::string where(const TensorView& t, int64_t flat) {
  if (t.rank() != 2) return str("[", flat, "]");
  return str("(row ", flat / t.shape[1], ", col ", flat % t.shape[1], ")");
}

testing::AssertionResult all_close(const TensorView& out, const TensorView& ref, double atol,
                                   double rtol, int max_report) {
  if (out.shape != ref.shape)
    return testing::AssertionFailure() << "shape " << shape_str(out.shape) << " vs reference "
                                       << shape_str(ref.shape);
  int64_t bad = 0;
  double worst = 0;
  std::string report;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    double a = load_as_double(out, i), r = load_as_double(ref, i);
    double err = std::abs(a - r);
    bool ok = err <= atol + rtol * std::abs(r);  // false for NaN
    if (ok) continue;
    if (bad < max_report) report += str("\n  ", where(ref, i), ": got ", a, ", expected ", r, " (|diff| ", err, ")");
    ++bad;
    if (!(err <= worst)) worst = err;
  }
  if (bad == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << bad << " of " << ref.numel() << " elements differ (atol " << atol
                                     << ", rtol " << rtol << ", worst |diff| " << worst << "):" << report;
}

testing::AssertionResult bit_equal(const TensorView& out, const TensorView& ref, int max_report) {
  if (out.shape != ref.shape || out.dtype != ref.dtype)
    return testing::AssertionFailure() << "shape/dtype " << shape_str(out.shape) << " " << dtype_name(out.dtype)
                                       << " vs " << shape_str(ref.shape) << " " << dtype_name(ref.dtype);
  const size_t es = dtype_size(ref.dtype);
  const auto* a = static_cast<const uint8_t*>(out.data);
  const auto* b = static_cast<const uint8_t*>(ref.data);
  int64_t bad = 0;
  std::string report;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    if (std::memcmp(a + i * es, b + i * es, es) == 0) continue;
    if (bad < max_report)
      report += str("\n  ", where(ref, i), ": got ", load_as_double(out, i), ", expected ", load_as_double(ref, i));
    ++bad;
  }
  if (bad == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << bad << " of " << ref.numel() << " elements differ bitwise:" << report;
}

}  // namespace twell::test
