// A buffer pool that bounds its host memory (eval/exec/plan.h's BufferPool says how and at what
// cost), for SessionOptions::pool: the evaluator's single-model workers, whose 1024x1024 runs are
// where activation memory decides the peak.
#pragma once

#include <memory>

namespace qeval::eval {

class BufferPool;
std::shared_ptr<BufferPool> make_bounded_pool();
// Frees `pool`'s free host buffers when they pass `max_free_bytes` (device buffers stay).
void trim_free_host_buffers(BufferPool& pool, std::size_t max_free_bytes);

}  // namespace qeval::eval
