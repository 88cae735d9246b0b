// The threads a parallel loop may use.
#pragma once

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstddef>

namespace qeval::kernels {

// The arena's concurrency within a tbb::global_control limit: `--threads N` sets the limit and
// leaves the arena as wide as the machine, so the arena alone still says the core count.
inline int worker_threads() {
  const std::size_t limit = tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  return int(std::min<std::size_t>(std::size_t(tbb::this_task_arena::max_concurrency()), limit));
}

}  // namespace qeval::kernels
