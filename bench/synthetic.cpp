#include "synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "cpu/parallel.h"

namespace twell::bench {

Distribution distribution_from_name(const std::string& name) {
  if (name == "uniform") return Distribution::uniform;
  if (name == "skewed") return Distribution::skewed;
  TWELL_FAIL("unknown distribution '", name, "' (expected uniform or skewed)");
}

const char* distribution_name(Distribution d) {
  return d == Distribution::uniform ? "uniform" : "skewed";
}

double normal_quantile(double q) {
  TWELL_CHECK(q > 0 && q < 1, "normal_quantile: q must be in (0, 1), got ", q);
  // Bisection on Φ(z) = erfc(-z/√2)/2: slow but exact to double precision, and only run once per
  // neuron.
  double lo = -40, hi = 40;
  for (int i = 0; i < 200 && hi - lo > 1e-13; ++i) {
    double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < q ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// Tokens of `skewed` with a heat shift, and the range of the shift (standard deviations).
constexpr double kHotTokens = 0.02, kHeatMin = 1.0, kHeatMax = 1.5;

// Expected non-zeros per token over all tokens: (1 - kHotTokens)·Σ p_j for the tokens without heat,
// and for the hot ones Σ Φ(heat - z_j), z_j = Φ⁻¹(1 - p_j), averaged over heat uniform in
// [kHeatMin, kHeatMax] (midpoint rule, 8 points).
static double expected_nnz(const std::vector<double>& p) {
  double base = 0;
  for (double v : p) base += v;
  constexpr int kPoints = 8;
  double heated = 0;
  for (double v : p) {
    if (v <= 0) continue;
    const double z = v >= 1 ? -40.0 : -normal_quantile(v);  // Φ⁻¹(1 − v), without 1 − v rounding to 1
    for (int i = 0; i < kPoints; ++i) {
      const double heat = kHeatMin + (kHeatMax - kHeatMin) * (i + 0.5) / kPoints;
      heated += 0.5 * std::erfc(-(heat - z) / std::sqrt(2.0)) / kPoints;
    }
  }
  return (1 - kHotTokens) * base + kHotTokens * heated;
}

// skewed: each neuron's relative rate r_j, 0 for the dead ones (the first draws of the spec's seed).
static std::vector<double> skewed_relative_rates(int64_t I, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(0, 1);
  std::lognormal_distribution<double> rate(0.0, 1.0);
  std::vector<double> r(static_cast<size_t>(I));
  for (auto& v : r) v = unit(rng) < kDeadNeurons ? 0.0 : rate(rng);
  return r;
}

double max_synthetic_density(const SyntheticSpec& s) {
  if (s.distribution == Distribution::uniform || s.I < 1) return 1;
  std::mt19937_64 rng(s.seed);
  std::vector<double> p = skewed_relative_rates(s.I, rng);
  for (double& v : p) v = v > 0 ? kMaxRate : 0.0;
  return expected_nnz(p) / static_cast<double>(s.I);
}

static std::vector<double> firing_rates(const SyntheticSpec& s, std::mt19937_64& rng) {
  TWELL_REQUIRE(s.density >= 0 && s.density <= 1, "density must be in [0, 1], got ", s.density);
  std::vector<double> p(static_cast<size_t>(s.I), s.density);
  if (s.distribution == Distribution::uniform || s.density == 0 || s.density == 1) return p;
  const std::vector<double> r = skewed_relative_rates(s.I, rng);
  // Rates scale · r_j, clipped at kMaxRate, with the scale that makes the expected non-zeros per token
  // over all tokens, the hot ones included, density · I (bisection on the scale; the count grows
  // with it). Where even the largest scale falls short (densities near 1), the largest is used.
  auto rates = [&](double scale) {
    for (size_t j = 0; j < p.size(); ++j) p[j] = std::min(kMaxRate, scale * r[j]);
  };
  double sum_r = 0;
  for (double v : r) sum_r += v;
  if (sum_r == 0) return std::vector<double>(p.size(), 0.0);
  const double target = s.density * static_cast<double>(s.I);
  double lo = 0, hi = target / sum_r;  // the scale without hot tokens or clipping: at least enough
  for (int i = 0; i < 30; ++i, hi *= 2) {
    rates(hi);
    if (expected_nnz(p) >= target) break;
  }
  for (int i = 0; i < 40 && hi - lo > 1e-7 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    rates(mid);
    (expected_nnz(p) < target ? lo : hi) = mid;
  }
  rates(0.5 * (lo + hi));
  return p;
}

namespace {

// SplitMix64: a fast counter-based generator, so that every row can be drawn independently (in
// parallel, with results that do not depend on the thread count).
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double unit() { return (next() >> 11) * 0x1.0p-53; }                    // [0, 1)
  float centered(float stddev) { return float((unit() - 0.5) * 3.4641016151377544) * stddev; }  // var = stddev²
};

uint64_t row_seed(uint64_t seed, uint64_t stream, int64_t row) {
  SplitMix s{seed * 0x100000001b3ull ^ (stream << 40) ^ static_cast<uint64_t>(row)};
  return s.next();
}

// Fills rows [.., first_col:] of a bf16 [rows, cols] tensor with i.i.d. centred values.
void fill_random_rows(const Tensor& t, int64_t first_col, float stddev, uint64_t seed, uint64_t stream) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  auto* p = t.ptr<bf16>();
  cpu::parallel_for(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      SplitMix rng{row_seed(seed, stream, r)};
      for (int64_t k = first_col; k < cols; ++k) p[r * cols + k] = bf16(rng.centered(stddev));
    }
  }, cols);
}

}  // namespace

static void fill_tokens(const SyntheticSpec& s, uint64_t seed, const Tensor& x) {
  fill_random_rows(x, 2, 1.f, seed, 1);
  auto* px = x.ptr<bf16>();
  for (int64_t m = 0; m < s.M; ++m) {
    SplitMix rng{row_seed(seed, 2, m)};
    double heat = 0;
    if (s.distribution == Distribution::skewed && rng.unit() < kHotTokens)
      heat = kHeatMin + (kHeatMax - kHeatMin) * rng.unit();
    px[m * s.H + 0] = bf16(1.f);
    px[m * s.H + 1] = bf16(static_cast<float>(heat));
  }
}

Tensor make_synthetic_tokens(const SyntheticSpec& s, uint64_t seed) {
  TWELL_REQUIRE(s.M >= 1 && s.H >= 3 && s.I >= 1, "synthetic FFN needs M >= 1, H >= 3, I >= 1; got M=",
              s.M, " H=", s.H, " I=", s.I);
  Tensor x = Tensor::of<bf16>({s.M, s.H});
  fill_tokens(s, seed, x);
  return x;
}

SyntheticFfn make_synthetic_ffn(const SyntheticSpec& s) {
  SyntheticFfn f;
  f.spec = s;
  f.x = make_synthetic_tokens(s, s.seed * 7919 + 1);
  std::mt19937_64 rng(s.seed);
  f.fire_prob = firing_rates(s, rng);

  uint64_t stream = 10;
  auto random_weight = [&](double stddev, int64_t first_col) {
    Tensor w = Tensor::of<bf16>({s.I, s.H});
    fill_random_rows(w, first_col, static_cast<float>(stddev), s.seed, stream++);
    return w;
  };
  // The thresholded ("gating") weight: Wg for a gated FFN, Wu for a non-gated one.
  Tensor gate = random_weight(1.0 / std::sqrt(double(s.H - 2)), 2);
  auto* pg = gate.ptr<bf16>();
  for (int64_t j = 0; j < s.I; ++j) {
    double norm2 = 0;
    for (int64_t k = 2; k < s.H; ++k) norm2 += double(float(pg[j * s.H + k])) * float(pg[j * s.H + k]);
    const double sigma = std::sqrt(norm2);
    const double p = f.fire_prob[j];
    // Probability 0 or 1: a threshold 40σ away is never crossed by a normal pre-activation.
    const double z = p <= 0 ? 40.0 : p >= 1 ? -40.0 : -normal_quantile(p);  // Φ⁻¹(1 − p)
    pg[j * s.H + 0] = bf16(static_cast<float>(-sigma * z));
    pg[j * s.H + 1] = bf16(static_cast<float>(sigma));
  }
  if (s.gated) {
    f.wg = std::move(gate);
    f.wu = random_weight(1.0 / std::sqrt(double(s.H)), 0);
  } else {
    f.wu = std::move(gate);
  }
  f.wd = random_weight(1.0 / std::sqrt(double(s.I) * s.density + 1.0), 0);
  return f;
}

}  // namespace twell::bench
