// twell's C interface (twell/c_api.h): argument translation and exception barriers around the C++ API.
#include "twell/c_api.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "twell/cpu/ffn.h"
#include "twell/error.h"
#include "twell/model/chat_template.h"
#include "twell/model/load.h"
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
static_assert(offsetof(twell_cuda_ffn_config, cublaslt_workspace) == 40 &&
              offsetof(twell_cuda_ffn_config, cublaslt_workspace_bytes) == 48);
static_assert(unsigned{TWELL_SAMPLE_TEMPERATURE} == twell::model::kSampleTemperature &&
              unsigned{TWELL_SAMPLE_TOP_K} == twell::model::kSampleTopK &&
              unsigned{TWELL_SAMPLE_TOP_P} == twell::model::kSampleTopP &&
              unsigned{TWELL_SAMPLE_MIN_P} == twell::model::kSampleMinP &&
              unsigned{TWELL_SAMPLE_REPETITION_PENALTY} == twell::model::kSampleRepetitionPenalty);
static_assert(sizeof(twell_model_options) == 80 && sizeof(twell_model_info) == 80 && sizeof(twell_sampling) == 64 &&
              sizeof(twell_generation) == 32 && sizeof(twell_tokenizer_info) == 20);
static_assert(offsetof(twell_model_options, log) == 32 && offsetof(twell_model_options, gpu_memory) == 48 &&
              offsetof(twell_model_options, max_batch) == 56 && offsetof(twell_model_options, max_tokens) == 64 &&
              offsetof(twell_model_info, max_batch) == 72 &&
              offsetof(twell_generation, prefill_seconds) == 16);
static_assert(TWELL_STOP_TOKEN == static_cast<int>(twell::model::StopReason::stop_token) &&
              TWELL_STOP_MAX_TOKENS == static_cast<int>(twell::model::StopReason::max_tokens) &&
              TWELL_STOP_CONTEXT_FULL == static_cast<int>(twell::model::StopReason::context_full) &&
              TWELL_STOP_CALLBACK == static_cast<int>(twell::model::StopReason::callback));

struct twell_model {
  std::unique_ptr<twell::model::LanguageModel> model;
  bool on_gpu = false;
  // Made without a KV cache (twell_model_options.kv_cache 0, GPU): whole-sequence forwards alone, and a
  // generation of at most one token.
  bool no_kv_cache = false;
  // The KV cache holds a generation twell_model_generate(_batch) finished, which nothing continues:
  // the whole-sequence calls empty it first (whole_sequence_model) rather than refuse.
  bool generation_done = false;
  // A generation is running: its token callback may not call the model (it would change the cache
  // under the generation).
  bool generating = false;
  bool prefix_reuse = false;             // twell_model_set_prefix_reuse
  twell::model::PromptCache prompt_cache;  // what twell_model_generate left in the KV cache
};
struct twell_tokenizer {
  std::unique_ptr<twell::model::Tokenizer> tokenizer;
};
struct twell_chat_template {
  std::optional<twell::model::ChatTemplate> chat_template;
  std::string text;  // what the last apply returned (the caller reads it until the next call)
};
struct twell_text_stream {
  std::unique_ptr<twell::model::TextStream> stream;
  std::string piece;  // what the last put or finish returned (the caller reads it until the next call)
};
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
  } catch (abi::__forced_unwind&) {  // a thread cancelled or exiting (pthread_exit) inside a callback: let it end
    throw;
  } catch (...) {
    last_error = "unknown error";
  }
  return TWELL_ERROR;
}

// The view of a C tensor; empty where it is NULL, or has no data and ndim 0 (an argument not given).
// A tensor of no elements (a dimension 0: PyTorch's data_ptr() of an empty tensor is NULL) is given:
// its view points at kNoElements (never read), so it is checked as the argument it stands for (a wg of
// [0, H] was taken as "no wg", a non-gated FFN; a dx of no elements for M = 10 was skipped). No data
// with a shape of elements is refused: taken as "not given", a forgotten pointer would turn a gated
// FFN into a non-gated one, or skip a gradient, silently.
alignas(256) char kNoElements[256];
TensorView view(const twell_tensor* t, const char* name) {
  if (t == nullptr) return {};
  if (t->data == nullptr &&
      !(t->ndim >= 1 && t->ndim <= TWELL_MAX_DIMS && std::count(t->shape, t->shape + t->ndim, int64_t{0}) > 0)) {
    TWELL_REQUIRE(t->ndim == 0, name, ": data is NULL but ndim is ", t->ndim, " (a shape of elements): an argument "
                  "not given is a NULL tensor pointer, or a tensor of ndim 0");
    return {};
  }
  TWELL_REQUIRE(t->ndim >= 1 && t->ndim <= TWELL_MAX_DIMS, name, ": ndim must be 1 to ", TWELL_MAX_DIMS, ", got ",
                t->ndim);
  TWELL_REQUIRE(t->dtype >= TWELL_DTYPE_BF16 && t->dtype <= TWELL_DTYPE_F64, name,
                ": dtype must be a twell_dtype (TWELL_DTYPE_BF16, _F16, _F32 or _F64), got ", t->dtype);
  TWELL_REQUIRE(t->device == TWELL_DEVICE_CPU || t->device == TWELL_DEVICE_CUDA, name,
                ": device must be TWELL_DEVICE_CPU or TWELL_DEVICE_CUDA, got ", t->device);
  Shape shape(t->shape, t->shape + t->ndim);
  for (int64_t d : shape) TWELL_REQUIRE(d >= 0, name, ": negative dimension in ", shape_str(shape));
  try {
    checked_nbytes(static_cast<DType>(t->dtype), shape);  // no product past 64 bits: no caller owns that
  } catch (const Error& e) {
    throw Error(str(name, ": ", e.what()));
  }
  const size_t element = dtype_size(static_cast<DType>(t->dtype));
  TWELL_REQUIRE(reinterpret_cast<uintptr_t>(t->data) % element == 0, name, ": data at ", t->data,
                " is not aligned to its elements (", element, " bytes)");
  void* data = t->data != nullptr ? t->data : kNoElements;  // NULL here: a shape of no elements
  return TensorView(data, static_cast<DType>(t->dtype), std::move(shape), static_cast<Device>(t->device));
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
  TWELL_REQUIRE(c->max_tokens > 0 && c->hidden > 0 && c->ffn > 0,
                "twell_cuda_ffn_config: max_tokens, hidden and ffn must be positive, got ", c->max_tokens, ", ",
                c->hidden, " and ", c->ffn);
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
  TWELL_REQUIRE(c->cublaslt_workspace_bytes >= 0, "twell_cuda_ffn_config: cublaslt_workspace_bytes must be >= 0, got ",
                c->cublaslt_workspace_bytes);
  o.cublaslt_workspace = c->cublaslt_workspace;
  o.cublaslt_workspace_bytes = static_cast<size_t>(c->cublaslt_workspace_bytes);
  return o;
}

twell::cuda::FfnForward& object(twell_cuda_ffn* ffn) {
  TWELL_REQUIRE(ffn != nullptr, "twell_cuda_ffn: NULL");
  return ffn->forward;
}
#endif

twell::model::LanguageModel& object(twell_model* m) {
  TWELL_REQUIRE(m != nullptr && m->model, "twell_model: NULL");
  TWELL_REQUIRE(!m->generating, "twell_model: called from this model's token callback while it generates; call it "
                "after twell_model_generate returns (or on a second model)");
  return *m->model;
}

// A generation of more than one token decodes: refused up front without a KV cache (it failed after
// the prompt's forward, with a token already passed to the callback).
void check_cache_for(const twell_model* m, int64_t max_new_tokens, const char* op) {
  TWELL_REQUIRE(!m->no_kv_cache || max_new_tokens <= 1, op, ": the model was made without a KV cache "
                "(twell_model_options.kv_cache 0: whole-sequence forwards), so a generation draws at most one token; "
                "got max_new_tokens ", max_new_tokens);
}

// m->generating for the life of a generation; after it, however it ends (an error half way too: its
// cache holds what no caller can continue), a finished generation (generation_done).
struct Generating {
  twell_model* m;
  explicit Generating(twell_model* model) : m(model) { m->generating = true; }
  ~Generating() { m->generating = false, m->generation_done = true; }
};

// The checks of generation prompts the model would make, in the C call's words (`op`), of one prompt
// or more (`batch`: each named by its index) at least one token each, every id in the vocabulary,
// none longer than the context.
void check_prompts(const twell::model::LanguageModel& m, const std::vector<std::vector<int32_t>>& prompts,
                   const std::string& op, bool batch) {
  TWELL_REQUIRE(static_cast<int64_t>(prompts.size()) <= m.max_batch(), op, ": ", prompts.size(),
                " prompts exceed the model's max_batch of ", m.max_batch());
  if (batch) {
    twell::model::check_sequences(m.config(), prompts, 1, (op + ": prompt").c_str(), m.context());
    return;
  }
  twell::model::check_token_ids(m.config(), prompts[0], false, op + ": prompt");
  TWELL_REQUIRE(static_cast<int64_t>(prompts[0].size()) <= m.context(), op, ": prompt of ", prompts[0].size(),
                " tokens exceeds the model's context of ", m.context(), " positions");
}

// The model for forwards of `ids` from position 0 (logits, perplexity, token NLL, FFN statistics) of
// up to `forward` tokens each, everything the call can refuse checked first (at least `least` ids,
// each in the vocabulary, forwards within the context; the caller checks its own arguments before),
// then, on the GPU, a KV cache that holds only a finished twell_model_generate(_batch) emptied:
// there those forwards run in the cache's memory and refuse a generation in progress (prefill,
// decode_step), which a finished one is not. The CPU's forwards leave its cache alone.
twell::model::LanguageModel& whole_sequence_model(twell_model* m, const std::vector<int32_t>& ids, const char* op,
                                                  int64_t least, int64_t forward) {
  twell::model::LanguageModel& model = object(m);
  TWELL_REQUIRE(!ids.empty(), op, ": no tokens");
  TWELL_REQUIRE(static_cast<int64_t>(ids.size()) >= least, op, ": need at least ", least, " tokens, got ", ids.size());
  twell::model::check_token_ids(model.config(), ids);
  TWELL_REQUIRE(forward <= model.context(), op, ": a forward of ", forward, " tokens exceeds the model's context of ",
                model.context(), " positions");
  if (m->generation_done && m->on_gpu) {
    model.reset();
    m->generation_done = false;
  }
  return model;
}

const twell::model::Tokenizer& object(const twell_tokenizer* t) {
  TWELL_REQUIRE(t != nullptr && t->tokenizer, "twell_tokenizer: NULL");
  return *t->tokenizer;
}

twell_text_stream& object(twell_text_stream* s) {
  TWELL_REQUIRE(s != nullptr && s->stream, "twell_text_stream: NULL");
  return *s;
}
const twell_text_stream& object(const twell_text_stream* s) { return object(const_cast<twell_text_stream*>(s)); }

twell_chat_template& object(twell_chat_template* t) {
  TWELL_REQUIRE(t != nullptr && t->chat_template, "twell_chat_template: NULL");
  return *t;
}

// A text stream's piece, kept in the stream for the caller to read until its next call.
void give_piece(twell_text_stream& s, std::string piece, const char** text, size_t* len) {
  s.piece = std::move(piece);
  *text = s.piece.data();
  *len = s.piece.size();
}

// ids[0..n) as a vector, checked as the model's calls check them.
std::vector<int32_t> id_vector(const int32_t* ids, int64_t n, const char* op) {
  TWELL_REQUIRE(n >= 0, op, ": the token count must be at least 0, got ", n);
  TWELL_REQUIRE(ids != nullptr || n == 0, op, ": ids is NULL");
  return std::vector<int32_t>(ids, ids + n);
}

// Stop ids: a negative one is no token's (one past the vocabulary may be a config's, and is never met).
std::vector<int32_t> stop_vector(const int32_t* ids, int64_t n, const char* op) {
  std::vector<int32_t> stops = id_vector(ids, n, op);
  for (const int32_t id : stops) TWELL_REQUIRE(id >= 0, op, ": ", id, " is not a token id");
  return stops;
}

// A host tensor's values into out as f32.
void copy_out(const Tensor& t, float* out) {
  if (t.dtype() == DType::f32) {
    std::memcpy(out, t.ptr<float>(), t.nbytes());
  } else {
    const std::vector<float> f = to_f32(t);
    std::copy(f.begin(), f.end(), out);
  }
}

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

int twell_cpu_set_num_threads(int32_t n, int32_t* previous) {
  return guarded([&] {
    TWELL_REQUIRE(n >= 0 && n <= 4096, "twell_cpu_set_num_threads: n must lie in [0, 4096] (0: the default), got ", n);
    const int before = cpu::set_num_threads(n);
    if (previous) *previous = before;
  });
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
    const cuda::FfnShape shape = shape_of(config);  // the arguments first, on any machine
    const cuda::FfnOptions options = options_of(config);
    std::string why;  // the plan reads the GPU's properties: said as twell_cuda_ffn_create says it
    TWELL_REQUIRE(cuda::hopper_available(&why), "twell_cuda_ffn_workspace_bytes: ", why);
    *bytes = cuda::FfnForward::required_workspace_bytes(shape, options);
#else
    throw Error(kNoCuda);
#endif
  });
}

int twell_cuda_ffn_create(const twell_cuda_ffn_config* config, void* workspace, size_t workspace_bytes,
                          twell_cuda_ffn** out) {
  return guarded([&] {
    TWELL_REQUIRE(out != nullptr, "twell_cuda_ffn_create: out is NULL");
    *out = nullptr;
    TWELL_REQUIRE(workspace != nullptr || workspace_bytes == 0, "twell_cuda_ffn_create: workspace is NULL with ",
                  workspace_bytes, " bytes (NULL: the object allocates its own; give 0 bytes with it)");
#if TWELL_WITH_CUDA
    const cuda::FfnShape shape = shape_of(config);  // the arguments first, on any machine
    const cuda::FfnOptions options = options_of(config);
    std::string why;
    TWELL_REQUIRE(cuda::hopper_available(&why), "twell_cuda_ffn_create: ", why);
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

int twell_cuda_ffn_use_workspace(twell_cuda_ffn* ffn, void* workspace, size_t workspace_bytes) {
  return guarded([&] {
#if TWELL_WITH_CUDA
    TWELL_REQUIRE(workspace != nullptr, "twell_cuda_ffn_use_workspace: workspace is NULL");
    object(ffn).use_workspace(workspace, workspace_bytes);
#else
    throw Error(kNoCuda);
#endif
  });
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

int twell_cuda_release_scratch(void) {
  return guarded([&] {
#if TWELL_WITH_CUDA
    std::string why;
    TWELL_REQUIRE(cuda::hopper_available(&why), "twell_cuda_release_scratch: ", why);
    cuda::release_scratch();
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

int twell_parse_bytes(const char* text, int64_t* bytes) {
  return guarded([&] {
    TWELL_REQUIRE(text != nullptr && bytes != nullptr, "twell_parse_bytes: NULL argument");
    *bytes = static_cast<int64_t>(parse_bytes(text));  // below 9.2e18, which int64 holds
  });
}

void twell_model_options_init(twell_model_options* options) {
  if (options == nullptr) return;
  *options = twell_model_options{};
  options->device = TWELL_CHOOSE_AUTO;
  options->check_finite = 1;
  options->kv_cache = 1;
}

int twell_model_load(const char* dir, const twell_model_options* options, twell_model** out) {
  return guarded([&] {
    TWELL_REQUIRE(out != nullptr, "twell_model_load: out is NULL");
    *out = nullptr;
    TWELL_REQUIRE(dir != nullptr, "twell_model_load: dir is NULL");
    twell_model_options c;
    twell_model_options_init(&c);
    if (options != nullptr) c = *options;
    TWELL_REQUIRE(c.reserved0 == 0 && c.reserved[0] == 0,
                  "twell_model_options: reserved fields must be 0 (twell_model_options_init sets them)");
    TWELL_REQUIRE(c.device >= TWELL_CHOOSE_AUTO && c.device <= TWELL_CHOOSE_CUDA,
                  "twell_model_options: device must be TWELL_CHOOSE_AUTO, _CPU or _CUDA, got ", c.device);
    model::ModelLoadOptions o;
    o.device = c.device == TWELL_CHOOSE_CPU    ? model::DeviceChoice::cpu
               : c.device == TWELL_CHOOSE_CUDA ? model::DeviceChoice::cuda
                                               : model::DeviceChoice::automatic;
    o.dense_ffn = c.dense_ffn != 0;
    o.bf16_ffn = c.bf16_ffn != 0;
    o.check_finite = c.check_finite != 0;
    TWELL_REQUIRE(c.context >= 0, "twell_model_options: context must be at least 0 (0: the config's), got ", c.context);
    o.context = c.context;
    o.kv_cache = c.kv_cache != 0;
    TWELL_REQUIRE(c.gpu_memory >= 0, "twell_model_options: gpu_memory must be at least 0 (0: all), got ", c.gpu_memory);
    o.gpu_memory = static_cast<size_t>(c.gpu_memory);
    TWELL_REQUIRE(c.max_batch >= 0 && c.max_batch <= 65535,
                  "twell_model_options: max_batch must lie in [0, 65535] (0: 1), got ", c.max_batch);
    o.max_batch = c.max_batch > 0 ? c.max_batch : 1;
    TWELL_REQUIRE(c.max_tokens >= 0, "twell_model_options: max_tokens must be at least 0 (0: the default), got ",
                  c.max_tokens);
    o.max_tokens = c.max_tokens;
    o.max_tokens_choice_name = "twell_model_options: max_tokens";
    if (c.log != nullptr) o.log = [log = c.log, user = c.log_user](const std::string& line) { log(line.c_str(), user); };
    o.cuda_choice_name = "device cuda";
    o.cpu_choice_name = "device cpu";
    auto m = std::make_unique<twell_model>();
    m->model = model::load_model(dir, o);
    m->on_gpu = dynamic_cast<const model::LlamaCpu*>(m->model.get()) == nullptr;
    m->no_kv_cache = m->on_gpu && !o.kv_cache;
    *out = m.release();
  });
}

void twell_model_destroy(twell_model* model) {
  if (model != nullptr && model->generating) {  // from its own token callback: the generation still runs on it
    std::fprintf(stderr, "twell_model_destroy: called from the model's own token callback; not destroyed\n");
    return;
  }
  try {
    delete model;
  } catch (...) {  // a destructor's CUDA error: nothing a C caller could do with it
  }
}

int twell_model_get_info(const twell_model* model, twell_model_info* info) {
  return guarded([&] {
    TWELL_REQUIRE(model != nullptr && model->model, "twell_model: NULL");
    TWELL_REQUIRE(info != nullptr, "twell_model_get_info: info is NULL");
    const io::ModelConfig& c = model->model->config();
    *info = twell_model_info{c.vocab_size,
                             c.hidden_size,
                             c.intermediate_size,
                             c.num_hidden_layers,
                             c.num_attention_heads,
                             c.num_key_value_heads,
                             c.head_dim,
                             model->model->context(),
                             model->on_gpu ? TWELL_DEVICE_CUDA : TWELL_DEVICE_CPU,
                             c.hidden_act == "relu" ? 1 : 0,
                             model->model->max_batch()};
  });
}

int twell_model_logits(twell_model* model, const int32_t* ids, int64_t n, float* logits,
                       twell_activation_stats* layer_stats) {
  return guarded([&] {
    const std::vector<int32_t> v = id_vector(ids, n, "twell_model_logits");
    TWELL_REQUIRE(logits != nullptr || v.empty(), "twell_model_logits: the logits buffer is NULL");
    model::LanguageModel& m = whole_sequence_model(model, v, "twell_model_logits", 1, n);
    std::vector<ActivationStats> stats;
    const Tensor t = m.logits(v, layer_stats ? &stats : nullptr);
    copy_out(t, logits);
    if (layer_stats != nullptr)
      for (int64_t l = 0; l < m.config().num_hidden_layers; ++l) {
        const ActivationStats s = static_cast<size_t>(l) < stats.size() ? stats[l] : ActivationStats{};
        layer_stats[l] = twell_activation_stats{s.tokens, s.nnz, s.max_nnz_per_token, s.l1_sum};
      }
  });
}

int twell_model_prefill(twell_model* model, const int32_t* ids, int64_t n, float* logits) {
  return guarded([&] {
    model::LanguageModel& m = object(model);
    TWELL_REQUIRE(logits != nullptr, "twell_model_prefill: the logits buffer is NULL");
    TWELL_REQUIRE(n >= 1, "twell_model_prefill: need at least 1 token, got ", n);
    copy_out(m.prefill(id_vector(ids, n, "twell_model_prefill")), logits);
    model->generation_done = false;
  });
}

int twell_model_decode_step(twell_model* model, int32_t id, float* logits) {
  return guarded([&] {
    model::LanguageModel& m = object(model);
    TWELL_REQUIRE(logits != nullptr, "twell_model_decode_step: the logits buffer is NULL");
    TWELL_REQUIRE(m.cached_lengths().size() <= 1, "twell_model_decode_step: the KV cache holds the ",
                  m.cached_lengths().size(), " sequences of twell_model_generate_batch, which a step of one token "
                  "cannot continue; twell_model_prefill (or twell_model_reset) first");
    copy_out(m.decode_step(id), logits);
    model->generation_done = false;  // continued: the caller's generation now
  });
}

int twell_model_reset(twell_model* model) {
  return guarded([&] {
    object(model).reset();
    model->generation_done = false;
  });
}

int twell_model_cached_tokens(const twell_model* model, int64_t* n) {
  return guarded([&] {
    TWELL_REQUIRE(model != nullptr && model->model, "twell_model: NULL");
    TWELL_REQUIRE(n != nullptr, "twell_model_cached_tokens: n is NULL");
    *n = model->model->cached_tokens();
  });
}

int twell_model_eos_ids(const twell_model* model, int32_t* ids, int64_t capacity, int64_t* n) {
  return guarded([&] {
    TWELL_REQUIRE(model != nullptr && model->model, "twell_model: NULL");
    TWELL_REQUIRE(n != nullptr, "twell_model_eos_ids: n is NULL");
    TWELL_REQUIRE(capacity >= 0 && (ids != nullptr || capacity == 0),
                  "twell_model_eos_ids: ids must have room for capacity ids");
    const std::vector<int32_t>& eos = model->model->config().eos_token_ids;
    *n = static_cast<int64_t>(eos.size());
    std::copy_n(eos.begin(), std::min<int64_t>(capacity, *n), ids);
  });
}

int twell_model_generation_sampling(const twell_model* model, twell_sampling* sampling, uint32_t given,
                                    uint32_t* taken, const char** unapplied) {
  return guarded([&] {
    TWELL_REQUIRE(model != nullptr && model->model, "twell_model: NULL");
    TWELL_REQUIRE(sampling != nullptr, "twell_model_generation_sampling: sampling is NULL");
    TWELL_REQUIRE((given & ~uint32_t{model::kSampleAllFields}) == 0,
                  "twell_model_generation_sampling: given holds bits that are no TWELL_SAMPLE_ field: ", given);
    const io::GenerationDefaults& g = model->model->config().generation;
    if (unapplied) *unapplied = g.unapplied.c_str();
    model::SamplingOptions mine;
    mine.temperature = sampling->temperature;
    mine.top_k = sampling->top_k;
    mine.top_p = sampling->top_p;
    mine.min_p = sampling->min_p;
    mine.repetition_penalty = sampling->repetition_penalty;
    unsigned took = 0;
    const model::SamplingOptions o = model::with_generation_config(mine, given, g, &took);  // throws first
    sampling->temperature = o.temperature;
    sampling->top_k = o.top_k;
    sampling->top_p = o.top_p;
    sampling->min_p = o.min_p;
    sampling->repetition_penalty = o.repetition_penalty;
    if (taken) *taken = took;
  });
}

int twell_model_perplexity(twell_model* model, const int32_t* ids, int64_t n, double* mean_nll, double* perplexity) {
  return guarded([&] {
    const std::vector<int32_t> v = id_vector(ids, n, "twell_model_perplexity");
    const model::Perplexity p = model::perplexity(whole_sequence_model(model, v, "twell_model_perplexity", 2, n), v);
    if (mean_nll) *mean_nll = p.mean_nll;
    if (perplexity) *perplexity = p.perplexity;
  });
}

int twell_model_perplexity_windows(twell_model* model, const int32_t* ids, int64_t n, int64_t window, int64_t stride,
                                   double* mean_nll, double* perplexity, int64_t* predictions) {
  return guarded([&] {
    const std::vector<int32_t> v = id_vector(ids, n, "twell_model_perplexity_windows");
    TWELL_REQUIRE(window >= 2, "twell_model_perplexity_windows: a window holds at least 2 tokens, got ", window);
    TWELL_REQUIRE(stride >= 1 && stride <= window, "twell_model_perplexity_windows: the stride must lie in [1, window = ",
                  window, "], got ", stride);
    const model::LanguageModel& m =
        whole_sequence_model(model, v, "twell_model_perplexity_windows", 2, std::min(window, n));
    const model::Perplexity p = model::windowed_perplexity(m, v, window, stride);
    if (mean_nll) *mean_nll = p.mean_nll;
    if (perplexity) *perplexity = p.perplexity;
    if (predictions) *predictions = p.predictions;
  });
}

int twell_model_ffn_stats(twell_model* model, const int32_t* ids, int64_t n, int64_t window,
                          twell_activation_stats* layer_stats) {
  return guarded([&] {
    TWELL_REQUIRE(layer_stats != nullptr, "twell_model_ffn_stats: layer_stats is NULL");
    const std::vector<int32_t> v = id_vector(ids, n, "twell_model_ffn_stats");
    TWELL_REQUIRE(window >= 1, "twell_model_ffn_stats: the window must be at least 1 token, got ", window);
    const model::LanguageModel& m = whole_sequence_model(model, v, "twell_model_ffn_stats", 1, std::min(window, n));
    const std::vector<ActivationStats> stats = model::ffn_stats_in_windows(m, v, window);
    for (int64_t l = 0; l < m.config().num_hidden_layers; ++l) {
      const ActivationStats s = static_cast<size_t>(l) < stats.size() ? stats[l] : ActivationStats{};
      layer_stats[l] = twell_activation_stats{s.tokens, s.nnz, s.max_nnz_per_token, s.l1_sum};
    }
  });
}

int twell_model_token_nll(twell_model* model, const int32_t* ids, int64_t n, double* nll) {
  return guarded([&] {
    TWELL_REQUIRE(nll != nullptr, "twell_model_token_nll: nll is NULL");
    const std::vector<int32_t> v = id_vector(ids, n, "twell_model_token_nll");
    const std::vector<double> out = whole_sequence_model(model, v, "twell_model_token_nll", 2, n).next_token_nll(v);
    std::copy(out.begin(), out.end(), nll);
  });
}

void twell_sampling_init(twell_sampling* sampling) {
  if (sampling == nullptr) return;
  *sampling = twell_sampling{};
  sampling->top_p = 1.0;
  sampling->repetition_penalty = 1.0;
}

namespace {
// The sampling options of a twell_sampling (NULL: greedy), checked.
model::SamplingOptions sampling_options(const twell_sampling* sampling) {
  model::SamplingOptions so;
  if (sampling != nullptr) {
    TWELL_REQUIRE(sampling->reserved[0] == 0,
                  "twell_sampling: reserved fields must be 0 (twell_sampling_init sets them)");
    so.temperature = sampling->temperature;
    so.top_k = sampling->top_k;
    so.top_p = sampling->top_p;
    so.seed = sampling->seed;
    so.vocab_limit = sampling->vocab_limit;
    so.min_p = sampling->min_p;
    // 0 is what a caller built before the field (a reserved word then) leaves there: off, as 1 is.
    so.repetition_penalty = sampling->repetition_penalty == 0 ? 1.0 : sampling->repetition_penalty;
  }
  so.check();
  return so;
}
}  // namespace

int twell_model_generate(twell_model* model, const int32_t* prompt, int64_t n_prompt, int64_t max_new_tokens,
                         const twell_sampling* sampling, const int32_t* stop, int64_t n_stop, twell_token_fn on_token,
                         void* user, int32_t* tokens, twell_generation* result) {
  return guarded([&] {
    model::LanguageModel& m = object(model);
    TWELL_REQUIRE(result != nullptr, "twell_model_generate: result is NULL");
    TWELL_REQUIRE(max_new_tokens >= 0, "twell_model_generate: max_new_tokens must be at least 0, got ",
                  max_new_tokens);
    TWELL_REQUIRE(tokens != nullptr || max_new_tokens == 0, "twell_model_generate: tokens is NULL");
    check_cache_for(model, max_new_tokens, "twell_model_generate");
    const model::SamplingOptions so = sampling_options(sampling);
    const std::vector<int32_t> p = id_vector(prompt, n_prompt, "twell_model_generate");
    const std::vector<int32_t> stops = stop_vector(stop, n_stop, "twell_model_generate (stop tokens)");
    // A stop token ends the generation as one whatever the callback says (generate_batch's rule).
    std::function<bool(int64_t, int32_t)> seen;
    if (on_token != nullptr) seen = [&](int64_t, int32_t t) { return on_token(t, user) != 0; };
    TWELL_REQUIRE(!p.empty(), "twell_model_generate: empty prompt");
    check_prompts(m, {p}, "twell_model_generate", false);
    const Generating busy(model);
    model::PromptCache* cache = model->prefix_reuse ? &model->prompt_cache : nullptr;
    const model::Generation g = model::generate_batch(m, {p}, max_new_tokens, so, stops, seen, cache)[0];
    std::copy(g.tokens.begin(), g.tokens.end(), tokens);
    *result = twell_generation{static_cast<int64_t>(g.tokens.size()), static_cast<int32_t>(g.reason),
                               static_cast<int32_t>(g.reused), g.prefill_seconds, g.decode_seconds};
  });
}

int twell_model_set_prefix_reuse(twell_model* model, int32_t on) {
  return guarded([&] {
    object(model);  // checks it
    model->prefix_reuse = on != 0;
  });
}

int twell_model_generate_batch(twell_model* model, const int32_t* prompts, const int64_t* offsets, int64_t n_prompts,
                               int64_t max_new_tokens, const twell_sampling* sampling, const int32_t* stop,
                               int64_t n_stop, twell_batch_token_fn on_token, void* user, int32_t* tokens,
                               twell_generation* results) {
  return guarded([&] {
    model::LanguageModel& m = object(model);
    TWELL_REQUIRE(n_prompts >= 1, "twell_model_generate_batch: n_prompts must be at least 1, got ", n_prompts);
    TWELL_REQUIRE(prompts != nullptr && offsets != nullptr && results != nullptr,
                  "twell_model_generate_batch: prompts, offsets or results is NULL");
    TWELL_REQUIRE(max_new_tokens >= 0, "twell_model_generate_batch: max_new_tokens must be at least 0, got ",
                  max_new_tokens);
    TWELL_REQUIRE(tokens != nullptr || max_new_tokens == 0, "twell_model_generate_batch: tokens is NULL");
    check_cache_for(model, max_new_tokens, "twell_model_generate_batch");
    const model::SamplingOptions so = sampling_options(sampling);
    TWELL_REQUIRE(offsets[0] == 0, "twell_model_generate_batch: offsets[0] must be 0, got ", offsets[0]);
    std::vector<std::vector<int32_t>> ps;
    for (int64_t b = 0; b < n_prompts; ++b) {
      TWELL_REQUIRE(offsets[b + 1] > offsets[b], "twell_model_generate_batch: prompt ", b, " is empty (offsets ",
                    offsets[b], " to ", offsets[b + 1], ")");
      ps.push_back(id_vector(prompts + offsets[b], offsets[b + 1] - offsets[b], "twell_model_generate_batch"));
    }
    const std::vector<int32_t> stops = stop_vector(stop, n_stop, "twell_model_generate_batch (stop tokens)");
    std::function<bool(int64_t, int32_t)> seen;
    if (on_token != nullptr) seen = [&](int64_t b, int32_t t) { return on_token(b, t, user) != 0; };
    check_prompts(m, ps, "twell_model_generate_batch", true);
    const Generating busy(model);
    const std::vector<model::Generation> g = model::generate_batch(m, ps, max_new_tokens, so, stops, seen);
    for (int64_t b = 0; b < n_prompts; ++b) {
      std::copy(g[b].tokens.begin(), g[b].tokens.end(), tokens + b * max_new_tokens);
      results[b] = twell_generation{static_cast<int64_t>(g[b].tokens.size()), static_cast<int32_t>(g[b].reason), 0,
                                    g[b].prefill_seconds, g[b].decode_seconds};
    }
  });
}

int twell_tokenizer_load(const char* dir, int64_t vocab_size, int32_t bytes, twell_tokenizer** out) {
  return guarded([&] {
    TWELL_REQUIRE(out != nullptr, "twell_tokenizer_load: out is NULL");
    *out = nullptr;
    TWELL_REQUIRE(bytes != 0 || dir != nullptr, "twell_tokenizer_load: dir is NULL");
    TWELL_REQUIRE(vocab_size >= 0, "twell_tokenizer_load: vocab_size must be >= 0 (0: none to fit), got ",
                  vocab_size);
    auto t = std::make_unique<twell_tokenizer>();
    t->tokenizer = vocab_size > 0 ? model::load_model_tokenizer(dir ? dir : "", vocab_size, bytes != 0,
                                                                "the byte tokenizer (bytes = 1)")
                   : bytes        ? std::make_unique<model::ByteTokenizer>(true, true)
                                  : model::load_tokenizer(dir);
    *out = t.release();
  });
}

void twell_tokenizer_destroy(twell_tokenizer* tokenizer) { delete tokenizer; }

int twell_tokenizer_get_info(const twell_tokenizer* tokenizer, twell_tokenizer_info* info) {
  return guarded([&] {
    const model::Tokenizer& t = object(tokenizer);
    TWELL_REQUIRE(info != nullptr, "twell_tokenizer_get_info: info is NULL");
    const auto id = [](std::optional<int32_t> v) { return v ? *v : -1; };
    *info = twell_tokenizer_info{t.vocab_size(), id(t.bos_id()), id(t.eos_id()), id(t.bos_to_add()),
                                 id(t.eos_to_add())};
  });
}

int twell_tokenizer_special_ids(const twell_tokenizer* tokenizer, int32_t* ids, int64_t capacity, int64_t* n) {
  return guarded([&] {
    const model::Tokenizer& t = object(tokenizer);
    TWELL_REQUIRE(n != nullptr, "twell_tokenizer_special_ids: n is NULL");
    TWELL_REQUIRE(capacity >= 0 && (ids != nullptr || capacity == 0),
                  "twell_tokenizer_special_ids: ids must have room for capacity ids");
    const std::vector<int32_t> v = t.special_ids();
    *n = static_cast<int64_t>(v.size());
    std::copy_n(v.begin(), std::min<int64_t>(capacity, *n), ids);
  });
}

int twell_tokenizer_encode(const twell_tokenizer* tokenizer, const char* text, size_t len, int32_t* ids,
                           int64_t capacity, int64_t* n) {
  return guarded([&] {
    const model::Tokenizer& t = object(tokenizer);
    TWELL_REQUIRE(n != nullptr, "twell_tokenizer_encode: n is NULL");
    TWELL_REQUIRE(text != nullptr || len == 0, "twell_tokenizer_encode: text is NULL");
    TWELL_REQUIRE(capacity >= 0 && (ids != nullptr || capacity == 0),
                  "twell_tokenizer_encode: ids must have room for capacity ids");
    const std::vector<int32_t> v = t.encode(std::string_view(text ? text : "", len));
    *n = static_cast<int64_t>(v.size());
    std::copy_n(v.begin(), std::min<int64_t>(capacity, *n), ids);
  });
}

int twell_tokenizer_decode(const twell_tokenizer* tokenizer, const int32_t* ids, int64_t n, char* text,
                           size_t capacity, size_t* len) {
  return guarded([&] {
    const model::Tokenizer& t = object(tokenizer);
    TWELL_REQUIRE(len != nullptr, "twell_tokenizer_decode: len is NULL");
    TWELL_REQUIRE(text != nullptr || capacity == 0, "twell_tokenizer_decode: text must have room for capacity bytes");
    const std::string s = t.decode(id_vector(ids, n, "twell_tokenizer_decode"));
    *len = s.size();
    std::copy_n(s.data(), std::min(capacity, s.size()), text);  // nothing where text is NULL and capacity 0
  });
}

int twell_text_stream_create(const twell_tokenizer* tokenizer, const int32_t* context, int64_t n_context,
                             const int32_t* stop, int64_t n_stop, twell_text_stream** out) {
  return guarded([&] {
    TWELL_REQUIRE(out != nullptr, "twell_text_stream_create: out is NULL");
    *out = nullptr;
    const model::Tokenizer& t = object(tokenizer);
    auto s = std::make_unique<twell_text_stream>();
    s->stream = std::make_unique<model::TextStream>(t, id_vector(context, n_context, "twell_text_stream_create"),
                                                    stop_vector(stop, n_stop, "twell_text_stream_create (stop tokens)"));
    *out = s.release();
  });
}

void twell_text_stream_destroy(twell_text_stream* stream) { delete stream; }

int twell_text_stream_put(twell_text_stream* stream, int32_t id, const char** text, size_t* len) {
  return guarded([&] {
    twell_text_stream& s = object(stream);
    TWELL_REQUIRE(text != nullptr && len != nullptr, "twell_text_stream_put: text or len is NULL");
    give_piece(s, s.stream->put(id), text, len);
  });
}

int twell_text_stream_finish(twell_text_stream* stream, const char** text, size_t* len) {
  return guarded([&] {
    twell_text_stream& s = object(stream);
    TWELL_REQUIRE(text != nullptr && len != nullptr, "twell_text_stream_finish: text or len is NULL");
    give_piece(s, s.stream->finish(), text, len);
  });
}

int twell_text_stream_skip_special_tokens(twell_text_stream* stream) {
  return guarded([&] { object(stream).stream->skip_special_tokens(); });
}

int twell_text_stream_stop_at(twell_text_stream* stream, const char* const* strings, const size_t* lengths,
                              int64_t n) {
  return guarded([&] {
    twell_text_stream& s = object(stream);
    TWELL_REQUIRE(n >= 0, "twell_text_stream_stop_at: the count must be at least 0, got ", n);
    TWELL_REQUIRE(n == 0 || (strings != nullptr && lengths != nullptr),
                  "twell_text_stream_stop_at: strings or lengths is NULL");
    std::vector<std::string> given;
    for (int64_t i = 0; i < n; ++i) {
      TWELL_REQUIRE(strings[i] != nullptr || lengths[i] == 0, "twell_text_stream_stop_at: string ", i, " is NULL");
      given.emplace_back(lengths[i] > 0 ? strings[i] : "", lengths[i]);
    }
    s.stream->stop_at(std::move(given));
  });
}

int twell_text_stream_stopped(const twell_text_stream* stream, int* stopped, int64_t* which) {
  return guarded([&] {
    const twell_text_stream& s = object(stream);
    TWELL_REQUIRE(stopped != nullptr, "twell_text_stream_stopped: stopped is NULL");
    *stopped = s.stream->stopped() ? 1 : 0;
    if (which != nullptr) *which = s.stream->stopped_index();
  });
}


int twell_chat_template_load(const char* dir, const char* template_file, const char* name, int tools,
                             twell_chat_template** out) {
  return guarded([&] {
    TWELL_REQUIRE(out != nullptr, "twell_chat_template_load: out is NULL");
    *out = nullptr;
    TWELL_REQUIRE(dir != nullptr || template_file != nullptr, "twell_chat_template_load: dir and template_file are NULL");
    model::ChatTemplateChoice choice;
    choice.file = template_file != nullptr ? template_file : "";
    choice.name = name != nullptr ? name : "";
    choice.tools = tools != 0;
    std::optional<model::ChatTemplate> t = model::load_chat_template(dir != nullptr ? dir : "", choice);
    if (!t) return;
    auto c = std::make_unique<twell_chat_template>();
    c->chat_template = std::move(t);
    *out = c.release();
  });
}

int twell_chat_template_create(const char* text, const char* special_tokens_json, twell_chat_template** out) {
  return guarded([&] {
    TWELL_REQUIRE(out != nullptr, "twell_chat_template_create: out is NULL");
    *out = nullptr;
    TWELL_REQUIRE(text != nullptr, "twell_chat_template_create: text is NULL");
    auto c = std::make_unique<twell_chat_template>();
    c->chat_template.emplace(text);
    if (special_tokens_json != nullptr) c->chat_template->set_special_tokens(special_tokens_json);
    *out = c.release();
  });
}

void twell_chat_template_destroy(twell_chat_template* chat_template) { delete chat_template; }

int twell_chat_template_describe(const twell_chat_template* chat_template, const char** source, size_t* source_len,
                                 const char** text, size_t* text_len) {
  return guarded([&] {
    const model::ChatTemplate& t = *object(const_cast<twell_chat_template*>(chat_template)).chat_template;
    TWELL_REQUIRE((source == nullptr) == (source_len == nullptr) && (text == nullptr) == (text_len == nullptr),
                  "twell_chat_template_describe: give a pointer and its length together");
    if (source) *source = t.source().c_str(), *source_len = t.source().size();
    if (text) *text = t.text().c_str(), *text_len = t.text().size();
  });
}

int twell_chat_template_special_tokens(const char* dir, char* json, size_t capacity, size_t* len) {
  return guarded([&] {
    TWELL_REQUIRE(dir != nullptr && len != nullptr, "twell_chat_template_special_tokens: dir or len is NULL");
    TWELL_REQUIRE(json != nullptr || capacity == 0,
                  "twell_chat_template_special_tokens: json must have room for capacity bytes");
    const std::string s = model::chat_special_tokens(dir);
    *len = s.size();
    std::copy_n(s.data(), std::min(capacity, s.size()), json);
  });
}

int twell_chat_template_apply(twell_chat_template* chat_template, const char* messages_json,
                              int add_generation_prompt, const char* variables_json, const char** text,
                              size_t* len) {
  return guarded([&] {
    twell_chat_template& c = object(chat_template);
    TWELL_REQUIRE(messages_json != nullptr, "twell_chat_template_apply: messages_json is NULL");
    TWELL_REQUIRE(text != nullptr && len != nullptr, "twell_chat_template_apply: text or len is NULL");
    c.text = c.chat_template->apply(messages_json, add_generation_prompt != 0,
                                    variables_json != nullptr ? variables_json : "");
    *text = c.text.c_str();
    *len = c.text.size();
  });
}

}  // extern "C"
