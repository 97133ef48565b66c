// Reading a Hugging Face config.json (or a model YAML, turned into the same JSON by
// llama_config_load.cpp) into a LlamaConfig: the keys easyctx reads with their defaults,
// rope_scaling / rope_parameters, the sliding windows, and the keys refused unless they hold
// their neutral value. llama_config_from_json ends with LlamaConfig::validate (llama_config.cpp).
#include <algorithm>

#include "core/error.h"
#include "model/llama_config.h"

namespace easyctx::model {

namespace {

int64_t get_int(const Json& j, const char* key, const std::string& src, int64_t def, bool required) {
  const Json* v = j.find(key);
  if (!v || v->is_null()) {
    EASYCTX_CHECK_INPUT(!required, src, ": missing required key '", key, "'");
    return def;
  }
  EASYCTX_CHECK_INPUT(v->is_integer(), src, ": '", key, "' must be an integer, got ", v->dump());
  return v->as_int();
}

double get_num(const Json& j, const char* key, const std::string& src, double def) {
  const Json* v = j.find(key);
  if (!v || v->is_null()) return def;
  EASYCTX_CHECK_INPUT(v->is_number(), src, ": '", key, "' must be a number, got ", v->dump());
  return v->as_double();
}

// eos_token_id may be a list (Llama 3.1): the first entry.
int64_t get_token_id(const Json& j, const char* key, const std::string& src, int64_t def) {
  const Json* v = j.find(key);
  if (!v || v->is_null()) return def;
  if (v->is_array() && v->size() > 0 && (*v)[0].is_integer()) return (*v)[0].as_int();
  EASYCTX_CHECK_INPUT(v->is_integer(), src, ": '", key, "' must be an integer or a list of them, got ", v->dump());
  return v->as_int();
}

// yarn's optional keys (absent or null: HF's defaults; beta_fast/slow 0 also, as HF's `or`).
void parse_yarn(const Json& rs, const std::string& src, RopeScaling& r) {
  r.kind = RopeScalingKind::Yarn;
  auto opt = [&](const char* k, double def) {
    const Json* v = rs.find(k);
    return v && !v->is_null() ? get_num(rs, k, src, def) : def;
  };
  r.attention_factor = opt("attention_factor", 0);
  r.beta_fast = opt("beta_fast", 32);
  r.beta_slow = opt("beta_slow", 1);
  if (r.beta_fast == 0) r.beta_fast = 32;
  if (r.beta_slow == 0) r.beta_slow = 1;
  r.mscale = opt("mscale", 0);
  r.mscale_all_dim = opt("mscale_all_dim", 0);
  if (const Json* v = rs.find("original_max_position_embeddings"); v && !v->is_null()) {
    r.has_original = true;
    r.original_max_position_embeddings =
        get_int(rs, "original_max_position_embeddings", src + " rope_scaling", 0, true);
  }
  if (const Json* v = rs.find("truncate"); v && !v->is_null()) {
    EASYCTX_CHECK_INPUT(v->is_bool(), src, ": rope_scaling.truncate must be true or false, got ", v->dump());
    r.truncate = v->as_bool();
  }
}

// rope_scaling (4.x) or rope_parameters (5.x): {"rope_type"|"type": ..., "factor": ...}.
void parse_rope(const Json& j, const std::string& src, LlamaConfig& c) {
  const Json* rp = j.find("rope_parameters");
  if (rp && rp->is_object()) c.rope_theta = get_num(*rp, "rope_theta", src, c.rope_theta);
  const Json* rs = j.find("rope_scaling");
  if (!rs || rs->is_null()) rs = (rp && rp->is_object()) ? rp : nullptr;
  if (!rs) return;
  EASYCTX_CHECK_INPUT(rs->is_object(), src, ": rope_scaling must be an object, got ", rs->dump());
  const Json* t = rs->find("rope_type");
  if (!t) t = rs->find("type");
  const std::string type = t && t->is_string() ? t->as_string() : "default";
  if (type == "default") return;
  if (type == "linear") {
    c.rope_scaling.kind = RopeScalingKind::Linear;
  } else if (type == "llama3") {
    c.rope_scaling.kind = RopeScalingKind::Llama3;
    c.rope_scaling.low_freq_factor = get_num(*rs, "low_freq_factor", src, 1.0);
    c.rope_scaling.high_freq_factor = get_num(*rs, "high_freq_factor", src, 4.0);
    c.rope_scaling.original_max_position_embeddings =
        get_int(*rs, "original_max_position_embeddings", src + " rope_scaling", 8192, true);
  } else if (type == "yarn") {
    parse_yarn(*rs, src, c.rope_scaling);
  } else if (type == "dynamic") {
    c.rope_scaling.kind = RopeScalingKind::Dynamic;
  } else {
    EASYCTX_THROW_INPUT(src, ": rope_scaling type '", type,
                        "' is not supported (default, linear, llama3, yarn, dynamic)");
  }
  c.rope_scaling.factor = get_num(*rs, "factor", src, 1.0);
}

// Keys of a config.json that would change the model if easyctx ignored them: refused unless
// they hold their neutral value.
void check_neutral_keys(const Json& j, const std::string& src) {
  // Mistral, Qwen2 and Qwen3 read their windows (parse_windows); transformers' Llama has none.
  const Json* mt = j.find("model_type");
  const std::string type = mt && mt->is_string() ? mt->as_string() : "llama";
  const bool windows = type == "mistral" || type == "qwen2" || type == "qwen3";
  if (const Json* v = j.find("sliding_window"); v && !v->is_null() && !windows)
    EASYCTX_THROW_INPUT(src, ": sliding_window = ", v->dump(), " is not supported for model_type ", type,
                        " (transformers' Llama attends over the whole sequence); set it to null in a copy of the "
                        "config to train with full attention, or give model_type mistral");
  if (const Json* v = j.find("attention_dropout"); v && !v->is_null())
    EASYCTX_CHECK_INPUT(v->is_number() && v->as_double() == 0, src, ": attention_dropout = ", v->dump(),
                        " is not supported (easyctx trains without dropout); expected 0");
  if (const Json* v = j.find("partial_rotary_factor"); v && !v->is_null())
    EASYCTX_CHECK_INPUT(v->is_number() && v->as_double() == 1, src, ": partial_rotary_factor = ", v->dump(),
                        " is not supported (RoPE rotates the whole head); expected 1");
  if (const Json* v = j.find("quantization_config"); v && !v->is_null())
    EASYCTX_THROW_INPUT(src,
                        ": quantization_config is set: quantized checkpoints are not supported (give the "
                        "bf16/f16/f32 weights)");
}

// transformers' layer_types entry for layer `l` (`what`: where it came from): true for
// "sliding_attention", false for "full_attention"; any other attention is refused.
bool sliding_layer_type(const Json& t, const std::string& src, size_t l) {
  EASYCTX_CHECK_INPUT(t.is_string() && (t.as_string() == "full_attention" || t.as_string() == "sliding_attention"), src,
                      ": layer_types[", l, "] = ", t.dump(), " is not supported (full_attention or sliding_attention)");
  return t.as_string() == "sliding_attention";
}

// The windowed layers as transformers 5.x derives them (Qwen2Config / Qwen3Config): layer_types
// when given, else "sliding_attention" for layers from max_window_layers on (default 28) where
// the window is set; every layer for mistral (MistralModel masks every layer by sliding_window,
// whatever a layer_types key says).
std::vector<bool> window_layers(const Json& j, const std::string& src, int64_t layers, bool mistral, bool window) {
  if (layers <= 0 || layers > LlamaLimits::num_layers) return {};  // (validate names the bound)
  std::vector<bool> v(static_cast<size_t>(layers), mistral && window);
  if (mistral) return v;
  if (const Json* lt = j.find("layer_types"); lt && !lt->is_null()) {
    EASYCTX_CHECK_INPUT(lt->is_array() && static_cast<int64_t>(lt->size()) == layers, src,
                        ": layer_types must list one entry per layer (", layers, "), got ", lt->dump());
    for (size_t l = 0; l < v.size(); ++l) v[l] = sliding_layer_type((*lt)[l], src, l);
  } else {
    const int64_t first = get_int(j, "max_window_layers", src, 28, false);
    for (int64_t l = std::max<int64_t>(first, 0); l < layers; ++l) v[static_cast<size_t>(l)] = window;
  }
  return v;
}

// The sliding window (docs/model.md): mistral's sliding_window in every layer (null or 0: none,
// a Llama); qwen2/qwen3's only with use_sliding_window true (transformers sets it to None
// otherwise), in the layers window_layers gives. A layer marked sliding without a window is
// refused (transformers cannot build its mask either).
void parse_windows(const Json& j, const std::string& src, const std::string& type, LlamaConfig& c) {
  const bool mistral = type == "mistral";
  if (!mistral && type != "qwen2" && type != "qwen3") {  // llama: layer_types may only say full_attention
    if (const Json* lt = j.find("layer_types"); lt && lt->is_array())
      for (size_t l = 0; l < lt->size(); ++l)
        EASYCTX_CHECK_INPUT(!sliding_layer_type((*lt)[l], src, l), src, ": layer_types[", l,
                            "] = sliding_attention needs a window (model_type mistral, qwen2 or qwen3)");
    return;
  }
  bool on = mistral;
  if (const Json* use = j.find("use_sliding_window"); !mistral && use && !use->is_null()) {
    EASYCTX_CHECK_INPUT(use->is_bool(), src, ": use_sliding_window must be true or false, got ", use->dump());
    on = use->as_bool();
  }
  const int64_t w = on ? get_int(j, "sliding_window", src, 0, false) : 0;
  EASYCTX_CHECK_INPUT(w >= 0, src, ": sliding_window = ", w, " (must be > 0, or 0 / null for none)");
  const std::vector<bool> layers = window_layers(j, src, c.num_layers, mistral, w > 0);
  const bool any = std::find(layers.begin(), layers.end(), true) != layers.end();
  EASYCTX_CHECK_INPUT(!any || w > 0, src,
                      ": layer_types marks sliding_attention layers, but no window is set (use_sliding_window "
                      "true and sliding_window > 0)");
  c.sliding_window = any ? w : 0;
  if (any && !mistral) c.sliding_layers = layers;
}

}  // namespace

LlamaConfig llama_config_from_json(const Json& j, const std::string& src) {
  EASYCTX_CHECK_INPUT(j.is_object(), src, ": expected a JSON object");
  std::string type = "llama";
  if (const Json* mt = j.find("model_type"); mt && mt->is_string()) type = mt->as_string();
  EASYCTX_CHECK_INPUT(type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3", src, ": model_type '",
                      type, "' is not supported (llama, mistral, qwen2, qwen3)");
  check_neutral_keys(j, src);
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (const Json* b = j.find(k); b && b->is_bool())
      EASYCTX_CHECK_INPUT(!b->as_bool(), src, ": ", k, " = true is not supported");
  if (const Json* act = j.find("hidden_act"); act && act->is_string())
    EASYCTX_CHECK_INPUT(act->as_string() == "silu", src, ": hidden_act '", act->as_string(), "' (only silu)");
  LlamaConfig c;
  c.name = src;
  c.qkv_bias = type == "qwen2";  // Qwen2Attention: q/k/v_proj with bias, o_proj without
  c.qk_norm = type == "qwen3";   // Qwen3Attention: q_norm/k_norm over head_dim before RoPE
  c.hidden_size = get_int(j, "hidden_size", src, 0, true);
  c.num_layers = get_int(j, "num_hidden_layers", src, 0, true);
  parse_windows(j, src, type, c);
  // Mistral: the Llama decoder with a sliding window (none: exactly a Llama).
  c.model_type = type == "mistral" ? (c.sliding_window > 0 ? "mistral" : "llama") : type;
  c.num_heads = get_int(j, "num_attention_heads", src, 0, true);
  c.num_kv_heads = get_int(j, "num_key_value_heads", src, c.num_heads, false);
  c.head_dim = get_int(j, "head_dim", src, c.num_heads > 0 ? c.hidden_size / c.num_heads : 0, false);
  c.intermediate_size = get_int(j, "intermediate_size", src, 0, true);
  c.vocab_size = get_int(j, "vocab_size", src, 0, true);
  c.rms_norm_eps = get_num(j, "rms_norm_eps", src, 1e-6);
  c.rope_theta = get_num(j, "rope_theta", src, 10000.0);
  parse_rope(j, src, c);
  if (const Json* t = j.find("tie_word_embeddings"); t && t->is_bool()) c.tie_word_embeddings = t->as_bool();
  c.max_position_embeddings = get_int(j, "max_position_embeddings", src, 2048, false);
  c.bos_token_id = get_token_id(j, "bos_token_id", src, 1);
  c.eos_token_id = get_token_id(j, "eos_token_id", src, 2);
  c.validate();
  return c;
}

}  // namespace easyctx::model
