// .npy reading and writing: the preamble, a hand-written scanner for the header's dict literal,
// dtype mapping, byte-order/bool/Fortran-order fix-ups and numpy's exact header layout.
#include "datasets/npy.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string_view>
#include <system_error>

#include "base/files.h"
#include "base/input_file.h"
#include "kernels/error.h"

namespace qeval::datasets {
namespace {

constexpr std::array<std::uint8_t, 6> kMagic = {0x93, 'N', 'U', 'M', 'P', 'Y'};
// Magic, two version bytes and a 4-byte (version 2.0/3.0) header length: reading the first this
// many bytes of a file is enough to know how long its header is.
constexpr std::size_t kMaxPreambleBytes = 12;
// Legitimate headers are a few hundred bytes; a larger length field means a corrupt or hostile file,
// and we refuse before allocating for it.
constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{1} << 20;
// numpy pads the header so the data starts on a 64-byte boundary (lets readers mmap any dtype).
constexpr std::size_t kArrayAlign = 64;
// numpy >= 1.24 leaves this many digits of room after the shape so the growth axis can be rewritten
// in place; copying it makes our files byte-identical to np.save's.
constexpr std::size_t kGrowthAxisMaxDigits = 21;

static_assert(sizeof(bool) == 1, "bool tensors are stored as one byte per element, like numpy's");

// Bytes as text for error messages: printable ASCII kept, everything else as \xNN.
std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string_view as_chars(std::span<const std::uint8_t> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

struct Preamble {
  int major = 0;
  int minor = 0;
  std::uint64_t header_offset = 0;  // where the dict text starts
  std::uint64_t header_len = 0;
};

// `first` holds the file's first min(size, kMaxPreambleBytes) bytes (or more); `total_size` is the
// whole file's size, so a length field pointing past the end is caught before anything is read.
Preamble read_preamble(std::span<const std::uint8_t> first, std::uint64_t total_size, const std::string& name) {
  if (total_size == 0) throw InputError(name + ": file is empty, expected a .npy file");
  const std::size_t n = std::min(first.size(), kMagic.size());
  if (!std::equal(first.begin(), first.begin() + static_cast<std::ptrdiff_t>(n), kMagic.begin()))
    throw InputError(name + ": not a .npy file (bad magic: expected \"\\x93NUMPY\", found \"" +
                     printable(as_chars(first.first(n))) + "\")");
  if (first.size() < 8)
    throw InputError(name + ": truncated .npy file: " + std::to_string(total_size) +
                     " bytes, too short for the magic string and version");
  Preamble p;
  p.major = first[6];
  p.minor = first[7];
  if (p.minor != 0 || p.major < 1 || p.major > 3)
    throw InputError(name + ": unsupported .npy format version " + std::to_string(p.major) + "." +
                     std::to_string(p.minor) + " (expected 1.0, 2.0 or 3.0)");
  const std::size_t len_bytes = p.major == 1 ? 2 : 4;
  if (first.size() < 8 + len_bytes)
    throw InputError(name + ": truncated .npy file: " + std::to_string(total_size) +
                     " bytes, too short for the header length field of version " + std::to_string(p.major) + ".0");
  for (std::size_t i = 0; i < len_bytes; ++i) p.header_len |= std::uint64_t{first[8 + i]} << (8 * i);
  p.header_offset = 8 + len_bytes;
  if (p.header_len > kMaxHeaderBytes)
    throw InputError(name + ": .npy header length " + std::to_string(p.header_len) +
                     " bytes exceeds the 1 MiB limit (corrupt file?)");
  if (total_size < p.header_offset + p.header_len)
    throw InputError(name + ": truncated .npy header: the length field says " + std::to_string(p.header_len) +
                     " bytes, only " + std::to_string(total_size - p.header_offset) + " present");
  return p;
}

struct HeaderDict {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// Scans the header, a Python dict literal such as {'descr': '<f4', 'fortran_order': False,
// 'shape': (2, 3), }. It accepts what Python's literal syntax allows for these three keys (any
// order, any whitespace, optional trailing commas, either quote) and nothing else; it never
// recurses, so no input can exhaust the stack.
class HeaderScanner {
 public:
  HeaderScanner(std::string_view text, const std::string& name, bool allow_long_suffix)
      : s_(text), name_(name), allow_long_suffix_(allow_long_suffix) {}

  HeaderDict parse() {
    HeaderDict d;
    bool have_descr = false, have_fortran = false, have_shape = false;
    if (!consume('{')) fail("expected '{' to open the header dict");
    while (!peek('}')) {
      if (pos_ >= s_.size()) fail("unterminated dict: expected '}'");
      if (!peek('\'') && !peek('"')) fail("expected a quoted key or '}'");
      const std::size_t key_pos = pos_;
      const std::string key = parse_string();
      if (!consume(':')) fail("expected ':' after key '" + printable(key) + "'");
      auto once = [&](bool& seen) {
        if (seen) {
          pos_ = key_pos;
          fail("duplicate key '" + key + "'");
        }
        seen = true;
      };
      if (key == "descr") {
        once(have_descr);
        if (peek('['))
          throw InputError(name_ +
                           ": unsupported dtype: structured arrays (a 'descr' list of "
                           "fields) are not supported");
        if (!peek('\'') && !peek('"')) fail("expected a quoted string for 'descr'");
        d.descr = parse_string();
      } else if (key == "fortran_order") {
        once(have_fortran);
        d.fortran_order = parse_bool();
      } else if (key == "shape") {
        once(have_shape);
        d.shape = parse_shape();
      } else {
        pos_ = key_pos;
        fail("unexpected key '" + printable(key) +
             "' (a .npy header has exactly 'descr', 'fortran_order' and 'shape')");
      }
      if (consume(',')) continue;
      if (!peek('}')) fail("expected ',' or '}' after the value of '" + key + "'");
    }
    consume('}');
    skip_space();
    if (pos_ != s_.size()) fail("unexpected text after the closing '}'");
    for (auto [seen, key] :
         {std::pair{have_descr, "descr"}, std::pair{have_fortran, "fortran_order"}, std::pair{have_shape, "shape"}})
      if (!seen)
        throw InputError(name_ + ": malformed .npy header: missing key '" + key + "' in \"" +
                         printable(s_.substr(0, 200)) + "\"");
    return d;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    // numpy pads the dict with spaces up to 64 bytes; showing them would only hide the quote.
    std::string_view shown = s_;
    while (!shown.empty() && (shown.back() == ' ' || shown.back() == '\n')) shown.remove_suffix(1);
    const std::size_t from = pos_ > 40 ? pos_ - 40 : 0;
    const std::string_view near = shown.substr(std::min(from, shown.size()), 80);
    throw InputError(name_ + ": malformed .npy header: " + what + " at offset " + std::to_string(pos_) +
                     " of the header, near \"" + printable(near) + "\"");
  }

  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r' ||
                                s_[pos_] == '\f' || s_[pos_] == '\v'))
      ++pos_;
  }
  bool peek(char c) {
    skip_space();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  bool consume(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  static bool is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
  }

  // A single- or double-quoted Python string (caller checked the opening quote).
  std::string parse_string() {
    const char quote = s_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= s_.size() || s_[pos_] == '\n') fail("unterminated string");
      char c = s_[pos_++];
      if (c == quote) return out;
      if (c == '\\') {
        if (pos_ >= s_.size()) fail("unterminated string");
        const char e = s_[pos_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case '\\':
          case '\'':
          case '"': c = e; break;
          default:
            out += '\\';
            c = e;
            break;  // Python keeps unknown escapes verbatim
        }
      }
      out += c;
    }
  }

  bool parse_bool() {
    skip_space();
    for (auto [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (s_.substr(pos_).starts_with(word) &&
          (pos_ + word.size() == s_.size() || !is_word_char(s_[pos_ + word.size()]))) {
        pos_ += word.size();
        return value;
      }
    }
    fail("expected True or False for 'fortran_order'");
  }

  Shape parse_shape() {
    if (peek('[')) fail("expected a tuple for 'shape', found a list");
    if (!consume('(')) fail("expected a tuple such as (2, 3) for 'shape'");
    Shape dims;
    if (consume(')')) return dims;  // () is a 0-d array
    bool saw_comma = false;
    while (true) {
      dims.push_back(parse_dim());
      if (consume(',')) {
        saw_comma = true;
        if (consume(')')) break;
        continue;
      }
      if (consume(')')) {
        // In Python "(5)" is the int 5, not a tuple; numpy refuses it too.
        if (!saw_comma) fail("'shape' is a parenthesised int, not a tuple (a 1-d shape is written (5,))");
        break;
      }
      fail("expected ',' or ')' in 'shape'");
    }
    return dims;
  }

  std::int64_t parse_dim() {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '-') fail("negative dimension in 'shape'");
    if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9')
      fail("expected a non-negative integer dimension in 'shape'");
    std::int64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const int digit = s_[pos_] - '0';
      if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10)
        fail("dimension in 'shape' does not fit in 64 bits");
      v = v * 10 + digit;
      ++pos_;
    }
    // Python 2 wrote long ints as 2L; numpy still reads such version 1.0/2.0 files.
    if (allow_long_suffix_ && pos_ < s_.size() && (s_[pos_] == 'L' || s_[pos_] == 'l')) ++pos_;
    if (pos_ < s_.size() && is_word_char(s_[pos_])) fail("expected an integer dimension in 'shape'");
    return v;
  }

  std::string_view s_;
  const std::string& name_;
  bool allow_long_suffix_;
  std::size_t pos_ = 0;
};

struct ElementType {
  DType dtype;
  std::size_t size;
  std::string_view numpy_name;
};

// What a descr's type code (without byte order) maps to.
constexpr ElementType kReadable[] = {
    {DType::kFloat16, 2, "f2"}, {DType::kFloat32, 4, "f4"}, {DType::kFloat64, 8, "f8"}, {DType::kInt8, 1, "i1"},
    {DType::kUInt8, 1, "u1"},   {DType::kInt16, 2, "i2"},   {DType::kUInt16, 2, "u2"},  {DType::kInt32, 4, "i4"},
    {DType::kUInt32, 4, "u4"},  {DType::kInt64, 8, "i8"},   {DType::kUInt64, 8, "u8"},  {DType::kBool, 1, "b1"},
};

// Names for type codes numpy writes that qeval cannot hold, so the error says what the file has.
std::string_view unsupported_hint(std::string_view code) {
  static constexpr std::pair<std::string_view, std::string_view> kNames[] = {
      {"f16", "float128"}, {"f12", "float96"}, {"c8", "complex64"}, {"c16", "complex128"}, {"c32", "complex256"},
  };
  for (auto [c, n] : kNames)
    if (code == c) return n;
  if (code.starts_with("U")) return "unicode strings";
  if (code.starts_with("S") || code.starts_with("a")) return "byte strings";
  if (code.starts_with("V")) return "void/structured records";
  if (code.starts_with("M")) return "datetime64";
  if (code.starts_with("m")) return "timedelta64";
  return "";
}

struct Layout {
  DType dtype = DType::kFloat32;
  Shape shape;
  bool fortran_order = false;
  bool byteswap = false;
  std::size_t elem_size = 0;
  std::uint64_t data_offset = 0;
  std::uint64_t data_bytes = 0;
};

// Checks the dict's values against the file: dtype, element count, data length.
Layout make_layout(const HeaderDict& d, const Preamble& p, std::uint64_t total_size, const std::string& name) {
  const std::string_view descr = d.descr;
  char order = '=';
  std::string_view code = descr;
  if (!code.empty() && (code[0] == '<' || code[0] == '>' || code[0] == '|' || code[0] == '=')) {
    order = code[0];
    code.remove_prefix(1);
  }
  if (code.starts_with("O"))
    throw InputError(name + ": object arrays (dtype '" + printable(descr) +
                     "') are not supported: they hold pickled Python objects, not numbers");
  const ElementType* type = nullptr;
  for (const ElementType& t : kReadable)
    if (code == t.numpy_name) type = &t;
  if (!type) {
    const std::string_view hint = unsupported_hint(code);
    throw InputError(name + ": unsupported dtype '" + printable(descr) + "'" +
                     (hint.empty() ? "" : " (" + std::string(hint) + ")") +
                     "; qeval reads f2, f4, f8, i1, u1, i2, u2, i4, u4, i8, u8 and b1");
  }
  Layout l;
  l.dtype = type->dtype;
  l.elem_size = type->size;
  l.shape = d.shape;
  l.fortran_order = d.fortran_order;
  const bool file_little = order == '<' || (order != '>' && std::endian::native == std::endian::little);
  l.byteswap = l.elem_size > 1 && file_little != (std::endian::native == std::endian::little);

  std::uint64_t numel = 1;
  for (std::int64_t dim : l.shape) {
    const auto udim = static_cast<std::uint64_t>(dim);
    if (udim != 0 && numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / udim)
      throw InputError(name + ": shape " + shape_to_string(l.shape) +
                       " has too many elements (the element count overflows 64 bits)");
    numel *= udim;
  }
  if (numel > std::numeric_limits<std::uint64_t>::max() / l.elem_size ||
      numel * l.elem_size > static_cast<std::uint64_t>(std::numeric_limits<std::ptrdiff_t>::max()))
    throw InputError(name + ": shape " + shape_to_string(l.shape) +
                     " has too many elements (its byte size overflows 64 bits)");
  l.data_bytes = numel * l.elem_size;
  l.data_offset = p.header_offset + p.header_len;
  const std::uint64_t present = total_size - l.data_offset;
  const std::string what = "shape " + shape_to_string(l.shape) + " of '" + printable(descr) + "' needs " +
                           std::to_string(l.data_bytes) + " bytes of data, the file has " + std::to_string(present);
  if (present < l.data_bytes) throw InputError(name + ": truncated .npy data: " + what);
  // np.save can append several arrays to one open file; silently returning only the first would
  // hide both that and corruption.
  if (present > l.data_bytes)
    throw InputError(name + ": " + std::to_string(present - l.data_bytes) + " unexpected bytes after the .npy data: " +
                     what + " (files holding several arrays are not supported)");
  return l;
}

Layout decode_header(std::span<const std::uint8_t> header, const Preamble& p, std::uint64_t total_size,
                     const std::string& name) {
  HeaderScanner scanner(as_chars(header), name, p.major <= 2);
  return make_layout(scanner.parse(), p, total_size, name);
}

template <std::size_t N>
void byteswap_elements(std::byte* data, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) std::reverse(data + i * N, data + (i + 1) * N);
}

void byteswap_in_place(std::byte* data, std::size_t count, std::size_t elem_size) {
  switch (elem_size) {
    case 2: byteswap_elements<2>(data, count); break;
    case 4: byteswap_elements<4>(data, count); break;
    case 8: byteswap_elements<8>(data, count); break;
    default: break;
  }
}

template <std::size_t N>
void fortran_to_c(const std::byte* src, std::byte* dst, const Shape& shape) {
  // Walk the destination in C order while tracking the source offset under Fortran strides
  // (first index fastest).
  const std::size_t rank = shape.size();
  std::vector<std::int64_t> fstride(rank), idx(rank, 0);
  std::int64_t s = 1;
  for (std::size_t k = 0; k < rank; ++k) {
    fstride[k] = s;
    s *= shape[k];
  }
  const std::int64_t numel = s;
  std::int64_t off = 0;
  for (std::int64_t i = 0; i < numel; ++i) {
    std::memcpy(dst + static_cast<std::size_t>(i) * N, src + static_cast<std::size_t>(off) * N, N);
    for (std::size_t k = rank; k-- > 0;) {
      ++idx[k];
      off += fstride[k];
      if (idx[k] < shape[k]) break;
      off -= idx[k] * fstride[k];
      idx[k] = 0;
    }
  }
}

// Byte order, bool canonicalisation and Fortran order: what turns the file's bytes into a C-order
// tensor in host order.
Tensor finish(Tensor t, const Layout& l) {
  const auto n = static_cast<std::size_t>(t.numel());
  if (n == 0) return t;
  if (l.byteswap) byteswap_in_place(t.raw(), n, l.elem_size);
  if (t.dtype() == DType::kBool) {
    // A bool byte other than 0/1 is undefined behaviour in C++; numpy treats it as true.
    auto* b = reinterpret_cast<std::uint8_t*>(t.raw());
    for (std::size_t i = 0; i < n; ++i) b[i] = b[i] != 0;
  }
  if (l.fortran_order && t.rank() > 1) {
    Tensor c(t.dtype(), t.shape());
    switch (l.elem_size) {
      case 1: fortran_to_c<1>(t.raw(), c.raw(), t.shape()); break;
      case 2: fortran_to_c<2>(t.raw(), c.raw(), t.shape()); break;
      case 4: fortran_to_c<4>(t.raw(), c.raw(), t.shape()); break;
      case 8: fortran_to_c<8>(t.raw(), c.raw(), t.shape()); break;
      default: throw std::logic_error("fortran_to_c: element size " + std::to_string(l.elem_size));
    }
    return c;
  }
  return t;
}

// Little-endian descr of what we write; empty for types numpy has no dtype for.
std::string_view descr_for(DType t) {
  switch (t) {
    case DType::kFloat16: return "<f2";
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
    case DType::kInt8: return "|i1";
    case DType::kUInt8: return "|u1";
    case DType::kInt16: return "<i2";
    case DType::kUInt16: return "<u2";
    case DType::kInt32: return "<i4";
    case DType::kUInt32: return "<u4";
    case DType::kInt64: return "<i8";
    case DType::kUInt64: return "<u8";
    case DType::kBool: return "|b1";
    // numpy itself has no bfloat16 or fp8 dtypes (ml_dtypes' extensions are not readable by plain
    // numpy), so writing their bits under some other descr would mislabel the data.
    case DType::kBFloat16:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2FNUZ: return {};
  }
  return {};
}

// Magic, version, length and the padded dict, laid out exactly as numpy's _write_array_header.
std::vector<std::uint8_t> header_bytes(const Tensor& t, const std::string& name) {
  const std::string_view descr = descr_for(t.dtype());
  if (descr.empty())
    throw InputError(name + ": cannot write a " + std::string(dtype_name(t.dtype())) +
                     " tensor to .npy: numpy has no such dtype (convert it to float32 first)");
  std::string shape = "(";
  for (int i = 0; i < t.rank(); ++i) {
    if (i) shape += ", ";
    shape += std::to_string(t.shape()[static_cast<std::size_t>(i)]);
  }
  if (t.rank() == 1) shape += ",";  // Python's 1-tuple
  shape += ")";
  std::string dict = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  if (t.rank() > 0) {
    const std::size_t digits = std::to_string(t.shape()[0]).size();
    dict.append(kGrowthAxisMaxDigits - std::min(digits, kGrowthAxisMaxDigits), ' ');
  }
  const std::size_t hlen = dict.size() + 1;  // + the final '\n'
  int major = 1;
  std::size_t len_bytes = 2;
  std::size_t pad = kArrayAlign - (kMagic.size() + 2 + len_bytes + hlen) % kArrayAlign;
  if (hlen + pad > 0xFFFF) {
    major = 2;
    len_bytes = 4;
    pad = kArrayAlign - (kMagic.size() + 2 + len_bytes + hlen) % kArrayAlign;
    if (hlen + pad > 0xFFFFFFFFu)
      throw std::length_error("serialize_npy: header of " + std::to_string(hlen) + " bytes");
  }
  std::vector<std::uint8_t> out(kMagic.begin(), kMagic.end());
  out.push_back(static_cast<std::uint8_t>(major));
  out.push_back(0);
  const std::uint64_t total = hlen + pad;
  for (std::size_t i = 0; i < len_bytes; ++i) out.push_back(static_cast<std::uint8_t>(total >> (8 * i)));
  out.insert(out.end(), dict.begin(), dict.end());
  out.insert(out.end(), pad, ' ');
  out.push_back('\n');
  return out;
}

// Hands the tensor's data to `sink` in little-endian order: straight from the tensor on a
// little-endian host (no copy of a possibly large tensor), in swapped chunks otherwise.
template <class Sink>
void for_each_le_chunk(const Tensor& t, Sink&& sink) {
  const auto* data = reinterpret_cast<const std::uint8_t*>(t.raw());
  const std::size_t nbytes = t.nbytes();
  const std::size_t elem = dtype_size(t.dtype());
  if (nbytes == 0) return;
  if (std::endian::native == std::endian::little || elem == 1) {
    sink(std::span<const std::uint8_t>(data, nbytes));
    return;
  }
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  std::vector<std::uint8_t> buf;
  for (std::size_t off = 0; off < nbytes; off += kChunk) {
    const std::size_t len = std::min(kChunk, nbytes - off);
    buf.assign(data + off, data + off + len);
    byteswap_in_place(reinterpret_cast<std::byte*>(buf.data()), len / elem, elem);
    sink(std::span<const std::uint8_t>(buf));
  }
}

bool write_all(int fd, std::span<const std::uint8_t> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  return true;
}

std::string errno_text() { return std::error_code(errno, std::generic_category()).message(); }

}  // namespace

Tensor parse_npy(std::span<const std::uint8_t> bytes, const std::string& name_for_errors) {
  const Preamble p = read_preamble(bytes, bytes.size(), name_for_errors);
  const Layout l = decode_header(bytes.subspan(p.header_offset, p.header_len), p, bytes.size(), name_for_errors);
  Tensor t(l.dtype, l.shape);
  if (l.data_bytes) std::memcpy(t.raw(), bytes.data() + l.data_offset, l.data_bytes);
  return finish(std::move(t), l);
}

Tensor read_npy(const std::filesystem::path& path) {
  const std::string name = path.string();
  const base::RegularFile file = base::open_regular_file(path);  // a FIFO or folder is named, never read
  const std::uint64_t size = file.size();
  std::uint64_t pos = 0;

  // Read in three steps (preamble, header, data) so the data goes straight into the tensor and a
  // bogus header is refused before anything large is allocated.
  auto read_exact = [&](void* dst, std::uint64_t n, const char* what) {
    if (n > size - std::min(pos, size))
      throw InputError(name + ": read error in the " + std::string(what) + " (file changed while reading?)");
    file.read_at(dst, n, pos);
    pos += n;
  };
  std::array<std::uint8_t, kMaxPreambleBytes> first{};
  const std::size_t first_len = static_cast<std::size_t>(std::min<std::uint64_t>(size, first.size()));
  read_exact(first.data(), first_len, ".npy preamble");
  const Preamble p = read_preamble(std::span(first.data(), first_len), size, name);
  std::vector<std::uint8_t> header(static_cast<std::size_t>(p.header_len));
  pos = p.header_offset;
  read_exact(header.data(), header.size(), ".npy header");
  const Layout l = decode_header(header, p, size, name);
  Tensor t(l.dtype, l.shape);
  read_exact(t.raw(), l.data_bytes, ".npy data");
  return finish(std::move(t), l);
}

std::vector<std::uint8_t> serialize_npy(const Tensor& t) {
  std::vector<std::uint8_t> out = header_bytes(t, "serialize_npy");
  out.reserve(out.size() + t.nbytes());
  for_each_le_chunk(t, [&](std::span<const std::uint8_t> chunk) { out.insert(out.end(), chunk.begin(), chunk.end()); });
  return out;
}

void write_npy(const std::filesystem::path& path, const Tensor& t) {
  const std::string name = path.string();
  const std::vector<std::uint8_t> header = header_bytes(t, name);
  const std::string base = path.filename().string();
  if (base.empty() || base == "." || base == "..")
    throw InputError(name + ": expected a file name to write the .npy file to");
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";

  // The temporary file lives next to the target so rename() is atomic (same file system); it is
  // hidden so globs such as *.npy never pick up a half-written file.
  std::random_device rd;
  std::filesystem::path tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".tmp-%08x%08x", rd(), rd());
    tmp = dir / ("." + base + suffix);
    base::track_temporary_file(tmp);  // before it exists: a signal's cleanup removes it (base/files.h)
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      const int err = errno;
      base::untrack_temporary_file(tmp);
      errno = err;
    }
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw InputError(name + ": cannot create a temporary file in " + dir.string() + ": " + errno_text());

  bool ok = write_all(fd, header);
  for_each_le_chunk(t, [&](std::span<const std::uint8_t> chunk) { ok = ok && write_all(fd, chunk); });
  std::string reason = ok ? "" : errno_text();
  if (::close(fd) != 0 && ok) {
    ok = false;
    reason = errno_text();
  }
  std::error_code ec;
  if (ok && !base::rename_tracked_file(tmp, path)) {
    ok = false;
    reason = "cannot rename the temporary file into place: " + errno_text();
  }
  if (!ok) {
    std::filesystem::remove(tmp, ec);
    base::untrack_temporary_file(tmp);
    throw InputError(name + ": cannot write .npy file: " + reason);
  }
}

}  // namespace qeval::datasets
