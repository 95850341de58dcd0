// Text from a Llama-style model through twell's C++ API: load (onto the GPU where one takes it,
// else the CPU backend), tokenize, the prompt's perplexity and each layer's FFN sparsity, then
// generate with sampling and the model's stop tokens, the text streamed.
//
//   generate MODEL_DIR ["prompt"]   an HF checkpoint directory (config.json, safetensors,
//                                   tokenizer.json), e.g. HuggingFaceTB/SmolLM-135M
//   generate                        a small random ReLU model on bytes, written to a temporary
//                                   directory first (LlamaWeights::save_dir; removed at the end):
//                                   the text is noise, the calls are those of a real model (its
//                                   FFN about half active, where a model trained with L1 is ~1%)
#include <stdlib.h>  // mkdtemp

#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "twell/cpu/threads.h"
#include "twell/model/llama.h"
#include "twell/model/load.h"
#include "twell/model/tokenizer.h"

namespace {

namespace model = twell::model;

// A random f32 tensor of N(0, sigma²) values.
twell::Tensor random_f32(const twell::Shape& shape, float sigma, std::mt19937& rng) {
  twell::Tensor t = twell::Tensor::of<float>(shape);
  std::normal_distribution<float> normal(0.f, sigma);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = normal(rng);
  return t;
}

twell::Tensor ones(int64_t n) {
  twell::Tensor t = twell::Tensor::of<float>({n});
  for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = 1.f;
  return t;
}

// A 2-layer ReLU-gated model over the byte tokenizer's 258 ids (bytes, BOS 256, EOS 257), saved as
// an HF checkpoint that load_model reads like any other.
std::string write_random_model() {
  twell::io::ModelConfig c;
  c.hidden_size = 128, c.intermediate_size = 512, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 32;
  c.vocab_size = 258, c.max_position_embeddings = 512;
  c.hidden_act = "relu", c.tie_word_embeddings = true, c.eos_token_ids = {257};
  const int64_t H = c.hidden_size, I = c.intermediate_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  std::mt19937 rng(1);
  model::LlamaWeights w;
  w.config = c;
  w.embed = random_f32({c.vocab_size, H}, 0.02f, rng);  // as HF initialises: logits near 0, perplexity near 258
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    model::LlamaLayerWeights layer;
    layer.input_norm = ones(H), layer.post_norm = ones(H);
    layer.wq = random_f32({q, H}, 0.09f, rng), layer.wk = random_f32({kv, H}, 0.09f, rng);
    layer.wv = random_f32({kv, H}, 0.09f, rng), layer.wo = random_f32({H, q}, 0.09f, rng);
    layer.wg = random_f32({I, H}, 0.09f, rng), layer.wu = random_f32({I, H}, 0.09f, rng);
    layer.wd = random_f32({I, H}, 0.04f, rng);  // neuron-major: row j is neuron j's (save_dir writes HF's [H, I])
    w.layers.push_back(std::move(layer));
  }
  w.final_norm = ones(H);
  std::string dir = (std::filesystem::temp_directory_path() / "twell_generate_XXXXXX").string();
  if (!mkdtemp(dir.data())) throw std::runtime_error("cannot make a temporary directory: " + dir);
  try {
    w.save_dir(dir);  // config.json + model.safetensors
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    throw;
  }
  return dir;
}

// Removes the random model's directory when the program ends, however it ends.
struct RemoveAtExit {
  std::string dir;
  ~RemoveAtExit() {
    std::error_code ignored;
    if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
  }
};

int run(int argc, char** argv) {
  const bool own = argc < 2;
  RemoveAtExit own_dir{own ? write_random_model() : ""};
  const std::string dir = own ? own_dir.dir : argv[1];
  const std::string prompt = argc > 2 ? argv[2] : "The capital of France is";

  model::ModelLoadOptions options;  // device: automatic (a Hopper GPU where it takes the model, else the CPU)
  options.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  std::unique_ptr<model::LanguageModel> lm = model::load_model(dir, options);
  const std::unique_ptr<twell::model::Tokenizer> tok =
      model::load_model_tokenizer(dir, lm->config().vocab_size, /*bytes=*/own);
  if (dynamic_cast<const model::LlamaCpu*>(lm.get()))
    std::printf("on the CPU backend, %d thread%s (twell::cpu::set_num_threads)\n", twell::cpu::num_threads(),
                twell::cpu::num_threads() == 1 ? "" : "s");

  // The prompt's ids: encode() adds no BOS; the tokenizer says whether this model wants one.
  std::vector<int32_t> ids;
  if (tok->bos_to_add()) ids.push_back(*tok->bos_to_add());
  const std::vector<int32_t> text = tok->encode(prompt);
  ids.insert(ids.end(), text.begin(), text.end());

  // generate() stops only at the ids it is given: config.json's (and generation_config.json's)
  // eos_token_id, and the tokenizer's EOS.
  const std::vector<int32_t> stops = model::default_stop_ids(lm->config(), *tok);
  model::SamplingOptions sampling;  // temperature 0: greedy
  sampling.temperature = 0.7, sampling.top_p = 0.9, sampling.seed = 42;
  sampling.vocab_limit = tok->vocab_size();  // never an id the tokenizer cannot print

  // The prompt's perplexity and each layer's FFN sparsity, before generating: on the GPU a
  // generation stays in the model's KV cache, and a whole-sequence call would refuse to overwrite
  // it (LanguageModel::reset() empties it).
  if (ids.size() >= 2) {
    std::vector<twell::ActivationStats> layers;
    const model::Perplexity p = model::perplexity(*lm, ids, &layers);
    std::printf("prompt perplexity %.3f over %lld predictions\n", p.perplexity, static_cast<long long>(p.predictions));
    for (size_t l = 0; l < layers.size(); ++l)
      std::printf("layer %zu: %.1f of %lld FFN neurons active a token\n", l, layers[l].mean_nnz_per_token(),
                  static_cast<long long>(lm->config().intermediate_size));
  }

  std::printf("%s", prompt.c_str());
  model::TextStream stream(*tok, ids, stops);  // whole characters only, however the ids split them
  const model::Generation g = model::generate(*lm, ids, 24, sampling, stops, [&](int32_t id) {
    std::printf("%s", stream.put(id).c_str());
    std::fflush(stdout);
  });
  std::printf("%s\n%zu tokens, %s\n", stream.finish().c_str(), g.tokens.size(),
              g.reason == model::StopReason::stop_token ? "stopped at the end-of-sequence token" : "to the limit");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // twell::Error: one line that names what was wrong
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
