// ModelConfig: HF config.json parsing with defaults, validation errors that name the key and the
// file, and an atomic writer that round-trips.
#include <sys/stat.h>

#include <cmath>
#include <filesystem>

#include "core/io_test_util.h"
#include "twell/io/config.h"

namespace twell {
namespace {

using io::ModelConfig;
using test::expect_error;
using test::read_file;
using test::write_file;

// The paper's 1B model (DESIGN.md §6), as HuggingFace writes it.
const char* kPaperConfig = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 18,
  "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 49152,
  "max_position_embeddings": 2048, "rope_theta": 100000.0, "rms_norm_eps": 1e-05,
  "tie_word_embeddings": true, "hidden_act": "relu", "torch_dtype": "bfloat16",
  "rope_scaling": null, "attention_bias": false, "bos_token_id": 1
})";

ModelConfig small_config() {
  ModelConfig c;
  c.hidden_size = 64;
  c.intermediate_size = 176;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 100;
  c.max_position_embeddings = 256;
  c.rope_theta = 1e5;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.hidden_act = "relu";
  c.torch_dtype = "bfloat16";
  return c;
}

// The minimal config with `extra` spliced into the JSON object.
std::string minimal(const std::string& extra = "") {
  return R"({"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
             "num_attention_heads": 8, "vocab_size": 100, "max_position_embeddings": 256)" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

TEST(ModelConfig, ParsesThePaperConfig) {
  ModelConfig c = ModelConfig::from_json(kPaperConfig);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 5632);
  EXPECT_EQ(c.num_hidden_layers, 18);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.rope_theta, 1e5);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, "relu");
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfig, FillsDefaults) {
  ModelConfig c = ModelConfig::from_json(minimal());
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.torch_dtype, "");

  ModelConfig nulls =
      ModelConfig::from_json(minimal(R"("head_dim": null, "num_key_value_heads": null)"));
  EXPECT_EQ(nulls.head_dim, 8);
  EXPECT_EQ(nulls.num_key_value_heads, 8);
  // Newer transformers spellings.
  ModelConfig newer = ModelConfig::from_json(minimal(
      R"("rope_parameters": {"rope_theta": 500000, "rope_type": "default"}, "dtype": "float32")"));
  EXPECT_EQ(newer.rope_theta, 5e5);
  EXPECT_EQ(newer.torch_dtype, "float32");
}

TEST(ModelConfig, ErrorsNameTheKeyAndTheFile) {
  expect_error([] { ModelConfig::from_json(R"({"hidden_size": 64})", "ckpt/config.json"); },
               {"ckpt/config.json", "missing required key 'intermediate_size'"});
  expect_error([] { ModelConfig::from_json(minimal(R"("hidden_act": 3)"), "c.json"); },
               {"c.json", "'hidden_act'", "string", "number"});
  expect_error(
      [] { ModelConfig::from_json(R"({"hidden_size": "64", "intermediate_size": 1})", "c.json"); },
      {"c.json", "'hidden_size'", "integer", "string"});
  expect_error([] { ModelConfig::from_json(minimal(R"("rms_norm_eps": "small")"), "c.json"); },
               {"c.json", "'rms_norm_eps'", "number"});
  expect_error([] { ModelConfig::from_json(minimal(R"("tie_word_embeddings": 1)"), "c.json"); },
               {"c.json", "'tie_word_embeddings'", "true or false"});
  expect_error([] { ModelConfig::from_json("{\"hidden_size\": 64,", "c.json"); },
               {"c.json", "not valid JSON"});
  expect_error([] { ModelConfig::from_json("[]", "c.json"); }, {"c.json", "JSON object", "array"});
  // A NUL byte ends nlohmann's input: what follows it would be ignored, not refused.
  expect_error([] { ModelConfig::from_json(minimal("") + std::string(1, '\0') + R"({"hidden_size": -5)", "c.json"); },
               {"c.json", "not valid JSON", "a NUL byte at offset"});
  expect_error([] { ModelConfig::from_json(minimal(R"("hidden_size": 32)"), "c.json"); },
               {"c.json", "'hidden_size' twice"});
}

// RoPE scaling: Llama 3.1's "llama3" and "linear" are read (both spellings of the type key, and
// newer transformers' "rope_parameters"); other kinds are refused rather than run wrong, as is a
// sliding window shorter than the context. The "off" spellings (null, "default", a window
// switched off or as long as the context) pass.
TEST(ModelConfig, ReadsLlama3AndLinearRopeScaling) {
  const ModelConfig l3 = ModelConfig::from_json(minimal(
      R"("rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"})"));
  EXPECT_EQ(l3.rope_scaling.type, "llama3");
  EXPECT_EQ(l3.rope_scaling.factor, 32.0);
  EXPECT_EQ(l3.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(l3.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(l3.rope_scaling.original_max_position_embeddings, 8192);
  const ModelConfig lin = ModelConfig::from_json(minimal(R"("rope_scaling": {"type": "linear", "factor": 2})"));
  EXPECT_EQ(lin.rope_scaling.type, "linear");
  EXPECT_EQ(lin.rope_scaling.factor, 2.0);
  const ModelConfig v5 = ModelConfig::from_json(minimal(
      R"("rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
                             "high_freq_factor": 4, "original_max_position_embeddings": 8192})"));
  EXPECT_EQ(v5.rope_theta, 5e5);
  EXPECT_EQ(v5.rope_scaling.type, "llama3");
  EXPECT_EQ(v5.rope_scaling.factor, 8.0);
  EXPECT_TRUE(ModelConfig::from_json(minimal(R"("rope_scaling": null)")).rope_scaling.none());
  EXPECT_TRUE(ModelConfig::from_json(minimal(R"("rope_parameters": {"rope_theta": 1e4, "rope_type": "default"})"))
                  .rope_scaling.none());
  // Written back so that HF and from_json read the same scaling.
  EXPECT_EQ(ModelConfig::from_json(l3.to_json()).to_json(), l3.to_json());
  EXPECT_NE(l3.to_json().find("\"rope_scaling\""), std::string::npos);
  EXPECT_EQ(small_config().to_json().find("rope_scaling"), std::string::npos);
}

// Inverse frequencies against HF's (transformers 5.24, float32) for Llama 3.2's RoPE: head_dim 64,
// theta 5e5, llama3 scaling by 32 from an 8192 context. Pair 14 is a high frequency (kept), 15 and
// 16 are in the interpolated band, 17 and 31 are low frequencies (divided by the factor).
TEST(ModelConfig, RopeInverseFrequenciesMatchHuggingFace) {
  ModelConfig c = ModelConfig::from_json(R"({"hidden_size": 2048, "intermediate_size": 8192,
      "num_hidden_layers": 1, "num_attention_heads": 32, "head_dim": 64, "vocab_size": 100,
      "max_position_embeddings": 131072, "rope_theta": 500000.0,
      "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  const std::pair<int, double> hf[] = {{0, 1.0},
                                       {14, 0.0032114461064338684},
                                       {15, 0.0012905480107292533},
                                       {16, 0.000429556705057621},
                                       {17, 9.708286233944818e-05},
                                       {31, 9.418306490260875e-08}};
  for (const auto& [i, want] : hf) {
    EXPECT_NEAR(c.rope_inv_freq<float>(i), want, 2e-7 * want) << "pair " << i;
    EXPECT_NEAR(c.rope_inv_freq<double>(i), want, 1e-6 * want) << "pair " << i;
  }
  // The scaling alone, bit for bit against transformers (float32): theta 1e4, head_dim 32, factor 2
  // from a 4096 context. Pairs 9-11 are interpolated, where a single division for 2π / inv_freq
  // (PyTorch takes the reciprocal, then multiplies) rounds pair 11 one ulp off; 5 is kept, 12
  // halved. Inputs are HF's unscaled inverse frequencies.
  io::RopeScaling r;
  r.type = "llama3", r.factor = 2, r.low_freq_factor = 1, r.high_freq_factor = 4;
  r.original_max_position_embeddings = 4096;
  const std::pair<float, float> scaled[] = {{0x1.ccab84p-5f, 0x1.ccab84p-5f},
                                            {0x1.708938p-8f, 0x1.5c03b2p-8f},
                                            {0x1.9e7c70p-9f, 0x1.18924cp-9f},
                                            {0x1.d22a50p-10f, 0x1.eae982p-11f},
                                            {0x1.0624dep-10f, 0x1.0624dep-11f}};
  for (const auto& [in, want] : scaled) EXPECT_EQ(r.scale(in), want) << std::hexfloat << in;
  c.rope_scaling = io::RopeScaling{};
  c.rope_scaling.type = "linear", c.rope_scaling.factor = 4.0;
  EXPECT_NEAR(c.rope_inv_freq<float>(5), 0.03217184543609619, 2e-7 * 0.0322);
  c.rope_scaling = io::RopeScaling{};
  EXPECT_NEAR(c.rope_inv_freq<double>(5), std::pow(5e5, -10.0 / 64), 1e-15);
}

TEST(ModelConfig, RefusesUnsupportedRopeScalingAndSlidingWindows) {
  auto refused = [](const std::string& extra, std::initializer_list<std::string> parts) {
    expect_error([&] { ModelConfig::from_json(minimal(extra), "c.json"); }, parts);
  };
  refused(R"("rope_scaling": {"type": "dynamic", "factor": 2})",
          {"c.json", "rope_scaling of type 'dynamic' is not supported", "'linear' and 'llama3'"});
  refused(R"("rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 4})", {"rope_parameters", "'yarn'"});
  refused(R"("rope_scaling": {"rope_type": "longrope"})", {"'longrope'"});
  refused(R"("rope_scaling": 2)", {"'rope_scaling' must be an object"});
  refused(R"("rope_scaling": {"rope_type": "linear"})", {"c.json: rope_scaling", "needs the key 'factor'"});
  refused(R"("rope_scaling": {"rope_type": "linear", "factor": "2"})", {"'factor' must be a number"});
  refused(R"("rope_scaling": {"rope_type": "linear", "factor": 0})", {"rope_scaling factor must be a positive number"});
  refused(R"("rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 4,
                              "original_max_position_embeddings": 8192})",
          {"0 < low_freq_factor < high_freq_factor"});
  refused(R"("rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                              "original_max_position_embeddings": 0})",
          {"original_max_position_embeddings must be positive"});
  refused(R"("rope_scaling": {"rope_type": "linear", "factor": 2},
             "rope_parameters": {"rope_type": "linear", "factor": 4})",
          {"rope_scaling and rope_parameters disagree"});
  refused(R"("rope_scaling": {"rope_type": "default"},
             "rope_parameters": {"rope_type": "linear", "factor": 4})",
          {"rope_scaling and rope_parameters disagree", "'default' and 'linear'"});
  refused(R"("rope_scaling": {"rope_type": 3})", {"c.json: rope_scaling: key 'rope_type' must be a string"});
  EXPECT_EQ(ModelConfig::from_json(minimal(R"("rope_scaling": {"rope_type": "linear", "factor": 2, "rope_theta": 1e5},
             "rope_parameters": {"rope_type": "linear", "factor": 2})")).rope_theta, 1e5);
  refused(R"("sliding_window": 16)", {"sliding_window 16", "not supported"});
  EXPECT_NO_THROW(ModelConfig::from_json(minimal(R"("sliding_window": null)")));
  EXPECT_NO_THROW(ModelConfig::from_json(minimal(R"("sliding_window": 16, "use_sliding_window": false)")));
  EXPECT_NO_THROW(ModelConfig::from_json(minimal(R"("sliding_window": 100000)")));
  refused(R"("sliding_window": 16.0)", {"sliding_window 16 is shorter than max_position_embeddings 256"});
  refused(R"("sliding_window": "16")", {"key 'sliding_window' must be a number or null"});
  refused(R"("partial_rotary_factor": 0.5)", {"partial_rotary_factor 0.5 is not supported"});
  EXPECT_NO_THROW(ModelConfig::from_json(minimal(R"("partial_rotary_factor": 1.0)")));
  ModelConfig c = small_config();
  c.rope_scaling.type = "yarn";
  expect_error([&] { c.validate("x.json"); }, {"x.json", "rope_scaling type must be default, linear or llama3"});
}

// Other architectures that share Llama's tensor names (Granite's multipliers, MiniCPM's scales,
// SmolLM3's layers without RoPE) would load and run wrong: refused by model_type. Mistral without
// a sliding window is Llama's arithmetic; no model_type means llama, as twell writes it.
TEST(ModelConfig, RefusesOtherArchitecturesByModelType) {
  for (const char* other : {"granite", "minicpm", "smollm3", "qwen2", ""})
    expect_error([&] { ModelConfig::from_json(minimal(str("\"model_type\": \"", other, "\"")), "c.json"); },
                 {"c.json", str("model_type '", other, "' is not supported")});
  EXPECT_EQ(ModelConfig::from_json(minimal(R"("model_type": "mistral", "sliding_window": null)")).model_type,
            "mistral");
  EXPECT_EQ(ModelConfig::from_json(minimal()).model_type, "llama");
  // num_key_value_heads absent: LlamaConfig's default is the heads, MistralConfig's 8.
  const std::string sixteen = R"({"hidden_size": 256, "intermediate_size": 176, "num_hidden_layers": 2,
      "num_attention_heads": 16, "vocab_size": 100, "max_position_embeddings": 256, "sliding_window": null)";
  EXPECT_EQ(ModelConfig::from_json(sixteen + "}").num_key_value_heads, 16);
  EXPECT_EQ(ModelConfig::from_json(sixteen + R"(, "model_type": "mistral"})").num_key_value_heads, 8);
}

// Mistral as transformers reads it: no sliding_window key means MistralConfig's 4096, only null
// switches the window off, and use_sliding_window (Qwen2's key) does not.
TEST(ModelConfig, MistralSlidingWindowDefaultsTo4096) {
  auto mistral = [](int64_t max_positions, const std::string& extra) {
    return str(R"({"model_type": "mistral", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                "num_attention_heads": 8, "vocab_size": 100, "max_position_embeddings": )",
               max_positions, extra.empty() ? "" : ", " + extra, "}");
  };
  expect_error([&] { ModelConfig::from_json(mistral(32768, ""), "c.json"); },
               {"c.json", "sliding_window 4096 (absent: MistralConfig's default) is shorter than "
                          "max_position_embeddings 32768"});
  expect_error([&] { ModelConfig::from_json(mistral(256, R"("sliding_window": 8, "use_sliding_window": false)")); },
               {"sliding_window 8 is shorter"});
  EXPECT_NO_THROW(ModelConfig::from_json(mistral(4096, "")));
  EXPECT_NO_THROW(ModelConfig::from_json(mistral(32768, R"("sliding_window": null)")));
  EXPECT_NO_THROW(ModelConfig::from_json(minimal(R"("sliding_window": 8, "use_sliding_window": false)")));
  // Written back, a Mistral config says its window is off (absent would read as 4096).
  const ModelConfig c = ModelConfig::from_json(mistral(32768, R"("sliding_window": null)"));
  EXPECT_EQ(ModelConfig::from_json(c.to_json()).to_json(), c.to_json());
}

// Sizes whose products could overflow the tensors' element counts are refused by name.
TEST(ModelConfig, RefusesSizesThatWouldOverflow) {
  expect_error([] { ModelConfig::from_json(minimal(R"("head_dim": 4611686018427387904)"), "c.json"); },
               {"c.json", "head_dim 4611686018427387904 is larger than twell supports (1048576)"});
  ModelConfig c = small_config();
  c.vocab_size = int64_t{1} << 40;
  expect_error([&] { c.validate("x.json"); }, {"x.json", "vocab_size 1099511627776 is larger than twell supports"});
  c = small_config();
  c.max_position_embeddings = int64_t{1} << 40;
  expect_error([&] { c.validate("x.json"); }, {"max_position_embeddings 1099511627776 is larger than twell supports"});
}

// RoPE as transformers 5 reads it (convert_rope_params_to_dict, standardize_rope_params): rope_scaling's
// dict where given, else rope_parameters'; rope_theta from it, else the top level, else 10000; llama3's
// original context from the top level (Phi-3's place), else the dict, else max_position_embeddings.
// Places that disagree (which transformers 4 read otherwise) are refused.
TEST(ModelConfig, ReadsRopeWhereTransformersFiveDoes) {
  const std::string llama3 = R"("rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4)";
  // rope_theta inside rope_scaling, none at the top level: the dict's.
  EXPECT_EQ(ModelConfig::from_json(minimal(R"("rope_scaling": {)" + llama3 + R"(, "rope_theta": 5e5,
      "original_max_position_embeddings": 16})")).rope_theta, 5e5);
  // rope_scaling without a theta beside rope_parameters with one: transformers takes rope_scaling's
  // (the default), so the two disagree.
  expect_error([&] {
    ModelConfig::from_json(minimal(R"("rope_parameters": {)" + llama3 + R"(, "rope_theta": 5e5,
        "original_max_position_embeddings": 16}, "rope_scaling": {)" + llama3 + R"(,
        "original_max_position_embeddings": 16})"), "c.json");
  }, {"c.json: rope_parameters.rope_theta 500000 and the default 10000, which transformers takes, disagree"});
  // The two dicts disagreeing on one key: named.
  expect_error([&] {
    ModelConfig::from_json(minimal(R"("rope_parameters": {)" + llama3 + R"(}, "rope_scaling": {)" + llama3 + R"(,
        "original_max_position_embeddings": 16})"), "c.json");
  }, {"c.json: rope_scaling and rope_parameters disagree (original_max_position_embeddings 16 and absent)"});
  // llama3's original context: the top level's, the dict's, else max_position_embeddings (256).
  const auto original = [&](const std::string& extra) {
    return ModelConfig::from_json(minimal(extra)).rope_scaling.original_max_position_embeddings;
  };
  EXPECT_EQ(original(R"("rope_parameters": {)" + llama3 + R"(, "original_max_position_embeddings": 16})"), 16);
  EXPECT_EQ(original(R"("rope_parameters": {)" + llama3 + R"(}, "original_max_position_embeddings": 4)"), 4);
  EXPECT_EQ(original(R"("rope_parameters": {)" + llama3 + R"(})"), 256);
  EXPECT_EQ(original(R"("rope_parameters": {)" + llama3 + R"(, "original_max_position_embeddings": 16},
      "original_max_position_embeddings": 16)"), 16);
  expect_error([&] {
    ModelConfig::from_json(minimal(R"("rope_parameters": {)" + llama3 + R"(, "original_max_position_embeddings": 16},
        "original_max_position_embeddings": 4)"), "c.json");
  }, {"c.json: original_max_position_embeddings 4 and rope_parameters.original_max_position_embeddings 16 disagree"});
  // Not llama3: a top-level original context means nothing, as in transformers.
  EXPECT_EQ(ModelConfig::from_json(minimal(R"("original_max_position_embeddings": 4)")).rope_scaling.type, "default");
  // A part of each head rotated, in the dict where transformers 5 writes it: refused as at the top level.
  expect_error([&] {
    ModelConfig::from_json(minimal(R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})"),
                           "c.json");
  }, {"c.json: rope_parameters.partial_rotary_factor 0.5 is not supported"});
  EXPECT_NO_THROW(ModelConfig::from_json(minimal(R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0})")));
}

// rope_theta at the top level and in rope_parameters must agree; eos_token_id is one id or a
// list (Llama 3 Instruct's three), and is written back.
TEST(ModelConfig, ReadsRopeThetaOnceAndEosIds) {
  expect_error(
      [] { ModelConfig::from_json(minimal(R"("rope_theta": 1e4, "rope_parameters": {"rope_theta": 5e5})"), "c.json"); },
      {"c.json", "rope_theta 10000 and rope_parameters.rope_theta 500000, which transformers takes, disagree"});
  EXPECT_EQ(ModelConfig::from_json(minimal(R"("rope_theta": 5e5, "rope_parameters": {"rope_theta": 5e5})")).rope_theta,
            5e5);
  expect_error(  // every digit, where 6 would print the same number twice
      [] { ModelConfig::from_json(minimal(R"("rope_theta": 1000000, "rope_parameters": {"rope_theta": 1000001})")); },
      {"rope_theta 1000000 and rope_parameters.rope_theta 1000001, which transformers takes, disagree"});
  // A bad rope_parameters.rope_theta is said to be there, not at the top level's valid one.
  expect_error(
      [] { ModelConfig::from_json(minimal(R"("rope_theta": 1e4, "rope_parameters": {"rope_theta": "1e4"})"), "c.json"); },
      {"c.json: rope_parameters: key 'rope_theta' must be a number"});
  // An integer past int64 is said to be too large, not to be no integer.
  expect_error([] { ModelConfig::from_json(minimal(R"("num_key_value_heads": 9223372036854775808)"), "c.json"); },
               {"c.json: key 'num_key_value_heads' is 9223372036854775808, past the largest integer"});
  EXPECT_TRUE(ModelConfig::from_json(minimal()).eos_token_ids.empty());
  EXPECT_TRUE(ModelConfig::from_json(minimal(R"("eos_token_id": null)")).eos_token_ids.empty());
  EXPECT_EQ(ModelConfig::from_json(minimal(R"("eos_token_id": 2)")).eos_token_ids, std::vector<int32_t>{2});
  const ModelConfig l3 = ModelConfig::from_json(minimal(R"("eos_token_id": [128001, 128008, 128009])"));
  EXPECT_EQ(l3.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(ModelConfig::from_json(l3.to_json()).eos_token_ids, l3.eos_token_ids);
  for (const char* bad : {R"("eos_token_id": "2")", R"("eos_token_id": [1, -2])", R"("eos_token_id": 1e12)"})
    expect_error([&] { ModelConfig::from_json(minimal(bad), "c.json"); },
                 {"c.json", "'eos_token_id' must be a token id or a list of token ids"});
}

TEST(ModelConfig, ValidateExplainsInconsistencies) {
  auto with = [](auto edit) {
    ModelConfig c = small_config();
    edit(c);
    return c;
  };
  small_config().validate();
  // hidden_size need not be heads · head_dim (head_dim given); without head_dim it must divide.
  EXPECT_NO_THROW(with([](ModelConfig& c) { c.hidden_size = 66; }).validate("x.json"));
  const std::string odd = R"({"hidden_size": 66, "intermediate_size": 176, "num_hidden_layers": 2,
                              "num_attention_heads": 8, "vocab_size": 100, "max_position_embeddings": 256)";
  expect_error([&] { ModelConfig::from_json(odd + "}", "c.json"); },
               {"c.json", "hidden_size 66 is not divisible by num_attention_heads 8, and no head_dim is given"});
  EXPECT_EQ(ModelConfig::from_json(odd + R"(, "head_dim": 16})").head_dim, 16);
  expect_error([&] { with([](ModelConfig& c) { c.num_key_value_heads = 3; }).validate("x.json"); },
               {"x.json", "num_attention_heads 8 is not a multiple of num_key_value_heads 3"});
  expect_error([&] { with([](ModelConfig& c) { c.vocab_size = 0; }).validate("x.json"); },
               {"x.json", "vocab_size must be positive, got 0"});
  expect_error([&] { with([](ModelConfig& c) { c.num_hidden_layers = -1; }).validate("x.json"); },
               {"num_hidden_layers must be positive, got -1"});
  expect_error([&] { with([](ModelConfig& c) { c.hidden_act = "mish"; }).validate("x.json"); },
               {"x.json", "hidden_act", "'mish'"});
  EXPECT_EQ(ModelConfig::from_json(odd + R"(, "head_dim": 16, "hidden_act": "swish"})").hidden_act, "silu");  // HF's alias
  expect_error([&] { with([](ModelConfig& c) { c.rope_theta = -1; }).validate("x.json"); },
               {"rope_theta must be a positive number"});
  // Positive and finite as a double, yet infinite angles in the float RoPE table: refused as the config's fault.
  expect_error([&] { with([](ModelConfig& c) { c.rope_theta = 1e-300; }).validate("x.json"); },
               {"x.json: rope_theta 1e-300 gives rotary pair 1 the inverse frequency inf in float"});
  expect_error([&] {
    with([](ModelConfig& c) {
      c.rope_scaling.type = "linear";
      c.rope_scaling.factor = 1e-300;
    }).validate("x.json");
  }, {"x.json: rope_theta", "with its rope_scaling gives rotary pair 0 the inverse frequency inf"});
  // rms_norm_eps is added in float: a positive double that is 0 or infinite there is refused.
  expect_error([&] { with([](ModelConfig& c) { c.rms_norm_eps = 1e-50; }).validate("x.json"); },
               {"x.json: rms_norm_eps 1e-50 is 0 in float"});
  expect_error([&] { with([](ModelConfig& c) { c.rms_norm_eps = 1e39; }).validate("x.json"); },
               {"x.json: rms_norm_eps 1e+39 is inf in float"});
  expect_error([&] { with([](ModelConfig& c) { c.head_dim = 7; }).validate("x.json"); },
               {"head_dim must be even"});
  expect_error([] { ModelConfig::from_json(minimal(R"("num_key_value_heads": 3)"), "c.json"); },
               {"c.json", "num_key_value_heads 3"});
}

class ConfigFile : public test::ScratchDirTest {};

TEST_F(ConfigFile, RoundTripsThroughDirectoryAndFile) {
  const ModelConfig c = small_config();
  io::write_config(dir_, c);
  EXPECT_EQ(listing(), std::vector<std::string>{"config.json"});
  for (const std::string& p : {dir_, path("config.json")}) {
    ModelConfig back = io::read_config(p);
    EXPECT_EQ(back.to_json(), c.to_json());
    EXPECT_EQ(back.num_key_value_heads, 2);
    EXPECT_EQ(back.rope_theta, 1e5);
    EXPECT_EQ(back.rms_norm_eps, 1e-5);
    EXPECT_TRUE(back.tie_word_embeddings);
  }
  EXPECT_NE(read_file(path("config.json")).find("\"LlamaForCausalLM\""), std::string::npos);
}

TEST_F(ConfigFile, FailedWriteKeepsTheOldFile) {
  io::write_config(dir_, small_config());
  const std::string before = read_file(path("config.json"));
  ModelConfig bad = small_config();
  bad.num_key_value_heads = 3;
  expect_error([&] { io::write_config(dir_, bad); }, {"config.json", "not a multiple of num_key_value_heads 3"});
  EXPECT_EQ(read_file(path("config.json")), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"config.json"});
}

// A model directory's generation_config.json adds its end-of-sequence ids to config.json's.
// A directory where config.json should be is said as such (it opened, and read as empty JSON).
TEST_F(ConfigFile, ADirectoryIsNotAConfigFile) {
  std::filesystem::create_directory(path("config.json"));
  expect_error([&] { io::read_config(dir_); }, {"config.json: a directory, not a file"});
}

// A FIFO would block the read and /dev/zero never end it; a link to nothing is said as such, not as
// "no config.json".
TEST_F(ConfigFile, NotARegularFileOrALinkToNothingIsSaidAsSuch) {
  ASSERT_EQ(::mkfifo(path("config.json").c_str(), 0600), 0);
  expect_error([&] { io::read_config(dir_); }, {"config.json: not a regular file"});
  std::filesystem::remove(path("config.json"));
  std::filesystem::create_symlink("/dev/zero", path("config.json"));
  expect_error([&] { io::read_config(dir_); }, {"config.json: not a regular file"});
  std::filesystem::remove(path("config.json"));
  std::filesystem::create_symlink("gone.json", path("config.json"));
  expect_error([&] { io::read_config(dir_); }, {"config.json is a symbolic link to gone.json, which does not exist"});
  write_file(path("real.json"), minimal(R"("eos_token_id": 7)"));
  std::filesystem::remove(path("config.json"));
  std::filesystem::create_symlink("real.json", path("config.json"));
  std::filesystem::create_symlink("/dev/zero", path("generation_config.json"));  // kept as the file's error
  EXPECT_NE(io::read_config(dir_).generation.unreadable.find("generation_config.json: not a regular file"),
            std::string::npos);
}

TEST_F(ConfigFile, GenerationConfigAddsEosIds) {
  write_file(path("config.json"), minimal(R"("eos_token_id": 128001)"));
  EXPECT_EQ(io::read_config(dir_).eos_token_ids, std::vector<int32_t>{128001});
  write_file(path("generation_config.json"), R"({"eos_token_id": [128001, 128008, 128009], "do_sample": true})");
  EXPECT_EQ(io::read_config(dir_).eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(io::read_config(path("config.json")).eos_token_ids, std::vector<int32_t>{128001});  // the file alone
  // A file that cannot be read loads as its error (GenerationDefaults::unreadable), its ids not added:
  // it stops only what would take its values (with_generation_config), not `eval`.
  for (const char* text : {R"({"eos_token_id": "x"})", "garbage", "[]", ""}) {
    write_file(path("generation_config.json"), text);
    const io::ModelConfig c = io::read_config(dir_);
    EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{128001}) << text;
    EXPECT_TRUE(c.generation.any()) << text;
    EXPECT_EQ(c.generation.source, dir_ + "/generation_config.json");
    EXPECT_NE(c.generation.unreadable.find("generation_config.json"), std::string::npos) << text;
  }
  write_file(path("generation_config.json"), R"({"eos_token_id": "x"})");
  EXPECT_NE(io::read_config(dir_).generation.unreadable.find("'eos_token_id' must be a token id"), std::string::npos);
}

// Its sampling keys are kept as the file gives them (null as absent); a key of the wrong type is kept
// as an error for where they are used (the model still loads, as in transformers); keys transformers
// would apply and twell does not are listed; without the file, config.json's keys, as transformers
// takes them.
TEST_F(ConfigFile, GenerationConfigGivesSamplingDefaults) {
  write_file(path("config.json"), minimal(""));
  EXPECT_FALSE(io::read_config(dir_).generation.any());
  write_file(path("generation_config.json"), R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": null,
      "min_p": 0, "repetition_penalty": 1, "max_new_tokens": 100})");
  const io::GenerationDefaults g = io::read_config(dir_).generation;
  EXPECT_TRUE(g.any());
  EXPECT_EQ(g.source, dir_ + "/generation_config.json");
  EXPECT_EQ(g.do_sample, true);
  EXPECT_EQ(g.temperature, 0.6);
  EXPECT_EQ(g.top_p, 0.9);
  EXPECT_FALSE(g.top_k.has_value());
  EXPECT_EQ(g.min_p, 0.0);
  EXPECT_EQ(g.repetition_penalty, 1.0);
  EXPECT_FALSE(io::read_config(path("config.json")).generation.any());  // the file alone
  write_file(path("generation_config.json"), R"({"top_k": 40})");
  EXPECT_EQ(io::read_config(dir_).generation.top_k, 40);
  EXPECT_EQ(io::read_config(dir_).generation.unapplied, "");
  const auto error_of = [&](const char* text, const char* key) {
    write_file(path("generation_config.json"), text);
    const io::GenerationDefaults bad = io::read_config(dir_).generation;
    EXPECT_TRUE(bad.any());
    EXPECT_EQ(bad.errors.size(), 1u);
    return bad.error(key);
  };
  EXPECT_NE(error_of(R"({"top_k": 0.5, "temperature": 1})", "top_k")
                .find("generation_config.json: key 'top_k' must be an integer"),
            std::string::npos);
  write_file(path("generation_config.json"), R"({"top_k": 0.5, "temperature": 1})");
  EXPECT_EQ(io::read_config(dir_).generation.temperature, 1.0);  // the other keys still read
  EXPECT_NE(error_of(R"({"temperature": "hot"})", "temperature").find("'temperature' must be a number"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"do_sample": 1})", "do_sample").find("'do_sample' must be true or false"), std::string::npos);
  write_file(path("generation_config.json"), R"({"num_beams": 4, "typical_p": 1.0, "no_repeat_ngram_size": 3,
      "suppress_tokens": [], "bad_words_ids": [[5]], "num_return_sequences": 1, "guidance_scale": 1})");
  EXPECT_EQ(io::read_config(dir_).generation.unapplied, "num_beams 4, no_repeat_ngram_size 3, bad_words_ids [[5]]");
  std::filesystem::remove(path("generation_config.json"));
  write_file(path("config.json"), minimal(R"("do_sample": true, "top_p": 0.8)"));
  const io::GenerationDefaults legacy = io::read_config(dir_).generation;
  EXPECT_EQ(legacy.source, dir_ + "/config.json");
  EXPECT_EQ(legacy.do_sample, true);
  EXPECT_EQ(legacy.top_p, 0.8);
}

TEST_F(ConfigFile, ReadErrorsNameTheFile) {
  expect_error([&] { io::read_config(dir_); }, {dir_, "not a model directory (no config.json)"});
  expect_error([&] { io::read_config(path("config.json")); }, {dir_ + "/config.json", "cannot read"});
  write_file(path("config.json"), R"({"hidden_size": 64})");
  expect_error([&] { io::read_config(dir_); },
               {dir_ + "/config.json", "missing required key 'intermediate_size'"});
}

}  // namespace
}  // namespace twell
