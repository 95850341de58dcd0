#include "twell/cuda/runtime.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/kernels.h"

namespace twell::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  throw Error(str("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", expr, " (",
                  base ? base + 1 : file, ":", line, ")"));
}

DeviceInfo device_info(int device) {
  if (device < 0) TWELL_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp p{};
  TWELL_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceInfo d;
  d.index = device;
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  d.l2_bytes = static_cast<size_t>(p.l2CacheSize);
  d.smem_per_block_optin = p.sharedMemPerBlockOptin;
  d.global_mem_bytes = p.totalGlobalMem;
  return d;
}

DeviceMemory device_memory() {
  DeviceMemory m;
  TWELL_CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
  return m;
}

std::string DeviceMemory::str() const { return twell::str(bytes_str(free), " of ", bytes_str(total), " free"); }

void check_on_current_gpu(const TensorView& t, const char* name) {
  if (t.empty() || t.numel() == 0) return;
  cudaPointerAttributes a{};
  TWELL_CUDA_CHECK(cudaPointerGetAttributes(&a, t.data));
  TWELL_REQUIRE(a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged, name, ": tagged as GPU memory, "
                "but its address is ", a.type == cudaMemoryTypeHost ? "pinned host memory" : "host memory",
                " (a host tensor passed as a device one?)");
  int device = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&device));
  TWELL_REQUIRE(a.type == cudaMemoryTypeManaged || a.device == device, name, ": its memory is GPU ", a.device,
                "'s, and the current device is GPU ", device);
}

bool hopper_available(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    int driver = 0;
    if (why) {
      if (err == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0)
        *why = "no NVIDIA driver is installed, so no GPU to run on";  // what CUDA calls an insufficient driver
      else
        *why = err != cudaSuccess ? str("no CUDA device (", cudaGetErrorString(err), ")") : "no CUDA device";
    }
    cudaGetLastError();  // clear the sticky-free error state
    return false;
  }
  const DeviceInfo d = device_info();
  if (d.cc_major != 9 || d.cc_minor != 0) {
    if (why) *why = str(d.name, " has compute capability ", d.cc_major, ".", d.cc_minor, "; twell's kernels need 9.0 (Hopper)");
    return false;
  }
  return true;
}

void detail::free_device(void* p) { cudaFree(p); }
void detail::free_pinned(void* p) { cudaFreeHost(p); }

namespace {
// Throws for a failed allocation of `bytes` (`what`: "" or " of scratch"): out of memory, with the
// GPU's free memory where it can be read (not sticky: the context stays usable), or the CUDA error.
void check_allocation(cudaError_t err, size_t bytes, const char* what) {
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    std::string free_now;
    try {
      free_now = str(", ", device_memory().str(), " on the GPU");
    } catch (const Error&) {  // then without it
    }
    throw Error(str("CUDA out of memory: ", bytes_str(bytes), what, " asked for", free_now));
  }
  TWELL_CUDA_CHECK(err);
}
}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes) check_allocation(cudaMalloc(&ptr_, bytes), bytes, "");
  bytes_ = bytes;
}

namespace {
// twell's stream-ordered pool of the current device, created at its first use: apart from the
// device's default pool (which a framework may configure), keeping what is freed to it.
cudaMemPool_t scratch_pool() {
  static std::mutex mutex;
  static std::vector<cudaMemPool_t> pools;
  int device = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (pools.size() <= static_cast<size_t>(device)) pools.resize(static_cast<size_t>(device) + 1, nullptr);
  cudaMemPool_t& pool = pools[static_cast<size_t>(device)];
  if (!pool) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    TWELL_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    uint64_t keep = UINT64_MAX;
    TWELL_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  return pool;
}
}  // namespace

void release_scratch() {
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  TWELL_CUDA_CHECK(cudaMemPoolTrimTo(scratch_pool(), 0));
}

StreamScratch::StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (!bytes) return;
  const cudaError_t err = cudaMallocFromPoolAsync(&ptr_, bytes, scratch_pool(), stream);
  check_allocation(err, bytes, " of scratch");
}

StreamScratch::~StreamScratch() {
  if (ptr_) cudaFreeAsync(ptr_, stream_);
}

DeviceBuffer DeviceBuffer::borrow(void* ptr, size_t bytes) {
  DeviceBuffer b;
  b.ptr_ = ptr;
  b.bytes_ = bytes;
  b.owns_ = false;
  return b;
}

DeviceBuffer DeviceArena::take(size_t bytes, const char* what) {
  if (bytes == 0) return DeviceBuffer();
  if (!carve_) {
    DeviceBuffer b(bytes);
    used_ += piece(bytes);
    return b;
  }
  TWELL_CHECK(bytes <= bytes_ - used_ && piece(bytes) <= bytes_ - used_, "workspace too small: ", what, " needs ", bytes,
              " bytes at offset ", used_, " of ", bytes_);
  DeviceBuffer b = DeviceBuffer::borrow(base_ + used_, bytes);
  used_ += piece(bytes);
  return b;
}

PinnedBuffer::PinnedBuffer(size_t bytes, unsigned int flags) {
  if (bytes) TWELL_CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, flags));
  bytes_ = bytes;
}

void PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  *this = PinnedBuffer();
  *this = PinnedBuffer(bytes);
}

DeviceTensor::DeviceTensor(DType t, Shape s) {
  view_ = TensorView(nullptr, t, std::move(s), Device::cuda);
  buf_ = DeviceBuffer(checked_nbytes(t, view_.shape));
  view_.data = buf_.get();
}

DeviceTensor DeviceTensor::upload(const TensorView& host, cudaStream_t stream) {
  check_device(host, Device::cpu, "DeviceTensor::upload");
  check_contiguous(host, "DeviceTensor::upload");
  DeviceTensor d(host.dtype, host.shape);
  TWELL_CUDA_CHECK(cudaMemcpyAsync(d.view_.data, host.data, host.nbytes(), cudaMemcpyHostToDevice, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

Tensor DeviceTensor::download(cudaStream_t stream) const {
  Tensor h(view_.dtype, view_.shape);
  TWELL_CUDA_CHECK(cudaMemcpyAsync(h.view().data, view_.data, view_.nbytes(), cudaMemcpyDeviceToHost, stream));
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

void fill_bytes(void* ptr, size_t bytes, uint8_t value, cudaStream_t stream) {
  TWELL_CUDA_CHECK(cudaMemsetAsync(ptr, value, bytes, stream));
}

void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> limit;  // (kernel, device) -> the limit set
  int device = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  int& set = limit[{kernel, device}];  // 0: not set yet
  // NOTE: raised whenever a launch needs more than the limit set so far. Setting it once, at the
  // first call's size, made a later, larger launch of the same kernel fail (cudaErrorInvalidValue).
  if (bytes <= set) return;
  TWELL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  set = bytes;
}

namespace {
std::mutex cluster_mutex;                                      // the two below, and the attribute's setting
std::set<std::pair<const void*, int>> non_portable_allowed;  // (kernel, device) allow_non_portable_clusters set
}  // namespace

void allow_non_portable_clusters(const void* kernel) {
  int device = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(cluster_mutex);
  if (non_portable_allowed.count({kernel, device})) return;
  TWELL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  non_portable_allowed.insert({kernel, device});
}

int max_cluster_blocks(const void* kernel, int threads, int largest) {
  // (kernel, device, threads, largest, allowed past 8) -> blocks: an answer from before
  // allow_non_portable_clusters is not the answer after it.
  static std::map<std::tuple<const void*, int, int, int, bool>, int> known;
  int device = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(cluster_mutex);
  const bool allowed = non_portable_allowed.count({kernel, device}) > 0;  // the attribute is set only there
  const auto key = std::make_tuple(kernel, device, threads, largest, allowed);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  // Past 8 (the portable limit) only where allowed: asking for more fails, and a failed query is an error
  // compute-sanitizer reports.
  if (!allowed) largest = std::min(largest, 8);
  bool answered = false;  // some query answered: the result is the device's, kept (else asked again next time)
  int blocks = 1;
  for (int n = largest; n > 1; --n) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(1, 1, static_cast<unsigned>(n));
    config.blockDim = dim3(static_cast<unsigned>(threads));
    cudaLaunchAttribute cluster = {};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = static_cast<unsigned>(n);
    config.attrs = &cluster;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
      cudaGetLastError();  // not sticky (a size past the kernel's limit, say): clear it and try a smaller cluster
      continue;
    }
    answered = true;
    if (clusters >= 1) {
      blocks = n;
      break;
    }
  }
  if (answered) known.emplace(key, blocks);
  return blocks;
}

}  // namespace twell::cuda
