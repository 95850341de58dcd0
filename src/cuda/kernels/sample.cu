// Drawing tokens from logits on the GPU, with model::Sampler's rules (model/llama.h,
// src/model/llama_sampling.cpp): greedy, temperature, top-k (ties at the cut kept), top-p (the
// shortest prefix, in the order logit descending then id ascending, whose mass reaches top_p), min-p
// (a weight of at least min_p, the top token's being 1), and the draw in id order; the repetition
// penalty on a copy of the rows before (launch_repetition_penalty). A cluster of 8 blocks a row, each
// reading an eighth of it (one SM reading a whole row of 49152 took ~10 µs a pass, 154 µs at top-p;
// the cluster, 77): the blocks combine
// their reductions and histograms in distributed shared memory and all take the same decisions.
// What leaves the GPU is the token.
//
// The softmax weights w = exp(logit / T − max / T) are computed in double as the host does, then
// held as fixed-point integers (w · 2^40, rounded): every sum of them is then exact and the same
// in any order, so a row's token does not depend on how the threads' atomics interleave. The
// thresholds are found without sorting: the in-play logits are bucketed by value (2048 buckets
// between their least and greatest), the bucket where the measure (a count for top-k, the weight
// for top-p) reaches its target is kept, and the bucketing repeats inside it until one value is
// left. A row of a model's logits takes 2-4 rounds (floats spread over their whole range up to ~26).
#include <cfloat>
#include <cmath>
#include <cstdint>

#include <cooperative_groups.h>

#include "cuda/kernels.h"

namespace twell::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kCluster = 8;  // blocks a row, in one cluster (each reads an eighth of the row)
constexpr int kThreads = 512;  // 128 registers a thread: the passes' batches stay in registers
constexpr int kWarps = kThreads / 32;
static_assert(kWarps <= 32 && (kWarps & (kWarps - 1)) == 0, "the block reductions take a power of two warps, at most 32");
constexpr int kBuckets = 2048;
constexpr int kBucketsPerThread = kBuckets / kThreads;
constexpr double kWeightScale = 0x1p40;  // sums of up to 2^23 weights fit in 64 bits
constexpr int kMaxRounds = 64;           // a range narrows ~2047-fold a round: 2-4 for a model's logits, <= ~26 at worst
using u64 = unsigned long long;

struct ArgMax {
  float v;
  int64_t i;
};
__device__ ArgMax better(ArgMax a, ArgMax b) { return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }

// Warp shuffles of any value of 32-bit words: `shuffle` moves one word (all lanes call it).
template <class T, class Shuffle>
__device__ T shuffled(T v, Shuffle shuffle) {
  static_assert(sizeof(T) % 4 == 0, "shuffled by 32-bit words");
  union {
    T t;
    int w[sizeof(T) / 4];
  } u;
  u.t = v;
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(T) / 4); ++k) u.w[k] = shuffle(u.w[k]);
  return u.t;
}
template <class T>
__device__ T shfl_xor(T v, int mask) {
  return shuffled(v, [mask](int w) { return __shfl_xor_sync(~0u, w, mask); });
}
template <class T>
__device__ T shfl_from(T v, int lane) {
  return shuffled(v, [lane](int w) { return __shfl_sync(~0u, w, lane); });
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
  v = s[lane % kWarps];  // lanes 0 .. kWarps-1 reduce the warps' values (the others, copies)
#pragma unroll
  for (int m = kWarps / 2; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
  v = shfl_from(v, 0);
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
  u64 w = lane < kWarps ? s[lane] : 0, winc = w;
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

// Loads in flight a thread in the passes over a row: a pass is bound by the L2's latency.
constexpr int kBatch = 8;
constexpr int kSegment = kBuckets / kCluster;  // buckets each block merges over the cluster

struct Shared {
  alignas(16) unsigned char scratch[kWarps * 16];
  alignas(16) unsigned char part[16];  // this block's value in a reduction over the cluster
  u64 mass[kBuckets];                  // this block's histogram: mass, least and greatest logit
  unsigned key_min[kBuckets], key_max[kBuckets];
  u64 merged_mass[kSegment];           // the cluster's histogram, buckets rank·kSegment + [0, kSegment)
  unsigned merged_min[kSegment], merged_max[kSegment];
  int cut;
  u64 acc;
  unsigned cut_min, cut_max;
  u64 found;
};

// A float's bits as an unsigned integer in the floats' order (-0 just below +0; no NaN here).
__device__ unsigned order_key(float v) {
  const unsigned b = __float_as_uint(v);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}
__device__ float key_value(unsigned k) { return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k); }

__device__ int bucket_of(double v, double hi, double scale) {
  return min(kBuckets - 1, static_cast<int>((hi - v) * scale));
}

// The row's ids a block of the cluster reads: a contiguous slice, a multiple of 32 long (the
// searches in id order take the blocks in rank order).
struct Slice {
  int64_t first, end;
  __device__ Slice(int64_t n, unsigned rank) {
    const int64_t per = (n + kCluster * 32 - 1) / (kCluster * 32) * 32;
    first = min(n, static_cast<int64_t>(rank) * per);
    end = min(n, first + per);
  }
};

// op over the v of every thread of the cluster, on every thread. Ranks are combined in order.
template <class T, class Op>
__device__ T cluster_reduce(T v, Op op, Shared& s) {
  static_assert(sizeof(T) <= sizeof(s.part), "one value a block");
  cg::cluster_group cluster = cg::this_cluster();
  v = block_reduce(v, op, s.scratch);
  T* part = reinterpret_cast<T*>(s.part);
  if (threadIdx.x == 0) *part = v;
  cluster.sync();
  T r = *cluster.map_shared_rank(part, 0);
#pragma unroll
  for (int k = 1; k < kCluster; ++k) r = op(r, *cluster.map_shared_rank(part, k));
  cluster.sync();  // part is reused
  return r;
}

// The sum of the blocks' `value` (one a block) before this block in rank order, and the total.
__device__ u64 cluster_exclusive_scan(u64 value, u64* total, Shared& s) {
  cg::cluster_group cluster = cg::this_cluster();
  u64* part = reinterpret_cast<u64*>(s.part);
  if (threadIdx.x == 0) *part = value;
  cluster.sync();
  u64 before = 0, all = 0;
  const unsigned rank = cluster.block_rank();
#pragma unroll
  for (int k = 0; k < kCluster; ++k) {
    const u64 x = *cluster.map_shared_rank(part, k);
    before += static_cast<unsigned>(k) < rank ? x : 0;
    all += x;
  }
  cluster.sync();
  *total = all;
  return before;
}

// Adds measure m of logit v to bucket b of the block's histogram (mass, least and greatest logit),
// with one set of atomics for each bucket a warp adds to: lanes of one bucket are reduced first,
// as a row whose logits crowd a few buckets would otherwise serialise on them. Called by all 32
// lanes; b < 0 adds nothing. m < 2^41 (a weight, at most 2^40, or a count).
__device__ void add_to_bucket(int b, u64 m, float v, Shared& s) {
  const unsigned peers = __match_any_sync(~0u, b);
  if (b < 0) return;
  u64 sum = m;
  unsigned kmin = order_key(v), kmax = kmin;
  if (peers != (1u << (threadIdx.x % 32))) {  // 21-bit halves: 32 of them sum to 26 bits
    const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(m & 0x1fffff));
    const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(m >> 21));
    sum = (static_cast<u64>(hi) << 21) + lo;
    kmin = __reduce_min_sync(peers, kmin);
    kmax = __reduce_max_sync(peers, kmax);
  }
  if (static_cast<int>(threadIdx.x % 32) == __ffs(peers) - 1) {
    atomicAdd(&s.mass[b], sum);
    atomicMin(&s.key_min[b], kmin);
    atomicMax(&s.key_max[b], kmax);
  }
}

// The value v* of the row's logits in [lo, hi] at which their measure, accumulated from the
// greatest down, reaches `target`: measure(> v*) < target ≤ measure(≥ v*), given measure(≥ lo) ≥
// target. `measure(i)` is an element's (called only for elements in [lo, hi]; those of measure 0
// are left out). *above receives measure(> v*). Each round is one pass over the block's slice:
// the blocks' histograms are merged in distributed shared memory (each block merges a segment),
// every block finds the same cut from the merged masses, and the cut bucket's least and greatest
// logit bound the next round. Returns false (in every block) if it did not converge.
template <class Measure>
__device__ bool select_value(const float* l, const Slice& sl, double lo, double hi, u64 target, Measure measure,
                             double* value, u64* above, Shared& s) {
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  u64 acc = 0;
  for (int round = 0; lo != hi; ++round) {
    if (round == kMaxRounds) return false;
    const double scale = (kBuckets - 1) / (hi - lo);
    for (int b = threadIdx.x; b < kBuckets; b += kThreads) s.mass[b] = 0, s.key_min[b] = ~0u, s.key_max[b] = 0;
    if (threadIdx.x == 0) s.cut = -1;
    __syncthreads();
    for (int64_t base = sl.first + threadIdx.x; base - threadIdx.x < sl.end; base += kThreads * kBatch) {
      float v[kBatch];  // every lane runs to the end: add_to_bucket is warp-wide
      u64 m[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t i = base + k * kThreads;
        v[k] = i < sl.end ? l[i] : -HUGE_VALF;
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) m[k] = v[k] >= lo && v[k] <= hi ? measure(base + k * kThreads) : 0;
#pragma unroll
      for (int k = 0; k < kBatch; ++k)  // after the first round most warps have nothing in play
        if (__any_sync(~0u, m[k] != 0)) add_to_bucket(m[k] ? bucket_of(v[k], hi, scale) : -1, m[k], v[k], s);
    }
    cluster.sync();  // every block's histogram is complete
    for (int t = threadIdx.x; t < kSegment; t += kThreads) {
      const int b = static_cast<int>(rank) * kSegment + t;
      u64 m = 0;
      unsigned kmin = ~0u, kmax = 0;
#pragma unroll
      for (int k = 0; k < kCluster; ++k) {
        const Shared& o = *cluster.map_shared_rank(&s, k);
        m += o.mass[b];
        kmin = min(kmin, o.key_min[b]);
        kmax = max(kmax, o.key_max[b]);
      }
      s.merged_mass[t] = m, s.merged_min[t] = kmin, s.merged_max[t] = kmax;
    }
    cluster.sync();  // every segment is merged; no block's histogram is read again this round
    // The bucket where acc + (mass before it) < target ≤ acc + (mass up to it): exactly one.
    u64 mine[kBucketsPerThread], sum = 0;
#pragma unroll
    for (int k = 0; k < kBucketsPerThread; ++k) {
      const int b = threadIdx.x * kBucketsPerThread + k;
      sum += (mine[k] = cluster.map_shared_rank(&s, b / kSegment)->merged_mass[b % kSegment]);
    }
    u64 total;
    u64 before = acc + block_exclusive_scan(sum, &total, s.scratch);
#pragma unroll
    for (int k = 0; k < kBucketsPerThread; ++k) {
      if (before < target && before + mine[k] >= target) {
        const int b = threadIdx.x * kBucketsPerThread + k;
        const Shared& o = *cluster.map_shared_rank(&s, b / kSegment);
        s.cut = b, s.acc = before, s.cut_min = o.merged_min[b % kSegment], s.cut_max = o.merged_max[b % kSegment];
      }
      before += mine[k];
    }
    __syncthreads();
    const int cut = s.cut;
    acc = s.acc;
    lo = key_value(s.cut_min), hi = key_value(s.cut_max);
    cluster.sync();  // the merged segments are overwritten next round; s.cut is reset
    if (cut < 0) return false;  // the measure did not reach the target: cannot happen
  }
  *value = lo;
  *above = acc;
  return true;
}

// Searches in id order. In its block's slice, warp w takes the ids [first, end), contiguous, and
// reads them 32 at a time (coalesced), keeping a running sum.
struct WarpRange {
  int64_t first, end;
  __device__ explicit WarpRange(const Slice& sl) {
    const int64_t per = (sl.end - sl.first + kThreads - 1) / kThreads * 32;
    first = min(sl.end, sl.first + static_cast<int64_t>(threadIdx.x / 32) * per);
    end = min(sl.end, first + per);
  }
};

// The sum of f over the warp's range, on every lane.
template <class F>
__device__ u64 warp_range_sum(const WarpRange& w, F f) {
  u64 sum = 0;
  for (int64_t base = w.first + threadIdx.x % 32; base < w.end; base += 32 * kBatch) {
    u64 x[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) x[k] = base + 32 * k < w.end ? f(base + 32 * k) : 0;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) sum += x[k];
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(~0u, sum, m);
  return sum;
}

// The sum of f over the whole row, on every thread of the cluster; `warp_sum`: warp_range_sum.
__device__ u64 row_sum(u64 warp_sum, Shared& s) {
  u64 block_total, total;
  block_exclusive_scan(threadIdx.x % 32 == 0 ? warp_sum : 0, &block_total, s.scratch);
  cluster_exclusive_scan(block_total, &total, s);
  return total;
}

// The first id at which the running sum of f, in id order over the whole row, exceeds r (less than
// the row's total), or -1 if none does (cannot happen), on every thread of the cluster: the warp
// whose range holds it finds it and writes it to every block. `warp_sum`: warp_range_sum(w, f).
template <class F>
__device__ int64_t first_past(const WarpRange& w, u64 warp_sum, u64 r, F f, Shared& s) {
  cg::cluster_group cluster = cg::this_cluster();
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) s.found = ~0ull;  // before the cluster barriers below, so before any write
  u64 block_total, cluster_total;
  const u64 in_block = __shfl_sync(~0u, block_exclusive_scan(lane == 0 ? warp_sum : 0, &block_total, s.scratch), 0);
  u64 before = cluster_exclusive_scan(block_total, &cluster_total, s) + in_block;
  if (before <= r && r < before + warp_sum) {
    bool found = false;
    for (int64_t base = w.first; base < w.end && !found; base += 32 * kBatch) {
      u64 x[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t i = base + 32 * k + lane;
        x[k] = i < w.end ? f(i) : 0;
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        u64 inc = x[k];
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
          const u64 o = __shfl_up_sync(~0u, inc, d);
          if (lane >= d) inc += o;
        }
        const unsigned hit = __ballot_sync(~0u, !found && x[k] > 0 && before + inc > r);
        if (hit && lane < kCluster)  // to every block
          *cluster.map_shared_rank(&s.found, lane) = static_cast<u64>(base + 32 * k + __ffs(hit) - 1);
        found |= hit != 0;
        before += __shfl_sync(~0u, inc, 31);
      }
    }
  }
  cluster.sync();
  const int64_t id = static_cast<int64_t>(s.found);
  __syncthreads();
  return id;
}

// Calls f(i, l[i]) for every id i of the block's slice, kBatch loads in flight at a time.
template <class F>
__device__ void for_each_logit(const float* l, const Slice& sl, F f) {
  for (int64_t base = sl.first + threadIdx.x; base < sl.end; base += kThreads * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) v[k] = base + k * kThreads < sl.end ? l[base + k * kThreads] : -HUGE_VALF;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t i = base + k * kThreads;
      if (i >= sl.end) break;
      f(i, v[k]);
    }
  }
}

// The fixed-point weight of logit v: round(exp(v / T − max / T) · 2^40). The product is rounded
// before the subtraction, as on the host: contracted into an FMA, the max's own weight would be
// exp(its product's rounding error), which at T = 1e-300 is exp(±1e284). Below −29 the weight is
// under 0.3 and rounds to 0 without the exp.
__device__ u64 weight_of(double v, double inv_t, double top) {
  const double x = __dmul_rn(v, inv_t) - top;
  return x < -29 ? 0 : __double2ull_rn(exp(x) * kWeightScale);
}

__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads) sample_kernel(const SampleArgs a) {
  __shared__ Shared s;
  const int64_t row = blockIdx.x / kCluster, n = a.n;
  const Slice sl(n, cg::this_cluster().block_rank());
  const float* l = a.logits + row * a.ld;
  u64* w = a.weights + row * n;
  SampleResult* out = a.results + row;
  const bool lead = threadIdx.x == 0 && cg::this_cluster().block_rank() == 0;

  // The argmax (lowest id on ties), the first NaN or +inf, the least finite logit, how many are
  // more than -inf.
  ArgMax best{-HUGE_VALF, INT64_MAX};
  int64_t bad = INT64_MAX, alive = 0;
  float least = HUGE_VALF;
  for_each_logit(l, sl, [&](int64_t i, float v) {
    if (!(v < HUGE_VALF)) {
      bad = min(bad, i);
    } else {
      best = better(best, ArgMax{v, i});
      if (v > -HUGE_VALF) ++alive, least = fminf(least, v);
    }
  });
  best = cluster_reduce(best, better, s);
  bad = cluster_reduce(bad, [](int64_t x, int64_t y) { return min(x, y); }, s);
  alive = cluster_reduce(alive, [](int64_t x, int64_t y) { return x + y; }, s);
  least = cluster_reduce(least, [](float x, float y) { return fminf(x, y); }, s);
  if (bad != INT64_MAX || alive == 0) {
    if (lead) *out = bad != INT64_MAX ? SampleResult{-1, kSampleBadLogit, bad, l[bad]} : SampleResult{-1, kSampleAllRuledOut, -1, 0};
    return;
  }
  const double inv_t = a.temperature > 0 ? 1.0 / a.temperature : 0.0, top = __dmul_rn(best.v, inv_t);
  if (a.temperature == 0 || !isfinite(top) || !isfinite(inv_t)) {  // greedy (or weights that would be NaN)
    if (lead) *out = SampleResult{static_cast<int32_t>(best.i), kSampleOk, -1, 0};
    return;
  }
  // Every block takes the same branches from here (their values are the cluster's), so all reach
  // each cluster barrier.
  const auto fail = [&](int stage) {
    if (lead) *out = SampleResult{-1, kSampleNoConvergence, stage, 0};
  };

  // top-k: the k-th greatest logit is the floor. Where k reaches the count of logits above -inf there is
  // none (the host's selection, counting the -inf ones, finds -inf there: the same candidates).
  double floor = -HUGE_VAL;
  if (a.top_k > 0 && a.top_k < alive) {
    u64 unused;
    if (!select_value(l, sl, least, best.v, static_cast<u64>(a.top_k), [](int64_t) -> u64 { return 1; }, &floor,
                      &unused, s))
      return fail(0);
  }
  const double lo = floor > -HUGE_VAL ? floor : static_cast<double>(least);

  // The candidates' weights (0 for the others), each block its slice.
  u64 total = 0;
  for_each_logit(l, sl, [&](int64_t i, float v) {
    const u64 wi = v >= lo ? weight_of(v, inv_t, top) : 0;
    w[i] = wi;
    total += wi;
  });
  total = cluster_reduce(total, [](u64 x, u64 y) { return x + y; }, s);

  // top-p: the nucleus is every candidate above v*, and the first `need` of those at v* in id order.
  const WarpRange wr(sl);
  double cut_value = -HUGE_VAL;  // kept: above it, or equal to it with an id ≤ cut_id
  int64_t cut_id = INT64_MAX;
  if (a.top_p < 1) {
    u64 target = min(total, static_cast<u64>(ceil(a.top_p * static_cast<double>(total))));
    if (target == 0) target = 1;
    u64 above;
    // Below (top − 29)·T a weight rounds to 0 (under 2^-41): such logits add nothing, and left out
    // of the range they do not crowd the buckets. (Clamped: the division may round past the max.)
    const double lo_p = fmin(fmax(lo, (top - 29.0) / inv_t), static_cast<double>(best.v));
    if (!select_value(l, sl, lo_p, best.v, target, [w](int64_t i) { return w[i]; }, &cut_value, &above, s))
      return fail(1);
    const float vstar = static_cast<float>(cut_value);
    const auto tied = [&](int64_t i) -> u64 { return l[i] == vstar; };
    const u64 n_tied = warp_range_sum(wr, tied);
    const u64 all_tied = row_sum(n_tied, s);
    const u64 w_star = weight_of(vstar, inv_t, top);  // the ties' weight, > 0 (they carry the cut)
    // The nucleus ends at the `need`-th tie in id order (need ≥ 1: above < target).
    const u64 need = w_star ? min(all_tied, (target - above + w_star - 1) / w_star) : all_tied;
    if (need == 0) return fail(2);
    cut_id = first_past(wr, n_tied, need - 1, tied, s);
    if (cut_id < 0) return fail(3);
  }

  // The draw: r in [0, kept mass), and the first kept id whose prefix mass passes r. min-p keeps a
  // weight of at least min_p · 2^40 (the top token's is 2^40), after the nucleus as HF applies it.
  // Rounded as the weights are, so the host's and these decisions part only within exp()'s last bit
  // (CUDA's and the host's) of min_p, as the draw's own boundaries do.
  const u64 min_w = __double2ull_rn(a.min_p * kWeightScale);
  const auto kept_weight = [&](int64_t i) -> u64 {
    const double v = l[i];
    return (v > cut_value || (v == cut_value && i <= cut_id)) && w[i] >= min_w ? w[i] : 0;
  };
  const u64 mine = warp_range_sum(wr, kept_weight);
  const u64 kept_total = row_sum(mine, s);
  if (kept_total == 0) return fail(4);
  const double u = gridDim.x / kCluster <= kSampleInlineRows ? a.inline_uniforms[row] : a.uniforms[row];
  const u64 r = min(kept_total - 1, static_cast<u64>(u * static_cast<double>(kept_total)));
  const int64_t id = first_past(wr, mine, r, kept_weight, s);
  if (id < 0) return fail(5);
  if (lead) *out = SampleResult{static_cast<int32_t>(id), kSampleOk, -1, 0};
}

__global__ void repetition_penalty_kernel(float* out, int64_t n, const int64_t* offsets, const int32_t* ids,
                                          float penalty) {
  float* row = out + static_cast<int64_t>(blockIdx.x) * n;
  for (int64_t k = offsets[blockIdx.x] + threadIdx.x; k < offsets[blockIdx.x + 1]; k += blockDim.x) {
    const float v = row[ids[k]];
    row[ids[k]] = v < 0 ? __fmul_rn(v, penalty) : __fdiv_rn(v, penalty);
  }
}

}  // namespace

void launch_repetition_penalty(float* out, int64_t n, int64_t rows, const int64_t* offsets, const int32_t* ids,
                               float penalty, cudaStream_t stream) {
  TWELL_CHECK(rows >= 1 && rows <= INT32_MAX && n >= 1, "launch_repetition_penalty: rows ", rows, ", n ", n);
  repetition_penalty_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(out, n, offsets, ids, penalty);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

bool sample_kernel_runs(std::string* why) {
  cudaLaunchConfig_t config = {};  // the cluster's shape is the kernel's own (__cluster_dims__)
  config.gridDim = dim3(kCluster);
  config.blockDim = dim3(kThreads);
  int clusters = 0;
  const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, sample_kernel, &config);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    if (why) *why = str("the sampling kernel's occupancy query failed: ", cudaGetErrorString(err));
    return false;
  }
  if (clusters < 1) {
    if (why) *why = str("a cluster of ", kCluster, " blocks of ", kThreads, " threads does not fit on this GPU");
    return false;
  }
  return true;
}

void launch_sample(const SampleArgs& a, int64_t rows, cudaStream_t stream) {
  TWELL_CHECK(rows >= 1 && rows <= INT32_MAX, "launch_sample: rows ", rows);
  TWELL_CHECK(a.n >= 1 && a.n <= (int64_t{1} << 23) && a.n <= a.ld, "launch_sample: n ", a.n, " with ld ", a.ld,
              " (1 to 2^23 logits a row)");
  TWELL_CHECK(rows <= INT32_MAX / kCluster, "launch_sample: rows ", rows);
  sample_kernel<<<static_cast<unsigned>(rows * kCluster), kThreads, 0, stream>>>(a);
  TWELL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace twell::cuda
