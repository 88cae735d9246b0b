// NumPy .npy tensor files in and out (format versions 1.0, 2.0 and 3.0).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "kernels/tensor.h"

namespace qeval::datasets {

// Reads a .npy file into a C-order tensor. Accepted dtypes are those with a qeval DType:
// f2 f4 f8 i1 u1 i2 u2 i4 u4 i8 u8 b1, in either byte order ('>' is byte-swapped, '=' and no
// prefix mean the host's order). fortran_order True is transposed into C order; bool bytes other
// than 0/1 read as true. Every other dtype (complex, strings, datetimes, structured, object) is
// refused.
// Throws InputError naming the file and the reason: missing file, bad magic, unsupported version,
// header over 1 MiB, malformed header dict, unsupported or object dtype, element count overflow,
// data shorter (truncated) or longer than the shape needs.
Tensor read_npy(const std::filesystem::path& path);
Tensor parse_npy(std::span<const std::uint8_t> bytes, const std::string& name_for_errors);

// Writes the tensor as numpy's np.save would, byte for byte: version 1.0 (2.0 when the header
// exceeds 65535 bytes), little-endian, C order, header padded so the data starts on a 64-byte
// boundary. write_npy writes a temporary file in the target's folder and renames it over the
// target, so readers never see a partial file; throws InputError naming the path on failure.
// bfloat16 and fp8 tensors are refused (InputError): numpy has no dtype for them.
void write_npy(const std::filesystem::path& path, const Tensor& t);
std::vector<std::uint8_t> serialize_npy(const Tensor& t);

}  // namespace qeval::datasets
