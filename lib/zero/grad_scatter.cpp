#include "zero/grad_scatter.h"

#include "core/error.h"

namespace easyctx::zero {

void reduce_into_shard(dist::Comm& zero, dist::Comm* replica, ops::Backend& be, const ops::Buffer& full,
                       const ops::Tensor& out, int64_t len) {
  const int64_t Z = zero.size();
  if (be.memspace() == MemSpace::Host || zero.memspace() == MemSpace::Device) {  // MPI on host buffers, or NCCL
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

GradScatter::GradScatter(ops::Backend& be, CommLane& lane, dist::Comm& zero, dist::Comm* replica,
                         std::vector<ops::Buffer> grads, std::vector<ops::Buffer> parts,
                         std::function<ops::Tensor(size_t)> shard, std::function<int64_t(size_t)> len,
                         ops::Backend* host, std::vector<ops::Buffer> staging)
    : be_(be),
      lane_(lane),
      zero_(zero),
      replica_(replica),
      grads_(std::move(grads)),
      parts_(std::move(parts)),
      shard_(std::move(shard)),
      len_(std::move(len)),
      host_(host),
      staging_(std::move(staging)),
      in_flight_(grads_.size(), kNone),
      scattered_(grads_.size()) {
  EASYCTX_CHECK(grads_.size() == parts_.size(), "GradScatter: ", grads_.size(), " buffers, ", parts_.size(),
                " results");  // (none: a model without layers)
  EASYCTX_CHECK(!host_ || staging_.size() == grads_.size(), "GradScatter: ", grads_.size(), " buffers, ",
                staging_.size(), " host staging buffers");
  if (host_) down_ = be_.make_queue();
}

void GradScatter::add_into_shard(size_t k, size_t u, const Fence& after) {
  const int64_t len = len_(u);
  const ops::Tensor part = parts_[k].flat().slice_flat(0, {len}), shard = shard_(u);
  if (!host_ || shard.space != MemSpace::Host) {  // on the device: micro-batches accumulate in the shard
    be_.wait(after);
    be_.axpy(shard, part, 1.0);
    return;
  }
  const ops::Tensor staged = staging_[k].flat().slice_flat(0, {len});
  down_->wait(after);
  be_.copy_on(*down_, staged, part);
  down_->record().host_wait();  // (the compute queue runs on meanwhile: the layers after this one)
  host_->axpy(shard, staged, 1.0);
}

ops::Tensor GradScatter::grad(size_t u, int64_t numel) {
  if (unit_ != u) {
    EASYCTX_CHECK(unit_ == kNone, "ZeRO-3: the gradient of unit ", u, " requested before the backward of unit ", unit_,
                  " was done");
    buf_ = (buf_ + 1) % grads_.size();
    finish(buf_);  // its previous reduce-scatter has read it (and is added into its shard)
    be_.fill(grads_[buf_].flat(), 0.0);
    unit_ = u;
  }
  return grads_[buf_].flat().slice_flat(0, {numel});
}

void GradScatter::done(size_t u) {
  EASYCTX_CHECK(unit_ == u, "ZeRO-3: the backward of unit ", u, " done without its gradient");
  const int64_t len = len_(u);
  const ops::Tensor part = parts_[buf_].flat().slice_flat(0, {len});
  const size_t k = buf_;
  unit_ = kNone;
  if (!lane_.async()) {
    reduce_into_shard(zero_, replica_, be_, grads_[k], part, len);
    add_into_shard(k, u, be_.record());
    return;
  }
  // On the lane after the layer's backward; finish(k) adds it into the shard.
  scattered_[k] = lane_.run(be_.record(), [&] { reduce_into_shard(zero_, replica_, be_, grads_[k], part, len); });
  in_flight_[k] = u;
}

void GradScatter::finish(size_t k) {
  const size_t u = in_flight_[k];
  if (u == kNone) return;
  add_into_shard(k, u, scattered_[k]);
  in_flight_[k] = kNone;
}

void GradScatter::finish() {
  for (size_t k = 0; k < grads_.size(); ++k) finish(k);
}

}  // namespace easyctx::zero
