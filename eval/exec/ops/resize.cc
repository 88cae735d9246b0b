// Resize (nearest, linear, cubic; every coordinate transformation mode) and the deprecated Upsample.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "eval/exec/ops/families.h"
#include "eval/exec/ops/resize_plan.h"
#include "kernels/resize.h"

namespace qeval::eval {

namespace {

using kernels::NearestRounding;
using kernels::ResizeCoordinates;
using kernels::ResizeMode;

enum class Form {
  kUpsample7,  // Upsample-7: scales attribute
  kUpsample9,  // Upsample-9 and Resize-10: (X, scales); asymmetric coordinates, "simple" nearest
  kResize,     // Resize-11+: (X, roi, scales, sizes)
};

std::vector<double> float_values(const Tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  if (t.dtype() == DType::kFloat32) std::copy_n(t.data<float>(), t.numel(), v.begin());
  else if (t.dtype() == DType::kFloat64) std::copy_n(t.data<double>(), t.numel(), v.begin());
  else throw InputError("expected a float tensor, got " + std::string(dtype_name(t.dtype())));
  return v;
}

std::string doubles_to_string(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v[i]);
    s += (i ? ", " : "") + std::string(buf);
  }
  return s + "]";
}

// One element of storage type `t` holding `v`, for the extrapolation fill of a gather.
std::array<std::byte, 8> element_bytes(DType t, double v) {
  std::array<std::byte, 8> b{};
  auto put = [&](auto x) { std::memcpy(b.data(), &x, sizeof x); };
  switch (t) {
    case DType::kFloat32: put(static_cast<float>(v)); break;
    case DType::kFloat64: put(v); break;
    case DType::kInt8: put(static_cast<std::int8_t>(v)); break;
    case DType::kUInt8: put(static_cast<std::uint8_t>(v)); break;
    case DType::kInt16: put(static_cast<std::int16_t>(v)); break;
    case DType::kUInt16: put(static_cast<std::uint16_t>(v)); break;
    case DType::kInt32: put(static_cast<std::int32_t>(v)); break;
    case DType::kUInt32: put(static_cast<std::uint32_t>(v)); break;
    case DType::kInt64: put(static_cast<std::int64_t>(v)); break;
    case DType::kUInt64: put(static_cast<std::uint64_t>(v)); break;
    case DType::kBool: put(static_cast<bool>(v != 0)); break;
    default: break;
  }
  return b;
}

class ResizeOp final : public Op {
 public:
  ResizeOp(const Node& node, Form form) : node_(node), form_(form) {
    const std::string mode = node.get_string("mode", "nearest");
    if (mode == "nearest") options_.mode = ResizeMode::kNearest;
    else if (mode == "linear") options_.mode = ResizeMode::kLinear;
    else if (mode == "cubic" && form == Form::kResize) options_.mode = ResizeMode::kCubic;
    else
      fail(node, "mode must be " +
                     std::string(form == Form::kResize ? "nearest, linear or cubic" : "nearest or linear") + ", got '" +
                     mode + "'");
    if (form != Form::kResize) {
      // What these opsets specify (and ONNX Runtime does): x / scale, and for nearest the floor
      // when enlarging, the ceiling when shrinking.
      options_.coordinates = ResizeCoordinates::kAsymmetric;
      options_.nearest = NearestRounding::kSimple;
      if (form == Form::kUpsample7) {
        if (!node.has("scales")) fail(node, "missing required attribute scales");
        for (float s : node.get_floats("scales")) attr_scales_.push_back(s);
      }
      return;
    }
    const std::string coord = node.get_string("coordinate_transformation_mode", "half_pixel");
    if (coord == "half_pixel") options_.coordinates = ResizeCoordinates::kHalfPixel;
    else if (coord == "half_pixel_symmetric" && node.opset >= 19)
      options_.coordinates = ResizeCoordinates::kHalfPixelSymmetric;
    else if (coord == "pytorch_half_pixel") options_.coordinates = ResizeCoordinates::kPytorchHalfPixel;
    else if (coord == "align_corners") options_.coordinates = ResizeCoordinates::kAlignCorners;
    else if (coord == "asymmetric") options_.coordinates = ResizeCoordinates::kAsymmetric;
    else if (coord == "tf_half_pixel_for_nn" && node.opset < 13)
      options_.coordinates = ResizeCoordinates::kTfHalfPixelForNn;
    else if (coord == "tf_crop_and_resize") options_.coordinates = ResizeCoordinates::kTfCropAndResize;
    else
      fail(node,
           "coordinate_transformation_mode '" + coord + "' is not defined at opset " + std::to_string(node.opset));
    const std::string nearest = node.get_string("nearest_mode", "round_prefer_floor");
    if (nearest == "round_prefer_floor") options_.nearest = NearestRounding::kRoundPreferFloor;
    else if (nearest == "round_prefer_ceil") options_.nearest = NearestRounding::kRoundPreferCeil;
    else if (nearest == "floor") options_.nearest = NearestRounding::kFloor;
    else if (nearest == "ceil") options_.nearest = NearestRounding::kCeil;
    else fail(node, "nearest_mode must be round_prefer_floor, round_prefer_ceil, floor or ceil, got '" + nearest + "'");
    options_.cubic_a = node.get_float("cubic_coeff_a", -0.75f);
    options_.exclude_outside = node.get_int("exclude_outside", 0) != 0;
    options_.extrapolation_value = node.get_float("extrapolation_value", 0.0f);
    if (node.opset >= 18) {
      options_.antialias = node.get_int("antialias", 0) != 0;
      axes_ = node.get_ints("axes");
      policy_ = node.get_string("keep_aspect_ratio_policy", "stretch");
      if (policy_ != "stretch" && policy_ != "not_larger" && policy_ != "not_smaller")
        fail(node, "keep_aspect_ratio_policy must be stretch, not_larger or not_smaller, got '" + policy_ + "'");
    }
  }

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input X");
    const DType t = in[0]->dtype;
    if (options_.mode != ResizeMode::kNearest && t != DType::kFloat32 && t != DType::kFloat64)
      throw UnsupportedError(node_.describe() + ": " + (options_.mode == ResizeMode::kLinear ? "linear" : "cubic") +
                             " interpolation of " + std::string(dtype_name(in[0]->declared)) + " input '" +
                             node_.inputs[0] + "' is not supported (float types are)");
    if (options_.mode == ResizeMode::kNearest && dtype_size(t) > 8)
      fail(node_, "unsupported type " + std::string(dtype_name(in[0]->declared)));
    auto constant = [&](std::size_t i, const char* what) -> const Tensor* {
      if (i >= in.size() || !in[i]) return nullptr;
      return &constant_input(node_, in, i, what);
    };
    const Tensor* roi = nullptr;
    const Tensor* scales = nullptr;
    const Tensor* sizes = nullptr;
    if (form_ == Form::kUpsample9) {
      scales = constant(1, "scales");
      if (!scales) fail(node_, "missing input scales");
    } else if (form_ == Form::kResize) {
      if (options_.coordinates == ResizeCoordinates::kTfCropAndResize) roi = constant(1, "roi");
      scales = constant(2, "scales");
      sizes = constant(3, "sizes");
    }
    return {meta_like(*in[0], plan(in[0]->shape, roi, scales, sizes).out)};
  }

  // Output sizes depend on these values, so they are needed at plan time even when a model (or
  // an ONNX node test) feeds them as float graph inputs.
  std::vector<std::size_t> constant_inputs() const override {
    switch (form_) {
      case Form::kUpsample7: return {};
      case Form::kUpsample9: return {1};
      case Form::kResize: break;
    }
    return {1, 2, 3};
  }

  // The geometry and options run() uses for inputs of these metas (resize_plan).
  ResizePlan device_plan(std::span<const ValueMeta* const> in) const {
    auto input = [&](std::size_t i) -> const Tensor* {
      return i < in.size() && in[i] && in[i]->value ? in[i]->value.get() : nullptr;
    };
    Geometry g;
    if (form_ == Form::kUpsample9) g = plan(in[0]->shape, nullptr, input(1), nullptr);
    else if (form_ == Form::kResize)
      g = plan(in[0]->shape, options_.coordinates == ResizeCoordinates::kTfCropAndResize ? input(1) : nullptr, input(2),
               input(3));
    else g = plan(in[0]->shape, nullptr, nullptr, nullptr);
    return {g.axes, options_};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    auto input = [&](std::size_t i) -> const Tensor* { return i < in.size() ? in[i] : nullptr; };
    Geometry g;
    if (form_ == Form::kUpsample9) g = plan(x.shape(), nullptr, input(1), nullptr);
    else if (form_ == Form::kResize)
      g = plan(x.shape(), options_.coordinates == ResizeCoordinates::kTfCropAndResize ? input(1) : nullptr, input(2),
               input(3));
    else g = plan(x.shape(), nullptr, nullptr, nullptr);
    // An empty output (an empty input axis resized to 0) has nothing to write; the kernels want
    // input sizes >= 1 (fuzz_onnx_loader: their invalid_argument ended the run with exit 3).
    if (out[0]->numel() == 0) return;
    if (options_.mode == ResizeMode::kNearest) {
      const auto fill = element_bytes(x.dtype(), options_.extrapolation_value);
      kernels::resize_nearest(x.raw(), out[0]->raw(), dtype_size(x.dtype()), g.axes, options_, fill.data());
    } else if (x.dtype() == DType::kFloat32) {
      kernels::resize(x.data<float>(), out[0]->data<float>(), g.axes, options_);
    } else {
      kernels::resize(x.data<double>(), out[0]->data<double>(), g.axes, options_);
    }
  }

 private:
  struct Geometry {
    std::vector<kernels::ResizeAxis> axes;
    Shape out;
  };

  // Output sizes and per-dimension scales from scales/sizes/roi (empty tensors count as absent).
  Geometry plan(const Shape& xs, const Tensor* roi, const Tensor* scales, const Tensor* sizes) const {
    const int rank = static_cast<int>(xs.size());
    if (scales && scales->numel() == 0) scales = nullptr;
    if (sizes && sizes->numel() == 0) sizes = nullptr;
    std::vector<int> axes;
    if (axes_.empty()) {
      for (int d = 0; d < rank; ++d) axes.push_back(d);
    } else {
      std::set<int> seen;
      for (auto a : axes_) {
        const int d = normalize_axis(node_, a, rank);
        if (!seen.insert(d).second) fail(node_, "axes repeat dimension " + std::to_string(d));
        axes.push_back(d);
      }
    }
    const std::size_t n = axes.size();
    std::vector<double> scale_values;
    if (form_ == Form::kUpsample7) {
      scale_values = attr_scales_;
    } else if (scales) {
      scale_values = float_values(*scales);
    }
    if (!scale_values.empty() && sizes) fail(node_, "both scales and sizes are given; exactly one may be");
    if (scale_values.empty() && !sizes) fail(node_, "neither scales nor sizes is given");

    // A scaled size as a dimension: a cast of NaN or of a value past int64 is undefined behaviour
    // (fuzz_onnx_loader: Upsample with a scale of 3e35), so such a size is an error of the node.
    const auto dim_of = [&](double v, std::int64_t axis) {
      if (!(v >= 0 && v < 9223372036854775808.0))
        fail(node_, "output dimension " + std::to_string(axis) + " of input '" + node_.inputs[0] + "' " +
                        shape_to_string(xs) + " would be " + std::to_string(v) + ", not a size");
      return static_cast<std::int64_t>(v);
    };
    Geometry g;
    g.axes.resize(std::size_t(rank));
    for (int d = 0; d < rank; ++d) {
      g.axes[std::size_t(d)].in = xs[std::size_t(d)];
      g.axes[std::size_t(d)].out = xs[std::size_t(d)];
    }
    if (!scale_values.empty()) {
      if (scale_values.size() != n)
        fail(node_, "scales " + doubles_to_string(scale_values) + " has " + std::to_string(scale_values.size()) +
                        " values; input '" + node_.inputs[0] + "' of shape " + shape_to_string(xs) + " needs " +
                        std::to_string(n));
      for (std::size_t i = 0; i < n; ++i) {
        auto& a = g.axes[std::size_t(axes[i])];
        if (!(scale_values[i] > 0) || !std::isfinite(scale_values[i]))
          fail(node_, "scales " + doubles_to_string(scale_values) + " must be positive");
        a.scale = scale_values[i];
        a.out = dim_of(scale_values[i] * static_cast<double>(a.in), axes[i]);
      }
    } else {
      const std::vector<std::int64_t> size_values = to_int64s(*sizes);
      if (size_values.size() != n)
        fail(node_, "sizes has " + std::to_string(size_values.size()) + " values; input '" + node_.inputs[0] +
                        "' of shape " + shape_to_string(xs) + " needs " + std::to_string(n));
      for (std::size_t i = 0; i < n; ++i) {
        const std::int64_t in = xs[std::size_t(axes[i])];
        if (size_values[i] < 0) fail(node_, "sizes must be >= 0, got " + std::to_string(size_values[i]));
        if (in == 0 && size_values[i] != 0)
          fail(node_, "cannot resize empty dimension " + std::to_string(axes[i]) + " of " + shape_to_string(xs));
      }
      if (policy_ == "stretch") {
        for (std::size_t i = 0; i < n; ++i) {
          auto& a = g.axes[std::size_t(axes[i])];
          a.out = size_values[i];
          a.scale = a.in == 0 ? 1.0 : static_cast<double>(a.out) / static_cast<double>(a.in);
        }
      } else {
        // One scale for every listed axis: the largest that fits (not_larger) or the smallest
        // that covers (not_smaller); sizes are then rounded half up.
        double s = policy_ == "not_larger" ? INFINITY : 0.0;
        for (std::size_t i = 0; i < n; ++i) {
          const double r = static_cast<double>(size_values[i]) / static_cast<double>(xs[std::size_t(axes[i])]);
          s = policy_ == "not_larger" ? std::min(s, r) : std::max(s, r);
        }
        for (std::size_t i = 0; i < n; ++i) {
          auto& a = g.axes[std::size_t(axes[i])];
          a.scale = s;
          a.out = dim_of(s * static_cast<double>(a.in) + 0.5, axes[i]);
        }
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const auto& a = g.axes[std::size_t(axes[i])];
      if (a.in == 0 && a.out != 0)
        fail(node_, "cannot resize empty dimension " + std::to_string(axes[i]) + " of " + shape_to_string(xs));
      if (!(a.scale > 0)) fail(node_, "resize scale for dimension " + std::to_string(axes[i]) + " is not positive");
    }
    if (options_.coordinates == ResizeCoordinates::kTfCropAndResize) {
      if (!roi || roi->numel() == 0) fail(node_, "tf_crop_and_resize needs the roi input");
      const std::vector<double> r = float_values(*roi);
      if (r.size() != 2 * n)
        fail(node_, "roi " + doubles_to_string(r) + " has " + std::to_string(r.size()) + " values, expected " +
                        std::to_string(2 * n) + " (starts then ends)");
      for (std::size_t i = 0; i < n; ++i) {
        g.axes[std::size_t(axes[i])].roi_start = r[i];
        g.axes[std::size_t(axes[i])].roi_end = r[n + i];
      }
    }
    for (const auto& a : g.axes) g.out.push_back(a.out);
    return g;
  }

  Node node_;
  Form form_;
  kernels::ResizeOptions options_;
  std::vector<double> attr_scales_;
  std::vector<std::int64_t> axes_;
  std::string policy_ = "stretch";
};

}  // namespace

std::optional<ResizePlan> resize_plan(const Op& op, std::span<const ValueMeta* const> inputs) {
  const auto* r = dynamic_cast<const ResizeOp*>(&op);
  if (!r || inputs.empty() || !inputs[0]) return std::nullopt;
  return r->device_plan(inputs);
}

void register_resize_ops(std::vector<OpSchema>& out) {
  auto make = [](Form form) {
    switch (form) {
      case Form::kUpsample7:
        return +[](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ResizeOp>(n, Form::kUpsample7); };
      case Form::kUpsample9:
        return +[](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ResizeOp>(n, Form::kUpsample9); };
      case Form::kResize: break;
    }
    return +[](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ResizeOp>(n, Form::kResize); };
  };
  // Upsample: 7 took scales as an attribute, 9 as an input; deprecated from 10 (Resize-10 is the
  // same operation under a new name).
  out.push_back({"Upsample", "", 7, 8, make(Form::kUpsample7)});
  out.push_back({"Upsample", "", 9, 9, make(Form::kUpsample9)});
  out.push_back({"Resize", "", 10, 10, make(Form::kUpsample9)});
  // 11: roi/scales/sizes, coordinate modes, cubic; 13: tf_half_pixel_for_nn removed, roi and
  // scales optional; 18: axes, antialias, keep_aspect_ratio_policy; 19: half_pixel_symmetric.
  out.push_back({"Resize", "", 11, 12, make(Form::kResize)});
  out.push_back({"Resize", "", 13, 17, make(Form::kResize)});
  out.push_back({"Resize", "", 18, 18, make(Form::kResize)});
  out.push_back({"Resize", "", 19, kMaxOpset, make(Form::kResize)});
}

}  // namespace qeval::eval
