// Launchers of twell's CUDA kernels (internal). Each checks what it supports, then launches on the
// given stream and checks the launch. Kernel files: src/cuda/kernels/<stem>.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "twell/cuda/twell_device.h"
#include "twell/error.h"
#include "twell/ffn.h"

namespace twell::cuda {

// Raises `kernel`'s dynamic shared memory limit to `bytes` (above the default 48 KB) on the current
// device when it is below; calls that need no more only look it up. Thread-safe. (runtime.cpp)
void allow_dynamic_smem(const void* kernel, int bytes);
// Lets `kernel` run in clusters of more than 8 blocks (Hopper takes 16) on the current device: a
// function attribute, set once per device. Thread-safe. (runtime.cpp)
void allow_non_portable_clusters(const void* kernel);
// The most blocks (at most `largest`, at least 1) a cluster of `kernel`, launched with `threads` threads a block
// and no dynamic shared memory, may have on the current device: 16 on a whole H100 or H200, fewer where a MIG
// slice or an MPS limit leaves a GPC fewer SMs. Asked once per kernel, device, threads, largest and whether
// allow_non_portable_clusters was called (again while every query fails); allow_non_portable_clusters first, for
// more than 8. Thread-safe. (runtime.cpp)
int max_cluster_blocks(const void* kernel, int threads, int largest);

// Non-zero totals are accumulated in kNnzCounters counters (blocks spread their atomics over
// them; one hot address would serialise ~10^5 atomics): the total is their sum.
constexpr int kNnzCounters = 64;

// twell_pack.cu: dense bf16 g [rows, cols] -> TwELL; adds the non-zero count to nnz_total[0..64)
// and sets *overflow if the backup ran out of room (never with the default, worst-case capacity).
// Optionally also per row: its non-zero count, and the list of heavy rows (more than
// kHeavyRowEntries non-zeros, in no particular order), which the sparse FFN kernels give a group
// of warps each (row_schedule in twell_rows.cuh). row_nnz and heavy_rows hold `rows` entries;
// *heavy_count must be zero at launch.
constexpr uint32_t kHeavyRowEntries = 128;
struct RowCounts {
  uint32_t* row_nnz = nullptr;  // null: none of these is written
  uint32_t* heavy_rows = nullptr;
  uint32_t* heavy_count = nullptr;
};
void check_twell_pack(const TwellLayout& layout);
void launch_twell_pack(const uint16_t* dense, const TwellDeviceView& m, unsigned long long* nnz_total,
                       unsigned int* overflow, const RowCounts& rows, int sm_count, cudaStream_t stream);
// gate_pack.cu: g = ReLU(x Wᵀ) (x [M, H], W [I, H], bf16) packed straight into TwELL by a CUTLASS
// Hopper GEMM whose epilogue does what launch_twell_pack does to a given g (the same entries,
// counts, backup, row counts, heavy-row list and non-zero total), without writing g. As for the
// pack, nnz_total[0..kNnzCounters), *act.n_backup and *rows.heavy_count must be zero at launch, and
// so must rows.row_nnz[0..M) (the epilogue adds each tile's count to it, and lists a row as heavy
// when its count crosses kHeavyRowEntries). Needs the TwELL tile width 256 or 176 (64 × 256 or
// 128 × 176 GEMM tiles: gate_pack_supports_tile), H and I multiples of 8, 16-byte aligned x and W.
// The workspace is gate_pack_workspace_bytes (CUTLASS's tile scheduler; may be 0). `dependent`:
// launched as a programmatic dependent of the kernel before it on the stream (its loads wait for
// that kernel; see launch_dependent in kernels/bulk_copy.cuh).
struct GatePackArgs {
  const uint16_t* x = nullptr;
  const uint16_t* w = nullptr;
  int64_t M = 0, H = 0, I = 0;
  TwellDeviceView act;  // layout rows = M, cols = I
  unsigned long long* nnz_total = nullptr;
  unsigned int* overflow = nullptr;
  RowCounts rows;
};
// The TwELL tile widths the fused gate+pack packs (its GEMM's N tile is one TwELL tile).
bool gate_pack_supports_tile(int64_t tile);
void check_gate_pack(const GatePackArgs& a);
size_t gate_pack_workspace_bytes(const GatePackArgs& a, int sm_count);
void launch_gate_pack(const GatePackArgs& a, void* workspace, size_t workspace_bytes, int sm_count,
                      cudaStream_t stream, bool dependent = false);
// Reports to pinned host memory: a copy of device words with one patched, and a sum of the
// non-zero counters, each made where its pointers are set. The first of the sparse FFN's passes
// makes them on the side (SparseFfnArgs::report), so that they cost no launch of their own between
// the gate and the passes; launch_report makes them alone.
struct PackReport {
  const uint32_t* copy_src = nullptr;  // copy_dst[i] = copy_src[i], i < copy_words, but
  uint32_t* copy_dst = nullptr;        // copy_dst[patch_at] = *patch where patch is set
  int copy_words = 0;
  const uint32_t* patch = nullptr;
  int patch_at = -1;
  const unsigned long long* sum_in = nullptr;  // *sum_out = sum_in[0] + ... + sum_in[sum_n - 1]
  int sum_n = 0;
  unsigned long long* sum_out = nullptr;
  TWELL_HD bool any() const { return copy_dst || sum_out; }
};
// Zeroes up to ZeroWords::kMax ranges of device words in one launch: the sparse path's counters
// and row counts before the gate GEMM (three memsets there cost ~10 µs of host time, which a
// single call shows as idle GPU). The kernel lets a programmatic dependent (the fused gate) start
// at once.
struct ZeroWords {
  static constexpr int kMax = 4;
  struct Range {
    uint32_t* ptr = nullptr;
    int64_t words = 0;
  } range[kMax];
  int n = 0;
  ZeroWords& add(void* ptr, int64_t words) {
    TWELL_CHECK(n < kMax, "zero_words: more than ", kMax, " ranges");
    range[n++] = {static_cast<uint32_t*>(ptr), words};
    return *this;
  }
};
void launch_zero_words(const ZeroWords& z, cudaStream_t stream);
// Makes `report` by one small kernel: the sparse path's counters or a dispatch sample into pinned
// host memory (copies in the stream left the GPU idle ~15 µs).
void launch_report(const PackReport& report, cudaStream_t stream);
// stream_hold.cu: holds `stream` until *release (pinned host memory) becomes non-zero, or for
// timeout_ns, after which it sets *timed_out (pinned) and lets the stream go on. A benchmark
// enqueues its timed call behind it, then releases it: the events then time the GPU's work alone.
void launch_hold_stream(const volatile uint32_t* release, uint32_t* timed_out, uint64_t timeout_ns,
                        cudaStream_t stream);
// Adds the non-zero count of n_sample rows spread evenly over g [rows, cols] to *out (dispatch's
// density estimate: a few MB read instead of the whole activation).
void launch_count_sampled_nonzeros(const uint16_t* g, int64_t rows, int64_t cols, int64_t n_sample,
                                   unsigned long long* out, cudaStream_t stream);

// A transformer block's next step after its FFN, done by the FFN's down pass in place of writing
// y (resid null: y is written): resid[m] = (resid[m] + before[m]) + bf16(y[m]) in f32 (before: an
// add deferred by the caller, launch_add_rmsnorm's; none where null), then normed[m] = bf16(w ·
// resid[m] / √(mean(resid[m]²) + eps)), as launch_add_rmsnorm computes them (its sum of squares in
// another order). resid [M, H] f32; before [M, H], w [H], normed [M, H] bf16, 16-byte aligned.
struct ResidualNormOut {
  float* resid = nullptr;
  const uint16_t* before = nullptr;
  const uint16_t* w = nullptr;
  uint16_t* normed = nullptr;
  float eps = 0.f;
};

// twell_ffn_sparse.cu: y = h Wd over the active set held by `act`. Gated: an up pass writes
// u = bf16(x Wuᵀ) for every active entry into `u_vals` (twell_u_size(act) values), then the down
// pass uses h = g ⊙ u. Non-gated: h = act. x, y [M, H]; wu, wd [I, H]; all bf16, row-major.
// With `then` (then.resid not null) the down pass adds y into the residual and normalises
// instead of writing y (normed may be x: the up pass has read it by then).
struct SparseFfnArgs {
  TwellDeviceView act;
  const uint16_t* x = nullptr;
  const uint16_t* wu = nullptr;
  const uint16_t* wd = nullptr;
  uint16_t* u_vals = nullptr;
  uint16_t* y = nullptr;
  uint32_t* row_counters = nullptr;  // 4 device words, the passes' work counters: zero at launch
  RowCounts rows;                    // from the pack (row_nnz null: no heavy-row scheduling)
  int64_t M = 0, H = 0, I = 0;
  bool gated = true;
  Precision precision = Precision::bf16;
  ResidualNormOut then;
  PackReport report;       // made by the first pass, once the pack is done
  // The first pass launched as a programmatic dependent of the kernel before it on the stream (the
  // fused gate). The down pass always is one of the up pass.
  bool dependent = false;
};
int64_t twell_u_size(const TwellDeviceView& act);
// Why the TwELL up/down kernels (and the sparse backward) cannot take an activation laid out as
// `act` with these H and I, or "" where they can: decided by the shape alone, before any launch.
std::string twell_ffn_sparse_unsupported(const TwellDeviceView& act, int64_t H, int64_t I);
void check_twell_ffn_sparse(const SparseFfnArgs& a);
// Persistent kernels: at most one block per SM (sm_count).
void launch_twell_ffn_sparse(const SparseFfnArgs& a, int sm_count, cudaStream_t stream);

// twell_ffn_backward.cu: the gated FFN's backward over the active set of the forward that filled
// `act` and `u_vals` (same x and weights): dg, du into dg_vals/du_vals (bf16, indexed like u_vals),
// dx [M, H] and dWg, dWu, dWd [I, H] in f32 (null: not computed). dy [M, H] bf16. The dW passes
// need the transpose workspace: col_count, col_start [I + 1], keys, vals, keys_sorted, vals_sorted
// [nnz] (nnz: the forward's non-zero count) and temp (twell_backward_temp_bytes).
struct SparseBackwardArgs {
  TwellDeviceView act;
  RowCounts rows;
  const uint16_t *x = nullptr, *dy = nullptr, *wg = nullptr, *wu = nullptr, *wd = nullptr, *u_vals = nullptr;
  uint16_t *dg_vals = nullptr, *du_vals = nullptr;
  float *dx = nullptr, *dwg = nullptr, *dwu = nullptr, *dwd = nullptr;
  uint32_t* row_counters = nullptr;  // 4 device words, zeroed here (unlike the forward's: the same words
                                     // were the forward's counters, so the backward resets them itself)
  // The transpose of the active set (twell_ffn_backward.cu): row_start [M + 1], col_start [I + 1],
  // keys and keys_sorted [nnz] (neurons), pairs and pairs_sorted [nnz] ((token << 32) | u index).
  uint32_t *row_start = nullptr, *col_start = nullptr, *keys = nullptr, *keys_sorted = nullptr;
  uint64_t *pairs = nullptr, *pairs_sorted = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
  // The dW pass's plan (twell_dw_plan_words) and the partial sums of neurons split over several
  // blocks (twell_dw_scratch_bytes).
  uint32_t* dw_plan = nullptr;
  float* dw_scratch = nullptr;
  int64_t nnz = 0, M = 0, H = 0, I = 0;
  float l1 = 0.f;
  int64_t dw_slice = 0;  // the dW pass's columns a slice (twell_dw_slice_columns); 0: H
  // Optional: a second stream for the transpose and the dW plan, which need only the forward's
  // format and so run beside the up, down, dh and dx passes. `packed`: recorded on the caller's
  // stream once the format is complete (after the forward's pack); `join`: recorded here on
  // `side`, waited for before the dW pass. Without `side` everything runs on the caller's stream.
  cudaStream_t side = nullptr;
  cudaEvent_t packed = nullptr, join = nullptr;
};
size_t twell_backward_temp_bytes(int64_t nnz, int64_t M, int64_t I);
// The dW pass cuts each neuron's token list into pieces of at most twell_dw_piece_tokens(nnz)
// tokens, a block each per column slice; the partial sums of a neuron with several pieces meet in
// the scratch and are added in piece order (deterministic). Sizes of the plan (uint32 words) and
// the scratch (bytes).
int64_t twell_dw_piece_tokens(int64_t nnz);
size_t twell_dw_plan_words(int64_t nnz, int64_t I);
size_t twell_dw_scratch_bytes(int64_t nnz, int64_t H);
// The dW pass's slice width for M tokens (FfnOptions::dw_slice_columns = 0): the widest of H,
// H/2, ... not under 512 columns whose x and dy columns (4·M bytes a column) fit `l2_bytes`;
// where none fits, the narrowest of them (H itself when H < 1024 or H / 2 is not a multiple of 8).
int64_t twell_dw_slice_columns(int64_t M, int64_t H, size_t l2_bytes);
void launch_twell_ffn_backward(const SparseBackwardArgs& a, int sm_count, cudaStream_t stream);

// ffn_gather.cu: the sparse FFN for a few tokens without TwELL packing, after the gate GEMM (one
// kernel, and a reduce kernel when a token is split over several ranges). g [M, I] is the ReLU'd
// gate (non-gated: h itself); y [M, H] bf16. Workspace: partial S·M·H f32 with S = gather_splits(M)
// where S > 1 (none where S = 1: the one range writes y).
struct GatherArgs {
  const uint16_t* g = nullptr;
  const uint16_t* x = nullptr;
  const uint16_t* wu = nullptr;
  const uint16_t* wd = nullptr;
  float* partial = nullptr;
  uint16_t* y = nullptr;
  int64_t M = 0, H = 0, I = 0;
  bool gated = true;
  bool h_fp32 = false;
};
int gather_splits(int64_t M);
bool gather_supports(int64_t H, int64_t I);
void launch_ffn_gather(const GatherArgs& a, cudaStream_t stream);

// One token's FFN output kept as partial sums: y = bf16(Σ parts[b] over the b < count with
// flags[b] != 0; fp32, in an order fixed by the flags: deterministic). launch_add_rmsnorm takes it
// as its delta, launch_split_sum writes y; both spread the columns over 8 blocks (split_sum.cuh)
// and need H a multiple of 32, at most 8192.
struct SplitSum {
  const float* parts = nullptr;     // [count, H]
  const uint32_t* flags = nullptr;  // [count]
  int count = 0;
};
// ffn_gather.cu: the sparse FFN of one token (decode) in one kernel, the gate GEMV included: block
// b owns rows [b·R, b·R + R) of the gate matrix, which the TMA engine copies into shared memory
// before the previous kernel has finished (launched with programmatic dependent launch); then
// g = bf16(relu(x·Wg_j)), and for the active rows h = bf16(g · bf16(x·Wu_j)) (non-gated: the
// format's h from x·Wu_j) and the block's Σ h·Wd_j go to parts[b] (flags[b] = 1; 0 when the block
// has no active row). Rounded as cpu::ffn_forward's pipeline; deterministic. H a multiple of 32,
// at most 4096, I a multiple of 8, 16-byte aligned pointers (decode_ffn_supported). With
// early_weight_reads the gate rows are copied before the kernel waits for its predecessor on the
// stream, which must then not write them.
struct DecodeFfnArgs {
  const uint16_t* x = nullptr;      // [H]
  const uint16_t* w_act = nullptr;  // [I, H]: the matrix whose ReLU output is the active set (Wg; non-gated: Wu)
  const uint16_t* wu = nullptr;     // [I, H] (gated only)
  const uint16_t* wd = nullptr;     // [I, H]
  float* parts = nullptr;           // [decode_ffn_blocks, H]
  uint32_t* flags = nullptr;        // [decode_ffn_blocks]
  int64_t H = 0, I = 0;
  bool gated = true;
  bool h_fp32 = false;
  bool early_weight_reads = false;  // FfnOptions::early_weight_reads
};
bool decode_ffn_supported(int64_t H, int64_t I);
int decode_ffn_blocks(int64_t H, int64_t I, int sm_count);
void launch_decode_ffn(const DecodeFfnArgs& a, int sm_count, cudaStream_t stream);
// The decode FFN with its partial-sum buffers, for the callers that run it (FfnForward's
// one-token path, LlamaCuda's decode steps). Default-constructed: empty (shape not supported).
class DecodeFfn {
 public:
  DecodeFfn() = default;
  // H, I: decode_ffn_supported. The buffers from `arena` where given (bytes_for(H, I, sm_count)).
  DecodeFfn(int64_t H, int64_t I, int sm_count, DeviceArena* arena = nullptr);
  static size_t bytes_for(int64_t H, int64_t I, int sm_count);
  bool empty() const { return blocks_ == 0; }
  // launch_decode_ffn on x [H] bf16 with w's rows; returns output().
  SplitSum run(const uint16_t* x, const FfnWeights& w, bool h_fp32, bool early_weight_reads, cudaStream_t stream);
  SplitSum output() const { return SplitSum{parts_.as<float>(), flags_.as<uint32_t>(), blocks_}; }
  // bytes_for(H, I, sm_count): each buffer counted as an arena's piece, allocated there or not.
  size_t bytes() const { return DeviceArena::piece(parts_.bytes()) + DeviceArena::piece(flags_.bytes()); }

 private:
  int64_t H_ = 0, I_ = 0;
  int sm_count_ = 0, blocks_ = 0;
  DeviceBuffer parts_, flags_;
};
// y [H] bf16 = the split sum (launched with programmatic dependent launch).
void launch_split_sum(const SplitSum& s, int64_t H, uint16_t* y, cudaStream_t stream);

// decode_gemv.cu: y [N] = x [K] Wᵀ (W [N, K] row-major), bf16, fp32 accumulation, for one token.
// Launched with programmatic dependent launch; with early_weight_reads W's rows are copied into
// shared memory before the kernel waits for its predecessor on the stream (which must then not
// write W); x is read after.
// K a multiple of 8, at most 4096; x and W 16-byte aligned.
struct DecodeGemvArgs {
  const uint16_t* x = nullptr;
  const uint16_t* w = nullptr;
  uint16_t* y = nullptr;
  float* y_f32 = nullptr;  // set (y null): y in f32 there instead (the LM head's logits)
  int64_t N = 0, K = 0;
  bool relu = false;  // y = bf16(relu(x Wᵀ)), as cuBLASLt's ReLU epilogue
  bool early_weight_reads = false;  // FfnOptions::early_weight_reads
};
bool decode_gemv_supported(int64_t N, int64_t K);
void launch_decode_gemv(const DecodeGemvArgs& a, int sm_count, cudaStream_t stream);

// few_token_gemm.cu: y [M, N] = x [M, K] Wᵀ for 1 ≤ M ≤ kFewTokenGemmMaxTokens (decode steps of a few
// sequences, short prefills), bf16, fp32 accumulation, K a multiple of 64, x and W 16-byte aligned,
// rows dense (x's K apart, y's N apart), y not overlapping x. Launched as the decode GEMV is
// (programmatic dependent launch; with early_weight_reads its first weight loads start before the
// previous kernel ends).
constexpr int64_t kFewTokenGemmMaxTokens = 32;
// Rows of the model's LM head (f32 logits) up to which it runs through the decode GEMV (one) and
// this GEMM (2 to 8); cuBLASLt above, where it is the faster (docs/perf.md, sixty-third session).
constexpr int64_t kTwellHeadMaxRows = 8;
struct FewTokenGemmArgs {
  const uint16_t* x = nullptr;
  const uint16_t* w = nullptr;
  uint16_t* y = nullptr;
  float* y_f32 = nullptr;  // set (y null): y in f32 there instead (the LM head's logits)
  int64_t M = 0, N = 0, K = 0;
  bool relu = false;  // y = bf16(relu(x Wᵀ)), NaN kept
  bool early_weight_reads = false;
  int rows_per_block = 0;  // 16 or 32 rows of W a block; 0: 16, the faster (32: the micro-benchmark's A/B)
};
bool few_token_gemm_supported(int64_t M, int64_t N, int64_t K);
void launch_few_token_gemm(const FewTokenGemmArgs& a, int sm_count, cudaStream_t stream);

// elementwise.cu (dense paths), n elements, 16-byte aligned, n % 8 == 0:
//   out = bf16(g · u), +0 where g = ±0 (g already ReLU'd; out may be u)
//   g   = relu(g) in place       (the unfused, PyTorch-style pipeline)
void launch_mul_bf16(const uint16_t* g, const uint16_t* u, uint16_t* out, int64_t n, cudaStream_t stream);
// Reads `bytes` (a multiple of 16, 16-byte aligned) of p and writes nothing unless it holds one
// pattern: a benchmark's L2 flush that leaves only clean lines behind.
void launch_read_through(const void* p, size_t bytes, uint32_t* sink, cudaStream_t stream);
void launch_relu_bf16(uint16_t* g, int64_t n, cudaStream_t stream);
// Adds to *count the number of 16-bit words in which a and b (`bytes` each, even, 16-byte aligned)
// differ: a bitwise comparison of two outputs on the device.
void launch_count_differences(const void* a, const void* b, size_t bytes, uint32_t* count, cudaStream_t stream);
// The dense FFN backward's element-wise step: from g (ReLU'd), u [M, I] bf16 and dh32 = dy Wdᵀ
// [M, I] f32, writes dg and du (bf16, rows `ld` elements apart; zero where g is), rounded as
// cpu::ffn_backward's bf16 pipeline does (dh = bf16(dh32 + l1·sign(h))).
void launch_dense_grad(const uint16_t* g, const uint16_t* u, const float* dh32, float l1, uint16_t* dg, uint16_t* du,
                       int64_t ld, int64_t M, int64_t I, cudaStream_t stream);

// ---- model runtime (llama_layers.cu, attention.cu) ----------------------------------------------
// nll[r] = −log softmax(logits[r, :])[targets[r]] for r < rows, in double (logits [rows, V] f32,
// targets in [0, V): not checked), as model::nll_from_logits on the host.
void launch_row_nll(const float* logits, int64_t rows, int64_t V, const int32_t* targets, double* nll,
                    cudaStream_t stream);
// nnz[r] = the entries of row r of h [rows, cols] bf16 that are not zero (−0 is zero, NaN is not),
// l1[r] = Σ |h[r, :]| in double: cpu::ffn_forward's ActivationStats per token, reduced in a fixed
// order.
void launch_row_activation_stats(const uint16_t* h, int64_t rows, int64_t cols, int32_t* nnz, double* l1,
                                 cudaStream_t stream);
// x[t, :] = float(table[tokens[t], :])          x [T, H] fp32, table [V, H] bf16
void launch_embed(const int32_t* tokens, int64_t T, const uint16_t* table, float* x, int64_t H, cudaStream_t stream);
// dst[r, :] = src[rows[r], :] for r < n: bf16 rows of H elements (a multiple of 8; 16-byte aligned
// rows), rows on the device.
void launch_gather_rows(const uint16_t* src, const int32_t* rows, int64_t n, int64_t H, uint16_t* dst,
                        cudaStream_t stream);
// For output row r < rows, with s = r·step + offset: v = (x[s] + before[s]) + delta[s] in f32 (each
// add where its operand is not null), stored back into x[s] where `store_x` (and there was an add),
// then out[r] = bf16(w · v / √(mean(v²) + eps)). `before` is an add its caller deferred from the
// norm before (that norm called with store_x false): the sum then has the order, and the bits, it
// had with x stored in between, and x [T, H] f32 is written once instead of twice. x fp32 [*, H];
// before, delta, out, w bf16; H a multiple of 8, at most kMaxNormWidth. `dependent`: launched with
// programmatic dependent launch (the norm weights are loaded before it waits for the kernel before
// it, which must not write them; worth it only after a kernel that lets its dependents start early,
// as launch_decode_gemv does).
constexpr int64_t kMaxNormWidth = 16384;
void launch_add_rmsnorm(float* x, const uint16_t* before, const uint16_t* delta, bool store_x, const uint16_t* w,
                        uint16_t* out, int64_t rows, int64_t H, int64_t step, int64_t offset, float eps,
                        cudaStream_t stream, bool dependent = false);
// The same for one row whose delta is a split sum (launch_decode_ffn's output), added as
// bf16(Σ parts): x[0] += delta, out[0] = the norm (launched with programmatic dependent launch, the
// norm weights read before the wait: the kernel before must not write them).
void launch_add_rmsnorm(float* x, const SplitSum& delta, const uint16_t* w, uint16_t* out, int64_t H, float eps,
                        cudaStream_t stream);

// RoPE ("rotate_half", fp32 math) on q in place in the QKV GEMM output and on k; k and v are
// written to the caches at positions p0[b] + s of sequence b. T = B·S tokens, sequence-major.
struct RopeKvArgs {
  uint16_t* qkv = nullptr;          // [T, (nh + 2 nkv)·hd]: q, k, v of each token
  uint16_t* k_cache = nullptr;      // [B, max_context, nkv·hd]
  uint16_t* v_cache = nullptr;
  const float* cos_sin = nullptr;   // [max_context, hd]: cos of the hd/2 frequencies, then sin
  const int32_t* p0 = nullptr;      // device [B]: position of each sequence's first new token
  int64_t T = 0, S = 0, max_context = 0;
  int nh = 0, nkv = 0, hd = 0;
};
void launch_rope_kv(const RopeKvArgs& a, cudaStream_t stream);

// qkv_rope.cu: the QKV GEMM x Wqkvᵀ (x [T, H], Wqkv [(nh + 2 nkv)·hd, H], bf16) with
// launch_rope_kv's work fused into its epilogue (CUTLASS Hopper GEMM): q rotated into rope.qkv,
// k rotated and v into the caches, with the rounding steps of the cuBLASLt GEMM followed by
// launch_rope_kv (bf16 product, fp32 rotation, bf16), so the two agree up to the GEMMs' summation
// order (rope.qkv's k and v columns are not written). Every sequence starts at p0[0]: the
// epilogue reads one position (LlamaCuda fuses only calls whose sequences are aligned).
// qkv_rope_supported says which shapes it takes; the workspace is qkv_rope_workspace_bytes (may be 0).
struct QkvRopeArgs {
  const uint16_t* x = nullptr;
  const uint16_t* w = nullptr;
  int64_t H = 0;
  RopeKvArgs rope;
};
bool qkv_rope_supported(int64_t H, int nh, int nkv, int hd, std::string* why = nullptr);
size_t qkv_rope_workspace_bytes(const QkvRopeArgs& a, int sm_count);
void launch_qkv_rope(const QkvRopeArgs& a, void* workspace, size_t workspace_bytes, int sm_count,
                     cudaStream_t stream);

// out = bf16(bf16(silu(g)) · u), n elements (the dense SiLU FFN of plain Llama checkpoints).
void launch_silu_mul(const uint16_t* g, const uint16_t* u, uint16_t* out, int64_t n, cudaStream_t stream);

// Counter-based uniform [lo, hi) bf16 fill of a [rows, cols] matrix with row stride ld: the values
// depend only on (seed, row·cols + col). For synthetic models (bench).
void fill_uniform_bf16(uint16_t* out, int64_t rows, int64_t cols, int64_t ld, float lo, float hi, uint64_t seed,
                       cudaStream_t stream);

// Causal GQA attention of S new tokens per sequence, sequence b's at positions p0[b] .. p0[b] + S − 1,
// over the cache, which already holds them (launch_rope_kv). Query head h reads KV head h / (nh / nkv).
struct AttentionArgs {
  const uint16_t* qkv = nullptr;      // q at [b·S + s, h·hd], row stride (nh + 2 nkv)·hd
  const uint16_t* k_cache = nullptr;  // [B, max_context, nkv·hd]
  const uint16_t* v_cache = nullptr;
  uint16_t* o = nullptr;              // [B·S, nh·hd]
  const int32_t* p0 = nullptr;        // device [B]
  int B = 0, S = 0, nh = 0, nkv = 0, hd = 0, max_context = 0;
  float scale = 1.f;                  // 1/√hd
  // launch_attention: the blocks of a cluster that split each block of query rows' keys among them
  // (1 to kMaxKeySplits; capped at the cluster the device can run), for calls of too few query rows
  // to fill the GPU over many keys (prefill_attention_splits).
  int key_splits = 1;
  // The 4 warps of a block share its 16·MT query rows (32; 16 at head_dim 128) and each takes 16 keys
  // of every 64-key tile, where by default each owns 16·MT of the block's 64·MT rows over all the keys:
  // for calls of few query rows, which would leave most of a 128-row block's warps past S
  // (plan_prefill_attention).
  bool warps_split_keys = false;
};
void check_attention(int64_t head_dim);  // throws unless hd ∈ {16, 32, 64, 128}
constexpr int kMaxKeySplits = 8;
// The flash kernel, any S ≥ 1.
void launch_attention(const AttentionArgs& a, cudaStream_t stream);
// key_splits for a call of B sequences of S new tokens over `keys` keys each (their last position
// + 1): enough blocks for one an SM, each range at least 4 tiles of 64 keys; 1 where the rows' blocks
// alone fill the GPU.
int prefill_attention_splits(int64_t B, int64_t S, int64_t nh, int64_t hd, int64_t keys, int sm_count,
                             bool warps_split_keys = false);
// Calls of at most this many new tokens a sequence take warps_split_keys (plan_prefill_attention).
constexpr int64_t kWarpsSplitKeysMaxRows = 64;
// Sets a's warps_split_keys (S ≤ kWarpsSplitKeysMaxRows) and key_splits (prefill_attention_splits) for
// a call whose sequences all end at `keys` keys (their last position + 1; 0 where they end at
// different positions: no key splits).
void plan_prefill_attention(AttentionArgs& a, int64_t keys, int sm_count);
// A decode step (S = 1): launch_rope_kv's work and the attention in one kernel, on the same buffers
// (`r` and `a` describe the same step). q is rotated in registers: the QKV buffer is left as it
// is; the new key and value are written into the caches at p0. Any context up to max_context.
// `dependent`: launched with programmatic dependent launch, after a kernel that lets its
// dependents start early (the one-token GEMV of the QKV projection). The kernel then runs while
// that one does (and, as every kernel of the chain triggers at its start, while kernels further
// back may still run), and reads p0, the RoPE table and the cached keys and values before p0
// before waiting for it: none of those may be written by a kernel still running when it starts.
// In LlamaCuda that holds because each layer has its own cache, whose rows before p0 earlier
// calls wrote, and p0 is copied from the host before each call's first (non-dependent) kernel.
// `splits`: key ranges a head (blocks of a cluster, 1 to kMaxDecodeAttentionSplits); 0:
// decode_attention_splits' choice. Either is capped at the cluster the device can run (max_cluster_blocks).
// `warps`: warps a block (1, 2 or 4), each over its share of the range's keys; 0: 2 where that
// keeps every block of the grid resident at once on sm_count SMs and 4 would not, else 4.
constexpr int kMaxDecodeAttentionSplits = 16;
// The `warps` launch_decode_attention takes: 0 (its choice), 1, 2 or 4.
constexpr bool valid_decode_attention_warps(int warps) {
  return warps == 0 || warps == 1 || warps == 2 || warps == 4;
}
void launch_decode_attention(const RopeKvArgs& r, const AttentionArgs& a, int sm_count, cudaStream_t stream,
                             bool dependent = false, int splits = 0, int warps = 0);
// The decode attention's key ranges a head by default: about four blocks an SM at this batch,
// ranges of at least 32 keys at the longest context, at most 16.
int decode_attention_splits(int64_t max_context, int64_t B, int64_t nh, int sm_count);

// sample.cu: one token a row of logits [rows, ld] f32 (the first n of each row), drawn with
// model::Sampler's rules from a number in [0, 1) a row (unused when greedy): inline_uniforms[row]
// for up to kSampleInlineRows rows (no copy to make), else uniforms[row]. weights: n u64 a row of
// workspace. Each row's result goes to results[row]: the token, or why there is none.
constexpr int64_t kSampleInlineRows = 16;
enum SampleStatus : int32_t { kSampleOk = 0, kSampleBadLogit = 1, kSampleAllRuledOut = 2, kSampleNoConvergence = 3 };
struct SampleResult {
  int32_t token;   // -1 unless status is kSampleOk
  int32_t status;  // SampleStatus
  int64_t index;   // kSampleBadLogit: the first NaN or +inf logit, whose value is `value`;
                   // kSampleNoConvergence: the step that failed (for the error message)
  float value;
};
struct SampleArgs {
  const float* logits = nullptr;
  int64_t ld = 0, n = 0;
  double temperature = 0;  // 0: greedy
  int64_t top_k = 0;       // 0: all
  double top_p = 1;        // 1: all
  double min_p = 0;        // 0: all
  double inline_uniforms[kSampleInlineRows] = {};
  const double* uniforms = nullptr;
  unsigned long long* weights = nullptr;
  SampleResult* results = nullptr;
};
void launch_sample(const SampleArgs& a, int64_t rows, cudaStream_t stream);
// The repetition penalty (model::SamplingOptions::repetition_penalty) on `rows` rows of `n` logits each,
// in place: row r's ids ids[offsets[r] .. offsets[r + 1]) (each once, below n) divided by the penalty
// where positive, multiplied where negative, in f32. offsets and ids may be pinned host memory.
void launch_repetition_penalty(float* out, int64_t n, int64_t rows, const int64_t* offsets, const int32_t* ids,
                               float penalty, cudaStream_t stream);
// Whether launch_sample's kernel (a cluster of 8 blocks of 512 threads a row) can run on the
// current device: a MIG instance or an MPS limit may leave too few SMs together. If not, `why`.
bool sample_kernel_runs(std::string* why = nullptr);

}  // namespace twell::cuda
