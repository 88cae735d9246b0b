// Atomic file output: a reader never sees a half-written report.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace qeval::reports {

// Writes `content` to `path` through a temporary file in the same folder, flushed and renamed
// over the target. Throws InputError naming the path on failure (an unwritable output location
// is for the user to fix); the target is then untouched.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

// RFC 4648 base64, for data: URIs.
std::string base64(std::string_view bytes);

}  // namespace qeval::reports
