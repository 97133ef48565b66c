// ZeRO stage 0 (zero/param_store.h): every rank holds every unit; gradients all-reduced.
#include <algorithm>
#include <cstring>
#include <memory>

#include "ckpt/sharded_checkpoint.h"
#include "core/error.h"
#include "zero/deferred_update.h"
#include "zero/host_adamw.h"
#include "zero/param_store.h"
#include "zero/stores.h"

namespace easyctx::zero {
namespace {

// The model's view of resident units; while a deferred update runs, each unit is reached
// (awaited) when the model first asks for its parameters or its gradient.
class ResidentSource final : public model::ParamSource {
 public:
  ResidentSource(std::vector<ops::Tensor> params, std::vector<ops::Tensor> grads, DeferredUpdate* deferred)
      : params_(std::move(params)), grads_(std::move(grads)), deferred_(deferred) {}
  ops::Tensor acquire(size_t u) override {
    if (deferred_) deferred_->reach(u);
    return params_.at(u);
  }
  void release(size_t) override {}
  ops::Tensor grad(size_t u) override {
    if (deferred_) deferred_->reach(u);
    return grads_.at(u);
  }
  void grad_done(size_t) override {}

 private:
  std::vector<ops::Tensor> params_, grads_;
  DeferredUpdate* deferred_;
};

std::vector<ops::Tensor> views(const std::vector<ops::Buffer>& bufs) {
  std::vector<ops::Tensor> v;
  for (const ops::Buffer& b : bufs) v.push_back(b.flat());
  return v;
}

class ReplicatedStore final : public ParamStore {
 public:
  ReplicatedStore(const model::ParamLayout& layout, ops::Backend& be, DType dtype, const StoreOptions& o,
                  const StoreComms& c)
      : ParamStore(layout, be, dtype, o, c) {
    for (size_t i = 0; i < layout_.num_units(); ++i) {
      const model::ParamUnit& u = layout_.units()[i];
      const bool host = state_in_host(i);  // (offload_optimizer_layers: some units' state on the device)
      ops::Backend& opt_be = host ? *host_be_ : be_;
      const std::string master = host ? state_label("fp32 master weights") : "fp32 master weights";
      const std::string moments = host ? state_label("Adam m, v (fp32)") : "Adam m, v (fp32)";
      master_.push_back(opt_be.alloc(DType::F32, u.numel, master.c_str()));
      grads_.push_back(be_.alloc(DType::F32, u.numel, "fp32 gradients"));
      adam_m_.push_back(opt_be.alloc(DType::F32, u.numel, moments.c_str()));
      adam_v_.push_back(opt_be.alloc(DType::F32, u.numel, moments.c_str()));
      if (on_device()) work_.push_back(be_.alloc(DType::BF16, u.numel, "bf16 working parameters"));
    }
    if (host_adamw_)
      deferred_ =
          std::make_unique<DeferredUpdate>(*host_adamw_, be_, [this](size_t u) { be_.fill(grads_[u].flat(), 0.0); });
  }

  ~ReplicatedStore() override { settle_before_destruction(); }

  void begin_step() override {
    if (deferred_ && deferred_->pending()) return;  // each unit's gradient is zeroed when it is reached
    for (ops::Buffer& g : grads_) be_.fill(g.flat(), 0.0);
  }

  model::ParamSource& source(int64_t m) override {
    source_ = std::make_unique<ResidentSource>(views(work_.empty() ? master_ : work_), views(grads_),
                                               m == 0 ? deferred_.get() : nullptr);
    return *source_;
  }

  void end_micro_batch(int64_t m) override {
    if (m != 0 || !deferred_) return;
    deferred_->reach_all();  // (a unit the model never touched)
    settle();
  }

  // Sum over the ranks that computed partial gradients (data-parallel replicas, and the
  // sequence-parallel slices when present); the 1/global-labels scale is already in.
  void finish_reduction() override {
    dist::Comm& c = *comms_.grads;
    if (c.size() == 1) return;
    if (!on_device()) {
      for (ops::Buffer& g : grads_) c.all_reduce(g.flat().ptr<float>(), static_cast<size_t>(g.numel()));
      return;
    }
    if (c.memspace() == MemSpace::Device) {  // NCCL on the device buffers
      be_.synchronize();                     // the backward is queued on the backend's stream, NCCL runs on its own
      for (ops::Buffer& g : grads_) c.all_reduce(g.flat().ptr<float>(), static_cast<size_t>(g.numel()));
      c.synchronize();
      return;
    }
    std::vector<std::vector<float>> staging;  // device gradients over a host communicator
    const std::vector<ops::Tensor> hv = host_views(grads_, staging, true);
    for (const ops::Tensor& g : hv) c.all_reduce(g.ptr<float>(), static_cast<size_t>(g.numel()));
    upload(grads_, staging);
  }

  double clip(double max_norm) override { return clip_by_global_norm(be_, views(grads_), max_norm); }

  // Every rank holds everything; each writes its 1/W of every unit, in parallel. Device
  // state is staged on the host, only the slices this rank writes (alive until commit).
  void write_checkpoint(ckpt::CheckpointWriter& w, CheckpointStaging& staging) override {
    settle();
    const int64_t W = comms_.world->size(), r = comms_.world->rank();
    for (size_t u = 0; u < master_.size(); ++u) {
      const bool direct = master_[u].flat().space == MemSpace::Host;
      const int64_t n = master_[u].numel(), lo = n * r / W, hi = n * (r + 1) / W;
      for (auto [kind, bufs] : checkpoint_arrays()) {
        const float* p = nullptr;
        if (direct) {
          p = (*bufs)[u].flat().ptr<float>() + lo;
        } else {
          staging.emplace_back(static_cast<size_t>(hi - lo));
          be_.copy(ops::Tensor(staging.back().data(), DType::F32, {hi - lo}),
                   (*bufs)[u].flat().slice_flat(lo, {hi - lo}));
          p = staging.back().data();
        }
        w.add(ckpt::array_name(kind, layout_.units()[u].name), n, lo, p, hi - lo);
      }
    }
  }

  std::vector<std::vector<float>> master_host() override {
    settle();
    std::vector<std::vector<float>> out(master_.size());
    for (size_t u = 0; u < master_.size(); ++u) {
      out[u].resize(static_cast<size_t>(master_[u].numel()));
      if (master_[u].flat().space == MemSpace::Host) std::memcpy(out[u].data(), master_[u].data(), master_[u].bytes());
      else be_.copy(ops::Tensor(out[u].data(), DType::F32, {master_[u].numel()}), master_[u].flat());
    }
    return out;
  }
  std::vector<ops::Tensor> master() const override {
    settle();
    return views(master_);
  }
  std::vector<ops::Tensor> gradients() const override { return views(grads_); }
  std::string describe() const override { return ""; }

 protected:
  Part part_of(size_t, const model::ParamTensor& t) const override { return {t.offset, t.offset + t.numel, 0}; }
  Kept kept(size_t u) const override { return {0, layout_.units()[u].numel}; }
  const std::vector<ops::Buffer>& update_grads() const override { return grads_; }
  const std::vector<ops::Buffer>& working() const override { return work_; }
  void after_deferred_start() override {}

  // CUDA: the bf16 working parameters from the master weights.
  void refresh_working_copy() override {
    refresh_device_units();
    int64_t most = 0;  // host master -> bf16 on the host -> device (no device-side f32 staging)
    for (size_t u = 0; u < work_.size(); ++u)
      if (master_[u].flat().space == MemSpace::Host) most = std::max(most, master_[u].numel());
    const std::unique_ptr<uint16_t[]> bits(most > 0 ? new uint16_t[static_cast<size_t>(most)] : nullptr);  // (unset)
    for (size_t u = 0; u < work_.size(); ++u) {
      if (master_[u].flat().space != MemSpace::Host) continue;
      f32_to_bf16(master_[u].flat().ptr<float>(), bits.get(), master_[u].numel());
      be_.copy(work_[u].flat(), ops::Tensor(bits.get(), DType::BF16, {master_[u].numel()}));
      be_.synchronize();  // `bits` is reused
    }
  }
  void refresh_device_units() override {
    for (size_t u = 0; u < work_.size(); ++u)
      if (master_[u].flat().space != MemSpace::Host) be_.copy(work_[u].flat(), master_[u].flat());
  }

 private:
  std::vector<ops::Buffer> grads_, work_;  // per unit: f32 gradients; CUDA: bf16 working parameters
  std::unique_ptr<ResidentSource> source_;
};

}  // namespace

std::unique_ptr<ParamStore> make_replicated_store(const model::ParamLayout& layout, ops::Backend& be, DType dtype,
                                                  const StoreOptions& o, const StoreComms& c) {
  return std::make_unique<ReplicatedStore>(layout, be, dtype, o, c);
}

}  // namespace easyctx::zero
