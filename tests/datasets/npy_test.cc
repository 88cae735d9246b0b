// .npy I/O: numpy-written fixtures (every dtype, layout, byte order, version), byte identity with
// np.save, round trips, and precise errors on corrupt preambles, headers and data.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <optional>
#include <set>

#include "datasets/npy.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::datasets {
namespace {

using testing::data_dir;

std::filesystem::path npy_dir() { return data_dir() / "npy"; }

// The DType qeval reads a numpy dtype as; nullopt where it must refuse the file.
std::optional<DType> qeval_dtype_for(const std::string& numpy_name) {
  static const std::pair<const char*, DType> kMap[] = {
      {"float16", DType::kFloat16}, {"float32", DType::kFloat32}, {"float64", DType::kFloat64},
      {"int8", DType::kInt8},       {"uint8", DType::kUInt8},     {"int16", DType::kInt16},
      {"uint16", DType::kUInt16},   {"int32", DType::kInt32},     {"uint32", DType::kUInt32},
      {"int64", DType::kInt64},     {"uint64", DType::kUInt64},   {"bool", DType::kBool},
  };
  for (auto [name, dtype] : kMap)
    if (numpy_name == name) return dtype;
  return std::nullopt;
}

std::string hex_of(const Tensor& t) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const auto* p = reinterpret_cast<const std::uint8_t*>(t.raw());
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 15];
  }
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "<no InputError>";
}

std::string parse_error(const std::vector<std::uint8_t>& bytes) {
  return error_of([&] { parse_npy(bytes, "t.npy"); });
}

// Evaluates `haystack` once (it is often a call that throws).
#define EXPECT_HAS(haystack, needle)                                   \
  do {                                                                 \
    const std::string haystack_ = (haystack);                          \
    EXPECT_NE(haystack_.find(needle), std::string::npos) << haystack_; \
  } while (0)

// A version `major`.0 file around a hand-written header dict (padded to 64 bytes like numpy's).
std::vector<std::uint8_t> npy_with_header(const std::string& dict, const std::vector<std::uint8_t>& data = {},
                                          int major = 1) {
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  std::string header = dict;
  while ((8 + len_bytes + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::vector<std::uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<std::uint8_t>(major), 0};
  for (std::size_t i = 0; i < len_bytes; ++i) out.push_back(static_cast<std::uint8_t>(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<std::uint8_t> f32_bytes(std::initializer_list<float> values) {
  std::vector<std::uint8_t> out(values.size() * 4);
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

// The dict of a valid float32 header with the given shape text.
std::string f4_dict(const std::string& shape) {
  return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
}

// --- numpy-written fixtures -------------------------------------------------------------------

TEST(NpyFixtures, ReadsEveryNumpyFileExactlyOrRefusesItByName) {
  const auto expected = testing::read_json(npy_dir() / "expected.json");
  int read = 0, refused = 0;
  for (const auto& [name, e] : expected["files"].items()) {
    SCOPED_TRACE(name);
    const std::filesystem::path path = npy_dir() / name;
    const std::optional<DType> dtype = qeval_dtype_for(e["dtype"]);
    if (!dtype) {
      const std::string err = error_of([&] { read_npy(path); });
      EXPECT_HAS(err, path.string() + ": ");
      if (e.contains("kind")) {
        EXPECT_HAS(err, e["kind"].get<std::string>());  // "object" or "structured"
      } else {
        EXPECT_HAS(err, "unsupported dtype '" + e["descr"].get<std::string>() + "'");
      }
      ++refused;
      continue;
    }
    const Tensor t = read_npy(path);
    EXPECT_EQ(t.dtype(), *dtype);
    EXPECT_EQ(t.shape(), e["shape"].get<Shape>());
    EXPECT_EQ(hex_of(t), e["le_hex"].get<std::string>());
    // The in-memory entry point must agree with the file one.
    const Tensor p = parse_npy(testing::read_bytes(path), name);
    EXPECT_EQ(p.dtype(), t.dtype());
    EXPECT_EQ(p.shape(), t.shape());
    EXPECT_EQ(hex_of(p), hex_of(t));
    ++read;
  }
  EXPECT_EQ(read, 25);
  EXPECT_EQ(refused, 4);
}

TEST(NpyFixtures, CoverLayoutsByteOrdersAndVersions) {
  // Guards the fixture set itself: regenerating it must not silently drop a case.
  const auto expected = testing::read_json(npy_dir() / "expected.json");
  int fortran = 0, big_endian = 0, zero_size = 0, zero_d = 0, three_d = 0;
  std::set<std::string> versions, dtypes;
  for (const auto& [name, e] : expected["files"].items()) {
    fortran += e["fortran_order"].get<bool>();
    big_endian += e["descr"].is_string() && e["descr"].get<std::string>().starts_with(">");
    const auto shape = e["shape"].get<Shape>();
    zero_d += shape.empty();
    three_d += shape.size() == 3;
    zero_size += !shape.empty() && shape_numel(shape) == 0;
    versions.insert(e["version"].get<std::string>());
    dtypes.insert(e["dtype"].get<std::string>());
  }
  EXPECT_GE(fortran, 3);
  EXPECT_GE(big_endian, 4);
  EXPECT_GE(zero_size, 2);
  EXPECT_GE(zero_d, 1);
  EXPECT_GE(three_d, 3);
  EXPECT_EQ(versions, (std::set<std::string>{"1.0", "2.0", "3.0"}));
  for (const char* d : {"float16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                        "uint64", "bool"})
    EXPECT_TRUE(dtypes.count(d)) << d;
}

TEST(NpyFixtures, Float16KeepsItsBitsIncludingInfNanAndSubnormals) {
  const Tensor t = read_npy(npy_dir() / "f2_1d.npy");
  ASSERT_EQ(t.dtype(), DType::kFloat16);
  std::vector<std::uint16_t> bits(7);
  std::memcpy(bits.data(), t.raw(), 14);
  EXPECT_EQ(bits, (std::vector<std::uint16_t>{0x0000, 0x3c00, 0xc100, 0x7bff, 0x7c00, 0x7e00, 0x0001}));
}

TEST(NpyFixtures, FortranOrderIsTransposedIntoCOrder) {
  const Tensor t = read_npy(npy_dir() / "f8_fortran_3d.npy");  // arange(24).reshape(2,3,4) + 0.25
  ASSERT_EQ(t.shape(), (Shape{2, 3, 4}));
  const double* d = t.data<double>();
  for (int i = 0; i < 24; ++i) ASSERT_EQ(d[i], i + 0.25) << i;
  const Tensor b = read_npy(npy_dir() / "i4_big_endian_fortran.npy");  // arange(12).reshape(3,4) * -3
  ASSERT_EQ(b.shape(), (Shape{3, 4}));
  for (int i = 0; i < 12; ++i) ASSERT_EQ(b.data<std::int32_t>()[i], -3 * i) << i;
}

TEST(NpyFixtures, BigEndianIsByteSwapped) {
  const Tensor f = read_npy(npy_dir() / "f4_big_endian.npy");  // arange(6).reshape(2,3) - 2.5
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f.data<float>()[i], i - 2.5f);
  const Tensor i8 = read_npy(npy_dir() / "i8_big_endian.npy");
  EXPECT_EQ(std::vector<std::int64_t>(i8.span<std::int64_t>().begin(), i8.span<std::int64_t>().end()),
            (std::vector<std::int64_t>{-(std::int64_t{1} << 40), -1, 0, (std::int64_t{1} << 62) + 5}));
}

TEST(NpyFixtures, ZeroDAndZeroSizeShapes) {
  const Tensor s = read_npy(npy_dir() / "f4_0d.npy");
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.data<float>()[0], 3.25f);
  const Tensor z = read_npy(npy_dir() / "i4_zero_size_3d.npy");
  EXPECT_EQ(z.shape(), (Shape{2, 0, 5}));
  EXPECT_EQ(z.numel(), 0);
}

// --- writing --------------------------------------------------------------------------------------

TEST(NpyWrite, Float32IsByteIdenticalToNumpy) {
  Tensor t(DType::kFloat32, {2, 3});
  for (int i = 0; i < 6; ++i) t.data<float>()[i] = i * 0.5f - 1.0f;  // as make_npy_fixtures.py
  const auto numpy_bytes = testing::read_bytes(npy_dir() / "f4_2x3.npy");
  EXPECT_EQ(serialize_npy(t), numpy_bytes);
  testing::ScratchDir dir("npy");
  write_npy(dir / "a.npy", t);
  EXPECT_EQ(testing::read_bytes(dir / "a.npy"), numpy_bytes);
}

TEST(NpyWrite, HeaderIsPaddedTo64BytesAndEndsWithNewline) {
  for (const Shape& shape : {Shape{}, Shape{0}, Shape{5}, Shape{2, 3}, Shape{1, 2, 3, 1, 2, 3, 1, 2},
                             Shape{0, 1000000000000}, Shape{1000000000000000000, 0}}) {
    SCOPED_TRACE(shape_to_string(shape));
    const Tensor t(DType::kInt64, shape);
    const auto bytes = serialize_npy(t);
    ASSERT_GE(bytes.size(), 10u);
    EXPECT_EQ(bytes[6], 1);  // version 1.0 whenever the header fits
    const std::size_t hlen = bytes[8] | (bytes[9] << 8);
    EXPECT_EQ((10 + hlen) % 64, 0u);
    EXPECT_EQ(bytes[10 + hlen - 1], '\n');
    EXPECT_EQ(bytes.size(), 10 + hlen + t.nbytes());
    const Tensor back = parse_npy(bytes, "mem");
    EXPECT_EQ(back.shape(), shape);
  }
}

TEST(NpyWrite, HugeHeaderSwitchesToVersion2) {
  const Tensor t(DType::kUInt8, Shape(25000, 1));  // "1, " x 25000 does not fit a 16-bit length
  const auto bytes = serialize_npy(t);
  EXPECT_EQ(bytes[6], 2);
  const std::size_t hlen = bytes[8] | (bytes[9] << 8) | (bytes[10] << 16) | (std::size_t(bytes[11]) << 24);
  EXPECT_EQ((12 + hlen) % 64, 0u);
  EXPECT_EQ(parse_npy(bytes, "mem").shape(), t.shape());
}

TEST(NpyRoundTrip, EveryWritableDTypeAndShape) {
  testing::ScratchDir dir("npy");
  const DType dtypes[] = {DType::kFloat16, DType::kFloat32, DType::kFloat64, DType::kInt8,
                          DType::kUInt8,   DType::kInt16,   DType::kUInt16,  DType::kInt32,
                          DType::kUInt32,  DType::kInt64,   DType::kUInt64,  DType::kBool};
  const Shape shapes[] = {{}, {7}, {2, 3, 4}, {0}, {3, 0, 2}};
  std::mt19937 rng(11);
  for (DType dtype : dtypes) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + shape_to_string(shape));
      Tensor t(dtype, shape);
      auto* p = reinterpret_cast<std::uint8_t*>(t.raw());
      // Random bit patterns (NaN payloads included) must survive exactly; bools must be 0/1.
      for (std::size_t i = 0; i < t.nbytes(); ++i)
        p[i] = static_cast<std::uint8_t>(dtype == DType::kBool ? rng() & 1 : rng());
      const auto path = dir / "t.npy";
      write_npy(path, t);
      const Tensor back = read_npy(path);
      EXPECT_EQ(back.dtype(), dtype);
      EXPECT_EQ(back.shape(), shape);
      EXPECT_EQ(hex_of(back), hex_of(t));
      EXPECT_EQ(hex_of(parse_npy(serialize_npy(t), "mem")), hex_of(t));
    }
  }
}

TEST(NpyWrite, TypesNumpyLacksAreRefused) {
  const Tensor t(DType::kBFloat16, {2});
  EXPECT_HAS(error_of([&] { serialize_npy(t); }), "bfloat16");
  testing::ScratchDir dir("npy");
  EXPECT_HAS(error_of([&] { write_npy(dir / "b.npy", t); }), dir.path().string() + "/b.npy: cannot write a bfloat16");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(NpyWrite, ReplacesAtomicallyAndLeavesNoTemporaryFiles) {
  testing::ScratchDir dir("npy");
  Tensor a(DType::kInt32, {3});
  Tensor b(DType::kFloat64, {2, 2});
  b.data<double>()[3] = 7.5;
  write_npy(dir / "x.npy", a);
  write_npy(dir / "x.npy", b);
  const Tensor back = read_npy(dir / "x.npy");
  EXPECT_EQ(back.dtype(), DType::kFloat64);
  EXPECT_EQ(back.data<double>()[3], 7.5);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"x.npy"});
}

TEST(NpyWrite, UnwritableTargetsNameThePath) {
  testing::ScratchDir dir("npy");
  const Tensor t(DType::kUInt8, {4});
  const std::string missing = (dir / "no/such/dir/a.npy").string();
  std::string e = error_of([&] { write_npy(missing, t); });
  EXPECT_HAS(e, missing + ": cannot create a temporary file");
  EXPECT_HAS(e, "No such file");
  // A directory in the way: the rename fails, and the temporary file must not stay behind.
  std::filesystem::create_directories(dir / "d.npy" / "inner");
  e = error_of([&] { write_npy(dir / "d.npy", t); });
  EXPECT_HAS(e, (dir / "d.npy").string() + ": cannot write .npy file: cannot rename");
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"d.npy"});  // no temporary file, and "no/" never made
}

// --- header parsing -------------------------------------------------------------------------------

TEST(NpyHeader, AcceptsAnyKeyOrderSpacingQuotesAndTrailingCommas) {
  const auto data = f32_bytes({0, 1, 2, 3, 4, 5});
  for (const std::string dict : {
           "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
           "{ 'descr' : '<f4' ,\n\t'fortran_order':False,'shape':( 2 ,3 , ) , }",
           "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }",  // Python 2 longs
           "{'descr': 'f4', 'fortran_order': False, 'shape': (2, 3), }",     // no byte order: host
           "{'descr': '=f4', 'fortran_order': False, 'shape': (2, 3), }",
           "  {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}  \r\n",
       }) {
    SCOPED_TRACE(dict);
    const Tensor t = parse_npy(npy_with_header(dict, data), "t.npy");
    EXPECT_EQ(t.shape(), (Shape{2, 3}));
    EXPECT_EQ(t.data<float>()[5], 5.0f);
  }
  EXPECT_EQ(parse_npy(npy_with_header(f4_dict("(6,)"), data), "t").shape(), Shape{6});
  EXPECT_EQ(parse_npy(npy_with_header(f4_dict("( 6 , )"), data), "t").shape(), Shape{6});
  EXPECT_EQ(parse_npy(npy_with_header(f4_dict("()"), f32_bytes({9})), "t").shape(), Shape{});
  EXPECT_EQ(parse_npy(npy_with_header(f4_dict("(0, 3)")), "t").shape(), (Shape{0, 3}));
  EXPECT_EQ(parse_npy(npy_with_header(f4_dict("(6,)"), data, 2), "t").shape(), Shape{6});
  EXPECT_EQ(parse_npy(npy_with_header(f4_dict("(6,)"), data, 3), "t").shape(), Shape{6});
}

TEST(NpyHeader, HandBuiltFortranOrderAndBoolBytes) {
  const std::string fortran = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }";
  // Column-major [[0, 1, 2], [3, 4, 5]] is stored 0 3 1 4 2 5.
  const Tensor t = parse_npy(npy_with_header(fortran, f32_bytes({0, 3, 1, 4, 2, 5})), "t");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data<float>()[i], float(i));
  // numpy reads any nonzero bool byte as True; a C++ bool must hold exactly 0 or 1.
  const Tensor b =
      parse_npy(npy_with_header("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", {0, 2, 255}), "t");
  const auto* raw = reinterpret_cast<const std::uint8_t*>(b.raw());
  EXPECT_EQ(raw[0], 0);
  EXPECT_EQ(raw[1], 1);
  EXPECT_EQ(raw[2], 1);
}

// --- errors ---------------------------------------------------------------------------------------

TEST(NpyErrors, MissingFileAndDirectory) {
  EXPECT_HAS(error_of([] { read_npy("/nonexistent/qeval/x.npy"); }), "/nonexistent/qeval/x.npy: no such file");
  testing::ScratchDir dir("npy");
  EXPECT_HAS(error_of([&] { read_npy(dir.path()); }), "is a directory");
}

TEST(NpyErrors, BadMagicEmptyAndUnsupportedVersion) {
  auto good = npy_with_header(f4_dict("(1,)"), f32_bytes({1}));
  auto bad = good;
  bad[5] = 'X';
  EXPECT_HAS(parse_error(bad), "t.npy: not a .npy file (bad magic");
  EXPECT_HAS(parse_error({0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'}), "\\x89PNG");
  EXPECT_HAS(parse_error({}), "t.npy: file is empty");
  EXPECT_HAS(parse_error({0x93, 'N', 'U'}), "t.npy: truncated .npy file: 3 bytes");
  bad = good;
  bad[6] = 4;
  EXPECT_HAS(parse_error(bad), "unsupported .npy format version 4.0 (expected 1.0, 2.0 or 3.0)");
  bad = good;
  bad[7] = 1;
  EXPECT_HAS(parse_error(bad), "version 1.1");
}

TEST(NpyErrors, TruncationAndTrailingBytesAreNamedWithSizes) {
  Tensor t(DType::kFloat32, {2, 3});
  const auto bytes = serialize_npy(t);  // 128-byte header + 24 bytes of data
  auto cut = bytes;
  cut.resize(bytes.size() - 1);
  EXPECT_HAS(parse_error(cut),
             "t.npy: truncated .npy data: shape [2, 3] of '<f4' needs 24 bytes of data, the file has 23");
  cut.resize(9);
  EXPECT_HAS(parse_error(cut), "too short for the header length field");
  cut = bytes;
  cut.resize(60);
  EXPECT_HAS(parse_error(cut), "truncated .npy header: the length field says 118 bytes, only 50 present");
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_HAS(parse_error(longer), "1 unexpected bytes after the .npy data");
  // Every prefix fails cleanly, and read_npy names the file.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    cut.assign(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    ASSERT_NE(parse_error(cut), "<no InputError>") << n;
  }
  testing::ScratchDir dir("npy");
  cut.assign(bytes.begin(), bytes.end() - 4);
  testing::write_bytes(dir / "cut.npy", cut);
  EXPECT_HAS(error_of([&] { read_npy(dir / "cut.npy"); }), (dir / "cut.npy").string() + ": truncated .npy data");
}

TEST(NpyErrors, MalformedDictsNameTheProblem) {
  static const char kNul[] = "{'descr': '<f4',\0 'fortran_order': False, 'shape': (2,)}";
  const std::pair<std::string, std::string> cases[] = {
      {"{'descr': '<f4', 'fortran_order': False, }", "missing key 'shape'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", "unexpected key 'extra'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "duplicate key 'descr'"},
      {"{'descr': '<f4", "unterminated string"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), ", "unterminated dict"},
      {"'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "expected '{'"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", "expected ':' after key 'descr'"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}' after the value of 'descr'"},
      {"{'descr': '<f4', , 'fortran_order': False, 'shape': (2,)}", "expected a quoted key"},
      {"{descr: '<f4', 'fortran_order': False, 'shape': (2,)}", "expected a quoted key"},
      {"{'descr': 4, 'fortran_order': False, 'shape': (2,)}", "expected a quoted string for 'descr'"},
      {f4_dict("(2)"), "'shape' is a parenthesised int, not a tuple"},
      {f4_dict("[2]"), "found a list"},
      {f4_dict("2"), "expected a tuple"},
      {f4_dict("(2, -3)"), "negative dimension"},
      {f4_dict("(2, 3.0)"), "expected an integer dimension"},
      {f4_dict("(2 3)"), "expected ',' or ')' in 'shape'"},
      {f4_dict("(2,,)"), "expected a non-negative integer dimension"},
      {f4_dict("(99999999999999999999,)"), "does not fit in 64 bits"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "expected True or False"},
      {"{'descr': '<f4', 'fortran_order': Trueish, 'shape': (2,)}", "expected True or False"},
      {f4_dict("(2,)") + " x", "unexpected text after the closing '}'"},
      {std::string(kNul, sizeof kNul - 1), "expected a quoted key"},
  };
  for (const auto& [dict, problem] : cases) {
    SCOPED_TRACE(dict);
    const std::string e = parse_error(npy_with_header(dict, f32_bytes({1, 2})));
    EXPECT_HAS(e, "t.npy: malformed .npy header: ");
    EXPECT_HAS(e, problem);
  }
  // 'L' suffixes are a Python 2 relic numpy only accepts in versions 1.0 and 2.0.
  EXPECT_HAS(parse_error(npy_with_header(f4_dict("(2L,)"), f32_bytes({1, 2}), 3)), "expected an integer dimension");
  // The message points at the offending place.
  EXPECT_HAS(parse_error(npy_with_header(f4_dict("(2, -3)"), f32_bytes({1, 2}))),
             "at offset 54 of the header, near \"', 'fortran_order': False, 'shape': (2, -3), }\"");
}

TEST(NpyErrors, UnsupportedDtypesAreNamed) {
  auto with_descr = [](const std::string& descr) {
    return parse_error(npy_with_header("{'descr': '" + descr + "', 'fortran_order': False, 'shape': (1,), }",
                                       {0, 0, 0, 0, 0, 0, 0, 0}));
  };
  EXPECT_HAS(with_descr("<c8"), "t.npy: unsupported dtype '<c8' (complex64); qeval reads f2, f4");
  EXPECT_HAS(with_descr("<U2"), "unsupported dtype '<U2' (unicode strings)");
  EXPECT_HAS(with_descr("<M8[ns]"), "unsupported dtype '<M8[ns]' (datetime64)");
  EXPECT_HAS(with_descr("<f4\x01"), "unsupported dtype '<f4\\x01'");
  EXPECT_HAS(with_descr(""), "unsupported dtype ''");
  EXPECT_HAS(with_descr("|O"), "t.npy: object arrays (dtype '|O') are not supported");
  EXPECT_HAS(
      parse_error(npy_with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", {0, 0, 0, 0})),
      "t.npy: unsupported dtype: structured arrays");
}

TEST(NpyErrors, OversizedHeadersAndShapesAreRefusedBeforeAllocating) {
  // A version 2.0 length field of 1 MiB + 1: refused from the 12-byte preamble alone.
  std::vector<std::uint8_t> big = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0x01, 0x00, 0x10, 0x00};
  EXPECT_HAS(parse_error(big), "t.npy: .npy header length 1048577 bytes exceeds the 1 MiB limit");
  EXPECT_HAS(parse_error(npy_with_header(f4_dict("(4294967296, 4294967296)"))),
             "shape [4294967296, 4294967296] has too many elements (the element count overflows");
  EXPECT_HAS(parse_error(npy_with_header(f4_dict("(4611686018427387904,)"))), "(its byte size overflows 64 bits)");
  // A shape far larger than the data is a truncation, not a terabyte allocation.
  EXPECT_HAS(parse_error(npy_with_header(f4_dict("(1000000000000,)"), f32_bytes({1}))),
             "truncated .npy data: shape [1000000000000] of '<f4' needs 4000000000000 bytes of data, the file has 4");
}

TEST(NpyErrors, CorruptedHeaderBytesNeverEscapeAsOtherExceptions) {
  Tensor t(DType::kFloat32, {2, 3});
  const auto bytes = serialize_npy(t);
  const std::uint8_t replacements[] = {0, ' ', '\'', '"', '(', ')', ',', ':', '{', '}', '9', '-', 'L', 0xff};
  int parsed = 0, refused = 0;
  for (std::size_t pos = 0; pos < 128; ++pos) {
    for (std::uint8_t r : replacements) {
      auto mutated = bytes;
      mutated[pos] = r;
      try {
        parse_npy(mutated, "t.npy");
        ++parsed;
      } catch (const InputError&) {
        ++refused;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "byte " << pos << " -> " << int(r) << ": " << e.what();
      }
    }
  }
  EXPECT_GT(parsed, 0);  // e.g. spaces in the padding
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace qeval::datasets
