// Collective watchdog: a blocking operation registers itself for its duration; a monitor
// thread aborts every rank (MPI_Abort) when one runs past its timeout, naming the operation
// and the group, so a dead or stuck peer never leaves the job hanging until the wall time.
#pragma once
#include <cstddef>
#include <string>

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

}  // namespace easyctx::dist
