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

}  // namespace
}  // namespace qeval::eval
