#include "run/signals.hpp"

#include <csignal>
#include <initializer_list>

namespace meshmoe {
namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }
}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGUSR1, SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
}

int stop_signal_received() { return int(g_signal); }

}  // namespace meshmoe
