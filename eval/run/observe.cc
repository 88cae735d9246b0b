// Per-layer observation: the layer space, per-layer statistics cells and logs, variants' views of
// the reference (observe_model), and the capture of the reference's values (eval/run/observe.h).
#include "eval/run/observe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/numeric.h"
#include "metrics/tensor_error.h"

namespace qeval::eval {

namespace {

constexpr float kNoClip = std::numeric_limits<float>::infinity();

// The largest magnitude of a quantized format, from the zero point's type; 0 when the quantizer
// is not symmetric around zero (asymmetric uint8) or unknown.
float format_max_of(const Node& q, const Graph& g) {
  if (q.op_type == "TRT_FP8QuantizeLinear") return 448.0f;
  if (!q.has_input(2)) return 0.0f;  // default zero point: uint8, asymmetric
  auto zp = g.initializers.find(q.inputs[2]);
  if (zp == g.initializers.end()) return 0.0f;
  const Tensor& z = zp->second;
  switch (z.dtype()) {
    case DType::kInt8:
      for (std::int8_t v : z.span<std::int8_t>())
        if (v != 0) return 0.0f;
      return 127.0f;
    case DType::kFloat8E4M3FN: return 448.0f;
    case DType::kFloat8E5M2: return 57344.0f;
    default: return 0.0f;
  }
}

std::string format_of_type(DType t) {
  switch (t) {
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kUInt16: return "uint16";
    case DType::kFloat8E4M3FN: return "fp8_e4m3";
    case DType::kFloat8E5M2: return "fp8_e5m2";
    default: return std::string(dtype_name(t));
  }
}

// The quantized type a QuantizeLinear produces: its zero point's type (uint8 by default).
std::string quantize_format(const Node& q, const Graph& g) {
  if (q.op_type == "TRT_FP8QuantizeLinear") return "fp8_e4m3";
  if (q.has_input(2))
    if (auto zp = g.initializers.find(q.inputs[2]); zp != g.initializers.end())
      return format_of_type(zp->second.dtype());
  return "uint8";
}

}  // namespace

LayerSpace::LayerSpace(std::vector<Model> models, int steps) : models_(std::move(models)), steps_(std::max(1, steps)) {
  for (auto& m : models_) {
    m.first_layer = layers_;
    auto& outputs = layer_of_output_.emplace_back();
    for (std::size_t i = 0; i < m.graph->nodes.size(); ++i)
      if (!m.graph->nodes[i].outputs.empty()) outputs.emplace(m.graph->nodes[i].outputs[0], layers_ + i);
    layers_ += m.graph->nodes.size();
  }
}

int LayerSpace::layer_of_output(std::size_t model, const std::string& value) const {
  const auto& outputs = layer_of_output_[model];
  const auto it = outputs.find(value);
  return it == outputs.end() ? -1 : int(it->second);
}

int LayerSpace::model_index(std::string_view name) const {
  for (std::size_t i = 0; i < models_.size(); ++i)
    if (models_[i].name == name) return int(i);
  return -1;
}

std::size_t LayerSpace::model_of(std::size_t layer) const {
  std::size_t m = 0;
  while (m + 1 < models_.size() && models_[m + 1].first_layer <= layer) ++m;
  return m;
}

const Node& LayerSpace::node_of(std::size_t layer) const {
  const Model& m = models_[model_of(layer)];
  return m.graph->nodes[layer - m.first_layer];
}

LayerCell& LayerCell::operator=(const LayerCell& o) {
  if (this == &o) return *this;
  act = o.act;
  acc = o.acc;
  if (o.local_) local_mut() = *o.local_;
  else if (local_) local_->clear();
  return *this;
}

const metrics::ErrorStats& LayerCell::local() const {
  static const metrics::ErrorStats kNone;
  return local_ ? *local_ : kNone;
}

void LayerCell::merge(const LayerCell& o) {
  if (o.act.calls || o.act.clipped) act.merge(o.act);
  if (o.acc.calls) acc.merge(o.acc);
  if (o.local().calls) local_mut().merge(o.local());
}

metrics::ErrorStats& LayerCell::local_mut() {
  if (!local_) local_ = std::make_unique<metrics::ErrorStats>();
  return *local_;
}

LayerCells::LayerCells(const LayerCells& o) : space_(o.space_) { *this = o; }

LayerCells& LayerCells::operator=(const LayerCells& o) {
  if (this == &o) return *this;
  space_ = o.space_;
  keys_ = o.keys_;
  index_ = o.index_;
  touched_ = o.touched_;
  chunks_.clear();
  for (std::size_t c = 0; c * kChunk < keys_.size(); ++c) {
    chunks_.push_back(std::make_unique<LayerCell[]>(kChunk));
    const std::size_t n = std::min(kChunk, keys_.size() - c * kChunk);
    std::copy(o.chunks_[c].get(), o.chunks_[c].get() + n, chunks_[c].get());
  }
  return *this;
}

std::size_t LayerCells::key(std::size_t layer, int step) const {
  return std::size_t(std::clamp(step, 0, space_->cells_of(layer) - 1)) * space_->layers() + layer;
}

LayerCell& LayerCells::at(std::size_t layer, int step) {
  if (touched_.empty()) {
    touched_.assign(space_->layers(), 0);
    index_.assign(space_->layers() * std::size_t(std::max(1, space_->steps())), -1);
  }
  const std::size_t k = key(layer, step);
  std::int32_t& slot = index_[k];
  if (slot < 0) {
    slot = std::int32_t(keys_.size());
    if (keys_.size() == chunks_.size() * kChunk) chunks_.push_back(std::make_unique<LayerCell[]>(kChunk));
    keys_.push_back(std::uint32_t(k));
    touched_[layer] = 1;
  }
  return cell(std::size_t(slot));
}

const LayerCell* LayerCells::find(std::size_t layer, int step) const {
  static const LayerCell kEmpty;
  if (!has(layer)) return nullptr;
  const std::int32_t slot = index_[key(layer, step)];
  return slot < 0 ? &kEmpty : &cell(std::size_t(slot));
}

void UnitObservation::clear() {
  for (auto& c : calls) c.clear();
  for (auto& f : first_nonfinite) f.reset();
}

namespace {
// The one term of a sum from one event (a second term would be lost: never happens, checked). A
// non-finite term is the sum's special part (NaN != 0 too).
double single_term(const metrics::ExactSum& s) {
  const auto partials = s.partials();
  const bool special = s.special() != 0.0;
  if (partials.size() + special > 1) throw std::logic_error("CallLog: a sum of more than one term");
  return special ? s.special() : partials.empty() ? 0.0 : partials[0];
}

std::uint32_t count32(std::uint64_t n) {
  if (n > 0xffffffffu) throw std::logic_error("CallLog: a count of one event beyond 32 bits");
  return std::uint32_t(n);
}
}  // namespace

CallLog::Error CallLog::error_of(const metrics::ErrorStats& e) {
  return {count32(e.count),      count32(e.nonfinite),  count32(e.calls),          count32(e.cosine_calls),
          single_term(e.ref_sq), single_term(e.err_sq), single_term(e.cosine_sum), e.max_abs};
}

void CallLog::reserve(std::size_t events) {
  entries_.reserve(events);
  hist_.reserve(events * 128);  // tiny-sd: ~116 bins per event, most of them one byte
}

void CallLog::add_error(metrics::ErrorStats& to, const Error& e) {
  to.count += e.count;
  to.nonfinite += e.nonfinite;
  to.calls += e.calls;
  to.ref_sq += e.ref_sq;
  to.err_sq += e.err_sq;
  if (e.cosine_calls) to.cosine_sum += e.cosine_sum;
  to.cosine_calls += e.cosine_calls;
  to.max_abs = std::max(to.max_abs, e.max_abs);
}

void CallLog::add(std::size_t layer, int step, const LayerCell& cell) {
  Entry& e = entries_.emplace_back();
  e.layer = std::uint32_t(layer);
  e.step = step;
  const metrics::ActivationStats& a = cell.act;
  e.count = count32(a.count), e.nan = count32(a.nan), e.inf = count32(a.inf), e.clipped = count32(a.clipped);
  e.calls = count32(a.calls);
  e.sum = single_term(a.sum);
  e.sum_sq = single_term(a.sum_sq);
  e.absmax = a.absmax;
  e.hist_first = a.abs_hist.first();
  e.hist_bins = std::uint32_t(a.abs_hist.bins());
  if (hist_.size() > 0xffffffffu) throw std::logic_error("CallLog: histogram bytes beyond 32 bits");
  e.hist_at = std::uint32_t(hist_.size());
  // LEB128: 7 bits a byte, low bits first, the top bit set on all bytes but the last (a bin of
  // one tensor seldom counts 128 or more: ~1.2 bytes a bin on tiny-sd, 4 as uint32).
  std::array<std::uint8_t, metrics::LogAbsHistogram::kBins * 10> bytes;
  std::uint8_t* p = bytes.data();
  const std::size_t bins = a.abs_hist.bins();
  for (std::size_t i = 0; i < bins;) {
    if (i + 8 <= bins) {  // most bins are below 128: one byte each, eight at a time
      std::uint64_t c8[8], any = 0;
      for (int k = 0; k < 8; ++k) any |= c8[k] = a.abs_hist.at(i + std::size_t(k));
      if (any < 0x80) {
        for (int k = 0; k < 8; ++k) p[k] = std::uint8_t(c8[k]);
        p += 8;
        i += 8;
        continue;
      }
    }
    std::uint64_t c = a.abs_hist.at(i++);
    for (; c >= 0x80; c >>= 7) *p++ = std::uint8_t(c | 0x80);
    *p++ = std::uint8_t(c);
  }
  hist_.insert(hist_.end(), bytes.data(), p);
  if (cell.acc.calls) e.acc = error_of(cell.acc);
  if (cell.local().calls) local_.emplace_back(entries_.size() - 1, error_of(cell.local()));
}

void CallLog::merge_into(LayerCells& cells) const {
  std::array<std::uint64_t, metrics::LogAbsHistogram::kBins> bins;
  auto local = local_.begin();
  // The pooled cells (~50k on tiny-sd, their histograms apart) are out of cache by the next merge,
  // each a few lines the hardware prefetcher does not foresee: their misses were most of the
  // merge. Asked for ahead: a cell kFar entries on, its histogram's counts kNear on (by then the
  // cell that points to them is in cache).
  constexpr std::size_t kFar = 8, kNear = 4;
  auto ahead = [&](std::size_t j) {
    return j < entries_.size() ? cells.find(entries_[j].layer, entries_[j].step) : nullptr;
  };
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (const LayerCell* f = ahead(i + kFar))
      for (std::size_t off = 0; off < sizeof(LayerCell); off += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(f) + off, 1);
    if (const LayerCell* f = ahead(i + kNear)) f->act.abs_hist.prefetch();
    const Entry& e = entries_[i];
    LayerCell& c = cells.at(e.layer, e.step);
    if (e.calls || e.clipped) {
      metrics::ActivationStats& a = c.act;
      a.count += e.count;
      a.nan += e.nan;
      a.inf += e.inf;
      a.clipped += e.clipped;
      a.calls += e.calls;
      if (e.calls) {  // add_clipped alone adds no sums (an ExactSum of 0 is not one of nothing)
        a.sum += e.sum;
        a.sum_sq += e.sum_sq;
      }
      a.absmax = std::max(a.absmax, e.absmax);
      const std::uint8_t* p = hist_.data() + e.hist_at;
      const std::uint8_t* const end = hist_.data() + hist_.size();
      for (std::uint32_t b = 0; b < e.hist_bins;) {
        // Most bins are one byte: eight at a time while no byte continues into the next.
        std::uint64_t word;
        if (b + 8 <= e.hist_bins && end - p >= 8 && (std::memcpy(&word, p, 8), (word & 0x8080808080808080u) == 0)) {
          for (int k = 0; k < 8; ++k) bins[b + std::uint32_t(k)] = p[k];
          p += 8;
          b += 8;
          continue;
        }
        std::uint64_t count = *p & 0x7f;
        for (int shift = 7; *p++ & 0x80; shift += 7) count |= std::uint64_t(*p & 0x7f) << shift;
        bins[b++] = count;
      }
      a.abs_hist.add_counts(e.hist_first, std::span<const std::uint64_t>(bins.data(), e.hist_bins));
    }
    if (e.acc.calls) add_error(c.acc, e.acc);
    for (; local != local_.end() && local->first == i; ++local) add_error(c.local_mut(), local->second);
  }
}

void CallLog::clear() {
  entries_.clear();
  hist_.clear();
  local_.clear();
}

void LayerCells::merge(const LayerCells& o) {
  const std::size_t layers = o.touched_.size();
  for (std::size_t i = 0; i < o.keys_.size(); ++i) {
    at(o.keys_[i] % layers, int(o.keys_[i] / layers)).merge(o.cell(i));
  }
}

bool LayerCells::operator==(const LayerCells& o) const {
  const std::size_t n = std::max(layers(), o.layers());
  for (std::size_t l = 0; l < n; ++l) {
    if (has(l) != o.has(l)) return false;
    if (!has(l)) continue;
    for (int s = 0; s < space_->cells_of(l); ++s)
      if (!(*find(l, s) == *o.find(l, s))) return false;
  }
  return true;
}

ObservedModel observe_model(const LayerSpace& space, std::size_t model, const Graph& vg, bool local_error) {
  const Graph& rg = *space.models()[model].graph;
  ObservedModel om;
  om.graph = &vg;
  om.match = match_nodes(rg, vg);
  om.layer_of_node.assign(vg.nodes.size(), -1);
  for (std::size_t i = 0; i < vg.nodes.size(); ++i) om.index_of.emplace(vg.nodes[i].name, i);
  for (std::size_t i = 0; i < vg.nodes.size(); ++i)
    if (om.match.ref_of_variant[i] >= 0)
      om.layer_of_node[i] = int(space.layer(model, std::size_t(om.match.ref_of_variant[i])));
  // Quantizer ranges: the output of node p feeds QuantizeLinear q (scale s, symmetric format of
  // largest value M): values beyond s * M are clipped. Several quantizers: the smallest range.
  // Behind SmoothQuant's pre-scale Mul(x, m) (m per channel of the last axis) channel c of x clips
  // beyond s * M / |m_c|: those nodes get a threshold per channel.
  om.clip_amax.assign(vg.nodes.size(), kNoClip);
  om.channel_clip_amax.assign(vg.nodes.size(), {});
  std::unordered_map<std::string, std::size_t> producer;
  for (std::size_t i = 0; i < vg.nodes.size(); ++i)
    for (const auto& o : vg.nodes[i].outputs) producer[o] = i;
  std::vector<std::vector<std::vector<float>>> smoothed(vg.nodes.size());
  for (const Node& q : vg.nodes) {
    if (q.op_type != "QuantizeLinear" && q.op_type != "TRT_FP8QuantizeLinear") continue;
    if (!q.has_input(1)) continue;
    auto s = vg.initializers.find(q.inputs[1]);
    if (s == vg.initializers.end() || s->second.numel() != 1 || s->second.dtype() != DType::kFloat32) continue;
    const float fmax = format_max_of(q, vg);
    if (fmax == 0) continue;
    const float range = s->second.data<float>()[0] * fmax;
    auto p = producer.find(q.inputs[0]);
    if (p == producer.end()) continue;
    const Node* pn = &vg.nodes[p->second];
    if (pn->op_type == "Mul" && is_quantization_plumbing(*pn) && pn->inputs.size() == 2) {
      // SmoothQuant: one operand a stored per-channel (or scalar) factor, the other the activation.
      const int w = vg.initializers.count(pn->inputs[1]) ? 1 : vg.initializers.count(pn->inputs[0]) ? 0 : -1;
      if (w < 0) continue;
      const Tensor& m = vg.initializers.at(pn->inputs[std::size_t(w)]);
      auto x = producer.find(pn->inputs[std::size_t(1 - w)]);
      if (x == producer.end() || is_quantization_plumbing(vg.nodes[x->second]) ||
          vg.nodes[x->second].outputs[0] != pn->inputs[std::size_t(1 - w)] || m.dtype() != DType::kFloat32 ||
          m.shape().size() > 1)
        continue;
      std::vector<float> per(m.span<float>().begin(), m.span<float>().end());
      for (float& v : per) v = range / std::abs(v);
      smoothed[x->second].push_back(std::move(per));
      continue;
    }
    if (is_quantization_plumbing(*pn) || pn->outputs[0] != q.inputs[0]) continue;
    float& clip = om.clip_amax[p->second];
    clip = std::min(clip, range);
  }
  for (std::size_t i = 0; i < vg.nodes.size(); ++i) {
    if (smoothed[i].empty()) continue;
    // Channel thresholds: the smallest over the node's quantizers (a scalar factor broadcasts).
    std::size_t k = 1;
    for (const auto& v : smoothed[i]) k = std::max(k, v.size());
    std::vector<float> t(k, om.clip_amax[i]);
    bool consistent = true;
    for (const auto& v : smoothed[i]) {
      if (v.size() != 1 && v.size() != k) consistent = false;
      for (std::size_t c = 0; c < k && consistent; ++c) t[c] = std::min(t[c], v[v.size() == 1 ? 0 : c]);
    }
    if (!consistent) continue;
    om.clip_amax[i] = *std::min_element(t.begin(), t.end());
    om.channel_clip_amax[i] = std::move(t);
  }
  // Quantized outputs (the QOperator form): compared dequantized with their stored scale.
  om.dequantize.assign(vg.nodes.size(), std::nullopt);
  {
    const auto quantized = quantized_values(vg);
    for (std::size_t i = 0; i < vg.nodes.size(); ++i) {
      if (vg.nodes[i].outputs.empty()) continue;
      auto q = quantized.find(vg.nodes[i].outputs[0]);
      if (q == quantized.end() || !q->second) continue;
      const Tensor& scale = vg.initializers.at(q->second->scale);
      if (scale.dtype() != DType::kFloat32) continue;
      std::int32_t zero_point = 0;
      if (!q->second->zero_point.empty()) {
        const Tensor& z = vg.initializers.at(q->second->zero_point);
        if (z.dtype() == DType::kUInt8) zero_point = z.data<std::uint8_t>()[0];
        else if (z.dtype() == DType::kInt8) zero_point = z.data<std::int8_t>()[0];
        else continue;
      }
      om.dequantize[i] = std::make_pair(scale.data<float>()[0], zero_point);
    }
  }
  // Formats: a node reading DequantizeLinear(x) runs on quantized x; x is an initializer (a stored
  // weight) or a QuantizeLinear's output.
  om.format.assign(vg.nodes.size(), "");
  for (std::size_t i = 0; i < vg.nodes.size(); ++i) {
    if (is_quantization_plumbing(vg.nodes[i])) continue;
    for (const auto& in : vg.nodes[i].inputs) {
      auto p = producer.find(in);
      if (p == producer.end()) continue;
      const Node& dq = vg.nodes[p->second];
      if (dq.op_type != "DequantizeLinear" && dq.op_type != "TRT_FP8DequantizeLinear") continue;
      std::string f;
      if (auto w = vg.initializers.find(dq.inputs[0]); w != vg.initializers.end())
        f = format_of_type(w->second.dtype());
      else if (auto q = producer.find(dq.inputs[0]); q != producer.end()) f = quantize_format(vg.nodes[q->second], vg);
      if (!f.empty() && (om.format[i].empty() || om.format[i] == f)) om.format[i] = f;
      else if (!f.empty() && om.format[i] != f) om.format[i] += "+" + f;
    }
  }
  if (local_error) {
    om.local = plan_local_runs(rg, vg, om.match);
    // What each local run waits for in a lockstep call: the reference nodes making its inputs (a
    // graph input: its first reader, which captures it) and its counterpart.
    std::unordered_map<std::string, std::size_t> ref_producer, first_reader;
    for (std::size_t i = 0; i < rg.nodes.size(); ++i) {
      for (const auto& o : rg.nodes[i].outputs)
        if (!o.empty()) ref_producer.emplace(o, i);
      for (const auto& in : rg.nodes[i].inputs)
        if (!in.empty()) first_reader.emplace(in, i);
    }
    om.local_after.assign(rg.nodes.size(), {});
    om.local_waits.assign(vg.nodes.size(), 0);
    for (std::size_t i = 0; i < vg.nodes.size(); ++i) {
      if (om.match.ref_of_variant[i] < 0 || !om.local[i].ok()) continue;
      std::vector<std::size_t> after = {std::size_t(om.match.ref_of_variant[i])};
      bool known = true;
      for (const auto& [var_value, ref_value] : om.local[i].inputs) {
        if (auto p = ref_producer.find(ref_value); p != ref_producer.end()) {
          after.push_back(p->second);
        } else if (auto r = first_reader.find(ref_value); r != first_reader.end()) {
          after.push_back(r->second);
        } else {
          known = false;  // read by no reference node: never captured
          break;
        }
      }
      if (!known) continue;
      std::sort(after.begin(), after.end());
      after.erase(std::unique(after.begin(), after.end()), after.end());
      for (std::size_t r : after) om.local_after[r].push_back(i);
      om.local_waits[i] = unsigned(after.size());
    }
  }
  om.view.assign(vg.nodes.size(), 0);
  om.feeds_view.assign(vg.nodes.size(), 0);
  for (std::size_t i = 0; i < vg.nodes.size(); ++i) {
    const Node& n = vg.nodes[i];
    if (!n.moves_data_only() || n.inputs.empty()) continue;
    om.view[i] = 1;
    if (auto p = producer.find(n.inputs[0]); p != producer.end() && vg.nodes[p->second].outputs[0] == n.inputs[0])
      om.feeds_view[p->second] = 1;
  }
  return om;
}

void Capture::start(const ModelCall& c, const LayerSpace& space, int model_index) {
  // Slots are kept across calls and models (a layer belongs to one model; stale slots are told
  // apart by their generation): the copies of the next call of the same model reuse their storage
  // instead of faulting in fresh pages (the VAE decoder's values are ~1 MB each).
  if (space_ != &space) {
    slots_.clear();
    outputs_.clear();
  }
  space_ = &space;
  model_index_ = model_index;
  outputs_.resize(space.layers());
  model = std::string(c.model);
  step = c.step;
  call = c.call;
  valid = true;
  ++generation_;
  waiting_.clear();
  waiting_named_.clear();
  ran_now_.clear();
}

void Capture::forget() {
  auto leftover = [&](Slot& s) {
    if (s.pending == 0 || s.generation != generation_) return;
    s.group.reset();
    s.whole = Tensor();
    s.kept.let_go();  // a taken-over buffer goes back to its pool now
    s.generation = 0;
    s.pending = 0;
  };
  for (std::size_t layer : waiting_) leftover(outputs_[layer]);
  for (Slot* s : waiting_named_) leftover(*s);
  waiting_.clear();
  waiting_named_.clear();
  valid = false;
}

const Tensor* Capture::find(const std::string& name) const {
  if (const Value v = value(name); v.tensor) return v.tensor;
  const int layer =
      valid && space_ && model_index_ >= 0 ? space_->layer_of_output(std::size_t(model_index_), name) : -1;
  return layer >= 0 ? output(std::size_t(layer)).tensor : nullptr;
}

void Capture::mark_ran(std::size_t layer, bool measured) {
  if (ran_.size() <= layer) ran_.resize(layer + 1, 0), measured_.resize(layer + 1, 0);
  ran_[layer] = generation_;
  measured_[layer] = measured;
  ran_now_.push_back(layer);
}

void Capture::fill(Slot& s, const Tensor& value, KeptValue kept, std::optional<double> energy) {
  s.generation = generation_;
  s.energy = energy;
  s.group.reset();
  s.whole = Tensor();
  s.kept = borrowing ? std::move(kept) : KeptValue();
  if (s.kept) return;
  // A copy where the value is (a device's memory, or the host's), in the slot's buffer when it fits.
  if (s.tensor.device() == value.device() && s.tensor.reuse_as(value.dtype(), value.shape())) {
    if (value.on_device()) value.device()->copy(s.tensor.device_data(), value.device_data(), value.nbytes());
    else std::memcpy(s.tensor.raw(), value.raw(), value.nbytes());
    return;
  }
  s.tensor = value;
}

Capture::Value Capture::read(const Slot& s) const {
  if (!valid || s.generation != generation_) return {};
  if (s.group) {
    // A reader that needs the whole value (a variant's node not streamed, a local run): computed
    // again, held until the layer's next consumed().
    const Shape& shape = s.group->shapes[s.member];
    if (s.whole.shape() != shape || s.whole.dtype() != DType::kFloat32) {
      s.whole = Tensor(DType::kFloat32, shape);
      std::vector<float*> dst(s.group->shapes.size(), nullptr);
      dst[s.member] = s.whole.data<float>();
      const std::int64_t row_len = shape.empty() ? 1 : std::max<std::int64_t>(shape.back(), 1);
      s.group->compute(0, s.whole.numel() / row_len, dst);
    }
    return Value{&s.whole, s.energy};
  }
  const Tensor* t = s.kept ? s.kept.get() : &s.tensor;
  return t ? Value{t, s.energy} : Value{};
}

void Capture::keep(const std::string& name, const Tensor& value, KeptValue kept, std::optional<double> energy,
                   unsigned readers) {
  Slot& s = slots_[name];
  fill(s, value, std::move(kept), energy);
  s.pending = s.kept ? readers : 0;
  if (s.pending) waiting_named_.push_back(&s);
  else s.kept.let_go();  // no reader to come: readable while the execution holds it, no longer
}

void Capture::keep_output(std::size_t layer, const Tensor& value, KeptValue kept, std::optional<double> energy,
                          unsigned readers) {
  Slot& s = outputs_.at(layer);
  fill(s, value, std::move(kept), energy);
  s.pending = s.kept ? readers : 0;
  if (s.pending) waiting_.push_back(layer);
  else s.kept.let_go();
}

void Capture::keep_recomputed(std::size_t layer, std::shared_ptr<RecomputedGroup> group, std::size_t member,
                              std::optional<double> energy, unsigned readers) {
  Slot& s = outputs_.at(layer);
  s.kept = KeptValue();
  s.whole = Tensor();
  s.energy = energy;
  s.pending = readers;
  s.generation = readers ? generation_ : 0;  // nobody reads it: nothing to keep
  s.group = readers ? std::move(group) : nullptr;
  s.member = member;
  waiting_.push_back(layer);
}

Capture::Recomputed Capture::recomputed(std::size_t layer) const {
  if (layer >= outputs_.size()) return {};
  const Slot& s = outputs_[layer];
  if (!valid || s.generation != generation_ || !s.group) return {};
  return Recomputed{s.group.get(), s.member, s.energy};
}

void Capture::consumed(std::size_t layer) {
  if (layer < outputs_.size()) consumed(outputs_[layer]);
}

void Capture::consumed(const std::string& name) {
  if (auto it = slots_.find(name); it != slots_.end()) consumed(it->second);
}

void Capture::consumed(Slot& s) {
  if (s.group && s.generation == generation_ && s.pending > 0) {
    s.whole = Tensor();  // computed again for the next reader (a whole member is ~1 GB at full size)
    if (--s.pending > 0) return;
    s.group.reset();
    s.generation = 0;
    std::erase_if(waiting_, [&](std::size_t layer) { return outputs_[layer].pending == 0; });
    return;
  }
  if (s.generation != generation_ || s.pending == 0 || --s.pending > 0 || !s.kept) return;
  // Read for the last time. A value the execution has freed (its buffer is the handle's): the
  // buffer goes back to the reference's pool now (kept here, the capture would hold a buffer per
  // such layer: ~58 MB per worker on tiny-sd, fresh pages all), and the value is gone. One the
  // execution still uses stays readable until it frees it.
  if (s.kept.owned()) s.generation = 0;
  s.kept.let_go();
  // Readers usually compare right after the reference's node (run_lockstep): the lists hold the
  // last node's output or nothing.
  std::erase_if(waiting_, [&](std::size_t layer) { return outputs_[layer].pending == 0; });
  std::erase_if(waiting_named_, [&](const Slot* w) { return w->pending == 0; });
}

Capture::Value Capture::value(const std::string& name) const {
  auto it = slots_.find(name);
  return it == slots_.end() ? Value{} : read(it->second);
}

Capture::Value Capture::output(std::size_t layer) const {
  return layer < outputs_.size() ? read(outputs_[layer]) : Value{};
}

unsigned RunObservation::named_readers_of(int model, const std::string& name) const {
  if (model < 0 || std::size_t(model) >= named_readers.size()) return 0;
  const auto& of_model = named_readers[std::size_t(model)];
  const auto it = of_model.find(name);
  return it == of_model.end() ? 0 : it->second;
}

void RunObservation::count_readers() {
  readers.assign(space->layers(), 0);
  named_readers.assign(space->models().size(), {});
  for (std::size_t v = 0; v < variants.size(); ++v) {
    if (v == reference) continue;
    for (std::size_t m = 0; m < variants[v].models.size(); ++m) {
      const ObservedModel& om = variants[v].models[m];
      for (int layer : om.layer_of_node)
        if (layer >= 0) ++readers[std::size_t(layer)];
      // Local runs in lockstep read their counterpart's output and their inputs (LockstepLocalErrors).
      for (std::size_t i = 0; i < om.local_waits.size(); ++i) {
        if (!om.local_waits[i]) continue;
        ++readers[std::size_t(om.layer_of_node[i])];
        for (const auto& [var_value, ref_value] : om.local[i].inputs) {
          const int l = space->layer_of_output(m, ref_value);
          if (l >= 0) ++readers[std::size_t(l)];
          else ++named_readers[m][ref_value];
        }
      }
    }
  }
}

UnitObservation RunObservation::make_unit() const {
  UnitObservation u;
  u.calls.resize(variants.size());
  // A unit's events: about one per layer and step.
  std::size_t events = 0;
  for (std::size_t l = 0; l < space->layers(); ++l) events += std::size_t(space->cells_of(l));
  for (CallLog& log : u.calls) log.reserve(events);
  u.first_nonfinite.resize(variants.size());
  return u;
}

}  // namespace qeval::eval
