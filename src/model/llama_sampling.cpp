// Sampling from logits (greedy, temperature, top-k, top-p), generation with the KV cache, and
// perplexity (include/twell/model/llama.h). All probability maths in double.
//
// Sampling order, as HF's generate applies its warpers: temperature, then top-k (every token whose
// logit is at least the k-th largest, so ties at the cut are all kept, as HF keeps them), then
// top-p (nucleus: the smallest prefix of the tokens sorted by probability, descending, whose mass
// reaches top_p; always at least one token), then one draw from the renormalised distribution.
// Ties in sorting are broken by the lower token id, so results are deterministic. Only the nucleus
// is sorted (partially, growing): at a vocabulary of 49152 a full sort each token cost milliseconds,
// more than a decode step on the GPU. Without top-p the draw runs over the kept tokens in id order.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>

#include "twell/error.h"
#include "twell/model/llama.h"

namespace twell::model {

namespace {

// A [V] or [1, V] float row as doubles, its first `limit` entries where limit is in (0, V).
std::vector<double> logit_row(const TensorView& logits, int64_t limit) {
  TWELL_CHECK(logits.rank() == 1 || (logits.rank() == 2 && logits.shape[0] == 1),
              "sample: logits must be [V] or [1, V], got ", shape_str(logits.shape));
  TWELL_CHECK(logits.numel() > 0, "sample: empty logits");
  const int64_t n = limit > 0 && limit < logits.numel() ? limit : logits.numel();
  std::vector<double> row;
  if (logits.dtype == DType::f32) {  // every backend's logits: a plain loop, not an element call each
    const float* f = logits.ptr<float>();
    row.assign(f, f + n);
  } else {
    row = to_f64(logits);
    row.resize(static_cast<size_t>(n));
  }
  double top = -HUGE_VAL;
  bool finite = true;  // one pass: NaN and +inf are rare, and named below
  for (const double v : row) {
    finite &= !std::isnan(v) && v != HUGE_VAL;
    top = std::max(top, v);
  }
  if (!finite)
    for (size_t i = 0; i < row.size(); ++i)  // -inf (a token ruled out) is fine
      TWELL_REQUIRE(!std::isnan(row[i]) && row[i] != HUGE_VAL, "sample: logit ", i, " is ", row[i],
                    ": the model's activations are not finite (weights with NaN or Inf, or an overflow)");
  TWELL_REQUIRE(top > -HUGE_VAL, "sample: all ", row.size(), " logits are -inf: no token can be drawn");
  return row;
}

int32_t argmax(const std::vector<double>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace

void SamplingOptions::check() const {
  TWELL_REQUIRE(temperature >= 0 && std::isfinite(temperature), "sampling: temperature must be finite and >= 0, got ",
                temperature);
  TWELL_REQUIRE(vocab_limit >= 0, "sampling: vocab_limit must be >= 0, got ", vocab_limit);
  TWELL_REQUIRE(top_k >= 0, "sampling: top_k must be >= 0, got ", top_k);
  TWELL_REQUIRE(top_p > 0 && top_p <= 1, "sampling: top_p must be in (0, 1], got ", top_p);
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) { options.check(); }

double Sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(const TensorView& logits) {
  const std::vector<double> row = logit_row(logits, options_.vocab_limit);
  if (options_.temperature == 0) return argmax(row);
  const size_t V = row.size();
  // The candidates' order: logit descending, ties by the lower id.
  const auto before = [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };

  // top-k: every token whose logit is at least the k-th largest (ties at the cut kept), in id order.
  std::vector<int32_t> kept;
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < V) {
    std::vector<double> values = row;
    const auto kth = values.begin() + (options_.top_k - 1);
    std::nth_element(values.begin(), kth, values.end(), std::greater<double>());
    for (size_t i = 0; i < V; ++i)
      if (row[i] >= *kth) kept.push_back(static_cast<int32_t>(i));
  } else {
    kept.resize(V);
    std::iota(kept.begin(), kept.end(), 0);
  }

  // Softmax of logit / temperature over the kept tokens, in id order. A temperature so small that the
  // top logit over it overflows is greedy (the draw below would otherwise see NaN).
  const int32_t best = argmax(row);
  const double top = row[best] / options_.temperature;
  if (!std::isfinite(top)) return best;
  std::vector<double> w(kept.size());
  double total = 0;
  for (size_t i = 0; i < kept.size(); ++i) total += w[i] = std::exp(row[kept[i]] / options_.temperature - top);

  // top-p: the shortest prefix of the kept tokens in the candidates' order whose probability reaches
  // top_p (at least one token). Only that prefix is sorted: the first m, m growing until it holds it.
  size_t n = kept.size();
  std::vector<int32_t> order;  // the draw's order: the nucleus sorted, or every kept token by id
  if (options_.top_p < 1) {
    std::vector<size_t> slot(kept.size());  // into kept and w
    std::iota(slot.begin(), slot.end(), size_t{0});
    const auto slot_before = [&](size_t a, size_t b) { return before(kept[a], kept[b]); };
    for (size_t m = std::min<size_t>(64, slot.size());; m = std::min(slot.size(), 4 * m)) {
      std::partial_sort(slot.begin(), slot.begin() + m, slot.end(), slot_before);
      double mass = 0;
      n = 0;
      while (n < m && mass < options_.top_p) mass += w[slot[n++]] / total;
      if (mass >= options_.top_p || m == slot.size()) break;
    }
    n = std::max<size_t>(n, 1);
    order.resize(n);
    std::vector<double> nucleus(n);
    for (size_t i = 0; i < n; ++i) {
      order[i] = kept[slot[i]];
      nucleus[i] = w[slot[i]];
    }
    w = std::move(nucleus);
    total = 0;
    for (const double x : w) total += x;
  } else {
    order = std::move(kept);
  }

  const double r = uniform() * total;
  double cumulative = 0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += w[i];
    if (r < cumulative) return order[i];
  }
  return order[n - 1];  // r within rounding of the total
}

Generation generate(LanguageModel& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                    const SamplingOptions& sampling, const std::vector<int32_t>& stop_tokens,
                    const std::function<void(int32_t)>& on_token) {
  TWELL_CHECK(!prompt.empty(), "generate: empty prompt");
  TWELL_CHECK(max_new_tokens >= 0, "generate: max_new_tokens must be at least 0, got ", max_new_tokens);
  using clock = std::chrono::steady_clock;
  Sampler sampler(sampling);
  Generation g;
  const auto t0 = clock::now();
  Tensor logits = model.prefill(prompt);
  const auto t1 = clock::now();
  while (static_cast<int64_t>(g.tokens.size()) < max_new_tokens) {
    const int32_t token = sampler.sample(logits);
    g.tokens.push_back(token);
    if (on_token) on_token(token);
    if (std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end()) {
      g.reason = StopReason::stop_token;
      break;
    }
    if (static_cast<int64_t>(g.tokens.size()) == max_new_tokens) break;
    if (model.cached_tokens() >= model.context()) {
      g.reason = StopReason::context_full;
      break;
    }
    logits = model.decode_step(token);
  }
  const auto t2 = clock::now();
  g.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  g.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  return g;
}

Perplexity perplexity(const LanguageModel& model, const std::vector<int32_t>& tokens,
                      std::vector<ActivationStats>* ffn_stats) {
  TWELL_CHECK(tokens.size() >= 2, "perplexity: need at least 2 tokens, got ", tokens.size());
  return perplexity_from_logits(model.logits(tokens, ffn_stats), tokens);
}

Perplexity perplexity_from_logits(const TensorView& logits, const std::vector<int32_t>& tokens) {
  TWELL_CHECK(tokens.size() >= 2, "perplexity: need at least 2 tokens, got ", tokens.size());
  const int64_t T = static_cast<int64_t>(tokens.size());
  TWELL_CHECK(logits.rank() == 2 && logits.shape[0] == T, "perplexity: logits ", shape_str(logits.shape),
              " do not hold one row per token (", T, ")");
  check_device(logits, Device::cpu, "perplexity: logits");
  check_contiguous(logits, "perplexity: logits");
  const int64_t V = logits.shape[1];
  const size_t row_bytes = static_cast<size_t>(V) * dtype_size(logits.dtype);
  double nll_sum = 0;
  for (int64_t t = 0; t + 1 < T; ++t) {  // a row at a time: [T, V] in double would be 8·T·V bytes
    const std::vector<double> values =
        to_f64(TensorView(static_cast<char*>(logits.data) + static_cast<size_t>(t) * row_bytes, logits.dtype, {V}));
    const double* row = values.data();
    const double top = *std::max_element(row, row + V);
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - top);
    TWELL_CHECK(tokens[t + 1] >= 0 && tokens[t + 1] < V, "perplexity: token ", tokens[t + 1], " outside [0, ", V, ")");
    nll_sum += (top + std::log(sum)) - row[tokens[t + 1]];  // −log softmax(row)[next]
  }
  Perplexity p;
  p.predictions = T - 1;
  p.mean_nll = nll_sum / static_cast<double>(p.predictions);
  p.perplexity = std::exp(p.mean_nll);
  return p;
}

}  // namespace twell::model
