// LlamaCuda: the model runtime on the GPU (include/twell/cuda/llama.h). Weight upload/download,
// the workspace, the layer loop (kernels in src/cuda/kernels/llama_layers.cu and attention.cu,
// GEMMs through cuBLASLt, the ReLU FFN through FfnForward), and CUDA-graph decode.
#include "twell/cuda/llama.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>

#include "cuda/cublaslt_gemm.h"
#include "cuda/cudnn_sdpa.h"
#include "cuda/kernels.h"
#include "twell/bf16.h"
#include "twell/cuda/sampler.h"

namespace twell::cuda {

namespace {

uint16_t* bits(const DeviceTensor& t) { return static_cast<uint16_t*>(t.view().data); }
uint16_t* bits(const Tensor& t) { return static_cast<uint16_t*>(t.view().data); }

Tensor to_bf16(const TensorView& t) {
  if (t.dtype == DType::bf16) return Tensor::copy_of(t);
  Tensor out(DType::bf16, t.shape);
  auto* o = bits(out);
  for (int64_t i = 0; i < t.numel(); ++i) o[i] = float_to_bf16_bits(static_cast<float>(load_as_double(t, i)));
  return out;
}

DeviceTensor upload_bf16(const TensorView& t) { return DeviceTensor::upload(to_bf16(t).view()); }

// Copies rows of host tensors, converted to bf16, one after another into `dst`, whose shape they
// must fill exactly: [rows of all parts together, columns of each]. `what` names it in errors.
void upload_rows(DeviceTensor& dst, std::initializer_list<const TensorView*> parts, const char* what) {
  const Shape& want = dst.view().shape;
  int64_t rows = 0;
  for (const TensorView* p : parts) {
    const bool fits = !p->empty() && static_cast<size_t>(p->rank()) == want.size() &&
                      (want.size() == 1 || p->shape[1] == want[1]);
    TWELL_CHECK(fits,
                "LlamaCudaWeights: ", what, ": a part of shape ", shape_str(p->shape), " does not fit ",
                shape_str(want), p->empty() ? " (missing)" : "");
    rows += p->shape[0];
  }
  TWELL_CHECK(rows == want[0], "LlamaCudaWeights: ", what, ": its parts hold ", rows, " rows, the config's shape is ",
              shape_str(want));
  size_t offset = 0;
  for (const TensorView* p : parts) {
    const Tensor b = to_bf16(*p);
    TWELL_CUDA_CHECK(cudaMemcpy(static_cast<char*>(dst.view().data) + offset, b.view().data, b.nbytes(),
                                cudaMemcpyHostToDevice));
    offset += b.nbytes();
  }
}

Tensor download_rows(const DeviceTensor& src, int64_t row0, int64_t rows) {
  const int64_t cols = src.view().shape[1];
  Tensor h(DType::bf16, {rows, cols});
  TWELL_CUDA_CHECK(cudaMemcpy(h.view().data, bits(src) + row0 * cols, h.nbytes(), cudaMemcpyDeviceToHost));
  return h;
}

TensorView dev_view(void* p, DType t, Shape s) { return TensorView(p, t, std::move(s), Device::cuda); }

}  // namespace

// ---- weights ------------------------------------------------------------------------------------

namespace {
// The device weights' shapes (all bf16), for allocate() and bytes_for() alike.
struct WeightShapes {
  Shape table, norm, wqkv, wo, ffn;  // table: the embedding, and the untied LM head
  explicit WeightShapes(const io::ModelConfig& c) {
    const int64_t H = c.hidden_size, hd = c.head_dim;
    const int64_t q_dim = c.num_attention_heads * hd, kv_dim = c.num_key_value_heads * hd;
    table = {c.vocab_size, H}, norm = {H}, wqkv = {q_dim + 2 * kv_dim, H}, wo = {H, q_dim};
    ffn = {c.intermediate_size, H};  // wg, wu, wd (wd neuron-major)
  }
};
}  // namespace

LlamaCudaWeights LlamaCudaWeights::allocate(const io::ModelConfig& c) {
  const WeightShapes s(c);
  LlamaCudaWeights w;
  w.config = c;
  w.embed = DeviceTensor(DType::bf16, s.table);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LlamaCudaLayer d;
    d.input_norm = DeviceTensor(DType::bf16, s.norm);
    d.wqkv = DeviceTensor(DType::bf16, s.wqkv);
    d.wo = DeviceTensor(DType::bf16, s.wo);
    d.post_norm = DeviceTensor(DType::bf16, s.norm);
    d.wg = DeviceTensor(DType::bf16, s.ffn);
    d.wu = DeviceTensor(DType::bf16, s.ffn);
    d.wd = DeviceTensor(DType::bf16, s.ffn);
    w.layers.push_back(std::move(d));
  }
  w.final_norm = DeviceTensor(DType::bf16, s.norm);
  if (!c.tie_word_embeddings) w.lm_head = DeviceTensor(DType::bf16, s.table);
  return w;
}

LlamaCudaWeights LlamaCudaWeights::upload(const model::LlamaWeights& src) {
  src.validate();
  LlamaCudaWeights w = allocate(src.config);
  upload_rows(w.embed, {&src.embed.view()}, "embed");
  for (size_t l = 0; l < src.layers.size(); ++l) {
    const model::LlamaLayerWeights& s = src.layers[l];
    LlamaCudaLayer& d = w.layers[l];
    upload_rows(d.input_norm, {&s.input_norm.view()}, "input_norm");
    upload_rows(d.wqkv, {&s.wq.view(), &s.wk.view(), &s.wv.view()}, "wq, wk, wv");
    upload_rows(d.wo, {&s.wo.view()}, "wo");
    upload_rows(d.post_norm, {&s.post_norm.view()}, "post_norm");
    upload_rows(d.wg, {&s.wg.view()}, "wg");
    upload_rows(d.wu, {&s.wu.view()}, "wu");
    upload_rows(d.wd, {&s.wd.view()}, "wd");
  }
  upload_rows(w.final_norm, {&src.final_norm.view()}, "final_norm");
  if (!src.config.tie_word_embeddings) upload_rows(w.lm_head, {&src.lm_head.view()}, "lm_head");
  return w;
}

model::LlamaWeights LlamaCudaWeights::download() const {
  const int64_t hd = config.head_dim, q_dim = config.num_attention_heads * hd,
                kv_dim = config.num_key_value_heads * hd;
  auto all = [](const DeviceTensor& t) { return t.download(); };
  model::LlamaWeights w;
  w.config = config;
  w.embed = all(embed);
  for (const LlamaCudaLayer& d : layers) {
    model::LlamaLayerWeights l;
    l.input_norm = all(d.input_norm);
    l.wq = download_rows(d.wqkv, 0, q_dim);
    l.wk = download_rows(d.wqkv, q_dim, kv_dim);
    l.wv = download_rows(d.wqkv, q_dim + kv_dim, kv_dim);
    l.wo = all(d.wo);
    l.post_norm = all(d.post_norm);
    l.wg = all(d.wg);
    l.wu = all(d.wu);
    l.wd = all(d.wd);
    w.layers.push_back(std::move(l));
  }
  w.final_norm = all(final_norm);
  if (!config.tie_word_embeddings) w.lm_head = all(lm_head);
  return w;
}

size_t LlamaCudaWeights::bytes_for(const io::ModelConfig& c) {
  const WeightShapes s(c);
  const auto b = [](const Shape& shape) { return checked_nbytes(DType::bf16, shape); };
  const size_t layer = 2 * b(s.norm) + b(s.wqkv) + b(s.wo) + 3 * b(s.ffn);
  return b(s.table) * (c.tie_word_embeddings ? 1 : 2) + b(s.norm) + static_cast<size_t>(c.num_hidden_layers) * layer;
}

size_t LlamaCudaWeights::bytes() const {
  size_t n = embed.nbytes() + final_norm.nbytes() + lm_head.nbytes();
  for (const LlamaCudaLayer& d : layers)
    n += d.input_norm.nbytes() + d.wqkv.nbytes() + d.wo.nbytes() + d.post_norm.nbytes() + d.wg.nbytes() +
         d.wu.nbytes() + d.wd.nbytes();
  return n;
}

// ---- runtime ------------------------------------------------------------------------------------

struct LlamaCuda::Impl {
  std::shared_ptr<const LlamaCudaWeights> w;
  LlamaCudaOptions o;
  const io::ModelConfig& c;
  int64_t H, I, V, L, nh, nkv, hd, q_dim, kv_dim, qkv_dim;
  bool relu;
  // The model's own non-blocking stream, destroyed after every buffer (declared before them). Calls
  // run on it unless LlamaCudaOptions::stream names the caller's (`stream`), and decode graphs are
  // always captured on it: a capture on a blocking stream (or cudaStreamPerThread) is invalidated
  // by any other thread's use of the legacy stream, and a captured graph launches on any stream.
  struct OwnStream {
    cudaStream_t s = nullptr;
    ~OwnStream() {
      if (s) cudaStreamDestroy(s);
    }
  } own;
  cudaStream_t stream = nullptr;  // where calls run: LlamaCudaOptions::stream, or own.s
  LtGemm gemm;
  CudnnSdpa sdpa;               // prefill attention (PrefillAttention)
  // The QKV GEMM with RoPE and the KV-cache write in its epilogue (qkv_rope.cu), for calls of at
  // least kFusedQkvMinTokens tokens where the shape allows; otherwise cuBLASLt + launch_rope_kv.
  static constexpr int64_t kFusedQkvMinTokens = 512;
  bool fused_qkv = false;
  int sm_count = 0;
  DeviceBuffer qkv_workspace;
  LlamaCuda::PrefillKernels kernels;  // prefill_kernels()
  // ReLU models: prefill (dispatched); decode steps: the gather path for a few tokens (twell mode)
  // and the dense FFN, both without host round trips (graph-captured).
  std::unique_ptr<FfnForward> ffn_prefill, ffn_gather, ffn_dense;
  // Decode steps of one sequence, twell mode: the fused decode FFN (LlamaCudaOptions::
  // fused_decode_ffn), whose output stays as partial sums for the next residual add + RMSNorm.
  DecodeFfn decode_ffn;  // empty: not used
  DeviceBuffer tokens, p0, x, a, qkv, attn, proj, y, g, u, cos_sin, logits;
  DeviceBuffer nll_io;  // next_token_nll: T − 1 doubles out, then T − 1 int32 targets (grown as calls need)
  // logits / next_token_nll with FFN statistics: each layer's, summed over the call's chunks (null
  // outside such a call), and their buffers (add_activation_stats; allocated at the first one).
  std::vector<ActivationStats>* act_stats = nullptr;
  DeviceBuffer act_stats_io;
  int64_t act_stats_rows = 0;  // the rows act_stats_io is carved for: the call's largest forward
  int64_t logits_rows = 0;
  // Pinned staging of a call's inputs (tokens, then the position) and of small logits: copies
  // from and to pageable memory cost the host more per decode step. `staged` is recorded after the
  // input copies, which read the staging when they run.
  PinnedBuffer pinned_in, pinned_logits;
  DeviceSampler sampler;  // prefill_batch_sample, decode_batch_sample
  bool gpu_sampling = false;  // o.sample_on_gpu where its kernel runs
  cudaEvent_t staged = nullptr;
  std::vector<DeviceBuffer> k_cache, v_cache;  // per layer (one shared buffer without kv_cache)
  std::vector<int64_t> lens;  // cached positions of each sequence; empty: none (always, without kv_cache)
  // The call being enqueued, for body(): whether its sequences start at one position (`call_start`;
  // otherwise it cannot take the fused QKV GEMM, whose epilogue reads one position, nor cuDNN's
  // attention), and whether the head reads each sequence's last row from the indices after the
  // positions in p0 (a prefill of prompts of different lengths) rather than row S − 1.
  bool aligned = true, gather_last = false;
  int64_t call_start = 0;
  int64_t last_tokens = 0;  // token rows the last call computed (a ragged prefill's padding included)
  int64_t hidden_rows = 0;  // rows of x the last body() left (a ragged prefill's last batch)
  // The cache's first sequence in body()'s call: a run of a ragged prefill from sequence run_first
  // writes its keys and values there and its logits from row run_first on (0 otherwise).
  int64_t run_first = 0;
  // What a run of a ragged prefill costs beyond its rows (its launches), in rows: prefill_runs.
  // On an H200 a forward's launches take about as long as 200–350 rows at 4 and at 38 layers of the
  // 2B widths (both scale with the layers).
  static constexpr double kPrefillRunTokens = 256;
  // A row of a run whose FFN runs dense by its size (below sparse_min_tokens) in a model whose
  // prefill FFN is sparse, against a row on the sparse path: the 2B model's prefill took 0.77×
  // the dense one's time on it (docs/perf.md).
  static constexpr double kDenseRunRowCost = 1.3;
  std::vector<FfnPath> paths;
  // Decode steps of several sequences take the gather FFN only where it reads fewer weight bytes
  // than the dense one: in layers where B times the layer's density is at most kGatherDensityBatch
  // (the gather path reads two rows a token per active neuron, the dense path Wu and Wd once for the
  // batch: at B × density = 0.16 the gather step was 0.94× the dense one, at 0.32 0.995×). The
  // density is what the prefill FFN last measured for the layer (FfnForward::observed_density: every
  // prefill of sparse_min_tokens tokens or more, and the first smaller one). One sequence always
  // may: it never reads more than dense.
  static constexpr double kGatherDensityBatch = 0.25;
  std::vector<double> layer_density;  // ffn_prefill's observed_density per layer, -1 unknown
  bool density_stale = true;          // a prefill since layer_density was read
  std::vector<char> gather_layer;     // this call's choice per layer (all 0 where no call could gather)
  bool prefill_gathers = false;       // the prefill in body() follows gather_layer (forward(); others run none)
  std::vector<FfnStats> stats;                 // LlamaCudaOptions::record_ffn_stats
  // A call's stream work captured once and replayed (run_graphed): decode steps and short prefills.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    int eager = 0;               // calls run eagerly before the capture
    std::vector<char> gather;    // the gather_layer its calls ran with
    std::vector<FfnPath> paths;  // the FFN paths it runs
    LlamaCuda::PrefillKernels kernels;  // body()'s record of a prefill's (a decode step leaves it alone)
    bool eager_only = false;     // its capture failed or could not be instantiated: it runs eagerly
  };
  using GraphKey = std::array<int64_t, 4>;  // {kind (kDecodeGraph, kPrefillGraph), then the kind's shape}
  static constexpr int64_t kDecodeGraph = 1, kPrefillGraph = 2;
  std::map<GraphKey, Graph> graphs;
  cudaEvent_t gpu_begin = nullptr, gpu_end = nullptr;  // around the device work of the last call

  // The options with their defaults filled in (max_context, max_tokens), checked against the config.
  static LlamaCudaOptions resolve(const io::ModelConfig& c, LlamaCudaOptions o) {
    std::string why;
    TWELL_REQUIRE(LlamaCuda::supports(c, &why), "LlamaCuda: this runtime does not take ", why);
    if (o.max_context == 0) o.max_context = c.max_position_embeddings;
    TWELL_REQUIRE(o.max_context >= 1 && o.max_context <= c.max_position_embeddings, "LlamaCuda: max_context ",
                o.max_context, " must lie in [1, max_position_embeddings = ", c.max_position_embeddings, "]");
    // The kernels index positions in 32 bits (a key block past the context's end included); the RoPE
    // table alone would take 128 GiB long before this bound.
    TWELL_REQUIRE(o.max_context <= INT32_MAX - 64, "LlamaCuda: max_context ", o.max_context,
                  " is past the runtime's ", INT32_MAX - 64, " positions");
    TWELL_REQUIRE(o.max_batch >= 1 && o.max_batch <= 65535, "LlamaCuda: max_batch must lie in [1, 65535] (the kernels' "
                "grid), got ", o.max_batch);
    TWELL_REQUIRE(o.decode_attention_splits >= 0 && o.decode_attention_splits <= kMaxDecodeAttentionSplits,
                "LlamaCuda: decode_attention_splits must lie in [0, ", kMaxDecodeAttentionSplits, "], got ",
                o.decode_attention_splits);
    TWELL_REQUIRE(valid_decode_attention_warps(o.decode_attention_warps),
                  "LlamaCuda: decode_attention_warps must be 0 (the kernel's choice), 1, 2 or 4, got ",
                  o.decode_attention_warps);
    if (o.max_tokens == 0)  // with the cache, longer prompts run in chunks (prefill_chunks)
      o.max_tokens = o.kv_cache ? std::min(o.max_batch * o.max_context, std::max(kDefaultMaxTokens, o.max_batch))
                                : o.max_batch * o.max_context;
    // No call takes more (check_call): activations for more rows would be memory never used.
    o.max_tokens = std::min(o.max_tokens, o.max_batch * o.max_context);
    TWELL_REQUIRE(o.max_tokens >= o.max_batch, "LlamaCuda: max_tokens ", o.max_tokens, " is below max_batch ",
                o.max_batch);
    TWELL_REQUIRE(!o.ffn_options.cublaslt_workspace && o.ffn_options.cublaslt_workspace_bytes == 0,
                "LlamaCuda: ffn_options.cublaslt_workspace must be left null: the model's FFNs share its own");
    // h_fp32 exists on FfnForward's sparse paths only: FfnMode::dense and the dense decode FFN
    // could not honour it.
    TWELL_REQUIRE(o.ffn_options.precision == Precision::bf16,
                "LlamaCuda: ffn_options.precision must be Precision::bf16 (h_fp32 exists on the sparse FFN paths only)");
    return o;
  }

  // What the constructor allocates and builds, from the configuration and the resolved options
  // alone: the constructor follows it, LlamaCuda::memory_needed reports it.
  struct Plan {
    // Bytes of each buffer (of K and of V per kv buffer: one a layer, or one shared without kv_cache).
    size_t tokens = 0, p0 = 0, x = 0, a = 0, qkv = 0, attn = 0, proj = 0, y = 0, g = 0, u = 0, kv = 0, cos_sin = 0,
           logits = 0, qkv_workspace = 0, sampler = 0;
    int64_t kv_buffers = 0;
    // The ReLU FFN through FfnForward (prefill dispatched, decode dense, and the gather path for few
    // tokens); otherwise the dense cuBLASLt FFN over g and u.
    bool ffn_forward = false;
    FfnShape prefill_shape, dense_shape, gather_shape;  // gather_shape.max_tokens 0: no gather FFN
    FfnOptions prefill, dense, gather;
    bool decode_ffn = false;  // the one-token decode FFN (fused_decode_ffn)
    bool fused_qkv = false;
    LlamaCudaMemory memory;
  };
  static Plan plan(const io::ModelConfig& c, const LlamaCudaOptions& o, int sm_count) {
    const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, L = c.num_hidden_layers;
    const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
    const int64_t q_dim = nh * hd, kv_dim = nkv * hd, qkv_dim = q_dim + 2 * kv_dim;
    const int64_t T = o.max_tokens;
    Plan p;
    p.tokens = checked_nbytes(DType::i32, {T});
    p.p0 = checked_nbytes(DType::i32, {2 * o.max_batch});  // each sequence's first new position, then its last row
    p.x = checked_nbytes(DType::f32, {T, H});
    p.a = p.proj = p.y = checked_nbytes(DType::bf16, {T, H});
    p.qkv = checked_nbytes(DType::bf16, {T, qkv_dim});
    p.attn = checked_nbytes(DType::bf16, {T, q_dim});
    p.kv = checked_nbytes(DType::bf16, {o.max_batch, o.max_context, kv_dim});
    p.kv_buffers = o.kv_cache ? L : 1;
    p.ffn_forward = c.hidden_act == "relu" && H % 64 == 0 && I % 64 == 0;  // FfnForward's shapes
    if (p.ffn_forward) {
      const bool sparse = o.ffn == FfnMode::twell;
      p.prefill = o.ffn_options;
      if (!sparse) p.prefill.dispatch = Dispatch::always_dense;
      // A dense model's counts only feed record_ffn_stats: without them its short prefills are pure
      // stream work, and replay a graph (short_prefill_graph).
      if (!sparse && !o.record_ffn_stats) p.prefill.count_nonzeros = false;
      p.prefill.one_token_gemv = p.prefill.one_token_gemv && o.decode_gemv;
      p.prefill.few_token_gemm = o.few_token_gemm;  // (the model's option, not ffn_options')
      p.prefill.early_weight_reads = true;  // the model's weights never change after loading
      p.prefill.dispatch_slots = L;  // each layer dispatched on its own density
      p.prefill_shape = FfnShape{T, H, I, true};
      p.dense = p.prefill;
      p.dense.dispatch = Dispatch::always_dense;
      p.dense.dispatch_slots = 1;      // fixed dispatch: no samples to keep per layer
      p.dense.count_nonzeros = false;  // nothing comes back to the host: the step is graph-captured
      p.dense.gather_max_tokens = 0;
      p.dense_shape = FfnShape{o.max_batch, H, I, true};
      size_t ffn = FfnForward::required_workspace_bytes(p.prefill_shape, p.prefill) +
                   FfnForward::required_workspace_bytes(p.dense_shape, p.dense);
      if (sparse && o.decode_gather_tokens > 0) {
        p.decode_ffn = o.fused_decode_ffn && decode_ffn_supported(H, I);
        p.gather = p.dense;
        p.gather.dispatch = Dispatch::always_sparse;
        p.gather.gather_max_tokens = o.decode_gather_tokens;
        p.gather.one_token_kernel = !p.decode_ffn;  // one token goes to the decode FFN, never to the gather FFN
        // Rows: a decode step's sequences, or a small prefill's tokens (LlamaCudaOptions::prefill_gather).
        p.gather_shape = FfnShape{std::min(o.prefill_gather ? o.max_tokens : o.max_batch, o.decode_gather_tokens), H, I, true};
        ffn += FfnForward::required_workspace_bytes(p.gather_shape, p.gather);
        if (p.decode_ffn) ffn += DecodeFfn::bytes_for(H, I, sm_count);
      }
      p.memory.ffn = ffn;
    } else {
      p.g = p.u = checked_nbytes(DType::bf16, {T, I});
    }
    p.logits = checked_nbytes(DType::f32, {o.max_batch, V});
    p.sampler = o.sample_on_gpu ? DeviceSampler::device_bytes(o.max_batch, V) : 0;
    p.fused_qkv = o.fused_qkv_rope && hopper_available() &&
                  qkv_rope_supported(H, static_cast<int>(nh), static_cast<int>(nkv), static_cast<int>(hd));
    if (p.fused_qkv) {
      QkvRopeArgs qa;  // sized for the largest call: T tokens, sequences up to max_context
      qa.H = H;
      qa.rope.T = T, qa.rope.S = std::min(T, o.max_context), qa.rope.max_context = o.max_context;
      qa.rope.nh = static_cast<int>(nh), qa.rope.nkv = static_cast<int>(nkv), qa.rope.hd = static_cast<int>(hd);
      p.qkv_workspace = std::max<size_t>(qkv_rope_workspace_bytes(qa, sm_count), 16);
    }
    p.cos_sin = checked_nbytes(DType::f32, {o.max_context, hd});
    // Sums checked: each buffer is below 2^62 bytes (checked_nbytes), their sums need not be.
    const auto sum = [](std::initializer_list<size_t> parts) {
      size_t s = 0;
      for (size_t b : parts)
        TWELL_REQUIRE(!__builtin_add_overflow(s, b, &s), "LlamaCuda: these options need more than 2^64 bytes");
      return s;
    };
    TWELL_REQUIRE(!__builtin_mul_overflow(2 * static_cast<size_t>(p.kv_buffers), p.kv, &p.memory.kv_cache),
                "LlamaCuda: the KV cache of these options needs more than 2^64 bytes");
    p.memory.max_tokens = T;
    // At its peak: ensure_logits allocates the larger buffer before the old one goes (so that a failed
    // allocation leaves the old in place).
    const size_t grown = checked_nbytes(DType::f32, {std::max(o.max_batch, std::min(T, kLogitsRows)), V});
    p.memory.logits_growth = grown > p.logits ? grown : 0;
    p.memory.activations = sum({p.tokens, p.p0, p.x, p.a, p.qkv, p.attn, p.proj, p.y, p.g, p.u});
    p.memory.other =
        sum({LtGemm::kWorkspaceBytes, p.cos_sin, p.logits, p.sampler, p.qkv_workspace});  // one cuBLASLt workspace, shared
    sum({p.memory.kv_cache, p.memory.activations, p.memory.ffn, p.memory.other});  // total() fits
    return p;
  }

  // Refuses options whose buffers exceed the GPU's free memory, before they are allocated. The
  // model's own cuBLASLt workspace, counted in m.other, is allocated already (the member `gemm`).
  static void check_free_memory(const LlamaCudaMemory& m, const LlamaCudaOptions& o) {
    const DeviceMemory gpu = device_memory();
    TWELL_REQUIRE(m.total() - LtGemm::kWorkspaceBytes <= gpu.free, "LlamaCuda: these options need ", bytes_str(m.total()),
                " of GPU memory besides the weights (KV cache ", bytes_str(m.kv_cache), " for max_batch ", o.max_batch,
                " × max_context ", o.max_context, o.kv_cache ? "" : ", one layer's", "; activations ",
                bytes_str(m.activations), " for max_tokens ", o.max_tokens, "; FFN workspaces ", bytes_str(m.ffn),
                "; other ", bytes_str(m.other), "), and the GPU has ", gpu.str(),
                ": lower max_context, max_batch or max_tokens");
  }

  Impl(std::shared_ptr<const LlamaCudaWeights> weights, const LlamaCudaOptions& options)
      : w(std::move(weights)), o(resolve(w->config, options)), c(w->config) {
    H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, L = c.num_hidden_layers;
    nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
    q_dim = nh * hd, kv_dim = nkv * hd, qkv_dim = q_dim + 2 * kv_dim;
    relu = c.hidden_act == "relu";
    TWELL_CHECK(static_cast<int64_t>(w->layers.size()) == L, "LlamaCuda: weights hold ", w->layers.size(),
                " layers, config has ", L);

    sm_count = device_info().sm_count;
    const Plan p = plan(c, o, sm_count);
    check_free_memory(p.memory, o);
    tokens = DeviceBuffer(p.tokens);
    p0 = DeviceBuffer(p.p0);
    x = DeviceBuffer(p.x);
    a = DeviceBuffer(p.a);
    qkv = DeviceBuffer(p.qkv);
    attn = DeviceBuffer(p.attn);
    proj = DeviceBuffer(p.proj);
    y = DeviceBuffer(p.y);
    g = DeviceBuffer(p.g);
    u = DeviceBuffer(p.u);
    for (int64_t l = 0; l < p.kv_buffers; ++l) {
      k_cache.emplace_back(p.kv);
      v_cache.emplace_back(p.kv);
    }
    if (p.ffn_forward) {
      // The FFNs run on the model's stream, in order with its GEMMs: one cuBLASLt workspace serves all.
      const auto shared = [&](FfnOptions f) {
        f.cublaslt_workspace = gemm.workspace(), f.cublaslt_workspace_bytes = gemm.workspace_bytes();
        return f;
      };
      ffn_prefill = std::make_unique<FfnForward>(p.prefill_shape, shared(p.prefill));
      ffn_dense = std::make_unique<FfnForward>(p.dense_shape, shared(p.dense));
      if (p.gather_shape.max_tokens > 0) ffn_gather = std::make_unique<FfnForward>(p.gather_shape, shared(p.gather));
      if (p.decode_ffn) decode_ffn = DecodeFfn(H, I, sm_count);
    }
    TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&own.s, cudaStreamNonBlocking));
    stream = o.stream ? o.stream : own.s;
    ensure_logits(o.max_batch);
    gpu_sampling = o.sample_on_gpu && sample_kernel_runs();
    if (o.sample_on_gpu) sampler.reserve(o.max_batch, V);  // as planned, even where it cannot run
    sampler.penalize_in_place(true);  // the logits it draws from are this model's scratch
    fused_qkv = p.fused_qkv;
    if (fused_qkv) qkv_workspace = DeviceBuffer(p.qkv_workspace);

    // RoPE table as the CPU reference computes it (fp32 inverse frequencies and angles).
    std::vector<float> table(static_cast<size_t>(o.max_context * hd));
    const int64_t half = hd / 2;
    for (int64_t pos = 0; pos < o.max_context; ++pos)
      for (int64_t i = 0; i < half; ++i) {
        const float angle = c.rope_inv_freq<float>(i) * static_cast<float>(pos);
        table[pos * hd + i] = std::cos(angle);
        table[pos * hd + half + i] = std::sin(angle);
      }
    cos_sin = DeviceBuffer(p.cos_sin);
    TWELL_CUDA_CHECK(cudaMemcpyAsync(cos_sin.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice, stream));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    // Last: if anything above throws, ~Impl does not run, and only the members (RAII) are freed.
    TWELL_CUDA_CHECK(cudaEventCreate(&gpu_begin));
    TWELL_CUDA_CHECK(cudaEventCreate(&gpu_end));
    TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&staged, cudaEventDisableTiming));
  }

  ~Impl() {
    cudaStreamSynchronize(stream);  // enqueue() returns with work in flight that reads the buffers
    drop_graphs();
    if (gpu_begin) cudaEventDestroy(gpu_begin);
    if (gpu_end) cudaEventDestroy(gpu_end);
    if (staged) cudaEventDestroy(staged);
  }

  // Graphs are recorded again at the next calls.
  void drop_graphs() {
    for (auto& [key, graph] : graphs)
      if (graph.exec) cudaGraphExecDestroy(graph.exec);
    graphs.clear();
  }

  // `work` (a call's stream work: body()) run eagerly at a key's first two calls (they load kernels,
  // make cuBLASLt plans and, at the second, tune them: LtGemm), captured at the third, and the graph
  // replayed at every later call; again from the start where the call's gather_layer is not the
  // one the key's calls ran with (the densities moved). With cuda_graphs off, always eagerly; so is
  // a key whose capture failed or could not be instantiated (a cluster launch that a slice of the GPU
  // cannot hold passes capture). The graph is captured on the model's own stream (OwnStream) and
  // launched on `stream`. Returns whether a graph was launched.
  template <class Work>
  bool run_graphed(const GraphKey& key, Work&& work) {
    Graph& graph = graphs[key];
    if (graph.gather != gather_layer) {
      if (graph.exec) {
        TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));  // a replay may still read the old graph
        cudaGraphExecDestroy(graph.exec);
      }
      graph = Graph{};
      graph.gather = gather_layer;
    }
    if (graph.exec) {
      TWELL_CUDA_CHECK(cudaGraphLaunch(graph.exec, stream));
      paths = graph.paths;
      if (key[0] != kDecodeGraph) kernels = graph.kernels;
      return true;
    }
    if (!o.cuda_graphs || graph.eager_only || graph.eager++ < 2) {
      work();
      return false;
    }
    cudaGraph_t captured = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaError_t err = cudaSuccess;
    {
      struct Restore {
        cudaStream_t& ref;
        cudaStream_t old;
        ~Restore() { ref = old; }
      } restore{stream, stream};
      stream = own.s;
      TWELL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      try {
        work();
      } catch (...) {
        cudaStreamEndCapture(stream, &captured);
        if (captured) cudaGraphDestroy(captured);
        cudaGetLastError();
        graph.eager_only = true;  // the key's next call says, eagerly, whether the error is the call's own
        throw;
      }
      err = cudaStreamEndCapture(stream, &captured);
    }
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, captured, 0);
    if (captured) cudaGraphDestroy(captured);
    if (err != cudaSuccess) {  // not sticky: the call runs eagerly, as will the key's later ones
      cudaGetLastError();
      graph.eager_only = true;
      work();
      return false;
    }
    graph.exec = exec;
    graph.paths = paths;
    graph.kernels = kernels;
    TWELL_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    return true;
  }

  // Grows a buffer that calls size as they come (nll_io, act_stats_io) to at least `bytes`, once
  // the stream is done with the old one, which is freed first.
  void grow(DeviceBuffer& b, size_t bytes) {
    if (b.bytes() >= bytes) return;
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    b = DeviceBuffer();
    b = DeviceBuffer(bytes);
  }

  void ensure_logits(int64_t rows) {
    if (rows <= logits_rows) return;
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old buffer may still be in use
    drop_graphs();  // they write to the old buffer
    logits = DeviceBuffer(static_cast<size_t>(rows * V) * 4);
    logits_rows = rows;
  }

  int64_t longest() const { return lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end()); }

  // `fresh`: the call starts at position 0 (prefill, logits), whatever the cache holds now.
  // `chunked`: one sequence of more than max_tokens may run in chunks (prefill_chunks), which needs
  // the KV cache (the chunks' keys and values stay there for the chunks after them).
  void check_call(int64_t B, int64_t S, bool fresh = false, bool chunked = false) const {
    const int64_t start = fresh ? 0 : longest();
    TWELL_REQUIRE(B >= 1 && S >= 1, "LlamaCuda: need at least one sequence of one token, got ", B, " × ", S);
    TWELL_REQUIRE(B <= o.max_batch, "LlamaCuda: ", B, " sequences exceed max_batch ", o.max_batch);
    TWELL_REQUIRE(B * S <= o.max_tokens || (chunked && B == 1 && o.kv_cache), "LlamaCuda: ", B * S,
                " tokens exceed max_tokens ", o.max_tokens,
                chunked && B == 1 ? " (a longer prompt runs in chunks, which needs the KV cache: kv_cache = true)" : "");
    TWELL_REQUIRE(start + S <= o.max_context, "LlamaCuda: ", start + S, " positions exceed the context of ",
                o.max_context);
    TWELL_REQUIRE(fresh || lens.empty() || B == static_cast<int64_t>(lens.size()), "LlamaCuda: the cache holds ",
                lens.size(), " sequences, got ", B);
  }

  // Host-side inputs of a call: n tokens, and into p0 each sequence's first position (then, for
  // gather_last, each one's last row), through the pinned staging (the caller's vectors may change
  // as soon as this returns).
  void upload_inputs(const int32_t* host_tokens, int64_t n, const std::vector<int32_t>& positions) {
    TWELL_CUDA_CHECK(cudaEventSynchronize(staged));  // the previous call's copies have read the staging
    const size_t k = positions.size();
    pinned_in.reserve((static_cast<size_t>(n) + k) * 4);
    auto* in = pinned_in.as<int32_t>();
    if (host_tokens && n > 0) std::memcpy(in, host_tokens, static_cast<size_t>(n) * 4);
    std::copy(positions.begin(), positions.end(), in + n);
    if (host_tokens && n > 0)
      TWELL_CUDA_CHECK(cudaMemcpyAsync(tokens.get(), in, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(p0.get(), in + n, k * 4, cudaMemcpyHostToDevice, stream));
    TWELL_CUDA_CHECK(cudaEventRecord(staged, stream));
  }

  // Sets up a call whose B sequences all start at position p: body()'s flags, and the positions to upload.
  std::vector<int32_t> aligned_call(int64_t B, int64_t p) {
    aligned = true, gather_last = false, call_start = p;
    return std::vector<int32_t>(static_cast<size_t>(B), static_cast<int32_t>(p));
  }

  // Whether a call's FFN is twell's one-kernel decode FFN (decode_ffn): a decode step of one token.
  bool runs_decode_ffn(bool decode, int64_t T) const { return decode && T == 1 && !decode_ffn.empty(); }

  // Whether ffn(), where it runs the FFN of ffn_prefill's kinds, takes the gather path in `layer`: decode
  // steps of a few sequences and prefills of a few tokens (prefill_gathers), where gather_layer says.
  bool ffn_gathers(int64_t layer, bool decode) const {
    return (decode || prefill_gathers) && gather_layer[static_cast<size_t>(layer)];
  }

  // How the FFN leaves its output for the residual add + RMSNorm that follows it.
  enum class FfnOut {
    y,          // in y
    split,      // as the split sum decode_ffn.output() (the fused decode FFN)
    normalised  // already added into x, and x normalised by next_norm into `a` (FfnForward's then)
  };

  // The FFN of `a`; next_norm: the weights of the RMSNorm after it; pending: the residual add
  // deferred to the norm after it (ResidualNorm::before), or null.
  FfnOut ffn(const LlamaCudaLayer& lw, int64_t layer, int64_t T, bool decode, const uint16_t* next_norm,
             const uint16_t* pending, FfnPath* path) {
    const TensorView in = dev_view(a.get(), DType::bf16, {T, H}), out = dev_view(y.get(), DType::bf16, {T, H});
    if (act_stats && relu && !decode) add_activation_stats(lw, layer, T);  // before the FFN overwrites `a`
    if (runs_decode_ffn(decode, T)) {
      decode_ffn.run(a.as<uint16_t>(), lw.ffn(), false, true, stream);  // weights fixed: read early
      *path = FfnPath::gather;
      return FfnOut::split;
    }
    if (ffn_prefill) {
      // Decode steps of a few sequences take the sparse FFN where it has a path for them (not
      // where the model is wider than its kernels), the others the dense FFN.
      // So do prefills of a few tokens (forward(): prefill_gathers), in the layers where that reads less.
      const bool gather = ffn_gathers(layer, decode);
      FfnForward& f = gather ? *ffn_gather : !decode ? *ffn_prefill : *ffn_dense;
      ResidualNorm then{dev_view(x.get(), DType::f32, {T, H}),
                        dev_view(const_cast<uint16_t*>(next_norm), DType::bf16, {H}), in,
                        static_cast<float>(c.rms_norm_eps),
                        pending ? dev_view(const_cast<uint16_t*>(pending), DType::bf16, {T, H}) : TensorView{}};
      f.forward(in, lw.ffn(), out, stream, &f == ffn_prefill.get() ? layer : 0, o.ffn_residual_norm ? &then : nullptr);
      *path = f.last_path();
      if (o.record_ffn_stats && !decode) stats[static_cast<size_t>(layer)] = f.last_stats();  // waits
      return o.ffn_residual_norm ? FfnOut::normalised : FfnOut::y;
    }
    // Dense cuBLASLt FFN: SiLU models, and ReLU models whose H or I is not a multiple of 64.
    dense_h(lw, a.as<uint16_t>(), T, g.as<uint16_t>(), u.as<uint16_t>());
    gemm.run(g.get(), lw.wd.view().data, y.get(), T, H, I, false, GemmEpilogue::none, stream);
    *path = FfnPath::dense;
    if (o.record_ffn_stats && !decode) stats[static_cast<size_t>(layer)] = FfnStats{FfnPath::dense, T};
    return FfnOut::y;
  }

  // h = act(in Wgᵀ) ⊙ (in Wuᵀ) of T rows `in` ([T, H] bf16) into h_rows ([T, I] bf16; u_rows, as
  // large, is scratch) by cuBLASLt, bf16 g, u and h: the dense FFN's first half, and what
  // add_activation_stats counts.
  void dense_h(const LlamaCudaLayer& lw, const uint16_t* in, int64_t T, uint16_t* h_rows, uint16_t* u_rows) {
    gemm.run(in, lw.wg.view().data, h_rows, T, I, H, true, relu ? GemmEpilogue::relu : GemmEpilogue::none, stream);
    gemm.run(in, lw.wu.view().data, u_rows, T, I, H, true, GemmEpilogue::none, stream);
    if (relu)
      launch_mul_bf16(h_rows, u_rows, h_rows, T * I, stream);
    else
      launch_silu_mul(h_rows, u_rows, h_rows, T * I, stream);
  }

  // Adds the statistics of layer `layer`'s h = ReLU(a Wgᵀ) ⊙ (a Wuᵀ) over the call's T rows to
  // (*act_stats)[layer]: the dense FFN's h (dense_h) of the FFN's input beside the FFN, kStatsRows
  // rows at a time, each row counted on the GPU (launch_row_activation_stats), the rows summed here
  // in order. Waits for them.
  void add_activation_stats(const LlamaCudaLayer& lw, int64_t layer, int64_t T) {
    const int64_t R = act_stats_rows;  // at least T (forward_pieces)
    const int64_t P = std::min(R, kStatsRows);
    uint16_t* g_rows = act_stats_io.as<uint16_t>();
    uint16_t* u_rows = g_rows + P * I;
    double* l1 = reinterpret_cast<double*>(u_rows + P * I);  // 8-byte aligned: I is a multiple of 8
    int32_t* nnz = reinterpret_cast<int32_t*>(l1 + R);
    for (int64_t r = 0; r < T; r += P) {
      const int64_t n = std::min(P, T - r);
      dense_h(lw, a.as<uint16_t>() + r * H, n, g_rows, u_rows);  // h into g_rows
      launch_row_activation_stats(g_rows, n, I, nnz + r, l1 + r, stream);
    }
    std::vector<int32_t> row_nnz(static_cast<size_t>(T));
    std::vector<double> row_l1(static_cast<size_t>(T));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(row_nnz.data(), nnz, row_nnz.size() * 4, cudaMemcpyDeviceToHost, stream));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(row_l1.data(), l1, row_l1.size() * 8, cudaMemcpyDeviceToHost, stream));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    ActivationStats& s = (*act_stats)[static_cast<size_t>(layer)];
    s.tokens += T;
    for (int64_t t = 0; t < T; ++t) {
      s.nnz += row_nnz[static_cast<size_t>(t)];
      s.max_nnz_per_token = std::max<int64_t>(s.max_nnz_per_token, row_nnz[static_cast<size_t>(t)]);
      s.l1_sum += row_l1[static_cast<size_t>(t)];
    }
  }

  // out [T, N] = in [T, K] Wᵀ, bf16 (f32 for the LM head's logits): twell's GEMV for one token
  // (LlamaCudaOptions::decode_gemv), its few-token GEMM for 2 to 32 (LlamaCudaOptions::few_token_gemm;
  // both return true: they let the kernel after them start at once), otherwise cuBLASLt.
  bool project(const uint16_t* in, const DeviceTensor& weight, void* out, int64_t T, int64_t N, int64_t K,
               GemmOut type = GemmOut::bf16) {
    const bool f32 = type == GemmOut::f32;
    if (T == 1 && o.decode_gemv && decode_gemv_supported(N, K)) {
      DecodeGemvArgs args;
      args.x = in, args.w = bits(weight), args.N = N, args.K = K;
      if (f32) args.y_f32 = static_cast<float*>(out);
      else args.y = static_cast<uint16_t*>(out);
      args.early_weight_reads = true;  // the model's weights never change after loading
      launch_decode_gemv(args, sm_count, stream);
      return true;
    }
    const bool aligned16 = reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(bits(weight)) % 16 == 0;
    if (T > 1 && o.few_token_gemm && few_token_gemm_supported(T, N, K) && aligned16) {
      FewTokenGemmArgs args;
      args.x = in, args.w = bits(weight), args.M = T, args.N = N, args.K = K;
      if (f32) args.y_f32 = static_cast<float*>(out);
      else args.y = static_cast<uint16_t*>(out);
      args.early_weight_reads = true;
      launch_few_token_gemm(args, sm_count, stream);
      return true;
    }
    gemm.run(in, weight.view().data, out, T, N, K, true, GemmEpilogue::none, stream, type);
    return false;
  }

  // Whether an automatic call of kCudnnAttentionMinTokens or more takes cuDNN's SDPA: where this
  // shape (B, S, position) was called before (its plan is built, or will serve a shape that
  // recurs), or where the call's attention alone saves more than a plan's build (60-100 ms). Our
  // kernel ran the 2B model's 64 × 2048 prefill's attention at ~170 TFLOP/s, cuDNN's at ~420
  // (docs/perf.md, model item 12): ~3.5 ms saved a TFLOP, so a plan repays itself in one call of
  // ~25 TFLOP (that prefill: 42; one 2049-token prompt of the same model: 0.7). Where cuDNN is
  // not available the question does not arise (CudnnSdpa::run says why).
  static constexpr double kCudnnFirstCallFlop = 25e12;
  std::set<std::array<int64_t, 3>> attention_shapes;  // prefill shapes called before (B, S, position)
  bool cudnn_this_call = false;  // an automatic call's choice, made at its first layer
  bool cudnn_repays(const AttentionArgs& at) {
    if (!CudnnSdpa::available()) return true;
    const std::array<int64_t, 3> shape{at.B, at.S, call_start};
    if (attention_shapes.count(shape)) return true;
    if (attention_shapes.size() >= 4096) attention_shapes.clear();  // bounded: a server's lengths vary
    attention_shapes.insert(shape);
    // Query-key pairs of the causal attention, 4 FLOP a pair and head dimension (QKᵀ and PV), every layer.
    const double S = at.S, pairs = double(at.B) * S * ((S + 1) / 2 + double(call_start));
    return 4.0 * pairs * double(at.nh) * double(at.hd) * double(L) >= kCudnnFirstCallFlop;
  }

  // Attention of S > 1 tokens per sequence at position `call_start` (PrefillAttention); `first_layer`
  // notes the choice in `kernels`.
  void prefill_attention(const AttentionArgs& at, bool first_layer) {
    const PrefillAttention mode = o.prefill_attention;
    const int64_t T = int64_t{at.B} * at.S;
    if (first_layer && mode == PrefillAttention::automatic)  // for all the call's layers
      cudnn_this_call = T >= kCudnnAttentionMinTokens && cudnn_repays(at);
    std::string why;
    bool done = false;
    if (mode == PrefillAttention::twell)
      why = "(prefill_attention = twell)";
    else if (mode == PrefillAttention::automatic && T < kCudnnAttentionMinTokens)
      why = str("(", T, " tokens, below the ", kCudnnAttentionMinTokens, " at which cuDNN's SDPA is used)");
    else if (mode == PrefillAttention::automatic && !cudnn_this_call)
      why = "(the first call of this shape: cuDNN's plan is built at its second)";
    else {
      TWELL_CHECK(aligned, "LlamaCuda: cuDNN's attention of sequences at different positions");
      done = sdpa.run(at, call_start, stream, &why);
      TWELL_REQUIRE(done || mode != PrefillAttention::cudnn, "LlamaCuda: prefill_attention = cudnn, but ", why);
      if (!done) why = "(" + why + ")";
    }
    if (!done) {
      // Few query rows over many keys (a conversation's next turn over its history): the warps of a
      // block and the blocks of a cluster split the keys. Where the sequences end at different
      // positions, only the warps.
      AttentionArgs plan = at;
      plan_prefill_attention(plan, aligned ? call_start + at.S : 0, sm_count);
      launch_attention(plan, stream);
    }
    if (first_layer) kernels.attention = done ? str("cudnn ", CudnnSdpa::version()) : "twell " + why;
  }

  // The whole forward of B·S tokens at position p0 (device), from the tokens on the device to
  // the logits of the chosen rows. Only stream work, capturable (under capture, calls of S > 1
  // tokens run twell's attention kernel: CudnnSdpa refuses capture; the first cuDNN call of a
  // shape builds its plan on the host).
  void body(const int32_t* tok, int64_t B, int64_t S, Head head, bool decode) {
    const int64_t T = B * S;
    const float eps = static_cast<float>(c.rms_norm_eps);
    hidden_rows = T;
    if (!decode) kernels.graph = false;  // forward() sets it where run_graphed launched a graph
    launch_embed(tok, T, bits(w->embed), x.as<float>(), H, stream);
    paths.assign(static_cast<size_t>(L), FfnPath::dense);
    if (!decode) density_stale = true;
    if (o.record_ffn_stats && !decode) stats.assign(static_cast<size_t>(L), FfnStats{});
    FfnOut last = FfnOut::y;  // where the last FFN left its output
    // In every call but decode steps the attention's output is added into x by the norm after the FFN
    // rather than by the one before it (pending: `proj`, the order of the adds kept, so the same bits): x,
    // f32, is then written once a layer, not twice (model item 31). A decode step keeps the add where
    // it is: its split norm takes one addend.
    const bool defer = o.deferred_residual_add && !decode;
    const uint16_t* pending = nullptr;
    // x += (the deferred add, then) the last FFN's output (none before the first layer), then `a` =
    // RMSNorm(x)·norm_w.
    auto add_norm = [&](const uint16_t* norm_w, bool first) {
      if (last == FfnOut::split) {
        TWELL_CHECK(!pending, "LlamaCuda: a deferred residual add before the split decode FFN's norm");
        launch_add_rmsnorm(x.as<float>(), decode_ffn.output(), norm_w, a.as<uint16_t>(), H, eps, stream);
      }
      else if (last == FfnOut::y)
        launch_add_rmsnorm(x.as<float>(), pending, first ? nullptr : y.as<uint16_t>(), true, norm_w,
                           a.as<uint16_t>(), T, H, 1, 0, eps, stream);
      pending = nullptr;
    };
    for (int64_t l = 0; l < L; ++l) {
      const LlamaCudaLayer& lw = w->layers[l];
      const size_t cache = o.kv_cache ? static_cast<size_t>(l) : 0;
      add_norm(bits(lw.input_norm), l == 0);
      RopeKvArgs r;
      r.qkv = qkv.as<uint16_t>();
      const int64_t cache_row = run_first * o.max_context * kv_dim;  // run_first's keys and values
      r.k_cache = k_cache[cache].as<uint16_t>() + cache_row;
      r.v_cache = v_cache[cache].as<uint16_t>() + cache_row;
      r.cos_sin = cos_sin.as<float>();
      r.p0 = p0.as<int32_t>();
      r.T = T, r.S = S, r.max_context = o.max_context;
      r.nh = static_cast<int>(nh), r.nkv = static_cast<int>(nkv), r.hd = static_cast<int>(hd);
      const bool fuse = fused_qkv && T >= kFusedQkvMinTokens && aligned;
      if (!decode && l == 0) kernels.fused_qkv_rope = fuse;
      bool qkv_gemv = false;  // the one-token GEMV, which lets the decode attention start under it
      if (fuse) {
        QkvRopeArgs qa;
        qa.x = a.as<uint16_t>(), qa.w = bits(lw.wqkv), qa.H = H, qa.rope = r;
        launch_qkv_rope(qa, qkv_workspace.get(), qkv_workspace.bytes(), sm_count, stream);
      } else {
        qkv_gemv = project(a.as<uint16_t>(), lw.wqkv, qkv.as<uint16_t>(), T, qkv_dim, H);
      }
      AttentionArgs at;
      at.qkv = qkv.as<uint16_t>();
      at.k_cache = r.k_cache;
      at.v_cache = r.v_cache;
      at.o = attn.as<uint16_t>();
      at.p0 = r.p0;
      at.B = static_cast<int>(B), at.S = static_cast<int>(S), at.nh = r.nh, at.nkv = r.nkv, at.hd = r.hd;
      at.max_context = static_cast<int>(o.max_context);
      at.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      if (!decode && l == 0 && S == 1)  // prefill_attention() names its kernel; one token a sequence:
        kernels.attention =
            fuse ? "twell flash kernel (one token a sequence)" : "twell decode kernel (one token a sequence)";
      if (S == 1 && !fuse) {
        int splits = o.decode_attention_splits;
        if (splits == 0 && runs_decode_ffn(decode, T))  // LlamaCudaOptions::decode_attention_splits
          splits = std::max(1, cuda::decode_attention_splits(o.max_context, B, nh, sm_count) / 2);
        // RoPE and the cache write inside:
        launch_decode_attention(r, at, sm_count, stream, qkv_gemv, splits, o.decode_attention_warps);
      } else {
        if (!fuse) launch_rope_kv(r, stream);
        if (S == 1) {  // a step of 512 or more sequences (the graph of a decode step replays this plan)
          AttentionArgs plan = at;
          plan_prefill_attention(plan, 0, sm_count);
          launch_attention(plan, stream);
        } else
          prefill_attention(at, l == 0);
      }
      const bool gemv = project(attn.as<uint16_t>(), lw.wo, proj.as<uint16_t>(), T, H, q_dim);
      // After the GEMV (which lets its dependents start at once) the norm is launched as one, and
      // lets the FFN after it start too: their weight copies begin under the projection.
      launch_add_rmsnorm(x.as<float>(), nullptr, proj.as<uint16_t>(), !defer, bits(lw.post_norm), a.as<uint16_t>(), T,
                         H, 1, 0, eps, stream, gemv);
      if (defer) pending = proj.as<uint16_t>();
      if (o.ffn_input_hook && !decode) {
        TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
        o.ffn_input_hook(l, dev_view(a.get(), DType::bf16, {T, H}));
      }
      const uint16_t* next_norm = l + 1 < L ? bits(w->layers[l + 1].input_norm) : bits(w->final_norm);
      last = ffn(lw, l, T, decode, next_norm, pending, &paths[static_cast<size_t>(l)]);
      if (last == FfnOut::normalised) pending = nullptr;  // added by the FFN's norm
    }
    // x += the last FFN output; the final norm of every row goes to `a`.
    const uint16_t* fn = bits(w->final_norm);
    add_norm(fn, false);
    if (head == Head::none) return;
    const uint16_t* rows = a.as<uint16_t>();
    int64_t n = T;
    if (head == Head::last && S > 1) {  // each sequence's last row, normalised again into `proj`
      if (gather_last)  // rows of different offsets: as normalised into `a` above
        launch_gather_rows(a.as<uint16_t>(), p0.as<int32_t>() + B, B, H, proj.as<uint16_t>(), stream);
      else
        launch_add_rmsnorm(x.as<float>(), nullptr, nullptr, false, fn, proj.as<uint16_t>(), B, H, S, S - 1, eps,
                           stream);
      rows = proj.as<uint16_t>();
      n = B;
    }
    // The head of 1 to 8 rows through twell's kernels (project); cuBLASLt's already streams this
    // 201 MB matrix at 2.8 TB/s, but no faster: 71.5 µs against 66-68 there, while at 16 to 32 rows
    // the few-token GEMM is the slower (75-89 µs against 74; H100, docs/perf.md, sixty-third session).
    float* out = logits.as<float>() + run_first * V;
    if (n <= kTwellHeadMaxRows)
      project(rows, w->head(), out, n, V, H, GemmOut::f32);
    else
      gemm.run(rows, w->head().view().data, out, n, V, H, true, GemmEpilogue::none, stream, GemmOut::f32);
  }

  void enqueue(const int32_t* tok, int64_t B, int64_t S, Head head) {
    check_call(B, S);
    const int64_t p = longest();
    TWELL_CHECK(std::all_of(lens.begin(), lens.end(), [&](int64_t l) { return l == p; }),
                "LlamaCuda::enqueue: the cached sequences have different lengths");
    if (head != Head::none) ensure_logits(head == Head::all ? B * S : B);
    upload_inputs(nullptr, 0, aligned_call(B, p));
    TWELL_CUDA_CHECK(cudaEventRecord(gpu_begin, stream));
    body(tok, B, S, head, false);
    TWELL_CUDA_CHECK(cudaEventRecord(gpu_end, stream));
    last_tokens = B * S;
    if (o.kv_cache) lens.assign(static_cast<size_t>(B), p + S);
  }

  // Small logits (a decode step of one sequence: 196 KB at V = 49152) through the pinned staging,
  // larger ones straight into the result: the staging's extra host copy then costs more than the
  // pageable copy's overhead (H200 host, one sequence −13 µs a step, eight +15 µs; perf.md).
  static constexpr size_t kPinnedLogitsBytes = 512 * 1024;
  // [rows, V] on the host; [V] where `one_row` (one sequence's last token: no second copy to reshape).
  Tensor download_logits(int64_t rows, bool one_row = false) {
    const size_t bytes = static_cast<size_t>(rows * V) * 4;
    const Shape shape = one_row ? Shape{rows * V} : Shape{rows, V};
    if (bytes > kPinnedLogitsBytes) {
      Tensor out(DType::f32, shape);
      TWELL_CUDA_CHECK(cudaMemcpyAsync(out.view().data, logits.get(), bytes, cudaMemcpyDeviceToHost, stream));
      TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
      return out;
    }
    pinned_logits.reserve(bytes);
    TWELL_CUDA_CHECK(cudaMemcpyAsync(pinned_logits.get(), logits.get(), bytes, cudaMemcpyDeviceToHost, stream));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    return Tensor::copy_of(TensorView(pinned_logits.get(), DType::f32, shape));
  }

  // download false: the logits stay on the device (an empty Tensor is returned).
  // Prompts of different lengths run as batches of neighbouring prompts (ragged_prefill_runs), each
  // padded to its own longest with copies of each prompt's last token: causal attention keeps the
  // padding out of every real position, the head reads each prompt's own last row, and a sequence's
  // next decode step overwrites the cache rows its padding wrote before anything reads them. (The
  // padding's FFN activations count in the FFN's statistics.) A prompt longer than max_tokens runs
  // alone, in chunks at increasing positions (prefill_chunks), each attending to the keys the
  // chunks before it cached; only the last one's last row goes through the head.
  Tensor prefill(const std::vector<std::vector<int32_t>>& prompts, bool one_row = false, bool download = true) {
    TWELL_REQUIRE(!prompts.empty(), "LlamaCuda::prefill: no prompts");
    const int64_t B = static_cast<int64_t>(prompts.size());
    std::vector<int64_t> lengths;
    for (size_t b = 0; b < prompts.size(); ++b) {
      TWELL_REQUIRE(!prompts[b].empty(), "LlamaCuda::prefill: prompt ", b, " is empty");
      model::check_token_ids(c, prompts[b]);
      lengths.push_back(static_cast<int64_t>(prompts[b].size()));
    }
    const int64_t S = *std::max_element(lengths.begin(), lengths.end());
    std::vector<int64_t> runs{0, B};
    if (o.ragged_prefill_runs && B > 1) {
      check_call(B, 1, true);        // the batch's size
      check_call(1, S, true, true);  // its longest prompt, alone (each run's rows: prefill_runs)
      const bool sparse = prefill_ffn_sparse();
      auto batch_cost = [&](int64_t rows) {
        const bool dense_by_size = sparse && rows < o.ffn_options.sparse_min_tokens;
        return static_cast<double>(rows) * (dense_by_size ? kDenseRunRowCost : 1.0) + kPrefillRunTokens;
      };
      runs = model::prefill_runs(lengths, o.max_tokens, [&](int64_t rows) {
        if (rows <= o.max_tokens) return batch_cost(rows);
        double cost = 0;  // one prompt, in chunks
        for (int64_t chunk : model::prefill_chunks(rows, o.max_tokens)) cost += batch_cost(chunk);
        return cost;
      });
    }
    std::vector<int64_t> run_tokens;  // each run's longest prompt
    for (size_t r = 0; r + 1 < runs.size(); ++r) {
      const int64_t n = runs[r + 1] - runs[r];
      run_tokens.push_back(*std::max_element(lengths.begin() + runs[r], lengths.begin() + runs[r + 1]));
      check_call(n, run_tokens.back(), true, n == 1);  // before reset(): a rejected call changes nothing
    }
    reset();
    ensure_logits(B);
    read_densities_for_prefill();
    last_tokens = 0;
    struct RunGuard {  // body() back at sequence 0 whatever happens
      int64_t& first;
      ~RunGuard() { first = 0; }
    } guard{run_first};
    for (size_t r = 0; r + 1 < runs.size(); ++r) {
      const int64_t b0 = runs[r], n = runs[r + 1] - b0, rs = run_tokens[r];
      if (n == 1 && rs > o.max_tokens) {  // one prompt, in chunks
        prefill_in_chunks(b0, prompts[static_cast<size_t>(b0)].data(), rs, 0);
        continue;
      }
      std::vector<int32_t> flat, positions = aligned_call(n, 0);
      flat.reserve(static_cast<size_t>(n * rs));
      for (int64_t b = b0; b < b0 + n; ++b) {
        const auto& p = prompts[static_cast<size_t>(b)];
        flat.insert(flat.end(), p.begin(), p.end());
        flat.insert(flat.end(), static_cast<size_t>(rs) - p.size(), p.back());
        gather_last = gather_last || static_cast<int64_t>(p.size()) != rs;
      }
      if (gather_last)
        for (int64_t b = 0; b < n; ++b)
          positions.push_back(static_cast<int32_t>(b * rs + lengths[static_cast<size_t>(b0 + b)] - 1));
      forward(b0, n, rs, flat.data(), positions, Head::last);
    }
    TWELL_CUDA_CHECK(cudaEventRecord(gpu_end, stream));
    if (o.kv_cache) lens = lengths;
    return download ? download_logits(B, one_row) : Tensor();
  }

  // One forward of n sequences from sequence b0 of `rs` tokens each (`flat`, on the host), with
  // body()'s flags and the positions to upload set by the caller (aligned_call); a call's first
  // (last_tokens 0) starts its GPU clock.
  void forward(int64_t b0, int64_t n, int64_t rs, const int32_t* flat, const std::vector<int32_t>& positions,
               Head head) {
    upload_inputs(flat, n * rs, positions);
    choose_gather_layers(n * rs, true);  // before body() marks the densities stale
    if (last_tokens == 0) TWELL_CUDA_CHECK(cudaEventRecord(gpu_begin, stream));
    run_first = b0;
    prefill_gathers = true;
    struct Gathers {  // false again whatever happens: other calls' prefills run no gather
      bool& on;
      ~Gathers() { on = false; }
    } gathers{prefill_gathers};
    if (const int64_t splits = short_prefill_graph(b0, n, rs); splits > 0) {
      kernels.graph = run_graphed({kPrefillGraph, rs, splits, 2 * static_cast<int64_t>(head) + (gather_last ? 1 : 0)},
                                  [&] { body(tokens.as<int32_t>(), n, rs, head, false); });
      hidden_rows = n * rs, density_stale = true;  // body()'s, which a replay does not run
    } else {
      body(tokens.as<int32_t>(), n, rs, head, false);
    }
    last_tokens += n * rs;
  }

  // Forwards of the cache's first sequence alone, of at most decode_gather_tokens tokens (a
  // conversation's next turn after its history, a short prompt), replay a graph (run_graphed): the
  // GPU would otherwise wait for the host's launches, ~10 a layer. Where every layer's FFN is pure
  // stream work (the gather FFN where gather_layer chose it, else an FFN that reads nothing back: one
  // token on the one-token kernel, at any dispatch), and
  // nothing in the forward waits for the host (FFN statistics, the FFN input hook, cuDNN's attention,
  // which refuses capture). The graph's buffers are sequence 0's (its cache rows and logits row: a
  // ragged prefill's later runs run eagerly). Returns the attention's key splits (its plan, fixed in
  // the graph: part of the key, with the length and the head), or 0 where the forward runs eagerly.
  int64_t short_prefill_graph(int64_t b0, int64_t n, int64_t rs) {
    if (!o.cuda_graphs || b0 != 0 || n != 1 || !aligned || rs > o.decode_gather_tokens || o.record_ffn_stats ||
        act_stats || o.ffn_input_hook || o.prefill_attention == PrefillAttention::cudnn)
      return 0;
    if (ffn_prefill && !ffn_prefill->capturable(rs))
      for (int64_t l = 0; l < L; ++l)
        if (!(prefill_gathers && gather_layer[static_cast<size_t>(l)])) return 0;
    if (rs == 1) return 1;  // the decode attention kernel: no plan, one graph at every position
    AttentionArgs plan;
    plan.B = 1, plan.S = static_cast<int>(rs), plan.nh = static_cast<int>(nh), plan.hd = static_cast<int>(hd);
    plan_prefill_attention(plan, call_start + rs, sm_count);
    return plan.key_splits;
  }

  // The n tokens `p` of sequence b0 at positions pos0.., in chunks of at most max_tokens
  // (prefill_chunks), each attending to the keys cached before it; the last one's last row through
  // the head.
  void prefill_in_chunks(int64_t b0, const int32_t* p, int64_t n, int64_t pos0) {
    int64_t done = 0;
    for (int64_t len : model::prefill_chunks(n, o.max_tokens)) {
      forward(b0, 1, len, p + done, aligned_call(1, pos0 + done), done + len == n ? Head::last : Head::none);
      done += len;
    }
  }

  // LanguageModel::prefill_from: the cached sequence's first `keep` positions kept, `toks` run after them.
  Tensor prefill_from(int64_t keep, const std::vector<int32_t>& toks, bool download) {
    if (keep == 0) return prefill({toks}, true, download);
    TWELL_REQUIRE(lens.size() == 1, "LlamaCuda::prefill_from: the cache holds ", lens.size(),
                  " sequences; a prefix is kept of one (after prefill or generate)");
    TWELL_REQUIRE(keep > 0 && keep <= lens[0], "LlamaCuda::prefill_from: keep ", keep, " is outside the ", lens[0],
                  " cached positions");
    TWELL_REQUIRE(!toks.empty(), "LlamaCuda::prefill_from: no tokens to run after the kept ", keep);
    model::check_token_ids(c, toks);
    const int64_t n = static_cast<int64_t>(toks.size());
    TWELL_REQUIRE(keep + n <= o.max_context, "LlamaCuda: ", keep + n, " positions exceed the context of ",
                  o.max_context);
    ensure_logits(1);
    read_densities_for_prefill();
    lens.clear();  // until the forward has run: one that fails part way leaves no cache
    last_tokens = 0;
    prefill_in_chunks(0, toks.data(), n, keep);
    TWELL_CUDA_CHECK(cudaEventRecord(gpu_end, stream));
    lens = {keep + n};
    return download ? download_logits(1, true) : Tensor();
  }

  // Rows of logits all_logits computes and copies out at a time: the device holds that many rows of
  // V floats (512 MB at Llama 3's 128256), not the whole call's (4 GB for an 8192-token window).
  static constexpr int64_t kLogitsRows = 1024;
  // Rows of FFN statistics (add_activation_stats) counted at a time: their g and u take 4 · I bytes a
  // row (46 MB at the 2B model's I = 5632), within the headroom load_model's fit leaves free
  // (kGpuHeadroomBytes), however many rows a forward holds.
  static constexpr int64_t kStatsRows = 2048;

  // The checks of a forward of one whole sequence from position 0 (logits, next_token_nll), before
  // anything changes.
  void check_whole_sequence(const std::vector<int32_t>& toks, const char* what) const {
    model::check_token_ids(c, toks);
    check_whole_sequences(1, static_cast<int64_t>(toks.size()), what);
  }
  // The same for B sequences of S tokens (their ids checked by the caller): one in chunks, several
  // in one forward.
  void check_whole_sequences(int64_t B, int64_t S, const char* what) const {
    check_call(B, S, true, B == 1);
    // It runs in the KV cache's memory: a generation in progress would be lost, and a const call
    // must not end it. So it is refused, and nothing changes.
    TWELL_REQUIRE(lens.empty(), what, ": the KV cache holds ", longest(),
                " positions of a generation in progress, which it would overwrite; call reset() first, or run it "
                "on a second LlamaCuda over the same weights");
  }

  // The forward of B sequences of S tokens each (`flat`, B · S on the host) from position 0
  // (logits, next_token_nll, next_token_nll_batch): one sequence in chunks where it holds more than
  // max_tokens tokens, several in one forward (B · S at most max_tokens: check_whole_sequences); after each
  // forward, its head kLogitsRows rows at a time into `logits`, each piece handed to piece(first row
  // of the B · S, rows) before the next overwrites it. Leaves the cache empty. The pieces' work and
  // copies are ordered on the stream, which is synchronised before this returns or throws (the
  // caller's host buffers outlive it). `layer_stats`: each layer's FFN statistics
  // (add_activation_stats), or null.
  template <class Piece>
  void forward_pieces(const int32_t* flat, int64_t B, int64_t S, Piece&& piece,
                      std::vector<ActivationStats>* layer_stats) {
    const int64_t T = B * S;
    reset();
    ensure_logits(std::min({T, o.max_tokens, kLogitsRows}));
    if (layer_stats) {
      layer_stats->assign(static_cast<size_t>(L), ActivationStats{});
      // g, u [kStatsRows at most, I] bf16, then each row's Σ|h| (double) and non-zeros (int32) of
      // this call's largest forward: sized for the call, kept for the next.
      act_stats_rows = std::min(T, o.max_tokens);
      const size_t need = static_cast<size_t>(std::min(act_stats_rows, kStatsRows)) * static_cast<size_t>(4 * I) +
                          static_cast<size_t>(act_stats_rows) * (8 + 4);
      try {
        grow(act_stats_io, need);
      } catch (const Error& e) {
        throw Error(str("LlamaCuda: the FFN statistics of ", act_stats_rows, " tokens a forward need ",
                        bytes_str(need), " of GPU memory besides the model's: ", e.what()));
      }
    }
    struct StatsGuard {  // act_stats for this call only, however it ends
      std::vector<ActivationStats>*& slot;
      ~StatsGuard() { slot = nullptr; }
    } guard{act_stats = layer_stats};
    try {
      TWELL_CUDA_CHECK(cudaEventRecord(gpu_begin, stream));
      int64_t pos = 0;  // B == 1: the chunk's first position; B > 1: one forward, from 0
      for (int64_t len : B == 1 ? model::prefill_chunks(S, o.max_tokens) : std::vector<int64_t>{S}) {
        upload_inputs(flat + pos, B * len, aligned_call(B, pos));
        body(tokens.as<int32_t>(), B, len, Head::none, false);  // leaves the final norm's rows in `a`
        for (int64_t r = 0; r < B * len; r += kLogitsRows) {
          const int64_t n = std::min(kLogitsRows, B * len - r);
          gemm.run(a.as<uint16_t>() + r * H, w->head().view().data, logits.get(), n, V, H, true, GemmEpilogue::none,
                   stream, GemmOut::f32);
          piece(pos + r, n);
        }
        pos += len;
      }
      TWELL_CUDA_CHECK(cudaEventRecord(gpu_end, stream));
      TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    } catch (...) {
      cudaStreamSynchronize(stream);  // nothing queued may still write the caller's memory
      reset();
      throw;
    }
    last_tokens = T;
    reset();
  }

  // Logits of every position (LlamaCuda::logits) through forward_pieces, each piece copied into the
  // result (up to kLogitsRows tokens: one piece, the GEMM body()'s Head::all would run).
  Tensor all_logits(const std::vector<int32_t>& toks, std::vector<ActivationStats>* layer_stats) {
    const int64_t T = static_cast<int64_t>(toks.size());
    Tensor out(DType::f32, {T, V});
    forward_pieces(toks.data(), 1, T, [&](int64_t first, int64_t n) {  // before the next piece's GEMM, in stream order
      TWELL_CUDA_CHECK(cudaMemcpyAsync(out.ptr<float>() + first * V, logits.get(), static_cast<size_t>(n * V) * 4,
                                       cudaMemcpyDeviceToHost, stream));
    }, layer_stats);
    return out;
  }

  // −log p(next | before) at every row but the last of each of B sequences of S tokens (`flat`, B · S
  // on the host) from position 0 (next_token_nll, next_token_nll_batch): each piece of logits reduced
  // on the GPU (launch_row_nll); the targets go up once and the doubles come back once, not
  // B · S × V floats. A sequence's last row predicts nothing: its target is a stand-in (id 0), its
  // loss dropped.
  std::vector<std::vector<double>> all_nll(const int32_t* flat, int64_t B, int64_t S,
                                           std::vector<ActivationStats>* layer_stats) {
    const int64_t T = B * S;
    grow(nll_io, static_cast<size_t>(T) * (8 + 4));
    double* nll = nll_io.as<double>();
    auto* targets = reinterpret_cast<int32_t*>(nll + T);
    std::vector<int32_t> next(flat + 1, flat + T);  // row t predicts flat[t + 1] ...
    next.push_back(0);
    for (int64_t b = 1; b <= B; ++b) next[static_cast<size_t>(b * S - 1)] = 0;  // ... but each sequence's last
    TWELL_CUDA_CHECK(cudaMemcpyAsync(targets, next.data(), static_cast<size_t>(T) * 4, cudaMemcpyHostToDevice, stream));
    std::vector<double> rows(static_cast<size_t>(T));
    forward_pieces(flat, B, S, [&](int64_t first, int64_t n) {
      launch_row_nll(logits.as<float>(), n, V, targets + first, nll + first, stream);
      if (first + n == T)  // the last piece: every row reduced
        TWELL_CUDA_CHECK(cudaMemcpyAsync(rows.data(), nll, static_cast<size_t>(T) * 8, cudaMemcpyDeviceToHost, stream));
    }, layer_stats);
    std::vector<std::vector<double>> out;
    for (int64_t b = 0; b < B; ++b) out.emplace_back(rows.begin() + b * S, rows.begin() + (b + 1) * S - 1);
    return out;
  }

  // next_token_nll_batch: neighbouring sequences of one length in forwards of up to max_batch of
  // them and max_tokens rows (all_nll), a longer one alone in chunks; every call checked first.
  std::vector<std::vector<double>> batch_nll(const std::vector<std::vector<int32_t>>& seqs,
                                             std::vector<ActivationStats>* layer_stats) {
    model::check_sequences(c, seqs, 2, "perplexity: sequence");
    std::vector<size_t> starts;  // each forward's first sequence, then seqs.size()
    for (size_t b = 0; b < seqs.size(); ++b) {
      const int64_t S = static_cast<int64_t>(seqs[b].size());
      const int64_t n = starts.empty() ? 0 : static_cast<int64_t>(b - starts.back());
      const bool joins = n > 0 && seqs[starts.back()].size() == seqs[b].size() && n < o.max_batch &&
                         (n + 1) * S <= o.max_tokens;
      if (!joins) starts.push_back(b);
    }
    starts.push_back(seqs.size());
    for (size_t f = 0; f + 1 < starts.size(); ++f) {
      const int64_t n = static_cast<int64_t>(starts[f + 1] - starts[f]);
      check_whole_sequences(n, static_cast<int64_t>(seqs[starts[f]].size()), "LlamaCuda::next_token_nll_batch");
    }
    if (layer_stats) layer_stats->clear();
    std::vector<std::vector<double>> out;
    std::vector<ActivationStats> part;
    std::vector<int32_t> flat;
    for (size_t f = 0; f + 1 < starts.size(); ++f) {
      const int64_t n = static_cast<int64_t>(starts[f + 1] - starts[f]), S = static_cast<int64_t>(seqs[starts[f]].size());
      flat.clear();
      for (size_t b = starts[f]; b < starts[f + 1]; ++b) flat.insert(flat.end(), seqs[b].begin(), seqs[b].end());
      for (std::vector<double>& v : all_nll(flat.data(), n, S, layer_stats ? &part : nullptr)) out.push_back(std::move(v));
      if (layer_stats) model::add_layer_stats(*layer_stats, part);
    }
    return out;
  }

  // Whether the prefill FFN takes its sparse path where a call is large enough (sparse_min_tokens):
  // twell's FFN, a dispatch that measures (observe, previous), and every layer's last measured
  // density below dense_above_density. Unknown before the first prefill: false.
  bool prefill_ffn_sparse() {
    if (o.ffn_options.dispatch != Dispatch::observe && o.ffn_options.dispatch != Dispatch::previous) return false;
    const std::vector<double>& d = densities();
    return std::all_of(d.begin(), d.end(), [&](double v) { return v >= 0 && v < o.ffn_options.dense_above_density; });
  }

  // What the prefill FFN last measured per layer (-1 unknown; all -1 without twell's FFN), read once
  // after each prefill (waiting for its samples, which its logits' copy has done).
  const std::vector<double>& densities() {
    if (density_stale) {
      layer_density.assign(static_cast<size_t>(L), -1.0);
      if (ffn_prefill && o.ffn == FfnMode::twell)
        for (int64_t l = 0; l < L; ++l) layer_density[l] = ffn_prefill->observed_density(l);
      density_stale = false;
    }
    return layer_density;
  }

  // gather_layer for a decode step of B sequences, or (prefill) a forward of B tokens
  // (LlamaCudaOptions::prefill_gather), from the layers' densities (kGatherDensityBatch). A decode
  // step gathers where a layer's density is unknown, a prefill not (its dense FFN measures it), nor
  // a prefill of one token (the prefill FFN's one-token kernel takes it at any density, faster). A
  // prefill reads the densities as read at its call's start (read_densities_for_prefill): between
  // a call's runs or chunks, reading them would wait for the run before.
  void choose_gather_layers(int64_t B, bool prefill = false) {
    const bool can_gather = ffn_gather && B <= o.decode_gather_tokens && ffn_gather->sparse_supported(B) &&
                            (!prefill || (o.prefill_gather && B > 1));
    gather_layer.assign(static_cast<size_t>(L), can_gather && B == 1 ? 1 : 0);
    if (!can_gather || B == 1) return;  // nothing to choose: no density needed
    const std::vector<double>& d = prefill ? layer_density : densities();
    for (int64_t l = 0; l < L; ++l) {
      const double v = l < static_cast<int64_t>(d.size()) ? d[static_cast<size_t>(l)] : -1.0;
      gather_layer[static_cast<size_t>(l)] = v < 0 ? !prefill : static_cast<double>(B) * v <= kGatherDensityBatch;
    }
  }
  // Before a prefill's first forward: the densities its small runs' gather choices read (the calls
  // before it have synchronised, so their samples have arrived: no wait).
  void read_densities_for_prefill() {
    if (ffn_gather && o.prefill_gather) densities();
  }

  // A step of every cached sequence; one whose token is kNoToken sits it out: its row runs on
  // token 0 at its next position (the last, if its context is full), whose cache row it overwrites
  // unread (that sequence's next step writes it again first; a full one has no next step), and its
  // logits are zeroed.
  Tensor decode(const std::vector<int32_t>& toks, bool one_row = false, bool download = true) {
    TWELL_REQUIRE(o.kv_cache, "LlamaCuda::decode: built without a KV cache (kv_cache = false)");
    TWELL_REQUIRE(!lens.empty(), "LlamaCuda::decode: call prefill first");
    const int64_t B = static_cast<int64_t>(toks.size());
    TWELL_REQUIRE(B == static_cast<int64_t>(lens.size()), "LlamaCuda::decode: the cache holds ", lens.size(),
                " sequences, got ", B, " token", B == 1 ? "" : "s",
                one_row ? " (decode_step after prefill_batch: decode_batch takes a token of each)" : "");
    model::check_token_ids(c, toks, true);
    std::vector<int32_t> ids(toks), positions(static_cast<size_t>(B));
    std::vector<int64_t> out;  // the sequences that sit out
    for (int64_t b = 0; b < B; ++b) {
      if (toks[b] == model::kNoToken) {
        out.push_back(b);
        ids[b] = 0;
        positions[b] = static_cast<int32_t>(std::min(lens[b], o.max_context - 1));
        continue;
      }
      TWELL_REQUIRE(lens[b] < o.max_context, "LlamaCuda: sequence ", b, " holds ", lens[b],
                  " positions, the whole context: it has no room for another token");
      positions[b] = static_cast<int32_t>(lens[b]);
    }
    aligned = std::all_of(positions.begin(), positions.end(), [&](int32_t p) { return p == positions[0]; });
    gather_last = false, call_start = positions[0];
    upload_inputs(ids.data(), B, positions);
    // A graph per batch size (run_graphed); aligned and unaligned steps (which cannot take the
    // fused QKV GEMM) have one each.
    choose_gather_layers(B);
    TWELL_CUDA_CHECK(cudaEventRecord(gpu_begin, stream));
    run_graphed({kDecodeGraph, B, aligned ? 0 : 1, 0}, [&] { body(tokens.as<int32_t>(), B, 1, Head::all, true); });
    for (int64_t b : out)
      TWELL_CUDA_CHECK(cudaMemsetAsync(logits.as<float>() + b * V, 0, static_cast<size_t>(V) * 4, stream));
    TWELL_CUDA_CHECK(cudaEventRecord(gpu_end, stream));
    last_tokens = hidden_rows = B;  // hidden_rows: a replayed graph runs no body()
    for (int64_t b = 0; b < B; ++b) lens[b] += toks[b] != model::kNoToken;
    return download ? download_logits(B, one_row) : Tensor();
  }

  // Row b of the last call's logits drawn by samplers[b], kNoToken where tokens[b] is.
  std::vector<int32_t> sample_rows(std::vector<model::Sampler>& samplers, const std::vector<int32_t>* toks) {
    std::vector<model::Sampler*> by_row;
    for (size_t b = 0; b < samplers.size(); ++b)
      by_row.push_back(toks && (*toks)[b] == model::kNoToken ? nullptr : &samplers[b]);
    const int64_t B = static_cast<int64_t>(samplers.size());
    return sampler.sample(dev_view(logits.get(), DType::f32, {B, V}), by_row, stream);
  }

  void reset() { lens.clear(); }
};

bool LlamaCuda::supports(const io::ModelConfig& c, std::string* why) {
  std::string reason;
  const int64_t hd = c.head_dim;
  if (hd != 16 && hd != 32 && hd != 64 && hd != 128)
    reason = str("head_dim ", hd, " (the attention kernels take 16, 32, 64 or 128)");
  else if (c.hidden_act != "relu" && c.hidden_act != "silu")
    reason = str("hidden_act ", c.hidden_act, " (relu or silu)");
  else if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0)
    reason = str("hidden_size ", c.hidden_size, " and intermediate_size ", c.intermediate_size,
                 " (multiples of 8)");
  else if (c.hidden_size > kMaxNormWidth)
    reason = str("hidden_size ", c.hidden_size, " (at most ", kMaxNormWidth, ")");
  if (why) *why = reason;
  return reason.empty();
}

LlamaCuda::LlamaCuda(std::shared_ptr<const LlamaCudaWeights> weights, LlamaCudaOptions options) {
  TWELL_REQUIRE(weights != nullptr, "LlamaCuda: no weights");
  impl_ = std::make_unique<Impl>(std::move(weights), options);
}
LlamaCuda::~LlamaCuda() = default;
LlamaCuda::LlamaCuda(LlamaCuda&&) noexcept = default;
LlamaCuda& LlamaCuda::operator=(LlamaCuda&&) noexcept = default;

const io::ModelConfig& LlamaCuda::config() const { return impl_->c; }

Tensor LlamaCuda::logits(const std::vector<int32_t>& tokens, std::vector<ActivationStats>* ffn_stats) const {
  impl_->check_whole_sequence(tokens, "LlamaCuda::logits");
  return impl_->all_logits(tokens, ffn_stats);
}

std::vector<double> LlamaCuda::next_token_nll(const std::vector<int32_t>& tokens,
                                              std::vector<ActivationStats>* ffn_stats) const {
  TWELL_REQUIRE(tokens.size() >= 2, "perplexity: need at least 2 tokens, got ", tokens.size());
  impl_->check_whole_sequence(tokens, "LlamaCuda::next_token_nll");
  return impl_->all_nll(tokens.data(), 1, static_cast<int64_t>(tokens.size()), ffn_stats).front();
}

std::vector<std::vector<double>> LlamaCuda::next_token_nll_batch(const std::vector<std::vector<int32_t>>& sequences,
                                                                std::vector<ActivationStats>* ffn_stats) const {
  return impl_->batch_nll(sequences, ffn_stats);
}

Tensor LlamaCuda::prefill(const std::vector<int32_t>& tokens) {
  cache_written();
  return impl_->prefill({tokens}, true);
}

Tensor LlamaCuda::decode_step(int32_t token) {
  model::check_token_ids(impl_->c, {token});  // kNoToken too: decode_batch's, not a token
  cache_written();
  return impl_->decode({token}, true);
}

Tensor LlamaCuda::prefill_from(int64_t keep, const std::vector<int32_t>& tokens) {
  cache_written();
  return impl_->prefill_from(keep, tokens, true);
}
std::vector<int32_t> LlamaCuda::prefill_from_sample(int64_t keep, const std::vector<int32_t>& tokens,
                                                    std::vector<model::Sampler>& samplers) {
  if (!impl_->gpu_sampling) return LanguageModel::prefill_from_sample(keep, tokens, samplers);
  model::check_samplers(samplers, 1, "LlamaCuda::prefill_from_sample");  // before the step runs
  cache_written();
  impl_->prefill_from(keep, tokens, false);
  return impl_->sample_rows(samplers, nullptr);
}

bool LlamaCuda::samples_on_gpu() const { return impl_->gpu_sampling; }

Tensor LlamaCuda::prefill_batch(const std::vector<std::vector<int32_t>>& prompts) {
  cache_written();
  return impl_->prefill(prompts);
}
Tensor LlamaCuda::decode_batch(const std::vector<int32_t>& tokens) {
  cache_written();
  return impl_->decode(tokens);
}

std::vector<int32_t> LlamaCuda::prefill_batch_sample(const std::vector<std::vector<int32_t>>& prompts,
                                                     std::vector<model::Sampler>& samplers) {
  if (!impl_->gpu_sampling) return LanguageModel::prefill_batch_sample(prompts, samplers);
  model::check_samplers(samplers, prompts.size(), "LlamaCuda::prefill_batch_sample");  // before the step runs
  cache_written();
  impl_->prefill(prompts, false, false);
  return impl_->sample_rows(samplers, nullptr);
}
std::vector<int32_t> LlamaCuda::decode_batch_sample(const std::vector<int32_t>& tokens,
                                                    std::vector<model::Sampler>& samplers) {
  if (!impl_->gpu_sampling) return LanguageModel::decode_batch_sample(tokens, samplers);
  model::check_samplers(samplers, tokens.size(), "LlamaCuda::decode_batch_sample");
  cache_written();
  impl_->decode(tokens, false, false);
  return impl_->sample_rows(samplers, &tokens);
}
int64_t LlamaCuda::max_batch() const { return impl_->o.max_batch; }
std::vector<int64_t> LlamaCuda::cached_lengths() const { return impl_->lens; }

int64_t LlamaCuda::cached_tokens() const { return impl_->longest(); }
int64_t LlamaCuda::context() const { return impl_->o.max_context; }
void LlamaCuda::reset() {
  cache_written();
  impl_->reset();
}

void LlamaCuda::enqueue(const int32_t* tokens, int64_t B, int64_t S, Head head) {
  cache_written();
  impl_->enqueue(tokens, B, S, head);
}
int64_t LlamaCuda::last_tokens() const { return impl_->last_tokens; }
const float* LlamaCuda::logits_device() const { return impl_->logits.as<float>(); }
TensorView LlamaCuda::hidden_device() const {
  return dev_view(impl_->x.get(), DType::f32, {impl_->hidden_rows, impl_->H});
}
cudaStream_t LlamaCuda::stream() const { return impl_->stream; }
std::vector<FfnPath> LlamaCuda::ffn_paths() const { return impl_->paths; }
std::vector<FfnStats> LlamaCuda::ffn_stats() const { return impl_->stats; }
LlamaCuda::PrefillKernels LlamaCuda::prefill_kernels() const { return impl_->kernels; }

size_t LlamaCuda::workspace_bytes() const {
  const Impl& m = *impl_;
  size_t n = m.tokens.bytes() + m.p0.bytes() + m.x.bytes() + m.a.bytes() + m.qkv.bytes() + m.attn.bytes() +
             m.proj.bytes() + m.y.bytes() + m.g.bytes() + m.u.bytes() + m.cos_sin.bytes() +
             m.logits.bytes() + m.nll_io.bytes() + m.act_stats_io.bytes() + m.sampler.workspace_bytes();
  for (const auto& b : m.k_cache) n += b.bytes();
  for (const auto& b : m.v_cache) n += b.bytes();
  if (m.ffn_prefill) n += m.ffn_prefill->workspace_bytes() + m.ffn_dense->workspace_bytes();
  if (m.ffn_gather) n += m.ffn_gather->workspace_bytes();
  return n + m.decode_ffn.bytes() + m.gemm.workspace_bytes() + m.sdpa.workspace_bytes() +
         m.qkv_workspace.bytes();
}

LlamaCudaMemory LlamaCuda::memory_needed(const io::ModelConfig& c, const LlamaCudaOptions& options) {
  return Impl::plan(c, Impl::resolve(c, options), device_info().sm_count).memory;
}

const LlamaCudaOptions& LlamaCuda::options() const { return impl_->o; }

float LlamaCuda::last_gpu_ms() const {
  TWELL_CUDA_CHECK(cudaEventSynchronize(impl_->gpu_end));
  float ms = 0;
  TWELL_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->gpu_begin, impl_->gpu_end));
  return ms;
}

}  // namespace twell::cuda
