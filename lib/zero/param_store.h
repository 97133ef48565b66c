// Where the parameters and their optimizer state live between steps, and how a step reaches
// them (docs/design.md "one training step, as data", steps 2-5). The trainer holds one ParamStore:
//
//   ReplicatedStore (parallel.zero.stage 0): every rank holds every unit's fp32 master weights,
//     gradients and Adam moments (on CUDA also a bf16 working copy); gradients are summed over
//     the ranks that computed parts of them (all-reduce).
//   ShardedStore (stage 3): each rank keeps only its shard (zero/shard_layout.h) of every
//     unit's fp32 master weights, Adam moments and reduced gradient (CUDA: and of the bf16
//     working parameters). The embedding and head are gathered once per step; a layer is
//     gathered into a pool of 1 + parallel.zero.prefetch buffers just before the model uses it
//     (zero/gather_pool.h) and its gradient reduce-scattered into the shard right after its
//     backward (zero/grad_scatter.h).
//
// Both keep the fp32 state on the compute backend or, with parallel.zero.offload_optimizer,
// in host memory, updated by the host AdamW (zero/host_adamw.h), which may finish inside the
// next step's forward (zero/deferred_update.h).
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "dist/comm.h"
#include "model/llama.h"
#include "model/param_layout.h"
#include "ops/ops.h"

namespace easyctx::ckpt {
class CheckpointReader;
class CheckpointWriter;
enum class ArrayKind;
}  // namespace easyctx::ckpt

namespace easyctx::zero {

struct OffloadPiece;  // zero/host_adamw.h
struct HostAdamWTimes;

// Elements per pinned staging slot of the host AdamW (two slots of f32 + bf16:
// 2 x kOffloadChunkElems x (4 + 2) bytes of pinned host memory).
constexpr int64_t kOffloadChunkElems = int64_t{1} << 24;

struct StoreOptions {
  int zero_stage = 0;              // parallel.zero.stage: 0 or 3
  int prefetch = 1;                // parallel.zero.prefetch (stage 3)
  bool offload_optimizer = false;  // parallel.zero.offload_optimizer (device backends)
  bool offload_params = false;     // parallel.zero.offload_params (stage 3 + offload_optimizer)
  bool offload_grads = false;      // parallel.zero.offload_grads (stage 3 + offload_optimizer)
  // parallel.zero.offload_optimizer_layers (stage 0 + offload_optimizer): only the head's and the
  // last this-many layers' state in host memory, the rest on the device (0: every unit's).
  int64_t offload_optimizer_layers = 0;
  // The backend of the state kept in host memory (offload_optimizer). Default:
  // ops::make_cpu_backend. The memory plan passes recording backends and replays the store's
  // allocations.
  std::function<std::unique_ptr<ops::Backend>()> host_backend;
};

// The options of a training stage (parallel.zero.*), for the trainer and the memory plan.
StoreOptions store_options(const StageConfig& cfg);

// The groups a store reduces and shards over.
struct StoreComms {
  dist::Comm* world = nullptr;         // every rank (checkpoint slices of stage 0)
  dist::Comm* grads = nullptr;         // stage 0: gradients are summed over it
  dist::Comm* zero = nullptr;          // stage 3: the shard group
  dist::Comm* zero_replica = nullptr;  // stage 3: ranks holding the same shard (per-node sharding), or null
};

// What a step does with the store, in order: begin_step, then per micro-batch source() ->
// the model's forward_backward -> end_micro_batch, then finish_reduction, clip,
// optimizer_step.
class ParamStore {
 public:
  virtual ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // ---- loading, before the first step
  // Writes elements [offset, offset + length) of unit u's whole fp32 master weights into host
  // f32 `out` (random initialisation, a Hugging Face folder, ...).
  using MasterFill = std::function<void(size_t unit, int64_t offset, int64_t length, float* out)>;
  // The master weights this rank keeps, each part asked of `fill` once, unit by unit: every
  // unit whole on stage 0, only this rank's shard of each unit on stage 3 (the range
  // [lo, lo + valid), the padding left 0), so a ZeRO-3 rank never reads or holds more of the
  // model than its share. Host-resident state is written in place; device state through a
  // host staging of one unit's part at a time.
  void load_master(const MasterFill& fill);
  // From a checkpoint: the master weights, and the Adam moments when `moments`; the parts this
  // rank keeps, as load_master (only their elements are read).
  void read_checkpoint(const ckpt::CheckpointReader& r, bool moments);
  // After loading: (stage 3) the buffers of the per-layer path; the working copy made.
  // Collective over the shard group.
  void finish_loading() {
    allocate_step_buffers();
    refresh_working_copy();
  }
  // Stage 3: the buffers a step adds to the shards (gradient and working shards, the
  // embedding and head gathered, the pool of gathered layers, the reduce-scatter's); the first
  // half of finish_loading (the memory plan replays it).
  virtual void allocate_step_buffers() {}

  // ---- a step
  // Gradients zeroed, except those of units a deferred update has still to reach.
  virtual void begin_step() = 0;
  // The parameters and gradients of micro-batch `m` of this step (the model's seam).
  virtual model::ParamSource& source(int64_t m) = 0;
  virtual void end_micro_batch(int64_t m) = 0;
  // Gradients summed over every rank that computed a part of them.
  virtual void finish_reduction() = 0;
  // The global L2 norm of the gradients; when max_norm > 0 and the norm is larger, every
  // gradient is scaled by max_norm / (norm + 1e-6) (torch.nn.utils.clip_grad_norm_).
  virtual double clip(double max_norm) = 0;
  // AdamW on the state this rank owns (weight decay on matrices only), then the working copy.
  // `defer` (host AdamW only): the update runs on while the next step's forward starts.
  void optimizer_step(const ops::AdamWStep& s, double weight_decay, bool defer);
  // Waits for a deferred update.
  void settle() const;
  // offload_optimizer: the host AdamW's completed updates and the waits for them since the last
  // call (a deferred update counts in the step whose forward finished it); zeros without one.
  HostAdamWTimes take_host_optimizer_times();

  // ---- state
  // This rank's slices into a checkpoint (master weights, Adam moments); device state is
  // staged in `staging`, which must live until the writer has committed.
  using CheckpointStaging = std::deque<std::vector<float>>;  // (a deque: staged slices never move)
  virtual void write_checkpoint(ckpt::CheckpointWriter& w, CheckpointStaging& staging) = 0;
  // Every unit's whole fp32 master weights in host memory. Stage 3: gathered from the shards,
  // collective over the shard group.
  virtual std::vector<std::vector<float>> master_host() = 0;
  // The same on world rank 0 only (the HF export), empty vectors elsewhere. Stage 3: collective
  // over the shard group, every other rank holding one gathered unit at a time, so a node holds
  // one copy of the model (rank 0's) rather than one per rank. Stage 0: master_host().
  virtual std::vector<std::vector<float>> master_host_at_root() { return master_host(); }
  // Stage 0 only (tests): the master weights and gradients as they are held.
  virtual std::vector<ops::Tensor> master() const;
  virtual std::vector<ops::Tensor> gradients() const;
  std::vector<std::vector<float>> gradients_host() const;
  // One line for the startup log.
  virtual std::string describe() const = 0;

 protected:
  ParamStore(const model::ParamLayout& layout, ops::Backend& be, DType dtype, const StoreOptions& o,
             const StoreComms& c);
  bool on_device() const { return be_.memspace() == MemSpace::Device; }
  // offload_optimizer: whether unit u's fp32 state lives in host memory (every unit's, unless
  // offload_optimizer_layers splits them: then the head's and the last layers').
  bool state_in_host(size_t u) const;
  std::unique_ptr<ops::Backend> make_host_backend() const;
  // The name of a buffer of the fp32 state for the memory plan: marked when in host memory.
  std::string state_label(const std::string& what) const { return host_be_ ? what + " (offloaded, pageable)" : what; }
  // A store's destructor first: the host AdamW's thread writes buffers about to go (an error
  // of that last step is logged: a destructor cannot report it).
  void settle_before_destruction() noexcept;
  static bool host_resident(const std::vector<ops::Buffer>& bufs);
  // Host fp32 views of whole-unit buffers: the buffers themselves when in host memory, else
  // copies in `staging` (downloaded when `fetch`); upload() writes the copies back.
  std::vector<ops::Tensor> host_views(const std::vector<ops::Buffer>& bufs, std::vector<std::vector<float>>& staging,
                                      bool fetch) const;
  void upload(std::vector<ops::Buffer>& bufs, const std::vector<std::vector<float>>& staging);
  // The part [a, e) of tensor t of unit u this rank updates, at offset a - base of its buffers.
  struct Part {
    int64_t a, e, base;
  };
  virtual Part part_of(size_t u, const model::ParamTensor& t) const = 0;
  // The elements [lo, lo + length) of unit u this rank keeps (at offset 0 of its buffers).
  struct Kept {
    int64_t lo, length;
  };
  virtual Kept kept(size_t u) const = 0;
  // The buffers the update reads and writes: gradients, and the bf16 working copy (empty on the CPU).
  virtual const std::vector<ops::Buffer>& update_grads() const = 0;
  virtual const std::vector<ops::Buffer>& working() const = 0;
  virtual bool working_in_host() const { return false; }
  // After an update that finished here: the working copy from the master weights.
  virtual void refresh_working_copy() = 0;
  // After the device AdamW of a split optimizer (offload_optimizer_layers): the working copy of
  // the units whose state is on the device, on the compute queue.
  virtual void refresh_device_units() {}
  // AdamW on the GPU over unit u's tensors (the parts this rank updates), on the compute queue.
  void device_adamw(size_t u, const ops::AdamWStep& s, double weight_decay);
  // The host AdamW's pieces: every tensor (part) of the units whose state is in host memory.
  std::vector<OffloadPiece> host_pieces(double weight_decay) const;
  // Before the host AdamW writes host memory that queued work may still read.
  virtual void before_host_update() {}
  // The bf16 working copy was written (by refresh_working_copy, or by the host AdamW itself):
  // what reads it is renewed (stage 3: the embedding and head gathered again, the pool stale).
  virtual void working_copy_written() {}
  // After starting a deferred update: what must wait for it.
  virtual void after_deferred_start() = 0;

  const model::ParamLayout& layout_;
  ops::Backend& be_;
  DType dtype_;  // what the model computes with: bf16 on CUDA, f32 on the CPU
  StoreOptions opts_;
  StoreComms comms_;
  std::unique_ptr<ops::Backend> host_be_;              // offload_optimizer: owns the fp32 state in host memory
  std::vector<ops::Buffer> master_, adam_m_, adam_v_;  // per unit (stage 3: this rank's shards once loaded)
  // The checkpoint arrays of each kind (ckpt::array_name) and the buffers that hold them:
  // master_, adam_m_, adam_v_, the weights first (what writers save and loaders read).
  std::array<std::pair<ckpt::ArrayKind, std::vector<ops::Buffer>*>, 3> checkpoint_arrays();
  std::unique_ptr<class HostAdamW> host_adamw_;
  std::unique_ptr<class DeferredUpdate> deferred_;

 private:
  // Unit u's kept part into buffer b: `read(lo, length, out)` writes it to host f32 `out` (b
  // itself when in host memory, else a staging of that part copied to the device).
  void load_part(size_t u, const ops::Buffer& b, const std::function<void(int64_t, int64_t, float*)>& read);
  void end_loading();                      // frees the staging of load_part
  std::unique_ptr<float[]> load_staging_;  // device state: one host staging of the largest part
  int64_t load_staging_len_ = 0;
  void read_units(const ckpt::CheckpointReader& r, ckpt::ArrayKind kind, std::vector<ops::Buffer>& bufs);
};

// torch.nn.utils.clip_grad_norm_ over local gradients: returns their global L2 norm and, when
// max_norm > 0 and the norm is larger, scales every gradient by max_norm / (norm + 1e-6).
double clip_by_global_norm(ops::Backend& be, const std::vector<ops::Tensor>& grads, double max_norm);

// The store of parallel.zero.stage (0 or 3), its buffers allocated (whole units as loaded).
std::unique_ptr<ParamStore> make_param_store(const model::ParamLayout& layout, ops::Backend& be, DType dtype,
                                             const StoreOptions& o, const StoreComms& c);

}  // namespace easyctx::zero
