// Bulk copies global → shared memory by the TMA engine (cp.async.bulk, completion counted in
// bytes on an mbarrier) for the kernels of this folder that stream weight rows, shared → global
// (bulk groups) for the epilogues that write their tile through shared memory, and programmatic
// dependent launch (griddepcontrol).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "twell/cuda/runtime.h"

namespace twell::cuda {
namespace {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint64_t l2_keep_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// One thread: an mbarrier expecting one arrival per phase, visible to the async proxy.
__device__ __forceinline__ void init_barrier(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The barrier's one arrival of this phase, announcing `bytes` of copies that complete it.
__device__ __forceinline__ void arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// Bulk-copies `bytes` (a multiple of 16, 16-byte aligned ends) from global `src` into shared
// `dst`; completion is counted on `bar`, whose expected bytes must include them.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

// One thread: a single copy that is the whole of `bar`'s phase.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
  arrive_expect_bytes(bar, bytes);
  bulk_copy(dst, src, bytes, bar, policy);
}

// Orders this thread's earlier shared-memory accesses before later bulk copies of the same memory
// (the TMA engine is another proxy): a slot read by threads, then refilled; a stage written by
// threads, then copied out.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Bulk-copies `bytes` (a multiple of 16, 16-byte aligned ends) from shared `src` (a shared-memory
// address) to global `dst`, as a bulk group of its own. The writes to `src` go before it through
// fence_proxy_async(); wait_bulk_stores_read() before `src` is written again.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                   __cvta_generic_to_global(dst)),
               "r"(src), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until the TMA engine has read the sources of this thread's bulk stores (their writes to
// global memory may still be under way).
__device__ __forceinline__ void wait_bulk_stores_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

__device__ __forceinline__ void wait_parity(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Programmatic dependent launch. A kernel launched with launch_dependent (below) may start
// while the kernel before it still runs: it must call wait_for_previous_grid() before it reads
// anything that kernel writes (or writes anything it reads). A kernel calling
// allow_dependent_launch() lets such a successor start early; without a PDL successor both are
// no-ops.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

}  // namespace

// Launches `kernel`, with programmatic stream serialisation where `dependent`: it may then start
// before the previous kernel on the stream has finished, and must call wait_for_previous_grid()
// (above) before it touches that kernel's data. (Captured into CUDA graphs as a programmatic edge.)
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool dependent,
                   Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent ? 1 : 0;
  TWELL_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  launch_kernel(kernel, grid, block, smem, stream, true, std::forward<Args>(args)...);
}

}  // namespace twell::cuda
