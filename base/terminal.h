// How wide stdout is: the width summaries are laid out for.
#pragma once

#include <cstddef>

namespace qeval::base {

// COLUMNS when set to a whole number >= 40; else the terminal's width when stdout is a terminal;
// else 100 (pipes and CI logs).
std::size_t stdout_columns();

}  // namespace qeval::base
