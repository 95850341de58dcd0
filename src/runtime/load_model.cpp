// twell/model/load.h: a model directory onto the backend that runs it.
#include "twell/model/load.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>

#include "twell/error.h"
#include "twell/io/safetensors.h"
#if TWELL_WITH_CUDA
#include "twell/cuda/llama.h"
#include "twell/cuda/runtime.h"
#endif

namespace twell::model {

namespace {

void say(const ModelLoadOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// The host memory available for new allocations, swap included (MemAvailable + SwapFree of /proc/meminfo:
// a load that swaps is slow, not refused); 0 where unknown.
size_t host_memory_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0, available = 0, swap = 0;
  while (meminfo >> key) {
    if (key == "MemAvailable:" && meminfo >> kib) available = kib * 1024;
    if (key == "SwapFree:" && meminfo >> kib) swap = kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return available == 0 ? 0 : available + swap;
}

// "" where the CPU backend's weights (f32) fit the host's available memory (or it is unknown), else why not:
// refused before minutes of reading, rather than the kernel's OOM killer ending the process mid-load.
std::string host_shortfall(const io::ModelConfig& config) {
  const size_t host = host_memory_available(), f32_weights = LlamaWeights::bytes_for(config, DType::f32);
  if (host == 0 || f32_weights <= host) return "";
  return str("the CPU backend's f32 weights need ", bytes_str(f32_weights), " and the machine has ", bytes_str(host),
             " available (memory and swap)");
}

#if TWELL_WITH_CUDA
// The GPU memory a model may take: the free memory, or less under ModelLoadOptions::gpu_memory.
size_t usable_gpu_memory(const ModelLoadOptions& o, const cuda::DeviceMemory& gpu) {
  return o.gpu_memory ? std::min(o.gpu_memory, gpu.free) : gpu.free;
}

// The GPU memory a model takes with options `co`, and the room to leave free beside it: what a
// whole-sequence call's logits add later (logits(), perplexity) and kGpuHeadroomBytes. A model that
// fits only without that room would load, then fail its first whole-sequence call.
struct GpuNeeds {
  size_t weights, room;
  cuda::LlamaCudaMemory m;
  size_t total() const { return weights + m.total() + room; }
};
GpuNeeds gpu_needs(const io::ModelConfig& c, const cuda::LlamaCudaOptions& co) {
  const cuda::LlamaCudaMemory m = cuda::LlamaCuda::memory_needed(c, co);
  return {cuda::LlamaCudaWeights::bytes_for(c), m.logits_growth + kGpuHeadroomBytes, m};
}

// Why a model's weights and buffers (and the room beside them: gpu_needs) would not fit in the GPU's
// free memory, naming the parts; empty where they fit.
std::string gpu_memory_shortfall(const io::ModelConfig& c, const cuda::LlamaCudaOptions& co,
                                 const ModelLoadOptions& o) {
  const GpuNeeds needs = gpu_needs(c, co);
  const size_t weights = needs.weights, room = needs.room;
  const cuda::LlamaCudaMemory& m = needs.m;
  const cuda::DeviceMemory gpu = cuda::device_memory();
  const size_t usable = usable_gpu_memory(o, gpu);
  const std::string has = o.gpu_memory && o.gpu_memory < gpu.free
                              ? str(gpu.str(), ", of which ", bytes_str(o.gpu_memory), " may be used (",
                                    o.gpu_memory_choice_name, ")")
                              : gpu.str();
  if (weights > usable)
    return str("the model's weights need ", bytes_str(weights), " of GPU memory, and the GPU has ", has);
  if (needs.total() <= usable) return {};
  const int64_t context = co.max_context ? co.max_context : c.max_position_embeddings;
  const std::string sequences = co.max_batch > 1 ? str(co.max_batch, " sequences of ") : "";
  const std::string fewer = str(co.max_batch > 1 ? ", and fewer sequences" : "",
                                o.max_tokens > 0 ? str(", and fewer tokens a forward (", o.max_tokens_choice_name, ")") : "");
  return str("the model needs ", bytes_str(needs.total()), " of GPU memory: weights ", bytes_str(weights),
             ", KV cache ", bytes_str(m.kv_cache), " for ", sequences, context,
             " positions, activations and workspaces ", bytes_str(m.activations + m.ffn + m.other), " for ",
             m.max_tokens, " tokens a forward, and ", bytes_str(room),
             " free for whole-sequence logits and libraries' workspaces; the GPU has ", has, " (", o.context_hint,
             fewer, ")");
}
#endif

}  // namespace

int64_t fit_max_tokens(int64_t least, int64_t preferred, const std::function<bool(int64_t)>& fits) {
  TWELL_REQUIRE(least >= 1 && least <= preferred, "fit_max_tokens: need 1 <= least <= preferred, got least ", least,
                ", preferred ", preferred);
  if (fits(preferred)) return preferred;
  if (!fits(least)) return 0;
  int64_t lo = least, hi = preferred;  // fits(lo), not fits(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  const int64_t rounded = lo / 256 * 256;
  return rounded >= least ? rounded : lo;
}

bool gpu_chosen(DeviceChoice choice, std::string* why, const std::string& cuda_choice_name) {
  if (choice == DeviceChoice::cpu) {
    if (why) *why = "the CPU backend was asked for";
    return false;
  }
#if TWELL_WITH_CUDA
  std::string reason;
  const bool gpu = cuda::hopper_available(&reason);
  TWELL_REQUIRE(gpu || choice == DeviceChoice::automatic, cuda_choice_name, ": ", reason);
  if (why) *why = reason;
  return gpu;
#else
  TWELL_REQUIRE(choice == DeviceChoice::automatic, cuda_choice_name,
                ": this build has no CUDA backend (configure with -DTWELL_CUDA=ON)");
  if (why) *why = "this build has no CUDA backend";
  return false;
#endif
}

std::unique_ptr<LanguageModel> load_model(const std::string& dir, const ModelLoadOptions& o) {
  io::check_model_directory(dir);
  const auto t0 = std::chrono::steady_clock::now();
  TWELL_REQUIRE(o.context >= 0, "the context must be at least 0 (0: the config's), got ", o.context);
  TWELL_REQUIRE(o.max_batch >= 1 && o.max_batch <= 65535, "max_batch must lie in [1, 65535], got ", o.max_batch);
  TWELL_REQUIRE(o.max_tokens == 0 || o.max_tokens >= o.max_batch, o.max_tokens_choice_name,
                " must be at least the most sequences a call takes (", o.max_batch,
                ": a decode step takes one token of each), or 0 for the default; got ", o.max_tokens);
  const bool automatic = o.device == DeviceChoice::automatic;
  std::string no_gpu;
  bool gpu = gpu_chosen(o.device, &no_gpu, o.cuda_choice_name);
  bool host_checked = false;  // host_shortfall asked already (a model the GPU could not hold, moved to the CPU)
  if (!gpu && automatic) say(o, "using the CPU backend: " + no_gpu);
#if TWELL_WITH_CUDA
  cuda::LlamaCudaOptions co;
  if (gpu) {  // a model the GPU runtime does not take runs on the CPU under automatic
    io::ModelConfig config = io::read_config(dir);
    if (config.tie_word_embeddings) {  // a head of its own may load untied (LlamaWeights::head_untied): counted
      const io::Checkpoint ckpt = io::Checkpoint::open(dir);
      config.tie_word_embeddings = !(ckpt.has("lm_head.weight") && ckpt.info("lm_head.weight").shape ==
                                                                       Shape{config.vocab_size, config.hidden_size});
    }
    std::string why;
    if (!cuda::LlamaCuda::supports(config, &why)) {
      TWELL_REQUIRE(automatic, o.cuda_choice_name, ": the GPU runtime does not take this model's ", why);
      say(o, str("the GPU runtime does not take this model's ", why, ": using the CPU backend"));
      gpu = false;
    } else {
      co.ffn = o.dense_ffn ? cuda::FfnMode::dense : cuda::FfnMode::twell;
      co.max_context = o.context > 0 ? std::min(o.context, config.max_position_embeddings) : 0;
      co.kv_cache = o.kv_cache;
      co.max_batch = o.max_batch;
      co.max_tokens = o.max_tokens;
      // Before seconds of reading and copying weights. Under automatic a model the GPU cannot hold
      // runs on the CPU, as does a model the GPU runtime does not take.
      std::string shortfall = gpu_memory_shortfall(config, co, o);
      if (!shortfall.empty()) {
        const size_t usable = usable_gpu_memory(o, cuda::device_memory());
        // Whether `x` fits, with the room beside it.
        const auto roomy = [&](const cuda::LlamaCudaOptions& x) { return gpu_needs(config, x).total() <= usable; };
        std::vector<std::string> notes;
        if (o.shrink_to_fit && co.max_batch > 1) {
          // Fewer sequences a call (`twell eval`'s windows a forward), halved until they fit, down to one.
          do co.max_batch /= 2;
          while (co.max_batch > 1 && !roomy(co));
          notes.push_back(str("note: ", co.max_batch, " sequence", co.max_batch == 1 ? "" : "s", " a call, not ",
                              o.max_batch, ", to fit the GPU's memory"));
          if (roomy(co)) shortfall.clear();
        }
        if (!shortfall.empty() && o.max_tokens == 0 && (o.kv_cache || (o.shrink_to_fit && co.max_batch == 1))) {
          // Activations for fewer tokens a forward, where the weights and the KV cache fit: longer
          // prompts then run in chunks, on the GPU, rather than the whole model on the CPU. Chunks
          // need the KV cache; without it (`twell eval`, shrink_to_fit) a sequence runs in one
          // forward, so there the cache goes on (bytes a position beside the activations'
          // kilobytes) where that lets the model fit.
          cuda::LlamaCudaOptions fit = co;
          fit.kv_cache = true;
          const int64_t preferred = cuda::LlamaCuda::memory_needed(config, fit).max_tokens;
          const int64_t fitted = fit_max_tokens(co.max_batch, preferred, [&](int64_t t) {
            fit.max_tokens = t;
            return roomy(fit);
          });
          if (fitted > 0) {
            fit.max_tokens = fitted;
            co = fit;
            shortfall.clear();
            const std::string cache = o.kv_cache ? "" : "with the KV cache on, so that a sequence may run in chunks: ";
            const std::string option =
                o.max_tokens_choice_name.empty() ? "" : str(" (", o.max_tokens_choice_name, " sets it)");
            notes.push_back(fitted < preferred
                                ? str("note: ", cache, "activations sized for ", fitted, " tokens a forward, not ",
                                      preferred, ", to fit the GPU's memory: longer sequences run in chunks of at "
                                      "most as many", option)
                                : str("note: ", cache, "activations for ", fitted, " tokens a forward fit the GPU's "
                                      "memory where one forward of the whole context did not"));
          }
        }
        // Fewer sequences that still do not fit: the shortfall gives their figures.
        if (!shortfall.empty() && co.max_batch < o.max_batch) shortfall = gpu_memory_shortfall(config, co, o);
        if (shortfall.empty())
          for (const std::string& line : notes) say(o, line);
      }
      if (!shortfall.empty()) {
        TWELL_REQUIRE(automatic, o.cuda_choice_name, ": ", shortfall, "; ", o.cpu_choice_name,
                      " runs it on the CPU");
        const std::string host = host_shortfall(config);
        TWELL_REQUIRE(host.empty(), shortfall, "; nor does it fit on the CPU: ", host);
        say(o, shortfall + ": using the CPU backend");
        gpu = false;
        host_checked = true;
      }
    }
  }
#endif
  if (!gpu && !host_checked) {
    const std::string host = host_shortfall(io::read_config(dir));
    TWELL_REQUIRE(host.empty(), dir, ": the model does not fit in memory: ", host);
  }
  LlamaLoadOptions lo;
  lo.check_finite = o.check_finite;
  if (gpu) lo.dtype = DType::bf16;  // the GPU's storage: convert once, at load
  LlamaWeights w = LlamaWeights::load_dir(dir, lo);
  const io::ModelConfig& c = w.config;
  int64_t last_layer = -1;  // the checkpoint's, where it holds more layers than the config runs
  for (const std::string& name : w.unused) last_layer = std::max(last_layer, LlamaWeights::layer_of(name));
  if (last_layer >= 0)
    say(o, str("warning: the checkpoint holds ", last_layer + (last_layer < INT64_MAX),  // saturated
               " layers; config.json's num_hidden_layers = ", c.num_hidden_layers, " runs only the first ",
               c.num_hidden_layers));
  if (w.head_untied)
    say(o, "warning: config.json ties the embeddings (tie_word_embeddings), but the checkpoint's lm_head.weight "
           "differs from model.embed_tokens.weight: the model uses lm_head.weight, as transformers 5 does");
  if (!w.unused.empty()) {
    std::string names;
    for (size_t i = 0; i < w.unused.size() && i < 3; ++i) names += (i ? ", " : "") + printable(w.unused[i], 120);
    if (w.unused.size() > 3) names += str(", and ", w.unused.size() - 3, " more");
    say(o, str("note: ", w.unused.size(), " tensor", w.unused.size() == 1 ? "" : "s", " in the checkpoint ",
               w.unused.size() == 1 ? "is" : "are", " not used by the model: ", names));
  }
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  say(o, str("loaded ", dir, ": ", c.num_hidden_layers, " layer", c.num_hidden_layers == 1 ? "" : "s", ", hidden ",
             c.hidden_size, ", FFN ", c.intermediate_size, " (", c.hidden_act, "), ", c.num_attention_heads,
             " heads / ", c.num_key_value_heads, " KV heads, vocab ", c.vocab_size, " (", seconds, ")"));
#if TWELL_WITH_CUDA
  if (gpu) {
    auto dw = std::make_shared<cuda::LlamaCudaWeights>(cuda::LlamaCudaWeights::upload(w));
    // The twell FFN serves ReLU-gated FFNs whose H and I are multiples of 64 (LlamaCuda); others run
    // the dense FFN whatever the options say.
    const bool twell_fits = c.hidden_act == "relu" && c.hidden_size % 64 == 0 && c.intermediate_size % 64 == 0;
    const std::string ffn_used = o.dense_ffn ? "dense"
                                 : twell_fits ? "twell"
                                              : "dense (the twell FFN needs a ReLU gate and H, I multiples of 64)";
    say(o, str("backend: ", cuda::device_info().name, " (GPU), ", bytes_str(dw->bytes()), " of weights, ", ffn_used,
               " FFN", o.bf16_ffn ? str(" (", o.bf16_choice_name, ": the GPU rounds to bf16 anyway)") : std::string()));
    return std::make_unique<cuda::LlamaCuda>(std::move(dw), co);
  }
#endif
  say(o, str("backend: CPU reference", o.cpu_backend_note,
             o.bf16_ffn && c.hidden_act != "relu"
                 ? str(" (", o.bf16_choice_name, " rounds a ReLU FFN; this model's is not one)")
                 : std::string()));
  LlamaOptions mo;
  if (o.bf16_ffn) mo.relu_ffn = Precision::bf16;
  return std::make_unique<LlamaCpu>(std::move(w), mo);
}

void check_tokenizer_fits(const Tokenizer& tok, int64_t vocab_size) {
  if (tok.vocab_size() <= vocab_size) return;
  std::string last;  // the token of the largest id (often one added past the vocabulary: "<pad>")
  try {
    last = str(" (its last id, ", tok.vocab_size() - 1, ", is '", printable(tok.id_to_token(tok.vocab_size() - 1), 40), "')");
  } catch (const Error&) {  // a gap: no token to name
  }
  throw Error(str("the tokenizer has ", tok.vocab_size(), " ids", last, " but the model's vocabulary is ", vocab_size,
                  ": an id past it has no embedding row"));
}

std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& dir, int64_t vocab_size, bool bytes,
                                                const std::string& bytes_choice_name) {
  std::unique_ptr<Tokenizer> tok;
  if (bytes) {
    tok = std::make_unique<ByteTokenizer>(true, true);
  } else {
    try {
      tok = load_tokenizer(dir);
    } catch (const Error& e) {
      // Where there is no tokenizer at all, the model may be one of ours, trained on bytes (if its
      // vocabulary holds the byte tokenizer's ids).
      if (has_tokenizer_file(dir)) throw;
      const int64_t byte_ids = ByteTokenizer(true, true).vocab_size();
      if (vocab_size < byte_ids)
        throw Error(str(e.what(), "; the model's vocabulary of ", vocab_size, " is too small for ", bytes_choice_name,
                        " (", byte_ids, " ids): it needs its own tokenizer.json"));
      throw Error(str(e.what(), "; a model of our own trained on bytes runs with ", bytes_choice_name));
    }
  }
  check_tokenizer_fits(*tok, vocab_size);
  return tok;
}

std::vector<int32_t> default_stop_ids(const io::ModelConfig& config, const Tokenizer& tok) {
  std::vector<int32_t> stops = config.eos_token_ids;
  if (tok.eos_id() && std::find(stops.begin(), stops.end(), *tok.eos_id()) == stops.end()) stops.push_back(*tok.eos_id());
  return stops;
}

}  // namespace twell::model
