// The promptable-segmentation pipeline (SAM / EfficientViT-SAM's ONNX form): image -> image
// encoder -> embeddings, then embeddings + point prompts -> mask decoder -> mask logits, mask and
// predicted IoU. pipeline.json (task "segmentation") is documented in docs/segment.md.
//
// Built for the evaluator: the pipeline holds the configuration and the loaded graphs and is
// immutable (share it between threads); the caller owns the Sessions (one pair per variant and
// thread: fp32/fp16/bf16 or quantized sessions over the same graphs, or over a variant's own
// export), and passes an observer per run. One encoding serves any number of prompts.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/image_io.h"
#include "eval/exec/graph.h"
#include "eval/exec/session.h"
#include "eval/pipelines/model_call.h"
#include "eval/pipelines/pipeline_config.h"
#include "kernels/tensor.h"

namespace qeval::eval {

inline constexpr const char* kSegmentDoc = "docs/segment.md";

// How an image whose size differs from the encoder's input reaches it.
enum class SegmentationResize {
  kStretch,      // resized to the input's height and width (aspect ratio not kept)
  kLongestSide,  // SAM: scaled so that it fits, aspect kept, padded with zeros at bottom/right
};

struct SegmentationConfig {
  std::filesystem::path source;  // the pipeline.json read
  std::string name;

  ModelFiles image_encoder;  // model + "variants" (another export per variant name)
  std::string encoder_input = "image", encoder_output = "image_embeddings";

  ModelFiles mask_decoder;
  std::string decoder_embeddings = "image_embeddings";
  std::string decoder_point_coords = "point_coords", decoder_point_labels = "point_labels";
  std::string decoder_masks = "masks", decoder_iou_predictions = "iou_predictions";
  bool append_padding_point = true;  // SAM's ONNX decoder: one extra point (0, 0) with label -1
  float mask_threshold = 0.0f;       // mask = logit > threshold
  int single_mask_index = 0;         // which of the decoder's masks is the answer

  int channels = 3, height = 1024, width = 1024;  // the encoder's input
  std::vector<float> pixel_mean, pixel_std;       // per channel, on 0..255 samples
  SegmentationResize resize = SegmentationResize::kLongestSide;

  std::filesystem::path calibration_prompts, evaluation_prompts;  // point-prompt sets; "" if none

  std::vector<std::string> variant_names() const;  // every name under either model's "variants"
};

// `dir_or_file`: the pipeline's folder (its pipeline.json) or the file. Validates every key
// (unknown keys are errors listing the valid ones), types and ranges; resolves paths. Does not
// open the models. InputError names the file and the key path.
SegmentationConfig read_segmentation_config(const std::filesystem::path& dir_or_file);

// A point prompt in the input image's pixel coordinates (x to the right, y down; pixel (i, j)'s
// centre is at x = i, y = j, as tiny-sam was trained). label: 1 foreground, 0 background.
struct SegmentationPoint {
  double x = 0, y = 0;
  int label = 1;
};

// The two executor sessions of one variant.
struct SegmentationSessions {
  std::unique_ptr<Session> image_encoder, mask_decoder;
};

// An image as the encoder saw it, ready for any number of prompts.
struct ImageEmbedding {
  Tensor embeddings;                                 // the encoder's output as returned
  std::int64_t image_height = 0, image_width = 0;    // the caller's image
  std::int64_t scaled_height = 0, scaled_width = 0;  // its size inside the encoder's input
};

struct SegmentationResult {
  Tensor logits;                       // float32 [image H, W]: the chosen mask's logits at the image's size
  Tensor mask;                         // uint8 [image H, W]: 1 where logit > mask_threshold
  Tensor model_logits;                 // float32 [h, w]: the chosen mask as the decoder returned it (no resampling)
  float iou_prediction = 0;            // the decoder's predicted IoU of the chosen mask
  std::vector<float> iou_predictions;  // of every mask the decoder returned
};

class SegmentationPipeline {
 public:
  // Reads pipeline.json and loads both models and every variant's export; checks that the
  // graphs have the inputs and outputs the configuration names, with the declared types, and that
  // the encoder's fixed input dimensions match "image". InputError otherwise.
  static SegmentationPipeline load(const std::filesystem::path& dir_or_file);
  explicit SegmentationPipeline(SegmentationConfig config);
  SegmentationPipeline(SegmentationPipeline&&) noexcept;
  ~SegmentationPipeline();

  const SegmentationConfig& config() const { return config_; }
  // The graphs of a variant ("" = the main export; a variant without its own export of this
  // model uses the main one). InputError for a variant no model lists.
  const Graph& image_encoder(const std::string& variant = "") const;
  const Graph& mask_decoder(const std::string& variant = "") const;
  // Sessions over a variant's graphs (valid while this pipeline lives).
  SegmentationSessions make_sessions(const SessionOptions& options = {}, const std::string& variant = "") const;

  // The image as the encoder reads it: `planes` float32 [C, H, W] raw 8-bit samples (0..255) ->
  // float32 [1, C, height, width], resized (bilinear, half-pixel centres, antialiased when
  // shrinking), normalised ((v - mean) / std per channel) and zero-padded (longest_side).
  // `embedding` (may be null) gets the sizes. InputError for a wrong channel count.
  Tensor preprocess(const Tensor& planes, ImageEmbedding* embedding = nullptr) const;

  // Runs the encoder once. `context` is passed to the observer (e.g. the prompt set entry's id).
  ImageEmbedding encode(Session& image_encoder, const Tensor& planes, ModelCallObserver* observer = nullptr,
                        std::string_view context = {}) const;
  // Runs the decoder for one prompt (`call`: the index reported to the observer). InputError when
  // there is no point, a point lies outside the image ([0, W) x [0, H)) or a label is not 0/1.
  SegmentationResult decode(Session& mask_decoder, const ImageEmbedding& embedding,
                            std::span<const SegmentationPoint> points, ModelCallObserver* observer = nullptr,
                            std::string_view context = {}, int call = 0) const;

  // The halves of encode and decode around the session's run, for a caller that runs the model
  // calls itself (the evaluator runs each variant's call in lockstep with the reference's):
  // the call as the observer sees it, the inputs for the session of graph `g`, and the result from
  // the outputs. encode/decode are exactly these with Session::run between.
  static ModelCall encoder_call(std::string_view context);
  static ModelCall decoder_call(std::string_view context, int call);
  std::map<std::string, Tensor> encoder_inputs(const Graph& g, const Tensor& planes, ImageEmbedding& embedding) const;
  void take_embeddings(const Graph& g, std::map<std::string, Tensor>& outputs, ImageEmbedding& embedding) const;
  std::map<std::string, Tensor> decoder_inputs(const Graph& g, const ImageEmbedding& embedding,
                                               std::span<const SegmentationPoint> points) const;
  SegmentationResult decoder_result(const Graph& g, const ImageEmbedding& embedding,
                                    const std::map<std::string, Tensor>& outputs) const;

  // The decoder's point inputs for a prompt: coords float32 [1, N, 2] in encoder-input pixels and
  // labels float32 [1, N] (the padding point appended when configured).
  std::pair<Tensor, Tensor> point_inputs(const ImageEmbedding& embedding,
                                         std::span<const SegmentationPoint> points) const;

 private:
  struct Graphs;
  SegmentationConfig config_;
  std::unique_ptr<Graphs> graphs_;
};

// An image file's pixels as the pipeline takes them: float32 [channels, H, W] on 0..255. Gray
// images are repeated into 3 channels when channels is 3, alpha is dropped, 16-bit samples are
// scaled by 255/65535. InputError naming `name` for what cannot be converted.
Tensor image_planes(const datasets::Image& image, int channels, const std::string& name);
// Same for an 8-bit interleaved image (e.g. a synthetic scene).
Tensor image_planes(const datasets::Rgb8& image, int channels, const std::string& name);

}  // namespace qeval::eval
