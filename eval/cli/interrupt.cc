// The signal watcher: a thread in sigwait, so that abandoning can take a lock and format a message.
#include "eval/cli/interrupt.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "base/files.h"

namespace qeval::cli {
namespace {

// Shared with the watcher thread: whether a StopOnSignals is alive, and what it received.
std::atomic<bool> g_graceful{false};
std::atomic<int> g_received{0};

void say(const std::string& text) {
  // Straight to the descriptor: stderr's FILE may be locked by the thread the signal interrupted.
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += std::size_t(n);
  }
}

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

[[noreturn]] void abandon(const std::string& verb, int sig) {
  const base::AbandonedOutput a = base::abandon_temporary_files();
  std::string text = "\nqeval " + verb + ": " + signal_name(sig) + " received: stopped; ";
  if (a.completed == 0) text += "no output file was complete yet, none was written";
  else
    text += std::to_string(a.completed) +
            " file(s) written completely before it are kept (the last: " + a.last_completed + ")";
  if (a.removed) text += "; " + std::to_string(a.removed) + " unfinished file(s) removed";
  text += "\n";
  say(text);
  ::_exit(128 + sig);
}

}  // namespace

void watch_stop_signals(const std::string& verb) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) continue;
    sigaddset(&set, sig);
  }
  if (::pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return;  // the defaults stay
  std::thread([set, verb] {
    for (;;) {
      int sig = 0;
      if (::sigwait(&set, &sig) != 0) continue;
      int none = 0;
      if (g_graceful && g_received.compare_exchange_strong(none, sig)) {
        say(std::string("\nqeval ") + verb + ": " + signal_name(sig) +
            " received: stopping after the unit(s) in progress; they are saved (signal again to quit at once)\n");
        continue;
      }
      abandon(verb, sig);
    }
  }).detach();
}

StopOnSignals::StopOnSignals() {
  g_received = 0;
  g_graceful = true;
}

StopOnSignals::~StopOnSignals() { g_graceful = false; }

int StopOnSignals::received() const { return g_received; }

}  // namespace qeval::cli
