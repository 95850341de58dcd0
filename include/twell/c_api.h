/* twell's C interface: the FFN forward and backward, on the CPU reference backend and on the GPU,
 * and whole models (load, logits, KV-cache decoding, generation, perplexity, the tokenizer), for
 * callers that cannot use C++ (Python through ctypes: python/twell; other languages' FFIs).
 * It wraps a subset of the C++ API of twell/cpu/ffn.h and twell/cuda/ffn.h (the GPU object with the
 * options of twell_cuda_ffn_config; not dispatch slots, the fused residual norm, the TwELL layout or
 * the gather path's settings) and of twell/model/load.h, llama.h and tokenizer.h (one sequence at a
 * time); their comments say what each call computes, its shapes and its rounding points.
 *
 * Built as the shared library libtwell_c.so (CMake target twell_c), which exports these symbols
 * only. Every function that can fail returns TWELL_OK (0) or TWELL_ERROR, and leaves the reason in
 * twell_last_error() (per thread). A call refused for its arguments (shapes, dtypes, devices,
 * alignment, overlapping outputs) has changed nothing: the C++ calls check before they write.
 *
 * Tensors are contiguous, row-major, and described by twell_tensor. An argument not given (an
 * optional one, or a gradient not to compute) is a NULL pointer, or a tensor whose data is NULL and
 * ndim 0 (a zeroed struct). Data NULL with a dimension 0 is a tensor of no elements (PyTorch's
 * data_ptr() of an empty tensor is NULL); data NULL with a shape of elements is refused.
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

/* Bumped whenever a struct or a signature below changes; twell_c_api_version() returns it. The
 * library's file name does not follow it: a program checks twell_c_api_version() == TWELL_C_API_VERSION
 * at start (examples/c_api does), so that a library of other layouts is refused, not misread. */
#define TWELL_C_API_VERSION 10

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
  void* data;     /* NULL: not given where ndim is 0; no elements where a dimension is 0; else refused */
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
/* Threads of the CPU backend (its FFN and models; results do not depend on the count): n in [1, 4096],
 * or 0 for the default (the environment variable TWELL_NUM_THREADS, else every hardware thread). *previous
 * (may be NULL) receives the setting it replaces. */
TWELL_C_API int twell_cpu_set_num_threads(int32_t n, int32_t* previous);
/* wg NULL: the non-gated FFN. stats and h_out may be NULL. */
TWELL_C_API int twell_cpu_ffn_forward(const twell_tensor* x, const twell_tensor* wg, const twell_tensor* wu,
                                      const twell_tensor* wd, const twell_tensor* y, int32_t precision,
                                      twell_activation_stats* stats, const twell_tensor* h_out);
/* Gradients in f32 or f64, written over what they held (not added to); a NULL gradient (or one of ndim 0 and
 * data NULL) is not computed. A gradient of no elements (a dimension 0, data NULL) is given and must have its shape. */
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
  /* FfnOptions::cublaslt_workspace: NULL (with 0 bytes), the handle allocates its own 64 MiB; or device
   * memory, 256-byte aligned, that handles (and other cuBLAS work) whose calls are ordered may share. */
  void* cublaslt_workspace;
  int64_t cublaslt_workspace_bytes;
  int64_t reserved[2]; /* 0: room for options without a new struct (refused when not 0) */
} twell_cuda_ffn_config;

/* FfnShape and FfnOptions' defaults: gated, not training, TWELL_DISPATCH_PREVIOUS, bf16, cuBLASLt's workspace
 * the handle's own; reserved 0. */
TWELL_C_API void twell_cuda_ffn_config_init(twell_cuda_ffn_config* config, int64_t max_tokens, int64_t hidden,
                                            int64_t ffn);
/* FfnForward::required_workspace_bytes on the current device. */
TWELL_C_API int twell_cuda_ffn_workspace_bytes(const twell_cuda_ffn_config* config, size_t* bytes);

/* A handle is bound to the CUDA device current at its creation; call it with that device current.
 * Like a cuBLAS handle it is not thread-safe: one host thread at a time, and calls on different
 * streams ordered by the caller (events), since they share its workspace. */
typedef struct twell_cuda_ffn twell_cuda_ffn;
/* workspace NULL (with workspace_bytes 0): the object allocates its own; otherwise at least twell_cuda_ffn_workspace_bytes of
 * device memory, 256-byte aligned, under the contract of the FfnForward constructor that takes one. */
TWELL_C_API int twell_cuda_ffn_create(const twell_cuda_ffn_config* config, void* workspace, size_t workspace_bytes,
                                      twell_cuda_ffn** out);
TWELL_C_API void twell_cuda_ffn_destroy(twell_cuda_ffn* ffn); /* NULL: nothing */
/* FfnForward::use_workspace: the handle's buffers move to workspace (as twell_cuda_ffn_create takes it;
 * not NULL); its own, if it had one, is freed. A backward then needs a forward first. */
TWELL_C_API int twell_cuda_ffn_use_workspace(twell_cuda_ffn* ffn, void* workspace, size_t workspace_bytes);
/* Enqueued on stream (a cudaStream_t; NULL: the legacy default stream). bf16 tensors on the device. */
TWELL_C_API int twell_cuda_ffn_forward(twell_cuda_ffn* ffn, const twell_tensor* x, const twell_tensor* wg,
                                       const twell_tensor* wu, const twell_tensor* wd, const twell_tensor* y,
                                       void* stream);
/* The backward of the last forward (FfnForward::backward): gradients in f32 on the device, written over what
 * they held (not added to); NULL ones are not computed. */
TWELL_C_API int twell_cuda_ffn_backward(twell_cuda_ffn* ffn, const twell_tensor* x, const twell_tensor* wg,
                                        const twell_tensor* wu, const twell_tensor* wd, const twell_tensor* dy,
                                        double l1_coeff, const twell_tensor* dx, const twell_tensor* dwg,
                                        const twell_tensor* dwu, const twell_tensor* dwd, void* stream);
/* Statistics of the last call (waits for its non-zero count where the sparse path ran). */
TWELL_C_API int twell_cuda_ffn_last_stats(const twell_cuda_ffn* ffn, twell_ffn_stats* stats);
/* Gives the memory twell keeps for the backward's scratch (a stream-ordered pool of the current device,
 * holding the largest call's need) back to the driver; synchronises the device first. */
TWELL_C_API int twell_cuda_release_scratch(void);

/* ---- models (twell/model/load.h, twell/model/llama.h) ---- */
typedef enum twell_device_choice {
  TWELL_CHOOSE_AUTO = 0, /* the GPU where it runs the model (Hopper, a model its runtime takes, memory), else the CPU */
  TWELL_CHOOSE_CPU = 1,  /* the CPU reference backend */
  TWELL_CHOOSE_CUDA = 2  /* the GPU, or an error saying why not */
} twell_device_choice;

/* A line of progress or a note while loading ("loaded …", "backend: …", "warning: …"), no newline. */
typedef void (*twell_log_fn)(const char* line, void* user);

typedef struct {
  int32_t device;       /* twell_device_choice */
  int32_t dense_ffn;    /* GPU FFN of ReLU models: 0 twell's (sparse where it pays), 1 the dense cuBLASLt one */
  int32_t bf16_ffn;     /* CPU backend: round the ReLU FFN's g, u, h to bf16 as a bf16 model does */
  int32_t check_finite; /* 1: refuse weights holding NaN or Inf */
  int64_t context;      /* GPU: positions a sequence holds (the KV cache's size); 0: the config's */
  int32_t kv_cache;     /* GPU: 0 for whole-sequence forwards alone (logits, perplexity; no KV cache: no
                          decode steps, a generation of at most one token) */
  int32_t reserved0;    /* 0 */
  twell_log_fn log;     /* NULL: silent */
  void* log_user;
  int64_t gpu_memory;  /* a cap on the GPU memory the model may take, bytes (0: all that is free), checked
                          at load against what it will allocate; above it TWELL_CHOOSE_AUTO runs it on
                          the CPU and TWELL_CHOOSE_CUDA refuses it */
  int64_t max_batch;   /* GPU: the most sequences one call takes (twell_model_generate_batch), each with a
                          context's KV cache; 0: 1. The CPU backend ignores it (and context, kv_cache and max_tokens) and
                          takes up to 65535 (twell_model_get_info says what the loaded model takes). */
  int64_t max_tokens;  /* GPU: the most tokens one forward computes (its activations' size), at least
                          max_batch, at most max_batch contexts; with kv_cache, longer prompts run in
                          chunks. 0: with kv_cache up to 16384, fewer where the GPU's memory (or
                          gpu_memory) holds the weights and KV cache but not that many (a note in the log
                          says so); without it, max_batch contexts */
  int64_t reserved[1]; /* 0 */
} twell_model_options;

typedef struct {
  int64_t vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim;
  int64_t context; /* positions the KV cache holds at most */
  int32_t device;  /* twell_device: where it runs */
  int32_t relu;    /* 1: a ReLU-gated FFN (twell's sparse path), 0: SiLU */
  int64_t max_batch; /* sequences twell_model_generate_batch takes at most */
} twell_model_info;

/* "40GB", "512M", "1000": bytes (decimal units, as twell prints them), or TWELL_ERROR saying why. */
TWELL_C_API int twell_parse_bytes(const char* text, int64_t* bytes);

/* A model or a tokenizer serves one host thread at a time: its calls change the KV cache and reuse
 * buffers (python/twell's Model holds a lock). Different models may be used from different threads. */

/* TWELL_CHOOSE_AUTO, twell FFN, bf16_ffn 0, check_finite 1, context 0, kv_cache 1, no log. */
TWELL_C_API void twell_model_options_init(twell_model_options* options);
/* The model of dir (config.json, safetensors single or sharded). options NULL: the defaults. */
typedef struct twell_model twell_model;
TWELL_C_API int twell_model_load(const char* dir, const twell_model_options* options, twell_model** out);
TWELL_C_API void twell_model_destroy(twell_model* model); /* NULL: nothing */
TWELL_C_API int twell_model_get_info(const twell_model* model, twell_model_info* info);
/* Logits of every position of ids[0..n) from position 0: n × vocab_size floats into logits.
 * layer_stats NULL, or num_layers entries: each layer's FFN activation statistics (ReLU models; a
 * SiLU model's stay 0; the GPU counts them from dense GEMMs beside its FFN, LlamaCuda::logits). On the
 * GPU these whole-sequence forwards (logits, perplexity, token NLL, FFN statistics) run in the KV
 * cache's memory: once their arguments are checked, they empty a cache that holds a generation
 * twell_model_generate(_batch) finished, and refuse one in progress (after twell_model_prefill or
 * decode_step): twell_model_reset first. The CPU's leave its cache as it is. */
TWELL_C_API int twell_model_logits(twell_model* model, const int32_t* ids, int64_t n, float* logits,
                                   twell_activation_stats* layer_stats);
/* KV-cache decoding: prefill clears the cache and writes the last token's vocab_size logits; a
 * decode step appends one token. */
TWELL_C_API int twell_model_prefill(twell_model* model, const int32_t* ids, int64_t n, float* logits);
TWELL_C_API int twell_model_decode_step(twell_model* model, int32_t id, float* logits);
TWELL_C_API int twell_model_reset(twell_model* model);
TWELL_C_API int twell_model_cached_tokens(const twell_model* model, int64_t* n);
/* The ids that end a generation by default: config.json's and generation_config.json's eos_token_id
 * (the tokenizer's EOS is the caller's to add). *n receives their count; at most capacity are written. */
TWELL_C_API int twell_model_eos_ids(const twell_model* model, int32_t* ids, int64_t capacity, int64_t* n);
/* Perplexity of ids[0..n) (n >= 2) under one forward; log-softmax in double. *perplexity is +inf where
 * exp(*mean_nll) overflows a double (a mean NLL past ~709.8 nats); *mean_nll is then still exact.
 * mean_nll and perplexity may be NULL (here and in twell_model_perplexity_windows). */
TWELL_C_API int twell_model_perplexity(twell_model* model, const int32_t* ids, int64_t n, double* mean_nll,
                                       double* perplexity);
/* Perplexity of ids[0..n) longer than one forward, as `twell eval` scores a text: windows of `window`
 * tokens (>= 2) every `stride` (1..window; = window: no overlap, each window's first token context
 * only; less: HuggingFace's sliding window), each token counted once; *predictions (may be NULL)
 * receives how many were scored. On the GPU up to max_batch neighbouring windows run in one forward.
 * *perplexity is +inf where exp(*mean_nll) overflows a double, as in twell_model_perplexity. */
TWELL_C_API int twell_model_perplexity_windows(twell_model* model, const int32_t* ids, int64_t n, int64_t window,
                                               int64_t stride, double* mean_nll, double* perplexity,
                                               int64_t* predictions);
/* Each layer's FFN activation statistics (num_layers entries into layer_stats; ReLU models, a SiLU
 * model's stay 0) over ids[0..n) (n >= 1), in forwards of `window` tokens (>= 1) that do not
 * overlap: every token counted once, no logits copied out, and the counts given whatever the
 * logits hold (model::ffn_stats_in_windows; on the GPU up to max_batch windows a forward). */
TWELL_C_API int twell_model_ffn_stats(twell_model* model, const int32_t* ids, int64_t n, int64_t window,
                                      twell_activation_stats* layer_stats);
/* Each token's loss: nll[t] = -log p(ids[t+1] | ids[0..t]) for t < n - 1 (room for n - 1; n >= 2),
 * from the same forward as twell_model_perplexity (on the GPU reduced where the logits are). */
TWELL_C_API int twell_model_token_nll(twell_model* model, const int32_t* ids, int64_t n, double* nll);

typedef struct {
  double temperature;  /* 0: greedy (argmax) */
  int64_t top_k;       /* 0: all */
  double top_p;        /* 1: all */
  uint64_t seed;       /* the same seed draws the same tokens from the same logits (one backend) wherever exp() rounds alike */
  int64_t vocab_limit; /* draw only ids below it (0: any), for an embedding padded past its tokenizer */
  double min_p;        /* 0: all; else keep the tokens at least min_p times as likely as the most likely
                          (after top_k and top_p) */
  double repetition_penalty; /* 1 (or 0, which callers built before it leave there): off; else
                                transformers' repetition penalty on the ids the sequence holds */
  int64_t reserved[1]; /* 0 */
} twell_sampling;
TWELL_C_API void twell_sampling_init(twell_sampling* sampling); /* greedy */
/* The sampling options a caller sets itself, as bits of twell_model_generation_sampling's `given`. */
enum {
  TWELL_SAMPLE_TEMPERATURE = 1,
  TWELL_SAMPLE_TOP_K = 2,
  TWELL_SAMPLE_TOP_P = 4,
  TWELL_SAMPLE_MIN_P = 8,
  TWELL_SAMPLE_REPETITION_PENALTY = 16
};
/* *sampling completed from the model's generation_config.json (config.json's keys where there is none)
 * as transformers' generate() completes its arguments (model::with_generation_config): each field whose
 * bit is not in `given` takes the file's value: the temperature the file's where its do_sample is true
 * (1 where it says none), else 0; repetition_penalty the file's (1); top_k, top_p and min_p the file's
 * only where the temperature the call ends with samples (top_k 50 where do_sample is true and the file
 * says none). The fields given, seed and vocab_limit are left as they are. *taken (may be NULL) receives
 * the bits of the fields the completion set (to the file's values or, where it says none, transformers'
 * defaults; none where the file gives no key); *unapplied (may be NULL) the keys the file sets that twell
 * does not apply, with their values ("num_beams 4, typical_p 0.9"; "" where none), valid while the
 * model lives. An error, naming the file, where a value taken has the wrong type or is out of range
 * (*unapplied is set even then; *sampling is not changed). (The generate calls take their sampling as
 * given: NULL is greedy.) */
TWELL_C_API int twell_model_generation_sampling(const twell_model* model, twell_sampling* sampling, uint32_t given,
                                                uint32_t* taken, const char** unapplied);

typedef enum twell_stop_reason {
  TWELL_STOP_TOKEN = 0,        /* the last token is one of the stop tokens */
  TWELL_STOP_MAX_TOKENS = 1,   /* max_new_tokens were drawn */
  TWELL_STOP_CONTEXT_FULL = 2, /* the KV cache holds the model's whole context */
  TWELL_STOP_CALLBACK = 3      /* on_token returned non-zero */
} twell_stop_reason;
/* Sees each token as soon as it is drawn (the stop token included); non-zero stops after it (a stop
 * token still reports TWELL_STOP_TOKEN). It may not call the generating model (refused: the call
 * would change the cache under the generation; twell_model_destroy leaves it alone and says so on
 * stderr) but for get_info, cached_tokens, eos_ids and generation_sampling; other models and the tokenizer
 * are fine. */
typedef int (*twell_token_fn)(int32_t token, void* user);
typedef struct {
  int64_t n_tokens; /* written to tokens */
  int32_t reason;   /* twell_stop_reason */
  int32_t reused;   /* the prompt's positions taken from the KV cache (twell_model_set_prefix_reuse), else 0 */
  /* prefill_seconds: up to the first new token (the prompt's forward and the first draw);
   * decode_seconds: the tokens after it, from after the first token's callback (counted in neither)
   * on (n_tokens - 1 decode steps, their draws and callbacks included; 0 for one token). */
  double prefill_seconds, decode_seconds;
} twell_generation;
/* Prefills prompt[0..n_prompt), then draws up to max_new_tokens tokens into tokens (room for
 * max_new_tokens), stopping after any of stop[0..n_stop) (ids >= 0). Uses the model's KV cache, starting
 * it afresh (with twell_model_set_prefix_reuse on, keeping what it holds of the prompt's start),
 * which afterwards holds the prompt and every new token but the last (n_prompt + n_tokens - 1
 * positions; n_prompt where none was drawn): twell_model_decode_step(tokens[n_tokens - 1])
 * continues the text, unless it stopped with TWELL_STOP_CONTEXT_FULL. sampling NULL: greedy. A call
 * that fails writes nothing to *result nor to tokens. */
TWELL_C_API int twell_model_generate(twell_model* model, const int32_t* prompt, int64_t n_prompt,
                                     int64_t max_new_tokens, const twell_sampling* sampling, const int32_t* stop,
                                     int64_t n_stop, twell_token_fn on_token, void* user, int32_t* tokens,
                                     twell_generation* result);

/* Prefix reuse for twell_model_generate (model::PromptCache), off by default: on (non-zero), a generation
 * prefills only the part of its prompt after the longest prefix it shares with what the KV cache holds
 * from the model's last twell_model_generate (its prompt and every new token but the last), where nothing
 * else has run on the model since (else it prefills the whole prompt); at least the prompt's last token
 * runs. A conversation's next turn then costs its new tokens, not the whole history. The logits are a
 * whole prefill's up to the summation order of a forward in two parts (the CPU's: the same bits), so on
 * the GPU a repeated call may draw another token where two are nearly tied. Off: every generation
 * prefills its whole prompt. twell_generation.reused says how many positions a call took. */
TWELL_C_API int twell_model_set_prefix_reuse(twell_model* model, int32_t on);

/* Sees each token of sequence `sequence` as soon as it is drawn; non-zero stops that sequence after it
 * (TWELL_STOP_CALLBACK, unless the token is a stop token). The same calls are refused as from a
 * twell_token_fn. */
typedef int (*twell_batch_token_fn)(int64_t sequence, int32_t token, void* user);
/* generate for n_prompts prompts at once, of any lengths: prompt b is prompts[offsets[b] .. offsets[b + 1])
 * (offsets has n_prompts + 1 entries, offsets[0] = 0), n_prompts at most the model's max_batch. Sequence b
 * draws from seed sampling->seed + b (so that, with logits of the same bits, its tokens are
 * twell_model_generate's with that seed), stops on its own, and writes its tokens to
 * tokens[b * max_new_tokens ...] (room for n_prompts * max_new_tokens) and its count, reason and times to
 * results[b]: prefill_seconds the batch's, decode_seconds up to its own last token. The cache then
 * holds the batch (twell_model_cached_tokens: its longest sequence), which twell_model_decode_step
 * does not continue where it holds 2 sequences or more; the whole-sequence calls and
 * twell_model_prefill start afresh. A call that fails writes nothing to results. */
TWELL_C_API int twell_model_generate_batch(twell_model* model, const int32_t* prompts, const int64_t* offsets,
                                           int64_t n_prompts, int64_t max_new_tokens, const twell_sampling* sampling,
                                           const int32_t* stop, int64_t n_stop, twell_batch_token_fn on_token,
                                           void* user, int32_t* tokens, twell_generation* results);

/* ---- tokenizers (twell/model/tokenizer.h) ---- */
typedef struct twell_tokenizer twell_tokenizer;
typedef struct {
  int32_t vocab_size;                  /* one past the largest id */
  int32_t bos_id, eos_id;              /* -1: none */
  int32_t bos_to_add, eos_to_add;      /* what HF puts before and after a text; -1: none */
} twell_tokenizer_info;
/* dir's tokenizer.json (and tokenizer_config.json), or with bytes != 0 the byte tokenizer of our own
 * small models (ids 0..255 bytes, BOS 256, EOS 257; dir is then not read and may be NULL). vocab_size > 0: refused unless every id fits
 * an embedding of that many rows. */
TWELL_C_API int twell_tokenizer_load(const char* dir, int64_t vocab_size, int32_t bytes, twell_tokenizer** out);
TWELL_C_API void twell_tokenizer_destroy(twell_tokenizer* tokenizer); /* NULL: nothing */
TWELL_C_API int twell_tokenizer_get_info(const twell_tokenizer* tokenizer, twell_tokenizer_info* info);
/* The ids of text[0..len) (no BOS or EOS added): *n receives their count; at most capacity are
 * written, so a caller whose *n came back larger calls again with room for *n. */
TWELL_C_API int twell_tokenizer_encode(const twell_tokenizer* tokenizer, const char* text, size_t len, int32_t* ids,
                                       int64_t capacity, int64_t* n);
/* The ids HF's decode(skip_special_tokens=True) leaves out, ascending: the added tokens marked special,
 * BOS and EOS. *n receives their count; at most capacity are written, as for encode. */
TWELL_C_API int twell_tokenizer_special_ids(const twell_tokenizer* tokenizer, int32_t* ids, int64_t capacity,
                                            int64_t* n);
/* The bytes ids[0..n) stand for (not NUL-terminated): *len receives their count, at most capacity
 * are written, as for encode. */
TWELL_C_API int twell_tokenizer_decode(const twell_tokenizer* tokenizer, const int32_t* ids, int64_t n, char* text,
                                       size_t capacity, size_t* len);

/* The text a generation adds as its ids come, for streaming (model::TextStream, as `twell run` streams):
 * put gives what decode(context + the ids so far) has past what the pieces before gave, up to its
 * last whole UTF-8 character (a character split across ids comes with the id that ends it); a stop
 * id adds nothing; finish gives a character that never ended. The pieces are valid UTF-8 (bytes that
 * form no character come as U+FFFD, as Python's errors="replace" gives them). *text points into the
 * stream (*len bytes, not NUL-terminated), valid until its next call. The tokenizer must outlive it. */
typedef struct twell_text_stream twell_text_stream;
TWELL_C_API int twell_text_stream_create(const twell_tokenizer* tokenizer, const int32_t* context, int64_t n_context,
                                         const int32_t* stop, int64_t n_stop, twell_text_stream** out);
TWELL_C_API void twell_text_stream_destroy(twell_text_stream* stream); /* NULL: nothing */
TWELL_C_API int twell_text_stream_put(twell_text_stream* stream, int32_t id, const char** text, size_t* len);
TWELL_C_API int twell_text_stream_finish(twell_text_stream* stream, const char** text, size_t* len);
/* Stop strings (model::TextStream::stop_at; `twell run --stop`), given before the stream's first put:
 * the text ends just before the first place one of them appears in the new text (the context's is
 * not searched), the stop string left out. The put whose id completes one makes
 * twell_text_stream_stopped say so, and every put after it gives nothing: its caller stops the
 * generation there (a token callback's non-zero return). Until then a piece holds back its end where
 * a stop string could begin, and finish gives what is held. strings[i] has lengths[i] bytes (not
 * NUL-terminated), each at least one and valid UTF-8. */
TWELL_C_API int twell_text_stream_stop_at(twell_text_stream* stream, const char* const* strings,
                                          const size_t* lengths, int64_t n);
/* The tokenizer's special ids (twell_tokenizer_special_ids) add no text, in the context as in the new
 * ids, as HF's decode(skip_special_tokens=True) (model::TextStream::skip_special_tokens); before the
 * stream's first put. */
TWELL_C_API int twell_text_stream_skip_special_tokens(twell_text_stream* stream);
/* *stopped: 1 once a stop string was met, and *which its index in stop_at's strings; else 0 and -1.
 * which may be NULL. */
TWELL_C_API int twell_text_stream_stopped(const twell_text_stream* stream, int* stopped, int64_t* which);

/* ---- chat templates (twell/model/chat_template.h) ---- */
/* The Jinja template that turns a conversation into a chat model's prompt, rendered as transformers'
 * apply_chat_template(messages, tokenize=False) renders it (a subset of Jinja: what twell does not
 * evaluate is an error naming it, never another text). */
typedef struct twell_chat_template twell_chat_template;
/* dir's template (model::load_chat_template: chat_template.jinja, else tokenizer_config.json's
 * chat_template, and additional_chat_templates/NAME.jinja), with the directory's special tokens
 * (bos_token, eos_token, ...) as its variables: the one named "default", or with tools != 0 the one
 * named "tool_use" where there is one, or the one of name (NULL: by those rules); *out is NULL where the
 * model has none (or none of that name). template_file (NULL: none): a Jinja file to use instead of the
 * model's, with dir's special tokens (dir NULL: none). */
TWELL_C_API int twell_chat_template_load(const char* dir, const char* template_file, const char* name, int tools,
                                         twell_chat_template** out);
/* A template from its text. special_tokens_json: a JSON object of names and strings, as
 * {"bos_token": "<s>"} (NULL: none); twell_chat_special_tokens gives a model directory's. */
TWELL_C_API int twell_chat_template_create(const char* text, const char* special_tokens_json,
                                           twell_chat_template** out);
TWELL_C_API void twell_chat_template_destroy(twell_chat_template* chat_template); /* NULL: nothing */
/* Where the template comes from (a file, or "<file> (chat_template)") and its text: *source and *text point
 * into the object (NUL-terminated, *_len bytes), valid while it lives; either pair may be NULL. */
TWELL_C_API int twell_chat_template_describe(const twell_chat_template* chat_template, const char** source,
                                             size_t* source_len, const char** text, size_t* text_len);
/* dir's special tokens as twell_chat_template_load gives them to its template (model::chat_special_tokens,
 * transformers' special_tokens_map): a JSON object, *len bytes of it written at most capacity (not
 * NUL-terminated), as twell_tokenizer_decode. */
TWELL_C_API int twell_chat_template_special_tokens(const char* dir, char* json, size_t capacity, size_t* len);

/* (A template object serves one apply at a time: its text is the object's.)
 * The prompt text of messages_json (a JSON array of {"role": ..., "content": ...}), with the
 * assistant's header after it where add_generation_prompt != 0; variables_json (NULL: none) a JSON
 * object of further variables (tools, documents, a template's own flags). *text points into the
 * template object (*len bytes, NUL-terminated too), valid until its next apply. Encode it without
 * BOS: the template writes the special tokens it wants. */
TWELL_C_API int twell_chat_template_apply(twell_chat_template* chat_template, const char* messages_json,
                                          int add_generation_prompt, const char* variables_json, const char** text,
                                          size_t* len);

#ifdef __cplusplus
}
#endif

#endif /* TWELL_C_API_H */
