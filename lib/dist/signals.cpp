#include "dist/signals.h"

#include <csignal>

namespace easyctx::dist {
namespace {
volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int sig) { g_stop = sig; }
}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls continue; the flag is seen at the next step
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int stop_signal() { return static_cast<int>(g_stop); }
void clear_stop_signal() { g_stop = 0; }

}  // namespace easyctx::dist
