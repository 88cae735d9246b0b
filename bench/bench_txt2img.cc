// Times one text-to-image generation (tokenize, text encoder, UNet loop with CFG, VAE decoder) with
// qeval's pipeline: median wall time and process CPU time per image. Writes the inputs it used and
// its outputs so the ONNX Runtime peer (tools/ort/txt2img.js) runs the same loop and is checked.
// Usage: bench_txt2img PIPELINE OUT_DIR [repetitions=5] [threads=0 (all)] [steps=pipeline default]
#include <tbb/global_control.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "datasets/npy.h"
#include "eval/pipelines/noise.h"
#include "eval/pipelines/txt2img.h"
#include "kernels/error.h"

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qeval;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PIPELINE OUT_DIR [repetitions=5] [threads=0] [steps]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out = argv[2];
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 0;
  std::unique_ptr<tbb::global_control> limit;
  if (threads > 0)
    limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
  try {
    const auto models = eval::Txt2ImgModels::load(argv[1]);
    const auto sessions = eval::Txt2ImgSessions::create(models);
    eval::Txt2ImgRequest req =
        eval::default_request(models.config, "a large green ring on the right on a gradient orange background", 7);
    if (argc > 5) req.steps = std::atoi(argv[5]);

    // The peer's inputs: ids [negative, prompt] and the initial noise.
    std::filesystem::create_directories(out);
    Tensor ids(DType::kInt64, {2, models.tokenizer.max_length()});
    std::int64_t* p = ids.data<std::int64_t>();
    for (const auto* text : {&req.negative_prompt, &req.prompt})
      for (std::int64_t id : models.tokenizer.encode(*text)) *p++ = id;
    datasets::write_npy(out / "input_ids.npy", ids);
    datasets::write_npy(out / "noise.npy", eval::seeded_noise(req.seed, models.config.latent_shape()));

    eval::Txt2ImgResult r = eval::generate(models, sessions, req);  // plans + warm-up
    std::vector<double> wall, cpu, text, unet, vae;
    for (int i = 0; i < reps; ++i) {
      const double c0 = cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      r = eval::generate(models, sessions, req);
      wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      cpu.push_back(1e3 * (cpu_seconds() - c0));
      text.push_back(r.text_encoder_ms);
      unet.push_back(r.unet_ms);
      vae.push_back(r.vae_decoder_ms);
    }
    datasets::write_npy(out / "qeval_latent.npy", r.final_latent);
    datasets::write_npy(out / "qeval_image.npy", r.image);
    std::printf(
        "{\"peer\": \"qeval\", \"median_ms\": %.2f, \"min_ms\": %.2f, \"cpu_ms\": %.2f, \"text_encoder_ms\": %.2f, "
        "\"unet_ms\": %.2f, \"vae_decoder_ms\": %.2f, \"steps\": %d, \"guidance\": %g, \"repetitions\": %d, "
        "\"threads\": %d}\n",
        median(wall), *std::min_element(wall.begin(), wall.end()), median(cpu), median(text), median(unet), median(vae),
        req.steps, req.guidance_scale, reps, threads);
  } catch (const InputError& e) {
    std::fprintf(stderr, "bench_txt2img: %s\n", e.what());
    return 2;
  }
  return 0;
}
