// SIGINT/SIGTERM during a long verb: the first one asks it to stop at the next safe point (a run
// saves its finished units and says how to resume); a second one ends the process as usual.
#pragma once

namespace qeval::cli {

class StopOnSignals {
 public:
  StopOnSignals();   // installs the handlers (one-shot: SA_RESETHAND) for SIGINT and SIGTERM
  ~StopOnSignals();  // puts the previous ones back
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;
  // 0, or the signal received since construction.
  int received() const;
};

}  // namespace qeval::cli
