// TwELL matrices in device memory (format: twell/formats/twell_format.h), their transfers, and
// device-side unpacking. The backup holds up to `backup_capacity` spilled tiles; `n_backup` is a
// device-side counter that producers advance with atomics.
#pragma once

#include "twell/cuda/runtime.h"
#include "twell/formats/twell_format.h"

namespace twell::cuda {

// Plain pointers for kernels (passed by value).
struct TwellDeviceView {
  TwellLayout layout;
  uint32_t* counts = nullptr;        // [rows * n_tiles]
  uint32_t* slots = nullptr;         // [rows * n_tiles * slots]
  uint16_t* backup = nullptr;        // [backup_capacity * tile] bf16 bits
  uint32_t* backup_owner = nullptr;  // [backup_capacity]
  uint32_t* n_backup = nullptr;      // one counter
  int64_t backup_capacity = 0;
};

class TwellDeviceMatrix {
 public:
  TwellDeviceMatrix() = default;
  // Room for every tile to spill when backup_capacity < 0 (exact at any density); the backup
  // counter zeroed (synchronously).
  TwellDeviceMatrix(const TwellLayout& layout, int64_t backup_capacity = -1);
  // The same over `memory` (not null): device memory of at least bytes_for(layout, backup_capacity)
  // bytes, 256-byte aligned, valid while the matrix is used (not freed by it). Writes nothing there:
  // the producer zeroes the backup counter on its stream before it packs (as FfnForward does).
  TwellDeviceMatrix(const TwellLayout& layout, int64_t backup_capacity, void* memory);
  static size_t bytes_for(const TwellLayout& layout, int64_t backup_capacity = -1);
  // Validates m (twell_validate: throws on a broken invariant, copying nothing), copies it, and
  // synchronises `stream` before returning.
  static TwellDeviceMatrix upload(const TwellMatrix& m, cudaStream_t stream = nullptr);
  // Copies back (synchronous); throws if the producer claimed more backup tiles than it had.
  TwellMatrix download(cudaStream_t stream = nullptr) const;

  const TwellDeviceView& view() const { return view_; }
  const TwellLayout& layout() const { return view_.layout; }
  size_t bytes() const { return bytes_; }  // bytes_for(layout, backup_capacity); 0 when empty

 private:
  // Its pieces, from a DeviceArena: each its own allocation, or carved from the given memory.
  TwellDeviceMatrix(const TwellLayout& layout, int64_t backup_capacity, DeviceArena arena);
  DeviceBuffer counts_, slots_, backup_, backup_owner_, n_backup_;
  TwellDeviceView view_;
  size_t bytes_ = 0;
};

// Writes the dense bf16 [rows, cols] matrix held by `m` into `dense` (device), on `stream`.
void twell_unpack(const TwellDeviceView& m, const TensorView& dense, cudaStream_t stream);

}  // namespace twell::cuda
