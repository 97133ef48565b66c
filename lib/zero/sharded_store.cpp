// ZeRO stage 3 (zero/param_store.h): this rank's shards of every unit; layers gathered per use
// (zero/gather_pool.h), their gradients reduce-scattered per layer (zero/grad_scatter.h).
#include <algorithm>
#include <cmath>

#include "ckpt/sharded_checkpoint.h"
#include "core/error.h"
#include "zero/comm_lane.h"
#include "zero/deferred_update.h"
#include "zero/gather_pool.h"
#include "zero/grad_scatter.h"
#include "zero/host_adamw.h"
#include "zero/shard_layout.h"
#include "zero/stores.h"

namespace easyctx::zero {
namespace {

constexpr const char* kShards = "fp32 master shard + Adam m, v shards";

class ShardedStore;

// The model's ParamSource: the embedding and head gathered for the step (and their whole
// gradients, reduced at the end of it), the layers through the pool and the scatter.
class ShardedSource final : public model::ParamSource {
 public:
  explicit ShardedSource(ShardedStore& s) : s_(s) {}
  void begin(const std::vector<size_t>& order) override;
  ops::Tensor acquire(size_t u) override;
  void release(size_t u) override;
  ops::Tensor grad(size_t u) override;
  void grad_done(size_t u) override;

 private:
  ops::Tensor end_unit(size_t u, const std::vector<ops::Buffer>& bufs);
  ShardedStore& s_;
};

class ShardedStore final : public ParamStore {
 public:
  ShardedStore(const model::ParamLayout& layout, ops::Backend& be, DType dtype, const StoreOptions& o,
               const StoreComms& c)
      : ParamStore(layout, be, dtype, o, c), sl_(layout, c.zero->size(), c.zero->rank()), source_(*this) {
    for (dist::Comm* g : {comms_.zero, comms_.zero_replica}) {
      if (!g) continue;
      EASYCTX_CHECK_INPUT(g->memspace() == MemSpace::Host || on_device(), "parallel.zero.stage: 3: the ", g->name(),
                          " group uses ", g->backend(), " (device buffers) but the trainer runs the ", be_.name(),
                          " backend; set train.device: cuda");
    }
    // Every rank holds only its shards of master, m and v from the start (on the GPU, or with
    // offload_optimizer in host memory); loading reads only the part each shard holds
    // (ParamStore::load_master, read_checkpoint), so no rank ever holds the whole model.
    ops::Backend& state_be = host_be_ ? *host_be_ : be_;
    const std::string shards = state_label(kShards);
    if (on_device()) wshard_.resize(sl_.units());
    for (size_t u = 0; u < sl_.units(); ++u) {  // zero-filled: the padding stays 0
      if (frozen(u)) {  // LoRA's base: the shard of its weights in the compute dtype, nothing else
        master_.push_back(on_device() ? ops::Buffer()
                                      : be_.alloc(DType::F32, sl_.len(u), "f32 frozen base shard (LoRA)"));
        adam_m_.emplace_back();
        adam_v_.emplace_back();
        if (on_device())
          wshard_[u] = opts_.offload_params
                           ? be_.alloc_host_pinned(DType::BF16, sl_.len(u), "bf16 frozen base shard (LoRA, pinned)")
                           : be_.alloc(DType::BF16, sl_.len(u), "bf16 frozen base shard (LoRA)");
        continue;
      }
      for (std::vector<ops::Buffer>* b : {&master_, &adam_m_, &adam_v_})
        b->push_back(state_be.alloc(DType::F32, sl_.len(u), shards.c_str()));
    }
    lane_ = std::make_unique<CommLane>(be_, std::initializer_list<dist::Comm*>{comms_.zero, comms_.zero_replica});
    if (host_adamw_) {
      deferred_ = std::make_unique<DeferredUpdate>(*host_adamw_, be_, [this](size_t u) { prepare(u); });
      if (lane_->async()) deferred_->also_order(&lane_->queue());  // its gathers read the shards
    }
  }

  ~ShardedStore() override { settle_before_destruction(); }

  void begin_step() override {
    if (deferred_ && deferred_->pending()) return;  // each unit is prepared when the forward reaches it
    for (ops::Buffer& g : grads_)
      if (g.numel() > 0) be_.fill(g.flat(), 0.0);
    for (const ops::Buffer& g : gshard_)  // the layers add into it per micro-batch
      if (g.numel() > 0) on(g).fill(g.flat(), 0.0);
  }

  model::ParamSource& source(int64_t) override { return source_; }

  void end_micro_batch(int64_t) override {
    if (scatter_) scatter_->finish();
    if (!deferred_) return;
    deferred_->reach_all();  // (a unit the model never touched)
    settle();
  }

  // Sum over the shard group straight into each owner's shard, then across replicas
  // (per-node sharding); together they span every rank that computed a partial gradient.
  // The layers were reduced right after their backward; the embedding and head accumulated
  // over every micro-batch and are reduced now.
  void finish_reduction() override {
    for (size_t u = 0; u < sl_.units(); ++u)
      if (!layer(u) && !frozen(u))
        reduce_into_shard(*comms_.zero, comms_.zero_replica, be_, grads_[u], gshard_[u].flat(), sl_.len(u));
  }

  double clip(double max_norm) override {  // the global norm over all shards (padding is zero)
    double ss = 0;
    for (const ops::Buffer& b : gshard_)
      if (b.numel() > 0) ss += on(b).sum_squares(b.flat());
    const double norm = std::sqrt(comms_.zero->all_reduce_scalar(ss, dist::ReduceOp::Sum));
    const double coef = max_norm / (norm + 1e-6);
    if (max_norm > 0 && coef < 1.0)
      for (const ops::Buffer& b : gshard_)
        if (b.numel() > 0) on(b).scale(b.flat(), coef);
    return norm;
  }

  // Each shard once: the first replica of it writes.
  void write_checkpoint(ckpt::CheckpointWriter& w, CheckpointStaging& staging) override {
    settle();
    if (comms_.zero_replica && comms_.zero_replica->rank() != 0) return;
    const bool direct = host_resident(master_);
    for (size_t u = 0; u < sl_.units(); ++u) {
      if (frozen(u)) continue;  // (LoRA's base: not checkpointed)
      const int64_t len = sl_.valid(u);
      for (auto [kind, bufs] : checkpoint_arrays()) {
        const float* p = nullptr;
        if (direct || len <= 0) {
          p = (*bufs)[u].flat().ptr<float>();
        } else {
          staging.emplace_back(static_cast<size_t>(len));
          be_.copy(ops::Tensor(staging.back().data(), DType::F32, {len}), (*bufs)[u].flat().slice_flat(0, {len}));
          p = staging.back().data();
        }
        w.add(ckpt::array_name(kind, layout_.units()[u].name), sl_.numel(u), sl_.lo(u), p, std::max<int64_t>(len, 0));
      }
    }
  }

  std::vector<std::vector<float>> master_host() override {  // collective: every unit from its owners' shards
    settle();
    std::vector<std::vector<float>> out(sl_.units());
    for (size_t u = 0; u < sl_.units(); ++u)
      if (!frozen(u)) gather_master(u, out[u]);
    return out;
  }

  std::vector<std::vector<float>> master_host_at_root() override {  // collective; kept on world rank 0
    settle();
    const bool root = comms_.world->rank() == 0;
    std::vector<std::vector<float>> out(sl_.units());
    std::vector<float> unit;  // the others: one gathered unit at a time
    for (size_t u = 0; u < sl_.units(); ++u)
      if (!frozen(u)) gather_master(u, root ? out[u] : unit);
    return out;
  }

  std::string describe() const override {
    dist::Comm& z = *comms_.zero;
    return "ZeRO-3 over " + std::to_string(z.size()) + " rank(s)" +
           (comms_.zero_replica ? " x " + std::to_string(comms_.zero_replica->size()) + " replicas" : std::string()) +
           ": shards of master, Adam" + (on_device() ? ", bf16 parameters" : "") +
           " and gradients; layers gathered per use into a pool of " + std::to_string(1 + opts_.prefetch) +
           " (parallel.zero.prefetch " + std::to_string(opts_.prefetch) +
           (lane_->async() ? std::string("; gathers and reduce-scatters on a communication stream")
                           : "; gathers synchronous over " + std::string(z.backend())) +
           "), gradients reduce-scattered per layer" +
           (host_be_ ? "; the optimizer shards in host memory (AdamW on the host)" : "") +
           (opts_.offload_params ? "; the bf16 parameter shards in pinned host memory (copied per gather)" : "") +
           (opts_.offload_grads ? "; the layers' fp32 gradient shards in pinned host memory (added there)" : "");
  }

 protected:
  Part part_of(size_t u, const model::ParamTensor& t) const override {
    return {std::max(t.offset, sl_.lo(u)), std::min(t.offset + t.numel, sl_.lo(u) + sl_.valid(u)), sl_.lo(u)};
  }
  Kept kept(size_t u) const override { return {sl_.lo(u), sl_.valid(u)}; }
  const std::vector<ops::Buffer>& update_grads() const override { return gshard_; }
  const std::vector<ops::Buffer>& working() const override { return wshard_; }
  const ops::Buffer& frozen_weights(size_t u) const override { return on_device() ? wshard_[u] : master_[u]; }
  bool working_in_host() const override { return opts_.offload_params; }
  // offload_params: the host writes the bf16 shards the gathers copy from (all consumed by now).
  void before_host_update() override {
    if (lane_->async()) lane_->queue().synchronize();
  }
  void after_deferred_start() override { pool_->invalidate(); }  // every unit gathered again once prepared

  // CUDA: the bf16 working shards from the master shards; then the embedding and head
  // gathered for the step and the pool invalidated.
  void refresh_working_copy() override {
    if (host_be_) {  // host master -> bf16 on the host -> device (no device-side f32 staging)
      std::vector<uint16_t> bits;
      for (size_t u = 0; u < wshard_.size(); ++u) {
        if (frozen(u)) continue;     // (written once, when loaded)
        if (opts_.offload_params) {  // the bf16 shard is host memory: converted in place
          f32_to_bf16(master_[u].flat().ptr<float>(), static_cast<uint16_t*>(wshard_[u].data()), master_[u].numel());
          continue;
        }
        bits.resize(static_cast<size_t>(master_[u].numel()));
        f32_to_bf16(master_[u].flat().ptr<float>(), bits.data(), master_[u].numel());
        be_.copy(wshard_[u].flat(), ops::Tensor(bits.data(), DType::BF16, {master_[u].numel()}));
        be_.synchronize();  // `bits` is reused
      }
    } else {
      for (size_t u = 0; u < wshard_.size(); ++u)
        if (!frozen(u)) be_.copy(wshard_[u].flat(), master_[u].flat());
    }
    working_copy_written();
  }
  // (A frozen embedding or head is gathered once, after loading.)
  void working_copy_written() override {
    for (size_t u = 0; u < sl_.units(); ++u)
      if (!layer(u) && (!frozen(u) || !frozen_gathered_)) gather_unit(u, full_[u], be_.queue());
    frozen_gathered_ = true;
    pool_->shards_written();
  }

 private:
  friend class ShardedSource;
  bool layer(size_t u) const { return layout_.units()[u].per_layer; }
  // The backend whose ops act on `b`: the host's for a buffer in host memory (offload_grads).
  ops::Backend& on(const ops::Buffer& b) const {
    return host_be_ && b.flat().space == MemSpace::Host && be_.memspace() != MemSpace::Host ? *host_be_ : be_;
  }
  int64_t numel(size_t u) const { return sl_.numel(u); }

 public:
  void allocate_step_buffers() override {
    const int64_t Z = sl_.group_size();
    const std::string wt = dtype_ == DType::BF16 ? "bf16" : "fp32";
    const std::string ends = wt + " embedding + head, gathered for the step";
    for (size_t u = 0; u < sl_.units(); ++u) {
      const int64_t len = sl_.len(u);
      const bool trains = !frozen(u);
      gshard_.push_back(!trains ? ops::Buffer()
                        : opts_.offload_grads && layer(u)  // (pinned host memory, added into and read by the host)
                            ? be_.alloc_host_pinned(DType::F32, len, "fp32 reduced gradient shard (offloaded, pinned)")
                            : be_.alloc(DType::F32, len, "fp32 reduced gradient shard"));
      if (on_device() && trains)  // (offload_params: pinned host memory, written by the host AdamW)
        wshard_[u] = opts_.offload_params
                         ? be_.alloc_host_pinned(DType::BF16, len, "bf16 working parameter shard (offloaded, pinned)")
                         : be_.alloc(DType::BF16, len, "bf16 working parameter shard");
      full_.push_back(layer(u) ? ops::Buffer() : be_.alloc(dtype_, len * Z, ends.c_str()));
      // The model accumulates the whole unit; padded for the reduce-scatter.
      grads_.push_back(layer(u) || !trains
                           ? ops::Buffer()
                           : be_.alloc(DType::F32, len * Z, "fp32 embedding + head gradients (whole, padded)"));
    }
    std::vector<ops::Buffer> slots, grads, parts, staging;
    bool layers = false, layers_train = false;
    for (size_t u = 0; u < sl_.units(); ++u) {
      layers |= layer(u);
      layers_train |= layer(u) && !frozen(u);
    }
    if (layers) {
      const int64_t len = sl_.len(layout_.layer_unit(0));  // every layer unit has the same size
      const std::string pool =
          wt + " gathered layers (1 + parallel.zero.prefetch = " + std::to_string(1 + opts_.prefetch) + ")";
      for (int i = 0; i <= opts_.prefetch; ++i) slots.push_back(be_.alloc(dtype_, len * Z, pool.c_str()));
      // (LoRA's frozen layers: no gradient to reduce-scatter)
      for (int k = 0; k < (!layers_train ? 0
                           : on_device() ? 2
                                         : 1);
           ++k) {  // CUDA: two, the reduce-scatter of one overlapping
        grads.push_back(be_.alloc(DType::F32, len * Z, "fp32 gradient of the layer in backward"));
        parts.push_back(be_.alloc(DType::F32, len, "fp32 reduce-scatter result (one layer shard)"));
        if (opts_.offload_grads)
          staging.push_back(be_.alloc_host_pinned(DType::F32, len, "fp32 reduce-scatter result staging (pinned)"));
      }
    }
    pool_ = std::make_unique<GatherPool>(
        be_, *lane_, std::move(slots), opts_.prefetch,
        [this](size_t u, const ops::Buffer& dst) { gather_unit(u, dst, lane_->queue()); },
        [this](size_t u) {
          if (deferred_) deferred_->reach(u);  // (a deferred update: the unit's new shards first)
        });
    if (layers_train)
      scatter_ = std::make_unique<GradScatter>(
          be_, *lane_, *comms_.zero, comms_.zero_replica, std::move(grads), std::move(parts),
          [this](size_t u) { return gshard_[u].flat(); }, [this](size_t u) { return sl_.len(u); },
          opts_.offload_grads ? host_be_.get() : nullptr, std::move(staging));
  }

 private:
  // dst = all shards of unit u (compute dtype), issued to the queue the shard group's
  // communicator issues to now (`q`: the lane's inside a lane run, else the compute queue).
  void gather_unit(size_t u, const ops::Buffer& dst, Queue& q) {
    dist::Comm& z = *comms_.zero;
    const int64_t len = sl_.len(u), Z = sl_.group_size();
    EASYCTX_CHECK(dst.numel() >= len * Z && dst.dtype() == dtype_, "gather_unit: destination too small");
    if (!on_device()) {  // f32: the master shard is the parameter
      z.all_gather(master_[u].flat().ptr<float>(), static_cast<float*>(dst.data()), static_cast<size_t>(len));
      return;
    }
    if (z.memspace() == MemSpace::Device) {
      if (opts_.offload_params) {  // the host shard into its own block first, then an in-place gather
        const ops::Tensor block = dst.flat().slice_flat(z.rank() * len, {len});
        be_.copy_on(q, block, wshard_[u].flat());
        z.all_gather(block.data, dst.data(), static_cast<size_t>(len), DType::BF16);
        return;
      }
      z.all_gather(wshard_[u].data(), dst.data(), static_cast<size_t>(len), DType::BF16);
      return;
    }
    // A host communicator: the bf16 shard through host memory (16-bit words).
    std::vector<uint16_t> mine, all(static_cast<size_t>(len * Z));
    const void* send = wshard_[u].data();  // (offload_params: already in host memory)
    if (!opts_.offload_params) {
      mine.resize(static_cast<size_t>(len));
      be_.copy(ops::Tensor(mine.data(), DType::BF16, {len}), wshard_[u].flat());
      send = mine.data();
    }
    z.all_gather(send, all.data(), static_cast<size_t>(len), DType::BF16);
    be_.copy(dst.flat().slice_flat(0, {len * Z}), ops::Tensor(all.data(), DType::BF16, {len * Z}));
    be_.synchronize();  // `all` goes away
  }

  // Unit u's whole fp32 master weights into `out` (collective over the shard group).
  void gather_master(size_t u, std::vector<float>& out) {
    dist::Comm& z = *comms_.zero;
    const int64_t len = sl_.len(u), Z = sl_.group_size();
    out.resize(static_cast<size_t>(len * Z));
    if (!on_device()) {
      z.all_gather(master_[u].flat().ptr<float>(), out.data(), static_cast<size_t>(len));
    } else if (z.memspace() == MemSpace::Device) {
      const ops::Buffer tmp = be_.alloc(DType::F32, len * Z, "one unit gathered on the device (f32)");
      const float* mine = master_[u].flat().ptr<float>();
      if (host_resident(master_)) {  // offload_optimizer: the shard into its own block first (in-place gather)
        const ops::Tensor block = tmp.flat().slice_flat(z.rank() * len, {len});
        be_.copy(block, master_[u].flat());
        mine = block.ptr<float>();
      }
      z.all_gather(mine, tmp.flat().ptr<float>(), static_cast<size_t>(len));
      be_.copy(ops::Tensor(out.data(), DType::F32, {len * Z}), tmp.flat());
      be_.synchronize();  // tmp goes away
    } else {
      std::vector<float> mine(static_cast<size_t>(len));
      be_.copy(ops::Tensor(mine.data(), DType::F32, {len}), master_[u].flat());
      z.all_gather(mine.data(), out.data(), static_cast<size_t>(len));
    }
    out.resize(static_cast<size_t>(sl_.numel(u)));
  }

  // A deferred update reached unit u: its gradient buffers zeroed (the host has read them)
  // and, for the embedding and head, the new shards gathered.
  void prepare(size_t u) {
    if (frozen(u)) return;  // (LoRA's base: not updated)
    if (grads_[u].numel() > 0) be_.fill(grads_[u].flat(), 0.0);
    on(gshard_[u]).fill(gshard_[u].flat(), 0.0);
    if (!layer(u)) gather_unit(u, full_[u], be_.queue());
  }

  ShardLayout sl_;
  std::vector<ops::Buffer> gshard_;  // this rank's reduced gradient shard, f32[len]
  std::vector<ops::Buffer> wshard_;  // CUDA: this rank's bf16 working shard (offload_params: pinned host)
  std::vector<ops::Buffer> full_;    // the embedding and head gathered for the step, [len * Z] (compute dtype)
  std::vector<ops::Buffer> grads_;   // the embedding's and head's whole padded f32 gradients
  std::unique_ptr<GatherPool> pool_;
  std::unique_ptr<GradScatter> scatter_;
  std::unique_ptr<CommLane> lane_;  // (declared after what its queue reads: it waits for it first when destroyed)
  bool frozen_gathered_ = false;    // LoRA's frozen embedding and head: gathered (once)
  ShardedSource source_;
};

void ShardedSource::begin(const std::vector<size_t>& order) {
  std::vector<size_t> layers;
  for (size_t u : order)
    if (s_.layer(u)) layers.push_back(u);
  s_.pool_->begin(layers);
}

// The embedding's or head's buffer of `bufs`, once a deferred update has reached the unit.
ops::Tensor ShardedSource::end_unit(size_t u, const std::vector<ops::Buffer>& bufs) {
  if (s_.deferred_) s_.deferred_->reach(u);
  return bufs[u].flat().slice_flat(0, {s_.numel(u)});
}

ops::Tensor ShardedSource::acquire(size_t u) {
  return s_.layer(u) ? s_.pool_->acquire(u, s_.numel(u)) : end_unit(u, s_.full_);
}

void ShardedSource::release(size_t u) {
  if (s_.layer(u)) s_.pool_->release(u);
}

ops::Tensor ShardedSource::grad(size_t u) {
  return s_.layer(u) ? s_.scatter_->grad(u, s_.numel(u)) : end_unit(u, s_.grads_);
}

void ShardedSource::grad_done(size_t u) {
  if (s_.layer(u)) s_.scatter_->done(u);
}

}  // namespace

std::unique_ptr<ParamStore> make_sharded_store(const model::ParamLayout& layout, ops::Backend& be, DType dtype,
                                               const StoreOptions& o, const StoreComms& c) {
  EASYCTX_CHECK(c.zero != nullptr, "ZeRO-3 without a shard group");
  return std::make_unique<ShardedStore>(layout, be, dtype, o, c);
}

}  // namespace easyctx::zero
