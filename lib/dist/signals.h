// Stop requests from the scheduler: SIGUSR1 (Slurm's --signal before the time limit, which
// mpirun forwards to every rank) and SIGTERM (preemption, scancel). The handler only sets a
// flag; the trainer polls it once per step, agrees on it across ranks, writes a checkpoint
// and exits 0, so a requeued job resumes where this one stopped.
#pragma once

namespace easyctx::dist {

// Installs the handlers (idempotent).
void install_stop_signals();
// The signal that requested a stop on this rank, or 0.
int stop_signal();
// Clears the flag (tests).
void clear_stop_signal();

}  // namespace easyctx::dist
