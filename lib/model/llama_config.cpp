#include "model/llama_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "core/yaml_error.h"

namespace easyctx::model {
namespace fs = std::filesystem;

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

// The config.json keys easyctx reads: a model YAML takes exactly these (docs/model.md).
const std::vector<std::string> kModelKeys = {"hidden_size",         "sliding_window",
                                             "num_hidden_layers",   "num_attention_heads",
                                             "num_key_value_heads", "head_dim",
                                             "intermediate_size",   "vocab_size",
                                             "rms_norm_eps",        "rope_theta",
                                             "rope_scaling",        "rope_parameters",
                                             "tie_word_embeddings", "max_position_embeddings",
                                             "bos_token_id",        "eos_token_id",
                                             "model_type",          "hidden_act",
                                             "attention_bias",      "mlp_bias",
                                             "use_sliding_window",  "max_window_layers",
                                             "layer_types"};
// Inside rope_scaling / rope_parameters.
const std::vector<std::string> kRopeKeys = {"rope_type",        "type",
                                            "factor",           "low_freq_factor",
                                            "high_freq_factor", "original_max_position_embeddings",
                                            "rope_theta",       "attention_factor",
                                            "beta_fast",        "beta_slow",
                                            "mscale",           "mscale_all_dim",
                                            "truncate"};
// Keys a Hugging Face config.json carries that do not change the model easyctx trains:
// metadata, inference and generation settings, and pretraining_tp (the same matmuls split
// in slices). Ignored silently in a config.json; refused, as any other, in a model YAML.
const std::vector<std::string> kHfIgnoredKeys = {"architectures",
                                                 "torch_dtype",
                                                 "dtype",
                                                 "transformers_version",
                                                 "_name_or_path",
                                                 "use_cache",
                                                 "pad_token_id",
                                                 "initializer_range",
                                                 "pretraining_tp",
                                                 "auto_map",
                                                 "return_dict",
                                                 "output_attentions",
                                                 "output_hidden_states",
                                                 "torchscript",
                                                 "use_bfloat16",
                                                 "is_encoder_decoder",
                                                 "is_decoder",
                                                 "add_cross_attention",
                                                 "tie_encoder_decoder",
                                                 "chunk_size_feed_forward",
                                                 "id2label",
                                                 "label2id",
                                                 "problem_type",
                                                 "tokenizer_class",
                                                 "prefix",
                                                 "sep_token_id",
                                                 "decoder_start_token_id",
                                                 "task_specific_params",
                                                 "finetuning_task",
                                                 "max_length",
                                                 "min_length",
                                                 "do_sample",
                                                 "early_stopping",
                                                 "num_beams",
                                                 "num_beam_groups",
                                                 "temperature",
                                                 "top_k",
                                                 "top_p",
                                                 "typical_p",
                                                 "repetition_penalty",
                                                 "length_penalty",
                                                 "no_repeat_ngram_size",
                                                 "encoder_no_repeat_ngram_size",
                                                 "bad_words_ids",
                                                 "num_return_sequences",
                                                 "diversity_penalty",
                                                 "forced_bos_token_id",
                                                 "forced_eos_token_id",
                                                 "remove_invalid_values",
                                                 "exponential_decay_length_penalty",
                                                 "suppress_tokens",
                                                 "begin_suppress_tokens",
                                                 "output_scores",
                                                 "return_dict_in_generate",
                                                 "cross_attention_hidden_size",
                                                 "tf_legacy_loss",
                                                 "pruned_heads",
                                                 "attention_dropout",
                                                 "partial_rotary_factor",
                                                 "quantization_config"};

bool contains(const std::vector<std::string>& v, const std::string& k) {
  return std::find(v.begin(), v.end(), k) != v.end();
}

std::string yaml_where(const std::string& path, const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  if (m.is_null()) return path;
  return path + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

// A model YAML is easyctx's own format: every key must be one easyctx reads, so a typo
// ("intermediate_sise") is an error naming the file, line and key, never a silent default.
void check_yaml_keys(const YAML::Node& map, const std::string& path, const std::vector<std::string>& allowed,
                     const std::string& section) {
  std::vector<std::string> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string at = yaml_where(path, it->first);
    EASYCTX_CHECK_INPUT(it->first.IsScalar(), at, ": keys must be plain names");
    const std::string key = it->first.Scalar();
    const std::string full = section.empty() ? key : section + "." + key;
    EASYCTX_CHECK_INPUT(!contains(seen, key), at, ": duplicate key '", full, "'");
    seen.push_back(key);
    if (!contains(allowed, key)) {
      const std::string hint = nearest(key, allowed);
      const bool hf = section.empty() && contains(kHfIgnoredKeys, key);
      EASYCTX_THROW_INPUT(at, ": unknown key '", full, "'", hint.empty() ? "" : " (did you mean '" + hint + "'?)",
                          hf ? "; it is a config.json key easyctx does not use: drop it here, or give the "
                               "config.json itself as model.config"
                             : "",
                          "; model YAML keys are the config.json names easyctx reads (docs/model.md)");
    }
    if (section.empty() && (key == "rope_scaling" || key == "rope_parameters") && it->second.IsMap())
      check_yaml_keys(it->second, path, kRopeKeys, key);
  }
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

// A config.json may carry keys of newer transformers releases: ignored, but named once so a
// typo of an optional key ("rope_thetta") does not pass unseen.
void warn_unknown_json_keys(const Json& j, const std::string& src) {
  std::vector<std::string> unknown;
  for (const auto& kv : j.as_object())
    if (!contains(kModelKeys, kv.first) && !contains(kHfIgnoredKeys, kv.first)) {
      const std::string hint = nearest(kv.first, kModelKeys);
      unknown.push_back("'" + kv.first + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
    }
  if (unknown.empty()) return;
  std::string list;
  for (const std::string& u : unknown) list += (list.empty() ? "" : ", ") + u;
  log_warn(src, ": ignoring key", unknown.size() > 1 ? "s" : "", " easyctx does not use: ", list,
           " (docs/model.md lists the keys read and those ignored on purpose)");
}

// YAML scalars/maps/sequences -> Json (numbers stay numbers), so model YAMLs share the
// config.json reader.
Json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    Json o = Json::object();
    for (const auto& kv : n) o.set(kv.first.as<std::string>(), yaml_to_json(kv.second));
    return o;
  }
  if (n.IsSequence()) {
    Json a = Json::array();
    for (const auto& e : n) a.push_back(yaml_to_json(e));
    return a;
  }
  if (n.IsNull()) return Json();
  const std::string s = n.Scalar();
  if (s == "true" || s == "false") return Json(s == "true");
  char* end = nullptr;
  errno = 0;
  long long iv = std::strtoll(s.c_str(), &end, 10);
  // Out of int64 (ERANGE): kept as a number, which the integer keys then refuse by name.
  if (!s.empty() && end && *end == 0 && errno == 0) return Json(static_cast<int64_t>(iv));
  double dv = std::strtod(s.c_str(), &end);
  if (!s.empty() && end && *end == 0) return Json(dv);
  return Json(s);
}

}  // namespace

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

std::vector<std::string> preset_dirs() {
  std::vector<std::string> dirs;
  if (const char* d = std::getenv("EASYCTX_CONFIG_DIR")) dirs.push_back(std::string(d) + "/models");
  dirs.push_back("configs/models");
  dirs.push_back(std::string(EASYCTX_SOURCE_DIR) + "/configs/models");
  return dirs;
}

LlamaConfig load_llama_config(const std::string& spec) {
  EASYCTX_CHECK_INPUT(!spec.empty(), "model.config: empty");
  fs::path p(spec);
  if (fs::is_directory(p)) {
    p /= "config.json";
    const bool run = fs::is_regular_file(fs::path(spec) / "final" / "config.json");
    EASYCTX_CHECK_INPUT(
        fs::exists(p), "model config: the folder '", spec, "' has no config.json",
        run ? " (a training run's folder? its Hugging Face export is " + (fs::path(spec) / "final").string() + ")"
            : " (expected a Hugging Face model folder, a preset name, a model YAML or a config.json)");
  }
  if (fs::is_regular_file(p)) {
    const std::string path = p.string();
    if (ends_with(path, ".yaml") || ends_with(path, ".yml")) {
      YAML::Node n;
      try {
        n = YAML::LoadFile(path);
      } catch (const YAML::Exception& e) {
        EASYCTX_THROW_INPUT(yaml_error_place(path, e), ": invalid YAML: ", yaml_error_message(e));
      }
      EASYCTX_CHECK_INPUT(n.IsMap(), path, ": a model YAML must be a mapping of config.json keys (hidden_size: ...)");
      check_yaml_keys(n, path, kModelKeys, "");
      return llama_config_from_json(yaml_to_json(n), path);
    }
    const Json j = parse_json(read_file(path), path);
    LlamaConfig c = llama_config_from_json(j, path);
    warn_unknown_json_keys(j, path);
    return c;
  }
  EASYCTX_CHECK_INPUT(spec.find('/') == std::string::npos && !ends_with(spec, ".json"), "model.config: '", spec,
                      "' does not exist");
  std::vector<std::string> names;
  for (const std::string& d : preset_dirs()) {
    fs::path f = fs::path(d) / (spec + ".yaml");
    if (fs::is_regular_file(f)) {
      LlamaConfig c = load_llama_config(f.string());
      c.name = spec;
      return c;
    }
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  }
  std::string hint = nearest(spec, names);
  EASYCTX_THROW_INPUT("model.config: no preset '", spec, "' in configs/models/",
                      hint.empty() ? "" : " (did you mean '" + hint + "'?)",
                      "; give a preset, a .yaml or a config.json");
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
