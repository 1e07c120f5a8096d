#include "run/signals.hpp"

#include <unistd.h>

#include <csignal>
#include <cstring>
#include <initializer_list>

namespace meshmoe {
namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }

// Whether `command` (argv[1]) stops with a checkpoint on a signal: the training commands.
bool stops_with_checkpoint(const char* command) {
  return command && (std::strcmp(command, "train") == 0 || std::strcmp(command, "distill") == 0);
}

// The value of `name` in `envp` (getenv does not work yet in .preinit_array), or null.
const char* env_value(char** envp, const char* name) {
  const size_t n = std::strlen(name);
  for (char** e = envp; e && *e; ++e)
    if (std::strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
  return nullptr;
}

// The executable's .preinit_array runs before the initialisers of every shared library (MPI,
// HDF5, OpenBLAS, CUDA) and before this program's static constructors, so a stop request that
// comes while they run is caught, not fatal (docs/user-guide.md "Faults"); glibc passes it argc,
// argv and envp as to main. When main() will replace the process by a fresh run of itself
// (ensure_openblas_thread_timeout, tensor/host_threads.hpp: OPENBLAS_THREAD_TIMEOUT unset), a flag
// set here would not survive the exec: the signals are blocked instead, stay pending through the
// exec (execve keeps the pending set and the mask), and reach the fresh run's handlers.
void install_at_load(int argc, char** argv, char** envp) {
  if (argc < 2 || !stops_with_checkpoint(argv[1])) return;
  if (!env_value(envp, "OPENBLAS_THREAD_TIMEOUT")) {
    sigset_t stops;
    sigemptyset(&stops);
    for (int sig : {SIGUSR1, SIGTERM, SIGINT, SIGHUP}) sigaddset(&stops, sig);
    sigprocmask(SIG_BLOCK, &stops, nullptr);
    return;
  }
  install_stop_signal_handlers();
  // Tests only (tests/scripts/decode_bounds.sh): seconds to wait here, the handlers in, before the
  // libraries and main() start, so that a test's signal lands there deterministically.
  // Whole seconds, read by hand: the C library is not initialised yet.
  if (const char* s = env_value(envp, "MESHMOE_TEST_SLEEP_BEFORE_MAIN")) {
    int seconds = 0;
    for (; *s >= '0' && *s <= '9' && seconds < 3600; ++s) seconds = seconds * 10 + (*s - '0');
    for (int ms = seconds * 1000; ms > 0 && !g_signal; ms -= 10) usleep(10000);
  }
}
__attribute__((section(".preinit_array"), used)) void (*const g_install_at_load)(int, char**, char**) = install_at_load;

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigset_t stops;
  sigemptyset(&stops);
  for (int sig : {SIGUSR1, SIGTERM, SIGINT, SIGHUP}) {
    sigaction(sig, &sa, nullptr);
    sigaddset(&stops, sig);
  }
  // A mask inherited through exec (a launcher's, or a re-exec that blocked them to bridge the gap)
  // would hold them pending forever: delivered now, to the flag.
  sigprocmask(SIG_UNBLOCK, &stops, nullptr);
}

int stop_signal_received() { return int(g_signal); }

}  // namespace meshmoe
