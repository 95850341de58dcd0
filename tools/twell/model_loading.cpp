#include "model_loading.h"

#include <chrono>
#include <cstdio>

namespace twell::cli {

void ModelArgs::add_to(CLI::App* cmd) {
  cmd->add_option("model", dir, "model directory: config.json, safetensors (single or sharded), tokenizer.json")
      ->required();
  cmd->add_flag("--byte-tokenizer", byte_tokenizer, "ids 0..255 are bytes, 256 BOS, 257 EOS (for our own small models)");
  cmd->add_flag("--bf16-ffn", bf16_ffn, "round the ReLU FFN's g, u, h to bf16 as a bf16 model does");
  cmd->add_flag("--check-finite", check_finite, "refuse weights holding NaN or Inf");
}

model::LlamaCpu ModelArgs::load_model() const {
  const auto t0 = std::chrono::steady_clock::now();
  model::LlamaLoadOptions lo;
  lo.check_finite = check_finite;
  model::LlamaWeights w = model::LlamaWeights::load_dir(dir, lo);
  const io::ModelConfig& c = w.config;
  std::fprintf(stderr, "loaded %s: %lld layers, hidden %lld, FFN %lld (%s), %lld heads / %lld KV heads, vocab %lld (%.1f s)\n",
               dir.c_str(), static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
               static_cast<long long>(c.intermediate_size), c.hidden_act.c_str(),
               static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.num_key_value_heads),
               static_cast<long long>(c.vocab_size),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  model::LlamaOptions mo;
  if (bf16_ffn) mo.relu_ffn = Precision::bf16;
  return model::LlamaCpu(std::move(w), mo);
}

std::unique_ptr<model::Tokenizer> ModelArgs::load_tokenizer(const model::LlamaCpu& m) const {
  std::unique_ptr<model::Tokenizer> tok;
  if (byte_tokenizer)
    tok = std::make_unique<model::ByteTokenizer>(true, true);
  else
    tok = model::load_tokenizer(dir);
  TWELL_CHECK(tok->vocab_size() <= m.config().vocab_size, "the tokenizer has ", tok->vocab_size(),
              " ids but the model's vocabulary is ", m.config().vocab_size);
  return tok;
}

}  // namespace twell::cli
