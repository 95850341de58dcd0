// CUDA runtime helpers: allow_dynamic_smem raises a kernel's shared memory limit whenever a launch
// needs more than it was given before (it once kept the first call's size, and a later, larger
// launch of the same kernel failed); an allocation beyond the GPU's memory says how much it asked
// for; PinnedBuffer owns, moves and grows page-locked memory that
// copies land in; max_cluster_blocks finds the clusters the device runs.
#include <gtest/gtest.h>

#include "cuda/kernels.h"
#include "gpu_test.h"

namespace twell {
namespace {

__global__ void touch_smem(int* out, int bytes) {
  extern __shared__ int smem[];
  const int n = bytes / 4;
  for (int i = threadIdx.x; i < n; i += blockDim.x) smem[i] = i;
  __syncthreads();
  if (threadIdx.x == 0) *out = smem[n - 1];
}

TEST(CudaRuntime, DynamicSmemLimitGrowsWithTheLargestRequest) {
  TWELL_REQUIRE_HOPPER();
  cuda::DeviceBuffer out(sizeof(int));
  for (int bytes : {1024, 64 * 1024, 32 * 1024, 160 * 1024}) {
    SCOPED_TRACE(bytes);
    cuda::allow_dynamic_smem(reinterpret_cast<const void*>(&touch_smem), bytes);
    touch_smem<<<1, 128, bytes>>>(out.as<int>(), bytes);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    int got = -1;
    ASSERT_EQ(cudaMemcpy(&got, out.get(), sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, bytes / 4 - 1);
  }
}

__global__ void cluster_rank(int* out) {
  out[blockIdx.z] = static_cast<int>(blockIdx.z);
}
__global__ void cluster_rank_portable(int* out) {
  out[blockIdx.z] = static_cast<int>(blockIdx.z);
}

// max_cluster_blocks: 16 blocks a cluster on a whole Hopper GPU once non-portable sizes are allowed, 8 (the
// portable limit) for a kernel without that attribute; each answer runs.
TEST(CudaRuntime, MaxClusterBlocksIsWhatTheDeviceRuns) {
  TWELL_REQUIRE_HOPPER();
  const void* wide = reinterpret_cast<const void*>(&cluster_rank);
  cuda::allow_non_portable_clusters(wide);
  const int n = cuda::max_cluster_blocks(wide, 128, 16);
  EXPECT_EQ(cuda::max_cluster_blocks(reinterpret_cast<const void*>(&cluster_rank_portable), 128, 16), 8);
  EXPECT_EQ(cuda::max_cluster_blocks(wide, 128, 16), n);  // asked once, remembered
  EXPECT_EQ(n, 16) << "not a whole H100 or H200 (a MIG slice?)";
  for (const auto& [kernel, blocks] : {std::make_pair(&cluster_rank, n), std::make_pair(&cluster_rank_portable, 8)}) {
    SCOPED_TRACE(blocks);
    cuda::DeviceBuffer out(16 * sizeof(int));
    cuda::fill_bytes(out.get(), 16 * sizeof(int), 0xff, nullptr);  // -1
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(1, 1, static_cast<unsigned>(blocks));
    config.blockDim = dim3(128);
    cudaLaunchAttribute cluster = {};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = static_cast<unsigned>(blocks);
    config.attrs = &cluster;
    config.numAttrs = 1;
    ASSERT_EQ(cudaLaunchKernelEx(&config, kernel, out.as<int>()), cudaSuccess);
    int got[16];
    ASSERT_EQ(cudaMemcpy(got, out.get(), sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(got[i], i < blocks ? i : -1) << i;
  }
}

// An allocation the GPU cannot hold names its size and the free memory, and leaves the context usable.
TEST(CudaRuntime, OutOfMemorySaysHowMuch) {
  TWELL_REQUIRE_HOPPER();
  try {
    cuda::DeviceBuffer b(size_t{1} << 50);  // 1.1 PB
    ADD_FAILURE() << "allocated 1 PiB";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA out of memory: 1.1 PB asked for, "), std::string::npos) << what;
    EXPECT_NE(what.find(" free on the GPU"), std::string::npos) << what;  // "X of Y free on the GPU"
    EXPECT_NE(what.find(" of "), std::string::npos) << what;
  }
  cuda::DeviceBuffer ok(1024);  // the error is not sticky
  EXPECT_EQ(cudaMemset(ok.get(), 0, 1024), cudaSuccess);
}

TEST(CudaRuntime, PinnedBufferOwnsMovesAndGrows) {
  TWELL_REQUIRE_HOPPER();
  cuda::PinnedBuffer a(64);
  ASSERT_NE(a.get(), nullptr);
  EXPECT_EQ(a.bytes(), 64u);
  cuda::DeviceBuffer d(64);
  cuda::fill_bytes(d.get(), 64, 0x5a, nullptr);
  ASSERT_EQ(cudaMemcpy(a.get(), d.get(), 64, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(a.as<uint8_t>()[63], 0x5a);
  void* const p = a.get();
  cuda::PinnedBuffer b(std::move(a));
  EXPECT_EQ(b.get(), p);
  EXPECT_EQ(a.get(), nullptr);
  EXPECT_EQ(a.bytes(), 0u);
  b.reserve(32);  // room already: kept
  EXPECT_EQ(b.get(), p);
  b.reserve(1 << 20);
  EXPECT_GE(b.bytes(), size_t{1} << 20);
  b.as<uint8_t>()[(1 << 20) - 1] = 1;  // writable to its end
  cuda::PinnedBuffer mapped(8, cudaHostAllocMapped);
  EXPECT_NE(mapped.get(), nullptr);
}

}  // namespace
}  // namespace twell
