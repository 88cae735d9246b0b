// qeval generate: one image from a text-to-image pipeline (tiny-sd, a user's SD 1.5 export).
#include <fmt/format.h>

#include <optional>

#include "base/exit_codes.h"
#include "base/files.h"
#include "base/progress.h"
#include "datasets/npy.h"
#include "eval/cli/command.h"
#include "eval/pipelines/txt2img.h"
#include "kernels/error.h"

namespace qeval::cli {
namespace {

struct GenerateArgs {
  std::string pipeline, prompt, out = "qeval-generate.png", precision = "fp32", scheduler, negative_prompt, variant,
                                noise, latent_out;
  std::uint64_t seed = 0;
  std::optional<int> steps;
  std::optional<double> guidance;
  bool has_negative = false;
};

int run_generate(const GenerateArgs& a) {
  const eval::PipelineTask task = eval::read_pipeline_task(a.pipeline);
  if (task != eval::PipelineTask::kTxt2Img)
    throw InputError(eval::pipeline_json_path(a.pipeline).string() + ": task is \"" +
                     std::string(eval::pipeline_task_name(task)) + "\"; `qeval generate` runs \"txt2img\" pipelines");
  const std::filesystem::path out_dir = std::filesystem::path(a.out).parent_path();
  if (!out_dir.empty() && !std::filesystem::is_directory(out_dir))
    throw InputError("--out " + a.out + ": the folder " + out_dir.string() + " does not exist");
  std::optional<eval::SchedulerType> scheduler;
  if (!a.scheduler.empty()) scheduler = eval::parse_scheduler_type(a.scheduler);
  const auto models = eval::Txt2ImgModels::load(a.pipeline, a.variant, scheduler);
  eval::Txt2ImgRequest req = eval::default_request(models.config, a.prompt, a.seed);
  if (a.steps) req.steps = *a.steps;
  if (a.guidance) req.guidance_scale = *a.guidance;
  if (a.has_negative) req.negative_prompt = a.negative_prompt;
  if (scheduler) req.scheduler.type = *scheduler;
  if (!a.noise.empty()) req.initial_noise = datasets::read_npy(a.noise);

  const std::size_t tokens = models.tokenizer.tokenize(a.prompt).size();
  if (tokens + 2 > static_cast<std::size_t>(models.tokenizer.max_length()))
    fmt::print(stderr, "qeval generate: warning: the prompt has {} tokens; the text encoder sees the first {}\n",
               tokens, models.tokenizer.max_length() - 2);

  eval::SessionOptions options;
  options.precision = *eval::precision_from_name(a.precision);  // CLI11 checked the name
  const auto sessions = eval::Txt2ImgSessions::create(models, options);
  base::Progress progress("generate", static_cast<std::size_t>(std::max(req.steps, 0)), true, {"steps"});
  eval::Txt2ImgHooks hooks;
  hooks.on_step = [&](eval::Txt2ImgStep&) { progress.tick(); };
  const eval::Txt2ImgResult r = eval::generate(models, sessions, req, hooks);
  progress.finish();

  const auto rgb = eval::image_to_rgb8(r.image);
  const auto png = datasets::encode_png(rgb);
  base::write_file_atomic(a.out, std::string_view(reinterpret_cast<const char*>(png.data()), png.size()));
  if (!a.latent_out.empty()) datasets::write_npy(a.latent_out, r.final_latent);

  fmt::print("qeval generate: \"{}\" seed {} -> {} ({}x{})\n", a.prompt, a.seed, a.out, rgb.width, rgb.height);
  // An SDXL VAE with force_upcast ran in FP32 whatever --precision said (as diffusers upcasts it),
  // a float16 export of it widened to float32 first.
  const bool upcast = eval::txt2img_model_precision(models.config, eval::Txt2ImgModel::kVaeDecoder,
                                                    options.precision) != options.precision;
  const char* vae_note = models.vae_decoder_widened ? " (vae_decoder fp32: force_upcast, float16 export widened)"
                         : upcast                   ? " (vae_decoder fp32: force_upcast)"
                                                    : "";
  fmt::print("  {} ({}), {} {} steps, guidance {:g}, {}{}{}\n", models.config.name, models.config.source.string(),
             eval::scheduler_type_name(req.scheduler.type), req.steps, req.guidance_scale, a.precision, vae_note,
             a.variant.empty() ? "" : ", variant " + a.variant);
  fmt::print("  {:.0f} ms: text encoder {:.0f} ms, UNet {:.0f} ms ({:.1f} ms/step), VAE decoder {:.0f} ms\n",
             r.text_encoder_ms + r.unet_ms + r.vae_decoder_ms, r.text_encoder_ms, r.unet_ms, r.unet_ms / req.steps,
             r.vae_decoder_ms);
  return base::kExitPass;
}

Runner add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd =
      app.add_subcommand("generate",
                         "Generate one image with a text-to-image pipeline (a folder with pipeline.json, or an\n"
                         "optimum-cli ONNX export folder; see docs/pipelines.md): tokenize, text encoder, UNet loop\n"
                         "with classifier-free guidance, VAE decoder, PNG. The same seed gives the same image on every\n"
                         "run and thread count.\n"
                         "Exit: 0 written, 2 bad input (pipeline, model files, prompt, options).");
  cmd->add_option("--pipeline", a->pipeline,
                  "pipeline folder (or its pipeline.json) or optimum-cli export folder, e.g. models/tiny-sd")
      ->required();
  cmd->add_option("--prompt", a->prompt, "the text")->required();
  cmd->add_option("--out", a->out, "the PNG to write (default qeval-generate.png)");
  cmd->add_option("--seed", a->seed, "initial noise seed (default 0; docs/pipelines.md 'Initial noise')");
  cmd->add_option(
         "--precision", a->precision,
         "fp32 (default); fp16 or bf16: a deployment (BatchNormalization folded, values rounded where fused kernels "
         "store them, FP32 accumulation); fp16-strict or bf16-strict: every op's output rounded (docs/precision.md)")
      ->check(CLI::IsMember(eval::precision_names()));
  cmd->add_option("--steps", a->steps, "denoising steps (default: pipeline.json defaults.steps)");
  cmd->add_option("--guidance", a->guidance,
                  "classifier-free guidance scale (default: pipeline.json; <= 1: no guidance)");
  cmd->add_option("--scheduler", a->scheduler, "ddim or euler (default: pipeline.json's; the other settings are kept)")
      ->check(CLI::IsMember({"ddim", "euler"}));
  cmd->add_option("--negative-prompt", a->negative_prompt,
                  "the unconditional text (default: pipeline.json's, usually \"\")")
      ->each([a](const std::string&) { a->has_negative = true; });
  cmd->add_option("--variant", a->variant, "use each model's export listed under this name in \"variants\"");
  cmd->add_option("--noise", a->noise, "initial noise [1, C, h, w] float32 .npy instead of the seed's");
  cmd->add_option("--save-latent", a->latent_out, "also write the final latent (before 1/scaling_factor) as .npy");
  return [a](const Context&) { return run_generate(*a); };
}

const bool kGenerateRegistered = register_command(30, add_generate);

}  // namespace
}  // namespace qeval::cli
