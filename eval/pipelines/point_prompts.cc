// Point-prompt sets (JSON Lines): reader and loader of each prompt's image and reference mask.
#include "eval/pipelines/point_prompts.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <sstream>

#include "base/file_names.h"
#include "base/input_file.h"
#include "base/json_config.h"
#include "datasets/mask_io.h"
#include "datasets/scenes.h"
#include "kernels/error.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

base::JsonConfig at(const base::JsonConfig& c, const std::string& key) {
  return base::JsonConfig(c.value().at(key), c.source(), c.path().empty() ? key : c.path() + "." + key, kSegmentDoc);
}

std::uint64_t get_uint64(const base::JsonConfig& c, const std::string& key) {
  if (!c.has(key)) c.fail("missing required key '" + key + "'");
  const auto& v = c.value().at(key);
  if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<long long>() < 0))
    at(c, key).fail("must be a non-negative integer");
  return v.get<std::uint64_t>();
}

fs::path resolve(const fs::path& source, const std::string& p) {
  fs::path path(p);
  return path.is_absolute() ? path : source.parent_path() / path;
}

SceneRef read_scene(const base::JsonConfig& s) {
  s.allow_keys({"seed", "index", "size"});
  SceneRef r;
  r.seed = get_uint64(s, "seed");
  r.index = get_uint64(s, "index");
  long long size = s.get_int("size", r.size);
  if (size < 16 || size > 1024)
    at(s, "size").fail("must be in [16, 1024] (datasets/scenes.h), got " + std::to_string(size));
  r.size = static_cast<int>(size);
  return r;
}

std::vector<SegmentationPoint> read_points(const base::JsonConfig& c) {
  if (!c.has("points")) c.fail("missing required key 'points'");
  base::JsonConfig pts = at(c, "points");
  if (!pts.value().is_array() || pts.value().empty())
    pts.fail("must be a non-empty array of points [x, y] or [x, y, label]");
  std::vector<SegmentationPoint> out;
  for (std::size_t i = 0; i < pts.value().size(); ++i) {
    base::JsonConfig p(pts.value()[i], pts.source(), pts.path() + "[" + std::to_string(i) + "]", kSegmentDoc);
    const auto& v = p.value();
    if (!v.is_array() || v.size() < 2 || v.size() > 3) p.fail("a point is [x, y] or [x, y, label], got " + v.dump());
    for (std::size_t k = 0; k < 2; ++k)
      if (!v[k].is_number() || !std::isfinite(v[k].get<double>()) || v[k].get<double>() < 0)
        p.fail(std::string(k == 0 ? "x" : "y") + " must be a non-negative number (pixels), got " + v[k].dump());
    SegmentationPoint sp{v[0].get<double>(), v[1].get<double>(), 1};
    if (v.size() == 3) {
      if (!v[2].is_number_integer() || (v[2].get<long long>() != 0 && v[2].get<long long>() != 1))
        p.fail("label must be 1 (foreground) or 0 (background), got " + v[2].dump());
      sp.label = static_cast<int>(v[2].get<long long>());
    }
    out.push_back(sp);
  }
  return out;
}

}  // namespace

std::string PointPrompt::image_key() const {
  if (scene)
    return "scene:" + std::to_string(scene->seed) + ":" + std::to_string(scene->index) + ":" +
           std::to_string(scene->size);
  return "image:" + image.lexically_normal().string();
}

std::string PointPrompt::where(const fs::path& source) const {
  return source.string() + ":" + std::to_string(line) + " (id " + id + ")";
}

PointPromptSet parse_point_prompts(const std::string& text, const fs::path& source) {
  PointPromptSet set;
  set.source = source;
  std::map<std::string, int> ids;
  std::map<std::string, std::pair<std::string, int>> folders;  // file_name_key(id) -> id, line
  std::istringstream in(text);
  std::string line_text;
  for (int line = 1; std::getline(in, line_text); ++line) {
    if (!line_text.empty() && line_text.back() == '\r') line_text.pop_back();
    if (line_text.find_first_not_of(" \t") == std::string::npos) continue;
    base::JsonConfig c = base::JsonConfig::parse(line_text, source.string() + ":" + std::to_string(line), kSegmentDoc);
    c.allow_keys({"id", "image", "scene", "points", "mask"});
    PointPrompt p;
    p.line = line;
    p.id = c.get_string("id", "line " + std::to_string(line));
    if (p.id.empty()) at(c, "id").fail("must not be empty");
    if (auto [it, inserted] = ids.emplace(p.id, line); !inserted)
      at(c, "id").fail("'" + p.id + "' was already used on line " + std::to_string(it->second));
    // qeval run writes each prompt's images under images/<file_name_for(id)>/.
    if (auto [it, fresh] = folders.emplace(base::file_name_key(p.id), std::pair{p.id, line}); !fresh)
      at(c, "id").fail(
          fmt::format("'{}' and '{}' (line {}) both give the image folder name '{}' (characters "
                      "outside [A-Za-z0-9_.-] become '_', case is ignored): rename one",
                      p.id, it->second.first, it->second.second, base::file_name_for(p.id)));
    if (c.has("image") == c.has("scene"))
      c.fail("give exactly one of 'image' (a file) or 'scene' ({\"seed\", \"index\"[, \"size\"]})");
    if (c.has("image")) {
      std::string img = c.get_string("image");
      if (img.empty()) at(c, "image").fail("must not be empty");
      p.image = resolve(source, img);
    } else {
      p.scene = read_scene(c.object("scene"));
    }
    p.points = read_points(c);
    if (c.has("mask")) {
      const auto& m = c.value().at("mask");
      if (m.is_string()) {
        if (m.get<std::string>().empty()) at(c, "mask").fail("must not be empty");
        p.mask = resolve(source, m.get<std::string>());
      } else if (m.is_object()) {
        base::JsonConfig mo = c.object("mask");
        mo.allow_keys({"object"});
        if (!p.scene)
          mo.fail("{\"object\": k} names an object of a scene; this prompt has an image file (give the mask's file)");
        long long k = mo.get_int("object");
        if (k < 0 || k > 2)
          at(mo, "object").fail("must be 0, 1 or 2 (a scene has one to three objects), got " + std::to_string(k));
        p.scene_object = static_cast<int>(k);
      } else {
        at(c, "mask").fail("must be a mask file or {\"object\": k} for a scene");
      }
    }
    set.prompts.push_back(std::move(p));
  }
  if (set.prompts.empty())
    throw InputError(source.string() + ": no prompts (one JSON object a line; see " + kSegmentDoc + ")");
  return set;
}

PointPromptSet read_point_prompts(const fs::path& path) {
  return parse_point_prompts(base::read_regular_file_text(path), path);
}

PromptInputs load_prompt_inputs(const PointPrompt& p, const fs::path& source, int channels) {
  const std::string where = p.where(source);
  PromptInputs out;
  if (p.scene) {
    datasets::SceneOptions options;
    options.size = p.scene->size;
    datasets::Scene s = datasets::generate_scene(p.scene->seed, p.scene->index, options);
    out.planes = image_planes(s.image, channels, where);
    if (p.scene_object >= 0) {
      if (p.scene_object >= static_cast<int>(s.masks.size()))
        throw InputError(where + ": mask object " + std::to_string(p.scene_object) + " but scene " +
                         std::to_string(p.scene->index) + " of seed " + std::to_string(p.scene->seed) + " has " +
                         std::to_string(s.masks.size()) + " object(s)");
      Tensor m(DType::kUInt8, {s.image.height, s.image.width});
      const auto& src = s.masks[std::size_t(p.scene_object)];
      for (std::size_t i = 0; i < src.size(); ++i) m.data<std::uint8_t>()[i] = src[i] ? 1 : 0;
      out.mask = std::move(m);
    }
  } else {
    try {
      out.planes = image_planes(datasets::load_image(p.image), channels, p.image.string());
    } catch (const InputError& e) {
      throw InputError(where + ": " + e.what());
    }
    if (!p.mask.empty()) {
      try {
        out.mask = datasets::load_mask(p.mask);
      } catch (const InputError& e) {
        throw InputError(where + ": " + e.what());
      }
    }
  }
  const std::int64_t h = out.planes.dim(1), w = out.planes.dim(2);
  if (out.mask && (out.mask->dim(0) != h || out.mask->dim(1) != w))
    throw InputError(where + ": the reference mask is " + std::to_string(out.mask->dim(1)) + "x" +
                     std::to_string(out.mask->dim(0)) + " but the image is " + std::to_string(w) + "x" +
                     std::to_string(h));
  for (std::size_t i = 0; i < p.points.size(); ++i) {
    const auto& pt = p.points[i];
    if (!(pt.x < double(w) && pt.y < double(h)))
      throw InputError(where + fmt::format(": point {} ({}, {}) lies outside the ", i + 1, pt.x, pt.y) +
                       std::to_string(w) + "x" + std::to_string(h) + " image");
  }
  return out;
}

}  // namespace qeval::eval
