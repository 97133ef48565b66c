// Collective watchdog: a blocking operation registers itself for its duration; a monitor
// thread aborts every rank (MPI_Abort) when one runs past its timeout, naming the operation
// and the group, so a dead or stuck peer never leaves the job hanging until the wall time.
#pragma once
#include <cstddef>
#include <string>

#include "core/fence.h"

namespace easyctx::dist {

class WatchdogGuard {
 public:
  WatchdogGuard(const char* op, const std::string& group, size_t count, double timeout_s);
  ~WatchdogGuard();
  WatchdogGuard(const WatchdogGuard&) = delete;
  WatchdogGuard& operator=(const WatchdogGuard&) = delete;

 private:
  int slot_;
};

// A device queue's fence under the same watch: the fences given with one `queue` key complete
// in order, and every rank is aborted when the oldest unfinished one has made no progress for
// timeout_s (since it was given, or since the fence before it completed), naming the
// operation issued last before it. Non-blocking; the fence is dropped once complete.
void watch_fence(const void* queue, Fence f, const std::string& op, const std::string& group, size_t count,
                 double timeout_s);

}  // namespace easyctx::dist
