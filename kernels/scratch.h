// Per-thread scratch buffers that kernels reuse from call to call for task-local temporaries
// (packed panels, im2col blocks): allocating them per task costs fresh pages from the OS, whose
// faults cost more than the work they hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace qeval::kernels {

// One buffer per (thread, slot), at least n floats, 64-byte aligned, contents undefined. A task may
// use a slot only while it does not wait on other tasks (no nested parallel loop between taking
// and last using the buffer): a waiting thread may run another task that takes the same slot.
enum class ScratchSlot { kGemmA, kGemmB, kConvA, kConvB, kInt8Rows, kCount };
float* thread_scratch(ScratchSlot slot, std::size_t n);

// Bytes held by this thread's spare lent objects (every Lent<T> type; their capacity_bytes() when
// given back): what a model's runs keep of temporaries between ops.
std::size_t thread_lent_bytes();
namespace detail {
std::size_t& thread_lent_bytes_counter();
}

// An object of type T (which has capacity_bytes()) lent from this thread's spares for the lent
// object's lifetime, given back to them after: every op a thread runs shares one buffer of a kind
// (an op keeping its own temporaries across runs held them for every layer: ~1 GB of padded conv
// inputs and several GB of int8 im2col matrices on a 1024x1024 model). Unlike thread_scratch, the
// scope may wait on other tasks (nested parallel loops): a task the waiting thread runs meanwhile is
// lent another object. Contents are undefined (the last user's). `args` construct a new one when
// this thread has no spare.
template <class T>
class Lent {
 public:
  template <class... Args>
  explicit Lent(Args&&... args) {
    auto& s = spares();
    if (s.empty()) {
      p_ = std::make_unique<T>(std::forward<Args>(args)...);
      return;
    }
    p_ = std::move(s.back());
    s.pop_back();
    detail::thread_lent_bytes_counter() -= p_->capacity_bytes();
  }
  ~Lent() {
    detail::thread_lent_bytes_counter() += p_->capacity_bytes();
    spares().push_back(std::move(p_));
  }
  Lent(const Lent&) = delete;
  Lent& operator=(const Lent&) = delete;
  T& operator*() const { return *p_; }
  T* operator->() const { return p_.get(); }
  T* get() const { return p_.get(); }

 private:
  static std::vector<std::unique_ptr<T>>& spares() {
    thread_local std::vector<std::unique_ptr<T>> s;
    return s;
  }
  std::unique_ptr<T> p_;
};

// An int32 buffer for Lent (accumulators of integer kernels).
struct Int32Scratch {
  std::vector<std::int32_t> values;
  std::size_t capacity_bytes() const { return values.capacity() * sizeof(std::int32_t); }
};

}  // namespace qeval::kernels
