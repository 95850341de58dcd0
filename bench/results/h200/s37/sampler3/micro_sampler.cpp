// The micro-benchmark of micro_sampler.txt: Sampler::sample on one row of 49152 N(0, 3) logits, 100 draws
// a setting. Built against libtwell_core.a (g++ -O2 -std=c++17 micro_sampler.cpp -Iinclude
// -Ibuild-cuda/generated/include build-cuda/libtwell_core.a -lpthread); "old" linked the llama_sampling.cpp
// of 1ac866b in front of the library.
#include <chrono>
#include <cstdio>
#include <random>
#include "twell/model/llama.h"
using namespace twell;
int main() {
  const int V = 49152;
  Tensor t = Tensor::of<float>({V});
  std::mt19937 g(1); std::normal_distribution<float> n(0, 3);
  for (int i = 0; i < V; ++i) t.ptr<float>()[i] = n(g);
  struct C { double temp, top_p; int64_t top_k; };
  for (C c : {C{0, 1, 0}, C{0.8, 1, 0}, C{0.8, 0.95, 0}, C{0.8, 0.5, 0}, C{0.8, 1, 50}}) {
    model::SamplingOptions o; o.temperature = c.temp; o.top_p = c.top_p; o.top_k = c.top_k; o.seed = 1;
    model::Sampler s(o);
    int sink = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 100; ++k) sink += s.sample(t);
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 100;
    std::printf("T %.1f top_p %.2f top_k %ld: %.1f us a token\n", c.temp, c.top_p, (long)c.top_k, us);
  }
}
