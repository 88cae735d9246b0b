// A synthetic but realistic `qeval run` report (no model runs): a tiny-sd-like UNet with a
// reference and fp16 / int8 recipe / fp8 Q/DQ-export variants, for the report tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "datasets/image_io.h"
#include "reports/heatmap.h"
#include "reports/run_report.h"
#include "test_util.h"

namespace qeval::testing {

struct SyntheticRunShape {
  int prompts = 8;
  int layers = 60;
  int steps = 20;
  bool images = true;  // embed PNG thumbnails
};

inline reports::RunReport synthetic_run_report(const SyntheticRunShape& shape = {}) {
  using namespace qeval::reports;
  std::mt19937 rng(1234);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  RunReport r;
  r.tool_version = "0.1.0";
  r.created_utc = "2026-11-21T08:00:00Z";
  r.command_line = "qeval run --out out/run --gate gate.json";
  r.elapsed_s = 74.5;
  r.config.pipeline = "txt2img";
  r.config.model = {"tiny-sd", "models/tiny-sd/pipeline.json", "sha256:0a1b2c3d4e5f"};
  r.config.inputs = {"tiny_eval", "prompts/tiny_eval.txt", "sha256:11aa22bb"};
  r.config.calibration = Artifact{"tiny_calib", "prompts/tiny_calib.txt", "sha256:33cc44dd"};
  r.config.reference_variant = "fp32";
  r.config.scheduler = "ddim";
  r.config.steps = shape.steps;
  r.config.seeds = {42};
  r.config.threads = 2;
  r.config.settings = {{"guidance_scale", "5.0"}, {"observe", "layers,timesteps"}};
  r.metrics = {{"psnr_db", "PSNR dB", true}, {"ssim", "SSIM", true}, {"ms_ssim", "MS-SSIM", true}};

  Variant ref{"fp32", VariantKind::kPrecision, "fp32", {}, {}, true, 412, 0, 0, 0, 0, {}, {}, {}};
  Variant fp16{"fp16", VariantKind::kPrecision, "fp16", {}, {}, false, 412, 0, 0, 0, 0, {}, {}, {}};
  Variant int8{"int8-l3", VariantKind::kRecipe,
               "fp16",    Artifact{"int8-level3", "recipes/int8_level3.json", "sha256:5e6f7a8b"},
               {},        false,
               412,       261,
               0,         0,
               0,         {},
               {},        {{"unet", "/conv_in/Conv", "Conv", "default exclusion"}}};
  Variant fp8{"fp8-qdq",
              VariantKind::kOnnx,
              "fp16",
              {},
              Artifact{"unet_fp8_qdq", "exports/unet_fp8_qdq.onnx", "sha256:9c0d1e2f"},
              false,
              412,
              240,
              380,
              0,
              28,
              {},
              {},
              {}};
  fp8.unmatched = {
      {"variant", "/up_blocks.1/attn/QuantizeLinear_7", "QuantizeLinear",
       "Q/DQ pair around a node with no reference counterpart"},
      {"reference", "up_blocks.1.attn.to_out.1", "Dropout", "removed by the exporter; no structural match"},
      {"variant", "fused_gelu_3", "Gelu", "fused from 4 reference nodes"}};
  r.variants = {ref, fp16, int8, fp8};

  // Layers: a UNet-like sequence of blocks.
  const char* ops[] = {"Conv", "GroupNormalization", "Sigmoid", "Mul", "Conv", "Add", "MatMul", "Softmax", "MatMul",
                       "Gemm"};
  for (int i = 0; i < shape.layers; ++i) {
    const int block = i / 10;
    const std::string part = block < 2   ? fmt::format("down_blocks.{}", block)
                             : block < 4 ? fmt::format("mid_block.{}", block - 2)
                                         : fmt::format("up_blocks.{}", block - 4);
    r.layers.push_back({fmt::format("{}/{}_{}", part, ops[i % 10], i), ops[i % 10], "unet"});
  }
  const auto L = std::size_t(shape.layers), S = std::size_t(shape.steps);
  // How much error each variant adds per layer (dB of SQNR lost), and one bad layer for int8.
  auto base_sqnr = [&](std::size_t v, std::size_t l) -> float {
    if (v == 0) return std::numeric_limits<float>::infinity();
    float local = v == 1 ? 62.0f : v == 2 ? 31.0f : 27.0f;
    if (v >= 2 && (l % 10 == 7)) local -= 9.0f;  // softmax outputs quantize badly
    if (v == 2 && l == L / 2 + 7) local = 6.5f;  // the culprit
    return local;
  };
  auto rel_from_sqnr = [](float db) { return std::pow(10.0f, -db / 20.0f); };

  r.timesteps.component = "unet";
  r.timesteps.mode = "teacher-forced";
  for (std::size_t s = 0; s < S; ++s) r.timesteps.t.push_back(999.0 - 999.0 * double(s) / double(S));
  for (std::size_t l = 0; l < L; ++l) r.timesteps.layers.push_back(std::uint32_t(l));

  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    LayerTable table;
    table.variant = r.variants[v].name;
    table.samples = std::size_t(shape.prompts);
    StepTable steps;
    steps.variant = table.variant;
    LayerColumns& c = table.stats;
    LayerColumns& sc = steps.stats;
    for (std::size_t l = 0; l < L; ++l) {
      const bool quantized = (v == 2 || v == 3) && (l % 10 == 0 || l % 10 == 4 || l % 10 >= 6);
      table.format.push_back(!quantized ? "" : v == 2 ? "int8" : "fp8_e4m3");
      const float amax = 4.0f + float(l % 7);
      table.calib_amax.push_back(quantized ? amax : kNotMeasured);
      float worst_absmax = 0;
      int out_of_range = 0;
      for (std::size_t s = 0; s < S; ++s) {
        // Activations grow towards the end of denoising, some layers beyond the calibrated range.
        const float absmax = amax * (0.7f + 0.5f * float(s) / float(S)) * (1.0f + 0.03f * noise(rng));
        const float local = base_sqnr(v, l) + 0.8f * noise(rng) - 4.0f * float(s) / float(S);
        const float acc = v == 0 ? local : std::min(local, base_sqnr(v, 0) - 0.12f * float(l)) + 0.5f * noise(rng);
        if (v > 0) {
          sc.local_sqnr_db.push_back(local);
          sc.local_rel_l2.push_back(rel_from_sqnr(local));
          sc.acc_sqnr_db.push_back(acc);
          sc.acc_rel_l2.push_back(rel_from_sqnr(acc));
        }
        sc.absmax.push_back(absmax);
        sc.p99_9.push_back(absmax * 0.62f);
        sc.mean.push_back(0.05f * noise(rng));
        sc.std.push_back(absmax * 0.2f);
        sc.nonfinite.push_back(0);
        sc.clip_rate.push_back(quantized && absmax > amax ? 1e-4f * (absmax - amax)
                                                          : (quantized ? 0.0f : kNotMeasured));
        worst_absmax = std::max(worst_absmax, absmax);
        out_of_range += quantized && absmax > amax;
      }
      // Pooled over steps.
      auto pooled = [&](const std::vector<float>& col, bool db) {
        double energy = 0;
        for (std::size_t s = 0; s < S; ++s) {
          float x = col[l * S + s];
          energy += db ? std::pow(10.0, -x / 10.0) : x;
        }
        return db ? float(-10.0 * std::log10(energy / double(S))) : float(energy / double(S));
      };
      if (v > 0) {
        c.local_sqnr_db.push_back(pooled(sc.local_sqnr_db, true));
        c.acc_sqnr_db.push_back(pooled(sc.acc_sqnr_db, true));
        c.local_rel_l2.push_back(rel_from_sqnr(c.local_sqnr_db.back()));
        c.acc_rel_l2.push_back(rel_from_sqnr(c.acc_sqnr_db.back()));
        c.local_cosine.push_back(1.0f - 0.5f * c.local_rel_l2.back() * c.local_rel_l2.back());
        c.acc_cosine.push_back(1.0f - 0.5f * c.acc_rel_l2.back() * c.acc_rel_l2.back());
        c.local_max_abs.push_back(worst_absmax * 4.0f * c.local_rel_l2.back());
        c.acc_max_abs.push_back(worst_absmax * 4.0f * c.acc_rel_l2.back());
      }
      c.absmax.push_back(worst_absmax);
      c.p99_9.push_back(worst_absmax * 0.6f);
      c.mean.push_back(0.01f);
      c.std.push_back(worst_absmax * 0.2f);
      c.nonfinite.push_back(0);
      c.clip_rate.push_back(quantized ? pooled(sc.clip_rate, false) : kNotMeasured);
      table.out_of_range_steps.push_back(quantized ? float(out_of_range) : kNotMeasured);
    }
    if (v == 0) table.format.clear();  // the reference quantizes nothing: columns may be empty
    r.layer_tables.push_back(std::move(table));
    r.timesteps.tables.push_back(std::move(steps));
  }
  // fp8 export produced Inf in one node at a late step.
  r.layer_tables[3].stats.nonfinite[L - 3] = 12;
  r.timesteps.tables[3].stats.nonfinite[(L - 3) * S + S - 2] = 12;
  r.nonfinite.push_back({"fp8-qdq", "p005-s42", int(S) - 2, r.layers[L - 3].name, r.layers[L - 3].op, 0, 12, ""});

  // Error-per-step curves of the noise prediction, both modes.
  for (std::size_t v = 1; v < r.variants.size(); ++v)
    for (const char* mode : {"teacher-forced", "free-running"}) {
      StepCurve curve{r.variants[v].name, "noise_pred", "sqnr_db", mode, {}};
      for (std::size_t s = 0; s < S; ++s) {
        double base = base_sqnr(v, 1) - 3.0 - 5.0 * double(s) / double(S);
        if (std::string(mode) == "free-running") base -= 0.4 * double(s);
        curve.values.push_back(base + 0.3 * noise(rng));
      }
      r.step_curves.push_back(std::move(curve));
    }

  // Histograms of the worst layers (reference and variant).
  for (std::size_t layer_index : {L / 2 + 7, std::size_t(7), L - 3}) {
    if (layer_index >= L) continue;
    const auto layer = std::uint32_t(layer_index);
    for (const char* variant : {"fp32", "int8-l3"}) {
      Histogram h{variant, layer, -1, -8.0, 8.0, std::vector<std::uint64_t>(64), 0, 0};
      std::normal_distribution<float> act(0.0f, std::string(variant) == "fp32" ? 1.6f : 1.7f);
      for (int i = 0; i < 20000; ++i) {
        float x = act(rng);
        int bin = int(std::floor((x - float(h.lo)) / float(h.hi - h.lo) * 64.0f));
        if (bin < 0) ++h.below;
        else if (bin >= 64) ++h.above;
        else ++h.counts[std::size_t(bin)];
      }
      r.histograms.push_back(std::move(h));
    }
  }

  // Samples.
  const char* prompts[] = {"a red circle above a blue square",       "two green triangles on grey",
                           "a yellow star left of a purple circle",  "three small blue squares",
                           "an orange ring below a white cross",     "a big black circle",
                           "a pink square right of a cyan triangle", "four dots in a row"};
  for (int p = 0; p < shape.prompts; ++p) {
    SampleRow row;
    row.id = fmt::format("p{:03d}-s42", p);
    row.prompt = prompts[p % 8];
    row.seed = 42;
    datasets::Rgb8 ref_img = pattern(48, 48, 3, unsigned(p));
    for (std::size_t v = 0; v < r.variants.size(); ++v) {
      SampleResult res;
      res.variant = r.variants[v].name;
      res.elapsed_ms = (v == 0 ? 900.0 : v == 1 ? 610.0 : 450.0) + 10.0 * p;
      if (v > 0) {
        const int amp = v == 1 ? 1 : v == 2 ? 6 : 10;
        datasets::Rgb8 out = perturb(ref_img, amp, unsigned(100 * p + int(v)));
        double mse = 0;
        std::vector<float> diff(std::size_t(48 * 48));
        for (std::size_t i = 0; i < diff.size(); ++i)
          for (int ch = 0; ch < 3; ++ch) {
            float d = std::abs(float(out.pixels[i * 3 + ch]) - float(ref_img.pixels[i * 3 + ch]));
            diff[i] = std::max(diff[i], d);
            mse += double(d) * d;
          }
        mse /= double(diff.size() * 3);
        res.identical = mse == 0;
        const double psnr = 10.0 * std::log10(255.0 * 255.0 / mse);
        res.metrics = {{"psnr_db", psnr, {}, ""},
                       {"ssim", 1.0 - 0.004 * amp * amp / (1.0 + 0.1 * p), {}, ""},
                       {"ms_ssim", std::nullopt, {}, "image smaller than 161 px"}};
        if (shape.images) {
          res.image.png = datasets::encode_png(out);
          res.heatmap.png = datasets::encode_png({48, 48, 3, reports::heatmap_rgb(diff, float(2 * amp))});
          res.heatmap_legend = fmt::format("|diff|: black 0, bright >= {}", 2 * amp);
        }
        res.image.path = fmt::format("images/{}/{}.png", res.variant, row.id);
        res.heatmap.path = fmt::format("images/{}/{}.diff.png", res.variant, row.id);
      } else {
        if (shape.images) res.image.png = datasets::encode_png(ref_img);
        res.image.path = fmt::format("images/fp32/{}.png", row.id);
      }
      row.results.push_back(std::move(res));
    }
    r.samples.push_back(std::move(row));
  }
  // fp8 failed on one sample.
  if (shape.prompts > 6) {
    auto& bad = r.samples[6].results[3];
    bad.error = "node fused_gelu_3: output shape [1,64,8,8] differs from the reference [1,64,8,9]";
    bad.metrics.clear();
    bad.image = {};
    bad.heatmap = {};
  }
  summarize_samples(r);
  for (std::size_t v = 0; v < r.variants.size(); ++v)
    r.variants[v].summary.timings = {{"wall_s", 18.0 - 2.0 * double(v)},
                                     {"ms_per_sample", 900.0 - 100.0 * double(v)},
                                     {"ms_per_step", 42.0 - 5.0 * double(v)}};

  // Gate: every check names its variant.
  r.gate.source = "gate.json";
  for (std::size_t v = 1; v < r.variants.size(); ++v) {
    const auto& sum = r.variants[v].summary;
    const std::string& name = r.variants[v].name;
    double psnr = sum.metrics[0].mean, ssim_p5 = sum.metrics[1].p5;
    r.gate.checks.push_back({"psnr_db mean >= 30", "psnr_db", "mean", ">=", 30, psnr, psnr >= 30,
                             fmt::format("mean {:.2f} over {} samples", psnr, sum.metrics[0].count), name});
    r.gate.checks.push_back(
        {"ssim p5 >= 0.9", "ssim", "p5", ">=", 0.9, ssim_p5, ssim_p5 >= 0.9, fmt::format("p5 {:.4f}", ssim_p5), name});
    float worst = std::numeric_limits<float>::infinity();
    for (float x : r.layer_tables[v].stats.local_sqnr_db) worst = std::min(worst, x);
    r.gate.checks.push_back({"worst-layer local SQNR >= 10 dB", "local_sqnr_db", "min", ">=", 10, double(worst),
                             worst >= 10, "lowest over all layers", name});
    const bool nan = name == "fp8-qdq";
    r.gate.checks.push_back({"no NaN/Inf", "nonfinite", "count", "<=", 0, nan ? 1.0 : 0.0, !nan,
                             nan ? "Inf in " + r.layers[L - 3].name : "none", name});
  }
  r.gate.passed = std::all_of(r.gate.checks.begin(), r.gate.checks.end(), [](const auto& c) { return c.passed; });
  return r;
}

}  // namespace qeval::testing
