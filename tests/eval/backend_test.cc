// The backend seam (eval/exec/backend.h): a backend given in SessionOptions runs every step of an
// execution, fused groups included, with the graph, plan and observers untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "eval/exec/session.h"
#include "onnx_builder.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

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
    return cpu_->elementwise_chain(std::move(stages));
  }
  void round(Tensor& value, Rounding rounding) override {
    if (rounding != Rounding::kNone) ++roundings;
    cpu_->round(value, rounding);
  }
  int runs = 0, attentions = 0, chains = 0, roundings = 0;

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

TEST(Backend, TheDefaultIsTheCpu) {
  EXPECT_EQ(cpu_backend()->name(), "cpu");
  EXPECT_EQ(cpu_backend().get(), cpu_backend().get());
}

}  // namespace
}  // namespace qeval::eval
