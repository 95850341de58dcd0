// The Llama forward pass on the CPU reference backend (include/twell/model/llama.h): embedding,
// RMSNorm, RoPE, causal GQA attention with a KV cache, gated FFN (ReLU via twell::cpu::ffn_forward,
// SiLU dense here), final norm and LM head.
//
// Arithmetic: everything in Acc (float, or double for DType::f64), with the fixed-order dot
// product of the CPU FFN (src/cpu/ffn_common.h, no FMA contraction), so the full forward and
// the KV-cache path compute every row identically and results do not depend on thread count.
// Where HF's fp32 model computes something in a particular way, we do the same:
//   RMSNorm   y = w · (x · 1/√(mean(x²) + eps))                     (LlamaRMSNorm)
//   RoPE      f_i = 1/θ^(2i/hd), angle p·f_i, cos, sin: all in Acc (fp32, as HF's fp32 model)
//   softmax   max-subtracted, in Acc, over the causal prefix only
// Parallel (src/cpu/parallel.h) over output features of each projection and over
// (token, head) pairs in attention; each output element is computed by one call in fixed order.
// clang-format off
#include "cpu/fp_contract_off.h"  // must come first, see there
// clang-format on

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/ffn_common.h"
#include "cpu/parallel.h"
#include "twell/cpu/ffn.h"
#include "twell/error.h"
#include "twell/model/llama.h"

namespace twell::model {

namespace {

using cpu::parallel_for;

// Per layer: post-RoPE keys and values of every cached position, [len, nkv·hd] row-major.
template <class Acc>
struct KvCache {
  using value_type = Acc;
  std::vector<std::vector<Acc>> k, v;
  int64_t len = 0;

  void clear(int64_t layers) {
    k.assign(static_cast<size_t>(layers), {});
    v.assign(static_cast<size_t>(layers), {});
    len = 0;
  }
  // Keeps the first `positions` (at most those held) of every layer's rows, kv_dim values each.
  void cut(int64_t positions, int64_t kv_dim) {
    const size_t keep = static_cast<size_t>(positions * kv_dim);
    for (auto& rows : k) rows.resize(std::min(rows.size(), keep));
    for (auto& rows : v) rows.resize(std::min(rows.size(), keep));
    len = positions;
  }
};

// Calls fn(const W* rows) with W the weight's storage type (float or bf16 bits).
template <class Fn>
void with_rows(const TensorView& w, Fn&& fn) {
  switch (w.dtype) {
    case DType::f32:
      fn(static_cast<const float*>(w.data));
      return;
    case DType::bf16:
      fn(static_cast<const uint16_t*>(w.data));
      return;
    default:
      TWELL_FAIL("llama: weights must be f32 or bf16, got ", dtype_name(w.dtype));
  }
}

template <class Acc>
Acc widen_one(const TensorView& w, int64_t i) {
  return w.dtype == DType::f32
             ? static_cast<Acc>(static_cast<const float*>(w.data)[i])
             : static_cast<Acc>(bf16_bits_to_float(static_cast<const uint16_t*>(w.data)[i]));
}

// out[t, n] = in[t, :] · w[n, :]        in [T, K], w [N, K], out [T, N]
template <class Acc>
void linear(const std::vector<Acc>& in, int64_t T, const TensorView& w, std::vector<Acc>& out) {
  const int64_t N = w.shape[0], K = w.shape[1];
  out.assign(static_cast<size_t>(T * N), Acc(0));
  with_rows(w, [&](const auto* rows) {
    parallel_for(
        N,
        [&](int64_t n0, int64_t n1) {
          for (int64_t n = n0; n < n1; ++n)
            for (int64_t t = 0; t < T; ++t)
              out[t * N + n] = cpu::detail::dot(in.data() + t * K, rows + n * K, K);
        },
        T * K);
  });
}

// out[t] = w · (x[t] / √(mean(x[t]²) + eps))        x, out [T, H]
template <class Acc>
void rmsnorm(const std::vector<Acc>& x, int64_t T, const TensorView& w, double eps,
             std::vector<Acc>& out) {
  const int64_t H = w.shape[0];
  out.resize(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    const Acc* xt = x.data() + t * H;
    Acc sum_sq = 0;
    for (int64_t i = 0; i < H; ++i) sum_sq += xt[i] * xt[i];
    const Acc inv = Acc(1) / std::sqrt(sum_sq / static_cast<Acc>(H) + static_cast<Acc>(eps));
    for (int64_t i = 0; i < H; ++i) out[t * H + i] = widen_one<Acc>(w, i) * (xt[i] * inv);
  }
}

// cos and sin of position p for the hd/2 frequencies, as HF computes them: inverse frequencies
// and angles in fp32 for an fp32 model (in double for the f64 oracle).
template <class Acc>
void rope_table(int64_t p, const io::ModelConfig& c, std::vector<Acc>& cos_p, std::vector<Acc>& sin_p) {
  const int64_t half = c.head_dim / 2;
  cos_p.resize(static_cast<size_t>(half));
  sin_p.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const Acc angle = c.rope_inv_freq<Acc>(i) * static_cast<Acc>(p);
    cos_p[i] = std::cos(angle);
    sin_p[i] = std::sin(angle);
  }
}

// Rotates every head of one row in place ("rotate_half": pairs (i, i + hd/2)).
template <class Acc>
void apply_rope(Acc* row, int64_t heads, int64_t hd, const std::vector<Acc>& cos_p,
                const std::vector<Acc>& sin_p) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    Acc* q = row + h * hd;
    for (int64_t i = 0; i < half; ++i) {
      const Acc a = q[i], b = q[i + half];
      q[i] = a * cos_p[i] - b * sin_p[i];
      q[i + half] = b * cos_p[i] + a * sin_p[i];
    }
  }
}

// Causal attention of T new queries at positions p0..p0+T-1 over the cache (which already holds
// them). q [T, nh·hd], keys/values [p0+T, nkv·hd], out [T, nh·hd].
template <class Acc>
void attention(const std::vector<Acc>& q, int64_t T, int64_t p0, const std::vector<Acc>& keys,
               const std::vector<Acc>& values, const io::ModelConfig& c, std::vector<Acc>& out) {
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t group = nh / nkv, q_dim = nh * hd, kv_dim = nkv * hd;
  const Acc scale = Acc(1) / std::sqrt(static_cast<Acc>(hd));
  out.assign(static_cast<size_t>(T * q_dim), Acc(0));
  parallel_for(
      T * nh,
      [&](int64_t i0, int64_t i1) {
        std::vector<Acc> scores;
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t t = i / nh, h = i % nh, kvh = h / group, len = p0 + t + 1;
          const Acc* qt = q.data() + t * q_dim + h * hd;
          scores.resize(static_cast<size_t>(len));
          Acc max_score = -INFINITY;
          for (int64_t s = 0; s < len; ++s) {
            scores[s] = cpu::detail::dot(qt, keys.data() + s * kv_dim + kvh * hd, hd) * scale;
            max_score = std::max(max_score, scores[s]);
          }
          Acc sum = 0;
          for (int64_t s = 0; s < len; ++s) {
            scores[s] = std::exp(scores[s] - max_score);
            sum += scores[s];
          }
          Acc* ot = out.data() + t * q_dim + h * hd;
          for (int64_t s = 0; s < len; ++s)
            cpu::detail::axpy(ot, scores[s] / sum, values.data() + s * kv_dim + kvh * hd, hd);
        }
      },
      (p0 + T) * hd * 2);
}

// y = (silu(x Wgᵀ) ⊙ x Wuᵀ) Wd        x, y [T, H]; Wg, Wu, Wd [I, H] (Wd neuron-major)
template <class Acc>
void silu_ffn(const std::vector<Acc>& x, int64_t T, const LlamaLayerWeights& l,
              std::vector<Acc>& y) {
  const int64_t I = l.wu.shape()[0], H = l.wu.shape()[1];
  y.assign(static_cast<size_t>(T * H), Acc(0));
  with_rows(l.wg.view(), [&](const auto* wg) {
    using W = std::remove_cv_t<std::remove_pointer_t<decltype(wg)>>;
    const W* wu = static_cast<const W*>(l.wu.view().data);
    const W* wd = static_cast<const W*>(l.wd.view().data);
    parallel_for(
        T,
        [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            const Acc* xt = x.data() + t * H;
            for (int64_t j = 0; j < I; ++j) {
              const Acc g = cpu::detail::dot(xt, wg + j * H, H);
              const Acc u = cpu::detail::dot(xt, wu + j * H, H);
              const Acc h = g / (Acc(1) + std::exp(-g)) * u;
              cpu::detail::axpy(y.data() + t * H, h, wd + j * H, H);
            }
          }
        },
        3 * I * H);
  });
}

// y = ffn(x) of one layer, both [T, H].
// `stats`, if given, receives the statistics of h (ReLU models only).
template <class Acc>
void ffn(std::vector<Acc>& x, int64_t T, const LlamaLayerWeights& l, const LlamaWeights& w,
         const LlamaOptions& o, std::vector<Acc>& y, ActivationStats* stats) {
  if (w.config.hidden_act == "silu") {
    silu_ffn(x, T, l, y);
    return;
  }
  const int64_t H = w.config.hidden_size;
  y.assign(static_cast<size_t>(T * H), Acc(0));
  const DType dt = dtype_of<Acc>::value;
  const Precision p = std::is_same_v<Acc, double> ? Precision::f64 : o.relu_ffn;
  cpu::ffn_forward(TensorView(x.data(), dt, {T, H}), l.ffn(), TensorView(y.data(), dt, {T, H}), p, stats);
}

// Throws unless `tokens` (non-empty, in the vocabulary) fit at positions p0.. of the context.
void check_call(const io::ModelConfig& c, const std::vector<int32_t>& tokens, int64_t p0) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  TWELL_REQUIRE(T > 0, "llama: no tokens to run");
  TWELL_REQUIRE(p0 + T <= c.max_position_embeddings, "llama: ", p0 + T,
              " positions exceed max_position_embeddings ", c.max_position_embeddings);
  check_token_ids(c, tokens);
}

// Runs `tokens` at positions cache.len.. through the model, appending to the cache.
// Returns the logits of every token [T, V] (all_rows) or of the last one [1, V].
template <class Acc>
std::vector<Acc> forward(const LlamaWeights& w, const LlamaOptions& o, KvCache<Acc>& cache,
                         const std::vector<int32_t>& tokens, bool all_rows,
                         std::vector<ActivationStats>* ffn_stats = nullptr) {
  const io::ModelConfig& c = w.config;
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c.hidden_size;
  const int64_t p0 = cache.len, hd = c.head_dim;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, kv_dim = nkv * hd;
  check_call(c, tokens, p0);

  // x = embed[tokens]                                                  [T, H]
  std::vector<Acc> x(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i)
      x[t * H + i] = widen_one<Acc>(w.embed, int64_t{tokens[t]} * H + i);

  std::vector<std::vector<Acc>> cos_t(T), sin_t(T);
  for (int64_t t = 0; t < T; ++t) rope_table(p0 + t, c, cos_t[t], sin_t[t]);

  std::vector<Acc> a, q, k, v, attn, o_proj, y;
  if (ffn_stats) ffn_stats->assign(static_cast<size_t>(c.num_hidden_layers), ActivationStats{});
  // A call that throws part way (out of memory, say) leaves the cache as it found it: the layers it
  // reached would otherwise hold T keys more than len says, and every later step would attend wrongly.
  struct Rollback {
    KvCache<Acc>& cache;
    int64_t p0, kv_dim;
    bool done = false;
    ~Rollback() {
      if (!done) cache.cut(p0, kv_dim);
    }
  } rollback{cache, p0, kv_dim};
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const LlamaLayerWeights& l = w.layers[li];
    rmsnorm(x, T, l.input_norm, c.rms_norm_eps, a);
    linear(a, T, l.wq, q);  // [T, nh·hd]
    linear(a, T, l.wk, k);  // [T, nkv·hd]
    linear(a, T, l.wv, v);  // [T, nkv·hd]
    for (int64_t t = 0; t < T; ++t) {
      apply_rope(q.data() + t * nh * hd, nh, hd, cos_t[t], sin_t[t]);
      apply_rope(k.data() + t * kv_dim, nkv, hd, cos_t[t], sin_t[t]);
    }
    cache.k[li].insert(cache.k[li].end(), k.begin(), k.end());
    cache.v[li].insert(cache.v[li].end(), v.begin(), v.end());
    attention(q, T, p0, cache.k[li], cache.v[li], c, attn);  // [T, nh·hd]
    linear(attn, T, l.wo, o_proj);                           // [T, H]
    for (size_t i = 0; i < x.size(); ++i) x[i] += o_proj[i];

    rmsnorm(x, T, l.post_norm, c.rms_norm_eps, a);
    ffn(a, T, l, w, o, y, ffn_stats ? &(*ffn_stats)[static_cast<size_t>(li)] : nullptr);
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }

  // Final norm and LM head, on every row or only the last.
  const int64_t rows = all_rows ? T : 1;
  std::vector<Acc> last(x.end() - rows * H, x.end());
  rmsnorm(last, rows, w.final_norm, c.rms_norm_eps, a);
  std::vector<Acc> logits;
  linear(a, rows, w.head(), logits);  // [rows, V]
  cache.len += T;  // only now: everything that can throw has run
  rollback.done = true;
  return logits;
}

template <class Acc>
Tensor to_tensor(const std::vector<Acc>& v, Shape shape) {
  Tensor t(dtype_of<Acc>::value, std::move(shape));
  std::copy(v.begin(), v.end(), t.ptr<Acc>());
  return t;
}

}  // namespace

void check_token_ids(const io::ModelConfig& c, const std::vector<int32_t>& tokens, bool no_token_ok,
                     const std::string& where) {
  for (size_t t = 0; t < tokens.size(); ++t)
    TWELL_REQUIRE((tokens[t] >= 0 && tokens[t] < c.vocab_size) || (no_token_ok && tokens[t] == kNoToken), where,
                ": token ", tokens[t], " at index ", t, " is outside the vocabulary [0, ", c.vocab_size, ")");
}

void check_sequences(const io::ModelConfig& c, const std::vector<std::vector<int32_t>>& sequences, int64_t least,
                     const char* what, int64_t context) {
  for (size_t b = 0; b < sequences.size(); ++b) {
    const int64_t n = static_cast<int64_t>(sequences[b].size());
    TWELL_REQUIRE(n >= least, what, " ", b, " needs at least ", least, " token", least == 1 ? "" : "s", ", got ", n);
    check_token_ids(c, sequences[b], false, str(what, " ", b));
  }
  for (size_t b = 0; b < sequences.size() && context > 0; ++b)
    TWELL_REQUIRE(static_cast<int64_t>(sequences[b].size()) <= context, what, " ", b, " of ", sequences[b].size(),
                  " tokens exceeds the model's context of ", context, " positions");
}

// One KV cache a sequence of the batch (one after prefill), in the math type's precision.
struct LlamaCpu::Impl {
  std::vector<KvCache<float>> f32;
  std::vector<KvCache<double>> f64;

  // fn(caches) with the caches of the model's math type.
  template <class Fn>
  auto with(DType math, Fn&& fn) {
    return math == DType::f64 ? fn(f64) : fn(f32);
  }
  template <class Fn>
  auto with(DType math, Fn&& fn) const {
    return math == DType::f64 ? fn(f64) : fn(f32);
  }
};

LlamaCpu::LlamaCpu(LlamaWeights weights, LlamaOptions options)
    : weights_(std::move(weights)), options_(options), impl_(std::make_unique<Impl>()) {
  TWELL_REQUIRE(options_.math == DType::f32 || options_.math == DType::f64,
              "LlamaCpu: math must be f32 or f64, got ", dtype_name(options_.math));
  weights_.validate();
  reset();
}

LlamaCpu::~LlamaCpu() = default;
LlamaCpu::LlamaCpu(LlamaCpu&&) noexcept = default;
LlamaCpu& LlamaCpu::operator=(LlamaCpu&&) noexcept = default;

Tensor LlamaCpu::logits(const std::vector<int32_t>& tokens, std::vector<ActivationStats>* ffn_stats) const {
  const int64_t T = static_cast<int64_t>(tokens.size()), V = config().vocab_size;
  if (options_.math == DType::f64) {
    KvCache<double> cache;
    cache.clear(config().num_hidden_layers);
    return to_tensor(forward(weights_, options_, cache, tokens, true, ffn_stats), {T, V});
  }
  KvCache<float> cache;
  cache.clear(config().num_hidden_layers);
  return to_tensor(forward(weights_, options_, cache, tokens, true, ffn_stats), {T, V});
}

Tensor LlamaCpu::prefill(const std::vector<int32_t>& tokens) {
  const Tensor rows = prefill_batch({tokens});
  return Tensor::copy_of(TensorView(rows.view().data, rows.dtype(), {config().vocab_size}));
}

Tensor LlamaCpu::decode_step(int32_t token) {
  TWELL_REQUIRE(cached_tokens() > 0, "LlamaCpu::decode_step: call prefill() first");
  TWELL_REQUIRE(cached_lengths().size() == 1, "LlamaCpu::decode_step: the cache holds ", cached_lengths().size(),
                " sequences (prefill_batch): decode_batch takes a token of each");
  TWELL_REQUIRE(token != kNoToken, "LlamaCpu::decode_step: token ", token, " is outside the vocabulary");
  const Tensor rows = decode_batch({token});
  return Tensor::copy_of(TensorView(rows.view().data, rows.dtype(), {config().vocab_size}));
}

Tensor LlamaCpu::prefill_batch(const std::vector<std::vector<int32_t>>& prompts) {
  const int64_t B = static_cast<int64_t>(prompts.size()), V = config().vocab_size;
  TWELL_REQUIRE(B >= 1 && B <= kMaxBatch, "LlamaCpu::prefill_batch: need 1 to ", kMaxBatch, " prompts, got ", B);
  for (const auto& p : prompts) check_call(config(), p, 0);  // before reset(): a rejected call changes nothing
  reset();  // cache_written()
  Tensor out(options_.math, {B, V});
  try {
    impl_->with(options_.math, [&](auto& caches) {
      using Acc = typename std::decay_t<decltype(caches)>::value_type::value_type;
      caches.resize(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) {
        caches[b].clear(config().num_hidden_layers);
        const std::vector<Acc> row = forward(weights_, options_, caches[b], prompts[b], false);
        std::copy(row.begin(), row.end(), out.ptr<Acc>() + b * V);
      }
    });
  } catch (...) {
    reset();  // a batch prefilled in part is no batch
    throw;
  }
  return out;
}

Tensor LlamaCpu::decode_batch(const std::vector<int32_t>& tokens) {
  const int64_t B = static_cast<int64_t>(tokens.size()), V = config().vocab_size;
  const std::vector<int64_t> lens = cached_lengths();
  TWELL_REQUIRE(!lens.empty(), "LlamaCpu::decode_batch: call prefill() or prefill_batch() first");
  TWELL_REQUIRE(B == static_cast<int64_t>(lens.size()), "LlamaCpu::decode_batch: the cache holds ", lens.size(),
              " sequences, got ", B, " tokens");
  check_token_ids(config(), tokens, true);  // all checked before any sequence runs
  for (int64_t b = 0; b < B; ++b)
    if (tokens[b] != kNoToken) check_call(config(), {tokens[b]}, lens[b]);
  cache_written();
  Tensor out(options_.math, {B, V});
  try {
    impl_->with(options_.math, [&](auto& caches) {
      using Acc = typename std::decay_t<decltype(caches)>::value_type::value_type;
      for (int64_t b = 0; b < B; ++b) {
        if (tokens[b] == kNoToken) continue;
        const std::vector<Acc> row = forward(weights_, options_, caches[b], {tokens[b]}, false);
        std::copy(row.begin(), row.end(), out.ptr<Acc>() + b * V);
      }
    });
  } catch (...) {
    reset();  // out of memory part way: some sequences would be a token ahead of the others
    throw;
  }
  return out;
}

Tensor LlamaCpu::prefill_from(int64_t keep, const std::vector<int32_t>& tokens) {
  if (keep == 0) return prefill(tokens);
  const std::vector<int64_t> lens = cached_lengths();
  TWELL_REQUIRE(lens.size() == 1, "LlamaCpu::prefill_from: the cache holds ", lens.size(),
                " sequences; a prefix is kept of one (after prefill or generate)");
  TWELL_REQUIRE(keep >= 0 && keep <= lens[0], "LlamaCpu::prefill_from: keep ", keep, " is outside the ", lens[0],
                " cached positions");
  check_call(config(), tokens, keep);
  cache_written();
  const int64_t V = config().vocab_size;
  Tensor out(options_.math, {V});
  try {
    impl_->with(options_.math, [&](auto& caches) {
      using Acc = typename std::decay_t<decltype(caches)>::value_type::value_type;
      KvCache<Acc>& cache = caches[0];
      cache.cut(keep, config().num_key_value_heads * config().head_dim);
      const std::vector<Acc> row = forward(weights_, options_, cache, tokens, false);
      std::copy(row.begin(), row.end(), out.ptr<Acc>());
    });
  } catch (...) {
    reset();
    throw;
  }
  return out;
}

std::vector<int64_t> LlamaCpu::cached_lengths() const {
  return impl_->with(options_.math, [](const auto& caches) {
    std::vector<int64_t> lens;
    for (const auto& c : caches) lens.push_back(c.len);
    return lens;
  });
}

int64_t LlamaCpu::cached_tokens() const {
  const std::vector<int64_t> lens = cached_lengths();
  return lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
}

void LlamaCpu::reset() {
  cache_written();
  impl_->f32.clear();
  impl_->f64.clear();
}

}  // namespace twell::model
