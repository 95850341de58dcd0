// Micro-benchmark: is the dense baseline as fast as cuBLASLt can make it?
//
// The dense FFN that every twell ratio divides by runs each GEMM with the first algorithm of
// cuBLASLt's heuristics (src/cuda/cublaslt_gemm.cpp), and the gate and the up products as two
// GEMMs. Two ways it could be faster, both measured here for the FFN's GEMMs (H = 2048, I = 5632,
// bf16, fp32 accumulation):
//   1. another of the heuristic's algorithms (up to 16 are asked for and each is timed: autotune);
//   2. the gate and up products as one GEMM over the stacked weights [Wg; Wu] (N = 2I; the ReLU
//      would then move into the product kernel, which reads both halves anyway).
// The model's attention output projection (N = K = H) is timed the same way.
// Each algorithm's output is checked first: 128 sampled entries against float64, and every 64th
// row against the first algorithm's (the sums may be ordered differently, so not bitwise). Then each
// is timed back to back (2 warm-ups, the median of 15 calls at M ≥ 65536, of 40 below; CUDA events), and the fastest against
// the first is re-timed alternately, call by call, so that both run at one clock (at these sizes
// the board sits at its power cap).
// Built as twell_micro_lt_algos with TWELL_CUDA; run: twell_micro_lt_algos [M ...] (default 16384
// and 131072).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

#define CHECK_CUDA(e)                                                                        \
  do {                                                                                       \
    cudaError_t s_ = (e);                                                                    \
    if (s_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #e, cudaGetErrorString(s_)); \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)
#define CHECK_LT(e)                                                                        \
  do {                                                                                     \
    cublasStatus_t s_ = (e);                                                               \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #e, cublasLtGetStatusName(s_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

constexpr int64_t kH = 2048, kI = 5632;
constexpr size_t kWorkspace = 64u << 20;  // as LtGemm's
constexpr int kMaxAlgos = 16, kSamples = 128;
constexpr int64_t kRowStride = 64;  // the outputs are compared on every 64th row

float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

struct Gemm {
  const char* name;
  int64_t m, n, k;
  bool b_transposed;  // C[M, N] = A[M, K] · B[N, K]ᵀ (true) or A[M, K] · B[K, N] (false)
  bool relu;
};

struct Result {
  double ms = 0;
  double err = 0;       // against float64, sampled
  double vs_first = 0;  // against the first algorithm's output, every kRowStride-th row
  bool ok = false;
};

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class Problem {
 public:
  Problem(cublasLtHandle_t lt, const Gemm& g, uint64_t seed) : lt_(lt), g_(g) {
    const int64_t a_elems = g.m * g.k, b_elems = g.n * g.k;
    a_host_.resize(static_cast<size_t>(a_elems));
    b_host_.resize(static_cast<size_t>(b_elems));
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& v : a_host_) v = float_to_bf16(u(rng));
    for (auto& v : b_host_) v = float_to_bf16(0.05f * u(rng));
    CHECK_CUDA(cudaMalloc(&a_, a_elems * 2));
    CHECK_CUDA(cudaMalloc(&b_, b_elems * 2));
    CHECK_CUDA(cudaMalloc(&c_, g.m * g.n * 2));
    CHECK_CUDA(cudaMalloc(&c_first_, g.m * g.n * 2));
    CHECK_CUDA(cudaMalloc(&ws_, kWorkspace));
    CHECK_CUDA(cudaMemcpy(a_, a_host_.data(), a_elems * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(b_, b_host_.data(), b_elems * 2, cudaMemcpyHostToDevice));
    // Column-major view, as LtGemm: Cᵀ[N, M] = op(B) · Aᵀ.
    CHECK_LT(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_b = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, op_n = CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
    const cublasLtEpilogue_t e = g.relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    if (g.b_transposed)
      CHECK_LT(cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, g.k, g.n, g.k));
    else
      CHECK_LT(cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, g.n, g.k, g.n));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb_, CUDA_R_16BF, g.k, g.m, g.k));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc_, CUDA_R_16BF, g.n, g.m, g.n));
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspace;
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res[kMaxAlgos];
    int found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt_, desc_, la_, lb_, lc_, lc_, pref, kMaxAlgos, res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < found; ++i) algos_.push_back(res[i].algo);
    CHECK_CUDA(cudaEventCreate(&e0_));
    CHECK_CUDA(cudaEventCreate(&e1_));
  }
  ~Problem() {
    cudaFree(a_), cudaFree(b_), cudaFree(c_), cudaFree(c_first_), cudaFree(ws_);
    cublasLtMatrixLayoutDestroy(la_), cublasLtMatrixLayoutDestroy(lb_), cublasLtMatrixLayoutDestroy(lc_);
    cublasLtMatmulDescDestroy(desc_);
    cudaEventDestroy(e0_), cudaEventDestroy(e1_);
  }

  size_t algos() const { return algos_.size(); }

  bool run(size_t i, void* c) {
    const float alpha = 1.f, beta = 0.f;
    return cublasLtMatmul(lt_, desc_, &alpha, b_, la_, a_, lb_, &beta, c, lc_, c, lc_, &algos_[i], ws_, kWorkspace,
                          nullptr) == CUBLAS_STATUS_SUCCESS;
  }

  float time_one(size_t i) {
    CHECK_CUDA(cudaEventRecord(e0_));
    run(i, c_);
    CHECK_CUDA(cudaEventRecord(e1_));
    CHECK_CUDA(cudaEventSynchronize(e1_));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0_, e1_));
    return ms;
  }

  // Correctness first, then the time of back-to-back calls.
  Result measure(size_t i, int iters) {
    Result r;
    if (!run(i, i == 0 ? c_first_ : c_)) return r;
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<uint16_t> c = rows_of(i == 0 ? c_first_ : c_);
    r.err = sampled_error(c);
    if (i > 0) {
      const std::vector<uint16_t> first = rows_of(c_first_);
      double num = 0, den = 0;
      for (size_t j = 0; j < c.size(); ++j) {
        const double d = double(bf16_to_float(c[j])) - bf16_to_float(first[j]);
        num += d * d, den += double(bf16_to_float(first[j])) * bf16_to_float(first[j]);
      }
      r.vs_first = std::sqrt(num / std::max(den, 1e-300));
    }
    r.ok = std::isfinite(r.err) && r.err < 1e-2 && std::isfinite(r.vs_first) && r.vs_first < 1e-2;
    if (!r.ok) return r;
    for (int w = 0; w < 2; ++w) time_one(i);
    std::vector<float> t;
    for (int it = 0; it < iters; ++it) t.push_back(time_one(i));
    r.ms = median(t);
    return r;
  }

  // Two algorithms alternated call by call: medians of each.
  std::pair<double, double> alternate(size_t a, size_t b, int iters) {
    std::vector<float> ta, tb;
    for (int w = 0; w < 2; ++w) time_one(a), time_one(b);
    for (int it = 0; it < iters; ++it) {
      if (it % 2 == 0) {
        ta.push_back(time_one(a)), tb.push_back(time_one(b));
      } else {
        tb.push_back(time_one(b)), ta.push_back(time_one(a));
      }
    }
    return {median(ta), median(tb)};
  }

  std::string describe(size_t i) const {
    int id = -1, tile = -1, stages = -1;
    size_t size = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algos_[i], CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &size);
    cublasLtMatmulAlgoConfigGetAttribute(&algos_[i], CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &size);
    cublasLtMatmulAlgoConfigGetAttribute(&algos_[i], CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &size);
    char buf[96];
    std::snprintf(buf, sizeof buf, "algo %d tile %d stages %d", id, tile, stages);
    return buf;
  }

 private:
  // Every kRowStride-th row of an output [M, N] (row-major bf16), to the host.
  std::vector<uint16_t> rows_of(const void* c) const {
    const int64_t rows = (g_.m + kRowStride - 1) / kRowStride;
    std::vector<uint16_t> out(static_cast<size_t>(rows * g_.n));
    CHECK_CUDA(cudaMemcpy2D(out.data(), g_.n * 2, c, kRowStride * g_.n * 2, g_.n * 2, rows, cudaMemcpyDeviceToHost));
    return out;
  }

  // Relative error (root of the summed squares) of sampled entries of those rows against float64.
  double sampled_error(const std::vector<uint16_t>& c) const {
    std::mt19937_64 rng(7);
    double num = 0, den = 0;
    for (int s = 0; s < kSamples; ++s) {
      const int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>((g_.m + kRowStride - 1) / kRowStride));
      const int64_t row = r * kRowStride;
      const int64_t col = static_cast<int64_t>(rng() % static_cast<uint64_t>(g_.n));
      double ref = 0;
      for (int64_t kk = 0; kk < g_.k; ++kk) {
        const double b = g_.b_transposed ? bf16_to_float(b_host_[static_cast<size_t>(col * g_.k + kk)])
                                         : bf16_to_float(b_host_[static_cast<size_t>(kk * g_.n + col)]);
        ref += double(bf16_to_float(a_host_[static_cast<size_t>(row * g_.k + kk)])) * b;
      }
      if (g_.relu) ref = std::max(ref, 0.0);
      const double got = bf16_to_float(c[static_cast<size_t>(r * g_.n + col)]);
      num += (got - ref) * (got - ref), den += ref * ref;
    }
    return std::sqrt(num / std::max(den, 1e-300));
  }

  cublasLtHandle_t lt_;
  Gemm g_;
  std::vector<uint16_t> a_host_, b_host_;
  void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr, *c_first_ = nullptr, *ws_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos_;
  cudaEvent_t e0_{}, e1_{};
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ms;
  for (int i = 1; i < argc; ++i) ms.push_back(std::atoll(argv[i]));
  if (ms.empty()) ms = {16384, 131072};
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, cuBLASLt %zu\n", prop.name, cublasLtGetVersion());
  bool all_ok = true;
  for (const int64_t m : ms) {
    const int iters = m >= 65536 ? 15 : 40;
    const Gemm gemms[] = {{"gate+relu", m, kI, kH, true, true},
                          {"up", m, kI, kH, true, false},
                          {"down", m, kH, kI, false, false},
                          {"stacked gate|up", m, 2 * kI, kH, true, false},
                          {"attention output (O)", m, kH, kH, true, false}};
    double first_sum = 0, best_sum = 0;
    for (const Gemm& g : gemms) {
      Problem p(lt, g, 1234 + static_cast<uint64_t>(m));
      std::printf("\nM = %lld, %s (N = %lld, K = %lld): %zu algorithms\n", static_cast<long long>(m), g.name,
                  static_cast<long long>(g.n), static_cast<long long>(g.k), p.algos());
      size_t best = 0;
      double best_ms = 1e300, first_ms = 0;
      for (size_t i = 0; i < p.algos(); ++i) {
        const Result r = p.measure(i, iters);
        std::printf("  #%-2zu %-32s %s  err %.2e  vs #0 %.2e  %8.3f ms\n", i, p.describe(i).c_str(),
                    r.ok ? "ok  " : "FAIL", r.err, r.vs_first, r.ms);
        if (i == 0 && !r.ok) all_ok = false;
        if (!r.ok) continue;
        if (i == 0) first_ms = r.ms;
        if (r.ms < best_ms) best_ms = r.ms, best = i;
      }
      if (best != 0) {
        const auto [t_first, t_best] = p.alternate(0, best, 2 * iters);
        std::printf("  alternated: #0 %.3f ms, #%zu %.3f ms (%.3fx)\n", t_first, best, t_best, t_best / t_first);
        first_ms = t_first, best_ms = t_best;
      }
      if (g.n == 2 * kI) {
        std::printf("  => gate + up as two GEMMs: #0 %.3f ms, best %.3f ms; stacked: #0 %.3f ms, best %.3f ms\n",
                    first_sum, best_sum, first_ms, best_ms);
      } else if (g.n == kI) {
        first_sum += first_ms, best_sum += best_ms;
      }
    }
  }
  cublasLtDestroy(lt);
  return all_ok ? 0 : 1;
}
