// compile_user_regex: bounds checked before std::regex compiles a pattern a user wrote.
#include "base/user_regex.h"

#include <algorithm>

namespace qeval::base {

namespace {

// std::regex_error carries only a code; the reason goes in the message through this subclass.
class RegexLimitError : public std::regex_error {
 public:
  explicit RegexLimitError(std::string what)
      : std::regex_error(std::regex_constants::error_complexity), what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

// Deepest nesting of groups, skipping escaped characters and bracket expressions.
int group_nesting(const std::string& p) {
  int depth = 0, deepest = 0;
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      ++i;
    } else if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
    } else if (c == '(') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ')') {
      depth = std::max(0, depth - 1);
    }
  }
  return deepest;
}

}  // namespace

std::regex compile_user_regex(const std::string& pattern) {
  if (pattern.size() > kMaxUserRegexLength)
    throw RegexLimitError("longer than " + std::to_string(kMaxUserRegexLength) + " characters (" +
                          std::to_string(pattern.size()) + ")");
  if (const int n = group_nesting(pattern); n > kMaxUserRegexNesting)
    throw RegexLimitError("groups nested " + std::to_string(n) + " deep (at most " +
                          std::to_string(kMaxUserRegexNesting) + ")");
  return std::regex(pattern, std::regex::ECMAScript);
}

}  // namespace qeval::base
