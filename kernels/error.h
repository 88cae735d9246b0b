// Error types shared by every layer: bad user input (exit code 2) versus internal faults (exit 3).
#pragma once

#include <stdexcept>
#include <string>

namespace qeval {

// Something the user gave us is wrong or unreadable: a missing file, a corrupt image, a bad option.
// The message names the file/node/tensor and what was expected; the CLI exits with code 2.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace qeval
