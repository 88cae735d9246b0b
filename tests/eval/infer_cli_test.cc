// `qeval infer` and `qeval inspect` as users run them: .npy in and out, --dump-all, exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdlib>

#include "datasets/npy.h"
#include "eval/run/infer.h"
#include "onnx_builder.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

using testing::floats;
using testing::OnnxBuilder;

testing::CliRun qeval(const std::string& args) { return testing::run_qeval(args); }

// y = relu(x + w), with names that need sanitising.
void write_model(const std::filesystem::path& path) {
  OnnxBuilder b;
  b.input("in/x:0", onnx::TensorProto::FLOAT, {-1, 3}).output("out y", onnx::TensorProto::FLOAT);
  b.node("Add", {"in/x:0", "w"}, {"sum"}, "add");
  b.node("Relu", {"sum"}, {"out y"}, "relu");
  b.initializer("w", {1, -1, 0.5f}, {3});
  testing::write_bytes(path, b.bytes());
}

TEST(InferCli, RunsAModelOnNpyFilesAndDumpsIntermediates) {
  testing::ScratchDir dir("infer");
  write_model(dir / "m.onnx");
  std::filesystem::create_directories(dir / "in");
  datasets::write_npy(dir / "in" / "in_x_0.npy", floats({2, 3}, {1, 1, 1, -2, 0, -1}));
  auto r = qeval("infer --model " + (dir / "m.onnx").string() + " --inputs " + (dir / "in").string() + " --out " +
                 (dir / "out").string() + " --dump-all " + (dir / "dump").string());
  ASSERT_EQ(r.code, 0) << r.out;
  Tensor y = datasets::read_npy(dir / "out" / "out_y.npy");
  ASSERT_EQ(y.shape(), (Shape{2, 3}));
  const float* p = y.data<float>();
  EXPECT_EQ(p[0], 2.0f);
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_EQ(p[2], 1.5f);
  EXPECT_EQ(p[3], 0.0f);
  EXPECT_TRUE(std::filesystem::exists(dir / "dump" / "sum.npy"));
  EXPECT_TRUE(std::filesystem::exists(dir / "dump" / "out_y.npy"));
  auto index = testing::read_json(dir / "dump" / "index.json");
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[0]["tensor"], "sum");
  EXPECT_EQ(index[1]["file"], "out_y.npy");
}

TEST(InferCli, RepeatTimesTheRunsAndAGpuThatIsNotThereIsExitTwo) {
  testing::ScratchDir dir("infer-device");
  write_model(dir / "m.onnx");
  std::filesystem::create_directories(dir / "in");
  datasets::write_npy(dir / "in" / "in_x_0.npy", floats({2, 3}, {1, 1, 1, -2, 0, -1}));
  const std::string io = " --model " + (dir / "m.onnx").string() + " --inputs " + (dir / "in").string() + " --out " +
                         (dir / "out").string();
  auto timed = qeval("infer --device cpu --repeat 3" + io);
  ASSERT_EQ(timed.code, 0) << timed.out;
  EXPECT_NE(timed.out.find("(fp32 precision, cpu)"), std::string::npos) << timed.out;
  EXPECT_NE(timed.out.find("--repeat 3: median"), std::string::npos) << timed.out;

  auto bad = qeval("infer --device tpu" + io);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--device tpu: expected cpu, cuda or cuda:N"), std::string::npos) << bad.out;
  EXPECT_EQ(qeval("infer --device cuda:x" + io).code, 2);
  // This machine has no GPU (the GPU suite runs elsewhere: scripts/test-gpu.sh); a build without
  // the CUDA backend says so, one with it names the missing device. Either way nothing is written.
  if (std::getenv("QEVAL_TEST_HAS_GPU")) GTEST_SKIP() << "QEVAL_TEST_HAS_GPU is set: a GPU is expected here";
  std::filesystem::remove_all(dir / "out");
  auto gpu = qeval("infer --device cuda:3" + io);
  EXPECT_EQ(gpu.code, 2) << gpu.out;
  EXPECT_TRUE(gpu.out.find("built without the CUDA backend") != std::string::npos ||
              gpu.out.find("cuda:3") != std::string::npos)
      << gpu.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(InferCli, ProfileStepsPrintsTheTimeByOpType) {
  testing::ScratchDir dir("infer-profile");
  write_model(dir / "m.onnx");
  std::filesystem::create_directories(dir / "in");
  datasets::write_npy(dir / "in" / "in_x_0.npy", floats({2, 3}, {1, 1, 1, -2, 0, -1}));
  ::setenv("QEVAL_PROFILE_STEPS", "1", 1);
  auto r = qeval("infer --repeat 2 --model " + (dir / "m.onnx").string() + " --inputs " + (dir / "in").string() +
                 " --out " + (dir / "out").string());
  ::unsetenv("QEVAL_PROFILE_STEPS");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("QEVAL_PROFILE_STEPS"), std::string::npos) << r.out;
  // Add and Relu run as one fused chain; the first of the three calls is left out.
  EXPECT_NE(r.out.find("fused:chain                       2 steps"), std::string::npos) << r.out;
}

TEST(InferCli, BadInputsExitTwoWithTheReason) {
  testing::ScratchDir dir("infer-bad");
  write_model(dir / "m.onnx");
  std::filesystem::create_directories(dir / "empty");
  auto missing = qeval("infer --model " + (dir / "m.onnx").string() + " --inputs " + (dir / "empty").string() +
                       " --out " + (dir / "out").string());
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.out.find("missing input file for model input 'in/x:0'"), std::string::npos) << missing.out;

  std::filesystem::create_directories(dir / "in");
  datasets::write_npy(dir / "in" / "in_x_0.npy", Tensor(DType::kInt64, {2, 3}));
  auto dtype = qeval("infer --model " + (dir / "m.onnx").string() + " --inputs " + (dir / "in").string() + " --out " +
                     (dir / "out").string());
  EXPECT_EQ(dtype.code, 2);
  EXPECT_NE(dtype.out.find("must be float32, got int64"), std::string::npos) << dtype.out;

  datasets::write_npy(dir / "in" / "in_x_0.npy", floats({6}, std::vector<float>(6, 1.0f)));
  auto shape = qeval("infer --model " + (dir / "m.onnx").string() + " --inputs " + (dir / "in").string() + " --out " +
                     (dir / "out").string());
  EXPECT_EQ(shape.code, 2);
  EXPECT_NE(shape.out.find("has shape [6], the model expects [d0, 3]"), std::string::npos) << shape.out;
  auto reshaped = qeval("infer --model " + (dir / "m.onnx").string() + " --inputs " + (dir / "in").string() +
                        " --out " + (dir / "out").string() + " --shape in/x:0=2,3");
  EXPECT_EQ(reshaped.code, 0) << reshaped.out;

  testing::write_bytes(dir / "bad.onnx", {'n', 'o', 'p', 'e'});
  auto bad = qeval("infer --model " + (dir / "bad.onnx").string() + " --inputs " + (dir / "in").string() + " --out " +
                   (dir / "out").string());
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("not an ONNX model"), std::string::npos) << bad.out;
}

TEST(InferCli, InspectDescribesTheModel) {
  testing::ScratchDir dir("inspect");
  write_model(dir / "m.onnx");
  auto r = qeval("inspect --model " + (dir / "m.onnx").string());
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* want : {"opsets: ai.onnx=17", "in/x:0 float32 [d0, 3]", "Add", "Relu",
                           "parameters: 3 in 1 initializers", "unsupported ops: none"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {2}).output("y", onnx::TensorProto::FLOAT);
  b.node("NotAnOp", {"x"}, {"y"}, "n");
  testing::write_bytes(dir / "u.onnx", b.bytes());
  auto u = qeval("inspect --model " + (dir / "u.onnx").string());
  EXPECT_EQ(u.code, 1);
  EXPECT_NE(u.out.find("NotAnOp (ai.onnx opset 17) is not supported"), std::string::npos) << u.out;
}

TEST(InferCli, ShapeOptionParsing) {
  EXPECT_EQ(parse_shape_option("latent=1,4,64,64").second, (Shape{1, 4, 64, 64}));
  EXPECT_EQ(parse_shape_option("a=b=3").first, "a=b");
  EXPECT_THROW(parse_shape_option("x"), InputError);
  EXPECT_THROW(parse_shape_option("x=1,-2"), InputError);
  EXPECT_THROW(parse_shape_option("x=1,,2"), InputError);
  EXPECT_EQ(base::file_name_for("a/b:0 c"), "a_b_0_c");
}

}  // namespace
}  // namespace qeval::eval
