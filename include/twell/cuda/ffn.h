// The FFN forward on the GPU: one entry point that runs the sparse TwELL path or the dense
// cuBLASLt path, whichever the observed activation density makes faster, and is exact either way.
//
//   twell::cuda::FfnForward ffn(twell::cuda::FfnShape{M, H, I});  // max_tokens, hidden, ffn
//   ffn.forward(x, weights, y, stream);      // x, y [M, H] bf16 on the device; weights [I, H]
//
// Activations whose neurons fire at very different rates (a trained model's) may run faster through
// SplitFfn (twell/cuda/split_ffn.h): the frequent neurons dense, the rest through this object.
//
// Sparse path: gate GEMM (cuBLASLt, ReLU fused) -> pack g into TwELL (hybrid: over-capacity
// tiles spill to a dense backup, nothing is dropped) -> up/down kernel over the active set only.
// A sparse call of at most gather_max_tokens tokens (decode) takes the gather path instead: the
// same gate GEMM, then per-token index lists and kernels that spread each token over many blocks;
// one token (M = 1) runs the whole FFN in one kernel, the gate GEMV included, whose blocks'
// partial sums a second small kernel adds (launch_decode_ffn; H a multiple of 32, at most 4096):
// with always_sparse, and with observe or previous (not in training) at any density, since it
// never reads more than the dense path.
// Dense path: the gate GEMM (ReLU in its epilogue), the up GEMM, the product kernel, the down GEMM
// (all cuBLASLt).
// Shapes: H and I multiples of 64, any M up to max_tokens. The TwELL kernels take H up to 4096
// and calls of fewer than 2^32 stored values, ceil(I / tile)·(tile + tile / compression) a token
// (~678K tokens at I = 5632, tile 256, compression 8); for a call past that, observe and previous run the dense
// path and always_sparse throws before anything is queued (sparse_supported says which).
// Everything is enqueued on the caller's stream. An FfnForward holds its workspace (its own, or
// memory the caller gives it: required_workspace_bytes), as a cuBLAS handle does: calls on one
// object must be ordered (one stream, or events between streams), and a host thread each at a time. Dispatch counts the non-zeros of a sample of up
// to 1024 rows of g (a few MB read). `Dispatch::observe` waits for that count (one stream
// synchronisation per call, except where the tokens alone decide: one token, or fewer than
// sparse_min_tokens); `previous` (the default) decides on the sample of the previous call
// and reads this call's sample on the next one, so only its first call synchronises. Calls below
// sparse_min_tokens run dense by their size, and sample (128 rows, no synchronisation) only while
// their slot has no density yet: under `previous` a later large call may then decide on that
// sample without synchronising (observed_density reads it). Both paths
// are exact (no value is ever dropped): dispatch only decides speed. Inside CUDA graph capture,
// forward() needs dispatch always_sparse or always_dense and count_nonzeros = false, or a call of
// one token on the one-token kernel (it throws otherwise; capturable(tokens) says which).
//
// Reproducibility. With a fixed path (Dispatch::always_sparse or always_dense) the same call gives
// the same bits, call after call and run after run of one build (the GPU tests check it). The paths
// add in different orders, so where dispatch switches paths an element may differ by a bf16
// rounding, and so may a call of Dispatch::previous made before any density was known (the
// cuBLASLt gate GEMM and a separate pack) from the later ones (the fused gate; see fused_gate). Every
// cuBLASLt GEMM of ~2 GFLOP or more is autotuned at the second call of each shape with the same
// weights, or its 256th where they move between calls (M included; calls before run the
// heuristics' choice, so a shape called once costs no tuning): it synchronises the
// stream once, times cuBLASLt's candidates whose bits equal its heuristics' first choice, and keeps
// the fastest for the process (per device, cuBLASLt workspace size and problem);
// TWELL_LT_AUTOTUNE=0 takes the heuristics' choice untimed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "twell/ffn.h"
#include "twell/formats/twell_format.h"

namespace twell::cuda {

// sparse: TwELL pack + up/down kernels; gather: few tokens, active rows read through a per-token
// index list (no packing); dense: cuBLASLt; none: no call yet, or a call with no tokens.
enum class FfnPath { sparse, gather, dense, none };
inline const char* to_string(FfnPath p) {
  switch (p) {
    case FfnPath::sparse: return "sparse";
    case FfnPath::gather: return "gather";
    case FfnPath::dense: return "dense";
    case FfnPath::none: return "none";
  }
  return "?";
}
enum class Dispatch { observe, previous, always_sparse, always_dense };

struct FfnShape {
  int64_t max_tokens = 0;  // M the workspace is sized for; any M <= max_tokens runs
  int64_t hidden = 0;      // H
  int64_t ffn = 0;         // I
  bool gated = true;
};

struct FfnOptions {
  Dispatch dispatch = Dispatch::previous;
  // The sparse path is used while mean non-zeros per token / I stays below this: the break-even
  // measured on an H200 at H = 2048, I = 5632 (docs/perf.md, "Dispatch"): forced sparse is
  // 0.87-0.94x dense at 1% and 1.47-1.55x at 2%, uniform and skewed, M = 16384 and 131072.
  double dense_above_density = 0.011;
  // Used instead of dense_above_density when FfnOptions::training is set: forward + backward
  // forced sparse is 0.87-0.95x dense at 1% and 1.55-1.73x at 2% (twelfth session, M = 16384 and
  // 131072, uniform and skewed), the same break-even as inference's.
  double training_dense_above_density = 0.011;
  // Below this many tokens (but one: see the head of this file) observe/previous take the dense
  // path: the sparse path's extra launches and skewed rows cost more than they save (H200,
  // H = 2048, I = 5632, 0.5%: at M = 4096 0.89× uniform but 1.04–1.07× skewed, and 1.04× in the
  // 2B model's prefill of 8 × 512 tokens; from M = 6144 below 1× in every case; docs/perf.md,
  // "Dispatch").
  int64_t sparse_min_tokens = 8192;
  // bf16, or h_fp32: h = g·u kept in fp32 inside the down kernel. h_fp32 always takes the sparse
  // path (the dense path's product kernel rounds h to bf16 for the down GEMM). A non-gated FFN has
  // h_fp32 only in one-token calls (the one-token kernel); forward() refuses more tokens.
  Precision precision = Precision::bf16;
  // TwELL layout. tile 0: default_ffn_tile(compression, training) (176 outside training, else 256);
  // options() gives the width chosen.
  int32_t tile = 0, compression = 8;
  // Sparse calls with at most this many tokens take the gather path (decode): each token's active
  // rows of Wu and Wd are read through an index list, the work spread over many blocks, where the
  // TwELL kernels give each token one block. 0: always TwELL. Ignored in training (the gather path
  // keeps nothing for backward()).
  int64_t gather_max_tokens = 256;
  // Copy the sparse path's non-zero count back to the host after each call (read by last_stats).
  // false: nothing is copied, so calls with dispatch always_sparse or always_dense are pure stream
  // work and can be captured in a CUDA graph; last_stats then has no counts (-1).
  bool count_nonzeros = true;
  // Training: keep what backward() needs on the dense path too (g, u and h apart: one more
  // [max_tokens, I] bf16 buffer), so the forward can dispatch on density and the backward follows
  // the path it took. Without it backward() needs the TwELL path (Dispatch::always_sparse). Calls
  // of few tokens then take the TwELL path too (gather_max_tokens is ignored).
  bool training = false;
  // Dispatch::previous keeps one density sample per slot, and forward() names the slot: a model
  // that runs all its layers through one FfnForward gives each layer a slot, so a layer is
  // dispatched on its own previous density, not on the layer before it.
  int64_t dispatch_slots = 1;
  // Sparse calls whose path is known before the gate runs (Dispatch::always_sparse, or previous
  // with an earlier density below the threshold) compute the gate with the fused gate GEMM + TwELL
  // pack (a CUTLASS Hopper GEMM whose epilogue packs; g is never written). Needs tile = 256 or 176.
  // false: the cuBLASLt gate GEMM writes g and a separate kernel packs it (the same entries for the
  // same g; the two GEMMs add in different orders, so a value may differ by one bf16 rounding and
  // one within rounding of 0 may be active in one and not the other).
  bool fused_gate = true;
  // One-token calls (M = 1: always_sparse, or observe/previous outside training; gather_max_tokens
  // >= 1) run the one-kernel decode FFN,
  // whose partial-sum buffers (~2 MB at H = 2048, I = 5632) this object then holds. false: the
  // gather path's kernels, no such buffers (for a caller that runs one-token FFNs itself, as the
  // model's decode step does).
  bool one_token_kernel = true;
  // The dense path of one token runs its gate (with the ReLU) and up products through twell's
  // GEMV (launch_decode_gemv) where the shape allows; false: cuBLASLt, as for more tokens (A/B).
  bool one_token_gemv = true;
  // true: calls of 2 to 32 tokens compute the gate (on every path; the dense path's up too) through
  // twell's few-token GEMM (launch_few_token_gemm: the weights streamed straight into tensor-core
  // operands; K a multiple of 64); false: cuBLASLt with its ReLU epilogue (A/B). The model sets it
  // from LlamaCudaOptions::few_token_gemm.
  bool few_token_gemm = true;
  // Both one-token kernels (one_token_gemv's and one_token_kernel's), and few_token_gemm's, start as
  // programmatic dependents of the kernel before them on the stream. true: they read their weights
  // while that kernel still runs, before waiting for it (the model's decode steps gain by it;
  // a lone forward() barely: within 0.3 µs in `twell bench ffn -M 1`), which is
  // right only if the work just before forward() on the stream does not write the weights: that
  // kernel's writes are certain to be visible only after the wait. For weights fixed while the
  // calls run, as a loaded model's are (LlamaCuda sets it). false: they wait first.
  bool early_weight_reads = false;
  // The backward's dW pass works in column slices of this many columns, one after another, so
  // that the slice's columns of x and dy stay in L2 (each row is read once per active neuron of
  // its token). 0: the widest of H, H/2, H/4, ... (not under 512) whose x and dy columns fit the
  // L2, or the narrowest of them where none does. Otherwise a multiple of 8 dividing H (tests set
  // narrow slices to cover them at small M).
  int64_t dw_slice_columns = 0;
  // cuBLASLt's workspace (the dense path's GEMMs, the backward's, and the gate GEMM where the fused
  // one does not run). null: the object allocates its own 64 MiB. Otherwise device memory of
  // cublaslt_workspace_bytes bytes, 256-byte aligned, apart from the forward's workspace, and valid
  // until all the work enqueued through the object has finished. As with cublasSetWorkspace, the
  // caller may share it with other work (other FfnForward objects, its own cuBLAS calls) that is
  // ordered with every call of this object: one stream, or events between streams (a LlamaCuda's
  // FFNs and its own GEMMs share one so). options() returns the pointer, so options copied from an
  // object share its workspace. A smaller one may give cuBLASLt other algorithms, and so other
  // last bits on the paths that run cuBLASLt (the unfused gate's bits decide the active set).
  void* cublaslt_workspace = nullptr;
  size_t cublaslt_workspace_bytes = 0;
};

// What forward() may do with y before it returns: a transformer block's residual add and the next
// RMSNorm (Llama's step after the FFN), residual[m] += bf16(y[m]) in f32, then normed[m] =
// bf16(weight · residual[m] / √(mean(residual[m]²) + eps)). The sparse path does it in its down
// pass, which holds each token's whole row of y, and then never writes y (the separate kernel's
// read and write of y and of the residual are saved); the other paths write y and run the step as
// a kernel of its own. Same results either way, but for the order in which the sum of squares is
// added. residual [M, H] f32, weight [H] bf16, normed [M, H] bf16, on the device, 16-byte
// aligned; normed may be x (read before it is written; not in training, whose backward reads x
// again; a backward after such a forward gives dx and dwd only), none of them may overlap y or each
// other. `before` (optional, bf16 [M, H]): an add to the residual the caller deferred to here, done
// first: residual[m] = (residual[m] + before[m]) + bf16(y[m]), the order, and so the bits, of
// adding it before the FFN (LlamaCuda defers the attention's output so, writing the f32 residual
// once a layer).
struct ResidualNorm {
  TensorView residual;
  TensorView weight;
  TensorView normed;
  float eps = 1e-5f;
  TensorView before;
};

struct FfnStats {
  FfnPath path = FfnPath::none;
  int64_t tokens = 0;
  int64_t nnz = -1;              // non-zeros of g, counted by the sparse path (-1 on the dense path)
  int64_t spilled_tiles = -1;
  double sampled_density = -1;   // the fraction of g dispatch decided on (-1 when it did not sample)
  // Mean non-zeros a token (not a fraction like sampled_density: divide by I for that); -1 when
  // not counted.
  double nnz_per_token() const { return tokens > 0 && nnz >= 0 ? double(nnz) / tokens : -1; }
};

// Device memory: about 3.4 · max_tokens · I · 2 bytes of workspace (the dense gate output, then
// either path's buffers in one region: the dense path's up output, or the TwELL arrays with a
// backup that holds every tile and u beside them, ~2.4 · I · 2 bytes a token): 5.0 GB at
// max_tokens = 131072, I = 5632 (required_workspace_bytes says it exactly, and the forward can run
// in the caller's memory instead), and 64 MiB for cuBLASLt's workspace (not counted by either;
// FfnOptions::cublaslt_workspace shares the caller's instead). FfnOptions::training keeps the
// dense path's h apart from u, in the same region (no more memory where the TwELL kernels take the
// shape, since u and h are smaller than the TwELL path's buffers). backward() takes its scratch (dg and
// du beside the format, ~4.5 · max_tokens · I bytes, and the dW pass's partial sums, up to ~100 MB at
// H = 2048; the dense path's ~8 · M · I) from the device's stream-ordered pool (StreamScratch,
// twell/cuda/runtime.h: shared by all objects, holding the largest call's need until
// release_scratch()), and keeps the transpose of the active set and the dW pass's plan (~24 bytes a
// non-zero, and the sort's temporary), which grow with the largest M and non-zero count seen so far:
// a call that needs more frees and reallocates them (cudaFree synchronises the device).
class FfnForward {
 public:
  FfnForward(const FfnShape& shape, const FfnOptions& options = {});
  // The same with the caller's workspace: device memory of at least
  // required_workspace_bytes(shape, options) bytes, 256-byte aligned (e.g. from a framework's caching
  // allocator), that nothing else uses, and that stays valid until all the work enqueued through the
  // object (forward and backward: it reads the forward's state) has finished. The constructor writes
  // nothing there; each call writes it on the call's stream, so the memory must be ready for use
  // on that stream. The forward's buffers are carved from it; the backward's transpose is still the
  // object's own. Objects that never run backward() may share one such workspace where their calls
  // are ordered (one stream, or streams joined by events): a call writes every buffer it reads there
  // first, and what it keeps (counts, density samples) goes to the object's own host memory within
  // the call; only download_activation() reads what a later call of another object overwrites.
  FfnForward(const FfnShape& shape, const FfnOptions& options, void* workspace, size_t workspace_bytes);
  // The forward's workspace for a shape and options on the current device (it depends on the SM
  // count), computed without allocating: what FfnForward(shape, options) allocates, and what the
  // constructor above needs. Throws, as the constructors do, for a shape or options they refuse.
  static size_t required_workspace_bytes(const FfnShape& shape, const FfnOptions& options = {});
  // Moves the forward's buffers to other memory, taken as the constructor above takes it (at least
  // required_workspace_bytes, 256-byte aligned, apart from cublaslt_workspace); the object's own, if
  // it had one, is freed (cudaFree: the device synchronises). Host work only: nothing is copied, the
  // next call writes what it reads there first. The last forward's state stays in the old memory: a
  // backward() (and download_activation()) needs a forward() since, or the move back to the caller's
  // memory it was in (it throws, saying so). The old memory must stay valid until the work queued on
  // it has finished; the same memory again changes nothing. With it a framework gives each training
  // forward memory that lives as long as its autograd graph (twell.FFN does), rather than the object
  // holding it between steps.
  void use_workspace(void* workspace, size_t workspace_bytes);
  ~FfnForward();
  FfnForward(FfnForward&&) noexcept;
  FfnForward& operator=(FfnForward&&) noexcept;

  // Checks shapes, dtypes (bf16), devices and 16-byte alignment; throws twell::Error naming the
  // argument. Then enqueues the FFN on `stream`. `dispatch_slot` < FfnOptions::dispatch_slots:
  // whose previous density Dispatch::previous decides on. With `then`, the residual add and
  // RMSNorm that follow (ResidualNorm); y is then scratch, left unwritten by the sparse path.
  void forward(const TensorView& x, const FfnWeights& w, const TensorView& y, cudaStream_t stream,
               int64_t dispatch_slot = 0, const ResidualNorm* then = nullptr);

  // The backward of the last forward() (training; a gated FFN, Precision::bf16), on the path that
  // forward took: over the active set from the state the TwELL path kept (the TwELL activation and
  // u), or, after the dense path with FfnOptions::training, by cuBLASLt GEMMs from g, u and h.
  // x and w must be those of that call; dy [M, H] bf16. Gradients in f32 on the device, written over what
  // they held (FfnGrads, twell/ffn.h; an empty view is not computed); the L1 penalty's gradient
  // l1_coeff·sign(h) is added to dh (l1_coefficient, twell/ffn.h). Exact at any density; the sparse path is bitwise
  // reproducible. The sparse path synchronises the stream once (the forward's non-zero count sizes
  // the transpose).
  void backward(const TensorView& x, const FfnWeights& w, const TensorView& dy, double l1_coeff,
                const FfnGrads& grads, cudaStream_t stream);

  // Statistics of the last call; waits for its non-zero count if the sparse path ran. Under graph
  // capture these describe the captured call, not later replays of the graph.
  FfnStats last_stats() const;
  // The path of the last call, without waiting for anything.
  FfnPath last_path() const;
  // Under Dispatch::previous or observe: the fraction of g's entries that were non-zero in the last
  // sample of `dispatch_slot`, waiting for it if it is still in flight; -1 where no call has sampled
  // it. Calls of at least sparse_min_tokens tokens sample every time; smaller ones (which run dense
  // all the same) only while the slot has no density yet. LlamaCuda decides its decode FFN path
  // from it.
  double observed_density(int64_t dispatch_slot = 0);
  // Whether a call of this many tokens has a sparse path: the gather path up to gather_max_tokens
  // where its kernels take the shape, the TwELL kernels otherwise. Where not, dispatch runs it
  // dense and Dispatch::always_sparse (or h_fp32) throws.
  bool sparse_supported(int64_t tokens) const;
  // Device memory this object holds: the forward's workspace (required_workspace_bytes, its own or the
  // caller's) and the backward's transpose, which grows with use (not the backward's scratch, which
  // is the pool's).
  size_t workspace_bytes() const;
  // The TwELL matrix of the last sparse call (device), for tests and inspection; throws if the
  // last call packed nothing. Copies on `stream` and synchronises it: pass the forward's stream
  // (or order the two), since with count_nonzeros = false nothing else waits for the pack.
  TwellMatrix download_activation(cudaStream_t stream) const;

  const FfnShape& shape() const;
  const FfnOptions& options() const;
  // Whether forward() may run under CUDA graph capture: dispatch always_sparse or always_dense and
  // count_nonzeros = false (nothing comes back to the host). With `tokens`, whether a call of that
  // many may: also one token on the one-token kernel (FfnOptions::one_token_kernel), which any
  // dispatch but always_dense runs and which reads nothing back.
  bool capturable() const;
  bool capturable(int64_t tokens) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell::cuda
