#include "eval/exec/onnx_export.h"

#include <gtest/gtest.h>

#include <cstring>

#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "eval/quant/mini_block.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

void expect_same_graph(const Graph& a, const Graph& b) {
  EXPECT_EQ(a.opsets, b.opsets);
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  for (std::size_t i = 0; i < a.nodes.size(); ++i) {
    const Node& x = a.nodes[i];
    const Node& y = b.nodes[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.op_type, y.op_type);
    EXPECT_EQ(x.inputs, y.inputs);
    EXPECT_EQ(x.outputs, y.outputs);
    ASSERT_EQ(x.attributes.size(), y.attributes.size()) << x.name;
    for (const auto& [k, v] : x.attributes) {
      const Attribute& w = y.attributes.at(k);
      EXPECT_EQ(int(v.kind), int(w.kind)) << x.name << "." << k;
      EXPECT_EQ(v.i, w.i);
      EXPECT_EQ(v.f, w.f);
      EXPECT_EQ(v.s, w.s);
      EXPECT_EQ(v.ints, w.ints);
      EXPECT_EQ(v.floats, w.floats);
    }
  }
  ASSERT_EQ(a.initializers.size(), b.initializers.size());
  for (const auto& [k, t] : a.initializers) {
    const Tensor& u = b.initializers.at(k);
    EXPECT_EQ(t.dtype(), u.dtype()) << k;
    EXPECT_EQ(t.shape(), u.shape()) << k;
    EXPECT_EQ(std::memcmp(t.raw(), u.raw(), t.nbytes()), 0) << k;
  }
  ASSERT_EQ(a.inputs.size(), b.inputs.size());
  for (std::size_t i = 0; i < a.inputs.size(); ++i) {
    EXPECT_EQ(a.inputs[i].name, b.inputs[i].name);
    EXPECT_EQ(a.inputs[i].dims, b.inputs[i].dims);
    EXPECT_EQ(a.inputs[i].dim_params, b.inputs[i].dim_params);
  }
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
}

Graph reimport(const Graph& g) {
  const std::string bytes = serialize_onnx(g);
  return parse_onnx({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()}, "exported.onnx", ".");
}

void expect_bitwise_equal(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, t] : a) {
    const Tensor& u = b.at(k);
    ASSERT_EQ(t.shape(), u.shape()) << k;
    EXPECT_EQ(std::memcmp(t.raw(), u.raw(), t.nbytes()), 0) << k;
  }
}

TEST(OnnxExport, MiniBlockRoundTripsAndRunsIdentically) {
  const Graph g = testing::mini_unet_block().graph();
  const Graph back = reimport(g);
  expect_same_graph(g, back);
  std::map<std::string, Tensor> in{{"sample", testing::floats({1, 2, 4, 4}, testing::seeded_values(32, 1, 1.0f))},
                                   {"temb", testing::floats({1, 3}, {0.3f, -0.2f, 0.9f})}};
  Session a(g), b(back);
  expect_bitwise_equal(a.run(in), b.run(in));
  // Same graph, same bytes (initializers are written in name order).
  EXPECT_EQ(serialize_onnx(g), serialize_onnx(back));
}

TEST(OnnxExport, TinySdUnetRoundTripsAndRunsIdentically) {
  const Graph g = load_onnx(testing::source_dir() / "models/tiny-sd/unet.onnx");
  testing::ScratchDir dir("export");
  save_onnx(g, dir / "unet.onnx");
  const Graph back = load_onnx(dir / "unet.onnx");
  expect_same_graph(g, back);
  std::map<std::string, Tensor> in{
      {"sample", testing::floats({1, 4, 16, 16}, testing::seeded_values(1024, 2, 1.0f))},
      {"timestep", testing::floats({1}, {500.0f})},
      {"encoder_hidden_states", testing::floats({1, 77, 128}, testing::seeded_values(77 * 128, 3, 0.5f))}};
  Session a(g), b(back);
  expect_bitwise_equal(a.run(in), b.run(in));
}

TEST(OnnxExport, UnsupportedAttributeKindsAreRefused) {
  Graph g = testing::mini_unet_block().graph();
  Attribute sub;
  sub.kind = Attribute::Kind::kUnsupported;
  g.nodes[0].attributes["body"] = sub;
  try {
    serialize_onnx(g);
    FAIL() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_EQ(std::string(e.what()),
              "node '/conv_in/Conv' (Conv): attribute 'body' is of a kind qeval does not keep (graph or "
              "sparse tensor); cannot export");
  }
}

}  // namespace
}  // namespace qeval::eval
