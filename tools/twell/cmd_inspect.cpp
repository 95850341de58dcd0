// `twell inspect PATH`: prints a checkpoint's config (config.json inside PATH or beside it), a
// table of its tensors and totals; for a whole checkpoint with a config, whether `twell run` and
// `twell eval` take the pair (the loader's checks); with --check-finite also scans every float
// tensor for NaN/Inf. Everything is printed first; then an error exit if the config is refused,
// the loader would refuse the checkpoint, or a tensor holds NaN/Inf.
// PATH is a .safetensors file, a model.safetensors.index.json, or a directory holding either.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "model_loading.h"
#include "twell/io/config.h"
#if TWELL_WITH_CUDA
#include "twell/cuda/llama.h"
#endif
#include "twell/io/safetensors.h"
#include "twell/model/llama.h"
#include "twell/model/chat_template.h"
#include "twell/model/tokenizer.h"

namespace twell::cli {

namespace {

// The directory a file's path names ("." for a bare name, "/" for a file at the root).
std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

// The directory holding config.json: PATH (a directory) or the directory of PATH (a file); "" if
// it has none.
std::string find_config_dir(const std::string& path) {
  struct stat st;
  const std::string dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? path : parent_dir(path);
  struct stat config;  // any entry: a config.json that is no file is refused by read_config, saying so
  return ::lstat((dir + "/config.json").c_str(), &config) == 0 ? dir : "";
}

// 1234567 -> "1,234,567".
std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_config(const io::ModelConfig& c, const std::string& file) {
  std::printf("config: %s\n", file.c_str());
  std::printf("  %s: hidden %lld, intermediate %lld, %lld layers, vocab %lld%s\n",
              c.model_type.c_str(), (long long)c.hidden_size, (long long)c.intermediate_size,
              (long long)c.num_hidden_layers, (long long)c.vocab_size,
              c.tie_word_embeddings ? " (tied embeddings)" : "");
  std::printf(
      "  attention: %lld heads, %lld kv heads, head_dim %lld, rope_theta %g, context %lld\n",
      (long long)c.num_attention_heads, (long long)c.num_key_value_heads, (long long)c.head_dim,
      c.rope_theta, (long long)c.max_position_embeddings);
  const io::RopeScaling& r = c.rope_scaling;
  if (r.type == "linear") std::printf("  rope_scaling linear, factor %g\n", r.factor);
  if (r.type == "llama3")
    std::printf("  rope_scaling llama3, factor %g, low_freq_factor %g, high_freq_factor %g, original context %lld\n",
                r.factor, r.low_freq_factor, r.high_freq_factor, (long long)r.original_max_position_embeddings);
  std::printf("  hidden_act %s, rms_norm_eps %g, torch_dtype %s\n", c.hidden_act.c_str(),
              c.rms_norm_eps, c.torch_dtype.empty() ? "(unset)" : c.torch_dtype.c_str());
}

// Whether `twell run` and `twell eval` take the checkpoint with this config (the loader's checks,
// no tensor data read), and on which backend.
// Returns why they refuse it, or "" where they take it.
std::string print_model_check(const io::Checkpoint& ckpt, const io::ModelConfig& c) {
  std::vector<std::string> unused;
  try {
    unused = model::LlamaWeights::check(ckpt, c);
  } catch (const Error& e) {
    std::printf("\nmodel: twell run and twell eval refuse this checkpoint: %s\n", e.what());
    return e.what();
  }
  std::printf("\nmodel: the tensors match config.json");
  if (!unused.empty()) std::printf(" (%zu more not used, e.g. %s)", unused.size(), printable(unused.front(), 120).c_str());
  std::printf("\n");
  if (c.tie_word_embeddings && std::find(unused.begin(), unused.end(), "lm_head.weight") != unused.end())
    std::printf("  lm_head.weight beside tied embeddings: run and eval use it where its values differ from the "
                "embedding's, as transformers 5 does (not read here)\n");
#if TWELL_WITH_CUDA
  std::string why;
  if (cuda::LlamaCuda::supports(c, &why)) {
    std::printf("  GPU runtime: takes this model%s\n",
                c.hidden_act == "relu" ? " (ReLU gate: the twell FFN applies)" : " (dense FFN)");
    // What it will need besides activations: the KV cache grows with the context a job asks for.
    const size_t kv_position = 2 * static_cast<size_t>(c.num_hidden_layers * c.num_key_value_heads * c.head_dim) * 2;
    std::printf("  GPU memory: %s of bf16 weights; KV cache %s a position a sequence (%s at the config's %lld)\n",
                bytes_str(cuda::LlamaCudaWeights::bytes_for(c)).c_str(), bytes_str(kv_position).c_str(),
                bytes_str(kv_position * static_cast<size_t>(c.max_position_embeddings)).c_str(),
                static_cast<long long>(c.max_position_embeddings));
  } else
    std::printf("  GPU runtime: does not take this model's %s (twell run/eval use the CPU backend)\n", why.c_str());
#endif
  return "";
}

void run_inspect(const std::string& path, bool check_finite) {
  struct stat st;
  TWELL_REQUIRE(!path.empty(), "expected a checkpoint path, got an empty one");
  TWELL_REQUIRE(::stat(path.c_str(), &st) == 0, path, ": cannot open: ", std::strerror(errno));
  TWELL_REQUIRE(S_ISDIR(st.st_mode) || !ends_with(path, ".json") || ends_with(path, ".index.json"), path,
                " is a JSON file, not a checkpoint: give its directory (", parent_dir(path),
                "), a .safetensors file or a sharded checkpoint's .index.json");
  // The tensors first: a file that is no checkpoint is said alone, before any config or tokenizer line.
  const io::Checkpoint ckpt = io::Checkpoint::open(path);
  const std::string config_dir = find_config_dir(path);
  std::unique_ptr<io::ModelConfig> config;
  std::vector<std::string> problems;  // the error exit's reasons, once everything is printed
  if (!config_dir.empty()) {
    try {
      // The directory, as run and eval read it: config.json and generation_config.json.
      config = std::make_unique<io::ModelConfig>(io::read_config(config_dir));
      print_config(*config, io::config_file(config_dir));
    } catch (const Error& e) {  // the tensors are still worth seeing
      std::printf("config: refused: %s\n", e.what());
      problems.push_back("twell run and twell eval refuse its config.json");
    }
  } else {
    std::printf("config: none found (twell run and twell eval need a config.json beside the weights)\n");
    if (S_ISDIR(st.st_mode)) problems.push_back("twell run and twell eval need a config.json in a model directory");
  }
  if (S_ISDIR(st.st_mode)) {  // what run and eval will encode with
    if (!model::has_tokenizer_file(path)) {
      const int64_t byte_ids = model::ByteTokenizer(true, true).vocab_size();  // --byte-tokenizer's
      if (config && config->vocab_size < byte_ids) {
        const std::string why = str("no tokenizer, and a vocabulary of ", config->vocab_size,
                                    " is too small for --byte-tokenizer (", byte_ids,
                                    " ids): twell run and twell eval need the model's tokenizer.json");
        std::printf("tokenizer: %s\n", why.c_str());
        problems.push_back(why);
      } else {
        std::printf("tokenizer: none (twell run and twell eval then need --byte-tokenizer: a byte-vocabulary model)\n");
      }
    } else {
      try {
        const std::unique_ptr<model::Tokenizer> tok = model::load_tokenizer(path);
        if (config) model::check_tokenizer_fits(*tok, config->vocab_size);  // one line either way: this, or the refusal
        std::printf("tokenizer: %lld ids%s%s%s%s\n", static_cast<long long>(tok->vocab_size()),
                    tok->bos_to_add() ? ", adds BOS " : ", no BOS added",
                    tok->bos_to_add() ? std::to_string(*tok->bos_to_add()).c_str() : "",
                    tok->eos_to_add() ? ", EOS after a text (eval) " : "",
                    tok->eos_to_add() ? std::to_string(*tok->eos_to_add()).c_str() : "");
      } catch (const Error& e) {
        std::printf("tokenizer: refused: %s\n", e.what());
        problems.push_back("twell run and twell eval refuse its tokenizer");
      }
    }
    // What `twell run --chat` renders prompts with: said, not a problem of the checkpoint where it fails.
    try {
      const std::optional<model::ChatTemplate> chat = model::load_chat_template(path);
      if (chat) std::printf("chat template: %s (twell run --chat)\n", chat->source().c_str());
      else std::printf("chat template: none (twell run --chat needs --chat-template FILE)\n");
    } catch (const Error& e) {
      std::printf("chat template: refused (twell run --chat needs --chat-template FILE): %s\n", e.what());
    }
  }

  std::printf("checkpoint: %s (%zu file%s)\n", path.c_str(), ckpt.files().size(),
              ckpt.files().size() == 1 ? "" : "s");
  for (const auto& [key, value] : ckpt.metadata())
    std::printf("  metadata %s = %s\n", printable(key, 80).c_str(), printable(value).c_str());

  // Names as the file has them, escaped and cut (a name of control bytes or a megabyte would forge
  // lines or pad every row to its width).
  const auto name_of = [](const io::TensorInfo& t) { return printable(t.name, 120); };
  const auto dtype_of = [](const io::TensorInfo& t) { return printable(t.file_dtype, 12); };
  size_t name_width = 4, dtype_width = 5, shape_width = 5;
  for (const io::TensorInfo& t : ckpt.tensors()) {
    name_width = std::max(name_width, name_of(t).size());
    dtype_width = std::max(dtype_width, dtype_of(t).size());
    shape_width = std::max(shape_width, shape_str(t.shape).size());
  }
  const bool sharded = ckpt.files().size() > 1;
  std::printf("\n%-*s  %-*s  %-*s  %10s%s\n", (int)name_width, "name", (int)dtype_width, "dtype", (int)shape_width,
              "shape", "MB", sharded ? "  file" : "");
  uint64_t params = 0, bytes = 0;
  for (const io::TensorInfo& t : ckpt.tensors()) {
    std::printf("%-*s  %-*s  %-*s  %10.2f", (int)name_width, name_of(t).c_str(), (int)dtype_width,
                dtype_of(t).c_str(), (int)shape_width,
                shape_str(t.shape).c_str(), t.nbytes() / 1e6);
    if (sharded) {
      const std::string& file = ckpt.file_of(t.name).path();
      std::printf("  %s", printable(file.substr(file.find_last_of('/') + 1), 120).c_str());
    }
    std::printf("\n");
    params += static_cast<uint64_t>(t.numel());
    bytes += t.nbytes();
  }
  std::printf("\n%zu tensor%s, %s parameters, %s bytes (%.2f MB)\n", ckpt.tensors().size(),
              ckpt.tensors().size() == 1 ? "" : "s", grouped(params).c_str(), grouped(bytes).c_str(), bytes / 1e6);
  std::fflush(stdout);
  // The whole checkpoint (a lone shard would miss tensors): a directory, an index, model.safetensors.
  const std::string base = path.substr(path.find_last_of('/') + 1);
  const bool whole = S_ISDIR(st.st_mode) || base == "model.safetensors" ||
                     (base.size() > 11 && ends_with(base, ".index.json"));
  if (config && whole)  // the reason again in the error line: stderr alone says why
    if (const std::string why = print_model_check(ckpt, *config); !why.empty())
      problems.push_back("twell run and twell eval refuse this checkpoint: " + why);
  auto fail_if_any = [&] {
    std::fflush(stdout);
    std::string all;
    for (const std::string& p : problems) all += (all.empty() ? "" : "; ") + p;
    if (!all.empty()) throw Error(all + " (above)");
  };
  if (!check_finite) {
    std::printf("finite: not scanned (the values were not read); --check-finite scans every float tensor, as "
                "twell run and eval do when they load it\n");
    fail_if_any();
    return;
  }

  size_t scanned = 0, bad = 0;
  std::map<std::string, size_t> unread;  // float tensors of dtypes twell does not read: not scanned, counted
  for (const io::TensorInfo& t : ckpt.tensors()) {
    if (!t.readable) {
      if (t.file_dtype.rfind("F", 0) == 0 || t.file_dtype == "C64") ++unread[t.file_dtype];
      continue;
    }
    if (!t.readable_float()) continue;
    ++scanned;
    try {
      ckpt.check_finite(t.name);
    } catch (const Error& e) {
      std::printf("non-finite: %s\n", e.what());
      ++bad;
    }
  }
  if (bad) {
    problems.push_back(str(bad, " of ", scanned, " float tensors hold NaN or Inf"));
  } else {
    std::printf("finite: all %zu float tensors hold only finite values\n", scanned);
  }
  if (!unread.empty()) {
    std::string list;
    for (const auto& [dtype, n] : unread) list += str(list.empty() ? "" : ", ", n, " ", dtype);
    std::printf("finite: not scanned: %s (dtypes twell does not read)\n", list.c_str());
  }
  fail_if_any();
}

}  // namespace

void register_inspect(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "Print a checkpoint's config, tensors and totals (PATH: .safetensors file, "
      "index.json, or directory)");
  auto path = std::make_shared<std::string>();
  auto check_finite = std::make_shared<bool>(false);
  cmd->add_option("path", *path, "checkpoint file or directory")->required();
  cmd->add_flag("--check-finite", *check_finite, "scan every float tensor for NaN/Inf");
  cmd->callback([path, check_finite] { run_inspect(*path, *check_finite); });
}

}  // namespace twell::cli
