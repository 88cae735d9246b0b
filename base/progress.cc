// Progress line drawing, throttled to ~10 redraws a second.
#include "base/progress.h"

#include <unistd.h>

#include <cstdio>

namespace qeval::base {

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string label, std::size_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::tick() {
  std::size_t done = ++done_;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  if (finished_) return;
  if (done != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(done);
}

void Progress::draw(std::size_t done) {
  constexpr int kWidth = 30;
  int filled = total_ ? static_cast<int>(kWidth * done / total_) : kWidth;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %zu/%zu  %.1fs", label_.c_str(), bar.c_str(), done, total_, elapsed);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  if (finished_) return;
  finished_ = true;
  draw(done_.load());
  std::fputc('\n', stderr);
}

}  // namespace qeval::base
