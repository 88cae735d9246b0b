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

// Two tiny-sd UNet graphs give the same output bits on seeded inputs.
void expect_tiny_sd_unets_run_identically(const Graph& g, const Graph& back) {
  std::map<std::string, Tensor> in{
      {"sample", testing::floats({1, 4, 16, 16}, testing::seeded_values(1024, 2, 1.0f))},
      {"timestep", testing::floats({1}, {500.0f})},
      {"encoder_hidden_states", testing::floats({1, 77, 128}, testing::seeded_values(77 * 128, 3, 0.5f))}};
  Session a(g), b(back);
  expect_bitwise_equal(a.run(in), b.run(in));
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
  expect_tiny_sd_unets_run_identically(g, back);
}

// A graph past external_from_bytes keeps its large initializers in <model>.data (page-aligned,
// ONNX's external-data entries), its small ones inline: the same graph and outputs come back, and
// the model names only a file in its own folder. A full-size UNet's recipe variant (3.4 GB of
// weights) could not be written before (protobuf's 2 GiB limit).
TEST(OnnxExport, LargeGraphsKeepTheirWeightsInAnExternalDataFile) {
  const Graph g = load_onnx(testing::source_dir() / "models/tiny-sd/unet.onnx");
  testing::ScratchDir dir("export-external");
  ExportOptions o;
  o.external_from_bytes = 1;    // any graph
  o.external_min_bytes = 4096;  // a 1024-float weight and larger
  save_onnx(g, dir / "unet.onnx", o);
  ASSERT_TRUE(std::filesystem::exists(dir / "unet.onnx.data"));
  std::uint64_t large = 0, small = 0, large_bytes = 0;
  for (const auto& [name, t] : g.initializers) {
    (t.nbytes() >= 4096 ? large : small) += 1;
    if (t.nbytes() >= 4096) large_bytes += t.nbytes();
  }
  ASSERT_GT(large, 10u);
  ASSERT_GT(small, 10u);
  const auto model_bytes = std::filesystem::file_size(dir / "unet.onnx");
  const auto data_bytes = std::filesystem::file_size(dir / "unet.onnx.data");
  EXPECT_GE(data_bytes, large_bytes);
  EXPECT_LT(data_bytes, large_bytes + 4096 * large);  // padding below one page a tensor
  EXPECT_LT(model_bytes, 1u << 20);
  const Graph back = load_onnx(dir / "unet.onnx");
  expect_same_graph(g, back);
  expect_tiny_sd_unets_run_identically(g, back);
  // Written again without external data: one file, the same graph.
  save_onnx(back, dir / "inline.onnx");
  EXPECT_FALSE(std::filesystem::exists(dir / "inline.onnx.data"));
  expect_same_graph(g, load_onnx(dir / "inline.onnx"));
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
