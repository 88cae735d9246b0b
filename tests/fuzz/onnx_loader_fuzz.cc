// libFuzzer target: arbitrary bytes as an ONNX model. A model that loads must also plan and run
// (unobserved, then observed) on small inputs; every path ends in outputs or an InputError
// (UnsupportedError is one), never a crash, another exception, a sanitizer report or a hang.
// Build and run: scripts/fuzz.sh (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "kernels/error.h"

namespace {

using namespace qeval;

// Every value the executor allocates stays small, so a model asking for gigabytes is an InputError
// (as it is past the machine's memory in the product) and runs stay fast.
constexpr std::uint64_t kMaxTensorBytes = 4 << 20;
constexpr std::int64_t kMaxInputElements = 1 << 14;
constexpr std::int64_t kSymbolicDim = 2;

// Small values of every kind: negatives, zero, fractions; integers 0..2 (valid indices, axes and
// Reshape dims for small shapes).
void fill(Tensor& t) {
  const std::int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kFloat32:
      for (std::int64_t i = 0; i < n; ++i) t.data<float>()[i] = float(i % 7 - 3) * 0.375f;
      break;
    case DType::kInt64:
      for (std::int64_t i = 0; i < n; ++i) t.data<std::int64_t>()[i] = i % 3;
      break;
    case DType::kInt32:
      for (std::int64_t i = 0; i < n; ++i) t.data<std::int32_t>()[i] = std::int32_t(i % 3);
      break;
    default:  // zero bytes: 0 / 0.0 / false in every other type
      break;
  }
}

class CountingObserver : public eval::Observer {
 public:
  void on_node(const eval::NodeEvent& event) override { events += event.outputs.size(); }
  std::size_t events = 0;
};

void plan_and_run(const eval::Graph& g, eval::Precision precision) {
  eval::SessionOptions options;
  options.precision = precision;
  options.max_tensor_bytes = kMaxTensorBytes;
  eval::Session session(g, options);
  std::map<std::string, Tensor> inputs;
  std::map<std::string, Shape> shapes;
  std::int64_t elements = 0;
  for (const auto& in : g.inputs) {
    Shape shape;
    for (std::int64_t d : in.dims) shape.push_back(d < 0 ? kSymbolicDim : d);
    const auto numel = try_shape_numel(shape);
    if (!numel || *numel > kMaxInputElements || (elements += *numel) > kMaxInputElements) {
      // Too large to run here: plan only (shapes, constant folding).
      for (const auto& i : g.inputs) {
        Shape s;
        for (std::int64_t d : i.dims) s.push_back(d < 0 ? kSymbolicDim : d);
        shapes[i.name] = s;
      }
      session.infer_metas(shapes);
      return;
    }
    Tensor t(in.dtype, shape);
    fill(t);
    inputs.emplace(in.name, std::move(t));
  }
  session.run(inputs);
  CountingObserver observer;
  session.run(inputs, &observer);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  eval::Graph g;
  try {
    g = eval::parse_onnx(std::span(data, size), "fuzz.onnx", "/nonexistent");
  } catch (const InputError&) {
    return 0;
  }
  try {
    plan_and_run(g, eval::Precision::kFp32);
  } catch (const InputError&) {
    return 0;
  }
  // The deployment fold (BatchNormalization into Conv) and rounding only run under fp16.
  try {
    plan_and_run(g, eval::Precision::kFp16);
  } catch (const InputError&) {
  }
  return 0;
}
