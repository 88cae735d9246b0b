// Progress bars (throttled to ~10 redraws a second) and progress lines (periodic, with ETA).
#include "base/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace qeval::base {

namespace {

std::mutex settings_mu;
ProgressSettings settings;  // set once by main (see set_progress_settings)

}  // namespace

std::optional<ProgressMode> parse_progress_mode(std::string_view text) {
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "bar") return ProgressMode::kBar;
  if (text == "lines") return ProgressMode::kLines;
  if (text == "none") return ProgressMode::kNone;
  return std::nullopt;
}

void set_progress_settings(const ProgressSettings& s) {
  std::lock_guard lock(settings_mu);
  settings = s;
}

ProgressSettings progress_settings() {
  std::lock_guard lock(settings_mu);
  return settings;
}

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

std::string format_duration(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[48];
  if (s < 60) std::snprintf(buf, sizeof buf, "%ld s", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%ld min %ld s", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld h %ld min", s / 3600, s % 3600 / 60);
  return buf;
}

Progress::Progress(std::string label, std::size_t total, bool enabled, ProgressText text)
    : label_(std::move(label)),
      total_(total),
      text_(std::move(text)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  if (text_.ticks_per_item == 0) text_.ticks_per_item = 1;
  const ProgressSettings s = progress_settings();
  period_ = std::max(s.period, std::chrono::milliseconds(1));
  if (enabled) {
    mode_ = s.mode;
    if (mode_ == ProgressMode::kAuto) mode_ = stderr_is_terminal() ? ProgressMode::kBar : ProgressMode::kLines;
  }
  if (mode_ == ProgressMode::kLines) timer_ = std::thread([this] { heartbeat(); });
}

Progress::~Progress() { finish(); }

std::string Progress::status(std::size_t done, bool final) const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::size_t per = text_.ticks_per_item;
  std::string s = label_ + ": " + std::to_string(std::min(done, total_) / per) + "/" + std::to_string(total_ / per) +
                  " " + text_.noun;
  if (!text_.detail.empty()) s += ", " + text_.detail;
  if (final) return s + ", done in " + format_duration(elapsed);
  s += ", " + format_duration(elapsed) + " elapsed";
  if (done > 0 && done < total_) s += ", ETA " + format_duration(elapsed * double(total_ - done) / double(done));
  return s;
}

void Progress::tick() {
  const std::size_t done = ++done_;
  if (mode_ == ProgressMode::kNone) return;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  if (finished_) return;
  if (mode_ == ProgressMode::kBar) {
    if (done != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    draw_bar(done);
    return;
  }
  // Lines: the first finished item is reported at once (the first ETA), later ones unless a line
  // went out less than a period (at most a second) ago; the last one waits for finish().
  const std::size_t items = done / text_.ticks_per_item;
  if (items == last_items_ || done >= total_) return;
  if (last_items_ > 0 && now - last_draw_ < std::min<std::chrono::milliseconds>(period_, std::chrono::seconds(1)))
    return;
  print_line(done, false);
}

namespace {

// "label [#####.....] 3/8 units, ...": `status` ("label: 3/8 units, ...") with the bar after the label.
std::string bar_line(const std::string& label, const std::string& status, std::size_t done, std::size_t total) {
  constexpr std::size_t kWidth = 30;
  const std::size_t filled = total ? kWidth * std::min(done, total) / total : kWidth;
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::string line = "\r";
  line.append(status, 0, label.size());
  line += " [";
  line += bar;
  line += "]";
  line.append(status, label.size() + 1);
  line += "\033[K";
  return line;
}

}  // namespace

void Progress::draw_bar(std::size_t done) {
  std::fputs(bar_line(label_, status(done, false), done, total_).c_str(), stderr);
  std::fflush(stderr);
}

void Progress::print_line(std::size_t done, bool final) {
  last_draw_ = std::chrono::steady_clock::now();
  last_items_ = done / text_.ticks_per_item;
  std::fprintf(stderr, "%s\n", status(done, final).c_str());
  std::fflush(stderr);
}

void Progress::heartbeat() {
  std::unique_lock lock(mu_);
  while (!finished_) {
    const auto due = last_draw_ + period_;
    if (wake_.wait_until(lock, due, [this] { return finished_; })) break;
    if (std::chrono::steady_clock::now() >= last_draw_ + period_) print_line(done_.load(), false);
  }
}

void Progress::finish() {
  {
    std::lock_guard lock(mu_);
    if (finished_) return;
    finished_ = true;
    if (mode_ == ProgressMode::kBar) {
      // The bar stays; when everything ran, the time becomes the total ("done in 1 min 52 s").
      const std::size_t done = done_.load();
      std::fputs(bar_line(label_, status(done, done >= total_), done, total_).c_str(), stderr);
      std::fputc('\n', stderr);
    } else if (mode_ == ProgressMode::kLines) {
      print_line(done_.load(), done_.load() >= total_);
    }
  }
  wake_.notify_all();
  if (timer_.joinable()) timer_.join();
}

}  // namespace qeval::base
