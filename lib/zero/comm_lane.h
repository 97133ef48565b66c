// Where ZeRO-3's collectives run. Device communicators (NCCL) issue to the compute queue by
// default, so a collective is ordered with the layers around it without the host waiting; the
// layers' gathers and gradient reduce-scatters move to a lane of their own (a high-priority
// queue beside compute) so that they overlap compute, ordered with it by fences. Host
// communicators (MPI) run every collective before returning: the lane is then synchronous and
// its fences complete.
#pragma once
#include <initializer_list>
#include <memory>
#include <vector>

#include "core/fence.h"
#include "dist/comm.h"
#include "ops/ops.h"

namespace easyctx::zero {

class CommLane {
 public:
  // comms: the shard group and its replicas (null entries ignored). `queued`: a queue of its
  // own even for host communicators (the fence bookkeeping then runs on the CPU: tests).
  CommLane(ops::Backend& be, std::initializer_list<dist::Comm*> comms, bool queued = false);
  ~CommLane();  // the communicators issue to their own queues again
  CommLane(const CommLane&) = delete;
  CommLane& operator=(const CommLane&) = delete;

  // A queue of its own (device communicators, or queued), else the collectives are synchronous.
  bool async() const { return queue_ != nullptr; }
  // The lane's queue, for copies that must run in its order (async only).
  Queue& queue() { return *queue_; }
  // Runs `issue` (collectives of the communicators, copies on queue()) on the lane after
  // `after`, and returns the fence after it (complete when synchronous).
  template <class F>
  Fence run(const Fence& after, F&& issue) {
    if (!queue_) {
      issue();
      return {};
    }
    queue_->wait(after);
    On on(*this);
    issue();
    return queue_->record();
  }

 private:
  class On {  // the communicators issue to the lane while it exists (also when `issue` throws)
   public:
    explicit On(CommLane& l) : l_(l) {
      for (dist::Comm* c : l_.comms_) c->set_queue(l_.queue_.get());
    }
    ~On() {
      for (dist::Comm* c : l_.comms_) c->set_queue(&l_.be_.queue());
    }
    On(const On&) = delete;
    On& operator=(const On&) = delete;

   private:
    CommLane& l_;
  };
  ops::Backend& be_;
  std::vector<dist::Comm*> comms_;  // the device communicators
  std::unique_ptr<Queue> queue_;
};

}  // namespace easyctx::zero
