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

// A spilled tile whose backup index lies past the backup (a matrix never packed, or corrupted) unpacks as
// zeros: not the output's old values, and no read out of bounds. The other tiles are as packed.
TEST(TwellDevice, ASpilledTileWithNoBackupUnpacksAsZeros) {
  TWELL_REQUIRE_HOPPER();
  const int64_t rows = 3, cols = 512 + 40;
  Tensor dense = test::random_sparse_bf16(rows, cols, 1.0, false, 12);
  TwellMatrix m = twell_pack(dense, {rows, cols, 256, 8}, Spill::allow);
  ASSERT_TRUE(twell_is_spilled(m.layout, m.counts[m.layout.tile_id(1, 1)]));
  cuda::TwellDeviceMatrix d = cuda::TwellDeviceMatrix::upload(m);
  const uint32_t past = static_cast<uint32_t>(d.view().backup_capacity);
  ASSERT_EQ(cudaMemcpy(d.view().slots + m.layout.slot_offset(1, 1), &past, sizeof past, cudaMemcpyHostToDevice),
            cudaSuccess);
  cuda::DeviceTensor out(DType::bf16, {rows, cols});
  cuda::fill_bytes(out.view().data, out.nbytes(), 0xff, nullptr);  // poison: NaN everywhere
  cuda::twell_unpack(d.view(), out, nullptr);
  for (int64_t c = 256; c < 512; ++c) dense.ptr<bf16>()[1 * cols + c] = bf16{};  // row 1's second tile
  EXPECT_TRUE(test::bit_equal(out.download(), dense));
}

TEST(TwellDevice, RejectsHostOutput) {
  TWELL_REQUIRE_HOPPER();
  Tensor dense = Tensor::of<bf16>({2, 256});
  TwellMatrix m = twell_pack(dense, {2, 256, 256, 8});
  cuda::TwellDeviceMatrix d = cuda::TwellDeviceMatrix::upload(m);
  EXPECT_THROW(cuda::twell_unpack(d.view(), dense, nullptr), Error);
}

}  // namespace
}  // namespace twell
