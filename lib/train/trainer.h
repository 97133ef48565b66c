// The training loop of one stage (docs/design.md "one training step, as data"):
//   1. data: this rank's slices of the step's windows (data::DataLoader);
//   2-4. forward and backward per micro-batch through the model, the parameters and their
//      gradients reached through the parameter store (zero::ParamStore: replicated, or ZeRO-3
//      shards gathered per layer and reduce-scattered right after each layer's backward);
//   5. update: gradients reduced, clipped by their global norm, AdamW on what this rank owns;
//   6. log and checkpoint (train/step_report.h, lib/ckpt).
// Loss = mean NLL over every labelled token of the global batch: each micro-batch's backward
// is scaled by 1 / (labelled tokens summed over all micro-batches and all ranks), so
// accumulation, data parallelism and uneven label counts all give the same gradient.
//
// Backends (train.device): cpu runs the fp32 reference (master weights are the parameters);
// cuda keeps a bf16 working copy of the parameters on the device, fp32 gradients, and fp32
// master weights and Adam moments on the device or (parallel.zero.offload_optimizer) in host
// memory. Sequence parallelism plugs in at the model's attention seam.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/strategy.h"
#include "core/config.h"
#include "core/json.h"
#include "dist/groups.h"
#include "dist/runtime.h"
#include "model/llama.h"
#include "ops/ops.h"
#include "train/step_report.h"
#include "zero/param_store.h"

namespace easyctx::data {
class DataLoader;
struct MicroBatch;
}  // namespace easyctx::data

namespace easyctx::plan {
struct MemoryPlan;
}

namespace easyctx::ckpt {
class RankSync;
class CheckpointReader;
class LoraAdapter;
enum class VerifyScope;
}  // namespace easyctx::ckpt

namespace easyctx::train {

// How a run starts (easyctx_train --resume; docs/training.md, "Checkpoint safety"):
//   "auto": continues the run <output.dir>/run.json names from its newest checkpoint that
//     verifies (falling back past broken ones with a warning), or starts it from model.init when
//     it has none; refuses to start when every checkpoint of that run is broken (naming them).
//     Without run.json: the newest checkpoint in the folder that verifies, or a new run.
//   "none": a new run from model.init; the folder's earlier run keeps its checkpoints (never
//     pruned) and its DONE, final/ and metrics.jsonl move to previous/<its id>/.
//   anything else: a checkpoint folder (a step folder, a checkpoints folder, or a run's
//     output.dir) to resume from, verified first. Unless it is the newest checkpoint of the run
//     this output.dir holds (then the same as auto), the run started is a new one (a fork).
struct RunOptions {
  std::string resume = "auto";
};

class Trainer {
 public:
  // Builds the model, initialises or loads weights, opens the data. Collective over world.
  // With sequence parallelism (parallel.sequence.size > 1: zigzag_ring, ulysses,
  // dist_flash or usp) each rank holds a slice of every sequence and attention runs across the
  // group; parameter gradients are then summed over the whole world (dp x sp).
  Trainer(const StageConfig& cfg, dist::ProcessGroups& groups, const RunOptions& opts = {});
  // Without sequence parallelism: `world` holds every rank of the job (loss and label
  // counts are summed over it), `dp` the data-parallel replicas (gradients summed over it).
  Trainer(const StageConfig& cfg, dist::Comm& world, dist::Comm& dp, const RunOptions& opts = {});
  ~Trainer();

  // One optimizer step on the global batch of `step`. A non-finite loss or gradient norm
  // throws naming the step before the update (train.on_nonfinite: stop), or skips the update
  // (skip_step: StepStats::skipped). A global batch without a labelled token is a step with no
  // update (StepStats::no_labels; its sequences named in the log). Only an update advances
  // Adam's step count (its bias correction counts the updates the moments have seen); the
  // learning rate is the schedule's at `step` either way (train.steps counts global batches).
  StepStats train_step(int64_t step);
  // The first half of train_step: forward/backward over every micro-batch and the
  // gradient reduction, leaving the summed gradients (of the global mean loss, before
  // clipping) in gradients(). Fills loss, tokens, labels. Without a labelled token in the
  // global batch: StepStats::no_labels, nothing computed (gradients() as they were).
  StepStats compute_gradients(int64_t step);
  // Optimizer updates applied in the run so far (resumed from the checkpoint), and the steps
  // whose global batch had no labelled token.
  int64_t updates() const { return updates_; }
  int64_t steps_without_labels() const { return no_label_steps_; }
  // Gradients (fp32; device memory on CUDA). ZeRO-3: refused (each rank holds shards).
  std::vector<ops::Tensor> gradients() const { return store_->gradients(); }
  // The backend's allocation counters (device memory on CUDA; what the plan's allocations predict).
  ops::MemoryStats memory_stats() const { return be_->memory_stats(); }
  // Every step with logging and metrics, then the final save. Returns the last stats.
  // First writes <output.dir>/plan.json (rank 0, atomically): the memory plan the run was
  // checked against, plan::plan_to_json's form (a failure to write it is only a warning). A step's metrics record is written before its
  // checkpoint, so a committed checkpoint is never ahead of metrics.jsonl. Stops early, after a checkpoint, when any rank received
  // SIGUSR1/SIGTERM (stopped() is then true); on completion writes <output.dir>/DONE.
  StepStats run();
  bool stopped() const { return stopped_; }
  // Writes the weights as a Hugging Face folder (config.json + model.safetensors); rank 0.
  // ZeRO-3: collective over the shard group (every rank calls it; world rank 0 writes).
  void save_hf(const std::string& dir) const;
  // Commits a training checkpoint after `steps_done` optimizer steps under
  // <output.dir>/checkpoints (lib/ckpt/sharded_checkpoint.h): fp32 master weights and Adam
  // moments per unit, with this run's id. Collective over world. A step this run has already
  // committed (a stop request right after a periodic save or at the start of a resumed run) is
  // not written again.
  void save_checkpoint(int64_t steps_done);
  // This run's id (<output.dir>/run.json, every checkpoint's index).
  const std::string& run_id() const { return run_id_; }
  // The first step this trainer runs: 0, or where the checkpoint it resumed from ended.
  int64_t start_step() const { return start_step_; }

  const model::LlamaModel& model() const { return *model_; }
  // The stage config as it runs: the plan's auto choices (parallel.zero.offload_optimizer,
  // activation.checkpoint) written in.
  const StageConfig& config() const { return cfg_; }
  // fp32 master weights, one flat view per ParamLayout unit (device memory on CUDA).
  // ZeRO-3: refused (each rank holds shards; use master_host()).
  std::vector<ops::Tensor> master() const { return store_->master(); }
  // The same, copied to host memory (any backend). ZeRO-3: the whole model gathered from the
  // shards, collective over the shard group (every rank calls it).
  std::vector<std::vector<float>> master_host() const { return store_->master_host(); }
  std::vector<std::vector<float>> gradients_host() const { return store_->gradients_host(); }
  // cpu or cuda: what train.device resolved to.
  DeviceKind device() const { return device_; }
  // Bytes of weights (and, when resuming or carrying them, Adam moments) this rank read from
  // disk at start: model.init hf:DIR or ckpt:DIR, or the checkpoint resumed (0 for random
  // init). Stage 0 reads every unit whole; ZeRO-3 only this rank's shard of each unit.
  uint64_t weights_bytes_read() const { return weights_bytes_read_; }
  // Model FLOPs per token (causal counting, docs/design.md "Performance model").
  double flops_per_token() const;
  double attention_flops_per_token() const;  // of flops_per_token: attention over a causal square

 private:
  void init(dist::ProcessGroups* groups);
  // MFU's attention share of a step's micro-batches (documents, sliding windows; trainer.cpp).
  double attention_share(const std::vector<data::MicroBatch>& micro) const;
  void plan_memory();                                                 // init: plan_, the auto choices written into cfg_
  void make_loader(dist::ProcessGroups* groups, int64_t vocab_size);  // init: loader_, the data checked
  void restore_data_cursor();                                         // init, after load_weights
  void log_no_labels(int64_t step);                                   // a step whose global batch has no labelled token
  void load_weights();  // model.init, or resume from <output.dir>/checkpoints; records the run
  // load_weights' ways to the first weights (trainer_start.cpp).
  std::string resume_weights(ckpt::RankSync& sync, const Json& entry, const std::string& what);
  void load_hf_weights(ckpt::RankSync& sync);
  void load_ckpt_weights(ckpt::RankSync& sync);
  void init_random_weights();
  // model.init ckpt:DIR: the newest committed checkpoint there that verifies (its step folder).
  std::string verified_init_checkpoint(ckpt::RankSync& sync);
  // model.adapter with lora.rank 0: the adapter merged into the weights model.init loads; else null.
  std::unique_ptr<ckpt::LoraAdapter> merged_adapter() const;
  // LoRA (trainer_lora.cpp): the frozen base and the trainable tensors' first values from
  // model.init (and model.adapter); `resuming`: a checkpoint of this run's then gives the
  // trainable ones. Records the base's identity (lora_base_init_, lora_base_fingerprint_).
  void load_lora_weights(ckpt::RankSync& sync, bool resuming);
  uint64_t load_lora_base(const std::string& init, ckpt::LoraAdapter* adapter);
  // The base of `init` (random, hf:DIR, a full fine-tune's ckpt: step folder): its fingerprint.
  std::string base_fingerprint(const std::string& init) const;
  // A checkpoint's LoRA (its index's meta.lora) against this run's: the same trainable tensors
  // on the same base, or none on either side; InputError naming what differs.
  void check_lora_checkpoint(const ckpt::CheckpointReader& r, const std::string& what) const;
  // This run's LoRA for a checkpoint's index (meta.lora); null without LoRA.
  Json lora_meta() const;
  void save_lora_export(const std::string& dir) const;
  // The newest of `candidates` (a JSON array of {path, step, run_id}) that verifies in `scope`
  // (every rank checks a share of its files): its index, or -1 when there is none; InputError
  // naming every broken one (after `what`) when none verifies.
  int choose_verified(ckpt::RankSync& sync, const Json& candidates, const std::string& what, ckpt::VerifyScope scope);
  Json plan_start() const;                                      // rank 0 (load_weights)
  Json record_run(const Json& plan, const Json& chosen) const;  // rank 0 (load_weights)
  void write_plan() const;                                      // rank 0 (run): <output.dir>/plan.json
  void log_startup() const;
  bool stop_requested();  // collective: did any rank get a stop signal (dist/signals.h)?
  bool on_device() const { return be_->memspace() == MemSpace::Device; }

  StageConfig cfg_;
  DeviceKind device_;
  dist::Comm& world_;
  dist::Comm& dp_;
  dist::Comm& grad_comm_;               // gradients are summed over it: dp, or world with sequence parallelism
  dist::Comm* zero_ = nullptr;          // ZeRO-3 shard group (world by default)
  dist::Comm* zero_replica_ = nullptr;  // ranks holding the same shard (per-node sharding), or null
  MPI_Comm world_mpi_;                  // the same ranks as world_, for the checkpoint writer
  int ranks_per_node_ = 1;
  RunOptions opts_;
  int64_t start_step_ = 0;
  std::string run_id_, config_hash_;
  int64_t last_saved_step_ = -1;                        // committed by this run and verified: never written again
  int64_t updates_ = 0;                                 // optimizer updates of the run so far (Adam's step count)
  int64_t no_label_steps_ = 0;                          // steps of the run without a labelled token (no update)
  int64_t no_label_described_ = 0;                      // of them described in this process's log
  std::string resumed_data_state_;                      // the checkpoint's data cursor, checked once the loader exists
  std::string lora_base_init_, lora_base_fingerprint_;  // LoRA: the frozen base's source and identity
  bool stopped_ = false;
  uint64_t weights_bytes_read_ = 0;
  std::unique_ptr<ops::Backend> be_;
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<zero::ParamStore> store_;
  std::unique_ptr<data::DataLoader> loader_;
  attention::SequenceSplit sp_split_;  // the loader's layout over the sequence-parallel group
  bool balance_logged_ = false;        // document_mask: the first window's work per rank, said once
  std::unique_ptr<StepReporter> report_;
  std::shared_ptr<plan::MemoryPlan> plan_;               // the memory plan of this run (checked before allocating)
  ops::Buffer tokens_dev_, positions_dev_, labels_dev_;  // CUDA: the micro-batch on the device
};

// torch.nn.utils.clip_grad_norm_ (zero/param_store.h).
using zero::clip_by_global_norm;

// The device the trainer runs for train.device (ops::resolve_device): cpu -> cpu; cuda -> cuda
// (refused, naming the key, when the build has no CUDA or no device is visible); auto -> cuda
// when the build has CUDA and a device is visible, else cpu.
DeviceKind trainer_device(DeviceKind requested);

// The app entry point (apps/easyctx_train.cpp): trains the stage described by cfg.
// Exit code 0 also when stopped by a signal after its checkpoint (the job is resumable); 130
// when that signal was SIGINT (Ctrl-C).
int run_stage(dist::Runtime& rt, const StageConfig& cfg, dist::ProcessGroups& groups, const RunOptions& opts = {});

}  // namespace easyctx::train
