// stdout and stderr that never pass on bytes outside well-formed UTF-8 (a file name that is not
// UTF-8 prints as \xHH, as in JSON, HTML and JUnit), so a terminal or log shows what the name holds.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace qeval::base {

// Replaces the C streams stdout and stderr (what fmt::print and printf write to) by streams that
// write to the same descriptors through escape_invalid_utf8, with the same buffering (stdout
// line-buffered on a terminal, else fully; stderr unbuffered). A sequence cut by a buffer boundary
// is held until its next bytes come. Call once, before anything is printed.
void escape_invalid_utf8_on_stdio();

// The part of `text` to hold back at its end: the bytes of a sequence that is well-formed so far
// but incomplete (0 when `text` ends on a whole sequence or on bytes that cannot start one).
std::size_t incomplete_utf8_tail(std::string_view text);

}  // namespace qeval::base
