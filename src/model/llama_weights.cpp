// Loading a Llama-style HuggingFace checkpoint into LlamaWeights (include/twell/model/llama.h).
//
// Every tensor is checked before any is converted: present, a float dtype (BF16, F16, F32, F64), and
// the shape the config implies; a tensor the Llama layer does not have, inside a layer the model
// runs, is refused (another architecture's weights); layers past num_hidden_layers and other
// tensors the model does not use are listed in LlamaWeights::unused. One error names every problem
// found (NaN and Inf likewise, when checked). Errors describe the input, so they carry no source
// location:
//   "<ckpt>: tensor 'model.layers.0.self_attn.k_proj.weight': expected shape [32, 64], got [64,
//   64]"
// Conversion happens once: to the storage dtype (f32 or bf16), and down_proj.weight [H, I] is
// transposed to neuron-major [I, H] (DESIGN.md §2).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/atomic_file.h"
#include "twell/error.h"
#include "twell/io/safetensors.h"
#include "twell/model/llama.h"

namespace twell::model {

namespace {

// What the config says a checkpoint must hold: name -> shape, in model order.
struct Expected {
  std::string name;
  Shape shape;
};

std::string layer_name(int64_t i, const char* suffix) {
  return str("model.layers.", i, ".", suffix);
}

// The nine tensors of layer i.
std::vector<Expected> layer_tensors(const io::ModelConfig& c, int64_t i) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  std::vector<Expected> e;
  e.push_back({layer_name(i, "input_layernorm.weight"), {H}});
  e.push_back({layer_name(i, "self_attn.q_proj.weight"), {q_dim, H}});
  e.push_back({layer_name(i, "self_attn.k_proj.weight"), {kv_dim, H}});
  e.push_back({layer_name(i, "self_attn.v_proj.weight"), {kv_dim, H}});
  e.push_back({layer_name(i, "self_attn.o_proj.weight"), {H, q_dim}});
  e.push_back({layer_name(i, "post_attention_layernorm.weight"), {H}});
  e.push_back({layer_name(i, "mlp.gate_proj.weight"), {I, H}});
  e.push_back({layer_name(i, "mlp.up_proj.weight"), {I, H}});
  e.push_back({layer_name(i, "mlp.down_proj.weight"), {H, I}});  // on disk; transposed at load
  return e;
}

// The model's tensors, in model order, with the layer tensors of `layers` (each < num_hidden_layers).
std::vector<Expected> expected_tensors(const io::ModelConfig& c, const std::set<int64_t>& layers) {
  const int64_t H = c.hidden_size, V = c.vocab_size;
  std::vector<Expected> e;
  e.push_back({"model.embed_tokens.weight", {V, H}});
  for (int64_t i : layers)
    for (Expected& t : layer_tensors(c, i)) e.push_back(std::move(t));
  e.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) e.push_back({"lm_head.weight", {V, H}});
  return e;
}

// What is wrong with one expected tensor, "" when nothing (the file is named by fail_if_any).
std::string tensor_problem(const io::Checkpoint& ckpt, const Expected& e, bool tied) {
  if (!ckpt.has(e.name)) {
    std::string hint;
    if (e.name == "lm_head.weight" && !tied)
      hint = " (config.json's tie_word_embeddings is false, the default when absent)";
    return str("missing tensor '", e.name, "' with shape ", shape_str(e.shape), hint);
  }
  const io::TensorInfo& info = ckpt.info(e.name);
  // A sharded checkpoint's problems name the shard (the error names the checkpoint).
  const std::string in = ckpt.files().size() > 1 ? str(" (in ", ckpt.file_of(e.name).path(), ")") : "";
  if (!info.readable_float())
    return str("tensor '", e.name, "'", in, ": expected dtype BF16, F16, F32 or F64, got ",
               printable(info.file_dtype, 40));
  if (info.shape != e.shape)
    return str("tensor '", e.name, "'", in, ": expected shape ", shape_str(e.shape), ", got ", shape_str(info.shape));
  return "";
}

// Throws one Error, on one line, naming every problem found in checkpoint `file` (the first
// kMaxListed of them), so that a checkpoint with several is fixed in one round rather than one
// error a run:
//   "<dir>: 3 problems with the checkpoint's tensors: missing tensor '...' ...; tensor '...': ..."
// `unlisted` more problems were counted but not put in `problems` (their names would not be shown).
constexpr size_t kMaxListed = 20;
void fail_if_any(const std::string& file, const std::vector<std::string>& problems, const std::string& what,
                 int64_t unlisted = 0) {
  if (problems.empty()) return;
  const std::string where = file.empty() ? "" : file + ": ";  // empty: the problems name their files
  const int64_t total = static_cast<int64_t>(problems.size()) + unlisted;
  if (total == 1) throw Error(where + problems[0]);
  std::string message = str(where, total, " ", what, ": ");
  for (size_t i = 0; i < problems.size() && i < kMaxListed; ++i) message += (i ? "; " : "") + problems[i];
  if (total > static_cast<int64_t>(kMaxListed)) message += str("; ... and ", total - int64_t{kMaxListed}, " more");
  throw Error(message);
}

}  // namespace

int64_t LlamaWeights::layer_of(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  const char* digits = name.c_str() + prefix.size();
  char* end = nullptr;
  const long long n = std::strtoll(digits, &end, 10);
  return end != digits && digits[0] >= '0' && digits[0] <= '9' && *end == '.' ? n : -1;
}

namespace {

// A layer's MLP weight under twell.FFN's parameter names (mlp.wg, mlp.wu, mlp.wd): a converted model saved
// with a plain state_dict.
bool twells_own_name(const std::string& name) {
  return ends_with(name, ".mlp.wg") || ends_with(name, ".mlp.wu") || ends_with(name, ".mlp.wd");
}

// Checkpoint tensors outside `expected`. One inside a layer the model runs is an error: weights
// of another architecture (attention biases, extra norms) that would be dropped silently. Layers
// past the config's, and tensors outside the layers, are listed; HF's rotary_emb.inv_freq
// buffers, which transformers recomputes too, are skipped.
std::vector<std::string> unused_tensors(const io::Checkpoint& ckpt, const std::vector<Expected>& expected,
                                        const io::ModelConfig& c, std::vector<std::string>& problems) {
  std::unordered_set<std::string> names;
  for (const Expected& e : expected) names.insert(e.name);
  std::vector<std::string> unused;
  // Foreign tensors by their name with the layer as '*' (model.layers.*.self_attn.q_proj.bias), in the
  // order first met, with how many layers have each: one problem, however many layers.
  std::vector<std::pair<std::string, int64_t>> foreign;
  std::unordered_map<std::string, size_t> foreign_at;  // pattern -> its index in `foreign` (a header may hold ~1M names)
  std::string first_foreign;
  for (const io::TensorInfo& t : ckpt.tensors()) {
    if (names.count(t.name)) continue;
    if (ends_with(t.name, "rotary_emb.inv_freq")) continue;
    const int64_t layer = LlamaWeights::layer_of(t.name);
    if (layer < 0 || layer >= c.num_hidden_layers) {
      unused.push_back(t.name);
      continue;
    }
    if (first_foreign.empty()) first_foreign = t.name;
    const size_t dot = t.name.find('.', std::strlen("model.layers."));
    const std::string pattern = "model.layers.*" + t.name.substr(dot);
    const auto [it, added] = foreign_at.try_emplace(pattern, foreign.size());
    if (added) foreign.emplace_back(pattern, 1);
    else ++foreign[it->second].second;
  }
  const std::string why = str(" not part of the Llama layer twell runs (model_type ", c.model_type,
                              "): its model (attention biases? extra norms?) would run wrong without ");
  if (foreign.size() == 1 && foreign[0].second == 1) {
    problems.push_back(str("tensor '", printable(first_foreign, 120), "' is", why, "it"));
  } else if (!foreign.empty()) {
    int64_t total = 0;
    std::string list;
    for (size_t i = 0; i < foreign.size(); ++i) {
      total += foreign[i].second;
      if (i < 6)
        list += str(i ? ", " : "", "'", printable(foreign[i].first, 120), "' (", foreign[i].second, " layer",
                    foreign[i].second == 1 ? "" : "s", ")");
    }
    if (foreign.size() > 6) list += str(", and ", foreign.size() - 6, " more names");
    problems.push_back(str(total, " tensors ", list, " are", why, "them"));
  }
  return unused;
}

// [rows, cols] -> [cols, rows], any 2-byte or 4-byte element.
Tensor transpose(const Tensor& t) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  Tensor out(t.dtype(), {cols, rows});
  const size_t es = dtype_size(t.dtype());
  const auto* src = static_cast<const uint8_t*>(t.view().data);
  auto* dst = static_cast<uint8_t*>(out.view().data);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(dst + (c * rows + r) * es, src + (r * cols + c) * es, es);
  return out;
}

}  // namespace

namespace {

// The config as the Llama runtime takes it: valid, and an activation it runs. `source` names it.
void check_runtime_config(const io::ModelConfig& config, const std::string& source) {
  config.validate(source);
  if (config.hidden_act != "relu" && config.hidden_act != "silu")
    throw Error(str(source, ": hidden_act '", config.hidden_act,
                    "' is not supported by the Llama runtime (it runs relu and silu)"));
}

// LlamaWeights::check. `source` names the config in messages: its file where it came from one.
// Only the layers the checkpoint has tensors of are checked tensor by tensor; those it lacks
// altogether are named while the list has room, then counted: a config.json claiming 10^9 layers, or
// a stray tensor of layer 10^6, fails at once, not after building millions of names. Returns the
// unused tensors; `tensors`, when given, gets every tensor the model reads (all present, as the check
// passed).
std::vector<std::string> check_against(const io::Checkpoint& ckpt, const io::ModelConfig& config,
                                       const std::string& source, std::vector<Expected>* tensors = nullptr) {
  check_runtime_config(config, source);
  std::set<int64_t> present;  // the model's layers the checkpoint has a tensor of
  int64_t own = 0;             // layer tensors under twell.FFN's names, the first of them
  std::string first_own;
  for (const io::TensorInfo& t : ckpt.tensors()) {
    const int64_t layer = LlamaWeights::layer_of(t.name);
    if (layer >= 0 && layer < config.num_hidden_layers) present.insert(layer);
    if (layer >= 0 && twells_own_name(t.name) && own++ == 0) first_own = t.name;
  }
  // A converted model saved with twell.FFN's names: said alone, before the missing HF tensors it causes.
  if (own > 0)
    throw Error(str(ckpt.path(), ": ", own, " tensor", own == 1 ? " has" : "s have", " twell.FFN's names, not HF's (e.g. '",
                    printable(first_own, 120), "'): a model converted by twell.replace_hf_mlps saves as HF's checkpoint "
                    "with save_pretrained(dir, state_dict=twell.hf_state_dict(model))"));
  std::vector<Expected> expected = expected_tensors(config, present);
  std::vector<std::string> problems;
  for (const Expected& e : expected)
    if (std::string p = tensor_problem(ckpt, e, config.tie_word_embeddings); !p.empty()) problems.push_back(p);
  const int64_t missing = config.num_hidden_layers - static_cast<int64_t>(present.size());
  int64_t named = 0;
  for (int64_t i = 0; named < missing && problems.size() <= kMaxListed; ++i) {
    if (present.count(i)) continue;
    for (const Expected& e : layer_tensors(config, i)) problems.push_back(tensor_problem(ckpt, e, config.tie_word_embeddings));
    ++named;
  }
  const int64_t rest = missing - named, most = std::numeric_limits<int64_t>::max() / 2;
  const int64_t unlisted = rest < most / 9 ? rest * 9 : most;  // nine tensors a layer, saturated past 10^18 layers
  std::vector<std::string> unused = unused_tensors(ckpt, expected, config, problems);
  fail_if_any(ckpt.path(), problems, "problems with the checkpoint's tensors", unlisted);
  if (tensors) *tensors = std::move(expected);  // every layer's: a layer missing would have failed above
  return unused;
}

}  // namespace

std::vector<std::string> LlamaWeights::check(const io::Checkpoint& ckpt, const io::ModelConfig& config) {
  return check_against(ckpt, config, "config");
}

namespace {

// LlamaWeights::load, with `source` naming the config in messages.
LlamaWeights load_weights(const io::Checkpoint& ckpt, const io::ModelConfig& config, const LlamaLoadOptions& options,
                          const std::string& source) {
  if (options.dtype != DType::f32 && options.dtype != DType::bf16)
    throw Error(str("LlamaWeights::load: storage dtype must be f32 or bf16, got ",
                    dtype_name(options.dtype)));
  // Validate everything first, so a bad checkpoint fails before any conversion and names every bad
  // tensor.
  std::vector<Expected> expected;
  std::vector<std::string> unused = check_against(ckpt, config, source, &expected);
  if (options.check_finite) {
    std::vector<std::string> non_finite;
    for (const Expected& e : expected) {
      try {
        ckpt.check_finite(e.name);
      } catch (const Error& err) {  // "<file>: tensor '...': element ... is NaN (...)"
        non_finite.push_back(err.what());
      }
    }
    fail_if_any("", non_finite, "tensors hold NaN or Inf");
  }

  auto read = [&](const std::string& name) { return ckpt.read_as(name, options.dtype); };
  LlamaWeights w;
  w.config = config;
  w.unused = std::move(unused);
  w.embed = read("model.embed_tokens.weight");
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    LlamaLayerWeights l;
    l.input_norm = read(layer_name(i, "input_layernorm.weight"));
    l.wq = read(layer_name(i, "self_attn.q_proj.weight"));
    l.wk = read(layer_name(i, "self_attn.k_proj.weight"));
    l.wv = read(layer_name(i, "self_attn.v_proj.weight"));
    l.wo = read(layer_name(i, "self_attn.o_proj.weight"));
    l.post_norm = read(layer_name(i, "post_attention_layernorm.weight"));
    l.wg = read(layer_name(i, "mlp.gate_proj.weight"));
    l.wu = read(layer_name(i, "mlp.up_proj.weight"));
    l.wd = transpose(read(layer_name(i, "mlp.down_proj.weight")));  // [H, I] -> [I, H]
    w.layers.push_back(std::move(l));
  }
  w.final_norm = read("model.norm.weight");
  if (!config.tie_word_embeddings) {
    w.lm_head = read("lm_head.weight");
  } else if (ckpt.has("lm_head.weight") && ckpt.info("lm_head.weight").shape == w.embed.shape() &&
             ckpt.info("lm_head.weight").readable_float()) {
    // Tied in config.json, yet a head of its own in the checkpoint: transformers 5 keeps it untied
    // where its values differ from the embedding's (and says so), so the logits are that head's.
    Tensor head = read("lm_head.weight");
    if (std::memcmp(head.view().data, w.embed.view().data, head.nbytes()) != 0) {
      if (options.check_finite) ckpt.check_finite("lm_head.weight");  // not among the tensors scanned above
      w.config.tie_word_embeddings = false;
      w.lm_head = std::move(head);
      w.head_untied = true;
      w.unused.erase(std::remove(w.unused.begin(), w.unused.end(), "lm_head.weight"), w.unused.end());
    }
  }
  return w;
}

}  // namespace

void LlamaWeights::validate() const {
  check_runtime_config(config, "LlamaWeights: config");
  const io::ModelConfig& c = config;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t q_dim = c.num_attention_heads * c.head_dim, kv_dim = c.num_key_value_heads * c.head_dim;
  TWELL_REQUIRE(static_cast<int64_t>(layers.size()) == c.num_hidden_layers, "LlamaWeights: ", layers.size(),
                " layers, the config has ", c.num_hidden_layers);
  const DType dt = embed.dtype();
  TWELL_REQUIRE(dt == DType::f32 || dt == DType::bf16, "LlamaWeights: embed: dtype must be f32 or bf16, got ",
                dtype_name(dt));
  auto check = [&](const Tensor& t, const Shape& s, const std::string& name) {
    TWELL_REQUIRE(t.shape() == s, "LlamaWeights: ", name, ": expected shape ", shape_str(s), ", got ",
                  shape_str(t.shape()));
    TWELL_REQUIRE(t.dtype() == dt, "LlamaWeights: ", name, ": dtype ", dtype_name(t.dtype()), ", embed's is ",
                  dtype_name(dt), " (one dtype for every weight)");
  };
  check(embed, {V, H}, "embed");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LlamaLayerWeights& l = layers[static_cast<size_t>(i)];
    const std::string p = str("layers[", i, "].");
    check(l.input_norm, {H}, p + "input_norm");
    check(l.wq, {q_dim, H}, p + "wq");
    check(l.wk, {kv_dim, H}, p + "wk");
    check(l.wv, {kv_dim, H}, p + "wv");
    check(l.wo, {H, q_dim}, p + "wo");
    check(l.post_norm, {H}, p + "post_norm");
    check(l.wg, {I, H}, p + "wg");
    check(l.wu, {I, H}, p + "wu");
    check(l.wd, {I, H}, p + "wd (neuron-major: the transpose of down_proj.weight)");
  }
  check(final_norm, {H}, "final_norm");
  if (c.tie_word_embeddings) {
    TWELL_REQUIRE(lm_head.empty(), "LlamaWeights: lm_head must be empty when the config ties the embeddings");
  } else {
    check(lm_head, {V, H}, "lm_head");
  }
}

LlamaWeights LlamaWeights::load(const io::Checkpoint& ckpt, const io::ModelConfig& config,
                                const LlamaLoadOptions& options) {
  return load_weights(ckpt, config, options, "config");
}

size_t LlamaWeights::bytes_for(const io::ModelConfig& config, DType dtype) {
  // Saturating: a config's dimensions are bounded one by one, not their products.
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  const auto add = [](size_t a, size_t b) { return a > kMax - b ? kMax : a + b; };
  size_t layer = 0;
  for (const Expected& e : layer_tensors(config, 0)) layer = add(layer, checked_nbytes(dtype, e.shape));
  const size_t layers = static_cast<size_t>(config.num_hidden_layers);
  size_t n = layers != 0 && layer > kMax / layers ? kMax : layer * layers;
  for (const Expected& e : expected_tensors(config, {})) n = add(n, checked_nbytes(dtype, e.shape));
  return n;
}

LlamaWeights LlamaWeights::load_dir(const std::string& dir, const LlamaLoadOptions& options) {
  io::check_model_directory(dir);
  const io::ModelConfig config = io::read_config(dir);
  return load_weights(io::Checkpoint::open(dir), config, options, io::config_file(dir));
}

void LlamaWeights::save_dir(const std::string& dir) const {
  validate();
  std::error_code ec;
  std::vector<std::filesystem::path> made;  // the directories created here, deepest first
  for (std::filesystem::path p = std::filesystem::absolute(dir, ec); !ec && p.has_relative_path();
       p = p.parent_path()) {
    if (std::filesystem::exists(p, ec) || ec) break;
    made.push_back(p);
  }
  std::filesystem::create_directories(dir, ec);
  TWELL_REQUIRE(!ec, dir, ": cannot create the directory: ", ec.message());
  try {
    write_dir(dir);
  } catch (...) {
    for (const std::filesystem::path& p : made) std::filesystem::remove(p, ec);  // empty again: changes nothing
    throw;
  }
  for (const std::filesystem::path& p : made) io::detail::sync_directory(p.parent_path().string());  // their entries
}

void LlamaWeights::write_dir(const std::string& dir) const {
  const int64_t H = config.hidden_size, I = config.intermediate_size;
  const size_t e = dtype_size(dtype());
  std::vector<Tensor> down;  // each layer's wd as it is on disk, [H, I]
  std::vector<std::pair<std::string, TensorView>> tensors{{"model.embed_tokens.weight", embed.view()}};
  for (size_t i = 0; i < layers.size(); ++i) {
    const LlamaLayerWeights& l = layers[i];
    const auto* src = static_cast<const char*>(l.wd.view().data);
    Tensor t(dtype(), {H, I});
    auto* dst = static_cast<char*>(t.view().data);
    for (int64_t n = 0; n < I; ++n)
      for (int64_t h = 0; h < H; ++h) std::memcpy(dst + (h * I + n) * e, src + (n * H + h) * e, e);
    down.push_back(std::move(t));
    const int64_t li = static_cast<int64_t>(i);
    for (const auto& [suffix, view] : std::vector<std::pair<const char*, TensorView>>{
             {"input_layernorm.weight", l.input_norm.view()}, {"self_attn.q_proj.weight", l.wq.view()},
             {"self_attn.k_proj.weight", l.wk.view()}, {"self_attn.v_proj.weight", l.wv.view()},
             {"self_attn.o_proj.weight", l.wo.view()}, {"post_attention_layernorm.weight", l.post_norm.view()},
             {"mlp.gate_proj.weight", l.wg.view()}, {"mlp.up_proj.weight", l.wu.view()},
             {"mlp.down_proj.weight", down.back().view()}})
      tensors.emplace_back(layer_name(li, suffix), view);
  }
  tensors.emplace_back("model.norm.weight", final_norm.view());
  if (!config.tie_word_embeddings) tensors.emplace_back("lm_head.weight", lm_head.view());
  // config.json's temporary first, written and synced (its path's checks: another user's link, not a
  // regular file), the weights next, the config renamed last: a failure before that rename leaves the
  // earlier model (or none) as it was; only the rename itself failing after the weights' would leave
  // new weights under the old config.
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  config.validate(config_path);
  io::detail::AtomicFile config_file(config_path);
  const std::string text = config.to_json();
  config_file.write(text.data(), text.size());
  config_file.sync();
  io::write_safetensors((std::filesystem::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  config_file.commit();
}

}  // namespace twell::model
