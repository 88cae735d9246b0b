// ONNX Runtime's own QOperator graphs of real models: PaddleOCR's PP-OCRv4 detector and angle
// classifier, quantized in ORT's QDQ convention and turned into QLinearConv / QLinearAdd /
// QLinearMul / QLinearConcat / QLinearSigmoid / QLinearGlobalAveragePool / QGemm / QLinearSoftmax
// by ORT's graph optimizer (tools/make_ort_qlinear_models.py; tests/data/real_models/*_qlinear).
// qeval runs them as ORT does, and `qeval run` with the float model as reference matches every
// QLinear layer and gives each one a local error that agrees with the Q/DQ form's.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "eval/run/node_match.h"
#include "metrics/segmentation.h"
#include "metrics/tensor_error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* folder;  // tests/data/real_models/<folder>: the float model's input and ORT outputs
  const char* model;   // third_party/models/<model>: the float model
  const char* output;  // the graph's output
};
const Case kDet{"ppocr_det", "ppocr/ch_PP-OCRv4_det_infer.onnx", "sigmoid_0.tmp_0"};
const Case kCls{"ppocr_cls", "ppocr/ch_ppocr_mobile_v2.0_cls_infer.onnx", "softmax_0.tmp_0"};

fs::path data(const Case& c) { return testing::data_dir() / "real_models" / c.folder; }
fs::path qlinear_dir(const Case& c) {
  return testing::data_dir() / "real_models" / (std::string(c.folder) + "_qlinear");
}
Tensor input_of(const Case& c) { return datasets::read_npy(data(c) / "inputs" / "x.npy"); }

Tensor run(const fs::path& model, const Tensor& x) {
  const Graph g = load_onnx(model);
  Session s(g);
  return s.run({{g.inputs.at(0).name, x}}).begin()->second;
}

// The detector's text mask at PaddleOCR's binarization threshold (0.3 on the probability map).
metrics::MaskIou det_mask_iou(const Tensor& ref, const Tensor& test) {
  auto plane = [](const Tensor& t) {
    Tensor p(DType::kFloat32, {t.dim(2), t.dim(3)});
    std::copy(t.data<float>(), t.data<float>() + p.numel(), p.data<float>());
    return metrics::threshold_mask(p, 0.3f);
  };
  return metrics::mask_iou(plane(ref), plane(test));
}

std::int64_t differing(const Tensor& a, const Tensor& b) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) n += a.data<float>()[i] != b.data<float>()[i];
  return n;
}

TEST(OrtQLinear, GraphsHoldOnnxRuntimesQOperatorOps) {
  std::map<std::string, int> ops;
  for (const Case& c : {kDet, kCls})
    for (const Node& n : load_onnx(qlinear_dir(c) / "qlinear.onnx").nodes) ++ops[n.domain + ":" + n.op_type];
  for (const char* op :
       {":QLinearConv", "com.microsoft:QLinearAdd", "com.microsoft:QLinearMul", "com.microsoft:QLinearConcat",
        "com.microsoft:QLinearSigmoid", "com.microsoft:QLinearGlobalAveragePool", "com.microsoft:QGemm",
        "com.microsoft:QLinearSoftmax"})
    EXPECT_GT(ops[op], 0) << op;
  EXPECT_EQ(ops[":QLinearConv"], 62 + 53);
}

// Every value of the QLinear graph passes through uint8 and the output is a DequantizeLinear of
// uint8 codes, so equal outputs mean equal codes.
TEST(OrtQLinear, PpOcrRunsAsOnnxRuntimeRunsIt) {
  for (const Case& c : {kDet, kCls}) {
    const Tensor x = input_of(c);
    const Tensor y = run(qlinear_dir(c) / "qlinear.onnx", x);
    const Tensor ort = datasets::read_npy(qlinear_dir(c) / "ort_outputs" / (std::string(c.output) + ".npy"));
    ASSERT_EQ(y.shape(), ort.shape()) << c.folder;
    EXPECT_EQ(differing(y, ort), 0) << c.folder;
    // The Q/DQ form of the same scales (ORT runs it in float, optimizations off; qeval's Conv/Gemm
    // between Q/DQ run as int8 with exact int32 sums, as the QLinear form does).
    const Tensor qdq = run(qlinear_dir(c) / "qdq.onnx", x);
    const Tensor ort_qdq = datasets::read_npy(qlinear_dir(c) / "ort_qdq_outputs" / (std::string(c.output) + ".npy"));
    const auto e = metrics::tensor_error(ort_qdq, qdq);
    ASSERT_TRUE(e.sqnr_db) << c.folder;
    std::printf("  %s: QLinear output %lld of %lld codes differ from ORT; QDQ form SQNR to ORT's %.1f dB\n", c.folder,
                (long long)differing(y, ort), (long long)y.numel(), *e.sqnr_db);
  }
}

TEST(OrtQLinear, PpOcrDetectionKeepsItsTextMask) {
  QEVAL_REAL_MODEL(model, kDet.model);
  const Tensor x = input_of(kDet);
  const Tensor ref = run(model, x);
  const Tensor y = run(qlinear_dir(kDet) / "qlinear.onnx", x);
  const auto iou = det_mask_iou(ref, y);
  EXPECT_GT(iou.ref_area, 1000);
  std::printf("  det mask IoU float vs QLinear %.4f\n", iou.iou);
  EXPECT_GE(iou.iou, 0.9);
}

bool is_qoperator(const Node& n) { return n.op_type.rfind("QLinear", 0) == 0 || n.op_type == "QGemm"; }

// `qeval run` with the float model as reference and ORT's QLinear graph and its Q/DQ graph (the
// same scales) as variants.
TEST(OrtQLinear, RunMatchesEveryQLinearLayerAndGivesEachALocalError) {
  struct Expect {
    Case c;
    std::size_t by_name, by_output, qoperator_nodes, absorbed, quantized_compute_nodes, compute_nodes;
  };
  // det: every node by name; cls: ORT's fused Gemm by its output tensor's name. absorbed: the Relu
  // and Clip nodes ORT's quantizer removed after a quantized op.
  for (const Expect& e : {Expect{kDet, 292, 0, 249, 36, 62, 64}, Expect{kCls, 145, 1, 117, 33, 54, 54}}) {
    QEVAL_REAL_MODEL(model, e.c.model);
    testing::ScratchDir dir(std::string("ort-qlinear-") + e.c.folder);
    fs::create_directories(dir / "inputs" / "s0");
    fs::copy_file(data(e.c) / "inputs" / "x.npy", dir / "inputs" / "s0" / "x.npy");
    const fs::path qlinear = qlinear_dir(e.c) / "qlinear.onnx", qdq = qlinear_dir(e.c) / "qdq.onnx";
    const auto config =
        testing::write_text(dir, "c.json",
                            R"({"pipeline": ")" + model.string() + R"(", "inputs": ")" + (dir / "inputs").string() +
                                R"(", "variants": [{"name": "fp32"}, {"name": "qlinear", "onnx": ")" +
                                qlinear.string() + R"("}, {"name": "qdq", "onnx": ")" + qdq.string() + R"("}]})");
    const auto r = testing::run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = testing::read_json(dir / "out" / "report.json");

    for (const auto& v : j.at("variants")) {
      if (v.at("name") != "qlinear") continue;
      EXPECT_EQ(v.at("matched_by_name"), e.by_name) << e.c.folder;
      EXPECT_EQ(v.at("matched_by_output"), e.by_output) << e.c.folder;
      EXPECT_EQ(v.at("matched_by_structure"), 0) << e.c.folder;
      // Unmatched: only reference nodes that have no node of their own in the variant, each with why.
      std::size_t absorbed = 0;
      for (const auto& u : v.at("unmatched")) {
        const std::string reason = u.at("reason");
        EXPECT_EQ(u.at("side"), "reference") << u.dump();
        const bool known = reason.rfind("folded into ", 0) == 0 || reason.rfind("its Relu ", 0) == 0 ||
                           reason.rfind("its Clip ", 0) == 0 ||
                           reason.rfind("absorbed into the QuantizeLinear", 0) == 0 ||
                           reason.rfind("shape computation", 0) == 0 || reason.rfind("computes a constant", 0) == 0;
        EXPECT_TRUE(known) << e.c.folder << ": " << u.dump();
        absorbed += reason.rfind("its ", 0) == 0 || reason.rfind("absorbed", 0) == 0;
      }
      EXPECT_EQ(absorbed, e.absorbed) << e.c.folder;
      // "Quantized": every QLinearConv / QGemm counts (det's two ConvTransposes stay float); before,
      // the report said 0% (only Conv/MatMul/Gemm between Q/DQ were counted).
      ASSERT_EQ(v.at("quantization").size(), 1u);
      EXPECT_EQ(v["quantization"][0].at("quantized_nodes"), e.quantized_compute_nodes) << e.c.folder;
      EXPECT_EQ(v["quantization"][0].at("compute_nodes"), e.compute_nodes) << e.c.folder;
    }

    std::map<std::string, std::size_t> layer;
    for (std::size_t k = 0; k < j["layers"]["nodes"].size(); ++k) layer[j["layers"]["nodes"][k]["name"]] = k;
    std::map<std::string, nlohmann::json> stats;
    for (const auto& t : j["layers"]["tables"]) stats[t["variant"]] = t["stats"];
    // A statistic as a number: null = not measured, "inf" = no error at all (an all-zero Relu output).
    auto number = [&](const std::string& variant, const char* stat, const std::string& node) -> std::optional<double> {
      const auto& v = stats.at(variant).at(stat).at(layer.at(node));
      if (v.is_string() && v == "inf") return INFINITY;
      if (!v.is_number()) return std::nullopt;
      return v.get<double>();
    };
    // Every QOperator node of the variant: matched, with a local and an accumulated error at the
    // reference node it is compared with (never missing, never NaN or -inf). Where the Q/DQ form is
    // compared at the same node, the QLinear form's local error is that of the Q/DQ form plus its
    // output's rounding: the Q/DQ form's local run ends at the float op, before the QuantizeLinear of
    // its output, while a QLinear op writes the rounded codes. So never better, and equal where the
    // output's rounding adds nothing.
    const Graph ref = load_onnx(model), var = load_onnx(qlinear);
    const NodeMatch m = match_nodes(ref, var);
    std::size_t qoperator = 0, compared = 0, equal = 0;
    double widest = 0;
    for (std::size_t i = 0; i < var.nodes.size(); ++i) {
      const Node& n = var.nodes[i];
      if (!is_qoperator(n)) continue;
      ++qoperator;
      ASSERT_GE(m.ref_of_variant[i], 0) << n.name;
      const std::string at = ref.nodes[std::size_t(m.ref_of_variant[i])].name;
      const auto local = number("qlinear", "local_sqnr_db", at), acc = number("qlinear", "acc_sqnr_db", at);
      ASSERT_TRUE(local && !std::isnan(*local) && *local > -INFINITY) << n.name << " at " << at;
      ASSERT_TRUE(acc && !std::isnan(*acc) && *acc > -INFINITY) << n.name << " at " << at;
      const auto qdq_local = number("qdq", "local_sqnr_db", at);
      if (!qdq_local || !std::isfinite(*local))
        continue;  // an absorbed Relu / Clip: the Q/DQ form is compared at its op
      ++compared;
      EXPECT_LE(*local, *qdq_local + 0.01) << n.name;
      equal += std::abs(*local - *qdq_local) <= 0.01;
      widest = std::max(widest, *qdq_local - *local);
    }
    EXPECT_EQ(qoperator, e.qoperator_nodes) << e.c.folder;
    std::printf(
        "  %s: %zu QOperator nodes, each with a local error; %zu at a node where the Q/DQ form has one: "
        "%zu equal within 0.01 dB, the rest better in Q/DQ form by up to %.2f dB (the output's rounding)\n",
        e.c.folder, qoperator, compared, equal, widest);
    // Accumulated error at the output: what ONNX Runtime's own outputs give (qeval's QLinear codes are
    // ORT's, and both float runs agree to 1e-5).
    const Tensor ort_float = datasets::read_npy(data(e.c) / "outputs" / (std::string(e.c.output) + ".npy"));
    const Tensor ort_q = datasets::read_npy(qlinear_dir(e.c) / "ort_outputs" / (std::string(e.c.output) + ".npy"));
    const double ort_sqnr = *metrics::tensor_error(ort_float, ort_q).sqnr_db;
    const std::string out = ref.nodes.back().name;
    const auto out_acc = number("qlinear", "acc_sqnr_db", out);
    ASSERT_TRUE(out_acc) << out;
    std::printf("  %s: output SQNR %.3f dB (ONNX Runtime's %.3f dB)\n", e.c.folder, *out_acc, ort_sqnr);
    EXPECT_NEAR(*out_acc, ort_sqnr, 0.01) << e.c.folder;
  }
}

}  // namespace
}  // namespace qeval::eval
