// A miniature UNet block built in memory for the quantization tests: conv_in, a resnet conv with a
// Gemm time projection, a transformer block (LayerNorm, q/k/v projections, two-head attention,
// to_out, GEGLU feed-forward) and conv_out. Node names follow the diffusers TorchScript export so
// the demo's default exclusions apply (conv_in, conv_out).
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "eval/onnx_builder.h"

namespace qeval::testing {

inline std::vector<float> seeded_values(std::size_t n, unsigned seed, float amplitude) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, amplitude);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Inputs: sample [1, 2, 4, 4], temb [1, 3]. Output: out [1, 2, 4, 4].
inline OnnxBuilder mini_unet_block(int opset = 17) {
  OnnxBuilder b(opset);
  b.input("sample", onnx::TensorProto::FLOAT, {1, 2, 4, 4});
  b.input("temb", onnx::TensorProto::FLOAT, {1, 3});
  b.output("out", onnx::TensorProto::FLOAT, {1, 2, 4, 4});
  unsigned seed = 100;
  auto w = [&](const std::string& name, std::vector<std::int64_t> dims, float amp) {
    std::size_t n = 1;
    for (auto d : dims) n *= static_cast<std::size_t>(d);
    b.initializer(name, seeded_values(n, seed++, amp), dims);
  };
  auto pads = [](onnx::NodeProto& n) {
    auto* a = n.add_attribute();
    a->set_name("pads");
    a->set_type(onnx::AttributeProto::INTS);
    for (int i = 0; i < 4; ++i) a->add_ints(1);
  };
  auto ints_attr = [](onnx::NodeProto& n, const std::string& name, std::vector<std::int64_t> v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  };
  auto int_attr = [](onnx::NodeProto& n, const std::string& name, std::int64_t v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  };

  w("conv_in.weight", {4, 2, 3, 3}, 0.4f);
  w("conv_in.bias", {4}, 0.1f);
  pads(b.node("Conv", {"sample", "conv_in.weight", "conv_in.bias"}, {"h0"}, "/conv_in/Conv"));
  w("block.conv1.weight", {4, 4, 3, 3}, 0.3f);
  w("block.conv1.bias", {4}, 0.1f);
  pads(b.node("Conv", {"h0", "block.conv1.weight", "block.conv1.bias"}, {"h1"}, "/block/conv1/Conv"));
  w("block.emb_proj.weight", {4, 3}, 0.5f);
  w("block.emb_proj.bias", {4}, 0.1f);
  int_attr(b.node("Gemm", {"temb", "block.emb_proj.weight", "block.emb_proj.bias"}, {"e"}, "/block/emb_proj/Gemm"),
           "transB", 1);
  b.initializer_i64("shape_e", {1, 4, 1, 1});
  b.node("Reshape", {"e", "shape_e"}, {"e4"}, "/block/Reshape_e");
  b.node("Add", {"h1", "e4"}, {"h2"}, "/block/Add");

  // Tokens: [1, 4, 16] -> [1, 16, 4]
  b.initializer_i64("shape_tok", {1, 4, 16});
  b.node("Reshape", {"h2", "shape_tok"}, {"t0"}, "/attn/Reshape_in");
  ints_attr(b.node("Transpose", {"t0"}, {"t1"}, "/attn/Transpose_in"), "perm", {0, 2, 1});
  b.initializer("norm1.weight", {1.0f, 0.9f, 1.1f, 1.0f}, {4});
  b.initializer("norm1.bias", {0.0f, 0.1f, -0.1f, 0.05f}, {4});
  b.node("LayerNormalization", {"t1", "norm1.weight", "norm1.bias"}, {"n1"}, "/attn/norm1/LayerNormalization");
  for (const char* p : {"q", "k", "v"}) {
    w(std::string("to_") + p, {4, 4}, 0.5f);
    b.node("MatMul", {"n1", std::string("to_") + p}, {std::string(p) + "0"},
           std::string("/attn/attn1/to_") + p + "/MatMul");
  }
  b.initializer_i64("shape_heads", {1, 16, 2, 2});
  for (const char* p : {"q", "k", "v"})
    b.node("Reshape", {std::string(p) + "0", "shape_heads"}, {std::string(p) + "1"},
           std::string("/attn/attn1/Reshape_") + p);
  ints_attr(b.node("Transpose", {"q1"}, {"q2"}, "/attn/attn1/Transpose_q"), "perm", {0, 2, 1, 3});
  ints_attr(b.node("Transpose", {"k1"}, {"k2"}, "/attn/attn1/Transpose_k"), "perm", {0, 2, 3, 1});
  ints_attr(b.node("Transpose", {"v1"}, {"v2"}, "/attn/attn1/Transpose_v"), "perm", {0, 2, 1, 3});
  b.node("MatMul", {"q2", "k2"}, {"s0"}, "/attn/attn1/MatMul");
  b.initializer("attn_scale", {0.7071f}, {});
  b.node("Mul", {"s0", "attn_scale"}, {"s1"}, "/attn/attn1/Mul");
  int_attr(b.node("Softmax", {"s1"}, {"p"}, "/attn/attn1/Softmax"), "axis", -1);
  b.node("MatMul", {"p", "v2"}, {"o0"}, "/attn/attn1/MatMul_1");
  ints_attr(b.node("Transpose", {"o0"}, {"o1"}, "/attn/attn1/Transpose_o"), "perm", {0, 2, 1, 3});
  b.initializer_i64("shape_merge", {1, 16, 4});
  b.node("Reshape", {"o1", "shape_merge"}, {"o2"}, "/attn/attn1/Reshape_o");
  w("to_out", {4, 4}, 0.5f);
  b.node("MatMul", {"o2", "to_out"}, {"o3"}, "/attn/attn1/to_out.0/MatMul");
  b.node("Add", {"o3", "t1"}, {"r1"}, "/attn/Add_res1");

  // GEGLU feed-forward.
  w("ff.proj", {4, 8}, 0.5f);
  b.node("MatMul", {"r1", "ff.proj"}, {"f0"}, "/attn/ff/net.0/proj/MatMul");
  b.initializer_i64("sl_axes", {2});
  b.initializer_i64("sl_0", {0});
  b.initializer_i64("sl_4", {4});
  b.initializer_i64("sl_8", {8});
  b.node("Slice", {"f0", "sl_0", "sl_4", "sl_axes"}, {"fa"}, "/attn/ff/net.0/Slice");
  b.node("Slice", {"f0", "sl_4", "sl_8", "sl_axes"}, {"fg"}, "/attn/ff/net.0/Slice_1");
  b.initializer("sqrt2", {1.4142135f}, {});
  b.initializer("one", {1.0f}, {});
  b.initializer("half", {0.5f}, {});
  b.node("Div", {"fg", "sqrt2"}, {"g0"}, "/attn/ff/net.0/Div");
  b.node("Erf", {"g0"}, {"g1"}, "/attn/ff/net.0/Erf");
  b.node("Add", {"g1", "one"}, {"g2"}, "/attn/ff/net.0/Add");
  b.node("Mul", {"fg", "g2"}, {"g3"}, "/attn/ff/net.0/Mul");
  b.node("Mul", {"g3", "half"}, {"g4"}, "/attn/ff/net.0/Mul_1");
  b.node("Mul", {"fa", "g4"}, {"g5"}, "/attn/ff/net.0/Mul_2");
  w("ff.out", {4, 4}, 0.5f);
  b.node("MatMul", {"g5", "ff.out"}, {"f1"}, "/attn/ff/net.2/MatMul");
  b.node("Add", {"f1", "r1"}, {"r2"}, "/attn/Add_res2");

  ints_attr(b.node("Transpose", {"r2"}, {"t2"}, "/attn/Transpose_out"), "perm", {0, 2, 1});
  b.initializer_i64("shape_img", {1, 4, 4, 4});
  b.node("Reshape", {"t2", "shape_img"}, {"h3"}, "/attn/Reshape_out");
  w("conv_out.weight", {2, 4, 3, 3}, 0.3f);
  w("conv_out.bias", {2}, 0.1f);
  pads(b.node("Conv", {"h3", "conv_out.weight", "conv_out.bias"}, {"out"}, "/conv_out/Conv"));
  return b;
}

}  // namespace qeval::testing
