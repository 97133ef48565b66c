// Where a model's shape comes from (model.config): a preset name (configs/models/), a model
// YAML (only the config.json keys easyctx reads, each checked by name), a config.json or the
// folder holding it (keys easyctx does not use named in a warning).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "core/yaml_error.h"
#include "model/llama_config.h"

namespace easyctx::model {
namespace fs = std::filesystem;

namespace {

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

}  // namespace easyctx::model
