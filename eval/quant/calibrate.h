// Calibration: range observers on the FP32 reference collect per-step statistics of every
// activation a recipe quantizes; the recipe's method turns them into amax values; SmoothQuant
// scales are derived (one alpha, or searched per layer). Results are cached by recipe + model +
// calibration-set fingerprints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/exec/device_scan.h"
#include "eval/exec/graph.h"
#include "eval/exec/session.h"
#include "eval/quant/recipe.h"
#include "eval/quant/select.h"

namespace qeval::eval::quant {

// The calibrated range of one quantized activation (node input).
struct ActivationRange {
  std::string node;
  std::size_t input = 0;
  std::string role;
  float amax = 0;                // what the recipe's method chose (after smoothing, if any)
  std::vector<float> step_max;   // max |x| per step (index = step; NaN for a step never seen)
  std::vector<float> step_mean;  // mean over calls of the per-call amax, per step
  std::string note;              // e.g. "no non-zero value seen: amax set to 1"
};

// SmoothQuant for one linear layer: X' = X / s, W' = diag(s) W, s_j = amax_x_j^a / amax_w_j^(1-a).
struct Smoothing {
  std::string node;
  double alpha = 0;
  std::vector<float> scale;            // s_j per input channel
  double mse = 0, mse_unsmoothed = 0;  // layer output MSE on the sampled rows (alpha search only)
};

struct CalibrationResult {
  std::string recipe_fingerprint, model_fingerprint, data_fingerprint;
  std::string recipe_name;
  std::string method;
  int total_steps = 0;
  long calls = 0;  // model runs observed
  double elapsed_s = 0;
  std::vector<ActivationRange> activations;    // selection order
  std::map<std::string, Smoothing> smoothing;  // by node

  const ActivationRange* find(const std::string& node, std::size_t input) const;
  const Smoothing* smoothing_for(const std::string& node) const;
  nlohmann::json to_json() const;
  // Throws InputError naming `source` and the key on malformed content.
  static CalibrationResult from_json(const nlohmann::json& j, const std::string& source);
};

// Observes FP32 runs: for every selected node, the statistics of its quantized inputs, filed under
// the current step.
// On a device backend the ranges are measured where the values are: each input's largest |x| by a
// scan queued on the device (eval/exec/device_scan.h, read back every few thousand scans), and
// SmoothQuant's per-channel ranges folded into device buffers read once at finish(); what only
// the host computes (histograms, the alpha search's rows) gets a host copy.
class RangeCollector : public Observer {
 public:
  RangeCollector(const Graph& graph, const Selection& selection, const Recipe& recipe);
  ~RangeCollector() override;
  void set_step(int step) { step_ = step; }
  void on_node(const NodeEvent& event) override;
  bool reads_device_values() const override { return true; }
  long calls() const { return calls_; }
  // Computes amax values (and SmoothQuant scales) from what was collected over `total_steps`
  // steps. Throws InputError when a selected node was never seen (the calibration set does not
  // reach it).
  CalibrationResult finish(int total_steps);

 private:
  struct Slot;
  struct Pending {  // a queued scan's slot and step
    std::size_t slot;
    int step;
  };
  void collect_on_host(Slot& s, const Tensor& x, bool amax, bool channels);
  bool queue_amax(std::size_t slot, const Tensor& x);
  bool channel_amax_on_device(Slot& s, const Tensor& x);
  void flush();  // the queued scans' amax into their slots, in the order queued
  QueuedScans<Pending> queued_;
  Tensor host_copy_;
  const Graph& graph_;
  const Recipe& recipe_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unordered_map<std::string, std::vector<std::size_t>> by_node_;
  std::vector<QuantTarget> targets_;
  int step_ = 0;
  long calls_ = 0;
  std::string first_node_;
};

// A calibration set: what runs through the FP32 reference, and in which steps.
class CalibrationSet {
 public:
  virtual ~CalibrationSet() = default;
  virtual std::string fingerprint() const = 0;  // content hash (files, prompts, seeds, steps)
  virtual std::string describe() const = 0;
  // Runs every sample through `reference` with `collector` as observer, calling set_step before
  // each model call (step 0 when the set has no steps). Returns the number of steps.
  virtual int run(const Graph& reference, RangeCollector& collector) = 0;
  // Set by calibrate() before run(): progress lines say which recipe they calibrate.
  std::string recipe_name;
};

// Samples of named input tensors for one model: a folder with one sub-folder per sample, each
// holding <input>.npy (the `qeval infer --inputs` layout), or a folder holding one sample's files.
class TensorCalibrationSet : public CalibrationSet {
 public:
  static TensorCalibrationSet from_folder(const std::filesystem::path& dir, const Graph& graph);
  explicit TensorCalibrationSet(std::vector<std::map<std::string, Tensor>> samples, std::string name = "samples");
  std::string fingerprint() const override;
  std::string describe() const override;
  int run(const Graph& reference, RangeCollector& collector) override;
  std::size_t size() const { return samples_.size(); }

 private:
  std::vector<std::map<std::string, Tensor>> samples_;
  std::string name_;
};

// The samples of a tensor folder (the `qeval infer --inputs` layout): its sub-folders in name
// order, or the folder itself when it has none. InputError when it does not exist.
std::vector<std::filesystem::path> tensor_sample_folders(const std::filesystem::path& dir);
// One sample: <input name>.npy (file_name_for) for every input of `graph`; InputError naming the
// folder and the missing file.
std::map<std::string, Tensor> read_tensor_sample(const std::filesystem::path& folder, const Graph& graph);

// Hash of a graph's content (nodes, attributes, initializer bytes), 16 hex digits.
std::string graph_fingerprint(const Graph& graph);

// Runs the calibration set and computes the result (no cache).
CalibrationResult calibrate(const Graph& graph, const Selection& selection, const Recipe& recipe, CalibrationSet& set);

// As calibrate, reusing <cache_dir>/<key>.json when present (key: recipe + model + data
// fingerprints) and storing new results there. `cache_hit` says which happened.
CalibrationResult calibrate_cached(const Graph& graph, const Selection& selection, const Recipe& recipe,
                                   CalibrationSet& set, const std::filesystem::path& cache_dir,
                                   bool* cache_hit = nullptr);
std::string calibration_cache_key(const std::string& recipe_fp, const std::string& model_fp,
                                  const std::string& data_fp);

}  // namespace qeval::eval::quant
