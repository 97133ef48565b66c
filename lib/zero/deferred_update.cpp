#include "zero/deferred_update.h"

namespace easyctx::zero {

void DeferredUpdate::mark(size_t units) {
  awaits_.assign(units, true);
  waiting_ = units;
}

void DeferredUpdate::reach(size_t u) {
  if (u >= awaits_.size() || !awaits_[u]) return;
  const Fence uploaded = adamw_.wait_unit(u);  // (complete once the update was finished)
  be_.wait(uploaded);
  for (Queue* q : queues_) q->wait(uploaded);
  prepare_(u);  // after the host has read the unit's gradient
  awaits_[u] = false;
  --waiting_;
}

void DeferredUpdate::reach_all() {
  for (size_t u = 0; u < awaits_.size(); ++u) reach(u);
}

}  // namespace easyctx::zero
