// cuDNN's fused SDPA for the prefill attention (cudnn_sdpa.h). The frontend is header-only and
// loads libcudnn through dlopen (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, set by CMake on this file
// only), so nothing here needs cuDNN at link time.
#include "cuda/cudnn_sdpa.h"

#include <cstdlib>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cuda/kernels.h"
#include "twell/cuda/runtime.h"
#include "twell/error.h"

#if TWELL_HAVE_CUDNN_FRONTEND
#include <dlfcn.h>

#include <cstring>

#include "cudnn_frontend.h"

// The frontend's backend calls resolve their symbols through this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace twell::cuda {

#if TWELL_HAVE_CUDNN_FRONTEND
namespace {

namespace fe = cudnn_frontend;

struct Library {
  bool ok = false;
  int64_t version = 0;
  std::string why;
};

const Library& library() {
  static const Library lib = [] {
    Library r;
    const char* env = std::getenv("TWELL_CUDNN_LIBRARY");
    const char* name = env && *env ? env : "libcudnn.so.9";
    dlerror();
    void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      r.why = str("cannot load ", name, " (", e ? e : "unknown error",
                  "); put cuDNN 9's lib directory on LD_LIBRARY_PATH or set TWELL_CUDNN_LIBRARY");
      return r;
    }
    using GetVersion = size_t (*)();
    auto get_version = reinterpret_cast<GetVersion>(dlsym(h, "cudnnGetVersion"));
    if (!get_version) {
      r.why = str(name, " has no cudnnGetVersion: not a cuDNN library");
      dlclose(h);
      return r;
    }
    r.version = static_cast<int64_t>(get_version());
    if (r.version < 90000 || r.version >= 100000) {
      r.why = str(name, " is cuDNN ", r.version, "; twell's prefill attention needs cuDNN 9");
      dlclose(h);
      return r;
    }
    fe::cudnn_dlhandle = h;  // kept for the life of the process
    r.ok = true;
    return r;
  }();
  return lib;
}

// Tensor uids of the graph's variant pack.
enum : int64_t { kQ = 1, kK = 2, kV = 3, kO = 4 };

std::string fe_message(const char* step, fe::error_t e) { return str("cuDNN SDPA ", step, ": ", e.get_message()); }

}  // namespace

struct CudnnSdpa::Impl {
  // B, S, past, nh, nkv, hd, max_context, scale's bits
  using Key = std::tuple<int, int, int64_t, int, int, int, int, uint32_t>;
  struct Plan {
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;
  };
  static constexpr size_t kMaxPlans = 64;
  cudnnHandle_t handle = nullptr;
  std::string handle_error;             // cudnnCreate failed once: not tried again
  std::map<Key, Plan> plans;
  std::map<Key, std::string> rejected;  // shapes cuDNN did not take, and why
  DeviceBuffer workspace;

  ~Impl() {
    plans.clear();
    if (handle) {
      fe::detail::set_stream(handle, nullptr);  // the caller's stream may be gone already
      fe::detail::destroy_handle(handle);
    }
  }

  // The plan of `key`, built on first use; null with `why` set when cuDNN does not take it.
  const Plan* plan(const Key& key, const AttentionArgs& a, int64_t past, cudaStream_t stream, std::string* why) {
    if (auto it = plans.find(key); it != plans.end()) return &it->second;
    if (auto it = rejected.find(key); it != rejected.end()) {
      *why = it->second;
      return nullptr;
    }
    if (!handle_error.empty()) {
      *why = handle_error;
      return nullptr;
    }
    if (!handle) {
      cudnnStatus_t st = CUDNN_STATUS_INTERNAL_ERROR;
      try {
        st = fe::detail::create_handle(&handle);
      } catch (const std::exception& e) {
        handle_error = str("cudnnCreate: ", e.what());
      }
      if (st != CUDNN_STATUS_SUCCESS) {
        handle = nullptr;
        if (handle_error.empty()) handle_error = str("cudnnCreate failed (status ", static_cast<int>(st), ")");
        *why = handle_error;
        return nullptr;
      }
    }
    // Remembered, bounded as the plans are (asked again later): asking again would rebuild the plan,
    // ~0.1 s, at each layer.
    const auto reject = [&](const std::string& reason) -> const Plan* {
      if (rejected.size() >= kMaxPlans) rejected.clear();
      *why = rejected.emplace(key, reason).first->second;
      return nullptr;
    };
    std::string reason;
    Plan p;
    try {
      reason = build(a, past, &p);
    } catch (const std::exception& e) {  // the frontend throws when a symbol cannot be loaded
      reason = str("cuDNN SDPA: ", e.what());
    }
    if (!reason.empty()) return reject(reason);
    // Bounded: a server seeing many prompt lengths would otherwise keep every plan it ever built. A
    // plan's enqueued executions may still run: they finish before its graph goes.
    if (plans.size() >= kMaxPlans) {
      TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
      plans.clear();
    }
    if (static_cast<size_t>(p.workspace) > workspace.bytes()) {
      TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old workspace may still be in use
      try {
        workspace = DeviceBuffer(static_cast<size_t>(p.workspace));
      } catch (const Error& e) {  // the GPU's memory is short: twell's kernel serves the shape (automatic)
        if (std::string(e.what()).rfind("CUDA out of memory", 0) != 0) throw;  // another CUDA error is one
        return reject(str("cuDNN SDPA: its workspace of ", bytes_str(static_cast<size_t>(p.workspace)),
                          " could not be allocated: ", e.what()));
      }
    }
    return &plans.emplace(key, std::move(p)).first->second;
  }

  // Empty on success.
  std::string build(const AttentionArgs& a, int64_t past, Plan* out) {
    const int64_t B = a.B, S = a.S, nh = a.nh, nkv = a.nkv, hd = a.hd, kv_len = past + S;
    const int64_t q_ld = (nh + 2 * nkv) * hd, kv_ld = nkv * hd, o_ld = nh * hd;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    using fe::graph::Tensor_attributes;
    auto q = g->tensor(Tensor_attributes().set_name("q").set_uid(kQ).set_dim({B, nh, S, hd}).set_stride(
        {S * q_ld, hd, q_ld, 1}));
    const std::vector<int64_t> kv_dim{B, nkv, kv_len, hd}, kv_stride{a.max_context * kv_ld, hd, kv_ld, 1};
    auto k = g->tensor(Tensor_attributes().set_name("k").set_uid(kK).set_dim(kv_dim).set_stride(kv_stride));
    auto v = g->tensor(Tensor_attributes().set_name("v").set_uid(kV).set_dim(kv_dim).set_stride(kv_stride));
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("causal_prefill")
                    .set_generate_stats(false)
                    .set_attn_scale(a.scale)
                    .set_diagonal_alignment(past == 0 ? fe::DiagonalAlignment_t::TOP_LEFT
                                                      : fe::DiagonalAlignment_t::BOTTOM_RIGHT)
                    .set_diagonal_band_right_bound(0);
    auto [o, stats] = g->sdpa(q, k, v, opts);
    (void)stats;
    o->set_output(true).set_uid(kO).set_dim({B, nh, S, hd}).set_stride({S * o_ld, hd, o_ld, 1});
    if (auto e = g->validate(); e.is_bad()) return fe_message("validate", e);
    if (auto e = g->build_operation_graph(handle); e.is_bad()) return fe_message("build_operation_graph", e);
    if (auto e = g->create_execution_plans({fe::HeurMode_t::A}); e.is_bad())
      return fe_message("create_execution_plans", e);
    if (auto e = g->check_support(handle); e.is_bad()) return fe_message("check_support", e);
    if (auto e = g->build_plans(handle); e.is_bad()) return fe_message("build_plans", e);
    int64_t ws = 0;
    if (auto e = g->get_workspace_size(ws); e.is_bad()) return fe_message("get_workspace_size", e);
    out->graph = std::move(g);
    out->workspace = ws;
    return {};
  }
};

bool CudnnSdpa::available(std::string* why) {
  const Library& lib = library();
  if (why) *why = lib.why;
  return lib.ok;
}

int64_t CudnnSdpa::version() { return library().ok ? library().version : 0; }

CudnnSdpa::CudnnSdpa() : impl_(std::make_unique<Impl>()) {}
CudnnSdpa::~CudnnSdpa() = default;

bool CudnnSdpa::run(const AttentionArgs& a, int64_t past, cudaStream_t stream, std::string* why) {
  std::string reason;
  if (!why) why = &reason;
  if (!available(why)) return false;
  TWELL_CHECK(a.B >= 1 && a.S >= 1 && past >= 0 && past + a.S <= a.max_context,
              "CudnnSdpa: ", a.B, " sequences of ", a.S, " tokens at position ", past, " do not fit a context of ",
              a.max_context);
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &a.scale, 4);
  // Not while capturing: a plan holds `past` and the workspace, and a replay at another position
  // (or after the workspace grew) would use stale ones. Callers then run twell's kernel, which
  // reads the position from the device.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TWELL_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    *why = "the stream is capturing a CUDA graph (cuDNN's plans hold the position and the workspace)";
    return false;
  }
  const Impl::Key key{a.B, a.S, past, a.nh, a.nkv, a.hd, a.max_context, scale_bits};
  const Impl::Plan* p = impl_->plan(key, a, past, stream, why);
  if (!p) return false;
  if (fe::detail::set_stream(impl_->handle, stream) != CUDNN_STATUS_SUCCESS)
    throw Error("CudnnSdpa: cudnnSetStream failed");
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<uint16_t*>(a.qkv)},
                                          {kK, const_cast<uint16_t*>(a.k_cache)},
                                          {kV, const_cast<uint16_t*>(a.v_cache)},
                                          {kO, a.o}};
  if (auto e = p->graph->execute(impl_->handle, pack, impl_->workspace.get()); e.is_bad())
    throw Error(fe_message("execute", e));
  return true;
}

size_t CudnnSdpa::workspace_bytes() const { return impl_->workspace.bytes(); }

#else  // built without the cuDNN frontend headers

struct CudnnSdpa::Impl {};

bool CudnnSdpa::available(std::string* why) {
  if (why) *why = "this build has no cuDNN frontend headers (scripts/install-deps.sh fetches them)";
  return false;
}
int64_t CudnnSdpa::version() { return 0; }
CudnnSdpa::CudnnSdpa() = default;
CudnnSdpa::~CudnnSdpa() = default;
bool CudnnSdpa::run(const AttentionArgs&, int64_t, cudaStream_t, std::string* why) {
  available(why);
  return false;
}
size_t CudnnSdpa::workspace_bytes() const { return 0; }

#endif

}  // namespace twell::cuda
