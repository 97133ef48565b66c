// Collective watchdog: no collective waits forever. A dead or stuck peer ends the job within
// the collective timeout with one message naming the operation, the group, the rank that
// noticed and, where it can be known, the rank that never arrived.
//
// Three mechanisms, one per kind of wait:
// - wait_watched: MPI operations issued nonblocking (every MpiComm collective, the start-up
//   and run_collectively reductions) are polled on the calling thread. At the timeout this
//   rank holds a roll call over the group (a side communicator, dist::Runtime sets it up):
//   every rank that is itself waiting in a watched operation answers what it waits in, so
//   the message names the ranks that did not answer (stalled outside any collective, or
//   dead) and those waiting in a different operation (ranks calling collectives in a
//   different order). Then every rank is aborted (exit 3).
// - WatchdogGuard: blocking calls that have no nonblocking form (MPI_Init, MPI_Comm_split,
//   ncclCommInitRank) register for their duration; a monitor thread aborts every rank when
//   one runs past its timeout, naming the operation, the group and this rank.
// - watch_fence: a device queue's fences (NCCL operations); the same monitor thread aborts
//   when the oldest unfinished one made no progress for the timeout.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/fence.h"

namespace easyctx::dist {

// The timeout of collectives that run before a config is read (start-up, run_collectively,
// tools without a config): EASYCTX_COLLECTIVE_TIMEOUT_S when set, else 600 s. easyctx_train
// sets it to parallel.collective_timeout_s once the config is loaded.
double default_collective_timeout_s();
void set_default_collective_timeout_s(double seconds);

// One watched operation, for wait_watched and its messages.
struct Watch {
  const char* op = "";                        // "all_reduce", "barrier", ...
  std::string group;                          // "world", "dp", ...
  size_t count = 0;                           // elements
  double timeout_s = 0;                       // <= 0: no limit (roll calls are still answered)
  const std::vector<int>* members = nullptr;  // world ranks of the group (nullptr: unknown)
  long seq = 0;                               // this operation's number on its group (0: none)
  bool relaxed = false;                       // sleep between polls (long, expected waits)
};

// Waits until the n requests completed, polling (and answering roll calls). At w.timeout_s:
// roll call over w.members, then abort_all naming what it found. Throws Error when MPI
// reports an error.
void wait_watched(MPI_Request* reqs, int n, const Watch& w);

// Answers pending roll calls (any loop that waits for a peer may call it; main thread only).
void answer_roll_calls();

// Set by Runtime: the communicator of roll calls (a duplicate of MPI_COMM_WORLD, not used for
// anything else) and every world rank's host name. Without it, messages name only this rank.
void set_roll_call_comm(MPI_Comm comm, std::vector<std::string> hosts);
// Runtime's destructor: roll calls end before MPI_Finalize.
void clear_roll_call_comm();

// Fault injection for the fault tests (tests/dist, docs/architecture.md "Errors"):
// EASYCTX_FAULT=ACTION:RANK:OP[:GROUP[:N]] makes world rank RANK, at its N-th (default 1st)
// call of operation OP on group GROUP ("*" = any), stall forever (ACTION stall), exit 0
// without MPI_Finalize (exit), die of SIGKILL (kill) or throw an Error (throw). Called at
// the start of every watched collective; a no-op when the variable is unset.
void fault_point(const char* op, const std::string& group);

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

// The timeout message's common part: "<op> on group '<group>' (<count> elements) did not
// complete within <t> s (parallel.collective_timeout_s) on rank <r>".
std::string timeout_message(const std::string& op, const std::string& group, size_t count, double timeout_s);

}  // namespace easyctx::dist
