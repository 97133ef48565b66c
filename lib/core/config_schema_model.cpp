// The stage-config keys of the model and data sections (data.* packing included): type,
// allowed values, default and documentation (config_schema.cpp's registry() adds them).
#include "core/config_schema_keys.h"

namespace easyctx::config_schema {
namespace {

std::string check_init(const std::string& s) {
  if (s == "random" || (starts_with(s, "hf:") && s.size() > 3) || (starts_with(s, "ckpt:") && s.size() > 5)) return "";
  return "random, hf:DIR or ckpt:DIR";
}

}  // namespace

using config_registry::KeyRole;
using config_registry::Registry;

// Packing and masking of document data (h5tokenize chat shards and any shards with documents);
// docs/data.md, "Packing", has the rules these keys select.
void add_data_packing_keys(Registry& r) {
  r.role = KeyRole::kTraining;  // they decide which tokens a sequence holds and what it predicts
  r.add_enum<DataPacking>(
      "data.packing", [](StageConfig& c) -> DataPacking& { return c.data.packing; },
      {{"window", static_cast<int>(DataPacking::Window)},
       {"best_fit", static_cast<int>(DataPacking::BestFit)},
       {"one_per_window", static_cast<int>(DataPacking::OnePerWindow)}},
      "How documents fill the seq_length-token sequences. `window`: the token stream cut into windows that cross "
      "document boundaries (pre-training). `best_fit`: whole documents placed by best-fit decreasing within "
      "shuffled pools of 4096, the rest of a sequence padded (label -1). `one_per_window`: one document per "
      "sequence, padded. Packed once from train.seed; each epoch visits the sequences in a new order.");
  r.add_enum<LongDocuments>(
      "data.long_documents", [](StageConfig& c) -> LongDocuments& { return c.data.long_documents; },
      {{"split", static_cast<int>(LongDocuments::Split)}, {"refuse", static_cast<int>(LongDocuments::Refuse)}},
      "data.packing best_fit or one_per_window: a document longer than seq_length is cut into seq_length-token "
      "pieces packed as documents (`split`), or is an error naming its file and index (`refuse`).");
  r.add_bool(
      "data.document_mask", [](StageConfig& c) -> bool& { return c.data.document_mask; },
      "Documents inside a sequence are kept apart: positions restart at 0 at each document's "
      "start (as Hugging Face's position_ids for packed batches), the label that would predict the next "
      "document's first token is dropped, and attention never crosses a document border (block-diagonal; "
      "in every parallel.sequence.mode, blocks of attention with no query and key in the same document "
      "are skipped). false: one document per sequence, positions 0..seq_length-1 (pre-training "
      "behaviour). For SFT: true with data.packing best_fit (docs/data.md, \"Document masking\").");
}

// ---- model
void add_model_keys(Registry& r) {
  r.role = KeyRole::kTraining;
  r.add_string(
      "model.config", [](StageConfig& c) -> std::string& { return c.model.config; },
      "preset name, .yaml or config.json path",
      "Model shape: a preset name from configs/models/ (tiny, tinyllama-1b, llama2-7b, llama2-13b, "
      "llama3-8b, ...), a model YAML file, or a Hugging Face config.json (or the folder holding it). "
      "With model.init hf:DIR the folder's config.json gives the model: leave this at its default, or give a "
      "config of the same model (a different one is an error naming both).",
      check_nonempty);
  r.role = KeyRole::kRun;  // where a new run starts: a resume continues from its checkpoint
  r.add_string(
      "model.init", [](StageConfig& c) -> std::string& { return c.model.init; }, "random, hf:DIR, ckpt:DIR",
      "Initial weights: `random` (normal with model.init_std), `hf:DIR` (Hugging Face safetensors), or "
      "`ckpt:DIR` (an easyctx checkpoint, e.g. the previous stage's output).",
      check_init);
  r.role = KeyRole::kTraining;
  r.add_float(
      "model.rope_theta", [](StageConfig& c) -> double& { return c.model.rope_theta; }, 0, false, kMaxF, false,
      "RoPE base for this stage; 0 keeps the model's. Progressive recipes raise it every stage.");
  r.role = KeyRole::kRun;
  r.add_bool(
      "model.carry_optimizer", [](StageConfig& c) -> bool& { return c.model.carry_optimizer; },
      "With model.init ckpt:DIR (stage chaining), also start from that checkpoint's Adam moments instead of "
      "fresh ones (the step count and schedule restart at 0).");
  r.add_string(
      "model.adapter", [](StageConfig& c) -> std::string& { return c.model.adapter; }, "\"\" or a folder",
      "A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors, e.g. an easyctx LoRA "
      "run's final/ or Hugging Face PEFT's save_pretrained) applied to model.init's weights: with "
      "lora.rank > 0 its lora_A/lora_B matrices and modules_to_save tensors start the trainable tensors "
      "(its r, target_modules and modules_to_save must be the lora section's); with lora.rank 0 it is "
      "merged into the base (W + lora_alpha / r x B A, modules_to_save replacing their tensors), and "
      "every weight of the merged model trains. \"\": none.");
  r.add_float(
      "model.init_std", [](StageConfig& c) -> double& { return c.model.init_std; }, 0, true, kMaxF, false,
      "Standard deviation of random initialisation (model.init: random).");
}

// ---- data
void add_data_keys(Registry& r) {
  r.role = KeyRole::kTraining;
  r.add_string(
      "data.path", [](StageConfig& c) -> std::string& { return c.data.path; }, "file, folder or glob",
      "Pre-tokenized HDF5 shards written by h5tokenize: one .h5 file, a folder of them, or a glob.");
  r.add_int(
      "data.seq_length", [](StageConfig& c) -> int64_t& { return c.data.seq_length; }, 2, kMaxSeqLength,
      "Tokens per training sequence; each sample is a window of seq_length + 1 tokens. Any length up to "
      "2^30 works (positions are int32): sequence-parallel modes pad and mask as they need.");
  r.role = KeyRole::kRun;
  r.add_bool(
      "data.check_tokens", [](StageConfig& c) -> bool& { return c.data.check_tokens; },
      "Check every token id of every window against the model's vocabulary before use.");
}

}  // namespace easyctx::config_schema
