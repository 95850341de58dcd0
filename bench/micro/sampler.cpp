// Micro-benchmark: drawing a token from one row of logits, on the host (model::Sampler, which
// needs the row copied back first) and on the GPU (cuda::DeviceSampler, only the token copied back).
// For each kind of row and sampling mode it first checks that both draw the same tokens from the
// same seed over 64 draws, then times 300 calls of each (median, wall clock, the host copy of the
// row included for the host sampler as a decode step pays it). Rows: V = 49152 (the paper's
// vocabulary), normal logits (sd 2), the same with two outliers (+30 and -1e4: the bucketing's worst
// case, one bucket for nearly everything), and logits of 8 distinct values, 0 to 7 (ties at every
// cut; the rows of this name in the s38 results held 15, -7 to 7). The min-p and repetition-penalty
// modes (fifty-fifth session) draw with 2048 seen ids for the penalty, as a sequence of that length
// holds: the GPU sampler copies the row, penalizes the copy from the ids in pinned memory, then draws.
// Built as twell_micro_sampler with TWELL_CUDA; run: twell_micro_sampler [V].
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "twell/cuda/sampler.h"

using namespace twell;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

model::SamplingOptions mode(double t, int64_t k, double p, double min_p = 0, double penalty = 1) {
  model::SamplingOptions o;
  o.temperature = t, o.top_k = k, o.top_p = p, o.seed = 1, o.min_p = min_p, o.repetition_penalty = penalty;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t V = argc > 1 ? std::atoll(argv[1]) : 49152;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 2.f);
  struct Row {
    const char* name;
    std::vector<float> x;
  };
  std::vector<Row> rows = {{"normal", {}}, {"outliers", {}}, {"8 values", {}}};
  for (int64_t i = 0; i < V; ++i) {
    const float z = normal(rng);
    rows[0].x.push_back(z);
    rows[1].x.push_back(i == 7 ? 30.f : i == 11 ? -1e4f : z);
    rows[2].x.push_back(static_cast<float>((static_cast<int>(z * 2) % 8 + 8) % 8));  // 0..7
  }
  const struct {
    const char* name;
    model::SamplingOptions o;
  } modes[] = {{"greedy", mode(0, 0, 1)},
               {"T 0.8", mode(0.8, 0, 1)},
               {"T 0.8, top-p 0.95", mode(0.8, 0, 0.95)},
               {"top-k 50", mode(1, 50, 1)},
               {"top-k 50, top-p 0.9", mode(1, 50, 0.9)},
               {"T 0.8, min-p 0.05", mode(0.8, 0, 1, 0.05)},
               {"greedy, penalty 1.2", mode(0, 0, 1, 0, 1.2)},
               {"T 0.8, penalty 1.2", mode(0.8, 0, 1, 0, 1.2)}};
  std::vector<int32_t> seen(static_cast<size_t>(std::min<int64_t>(V, 2048)));  // a sequence's ids, for the penalty
  for (size_t i = 0; i < seen.size(); ++i) seen[i] = static_cast<int32_t>((i * 7919) % static_cast<size_t>(V));
  cuda::DeviceBuffer logits(V * 4);
  float* d = logits.as<float>();
  cudaStream_t stream;
  TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::PinnedBuffer pinned(V * 4);
  cuda::DeviceSampler gpu;
  const TensorView dv(d, DType::f32, {V}, Device::cuda);
  using clock = std::chrono::steady_clock;
  std::printf("V = %lld; microseconds a token (median of 300), host sampler (row copied back first) and GPU\n",
              static_cast<long long>(V));
  std::printf("%-10s %-22s %10s %10s\n", "logits", "mode", "host", "GPU");
  int bad = 0;
  for (Row& r : rows) {
    TWELL_CUDA_CHECK(cudaMemcpy(d, r.x.data(), V * 4, cudaMemcpyHostToDevice));
    for (const auto& m : modes) {
      model::Sampler hs(m.o), gs(m.o);
      hs.seen(seen), gs.seen(seen);  // kept only where the penalty is on
      const TensorView hv(r.x.data(), DType::f32, {V});
      for (int i = 0; i < 64; ++i) {
        const int32_t a = hs.sample(hv), b = gpu.sample(dv, gs, stream)[0];
        if (a != b) {
          std::printf("MISMATCH %s %s draw %d: host %d, GPU %d\n", r.name, m.name, i, a, b);
          ++bad;
          break;
        }
      }
      std::vector<double> th, tg;
      for (int i = 0; i < 300; ++i) {
        const auto t0 = clock::now();
        TWELL_CUDA_CHECK(cudaMemcpyAsync(pinned.get(), d, V * 4, cudaMemcpyDeviceToHost, stream));
        TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
        hs.sample(TensorView(pinned.get(), DType::f32, {V}));
        const auto t1 = clock::now();
        gpu.sample(dv, gs, stream);
        const auto t2 = clock::now();
        th.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        tg.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      }
      std::printf("%-10s %-22s %10.1f %10.1f\n", r.name, m.name, median(th), median(tg));
    }
  }
  cudaStreamDestroy(stream);
  if (bad) std::printf("%d mismatches\n", bad);
  return bad ? 1 : 0;
}
