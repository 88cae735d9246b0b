// txt2img on graphs with a Stable Diffusion 1.5 export's interface types: int64 input ids, an int64
// timestep, float16 inputs and outputs (Optimum's FP16 export). Small stand-in graphs whose
// outputs are known in closed form check the conversions, the timestep truncation and guidance.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "eval/onnx_builder.h"
#include "eval/pipelines/noise.h"
#include "eval/pipelines/scheduler.h"
#include "kernels/numeric.h"
#include "tiny_sd.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;
using testing::OnnxBuilder;
constexpr int kF16 = onnx::TensorProto::FLOAT16, kI64 = onnx::TensorProto::INT64;

void set_int_attr(onnx::NodeProto& n, const std::string& name, std::int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void f16_scalar(OnnxBuilder& b, const std::string& name, float v) {
  b.initializer_raw<std::uint16_t>(name, kF16, {to_float16(v).bits}, {});
}

void save(OnnxBuilder& b, const fs::path& p) { testing::write_bytes(p, b.bytes()); }

// text encoder: ids int64 [B, 77] -> float16 [B, 77, 1] = ids.
// UNet: out = 0.5 sample + 0.001 timestep + 0.0001 mean(encoder_hidden_states), all float16.
// VAE decoder: the latent's first three channels.
void write_fake_sd15(const fs::path& dir) {
  {
    OnnxBuilder b;
    b.input("input_ids", kI64, {-1, 77}).output("last_hidden_state", kF16, {-1, 77, 1});
    b.initializer_i64("axes", {2});
    set_int_attr(b.node("Cast", {"input_ids"}, {"f"}), "to", kF16);
    b.node("Unsqueeze", {"f", "axes"}, {"last_hidden_state"});
    save(b, dir / "text_encoder/model.onnx");
  }
  {
    OnnxBuilder b;
    b.input("sample", kF16, {-1, 4, 8, 8})
        .input("timestep", kI64, {-1})
        .input("encoder_hidden_states", kF16, {-1, 77, 1});
    b.output("out_sample", kF16, {-1, 4, 8, 8});
    b.initializer_i64("shape4", {-1, 1, 1, 1});
    f16_scalar(b, "half", 0.5f);
    f16_scalar(b, "c_t", 0.001f);
    f16_scalar(b, "c_e", 0.0001f);
    set_int_attr(b.node("Cast", {"timestep"}, {"tf"}, "timestep_cast"), "to", kF16);
    b.node("Reshape", {"tf", "shape4"}, {"t4"});
    b.node("Mul", {"t4", "c_t"}, {"tt"});
    auto& mean = b.node("ReduceMean", {"encoder_hidden_states"}, {"em"});
    auto* axes = mean.add_attribute();
    axes->set_name("axes");
    axes->set_type(onnx::AttributeProto::INTS);
    axes->add_ints(1);
    axes->add_ints(2);
    b.node("Reshape", {"em", "shape4"}, {"em4"});
    b.node("Mul", {"em4", "c_e"}, {"ee"});
    b.node("Mul", {"sample", "half"}, {"s"});
    b.node("Add", {"s", "tt"}, {"u"});
    b.node("Add", {"u", "ee"}, {"out_sample"});
    save(b, dir / "unet/model.onnx");
  }
  {
    OnnxBuilder b;
    b.input("latent_sample", kF16, {-1, 4, 8, 8}).output("sample", kF16, {-1, 3, 8, 8});
    b.initializer_i64("starts", {0});
    b.initializer_i64("ends", {3});
    b.initializer_i64("axes", {1});
    b.node("Slice", {"latent_sample", "starts", "ends", "axes"}, {"sample"});
    save(b, dir / "vae_decoder/model.onnx");
  }
  auto j = testing::read_json(testing::source_dir() / "docs" / "examples" / "sd15-pipeline.json");
  j["unet"].erase("variants");
  for (const char* t : {"vocab", "merges"})
    j["tokenizer"][t] =
        (testing::tiny_sd_dir() / "tokenizer" / (std::string(t) + (t[0] == 'v' ? ".json" : ".txt"))).string();
  j["latent"] = {{"channels", 4}, {"height", 8}, {"width", 8}};
  j["image"] = {{"channels", 3}, {"height", 8}, {"width", 8}, {"range", {-1, 1}}};
  std::ofstream(dir / "pipeline.json") << j.dump(1);
}

class TimestepSpy : public Observer {
 public:
  void on_node(const NodeEvent& e) override {
    if (e.node.name == "timestep_cast") seen = *e.inputs[0];
  }
  Tensor seen;
};

TEST(Txt2ImgTypes, Sd15InterfaceTypesInt64IdsInt64TimestepFloat16) {
  testing::ScratchDir dir("fake-sd15");
  write_fake_sd15(dir.path());
  const auto models = Txt2ImgModels::load(dir.path());
  EXPECT_EQ(models.config.text_encoder.input_type, DType::kInt64);
  EXPECT_EQ(models.config.unet.timestep_type, DType::kInt64);
  const auto sessions = Txt2ImgSessions::create(models);

  Txt2ImgRequest req = default_request(models.config, "a red circle in the center on a plain white background", 3);
  req.steps = 7;
  req.scheduler.type = SchedulerType::kEulerDiscrete;  // fractional timesteps: fed truncated
  req.scheduler.timestep_spacing = TimestepSpacing::kLinspace;
  req.scheduler.steps_offset = 0;
  std::vector<std::unique_ptr<TimestepSpy>> spies;
  ModelCallObserverFn spy_unet([&](const ModelCall& c) -> Observer* {
    if (c.model != "unet") return nullptr;
    spies.push_back(std::make_unique<TimestepSpy>());
    return spies.back().get();
  });
  Txt2ImgHooks hooks;
  hooks.observer = &spy_unet;
  const Txt2ImgResult r = generate(models, sessions, req, hooks);

  // Text embeddings: the ids themselves, read back from float16 as float32.
  const auto neg = models.tokenizer.encode(""), pos = models.tokenizer.encode(req.prompt);
  ASSERT_EQ(r.text_embeddings.shape(), (Shape{2, 77, 1}));
  for (int k = 0; k < 77; ++k) {
    EXPECT_EQ(r.text_embeddings.data<float>()[k], float(neg[std::size_t(k)]));
    EXPECT_EQ(r.text_embeddings.data<float>()[77 + k], float(pos[std::size_t(k)]));
  }
  // Timesteps 999, 832.5, 666, 499.5, ...: fed as int64 [2], truncated as numpy's astype does.
  ASSERT_EQ(spies.size(), 7u);
  const Scheduler sched(req.scheduler, req.steps);
  EXPECT_EQ(sched.timesteps()[1], 832.5);
  EXPECT_EQ(spies[1]->seen.data<std::int64_t>()[0], 832);
  for (std::size_t i = 0; i < 7; ++i) {
    ASSERT_EQ(spies[i]->seen.dtype(), DType::kInt64);
    ASSERT_EQ(spies[i]->seen.shape(), (Shape{2}));
    EXPECT_EQ(spies[i]->seen.data<std::int64_t>()[1], static_cast<std::int64_t>(sched.timesteps()[i]));
  }

  // The same loop in float32 from the closed form: eps_b = 0.5 x_in + 0.001 trunc(t) + 0.0001 mean(ids_b).
  auto mean_of = [](const std::vector<std::int64_t>& ids) {
    double s = 0;
    for (auto v : ids) s += double(v);
    return s / double(ids.size());
  };
  const double m_neg = mean_of(neg), m_pos = mean_of(pos);
  Tensor x = seeded_noise(req.seed, models.config.latent_shape());
  for (float& v : x.span<float>()) v *= float(sched.init_noise_sigma());
  const std::size_t n = std::size_t(x.numel());
  for (int i = 0; i < sched.steps(); ++i) {
    std::vector<float> xin(n), eps(n), next(n);
    sched.scale_model_input(i, x.span<float>(), xin);
    const double tt = 0.001 * std::trunc(sched.timesteps()[std::size_t(i)]);
    for (std::size_t k = 0; k < n; ++k) {
      const double eu = 0.5 * xin[k] + tt + 0.0001 * m_neg, ec = 0.5 * xin[k] + tt + 0.0001 * m_pos;
      eps[k] = float(eu + req.guidance_scale * (ec - eu));
    }
    sched.step(i, eps, x.span<float>(), next);
    std::copy(next.begin(), next.end(), x.data<float>());
  }
  double err = 0, ref = 0;
  for (std::size_t k = 0; k < n; ++k) {
    err += std::pow(double(r.final_latent.data<float>()[k]) - x.data<float>()[k], 2);
    ref += std::pow(double(x.data<float>()[k]), 2);
  }
  std::printf("fake SD 1.5 (float16 I/O): final latent relative L2 vs the float32 closed form %.2e\n",
              std::sqrt(err / ref));
  EXPECT_LT(std::sqrt(err / ref), 5e-3);  // float16 rounding of every value, nothing more
  EXPECT_GT(std::sqrt(ref / double(n)), 0.05);

  // The decoder's float16 output: the latent's first three channels / scaling, mapped to [0, 1].
  for (std::size_t k = 0; k < 3 * 64; ++k) {
    const float want =
        std::clamp(to_float(to_float16(r.final_latent.data<float>()[k] / 0.18215f)) * 0.5f + 0.5f, 0.0f, 1.0f);
    EXPECT_NEAR(r.image.data<float>()[k], want, 1e-6);
  }
}

TEST(Txt2ImgTypes, DeclaredTypesMustMatchPipelineJson) {
  testing::ScratchDir dir("fake-sd15-bad");
  write_fake_sd15(dir.path());
  auto j = testing::read_json(dir / "pipeline.json");
  j["unet"]["timestep_type"] = "float32";  // diffusers' converter's type; this export has int64
  std::ofstream(dir / "pipeline.json") << j.dump(1);
  try {
    Txt2ImgModels::load(dir.path());
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "unet/model.onnx (pipeline.json unet): input 'timestep' is int64, pipeline.json says float32"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qeval::eval
