#include "model_loading.h"


#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>

#if TWELL_WITH_CUDA
#include "twell/cuda/llama.h"
#endif

namespace twell::cli {

void ModelArgs::add_to(CLI::App* cmd) {
  cmd->add_option("model", dir, "model directory: config.json, safetensors (single or sharded), tokenizer.json")
      ->required()
      ->check(CLI::Validator(
          [](std::string& path) -> std::string {
            if (CLI::ExistingDirectory(path).empty()) return {};
            return CLI::ExistingFile(path).empty()
                       ? "must be a model directory (config.json, safetensors, tokenizer.json), got the file " + path
                       : "no such directory: " + path;
          },
          "DIR"));
  cmd->add_flag("--byte-tokenizer", byte_tokenizer,
                "ids 0..255 are bytes, 256 BOS, 257 EOS (our own small models; a vocabulary of at least 258)");
  cmd->add_flag("--bf16-ffn", bf16_ffn,
                "CPU backend: round the ReLU FFN's g, u, h to bf16 as a bf16 model does (the GPU always does)");
  cmd->add_flag("--check-finite", force_check_finite, "refuse weights holding NaN or Inf (on by default)");
  cmd->add_flag("--no-check-finite", skip_check_finite,
                "skip that scan of the weights (--check-finite wins); a NaN in an inactive neuron's rows then goes "
                "unseen");
  cmd->add_option("--device,--backend", device,
                  "cpu, cuda, or auto (cuda when a Hopper GPU is present, its runtime takes the model and it has the "
                  "memory for it)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  ffn_option = cmd->add_option("--ffn", ffn, "GPU FFN of ReLU models: twell (sparse TwELL where it pays) or dense")
                   ->check(CLI::IsMember({"twell", "dense"}))
                   ->capture_default_str();
}

#if TWELL_WITH_CUDA
namespace {

// The host memory available for new allocations (MemAvailable of /proc/meminfo); 0 where unknown.
size_t host_memory_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (meminfo >> key) {
    if (key == "MemAvailable:" && meminfo >> kib) return kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

// Why a model's weights and buffers would not fit in the GPU's free memory, naming the parts; empty
// where they fit.
std::string gpu_memory_shortfall(const io::ModelConfig& c, const cuda::LlamaCudaOptions& o) {
  const size_t weights = cuda::LlamaCudaWeights::bytes_for(c);
  const cuda::LlamaCudaMemory m = cuda::LlamaCuda::memory_needed(c, o);
  const cuda::DeviceMemory gpu = cuda::device_memory();
  if (weights > gpu.free)
    return str("the model's weights need ", bytes_str(weights), " of GPU memory, and the GPU has ", gpu.str());
  if (weights + m.total() <= gpu.free) return {};
  const int64_t context = o.max_context ? o.max_context : c.max_position_embeddings;
  return str("the model needs ", bytes_str(weights + m.total()), " of GPU memory: weights ", bytes_str(weights),
             ", KV cache ", bytes_str(m.kv_cache), " for ", context, " positions, activations and workspaces ",
             bytes_str(m.activations + m.ffn + m.other), "; the GPU has ", gpu.str(),
             " (a shorter context needs less: run's prompt and -n, eval's --context)");
}

}  // namespace
#endif

bool ModelArgs::on_gpu() const {
  if (device == "cpu") return false;
#if TWELL_WITH_CUDA
  std::string why;
  const bool gpu = cuda::hopper_available(&why);
  TWELL_REQUIRE(gpu || device == "auto", "--device (--backend) cuda: ", why);
  return gpu;
#else
  TWELL_REQUIRE(device == "auto",
                "--device (--backend) cuda: this build has no CUDA backend (configure with -DTWELL_CUDA=ON)");
  return false;
#endif
}

std::unique_ptr<model::LanguageModel> ModelArgs::load_model() const {
  const auto t0 = std::chrono::steady_clock::now();
  bool gpu = on_gpu();
#if TWELL_WITH_CUDA
  cuda::LlamaCudaOptions co;
  if (gpu) {  // a model the GPU runtime does not take runs on the CPU under --device auto
    const io::ModelConfig config = io::read_config(dir);
    std::string why;
    if (!cuda::LlamaCuda::supports(config, &why)) {
      TWELL_REQUIRE(device == "auto", "--device (--backend) cuda: the GPU runtime does not take this model's ", why);
      std::fprintf(stderr, "the GPU runtime does not take this model's %s: using the CPU backend\n", why.c_str());
      gpu = false;
    } else {
      co.ffn = ffn == "dense" ? cuda::FfnMode::dense : cuda::FfnMode::twell;
      co.max_context = gpu_context > 0 ? std::min(gpu_context, config.max_position_embeddings) : 0;
      co.kv_cache = gpu_kv_cache;
      // Before seconds of reading and copying weights. Under --device auto a model the GPU cannot hold
      // runs on the CPU, as does a model the GPU runtime does not take.
      const std::string shortfall = gpu_memory_shortfall(config, co);
      if (!shortfall.empty()) {
        TWELL_REQUIRE(device == "auto", "--device (--backend) cuda: ", shortfall, "; --device cpu runs it on the CPU");
        // The CPU backend holds the weights in f32: twice their bf16 bytes. Refuse before minutes of
        // reading where the host cannot hold them either.
        const size_t host = host_memory_available(), f32_weights = 2 * cuda::LlamaCudaWeights::bytes_for(config);
        TWELL_REQUIRE(host == 0 || f32_weights <= host, shortfall, "; nor does it fit on the CPU, whose f32 weights ",
                      "need ", bytes_str(f32_weights), " and the machine has ", bytes_str(host), " available");
        std::fprintf(stderr, "%s: using the CPU backend\n", shortfall.c_str());
        gpu = false;
      }
    }
  }
#endif
  model::LlamaLoadOptions lo;
  lo.check_finite = force_check_finite || !skip_check_finite;
  if (gpu) lo.dtype = DType::bf16;  // the GPU's storage: convert once, at load
  model::LlamaWeights w = model::LlamaWeights::load_dir(dir, lo);
  const io::ModelConfig& c = w.config;
  int64_t last_layer = -1;  // the checkpoint's, where it holds more layers than the config runs
  for (const std::string& name : w.unused) last_layer = std::max(last_layer, model::LlamaWeights::layer_of(name));
  if (last_layer >= 0)
    std::fprintf(stderr, "warning: the checkpoint holds %lld layers; config.json's num_hidden_layers = %lld runs only "
                 "the first %lld\n", static_cast<long long>(last_layer + (last_layer < INT64_MAX)),  // saturated
                 static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.num_hidden_layers));
  if (!w.unused.empty()) {
    std::string names;
    for (size_t i = 0; i < w.unused.size() && i < 3; ++i) names += (i ? ", " : "") + w.unused[i];
    if (w.unused.size() > 3) names += str(", and ", w.unused.size() - 3, " more");
    std::fprintf(stderr, "note: %zu tensor%s in the checkpoint %s not used by the model: %s\n", w.unused.size(),
                 w.unused.size() == 1 ? "" : "s", w.unused.size() == 1 ? "is" : "are", names.c_str());
  }
  std::fprintf(stderr, "loaded %s: %lld layer%s, hidden %lld, FFN %lld (%s), %lld heads / %lld KV heads, vocab %lld (%.1f s)\n",
               dir.c_str(), static_cast<long long>(c.num_hidden_layers), c.num_hidden_layers == 1 ? "" : "s",
               static_cast<long long>(c.hidden_size),
               static_cast<long long>(c.intermediate_size), c.hidden_act.c_str(),
               static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.num_key_value_heads),
               static_cast<long long>(c.vocab_size),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
#if TWELL_WITH_CUDA
  if (gpu) {
    auto dw = std::make_shared<cuda::LlamaCudaWeights>(cuda::LlamaCudaWeights::upload(w));
    // The twell FFN serves ReLU-gated FFNs whose H and I are multiples of 64 (LlamaCuda); others run
    // the dense FFN whatever --ffn says.
    const bool twell_fits = c.hidden_act == "relu" && c.hidden_size % 64 == 0 && c.intermediate_size % 64 == 0;
    const std::string ffn_used =
        ffn == "dense" || twell_fits ? ffn : "dense (the twell FFN needs a ReLU gate and H, I multiples of 64)";
    std::fprintf(stderr, "backend: %s (GPU), %s of weights, %s FFN%s\n", cuda::device_info().name.c_str(),
                 bytes_str(dw->bytes()).c_str(), ffn_used.c_str(),
                 bf16_ffn ? " (--bf16-ffn: the GPU rounds to bf16 anyway)" : "");
    return std::make_unique<cuda::LlamaCuda>(std::move(dw), co);
  }
#endif
  std::fprintf(stderr, "backend: CPU reference%s%s\n",
               ffn_option && ffn_option->count() ? " (--ffn picks the GPU's FFN; the CPU runs its reference FFN)" : "",
               bf16_ffn && c.hidden_act != "relu" ? " (--bf16-ffn rounds a ReLU FFN; this model's is not one)" : "");
  model::LlamaOptions mo;
  if (bf16_ffn) mo.relu_ffn = Precision::bf16;
  return std::make_unique<model::LlamaCpu>(std::move(w), mo);
}

std::unique_ptr<model::Tokenizer> ModelArgs::load_tokenizer(const io::ModelConfig& c) const {
  std::unique_ptr<model::Tokenizer> tok;
  if (byte_tokenizer)
    tok = std::make_unique<model::ByteTokenizer>(true, true);
  else {
    try {
      tok = model::load_tokenizer(dir);
    } catch (const Error& e) {
      // Where there is no tokenizer at all, the model may be one of ours, trained on bytes.
      if (model::has_tokenizer_file(dir)) throw;
      throw Error(str(e.what(), "; a model of our own trained on bytes runs with --byte-tokenizer"));
    }
  }
  check_tokenizer_fits(*tok, c);
  return tok;
}

void check_tokenizer_fits(const model::Tokenizer& tok, const io::ModelConfig& c) {
  TWELL_REQUIRE(tok.vocab_size() <= c.vocab_size, "the tokenizer has ", tok.vocab_size(),
                " ids but the model's vocabulary is ", c.vocab_size);
}

void note_if_not_utf8(const std::string& what, std::string_view text) {
  if (const size_t bad = model::first_invalid_utf8(text); bad != std::string_view::npos)
    std::fprintf(stderr,
                 "note: %s is not valid UTF-8 from byte %zu on; its bytes are encoded as they are (HuggingFace "
                 "would not take it)\n",
                 what.c_str(), bad);
}

}  // namespace twell::cli
