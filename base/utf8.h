// UTF-8 validation and a lossless display form for byte strings that are not UTF-8 (file names).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace qeval::base {

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence (overlong forms,
// surrogates and code points past U+10FFFF are ill-formed, as in RFC 3629); nullopt when `text`
// is valid UTF-8.
std::optional<std::size_t> first_invalid_utf8(std::string_view text);

// `text` unchanged when it is valid UTF-8; otherwise every byte outside a well-formed sequence is
// written as \xHH (Python's "backslashreplace"), so that a file name that is not UTF-8 can go into
// JSON, HTML and XML and still tells which bytes it holds.
std::string escape_invalid_utf8(std::string_view text);

}  // namespace qeval::base
