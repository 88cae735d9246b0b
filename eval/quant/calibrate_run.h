// `qeval calibrate`: load a model and a recipe, calibrate on a calibration set (cached), apply the
// recipe and write scales.json and the Q/DQ export quantized.onnx.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "eval/quant/apply.h"
#include "eval/quant/calibrate.h"

namespace qeval::eval::quant {

struct CalibrateOptions {
  std::filesystem::path recipe;
  std::filesystem::path model;     // single-model calibration: the .onnx ...
  std::filesystem::path data;      // ... and its calibration samples (TensorCalibrationSet::from_folder)
  std::filesystem::path pipeline;  // txt2img: the UNet per step; segmentation: encoder and decoder ...
  std::filesystem::path prompts;   // ... on these prompts (default: pipeline.json's calibration set)
  std::size_t limit = 0;           // at most this many prompts (0 = all)
  int steps = 0;                   // denoising steps (0 = the pipeline's default)
  bool progress = false;           // progress line on stderr
  std::filesystem::path out;       // scales.json, quantized.onnx (segmentation: in <out>/<model>/)
  std::optional<std::filesystem::path> cache_dir;  // nullopt: no cache
};

// One model that was calibrated and exported.
struct CalibratedModel {
  std::string name;             // the pipeline's key ("image_encoder", ...); "" when it is the only one
  std::filesystem::path model;  // the model file that was quantized
  std::filesystem::path out;    // the folder holding its scales.json and quantized.onnx
  Selection selection;
  CalibrationResult calibration;
  bool cache_hit = false;
  std::string data_description;
  int quantized_activations = 0, quantized_weights = 0, smoothed_layers = 0;
  int opset_from = 0, opset_to = 0;
  int opset_rewritten_nodes = 0;  // nodes the opset upgrade rewrote
};

struct CalibrateSummary {
  Recipe recipe;
  std::vector<CalibratedModel> models;  // a segmentation pipeline: each model the recipe selects nodes in
  std::vector<std::string> left_fp32;   // a segmentation pipeline's models it selects nothing in
};

// The scales document: the calibration result plus the selection and per-channel weight amax.
nlohmann::json scales_document(const Recipe& recipe, const CalibratedModel& model, const AppliedRecipe& applied);

// Throws InputError for bad recipes, models, data and output locations.
CalibrateSummary run_calibrate(const CalibrateOptions& options);

// The default cache folder: $XDG_CACHE_HOME/qeval/calibration, else ~/.cache/qeval/calibration.
std::filesystem::path default_calibration_cache();

}  // namespace qeval::eval::quant
