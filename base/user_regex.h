// Regular expressions that users write (a gate's layer 'nodes', a recipe's 'exclude' patterns),
// compiled with limits that keep std::regex's recursive-descent compiler off the end of the stack.
#pragma once

#include <regex>
#include <string>

namespace qeval::base {

// libstdc++ compiles a pattern recursively, one level per term and per group: 100000 plain
// characters or 30000 nested groups overflowed the stack (SIGSEGV; found writing the gate fuzz
// target). Patterns of node names are short; these bounds leave them room.
inline constexpr std::size_t kMaxUserRegexLength = 4096;
inline constexpr int kMaxUserRegexNesting = 256;

// Compiles `pattern` as ECMAScript. Throws std::regex_error for an invalid pattern and for one
// past the bounds above (its what() says which); callers turn it into an InputError naming the key.
std::regex compile_user_regex(const std::string& pattern);

}  // namespace qeval::base
