// Row-major bf16 GEMMs through cuBLASLt, fp32 accumulation, optional fused ReLU:
//   C[M, N] = A[M, K] · Bᵀ   with B stored [N, K]   (b_transposed = true:  x · Wᵀ)
//   C[M, N] = A[M, K] · B    with B stored [K, N]   (b_transposed = false: h · Wd)
//   C[M, N] = Aᵀ · B         with A stored [K, M]   (run_at: weight gradients, dgᵀ · x)
// cuBLASLt is column-major, so each call computes Cᵀ = op(B)ᵀ-shaped products with the operands
// swapped; the descriptors and the chosen algorithm are cached per problem.
// A problem's second call in a process with the B operand of its first (the same weights: in a
// model, whose layers share problems, the second forward of a shape), outside stream capture,
// times cuBLASLt's candidate algorithms on its operands and keeps the fastest for the process:
// that call synchronises its stream and takes a few times a GEMM's time. Calls before it run the
// heuristics' first algorithm (or the process's choice, where another LtGemm tuned the problem):
// a shape met once, such as a new prompt's length, never pays for tuning; nor does a problem of
// under ~2 GFLOP (decode steps' GEMMs), which could not repay it. (A problem whose B moves between
// calls is tuned at its 256th.) Only candidates whose output on
// the tuning operands has the bits of the heuristics' first are timed (equal on those operands:
// on others, or in another process, a choice may differ in last bits). TWELL_LT_AUTOTUNE=0 turns it off.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "twell/cuda/runtime.h"

namespace twell::cuda {

[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line);

#define TWELL_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                           \
    cublasStatus_t twell_st_ = (expr);                                                           \
    if (twell_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ::twell::cuda::throw_cublas_error(twell_st_, #expr, __FILE__, __LINE__);                   \
  } while (0)

enum class GemmEpilogue { none, relu };
enum class GemmOut { bf16, f32 };  // C's type (the logits of the LM head are f32)

class LtGemm {
 public:
  // Device memory an LtGemm allocates for cuBLASLt unless given one (cuBLAS recommends 32 MiB+ on Hopper).
  static constexpr size_t kWorkspaceBytes = size_t{64} << 20;
  // autotune: time the candidates at each problem's second call (the default: on, unless the
  // environment sets TWELL_LT_AUTOTUNE=0); false: the heuristics' first algorithm.
  // workspace: null, the object allocates kWorkspaceBytes of its own; or device memory of
  // workspace_bytes bytes, 256-byte aligned, that the caller keeps valid until all the work
  // enqueued through the object has finished, and may share with other work ordered with this
  // object's calls (as cublasSetWorkspace's). A smaller workspace may give other algorithms, and
  // so other last bits.
  explicit LtGemm(bool autotune = autotune_default(), void* workspace = nullptr, size_t workspace_bytes = 0);
  // The rule for a caller's workspace: null with 0 bytes, or 256-byte aligned with some bytes.
  // Throws naming `what` (e.g. "FfnForward: cublaslt_workspace") otherwise.
  static void check_workspace(const void* workspace, size_t workspace_bytes, const char* what);
  static bool autotune_default();
  // Forgets the process's tuned choices (tests: the next call of each problem tunes again).
  static void forget_tuning();
  // cuBLASLt's workspace: the object's own, or the caller's.
  void* workspace() const { return workspace_.get(); }
  size_t workspace_bytes() const { return workspace_.bytes(); }
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // beta = 1 adds the product to C (C = A·op(B) + C).
  void run(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k, bool b_transposed,
           GemmEpilogue epilogue, cudaStream_t stream, GemmOut out = GemmOut::bf16, float beta = 0.f);
  // C[m, n] = A[k, m]ᵀ · B[k, n]; A's rows lda elements apart (0: m).
  void run_at(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
              GemmOut out = GemmOut::f32, int64_t lda = 0);

  // A problem: m, n, k, b_transposed, epilogue, out, a_transposed, lda, the alignment in bytes of the
  // pointers a, b and c (a power of two up to 256: cuBLASLt's heuristics assume 256 unless told), and
  // whether it adds to C (beta != 0: tuned apart, since the candidates' bits are checked with it).
  using Key =
      std::tuple<int64_t, int64_t, int64_t, bool, int, int, bool, int64_t, uint32_t, uint32_t, uint32_t, bool>;

 private:
  struct Plan;
  Plan& plan(const Key& key);
  void tune(Plan& p, const Key& key, const void* a, const void* b, void* c, float beta, cudaStream_t stream);
  // Takes the process's tuned choice for `key` where there is one (true).
  bool adopt(Plan& p, const Key& key);
  // The plan of `key` (made at its first call, tuned at its second), run on these operands.
  void launch(const Key& key, const void* a, const void* b, void* c, float beta, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  bool autotune_ = true;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace twell::cuda
