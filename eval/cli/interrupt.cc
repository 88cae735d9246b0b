// The handler only records the signal and writes one line (async-signal-safe calls only).
#include "eval/cli/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>

namespace qeval::cli {
namespace {

// A signal handler can reach nothing else: the one piece of process-wide state, set only here.
volatile std::sig_atomic_t g_received = 0;
struct sigaction g_old_int, g_old_term;

void on_signal(int sig) {
  g_received = sig;
  static const char kLine[] =
      "\nqeval: stopping after the unit(s) in progress; they are saved (signal again to quit at once)\n";
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, kLine, sizeof kLine - 1);
}

}  // namespace

StopOnSignals::StopOnSignals() {
  g_received = 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

StopOnSignals::~StopOnSignals() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int StopOnSignals::received() const { return g_received; }

}  // namespace qeval::cli
