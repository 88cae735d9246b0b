// Progress on stderr for every long verb: a bar with ETA on a terminal, periodic one-line reports
// with counts and ETA elsewhere (CI logs), or nothing (`--progress auto|bar|lines|none`). Safe to
// tick from many threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace qeval::base {

enum class ProgressMode {
  kAuto,   // kBar when stderr is a terminal, else kLines
  kBar,    // one line redrawn in place (\r), ~10 times a second
  kLines,  // a line every period, at finished items (at most one a period), and at the end
  kNone,
};
std::optional<ProgressMode> parse_progress_mode(std::string_view text);  // "auto", "bar", "lines", "none"
inline constexpr std::string_view kProgressModeNames = "auto, bar, lines, none";

struct ProgressSettings {
  ProgressMode mode = ProgressMode::kNone;
  std::chrono::milliseconds period{10000};  // kLines: the longest silence
};

// The process's settings: `main` sets them once from --progress (and QEVAL_PROGRESS_PERIOD_MS)
// before a verb runs, like the default backend; libraries and tests that never set them print
// nothing. Every Progress reads them when it is made.
void set_progress_settings(const ProgressSettings& settings);
ProgressSettings progress_settings();

// How a count reads: "3/8 units, 2 variants". `ticks_per_item` ticks finish one item (a unit's
// denoising steps); ETA is from ticks.
struct ProgressText {
  ProgressText(std::string noun_ = "done", std::size_t ticks_per_item_ = 1, std::string detail_ = {})
      : noun(std::move(noun_)), ticks_per_item(ticks_per_item_), detail(std::move(detail_)) {}
  std::string noun;
  std::size_t ticks_per_item;
  std::string detail;  // after the count: "2 variants"
};

class Progress {
 public:
  // enabled: whether the caller wants progress at all (false: nothing, whatever the settings).
  Progress(std::string label, std::size_t total_ticks, bool enabled, ProgressText text = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void tick();
  void finish();

 private:
  std::string status(std::size_t done, bool final) const;  // "run: 3/8 units, ..., ETA 1 min 10 s"
  void draw_bar(std::size_t done);
  void print_line(std::size_t done, bool final);
  void heartbeat();

  std::string label_;
  std::size_t total_;
  ProgressText text_;
  ProgressMode mode_ = ProgressMode::kNone;  // resolved: kBar, kLines or kNone
  std::chrono::milliseconds period_;
  std::atomic<std::size_t> done_{0};
  std::mutex mu_;
  std::condition_variable wake_;
  bool finished_ = false;
  std::size_t last_items_ = 0;  // kLines: items reported by the last line
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::thread timer_;  // kLines: prints when nothing was printed for a period
};

bool stderr_is_terminal();

// "41 s", "1 min 10 s", "2 h 5 min".
std::string format_duration(double seconds);

}  // namespace qeval::base
