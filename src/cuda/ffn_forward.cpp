// FfnForward: the FFN forward entry point (include/twell/cuda/ffn.h). Owns the cuBLASLt plans
// and the workspace sized for `max_tokens`, checks arguments, and dispatches sparse or dense.
#include "twell/cuda/ffn.h"

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <optional>
#include <vector>

#include "cuda/cublaslt_gemm.h"
#include "cuda/kernels.h"
#include "twell/cuda/twell_device.h"

namespace twell::cuda {

struct FfnForward::Impl {
  // Destroyed last: gives back the device that was current when the object was destroyed, which
  // ~Impl makes its own GPU for the members' destructors (an object may be destroyed with another
  // GPU current: Python's deferred destruction of collected handles, say).
  struct RestoreDevice {
    int previous = -1;
    ~RestoreDevice() {
      if (previous >= 0) cudaSetDevice(previous);
    }
  } restore_device;
  FfnShape shape;
  FfnOptions options;
  int sm_count = 0;
  size_t l2_bytes = 0;
  int device = 0;  // the GPU current at construction, whose memory the buffers are
  // The weights last found in the device's memory (check_memory), checked again only when they move.
  const void* checked_weights[3] = {nullptr, nullptr, nullptr};
  LtGemm gemm;
  // The forward's workspace: the buffers below (Plan), carved from the caller's memory or from
  // `own`; forward_bytes in all. The backward's (bwd) is apart.
  size_t forward_bytes = 0;
  DeviceBuffer own;  // the workspace when the caller gives none
  void* base = nullptr;          // where the workspace starts
  void* forward_base = nullptr;  // where it started at the last forward(), whose state is there
  DeviceBuffer g;    // [max_tokens, I] bf16: ReLU'd gate output (non-gated: h)
  // The dense path's buffers and the TwELL path's share one region (Plan::paths): a call takes one
  // path, and what a later call or backward() reads is that path's alone.
  DeviceBuffer u;        // [max_tokens, I] bf16: up output / h on the dense path (not training)
  DeviceBuffer h_dense;  // training: h of the dense path, apart from u
  TwellDeviceMatrix act;
  DeviceBuffer u_vals;  // u of every active entry, beside the format (twell_u_size)
  DeviceBuffer row_nnz, heavy_rows;  // per-row counts and the heavy-row list (RowCounts)
  DeviceBuffer gate_workspace;       // the fused gate+pack GEMM's (CUTLASS tile scheduler)
  // The backward's workspace, allocated on its first call: the transpose of the active set (sized
  // by the forward's non-zero count, grown as needed) and the dW pass's plan, which the side stream
  // writes. (dg and du beside the format, ~4.5 · M · I bytes, the dW pass's partial sums, ~100 MB at
  // H = 2048, and the dense path's ~8 · M · I are StreamScratch: one call's, on its stream, shared
  // with the other objects.)
  struct Backward {
    DeviceBuffer row_start, col_start, keys, pairs, keys_sorted, pairs_sorted, temp;
    DeviceBuffer dw_plan;  // the dW pass's plan
    size_t bytes() const {
      return row_start.bytes() + col_start.bytes() + keys.bytes() + pairs.bytes() + keys_sorted.bytes() +
             pairs_sorted.bytes() + temp.bytes() + dw_plan.bytes();
    }
  } bwd;
  // Gather path (M <= gather_tokens): the ranges' partial sums.
  int64_t gather_tokens = 0;
  std::string twell_unsupported;  // why the TwELL kernels cannot take this shape, or ""
  DeviceBuffer gather_partial;
  // One token (M = 1) on the gather path: the fused decode kernel (gate GEMV included) and its
  // blocks' partial sums; empty where the shape does not fit it.
  DecodeFfn decode;
  // Device counters of the sparse path: kNnzCounters non-zero partial sums, spilled tiles, the
  // overflow flag; and, apart, the dispatch sample's count.
  struct Counters {
    unsigned long long nnz[kNnzCounters];
    uint32_t spilled_tiles;  // copied from the format's backup counter
    uint32_t overflow;
    uint32_t next_row[4];    // the sparse kernels' work counters
    uint32_t heavy_count;    // rows in the heavy list
  };
  DeviceBuffer counters, sample_count;     // sample_count: one counter per dispatch slot
  PinnedBuffer host_counters, host_samples;  // pinned mirrors of counters and sample_count
  Counters* host() const { return host_counters.as<Counters>(); }
  unsigned long long* host_sample() const { return host_samples.as<unsigned long long>(); }

  // A device-to-host copy in flight, marked by an event recorded after it.
  struct Readback {
    cudaEvent_t ready = nullptr;
    bool pending = false;
    void record(cudaStream_t stream) {
      TWELL_CUDA_CHECK(cudaEventRecord(ready, stream));
      pending = true;
    }
    // True (once) when the copy has landed; waits for it if `wait`.
    bool arrived(bool wait) {
      if (!pending) return false;
      if (wait) TWELL_CUDA_CHECK(cudaEventSynchronize(ready));
      else if (cudaEventQuery(ready) != cudaSuccess) return false;
      pending = false;
      return true;
    }
  };
  Readback counts;
  // The backward's side stream (its transpose runs beside the passes: launch_twell_ffn_backward),
  // created by the first backward (inference never pays for it); from then on `packed` is recorded
  // after each sparse forward's pack, outside graph capture, for the next backward only.
  cudaStream_t side = nullptr;
  cudaEvent_t packed = nullptr, side_done = nullptr;
  bool packed_recorded = false;
  // Dispatch::previous state, one per slot (FfnOptions::dispatch_slots: a model's layers).
  struct Slot {
    Readback sample;
    int64_t sample_rows = 0;       // rows the pending sample covers
    double previous_density = -1;  // sampled by an earlier call; -1 before any
  };
  std::vector<Slot> slots;
  FfnStats stats;
  // The state a backward needs: set once a forward's sparse path (or, training, its dense path)
  // has been enqueued, with the inputs it ran on (the backward must get the same ones).
  struct SavedForward {
    bool ready = false;
    const void *x = nullptr, *wg = nullptr, *wu = nullptr, *wd = nullptr;
    // then.normed was x (allowed without FfnOptions::training): the weight gradients dWg, dWu, which read x
    // again, cannot be had; dx and dWd can.
    bool x_overwritten = false;
  } saved;

  // FfnOptions::cublaslt_workspace, checked before the LtGemm takes it.
  static void* checked_lt_workspace(const FfnOptions& o) {
    LtGemm::check_workspace(o.cublaslt_workspace, o.cublaslt_workspace_bytes, "FfnForward: cublaslt_workspace");
    return o.cublaslt_workspace;
  }

  static FfnOptions with_tile(FfnOptions o, const FfnShape& s) {
    if (o.tile == 0) o.tile = default_ffn_tile(o.compression, o.training);
    return o;
  }

  // The forward's device buffers and what decides them, from the shape and options alone: the
  // constructor carves them from one workspace of total() bytes (its own, or the caller's), and
  // FfnForward::required_workspace_bytes says that total before anything is allocated.
  struct Plan {
    size_t g = 0, u = 0, h_dense = 0, act = 0, u_vals = 0, row_nnz = 0, heavy_rows = 0, gate = 0, gather = 0,
           decode = 0, counters = 0, samples = 0;
    TwellLayout act_layout;
    std::string twell_unsupported;  // why the TwELL kernels cannot take this shape, or ""
    int64_t gather_tokens = 0;
    bool one_token = false;
    // The region both paths' buffers start at: the larger of the dense path's (u, h_dense) and the
    // TwELL path's (the matrix, whose pieces are rounded already, and u_vals).
    size_t dense_part() const { return DeviceArena::piece(u) + DeviceArena::piece(h_dense); }
    size_t sparse_part() const { return act + DeviceArena::piece(u_vals); }
    size_t paths() const { return std::max(dense_part(), sparse_part()); }
    size_t total() const {
      size_t t = paths();
      for (size_t b : {g, row_nnz, heavy_rows, gate, gather, decode, counters, samples}) t += DeviceArena::piece(b);
      return t;
    }
  };
  static Plan plan(const FfnShape& s, const FfnOptions& o, int sm_count) {
    TWELL_REQUIRE(s.max_tokens >= 1 && s.hidden >= 1 && s.ffn >= 1, "FfnForward: sizes must be positive, got M=",
                s.max_tokens, " H=", s.hidden, " I=", s.ffn);
    TWELL_REQUIRE(s.hidden % 64 == 0 && s.ffn % 64 == 0, "FfnForward: H and I must be multiples of 64, got H=",
                s.hidden, " I=", s.ffn);
    TWELL_REQUIRE(o.precision == Precision::bf16 || o.precision == Precision::h_fp32,
                  "FfnForward: precision must be Precision::bf16 or h_fp32 (f64 is CPU-only), got ",
                  o.precision == Precision::f64 ? "f64" : str("the value ", static_cast<int>(o.precision)));
    const int64_t w = o.dw_slice_columns;
    TWELL_REQUIRE(w == 0 || (w > 0 && w % 8 == 0 && s.hidden % w == 0), "FfnForward: dw_slice_columns = ", w,
                " must be 0 or a multiple of 8 dividing H = ", s.hidden);
    TWELL_REQUIRE(o.dispatch_slots >= 1, "FfnForward: dispatch_slots must be >= 1, got ", o.dispatch_slots);
    checked_lt_workspace(o);
    Plan p;
    const size_t act_bytes = checked_nbytes(DType::bf16, {s.max_tokens, s.ffn});
    p.g = act_bytes;
    if (s.gated) p.u = act_bytes;  // the dense path's up output (non-gated: none)
    if (s.gated && o.training) p.h_dense = act_bytes;
    // The TwELL kernels index the stored values (the packed slots, then backup room for every tile
    // to spill) with 32 bits: (slots + tile) a tile, ~1.125·I a token. So the format is sized for
    // the calls of up to sparse_rows tokens (~678K at I = 5632); larger calls run dense, whatever
    // max_tokens is (docs/perf.md, twenty-fifth session).
    const TwellLayout row{1, s.ffn, o.tile, o.compression};
    row.check();  // the tile and compression (at one row: no limit of max_tokens here)
    const int64_t sparse_rows = std::min(s.max_tokens, ((int64_t{1} << 32) - 1) / values_per_row(row));
    p.act_layout = TwellLayout{sparse_rows, s.ffn, o.tile, o.compression};
    check_twell_pack(p.act_layout);
    p.act = TwellDeviceMatrix::bytes_for(p.act_layout);
    TwellDeviceView layout_only;  // what the checks and sizes below read of the matrix
    layout_only.layout = p.act_layout;
    layout_only.backup_capacity = p.act_layout.count_size();
    p.twell_unsupported = twell_ffn_sparse_unsupported(layout_only, s.hidden, s.ffn);
    if (s.gated && p.twell_unsupported.empty()) p.u_vals = static_cast<size_t>(twell_u_size(layout_only)) * 2;
    p.row_nnz = p.heavy_rows = static_cast<size_t>(s.max_tokens) * 4;
    if (fused_gate_supported(o)) {  // sized here, not at the first call: that may be inside graph capture
      GatePackArgs gp;
      gp.M = sparse_rows, gp.H = s.hidden, gp.I = s.ffn;
      gp.act = layout_only;
      p.gate = std::max<size_t>(gate_pack_workspace_bytes(gp, sm_count), 16);
    }
    // Training takes no gather path: it keeps nothing for backward().
    p.gather_tokens = gather_supports(s.hidden, s.ffn) && !o.training
                          ? std::min(s.max_tokens, std::max<int64_t>(o.gather_max_tokens, 0))
                          : 0;
    int64_t partial = 0;  // sized for the largest need over the M the path takes (one range writes y)
    for (int64_t m = 1; m <= p.gather_tokens; ++m)
      if (gather_splits(m) > 1) partial = std::max(partial, m * gather_splits(m) * s.hidden);
    p.gather = static_cast<size_t>(partial) * 4;
    // The one-token kernel uses none of the gather path's buffers and takes shapes it does not
    // (I past 12288), so it goes with gather_max_tokens >= 1 wherever its own kernel takes the shape
    // (not in training: it keeps nothing for backward()).
    p.one_token = o.one_token_kernel && o.gather_max_tokens >= 1 && !o.training && decode_ffn_supported(s.hidden, s.ffn);
    if (p.one_token) p.decode = DecodeFfn::bytes_for(s.hidden, s.ffn, sm_count);
    p.counters = sizeof(Counters);
    p.samples = static_cast<size_t>(o.dispatch_slots) * sizeof(unsigned long long);
    return p;
  }

  Plan planned;  // this object's buffers

  // The caller's workspace for this object: aligned, large enough, apart from cuBLASLt's.
  void check_workspace(void* workspace, size_t bytes, const char* who) const {
    TWELL_REQUIRE(workspace, who, ": the workspace is null");
    TWELL_REQUIRE(reinterpret_cast<uintptr_t>(workspace) % DeviceArena::kAlign == 0, who, ": the workspace must be ",
                  DeviceArena::kAlign, "-byte aligned");
    TWELL_REQUIRE(bytes >= planned.total(), who, ": the workspace holds ", bytes, " bytes, this shape and these options "
                  "need ", planned.total(), " (FfnForward::required_workspace_bytes)");
    const auto lt = reinterpret_cast<uintptr_t>(options.cublaslt_workspace), ws = reinterpret_cast<uintptr_t>(workspace);
    TWELL_REQUIRE(!lt || lt + options.cublaslt_workspace_bytes <= ws || ws + planned.total() <= lt, who,
                  ": cublaslt_workspace overlaps the forward's workspace");
  }

  // The forward's buffers, carved from `workspace` (planned.total() bytes). Nothing is written there:
  // each call sets what it reads first, on its stream.
  void carve(void* workspace) {
    const Plan& p = planned;
    DeviceArena arena(workspace, p.total());
    g = arena.take(p.g, "g");
    const DeviceBuffer paths = arena.take(p.paths(), "the paths' buffers");
    DeviceArena dense_part(paths.get(), p.dense_part()), sparse_part(paths.get(), p.sparse_part());
    u = dense_part.take(p.u, "u");
    h_dense = dense_part.take(p.h_dense, "h");
    act = TwellDeviceMatrix(p.act_layout, -1, sparse_part.take(p.act, "the TwELL matrix").get());
    u_vals = sparse_part.take(p.u_vals, "u values");
    row_nnz = arena.take(p.row_nnz, "row counts");
    heavy_rows = arena.take(p.heavy_rows, "heavy rows");
    gate_workspace = arena.take(p.gate, "the gate GEMM's workspace");
    gather_partial = arena.take(p.gather, "the gather path's partial sums");
    if (p.one_token) decode = DecodeFfn(shape.hidden, shape.ffn, sm_count, &arena);
    counters = arena.take(p.counters, "counters");
    sample_count = arena.take(p.samples, "dispatch samples");
    forward_bytes = arena.used();
    TWELL_CHECK(forward_bytes == p.total(), "FfnForward: internal error: the workspace plan (", p.total(),
                " bytes) and its use (", forward_bytes, ") differ");
    base = workspace;
  }

  void use_workspace(void* workspace, size_t bytes) {
    check_workspace(workspace, bytes, "FfnForward::use_workspace");
    if (workspace == base) return;
    carve(workspace);
    own = DeviceBuffer();  // after the carve, which may throw; cudaFree waits for the work queued on it
  }

  // `workspace`: the caller's (at least plan().total() bytes, 256-byte aligned), or null: one
  // allocation of its own.
  Impl(const FfnShape& s, const FfnOptions& asked, void* workspace = nullptr, size_t workspace_size = 0)
      : shape(s),
        options(with_tile(asked, s)),
        gemm(LtGemm::autotune_default(), checked_lt_workspace(asked), asked.cublaslt_workspace_bytes) {
    const FfnOptions& o = options;
    const DeviceInfo info = device_info();
    device = info.index;
    sm_count = info.sm_count;
    l2_bytes = info.l2_bytes;
    planned = plan(s, o, sm_count);
    twell_unsupported = planned.twell_unsupported;
    gather_tokens = planned.gather_tokens;
    if (workspace) {
      check_workspace(workspace, workspace_size, "FfnForward");
    } else {
      own = DeviceBuffer(planned.total());
      workspace = own.get();
    }
    carve(workspace);
    const auto n_slots = static_cast<size_t>(o.dispatch_slots);
    host_counters = PinnedBuffer(sizeof(Counters));
    host_samples = PinnedBuffer(n_slots * sizeof(unsigned long long));
    TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&counts.ready, cudaEventDisableTiming));
    slots.resize(n_slots);
    for (Slot& sl : slots) TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&sl.sample.ready, cudaEventDisableTiming));
  }
  ~Impl() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != device && cudaSetDevice(device) == cudaSuccess)
      restore_device.previous = now;
    if (counts.ready) cudaEventDestroy(counts.ready);
    for (Slot& sl : slots)
      if (sl.sample.ready) cudaEventDestroy(sl.sample.ready);
    if (packed) cudaEventDestroy(packed);
    if (side_done) cudaEventDestroy(side_done);
    if (side) cudaStreamDestroy(side);
  }
  Counters* dev() const { return counters.as<Counters>(); }

  // A device operand as the kernels take it: on the GPU, of this dtype and shape, contiguous,
  // 16-byte aligned.
  static void check_operand(const TensorView& t, DType dtype, const Shape& s, const char* name) {
    check_device(t, Device::cuda, name);
    check_dtype(t, dtype, name);
    check_contiguous(t, name);
    check_shape(t, s, name);
    check_aligned(t, 16, name);
  }

  void check_args(const TensorView& x, const FfnWeights& w, const TensorView& y) const {
    const int64_t H = shape.hidden, I = shape.ffn;
    auto check = [](const TensorView& t, const Shape& s, const char* name) { check_operand(t, DType::bf16, s, name); };
    TWELL_REQUIRE(x.rank() == 2, "FfnForward: x must be [M, H], got shape ", shape_str(x.shape));
    const int64_t M = x.shape[0];
    TWELL_REQUIRE(M <= shape.max_tokens, "FfnForward: x has ", M, " tokens, the workspace holds ", shape.max_tokens);
    check(x, {M, H}, "FfnForward: x");
    check(y, {M, H}, "FfnForward: y");
    TWELL_REQUIRE(w.gated() == shape.gated, "FfnForward: built for a ", shape.gated ? "gated" : "non-gated",
                " FFN but weights are ", w.gated() ? "gated" : "non-gated");
    if (shape.gated) check(w.wg, {I, H}, "FfnForward: wg");
    check(w.wu, {I, H}, "FfnForward: wu");
    check(w.wd, {I, H}, "FfnForward: wd");
    check_ffn_outputs_disjoint("FfnForward", x, w, y);
  }

  // Where the operands are: on this object's GPU, which is the current one (a pointer's attributes
  // are a driver call, ~µs: the weights only when they are not the last call's).
  void check_memory(std::initializer_list<std::pair<const TensorView*, const char*>> operands, const FfnWeights& w) {
    int now = 0;
    TWELL_CUDA_CHECK(cudaGetDevice(&now));
    TWELL_REQUIRE(now == device, "FfnForward: made on GPU ", device, " but called with GPU ", now,
                  " current (make its device current: cudaSetDevice, torch.cuda.device)");
    for (const auto& [t, name] : operands) check_on_current_gpu(*t, name);
    const void* weights[3] = {w.wg.data, w.wu.data, w.wd.data};
    if (std::equal(weights, weights + 3, checked_weights)) return;
    check_on_current_gpu(w.wg, "FfnForward: wg");
    check_on_current_gpu(w.wu, "FfnForward: wu");
    check_on_current_gpu(w.wd, "FfnForward: wd");
    std::copy(weights, weights + 3, checked_weights);
  }

  // Inside CUDA graph capture nothing may come back to the host: dispatch must be fixed and the
  // non-zero count off (the model's decode steps and short prefills run that way), or the call one
  // token on the one-token kernel, which dispatch takes at every density and which counts nothing
  // (forward(): one_token).
  bool capturable() const {
    const bool fixed = options.dispatch == Dispatch::always_sparse || options.dispatch == Dispatch::always_dense;
    return fixed && !options.count_nonzeros;
  }
  bool capturable(int64_t M) const {
    return capturable() || (M == 1 && !decode.empty() && options.dispatch != Dispatch::always_dense);
  }
  // Whether `stream` is capturing; refuses a call of M tokens that capture cannot hold.
  bool check_capture(cudaStream_t stream, int64_t M) const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    TWELL_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    if (status == cudaStreamCaptureStatusNone) return false;
    TWELL_REQUIRE(capturable(M),
                "FfnForward: inside CUDA graph capture the density cannot be read back on the host; use "
                "dispatch always_sparse or always_dense with count_nonzeros = false (or call with one token, "
                "on the one-token kernel)");
    return true;
  }

  // View of the TwELL workspace for M tokens (the arrays are sized for sparse_rows() tokens).
  TwellDeviceView act_view(int64_t M) const {
    TwellDeviceView v = act.view();
    v.layout.rows = M;
    return v;
  }

  // Rows of g whose non-zeros estimate the density for dispatch (a few MB at most); calls below
  // sparse_min_tokens, which run dense whatever the density, sample fewer (1.4 MB at I = 5632):
  // enough for observed_density, at ~1% of such a call's time.
  static constexpr int64_t kSampleRows = 1024, kSmallSampleRows = 128;

  // Enqueues the count of a row sample of g and its copy to the host (read by collect_sample).
  void launch_sample(int64_t slot, int64_t M, cudaStream_t stream, int64_t rows = kSampleRows) {
    Slot& sl = slots[static_cast<size_t>(slot)];
    sl.sample_rows = std::min(M, rows);
    auto* d = sample_count.as<unsigned long long>() + slot;
    // Into the pinned mirror by a kernel: a copy in the stream left the GPU idle ~15 µs.
    TWELL_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof(unsigned long long), stream));
    launch_count_sampled_nonzeros(g.as<uint16_t>(), M, shape.ffn, sl.sample_rows, d, stream);
    PackReport copy;
    copy.copy_src = reinterpret_cast<const uint32_t*>(d);
    copy.copy_dst = reinterpret_cast<uint32_t*>(host_sample() + slot);
    copy.copy_words = 2;
    launch_report(copy, stream);
    sl.sample.record(stream);
  }
  // A fused sparse call, which writes no g, samples exactly: the packed non-zero total of all M
  // rows, summed into the slot's pinned word (PackReport); the caller records the event after.
  unsigned long long* exact_sample(int64_t slot, int64_t M) {
    slots[static_cast<size_t>(slot)].sample_rows = M;
    return host_sample() + slot;
  }
  // The counters into their pinned mirror, the backup's count in place of spilled_tiles.
  void counts_report(PackReport& r) {
    static_assert(sizeof(Counters) % 4 == 0 && offsetof(Counters, spilled_tiles) % 4 == 0);
    r.copy_src = reinterpret_cast<const uint32_t*>(dev());
    r.copy_dst = reinterpret_cast<uint32_t*>(host());
    r.copy_words = sizeof(Counters) / 4;
    r.patch = act.view().n_backup;
    r.patch_at = offsetof(Counters, spilled_tiles) / 4;
  }

  // Updates previous_density from the pending sample if it has arrived (or waits for it).
  void collect_sample(int64_t slot, bool wait) {
    Slot& sl = slots[static_cast<size_t>(slot)];
    if (!sl.sample.arrived(wait)) return;
    sl.previous_density = double(host_sample()[slot]) / double(sl.sample_rows * shape.ffn);
  }

  // Dispatch's threshold: inference's or training's (their break-evens differ).
  double dense_above() const {
    return options.training ? options.training_dense_above_density : options.dense_above_density;
  }

  static bool fused_gate_supported(const FfnOptions& o) { return o.fused_gate && gate_pack_supports_tile(o.tile); }

  // Packed activation and its statistics; the counts come back to the host asynchronously. With
  // `fused`, the gate is computed here by the fused gate+pack kernel (and, for sample_slot >= 0,
  // the exact density becomes that slot's dispatch sample); otherwise g holds it.
  void run_sparse(int64_t M, const uint16_t* xp, const FfnWeights& w, uint16_t* yp, const ResidualNormOut& then,
                  cudaStream_t stream, bool fused = false, int64_t sample_slot = -1) {
    static_assert(sizeof(Counters) % 4 == 0);
    ZeroWords zero;  // one launch: the counters (the passes' among them), the backup's, the row counts
    zero.add(counters.get(), sizeof(Counters) / 4).add(act.view().n_backup, 1);
    if (fused) zero.add(row_nnz.get(), M);  // the fused gate adds to them; the pack kernel writes them
    launch_zero_words(zero, stream);
    SparseFfnArgs a;
    a.act = act_view(M);
    a.u_vals = u_vals.as<uint16_t>();
    a.x = xp;
    a.wu = static_cast<const uint16_t*>(w.wu.data);
    a.wd = static_cast<const uint16_t*>(w.wd.data);
    a.y = yp;
    a.row_counters = dev()->next_row;
    a.rows = {row_nnz.as<uint32_t>(), heavy_rows.as<uint32_t>(), &dev()->heavy_count};
    a.M = M, a.H = shape.hidden, a.I = shape.ffn;
    a.gated = shape.gated;
    a.precision = options.precision;
    a.then = then;
    if (fused) {
      GatePackArgs gp;
      gp.x = xp;
      gp.w = static_cast<const uint16_t*>(shape.gated ? w.wg.data : w.wu.data);
      gp.M = M, gp.H = shape.hidden, gp.I = shape.ffn;
      gp.act = a.act;
      gp.nnz_total = dev()->nnz;
      gp.overflow = &dev()->overflow;
      gp.rows = a.rows;
      // The dispatch sample (the exact density) and the counts for the host.
      PackReport report;
      if (sample_slot >= 0) {
        report.sum_in = dev()->nnz, report.sum_n = kNnzCounters;
        report.sum_out = exact_sample(sample_slot, M);
      }
      if (options.count_nonzeros) counts_report(report);
      // Started under zero_words, whose words its loads wait for.
      launch_gate_pack(gp, gate_workspace.get(), gate_workspace.bytes(), sm_count, stream, true);
      if (options.training) {
        // The backward waits on the host for the counts (collect_counts): made right after the
        // gate, they let the host queue the backward's side stream while the passes still run.
        launch_report(report, stream);
      } else {
        a.report = report;   // made by the first pass, on the side
        a.dependent = true;  // so nothing goes between the gate and the passes
      }
    } else {
      launch_twell_pack(g.as<uint16_t>(), a.act, dev()->nnz, &dev()->overflow, a.rows, sm_count, stream);
      if (options.count_nonzeros) {
        PackReport r;
        counts_report(r);
        launch_report(r, stream);
      }
    }
    // The host's events for the reports, recorded after whichever kernel makes them.
    const bool reported_by_pass = a.report.any();
    auto record_reports = [&] {
      if (fused && sample_slot >= 0) slots[static_cast<size_t>(sample_slot)].sample.record(stream);
      if (options.count_nonzeros) counts.record(stream);
    };
    if (!reported_by_pass) record_reports();
    packed_recorded = false;
    if (packed) {  // a backward has run: the next one's transpose may start from here
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      TWELL_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
      packed_recorded = capture == cudaStreamCaptureStatusNone;
      if (packed_recorded) {
        TWELL_CUDA_CHECK(cudaEventRecord(packed, stream));
        a.dependent = false;
      }
    }
    launch_twell_ffn_sparse(a, sm_count, stream);
    if (reported_by_pass) record_reports();
  }

  void run_gather(int64_t M, const uint16_t* xp, const FfnWeights& w, uint16_t* yp, cudaStream_t stream) {
    GatherArgs a;
    a.g = g.as<uint16_t>();
    a.x = xp;
    a.wu = static_cast<const uint16_t*>(w.wu.data);
    a.wd = static_cast<const uint16_t*>(w.wd.data);
    a.partial = gather_partial.as<float>();
    a.y = yp;
    a.M = M, a.H = shape.hidden, a.I = shape.ffn;
    a.gated = shape.gated;
    a.h_fp32 = options.precision == Precision::h_fp32;
    launch_ffn_gather(a, stream);
  }

  // One token through the fused decode kernel, its partial sums added into y.
  void run_decode(const uint16_t* xp, const FfnWeights& w, uint16_t* yp, cudaStream_t stream) {
    launch_split_sum(decode.run(xp, w, options.precision == Precision::h_fp32, options.early_weight_reads, stream),
                     shape.hidden, yp, stream);
  }

  // Reads the counts of the last sparse call if they are available (or waits for them).
  void collect_counts(bool wait) {
    if (!counts.arrived(wait)) return;
    // The backup is sized for every tile to spill, so this is a broken invariant, not user error.
    TWELL_CHECK(host()->overflow == 0, "FfnForward: TwELL backup overflowed (internal error)");
    unsigned long long nnz = 0;
    for (unsigned long long c : host()->nnz) nnz += c;
    stats.nnz = static_cast<int64_t>(nnz);
    stats.spilled_tiles = host()->spilled_tiles;
  }

  static void grow(DeviceBuffer& b, size_t bytes) {
    if (b.bytes() < bytes) b = DeviceBuffer(bytes);
  }

  void backward(const TensorView& x, const FfnWeights& w, const TensorView& dy, double l1_coeff, const FfnGrads& grads,
                cudaStream_t stream) {
    check_args(x, w, dy);  // dy has y's shape and dtype
    const int64_t M = x.shape[0], H = shape.hidden, I = shape.ffn;
    TWELL_REQUIRE(shape.gated, "FfnForward::backward: only the gated FFN has a GPU backward so far");
    TWELL_REQUIRE(options.precision == Precision::bf16, "FfnForward::backward: only Precision::bf16 so far");
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TWELL_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    TWELL_REQUIRE(capture == cudaStreamCaptureStatusNone,
                "FfnForward::backward: cannot be captured in a CUDA graph yet (it reads the forward's non-zero count "
                "back to size the transpose)");
    TWELL_REQUIRE(base == forward_base, "FfnForward::backward: use_workspace() moved the workspace since the last "
                  "forward(), whose state the backward reads there: run the forward again (or move back)");
    TWELL_REQUIRE(stats.tokens == M && (M == 0 || saved.ready),
                "FfnForward::backward: needs the state of a forward() of the same tokens; the last call had ",
                stats.tokens, " tokens on the ", to_string(stats.path),
                " path (for training set FfnOptions::training)");
    TWELL_REQUIRE(M == 0 || (x.data == saved.x && w.wg.data == saved.wg && w.wu.data == saved.wu && w.wd.data == saved.wd),
                "FfnForward::backward: x and the weights must be those of the last forward() (its saved state "
                "belongs to them)");
    auto check_grad = [](const TensorView& t, const Shape& s, const char* name) {
      check_optional(t, name);
      if (!t.empty()) check_operand(t, DType::f32, s, name);
    };
    check_grad(grads.dx, {M, H}, "FfnForward::backward: grads.dx");
    check_grad(grads.dwg, {I, H}, "FfnForward::backward: grads.dwg");
    check_grad(grads.dwu, {I, H}, "FfnForward::backward: grads.dwu");
    check_grad(grads.dwd, {I, H}, "FfnForward::backward: grads.dwd");
    TWELL_REQUIRE(!saved.x_overwritten || (grads.dwg.empty() && grads.dwu.empty()),
                "FfnForward::backward: the last forward() wrote then.normed over x, which grads.dwg and grads.dwu "
                "need (dx and dwd do not): give then.normed its own memory (FfnOptions::training refuses the overlap)");
    check_ffn_grads_disjoint("FfnForward::backward", x, w, dy, grads);
    check_memory({{&x, "FfnForward::backward: x"}, {&dy, "FfnForward::backward: dy"},
                  {&grads.dx, "FfnForward::backward: grads.dx"}, {&grads.dwg, "FfnForward::backward: grads.dwg"},
                  {&grads.dwu, "FfnForward::backward: grads.dwu"}, {&grads.dwd, "FfnForward::backward: grads.dwd"}},
                 w);
    check_l1_coefficient(l1_coeff, "FfnForward::backward");
    const bool need_dw = !grads.dwg.empty() || !grads.dwu.empty() || !grads.dwd.empty();
    if (M == 0) {  // no tokens: the weight gradients are zero
      for (const TensorView* t : {&grads.dwg, &grads.dwu, &grads.dwd})
        if (!t->empty()) TWELL_CUDA_CHECK(cudaMemsetAsync(t->data, 0, static_cast<size_t>(I * H) * 4, stream));
      return;
    }
    if (stats.path == FfnPath::dense) return dense_backward(x, w, dy, static_cast<float>(l1_coeff), grads, stream);
    TWELL_REQUIRE(!need_dw || options.count_nonzeros,
                "FfnForward::backward: weight gradients need the forward's non-zero count (count_nonzeros = true)");
    // dg and du: written by the dh pass, read by the dx and dW passes, all on `stream` (the side
    // stream's transpose reads the format only), so scratch of this call.
    // Sized for this call's M: a u index is below M·n_tiles·slots + (spilled tiles)·tile, and a call
    // spills at most M·n_tiles tiles (the backup count restarts each call).
    const TwellDeviceView view = act_view(M);
    const size_t u_bytes =
        static_cast<size_t>(std::min(twell_u_size(view), M * values_per_row(view.layout))) * 2;
    StreamScratch dg_vals(u_bytes, stream), du_vals(u_bytes, stream);
    // The dW pass's partial sums of split neurons: written and read on `stream` alone, after the join.
    // Sized by the forward's non-zero count, known once need_dw has waited for it below.
    std::optional<StreamScratch> dw_scratch;
    SparseBackwardArgs a;
    a.act = act_view(M);
    a.rows = {row_nnz.as<uint32_t>(), heavy_rows.as<uint32_t>(), &dev()->heavy_count};
    a.x = static_cast<const uint16_t*>(x.data);
    a.dy = static_cast<const uint16_t*>(dy.data);
    a.wg = static_cast<const uint16_t*>(w.wg.data);
    a.wu = static_cast<const uint16_t*>(w.wu.data);
    a.wd = static_cast<const uint16_t*>(w.wd.data);
    a.u_vals = u_vals.as<uint16_t>();
    a.dg_vals = dg_vals.as<uint16_t>();
    a.du_vals = du_vals.as<uint16_t>();
    a.dx = static_cast<float*>(grads.dx.data);
    a.dwg = static_cast<float*>(grads.dwg.data);
    a.dwu = static_cast<float*>(grads.dwu.data);
    a.dwd = static_cast<float*>(grads.dwd.data);
    a.row_counters = dev()->next_row;
    a.M = M, a.H = H, a.I = I;
    a.l1 = static_cast<float>(l1_coeff);
    a.dw_slice = options.dw_slice_columns > 0 ? options.dw_slice_columns : twell_dw_slice_columns(M, H, l2_bytes);
    if (need_dw) {
      // NOTE: the one host synchronisation of the backward: the transpose is sized by the forward's
      // non-zero count (the backup bounds it too, but at 16 bytes per possible entry: M·I·16). In
      // training (FfnOptions::training) the count is copied right after the forward's pack, so the
      // GPU still has the forward's up and down passes queued while the host waits here.
      collect_counts(true);
      const size_t n = static_cast<size_t>(std::max<int64_t>(stats.nnz, 1)) * 4;
      grow(bwd.row_start, static_cast<size_t>(M + 1) * 4);
      grow(bwd.col_start, static_cast<size_t>(I + 1) * 4);
      for (DeviceBuffer* b : {&bwd.keys, &bwd.keys_sorted}) grow(*b, n);
      for (DeviceBuffer* b : {&bwd.pairs, &bwd.pairs_sorted}) grow(*b, 2 * n);
      grow(bwd.temp, std::max<size_t>(twell_backward_temp_bytes(stats.nnz, M, I), 16));
      grow(bwd.dw_plan, twell_dw_plan_words(stats.nnz, I) * 4);
      dw_scratch.emplace(twell_dw_scratch_bytes(stats.nnz, H), stream);
      a.dw_plan = bwd.dw_plan.as<uint32_t>();
      a.dw_scratch = dw_scratch->as<float>();
      a.row_start = bwd.row_start.as<uint32_t>();
      a.col_start = bwd.col_start.as<uint32_t>();
      a.keys = bwd.keys.as<uint32_t>();
      a.keys_sorted = bwd.keys_sorted.as<uint32_t>();
      a.pairs = bwd.pairs.as<uint64_t>();
      a.pairs_sorted = bwd.pairs_sorted.as<uint64_t>();
      a.temp = bwd.temp.get();
      a.temp_bytes = bwd.temp.bytes();
      a.nnz = stats.nnz;
      if (!side) {
        TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&packed, cudaEventDisableTiming));
        TWELL_CUDA_CHECK(cudaEventCreateWithFlags(&side_done, cudaEventDisableTiming));
        int least = 0, greatest = 0;  // the side stream's small kernels take SMs first as the passes free them
        TWELL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        TWELL_CUDA_CHECK(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, greatest));
      }
      // The forward's event orders the side stream after the pack only, not after what this
      // stream queued since (an earlier backward's dW still reading col_start, pairs_sorted and the
      // dW plan): it serves one backward; a further one records the event here.
      if (!packed_recorded) TWELL_CUDA_CHECK(cudaEventRecord(packed, stream));
      packed_recorded = false;
      a.side = side, a.packed = packed, a.join = side_done;
    }
    launch_twell_ffn_backward(a, sm_count, stream);
  }

  // After a training forward on the dense path: dh = dy·Wdᵀ (f32), [dg | du] element-wise (the
  // bf16 rounding rule of ffn_grad.cuh), dx = [dg | du]·[Wg; Wu] as one GEMM (the weights stacked
  // by a copy: 2·I·H·2 bytes, cheaper than a second GEMM adding into f32 dx; no copy when Wu
  // already follows Wg in memory), dWg = dgᵀx, dWu = duᵀx (one GEMM when the two gradients are
  // adjacent in memory), dWd = hᵀdy. Its buffers are scratch of this call (StreamScratch): a
  // model's layers share them rather than each keeping ~8 · M · I bytes after its first dense step.
  void dense_backward(const TensorView& x, const FfnWeights& w, const TensorView& dy, float l1, const FfnGrads& grads,
                      cudaStream_t stream) {
    const int64_t M = x.shape[0], H = shape.hidden, I = shape.ffn;
    const size_t w_bytes = static_cast<size_t>(I * H) * 2;
    const bool stack = !grads.dx.empty() && w.wu.data != static_cast<const char*>(w.wg.data) + w_bytes;
    StreamScratch dh(static_cast<size_t>(M * I) * 4, stream), dgdu(static_cast<size_t>(M * I) * 4, stream),
        wgu_stacked(stack ? 2 * w_bytes : 0, stream);
    auto* dgu = dgdu.as<uint16_t>();  // [M, 2I]: dg in columns [0, I), du in [I, 2I)
    gemm.run(dy.data, w.wd.data, dh.get(), M, I, H, true, GemmEpilogue::none, stream, GemmOut::f32);
    launch_dense_grad(g.as<uint16_t>(), u.as<uint16_t>(), dh.as<float>(), l1, dgu, dgu + I, 2 * I, M, I, stream);
    if (!grads.dx.empty()) {
      const void* wgu = w.wg.data;  // already stacked when Wu follows Wg (a fused gate_up weight)
      if (stack) {
        char* stacked = wgu_stacked.as<char>();
        TWELL_CUDA_CHECK(cudaMemcpyAsync(stacked, w.wg.data, w_bytes, cudaMemcpyDeviceToDevice, stream));
        TWELL_CUDA_CHECK(cudaMemcpyAsync(stacked + w_bytes, w.wu.data, w_bytes, cudaMemcpyDeviceToDevice, stream));
        wgu = stacked;
      }
      gemm.run(dgu, wgu, grads.dx.data, M, H, 2 * I, false, GemmEpilogue::none, stream, GemmOut::f32);
    }
    const bool adjacent = !grads.dwg.empty() && !grads.dwu.empty() &&
                          grads.dwu.data == static_cast<float*>(grads.dwg.data) + I * H;
    if (adjacent) {
      gemm.run_at(dgu, x.data, grads.dwg.data, 2 * I, H, M, stream);
    } else {
      if (!grads.dwg.empty()) gemm.run_at(dgu, x.data, grads.dwg.data, I, H, M, stream, GemmOut::f32, 2 * I);
      if (!grads.dwu.empty()) gemm.run_at(dgu + I, x.data, grads.dwu.data, I, H, M, stream, GemmOut::f32, 2 * I);
    }
    if (!grads.dwd.empty()) gemm.run_at(h_dense.get(), dy.data, grads.dwd.data, I, H, M, stream);
  }

  // out [M, I] = (relu) x Wᵀ: twell's GEMV for one token (FfnOptions::one_token_gemv), its few-token
  // GEMM for 2 to 32 (FfnOptions::few_token_gemm), otherwise cuBLASLt with its ReLU epilogue.
  void project(const void* x, const void* weight, uint16_t* out, int64_t M, bool relu, cudaStream_t stream) {
    const int64_t H = shape.hidden, I = shape.ffn;
    const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(weight) % 16 == 0;
    if (M == 1 && options.one_token_gemv && decode_gemv_supported(I, H) && aligned) {
      DecodeGemvArgs args;
      args.x = static_cast<const uint16_t*>(x), args.w = static_cast<const uint16_t*>(weight), args.y = out;
      args.N = I, args.K = H, args.relu = relu;
      args.early_weight_reads = options.early_weight_reads;
      launch_decode_gemv(args, sm_count, stream);
    } else if (M > 1 && options.few_token_gemm && few_token_gemm_supported(M, I, H) && aligned) {
      FewTokenGemmArgs args;
      args.x = static_cast<const uint16_t*>(x), args.w = static_cast<const uint16_t*>(weight), args.y = out;
      args.M = M, args.N = I, args.K = H, args.relu = relu;
      args.early_weight_reads = options.early_weight_reads;
      launch_few_token_gemm(args, sm_count, stream);
    } else {
      gemm.run(x, weight, out, M, I, H, true, relu ? GemmEpilogue::relu : GemmEpilogue::none, stream);
    }
  }

  void forward(const TensorView& x, const FfnWeights& w, const TensorView& y, cudaStream_t stream, int64_t slot,
               const ResidualNorm* then) {
    check_args(x, w, y);
    check_memory({{&x, "FfnForward: x"}, {&y, "FfnForward: y"}}, w);
    ResidualNormOut fused;
    if (then) {
      const int64_t M = x.shape[0], H = shape.hidden;
      check_operand(then->residual, DType::f32, {M, H}, "FfnForward: then.residual");
      check_operand(then->weight, DType::bf16, {H}, "FfnForward: then.weight");
      check_operand(then->normed, DType::bf16, {M, H}, "FfnForward: then.normed");
      TWELL_REQUIRE(H % 8 == 0 && H <= kMaxNormWidth, "FfnForward: the residual RMSNorm takes H a multiple of 8 up to ",
                  kMaxNormWidth, ", got ", H);
      TWELL_REQUIRE(std::isfinite(then->eps) && then->eps >= 0.f, "FfnForward: then.eps ", then->eps,
                  " must be finite and >= 0");
      TWELL_REQUIRE(!memory_overlaps(then->normed, y) && !memory_overlaps(then->residual, y) &&
                      !memory_overlaps(then->normed, then->residual) && !memory_overlaps(then->residual, x),
                  "FfnForward: then.normed, then.residual and y must not overlap, nor then.residual x");
      TWELL_REQUIRE(then->normed.data == x.data || !memory_overlaps(then->normed, x),
                  "FfnForward: then.normed must be x or not overlap it");
      TWELL_REQUIRE(!options.training || !memory_overlaps(then->normed, x),
                  "FfnForward: with FfnOptions::training, then.normed must not be x: backward() reads x again");
      if (then->before.data) {
        check_operand(then->before, DType::bf16, {M, H}, "FfnForward: then.before");
        TWELL_REQUIRE(!memory_overlaps(then->before, then->residual) && !memory_overlaps(then->before, then->normed) &&
                        !memory_overlaps(then->before, y),
                    "FfnForward: then.before must not overlap then.residual, then.normed or y");
      }
      fused = {static_cast<float*>(then->residual.data), static_cast<const uint16_t*>(then->before.data),
               static_cast<const uint16_t*>(then->weight.data), static_cast<uint16_t*>(then->normed.data), then->eps};
    }
    // The sparse path's down pass does the step itself; after the others it is a kernel of its own.
    if (!compute(x, w, y, stream, slot, fused) && then)
      launch_add_rmsnorm(fused.resid, fused.before, static_cast<const uint16_t*>(y.data), true, fused.w, fused.normed,
                         x.shape[0], shape.hidden, 1, 0, fused.eps, stream);
  }

  // TwELL values a token stores with room for every tile to spill: a tile's slots, then its backup.
  static int64_t values_per_row(const TwellLayout& l) { return l.n_tiles() * (l.slots() + l.tile); }
  int64_t sparse_rows() const { return act.layout().rows; }
  bool sparse_supported(int64_t M) const {
    return (M == 1 && !decode.empty()) || M <= gather_tokens || (twell_unsupported.empty() && M <= sparse_rows());
  }
  // Why a call of M tokens has no sparse path (sparse_supported(M) is false).
  std::string sparse_problem(int64_t M) const {
    if (!twell_unsupported.empty()) return twell_unsupported;
    const TwellLayout& l = act.layout();
    return str("a call of ", M, " tokens would store ", M * values_per_row(l),
               " TwELL values, past the kernels' 32-bit indexing: at I = ", l.cols, " they take at most ",
               sparse_rows(), " tokens a call; split the batch");
  }

  // The FFN of forward() into y; with `then` (then.resid not null) the sparse path instead adds y
  // into the residual and normalises, and returns true (as it does for no tokens).
  bool compute(const TensorView& x, const FfnWeights& w, const TensorView& y, cudaStream_t stream, int64_t slot,
               const ResidualNormOut& then) {
    TWELL_REQUIRE(slot >= 0 && slot < options.dispatch_slots, "FfnForward::forward: dispatch slot ", slot,
                " out of range [0, ", options.dispatch_slots, ") (FfnOptions::dispatch_slots)");
    const int64_t M = x.shape[0], H = shape.hidden, I = shape.ffn;
    const auto* xp = static_cast<const uint16_t*>(x.data);
    auto* yp = static_cast<uint16_t*>(y.data);
    const bool then_overwrites_x = then.resid && then.normed == x.data;  // (SavedForward::x_overwritten)
    // One token: the one-kernel decode FFN reads the gate's weights and then only the active rows
    // of Wu and Wd, never more than the dense path reads (H200, H = 2048, I = 5632: 0.018 against
    // 0.031 ms at every density measured, 0.5% to 50%), so dispatch takes it whatever the density.
    const bool one_token = M == 1 && !decode.empty();
    // A non-gated FFN's multi-token kernels take h from the packed bf16 activation; only the
    // one-token kernel keeps relu(x·Wu) in fp32.
    TWELL_REQUIRE(shape.gated || options.precision != Precision::h_fp32 || M == 0 || one_token,
                "FfnForward: Precision::h_fp32 for a non-gated FFN exists only for one-token calls on the one-token "
                "kernel (FfnOptions::one_token_kernel, gather_max_tokens >= 1, not training, a shape it takes); got M = ",
                M,
                ", whose kernels would round h to bf16");
    // A shape the sparse kernels cannot take: refused here where the call must be sparse (dispatch
    // runs it dense below), before the object's state or the stream is touched.
    const bool sparse_ok = sparse_supported(M);
    TWELL_REQUIRE(M == 0 || sparse_ok ||
                    (options.dispatch != Dispatch::always_sparse && options.precision != Precision::h_fp32),
                "FfnForward: ", options.precision == Precision::h_fp32 ? "Precision::h_fp32" : "Dispatch::always_sparse",
                " needs a sparse path, but ", sparse_problem(M));
    // The previous call's density, if it has arrived (not asked under capture); if not, it is dropped
    // (its mirror is about to be overwritten).
    if (!check_capture(stream, M)) collect_counts(false);
    counts.pending = false;
    stats = FfnStats{};  // path none until one runs
    saved = SavedForward{};
    forward_base = base;
    stats.tokens = M;
    if (M == 0) return true;  // nothing to compute (and no density to sample)

    const bool fp32_h = options.precision == Precision::h_fp32;  // the dense path rounds h to bf16
    Dispatch policy = fp32_h ? Dispatch::always_sparse : options.dispatch;
    if (one_token && !options.training && (policy == Dispatch::observe || policy == Dispatch::previous))
      policy = Dispatch::always_sparse;
    // Too few tokens: the sparse path's extra launches dominate. A slot that has no density yet
    // samples one such call (no synchronisation), for its next call and observed_density(): once,
    // since the sample's three small launches cost ~10 µs, 5% of a call of 2048 tokens.
    const bool small = (policy == Dispatch::observe || policy == Dispatch::previous) && M < options.sparse_min_tokens;
    const Slot& sl = slots[static_cast<size_t>(slot)];
    const bool sample_small = small && sl.previous_density < 0 && !sl.sample.pending;
    if (small) policy = Dispatch::always_dense;
    if (!sparse_ok) policy = Dispatch::always_dense;
    const double& previous_density = sl.previous_density;  // collect_sample updates it
    if (policy == Dispatch::previous) collect_sample(slot, false);

    // The TwELL path known before the gate runs: the fused gate+pack kernel, no g.
    const bool sparse_known = policy == Dispatch::always_sparse ||
                              (policy == Dispatch::previous && previous_density >= 0 &&
                               previous_density < dense_above());
    if (sparse_known && one_token) {
      stats.path = FfnPath::gather;
      run_decode(xp, w, yp, stream);
      return false;
    }
    if (sparse_known && M > gather_tokens && fused_gate_supported(options)) {
      stats.path = FfnPath::sparse;
      if (policy == Dispatch::previous) stats.sampled_density = previous_density;
      run_sparse(M, xp, w, yp, then, stream, true, policy == Dispatch::previous ? slot : -1);
      saved = {true, x.data, w.wg.data, w.wu.data, w.wd.data, then_overwrites_x};
      return true;
    }

    // Otherwise both paths start from the ReLU'd gate in g (non-gated: h = relu(x Wuᵀ)).
    project(xp, shape.gated ? w.wg.data : w.wu.data, g.as<uint16_t>(), M, true, stream);
    if (policy == Dispatch::observe || (policy == Dispatch::previous && previous_density < 0)) {
      launch_sample(slot, M, stream);
      collect_sample(slot, true);  // one stream synchronisation
    } else if (policy == Dispatch::previous || sample_small) {
      // Read by the next call of this slot, no synchronisation now.
      launch_sample(slot, M, stream, sample_small ? kSmallSampleRows : kSampleRows);
    }
    FfnPath path = FfnPath::sparse;
    if (policy == Dispatch::always_dense) path = FfnPath::dense;
    if (policy == Dispatch::observe || policy == Dispatch::previous) {
      stats.sampled_density = previous_density;
      path = previous_density >= dense_above() ? FfnPath::dense : FfnPath::sparse;
    }
    if (path == FfnPath::sparse && M <= gather_tokens) path = FfnPath::gather;
    stats.path = path;
    if (path == FfnPath::gather) {
      run_gather(M, xp, w, yp, stream);
      return false;
    }
    if (path == FfnPath::sparse) {
      run_sparse(M, xp, w, yp, then, stream);
      saved = {true, x.data, w.wg.data, w.wu.data, w.wd.data, then_overwrites_x};
      return true;
    }

    if (shape.gated) {
      // Training keeps u for the backward and writes h apart; otherwise h replaces u.
      const bool keep = options.training;
      uint16_t* h = keep ? h_dense.as<uint16_t>() : u.as<uint16_t>();
      project(xp, w.wu.data, u.as<uint16_t>(), M, false, stream);
      launch_mul_bf16(g.as<uint16_t>(), u.as<uint16_t>(), h, M * I, stream);
      gemm.run(h, w.wd.data, yp, M, H, I, false, GemmEpilogue::none, stream);
      if (keep) saved = {true, x.data, w.wg.data, w.wu.data, w.wd.data};
    } else {
      gemm.run(g.get(), w.wd.data, yp, M, H, I, false, GemmEpilogue::none, stream);
    }
    return false;
  }
};

FfnForward::FfnForward(const FfnShape& shape, const FfnOptions& options)
    : impl_(std::make_unique<Impl>(shape, options)) {}
FfnForward::FfnForward(const FfnShape& shape, const FfnOptions& options, void* workspace, size_t workspace_bytes)
    : impl_([&] {
        TWELL_REQUIRE(workspace, "FfnForward: the workspace is null (the constructor without one allocates its own)");
        return std::make_unique<Impl>(shape, options, workspace, workspace_bytes);
      }()) {}

size_t FfnForward::required_workspace_bytes(const FfnShape& shape, const FfnOptions& options) {
  return Impl::plan(shape, Impl::with_tile(options, shape), device_info().sm_count).total();
}
void FfnForward::use_workspace(void* workspace, size_t workspace_bytes) { impl_->use_workspace(workspace, workspace_bytes); }
FfnForward::~FfnForward() = default;
FfnForward::FfnForward(FfnForward&&) noexcept = default;
FfnForward& FfnForward::operator=(FfnForward&&) noexcept = default;

void FfnForward::forward(const TensorView& x, const FfnWeights& w, const TensorView& y, cudaStream_t stream,
                         int64_t dispatch_slot, const ResidualNorm* then) {
  impl_->forward(x, w, y, stream, dispatch_slot, then);
}

void FfnForward::backward(const TensorView& x, const FfnWeights& w, const TensorView& dy, double l1_coeff,
                          const FfnGrads& grads, cudaStream_t stream) {
  impl_->backward(x, w, dy, l1_coeff, grads, stream);
}

FfnPath FfnForward::last_path() const { return impl_->stats.path; }

double FfnForward::observed_density(int64_t dispatch_slot) {
  TWELL_REQUIRE(dispatch_slot >= 0 && dispatch_slot < impl_->options.dispatch_slots, "FfnForward::observed_density: slot ",
              dispatch_slot, " outside [0, ", impl_->options.dispatch_slots, ")");
  impl_->collect_sample(dispatch_slot, true);
  return impl_->slots[static_cast<size_t>(dispatch_slot)].previous_density;
}

bool FfnForward::sparse_supported(int64_t tokens) const { return impl_->sparse_supported(tokens); }

size_t FfnForward::workspace_bytes() const { return impl_->forward_bytes + impl_->bwd.bytes(); }

FfnStats FfnForward::last_stats() const {
  impl_->collect_counts(true);
  return impl_->stats;
}

TwellMatrix FfnForward::download_activation(cudaStream_t stream) const {
  impl_->collect_counts(true);
  TWELL_REQUIRE(impl_->stats.path == FfnPath::sparse, "FfnForward: the last call took the ",
              to_string(impl_->stats.path), " path and packed nothing");
  TWELL_REQUIRE(impl_->base == impl_->forward_base, "FfnForward::download_activation: use_workspace() moved the "
                "workspace since the last forward(), whose matrix is in the old memory");
  TwellMatrix m = impl_->act.download(stream);
  const TwellLayout l{impl_->stats.tokens, impl_->shape.ffn, impl_->options.tile, impl_->options.compression};
  m.layout = l;
  m.counts.resize(l.count_size());
  m.slots.resize(l.slot_size());
  return m;
}

const FfnShape& FfnForward::shape() const { return impl_->shape; }
const FfnOptions& FfnForward::options() const { return impl_->options; }
bool FfnForward::capturable() const { return impl_->capturable(); }
bool FfnForward::capturable(int64_t tokens) const { return impl_->capturable(tokens); }

}  // namespace twell::cuda
