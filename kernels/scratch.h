// Per-thread scratch buffers that kernels reuse from call to call for task-local temporaries
// (packed panels, im2col blocks): allocating them per task costs fresh pages from the OS, whose
// faults cost more than the work they hold.
#pragma once

#include <cstddef>

namespace qeval::kernels {

// One buffer per (thread, slot), at least n floats, 64-byte aligned, contents undefined. A task may
// use a slot only while it does not wait on other tasks (no nested parallel loop between taking
// and last using the buffer): a waiting thread may run another task that takes the same slot.
enum class ScratchSlot { kGemmA, kConvB, kInt8Rows, kCount };
float* thread_scratch(ScratchSlot slot, std::size_t n);

}  // namespace qeval::kernels
