// --device: where the verbs' models execute (eval/exec/backend.h).
#pragma once

#include <memory>
#include <string>

#include "eval/exec/backend.h"

namespace qeval::cli {

// The backend for "cpu", "cuda" or "cuda:N" (the option's values). InputError for any other value,
// for cuda in a build without the CUDA backend, and for a device that is not there (the message
// says which and why).
std::shared_ptr<eval::Backend> backend_for_device(const std::string& device);

}  // namespace qeval::cli
