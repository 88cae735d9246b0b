// The part of a run report's context every verb that writes one fills the same way.
#pragma once


#include <algorithm>

#include "eval/cli/command.h"
#include "eval/run/run_report_build.h"
#include "kernels/threads.h"
#include "qeval/version.h"

namespace qeval::cli {

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
