// ONNX import and the executor: precise load errors, folding, observers, buffer reuse, precisions.
#include <gtest/gtest.h>

#include <malloc.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <thread>
#include <utility>

#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "kernels/error.h"
#include "kernels/numeric.h"
#include "kernels/scratch.h"
#include "onnx_builder.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

using testing::floats;
using testing::OnnxBuilder;

std::string load_error(const std::vector<std::uint8_t>& bytes) {
  try {
    parse_onnx(bytes, "m.onnx", ".");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(OnnxImport, GarbageAndTruncatedFilesAreInputErrors) {
  EXPECT_NE(load_error({}).find("m.onnx: file is empty"), std::string::npos);
  EXPECT_NE(load_error({'h', 'e', 'l', 'l', 'o'}).find("not an ONNX model"), std::string::npos);
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT, {2});
  b.node("Relu", {"x"}, {"y"}, "relu");
  auto bytes = b.bytes();
  for (std::size_t cut : {bytes.size() / 3, bytes.size() / 2, bytes.size() - 3}) {
    std::vector<std::uint8_t> part(bytes.begin(), bytes.begin() + std::ptrdiff_t(cut));
    EXPECT_NE(load_error(part), "") << "cut at " << cut;  // never a crash, always a reason
  }
  EXPECT_THROW(load_onnx("/nonexistent/model.onnx"), InputError);
}

TEST(OnnxImport, UnsupportedOpsAreListedAtLoadWithNameOpDomainOpset) {
  OnnxBuilder b(17);
  b.input("x", onnx::TensorProto::FLOAT, {2}).output("z", onnx::TensorProto::FLOAT, {2});
  b.node("Relu", {"x"}, {"y"}, "ok");
  b.node("FancyOp", {"y"}, {"z"}, "fancy");
  std::string e = load_error(b.bytes());
  EXPECT_NE(e.find("1 unsupported node(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("node 'fancy' (FancyOp): op FancyOp (ai.onnx opset 17) is not supported"), std::string::npos) << e;

  OnnxBuilder old(5);  // Add with broadcasting semantics starts at opset 7
  old.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT, {2});
  old.node("Add", {"x", "x"}, {"y"}, "add");
  e = load_error(old.bytes());
  EXPECT_NE(e.find("op Add is supported at opsets 7-22, not ai.onnx opset 5"), std::string::npos) << e;

  OnnxBuilder dom;
  dom.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT, {2});
  dom.node("Relu", {"x"}, {"y"}, "r", "com.example");
  EXPECT_NE(load_error(dom.bytes()).find("uses domain 'com.example', which the model does not import"),
            std::string::npos);
}

TEST(OnnxImport, DanglingInputsAndCyclesAreRejected) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT, {2});
  b.node("Add", {"x", "ghost"}, {"y"}, "add");
  EXPECT_NE(load_error(b.bytes()).find("input 1 'ghost' is not produced"), std::string::npos);
  OnnxBuilder c;
  c.input("x", onnx::TensorProto::FLOAT, {2}).output("b", onnx::TensorProto::FLOAT, {2});
  c.node("Add", {"x", "b"}, {"a"}, "first");
  c.node("Relu", {"a"}, {"b"}, "second");
  EXPECT_NE(load_error(c.bytes()).find("cycle"), std::string::npos);
}

TEST(OnnxImport, NodesAreSortedAndConstantsBecomeInitializers) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {3}).output("z", onnx::TensorProto::FLOAT, {3});
  b.node("Relu", {"y"}, {"z"}, "second");  // listed before its producer
  b.node("Add", {"x", "c"}, {"y"}, "first");
  auto& c = b.node("Constant", {}, {"c"}, "const");
  auto* attr = c.add_attribute();
  attr->set_name("value_floats");
  attr->set_type(onnx::AttributeProto::FLOATS);
  for (float v : {1.0f, -5.0f, 0.5f}) attr->add_floats(v);
  Graph g = b.graph();
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[0].name, "first");
  EXPECT_EQ(g.initializers.count("c"), 1u);
  Session s(g);
  auto out = s.run({{"x", floats({3}, {1, 2, 3})}});
  const float* z = out.at("z").data<float>();
  EXPECT_EQ(z[0], 2.0f);
  EXPECT_EQ(z[1], 0.0f);
  EXPECT_EQ(z[2], 3.5f);
}

TEST(OnnxImport, ExternalDataIsReadBesideTheModel) {
  testing::ScratchDir dir("extdata");
  std::vector<float> w = {1.5f, -2.0f, 4.0f, 0.25f};
  testing::write_bytes(dir / "weights.bin", std::vector<std::uint8_t>(8, 0));  // 8 bytes of offset
  {
    std::ofstream f(dir / "weights.bin", std::ios::binary | std::ios::app);
    f.write(reinterpret_cast<const char*>(w.data()), 16);
  }
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {4}).output("y", onnx::TensorProto::FLOAT, {4});
  b.node("Mul", {"x", "w"}, {"y"}, "mul");
  auto* t = b.proto().mutable_graph()->add_initializer();
  t->set_name("w");
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_dims(4);
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  for (auto [k, v] : {std::pair{"location", "weights.bin"}, {"offset", "8"}, {"length", "16"}}) {
    auto* kv = t->add_external_data();
    kv->set_key(k);
    kv->set_value(v);
  }
  testing::write_bytes(dir / "m.onnx", b.bytes());
  Graph g = load_onnx(dir / "m.onnx");
  Session s(g);
  auto out = s.run({{"x", floats({4}, {2, 2, 2, 2})}});
  EXPECT_EQ(out.at("y").data<float>()[1], -4.0f);
  std::filesystem::remove(dir / "weights.bin");
  try {
    load_onnx(dir / "m.onnx");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("external data file"), std::string::npos) << e.what();
  }
}

// Shape -> Reshape on a statically shaped input folds at plan time; the observer sees every node.
class Recorder final : public Observer {
 public:
  void on_node(const NodeEvent& e) override {
    events.push_back(e.node.name + (e.folded ? ":folded" : ":run"));
    for (const Tensor* t : e.outputs) EXPECT_NE(t, nullptr);
  }
  std::vector<std::string> events;
};

TEST(Session, FoldsShapeComputationsAndReportsEveryNode) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {-1, 6}).output("y", onnx::TensorProto::FLOAT);
  b.node("Shape", {"x"}, {"s"}, "shape");
  b.node("Reshape", {"x", "target"}, {"r"}, "reshape");
  b.node("Relu", {"r"}, {"y"}, "relu");
  b.initializer_i64("target", {-1, 3});
  b.output("s", onnx::TensorProto::INT64);
  Graph g = b.graph();
  Session s(g);
  Recorder rec;
  auto out = s.run({{"x", floats({2, 6}, std::vector<float>(12, -1.0f))}}, &rec);
  EXPECT_EQ(out.at("y").shape(), (Shape{4, 3}));
  EXPECT_EQ(out.at("s").data<std::int64_t>()[0], 2);  // the symbolic dim bound from the input
  EXPECT_EQ(rec.events, (std::vector<std::string>{"shape:folded", "reshape:run", "relu:run"}));
}

TEST(Session, InputsAreCheckedByNameTypeAndShape) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {-1, 4}).output("y", onnx::TensorProto::FLOAT);
  b.node("Relu", {"x"}, {"y"}, "relu");
  Graph g = b.graph();
  Session s(g);
  auto error = [&](std::map<std::string, Tensor> in) -> std::string {
    try {
      s.run(in);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error({}).find("missing input 'x'"), std::string::npos);
  EXPECT_NE(error({{"x", floats({2, 3}, std::vector<float>(6))}}).find("has shape [2, 3], the model expects [d0, 4]"),
            std::string::npos);
  EXPECT_NE(error({{"x", Tensor(DType::kInt64, {2, 4})}}).find("must be float32, got int64"), std::string::npos);
  EXPECT_NE(error({{"x", floats({1, 4}, std::vector<float>(4))}, {"extra", Tensor()}}).find("no input named 'extra'"),
            std::string::npos);
}

// MatMul -> Mul -> Softmax -> MatMul runs as one attention kernel without an observer: the scores
// are never materialised (smaller peak), and the bytes equal the observed, node-by-node run.
// Copies of every node output an observer sees, by value name.
class Copier final : public Observer {
 public:
  void on_node(const NodeEvent& e) override {
    for (std::size_t i = 0; i < e.outputs.size(); ++i)
      if (e.outputs[i]) values.emplace(e.node.outputs[i], *e.outputs[i]);
  }
  std::map<std::string, Tensor> values;
};

// Observed, a fused group writes every member's output: the same bytes as its nodes give run one
// at a time (here: each value a graph output, which nothing fuses across).
void expect_observed_values_of_the_unfused_nodes(const Graph& g, SessionOptions options,
                                                 const std::map<std::string, Tensor>& in) {
  Graph every = g;
  for (const Node& n : g.nodes)
    for (const std::string& out : n.outputs)
      if (std::none_of(every.outputs.begin(), every.outputs.end(), [&](const ValueInfo& o) { return o.name == out; })) {
        ValueInfo o;
        o.name = out;
        every.outputs.push_back(o);
      }
  Session unfused(every, options), observed(g, options);
  const std::map<std::string, Tensor> want = unfused.run(in);
  Copier seen;
  observed.run(in, &seen);
  ASSERT_EQ(seen.values.size(), g.nodes.size());
  for (const auto& [name, t] : seen.values) {
    const Tensor& w = want.at(name);
    ASSERT_EQ(t.shape(), w.shape()) << name;
    EXPECT_EQ(0, std::memcmp(t.raw(), w.raw(), w.nbytes())) << name << " " << precision_name(options.precision);
  }
}

TEST(Session, AttentionIsFusedWithoutObserversWithTheSameBytes) {
  OnnxBuilder b;
  b.input("q", onnx::TensorProto::FLOAT, {2, 64, 32})
      .input("kt", onnx::TensorProto::FLOAT, {2, 32, 64})
      .input("v", onnx::TensorProto::FLOAT, {2, 64, 16})
      .output("y", onnx::TensorProto::FLOAT);
  b.initializer("scale", {0.17f}, {});
  b.node("MatMul", {"q", "kt"}, {"s"}, "qk");
  b.node("Mul", {"s", "scale"}, {"scaled"}, "scale");
  b.node("Softmax", {"scaled"}, {"p"}, "softmax");
  b.node("MatMul", {"p", "v"}, {"y"}, "pv");
  Graph g = b.graph();
  auto filled = [](const Shape& shape, float step) {
    std::vector<float> v(std::size_t(shape_numel(shape)));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i) * step);
    return floats(shape, v);
  };
  const std::map<std::string, Tensor> in = {
      {"q", filled({2, 64, 32}, 0.3f)}, {"kt", filled({2, 32, 64}, 0.7f)}, {"v", filled({2, 64, 16}, 0.2f)}};
  Session fused(g), observed(g);
  Recorder rec;
  const Tensor a = fused.run(in).at("y");
  const Tensor c = observed.run(in, &rec).at("y");
  EXPECT_EQ(rec.events, (std::vector<std::string>{"qk:run", "scale:run", "softmax:run", "pv:run"}));
  EXPECT_EQ(0, std::memcmp(a.raw(), c.raw(), a.nbytes()));
  const std::size_t scores_bytes = 2 * 64 * 64 * sizeof(float);
  EXPECT_LT(fused.last_live_activation_bytes(), scores_bytes);
  EXPECT_GE(observed.last_live_activation_bytes(), 3 * scores_bytes);  // scores, scaled, probabilities
  // (fp16-strict: rounding after every op, as a graph whose every value is an output gets it.)
  for (Precision precision : {Precision::kFp32, Precision::kFp16Strict})
    expect_observed_values_of_the_unfused_nodes(g, SessionOptions{precision}, in);
  Session fused16(g, SessionOptions{Precision::kFp16}), observed16(g, SessionOptions{Precision::kFp16});
  const Tensor a16 = fused16.run(in).at("y");
  const Tensor c16 = observed16.run(in, &rec).at("y");
  EXPECT_EQ(0, std::memcmp(a16.raw(), c16.raw(), a16.nbytes()));
}

// GELU as torch exports it (Div, Erf, Add, Mul by the input, Mul) then SiLU (Sigmoid, Mul): two
// elementwise chains (g feeds two ops, so they meet there). x comes from a node, so it is in the
// pool and counted in the live set.
Graph gelu_silu_graph() {
  OnnxBuilder b;
  b.input("in", onnx::TensorProto::FLOAT, {4, 300, 70}).output("y", onnx::TensorProto::FLOAT);
  b.initializer("sqrt2", {1.4142135f}, {}).initializer("one", {1.0f}, {}).initializer("half", {0.5f}, {1});
  b.node("Neg", {"in"}, {"x"}, "neg");
  b.node("Div", {"x", "sqrt2"}, {"d"}, "div");
  b.node("Erf", {"d"}, {"e"}, "erf");
  b.node("Add", {"one", "e"}, {"a"}, "add");
  b.node("Mul", {"x", "a"}, {"m"}, "mul");
  b.node("Mul", {"m", "half"}, {"g"}, "mul_half");
  b.node("Sigmoid", {"g"}, {"s"}, "sigmoid");
  b.node("Mul", {"g", "s"}, {"y"}, "silu");
  return b.graph();
}

std::map<std::string, Tensor> gelu_silu_input() {
  std::vector<float> v(4 * 300 * 70);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 4.0f * std::sin(float(i) * 0.013f);
  return {{"in", floats({4, 300, 70}, v)}};
}

// The GELU + SiLU chains: each one pass without an observer, with the observed run's bytes, at
// fp32 and with fp16 rounding between the ops.
TEST(Session, ElementwiseChainsAreFusedWithTheSameBytes) {
  const Graph g = gelu_silu_graph();
  const std::map<std::string, Tensor> in = gelu_silu_input();
  for (Precision precision : {Precision::kFp32, Precision::kFp16Strict, Precision::kFp16}) {
    Session fused(g, SessionOptions{precision}), observed(g, SessionOptions{precision});
    Recorder rec;
    const Tensor a = fused.run(in).at("y");
    const Tensor c = observed.run(in, &rec).at("y");
    EXPECT_EQ(rec.events.size(), 8u);
    EXPECT_EQ(0, std::memcmp(a.raw(), c.raw(), a.nbytes())) << precision_name(precision);
    // Fused: at most two of x, g, y at once (g feeds two ops, so the chains meet there); node by
    // node x, d and e are live together.
    EXPECT_LE(fused.last_live_activation_bytes(), 2 * a.nbytes()) << precision_name(precision);
    EXPECT_GE(observed.last_live_activation_bytes(), 3 * a.nbytes()) << precision_name(precision);
    if (precision != Precision::kFp16) expect_observed_values_of_the_unfused_nodes(g, SessionOptions{precision}, in);
  }
}

// A chain whose binary ops read per-channel operands (a trailing [W], a [6, 1, 1] per channel, a
// [6, H, 1] block of middle dimensions) and that ends in the activation quantizer of a Q/DQ
// layer: one pass writing only the int8 output, with the bytes of the ops run one by one, at both
// precisions, for int8 and uint8 outputs. W = 30: runs shorter than 64 (copied into a block of the
// operand); W = 100: every run at least 64 long (the op runs run by run against the operand).
TEST(Session, ElementwiseChainsTakeBroadcastOperandsAndEndInAQuantizer) {
  for (const auto& hw : {std::pair<std::int64_t, std::int64_t>{20, 30}, {9, 100}})
    for (bool with_zero_point : {true, false}) {
      const std::int64_t h = hw.first, w = hw.second;
      SCOPED_TRACE("width " + std::to_string(w));
      OnnxBuilder b;
      b.input("in", onnx::TensorProto::FLOAT, {2, 6, h, w})
          .output("y", with_zero_point ? onnx::TensorProto::INT8 : onnx::TensorProto::UINT8);
      std::vector<float> s(static_cast<std::size_t>(w)), c(6), m(static_cast<std::size_t>(6 * h));
      for (std::size_t i = 0; i < s.size(); ++i) s[i] = 0.5f + 0.03f * float(i);
      for (std::size_t i = 0; i < c.size(); ++i) c[i] = -0.7f + 0.25f * float(i);
      for (std::size_t i = 0; i < m.size(); ++i) m[i] = 1.5f - 0.01f * float(i);
      b.initializer("s", s, {w}).initializer("c", c, {6, 1, 1}).initializer("m", m, {1, 6, h, 1});
      b.initializer("scale", {0.0042f}, {});
      if (with_zero_point) b.initializer_raw<std::int8_t>("zp", onnx::TensorProto::INT8, {-5}, {});
      b.node("Mul", {"in", "s"}, {"a"}, "smooth");
      b.node("Add", {"c", "a"}, {"d"}, "shift");
      b.node("Sigmoid", {"d"}, {"e"}, "sigmoid");
      b.node("Mul", {"e", "m"}, {"f"}, "gate");
      if (with_zero_point) b.node("QuantizeLinear", {"f", "scale", "zp"}, {"y"}, "q");
      else b.node("QuantizeLinear", {"f", "scale"}, {"y"}, "q");
      const Graph g = b.graph();
      std::vector<float> v(static_cast<std::size_t>(2 * 6 * h * w));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 3.0f * std::sin(float(i) * 0.011f);
      const std::map<std::string, Tensor> in{{"in", floats({2, 6, h, w}, v)}};
      for (Precision precision : {Precision::kFp32, Precision::kFp16Strict, Precision::kFp16}) {
        Session fused(g, SessionOptions{precision}), observed(g, SessionOptions{precision});
        Recorder rec;
        const Tensor a = fused.run(in).at("y");
        const Tensor o = observed.run(in, &rec).at("y");
        EXPECT_EQ(a.dtype(), with_zero_point ? DType::kInt8 : DType::kUInt8);
        EXPECT_EQ(rec.events.size(), 5u);
        EXPECT_EQ(0, std::memcmp(a.raw(), o.raw(), a.nbytes())) << precision_name(precision);
        // Fused, no float intermediate exists: only the int8 output is made (and, at fp16, the
        // input's rounded copy).
        const std::size_t rounded_input = precision != Precision::kFp32 ? v.size() * sizeof(float) : 0;
        EXPECT_LE(fused.last_live_activation_bytes(), a.nbytes() + rounded_input) << precision_name(precision);
        EXPECT_GE(observed.last_live_activation_bytes(), 4 * a.nbytes()) << precision_name(precision);
        if (precision != Precision::kFp16)
          expect_observed_values_of_the_unfused_nodes(g, SessionOptions{precision}, in);
      }
    }
}

// Hard-swish as paddle2onnx writes it at opset 11 (Add 3, Clip with constant bounds as inputs, Div
// 6, Mul by the input) and the same with Clip's attribute bounds (opset 10): each one fused pass (Clip
// joins the chain) with the bytes of the ops run one by one, NaN and infinities included.
TEST(Session, ClipWithConstantBoundsJoinsElementwiseChains) {
  for (int opset : {11, 10}) {
    SCOPED_TRACE(opset);
    OnnxBuilder b(opset);
    b.input("in", onnx::TensorProto::FLOAT, {2, 8, 30, 30}).output("y", onnx::TensorProto::FLOAT);
    b.initializer("three", {3.0f}, {}).initializer("six", {6.0f}, {});
    b.node("Neg", {"in"}, {"x"}, "neg");  // x comes from a node: pooled and counted
    b.node("Add", {"x", "three"}, {"a"}, "add");
    if (opset >= 11) {
      b.initializer("zero", {0.0f}, {});
      b.node("Clip", {"a", "zero", "six"}, {"c"}, "clip");
    } else {
      auto& node = b.node("Clip", {"a"}, {"c"}, "clip");
      for (auto [name, value] : {std::pair{"min", 0.0f}, std::pair{"max", 6.0f}}) {
        auto* attr = node.add_attribute();
        attr->set_name(name);
        attr->set_type(onnx::AttributeProto::FLOAT);
        attr->set_f(value);
      }
    }
    b.node("Div", {"c", "six"}, {"d"}, "div");
    b.node("Mul", {"x", "d"}, {"y"}, "mul");
    const Graph g = b.graph();
    std::vector<float> v(2 * 8 * 30 * 30);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 5.0f * std::sin(float(i) * 0.017f);
    v[3] = std::numeric_limits<float>::quiet_NaN();
    v[4] = std::numeric_limits<float>::infinity();
    v[5] = -std::numeric_limits<float>::infinity();
    const std::map<std::string, Tensor> in{{"in", floats({2, 8, 30, 30}, v)}};
    Session fused(g), observed(g);
    Recorder rec;
    const Tensor a = fused.run(in).at("y");
    const Tensor o = observed.run(in, &rec).at("y");
    EXPECT_EQ(rec.events.size(), 5u);
    EXPECT_EQ(0, std::memcmp(a.raw(), o.raw(), a.nbytes()));
    EXPECT_TRUE(std::isnan(a.data<float>()[3]));
    // Fused: x and y only; one by one x, a and c (or x, c and d) are live together.
    EXPECT_LE(fused.last_live_activation_bytes(), 2 * a.nbytes());
    EXPECT_GE(observed.last_live_activation_bytes(), 3 * a.nbytes());
    expect_observed_values_of_the_unfused_nodes(g, SessionOptions{}, in);
  }
}

// fp16 as a deployment stores values: a Conv's output read only by its epilogue (Add, Sigmoid),
// the epilogue's intermediates and attention scores stay FP32; what leaves a fused kernel (the
// Sigmoid's output, a value read twice, the probabilities, graph outputs) is rounded. fp16-strict
// rounds every op's output. Observed and unobserved runs agree in both modes.
TEST(Session, Fp16DeploymentRoundsOnlyWhereAFusedKernelStoresItsOutput) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1, 2, 8, 8})
      .output("y", onnx::TensorProto::FLOAT)
      .output("o", onnx::TensorProto::FLOAT);
  std::vector<float> w(2 * 2 * 3 * 3);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * std::sin(float(i) * 1.3f + 0.2f);
  b.initializer("w", w, {2, 2, 3, 3}).initializer("bias", {0.01f, -0.02f}, {2});
  b.initializer("scale", {0.37f}, {});
  auto* pads = b.node("Conv", {"x", "w", "bias"}, {"conv"}, "conv").add_attribute();
  pads->set_name("pads");
  pads->set_type(onnx::AttributeProto::INTS);
  for (int i = 0; i < 4; ++i) pads->add_ints(1);
  // A residual Add (an Add of a per-channel constant would be folded into the Conv at fp16).
  b.node("Add", {"conv", "x"}, {"shifted"}, "shift");
  b.node("Sigmoid", {"shifted"}, {"act"}, "act");
  b.node("Mul", {"act", "act"}, {"y"}, "square");  // act is read twice: stored
  b.node("Reshape", {"act", "shape"}, {"rows"}, "rows");
  b.initializer_i64("shape", {16, 8});
  b.node("Transpose", {"rows"}, {"cols"}, "cols");
  b.node("MatMul", {"rows", "cols"}, {"scores"}, "qk");
  b.node("Mul", {"scores", "scale"}, {"scaled"}, "scale");
  b.node("Softmax", {"scaled"}, {"probs"}, "softmax");
  b.node("MatMul", {"probs", "rows"}, {"o"}, "pv");
  const Graph g = b.graph();
  std::vector<float> xv(2 * 64);
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = 2.0f * std::cos(float(i) * 0.37f);
  const std::map<std::string, Tensor> in{{"x", floats({1, 2, 8, 8}, xv)}};
  auto fp16_exact = [](const Tensor& t) {
    for (std::int64_t i = 0; i < t.numel(); ++i)
      if (round_to_float16(t.data<float>()[i]) != t.data<float>()[i]) return false;
    return true;
  };
  for (Precision precision : {Precision::kFp16, Precision::kFp16Strict}) {
    SCOPED_TRACE(precision_name(precision));
    const bool strict = precision == Precision::kFp16Strict;
    Session observed(g, SessionOptions{precision}), plain(g, SessionOptions{precision});
    Copier seen;
    const auto out = observed.run(in, &seen);
    for (const char* v : {"conv", "shifted", "scores", "scaled"}) EXPECT_EQ(fp16_exact(seen.values.at(v)), strict) << v;
    for (const char* v : {"act", "y", "probs", "o"}) EXPECT_TRUE(fp16_exact(seen.values.at(v))) << v;
    const auto unobserved = plain.run(in);
    for (const char* v : {"y", "o"})
      EXPECT_EQ(0, std::memcmp(out.at(v).raw(), unobserved.at(v).raw(), out.at(v).nbytes())) << v;
  }
}

// Takes fused chains' intermediates as pieces: each member's values, checked to come in order,
// in pieces of multiples of kStreamPiece but the last; `accept`: what end_stream answers.
class Streamer final : public Observer, public PieceObserver {
 public:
  explicit Streamer(bool accept) : accept_(accept) {}
  void on_node(const NodeEvent& e) override { events.push_back(e.node.name); }
  PieceObserver* pieces() override { return this; }
  bool begin_stream(const std::vector<Node>& nodes, const StreamedGroup& group) override {
    EXPECT_TRUE(current_.empty());
    numel_.clear();
    for (std::size_t k = 0; k < group.members.size(); ++k) {
      current_.push_back(nodes[group.members[k]].outputs[0]);
      numel_.push_back(shape_numel(group.shapes[k]));
    }
    for (const std::string& v : current_) received[v].clear();
    if (group.recompute) {
      ++recomputable;
      rows = group.recompute();
      copies.clear();
      for (const Tensor* t : group.inputs) copies.push_back(*t);
      inputs.clear();
      for (const Tensor& t : copies) inputs.push_back(&t);
      shapes.assign(group.shapes.begin(), group.shapes.end());
    }
    return true;
  }
  void on_piece(std::size_t member, std::int64_t offset, const float* values, std::int64_t count) override {
    std::vector<float>& got = received[current_.at(member)];
    EXPECT_EQ(offset, std::int64_t(got.size()));
    EXPECT_TRUE(count % kStreamPiece == 0 || offset + count == numel_.at(member)) << offset << " " << count;
    got.insert(got.end(), values, values + count);
  }
  bool end_stream() override {
    for (std::size_t k = 0; k < current_.size(); ++k)
      EXPECT_EQ(std::int64_t(received[current_[k]].size()), numel_[k]) << current_[k];
    current_.clear();
    ++streams;
    return accept_;
  }
  std::vector<std::string> events;
  std::map<std::string, std::vector<float>> received;  // by value name
  int streams = 0;
  // The last group that can compute its members again (an attention): its MemberRows and copies
  // of its inputs.
  int recomputable = 0;
  std::unique_ptr<MemberRows> rows;
  std::vector<Tensor> copies;
  std::vector<const Tensor*> inputs;
  std::vector<Shape> shapes;

 private:
  bool accept_;
  std::vector<std::string> current_;
  std::vector<std::int64_t> numel_;
};

// The GELU + SiLU chains observed by a streaming observer: the intermediates
// come in pieces with the bytes the nodes give and no event; declined, the step runs again and
// every node has its event as usual.
TEST(Session, StreamedChainIntermediatesAreTheNodesBytesInPieces) {
  const Graph g = gelu_silu_graph();
  const std::map<std::string, Tensor> in = gelu_silu_input();
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    Session plain(g, SessionOptions{precision}), streamed(g, SessionOptions{precision}),
        declined(g, SessionOptions{precision});
    Copier all;
    const Tensor want = plain.run(in, &all).at("y");
    Streamer taking(true), refusing(false);
    const Tensor got = streamed.run(in, &taking).at("y");
    EXPECT_EQ(0, std::memcmp(want.raw(), got.raw(), want.nbytes())) << precision_name(precision);
    EXPECT_EQ(taking.streams, 2);
    EXPECT_EQ(taking.events, (std::vector<std::string>{"neg", "mul_half", "silu"}));
    ASSERT_EQ(taking.received.size(), 5u);  // d, e, a, m; s
    for (const auto& [name, values] : taking.received) {
      const Tensor& w = all.values.at(name);
      ASSERT_EQ(std::int64_t(values.size()), w.numel()) << name;
      EXPECT_EQ(0, std::memcmp(values.data(), w.raw(), w.nbytes())) << name << " " << precision_name(precision);
    }
    const Tensor again = declined.run(in, &refusing).at("y");
    EXPECT_EQ(0, std::memcmp(want.raw(), again.raw(), want.nbytes()));
    EXPECT_EQ(refusing.streams, 2);
    EXPECT_EQ(refusing.events,
              (std::vector<std::string>{"neg", "div", "erf", "add", "mul", "mul_half", "sigmoid", "silu"}));
  }
}

// A fused attention observed by a streaming observer: its scores, scaled scores and probabilities
// come in pieces of whole rows (several chunks here: entries of 700 rows by 1500 keys, tasks that
// do not divide an entry) with the bytes the nodes give and no event, never in the pool; its
// MemberRows computes any range of them again with the same bytes.
TEST(Session, StreamedAttentionIntermediatesAreTheNodesBytesInPiecesAndComputedAgain) {
  constexpr std::int64_t kB = 3, kL = 700, kLk = 1500, kD = 24, kDv = 16;
  OnnxBuilder b;
  b.input("q", onnx::TensorProto::FLOAT, {kB, kL, kD})
      .input("kt", onnx::TensorProto::FLOAT, {kB, kD, kLk})
      .input("v", onnx::TensorProto::FLOAT, {kB, kLk, kDv})
      .output("y", onnx::TensorProto::FLOAT);
  b.initializer("scale", {0.2f}, {});
  b.node("MatMul", {"q", "kt"}, {"s"}, "qk");
  b.node("Mul", {"s", "scale"}, {"scaled"}, "scale");
  b.node("Softmax", {"scaled"}, {"p"}, "softmax");
  b.node("MatMul", {"p", "v"}, {"y"}, "pv");
  Graph g = b.graph();
  auto filled = [](const Shape& shape, float step) {
    std::vector<float> v(std::size_t(shape_numel(shape)));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i) * step);
    return floats(shape, v);
  };
  const std::map<std::string, Tensor> in = {
      {"q", filled({kB, kL, kD}, 0.3f)}, {"kt", filled({kB, kD, kLk}, 0.7f)}, {"v", filled({kB, kLk, kDv}, 0.2f)}};
  const std::size_t member_bytes = std::size_t(kB * kL * kLk) * sizeof(float);
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    SCOPED_TRACE(precision_name(precision));
    Session plain(g, SessionOptions{precision}), streamed(g, SessionOptions{precision}),
        declined(g, SessionOptions{precision});
    Copier all;
    const Tensor want = plain.run(in, &all).at("y");
    EXPECT_GE(plain.last_live_activation_bytes(), 3 * member_bytes);
    Streamer taking(true), refusing(false);
    const Tensor got = streamed.run(in, &taking).at("y");
    EXPECT_EQ(0, std::memcmp(want.raw(), got.raw(), want.nbytes()));
    EXPECT_LT(streamed.last_live_activation_bytes(), member_bytes / 4);  // no member in the pool
    EXPECT_EQ(taking.streams, 1);
    EXPECT_EQ(taking.events, (std::vector<std::string>{"pv"}));
    ASSERT_EQ(taking.received.size(), 3u);
    for (const auto& [name, values] : taking.received) {
      const Tensor& w = all.values.at(name);
      ASSERT_EQ(std::int64_t(values.size()), w.numel()) << name;
      EXPECT_EQ(0, std::memcmp(values.data(), w.raw(), w.nbytes())) << name;
    }
    // Computed again: the whole members, and a range from an inner boundary to the end.
    ASSERT_EQ(taking.recomputable, 1);
    ASSERT_TRUE(taking.rows);
    const std::int64_t rows = kB * kL;
    std::int64_t inner = rows / 2;
    while (!taking.rows->boundary(inner)) ++inner;
    EXPECT_LT(inner, rows);
    EXPECT_FALSE(taking.rows->boundary(1));
    for (std::int64_t r0 : {std::int64_t(0), inner}) {
      std::vector<std::vector<float>> again(3, std::vector<float>(std::size_t((rows - r0) * kLk)));
      std::vector<float*> dst{again[0].data(), again[1].data(), again[2].data()};
      taking.rows->rows(taking.inputs, r0, rows, dst);
      const char* names[] = {"s", "scaled", "p"};
      for (std::size_t k = 0; k < 3; ++k)
        EXPECT_EQ(0, std::memcmp(again[k].data(), all.values.at(names[k]).data<float>() + r0 * kLk,
                                 again[k].size() * sizeof(float)))
            << names[k] << " from row " << r0;
    }
    const Tensor again = declined.run(in, &refusing).at("y");
    EXPECT_EQ(0, std::memcmp(want.raw(), again.raw(), want.nbytes()));
    EXPECT_EQ(refusing.events, (std::vector<std::string>{"qk", "scale", "softmax", "pv"}));
  }
}

TEST(Session, ViewOpsTakeOverTheBufferOfAnInputThatDiesThere) {
  // n = Neg(x) and k = Abs(x) both live while n goes through Reshape -> Unsqueeze -> Reshape; then
  // two small products. Node by node (observed) each view copies, so n, its copy and k are live
  // at once; without observer the views take n's buffer over: at most n and k.
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {64, 1024}).output("y", onnx::TensorProto::FLOAT);
  b.initializer_i64("flip", {1024, 64}).initializer_i64("axes", {0}).initializer_i64("back", {64, 1024});
  b.initializer("w", std::vector<float>(1024, 0.5f), {1024, 1});
  b.node("Neg", {"x"}, {"n"}, "neg");
  b.node("Abs", {"x"}, {"k"}, "abs");
  b.node("Reshape", {"n", "flip"}, {"r"}, "reshape");
  b.node("Unsqueeze", {"r", "axes"}, {"u"}, "unsqueeze");
  b.node("Reshape", {"u", "back"}, {"s"}, "reshape_back");
  b.node("MatMul", {"s", "w"}, {"p"}, "mm_s");
  b.node("MatMul", {"k", "w"}, {"q"}, "mm_k");
  b.node("Add", {"p", "q"}, {"y"}, "add");
  Graph g = b.graph();
  std::vector<float> v(64 * 1024);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i) * 0.01f);
  const std::map<std::string, Tensor> in = {{"x", floats({64, 1024}, v)}};
  Session plain(g), observed(g);
  Recorder rec;
  const Tensor y = plain.run(in).at("y");
  const Tensor want = observed.run(in, &rec).at("y");
  EXPECT_EQ(rec.events.size(), 8u);
  ASSERT_EQ(y.shape(), (Shape{64, 1}));
  EXPECT_EQ(0, std::memcmp(y.raw(), want.raw(), y.nbytes()));
  for (std::int64_t r = 0; r < 64; ++r) {
    double sum = 0;
    for (std::int64_t c = 0; c < 1024; ++c)
      sum += 0.5 * (std::fabs(v[std::size_t(r * 1024 + c)]) - v[std::size_t(r * 1024 + c)]);
    EXPECT_NEAR(y.data<float>()[r], sum, 1e-3) << r;
  }
  const std::size_t tensor = 64 * 1024 * sizeof(float);
  EXPECT_GE(observed.last_live_activation_bytes(), 3 * tensor);
  EXPECT_LE(plain.last_live_activation_bytes(), 2 * tensor + 1024);
  // Again on the kept buffers: the same bytes.
  const Tensor again = plain.run(in).at("y");
  EXPECT_EQ(0, std::memcmp(again.raw(), want.raw(), y.nbytes()));

  // An observer that never reads a view's input lets the views take the buffer over too: it sees
  // every node, every view output holds n's values, and only n and k are live at once.
  struct OutputsOnly final : Observer {
    void on_node(const NodeEvent& e) override {
      if (e.node.op_type == "Reshape" || e.node.op_type == "Unsqueeze") {
        ASSERT_EQ(e.outputs[0]->numel(), 64 * 1024);
        view_sums.push_back(std::accumulate(e.outputs[0]->data<float>(), e.outputs[0]->data<float>() + 64 * 1024, 0.0));
      }
      ++events;
    }
    bool reads_view_inputs() const override { return false; }
    std::vector<double> view_sums;
    int events = 0;
  } outputs_only;
  Session lean(g);
  const Tensor lean_y = lean.run(in, &outputs_only).at("y");
  EXPECT_EQ(0, std::memcmp(lean_y.raw(), want.raw(), y.nbytes()));
  EXPECT_EQ(outputs_only.events, 8);
  const double n_sum = -std::accumulate(v.begin(), v.end(), 0.0);
  ASSERT_EQ(outputs_only.view_sums.size(), 3u);
  for (double sum : outputs_only.view_sums) EXPECT_NEAR(sum, n_sum, 1e-3);
  EXPECT_LE(lean.last_live_activation_bytes(), 2 * tensor + 1024);
  // A retaining execution keeps every input readable: its views copy.
  Session::Execution retained(lean, in, &outputs_only, true);
  retained.finish();
  EXPECT_GE(lean.last_live_activation_bytes(), 3 * tensor);

  // An observer that still needs n after its last reader (the reshape) keeps it: the view copies
  // instead of taking n's buffer, and n's buffer goes to the handle instead of to the pool.
  struct Keeper final : Observer {
    void on_node(const NodeEvent& e) override {
      if (e.node.name == "neg") {
        n = e.keep(e.outputs[0]);
        at = e.outputs[0];
      }
    }
    bool reads_view_inputs() const override { return false; }
    KeptValue n;
    const Tensor* at = nullptr;
  } keeper;
  Session keeping(g);
  const Tensor kept_y = keeping.run(in, &keeper).at("y");
  EXPECT_EQ(0, std::memcmp(kept_y.raw(), want.raw(), y.nbytes()));
  ASSERT_TRUE(keeper.n.owned());
  EXPECT_NE(keeper.n.get(), keeper.at);  // moved out of the execution's slot
  ASSERT_EQ(keeper.n.get()->shape(), (Shape{64, 1024}));
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(keeper.n.get()->data<float>()[i], -v[i]) << i;
  EXPECT_GE(keeping.last_live_activation_bytes(), 3 * tensor);  // the views copied
  keeper.n.let_go();
}

TEST(Session, DeadBuffersAreReused) {
  // A chain of 12 Relu on 1 MiB tensors: without reuse 12 MiB would be live.
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {256, 1024}).output("y11", onnx::TensorProto::FLOAT);
  std::string prev = "x";
  for (int i = 0; i < 12; ++i) {
    // append, not "y" + ...: GCC 12 reports a -Wrestrict false positive on the latter here.
    const std::string out = std::string("y").append(std::to_string(i));
    b.node("Relu", {prev}, {out}, std::string("relu").append(std::to_string(i)));
    prev = out;
  }
  Graph g = b.graph();
  Session s(g);
  s.run({{"x", Tensor(DType::kFloat32, {256, 1024})}});
  EXPECT_LE(s.last_peak_activation_bytes(), 2u * 1024 * 1024 + 8192);
}

// A run for its observer alone (local error: one node on the reference's values, thousands of
// runs a call) returns no output, and its output's buffer goes back to the pool for the next run:
// freed with the execution, a device buffer was allocated (and zeroed) again at every run.
TEST(Session, RunsForTheObserverAloneReuseTheirOutputBuffers) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {256, 1024}).output("y", onnx::TensorProto::FLOAT);
  b.node("Relu", {"x"}, {"y"}, "relu");
  Graph g = b.graph();
  std::vector<float> v(256 * 1024);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 7) - 3.0f;
  const std::map<std::string, Tensor> in = {{"x", floats({256, 1024}, v)}};
  struct Seen : Observer {
    const void* buffer = nullptr;
    float first = -1;
    void on_node(const NodeEvent& e) override {
      buffer = e.outputs[0]->raw();
      first = e.outputs[0]->data<float>()[4];
    }
  };
  SessionOptions options;
  options.pool = Session::make_pool();
  Session s(g, options);
  Seen a, b2;
  Session::Execution(s, in, &a).finish_unread();
  const std::size_t after_first = Session::pool_allocated_bytes(*options.pool);
  Session::Execution(s, in, &b2).finish_unread();
  EXPECT_EQ(a.first, 1.0f);  // Relu(4 % 7 - 3)
  EXPECT_EQ(b2.buffer, a.buffer) << "the second run's output is the first's buffer";
  EXPECT_EQ(Session::pool_allocated_bytes(*options.pool), after_first);
}

// Ops keep no temporaries of their own between runs (each Conv kept its padded input: ~1 GB on a
// 1024x1024 model, int8 convolutions their im2col matrix): after a run the heap holds the pool's
// activation buffers and this thread's one lent padded input, not one per Conv.
TEST(Session, ConvTemporariesAreLentByTheThreadNotKeptPerOp) {
  std::thread([] {  // a thread of its own: no lent buffers from earlier tests
    constexpr int kConvs = 8;
    OnnxBuilder b;
    b.input("x", onnx::TensorProto::FLOAT, {1, 4, 256, 256});
    b.output(std::string("y").append(std::to_string(kConvs - 1)), onnx::TensorProto::FLOAT);
    std::string prev = "x";
    for (int i = 0; i < kConvs; ++i) {
      const std::string w = std::string("w").append(std::to_string(i)), y = std::string("y").append(std::to_string(i));
      b.initializer(w, std::vector<float>(4 * 4 * 9, 0.05f), {4, 4, 3, 3});
      auto& n = b.node("Conv", {prev, w}, {y}, std::string("conv").append(std::to_string(i)));
      auto* a = n.add_attribute();
      a->set_name("pads");
      a->set_type(onnx::AttributeProto::INTS);
      for (int k = 0; k < 4; ++k) a->add_ints(1);
      prev = y;
    }
    const Graph g = b.graph();
    const std::map<std::string, Tensor> inputs = {
        {"x", floats({1, 4, 256, 256}, std::vector<float>(4 * 256 * 256, 1.0f))}};
    auto heap = [] {
      const struct mallinfo2 m = mallinfo2();
      return m.uordblks + m.hblkhd;  // in use: heap chunks and mmapped blocks
    };
    const std::size_t before = heap();
    SessionOptions options;
    options.pool = Session::make_pool();
    Session s(g, options);
    auto out = s.run(inputs);
    const std::size_t held = heap() - before, padded = 4 * 258 * 258 * sizeof(float);
    EXPECT_EQ(kernels::thread_lent_bytes(), padded);
    // The pool's buffers (the output among them), the lent padded input, weights, plans and the
    // GEMM's per-thread panels (thread_scratch); one padded input per Conv would be 8.5 MB more.
    EXPECT_LE(held, Session::pool_allocated_bytes(*options.pool) + padded + 1024 * 1024);
    EXPECT_GT(held, Session::pool_allocated_bytes(*options.pool));
  })
      .join();
}

// Stepping an execution by hand gives run()'s outputs; with `retain` every value an observer saw
// stays as it was until finish() (no buffer goes back to the pool), and the next retaining
// execution of the same plan reuses those buffers in place.
TEST(Session, ExecutionStepsNodeByNodeAndRetainsValuesUntilFinish) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {256, 1024}).output("y11", onnx::TensorProto::FLOAT);
  std::string prev = "x";
  for (int i = 0; i < 12; ++i) {
    const std::string out = std::string("y").append(std::to_string(i));
    // Elementwise chains n0-n4 and n6-n11 (each one step), a Softmax alone between them.
    b.node(i == 5 ? "Softmax" : i % 2 ? "Neg" : "Relu", {prev}, {out}, std::string("n").append(std::to_string(i)));
    prev = out;
  }
  Graph g = b.graph();
  std::vector<float> v(256 * 1024);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i) * 0.01f) - 0.2f;
  const std::map<std::string, Tensor> in = {{"x", floats({256, 1024}, v)}};
  Session plain(g);
  const Tensor want = plain.run(in).at("y11");

  // Keeps a pointer to every output and a copy of it.
  struct Keep : Observer {
    std::vector<std::pair<const Tensor*, Tensor>> seen;
    std::vector<std::size_t> index;
    void on_node(const NodeEvent& e) override {
      seen.emplace_back(e.outputs[0], *e.outputs[0]);
      index.push_back(e.index);
    }
  };
  Session s(g);
  std::vector<const void*> first_round;  // the buffers of y0..y10 (y11 is handed over)
  for (int round = 0; round < 2; ++round) {
    Keep keep;
    Session::Execution x(s, in, &keep, /*retain=*/true);
    std::vector<std::vector<std::size_t>> steps;
    while (!x.done()) {
      const auto next = x.next_indices();
      steps.emplace_back(next.begin(), next.end());
      EXPECT_EQ(x.next_index(), next.back());
      EXPECT_EQ(&x.next_node(), &s.nodes()[next.back()]);
      x.step();
    }
    EXPECT_EQ(steps, (std::vector<std::vector<std::size_t>>{{0, 1, 2, 3, 4}, {5}, {6, 7, 8, 9, 10, 11}}));
    EXPECT_EQ(keep.index, (std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
    for (const auto& [live, copy] : keep.seen)  // nothing was released and overwritten
      EXPECT_EQ(0, std::memcmp(live->raw(), copy.raw(), copy.nbytes()));
    EXPECT_GE(s.last_live_activation_bytes(), 12u * 1024 * 1024);  // all twelve held at once
    std::vector<const void*> buffers;
    for (std::size_t k = 0; k + 1 < keep.seen.size(); ++k) buffers.push_back(keep.seen[k].first->raw());
    if (round == 0) first_round = buffers;
    else EXPECT_EQ(buffers, first_round);  // reused in place
    const Tensor y = x.finish().at("y11");
    EXPECT_EQ(0, std::memcmp(y.raw(), want.raw(), want.nbytes())) << round;
  }
  // Without retain the buffers are reused as they die: at most two live.
  Session::Execution x(s, in);
  const Tensor y = x.finish().at("y11");
  EXPECT_EQ(0, std::memcmp(y.raw(), want.raw(), want.nbytes()));
  EXPECT_LE(s.last_live_activation_bytes(), 2u * 1024 * 1024 + 8192);
}

// Each weight-carrying op once through the session (which prepares packed weights) and once
// called directly without prepare: the same bits.
TEST(Session, PreparedWeightsGiveTheSameBitsAsUnpreparedOps) {
  auto ramp = [](std::size_t n, float scale) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(float(i) * scale);
    return v;
  };
  struct Case {
    std::string op;
    Shape x, w;
    int trans_b = -1;  // Gemm's transB
  };
  for (const Case& c :
       {Case{"MatMul", {2, 40, 48}, {48, 56}}, Case{"Gemm", {70, 48}, {56, 48}, 1},
        Case{"Conv", {1, 16, 12, 12}, {24, 16, 3, 3}}, Case{"ConvTranspose", {1, 16, 12, 12}, {16, 8, 4, 4}}}) {
    OnnxBuilder b;
    b.input("x", onnx::TensorProto::FLOAT, c.x).output("y", onnx::TensorProto::FLOAT);
    b.initializer("w", ramp(std::size_t(shape_numel(c.w)), 0.37f), c.w);
    auto& n = b.node(c.op, {"x", "w"}, {"y"}, "node");
    if (c.trans_b >= 0) {
      auto* a = n.add_attribute();
      a->set_name("transB");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(c.trans_b);
    }
    if (c.op == "ConvTranspose") {
      auto* a = n.add_attribute();
      a->set_name("strides");
      a->set_type(onnx::AttributeProto::INTS);
      a->add_ints(2);
      a->add_ints(2);
    }
    Graph g = b.graph();
    const Tensor x = floats(c.x, ramp(std::size_t(shape_numel(c.x)), 0.11f));
    Session s(g);
    const Tensor y = s.run({{"x", x}}).at("y");
    std::unique_ptr<Op> op = find_op("", c.op, 17)->make(g.nodes[0]);
    const Tensor& w = g.initializers.at("w");
    const ValueMeta mx = meta_of(DType::kFloat32, x.shape()), mw = meta_of(DType::kFloat32, w.shape());
    const ValueMeta* metas[] = {&mx, &mw};
    Tensor direct(DType::kFloat32, op->infer(metas)[0].shape);
    const Tensor* ins[] = {&x, &w};
    Tensor* outs[] = {&direct};
    op->run(ins, outs);
    ASSERT_EQ(y.shape(), direct.shape()) << c.op;
    EXPECT_EQ(0, std::memcmp(y.raw(), direct.raw(), y.nbytes())) << c.op;
  }
}

TEST(Session, Fp16PrecisionRoundsWeightsAndOutputs) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT);
  b.node("Add", {"x", "w"}, {"y"}, "add");
  b.initializer("w", {0.1f, 1000.0f}, {2});
  Graph g = b.graph();
  Session fp32(g), fp16(g, SessionOptions{Precision::kFp16}), bf16(g, SessionOptions{Precision::kBf16});
  auto in = floats({2}, {1.0f, 0.3f});
  const float y32 = fp32.run({{"x", in}}).at("y").data<float>()[0];
  const float y16 = fp16.run({{"x", in}}).at("y").data<float>()[0];
  const float yb16 = bf16.run({{"x", in}}).at("y").data<float>()[0];
  EXPECT_EQ(y32, 1.1f);
  // fp16: w rounds to 0.0999755859375, the sum 1.0999755859375 rounds to 1.099609375.
  EXPECT_EQ(y16, round_to_float16(1.0f + round_to_float16(0.1f)));
  EXPECT_NE(y16, y32);
  EXPECT_EQ(yb16, round_to_bfloat16(1.0f + round_to_bfloat16(0.1f)));
  EXPECT_EQ(fp16.run({{"x", in}}).at("y").data<float>()[1], round_to_float16(1000.0f + round_to_float16(0.3f)));
}

TEST(Session, Float16ModelsRunAndAnswerInFloat16) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT16, {2}).output("y", onnx::TensorProto::FLOAT16);
  b.node("Mul", {"x", "w"}, {"y"}, "mul");
  auto* t = b.proto().mutable_graph()->add_initializer();
  t->set_name("w");
  t->set_data_type(onnx::TensorProto::FLOAT16);
  t->add_dims(2);
  t->add_int32_data(to_float16(3.0f).bits);
  t->add_int32_data(to_float16(0.1f).bits);
  Graph g = b.graph();
  Session s(g);
  Tensor x(DType::kFloat16, {2});
  std::uint16_t bits[2] = {to_float16(1.5f).bits, to_float16(3.0f).bits};
  std::memcpy(x.raw(), bits, 4);
  Tensor y = s.run({{"x", x}}).at("y");
  ASSERT_EQ(y.dtype(), DType::kFloat16);
  std::uint16_t out[2];
  std::memcpy(out, y.raw(), 4);
  EXPECT_EQ(to_float(float16{out[0]}), 4.5f);
  EXPECT_EQ(to_float(float16{out[1]}), round_to_float16(3.0f * round_to_float16(0.1f)));
}

TEST(Session, PrecisionNamesRoundTrip) {
  for (const std::string& name : precision_names()) {
    const std::optional<Precision> p = precision_from_name(name);
    ASSERT_TRUE(p) << name;
    EXPECT_EQ(precision_name(*p), name);
  }
  EXPECT_EQ(precision_names().size(), 5u);  // fp32, fp16, bf16, fp16-strict, bf16-strict
  EXPECT_FALSE(precision_from_name("fp8"));
  EXPECT_FALSE(precision_from_name("FP16"));
}

}  // namespace
}  // namespace qeval::eval
