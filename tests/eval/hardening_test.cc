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

#include "datasets/npy.h"
#include "eval/gate.h"
#include "eval/infer.h"
#include "eval/json_config.h"
#include "eval/onnx_import.h"
#include "eval/session.h"
#include "kernels/error.h"
#include "onnx_builder.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;
using testing::floats;
using testing::OnnxBuilder;

// The message of the InputError that `f` throws ("" when it throws nothing; any other exception
// propagates and fails the test).
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

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
  a[0] = kMin, d[0] = T(-1);   // traps in C++: SIGFPE on x86
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
  b.input("x", onnx::TensorProto::FLOAT, {1}).output("q64", onnx::TensorProto::INT64).output("q32", onnx::TensorProto::INT32);
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

}  // namespace
}  // namespace qeval::eval
