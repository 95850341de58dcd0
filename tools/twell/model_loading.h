// Shared by `twell run` and `twell eval`: a model directory's weights and tokenizer.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "twell/model/llama.h"
#include "twell/model/tokenizer.h"

namespace twell::cli {

struct ModelArgs {
  std::string dir;
  bool byte_tokenizer = false;  // ids 0..255 are bytes, BOS 256, EOS 257 (our own small models)
  bool bf16_ffn = false;        // round the ReLU FFN like a bf16 model (default: fp32 math)
  bool check_finite = false;

  void add_to(CLI::App* cmd);
  model::LlamaCpu load_model() const;  // prints what it loads on stderr
  std::unique_ptr<model::Tokenizer> load_tokenizer(const model::LlamaCpu& m) const;
};

}  // namespace twell::cli
