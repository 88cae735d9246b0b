// LayerNormalization, InstanceNormalization, GroupNormalization, BatchNormalization.
#include <algorithm>
#include <cmath>

#include "eval/exec/ops/families.h"
#include "kernels/broadcast.h"
#include "kernels/norm.h"

namespace qeval::eval {

namespace {

bool is_float(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

std::string type_name(const ValueMeta& m) { return std::string(dtype_name(m.declared)); }

void require_float(const Node& node, std::span<const ValueMeta* const> in, std::size_t i, const char* what) {
  if (i >= in.size() || !in[i]) fail(node, std::string("missing input ") + what);
  if (!is_float(in[i]->dtype))
    fail(node, std::string(what) + " '" + node.inputs[i] + "' has unsupported type " + type_name(*in[i]));
}

// Values of a float/double tensor in double.
std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  if (t.dtype() == DType::kFloat32) std::copy_n(t.data<float>(), t.numel(), v.begin());
  else std::copy_n(t.data<double>(), t.numel(), v.begin());
  return v;
}

// `t` broadcast (numpy rules, right-aligned) to `shape`, materialised.
template <class T>
std::vector<T> expand_to(const Tensor& t, const Shape& shape) {
  const auto strides = kernels::broadcast_strides(t.shape(), shape);
  std::vector<T> out(static_cast<std::size_t>(shape_numel(shape)));
  const T* src = t.data<T>();
  const int rank = static_cast<int>(shape.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::int64_t rem = static_cast<std::int64_t>(i), off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (rem % shape[std::size_t(d)]) * strides[std::size_t(d)];
      rem /= shape[std::size_t(d)];
    }
    out[i] = src[off];
  }
  return out;
}

// True when `s` broadcasts into `target` without growing it (unidirectional broadcasting).
bool broadcasts_into(const Shape& s, const Shape& target) {
  if (s.size() > target.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const std::int64_t a = s[s.size() - 1 - i], b = target[target.size() - 1 - i];
    if (a != b && a != 1) return false;
  }
  return true;
}

DType stash_dtype(const Node& node, std::int64_t stash_type) {
  switch (stash_type) {
    case 1: return DType::kFloat32;
    case 10: return DType::kFloat16;
    case 11: return DType::kFloat64;
    case 16: return DType::kBFloat16;
    default: fail(node, "stash_type " + std::to_string(stash_type) + " is not a float type");
  }
}

// ---- LayerNormalization (17) ---------------------------------------------------------------

class LayerNormOp final : public Op {
 public:
  explicit LayerNormOp(const Node& node)
      : node_(node),
        axis_(node.get_int("axis", -1)),
        epsilon_(node.get_float("epsilon", 1e-5f)),
        stash_(stash_dtype(node, node.get_int("stash_type", 1))) {}

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    require_float(node_, in, 0, "X");
    require_float(node_, in, 1, "Scale");
    const Shape& xs = in[0]->shape;
    const int rank = static_cast<int>(xs.size());
    if (rank == 0) fail(node_, "X '" + node_.inputs[0] + "' is a scalar; LayerNormalization needs rank >= 1");
    const int axis = normalize_axis(node_, axis_, rank);
    for (std::size_t i = 1; i < 3 && i < in.size(); ++i) {
      if (!in[i]) continue;
      if (in[i]->dtype != in[0]->dtype)
        fail(node_, "input '" + node_.inputs[i] + "' is " + type_name(*in[i]) + ", X is " + type_name(*in[0]));
      if (!broadcasts_into(in[i]->shape, xs))
        fail(node_, "input '" + node_.inputs[i] + "' of shape " + shape_to_string(in[i]->shape) +
                        " does not broadcast to X's shape " + shape_to_string(xs));
    }
    Shape stat_shape(xs.begin(), xs.begin() + axis);
    stat_shape.resize(xs.size(), 1);
    return {meta_like(*in[0], xs), meta_of(stash_, stat_shape), meta_of(stash_, stat_shape)};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    if (in[0]->dtype() == DType::kFloat32) apply<float>(in, out);
    else apply<double>(in, out);
  }

 private:
  template <class T>
  void apply(std::span<const Tensor* const> in, std::span<Tensor* const> out) const {
    const Tensor& x = *in[0];
    const Shape& xs = x.shape();
    const int axis = normalize_axis(node_, axis_, x.rank());
    const Shape norm_shape(xs.begin() + axis, xs.end());
    const std::int64_t n = shape_numel(norm_shape);
    const std::int64_t rows = n == 0 ? 0 : x.numel() / n;
    // Parameters that vary only over the normalised dimensions become one vector of n values;
    // ones that also vary over the leading dimensions are materialised at X's full size.
    auto params = [&](const Tensor* t, std::vector<T>& storage) -> std::int64_t {
      if (!t) return 0;
      if (broadcasts_into(t->shape(), norm_shape)) {
        storage = expand_to<T>(*t, norm_shape);
        return n;
      }
      storage = expand_to<T>(*t, xs);
      return x.numel();
    };
    std::vector<T> scale, bias;
    const std::int64_t scale_len = params(in[1], scale);
    const std::int64_t bias_len = params(in.size() > 2 ? in[2] : nullptr, bias);
    // One affine needs one period: if only one is materialised, materialise the other too.
    if (scale_len != 0 && bias_len != 0 && scale_len != bias_len) {
      if (scale_len != x.numel()) scale = expand_to<T>(*in[1], xs);
      if (bias_len != x.numel()) bias = expand_to<T>(*in[2], xs);
    }
    kernels::ChannelAffine<T> affine;
    affine.scale = scale.empty() ? nullptr : scale.data();
    affine.bias = bias.empty() ? nullptr : bias.data();
    affine.channels = static_cast<std::int64_t>(std::max(scale.size(), bias.size()));
    affine.channel_inner = 1;
    std::vector<double> mean(static_cast<std::size_t>(rows)), inv_std(static_cast<std::size_t>(rows));
    kernels::normalize_rows(x.data<T>(), out[0]->data<T>(), rows, n, epsilon_, affine, mean.data(), inv_std.data());
    write_stat(out.size() > 1 ? out[1] : nullptr, mean);
    write_stat(out.size() > 2 ? out[2] : nullptr, inv_std);
  }

  static void write_stat(Tensor* t, const std::vector<double>& v) {
    if (!t) return;
    if (t->dtype() == DType::kFloat64) std::copy(v.begin(), v.end(), t->data<double>());
    else std::transform(v.begin(), v.end(), t->data<float>(), [](double d) { return static_cast<float>(d); });
  }

  Node node_;
  std::int64_t axis_;
  double epsilon_;
  DType stash_;
};

// ---- InstanceNormalization (6) and GroupNormalization (18, 21) ------------------------------

// Both normalise groups of channels over their spatial extent: instance norm is group norm with
// one channel a group and per-channel scale/bias.
class GroupNormOp final : public Op {
 public:
  enum class Kind { kInstance, kGroupPerGroupAffine, kGroupPerChannelAffine };

  GroupNormOp(const Node& node, Kind kind) : node_(node), kind_(kind), epsilon_(node.get_float("epsilon", 1e-5f)) {
    if (kind_ != Kind::kInstance) {
      if (!node.has("num_groups")) fail(node, "missing required attribute num_groups");
      groups_ = node.get_int("num_groups", 1);
      if (groups_ < 1) fail(node, "num_groups must be >= 1, got " + std::to_string(groups_));
      if (node.has("stash_type")) stash_dtype(node, node.get_int("stash_type", 1));  // validates
    }
  }

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    require_float(node_, in, 0, "X");
    require_float(node_, in, 1, "scale");
    require_float(node_, in, 2, "bias");
    const Shape& xs = in[0]->shape;
    if (xs.size() < 2)
      fail(node_, "X '" + node_.inputs[0] + "' has shape " + shape_to_string(xs) + "; expected [N, C, ...]");
    const std::int64_t c = xs[1];
    const std::int64_t g = kind_ == Kind::kInstance ? c : groups_;
    if (kind_ != Kind::kInstance && c % g != 0)
      fail(node_, "channels (" + std::to_string(c) + ", X shape " + shape_to_string(xs) +
                      ") are not divisible by num_groups " + std::to_string(g));
    const std::int64_t want = kind_ == Kind::kGroupPerGroupAffine ? g : c;
    for (std::size_t i = 1; i < 3; ++i) {
      if (in[i]->dtype != in[0]->dtype)
        fail(node_, "input '" + node_.inputs[i] + "' is " + type_name(*in[i]) + ", X is " + type_name(*in[0]));
      if (shape_numel(in[i]->shape) != want || in[i]->shape.size() != 1) {
        std::string hint;
        if (kind_ == Kind::kGroupPerGroupAffine && shape_numel(in[i]->shape) == c)
          hint = " (per-channel scale/bias are GroupNormalization-21 semantics; this node is opset " +
                 std::to_string(node_.opset) + ", where they are per group)";
        fail(node_, "input '" + node_.inputs[i] + "' has shape " + shape_to_string(in[i]->shape) + ", expected [" +
                        std::to_string(want) + "]" + hint);
      }
    }
    return {meta_like(*in[0], xs)};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    if (in[0]->dtype() == DType::kFloat32) apply<float>(in, out);
    else apply<double>(in, out);
  }

 private:
  template <class T>
  void apply(std::span<const Tensor* const> in, std::span<Tensor* const> out) const {
    const Tensor& x = *in[0];
    const std::int64_t n = x.dim(0), c = x.dim(1);
    const std::int64_t spatial = c == 0 || n == 0 ? 0 : x.numel() / (n * c);
    const std::int64_t g = kind_ == Kind::kInstance ? c : groups_;
    const std::int64_t row = (c / g) * spatial;
    kernels::ChannelAffine<T> affine;
    affine.scale = in[1]->data<T>();
    affine.bias = in[2]->data<T>();
    if (kind_ == Kind::kGroupPerGroupAffine) {
      affine.channels = g;
      affine.channel_inner = row;
    } else {
      affine.channels = c;
      affine.channel_inner = spatial;
    }
    kernels::normalize_rows(x.data<T>(), out[0]->data<T>(), n * g, row, epsilon_, affine, nullptr, nullptr);
  }

  Node node_;
  Kind kind_;
  double epsilon_;
  std::int64_t groups_ = 1;
};

// ---- BatchNormalization (inference) ---------------------------------------------------------

class BatchNormOp final : public Op {
 public:
  explicit BatchNormOp(const Node& node) : node_(node), epsilon_(node.get_float("epsilon", 1e-5f)) {
    if (node.opset >= 14 && node.get_int("training_mode", 0) != 0)
      throw UnsupportedError(node.describe() +
                             ": training_mode=1 (batch statistics, running-mean update) is not supported; "
                             "qeval runs inference only");
    // The outputs after Y are running/saved statistics, produced only in training (before opset
    // 14, asking for them was how a model selected training).
    for (std::size_t o = 1; o < node.outputs.size(); ++o)
      if (!node.outputs[o].empty())
        throw UnsupportedError(node.describe() + ": output " + std::to_string(o) + " ('" + node.outputs[o] +
                               "') is a training-mode statistic; qeval runs inference only");
    spatial_ = node.opset < 9 ? node.get_int("spatial", 1) != 0 : true;
  }

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    static const char* names[] = {"X", "scale", "B", "input_mean", "input_var"};
    for (std::size_t i = 0; i < 5; ++i) require_float(node_, in, i, names[i]);
    const Shape& xs = in[0]->shape;
    if (xs.size() < 2)
      fail(node_, "X '" + node_.inputs[0] + "' has shape " + shape_to_string(xs) + "; expected [N, C, ...]");
    const std::int64_t want = spatial_ ? xs[1] : shape_numel(xs) / std::max<std::int64_t>(1, xs[0]);
    for (std::size_t i = 1; i < 5; ++i)
      if (shape_numel(in[i]->shape) != want)
        fail(node_, std::string(names[i]) + " '" + node_.inputs[i] + "' has shape " + shape_to_string(in[i]->shape) +
                        ", expected " + std::to_string(want) + " values for X of shape " + shape_to_string(xs));
    return {meta_like(*in[0], xs)};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const std::int64_t n = x.dim(0);
    const std::int64_t params = in[1]->numel();
    const std::int64_t inner = params == 0 || n == 0 ? 0 : x.numel() / (n * params);
    const auto scale = as_doubles(*in[1]), bias = as_doubles(*in[2]), mean = as_doubles(*in[3]),
               var = as_doubles(*in[4]);
    if (x.dtype() == DType::kFloat32)
      kernels::batch_norm(x.data<float>(), out[0]->data<float>(), n, params, inner, scale.data(), bias.data(),
                          mean.data(), var.data(), epsilon_);
    else
      kernels::batch_norm(x.data<double>(), out[0]->data<double>(), n, params, inner, scale.data(), bias.data(),
                          mean.data(), var.data(), epsilon_);
  }

 private:
  Node node_;
  double epsilon_;
  bool spatial_ = true;
};

}  // namespace

void register_normalization_ops(std::vector<OpSchema>& out) {
  out.push_back({"LayerNormalization", "", 17, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<LayerNormOp>(n); }});
  // Opset 1 differs only by the legacy consumed_inputs attribute; 6 is today's definition.
  out.push_back({"InstanceNormalization", "", 6, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return std::make_unique<GroupNormOp>(n, GroupNormOp::Kind::kInstance);
                 }});
  // Opset 18 applies scale/bias per group; 21 changed them to per channel (and added stash_type).
  out.push_back({"GroupNormalization", "", 18, 20, [](const Node& n) -> std::unique_ptr<Op> {
                   return std::make_unique<GroupNormOp>(n, GroupNormOp::Kind::kGroupPerGroupAffine);
                 }});
  out.push_back({"GroupNormalization", "", 21, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return std::make_unique<GroupNormOp>(n, GroupNormOp::Kind::kGroupPerChannelAffine);
                 }});
  // Opset 6 and earlier had is_test (training by default); 7-8 add `spatial`; 9 fixed spatial;
  // 14 made training an attribute (training_mode) rather than the presence of outputs.
  auto bn = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<BatchNormOp>(n); };
  out.push_back({"BatchNormalization", "", 7, 8, bn});
  out.push_back({"BatchNormalization", "", 9, 13, bn});
  out.push_back({"BatchNormalization", "", 14, kMaxOpset, bn});
}

}  // namespace qeval::eval
