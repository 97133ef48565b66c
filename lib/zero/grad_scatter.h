// ZeRO-3's layer gradients: the model accumulates a layer's whole gradient (over its
// backward) in one of two buffers used in turn; right after that layer's backward, the buffer
// is reduce-scattered over the shard group (and all-reduced over the replicas), and this
// rank's block is added into the unit's gradient shard. On an asynchronous lane the
// reduce-scatter of one layer runs while the next layer's backward computes into the other
// buffer; the compute queue waits for a reduce-scatter only when it reuses its buffer two
// layers later (or at finish()), and then adds the result into the shard. A synchronous lane
// (host communicators) has one buffer and adds at once.
// Shards in host memory (parallel.zero.offload_grads): the result is copied down into a pinned
// staging buffer on a queue of its own (after the reduce-scatter, beside the compute) and
// added into the shard on the host (the same float additions as the device's axpy), so no
// layer gradient shard stays on the device.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/fence.h"
#include "dist/comm.h"
#include "ops/ops.h"
#include "zero/comm_lane.h"

namespace easyctx::zero {

// out (f32[len]) = this rank's block of the sum of `full` (f32[len * Z]) over the shard group
// and the replicas. A device backend over host communicators stages through host memory.
void reduce_into_shard(dist::Comm& zero, dist::Comm* replica, ops::Backend& be, const ops::Buffer& full,
                       const ops::Tensor& out, int64_t len);

class GradScatter {
 public:
  // grads: whole-layer f32 buffers (2 on an asynchronous lane, else 1); parts: f32 shard-sized
  // results, one per buffer; shard(u): unit u's gradient shard, f32[len(u)]; len(u) its length.
  // host: the backend of host-memory shards (offload_grads), with `staging`, pinned f32
  // shard-sized buffers, one per buffer; else nullptr and none.
  GradScatter(ops::Backend& be, CommLane& lane, dist::Comm& zero, dist::Comm* replica, std::vector<ops::Buffer> grads,
              std::vector<ops::Buffer> parts, std::function<ops::Tensor(size_t)> shard,
              std::function<int64_t(size_t)> len, ops::Backend* host = nullptr, std::vector<ops::Buffer> staging = {});

  // The buffer layer unit u's gradient accumulates in (numel elements, zeroed on first use).
  ops::Tensor grad(size_t u, int64_t numel);
  // Layer u's backward is done: its reduce-scatter issued.
  void done(size_t u);
  // Every reduce-scatter in flight added into its shard (the end of a micro-batch).
  void finish();
  size_t buffers() const { return grads_.size(); }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  void finish(size_t k);
  // shard(u) += buffer k's result, once `after` (its reduce-scatter) is done.
  void add_into_shard(size_t k, size_t u, const Fence& after);

  ops::Backend& be_;
  CommLane& lane_;
  dist::Comm& zero_;
  dist::Comm* replica_;
  std::vector<ops::Buffer> grads_, parts_;
  std::function<ops::Tensor(size_t)> shard_;
  std::function<int64_t(size_t)> len_;
  ops::Backend* host_;
  std::vector<ops::Buffer> staging_;
  std::unique_ptr<Queue> down_;    // host shards: the copies of the results into the staging
  std::vector<size_t> in_flight_;  // per buffer: the unit whose reduce-scatter is in flight
  std::vector<Fence> scattered_;   // per buffer: that reduce-scatter's end
  size_t unit_ = kNone;            // the layer whose gradient grads_[buf_] accumulates
  size_t buf_ = 0;
};

}  // namespace easyctx::zero
