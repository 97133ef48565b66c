#include "ckpt/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "model/llama.h"

namespace easyctx::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "base_model.model.";

// A list of names from a PEFT config key: null, a string (one name) or a list of strings.
std::vector<std::string> name_list(const Json& cfg, const char* key, const std::string& file) {
  const Json* v = cfg.find(key);
  if (!v || v->is_null()) return {};
  if (v->is_string()) return {v->as_string()};
  EASYCTX_CHECK_INPUT(v->is_array(), file, ": ", key, ": expected a list of module names, got ", v->type_name());
  std::vector<std::string> out;
  for (const Json& e : v->as_array()) {
    EASYCTX_CHECK_INPUT(e.is_string(), file, ": ", key, ": expected module names (strings)");
    out.push_back(e.as_string());
  }
  return out;
}

// Keys whose values must be neutral for easyctx's LoRA to compute what PEFT computes.
void check_neutral(const Json& c, const std::string& file) {
  auto is = [&](const char* key, auto ok) {
    const Json* v = c.find(key);
    EASYCTX_CHECK_INPUT(!v || v->is_null() || ok(*v), file, ": ", key, " = ", v ? v->dump() : "",
                        " is not supported (easyctx's LoRA is PEFT's plain LoRA: use_dora false, bias none, "
                        "fan_in_fan_out false, no layers_to_transform, rank_pattern or alpha_pattern)");
  };
  is("use_dora", [](const Json& v) { return v.is_bool() && !v.as_bool(); });
  is("bias", [](const Json& v) { return v.is_string() && v.as_string() == "none"; });
  is("fan_in_fan_out", [](const Json& v) { return v.is_bool() && !v.as_bool(); });
  is("layers_to_transform", [](const Json&) { return false; });
  is("rank_pattern", [](const Json& v) { return v.is_object() && v.as_object().empty(); });
  is("alpha_pattern", [](const Json& v) { return v.is_object() && v.as_object().empty(); });
}

model::LoraSpec spec_of(const Json& c, const std::string& file) {
  const Json* type = c.find("peft_type");
  EASYCTX_CHECK_INPUT(type && type->is_string() && type->as_string() == "LORA", file,
                      ": peft_type must be LORA (a PEFT LoRA adapter)");
  check_neutral(c, file);
  model::LoraSpec s;
  EASYCTX_CHECK_INPUT(c.find("r") && c.at("r").is_integer() && c.at("r").as_int() > 0, file,
                      ": r: expected a positive integer");
  s.rank = c.at("r").as_int();
  s.alpha = c.find("lora_alpha") ? c.at("lora_alpha").as_double() : 8.0;  // PEFT's default
  s.rslora = c.find("use_rslora") && c.at("use_rslora").is_bool() && c.at("use_rslora").as_bool();
  for (const std::string& n : name_list(c, "target_modules", file)) {
    bool known = false;
    for (int t = 0; t < model::kLoraTargets; ++t)
      if (n == model::lora_target_name(t)) known = s.targets[static_cast<size_t>(t)] = true;
    EASYCTX_CHECK_INPUT(known, file, ": target_modules: '", n,
                        "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
  }
  for (const std::string& n : name_list(c, "modules_to_save", file)) {
    EASYCTX_CHECK_INPUT(n == "embed_tokens" || n == "norm" || n == "lm_head", file, ": modules_to_save: '", n,
                        "' is not supported (embed_tokens, norm: every RMSNorm, lm_head)");
    s.embed_tokens |= n == "embed_tokens";
    s.norm |= n == "norm";
    s.lm_head |= n == "lm_head";
  }
  return s;
}

// "model.layers.3.self_attn.q_proj.weight" -> (3, q_proj's target); -1 when not a projection.
int target_of(const std::string& name, int64_t& layer) {
  const std::string pre = "model.layers.";
  if (!starts_with(name, pre) || !ends_with(name, ".weight")) return -1;
  const size_t dot = name.find('.', pre.size());
  if (dot == std::string::npos) return -1;
  const std::string module = name.substr(dot + 1, name.size() - dot - 1 - 7);
  for (int t = 0; t < model::kLoraTargets; ++t)
    if (module == model::lora_target_module(t)) {
      layer = std::stoll(name.substr(pre.size(), dot - pre.size()));
      return t;
    }
  return -1;
}

// Whether base tensor `name` is one the spec's modules_to_save replace.
bool saved_module(const model::LoraSpec& s, const std::string& name) {
  return (s.embed_tokens && name == "model.embed_tokens.weight") || (s.lm_head && name == "lm_head.weight") ||
         (s.norm && ends_with(name, "norm.weight"));
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

std::string peft_key(const model::ParamTensor& t) { return kPrefix + t.hf_name; }

LoraAdapter::LoraAdapter(const std::string& dir) : dir_(dir) {
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  EASYCTX_CHECK_INPUT(fs::is_directory(dir), dir, ": no such folder (a PEFT adapter folder is expected)");
  EASYCTX_CHECK_INPUT(fs::exists(cfg_path), dir,
                      ": no adapter_config.json (a PEFT LoRA adapter folder: adapter_config.json and "
                      "adapter_model.safetensors)");
  const Json c = parse_json(read_file(cfg_path), cfg_path);
  spec_ = spec_of(c, cfg_path);
  if (const Json* b = c.find("base_model_name_or_path"); b && b->is_string()) base_ = b->as_string();
  const std::string st = (fs::path(dir) / "adapter_model.safetensors").string();
  EASYCTX_CHECK_INPUT(fs::exists(st), dir, ": no adapter_model.safetensors");
  reader_ = std::make_unique<SafetensorsReader>(st);
}

LoraAdapter::~LoraAdapter() = default;

uint64_t LoraAdapter::bytes_read() const { return reader_->bytes_read(); }

void LoraAdapter::check(const model::ParamLayout& layout) const {
  std::vector<std::string> bad;
  for (const model::ParamUnit& u : layout.units()) {
    if (u.frozen) continue;
    for (const model::ParamTensor& t : u.tensors) {
      const StTensor* s = reader_->find(peft_key(t));
      if (!s) bad.push_back(peft_key(t) + " missing");
      else if (s->shape != t.shape)
        bad.push_back(peft_key(t) + " has shape " + shape_text(s->shape) + ", the model needs " + shape_text(t.shape));
    }
  }
  if (bad.empty()) return;
  std::string msg;
  for (size_t i = 0; i < bad.size() && i < 8; ++i) msg += (i ? "; " : "") + bad[i];
  EASYCTX_THROW_INPUT(dir_, "/adapter_model.safetensors does not fit the model: ", msg,
                      bad.size() > 8 ? "; ... (" + std::to_string(bad.size()) + " in all)" : std::string());
}

void LoraAdapter::read(const model::ParamTensor& t, int64_t first, int64_t count, float* out) {
  const StTensor* s = reader_->find(peft_key(t));
  EASYCTX_CHECK_INPUT(s && s->shape == t.shape, dir_, "/adapter_model.safetensors: no ", peft_key(t), " of shape ",
                      shape_text(t.shape));
  reader_->read_range(*s, first, count, ops::DType::F32, out);
  for (int64_t i = 0; i < count; ++i)
    EASYCTX_CHECK_INPUT(std::isfinite(out[i]), dir_, "/adapter_model.safetensors: ", peft_key(t), " holds ", out[i],
                        " at element ", first + i);
}

const std::vector<float>& LoraAdapter::whole(const std::string& key, const std::vector<int64_t>& shape) {
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  model::ParamTensor t;
  t.hf_name = key.substr(std::string(kPrefix).size());
  t.shape = shape;
  t.numel = shape[0] * shape[1];
  std::vector<float> v(static_cast<size_t>(t.numel));
  read(t, 0, t.numel, v.data());
  return cache_.emplace(key, std::move(v)).first->second;
}

void LoraAdapter::merge(const model::ParamTensor& t, int64_t first, int64_t count, float* data) {
  if (saved_module(spec_, t.hf_name)) return read(t, first, count, data);
  int64_t layer = 0;
  const int target = target_of(t.hf_name, layer);
  if (target < 0 || !spec_.targets[static_cast<size_t>(target)]) return;
  const int64_t out = t.shape[0], in = t.shape[1], r = spec_.rank;
  const std::string stem = std::string(kPrefix) + t.hf_name.substr(0, t.hf_name.size() - 7);
  const std::vector<float>& a = whole(stem + ".lora_A.weight", {r, in});
  const std::vector<float>& b = whole(stem + ".lora_B.weight", {out, r});
  const double scale = spec_.scale();
#pragma omp parallel for schedule(static) if (count > (1 << 16))
  for (int64_t e = first; e < first + count; ++e) {
    const int64_t i = e / in, j = e % in;
    double sum = 0;
    for (int64_t k = 0; k < r; ++k)
      sum += static_cast<double>(b[static_cast<size_t>(i * r + k)]) * a[static_cast<size_t>(k * in + j)];
    data[e - first] = static_cast<float>(static_cast<double>(data[e - first]) + scale * sum);
  }
}

void fill_lora_range(const model::ParamLayout& layout, size_t u, int64_t lo, int64_t n, float* out,
                     const BaseRead& base, LoraAdapter* adapter, uint64_t seed) {
  const model::ParamUnit& pu = layout.units().at(u);
  for (const model::ParamTensor& t : pu.tensors) {
    const int64_t a = std::max(lo, t.offset), b = std::min(lo + n, t.offset + t.numel);
    if (a >= b) continue;
    float* dst = out + (a - lo);
    if (adapter && !pu.frozen) adapter->read(t, a - t.offset, b - a, dst);
    else if (t.adapter) model::init_lora_range(layout, u, a, ops::Tensor(dst, ops::DType::F32, {b - a}), seed);
    else base(static_cast<size_t>(t.base_unit), t.base_offset + (a - t.offset), b - a, dst);
  }
}

void merge_lora_range(const model::ParamLayout& layout, size_t u, int64_t lo, int64_t n, float* out,
                      LoraAdapter& adapter) {
  for (const model::ParamTensor& t : layout.units().at(u).tensors) {
    const int64_t a = std::max(lo, t.offset), b = std::min(lo + n, t.offset + t.numel);
    if (a < b) adapter.merge(t, a - t.offset, b - a, out + (a - lo));
  }
}

void save_lora_adapter(const std::string& dir, const model::ParamLayout& layout, const std::vector<ops::Tensor>& units,
                       const std::string& base_model, StDType dtype) {
  const model::LoraSpec& s = layout.lora();
  EASYCTX_CHECK(s.enabled() && units.size() == layout.num_units(), "save_lora_adapter: a LoRA layout's units");
  fs::create_directories(dir);
  std::vector<StWriteTensor> ts;
  for (size_t u = 0; u < layout.num_units(); ++u) {
    const model::ParamUnit& pu = layout.units()[u];
    if (pu.frozen) continue;
    EASYCTX_CHECK(units[u].dtype == ops::DType::F32 && units[u].numel() == pu.numel, "save_lora_adapter: unit ",
                  pu.name, " must be host f32[", pu.numel, "], got ", units[u].describe());
    for (const model::ParamTensor& t : pu.tensors)
      ts.push_back({peft_key(t), t.shape, units[u].ptr<float>() + t.offset, ops::DType::F32, dtype});
  }
  write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), ts);
  Json c = Json::object();
  c.set("peft_type", "LORA");
  c.set("task_type", "CAUSAL_LM");
  c.set("base_model_name_or_path", base_model.empty() ? Json() : Json(base_model));
  c.set("r", s.rank);
  c.set("lora_alpha", s.alpha);
  c.set("use_rslora", s.rslora);
  c.set("target_modules", Json::array_of(s.target_modules()));
  const std::vector<std::string> saved = s.modules_to_save();
  c.set("modules_to_save", saved.empty() ? Json() : Json::array_of(saved));
  c.set("lora_dropout", 0.0);
  c.set("bias", "none");
  c.set("fan_in_fan_out", false);
  c.set("use_dora", false);
  c.set("init_lora_weights", true);
  c.set("inference_mode", true);
  c.set("layers_to_transform", Json());
  c.set("rank_pattern", Json::object());
  c.set("alpha_pattern", Json::object());
  write_file_atomic((fs::path(dir) / "adapter_config.json").string(), c.dump(2) + "\n");
}

Json lora_spec_json(const model::LoraSpec& s) {
  Json l = Json::object();
  l.set("rank", s.rank);
  l.set("alpha", s.alpha);
  l.set("use_rslora", s.rslora);
  l.set("targets", Json::array_of(s.target_modules()));
  l.set("trainable", Json::array_of(s.modules_to_save()));
  return l;
}

model::LoraSpec lora_spec_from_json(const Json& l, const std::string& where) {
  LoraConfig c;
  try {
    c.rank = l.at("rank").as_int();
    c.alpha = l.at("alpha").as_double();
    c.use_rslora = l.at("use_rslora").as_bool();
    std::vector<std::string> names;
    for (const Json& n : l.at("targets").as_array()) names.push_back(n.as_string());
    c.targets = join(names, ",");
    names.clear();
    for (const Json& n : l.at("trainable").as_array()) names.push_back(n.as_string());
    c.trainable = join(names, ",");
  } catch (const std::exception& e) { EASYCTX_THROW_INPUT(where, ": meta.lora is not readable: ", e.what()); }
  return model::lora_spec(c);
}

std::string hf_fingerprint(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EASYCTX_CHECK_INPUT(!files.empty(), dir, ": no safetensors files");
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](const std::string& bytes) {
    for (char ch : bytes) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  };
  const fs::path cfg = fs::path(dir) / "config.json";
  if (fs::exists(cfg)) mix(read_file(cfg.string()));
  for (const std::string& f : files) {
    const fs::path p = fs::path(dir) / f;
    mix(f + "\n" + std::to_string(fs::file_size(p)) + "\n");
    std::ifstream in(p, std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    EASYCTX_CHECK_INPUT(in && n < (uint64_t{100} << 20), p.string(), ": not a safetensors file");
    std::string header(static_cast<size_t>(n), '\0');
    in.read(header.data(), static_cast<std::streamsize>(n));
    mix(header);
  }
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace easyctx::ckpt
