// Stop requests. SIGUSR1 and SIGUSR2 (what Slurm's --signal sends before a time limit, and the
// two signals mpirun forwards to every rank), SIGTERM (scancel, preemption, `timeout`, a
// launcher) and SIGINT (Ctrl-C) delivered to any rank ask the run to stop. The handler only
// records the signal; the trainer polls once per step, agrees on it across ranks
// (agree_stop: every rank then names the same signal and the rank that received it), writes
// a checkpoint and exits 0, or 130 for SIGINT (the shell's code for an interrupted command,
// so a script running the trainer stops too). A second SIGINT ends the process at once,
// without a checkpoint. mpirun itself does not forward SIGTERM or SIGINT (it kills the ranks
// 1 s later): scripts/mpirun.sh turns them into SIGUSR1 (docs/training.md, "Stopping a run").
#pragma once
#include <string>

namespace easyctx::dist {

class Comm;

// Installs the handlers (idempotent).
void install_stop_signals();
// The signal that requested a stop on this rank, or 0 (with several: SIGINT, then SIGTERM,
// SIGUSR2, SIGUSR1).
int stop_signal();
// Clears the flag and the agreed request (tests).
void clear_stop_signal();
// "SIGTERM", "SIGUSR1", ... ("signal N" for others).
std::string signal_name(int sig);

struct StopRequest {
  int signal = 0;  // 0: no stop requested
  int rank = -1;   // the lowest world rank that received it
  explicit operator bool() const { return signal != 0; }
  std::string describe() const;  // "SIGTERM on rank 1"
};
// Collective over `world` (one scalar reduction; a second only when a stop is requested):
// the same answer on every rank. Also remembered (agreed_stop).
StopRequest agree_stop(Comm& world);
// The last request agree_stop returned (no request before the first call).
StopRequest agreed_stop();
// The exit code of a run stopped by `sig` after its checkpoint: 130 for SIGINT, else 0.
int stop_exit_code(int sig);

}  // namespace easyctx::dist
