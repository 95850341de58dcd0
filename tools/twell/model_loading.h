// Shared by `twell run` and `twell eval`: a model directory's weights and tokenizer.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <string_view>

#include "twell/model/llama.h"
#include "twell/model/load.h"
#include "twell/model/tokenizer.h"

namespace twell::cli {

struct ModelArgs {
  std::string dir;
  bool byte_tokenizer = false;  // ids 0..255 are bytes, BOS 256, EOS 257 (our own small models)
  bool bf16_ffn = false;        // round the ReLU FFN like a bf16 model (default: fp32 math)
  bool force_check_finite = false;  // --check-finite: the default, and it wins over --no-check-finite
  bool skip_check_finite = false;   // --no-check-finite: weights are not scanned for NaN/Inf
  std::string device = "auto";  // cpu, cuda, auto (cuda when a Hopper GPU is present)
  std::string ffn = "twell";    // GPU FFN of ReLU models: twell (sparse when it pays) or dense
  size_t gpu_memory = 0;        // --gpu-memory: the most the model may take on the GPU (0: all free)
  // The options that mean something on the GPU only (--ffn, --gpu-memory, and what the command
  // adds: run's --max-batch-tokens, eval's --batch): where one was given, the CPU backend says it
  // does not use it.
  std::vector<const CLI::Option*> gpu_only_options;
  // What the GPU runtime allocates for (LlamaCudaOptions), set by the command from its job: the
  // positions a sequence holds, which are also the most tokens one call takes (0: the config's
  // max_position_embeddings, 131072 for Llama 3.1), and whether decode steps will follow.
  int64_t gpu_context = 0;
  bool gpu_kv_cache = true;
  int64_t gpu_max_batch = 1;  // sequences one call takes (run's prompts)
  int64_t gpu_max_tokens = 0;  // run's --max-batch-tokens: tokens a forward (0: the default, fitted to memory)
  bool gpu_shrink_to_fit = false;  // eval: fewer windows a forward where gpu_max_batch does not fit
  std::string max_tokens_option = "--max-batch-tokens";  // the command's option that sets it ("": none)

  void add_to(CLI::App* cmd);
  // model::load_model with these options; prints what it loads, and on which backend, on stderr.
  std::unique_ptr<model::LanguageModel> load_model() const;
  // Checked against the config's vocabulary; needs no weights, so commands load it first.
  std::unique_ptr<model::Tokenizer> load_tokenizer(const io::ModelConfig& c) const;
};

// A note on stderr where `text` (named by `what`: "the prompt", a file) stops being valid UTF-8: it
// is encoded byte for byte all the same, where HuggingFace's tokenizers would refuse it. False then.
bool note_if_not_utf8(const std::string& what, std::string_view text);
// Refuses a text that starts with a UTF-16 or UTF-32 byte-order mark (a file saved as "Unicode" on
// Windows): its bytes would be scored, or continued, as UTF-8 nonsense, not as its text.
void refuse_utf16_or_32(const std::string& what, std::string_view text);
// Refuses a text file's path that names a device (/dev/zero would be read until memory ran out); a pipe
// (`<(zcat text.gz)`) is read. (CLI11's ExistingFile refuses directories.)
void refuse_device(const std::string& path);

}  // namespace twell::cli
