#include "twell/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

namespace twell {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::bf16:
    case DType::f16: return 2;
    case DType::f32:
    case DType::i32:
    case DType::u32: return 4;
    case DType::f64:
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  TWELL_FAIL("unknown dtype ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::u32: return "u32";
    case DType::i64: return "i64";
  }
  return "?";
}

bool dtype_is_float(DType t) {
  return t == DType::bf16 || t == DType::f16 || t == DType::f32 || t == DType::f64;
}

DType dtype_from_name(const std::string& name) {
  static const struct {
    const char* ours;
    const char* safetensors;
    DType t;
  } table[] = {{"bf16", "BF16", DType::bf16}, {"f16", "F16", DType::f16}, {"f32", "F32", DType::f32},
               {"f64", "F64", DType::f64},    {"u8", "U8", DType::u8},    {"i32", "I32", DType::i32},
               {"u32", "U32", DType::u32},    {"i64", "I64", DType::i64}};
  for (const auto& e : table)
    if (name == e.ours || name == e.safetensors) return e.t;
  TWELL_FAIL("unknown dtype '", name, "'");
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

size_t checked_nbytes(DType t, const Shape& s) {
  for (int64_t d : s) TWELL_REQUIRE(d >= 0, "negative dimension in shape ", shape_str(s));
  for (int64_t d : s)
    if (d == 0) return 0;  // no elements, whatever the other dimensions
  uint64_t bytes = dtype_size(t);
  for (int64_t d : s)
    TWELL_REQUIRE(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) && bytes <= (uint64_t{1} << 62),
                  "tensor of shape ", shape_str(s), " and dtype ", dtype_name(t), " is too large (past 2^62 bytes)");
  return static_cast<size_t>(bytes);
}

namespace {
// `strides` is either empty (contiguous) or one per dimension.
void check_strides(const TensorView& t) {
  TWELL_CHECK(t.strides.empty() || t.strides.size() == t.shape.size(), "a tensor of shape ", shape_str(t.shape),
              " has ", t.strides.size(), " strides: expected none (contiguous) or ", t.shape.size());
}
}  // namespace

int64_t TensorView::size(int dim) const {
  TWELL_CHECK(dim >= 0 && dim < rank(), "dimension ", dim, " out of range for shape ", shape_str(shape));
  return shape[dim];
}

int64_t TensorView::stride(int dim) const {
  TWELL_CHECK(dim >= 0 && dim < rank(), "dimension ", dim, " out of range for shape ", shape_str(shape));
  check_strides(*this);
  if (!strides.empty()) return strides[dim];
  int64_t s = 1;
  for (int d = rank() - 1; d > dim; --d) s *= shape[d];
  return s;
}

bool TensorView::is_contiguous() const {
  check_strides(*this);
  if (strides.empty()) return true;
  int64_t s = 1;
  for (int d = rank() - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != s) return false;
    s *= shape[d];
  }
  return true;
}

namespace {

// The bytes [lo, hi) a non-empty view's elements lie in, relative to its data pointer, by its strides
// (which may be negative).
std::pair<int64_t, int64_t> byte_span(const TensorView& t) {
  const int64_t e = static_cast<int64_t>(dtype_size(t.dtype));
  int64_t lo = 0, hi = e;
  for (int d = 0; d < t.rank(); ++d) {
    const int64_t reach = (t.shape[d] - 1) * t.stride(d) * e;
    (reach < 0 ? lo : hi) += reach;
  }
  return {lo, hi};
}

// A view as `rows` rows of `width` bytes every `pitch` bytes (pitch ≥ width > 0, or one row): rank 1
// or any contiguous view as one row, rank 2 with unit column stride as its rows; else false.
struct Rows {
  int64_t rows = 1, width = 0, pitch = 0;
};
bool as_rows(const TensorView& t, Rows& r) {
  const int64_t e = static_cast<int64_t>(dtype_size(t.dtype));
  if (t.rank() == 1 && (t.shape[0] == 1 || t.stride(0) == 1)) {
    r = {1, t.shape[0] * e, t.shape[0] * e};
    return true;
  }
  if (t.rank() == 2 && (t.shape[1] == 1 || t.stride(1) == 1)) {
    r = {t.shape[0], t.shape[1] * e, t.stride(0) * e};
    if (r.rows == 1) r.pitch = r.width;
    return r.pitch >= r.width;
  }
  if (t.is_contiguous()) {
    r = {1, static_cast<int64_t>(t.nbytes()), static_cast<int64_t>(t.nbytes())};
    return true;
  }
  return false;
}

}  // namespace

bool memory_overlaps(const TensorView& a, const TensorView& b) {
  if (a.empty() || b.empty() || a.numel() == 0 || b.numel() == 0 || a.device != b.device) return false;  // no byte
  const auto [alo, ahi] = byte_span(a);
  const auto [blo, bhi] = byte_span(b);
  const intptr_t a0 = reinterpret_cast<intptr_t>(a.data), b0 = reinterpret_cast<intptr_t>(b.data);
  if (!(a0 + alo < b0 + bhi && b0 + blo < a0 + ahi)) return false;  // their spans are apart
  // Spans that meet may still be apart where both are rows (x and y as the two column halves of one
  // buffer, a strided y whose rows fall between another's): each row of the view with fewer against
  // the rows of the other that could reach it.
  Rows ra, rb;
  if (!as_rows(a, ra) || !as_rows(b, rb)) return true;  // in doubt, overlapping: the callers refuse
  const bool a_fewer = ra.rows <= rb.rows;
  const Rows& few = a_fewer ? ra : rb;
  const Rows& many = a_fewer ? rb : ra;
  const int64_t few0 = a_fewer ? a0 : b0, many0 = a_fewer ? b0 : a0;
  if (few.rows > (int64_t{1} << 22)) return true;  // too many to look at: taken as overlapping
  auto floor_div = [](int64_t n, int64_t d) { return n >= 0 ? n / d : -((-n + d - 1) / d); };
  for (int64_t i = 0; i < few.rows; ++i) {
    const int64_t lo = few0 + i * few.pitch - many0, hi = lo + few.width;  // bytes [lo, hi) from many's start
    // many's rows j with [j·pitch, j·pitch + width) meeting [lo, hi): j·pitch < hi and j·pitch + width > lo
    const int64_t j_last = std::min(many.rows - 1, floor_div(hi - 1, many.pitch));
    const int64_t j_first = std::max<int64_t>(0, floor_div(lo - many.width, many.pitch) + 1);
    if (j_first <= j_last) return true;
  }
  return false;
}

// The checks of what a caller gave: the message names the argument, so no source location.
void check_shape(const TensorView& t, const Shape& expected, const char* name) {
  TWELL_REQUIRE(t.shape == expected, name, ": expected shape ", shape_str(expected), ", got ",
                shape_str(t.shape));
}

void check_dtype(const TensorView& t, DType expected, const char* name) {
  TWELL_REQUIRE(t.dtype == expected, name, ": expected dtype ", dtype_name(expected), ", got ",
                dtype_name(t.dtype));
}

void check_dtype(const TensorView& t, std::initializer_list<DType> allowed, const char* name) {
  std::string names;
  for (DType d : allowed) {
    if (d == t.dtype) return;
    names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
  }
  throw Error(str(name, ": expected dtype ", names, ", got ", dtype_name(t.dtype)));
}

void check_device(const TensorView& t, Device expected, const char* name) {
  TWELL_REQUIRE(t.device == expected, name, ": expected a ", expected == Device::cpu ? "host" : "device",
                " tensor, got a ", t.device == Device::cpu ? "host" : "device", " tensor");
}

void check_contiguous(const TensorView& t, const char* name) {
  for (int64_t d : t.shape) TWELL_REQUIRE(d >= 0, name, ": negative dimension in shape ", shape_str(t.shape));
  TWELL_REQUIRE(t.is_contiguous(), name, ": expected a contiguous tensor of shape ", shape_str(t.shape));
}

void check_aligned(const TensorView& t, size_t alignment, const char* name) {
  auto addr = reinterpret_cast<uintptr_t>(t.data);
  TWELL_REQUIRE(addr % alignment == 0, name, ": expected ", alignment, "-byte alignment, address is ",
                addr % alignment, " bytes past a boundary");
}

void check_optional(const TensorView& t, const char* name) {
  TWELL_REQUIRE(!t.empty() || t.numel() == 0, name, ": shape ", shape_str(t.shape),
                " but no data (null): pass the tensor's memory, or an empty view (TensorView{}) to leave it out");
}

bool overlaps_itself(const TensorView& t) {
  // Apart when each dimension's stride, smallest first, steps past everything the smaller ones span.
  std::vector<std::pair<int64_t, int64_t>> dims;  // |stride|, size of the dimensions of more than one element
  for (int64_t d = 0; d < t.rank(); ++d) {
    if (t.shape[d] == 0) return false;  // no elements
    if (t.shape[d] > 1) dims.emplace_back(std::llabs(t.stride(d)), t.shape[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements from the lowest to the highest offset of the dimensions so far, inclusive
  for (const auto& [stride, size] : dims) {
    if (stride < span) return true;
    const int64_t room = std::numeric_limits<int64_t>::max() - span;
    span = stride > room / (size - 1) ? std::numeric_limits<int64_t>::max() : span + stride * (size - 1);
  }
  return false;
}

void Tensor::Free::operator()(void* p) const { std::free(p); }

Tensor::Tensor(DType t, Shape s) {
  TensorView v(nullptr, t, std::move(s));
  const size_t bytes = checked_nbytes(t, v.shape);
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  TWELL_REQUIRE(p, "out of host memory allocating ", bytes, " bytes (", shape_str(v.shape), " ", dtype_name(t), ")");
  std::memset(p, 0, rounded ? rounded : 64);
  storage_.reset(p);
  v.data = p;
  view_ = std::move(v);
}

static int64_t strided_offset(const TensorView& t, int64_t flat);

Tensor Tensor::copy_of(const TensorView& v) {
  if (v.empty()) {  // nothing to copy (a default or moved-from tensor's view): empty, of v's dtype
    Tensor t;
    t.view_.dtype = v.dtype;
    return t;
  }
  check_device(v, Device::cpu, "Tensor::copy_of");
  Tensor c(v.dtype, v.shape);
  if (v.is_contiguous()) {
    std::memcpy(c.view_.data, v.data, v.nbytes());
  } else {
    const size_t es = dtype_size(v.dtype);
    for (int64_t i = 0; i < v.numel(); ++i)
      std::memcpy(static_cast<char*>(c.view_.data) + i * es,
                  static_cast<const char*>(v.data) + strided_offset(v, i) * es, es);
  }
  return c;
}

static int64_t strided_offset(const TensorView& t, int64_t flat) {
  if (t.strides.empty()) return flat;
  int64_t off = 0;
  for (int d = t.rank() - 1; d >= 0; --d) {
    off += (flat % t.shape[d]) * t.strides[d];
    flat /= t.shape[d];
  }
  return off;
}

double load_as_double(const TensorView& t, int64_t flat_index) {
  check_device(t, Device::cpu, "tensor");
  int64_t i = strided_offset(t, flat_index);
  switch (t.dtype) {
    case DType::bf16: return bf16_bits_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::f16: return f16_bits_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::f32: return static_cast<const float*>(t.data)[i];
    case DType::f64: return static_cast<const double*>(t.data)[i];
    case DType::u8: return static_cast<const uint8_t*>(t.data)[i];
    case DType::i32: return static_cast<const int32_t*>(t.data)[i];
    case DType::u32: return static_cast<const uint32_t*>(t.data)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(t.data)[i]);
  }
  TWELL_FAIL("unknown dtype");
}

void store_from_double(const TensorView& t, int64_t flat_index, double v) {
  check_device(t, Device::cpu, "tensor");
  int64_t i = strided_offset(t, flat_index);
  switch (t.dtype) {
    case DType::bf16:
      static_cast<uint16_t*>(t.data)[i] = double_to_bf16_bits(v);
      return;
    case DType::f16:
      static_cast<uint16_t*>(t.data)[i] = double_to_f16_bits(v);
      return;
    case DType::f32: static_cast<float*>(t.data)[i] = static_cast<float>(v); return;
    case DType::f64: static_cast<double*>(t.data)[i] = v; return;
    case DType::u8: static_cast<uint8_t*>(t.data)[i] = static_cast<uint8_t>(v); return;
    case DType::i32: static_cast<int32_t*>(t.data)[i] = static_cast<int32_t>(v); return;
    case DType::u32: static_cast<uint32_t*>(t.data)[i] = static_cast<uint32_t>(v); return;
    case DType::i64: static_cast<int64_t*>(t.data)[i] = static_cast<int64_t>(v); return;
  }
}

double relative_error(const TensorView& out, const TensorView& ref) {
  TWELL_CHECK(out.shape == ref.shape, "relative_error: shape ", shape_str(out.shape), " vs reference ",
              shape_str(ref.shape));
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = load_as_double(out, i), r = load_as_double(ref, i);
    if (!std::isfinite(a) || !std::isfinite(r)) return HUGE_VAL;
    num += (a - r) * (a - r);
    den += r * r;
  }
  if (den == 0) return num == 0 ? 0.0 : HUGE_VAL;
  return std::sqrt(num / den);
}

template <class T>
static std::vector<T> to_vector(const TensorView& t) {
  check_device(t, Device::cpu, "tensor");
  std::vector<T> out(static_cast<size_t>(t.numel()));
  if (t.is_contiguous() && t.dtype == DType::bf16) {
    const auto* p = static_cast<const uint16_t*>(t.data);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(bf16_bits_to_float(p[i]));
  } else if (t.is_contiguous() && t.dtype == DType::f32) {
    const auto* p = static_cast<const float*>(t.data);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(p[i]);
  } else {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(load_as_double(t, i));
  }
  return out;
}

std::vector<float> to_f32(const TensorView& t) { return to_vector<float>(t); }
std::vector<double> to_f64(const TensorView& t) { return to_vector<double>(t); }

// IEEE binary16 conversions (host only; used for f16 checkpoints).
float f16_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return bits_float(bits);
}

uint16_t float_to_f16_bits(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u; // overflow (incl. rounding up) -> inf
  if (a < 0x38800000u) {                       // subnormal or zero in half
    if (a < 0x33000000u) return sign;          // rounds to zero
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(a >> 23);  // 14 + (113 - exp)
    uint32_t half = mant >> (shift);
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);  // round to nearest even at bit 13
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

namespace {

// d rounded to float "to odd": truncated toward zero, with the last bit set where that dropped
// anything. A round to nearest even from there to 13 or fewer significant bits is the one from d
// itself (float keeps at least two more bits than bf16 and f16 need, subnormals included).
float round_to_odd_float(double d) {
  const float f = static_cast<float>(d);
  if (!std::isfinite(d) || static_cast<double>(f) == d) return f;
  uint32_t u = float_bits(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) --u;  // one step toward zero (Inf: to FLT_MAX)
  return bits_float(u | 1u);
}

}  // namespace

uint16_t double_to_bf16_bits(double d) { return float_to_bf16_bits(round_to_odd_float(d)); }
uint16_t double_to_f16_bits(double d) { return float_to_f16_bits(round_to_odd_float(d)); }

}  // namespace twell
