// Point-prompt sets for promptable segmentation: JSON Lines, one prompt a line (an image file or a
// synthetic scene, points with labels, an optional reference mask). Format: docs/segment.md.
// (The reader lives in eval/, not datasets/, because every user-written JSON goes through
// JsonConfig; the shipped sets live in datasets/point_prompts/.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "eval/pipelines/segmentation.h"
#include "kernels/tensor.h"

namespace qeval::eval {

// A synthetic scene (datasets/scenes.h): scene `index` of the stream `seed`, `size` pixels square.
struct SceneRef {
  std::uint64_t seed = 0, index = 0;
  int size = 64;
};

struct PointPrompt {
  std::string id;                 // unique within the set; "line N" when the line gives none
  int line = 0;                   // 1-based line in the file
  std::filesystem::path image;    // resolved against the set's folder; empty for a scene
  std::optional<SceneRef> scene;  // exactly one of image / scene
  std::vector<SegmentationPoint> points;
  std::filesystem::path mask;  // reference mask image, resolved; empty when none
  int scene_object = -1;       // reference mask = the scene's object k (0-based); -1 when none
  bool has_reference_mask() const { return !mask.empty() || scene_object >= 0; }
  // Prompts with equal keys share an image: the evaluator encodes it once.
  std::string image_key() const;
  // "FILE:LINE (id ID)" for messages.
  std::string where(const std::filesystem::path& source) const;
};

struct PointPromptSet {
  std::filesystem::path source;
  std::vector<PointPrompt> prompts;
};

// Reads a set. InputError naming the file, the line, the key and what was expected: a line that
// is not a JSON object, unknown keys, neither or both of image/scene, no points, a point that is
// not [x, y] or [x, y, label], a label other than 0/1, a negative coordinate, a duplicate id, a
// scene object index with no scene, an empty set.
PointPromptSet read_point_prompts(const std::filesystem::path& path);
PointPromptSet parse_point_prompts(const std::string& text, const std::filesystem::path& source);

// A prompt's pixels and reference mask, checked against each other and the points.
struct PromptInputs {
  Tensor planes;               // float32 [channels, H, W] on 0..255 (image_planes)
  std::optional<Tensor> mask;  // uint8 [H, W] 0/1
};
// Loads the image (or renders the scene) and the reference mask. InputError naming the prompt:
// unreadable files, a mask of another size than the image, a scene object that does not exist,
// a point outside the image.
PromptInputs load_prompt_inputs(const PointPrompt& prompt, const std::filesystem::path& source, int channels);

}  // namespace qeval::eval
