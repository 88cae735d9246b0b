// txt2img on the shipped tiny-sd: PyTorch reference images, determinism across threads and runs,
// the evaluator's hooks (step hook with teacher forcing, observers per model call, swapped
// sessions), and input errors.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "datasets/npy.h"
#include "eval/pipelines/noise.h"
#include "kernels/error.h"
#include "metrics/psnr.h"
#include "metrics/tensor_error.h"
#include "tiny_sd.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;
using testing::tiny_sd;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Txt2ImgRequest short_request(int steps = 4) {
  Txt2ImgRequest r =
      default_request(tiny_sd().config, "a small red circle at the top left on a plain white background", 5);
  r.steps = steps;
  return r;
}

// The PyTorch pipeline (tools/tiny_sd_pipeline.py) from the same initial noise:
// tools/make_tiny_sd_reference.py wrote the images.
TEST(Txt2ImgReference, MatchesThePyTorchPipelineAbove50Db) {
  const auto& models = tiny_sd();
  const auto sessions = Txt2ImgSessions::create(models);
  for (int k = 0; k < 3; ++k) {
    const fs::path dir = testing::data_dir() / "tiny_sd";
    const auto ref = testing::read_json(dir / ("ref" + std::to_string(k) + ".json"));
    SCOPED_TRACE(ref.dump());
    Txt2ImgRequest req = default_request(models.config, ref["prompt"], ref["seed"]);
    req.steps = ref["steps"];
    req.guidance_scale = ref["guidance_scale"];
    req.scheduler.type = parse_scheduler_type(ref["scheduler"]);
    req.scheduler.timestep_spacing = parse_timestep_spacing(ref["timestep_spacing"]);
    req.scheduler.steps_offset = ref["steps_offset"];
    req.initial_noise = datasets::read_npy(dir / ("ref" + std::to_string(k) + "_noise.npy"));
    // The seed's noise is the committed noise, bit for bit (noise_test checks the generator).
    EXPECT_TRUE(same_bits(*req.initial_noise, seeded_noise(req.seed, models.config.latent_shape())));
    // Token ids agree with the Python tokenizer's.
    EXPECT_EQ(models.tokenizer.encode(req.prompt), ref["input_ids"].get<std::vector<std::int64_t>>());

    const Txt2ImgResult r = generate(models, sessions, req);
    Tensor want = datasets::read_npy(dir / ("ref" + std::to_string(k) + "_image.npy")).reshaped({3, 64, 64});
    for (float& v : want.span<float>()) v = std::clamp(v / 2 + 0.5f, 0.0f, 1.0f);
    const auto p = metrics::psnr(want, r.image, 1.0);
    const double psnr = p.psnr_db.value_or(INFINITY);
    const auto latent_err =
        metrics::tensor_error(datasets::read_npy(dir / ("ref" + std::to_string(k) + "_latent.npy")), r.final_latent);
    std::printf("ref%d (%s): image PSNR %.1f dB, final latent relative L2 %.2e\n", k,
                ref["scheduler"].get<std::string>().c_str(), psnr, latent_err.rel_l2.value());
    EXPECT_GE(psnr, 50.0);
    EXPECT_LT(latent_err.rel_l2.value(), 1e-3);
  }
}

TEST(Txt2Img, BitIdenticalAcrossThreadCountsAndRuns) {
  const auto& models = tiny_sd();
  const Txt2ImgRequest req = short_request();
  auto run_with = [&](int threads, const Txt2ImgSessions& sessions) {
    Txt2ImgResult r;
    tbb::task_arena arena(threads);
    arena.execute([&] { r = generate(models, sessions, req); });
    return r;
  };
  const auto s1 = Txt2ImgSessions::create(models);
  const auto s2 = Txt2ImgSessions::create(models);
  const Txt2ImgResult one = run_with(1, s1);
  const Txt2ImgResult two = run_with(2, s2);
  const Txt2ImgResult again = run_with(2, s1);  // reused sessions (buffer pools kept across runs)
  EXPECT_TRUE(same_bits(one.text_embeddings, two.text_embeddings));
  EXPECT_TRUE(same_bits(one.final_latent, two.final_latent));
  EXPECT_TRUE(same_bits(one.image, two.image));
  EXPECT_TRUE(same_bits(one.image, again.image));
  Txt2ImgRequest other = req;
  other.seed = 6;
  EXPECT_FALSE(same_bits(one.final_latent, generate(models, s1, other).final_latent));
}

TEST(Txt2Img, StepHookSeesEveryStepAndTeacherForcingReplacesTheLatent) {
  const auto& models = tiny_sd();
  const Txt2ImgRequest req = short_request(5);
  const auto ref_sessions = Txt2ImgSessions::create(models);

  // Reference: record every step.
  std::vector<Tensor> ref_before, ref_after;
  std::vector<double> seen_t;
  Txt2ImgHooks rec;
  rec.on_step = [&](Txt2ImgStep& s) {
    EXPECT_EQ(s.index, int(ref_after.size()));
    EXPECT_EQ(s.count, 5);
    EXPECT_EQ(s.unet_output.shape(), (Shape{2, 4, 16, 16}));  // uncond and cond in one call
    EXPECT_EQ(s.noise_pred.shape(), (Shape{1, 4, 16, 16}));
    ref_before.push_back(s.latent_before);
    ref_after.push_back(s.latent_after);
    seen_t.push_back(s.timestep);
  };
  const Txt2ImgResult ref = generate(models, ref_sessions, req, rec);
  EXPECT_EQ(seen_t, ref.timesteps);
  EXPECT_EQ(seen_t.front(), 801);  // leading spacing, steps_offset 1
  for (int i = 1; i < 5; ++i) EXPECT_TRUE(same_bits(ref_before[std::size_t(i)], ref_after[std::size_t(i) - 1]));
  EXPECT_TRUE(same_bits(ref.final_latent, ref_after.back()));

  // A variant differing only in its UNet (fp16), teacher-forced: at every step it starts from the
  // reference's latent, so its error is the UNet's own at that step.
  Txt2ImgSessions variant = ref_sessions;
  variant.unet = Txt2ImgSessions::make(models.unet, SessionOptions{Precision::kFp16});
  std::vector<double> step_err;
  Txt2ImgHooks forced;
  forced.on_step = [&](Txt2ImgStep& s) {
    const std::size_t i = std::size_t(s.index);
    EXPECT_TRUE(same_bits(s.latent_before, ref_before[i])) << "step " << i;
    step_err.push_back(metrics::tensor_error(ref_after[i], s.latent_after).rel_l2.value());
    s.latent_after = ref_after[i];
  };
  const Txt2ImgResult v = generate(models, variant, req, forced);
  ASSERT_EQ(step_err.size(), 5u);
  for (double e : step_err) {
    EXPECT_GT(e, 0.0);   // fp16 does change the UNet's output
    EXPECT_LT(e, 1e-2);  // ... a little
  }
  EXPECT_TRUE(same_bits(v.final_latent, ref.final_latent));
  EXPECT_TRUE(same_bits(v.image, ref.image));

  // Free-running, the fp16 UNet's image drifts but stays close.
  const Txt2ImgResult free = generate(models, variant, req);
  EXPECT_FALSE(same_bits(free.final_latent, ref.final_latent));
  EXPECT_GT(metrics::psnr(ref.image, free.image, 1.0).psnr_db.value_or(INFINITY), 25.0);
}

class CountingObserver : public Observer {
 public:
  void on_node(const NodeEvent&) override { ++nodes; }
  int nodes = 0;
};

// Records every model call it is told about and counts each call's nodes.
class RecordingCalls : public ModelCallObserver {
 public:
  Observer* begin(const ModelCall& c) override {
    calls.emplace_back(std::string(c.model), c.step);
    EXPECT_EQ(c.context, "p7");
    EXPECT_EQ(c.call, std::max(c.step, 0));
    observers.push_back(std::make_unique<CountingObserver>());
    return observers.back().get();
  }
  void end(const ModelCall& c, const std::map<std::string, Tensor>& outputs) override {
    EXPECT_EQ(calls.back(), std::make_pair(std::string(c.model), c.step));
    EXPECT_FALSE(outputs.empty());
    ++ended;
  }
  std::vector<std::pair<std::string, int>> calls;
  std::vector<std::unique_ptr<CountingObserver>> observers;
  int ended = 0;
};

TEST(Txt2Img, ObserverPerModelCallWithStepContext) {
  const auto& models = tiny_sd();
  const auto sessions = Txt2ImgSessions::create(models);
  RecordingCalls rec;
  Txt2ImgHooks hooks;
  hooks.observer = &rec;
  hooks.context = "p7";
  auto& calls = rec.calls;
  auto& observers = rec.observers;
  const Txt2ImgRequest req = short_request(3);
  const Txt2ImgResult r = generate(models, sessions, req, hooks);
  const std::vector<std::pair<std::string, int>> want = {
      {"text_encoder", -1}, {"unet", 0}, {"unet", 1}, {"unet", 2}, {"vae_decoder", -1}};
  EXPECT_EQ(calls, want);
  EXPECT_EQ(rec.ended, 5);
  EXPECT_EQ(observers[0]->nodes, int(models.text_encoder->nodes.size()));
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(observers[std::size_t(i)]->nodes, int(models.unet->nodes.size()));
  EXPECT_EQ(observers[4]->nodes, int(models.vae_decoder->nodes.size()));
  // Observing changes nothing; the pieces give the same results as the whole.
  const Txt2ImgResult plain = generate(models, sessions, req);
  EXPECT_TRUE(same_bits(plain.image, r.image));
  EXPECT_TRUE(same_bits(encode_texts(models, *sessions.text_encoder, {"", req.prompt}), r.text_embeddings));
  EXPECT_TRUE(same_bits(decode_latent(models, *sessions.vae_decoder, r.final_latent), r.image));
}

// The evaluator's lockstep form: stepping by hand gives generate()'s bits, predict() on any latent
// does not advance, and a second run can reuse the first one's text embeddings.
TEST(Txt2ImgRun, SteppingByHandEqualsGenerate) {
  const auto& models = tiny_sd();
  const auto sessions = Txt2ImgSessions::create(models);
  const Txt2ImgRequest req = short_request(3);
  const Txt2ImgResult whole = generate(models, sessions, req);
  Txt2ImgRun run(models, req), twin(models, req);
  run.encode(*sessions.text_encoder);
  twin.set_text_embeddings(run.text_embeddings());
  EXPECT_TRUE(same_bits(run.text_embeddings(), whole.text_embeddings));
  for (int i = 0; i < 3; ++i) {
    const Tensor before = run.latent();
    const auto p = run.predict(*sessions.unet, before, i);
    EXPECT_EQ(run.next_step(), i);
    const auto q = run.step(*sessions.unet);
    twin.step(*sessions.unet);
    EXPECT_TRUE(same_bits(p.noise_pred, q.noise_pred));
    EXPECT_TRUE(same_bits(run.latent(), run.scheduler_step(i, before, p.noise_pred)));
    EXPECT_TRUE(same_bits(run.latent(), twin.latent()));
  }
  EXPECT_EQ(run.next_step(), run.steps());
  EXPECT_TRUE(same_bits(run.latent(), whole.final_latent));
  EXPECT_TRUE(same_bits(run.decode(*sessions.vae_decoder), whole.image));
  EXPECT_THROW(run.step(*sessions.unet), std::logic_error);
  EXPECT_THROW(Txt2ImgRun(models, short_request(0)), InputError);
}

TEST(Txt2Img, WithoutGuidanceRunsTheConditionalBranchAlone) {
  const auto& models = tiny_sd();
  const auto sessions = Txt2ImgSessions::create(models);
  Txt2ImgRequest req = short_request(2);
  req.guidance_scale = 1.0;
  Txt2ImgHooks hooks;
  hooks.on_step = [](Txt2ImgStep& s) {
    EXPECT_EQ(s.unet_output.shape(), (Shape{1, 4, 16, 16}));
    EXPECT_EQ(std::memcmp(s.unet_output.raw(), s.noise_pred.raw(), s.noise_pred.nbytes()), 0);
  };
  EXPECT_EQ(generate(models, sessions, req, hooks).text_embeddings.dim(0), 1);
}

TEST(Txt2Img, EulerSchedulerAndImageConversion) {
  const auto& models = tiny_sd();
  const auto sessions = Txt2ImgSessions::create(models);
  Txt2ImgRequest req = short_request(3);
  req.scheduler.type = SchedulerType::kEulerDiscrete;
  const Txt2ImgResult r = generate(models, sessions, req);
  EXPECT_EQ(r.timesteps.front(), 667);  // leading kept from pipeline.json: 2 * 333 + 1
  const auto rgb = image_to_rgb8(r.image);
  ASSERT_EQ(rgb.width, 64);
  for (std::size_t i = 0; i < 50; ++i)
    EXPECT_EQ(rgb.pixels[i * 3 + 1], std::nearbyint(r.image.data<float>()[64 * 64 + i] * 255.0f));
}

#define EXPECT_INPUT_ERROR(stmt, part)                                          \
  try {                                                                         \
    stmt;                                                                       \
    ADD_FAILURE() << "no InputError";                                           \
  } catch (const InputError& e) {                                               \
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what(); \
  }

TEST(Txt2Img, BadRequestsAreInputErrors) {
  const auto& models = tiny_sd();
  const auto sessions = Txt2ImgSessions::create(models);
  Txt2ImgRequest req = short_request(2);
  req.prompt = "  ";
  EXPECT_INPUT_ERROR(generate(models, sessions, req), "the prompt is empty");
  req = short_request(0);
  EXPECT_INPUT_ERROR(generate(models, sessions, req), "0 inference steps asked; must be in [1, 1000]");
  req = short_request(2);
  req.guidance_scale = -1;
  EXPECT_INPUT_ERROR(generate(models, sessions, req), "guidance scale");
  req = short_request(2);
  req.initial_noise = Tensor(DType::kFloat32, {1, 4, 8, 8});
  EXPECT_INPUT_ERROR(generate(models, sessions, req), "initial noise must be float32 [1, 4, 16, 16]");
}

// pipeline.json pointing at the shipped models with one thing wrong.
class BadTinySdPipeline : public ::testing::Test {
 protected:
  std::string load_error(const std::string& pointer, const nlohmann::json& value, const std::string& variant = "") {
    auto j = testing::read_json(testing::tiny_sd_dir() / "pipeline.json");
    for (const char* m : {"text_encoder", "unet", "vae_decoder"})
      j[m]["model"] = (testing::tiny_sd_dir() / j[m]["model"].get<std::string>()).string();
    for (const char* t : {"vocab", "merges"})
      j["tokenizer"][t] = (testing::tiny_sd_dir() / j["tokenizer"][t].get<std::string>()).string();
    j.erase("prompts");
    j[nlohmann::json::json_pointer(pointer)] = value;
    std::ofstream(dir_ / "pipeline.json") << j.dump(1);
    try {
      Txt2ImgModels::load(dir_.path(), variant);
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  }
  testing::ScratchDir dir_{"bad-tiny-sd"};
};

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST_F(BadTinySdPipeline, GraphsMustAgreeWithPipelineJson) {
  EXPECT_HAS(load_error("/unet/model", "nowhere/unet.onnx"), "unet.model: no such file: ");
  EXPECT_HAS(load_error("/tokenizer/vocab", "missing.json"), "tokenizer.vocab: no such file");
  EXPECT_HAS(load_error("/unet/timestep", "t"),
             "unet.onnx (pipeline.json unet): the model has no input 't' (its inputs: sample (float32), timestep "
             "(float32), encoder_hidden_states (float32))");
  EXPECT_HAS(load_error("/unet/timestep_type", "int64"), "input 'timestep' is float32, pipeline.json says int64");
  EXPECT_HAS(load_error("/text_encoder/input_type", "int64"), "input 'input_ids' is int32, pipeline.json says int64");
  EXPECT_HAS(load_error("/vae_decoder/output", "image"),
             "the model has no output 'image' (its outputs: sample (float32))");
  EXPECT_HAS(load_error("/unet/model", (testing::tiny_sd_dir() / "vae_decoder.onnx").string()),
             "has no input 'sample'");
  EXPECT_HAS(load_error("/unet/variants", nlohmann::json{{"int8", "unet_int8.onnx"}}, "fp16"),
             "no model lists a variant 'fp16' (variants: int8)");
  EXPECT_HAS(load_error("/unet/variants", nlohmann::json{{"int8", "unet_int8.onnx"}}, "int8"),
             "unet.model: no such file: ");
  EXPECT_EQ(load_error("/name", "ok"), "no error");
}

TEST_F(BadTinySdPipeline, DecoderShapeMustMatchTheImageSection) {
  load_error("/image/height", 32);
  const auto models = Txt2ImgModels::load(dir_.path());
  const auto sessions = Txt2ImgSessions::create(models);
  Txt2ImgRequest req = default_request(models.config, "a red circle in the center on a plain white background", 0);
  req.steps = 1;
  EXPECT_INPUT_ERROR(generate(models, sessions, req),
                     "output 'sample' has shape [1, 3, 64, 64], pipeline.json's \"image\" says [1, 3, 32, 64]");
}

}  // namespace
}  // namespace qeval::eval
