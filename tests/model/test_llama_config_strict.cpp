// Strict model configs: every dimension bounded and every derived size overflow-checked
// (the error names the file and the key), unknown keys in a model YAML refused with
// file:line and a suggestion, the config.json policy (extra keys ignored, keys that would
// change the model checked), and model.init hf:DIR taking its shape from DIR/config.json.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/checked.h"
#include "core/error.h"
#include "core/strings.h"
#include "model/llama.h"
#include "model/llama_config.h"
#include "../train/train_test_util.h"

using easyctx::test::input_error_of;

namespace easyctx::test {
namespace {

namespace fs = std::filesystem;

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

// A small valid shape as config.json text, with one key replaced (value "" removes it).
std::string shape_json(const std::string& key = "", const std::string& value = "") {
  std::vector<std::pair<std::string, std::string>> kv = {
      {"hidden_size", "64"},        {"num_hidden_layers", "2"},
      {"num_attention_heads", "4"}, {"num_key_value_heads", "2"},
      {"head_dim", "16"},           {"intermediate_size", "172"},
      {"vocab_size", "256"},        {"max_position_embeddings", "2048"},
      {"rms_norm_eps", "1e-5"},     {"rope_theta", "10000.0"}};
  bool found = false;
  for (auto& p : kv)
    if (p.first == key) p.second = value, found = true;
  if (!found && !key.empty()) kv.push_back({key, value});
  std::string s = "{";
  for (const auto& p : kv)
    if (!p.second.empty()) s += (s.size() > 1 ? ", \"" : "\"") + p.first + "\": " + p.second;
  return s + "}";
}

model::LlamaConfig from_json(const std::string& text) {
  return model::llama_config_from_json(parse_json(text, "m.json"), "m.json");
}

// Each dimension: above its limit (fresh random values up to 2^62, the 2^57 and
// 2^62 head_dim among them) and non-positive values are refused naming the key.
TEST(LlamaConfigStrict, EveryDimensionIsBoundedAndNamed) {
  std::mt19937_64 rng(test_seed());
  const std::vector<std::pair<const char*, int64_t>> dims = {
      {"hidden_size", model::LlamaLimits::hidden_size},
      {"num_hidden_layers", model::LlamaLimits::num_layers},
      {"num_attention_heads", model::LlamaLimits::num_heads},
      {"num_key_value_heads", model::LlamaLimits::num_heads},
      {"head_dim", model::LlamaLimits::head_dim},
      {"intermediate_size", model::LlamaLimits::intermediate_size},
      {"vocab_size", model::LlamaLimits::vocab_size},
      {"max_position_embeddings", model::LlamaLimits::max_position_embeddings}};
  int cases = 0;
  for (const auto& [key, limit] : dims) {
    std::vector<int64_t> bad = {limit + 1, 0, -1 - static_cast<int64_t>(rng() % 1000)};
    for (int i = 0; i < 4; ++i) bad.push_back(limit + 1 + static_cast<int64_t>(rng() % (uint64_t{1} << 62)));
    if (std::string(key) == "intermediate_size") bad.push_back(int64_t{1} << 57);
    if (std::string(key) == "head_dim") bad.push_back(int64_t{1} << 62);
    for (int64_t v : bad) {
      const std::string e = input_error_of([&] { from_json(shape_json(key, std::to_string(v))); });
      EXPECT_NE(e.find("m.json: "), std::string::npos) << e;
      EXPECT_NE(e.find(key), std::string::npos) << key << " = " << v << ": " << e;
      ++cases;
    }
  }
  EXPECT_GT(cases, 50);
  // Floats must be finite and positive (1e999 parses as inf).
  for (const char* key : {"rms_norm_eps", "rope_theta"})
    for (const char* v : {"1e999", "-1e999", "0", "-0.5"}) {
      const std::string e = input_error_of([&] { from_json(shape_json(key, v)); });
      EXPECT_NE(e.find(std::string(key) + " must be a finite number > 0"), std::string::npos) << e;
    }
  // An integer beyond int64 in a YAML is refused as a non-integer, never clamped.
  TempDir dir("cfg-huge");
  write(dir / "m.yaml",
        "hidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nhead_dim: 16\n"
        "intermediate_size: 99999999999999999999999\nvocab_size: 256\n");
  const std::string e = input_error_of([&] { model::load_llama_config(dir / "m.yaml"); });
  EXPECT_NE(e.find("'intermediate_size' must be an integer"), std::string::npos) << e;
}

// Within each dimension's limit the products can still be absurd: parameter counts and
// tensors are checked against 128-bit references on fresh random shapes.
TEST(LlamaConfigStrict, ParameterCountsAreCheckedProducts) {
  std::mt19937_64 rng(test_seed());
  int refused = 0, accepted = 0;
  for (int i = 0; i < 400; ++i) {
    auto pick = [&](int64_t limit) { return static_cast<int64_t>(1 + rng() % static_cast<uint64_t>(limit)); };
    model::LlamaConfig c;
    c.name = "r.yaml";
    c.num_kv_heads = 1 + static_cast<int64_t>(rng() % 8);
    c.num_heads = c.num_kv_heads * (1 + static_cast<int64_t>(rng() % 8));
    c.head_dim = 2 * (1 + static_cast<int64_t>(rng() % 128));
    c.hidden_size = rng() % 2 ? pick(4096) : pick(model::LlamaLimits::hidden_size);
    c.num_layers = rng() % 2 ? pick(64) : pick(model::LlamaLimits::num_layers);
    c.intermediate_size = rng() % 2 ? pick(16384) : pick(model::LlamaLimits::intermediate_size);
    c.vocab_size = rng() % 2 ? pick(65536) : pick(model::LlamaLimits::vocab_size);
    c.tie_word_embeddings = rng() % 2;
    const __int128 d = c.hidden_size, q = c.q_dim(), kv = c.kv_dim();
    const __int128 layer = 2 * d * q + 2 * d * kv + 3 * d * c.intermediate_size + 2 * d;
    const __int128 total = static_cast<__int128>(c.vocab_size) * d * (c.tie_word_embeddings ? 1 : 2) +
                           static_cast<__int128>(c.num_layers) * layer + d;
    const bool fits = total <= kMaxElements && static_cast<__int128>(c.vocab_size) * d <= kMaxElements &&
                      static_cast<__int128>(c.intermediate_size) * d <= kMaxElements &&
                      static_cast<__int128>(c.num_layers) * layer <= kMaxElements;
    const std::string e = input_error_of([&] { c.validate(); });
    if (fits) {
      EXPECT_EQ(e, "");
      EXPECT_EQ(c.num_parameters(), static_cast<int64_t>(total));
      ++accepted;
    } else {
      EXPECT_NE(e.find("r.yaml: "), std::string::npos) << e;
      EXPECT_NE(e.find("2^50"), std::string::npos) << e;
      ++refused;
    }
  }
  EXPECT_GT(refused, 10);
  EXPECT_GT(accepted, 10);
}

// The activations of a micro-batch: the workspace (which the trainer allocates and the plan
// replays) refuses token counts whose buffers overflow, naming the micro-batch.
TEST(LlamaConfigStrict, WorkspaceSizesAreChecked) {
  const model::LlamaConfig c = model::load_llama_config("llama2-7b");
  model::ModelOptions o;
  std::string e =
      input_error_of([&] { model::LlamaModel::workspace_specs(c, o, ops::DType::BF16, 1 << 20, 1 << 30, true); });
  EXPECT_NE(e.find("micro-batch of 1048576 x 1073741824 tokens"), std::string::npos) << e;
  e = input_error_of([&] { model::LlamaModel::workspace_specs(c, o, ops::DType::BF16, 128, 1 << 30, true); });
  EXPECT_NE(e.find("intermediate_size"), std::string::npos) << e;
  EXPECT_NO_THROW(model::LlamaModel::workspace_specs(c, o, ops::DType::BF16, 1, 1 << 20, true));
  o.lm_head_tile = int64_t{1} << 40;
  e = input_error_of([&] { c.check_tokens(int64_t{1} << 36, o.lm_head_tile, "b x s"); });
  EXPECT_NE(e.find("b x s: an LM-head tile of logits"), std::string::npos) << e;
}

// A model YAML is easyctx's own file: a misspelt key (fresh random edits of every preset's
// keys) is refused with file:line:column and the key; a config.json key names itself as one.
TEST(LlamaConfigStrict, UnknownModelYamlKeysAreRefusedWithTheLine) {
  std::mt19937_64 rng(test_seed());
  TempDir dir("cfg-keys");
  const std::vector<std::string> valid = {"hidden_size",
                                          "num_hidden_layers",
                                          "num_attention_heads",
                                          "num_key_value_heads",
                                          "head_dim",
                                          "intermediate_size",
                                          "vocab_size",
                                          "rms_norm_eps",
                                          "rope_theta",
                                          "rope_scaling",
                                          "rope_parameters",
                                          "tie_word_embeddings",
                                          "max_position_embeddings",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "model_type",
                                          "hidden_act",
                                          "attention_bias",
                                          "mlp_bias"};
  int cases = 0;
  for (const char* preset : {"tiny", "demo", "llama2-7b", "llama3-8b", "tinyllama-1b"}) {
    const std::string text = read_file(source_dir() + "/configs/models/" + preset + ".yaml");
    std::vector<std::string> lines = split(text, '\n');
    for (int trial = 0; trial < 6; ++trial) {
      size_t li = 0;
      do li = rng() % lines.size();
      while (lines[li].empty() || lines[li][0] == '#' || lines[li].find(':') == std::string::npos);
      const std::string key = lines[li].substr(0, lines[li].find(':'));
      std::string typo = key;
      const size_t at = rng() % typo.size();
      switch (rng() % 3) {
        case 0: typo.erase(at, 1); break;                                        // deletion
        case 1: typo.insert(at, 1, static_cast<char>('a' + rng() % 26)); break;  // insertion
        default: typo[at] = typo[at] == 'z' ? 'q' : 'z'; break;                  // substitution
      }
      if (typo == key) continue;
      std::vector<std::string> bad = lines;
      bad[li] = typo + lines[li].substr(key.size());
      std::string out;
      for (const auto& l : bad) out += l + "\n";
      write(dir / "m.yaml", out);
      const std::string e = input_error_of([&] { model::load_llama_config(dir / "m.yaml"); });
      if (std::find(valid.begin(), valid.end(), typo) != valid.end()) continue;  // the edit made another key
      EXPECT_NE(e.find(dir / "m.yaml:" + std::to_string(li + 1) + ":1: unknown key '" + typo + "'"), std::string::npos)
          << preset << " " << key << " -> " << typo << ": " << e;
      ++cases;
    }
  }
  EXPECT_GT(cases, 20);
  write(dir / "r.yaml",
        "hidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nintermediate_size: 172\n"
        "vocab_size: 256\nrope_scaling:\n  type: linear\n  factr: 2.0\n");
  std::string e = input_error_of([&] { model::load_llama_config(dir / "r.yaml"); });
  EXPECT_NE(e.find("r.yaml:8:3: unknown key 'rope_scaling.factr' (did you mean 'factor'?)"), std::string::npos) << e;
  write(dir / "h.yaml",
        "hidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nintermediate_size: 172\n"
        "vocab_size: 256\ntorch_dtype: bfloat16\n");
  e = input_error_of([&] { model::load_llama_config(dir / "h.yaml"); });
  EXPECT_NE(e.find("h.yaml:6:1: unknown key 'torch_dtype'; it is a config.json key easyctx does not use"),
            std::string::npos)
      << e;
  write(dir / "d.yaml", "hidden_size: 64\nhidden_size: 64\n");
  e = input_error_of([&] { model::load_llama_config(dir / "d.yaml"); });
  EXPECT_NE(e.find("d.yaml:2:1: duplicate key 'hidden_size'"), std::string::npos) << e;
}

// A config.json carries what transformers writes (metadata, generation settings: ignored);
// keys that would change the model unless neutral are refused by name.
TEST(LlamaConfigStrict, HfConfigJsonExtrasAndSemanticKeys) {
  TempDir dir("cfg-json");
  model::LlamaConfig ok = from_json(shape_json("transformers_version", "\"4.44.0\""));
  EXPECT_EQ(ok.hidden_size, 64);
  ok = from_json(shape_json("attention_dropout", "0.0"));
  ok = from_json(shape_json("sliding_window", "null"));
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"sliding_window", "4096"},       {"attention_dropout", "0.1"},
      {"partial_rotary_factor", "0.5"}, {"quantization_config", "{\"quant_method\": \"gptq\"}"},
      {"hidden_act", "\"gelu\""},       {"model_type", "\"mixtral\""},
      {"attention_bias", "true"}};
  for (const auto& [k, v] : refused) {
    const std::string e = input_error_of([&] { from_json(shape_json(k, v)); });
    EXPECT_NE(e.find("m.json: " + k), std::string::npos) << k << ": " << e;
  }
  // Qwen2: q/k/v biases; a named window that use_sliding_window keeps off is full attention
  // (transformers sets it to None); the export writes Qwen2ForCausalLM (windows: QwenWindows).
  model::LlamaConfig qwen =
      from_json(shape_json("model_type", "\"qwen2\"")
                    .insert(1, "\"sliding_window\": 4096, \"use_sliding_window\": false, \"max_window_layers\": 1, "));
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_EQ(qwen.sliding_window, 0);
  const Json hf = qwen.to_hf_json();
  EXPECT_EQ(hf.find("model_type")->as_string(), "qwen2");
  EXPECT_EQ(hf.find("architectures")->as_array().at(0).as_string(), "Qwen2ForCausalLM");
  const model::LlamaConfig back = model::llama_config_from_json(hf, "export.json");
  EXPECT_TRUE(back.qkv_bias);
  EXPECT_EQ(back.num_parameters(), qwen.num_parameters());
  // Qwen3: q/k norms, no bias; exported as Qwen3ForCausalLM with attention_bias false.
  const model::LlamaConfig q3 =
      from_json(shape_json("model_type", "\"qwen3\"").insert(1, "\"attention_bias\": false, "));
  EXPECT_TRUE(q3.qk_norm);
  const Json hf3 = q3.to_hf_json();
  EXPECT_EQ(hf3.find("architectures")->as_array().at(0).as_string(), "Qwen3ForCausalLM");
  EXPECT_TRUE(model::llama_config_from_json(hf3, "export.json").qk_norm);
  // Mistral: its window is read and exported as MistralForCausalLM; a Mistral without one is a
  // Llama; a Llama config with a window is refused (LlamaForCausalLM has none).
  const model::LlamaConfig mw =
      from_json(shape_json("model_type", "\"mistral\"").insert(1, "\"sliding_window\": 64, "));
  EXPECT_EQ(mw.sliding_window, 64);
  const Json hfm = mw.to_hf_json();
  EXPECT_EQ(hfm.find("architectures")->as_array().at(0).as_string(), "MistralForCausalLM");
  EXPECT_EQ(model::llama_config_from_json(hfm, "export.json").sliding_window, 64);
  EXPECT_EQ(from_json(shape_json("model_type", "\"mistral\"")).model_type, "llama");
  const std::string lw = input_error_of([&] { from_json(shape_json("sliding_window", "64")); });
  EXPECT_NE(lw.find("m.json: sliding_window"), std::string::npos) << lw;
  // Every golden config.json (written by transformers 5) and an export load as they are.
  for (const char* g : {"gqa", "tied_llama3", "gqa_hd64"})
    EXPECT_NO_THROW(model::load_llama_config(source_dir() + "/tests/golden/data/" + g + "/model"));
}

// Qwen2/Qwen3's per-layer windows as transformers 5.x derives them: use_sliding_window true puts
// sliding_window in the layers from max_window_layers on (28 by default), or in those layer_types
// marks sliding_attention; the export writes them back (use_sliding_window, sliding_window,
// max_window_layers, layer_types) and reads back the same; the errors name the key. Fresh random
// layer counts, windows and patterns.
TEST(LlamaConfigStrict, QwenWindows) {
  std::mt19937_64 rng(test_seed());
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t L = 1 + static_cast<int64_t>(rng() % 40), w = 1 + static_cast<int64_t>(rng() % 5000);
    const int64_t mwl = static_cast<int64_t>(rng() % (L + 3)) - 1;  // -1 .. L + 1
    const std::string type = rng() % 2 ? "qwen2" : "qwen3";
    std::string j = shape_json("num_hidden_layers", std::to_string(L));
    j = j.insert(1, "\"model_type\": \"" + type +
                        "\", \"use_sliding_window\": true, \"sliding_window\": " + std::to_string(w) + ", " +
                        (trial % 4 ? "\"max_window_layers\": " + std::to_string(mwl) + ", " : ""));
    const model::LlamaConfig c = from_json(j);
    const int64_t first = trial % 4 ? std::max<int64_t>(mwl, 0) : 28;  // (28: Qwen2Config's default)
    int64_t windowed = 0;
    for (int64_t l = 0; l < L; ++l) {
      EXPECT_EQ(c.window_of(l), l >= first ? w : 0) << "layer " << l << " of " << j;
      windowed += l >= first;
    }
    EXPECT_EQ(c.windowed_layers(), windowed);
    EXPECT_EQ(c.sliding_window, windowed > 0 ? w : 0);
    const model::LlamaConfig back = model::llama_config_from_json(c.to_hf_json(), "export.json");
    EXPECT_EQ(back.sliding_window, c.sliding_window);
    for (int64_t l = 0; l < L; ++l) EXPECT_EQ(back.window_of(l), c.window_of(l));
    if (windowed > 0) { EXPECT_NE(c.describe().find("sliding window " + std::to_string(w)), std::string::npos); }
  }
  // layer_types given: as listed, whatever max_window_layers says; a pattern that is not a
  // suffix survives the export (layer_types is written).
  const std::string lt = "\"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\"], ";
  std::string j3 = shape_json("num_hidden_layers", "3")
                       .insert(1,
                               "\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 7, "
                               "\"max_window_layers\": 2, " +
                                   lt);
  const model::LlamaConfig c3 = from_json(j3);
  EXPECT_EQ(c3.window_of(0), 7);
  EXPECT_EQ(c3.window_of(1), 0);
  EXPECT_EQ(c3.window_of(2), 7);
  const Json hf3 = c3.to_hf_json();
  EXPECT_EQ(hf3.find("max_window_layers")->as_int(), 0);
  EXPECT_EQ(hf3.find("layer_types")->as_array().at(1).as_string(), "full_attention");
  const model::LlamaConfig b3 = model::llama_config_from_json(hf3, "export.json");
  for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(b3.window_of(l), c3.window_of(l));
  // Refused, naming the key: a sliding layer without a window, another attention type, a
  // layer_types of the wrong length, a negative window, a window in a Llama config.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"\"model_type\": \"qwen2\", \"use_sliding_window\": false, \"layer_types\": [\"full_attention\", "
       "\"sliding_attention\"], ",
       "m.json: layer_types marks"},
      {"\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 4, \"layer_types\": "
       "[\"full_attention\", \"chunked_attention\"], ",
       "m.json: layer_types[1] = \"chunked_attention\""},
      {"\"model_type\": \"qwen3\", \"use_sliding_window\": true, \"sliding_window\": 4, \"layer_types\": "
       "[\"full_attention\"], ",
       "m.json: layer_types must list one entry per layer (2)"},
      {"\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": -3, ",
       "m.json: sliding_window = -3"},
      {"\"model_type\": \"qwen2\", \"use_sliding_window\": \"yes\", ",
       "m.json: use_sliding_window must be true or false"},
      {"\"layer_types\": [\"sliding_attention\", \"full_attention\"], ", "m.json: layer_types[0] = sliding_attention"}};
  for (const auto& [insert, want] : bad) {
    const std::string e = input_error_of([&] { from_json(shape_json().insert(1, insert)); });
    EXPECT_NE(e.find(want), std::string::npos) << insert << ": " << e;
  }
  // model.config beside model.init hf:DIR must agree on the windows too.
  TempDir dir("cfg-win");
  fs::create_directories(dir / "hf");
  write(dir / "hf/config.json", c3.to_hf_json().dump(2));
  model::LlamaConfig other = c3;
  other.sliding_layers = {true, true, true};
  write(dir / "m.json", other.to_hf_json().dump(2));
  ModelConfig m;
  m.init = "hf:" + (dir / "hf");
  m.config = dir / "m.json";
  const std::string e = input_error_of([&] { model::resolve_llama_config(m); });
  EXPECT_NE(e.find("layer_types[1] sliding_attention vs full_attention"), std::string::npos) << e;
}

// model.init hf:DIR: the shape comes from DIR/config.json; a model.config given beside it
// must describe the same model, or the error names both and what differs.
TEST(LlamaConfigStrict, HfInitTakesTheShapeFromTheFolder) {
  std::mt19937_64 rng(test_seed());
  TempDir dir("cfg-hf");
  model::LlamaConfig shape = model::load_llama_config("tiny");
  shape.hidden_size = 32 * (1 + static_cast<int64_t>(rng() % 4));
  shape.intermediate_size = 50 + static_cast<int64_t>(rng() % 300);
  shape.num_layers = 1 + static_cast<int64_t>(rng() % 4);
  fs::create_directories(dir / "hf");
  write(dir / "hf/config.json", shape.to_hf_json().dump(2));
  ModelConfig m;
  m.init = "hf:" + (dir / "hf");
  model::LlamaConfig c = model::resolve_llama_config(m);  // model.config unset
  EXPECT_EQ(c.hidden_size, shape.hidden_size);
  EXPECT_EQ(c.intermediate_size, shape.intermediate_size);
  EXPECT_EQ(c.num_layers, shape.num_layers);
  // The same model given as a YAML: accepted, the folder's config used.
  write(dir / "same.yaml", "hidden_size: " + std::to_string(shape.hidden_size) +
                               "\nnum_hidden_layers: " + std::to_string(shape.num_layers) +
                               "\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
                               "head_dim: 16\nintermediate_size: " +
                               std::to_string(shape.intermediate_size) +
                               "\nvocab_size: 256\nrms_norm_eps: 1.0e-5\nrope_theta: 10000.0\n"
                               "max_position_embeddings: 4096\nbos_token_id: 7\n");
  m.config = dir / "same.yaml";
  c = model::resolve_llama_config(m);
  EXPECT_EQ(c.name, dir / "hf/config.json");
  EXPECT_EQ(c.max_position_embeddings, shape.max_position_embeddings);  // not compared, the folder's
  // A different model: both named, with the keys that differ.
  m.config = "demo";
  std::string e = input_error_of([&] { model::resolve_llama_config(m); });
  EXPECT_NE(e.find("model.config 'demo' and model.init hf:" + (dir / "hf") + " describe different models"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("vocab_size 2000 vs 256"), std::string::npos) << e;
  // Only rope_theta differs, and model.rope_theta overrides it anyway: accepted.
  write(dir / "theta.yaml", [&] {
    std::string t = read_file(dir / "same.yaml");
    return t.replace(t.find("rope_theta: 10000.0"), 19, "rope_theta: 500000.0");
  }());
  m.config = dir / "theta.yaml";
  e = input_error_of([&] { model::resolve_llama_config(m); });
  EXPECT_NE(e.find("rope_theta 500000 vs 10000"), std::string::npos) << e;
  m.rope_theta = 2e6;
  EXPECT_EQ(model::resolve_llama_config(m).rope_theta, 2e6);
  // A folder without config.json: model.config gives the shape; without it, an error naming DIR.
  fs::create_directories(dir / "bare");
  m = ModelConfig{};
  m.init = "hf:" + (dir / "bare");
  e = input_error_of([&] { model::resolve_llama_config(m); });
  EXPECT_NE(e.find("model.init hf:" + (dir / "bare") + ": the folder has no config.json"), std::string::npos) << e;
  m.config = "demo";
  EXPECT_EQ(model::resolve_llama_config(m).name, "demo");
  // A folder that does not exist is named at once, even with model.config given.
  m.init = "hf:" + (dir / "missing");
  e = input_error_of([&] { model::resolve_llama_config(m); });
  EXPECT_NE(e.find("model.init hf:" + (dir / "missing") + ": no such folder"), std::string::npos) << e;
  // A training run's folder given as a model: pointed at its export.
  fs::create_directories(dir / "run/final");
  write(dir / "run/final/config.json", shape.to_hf_json().dump(2));
  e = input_error_of([&] { model::load_llama_config(dir / "run"); });
  EXPECT_NE(e.find("its Hugging Face export is " + (dir / "run/final")), std::string::npos) << e;
}

}  // namespace
}  // namespace easyctx::test
