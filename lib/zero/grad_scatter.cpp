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
                         std::function<ops::Tensor(size_t)> shard, std::function<int64_t(size_t)> len)
    : be_(be),
      lane_(lane),
      zero_(zero),
      replica_(replica),
      grads_(std::move(grads)),
      parts_(std::move(parts)),
      shard_(std::move(shard)),
      len_(std::move(len)),
      in_flight_(grads_.size(), kNone),
      scattered_(grads_.size()) {
  EASYCTX_CHECK(grads_.size() == parts_.size(), "GradScatter: ", grads_.size(), " buffers, ", parts_.size(),
                " results");  // (none: a model without layers)
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
    be_.axpy(shard_(u), part, 1.0);  // micro-batches accumulate in the shard
    return;
  }
  // On the lane after the layer's backward; finish(k) adds it into the shard.
  scattered_[k] = lane_.run(be_.record(), [&] { reduce_into_shard(zero_, replica_, be_, grads_[k], part, len); });
  in_flight_[k] = u;
}

void GradScatter::finish(size_t k) {
  const size_t u = in_flight_[k];
  if (u == kNone) return;
  be_.wait(scattered_[k]);
  be_.axpy(shard_(u), parts_[k].flat().slice_flat(0, {len_(u)}), 1.0);
  in_flight_[k] = kNone;
}

void GradScatter::finish() {
  for (size_t k = 0; k < grads_.size(); ++k) finish(k);
}

}  // namespace easyctx::zero
