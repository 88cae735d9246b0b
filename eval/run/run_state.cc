// Run states: MessagePack (written directly, read through nlohmann::json), exact sums stored as
// their partials.
#include "eval/run/run_state.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/files.h"
#include "base/input_file.h"
#include "eval/quant/calibrate.h"
#include "eval/quant/recipe.h"
#include "eval/run/pipeline_kind.h"
#include "kernels/error.h"
#include "qeval/version.h"

namespace qeval::eval {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "qeval.run-state";
constexpr int kVersion = 1;
// Part of every run key: bump it when what the pooled statistics mean changes (2: sampled
// histograms, float-lane sums; 3: the lanes summed in two interleaved sets), so that a state saved
// by an older qeval is another run's.
constexpr int kStatisticsVersion = 3;

std::string precision_text(Precision p) { return std::string(precision_name(p)); }

metrics::ExactSum sum_from(const json& a) {
  std::vector<double> parts;
  for (std::size_t i = 1; i < a.size(); ++i) parts.push_back(a[i].get<double>());
  return metrics::ExactSum::from_parts(parts, a.at(0).get<double>());
}

metrics::ActivationStats act_from(const json& j) {
  metrics::ActivationStats a;
  a.count = j.at(0).get<std::uint64_t>();
  a.nan = j.at(1).get<std::uint64_t>();
  a.inf = j.at(2).get<std::uint64_t>();
  a.clipped = j.at(3).get<std::uint64_t>();
  a.calls = j.at(4).get<std::uint64_t>();
  a.sum = sum_from(j.at(5));
  a.sum_sq = sum_from(j.at(6));
  a.absmax = j.at(7).get<float>();
  a.abs_hist = metrics::LogAbsHistogram::from_counts(j.at(8).get<int>(), j.at(9).get<std::vector<std::uint64_t>>());
  return a;
}

metrics::ErrorStats err_from(const json& j) {
  metrics::ErrorStats e;
  e.count = j.at(0).get<std::uint64_t>();
  e.nonfinite = j.at(1).get<std::uint64_t>();
  e.calls = j.at(2).get<std::uint64_t>();
  e.ref_sq = sum_from(j.at(3));
  e.err_sq = sum_from(j.at(4));
  e.cosine_sum = sum_from(j.at(5));
  e.cosine_calls = j.at(6).get<std::uint64_t>();
  e.max_abs = j.at(7).get<double>();
  return e;
}

json opt(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json sample_json(const SampleOutcome& s) {
  json vs = json::array();
  for (const auto& o : s.variants) {
    json m = json::array();
    for (const auto& mv : o.metrics) {
      json pc = json::array();
      for (const auto& c : mv.per_channel) pc.push_back(opt(c));
      m.push_back(json::array({mv.key, opt(mv.value), mv.note, pc}));
    }
    vs.push_back({{"e", o.error},
                  {"m", m},
                  {"i", o.identical},
                  {"t", o.elapsed_ms},
                  {"ip", o.image_path},
                  {"hp", o.heatmap_path},
                  {"tp", json::binary(o.thumbnail_png)},
                  {"hm", json::binary(o.heatmap_png)},
                  {"hl", o.heatmap_legend},
                  {"xp", o.heatmap_x8_path},
                  {"xm", json::binary(o.heatmap_x8_png)}});
  }
  return {{"id", s.id}, {"prompt", s.prompt}, {"seed", s.seed ? json(*s.seed) : json(nullptr)}, {"v", vs}};
}

std::optional<double> opt_from(const json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<double>();
}

SampleOutcome sample_from(const json& j) {
  SampleOutcome s;
  s.id = j.at("id").get<std::string>();
  s.prompt = j.at("prompt").get<std::string>();
  if (!j.at("seed").is_null()) s.seed = j.at("seed").get<std::uint64_t>();
  for (const auto& v : j.at("v")) {
    VariantOutcome o;
    o.error = v.at("e").get<std::string>();
    for (const auto& m : v.at("m")) {
      metrics::MetricValue mv;
      mv.key = m.at(0).get<std::string>();
      mv.value = opt_from(m.at(1));
      mv.note = m.at(2).get<std::string>();
      for (const auto& c : m.at(3)) mv.per_channel.push_back(opt_from(c));
      o.metrics.push_back(std::move(mv));
    }
    o.identical = v.at("i").get<bool>();
    o.elapsed_ms = v.at("t").get<double>();
    o.image_path = v.at("ip").get<std::string>();
    o.heatmap_path = v.at("hp").get<std::string>();
    o.thumbnail_png = v.at("tp").get_binary();
    o.heatmap_png = v.at("hm").get_binary();
    o.heatmap_legend = v.at("hl").get<std::string>();
    if (v.contains("xp")) {  // states saved before the amplified view have none
      o.heatmap_x8_path = v.at("xp").get<std::string>();
      o.heatmap_x8_png = v.at("xm").get_binary();
    }
    s.variants.push_back(std::move(o));
  }
  return s;
}

json read_state_json(const fs::path& file) {
  // A FIFO, folder or device in the state's place is named, not waited on (std::ifstream blocked).
  const std::vector<std::uint8_t> bytes = base::read_regular_file(file);
  json j;
  try {
    j = json::from_msgpack(bytes);
  } catch (const json::exception& e) {
    throw InputError(file.string() + ": not a qeval run state (" + e.what() + ")");
  }
  if (!j.is_object() || j.value("format", "") != kFormat)
    throw InputError(file.string() + ": not a qeval run state (format '" + std::string(kFormat) + "' expected)");
  if (j.value("version", 0) != kVersion)
    throw InputError(file.string() + ": run state version " + std::to_string(j.value("version", 0)) +
                     ", this qeval reads version " + std::to_string(kVersion));
  return j;
}

}  // namespace

std::string run_spec_json(const RunSpec& s) {
  json j;
  j["pipeline"] = fs::absolute(s.pipeline).string();
  if (!s.inputs.empty()) j["prompts"] = fs::absolute(s.inputs).string();
  j["first"] = s.first;
  j["count"] = s.count;
  j["seeds"] = s.seeds;
  if (s.steps) j["steps"] = *s.steps;
  if (s.guidance_scale) j["guidance_scale"] = *s.guidance_scale;
  if (s.scheduler) j["scheduler"] = std::string(scheduler_type_name(*s.scheduler));
  if (s.negative_prompt) j["negative_prompt"] = *s.negative_prompt;
  j["variants"] = json::array();
  for (const auto& v : s.variants) {
    json vj = {{"name", v.name}, {"precision", precision_text(v.precision)}};
    if (!v.recipe.empty()) vj["recipe"] = fs::absolute(v.recipe).string();
    if (!v.onnx.empty()) {
      json o = json::object();
      for (const auto& [m, p] : v.onnx) o[m] = fs::absolute(p).string();
      vj["onnx"] = o;
    }
    if (!v.pipeline_variant.empty()) vj["pipeline_variant"] = v.pipeline_variant;
    for (const auto& [m, p] : v.model_precision) vj["model_precision"][m] = precision_text(p);
    j["variants"].push_back(vj);
  }
  j["reference"] = s.reference;
  json o = {{"layers", s.observe.layers},
            {"models", s.observe.models},
            {"local_error", s.observe.local_error},
            {"full_tensors", s.observe.full_tensors},
            {"histograms", s.observe.histograms}};
  if (pipeline_kind(s.kind).denoising) o["teacher_forced"] = s.observe.teacher_forced;
  j["observe"] = o;
  json c = {{"count", s.calibration.count}, {"steps", s.calibration.steps}};
  if (!s.calibration.prompts.empty()) c["prompts"] = fs::absolute(s.calibration.prompts).string();
  if (!s.calibration.cache.empty()) c["cache"] = fs::absolute(s.calibration.cache).string();
  j["calibration"] = c;
  if (!s.gate.empty()) j["gate"] = fs::absolute(s.gate).string();
  j["save_images"] = s.save_images;
  if (!s.outputs.empty()) {  // only when set: configs without it keep their run keys
    json outs = json::object();
    for (const auto& out : s.outputs) {
      json oj = {{"kind", std::string(output_kind_name(out.kind))}};
      if (out.kind == OutputKind::kMask || out.kind == OutputKind::kMatte) oj["threshold"] = out.threshold;
      if (out.kind == OutputKind::kImage) oj["range"] = {out.range_lo, out.range_hi};
      outs[out.name] = oj;
    }
    j["outputs"] = outs;
  }
  return j.dump(1);
}

std::string run_key(const RunSpec& spec, const RunDriver& driver, const std::vector<BuiltVariant>& variants) {
  RunSpec keyed = spec;
  keyed.gate.clear();               // judges the numbers, does not change them
  keyed.calibration.cache.clear();  // where scales are kept
  keyed.count = 0;                  // how many units: checked unit by unit (run_state_fits)
  std::string all = std::string("qeval ") + QEVAL_VERSION + " statistics " + std::to_string(kStatisticsVersion) +
                    " units by id\n" + run_spec_json(keyed) + "\n";
  // The prompt or input set's content (a folder of samples: its listing).
  const fs::path inputs = driver.description().inputs.path;
  if (fs::is_regular_file(inputs)) {
    all += base::read_regular_file_text(inputs);
  } else if (fs::is_directory(inputs)) {
    for (const auto& p : quant::tensor_sample_folders(inputs)) all += p.string() + "\n";
  }
  for (const auto& v : variants)
    for (const auto& [model, graph] : v.graphs)
      all += v.spec.name + "/" + model + "=" + quant::graph_fingerprint(*graph) + "\n";
  return quant::fnv1a64_hex(all.data(), all.size());
}

namespace {

// MessagePack written directly (what json::to_msgpack writes for the same values, read back by
// json::from_msgpack): the pooled layer cells are most of a state (tens of MB) and building them as
// a json tree first cost a second per checkpoint.
// Written through a fixed buffer straight to the file (the state of a tiny-sd run is ~19 MB: built
// in memory first it was that much fresh memory, i.e. page faults, at every checkpoint).
class MsgPack {
 public:
  explicit MsgPack(base::AtomicFileWriter& out) : out_(out) {}
  void finish() {
    flush();
    out_.commit();
  }

  void array(std::size_t n) { header(n, 0x90, 0xdc, 0xdd); }
  void map(std::size_t n) { header(n, 0x80, 0xde, 0xdf); }
  void uint(std::uint64_t v) {
    if (v < 128) return put(std::uint8_t(v));
    if (v <= 0xff) return put(0xcc), put(std::uint8_t(v));
    if (v <= 0xffff) return put(0xcd), be(v, 2);
    if (v <= 0xffffffffu) return put(0xce), be(v, 4);
    put(0xcf), be(v, 8);
  }
  void real(double v) { put(0xcb), be(std::bit_cast<std::uint64_t>(v), 8); }
  void str(std::string_view s) {
    if (s.size() < 32) put(std::uint8_t(0xa0 | s.size()));
    else if (s.size() <= 0xff) put(0xd9), put(std::uint8_t(s.size()));
    else if (s.size() <= 0xffff) put(0xda), be(s.size(), 2);
    else put(0xdb), be(s.size(), 4);
    raw(s);
  }
  void value(const json& j) {  // a small part built as json
    const std::vector<std::uint8_t> b = json::to_msgpack(j);
    raw(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  }
  void sum(const metrics::ExactSum& s) {
    array(1 + s.partials().size());
    real(s.special());
    for (double p : s.partials()) real(p);
  }
  void act(const metrics::ActivationStats& a) {  // read by act_from
    array(10);
    uint(a.count), uint(a.nan), uint(a.inf), uint(a.clipped), uint(a.calls);
    sum(a.sum), sum(a.sum_sq);
    real(a.absmax);
    uint(std::uint64_t(a.abs_hist.first()));
    array(a.abs_hist.bins());
    for (std::size_t i = 0; i < a.abs_hist.bins(); ++i) uint(a.abs_hist.at(i));
  }
  void err(const metrics::ErrorStats& e) {  // read by err_from
    array(8);
    uint(e.count), uint(e.nonfinite), uint(e.calls);
    sum(e.ref_sq), sum(e.err_sq), sum(e.cosine_sum);
    uint(e.cosine_calls);
    real(e.max_abs);
  }

 private:
  static constexpr std::size_t kBuffer = std::size_t(1) << 16;
  void flush() {
    out_.write(std::string_view(reinterpret_cast<const char*>(buf_.data()), n_));
    n_ = 0;
  }
  void put(std::uint8_t b) {
    if (n_ == kBuffer) flush();
    buf_[n_++] = b;
  }
  void be(std::uint64_t v, int n) {
    if (n_ + 8 > kBuffer) flush();
    for (int i = n - 1; i >= 0; --i) buf_[n_++] = std::uint8_t(v >> (8 * i));
  }
  void raw(std::string_view b) {
    if (n_ + b.size() > kBuffer) flush();
    if (b.size() > kBuffer) return out_.write(b);
    std::memcpy(buf_.data() + n_, b.data(), b.size());
    n_ += b.size();
  }
  base::AtomicFileWriter& out_;
  std::vector<std::uint8_t> buf_ = std::vector<std::uint8_t>(kBuffer);
  std::size_t n_ = 0;
  void header(std::size_t n, std::uint8_t fix, std::uint8_t b16, std::uint8_t b32) {
    if (n < 16) return put(std::uint8_t(fix | n));
    if (n <= 0xffff) return put(b16), be(n, 2);
    put(b32), be(n, 4);
  }
};

}  // namespace

std::string unit_uid(const RunDriver& driver, std::size_t index) {
  const UnitInfo u = driver.unit(index);
  return u.contents.empty() ? u.id : u.id + " [" + u.contents + "]";
}

void save_run_state(const fs::path& file, const RunResult& r, const RunDriver& driver, const std::string& key,
                    const std::string& spec_json, const fs::path& source) {
  json done = json::array(), uids = json::array(), units = json::array();
  for (std::size_t i = 0; i < r.units.size(); ++i) {
    if (!r.done[i]) continue;
    done.push_back(i);
    uids.push_back(unit_uid(driver, i));
    json samples = json::array();
    for (const auto& s : r.units[i].samples) samples.push_back(sample_json(s));
    units.push_back(samples);
  }
  json nonfinite = json::array();
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    const auto& hit = r.first_nonfinite[v];
    nonfinite.push_back(
        hit ? json::array({hit->unit, hit->sample, hit->step, hit->model, hit->node, hit->op, hit->nan, hit->inf})
            : json(nullptr));
  }
  base::AtomicFileWriter file_out(file);
  MsgPack m(file_out);
  m.map(14);
  m.str("format"), m.str(kFormat);
  m.str("version"), m.uint(kVersion);
  m.str("tool"), m.str(QEVAL_VERSION);
  m.str("key"), m.str(key);
  m.str("spec"), m.str(spec_json);
  m.str("source"), m.str(source.string());
  m.str("total"), m.uint(r.units.size());
  m.str("elapsed_s"), m.real(r.elapsed_before_s + r.elapsed_s);
  m.str("done"), m.value(done);
  m.str("uids"), m.value(uids);
  m.str("units"), m.value(units);
  // layers: per variant, [layer, [[act, acc, local] per step]] for each layer with cells.
  m.str("layers");
  m.array(r.variants.size());
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    const LayerCells& cells = r.layers[v];
    std::size_t with_cells = 0;
    for (std::size_t l = 0; l < cells.layers(); ++l) with_cells += cells.has(l);
    m.array(with_cells);
    for (std::size_t l = 0; l < cells.layers(); ++l) {
      if (!cells.has(l)) continue;
      const int steps = cells.space()->cells_of(l);
      m.array(2);
      m.uint(l);
      m.array(std::size_t(steps));
      for (int s = 0; s < steps; ++s) {
        const LayerCell& c = *cells.find(l, s);
        m.array(3);
        m.act(c.act), m.err(c.acc), m.err(c.local());
      }
    }
  }
  m.str("series");  // per variant: [quantity, mode, [error per step]]
  m.array(r.variants.size());
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    m.array(r.series[v].size());
    for (const auto& st : r.series[v]) {
      m.array(3);
      m.str(st.quantity), m.str(st.mode);
      m.array(st.steps.size());
      for (const auto& x : st.steps) m.err(x);
    }
  }
  m.str("nonfinite"), m.value(nonfinite);
  m.finish();
}

RunStateInfo read_run_state_info(const fs::path& file) {
  const json j = read_state_json(file);
  RunStateInfo info;
  try {
    info.key = j.at("key").get<std::string>();
    info.spec_json = j.at("spec").get<std::string>();
    info.tool_version = j.at("tool").get<std::string>();
    info.source = j.at("source").get<std::string>();
    info.total_units = j.at("total").get<std::size_t>();
    info.done = j.at("done").get<std::vector<std::size_t>>();
    if (j.contains("uids")) info.done_uids = j.at("uids").get<std::vector<std::string>>();
    if (j.contains("elapsed_s")) info.elapsed_s = j.at("elapsed_s").get<double>();
  } catch (const json::exception& e) {
    throw InputError(file.string() + ": malformed run state (" + e.what() + ")");
  }
  return info;
}

std::string run_state_fits(const RunStateInfo& info, const RunDriver& driver) {
  if (info.done_uids.size() != info.done.size()) return "it does not record its units' ids";
  for (std::size_t k = 0; k < info.done.size(); ++k) {
    const std::size_t i = info.done[k];
    if (i >= driver.units())
      return fmt::format("it holds unit {} ({}) and this run has {} units (a smaller count?)", i, info.done_uids[k],
                         driver.units());
    if (const std::string now = unit_uid(driver, i); now != info.done_uids[k])
      return fmt::format("its unit {} is {}, this run's is {}", i, info.done_uids[k], now);
  }
  return {};
}

void merge_run_state(const fs::path& file, const std::string& key, const RunDriver& driver, RunResult& into) {
  const json j = read_state_json(file);
  const std::string where = file.string();
  try {
    if (j.at("key").get<std::string>() != key)
      throw InputError(where + ": the state is of another run (config, models, prompts or qeval version differ: key " +
                       j.at("key").get<std::string>() + ", this run's " + key + ")");
    {
      RunStateInfo info;
      info.done = j.at("done").get<std::vector<std::size_t>>();
      if (j.contains("uids")) info.done_uids = j.at("uids").get<std::vector<std::string>>();
      if (const std::string why = run_state_fits(info, driver); !why.empty())
        throw InputError(where + ": the state's units are not this run's: " + why);
    }
    if (j.contains("elapsed_s")) into.elapsed_before_s += j.at("elapsed_s").get<double>();
    const auto done = j.at("done").get<std::vector<std::size_t>>();
    const json& units = j.at("units");
    for (std::size_t k = 0; k < done.size(); ++k) {
      const std::size_t i = done[k];
      if (i >= into.units.size()) throw InputError(where + ": unit " + std::to_string(i) + " out of range");
      if (into.done[i])
        throw InputError(where + ": unit " + std::to_string(i) + " is already in the run (overlapping shards?)");
      UnitOutcome u;
      for (const auto& s : units.at(k)) u.samples.push_back(sample_from(s));
      into.units[i] = std::move(u);
      into.done[i] = 1;
      ++into.reused;
    }
    const std::size_t nv = into.variants.size();
    if (j.at("layers").size() != nv) throw InputError(where + ": the state has another number of variants");
    for (std::size_t v = 0; v < nv; ++v) {
      LayerCells cells(into.observation.space);
      for (const auto& entry : j.at("layers")[v]) {
        const std::size_t l = entry.at(0).get<std::size_t>();
        const json& cs = entry.at(1);
        if (l >= into.observation.space->layers() || int(cs.size()) != into.observation.space->cells_of(l))
          throw InputError(where + ": layer " + std::to_string(l) + " does not fit this run's layers");
        for (std::size_t s = 0; s < cs.size(); ++s) {
          LayerCell& c = cells.at(l, int(s));
          c.act = act_from(cs[s].at(0));
          c.acc = err_from(cs[s].at(1));
          if (const auto local = err_from(cs[s].at(2)); local.calls) c.local_mut() = local;
        }
      }
      into.layers[v].merge(cells);
      std::vector<StepSeries> series;
      for (const auto& st : j.at("series")[v]) {
        StepSeries ss{st.at(0).get<std::string>(), st.at(1).get<std::string>(), {}};
        for (const auto& e : st.at(2)) ss.steps.push_back(err_from(e));
        series.push_back(std::move(ss));
      }
      if (!series.empty()) {
        if (into.series[v].empty()) {
          into.series[v] = std::move(series);
        } else {
          for (std::size_t k = 0; k < series.size() && k < into.series[v].size(); ++k)
            for (std::size_t s = 0; s < series[k].steps.size() && s < into.series[v][k].steps.size(); ++s)
              into.series[v][k].steps[s].merge(series[k].steps[s]);
        }
      }
      const json& h = j.at("nonfinite")[v];
      if (!h.is_null()) {
        NonFiniteHit hit{h.at(0).get<std::size_t>(),   h.at(1).get<std::string>(),  h.at(2).get<int>(),
                         h.at(3).get<std::string>(),   h.at(4).get<std::string>(),  h.at(5).get<std::string>(),
                         h.at(6).get<std::uint64_t>(), h.at(7).get<std::uint64_t>()};
        auto& first = into.first_nonfinite[v];
        if (!first || hit.unit < first->unit) first = hit;
      }
    }
  } catch (const json::exception& e) {
    throw InputError(where + ": malformed run state (" + e.what() + ")");
  }
}

std::vector<std::size_t> shard_units(std::size_t units, int shard, int shards) {
  const std::size_t lo = units * std::size_t(shard - 1) / std::size_t(shards);
  const std::size_t hi = units * std::size_t(shard) / std::size_t(shards);
  std::vector<std::size_t> out;
  for (std::size_t i = lo; i < hi; ++i) out.push_back(i);
  return out;
}

std::pair<int, int> parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  int i = 0, n = 0;
  try {
    std::size_t a = 0, b = 0;
    if (slash == std::string::npos) throw std::invalid_argument("");
    i = std::stoi(text.substr(0, slash), &a);
    n = std::stoi(text.substr(slash + 1), &b);
    if (a != slash || b != text.size() - slash - 1) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw InputError("--shard '" + text + "': expected I/N, e.g. 2/8 (shard I of N, 1-based)");
  }
  if (n < 1 || i < 1 || i > n) throw InputError("--shard '" + text + "': I must be in 1..N and N >= 1");
  return {i, n};
}

}  // namespace qeval::eval
