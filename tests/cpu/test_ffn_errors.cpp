// Bad arguments to the CPU FFN ops throw twell::Error naming the argument and saying what was
// expected and what was given.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "ffn_test_util.h"
#include "twell/cpu/ffn.h"

namespace twell::cpu_test {
namespace {

// Runs f, expects a twell::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(msg.find(part), std::string::npos)
          << "message \"" << msg << "\" lacks \"" << part << "\"";
    return;
  }
  ADD_FAILURE() << "no twell::Error thrown";
}

class CpuFfnErrors : public ::testing::Test {
 protected:
  const int64_t M = 3, H = 5, I = 7;
  Problem p = random_problem(M, H, I, true, DType::f32, 1);
  Tensor y = Tensor(DType::f32, {M, H});
};

TEST_F(CpuFfnErrors, WrongShapesNameTheArgumentAndBothShapes) {
  Tensor wd_bad(DType::f32, {I, H + 1});
  FfnWeights w = p.weights();
  w.wd = wd_bad;
  expect_error([&] { cpu::ffn_forward(p.x, w, y, Precision::bf16); },
               {"ffn_forward", "w.wd", "[7, 5]", "[7, 6]"});

  Tensor x_wide(DType::f32, {M, H + 1});  // x's width is not the weights': said of both, not blamed on w.wu
  Tensor y_wide(DType::f32, {M, H + 1});
  expect_error([&] { cpu::ffn_forward(x_wide, p.weights(), y_wide, Precision::bf16); },
               {"ffn_forward: x is [3, 6], w.wu [7, 5]: their widths H (6 and 5) differ"});

  Tensor wg_bad(DType::f32, {I + 1, H});
  w = p.weights();
  w.wg = wg_bad;
  expect_error([&] { cpu::ffn_forward(p.x, w, y, Precision::bf16); }, {"w.wg", "[7, 5]", "[8, 5]"});

  Tensor y_bad(DType::f32, {M + 1, H});
  expect_error([&] { cpu::ffn_forward(p.x, p.weights(), y_bad, Precision::bf16); },
               {"ffn_forward: y", "[3, 5]", "[4, 5]"});

  Tensor x1(DType::f32, {M * H});
  expect_error([&] { cpu::ffn_forward(x1, p.weights(), y, Precision::bf16); },
               {"x", "2-d", "[15]"});

  Tensor h_bad(DType::f32, {M, I - 1});
  expect_error([&] { cpu::ffn_forward(p.x, p.weights(), y, Precision::bf16, nullptr, h_bad); },
               {"h_out", "[3, 7]", "[3, 6]"});
}

TEST_F(CpuFfnErrors, WrongDtypesAndMismatchedWeightsAreRejected) {
  Tensor xi(DType::i32, {M, H});
  expect_error([&] { cpu::ffn_forward(xi, p.weights(), y, Precision::bf16); }, {"x", "i32"});

  Tensor wd16(DType::bf16, {I, H});
  FfnWeights w = p.weights();
  w.wd = wd16;
  expect_error([&] { cpu::ffn_forward(p.x, w, y, Precision::bf16); },
               {"w.wd", "expected dtype f32", "bf16"});

  Tensor yi(DType::i64, {M, H});
  expect_error([&] { cpu::ffn_forward(p.x, p.weights(), yi, Precision::bf16); }, {"y", "i64"});

  w = p.weights();
  w.wu = TensorView{};
  expect_error([&] { cpu::ffn_forward(p.x, w, y, Precision::bf16); }, {"w.wu", "missing"});

  TensorView on_device = p.x.view();
  on_device.device = Device::cuda;
  expect_error([&] { cpu::ffn_forward(on_device, p.weights(), y, Precision::bf16); },
               {"x", "host"});
}

TEST_F(CpuFfnErrors, CheckFfnArgsIsBackendIndependent) {
  check_ffn_args(p.x, p.weights(), y);
  TensorView on_device = p.x.view();
  on_device.device = Device::cuda;
  TensorView y_dev = y.view();
  y_dev.device = Device::cuda;
  check_ffn_args(on_device, p.weights(), y_dev);  // devices are the backend's business
  Tensor y_bad(DType::f32, {M, H + 2});
  expect_error([&] { check_ffn_args(p.x, p.weights(), y_bad); }, {"y", "[3, 5]", "[3, 7]"});
}

TEST_F(CpuFfnErrors, BackwardChecksEveryGradient) {
  Tensor dy(DType::f32, {M, H}), dx(DType::f32, {M, H}), dwg(DType::f32, {I, H}),
      dwu(DType::f32, {I, H}), dwd(DType::f32, {I, H});
  cpu::ffn_backward(p.x, p.weights(), dy, 0.0, {dx, dwg, dwu, dwd}, Precision::bf16);

  Tensor dwu_bad(DType::f32, {I, H - 1});
  expect_error(
      [&] {
        cpu::ffn_backward(p.x, p.weights(), dy, 0.0, {dx, dwg, dwu_bad, dwd}, Precision::bf16);
      },
      {"ffn_backward", "grads.dwu", "[7, 5]", "[7, 4]"});
  Tensor dx16(DType::bf16, {M, H});
  expect_error(
      [&] {
        cpu::ffn_backward(p.x, p.weights(), dy, 0.0, {dx16, dwg, dwu, dwd}, Precision::bf16);
      },
      {"grads.dx", "f32 or f64", "bf16"});
  Tensor dy_bad(DType::f32, {M, H + 1});
  expect_error(
      [&] {
        cpu::ffn_backward(p.x, p.weights(), dy_bad, 0.0, {dx, dwg, dwu, dwd}, Precision::bf16);
      },
      {"dy", "[3, 5]", "[3, 6]"});
  const FfnWeights non_gated{TensorView{}, p.wu.view(), p.wd.view()};
  expect_error(
      [&] {
        cpu::ffn_backward(p.x, non_gated, dy, 0.0, {dx, dwg, dwu, dwd}, Precision::bf16);
      },
      {"grads.dwg", "non-gated"});
  expect_error(
      [&] {
        cpu::ffn_backward(p.x, p.weights(), dy, -1.0, {dx, dwg, dwu, dwd}, Precision::bf16);
      },
      {"l1_coeff"});
  // Gradients are written while the inputs are read: overlapping memory is refused, not corrupted.
  expect_error([&] { cpu::ffn_backward(p.x, p.weights(), dy, 0.0, {dx, dwg, dwd, dwd}, Precision::bf16); },
               {"ffn_backward", "grads.dwu", "overlaps", "grads.dwd"});
  const TensorView dy_as_dx = dy.view();
  expect_error([&] { cpu::ffn_backward(p.x, p.weights(), dy, 0.0, {dy_as_dx, {}, {}, {}}, Precision::bf16); },
               {"grads.dx", "overlaps", "dy"});
  Tensor dw_in_place = p.wd.clone();
  FfnWeights w = p.weights();
  w.wd = dw_in_place;
  const TensorView dwd_over_wd = dw_in_place.view();
  expect_error([&] { cpu::ffn_backward(p.x, w, dy, 0.0, {{}, {}, {}, dwd_over_wd}, Precision::bf16); },
               {"grads.dwd", "overlaps", "w.wd"});
}

// The forward writes y (and h_out) while it reads x and the weights: overlapping memory is refused
// and nothing is written.
TEST_F(CpuFfnErrors, OutputsOverlappingInputsAreRefused) {
  const Tensor x_before = p.x.clone();
  TensorView y_over_x = p.x.view();  // [3, 5] f32, as y must be
  expect_error([&] { cpu::ffn_forward(p.x, p.weights(), y_over_x, Precision::bf16); },
               {"ffn_forward", "y's memory overlaps x's"});
  EXPECT_TRUE(test::bit_equal(p.x, x_before));
  Tensor wd = p.wd.clone();  // [7, 5]: its first 15 floats as a [3, 5] y
  FfnWeights w = p.weights();
  w.wd = wd;
  TensorView y_over_wd = wd.view();
  y_over_wd.shape = {M, H};
  const Tensor wd_before = wd.clone();
  expect_error([&] { cpu::ffn_forward(p.x, w, y_over_wd, Precision::bf16); }, {"y's memory overlaps w.wd's"});
  EXPECT_TRUE(test::bit_equal(wd, wd_before));
  // y's first row before wd, its later ones inside it (rows every 30 floats; wd at 20..54 of one buffer)
  Tensor both(DType::f32, {70});
  std::copy(p.wd.ptr<float>(), p.wd.ptr<float>() + I * H, both.ptr<float>() + 20);
  const Tensor both_before = both.clone();
  FfnWeights w_in_both = p.weights();
  w_in_both.wd = TensorView(both.ptr<float>() + 20, DType::f32, {I, H});
  TensorView y_rows_in_wd(both.ptr<float>(), DType::f32, {M, H});
  y_rows_in_wd.strides = {30, 1};
  expect_error([&] { cpu::ffn_forward(p.x, w_in_both, y_rows_in_wd, Precision::bf16); }, {"y's memory overlaps w.wd's"});
  EXPECT_TRUE(test::bit_equal(both, both_before));
  Tensor xy(DType::f32, {M, 2 * H});  // x and y as the two column halves of one buffer: apart, accepted
  TensorView x_half(xy.ptr<float>(), DType::f32, {M, H}), y_half(xy.ptr<float>() + H, DType::f32, {M, H});
  x_half.strides = y_half.strides = {2 * H, 1};
  for (int64_t i = 0; i < M * H; ++i) xy.ptr<float>()[(i / H) * 2 * H + i % H] = p.x.ptr<float>()[i];
  cpu::ffn_forward(x_half, p.weights(), y_half, Precision::bf16);
  Tensor want(DType::f32, {M, H});
  cpu::ffn_forward(p.x, p.weights(), want, Precision::bf16);
  for (int64_t i = 0; i < M * H; ++i) EXPECT_EQ(y_half.ptr<float>()[(i / H) * 2 * H + i % H], want.ptr<float>()[i]);
  Tensor h(DType::f32, {M, I});
  TensorView y_in_h = h.view();
  y_in_h.shape = {M, H};
  expect_error([&] { cpu::ffn_forward(p.x, p.weights(), y_in_h, Precision::bf16, nullptr, h); },
               {"y's memory overlaps h_out's"});
}

TEST_F(CpuFfnErrors, NegativeSizesAndShortStridesAreRefused) {
  TensorView x_neg = p.x.view();
  x_neg.shape = {-1, H};
  TensorView y_neg = y.view();
  y_neg.shape = {-1, H};
  expect_error([&] { check_ffn_args(x_neg, p.weights(), y_neg); }, {"x", "M >= 0", "[-1, 5]"});
  expect_error([&] { cpu::ffn_forward(x_neg, p.weights(), y_neg, Precision::bf16); }, {"M >= 0"});
  TensorView strided = p.x.view();
  strided.strides = {H};  // one stride for two dimensions
  expect_error([&] { (void)strided.is_contiguous(); }, {"[3, 5]", "1 strides", "2"});
  expect_error([&] { (void)strided.stride(1); }, {"strides"});
}

TEST_F(CpuFfnErrors, SparseForwardChecksTheActivationAndPrecision) {
  const TwellMatrix act = cpu::ffn_pack_activation(p.x, p.weights(), TwellLayout{});
  expect_error([&] { cpu::ffn_forward_twell(p.x, act, p.weights(), y, Precision::f64); }, {"f64"});

  const Problem other = random_problem(M + 2, H, I, true, DType::f32, 2);
  const TwellMatrix act_other = cpu::ffn_pack_activation(other.x, other.weights(), TwellLayout{});
  expect_error([&] { cpu::ffn_forward_twell(p.x, act_other, p.weights(), y, Precision::bf16); },
               {"act", "[3, 7]", "[5, 7]"});

  TwellMatrix broken = act;
  broken.counts[0] = 100;  // more than the tile holds
  expect_error([&] { cpu::ffn_forward_twell(p.x, broken, p.weights(), y, Precision::bf16); },
               {"TwELL"});

  TwellLayout bad_layout;
  bad_layout.tile = 30;
  bad_layout.compression = 8;
  expect_error([&] { cpu::ffn_pack_activation(p.x, p.weights(), bad_layout); }, {"compression"});
}

TEST_F(CpuFfnErrors, SparseForwardRefusesAnOutputOverAWeight) {
  const TwellMatrix act = cpu::ffn_pack_activation(p.x, p.weights(), TwellLayout{});
  Tensor wd = p.wd.clone();
  FfnWeights w = p.weights();
  w.wd = wd;
  TensorView y_in_wd = wd.view();  // its first 15 floats as a [3, 5] y
  y_in_wd.shape = {M, H};
  const Tensor wd_before = wd.clone();
  expect_error([&] { cpu::ffn_forward_twell(p.x, act, w, y_in_wd, Precision::h_fp32); },
               {"ffn_forward_twell", "y's memory overlaps w.wd's"});
  EXPECT_TRUE(test::bit_equal(wd, wd_before));
}

TEST_F(CpuFfnErrors, AGateWithAShapeButNoDataIsMissingNotNonGated) {
  FfnWeights w = p.weights();
  w.wg = TensorView(nullptr, DType::f32, {I, H});  // a weight a loader did not find
  expect_error([&] { cpu::ffn_forward(p.x, w, y, Precision::f64); },
               {"ffn_forward: w.wg", "shape [7, 5] but no data"});
  expect_error([&] { check_ffn_args(p.x, w, y); }, {"w.wg", "no data"});
  Tensor h(DType::f32, {M, I});
  expect_error([&] { cpu::ffn_forward(p.x, p.weights(), y, Precision::f64, nullptr, TensorView(nullptr, DType::f32, {M, I})); },
               {"ffn_forward: h_out: shape [3, 7] but no data"});
  Tensor dy(DType::f32, {M, H});
  FfnGrads g;
  g.dwu = TensorView(nullptr, DType::f32, {I, H});
  expect_error([&] { cpu::ffn_backward(p.x, p.weights(), dy, 0, g, Precision::f64); },
               {"ffn_backward: grads.dwu: shape [7, 5] but no data"});
}

TEST_F(CpuFfnErrors, OutputsWhoseElementsShareMemoryAreRefused) {
  Tensor row(DType::f32, {1, H});
  TensorView y_one_row(row.ptr<float>(), DType::f32, {M, H});
  y_one_row.strides = {0, 1};  // every token's y in the same row: only the last would be left
  expect_error([&] { cpu::ffn_forward(p.x, p.weights(), y_one_row, Precision::f64); },
               {"ffn_forward: y: strides [0, 1] of shape [3, 5]", "same memory"});
  const TwellMatrix act = cpu::ffn_pack_activation(p.x, p.weights(), TwellLayout{});
  expect_error([&] { cpu::ffn_forward_twell(p.x, act, p.weights(), y_one_row, Precision::bf16); }, {"same memory"});
  Tensor dy(DType::f32, {M, H}), wrow(DType::f32, {1, H});
  FfnGrads g;
  g.dwd = TensorView(wrow.ptr<float>(), DType::f32, {I, H});
  g.dwd.strides = {0, 1};
  expect_error([&] { cpu::ffn_backward(p.x, p.weights(), dy, 0, g, Precision::f64); }, {"grads.dwd", "same memory"});
  // an input may share memory with itself: a broadcast dy (the gradient of sum(y), ones expanded)
  Tensor one(DType::f32, {1});
  one.ptr<float>()[0] = 1;
  TensorView ones(one.ptr<float>(), DType::f32, {M, H});
  ones.strides = {0, 0};
  Tensor full(DType::f32, {M, H}), dx_broadcast(DType::f32, {M, H}), dx_full(DType::f32, {M, H});
  for (int64_t i = 0; i < M * H; ++i) full.ptr<float>()[i] = 1;
  cpu::ffn_backward(p.x, p.weights(), ones, 0, FfnGrads{dx_broadcast, {}, {}, {}}, Precision::f64);
  cpu::ffn_backward(p.x, p.weights(), full, 0, FfnGrads{dx_full, {}, {}, {}}, Precision::f64);
  EXPECT_TRUE(test::bit_equal(dx_broadcast, dx_full));
}

TEST_F(CpuFfnErrors, NoTokensNeedNoData) {  // PyTorch's data_ptr() of an empty tensor is null
  const TensorView x0(nullptr, DType::f32, {0, H}), y0(nullptr, DType::f32, {0, H});
  ActivationStats s;
  s.tokens = 99;
  cpu::ffn_forward(x0, p.weights(), y0, Precision::bf16, &s);
  EXPECT_EQ(s.tokens, 0);
  const TwellMatrix act = cpu::ffn_pack_activation(x0, p.weights(), TwellLayout{});
  EXPECT_EQ(act.layout.rows, 0);
  cpu::ffn_forward_twell(x0, act, p.weights(), y0, Precision::bf16);
  EXPECT_EQ(cpu::activation_stats(TensorView(nullptr, DType::f32, {0, I})).tokens, 0);
  expect_error([&] { cpu::activation_stats(TensorView(nullptr, DType::f32, {2, I})); },
               {"activation_stats: h: missing (null data)"});
  expect_error([&] { cpu::ffn_forward(TensorView(nullptr, DType::f32, {M, H}), p.weights(), y, Precision::bf16); },
               {"x: missing (null data)"});
}

TEST_F(CpuFfnErrors, PrecisionOutOfRangeIsRefused) {
  const auto bad = static_cast<Precision>(7);
  expect_error([&] { cpu::ffn_forward(p.x, p.weights(), y, bad); }, {"ffn_forward: precision", "the value 7"});
  Tensor dy(DType::f32, {M, H}), dx(DType::f32, {M, H});
  expect_error([&] { cpu::ffn_backward(p.x, p.weights(), dy, 0, FfnGrads{dx, {}, {}, {}}, bad); }, {"the value 7"});
}

TEST(TwellLayoutCheck, TileIdsPastTwoToThe32AreRefusedWithoutOverflow) {
  TwellLayout l;
  l.rows = int64_t{1} << 34;
  l.cols = int64_t{1} << 30;  // 2^22 tiles of 256: rows · tiles is 2^56 (a product of 2^64 wrapped to 0 before)
  l.tile = 1;
  l.compression = 1;
  EXPECT_THROW(l.check(), Error);
  l.tile = 256;
  EXPECT_THROW(l.check(), Error);
  l.rows = (int64_t{1} << 32) / 4, l.cols = 4 * 256;  // 2^32 tile ids exactly: one too many
  EXPECT_THROW(l.check(), Error);
  l.rows -= 1;
  EXPECT_NO_THROW(l.check());
  l.rows = 0, l.cols = std::numeric_limits<int64_t>::max() - 256;  // no tiles' ids at all; n_tiles() defined
  EXPECT_NO_THROW(l.check());
  l.rows = 1;
  EXPECT_THROW(l.check(), Error);
}

}  // namespace
}  // namespace twell::cpu_test
