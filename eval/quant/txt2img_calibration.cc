// Per-step UNet calibration through the txt2img pipeline.
#include "eval/quant/txt2img_calibration.h"

#include "base/progress.h"
#include "eval/pipelines/prompt_set.h"
#include "kernels/error.h"

namespace qeval::eval::quant {

std::vector<std::string> read_prompt_lines(const std::filesystem::path& path, std::size_t limit) {
  const TextPromptSet set = read_text_prompts(path);  // InputError names the file and line
  std::vector<std::string> prompts;
  for (const auto& p : set.prompts) {
    if (limit != 0 && prompts.size() >= limit) break;
    prompts.push_back(p.prompt);
  }
  return prompts;
}

Txt2ImgCalibrationSet::Txt2ImgCalibrationSet(const Txt2ImgModels& models, std::vector<std::string> prompts, int steps,
                                             std::uint64_t first_seed, bool progress)
    : models_(models),
      prompts_(std::move(prompts)),
      steps_(steps > 0 ? steps : models.config.default_steps),
      first_seed_(first_seed),
      progress_(progress) {}

std::string Txt2ImgCalibrationSet::fingerprint() const {
  std::string s = "txt2img/steps=" + std::to_string(steps_) + "/seed=" + std::to_string(first_seed_) +
                  "/guidance=" + std::to_string(models_.config.default_guidance_scale) +
                  "/negative=" + models_.config.default_negative_prompt +
                  "/scheduler=" + std::string(scheduler_type_name(models_.config.scheduler.type)) +
                  "/text_encoder=" + graph_fingerprint(*models_.text_encoder);
  if (models_.text_encoder_2) s += "/text_encoder_2=" + graph_fingerprint(*models_.text_encoder_2);
  for (const auto& p : prompts_) s += "\n" + p;
  return fnv1a64_hex(s.data(), s.size());
}

std::string Txt2ImgCalibrationSet::describe() const {
  return std::to_string(prompts_.size()) + " prompts x " + std::to_string(steps_) + " steps";
}

int Txt2ImgCalibrationSet::run(const Graph& reference, RangeCollector& collector) {
  Txt2ImgSessions sessions = Txt2ImgSessions::create(models_);
  if (&reference != models_.unet.get()) sessions.unet = std::make_shared<Session>(reference);
  // Every UNet call filed under its denoising step; the other models run unobserved.
  ModelCallObserverFn observer([&](const ModelCall& call) -> Observer* {
    if (call.model != "unet") return nullptr;
    collector.set_step(call.step);
    return &collector;
  });
  Txt2ImgHooks hooks;
  hooks.observer = &observer;
  base::Progress progress("calibrating " + (recipe_name.empty() ? std::string("unet") : recipe_name + " (unet)"),
                          prompts_.size(), progress_, {"prompts"});
  for (std::size_t i = 0; i < prompts_.size(); ++i) {
    Txt2ImgRequest request = default_request(models_.config, prompts_[i], first_seed_ + i);
    request.steps = steps_;
    generate(models_, sessions, request, hooks);
    progress.tick();
  }
  progress.finish();
  return steps_;
}

}  // namespace qeval::eval::quant
