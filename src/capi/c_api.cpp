// twell's C interface (twell/c_api.h): argument translation and exception barriers around the C++ API.
#include "twell/c_api.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>

#include "twell/cpu/ffn.h"
#include "twell/error.h"
#include "twell/version.h"
#if TWELL_WITH_CUDA
#include "twell/cuda/ffn.h"
#include "twell/cuda/runtime.h"
#endif

static_assert(TWELL_DTYPE_BF16 == static_cast<int>(twell::DType::bf16) &&
              TWELL_DTYPE_F16 == static_cast<int>(twell::DType::f16) &&
              TWELL_DTYPE_F32 == static_cast<int>(twell::DType::f32) &&
              TWELL_DTYPE_F64 == static_cast<int>(twell::DType::f64));
// The structs' layouts are part of the ABI: python/twell/_capi.py mirrors them, and its tests check
// these sizes there. Change both, and TWELL_C_API_VERSION, together.
static_assert(sizeof(twell_tensor) == 56 && sizeof(twell_activation_stats) == 32 && sizeof(twell_ffn_stats) == 40 &&
              sizeof(twell_cuda_ffn_config) == 72);
static_assert(TWELL_DEVICE_CPU == static_cast<int>(twell::Device::cpu) &&
              TWELL_DEVICE_CUDA == static_cast<int>(twell::Device::cuda));
static_assert(TWELL_PRECISION_BF16 == static_cast<int>(twell::Precision::bf16) &&
              TWELL_PRECISION_H_FP32 == static_cast<int>(twell::Precision::h_fp32) &&
              TWELL_PRECISION_F64 == static_cast<int>(twell::Precision::f64));
#if TWELL_WITH_CUDA
static_assert(TWELL_DISPATCH_OBSERVE == static_cast<int>(twell::cuda::Dispatch::observe) &&
              TWELL_DISPATCH_PREVIOUS == static_cast<int>(twell::cuda::Dispatch::previous) &&
              TWELL_DISPATCH_ALWAYS_SPARSE == static_cast<int>(twell::cuda::Dispatch::always_sparse) &&
              TWELL_DISPATCH_ALWAYS_DENSE == static_cast<int>(twell::cuda::Dispatch::always_dense));
static_assert(TWELL_PATH_SPARSE == static_cast<int>(twell::cuda::FfnPath::sparse) &&
              TWELL_PATH_GATHER == static_cast<int>(twell::cuda::FfnPath::gather) &&
              TWELL_PATH_DENSE == static_cast<int>(twell::cuda::FfnPath::dense) &&
              TWELL_PATH_NONE == static_cast<int>(twell::cuda::FfnPath::none));

struct twell_cuda_ffn {
  twell::cuda::FfnForward forward;
};
#endif

namespace {

using namespace twell;

thread_local std::string last_error;

// Runs f, turning any exception into TWELL_ERROR and its message into last_error.
template <class F>
int guarded(F&& f) {
  try {
    f();
    last_error.clear();
    return TWELL_OK;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return TWELL_ERROR;
}

// The view of a C tensor; empty where it is NULL or has no data (an argument not given).
TensorView view(const twell_tensor* t, const char* name) {
  if (t == nullptr || t->data == nullptr) return {};
  TWELL_REQUIRE(t->ndim >= 1 && t->ndim <= TWELL_MAX_DIMS, name, ": ndim must be 1 to ", TWELL_MAX_DIMS, ", got ",
                t->ndim);
  TWELL_REQUIRE(t->dtype >= TWELL_DTYPE_BF16 && t->dtype <= TWELL_DTYPE_F64, name,
                ": dtype must be a twell_dtype (TWELL_DTYPE_BF16, _F16, _F32 or _F64), got ", t->dtype);
  TWELL_REQUIRE(t->device == TWELL_DEVICE_CPU || t->device == TWELL_DEVICE_CUDA, name,
                ": device must be TWELL_DEVICE_CPU or TWELL_DEVICE_CUDA, got ", t->device);
  Shape shape(t->shape, t->shape + t->ndim);
  for (int64_t d : shape) TWELL_REQUIRE(d >= 0, name, ": negative dimension in ", shape_str(shape));
  return TensorView(t->data, static_cast<DType>(t->dtype), std::move(shape), static_cast<Device>(t->device));
}

Precision precision_of(int32_t p) {
  TWELL_REQUIRE(p >= TWELL_PRECISION_BF16 && p <= TWELL_PRECISION_F64,
                "precision must be TWELL_PRECISION_BF16, _H_FP32 or _F64, got ", p);
  return static_cast<Precision>(p);
}

FfnWeights weights(const twell_tensor* wg, const twell_tensor* wu, const twell_tensor* wd) {
  return FfnWeights{view(wg, "wg"), view(wu, "wu"), view(wd, "wd")};
}

FfnGrads grads(const twell_tensor* dx, const twell_tensor* dwg, const twell_tensor* dwu, const twell_tensor* dwd) {
  return FfnGrads{view(dx, "dx"), view(dwg, "dwg"), view(dwu, "dwu"), view(dwd, "dwd")};
}

void require_host(const std::initializer_list<TensorView>& views, const char* op) {
  for (const TensorView& v : views)
    TWELL_REQUIRE(v.empty() || v.device == Device::cpu, op,
                  ": the CPU backend takes host tensors (device TWELL_DEVICE_CPU)");
}

#if TWELL_WITH_CUDA
cuda::FfnShape shape_of(const twell_cuda_ffn_config* c) {
  TWELL_REQUIRE(c != nullptr, "twell_cuda_ffn_config: NULL");
  return cuda::FfnShape{c->max_tokens, c->hidden, c->ffn, c->gated != 0};
}

cuda::FfnOptions options_of(const twell_cuda_ffn_config* c) {
  TWELL_REQUIRE(c != nullptr, "twell_cuda_ffn_config: NULL");
  for (int64_t r : c->reserved)
    TWELL_REQUIRE(r == 0, "twell_cuda_ffn_config: reserved fields must be 0 (twell_cuda_ffn_config_init sets them)");
  TWELL_REQUIRE(c->dispatch >= TWELL_DISPATCH_OBSERVE && c->dispatch <= TWELL_DISPATCH_ALWAYS_DENSE,
                "twell_cuda_ffn_config: dispatch must be a TWELL_DISPATCH_ value, got ", c->dispatch);
  TWELL_REQUIRE(c->precision == TWELL_PRECISION_BF16 || c->precision == TWELL_PRECISION_H_FP32,
                "twell_cuda_ffn_config: precision must be TWELL_PRECISION_BF16 or _H_FP32 on the GPU, got ",
                c->precision);
  cuda::FfnOptions o;
  o.dispatch = static_cast<cuda::Dispatch>(c->dispatch);
  o.precision = static_cast<Precision>(c->precision);
  o.training = c->training != 0;
  return o;
}

twell::cuda::FfnForward& object(twell_cuda_ffn* ffn) {
  TWELL_REQUIRE(ffn != nullptr, "twell_cuda_ffn: NULL");
  return ffn->forward;
}
#endif

constexpr const char* kNoCuda = "this build of twell has no CUDA backend (configure with -DTWELL_CUDA=ON)";

}  // namespace

extern "C" {

int32_t twell_c_api_version(void) { return TWELL_C_API_VERSION; }
const char* twell_version(void) { return TWELL_VERSION_STRING; }
const char* twell_last_error(void) { return last_error.c_str(); }

const char* twell_path_name(int32_t path) {
  switch (path) {
    case TWELL_PATH_SPARSE: return "sparse";
    case TWELL_PATH_GATHER: return "gather";
    case TWELL_PATH_DENSE: return "dense";
    case TWELL_PATH_NONE: return "none";
  }
  return "?";
}

int twell_cpu_ffn_forward(const twell_tensor* x, const twell_tensor* wg, const twell_tensor* wu, const twell_tensor* wd,
                          const twell_tensor* y, int32_t precision, twell_activation_stats* stats,
                          const twell_tensor* h_out) {
  return guarded([&] {
    const TensorView xv = view(x, "x"), yv = view(y, "y"), hv = view(h_out, "h_out");
    const FfnWeights w = weights(wg, wu, wd);
    require_host({xv, yv, hv, w.wg, w.wu, w.wd}, "twell_cpu_ffn_forward");
    ActivationStats s;
    cpu::ffn_forward(xv, w, yv, precision_of(precision), &s, hv);
    if (stats) *stats = twell_activation_stats{s.tokens, s.nnz, s.max_nnz_per_token, s.l1_sum};
  });
}

int twell_cpu_ffn_backward(const twell_tensor* x, const twell_tensor* wg, const twell_tensor* wu,
                           const twell_tensor* wd, const twell_tensor* dy, double l1_coeff, const twell_tensor* dx, const twell_tensor* dwg,
                           const twell_tensor* dwu, const twell_tensor* dwd, int32_t precision) {
  return guarded([&] {
    const TensorView xv = view(x, "x"), dyv = view(dy, "dy");
    const FfnWeights w = weights(wg, wu, wd);
    const FfnGrads g = grads(dx, dwg, dwu, dwd);
    require_host({xv, dyv, w.wg, w.wu, w.wd, g.dx, g.dwg, g.dwu, g.dwd}, "twell_cpu_ffn_backward");
    cpu::ffn_backward(xv, w, dyv, l1_coeff, g, precision_of(precision));
  });
}

int twell_cuda_available(char* why, size_t why_size) {
  std::string reason;
  bool ok = false;
#if TWELL_WITH_CUDA
  try {
    ok = cuda::hopper_available(&reason);
  } catch (const std::exception& e) {
    reason = e.what();
  } catch (...) {
    reason = "unknown error";
  }
#else
  reason = kNoCuda;
#endif
  if (why != nullptr && why_size > 0) {
    const size_t n = std::min(reason.size(), why_size - 1);
    std::memcpy(why, reason.data(), n);
    why[n] = '\0';
  }
  return ok ? 1 : 0;
}

void twell_cuda_ffn_config_init(twell_cuda_ffn_config* config, int64_t max_tokens, int64_t hidden, int64_t ffn) {
  if (config == nullptr) return;
  *config = twell_cuda_ffn_config{};
  config->max_tokens = max_tokens;
  config->hidden = hidden;
  config->ffn = ffn;
  config->gated = 1;
  config->dispatch = TWELL_DISPATCH_PREVIOUS;
  config->precision = TWELL_PRECISION_BF16;
}

int twell_cuda_ffn_workspace_bytes(const twell_cuda_ffn_config* config, size_t* bytes) {
  return guarded([&] {
#if TWELL_WITH_CUDA
    TWELL_REQUIRE(bytes != nullptr, "twell_cuda_ffn_workspace_bytes: bytes is NULL");
    const cuda::FfnShape shape = shape_of(config);
    const cuda::FfnOptions options = options_of(config);
    *bytes = cuda::FfnForward::required_workspace_bytes(shape, options);
#else
    throw Error(kNoCuda);
#endif
  });
}

int twell_cuda_ffn_create(const twell_cuda_ffn_config* config, void* workspace, size_t workspace_bytes,
                          twell_cuda_ffn** out) {
  return guarded([&] {
#if TWELL_WITH_CUDA
    TWELL_REQUIRE(out != nullptr, "twell_cuda_ffn_create: out is NULL");
    *out = nullptr;
    std::string why;
    TWELL_REQUIRE(cuda::hopper_available(&why), "twell_cuda_ffn_create: ", why);
    const cuda::FfnShape shape = shape_of(config);
    const cuda::FfnOptions options = options_of(config);
    *out = workspace ? new twell_cuda_ffn{cuda::FfnForward(shape, options, workspace, workspace_bytes)}
                     : new twell_cuda_ffn{cuda::FfnForward(shape, options)};
#else
    throw Error(kNoCuda);
#endif
  });
}

void twell_cuda_ffn_destroy(twell_cuda_ffn* ffn) {
#if TWELL_WITH_CUDA
  try {
    delete ffn;
  } catch (...) {  // a destructor's CUDA error: nothing a C caller could do with it
  }
#else
  (void)ffn;
#endif
}

int twell_cuda_ffn_forward(twell_cuda_ffn* ffn, const twell_tensor* x, const twell_tensor* wg, const twell_tensor* wu,
                           const twell_tensor* wd, const twell_tensor* y, void* stream) {
  return guarded([&] {
#if TWELL_WITH_CUDA
    object(ffn).forward(view(x, "x"), weights(wg, wu, wd), view(y, "y"), static_cast<cudaStream_t>(stream));
#else
    throw Error(kNoCuda);
#endif
  });
}

int twell_cuda_ffn_backward(twell_cuda_ffn* ffn, const twell_tensor* x, const twell_tensor* wg, const twell_tensor* wu,
                            const twell_tensor* wd, const twell_tensor* dy, double l1_coeff, const twell_tensor* dx,
                            const twell_tensor* dwg, const twell_tensor* dwu, const twell_tensor* dwd, void* stream) {
  return guarded([&] {
#if TWELL_WITH_CUDA
    object(ffn).backward(view(x, "x"), weights(wg, wu, wd), view(dy, "dy"), l1_coeff, grads(dx, dwg, dwu, dwd),
                         static_cast<cudaStream_t>(stream));
#else
    throw Error(kNoCuda);
#endif
  });
}

int twell_cuda_ffn_last_stats(const twell_cuda_ffn* ffn, twell_ffn_stats* stats) {
  return guarded([&] {
#if TWELL_WITH_CUDA
    TWELL_REQUIRE(stats != nullptr, "twell_cuda_ffn_last_stats: stats is NULL");
    TWELL_REQUIRE(ffn != nullptr, "twell_cuda_ffn: NULL");
    const cuda::FfnStats s = ffn->forward.last_stats();
    *stats = twell_ffn_stats{static_cast<int32_t>(s.path), s.tokens, s.nnz, s.spilled_tiles, s.sampled_density};
#else
    throw Error(kNoCuda);
#endif
  });
}

}  // extern "C"
