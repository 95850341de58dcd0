// A kernel that holds a stream until the host releases it: `twell bench` enqueues a whole timed
// call behind it, so that its CUDA events time the GPU's work without the host's launch latency
// (the blocking kernel of NVIDIA's nvbench). Used by bench/ffn_bench_cuda.cpp.
#include "cuda/kernels.h"

namespace twell::cuda {
namespace {

__global__ void hold_stream_kernel(const volatile uint32_t* release, uint32_t* timed_out, uint64_t timeout_ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (*release == 0) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > timeout_ns) {
      *timed_out = 1;
      break;
    }
    __nanosleep(1000);
  }
  __threadfence_system();
}

}  // namespace

void launch_hold_stream(const volatile uint32_t* release, uint32_t* timed_out, uint64_t timeout_ns,
                        cudaStream_t stream) {
  TWELL_CHECK(release && timed_out, "hold_stream: needs the release and timed-out words (pinned host memory)");
  hold_stream_kernel<<<1, 1, 0, stream>>>(release, timed_out, timeout_ns);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
