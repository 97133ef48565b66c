// Llama-family model shape: read from a Hugging Face config.json (Llama 2/3, TinyLlama,
// Mistral with its sliding window, Qwen2/Qwen2.5 with their q/k/v bias and per-layer windows,
// Qwen3 with its q/k norms,
// transformers 4.x `rope_theta`/`rope_scaling` or 5.x `rope_parameters`), or from a model
// YAML using the same key names (configs/models/<preset>.yaml). Also computes RoPE inverse
// frequencies exactly as HF does (default, linear, llama3, yarn scaling; fp32 like HF).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/json.h"

namespace easyctx::model {

// Dynamic: transformers' "dynamic" (NTK) scaling, whose base grows with the length of each call
// past max_position_embeddings (LlamaConfig::inv_freq(length)).
enum class RopeScalingKind { None, Linear, Llama3, Yarn, Dynamic };

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::None;
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3; yarn when has_original
  // yarn (transformers' _compute_yarn_parameters): given, original_max_position_embeddings
  // makes the factor max_position_embeddings / original (as HF does); attention_factor 0:
  // derived from the factor (and mscale / mscale_all_dim when both are set).
  bool has_original = false;
  double attention_factor = 0;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 0, mscale_all_dim = 0;
  bool truncate = true;
};

// Bounds of every dimension, checked by LlamaConfig::validate: far above any released Llama
// (405B: hidden 16384, 126 layers, 128 heads of 128, intermediate 53248, vocab 128256) and
// far below where a size derived from them could overflow. Products (parameter counts, the
// embedding, q/kv projections) are checked too, against kMaxElements (core/checked.h).
struct LlamaLimits {
  static constexpr int64_t hidden_size = int64_t{1} << 20;
  static constexpr int64_t num_layers = int64_t{1} << 16;
  static constexpr int64_t num_heads = int64_t{1} << 16;
  static constexpr int64_t head_dim = int64_t{1} << 16;
  static constexpr int64_t projection = int64_t{1} << 24;  // num_heads x head_dim (and kv)
  static constexpr int64_t intermediate_size = int64_t{1} << 24;
  static constexpr int64_t vocab_size = (int64_t{1} << 31) - 1;  // ids are int32
  static constexpr int64_t max_position_embeddings = int64_t{1} << 40;
};

struct LlamaConfig {
  std::string name;  // preset or file it came from
  // "llama" (also "mistral": the same decoder) or "qwen2" (Qwen2 / Qwen2.5: a bias on the
  // q, k and v projections, qkv_bias); the HF export writes the matching architecture.
  std::string model_type = "llama";
  bool qkv_bias = false;
  // "qwen3": RMSNorm over each head's q and k (one gain per head dimension, shared by the
  // heads, the norm's epsilon rms_norm_eps) after the projection, before RoPE.
  bool qk_norm = false;
  // The sliding window of the layers that have one: each query sees the last sliding_window
  // positions only (transformers' kv_idx > q_idx - sliding_window); 0: the whole causal past in
  // every layer. "mistral": every layer; qwen2/qwen3 with use_sliding_window: the layers that
  // transformers' layer_types marks "sliding_attention" (those from max_window_layers on, unless
  // layer_types is given), listed in sliding_layers.
  int64_t sliding_window = 0;
  // [num_layers], true for a layer with the window; empty: every layer (when sliding_window > 0).
  std::vector<bool> sliding_layers;
  // The window of layer l (0: full attention).
  int64_t window_of(int64_t l) const {
    return sliding_window > 0 && (sliding_layers.empty() || sliding_layers[static_cast<size_t>(l)]) ? sliding_window
                                                                                                    : 0;
  }
  // How many layers have the window.
  int64_t windowed_layers() const;
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
  // Throws InputError naming the file (name) and the first inconsistent or out-of-range
  // field: every dimension positive and within LlamaLimits, every float finite, and every
  // derived size (parameter count, each tensor) within kMaxElements without overflow.
  void validate() const;
  // Throws InputError when `tokens` rows of this model's activations ([tokens, hidden_size],
  // [tokens, intermediate_size], [tokens, heads x head_dim], [tokens, vocab] logits of a
  // head tile of `head_rows`) would overflow or exceed kMaxElements; `what` names where the
  // token count came from (e.g. "train.batch_size x data.seq_length").
  void check_tokens(int64_t tokens, int64_t head_rows, const std::string& what) const;
  // RoPE inverse frequencies f32[head_dim/2], after rope_scaling (HF's formulas). For dynamic
  // scaling those of a call of `length` positions (its largest position id + 1; transformers'
  // seq_len): the base rescaled when length > max_position_embeddings, the plain frequencies
  // otherwise (and for length 0, transformers' initial table); other kinds ignore the length.
  std::vector<float> inv_freq(int64_t length = 0) const;
  bool dynamic_rope() const { return rope_scaling.kind == RopeScalingKind::Dynamic; }
  // The factor HF multiplies cos and sin by (yarn's attention factor; 1 otherwise): the
  // attention logits scale by its square.
  double rope_attention_factor() const;
  // yarn's factor as HF uses it (max_position_embeddings / original when the original is given).
  double yarn_factor() const;
  // Parameter count (embeddings, layers, final norm, untied head); overflow-checked.
  int64_t num_parameters() const;
  // The HF config.json of this shape (LlamaForCausalLM; torch_dtype given by the caller).
  Json to_hf_json(const std::string& torch_dtype = "float32") const;
  std::string describe() const;  // one line for the startup log
};

// From an HF config.json object; `source` names it in errors.
LlamaConfig llama_config_from_json(const Json& j, const std::string& source);
// spec: a preset name (configs/models/<name>.yaml), a .yaml/.yml file, a config.json file,
// or a folder holding config.json. A model YAML takes only the keys easyctx reads (an unknown
// one is an InputError with file:line:column and a suggestion); a config.json may carry any
// key transformers writes (unknown ones are named in a warning), but keys that would change
// the model (sliding_window outside mistral/qwen2/qwen3, attention_dropout, partial_rotary_factor,
// quantization_config, biases, activation, model_type) must hold their neutral value. docs/model.md.
LlamaConfig load_llama_config(const std::string& spec);
// The stage's model. With model.init hf:DIR: DIR/config.json, which model.config may repeat
// (left at its default, or describing the same model) but not contradict (an InputError
// naming both and the keys that differ); model.config alone when DIR has no config.json.
// Otherwise model.config. model.rope_theta > 0 overrides theta.
LlamaConfig resolve_llama_config(const ModelConfig& m);
// Folder searched for presets: $EASYCTX_CONFIG_DIR/models, ./configs/models, then the
// source tree's configs/models.
std::vector<std::string> preset_dirs();

}  // namespace easyctx::model
