// Loading a model directory onto the backend that can run it: the GPU runtime (twell::cuda::LlamaCuda)
// where a Hopper GPU is present, takes the model and has the memory for it, else the CPU reference
// (LlamaCpu). What `twell run`, `twell eval`, the C interface and python/twell share.
//
//   twell::model::ModelLoadOptions o;            // device auto, twell FFN, weights scanned for NaN/Inf
//   o.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
//   std::unique_ptr<twell::model::LanguageModel> m = twell::model::load_model("models/smol", o);
//
// Library twell::runtime (src/runtime/load_model.cpp): it links the GPU library where twell is built
// with CUDA, so that one call picks the backend at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "twell/model/llama.h"
#include "twell/model/tokenizer.h"

namespace twell::model {

enum class DeviceChoice {
  automatic,  // the GPU where it runs the model (a Hopper GPU, a model its runtime takes, the memory for it)
  cpu,        // the CPU reference backend
  cuda,       // the GPU, or an error saying why not (never the CPU)
};

struct ModelLoadOptions {
  DeviceChoice device = DeviceChoice::automatic;
  // The GPU's FFN of ReLU models: false, twell's (sparse TwELL where it pays, dense where not); true,
  // the dense cuBLASLt FFN. Models whose FFN the twell path does not take run dense either way.
  bool dense_ffn = false;
  // CPU backend: round a ReLU FFN's g, u, h to bf16 as a bf16 model does (the GPU always does).
  bool bf16_ffn = false;
  // Refuse weights holding NaN or Inf (reads every element once more). Off, a NaN in a neuron's rows
  // that never activates goes unseen.
  bool check_finite = true;
  // What the GPU runtime allocates for: the positions a sequence holds, which is also the most tokens
  // one call takes (0: config.json's max_position_embeddings; larger is capped there), and whether
  // decode steps follow (false: logits() alone, no KV cache). The CPU backend always holds the
  // config's whole context.
  int64_t context = 0;
  bool kv_cache = true;
  // GPU: the most sequences one call takes (generate_batch, prefill_batch): the KV cache holds as many
  // contexts; with kv_cache, the activations are sized for one forward of max_batch · context
  // tokens up to cuda::kDefaultMaxTokens, and longer prefills run as several
  // (LlamaCudaOptions::max_tokens); without it, for all of them.
  // The CPU backend takes up to 65535.
  int64_t max_batch = 1;
  // GPU, where the model does not fit: halve max_batch until it does with what logits() adds and
  // kGpuHeadroomBytes free, down to 1; where one sequence a call without the KV cache has not that
  // room either, turn the cache on with max_tokens fitted as with it, so that a sequence runs in
  // chunks; logged (`twell eval`: windows a forward).
  bool shrink_to_fit = false;
  // GPU: the most tokens one forward computes, which the activations are sized for
  // (LlamaCudaOptions::max_tokens; at most max_batch contexts): with kv_cache, a longer prompt runs
  // in chunks of at most as many. 0: the runtime's default (with kv_cache, max_batch · context up to
  // cuda::kDefaultMaxTokens, lowered where the GPU's memory (or gpu_memory) holds the weights and
  // KV cache but not activations of that many tokens: fit_max_tokens, leaving kGpuHeadroomBytes and
  // what logits() adds free, logged; without it, max_batch contexts, or under shrink_to_fit the
  // KV cache on and the count fitted where they do not fit). At least max_batch: a decode
  // step takes one token a sequence.
  int64_t max_tokens = 0;
  // A cap on the GPU memory the model may take (weights, KV cache, activations, workspaces); 0: all
  // the GPU's free memory. Checked at load against what the runtime will allocate (LlamaCuda::
  // memory_needed) and the room to leave beside it (kGpuHeadroomBytes and what logits() adds); where
  // it needs more, `automatic` runs it on the CPU and `cuda` refuses it.
  size_t gpu_memory = 0;
  // Progress and notes, a line at a time without the newline ("loaded …", "backend: …", a warning
  // about unused tensors, why the CPU runs it under DeviceChoice::automatic). Empty: silent.
  std::function<void(const std::string&)> log;
  // How errors name the device choice, so that they read as the caller's own option: "--device cuda"
  // in the CLI, "device='cuda'" in Python.
  std::string cuda_choice_name = "device cuda";
  std::string cpu_choice_name = "device cpu";
  std::string bf16_choice_name = "bf16_ffn";                    // in the backend line's note on it
  std::string gpu_memory_choice_name = "gpu_memory";            // in a shortfall under that limit
  std::string max_tokens_choice_name = "max_tokens";            // in its errors and notes (empty: none to name)
  std::string context_hint = "a shorter context needs less";  // in parentheses after a GPU memory shortfall
  // Appended to the "backend: CPU reference" line where the CPU runs it (the CLI: that --ffn was given
  // and means nothing there).
  std::string cpu_backend_note;
};

// The model of `dir` (config.json, safetensors single or sharded) on the backend the options pick.
// Throws twell::Error naming the cause where the choice cannot be met (`cuda` without a Hopper GPU,
// a model the GPU runtime does not take, too little GPU memory: the figures), where under
// `automatic` neither the GPU nor the host's memory holds it, or where the checkpoint is bad.
std::unique_ptr<LanguageModel> load_model(const std::string& dir, const ModelLoadOptions& options = {});

// GPU memory load_model leaves free beside a model it puts on the GPU, whether it fits as asked or
// with max_tokens lowered (besides what logits() may add, LlamaCudaMemory::logits_growth): for
// cuDNN's attention workspace, the CUDA modules loaded at their first use, the allocator's rounding,
// which LlamaCuda::memory_needed does not count, and the FFN statistics' buffers of a call that asks
// for them (4 · I bytes a row of at most 2048 rows, 12 a row of a forward: ~46 MB for a 2B model).
constexpr size_t kGpuHeadroomBytes = size_t{256} << 20;

// The tokens a forward may take where `preferred` does not fit: the largest count in [least,
// preferred] for which `fits` holds, a multiple of 256 where one is at least `least`; `preferred`
// where it fits, 0 where not even `least` does. `fits` must not hold for more tokens where it
// fails for fewer (memory grows with the tokens). About log2(preferred) calls.
int64_t fit_max_tokens(int64_t least, int64_t preferred, const std::function<bool(int64_t)>& fits);

// Whether load_model would pick the GPU for `choice` before looking at a model (a Hopper GPU and a
// CUDA build): false for cpu; for cuda, throws with the reason where there is none. `why` receives
// the reason where it returns false under automatic.
bool gpu_chosen(DeviceChoice choice, std::string* why = nullptr, const std::string& cuda_choice_name = "device cuda");

// Throws unless every id of the tokenizer has a row in an embedding of `vocab_size` rows.
void check_tokenizer_fits(const Tokenizer& tok, int64_t vocab_size);

// The tokenizer of `dir` (tokenizer.json, tokenizer_config.json), or with `bytes` the byte
// tokenizer of our own small models (ids 0..255 bytes, BOS 256, EOS 257). Throws where its ids do not
// all fit the model's vocabulary of `vocab_size`, or where `dir` has no tokenizer (naming the byte
// tokenizer as the way for a model trained on bytes, in the words of `bytes_choice_name`).
std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& dir, int64_t vocab_size, bool bytes = false,
                                                const std::string& bytes_choice_name = "the byte tokenizer");

// The ids that end a generation by default: config.json's and generation_config.json's
// eos_token_id (Llama 3 Instruct ends a turn with any of three) and the tokenizer's EOS.
std::vector<int32_t> default_stop_ids(const io::ModelConfig& config, const Tokenizer& tok);

}  // namespace twell::model
