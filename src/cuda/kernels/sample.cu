// Drawing tokens from logits on the GPU, with model::Sampler's rules (model/llama.h,
// src/model/llama_sampling.cpp): greedy, temperature, top-k (ties at the cut kept), top-p (the
// shortest prefix, in the order logit descending then id ascending, whose mass reaches top_p), and
// the draw in id order. One block of 1024 threads a row; what leaves the GPU is the token.
//
// The softmax weights w = exp(logit / T − max / T) are computed in double as the host does, then
// held as fixed-point integers (w · 2^40, rounded): every sum of them is then exact and the same
// in any order, so a row's token does not depend on how the threads' atomics interleave. The
// thresholds are found without sorting: the in-play logits are bucketed by value (2048 buckets
// between their least and greatest), the bucket where the measure (a count for top-k, the weight
// for top-p) reaches its target is kept, and the bucketing repeats inside it until one value is
// left. A float row of 49152 logits takes 2-4 rounds.
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "cuda/kernels.h"

namespace twell::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBuckets = 2048;
constexpr int kBucketsPerThread = kBuckets / kThreads;
constexpr double kWeightScale = 0x1p40;  // sums of up to 2^23 weights fit in 64 bits
constexpr int kMaxRounds = 64;           // a float range narrows 2047-fold a round: 4-5 suffice
using u64 = unsigned long long;

struct ArgMax {
  float v;
  int64_t i;
};
__device__ ArgMax better(ArgMax a, ArgMax b) { return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }

template <class T>
__device__ T shfl_xor(T v, int mask) {
  static_assert(sizeof(T) % 4 == 0, "shuffled by 32-bit words");
  union {
    T t;
    int w[sizeof(T) / 4];
  } u;
  u.t = v;
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(T) / 4); ++k) u.w[k] = __shfl_xor_sync(~0u, u.w[k], mask);
  return u.t;
}

// Every thread gets op over all threads' v. `scratch` holds kWarps T (raw bytes, shared).
template <class T, class Op>
__device__ T block_reduce(T v, Op op, void* scratch) {
  T* s = static_cast<T*>(scratch);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
  if (lane == 0) s[warp] = v;
  __syncthreads();
  v = s[lane];  // kWarps == 32: one value a lane
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
  __syncthreads();  // s is reused by the next call
  return v;
}

// The sum of the threads' v before this one (in thread order), and the total in *total.
__device__ u64 block_exclusive_scan(u64 v, u64* total, void* scratch) {
  u64* s = static_cast<u64*>(scratch);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  u64 inc = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const u64 o = __shfl_up_sync(~0u, inc, d);
    if (lane >= d) inc += o;
  }
  if (lane == 31) s[warp] = inc;
  __syncthreads();
  u64 w = s[lane], winc = w;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const u64 o = __shfl_up_sync(~0u, winc, d);
    if (lane >= d) winc += o;
  }
  const u64 before_warp = __shfl_sync(~0u, winc - w, warp);
  *total = __shfl_sync(~0u, winc, 31);
  __syncthreads();
  return before_warp + inc - v;
}

struct Shared {
  alignas(16) unsigned char scratch[kWarps * 16];
  u64 mass[kBuckets];
  int cut;
  u64 acc;
};

__device__ int bucket_of(double v, double hi, double scale) {
  return min(kBuckets - 1, static_cast<int>((hi - v) * scale));
}

// The value v* of the logits in [lo, hi] at which their measure, accumulated from the greatest
// down, reaches `target`: measure(> v*) < target ≤ measure(≥ v*), given measure(≥ lo) ≥ target.
// `measure(i)` is a row element's (called only for elements in [lo, hi]); *above receives
// measure(> v*) counted from `acc`, the measure above hi. Returns false if it did not converge.
template <class Measure>
__device__ bool select_value(const float* l, int64_t n, double lo, double hi, u64 acc, u64 target, Measure measure,
                             double* value, u64* above, Shared& s) {
  for (int round = 0; lo != hi; ++round) {
    if (round == kMaxRounds) return false;
    const double scale = (kBuckets - 1) / (hi - lo);
    for (int b = threadIdx.x; b < kBuckets; b += kThreads) s.mass[b] = 0;
    if (threadIdx.x == 0) s.cut = -1;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const double v = l[i];
      if (v >= lo && v <= hi) {
        const u64 m = measure(i);
        if (m) atomicAdd(&s.mass[bucket_of(v, hi, scale)], m);
      }
    }
    __syncthreads();
    // The bucket where acc + (mass before it) < target ≤ acc + (mass up to it): exactly one.
    u64 mine[kBucketsPerThread], sum = 0;
#pragma unroll
    for (int k = 0; k < kBucketsPerThread; ++k) sum += (mine[k] = s.mass[threadIdx.x * kBucketsPerThread + k]);
    u64 total;
    u64 before = acc + block_exclusive_scan(sum, &total, s.scratch);
#pragma unroll
    for (int k = 0; k < kBucketsPerThread; ++k) {
      if (before < target && before + mine[k] >= target) {
        s.cut = threadIdx.x * kBucketsPerThread + k;
        s.acc = before;
      }
      before += mine[k];
    }
    __syncthreads();
    const int cut = s.cut;
    if (cut < 0) return false;  // the measure did not reach the target: cannot happen
    acc = s.acc;
    double bl = HUGE_VAL, bh = -HUGE_VAL;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const double v = l[i];
      if (v >= lo && v <= hi && bucket_of(v, hi, scale) == cut) bl = fmin(bl, v), bh = fmax(bh, v);
    }
    bl = block_reduce(bl, [](double a, double b) { return fmin(a, b); }, s.scratch);
    bh = block_reduce(bh, [](double a, double b) { return fmax(a, b); }, s.scratch);
    lo = bl, hi = bh;
  }
  *value = lo;
  *above = acc;
  return true;
}

// Ids [first, end) of the row that thread t reads in id order: contiguous chunks.
struct Chunk {
  int64_t first, end;
  __device__ explicit Chunk(int64_t n) {
    const int64_t c = (n + kThreads - 1) / kThreads;
    first = min(n, threadIdx.x * c);
    end = min(n, first + c);
  }
};

__global__ void __launch_bounds__(kThreads) sample_kernel(const SampleArgs a) {
  __shared__ Shared s;
  const int64_t row = blockIdx.x, n = a.n;
  const float* l = a.logits + row * a.ld;
  u64* w = a.weights + row * n;
  SampleResult* out = a.results + row;

  // The argmax (lowest id on ties), the first NaN or +inf, the least finite logit, how many are
  // more than -inf.
  ArgMax best{-HUGE_VALF, INT64_MAX};
  int64_t bad = INT64_MAX, alive = 0;
  float least = HUGE_VALF;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float v = l[i];
    if (!(v < HUGE_VALF)) {
      bad = min(bad, i);
    } else {
      best = better(best, ArgMax{v, i});
      if (v > -HUGE_VALF) ++alive, least = fminf(least, v);
    }
  }
  best = block_reduce(best, better, s.scratch);
  bad = block_reduce(bad, [](int64_t x, int64_t y) { return min(x, y); }, s.scratch);
  alive = block_reduce(alive, [](int64_t x, int64_t y) { return x + y; }, s.scratch);
  least = block_reduce(least, [](float x, float y) { return fminf(x, y); }, s.scratch);
  const bool lead = threadIdx.x == 0;
  if (bad != INT64_MAX || alive == 0) {
    if (lead) *out = bad != INT64_MAX ? SampleResult{-1, kSampleBadLogit, bad, l[bad]} : SampleResult{-1, kSampleAllRuledOut, -1, 0};
    return;
  }
  const double inv_t = a.temperature > 0 ? 1.0 / a.temperature : 0.0, top = best.v * inv_t;
  if (a.temperature == 0 || !isfinite(top) || !isfinite(inv_t)) {  // greedy (or weights that would be NaN)
    if (lead) *out = SampleResult{static_cast<int32_t>(best.i), kSampleOk, -1, 0};
    return;
  }
  const auto fail = [&] {
    if (lead) *out = SampleResult{-1, kSampleNoConvergence, -1, 0};
  };

  // top-k: the k-th greatest logit (counting -inf ones, as the host's selection does) is the floor.
  double floor = -HUGE_VAL;
  if (a.top_k > 0 && a.top_k < alive) {
    u64 unused;
    if (!select_value(l, n, least, best.v, 0, static_cast<u64>(a.top_k), [](int64_t) -> u64 { return 1; }, &floor,
                      &unused, s))
      return fail();
  }
  const double lo = floor > -HUGE_VAL ? floor : static_cast<double>(least);

  // The candidates' weights (0 for the others).
  u64 total = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const double v = l[i];
    const u64 wi = v >= lo ? __double2ull_rn(exp(v * inv_t - top) * kWeightScale) : 0;
    w[i] = wi;
    total += wi;
  }
  total = block_reduce(total, [](u64 x, u64 y) { return x + y; }, s.scratch);

  // top-p: the nucleus is every candidate above v*, and the first `need` of those at v* in id order.
  double cut_value = -HUGE_VAL;  // kept: above it, or equal to it with an id ≤ cut_id
  int64_t cut_id = INT64_MAX;
  if (a.top_p < 1) {
    u64 target = min(total, static_cast<u64>(ceil(a.top_p * static_cast<double>(total))));
    if (target == 0) target = 1;
    u64 above;
    if (!select_value(l, n, lo, best.v, 0, target, [w](int64_t i) { return w[i]; }, &cut_value, &above, s))
      return fail();
    const float vstar = static_cast<float>(cut_value);
    const Chunk c(n);
    u64 tied = 0, w_star = 0;
    for (int64_t i = c.first; i < c.end; ++i)
      if (l[i] == vstar) ++tied, w_star = w[i];
    w_star = block_reduce(w_star, [](u64 x, u64 y) { return max(x, y); }, s.scratch);
    const u64 need = w_star ? (target - above + w_star - 1) / w_star : ~0ull;
    u64 n_tied;
    u64 before = block_exclusive_scan(tied, &n_tied, s.scratch);
    const u64 last = min(need, n_tied);  // 1-based rank among the ties of the nucleus's last
    if (before < last && before + tied >= last) {
      for (int64_t i = c.first; i < c.end; ++i)
        if (l[i] == vstar && ++before == last) {
          s.acc = static_cast<u64>(i);
          break;
        }
    }
    __syncthreads();
    cut_id = static_cast<int64_t>(s.acc);
  }

  // The draw: r in [0, kept mass), and the first kept id whose prefix mass passes r.
  const Chunk c(n);
  const auto kept = [&](int64_t i) {
    const double v = l[i];
    return v > cut_value || (v == cut_value && i <= cut_id);
  };
  u64 mine = 0;
  for (int64_t i = c.first; i < c.end; ++i)
    if (kept(i)) mine += w[i];
  u64 kept_total;
  u64 before = block_exclusive_scan(mine, &kept_total, s.scratch);
  const u64 r = min(kept_total - 1, static_cast<u64>(a.uniforms[row] * static_cast<double>(kept_total)));
  if (before <= r && r < before + mine) {
    for (int64_t i = c.first; i < c.end; ++i)
      if (kept(i) && (before += w[i]) > r) {
        *out = SampleResult{static_cast<int32_t>(i), kSampleOk, -1, 0};
        break;
      }
  }
}

}  // namespace

void launch_sample(const SampleArgs& a, int64_t rows, cudaStream_t stream) {
  TWELL_CHECK(rows >= 1 && rows <= INT32_MAX, "launch_sample: rows ", rows);
  TWELL_CHECK(a.n >= 1 && a.n <= (int64_t{1} << 23) && a.n <= a.ld, "launch_sample: n ", a.n, " with ld ", a.ld,
              " (1 to 2^23 logits a row)");
  sample_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(a);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
