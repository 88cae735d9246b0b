// qeval segment: one image and point prompts through a segmentation pipeline -> mask PNG.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string_view>

#include "base/exit_codes.h"
#include "base/files.h"
#include "datasets/image_io.h"
#include "datasets/mask_io.h"
#include "datasets/npy.h"
#include "eval/cli/command.h"
#include "eval/pipelines/segmentation.h"
#include "kernels/error.h"
#include "metrics/segmentation.h"

namespace qeval::cli {
namespace {

struct SegmentArgs {
  std::string pipeline, image, out = "qeval-segment.png", precision = "fp32", ref_mask, logits;
  std::vector<std::string> points;
};

// "X,Y" or "X,Y,LABEL" (label 1 foreground, 0 background).
eval::SegmentationPoint parse_point(const std::string& text) {
  auto bad = [&](const std::string& why) -> eval::SegmentationPoint {
    throw InputError("--point '" + text + "': " + why +
                     " (expected X,Y or X,Y,LABEL with LABEL 1 = "
                     "foreground, 0 = background; X, Y in image pixels)");
  };
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i)
    if (i == text.size() || text[i] == ',') {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  if (parts.size() < 2 || parts.size() > 3) return bad("needs 2 or 3 comma-separated values");
  auto number = [&](const std::string& s, const char* what) {
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (s.empty() || used != s.size() || !std::isfinite(v)) bad(std::string(what) + " '" + s + "' is not a number");
    return v;
  };
  eval::SegmentationPoint p{number(parts[0], "X"), number(parts[1], "Y"), 1};
  if (parts.size() == 3) {
    if (parts[2] != "0" && parts[2] != "1") return bad("label '" + parts[2] + "' is not 0 or 1");
    p.label = parts[2] == "1" ? 1 : 0;
  }
  return p;
}

int run_segment(const SegmentArgs& a) {
  std::vector<eval::SegmentationPoint> points;
  for (const auto& s : a.points) points.push_back(parse_point(s));

  const auto pipeline = eval::SegmentationPipeline::load(a.pipeline);
  const auto& config = pipeline.config();
  const datasets::Image image = datasets::load_image(a.image);
  const Tensor planes = eval::image_planes(image, config.channels, a.image);
  for (std::size_t i = 0; i < points.size(); ++i)
    if (!(points[i].x < image.width() && points[i].y < image.height()) || points[i].x < 0 || points[i].y < 0)
      throw InputError(fmt::format("--point '{}' lies outside {} ({}x{}: X in [0, {}), Y in [0, {}))", a.points[i],
                                   a.image, image.width(), image.height(), image.width(), image.height()));
  std::optional<Tensor> ref;
  if (!a.ref_mask.empty()) {
    ref = datasets::load_mask(a.ref_mask);
    if (ref->dim(0) != image.height() || ref->dim(1) != image.width())
      throw InputError(fmt::format("--ref-mask {}: the mask is {}x{} but the image {} is {}x{}", a.ref_mask,
                                   ref->dim(1), ref->dim(0), a.image, image.width(), image.height()));
  }

  eval::SessionOptions options;
  options.precision = *eval::precision_from_name(a.precision);  // CLI11 checked the name
  auto sessions = pipeline.make_sessions(options);
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  eval::ImageEmbedding embedding = pipeline.encode(*sessions.image_encoder, planes);
  auto t1 = clock::now();
  eval::SegmentationResult r = pipeline.decode(*sessions.mask_decoder, embedding, points);
  auto t2 = clock::now();

  base::write_file_atomic(a.out, [&] {
    auto bytes = datasets::encode_png(datasets::mask_image(r.mask));
    return std::string(bytes.begin(), bytes.end());
  }());
  if (!a.logits.empty()) datasets::write_npy(a.logits, r.logits);

  const auto mask = r.mask.span<std::uint8_t>();
  const auto on = std::count(mask.begin(), mask.end(), std::uint8_t{1});
  fmt::print("qeval segment: {} ({}), {} {}x{}, {} point{}\n", config.name, a.precision, a.image, image.width(),
             image.height(), points.size(), points.size() == 1 ? "" : "s");
  fmt::print("  mask -> {} ({} of {} pixels, {:.1f}%)\n", a.out, on, r.mask.numel(),
             100.0 * double(on) / double(r.mask.numel()));
  if (!a.logits.empty()) fmt::print("  logits -> {}\n", a.logits);
  fmt::print("  predicted IoU {:.4f}\n", r.iou_prediction);
  if (ref) {
    const auto iou = metrics::mask_iou(*ref, r.mask);
    const auto bf = metrics::boundary_f_score(*ref, r.mask);
    fmt::print("  IoU vs {} {:.4f}, boundary F {:.4f} (tolerance {} px)\n", a.ref_mask, iou.iou, bf.f, bf.tolerance_px);
  }
  fmt::print("  encode {:.1f} ms, decode {:.1f} ms\n", std::chrono::duration<double, std::milli>(t1 - t0).count(),
             std::chrono::duration<double, std::milli>(t2 - t1).count());
  return base::kExitPass;
}

Runner add_segment(CLI::App& app) {
  auto a = std::make_shared<SegmentArgs>();
  auto* cmd =
      app.add_subcommand("segment",
                         "Segment the object under point prompts with a segmentation pipeline (SAM-style image\n"
                         "encoder + mask decoder; pipeline.json: docs/segment.md) and write the mask as a PNG\n"
                         "(255 = object). Prints the decoder's predicted IoU, and the IoU and boundary F score\n"
                         "against --ref-mask. Exit: 0 done, 2 bad input (unreadable image, point outside the image,\n"
                         "bad label, ...).");
  cmd->add_option("--pipeline", a->pipeline, "the pipeline folder (or its pipeline.json), e.g. models/tiny-sam")
      ->required();
  cmd->add_option("--image", a->image, "the image (PNG or JPEG; gray or RGB)")->required();
  cmd->add_option("--point", a->points,
                  "X,Y[,LABEL]: a point in image pixels, LABEL 1 foreground (default) or 0 background "
                  "(repeatable)")
      ->required();
  cmd->add_option("--out", a->out, "the mask PNG to write (default qeval-segment.png)");
  cmd->add_option(
         "--precision", a->precision,
         "fp32 (default); fp16 or bf16: a deployment (BatchNormalization folded, values rounded where fused kernels "
         "store them, FP32 accumulation); fp16-strict or bf16-strict: every op's output rounded (docs/precision.md)")
      ->check(CLI::IsMember(eval::precision_names()));
  cmd->add_option("--ref-mask", a->ref_mask, "a reference mask (gray PNG, non-zero = object) to score against");
  cmd->add_option("--logits", a->logits, "also write the mask logits (float32 [H, W] .npy)");
  return [a](const Context&) { return run_segment(*a); };
}

const bool kRegistered = register_command(31, add_segment);

}  // namespace
}  // namespace qeval::cli
