// Where an evaluation's model comes from, and loading it onto a backend for forward-only
// passes (lib/eval/session.h).
//   "DIR" or "hf:DIR"   a Hugging Face folder: config.json + safetensors (one file or sharded)
//   "ckpt:DIR"          a training checkpoint: a step folder, a checkpoints folder or a run's
//                       output.dir (its newest committed checkpoint); written by any number of
//                       ranks with any ZeRO stage (the reader assembles every unit from
//                       whichever files hold it); the model config is the index's meta.model
//   "ADAPTER_DIR"       a PEFT LoRA adapter folder (adapter_config.json, no config.json): its
//                       base (base_model_name_or_path, a Hugging Face folder) with it merged
//   "MODEL+adapter:DIR" any of these with the PEFT LoRA adapter DIR merged into its weights
//                       (W + lora_alpha / r x B A, modules_to_save replacing their tensors, in
//                       f32 as they load); --adapter DIR of the evaluation programs appends it
//   "random:SPEC[@SEED]"  random weights (model::init_random_range, std 0.02, seed SEED or 0) of
//                       the shape SPEC names (a preset such as llama2-7b, a model YAML or an HF
//                       config.json or its folder): benchmarks, and sweeps whose point is speed
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/param_layout.h"
#include "ops/ops.h"

namespace easyctx::eval {

// Elements per host chunk when a checkpoint's fp32 master weights go to the device.
constexpr int64_t kLoadChunkElems = int64_t{1} << 26;  // 256 MiB of f32

struct ModelRef {
  std::string spec;         // as given
  bool checkpoint = false;  // ckpt:DIR
  bool random = false;      // random:SPEC
  uint64_t seed = 0;        // random: the initialisation's seed
  std::string dir;          // the HF folder, the committed step folder of the checkpoint, or SPEC
  int64_t step = -1;        // checkpoint: its step
  std::string adapter;      // a PEFT LoRA adapter folder merged into the weights ("": none)
  // A short name for tables and legends: the folder's last component ("final", "step-00000200").
  std::string label() const;
};

// Resolves `spec` (`flag` names it in errors: InputError when the folder or checkpoint is not
// there); warnings about skipped broken checkpoints are logged. A checkpoint is verified in
// ckpt::VerifyScope::Weights: the master weights load_model_weights reads, not the Adam
// moments, whose damage does not make it skip a checkpoint.
ModelRef resolve_model(const std::string& spec, const std::string& flag = "--model");
// The same, collective over `comm` (every rank calls it with the same spec) for a job whose
// ranks all load the model: a checkpoint's files are verified once (their weights, as above),
// each by one rank (ckpt::resolve_verified over a RankSync, parallel.collective_timeout_s =
// timeout_s), and every rank returns the same ModelRef or throws the same InputError (a
// corrupt file named with its dataset and checksums). Warnings are logged by the comm's rank
// 0. Other specs have nothing to verify: resolved locally, no exchange.
ModelRef resolve_model(const std::string& spec, MPI_Comm comm, double timeout_s, const std::string& flag = "--model");
// The model's shape; rope_theta > 0 overrides the model's.
model::LlamaConfig model_config(const ModelRef& m, double rope_theta = 0);

// `spec` with the adapter folder `adapter` merged (the "+adapter:DIR" suffix; "" leaves it).
std::string with_adapter(const std::string& spec, const std::string& adapter);

// The largest host buffer load_model_weights stages through (f32 elements): the largest HF
// tensor, or a checkpoint's (or random model's) unit chunk (at most kLoadChunkElems).
int64_t load_staging_elems(const ModelRef& m, const model::ParamLayout& layout);
// Every unit of `layout` in its own buffer of `dtype` on `be` (labelled "weights"), filled
// from the folder or the checkpoint through one host f32 buffer of load_staging_elems
// elements (f32 host backends: read in place), converted by Backend::copy: never two f32
// copies of the model on the host. The adapter (ModelRef::adapter) is merged on the way.
std::vector<ops::Buffer> load_model_weights(const ModelRef& m, const model::ParamLayout& layout, ops::Backend& be,
                                            ops::DType dtype);

}  // namespace easyctx::eval
