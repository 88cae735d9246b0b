// The segmentation pipeline on the shipped tiny-sam: accuracy on held-out scenes, agreement with
// ONNX Runtime (tools/make_tiny_sam_reference.py), determinism, observers, variants, resizing and
// pipeline.json validation.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>

#include "datasets/npy.h"
#include "datasets/scenes.h"
#include "eval/pipelines/point_prompts.h"
#include "eval/pipelines/segmentation.h"
#include "kernels/error.h"
#include "metrics/segmentation.h"
#include "metrics/tensor_error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

constexpr std::uint64_t kEvalSeed = 0x5EED5A;

std::filesystem::path tiny_sam() { return testing::source_dir() / "models" / "tiny-sam"; }
std::filesystem::path reference_dir() { return testing::data_dir() / "segmentation" / "tiny_sam"; }

const SegmentationPipeline& pipeline() {
  static const SegmentationPipeline p = SegmentationPipeline::load(tiny_sam());
  return p;
}

Tensor scene_planes(std::uint64_t index, int size = 64) {
  datasets::SceneOptions o;
  o.size = size;
  return image_planes(datasets::generate_scene(kEvalSeed, index, o).image, 3, "scene");
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Element i of a stacked reference array [N, ...] as a tensor of the remaining dimensions.
Tensor slice(const Tensor& stacked, std::int64_t i) {
  Shape s(stacked.shape().begin() + 1, stacked.shape().end());
  Tensor out(DType::kFloat32, s);
  std::memcpy(out.raw(), stacked.data<float>() + i * out.numel(), out.nbytes());
  return out;
}

// The whole held-out set of the model card (960 prompts, scenes 0..499), each scene encoded once.
TEST(SegmentationPipeline, TinySamFp32MeanIouOnHeldOutScenes) {
  const auto& p = pipeline();
  PointPromptSet set = read_point_prompts(p.config().evaluation_prompts);
  ASSERT_EQ(set.prompts.size(), 960u);
  auto sessions = p.make_sessions();
  std::string encoded;
  ImageEmbedding emb;
  double sum = 0;
  int n = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& prompt : set.prompts) {
    PromptInputs in = load_prompt_inputs(prompt, set.source, p.config().channels);
    if (prompt.image_key() != encoded) {
      emb = p.encode(*sessions.image_encoder, in.planes);
      encoded = prompt.image_key();
    }
    SegmentationResult r = p.decode(*sessions.mask_decoder, emb, prompt.points);
    ASSERT_TRUE(in.mask.has_value());
    sum += metrics::mask_iou(*in.mask, r.mask).iou;
    ++n;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double miou = sum / n;
  RecordProperty("miou", std::to_string(miou));
  std::printf("tiny-sam FP32 C++: mIoU %.5f over %d prompts (500 scenes) in %.2f s\n", miou, n, seconds);
  EXPECT_GE(miou, 0.9);
  // The model card's PyTorch FP32 figure on the same prompts.
  EXPECT_NEAR(miou, 0.9897, 5e-4);
}

TEST(SegmentationPipeline, MatchesOnnxRuntimeOnTheSameGraphs) {
  const auto& p = pipeline();
  const auto cases = testing::read_json(reference_dir() / "cases.json");
  const Tensor ort_image = datasets::read_npy(reference_dir() / "image_s0.npy");
  const Tensor ort_embeddings = datasets::read_npy(reference_dir() / "embeddings.npy");
  const Tensor ort_logits = datasets::read_npy(reference_dir() / "logits.npy");
  const Tensor ort_iou = datasets::read_npy(reference_dir() / "iou_predictions.npy");
  auto sessions = p.make_sessions();

  // Preprocessing is the same float32 arithmetic as numpy's: bit-identical.
  const std::uint64_t first = cases["scenes"][0].get<std::uint64_t>();
  EXPECT_TRUE(same_bits(p.preprocess(scene_planes(first)), ort_image));

  std::vector<ImageEmbedding> embeddings;
  double worst_embedding = 0, worst_logits = 0;
  for (std::size_t s = 0; s < cases["scenes"].size(); ++s) {
    embeddings.push_back(p.encode(*sessions.image_encoder, scene_planes(cases["scenes"][s].get<std::uint64_t>())));
    auto e = metrics::tensor_error(slice(ort_embeddings, std::int64_t(s)),
                                   embeddings.back().embeddings.reshaped({64, 16, 16}));
    ASSERT_TRUE(e.rel_l2.has_value());
    EXPECT_LE(*e.rel_l2, 1e-5) << "scene " << cases["scenes"][s];
    worst_embedding = std::max(worst_embedding, *e.rel_l2);
  }
  ASSERT_EQ(cases["prompts"].size(), 6u);
  for (std::size_t i = 0; i < cases["prompts"].size(); ++i) {
    const auto& c = cases["prompts"][i];
    std::vector<SegmentationPoint> points;
    for (const auto& pt : c["points"]) points.push_back({pt[0].get<double>(), pt[1].get<double>(), pt[2].get<int>()});
    SegmentationResult r = p.decode(*sessions.mask_decoder, embeddings[c["embedding"].get<std::size_t>()], points);
    auto cmp = metrics::compare_mask_logits(slice(ort_logits, std::int64_t(i)), r.logits, 0.0f);
    ASSERT_TRUE(cmp.logits.rel_l2.has_value());
    EXPECT_LE(*cmp.logits.rel_l2, 1e-5) << "prompt " << i;
    worst_logits = std::max(worst_logits, *cmp.logits.rel_l2);
    EXPECT_EQ(cmp.flipped_pixels, 0) << "prompt " << i;
    for (int m = 0; m < 4; ++m)
      EXPECT_NEAR(r.iou_predictions[std::size_t(m)], ort_iou.data<float>()[i * 4 + std::size_t(m)], 1e-5)
          << "prompt " << i << " mask " << m;
    EXPECT_EQ(r.iou_prediction, r.iou_predictions[0]);
    EXPECT_TRUE(same_bits(r.logits, r.model_logits));  // 64x64 image: no resampling
  }
  std::printf("tiny-sam vs ONNX Runtime: relative L2 %.2g (embeddings), %.2g (mask logits)\n", worst_embedding,
              worst_logits);
}

// Everything a run produces, for comparing runs bit by bit.
std::vector<Tensor> run_scenes(const SegmentationPipeline& p, SegmentationSessions& s) {
  std::vector<Tensor> out;
  for (std::uint64_t index : {0u, 5u, 9u}) {
    Tensor planes = scene_planes(index);
    ImageEmbedding e = p.encode(*s.image_encoder, planes);
    out.push_back(e.embeddings);
    for (SegmentationPoint pt : {SegmentationPoint{20, 20, 1}, SegmentationPoint{40.5, 33, 1}}) {
      std::vector<SegmentationPoint> points = {pt, {5, 60, 0}};
      SegmentationResult r = p.decode(*s.mask_decoder, e, points);
      out.push_back(r.logits);
      Tensor iou(DType::kFloat32, {4});
      std::memcpy(iou.raw(), r.iou_predictions.data(), 4 * sizeof(float));
      out.push_back(iou);
    }
  }
  return out;
}

TEST(SegmentationPipeline, BitIdenticalAcrossRunsAndThreadCounts) {
  const auto& p = pipeline();
  auto sessions = p.make_sessions();
  std::vector<Tensor> one_thread;
  {
    tbb::global_control c(tbb::global_control::max_allowed_parallelism, 1);
    one_thread = run_scenes(p, sessions);
  }
  std::vector<Tensor> again = run_scenes(p, sessions);  // same sessions, all threads
  auto fresh_sessions = p.make_sessions();
  std::vector<Tensor> fresh;
  {
    tbb::global_control c(tbb::global_control::max_allowed_parallelism, 3);
    fresh = run_scenes(p, fresh_sessions);
  }
  ASSERT_EQ(one_thread.size(), again.size());
  for (std::size_t i = 0; i < one_thread.size(); ++i) {
    EXPECT_TRUE(same_bits(one_thread[i], again[i])) << "output " << i;
    EXPECT_TRUE(same_bits(one_thread[i], fresh[i])) << "output " << i;
  }
}

struct CountingObserver : Observer {
  int nodes = 0;
  void on_node(const NodeEvent&) override { ++nodes; }
};

struct RecordingCallObserver : ModelCallObserver {
  struct Call {
    std::string model, context;
    int call, step, nodes = 0;
    std::vector<std::string> outputs;
  };
  std::vector<Call> calls;
  CountingObserver counter;
  Observer* begin(const ModelCall& c) override {
    calls.push_back({std::string(c.model), std::string(c.context), c.call, c.step, 0, {}});
    counter.nodes = 0;
    return &counter;
  }
  void end(const ModelCall& c, const std::map<std::string, Tensor>& outputs) override {
    EXPECT_EQ(calls.back().model, c.model);
    calls.back().nodes = counter.nodes;
    for (const auto& [name, _] : outputs) calls.back().outputs.push_back(name);
  }
};

TEST(SegmentationPipeline, ObserverSeesEveryModelCallByName) {
  const auto& p = pipeline();
  auto s = p.make_sessions();
  RecordingCallObserver obs;
  ImageEmbedding e = p.encode(*s.image_encoder, scene_planes(1), &obs, "s1");
  std::vector<SegmentationPoint> a = {{52, 52, 1}}, b = {{33, 56, 1}, {52, 52, 0}};
  SegmentationResult ra = p.decode(*s.mask_decoder, e, a, &obs, "s1o0", 0);
  SegmentationResult rb = p.decode(*s.mask_decoder, e, b, &obs, "s1o1", 1);
  ASSERT_EQ(obs.calls.size(), 3u);
  EXPECT_EQ(obs.calls[0].model, "image_encoder");
  EXPECT_EQ(obs.calls[0].context, "s1");
  EXPECT_EQ(obs.calls[0].outputs, std::vector<std::string>{"image_embeddings"});
  EXPECT_EQ(obs.calls[1].model, "mask_decoder");
  EXPECT_EQ(obs.calls[1].context, "s1o0");
  EXPECT_EQ(obs.calls[2].call, 1);
  EXPECT_EQ(obs.calls[2].step, -1);
  EXPECT_EQ(obs.calls[2].outputs, (std::vector<std::string>{"iou_predictions", "masks"}));
  // Every node of each graph is reported (folded constants included), the decoder's per call.
  EXPECT_GE(obs.calls[0].nodes, 100);
  EXPECT_GE(obs.calls[1].nodes, 400);
  EXPECT_EQ(obs.calls[1].nodes, obs.calls[2].nodes);
  // Two prompts on one encoding: the two objects, different masks.
  EXPECT_LT(metrics::mask_iou(ra.mask, rb.mask).iou, 0.1);
  // Observing changes nothing.
  auto plain = p.decode(*s.mask_decoder, e, a);
  EXPECT_TRUE(same_bits(plain.logits, ra.logits));
}

TEST(SegmentationPipeline, ReducedPrecisionSessionsAreVariantsOfTheSamePipeline) {
  const auto& p = pipeline();
  auto fp32 = p.make_sessions();
  SessionOptions half;
  half.precision = Precision::kFp16;
  auto fp16 = p.make_sessions(half);
  EXPECT_EQ(&fp16.image_encoder->graph(), &fp32.image_encoder->graph());  // one graph, two variants
  for (std::uint64_t index : {2u, 3u}) {
    Tensor planes = scene_planes(index);
    auto pts = datasets::scene_object_points(datasets::generate_scene(kEvalSeed, index));
    std::vector<SegmentationPoint> prompt = {{double(pts[0][0]), double(pts[0][1]), 1}};
    auto r32 = p.decode(*fp32.mask_decoder, p.encode(*fp32.image_encoder, planes), prompt);
    auto r16 = p.decode(*fp16.mask_decoder, p.encode(*fp16.image_encoder, planes), prompt);
    auto c = metrics::compare_mask_logits(r32.logits, r16.logits, 0.0f);
    EXPECT_FALSE(c.logits.identical()) << "fp16 rounding had no effect";
    EXPECT_GE(*c.logits.sqnr_db, 30.0) << "scene " << index;
    EXPECT_GE(c.iou.iou, 0.97) << "scene " << index;
  }
}

// A pipeline.json beside a scratch folder, models by absolute path, edited by `edit`.
std::filesystem::path write_config(const testing::ScratchDir& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = testing::read_json(tiny_sam() / "pipeline.json");
  j["image_encoder"]["model"] = (tiny_sam() / "image_encoder.onnx").string();
  j["mask_decoder"]["model"] = (tiny_sam() / "mask_decoder.onnx").string();
  j.erase("prompts");
  edit(j);
  auto path = dir / "pipeline.json";
  std::ofstream(path) << j.dump(1);
  return path;
}

std::string load_error(const std::function<void(nlohmann::json&)>& edit) {
  testing::ScratchDir dir("seg-config");
  auto path = write_config(dir, edit);
  try {
    SegmentationPipeline::load(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SegmentationPipeline, PipelineJsonIsFullyValidated) {
  auto expect = [](const std::function<void(nlohmann::json&)>& edit, const std::string& want) {
    std::string got = load_error(edit);
    EXPECT_NE(got.find(want), std::string::npos) << "want: " << want << "\ngot: " << got;
  };
  expect([](auto& j) { j["imagee"] = 1; }, "unknown key 'imagee' (valid keys: format, version, task");
  expect([](auto& j) { j["task"] = "txt2img"; }, "task: is \"txt2img\": this is not a segmentation pipeline");
  expect([](auto& j) { j["version"] = 2; }, "\"version\" 2 is not supported");
  expect(
      [](auto& j) {
        j["image"]["pixel_mean"] = {1, 2};
      },
      "image.pixel_mean: needs one value per channel (3), got 2");
  expect([](auto& j) { j["image"]["pixel_std"] = {1, 0, 1}; }, "image.pixel_std: values must be finite and positive");
  expect([](auto& j) { j["image"]["resize"] = "crop"; }, "image.resize: 'crop' is not one of: stretch, longest_side");
  expect([](auto& j) { j["image"]["height"] = 32; },
         "image_encoder (" + (tiny_sam() / "image_encoder.onnx").string() +
             "): input 'image' has height 64 but pipeline.json's image says 32");
  expect([](auto& j) { j["image_encoder"]["input"] = "img"; }, "the model has no input 'img' (its inputs: image)");
  expect([](auto& j) { j["mask_decoder"]["outputs"]["masks"] = "low_res_masks"; },
         "the model has no output 'low_res_masks' (its outputs: masks, iou_predictions)");
  expect([](auto& j) { j["mask_decoder"]["point_labels"] = "point_coords"; }, "must name three different inputs");
  expect([](auto& j) { j["mask_decoder"]["single_mask_index"] = -1; },
         "single_mask_index: must be an integer in [0, 1023], got -1");
  expect([](auto& j) { j["mask_decoder"]["model"] = "nowhere.onnx"; }, "mask_decoder.model: ");
  expect([](auto& j) { j["mask_decoder"]["model"] = "nowhere.onnx"; }, "nowhere.onnx: no such file");
  expect(
      [](auto& j) {
        j["image_encoder"]["variants"] = {{"int8", 3}};
      },
      "image_encoder.variants.int8: must be the path of the variant's .onnx file");
  EXPECT_NE(load_error([](auto&) {}).find("(no error)"), std::string::npos);

  testing::ScratchDir dir("seg-missing");
  try {
    read_segmentation_config(dir.path());
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.json: no such file (a pipeline folder holds a pipeline.json)"),
              std::string::npos)
        << e.what();
  }
}

TEST(SegmentationPipeline, AVariantMayBringItsOwnExport) {
  testing::ScratchDir dir("seg-variant");
  auto path = write_config(dir, [](auto& j) {
    j["mask_decoder"]["variants"] = {{"copy", (tiny_sam() / "mask_decoder.onnx").string()}};
  });
  auto p = SegmentationPipeline::load(path);
  EXPECT_EQ(p.config().variant_names(), std::vector<std::string>{"copy"});
  EXPECT_NE(&p.mask_decoder("copy"), &p.mask_decoder());
  EXPECT_EQ(&p.image_encoder("copy"), &p.image_encoder());  // no own encoder: the main one
  try {
    p.make_sessions({}, "int8");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no variant 'int8' (variants: copy)"), std::string::npos) << e.what();
  }
  auto main = p.make_sessions(), copy = p.make_sessions({}, "copy");
  std::vector<SegmentationPoint> pt = {{30, 52, 1}};
  auto e = p.encode(*main.image_encoder, scene_planes(0));
  EXPECT_TRUE(same_bits(p.decode(*main.mask_decoder, e, pt).logits, p.decode(*copy.mask_decoder, e, pt).logits));
}

TEST(SegmentationPipeline, PointsAreCheckedAgainstTheImage) {
  const auto& p = pipeline();
  auto s = p.make_sessions();
  ImageEmbedding e = p.encode(*s.image_encoder, scene_planes(0));
  auto error = [&](std::vector<SegmentationPoint> pts) -> std::string {
    try {
      p.decode(*s.mask_decoder, e, pts);
    } catch (const InputError& ex) {
      return ex.what();
    }
    return "(no error)";
  };
  EXPECT_NE(error({{64, 3, 1}}).find("point 1 (64, 3) lies outside the 64x64 image"), std::string::npos);
  EXPECT_NE(error({{3, 3, 1}, {1.5, -0.5, 0}}).find("point 2 (1.5, -0.5) lies outside"), std::string::npos);
  EXPECT_NE(error({{3, 3, 2}}).find("has label 2; labels are 1 (foreground) or 0 (background)"), std::string::npos);
  EXPECT_NE(error({}).find("at least one point"), std::string::npos);
  // The padding point is appended after the user's points.
  std::vector<SegmentationPoint> pts = {{10, 20, 1}, {30.5, 40, 0}};
  auto [coords, labels] = p.point_inputs(e, pts);
  ASSERT_EQ(coords.shape(), (Shape{1, 3, 2}));
  const float* c = coords.data<float>();
  const float* l = labels.data<float>();
  EXPECT_EQ(std::vector<float>(c, c + 6), (std::vector<float>{10, 20, 30.5f, 40, 0, 0}));
  EXPECT_EQ(std::vector<float>(l, l + 3), (std::vector<float>{1, 0, -1}));
}

TEST(SegmentationPipeline, ImagesOfOtherSizesAreResized) {
  const auto& p = pipeline();
  auto s = p.make_sessions();
  // stretch (tiny-sam's setting): a 128x128 rendering of held-out scenes; points and masks at 128.
  double sum = 0;
  int n = 0;
  datasets::SceneOptions big;
  big.size = 128;
  for (std::uint64_t index = 0; index < 6; ++index) {
    datasets::Scene scene = datasets::generate_scene(kEvalSeed, index, big);
    ImageEmbedding e = p.encode(*s.image_encoder, image_planes(scene.image, 3, "scene"));
    EXPECT_EQ(e.scaled_height, 64);
    auto pts = datasets::scene_object_points(scene);
    for (std::size_t k = 0; k < pts.size(); ++k) {
      if (pts[k][0] < 0) continue;
      std::vector<SegmentationPoint> prompt = {{double(pts[k][0]), double(pts[k][1]), 1}};
      SegmentationResult r = p.decode(*s.mask_decoder, e, prompt);
      ASSERT_EQ(r.mask.shape(), (Shape{128, 128}));
      ASSERT_EQ(r.model_logits.shape(), (Shape{64, 64}));
      Tensor ref(DType::kUInt8, {128, 128});
      for (int i = 0; i < 128 * 128; ++i) ref.data<std::uint8_t>()[i] = scene.masks[k][std::size_t(i)] ? 1 : 0;
      sum += metrics::mask_iou(ref, r.mask).iou;
      ++n;
    }
  }
  EXPECT_GE(sum / n, 0.9) << n << " prompts";

  // longest_side (SAM's): a 128x96 image is scaled by 0.5 to 64x48 and padded below with zeros.
  testing::ScratchDir dir("seg-longest");
  auto sam = SegmentationPipeline::load(write_config(dir, [](auto& j) { j["image"]["resize"] = "longest_side"; }));
  Tensor wide(DType::kFloat32, {3, 96, 128});
  Tensor full = scene_planes(4, 128);
  for (int c = 0; c < 3; ++c)
    std::memcpy(wide.data<float>() + c * 96 * 128, full.data<float>() + c * 128 * 128, 96 * 128 * sizeof(float));
  ImageEmbedding e;
  Tensor x = sam.preprocess(wide, &e);
  EXPECT_EQ(e.scaled_height, 48);
  EXPECT_EQ(e.scaled_width, 64);
  bool padding_zero = true, image_nonzero = false;
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 64; ++y)
      for (int xx = 0; xx < 64; ++xx) {
        float v = x.data<float>()[(c * 64 + y) * 64 + xx];
        if (y >= 48) padding_zero = padding_zero && v == 0.0f;
        else image_nonzero = image_nonzero || v != 0.0f;
      }
  EXPECT_TRUE(padding_zero);
  EXPECT_TRUE(image_nonzero);
  auto ss = sam.make_sessions();
  e = sam.encode(*ss.image_encoder, wide);
  std::vector<SegmentationPoint> prompt = {{127, 95, 1}};
  auto [coords, labels] = sam.point_inputs(e, prompt);
  EXPECT_EQ(coords.data<float>()[0], 63.5f);
  EXPECT_EQ(coords.data<float>()[1], 47.5f);
  SegmentationResult r = sam.decode(*ss.mask_decoder, e, prompt);
  EXPECT_EQ(r.logits.shape(), (Shape{96, 128}));
  EXPECT_EQ(r.mask.shape(), (Shape{96, 128}));
}

}  // namespace
}  // namespace qeval::eval
