// Sampling from logits (repetition penalty, greedy, temperature, top-k, top-p, min-p), generation with
// the KV cache, and perplexity (include/twell/model/llama.h). All probability maths in double.
//
// Sampling order, as HF's generate applies its processors and warpers: the repetition penalty (on the
// logits, in f32; greedy too), temperature, then top-k (every token whose
// logit is at least the k-th largest, so ties at the cut are all kept, as HF keeps them), then
// top-p (nucleus: the smallest prefix of the tokens sorted by probability, descending, whose mass
// reaches top_p; always at least one token), then min-p (the tokens left whose probability is at least
// min_p times the greatest), then one draw from the renormalised distribution.
// Ties in sorting are broken by the lower token id, so results are deterministic. Nothing is sorted
// whole: at a vocabulary of 49152 a full sort each token took milliseconds, more than a decode step
// on the GPU. top-k takes a selection, top-p buckets the candidates by logit and sorts only the
// bucket where the nucleus ends; the draw then runs over the kept tokens in id order.
#include "cpu/fp_contract_off.h"  // must come first, see there: the top logit's weight must be exactly 1

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <optional>

#include "cpu/parallel.h"
#include "twell/error.h"
#include "twell/model/llama.h"

namespace twell::model {

namespace {

void check_logits_shape(const TensorView& logits) {
  TWELL_REQUIRE(logits.rank() == 1 || (logits.rank() == 2 && logits.shape[0] == 1),
              "sample: logits must be [V] or [1, V], got ", shape_str(logits.shape));
  TWELL_REQUIRE(logits.numel() > 0, "sample: empty logits");
  check_dtype(logits, {DType::f32, DType::f64}, "sample: logits");
}

// The error for a row whose entries are not all finite or -inf (a token ruled out), or all -inf.
template <class T>
[[noreturn]] void check_row(const T* row, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (std::isnan(row[i]) || (std::isinf(row[i]) && row[i] > 0))
      throw_unsampleable(static_cast<int64_t>(i), static_cast<double>(row[i]), static_cast<int64_t>(n));
  throw_unsampleable(-1, 0, static_cast<int64_t>(n));
}

// Host, contiguous f32: the logits every backend returns, read in a plain loop.
bool plain_f32(const TensorView& t) { return t.dtype == DType::f32 && t.device == Device::cpu && t.is_contiguous(); }

// The drawable entries (o.drawable) of a [V] or [1, V] float row, as doubles, into `row`; `best`
// receives the index of the largest (the lowest on ties).
void logit_row(const TensorView& logits, const SamplingOptions& o, std::vector<double>& row, size_t* best = nullptr) {
  check_logits_shape(logits);
  check_device(logits, Device::cpu, "sample: logits");
  const int64_t n = o.drawable(logits.numel());
  if (plain_f32(logits)) {
    const float* f = logits.ptr<float>();
    row.assign(f, f + n);
  } else {
    row = to_f64(logits);
    row.resize(static_cast<size_t>(n));
  }
  bool bad = false;  // NaN or +inf; and the largest must be more than -inf
  double top = -HUGE_VAL;
  size_t at = 0;
  for (size_t i = 0; i < row.size(); ++i) {
    bad |= !(row[i] < HUGE_VAL);
    if (row[i] > top) top = row[i], at = i;
  }
  if (bad || top == -HUGE_VAL) check_row(row.data(), row.size());
  if (best) *best = at;
}

// The index of the largest drawable logit, the lowest on ties: greedy decoding's whole cost, one
// pass over host f32 logits.
int32_t argmax_logits(const TensorView& logits, const SamplingOptions& o) {
  if (!plain_f32(logits)) {
    size_t best = 0;
    std::vector<double> row;
    logit_row(logits, o, row, &best);
    return static_cast<int32_t>(best);
  }
  check_logits_shape(logits);
  const size_t n = static_cast<size_t>(o.drawable(logits.numel()));
  const float* f = logits.ptr<float>();
  bool bad = false;
  float top = -HUGE_VALF;
  size_t best = 0;
  for (size_t i = 0; i < n; ++i) {
    bad |= !(f[i] < HUGE_VALF);
    if (f[i] > top) top = f[i], best = i;
  }
  if (bad || top == -HUGE_VALF) check_row(f, n);
  return static_cast<int32_t>(best);
}

struct Candidate {
  double logit, w;  // w: exp(logit / temperature − max / temperature)
  int32_t id;
};

// The candidates' order: logit descending, ties by the lower id.
bool before(const Candidate& a, const Candidate& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); }

// A sampling call's buffers, kept by each thread from one call to the next: at 49152 ids a fresh
// megabyte each token cost page faults as well as the pass.
struct Scratch {
  std::vector<double> row, values;
  std::vector<Candidate> c, sub;
  std::vector<double> mass;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The last member, in the candidates' order, of the shortest prefix in that order of c (id order)
// whose weight reaches target; the last of all where rounding keeps the sum below it. Found without
// sorting: the candidates are bucketed by logit (a bucket's logits all above the next one's), the
// buckets' masses walked down to the one where the prefix ends, and only that bucket's candidates
// taken further, until few enough remain to sort.
Candidate nucleus_last(const std::vector<Candidate>& c, double target, Scratch& s) {
  constexpr size_t kBuckets = 2048;
  const Candidate* span = c.data();
  size_t n = c.size();
  double acc = 0;  // the weight of every candidate before the span
  bool stalled = false;  // a bucketing kept them all: cannot happen, sorted all the same
  for (;;) {
    double lo = HUGE_VAL, hi = -HUGE_VAL;
    for (size_t i = 0; i < n; ++i) lo = std::min(lo, span[i].logit), hi = std::max(hi, span[i].logit);
    const double scale = (kBuckets - 1) / (hi - lo);
    // Few enough to sort, all tied (in id order already: the span keeps c's order), or a spread no
    // bucket width can take (f64 logits beyond ±1e307, or within a few denormals).
    if (stalled || n <= 64 || lo == hi || !std::isfinite(hi - lo) || !std::isfinite(scale)) {
      if (span == s.sub.data())
        s.sub.resize(n);
      else
        s.sub.assign(span, span + n);
      if (lo != hi) std::sort(s.sub.begin(), s.sub.end(), before);
      for (const Candidate& x : s.sub)
        if ((acc += x.w) >= target) return x;
      return s.sub.back();
    }
    const auto bucket = [&](const Candidate& x) {
      return std::min(kBuckets - 1, static_cast<size_t>((hi - x.logit) * scale));
    };
    s.mass.assign(kBuckets, 0.0);
    for (size_t i = 0; i < n; ++i) s.mass[bucket(span[i])] += span[i].w;
    size_t cut = 0, last_filled = 0;
    for (; cut < kBuckets; ++cut) {
      if (s.mass[cut] == 0) continue;
      last_filled = cut;
      if (acc + s.mass[cut] >= target) break;
      acc += s.mass[cut];
    }
    if (cut == kBuckets) {  // rounding: the prefix ends in the last bucket that holds weight
      cut = last_filled;
      acc -= s.mass[cut];
    }
    // That bucket's candidates, in their order (in place once they are in sub: writes trail reads).
    size_t kept = 0;
    if (span != s.sub.data()) s.sub.resize(n);
    for (size_t i = 0; i < n; ++i)
      if (bucket(span[i]) == cut) s.sub[kept++] = span[i];
    span = s.sub.data();
    stalled = kept == n;  // the largest logit is in bucket 0 and the smallest in the last: fewer
    n = kept;
  }
}

// What a draw takes: the candidates in id order (after top-k) with their weights, and where top-p
// applies, the last of the nucleus in the candidates' order: those not after it are kept.
struct Kept {
  const std::vector<Candidate>* c = nullptr;
  std::optional<Candidate> last;
  std::optional<int32_t> only;  // a temperature so small that the top logit over it overflows: greedy
  double min_w = 0;             // min-p: the least weight kept (the top token's weight is 1)

  bool keeps(const Candidate& x) const { return (!last || !before(*last, x)) && x.w >= min_w; }
};

Kept kept_tokens(const TensorView& logits, const SamplingOptions& o, Scratch& s) {
  size_t best = 0;
  logit_row(logits, o, s.row, &best);
  const std::vector<double>& row = s.row;
  const size_t V = row.size();
  Kept k;
  const double inv_t = 1.0 / o.temperature, top = row[best] * inv_t;
  if (!std::isfinite(top) || !std::isfinite(inv_t)) {  // the weights would be NaN
    k.only = static_cast<int32_t>(best);
    return k;
  }
  // top-k: every token whose logit is at least the k-th largest (ties at the cut kept).
  double floor = -HUGE_VAL;
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < V) {
    s.values = row;
    const auto kth = s.values.begin() + (o.top_k - 1);
    std::nth_element(s.values.begin(), kth, s.values.end(), std::greater<double>());
    floor = *kth;
  }
  // Softmax weights of logit / temperature, in id order; a ruled-out token (−inf) is not a candidate.
  s.c.clear();
  s.c.reserve(V);
  double total = 0;
  for (size_t i = 0; i < V; ++i)
    if (row[i] >= floor && row[i] > -HUGE_VAL) {
      s.c.push_back(Candidate{row[i], std::exp(row[i] * inv_t - top), static_cast<int32_t>(i)});
      total += s.c.back().w;
    }
  k.c = &s.c;
  // top-p: the shortest prefix in the candidates' order whose probability reaches top_p. Its last
  // member bounds it, so the draw reads the kept tokens in id order, whatever order finding it took.
  if (o.top_p < 1) k.last = nucleus_last(s.c, o.top_p * total, s);
  k.min_w = o.min_p;  // weights are relative to the top token's, exp(0) = 1: never above it
  return k;
}

}  // namespace

void throw_unsampleable(int64_t index, double value, int64_t n) {
  if (index >= 0)
    throw Error(str("sample: logit ", index, " is ", value,
                    ": the model's activations are not finite (weights with NaN or Inf, or an overflow)"));
  throw Error(str("sample: all ", n, " logits are -inf: no token can be drawn"));
}

void SamplingOptions::check() const {
  TWELL_REQUIRE(temperature >= 0 && std::isfinite(temperature), "sampling: temperature must be finite and >= 0, got ",
                temperature);
  TWELL_REQUIRE(vocab_limit >= 0, "sampling: vocab_limit must be >= 0, got ", vocab_limit);
  TWELL_REQUIRE(top_k >= 0, "sampling: top_k must be >= 0, got ", top_k);
  TWELL_REQUIRE(top_p > 0 && top_p <= 1, "sampling: top_p must be in (0, 1], got ", top_p);
  TWELL_REQUIRE(min_p >= 0 && min_p <= 1, "sampling: min_p must be in [0, 1], got ", min_p);
  // Applied in f32, as transformers does: a value that f32 makes 0, subnormal or inf is refused too.
  TWELL_REQUIRE(repetition_penalty > 0 && std::isfinite(repetition_penalty) &&
                    std::isnormal(static_cast<float>(repetition_penalty)),
                "sampling: repetition_penalty must be finite and > 0 (a normal float: about 1.2e-38 to 3.4e38), got ",
                repetition_penalty);
}

SamplingOptions with_generation_config(SamplingOptions mine, unsigned given, const io::GenerationDefaults& g,
                                       unsigned* taken) {
  unsigned took = 0;
  if (taken) *taken = 0;
  if (!g.any()) return mine;  // nothing to take (twell's defaults are the file's without it)
  if (!g.unreadable.empty() && given != kSampleAllFields) throw Error(g.unreadable);  // a value would come from it
  const std::string source = g.source.empty() ? "generation config" : g.source;
  // Takes field `f` from the file: its keys' type errors first, then the value's range, alone.
  const auto take = [&](SamplingField f, std::initializer_list<const char*> keys, auto& field, auto value) {
    if ((given & f) != 0) return false;
    for (const char* key : keys)
      if (std::string what = g.error(key); !what.empty()) throw Error(what);
    field = value;
    took |= f;
    return true;
  };
  const bool sample = g.do_sample.value_or(false);
  take(kSampleRepetitionPenalty, {"repetition_penalty"}, mine.repetition_penalty, g.repetition_penalty.value_or(1.0));
  // A key's type error counts only where its value is used: the file's temperature only with do_sample,
  // do_sample for top_k only where the file says no top_k.
  using Keys = std::initializer_list<const char*>;
  if (take(kSampleTemperature, sample ? Keys{"do_sample", "temperature"} : Keys{"do_sample"}, mine.temperature,
           sample ? g.temperature.value_or(1.0) : 0.0))
    TWELL_REQUIRE(!sample || mine.temperature != 0, source,
                  ": do_sample is true with temperature 0, which transformers refuses (do_sample false is greedy)");
  if (mine.temperature != 0) {  // greedy has no use for the rest
    take(kSampleTopK, g.top_k ? Keys{"top_k"} : Keys{"do_sample", "top_k"}, mine.top_k,
         g.top_k.value_or(sample ? 50 : 0));
    take(kSampleTopP, {"top_p"}, mine.top_p, g.top_p.value_or(1.0));
    take(kSampleMinP, {"min_p"}, mine.min_p, g.min_p.value_or(0.0));
  }
  // The values taken, checked alone (with twell's defaults for the rest), so that an error is the file's.
  SamplingOptions alone;
  if (took & kSampleTemperature) alone.temperature = mine.temperature;
  if (took & kSampleTopK) alone.top_k = mine.top_k;
  if (took & kSampleTopP) alone.top_p = mine.top_p;
  if (took & kSampleMinP) alone.min_p = mine.min_p;
  if (took & kSampleRepetitionPenalty) alone.repetition_penalty = mine.repetition_penalty;
  try {
    alone.check();
  } catch (const Error& e) {  // "sampling: top_p must be ..." as "<file>: top_p must be ..."
    std::string what = e.what();
    if (what.rfind("sampling: ", 0) == 0) what.erase(0, 10);
    throw Error(str(source, ": ", what));
  }
  if (taken) *taken = took;
  return mine;
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) { options.check(); }

double Sampler::next_uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

void Sampler::seen(int32_t id) {
  if (options_.repetition_penalty == 1 || id < 0) return;
  if (is_seen_.insert(id).second) seen_.push_back(id);
}

void Sampler::seen(const std::vector<int32_t>& ids) {
  for (const int32_t id : ids) seen(id);
}

TensorView Sampler::penalized(const TensorView& logits, Tensor& copy) const {
  if (options_.repetition_penalty == 1 || seen_.empty()) return logits;
  check_logits_shape(logits);
  check_device(logits, Device::cpu, "sample: logits");
  copy = Tensor::copy_of(logits);
  const int64_t V = logits.numel();
  const auto apply = [&](auto* row, auto penalty) {
    for (const int32_t id : seen_)
      if (id < V) row[id] = row[id] < 0 ? row[id] * penalty : row[id] / penalty;
  };
  if (copy.dtype() == DType::f32)
    apply(copy.ptr<float>(), static_cast<float>(options_.repetition_penalty));  // transformers' f32 arithmetic
  else
    apply(copy.ptr<double>(), options_.repetition_penalty);
  return copy.view();
}

int32_t Sampler::sample(const TensorView& raw) {
  Tensor copy;
  const TensorView logits = penalized(raw, copy);
  if (options_.temperature == 0) return argmax_logits(logits, options_);
  const double u = next_uniform();  // first, whatever follows: a device sampler takes it before it knows
  const Kept k = kept_tokens(logits, options_, scratch());
  if (k.only) return *k.only;
  double total = 0;
  for (const Candidate& x : *k.c)
    if (k.keeps(x)) total += x.w;
  const double r = u * total;
  double cumulative = 0;
  int32_t last_drawable = -1;
  for (const Candidate& x : *k.c)
    if (k.keeps(x) && x.w > 0) {
      cumulative += x.w;
      if (r < cumulative) return x.id;
      last_drawable = x.id;
    }
  return last_drawable;  // r within rounding of the total
}

std::vector<int32_t> Sampler::candidates(const TensorView& raw) const {
  Tensor copy;
  const TensorView logits = penalized(raw, copy);
  if (options_.temperature == 0) return {argmax_logits(logits, options_)};
  const Kept k = kept_tokens(logits, options_, scratch());
  if (k.only) return {*k.only};
  std::vector<int32_t> ids;
  for (const Candidate& x : *k.c)
    if (k.keeps(x) && x.w > 0) ids.push_back(x.id);
  return ids;
}

void check_samplers(const std::vector<Sampler>& samplers, size_t B, const char* what) {
  TWELL_REQUIRE(samplers.size() == B, what, ": ", samplers.size(), " samplers for ", B, " sequences");
  for (const Sampler& s : samplers)
    TWELL_REQUIRE(s.options().same_rules(samplers[0].options()), what,
                ": the samplers of a batch must have the same options (their seeds may differ)");
}

namespace {

// Row b of logits [B, V] drawn by samplers[b], or kNoToken where tokens[b] is (a sequence that sat out).
std::vector<int32_t> sample_rows(const Tensor& logits, std::vector<Sampler>& samplers,
                                 const std::vector<int32_t>* tokens) {
  const int64_t B = logits.shape()[0], V = logits.shape()[1];
  std::vector<int32_t> next(static_cast<size_t>(B), kNoToken);
  const size_t row_bytes = static_cast<size_t>(V) * dtype_size(logits.dtype());
  for (int64_t b = 0; b < B; ++b)
    if (!tokens || (*tokens)[b] != kNoToken)
      next[b] = samplers[b].sample(
          TensorView(static_cast<char*>(logits.view().data) + static_cast<size_t>(b) * row_bytes, logits.dtype(), {V}));
  return next;
}

// A [1, V] copy of a row [V].
Tensor one_row(const Tensor& row) {
  return Tensor::copy_of(TensorView(row.view().data, row.dtype(), {1, row.numel()}));
}

}  // namespace

Tensor LanguageModel::prefill_batch(const std::vector<std::vector<int32_t>>& prompts) {
  TWELL_REQUIRE(prompts.size() == 1, "prefill_batch: this backend runs one sequence at a time, got ", prompts.size());
  return one_row(prefill(prompts[0]));
}
Tensor LanguageModel::decode_batch(const std::vector<int32_t>& tokens) {
  TWELL_REQUIRE(tokens.size() == 1, "decode_batch: this backend runs one sequence at a time, got ", tokens.size());
  TWELL_REQUIRE(cached_tokens() > 0, "decode_batch: call prefill() first");
  if (tokens[0] == kNoToken) return Tensor(DType::f32, {1, config().vocab_size});
  return one_row(decode_step(tokens[0]));
}
std::vector<int32_t> LanguageModel::prefill_batch_sample(const std::vector<std::vector<int32_t>>& prompts,
                                                         std::vector<Sampler>& samplers) {
  check_samplers(samplers, prompts.size(), "prefill_batch_sample");
  return sample_rows(prefill_batch(prompts), samplers, nullptr);
}
std::vector<int32_t> LanguageModel::decode_batch_sample(const std::vector<int32_t>& tokens,
                                                        std::vector<Sampler>& samplers) {
  check_samplers(samplers, tokens.size(), "decode_batch_sample");
  return sample_rows(decode_batch(tokens), samplers, &tokens);
}
Tensor LanguageModel::prefill_from(int64_t keep, const std::vector<int32_t>& tokens) {
  TWELL_REQUIRE(keep == 0, "prefill_from: this backend cannot keep a part of its KV cache (keep ", keep,
                "): only keep = 0, a whole prefill");
  return prefill(tokens);
}
std::vector<int32_t> LanguageModel::prefill_from_sample(int64_t keep, const std::vector<int32_t>& tokens,
                                                        std::vector<Sampler>& samplers) {
  check_samplers(samplers, 1, "prefill_from_sample");
  return sample_rows(one_row(prefill_from(keep, tokens)), samplers, nullptr);
}

uint64_t LanguageModel::next_cache_stamp() {
  static std::atomic<uint64_t> last{0};
  return ++last;
}

int64_t PromptCache::reusable(const LanguageModel& m, const std::vector<int32_t>& prompt) const {
  if (model != &m || writes != m.cache_writes() || !m.keeps_prefix() || ids.empty() ||
      m.cached_lengths() != std::vector<int64_t>{static_cast<int64_t>(ids.size())})
    return 0;
  const size_t most = std::min(ids.size(), prompt.empty() ? 0 : prompt.size() - 1);
  return std::mismatch(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(most), prompt.begin()).first - ids.begin();
}

std::vector<int64_t> LanguageModel::cached_lengths() const {
  const int64_t n = cached_tokens();
  return n > 0 ? std::vector<int64_t>{n} : std::vector<int64_t>{};
}

Generation generate(LanguageModel& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                    const SamplingOptions& sampling, const std::vector<int32_t>& stop_tokens,
                    const std::function<void(int32_t)>& on_token, PromptCache* cache) {
  TWELL_REQUIRE(!prompt.empty(), "generate: empty prompt");
  check_token_ids(model.config(), prompt, false, "generate: prompt");  // named as generate's, not generate_batch's
  TWELL_REQUIRE(max_new_tokens >= 0, "generate: max_new_tokens must be at least 0, got ", max_new_tokens);
  std::function<bool(int64_t, int32_t)> each;  // one sequence of a batch: seeded sampling.seed, its stop rules
  if (on_token) each = [&](int64_t, int32_t token) { return on_token(token), false; };
  return generate_batch(model, {prompt}, max_new_tokens, sampling, stop_tokens, each, cache)[0];
}

std::vector<int64_t> prefill_runs(const std::vector<int64_t>& lengths, int64_t max_tokens,
                                  const std::function<double(int64_t rows)>& run_cost) {
  const int64_t B = static_cast<int64_t>(lengths.size());
  TWELL_REQUIRE(B >= 1, "prefill_runs: no prompts");
  TWELL_REQUIRE(max_tokens >= 1, "prefill_runs: max_tokens must be at least 1, got ", max_tokens);
  for (int64_t b = 0; b < B; ++b)
    TWELL_REQUIRE(lengths[b] >= 1, "prefill_runs: prompt ", b, " holds ", lengths[b], " tokens");
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  if (std::all_of(lengths.begin(), lengths.end(), [&](int64_t n) { return n == longest; }) && B * longest <= max_tokens)
    return {0, B};
  // cost[j]: the least cost that prefills prompts [0, j); from[j]: where the last of those runs
  // starts. Runs of more than kWindow prompts are not considered: that bounds the search at
  // B × kWindow steps (0.26 s at B = 65535 on one core, 25 ms at 8192), and a batch that long
  // splits into runs of kWindow at most, which costs a few runs' overhead more than the best split.
  constexpr int64_t kWindow = 4096;
  const double kNone = std::numeric_limits<double>::infinity();
  std::vector<double> cost(static_cast<size_t>(B) + 1, kNone);
  std::vector<int64_t> from(static_cast<size_t>(B) + 1, 0);
  cost[0] = 0;
  for (int64_t j = 1; j <= B; ++j) {
    int64_t run_longest = 0;
    for (int64_t i = j - 1; i >= std::max<int64_t>(0, j - kWindow); --i) {
      run_longest = std::max(run_longest, lengths[i]);
      const int64_t rows = (j - i) * run_longest;
      if (rows > max_tokens && i < j - 1) break;  // longer runs only hold more; one prompt runs in chunks
      const double c = cost[i] + run_cost(rows);
      if (c <= cost[j]) cost[j] = c, from[j] = i;  // ties: the longer run (fewer shapes)
    }
  }
  std::vector<int64_t> bounds{B};
  for (int64_t j = B; j > 0; j = from[j]) bounds.push_back(from[j]);
  std::reverse(bounds.begin(), bounds.end());
  return bounds;
}

std::vector<int64_t> prefill_chunks(int64_t tokens, int64_t max_tokens) {
  TWELL_REQUIRE(tokens >= 1, "prefill_chunks: need at least one token, got ", tokens);
  TWELL_REQUIRE(max_tokens >= 1, "prefill_chunks: max_tokens must be at least 1, got ", max_tokens);
  if (tokens <= max_tokens) return {tokens};
  const int64_t n = (tokens + max_tokens - 1) / max_tokens;  // the fewest chunks
  std::vector<int64_t> chunks(static_cast<size_t>(n), tokens / n);
  for (int64_t i = 0; i < tokens % n; ++i) ++chunks[static_cast<size_t>(i)];  // the first ones one longer
  return chunks;
}

std::vector<Generation> generate_batch(LanguageModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                       int64_t max_new_tokens, const SamplingOptions& sampling,
                                       const std::vector<int32_t>& stop_tokens,
                                       const std::function<bool(int64_t, int32_t)>& on_token,
                                       PromptCache* cache) {
  const size_t B = prompts.size();
  TWELL_REQUIRE(B >= 1, "generate_batch: no prompts");
  TWELL_REQUIRE(!cache || B == 1, "generate_batch: a PromptCache serves one prompt at a time, got ", B);
  TWELL_REQUIRE(static_cast<int64_t>(B) <= model.max_batch(), "generate_batch: ", B,
              " prompts exceed the model's max_batch ", model.max_batch());
  check_sequences(model.config(), prompts, 1, "generate_batch: prompt");
  TWELL_REQUIRE(max_new_tokens >= 0, "generate_batch: max_new_tokens must be at least 0, got ", max_new_tokens);
  using clock = std::chrono::steady_clock;
  // The model's sequence i is prompts[order[i]]: ordered by length, so that a backend that prefills
  // runs of neighbouring prompts as batches (LlamaCuda: prefill_runs) pads as little as it can.
  std::vector<size_t> order(B);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return prompts[x].size() < prompts[y].size(); });
  std::vector<size_t> where(B);  // order's inverse
  for (size_t i = 0; i < B; ++i) where[order[i]] = i;
  std::vector<std::vector<int32_t>> ordered;
  ordered.reserve(B);
  std::vector<Sampler> samplers;
  for (size_t i = 0; i < B; ++i) {
    ordered.push_back(prompts[order[i]]);
    SamplingOptions o = sampling;
    o.seed = sampling.seed + order[i];  // wraps; any seed is a seed
    samplers.emplace_back(o);
    samplers.back().seen(ordered.back());  // the repetition penalty's history starts with the prompt
  }
  std::vector<Generation> gens(B);
  const auto t0 = clock::now();
  std::vector<int32_t> next;
  int64_t reused = 0;
  uint64_t our_writes = 0;  // cache_writes() after this generation's last call of the model
  if (cache) {  // the part of the prompt the cache does not hold
    reused = cache->reusable(model, prompts[0]);
    cache->forget();  // until this generation has ended: one that throws leaves nothing known
    const std::vector<int32_t> rest(prompts[0].begin() + reused, prompts[0].end());
    if (max_new_tokens > 0)
      next = model.prefill_from_sample(reused, rest, samplers);
    else
      model.prefill_from(reused, rest);
    our_writes = model.cache_writes();
  } else if (max_new_tokens > 0) {
    next = model.prefill_batch_sample(ordered, samplers);
  } else {
    model.prefill_batch(ordered);
  }
  const auto t1 = clock::now();
  std::vector<clock::time_point> ended(B, t1);
  size_t live = max_new_tokens > 0 ? B : 0;
  // Whether sequence i's context is full; asked only where another token would follow.
  const auto full = [&](const std::vector<int64_t>& lens, size_t i) {
    TWELL_REQUIRE(lens.size() == B, "generate_batch: the model keeps no KV cache for these ", B,
                " sequences (built for logits alone?): it cannot decode");
    return lens[i] >= model.context();
  };
  std::vector<char> finished(B, 0);  // by position in `ordered`
  // The decode clock starts once the first tokens are handed over: their callbacks are the
  // prefill's, so n tokens take n - 1 steps' time (a one-token generation: 0).
  std::optional<clock::time_point> decode_start;
  while (live > 0) {
    const std::vector<int64_t> lens = model.cached_lengths();
    for (size_t b = 0; b < B; ++b) {  // in the caller's order
      const size_t i = where[b];
      if (finished[i]) continue;
      // A live sequence always draws a token; kNoToken here would make it sit out unfinished and
      // the loop spin, so it is refused instead.
      TWELL_REQUIRE(next[i] >= 0, "generate_batch: no token was drawn for sequence ", b,
                    " (internal error in sampling; please report it with the sampling settings)");
      Generation& g = gens[b];
      g.tokens.push_back(next[i]);
      samplers[i].seen(next[i]);
      const bool asked = on_token && on_token(static_cast<int64_t>(b), next[i]);
      bool done = true;
      if (std::find(stop_tokens.begin(), stop_tokens.end(), next[i]) != stop_tokens.end())
        g.reason = StopReason::stop_token;
      else if (asked)
        g.reason = StopReason::callback;
      else if (static_cast<int64_t>(g.tokens.size()) == max_new_tokens)
        g.reason = StopReason::max_tokens;
      else if (full(lens, i))
        g.reason = StopReason::context_full;
      else
        done = false;
      if (done) {
        ended[b] = clock::now();
        finished[i] = 1;
        next[i] = kNoToken;  // sits the remaining steps out
        --live;
      }
    }
    if (!decode_start) decode_start = clock::now();
    if (live > 0) {
      next = model.decode_batch_sample(next, samplers);
      our_writes = model.cache_writes();
    }
  }
  for (size_t b = 0; b < B; ++b) {
    gens[b].prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    const auto from = decode_start.value_or(t1);
    gens[b].decode_seconds = ended[b] > from ? std::chrono::duration<double>(ended[b] - from).count() : 0.0;
  }
  if (cache) {  // the prompt and every token drawn but the last, which no step ran
    gens[0].reused = reused;
    std::vector<int32_t> held = prompts[0];
    if (!gens[0].tokens.empty()) held.insert(held.end(), gens[0].tokens.begin(), gens[0].tokens.end() - 1);
    // Nothing but this generation wrote the cache (a callback may call the model), and it holds them.
    if (model.cache_writes() == our_writes &&
        model.cached_lengths() == std::vector<int64_t>{static_cast<int64_t>(held.size())})
      *cache = PromptCache{std::move(held), our_writes, &model};
  }
  return gens;
}

std::vector<double> LanguageModel::next_token_nll(const std::vector<int32_t>& tokens,
                                                  std::vector<ActivationStats>* ffn_stats) const {
  TWELL_REQUIRE(tokens.size() >= 2, "perplexity: need at least 2 tokens, got ", tokens.size());
  return nll_from_logits(logits(tokens, ffn_stats), tokens);
}

std::vector<std::vector<double>> LanguageModel::next_token_nll_batch(const std::vector<std::vector<int32_t>>& sequences,
                                                                    std::vector<ActivationStats>* ffn_stats) const {
  check_sequences(config(), sequences, 2, "perplexity: sequence", context());
  if (ffn_stats) ffn_stats->clear();
  std::vector<std::vector<double>> out;
  std::vector<ActivationStats> part;
  for (const std::vector<int32_t>& seq : sequences) {
    out.push_back(next_token_nll(seq, ffn_stats ? &part : nullptr));
    if (ffn_stats) add_layer_stats(*ffn_stats, part);
  }
  return out;
}

namespace {

// The perplexity of `count` predictions whose losses sum to `sum`.
Perplexity perplexity_of(double sum, int64_t count) {
  Perplexity p;
  p.predictions = count;
  p.mean_nll = sum / static_cast<double>(count);
  p.perplexity = std::exp(p.mean_nll);  // +inf past ~709.8 nats, as torch.exp gives it: the mean NLL stays exact
  return p;
}

Perplexity perplexity_of(const std::vector<double>& nll) {
  double sum = 0;
  for (double v : nll) sum += v;
  return perplexity_of(sum, static_cast<int64_t>(nll.size()));
}

}  // namespace

Perplexity perplexity(const LanguageModel& model, const std::vector<int32_t>& tokens,
                      std::vector<ActivationStats>* ffn_stats) {
  TWELL_REQUIRE(tokens.size() >= 2, "perplexity: need at least 2 tokens, got ", tokens.size());
  const Perplexity p = perplexity_of(model.next_token_nll(tokens, ffn_stats));
  TWELL_REQUIRE(std::isfinite(p.mean_nll), "perplexity: the mean NLL is ",
                non_finite_name(p.mean_nll),
              ": the model's logits are not finite (NaN or Inf weights, or an overflow in its activations)");
  return p;
}

Perplexity perplexity_from_logits(const TensorView& logits, const std::vector<int32_t>& tokens) {
  return perplexity_of(nll_from_logits(logits, tokens));
}

std::vector<EvalWindow> eval_windows(int64_t tokens, int64_t window, int64_t stride) {
  TWELL_REQUIRE(window >= 2, "eval_windows: a window holds at least 2 tokens, got ", window);
  TWELL_REQUIRE(stride >= 1 && stride <= window, "eval_windows: the stride must lie in [1, window = ", window, "], got ",
              stride, " (a longer one would leave tokens between windows unscored)");
  std::vector<EvalWindow> out;
  for (int64_t begin = 0, scored = 1; scored < tokens; begin += stride) {  // token 0 has nothing before it
    const int64_t end = std::min(begin + window, tokens);
    if (end - begin < 2) break;
    out.push_back({begin, end, std::max(scored, begin + 1)});
    scored = end;
  }
  return out;
}

void add_layer_stats(std::vector<ActivationStats>& total, const std::vector<ActivationStats>& part) {
  total.resize(std::max(total.size(), part.size()));
  for (size_t l = 0; l < part.size(); ++l) total[l] += part[l];
}

namespace {

// Calls run(first, last) for runs [first, last) of neighbouring windows of one length (length(w)),
// at most per_call windows each, in order: the windows one next_token_nll_batch call takes.
template <class Length, class Run>
void in_calls(int64_t windows, int64_t per_call, Length&& length, Run&& run) {
  for (int64_t first = 0; first < windows;) {
    int64_t last = first + 1;
    while (last < windows && last - first < per_call && length(last) == length(first)) ++last;
    run(first, last);
    first = last;
  }
}

}  // namespace

std::vector<ActivationStats> ffn_stats_in_windows(const LanguageModel& model, const std::vector<int32_t>& tokens,
                                                  int64_t window, int64_t windows_per_call) {
  TWELL_REQUIRE(!tokens.empty(), "ffn statistics: no tokens");
  TWELL_REQUIRE(window >= 1, "ffn statistics: a window holds at least 1 token, got ", window);
  TWELL_REQUIRE(windows_per_call >= 0, "ffn statistics: windows_per_call must be at least 0, got ", windows_per_call);
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t windows = T / window + (T % window != 0);  // not (T + window − 1) / window: window may be huge
  auto begin = [&](int64_t w) { return w >= windows ? T : w * window; };
  auto length = [&](int64_t w) { return begin(w + 1) - begin(w); };
  std::vector<ActivationStats> total, part;
  in_calls(windows, windows_per_call > 0 ? windows_per_call : model.sequences_a_forward(), length,
           [&](int64_t first, int64_t last) {
             std::vector<std::vector<int32_t>> ids;
             for (int64_t w = first; w < last; ++w)
               ids.emplace_back(tokens.begin() + begin(w), tokens.begin() + begin(w + 1));
             if (length(first) >= 2) {
               model.next_token_nll_batch(ids, &part);
               add_layer_stats(total, part);
             } else {
               for (const std::vector<int32_t>& one : ids) {  // one token predicts nothing: its forward
                 model.logits(one, &part);
                 add_layer_stats(total, part);
               }
             }
           });
  return total;
}

Perplexity windowed_perplexity(const LanguageModel& model, const std::vector<int32_t>& tokens, int64_t window,
                               int64_t stride, int64_t max_windows, std::vector<ActivationStats>* ffn_stats,
                               const std::function<void(int64_t, int64_t, const Perplexity&)>& on_window,
                               const std::string& what, int64_t windows_per_call) {
  TWELL_REQUIRE(tokens.size() >= 2, "perplexity: need at least 2 tokens, got ", tokens.size());
  TWELL_REQUIRE(!ffn_stats || stride == window, "perplexity: FFN statistics count every token of each window: they "
              "take windows that do not overlap (stride = window)");
  TWELL_REQUIRE(max_windows >= 0, "perplexity: max_windows must be at least 0, got ", max_windows);
  TWELL_REQUIRE(windows_per_call >= 0, "perplexity: windows_per_call must be at least 0, got ", windows_per_call);
  if (windows_per_call == 0) windows_per_call = model.sequences_a_forward();
  const int64_t T = static_cast<int64_t>(tokens.size());
  std::vector<EvalWindow> plan = eval_windows(T, window, stride);
  // The text's last token alone after the last window predicts nothing, but its FFN runs: counted
  // in the statistics (as ffn_stats_in_windows counts it) where every window runs.
  const bool lone_last = ffn_stats && plan.back().end == T - 1 &&
                         (max_windows == 0 || static_cast<int64_t>(plan.size()) <= max_windows);
  if (max_windows > 0 && static_cast<int64_t>(plan.size()) > max_windows) plan.resize(static_cast<size_t>(max_windows));
  const int64_t windows = static_cast<int64_t>(plan.size());
  auto length = [&](int64_t w) { return plan[static_cast<size_t>(w)].end - plan[static_cast<size_t>(w)].begin; };
  if (ffn_stats) ffn_stats->clear();
  double sum = 0;
  int64_t count = 0;
  std::vector<ActivationStats> layers;
  in_calls(windows, windows_per_call, length, [&](int64_t first, int64_t last) {
    std::vector<std::vector<int32_t>> ids;
    for (int64_t w = first; w < last; ++w)
      ids.emplace_back(tokens.begin() + plan[static_cast<size_t>(w)].begin, tokens.begin() + plan[static_cast<size_t>(w)].end);
    const std::vector<std::vector<double>> nll = model.next_token_nll_batch(ids, ffn_stats ? &layers : nullptr);
    if (ffn_stats) add_layer_stats(*ffn_stats, layers);
    for (int64_t w = first; w < last; ++w) {
      const EvalWindow& win = plan[static_cast<size_t>(w)];
      const std::vector<double>& losses = nll[static_cast<size_t>(w - first)];
      double window_sum = 0;  // row t predicts ids[t + 1]: token `from` is row from − 1 − begin
      for (int64_t q = win.from; q < win.end; ++q) window_sum += losses[static_cast<size_t>(q - 1 - win.begin)];
      TWELL_REQUIRE(std::isfinite(window_sum), "window ", w + 1, " of ", what, ": the mean NLL is ",
                  non_finite_name(window_sum),
                  ": the model's logits are not finite (NaN or Inf weights, or an overflow in its activations)");
      sum += window_sum;
      count += win.end - win.from;
      if (on_window) on_window(w + 1, windows, perplexity_of(sum, count));
    }
  });
  if (lone_last) {
    model.logits({tokens.back()}, &layers);
    add_layer_stats(*ffn_stats, layers);
  }
  return perplexity_of(sum, count);
}

std::vector<double> nll_from_logits(const TensorView& logits, const std::vector<int32_t>& tokens) {
  TWELL_REQUIRE(tokens.size() >= 2, "perplexity: need at least 2 tokens, got ", tokens.size());
  const int64_t T = static_cast<int64_t>(tokens.size());
  TWELL_REQUIRE(logits.rank() == 2 && logits.shape[0] == T, "perplexity: logits ", shape_str(logits.shape),
              " do not hold one row per token (", T, ")");
  check_device(logits, Device::cpu, "perplexity: logits");
  check_contiguous(logits, "perplexity: logits");
  const int64_t V = logits.shape[1];
  for (int64_t t = 1; t < T; ++t)
    TWELL_REQUIRE(tokens[t] >= 0 && tokens[t] < V, "perplexity: token ", tokens[t], " outside [0, ", V, ")");
  const size_t row_bytes = static_cast<size_t>(V) * dtype_size(logits.dtype);
  std::vector<double> nll(static_cast<size_t>(T - 1));
  // Rows on the threads (each row's sum in one order: the same bits for any thread count), a row at a
  // time: [T, V] in double would be 8·T·V bytes.
  cpu::parallel_for(T - 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const std::vector<double> values =
          to_f64(TensorView(static_cast<char*>(logits.data) + static_cast<size_t>(t) * row_bytes, logits.dtype, {V}));
      const double* row = values.data();
      const double top = *std::max_element(row, row + V);
      double sum = 0;
      for (int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - top);
      nll[static_cast<size_t>(t)] = (top + std::log(sum)) - row[tokens[t + 1]];  // −log softmax(row)[next]
    }
  }, 32 * V);  // ~6 ns an element: 32 of parallel_for's units
  return nll;
}

}  // namespace twell::model
