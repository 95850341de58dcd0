// twell::cuda::FfnForward against the CPU reference: sparse, dense and auto-dispatched paths, at
// every standard density, uniform and skewed, at awkward shapes (M = 1, M not a multiple of any
// tile, I with a partial last tile), with poisoned outputs; plus determinism and bad input; and
// FfnForward::backward against the CPU reference backward.
//
// Tolerance: the GPU computes the same roundings in another summation order (cuBLAS GEMMs, warp
// reductions), so a bf16 rounding of g or u can land one ulp (2^-8 relative) away and a
// pre-activation within rounding of 0 can switch the active set. The criterion of DESIGN.md §5:
// relative error against float64 at most twice the CPU bf16 pipeline's (plus a 1e-4 floor for
// outputs that are nearly exact), and element-wise |gpu − cpu| ≤ 0.05·rms(y) + 0.02·|cpu|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "common/compare.h"
#include "common/random.h"
#include "cuda/cublaslt_gemm.h"
#include "cuda/kernels.h"
#include "cuda/kernels/bulk_copy.cuh"
#include "core/io_test_util.h"
#include "gpu_test.h"
#include "synthetic.h"
#include "twell/cpu/ffn.h"
#include "twell/cuda/ffn.h"

namespace twell {
namespace {

using cuda::DeviceTensor;
using cuda::Dispatch;

struct FfnCase {
  int64_t M, H, I;
  double density;
  bool skewed;
  bool gated;
  int32_t tile = 256, compression = 8;  // TwELL layout
};

std::string case_name(const testing::TestParamInfo<FfnCase>& info) {
  const auto& c = info.param;
  return str("M", c.M, "_H", c.H, "_I", c.I, "_d", static_cast<int>(std::lround(c.density * 1000)), "permille_",
             c.skewed ? "skewed" : "uniform", c.gated ? "_gated" : "_plain",
             c.tile != 256 || c.compression != 8 ? str("_T", c.tile, "C", c.compression) : std::string());
}

double rms(const TensorView& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += load_as_double(t, i) * load_as_double(t, i);
  return std::sqrt(s / std::max<int64_t>(t.numel(), 1));
}

// forward() with a ResidualNorm on the path `ffn` takes (on the sparse path the down pass does the
// step): the residual must be r + bf16(y) exactly, with y the same call's output without it (the
// paths are deterministic), and normed within one bf16 rounding of float64's norm of that
// residual (the f32 sum of squares in another order may move a rounding). `ffn` has run before
// on x, so a sampling dispatch takes the path it took last.
void expect_residual_norm(cuda::FfnForward& ffn, const DeviceTensor& x, const FfnWeights& w, const Tensor& y_ref) {
  SCOPED_TRACE("with the residual add + RMSNorm");
  const int64_t M = y_ref.shape()[0], H = y_ref.shape()[1];
  const float eps = 1e-5f;
  const Tensor r0 = test::random_normal(DType::f32, {M, H}, 2.0, 17);
  const Tensor norm_w = test::random_normal(DType::bf16, {H}, 1.0, 18);
  DeviceTensor resid = DeviceTensor::upload(r0), wn = DeviceTensor::upload(norm_w);
  DeviceTensor normed(DType::bf16, {M, H}), y(DType::bf16, {M, H});
  const cuda::ResidualNorm then{resid.view(), wn.view(), normed.view(), eps};
  cuda::fill_bytes(normed.view().data, normed.nbytes(), 0xff, nullptr);  // poison: NaN
  ffn.forward(x, w, y, nullptr, 0, &then);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor r1 = resid.download(), n1 = normed.download();
  int64_t bad_resid = 0, bad_norm = 0;
  for (int64_t m = 0; m < M; ++m) {
    double sum_sq = 0;
    for (int64_t j = 0; j < H; ++j) {
      const int64_t i = m * H + j;
      const float expect = r0.ptr<float>()[i] + static_cast<float>(y_ref.ptr<bf16>()[i]);
      bad_resid += !(r1.ptr<float>()[i] == expect);
      sum_sq += double(r1.ptr<float>()[i]) * r1.ptr<float>()[i];
    }
    const double inv = 1.0 / std::sqrt(sum_sq / double(H) + eps);
    for (int64_t j = 0; j < H; ++j) {
      const int64_t i = m * H + j;
      const double ref = double(static_cast<float>(norm_w.ptr<bf16>()[j])) * r1.ptr<float>()[i] * inv;
      const double got = static_cast<float>(n1.ptr<bf16>()[i]);
      bad_norm += !(std::abs(got - ref) <= std::abs(ref) / 128 + 1e-30);
    }
  }
  EXPECT_EQ(bad_resid, 0) << "of " << M * H << " residual values";
  EXPECT_EQ(bad_norm, 0) << "of " << M * H << " normed values";
}

class FfnForwardGpu : public testing::TestWithParam<FfnCase> {};

TEST_P(FfnForwardGpu, MatchesCpuReferenceOnEveryPath) {
  TWELL_REQUIRE_HOPPER();
  const FfnCase& c = GetParam();
  bench::SyntheticSpec spec{c.M, c.H, c.I, c.density,
                            c.skewed ? bench::Distribution::skewed : bench::Distribution::uniform, c.gated, 5};
  const bench::SyntheticFfn f = bench::make_synthetic_ffn(spec);

  Tensor y_cpu = Tensor::of<bf16>({c.M, c.H});
  Tensor y64 = Tensor::of<double>({c.M, c.H});
  cpu::ffn_forward(f.x, f.weights(), y_cpu, Precision::bf16);
  cpu::ffn_forward(f.x, f.weights(), y64, Precision::f64);
  const double cpu_err = relative_error(y_cpu, y64);
  const double scale = rms(y_cpu);

  DeviceTensor x = DeviceTensor::upload(f.x);
  DeviceTensor wg = c.gated ? DeviceTensor::upload(f.wg) : DeviceTensor();
  DeviceTensor wu = DeviceTensor::upload(f.wu), wd = DeviceTensor::upload(f.wd);
  const FfnWeights w{c.gated ? wg.view() : TensorView{}, wu.view(), wd.view()};

  // always_sparse three times: TwELL with the fused gate+pack (tile 256 or 176) and with the cuBLASLt
  // gate and the pack kernel, and the gather path (these cases have M <= 300). `previous` runs
  // twice: the first call samples g, the second decides on that (fused gate when sparse).
  struct Run {
    Dispatch d;
    int64_t gather;
    bool fused_gate;
    const char* name;
  };
  const Run runs[] = {{Dispatch::always_sparse, 0, true, "sparse"},
                      {Dispatch::always_sparse, 0, false, "sparse, unfused gate"},
                      {Dispatch::always_sparse, 1024, true, "gather"},
                      {Dispatch::always_dense, 0, true, "dense"},
                      {Dispatch::observe, 0, true, "observe"},
                      {Dispatch::previous, 0, true, "previous, second call"}};
  for (const auto& [d, gather, fused_gate, name] : runs) {
    SCOPED_TRACE(name);
    cuda::FfnOptions o;
    o.dispatch = d;
    o.sparse_min_tokens = 0;
    o.gather_max_tokens = gather;
    o.fused_gate = fused_gate;
    o.tile = c.tile, o.compression = c.compression;
    cuda::FfnForward ffn({c.M, c.H, c.I, c.gated}, o);
    DeviceTensor y(DType::bf16, {c.M, c.H});
    if (d == Dispatch::previous) ffn.forward(x, w, y, nullptr);
    cuda::fill_bytes(y.view().data, y.nbytes(), 0xff, nullptr);  // poison: NaN
    ffn.forward(x, w, y, nullptr);
    TWELL_CUDA_CHECK(cudaDeviceSynchronize());
    const Tensor y_gpu = y.download();
    const double err = relative_error(y_gpu, y64);
    EXPECT_LE(err, 2 * cpu_err + 1e-4) << "cpu bf16 rel_err " << cpu_err;
    EXPECT_TRUE(test::all_close(y_gpu, y_cpu, 0.05 * scale + 1e-6, 0.02));

    const cuda::FfnStats st = ffn.last_stats();
    const bool sampled = d == Dispatch::observe || d == Dispatch::previous;
    EXPECT_EQ(st.path == cuda::FfnPath::dense,
              d == Dispatch::always_dense || (sampled && st.sampled_density >= o.dense_above_density));
    EXPECT_EQ(st.path == cuda::FfnPath::gather, gather > 0);
    if (st.path == cuda::FfnPath::sparse) {
      const TwellMatrix act = ffn.download_activation(nullptr);
      ASSERT_NO_THROW(twell_validate(act));
      EXPECT_EQ(act.nnz(), st.nnz);
      EXPECT_EQ(act.n_backup(), st.spilled_tiles);
    }
    if (d == Dispatch::previous && st.path == cuda::FfnPath::sparse && (c.tile == 256 || c.tile == 176)) {
      // The fused call's sample is its exact density: the next call decides on it.
      ffn.forward(x, w, y, nullptr);
      EXPECT_DOUBLE_EQ(ffn.last_stats().sampled_density, double(st.nnz) / double(c.M * c.I));
    }
    expect_residual_norm(ffn, x, w, y_gpu);
  }
}

std::vector<FfnCase> ffn_cases() {
  std::vector<FfnCase> cases;
  for (double d : {0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0})
    for (bool skewed : {false, true}) cases.push_back({67, 256, 1344, d, skewed, true});
  for (int64_t M : {1, 7, 300}) cases.push_back({M, 512, 1536 + 64, 0.02, true, true});
  cases.push_back({33, 64, 64, 0.2, false, true});     // smallest shape: one partial tile
  cases.push_back({129, 192, 320, 0.13, true, true});  // H not a power of two, partial tile
  cases.push_back({65, 2048, 5632, 0.005, true, true});  // the paper's shape
  cases.push_back({19, 4096, 576, 0.05, true, true});    // widest H the kernels take
  cases.push_back({23, 1088, 704, 0.1, false, true});    // H not a multiple of 256
  for (double d : {0.005, 0.13, 1.0}) cases.push_back({45, 256, 832, d, true, false});  // non-gated
  // Heavy rows (> 128 non-zeros: a block each, warp shares summed in shared memory over the rings).
  cases.push_back({19, 4096, 576, 0.3, true, true});   // at the widest H (8 warps, 16 KB rows)
  cases.push_back({7, 512, 5632, 0.5, false, true});   // a warp's share overflows its list
  cases.push_back({300, 512, 2048, 0.1, true, true, 1024, 16});  // the widest tile the kernels take
  cases.push_back({300, 512, 2048, 0.1, true, true, 128, 4});    // narrow tiles, several per list fill
  // T = 176, the fused gate's 128 x 176 GEMM tiles: the paper's shape (I = 32 x 176), a partial last
  // tile with heavy rows, and spilled tiles at M not a multiple of 128.
  cases.push_back({65, 2048, 5632, 0.005, true, true, 176, 8});
  cases.push_back({300, 512, 1984, 0.02, true, true, 176, 8});
  cases.push_back({67, 256, 1344, 0.5, false, true, 176, 8});
  // I below one 176-wide tile (the default tile at every width since the sixty-eighth session).
  cases.push_back({33, 64, 64, 0.2, false, true, 176, 8});
  cases.push_back({45, 128, 128, 0.1, true, true, 176, 8});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, FfnForwardGpu, testing::ValuesIn(ffn_cases()), case_name);

struct GpuProblem {
  bench::SyntheticFfn f;
  DeviceTensor x, wg, wu, wd, y;
  FfnWeights w() const { return {wg.view(), wu.view(), wd.view()}; }
};

GpuProblem make_problem(int64_t M, int64_t H, int64_t I, double density) {
  GpuProblem p;
  p.f = bench::make_synthetic_ffn({M, H, I, density, bench::Distribution::skewed, true, 9});
  p.x = DeviceTensor::upload(p.f.x);
  p.wg = DeviceTensor::upload(p.f.wg);
  p.wu = DeviceTensor::upload(p.f.wu);
  p.wd = DeviceTensor::upload(p.f.wd);
  p.y = DeviceTensor(DType::bf16, {M, H});
  return p;
}

// Runs `ffn` on `q` twice, poisoning y in between; the two outputs must be the same bits.
void expect_repeatable(cuda::FfnForward& ffn, GpuProblem& q) {
  ffn.forward(q.x, q.w(), q.y, nullptr);
  const Tensor first = q.y.download();
  cuda::fill_bytes(q.y.view().data, q.y.nbytes(), 0xff, nullptr);
  ffn.forward(q.x, q.w(), q.y, nullptr);
  EXPECT_TRUE(test::bit_equal(q.y.download(), first));
}

// Runs `ffn` on the first `m` rows of q.x into q.y, poisoned first (rows past m stay poisoned);
// returns y.
Tensor run_rows(cuda::FfnForward& ffn, GpuProblem& q, int64_t m) {
  const int64_t H = q.x.view().shape[1];
  const TensorView x(q.x.view().data, DType::bf16, {m, H}, Device::cuda);
  const TensorView y(q.y.view().data, DType::bf16, {m, H}, Device::cuda);
  cuda::fill_bytes(q.y.view().data, q.y.nbytes(), 0xff, nullptr);
  ffn.forward(x, q.w(), y, nullptr);
  return q.y.download();
}

TEST(FfnForwardGpuDeterminism, TwoRunsGiveIdenticalBits) {
  TWELL_REQUIRE_HOPPER();
  GpuProblem p = make_problem(513, 1024, 2816, 0.02);
  cuda::FfnOptions o;
  o.dispatch = Dispatch::always_sparse;
  cuda::FfnForward ffn({513, 1024, 2816, true}, o);
  expect_repeatable(ffn, p);

  // Mostly heavy rows (~420 non-zeros each), whose block order comes from atomics.
  GpuProblem dense = make_problem(513, 1024, 2816, 0.15);
  expect_repeatable(ffn, dense);

  // A smaller batch after a larger one: no stale per-row counts or heavy-row lists.
  GpuProblem small = make_problem(40, 1024, 2816, 0.15);
  ffn.forward(small.x, small.w(), small.y, nullptr);
  const Tensor after_large = small.y.download();
  cuda::FfnForward fresh({513, 1024, 2816, true}, o);
  fresh.forward(small.x, small.w(), small.y, nullptr);
  EXPECT_TRUE(test::bit_equal(small.y.download(), after_large));

  o.gather_max_tokens = 1024;  // the gather path's split sums are added in a fixed order too
  cuda::FfnForward gather({513, 1024, 2816, true}, o);
  expect_repeatable(gather, p);
  EXPECT_EQ(gather.last_stats().path, cuda::FfnPath::gather);
}

// FfnForward over the caller's workspace: required_workspace_bytes is what the object allocates
// itself; a poisoned caller workspace of exactly that size gives the own workspace's bits on every
// path (sparse, dense, gather, one token), and no byte past it is touched; a workspace too small,
// misaligned or null, and a shape the constructors refuse, are refused by name.
TEST(FfnForwardGpuEdges, RunsInTheCallersWorkspace) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 300, H = 256, I = 640;
  const cuda::FfnShape shape{M, H, I, true};
  GpuProblem p = make_problem(M, H, I, 0.02);
  for (Dispatch d : {Dispatch::always_sparse, Dispatch::always_dense, Dispatch::previous}) {
    SCOPED_TRACE(static_cast<int>(d));
    cuda::FfnOptions o;
    o.dispatch = d;
    const size_t need = cuda::FfnForward::required_workspace_bytes(shape, o);
    cuda::FfnForward own(shape, o);
    EXPECT_EQ(own.workspace_bytes(), need);
    const size_t tail = 4096;
    cuda::DeviceBuffer ws(need + tail);
    cuda::fill_bytes(ws.get(), ws.bytes(), 0xa5, nullptr);
    cuda::FfnForward mine(shape, o, ws.get(), need);
    EXPECT_EQ(mine.workspace_bytes(), need);
    for (int64_t m : {M, int64_t{5}, int64_t{1}}) {  // sparse or dense by d; the gather path; one token
      SCOPED_TRACE(m);
      const Tensor expected = run_rows(own, p, m);  // rows past m stay poisoned in both
      const Tensor got = run_rows(mine, p, m);
      EXPECT_EQ(mine.last_path(), own.last_path());
      EXPECT_TRUE(test::bit_equal(got, expected));
    }
    std::vector<uint8_t> after(tail);
    TWELL_CUDA_CHECK(cudaMemcpy(after.data(), ws.as<char>() + need, tail, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::count(after.begin(), after.end(), uint8_t{0xa5}), static_cast<long>(tail)) << "wrote past the workspace";
  }
  const size_t need = cuda::FfnForward::required_workspace_bytes(shape);
  cuda::DeviceBuffer ws(need + 256);
  test::expect_error([&] { cuda::FfnForward(shape, {}, ws.get(), need - 1); }, {"workspace holds", "need"});
  test::expect_error([&] { cuda::FfnForward(shape, {}, ws.as<char>() + 16, need); }, {"256-byte aligned"});
  test::expect_error([&] { cuda::FfnForward(shape, {}, nullptr, need); }, {"workspace is null"});
  test::expect_error([&] { cuda::FfnForward::required_workspace_bytes({M, 100, I, true}); }, {"multiples of 64"});
}

// Objects whose calls are ordered (one stream) share one forward workspace outside training (as
// twell's Python FFNs do): interleaved, each gives the bits and statistics of a twin with its own
// workspace called alike, on every path, with Dispatch::previous carrying its density across the
// other objects' calls.
TEST(FfnForwardGpuEdges, ObjectsShareOneWorkspaceWhenTheirCallsAreOrdered) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 300, H = 256, I = 640;
  const cuda::FfnShape shape{M, H, I, true};
  std::vector<GpuProblem> problems;
  for (double d : {0.005, 0.3, 0.01}) problems.push_back(make_problem(M, H, I, d));
  std::vector<cuda::FfnOptions> options(3);
  options[0].dispatch = Dispatch::previous;
  options[0].sparse_min_tokens = 1;  // sparse by its previous density: the fused gate after the first call
  options[1].dispatch = Dispatch::observe;
  options[1].sparse_min_tokens = 1;  // dense by its density
  options[2].dispatch = Dispatch::always_sparse;
  size_t need = 0;
  for (const cuda::FfnOptions& o : options) need = std::max(need, cuda::FfnForward::required_workspace_bytes(shape, o));
  cuda::DeviceBuffer ws(need);
  cuda::fill_bytes(ws.get(), ws.bytes(), 0xa5, nullptr);
  std::vector<cuda::FfnForward> shared, own;
  for (const cuda::FfnOptions& o : options) {
    shared.emplace_back(shape, o, ws.get(), need);
    own.emplace_back(shape, o);
  }
  // Per object: calls of M, 5 (gather or dense) and 1 token (the one-token kernel) tokens, twice.
  const int64_t sizes[] = {M, 5, 1, M, 5, 1};
  std::vector<std::vector<Tensor>> expected(3);
  std::vector<std::vector<cuda::FfnPath>> paths(3);
  for (size_t i = 0; i < 3; ++i)
    for (int64_t m : sizes) {
      expected[i].push_back(run_rows(own[i], problems[i], m));
      paths[i].push_back(own[i].last_path());
    }
  EXPECT_EQ(paths[0][0], cuda::FfnPath::sparse);  // no density yet: g sampled, then packed
  EXPECT_EQ(paths[0][1], cuda::FfnPath::gather);
  EXPECT_EQ(paths[0][3], cuda::FfnPath::sparse);  // the fused gate, on the previous call's density
  EXPECT_EQ(paths[1][3], cuda::FfnPath::dense);
  EXPECT_EQ(paths[2][0], cuda::FfnPath::sparse);
  for (size_t k = 0; k < std::size(sizes); ++k)
    for (size_t i = 0; i < 3; ++i) {
      SCOPED_TRACE(testing::Message() << "object " << i << ", call " << k);
      EXPECT_TRUE(test::bit_equal(run_rows(shared[i], problems[i], sizes[k]), expected[i][k]));
      EXPECT_EQ(shared[i].last_path(), paths[i][k]);
    }
  for (size_t i = 0; i < 3; ++i) {
    const cuda::FfnStats a = shared[i].last_stats(), b = own[i].last_stats();
    EXPECT_EQ(a.nnz, b.nnz);
    EXPECT_EQ(a.sampled_density, b.sampled_density);
  }
}

// FfnOptions::cublaslt_workspace: objects whose calls are ordered share the caller's cuBLASLt
// workspace, with the bits of objects that hold their own (same size, same algorithms), on the
// paths that run cuBLASLt: the dense FFN, and the unfused gate of the sparse one. Bad settings are
// refused by the constructor and by required_workspace_bytes.
TEST(FfnForwardGpuEdges, SharesTheCallersCublasLtWorkspace) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 300, H = 256, I = 640;
  const cuda::FfnShape shape{M, H, I, true};
  GpuProblem p = make_problem(M, H, I, 0.02);
  cuda::DeviceBuffer lt(cuda::LtGemm::kWorkspaceBytes);
  cuda::FfnOptions dense, sparse;
  dense.dispatch = Dispatch::always_dense;
  sparse.dispatch = Dispatch::always_sparse, sparse.fused_gate = false, sparse.gather_max_tokens = 0;
  std::vector<Tensor> expected;
  for (const cuda::FfnOptions& o : {dense, sparse}) {
    cuda::FfnForward own(shape, o);
    cuda::fill_bytes(p.y.view().data, p.y.nbytes(), 0xff, nullptr);
    own.forward(p.x, p.w(), p.y, nullptr);
    expected.push_back(p.y.download());
  }
  auto shared = [&](cuda::FfnOptions o) {
    o.cublaslt_workspace = lt.get(), o.cublaslt_workspace_bytes = lt.bytes();
    return o;
  };
  const size_t free_before = cuda::device_memory().free;
  cuda::FfnForward a(shape, shared(dense)), b(shape, shared(sparse));
  const size_t taken = free_before - std::min(free_before, cuda::device_memory().free);
  EXPECT_LT(taken, a.workspace_bytes() + b.workspace_bytes() + cuda::LtGemm::kWorkspaceBytes)
      << "an object allocated a cuBLASLt workspace of its own";
  EXPECT_EQ(a.options().cublaslt_workspace, lt.get());
  for (int round = 0; round < 2; ++round) {  // a, b, a, b on one stream, through one workspace
    SCOPED_TRACE(round);
    cuda::fill_bytes(p.y.view().data, p.y.nbytes(), 0xff, nullptr);
    a.forward(p.x, p.w(), p.y, nullptr);
    EXPECT_EQ(a.last_path(), cuda::FfnPath::dense);
    EXPECT_TRUE(test::bit_equal(p.y.download(), expected[0]));
    cuda::fill_bytes(p.y.view().data, p.y.nbytes(), 0xff, nullptr);
    b.forward(p.x, p.w(), p.y, nullptr);
    EXPECT_EQ(b.last_path(), cuda::FfnPath::sparse);
    EXPECT_TRUE(test::bit_equal(p.y.download(), expected[1]));
  }
  cuda::FfnOptions bad;
  bad.cublaslt_workspace = lt.as<char>() + 16, bad.cublaslt_workspace_bytes = 1024;
  test::expect_error([&] { cuda::FfnForward(shape, bad); }, {"cublaslt_workspace must be 256-byte aligned"});
  test::expect_error([&] { cuda::FfnForward::required_workspace_bytes(shape, bad); }, {"256-byte aligned"});
  bad.cublaslt_workspace = nullptr;
  test::expect_error([&] { cuda::FfnForward(shape, bad); }, {"both be set or both be 0"});
  bad.cublaslt_workspace = lt.get(), bad.cublaslt_workspace_bytes = 0;
  test::expect_error([&] { cuda::FfnForward(shape, bad); }, {"both be set or both be 0"});
  // It must lie apart from the forward's workspace (the constructor that takes one).
  const size_t need = cuda::FfnForward::required_workspace_bytes(shape, dense);
  const size_t past = (need + 255) / 256 * 256, lt_bytes = size_t{1} << 20;
  cuda::DeviceBuffer ws(past + lt_bytes);
  cuda::FfnOptions carved = dense;
  carved.cublaslt_workspace = ws.as<char>() + past / 512 * 256, carved.cublaslt_workspace_bytes = lt_bytes;
  test::expect_error([&] { cuda::FfnForward(shape, carved, ws.get(), need); }, {"overlaps the forward's workspace"});
  carved.cublaslt_workspace = ws.as<char>() + past;
  EXPECT_NO_THROW(cuda::FfnForward(shape, carved, ws.get(), need));
}

// One token on the gather path runs the fused decode kernel (gate GEMV, gather and down sum in
// one kernel, the blocks' partial sums added by a second): against the CPU at every density, both
// precisions, gated and not, at shapes whose row blocks are limited by shared memory (H = 4096) or
// by the spread over the SMs; outputs poisoned, and two runs must give the same bits.
TEST(FfnForwardGpuDecode, OneTokenMatchesCpuAtEveryDensity) {
  TWELL_REQUIRE_HOPPER();
  struct Shape {
    int64_t H, I;
  };
  // {256, 12352}: I past the gather path's 12288, which the one-token kernel takes all the same.
  const Shape shapes[] = {{2048, 5632}, {4096, 576}, {1088, 704}, {64, 64}, {256, 12224}, {256, 12352}};
  for (const Shape& sh : shapes)
    for (double d : {0.0, 0.005, 0.02, 0.1, 0.5, 1.0})
      for (bool gated : {true, false})
        for (Precision prec : {Precision::bf16, Precision::h_fp32}) {
          if (!gated && sh.H == 4096) continue;  // covered gated; keeps the test short
          SCOPED_TRACE(str("H ", sh.H, " I ", sh.I, " density ", d, gated ? " gated" : " plain",
                           prec == Precision::h_fp32 ? " h_fp32" : " bf16"));
          const bench::SyntheticFfn f = bench::make_synthetic_ffn(
              {1, sh.H, sh.I, d, d == 0.02 ? bench::Distribution::skewed : bench::Distribution::uniform, gated, 17});
          Tensor y_cpu = Tensor::of<bf16>({1, sh.H});
          Tensor y64 = Tensor::of<double>({1, sh.H});
          cpu::ffn_forward(f.x, f.weights(), y_cpu, prec);
          cpu::ffn_forward(f.x, f.weights(), y64, Precision::f64);
          const double cpu_err = relative_error(y_cpu, y64);
          DeviceTensor x = DeviceTensor::upload(f.x);
          DeviceTensor wg = gated ? DeviceTensor::upload(f.wg) : DeviceTensor();
          DeviceTensor wu = DeviceTensor::upload(f.wu), wd = DeviceTensor::upload(f.wd);
          const FfnWeights w{gated ? wg.view() : TensorView{}, wu.view(), wd.view()};
          cuda::FfnOptions o;
          o.dispatch = Dispatch::always_sparse;
          o.precision = prec;
          o.gather_max_tokens = 4;
          cuda::FfnForward ffn({4, sh.H, sh.I, gated}, o);
          DeviceTensor y(DType::bf16, {1, sh.H});
          Tensor first;
          for (int run = 0; run < 2; ++run) {
            cuda::fill_bytes(y.view().data, y.nbytes(), 0xff, nullptr);  // poison: NaN
            ffn.forward(x, w, y, nullptr);
            TWELL_CUDA_CHECK(cudaDeviceSynchronize());
            if (run == 1) {
              EXPECT_TRUE(test::bit_equal(y.download(), first));
              break;
            }
            first = y.download();
          }
          EXPECT_EQ(ffn.last_path(), cuda::FfnPath::gather);
          // Dispatch (previous, the default) takes the same kernel for one token at any density.
          cuda::FfnOptions od;
          od.precision = prec;
          od.gather_max_tokens = 4;
          cuda::FfnForward dispatched({4, sh.H, sh.I, gated}, od);
          for (int run = 0; run < 2; ++run) {
            cuda::fill_bytes(y.view().data, y.nbytes(), 0xff, nullptr);
            dispatched.forward(x, w, y, nullptr);
            EXPECT_EQ(dispatched.last_path(), cuda::FfnPath::gather);
            EXPECT_TRUE(test::bit_equal(y.download(), first));
          }
          if (rms(y_cpu) == 0) {  // nothing active (density 0)
            EXPECT_EQ(rms(first), 0.0);
            continue;
          }
          EXPECT_LE(relative_error(first, y64), 2 * cpu_err + 1e-4) << "cpu rel_err " << cpu_err;
          EXPECT_TRUE(test::all_close(first, y_cpu, 0.05 * rms(y_cpu) + 1e-6, 0.02));
        }
}

// one_token_kernel = false (the model's gather FfnForward, whose one-token calls the model runs
// itself): one token takes the gather path's kernels, matches the CPU, and no decode buffers are held.
TEST(FfnForwardGpuDecode, WithoutTheOneTokenKernel) {
  TWELL_REQUIRE_HOPPER();
  const bench::SyntheticFfn f =
      bench::make_synthetic_ffn({1, 2048, 5632, 0.005, bench::Distribution::skewed, true, 23});
  Tensor y_cpu = Tensor::of<bf16>({1, 2048});
  cpu::ffn_forward(f.x, f.weights(), y_cpu, Precision::bf16);
  DeviceTensor x = DeviceTensor::upload(f.x);
  DeviceTensor wg = DeviceTensor::upload(f.wg), wu = DeviceTensor::upload(f.wu), wd = DeviceTensor::upload(f.wd);
  const FfnWeights w{wg.view(), wu.view(), wd.view()};
  cuda::FfnOptions o;
  o.dispatch = Dispatch::always_sparse;
  o.gather_max_tokens = 4;
  cuda::FfnForward with({4, 2048, 5632, true}, o);
  o.one_token_kernel = false;
  cuda::FfnForward without({4, 2048, 5632, true}, o);
  EXPECT_LT(without.workspace_bytes(), with.workspace_bytes());
  DeviceTensor y(DType::bf16, {1, 2048});
  cuda::fill_bytes(y.view().data, y.nbytes(), 0xff, nullptr);  // poison: NaN
  without.forward(x, w, y, nullptr);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(without.last_path(), cuda::FfnPath::gather);
  EXPECT_TRUE(test::all_close(y.download(), y_cpu, 0.05 * rms(y_cpu) + 1e-6, 0.02));
}

// The three weight buffers of a call, written by one kernel (copy_weights), and the host's word that the
// FFN's kernels are enqueued.
struct WeightCopy {
  const uint4* from[3];
  uint4* to[3];
  int64_t n[3];            // 16-byte words
  volatile int* enqueued;  // page-locked: [0] set by the host after forward(), [1] set here if it never came
};

// Lets its programmatic dependents start at once, waits until the host has enqueued the FFN's kernels
// (at most ~2 s) and ~50 µs more for them to start, then writes all three weights, Wg last: a dependent
// that read any of them before waiting for this grid reads it stale. (One kernel: with a kernel for each,
// the first two would end before the next began, as stream order has it, and only Wd, which the one-token
// kernels read after waiting anyway, would be written while they run. A fixed ~100 µs instead of the
// host's word let the old early reads pass one run in two: forward()'s host side can take longer.)
__global__ void copy_weights(const WeightCopy c) {
  cuda::allow_dependent_launch();
  if (threadIdx.x == 0) {
    const long long t0 = clock64();
    while (c.enqueued[0] == 0)
      if (clock64() - t0 > 4'000'000'000LL) {
        c.enqueued[1] = 1;
        break;
      }
    for (const long long t1 = clock64(); clock64() - t1 < 100'000;) {
    }
  }
  __syncthreads();
  for (int m = 2; m >= 0; --m)
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < c.n[m]; i += gridDim.x * int64_t(blockDim.x))
      c.to[m][i] = c.from[m][i];
}

// The one-token kernels start before the kernel ahead of them ends (programmatic dependent launch):
// by default they wait for it before copying their weights, so weights a kernel writes just before
// forward() are read as written. Each call's weights (two sets in turn, written into the same
// buffers by a kernel on the stream) must give the bits of a call on buffers that always held them;
// early_weight_reads (for fixed weights) the same bits.
TEST(FfnForwardGpuDecode, WeightsWrittenJustBeforeAreReadAsWritten) {
  TWELL_REQUIRE_HOPPER();
  const int64_t H = 2048, I = 5632;
  const bench::SyntheticFfn a = bench::make_synthetic_ffn({1, H, I, 0.05, bench::Distribution::uniform, true, 31});
  const bench::SyntheticFfn b = bench::make_synthetic_ffn({1, H, I, 0.05, bench::Distribution::uniform, true, 32});
  DeviceTensor x = DeviceTensor::upload(a.x);
  const DeviceTensor sets[2][3] = {{DeviceTensor::upload(a.wg), DeviceTensor::upload(a.wu), DeviceTensor::upload(a.wd)},
                                   {DeviceTensor::upload(b.wg), DeviceTensor::upload(b.wu), DeviceTensor::upload(b.wd)}};
  DeviceTensor live[3] = {DeviceTensor(DType::bf16, {I, H}), DeviceTensor(DType::bf16, {I, H}),
                          DeviceTensor(DType::bf16, {I, H})};
  const FfnWeights w_live{live[0].view(), live[1].view(), live[2].view()};
  const cudaStream_t stream = nullptr;
  cuda::PinnedBuffer flags(2 * sizeof(int));
  volatile int* enqueued = flags.as<int>();
  for (Dispatch d : {Dispatch::always_sparse, Dispatch::always_dense})  // the decode FFN kernel; the GEMV
    for (bool early : {false, true}) {
      SCOPED_TRACE(str(d == Dispatch::always_sparse ? "decode FFN kernel" : "dense, GEMV", early ? ", early" : ""));
      cuda::FfnOptions o;
      o.dispatch = d;
      o.gather_max_tokens = 4;
      o.early_weight_reads = early;
      cuda::FfnForward ffn({4, H, I, true}, o);
      DeviceTensor y(DType::bf16, {1, H});
      Tensor want[2];
      for (int k = 0; k < 2; ++k) {
        ffn.forward(x, FfnWeights{sets[k][0].view(), sets[k][1].view(), sets[k][2].view()}, y, stream);
        TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
        want[k] = y.download();
      }
      ASSERT_FALSE(test::bit_equal(want[0], want[1]));
      for (int call = 0; call < 8; ++call) {
        const int k = call % 2;
        cuda::fill_bytes(y.view().data, y.nbytes(), 0xff, stream);  // poison: NaN
        if (early) {  // fixed weights: copied in stream order, before the FFN's kernels start
          for (int m = 0; m < 3; ++m)
            TWELL_CUDA_CHECK(cudaMemcpy(live[m].view().data, sets[k][m].view().data, live[m].nbytes(),
                                        cudaMemcpyDeviceToDevice));
        } else {
          WeightCopy c;
          c.enqueued = enqueued;
          enqueued[0] = enqueued[1] = 0;
          for (int m = 0; m < 3; ++m) {
            c.from[m] = static_cast<const uint4*>(sets[k][m].view().data);
            c.to[m] = static_cast<uint4*>(live[m].view().data);
            c.n[m] = static_cast<int64_t>(live[m].nbytes() / 16);
          }
          copy_weights<<<264, 256, 0, stream>>>(c);
          TWELL_CUDA_CHECK(cudaGetLastError());  // the copy kernel is the one just before the FFN's
        }
        ffn.forward(x, w_live, y, stream);
        enqueued[0] = 1;  // a volatile store to page-locked memory: the copy kernel polls it
        TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
        EXPECT_EQ(enqueued[1], 0) << "call " << call << ": forward() waited for the GPU before returning";
        EXPECT_TRUE(test::bit_equal(y.download(), want[k])) << "call " << call;
      }
    }
}

// The dispatch tests: a 0.5% and a 30% dense problem of 256 tokens, the threshold between them.
struct DispatchCase {
  GpuProblem sparse = make_problem(256, 256, 1024, 0.005), dense = make_problem(256, 256, 1024, 0.3);
  static cuda::FfnOptions options(Dispatch d) {
    cuda::FfnOptions o;
    o.dispatch = d;
    o.dense_above_density = 0.05;
    o.sparse_min_tokens = 0;
    o.gather_max_tokens = 0;  // M = 256: TwELL, not the gather path
    return o;
  }
};

TEST(FfnForwardGpuDispatch, ObserveChoosesByThisCallsDensity) {
  TWELL_REQUIRE_HOPPER();
  auto [sparse, dense] = DispatchCase{};
  cuda::FfnForward ffn({256, 256, 1024, true}, DispatchCase::options(Dispatch::observe));
  ffn.forward(sparse.x, sparse.w(), sparse.y, nullptr);
  EXPECT_EQ(ffn.last_stats().path, cuda::FfnPath::sparse);
  ffn.forward(dense.x, dense.w(), dense.y, nullptr);
  EXPECT_EQ(ffn.last_stats().path, cuda::FfnPath::dense);
  EXPECT_GT(ffn.last_stats().sampled_density, 0.2);
}

TEST(FfnForwardGpuDispatch, PreviousLagsOneCallAndFewTokensGoDense) {
  TWELL_REQUIRE_HOPPER();
  auto [sparse, dense] = DispatchCase{};
  cuda::FfnOptions o = DispatchCase::options(Dispatch::previous);
  cuda::FfnForward ffn({256, 256, 1024, true}, o);
  ffn.forward(sparse.x, sparse.w(), sparse.y, nullptr);  // first call samples and waits
  EXPECT_EQ(ffn.last_stats().path, cuda::FfnPath::sparse);
  ffn.forward(dense.x, dense.w(), dense.y, nullptr);  // decides on the previous (sparse) sample
  EXPECT_EQ(ffn.last_stats().path, cuda::FfnPath::sparse);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  ffn.forward(dense.x, dense.w(), dense.y, nullptr);
  EXPECT_EQ(ffn.last_stats().path, cuda::FfnPath::dense);

  o.sparse_min_tokens = 4096;
  cuda::FfnForward small({256, 256, 1024, true}, o);
  small.forward(sparse.x, sparse.w(), sparse.y, nullptr);
  EXPECT_EQ(small.last_stats().path, cuda::FfnPath::dense);
}

// Two "layers" of different density through one FfnForward, alternating: with a dispatch slot
// each, every call decides on its own layer's previous sample (one slot would decide each call on
// the other layer's).
TEST(FfnForwardGpuDispatch, SlotsKeepEachLayersOwnSample) {
  TWELL_REQUIRE_HOPPER();
  auto [sparse, dense] = DispatchCase{};
  cuda::FfnOptions o = DispatchCase::options(Dispatch::previous);
  o.dispatch_slots = 2;
  cuda::FfnForward ffn({256, 256, 1024, true}, o);
  for (int round = 0; round < 3; ++round) {
    ffn.forward(sparse.x, sparse.w(), sparse.y, nullptr, 0);
    EXPECT_EQ(ffn.last_stats().path, cuda::FfnPath::sparse) << "round " << round;
    ffn.forward(dense.x, dense.w(), dense.y, nullptr, 1);
    EXPECT_EQ(ffn.last_stats().path, cuda::FfnPath::dense) << "round " << round;
    TWELL_CUDA_CHECK(cudaDeviceSynchronize());  // the samples have landed by the next round
  }
  EXPECT_THROW(ffn.forward(sparse.x, sparse.w(), sparse.y, nullptr, 2), Error);   // no such slot
  EXPECT_THROW(ffn.forward(sparse.x, sparse.w(), sparse.y, nullptr, -1), Error);
  o.dispatch_slots = 0;
  EXPECT_THROW(cuda::FfnForward({256, 256, 1024, true}, o), Error);
}

// One token: observe and previous take the one-kernel decode FFN at any density (it never reads
// more than the dense path), but not in training, whose backward needs the TwELL or dense state.
TEST(FfnForwardGpuDispatch, OneTokenTakesTheDecodeKernelOutsideTraining) {
  TWELL_REQUIRE_HOPPER();
  GpuProblem p = make_problem(1, 256, 1024, 0.5);
  for (Dispatch d : {Dispatch::observe, Dispatch::previous}) {
    SCOPED_TRACE(d == Dispatch::observe ? "observe" : "previous");
    cuda::FfnOptions o;
    o.dispatch = d;
    cuda::FfnForward ffn({1, 256, 1024, true}, o);
    ffn.forward(p.x, p.w(), p.y, nullptr);
    EXPECT_EQ(ffn.last_stats().path, cuda::FfnPath::gather);
    o.training = true;
    cuda::FfnForward train({1, 256, 1024, true}, o);
    train.forward(p.x, p.w(), p.y, nullptr);
    EXPECT_EQ(train.last_stats().path, cuda::FfnPath::dense);
  }
}

TEST(FfnForwardGpuEdges, GraphCaptureNeedsFixedDispatchAndReplaysExactly) {
  TWELL_REQUIRE_HOPPER();
  GpuProblem p = make_problem(5, 256, 1024, 0.01);
  cudaStream_t stream = nullptr;
  TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;

  // The default (dispatch on the previous call's sample) reads back on the host: refused.
  cuda::FfnForward dispatched({5, 256, 1024, true});
  TWELL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(dispatched.forward(p.x, p.w(), p.y, stream), Error);
  TWELL_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  if (graph) cudaGraphDestroy(graph);
  EXPECT_FALSE(dispatched.capturable());
  EXPECT_FALSE(dispatched.capturable(5));

  // y of `ffn`'s forward of `q` captured into a graph, y poisoned, the graph launched `launches` times.
  auto replayed = [&](cuda::FfnForward& ffn, GpuProblem& q, int launches) {
    TWELL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    ffn.forward(q.x, q.w(), q.y, stream);
    TWELL_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    TWELL_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cuda::fill_bytes(q.y.view().data, q.y.nbytes(), 0xff, stream);
    for (int i = 0; i < launches; ++i) TWELL_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return q.y.download();
  };

  // But one token, on the one-token kernel, which dispatch takes at any density: captured, even with
  // the counts of an eager sparse call still on their way (not asked under capture).
  EXPECT_TRUE(dispatched.capturable(1));
  {
    GpuProblem one = make_problem(1, 256, 1024, 0.01);
    dispatched.forward(one.x, one.w(), one.y, stream);  // eager
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    const Tensor eager = one.y.download();
    cuda::FfnOptions sparse_options;
    sparse_options.dispatch = Dispatch::always_sparse;
    sparse_options.gather_max_tokens = 1;  // 5 tokens on the TwELL path, which counts; 1 on the one-token kernel
    cuda::FfnForward counting({5, 256, 1024, true}, sparse_options);
    EXPECT_FALSE(counting.capturable());  // it counts the non-zeros
    EXPECT_TRUE(counting.capturable(1));
    counting.forward(p.x, p.w(), p.y, stream);  // its counts pending
    EXPECT_TRUE(test::bit_equal(replayed(counting, one, 1), eager));
  }

  for (int64_t gather : {0, 256}) {  // TwELL and the gather path
    cuda::FfnOptions o;
    o.dispatch = Dispatch::always_sparse;
    o.count_nonzeros = false;
    o.gather_max_tokens = gather;
    cuda::FfnForward ffn({5, 256, 1024, true}, o);
    ffn.forward(p.x, p.w(), p.y, stream);  // eager
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
    const Tensor eager = p.y.download();
    EXPECT_TRUE(test::bit_equal(replayed(ffn, p, 3), eager)) << "gather up to " << gather;
  }
  cudaStreamDestroy(stream);
}

TEST(FfnForwardGpuEdges, EmptyBatchIsANoOp) {
  TWELL_REQUIRE_HOPPER();
  GpuProblem p = make_problem(4, 128, 256, 0.05);
  cuda::FfnOptions o;
  o.dispatch = Dispatch::always_sparse, o.gather_max_tokens = 0;
  cuda::FfnForward ffn({4, 128, 256, true}, o);
  EXPECT_EQ(ffn.last_path(), cuda::FfnPath::none);
  EXPECT_THROW(ffn.download_activation(nullptr), Error);  // nothing packed yet
  ffn.forward(p.x, p.w(), p.y, nullptr);
  EXPECT_EQ(ffn.last_path(), cuda::FfnPath::sparse);
  DeviceTensor x0(DType::bf16, {0, 128}), y0(DType::bf16, {0, 128});
  EXPECT_NO_THROW(ffn.forward(x0, p.w(), y0, nullptr));
  EXPECT_EQ(ffn.last_stats().tokens, 0);
  EXPECT_EQ(ffn.last_path(), cuda::FfnPath::none);
  EXPECT_THROW(ffn.download_activation(nullptr), Error);  // not the previous call's tiles
  ffn.forward(p.x, p.w(), p.y, nullptr);  // and the next call works as usual
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
}

// Non-finite values give the same rows as the CPU reference on every path: a NaN in x makes its
// row of y NaN (the ReLU must not turn the NaN gate into zeros), and an Inf in a row of Wu reaches
// only the tokens where that neuron is active (an inactive neuron's h is 0, never 0 · Inf).
TEST(FfnForwardGpuEdges, NonFiniteValuesReachTheSameRowsOnEveryPath) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 64, H = 128, I = 256;
  const bench::SyntheticFfn f = bench::make_synthetic_ffn({M, H, I, 0.05, bench::Distribution::uniform, true, 3});
  Tensor h = Tensor::of<bf16>({M, I});
  Tensor y_ref = Tensor::of<bf16>({M, H});
  cpu::ffn_forward(f.x, f.weights(), y_ref, Precision::bf16, nullptr, h);
  int64_t j = -1, active = 0;  // a neuron active for some tokens, not all
  for (int64_t n = 0; n < I && j < 0; ++n) {
    active = 0;
    for (int64_t m = 0; m < M; ++m) active += float(h.ptr<bf16>()[m * I + n]) != 0.f;
    if (active >= 2 && active <= M - 2) j = n;
  }
  ASSERT_GE(j, 0);
  struct Poison {
    const char* name;
    bool nan_in_x;
  };
  for (const Poison& poison : {Poison{"NaN in x", true}, Poison{"Inf in a row of Wu", false}}) {
    SCOPED_TRACE(poison.name);
    Tensor x = f.x.clone(), wu = f.wu.clone();
    if (poison.nan_in_x)
      x.ptr<bf16>()[5 * H + 7] = bf16(std::nanf(""));
    else
      for (int64_t k = 0; k < H; ++k) wu.ptr<bf16>()[j * H + k] = bf16(k % 2 ? INFINITY : -INFINITY);
    const FfnWeights wh{f.wg.view(), wu.view(), f.wd.view()};
    Tensor y_cpu = Tensor::of<bf16>({M, H});
    cpu::ffn_forward(x, wh, y_cpu, Precision::bf16);
    auto bad_rows = [&](const Tensor& y) {
      std::vector<int64_t> rows;
      for (int64_t m = 0; m < M; ++m) {
        bool bad = false;
        for (int64_t k = 0; k < H; ++k) bad = bad || !std::isfinite(float(y.ptr<bf16>()[m * H + k]));
        if (bad) rows.push_back(m);
      }
      return rows;
    };
    const std::vector<int64_t> expect = bad_rows(y_cpu);
    ASSERT_EQ(expect.size(), poison.nan_in_x ? size_t{1} : size_t(active));  // the test can fail
    DeviceTensor xd = DeviceTensor::upload(x), wg = DeviceTensor::upload(f.wg), wud = DeviceTensor::upload(wu),
                 wd = DeviceTensor::upload(f.wd);
    const FfnWeights w{wg.view(), wud.view(), wd.view()};
    struct Run {
      Dispatch d;
      int64_t gather;
      bool fused_gate, training;
      const char* name;
    };
    const Run runs[] = {{Dispatch::always_dense, 0, true, false, "dense"},
                        {Dispatch::always_dense, 0, true, true, "dense, training"},
                        {Dispatch::always_sparse, 0, true, false, "sparse"},
                        {Dispatch::always_sparse, 0, false, false, "sparse, unfused gate"},
                        {Dispatch::always_sparse, 256, true, false, "gather"}};
    for (const Run& r : runs) {
      SCOPED_TRACE(r.name);
      cuda::FfnOptions o;
      o.dispatch = r.d, o.gather_max_tokens = r.gather, o.fused_gate = r.fused_gate, o.training = r.training;
      cuda::FfnForward ffn({M, H, I, true}, o);
      DeviceTensor y(DType::bf16, {M, H});
      cuda::fill_bytes(y.view().data, y.nbytes(), 0xff, nullptr);  // poison: NaN
      ffn.forward(xd, w, y, nullptr);
      const Tensor y_gpu = y.download();
      EXPECT_EQ(bad_rows(y_gpu), expect);
    }
  }
}

// Operands 16 bytes past a 256-byte boundary (the alignment forward() asks for, not the 256
// cuBLASLt's heuristics assume unless told) give the right result on every path (cuBLASLt may pick
// another algorithm for them, so not always the aligned call's bits).
TEST(FfnForwardGpuEdges, SixteenByteAlignedOperandsGiveCorrectResults) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 37, H = 256, I = 512;
  const bench::SyntheticFfn f = bench::make_synthetic_ffn({M, H, I, 0.05, bench::Distribution::uniform, true, 4});
  Tensor y_cpu = Tensor::of<bf16>({M, H}), y64 = Tensor::of<double>({M, H});
  cpu::ffn_forward(f.x, f.weights(), y_cpu, Precision::bf16);
  cpu::ffn_forward(f.x, f.weights(), y64, Precision::f64);
  const double cpu_err = relative_error(y_cpu, y64);
  constexpr int64_t kShift = 8;  // bf16 elements: 16 bytes
  std::vector<DeviceTensor> keep;
  auto shifted = [&](const Tensor& host) {  // a device copy whose data starts 16 bytes into its buffer
    keep.emplace_back(DType::bf16, Shape{host.numel() + kShift});
    TensorView v = keep.back().view();
    v.data = static_cast<char*>(v.data) + kShift * 2;
    v.shape = host.shape();
    TWELL_CUDA_CHECK(cudaMemcpy(v.data, host.view().data, host.nbytes(), cudaMemcpyHostToDevice));
    return v;
  };
  const DeviceTensor xa = DeviceTensor::upload(f.x), wga = DeviceTensor::upload(f.wg),
                     wua = DeviceTensor::upload(f.wu), wda = DeviceTensor::upload(f.wd);
  const TensorView xs = shifted(f.x), wgs = shifted(f.wg), wus = shifted(f.wu), wds = shifted(f.wd),
                   ys = shifted(Tensor::of<bf16>({M, H}));
  DeviceTensor ya(DType::bf16, {M, H});
  for (Dispatch d : {Dispatch::always_dense, Dispatch::always_sparse}) {
    for (int64_t gather : {int64_t{0}, int64_t{64}}) {
      SCOPED_TRACE(str(d == Dispatch::always_dense ? "dense" : "sparse", gather ? ", gather" : ""));
      cuda::FfnOptions o;
      o.dispatch = d, o.gather_max_tokens = gather, o.fused_gate = false;
      cuda::FfnForward ffn({M, H, I, true}, o);
      ffn.forward(xa, {wga.view(), wua.view(), wda.view()}, ya, nullptr);
      const Tensor aligned = ya.download();
      cuda::fill_bytes(ys.data, ys.nbytes(), 0xff, nullptr);  // poison: NaN
      ffn.forward(xs, {wgs, wus, wds}, ys, nullptr);
      Tensor got = Tensor::of<bf16>({M, H});
      TWELL_CUDA_CHECK(cudaMemcpy(got.view().data, ys.data, got.nbytes(), cudaMemcpyDeviceToHost));
      EXPECT_LE(relative_error(got, y64), 2 * cpu_err + 1e-4);
      EXPECT_LE(relative_error(aligned, y64), 2 * cpu_err + 1e-4);
    }
  }
}

TEST(FfnForwardGpuErrors, RefusesWhatItCannotHonour) {
  TWELL_REQUIRE_HOPPER();
  // h_fp32 of a non-gated FFN exists only in the one-token kernel: the other paths round h.
  GpuProblem p = make_problem(16, 128, 256, 0.05);
  cuda::FfnOptions fp32;
  fp32.precision = Precision::h_fp32;
  cuda::FfnForward plain({16, 128, 256, false}, fp32);
  const FfnWeights plain_w{TensorView{}, p.wu.view(), p.wd.view()};
  EXPECT_THROW(plain.forward(p.x, plain_w, p.y, nullptr), Error);
  TensorView x1 = p.x.view(), y1 = p.y.view();
  x1.shape = {1, 128}, y1.shape = {1, 128};
  EXPECT_NO_THROW(plain.forward(x1, plain_w, y1, nullptr));
  EXPECT_EQ(plain.last_path(), cuda::FfnPath::gather);
  // In training, the residual norm may not write its output over x: backward() reads x again.
  DeviceTensor resid(DType::f32, {16, 128}), nw(DType::bf16, {128});
  cuda::FfnOptions train;
  train.training = true, train.dispatch = Dispatch::always_sparse, train.gather_max_tokens = 0;
  cuda::FfnForward trainer({16, 128, 256, true}, train);
  const cuda::ResidualNorm over_x{resid.view(), nw.view(), p.x.view()};
  EXPECT_THROW(trainer.forward(p.x, p.w(), p.y, nullptr, 0, &over_x), Error);
  cuda::FfnForward inference({16, 128, 256, true});
  EXPECT_NO_THROW(inference.forward(p.x, p.w(), p.y, nullptr, 0, &over_x));  // read before written
  // A partial overlap is refused everywhere.
  TensorView shifted = p.x.view();
  shifted.data = static_cast<char*>(shifted.data) + 128 * 2;
  shifted.shape = {15, 128};
  DeviceTensor resid15(DType::f32, {15, 128}), y15(DType::bf16, {15, 128});
  TensorView x15 = p.x.view();
  x15.shape = {15, 128};
  const cuda::ResidualNorm partial{resid15.view(), nw.view(), shifted};
  EXPECT_THROW(inference.forward(x15, p.w(), y15, nullptr, 0, &partial), Error);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  // H past what the TwELL kernels take (4096): dispatch runs the dense path, and always_sparse is
  // refused before anything is queued (y keeps its poison).
  const int64_t Hw = 4160, Iw = 128;
  GpuProblem wide = make_problem(16, Hw, Iw, 0.05);
  Tensor y_cpu = Tensor::of<bf16>({16, Hw}), y64 = Tensor::of<double>({16, Hw});
  cpu::ffn_forward(wide.f.x, wide.f.weights(), y_cpu, Precision::bf16);
  cpu::ffn_forward(wide.f.x, wide.f.weights(), y64, Precision::f64);
  cuda::FfnOptions forced;
  forced.dispatch = Dispatch::always_sparse;
  cuda::FfnForward forced_ffn({16, Hw, Iw, true}, forced);
  cuda::fill_bytes(wide.y.view().data, wide.y.nbytes(), 0xff, nullptr);
  const Tensor poisoned = wide.y.download();
  EXPECT_THROW(forced_ffn.forward(wide.x, wide.w(), wide.y, nullptr), Error);
  EXPECT_TRUE(test::bit_equal(wide.y.download(), poisoned));
  cuda::FfnOptions observe;
  observe.dispatch = Dispatch::observe, observe.sparse_min_tokens = 0;
  cuda::FfnForward dispatched({16, Hw, Iw, true}, observe);
  dispatched.forward(wide.x, wide.w(), wide.y, nullptr);
  EXPECT_EQ(dispatched.last_path(), cuda::FfnPath::dense);
  EXPECT_LE(relative_error(wide.y.download(), y64), 2 * relative_error(y_cpu, y64) + 1e-4);
}

// The TwELL kernels index a call's stored values with 32 bits: 32 slots + 256 backup values a
// 256-wide tile a token. That limit is a call's, not the workspace's: an object built for more
// tokens still runs smaller calls sparse (with the bits of a small object), and a call past it
// runs dense under dispatch, or is refused under always_sparse before anything is queued.
// FfnOptions::tile = 0 is resolved when the object is built, and options() says to what.
TEST(FfnForwardGpuEdges, TheDefaultTileIsChosenAndSaid) {
  TWELL_REQUIRE_HOPPER();
  EXPECT_EQ(cuda::FfnForward({64, 256, 5632, true}, {}).options().tile, 176);
  EXPECT_EQ(cuda::FfnForward({64, 256, 2048, true}, {}).options().tile, 176);  // a partial last tile
  cuda::FfnOptions c32;
  c32.compression = 32;  // does not divide 176
  EXPECT_EQ(cuda::FfnForward({64, 256, 2048, true}, c32).options().tile, 256);
  cuda::FfnOptions training;
  training.training = true;
  EXPECT_EQ(cuda::FfnForward({64, 256, 5632, true}, training).options().tile, 256);
  cuda::FfnOptions asked;
  asked.tile = 128;
  EXPECT_EQ(cuda::FfnForward({64, 256, 5632, true}, asked).options().tile, 128);
}

TEST(FfnForwardGpuEdges, TheFormatsIndexLimitIsJudgedPerCall) {
  TWELL_REQUIRE_HOPPER();
  const int64_t H = 64, I = 64, limit = ((int64_t{1} << 32) - 1) / 288, big = limit + 1;
  if (cuda::device_memory().free < (size_t{64} << 30))
    GTEST_SKIP() << "needs 64 GB of free device memory for two workspaces of " << big << " tokens";
  GpuProblem p = make_problem(300, H, I, 0.05);
  cuda::FfnOptions forced;
  forced.dispatch = Dispatch::always_sparse, forced.gather_max_tokens = 0;
  cuda::FfnForward small({300, H, I, true}, forced);
  small.forward(p.x, p.w(), p.y, nullptr);
  const Tensor expect = p.y.download();

  cuda::FfnForward large({big, H, I, true}, forced);
  EXPECT_TRUE(large.sparse_supported(limit));
  EXPECT_FALSE(large.sparse_supported(big));
  cuda::fill_bytes(p.y.view().data, p.y.nbytes(), 0xff, nullptr);
  large.forward(p.x, p.w(), p.y, nullptr);
  EXPECT_EQ(large.last_path(), cuda::FfnPath::sparse);
  EXPECT_TRUE(test::bit_equal(p.y.download(), expect));

  // big tokens: p.x's 300 rows, then zeros.
  DeviceTensor xb(DType::bf16, {big, H}), yb(DType::bf16, {big, H});
  cuda::fill_bytes(xb.view().data, xb.nbytes(), 0, nullptr);
  TWELL_CUDA_CHECK(cudaMemcpy(xb.view().data, p.x.view().data, p.x.nbytes(), cudaMemcpyDeviceToDevice));
  const auto first_rows = [&] {  // y's first 300 rows, on the host
    Tensor t = Tensor::of<bf16>({300, H});
    TWELL_CUDA_CHECK(cudaMemcpy(t.ptr<bf16>(), yb.view().data, t.nbytes(), cudaMemcpyDeviceToHost));
    return t;
  };
  // Exactly at the limit: sparse, and the first rows have the small object's bits.
  TensorView x_limit = xb.view(), y_limit = yb.view();
  x_limit.shape = {limit, H}, y_limit.shape = {limit, H};
  cuda::fill_bytes(yb.view().data, yb.nbytes(), 0xff, nullptr);
  large.forward(x_limit, p.w(), y_limit, nullptr);
  EXPECT_EQ(large.last_path(), cuda::FfnPath::sparse);
  EXPECT_TRUE(test::bit_equal(first_rows(), expect));
  cuda::fill_bytes(yb.view().data, yb.nbytes(), 0xff, nullptr);
  try {
    large.forward(xb, p.w(), yb, nullptr);
    ADD_FAILURE() << "always_sparse ran a call past the format's indexing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("split the batch"), std::string::npos) << e.what();
  }
  const Tensor untouched = first_rows();
  int64_t written = 0;
  for (int64_t i = 0; i < 300 * H; ++i) written += !std::isnan(static_cast<float>(untouched.ptr<bf16>()[i]));
  EXPECT_EQ(written, 0) << "the refused call wrote y";

  cuda::FfnOptions observe;
  observe.dispatch = Dispatch::observe, observe.gather_max_tokens = 0;
  cuda::FfnForward dispatched({big, H, I, true}, observe);
  dispatched.forward(xb, p.w(), yb, nullptr);
  EXPECT_EQ(dispatched.last_path(), cuda::FfnPath::dense);
  Tensor y_cpu = Tensor::of<bf16>({300, H}), y64 = Tensor::of<double>({300, H});
  cpu::ffn_forward(p.f.x, p.f.weights(), y_cpu, Precision::bf16);
  cpu::ffn_forward(p.f.x, p.f.weights(), y64, Precision::f64);
  EXPECT_LE(relative_error(first_rows(), y64), 2 * relative_error(y_cpu, y64) + 1e-4);
}

TEST(FfnForwardGpuErrors, RejectsBadArguments) {
  TWELL_REQUIRE_HOPPER();
  GpuProblem p = make_problem(16, 128, 256, 0.05);
  cuda::FfnForward ffn({16, 128, 256, true});
  // Host tensor instead of device.
  EXPECT_THROW(ffn.forward(p.f.x, p.w(), p.y, nullptr), Error);
  // Wrong shape of a weight.
  DeviceTensor bad_w(DType::bf16, {256, 192});
  EXPECT_THROW(ffn.forward(p.x, {p.wg.view(), bad_w.view(), p.wd.view()}, p.y, nullptr), Error);
  // Wrong dtype.
  DeviceTensor y32(DType::f32, {16, 128});
  EXPECT_THROW(ffn.forward(p.x, p.w(), y32, nullptr), Error);
  // Misaligned x (offset by one element).
  TensorView shifted = p.x.view();
  shifted.data = static_cast<char*>(shifted.data) + 2;
  shifted.shape = {15, 128};
  DeviceTensor y15(DType::bf16, {15, 128});
  EXPECT_THROW(ffn.forward(shifted, p.w(), y15, nullptr), Error);
  // y over x, or over a weight: written while they are read.
  test::expect_error([&] { ffn.forward(p.x, p.w(), p.x, nullptr); }, {"FfnForward", "y's memory overlaps x's"});
  TensorView y_over_wd = p.wd.view();
  y_over_wd.shape = {16, 128};
  test::expect_error([&] { ffn.forward(p.x, p.w(), y_over_wd, nullptr); }, {"y's memory overlaps w.wd's"});
  // More tokens than the workspace holds.
  GpuProblem big = make_problem(17, 128, 256, 0.05);
  EXPECT_THROW(ffn.forward(big.x, big.w(), big.y, nullptr), Error);
  // Unsupported sizes.
  EXPECT_THROW(cuda::FfnForward({16, 100, 256, true}), Error);
  // The residual add + RMSNorm: the residual in bf16, a weight vector of the wrong length, normed
  // in y's buffer, a negative eps. Nothing runs, so the residual keeps its bits.
  DeviceTensor resid(DType::f32, {16, 128}), resid16(DType::bf16, {16, 128}), nw(DType::bf16, {128}),
      nw_short(DType::bf16, {64}), normed(DType::bf16, {16, 128});
  cuda::fill_bytes(resid.view().data, resid.nbytes(), 0x3f, nullptr);
  const Tensor resid_before = resid.download();
  const cuda::ResidualNorm bad[] = {{resid16.view(), nw.view(), normed.view()},
                                    {resid.view(), nw_short.view(), normed.view()},
                                    {resid.view(), nw.view(), p.y.view()},
                                    {resid.view(), nw.view(), normed.view(), -1.f}};
  for (const cuda::ResidualNorm& then : bad) EXPECT_THROW(ffn.forward(p.x, p.w(), p.y, nullptr, 0, &then), Error);
  EXPECT_TRUE(test::bit_equal(resid.download(), resid_before));
  try {
    ffn.forward(p.x, {p.wg.view(), bad_w.view(), p.wd.view()}, p.y, nullptr);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wu: expected shape [256, 128], got [256, 192]"), std::string::npos)
        << e.what();
  }
}


// ---- backward ----------------------------------------------------------------------------------
// FfnForward::backward against the CPU reference backward (itself checked by finite differences,
// tests/cpu/test_ffn_backward.cpp): each gradient's relative error against float64 at most twice
// the CPU bf16 pipeline's (plus a 1e-4 floor), with the L1 term on; bitwise reproducible.
struct BackwardCase {
  int64_t M, H, I;
  double density;
  bool skewed;
  int32_t tile = 256, compression = 8;
  int64_t dw_slice = 0;  // FfnOptions::dw_slice_columns
};

std::string backward_name(const testing::TestParamInfo<BackwardCase>& info) {
  const auto& c = info.param;
  return str("M", c.M, "_H", c.H, "_I", c.I, "_d", static_cast<int>(std::lround(c.density * 1000)), "permille_",
             c.skewed ? "skewed" : "uniform", c.tile != 256 ? str("_T", c.tile) : std::string(),
             c.dw_slice ? str("_slice", c.dw_slice) : std::string());
}

struct DeviceGrads {
  DeviceTensor dx, dwg, dwu, dwd;
  DeviceGrads(int64_t M, int64_t H, int64_t I)
      : dx(DType::f32, {M, H}), dwg(DType::f32, {I, H}), dwu(DType::f32, {I, H}), dwd(DType::f32, {I, H}) {
    for (DeviceTensor* t : {&dx, &dwg, &dwu, &dwd}) cuda::fill_bytes(t->view().data, t->nbytes(), 0xff, nullptr);
  }
  FfnGrads views() const { return {dx.view(), dwg.view(), dwu.view(), dwd.view()}; }
};

// The four gradients are the same bits.
void expect_same_grads(const DeviceGrads& got, const DeviceGrads& want) {
  EXPECT_TRUE(test::bit_equal(got.dx.download(), want.dx.download()));
  EXPECT_TRUE(test::bit_equal(got.dwg.download(), want.dwg.download()));
  EXPECT_TRUE(test::bit_equal(got.dwu.download(), want.dwu.download()));
  EXPECT_TRUE(test::bit_equal(got.dwd.download(), want.dwd.download()));
}

// Training and a non-gated FFN in the caller's workspace (RunsInTheCallersWorkspace covers
// inference): the backward, which reads the forward's state from that workspace, and the non-gated
// forward give the bits of an object with its own, on the sparse and the dense path.
TEST(FfnBackwardGpuEdges, TrainingAndNonGatedInTheCallersWorkspace) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 257, H = 256, I = 640;
  GpuProblem p = make_problem(M, H, I, 0.02);
  const DeviceTensor dy = DeviceTensor::upload(test::random_normal(DType::bf16, {M, H}, 1.0, 4));
  for (Dispatch d : {Dispatch::always_sparse, Dispatch::always_dense}) {
    SCOPED_TRACE(static_cast<int>(d));
    cuda::FfnOptions o;
    o.dispatch = d;
    o.training = true;
    const cuda::FfnShape shape{M, H, I, true};
    const size_t need = cuda::FfnForward::required_workspace_bytes(shape, o);
    cuda::DeviceBuffer ws(need);
    cuda::fill_bytes(ws.get(), need, 0xa5, nullptr);
    cuda::FfnForward own(shape, o), mine(shape, o, ws.get(), need);
    DeviceGrads g_own(M, H, I), g_mine(M, H, I);
    own.forward(p.x, p.w(), p.y, nullptr);
    own.backward(p.x, p.w(), dy, 1e-4, g_own.views(), nullptr);
    mine.forward(p.x, p.w(), p.y, nullptr);
    mine.backward(p.x, p.w(), dy, 1e-4, g_mine.views(), nullptr);
    EXPECT_EQ(mine.last_path(), own.last_path());
    EXPECT_TRUE(test::bit_equal(g_mine.dx.download(), g_own.dx.download()));
    EXPECT_TRUE(test::bit_equal(g_mine.dwg.download(), g_own.dwg.download()));
    EXPECT_TRUE(test::bit_equal(g_mine.dwd.download(), g_own.dwd.download()));

    o.training = false;  // non-gated: h = relu(x Wuᵀ), no u buffer in the plan
    const cuda::FfnShape plain{M, H, I, false};
    const FfnWeights w{TensorView(), p.wu.view(), p.wd.view()};
    const size_t need_plain = cuda::FfnForward::required_workspace_bytes(plain, o);
    EXPECT_LT(need_plain, cuda::FfnForward::required_workspace_bytes(shape, o));
    cuda::DeviceBuffer ws_plain(need_plain);
    cuda::fill_bytes(ws_plain.get(), need_plain, 0xa5, nullptr);
    cuda::FfnForward own_plain(plain, o), mine_plain(plain, o, ws_plain.get(), need_plain);
    own_plain.forward(p.x, w, p.y, nullptr);
    const Tensor expected = p.y.download();
    cuda::fill_bytes(p.y.view().data, p.y.nbytes(), 0xff, nullptr);
    mine_plain.forward(p.x, w, p.y, nullptr);
    EXPECT_TRUE(test::bit_equal(p.y.download(), expected));
  }
}

// Forward then backward with options `o`; the path the forward must take; gradients against the
// CPU reference, and a second backward gives the same bits.
void check_backward(const BackwardCase& c, cuda::FfnOptions o, cuda::FfnPath expect_path) {
  const bench::SyntheticFfn f = bench::make_synthetic_ffn(
      {c.M, c.H, c.I, c.density, c.skewed ? bench::Distribution::skewed : bench::Distribution::uniform, true, 5});
  const Tensor dy = test::random_normal(DType::bf16, {c.M, c.H}, 1.0, 17);
  const double l1 = 0.05;  // comparable to |dh|: the sign(h) term matters

  auto cpu_grads = [&](DType dtype, Precision prec) {
    std::vector<Tensor> g;
    g.emplace_back(dtype, Shape{c.M, c.H});
    for (int k = 0; k < 3; ++k) g.emplace_back(dtype, Shape{c.I, c.H});
    cpu::ffn_backward(f.x, f.weights(), dy, l1, {g[0], g[1], g[2], g[3]}, prec);
    return g;
  };
  const std::vector<Tensor> g64 = cpu_grads(DType::f64, Precision::f64);
  const std::vector<Tensor> g32 = cpu_grads(DType::f32, Precision::bf16);

  DeviceTensor x = DeviceTensor::upload(f.x), wg = DeviceTensor::upload(f.wg), wu = DeviceTensor::upload(f.wu),
               wd = DeviceTensor::upload(f.wd), dyd = DeviceTensor::upload(dy), y(DType::bf16, {c.M, c.H});
  const FfnWeights w{wg.view(), wu.view(), wd.view()};
  o.tile = c.tile, o.compression = c.compression;
  o.dw_slice_columns = c.dw_slice;
  cuda::FfnForward ffn({c.M, c.H, c.I, true}, o);
  ffn.forward(x, w, y, nullptr);
  ASSERT_EQ(ffn.last_path(), expect_path);
  DeviceGrads gpu(c.M, c.H, c.I);
  ffn.backward(x, w, dyd, l1, gpu.views(), nullptr);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor got[4] = {gpu.dx.download(), gpu.dwg.download(), gpu.dwu.download(), gpu.dwd.download()};
  const char* names[4] = {"dx", "dwg", "dwu", "dwd"};
  for (int k = 0; k < 4; ++k) {
    const double cpu_err = relative_error(g32[k], g64[k]), gpu_err = relative_error(got[k], g64[k]);
    EXPECT_LE(gpu_err, 2 * cpu_err + 1e-4) << names[k] << ": cpu bf16 rel_err " << cpu_err;
    std::printf("    %s: gpu rel err %.2e, cpu bf16 %.2e\n", names[k], gpu_err, cpu_err);
  }

  // Reproducible: a second backward gives the same bits, and so does a third after another
  // forward, whose transpose runs on the side stream the first backward created (from the event
  // the forward records after its pack), beside the dh and dx passes; and so do two backwards of
  // that forward queued back to back (the second's transpose must wait for the first's dW).
  auto expect_same = [&](DeviceGrads& again, const char* what) {
    EXPECT_TRUE(test::bit_equal(again.dx.download(), got[0])) << what;
    EXPECT_TRUE(test::bit_equal(again.dwg.download(), got[1])) << what;
    EXPECT_TRUE(test::bit_equal(again.dwu.download(), got[2])) << what;
    EXPECT_TRUE(test::bit_equal(again.dwd.download(), got[3])) << what;
  };
  DeviceGrads second(c.M, c.H, c.I), third(c.M, c.H, c.I), fourth(c.M, c.H, c.I), fifth(c.M, c.H, c.I);
  ffn.backward(x, w, dyd, l1, second.views(), nullptr);
  expect_same(second, "second backward");
  ffn.forward(x, w, y, nullptr);
  ffn.backward(x, w, dyd, l1, third.views(), nullptr);
  expect_same(third, "backward after another forward");
  ffn.forward(x, w, y, nullptr);
  ffn.backward(x, w, dyd, l1, fourth.views(), nullptr);
  ffn.backward(x, w, dyd, l1, fifth.views(), nullptr);
  expect_same(fourth, "first of two queued backwards");
  expect_same(fifth, "second of two queued backwards");
}

class FfnBackwardGpu : public testing::TestWithParam<BackwardCase> {};

TEST_P(FfnBackwardGpu, MatchesCpuReference) {
  TWELL_REQUIRE_HOPPER();
  cuda::FfnOptions o;
  o.dispatch = Dispatch::always_sparse;
  o.gather_max_tokens = 0;
  check_backward(GetParam(), o, cuda::FfnPath::sparse);
}

// FfnOptions::training: the dense path keeps g, u and h, and the backward follows the forward's
// path; with dispatch on, a dense activation takes the dense path.
TEST(FfnBackwardGpuDense, FollowsTheForwardsPath) {
  TWELL_REQUIRE_HOPPER();
  cuda::FfnOptions o;
  o.training = true;
  o.gather_max_tokens = 0;
  o.dispatch = Dispatch::always_dense;
  check_backward({67, 256, 1344, 0.02, true}, o, cuda::FfnPath::dense);
  check_backward({33, 192, 320, 0.3, false}, o, cuda::FfnPath::dense);
  o.dispatch = Dispatch::observe;
  o.sparse_min_tokens = 1;
  check_backward({300, 512, 2048, 0.1, false}, o, cuda::FfnPath::dense);   // above training_dense_above_density
  check_backward({300, 512, 2048, 0.002, false}, o, cuda::FfnPath::sparse);  // below
}

// Wg and Wu stacked in one [2I, H] buffer (a fused gate_up weight) and dWg, dWu in one [2I, H]
// gradient: the dense backward skips its weight copy and computes both weight gradients in one
// GEMM; the gradients match those of separate buffers.
TEST(FfnBackwardGpuDense, StackedWeightsAndGradients) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 96, H = 256, I = 640;
  GpuProblem p = make_problem(M, H, I, 0.1);
  const DeviceTensor dy = DeviceTensor::upload(test::random_normal(DType::bf16, {M, H}, 1.0, 23));
  DeviceTensor wgu(DType::bf16, {2 * I, H}), dwgu(DType::f32, {2 * I, H});
  char* wgu_p = static_cast<char*>(wgu.view().data);
  TWELL_CUDA_CHECK(cudaMemcpy(wgu_p, p.wg.view().data, p.wg.nbytes(), cudaMemcpyDeviceToDevice));
  TWELL_CUDA_CHECK(cudaMemcpy(wgu_p + p.wg.nbytes(), p.wu.view().data, p.wu.nbytes(), cudaMemcpyDeviceToDevice));
  cuda::fill_bytes(dwgu.view().data, dwgu.nbytes(), 0xff, nullptr);
  const FfnWeights stacked{TensorView(wgu_p, DType::bf16, {I, H}, Device::cuda),
                           TensorView(wgu_p + p.wg.nbytes(), DType::bf16, {I, H}, Device::cuda), p.wd.view()};
  auto* dw_p = static_cast<float*>(dwgu.view().data);
  cuda::FfnOptions o;
  o.training = true;
  o.gather_max_tokens = 0;
  o.dispatch = Dispatch::always_dense;
  cuda::FfnForward ffn({M, H, I, true}, o);
  DeviceGrads apart(M, H, I), together(M, H, I);
  ffn.forward(p.x, p.w(), p.y, nullptr);
  ffn.backward(p.x, p.w(), dy, 0.05, apart.views(), nullptr);
  ffn.forward(p.x, stacked, p.y, nullptr);
  ffn.backward(p.x, stacked, dy, 0.05,
               {together.dx.view(), TensorView(dw_p, DType::f32, {I, H}, Device::cuda),
                TensorView(dw_p + I * H, DType::f32, {I, H}, Device::cuda), together.dwd.view()},
               nullptr);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor dw_both = dwgu.download();
  const Tensor dwg = apart.dwg.download(), dwu = apart.dwu.download();
  double worst = 0;
  for (int64_t k = 0; k < I * H; ++k) {
    for (const auto& [got, want] : {std::pair{load_as_double(dw_both, k), load_as_double(dwg, k)},
                                    std::pair{load_as_double(dw_both, I * H + k), load_as_double(dwu, k)}}) {
      ASSERT_TRUE(std::isfinite(got));
      worst = std::max(worst, std::abs(got - want) / (std::abs(want) + 1e-3));
    }
  }
  EXPECT_LE(worst, 1e-4);
  EXPECT_LE(relative_error(together.dx.download(), apart.dx.download()), 1e-6);
  EXPECT_TRUE(test::bit_equal(together.dwd.download(), apart.dwd.download()));
}

// The backward's dense buffers, and dg and du beside the format, are scratch of its call
// (StreamScratch): two layers' backwards in a model's order (forward A, forward B, backward B,
// backward A, one stream: A's scratch is B's memory again) give each the gradients it gives alone,
// on either path, and no object keeps the dense path's afterwards.
TEST(FfnBackwardGpuDense, ScratchIsTheCallsNotTheObjects) {
  TWELL_REQUIRE_HOPPER();
  for (const Dispatch d : {Dispatch::always_dense, Dispatch::always_sparse}) {
    SCOPED_TRACE(d == Dispatch::always_dense ? "dense" : "sparse");
    const int64_t M = 96, H = 256, I = 640;
    GpuProblem a = make_problem(M, H, I, 0.1), b = make_problem(M, H, I, 0.3);
    const DeviceTensor dy = DeviceTensor::upload(test::random_normal(DType::bf16, {M, H}, 1.0, 29));
    cuda::FfnOptions o;
    o.training = true;
    o.gather_max_tokens = 0;
    o.dispatch = d;
    const cuda::FfnShape shape{M, H, I, true};
    auto alone = [&](GpuProblem& q) {
      cuda::FfnForward ffn(shape, o);
      auto g = std::make_unique<DeviceGrads>(M, H, I);
      ffn.forward(q.x, q.w(), q.y, nullptr);
      ffn.backward(q.x, q.w(), dy, 0.05, g->views(), nullptr);
      return g;
    };
    const auto want_a = alone(a), want_b = alone(b);
    cuda::FfnForward fa(shape, o), fb(shape, o);
    DeviceGrads ga(M, H, I), gb(M, H, I);
    fa.forward(a.x, a.w(), a.y, nullptr);
    fb.forward(b.x, b.w(), b.y, nullptr);
    fb.backward(b.x, b.w(), dy, 0.05, gb.views(), nullptr);
    fa.backward(a.x, a.w(), dy, 0.05, ga.views(), nullptr);
    expect_same_grads(ga, *want_a);
    expect_same_grads(gb, *want_b);
    if (d == Dispatch::always_dense)
      EXPECT_EQ(fa.workspace_bytes(), cuda::FfnForward::required_workspace_bytes(shape, o));
  }
}

// The dense path's buffers and the TwELL path's share one region of the workspace (a call takes
// one path; backward() reads that path's): a training object whose calls alternate between the
// paths (dispatch observes each call's density) gives, forward and backward, the bits of objects
// that only take one. Training needs no more workspace than inference where the TwELL kernels take
// the shape.
TEST(FfnBackwardGpuEdges, PathsTakenInTurnShareOneRegion) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 300, H = 512, I = 2048;
  GpuProblem sparse = make_problem(M, H, I, 0.002), dense = make_problem(M, H, I, 0.1);
  const DeviceTensor dy = DeviceTensor::upload(test::random_normal(DType::bf16, {M, H}, 1.0, 31));
  cuda::FfnOptions o;
  o.training = true;
  o.gather_max_tokens = 0;
  o.sparse_min_tokens = 1;
  o.dispatch = Dispatch::observe;
  o.fused_gate = false;  // observe packs the sampled g; the fused gate's rounding may differ from it
  const cuda::FfnShape shape{M, H, I, true};
  struct Result {
    Tensor y;
    std::unique_ptr<DeviceGrads> g;
  };
  auto run = [&](cuda::FfnForward& ffn, GpuProblem& q) {
    Result r{Tensor(), std::make_unique<DeviceGrads>(M, H, I)};
    cuda::fill_bytes(q.y.view().data, q.y.nbytes(), 0xff, nullptr);
    ffn.forward(q.x, q.w(), q.y, nullptr);
    r.y = q.y.download();
    ffn.backward(q.x, q.w(), dy, 0.05, r.g->views(), nullptr);
    return r;
  };
  auto alone = [&](GpuProblem& q, Dispatch d) {
    cuda::FfnOptions one = o;
    one.dispatch = d;
    cuda::FfnForward ffn(shape, one);
    return run(ffn, q);
  };
  const Result want_sparse = alone(sparse, Dispatch::always_sparse), want_dense = alone(dense, Dispatch::always_dense);
  cuda::FfnForward mixed(shape, o);
  std::vector<Result> got;
  const std::pair<GpuProblem*, cuda::FfnPath> turns[] = {{&sparse, cuda::FfnPath::sparse},
                                                          {&dense, cuda::FfnPath::dense},
                                                          {&sparse, cuda::FfnPath::sparse},
                                                          {&dense, cuda::FfnPath::dense}};
  for (const auto& [q, path] : turns) {
    got.push_back(run(mixed, *q));
    EXPECT_EQ(mixed.last_path(), path);
  }
  for (size_t k = 0; k < got.size(); ++k) {
    SCOPED_TRACE(str("turn ", k));
    const Result& want = turns[k].second == cuda::FfnPath::sparse ? want_sparse : want_dense;
    EXPECT_TRUE(test::bit_equal(got[k].y, want.y));
    expect_same_grads(*got[k].g, *want.g);
  }
  cuda::FfnOptions inference = o;
  inference.training = false;
  EXPECT_LE(cuda::FfnForward::required_workspace_bytes(shape, o), cuda::FfnForward::required_workspace_bytes(shape, inference));
}

// use_workspace moves an object's buffers: the forward and backward on the new memory give the bits of an
// object that never moved; a backward after a move without a forward is refused, and works again once
// moved back; bad memory is refused and changes nothing.
TEST(FfnBackwardGpuEdges, UseWorkspaceMovesTheBuffers) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 300, H = 512, I = 2048;
  GpuProblem q = make_problem(M, H, I, 0.002);
  const DeviceTensor dy = DeviceTensor::upload(test::random_normal(DType::bf16, {M, H}, 1.0, 37));
  for (const Dispatch d : {Dispatch::always_sparse, Dispatch::always_dense}) {
    SCOPED_TRACE(d == Dispatch::always_dense ? "dense" : "sparse");
    cuda::FfnOptions o;
    o.training = true;
    o.gather_max_tokens = 0;
    o.dispatch = d;
    const cuda::FfnShape shape{M, H, I, true};
    const size_t need = cuda::FfnForward::required_workspace_bytes(shape, o);
    auto run = [&](cuda::FfnForward& ffn, bool forward) {
      auto g = std::make_unique<DeviceGrads>(M, H, I);
      if (forward) ffn.forward(q.x, q.w(), q.y, nullptr);
      ffn.backward(q.x, q.w(), dy, 0.05, g->views(), nullptr);
      return g;
    };
    cuda::FfnForward still(shape, o);
    const auto want = run(still, true);
    const Tensor y_want = q.y.download();

    cuda::DeviceBuffer a(need), b(need);
    for (const cuda::DeviceBuffer* m : {&a, &b}) cuda::fill_bytes(m->get(), need, 0xa5, nullptr);
    cuda::FfnForward mover(shape, o);  // its own memory first, then the caller's
    mover.forward(q.x, q.w(), q.y, nullptr);
    mover.use_workspace(a.get(), need);
    EXPECT_EQ(mover.workspace_bytes(), need);  // no backward yet: no transpose
    test::expect_error([&] { run(mover, false); }, {"use_workspace() moved the workspace", "run the forward again"});
    cuda::fill_bytes(q.y.view().data, q.y.nbytes(), 0xff, nullptr);
    expect_same_grads(*run(mover, true), *want);
    EXPECT_TRUE(test::bit_equal(q.y.download(), y_want));
    mover.use_workspace(b.get(), need);
    test::expect_error([&] { run(mover, false); }, {"moved the workspace"});
    mover.use_workspace(a.get(), need);  // back where the last forward left its state
    expect_same_grads(*run(mover, false), *want);
    // Refused: null, misaligned, too small; the object stays on `a`.
    test::expect_error([&] { mover.use_workspace(nullptr, need); }, {"use_workspace", "null"});
    test::expect_error([&] { mover.use_workspace(static_cast<char*>(b.get()) + 16, need - 16); }, {"256-byte aligned"});
    test::expect_error([&] { mover.use_workspace(b.get(), need - 1); }, {"holds", "need"});
    expect_same_grads(*run(mover, false), *want);
    mover.use_workspace(b.get(), need);
    expect_same_grads(*run(mover, true), *want);
  }
}

std::vector<BackwardCase> backward_cases() {
  return {
      {67, 256, 1344, 0.02, true},     {67, 256, 1344, 0.3, false},  // spilled tiles, heavy rows
      {1, 512, 1600, 0.05, true},      {33, 64, 64, 0.2, false},     // M = 1; one partial tile
      {129, 192, 320, 0.13, true},     {65, 2048, 5632, 0.005, true},  // odd H; the paper's shape
      {19, 4096, 576, 0.3, true},      {300, 512, 2048, 0.1, true, 128, 4},  // widest H; narrow tiles
      // Neurons with more tokens than a dW piece (64-67 here): every one of them at 90%, the
      // hot ones of a skewed distribution at 5%.
      {600, 128, 256, 0.9, false},     {2048, 256, 512, 0.05, true},
      // dW in column slices (the default slices only past the L2: M in the thousands): 64 of
      // H = 192 (odd), 8 of 2048, and a slice of 8 columns, a lane each.
      {129, 192, 320, 0.13, true, 256, 8, 64}, {65, 2048, 5632, 0.005, true, 256, 8, 256},
      {600, 128, 256, 0.9, false, 256, 8, 8},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, FfnBackwardGpu, testing::ValuesIn(backward_cases()), backward_name);

// The dW pass's column slices change which block adds what, not any sum's order: every slice
// width gives the bits of whole rows.
TEST(FfnBackwardGpuSlices, GiveTheBitsOfWholeRows) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 300, H = 192, I = 640;
  GpuProblem p = make_problem(M, H, I, 0.1);
  DeviceTensor dy = DeviceTensor::upload(test::random_normal(DType::bf16, {M, H}, 1.0, 23));
  auto grads = [&](int64_t slice) {
    cuda::FfnOptions o;
    o.dispatch = Dispatch::always_sparse;
    o.gather_max_tokens = 0;
    o.dw_slice_columns = slice;
    cuda::FfnForward ffn({M, H, I, true}, o);
    ffn.forward(p.x, p.w(), p.y, nullptr);
    DeviceGrads g(M, H, I);
    ffn.backward(p.x, p.w(), dy, 0.05, g.views(), nullptr);
    std::vector<Tensor> out;
    for (const DeviceTensor* t : {&g.dx, &g.dwg, &g.dwu, &g.dwd}) out.push_back(t->download());
    return out;
  };
  const std::vector<Tensor> whole = grads(0);
  for (int64_t slice : {96, 64, 8}) {
    const std::vector<Tensor> sliced = grads(slice);
    for (size_t k = 0; k < whole.size(); ++k) EXPECT_TRUE(test::bit_equal(sliced[k], whole[k])) << slice << " " << k;
  }
}

// The slice width the dW pass takes by default (host only): the widest of H, H/2, ... not under
// 512 columns whose x and dy columns (4·M bytes a column) fit the L2, else the narrowest.
TEST(FfnBackwardDwSlices, WidestThatFitsTheL2) {
  const size_t l2 = size_t{50} << 20;
  EXPECT_EQ(cuda::twell_dw_slice_columns(16384, 2048, l2), 512);   // 33.5 MB
  EXPECT_EQ(cuda::twell_dw_slice_columns(16384, 4096, l2), 512);
  EXPECT_EQ(cuda::twell_dw_slice_columns(2048, 2048, l2), 2048);   // whole rows fit: 16.8 MB
  EXPECT_EQ(cuda::twell_dw_slice_columns(131072, 2048, l2), 512);  // none fits: the narrowest
  EXPECT_EQ(cuda::twell_dw_slice_columns(1 << 20, 960, 0), 960);   // H / 2 under 512
  EXPECT_EQ(cuda::twell_dw_slice_columns(1 << 20, 3008, 0), 752);
  EXPECT_EQ(cuda::twell_dw_slice_columns(0, 4096, l2), 4096);
}

TEST(FfnBackwardGpuEdges, NeedsASparseForwardOfTheSameTokensAndGoodArguments) {
  TWELL_REQUIRE_HOPPER();
  GpuProblem p = make_problem(16, 128, 256, 0.05);
  DeviceTensor dy = DeviceTensor::upload(test::random_normal(DType::bf16, {16, 128}, 1.0, 3));
  DeviceGrads g(16, 128, 256);
  cuda::FfnOptions o;
  o.dispatch = Dispatch::always_dense;
  cuda::FfnForward dense({16, 128, 256, true}, o);
  EXPECT_THROW(dense.backward(p.x, p.w(), dy, 0.0, g.views(), nullptr), Error);  // no forward yet
  dense.forward(p.x, p.w(), p.y, nullptr);
  EXPECT_THROW(dense.backward(p.x, p.w(), dy, 0.0, g.views(), nullptr), Error);  // dense path: no state

  o.dispatch = Dispatch::always_sparse;
  o.gather_max_tokens = 0;
  cuda::FfnForward ffn({16, 128, 256, true}, o);
  ffn.forward(p.x, p.w(), p.y, nullptr);
  DeviceTensor dy32(DType::f32, {16, 128}), bad_dx(DType::f32, {16, 64}), dx_bf16(DType::bf16, {16, 128});
  EXPECT_THROW(ffn.backward(p.x, p.w(), dy32, 0.0, g.views(), nullptr), Error);  // dy must be bf16
  EXPECT_THROW(ffn.backward(p.x, p.w(), dy, -1.0, g.views(), nullptr), Error);   // negative l1
  EXPECT_THROW(ffn.backward(p.x, p.w(), dy, 0.0, {bad_dx.view(), {}, {}, {}}, nullptr), Error);
  EXPECT_THROW(ffn.backward(p.x, p.w(), dy, 0.0, {dx_bf16.view(), {}, {}, {}}, nullptr), Error);
  GpuProblem other = make_problem(8, 128, 256, 0.05);  // not the tokens of the last forward
  EXPECT_THROW(ffn.backward(other.x, other.w(), other.y, 0.0, g.views(), nullptr), Error);
  DeviceTensor x_copy(DType::bf16, {16, 128});  // same shape, not the forward's x
  EXPECT_THROW(ffn.backward(x_copy, p.w(), dy, 0.0, g.views(), nullptr), Error);
  DeviceTensor shared(DType::f32, {256, 128});  // two gradients in one buffer
  EXPECT_THROW(ffn.backward(p.x, p.w(), dy, 0.0, {{}, shared.view(), shared.view(), {}}, nullptr), Error);
  // Only dx requested: the weight gradients stay untouched (poisoned).
  ffn.backward(p.x, p.w(), dy, 0.0, {g.dx.view(), {}, {}, {}}, nullptr);
  const Tensor dwd = g.dwd.download();
  EXPECT_TRUE(std::isnan(load_as_double(dwd, 0)));
  // Without training, then.normed may be x: the forward then writes over x, which dWg and dWu need (refused);
  // dx and dWd do not read x. (M = 16 is past gather_max_tokens = 0: the TwELL path, which keeps the state.)
  {
    GpuProblem q = make_problem(16, 128, 256, 0.05);
    DeviceTensor resid = DeviceTensor::upload(test::random_normal(DType::f32, {16, 128}, 1.0, 5));
    DeviceTensor wn = DeviceTensor::upload(test::random_normal(DType::bf16, {128}, 1.0, 6));
    const cuda::ResidualNorm then{resid.view(), wn.view(), q.x.view(), 1e-5f};
    ffn.forward(q.x, q.w(), q.y, nullptr, 0, &then);
    EXPECT_EQ(ffn.last_path(), cuda::FfnPath::sparse);
    test::expect_error([&] { ffn.backward(q.x, q.w(), dy, 0.0, g.views(), nullptr); },
                 {"wrote then.normed over x, which grads.dwg and grads.dwu need"});
    test::expect_error([&] { ffn.backward(q.x, q.w(), dy, 0.0, {{}, {}, g.dwu.view(), {}}, nullptr); },
                       {"then.normed"});
    EXPECT_NO_THROW(ffn.backward(q.x, q.w(), dy, 0.0, {g.dx.view(), {}, {}, g.dwd.view()}, nullptr));
    ffn.forward(q.x, q.w(), q.y, nullptr);  // a forward without `then`: every gradient again
    EXPECT_NO_THROW(ffn.backward(q.x, q.w(), dy, 0.0, g.views(), nullptr));
    TWELL_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // A dW slice must be a multiple of 8 dividing H.
  for (int64_t bad : {-8, 4, 12, 96, 256}) {
    o.dw_slice_columns = bad;
    EXPECT_THROW(cuda::FfnForward({16, 128, 256, true}, o), Error) << bad;
  }
  // Training with the default gather_max_tokens: calls of few tokens (16, and one) take the TwELL
  // path, which keeps the backward's state, not the gather or one-token path, which keeps none.
  cuda::FfnOptions train;
  train.training = true;
  train.dispatch = Dispatch::always_sparse;
  cuda::FfnForward trainer({16, 128, 256, true}, train);
  trainer.forward(p.x, p.w(), p.y, nullptr);
  EXPECT_EQ(trainer.last_path(), cuda::FfnPath::sparse);
  EXPECT_NO_THROW(trainer.backward(p.x, p.w(), dy, 0.0, g.views(), nullptr));
  GpuProblem one = make_problem(1, 128, 256, 0.05);
  DeviceTensor dy1 = DeviceTensor::upload(test::random_normal(DType::bf16, {1, 128}, 1.0, 4));
  trainer.forward(one.x, one.w(), one.y, nullptr);
  EXPECT_EQ(trainer.last_path(), cuda::FfnPath::sparse);
  DeviceGrads g1(1, 128, 256);
  EXPECT_NO_THROW(trainer.backward(one.x, one.w(), dy1, 0.0, g1.views(), nullptr));
}

}  // namespace
}  // namespace twell
