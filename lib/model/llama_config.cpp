// LlamaConfig's checks and what it derives: the bounds of every dimension (validate), the
// sizes a run's tokens imply (check_tokens), the parameter count, the Hugging Face export's
// config.json, the startup log line, and model.init hf:DIR's config against model.config
// (resolve_llama_config). Reading the config files: llama_config_json.cpp, llama_config_load.cpp.
#include "model/llama_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "core/checked.h"
#include "core/error.h"
#include "core/strings.h"

namespace easyctx::model {
namespace fs = std::filesystem;

void LlamaConfig::validate() const {
  auto dim = [&](const char* k, int64_t v, int64_t limit) {
    EASYCTX_CHECK_INPUT(v > 0, name, ": ", k, " must be > 0, got ", v);
    EASYCTX_CHECK_INPUT(v <= limit, name, ": ", k, " = ", v, " is above the limit of ", limit,
                        " (far beyond any Llama; a typo or a corrupt config?)");
  };
  dim("hidden_size", hidden_size, LlamaLimits::hidden_size);
  dim("num_hidden_layers", num_layers, LlamaLimits::num_layers);
  dim("num_attention_heads", num_heads, LlamaLimits::num_heads);
  dim("num_key_value_heads", num_kv_heads, LlamaLimits::num_heads);
  dim("head_dim", head_dim, LlamaLimits::head_dim);
  dim("intermediate_size", intermediate_size, LlamaLimits::intermediate_size);
  dim("vocab_size", vocab_size, LlamaLimits::vocab_size);
  dim("max_position_embeddings", max_position_embeddings, LlamaLimits::max_position_embeddings);
  EASYCTX_CHECK_INPUT(num_heads % num_kv_heads == 0, name, ": num_attention_heads ", num_heads,
                      " is not a multiple of num_key_value_heads ", num_kv_heads);
  EASYCTX_CHECK_INPUT(head_dim % 2 == 0, name, ": head_dim ", head_dim, " must be even for RoPE");
  EASYCTX_CHECK_INPUT(q_dim() <= LlamaLimits::projection, name, ": num_attention_heads x head_dim = ", num_heads, " x ",
                      head_dim, " = ", q_dim(), " is above the limit of ", LlamaLimits::projection);
  auto finite_pos = [&](const char* k, double v) {
    EASYCTX_CHECK_INPUT(std::isfinite(v) && v > 0, name, ": ", k, " must be a finite number > 0, got ", v);
  };
  finite_pos("rms_norm_eps", rms_norm_eps);
  finite_pos("rope_theta", rope_theta);
  finite_pos("rope_scaling.factor", rope_scaling.factor);
  if (rope_scaling.kind == RopeScalingKind::Llama3) {
    finite_pos("rope_scaling.low_freq_factor", rope_scaling.low_freq_factor);
    finite_pos("rope_scaling.high_freq_factor", rope_scaling.high_freq_factor);
    dim("rope_scaling.original_max_position_embeddings", rope_scaling.original_max_position_embeddings,
        LlamaLimits::max_position_embeddings);
    EASYCTX_CHECK_INPUT(rope_scaling.high_freq_factor != rope_scaling.low_freq_factor, name,
                        ": llama3 rope_scaling needs high_freq_factor != low_freq_factor");
  }
  if (rope_scaling.kind == RopeScalingKind::Yarn) {
    if (rope_scaling.has_original)
      dim("rope_scaling.original_max_position_embeddings", rope_scaling.original_max_position_embeddings,
          LlamaLimits::max_position_embeddings);
    finite_pos("rope_scaling.beta_fast", rope_scaling.beta_fast);
    finite_pos("rope_scaling.beta_slow", rope_scaling.beta_slow);
    EASYCTX_CHECK_INPUT(std::isfinite(rope_scaling.attention_factor) && rope_scaling.attention_factor >= 0, name,
                        ": rope_scaling.attention_factor must be a finite number >= 0, got ",
                        rope_scaling.attention_factor);
    finite_pos("rope_scaling.factor as yarn uses it", yarn_factor());
  }
  EASYCTX_CHECK_INPUT(sliding_window >= 0, name, ": sliding_window = ", sliding_window, " (must be >= 0; 0: none)");
  EASYCTX_CHECK_INPUT(sliding_layers.empty() || static_cast<int64_t>(sliding_layers.size()) == num_layers, name, ": ",
                      sliding_layers.size(), " layer types for ", num_layers, " layers");
  // Every tensor and the whole model within kMaxElements (num_parameters checks each term).
  checked_elements({vocab_size, hidden_size}, name + ": the embedding, vocab_size x hidden_size");
  checked_elements({intermediate_size, hidden_size}, name + ": an MLP matrix, intermediate_size x hidden_size");
  (void)num_parameters();
}

void LlamaConfig::check_tokens(int64_t tokens, int64_t head_rows, const std::string& what) const {
  EASYCTX_CHECK_INPUT(tokens > 0, what, ": ", tokens, " tokens, expected > 0");
  const std::string w = what + " (" + std::to_string(tokens) + " tokens) x ";
  checked_elements({tokens, std::max(hidden_size, q_dim())}, w + "max(hidden_size, heads x head_dim) activations");
  checked_elements({tokens, intermediate_size}, w + "intermediate_size MLP activations");
  checked_elements({tokens, num_heads}, w + "num_attention_heads attention statistics");
  checked_elements({std::min(tokens, std::max<int64_t>(1, head_rows)), vocab_size},
                   what + ": an LM-head tile of logits (tile rows x vocab_size)");
}

int64_t LlamaConfig::windowed_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_layers; ++l) n += window_of(l) > 0;
  return n;
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t d = hidden_size;
  const std::string w = name + ": parameter count";
  auto el = [&](std::initializer_list<int64_t> f, const char* what) { return checked_elements(f, w + ", " + what); };
  int64_t layer = el({2, d, q_dim()}, "2 x hidden_size x heads x head_dim (q, o)");
  layer = checked_add(layer, el({2, d, kv_dim()}, "2 x hidden_size x kv_heads x head_dim (k, v)"), w);
  layer = checked_add(layer, el({3, d, intermediate_size}, "3 x hidden_size x intermediate_size (MLP)"), w);
  layer = checked_add(layer, el({2, d}, "2 x hidden_size (norms)"), w);
  if (qkv_bias) layer = checked_add(layer, checked_add(q_dim(), 2 * kv_dim(), w), w);
  if (qk_norm) layer = checked_add(layer, 2 * head_dim, w);
  const int64_t embed = el({vocab_size, d, tie_word_embeddings ? 1 : 2}, "vocab_size x hidden_size (embedding, head)");
  const int64_t layers = el({num_layers, layer}, "num_hidden_layers x the parameters of a layer");
  return checked_elements({checked_add(checked_add(embed, layers, w), d, w)}, w);
}

namespace {
void yarn_to_json(const RopeScaling& r, Json& rs) {
  if (r.has_original) rs.set("original_max_position_embeddings", r.original_max_position_embeddings);
  if (r.attention_factor > 0) rs.set("attention_factor", r.attention_factor);
  rs.set("beta_fast", r.beta_fast);
  rs.set("beta_slow", r.beta_slow);
  if (r.mscale != 0) rs.set("mscale", r.mscale);
  if (r.mscale_all_dim != 0) rs.set("mscale_all_dim", r.mscale_all_dim);
  if (!r.truncate) rs.set("truncate", false);
}
// Qwen2/Qwen3's window keys: off (full attention), or on with the window, transformers'
// layer_types and, for readers without layer_types, max_window_layers (the leading full layers).
void windows_to_json(const LlamaConfig& c, Json& j) {
  j.set("use_sliding_window", c.sliding_window > 0);
  if (c.sliding_window == 0) return;
  j.set("sliding_window", c.sliding_window);
  int64_t full = 0;
  while (full < c.num_layers && c.window_of(full) == 0) ++full;
  j.set("max_window_layers", full);
  Json types = Json::array();
  for (int64_t l = 0; l < c.num_layers; ++l)
    types.push_back(Json(c.window_of(l) > 0 ? "sliding_attention" : "full_attention"));
  j.set("layer_types", types);
}
}  // namespace

Json LlamaConfig::to_hf_json(const std::string& torch_dtype) const {
  Json j = Json::object();
  Json arch = Json::array();
  const bool qwen2 = model_type == "qwen2", qwen3 = model_type == "qwen3", mistral = model_type == "mistral";
  arch.push_back(Json(qwen2     ? "Qwen2ForCausalLM"
                      : qwen3   ? "Qwen3ForCausalLM"
                      : mistral ? "MistralForCausalLM"
                                : "LlamaForCausalLM"));
  j.set("architectures", arch);
  j.set("model_type", qwen2 || qwen3 || mistral ? model_type : "llama");
  if (mistral) j.set("sliding_window", sliding_window);
  j.set("hidden_size", hidden_size);
  j.set("intermediate_size", intermediate_size);
  j.set("num_hidden_layers", num_layers);
  j.set("num_attention_heads", num_heads);
  j.set("num_key_value_heads", num_kv_heads);
  j.set("head_dim", head_dim);
  j.set("vocab_size", vocab_size);
  j.set("max_position_embeddings", max_position_embeddings);
  j.set("rms_norm_eps", rms_norm_eps);
  j.set("rope_theta", rope_theta);
  if (rope_scaling.kind == RopeScalingKind::None) {
    j.set("rope_scaling", Json());
  } else {
    Json rs = Json::object();
    const RopeScalingKind k = rope_scaling.kind;
    rs.set("rope_type", k == RopeScalingKind::Linear    ? "linear"
                        : k == RopeScalingKind::Llama3  ? "llama3"
                        : k == RopeScalingKind::Dynamic ? "dynamic"
                                                        : "yarn");
    rs.set("factor", rope_scaling.factor);
    if (k == RopeScalingKind::Yarn) yarn_to_json(rope_scaling, rs);
    if (rope_scaling.kind == RopeScalingKind::Llama3) {
      rs.set("low_freq_factor", rope_scaling.low_freq_factor);
      rs.set("high_freq_factor", rope_scaling.high_freq_factor);
      rs.set("original_max_position_embeddings", rope_scaling.original_max_position_embeddings);
    }
    j.set("rope_scaling", rs);
  }
  j.set("tie_word_embeddings", tie_word_embeddings);
  j.set("bos_token_id", bos_token_id);
  j.set("eos_token_id", eos_token_id);
  j.set("hidden_act", "silu");
  if (qwen2 || qwen3) windows_to_json(*this, j);
  if (!qwen2 && !mistral) {  // Qwen2Config: the q/k/v bias is the architecture's, no flag
    j.set("attention_bias", false);
    if (!qwen3) j.set("mlp_bias", false);
  }
  j.set("torch_dtype", torch_dtype);
  return j;
}

namespace {
// " (sliding window N)" (every layer) or " (sliding window N in K of L layers)"; "" for none.
std::string window_text(const LlamaConfig& c) {
  if (c.sliding_window == 0) return "";
  const int64_t k = c.windowed_layers();
  return " (sliding window " + std::to_string(c.sliding_window) +
         (k == c.num_layers ? "" : " in " + std::to_string(k) + " of " + std::to_string(c.num_layers) + " layers") +
         ")";
}
}  // namespace

std::string LlamaConfig::describe() const {
  std::ostringstream os;
  os << name << ": " << model_type << (qkv_bias ? " (q/k/v bias)" : "") << (qk_norm ? " (q/k norms)" : "")
     << window_text(*this) << ", hidden " << hidden_size << ", layers " << num_layers << ", heads " << num_heads << "/"
     << num_kv_heads << " (head_dim " << head_dim << "), mlp " << intermediate_size << ", vocab " << vocab_size
     << ", rope_theta " << rope_theta;
  if (rope_scaling.kind != RopeScalingKind::None)
    os << " ("
       << (rope_scaling.kind == RopeScalingKind::Linear    ? "linear"
           : rope_scaling.kind == RopeScalingKind::Dynamic ? "dynamic"
           : rope_scaling.kind == RopeScalingKind::Llama3  ? "llama3"
                                                           : "yarn")
       << " x" << (rope_scaling.kind == RopeScalingKind::Yarn ? yarn_factor() : rope_scaling.factor) << ")";
  os << (tie_word_embeddings ? ", tied embeddings" : "") << ", " << format_count(static_cast<double>(num_parameters()))
     << " parameters";
  return os.str();
}

namespace {

// The fields on which two configs give different models (not max_position_embeddings or the
// BOS/EOS ids, which change no weight and no result); "" when they agree.
std::string model_differences(const LlamaConfig& a, const LlamaConfig& b, bool theta_overridden) {
  std::ostringstream os;
  auto cmp = [&](const char* key, auto x, auto y) {
    if (x != y) os << (os.tellp() > 0 ? ", " : "") << key << " " << x << " vs " << y;
  };
  cmp("hidden_size", a.hidden_size, b.hidden_size);
  cmp("num_hidden_layers", a.num_layers, b.num_layers);
  cmp("num_attention_heads", a.num_heads, b.num_heads);
  cmp("num_key_value_heads", a.num_kv_heads, b.num_kv_heads);
  cmp("head_dim", a.head_dim, b.head_dim);
  cmp("intermediate_size", a.intermediate_size, b.intermediate_size);
  cmp("vocab_size", a.vocab_size, b.vocab_size);
  cmp("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings);
  cmp("rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps);
  cmp("sliding_window", a.sliding_window, b.sliding_window);
  for (int64_t l = 0; l < std::min(a.num_layers, b.num_layers) && a.sliding_window == b.sliding_window; ++l)
    if (a.window_of(l) != b.window_of(l)) {  // the first layer whose attention differs
      const std::string key = "layer_types[" + std::to_string(l) + "]";
      cmp(key.c_str(), std::string(a.window_of(l) > 0 ? "sliding_attention" : "full_attention"),
          std::string(b.window_of(l) > 0 ? "sliding_attention" : "full_attention"));
      break;
    }
  if (!theta_overridden) cmp("rope_theta", a.rope_theta, b.rope_theta);
  cmp("rope_scaling type", static_cast<int>(a.rope_scaling.kind), static_cast<int>(b.rope_scaling.kind));
  if (a.rope_scaling.kind == b.rope_scaling.kind && a.rope_scaling.kind != RopeScalingKind::None) {
    cmp("rope_scaling.factor", a.rope_scaling.factor, b.rope_scaling.factor);
    if (a.rope_scaling.kind == RopeScalingKind::Llama3) {
      cmp("rope_scaling.low_freq_factor", a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
      cmp("rope_scaling.high_freq_factor", a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
      cmp("rope_scaling.original_max_position_embeddings", a.rope_scaling.original_max_position_embeddings,
          b.rope_scaling.original_max_position_embeddings);
    }
  }
  return os.str();
}

}  // namespace

LlamaConfig resolve_llama_config(const ModelConfig& m) {
  const bool config_set = m.config != ModelConfig{}.config;
  LlamaConfig c;
  if (starts_with(m.init, "hf:")) {
    // The weights' own config.json gives the shape; a model.config given beside it must
    // describe the same model, or the run would fail later on every tensor's shape.
    const std::string dir = m.init.substr(3);
    EASYCTX_CHECK_INPUT(fs::is_directory(dir), "model.init hf:", dir,
                        ": no such folder (expected a Hugging Face model folder: config.json and *.safetensors)");
    EASYCTX_CHECK_INPUT(fs::is_regular_file(fs::path(dir) / "config.json") || config_set, "model.init hf:", dir,
                        ": the folder has no config.json; add it, or give the model's shape as model.config");
    if (!fs::is_regular_file(fs::path(dir) / "config.json")) {
      c = load_llama_config(m.config);  // weights without config.json: the shape is model.config's
    } else {
      c = load_llama_config(dir);
      if (config_set) {
        const LlamaConfig given = load_llama_config(m.config);
        const std::string diff = model_differences(given, c, m.rope_theta > 0);
        EASYCTX_CHECK_INPUT(diff.empty(), "model.config '", m.config, "' and model.init hf:", dir,
                            " describe different models (", given.name, " vs ", c.name, ": ", diff,
                            "); leave model.config unset to use the folder's config.json, or give weights of "
                            "model.config's shape");
      }
    }
  } else {
    c = load_llama_config(m.config);
  }
  if (m.rope_theta > 0) c.rope_theta = m.rope_theta;
  c.validate();
  return c;
}

}  // namespace easyctx::model
