// ModelConfig: the HuggingFace Llama-style config.json of a checkpoint (DESIGN.md §6), read
// strictly (types checked, required keys named in errors) and written atomically.
#pragma once

#include <cstdint>
#include <string>

namespace twell::io {

struct ModelConfig {
  std::string model_type = "llama";
  int64_t hidden_size = 0;              // H, required
  int64_t intermediate_size = 0;        // I, required
  int64_t num_hidden_layers = 0;        // required
  int64_t num_attention_heads = 0;      // required
  int64_t num_key_value_heads = 0;      // absent or null in the file: = num_attention_heads
  int64_t head_dim = 0;                 // absent or null in the file: hidden_size / heads
  int64_t vocab_size = 0;               // required
  int64_t max_position_embeddings = 0;  // required
  double rope_theta = 10000.0;          // also read from "rope_parameters": {"rope_theta": ..}
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";  // "relu" for the paper's sparse models
  std::string torch_dtype;          // e.g. "bfloat16"; also read from "dtype"; may be empty

  // Parses config.json text, fills the defaults above and validates; `source` names the file in
  // errors. Keys we do not use are ignored.
  static ModelConfig from_json(const std::string& text, const std::string& source = "config.json");
  // Pretty-printed JSON that HuggingFace's LlamaConfig (and from_json) read back.
  std::string to_json() const;
  // Throws "<source>: <what is wrong, expected vs actual>" on the first inconsistency.
  void validate(const std::string& source = "config") const;
};

// `path` is a config.json or a directory that holds one.
ModelConfig read_config(const std::string& path);
// Validates, then writes `path` (a file, or a directory to hold config.json) atomically.
void write_config(const std::string& path, const ModelConfig& config);

}  // namespace twell::io
