// Synthetic captioned scenes: draws, captions, exact integer rasterisation, caption parsing.
// tools/scenes.py is a line-for-line port; keep the two in step (docs/scenes.md).
#include "datasets/scenes.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "kernels/error.h"

namespace qeval::datasets {
namespace {

constexpr std::string_view kShapeNames[kSceneShapeCount] = {"circle", "square", "triangle", "ring", "cross", "diamond"};
constexpr std::string_view kColorNames[kSceneColorCount] = {"red",  "orange", "yellow", "green",
                                                            "blue", "purple", "white",  "black"};
constexpr std::string_view kSizeNames[kSceneSizeCount] = {"small", "medium", "large"};
constexpr std::string_view kStyleNames[kBackgroundStyleCount] = {"plain", "gradient", "striped"};
constexpr std::string_view kPositions[kSceneCellCount] = {"at the top left",    "at the top",    "at the top right",
                                                          "on the left",        "in the center", "on the right",
                                                          "at the bottom left", "at the bottom", "at the bottom right"};
constexpr Rgb kObjectRgb[kSceneColorCount] = {{220, 40, 40}, {245, 140, 20}, {240, 220, 30},  {40, 170, 60},
                                              {40, 90, 220}, {150, 60, 200}, {245, 245, 245}, {25, 25, 25}};
constexpr int kSizePercent[kSceneSizeCount] = {7, 10, 13};
constexpr int kJitterPercent = 3;

std::string_view article(std::string_view word) {
  return std::string_view("aeiou").find(word.front()) != std::string_view::npos ? "an" : "a";
}

std::string object_phrase(const SceneObject& o) {
  std::string first =
      o.size == SceneSize::kMedium ? std::string(scene_color_name(o.color)) : std::string(scene_size_name(o.size));
  std::string s(article(first));
  if (o.size != SceneSize::kMedium) {
    s += ' ';
    s += scene_size_name(o.size);
  }
  s += " ";
  s += scene_color_name(o.color);
  s += " ";
  s += scene_shape_name(o.shape);
  s += " ";
  s += scene_position_phrase(o.cell);
  return s;
}

// Whether the sample at offset (dx, dy) from an object's centre, in sub-pixel units, is inside it.
bool inside(SceneShape shape, std::int64_t dx, std::int64_t dy, std::int64_t r) {
  const std::int64_t ax = std::llabs(dx), ay = std::llabs(dy);
  switch (shape) {
    case SceneShape::kCircle: return dx * dx + dy * dy <= r * r;
    case SceneShape::kSquare: return ax <= r && ay <= r;
    case SceneShape::kTriangle: return dy <= r && 2 * ax <= dy + r;  // apex up
    case SceneShape::kRing: {
      const std::int64_t ri = 3 * r / 5, d2 = dx * dx + dy * dy;
      return d2 <= r * r && d2 >= ri * ri;
    }
    case SceneShape::kCross: {
      const std::int64_t w = r / 3;
      return (ax <= w && ay <= r) || (ay <= w && ax <= r);
    }
    case SceneShape::kDiamond: return ax + ay <= r;
  }
  return false;
}

std::string normalise(std::string_view text) {
  std::string out;
  bool space = false;
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  return out;
}

std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> parts;
  for (std::size_t pos = 0;;) {
    const std::size_t next = s.find(sep, pos);
    parts.push_back(s.substr(pos, next == std::string_view::npos ? std::string_view::npos : next - pos));
    if (next == std::string_view::npos) return parts;
    pos = next + sep.size();
  }
}

template <std::size_t N>
int index_of(const std::string_view (&names)[N], std::string_view word) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == word) return static_cast<int>(i);
  return -1;
}

}  // namespace

std::string_view scene_shape_name(SceneShape s) { return kShapeNames[static_cast<int>(s)]; }
std::string_view scene_color_name(SceneColor c) { return kColorNames[static_cast<int>(c)]; }
std::string_view scene_size_name(SceneSize s) { return kSizeNames[static_cast<int>(s)]; }
std::string_view background_style_name(BackgroundStyle s) { return kStyleNames[static_cast<int>(s)]; }
std::string_view scene_position_phrase(int cell) { return kPositions[cell]; }
Rgb scene_object_rgb(SceneColor c) { return kObjectRgb[static_cast<int>(c)]; }

std::array<Rgb, 2> scene_background_tones(SceneColor c) {
  const Rgb& o = kObjectRgb[static_cast<int>(c)];
  Rgb t0{}, t1{};
  for (int k = 0; k < 3; ++k) {
    t0[k] = static_cast<std::uint8_t>((2 * o[k] + 3 * 150) / 5);
    t1[k] = static_cast<std::uint8_t>((3 * t0[k]) / 4);
  }
  return {t0, t1};
}

std::string scene_caption(const std::vector<SceneObject>& objects, BackgroundStyle style, SceneColor background) {
  std::string s;
  for (std::size_t i = 0; i < objects.size(); ++i) {
    if (i > 0) s += i + 1 == objects.size() ? " and " : ", ";
    s += object_phrase(objects[i]);
  }
  s += " on a ";
  s += background_style_name(style);
  s += " ";
  s += scene_color_name(background);
  s += " background";
  return s;
}

SceneDescription describe_scene(std::uint64_t seed, std::uint64_t index, const SceneOptions& options) {
  const int size = options.size;
  if (size < 16 || size > 1024)  // 1024: scene_object_points' integer distances stay in int64
    throw InputError("scene size must be in [16, 1024], got " + std::to_string(size));
  if (!(1 <= options.min_objects && options.min_objects <= options.max_objects && options.max_objects <= 3))
    throw InputError("scene object counts need 1 <= min_objects <= max_objects <= 3, got " +
                     std::to_string(options.min_objects) + ".." + std::to_string(options.max_objects));
  SplitMix64 rng(SplitMix64::mix(SplitMix64::mix(seed) ^ index));
  SceneDescription d;
  d.seed = seed;
  d.index = index;
  d.size = size;
  const int n =
      options.min_objects +
      static_cast<int>(rng.uniform(static_cast<std::uint32_t>(options.max_objects - options.min_objects + 1)));
  d.style = static_cast<BackgroundStyle>(rng.uniform(kBackgroundStyleCount));
  d.background = static_cast<SceneColor>(rng.uniform(kSceneColorCount));
  std::array<int, kSceneCellCount> cells;
  std::iota(cells.begin(), cells.end(), 0);
  for (int i = 0; i < n; ++i) {
    const int j = i + static_cast<int>(rng.uniform(static_cast<std::uint32_t>(kSceneCellCount - i)));
    std::swap(cells[i], cells[j]);
  }
  const int jitter = size * kSceneSubpixel * kJitterPercent / 100;
  for (int i = 0; i < n; ++i) {
    SceneObject o;
    o.shape = static_cast<SceneShape>(rng.uniform(kSceneShapeCount));
    o.color = static_cast<SceneColor>(rng.uniform(kSceneColorCount));
    while (o.color == d.background) o.color = static_cast<SceneColor>(rng.uniform(kSceneColorCount));
    o.size = static_cast<SceneSize>(rng.uniform(kSceneSizeCount));
    const int dx = static_cast<int>(rng.uniform(static_cast<std::uint32_t>(2 * jitter + 1))) - jitter;
    const int dy = static_cast<int>(rng.uniform(static_cast<std::uint32_t>(2 * jitter + 1))) - jitter;
    o.cell = cells[i];
    const int row = o.cell / 3, col = o.cell % 3;
    o.center_x = (2 * col + 1) * size * kSceneSubpixel / 6 + dx;
    o.center_y = (2 * row + 1) * size * kSceneSubpixel / 6 + dy;
    o.radius = size * kSceneSubpixel * kSizePercent[static_cast<int>(o.size)] / 100;
    d.objects.push_back(o);
  }
  d.caption = scene_caption(d.objects, d.style, d.background);
  return d;
}

Scene render_scene(const SceneDescription& d) {
  const int size = d.size;
  const auto tones = scene_background_tones(d.background);
  const int stripe = std::max(2, size / 10);
  const std::size_t n_obj = d.objects.size();
  Scene scene;
  scene.description = d;
  scene.image = Rgb8{size, size, 3, std::vector<std::uint8_t>(std::size_t(size) * size * 3)};
  scene.masks.assign(n_obj, std::vector<std::uint8_t>(std::size_t(size) * size, 0));
  std::vector<int> counts(n_obj);
  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      std::array<int, 3> bg{};
      for (int k = 0; k < 3; ++k) {
        const int t0 = tones[0][k], t1 = tones[1][k];
        switch (d.style) {
          case BackgroundStyle::kPlain: bg[k] = t0; break;
          case BackgroundStyle::kGradient: bg[k] = (t0 * (size - 1 - y) + t1 * y + (size - 1) / 2) / (size - 1); break;
          case BackgroundStyle::kStriped: bg[k] = ((x + y) / stripe) % 2 == 0 ? t0 : t1; break;
        }
      }
      std::fill(counts.begin(), counts.end(), 0);
      int n_bg = 0;
      for (int sy = 0; sy < 4; ++sy) {
        for (int sx = 0; sx < 4; ++sx) {
          const std::int64_t px = kSceneSubpixel * x + 2 * sx + 1, py = kSceneSubpixel * y + 2 * sy + 1;
          int top = -1;
          for (std::size_t i = 0; i < n_obj; ++i) {
            const SceneObject& o = d.objects[i];
            if (inside(o.shape, px - o.center_x, py - o.center_y, o.radius)) top = static_cast<int>(i);
          }
          if (top < 0) ++n_bg;
          else ++counts[top];
        }
      }
      const std::size_t p = std::size_t(y) * size + x;
      for (int k = 0; k < 3; ++k) {
        int acc = bg[k] * n_bg;
        for (std::size_t i = 0; i < n_obj; ++i) acc += scene_object_rgb(d.objects[i].color)[k] * counts[i];
        scene.image.pixels[3 * p + k] =
            static_cast<std::uint8_t>((acc + kSceneSamplesPerPixel / 2) / kSceneSamplesPerPixel);
      }
      for (std::size_t i = 0; i < n_obj; ++i)
        if (2 * counts[i] >= kSceneSamplesPerPixel) scene.masks[i][p] = 255;
    }
  }
  return scene;
}

std::vector<std::array<int, 2>> scene_object_points(const Scene& scene) {
  const std::int64_t size = scene.description.size;
  std::vector<std::array<int, 2>> points;
  for (const auto& mask : scene.masks) {
    std::int64_t n = 0, sum_x = 0, sum_y = 0;
    for (std::int64_t p = 0; p < size * size; ++p)
      if (mask[p]) {
        ++n;
        sum_x += p % size;
        sum_y += p / size;
      }
    std::array<int, 2> best{-1, -1};
    std::int64_t best_d = -1;
    for (std::int64_t p = 0; p < size * size && n > 0; ++p) {
      if (!mask[p]) continue;
      const std::int64_t dx = n * (p % size) - sum_x, dy = n * (p / size) - sum_y;
      const std::int64_t d = dx * dx + dy * dy;  // n^2 times the squared distance to the centroid
      if (best_d < 0 || d < best_d) {
        best_d = d;
        best = {static_cast<int>(p % size), static_cast<int>(p / size)};
      }
    }
    points.push_back(best);
  }
  return points;
}

ParsedCaption parse_scene_caption(std::string_view caption) {
  const std::string text = normalise(caption);
  const auto fail = [&](const std::string& why) {
    return InputError("not a scene caption (" + why + "): \"" + text + "\"");
  };
  constexpr std::string_view kOn = " on a ", kTail = " background";
  const std::size_t on = text.rfind(kOn);
  if (on == std::string::npos || !text.ends_with(kTail)) throw fail("no 'on a ... background'");
  ParsedCaption out;
  const std::string_view view(text);
  const auto bg = split(view.substr(on + kOn.size(), text.size() - on - kOn.size() - kTail.size()), " ");
  const int style = bg.size() == 2 ? index_of(kStyleNames, bg[0]) : -1;
  const int bg_color = bg.size() == 2 ? index_of(kColorNames, bg[1]) : -1;
  if (style < 0 || bg_color < 0) throw fail("bad background phrase");
  out.style = static_cast<BackgroundStyle>(style);
  out.background = static_cast<SceneColor>(bg_color);

  const auto parts = split(view.substr(0, on), " and ");
  if (parts.size() > 2) throw fail("too many 'and'");
  std::vector<std::string_view> phrases = split(parts[0], ", ");
  if (parts.size() == 2) phrases.push_back(parts[1]);
  for (std::string_view p : phrases) {
    int cell = -1;
    for (int c = 0; c < kSceneCellCount; ++c) {  // longest matching position phrase wins
      std::string suffix(1, ' ');
      suffix += kPositions[c];
      if (p.ends_with(suffix) && (cell < 0 || kPositions[c].size() > kPositions[cell].size())) cell = c;
    }
    if (cell < 0) throw fail("no position in \"" + std::string(p) + "\"");
    const auto words = split(p.substr(0, p.size() - kPositions[cell].size() - 1), " ");
    if ((words.size() != 3 && words.size() != 4) || words[0] != article(words[1]))
      throw fail("bad object phrase \"" + std::string(p) + "\"");
    SceneObject o;
    o.cell = cell;
    if (words.size() == 4) {
      const int size = index_of(kSizeNames, words[1]);
      if (size < 0 || size == static_cast<int>(SceneSize::kMedium))
        throw fail("bad size in \"" + std::string(p) + "\"");
      o.size = static_cast<SceneSize>(size);
    }
    const int color = index_of(kColorNames, words[words.size() - 2]);
    const int shape = index_of(kShapeNames, words.back());
    if (color < 0 || shape < 0) throw fail("unknown color or shape in \"" + std::string(p) + "\"");
    o.color = static_cast<SceneColor>(color);
    o.shape = static_cast<SceneShape>(shape);
    out.objects.push_back(o);
  }
  return out;
}

// ---- Prompt-following check (tools/scene_check.py) ----

namespace {

constexpr double kMaxColorDistance = 90.0;
constexpr std::size_t kMinArea = 10;
constexpr double kMinIou = 0.5;

// Per pixel: object color 0..7 when the nearest palette entry (8 object colors, then 16 background
// tones) is that color within kMaxColorDistance, else -1. Ties go to the earlier entry (numpy argmin).
std::vector<int> color_labels(const Rgb8& img) {
  std::vector<std::array<double, 3>> palette;
  for (int c = 0; c < kSceneColorCount; ++c) {
    const Rgb o = scene_object_rgb(static_cast<SceneColor>(c));
    palette.push_back({double(o[0]), double(o[1]), double(o[2])});
  }
  for (int c = 0; c < kSceneColorCount; ++c)
    for (const Rgb& t : scene_background_tones(static_cast<SceneColor>(c)))
      palette.push_back({double(t[0]), double(t[1]), double(t[2])});
  const std::size_t n = std::size_t(img.width) * img.height;
  std::vector<int> labels(n, -1);
  for (std::size_t p = 0; p < n; ++p) {
    double best = 0;
    int best_i = -1;
    for (std::size_t i = 0; i < palette.size(); ++i) {
      double d2 = 0;
      for (int k = 0; k < 3; ++k) {
        const double d = img.pixels[3 * p + k] - palette[i][k];
        d2 += d * d;
      }
      const double d = std::sqrt(d2);
      if (best_i < 0 || d < best) {
        best = d;
        best_i = static_cast<int>(i);
      }
    }
    if (best_i < kSceneColorCount && best <= kMaxColorDistance) labels[p] = best_i;
  }
  return labels;
}

// 8-connected components of labels == color, in row-major order of their first pixel.
std::vector<std::vector<int>> components(const std::vector<int>& labels, int size, int color) {
  std::vector<char> seen(labels.size(), 0);
  std::vector<std::vector<int>> out;
  for (int p0 = 0; p0 < static_cast<int>(labels.size()); ++p0) {
    if (labels[p0] != color || seen[p0]) continue;
    std::vector<int> comp, stack{p0};
    seen[p0] = 1;
    while (!stack.empty()) {
      const int p = stack.back();
      stack.pop_back();
      comp.push_back(p);
      const int y = p / size, x = p % size;
      for (int dy = -1; dy <= 1; ++dy)
        for (int dx = -1; dx <= 1; ++dx) {
          const int yy = y + dy, xx = x + dx;
          if ((dx || dy) && yy >= 0 && yy < size && xx >= 0 && xx < size) {
            const int q = yy * size + xx;
            if (labels[q] == color && !seen[q]) {
              seen[q] = 1;
              stack.push_back(q);
            }
          }
        }
    }
    out.push_back(std::move(comp));
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

ObjectCheck check_object(const Rgb8& img, const std::vector<int>& labels, const SceneObject& named) {
  const int size = img.width;
  ObjectCheck result;
  result.named = named;
  const std::vector<int>* found = nullptr;
  const auto comps = components(labels, size, static_cast<int>(named.color));
  for (const auto& comp : comps) {
    if (comp.size() < kMinArea) continue;
    double sy = 0, sx = 0;
    for (int p : comp) {
      sy += p / size;
      sx += p % size;
    }
    const double my = sy / comp.size(), mx = sx / comp.size();
    const int cell = 3 * std::min(2, static_cast<int>(std::floor(my * 3 / size))) +
                     std::min(2, static_cast<int>(std::floor(mx * 3 / size)));
    if (cell == named.cell && (!found || comp.size() > found->size())) found = &comp;
  }
  if (!found) return result;
  std::vector<char> mask(labels.size(), 0);
  int x0 = size, x1 = 0, y0 = size, y1 = 0;  // bounding box [x0, x1) x [y0, y1)
  for (int p : *found) {
    mask[p] = 1;
    x0 = std::min(x0, p % size);
    x1 = std::max(x1, p % size + 1);
    y0 = std::min(y0, p / size);
    y1 = std::max(y1, p / size + 1);
  }
  // Local background: per-channel median of a frame 2 pixels outside the bounding box.
  const int fy0 = std::max(0, y0 - 2), fy1 = std::min(size, y1 + 2), fx0 = std::max(0, x0 - 2),
            fx1 = std::min(size, x1 + 2);
  std::array<std::vector<double>, 3> border;
  for (int y = fy0; y < fy1; ++y)
    for (int x = fx0; x < fx1; ++x) {
      const bool inner = y >= fy0 + 1 && y < fy1 - 1 && x >= fx0 + 1 && x < fx1 - 1;
      if (!inner)
        for (int k = 0; k < 3; ++k) border[k].push_back(img.pixels[3 * (std::size_t(y) * size + x) + k]);
    }
  std::array<double, 3> bg{};
  const Rgb fallback = scene_background_tones(SceneColor::kRed)[0];  // the palette's first tone
  for (int k = 0; k < 3; ++k) bg[k] = border[k].empty() ? fallback[k] : median(border[k]);
  const Rgb c = scene_object_rgb(named.color);
  std::array<double, 3> d{};
  double dd = 0;
  for (int k = 0; k < 3; ++k) {
    d[k] = c[k] - bg[k];
    dd += d[k] * d[k];
  }
  // Soft coverage in the window (box grown by 2), zero on pixels of other object colors.
  const int wx0 = fx0, wy0 = fy0, ww = fx1 - fx0, wh = fy1 - fy0;
  std::vector<double> window(std::size_t(ww) * wh, 0.0);
  for (int y = 0; y < wh; ++y)
    for (int x = 0; x < ww; ++x) {
      const std::size_t p = std::size_t(wy0 + y) * size + (wx0 + x);
      if (labels[p] != -1 && !mask[p]) continue;
      double a = 0;
      for (int k = 0; k < 3; ++k) a += (img.pixels[3 * p + k] - bg[k]) * d[k];
      window[std::size_t(y) * ww + x] = std::clamp(a / std::max(1.0, dd), 0.0, 1.0);
    }
  const std::int64_t cx0 = std::int64_t(x0 + x1) * kSceneSubpixel / 2, cy0 = std::int64_t(y0 + y1) * kSceneSubpixel / 2;
  const double half = std::max(x1 - x0, y1 - y0) * kSceneSubpixel / 2.0;
  std::vector<double> cov(window.size());
  for (int shape = 0; shape < kSceneShapeCount; ++shape)
    for (double f : {0.85, 0.92, 1.0, 1.07, 1.15})
      for (int oy : {-4, 0, 4})
        for (int ox : {-4, 0, 4}) {
          const auto r = static_cast<std::int64_t>(std::nearbyint(half * f));  // ties to even, as Python's round
          double num = 0, den = 0;
          for (int y = 0; y < wh; ++y)
            for (int x = 0; x < ww; ++x) {
              int n = 0;
              for (int sy = 0; sy < 4; ++sy)
                for (int sx = 0; sx < 4; ++sx) {
                  const std::int64_t px = kSceneSubpixel * (wx0 + x) + 2 * sx + 1;
                  const std::int64_t py = kSceneSubpixel * (wy0 + y) + 2 * sy + 1;
                  n += inside(static_cast<SceneShape>(shape), px - (cx0 + ox), py - (cy0 + oy), r);
                }
              const double t = n / 16.0, w = window[std::size_t(y) * ww + x];
              num += std::min(t, w);
              den += std::max(t, w);
            }
          const double iou = num / std::max(1e-9, den);
          if (iou > result.shape_iou) {
            result.shape_iou = iou;
            result.shape_found = shape;
          }
        }
  result.passed = result.shape_found == static_cast<int>(named.shape) && result.shape_iou >= kMinIou;
  return result;
}

}  // namespace

std::vector<ObjectCheck> check_scene_image(const Rgb8& image, std::string_view caption) {
  if (image.channels != 3 || image.width != image.height || image.width <= 0 ||
      image.pixels.size() != std::size_t(image.width) * image.height * 3)
    throw InputError("prompt-following check needs a square RGB image, got " + std::to_string(image.width) + "x" +
                     std::to_string(image.height) + "x" + std::to_string(image.channels));
  const ParsedCaption parsed = parse_scene_caption(caption);
  const std::vector<int> labels = color_labels(image);
  std::vector<ObjectCheck> out;
  for (const SceneObject& o : parsed.objects) out.push_back(check_object(image, labels, o));
  return out;
}

}  // namespace qeval::datasets
