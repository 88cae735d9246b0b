// stdout's width from COLUMNS or the terminal (TIOCGWINSZ).
#include "base/terminal.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <string_view>

namespace qeval::base {

std::size_t stdout_columns() {
  constexpr std::size_t kMin = 40, kDefault = 100;
  if (const char* env = std::getenv("COLUMNS")) {
    const std::string_view text(env);
    std::size_t v = 0;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec == std::errc() && ptr == text.data() + text.size() && v >= kMin) return v;
  }
  winsize ws{};
  if (::isatty(STDOUT_FILENO) == 1 && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= kMin)
    return ws.ws_col;
  return kDefault;
}

}  // namespace qeval::base
