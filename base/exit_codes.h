// Process exit codes of every qeval verb.
#pragma once

namespace qeval::base {
inline constexpr int kExitPass = 0;        // ran, and the gate passed
inline constexpr int kExitGateFailed = 1;  // ran, and the gate failed
inline constexpr int kExitBadInput = 2;    // bad input or usage: nothing was judged
inline constexpr int kExitInternal = 3;    // a bug in qeval
}  // namespace qeval::base
