// The part of a run report's context every verb that writes one fills the same way.
#pragma once

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>

#include "eval/cli/command.h"
#include "eval/run/run_report_build.h"
#include "qeval/version.h"

namespace qeval::cli {

// The worker threads a run gets: --threads (a tbb::global_control limit) caps the arena's
// concurrency, which alone still says the machine's core count.
inline int worker_threads() {
  const std::size_t limit = tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  return int(std::min<std::size_t>(std::size_t(tbb::this_task_arena::max_concurrency()), limit));
}

// Tool version, time of creation, command line and device; callers add threads and shard where they apply.
inline eval::ReportContext report_context(const Context& ctx) {
  eval::ReportContext rc;
  rc.tool_version = QEVAL_VERSION;
  rc.created_utc = utc_now();
  rc.command_line = ctx.command_line;
  rc.device = std::string(eval::default_backend()->name());
  return rc;
}

}  // namespace qeval::cli
