// A progress line on stderr, drawn only when stderr is a terminal; safe to tick from many threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>

namespace qeval::base {

class Progress {
 public:
  // enabled: usually stderr_is_terminal(); a disabled Progress prints nothing.
  Progress(std::string label, std::size_t total, bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void tick();
  void finish();

 private:
  void draw(std::size_t done);
  std::string label_;
  std::size_t total_;
  bool enabled_;
  std::atomic<std::size_t> done_{0};
  std::mutex mu_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

bool stderr_is_terminal();

}  // namespace qeval::base
