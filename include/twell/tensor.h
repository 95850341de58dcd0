// Tensors: a non-owning view (TensorView) over host or device memory, and an owning host tensor
// (Tensor) with 64-byte aligned storage. Shapes are row-major; strides are in elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "twell/bf16.h"
#include "twell/error.h"

namespace twell {

enum class DType : uint8_t { bf16, f16, f32, f64, u8, i32, u32, i64 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
bool dtype_is_float(DType t);  // bf16, f16, f32 or f64
// Parses the names used by safetensors ("BF16", "F32", ...) and by us ("bf16", "f32", ...).
DType dtype_from_name(const std::string& name);

template <class T> struct dtype_of;
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<uint32_t> { static constexpr DType value = DType::u32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);
// The bytes a contiguous tensor of this dtype and shape takes; throws an Error for a negative
// dimension, or a size past 2^62 bytes (which no allocation could hold: a product that overflows).
size_t checked_nbytes(DType t, const Shape& s);

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape{0};  // default-constructed: no data, shape [0], no elements (as an empty Tensor's view)
  Shape strides;   // elements; empty means contiguous row-major
  Device device = Device::cpu;

  TensorView() = default;
  TensorView(void* d, DType t, Shape s, Device dev = Device::cpu)
      : data(d), dtype(t), shape(std::move(s)), device(dev) {}

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t size(int dim) const;
  int64_t stride(int dim) const;
  bool is_contiguous() const;
  bool empty() const { return data == nullptr; }

  // Typed pointer; throws if T does not match the dtype.
  template <class T>
  T* ptr() const {
    TWELL_CHECK(dtype_of<T>::value == dtype, "tensor holds ", dtype_name(dtype), ", accessed as ",
                dtype_name(dtype_of<T>::value));
    return static_cast<T*>(data);
  }
};

// Whether two views may share a byte: exact for views of rows (rank 1 with unit stride, rank 2 with
// unit column stride, any contiguous view), whatever their pitches (the two column halves of one
// buffer are apart); for other strides (negative ones too) whether their spans meet. Conservative:
// true where it cannot tell. Views without data or of no elements never overlap; views on
// different devices are taken as disjoint.
bool memory_overlaps(const TensorView& a, const TensorView& b);

// Precondition checks with messages that say what was expected and what was given.
void check_shape(const TensorView& t, const Shape& expected, const char* name);
void check_dtype(const TensorView& t, DType expected, const char* name);
void check_dtype(const TensorView& t, std::initializer_list<DType> allowed, const char* name);
void check_device(const TensorView& t, Device expected, const char* name);
void check_contiguous(const TensorView& t, const char* name);
void check_aligned(const TensorView& t, size_t alignment, const char* name);
// An optional argument is either given (data) or left out (no data and no elements: TensorView{}).
// Throws where `t` has a shape with elements but no data: a tensor meant to be given was not.
void check_optional(const TensorView& t, const char* name);
// True where two elements of `t` share memory (a stride 0, or rows that run into each other):
// writing it would lose values. Conservative for interleaved strides, which it counts as overlapping.
bool overlaps_itself(const TensorView& t);

// Owning, contiguous host tensor.
class Tensor {
 public:
  // Empty: no data, shape [0], no bytes (as a moved-from tensor).
  Tensor() : view_(nullptr, DType::f32, {0}) {}
  Tensor(DType t, Shape s);  // zero-initialised; throws for a negative or overflowing shape
  // A moved-from tensor is empty (no data, shape [0], no bytes), not a view of memory it no longer
  // owns.
  Tensor(Tensor&& other) noexcept : storage_(std::move(other.storage_)), view_(std::move(other.view_)) {
    other.view_ = TensorView(nullptr, view_.dtype, {0});
  }
  Tensor& operator=(Tensor&& other) noexcept {
    storage_ = std::move(other.storage_);
    view_ = std::move(other.view_);
    other.view_ = TensorView(nullptr, view_.dtype, {0});
    return *this;
  }

  template <class T>
  static Tensor of(Shape s) {
    return Tensor(dtype_of<T>::value, std::move(s));
  }
  // Deep copy of any host view (made contiguous).
  static Tensor copy_of(const TensorView& v);
  Tensor clone() const { return copy_of(view_); }

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  template <class T>
  T* ptr() const {
    return view_.ptr<T>();
  }
  DType dtype() const { return view_.dtype; }
  const Shape& shape() const { return view_.shape; }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  bool empty() const { return view_.empty(); }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> storage_;
  TensorView view_;
};

// Element read/write through any float dtype, for tests and the reference backend's I/O.
double load_as_double(const TensorView& t, int64_t flat_index);
void store_from_double(const TensorView& t, int64_t flat_index, double v);

// ‖out − ref‖₂ / ‖ref‖₂ over all elements of two host tensors of the same shape (any dtypes),
// in double. A non-finite value in either gives +inf, so NaN never passes a tolerance; two zero
// tensors give 0. The error measure of every correctness check (tests and benchmarks).
double relative_error(const TensorView& out, const TensorView& ref);

// Copies a host tensor of any float dtype to a contiguous float/double vector.
std::vector<float> to_f32(const TensorView& t);
std::vector<double> to_f64(const TensorView& t);

}  // namespace twell
