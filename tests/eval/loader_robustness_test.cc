// Mutated ONNX files (bit flips, truncation, splices) must load or fail with an InputError: the
// in-suite companion of the libFuzzer target in tests/fuzz/.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <iterator>
#include <random>

#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

TEST(LoaderRobustness, MutatedModelsLoadOrFailCleanly) {
  const std::filesystem::path root = "/usr/share/libonnx-testdata/data/node";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "libonnx-testdata not installed";
  std::vector<std::vector<std::uint8_t>> seeds;
  for (const char* t : {"test_conv_with_strides_padding", "test_reshape_reduced_dims", "test_add_bcast",
                        "test_gemm_default_single_elem_vector_bias", "test_softmax_axis_0"})
    if (std::filesystem::exists(root / t / "model.onnx")) seeds.push_back(testing::read_bytes(root / t / "model.onnx"));
  ASSERT_FALSE(seeds.empty());
  std::mt19937 rng(12345);
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::uint8_t> m = seeds[std::size_t(iter) % seeds.size()];
    const int kind = iter % 4;
    std::uniform_int_distribution<std::size_t> pos(0, m.size() - 1);
    if (kind == 0) {
      for (int k = 0; k < 3; ++k) m[pos(rng)] ^= std::uint8_t(1u << (rng() % 8));
    } else if (kind == 1) {
      m.resize(pos(rng));
    } else if (kind == 2) {
      m[pos(rng)] = std::uint8_t(rng());
      m[pos(rng)] = 0xFF;
    } else {
      const auto& other = seeds[rng() % seeds.size()];
      std::size_t at = pos(rng), from = rng() % other.size();
      m.insert(m.begin() + std::ptrdiff_t(at), other.begin() + std::ptrdiff_t(from),
               other.begin() + std::ptrdiff_t(std::min(other.size(), from + 16)));
    }
    try {
      Graph g = parse_onnx(m, "mutated.onnx", "/nonexistent");
      Session s(g);
      ++loaded;
    } catch (const InputError&) {
      ++rejected;
    }
  }
  EXPECT_EQ(loaded + rejected, 3000);
  EXPECT_GT(rejected, 100);  // the mutations did reach the error paths
}

// Mutations that parse as protobuf and aim at what bytes rarely reach: initializer dims at the
// edges of int64 (allocation before the size check was a bad_alloc), hostile external data
// (std::stoll threw std::invalid_argument), outputs that collide, int attributes at the edges.
TEST(LoaderRobustness, StructuredMutationsLoadOrFailCleanly) {
  const std::filesystem::path root = "/usr/share/libonnx-testdata/data/node";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "libonnx-testdata not installed";
  std::vector<onnx::ModelProto> seeds;
  for (const char* t : {"test_conv_with_strides_padding", "test_reshape_reduced_dims", "test_add_bcast",
                        "test_gemm_default_single_elem_vector_bias", "test_expand_dim_changed", "test_tile",
                        "test_constantofshape_int_zeros", "test_range_float_type_positive_delta", "test_constant_pad",
                        "test_div", "test_slice"}) {
    if (!std::filesystem::exists(root / t / "model.onnx")) continue;
    const auto bytes = testing::read_bytes(root / t / "model.onnx");
    onnx::ModelProto m;
    if (m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) seeds.push_back(std::move(m));
  }
  ASSERT_GE(seeds.size(), 5u);
  std::mt19937_64 rng(2121);
  const std::int64_t edges[] = {0,
                                1,
                                -1,
                                3,
                                std::int64_t(1) << 31,
                                std::int64_t(1) << 32,
                                std::int64_t(1) << 40,
                                std::int64_t(1) << 62,
                                std::numeric_limits<std::int64_t>::max(),
                                std::numeric_limits<std::int64_t>::min()};
  const char* numbers[] = {"abc", "", "-1", "0", "16", "99999999999999999999", "12abc", " 4"};
  const char* locations[] = {"../w.bin", "/etc/passwd", "/dev/zero", "w.bin", "", ".", ".."};
  auto edge = [&] { return edges[rng() % std::size(edges)]; };
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    onnx::ModelProto m = seeds[rng() % seeds.size()];
    auto* g = m.mutable_graph();
    const int kind = iter % 4;
    if (kind == 0 && g->initializer_size()) {
      auto* t = g->mutable_initializer(static_cast<int>(rng() % std::uint64_t(g->initializer_size())));
      if (t->dims_size()) t->set_dims(static_cast<int>(rng() % std::uint64_t(t->dims_size())), edge());
      else t->add_dims(edge());
    } else if (kind == 1 && g->initializer_size()) {
      auto* t = g->mutable_initializer(static_cast<int>(rng() % std::uint64_t(g->initializer_size())));
      t->set_data_location(onnx::TensorProto::EXTERNAL);
      auto* kv = t->add_external_data();
      kv->set_key("location");
      kv->set_value(locations[rng() % std::size(locations)]);
      kv = t->add_external_data();
      kv->set_key(rng() % 2 ? "offset" : "length");
      kv->set_value(numbers[rng() % std::size(numbers)]);
    } else if (kind == 2 && g->node_size() > 0) {
      auto* n = g->mutable_node(static_cast<int>(rng() % std::uint64_t(g->node_size())));
      const auto& other = g->node(static_cast<int>(rng() % std::uint64_t(g->node_size())));
      if (n->output_size() && other.input_size()) n->set_output(0, other.input(0));
    } else if (g->node_size() > 0) {
      auto* n = g->mutable_node(static_cast<int>(rng() % std::uint64_t(g->node_size())));
      for (auto& a : *n->mutable_attribute()) {
        if (a.type() == onnx::AttributeProto::INT) a.set_i(edge());
        if (a.type() == onnx::AttributeProto::INTS && a.ints_size())
          a.set_ints(static_cast<int>(rng() % std::uint64_t(a.ints_size())), edge());
        if (a.type() == onnx::AttributeProto::TENSOR && a.t().dims_size()) a.mutable_t()->set_dims(0, edge());
      }
    }
    std::string bytes;
    m.SerializeToString(&bytes);
    try {
      Graph g2 = parse_onnx(std::span(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()),
                            "mutated.onnx", "/nonexistent");
      Session s(g2);
      ++loaded;
    } catch (const InputError&) {
      ++rejected;
    }
  }
  EXPECT_EQ(loaded + rejected, 3000);
  EXPECT_GT(rejected, 500);
}

}  // namespace
}  // namespace qeval::eval
