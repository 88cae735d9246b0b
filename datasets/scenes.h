// Deterministic synthetic captioned scenes (shapes, colors, 3x3 positions, backgrounds, a mask per
// object): the data tiny-sd and tiny-sam are trained on. Grammar and rules: docs/scenes.md.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/image_io.h"

namespace qeval::datasets {

// Bumped whenever any caption, pixel or mask changes; tools/scenes.py's GENERATOR_VERSION matches.
inline constexpr int kScenesGeneratorVersion = 1;

enum class SceneShape : std::uint8_t { kCircle, kSquare, kTriangle, kRing, kCross, kDiamond };
enum class SceneColor : std::uint8_t { kRed, kOrange, kYellow, kGreen, kBlue, kPurple, kWhite, kBlack };
enum class SceneSize : std::uint8_t { kSmall, kMedium, kLarge };  // "medium" is never written
enum class BackgroundStyle : std::uint8_t { kPlain, kGradient, kStriped };

inline constexpr int kSceneShapeCount = 6;
inline constexpr int kSceneColorCount = 8;
inline constexpr int kSceneSizeCount = 3;
inline constexpr int kBackgroundStyleCount = 3;
inline constexpr int kSceneCellCount = 9;  // 3x3 grid, row-major: cell = 3 * row + column
inline constexpr int kSceneSubpixel = 8;   // geometry unit: 1/8 pixel; samples at odd units
inline constexpr int kSceneSamplesPerPixel = 16;

std::string_view scene_shape_name(SceneShape s);
std::string_view scene_color_name(SceneColor c);
std::string_view scene_size_name(SceneSize s);
std::string_view background_style_name(BackgroundStyle s);
// "at the top left", "at the top", ..., "in the center", ..., "at the bottom right".
std::string_view scene_position_phrase(int cell);

using Rgb = std::array<std::uint8_t, 3>;
Rgb scene_object_rgb(SceneColor c);
// The two tones of a background of color c: muted (plain, gradient top, even stripes) and darker.
std::array<Rgb, 2> scene_background_tones(SceneColor c);

// splitmix64 (Steele, Lea & Flood 2014). Written out here (not std::mt19937) so that
// tools/scenes.py draws the very same numbers.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t state) : state_(state) {}
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix(state_);
  }
  // An integer in [0, n): the high 32 bits times n, shifted (Lemire; no rejection, n < 2^32).
  std::uint32_t uniform(std::uint32_t n) { return static_cast<std::uint32_t>(((next() >> 32) * n) >> 32); }

 private:
  std::uint64_t state_;
};

struct SceneObject {
  SceneShape shape = SceneShape::kCircle;
  SceneColor color = SceneColor::kRed;
  SceneSize size = SceneSize::kMedium;
  int cell = 4;
  // Geometry in 1/kSceneSubpixel pixel units: centre and radius (half the side, half the height).
  int center_x = 0, center_y = 0, radius = 0;
};

struct SceneOptions {
  int size = 64;        // image side in pixels, 16..1024
  int min_objects = 1;  // 1 <= min_objects <= max_objects <= 3
  int max_objects = 3;
};

struct SceneDescription {
  std::uint64_t seed = 0, index = 0;
  int size = 64;
  BackgroundStyle style = BackgroundStyle::kPlain;
  SceneColor background = SceneColor::kWhite;
  std::vector<SceneObject> objects;  // in caption order; later objects are painted over earlier ones
  std::string caption;
};

struct Scene {
  SceneDescription description;
  Rgb8 image;                                    // size x size RGB
  std::vector<std::vector<std::uint8_t>> masks;  // per object, size*size, 255 where the object
                                                 // covers at least half the pixel's samples
};

// The random draws of scene `index` of the stream `seed` (no pixels). Throws InputError on bad
// options.
SceneDescription describe_scene(std::uint64_t seed, std::uint64_t index, const SceneOptions& options = {});
// Pixels and masks of a description (exact integer rasterisation: 4x4 samples per pixel).
Scene render_scene(const SceneDescription& description);
inline Scene generate_scene(std::uint64_t seed, std::uint64_t index, const SceneOptions& options = {}) {
  return render_scene(describe_scene(seed, index, options));
}

// Per object, the (x, y) of its mask's pixel nearest the mask's centroid (the first in row-major
// order on ties; (-1, -1) for an empty mask): the point prompts tiny-sam is evaluated with.
std::vector<std::array<int, 2>> scene_object_points(const Scene& scene);

// The caption of objects on a background, by the grammar of docs/scenes.md.
std::string scene_caption(const std::vector<SceneObject>& objects, BackgroundStyle style, SceneColor background);

// What a caption of the grammar names: objects (shape, color, size, cell; no geometry) and
// background. Whitespace is normalised and case ignored. Throws InputError naming the phrase that
// does not parse.
struct ParsedCaption {
  std::vector<SceneObject> objects;
  BackgroundStyle style = BackgroundStyle::kPlain;
  SceneColor background = SceneColor::kWhite;
};
ParsedCaption parse_scene_caption(std::string_view caption);

// Prompt following: does an image show an object the caption names (its color and shape in its
// cell; size is not checked)? The rules of docs/scenes.md ("Prompt-following check"), ported from
// tools/scene_check.py and tested against its verdicts.
struct ObjectCheck {
  SceneObject named;  // shape, color, size, cell as the caption names them
  bool passed = false;
  int shape_found = -1;    // best-matching SceneShape index; -1: no region of the color in the cell
  double shape_iou = 0.0;  // soft IoU of that shape's template
};
// Throws InputError when the caption is not of the grammar or the image is not square RGB.
std::vector<ObjectCheck> check_scene_image(const Rgb8& image, std::string_view caption);

}  // namespace qeval::datasets
