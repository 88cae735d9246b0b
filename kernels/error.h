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

// A valid model uses something qeval does not implement (an op configuration, a data type, a
// dynamic shape). Also exit code 2, but tools can tell "unsupported" from "broken".
class UnsupportedError : public InputError {
 public:
  using InputError::InputError;
};

}  // namespace qeval
