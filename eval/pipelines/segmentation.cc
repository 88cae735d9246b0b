// The promptable-segmentation pipeline: pipeline.json, preprocessing, encoder and decoder calls.
#include "eval/pipelines/segmentation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "base/json_config.h"
#include "eval/exec/onnx_import.h"
#include "kernels/error.h"
#include "kernels/numeric.h"
#include "kernels/resize.h"
#include "metrics/segmentation.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

constexpr const char* kEncoderKey = "image_encoder";
constexpr const char* kDecoderKey = "mask_decoder";

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The value at `key` as its own JsonConfig, so that errors name the key path.
base::JsonConfig at(const base::JsonConfig& c, const std::string& key) {
  return base::JsonConfig(c.value().at(key), c.source(), c.path().empty() ? key : c.path() + "." + key, kSegmentDoc);
}

std::string non_empty_string(const base::JsonConfig& c, const std::string& key, const std::string& fallback) {
  std::string s = c.get_string(key, fallback);
  if (s.empty()) at(c, key).fail("must not be empty");
  return s;
}

int int_in(const base::JsonConfig& c, const std::string& key, long long lo, long long hi,
           std::optional<long long> fallback = {}) {
  long long v = fallback && !c.has(key) ? *fallback : c.get_int(key);
  if (v < lo || v > hi)
    at(c, key).fail("must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                    std::to_string(v));
  return static_cast<int>(v);
}

ModelFiles read_model(const base::JsonConfig& c) {
  ModelFiles m;
  m.model = c.get_path("model");
  if (auto variants = c.optional_object("variants")) {
    for (const auto& [name, value] : variants->value().items()) {
      if (name.empty()) variants->fail("a variant name must not be empty");
      if (!value.is_string()) at(*variants, name).fail("must be the path of the variant's .onnx file");
      m.variant_models[name] = variants->get_path(name);
    }
  }
  return m;
}

std::vector<float> per_channel(const base::JsonConfig& c, const std::string& key, int channels, bool positive) {
  if (!c.has(key)) c.fail("missing required key '" + key + "'");
  std::vector<double> v = c.get_numbers(key);
  if (static_cast<int>(v.size()) != channels)
    at(c, key).fail("needs one value per channel (" + std::to_string(channels) + "), got " + std::to_string(v.size()));
  std::vector<float> out;
  for (double x : v) {
    if (!std::isfinite(x) || (positive && !(x > 0)))
      at(c, key).fail(positive ? "values must be finite and positive" : "values must be finite");
    out.push_back(static_cast<float>(x));
  }
  return out;
}

std::string value_names(const std::vector<ValueInfo>& values) {
  std::vector<std::string> names;
  for (const auto& v : values) names.push_back(v.name);
  return join(names);
}

bool is_float_type(DType t) { return t == DType::kFloat32 || t == DType::kFloat16; }

// Checks that `graph` has exactly the inputs `inputs` and at least the outputs `outputs`, all of
// float32/float16 type; returns the declared inputs in the order given.
std::vector<const ValueInfo*> check_io(const Graph& graph, const std::string& model_key,
                                       const SegmentationConfig& config, const std::vector<std::string>& inputs,
                                       const std::vector<std::string>& outputs) {
  const std::string where = config.source.string() + ": " + model_key + " (" + graph.source + ")";
  std::vector<const ValueInfo*> found;
  for (const auto& name : inputs) {
    const ValueInfo* v = find_value(graph.inputs, name);
    if (!v)
      throw InputError(where + ": the model has no input '" + name + "' (its inputs: " + value_names(graph.inputs) +
                       ") (see " + kSegmentDoc + ")");
    if (!is_float_type(v->dtype))
      throw InputError(where + ": input '" + name + "' is " + std::string(dtype_name(v->dtype)) +
                       "; the segmentation pipeline feeds float32 or float16");
    found.push_back(v);
  }
  for (const auto& v : graph.inputs)
    if (std::find(inputs.begin(), inputs.end(), v.name) == inputs.end())
      throw InputError(where + ": the model has an input '" + v.name +
                       "' that pipeline.json does not feed (it feeds: " + join(inputs) + ")");
  for (const auto& name : outputs) {
    const ValueInfo* v = find_value(graph.outputs, name);
    if (!v)
      throw InputError(where + ": the model has no output '" + name + "' (its outputs: " + value_names(graph.outputs) +
                       ") (see " + kSegmentDoc + ")");
    if (!is_float_type(v->dtype))
      throw InputError(where + ": output '" + name + "' is " + std::string(dtype_name(v->dtype)) +
                       ", expected float32 or float16");
  }
  return found;
}

// float32 values -> a tensor of the declared input type (float32 or float16).
Tensor as_declared(Tensor t, DType declared) {
  if (declared != DType::kFloat16) return t;
  Tensor out(DType::kFloat16, t.shape());
  const float* src = t.data<float>();
  auto* dst = reinterpret_cast<std::uint16_t*>(out.raw());
  for (std::int64_t i = 0; i < t.numel(); ++i) dst[i] = to_float16(src[i]).bits;
  return out;
}

// An output of declared type float32 or float16 -> float32.
Tensor as_float32(const Tensor& t) {
  if (t.dtype() == DType::kFloat32) return t;
  if (t.dtype() != DType::kFloat16)
    throw std::logic_error("segmentation: unexpected output type " + std::string(dtype_name(t.dtype())));
  return widened_to_float32(t);
}

// Bilinear resize of planes [C, h, w] -> [C, oh, ow] (half-pixel centres; antialiased when asked).
Tensor resize_planes(const Tensor& planes, std::int64_t oh, std::int64_t ow, bool antialias) {
  const std::int64_t c = planes.dim(0), h = planes.dim(1), w = planes.dim(2);
  if (oh == h && ow == w) return planes;
  Tensor out(DType::kFloat32, {c, oh, ow});
  kernels::ResizeOptions options;
  options.mode = kernels::ResizeMode::kLinear;
  options.coordinates = kernels::ResizeCoordinates::kHalfPixel;
  options.antialias = antialias;
  std::vector<kernels::ResizeAxis> axes = {
      {c, c, 1.0}, {h, oh, double(oh) / double(h)}, {w, ow, double(ow) / double(w)}};
  kernels::resize<float>(planes.data<float>(), out.data<float>(), axes, options);
  return out;
}

std::string point_text(const SegmentationPoint& p) { return fmt::format("({}, {})", p.x, p.y); }

}  // namespace

// ---- pipeline.json ----

std::vector<std::string> SegmentationConfig::variant_names() const {
  std::set<std::string> names;
  for (const auto* m : {&image_encoder, &mask_decoder})
    for (const auto& [k, _] : m->variant_models) names.insert(k);
  return {names.begin(), names.end()};
}

SegmentationConfig read_segmentation_config(const fs::path& dir_or_file) {
  // Format, version and task first (the reader shared by every task), then this task's keys.
  if (read_pipeline_task(dir_or_file) != PipelineTask::kSegmentation) {
    base::JsonConfig root = base::JsonConfig::load(pipeline_json_path(dir_or_file), kSegmentDoc);
    at(root, "task").fail("is \"" + root.get_string("task") + "\": this is not a segmentation pipeline");
  }
  const fs::path path = pipeline_json_path(dir_or_file);
  base::JsonConfig root = base::JsonConfig::load(path, kSegmentDoc);
  root.allow_keys({"format", "version", "task", "name", "image_encoder", "mask_decoder", "image", "prompts"});

  SegmentationConfig c;
  c.source = path;
  c.name = root.get_string("name", path.parent_path().filename().string());

  base::JsonConfig enc = root.object(kEncoderKey);
  enc.allow_keys({"model", "variants", "input", "output"});
  c.image_encoder = read_model(enc);
  c.encoder_input = non_empty_string(enc, "input", c.encoder_input);
  c.encoder_output = non_empty_string(enc, "output", c.encoder_output);

  base::JsonConfig dec = root.object(kDecoderKey);
  dec.allow_keys({"model", "variants", "image_embeddings", "point_coords", "point_labels", "outputs",
                  "append_padding_point", "mask_threshold", "single_mask_index"});
  c.mask_decoder = read_model(dec);
  c.decoder_embeddings = non_empty_string(dec, "image_embeddings", c.decoder_embeddings);
  c.decoder_point_coords = non_empty_string(dec, "point_coords", c.decoder_point_coords);
  c.decoder_point_labels = non_empty_string(dec, "point_labels", c.decoder_point_labels);
  if (auto outs = dec.optional_object("outputs")) {
    outs->allow_keys({"masks", "iou_predictions"});
    c.decoder_masks = non_empty_string(*outs, "masks", c.decoder_masks);
    c.decoder_iou_predictions = non_empty_string(*outs, "iou_predictions", c.decoder_iou_predictions);
  }
  c.append_padding_point = dec.get_bool("append_padding_point", c.append_padding_point);
  const double threshold = dec.get_number("mask_threshold", c.mask_threshold);
  if (!std::isfinite(threshold)) at(dec, "mask_threshold").fail("must be finite");
  c.mask_threshold = static_cast<float>(threshold);
  c.single_mask_index = int_in(dec, "single_mask_index", 0, 1023, c.single_mask_index);
  const std::set<std::string> dec_inputs = {c.decoder_embeddings, c.decoder_point_coords, c.decoder_point_labels};
  if (dec_inputs.size() != 3)
    dec.fail("image_embeddings, point_coords and point_labels must name three different inputs");

  base::JsonConfig img = root.object("image");
  img.allow_keys({"channels", "height", "width", "pixel_mean", "pixel_std", "resize"});
  c.channels = int_in(img, "channels", 1, 4);
  c.height = int_in(img, "height", 1, 16384);
  c.width = int_in(img, "width", 1, 16384);
  c.pixel_mean = per_channel(img, "pixel_mean", c.channels, false);
  c.pixel_std = per_channel(img, "pixel_std", c.channels, true);
  c.resize = img.get_choice("resize", {"stretch", "longest_side"}, "longest_side") == "stretch"
                 ? SegmentationResize::kStretch
                 : SegmentationResize::kLongestSide;

  if (auto p = root.optional_object("prompts")) {
    p->allow_keys({"calibration", "evaluation"});
    if (p->has("calibration")) c.calibration_prompts = p->get_path("calibration");
    if (p->has("evaluation")) c.evaluation_prompts = p->get_path("evaluation");
  }
  return c;
}

// ---- the pipeline ----

struct SegmentationPipeline::Graphs {
  Graph encoder, decoder;
  std::map<std::string, Graph> encoder_variants, decoder_variants;
};

SegmentationPipeline::SegmentationPipeline(SegmentationConfig config)
    : config_(std::move(config)), graphs_(std::make_unique<Graphs>()) {
  auto load = [&](const fs::path& file, const char* key, const std::string& variant) {
    if (!fs::exists(file))
      throw InputError(config_.source.string() + ": " + key + (variant.empty() ? ".model" : ".variants." + variant) +
                       ": " + file.string() + ": no such file");
    return load_onnx(file);
  };
  const SegmentationConfig& c = config_;
  auto check_encoder = [&](const Graph& g) {
    auto in = check_io(g, kEncoderKey, c, {c.encoder_input}, {c.encoder_output});
    const ValueInfo& v = *in[0];
    if (v.has_shape) {
      const std::string where = c.source.string() + ": " + kEncoderKey + " (" + g.source + "): input '" + v.name + "'";
      if (v.dims.size() != 4)
        throw InputError(where + " has rank " + std::to_string(v.dims.size()) +
                         ", expected [batch, channels, height, width]");
      const std::int64_t want[4] = {1, c.channels, c.height, c.width};
      const char* what[4] = {"batch", "channels", "height", "width"};
      for (int i = 0; i < 4; ++i)
        if (v.dims[std::size_t(i)] >= 0 && v.dims[std::size_t(i)] != want[i])
          throw InputError(where + " has " + what[i] + " " + std::to_string(v.dims[std::size_t(i)]) +
                           " but pipeline.json's image says " + std::to_string(want[i]));
    }
  };
  auto check_decoder = [&](const Graph& g) {
    check_io(g, kDecoderKey, c, {c.decoder_embeddings, c.decoder_point_coords, c.decoder_point_labels},
             {c.decoder_masks, c.decoder_iou_predictions});
  };
  graphs_->encoder = load(c.image_encoder.model, kEncoderKey, "");
  check_encoder(graphs_->encoder);
  graphs_->decoder = load(c.mask_decoder.model, kDecoderKey, "");
  check_decoder(graphs_->decoder);
  for (const auto& [name, file] : c.image_encoder.variant_models) {
    graphs_->encoder_variants[name] = load(file, kEncoderKey, name);
    check_encoder(graphs_->encoder_variants[name]);
  }
  for (const auto& [name, file] : c.mask_decoder.variant_models) {
    graphs_->decoder_variants[name] = load(file, kDecoderKey, name);
    check_decoder(graphs_->decoder_variants[name]);
  }
}

SegmentationPipeline::SegmentationPipeline(SegmentationPipeline&&) noexcept = default;
SegmentationPipeline::~SegmentationPipeline() = default;

SegmentationPipeline SegmentationPipeline::load(const fs::path& dir_or_file) {
  return SegmentationPipeline(read_segmentation_config(dir_or_file));
}

const Graph& SegmentationPipeline::image_encoder(const std::string& variant) const {
  if (variant.empty()) return graphs_->encoder;
  auto it = graphs_->encoder_variants.find(variant);
  if (it != graphs_->encoder_variants.end()) return it->second;
  if (!graphs_->decoder_variants.count(variant))
    throw InputError(config_.source.string() + ": no variant '" + variant + "' (variants: " +
                     (config_.variant_names().empty() ? "none" : join(config_.variant_names())) + ")");
  return graphs_->encoder;
}

const Graph& SegmentationPipeline::mask_decoder(const std::string& variant) const {
  if (variant.empty()) return graphs_->decoder;
  auto it = graphs_->decoder_variants.find(variant);
  if (it != graphs_->decoder_variants.end()) return it->second;
  image_encoder(variant);  // throws for an unknown variant
  return graphs_->decoder;
}

SegmentationSessions SegmentationPipeline::make_sessions(const SessionOptions& options,
                                                         const std::string& variant) const {
  SegmentationSessions s;
  s.image_encoder = std::make_unique<Session>(image_encoder(variant), options);
  s.mask_decoder = std::make_unique<Session>(mask_decoder(variant), options);
  return s;
}

Tensor SegmentationPipeline::preprocess(const Tensor& planes, ImageEmbedding* embedding) const {
  const SegmentationConfig& c = config_;
  if (planes.dtype() != DType::kFloat32 || planes.rank() != 3 || planes.dim(0) != c.channels || planes.dim(1) < 1 ||
      planes.dim(2) < 1)
    throw InputError("segmentation: the image must be float32 [" + std::to_string(c.channels) + ", H, W] for " +
                     c.source.string() + ", got " + std::string(dtype_name(planes.dtype())) + " " +
                     shape_to_string(planes.shape()));
  const std::int64_t h = planes.dim(1), w = planes.dim(2);
  std::int64_t sh = c.height, sw = c.width;
  if (c.resize == SegmentationResize::kLongestSide && (h != c.height || w != c.width)) {
    // SAM's ResizeLongestSide: one scale for both axes, sizes rounded half up.
    const double scale = std::min(double(c.height) / double(h), double(c.width) / double(w));
    sh = std::clamp<std::int64_t>(std::int64_t(double(h) * scale + 0.5), 1, c.height);
    sw = std::clamp<std::int64_t>(std::int64_t(double(w) * scale + 0.5), 1, c.width);
  }
  Tensor resized = resize_planes(planes, sh, sw, /*antialias=*/true);
  Tensor x(DType::kFloat32, {1, c.channels, c.height, c.width});  // zero: the padding
  const float* src = resized.data<float>();
  float* dst = x.data<float>();
  for (int ch = 0; ch < c.channels; ++ch) {
    const float mean = c.pixel_mean[std::size_t(ch)], std = c.pixel_std[std::size_t(ch)];
    for (std::int64_t y = 0; y < sh; ++y)
      for (std::int64_t xx = 0; xx < sw; ++xx)
        dst[(ch * c.height + y) * c.width + xx] = (src[(ch * sh + y) * sw + xx] - mean) / std;
  }
  if (embedding) {
    embedding->image_height = h;
    embedding->image_width = w;
    embedding->scaled_height = sh;
    embedding->scaled_width = sw;
  }
  return x;
}

ModelCall SegmentationPipeline::encoder_call(std::string_view context) { return {kEncoderKey, context, 0, -1}; }
ModelCall SegmentationPipeline::decoder_call(std::string_view context, int call) {
  return {kDecoderKey, context, call, -1};
}

std::map<std::string, Tensor> SegmentationPipeline::encoder_inputs(const Graph& g, const Tensor& planes,
                                                                   ImageEmbedding& e) const {
  Tensor x = preprocess(planes, &e);
  const ValueInfo* in = find_value(g.inputs, config_.encoder_input);
  if (!in) throw InputError(g.source + ": no input '" + config_.encoder_input + "'");
  std::map<std::string, Tensor> inputs;
  inputs.emplace(config_.encoder_input, as_declared(std::move(x), in->dtype));
  return inputs;
}

void SegmentationPipeline::take_embeddings(const Graph& g, std::map<std::string, Tensor>& outputs,
                                           ImageEmbedding& e) const {
  auto it = outputs.find(config_.encoder_output);
  if (it == outputs.end()) throw InputError(g.source + ": no output '" + config_.encoder_output + "'");
  e.embeddings = std::move(it->second);
}

ImageEmbedding SegmentationPipeline::encode(Session& encoder, const Tensor& planes, ModelCallObserver* observer,
                                            std::string_view context) const {
  ImageEmbedding e;
  const auto inputs = encoder_inputs(encoder.graph(), planes, e);
  const ModelCall call = encoder_call(context);
  Observer* node_observer = observer ? observer->begin(call) : nullptr;
  auto outputs = encoder.run(inputs, node_observer);
  if (observer) observer->end(call, outputs);
  take_embeddings(encoder.graph(), outputs, e);
  return e;
}

std::pair<Tensor, Tensor> SegmentationPipeline::point_inputs(const ImageEmbedding& e,
                                                             std::span<const SegmentationPoint> points) const {
  if (points.empty()) throw InputError("segmentation: a prompt needs at least one point");
  for (std::size_t i = 0; i < points.size(); ++i) {
    const SegmentationPoint& p = points[i];
    if (p.label != 0 && p.label != 1)
      throw InputError("segmentation: point " + std::to_string(i + 1) + " " + point_text(p) + " has label " +
                       std::to_string(p.label) + "; labels are 1 (foreground) or 0 (background)");
    if (!(p.x >= 0 && p.x < double(e.image_width) && p.y >= 0 && p.y < double(e.image_height)))
      throw InputError("segmentation: point " + std::to_string(i + 1) + " " + point_text(p) + " lies outside the " +
                       std::to_string(e.image_width) + "x" + std::to_string(e.image_height) + " image (x in [0, " +
                       std::to_string(e.image_width) + "), y in [0, " + std::to_string(e.image_height) + "))");
  }
  const std::int64_t n = std::int64_t(points.size()) + (config_.append_padding_point ? 1 : 0);
  Tensor coords(DType::kFloat32, {1, n, 2}), labels(DType::kFloat32, {1, n});  // padding: (0, 0), -1
  float* cd = coords.data<float>();
  float* ld = labels.data<float>();
  // SAM's apply_coords: each axis scaled by (size inside the encoder input) / (image size).
  const double sx = double(e.scaled_width) / double(e.image_width);
  const double sy = double(e.scaled_height) / double(e.image_height);
  for (std::size_t i = 0; i < points.size(); ++i) {
    cd[2 * i] = static_cast<float>(points[i].x * sx);
    cd[2 * i + 1] = static_cast<float>(points[i].y * sy);
    ld[i] = static_cast<float>(points[i].label);
  }
  if (config_.append_padding_point) ld[n - 1] = -1.0f;
  return {std::move(coords), std::move(labels)};
}

std::map<std::string, Tensor> SegmentationPipeline::decoder_inputs(const Graph& g, const ImageEmbedding& e,
                                                                   std::span<const SegmentationPoint> points) const {
  const SegmentationConfig& c = config_;
  auto [coords, labels] = point_inputs(e, points);
  auto declared = [&](const std::string& name) {
    const ValueInfo* v = find_value(g.inputs, name);
    if (!v) throw InputError(g.source + ": no input '" + name + "'");
    return v->dtype;
  };
  std::map<std::string, Tensor> inputs;
  // The embeddings go in as the encoder returned them (a float16 encoder feeding a float16 decoder
  // stays in float16); a type mismatch is the executor's InputError.
  inputs.emplace(c.decoder_embeddings, e.embeddings);
  inputs.emplace(c.decoder_point_coords, as_declared(std::move(coords), declared(c.decoder_point_coords)));
  inputs.emplace(c.decoder_point_labels, as_declared(std::move(labels), declared(c.decoder_point_labels)));
  return inputs;
}

SegmentationResult SegmentationPipeline::decode(Session& decoder, const ImageEmbedding& e,
                                                std::span<const SegmentationPoint> points, ModelCallObserver* observer,
                                                std::string_view context, int call_index) const {
  const auto inputs = decoder_inputs(decoder.graph(), e, points);
  const ModelCall call = decoder_call(context, call_index);
  Observer* node_observer = observer ? observer->begin(call) : nullptr;
  auto outputs = decoder.run(inputs, node_observer);
  if (observer) observer->end(call, outputs);
  return decoder_result(decoder.graph(), e, outputs);
}

SegmentationResult SegmentationPipeline::decoder_result(const Graph& g, const ImageEmbedding& e,
                                                        const std::map<std::string, Tensor>& outputs) const {
  const SegmentationConfig& c = config_;
  auto output = [&](const std::string& name) {
    auto it = outputs.find(name);
    if (it == outputs.end()) throw InputError(g.source + ": no output '" + name + "'");
    return as_float32(it->second);
  };
  Tensor masks = output(c.decoder_masks), iou = output(c.decoder_iou_predictions);
  if (masks.rank() != 4 || masks.dim(0) != 1)
    throw InputError(g.source + ": output '" + c.decoder_masks + "' is " + shape_to_string(masks.shape()) +
                     ", expected [1, masks, height, width]");
  const std::int64_t count = masks.dim(1), mh = masks.dim(2), mw = masks.dim(3);
  if (c.single_mask_index >= count)
    throw InputError(c.source.string() + ": mask_decoder.single_mask_index " + std::to_string(c.single_mask_index) +
                     " but the decoder returned " + std::to_string(count) + " masks");
  if (iou.numel() != count)
    throw InputError(g.source + ": output '" + c.decoder_iou_predictions + "' is " + shape_to_string(iou.shape()) +
                     ", expected one value per mask (" + std::to_string(count) + ")");

  SegmentationResult r;
  r.model_logits = Tensor(DType::kFloat32, {mh, mw});
  std::memcpy(r.model_logits.raw(), masks.data<float>() + c.single_mask_index * mh * mw,
              std::size_t(mh * mw) * sizeof(float));
  r.iou_predictions.assign(iou.data<float>(), iou.data<float>() + count);
  r.iou_prediction = r.iou_predictions[std::size_t(c.single_mask_index)];

  // SAM's postprocess_masks: logits -> the encoder's input size, crop the image's part, -> the
  // image's size (bilinear, half-pixel centres, no antialiasing). Steps that change nothing are
  // skipped, so a model whose masks come at the image's size returns its logits untouched.
  Tensor plane = r.model_logits.reshaped({1, mh, mw});
  plane = resize_planes(plane, c.height, c.width, false);
  if (e.scaled_height != c.height || e.scaled_width != c.width) {
    Tensor crop(DType::kFloat32, {1, e.scaled_height, e.scaled_width});
    for (std::int64_t y = 0; y < e.scaled_height; ++y)
      std::memcpy(crop.data<float>() + y * e.scaled_width, plane.data<float>() + y * c.width,
                  std::size_t(e.scaled_width) * sizeof(float));
    plane = std::move(crop);
  }
  plane = resize_planes(plane, e.image_height, e.image_width, false);
  r.logits = plane.reshaped({e.image_height, e.image_width});
  r.mask = metrics::threshold_mask(r.logits, c.mask_threshold);
  return r;
}

// ---- images ----

Tensor image_planes(const datasets::Image& image, int channels, const std::string& name) {
  const int colors = image.color_channels();
  if (colors != 1 && colors != channels)
    throw InputError(name + ": a " + image.color_type() + " image; the pipeline takes " + std::to_string(channels) +
                     " channel" + (channels == 1 ? "" : "s"));
  const std::int64_t h = image.height(), w = image.width(), n = h * w;
  const float scale = image.bit_depth == 16 ? 255.0f / 65535.0f : 1.0f;
  Tensor out(DType::kFloat32, {channels, h, w});
  const float* src = image.planes.data<float>();
  float* dst = out.data<float>();
  for (int c = 0; c < channels; ++c) {
    const float* s = src + (colors == 1 ? 0 : c) * n;
    for (std::int64_t i = 0; i < n; ++i) dst[c * n + i] = s[i] * scale;
  }
  return out;
}

Tensor image_planes(const datasets::Rgb8& image, int channels, const std::string& name) {
  const int colors = image.channels == 4 ? 3 : image.channels;
  if (colors != 1 && colors != channels)
    throw InputError(name + ": a " + std::to_string(image.channels) + "-channel image; the pipeline takes " +
                     std::to_string(channels) + " channels");
  const std::int64_t h = image.height, w = image.width, n = h * w;
  Tensor out(DType::kFloat32, {channels, h, w});
  float* dst = out.data<float>();
  for (int c = 0; c < channels; ++c)
    for (std::int64_t i = 0; i < n; ++i)
      dst[c * n + i] = image.pixels[std::size_t(i * image.channels + (colors == 1 ? 0 : c))];
  return out;
}

}  // namespace qeval::eval
