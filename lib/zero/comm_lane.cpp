#include "zero/comm_lane.h"

namespace easyctx::zero {

CommLane::CommLane(ops::Backend& be, std::initializer_list<dist::Comm*> comms, bool queued) : be_(be) {
  for (dist::Comm* c : comms)
    if (c && (c->memspace() == MemSpace::Device || queued)) comms_.push_back(c);
  if (comms_.empty()) return;
  for (dist::Comm* c : comms_) c->set_queue(&be_.queue());
  // The highest priority: a gather's kernel is scheduled as soon as it may run.
  queue_ = be_.make_queue(true);
}

CommLane::~CommLane() {
  try {
    if (queue_) queue_->synchronize();  // what it issued reads buffers about to go
  } catch (...) {                       // (a destructor: nothing to report to)
  }
  for (dist::Comm* c : comms_) c->set_queue(nullptr);
}

}  // namespace easyctx::zero
