// Causal prefill attention through cuDNN's fused scaled-dot-product attention (its flash-attention
// kernels for Hopper), on the same buffers as launch_attention: q in the QKV GEMM's output, k and v
// in the KV cache, o [B·S, nh·hd].
//
// libcudnn.so.9 is loaded at run time (the cuDNN frontend's dynamic loading): a binary built with
// the frontend headers runs where cuDNN is missing, and its callers then use twell's own kernel.
// Set TWELL_CUDNN_LIBRARY to a path to choose the library (the directory of its sub-libraries
// must be on LD_LIBRARY_PATH too, e.g. PyTorch's site-packages/nvidia/cudnn/lib).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

namespace twell::cuda {

struct AttentionArgs;

class CudnnSdpa {
 public:
  // Whether this build has the cuDNN frontend and libcudnn could be loaded (tried once per
  // process); if not, `why` says what is missing. Never throws.
  static bool available(std::string* why = nullptr);
  // The loaded cuDNN's version (e.g. 91900 for 9.19.0), 0 when not available.
  static int64_t version();

  CudnnSdpa();
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // Enqueues the attention of `a` (S new tokens per sequence whose keys and values are already in
  // the cache) at host-known position `past` of every sequence: each query attends to cache
  // positions [0, past + s]. The first call of a shape builds cuDNN's plan (host work, and a
  // stream synchronisation when the workspace grows). Returns false, enqueuing nothing, when
  // cuDNN is unavailable, does not take the shape, or `stream` is capturing a CUDA graph (a plan
  // holds `past` and the workspace, which a replay could not change); `why` then says why.
  // Throws if cuDNN fails on a plan it accepted.
  bool run(const AttentionArgs& a, int64_t past, cudaStream_t stream, std::string* why = nullptr);

  // Device memory held for cuDNN's workspace.
  size_t workspace_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell::cuda
