// An FP16 export (float16 weights, Cast to float16 at its input and back at its output) as a
// variant: its per-layer local error is that of its own numerics, finite and equal to a precision
// variant's where the numerics are the same (it was +inf: the local runs fed FP32 values and kept
// FP32 outputs, so every node agreed with the reference exactly).
#include <gtest/gtest.h>

#include <cmath>

#include "datasets/npy.h"
#include "eval/onnx_builder.h"
#include "kernels/numeric.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
constexpr int kF32 = onnx::TensorProto::FLOAT;

std::vector<float> weights() {
  std::vector<float> w(4 * 2 * 3 * 3);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.37f * std::sin(1.7f * float(i)) + 0.01f;
  return w;
}

fs::path write_model(const testing::ScratchDir& dir, const std::string& file, bool fp16) {
  testing::OnnxBuilder b;
  b.input("x", kF32, {1, 2, 8, 8}).output("y", kF32, {1, 4, 8, 8});
  std::string x = "x", conv_out = "c";
  if (fp16) {
    std::vector<std::uint16_t> bits;
    for (float v : weights()) bits.push_back(to_float16(v).bits);
    b.initializer_raw("W", onnx::TensorProto::FLOAT16, bits, {4, 2, 3, 3});
    auto& cast = b.node("Cast", {"x"}, {"x16"}, "/Cast_in");
    auto* to = cast.add_attribute();
    to->set_name("to"), to->set_type(onnx::AttributeProto::INT), to->set_i(10);
    x = "x16";
  } else {
    b.initializer("W", weights(), {4, 2, 3, 3});
  }
  auto& conv = b.node("Conv", {x, "W"}, {conv_out}, "/conv/Conv");
  auto* pads = conv.add_attribute();
  pads->set_name("pads"), pads->set_type(onnx::AttributeProto::INTS);
  for (int k = 0; k < 4; ++k) pads->add_ints(1);
  b.node("Relu", {conv_out}, {fp16 ? "r16" : "y"}, "/act/Relu");
  if (fp16) {
    auto& cast = b.node("Cast", {"r16"}, {"y"}, "/Cast_out");
    auto* to = cast.add_attribute();
    to->set_name("to"), to->set_type(onnx::AttributeProto::INT), to->set_i(1);
  }
  const auto bytes = b.bytes();
  return testing::write_text(dir, file, std::string(bytes.begin(), bytes.end()));
}

TEST(Fp16Export, LocalErrorIsTheExportsOwnAndMatchesThePrecisionVariant) {
  testing::ScratchDir dir("fp16-export");
  const fs::path ref = write_model(dir, "model.onnx", false), exp16 = write_model(dir, "model_fp16.onnx", true);
  fs::create_directories(dir / "inputs" / "s0");
  std::vector<float> x(2 * 8 * 8);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.3f * float(i)) * 1.3f;
  datasets::write_npy(dir / "inputs" / "s0" / "x.npy", testing::floats({1, 2, 8, 8}, x));
  const auto config =
      testing::write_text(dir, "c.json",
                          R"({"pipeline": ")" + ref.string() + R"(", "inputs": ")" + (dir / "inputs").string() + R"(",
    "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16-strict"}, {"name": "export16", "onnx": ")" +
                              exp16.string() + R"("}]})");
  const auto r = testing::run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = testing::read_json(dir / "out/report.json");
  std::map<std::string, std::size_t> layer;
  for (std::size_t k = 0; k < j["layers"]["nodes"].size(); ++k) layer[j["layers"]["nodes"][k]["name"]] = k;
  std::map<std::string, nlohmann::json> stats;
  for (const auto& t : j["layers"]["tables"]) stats[t["variant"]] = t["stats"];
  ASSERT_TRUE(stats.count("fp16") && stats.count("export16"));
  for (const char* node : {"/conv/Conv", "/act/Relu"}) {
    const auto& a = stats["fp16"]["local_sqnr_db"][layer.at(node)];
    const auto& b = stats["export16"]["local_sqnr_db"][layer.at(node)];
    ASSERT_TRUE(a.is_number() && b.is_number()) << node << ": " << a << " " << b;
    EXPECT_GT(b.get<double>(), 40.0) << node;
    EXPECT_LT(b.get<double>(), 120.0) << node;  // finite, not "identical"
    EXPECT_NEAR(a.get<double>(), b.get<double>(), 3.0) << node;
  }
  // The export's Casts are its precision change, set aside like quantization plumbing.
  for (const auto& v : j["variants"])
    if (v["name"] == "export16") {
      EXPECT_EQ(v["matched_by_name"], 2);
      EXPECT_TRUE(v["unmatched"].empty()) << v["unmatched"].dump();
    }
}

}  // namespace
}  // namespace qeval
