// twell_unpack: TwELL (packed + spilled tiles) -> dense bf16 [rows, cols].
// One warp per (row, tile): zero the tile's columns, then scatter the packed entries, or copy the
// dense backup tile. Covered by tests/cuda/test_twell_device.cu.
#include "twell/cuda/twell_device.h"

namespace twell::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void twell_unpack_kernel(const TwellDeviceView m, uint16_t* __restrict__ dense) {
  const TwellLayout& l = m.layout;
  const int64_t tile_id = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (tile_id >= l.count_size()) return;
  const int lane = threadIdx.x % 32;
  const int64_t n_tiles = l.n_tiles();
  const int64_t row = tile_id / n_tiles, t = tile_id % n_tiles;
  const int32_t width = l.tile_width(t);
  uint16_t* out = dense + row * l.cols + t * l.tile;
  const uint32_t count = m.counts[tile_id];
  const uint32_t* words = m.slots + tile_id * l.slots();
  if (twell_is_spilled(l, count)) {
    // A backup index past the backup: never filled (a matrix not packed yet). Zeros, as an empty tile, rather
    // than a read out of bounds or the output's old values.
    const bool filled = words[0] < m.backup_capacity;
    const uint16_t* src = m.backup + (filled ? static_cast<int64_t>(words[0]) * l.tile : 0);
    for (int c = lane; c < width; c += 32) out[c] = filled ? src[c] : uint16_t{0};
    return;
  }
  for (int c = lane; c < width; c += 32) out[c] = 0;
  __syncwarp();
  for (uint32_t k = lane; k < count; k += 32) {
    const uint32_t col = twell_entry_col(words[k]);
    if (col < static_cast<uint32_t>(width)) out[col] = twell_entry_value_bits(words[k]);  // never outside the tile
  }
}

}  // namespace

void twell_unpack(const TwellDeviceView& m, const TensorView& dense, cudaStream_t stream) {
  check_device(dense, Device::cuda, "twell_unpack: dense");
  check_dtype(dense, DType::bf16, "twell_unpack: dense");
  check_contiguous(dense, "twell_unpack: dense");
  check_shape(dense, {m.layout.rows, m.layout.cols}, "twell_unpack: dense");
  const int64_t tiles = m.layout.count_size();
  if (tiles == 0) return;
  const int64_t blocks = (tiles + kWarpsPerBlock - 1) / kWarpsPerBlock;
  twell_unpack_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(
      m, static_cast<uint16_t*>(dense.data));
  TWELL_CUDA_CHECK(cudaGetLastError());
}

namespace {
int64_t backup_cap(const TwellLayout& layout, int64_t backup_capacity) {
  return backup_capacity < 0 ? layout.count_size() : backup_capacity;
}
// The pieces, in the order they are carved: counts, slots, backup, backup owners, the counter.
size_t piece_bytes(const TwellLayout& l, int64_t cap, int i) {
  const int64_t n[5] = {l.count_size() * 4, l.slot_size() * 4, cap * l.tile * 2, cap * 4, 4};
  return static_cast<size_t>(n[i]);
}
}  // namespace

size_t TwellDeviceMatrix::bytes_for(const TwellLayout& layout, int64_t backup_capacity) {
  layout.check();
  const int64_t cap = backup_cap(layout, backup_capacity);
  size_t total = 0;
  for (int i = 0; i < 5; ++i) total += DeviceArena::piece(piece_bytes(layout, cap, i));
  return total;
}

TwellDeviceMatrix::TwellDeviceMatrix(const TwellLayout& layout, int64_t backup_capacity)
    : TwellDeviceMatrix(layout, backup_capacity, DeviceArena()) {
  TWELL_CUDA_CHECK(cudaMemset(view_.n_backup, 0, sizeof(uint32_t)));
  // cudaMemset returns before it runs, on the legacy stream: done before a caller's non-blocking
  // stream, which does not wait for that stream, uses the matrix.
  TWELL_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

TwellDeviceMatrix::TwellDeviceMatrix(const TwellLayout& layout, int64_t backup_capacity, void* memory)
    : TwellDeviceMatrix(layout, backup_capacity, [&] {
        TWELL_CHECK(memory, "TwellDeviceMatrix: memory is null (the constructor without it allocates)");
        TWELL_CHECK(reinterpret_cast<uintptr_t>(memory) % DeviceArena::kAlign == 0, "TwellDeviceMatrix: memory must be ",
                    DeviceArena::kAlign, "-byte aligned");
        return DeviceArena(memory, bytes_for(layout, backup_capacity));
      }()) {}

TwellDeviceMatrix::TwellDeviceMatrix(const TwellLayout& layout, int64_t backup_capacity, DeviceArena arena) {
  layout.check();
  const int64_t cap = backup_cap(layout, backup_capacity);
  DeviceBuffer* piece[5] = {&counts_, &slots_, &backup_, &backup_owner_, &n_backup_};
  for (int i = 0; i < 5; ++i) *piece[i] = arena.take(piece_bytes(layout, cap, i), "TwELL matrix");
  bytes_ = arena.used();
  view_ = {layout, counts_.as<uint32_t>(), slots_.as<uint32_t>(), backup_.as<uint16_t>(),
           backup_owner_.as<uint32_t>(), n_backup_.as<uint32_t>(), cap};
}

TwellDeviceMatrix TwellDeviceMatrix::upload(const TwellMatrix& m, cudaStream_t stream) {
  twell_validate(m);  // the kernels trust the format: sizes, columns and backup indices
  TwellDeviceMatrix d(m.layout, m.n_backup());
  auto copy = [&](void* dst, const void* src, size_t bytes) {
    if (bytes) TWELL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  };
  copy(d.view_.counts, m.counts.data(), m.counts.size() * sizeof(uint32_t));
  copy(d.view_.slots, m.slots.data(), m.slots.size() * sizeof(uint32_t));
  copy(d.view_.backup, m.backup.data(), m.backup.size() * sizeof(uint16_t));
  copy(d.view_.backup_owner, m.backup_owner.data(), m.backup_owner.size() * sizeof(uint32_t));
  const uint32_t n = static_cast<uint32_t>(m.n_backup());
  copy(d.view_.n_backup, &n, sizeof n);
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

TwellMatrix TwellDeviceMatrix::download(cudaStream_t stream) const {
  const TwellLayout& l = view_.layout;
  uint32_t n = 0;
  TWELL_CUDA_CHECK(cudaMemcpyAsync(&n, view_.n_backup, sizeof n, cudaMemcpyDeviceToHost, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  TWELL_CHECK(n <= view_.backup_capacity, "TwELL: ", n, " tiles spilled but the backup holds only ",
              view_.backup_capacity);
  TwellMatrix m;
  m.layout = l;
  m.counts.resize(l.count_size());
  m.slots.resize(l.slot_size());
  m.backup.resize(static_cast<size_t>(n) * l.tile);
  m.backup_owner.resize(n);
  auto copy = [&](void* dst, const void* src, size_t bytes) {
    if (bytes) TWELL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  };
  copy(m.counts.data(), view_.counts, m.counts.size() * sizeof(uint32_t));
  copy(m.slots.data(), view_.slots, m.slots.size() * sizeof(uint32_t));
  copy(m.backup.data(), view_.backup, m.backup.size() * sizeof(uint16_t));
  copy(m.backup_owner.data(), view_.backup_owner, m.backup_owner.size() * sizeof(uint32_t));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return m;
}

}  // namespace twell::cuda
