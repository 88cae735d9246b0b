// Bad input that once crashed, hung or escaped as an internal error (issue 21): integer division
// traps, external data outside the model's folder, sizes checked after allocation, values with two
// producers, allocations the machine cannot give, out-of-range numbers in JSON.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>

#include "base/json_config.h"
#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "eval/run/gate.h"
#include "eval/run/infer.h"
#include "input_error.h"
#include "kernels/error.h"
#include "onnx_builder.h"
#include "reports/run_report.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;
using testing::floats;
using testing::OnnxBuilder;

using testing::contains;
using testing::input_error;

// ---- 1. integer Div of the minimum by -1 -------------------------------------------------------

template <class T>
Tensor int_tensor(const std::vector<T>& values) {
  Tensor t(dtype_of<T>::value, {static_cast<std::int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.template data<T>());
  return t;
}

// a / b for runtime inputs: 80 elements, more than the 64 below which small int inputs are planned
// as constants, so the op's run() divides.
template <class T>
void expect_runtime_division_wraps(int onnx_type) {
  constexpr T kMin = std::numeric_limits<T>::min();
  OnnxBuilder b;
  b.input("a", onnx_type, {80}).input("b", onnx_type, {80}).output("y", onnx_type, {80});
  b.node("Div", {"a", "b"}, {"y"}, "div");
  Graph g = b.graph();
  Session s(g);
  std::vector<T> a(80, T(7)), d(80, T(-2));
  a[0] = kMin, d[0] = T(-1);  // traps in C++: SIGFPE on x86
  a[1] = kMin, d[1] = T(1);
  a[2] = T(5), d[2] = T(-1);
  a[3] = std::numeric_limits<T>::max(), d[3] = T(-1);
  auto out = s.run({{"a", int_tensor(a)}, {"b", int_tensor(d)}});
  const T* y = out.at("y").template data<T>();
  EXPECT_EQ(y[0], kMin);  // two's complement wrap-around, as the hardware's negation
  EXPECT_EQ(y[1], kMin);
  EXPECT_EQ(y[2], T(-5));
  EXPECT_EQ(y[3], T(-std::numeric_limits<T>::max()));
  EXPECT_EQ(y[4], T(-3));  // 7 / -2 truncates toward zero
}

TEST(IntegerDivision, MinimumByMinusOneWrapsAtRunTime) {
  expect_runtime_division_wraps<std::int32_t>(onnx::TensorProto::INT32);
  expect_runtime_division_wraps<std::int64_t>(onnx::TensorProto::INT64);
}

// Both operands constant: planning the model folds the Div, which crashed before anything ran.
TEST(IntegerDivision, MinimumByMinusOneWrapsWhenFoldedAtPlanTime) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1})
      .output("q64", onnx::TensorProto::INT64)
      .output("q32", onnx::TensorProto::INT32);
  b.initializer_i64("a64", {std::numeric_limits<std::int64_t>::min(), 9});
  b.initializer_i64("b64", {-1, -1});
  b.initializer_raw<std::int32_t>("a32", onnx::TensorProto::INT32, {std::numeric_limits<std::int32_t>::min()}, {1});
  b.initializer_raw<std::int32_t>("b32", onnx::TensorProto::INT32, {-1}, {1});
  b.node("Div", {"a64", "b64"}, {"q64"}, "div64");
  b.node("Div", {"a32", "b32"}, {"q32"}, "div32");
  Graph g = b.graph();
  Session s(g);
  auto out = s.run({{"x", floats({1}, {0})}});
  EXPECT_EQ(out.at("q64").data<std::int64_t>()[0], std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(out.at("q64").data<std::int64_t>()[1], -9);
  EXPECT_EQ(out.at("q32").data<std::int32_t>()[0], std::numeric_limits<std::int32_t>::min());
}

TEST(IntegerDivision, DivisionByZeroIsAnInputErrorNamingTheNode) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1}).output("q", onnx::TensorProto::INT64);
  b.initializer_i64("a", {std::numeric_limits<std::int64_t>::min()});
  b.initializer_i64("z", {0});
  b.node("Div", {"a", "z"}, {"q"}, "divide_by_zero");
  Graph g = b.graph();
  const std::string e = input_error([&] {
    Session s(g);
    s.run({{"x", floats({1}, {0})}});
  });
  EXPECT_TRUE(contains(e, "node 'divide_by_zero' (Div): integer division by zero")) << e;
}

// A Reshape target whose dimensions multiply past int64 (found by fuzz_onnx_loader: UBSan's signed
// overflow) is an InputError naming the node, with a zero among them too (no overflow on the way).
TEST(ReshapeTarget, DimensionsPastInt64AreAnInputErrorNamingTheNode) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  for (bool zero : {false, true}) {
    OnnxBuilder b;
    b.input("x", onnx::TensorProto::FLOAT, {2, 3}).output("y", onnx::TensorProto::FLOAT);
    b.initializer_i64("shape", zero ? std::vector<std::int64_t>{kMax, 2, 0} : std::vector<std::int64_t>{2, kMax});
    auto* allow = b.node("Reshape", {"x", "shape"}, {"y"}, "huge").add_attribute();
    allow->set_name("allowzero");
    allow->set_type(onnx::AttributeProto::INT);
    allow->set_i(1);
    Graph g = b.graph();
    const std::string e = input_error([&] {
      Session s(g);
      s.run({{"x", floats({2, 3}, {0, 1, 2, 3, 4, 5})}});
    });
    EXPECT_TRUE(contains(e, "node 'huge' (Reshape)")) << e;
    if (!zero) EXPECT_TRUE(contains(e, "more elements than fit in 64 bits")) << e;
    else EXPECT_TRUE(contains(e, "too many elements")) << e;  // the shape check after the Reshape's
  }
}

// Mod (fmod 0: the divisor's sign; 1: the dividend's) of the minimum by -1 is 0, also when folded.
template <class T>
void expect_mod_of_minimum_is_zero(int onnx_type) {
  constexpr T kMin = std::numeric_limits<T>::min();
  for (int fmod : {0, 1}) {
    OnnxBuilder b;
    b.input("a", onnx_type, {80}).input("b", onnx_type, {80}).output("y", onnx_type, {80}).output("k", onnx_type);
    b.node("Mod", {"a", "b"}, {"y"}, "mod").add_attribute()->CopyFrom([&] {
      onnx::AttributeProto a;
      a.set_name("fmod");
      a.set_type(onnx::AttributeProto::INT);
      a.set_i(fmod);
      return a;
    }());
    b.initializer_raw<T>("ka", onnx_type, {kMin}, {1});
    b.initializer_raw<T>("kb", onnx_type, {T(-1)}, {1});
    b.node("Mod", {"ka", "kb"}, {"k"}, "folded_mod");
    Graph g = b.graph();
    Session s(g);
    std::vector<T> a(80, T(-7)), d(80, T(3));
    a[0] = kMin, d[0] = T(-1);
    a[1] = T(7), d[1] = T(-3);
    auto out = s.run({{"a", int_tensor(a)}, {"b", int_tensor(d)}});
    const T* y = out.at("y").template data<T>();
    EXPECT_EQ(y[0], T(0)) << "fmod " << fmod;
    EXPECT_EQ(y[1], fmod ? T(1) : T(-2)) << "fmod " << fmod;  // C: 7 % -3 = 1; Python: 7 % -3 = -2
    EXPECT_EQ(y[2], fmod ? T(-1) : T(2)) << "fmod " << fmod;  // C: -7 % 3 = -1; Python: -7 % 3 = 2
    EXPECT_EQ(out.at("k").template data<T>()[0], T(0)) << "fmod " << fmod;
  }
}

TEST(IntegerDivision, ModOfTheMinimumByMinusOneIsZero) {
  expect_mod_of_minimum_is_zero<std::int32_t>(onnx::TensorProto::INT32);
  expect_mod_of_minimum_is_zero<std::int64_t>(onnx::TensorProto::INT64);
}

TEST(IntegerDivision, ModByZeroIsAnInputErrorNamingTheNode) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1}).output("r", onnx::TensorProto::INT64);
  b.initializer_i64("a", {5});
  b.initializer_i64("z", {0});
  b.node("Mod", {"a", "z"}, {"r"}, "mod_by_zero");
  Graph g = b.graph();
  const std::string e = input_error([&] {
    Session s(g);
    s.run({{"x", floats({1}, {0})}});
  });
  EXPECT_TRUE(contains(e, "node 'mod_by_zero' (Mod): integer modulo by zero")) << e;
}

// ---- 2. external data stays inside the model's folder --------------------------------------------

// A model whose initializer 'w' (float32 [4]) is external data with these keys; written as
// dir/model/m.onnx. Returns the model's path.
fs::path write_external_model(const fs::path& dir, const std::vector<std::pair<std::string, std::string>>& keys,
                              std::vector<std::int64_t> dims = {4}) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {4}).output("y", onnx::TensorProto::FLOAT, {4});
  b.node("Mul", {"x", "w"}, {"y"}, "mul");
  auto* t = b.proto().mutable_graph()->add_initializer();
  t->set_name("w");
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (auto d : dims) t->add_dims(d);
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  for (const auto& [k, v] : keys) {
    auto* kv = t->add_external_data();
    kv->set_key(k);
    kv->set_value(v);
  }
  testing::write_bytes(dir / "model" / "m.onnx", b.bytes());
  return dir / "model" / "m.onnx";
}

void write_weights(const fs::path& path, const std::vector<float>& w) {
  std::vector<std::uint8_t> bytes(w.size() * sizeof(float));
  std::memcpy(bytes.data(), w.data(), bytes.size());
  testing::write_bytes(path, bytes);
}

std::string load_error(const fs::path& model) {
  return input_error([&] { load_onnx(model); });
}

TEST(ExternalData, LocationsOutsideTheModelsFolderAreRejected) {
  testing::ScratchDir dir("ext-outside");
  write_weights(dir / "outside.bin", {1, 2, 3, 4});
  write_weights(dir / "model" / "inside.bin", {1, 2, 3, 4});
  // The legitimate case still loads.
  EXPECT_NO_THROW(load_onnx(write_external_model(dir.path(), {{"location", "inside.bin"}})));

  const std::string up = load_error(write_external_model(dir.path(), {{"location", "../outside.bin"}}));
  EXPECT_TRUE(contains(up, "initializer 'w'")) << up;
  EXPECT_TRUE(contains(up, "'../outside.bin'")) << up;
  EXPECT_TRUE(contains(up, "outside the model's folder")) << up;

  const std::string deep =
      load_error(write_external_model(dir.path(), {{"location", "../../../../../../../etc/passwd"}}));
  EXPECT_TRUE(contains(deep, "outside the model's folder")) << deep;

  for (const char* absolute : {"/etc/passwd", "/dev/zero"}) {
    const std::string e = load_error(write_external_model(dir.path(), {{"location", absolute}}));
    EXPECT_TRUE(contains(e, "initializer 'w'") && contains(e, absolute) && contains(e, "absolute path")) << e;
  }
  // A folder whose name starts like the model's folder is not inside it (component-wise prefix).
  write_weights(dir / "model2" / "w.bin", {1, 2, 3, 4});
  const std::string sibling = load_error(write_external_model(dir.path(), {{"location", "../model2/w.bin"}}));
  EXPECT_TRUE(contains(sibling, "outside the model's folder")) << sibling;
}

TEST(ExternalData, SymlinksAreResolvedBeforeTheCheck) {
  testing::ScratchDir dir("ext-symlink");
  write_weights(dir / "outside.bin", {1, 2, 3, 4});
  write_weights(dir / "model" / "real.bin", {5, 6, 7, 8});
  fs::create_symlink(dir / "outside.bin", dir / "model" / "escape.bin");
  fs::create_symlink("/dev/zero", dir / "model" / "zero.bin");
  fs::create_symlink("real.bin", dir / "model" / "alias.bin");

  const std::string escape = load_error(write_external_model(dir.path(), {{"location", "escape.bin"}}));
  EXPECT_TRUE(contains(escape, "'escape.bin'") && contains(escape, "outside the model's folder")) << escape;
  const std::string zero = load_error(write_external_model(dir.path(), {{"location", "zero.bin"}}));
  EXPECT_TRUE(contains(zero, "'zero.bin'") && contains(zero, "outside the model's folder")) << zero;

  // A link that stays inside the folder is fine.
  Graph g = load_onnx(write_external_model(dir.path(), {{"location", "alias.bin"}}));
  EXPECT_EQ(g.initializers.at("w").data<float>()[3], 8.0f);
}

TEST(ExternalData, AFifoIsRejectedWithoutBlocking) {
  testing::ScratchDir dir("ext-fifo");
  const fs::path model = write_external_model(dir.path(), {{"location", "weights.fifo"}});
  const fs::path fifo = dir / "model" / "weights.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Should the loader block in open() (the old behaviour), a writer comes after 5 s and closes at
  // once, so that the test fails instead of hanging.
  std::atomic<bool> done{false};
  std::thread unblock([&] {
    for (int i = 0; i < 100 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (done) return;
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    if (fd >= 0) ::close(fd);
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string e = load_error(model);
  done = true;
  unblock.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(contains(e, "'weights.fifo'") && contains(e, "not a regular file")) << e;

  fs::create_directories(dir / "model" / "folder.bin");
  const std::string folder = load_error(write_external_model(dir.path(), {{"location", "folder.bin"}}));
  EXPECT_TRUE(contains(folder, "not a regular file")) << folder;
}

TEST(ExternalData, OffsetsAndLengthsAreCheckedBeforeReading) {
  testing::ScratchDir dir("ext-offsets");
  write_weights(dir / "model" / "w.bin", {1, 2, 3, 4, 5});  // 20 bytes
  Graph ok = load_onnx(write_external_model(dir.path(), {{"location", "w.bin"}, {"offset", "4"}, {"length", "16"}}));
  EXPECT_EQ(ok.initializers.at("w").data<float>()[0], 2.0f);

  // Not numbers: std::stoll threw std::invalid_argument / out_of_range (exit 3) or read "12abc" as 12.
  for (const char* bad : {"abc", "12abc", "-4", "", "99999999999999999999999"}) {
    const std::string off = load_error(write_external_model(dir.path(), {{"location", "w.bin"}, {"offset", bad}}));
    EXPECT_TRUE(contains(off, "initializer 'w'") && contains(off, "offset '" + std::string(bad) + "'") &&
                contains(off, "not a non-negative integer"))
        << bad << ": " << off;
    const std::string len = load_error(write_external_model(dir.path(), {{"location", "w.bin"}, {"length", bad}}));
    EXPECT_TRUE(contains(len, "length '" + std::string(bad) + "'")) << bad << ": " << len;
  }
  const std::string past = load_error(write_external_model(dir.path(), {{"location", "w.bin"}, {"offset", "8"}}));
  EXPECT_TRUE(contains(past, "too short") && contains(past, "the file has 20")) << past;
  const std::string beyond =
      load_error(write_external_model(dir.path(), {{"location", "w.bin"}, {"offset", "9223372036854775807"}}));
  EXPECT_TRUE(contains(beyond, "too short")) << beyond;
  const std::string length = load_error(write_external_model(dir.path(), {{"location", "w.bin"}, {"length", "20"}}));
  EXPECT_TRUE(contains(length, "length 20 does not match shape [4]")) << length;
}

// The CLI: exit 2 naming the tensor and the location; the bytes of the outside file never come out.
TEST(ExternalData, QevalInferExitsTwoForWeightsOutsideTheFolder) {
  testing::ScratchDir dir("ext-cli");
  write_weights(dir / "secret.bin", {11, 22, 33, 44});
  const fs::path model = write_external_model(dir.path(), {{"location", "../secret.bin"}});
  fs::create_directories(dir / "in");
  datasets::write_npy(dir / "in" / "x.npy", floats({4}, {1, 1, 1, 1}));
  const auto r = testing::run_qeval("infer --model " + model.string() + " --inputs " + (dir / "in").string() +
                                    " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "initializer 'w'") && contains(r.out, "../secret.bin")) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out" / "y.npy"));
}

// ---- 3. sizes are checked before allocation; element counts that overflow ------------------------

TEST(TensorSizes, AHugeShapeOverLittleDataIsRejectedBeforeAllocating) {
  const std::vector<std::int64_t> huge = {std::int64_t(1) << 40};
  // raw_data
  OnnxBuilder raw;
  raw.input("x", onnx::TensorProto::FLOAT, {1}).output("y", onnx::TensorProto::FLOAT);
  raw.node("Mul", {"x", "w"}, {"y"}, "mul");
  raw.initializer_raw<float>("w", onnx::TensorProto::FLOAT, {1, 2, 3, 4}, huge);
  const std::string r = input_error([&] { raw.graph(); });
  EXPECT_TRUE(contains(r, "initializer 'w'") && contains(r, "raw_data has 16 bytes") && contains(r, "[1099511627776]"))
      << r;
  // typed field
  OnnxBuilder typed;
  typed.input("x", onnx::TensorProto::FLOAT, {1}).output("y", onnx::TensorProto::FLOAT);
  typed.node("Mul", {"x", "w"}, {"y"}, "mul");
  typed.initializer("w", {1, 2, 3, 4}, huge);
  const std::string t = input_error([&] { typed.graph(); });
  EXPECT_TRUE(contains(t, "initializer 'w'") && contains(t, "has 4 values for shape [1099511627776]")) << t;
  // external data: the file is 16 bytes
  testing::ScratchDir dir("huge-ext");
  write_weights(dir / "model" / "w.bin", {1, 2, 3, 4});
  const std::string e = load_error(write_external_model(dir.path(), {{"location", "w.bin"}}, huge));
  EXPECT_TRUE(contains(e, "initializer 'w'") && contains(e, "'w.bin'") && contains(e, "too short")) << e;
}

TEST(TensorSizes, ElementCountsThatOverflowAreInputErrors) {
  const std::int64_t big = std::int64_t(1) << 32;
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1}).output("y", onnx::TensorProto::FLOAT);
  b.node("Mul", {"x", "w"}, {"y"}, "mul");
  b.initializer_raw<float>("w", onnx::TensorProto::FLOAT, {1, 2, 3, 4}, {big, big, big});
  const std::string e = input_error([&] { b.graph(); });
  EXPECT_TRUE(contains(e, "initializer 'w'") && contains(e, "more elements than fit in 64 bits")) << e;

  // A Constant node's tensor attribute goes the same way.
  OnnxBuilder c;
  c.input("x", onnx::TensorProto::FLOAT, {1}).output("y", onnx::TensorProto::FLOAT);
  auto& node = c.node("Constant", {}, {"k"}, "const");
  auto* a = node.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  for (int i = 0; i < 3; ++i) a->mutable_t()->add_dims(big);
  c.node("Mul", {"x", "k"}, {"y"}, "mul");
  const std::string ce = input_error([&] { c.graph(); });
  EXPECT_TRUE(contains(ce, "node 'const'") && contains(ce, "more elements than fit in 64 bits")) << ce;
}

TEST(TensorSizes, InferShapeOptionsThatOverflowExitTwo) {
  const std::string e = input_error([] { parse_shape_option("x=4294967296,4294967296,4294967296"); });
  EXPECT_TRUE(contains(e, "--shape 'x=4294967296,4294967296,4294967296'") && contains(e, "more elements")) << e;

  testing::ScratchDir dir("shape-cli");
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {-1}).output("y", onnx::TensorProto::FLOAT);
  b.node("Relu", {"x"}, {"y"}, "relu");
  testing::write_bytes(dir / "m.onnx", b.bytes());
  fs::create_directories(dir / "in");
  datasets::write_npy(dir / "in" / "x.npy", floats({4}, {1, 2, 3, 4}));
  const auto r =
      testing::run_qeval("infer --model " + (dir / "m.onnx").string() + " --inputs " + (dir / "in").string() +
                         " --out " + (dir / "out").string() + " --shape x=4294967296,4294967296,4294967296");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "more elements than fit in 64 bits")) << r.out;
}

// Shapes the ops infer from constant inputs: an element count past int64 names the node (Reshape's
// infer threw std::invalid_argument from shape_numel: exit 3).
TEST(TensorSizes, InferredShapesThatOverflowNameTheNode) {
  const std::int64_t b32 = std::int64_t(1) << 32;
  for (const char* op : {"Reshape", "Expand", "Tile"}) {
    const std::vector<std::int64_t> in_dims(std::string(op) == "Tile" ? 3 : 1, 1);
    OnnxBuilder b;
    b.input("x", onnx::TensorProto::FLOAT, in_dims).output("y", onnx::TensorProto::FLOAT);
    b.initializer_i64("s", {b32, b32, b32});
    b.node(op, {"x", "s"}, {"y"}, "grow");
    Graph g = b.graph();
    const std::string e = input_error([&] {
      Session s(g);
      s.run({{"x", Tensor(DType::kFloat32, in_dims)}});
    });
    EXPECT_TRUE(contains(e, "node 'grow' (" + std::string(op) + ")") &&
                contains(e, "[4294967296, 4294967296, 4294967296]") &&
                (contains(e, "more elements than fit in 64 bits") || contains(e, "too many elements")))
        << op << ": " << e;
  }
}

// ---- 4. a value has one producer --------------------------------------------------------------

TEST(SingleProducer, TwoNodesWritingOneValueAreRejectedNamingBoth) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT);
  b.node("Relu", {"x"}, {"y"}, "first");
  b.node("Neg", {"x"}, {"y"}, "second");
  const std::string e = input_error([&] { b.graph(); });
  EXPECT_TRUE(contains(e, "node 'first' (Relu)") && contains(e, "node 'second' (Neg)") && contains(e, "'y'")) << e;
}

TEST(SingleProducer, NodeOutputsMayNotShadowGraphInputsOrInitializers) {
  OnnxBuilder in;
  in.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT);
  in.node("Relu", {"x"}, {"x"}, "overwrite_input");
  in.node("Neg", {"x"}, {"y"}, "neg");
  const std::string e = input_error([&] { in.graph(); });
  EXPECT_TRUE(contains(e, "node 'overwrite_input' (Relu)") && contains(e, "graph input")) << e;

  OnnxBuilder init;
  init.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT);
  init.initializer("w", {1, 2}, {2});
  init.node("Relu", {"x"}, {"w"}, "overwrite_weight");
  init.node("Mul", {"x", "w"}, {"y"}, "mul");
  const std::string ie = input_error([&] { init.graph(); });
  EXPECT_TRUE(contains(ie, "node 'overwrite_weight' (Relu)") && contains(ie, "initializer")) << ie;

  // A Constant node is a producer too (it became an initializer silently ignored by emplace).
  OnnxBuilder k;
  k.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT);
  k.initializer("w", {1, 2}, {2});
  auto& c = k.node("Constant", {}, {"w"}, "const_w");
  auto* a = c.add_attribute();
  a->set_name("value_float");
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(3);
  k.node("Mul", {"x", "w"}, {"y"}, "mul");
  const std::string ke = input_error([&] { k.graph(); });
  EXPECT_TRUE(contains(ke, "node 'const_w' (Constant)") && contains(ke, "initializer")) << ke;

  OnnxBuilder twice;
  twice.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT);
  twice.initializer("w", {1, 2}, {2});
  twice.initializer("w", {3, 4}, {2});
  twice.node("Mul", {"x", "w"}, {"y"}, "mul");
  const std::string te = input_error([&] { twice.graph(); });
  EXPECT_TRUE(contains(te, "two initializers are named 'w'")) << te;
}

// ---- 5. allocations the graph cannot afford ----------------------------------------------------

// 2^20 x 2^25 float32 = 2^47 bytes, more than any machine this runs on.
const std::vector<std::int64_t> kHugeShape = {std::int64_t(1) << 20, std::int64_t(1) << 25};

TEST(OutOfMemory, AConstantOfShapeTooLargeForTheMachineNamesTheNodeShapeAndBytes) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1}).output("y", onnx::TensorProto::FLOAT);
  b.initializer_i64("shape", kHugeShape);
  b.node("ConstantOfShape", {"shape"}, {"big"}, "fill");
  b.node("Add", {"x", "big"}, {"y"}, "add");
  Graph g = b.graph();
  const std::string e = input_error([&] {
    Session s(g);
    s.run({{"x", floats({1}, {0})}});
  });
  EXPECT_TRUE(contains(e, "node 'fill' (ConstantOfShape)") && contains(e, "[1048576, 33554432]") &&
              contains(e, "140737488355328 bytes") && contains(e, "more than this machine's memory"))
      << e;
}

TEST(OutOfMemory, AnExpandOfARuntimeInputTooLargeForTheMachineExitsTwo) {
  testing::ScratchDir dir("oom-cli");
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1}).output("y", onnx::TensorProto::FLOAT);
  b.initializer_i64("shape", kHugeShape);
  b.node("Expand", {"x", "shape"}, {"y"}, "expand");
  testing::write_bytes(dir / "m.onnx", b.bytes());
  fs::create_directories(dir / "in");
  datasets::write_npy(dir / "in" / "x.npy", floats({1}, {1}));
  const auto r = testing::run_qeval("infer --model " + (dir / "m.onnx").string() + " --inputs " +
                                    (dir / "in").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "node 'expand' (Expand)") && contains(r.out, "[1048576, 33554432]") &&
              contains(r.out, "140737488355328 bytes"))
      << r.out;
}

// The limit applies to what a run allocates: fused attention's scores never exist as a tensor in
// an unobserved run, so a model whose scores alone exceed the limit still runs; an unfused node
// output over it is rejected naming the node and the limit.
TEST(OutOfMemory, TheLimitCountsOnlyTensorsARunAllocates) {
  auto model = [](bool fusable) {
    OnnxBuilder b;
    b.input("q", onnx::TensorProto::FLOAT, {1, 256, 16})
        .input("kt", onnx::TensorProto::FLOAT, {1, 16, 256})
        .input("v", onnx::TensorProto::FLOAT, {1, 256, 16})
        .output("y", onnx::TensorProto::FLOAT);
    b.initializer("scale", {0.25f}, {});
    b.node("MatMul", {"q", "kt"}, {"s"}, "qk");
    b.node("Mul", {"s", "scale"}, {"scaled"}, "scale");
    b.node("Softmax", {"scaled"}, {"p"}, "softmax");
    b.node("MatMul", {"p", "v"}, {"y"}, "pv");
    if (!fusable) b.output("p", onnx::TensorProto::FLOAT);  // a graph output is not fused away
    return b.graph();
  };
  const std::map<std::string, Tensor> in = {{"q", Tensor(DType::kFloat32, {1, 256, 16})},
                                            {"kt", Tensor(DType::kFloat32, {1, 16, 256})},
                                            {"v", Tensor(DType::kFloat32, {1, 256, 16})}};
  SessionOptions limited;
  limited.max_tensor_bytes = 100000;  // scores: 256 x 256 floats = 262144 bytes
  const Graph fused_graph = model(true);
  Session fused(fused_graph, limited);
  EXPECT_EQ(fused.run(in).at("y").shape(), (Shape{1, 256, 16}));
  const Graph unfused_graph = model(false);
  const std::string e = input_error([&] {
    Session unfused(unfused_graph, limited);
    unfused.run(in);
  });
  EXPECT_TRUE(contains(e, "node 'qk' (MatMul): output 's' [1, 256, 256] float32 (262144 bytes)") &&
              contains(e, "(100000 bytes)"))
      << e;
}

// An allocation that passes the plan's check but that the process cannot get (here: an address
// space limit of 1 GiB against a 2 GiB output) fails at the allocation site, naming the node.
TEST(OutOfMemory, AFailedAllocationWhileRunningNamesTheNode) {
  testing::ScratchDir dir("oom-run");
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1}).output("y", onnx::TensorProto::FLOAT);
  b.initializer_i64("shape", {std::int64_t(1) << 29});
  b.node("Expand", {"x", "shape"}, {"y"}, "expand");
  testing::write_bytes(dir / "m.onnx", b.bytes());
  fs::create_directories(dir / "in");
  datasets::write_npy(dir / "in" / "x.npy", floats({1}, {1}));
  const std::string args = "infer --threads 1 --model " + (dir / "m.onnx").string() + " --inputs " +
                           (dir / "in").string() + " --out " + (dir / "out").string();
  FILE* p = popen(("ulimit -v 1048576 && exec " + std::string(QEVAL_BINARY) + " " + args + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_TRUE(contains(out, "node 'expand' (Expand): out of memory") && contains(out, "[536870912]") &&
              contains(out, "2147483648 bytes"))
      << out;
}

// ---- 6. numbers out of double's range in JSON ---------------------------------------------------

TEST(JsonNumbers, OutOfRangeNumbersAreInputErrorsNamingTheFileAndKey) {
  const std::string top = input_error([] { base::JsonConfig::parse(R"({"count": 1e999})", "cfg.json"); });
  EXPECT_TRUE(contains(top, "cfg.json: count: a number is out of range") && contains(top, "1e999")) << top;
  const std::string nested = input_error([] {
    base::JsonConfig::parse(R"({"variants": [{"name": "a"}, {"name": "b", "alpha": [1, -1e999]}]})", "cfg.json");
  });
  EXPECT_TRUE(contains(nested, "cfg.json: variants[1].alpha[1]: a number is out of range")) << nested;
  const std::string gate =
      input_error([] { parse_gate(R"({"checks": [{"metric": "psnr_db", "min": 1e999}]})", "gate.json"); });
  EXPECT_TRUE(contains(gate, "gate.json: checks[0].min: a number is out of range") && contains(gate, "docs/gate.md"))
      << gate;
}

// `qeval merge` reads shards' report.json files: the same rule there.
TEST(JsonNumbers, AReportWithAnOutOfRangeNumberIsAnInputError) {
  testing::ScratchDir dir("json-report");
  const fs::path report = testing::write_text(dir, "report.json", R"({"schema_version": 1e999})");
  const std::string e = input_error([&] { reports::read_run_report(report); });
  EXPECT_TRUE(contains(e, "report.json: a number is out of range")) << e;
}

TEST(JsonNumbers, QevalRunExitsTwoForAnOutOfRangeNumberInItsConfig) {
  testing::ScratchDir dir("json-cli");
  const fs::path config = testing::write_text(dir, "run.json", R"({"count": 1e999})");
  const auto r = testing::run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "run.json: count: a number is out of range")) << r.out;
}

}  // namespace
}  // namespace qeval::eval
