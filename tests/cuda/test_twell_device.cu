// TwELL on the device: upload -> unpack on the GPU is bit-exact against the host format, and a
// download round-trips every array, at every density (spilled tiles included).
#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/random.h"
#include "gpu_test.h"
#include "twell/cuda/twell_device.h"

namespace twell {
namespace {

class TwellDevice : public testing::TestWithParam<double> {};

TEST_P(TwellDevice, UnpackMatchesHostBitExactly) {
  TWELL_REQUIRE_HOPPER();
  for (bool skewed : {false, true}) {
    const int64_t rows = 67, cols = 5632 + 77;
    Tensor dense = test::random_sparse_bf16(rows, cols, GetParam(), skewed, 11);
    TwellMatrix m = twell_pack(dense, {rows, cols, 256, 8}, Spill::allow);
    cuda::TwellDeviceMatrix d = cuda::TwellDeviceMatrix::upload(m);
    cuda::DeviceTensor out(DType::bf16, {rows, cols});
    cuda::fill_bytes(out.view().data, out.nbytes(), 0xff, nullptr);  // poison: NaN everywhere
    cuda::twell_unpack(d.view(), out, nullptr);
    EXPECT_TRUE(test::bit_equal(out.download(), dense)) << (skewed ? "skewed" : "uniform");

    TwellMatrix back = d.download();
    twell_validate(back);
    EXPECT_EQ(back.counts, m.counts);
    EXPECT_EQ(back.slots, m.slots);
    EXPECT_EQ(back.backup, m.backup);
    EXPECT_EQ(back.backup_owner, m.backup_owner);
  }
}

INSTANTIATE_TEST_SUITE_P(Densities, TwellDevice, testing::Values(0.0, 0.005, 0.02, 0.12, 0.13, 0.5, 1.0));

TEST(TwellDevice, RejectsHostOutput) {
  TWELL_REQUIRE_HOPPER();
  Tensor dense = Tensor::of<bf16>({2, 256});
  TwellMatrix m = twell_pack(dense, {2, 256, 256, 8});
  cuda::TwellDeviceMatrix d = cuda::TwellDeviceMatrix::upload(m);
  EXPECT_THROW(cuda::twell_unpack(d.view(), dense, nullptr), Error);
}

}  // namespace
}  // namespace twell
