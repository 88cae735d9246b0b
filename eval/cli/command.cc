#include "eval/cli/command.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <system_error>

#include "kernels/error.h"

namespace qeval::cli {
namespace {
std::vector<RegisteredCommand>& table() {
  static std::vector<RegisteredCommand> commands;  // filled by static initializers
  return commands;
}
}  // namespace

bool register_command(int order, Adder add) {
  table().push_back({order, add});
  return true;
}

const std::vector<RegisteredCommand>& registered_commands() {
  auto& t = table();
  std::stable_sort(t.begin(), t.end(),
                   [](const RegisteredCommand& a, const RegisteredCommand& b) { return a.order < b.order; });
  return t;
}

CLI::Validator whole_number_at_least(std::int64_t min) {
  const std::string expected = "expected a whole number >= " + std::to_string(min);
  return CLI::Validator(
      [min, expected](std::string& text) -> std::string {
        std::int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc::result_out_of_range)
          return "'" + text + "' is too large (" + expected + " that fits an int)";
        if (text.empty() || ec != std::errc() || ptr != end)
          return "'" + text + "' is not a whole number (" + expected + ")";
        if (v < min) return text + " is too small (" + expected + ")";
        if (v > std::numeric_limits<int>::max())
          return "'" + text + "' is too large (" + expected + " that fits an int)";
        return {};
      },
      "INT>=" + std::to_string(min));
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(v))
          return "'" + text + "' is not a number (expected a number > 0)";
        if (!(v > 0)) return text + " is too small (expected a number > 0)";
        return {};
      },
      "NUMBER>0");
}

void print_deprecation(const std::string& verb, const std::string& old_spelling, const std::string& new_spelling) {
  std::fprintf(stderr, "qeval %s: %s is deprecated: use %s (same meaning; the old spelling goes in a later release)\n",
               verb.c_str(), old_spelling.c_str(), new_spelling.c_str());
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace qeval::cli
