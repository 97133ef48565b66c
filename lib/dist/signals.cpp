#include "dist/signals.h"

#include <csignal>

#include "dist/comm.h"

namespace easyctx::dist {
namespace {
volatile std::sig_atomic_t g_stop = 0;
StopRequest g_agreed;

// Which signal wins when a rank (or the ranks) received several: an interrupt first.
int priority(int sig) {
  switch (sig) {
    case SIGINT: return 4;
    case SIGTERM: return 3;
    case SIGUSR2: return 2;
    case SIGUSR1: return 1;
    default: return 0;
  }
}
int from_priority(int p) {
  switch (p) {
    case 4: return SIGINT;
    case 3: return SIGTERM;
    case 2: return SIGUSR2;
    case 1: return SIGUSR1;
    default: return 0;
  }
}

extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT && g_stop == SIGINT) {  // the second Ctrl-C: end now
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  if (priority(sig) > priority(static_cast<int>(g_stop))) g_stop = sig;
}
}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls continue; the flag is seen at the next step
  for (int sig : {SIGUSR1, SIGUSR2, SIGTERM, SIGINT}) sigaction(sig, &sa, nullptr);
}

int stop_signal() { return static_cast<int>(g_stop); }
void clear_stop_signal() {
  g_stop = 0;
  g_agreed = StopRequest{};
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGHUP: return "SIGHUP";
    default: return "signal " + std::to_string(sig);
  }
}

std::string StopRequest::describe() const {
  if (!signal) return "no stop requested";
  return signal_name(signal) + (rank >= 0 ? " on rank " + std::to_string(rank) : std::string());
}

StopRequest agree_stop(Comm& world) {
  const int mine = priority(stop_signal());
  const int best = static_cast<int>(world.all_reduce_scalar(mine, ReduceOp::Max));
  StopRequest r;
  if (best > 0) {
    r.signal = from_priority(best);
    r.rank = static_cast<int>(world.all_reduce_scalar(mine == best ? world.rank() : world.size(), ReduceOp::Min));
  }
  g_agreed = r;
  return r;
}

StopRequest agreed_stop() { return g_agreed; }

int stop_exit_code(int sig) { return sig == SIGINT ? 130 : 0; }

}  // namespace easyctx::dist
