// Step s's optimizer update finishing inside step s+1's forward (parallel.zero.offload_optimizer):
// the host AdamW of step s runs on a host thread while step s+1 starts, and each parameter unit
// is awaited only when the forward first reaches it (units are reached in forward order:
// embedding, layers, head, so the update of the later units overlaps the forward of the
// earlier ones). Reaching a unit waits for its update on the host, makes the compute queue
// (and any further queue, such as ZeRO-3's communication lane) wait for its upload on the
// device, then lets the store prepare the unit (zero its gradient, gather it, ...).
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "core/fence.h"
#include "ops/ops.h"
#include "zero/host_adamw.h"

namespace easyctx::zero {

class DeferredUpdate {
 public:
  // prepare(u): the store's part once unit u's update is in.
  DeferredUpdate(HostAdamW& adamw, ops::Backend& be, std::function<void(size_t)> prepare)
      : adamw_(adamw), be_(be), prepare_(std::move(prepare)) {}
  // A queue besides the compute queue that reads the updated weights.
  void also_order(Queue* q) { queues_.push_back(q); }
  // Every one of `units` awaits the update just started (or one a checkpoint settled since:
  // then nothing is waited for, the units are only prepared).
  void mark(size_t units);
  bool pending() const { return waiting_ > 0; }
  // Unit u reached: a no-op unless it awaits the update.
  void reach(size_t u);
  // Every unit the forward did not reach; then nothing awaits.
  void reach_all();

 private:
  HostAdamW& adamw_;
  ops::Backend& be_;
  std::function<void(size_t)> prepare_;
  std::vector<Queue*> queues_;
  std::vector<bool> awaits_;
  size_t waiting_ = 0;
};

}  // namespace easyctx::zero
