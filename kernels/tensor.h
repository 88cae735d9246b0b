// Tensor: a dense, row-major, 64-byte-aligned n-d array with a runtime element type, in host
// memory (its own, or borrowed read-only: BorrowedMemory, a mapped weights file) or in a device's
// memory (DeviceMemory: the CUDA backend's, eval/exec/cuda/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qeval {

enum class DType : std::uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kFloat8E4M3FN,
  kFloat8E5M2,
  kFloat8E4M3FNUZ,
  kFloat8E5M2FNUZ,
  kInt8,
  kUInt8,
  kInt16,
  kUInt16,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kBool,
};

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct dtype_of<std::int8_t> {
  static constexpr DType value = DType::kInt8;
};
template <>
struct dtype_of<std::uint8_t> {
  static constexpr DType value = DType::kUInt8;
};
template <>
struct dtype_of<std::int16_t> {
  static constexpr DType value = DType::kInt16;
};
template <>
struct dtype_of<std::uint16_t> {
  static constexpr DType value = DType::kUInt16;
};
template <>
struct dtype_of<std::uint32_t> {
  static constexpr DType value = DType::kUInt32;
};
template <>
struct dtype_of<std::uint64_t> {
  static constexpr DType value = DType::kUInt64;
};
template <>
struct dtype_of<std::int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct dtype_of<std::int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::kBool;
};

using Shape = std::vector<std::int64_t>;

// "[1, 3, 64, 64]", for error messages.
std::string shape_to_string(const Shape& shape);
// Product of the dimensions; throws std::invalid_argument on a negative dimension or overflow.
std::int64_t shape_numel(const Shape& shape);
// The same without throwing: nullopt on a negative dimension or when the product overflows int64
// (callers checking user input turn that into an InputError that names the tensor).
std::optional<std::int64_t> try_shape_numel(const Shape& shape);
// Bytes of `numel` elements of `dtype`, or nullopt when that overflows size_t.
std::optional<std::size_t> try_nbytes(DType dtype, std::int64_t numel);

// A device's memory, as a tensor that lives there uses it. The kernels library knows only this
// interface; a device backend implements it (eval/exec/cuda/). Copies are ordered with the
// device's work: to_host returns once the bytes are in host memory.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual std::string name() const = 0;  // "cuda:0"
  // `bytes` (> 0) of device memory, zeroed; std::bad_alloc when the device has not that much free.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void to_device(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;  // device to device
  // Returns once the device has done all the work given to it (timing, profiling).
  virtual void synchronize() {}
};

// Host memory that tensors read without owning it, kept alive by whoever holds this (a read-only
// mapping of a weights file: base/mapped_file.h). The kernels library knows only this interface.
class BorrowedMemory {
 public:
  virtual ~BorrowedMemory() = default;
  // The pages wholly inside [p, p + bytes) leave this process's resident memory; read again, they
  // come back with the same bytes (a file mapping reads them from the file again).
  virtual void release_pages(const std::byte* p, std::size_t bytes) const noexcept = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // Zero-initialised tensor of the given type and shape, in host memory or, with `device`, in
  // that device's memory.
  Tensor(DType dtype, Shape shape);
  Tensor(DType dtype, Shape shape, std::shared_ptr<DeviceMemory> device);

  // A tensor over host memory that `owner` keeps alive and nobody writes (a weight in a mapped
  // file: nothing is copied). `data` must be 64-byte aligned. Copies share that memory; mutable
  // access (raw(), data<T>(), span<T>() of a non-const tensor) first copies it into memory of the
  // tensor's own, so a borrowed tensor behaves as any other, only const reads are free.
  static Tensor borrowed(DType dtype, Shape shape, const std::byte* data, std::shared_ptr<const BorrowedMemory> owner);

  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t dim(int i) const;
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  bool empty() const { return numel_ == 0; }

  // Host memory; std::logic_error for a tensor on a device (host code never reads device
  // memory by mistake).
  std::byte* raw() {
    if (device_) on_device_error();
    if (borrowed_) own();
    return data_.get();
  }
  const std::byte* raw() const {
    if (device_) on_device_error();
    return data_.get();
  }

  // Where the bytes live: null for host memory.
  const std::shared_ptr<DeviceMemory>& device() const { return device_; }
  bool on_device() const { return device_ != nullptr; }
  // The bytes on the device (device kernels); std::logic_error for a tensor in host memory.
  void* device_data();
  const void* device_data() const;
  // A copy in host memory, or on `device` (either way round; a copy also when already there).
  Tensor to_host() const;
  Tensor to_device(const std::shared_ptr<DeviceMemory>& device) const;

  // Typed access to host memory; throws std::logic_error when T does not match dtype() or the
  // tensor is on a device.
  template <class T>
  T* data() {
    check_type(dtype_of<T>::value);
    return reinterpret_cast<T*>(raw());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>::value);
    return reinterpret_cast<const T*>(raw());
  }
  template <class T>
  std::span<T> span() {
    return {data<T>(), static_cast<std::size_t>(numel_)};
  }
  template <class T>
  std::span<const T> span() const {
    return {data<T>(), static_cast<std::size_t>(numel_)};
  }

  // Same data, new shape with the same element count (-1 infers one dimension).
  Tensor reshaped(Shape shape) const;

  // Bytes of storage owned (may exceed nbytes() after reuse_as; 0 while borrowed).
  std::size_t capacity() const { return capacity_; }
  // Gives this storage a new type and shape without reallocating, when it fits (buffer reuse in
  // the executor). The contents are left as they were: the new owner must write every element.
  // Never for a borrowed tensor.
  bool reuse_as(DType dtype, const Shape& shape);

  // Whether the bytes are borrowed (Tensor::borrowed), not the tensor's own.
  bool is_borrowed() const { return borrowed_ != nullptr; }
  // A borrowed tensor's pages leave the process's resident memory (BorrowedMemory::release_pages):
  // for when a transformed copy (packed, widened, rounded) replaces the values. A later read
  // brings them back. Nothing for a tensor that owns its bytes.
  void release_pages() const;

 private:
  // Frees host memory (device null) or gives device memory back.
  struct FreeAligned {
    DeviceMemory* device;  // value-initialised (null) by unique_ptr
    bool borrowed;         // nothing to free (value-initialised false)
    void operator()(std::byte* p) const;
  };
  void check_type(DType requested) const;
  void own();  // a borrowed tensor's bytes copied into memory of its own
  [[noreturn]] void on_device_error() const;

  DType dtype_ = DType::kFloat32;
  Shape shape_;
  std::int64_t numel_ = 0;
  std::size_t capacity_ = 0;
  std::shared_ptr<DeviceMemory> device_;            // declared before data_: outlives it
  std::shared_ptr<const BorrowedMemory> borrowed_;  // non-null: data_ points into it, read-only
  std::unique_ptr<std::byte, FreeAligned> data_;
};

// float16 / bfloat16 values (stored as their bits) as a float32 tensor; any other tensor is
// returned as it is.
Tensor widened_to_float32(const Tensor& t);

}  // namespace qeval
