// Regression tests for what the libFuzzer targets (tests/fuzz/, docs/fuzzing.md) found: each
// input must end in an InputError (exit 2) naming the file and key, never another exception.
// The crashing inputs are in tests/fuzz/corpus/<target>/finding-*.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "base/json_config.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "eval/quant/recipe.h"
#include "eval/run/gate.h"
#include "eval/run/run_config.h"
#include "kernels/error.h"
#include "onnx_builder.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Expects an InputError whose message holds every one of `parts`.
template <class F>
void expect_input_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const InputError& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an InputError: " << e.what();
  }
}

// fuzz_run_config: a path with a name over NAME_MAX made std::filesystem::exists throw
// filesystem_error ("File name too long"): exit 3.
TEST(FuzzRegressions, RunConfigPathTooLongForTheSystemIsAnInputError) {
  const std::string name(300, 'a');
  expect_input_error(
      [&] {
        eval::parse_run_config(R"({"pipeline": ")" + name + R"(", "variants": [{"name": "a"}, {"name": "b"}]})",
                               testing::source_dir() / "fuzz-run.json");
      },
      {"fuzz-run.json", "pipeline", "File name too long"});
  expect_input_error(
      [&] {
        eval::parse_run_config(R"({"pipeline": "models/tiny-sd", "variants": [{"name": "a"},
                                 {"name": "b", "recipe": ")" +
                                   name + R"("}]})",
                               testing::source_dir() / "fuzz-run.json");
      },
      {"recipe", "File name too long"});
  // The CLI: exit 2 with the message, not "internal error".
  testing::ScratchDir dir("fuzz-long-path");
  const fs::path config = testing::write_text(
      dir, "c.json", R"({"pipeline": ")" + name + R"(", "variants": [{"name": "a"}, {"name": "b"}]})");
  const auto r = testing::run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("File name too long"), std::string::npos) << r.out;
}

// fuzz_gate: std::regex compiles recursively; a 'nodes' pattern of 100000 characters or 30000
// nested groups overflowed the stack (SIGSEGV from `qeval compare-images --gate`).
TEST(FuzzRegressions, DeepOrLongNodePatternsAreInputErrorsNotStackOverflows) {
  const auto gate = [](const std::string& nodes) {
    return R"({"checks": [{"metric": "ssim", "min": 0}], "layers": [{"column": "acc_sqnr_db", "min": 1, "nodes": ")" +
           nodes + R"("}]})";
  };
  expect_input_error([&] { eval::parse_gate(gate(std::string(100000, 'a')), "g.json"); },
                     {"g.json", "layers[0]", "'nodes'", "longer than 4096 characters"});
  expect_input_error([&] { eval::parse_gate(gate(std::string(2000, '(') + "a" + std::string(2000, ')')), "g.json"); },
                     {"g.json", "layers[0]", "nested 2000 deep"});
  // Within the bounds: still compiled, still checked.
  EXPECT_NO_THROW(eval::parse_gate(gate(std::string(200, '(') + "a" + std::string(200, ')')), "g.json"));
  EXPECT_NO_THROW(eval::parse_gate(gate("[(((]" + std::string(300, 'b')), "g.json"));  // '(' in a class
  expect_input_error([&] { eval::parse_gate(gate("(a"), "g.json"); }, {"not a valid regular expression"});

  // A recipe's 'exclude' patterns go through the same compiler.
  const json recipe = {{"name", "r"}, {"format", "int8"}, {"level", 3}, {"exclude", {std::string(5000, 'x')}}};
  expect_input_error([&] { eval::quant::parse_recipe(base::JsonConfig(recipe, "r.json", "", "docs/recipes.md")); },
                     {"exclude[0]", "longer than 4096"});

  // The CLI: exit 2, not a signal.
  testing::ScratchDir dir("fuzz-deep-regex");
  const fs::path g = testing::write_text(dir, "g.json", gate(std::string(30000, '(') + "a" + std::string(30000, ')')));
  const auto r = testing::run_qeval("compare-images --ref " + (testing::source_dir() / "samples/ref").string() +
                                    " --test " + (testing::source_dir() / "samples/test").string() + " --gate " +
                                    g.string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("longer than 4096 characters (60001)"), std::string::npos) << r.out;
}

// fuzz_onnx_loader: a zero-element input under fp16 (its rounding copy) passed a null pointer to
// memcpy (UBSan: undefined behaviour, even for 0 bytes). Empty tensors now own storage, and an
// empty default tensor is never reused as a buffer. The model is the ONNX node test
// reshape_allowzero_reordered (a seed of the corpus).
TEST(FuzzRegressions, EmptyTensorsOwnStorageAndZeroElementInputsRun) {
  const Tensor empty(DType::kFloat32, {0, 3, 4});
  EXPECT_NE(empty.raw(), nullptr);
  EXPECT_NE(Tensor(empty).raw(), nullptr);
  Tensor unallocated;
  EXPECT_FALSE(unallocated.reuse_as(DType::kFloat32, {0}));

  const eval::Graph g =
      eval::load_onnx(testing::source_dir() / "tests/fuzz/corpus/onnx_loader/node_reshape_allowzero_reordered.onnx");
  Tensor shape(DType::kInt64, {3});
  shape.data<std::int64_t>()[0] = 3;
  shape.data<std::int64_t>()[1] = 4;
  shape.data<std::int64_t>()[2] = 0;
  for (auto precision : {eval::Precision::kFp32, eval::Precision::kFp16}) {
    eval::SessionOptions options;
    options.precision = precision;
    eval::Session session(g, options);
    const auto out = session.run(std::map<std::string, Tensor>{{"data", empty}, {"shape", shape}});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out.begin()->second.shape(), (Shape{3, 4, 0}));
  }
}

// fuzz_onnx_loader: Upsample with a scale of 3.2e35 cast the output size to int64 (undefined
// behaviour; UBSan float-cast-overflow). Now an InputError naming the node and the size.
TEST(FuzzRegressions, ResizeScaleBeyondInt64IsAnInputError) {
  const eval::Graph g =
      eval::load_onnx(testing::source_dir() / "tests/fuzz/corpus/onnx_loader/finding-upsample-huge-scale.onnx");
  ASSERT_EQ(g.inputs.size(), 1u);
  Shape shape;
  for (std::int64_t d : g.inputs[0].dims) shape.push_back(d);
  const Tensor x(DType::kFloat32, shape);
  eval::Session session(g);
  expect_input_error(
      [&] {
        session.run(std::map<std::string, Tensor>{{g.inputs[0].name, x}});
      },
      {"Upsample", "output dimension 0", "not a size"});
}

// fuzz_onnx_loader: a node with more outputs than its op gives (Log with 2) threw std::logic_error
// while planning (exit 3). It is the model's mistake: an InputError naming the node.
TEST(FuzzRegressions, NodeWithMoreOutputsThanItsOpIsAnInputError) {
  const eval::Graph g =
      eval::load_onnx(testing::source_dir() / "tests/fuzz/corpus/onnx_loader/finding-extra-node-output.onnx");
  ASSERT_EQ(g.inputs.size(), 1u);
  Shape shape;
  for (std::int64_t d : g.inputs[0].dims) shape.push_back(d < 0 ? 2 : d);
  const Tensor x(DType::kFloat32, shape);
  eval::Session session(g);
  expect_input_error(
      [&] {
        session.run(std::map<std::string, Tensor>{{g.inputs[0].name, x}});
      },
      {"(Log)", "has 2 outputs; the op gives 1"});
}

// fuzz_gate: a check's "stat" given as a number threw nlohmann's type_error (exit 3).
TEST(FuzzRegressions, GateStatThatIsNotAStringIsAnInputError) {
  const std::string text =
      testing::read_text(testing::source_dir() / "tests/fuzz/corpus/gate/finding-stat-not-a-string.json");
  ASSERT_FALSE(text.empty());
  expect_input_error([&] { eval::parse_gate(text, "g.json", eval::GateMetrics::kRun); },
                     {"g.json", "checks[0]", "'stat' must be a string", "0.97"});
}

// The inputs the fuzz target gives a model: declared dims (symbolic ones 2), zero bytes but for
// float32 (i % 7 - 3) * 0.375 and integers i % 3.
std::map<std::string, Tensor> fuzz_inputs(const eval::Graph& g) {
  std::map<std::string, Tensor> inputs;
  for (const auto& in : g.inputs) {
    Shape shape;
    for (std::int64_t d : in.dims) shape.push_back(d < 0 ? 2 : d);
    Tensor t(in.dtype, shape);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      if (in.dtype == DType::kInt64) t.data<std::int64_t>()[i] = i % 3;
      if (in.dtype == DType::kInt32) t.data<std::int32_t>()[i] = std::int32_t(i % 3);
      if (in.dtype == DType::kFloat32) t.data<float>()[i] = float(i % 7 - 3) * 0.375f;
    }
    inputs.emplace(in.name, std::move(t));
  }
  return inputs;
}

// fuzz_onnx_loader: QLinearConv added its int32 bias (near INT32_MIN) to the accumulator as a
// signed int: overflow, undefined behaviour (UBSan). The sum now wraps as int32 hardware adds. A
// GCC build wrapped already, so this test cannot fail there; fuzz.sh replays the input under UBSan.
TEST(FuzzRegressions, QLinearConvBiasAddWrapsAndRuns) {
  const eval::Graph g =
      eval::load_onnx(testing::source_dir() / "tests/fuzz/corpus/onnx_loader/finding-qlinearconv-bias-overflow.onnx");
  eval::Session session(g);
  const auto inputs = fuzz_inputs(g);
  std::map<std::string, Tensor> first, second;
  EXPECT_NO_THROW(first = session.run(inputs));
  EXPECT_NO_THROW(second = session.run(inputs));
  ASSERT_EQ(first.size(), second.size());
  for (const auto& [name, t] : first) {
    ASSERT_EQ(t.nbytes(), second.at(name).nbytes()) << name;
    EXPECT_EQ(0, std::memcmp(t.raw(), second.at(name).raw(), t.nbytes())) << name;
  }
}

// fuzz_onnx_loader: Clip-6 on int8 cast its default bounds (-FLT_MAX, FLT_MAX) to int8, undefined
// behaviour (UBSan float-cast-overflow); on x86 both bounds came out 0 and every value was clipped
// to 0. The bounds are now taken into int8's range: values pass through.
TEST(FuzzRegressions, Clip6OnInt8KeepsValuesWithinTheDefaultBounds) {
  eval::Graph g;
  g.source = "clip6.onnx";
  g.opsets[""] = 6;
  g.inputs.push_back({"x", DType::kInt8, {4}, {"", "", "", ""}, true});
  g.outputs.push_back({"y", DType::kInt8, {4}, {"", "", "", ""}, true});
  eval::Node clip;
  clip.name = "clip";
  clip.op_type = "Clip";
  clip.opset = 6;
  clip.inputs = {"x"};
  clip.outputs = {"y"};
  g.nodes.push_back(clip);
  Tensor x(DType::kInt8, {4});
  const std::int8_t values[4] = {-128, -5, 7, 127};
  std::memcpy(x.raw(), values, 4);
  eval::Session session(g);
  const auto out = session.run(std::map<std::string, Tensor>{{"x", x}});
  ASSERT_EQ(out.at("y").numel(), 4);
  EXPECT_EQ(0, std::memcmp(out.at("y").raw(), values, 4));
}

// fuzz_onnx_loader: Resize of an empty axis to size 0 called the kernel, whose invalid_argument
// ("input size must be >= 1") ended the run with exit 3. An empty output is now simply empty.
TEST(FuzzRegressions, ResizeOfAnEmptyAxisRuns) {
  const eval::Graph g =
      eval::load_onnx(testing::source_dir() / "tests/fuzz/corpus/onnx_loader/finding-resize-empty-axis.onnx");
  const std::map<std::string, Tensor> inputs = fuzz_inputs(g);
  eval::Session session(g);
  std::map<std::string, Tensor> out;
  EXPECT_NO_THROW(out = session.run(inputs));
  for (const auto& [name, t] : out) EXPECT_EQ(t.numel(), 0) << name;
}

// fuzz_onnx_loader (UBSan division by zero; SIGFPE in a plain build): a ConvTranspose whose weight
// has no elements divided by its in_channels x out_channels per group while deciding whether to
// pack it at plan time. A model that loads plans and runs, or is an InputError; never a signal.
TEST(FuzzRegressions, ConvTransposeWithAnEmptyWeightPlansWithoutDividingByZero) {
  const eval::Graph g =
      eval::load_onnx(testing::source_dir() / "tests/fuzz/corpus/onnx_loader/finding-convtranspose-empty-weight.onnx");
  try {
    eval::Session session(g);
    session.run(fuzz_inputs(g));
  } catch (const InputError&) {
  }
}

// fuzz_onnx_loader (2026-11-27, the lent machine's 16 cores): a Conv whose weight input is
// [0, 1, 3, 3] reached the kernel, whose std::invalid_argument ("conv: batch 2, channels 1 -> 0")
// was exit 3. A Conv or ConvTranspose with no output channels now gives its empty output, and one
// with no input channels gives every output its channel's bias (the sum over nothing is 0).
TEST(FuzzRegressions, ConvsWithEmptyChannelAxesRunWithoutReachingTheKernel) {
  const eval::Graph found =
      eval::load_onnx(testing::source_dir() / "tests/fuzz/corpus/onnx_loader/finding-conv-empty-weight.onnx");
  eval::Session session(found);
  const Tensor empty = session.run(fuzz_inputs(found)).at("y");
  EXPECT_EQ(empty.shape()[1], 0);
  EXPECT_EQ(empty.numel(), 0);
  for (const char* op : {"Conv", "ConvTranspose"}) {
    SCOPED_TRACE(op);
    testing::OnnxBuilder b(13);
    b.input("x", onnx::TensorProto::FLOAT, {1, 0, 4, 4}).output("y", onnx::TensorProto::FLOAT);
    const bool conv = std::string(op) == "Conv";  // weights [M, C, k, k]; ConvTranspose [C, M, k, k]
    b.initializer("w", {}, conv ? std::vector<std::int64_t>{2, 0, 3, 3} : std::vector<std::int64_t>{0, 2, 3, 3});
    b.initializer("bias", {0.5f, -1.0f}, {2});
    b.node(op, {"x", "w", "bias"}, {"y"}, "conv");
    const eval::Graph g = b.graph();
    eval::Session s(g);
    const Tensor y = s.run({{"x", Tensor(DType::kFloat32, {1, 0, 4, 4})}}).at("y");
    ASSERT_EQ(y.shape()[1], 2);
    for (std::int64_t i = 0; i < y.numel(); ++i)
      ASSERT_EQ(y.data<float>()[i], i < y.numel() / 2 ? 0.5f : -1.0f) << i;
  }
}

}  // namespace
}  // namespace qeval
