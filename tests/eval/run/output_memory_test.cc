// Memory of a single-model run's output comparison: float32 outputs are compared where they lie,
// not through a copy of each side (1024x1024 ISNet: the copies were the run's peak, 134 MB).
#include <gtest/gtest.h>

#include "../child_process.h"
#include "../onnx_builder.h"
#include "datasets/npy.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kRows = 2048, kCols = 4096;  // 32 MiB of float32
constexpr long kOutputKb = kRows * kCols * 4 / 1024;

// y = Relu(x): an output as large as the input.
fs::path write_relu(const testing::ScratchDir& dir) {
  testing::OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1, 1, kRows, kCols});
  b.output("y", onnx::TensorProto::FLOAT, {1, 1, kRows, kCols});
  b.node("Relu", {"x"}, {"y"}, "relu");
  const auto bytes = b.bytes();
  return testing::write_text(dir, "relu.onnx", std::string(bytes.begin(), bytes.end()));
}

long peak_kb(const std::vector<std::string>& args, const fs::path& log) {
  testing::QevalChild q(args, log);
  EXPECT_EQ(q.exit_code(), 0) << q.log();
  return q.peak_rss_kb();
}

TEST(SingleModelOutputs, AreComparedWithoutCopies) {
  testing::ScratchDir dir("output-memory");
  const fs::path model = write_relu(dir);
  Tensor x(DType::kFloat32, {1, 1, kRows, kCols});
  float* p = x.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) p[i] = float((i * 7919) % 1000) * 0.001f - 0.3f;
  fs::create_directories(dir / "in");
  datasets::write_npy(dir / "in" / "x.npy", x);
  // One inference: the input, its output and the process itself.
  const long infer = peak_kb(
      {"infer", "--model", model.string(), "--inputs", (dir / "in").string(), "--out", (dir / "infer").string()},
      dir / "infer.log");
  // The run compares the variant's output with the reference's (pooled, then judged).
  for (const char* outputs : {"", R"(, "outputs": {"y": {"kind": "tensor"}})"}) {
    const fs::path config = testing::write_text(
        dir, "c.json",
        R"({"pipeline": ")" + model.string() + R"(", "inputs": ")" + (dir / "in").string() +
            R"(", "observe": {"layers": false}, "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}])" +
            outputs + "}");
    fs::remove_all(dir / "run");
    const long run = peak_kb({"run", "--config", config.string(), "--out", (dir / "run").string()}, dir / "run.log");
    // Beside infer's: the second output and the fp16 variant's rounded copy of the input (measured
    // +2.1 outputs); copies of both outputs for the comparison added two more (+4.1).
    EXPECT_LT(run, infer + kOutputKb * 3) << "infer " << infer << " KB, run " << run << " KB" << outputs;
    ::testing::Test::RecordProperty(*outputs ? "judged_run_kb" : "pooled_run_kb", int(run));
  }
  ::testing::Test::RecordProperty("infer_kb", int(infer));
}

}  // namespace
}  // namespace qeval
