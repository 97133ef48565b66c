// The training loop of one stage (DESIGN.md "one training step, as data"):
//   data -> forward/backward per micro-batch (gradients accumulate) -> data-parallel
//   gradient all-reduce -> global-norm clip -> AdamW on fp32 master weights -> log.
// Loss = mean NLL over every labelled token of the global batch: each micro-batch's
// backward is scaled by 1 / (labelled tokens summed over all micro-batches and all ranks),
// so accumulation, data parallelism and uneven label counts all give the same gradient.
//
// Backends (train.device): cpu runs the fp32 reference (master weights are the parameters);
// cuda keeps a bf16 working copy of the parameters on the device, fp32 gradients, fp32
// master weights and Adam moments on the device, and refreshes the bf16 copy after each
// AdamW step. Checkpoints and HF import/export stage through host fp32 buffers.
//
// ZeRO stage 0 (every rank holds all parameters, gradients are all-reduced over dp).
// ZeRO stage 3 (parallel.zero.stage 3, CPU and CUDA): each rank keeps only its shard of every
// unit's fp32 master weights, Adam moments and reduced gradient (and on CUDA of the bf16
// working parameters). The embedding and head units are gathered once per step; a layer unit
// is all-gathered into a pool of 1 + parallel.zero.prefetch unit buffers just before the
// model uses it (forward, then again for recompute + backward) through the model's
// ParamSource seam, and its gradient is reduce-scattered into the rank's shard right after
// that layer's backward (per micro-batch, added into the shard). Sequence parallelism plugs
// in at the model's attention seam.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/sp_slice.h"
#include "dist/groups.h"
#include "dist/runtime.h"
#include "model/llama.h"
#include "ops/ops.h"

namespace easyctx::ops {
class ProfilingBackend;
}

namespace easyctx::data {
class DataLoader;
}

namespace easyctx::plan {
struct MemoryPlan;
}

namespace easyctx::train {

class HostAdamW;

struct StepStats {
  int64_t step = 0;        // 0-based step index
  double loss = 0;         // mean NLL over the global batch's labelled tokens
  double lr = 0;
  double grad_norm = 0;    // global L2 norm before clipping
  int64_t tokens = 0;      // input tokens of the global batch
  int64_t labels = 0;      // labelled tokens of the global batch
  double seconds = 0;      // wall time of the step
  double fwd_bwd_seconds = 0;  // of it: data, forward and backward (gradients final), before clip and optimizer
  double mfu = -1;         // model FLOP utilisation (CUDA with a known peak; else -1), set by run()
  double peak_mem_gib = -1;  // device memory high-water mark so far (CUDA; else -1), set by run()
};

// How a run starts (easyctx_train --resume): "auto" resumes from the newest committed
// checkpoint in <output.dir>/checkpoints (falling back past broken ones) or starts from
// model.init when there is none; "none" always starts from model.init; anything else is a
// checkpoint folder (a step folder, a checkpoints folder, or a run's output.dir) to resume.
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

  // One optimizer step on the global batch of `step`.
  StepStats train_step(int64_t step);
  // The first half of train_step: forward/backward over every micro-batch and the
  // gradient reduction, leaving the summed gradients (of the global mean loss, before
  // clipping) in gradients(). Fills loss, tokens, labels.
  StepStats compute_gradients(int64_t step);
  // Gradients (fp32; device memory on CUDA).
  std::vector<ops::Tensor> gradients() const;
  // The backend's allocation counters (device memory on CUDA; what the plan's allocations predict).
  ops::MemoryStats memory_stats() const;
  // Every step with logging and metrics, then the final save. Returns the last stats.
  // Stops early, after a checkpoint, when any rank received SIGUSR1/SIGTERM
  // (stopped() is then true); on completion writes <output.dir>/DONE.
  StepStats run();
  bool stopped() const { return stopped_; }
  // Writes the weights as a Hugging Face folder (config.json + model.safetensors); rank 0.
  // ZeRO-3: collective over the shard group (every rank calls it; world rank 0 writes).
  void save_hf(const std::string& dir) const;
  // Commits a training checkpoint after `steps_done` optimizer steps under
  // <output.dir>/checkpoints (lib/ckpt/sharded_checkpoint.h): fp32 master weights and Adam
  // moments per unit. Collective over world.
  void save_checkpoint(int64_t steps_done);
  // The first step this trainer runs: 0, or where the checkpoint it resumed from ended.
  int64_t start_step() const { return start_step_; }

  const model::LlamaModel& model() const { return *model_; }
  // fp32 master weights, one flat view per ParamLayout unit (device memory on CUDA).
  // ZeRO-3: refused (each rank holds shards; use master_host()).
  std::vector<ops::Tensor> master() const;
  // The same, copied to host memory (any backend). ZeRO-3: the whole model gathered from the
  // shards, collective over the shard group (every rank calls it).
  std::vector<std::vector<float>> master_host() const;
  std::vector<std::vector<float>> gradients_host() const;
  // cpu or cuda: what train.device resolved to.
  DeviceKind device() const { return device_; }
  // Model FLOPs per token (causal counting, DESIGN.md "Performance model").
  double flops_per_token() const;

 private:
  void reduce_gradients();
  double clip_gradients();
  // defer (offload_optimizer, not profiling): the host AdamW runs on while the next step's
  // forward starts (PendingUpdate in trainer.cpp; ZeRO-3: z3_ready); settle_optimizer() waits
  // for it.
  void optimizer_step(double lr, int64_t step, bool defer = false);
  void settle_optimizer() const;
  // The next step's forward reaching unit u while the host AdamW still runs: waits for the
  // unit's update (host, then the compute stream and ZeRO-3's communication stream on its
  // upload) and zeroes its gradient.
  void await_unit(size_t u);
  class PendingUpdate;
  friend class PendingUpdate;
  // ZeRO-3: the same for unit u when the model first reaches it (or at the end of the first
  // micro-batch), plus the embedding's or head's gather; z3_pending_ marks the units not yet
  // reached (empty: no deferred update).
  void z3_ready(size_t u);
  void log_startup() const;
  void init(std::shared_ptr<attention::SequenceAttention> attn, data::SpLayout sp_layout, int sp_size, int sp_rank,
            int sp_inner = 1);
  void load_weights();  // model.init, or resume from <output.dir>/checkpoints
  bool stop_requested();  // collective: did any rank get SIGUSR1/SIGTERM?
  bool on_device() const { return be_->memspace() == ops::MemSpace::Device; }
  // Host fp32 views of per-unit buffers: the buffers themselves on the CPU; on CUDA host
  // copies kept in `stage` (downloaded when `fetch`). upload() writes staged copies back.
  std::vector<ops::Tensor> host_views(const std::vector<ops::Buffer>& bufs, std::vector<std::vector<float>>& stage,
                                      bool fetch) const;
  void upload(std::vector<ops::Buffer>& bufs, const std::vector<std::vector<float>>& stage);
  static bool host_resident(const std::vector<ops::Buffer>& bufs);
  void refresh_working_copy();  // CUDA: bf16 parameters = master weights; ZeRO-3: then regather()
  void regather();              // ZeRO-3: the embedding and head all-gathered, the pool invalidated
  bool zero3() const { return cfg_.parallel.zero.stage == 3; }
  // ZeRO-3 on CUDA with parallel.zero.offload_params: wshard_ in pinned host memory, copied to
  // the GPU unit by unit just before its all-gather (gather_unit).
  bool offload_params() const { return zero3() && cfg_.parallel.zero.offload_params; }
  // ZeRO-3 on CUDA: the Adam moments are allocated (and read from a checkpoint) as shards.
  bool zero3_moment_shards() const { return zero3() && on_device(); }
  // ZeRO-3: unit u is cut into Z equal shards of shard_len(u) (the last padded); this rank
  // owns elements [shard_lo(u), shard_lo(u) + shard_valid(u)).
  int64_t shard_len(size_t u) const;
  int64_t shard_lo(size_t u) const;
  int64_t shard_valid(size_t u) const;
  void shard_optimizer_state();  // full master/Adam (as loaded) -> this rank's shards
  std::vector<ops::Tensor> params() const;  // what the model computes with (stage 0)
  // ZeRO-3 per-layer gathering (the model's ParamSource): see Zero3Params in trainer.cpp.
  class Zero3Params;
  friend class Zero3Params;
  bool layer_unit(size_t u) const { return u != model_->layout().embed_unit() && u != model_->layout().head_unit(); }
  void gather_unit(size_t u, const ops::Buffer& dst);    // dst = all shards of unit u (compute dtype)
  void gather_layer(size_t u, size_t slot);              // pool_[slot] = layer unit u (GatherStream)
  struct GatherStream;  // CUDA + NCCL: the layers' gathers on their own stream (trainer.cpp)
  // gshard_[u] += this rank's block of the sum of layer_grad_[k] (GatherStream: asynchronous,
  // completed by finish_scatter(k)).
  void scatter_grad(size_t u, size_t k);
  void finish_scatter(size_t k);
  static constexpr size_t kNoUnit = static_cast<size_t>(-1);
  size_t scatter_unit_[2] = {kNoUnit, kNoUnit};  // per layer_grad_ buffer: the unit whose reduce-scatter is in flight
  std::vector<float> gather_master_host(size_t u) const;  // unit u's fp32 master weights, whole
  // logging.profile: ends phase `name` of the step (synchronizes the backend; its wall time
  // since the previous mark adds to the phase), and the report at the end of the run.
  void phase(const char* name);
  void report_profile() const;

  StageConfig cfg_;
  DeviceKind device_;
  dist::Comm& world_;
  dist::Comm& dp_;
  dist::Comm& grad_comm_;  // gradients are summed over it: dp, or world with sequence parallelism
  dist::Comm* zero_ = nullptr;          // ZeRO-3 shard group (world by default)
  dist::Comm* zero_replica_ = nullptr;  // ranks holding the same shard (per-node sharding), or null
  MPI_Comm world_mpi_;     // the same ranks as world_, for the checkpoint writer
  int64_t start_step_ = 0;
  std::string resumed_data_state_;  // the checkpoint's data cursor, checked once the loader exists
  RunOptions opts_;
  bool stopped_ = false;
  std::unique_ptr<ops::Backend> be_;
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<data::DataLoader> loader_;
  std::vector<ops::Buffer> master_, grads_, adam_m_, adam_v_;  // per unit, f32[unit numel]
  std::unique_ptr<ops::Backend> host_be_;  // offload_optimizer: owns master_, adam_m_, adam_v_ (ZeRO-3: shards) in host memory
  std::shared_ptr<HostAdamW> host_adamw_;
  std::shared_ptr<plan::MemoryPlan> plan_;  // the memory plan of this run (checked before allocating)
  int ranks_per_node_ = 1;  // offload_optimizer: the host AdamW pipeline (CUDA builds only)
  std::vector<ops::Buffer> work_;  // CUDA: bf16 working parameters per unit (empty on the CPU)
  // ZeRO-3 (then master_/adam_m_/adam_v_ hold only this rank's shard, f32[shard_len]):
  std::vector<ops::Buffer> full_;    // embedding and head gathered for the step, [shard_len * Z] (compute dtype)
  std::vector<ops::Buffer> wshard_;  // CUDA: this rank's shard of the bf16 working parameters (offload_params: pinned host)
  std::vector<ops::Buffer> gshard_;  // this rank's reduced gradient shard, f32[shard_len]
  // (grads_ then holds the embedding's and head's padded f32 gradients only.)
  std::vector<ops::Buffer> pool_;         // 1 + prefetch gathered layer units, [layer shard_len * Z]
  // f32[layer shard_len * Z]: the gradient of the layer in backward (CUDA: two, used in turn),
  // and f32[layer shard_len]: its reduce-scatter's result.
  std::vector<ops::Buffer> layer_grad_, grad_part_;
  std::unique_ptr<Zero3Params> zparams_;  // the model's ParamSource over the above
  std::vector<bool> z3_pending_;          // per unit: a deferred host AdamW not yet awaited (z3_ready)
  bool zero_stream_set_ = false;          // NCCL ZeRO comms enqueue on the backend's stream
  std::unique_ptr<GatherStream> gs_;      // ... except the layers' gathers (null: synchronous gathers)
  ops::Buffer tokens_dev_, positions_dev_, labels_dev_;  // CUDA: the micro-batch on the device
  double peak_flops_ = 0;     // CUDA: the device's dense bf16 peak, FLOP/s (0: unknown)
  double peak_mem_bytes_ = 0;  // CUDA: device memory in use, high-water mark
  // logging.profile (the backend wrapped in ops::ProfilingBackend; null otherwise):
  ops::ProfilingBackend* prof_ = nullptr;
  std::vector<std::pair<std::string, double>> phase_ms_;  // per phase, in order: ms summed over profiled steps
  std::chrono::steady_clock::time_point phase_t_;
  int64_t profiled_steps_ = 0;
  double profiled_ms_ = 0;  // wall time of the profiled steps
};

// torch.nn.utils.clip_grad_norm_: returns the global L2 norm of `grads` (all local; sum
// over shards first when sharded) and, when max_norm > 0 and norm > max_norm, scales every
// gradient by max_norm / (norm + 1e-6).
double clip_by_global_norm(ops::Backend& be, const std::vector<ops::Tensor>& grads, double max_norm);

// The app entry point (apps/easyctx_train.cpp): trains the stage described by cfg.
// The device the trainer runs for train.device: cpu -> cpu; cuda -> cuda (refused, naming
// the key, when the build has no CUDA or no device is visible); auto -> cuda when the build
// has CUDA and a device is visible, else cpu.
DeviceKind trainer_device(DeviceKind requested);

// Exit code 0 also when stopped by a signal after its checkpoint (the job is resumable).
int run_stage(dist::Runtime& rt, const StageConfig& cfg, dist::ProcessGroups& groups, const RunOptions& opts = {});

}  // namespace easyctx::train
