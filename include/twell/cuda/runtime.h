// CUDA runtime helpers of the public API: error checks that throw twell::Error, device queries,
// and RAII device memory. Every twell CUDA entry point takes the caller's stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "twell/error.h"
#include "twell/tensor.h"

namespace twell::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace twell::cuda

// Throws twell::Error with the expression, file:line, and CUDA's error name and message.
#define TWELL_CUDA_CHECK(expr)                                                              \
  do {                                                                                      \
    cudaError_t twell_err_ = (expr);                                                        \
    if (twell_err_ != cudaSuccess) ::twell::cuda::throw_cuda_error(twell_err_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace twell::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;
  size_t global_mem_bytes = 0;
};

DeviceInfo device_info(int device = -1);  // -1: the current device

// The current device's free and total memory (cudaMemGetInfo).
struct DeviceMemory {
  size_t free = 0, total = 0;
  std::string str() const;  // for messages: "1.2 GB of 150.0 GB free"
};
DeviceMemory device_memory();

// Refuses a tensor whose memory is not the current GPU's (host memory, pageable or pinned, tagged
// Device::cuda, or another GPU's), naming `name`: a kernel reading it would fault, and a fault ends
// the CUDA context of the whole process. Managed memory passes. Nothing for a tensor of no elements
// or none given (no data).
void check_on_current_gpu(const TensorView& t, const char* name);

// True when a GPU this build can run on (compute capability 9.0, sm_90a code) is present;
// otherwise `why` says what is missing.
bool hopper_available(std::string* why = nullptr);

namespace detail {
void free_device(void* p);  // cudaFree
void free_pinned(void* p);  // cudaFreeHost

// An allocation of `bytes` bytes that Free releases: movable, freed on destruction unless it was
// borrowed (owns_ false: a piece of memory someone else frees). The buffers below differ only in
// how they allocate.
template <void (*Free)(void*)>
class OwnedBytes {
 public:
  OwnedBytes() = default;
  ~OwnedBytes() {
    if (ptr_ && owns_) Free(ptr_);
  }
  OwnedBytes(OwnedBytes&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), owns_(std::exchange(o.owns_, true)) {}
  OwnedBytes& operator=(OwnedBytes&& o) noexcept {
    if (this != &o) {
      if (ptr_ && owns_) Free(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      owns_ = std::exchange(o.owns_, true);
    }
    return *this;
  }
  OwnedBytes(const OwnedBytes&) = delete;
  OwnedBytes& operator=(const OwnedBytes&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 protected:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool owns_ = true;
};
}  // namespace detail

// Owning device allocation (cudaMalloc), movable, freed on destruction.
class DeviceBuffer : public detail::OwnedBytes<&detail::free_device> {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  // `bytes` bytes at `ptr` (device memory someone else owns, e.g. a piece of a caller's
  // workspace): the same interface, never freed by this object.
  static DeviceBuffer borrow(void* ptr, size_t bytes);
};

// Scratch for the work of one call on one stream: taken from a pool of the current device
// (cudaMallocFromPoolAsync) on `stream`, given back on that stream when destroyed (cudaFreeAsync),
// so the work queued before then still has it. The pool keeps what is given back (no release
// threshold): the next call on the stream, of this object or another (a model's layers), takes
// the same memory without a synchronisation, and the pool holds the largest call's need, not one
// buffer an object. Not movable (it frees on its stream).
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream);
  ~StreamScratch();
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// Gives the memory the current device's StreamScratch pool keeps back to the driver (what is not in
// use); synchronises the device first, so that every scratch given back is free.
void release_scratch();

// Where an object's device buffers come from: pieces of a caller's memory, each rounded up to
// kAlign bytes (so each starts kAlign-aligned where the memory does), as borrowed DeviceBuffers; or,
// default-constructed, an allocation of its own for each piece (so that compute-sanitizer sees each
// buffer's bounds). used() counts the rounded pieces either way: the same total for one plan.
class DeviceArena {
 public:
  static constexpr size_t kAlign = 256;
  static constexpr size_t piece(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  DeviceArena() = default;  // each piece allocated
  DeviceArena(void* base, size_t bytes) : base_(static_cast<char*>(base)), bytes_(bytes), carve_(true) {}
  // The next piece of `bytes` bytes (none for 0); throws, naming `what`, if the memory is too short.
  DeviceBuffer take(size_t bytes, const char* what);
  size_t used() const { return used_; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0, used_ = 0;
  bool carve_ = false;
};

// Owning page-locked host allocation (cudaHostAlloc with `flags`), movable, freed on destruction:
// what copies and kernels write to the host through, without a staging copy of their own.
class PinnedBuffer : public detail::OwnedBytes<&detail::free_pinned> {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes, unsigned int flags = cudaHostAllocDefault);
  // Makes room for at least `bytes` (cudaHostAllocDefault), the old contents dropped; no-op when
  // there is room already. The old allocation is freed first.
  void reserve(size_t bytes);
};

// Owning device tensor: a DeviceBuffer with a dtype and shape.
class DeviceTensor {
 public:
  DeviceTensor() : view_(nullptr, DType::bf16, {0}, Device::cuda) {}  // empty: no data, shape [0]
  DeviceTensor(DType t, Shape s);  // uninitialised (Tensor's are zeroed); throws for a bad shape
  // A moved-from tensor is empty (no data, shape [0]), not a view of memory it no longer owns.
  DeviceTensor(DeviceTensor&& other) noexcept : buf_(std::move(other.buf_)), view_(std::move(other.view_)) {
    other.view_ = TensorView(nullptr, view_.dtype, {0}, Device::cuda);
  }
  DeviceTensor& operator=(DeviceTensor&& other) noexcept {
    buf_ = std::move(other.buf_);
    view_ = std::move(other.view_);
    other.view_ = TensorView(nullptr, view_.dtype, {0}, Device::cuda);
    return *this;
  }
  static DeviceTensor upload(const TensorView& host, cudaStream_t stream = nullptr);  // synchronous
  Tensor download(cudaStream_t stream = nullptr) const;                              // synchronous

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  template <class T>
  T* ptr() const {
    return view_.ptr<T>();
  }
  size_t nbytes() const { return view_.nbytes(); }

 private:
  DeviceBuffer buf_;
  TensorView view_;
};

// Fills a device buffer with a byte pattern (to poison outputs before a kernel runs).
void fill_bytes(void* ptr, size_t bytes, uint8_t value, cudaStream_t stream);

}  // namespace twell::cuda
