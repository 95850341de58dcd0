#include "model_loading.h"

#include <sys/stat.h>

#include <cstdio>

namespace twell::cli {

void ModelArgs::add_to(CLI::App* cmd) {
  cmd->add_option("model", dir, "model directory: config.json, safetensors (single or sharded), tokenizer.json")
      ->required()
      ->check(CLI::Validator(
          [](std::string& path) -> std::string {
            try {
              io::check_model_directory(path);
              return {};
            } catch (const Error& e) {
              return e.what();
            }
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
  gpu_only_options.push_back(cmd->add_option_function<std::string>(
         "--gpu-memory", [this](const std::string& v) { gpu_memory = parse_bytes(v); },
         "the most GPU memory the model may take, e.g. 40GB (default: all that is free); a model that needs more "
         "runs on the CPU under --device auto")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            try {
              return parse_bytes(v) >= 1 ? std::string() : "must be at least 1 byte (leave it out for no cap), got " + v;
            } catch (const Error& e) {
              return e.what();
            }
          },
          "SIZE")));
  gpu_only_options.push_back(
      cmd->add_option("--ffn", ffn, "GPU FFN of ReLU models: twell (sparse TwELL where it pays) or dense")
          ->check(CLI::IsMember({"twell", "dense"}))
          ->capture_default_str());
}

namespace {

model::DeviceChoice device_choice(const std::string& device) {
  return device == "cpu" ? model::DeviceChoice::cpu
         : device == "cuda" ? model::DeviceChoice::cuda
                            : model::DeviceChoice::automatic;
}

const char* kCudaChoice = "--device (--backend) cuda";

}  // namespace

std::unique_ptr<model::LanguageModel> ModelArgs::load_model() const {
  model::ModelLoadOptions o;
  o.device = device_choice(device);
  o.dense_ffn = ffn == "dense";
  o.bf16_ffn = bf16_ffn;
  o.check_finite = force_check_finite || !skip_check_finite;
  o.context = gpu_context;
  o.kv_cache = gpu_kv_cache;
  o.max_batch = gpu_max_batch;
  o.max_tokens = gpu_max_tokens;
  o.shrink_to_fit = gpu_shrink_to_fit;
  o.max_tokens_choice_name = max_tokens_option;
  o.gpu_memory = gpu_memory;
  o.gpu_memory_choice_name = "--gpu-memory";
  o.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  o.cuda_choice_name = kCudaChoice;
  o.cpu_choice_name = "--device cpu";
  o.bf16_choice_name = "--bf16-ffn";
  o.context_hint = "a shorter context needs less: run's prompt and -n, eval's --context";
  std::string given;
  for (const CLI::Option* option : gpu_only_options)
    if (option->count() > 0) given += (given.empty() ? "" : ", ") + option->get_name();
  if (!given.empty()) o.cpu_backend_note = " (" + given + ": options for the GPU; the CPU backend does not use them)";
  return model::load_model(dir, o);
}

std::unique_ptr<model::Tokenizer> ModelArgs::load_tokenizer(const io::ModelConfig& c) const {
  return model::load_model_tokenizer(dir, c.vocab_size, byte_tokenizer, "--byte-tokenizer");
}

bool note_if_not_utf8(const std::string& what, std::string_view text) {
  const size_t bad = model::first_invalid_utf8(text);
  if (bad == std::string_view::npos) return true;
  std::fprintf(stderr,
               "note: %s is not valid UTF-8 from byte %zu on; its bytes are encoded as they are (HuggingFace "
               "would not take it)\n",
               what.c_str(), bad);
  return false;
}

void refuse_device(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return;  // the open that follows says why
  TWELL_REQUIRE(!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode), path, ": a device, not a text file");
}

void refuse_utf16_or_32(const std::string& what, std::string_view text) {
  struct Mark {
    std::string_view bytes, encoding, shown;
  };
  // UTF-32LE's mark begins with UTF-16LE's: the longer ones first.
  static constexpr Mark marks[] = {{std::string_view("\xFF\xFE\0\0", 4), "UTF-32", "FF FE 00 00"},
                                   {std::string_view("\0\0\xFE\xFF", 4), "UTF-32", "00 00 FE FF"},
                                   {"\xFF\xFE", "UTF-16", "FF FE"},
                                   {"\xFE\xFF", "UTF-16", "FE FF"}};
  for (const Mark& m : marks)
    TWELL_REQUIRE(text.substr(0, m.bytes.size()) != m.bytes, what, " is ", m.encoding, " (it starts with the byte-order mark ",
                  m.shown, "); twell reads UTF-8: convert it first, e.g. iconv -f ", m.encoding, " -t UTF-8");
}

}  // namespace twell::cli
