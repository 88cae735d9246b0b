// The opset upgrade (eval/exec/opset_upgrade.h): each rewrite checked for its form and by running the old
// graph (the executor runs old opsets as written) against the upgraded one on the same inputs.
#include "eval/exec/opset_upgrade.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <random>

#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/ops/op.h"
#include "eval/exec/session.h"
#include "eval/onnx_builder.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;

Attribute ints(std::vector<std::int64_t> v) { return Attribute::of_ints(std::move(v)); }
Attribute floats(std::vector<float> v) {
  Attribute a;
  a.kind = Attribute::Kind::kFloats;
  a.floats = std::move(v);
  return a;
}

Tensor random_tensor(const Shape& shape, unsigned seed) {
  Tensor t(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

Tensor f32(const Shape& shape, std::vector<float> v) {
  Tensor t(DType::kFloat32, shape);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// A small graph at an old opset: one float input "x" of a fixed shape, nodes added in order.
struct OldGraph {
  Graph g;
  OldGraph(int opset, const Shape& x_shape) {
    g.source = "old.onnx";
    g.opsets[""] = opset;
    ValueInfo x;
    x.name = "x";
    x.dims.assign(x_shape.begin(), x_shape.end());
    x.dim_params.assign(x_shape.size(), "");
    x.has_shape = true;
    g.inputs.push_back(x);
  }
  Node& node(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs,
             std::map<std::string, Attribute> attrs = {}) {
    Node n;
    n.name = op + "_" + std::to_string(g.nodes.size());
    n.op_type = op;
    n.opset = g.opsets.at("");
    n.inputs = std::move(inputs);
    n.outputs = std::move(outputs);
    n.attributes = std::move(attrs);
    g.nodes.push_back(std::move(n));
    return g.nodes.back();
  }
  OldGraph& output(const std::string& name, DType t = DType::kFloat32) {
    ValueInfo v;
    v.name = name;
    v.dtype = t;
    g.outputs.push_back(v);
    return *this;
  }
};

std::map<std::string, Tensor> run(const Graph& g, const Tensor& x) {
  Session s(g);
  return s.run(std::map<std::string, Tensor>{{"x", x}});
}

// Upgrades a copy of `g` to `target`, checks every ai.onnx node is registered at the target, and
// expects the same outputs as the original on `x` (bit for bit unless `tolerance` > 0).
OpsetUpgrade expect_same_outputs(const Graph& g, int target, const Tensor& x, double tolerance = 0) {
  Graph up = g;
  OpsetUpgrade report = upgrade_opset(up, target);
  EXPECT_EQ(up.opsets.at(""), target);
  EXPECT_EQ(report.from, g.opsets.at(""));
  EXPECT_EQ(report.to, target);
  for (const Node& n : up.nodes) {
    EXPECT_EQ(n.opset, target) << n.describe();
    EXPECT_NE(find_op(n.domain, n.op_type, target), nullptr) << n.describe();
  }
  const auto want = run(g, x);
  const auto got = run(up, x);
  EXPECT_EQ(want.size(), got.size());
  for (const auto& [name, w] : want) {
    const Tensor& o = got.at(name);
    EXPECT_EQ(o.shape(), w.shape()) << name;
    EXPECT_EQ(o.dtype(), w.dtype()) << name;
    if (o.shape() != w.shape() || o.dtype() != w.dtype()) continue;
    if (w.dtype() != DType::kFloat32) {
      EXPECT_EQ(std::memcmp(o.raw(), w.raw(), w.nbytes()), 0) << name;
      continue;
    }
    std::int64_t differing = 0, first = -1;
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      const float a = w.data<float>()[i], b = o.data<float>()[i];
      const bool same =
          tolerance == 0 ? std::memcmp(&a, &b, 4) == 0 : std::fabs(a - b) <= tolerance * std::max(1.0f, std::fabs(a));
      if (!same && differing++ == 0) first = i;
    }
    EXPECT_EQ(differing, 0) << name << ": first at " << first << ": " << (first >= 0 ? w.data<float>()[first] : 0.0f)
                            << " vs " << (first >= 0 ? o.data<float>()[first] : 0.0f);
  }
  return report;
}

const Node& only(const Graph& g, const std::string& op) {
  const Node* found = nullptr;
  for (const Node& n : g.nodes)
    if (n.op_type == op) {
      EXPECT_EQ(found, nullptr) << "two " << op << " nodes";
      found = &n;
    }
  if (!found) throw std::runtime_error("no " + op + " node");
  return *found;
}

std::string error_of(Graph g, int target) {
  try {
    upgrade_opset(g, target, "for INT8 Q/DQ nodes, which need opset 13");
  } catch (const UnsupportedError& e) {
    return std::string("unsupported: ") + e.what();
  } catch (const InputError& e) {
    return std::string("input: ") + e.what();
  }
  return "no error";
}

TEST(OpsetUpgrade, Upsample7NearestAndLinearBecomeAsymmetricResize) {
  for (const char* mode : {"nearest", "linear"}) {
    OldGraph o(7, {1, 2, 3, 4});
    o.node("Upsample", {"x"}, {"y"}, {{"mode", Attribute::of_string(mode)}, {"scales", floats({1, 1, 2, 2.5f})}});
    o.output("y");
    Graph up = o.g;
    const OpsetUpgrade r = upgrade_opset(up, 13);
    const Node& n = only(up, "Resize");
    EXPECT_EQ(n.name, "Upsample_0");  // names survive: calibration ranges are keyed by them
    ASSERT_EQ(n.inputs.size(), 3u);
    EXPECT_EQ(n.inputs[1], "");
    EXPECT_EQ(n.get_string("coordinate_transformation_mode", ""), "asymmetric");
    EXPECT_EQ(n.get_string("nearest_mode", "-"), std::string(mode) == "nearest" ? "floor" : "-");
    EXPECT_FALSE(n.has("scales"));
    EXPECT_EQ(r.rewritten_nodes, 1);
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_NE(r.notes[0].find("Upsample-7 -> Resize"), std::string::npos) << r.notes[0];
    expect_same_outputs(o.g, 13, random_tensor({1, 2, 3, 4}, 1));
    expect_same_outputs(o.g, 19, random_tensor({1, 2, 3, 4}, 2));
  }
}

TEST(OpsetUpgrade, Upsample9AndResize10KeepTheirRoundingWhenEnlargingAndShrinking) {
  for (const char* mode : {"nearest", "linear"}) {
    OldGraph o(9, {1, 1, 3, 5});
    o.g.initializers.emplace("scales", f32({4}, {1, 1, 3, 1.5f}));
    o.node("Upsample", {"x", "scales"}, {"y"}, {{"mode", Attribute::of_string(mode)}});
    o.output("y");
    expect_same_outputs(o.g, 13, random_tensor({1, 1, 3, 5}, 3));
  }
  // Resize-10 shrinking by 0.6 (the node test test_resize_downsample_scales_nearest at opset 10
  // expects the ceiling of x / scale).
  for (const char* mode : {"nearest", "linear"}) {
    OldGraph o(10, {1, 2, 5, 7});
    o.g.initializers.emplace("scales", f32({4}, {1, 1, 0.6f, 0.45f}));
    o.node("Resize", {"x", "scales"}, {"y"}, {{"mode", Attribute::of_string(mode)}});
    o.output("y");
    Graph up = o.g;
    upgrade_opset(up, 13);
    if (std::string(mode) == "nearest") {
      EXPECT_EQ(only(up, "Resize").get_string("nearest_mode", ""), "ceil");
    }
    expect_same_outputs(o.g, 13, random_tensor({1, 2, 5, 7}, 4));
  }
  // Scales computed in the graph (folded at plan time) are read through the planned metas.
  OldGraph o(9, {1, 1, 2, 3});
  o.g.initializers.emplace("half", f32({4}, {1, 1, 1, 1.5f}));
  o.g.initializers.emplace("two", f32({}, {2}));
  o.node("Mul", {"half", "two"}, {"scales"});
  o.node("Upsample", {"x", "scales"}, {"y"});
  o.output("y");
  expect_same_outputs(o.g, 13, random_tensor({1, 1, 2, 3}, 5));
}

TEST(OpsetUpgrade, MixedNearestScalesAreUnsupported) {
  OldGraph o(10, {1, 1, 4, 4});
  o.g.initializers.emplace("scales", f32({4}, {1, 1, 2, 0.5f}));
  o.node("Resize", {"x", "scales"}, {"y"});
  o.output("y");
  const std::string e = error_of(o.g, 13);
  EXPECT_NE(e.find("unsupported: old.onnx: node 'Resize_0' (Resize) at opset 10: nearest resizing that enlarges "
                   "some axes and shrinks others"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("cannot be upgraded to opset 13 (for INT8 Q/DQ nodes, which need opset 13)"), std::string::npos)
      << e;
}

TEST(OpsetUpgrade, Resize11TfHalfPixelForNnBecomesHalfPixel) {
  for (const char* nearest : {"floor", "round_prefer_floor"}) {
    for (float s : {0.6f, 1.7f, 3.0f}) {
      OldGraph o(11, {1, 1, 5, 6});
      o.g.initializers.emplace("roi", f32({0}, {}));
      o.g.initializers.emplace("scales", f32({4}, {1, 1, s, s}));
      o.node("Resize", {"x", "roi", "scales"}, {"y"},
             {{"coordinate_transformation_mode", Attribute::of_string("tf_half_pixel_for_nn")},
              {"nearest_mode", Attribute::of_string(nearest)}});
      o.output("y");
      Graph up = o.g;
      upgrade_opset(up, 13);
      EXPECT_EQ(only(up, "Resize").get_string("coordinate_transformation_mode", ""), "half_pixel");
      expect_same_outputs(o.g, 13, random_tensor({1, 1, 5, 6}, 6));
    }
  }
  OldGraph o(11, {1, 1, 5, 6});
  o.g.initializers.emplace("roi", f32({0}, {}));
  o.g.initializers.emplace("scales", f32({4}, {1, 1, 2, 2}));
  o.node("Resize", {"x", "roi", "scales"}, {"y"},
         {{"coordinate_transformation_mode", Attribute::of_string("tf_half_pixel_for_nn")},
          {"nearest_mode", Attribute::of_string("ceil")}});
  o.output("y");
  EXPECT_NE(error_of(o.g, 13).find("tf_half_pixel_for_nn with nearest_mode 'ceil'"), std::string::npos);
}

TEST(OpsetUpgrade, ClipBoundsBecomeInputs) {
  OldGraph o(9, {2, 5});
  o.node("Clip", {"x"}, {"a"}, {{"min", Attribute::of_float(0)}, {"max", Attribute::of_float(6)}});
  o.node("Clip", {"a"}, {"b"}, {{"max", Attribute::of_float(1.5f)}});
  o.node("Clip", {"x"}, {"c"}, {{"min", Attribute::of_float(-0.25f)}});
  o.output("b").output("c");
  Graph up = o.g;
  upgrade_opset(up, 13);
  const Node& first = up.nodes[0];
  ASSERT_EQ(first.inputs.size(), 3u);
  EXPECT_EQ(up.initializers.at(first.inputs[1]).data<float>()[0], 0.0f);
  EXPECT_EQ(up.initializers.at(first.inputs[2]).data<float>()[0], 6.0f);
  EXPECT_FALSE(first.has("min") || first.has("max"));
  EXPECT_EQ(up.nodes[1].inputs[1], "");  // no min: the type's lowest
  expect_same_outputs(o.g, 13, random_tensor({2, 5}, 7));
}

TEST(OpsetUpgrade, PadAttributesBecomeInputs) {
  for (const char* mode : {"constant", "reflect", "edge"}) {
    OldGraph o(9, {1, 2, 3, 4});
    o.node("Pad", {"x"}, {"y"},
           {{"mode", Attribute::of_string(mode)},
            {"pads", ints({0, 0, 1, 2, 0, 0, 2, 1})},
            {"value", Attribute::of_float(1.25f)}});
    o.output("y");
    expect_same_outputs(o.g, 13, random_tensor({1, 2, 3, 4}, 8));
    expect_same_outputs(o.g, 19, random_tensor({1, 2, 3, 4}, 8));
  }
}

TEST(OpsetUpgrade, SliceTopKSqueezeUnsqueezeReduceSumSplitAttributesBecomeInputs) {
  OldGraph o(9, {2, 3, 8});
  o.node("Slice", {"x"}, {"s"}, {{"starts", ints({1, -6})}, {"ends", ints({1000, -1})}, {"axes", ints({0, 2})}});
  o.node("Squeeze", {"s"}, {"q"}, {{"axes", ints({0})}});
  o.node("Unsqueeze", {"q"}, {"u"}, {{"axes", ints({0, 3})}});
  o.node("ReduceSum", {"u"}, {"r"}, {{"axes", ints({2})}, {"keepdims", Attribute::of_int(0)}});
  o.node("ReduceMean", {"x"}, {"m"}, {{"axes", ints({-1})}});
  o.node("TopK", {"x"}, {"tv", "ti"}, {{"k", Attribute::of_int(3)}, {"axis", Attribute::of_int(2)}});
  o.node("Split", {"x"}, {"p0", "p1"}, {{"axis", Attribute::of_int(2)}, {"split", ints({3, 5})}});
  o.node("Split", {"x"}, {"e0", "e1"}, {{"axis", Attribute::of_int(2)}});
  o.output("r")
      .output("m")
      .output("tv")
      .output("ti", DType::kInt64)
      .output("p0")
      .output("p1")
      .output("e0")
      .output("e1");
  Graph up = o.g;
  const OpsetUpgrade r13 = upgrade_opset(up, 13);
  EXPECT_EQ(r13.rewritten_nodes, 6);  // all but the ReduceMean (input from 18) and the equal Split
  for (const Node& n : up.nodes)
    for (const char* attr : {"starts", "ends", "k", "split"}) EXPECT_FALSE(n.has(attr)) << n.describe();
  EXPECT_TRUE(up.nodes[4].has("axes"));  // ReduceMean keeps its attribute until 18
  Graph up19 = o.g;
  upgrade_opset(up19, 19);
  EXPECT_FALSE(up19.nodes[4].has("axes"));
  EXPECT_EQ(up19.nodes[7].get_int("num_outputs", 0), 2);
  const Tensor x = random_tensor({2, 3, 8}, 9);
  expect_same_outputs(o.g, 13, x);
  expect_same_outputs(o.g, 19, x);
}

TEST(OpsetUpgrade, BatchNormSpatialAndDropoutRatio) {
  OldGraph o(7, {2, 3, 4});
  o.g.initializers.emplace("scale", f32({3}, {1.5f, -0.5f, 2}));
  o.g.initializers.emplace("bias", f32({3}, {0.1f, 0.2f, -0.3f}));
  o.g.initializers.emplace("mean", f32({3}, {0.5f, -1, 0}));
  o.g.initializers.emplace("var", f32({3}, {1, 0.25f, 4}));
  o.node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"b"},
         {{"spatial", Attribute::of_int(1)}, {"epsilon", Attribute::of_float(1e-3f)}});
  o.node("Dropout", {"b"}, {"y"}, {{"ratio", Attribute::of_float(0.3f)}});
  o.output("y");
  Graph up = o.g;
  upgrade_opset(up, 13);
  EXPECT_FALSE(up.nodes[0].has("spatial"));
  ASSERT_EQ(up.nodes[1].inputs.size(), 2u);
  EXPECT_FLOAT_EQ(up.initializers.at(up.nodes[1].inputs[1]).data<float>()[0], 0.3f);
  expect_same_outputs(o.g, 13, random_tensor({2, 3, 4}, 10));
  const OpsetUpgrade r19 = expect_same_outputs(o.g, 19, random_tensor({2, 3, 4}, 10));
  EXPECT_EQ(r19.rewritten_nodes, 2);
  // Omitted training outputs are dropped at 14; named ones ask for training, which 14 spells
  // training_mode=1 and qeval does not run.
  Graph omitted = o.g;
  omitted.nodes[0].outputs = {"b", "", ""};
  upgrade_opset(omitted, 14);
  EXPECT_EQ(omitted.nodes[0].outputs, std::vector<std::string>{"b"});
  Graph training = o.g;
  training.nodes[0].outputs = {"b", "running_mean"};
  EXPECT_NE(error_of(training, 14).find("output 1 ('running_mean') asks for training-mode statistics"),
            std::string::npos);

  // spatial=0: statistics per activation ([C, D] for X [N, C, D]) -> Sub, Mul, Add.
  OldGraph s0(7, {2, 3, 4});
  int seed = 30;
  for (const char* n : {"scale", "bias", "mean"}) s0.g.initializers.emplace(n, random_tensor({3, 4}, seed++));
  Tensor var = random_tensor({3, 4}, seed);
  for (std::int64_t i = 0; i < var.numel(); ++i) var.data<float>()[i] = std::fabs(var.data<float>()[i]) + 0.1f;
  s0.g.initializers.emplace("var", var);
  s0.node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"},
          {{"spatial", Attribute::of_int(0)}, {"epsilon", Attribute::of_float(1e-2f)}});
  s0.output("y");
  Graph s0_up = s0.g;
  upgrade_opset(s0_up, 13);
  ASSERT_EQ(s0_up.nodes.size(), 3u);
  EXPECT_EQ(s0_up.nodes[0].op_type, "Sub");
  EXPECT_EQ(s0_up.nodes[2].outputs[0], "y");
  expect_same_outputs(s0.g, 13, random_tensor({2, 3, 4}, 40), 1e-6);
  // Statistics that are not constants cannot be folded.
  OldGraph s1 = s0;
  s1.g.initializers.erase("var");
  s1.g.nodes[0].inputs[4] = "x_var";
  s1.g.nodes.insert(s1.g.nodes.begin(), Node{});
  s1.g.nodes[0].name = "abs";
  s1.g.nodes[0].op_type = "Abs";
  s1.g.nodes[0].opset = 7;
  s1.g.nodes[0].inputs = {"mean"};
  s1.g.nodes[0].outputs = {"x_var"};
  EXPECT_NE(error_of(s1.g, 13).find("unsupported: old.onnx: node 'BatchNormalization_0' (BatchNormalization) at "
                                    "opset 7: spatial=0 with input 4 that is not a float or double constant"),
            std::string::npos)
      << error_of(s1.g, 13);
}

TEST(OpsetUpgrade, SoftmaxKeepsItsTwoDimensionalMeaning) {
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    for (std::int64_t axis : {0, 1, 2, 3, -1}) {
      OldGraph o(11, {2, 3, 4});
      o.node(op, {"x"}, {"y"}, {{"axis", Attribute::of_int(axis)}});
      o.output("y");
      Graph up = o.g;
      upgrade_opset(up, 13);
      // The last axis stays one node; any other is Flatten -> op(-1) -> Reshape.
      EXPECT_EQ(up.nodes.size(), axis == 2 || axis == -1 ? 1u : 4u) << op << " axis " << axis;
      EXPECT_EQ(only(up, op).get_int("axis", 0), -1);
      expect_same_outputs(o.g, 13, random_tensor({2, 3, 4}, 11));
    }
    // The default axis before 13 is 1: the last of a rank-2 input.
    OldGraph o(9, {3, 5});
    o.node(op, {"x"}, {"y"});
    o.output("y");
    Graph up = o.g;
    upgrade_opset(up, 13);
    EXPECT_EQ(up.nodes.size(), 1u);
    expect_same_outputs(o.g, 13, random_tensor({3, 5}, 12));
  }
}

TEST(OpsetUpgrade, OpsBelowSevenAndNewerGraphs) {
  OldGraph o(6, {2});
  o.node("Relu", {"x"}, {"y"});
  o.output("y");
  EXPECT_EQ(error_of(o.g, 13),
            "input: old.onnx: ai.onnx opset 6 is too old for INT8 Q/DQ nodes, which need opset 13: qeval upgrades "
            "opset 7 or later to 13; re-export the model at opset 7 or later");
  // At or above the target nothing changes.
  OldGraph n(17, {2});
  n.node("Relu", {"x"}, {"y"});
  n.output("y");
  Graph same = n.g;
  const OpsetUpgrade r = upgrade_opset(same, 13);
  EXPECT_EQ(r.from, 17);
  EXPECT_EQ(r.to, 17);
  EXPECT_EQ(same.opsets.at(""), 17);
  // Other domains keep their opsets.
  OldGraph d(9, {2});
  d.g.opsets["com.example"] = 1;
  d.node("Relu", {"x"}, {"y"});
  upgrade_opset(d.g, 13);
  EXPECT_EQ(d.g.opsets.at("com.example"), 1);
  EXPECT_EQ(d.g.nodes[0].opset, 13);
}

// `qeval calibrate` on a Conv -> Clip model at opset 9 (upgraded, exit 0) and at opset 6 (exit 2,
// the same message for INT8 and FP8 but for what they need).
TEST(OpsetUpgrade, CalibrateCommandUpgradesOrSaysWhatItNeeds) {
  testing::ScratchDir dir("opset-cli");
  auto model = [&](int opset) {
    testing::OnnxBuilder b(opset);
    b.input("x", onnx::TensorProto::FLOAT, {1, 2, 6, 6});
    b.output("y", onnx::TensorProto::FLOAT);
    std::vector<float> w(3 * 2 * 3 * 3);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * float(int(i % 7) - 3);
    b.initializer("w", w, {3, 2, 3, 3});
    b.node("Conv", {"x", "w"}, {"c"}, "conv");
    auto& clip = b.node("Clip", {"c"}, {"y"}, "clip");
    auto* a = clip.add_attribute();
    a->set_name("max");
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(6.0f);
    const fs::path path = dir / ("m" + std::to_string(opset) + ".onnx");
    testing::write_bytes(path, b.bytes());
    return path;
  };
  fs::create_directories(dir / "calib/0");
  datasets::write_npy(dir / "calib/0/x.npy", random_tensor({1, 2, 6, 6}, 20));
  auto calibrate = [&](const fs::path& m, const char* recipe) {
    return testing::run_qeval("calibrate --recipe " + (testing::source_dir() / "recipes" / recipe).string() +
                              " --model " + m.string() + " --data " + (dir / "calib").string() + " --out " +
                              (dir / "out").string() + " --no-cache");
  };
  const auto ok = calibrate(model(9), "int8-level1.json");
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("opset 9 -> 13 (1 nodes rewritten for the new opset)"), std::string::npos) << ok.out;
  const Graph q = load_onnx(dir / "out/quantized.onnx");
  EXPECT_EQ(q.opsets.at(""), 13);
  const auto opset = testing::read_json(dir / "out/scales.json").at("opset");
  EXPECT_EQ(opset.at("rewritten_nodes"), 1);
  ASSERT_EQ(opset.at("rewrites").size(), 1u);
  EXPECT_EQ(opset.at("rewrites")[0], "node 'clip' (Clip): min/max attributes -> inputs (float32)");

  const fs::path old = model(6);
  const auto int8 = calibrate(old, "int8-level1.json");
  EXPECT_EQ(int8.code, 2) << int8.out;
  EXPECT_NE(int8.out.find("m6.onnx: ai.onnx opset 6 is too old for INT8 Q/DQ nodes, which need opset 13: qeval "
                          "upgrades opset 7 or later to 13; re-export the model at opset 7 or later"),
            std::string::npos)
      << int8.out;
  const auto fp8 = calibrate(old, "fp8-level3.json");
  EXPECT_EQ(fp8.code, 2) << fp8.out;
  EXPECT_NE(fp8.out.find("opset 6 is too old for FP8 Q/DQ nodes, which need opset 19: qeval upgrades opset 7 or "
                         "later to 19"),
            std::string::npos)
      << fp8.out;
}

// tools/make_opset_upgrade_references.py's old forms with ONNX Runtime's outputs of the originals
// (at their own opsets): the upgraded graphs must give them, an independent check of each rewrite.
// Where qeval's executor itself differs from ONNX Runtime on the original, at its own opset (not a
// matter of the upgrade): the upgraded graph is then held to qeval's own original outputs, and the
// difference from ORT must still be there (fixing the kernel makes this list shrink).
const std::map<std::string, std::string> kExecutorDiffersFromOrt = {
    {"resize11_tf_half_pixel_for_nn_floor_enlarge",
     "ORT computes (x + 0.5) / 1.7 in float (8.5 / 1.7f rounds to 5.0f, floor 5), qeval's resize "
     "kernel in double (4.99999986, floor 4): one column differs"},
};

TEST(OpsetUpgrade, MatchesOnnxRuntimeOnTheOriginalForms) {
  const fs::path root = testing::data_dir() / "opset_upgrade";
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    const fs::path dir = entry.path();
    SCOPED_TRACE(dir.filename().string());
    const Graph g = load_onnx(dir / "model.onnx");
    ASSERT_LT(g.opsets.at(""), 13);
    const Tensor x = datasets::read_npy(dir / "inputs/x.npy");
    const bool own_reference = kExecutorDiffersFromOrt.count(dir.filename().string()) > 0;
    const auto original = run(g, x);
    for (int target : {13, 19}) {
      Graph up = g;
      upgrade_opset(up, target);
      const auto got = run(up, x);
      for (const ValueInfo& out : g.outputs) {
        const Tensor ort = datasets::read_npy(dir / "outputs" / (out.name + ".npy"));
        if (own_reference) {
          const Tensor& mine = original.at(out.name);
          EXPECT_NE(std::memcmp(mine.raw(), ort.raw(), ort.nbytes()), 0) << "qeval now matches ORT: drop the entry";
        }
        const Tensor& want = own_reference ? original.at(out.name) : ort;
        const Tensor& o = got.at(out.name);
        ASSERT_EQ(o.shape(), want.shape()) << out.name << " at " << target;
        ASSERT_EQ(o.dtype(), want.dtype()) << out.name << " at " << target;
        if (want.dtype() != DType::kFloat32) {
          EXPECT_EQ(std::memcmp(o.raw(), want.raw(), want.nbytes()), 0) << out.name << " at " << target;
          continue;
        }
        double worst = 0;
        for (std::int64_t i = 0; i < want.numel(); ++i) {
          const double e = want.data<float>()[i], a = o.data<float>()[i];
          worst = std::max(worst, std::fabs(a - e) / (1e-5 + 1e-5 * std::fabs(e)));
        }
        EXPECT_LE(worst, 1.0) << out.name << " at " << target << ": worst error / (1e-5 + 1e-5 |expected|)";
      }
    }
    ++cases;
  }
  EXPECT_GE(cases, 29);
}

}  // namespace
}  // namespace qeval::eval
