#include "eval/cli/command.h"

#include <algorithm>
#include <ctime>
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

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace qeval::cli
