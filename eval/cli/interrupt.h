// SIGINT and SIGTERM in every verb. main starts one watcher thread before any other thread: the
// two signals are blocked everywhere and taken by it (sigwait), so what it does is ordinary code.
// By default a signal abandons the verb: the temporary files of writes in progress are removed
// (base::abandon_temporary_files), what was already complete is named, and the process exits
// 128 + the signal (130, 143). A verb that can stop cleanly at a safe point (run: after the units
// in progress, saving them) holds a StopOnSignals: the first signal is then only recorded, a second
// one abandons.
#pragma once

#include <string>

namespace qeval::cli {

// Starts the watcher for `verb` (named in its message). A signal whose disposition is "ignore"
// (nohup, a background job of a non-interactive shell) stays ignored. Call once, from main, before
// any other thread starts.
void watch_stop_signals(const std::string& verb);

class StopOnSignals {
 public:
  StopOnSignals();   // from now on the first SIGINT/SIGTERM is recorded, not acted on
  ~StopOnSignals();  // back to abandoning
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;
  // 0, or the signal received since construction.
  int received() const;
};

}  // namespace qeval::cli
