/* twell's C interface: the FFN forward and backward, on the CPU reference backend and on the GPU,
 * for callers that cannot use C++ (Python through ctypes: python/twell; other languages' FFIs).
 * It wraps a subset of the C++ API of twell/cpu/ffn.h and twell/cuda/ffn.h (the GPU object with the
 * options of twell_cuda_ffn_config; not dispatch slots, the fused residual norm, the TwELL layout or
 * the gather path's settings); their comments say what each call computes, its shapes and its
 * rounding points.
 *
 * Built as the shared library libtwell_c.so (CMake target twell_c), which exports these symbols
 * only. Every function that can fail returns TWELL_OK (0) or TWELL_ERROR, and leaves the reason in
 * twell_last_error() (per thread). A call refused for its arguments (shapes, dtypes, devices,
 * alignment, overlapping outputs) has changed nothing: the C++ calls check before they write.
 *
 * Tensors are contiguous, row-major, and described by twell_tensor. A tensor whose data is NULL
 * is "not given" (an optional argument, or a gradient not to compute).
 */
#ifndef TWELL_C_API_H
#define TWELL_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TWELL_C_BUILDING)
#define TWELL_C_API __attribute__((visibility("default")))
#else
#define TWELL_C_API
#endif

/* Bumped whenever a struct or a signature below changes; twell_c_api_version() returns it. */
#define TWELL_C_API_VERSION 1

enum { TWELL_OK = 0, TWELL_ERROR = 1 };

/* The values of twell::DType, twell::Device, twell::Precision, twell::cuda::Dispatch and
 * twell::cuda::FfnPath. The structs and calls below hold them as int32_t, so that their size is fixed. */
typedef enum twell_dtype {
  TWELL_DTYPE_BF16 = 0,
  TWELL_DTYPE_F16 = 1,
  TWELL_DTYPE_F32 = 2,
  TWELL_DTYPE_F64 = 3
} twell_dtype;
typedef enum twell_device { TWELL_DEVICE_CPU = 0, TWELL_DEVICE_CUDA = 1 } twell_device;
typedef enum twell_precision {
  TWELL_PRECISION_BF16 = 0,
  TWELL_PRECISION_H_FP32 = 1,
  TWELL_PRECISION_F64 = 2
} twell_precision;
typedef enum twell_dispatch {
  TWELL_DISPATCH_OBSERVE = 0,
  TWELL_DISPATCH_PREVIOUS = 1,
  TWELL_DISPATCH_ALWAYS_SPARSE = 2,
  TWELL_DISPATCH_ALWAYS_DENSE = 3
} twell_dispatch;
typedef enum twell_path {
  TWELL_PATH_SPARSE = 0,
  TWELL_PATH_GATHER = 1,
  TWELL_PATH_DENSE = 2,
  TWELL_PATH_NONE = 3
} twell_path;

#define TWELL_MAX_DIMS 4
typedef struct {
  void* data;     /* NULL: not given */
  int32_t dtype;  /* twell_dtype */
  int32_t device; /* twell_device: TWELL_DEVICE_CUDA is the current CUDA device */
  int32_t ndim;   /* 1..TWELL_MAX_DIMS */
  int64_t shape[TWELL_MAX_DIMS];
} twell_tensor;

/* twell::ActivationStats: of h over the call's tokens */
typedef struct {
  int64_t tokens, nnz, max_nnz_per_token;
  double l1_sum;
} twell_activation_stats;

/* twell::cuda::FfnStats: nnz, spilled_tiles and sampled_density are -1 where not counted */
typedef struct {
  int32_t path; /* TWELL_PATH_* */
  int64_t tokens, nnz, spilled_tiles;
  double sampled_density;
} twell_ffn_stats;

TWELL_C_API int32_t twell_c_api_version(void);
TWELL_C_API const char* twell_version(void);   /* e.g. "0.1.0" */
/* Why the last call returning TWELL_ERROR on this thread failed; "" after one that returned TWELL_OK
 * (the functions that return no status leave it as it is). Valid until the thread's next twell call. */
TWELL_C_API const char* twell_last_error(void);
TWELL_C_API const char* twell_path_name(int32_t path);

/* ---- CPU reference backend (twell/cpu/ffn.h) ---- */
/* wg NULL: the non-gated FFN. stats and h_out may be NULL. */
TWELL_C_API int twell_cpu_ffn_forward(const twell_tensor* x, const twell_tensor* wg, const twell_tensor* wu,
                                      const twell_tensor* wd, const twell_tensor* y, int32_t precision,
                                      twell_activation_stats* stats, const twell_tensor* h_out);
/* Gradients in f32 or f64; a NULL (or data-less) gradient is not computed. */
TWELL_C_API int twell_cpu_ffn_backward(const twell_tensor* x, const twell_tensor* wg, const twell_tensor* wu,
                                       const twell_tensor* wd, const twell_tensor* dy, double l1_coeff,
                                       const twell_tensor* dx, const twell_tensor* dwg, const twell_tensor* dwu,
                                       const twell_tensor* dwd, int32_t precision);

/* ---- GPU (twell/cuda/ffn.h): an FfnForward object ---- */
/* 1 where a Hopper GPU is present and this build has the CUDA backend; otherwise 0, with the reason
 * in why (NUL-terminated, cut to why_size) when why is not NULL. A yes/no answer, not a status. */
TWELL_C_API int twell_cuda_available(char* why, size_t why_size);

typedef struct {
  int64_t max_tokens, hidden, ffn; /* FfnShape */
  int32_t gated;                   /* 1: gated (wg given), 0: non-gated */
  int32_t training;                /* FfnOptions::training: backward() after either path */
  int32_t dispatch;                /* TWELL_DISPATCH_* */
  int32_t precision;               /* TWELL_PRECISION_BF16 or _H_FP32 */
  int64_t reserved[4];             /* 0: room for options without a new struct (refused when not 0) */
} twell_cuda_ffn_config;

/* FfnShape and FfnOptions' defaults: gated, not training, TWELL_DISPATCH_PREVIOUS, bf16; reserved 0. */
TWELL_C_API void twell_cuda_ffn_config_init(twell_cuda_ffn_config* config, int64_t max_tokens, int64_t hidden,
                                            int64_t ffn);
/* FfnForward::required_workspace_bytes on the current device. */
TWELL_C_API int twell_cuda_ffn_workspace_bytes(const twell_cuda_ffn_config* config, size_t* bytes);

/* A handle is bound to the CUDA device current at its creation; call it with that device current.
 * Like a cuBLAS handle it is not thread-safe: one host thread at a time, and calls on different
 * streams ordered by the caller (events), since they share its workspace. */
typedef struct twell_cuda_ffn twell_cuda_ffn;
/* workspace NULL: the object allocates its own; otherwise at least twell_cuda_ffn_workspace_bytes of
 * device memory, 256-byte aligned, under the contract of the FfnForward constructor that takes one. */
TWELL_C_API int twell_cuda_ffn_create(const twell_cuda_ffn_config* config, void* workspace, size_t workspace_bytes,
                                      twell_cuda_ffn** out);
TWELL_C_API void twell_cuda_ffn_destroy(twell_cuda_ffn* ffn); /* NULL: nothing */
/* Enqueued on stream (a cudaStream_t; NULL: the legacy default stream). bf16 tensors on the device. */
TWELL_C_API int twell_cuda_ffn_forward(twell_cuda_ffn* ffn, const twell_tensor* x, const twell_tensor* wg,
                                       const twell_tensor* wu, const twell_tensor* wd, const twell_tensor* y,
                                       void* stream);
/* The backward of the last forward (FfnForward::backward): gradients in f32 on the device. */
TWELL_C_API int twell_cuda_ffn_backward(twell_cuda_ffn* ffn, const twell_tensor* x, const twell_tensor* wg,
                                        const twell_tensor* wu, const twell_tensor* wd, const twell_tensor* dy,
                                        double l1_coeff, const twell_tensor* dx, const twell_tensor* dwg,
                                        const twell_tensor* dwu, const twell_tensor* dwd, void* stream);
/* Statistics of the last call (waits for its non-zero count where the sparse path ran). */
TWELL_C_API int twell_cuda_ffn_last_stats(const twell_cuda_ffn* ffn, twell_ffn_stats* stats);

#ifdef __cplusplus
}
#endif

#endif /* TWELL_C_API_H */
