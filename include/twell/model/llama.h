// Llama-style decoder-only language model on the CPU reference backend: weights loaded from a
// HuggingFace checkpoint (config.json + safetensors), the forward pass, a KV-cache decode API,
// sampling and perplexity. It is the oracle for the GPU runtime (DESIGN.md §5, §6).
//
// Notation (DESIGN.md §2): T tokens, H hidden_size, I intermediate_size, V vocab_size,
// nh attention heads, nkv key/value heads (GQA: nh % nkv == 0), hd head_dim.
//
//   x = embed[tokens]                                     [T, H]
//   per layer:  a = rmsnorm(x) · input_layernorm          [T, H]
//               q = a Wqᵀ [T, nh·hd], k = a Wkᵀ, v = a Wvᵀ [T, nkv·hd]; RoPE on q and k
//               x += causal_softmax(q kᵀ / √hd) v · Woᵀ     (query head h reads kv head h/(nh/nkv))
//               b = rmsnorm(x) · post_attention_layernorm
//               x += ffn(b)       relu: twell::cpu::ffn_forward; silu: y = (silu(b Wgᵀ) ⊙ b Wuᵀ) Wd
//   logits = rmsnorm(x) · norm · lm_headᵀ                  [T, V] (lm_head = embed when tied)
//
// RoPE follows HF's "rotate_half" convention: for i < hd/2, with f_i = θ^(-2i/hd) and angle p·f_i
// at position p, out[i] = q[i]·cos − q[i+hd/2]·sin and out[i+hd/2] = q[i+hd/2]·cos + q[i]·sin.
//
// Implementation: src/model/llama_weights.cpp (loading), llama_cpu.cpp (forward, KV cache),
// llama_sampling.cpp (sampling, generation, perplexity). Tests: tests/model/test_llama_cpu.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "twell/ffn.h"
#include "twell/io/config.h"
#include "twell/io/safetensors.h"
#include "twell/tensor.h"

namespace twell::model {

// ---- weights --------------------------------------------------------------------------------
struct LlamaLoadOptions {
  // Storage dtype of the loaded weights: f32 (default) or bf16. Converted once at load.
  DType dtype = DType::f32;
  // Reject NaN/Inf in any tensor (reads every element once more), as twell::runtime::load_model, the
  // C API and the CLI do unless told not to (--no-check-finite).
  bool check_finite = true;
};

struct LlamaLayerWeights {
  Tensor input_norm;  // [H]          model.layers.{i}.input_layernorm.weight
  Tensor wq;          // [nh·hd, H]   self_attn.q_proj.weight
  Tensor wk;          // [nkv·hd, H]  self_attn.k_proj.weight
  Tensor wv;          // [nkv·hd, H]  self_attn.v_proj.weight
  Tensor wo;          // [H, nh·hd]   self_attn.o_proj.weight
  Tensor post_norm;   // [H]          post_attention_layernorm.weight
  Tensor wg;          // [I, H]       mlp.gate_proj.weight
  Tensor wu;          // [I, H]       mlp.up_proj.weight
  Tensor wd;          // [I, H]       mlp.down_proj.weight ([H, I] on disk), neuron-major

  FfnWeights ffn() const { return FfnWeights{wg, wu, wd}; }
};

struct LlamaWeights {
  io::ModelConfig config;
  Tensor embed;  // [V, H]  model.embed_tokens.weight
  std::vector<LlamaLayerWeights> layers;
  Tensor final_norm;  // [H]     model.norm.weight
  Tensor lm_head;     // [V, H]  lm_head.weight; empty when config.tie_word_embeddings
  // Checkpoint tensors the model does not use, by name: lm_head.weight of a tied model, say, or
  // layers past config.num_hidden_layers. HF's rotary_emb.inv_freq buffers are not listed.
  std::vector<std::string> unused;
  // load() found config.json tying the embeddings but the checkpoint holding an lm_head.weight of
  // other values: it used that head (config.tie_word_embeddings now false), as transformers 5 does.
  bool head_untied = false;

  // Validates every tensor's presence, shape and dtype (float: BF16, F16, F32 or F64) against
  // `config`, then converts. Errors name the tensor, e.g. "<ckpt>: tensor
  // 'model.layers.1.mlp.up_proj.weight': expected shape [176, 64], got [176, 63]". A tensor the
  // Llama layer does not have (q_proj.bias, say) inside a layer the model runs is an error: that
  // model would run wrong. Other tensors the model does not use are listed in `unused`.
  static LlamaWeights load(const io::Checkpoint& ckpt, const io::ModelConfig& config,
                           const LlamaLoadOptions& options = {});
  // load's checks alone, reading no tensor data: throws what load would, else returns `unused`.
  static std::vector<std::string> check(const io::Checkpoint& ckpt, const io::ModelConfig& config);
  // The layer of a "model.layers.<n>.…" tensor name, or -1.
  static int64_t layer_of(const std::string& name);
  // The bytes of the weights `config` names, each element `dtype` (what load holds with that storage dtype).
  static size_t bytes_for(const io::ModelConfig& config, DType dtype);
  // config.json + safetensors from one directory (io::read_config, io::Checkpoint::open).
  static LlamaWeights load_dir(const std::string& dir, const LlamaLoadOptions& options = {});
  // The inverse: config.json and model.safetensors (HF's names and layout, this dtype) into `dir`,
  // created where missing, each file written atomically and config.json renamed last (a failure
  // before that rename leaves the earlier model, or none, and no directory it created). load_dir reads back the
  // same bits. Other files in `dir` (generation_config.json, a tokenizer) stay and go with the saved model when it
  // is loaded.
  void save_dir(const std::string& dir) const;

  // Checks weights built by hand as load() checks a checkpoint: the config, then every tensor's
  // shape (wd neuron-major, [I, H]) and dtype (all f32, or all bf16), lm_head empty exactly when
  // the embeddings are tied. Throws an Error naming the first bad tensor. LlamaCpu and
  // LlamaCudaWeights::upload call it.
  void validate() const;

  // The output projection [V, H]: lm_head, or embed when tied.
  const TensorView& head() const {
    return config.tie_word_embeddings ? embed.view() : lm_head.view();
  }
  DType dtype() const { return embed.dtype(); }

 private:
  void write_dir(const std::string& dir) const;  // save_dir's files, into a directory that exists
};

// ---- forward --------------------------------------------------------------------------------
struct LlamaOptions {
  // Accumulation and activation type of the whole forward: f32 (default) or f64 (test oracle).
  DType math = DType::f32;
  // Rounding points of the ReLU-gated FFN (twell::Precision, src/cpu/ffn_common.h). The default,
  // f64, rounds nothing (fp32 PyTorch up to summation order; accumulated in double, output stored
  // in the math type); bf16/h_fp32 round g, u (and h) as a bf16 PyTorch model does. Ignored for
  // silu models and when math is f64 (which always uses Precision::f64).
  Precision relu_ffn = Precision::f64;
};

// In decode_batch's tokens: this sequence sits the step out (see LanguageModel::decode_batch).
constexpr int32_t kNoToken = -1;

// Throws, naming the first offender, unless every token id lies in [0, c.vocab_size) (or, with
// `no_token_ok`, is kNoToken: decode_batch's tokens).
// `where` begins the message ("llama: token 260 at index 3 is outside …").
void check_token_ids(const io::ModelConfig& c, const std::vector<int32_t>& tokens, bool no_token_ok = false,
                     const std::string& where = "llama");

// Throws, naming the first offender and its sequence ("<what> 2: token …"), unless every sequence
// holds at least `least` tokens, each in [0, c.vocab_size), and (where `context` > 0) at most
// `context` ("<what> 2 of 65 tokens exceeds the model's context of 64 positions").
void check_sequences(const io::ModelConfig& c, const std::vector<std::vector<int32_t>>& sequences, int64_t least,
                     const char* what, int64_t context = 0);

class Sampler;

// What generation, perplexity and the CLI need of a model, whichever backend runs it: LlamaCpu
// here, twell::cuda::LlamaCuda (cuda/llama.h) on the GPU.
class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual const io::ModelConfig& config() const = 0;
  // Logits of every position [T, V] of one sequence from position 0. A backend may refuse it while
  // a generation is cached (LlamaCuda, whose forward runs in the cache's memory): reset() first.
  // `ffn_stats`: resized to one entry a layer, each the statistics of that layer's FFN activation h
  // over the T tokens (ReLU models; zeros for SiLU ones).
  virtual Tensor logits(const std::vector<int32_t>& tokens,
                        std::vector<ActivationStats>* ffn_stats = nullptr) const = 0;
  // −log p(tokens[t+1] | tokens[0..t]) for t < T − 1 under one forward from position 0 (T ≥ 2;
  // perplexity): by default nll_from_logits of logits(); a backend may reduce the logits where they
  // are (LlamaCuda: on the GPU, so that T − 1 numbers cross to the host, not T × V logits). The same
  // refusals as logits(). `ffn_stats` as for logits().
  virtual std::vector<double> next_token_nll(const std::vector<int32_t>& tokens,
                                             std::vector<ActivationStats>* ffn_stats = nullptr) const;
  // next_token_nll of each of several sequences (each of at least 2 tokens; `twell eval`'s windows):
  // result[b] is next_token_nll(sequences[b]) up to the summation order of batched arithmetic, and
  // `ffn_stats` the statistics of all of them summed. By default one call each; a backend may run
  // neighbouring sequences of one length in one forward (LlamaCuda: up to max_batch() of them and
  // its max_tokens rows, so that short windows fill the GPU and take the sparse FFN). Every
  // sequence is checked before any runs.
  virtual std::vector<std::vector<double>> next_token_nll_batch(
      const std::vector<std::vector<int32_t>>& sequences, std::vector<ActivationStats>* ffn_stats = nullptr) const;
  // KV-cache decoding: prefill clears the cache and returns the last token's logits [V].
  virtual Tensor prefill(const std::vector<int32_t>& tokens) = 0;
  virtual Tensor decode_step(int32_t token) = 0;  // [V]
  // Positions the cache holds: those of the one sequence, or of a batch's longest.
  virtual int64_t cached_tokens() const = 0;
  // Positions the KV cache holds at most: max_position_embeddings, or less where the backend was
  // built for shorter sequences.
  virtual int64_t context() const = 0;
  virtual void reset() = 0;

  // Batches of B sequences, of any lengths, each with its own KV cache. prefill_batch clears the
  // cache and returns the logits of each prompt's last token [B, V]; decode_batch appends tokens[b]
  // to sequence b and returns [B, V]. A sequence whose token is kNoToken sits the step out (a
  // finished one, or one whose context is full): its length stays, what it computes later is
  // unchanged, and its row of the result is zeros. Sequence b's
  // logits are those of prefill(prompts[b]) and decode_step of its tokens, up to the summation
  // order of the batched arithmetic (LlamaCpu: the same bits). B at most max_batch(). The default
  // implementation runs one sequence through prefill / decode_step and refuses more.
  virtual Tensor prefill_batch(const std::vector<std::vector<int32_t>>& prompts);
  virtual Tensor decode_batch(const std::vector<int32_t>& tokens);
  // The same, then the next token of each sequence drawn by samplers[b] (all with the same
  // options; kNoToken for a sequence that sat out, whose sampler draws nothing), the logits not
  // returned: a backend may draw where they are (LlamaCuda: on the GPU, so that only the tokens
  // cross to the host). By default Sampler::sample of each row on the host. generate and
  // generate_batch draw through these.
  virtual std::vector<int32_t> prefill_batch_sample(const std::vector<std::vector<int32_t>>& prompts,
                                                    std::vector<Sampler>& samplers);
  virtual std::vector<int32_t> decode_batch_sample(const std::vector<int32_t>& tokens,
                                                   std::vector<Sampler>& samplers);
  virtual int64_t max_batch() const { return 1; }
  // How many neighbouring sequences of one length next_token_nll_batch runs in one forward: 1 by
  // default (one call each, so that grouping more changes nothing but how often progress is
  // reported); LlamaCuda: max_batch(). windowed_perplexity and ffn_stats_in_windows hand it that
  // many windows at a time unless told otherwise.
  virtual int64_t sequences_a_forward() const { return 1; }
  // Positions cached per sequence of the last prefill or prefill_batch (empty after reset()).
  virtual std::vector<int64_t> cached_lengths() const;

  // Prefix reuse (a conversation's next turn, prompts that share a system prompt): where the cache
  // holds one sequence, keeps its first `keep` positions (0 ≤ keep ≤ cached_tokens()) and runs
  // `tokens` (at least one) at the positions after them, returning the last one's logits [V]: those
  // of prefill(the kept prefix + tokens) up to the summation order of a forward in two parts
  // (LlamaCpu: the same bits). keep = 0 is prefill(tokens). A refused call leaves the cache as it
  // was; one that fails part way leaves it empty. Only where keeps_prefix(); the default refuses keep > 0.
  virtual Tensor prefill_from(int64_t keep, const std::vector<int32_t>& tokens);
  // The same, the next token drawn by samplers[0] (one sampler), as prefill_batch_sample draws.
  virtual std::vector<int32_t> prefill_from_sample(int64_t keep, const std::vector<int32_t>& tokens,
                                                   std::vector<Sampler>& samplers);
  // Whether prefill_from keeps a prefix and every call that may change the cache moves
  // cache_writes() (a backend that says so does both): PromptCache reuses nothing of one that does not.
  virtual bool keeps_prefix() const { return false; }
  // A stamp of the cache's contents: every call that may change the cache (prefill, decode, reset,
  // ...; a refused one may too) sets it to a value no model of this process has had before, so that
  // PromptCache sees whether anything ran on the model since it looked, whichever model this is.
  uint64_t cache_writes() const { return cache_writes_; }

 protected:
  LanguageModel() : cache_writes_(next_cache_stamp()) {}
  LanguageModel(const LanguageModel&) = delete;
  LanguageModel& operator=(const LanguageModel&) = delete;
  // A moved model is another model: a cache that looked at either reuses nothing of it.
  LanguageModel(LanguageModel&&) noexcept : cache_writes_(next_cache_stamp()) {}
  LanguageModel& operator=(LanguageModel&&) noexcept {
    cache_writes_ = next_cache_stamp();
    return *this;
  }
  // Each backend calls it from every public method that may change its cache.
  void cache_written() { cache_writes_ = next_cache_stamp(); }

 private:
  static uint64_t next_cache_stamp();
  uint64_t cache_writes_;
};

// The CPU backend: the reference the GPU runtime is tested against. Its loops run on
// cpu::num_threads() threads (twell/cpu/threads.h), the same bits for any count.
class LlamaCpu final : public LanguageModel {
 public:
  explicit LlamaCpu(LlamaWeights weights, LlamaOptions options = {});
  ~LlamaCpu() override;
  LlamaCpu(LlamaCpu&&) noexcept;
  LlamaCpu& operator=(LlamaCpu&&) noexcept;

  const LlamaWeights& weights() const { return weights_; }
  const io::ModelConfig& config() const override { return weights_.config; }
  const LlamaOptions& options() const { return options_; }

  // Full causal forward from position 0, independent of the KV cache below:
  // logits [T, V], f32 (f64 when options.math is f64). Tokens must lie in [0, V) and
  // T ≤ max_position_embeddings.
  // With `ffn_stats`, it is resized to one entry per layer and receives the statistics of that
  // layer's FFN activation h over these tokens (ReLU models; a SiLU model's entries stay empty).
  Tensor logits(const std::vector<int32_t>& tokens,
                std::vector<ActivationStats>* ffn_stats = nullptr) const override;

  // Incremental decoding with a KV cache owned by this object. prefill() clears the cache, runs
  // the prompt (T ≥ 1) and returns the logits of its last token [V]; decode_step() appends one
  // token and returns its logits [V]. After prefill(p) and decode_step(t1..tn), the result
  // equals the last row of logits(p + t1..tn) (same arithmetic; summation order per row is the
  // same, so it matches to the last bits in practice). Throws when the cache would exceed
  // max_position_embeddings or when decode_step() comes before prefill().
  Tensor prefill(const std::vector<int32_t>& tokens) override;
  Tensor decode_step(int32_t token) override;
  int64_t cached_tokens() const override;  // positions held by the KV cache
  int64_t context() const override { return config().max_position_embeddings; }
  void reset() override;  // empties the KV cache
  // Batches (LanguageModel::prefill_batch): one cache a sequence, each run as prefill and
  // decode_step run it, so every row has the bits it would have alone.
  Tensor prefill_batch(const std::vector<std::vector<int32_t>>& prompts) override;
  Tensor decode_batch(const std::vector<int32_t>& tokens) override;
  int64_t max_batch() const override { return kMaxBatch; }
  std::vector<int64_t> cached_lengths() const override;
  Tensor prefill_from(int64_t keep, const std::vector<int32_t>& tokens) override;  // the same bits as prefill()
  bool keeps_prefix() const override { return true; }
  static constexpr int64_t kMaxBatch = 65535;

 private:
  struct Impl;  // the KV cache and scratch (llama_cpu.cpp)
  LlamaWeights weights_;
  LlamaOptions options_;
  std::unique_ptr<Impl> impl_;
};

// ---- sampling, generation, perplexity (llama_sampling.cpp) -----------------------------------
struct SamplingOptions {
  // 0: greedy (argmax, lowest index on ties). Otherwise logits are divided by it.
  double temperature = 0.0;
  int64_t top_k = 0;   // keep the k most likely tokens; 0 = all
  double top_p = 1.0;  // keep the smallest set whose probability reaches top_p; 1 = all
  // RNG seed; the same seed gives the same tokens from the same logits (on one backend: the CPU's and
  // the GPU's round differently) wherever std::exp rounds alike.
  uint64_t seed = 0;
  // Draw only ids below this (0 = any): for a model whose embedding rows are padded past its
  // tokenizer's vocabulary, whose extra ids could not be decoded.
  int64_t vocab_limit = 0;
  // min-p, after top-k and top-p as HF's MinPLogitsWarper: keep the tokens whose probability is at
  // least min_p times the most likely one's (weight exp((logit − max) / T) ≥ min_p); 0 = all.
  double min_p = 0.0;
  // HF's RepetitionPenaltyLogitsProcessor, before everything else, greedy decoding included: the logit
  // of every id the sequence holds so far (its prompt and the tokens drawn: Sampler::seen) is divided
  // by the penalty where positive and multiplied by it where negative, in f32 as transformers does;
  // 1 = off, above 1 discourages repeats.
  double repetition_penalty = 1.0;

  void check() const;  // throws twell::Error on a value out of range (NaN included)
  // How many of a row of V logits a draw reads: the first vocab_limit where it is in (0, V), else all.
  int64_t drawable(int64_t V) const { return vocab_limit > 0 && vocab_limit < V ? vocab_limit : V; }
  // Whether `o` draws by the same rules (all but the seed): samplers one batch may mix.
  bool same_rules(const SamplingOptions& o) const {
    return temperature == o.temperature && top_k == o.top_k && top_p == o.top_p && vocab_limit == o.vocab_limit &&
           min_p == o.min_p && repetition_penalty == o.repetition_penalty;
  }
};

// The sampling options a caller may set itself, as bits: those of `twell run` given on its command
// line, Python's generate() arguments that are not None.
enum SamplingField : unsigned {
  kSampleTemperature = 1,
  kSampleTopK = 2,
  kSampleTopP = 4,
  kSampleMinP = 8,
  kSampleRepetitionPenalty = 16,
  kSampleAllFields = 31
};

// `mine` completed from a model's generation config (generation_config.json, or config.json's keys) as
// transformers' generate() completes its arguments from it: each field not in `given` takes the file's
// value. The temperature is the file's where do_sample is true (1 where it says none), else 0 (greedy);
// repetition_penalty the file's either way; top_k, top_p and min_p the file's only where the temperature
// the run ends with samples (top_k 50 where do_sample is true and the file says none, as
// GenerationConfig's default; twell's 0 otherwise, where transformers' do_sample=True would add 50 too).
// Only the values taken are checked (a caller's own override a bad one): a key of the wrong type, a value
// out of SamplingOptions' ranges, or do_sample with temperature 0 (transformers refuses it) throws,
// naming the file. `taken` (may be null) receives the fields the completion set (to the file's values,
// or to transformers' defaults where the file says none); none where the file gives no key. Seed and
// vocab_limit stay mine.
SamplingOptions with_generation_config(SamplingOptions mine, unsigned given, const io::GenerationDefaults& g,
                                       unsigned* taken = nullptr);

// Draws tokens from logit rows. Deterministic for a seed: std::mt19937_64 and our own
// uniform-double conversion (std distributions differ between standard libraries).
// twell::cuda::DeviceSampler (cuda/sampler.h) draws by the same rules from logits on the GPU.
class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // `logits`: [V] or [1, V], f32 or f64, on the host. Takes one next_uniform() unless greedy.
  int32_t sample(const TensorView& logits);
  // The tokens sample() can return from these logits (the repetition penalty, temperature, top-k, top-p
  // and min-p applied: a positive probability), in id order; greedy: the argmax alone. Draws nothing.
  std::vector<int32_t> candidates(const TensorView& logits) const;

  const SamplingOptions& options() const { return options_; }
  // The sampler's next random number, in [0, 1), from 53 bits: what sample() draws with, for a
  // sampler that draws elsewhere (on the GPU) from the same stream.
  double next_uniform();

  // The ids its sequence holds, for the repetition penalty (kept only where it is on): generate()
  // and generate_batch() give each sequence's prompt and then each token drawn; a caller drawing with
  // a Sampler itself does the same. Negative ids are not kept.
  void seen(const std::vector<int32_t>& ids);
  void seen(int32_t id);
  const std::vector<int32_t>& seen_ids() const { return seen_; }  // each once, in the order first seen
  // `logits` with the repetition penalty applied to the seen ids: a copy in `copy`, or `logits` itself
  // where there is nothing to apply.
  TensorView penalized(const TensorView& logits, Tensor& copy) const;

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<int32_t> seen_;
  std::unordered_set<int32_t> is_seen_;
};

// Throws unless `samplers` holds one sampler for each of B sequences, all with the same options
// (their seeds may differ): what the *_batch_sample calls take. `what` names the call.
void check_samplers(const std::vector<Sampler>& samplers, size_t B, const char* what);

// The error sample() raises for a row it cannot draw from: logit `index` is `value` (NaN or +inf),
// or, with index < 0, all `n` logits are -inf.
[[noreturn]] void throw_unsampleable(int64_t index, double value, int64_t n);

// Why generate() stopped, in the order it checks after each token.
enum class StopReason {
  stop_token,    // the last token is one of `stop_tokens`
  max_tokens,    // `max_new_tokens` were drawn
  context_full,  // the KV cache holds the model's whole context: the last token has no position
  callback,      // generate_batch's on_token asked that sequence to stop
};

struct Generation {
  std::vector<int32_t> tokens;  // the new tokens only, ending with the stop token if one ended it
  StopReason reason = StopReason::max_tokens;
  double prefill_seconds = 0;  // wall time of the prompt's forward and the first token's draw
  double decode_seconds = 0;   // wall time from after the first tokens' callbacks (every sequence's
                               // first, counted in neither figure) to the end: the tokens after the
                               // first, their draws and callbacks included (a rate:
                               // (tokens.size() - 1) / it; 0 for one token)
  int64_t reused = 0;          // the prompt's positions taken from the KV cache, not computed (PromptCache)
};

// What a model's KV cache holds between generations that reuse it (generate_batch with one
// prompt and a cache): the ids at its positions. A generation with it prefills only the part of its
// prompt after the longest prefix the prompt shares with them (prefill_from; at least the prompt's
// last token runs; Generation::reused says how many positions it took), then records what the cache
// holds after it: the prompt and the tokens drawn but the last. It reuses nothing where anything else
// ran on the model since (cache_writes: a callback's calls too), or of a backend that does not
// keeps_prefix(), so a stale cache costs a whole prefill, never a wrong result. A generation refused
// or failed leaves it empty. Its fields are the generations' to set.
struct PromptCache {
  std::vector<int32_t> ids;  // what the cache holds at positions 0..; empty: nothing known
  uint64_t writes = 0;       // the model's cache_writes() when `ids` was recorded
  const LanguageModel* model = nullptr;

  // The positions of `prompt` that `model`'s cache holds now: those of the longest prefix it shares
  // with `ids`, at most prompt.size() − 1; 0 where the cache holds something else.
  int64_t reusable(const LanguageModel& m, const std::vector<int32_t>& prompt) const;
  void forget() { *this = PromptCache{}; }
};

// Prefills `prompt` (even when max_new_tokens is 0, which times the prompt alone), then samples
// up to `max_new_tokens` tokens with decode steps, stopping after any of `stop_tokens`
// (end-of-sequence ids) or when the model's context is full. `on_token`, if given, sees each token
// as soon as it is drawn, the stop token included, before the next step is computed: for
// streaming. If it or the model throws, the exception propagates. Uses the model's KV cache,
// which it starts afresh (with `cache`, it keeps what PromptCache finds it can). It is generate_batch
// of this one prompt (its rules, its sampler seeded sampling.seed).
Generation generate(LanguageModel& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                    const SamplingOptions& sampling, const std::vector<int32_t>& stop_tokens = {},
                    const std::function<void(int32_t)>& on_token = {}, PromptCache* cache = nullptr);

struct Perplexity {
  int64_t predictions = 0;  // T − 1
  double mean_nll = 0;      // mean over t of −log p(tokens[t+1] | tokens[0..t]), natural log
  double perplexity = 0;    // exp(mean_nll); +inf where that overflows a double (a mean NLL past ~709.8 nats)
};
// How a batch of prompts of these lengths is best prefilled as runs of neighbouring prompts, each
// run one batch padded to its own longest prompt: the runs' bounds [0, b1, ..., B], chosen for the
// least total run_cost(rows) (rows: the run's prompts × its longest; the cost holds what a run
// pays besides its rows, e.g. its launches), with no run of several prompts above max_tokens
// rows. A prompt longer than max_tokens is a run of its own, which its caller prefills in chunks
// (prefill_chunks; run_cost is asked its whole length). Prompts of one length that fit
// max_tokens make one run. A caller that orders its prompts by length gets the fewest padded rows
// (generate_batch does).
std::vector<int64_t> prefill_runs(const std::vector<int64_t>& lengths, int64_t max_tokens,
                                  const std::function<double(int64_t rows)>& run_cost);

// The lengths of the chunks a prompt of `tokens` tokens is prefilled in, each at most max_tokens:
// the prompt itself where it fits, else the fewest chunks, as even as they can be (the first ones
// one token longer): 20000 tokens at max_tokens 16384 run as 10000 + 10000, 16385 as 8193 + 8192.
// More than one chunk each holds at least half of max_tokens, so at the default of 16384 each
// stays on the twell FFN's sparse path (sparse_min_tokens 8192).
std::vector<int64_t> prefill_chunks(int64_t tokens, int64_t max_tokens);

// generate() for B prompts at once, through prefill_batch_sample and decode_batch_sample (B at
// most model.max_batch()): sequence b draws from a Sampler seeded `sampling.seed + b`, so that
// with logits of the same bits (LlamaCpu) its tokens are those of generate(prompts[b]) with that
// seed. Each sequence stops on its own (a stop token, max_new_tokens, or its context full) and
// then sits the remaining steps out. `on_token(b, token)` sees each token as it is drawn; true
// stops sequence b after it (StopReason::callback, unless the token is a stop token). Every
// result's prefill_seconds is the batch's; its decode_seconds runs to that sequence's last token.
// The model runs the prompts ordered by length (stable; LlamaCuda pads fewer rows: prefill_runs), so
// its cache afterwards (cached_lengths) holds the sequences in that order; the results and
// on_token's b are the caller's order. `cache` (one prompt only): reuse of what the model's cache
// holds from the generation before (PromptCache), whose ids it updates.
std::vector<Generation> generate_batch(LanguageModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                       int64_t max_new_tokens, const SamplingOptions& sampling,
                                       const std::vector<int32_t>& stop_tokens = {},
                                       const std::function<bool(int64_t, int32_t)>& on_token = {},
                                       PromptCache* cache = nullptr);

// Perplexity of a sequence under one full forward (T ≥ 2): model.next_token_nll, with `ffn_stats`
// as for logits().
Perplexity perplexity(const LanguageModel& model, const std::vector<int32_t>& tokens,
                      std::vector<ActivationStats>* ffn_stats = nullptr);
// The same from logits [T, V] (f32 or f64) already computed for `tokens`.
Perplexity perplexity_from_logits(const TensorView& logits, const std::vector<int32_t>& tokens);
// The windows a text of `tokens` tokens is scored in (`twell eval`): [begin, end) every `stride`
// tokens (1 ≤ stride ≤ window), each at most `window` long and at least 2, each scoring the tokens
// [from, end) that the windows before it did not. stride = window: windows that do not overlap,
// each one's first token context only (not scored); less: HuggingFace's sliding window, every token
// from the second on scored once, with at least window − stride tokens before it (but in the first
// window), at about window / stride times the forwards.
struct EvalWindow {
  int64_t begin = 0, end = 0, from = 0;
};
std::vector<EvalWindow> eval_windows(int64_t tokens, int64_t window, int64_t stride);

// Perplexity of a text longer than one forward (`twell eval`): one forward a window of
// eval_windows(T, window, stride) (the first max_windows of them where that is > 0), each token
// counted once in the mean. `ffn_stats`: each layer's statistics summed over the windows' forwards
// (logits()'; stride = window only, so that no token counts twice), and the text's last token's
// where it is left alone after the last window (it predicts nothing): every token of the text, as
// ffn_stats_in_windows counts them, unless max_windows stops short of the text's end. `on_window(done,
// windows, so_far)` after each window (progress). Throws naming the window where its losses are not
// finite. `what` names the text in messages. `windows_per_call`: up to as many neighbouring windows
// of one length go to the model together (next_token_nll_batch), their progress reported after the
// call; 0: model.sequences_a_forward().
Perplexity windowed_perplexity(
    const LanguageModel& model, const std::vector<int32_t>& tokens, int64_t window, int64_t stride,
    int64_t max_windows = 0, std::vector<ActivationStats>* ffn_stats = nullptr,
    const std::function<void(int64_t done, int64_t windows, const Perplexity& so_far)>& on_window = {},
    const std::string& what = "the text", int64_t windows_per_call = 0);
// Adds one forward's per-layer FFN statistics to a running total (sized to them on the first).
void add_layer_stats(std::vector<ActivationStats>& total, const std::vector<ActivationStats>& part);
// Each layer's FFN activation statistics over `tokens` (at least one) in forwards of `window` tokens
// (≥ 1) that do not overlap, every token counted once (the last forward may hold fewer, one
// included), summed: next_token_nll_batch's forwards (on the GPU, no logits copied out; up to
// `windows_per_call` windows together, 0: model.sequences_a_forward()), their losses not looked at,
// so a model whose logits are not finite still gives its counts.
std::vector<ActivationStats> ffn_stats_in_windows(const LanguageModel& model, const std::vector<int32_t>& tokens,
                                                  int64_t window, int64_t windows_per_call = 0);
// −log p(tokens[t+1] | tokens[0..t]) for t < T − 1 from logits [T, V] (f32 or f64) computed for
// `tokens`: the row's maximum m, then m + log Σ exp(x − m) − x[next], in double.
std::vector<double> nll_from_logits(const TensorView& logits, const std::vector<int32_t>& tokens);

}  // namespace twell::model
