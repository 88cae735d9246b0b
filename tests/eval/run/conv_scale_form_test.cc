// `qeval run` with an export whose Conv has a following Mul and Add by per-channel constants folded
// into its weights and bias (ONNX Runtime's ConvMulFusion / ConvAddFusion, another exporter's names):
// the folded Conv is compared at the reference's Add, the report counts it as matched by structure
// and lists the reference's Conv and Mul as folded into it. Before, the folded Conv was matched to
// the reference's Conv (the same weight shapes) and compared with the unscaled values.
#include <gtest/gtest.h>

#include <cmath>

#include "datasets/npy.h"
#include "eval/onnx_builder.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
constexpr int kF32 = onnx::TensorProto::FLOAT;

constexpr std::int64_t kIn = 3, kOut = 4;

std::vector<float> conv_weights() {
  std::vector<float> w(kOut * kIn * 3 * 3);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.3f * std::sin(1.1f * float(i)) + 0.01f;
  return w;
}
const std::vector<float> kBias{0.1f, -0.05f, 0.2f, 0.0f}, kScale{2.0f, 0.5f, -1.25f, 3.0f},
    kShift{0.3f, -0.2f, 0.1f, 0.05f};

void conv_attrs(onnx::NodeProto& conv) {
  auto* pads = conv.add_attribute();
  pads->set_name("pads"), pads->set_type(onnx::AttributeProto::INTS);
  for (int k = 0; k < 4; ++k) pads->add_ints(1);
}

fs::path write_model(const testing::ScratchDir& dir, const std::string& file, bool folded) {
  testing::OnnxBuilder b(13);
  b.input("x", kF32, {1, kIn, 8, 8}).output("y", kF32, {1, kOut, 8, 8});
  if (!folded) {
    b.initializer("W", conv_weights(), {kOut, kIn, 3, 3}).initializer("B", kBias, {kOut});
    b.initializer("scale", kScale, {kOut, 1, 1}).initializer("shift", kShift, {1, kOut, 1, 1});
    conv_attrs(b.node("Conv", {"x", "W", "B"}, {"c"}, "/conv/Conv"));
    b.node("Mul", {"c", "scale"}, {"m"}, "/conv/Mul");
    b.node("Add", {"m", "shift"}, {"a"}, "/conv/Add");
    b.node("Relu", {"a"}, {"y"}, "/act/Relu");
  } else {
    std::vector<float> w = conv_weights(), bias = kBias;
    for (std::int64_t o = 0; o < kOut; ++o) {
      for (std::int64_t k = 0; k < kIn * 9; ++k) w[std::size_t(o * kIn * 9 + k)] *= kScale[std::size_t(o)];
      bias[std::size_t(o)] = bias[std::size_t(o)] * kScale[std::size_t(o)] + kShift[std::size_t(o)];
    }
    b.initializer("onnx::Conv_7", w, {kOut, kIn, 3, 3}).initializer("onnx::Conv_8", bias, {kOut});
    conv_attrs(b.node("Conv", {"x", "onnx::Conv_7", "onnx::Conv_8"}, {"t0"}, "Conv_0"));
    b.node("Relu", {"t0"}, {"y"}, "Relu_1");
  }
  const auto bytes = b.bytes();
  return testing::write_text(dir, file, std::string(bytes.begin(), bytes.end()));
}

TEST(ConvScaleForm, FoldedExportIsComparedAtTheReferencesAddAndCountedByStructure) {
  testing::ScratchDir dir("conv-scale-form");
  const fs::path ref = write_model(dir, "model.onnx", false), folded = write_model(dir, "model_folded.onnx", true);
  fs::create_directories(dir / "inputs" / "s0");
  std::vector<float> x(kIn * 8 * 8);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.23f * float(i)) * 1.1f;
  datasets::write_npy(dir / "inputs" / "s0" / "x.npy", testing::floats({1, kIn, 8, 8}, x));
  const auto config =
      testing::write_text(dir, "c.json",
                          R"({"pipeline": ")" + ref.string() + R"(", "inputs": ")" + (dir / "inputs").string() + R"(",
    "variants": [{"name": "fp32"}, {"name": "folded", "onnx": ")" +
                              folded.string() + R"("}]})");
  const auto r = testing::run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = testing::read_json(dir / "out/report.json");
  std::map<std::string, std::size_t> layer;
  for (std::size_t k = 0; k < j["layers"]["nodes"].size(); ++k) layer[j["layers"]["nodes"][k]["name"]] = k;
  nlohmann::json stats;
  for (const auto& t : j["layers"]["tables"])
    if (t["variant"] == "folded") stats = t["stats"];
  ASSERT_FALSE(stats.is_null());
  // The folded Conv against the Add, locally and accumulated: the same network up to the rounding
  // of the folded weights.
  for (const char* column : {"local_sqnr_db", "acc_sqnr_db"}) {
    const auto& add = stats[column][layer.at("/conv/Add")];
    ASSERT_TRUE(add.is_number()) << column << ": " << add;
    EXPECT_GT(add.get<double>(), 100.0) << column;
    // The Conv and the Mul inside the folded form have no counterpart.
    EXPECT_TRUE(stats[column][layer.at("/conv/Conv")].is_null()) << column;
    EXPECT_TRUE(stats[column][layer.at("/conv/Mul")].is_null()) << column;
  }
  for (const auto& v : j["variants"])
    if (v["name"] == "folded") {
      EXPECT_EQ(v["matched_by_name"], 0);
      EXPECT_EQ(v["matched_by_output"], 1);     // the Relu writes "y"
      EXPECT_EQ(v["matched_by_structure"], 1);  // the folded Conv
      ASSERT_EQ(v["unmatched"].size(), 2u) << v["unmatched"].dump();
      for (const auto& u : v["unmatched"]) {
        EXPECT_EQ(u["side"], "reference");
        EXPECT_EQ(u["reason"], "folded into Conv_0 (Conv + Mul/Add by a constant as one Conv, compared at /conv/Add)");
      }
    }
}

}  // namespace
}  // namespace qeval
