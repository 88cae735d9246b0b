// Tensor storage, shapes and element types.
#include "kernels/tensor.h"

#include "kernels/numeric.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace qeval {

namespace {
constexpr std::size_t kAlignment = 64;

// Zeroed unless the caller overwrites every byte at once (a copy). An empty tensor gets a block
// too: memcpy/memset of its 0 bytes must not be passed a null pointer (undefined behaviour,
// reported by UBSan when the fuzz target ran a model with a [0, 3, 4] input).
std::byte* allocate_aligned(std::size_t nbytes, bool zero = true) {
  if (nbytes == 0) nbytes = 1;
  std::size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) throw std::bad_alloc();
  if (zero) std::memset(p, 0, rounded);
  else if (rounded > nbytes) std::memset(static_cast<std::byte*>(p) + nbytes, 0, rounded - nbytes);
  return static_cast<std::byte*>(p);
}
}  // namespace

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat8E4M3FN: return 1;
    case DType::kFloat8E5M2: return 1;
    case DType::kFloat8E4M3FNUZ: return 1;
    case DType::kFloat8E5M2FNUZ: return 1;
    case DType::kInt8: return 1;
    case DType::kUInt8: return 1;
    case DType::kInt16: return 2;
    case DType::kUInt16: return 2;
    case DType::kInt32: return 4;
    case DType::kUInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt64: return 8;
    case DType::kBool: return 1;
  }
  throw std::logic_error("dtype_size: unknown dtype");
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat8E4M3FN: return "float8e4m3fn";
    case DType::kFloat8E5M2: return "float8e5m2";
    case DType::kFloat8E4M3FNUZ: return "float8e4m3fnuz";
    case DType::kFloat8E5M2FNUZ: return "float8e5m2fnuz";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kUInt16: return "uint16";
    case DType::kInt32: return "int32";
    case DType::kUInt32: return "uint32";
    case DType::kInt64: return "int64";
    case DType::kUInt64: return "uint64";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::optional<std::int64_t> try_shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d) return std::nullopt;
    n *= d;
  }
  return n;
}

std::optional<std::size_t> try_nbytes(DType dtype, std::int64_t numel) {
  const std::size_t es = dtype_size(dtype);
  if (numel < 0 || static_cast<std::uint64_t>(numel) > std::numeric_limits<std::size_t>::max() / es)
    return std::nullopt;
  return static_cast<std::size_t>(numel) * es;
}

std::int64_t shape_numel(const Shape& shape) {
  if (auto n = try_shape_numel(shape)) return *n;
  for (std::int64_t d : shape)
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_to_string(shape));
  throw std::invalid_argument("shape " + shape_to_string(shape) + " has too many elements");
}

void Tensor::FreeAligned::operator()(std::byte* p) const {
  if (borrowed) return;
  if (device) device->release(p);
  else std::free(p);
}

Tensor Tensor::borrowed(DType dtype, Shape shape, const std::byte* data, std::shared_ptr<const BorrowedMemory> owner) {
  if (!owner || !data) throw std::invalid_argument("Tensor::borrowed: no memory given");
  if (reinterpret_cast<std::uintptr_t>(data) % kAlignment != 0)
    throw std::invalid_argument("Tensor::borrowed: the memory is not 64-byte aligned");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  t.borrowed_ = std::move(owner);
  // Only ever read through const access (own() copies first), so the const_cast never writes.
  t.data_ = std::unique_ptr<std::byte, FreeAligned>(const_cast<std::byte*>(data), FreeAligned{nullptr, true});
  return t;
}

void Tensor::own() {
  std::unique_ptr<std::byte, FreeAligned> mine(allocate_aligned(nbytes(), /*zero=*/false));
  if (numel_) std::memcpy(mine.get(), data_.get(), nbytes());
  data_ = std::move(mine);
  borrowed_.reset();
  capacity_ = nbytes();
}

void Tensor::release_pages() const {
  if (borrowed_) borrowed_->release_pages(data_.get(), nbytes());
}

Tensor::Tensor(DType dtype, Shape shape)
    : dtype_(dtype),
      shape_(std::move(shape)),
      numel_(shape_numel(shape_)),
      capacity_(nbytes()),
      data_(allocate_aligned(nbytes())) {}

Tensor::Tensor(DType dtype, Shape shape, std::shared_ptr<DeviceMemory> device)
    : dtype_(dtype), shape_(std::move(shape)), numel_(shape_numel(shape_)), capacity_(nbytes()) {
  if (!device) {
    data_.reset(allocate_aligned(nbytes()));
    return;
  }
  device_ = std::move(device);
  // A block for empty tensors too, as on the host (a null device pointer means "no storage").
  data_ = std::unique_ptr<std::byte, FreeAligned>(static_cast<std::byte*>(device_->allocate(std::max<std::size_t>(nbytes(), 1))),
                                                  FreeAligned{device_.get()});
}

Tensor::Tensor(const Tensor& other)
    : dtype_(other.dtype_), shape_(other.shape_), numel_(other.numel_), capacity_(other.nbytes()) {
  if (other.device_) {
    *this = Tensor(dtype_, shape_, other.device_);
    if (numel_) device_->copy(data_.get(), other.data_.get(), nbytes());
    return;
  }
  if (other.borrowed_) {  // shared: neither writes it (raw() copies first)
    capacity_ = 0;
    borrowed_ = other.borrowed_;
    data_ = std::unique_ptr<std::byte, FreeAligned>(other.data_.get(), FreeAligned{nullptr, true});
    return;
  }
  data_.reset(allocate_aligned(other.nbytes(), /*zero=*/false));
  if (numel_) std::memcpy(data_.get(), other.data_.get(), nbytes());
}

Tensor::Tensor(Tensor&& other) noexcept
    : dtype_(other.dtype_),
      shape_(std::move(other.shape_)),
      numel_(other.numel_),
      capacity_(other.capacity_),
      device_(std::move(other.device_)),
      borrowed_(std::move(other.borrowed_)),
      data_(std::move(other.data_)) {
  other.shape_.clear();
  other.numel_ = 0;
  other.capacity_ = 0;
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    dtype_ = other.dtype_;
    shape_ = std::move(other.shape_);
    numel_ = other.numel_;
    capacity_ = other.capacity_;
    data_.reset();  // before device_ may change: it frees with the old device
    device_ = std::move(other.device_);
    borrowed_ = std::move(other.borrowed_);
    data_ = std::move(other.data_);
    other.shape_.clear();
    other.numel_ = 0;
    other.capacity_ = 0;
  }
  return *this;
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = Tensor(other);
  return *this;
}

std::int64_t Tensor::dim(int i) const {
  int r = rank();
  if (i < 0) i += r;
  if (i < 0 || i >= r)
    throw std::out_of_range("dim " + std::to_string(i) + " of a rank-" + std::to_string(r) + " tensor");
  return shape_[static_cast<std::size_t>(i)];
}

bool Tensor::reuse_as(DType dtype, const Shape& shape) {
  const std::int64_t n = shape_numel(shape);
  if (!data_ || borrowed_ || static_cast<std::size_t>(n) * dtype_size(dtype) > capacity_)
    return false;  // no storage yet
  dtype_ = dtype;
  if (&shape != &shape_) shape_.assign(shape.begin(), shape.end());  // in place: no allocation once the rank fits
  numel_ = n;
  return true;
}

void Tensor::on_device_error() const {
  throw std::logic_error("host access to a " + std::string(dtype_name(dtype_)) + " tensor " + shape_to_string(shape_) +
                         " on " + device_->name());
}

void* Tensor::device_data() {
  if (!device_) throw std::logic_error("device access to a tensor in host memory");
  return data_.get();
}
const void* Tensor::device_data() const {
  if (!device_) throw std::logic_error("device access to a tensor in host memory");
  return data_.get();
}

Tensor Tensor::to_host() const {
  if (!device_) return *this;
  Tensor t(dtype_, shape_);
  if (numel_) device_->to_host(t.data_.get(), data_.get(), nbytes());
  return t;
}

Tensor Tensor::to_device(const std::shared_ptr<DeviceMemory>& device) const {
  if (!device) return to_host();
  if (device_ == device) return *this;
  const Tensor host = to_host();  // from another device: through host memory
  Tensor t(dtype_, shape_, device);
  if (numel_) device->to_device(t.data_.get(), host.data_.get(), nbytes());
  return t;
}

void Tensor::check_type(DType requested) const {
  if (requested != dtype_)
    throw std::logic_error("tensor of type " + std::string(dtype_name(dtype_)) + " accessed as " +
                           std::string(dtype_name(requested)));
}

Tensor Tensor::reshaped(Shape shape) const {
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw std::invalid_argument("reshape: more than one -1 in " + shape_to_string(shape));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel_ % known != 0)
      throw std::invalid_argument("reshape: cannot infer -1 in " + shape_to_string(shape) + " for " +
                                  std::to_string(numel_) + " elements");
    shape[static_cast<std::size_t>(infer)] = numel_ / known;
  }
  if (shape_numel(shape) != numel_)
    throw std::invalid_argument("reshape: " + shape_to_string(shape_) + " to " + shape_to_string(shape) +
                                " changes the element count");
  Tensor t(*this);
  t.shape_ = std::move(shape);
  return t;
}

Tensor widened_to_float32(const Tensor& t) {
  if (t.dtype() != DType::kFloat16 && t.dtype() != DType::kBFloat16) return t;
  Tensor out(DType::kFloat32, t.shape());
  const auto* bits = reinterpret_cast<const std::uint16_t*>(t.raw());
  float* v = out.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    v[i] = t.dtype() == DType::kFloat16 ? to_float(float16{bits[i]}) : to_float(bfloat16{bits[i]});
  return out;
}

}  // namespace qeval
