// The Llama-style model on the GPU: the same model as twell::model::LlamaCpu (see model/llama.h for
// the mathematics), run with bf16 weights and activations, fp32 accumulation and an fp32 residual
// stream.
//
//   auto w = std::make_shared<twell::cuda::LlamaCudaWeights>(
//       twell::cuda::LlamaCudaWeights::upload(twell::model::LlamaWeights::load_dir(dir)));
//   twell::cuda::LlamaCuda model(w);                     // FfnMode::twell, batch 1
//   twell::Tensor next = model.prefill(prompt);          // logits of the last token [V], f32
//   next = model.decode_step(token);
//
// Per layer: fused residual-add + RMSNorm, one QKV GEMM (cuBLASLt) then RoPE fused with the
// KV-cache write (calls of 512+ tokens: all three in one CUTLASS GEMM), flash attention on the
// tensor cores (prefill: cuDNN's fused SDPA for calls of kCudnnAttentionMinTokens tokens or more
// where libcudnn 9 loads and its plan repays itself (PrefillAttention), else twell's own kernel;
// decode: twell's kernel split over the cached keys, except steps of 512+ tokens, which take the
// fused GEMM and the prefill kernel), the O GEMM,
// then the FFN: a ReLU model whose H and I are multiples of 64 runs twell::cuda::FfnForward
// (FfnMode::twell: sparse TwELL or dense, chosen from the activation density it observes, in
// prefill; decode steps of at most decode_gather_tokens sequences on its sparse paths where its
// kernels take the shape, others dense; FfnMode::dense: always dense cuBLASLt); a SiLU model,
// or a ReLU model of other widths, the dense cuBLASLt FFN. Decode steps are captured once per
// batch size in a CUDA graph and replayed. Everything runs on the model's own stream, created with
// the object, or on the caller's (LlamaCudaOptions::stream); its calls return once their results
// are on the host. One LlamaCuda serves one host thread at a time (logits() const included: it
// uses the stream and the workspace); give each thread its own, sharing one LlamaCudaWeights.
//
// Memory: the KV cache and the workspace are sized at construction from max_batch, max_context
// and max_tokens, whose defaults take the config's whole context: set max_context to what a job
// needs (a Llama 3.1 8B config says 131072 positions, ~17 GB of cache at batch 1).
// memory_needed() says what a configuration needs before anything is loaded, workspace_bytes()
// what was allocated.
//
// Batches: B sequences of any lengths run together (prefill_batch, decode_batch, generate_batch);
// a prefill of prompts of different lengths runs as batches of neighbouring prompts, each padded
// to its own longest (the padding kept out of every real row; ragged_prefill_runs), a prompt
// longer than max_tokens in chunks, and decode steps take each sequence at its own position.
// Tokens are checked on the host before anything is enqueued.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "twell/cuda/ffn.h"
#include "twell/cuda/runtime.h"
#include "twell/model/llama.h"

namespace twell::cuda {

struct LlamaCudaLayer {
  DeviceTensor input_norm;  // [H]
  DeviceTensor wqkv;        // [(nh + 2 nkv)·hd, H]: q_proj, k_proj, v_proj stacked
  DeviceTensor wo;          // [H, nh·hd]
  DeviceTensor post_norm;   // [H]
  DeviceTensor wg, wu, wd;  // [I, H] each (wd neuron-major, as model::LlamaLayerWeights)

  FfnWeights ffn() const { return FfnWeights{wg.view(), wu.view(), wd.view()}; }
};

// Device copies of a model's weights, all bf16.
struct LlamaCudaWeights {
  io::ModelConfig config;
  DeviceTensor embed;       // [V, H]
  std::vector<LlamaCudaLayer> layers;
  DeviceTensor final_norm;  // [H]
  DeviceTensor lm_head;     // [V, H]; empty when tied

  // Converts f32 weights to bf16 (round to nearest even) on the way. Synchronous.
  static LlamaCudaWeights upload(const model::LlamaWeights& w);
  // Uninitialised weights of the right shapes, for synthetic models (twell bench model).
  static LlamaCudaWeights allocate(const io::ModelConfig& c);
  // bf16 host copy, e.g. to run the CPU reference on the same weights. Synchronous.
  model::LlamaWeights download() const;

  const DeviceTensor& head() const { return config.tie_word_embeddings ? embed : lm_head; }
  size_t bytes() const;
  // What bytes() is for a model of this configuration, before anything is allocated.
  static size_t bytes_for(const io::ModelConfig& c);
};

enum class FfnMode { twell, dense };

// The attention of calls with more than one token per sequence (prefill, logits, enqueue).
//   automatic: cuDNN's fused SDPA (CudnnSdpa, libcudnn.so.9 loaded at run time) for calls of at
//              least kCudnnAttentionMinTokens tokens when it loads and takes the shape, from the
//              second call of a shape (B, S, position) on, or at the first where that call's
//              attention alone saves more than the plan's build (60-100 ms on an H200 the first
//              time a shape is seen: the 2B model's 64 × 2048 prefill does, a prompt of a few
//              thousand tokens does not); twell's own flash kernel otherwise. The two kernels
//              sum in different orders, so a shape's first call and its later ones may differ in
//              the last bits of the logits (both within the tests' bounds of float64);
//   cudnn:     cuDNN's SDPA at any size; an error if cuDNN is missing or refuses the shape;
//   twell:     always twell's kernel.
// Decode steps (one token per sequence) run twell's split decode kernel (steps of 512+ sequences
// twell's flash kernel).
enum class PrefillAttention { automatic, cudnn, twell };
constexpr int64_t kCudnnAttentionMinTokens = 2048;

// LlamaCudaOptions::max_tokens's default cap with a KV cache: chunks this long keep the twell FFN
// on its sparse path (FfnOptions::sparse_min_tokens is 8192) and the GEMMs near their full rate
// (the sparse FFN at M = 16384: 0.62× dense, against 0.58× at 131072; docs/perf.md).
constexpr int64_t kDefaultMaxTokens = 16384;

struct LlamaCudaOptions {
  FfnMode ffn = FfnMode::twell;
  PrefillAttention prefill_attention = PrefillAttention::automatic;
  // Calls of 512 tokens or more run the QKV projection as one CUTLASS GEMM with RoPE and the
  // KV-cache write in its epilogue (head_dim 64 or 128, nh·hd and nkv·hd multiples of 256; the
  // rounding steps of the unfused cuBLASLt GEMM + RoPE kernel, which runs otherwise).
  bool fused_qkv_rope = true;
  int64_t max_batch = 1;     // sequences per call at most
  // Token rows (B·S) one forward computes at most (the activations' size; more than max_batch ·
  // max_context is taken as that, which no call exceeds). 0: with the KV cache, max_batch ·
  // max_context up to kDefaultMaxTokens (or max_batch, where that is more); without it,
  // max_batch · max_context. A prefill of several prompts above it runs as several batches
  // (ragged_prefill_runs), and a prompt longer than it, and logits() of more tokens, in chunks at
  // increasing positions over the cached keys (prefill_chunks; with the KV cache only): the
  // activations stay sized for max_tokens rows however long the context (a Llama 3.1 8B's at 131072
  // rows would take about as much memory as its whole KV cache). enqueue() takes at most max_tokens.
  int64_t max_tokens = 0;
  int64_t max_context = 0;   // positions per sequence; 0: config.max_position_embeddings
  // false: no cache across calls (prefill-only use, e.g. benchmarks): one layer's keys and values
  // are kept at a time, every call starts at position 0, and decode is unavailable.
  bool kv_cache = true;
  // Decode steps replay a captured graph per batch size, and so do forwards of one sequence of at
  // most decode_gather_tokens tokens (a conversation's next turn after its history, a short prompt)
  // per length where nothing in them reads back to the host (on a sparse model: every layer on the
  // gather FFN, or one token, on the prefill FFN's one-token kernel); each from its shape's third
  // call (the first two run eagerly: plans, autotune).
  bool cuda_graphs = true;
  // A prefill of prompts of different lengths runs as batches of neighbouring prompts, each padded
  // to its own longest (model::prefill_runs: the fewest rows, counting 256 more a batch for its
  // launches, and 1.3 times the rows of a batch below ffn_options.sparse_min_tokens where the
  // prefill FFN is sparse, as such a batch's FFN runs dense; none above max_tokens), not as one
  // batch of the longest: prompts of 2000 tokens and 63 of 100 compute 8300 rows, not 128000.
  // model::generate_batch orders its prompts by length for it. ffn_paths, ffn_stats and
  // prefill_kernels then report the last batch (or chunk); ffn_input_hook sees each one.
  // false: one batch of the longest (A/B), refused above max_tokens rows but for one prompt.
  bool ragged_prefill_runs = true;
  // The stream calls run on. nullptr: the model's own (non-blocking) stream, destroyed with it. A
  // caller's stream (any kind: blocking, non-blocking, cudaStreamLegacy, cudaStreamPerThread)
  // orders the model's work after the caller's earlier work there and before its later work; it
  // must outlive the model, must not be under graph capture during a call, and each call but
  // enqueue() synchronises it (so waits for whatever else is queued there). Decode graphs are
  // captured on the model's own stream either way and launched on this one.
  cudaStream_t stream = nullptr;
  // FfnMode::twell: dispatch of the ReLU FFN (FfnForward's defaults) for prefill. Precision must
  // stay bf16 (h_fp32 exists on the sparse paths only), and cublaslt_workspace null (the model's
  // FFNs share its own).
  FfnOptions ffn_options;
  // FfnMode::twell: decode steps of at most this many sequences take the FFN's gather path (the
  // gate weights densely, then only the rows of Wu and Wd of each token's active neurons); other
  // steps the dense FFN. 32 by default: on an H200, at the paper's 2B shape with ~30 non-zeros per
  // token, the gather path's decode step is faster than the dense one at batches 1 to 32 (0.65×
  // at 1, 0.85× at 8, 0.90× at 16, 0.94× at 32; 0.995× at 64: bench/results/h200/s39/, docs/perf.md).
  // Where the gather path does not take the shape (I > 12288), such steps run the TwELL kernels;
  // where neither does (H > 4096), the dense FFN. A step of B ≥ 2 sequences takes it only in
  // layers where B times the layer's density as the prefill FFN measured it
  // (FfnForward::observed_density: each prefill, or run of a ragged prefill, of at least
  // ffn_options.sparse_min_tokens tokens, and the first smaller one) is at most 0.25, where it reads well under half the dense FFN's
  // weight bytes; so a model that is not sparse decodes its batches densely. One sequence takes it
  // at any density.
  int64_t decode_gather_tokens = 32;
  // FfnMode::twell: prefills of 2 to decode_gather_tokens tokens (a conversation's next turn after its
  // cached history, prefill_from; a short prompt; a ragged prefill's small runs) take the gather path
  // too, in the layers where the prefill FFN had measured a density by the call's start and the
  // forward's tokens times it is at most 0.25; otherwise such small calls run the dense FFN
  // (ffn_options.sparse_min_tokens), which reads all of Wg, Wu and Wd. (One token takes the FFN's
  // one-token kernel at any density either way.) enqueue() and the whole-sequence calls (logits,
  // next_token_nll) take no gather path. false: the dense FFN (A/B).
  bool prefill_gather = true;
  // Decode steps of one sequence on the gather path run the FFN as one kernel, the gate GEMV
  // included, whose weight copies start while the RMSNorm before it runs, and whose partial sums
  // the next layer's residual add + RMSNorm adds (launch_decode_ffn). false: FfnForward's own
  // one-token path, whose partial sums a separate kernel adds before the plain norm (A/B).
  bool fused_decode_ffn = true;
  // Calls of one token (decode at batch 1) run the QKV and output projections, the LM head (f32
  // logits), and the dense FFN's gate and up products (FfnOptions::one_token_gemv), through twell's GEMV
  // (launch_decode_gemv), whose weight copies start while the kernel before it runs; false:
  // cuBLASLt, as for more tokens (A/B).
  bool decode_gemv = true;
  // Calls of 2 to 32 tokens (decode steps of a few sequences, short prefills) run the QKV and output
  // projections, the LM head of 2 to 8 rows (f32 logits), and every FFN path's gate (the dense
  // path's up too), through twell's few-token GEMM
  // (launch_few_token_gemm), whose weight loads start while the kernel before it runs; this sets the
  // model's FfnOptions::few_token_gemm (ffn_options' own is not read); false: cuBLASLt (A/B: `twell
  // bench model --no-few-token-gemm`; docs/perf.md, sixty-third session, for the measurements).
  bool few_token_gemm = true;
  // Key ranges a head of the decode attention splits the cache into (1 to 16); 0: the kernel's
  // choice (decode_attention_splits, about four blocks an SM: 16 at batch 1 on an H200), halved
  // where the step runs twell's one-kernel decode FFN. At the paper's 2B shape, batch 1, the twell
  // step measured 2.4% faster with 8 ranges than with 16 and the dense step 2.3% slower, so each
  // takes its own (docs/perf.md, model item 23).
  int decode_attention_splits = 0;
  // Warps a block of the decode attention (1, 2 or 4); 0: the kernel's choice, 2 where that keeps
  // every block resident at once and 4 would not (32 sequences of 32 heads on an H100), else 4
  // (docs/perf.md, sixty-fourth session). For A/B.
  int decode_attention_warps = 0;
  // The residual add and RMSNorm after each FFN run by the FFN (FfnForward's ResidualNorm): on the
  // twell FFN's sparse path its down pass does them, so the separate kernel's passes over y and
  // the f32 residual are saved; on the other paths the same kernel runs inside FfnForward. The
  // normalised rows differ from the separate kernel's only by the order of the sum of squares.
  // false: the separate kernel after every FFN (A/B).
  bool ffn_residual_norm = true;
  // Every call but decode steps adds the attention's output into the f32 residual in the
  // norm after the FFN (first, then the FFN's output: the same order, so the same bits), not in the
  // norm before it, which then only reads the residual: the residual is written once a layer, not
  // twice (model item 31). false: added where it is computed (A/B).
  bool deferred_residual_add = true;
  // Called before each layer's FFN in every call but decode steps (each batch of a ragged prefill:
  // ragged_prefill_runs), with the FFN's input
  // (post-attention RMSNorm output, bf16 [tokens, H], device) after the stream has been
  // synchronised. It may read it and change that layer's weights (e.g. to calibrate gate
  // thresholds of a synthetic model). Slow: for calibration and inspection only.
  std::function<void(int64_t layer, const TensorView& ffn_input)> ffn_input_hook;
  // Keep each layer's FfnStats of every call but decode steps (ffn_stats()): the path it took and,
  // on the sparse path, its non-zero count. Waits for each layer's count (one stream
  // synchronisation a layer): for inspection (how sparse a checkpoint really is, layer by layer),
  // not for timed runs.
  bool record_ffn_stats = false;
  // prefill_batch_sample / decode_batch_sample draw the tokens on the GPU (DeviceSampler: only the
  // tokens come back) where its kernel runs (a cluster of 8 SMs, which a MIG instance or an MPS limit may
  // not offer); false, or where it does not run: the logits row is copied back and drawn on the host
  // (model::Sampler), which gives the same tokens.
  bool sample_on_gpu = true;
};

// The device memory a LlamaCuda allocates at construction besides its weights (bytes). Later
// calls may add cuDNN's attention workspace (at the first prefill of a shape, as its plan asks),
// grow the logits buffer (a call whose head takes more than max_batch rows: logits() and
// next_token_nll up to 1024, enqueue() all its rows), add next_token_nll's 12 bytes a token, and
// with FFN statistics (logits(), next_token_nll) 4 · I + 12 bytes a row of the call's largest
// forward: workspace_bytes() counts what is allocated at any time.
struct LlamaCudaMemory {
  size_t kv_cache = 0;     // keys and values: 2 · layers (1 without kv_cache) · max_batch · max_context · nkv · hd · 2
  size_t activations = 0;  // the per-call buffers of max_tokens rows: the residual stream, norms, QKV, attention
  size_t ffn = 0;          // the FFNs' workspaces (prefill, dense and gather FFN, the one-token decode FFN)
  size_t other = 0;        // cuBLASLt's workspace (one, shared by the FFNs), the RoPE table, logits of
                           // max_batch rows and the GPU sampler's weights for them, the QKV GEMM's
                           // workspace (fused_qkv_rope)
  // Not in total(): what logits() and next_token_nll add to the logits buffer (up to 1024 rows) at
  // the peak of its growth, the larger buffer beside the old.
  size_t logits_growth = 0;
  int64_t max_tokens = 0;  // the tokens a forward the activations are sized for (max_tokens, resolved)
  size_t total() const { return kv_cache + activations + ffn + other; }
};

// Which rows of the last call's output go through the final norm and the LM head.
enum class Head { none, last, all };

class LlamaCuda final : public model::LanguageModel {
 public:
  // Whether this runtime takes a model of this configuration (head_dim 16/32/64/128, relu or silu,
  // widths multiples of 8, hidden_size at most 16384); if not, `why` says what it lacks.
  // Needs no GPU.
  static bool supports(const io::ModelConfig& c, std::string* why = nullptr);
  // The memory the constructor would allocate for this configuration and these options (checked
  // as the constructor checks them), by part, from the current device's properties: to size a job
  // before loading anything. Where it exceeds the GPU's free memory, the constructor throws before
  // allocating the buffers, and keeps nothing.
  static LlamaCudaMemory memory_needed(const io::ModelConfig& c, const LlamaCudaOptions& options = {});

  LlamaCuda(std::shared_ptr<const LlamaCudaWeights> weights, LlamaCudaOptions options = {});
  ~LlamaCuda() override;
  LlamaCuda(LlamaCuda&&) noexcept;
  LlamaCuda& operator=(LlamaCuda&&) noexcept;

  // model::LanguageModel (one sequence). `logits` runs from position 0 in the KV cache's memory, so
  // it refuses (throws, changing nothing) while a generation is cached: after prefill or
  // decode_step, until reset(). It leaves the cache empty. With `ffn_stats` (ReLU models; left at
  // zero for SiLU ones, as LlamaCpu leaves them), each layer's statistics of h: from dense GEMMs of
  // each layer's FFN input beside its FFN (whichever path that takes), rounded as the dense FFN
  // rounds (bf16 g, u, h), counted on the GPU; [max_tokens, I] bf16 twice more of device memory from
  // the first such call on, and a stream synchronisation a layer. More tokens than max_tokens run in
  // chunks (LlamaCudaOptions::max_tokens); the head of a call of more than 1024 tokens runs 1024
  // rows at a time, each copied to the result as it is done, so the device holds 1024 rows of
  // logits, not one for every token.
  const io::ModelConfig& config() const override;
  Tensor logits(const std::vector<int32_t>& tokens, std::vector<ActivationStats>* ffn_stats = nullptr) const override;
  // The same forward as logits(), each piece of its logits reduced to the next tokens' negative
  // log-likelihoods on the GPU (in double, as model::nll_from_logits): T − 1 numbers come back, not
  // T × V logits (`twell eval`, model::perplexity); `ffn_stats` as for logits().
  std::vector<double> next_token_nll(const std::vector<int32_t>& tokens,
                                     std::vector<ActivationStats>* ffn_stats = nullptr) const override;
  // Neighbouring sequences of one length in one forward, up to max_batch of them and max_tokens
  // rows (so that `twell eval`'s short windows take the sparse FFN); a longer one alone, in chunks.
  std::vector<std::vector<double>> next_token_nll_batch(const std::vector<std::vector<int32_t>>& sequences,
                                                        std::vector<ActivationStats>* ffn_stats = nullptr) const override;
  Tensor prefill(const std::vector<int32_t>& tokens) override;  // [V]
  Tensor decode_step(int32_t token) override;                   // [V]
  bool samples_on_gpu() const;  // LlamaCudaOptions::sample_on_gpu, where the kernel runs
  int64_t cached_tokens() const override;
  int64_t context() const override;  // LlamaCudaOptions::max_context
  void reset() override;

  // Batches of up to max_batch sequences of any lengths (model::LanguageModel::prefill_batch):
  // prompts -> logits of each last token [B, V]; decode_batch appends tokens[b] to sequence b of
  // the last prefill (kNoToken: it sits the step out, its row zeros) -> [B, V]. The *_sample
  // forms draw each sequence's next token on the GPU (DeviceSampler), one sampler a sequence: only
  // the tokens come back (LlamaCudaOptions::sample_on_gpu).
  Tensor prefill_batch(const std::vector<std::vector<int32_t>>& prompts) override;
  Tensor decode_batch(const std::vector<int32_t>& tokens) override;
  std::vector<int32_t> prefill_batch_sample(const std::vector<std::vector<int32_t>>& prompts,
                                            std::vector<model::Sampler>& samplers) override;
  std::vector<int32_t> decode_batch_sample(const std::vector<int32_t>& tokens,
                                           std::vector<model::Sampler>& samplers) override;
  // Prefix reuse (model::LanguageModel::prefill_from): the tokens after the kept positions run as a
  // prefill at those positions, in chunks of max_tokens, attending to the cached keys.
  Tensor prefill_from(int64_t keep, const std::vector<int32_t>& tokens) override;
  std::vector<int32_t> prefill_from_sample(int64_t keep, const std::vector<int32_t>& tokens,
                                           std::vector<model::Sampler>& samplers) override;
  bool keeps_prefix() const override { return true; }  // with the KV cache (kv_cache): else nothing is cached
  int64_t max_batch() const override;  // LlamaCudaOptions::max_batch
  int64_t sequences_a_forward() const override { return max_batch(); }
  std::vector<int64_t> cached_lengths() const override;

  // Low level, for benchmarks: enqueues B·S tokens already on the device (int32, sequence-major,
  // in range: not checked) at position cached_tokens() (refused when the cached sequences' lengths
  // differ), with no host synchronisation (but the first call of a shape that takes cuDNN's
  // attention, which builds its plan, and a shape's second call, where its cuBLASLt GEMMs of
  // ~2 GFLOP or more are tuned: LtGemm). Logits of
  // the chosen rows go to logits_device() [rows, V].
  void enqueue(const int32_t* tokens, int64_t B, int64_t S, Head head);
  const float* logits_device() const;
  // The residual stream after the last layer of the last call (of a prefill's last batch or chunk),
  // fp32 [B·S, H] (device).
  TensorView hidden_device() const;
  cudaStream_t stream() const;  // LlamaCudaOptions::stream, or the model's own
  // Token rows the last prefill, logits, next_token_nll, decode or enqueue call computed: B · S, or
  // for prompts of different lengths the rows of its batches, padding included (ragged_prefill_runs).
  int64_t last_tokens() const;
  // The FFN path each layer took in the last call (of a prefill's last batch or chunk).
  std::vector<FfnPath> ffn_paths() const;
  // With LlamaCudaOptions::record_ffn_stats: each layer's FFN statistics of the last call that was
  // not a decode step (of a prefill's last batch or chunk; FfnStats::nnz_per_token() is non-zeros
  // per token on the sparse path, -1 where not counted: the dense and the gather path); empty
  // without the option.
  std::vector<FfnStats> ffn_stats() const;
  // Device memory the model holds besides its weights: memory_needed()'s total after construction,
  // and what later calls added (cuDNN's workspace, a larger logits buffer, the FFN statistics' buffers).
  size_t workspace_bytes() const;
  // The kernels the last call that was not a decode step ran (a prefill's last batch or chunk;
  // empty/false before any such call).
  struct PrefillKernels {
    std::string attention;  // "cudnn <version>", or "twell" and why cuDNN's was not used
    bool fused_qkv_rope = false;  // the QKV GEMM with RoPE in its epilogue (fused_qkv_rope)
    bool graph = false;           // launched as a captured CUDA graph (a short prefill: cuda_graphs)
  };
  PrefillKernels prefill_kernels() const;
  // GPU time of the last prefill, decode, enqueue, logits or next_token_nll call's device work (the
  // model's layers and head; not the token and logit copies, but for a prefill's batches or chunks
  // the copies of those after the first, and for logits and next_token_nll the copies and losses of
  // their pieces, and with FFN statistics their GEMMs and a host wait a layer). Waits for it.
  float last_gpu_ms() const;

  const LlamaCudaOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell::cuda
