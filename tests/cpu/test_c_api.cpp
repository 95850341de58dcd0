// The C interface (twell/c_api.h) on the CPU: the same bits as the C++ calls it wraps, errors as a
// code and a message that names the argument, nothing written by a refused call, and the GPU
// calls' answer where there is no GPU (CI) or no CUDA backend.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "common/c_tensor.h"
#include "common/random.h"
#include "cpu/ffn_test_util.h"
#include "twell/c_api.h"
#include "twell/version.h"

namespace twell::cpu_test {
namespace {

using test::c_tensor;

// Expects a failed call (TWELL_ERROR) whose message holds `part`.
#define EXPECT_C_ERROR(call, part)                                                                     \
  do {                                                                                                 \
    EXPECT_EQ((call), TWELL_ERROR);                                                                    \
    EXPECT_NE(std::string(twell_last_error()).find(part), std::string::npos) << twell_last_error();    \
  } while (0)

TEST(CApi, VersionAndPathNames) {
  EXPECT_EQ(twell_c_api_version(), TWELL_C_API_VERSION);
  EXPECT_STREQ(twell_version(), TWELL_VERSION_STRING);
  EXPECT_STREQ(twell_path_name(TWELL_PATH_SPARSE), "sparse");
  EXPECT_STREQ(twell_path_name(TWELL_PATH_DENSE), "dense");
  EXPECT_STREQ(twell_path_name(99), "?");
}

TEST(CApi, CpuForwardAndBackwardAreTheCppCallsBits) {
  for (const bool gated : {true, false}) {
    const Problem p = random_problem(7, 24, 40, gated, DType::bf16, 3);
    const Tensor y_ref(DType::f32, {p.M, p.H}), y(DType::f32, {p.M, p.H});
    const Tensor h_ref(DType::f32, {p.M, p.I}), h(DType::f32, {p.M, p.I});
    ActivationStats s_ref;
    cpu::ffn_forward(p.x, p.weights(), y_ref, Precision::bf16, &s_ref, h_ref);

    const twell_tensor x = c_tensor(p.x), wg = c_tensor(p.weights().wg), wu = c_tensor(p.wu), wd = c_tensor(p.wd),
                       yc = c_tensor(y), hc = c_tensor(h);
    twell_activation_stats s{};
    ASSERT_EQ(twell_cpu_ffn_forward(&x, gated ? &wg : nullptr, &wu, &wd, &yc, TWELL_PRECISION_BF16, &s, &hc), TWELL_OK)
        << twell_last_error();
    EXPECT_STREQ(twell_last_error(), "");
    EXPECT_TRUE(test::bit_equal(y, y_ref));
    EXPECT_TRUE(test::bit_equal(h, h_ref));
    EXPECT_EQ(s.tokens, s_ref.tokens);
    EXPECT_EQ(s.nnz, s_ref.nnz);
    EXPECT_EQ(s.max_nnz_per_token, s_ref.max_nnz_per_token);
    EXPECT_EQ(s.l1_sum, s_ref.l1_sum);

    const Tensor dy = test::random_normal(DType::bf16, {p.M, p.H}, 1.0, 4);
    const Tensor g_ref[4] = {Tensor(DType::f32, {p.M, p.H}), Tensor(DType::f32, {p.I, p.H}),
                             Tensor(DType::f32, {p.I, p.H}), Tensor(DType::f32, {p.I, p.H})};
    const Tensor g[4] = {Tensor(DType::f32, {p.M, p.H}), Tensor(DType::f32, {p.I, p.H}), Tensor(DType::f32, {p.I, p.H}),
                         Tensor(DType::f32, {p.I, p.H})};
    cpu::ffn_backward(p.x, p.weights(), dy, 1e-3,
                      FfnGrads{g_ref[0], gated ? g_ref[1].view() : TensorView{}, g_ref[2], g_ref[3]}, Precision::bf16);
    const twell_tensor dyc = c_tensor(dy), dx = c_tensor(g[0]), dwg = c_tensor(g[1]), dwu = c_tensor(g[2]),
                       dwd = c_tensor(g[3]);
    ASSERT_EQ(twell_cpu_ffn_backward(&x, gated ? &wg : nullptr, &wu, &wd, &dyc, 1e-3, &dx, gated ? &dwg : nullptr,
                                     &dwu, &dwd, TWELL_PRECISION_BF16),
              TWELL_OK)
        << twell_last_error();
    for (int i = 0; i < 4; ++i) {
      if (!gated && i == 1) continue;  // no dwg
      EXPECT_TRUE(test::bit_equal(g[i], g_ref[i])) << "gradient " << i;
    }
  }
}

TEST(CApi, BadArgumentsFailWithAMessageAndWriteNothing) {
  const Problem p = random_problem(5, 16, 32, true, DType::f32, 5);
  const Tensor y(DType::f32, {p.M, p.H});
  std::memset(y.view().data, 0x7f, y.nbytes());
  const Tensor poisoned = y.clone();
  const twell_tensor x = c_tensor(p.x), wg = c_tensor(p.wg), wu = c_tensor(p.wu), wd = c_tensor(p.wd), yc = c_tensor(y);
  auto forward = [&](twell_tensor xt, int32_t precision = TWELL_PRECISION_BF16) {
    return twell_cpu_ffn_forward(&xt, &wg, &wu, &wd, &yc, precision, nullptr, nullptr);
  };
  twell_tensor bad = x;
  bad.shape[1] = p.H + 1;
  EXPECT_C_ERROR(forward(bad), "x is [5, 17], w.wu [32, 16]: their widths H (17 and 16) differ");
  bad = x;
  bad.ndim = 0;
  EXPECT_C_ERROR(forward(bad), "x: ndim must be 1 to 4, got 0");
  bad = x;
  bad.dtype = 17;
  EXPECT_C_ERROR(forward(bad), "x: dtype must be");
  bad = x;
  bad.device = 5;
  EXPECT_C_ERROR(forward(bad), "x: device must be TWELL_DEVICE_CPU or TWELL_DEVICE_CUDA, got 5");
  bad = x;
  bad.shape[0] = -1;
  EXPECT_C_ERROR(forward(bad), "x: negative dimension");
  bad = x;
  bad.device = TWELL_DEVICE_CUDA;
  EXPECT_C_ERROR(forward(bad), "the CPU backend takes host tensors");
  bad = x;  // f32 data two bytes off its elements' alignment
  bad.data = static_cast<char*>(bad.data) + 2;
  bad.shape[0] = p.M - 1;  // within the buffer
  EXPECT_C_ERROR(forward(bad), "is not aligned to its elements (4 bytes)");
  EXPECT_C_ERROR(forward(x, 9), "precision must be");
  EXPECT_C_ERROR(twell_cpu_ffn_forward(&x, &wg, nullptr, &wd, &yc, TWELL_PRECISION_BF16, nullptr, nullptr), "wu");
  twell_tensor wu_none{};  // not given (a zeroed struct): the required wu is missing
  EXPECT_C_ERROR(twell_cpu_ffn_forward(&x, &wg, &wu_none, &wd, &yc, TWELL_PRECISION_BF16, nullptr, nullptr),
                 "w.wu: missing (null data)");
  twell_tensor wg_lost = wg;  // data NULL with a shape of elements: a forgotten pointer, not "no gate"
  wg_lost.data = nullptr;
  EXPECT_C_ERROR(twell_cpu_ffn_forward(&x, &wg_lost, &wu, &wd, &yc, TWELL_PRECISION_BF16, nullptr, nullptr),
                 "wg: data is NULL but ndim is 2 (a shape of elements)");
  // A tensor of no elements with data NULL is given, checked as what it stands for: a wg of [0, H] is
  // not "no wg" (it ran the non-gated FFN), and a gradient of no elements for M = 5 is not skipped.
  twell_tensor wg_empty = wg;
  wg_empty.data = nullptr;
  wg_empty.shape[0] = 0;
  EXPECT_C_ERROR(twell_cpu_ffn_forward(&x, &wg_empty, &wu, &wd, &yc, TWELL_PRECISION_BF16, nullptr, nullptr),
                 "wg: expected shape [32, 16], got [0, 16]");
  const Tensor dy(DType::f32, {p.M, p.H});
  const twell_tensor dyc = c_tensor(dy);
  twell_tensor dx_empty = x;
  dx_empty.data = nullptr;
  dx_empty.shape[0] = 0;
  EXPECT_C_ERROR(twell_cpu_ffn_backward(&x, &wg, &wu, &wd, &dyc, 0.1, &dx_empty, nullptr, nullptr, nullptr,
                                        TWELL_PRECISION_BF16),
                 "grads.dx: expected shape [5, 16], got [0, 16]");
  EXPECT_C_ERROR(twell_cpu_ffn_backward(&x, &wg, &wu, &wd, nullptr, 0.1, nullptr, nullptr, nullptr, nullptr,
                                        TWELL_PRECISION_BF16),
                 "dy: missing (null data)");
  EXPECT_C_ERROR(twell_cpu_ffn_backward(&x, &wg, &wu, &wd, &dyc, 1e39, nullptr, nullptr, nullptr, nullptr,
                                        TWELL_PRECISION_BF16),
                 "l1_coeff: expected a finite value in [0, 3.4e+38] (float's range)");
  EXPECT_TRUE(test::bit_equal(y, poisoned));  // nothing written by any refused call
  // No tokens: data NULL with a dimension 0 is a tensor of no elements (PyTorch's data_ptr() of one)
  twell_tensor x0 = x, y0 = yc;
  x0.data = y0.data = nullptr;
  x0.shape[0] = y0.shape[0] = 0;
  twell_activation_stats s0{};
  s0.tokens = 7;
  ASSERT_EQ(twell_cpu_ffn_forward(&x0, &wg, &wu, &wd, &y0, TWELL_PRECISION_BF16, &s0, nullptr), TWELL_OK)
      << twell_last_error();
  EXPECT_EQ(s0.tokens, 0);
  // A failed call's message stays until the next call on the thread, which clears it.
  ASSERT_EQ(forward(x), TWELL_OK) << twell_last_error();
  EXPECT_STREQ(twell_last_error(), "");
}

TEST(CApi, GpuCallsSayWhyWhereThereIsNoGpu) {
  char why[256];
  std::memset(why, 'x', sizeof why);
  if (twell_cuda_available(why, sizeof why)) GTEST_SKIP() << "a Hopper GPU is present: the GPU tests cover it";
  EXPECT_GT(std::strlen(why), 0u);
  EXPECT_LT(std::strlen(why), sizeof why);
  char tiny[4];
  EXPECT_EQ(twell_cuda_available(tiny, sizeof tiny), 0);
  EXPECT_EQ(std::strlen(tiny), 3u);  // cut, and terminated
  EXPECT_EQ(twell_cuda_available(nullptr, 0), 0);

  twell_cuda_ffn_config c;
  twell_cuda_ffn_config_init(&c, 128, 64, 128);
  EXPECT_EQ(c.gated, 1);
  EXPECT_EQ(c.dispatch, TWELL_DISPATCH_PREVIOUS);
  twell_cuda_ffn* ffn = nullptr;
  EXPECT_EQ(twell_cuda_ffn_create(&c, nullptr, 0, &ffn), TWELL_ERROR);
  EXPECT_GT(std::strlen(twell_last_error()), 0u);
  EXPECT_EQ(ffn, nullptr);
  size_t bytes = 0;  // each says why, as twell_cuda_available does (not a CUDA error's name)
  EXPECT_EQ(twell_cuda_ffn_workspace_bytes(&c, &bytes), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find(why), std::string::npos) << twell_last_error();
  EXPECT_EQ(twell_cuda_release_scratch(), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find(why), std::string::npos) << twell_last_error();
  twell_cuda_ffn_destroy(nullptr);
}

// NULL and unset arguments are refused with a message, never dereferenced (with or without a GPU).
TEST(CApi, NullArgumentsAreRefused) {
  size_t bytes = 0;
  EXPECT_EQ(twell_cuda_ffn_workspace_bytes(nullptr, &bytes), TWELL_ERROR);
  EXPECT_GT(std::strlen(twell_last_error()), 0u);
  twell_cuda_ffn* ffn = nullptr;
  EXPECT_EQ(twell_cuda_ffn_create(nullptr, nullptr, 0, &ffn), TWELL_ERROR);
  EXPECT_EQ(ffn, nullptr);
#if TWELL_WITH_CUDA  // the arguments are checked before the GPU is looked for
  EXPECT_NE(std::string(twell_last_error()).find("twell_cuda_ffn_config: NULL"), std::string::npos)
      << twell_last_error();
  {
    twell_cuda_ffn_config c;
    twell_cuda_ffn_config_init(&c, 128, 64, 128);
    EXPECT_EQ(twell_cuda_ffn_create(&c, nullptr, 4096, &ffn), TWELL_ERROR);  // a size without the memory
    EXPECT_NE(std::string(twell_last_error()).find("workspace is NULL with 4096 bytes"), std::string::npos)
        << twell_last_error();
    c.max_tokens = -5;
    for (int call = 0; call < 2; ++call) {
      EXPECT_EQ(call ? twell_cuda_ffn_create(&c, nullptr, 0, &ffn) : twell_cuda_ffn_workspace_bytes(&c, &bytes),
                TWELL_ERROR);
      EXPECT_NE(std::string(twell_last_error()).find("max_tokens, hidden and ffn must be positive, got -5"),
                std::string::npos)
          << twell_last_error();
    }
    EXPECT_EQ(ffn, nullptr);
  }
#endif
  EXPECT_EQ(twell_cuda_ffn_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), TWELL_ERROR);
  EXPECT_EQ(twell_cuda_ffn_use_workspace(nullptr, nullptr, 0), TWELL_ERROR);
  twell_ffn_stats s;
  EXPECT_EQ(twell_cuda_ffn_last_stats(nullptr, &s), TWELL_ERROR);
  EXPECT_EQ(twell_cpu_ffn_forward(nullptr, nullptr, nullptr, nullptr, nullptr, TWELL_PRECISION_BF16, nullptr, nullptr),
            TWELL_ERROR);
  twell_cuda_ffn_config_init(nullptr, 1, 64, 64);  // nothing to do
#if TWELL_WITH_CUDA
  twell_cuda_ffn_config c;
  twell_cuda_ffn_config_init(&c, 128, 64, 128);
  for (int64_t r : c.reserved) EXPECT_EQ(r, 0);
  EXPECT_EQ(c.cublaslt_workspace, nullptr);  // the handle's own
  EXPECT_EQ(c.cublaslt_workspace_bytes, 0);
  c.cublaslt_workspace_bytes = -1;
  EXPECT_EQ(twell_cuda_ffn_workspace_bytes(&c, &bytes), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find("cublaslt_workspace_bytes must be >= 0"), std::string::npos)
      << twell_last_error();
  c.cublaslt_workspace_bytes = 0;
  c.reserved[1] = 1;
  EXPECT_EQ(twell_cuda_ffn_workspace_bytes(&c, &bytes), TWELL_ERROR);
  EXPECT_NE(std::string(twell_last_error()).find("reserved fields must be 0"), std::string::npos) << twell_last_error();
#endif
}

}  // namespace
}  // namespace twell::cpu_test
