// Small helpers for tests of bad input: the message an InputError carries, and substring checks.
#pragma once

#include <string>

#include "kernels/error.h"

namespace qeval::testing {

// The message of the InputError that `f` throws ("" when it throws nothing; any other exception
// propagates and fails the test).
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace qeval::testing
