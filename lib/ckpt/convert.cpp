#include "ckpt/convert.h"

#include <filesystem>
#include <memory>

#include "ckpt/hf_model.h"
#include "ckpt/lora_adapter.h"
#include "ckpt/tokenizer_files.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "model/llama_config.h"
#include "model/param_layout.h"

namespace fs = std::filesystem;

namespace easyctx::ckpt {

namespace {

struct Weights {
  model::LlamaConfig config;
  std::vector<std::vector<float>> units;  // one f32 buffer per ParamLayout unit
  int64_t seq_length = 0;                 // the training stage's, when known
  std::string data_path;                  // the training stage's data.path (its tokenizer), when known
  std::string source;
};

std::vector<ops::Tensor> views(std::vector<std::vector<float>>& units) {
  std::vector<ops::Tensor> v;
  for (auto& u : units)
    v.emplace_back(u.data(), ops::DType::F32, std::initializer_list<int64_t>{static_cast<int64_t>(u.size())});
  return v;
}

Weights read_checkpoint(const std::string& dir) {
  std::vector<std::string> warnings;
  // Checksums first: never export a flipped bit (of the weights, all that is read and exported).
  const CheckpointRef ref = resolve_verified(dir, &warnings, VerifyScope::Weights);
  for (const auto& w : warnings) log_warn(w);
  EASYCTX_CHECK_INPUT(ref.step >= 0, "--from ckpt:", dir, ": no committed checkpoint there");
  CheckpointReader r(ref.path);
  EASYCTX_CHECK_INPUT(r.meta().find("model"), ref.path, "/index.json: no model config in the metadata");
  EASYCTX_CHECK_INPUT(!r.meta().find("lora"), "--from ckpt:", dir, ": ", ref.path,
                      " is a LoRA run's checkpoint (its trainable tensors only): write its adapter with --to "
                      "peft:DIR, then merge it into its base with --merge-lora DIR --to hf:OUT");
  Weights w;
  w.config = model::llama_config_from_json(r.meta().at("model"), ref.path + "/index.json:meta.model");
  w.source = ref.path;
  if (const Json* c = r.meta().find("config"); c && c->is_string() && !c->as_string().empty()) {
    const StageConfig sc = parse_stage_config(c->as_string(), ref.path + "/index.json:meta.config");
    w.seq_length = sc.data.seq_length;
    w.data_path = sc.data.path;
  }
  const model::ParamLayout layout(w.config);
  for (const auto& u : layout.units()) {
    const std::string name = array_name(ArrayKind::Master, u.name);
    EASYCTX_CHECK_INPUT(r.numel(name) == u.numel, ref.path, ": ", name, " has ", r.numel(name),
                        " elements, the model in "
                        "its index needs ",
                        u.numel);
    w.units.emplace_back(static_cast<size_t>(u.numel));
    r.read(name, 0, u.numel, w.units.back().data());
  }
  return w;
}

Weights read_hf(const std::string& dir) {
  Weights w;
  w.config = model::load_llama_config(dir);
  w.source = dir;
  const model::ParamLayout layout(w.config);
  for (const auto& u : layout.units()) w.units.emplace_back(static_cast<size_t>(u.numel));
  load_hf_weights(dir, layout, views(w.units));
  return w;
}

// Refuses a folder that holds a run or checkpoints: a conversion never replaces or prunes
// anything of a run (its output would otherwise sit among the run's checkpoints).
void check_empty_target(const std::string& dir) {
  const fs::path ck = fs::path(dir) / "checkpoints";
  EASYCTX_CHECK_INPUT(!fs::exists(fs::path(dir) / "run.json"), "--to ckpt:", dir,
                      ": the folder holds a training run "
                      "(run.json); write the converted checkpoint into a new or empty folder");
  if (fs::is_directory(ck))
    for (const auto& e : fs::directory_iterator(ck))
      EASYCTX_CHECK_INPUT(!starts_with(e.path().filename().string(), "step-"), "--to ckpt:", dir, ": ",
                          e.path().string(), " exists; write the converted checkpoint into a new or empty folder");
}

void write_checkpoint(const std::string& dir, Weights& w) {
  const model::ParamLayout layout(w.config);
  // A run id of its own: pruning never reaches beyond this conversion's one checkpoint.
  WriterOptions wo;
  wo.run_id = "convert-" + new_run_id();
  CheckpointWriter cw(MPI_COMM_SELF, (fs::path(dir) / "checkpoints").string(), 0, wo);
  for (size_t u = 0; u < layout.units().size(); ++u)
    cw.add(array_name(ArrayKind::Master, layout.units()[u].name), layout.units()[u].numel, 0, w.units[u].data(),
           layout.units()[u].numel);
  Json meta = Json::object();
  meta.set("next_step", 0);
  meta.set("model", w.config.to_hf_json());
  meta.set("weights_only", true);
  meta.set("converted_from", w.source);
  cw.commit(meta, 1);
}

std::pair<std::string, std::string> split_spec(const std::string& spec, const char* flag) {
  const bool to = std::string(flag) == "--to";
  const char* expected = to ? ": expected ckpt:DIR, hf:DIR or peft:DIR" : ": expected ckpt:DIR or hf:DIR";
  size_t colon = spec.find(':');
  EASYCTX_CHECK_INPUT(colon != std::string::npos && colon + 1 < spec.size(), flag, " ", spec, expected);
  std::string kind = spec.substr(0, colon), dir = spec.substr(colon + 1);
  EASYCTX_CHECK_INPUT(kind == "ckpt" || kind == "hf" || (to && kind == "peft"), flag, " ", spec, expected);
  return {kind, dir};
}

// --to peft:DIR: a LoRA run's checkpoint (its trainable tensors) as a PEFT adapter folder.
std::string export_adapter(const std::string& from_dir, const std::string& to_dir, StDType dtype) {
  std::vector<std::string> warnings;
  const CheckpointRef ref = resolve_verified(from_dir, &warnings, VerifyScope::Weights);
  for (const auto& w : warnings) log_warn(w);
  EASYCTX_CHECK_INPUT(ref.step >= 0, "--from ckpt:", from_dir, ": no committed checkpoint there");
  CheckpointReader r(ref.path);
  const Json* l = r.meta().find("lora");
  EASYCTX_CHECK_INPUT(l && r.meta().find("model"), "--to peft:", to_dir, ": ", ref.path,
                      " is not a LoRA run's checkpoint (its index has no meta.lora); --to hf:DIR exports a model");
  const model::LlamaConfig config =
      model::llama_config_from_json(r.meta().at("model"), ref.path + "/index.json:meta.model");
  const model::ParamLayout layout(config, lora_spec_from_json(*l, ref.path + "/index.json"));
  std::vector<std::vector<float>> units(layout.num_units());
  for (size_t u = 0; u < layout.num_units(); ++u) {
    if (layout.units()[u].frozen) continue;
    units[u].resize(static_cast<size_t>(layout.units()[u].numel));
    r.read(array_name(ArrayKind::Master, layout.units()[u].name), 0, layout.units()[u].numel, units[u].data());
  }
  const std::string base = l->at("base").at("init").as_string();
  save_lora_adapter(to_dir, layout, views(units), starts_with(base, "hf:") ? base.substr(3) : base, dtype);
  if (const Json* c = r.meta().find("config"); c && c->is_string() && !c->as_string().empty())
    export_tokenizer_files(parse_stage_config(c->as_string(), ref.path + "/index.json:meta.config").data.path, to_dir);
  return ref.path + " -> peft:" + to_dir + ": " + layout.lora().describe() + " on " + base;
}

}  // namespace

std::string convert_model(const ConvertOptions& o) {
  std::unique_ptr<LoraAdapter> adapter;
  std::string from = o.from;
  if (!o.merge_lora.empty()) {
    adapter = std::make_unique<LoraAdapter>(o.merge_lora);
    EASYCTX_CHECK_INPUT(!from.empty() || !adapter->base_model().empty(), "--merge-lora ", o.merge_lora,
                        ": its adapter_config.json names no base_model_name_or_path; give the base with --from");
    if (from.empty()) from = "hf:" + adapter->base_model();
  }
  auto [from_kind, from_dir] = split_spec(from, "--from");
  auto [to_kind, to_dir] = split_spec(o.to, "--to");
  EASYCTX_CHECK_INPUT(o.dtype == StDType::BF16 || o.dtype == StDType::F32, "--dtype: expected bf16 or f32");
  if (to_kind == "peft") {
    EASYCTX_CHECK_INPUT(from_kind == "ckpt" && !adapter, "--to peft:", to_dir,
                        ": takes a LoRA run's checkpoint (--from ckpt:DIR), not --merge-lora");
    return export_adapter(from_dir, to_dir, o.dtype);
  }
  if (to_kind == "ckpt") check_empty_target(to_dir);
  Weights w = from_kind == "ckpt" ? read_checkpoint(from_dir) : read_hf(from_dir);
  if (adapter) {  // the merged model: every tensor the adapter changes
    const model::ParamLayout base(w.config);
    adapter->check(model::ParamLayout(w.config, adapter->spec()));
    for (size_t u = 0; u < base.num_units(); ++u)
      merge_lora_range(base, u, 0, base.units()[u].numel, w.units[u].data(), *adapter);
    w.source += " + " + o.merge_lora;
  }
  if (o.rope_theta > 0) w.config.rope_theta = o.rope_theta;
  if (o.max_position_embeddings > 0) w.config.max_position_embeddings = o.max_position_embeddings;
  else if (w.seq_length > w.config.max_position_embeddings) w.config.max_position_embeddings = w.seq_length;
  w.config.validate();
  if (to_kind == "hf") {
    save_hf_model(to_dir, w.config, model::ParamLayout(w.config), views(w.units), o.dtype, o.max_shard_bytes);
    // The tokenizer beside the weights (AutoTokenizer.from_pretrained): the training data's.
    if (from_kind == "hf") copy_tokenizer_files(from_dir, to_dir);
    else if (!w.data_path.empty()) export_tokenizer_files(w.data_path, to_dir);
  } else {
    write_checkpoint(to_dir, w);
  }
  return detail::concat(w.source, " -> ", o.to, ": max_position_embeddings ", w.config.max_position_embeddings, ", ",
                        w.config.describe());
}

}  // namespace easyctx::ckpt
