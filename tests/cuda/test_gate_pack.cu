// The fused gate GEMM + TwELL pack (launch_gate_pack, src/cuda/kernels/gate_pack.cu):
//   - its TwELL is a valid hybrid matrix whose tiles are exactly what the host packer makes of the
//     same values (entry order, zero-filled slots, counts), spilled tiles included;
//   - those values are ReLU(x Wᵀ) within bf16 rounding of a float64 reference (a pre-activation
//     within fp32 accumulation error of 0 may fall either side);
//   - the row counts, the heavy-row list and the non-zero total agree with the matrix;
// at both tile widths (256 and 176), at M = 1, M not a multiple of the GEMM's 64- or 128-row tile, a
// partial last TwELL tile (I % T ≠ 0), K not a multiple of the 64-wide k-block, and densities from
// empty rows to every full tile spilled, and at compression 16 (11 slots a tile) as well as 8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "cuda/kernels.h"
#include "gpu_test.h"
#include "synthetic.h"
#include "twell/cuda/twell_device.h"

namespace twell {
namespace {

using cuda::DeviceBuffer;
using cuda::DeviceTensor;

struct GateCase {
  int64_t M, H, I;
  double density;
  bool skewed;
  bool spills = false, heavy = false;  // the case must have spilled tiles / heavy rows (coverage)
  int32_t tile = 256;                  // TwELL tile width: 256 (64 × 256 GEMM tiles) or 176 (128 × 176)
  int32_t compression = 8;             // slots a tile: tile / compression
};

std::string case_name(const testing::TestParamInfo<GateCase>& info) {
  const auto& c = info.param;
  return str("M", c.M, "_H", c.H, "_I", c.I, "_d", static_cast<int>(std::lround(c.density * 1000)), "permille_",
             c.skewed ? "skewed" : "uniform", c.tile == 256 ? "" : str("_T", c.tile),
             c.compression == 8 ? "" : str("_C", c.compression));
}

// What one fused launch produced, copied back.
struct GatePackResult {
  TwellMatrix act;
  std::vector<uint32_t> row_nnz, heavy_rows;
  unsigned long long nnz_total = 0;
  unsigned int overflow = 0;
};

GatePackResult run_gate_pack(const TensorView& x, const TensorView& w, const TwellLayout& layout) {
  const int64_t M = layout.rows;
  const int sm_count = cuda::device_info().sm_count;
  DeviceTensor xd = DeviceTensor::upload(x), wd = DeviceTensor::upload(w);
  cuda::TwellDeviceMatrix act(layout);
  DeviceBuffer counters((cuda::kNnzCounters + 2) * sizeof(unsigned long long));  // nnz, overflow, heavy count
  DeviceBuffer row_nnz(std::max<int64_t>(M, 1) * 4), heavy(std::max<int64_t>(M, 1) * 4);
  cuda::fill_bytes(counters.get(), counters.bytes(), 0, nullptr);
  cuda::fill_bytes(row_nnz.get(), row_nnz.bytes(), 0, nullptr);  // zero at launch: the epilogue adds to it
  // Poisoned: every word the launch owes must be written.
  cuda::fill_bytes(act.view().slots, static_cast<size_t>(layout.slot_size()) * 4, 0xff, nullptr);
  cuda::fill_bytes(act.view().counts, static_cast<size_t>(layout.count_size()) * 4, 0xff, nullptr);
  cuda::fill_bytes(act.view().backup, static_cast<size_t>(act.view().backup_capacity) * layout.tile * 2, 0xff,
                   nullptr);
  cuda::fill_bytes(act.view().n_backup, 4, 0, nullptr);
  auto* nnz = counters.as<unsigned long long>();
  auto* overflow = reinterpret_cast<unsigned int*>(nnz + cuda::kNnzCounters);
  auto* heavy_count = reinterpret_cast<uint32_t*>(nnz + cuda::kNnzCounters + 1);

  cuda::GatePackArgs a;
  a.x = static_cast<const uint16_t*>(xd.view().data);
  a.w = static_cast<const uint16_t*>(wd.view().data);
  a.M = M, a.H = x.shape[1], a.I = layout.cols;
  a.act = act.view();
  a.nnz_total = nnz;
  a.overflow = overflow;
  a.rows = {row_nnz.as<uint32_t>(), heavy.as<uint32_t>(), heavy_count};
  DeviceBuffer workspace(std::max<size_t>(cuda::gate_pack_workspace_bytes(a, sm_count), 1));
  cuda::launch_gate_pack(a, workspace.get(), workspace.bytes(), sm_count, nullptr);
  TWELL_CUDA_CHECK(cudaDeviceSynchronize());

  GatePackResult r;
  r.act = act.download();
  std::vector<unsigned long long> c(cuda::kNnzCounters + 2);
  TWELL_CUDA_CHECK(cudaMemcpy(c.data(), counters.get(), counters.bytes(), cudaMemcpyDeviceToHost));
  for (int i = 0; i < cuda::kNnzCounters; ++i) r.nnz_total += c[i];
  r.overflow = static_cast<unsigned int>(c[cuda::kNnzCounters] & 0xffffffffu);
  const auto n_heavy = static_cast<uint32_t>(c[cuda::kNnzCounters + 1] & 0xffffffffu);
  r.row_nnz.resize(M);
  r.heavy_rows.resize(n_heavy);
  TWELL_CUDA_CHECK(cudaMemcpy(r.row_nnz.data(), row_nnz.get(), M * 4, cudaMemcpyDeviceToHost));
  TWELL_CUDA_CHECK(cudaMemcpy(r.heavy_rows.data(), heavy.get(), n_heavy * 4, cudaMemcpyDeviceToHost));
  return r;
}

class GatePackGpu : public testing::TestWithParam<GateCase> {};

// A NaN in x makes its row of g NaN: the ReLU must not turn it into zeros, so every value of that
// row is an active NaN (its tiles spill), and the other rows are untouched.
TEST(GatePackGpu, NaNInXIsNotLost) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 70, H = 128, I = 576, nan_row = 5;
  const bench::SyntheticFfn f =
      bench::make_synthetic_ffn({M, H, I, 0.02, bench::Distribution::uniform, true, 7});
  Tensor x = f.x.clone();
  x.ptr<bf16>()[nan_row * H + 3] = bf16(std::nanf(""));
  for (const int32_t tile : {256, 176}) {
    SCOPED_TRACE(str("tile ", tile));
    const TwellLayout layout{M, I, tile, 8};
    const GatePackResult r = run_gate_pack(x, f.wg, layout);
    twell_validate(r.act);
    Tensor g = Tensor::of<bf16>({M, I});
    twell_unpack(r.act, g);
    const auto* gp = g.view().ptr<bf16>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < I; ++i)
        ASSERT_EQ(std::isnan(float(gp[m * I + i])), m == nan_row) << "row " << m << " column " << i;
    EXPECT_EQ(r.row_nnz[nan_row], static_cast<uint32_t>(I));
  }
}

TEST_P(GatePackGpu, PacksReluOfTheGateExactlyAsTheHostPacker) {
  TWELL_REQUIRE_HOPPER();
  const GateCase& c = GetParam();
  bench::SyntheticSpec spec{c.M, c.H, c.I, c.density,
                            c.skewed ? bench::Distribution::skewed : bench::Distribution::uniform, true, 7};
  const bench::SyntheticFfn f = bench::make_synthetic_ffn(spec);
  const TwellLayout layout{c.M, c.I, c.tile, c.compression};
  const GatePackResult r = run_gate_pack(f.x, f.wg, layout);

  twell_validate(r.act);
  EXPECT_EQ(r.overflow, 0u);
  Tensor g = Tensor::of<bf16>({c.M, c.I});
  twell_unpack(r.act, g);

  // Tile by tile what the host packer makes of the same values (word 0 of a spilled tile is its
  // backup index, which depends on the order the tiles were claimed in).
  const TwellMatrix host = twell_pack(g, layout);
  ASSERT_EQ(r.act.counts, host.counts);
  int64_t spilled = 0;
  for (int64_t tile = 0; tile < layout.count_size(); ++tile) {
    if (twell_is_spilled(layout, host.counts[tile])) {
      ++spilled;
      continue;
    }
    for (int32_t k = 0; k < layout.slots(); ++k)
      ASSERT_EQ(r.act.slots[tile * layout.slots() + k], host.slots[tile * layout.slots() + k])
          << "tile " << tile << " slot " << k;
  }
  EXPECT_EQ(r.act.n_backup(), spilled);

  // Against float64: ReLU(x Wᵀ) rounded to bf16 (relative 2^-8), with an absolute allowance for
  // the fp32 accumulation (values that close to 0 may be packed or not).
  const auto* xp = f.x.view().ptr<bf16>();
  const auto* wp = f.wg.view().ptr<bf16>();
  const auto* gp = g.view().ptr<bf16>();
  int64_t bad = 0, ref_nnz = 0;
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t i = 0; i < c.I; ++i) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < c.H; ++k) {
        const double p = double(float(xp[m * c.H + k])) * double(float(wp[i * c.H + k]));
        acc += p;
        mag += std::fabs(p);
      }
      const double ref = std::max(acc, 0.0), got = float(gp[m * c.I + i]);
      ref_nnz += ref > 0;
      const double tol = std::ldexp(std::fabs(ref), -8) + 1e-5 * mag;
      if (std::fabs(got - ref) > tol && ++bad <= 5)
        ADD_FAILURE() << "g[" << m << ", " << i << "] = " << got << ", float64 reference " << ref;
    }
  EXPECT_EQ(bad, 0);

  // Row counts, heavy rows and the total.
  std::set<uint32_t> heavy_expected;
  for (int64_t m = 0; m < c.M; ++m) {
    int64_t n = 0;
    r.act.for_each_in_row(m, [&](int64_t, uint16_t) { ++n; });
    ASSERT_EQ(r.row_nnz[m], n) << "row " << m;
    if (n > cuda::kHeavyRowEntries) heavy_expected.insert(static_cast<uint32_t>(m));
  }
  EXPECT_EQ(std::set<uint32_t>(r.heavy_rows.begin(), r.heavy_rows.end()), heavy_expected);
  EXPECT_EQ(r.heavy_rows.size(), heavy_expected.size()) << "a heavy row listed twice";
  EXPECT_EQ(static_cast<int64_t>(r.nnz_total), r.act.nnz());
  if (c.spills) EXPECT_GT(spilled, 0) << "the case no longer covers spilled tiles";
  if (c.heavy) EXPECT_FALSE(heavy_expected.empty()) << "the case no longer covers heavy rows";
  std::printf("[ info ] nnz %lld (float64 %lld), spilled tiles %lld, heavy rows %zu\n",
              static_cast<long long>(r.act.nnz()), static_cast<long long>(ref_nnz), static_cast<long long>(spilled),
              heavy_expected.size());
}

INSTANTIATE_TEST_SUITE_P(Shapes, GatePackGpu,
                         testing::Values(GateCase{1, 2048, 5632, 0.005, false},
                                         GateCase{260, 2048, 5632, 0.005, true, false, true},  // heavy rows
                                         GateCase{77, 72, 1000, 0.02, false},  // K < 64 + 8, partial tile
                                         GateCase{129, 512, 5632, 0.1, true, true, true},  // some tiles spilled
                                         GateCase{200, 256, 776, 0.5, false, true, true},  // every full tile spilled
                                         GateCase{130, 320, 512, 0.0, false},              // empty rows
                                         // T = 176: 128-token GEMM tiles, so M = 1, M = 300 and
                                         // M = 130 end mid-tile; I = 1000 and 776 end mid-TwELL-tile
                                         GateCase{1, 2048, 5632, 0.005, false, false, false, 176},
                                         // compression 16: 11 slots a tile, some tiles spilled
                                         GateCase{150, 256, 1056, 0.04, false, true, false, 176, 16},
                                         GateCase{300, 512, 2112, 0.02, true, false, true, 176},
                                         GateCase{77, 72, 1000, 0.02, false, false, false, 176},
                                         GateCase{129, 512, 5632, 0.1, true, true, true, 176},
                                         GateCase{200, 256, 776, 0.5, false, true, true, 176},
                                         GateCase{130, 320, 528, 0.0, false, false, false, 176}),
                         case_name);

TEST(GatePackGpu, RejectsWhatItCannotRun) {
  TWELL_REQUIRE_HOPPER();
  cuda::GatePackArgs a;
  DeviceBuffer buf(1 << 16);
  a.x = a.w = buf.as<uint16_t>();
  a.M = 4, a.H = 64, a.I = 512;
  a.act.layout = {4, 512, 128, 8};  // tile width 128: the epilogue packs 256- or 176-wide tiles
  EXPECT_THROW(cuda::check_gate_pack(a), Error);
  a.act.layout = {4, 512, 176, 8};
  EXPECT_NO_THROW(cuda::check_gate_pack(a));
  a.act.layout = {4, 512, 256, 8};
  a.H = 60;  // rows not 16-byte multiples
  EXPECT_THROW(cuda::check_gate_pack(a), Error);
  a.H = 64;
  a.x = buf.as<uint16_t>() + 1;  // misaligned
  EXPECT_THROW(cuda::check_gate_pack(a), Error);
  a.x = buf.as<uint16_t>();
  a.act.layout.rows = 5;  // layout for other M
  EXPECT_THROW(cuda::check_gate_pack(a), Error);
}

}  // namespace
}  // namespace twell
