// CUDA backend of `twell bench ffn`: dense cuBLASLt baselines and the twell FFN, timed with CUDA
// events on one stream. Implementations:
//   dense_cublas   our fastest dense FFN: gate GEMM with fused ReLU, up GEMM, g·u kernel, down GEMM
//   dense_unfused  PyTorch-style: three GEMMs, a separate ReLU and a separate product
//   twell          twell::cuda::FfnForward with its default dispatch, previous (sparse or dense by
//                  the density of the previous call; the first, untimed call samples and waits)
//   twell_sparse   the same, forced onto the sparse path (shows what dispatch avoided)
//   twell_split    with --split: twell::cuda::SplitFfn, the neurons that fire in >= 1.2% of a
//                  calibration sample's tokens (fresh ones; with --from the file's first, the timed
//                  ones: in-sample) as a dense FFN, in 704-neuron steps, the rest through FfnForward
// With --train, forward + backward (dx, dWg, dWu, dWd in f32, L1 term on):
//   dense_cublas   the forward above keeping g, u, h; dh = dy Wdᵀ (f32), one element-wise kernel
//                  for dg, du; dx = [dg|du]·[Wg; Wu] as one GEMM; [dWg; dWu] = [dg|du]ᵀ x and
//                  dWd = hᵀ dy (cuBLASLt)
//   twell          FfnForward with FfnOptions::training and dispatch (sparse or dense by density),
//                  then FfnForward::backward on the path the forward took
//   twell_sparse   the same forced onto the sparse path: the backward over the active set
#if defined(TWELL_WITH_CUDA)

#include <chrono>
#include <cstring>

#include "cuda/cublaslt_gemm.h"
#include "cuda/kernels.h"
#include "ffn_bench.h"
#include "gpu_meter.h"
#include "twell/cuda/ffn.h"
#include "twell/cuda/runtime.h"
#include "twell/cuda/split_ffn.h"

namespace twell::bench {
namespace {

using cuda::DeviceTensor;

class CudaBackend : public FfnBackend {
 public:
  CudaBackend() : info_(cuda::device_info()) {
    TWELL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TWELL_CUDA_CHECK(cudaEventCreate(&start_));
    TWELL_CUDA_CHECK(cudaEventCreate(&stop_));
    for (cudaEvent_t& e : batch_done_) TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~CudaBackend() override {
    state_.reset();
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    for (cudaEvent_t e : batch_done_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  std::string device_name() const override { return info_.name; }
  std::vector<int64_t> default_tokens() const override { return {1, 128, 2048, 16384, 131072}; }
  std::vector<double> default_densities() const override { return {0.005, 0.01, 0.02, 0.05, 0.1, 0.5}; }
  int default_warmup() const override { return 3; }
  int default_iters() const override { return 20; }
  size_t rotate_below_bytes() const override { return 2 * info_.l2_bytes; }
  bool stateful() const override { return true; }  // dispatch on the previous call's density

  TwellOccupancy occupancy(const FfnProblem& p, const FfnBenchConfig& cfg, int set) override {
    prepare(p, cfg);
    cuda::FfnOptions o = options(cfg);
    o.dispatch = cuda::Dispatch::always_sparse;
    o.gather_max_tokens = 0;  // the TwELL matrix itself
    cuda::FfnForward ffn(shape(p), o);
    ffn.forward(state_->x.at(static_cast<size_t>(set)), weights(), state_->y_twell, stream_);
    return twell_occupancy(ffn.download_activation(stream_));
  }

  std::vector<FfnRunner> runners(const FfnProblem& p, const FfnBenchConfig& cfg) override {
    prepare(p, cfg);
    State* s = state_.get();
    const FfnWeights w = weights();
    cuda::FfnOptions dense_opts = options(cfg), auto_opts = options(cfg), sparse_opts = options(cfg);
    dense_opts.dispatch = cuda::Dispatch::always_dense;
    sparse_opts.dispatch = cuda::Dispatch::always_sparse;
    s->dense = std::make_unique<cuda::FfnForward>(shape(p), dense_opts);
    s->twell = std::make_unique<cuda::FfnForward>(shape(p), auto_opts);
    s->sparse = std::make_unique<cuda::FfnForward>(shape(p), sparse_opts);
    const int64_t M = p.ffn.spec.M, H = p.ffn.spec.H, I = p.ffn.spec.I;
    s->g_unfused = DeviceTensor(DType::bf16, {M, I});
    s->u_unfused = DeviceTensor(DType::bf16, {M, I});
    const bool gated = p.ffn.spec.gated;
    cudaStream_t st = stream_;

    auto out = [this](const DeviceTensor& y) { return [&y, this] { return y.download(stream_); }; };
    std::vector<FfnRunner> r;
    r.push_back({"dense_cublas", [s, w, st](int set) { s->dense->forward(s->x[set], w, s->y_dense, st); },
                 out(s->y_dense)});
    r.push_back({"dense_unfused",
                 [s, w, st, M, H, I, gated](int set) {
                   auto* g = s->g_unfused.ptr<bf16>();
                   auto* u = s->u_unfused.ptr<bf16>();
                   const void* x = s->x[set].view().data;
                   s->gemm.run(x, gated ? w.wg.data : w.wu.data, g, M, I, H, true, cuda::GemmEpilogue::none, st);
                   cuda::launch_relu_bf16(reinterpret_cast<uint16_t*>(g), M * I, st);
                   if (gated) {
                     s->gemm.run(x, w.wu.data, u, M, I, H, true, cuda::GemmEpilogue::none, st);
                     cuda::launch_mul_bf16(reinterpret_cast<uint16_t*>(g), reinterpret_cast<uint16_t*>(u),
                                           reinterpret_cast<uint16_t*>(u), M * I, st);
                   }
                   s->gemm.run(gated ? u : g, w.wd.data, s->y_unfused.view().data, M, H, I, false,
                               cuda::GemmEpilogue::none, st);
                 },
                 out(s->y_unfused)});
    r.push_back({"twell", [s, w, st](int set) { s->twell->forward(s->x[set], w, s->y_twell, st); }, out(s->y_twell)});
    r.push_back({"twell_sparse", [s, w, st](int set) { s->sparse->forward(s->x[set], w, s->y_sparse, st); },
                 out(s->y_sparse)});
    r[0].poison = poison({&s->y_dense});
    r[1].poison = poison({&s->y_unfused});
    r[2].poison = poison({&s->y_twell});
    r[3].poison = poison({&s->y_sparse});
    if (cfg.split) r.push_back(split_runner(p, cfg, auto_opts));
    return r;
  }

  // twell_split: the hot set from a calibration sample of min(M, 16384) tokens: fresh tokens of the
  // case's distribution (another seed than the timed ones'), or with --from the file's first rows.
  FfnRunner split_runner(const FfnProblem& p, const FfnBenchConfig& cfg, const cuda::FfnOptions& o) {
    State* s = state_.get();
    const FfnWeights w = weights();
    const int64_t M = p.ffn.spec.M, H = p.ffn.spec.H, I = p.ffn.spec.I, n = std::min<int64_t>(M, 16384);
    DeviceTensor fresh;
    TensorView sample(s->x[0].view().data, DType::bf16, {n, H}, Device::cuda);
    if (cfg.from_file.empty()) {
      SyntheticSpec spec = p.ffn.spec;
      spec.M = n;
      fresh = DeviceTensor::upload(make_synthetic_tokens(spec, spec.seed * 7919 + 977), stream_);
      sample = fresh.view();
    }
    const std::vector<int64_t> counts = cuda::count_active_neurons(sample, w, stream_);
    constexpr double kRate = 0.012;  // choose_hot_neurons' default
    const std::vector<int32_t> hot = cuda::choose_hot_neurons(counts, n, kRate);
    int64_t total = 0, in_hot = 0, above = 0;
    for (const int64_t c : counts) total += c, above += double(c) >= kRate * double(n);
    for (const int32_t j : hot) in_hot += counts[size_t(j)];
    s->split = std::make_unique<cuda::SplitFfn>(shape(p), w, hot, o, stream_);
    s->y_split = DeviceTensor(DType::bf16, {M, H});
    const std::string note =
        str(hot.size(), " of ", I, " neurons dense (", above, " fire in >= 1.2% of ", n,
            cfg.from_file.empty() ? " fresh tokens" : " of the file's tokens, the timed ones",
            ", rounded to 704-neuron steps; ", total ? std::lround(100.0 * double(in_hot) / double(total)) : 0L,
            "% of the sample's non-zeros)");
    cudaStream_t st = stream_;
    FfnRunner r{"twell_split", [s, st](int set) { s->split->forward(s->x[set], s->y_split, st); },
                [s, this] { return s->y_split.download(stream_); }};
    r.note = [note] { return note; };
    r.poison = poison({&s->y_split});
    return r;
  }

  bool train_available() const override { return true; }
  bool activations_on_host() const override { return false; }
  std::vector<FfnRunner> train_runners(const FfnProblem& p, const FfnBenchConfig& cfg, const Tensor& dy_host) override {
    prepare(p, cfg);
    State* s = state_.get();
    const FfnWeights w = weights();
    const int64_t M = p.ffn.spec.M, H = p.ffn.spec.H, I = p.ffn.spec.I;
    const float l1 = static_cast<float>(cfg.l1);
    cudaStream_t st = stream_;
    Train& tr = s->train;
    tr.dy = DeviceTensor::upload(dy_host, st);
    tr.g = DeviceTensor(DType::bf16, {M, I});
    tr.u = DeviceTensor(DType::bf16, {M, I});
    tr.h = DeviceTensor(DType::bf16, {M, I});
    tr.dh = DeviceTensor(DType::f32, {M, I});
    tr.dgu = DeviceTensor(DType::bf16, {M, 2 * I});
    tr.wgu = DeviceTensor(DType::bf16, {2 * I, H});  // [Wg; Wu] stacked once: dx in one GEMM
    const size_t w_bytes = static_cast<size_t>(I * H) * 2;
    TWELL_CUDA_CHECK(cudaMemcpyAsync(tr.wgu.view().data, w.wg.data, w_bytes, cudaMemcpyDeviceToDevice, st));
    TWELL_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(tr.wgu.view().data) + w_bytes, w.wu.data, w_bytes,
                                     cudaMemcpyDeviceToDevice, st));
    for (Grads* g : {&tr.dense, &tr.twell, &tr.sparse}) {
      g->dx = DeviceTensor(DType::f32, {M, H});
      g->dwgu = DeviceTensor(DType::f32, {2 * I, H});
      g->dwd = DeviceTensor(DType::f32, {I, H});
      for (DeviceTensor* d : {&g->dx, &g->dwgu, &g->dwd}) cuda::fill_bytes(d->view().data, d->nbytes(), 0xff, st);
    }
    cuda::FfnOptions sparse_opts = options(cfg);
    sparse_opts.dispatch = cuda::Dispatch::always_sparse;
    sparse_opts.gather_max_tokens = 0;
    s->sparse = std::make_unique<cuda::FfnForward>(shape(p), sparse_opts);
    cuda::FfnOptions train_opts = options(cfg);
    train_opts.training = true;
    train_opts.gather_max_tokens = 0;
    s->twell = std::make_unique<cuda::FfnForward>(shape(p), train_opts);

    auto download = [this](const Grads& g, int64_t n_neurons) {
      std::vector<Tensor> out;
      out.push_back(g.dx.download(stream_));
      const Tensor gu = g.dwgu.download(stream_);
      const int64_t cols = gu.shape()[1];
      for (int k = 0; k < 2; ++k) {  // split [dWg; dWu]
        Tensor part(DType::f32, {n_neurons, cols});
        std::memcpy(part.view().data, static_cast<const char*>(gu.view().data) + k * n_neurons * cols * 4,
                    part.nbytes());
        out.push_back(std::move(part));
      }
      out.push_back(g.dwd.download(stream_));
      return out;
    };
    auto out = [this](const DeviceTensor& y) { return [&y, this] { return y.download(stream_); }; };
    std::vector<FfnRunner> r;
    r.push_back({"dense_cublas",
                 [s, w, st, M, H, I, l1](int set) {
                   Train& tt = s->train;
                   const void* x = s->x[set].view().data;
                   auto* g = tt.g.ptr<bf16>();
                   auto* u = tt.u.ptr<bf16>();
                   auto* h = tt.h.ptr<bf16>();
                   s->gemm.run(x, w.wg.data, g, M, I, H, true, cuda::GemmEpilogue::relu, st);
                   s->gemm.run(x, w.wu.data, u, M, I, H, true, cuda::GemmEpilogue::none, st);
                   cuda::launch_mul_bf16(reinterpret_cast<uint16_t*>(g), reinterpret_cast<uint16_t*>(u),
                                         reinterpret_cast<uint16_t*>(h), M * I, st);
                   s->gemm.run(h, w.wd.data, s->y_dense.view().data, M, H, I, false, cuda::GemmEpilogue::none, st);
                   const void* dyp = tt.dy.view().data;
                   s->gemm.run(dyp, w.wd.data, tt.dh.view().data, M, I, H, true, cuda::GemmEpilogue::none, st,
                               cuda::GemmOut::f32);
                   cuda::launch_dense_grad(reinterpret_cast<uint16_t*>(g), reinterpret_cast<uint16_t*>(u),
                                           tt.dh.ptr<float>(), l1, reinterpret_cast<uint16_t*>(tt.dgu.ptr<bf16>()),
                                           reinterpret_cast<uint16_t*>(tt.dgu.ptr<bf16>()) + I, 2 * I, M, I, st);
                   s->gemm.run(tt.dgu.view().data, tt.wgu.view().data, tt.dense.dx.view().data, M, H, 2 * I, false,
                               cuda::GemmEpilogue::none, st, cuda::GemmOut::f32);
                   s->gemm.run_at(tt.dgu.view().data, x, tt.dense.dwgu.view().data, 2 * I, H, M, st);
                   s->gemm.run_at(h, dyp, tt.dense.dwd.view().data, I, H, M, st);
                 },
                 out(s->y_dense), [download, s, I] { return download(s->train.dense, I); },
                 [M, I] {
                   return str("keeps g and u for the backward (h is recomputable): ", 2 * M * I * 2 / 1e6,
                              " MB; this baseline also keeps h: ", 3 * M * I * 2 / 1e6, " MB");
                 }});
    // What a backward over the active set reads of the forward's state: the TwELL counts and packed
    // words, the spilled tiles' backups (bf16), and u beside them. What FfnForward holds in all is
    // larger (workspace_bytes: the dense g and u buffers, a backup sized for every tile to spill,
    // the transpose; dg and du are scratch of the backward's call since session 47), reported beside it.
    auto kept = [M, I](const cuda::FfnForward& f) {
      const cuda::FfnStats stats = f.last_stats();
      const double dense_saved = 3.0 * M * I * 2;  // g, u, h
      if (stats.path == cuda::FfnPath::dense)
        return str("dense path: keeps g, u and h for the backward: ", dense_saved / 1e6, " MB");
      const TwellLayout l{M, I, f.options().tile, f.options().compression};
      const double backup = double(std::max<int64_t>(stats.spilled_tiles, 0)) * l.tile;
      const double bytes = double(l.count_size()) * 4 + double(l.slot_size()) * 4 + backup * 2 +
                           (double(l.slot_size()) + backup) * 2;
      return str("keeps the TwELL activation and u for the backward: ", bytes / 1e6, " MB (",
                 100.0 * bytes / dense_saved, "% of the dense FFN's saved g, u and h; ",
                 100.0 * bytes / (2.0 * M * I * 2), "% of g and u alone); FfnForward holds ",
                 f.workspace_bytes() / 1e6, " MB in all");
    };
    const auto train_step = [s, w, st, l1, H, I](cuda::FfnForward& f, DeviceTensor& y, Grads& gr, int set) {
      f.forward(s->x[set], w, y, st);
      const auto rows = [&](int k) {  // dWg, dWu: the halves of the stacked [2I, H]
        TensorView v = gr.dwgu.view();
        v.data = static_cast<char*>(v.data) + k * I * H * 4;
        v.shape = Shape{I, H};
        return v;
      };
      f.backward(s->x[set], w, s->train.dy, l1, {gr.dx.view(), rows(0), rows(1), gr.dwd.view()}, st);
    };
    r.push_back({"twell", [s, train_step](int set) { train_step(*s->twell, s->y_twell, s->train.twell, set); },
                 out(s->y_twell), [download, s, I] { return download(s->train.twell, I); },
                 [s, kept] { return kept(*s->twell); }});
    r.push_back({"twell_sparse",
                 [s, train_step](int set) { train_step(*s->sparse, s->y_sparse, s->train.sparse, set); },
                 out(s->y_sparse), [download, s, I] { return download(s->train.sparse, I); },
                 [s, kept] { return kept(*s->sparse); }});
    r[0].poison = poison({&s->y_dense, &s->train.dense.dx, &s->train.dense.dwgu, &s->train.dense.dwd});
    r[1].poison = poison({&s->y_twell, &s->train.twell.dx, &s->train.twell.dwgu, &s->train.twell.dwd});
    r[2].poison = poison({&s->y_sparse, &s->train.sparse.dx, &s->train.sparse.dwgu, &s->train.sparse.dwd});
    return r;
  }

  Timing timing_used(Timing requested) const override { return hold_failed_ ? Timing::host : requested; }
  void reset_timing() override { hold_failed_ = false; }

  double time_ms(const std::function<void()>& fn, Timing timing) override {
    const bool hold = timing == Timing::gpu && !hold_failed_;
    // Releases the hold however this call ends (an exception from fn included).
    struct Release {
      uint32_t* word;
      ~Release() {
        if (word) __atomic_store_n(word, 1u, __ATOMIC_RELEASE);
      }
    } release{nullptr};
    // Every call starts from a cold L2 (as nvbench's default): a buffer of twice its size is read
    // through it first, outside the timed stretch, so no call finds x, y or weight rows another
    // call left there.
    if (!flush_.get()) {
      flush_ = cuda::DeviceBuffer(2 * info_.l2_bytes);
      TWELL_CUDA_CHECK(cudaMemsetAsync(flush_.get(), 0, flush_.bytes(), stream_));
      flush_sink_ = cuda::DeviceBuffer(sizeof(uint32_t));
    }
    cuda::launch_read_through(flush_.get(), flush_.bytes(), flush_sink_.as<uint32_t>(), stream_);
    // Timing::host times the call from an idle GPU: its launches are not hidden behind the flush.
    if (!hold) TWELL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (hold) {  // the stream waits here until the whole call is enqueued
      hold_word()[0] = 0, hold_word()[1] = 0;
      cuda::launch_hold_stream(hold_word(), hold_word() + 1, kHoldTimeoutNs, stream_);
      release.word = hold_word();
    }
    TWELL_CUDA_CHECK(cudaEventRecord(start_, stream_));
    fn();
    TWELL_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    if (hold) __atomic_store_n(&hold_word()[0], 1u, __ATOMIC_RELEASE);
    TWELL_CUDA_CHECK(cudaEventSynchronize(stop_));
    // A call that synchronises inside outlasts the hold, which then lets the stream go: its time
    // includes the host's latency after all. Until reset_timing() this backend times host (timing_used
    // says so, and run_ffn_bench times the case again).
    if (hold && __atomic_load_n(&hold_word()[1], __ATOMIC_ACQUIRE) != 0) hold_failed_ = true;
    float ms = 0;
    TWELL_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

  bool energy_available(std::string* why) override {
    if (!meter_) meter_ = std::make_unique<GpuMeter>();
    if (!meter_->available() && why) *why = "NVML (libnvidia-ml.so.1) cannot read this GPU's energy counter";
    return meter_->available();
  }

  void meter_start() override {
    if (energy_available(nullptr)) meter_->start();
  }
  MeterReading meter_stop() override { return meter_ ? meter_->stop() : MeterReading{}; }

  // Calls enqueued back to back, at most two batches ahead of the GPU (an event a batch), so the
  // GPU does not wait for the host unless a call synchronises inside (a --train step waits once for
  // its counts, and tiny calls enqueue slower than they run: then the host's gaps count too, as in
  // a real loop). CUDA events time the whole stretch.
  EnergySums sustained(const std::function<void(int)>& fn, double seconds) override {
    TWELL_CHECK(seconds > 0, "sustained: ", seconds, " seconds");
    if (!energy_available(nullptr)) return {};
    using Clock = std::chrono::steady_clock;
    constexpr int kBatch = 8;
    int calls = 0;
    for (; calls < kBatch; ++calls) fn(calls);  // into the stretch's steady state
    TWELL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    struct Stop {  // the sampler stops however the stretch ends
      GpuMeter& m;
      ~Stop() { m.stop(); }
    } stop_sampler{*meter_};
    meter_->start();
    TWELL_CUDA_CHECK(cudaEventRecord(start_, stream_));
    const Clock::time_point t0 = Clock::now();
    int timed = 0;
    for (int batch = 0; timed == 0 || std::chrono::duration<double>(Clock::now() - t0).count() < seconds; ++batch) {
      for (int k = 0; k < kBatch; ++k, ++timed) fn(calls++);
      TWELL_CUDA_CHECK(cudaEventRecord(batch_done_[batch % 2], stream_));
      if (batch > 0) TWELL_CUDA_CHECK(cudaEventSynchronize(batch_done_[(batch + 1) % 2]));
    }
    TWELL_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    TWELL_CUDA_CHECK(cudaEventSynchronize(stop_));
    EnergySums out;
    out.meter = meter_->stop();
    float ms = 0;
    TWELL_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    out.gpu_ms = ms, out.calls = timed;
    return out;
  }

 private:
  struct State {
    const FfnProblem* problem = nullptr;
    int64_t case_id = -1;
    DeviceTensor wg, wu, wd;
    std::vector<DeviceTensor> x;
    DeviceTensor y_dense, y_unfused, y_twell, y_sparse, y_split, g_unfused, u_unfused;
    cuda::LtGemm gemm;
    std::unique_ptr<cuda::FfnForward> dense, twell, sparse;
    std::unique_ptr<cuda::SplitFfn> split;  // --split
    // --train
    struct Grads {
      DeviceTensor dx, dwgu, dwd;  // dWg and dWu stacked [2I, H]
    };
    struct Train {
      DeviceTensor dy, g, u, h, dh, dgu, wgu;
      Grads dense, twell, sparse;
    } train;
  };
  using Grads = State::Grads;
  using Train = State::Train;

  // Fills the buffers with NaN on the bench's stream.
  std::function<void()> poison(std::vector<DeviceTensor*> buffers) {
    return [this, buffers] {
      for (DeviceTensor* t : buffers)
        if (t->nbytes()) cuda::fill_bytes(t->view().data, t->nbytes(), 0xff, stream_);
    };
  }

  static cuda::FfnShape shape(const FfnProblem& p) {
    return {p.ffn.spec.M, p.ffn.spec.H, p.ffn.spec.I, p.ffn.spec.gated};
  }
  static cuda::FfnOptions options(const FfnBenchConfig& cfg) {
    cuda::FfnOptions o;
    o.tile = cfg.tile;
    o.compression = cfg.compression;
    return o;
  }
  FfnWeights weights() const {
    return {state_->problem->ffn.spec.gated ? state_->wg.view() : TensorView{}, state_->wu.view(), state_->wd.view()};
  }

  // Uploads a problem once (occupancy() and runners() see the same one).
  void prepare(const FfnProblem& p, const FfnBenchConfig&) {
    if (state_ && state_->problem == &p && state_->case_id == p.case_id) return;
    state_.reset();
    TWELL_CUDA_CHECK(cudaDeviceSynchronize());
    auto s = std::make_unique<State>();
    s->problem = &p;
    s->case_id = p.case_id;
    if (p.ffn.spec.gated) s->wg = DeviceTensor::upload(p.ffn.wg, stream_);
    s->wu = DeviceTensor::upload(p.ffn.wu, stream_);
    s->wd = DeviceTensor::upload(p.ffn.wd, stream_);
    for (int i = 0; i < p.n_token_sets(); ++i) s->x.push_back(DeviceTensor::upload(p.x(i), stream_));
    const Shape y_shape{p.ffn.spec.M, p.ffn.spec.H};
    for (DeviceTensor* y : {&s->y_dense, &s->y_unfused, &s->y_twell, &s->y_sparse}) {
      *y = DeviceTensor(DType::bf16, y_shape);
      cuda::fill_bytes(y->view().data, y->nbytes(), 0xff, stream_);  // poison: NaN until written
    }
    state_ = std::move(s);
  }

  cuda::DeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  // Timing::gpu's hold kernel: [0] the host's release, [1] set by the kernel if it gave up waiting.
  static constexpr uint64_t kHoldTimeoutNs = 100'000'000;
  cuda::PinnedBuffer hold_words_{2 * sizeof(uint32_t), cudaHostAllocMapped};
  uint32_t* hold_word() const { return hold_words_.as<uint32_t>(); }
  bool hold_failed_ = false;  // a held call outlasted the hold: time host until reset_timing()
  cuda::DeviceBuffer flush_, flush_sink_;  // time_ms's L2 flush
  std::unique_ptr<GpuMeter> meter_;  // --energy, made on first use
  cudaEvent_t batch_done_[2] = {};   // sustained()'s batches
  std::unique_ptr<State> state_;
};

}  // namespace

bool cuda_backend_available(std::string* why) { return cuda::hopper_available(why); }
std::unique_ptr<FfnBackend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace twell::bench

#endif  // TWELL_WITH_CUDA
