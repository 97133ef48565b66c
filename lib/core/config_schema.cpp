// The registry of every stage-config key: type, allowed values, default, documentation.
// Parsing (YAML file and --set), validation, dumping and docs/config.md all walk this table.
// The keys are added section by section (config_schema_keys.h: config_schema_model.cpp,
// config_schema_train.cpp, config_schema_parallel.cpp, config_schema_output.cpp).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "core/config.h"
#include "core/config_registry.h"
#include "core/config_schema_keys.h"
#include "core/error.h"
#include "core/strings.h"
#include "core/yaml_error.h"

namespace easyctx {
namespace {

using config_registry::Field;
using config_registry::KeyRole;
using config_registry::Registry;

const Registry& registry() {
  static const Registry reg = [] {
    Registry r;
    config_schema::add_model_keys(r);
    config_schema::add_data_keys(r);
    config_schema::add_data_packing_keys(r);
    config_schema::add_train_keys(r);
    // The rest say where and how a run goes (the device, the layout over the ranks, memory,
    // output, logging, the plan's target), not what it trains.
    r.role = KeyRole::kRun;
    config_schema::add_train_device_keys(r);
    config_schema::add_parallel_keys(r);
    config_schema::add_zero_keys(r);
    config_schema::add_activation_keys(r);
    config_schema::add_lora_keys(r);
    config_schema::add_output_keys(r);
    config_schema::add_logging_keys(r);
    config_schema::add_target_keys(r);
    return r;
  }();
  return reg;
}

std::string where(const std::string& source, const YAML::Mark& m) {
  if (m.is_null()) return source;
  return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

// key_loc locates the key (unknown-key errors), loc the value (bad-value errors).
void set_field(StageConfig& cfg, const std::string& key, const std::string& scalar, const std::string& loc,
               const std::string& key_loc = "") {
  const Registry& r = registry();
  const Field* f = r.find(key);
  if (!f) {
    const std::string& loc_k = key_loc.empty() ? loc : key_loc;
    if (r.is_section(key))
      EASYCTX_THROW_INPUT(loc_k, ": '", key, "' is a section, not a value; set one of its keys (", key, ".*)");
    std::string hint = nearest(key, r.keys_and_sections());
    EASYCTX_THROW_INPUT(loc_k, ": unknown key '", key, "'", hint.empty() ? "" : " (did you mean '" + hint + "'?)",
                        "; see docs/config.md");
  }
  std::string expected = f->set(cfg, scalar);
  if (!expected.empty()) EASYCTX_THROW_INPUT(loc, ": ", key, ": bad value '", scalar, "': expected ", expected);
}

void walk(StageConfig& cfg, const YAML::Node& node, const std::string& prefix, const std::string& source) {
  const Registry& r = registry();
  std::vector<std::string> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node& kn = it->first;
    const YAML::Node& vn = it->second;
    std::string loc = where(source, kn.Mark());
    EASYCTX_CHECK_INPUT(kn.IsScalar(), loc, ": keys must be plain names");
    std::string key = prefix.empty() ? kn.Scalar() : prefix + "." + kn.Scalar();
    for (const auto& k : seen) EASYCTX_CHECK_INPUT(k != key, loc, ": duplicate key '", key, "'");
    seen.push_back(key);
    if (vn.IsMap()) {
      if (r.find(key)) EASYCTX_THROW_INPUT(loc, ": ", key, ": expected a single value, got a mapping");
      if (!r.is_section(key)) set_field(cfg, key, "", loc);  // unknown key error with suggestion
      walk(cfg, vn, key, source);
    } else if (vn.IsScalar()) {
      set_field(cfg, key, vn.Scalar(), where(source, vn.Mark()), loc);
    } else if (vn.IsSequence() && r.find(key) && r.find(key)->type == "list") {
      std::vector<std::string> names;
      for (const YAML::Node& e : vn) {
        EASYCTX_CHECK_INPUT(e.IsScalar(), where(source, e.Mark()), ": ", key, ": expected a list of names");
        names.push_back(e.Scalar());
      }
      set_field(cfg, key, join(names, ","), where(source, vn.Mark()), loc);
    } else if (vn.IsNull()) {
      if (!r.find(key) && !r.is_section(key)) set_field(cfg, key, "", loc);
      if (r.find(key)) EASYCTX_THROW_INPUT(loc, ": ", key, ": missing value: expected ", r.find(key)->allowed);
      // An empty section ("train:") is fine.
    } else {
      if (!r.find(key) && !r.is_section(key)) set_field(cfg, key, "", loc);
      EASYCTX_THROW_INPUT(loc, ": ", key, ": expected a single value, got a list");
    }
  }
}

// EasyContext's ring degree is the inverse of easyctx's Ulysses degree inside a group of
// `size` ranks (usp: size = ulysses_size x ring degree); resolved once the whole file and the
// overrides are read, as the keys may come in any order.
void resolve_ring_degree(StageConfig& cfg) {
  auto& sp = cfg.parallel.sequence;
  if (sp.ring_degree == 0) return;
  const std::string& src = cfg.source.empty() ? std::string("config") : cfg.source;
  EASYCTX_CHECK_INPUT(sp.mode == SeqParallelMode::Usp, src, ": parallel.sequence.ring_degree = ", sp.ring_degree,
                      " is only used with mode usp (usp_attn); mode is ", to_string(sp.mode));
  EASYCTX_CHECK_INPUT(sp.size % sp.ring_degree == 0, src, ": parallel.sequence.ring_degree = ", sp.ring_degree,
                      " must divide parallel.sequence.size = ", sp.size);
  const int64_t u = sp.size / sp.ring_degree;
  EASYCTX_CHECK_INPUT(sp.ulysses_size == 0 || sp.ulysses_size == u, src,
                      ": parallel.sequence.ring_degree = ", sp.ring_degree,
                      " means ulysses_size = size / ring_degree = ", u, ", but ulysses_size = ", sp.ulysses_size,
                      " is set too; give one of them");
  sp.ulysses_size = u;
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> out;
  for (const auto& f : registry().fields) out.push_back(f.key);
  return out;
}

std::string config_value(const StageConfig& cfg, const std::string& key) {
  const Field* f = registry().find(key);
  EASYCTX_CHECK_INPUT(f != nullptr, "unknown config key '", key, "'; see docs/config.md");
  return f->get(cfg);
}

void apply_override(StageConfig& cfg, const std::string& assignment) {
  std::string loc = "--set " + assignment;
  size_t eq = assignment.find('=');
  EASYCTX_CHECK_INPUT(eq != std::string::npos && eq > 0, loc, ": expected key=value");
  std::string key = trim(assignment.substr(0, eq));
  std::string text = assignment.substr(eq + 1);
  std::string scalar;
  try {
    YAML::Node n = YAML::Load(text);
    if (n.IsNull()) scalar = "";
    else if (n.IsScalar()) scalar = n.Scalar();
    else EASYCTX_THROW_INPUT(loc, ": ", key, ": expected a single value, got '", text, "'");
  } catch (const YAML::Exception& e) {
    EASYCTX_THROW_INPUT(loc, ": ", key, ": cannot parse value '", text.substr(0, 80), text.size() > 80 ? "...'" : "'",
                        ": ", yaml_error_message(e));
  }
  if (registry().find(key) && text.empty())
    EASYCTX_THROW_INPUT(loc, ": ", key, ": missing value: expected ", registry().find(key)->allowed);
  set_field(cfg, key, scalar, loc);
}

StageConfig parse_stage_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides) {
  StageConfig cfg;
  cfg.source = source;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    EASYCTX_THROW_INPUT(yaml_error_place(source, e), ": invalid YAML: ", yaml_error_message(e));
  }
  if (!root.IsNull()) {
    EASYCTX_CHECK_INPUT(root.IsMap(), source,
                        ": the top level must be a mapping of sections (model:, data:, train:, ...)");
    walk(cfg, root, "", source);
  }
  for (const auto& o : overrides) apply_override(cfg, o);
  resolve_ring_degree(cfg);
  validate_lora(cfg);
  // offload_params, offload_grads and offload_optimizer_layers need the host AdamW: they decide an
  // auto optimizer placement.
  auto& z = cfg.parallel.zero;
  if (z.offload_optimizer_auto && (z.offload_params || z.offload_grads || z.offload_optimizer_layers > 0)) {
    z.offload_optimizer = true;
    z.offload_optimizer_auto = false;
  }
  return cfg;
}

StageConfig load_stage_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::string> yamls;
    for (const auto& e : std::filesystem::directory_iterator(path, ec))
      if (e.path().extension() == ".yaml" || e.path().extension() == ".yml") yamls.push_back(e.path().filename());
    std::sort(yamls.begin(), yamls.end());
    std::string some;
    for (size_t i = 0; i < yamls.size() && i < 3; ++i) some += (i ? ", " : "") + yamls[i];
    EASYCTX_THROW_INPUT(path, ": is a folder; the stage config is one YAML file",
                        yamls.empty() ? std::string(" (this folder holds none)")
                                      : " (this folder holds " + some + (yamls.size() > 3 ? ", ..." : "") + ")");
  }
  return parse_stage_config(read_file(path), path, overrides);
}

std::string dump_stage_config(const StageConfig& cfg) {
  std::ostringstream os;
  std::vector<std::string> open;  // currently open section path
  for (const auto& f : registry().fields) {
    auto parts = split(f.key, '.');
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      os << std::string(2 * i, ' ') << parts[i] << ":\n";
      open.push_back(parts[i]);
    }
    os << std::string(2 * (parts.size() - 1), ' ') << parts.back() << ": " << f.get(cfg) << "\n";
  }
  return os.str();
}

std::vector<std::pair<std::string, std::string>> training_settings(const StageConfig& cfg, int64_t dp_size) {
  std::vector<std::pair<std::string, std::string>> out;
  bool batch = false;
  for (const Field& f : registry().fields) {
    if (f.role == KeyRole::kTraining) out.emplace_back(f.key, f.get(cfg));
    if (f.role != KeyRole::kGlobalBatch || batch) continue;
    batch = true;
    out.emplace_back("global batch (batch_size x grad_accum x data-parallel)",
                     std::to_string(cfg.train.batch_size * cfg.train.grad_accum * dp_size));
  }
  return out;
}

std::string config_reference_markdown() {
  StageConfig defaults;
  std::ostringstream os;
  os << "# Stage configuration reference\n\n"
     << "Generated by `build/bin/easyctx_train --config-doc` from the key registry in\n"
     << "`lib/core/config_schema_*.cpp` (one file per group of sections), where every key is defined;\n"
     << "a test keeps this file identical to it.\n\n"
     << "A stage is one YAML file (`easyctx_train STAGE.yaml`). Every key below can also be set on the\n"
     << "command line with `--set key=value` (same validation). Unknown keys, wrong types and values\n"
     << "out of range are errors naming the file, line, key, the bad value and what is allowed.\n"
     << "`--print-config` prints the resolved configuration and the process-group layout.\n\n"
     << "Keys marked \u2020 change what is trained (the model, the data and how it is packed, the optimizer and\n"
     << "its schedule; with train.batch_size and train.grad_accum, their product with the data-parallel size):\n"
     << "`--resume` with another value than the checkpoint's run names them among the changed settings.\n\n"
     << "Coming from EasyContext: its train.py flags (`easyctx_train --batch-size 1 --parallel_mode ...`) set\n"
     << "these keys, and its mode names are accepted as values; the table is in docs/easycontext.md.\n";
  std::string section;
  for (const auto& f : registry().fields) {
    auto parts = split(f.key, '.');
    std::string sec = parts[0];
    if (parts.size() > 2) sec += "." + parts[1];
    if (sec != section) {
      section = sec;
      os << "\n## `" << sec << "`\n\n| key | type | allowed | default | meaning |\n|---|---|---|---|---|\n";
    }
    std::string def = f.get(defaults);
    os << "| `" << f.key << "`" << (f.role == KeyRole::kRun ? "" : " \u2020") << " | " << f.type << " | " << f.allowed
       << " | `" << def << "` | " << f.doc << " |\n";
  }
  return os.str();
}

}  // namespace easyctx
