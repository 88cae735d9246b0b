// Range observers, amax computation per calibration method, SmoothQuant scales, the cache.
#include "eval/quant/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include <tbb/parallel_for.h>

#include "base/file_names.h"
#include "base/files.h"
#include "base/input_file.h"
#include "base/progress.h"
#include "datasets/npy.h"
#include "kernels/error.h"
#include "kernels/gemm.h"
#include "kernels/numeric.h"
#include "metrics/calibration.h"

namespace qeval::eval::quant {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

float finite_abs_max(std::span<const float> v) {
  float m = 0;
  for (float x : v) {
    const float a = std::fabs(x);
    if (a > m && std::isfinite(a)) m = a;
  }
  return m;
}

// Weight element (k, n) of a linear layer's weight in [K, N] orientation.
struct LinearWeight {
  const float* data = nullptr;
  std::int64_t k = 0, n = 0;
  bool k_major = true;  // [K, N] storage; false: [N, K] (Gemm transB)
  float at(std::int64_t i, std::int64_t j) const { return k_major ? data[i * n + j] : data[j * k + i]; }
};

LinearWeight linear_weight(const Graph& g, const QuantTarget& t) {
  const Tensor& w = g.initializers.at(t.weight_name);
  if (w.dtype() != DType::kFloat32)
    throw UnsupportedError(g.source + ": node '" + t.node + "': weight '" + t.weight_name + "' is " +
                           std::string(dtype_name(w.dtype())) + "; quantization recipes need float32 weights");
  LinearWeight lw;
  lw.data = w.data<float>();
  lw.k_major = t.weight_in_axis == 0;
  lw.k = w.dim(t.weight_in_axis);
  lw.n = w.dim(t.weight_out_axis);
  return lw;
}

std::vector<float> smoothing_scale(const std::vector<float>& act_amax, const std::vector<float>& w_amax, double alpha) {
  // ModelOpt: channels whose activation amax is ~0 keep scale 1 (the division would overflow);
  // so do channels whose weights are all zero.
  constexpr double kEps = 1.0 / (1u << 31);
  std::vector<float> s(act_amax.size(), 1.0f);
  for (std::size_t j = 0; j < s.size(); ++j) {
    if (act_amax[j] <= kEps || w_amax[j] <= kEps) continue;
    const double v = std::pow(double(act_amax[j]), alpha) / std::pow(double(w_amax[j]), 1.0 - alpha);
    if (std::isfinite(v) && v > 0) s[j] = static_cast<float>(v);
  }
  return s;
}

float smoothed_act_amax(const std::vector<float>& act_amax, const std::vector<float>& s) {
  float m = 0;
  for (std::size_t j = 0; j < s.size(); ++j) m = std::max(m, act_amax[j] * (1.0f / s[j]));
  return m;
}

}  // namespace

struct RangeCollector::Slot {
  std::size_t target = 0;
  ActivationInput act;
  metrics::StepAmaxCollector steps;
  std::unique_ptr<metrics::AbsHistogram> hist;
  bool smooth = false;
  std::vector<float> channel_amax;  // SmoothQuant: per last-axis channel
  Tensor device_channel_amax;       // the same, folded on a device (merged at finish)
  int search_rows = 0;              // alpha search: rows kept (reservoir sample)
  std::vector<float> rows;
  long rows_seen = 0;
  std::uint64_t rng = 0;
  bool seen = false;
};

RangeCollector::RangeCollector(const Graph& graph, const Selection& selection, const Recipe& recipe)
    : graph_(graph), recipe_(recipe), targets_(selection.targets) {
  const bool histogram =
      recipe.calibration.method == CalibrationMethod::kEntropy || recipe.calibration.method == CalibrationMethod::kMse;
  for (std::size_t t = 0; t < targets_.size(); ++t) {
    for (const auto& act : targets_[t].activations) {
      auto slot = std::make_unique<Slot>();
      slot->target = t;
      slot->act = act;
      slot->smooth = recipe.smoothquant.enabled && targets_[t].is_linear() && act.role == "input";
      if (slot->smooth && recipe.smoothquant.search) {
        slot->search_rows = recipe.smoothquant.search_rows;
        slot->rng = 0x5eed0000ULL + targets_[t].node_index;
      }
      if (histogram && !slot->smooth) slot->hist = std::make_unique<metrics::AbsHistogram>(recipe.calibration.num_bins);
      by_node_[targets_[t].node].push_back(slots_.size());
      slots_.push_back(std::move(slot));
    }
  }
  if (!graph.nodes.empty()) first_node_ = graph.nodes.front().name;
}

RangeCollector::~RangeCollector() = default;

void RangeCollector::on_node(const NodeEvent& e) {
  if (e.node.name == first_node_) ++calls_;
  if (e.folded) return;
  auto it = by_node_.find(e.node.name);
  if (it == by_node_.end()) return;
  for (std::size_t si : it->second) {
    Slot& s = *slots_[si];
    const Tensor* x = s.act.input < e.inputs.size() ? e.inputs[s.act.input] : nullptr;
    if (!x || x->dtype() != DType::kFloat32 || x->numel() == 0) continue;
    s.seen = true;
    if (!x->on_device()) {
      collect_on_host(s, *x, true, true);
      continue;
    }
    // In device memory: what the device measures stays there; the rest from one host copy.
    const bool amax = !queue_amax(si, *x);
    const bool channels = s.smooth && !channel_amax_on_device(s, *x);
    if (amax || channels || s.hist || s.search_rows > 0) {
      host_copy_ = x->to_host();
      collect_on_host(s, host_copy_, amax, channels);
    }
  }
}

void RangeCollector::collect_on_host(Slot& s, const Tensor& x, bool amax, bool channels) {
  const auto v = x.span<float>();
  if (amax) s.steps.collect(step_, finite_abs_max(v));
  if (s.hist) s.hist->collect(v);
  if (!s.smooth) return;
  const auto k = static_cast<std::size_t>(x.shape().back());
  if (s.channel_amax.empty()) s.channel_amax.assign(k, 0.0f);
  if (s.channel_amax.size() != k)
    throw InputError(graph_.source + ": node '" + targets_[s.target].node + "': input " + std::to_string(s.act.input) +
                     " changed its channel count during calibration (" + std::to_string(s.channel_amax.size()) +
                     " -> " + std::to_string(k) + ")");
  if (channels)
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float a = std::fabs(v[i]);
      float& m = s.channel_amax[i % k];
      if (a > m && std::isfinite(a)) m = a;
    }
  if (s.search_rows > 0) {
    const std::size_t rows = v.size() / k;
    for (std::size_t r = 0; r < rows; ++r) {
      const long seen = s.rows_seen++;
      std::size_t dst;
      if (seen < s.search_rows) {
        dst = static_cast<std::size_t>(seen);
        s.rows.resize((dst + 1) * k);
      } else {
        const std::uint64_t j = splitmix64(s.rng) % static_cast<std::uint64_t>(seen + 1);
        if (j >= static_cast<std::uint64_t>(s.search_rows)) continue;
        dst = static_cast<std::size_t>(j);
      }
      std::copy(v.begin() + static_cast<std::ptrdiff_t>(r * k), v.begin() + static_cast<std::ptrdiff_t>((r + 1) * k),
                s.rows.begin() + static_cast<std::ptrdiff_t>(dst * k));
    }
  }
}

bool RangeCollector::queue_amax(std::size_t slot, const Tensor& x) {
  if (!queued_.add(x, nullptr, std::numeric_limits<float>::infinity(), nullptr, Pending{slot, step_})) return false;
  if (queued_.size() >= 4096) flush();
  return true;
}

bool RangeCollector::channel_amax_on_device(Slot& s, const Tensor& x) {
  const auto k = x.shape().back();
  if (s.channel_amax.empty()) s.channel_amax.assign(static_cast<std::size_t>(k), 0.0f);
  if (s.channel_amax.size() != static_cast<std::size_t>(k)) return false;  // the host path says so
  if (s.device_channel_amax.numel() == 0)
    s.device_channel_amax = Tensor(DType::kFloat32, {k}).to_device(x.device());  // zeros
  else if (s.device_channel_amax.device() != x.device())
    return false;  // another device's values: this one's on the host
  return eval::channel_amax_on_device(x, s.device_channel_amax);
}

void RangeCollector::flush() {
  queued_.take([&](const Pending& p, const kernels::ScanTotals& t) {
    float amax = 0;
    std::memcpy(&amax, &t.max_bits, sizeof amax);
    slots_[p.slot]->steps.collect(p.step, amax);
  });
}

namespace {

// Output MSE of a linear layer on rows X (R x K) when smoothed with `s` and fake-quantized (int8
// activations per tensor with `act_amax`, int8 weights per output channel or per tensor).
double smoothed_layer_mse(const std::vector<float>& x, std::int64_t rows, const LinearWeight& w,
                          const std::vector<float>& s, float act_amax, bool per_channel,
                          const std::vector<float>& y_ref) {
  const std::int64_t K = w.k, N = w.n;
  std::vector<float> xq(x.size()), wq(static_cast<std::size_t>(K * N));
  const float act_scale = act_amax / 127.0f;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < K; ++k) {
      const float xs = x[static_cast<std::size_t>(r * K + k)] * (1.0f / s[static_cast<std::size_t>(k)]);
      xq[static_cast<std::size_t>(r * K + k)] =
          act_scale > 0 ? dequantize(quantize_int8(xs, act_scale), act_scale, 0) : 0.0f;
    }
  std::vector<float> col_amax(static_cast<std::size_t>(N), 0.0f);
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t n = 0; n < N; ++n) {
      const float ws = w.at(k, n) * s[static_cast<std::size_t>(k)];
      wq[static_cast<std::size_t>(k * N + n)] = ws;
      col_amax[static_cast<std::size_t>(n)] = std::max(col_amax[static_cast<std::size_t>(n)], std::fabs(ws));
    }
  if (!per_channel) {
    const float m = *std::max_element(col_amax.begin(), col_amax.end());
    std::fill(col_amax.begin(), col_amax.end(), m);
  }
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t n = 0; n < N; ++n) {
      const float scale = col_amax[static_cast<std::size_t>(n)] / 127.0f;
      float& v = wq[static_cast<std::size_t>(k * N + n)];
      v = scale > 0 ? dequantize(quantize_int8(v, scale), scale, 0) : 0.0f;
    }
  std::vector<float> y(static_cast<std::size_t>(rows * N));
  kernels::GemmShape gs{false, false, rows, N, K, K, N, N};
  kernels::sgemm(gs, 1.0f, xq.data(), wq.data(), 0.0f, y.data());
  double err = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double d = double(y[i]) - double(y_ref[i]);
    err += d * d;
  }
  return y.empty() ? 0.0 : err / static_cast<double>(y.size());
}

}  // namespace

CalibrationResult RangeCollector::finish(int total_steps) {
  flush();
  for (auto& slot : slots_) {
    Slot& s = *slot;
    if (s.device_channel_amax.numel() == 0) continue;
    const Tensor device = s.device_channel_amax.to_host();
    for (std::size_t c = 0; c < s.channel_amax.size(); ++c)
      s.channel_amax[c] = std::max(s.channel_amax[c], device.data<float>()[c]);
    s.device_channel_amax = Tensor();
  }
  CalibrationResult r;
  r.recipe_name = recipe_.name;
  r.method = calibration_method_name(recipe_.calibration.method);
  r.total_steps = total_steps;
  r.calls = calls_;
  const auto& cal = recipe_.calibration;
  const float fmax = format_max(recipe_.format);
  for (const auto& slot : slots_) {
    const Slot& s = *slot;
    const QuantTarget& t = targets_[s.target];
    if (!s.seen)
      throw InputError("calibration never ran node '" + t.node + "' (" + t.op_type + ") input " +
                       std::to_string(s.act.input) + " of " + graph_.source +
                       " with float data: the calibration set does not reach it");
    ActivationRange a;
    a.node = t.node;
    a.input = s.act.input;
    a.role = s.act.role;
    int steps = total_steps;
    for (const auto& [step, st] : s.steps.steps()) steps = std::max(steps, step + 1);
    a.step_max.assign(static_cast<std::size_t>(steps), std::numeric_limits<float>::quiet_NaN());
    a.step_mean.assign(static_cast<std::size_t>(steps), std::numeric_limits<float>::quiet_NaN());
    for (const auto& [step, st] : s.steps.steps()) {
      if (step < 0) continue;
      a.step_max[static_cast<std::size_t>(step)] = static_cast<float>(st.max);
      a.step_mean[static_cast<std::size_t>(step)] = static_cast<float>(st.sum / static_cast<double>(st.count));
    }
    double amax = 0;
    if (s.smooth) {
      const LinearWeight w = linear_weight(graph_, t);
      if (static_cast<std::int64_t>(s.channel_amax.size()) != w.k)
        throw InputError(graph_.source + ": node '" + t.node + "': activation has " +
                         std::to_string(s.channel_amax.size()) + " channels, weight '" + t.weight_name + "' has " +
                         std::to_string(w.k) + " input channels");
      std::vector<float> w_amax(static_cast<std::size_t>(w.k), 0.0f);
      for (std::int64_t k = 0; k < w.k; ++k)
        for (std::int64_t n = 0; n < w.n; ++n)
          w_amax[static_cast<std::size_t>(k)] = std::max(w_amax[static_cast<std::size_t>(k)], std::fabs(w.at(k, n)));
      Smoothing sm;
      sm.node = t.node;
      if (!recipe_.smoothquant.search) {
        sm.alpha = recipe_.smoothquant.alpha;
        sm.scale = smoothing_scale(s.channel_amax, w_amax, sm.alpha);
      } else {
        const std::int64_t rows = static_cast<std::int64_t>(s.rows.size()) / w.k;
        std::vector<float> wkn(static_cast<std::size_t>(w.k * w.n));
        for (std::int64_t k = 0; k < w.k; ++k)
          for (std::int64_t n = 0; n < w.n; ++n) wkn[static_cast<std::size_t>(k * w.n + n)] = w.at(k, n);
        std::vector<float> y_ref(static_cast<std::size_t>(rows * w.n));
        kernels::GemmShape gs{false, false, rows, w.n, w.k, w.k, w.n, w.n};
        kernels::sgemm(gs, 1.0f, s.rows.data(), wkn.data(), 0.0f, y_ref.data());
        const bool per_channel = recipe_.weights == WeightGranularity::kPerChannel;
        const std::vector<float> ones(static_cast<std::size_t>(w.k), 1.0f);
        sm.mse_unsmoothed =
            smoothed_layer_mse(s.rows, rows, w, ones, smoothed_act_amax(s.channel_amax, ones), per_channel, y_ref);
        sm.mse = std::numeric_limits<double>::infinity();
        for (double alpha : recipe_.smoothquant.alpha_grid) {
          auto scale = smoothing_scale(s.channel_amax, w_amax, alpha);
          const double e =
              smoothed_layer_mse(s.rows, rows, w, scale, smoothed_act_amax(s.channel_amax, scale), per_channel, y_ref);
          if (e < sm.mse) {
            sm.mse = e;
            sm.alpha = alpha;
            sm.scale = std::move(scale);
          }
        }
      }
      amax = smoothed_act_amax(s.channel_amax, sm.scale);
      r.smoothing[t.node] = std::move(sm);
    } else {
      switch (cal.method) {
        case CalibrationMethod::kMax: amax = s.steps.overall_max(); break;
        case CalibrationMethod::kPercentile:
          amax = s.steps.percentile_amax(total_steps, cal.percentile, cal.collect);
          break;
        case CalibrationMethod::kEntropy:
          amax = s.hist->counts().size() < 2
                     ? s.steps.overall_max()
                     : metrics::entropy_amax(s.hist->counts(), s.hist->edges(), 8, cal.stride, cal.start_bin);
          break;
        case CalibrationMethod::kMse: {
          if (s.hist->counts().size() < 2) {
            amax = s.steps.overall_max();
            break;
          }
          auto fq = [&](double x, double m) -> double {
            if (recipe_.format == QuantFormat::kInt8) return metrics::fake_quant_int8(x, m);
            const float scale = static_cast<float>(m / fmax);
            const float q = static_cast<float>(x) / scale;
            const float r8 =
                recipe_.format == QuantFormat::kFp8E4M3 ? to_float(to_float8_e4m3fn(q)) : to_float(to_float8_e5m2(q));
            return double(r8) * scale;
          };
          const int start = std::min(cal.start_bin, static_cast<int>(s.hist->counts().size()) - 1);
          amax = metrics::mse_amax(s.hist->counts(), s.hist->edges(), cal.stride, start, fq);
          break;
        }
      }
    }
    if (!(amax > 0) || !std::isfinite(amax)) {
      a.note = "no non-zero finite value seen: amax set to 1";
      amax = 1;
    }
    a.amax = static_cast<float>(amax);
    r.activations.push_back(std::move(a));
  }
  return r;
}

const ActivationRange* CalibrationResult::find(const std::string& node, std::size_t input) const {
  for (const auto& a : activations)
    if (a.node == node && a.input == input) return &a;
  return nullptr;
}

const Smoothing* CalibrationResult::smoothing_for(const std::string& node) const {
  auto it = smoothing.find(node);
  return it == smoothing.end() ? nullptr : &it->second;
}

namespace {
json floats_json(const std::vector<float>& v) {
  json a = json::array();
  for (float x : v) a.push_back(std::isfinite(x) ? json(x) : json(nullptr));
  return a;
}
std::vector<float> floats_from(const json& a) {
  std::vector<float> v;
  for (const auto& x : a) v.push_back(x.is_null() ? std::numeric_limits<float>::quiet_NaN() : x.get<float>());
  return v;
}
}  // namespace

json CalibrationResult::to_json() const {
  json j;
  j["format"] = "qeval.calibration";
  j["version"] = 1;
  j["recipe"] = recipe_name;
  j["recipe_fingerprint"] = recipe_fingerprint;
  j["model_fingerprint"] = model_fingerprint;
  j["data_fingerprint"] = data_fingerprint;
  j["method"] = method;
  j["total_steps"] = total_steps;
  j["calls"] = calls;
  j["elapsed_s"] = elapsed_s;
  j["activations"] = json::array();
  for (const auto& a : activations) {
    json e{{"node", a.node},
           {"input", a.input},
           {"role", a.role},
           {"amax", a.amax},
           {"step_max", floats_json(a.step_max)},
           {"step_mean", floats_json(a.step_mean)}};
    if (!a.note.empty()) e["note"] = a.note;
    j["activations"].push_back(std::move(e));
  }
  j["smoothquant"] = json::array();
  for (const auto& [node, s] : smoothing) {
    json e{{"node", node}, {"alpha", s.alpha}, {"scale", floats_json(s.scale)}};
    if (s.mse_unsmoothed > 0 || s.mse > 0) {
      e["mse"] = s.mse;
      e["mse_unsmoothed"] = s.mse_unsmoothed;
    }
    j["smoothquant"].push_back(std::move(e));
  }
  return j;
}

CalibrationResult CalibrationResult::from_json(const json& j, const std::string& source) {
  CalibrationResult r;
  try {
    if (j.value("format", "") != "qeval.calibration")
      throw InputError(source + ": not a qeval calibration file (\"format\": \"qeval.calibration\" missing)");
    r.recipe_name = j.value("recipe", "");
    r.recipe_fingerprint = j.at("recipe_fingerprint").get<std::string>();
    r.model_fingerprint = j.at("model_fingerprint").get<std::string>();
    r.data_fingerprint = j.at("data_fingerprint").get<std::string>();
    r.method = j.value("method", "");
    r.total_steps = j.at("total_steps").get<int>();
    r.calls = j.value("calls", 0L);
    r.elapsed_s = j.value("elapsed_s", 0.0);
    std::size_t i = 0;
    for (const auto& e : j.at("activations")) {
      ActivationRange a;
      a.node = e.at("node").get<std::string>();
      a.input = e.at("input").get<std::size_t>();
      a.role = e.at("role").get<std::string>();
      a.amax = e.at("amax").is_null() ? std::numeric_limits<float>::quiet_NaN() : e.at("amax").get<float>();
      if (!(a.amax > 0) || !std::isfinite(a.amax))
        throw InputError(source + ": activations[" + std::to_string(i) + "] (node '" + a.node + "' input " +
                         std::to_string(a.input) + "): amax must be finite and > 0, got " + e.at("amax").dump());
      a.step_max = floats_from(e.value("step_max", json::array()));
      a.step_mean = floats_from(e.value("step_mean", json::array()));
      a.note = e.value("note", "");
      r.activations.push_back(std::move(a));
      ++i;
    }
    for (const auto& e : j.at("smoothquant")) {
      Smoothing s;
      s.node = e.at("node").get<std::string>();
      s.alpha = e.at("alpha").get<double>();
      s.scale = floats_from(e.at("scale"));
      for (float v : s.scale)
        if (!(v > 0) || !std::isfinite(v))
          throw InputError(source + ": smoothquant scale of node '" + s.node + "' must be finite and > 0");
      s.mse = e.value("mse", 0.0);
      s.mse_unsmoothed = e.value("mse_unsmoothed", 0.0);
      r.smoothing[s.node] = std::move(s);
    }
  } catch (const json::exception& e) {
    throw InputError(source + ": malformed calibration file: " + e.what());
  }
  return r;
}

// ---- calibration sets -----------------------------------------------------------------------

TensorCalibrationSet::TensorCalibrationSet(std::vector<std::map<std::string, Tensor>> samples, std::string name)
    : samples_(std::move(samples)), name_(std::move(name)) {}

std::vector<fs::path> tensor_sample_folders(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir.string() + ": sample folder not found");
  std::vector<fs::path> subdirs;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) subdirs.push_back(e.path());
  std::sort(subdirs.begin(), subdirs.end());
  if (subdirs.empty()) subdirs.push_back(dir);
  return subdirs;
}

std::map<std::string, Tensor> read_tensor_sample(const fs::path& folder, const Graph& graph) {
  std::map<std::string, Tensor> sample;
  for (const auto& in : graph.inputs) {
    const fs::path file = folder / (base::file_name_for(in.name) + ".npy");
    if (!fs::exists(file))
      throw InputError(folder.string() + ": sample lacks " + file.filename().string() + " for model input '" + in.name +
                       "'");
    sample.emplace(in.name, datasets::read_npy(file));
  }
  return sample;
}

TensorCalibrationSet TensorCalibrationSet::from_folder(const fs::path& dir, const Graph& graph) {
  std::vector<std::map<std::string, Tensor>> samples;
  for (const auto& d : tensor_sample_folders(dir)) samples.push_back(read_tensor_sample(d, graph));
  return TensorCalibrationSet(std::move(samples), dir.string());
}

// Bulk data (weights, samples): FNV-1a over the 64-bit little-endian words of each 4 MiB block
// (trailing bytes one by one), the blocks hashed in parallel and their hashes folded into `seed`
// in order with fnv1a64. The same value for any thread count; ~20x faster than byte-wise FNV-1a on
// GBs of weights (a full-size UNet's fingerprint took seconds per pass).
static std::uint64_t fnv1a64_blocks(const void* data, std::size_t size, std::uint64_t seed) {
  constexpr std::size_t kBlock = std::size_t(4) << 20;
  const auto* bytes = static_cast<const unsigned char*>(data);
  auto block_hash = [&](std::size_t b) {
    const unsigned char* p = bytes + b * kBlock;
    const std::size_t n = std::min(kBlock, size - b * kBlock), words = n / 8;
    std::uint64_t h = 0xcbf29ce484222325ULL;
    for (std::size_t i = 0; i < words; ++i) {
      std::uint64_t w;
      std::memcpy(&w, p + 8 * i, 8);
      h ^= w;
      h *= 0x100000001b3ULL;
    }
    return fnv1a64(p + 8 * words, n - 8 * words, h);
  };
  const std::size_t blocks = (size + kBlock - 1) / kBlock;
  std::vector<std::uint64_t> hashes(blocks);
  if (blocks > 1) {
    tbb::parallel_for(std::size_t(0), blocks, [&](std::size_t b) { hashes[b] = block_hash(b); });
  } else if (blocks == 1) {
    hashes[0] = block_hash(0);
  }
  return fnv1a64(hashes.data(), hashes.size() * sizeof(std::uint64_t), seed);
}

std::string TensorCalibrationSet::fingerprint() const {
  std::uint64_t h = fnv1a64("tensors", 7);
  for (const auto& sample : samples_)
    for (const auto& [name, t] : sample) {
      h = fnv1a64(name.data(), name.size(), h);
      const std::string shape = std::string(dtype_name(t.dtype())) + shape_to_string(t.shape());
      h = fnv1a64(shape.data(), shape.size(), h);
      h = fnv1a64_blocks(t.raw(), t.nbytes(), h);
    }
  return hex64(h);
}

std::string TensorCalibrationSet::describe() const {
  return std::to_string(samples_.size()) + " sample(s) from " + name_;
}

int TensorCalibrationSet::run(const Graph& reference, RangeCollector& collector) {
  Session session(reference);
  // Shown per --progress (libraries' default settings show nothing).
  base::Progress progress("calibrating " + (recipe_name.empty() ? std::string("model") : recipe_name), samples_.size(),
                          true, {"samples"});
  for (const auto& sample : samples_) {
    collector.set_step(0);
    session.run(sample, &collector);
    progress.tick();
  }
  progress.finish();
  return 1;
}

// ---- fingerprints, calibrate, cache ---------------------------------------------------------

std::string graph_fingerprint(const Graph& g) {
  std::uint64_t h = fnv1a64("graph", 5);
  auto add = [&](const std::string& s) {
    h = fnv1a64(s.data(), s.size(), h);
    h = fnv1a64("\0", 1, h);
  };
  for (const auto& [d, v] : g.opsets) add(d + "=" + std::to_string(v));
  for (const auto& n : g.nodes) {
    add(n.op_type);
    add(n.domain);
    add(n.name);
    for (const auto& i : n.inputs) add(i);
    add("->");
    for (const auto& o : n.outputs) add(o);
    for (const auto& [k, a] : n.attributes) {
      std::ostringstream os;
      os << k << ':' << int(a.kind) << ':' << a.i << ':' << a.f << ':' << a.s;
      for (auto x : a.ints) os << ',' << x;
      for (auto x : a.floats) os << ',' << x;
      for (const auto& x : a.strings) os << ',' << x;
      add(os.str());
      if (a.kind == Attribute::Kind::kTensor) h = fnv1a64_blocks(a.t.raw(), a.t.nbytes(), h);
    }
  }
  std::vector<std::string> names;
  for (const auto& [k, t] : g.initializers) names.push_back(k);
  std::sort(names.begin(), names.end());
  for (const auto& k : names) {
    const Tensor& t = g.initializers.at(k);
    add(k + ":" + std::string(dtype_name(t.dtype())) + shape_to_string(t.shape()));
    h = fnv1a64_blocks(t.raw(), t.nbytes(), h);
  }
  return hex64(h);
}

CalibrationResult calibrate(const Graph& graph, const Selection& selection, const Recipe& recipe, CalibrationSet& set) {
  const auto start = std::chrono::steady_clock::now();
  RangeCollector collector(graph, selection, recipe);
  set.recipe_name = recipe.name;
  const int steps = set.run(graph, collector);
  CalibrationResult r = collector.finish(steps);
  r.recipe_fingerprint = recipe.fingerprint();
  r.model_fingerprint = graph_fingerprint(graph);
  r.data_fingerprint = set.fingerprint();
  r.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::string calibration_cache_key(const std::string& recipe_fp, const std::string& model_fp,
                                  const std::string& data_fp) {
  const std::string s = recipe_fp + "/" + model_fp + "/" + data_fp;
  return fnv1a64_hex(s.data(), s.size());
}

CalibrationResult calibrate_cached(const Graph& graph, const Selection& selection, const Recipe& recipe,
                                   CalibrationSet& set, const fs::path& cache_dir, bool* cache_hit) {
  const std::string recipe_fp = recipe.fingerprint(), model_fp = graph_fingerprint(graph), data_fp = set.fingerprint();
  const fs::path file = cache_dir / (calibration_cache_key(recipe_fp, model_fp, data_fp) + ".json");
  if (cache_hit) *cache_hit = false;
  std::error_code ec;
  if (fs::exists(file, ec)) {
    try {
      // Not std::ifstream: a FIFO in the cache blocked; anything but a regular file is recomputed.
      CalibrationResult r =
          CalibrationResult::from_json(json::parse(base::read_regular_file_text(file)), file.string());
      if (r.recipe_fingerprint == recipe_fp && r.model_fingerprint == model_fp && r.data_fingerprint == data_fp) {
        if (cache_hit) *cache_hit = true;
        return r;
      }
    } catch (const std::exception&) {
      // A corrupt or foreign cache entry is recomputed and overwritten.
    }
  }
  CalibrationResult r = calibrate(graph, selection, recipe, set);
  fs::create_directories(cache_dir, ec);
  base::write_file_atomic(file, r.to_json().dump(1) + "\n");
  return r;
}

}  // namespace qeval::eval::quant
