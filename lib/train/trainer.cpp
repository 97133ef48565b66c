#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>

#include <omp.h>

#ifdef EASYCTX_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/cuda_queue.h"
#include "kernels/cuda_check.h"
#include "ops/cuda/cuda_backend.h"
#endif
#include "ops/profile.h"

#include "attention/dist_flash.h"
#include "attention/head_grouped.h"
#include "attention/ulysses.h"
#include "attention/zigzag_ring.h"
#include "ckpt/convert.h"
#include "ckpt/hf_model.h"
#include "ckpt/sharded_checkpoint.h"
#include "core/log.h"
#include "core/metrics.h"
#include "core/strings.h"
#include "data/loader.h"
#include "dist/signals.h"
#include "plan/memory_plan.h"
#include "plan/target.h"
#include "train/data_stats.h"
#ifdef EASYCTX_HAVE_CUDA
#include "train/host_adamw.h"
#endif
#include "train/schedule.h"

namespace easyctx::train {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
using plan::kOffloadChunkElems;  // elements per pinned staging slot of the offloaded optimizer
using ops::DType;

void check_supported(const StageConfig& cfg) {
  EASYCTX_CHECK_INPUT(cfg.activation.mlp_tile == 0 || cfg.activation.checkpoint != CheckpointPolicy::None,
                      "activation.mlp_tile: ", cfg.activation.mlp_tile, " needs activation.checkpoint layer or "
                      "attention_output (with none every layer keeps its whole MLP activations); set it to 0");
  validate_activation(cfg);
  EASYCTX_CHECK_INPUT(!cfg.data.path.empty(), "data.path: empty; give the h5tokenize output (file, folder or glob)");
}

std::unique_ptr<ops::Backend> make_plain_backend(DeviceKind d, bool deterministic) {
  (void)deterministic;  // (CUDA only)
  if (d == DeviceKind::Cuda) {
#ifdef EASYCTX_HAVE_CUDA
    ops::CudaBackendOptions o;
    o.deterministic = deterministic;
    return ops::make_cuda_backend(o);
#else
    EASYCTX_THROW_INPUT("train.device: cuda: this build has no CUDA backend (rebuild with -DEASYCTX_CUDA=ON)");
#endif
  }
  return ops::make_cpu_backend();
}

// The run's backend, behind the per-op profiler with logging.profile.
std::unique_ptr<ops::Backend> make_backend(DeviceKind d, const StageConfig& cfg) {
  std::unique_ptr<ops::Backend> be = make_plain_backend(d, cfg.train.deterministic);
  if (cfg.logging.profile) be = std::make_unique<ops::ProfilingBackend>(std::move(be));
  return be;
}

std::string format_fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

#ifdef EASYCTX_HAVE_CUDA
// Dense bf16 peak of the current device by name (EASYCTX_PEAK_TFLOPS overrides); 0 unknown.
double device_peak_flops(std::string* name) {
  int dev = 0;
  EASYCTX_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  EASYCTX_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  *name = prop.name;
  if (const char* env = std::getenv("EASYCTX_PEAK_TFLOPS")) return std::atof(env) * 1e12;
  if (std::strstr(prop.name, "H100") || std::strstr(prop.name, "H200")) return 989e12;
  if (std::strstr(prop.name, "A100")) return 312e12;
  return 0;
}

// Device memory in use (all allocations on the device, cudaMemGetInfo), bytes.
double device_mem_used() {
  size_t free_b = 0, total_b = 0;
  EASYCTX_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<double>(total_b - free_b);
}
#endif

}  // namespace

#ifdef EASYCTX_HAVE_CUDA
// ZeRO-3 with NCCL on CUDA: the layers' all-gathers run on their own stream, so a gather
// issued ahead (parallel.zero.prefetch) overlaps the compute of the layers before it. Per pool
// slot, `ready` (on this stream, after the gather into it: the compute stream waits for it
// before the layer uses the slot) and `free` (on the compute stream at release: the next
// gather into the slot waits for it); `shards` (on the compute stream, after the bf16 shards
// were written) orders every gather after the optimizer step. The layers' gradient
// reduce-scatters run on the same stream, each after its layer's backward (`grad_ready[k]` on
// the compute stream), into one of two result buffers (`scattered[k]` after it): the compute
// stream waits for one only when it reuses its layer-gradient buffer two layers later (or at
// the end of the micro-batch) and then adds the result into the shard, so the reduce-scatter
// of a layer overlaps the backward of the next. One stream, one communicator (the ZeRO
// group's): NCCL runs its operations in the order they were issued, the same on every rank.
struct Trainer::GatherStream {
  std::unique_ptr<cuda_queue::StreamQueue> queue;
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> ready, free;
  cudaEvent_t shards = nullptr;
  cudaEvent_t grad_ready[2] = {nullptr, nullptr}, scattered[2] = {nullptr, nullptr};
  explicit GatherStream(size_t slots) {
    // the highest priority: a gather's kernel is scheduled as soon as it may run
    queue = std::make_unique<cuda_queue::StreamQueue>(true);
    stream = queue->stream();
    for (size_t i = 0; i < slots; ++i) {
      ready.push_back(make_event());
      free.push_back(make_event());
    }
    shards = make_event();
    for (int k = 0; k < 2; ++k) grad_ready[k] = make_event(), scattered[k] = make_event();
  }
  ~GatherStream() {
    for (cudaEvent_t e : ready) cudaEventDestroy(e);
    for (cudaEvent_t e : free) cudaEventDestroy(e);
    if (shards) cudaEventDestroy(shards);
    for (int k = 0; k < 2; ++k) {
      if (grad_ready[k]) cudaEventDestroy(grad_ready[k]);
      if (scattered[k]) cudaEventDestroy(scattered[k]);
    }
  }
  GatherStream(const GatherStream&) = delete;
  GatherStream& operator=(const GatherStream&) = delete;
  static cudaEvent_t make_event() {
    cudaEvent_t e = nullptr;
    EASYCTX_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  // The communicators enqueue on this stream while one exists, then on `back` again (also
  // when the collective throws).
  class On {
   public:
    On(const GatherStream& g, std::initializer_list<dist::Comm*> comms, Queue* back) : back_(back) {
      for (dist::Comm* c : comms) {
        if (!c) continue;
        comms_.push_back(c);
        c->set_queue(g.queue.get());
      }
    }
    ~On() {
      for (dist::Comm* c : comms_) c->set_queue(back_);
    }
    On(const On&) = delete;
    On& operator=(const On&) = delete;

   private:
    std::vector<dist::Comm*> comms_;
    Queue* back_;
  };
};
#else
struct Trainer::GatherStream {};
#endif

// The model's ParamSource under ZeRO-3. The embedding and head are gathered once per step
// (full_, regather) and their gradients reduced at the end of it (reduce_gradients); a layer
// unit is all-gathered into a slot of the pool when acquired (and the next
// parallel.zero.prefetch layers of the announced order with it), and its gradient,
// accumulated in a layer_grad_ buffer during its backward, is reduce-scattered into gshard_
// by grad_done (CUDA: two buffers used in turn, the reduce-scatter asynchronous). A slot keeps its unit after release until the slot is needed again, so the last
// layer of the forward (and, across micro-batches, the first ones) are not gathered twice.
// CUDA with NCCL: the gathers run on their own stream (GatherStream), the layers that use a
// slot wait for its gather and the next gather into it waits for their release, so prefetched
// gathers overlap compute. A host communicator (MPI) gathers synchronously.
class Trainer::Zero3Params : public model::ParamSource {
 public:
  explicit Zero3Params(Trainer& t) : t_(t), unit_(t.pool_.size(), kNone), busy_(t.pool_.size(), false) {}
  // The gathered layers are stale after an optimizer step.
  void invalidate() { std::fill(unit_.begin(), unit_.end(), kNone); }

  void begin(const std::vector<size_t>& order) override {
    order_.clear();
    for (size_t u : order)
      if (t_.layer_unit(u)) order_.push_back(u);
    pos_ = 0;
  }
  ops::Tensor acquire(size_t u) override {
    if (!t_.layer_unit(u)) {
      t_.z3_ready(u);
      return t_.full_[u].flat().slice_flat(0, {numel(u)});
    }
    EASYCTX_CHECK(pos_ < order_.size() && order_[pos_] == u, "ZeRO-3: layer unit ", t_.model_->layout().units()[u].name,
                  " acquired out of the announced order");
    const size_t s = ensure(u);
    busy_[s] = true;
    const size_t ahead = static_cast<size_t>(t_.cfg_.parallel.zero.prefetch);
    for (size_t k = 1; k <= ahead && pos_ + k < order_.size(); ++k) ensure(order_[pos_ + k]);
    ++pos_;
#ifdef EASYCTX_HAVE_CUDA
    if (t_.gs_) EASYCTX_CUDA_CHECK(cudaStreamWaitEvent(ops::cuda_stream(*t_.be_), t_.gs_->ready[s], 0));
#endif
    return t_.pool_[s].flat().slice_flat(0, {numel(u)});
  }
  void release(size_t u) override {
    if (!t_.layer_unit(u)) return;
    for (size_t s = 0; s < unit_.size(); ++s)
      if (unit_[s] == u) {
        busy_[s] = false;
#ifdef EASYCTX_HAVE_CUDA
        if (t_.gs_) EASYCTX_CUDA_CHECK(cudaEventRecord(t_.gs_->free[s], ops::cuda_stream(*t_.be_)));
#endif
      }
  }
  ops::Tensor grad(size_t u) override {
    if (!t_.layer_unit(u)) {
      t_.z3_ready(u);
      return t_.grads_[u].flat().slice_flat(0, {numel(u)});
    }
    if (grad_unit_ != u) {
      EASYCTX_CHECK(grad_unit_ == kNone, "ZeRO-3: the gradient of unit ", u, " requested before grad_done of unit ",
                    grad_unit_);
      buf_ = (buf_ + 1) % t_.layer_grad_.size();
      t_.finish_scatter(buf_);  // its previous reduce-scatter has read it (and is added into its shard)
      t_.be_->fill(t_.layer_grad_[buf_].flat(), 0.0);
      grad_unit_ = u;
    }
    return t_.layer_grad_[buf_].flat().slice_flat(0, {numel(u)});
  }
  void grad_done(size_t u) override {
    if (!t_.layer_unit(u)) return;
    EASYCTX_CHECK(grad_unit_ == u, "ZeRO-3: grad_done of unit ", u, " without its gradient");
    t_.scatter_grad(u, buf_);
    grad_unit_ = kNone;
  }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  int64_t numel(size_t u) const { return t_.model_->layout().units()[u].numel; }
  // A slot holding unit u, gathering it into a slot that is neither in use nor holding a
  // unit of the window [pos_, pos_ + prefetch] when it is not resident (the pool has one
  // slot more than the window's other units, so one always exists).
  size_t ensure(size_t u) {
    for (size_t s = 0; s < unit_.size(); ++s)
      if (unit_[s] == u) return s;
    t_.z3_ready(u);  // (a deferred host AdamW: the unit's new shards first)
    const size_t ahead = static_cast<size_t>(t_.cfg_.parallel.zero.prefetch);
    auto needed = [&](size_t unit) {
      for (size_t k = pos_; k <= pos_ + ahead && k < order_.size(); ++k)
        if (order_[k] == unit) return true;
      return false;
    };
    for (size_t s = 0; s < unit_.size(); ++s) {
      if (busy_[s] || (unit_[s] != kNone && needed(unit_[s]))) continue;
      unit_[s] = kNone;
      t_.gather_layer(u, s);
      unit_[s] = u;
      return s;
    }
    EASYCTX_THROW("ZeRO-3: no free slot in the pool of ", unit_.size(), " gathered layers");
  }

  Trainer& t_;
  std::vector<size_t> order_;  // the layer units of one forward_backward, in acquire order
  size_t pos_ = 0;
  std::vector<size_t> unit_;  // per pool slot: the unit it holds (kNone: none)
  std::vector<bool> busy_;    // per pool slot: acquired and not released
  size_t grad_unit_ = kNone;  // the layer whose gradient layer_grad_[buf_] accumulates
  size_t buf_ = 0;
};

Trainer::Trainer(const StageConfig& cfg, dist::Comm& world, dist::Comm& dp, const RunOptions& opts)
    : cfg_(cfg),
      device_(trainer_device(cfg.train.device)),
      world_(world),
      dp_(dp),
      grad_comm_(dp),
      zero_(&world),
      world_mpi_(world.size() == 1 ? MPI_COMM_SELF : MPI_COMM_WORLD),
      opts_(opts) {
  check_supported(cfg_);
  ranks_per_node_ = world.size();
  EASYCTX_CHECK_INPUT(cfg_.parallel.sequence.size == 1, "parallel.sequence.size: ", cfg_.parallel.sequence.size,
                      ": this trainer was built without process groups (sequence parallelism needs them)");
  init(nullptr, data::SpLayout::None, 1, 0);
}

Trainer::Trainer(const StageConfig& cfg, dist::ProcessGroups& groups, const RunOptions& opts)
    : cfg_(cfg),
      device_(trainer_device(cfg.train.device)),
      world_(groups.world()),
      dp_(groups.dp()),
      grad_comm_(groups.layout().sp_size > 1 ? groups.world() : groups.dp()),
      zero_(&groups.zero()),
      zero_replica_(groups.zero_replica().size() > 1 ? &groups.zero_replica() : nullptr),
      world_mpi_(MPI_COMM_WORLD),
      opts_(opts) {
  check_supported(cfg_);
  ranks_per_node_ = groups.layout().ranks_per_node;
  const int sp = groups.layout().sp_size;
  if (sp == 1) {
    init(nullptr, data::SpLayout::None, 1, 0);
    return;
  }
  be_ = make_backend(device_, cfg_);
  std::shared_ptr<attention::SequenceAttention> attn;
  data::SpLayout layout = data::SpLayout::Contiguous;
  switch (cfg_.parallel.sequence.mode) {
    case SeqParallelMode::ZigzagRing:
      attn = std::make_shared<attention::ZigzagRingAttention>(*be_, groups.ring());
      layout = data::SpLayout::Zigzag;
      break;
    case SeqParallelMode::Ulysses:
      attn = std::make_shared<attention::UlyssesAttention>(*be_, groups.ulysses());
      break;
    case SeqParallelMode::DistFlash:
      attn = std::make_shared<attention::DistFlashAttention>(*be_, groups.sp());
      break;
    case SeqParallelMode::Usp:
      // Ulysses all-to-all inside each (contiguous) Ulysses group, zigzag ring across them.
      attn = std::make_shared<attention::UlyssesAttention>(
          *be_, groups.ulysses(), std::make_unique<attention::ZigzagRingAttention>(*be_, groups.ring()));
      layout = data::SpLayout::Usp;
      break;
    case SeqParallelMode::None:
      EASYCTX_THROW_INPUT("parallel.sequence.mode: none with parallel.sequence.size ", sp);
  }
  init(attn, layout, sp, groups.sp().rank(), groups.layout().ulysses_size);
}

// Model, weights, optimizer state and data; `attn` null means local attention.
void Trainer::init(std::shared_ptr<attention::SequenceAttention> attn, data::SpLayout sp_layout, int sp_size,
                   int sp_rank, int sp_inner) {
  // The memory plan first (docs/memory-model.md): a run that would not fit is refused
  // before anything is allocated, naming the knobs that would make it fit.
  plan_ = std::make_shared<plan::MemoryPlan>(plan::plan_for_run(cfg_, world_.size(), ranks_per_node_));
  EASYCTX_CHECK_INPUT(plan_->fits, plan::refusal_message(*plan_),
                      " (the whole plan: easyctx_train STAGE.yaml --plan; target.headroom loosens the margin)");
  if (!be_) be_ = make_backend(device_, cfg_);
  prof_ = dynamic_cast<ops::ProfilingBackend*>(be_.get());
  // Device communicators (NCCL) need device buffers; host communicators (MPI) serve a CUDA
  // trainer too, with the gradients staged through host memory.
  for (const dist::Comm* c : {&world_, &dp_, &grad_comm_})
    EASYCTX_CHECK_INPUT(c->memspace() == dist::MemSpace::Host || on_device(), "train.device: ",
                        to_string(cfg_.train.device), " chose ", c->backend(), " communicators, but the trainer runs "
                        "the ", be_->name(), " backend; set train.device: cuda (or run with MPI communicators)");
  const model::LlamaConfig mc = model::resolve_llama_config(cfg_.model);
  model::ModelOptions mo;
  mo.checkpoint = cfg_.activation.checkpoint;
  mo.lm_head_tile = cfg_.activation.lm_head_tile;
  mo.mlp_tile = cfg_.activation.mlp_tile;
  mo.f32_grads = on_device();  // CUDA: bf16 parameters, fp32 gradients
  mo.offload_checkpoints = cfg_.activation.offload == OffloadTarget::Cpu;
  mo.offload_layers = cfg_.activation.offload_layers;
  if (cfg_.activation.attention_head_groups > 1) {  // attention in passes over head groups
    if (!attn) attn = std::make_shared<attention::LocalAttention>(*be_);
    attn = std::make_shared<attention::HeadGroupedAttention>(*be_, std::move(attn),
                                                             cfg_.activation.attention_head_groups);
  }
  model_ = std::make_unique<model::LlamaModel>(mc, *be_, on_device() ? DType::BF16 : DType::F32, mo, std::move(attn));

  if (cfg_.parallel.zero.offload_optimizer) {
    EASYCTX_CHECK_INPUT(on_device(), "parallel.zero.offload_optimizer: true needs train.device cuda (with the ",
                        be_->name(), " backend the optimizer already runs on the host); set it to false");
#ifdef EASYCTX_HAVE_CUDA
    host_be_ = ops::make_cpu_backend();  // master weights and Adam moments in host memory
    host_adamw_ = std::make_shared<HostAdamW>(kOffloadChunkElems);
#endif
  }
  EASYCTX_CHECK_INPUT(!cfg_.parallel.zero.offload_params || (zero3() && host_be_),
                      "parallel.zero.offload_params: true needs parallel.zero.stage 3 and "
                      "parallel.zero.offload_optimizer: true on train.device cuda (the host AdamW writes the bf16 "
                      "shards it keeps in host memory)");
  // ZeRO-3 on CUDA: the whole master weights are loaded in host memory and only this rank's
  // shards reach the device (shard_optimizer_state; with offload_optimizer they stay in host
  // memory); the Adam moments are this rank's shards from the start (a checkpoint is read
  // shard by shard). On the CPU the whole buffers are the backend's and are replaced by
  // shards after loading.
  std::unique_ptr<ops::Backend> load_be;
  if (zero3() && on_device()) load_be = ops::make_cpu_backend();
  ops::Backend& opt_be = host_be_ ? *host_be_ : load_be ? *load_be : *be_;
  const auto& units = model_->layout().units();
  for (size_t u = 0; u < units.size(); ++u) {
    master_.push_back(opt_be.alloc(DType::F32, units[u].numel));
    // ZeRO-3: gradients are per-layer buffers and shards (shard_optimizer_state).
    grads_.push_back(zero3() ? ops::Buffer() : be_->alloc(DType::F32, units[u].numel));
    const int64_t moments = zero3_moment_shards() ? shard_len(u) : units[u].numel;
    ops::Backend& mom_be = zero3_moment_shards() && !host_be_ ? *be_ : opt_be;
    adam_m_.push_back(mom_be.alloc(DType::F32, moments));
    adam_v_.push_back(mom_be.alloc(DType::F32, moments));
    if (on_device() && !zero3()) work_.push_back(be_->alloc(DType::BF16, units[u].numel));
  }
  load_weights();
  if (zero3()) {
    EASYCTX_CHECK(zero_ != nullptr, "ZeRO-3 without a shard group");
    for (dist::Comm* c : {zero_, zero_replica_}) {
      if (!c) continue;
      EASYCTX_CHECK_INPUT(c->memspace() == dist::MemSpace::Host || on_device(), "parallel.zero.stage: 3: the ",
                          c->name(), " group uses ", c->backend(), " (device buffers) but the trainer runs the ",
                          be_->name(), " backend; set train.device: cuda");
#ifdef EASYCTX_HAVE_CUDA
      // NCCL gathers and reduce-scatters enqueue on the compute stream: ordered with the
      // layers that use their buffers, no host synchronisation (synchronous prefetch).
      if (on_device() && c->memspace() == dist::MemSpace::Device) {
        c->set_queue(&be_->queue());
        zero_stream_set_ = true;
      }
#endif
    }
    shard_optimizer_state();
  }
  refresh_working_copy();
#ifdef EASYCTX_HAVE_CUDA
  if (on_device()) {
    std::string name;
    peak_flops_ = device_peak_flops(&name);
    if (world_.rank() == 0)
      log_info("device ", name, ": MFU against ",
               peak_flops_ > 0 ? format_count(peak_flops_ / 1e12) + " TFLOP/s dense bf16"
                               : std::string("an unknown peak (set EASYCTX_PEAK_TFLOPS)"),
               ", model ", format_count(flops_per_token()), " FLOPs/token");
  }
#endif

  data::LoaderOptions lo;
  lo.path = cfg_.data.path;
  lo.seq_length = cfg_.data.seq_length;
  lo.seed = cfg_.train.seed;
  lo.shape = {cfg_.train.batch_size, cfg_.train.grad_accum, dp_.size()};
  lo.dp_rank = dp_.rank();
  lo.sp_layout = sp_layout;
  lo.sp_size = sp_size;
  lo.sp_rank = sp_rank;
  lo.sp_inner = sp_inner;
  loader_ = std::make_unique<data::DataLoader>(lo);
  loader_->validate(mc.vocab_size, "", cfg_.data.check_tokens);
  if (!resumed_data_state_.empty()) {
    // Same data, seed, sequence length and global batch as the run that saved, or a clear refusal.
    const data::LoaderState s = data::LoaderState::from_json(resumed_data_state_);
    loader_->restore(s);
    EASYCTX_CHECK_INPUT(s.next_step == start_step_, "checkpoint data cursor at step ", s.next_step,
                        " but its index says step ", start_step_);
  }
}

Trainer::~Trainer() {
  try {
    settle_optimizer();  // (the host AdamW's thread writes buffers freed below)
  } catch (const std::exception& e) {
    log_warn("the last optimizer step failed: ", e.what());
  }
  gs_.reset();  // (waits for its gathers)
  if (!zero_stream_set_) return;  // the comms outlive the backend's stream: give them theirs back
  if (zero_) zero_->set_queue(nullptr);
  if (zero_replica_) zero_replica_->set_queue(nullptr);
}

namespace {
// ckpt::resolve_checkpoint (a step folder, or the newest valid one under dir/checkpoints or
// dir), with the skipped broken checkpoints reported.
ckpt::CheckpointRef find_checkpoint(const std::string& dir) {
  std::vector<std::string> warnings;
  const ckpt::CheckpointRef ref = ckpt::resolve_checkpoint(dir, &warnings);
  for (const std::string& w : warnings) log_warn(w);
  return ref;
}
}  // namespace

// Resume (a committed checkpoint in <output.dir>/checkpoints: weights, Adam moments and
// the step) takes precedence over model.init (random, hf:DIR, or ckpt:DIR = the weights of
// another run's checkpoint, e.g. the previous stage, with a fresh optimizer).
void Trainer::load_weights() {
  const auto& units = model_->layout().units();
  auto read = [&](const ckpt::CheckpointReader& r, const std::string& kind, std::vector<ops::Buffer>& bufs) {
    if (&bufs != &master_ && zero3_moment_shards()) {  // ZeRO-3 on CUDA: only this rank's shard of each unit
      for (size_t u = 0; u < units.size(); ++u) {
        const std::string name = kind + "/" + units[u].name;
        EASYCTX_CHECK_INPUT(r.numel(name) == units[u].numel, r.path(), ": ", name, " has ", r.numel(name),
                            " elements, this model needs ", units[u].numel, " (different model config?)");
        const int64_t valid = shard_valid(u);
        if (valid <= 0) continue;
        if (host_resident(bufs)) {  // offload_optimizer: straight into the host shard
          r.read(name, shard_lo(u), valid, bufs[u].flat().ptr<float>());
          continue;
        }
        std::vector<float> part(static_cast<size_t>(valid));
        r.read(name, shard_lo(u), valid, part.data());
        be_->copy(bufs[u].flat().slice_flat(0, {valid}), ops::Tensor(part.data(), DType::F32, {valid}));
        be_->synchronize();  // `part` goes away
      }
      return;
    }
    std::vector<std::vector<float>> stage;
    const std::vector<ops::Tensor> hv = host_views(bufs, stage, false);
    for (size_t u = 0; u < units.size(); ++u) {
      const std::string name = kind + "/" + units[u].name;
      EASYCTX_CHECK_INPUT(r.numel(name) == units[u].numel, r.path(), ": ", name, " has ", r.numel(name),
                          " elements, this model needs ", units[u].numel, " (different model config?)");
      r.read(name, 0, units[u].numel, hv[u].ptr<float>());
    }
    upload(bufs, stage);
  };
  ckpt::CheckpointRef resume;
  if (opts_.resume == "auto") {
    resume = find_checkpoint(cfg_.output.dir);
  } else if (opts_.resume == "none") {
    if (find_checkpoint(cfg_.output.dir).step >= 0)
      log_warn("--resume none: starting from model.init although ", cfg_.output.dir,
               " holds checkpoints; this run's saves will replace them");
  } else {
    resume = find_checkpoint(opts_.resume);
    EASYCTX_CHECK_INPUT(resume.step >= 0, "--resume ", opts_.resume, ": no committed checkpoint there");
  }
  if (resume.step >= 0) {
    const ckpt::CheckpointReader r(resume.path);
    read(r, "master", master_);
    read(r, "adam_m", adam_m_);
    read(r, "adam_v", adam_v_);
    start_step_ = r.meta().at("next_step").as_int();
    const Json rank0 = r.rank_meta(0);
    if (const Json* d = rank0.find("data")) resumed_data_state_ = d->dump();
    log_info("resuming from ", resume.path, " at step ", start_step_);
    return;
  }
  std::vector<std::vector<float>> stage;
  if (starts_with(cfg_.model.init, "hf:")) {
    ckpt::load_hf_weights(cfg_.model.init.substr(3), model_->layout(), host_views(master_, stage, false));
    upload(master_, stage);
  } else if (starts_with(cfg_.model.init, "ckpt:")) {
    const ckpt::CheckpointRef ref = find_checkpoint(cfg_.model.init.substr(5));
    EASYCTX_CHECK_INPUT(ref.step >= 0, "model.init: ", cfg_.model.init, ": no committed checkpoint there");
    const ckpt::CheckpointReader r(ref.path);
    read(r, "master", master_);
    if (cfg_.model.carry_optimizer) {
      EASYCTX_CHECK_INPUT(!(r.meta().find("weights_only") && r.meta().at("weights_only").as_bool()),
                          "model.carry_optimizer: ", ref.path, " holds weights only (made by easyctx_convert)");
      read(r, "adam_m", adam_m_);
      read(r, "adam_v", adam_v_);
    }
    log_info("initial weights", cfg_.model.carry_optimizer ? " and Adam moments" : "", " from ", ref.path);
  } else {
    model::init_random(model_->layout(), host_views(master_, stage, false), cfg_.model.init_std, cfg_.train.seed);
    upload(master_, stage);
  }
}

std::vector<ops::Tensor> Trainer::host_views(const std::vector<ops::Buffer>& bufs,
                                             std::vector<std::vector<float>>& stage, bool fetch) const {
  std::vector<ops::Tensor> v;
  if (host_resident(bufs)) {
    for (const ops::Buffer& b : bufs) v.push_back(b.flat());
    return v;
  }
  stage.assign(bufs.size(), {});
  for (size_t u = 0; u < bufs.size(); ++u) {
    stage[u].resize(static_cast<size_t>(bufs[u].numel()));
    v.emplace_back(stage[u].data(), DType::F32, std::initializer_list<int64_t>{bufs[u].numel()});
    if (fetch) be_->copy(v.back(), bufs[u].flat());
  }
  return v;
}

bool Trainer::host_resident(const std::vector<ops::Buffer>& bufs) {
  return bufs.empty() || bufs.front().flat().space == ops::MemSpace::Host;
}

void Trainer::upload(std::vector<ops::Buffer>& bufs, const std::vector<std::vector<float>>& stage) {
  if (host_resident(bufs)) return;
  EASYCTX_CHECK(stage.size() == bufs.size(), "Trainer::upload: ", stage.size(), " staged units for ", bufs.size());
  for (size_t u = 0; u < bufs.size(); ++u) {
    const ops::Tensor src(const_cast<float*>(stage[u].data()), DType::F32, {bufs[u].numel()});
    be_->copy(bufs[u].flat(), src);
  }
  be_->synchronize();  // the staged host memory goes away after this
}

int64_t Trainer::shard_len(size_t u) const {
  const int64_t n = model_->layout().units()[u].numel, Z = zero_->size();
  return (n + Z - 1) / Z;
}
int64_t Trainer::shard_lo(size_t u) const { return std::min(model_->layout().units()[u].numel, zero_->rank() * shard_len(u)); }
int64_t Trainer::shard_valid(size_t u) const {
  return std::min(model_->layout().units()[u].numel - shard_lo(u), shard_len(u));
}

// Full master/Adam buffers (as loaded) -> this rank's shards, unit by unit; then the
// buffers of the per-layer path. The allocation order is what plan::zero3_init_peak replays.
void Trainer::shard_optimizer_state() {
  const size_t U = master_.size();
  const int64_t Z = zero_->size();
  const DType wt = model_->dtype();  // what the model computes with: bf16 on CUDA, f32 on the CPU
  ops::Backend& state_be = host_be_ ? *host_be_ : *be_;  // offload_optimizer: the shards stay on the host
  for (size_t u = 0; u < U; ++u) {
    const int64_t len = shard_len(u), lo = shard_lo(u), valid = shard_valid(u);
    auto slice = [&](const ops::Buffer& full) {
      ops::Buffer b = state_be.alloc(DType::F32, len);  // zero-filled: the padding stays 0
      if (valid > 0) state_be.copy(b.flat().slice_flat(0, {valid}), full.flat().slice_flat(lo, {valid}));
      return b;
    };
    master_[u] = slice(master_[u]);
    if (!zero3_moment_shards()) {  // (on CUDA the moments are shards already)
      adam_m_[u] = slice(adam_m_[u]);
      adam_v_[u] = slice(adam_v_[u]);
    }
    gshard_.push_back(be_->alloc(DType::F32, len));
    if (on_device())  // (offload_params: pinned host memory, written by the host AdamW)
      wshard_.push_back(offload_params() ? be_->alloc_host_pinned(DType::BF16, len) : be_->alloc(DType::BF16, len));
    if (layer_unit(u)) {
      full_.emplace_back();
      continue;
    }
    full_.push_back(be_->alloc(wt, len * Z));
    grads_[u] = be_->alloc(DType::F32, len * Z);  // the model accumulates the whole unit; padded for the scatter
  }
  if (on_device()) be_->synchronize();  // the host buffers the shards came from go away
  const int64_t L = model_->config().num_layers;
  if (L > 0) {
    const size_t u1 = model_->layout().layer_unit(0);  // every layer unit has the same size
    const int64_t len = shard_len(u1);
    for (int64_t i = 0; i <= cfg_.parallel.zero.prefetch; ++i) pool_.push_back(be_->alloc(wt, len * Z));
    for (int k = 0; k < (on_device() ? 2 : 1); ++k) {  // CUDA: two, the reduce-scatter of one overlapping
      layer_grad_.push_back(be_->alloc(DType::F32, len * Z));
      grad_part_.push_back(be_->alloc(DType::F32, len));
    }
  }
  zparams_ = std::make_unique<Zero3Params>(*this);
#ifdef EASYCTX_HAVE_CUDA
  if (zero_stream_set_) gs_ = std::make_unique<GatherStream>(pool_.size());
#endif
}

void Trainer::gather_unit(size_t u, const ops::Buffer& dst) {
  const int64_t len = shard_len(u), Z = zero_->size();
  EASYCTX_CHECK(dst.numel() >= len * Z && dst.dtype() == model_->dtype(), "gather_unit: destination too small");
  if (!on_device()) {  // f32: the master shard is the parameter
    zero_->all_gather(master_[u].flat().ptr<float>(), static_cast<float*>(dst.data()), static_cast<size_t>(len));
    return;
  }
  if (zero_->memspace() == dist::MemSpace::Device) {  // NCCL, on the comm's stream (compute or GatherStream)
#ifdef EASYCTX_HAVE_CUDA
    if (offload_params()) {  // the host shard into its own block on that stream, then an in-place gather
      char* block = static_cast<char*>(dst.data()) + 2 * zero_->rank() * len;
      be_->copy_on(gs_ ? *gs_->queue : be_->queue(), ops::Tensor(block, DType::BF16, {len}, ops::MemSpace::Device),
                   wshard_[u].flat());
      zero_->all_gather(block, dst.data(), static_cast<size_t>(len), dist::DType::BF16);
      return;
    }
#endif
    zero_->all_gather(wshard_[u].data(), dst.data(), static_cast<size_t>(len), dist::DType::BF16);
    return;
  }
  // A host communicator: the bf16 shard through host memory (16-bit words).
  std::vector<uint16_t> mine, all(static_cast<size_t>(len * Z));
  const void* send = wshard_[u].data();  // (offload_params: already in host memory)
  if (!offload_params()) {
    mine.resize(static_cast<size_t>(len));
    be_->copy(ops::Tensor(mine.data(), DType::BF16, {len}), wshard_[u].flat());
    send = mine.data();
  }
  zero_->all_gather(send, all.data(), static_cast<size_t>(len), dist::DType::BF16);
  be_->copy(dst.flat().slice_flat(0, {len * Z}), ops::Tensor(all.data(), DType::BF16, {len * Z}));
  be_->synchronize();  // `all` goes away
}

// Layer unit u into pool slot s: on the gather stream after the slot's last use and the
// latest shards (GatherStream), else as gather_unit.
void Trainer::gather_layer(size_t u, size_t s) {
#ifdef EASYCTX_HAVE_CUDA
  if (gs_) {
    EASYCTX_CUDA_CHECK(cudaStreamWaitEvent(gs_->stream, gs_->free[s], 0));
    EASYCTX_CUDA_CHECK(cudaStreamWaitEvent(gs_->stream, gs_->shards, 0));
    {
      const GatherStream::On on(*gs_, {zero_}, &be_->queue());
      gather_unit(u, pool_[s]);
    }
    EASYCTX_CUDA_CHECK(cudaEventRecord(gs_->ready[s], gs_->stream));
    return;
  }
#endif
  gather_unit(u, pool_[s]);
}

// out (f32[shard_len(u)]) = this rank's block of the sum of `full` over the shard group and
// the replicas.
namespace {
void reduce_into(dist::Comm& zero, dist::Comm* replica, ops::Backend& be, bool on_device, const ops::Buffer& full,
                 const ops::Tensor& out, int64_t len) {
  const int64_t Z = zero.size();
  if (!on_device || zero.memspace() == dist::MemSpace::Device) {  // host buffers over MPI, or NCCL on the stream
    zero.reduce_scatter(static_cast<const float*>(full.data()), out.ptr<float>(), static_cast<size_t>(len));
    if (replica) replica->all_reduce(out.ptr<float>(), static_cast<size_t>(len));
    return;
  }
  std::vector<float> all(static_cast<size_t>(len * Z)), mine(static_cast<size_t>(len));
  be.copy(ops::Tensor(all.data(), DType::F32, {len * Z}), full.flat().slice_flat(0, {len * Z}));
  zero.reduce_scatter(all.data(), mine.data(), static_cast<size_t>(len));
  if (replica) replica->all_reduce(mine.data(), static_cast<size_t>(len));
  be.copy(out, ops::Tensor(mine.data(), DType::F32, {len}));
  be.synchronize();  // `mine` goes away
}
}  // namespace

void Trainer::scatter_grad(size_t u, size_t k) {
  const int64_t len = shard_len(u);
  const ops::Tensor part = grad_part_[k].flat().slice_flat(0, {len});
#ifdef EASYCTX_HAVE_CUDA
  if (gs_) {  // on the gather stream after the layer's backward; finish_scatter adds it into the shard
    const cudaStream_t compute = ops::cuda_stream(*be_);
    EASYCTX_CUDA_CHECK(cudaEventRecord(gs_->grad_ready[k], compute));
    EASYCTX_CUDA_CHECK(cudaStreamWaitEvent(gs_->stream, gs_->grad_ready[k], 0));
    {
      const GatherStream::On on(*gs_, {zero_, zero_replica_}, &be_->queue());
      reduce_into(*zero_, zero_replica_, *be_, true, layer_grad_[k], part, len);
    }
    EASYCTX_CUDA_CHECK(cudaEventRecord(gs_->scattered[k], gs_->stream));
    scatter_unit_[k] = u;
    return;
  }
#endif
  reduce_into(*zero_, zero_replica_, *be_, on_device(), layer_grad_[k], part, len);
  be_->axpy(gshard_[u].flat(), part, 1.0);  // micro-batches accumulate in the shard
}

// The compute stream after the reduce-scatter of layer-gradient buffer k (if one is in
// flight): its result added into its unit's shard; the buffer may be written again.
void Trainer::finish_scatter(size_t k) {
  const size_t u = scatter_unit_[k];
  if (u == kNoUnit) return;
#ifdef EASYCTX_HAVE_CUDA
  EASYCTX_CUDA_CHECK(cudaStreamWaitEvent(ops::cuda_stream(*be_), gs_->scattered[k], 0));
#endif
  be_->axpy(gshard_[u].flat(), grad_part_[k].flat().slice_flat(0, {shard_len(u)}), 1.0);
  scatter_unit_[k] = kNoUnit;
}

std::vector<float> Trainer::gather_master_host(size_t u) const {
  const int64_t len = shard_len(u), Z = zero_->size();
  std::vector<float> out(static_cast<size_t>(len * Z));
  if (!on_device()) {
    zero_->all_gather(master_[u].flat().ptr<float>(), out.data(), static_cast<size_t>(len));
  } else if (zero_->memspace() == dist::MemSpace::Device) {
    const ops::Buffer tmp = be_->alloc(DType::F32, len * Z);
    const float* mine = master_[u].flat().ptr<float>();
    if (host_resident(master_)) {  // offload_optimizer: the shard into its own block first (in-place gather)
      const ops::Tensor block = tmp.flat().slice_flat(zero_->rank() * len, {len});
      be_->copy(block, master_[u].flat());
      mine = block.ptr<float>();
    }
    zero_->all_gather(mine, tmp.flat().ptr<float>(), static_cast<size_t>(len));
    be_->copy(ops::Tensor(out.data(), DType::F32, {len * Z}), tmp.flat());
    be_->synchronize();  // tmp goes away
  } else {
    std::vector<float> mine(static_cast<size_t>(len));
    be_->copy(ops::Tensor(mine.data(), DType::F32, {len}), master_[u].flat());
    zero_->all_gather(mine.data(), out.data(), static_cast<size_t>(len));
  }
  out.resize(static_cast<size_t>(model_->layout().units()[u].numel));
  return out;
}

void Trainer::refresh_working_copy() {
  // CUDA: the bf16 working parameters (ZeRO-3: this rank's shards) from the master weights.
  std::vector<ops::Buffer>& work = zero3() ? wshard_ : work_;
  if (host_be_) {  // host master -> bf16 on the host -> device (no device-side f32 staging)
#ifdef EASYCTX_HAVE_CUDA
    std::vector<uint16_t> bits;
    for (size_t u = 0; u < work.size(); ++u) {
      if (offload_params()) {  // the bf16 shard is host memory: converted in place
        f32_to_bf16(master_[u].flat().ptr<float>(), static_cast<uint16_t*>(work[u].data()), master_[u].numel());
        continue;
      }
      bits.resize(static_cast<size_t>(master_[u].numel()));
      f32_to_bf16(master_[u].flat().ptr<float>(), bits.data(), master_[u].numel());
      be_->copy(work[u].flat(), ops::Tensor(bits.data(), DType::BF16, {master_[u].numel()}));
      be_->synchronize();  // `bits` is reused
    }
#endif
  } else {
    for (size_t u = 0; u < work.size(); ++u) be_->copy(work[u].flat(), master_[u].flat());
  }
  if (zero3()) regather();
}

// ZeRO-3 after the shards changed: the embedding and head gathered for the step, the layers
// when the model acquires them.
void Trainer::regather() {
  for (size_t u = 0; u < master_.size(); ++u)
    if (!layer_unit(u)) gather_unit(u, full_[u]);
  zparams_->invalidate();
#ifdef EASYCTX_HAVE_CUDA
  if (gs_) EASYCTX_CUDA_CHECK(cudaEventRecord(gs_->shards, ops::cuda_stream(*be_)));
#endif
}

void Trainer::settle_optimizer() const {
#ifdef EASYCTX_HAVE_CUDA
  if (host_adamw_) host_adamw_->finish();
#endif
}

void Trainer::await_unit(size_t u) {
#ifdef EASYCTX_HAVE_CUDA
  if (cudaEvent_t ev = host_adamw_->wait_unit(u)) {  // (null once finished: its copies are done)
    EASYCTX_CUDA_CHECK(cudaStreamWaitEvent(ops::cuda_stream(*be_), ev, 0));
    if (gs_) EASYCTX_CUDA_CHECK(cudaStreamWaitEvent(gs_->stream, ev, 0));  // ZeRO-3: its gathers read the shard
  }
#endif
  if (grads_[u].numel() > 0) be_->fill(grads_[u].flat(), 0.0);  // after the host has read it
}

// ZeRO-3 with the previous step's host AdamW deferred: await_unit, then the unit's gradient
// shard zeroed and the embedding or head gathered.
void Trainer::z3_ready(size_t u) {
  if (u >= z3_pending_.size() || !z3_pending_[u]) return;
  await_unit(u);
  be_->fill(gshard_[u].flat(), 0.0);
  if (!layer_unit(u)) gather_unit(u, full_[u]);
  z3_pending_[u] = false;
}

// The first micro-batch's ParamSource while the previous step's host AdamW still runs: each
// unit is awaited when the forward first reaches it (units are acquired in forward order:
// embedding, layers, head, so the update of later units overlaps the forward of earlier ones).
class Trainer::PendingUpdate final : public model::VectorParamSource {
 public:
  PendingUpdate(Trainer& t, const std::vector<ops::Tensor>& params, const std::vector<ops::Tensor>& grads)
      : VectorParamSource(params, grads), t_(t), ready_(params.size(), false) {}
  ops::Tensor acquire(size_t u) override {
    ready(u);
    return VectorParamSource::acquire(u);
  }
  ops::Tensor grad(size_t u) override {
    ready(u);
    return VectorParamSource::grad(u);
  }
  void ready(size_t u) {
    if (ready_.at(u)) return;
    t_.await_unit(u);
    ready_[u] = true;
  }

 private:
  Trainer& t_;
  std::vector<bool> ready_;
};

std::vector<ops::Tensor> Trainer::params() const {
  EASYCTX_CHECK(!zero3(), "params: ZeRO-3 gathers the parameters per layer (Zero3Params)");
  if (work_.empty()) return master();
  std::vector<ops::Tensor> v;
  for (const ops::Buffer& b : work_) v.push_back(b.flat());
  return v;
}

std::vector<std::vector<float>> Trainer::master_host() const {
  settle_optimizer();
  std::vector<std::vector<float>> out(master_.size());
  if (zero3()) {  // collective: every unit gathered from its owners' shards
    for (size_t u = 0; u < master_.size(); ++u) out[u] = gather_master_host(u);
    return out;
  }
  for (size_t u = 0; u < master_.size(); ++u) {
    out[u].resize(static_cast<size_t>(master_[u].numel()));
    if (host_resident(master_)) std::memcpy(out[u].data(), master_[u].data(), master_[u].bytes());
    else be_->copy(ops::Tensor(out[u].data(), DType::F32, {master_[u].numel()}), master_[u].flat());
  }
  return out;
}

std::vector<std::vector<float>> Trainer::gradients_host() const {
  EASYCTX_CHECK(!zero3(), "gradients_host: with ZeRO-3 each rank holds only its shard of the reduced gradients");
  std::vector<std::vector<float>> out(grads_.size());
  for (size_t u = 0; u < grads_.size(); ++u) {
    out[u].resize(static_cast<size_t>(grads_[u].numel()));
    be_->copy(ops::Tensor(out[u].data(), DType::F32, {grads_[u].numel()}), grads_[u].flat());
  }
  return out;
}

double Trainer::flops_per_token() const {
  const model::LlamaConfig& c = model_->config();
  const double d = static_cast<double>(c.hidden_size), L = static_cast<double>(c.num_layers);
  const double per_layer = d * static_cast<double>(2 * c.q_dim() + 2 * c.kv_dim()) +
                           3.0 * d * static_cast<double>(c.intermediate_size);
  const double n_matmul = L * per_layer + static_cast<double>(c.vocab_size) * d;  // + LM head
  return 6.0 * n_matmul + 6.0 * L * d * static_cast<double>(cfg_.data.seq_length);
}

void Trainer::save_checkpoint(int64_t steps_done) {
  settle_optimizer();
  ckpt::CheckpointWriter w(world_mpi_, (fs::path(cfg_.output.dir) / "checkpoints").string(), steps_done);
  const auto& units = model_->layout().units();
  // ZeRO-0: every rank holds everything; each writes its 1/W of every unit, in parallel.
  const int64_t W = world_.size(), r = world_.rank();
  // Device-resident state is staged on the host, only the slices this rank writes (alive
  // until commit); host-resident state (CPU backend, offload_optimizer) is written in place.
  const bool direct = host_resident(master_);
  std::deque<std::vector<float>> stage;  // (a deque: earlier slices never move)
  auto slice = [&](const std::vector<ops::Buffer>& bufs, size_t u, int64_t lo, int64_t len) -> const float* {
    if (direct) return bufs[u].flat().ptr<float>() + lo;
    stage.emplace_back(static_cast<size_t>(len));
    be_->copy(ops::Tensor(stage.back().data(), DType::F32, {len}), bufs[u].flat().slice_flat(lo, {len}));
    return stage.back().data();
  };
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t n = units[u].numel;
    if (zero3()) {  // each shard once: the first replica of it writes
      if (zero_replica_ && zero_replica_->rank() != 0) continue;
      const int64_t lo = shard_lo(u), len = shard_valid(u);
      w.add("master/" + units[u].name, n, lo, slice(master_, u, 0, len), len);
      w.add("adam_m/" + units[u].name, n, lo, slice(adam_m_, u, 0, len), len);
      w.add("adam_v/" + units[u].name, n, lo, slice(adam_v_, u, 0, len), len);
      continue;
    }
    const int64_t lo = n * r / W, hi = n * (r + 1) / W;
    w.add("master/" + units[u].name, n, lo, slice(master_, u, lo, hi - lo), hi - lo);
    w.add("adam_m/" + units[u].name, n, lo, slice(adam_m_, u, lo, hi - lo), hi - lo);
    w.add("adam_v/" + units[u].name, n, lo, slice(adam_v_, u, lo, hi - lo), hi - lo);
  }
  // Per rank: the data cursor (sampling is a pure function of seed and step, so it is the
  // step plus what must not change) and the RNG state (none is drawn after initialisation).
  data::LoaderState ls = loader_->state();
  ls.next_step = steps_done;
  ls.next_micro = 0;
  Json rank_meta = Json::object();
  rank_meta.set("data", parse_json(ls.to_json(), "loader state"));
  rank_meta.set("rng", "none: initialisation and data order are pure functions of (train.seed, step)");
  w.set_rank_meta(rank_meta);
  Json meta = Json::object();
  meta.set("next_step", steps_done);
  meta.set("tokens_seen", static_cast<int64_t>(ls.global_batch) * cfg_.data.seq_length * steps_done);
  Json layout = Json::object();
  layout.set("world", world_.size());
  layout.set("data_parallel", dp_.size());
  layout.set("sequence_parallel", world_.size() / dp_.size());
  layout.set("sequence_mode", to_string(cfg_.parallel.sequence.mode));
  layout.set("zero_stage", cfg_.parallel.zero.stage);
  layout.set("zero_group", zero3() ? zero_->size() : 1);
  meta.set("layout", layout);
  meta.set("model", model_->config().to_hf_json());
  meta.set("config", dump_stage_config(cfg_));
  const std::string dir = w.commit(meta, cfg_.output.keep_last);
  log_info("checkpoint ", dir);
}

std::vector<ops::Tensor> Trainer::master() const {
  EASYCTX_CHECK(!zero3(), "master: with ZeRO-3 each rank holds only its shards; master_host() gathers them");
  settle_optimizer();
  std::vector<ops::Tensor> v;
  for (const ops::Buffer& b : master_) v.push_back(b.flat());
  return v;
}

void Trainer::reduce_gradients() {
  if (zero3()) {
    // Sum over the shard group straight into each owner's shard, then across replicas
    // (per-node sharding); together they span every rank that computed a partial gradient.
    // The layers were reduced right after their backward (Zero3Params::grad_done); the
    // embedding and head accumulated over every micro-batch and are reduced now.
    for (size_t u = 0; u < grads_.size(); ++u)
      if (!layer_unit(u)) reduce_into(*zero_, zero_replica_, *be_, on_device(), grads_[u], gshard_[u].flat(), shard_len(u));
    return;
  }
  // ZeRO-0: sum over the ranks that computed partial gradients (data-parallel replicas,
  // and the sequence-parallel slices when present); the 1/global-labels scale is already in.
  if (grad_comm_.size() == 1) return;
  if (!on_device()) {
    for (ops::Buffer& g : grads_) grad_comm_.all_reduce(g.flat().ptr<float>(), static_cast<size_t>(g.numel()));
    return;
  }
  if (grad_comm_.memspace() == dist::MemSpace::Device) {  // NCCL on the device buffers
    be_->synchronize();  // the backward is queued on the backend's stream, NCCL runs on its own
    for (ops::Buffer& g : grads_) grad_comm_.all_reduce(g.flat().ptr<float>(), static_cast<size_t>(g.numel()));
    grad_comm_.synchronize();
    return;
  }
  std::vector<std::vector<float>> stage;  // device gradients over a host communicator
  const std::vector<ops::Tensor> hv = host_views(grads_, stage, true);
  for (const ops::Tensor& g : hv) grad_comm_.all_reduce(g.ptr<float>(), static_cast<size_t>(g.numel()));
  upload(grads_, stage);
}

double clip_by_global_norm(ops::Backend& be, const std::vector<ops::Tensor>& grads, double max_norm) {
  double ss = 0;
  for (const ops::Tensor& g : grads) ss += be.sum_squares(g);
  const double norm = std::sqrt(ss);
  const double coef = max_norm / (norm + 1e-6);
  if (max_norm > 0 && coef < 1.0)
    for (const ops::Tensor& g : grads) be.scale(g, coef);
  return norm;
}

double Trainer::clip_gradients() {
  std::vector<ops::Tensor> g;
  if (zero3()) {  // global norm over all shards (padding is zero)
    double ss = 0;
    for (const ops::Buffer& b : gshard_) ss += be_->sum_squares(b.flat());
    const double norm = std::sqrt(zero_->all_reduce_scalar(ss, dist::ReduceOp::Sum));
    const double coef = cfg_.train.grad_clip / (norm + 1e-6);
    if (cfg_.train.grad_clip > 0 && coef < 1.0)
      for (const ops::Buffer& b : gshard_) be_->scale(b.flat(), coef);
    return norm;
  }
  for (const ops::Buffer& b : grads_) g.push_back(b.flat());
  return clip_by_global_norm(*be_, g, cfg_.train.grad_clip);
}

void Trainer::optimizer_step(double lr, int64_t step, bool defer) {
  (void)defer;  // (only the CUDA build's host AdamW defers)
  ops::AdamWStep s{lr, cfg_.train.beta1, cfg_.train.beta2, cfg_.train.eps, 0.0, step + 1};
  const auto& units = model_->layout().units();
  // The part of tensor t of unit u this rank updates, [a, e) of the unit at offset a - base of
  // its buffers: all of it, or (ZeRO-3) its overlap with the shard (empty: a >= e).
  struct Part {
    int64_t a, e, base;
  };
  auto part_of = [&](size_t u, const model::ParamTensor& t) {
    Part p{t.offset, t.offset + t.numel, 0};
    if (zero3()) {
      p.a = std::max(p.a, shard_lo(u));
      p.e = std::min(p.e, shard_lo(u) + shard_valid(u));
      p.base = shard_lo(u);
    }
    return p;
  };
  const std::vector<ops::Buffer>& g = zero3() ? gshard_ : grads_;
#ifdef EASYCTX_HAVE_CUDA
  if (host_adamw_) {  // offload_optimizer: every tensor of every unit (shard) through the host pipeline
    const std::vector<ops::Buffer>& work = zero3() ? wshard_ : work_;
    std::vector<OffloadPiece> pieces;
    for (size_t u = 0; u < units.size(); ++u)
      for (const model::ParamTensor& t : units[u].tensors) {
        const Part q = part_of(u, t);
        if (q.a >= q.e) continue;
        const int64_t off = q.a - q.base;
        OffloadPiece p;
        p.master = master_[u].flat().ptr<float>() + off;
        p.m = adam_m_[u].flat().ptr<float>() + off;
        p.v = adam_v_[u].flat().ptr<float>() + off;
        p.grad_dev = g[u].flat().ptr<float>() + off;
        if (offload_params())
          p.work_host = static_cast<uint16_t*>(work[u].data()) + off;
        else
          p.work_dev = static_cast<uint16_t*>(work[u].data()) + off;
        p.n = q.e - q.a;
        p.weight_decay = t.decay ? cfg_.train.weight_decay : 0.0;
        p.unit = u;
        pieces.push_back(p);
      }
    be_->synchronize();  // the gradients are final (backward, reduction and clipping queued on it)
    // offload_params: the host writes the bf16 shards the gathers copy from (all consumed by now)
    if (gs_) EASYCTX_CUDA_CHECK(cudaStreamSynchronize(gs_->stream));
    if (defer) {  // one core left to the next step's kernel launches
      host_adamw_->start(std::move(pieces), s, std::max(1, omp_get_max_threads() - 1));
      if (zero3()) {  // every unit gathered again, each after its shard's upload (z3_ready)
        zparams_->invalidate();
        z3_pending_.assign(units.size(), true);
      }
      return;
    }
    host_adamw_->step(pieces, s);
    if (zero3()) regather();
    return;
  }
#endif
  for (size_t u = 0; u < units.size(); ++u)
    for (const model::ParamTensor& t : units[u].tensors) {
      s.weight_decay = t.decay ? cfg_.train.weight_decay : 0.0;  // matrices only, not norm gains
      const Part q = part_of(u, t);
      if (q.a >= q.e) continue;
      auto part = [&](const ops::Buffer& b) { return b.flat().slice_flat(q.a - q.base, {q.e - q.a}); };
      be_->adamw(part(master_[u]), part(g[u]), part(adam_m_[u]), part(adam_v_[u]), s);
    }
  refresh_working_copy();
}

ops::MemoryStats Trainer::memory_stats() const { return be_->memory_stats(); }

std::vector<ops::Tensor> Trainer::gradients() const {
  EASYCTX_CHECK(!zero3(), "gradients: with ZeRO-3 each rank holds only its shard of the reduced gradients");
  std::vector<ops::Tensor> v;
  for (const ops::Buffer& b : grads_) v.push_back(b.flat());
  return v;
}

StepStats Trainer::train_step(int64_t step) {
  const auto t0 = Clock::now();
  phase_t_ = t0;
  StepStats st = compute_gradients(step);
  be_->synchronize();  // (a device backend: the gradients are final; no cost worth naming)
  st.fwd_bwd_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  st.grad_norm = clip_gradients();
  phase("clip");
  // The host AdamW overlaps the next step's forward when this run has a next step (the step
  // time then counts the wait for it there, so each step line is the steady-state time), and
  // not while profiling (its phase would vanish into the forward).
  optimizer_step(st.lr, step, step + 1 < cfg_.train.steps && !(prof_ && prof_->enabled()));
  be_->synchronize();  // device backends: the step is done when its queued work is
  phase("optimizer");
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (prof_ && prof_->enabled()) {
    prof_->collect();
    ++profiled_steps_;
    profiled_ms_ += 1e3 * st.seconds;
  }
  return st;
}

void Trainer::phase(const char* name) {
  if (!prof_ || !prof_->enabled()) return;
  be_->synchronize();
  const double ms = ms_since(phase_t_);
  phase_t_ = Clock::now();
  for (auto& [n, t] : phase_ms_)
    if (n == name) {
      t += ms;
      return;
    }
  phase_ms_.emplace_back(name, ms);
}

// The profile of the timed steps (rank 0's): the step's phases by wall time, then the
// backend's ops by device time, per step; also <output.dir>/profile.json.
void Trainer::report_profile() const {
  if (!prof_ || profiled_steps_ == 0 || world_.rank() != 0) return;
  const double n = static_cast<double>(profiled_steps_);
  std::string ph;
  for (const auto& [name, ms] : phase_ms_) ph += " | " + name + " " + format_fixed(ms / n, 1);
  log_info("profile over ", profiled_steps_, " step(s) (the first left out unless it was the only one; ms per "
           "step, the backend synchronized between phases): step ", format_fixed(profiled_ms_ / n, 1), ph);
  const std::vector<ops::OpProfileRow> rows = prof_->rows();
  const double ops_ms = prof_->total_ms();
  log_info("profile: ops of the backend ", format_fixed(ops_ms / n, 1), " ms per step (",
           format_fixed(100.0 * ops_ms / std::max(profiled_ms_, 1e-9), 1),
           "% of the step; the rest is host work, transfers, collectives and launch gaps)");
  // By op name (the key's first word), then the top keys.
  std::vector<std::pair<std::string, ops::OpProfileRow>> fam;
  for (const ops::OpProfileRow& r : rows) {
    const std::string op = r.key.substr(0, r.key.find(' '));
    auto it = std::find_if(fam.begin(), fam.end(), [&](const auto& f) { return f.first == op; });
    if (it == fam.end()) it = fam.insert(fam.end(), {op, ops::OpProfileRow{op}});
    it->second.calls += r.calls;
    it->second.ms += r.ms;
    it->second.flops += r.flops;
  }
  std::stable_sort(fam.begin(), fam.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  auto line = [&](const ops::OpProfileRow& r) {
    char buf[320];
    const double tf = r.flops > 0 && r.ms > 0 ? r.flops / (r.ms * 1e-3) / 1e12 : 0;
    std::snprintf(buf, sizeof(buf), "%10.1f %6.1f%% %9.1f %8s  %s", r.ms / n, 100.0 * r.ms / std::max(ops_ms, 1e-9),
                  static_cast<double>(r.calls) / n, tf > 0 ? format_fixed(tf, tf >= 10 ? 0 : 3).c_str() : "-", r.key.c_str());
    return std::string(buf);
  };
  log_info("profile by op:   ms/step  %ops calls/step  TFLOP/s  op");
  for (const auto& f : fam) log_info("  ", line(f.second));
  log_info("profile by op and shape (top 40):");
  for (size_t i = 0; i < rows.size() && i < 40; ++i) log_info("  ", line(rows[i]));
  Json j = Json::object();
  j.set("steps", profiled_steps_);
  j.set("step_ms", profiled_ms_ / n);
  Json jp = Json::object();
  for (const auto& [name, ms] : phase_ms_) jp.set(name, ms / n);
  j.set("phases_ms", jp);
  j.set("ops_ms", ops_ms / n);
  Json jr = Json::array();
  for (const ops::OpProfileRow& r : rows) {
    Json o = Json::object();
    o.set("op", r.key);
    o.set("calls", static_cast<double>(r.calls) / n);
    o.set("ms", r.ms / n);
    if (r.flops > 0) o.set("tflops", r.flops / (r.ms * 1e-3) / 1e12);
    jr.push_back(o);
  }
  j.set("ops", jr);
  const std::string path = (fs::path(cfg_.output.dir) / "profile.json").string();
  write_file_atomic(path, j.dump() + "\n");
  log_info("profile written to ", path);
}

StepStats Trainer::compute_gradients(int64_t step) {
  StepStats st;
  st.step = step;
  st.lr = lr_at(cfg_.train, step);
  // Data first: the loss denominator is the global count of labelled tokens.
  std::vector<data::MicroBatch> micro;
  double local_labels = 0;
  for (int64_t m = 0; m < cfg_.train.grad_accum; ++m) {
    micro.push_back(loader_->micro_batch(step, m));
    local_labels += static_cast<double>(micro.back().real_labels);
  }
  const double global_labels = world_.all_reduce_scalar(local_labels, dist::ReduceOp::Sum);
  EASYCTX_CHECK(global_labels > 0, "step ", step, ": the global batch has no labelled tokens");
  phase("data");
  // The previous step's host AdamW may still be reading the gradients: then each unit's is
  // zeroed once the forward has waited for that unit (PendingUpdate).
#ifdef EASYCTX_HAVE_CUDA
  const bool pending = host_adamw_ && host_adamw_->pending();
#else
  const bool pending = false;
#endif
  // ZeRO-3: the same per unit, its shards gathered once uploaded (z3_ready); also when a
  // checkpoint settled the update in between (then nothing is waited for).
  const bool z3_deferred = !z3_pending_.empty();
  if (!pending && !z3_deferred)
    for (ops::Buffer& g : grads_)
      if (g.numel() > 0) be_->fill(g.flat(), 0.0);
  if (!z3_deferred)
    for (ops::Buffer& g : gshard_) be_->fill(g.flat(), 0.0);  // ZeRO-3: the layers add into it per micro-batch
  std::vector<ops::Tensor> params, grads;
  if (!zero3()) {
    params = this->params();
    for (const ops::Buffer& g : grads_) grads.push_back(g.flat());
  }
  double sum_nll = 0;
  for (data::MicroBatch& mb : micro) {
    const int64_t n = mb.batch * mb.local_len;
    model::Batch b{ops::Tensor(mb.tokens.data(), DType::I32, {n}), ops::Tensor(mb.positions.data(), DType::I32, {n}),
                   ops::Tensor(mb.labels.data(), DType::I32, {n}), mb.batch, mb.local_len};
    if (on_device()) {  // host int32 arrays -> device buffers (stream-ordered before the model)
      if (tokens_dev_.numel() != n) {
        tokens_dev_ = be_->alloc(DType::I32, n);
        positions_dev_ = be_->alloc(DType::I32, n);
        labels_dev_ = be_->alloc(DType::I32, n);
      }
      be_->copy(tokens_dev_.flat(), b.tokens);
      be_->copy(positions_dev_.flat(), b.positions);
      be_->copy(labels_dev_.flat(), b.labels);
      b.tokens = tokens_dev_.flat();
      b.positions = positions_dev_.flat();
      b.labels = labels_dev_.flat();
    }
    if (zero3()) {
      sum_nll += model_->forward_backward(*zparams_, b, 1.0 / global_labels).sum_nll;
      for (size_t k = 0; k < layer_grad_.size(); ++k) finish_scatter(k);
      for (size_t u = 0; u < z3_pending_.size(); ++u) z3_ready(u);  // (a unit the model never touched)
      z3_pending_.clear();
    } else if (pending && &mb == &micro.front()) {
      PendingUpdate src(*this, params, grads);
      sum_nll += model_->forward_backward(src, b, 1.0 / global_labels).sum_nll;
      for (size_t u = 0; u < grads_.size(); ++u) src.ready(u);  // (a unit the model never touched)
    } else {
      sum_nll += model_->forward_backward(params, grads, b, 1.0 / global_labels).sum_nll;
    }
    st.tokens += n;
  }
  if (pending) settle_optimizer();  // (done by now: the forward waited for every unit)
  phase("forward+backward");
  reduce_gradients();
  st.loss = world_.all_reduce_scalar(sum_nll, dist::ReduceOp::Sum) / global_labels;
  st.tokens = static_cast<int64_t>(world_.all_reduce_scalar(static_cast<double>(st.tokens), dist::ReduceOp::Sum));
  st.labels = static_cast<int64_t>(global_labels);
  phase("gradient reduction");
  return st;
}

void Trainer::log_startup() const {
  const model::LlamaConfig& mc = model_->config();
  log_info("model ", mc.describe());
  const int64_t L = mc.num_layers, K = cfg_.activation.offload_layers;
  const std::string offloaded = cfg_.activation.offload != OffloadTarget::Cpu ? ""
                                : (K > 0 && K < L - 1) ? " (the first " + std::to_string(K) + " of " +
                                                             std::to_string(L - 1) + " offloadable layer inputs "
                                                             "in pinned host memory)"
                                                       : " (offloaded to pinned host memory)";
  const std::string groups = cfg_.activation.attention_head_groups > 1
                                 ? ", attention in " + std::to_string(cfg_.activation.attention_head_groups) +
                                       " head groups"
                                 : "";
  log_info("init ", cfg_.model.init, ", activation.checkpoint ", to_string(cfg_.activation.checkpoint), offloaded,
           groups, ", backend ",
           be_->name(), on_device() ? " (bf16 parameters, fp32 gradients, master weights and Adam)" : " (f32)", ", ",
           world_.size(), " rank(s): data-parallel ", dp_.size(), " x sequence-parallel ",
           world_.size() / dp_.size(),
           world_.size() > dp_.size() ? std::string(" (") + to_string(cfg_.parallel.sequence.mode) + ")" : "");
  if (zero3())
    log_info("ZeRO-3 over ", zero_->size(), " rank(s)", zero_replica_ ? " x " + std::to_string(zero_replica_->size()) +
             " replicas" : std::string(), ": shards of master, Adam", on_device() ? ", bf16 parameters" : "",
             " and gradients; layers gathered per use into a pool of ", 1 + cfg_.parallel.zero.prefetch,
             " (parallel.zero.prefetch ", cfg_.parallel.zero.prefetch, gs_ ? std::string("; gathers and reduce-scatters on a communication stream") :
             "; gathers synchronous over " + std::string(zero_->backend()), "), gradients reduce-scattered per layer",
             host_be_ ? "; the optimizer shards in host memory (AdamW on the host)" : "",
             offload_params() ? "; the bf16 parameter shards in pinned host memory (copied per gather)" : "");
  if (world_.rank() != 0) return;  // the rest only informs the log (and reads data)
  const data::TokenDataset& ds = loader_->dataset();
  const UnigramStats us = unigram_stats(ds);
  log_info("data ", ds.spec(), ": ", format_count(static_cast<double>(ds.num_tokens())), " tokens, ",
           ds.num_docs(), " documents; unigram entropy ", us.entropy_nats, " nats (ppl ",
           std::exp(us.entropy_nats), ") over ", format_count(static_cast<double>(us.tokens)), " tokens, ",
           us.distinct, " distinct ids: a loss below it means the model uses context");
  log_info("global batch ", cfg_.train.batch_size, " x ", cfg_.train.grad_accum, " x ", dp_.size(), " x ",
           cfg_.data.seq_length, " = ",
           format_count(static_cast<double>(cfg_.train.batch_size * cfg_.train.grad_accum * dp_.size() *
                                            cfg_.data.seq_length)),
           " tokens/step, ", cfg_.train.steps, " steps, lr ", cfg_.train.lr, " (", to_string(cfg_.train.schedule),
           ", warmup ", cfg_.train.warmup_steps, ", min ", cfg_.train.min_lr, ")");
}

StepStats Trainer::run() {
  const bool root = world_.rank() == 0;
  if (root) fs::create_directories(cfg_.output.dir);
  log_startup();
  std::unique_ptr<MetricsWriter> metrics;
  if (root && cfg_.logging.metrics)  // a resumed run keeps the records of the steps before it
    metrics = std::make_unique<MetricsWriter>((fs::path(cfg_.output.dir) / "metrics.jsonl").string(),
                                              start_step_ > 0, start_step_ + 1);
  const auto start = Clock::now();
  StepStats st;
  for (int64_t step = start_step_; step < cfg_.train.steps; ++step) {
    if (stop_requested()) {
      save_checkpoint(step);
      log_info("stop requested (signal ", dist::stop_signal(), " on some rank): checkpoint of step ", step,
               " committed; continue with --resume auto");
      stopped_ = true;
      world_.barrier();
      return st;
    }
    // logging.profile: every step but the first this run makes (cuDNN plans, allocations),
    // unless it makes only one.
    if (prof_) prof_->set_enabled(step > start_step_ || cfg_.train.steps - start_step_ == 1);
    st = train_step(step);
    if (cfg_.output.save_every > 0 && (step + 1) % cfg_.output.save_every == 0 && step + 1 < cfg_.train.steps)
      save_checkpoint(step + 1);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const double tps = static_cast<double>(st.tokens) / st.seconds;
#ifdef EASYCTX_HAVE_CUDA
    if (on_device()) {
      peak_mem_bytes_ = std::max(peak_mem_bytes_, device_mem_used());
      st.peak_mem_gib = peak_mem_bytes_ / (1024.0 * 1024.0 * 1024.0);
      // Per GPU: every rank computes its share of the global batch's tokens.
      if (peak_flops_ > 0) st.mfu = tps * flops_per_token() / (peak_flops_ * static_cast<double>(world_.size()));
    }
#endif
    if (metrics) {
      Json r = Json::object();
      r.set("step", step + 1);
      r.set("loss", st.loss);
      r.set("lr", st.lr);
      r.set("grad_norm", st.grad_norm);
      r.set("tokens", st.tokens);
      r.set("tokens_per_s", tps);
      r.set("fwd_bwd_s", st.fwd_bwd_seconds);
      r.set("elapsed", elapsed);
      if (st.mfu >= 0) r.set("mfu", st.mfu);
      if (st.peak_mem_gib >= 0) r.set("peak_mem_gib", st.peak_mem_gib);
      metrics->write(r);
    }
    if ((step + 1) % std::max<int64_t>(1, cfg_.logging.every) == 0 || step + 1 == cfg_.train.steps) {
      const double done = static_cast<double>(step + 1 - start_step_);
      const double eta = elapsed / done * static_cast<double>(cfg_.train.steps - step - 1);
      char line[256];
      std::snprintf(line, sizeof(line), "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | ETA %s",
                    static_cast<long long>(step + 1), static_cast<long long>(cfg_.train.steps), st.loss, st.lr,
                    st.grad_norm, format_count(tps).c_str(), format_duration(eta).c_str());
      std::string extra;
      if (on_device()) {
        char buf[96];
        if (st.mfu >= 0) std::snprintf(buf, sizeof(buf), " | MFU %.2f%%", 100.0 * st.mfu);
        else std::snprintf(buf, sizeof(buf), " | MFU n/a");
        extra += buf;
        std::snprintf(buf, sizeof(buf), " | mem %.2f GiB", st.peak_mem_gib);
        extra += buf;
      }
      log_info(line, extra);
    }
  }
  if (cfg_.train.steps > start_step_ && cfg_.output.save_final) save_checkpoint(cfg_.train.steps);
  report_profile();
  if (root) log_info(plan::compare_line(*plan_, be_->memory_stats(), static_cast<double>(plan::vm_hwm_bytes()),
                                        on_device() ? peak_mem_bytes_ : -1.0));
  if (cfg_.output.export_hf && (root || zero3())) {  // (ZeRO-3: every rank takes part in the gather)
    const std::string dir = (fs::path(cfg_.output.dir) / "final").string();
    save_hf(dir);
    if (root) log_info("saved ", dir, " (Hugging Face safetensors + config.json)");
  }
  world_.barrier();
  if (root) write_file_atomic((fs::path(cfg_.output.dir) / "DONE").string(), std::to_string(cfg_.train.steps) + "\n");
  return st;
}

DeviceKind trainer_device(DeviceKind requested) {
  switch (requested) {
    case DeviceKind::Cpu:
      return DeviceKind::Cpu;
    case DeviceKind::Cuda:
#ifndef EASYCTX_HAVE_CUDA
      EASYCTX_THROW_INPUT("train.device: cuda: this build has no CUDA backend (rebuild with -DEASYCTX_CUDA=ON); "
                          "use cpu or auto");
#endif
      EASYCTX_CHECK_INPUT(dist::cuda_device_available(), "train.device: cuda: no CUDA device is visible; use cpu or "
                          "auto");
      return DeviceKind::Cuda;
    case DeviceKind::Auto:
      return dist::cuda_device_available() ? DeviceKind::Cuda : DeviceKind::Cpu;
  }
  return DeviceKind::Cpu;
}

bool Trainer::stop_requested() {
  const double any = world_.all_reduce_scalar(dist::stop_signal() != 0 ? 1.0 : 0.0, dist::ReduceOp::Max);
  return any > 0;
}

void Trainer::save_hf(const std::string& dir) const {
  settle_optimizer();
  model::LlamaConfig mc = model_->config();
  std::vector<std::vector<float>> stage;
  std::vector<ops::Tensor> views;
  if (zero3()) {  // master_ holds this rank's shards: gather the whole model (collective)
    stage = master_host();
    if (world_.rank() != 0) return;
    for (std::vector<float>& u : stage)
      views.emplace_back(u.data(), DType::F32, std::initializer_list<int64_t>{static_cast<int64_t>(u.size())});
  } else {
    views = host_views(master_, stage, true);
  }
  ckpt::save_hf_model(dir, mc, model_->layout(), views,
                      cfg_.output.hf_dtype == "bf16" ? ckpt::StDType::BF16 : ckpt::StDType::F32);
}

int run_stage(dist::Runtime& rt, const StageConfig& cfg, dist::ProcessGroups& groups, const RunOptions& opts) {
  dist::install_stop_signals();
  LogOptions lo;
  lo.rank = rt.rank();
  const std::string& lv = cfg.logging.level;
  lo.level = lv == "debug" ? LogLevel::Debug : lv == "warn" ? LogLevel::Warn : lv == "error" ? LogLevel::Error
                                                                                            : LogLevel::Info;
  if (cfg.logging.per_rank) {
    fs::create_directories(fs::path(cfg.output.dir) / "logs");
    lo.per_rank_file = (fs::path(cfg.output.dir) / "logs" / ("rank" + std::to_string(rt.rank()) + ".log")).string();
  }
  log_init(lo);
  Trainer t(cfg, groups, opts);
  t.run();
  return 0;
}

}  // namespace easyctx::train
