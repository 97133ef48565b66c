// Llama configuration: presets, HF config.json variants (transformers 4.x and 5.x RoPE
// keys), overrides, errors, and the config.json round trip.
#include <cmath>

#include "core/error.h"
#include "core/strings.h"
#include "model/llama_config.h"
#include "test_util.h"

namespace easyctx::test {
namespace {

model::LlamaConfig from(const std::string& json) { return model::llama_config_from_json(parse_json(json), "t.json"); }

TEST(LlamaConfig, PresetsLoad) {
  for (const char* p : {"tiny", "demo", "tinyllama-1b", "llama2-7b", "llama2-13b", "llama3-8b", "qwen2.5-7b",
                        "qwen3-8b", "mistral-7b-v0.1", "llama3.2-3b", "qwen2.5-3b", "qwen3-4b"}) {
    const model::LlamaConfig c = model::load_llama_config(p);
    EXPECT_EQ(c.name, p);
    EXPECT_NO_THROW(c.validate());
  }
  const model::LlamaConfig l7 = model::load_llama_config("llama2-7b");
  EXPECT_NEAR(static_cast<double>(l7.num_parameters()), 6.738e9, 0.01e9);
  const model::LlamaConfig l3 = model::load_llama_config("llama3-8b");
  EXPECT_NEAR(static_cast<double>(l3.num_parameters()), 8.03e9, 0.01e9);
  EXPECT_EQ(l3.num_kv_heads, 8);
  EXPECT_EQ(l3.head_dim, 128);
  const model::LlamaConfig tl = model::load_llama_config("tinyllama-1b");
  EXPECT_NEAR(static_cast<double>(tl.num_parameters()), 1.1e9, 0.01e9);
  // Qwen2.5-7B: 7.62B parameters with its q/k/v biases (the model card's 7.61B).
  const model::LlamaConfig q7 = model::load_llama_config("qwen2.5-7b");
  EXPECT_EQ(q7.model_type, "qwen2");
  EXPECT_TRUE(q7.qkv_bias);
  EXPECT_EQ(q7.num_parameters(), 7615616512);
  // Qwen3-8B: 8.19B with its q/k norms (the model card's 8.2B).
  const model::LlamaConfig q8 = model::load_llama_config("qwen3-8b");
  EXPECT_TRUE(q8.qk_norm);
  EXPECT_FALSE(q8.qkv_bias);
  EXPECT_EQ(q8.num_parameters(), 8190735360);
  // Mistral-7B-v0.1: 7.24B, a window of 4096.
  const model::LlamaConfig m7 = model::load_llama_config("mistral-7b-v0.1");
  EXPECT_EQ(m7.model_type, "mistral");
  EXPECT_EQ(m7.sliding_window, 4096);
  EXPECT_EQ(m7.num_parameters(), 7241732096);
  // The 3-4B members (tied embeddings, counted once): Llama-3.2-3B 3.21B with its llama3 RoPE
  // scaling, Qwen2.5-3B 3.09B with its biases, Qwen3-4B 4.02B with its q/k norms (the model
  // cards' 3.21B, 3.09B and 4.0B).
  const model::LlamaConfig l32 = model::load_llama_config("llama3.2-3b");
  EXPECT_TRUE(l32.tie_word_embeddings);
  EXPECT_EQ(l32.rope_scaling.kind, model::RopeScalingKind::Llama3);
  EXPECT_NEAR(static_cast<double>(l32.num_parameters()), 3.21e9, 0.01e9);
  const model::LlamaConfig q25 = model::load_llama_config("qwen2.5-3b");
  EXPECT_TRUE(q25.qkv_bias);
  EXPECT_EQ(q25.num_kv_heads, 2);
  EXPECT_NEAR(static_cast<double>(q25.num_parameters()), 3.09e9, 0.01e9);
  const model::LlamaConfig q34 = model::load_llama_config("qwen3-4b");
  EXPECT_TRUE(q34.qk_norm);
  EXPECT_NEAR(static_cast<double>(q34.num_parameters()), 4.02e9, 0.01e9);
}

// YaRN as transformers computes it: head_dim 16 (8 frequencies), theta 10000, factor 4 over
// 2048 positions: the correction bounds (beta_fast 32, beta_slow 1) are dimensions
// floor(16 ln(2048 / (32 2 pi)) / (2 ln 10000)) = floor(2.016) = 2 and ceil(16 ln(2048 / (2 pi))
// / (2 ln 10000)) = ceil(5.026) = 6; up to 2 the frequencies stay, from 6 on they are divided
// by the factor, and between the ramp (i - 2) / 4 mixes them; the attention factor is 0.1 ln 4 + 1, its square scales the logits.
TEST(LlamaConfig, YarnFrequenciesAndAttentionFactor) {
  const std::string base = R"("hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 100, "vocab_size": 50, "rope_theta": 10000.0,
    "max_position_embeddings": 2048)";
  const auto plain = from("{" + base + "}");
  const auto y = from("{" + base + R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})");
  EXPECT_EQ(y.rope_scaling.kind, model::RopeScalingKind::Yarn);
  const std::vector<float> f = y.inv_freq(), p = plain.inv_freq();
  ASSERT_EQ(f.size(), 8u);
  for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(f[i], p[i]) << i;
  for (size_t i = 6; i < 8; ++i) EXPECT_NEAR(f[i], p[i] / 4.0f, 1e-6f * p[i]) << i;
  for (size_t i = 3; i < 6; ++i) {  // ramp (i - 2) / 4 towards the interpolated frequency
    const float ramp = (static_cast<float>(i) - 2.0f) / 4.0f;
    EXPECT_NEAR(f[i], p[i] / 4.0f * ramp + p[i] * (1.0f - ramp), 1e-6f * p[i]) << i;
  }
  EXPECT_DOUBLE_EQ(y.rope_attention_factor(), 0.1 * std::log(4.0) + 1.0);
  EXPECT_DOUBLE_EQ(plain.rope_attention_factor(), 1.0);
  // original_max_position_embeddings: HF takes the factor as max_position_embeddings / original.
  const auto yo = from("{" + base + R"(, "rope_scaling": {"type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 512, "attention_factor": 1.25, "beta_fast": 16}})");
  EXPECT_DOUBLE_EQ(yo.yarn_factor(), 4.0);
  EXPECT_DOUBLE_EQ(yo.rope_attention_factor(), 1.25);
  // The export carries every key back.
  const model::LlamaConfig back = model::llama_config_from_json(yo.to_hf_json(), "export.json");
  EXPECT_EQ(back.inv_freq(), yo.inv_freq());
  EXPECT_DOUBLE_EQ(back.rope_attention_factor(), 1.25);
  const std::string e = test::input_error_of(
      [&] { from("{" + base + R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": 3}})"); });
  EXPECT_NE(e.find("truncate"), std::string::npos) << e;
}

TEST(LlamaConfig, UnknownPresetSuggestsNearest) {
  try {
    model::load_llama_config("llama2-7");
    FAIL();
  } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find("llama2-7b"), std::string::npos) << e.what(); }
}

TEST(LlamaConfig, HfRopeVariants) {
  const std::string base = R"("hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 100, "vocab_size": 50, "rope_theta": 500000.0)";
  EXPECT_EQ(from("{" + base + "}").rope_scaling.kind, model::RopeScalingKind::None);
  const auto lin = from("{" + base + R"(, "rope_scaling": {"type": "linear", "factor": 4.0}})");
  EXPECT_EQ(lin.rope_scaling.kind, model::RopeScalingKind::Linear);
  const auto plain = from("{" + base + "}");
  for (size_t i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(lin.inv_freq()[i] * 4.0f, plain.inv_freq()[i]);
  const auto l3 = from("{" + base + R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  EXPECT_EQ(l3.rope_scaling.kind, model::RopeScalingKind::Llama3);
  EXPECT_FLOAT_EQ(l3.inv_freq()[0], plain.inv_freq()[0]);         // high frequency: unchanged
  EXPECT_FLOAT_EQ(l3.inv_freq()[7] * 8.0f, plain.inv_freq()[7]);  // low frequency: / factor
  const auto v5 = from(R"({"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
    "intermediate_size": 100, "vocab_size": 50,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}})");
  EXPECT_EQ(v5.rope_theta, 1234.0);
  EXPECT_EQ(v5.num_kv_heads, 4);
  EXPECT_EQ(v5.head_dim, 16);
  // dynamic (NTK): the plain frequencies up to max_position_embeddings (2048 by default here),
  // rescaled past it; exported and read back the same; another type is refused by name.
  const auto dyn = from("{" + base + R"(, "rope_scaling": {"type": "dynamic", "factor": 4.0}})");
  EXPECT_EQ(dyn.rope_scaling.kind, model::RopeScalingKind::Dynamic);
  EXPECT_EQ(dyn.inv_freq(), plain.inv_freq());
  EXPECT_EQ(dyn.inv_freq(2048), plain.inv_freq());
  EXPECT_LT(dyn.inv_freq(4096)[7], plain.inv_freq()[7]);
  EXPECT_EQ(dyn.inv_freq(4096)[0], plain.inv_freq()[0]);  // the base's power 0
  const model::LlamaConfig back = model::llama_config_from_json(dyn.to_hf_json(), "export.json");
  EXPECT_EQ(back.rope_scaling.kind, model::RopeScalingKind::Dynamic);
  EXPECT_EQ(back.inv_freq(5000), dyn.inv_freq(5000));
  EXPECT_NE(dyn.describe().find("dynamic x4"), std::string::npos) << dyn.describe();
  try {
    from("{" + base + R"(, "rope_scaling": {"type": "longrope", "factor": 4.0}})");
    FAIL() << "longrope accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_scaling type 'longrope' is not supported"), std::string::npos)
        << e.what();
  }
}

TEST(LlamaConfig, ErrorsNameTheKey) {
  try {
    from(R"({"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 3, "num_key_value_heads": 2,
             "intermediate_size": 10, "vocab_size": 5})");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads"), std::string::npos) << e.what();
  }
  try {
    from(R"({"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 10, "vocab_size": 5})");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("num_hidden_layers"), std::string::npos) << e.what();
  }
}

TEST(LlamaConfig, RopeThetaOverrideAndJsonRoundTrip) {
  ModelConfig mc;
  mc.config = "llama3-8b";
  mc.rope_theta = 4e6;
  model::LlamaConfig c = model::resolve_llama_config(mc);
  EXPECT_EQ(c.rope_theta, 4e6);
  c.rope_scaling.kind = model::RopeScalingKind::Llama3;
  c.rope_scaling.factor = 8;
  const model::LlamaConfig back = model::llama_config_from_json(parse_json(c.to_hf_json().dump()), "rt");
  EXPECT_EQ(back.rope_theta, 4e6);
  EXPECT_EQ(back.rope_scaling.kind, model::RopeScalingKind::Llama3);
  EXPECT_EQ(back.num_parameters(), c.num_parameters());
  EXPECT_EQ(back.inv_freq(), c.inv_freq());
}

}  // namespace
}  // namespace easyctx::test
