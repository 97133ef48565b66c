// Llama-family model shape: read from a Hugging Face config.json (Llama 2/3, TinyLlama,
// transformers 4.x `rope_theta`/`rope_scaling` or 5.x `rope_parameters`), or from a model
// YAML using the same key names (configs/models/<preset>.yaml). Also computes RoPE inverse
// frequencies exactly as HF does (default, linear, llama3 scaling; fp32 like HF).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/json.h"

namespace easyctx::model {

enum class RopeScalingKind { None, Linear, Llama3 };

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::None;
  double factor = 1.0;
  double low_freq_factor = 1.0;    // llama3
  double high_freq_factor = 4.0;   // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

struct LlamaConfig {
  std::string name;  // preset or file it came from
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 2048;
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Throws InputError naming the first inconsistent field.
  void validate() const;
  // RoPE inverse frequencies f32[head_dim/2], after rope_scaling (HF's formulas).
  std::vector<float> inv_freq() const;
  // Parameter count (embeddings, layers, final norm, untied head).
  int64_t num_parameters() const;
  // The HF config.json of this shape (LlamaForCausalLM; torch_dtype given by the caller).
  Json to_hf_json(const std::string& torch_dtype = "float32") const;
  std::string describe() const;  // one line for the startup log
};

// From an HF config.json object; `source` names it in errors.
LlamaConfig llama_config_from_json(const Json& j, const std::string& source);
// spec: a preset name (configs/models/<name>.yaml), a .yaml/.yml file, a config.json file,
// or a folder holding config.json.
LlamaConfig load_llama_config(const std::string& spec);
// The stage's model: model.config, except that with model.init hf:DIR and model.config left
// at its default the folder's config.json is used; model.rope_theta > 0 overrides theta.
LlamaConfig resolve_llama_config(const ModelConfig& m);
// Folder searched for presets: $EASYCTX_CONFIG_DIR/models, ./configs/models, then the
// source tree's configs/models.
std::vector<std::string> preset_dirs();

}  // namespace easyctx::model
