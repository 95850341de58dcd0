// ModelConfig: the HuggingFace Llama-style config.json of a checkpoint (DESIGN.md §6), read
// strictly (types checked, required keys named in errors) and written atomically.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace twell::io {

// RoPE frequency scaling, from config.json's "rope_scaling" (or, in newer transformers,
// "rope_parameters"). Two kinds are implemented, as HF's rotary embedding computes them:
//   linear: every inverse frequency divided by `factor` (positions stretched);
//   llama3: Llama 3.1's: low frequencies (wavelength > original_max_position_embeddings /
//           low_freq_factor) divided by `factor`, high ones (wavelength <
//           original_max_position_embeddings / high_freq_factor) kept, and the band between
//           interpolated. Neither scales the attention.
// Other kinds ("dynamic", "yarn", "longrope", ...) are refused by from_json.
struct RopeScaling {
  std::string type = "default";  // "default" (none), "linear" or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3
  int64_t original_max_position_embeddings = 0;  // llama3

  bool none() const { return type == "default"; }
  bool operator==(const RopeScaling& o) const {
    return type == o.type && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor && original_max_position_embeddings == o.original_max_position_embeddings;
  }
  bool operator!=(const RopeScaling& o) const { return !(*this == o); }
  // The inverse frequency of rotary pair i (of head_dim / 2) after scaling, `inv_freq` the
  // unscaled theta^(-2i / head_dim). In Acc arithmetic (float or double), as HF's float32
  // tensors compute it when Acc is float.
  template <class Acc>
  Acc scale(Acc inv_freq) const;
};

// The sampling keys of a model's generation_config.json (transformers' GenerationConfig; config.json's
// where there is none, as transformers falls back to it), as the file gives them: unset where absent
// or null. Their types and ranges are checked where they are used (model::with_generation_config
// completes a caller's options as transformers' generate() would, and throws for a bad value it takes),
// so that a model whose file has a bad one still loads, as in transformers.
struct GenerationDefaults {
  std::string source;  // the file they came from; empty where there was none
  std::optional<bool> do_sample;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  // Each key of the wrong type (left unset above) and what is wrong with it, said as read_config would.
  std::vector<std::pair<std::string, std::string>> errors;
  std::string unapplied;  // keys it sets that twell does not apply, with their values: "num_beams 4, ..."
  // Why the whole file could not be read (not JSON, not an object, a bad eos_token_id), said as
  // read_config would; empty where it was read. Such a file stops only what takes its values
  // (with_generation_config), not the model's loading: its eos_token_id is then not used.
  std::string unreadable;

  bool any() const {
    return do_sample || temperature || top_p || min_p || repetition_penalty || top_k || !errors.empty() ||
           !unreadable.empty();
  }
  // The error of `key` ("" where it has none).
  std::string error(const std::string& key) const {
    for (const auto& [k, what] : errors)
      if (k == key) return what;
    return "";
  }
};

struct ModelConfig {
  std::string model_type = "llama";    // "llama" or "mistral" (validate() refuses others)
  int64_t hidden_size = 0;              // H, required
  int64_t intermediate_size = 0;        // I, required
  int64_t num_hidden_layers = 0;        // required
  int64_t num_attention_heads = 0;      // required
  int64_t num_key_value_heads = 0;      // absent or null in the file: = num_attention_heads
  int64_t head_dim = 0;                 // absent or null in the file: hidden_size / heads
  int64_t vocab_size = 0;               // required
  int64_t max_position_embeddings = 0;  // required
  double rope_theta = 10000.0;          // also read from "rope_parameters": {"rope_theta": ..}
  RopeScaling rope_scaling;             // "rope_scaling" or "rope_parameters"; none by default
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";  // "relu" for the paper's sparse models
  std::string torch_dtype;          // e.g. "bfloat16"; also read from "dtype"; may be empty
  std::vector<int32_t> eos_token_ids;  // "eos_token_id": one id or a list; empty when absent
  GenerationDefaults generation;       // generation_config.json's sampling keys (read_config); not in to_json

  // Parses config.json text, fills the defaults above and validates; `source` names the file in
  // errors. Keys we do not use are ignored.
  static ModelConfig from_json(const std::string& text, const std::string& source = "config.json");
  // Pretty-printed JSON that HuggingFace's LlamaConfig (and from_json) read back.
  std::string to_json() const;
  // Throws "<source>: <what is wrong, expected vs actual>" on the first inconsistency.
  void validate(const std::string& source = "config") const;

  // The inverse frequency of rotary pair i, 0 <= i < head_dim / 2: rope_theta^(-2i / head_dim),
  // then rope_scaling. Both backends build their RoPE tables from it.
  template <class Acc>
  Acc rope_inv_freq(int64_t i) const {
    const Acc exponent = static_cast<Acc>(2 * i) / static_cast<Acc>(head_dim);
    return rope_scaling.scale(Acc(1) / std::pow(static_cast<Acc>(rope_theta), exponent));
  }
};

template <class Acc>
Acc RopeScaling::scale(Acc inv_freq) const {
  if (type == "linear") return inv_freq / static_cast<Acc>(factor);
  if (type != "llama3") return inv_freq;
  // HF's _compute_llama3_parameters, one element at a time, rounded as PyTorch rounds it: python
  // numbers meet the float32 tensor as float32, and `number / tensor` is the tensor's reciprocal
  // times the number (not one division: 1 ulp apart for many configs).
  const Acc kTwoPi = static_cast<Acc>(6.283185307179586);
  const double old_len = static_cast<double>(original_max_position_embeddings);
  const Acc low_wavelen = static_cast<Acc>(old_len / low_freq_factor);
  const Acc high_wavelen = static_cast<Acc>(old_len / high_freq_factor);
  const Acc f = static_cast<Acc>(factor);
  const Acc wavelen = (Acc(1) / inv_freq) * kTwoPi;  // 2π / inv_freq
  const Acc scaled = wavelen > low_wavelen ? inv_freq / f : inv_freq;
  if (wavelen < high_wavelen || wavelen > low_wavelen) return scaled;
  const Acc smooth = ((Acc(1) / wavelen) * static_cast<Acc>(old_len) - static_cast<Acc>(low_freq_factor)) /
                     static_cast<Acc>(high_freq_factor - low_freq_factor);  // (old_len / wavelen - lo) / (hi - lo)
  return (Acc(1) - smooth) * scaled / f + smooth * scaled;
}

// The config file a model path names: `path` itself, or `path`/config.json where it is a directory.
std::string config_file(const std::string& path);
// `path` is a config.json or a directory that holds one (and then also generation_config.json,
// whose eos_token_id is added to eos_token_ids and whose sampling keys fill `generation`; without
// one, config.json's sampling keys do).
ModelConfig read_config(const std::string& path);
// Throws unless `path` is a directory (a model's: config.json, safetensors, perhaps tokenizer.json),
// saying what it is instead: empty, a file, or nothing.
void check_model_directory(const std::string& path);
// Validates, then writes `path` (a file, or a directory to hold config.json) atomically.
void write_config(const std::string& path, const ModelConfig& config);

}  // namespace twell::io
