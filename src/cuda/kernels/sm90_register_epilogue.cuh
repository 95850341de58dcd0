// What gate_pack.cu and qkv_rope.cu share: a CUTLASS 3 Hopper GEMM of bf16 x [M, K] (row-major)
// by W [N, K] (row-major, i.e. K-major B), fp32 accumulation, whose epilogue is ours and works
// from the accumulator registers (no C, no D; shared storage only where the epilogue declares it).
//
//   RegisterEpilogue<Params>  the members CUTLASS asks of an sm70-style epilogue; a kernel's
//                             epilogue derives from it and adds its constructor and operator(),
//                             and may declare its own SharedStorage (operator() gets its address)
//   PingPongGemm<Epilogue, TileM, TileN>  the one kernel configuration both use: warp-specialised
//                             persistent ping-pong, one TileM × TileN tile a warpgroup (64 × 256 by
//                             default), 2 × 1 clusters (docs/perf.md, FFN items 17-18 and 42, model
//                             item 13)
//   gemm_arguments, run_gemm  arguments from pointers and sizes; the checked launch (attributes
//                             set once a device), optionally as a programmatic dependent
#pragma once

// The kernels' grid-dependency control (griddepcontrol): the producer warps' loads wait for the
// kernel before (no-ops unless launched as a programmatic dependent), and a consumer's last tile
// lets the next kernel launch. Defined here, the one place that includes CUTLASS.
#ifndef CUTLASS_ENABLE_GDC_FOR_SM90
#define CUTLASS_ENABLE_GDC_FOR_SM90 1
#endif
// wgmma's N widths that are not powers of two or multiples of 32 (176 here): without this, CuTe's
// atom selector falls back to the widest that divides the tile (n16 for 176), 11 times the issues.
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1
#endif

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/detail.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "cuda/kernels.h"
#include "twell/cuda/runtime.h"
#include "twell/error.h"

namespace twell::cuda::sm90 {

using ElementAB = cutlass::bfloat16_t;
using StrideCD = cutlass::gemm::TagToStrideC_t<cutlass::layout::RowMajor>;
constexpr int kTileM = 64, kTileN = 256;

template <class ParamsT>
struct RegisterEpilogue {
  using EpilogueSchedule = cutlass::gemm::EpilogueDefault;
  using DispatchPolicy = EpilogueSchedule;
  using ElementC = cutlass::bfloat16_t;
  using ElementD = cutlass::bfloat16_t;
  using StrideC = StrideCD;
  using StrideD = StrideCD;
  using ElementOutput = ElementD;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  using ThreadEpilogueOp = void;  // named by GemmUniversalAdapter only
  struct SharedStorage {};
  using TensorStorage = SharedStorage;
  using Arguments = ParamsT;
  using Params = ParamsT;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  CUTLASS_DEVICE bool is_source_needed() { return false; }
};

template <class EpilogueOp, int TileM = kTileM, int TileN = kTileN>
struct PingPongGemm {
  using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<EpilogueOp>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cutlass::layout::RowMajor, 8, ElementAB,
      cutlass::layout::ColumnMajor, 8, float, cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::_64>,
      cute::Shape<cute::_2, cute::_1, cute::_1>,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Packed K-major strides (rows of K elements): (K, 1, rows·K).
template <class Stride>
Stride k_major(int rows, int K) {
  Stride s{};
  cute::get<0>(s) = K;
  cute::get<2>(s) = int64_t{rows} * K;
  return s;
}

// x [M, K] · W [N, K]ᵀ on the current device's first `sm_count` SMs, with the epilogue's params.
template <class Gemm>
typename Gemm::Arguments gemm_arguments(const void* x, const void* w, int M, int N, int K,
                                        typename Gemm::GemmKernel::EpilogueArguments const& epilogue, int sm_count) {
  using Kernel = typename Gemm::GemmKernel;
  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {M, N, K, 1};
  args.mainloop.ptr_A = static_cast<const ElementAB*>(x);
  args.mainloop.dA = k_major<typename Kernel::StrideA>(M, K);
  args.mainloop.ptr_B = static_cast<const ElementAB*>(w);
  args.mainloop.dB = k_major<typename Kernel::StrideB>(N, K);
  args.epilogue = epilogue;
  int device = 0;
  TWELL_CUDA_CHECK(cudaGetDevice(&device));
  args.hw_info.device_id = device;  // the current device, whose SMs the persistent grid covers
  args.hw_info.sm_count = sm_count;
  return args;
}

// Checks the workspace and CUTLASS's own conditions, then launches the GEMM as CUTLASS's adapter
// would (grid, block, cluster and shared memory from the kernel). The kernel's attributes go
// through allow_dynamic_smem and allow_non_portable_clusters, which set them once per device: the
// adapter's initialize and its cluster launcher set both on every call, ~5 µs of host time that a
// single call shows as idle GPU. `what` names the kernel in the errors. `dependent`: launched with
// programmatic stream serialisation, so that its prologue runs under the kernel before, whose
// results its producer warps wait for (CUTLASS_ENABLE_GDC_FOR_SM90 above). The epilogue's writes
// follow the loads, so they wait too.
template <class Gemm>
void run_gemm(typename Gemm::Arguments const& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
              const char* what, bool dependent = false) {
  using Kernel = typename Gemm::GemmKernel;
  TWELL_CHECK(Gemm::get_workspace_size(args) <= workspace_bytes, what, ": workspace of ", workspace_bytes,
              " bytes, ", Gemm::get_workspace_size(args), " needed");
  const auto& shape = args.problem_shape;
  TWELL_CHECK(Gemm::can_implement(args) == cutlass::Status::kSuccess, what, ": CUTLASS cannot run M = ",
              cute::get<0>(shape), ", N = ", cute::get<1>(shape), ", K = ", cute::get<2>(shape));
  const auto* kernel = reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>);
  allow_dynamic_smem(kernel, static_cast<int>(Kernel::SharedStorageSize));
  allow_non_portable_clusters(kernel);
  TWELL_CHECK(Kernel::initialize_workspace(args, workspace, stream) == cutlass::Status::kSuccess, what,
              ": CUTLASS could not initialise its workspace");
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);

  using Cluster = typename Kernel::DispatchPolicy::ClusterShape;
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cute::size<0>(Cluster{});
  attrs[0].val.clusterDim.y = cute::size<1>(Cluster{});
  attrs[0].val.clusterDim.z = cute::size<2>(Cluster{});
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = Kernel::get_grid_shape(params);
  config.blockDim = Kernel::get_block_shape();
  config.dynamicSmemBytes = Kernel::SharedStorageSize;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = dependent ? 2 : 1;
  void* kernel_args[] = {&params};
  const cudaError_t launched = cudaLaunchKernelExC(&config, kernel, kernel_args);
  if (launched != cudaSuccess) (void)cudaGetLastError();  // cleared: reported here, not by the next check
  TWELL_CHECK(launched == cudaSuccess, what, ": launch failed: ", cudaGetErrorString(launched));
}

}  // namespace twell::cuda::sm90
