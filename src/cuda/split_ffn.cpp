// SplitFfn: the hot neurons as a dense FFN, the rest sparse (include/twell/cuda/split_ffn.h).
#include "twell/cuda/split_ffn.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <utility>

#include "cuda/cublaslt_gemm.h"
#include "cuda/kernels.h"
#include "twell/cuda/runtime.h"
#include "twell/formats/twell_format.h"

namespace twell::cuda {

std::vector<int64_t> count_active_neurons(const TensorView& x, const FfnWeights& w, cudaStream_t stream) {
  TWELL_REQUIRE(x.rank() == 2, "count_active_neurons: x must be [M, H], got shape ", shape_str(x.shape));
  const int64_t M = x.size(0), H = w.hidden(), I = w.ffn();
  std::vector<int64_t> counts(static_cast<size_t>(I), 0);
  if (M == 0) return counts;
  FfnOptions o;
  o.dispatch = Dispatch::always_sparse;
  o.gather_max_tokens = 0;  // the TwELL path, whose activation download_activation() reads
  o.one_token_kernel = false;
  FfnForward ffn(FfnShape{M, H, I, w.gated()}, o);
  DeviceTensor y(DType::bf16, {M, H});
  ffn.forward(x, w, y, stream);
  const TwellMatrix act = ffn.download_activation(stream);
  for (int64_t m = 0; m < M; ++m) act.for_each_in_row(m, [&](int64_t col, uint16_t) { ++counts[size_t(col)]; });
  return counts;
}

std::vector<int32_t> choose_hot_neurons(const std::vector<int64_t>& counts, int64_t tokens, double dense_above_rate) {
  TWELL_REQUIRE(tokens >= 1, "choose_hot_neurons: tokens must be positive, got ", tokens);
  TWELL_REQUIRE(std::isfinite(dense_above_rate) && dense_above_rate > 0 && dense_above_rate <= 1,
                "choose_hot_neurons: dense_above_rate must be in (0, 1], got ", dense_above_rate);
  const auto I = static_cast<int64_t>(counts.size());
  for (int64_t j = 0; j < I; ++j)
    TWELL_REQUIRE(counts[size_t(j)] >= 0 && counts[size_t(j)] <= tokens, "choose_hot_neurons: counts[", j, "] = ",
                  counts[size_t(j)], " is not a count over ", tokens, " tokens");
  std::vector<int32_t> order(static_cast<size_t>(I));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return counts[size_t(a)] > counts[size_t(b)]; });
  int64_t above = 0;
  while (above < I && double(counts[size_t(order[size_t(above)])]) >= dense_above_rate * double(tokens)) ++above;
  // Whole 704-neuron steps (lcm(64, 176)), so that the sparse part's last 176-wide tile (the
  // default tile) is as full as I's. The nearest step, half-way up.
  constexpr int64_t step = 704;
  int64_t k = (above + step / 2) / step * step;
  while (k > 0 && k > I - 64) k -= step;
  order.resize(static_cast<size_t>(std::max<int64_t>(k, 0)));
  return order;
}

struct SplitFfn::Impl {
  FfnShape shape;
  std::vector<int32_t> hot;
  DeviceBuffer weights;  // [3, I, H] bf16: per matrix the cold rows, then the hot ones
  FfnWeights cold_w, hot_w;
  std::unique_ptr<FfnForward> cold;
  std::unique_ptr<LtGemm> gemm;  // the hot part's GEMMs
  DeviceBuffer g, u;             // [max_tokens, |hot|] bf16
};

SplitFfn::SplitFfn(const FfnShape& shape, const FfnWeights& w, const std::vector<int32_t>& hot,
                   const FfnOptions& options, cudaStream_t stream)
    : impl_(std::make_unique<Impl>()) {
  const int64_t H = shape.hidden, I = shape.ffn, K = static_cast<int64_t>(hot.size());
  TWELL_REQUIRE(!options.training, "SplitFfn: not for training (it has no backward); use FfnForward");
  TWELL_REQUIRE(options.precision == Precision::bf16, "SplitFfn: only Precision::bf16 (the dense part rounds h)");
  TWELL_REQUIRE(w.gated() == shape.gated, "SplitFfn: the shape says ", shape.gated ? "gated" : "non-gated",
                " but the weights are ", w.gated() ? "gated" : "non-gated");
  const std::pair<const TensorView*, const char*> given[3] = {{&w.wg, "wg"}, {&w.wu, "wu"}, {&w.wd, "wd"}};
  for (const auto& [t, name] : given) {
    if (t == &w.wg && !shape.gated) continue;  // a non-gated FFN has no wg (refused above if given)
    check_device(*t, Device::cuda, name);
    check_on_current_gpu(*t, name);
    check_dtype(*t, DType::bf16, name);
    check_shape(*t, {I, H}, name);
    check_contiguous(*t, name);
    check_aligned(*t, 16, name);  // as FfnForward takes them; the row gather reads 16 bytes at a time
  }
  TWELL_REQUIRE(K % 64 == 0 && K < I, "SplitFfn: the hot neurons must be a multiple of 64 and fewer than I = ", I,
                ", got ", K);
  std::vector<char> is_hot(static_cast<size_t>(I), 0);
  for (const int32_t j : hot) {
    TWELL_REQUIRE(j >= 0 && j < I, "SplitFfn: hot neuron ", j, " is outside [0, ", I, ")");
    TWELL_REQUIRE(!is_hot[size_t(j)], "SplitFfn: hot neuron ", j, " is listed twice");
    is_hot[size_t(j)] = 1;
  }
  Impl& d = *impl_;
  d.shape = shape;
  d.hot = hot;
  FfnShape cold_shape = shape;
  cold_shape.ffn = I - K;
  d.cold = std::make_unique<FfnForward>(cold_shape, options);  // checks the shape and the options

  std::vector<int32_t> order;
  order.reserve(static_cast<size_t>(I));
  for (int32_t j = 0; j < I; ++j)
    if (!is_hot[size_t(j)]) order.push_back(j);
  std::vector<int32_t> hot_rows = hot;  // the dense part in ascending order: a set's bits, whatever its list's order
  std::sort(hot_rows.begin(), hot_rows.end());
  order.insert(order.end(), hot_rows.begin(), hot_rows.end());
  DeviceBuffer order_dev(order.size() * sizeof(int32_t));
  TWELL_CUDA_CHECK(
      cudaMemcpyAsync(order_dev.get(), order.data(), order_dev.bytes(), cudaMemcpyHostToDevice, stream));
  const size_t matrix = static_cast<size_t>(I * H) * 2, cold_bytes = static_cast<size_t>((I - K) * H) * 2;
  d.weights = DeviceBuffer((shape.gated ? 3 : 2) * matrix);
  char* at = static_cast<char*>(d.weights.get());
  const std::tuple<const TensorView*, TensorView*, TensorView*> parts[3] = {
      {&w.wg, &d.cold_w.wg, &d.hot_w.wg}, {&w.wu, &d.cold_w.wu, &d.hot_w.wu}, {&w.wd, &d.cold_w.wd, &d.hot_w.wd}};
  for (const auto& [src, cold_view, hot_view] : parts) {
    if (src->empty()) continue;  // non-gated: no wg
    launch_gather_rows(static_cast<const uint16_t*>(src->data), order_dev.as<int32_t>(), I, H,
                       reinterpret_cast<uint16_t*>(at), stream);
    *cold_view = TensorView(at, DType::bf16, {I - K, H}, Device::cuda);
    *hot_view = TensorView(at + cold_bytes, DType::bf16, {K, H}, Device::cuda);
    at += matrix;
  }
  if (K > 0) {
    // cuBLASLt's workspace: the caller's, or the cold part's own (options() names it), not a second.
    const FfnOptions& cold_options = d.cold->options();
    d.gemm = std::make_unique<LtGemm>(LtGemm::autotune_default(), cold_options.cublaslt_workspace,
                                      cold_options.cublaslt_workspace_bytes);
    d.g = DeviceBuffer(static_cast<size_t>(shape.max_tokens * K) * 2);
    d.u = DeviceBuffer(static_cast<size_t>(shape.max_tokens * K) * 2);
  }
  // The copies done (and order_dev's upload): the caller may free or change w, on any stream, when
  // this returns.
  TWELL_CUDA_CHECK(cudaStreamSynchronize(stream));
}

SplitFfn::~SplitFfn() = default;
SplitFfn::SplitFfn(SplitFfn&&) noexcept = default;
SplitFfn& SplitFfn::operator=(SplitFfn&&) noexcept = default;

void SplitFfn::forward(const TensorView& x, const TensorView& y, cudaStream_t stream) {
  Impl& d = *impl_;
  d.cold->forward(x, d.cold_w, y, stream);  // checks x and y; y = bf16(the cold neurons' sum)
  const int64_t M = x.size(0), H = d.shape.hidden, K = static_cast<int64_t>(d.hot.size());
  if (K == 0 || M == 0) return;
  auto* g = static_cast<uint16_t*>(d.g.get());
  auto* u = static_cast<uint16_t*>(d.u.get());
  if (d.shape.gated) {
    d.gemm->run(x.data, d.hot_w.wg.data, g, M, K, H, true, GemmEpilogue::relu, stream);
    d.gemm->run(x.data, d.hot_w.wu.data, u, M, K, H, true, GemmEpilogue::none, stream);
    launch_mul_bf16(g, u, u, M * K, stream);  // h = bf16(g · u), in u
  } else {
    d.gemm->run(x.data, d.hot_w.wu.data, u, M, K, H, true, GemmEpilogue::relu, stream);  // h = relu(x Wuᵀ)
  }
  d.gemm->run(u, d.hot_w.wd.data, y.data, M, H, K, false, GemmEpilogue::none, stream, GemmOut::bf16, 1.f);
}

const std::vector<int32_t>& SplitFfn::hot_neurons() const { return impl_->hot; }
FfnForward& SplitFfn::cold() { return *impl_->cold; }
size_t SplitFfn::device_bytes() const {
  return impl_->weights.bytes() + impl_->g.bytes() + impl_->u.bytes() + impl_->cold->workspace_bytes();
}

}  // namespace twell::cuda
