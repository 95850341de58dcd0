// A tiny random Llama-style model in HF layout, written to disk as config.json +
// model.safetensors: shared by the model tests and the CLI tests.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/random.h"
#include "twell/io/config.h"
#include "twell/io/safetensors.h"

namespace twell::model {

// ---- a tiny random model in HF layout ----------------------------------------------------------
inline io::ModelConfig tiny_config(const std::string& act, bool tied) {
  io::ModelConfig c;
  c.hidden_size = 64;
  c.intermediate_size = 176;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 97;
  c.max_position_embeddings = 32;
  c.rope_theta = 1e5;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.hidden_act = act;
  c.torch_dtype = "float32";
  return c;
}

using HfTensors = std::map<std::string, Tensor>;  // HF names and layouts (down_proj [H, I])

inline HfTensors random_hf_tensors(const io::ModelConfig& c, uint64_t seed) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  HfTensors t;
  auto normal = [&](const std::string& name, Shape shape, double stddev) {
    t[name] = test::random_normal(DType::f32, std::move(shape), stddev, seed++);
  };
  auto norm = [&](const std::string& name) {
    Tensor w = test::random_normal(DType::f32, {H}, 0.2, seed++);
    for (int64_t i = 0; i < H; ++i) w.ptr<float>()[i] += 1.0f;
    t[name] = std::move(w);
  };
  normal("model.embed_tokens.weight", {V, H}, 1.0);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    norm(p + "input_layernorm.weight");
    normal(p + "self_attn.q_proj.weight", {q_dim, H}, 0.25);
    normal(p + "self_attn.k_proj.weight", {kv_dim, H}, 0.25);
    normal(p + "self_attn.v_proj.weight", {kv_dim, H}, 0.2);
    normal(p + "self_attn.o_proj.weight", {H, q_dim}, 0.2);
    norm(p + "post_attention_layernorm.weight");
    normal(p + "mlp.gate_proj.weight", {I, H}, 0.2);
    normal(p + "mlp.up_proj.weight", {I, H}, 0.2);
    normal(p + "mlp.down_proj.weight", {H, I}, 0.1);
  }
  norm("model.norm.weight");
  if (!c.tie_word_embeddings) normal("lm_head.weight", {V, H}, 0.2);
  return t;
}

inline void write_hf(const std::string& dir, const io::ModelConfig& c, const HfTensors& tensors) {
  std::filesystem::create_directories(dir);
  io::write_config(dir, c);
  std::vector<std::pair<std::string, TensorView>> list;
  for (const auto& [name, tensor] : tensors) list.emplace_back(name, tensor.view());
  io::write_safetensors(dir + "/model.safetensors", list);
}

}  // namespace twell::model
