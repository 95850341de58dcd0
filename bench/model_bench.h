// `twell bench model`: whole-model prefill and decode on the GPU, dense FFN vs twell FFN, on a
// synthetic Llama-style model (shared/BENCHMARKS.md: records "model_prefill", "model_decode").
//
// The model: random weights at the chosen shape (default the paper's 2B: 38 layers, hidden 2048,
// FFN 5632, 32 heads, vocab 49152, ReLU gate, tied head). Sparse activations without a bias term:
// channel 0 of the residual stream is a constant (embedding column 0; o_proj and down_proj never
// write it), so after RMSNorm it acts as a per-token constant input, and column 0 of each gate
// matrix holds a per-neuron threshold calibrated layer by layer on a sample of tokens so that each
// neuron fires with probability `density` on other tokens. The records' non-zeros per token are
// those measured on the timed tokens (the prefill's, and decode's at batch 1).
//
// Correctness first: the GPU model (twell FFN forced sparse, and dense) against the CPU backend
// on the same weights for a short sequence; then the full-size prefill of the two GPU FFN modes
// against each other. A case that fails is reported, never timed.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "ffn_bench.h"

namespace twell::bench {

struct ModelBenchConfig {
  int64_t layers = 38, hidden = 2048, ffn = 5632, heads = 32, kv_heads = 32, vocab = 49152;
  int64_t batch = 64, seq = 2048;              // prefill: batch × seq tokens, from position 0
  std::vector<int64_t> decode_batches{1, 64};  // decode: sequences per step
  int64_t context = 512;                       // decode: prompt length before the timed steps
  int64_t steps = 32;                          // decode: timed steps
  double density = 0.005;                      // FFN activation density the gates are calibrated to
  int warmup = 2, iters = 20;                  // prefill timing: the median of 20
  int64_t check_tokens = 16;                   // CPU reference check: sequence length (≥ 2)
  bool prefill = true, decode = true;
  bool cuda_graphs = true;                     // decode and short turns: replay each call as a CUDA graph
  bool fused_qkv_rope = true;                  // prefill: QKV GEMM with RoPE in its epilogue (LlamaCudaOptions)
  bool fused_decode_ffn = true;                // decode, batch 1: the one-kernel FFN (LlamaCudaOptions)
  bool ffn_residual_norm = true;               // the add + RMSNorm after the FFN run by it (LlamaCudaOptions)
  bool deferred_residual_add = true;           // the attention's add in the norm after the FFN (LlamaCudaOptions)
  bool decode_gemv = true;                     // decode, batch 1: twell's GEMV for QKV and O (LlamaCudaOptions)
  bool few_token_gemm = true;                  // decode and turns of 2-32 tokens: twell's few-token GEMM (LlamaCudaOptions)
  int decode_attention_splits = 0;             // decode: key ranges a head in both models; 0: each model's own
  int decode_attention_warps = 0;              // decode: warps a block of the attention; 0: the kernel's choice
  int64_t gather_batches = 8;                  // decode: twell_gather records (the gather FFN) up to this batch
  int64_t ragged = 0;                          // ragged prefill: prompts of random lengths (64-511) a call; 0: none
  int64_t long_prompt = 0;                     // one prompt of this many tokens, in chunks and in one forward; 0: none
  std::vector<int64_t> turns;                  // a conversation's next turn: this many tokens after turn_context cached, each
  int64_t turn_context = 4096;                 // the turn's cached history (prefill_from keeps it)
  int32_t tile = 0;                            // the twell FFN's TwELL tile width (FfnOptions::tile; 0: its default)
  std::string attention = "auto";              // prefill attention: auto, cudnn or twell (PrefillAttention)
  std::string save_dir;                        // the calibrated model written here as an HF checkpoint; "": not
  uint64_t seed = 1;
  std::string command;
};

// Throws if no Hopper GPU is present or the build has no CUDA backend. Where `failure` is given, an
// error in a phase after some records were made stops the run there, its message in *failure, and
// returns those records (the CLI prints and writes them, then fails); without it, it throws.
std::vector<BenchRecord> run_model_bench(const ModelBenchConfig& cfg, std::ostream& progress,
                                         std::string* failure = nullptr);
void print_model_table(const std::vector<BenchRecord>& records, std::ostream& out);

}  // namespace twell::bench
