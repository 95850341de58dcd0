// LtGemm's autotune (the second call of a problem times cuBLASLt's candidates and keeps the fastest)
// against the heuristics' first algorithm: the same bits at every shape and kind of call, for the
// first call, the second (tuning) one, on the operands it tuned on and on others, and
// beta = 1 adds the product once: the timed candidates write to a scratch copy, not to C. Then the
// device comparison the autotune relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda/cublaslt_gemm.h"
#include "cuda/kernels.h"
#include "gpu_test.h"
#include "twell/error.h"

namespace twell::cuda {
namespace {

struct Call {
  int64_t m, n, k;
  bool b_transposed, relu, f32, at;  // at: run_at (Aᵀ·B)
  float beta;
};

std::vector<uint8_t> run_twice(LtGemm& gemm, const Call& c, const DeviceBuffer& a, const DeviceBuffer& b,
                               const std::vector<uint8_t>& c_init, std::vector<uint8_t>* first_call) {
  DeviceBuffer out(c_init.size());
  std::vector<uint8_t> result(c_init.size());
  for (int call = 0; call < 2; ++call) {
    TWELL_CUDA_CHECK(cudaMemcpy(out.get(), c_init.data(), c_init.size(), cudaMemcpyHostToDevice));
    if (c.at)
      gemm.run_at(a.get(), b.get(), out.get(), c.m, c.n, c.k, nullptr, c.f32 ? GemmOut::f32 : GemmOut::bf16);
    else
      gemm.run(a.get(), b.get(), out.get(), c.m, c.n, c.k, c.b_transposed, c.relu ? GemmEpilogue::relu : GemmEpilogue::none,
               nullptr, c.f32 ? GemmOut::f32 : GemmOut::bf16, c.beta);
    TWELL_CUDA_CHECK(cudaMemcpy(result.data(), out.get(), result.size(), cudaMemcpyDeviceToHost));
    if (call == 0) *first_call = result;
  }
  return result;
}

TEST(LtGemm, AutotuneGivesTheHeuristicsBits) {
  TWELL_REQUIRE_HOPPER();
  const Call calls[] = {
      {1, 2048, 2048, true, false, false, false, 0.f},     // a decode projection (too small to tune)
      {64, 5632, 2048, true, true, false, false, 0.f},     // the dense FFN's gate at batch 64 (too small)
      {4096, 5632, 2048, true, true, false, false, 0.f},   // ... in a prefill
      {4096, 2048, 5632, false, false, false, false, 0.f}, // its down product
      {333, 2000, 1800, true, false, false, false, 0.f},   // awkward sizes (above the tuning floor)
      {4096, 2048, 2048, true, false, true, false, 1.f},   // f32 output, accumulated (beta = 1)
      {2048, 512, 4096, false, false, true, true, 0.f},    // a weight gradient (run_at)
  };
  LtGemm::forget_tuning();  // earlier tests may have tuned some of these problems
  LtGemm tuned(true), heuristic(false);
  for (const Call& c : calls)
  for (const unsigned set : {0u, 1u}) {  // set 0 tunes; set 1: other operands, the choice kept
    SCOPED_TRACE(testing::Message() << "M=" << c.m << " N=" << c.n << " K=" << c.k << (c.at ? " run_at" : "")
                                    << " beta=" << c.beta << " operand set " << set);
    const int64_t a_elems = c.m * c.k, b_elems = c.n * c.k;
    const auto a_host = random_bf16(static_cast<size_t>(a_elems), 1.f, static_cast<unsigned>(c.m + c.k) + 1000 * set);
    const auto b_host =
        random_bf16(static_cast<size_t>(b_elems), 0.05f, static_cast<unsigned>(c.n + 3 * c.k) + 1000 * set);
    DeviceBuffer a(static_cast<size_t>(a_elems) * 2), b(static_cast<size_t>(b_elems) * 2);
    TWELL_CUDA_CHECK(cudaMemcpy(a.get(), a_host.data(), a.bytes(), cudaMemcpyHostToDevice));
    TWELL_CUDA_CHECK(cudaMemcpy(b.get(), b_host.data(), b.bytes(), cudaMemcpyHostToDevice));
    // C's initial contents: values to accumulate onto with beta = 1, else NaN (all ones bits).
    const size_t c_bytes = static_cast<size_t>(c.m * c.n) * (c.f32 ? 4 : 2);
    std::vector<uint8_t> c_init(c_bytes, 0xff);
    if (c.beta != 0.f) {
      const auto init = random_bf16(static_cast<size_t>(c.m * c.n), 1.f, 99 + set);
      for (size_t i = 0; i < init.size(); ++i) {
        const uint32_t bits = static_cast<uint32_t>(init[i]) << 16;  // the bf16 values as f32
        std::memcpy(&c_init[i * 4], &bits, 4);
      }
    }
    std::vector<uint8_t> tuned_first, heuristic_first;
    const auto t = run_twice(tuned, c, a, b, c_init, &tuned_first);
    const auto h = run_twice(heuristic, c, a, b, c_init, &heuristic_first);
    EXPECT_TRUE(h == heuristic_first) << "the heuristics' algorithm is not deterministic";
    EXPECT_TRUE(tuned_first == h) << "the first call differs from the heuristics' algorithm";
    EXPECT_TRUE(t == h) << "the tuned algorithm differs from the heuristics' algorithm";
  }
}

// A caller's workspace: the LtGemm uses it (no allocation of its own), and a problem tuned with
// the default 64 MiB is tuned again for a 4 KiB one, whose candidates differ (an algorithm chosen
// for 64 MiB may need more than 4 KiB): it runs, with the bits of the heuristics' first choice at
// that size. Two LtGemms share the one workspace, their calls ordered on one stream.
TEST(LtGemm, TheCallersWorkspaceIsUsedAndTunedForItsSize) {
  TWELL_REQUIRE_HOPPER();
  const Call c{4096, 5632, 2048, true, true, false, false, 0.f};
  const auto a_host = random_bf16(static_cast<size_t>(c.m * c.k), 1.f, 7);
  const auto b_host = random_bf16(static_cast<size_t>(c.n * c.k), 0.05f, 8);
  DeviceBuffer a(a_host.size() * 2), b(b_host.size() * 2);
  TWELL_CUDA_CHECK(cudaMemcpy(a.get(), a_host.data(), a.bytes(), cudaMemcpyHostToDevice));
  TWELL_CUDA_CHECK(cudaMemcpy(b.get(), b_host.data(), b.bytes(), cudaMemcpyHostToDevice));
  const std::vector<uint8_t> c_init(static_cast<size_t>(c.m * c.n) * 2, 0xff);
  LtGemm::forget_tuning();
  std::vector<uint8_t> first;
  {
    LtGemm big(true);
    EXPECT_EQ(big.workspace_bytes(), LtGemm::kWorkspaceBytes);
    run_twice(big, c, a, b, c_init, &first);  // tuned for 64 MiB
  }
  DeviceBuffer ws(4096);
  const size_t free_before = device_memory().free;
  LtGemm tuned(true, ws.get(), ws.bytes()), heuristic(false, ws.get(), ws.bytes());
  const size_t free_after = device_memory().free;
  EXPECT_EQ(tuned.workspace(), ws.get());
  EXPECT_EQ(heuristic.workspace_bytes(), size_t{4096});
  EXPECT_LT(free_before - std::min(free_before, free_after), LtGemm::kWorkspaceBytes) << "allocated a workspace";
  std::vector<uint8_t> tuned_first, heuristic_first;
  const auto t = run_twice(tuned, c, a, b, c_init, &tuned_first);
  const auto h = run_twice(heuristic, c, a, b, c_init, &heuristic_first);
  EXPECT_TRUE(tuned_first == h && t == h) << "the tuned algorithm differs from the heuristics' at 4 KiB";
  EXPECT_THROW(LtGemm(true, ws.as<char>() + 16, 1024), Error);  // not 256-byte aligned
  EXPECT_THROW(LtGemm(true, nullptr, 1024), Error);
  EXPECT_THROW(LtGemm(true, ws.get(), 0), Error);
}

// The device comparison the autotune trusts: every differing 16-bit word counted, in the 16-byte
// body and in a tail of 1 to 7 words, and nothing counted for equal buffers.
TEST(LtGemm, CountDifferencesCountsEveryWord) {
  TWELL_REQUIRE_HOPPER();
  for (const size_t words : {size_t{1}, size_t{7}, size_t{8}, size_t{1000}, size_t{4099}}) {
    SCOPED_TRACE(testing::Message() << words << " words");
    std::vector<uint16_t> a(words), b(words);
    for (size_t i = 0; i < words; ++i) a[i] = b[i] = static_cast<uint16_t>(i * 2654435761u);
    DeviceBuffer da(words * 2), db(words * 2), count(4);
    TWELL_CUDA_CHECK(cudaMemcpy(da.get(), a.data(), words * 2, cudaMemcpyHostToDevice));
    auto differences = [&] {
      TWELL_CUDA_CHECK(cudaMemcpy(db.get(), b.data(), words * 2, cudaMemcpyHostToDevice));
      TWELL_CUDA_CHECK(cudaMemset(count.get(), 0, 4));
      launch_count_differences(da.get(), db.get(), words * 2, count.as<uint32_t>(), nullptr);
      uint32_t n = 0;
      TWELL_CUDA_CHECK(cudaMemcpy(&n, count.get(), 4, cudaMemcpyDeviceToHost));
      return n;
    };
    EXPECT_EQ(differences(), 0u);
    b[0] ^= 1, b[words - 1] ^= 0x8000, b[words / 2] ^= 0x0100;  // first, last (the tail) and middle
    EXPECT_EQ(differences(), words == 1 ? 1u : 3u);  // one word holds all three flips when there is one
  }
}

}  // namespace
}  // namespace twell::cuda
