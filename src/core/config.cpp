// HuggingFace Llama-style config.json: strict reader, validation and atomic writer (config.h).
#include "twell/io/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>

#include "atomic_file.h"
#include "json_util.h"
#include "twell/error.h"

namespace twell::io {

using json = nlohmann::json;

namespace {

// The value of `key`, or nullptr when it is absent or null (HF writes null for "unset").
const json* find_key(const json& root, const char* key) {
  auto it = root.find(key);
  return it == root.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrong_type(const std::string& source, const char* key, const char* expected,
                             const json& value) {
  throw Error(str(source, ": key '", key, "' must be ", expected, ", got ", value.type_name(), " ",
                  printable(value.dump(), 60)));
}

bool read_int(const json& root, const char* key, const std::string& source, int64_t* out) {
  const json* v = find_key(root, key);
  if (!v) return false;
  if (!v->is_number_integer()) wrong_type(source, key, "an integer", *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw Error(str(source, ": key '", key, "' is ", v->get<uint64_t>(),
                    ", past the largest integer twell reads (2^63 - 1)"));
  *out = v->get<int64_t>();
  return true;
}

void read_required_int(const json& root, const char* key, const std::string& source, int64_t* out) {
  if (!read_int(root, key, source, out))
    throw Error(str(source, ": missing required key '", key, "'"));
}

bool read_number(const json& root, const char* key, const std::string& source, double* out) {
  const json* v = find_key(root, key);
  if (!v) return false;
  if (!v->is_number()) wrong_type(source, key, "a number", *v);
  *out = v->get<double>();
  return true;
}

bool read_string(const json& root, const char* key, const std::string& source, std::string* out) {
  const json* v = find_key(root, key);
  if (!v) return false;
  if (!v->is_string()) wrong_type(source, key, "a string", *v);
  *out = v->get<std::string>();
  return true;
}

// All the digits a double needs to be read back as itself (1000001, not 1e+06).
std::string exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// One "rope_scaling" / "rope_parameters" object: its kind and the keys that kind needs (their
// values are checked by validate()). Kinds twell does not implement are refused, since the model
// would otherwise run, wrongly. No type, or "default", means no scaling.
RopeScaling read_rope_scaling(const json& scaling, const char* key, const std::string& source) {
  RopeScaling r;
  if (!scaling.is_object()) wrong_type(source, key, "an object", scaling);
  const std::string where = str(source, ": ", key);
  for (const char* type_key : {"rope_type", "type"})
    if (read_string(scaling, type_key, where, &r.type)) break;
  if (r.none()) return r;
  if (r.type != "linear" && r.type != "llama3")
    throw Error(str(where, " of type '", printable(r.type, 40),
                    "' is not supported (twell implements 'linear' and 'llama3'), so this model would run wrong"));
  auto missing = [&](const char* name) {
    return Error(str(where, " of type '", r.type, "' needs the key '", name, "'"));
  };
  if (!read_number(scaling, "factor", where, &r.factor)) throw missing("factor");
  if (r.type == "llama3") {
    if (!read_number(scaling, "low_freq_factor", where, &r.low_freq_factor)) throw missing("low_freq_factor");
    if (!read_number(scaling, "high_freq_factor", where, &r.high_freq_factor)) throw missing("high_freq_factor");
    // Absent: -1 here, then resolved as transformers 5 does (read_rope).
    if (!read_int(scaling, "original_max_position_embeddings", where, &r.original_max_position_embeddings))
      r.original_max_position_embeddings = -1;
  }
  return r;
}

// The RoPE of a config as transformers 5 reads it (PreTrainedConfig.convert_rope_params_to_dict,
// standardize_rope_params): one dict of parameters, "rope_scaling" (the older key) where it is given
// and not empty, else "rope_parameters"; rope_theta from that dict, else the top level, else 10000;
// for llama3, original_max_position_embeddings from the top level (Phi-3's place, which transformers
// puts first), else the dict, else max_position_embeddings. Where the places disagree (transformers 4
// read some of them otherwise) the config is refused rather than read one way: rope_scaling against
// rope_parameters (their scaling, and a theta either gives), a top-level rope_theta or
// original_max_position_embeddings against the dict's.
void read_rope(const json& root, const std::string& source, ModelConfig& c) {
  const json* legacy = find_key(root, "rope_scaling");
  const json* params = find_key(root, "rope_parameters");
  if (legacy && legacy->is_object() && legacy->empty()) legacy = nullptr;  // falsy in transformers' `or`
  const RopeScaling a = legacy ? read_rope_scaling(*legacy, "rope_scaling", source) : RopeScaling{};
  const RopeScaling b = params ? read_rope_scaling(*params, "rope_parameters", source) : RopeScaling{};
  if (legacy && params && a != b) {  // a "default" one holds the defaults of every parameter
    // The original context's -1 is read_rope_scaling's "absent"; the factors' values are as given.
    const auto context = [](int64_t v) { return v == -1 ? std::string("absent") : std::to_string(v); };
    const std::pair<const char*, std::pair<std::string, std::string>> fields[] = {
        {"factor", {exact(a.factor), exact(b.factor)}},
        {"low_freq_factor", {exact(a.low_freq_factor), exact(b.low_freq_factor)}},
        {"high_freq_factor", {exact(a.high_freq_factor), exact(b.high_freq_factor)}},
        {"original_max_position_embeddings",
         {context(a.original_max_position_embeddings), context(b.original_max_position_embeddings)}}};
    std::string what = str("types '", printable(a.type, 40), "' and '", printable(b.type, 40), "'");
    for (const auto& [field, values] : fields)
      if (a.type == b.type && values.first != values.second) {
        what = str(field, " ", values.first, " and ", values.second);
        break;
      }
    throw Error(str(source, ": rope_scaling and rope_parameters disagree (", what, ")"));
  }
  const json* used = legacy ? legacy : params;
  const char* used_key = legacy ? "rope_scaling" : "rope_parameters";
  c.rope_scaling = legacy ? a : b;

  // rope_theta: each place that gives one must give the one used.
  const bool top_theta = read_number(root, "rope_theta", source, &c.rope_theta);
  std::vector<std::pair<std::string, double>> thetas;  // (where, value) of every place that says it
  if (top_theta) thetas.emplace_back("rope_theta", c.rope_theta);
  for (const auto& [dict, key] : {std::pair{legacy, "rope_scaling"}, std::pair{params, "rope_parameters"}}) {
    double theta = 0;
    if (dict && dict->is_object() && read_number(*dict, "rope_theta", str(source, ": ", key), &theta))
      thetas.emplace_back(str(key, ".rope_theta"), theta);
  }
  const bool dict_theta =
      used && used->is_object() && read_number(*used, "rope_theta", str(source, ": ", used_key), &c.rope_theta);
  const std::string taken = dict_theta ? str(used_key, ".rope_theta") : top_theta ? "rope_theta" : "the default";
  for (const auto& [where, theta] : thetas)
    if (theta != c.rope_theta)
      throw Error(str(source, ": ", where, " ", exact(theta), " and ", taken, " ", exact(c.rope_theta),
                      ", which transformers takes, disagree"));

  // A part of each head rotated (StableLM's and Phi's arithmetic), in the dict as transformers 5 writes
  // it: refused as at the top level.
  double partial = 1;
  if (used && used->is_object() && read_number(*used, "partial_rotary_factor", str(source, ": ", used_key), &partial) &&
      partial != 1)
    throw Error(str(source, ": ", used_key, ".partial_rotary_factor ", exact(partial),
                    " is not supported: twell rotates every dimension of a head (1)"));

  RopeScaling& r = c.rope_scaling;
  if (r.type != "llama3") return;
  int64_t top = 0;
  if (read_int(root, "original_max_position_embeddings", source, &top)) {
    if (r.original_max_position_embeddings != -1 && r.original_max_position_embeddings != top)
      throw Error(str(source, ": original_max_position_embeddings ", top, " and ", used_key,
                      ".original_max_position_embeddings ", r.original_max_position_embeddings,
                      " disagree (transformers 5 takes the first, 4 the second)"));
    r.original_max_position_embeddings = top;
  }
  if (r.original_max_position_embeddings == -1) r.original_max_position_embeddings = c.max_position_embeddings;
}

// A sliding window shorter than the context changes which keys a query sees: refused, since the
// model would otherwise run, wrongly. Mistral as transformers reads it: an absent sliding_window is
// 4096 (MistralConfig's default), only null switches it off, and use_sliding_window (Qwen2's key)
// is ignored. For llama, null, absence and use_sliding_window false pass.
void refuse_sliding_window(const json& root, const ModelConfig& c, const std::string& source) {
  const bool mistral = c.model_type == "mistral";
  const auto it = root.find("sliding_window");
  const bool absent = it == root.end();
  if ((absent && !mistral) || (!absent && it->is_null())) return;
  if (!absent && !it->is_number()) wrong_type(source, "sliding_window", "a number or null", *it);
  const double window = absent ? 4096.0 : it->get<double>();
  if (!mistral) {
    const json* use = find_key(root, "use_sliding_window");
    if (use && use->is_boolean() && !use->get<bool>()) return;
  }
  if (window < double(c.max_position_embeddings))
    throw Error(str(source, ": sliding_window ", exact(window), absent ? " (absent: MistralConfig's default)" : "",
                    " is shorter than max_position_embeddings ", c.max_position_embeddings,
                    ", which is not supported: twell attends over the whole context"));
}

// "eos_token_id" and the like: absent, null, one id or a list of ids (Llama 3 Instruct's three).
std::vector<int32_t> read_token_ids(const json& root, const char* key, const std::string& source) {
  const json* v = find_key(root, key);
  if (!v) return {};
  auto id = [&](const json& e) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > std::numeric_limits<int32_t>::max())
      wrong_type(source, key, "a token id or a list of token ids", *v);
    return static_cast<int32_t>(e.get<int64_t>());
  };
  std::vector<int32_t> ids;
  if (v->is_array()) {
    for (const json& e : *v) ids.push_back(id(e));
  } else {
    ids.push_back(id(*v));
  }
  return ids;
}

}  // namespace

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& source) {
  json root = detail::parse_json_strict(text.data(), text.data() + text.size(), source, "config");
  if (!root.is_object())
    throw Error(str(source, ": config must be a JSON object, got ", root.type_name()));

  ModelConfig c;
  read_string(root, "model_type", source, &c.model_type);
  read_required_int(root, "hidden_size", source, &c.hidden_size);
  read_required_int(root, "intermediate_size", source, &c.intermediate_size);
  read_required_int(root, "num_hidden_layers", source, &c.num_hidden_layers);
  read_required_int(root, "num_attention_heads", source, &c.num_attention_heads);
  read_required_int(root, "vocab_size", source, &c.vocab_size);
  read_required_int(root, "max_position_embeddings", source, &c.max_position_embeddings);
  // Absent: LlamaConfig takes num_attention_heads, MistralConfig its default of 8.
  if (!read_int(root, "num_key_value_heads", source, &c.num_key_value_heads))
    c.num_key_value_heads = c.model_type == "mistral" ? 8 : c.num_attention_heads;
  // Without head_dim, transformers takes hidden_size / num_attention_heads, which must then divide;
  // given, the heads need not span hidden_size (q_proj is [heads · head_dim, hidden_size]).
  if (!read_int(root, "head_dim", source, &c.head_dim) && c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0)
      throw Error(str(source, ": hidden_size ", c.hidden_size, " is not divisible by num_attention_heads ",
                      c.num_attention_heads, ", and no head_dim is given"));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  read_number(root, "rms_norm_eps", source, &c.rms_norm_eps);
  if (const json* tie = find_key(root, "tie_word_embeddings")) {
    if (!tie->is_boolean()) wrong_type(source, "tie_word_embeddings", "true or false", *tie);
    c.tie_word_embeddings = tie->get<bool>();
  }
  read_string(root, "hidden_act", source, &c.hidden_act);
  if (c.hidden_act == "swish") c.hidden_act = "silu";  // transformers' ACT2FN: the same function
  if (!read_string(root, "torch_dtype", source, &c.torch_dtype))
    read_string(root, "dtype", source, &c.torch_dtype);
  read_rope(root, source, c);  // rope_theta and rope_scaling
  refuse_sliding_window(root, c, source);
  // RoPE on a part of each head (StableLM's and Phi's arithmetic): transformers' Llama does not run
  // it either, so a config that asks for it would run here wrongly.
  double partial = 1;
  if (read_number(root, "partial_rotary_factor", source, &partial) && partial != 1)
    throw Error(str(source, ": partial_rotary_factor ", exact(partial),
                    " is not supported: twell rotates every dimension of a head (1)"));
  c.eos_token_ids = read_token_ids(root, "eos_token_id", source);
  c.validate(source);
  return c;
}

std::string ModelConfig::to_json() const {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = model_type;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  if (!rope_scaling.none()) {
    nlohmann::ordered_json r;
    r["rope_type"] = rope_scaling.type;
    r["factor"] = rope_scaling.factor;
    if (rope_scaling.type == "llama3") {
      r["low_freq_factor"] = rope_scaling.low_freq_factor;
      r["high_freq_factor"] = rope_scaling.high_freq_factor;
      r["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = r;
  }
  j["rms_norm_eps"] = rms_norm_eps;
  if (model_type == "mistral") j["sliding_window"] = nullptr;  // absent would read as 4096
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = hidden_act;
  if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  return j.dump(2) + "\n";
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) throw Error(str(source, ": ", key, " must be positive, got ", v));
  };
  // Architectures with Llama's tensor names but other arithmetic (Granite's and MiniCPM's
  // multipliers, SmolLM3's layers without RoPE) would load and run, wrongly.
  if (model_type != "llama" && model_type != "mistral")
    throw Error(str(source, ": model_type '", printable(model_type, 40),
                    "' is not supported: twell runs 'llama' (and 'mistral' without a sliding window)"));
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  // Bounds far above any model's, so that the tensors' element counts (products of two or three
  // of these) cannot overflow.
  auto bounded = [&](const char* key, int64_t v, int64_t limit) {
    if (v > limit) throw Error(str(source, ": ", key, " ", v, " is larger than twell supports (", limit, ")"));
  };
  constexpr int64_t kMaxDim = int64_t{1} << 20, kMaxVocab = int64_t{1} << 24;
  bounded("hidden_size", hidden_size, kMaxDim);
  bounded("intermediate_size", intermediate_size, kMaxDim);
  bounded("num_hidden_layers", num_hidden_layers, kMaxDim);
  bounded("num_attention_heads", num_attention_heads, kMaxDim);
  bounded("head_dim", head_dim, kMaxDim);
  bounded("vocab_size", vocab_size, kMaxVocab);
  bounded("max_position_embeddings", max_position_embeddings, int64_t{1} << 31);
  if (num_attention_heads % num_key_value_heads != 0)
    throw Error(str(source, ": num_attention_heads ", num_attention_heads,
                    " is not a multiple of num_key_value_heads ", num_key_value_heads));
  if (head_dim % 2 != 0)
    throw Error(str(source, ": head_dim must be even for rotary embeddings, got ", head_dim));
  if (!(std::isfinite(rope_theta) && rope_theta > 0))
    throw Error(str(source, ": rope_theta must be a positive number, got ", rope_theta));
  const RopeScaling& r = rope_scaling;
  if (!r.none()) {
    if (r.type != "linear" && r.type != "llama3")
      throw Error(str(source, ": rope_scaling type must be default, linear or llama3, got '",
                      printable(r.type, 40), "'"));
    if (!(std::isfinite(r.factor) && r.factor > 0))
      throw Error(str(source, ": rope_scaling factor must be a positive number, got ", r.factor));
  }
  if (r.type == "llama3") {
    if (!(std::isfinite(r.low_freq_factor) && r.low_freq_factor > 0 && std::isfinite(r.high_freq_factor) &&
          r.high_freq_factor > r.low_freq_factor))
      throw Error(str(source, ": rope_scaling needs 0 < low_freq_factor < high_freq_factor, got ", r.low_freq_factor,
                      " and ", r.high_freq_factor));
    if (r.original_max_position_embeddings <= 0)
      throw Error(str(source, ": rope_scaling original_max_position_embeddings must be positive, got ",
                      r.original_max_position_embeddings));
  }
  // Each finite and positive as the float the GPU's table holds (rope_theta 1e-300 passes the checks above and
  // gives infinite angles: NaN logits, blamed on the weights).
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float f = rope_inv_freq<float>(i);  // and its angle at the last position finite too
    if (!(std::isfinite(f) && f > 0 && std::isfinite(f * static_cast<float>(max_position_embeddings))))
      throw Error(str(source, ": rope_theta ", rope_theta, r.none() ? "" : " with its rope_scaling",
                      " gives rotary pair ", i, " the inverse frequency ", f, " in float; expected a finite positive "
                      "one, finite at every position too (rope_theta is usually 1e4 to 1e6)"));
  }
  if (!(std::isfinite(rms_norm_eps) && rms_norm_eps > 0))
    throw Error(str(source, ": rms_norm_eps must be a positive number, got ", rms_norm_eps));
  // The norms add it in float: 1e-50 rounds to 0 there (a zero row then normalises to NaN) and 1e39 to
  // infinity (every row to zero).
  if (const float eps = static_cast<float>(rms_norm_eps); !(std::isfinite(eps) && eps >= FLT_MIN))
    throw Error(str(source, ": rms_norm_eps ", rms_norm_eps, " is ", eps, " in float, which the norms add; expected a "
                    "finite normal float (rms_norm_eps is usually 1e-6 to 1e-5)"));
  static const char* const kActivations[] = {"relu", "silu", "gelu", "gelu_pytorch_tanh"};
  bool known = false;
  for (const char* a : kActivations) known = known || hidden_act == a;
  if (!known)
    throw Error(str(source, ": hidden_act '", printable(hidden_act),
                    "' is not an activation twell knows (relu, silu, gelu, gelu_pytorch_tanh; the Llama runtime runs "
                    "relu and silu)"));
}

// The sampling keys of a generation config's JSON (GenerationDefaults), and the keys transformers would
// apply that twell does not, with their GenerationConfig defaults (null: none).
GenerationDefaults read_generation_defaults(const json& root, const std::string& source) {
  GenerationDefaults g;
  g.source = source;
  const auto kept = [&](const char* key, const auto& read) {  // a key of the wrong type: its error kept
    try {
      read();
    } catch (const Error& e) {
      g.errors.emplace_back(key, e.what());
    }
  };
  kept("do_sample", [&] {
    if (const json* v = find_key(root, "do_sample")) {
      if (!v->is_boolean()) wrong_type(source, "do_sample", "true or false", *v);
      g.do_sample = v->get<bool>();
    }
  });
  for (auto [key, field] : {std::pair{"temperature", &g.temperature}, std::pair{"top_p", &g.top_p},
                            std::pair{"min_p", &g.min_p}, std::pair{"repetition_penalty", &g.repetition_penalty}})
    kept(key, [&, key = key, field = field] {
      if (double v = 0; read_number(root, key, source, &v)) *field = v;
    });
  kept("top_k", [&] {
    if (int64_t v = 0; read_int(root, "top_k", source, &v)) g.top_k = v;
  });
  static const std::pair<const char*, json> kUnapplied[] = {
      {"num_beams", 1},          {"num_beam_groups", 1},          {"num_return_sequences", 1},
      {"typical_p", 1.0},        {"epsilon_cutoff", 0.0},         {"eta_cutoff", 0.0},
      {"no_repeat_ngram_size", 0}, {"encoder_no_repeat_ngram_size", 0}, {"encoder_repetition_penalty", 1.0},
      {"diversity_penalty", 0.0}, {"min_length", 0},              {"min_new_tokens", nullptr},
      {"penalty_alpha", nullptr}, {"top_h", nullptr},             {"guidance_scale", nullptr},
      {"suppress_tokens", nullptr}, {"begin_suppress_tokens", nullptr}, {"bad_words_ids", nullptr},
      {"sequence_bias", nullptr}, {"forced_bos_token_id", nullptr}, {"forced_eos_token_id", nullptr},
      {"exponential_decay_length_penalty", nullptr}, {"dola_layers", nullptr}, {"watermarking_config", nullptr}};
  for (const auto& [key, default_value] : kUnapplied) {
    const auto it = root.find(key);
    if (it == root.end() || it->is_null() || *it == default_value || (it->is_array() && it->empty()) ||
        (std::string_view(key) == "guidance_scale" && *it == json(1.0)))
      continue;
    g.unapplied += str(g.unapplied.empty() ? "" : ", ", key, " ", printable(it->dump(), 40));
  }
  return g;
}

ModelConfig read_config(const std::string& path) {
  const std::string file = config_file(path);
  const bool dir = file != path;
  struct stat st;
  if (dir && ::stat(file.c_str(), &st) != 0 && errno == ENOENT) {
    if (std::string link = detail::dangling_link(file); !link.empty()) throw Error(link);
    throw Error(str(path, ": not a model directory (no config.json)"));
  }
  const std::string config_text = detail::read_text_file(file);
  ModelConfig c = ModelConfig::from_json(config_text, file);
  // generate() in transformers stops on generation_config.json's eos_token_id, which may list
  // more ids than config.json's (Llama 3 Instruct): both are kept.
  const std::string gen = path + "/generation_config.json";
  if (dir && ::stat(gen.c_str(), &st) == 0) {
    // A file that cannot be read is kept as its error (GenerationDefaults::unreadable): it stops `run`
    // where it would take the file's values, not `eval` or a run told to ignore it.
    std::vector<int32_t> eos;
    try {
      const std::string text = detail::read_text_file(gen);
      const json root = detail::parse_json_strict(text.data(), text.data() + text.size(), gen, "generation config");
      if (!root.is_object()) throw Error(str(gen, ": must be a JSON object, got ", root.type_name()));
      eos = read_token_ids(root, "eos_token_id", gen);
      c.generation = read_generation_defaults(root, gen);
    } catch (const Error& e) {
      c.generation = GenerationDefaults{};
      c.generation.source = gen;
      c.generation.unreadable = e.what();
      eos.clear();
    }
    for (int32_t id : eos)
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
        c.eos_token_ids.push_back(id);
  } else {  // transformers' GenerationConfig.from_model_config: config.json's keys
    c.generation = read_generation_defaults(
        detail::parse_json_strict(config_text.data(), config_text.data() + config_text.size(), file, "config"), file);
    if (!c.generation.any() && c.generation.unapplied.empty()) c.generation.source.clear();
  }
  return c;
}

void check_model_directory(const std::string& path) {
  TWELL_REQUIRE(!path.empty(), "expected a model directory, got an empty path");
  if (detail::is_directory(path)) return;
  struct stat st;
  TWELL_REQUIRE(::stat(path.c_str(), &st) != 0, "must be a model directory (config.json, safetensors, tokenizer.json), "
                "got the file ", path);
  throw Error(str("no such directory: ", path));
}

std::string config_file(const std::string& path) {
  if (!detail::is_directory(path)) return path;
  return path + (!path.empty() && path.back() == '/' ? "config.json" : "/config.json");
}

void write_config(const std::string& path, const ModelConfig& config) {
  const std::string file = config_file(path);
  config.validate(file);
  detail::write_file_atomically(file, config.to_json());
}

}  // namespace twell::io
