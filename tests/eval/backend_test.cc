// The backend seam (eval/exec/backend.h): a backend given in SessionOptions runs every step of an
// execution, fused groups included, with the graph, plan and observers untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "eval/exec/session.h"
#include "eval/fake_device.h"
#include "onnx_builder.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

using testing_fake::FakeDeviceBackend;
using testing_fake::FakeMemory;

using testing::floats;
using testing::OnnxBuilder;

// The CPU backend behind a counter of every call an execution makes.
class CountingBackend final : public Backend {
 public:
  std::string_view name() const override { return "counting"; }
  void run(const Op& op, std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    ++runs;
    cpu_->run(op, in, out);
  }
  std::shared_ptr<FusedKernel> attention(const kernels::AttentionShape& shape) override {
    ++attentions;
    return cpu_->attention(shape);
  }
  std::shared_ptr<FusedKernel> elementwise_chain(std::vector<ChainStage> stages) override {
    ++chains;
    for (const ChainStage& st : stages) chain_nodes.push_back(st.node ? st.node->name : "(no node)");
    return cpu_->elementwise_chain(std::move(stages));
  }
  void round(Tensor& value, Rounding rounding) override {
    if (rounding != Rounding::kNone) ++roundings;
    cpu_->round(value, rounding);
  }
  int runs = 0, attentions = 0, chains = 0, roundings = 0;
  std::vector<std::string> chain_nodes;  // each chain stage's node, in the order they were asked for

 private:
  std::shared_ptr<Backend> cpu_ = cpu_backend();
};

// Attention (MatMul, Mul, Softmax, MatMul), then a Conv-free elementwise chain (Add, Sigmoid, Mul)
// and a Transpose: every kind of step a plan makes.
Graph graph() {
  OnnxBuilder b;
  b.input("q", onnx::TensorProto::FLOAT, {2, 16, 8})
      .input("kt", onnx::TensorProto::FLOAT, {2, 8, 16})
      .input("v", onnx::TensorProto::FLOAT, {2, 16, 4})
      .output("y", onnx::TensorProto::FLOAT);
  b.initializer("scale", {0.35f}, {}).initializer("bias", {0.1f, -0.2f, 0.3f, -0.4f}, {4});
  b.node("MatMul", {"q", "kt"}, {"s"}, "qk");
  b.node("Mul", {"s", "scale"}, {"scaled"}, "scale");
  b.node("Softmax", {"scaled"}, {"p"}, "softmax");
  b.node("MatMul", {"p", "v"}, {"o"}, "pv");
  b.node("Add", {"o", "bias"}, {"a"}, "add");
  b.node("Sigmoid", {"a"}, {"g"}, "sigmoid");
  b.node("Mul", {"a", "g"}, {"m"}, "silu");
  b.node("Transpose", {"m"}, {"y"}, "transpose");  // no perm: the dimensions reversed
  return b.graph();
}

std::map<std::string, Tensor> inputs() {
  auto filled = [](const Shape& shape, float step) {
    std::vector<float> v(std::size_t(shape_numel(shape)));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i) * step);
    return floats(shape, v);
  };
  return {{"q", filled({2, 16, 8}, 0.3f)}, {"kt", filled({2, 8, 16}, 0.7f)}, {"v", filled({2, 16, 4}, 0.2f)}};
}

class Counter final : public Observer {
 public:
  void on_node(const NodeEvent&) override { ++nodes; }
  int nodes = 0;
};

// A device backend maps each chain stage to its own kernels by the stage's node (op type and
// attributes): every stage names its node.
TEST(Backend, ChainStagesNameTheirNodes) {
  auto counting = std::make_shared<CountingBackend>();
  SessionOptions with;
  with.backend = counting;
  const Graph g = graph();  // a session keeps a reference
  Session through(g, with);
  (void)through.run(inputs());
  EXPECT_EQ(counting->chain_nodes, (std::vector<std::string>{"sigmoid", "silu"}));
}

TEST(Backend, AGivenBackendRunsEveryStepWithTheCpuBits) {
  const Graph g = graph();
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    auto counting = std::make_shared<CountingBackend>();
    SessionOptions with{precision};
    with.backend = counting;
    Session cpu(g, SessionOptions{precision}), through(g, with);
    const Tensor want = cpu.run(inputs()).at("y");
    const Tensor got = through.run(inputs()).at("y");
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes())) << precision_name(precision);
    // The plan asked the backend for the attention and the chain kernels (each group once, whichever
    // step list uses it), and node steps went through run(): at least the Transpose.
    EXPECT_GE(counting->attentions, 1) << precision_name(precision);
    EXPECT_GE(counting->chains, 1) << precision_name(precision);
    EXPECT_GE(counting->runs, 1) << precision_name(precision);
    // fp16 rounds what the fused kernels and the Transpose store through the backend too.
    if (precision == Precision::kFp16) EXPECT_GE(counting->roundings, 1);
    else EXPECT_EQ(counting->roundings, 0);

    // Observed, every node is seen and its values come from the same backend: no node ran elsewhere.
    const int runs_before = counting->runs;
    Counter seen;
    const Tensor observed = through.run(inputs(), &seen).at("y");
    EXPECT_EQ(seen.nodes, int(g.nodes.size()));
    EXPECT_GT(counting->runs, runs_before);
    EXPECT_EQ(0, std::memcmp(observed.raw(), want.raw(), want.nbytes())) << precision_name(precision);
  }
}

// fp16: a step that only moves elements of values already rounded (Reshape, Transpose, Concat)
// stores them exact, so no rounding pass runs over its output: two roundings (the Sigmoids'
// outputs), not five, and the CPU session's bits.
TEST(Backend, StepsThatOnlyMoveRoundedValuesAreNotRoundedAgain) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {2, 3, 4}).output("y", onnx::TensorProto::FLOAT);
  b.initializer_i64("shape", {6, 4});
  b.node("Sigmoid", {"x"}, {"a"}, "first");
  b.node("Reshape", {"a", "shape"}, {"r"}, "reshape");
  b.node("Transpose", {"r"}, {"t"}, "transpose");
  auto* axis = b.node("Concat", {"t", "t"}, {"c"}, "concat").add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(0);
  b.node("Sigmoid", {"c"}, {"y"}, "second");
  const Graph g = b.graph();
  std::vector<float> x(24);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.37f * float(i) - 4.0f;
  const std::map<std::string, Tensor> in = {{"x", floats({2, 3, 4}, x)}};
  auto counting = std::make_shared<CountingBackend>();
  SessionOptions with{Precision::kFp16};
  with.backend = counting;
  Session through(g, with), cpu(g, SessionOptions{Precision::kFp16});
  const Tensor got = through.run(in).at("y"), want = cpu.run(in).at("y");
  EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes()));
  EXPECT_EQ(counting->roundings, 2);
}

// Every node's output bytes, as an observer sees them (host memory), and one value kept past its
// release (a reference read after the execution moved on, as lockstep comparison does).
class Recorder final : public Observer {
 public:
  void on_node(const NodeEvent& e) override {
    for (const Tensor* t : e.outputs) {
      ASSERT_TRUE(t && !t->on_device()) << e.node.name;
      outputs[e.node.name] = *t;
    }
    if (e.node.name == "add") kept = e.keep(e.outputs[0]);
  }
  std::map<std::string, Tensor> outputs;
  KeptValue kept;
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(Backend, ADeviceBackendRunsItsNodesOnTheDeviceAndTheRestOnTheCpuWithTheCpuBits) {
  const Graph g = graph();
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    SCOPED_TRACE(std::string(precision_name(precision)));
    auto device = std::make_shared<FakeDeviceBackend>();
    {
      SessionOptions with{precision};
      with.backend = device;
      Session cpu(g, SessionOptions{precision}), dev(g, with);
      const Tensor want = cpu.run(inputs()).at("y");
      const Tensor got = dev.run(inputs()).at("y");
      EXPECT_FALSE(got.on_device());
      EXPECT_TRUE(same_bytes(got, want));
      EXPECT_GE(device->device_runs, 6);  // MatMul, Mul, MatMul, Add, Sigmoid, Mul
      EXPECT_EQ(device->host_runs, 2);    // Softmax, Transpose
      // The plan says which nodes run on the CPU and why.
      const auto host = dev.host_steps({{"q", {2, 16, 8}}, {"kt", {2, 8, 16}}, {"v", {2, 16, 4}}});
      ASSERT_EQ(host.size(), 2u);
      EXPECT_EQ(dev.nodes()[host[0].node].name, "softmax");
      EXPECT_EQ(host[0].why, "fake: no Softmax kernel");
      EXPECT_EQ(dev.nodes()[host[1].node].name, "transpose");

      // Observed: every node's values reach the observer in host memory, equal to the CPU's; a
      // kept device value stays readable after its release.
      Recorder on_cpu, on_device;
      cpu.run(inputs(), &on_cpu);
      const Tensor observed = dev.run(inputs(), &on_device).at("y");
      EXPECT_TRUE(same_bytes(observed, want));
      ASSERT_EQ(on_device.outputs.size(), g.nodes.size());
      for (const auto& [name, t] : on_cpu.outputs) EXPECT_TRUE(same_bytes(on_device.outputs.at(name), t)) << name;
      ASSERT_NE(on_device.kept.get(), nullptr);
      EXPECT_TRUE(same_bytes(*on_device.kept.get(), on_cpu.outputs.at("add")));

      // A retaining execution, twice: the same outputs (device buffers reused in place).
      const std::map<std::string, Tensor> given = inputs();  // must outlive the executions
      for (int i = 0; i < 2; ++i) {
        Session::Execution e(dev, given, nullptr, /*retain=*/true);
        EXPECT_TRUE(same_bytes(e.finish().at("y"), want));
      }
      EXPECT_GT(device->fake().uploads, 0);
      EXPECT_GT(device->fake().downloads, 0);
    }
    // Every device buffer went back when the sessions and kept values were gone.
    EXPECT_EQ(device->fake().allocations, device->fake().releases);
  }
}

// A Shape of a device value is folded at plan time: an unobserved execution never copies that
// value to the host for it (the full-size UNet's 269 Shape nodes cost 100 ms a call on a GPU).
TEST(Backend, AFoldedShapeOfADeviceValueCopiesNothingToTheHost) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {2, 3, 4}).output("y", onnx::TensorProto::FLOAT);
  b.node("Relu", {"x"}, {"r"}, "relu");
  b.node("Shape", {"r"}, {"s"}, "shape");
  b.node("Reshape", {"r", "s"}, {"y"}, "reshape");
  auto device = std::make_shared<FakeDeviceBackend>();
  SessionOptions with;
  with.backend = device;
  const Graph g = b.graph();  // a Session reads its graph: it must outlive it
  Session dev(g, with);
  std::vector<float> v(24);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i) - 11.5f;
  const std::map<std::string, Tensor> in{{"x", floats({2, 3, 4}, v)}};
  const Tensor y = dev.run(in).at("y");
  EXPECT_EQ(device->fake().downloads - device->own_downloads, 1);  // the output, nothing for the Shape
  EXPECT_EQ(y.data<float>()[0], 0.0f);
  EXPECT_EQ(y.data<float>()[23], 11.5f);
  // Observed, the Shape's input reaches the observer in host memory as before.
  Recorder seen;
  dev.run(in, &seen);
  EXPECT_EQ(seen.outputs.count("shape"), 1u);
  // An observer that reads device values gets the Shape's input where it lives: still only the
  // output comes to the host (a full-size 2 x 20 observed run copied 159 GB for its Shapes).
  struct OnDevice final : Observer {
    void on_node(const NodeEvent& e) override {
      if (e.node.name == "shape") input_on_device = e.inputs[0]->on_device();
    }
    bool reads_device_values() const override { return true; }
    bool input_on_device = false;
  } device_reader;
  const int before = device->fake().downloads - device->own_downloads;
  dev.run(in, &device_reader);
  EXPECT_TRUE(device_reader.input_on_device);
  EXPECT_EQ(device->fake().downloads - device->own_downloads - before, 1);
}

// compile() is told which inputs hold values exact in the session's format: at fp16, the graph's
// inputs, a constant, and values stored between kernels; not the MatMul output that the Mul
// epilogue reads in FP32 (keep_fused_intermediates), nor anything at fp32.
TEST(Backend, CompileIsToldWhichInputsAreExactInTheSessionsFormat) {
  const Graph g = graph();
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    auto device = std::make_shared<FakeDeviceBackend>();
    SessionOptions with{precision};
    with.backend = device;
    Session dev(g, with);
    dev.run(inputs());
    const Rounding r = precision == Precision::kFp16 ? Rounding::kFp16 : Rounding::kNone;
    using V = std::vector<Rounding>;
    EXPECT_EQ(device->exact_inputs.at("qk"), (V{r, r})) << precision_name(precision);          // graph inputs
    EXPECT_EQ(device->exact_inputs.at("scale"), (V{Rounding::kNone, r})) << precision_name(precision);  // epilogue
    EXPECT_EQ(device->exact_inputs.at("pv"), (V{r, r})) << precision_name(precision);  // probabilities, v
  }
}

TEST(Backend, DeviceTensorsRefuseHostAccess) {
  auto memory = std::make_shared<FakeMemory>();
  Tensor t(DType::kFloat32, {2, 3}, memory);
  EXPECT_TRUE(t.on_device());
  EXPECT_THROW(t.raw(), std::logic_error);
  EXPECT_THROW(t.data<float>(), std::logic_error);
  Tensor host = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor there = host.to_device(memory);
  Tensor copy = there;  // a device copy
  EXPECT_TRUE(copy.on_device());
  EXPECT_TRUE(same_bytes(copy.to_host(), host));
  EXPECT_THROW(host.device_data(), std::logic_error);
}

TEST(Backend, TheDefaultIsTheCpu) {
  EXPECT_EQ(cpu_backend()->name(), "cpu");
  EXPECT_EQ(cpu_backend().get(), cpu_backend().get());
}

}  // namespace
}  // namespace qeval::eval
