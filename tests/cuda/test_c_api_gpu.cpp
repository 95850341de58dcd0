// The C interface's GPU calls (twell/c_api.h): an FfnForward through a handle gives the C++ object's
// bits, forward and backward, in its own workspace or the caller's; refused calls write nothing.
#include <gtest/gtest.h>

#include <string>

#include "common/compare.h"
#include "common/c_tensor.h"
#include "common/random.h"
#include "cuda/cublaslt_gemm.h"
#include "gpu_test.h"
#include "synthetic.h"
#include "twell/c_api.h"
#include "twell/cuda/ffn.h"

namespace twell {
namespace {

using cuda::DeviceTensor;

using test::c_tensor;

struct Handle {
  twell_cuda_ffn* p = nullptr;
  ~Handle() { twell_cuda_ffn_destroy(p); }
};

// Outputs poisoned with different bytes on the two sides, so that an element neither writes differs.
DeviceTensor poisoned(DType t, const Shape& s, int byte = 0xff) {
  DeviceTensor d(t, s);
  cuda::fill_bytes(d.view().data, d.nbytes(), byte, nullptr);
  return d;
}

TEST(CApiGpu, ForwardAndBackwardAreTheObjectsBits) {
  TWELL_REQUIRE_HOPPER();
  char why[128];
  ASSERT_EQ(twell_cuda_available(why, sizeof why), 1);
  EXPECT_STREQ(why, "");
  const int64_t M = 300, H = 256, I = 640;
  const bench::SyntheticFfn f = bench::make_synthetic_ffn({M, H, I, 0.02, bench::Distribution::skewed, true, 9});
  const DeviceTensor x = DeviceTensor::upload(f.x), wg = DeviceTensor::upload(f.wg), wu = DeviceTensor::upload(f.wu),
                     wd = DeviceTensor::upload(f.wd);
  const DeviceTensor dy = DeviceTensor::upload(test::random_normal(DType::bf16, {M, H}, 1.0, 4));
  const FfnWeights w{wg.view(), wu.view(), wd.view()};
  const twell_tensor xc = c_tensor(x.view()), wgc = c_tensor(wg.view()), wuc = c_tensor(wu.view()),
                     wdc = c_tensor(wd.view()), dyc = c_tensor(dy.view());
  for (const int32_t dispatch : {TWELL_DISPATCH_ALWAYS_SPARSE, TWELL_DISPATCH_ALWAYS_DENSE}) {
    for (const bool callers_workspace : {false, true}) {
      SCOPED_TRACE(std::to_string(dispatch) + (callers_workspace ? " caller's workspace" : " own workspace"));
      twell_cuda_ffn_config c;
      twell_cuda_ffn_config_init(&c, M, H, I);
      c.dispatch = dispatch;
      c.training = 1;
      cuda::FfnOptions o;
      o.dispatch = static_cast<cuda::Dispatch>(dispatch);
      o.training = true;
      cuda::FfnForward ref({M, H, I, true}, o);
      DeviceTensor y_ref = poisoned(DType::bf16, {M, H}), y = poisoned(DType::bf16, {M, H}, 0x7f);
      ref.forward(x, w, y_ref, nullptr);
      DeviceTensor g_ref[4] = {poisoned(DType::f32, {M, H}), poisoned(DType::f32, {I, H}),
                               poisoned(DType::f32, {I, H}), poisoned(DType::f32, {I, H})};
      ref.backward(x, w, dy, 1e-4, {g_ref[0], g_ref[1], g_ref[2], g_ref[3]}, nullptr);

      size_t need = 0;
      ASSERT_EQ(twell_cuda_ffn_workspace_bytes(&c, &need), TWELL_OK) << twell_last_error();
      EXPECT_EQ(need, cuda::FfnForward::required_workspace_bytes({M, H, I, true}, o));
      cuda::DeviceBuffer ws(callers_workspace ? need : 1);
      cuda::DeviceBuffer lt(callers_workspace ? cuda::LtGemm::kWorkspaceBytes : 1);  // cuBLASLt's too, the same size
      if (callers_workspace) {
        c.cublaslt_workspace = lt.get();
        c.cublaslt_workspace_bytes = static_cast<int64_t>(lt.bytes());
      }
      Handle h;
      ASSERT_EQ(twell_cuda_ffn_create(&c, callers_workspace ? ws.get() : nullptr, callers_workspace ? need : 0, &h.p),
                TWELL_OK)
          << twell_last_error();
      const twell_tensor yc = c_tensor(y.view());
      ASSERT_EQ(twell_cuda_ffn_forward(h.p, &xc, &wgc, &wuc, &wdc, &yc, nullptr), TWELL_OK) << twell_last_error();
      EXPECT_TRUE(test::bit_equal(y.download(), y_ref.download()));
      twell_ffn_stats s{};
      ASSERT_EQ(twell_cuda_ffn_last_stats(h.p, &s), TWELL_OK);
      EXPECT_EQ(s.path, static_cast<int32_t>(ref.last_path()));
      EXPECT_EQ(s.tokens, M);
      EXPECT_EQ(s.nnz, ref.last_stats().nnz);

      DeviceTensor g[4] = {poisoned(DType::f32, {M, H}, 0x7f), poisoned(DType::f32, {I, H}, 0x7f),
                           poisoned(DType::f32, {I, H}, 0x7f), poisoned(DType::f32, {I, H}, 0x7f)};
      const twell_tensor dx = c_tensor(g[0].view()), dwg = c_tensor(g[1].view()), dwu = c_tensor(g[2].view()),
                         dwd = c_tensor(g[3].view());
      ASSERT_EQ(twell_cuda_ffn_backward(h.p, &xc, &wgc, &wuc, &wdc, &dyc, 1e-4, &dx, &dwg, &dwu, &dwd, nullptr),
                TWELL_OK)
          << twell_last_error();
      for (int i = 0; i < 4; ++i)
        EXPECT_TRUE(test::bit_equal(g[i].download(), g_ref[i].download())) << "gradient " << i;
    }
  }
}

TEST(CApiGpu, RefusedCallsSayWhyAndWriteNothing) {
  TWELL_REQUIRE_HOPPER();
  const int64_t M = 64, H = 128, I = 256;
  const bench::SyntheticFfn f = bench::make_synthetic_ffn({M, H, I, 0.02, bench::Distribution::uniform, true, 3});
  const DeviceTensor x = DeviceTensor::upload(f.x), wg = DeviceTensor::upload(f.wg), wu = DeviceTensor::upload(f.wu),
                     wd = DeviceTensor::upload(f.wd);
  DeviceTensor y = poisoned(DType::bf16, {M, H});
  const Tensor before = y.download();
  twell_cuda_ffn_config c;
  twell_cuda_ffn_config_init(&c, M, H, I);
  Handle h;
  ASSERT_EQ(twell_cuda_ffn_create(&c, nullptr, 0, &h.p), TWELL_OK) << twell_last_error();
  const twell_tensor xc = c_tensor(x.view()), wgc = c_tensor(wg.view()), wuc = c_tensor(wu.view()),
                     wdc = c_tensor(wd.view()), yc = c_tensor(y.view());
  auto expect_refused = [&](twell_tensor xt, const std::string& part) {
    EXPECT_EQ(twell_cuda_ffn_forward(h.p, &xt, &wgc, &wuc, &wdc, &yc, nullptr), TWELL_ERROR);
    EXPECT_NE(std::string(twell_last_error()).find(part), std::string::npos) << twell_last_error();
  };
  twell_tensor bad = xc;
  bad.shape[0] = M + 1;  // more tokens than the workspace holds
  expect_refused(bad, "x has 65 tokens, the workspace holds 64");
  bad = xc;
  bad.shape[1] = H - 64;
  expect_refused(bad, "x");
  bad = xc;
  bad.dtype = TWELL_DTYPE_F32;
  expect_refused(bad, "bf16");
  bad = xc;
  bad.device = TWELL_DEVICE_CPU;
  expect_refused(bad, "x");
  // Host memory tagged as the GPU's, pageable or pinned: refused before any kernel could fault on it.
  std::vector<uint16_t> host(static_cast<size_t>(M * H));
  bad = xc;
  bad.data = host.data();
  expect_refused(bad, "FfnForward: x: tagged as GPU memory, but its address is host memory");
  cuda::PinnedBuffer pinned(static_cast<size_t>(M * H) * 2);
  bad.data = pinned.get();
  expect_refused(bad, "FfnForward: x: tagged as GPU memory, but its address is pinned host memory");
  twell_tensor host_wd = wdc;
  std::vector<uint16_t> host_w(static_cast<size_t>(I * H));
  host_wd.data = host_w.data();
  EXPECT_EQ(twell_cuda_ffn_forward(h.p, &xc, &wgc, &wuc, &host_wd, &yc, nullptr), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find("FfnForward: wd: tagged as GPU memory"), std::string::npos)
      << twell_last_error();
  EXPECT_TRUE(test::bit_equal(y.download(), before));

  EXPECT_EQ(twell_cuda_ffn_forward(nullptr, &xc, &wgc, &wuc, &wdc, &yc, nullptr), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find("NULL"), std::string::npos) << twell_last_error();
  // The handle's buffers moved (twell_cuda_ffn_use_workspace): NULL and too little memory refused, and
  // the handle runs on the memory it is given.
  size_t need = 0;
  ASSERT_EQ(twell_cuda_ffn_workspace_bytes(&c, &need), TWELL_OK) << twell_last_error();
  cuda::DeviceBuffer moved(need);
  EXPECT_EQ(twell_cuda_ffn_use_workspace(h.p, nullptr, need), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find("workspace is NULL"), std::string::npos) << twell_last_error();
  EXPECT_EQ(twell_cuda_ffn_use_workspace(h.p, moved.get(), need - 1), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find("need"), std::string::npos) << twell_last_error();
  EXPECT_TRUE(test::bit_equal(y.download(), before));
  ASSERT_EQ(twell_cuda_ffn_use_workspace(h.p, moved.get(), need), TWELL_OK) << twell_last_error();
  ASSERT_EQ(twell_cuda_ffn_forward(h.p, &xc, &wgc, &wuc, &wdc, &yc, nullptr), TWELL_OK) << twell_last_error();
  cuda::FfnForward twin({M, H, I, true});  // the config's defaults: its first call, as the handle's
  DeviceTensor y_twin = poisoned(DType::bf16, {M, H});
  twin.forward(x, {wg.view(), wu.view(), wd.view()}, y_twin, nullptr);
  EXPECT_TRUE(test::bit_equal(y.download(), y_twin.download()));
  twell_cuda_ffn_config odd = c;
  odd.hidden = 100;  // not a multiple of 64
  twell_cuda_ffn* none = nullptr;
  EXPECT_EQ(twell_cuda_ffn_create(&odd, nullptr, 0, &none), TWELL_ERROR);
  EXPECT_EQ(none, nullptr);
  odd = c;
  cuda::DeviceBuffer lt(1024);
  odd.cublaslt_workspace = lt.as<char>() + 16;
  odd.cublaslt_workspace_bytes = 512;
  EXPECT_EQ(twell_cuda_ffn_create(&odd, nullptr, 0, &none), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find("cublaslt_workspace"), std::string::npos) << twell_last_error();
  odd.cublaslt_workspace = lt.get();
  odd.cublaslt_workspace_bytes = -1;
  EXPECT_EQ(twell_cuda_ffn_create(&odd, nullptr, 0, &none), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find("cublaslt_workspace_bytes must be >= 0"), std::string::npos)
      << twell_last_error();
  EXPECT_EQ(none, nullptr);
  odd = c;
  odd.precision = TWELL_PRECISION_F64;
  EXPECT_EQ(twell_cuda_ffn_create(&odd, nullptr, 0, &none), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find("on the GPU"), std::string::npos) << twell_last_error();
  // A backward before any forward of the handle's has nothing to differentiate.
  const DeviceTensor dy = poisoned(DType::bf16, {M, H});
  const twell_tensor dyc = c_tensor(dy.view());
  EXPECT_EQ(twell_cuda_ffn_backward(h.p, &xc, &wgc, &wuc, &wdc, &dyc, 0.0, nullptr, nullptr, nullptr, nullptr, nullptr),
            TWELL_ERROR);
  EXPECT_GT(std::string(twell_last_error()).size(), 0u);
}

}  // namespace
}  // namespace twell
