// Weights in external data are mapped, not read: tensors borrow the mapping's pages, packed forms
// replace them in memory (docs/infer.md "Memory").
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "input_error.h"
#include "kernels/error.h"
#include "kernels/numeric.h"
#include "onnx_builder.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::floats;
using testing::input_error;
using testing::OnnxBuilder;

// This process's resident memory now, in bytes (/proc/self/statm).
std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

void add_external(OnnxBuilder& b, const std::string& name, const std::vector<std::int64_t>& dims,
                  const std::string& location, std::size_t offset, int type = onnx::TensorProto::FLOAT) {
  auto* t = b.proto().mutable_graph()->add_initializer();
  t->set_name(name);
  t->set_data_type(type);
  for (auto d : dims) t->add_dims(d);
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  for (const auto& [k, v] :
       std::vector<std::pair<std::string, std::string>>{{"location", location}, {"offset", std::to_string(offset)}}) {
    auto* kv = t->add_external_data();
    kv->set_key(k);
    kv->set_value(v);
  }
}

void append_floats(const fs::path& file, const std::vector<float>& values) {
  std::ofstream f(file, std::ios::binary | std::ios::app);
  f.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
}

// The tests' input x [rows, k]: small values exact in float16.
Tensor pattern_input(std::int64_t rows, std::int64_t k) {
  std::vector<float> xv(std::size_t(rows * k));
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i % 13) - 6) / 8.0f;
  return floats({rows, k}, xv);
}

// Writes dir/m.onnx: y [rows, n] = x [rows, k] * w, w's float32 values `weights` in the external
// file dir/weights.bin; `transposed`: the file holds w^T [n, k] and a Transpose node makes w.
void write_external_matmul(const fs::path& dir, std::int64_t rows, std::int64_t k, std::int64_t n,
                           const std::vector<float>& weights, bool transposed = false) {
  append_floats(dir / "weights.bin", weights);
  OnnxBuilder m;
  m.input("x", onnx::TensorProto::FLOAT, {rows, k}).output("y", onnx::TensorProto::FLOAT, {rows, n});
  if (transposed) m.node("Transpose", {"wt"}, {"w"}, "transpose");
  m.node("MatMul", {"x", "w"}, {"y"}, "matmul");
  if (transposed) add_external(m, "wt", {n, k}, "weights.bin", 0);
  else add_external(m, "w", {k, n}, "weights.bin", 0);
  testing::write_bytes(dir / "m.onnx", m.bytes());
}

// y = x * a + b, a at offset 0 of weights.bin (64-byte aligned: borrowed), b at offset 68 (copied).
TEST(MappedWeights, AnAlignedExternalTensorIsAViewOfTheMappedFileAndGivesTheSameValues) {
  testing::ScratchDir dir("mapped-view");
  std::vector<float> a(17), b(16);
  for (int i = 0; i < 17; ++i) a[std::size_t(i)] = 0.5f * float(i) - 3.0f;
  for (int i = 0; i < 16; ++i) b[std::size_t(i)] = float(i * i);
  append_floats(dir / "weights.bin", a);  // 68 bytes: b starts unaligned
  append_floats(dir / "weights.bin", b);
  OnnxBuilder m;
  m.input("x", onnx::TensorProto::FLOAT, {16}).output("y", onnx::TensorProto::FLOAT, {16});
  m.node("Slice", {"a17", "starts", "ends"}, {"a"}, "slice");
  m.initializer_i64("starts", {0}).initializer_i64("ends", {16});
  m.node("Mul", {"x", "a"}, {"xa"}, "mul");
  m.node("Add", {"xa", "b"}, {"y"}, "add");
  add_external(m, "a17", {17}, "weights.bin", 0);
  add_external(m, "b", {16}, "weights.bin", 68);
  testing::write_bytes(dir / "m.onnx", m.bytes());

  const Graph g = load_onnx(dir / "m.onnx");
  const Tensor& ta = g.initializers.at("a17");
  const Tensor& tb = g.initializers.at("b");
  EXPECT_TRUE(ta.is_borrowed());
  EXPECT_FALSE(tb.is_borrowed());  // not 64-byte aligned in the file: a copy of its own
  EXPECT_EQ(std::memcmp(ta.raw(), a.data(), 68), 0);
  EXPECT_EQ(std::memcmp(tb.raw(), b.data(), 64), 0);
  // A copy of the graph (a recipe's variant) shares the mapped bytes; writing to it copies them.
  Graph copy = g;
  EXPECT_EQ(std::as_const(copy).initializers.at("a17").raw(), ta.raw());
  copy.initializers.at("a17").data<float>()[0] = 100.0f;
  EXPECT_EQ(ta.data<float>()[0], a[0]);

  Session s(g);
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[std::size_t(i)] = 1.0f + float(i);
  const auto out = s.run({{"x", floats({16}, x)}});
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(out.at("y").data<float>()[i], x[std::size_t(i)] * a[std::size_t(i)] + b[std::size_t(i)]) << i;
}

TEST(MappedWeights, ATruncatedFileIsStillAPreciseErrorNamingTheTensor) {
  testing::ScratchDir dir("mapped-short");
  append_floats(dir / "weights.bin", std::vector<float>(40, 1.0f));  // 160 bytes
  OnnxBuilder m;
  m.input("x", onnx::TensorProto::FLOAT, {64}).output("y", onnx::TensorProto::FLOAT, {64});
  m.node("Mul", {"x", "w"}, {"y"}, "mul");
  add_external(m, "w", {64}, "weights.bin", 0);
  testing::write_bytes(dir / "m.onnx", m.bytes());
  const std::string e = input_error([&] { load_onnx(dir / "m.onnx"); });
  EXPECT_TRUE(contains(e, "initializer 'w'") && contains(e, "'weights.bin'") && contains(e, "too short") &&
              contains(e, "needs 256 bytes from offset 0, the file has 160"))
      << e;
}

// The memory of one call: a 64 MiB MatMul weight is mapped (nothing read at load), packed once at
// the first run, and the packed form replaces it: the call ends near 1x the weight's bytes, where
// reading the file and packing it held 2x.
TEST(MappedWeights, APackedWeightReplacesItsMappedPagesInMemory) {
  testing::ScratchDir dir("mapped-rss");
  constexpr std::int64_t k = 4096, n = 4096, rows = 64;
  constexpr std::size_t weight_bytes = std::size_t(k * n) * sizeof(float);
  {
    std::vector<float> w(std::size_t(k * n));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 61) - 30) / 64.0f;
    write_external_matmul(dir.path(), rows, k, n, w);
  }
  const Tensor x = pattern_input(rows, k);

  const std::size_t before = resident_bytes();
  const Graph g = load_onnx(dir / "m.onnx");
  EXPECT_TRUE(g.initializers.at("w").is_borrowed());
  EXPECT_LT(resident_bytes(), before + weight_bytes / 8) << "loading read the weights";
  std::map<std::string, Tensor> out;
  {
    Session s(g);
    out = s.run({{"x", x}});
    // The packed weight (~64 MiB), the output (1 MiB) and the scratch of a GEMM; not the weight twice.
    EXPECT_LT(resident_bytes(), before + weight_bytes + weight_bytes / 4) << "the mapped weight stayed in memory";
  }
  // The same bytes as over a weight read into memory of its own.
  Graph read = g;
  read.initializers.at("w").raw();  // now a copy of its own
  ASSERT_FALSE(read.initializers.at("w").is_borrowed());
  Session s(read);
  const auto expected = s.run({{"x", x}});
  EXPECT_EQ(std::memcmp(out.at("y").raw(), expected.at("y").raw(), expected.at("y").nbytes()), 0);
}

// A 32 MiB weight in external data: y = x [32, 2048] * w [2048, 4096], then z = Relu(y) when
// `relu`; the graph, written under `dir` and loaded (w borrowed from the mapping), and an input.
constexpr std::int64_t kMappedK = 2048, kMappedN = 4096, kMappedRows = 32;
constexpr std::size_t kMappedWeightBytes = std::size_t(kMappedK * kMappedN) * sizeof(float);
std::pair<Graph, Tensor> mapped_matmul(const fs::path& dir, bool relu) {
  constexpr std::int64_t k = kMappedK, n = kMappedN, rows = kMappedRows;
  {
    std::vector<float> w(std::size_t(k * n));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 57) - 28) / 32.0f + 1e-4f;
    append_floats(dir / "weights.bin", w);
  }
  OnnxBuilder m;
  m.input("x", onnx::TensorProto::FLOAT, {rows, k}).output(relu ? "z" : "y", onnx::TensorProto::FLOAT, {rows, n});
  m.node("MatMul", {"x", "w"}, {"y"}, "matmul");
  if (relu) m.node("Relu", {"y"}, {"z"}, "relu");
  add_external(m, "w", {k, n}, "weights.bin", 0);
  testing::write_bytes(dir / "m.onnx", m.bytes());
  std::vector<float> xv(std::size_t(rows * k));
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i % 11) - 5) / 4.0f;
  return {load_onnx(dir / "m.onnx"), floats({rows, k}, xv)};
}

// `g` run on x by a session of its own (no shared store): the outputs the sharing ones must give.
std::map<std::string, Tensor> run_alone(const Graph& g, Precision precision, const Tensor& x) {
  SessionOptions alone;
  alone.precision = precision;
  Session s(g, alone);
  return s.run({{"x", x}});
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The evaluator's threads and variants (SessionOptions::constants): two sessions over one graph
// pack a weight once, and two fp16 sessions round and pack it once, with the same results as
// sessions of their own; an fp16 session's rounded copy of a mapped weight does not stay in memory
// beside its packed form.
TEST(MappedWeights, SessionsSharingConstantsPackAndRoundAWeightOnce) {
  testing::ScratchDir dir("mapped-shared");
  const auto [g, x] = mapped_matmul(dir.path(), false);
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    SCOPED_TRACE(std::string(precision_name(precision)));
    const Tensor expected = run_alone(g, precision, x).at("y");
    SessionOptions shared;
    shared.precision = precision;
    shared.constants = std::make_shared<SharedConstants>();
    const std::size_t before = resident_bytes();
    Session a(g, shared), b(g, shared);
    const auto ya = a.run({{"x", x}});
    const auto yb = b.run({{"x", x}});
    // One packed copy for both sessions (fp16: the rounded copy is in a temporary file, its pages
    // released once packed).
    EXPECT_LT(resident_bytes(), before + kMappedWeightBytes + kMappedWeightBytes / 2) << "each session made its own";
    EXPECT_TRUE(same_bytes(ya.at("y"), expected));
    EXPECT_TRUE(same_bytes(yb.at("y"), expected));
  }
}

// A store with a parent (the evaluator's single-node sessions): forms of borrowed tensors and of
// the parent's own forms come from the parent, found by the bytes whatever the copy; other tensors'
// forms stay in the child.
TEST(MappedWeights, AChildStoreTakesBorrowedTensorsAndTheParentsFormsFromTheParent) {
  testing::ScratchDir dir("shared-child");
  append_floats(dir / "w.bin", std::vector<float>(64, 1.5f));
  OnnxBuilder m;
  m.input("x", onnx::TensorProto::FLOAT, {2, 64}).output("y", onnx::TensorProto::FLOAT);
  m.node("Mul", {"x", "w"}, {"y"}, "mul");
  add_external(m, "w", {64}, "w.bin", 0);
  testing::write_bytes(dir / "m.onnx", m.bytes());
  const Graph g = load_onnx(dir / "m.onnx");
  const Tensor& mapped = g.initializers.at("w");
  ASSERT_TRUE(mapped.is_borrowed());
  auto parent = std::make_shared<SharedConstants>();
  SharedConstants child(parent);
  int made = 0;
  auto twice = [&made](const Tensor& t) {
    ++made;
    Tensor out = t;
    for (float& v : out.span<float>()) v *= 2;
    return out;
  };
  auto alias = [](const Tensor& t) { return std::shared_ptr<const Tensor>(&t, [](const Tensor*) {}); };
  const auto a = parent->get<Tensor>(alias(mapped), "x2", twice);
  const Tensor copy = mapped;  // a subgraph's copy: the same bytes
  const auto b = child.get<Tensor>(alias(copy), "x2", twice);
  EXPECT_EQ(a.get(), b.get()) << "the child made its own form of a borrowed tensor";
  EXPECT_EQ(made, 1);
  // A form the parent made (a rounded copy) is the parent's to derive from, through the child too.
  const auto a2 = parent->get<Tensor>(a, "x2", twice);
  EXPECT_EQ(child.get<Tensor>(b, "x2", twice).get(), a2.get());
  EXPECT_EQ(made, 2);
  // A tensor of the child's own (in memory, not borrowed) gets a form in the child only.
  const auto own = std::make_shared<const Tensor>(floats({2}, {1.0f, 2.0f}));
  const auto c1 = child.get<Tensor>(own, "x2", twice);
  const auto c2 = parent->get<Tensor>(own, "x2", twice);
  EXPECT_NE(c1.get(), c2.get());
  EXPECT_EQ(made, 4);
  EXPECT_EQ(c1->data<float>()[1], 4.0f);
  // A borrowed view of a tensor in memory (a local-error graph's weight, eval/run/node_match.cc
  // local_graph) is that tensor: the parent's form, through the child.
  struct View final : BorrowedMemory {
    void release_pages(const std::byte*, std::size_t) const noexcept override {}
  };
  const Tensor view = Tensor::borrowed(own->dtype(), own->shape(), own->raw(), std::make_shared<const View>());
  EXPECT_EQ(child.get<Tensor>(alias(view), "x2", twice).get(), c2.get());
  EXPECT_EQ(made, 4);
  // Another borrowed tensor over other bytes is another entry.
  struct Owner final : BorrowedMemory {
    void release_pages(const std::byte*, std::size_t) const noexcept override {}
  };
  const Tensor other = Tensor::borrowed(DType::kFloat32, {32}, mapped.raw(), std::make_shared<const Owner>());
  ASSERT_TRUE(other.is_borrowed());
  EXPECT_NE(parent->get<Tensor>(alias(other), "x2", twice).get(), a.get()) << "same address, other shape";
}

// The evaluator's local-error sessions: a session over one node of a mapped model, given a child of
// the model sessions' store, packs nothing again: its output has the bits of a session of its own.
TEST(MappedWeights, ASubgraphSessionSharesTheModelSessionsPackedWeights) {
  testing::ScratchDir dir("mapped-subgraph");
  const auto [g, x] = mapped_matmul(dir.path(), true);
  const std::size_t first[] = {0};
  const Graph node = extract_subgraph(g, first, {});
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    SCOPED_TRACE(std::string(precision_name(precision)));
    SessionOptions model;
    model.precision = precision;
    model.constants = std::make_shared<SharedConstants>();
    Session whole(g, model);
    whole.run({{"x", x}});
    const Tensor expected = run_alone(node, precision, x).at("y");
    SessionOptions local = model;
    local.constants = std::make_shared<SharedConstants>(model.constants);
    const std::size_t before = resident_bytes();
    Session one(node, local);
    const auto y = one.run({{"x", x}});
    EXPECT_LT(resident_bytes(), before + kMappedWeightBytes / 2) << "the subgraph's session packed the weight again";
    EXPECT_TRUE(same_bytes(y.at("y"), expected));
  }
}

// An FP16 export's weight (float16, at an unaligned offset: copied out of the mapping, not
// borrowed): the session's float32 widened copy goes to a temporary file and leaves memory once
// packed, and the packed form keeps float16 panels. In memory after a run: the float16 copy and
// the float16 panels (~2x the weight's bytes), not also the float32 copy (~4x).
TEST(MappedWeights, AnFp16ExportsWidenedWeightLeavesMemoryOncePacked) {
  testing::ScratchDir dir("mapped-fp16");
  constexpr std::int64_t k = 4096, n = 4096, rows = 16;
  constexpr std::size_t half_bytes = std::size_t(k * n) * 2;
  std::vector<float> w(std::size_t(k * n));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 61) - 30) / 64.0f;
  {
    std::vector<std::uint16_t> codes(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) codes[i] = to_float16(w[i]).bits;
    std::ofstream f(dir / "weights.bin", std::ios::binary);
    f.write("xx", 2);  // the tensor starts at offset 2: not 64-byte aligned
    f.write(reinterpret_cast<const char*>(codes.data()), std::streamsize(half_bytes));
  }
  OnnxBuilder m;
  m.input("x", onnx::TensorProto::FLOAT, {rows, k}).output("y", onnx::TensorProto::FLOAT, {rows, n});
  auto cast = [&](const std::string& from, const std::string& to, int type) {
    auto* a = m.node("Cast", {from}, {to}, "cast_" + to).add_attribute();
    a->set_name("to");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(type);
  };
  cast("x", "x16", onnx::TensorProto::FLOAT16);
  m.node("MatMul", {"x16", "w"}, {"y16"}, "matmul");
  cast("y16", "y", onnx::TensorProto::FLOAT);
  add_external(m, "w", {k, n}, "weights.bin", 2, onnx::TensorProto::FLOAT16);
  testing::write_bytes(dir / "m.onnx", m.bytes());
  const Tensor x = pattern_input(rows, k);
  const std::size_t before = resident_bytes();
  const Graph g = load_onnx(dir / "m.onnx");
  ASSERT_FALSE(g.initializers.at("w").is_borrowed());
  Session s(g);
  const auto out = s.run({{"x", x}});
  EXPECT_LT(resident_bytes(), before + 3 * half_bytes) << "the float32 copy stayed in memory";
  // The values: x16 * w in FP32 sums (x is exact in float16), rounded to float16 as the MatMul's
  // float16 output is.
  for (std::int64_t j : {std::int64_t(0), n / 2, n - 1}) {
    float sum = 0;
    for (std::int64_t p = 0; p < k; ++p) sum += x.data<float>()[p] * w[std::size_t(p * n + j)];
    EXPECT_NEAR(out.at("y").data<float>()[j], round_to_float16(sum), std::abs(sum) * 2e-3 + 1e-3) << j;
  }
}

// A weight transposed by a node (PyTorch's FP16 exports: 722 such Transposes at SDXL's size): the
// plan folds it into a new constant, which goes to a temporary file and leaves memory once packed.
// In memory after a run: the packed weight (~1x its bytes), not also the folded copy (~2x).
TEST(MappedWeights, AFoldedTransposeOfAWeightLeavesMemoryOncePacked) {
  testing::ScratchDir dir("mapped-fold");
  constexpr std::int64_t k = 4096, n = 4096, rows = 16;
  constexpr std::size_t weight_bytes = std::size_t(k * n) * sizeof(float);
  {
    std::vector<float> w(std::size_t(k * n));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 59) - 29) / 64.0f;
    write_external_matmul(dir.path(), rows, k, n, w, /*transposed=*/true);
  }
  const Tensor x = pattern_input(rows, k);
  const std::size_t before = resident_bytes();
  const Graph g = load_onnx(dir / "m.onnx");
  Session s(g);
  const auto out = s.run({{"x", x}});
  EXPECT_LT(resident_bytes(), before + weight_bytes + weight_bytes / 2) << "the folded transpose stayed in memory";
  // y[0][j] = sum_p x[0][p] * wt[j][p]
  const Tensor& wt = g.initializers.at("wt");
  for (std::int64_t j : {std::int64_t(0), n - 1}) {
    double sum = 0;
    for (std::int64_t p = 0; p < k; ++p) sum += double(x.data<float>()[p]) * wt.data<float>()[j * k + p];
    EXPECT_NEAR(out.at("y").data<float>()[j], sum, std::abs(sum) * 1e-5 + 1e-3) << j;
  }
}

// The variants of a run (sessions given one store) fold a transposed weight once: the second
// session's plan takes the first's folded constant, so its packed form too, and nothing grows;
// the output bits are those of a session of its own. A session whose fold rounds otherwise (fp16
// of an FP32 weight) makes its own.
TEST(MappedWeights, SessionsSharingConstantsFoldATransposedWeightOnce) {
  testing::ScratchDir dir("mapped-fold-shared");
  constexpr std::int64_t k = 2048, n = 2048, rows = 16;
  constexpr std::size_t weight_bytes = std::size_t(k * n) * sizeof(float);
  {
    std::vector<float> w(std::size_t(k * n));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 59) - 29) / 64.0f * 1.0001f;
    write_external_matmul(dir.path(), rows, k, n, w, /*transposed=*/true);
  }
  const Tensor x = pattern_input(rows, k);
  const Graph g = load_onnx(dir / "m.onnx");  // one graph for every variant, as the evaluator's
  const auto alone = Session(g).run({{"x", x}}).at("y");
  SessionOptions shared;
  shared.constants = std::make_shared<SharedConstants>();
  Session first(g, shared);
  const auto y1 = first.run({{"x", x}}).at("y");
  const std::size_t before = resident_bytes();
  Session second(g, shared);
  const auto y2 = second.run({{"x", x}}).at("y");
  EXPECT_LT(resident_bytes(), before + weight_bytes / 4) << "the second session folded or packed the weight again";
  EXPECT_TRUE(same_bytes(y1, alone));
  EXPECT_TRUE(same_bytes(y2, alone));
  SessionOptions half = shared;
  half.precision = Precision::kFp16;
  const auto y16 = Session(g, half).run({{"x", x}}).at("y");
  SessionOptions half_alone;
  half_alone.precision = Precision::kFp16;
  EXPECT_TRUE(same_bytes(y16, Session(g, half_alone).run({{"x", x}}).at("y"))) << "fp16 took the fp32 fold";
}

// An FP32 model run as an fp16 precision variant: its weights rounded to float16 values are packed
// as float16 panels (half the bytes), whatever their declared type; the products are the same.
TEST(MappedWeights, AnFp16VariantOfAnFp32ModelPacksHalfPanels) {
  testing::ScratchDir dir("mapped-fp16-variant");
  constexpr std::int64_t k = 4096, n = 4096, rows = 16;
  constexpr std::size_t weight_bytes = std::size_t(k * n) * sizeof(float);
  std::vector<float> w(std::size_t(k * n));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 59) - 29) / 64.0f * 1.0001f;  // not float16 values
  write_external_matmul(dir.path(), rows, k, n, w);
  const Tensor x = pattern_input(rows, k);
  const std::size_t before = resident_bytes();
  const Graph g = load_onnx(dir / "m.onnx");
  Session s(g, SessionOptions{Precision::kFp16});
  const auto out = s.run({{"x", x}});
  const std::size_t grew = resident_bytes() - before;
  std::printf("  resident after an fp16 run: +%.1f MB (float32 weight %.1f MB)\n", double(grew) / 1e6,
              double(weight_bytes) / 1e6);
  EXPECT_LT(grew, weight_bytes * 3 / 4) << "float panels (or the rounded copy) stayed in memory";
  for (std::int64_t j : {std::int64_t(0), n - 1}) {
    float sum = 0;
    for (std::int64_t p = 0; p < k; ++p)
      sum += round_to_float16(x.data<float>()[p]) * round_to_float16(w[std::size_t(p * n + j)]);
    EXPECT_NEAR(out.at("y").data<float>()[j], round_to_float16(sum), std::abs(sum) * 2e-3 + 1e-3) << j;
  }
}

}  // namespace
}  // namespace qeval::eval
