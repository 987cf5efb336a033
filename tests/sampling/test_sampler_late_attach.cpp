/* SamplerEngine on a trainer that ended before the sampler joined (a very short run, whose
 * sampling branch attaches through the run context after the trainer's end of stream): it
 * samples the final weights once when its schedule asks for them (at-end, or a due last step),
 * as a sampler that was there all along does, then finishes instead of waiting for steps that
 * never come; a failed trainer ends it with a warning. One process, CPU, the tiny Wan. */
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddpsampler/sampler_engine.h"
#include "ddptrainsink/trainer_engine.h"
#include "metas.h"
#include "models/i2v_inputs.h"
#include "models/image_condition.h"
#include "models/native_model.h"
#include "models/samplers.h"
#include "models/train_model.h"
#include "models/vae/cogvideox_encoder.h"
#include "models/vae/vae_encoder.h"
#include "prompt_record.h"
#include "tensor_buffer.h"
#include "sampler_test_util.h"
#include "test_util.h"

using namespace videotrain;
using namespace samplertest;

namespace {

std::shared_ptr<TrainerEngine> started_trainer() {
  TrainerConfig tc;
  tc.model = vttest::reference_dir() + "/dit/wan_t2v_tiny";
  tc.device = "cpu";
  tc.backend = "gloo";
  tc.seed = 5;
  tc.lr = 1e-2;
  tc.log_every = 1;
  auto t = std::make_shared<TrainerEngine>(tc);
  EXPECT_TRUE(t->start()) << t->error();
  return t;
}

void train_steps(TrainerEngine &t, int steps) {
  ModelInputs in;
  in.latents = seeded({1, 4, 2, 8, 8}, 7);
  in.text_embeds = seeded({1, kTextLen, kTextDim}, 9);
  in.text_mask = at::ones({1, kTextLen}, at::kLong);
  BatchInfo info;
  info.captions = {"x"};
  for (int s = 0; s < steps; s++) ASSERT_EQ(t.process_inputs(in, info), ProcessResult::kOk) << t.error();
}

SamplerConfig sconfig() {
  SamplerConfig c;
  c.steps = 2;
  c.guidance = 3.0;
  c.device = "cpu";
  return c;
}

struct Sampled {
  bool returned = false;  // run_next came back to kFinished (not kError, not a hang)
  std::map<std::string, at::Tensor> samples;  // "step:prompt" -> latents
  std::string warnings;
};

// Two prompts, then run_next until it says finished, for at most 20 s (a flush wakes a hang).
Sampled run_branch(SamplerEngine &s) {
  Sampled out;
  for (int64_t i = 0; i < 2; i++)
    for (int64_t role : {int64_t(kRolePrompt), int64_t(kRoleNegative)}) {
      GstBuffer *b = prompt_buffer(i, role);
      EXPECT_TRUE(s.add_prompt(b)) << s.error();
      gst_buffer_unref(b);
    }
  EXPECT_TRUE(s.prompts_done());
  std::promise<SamplerEngine::Next> last;
  auto done = last.get_future();
  std::thread branch([&] {
    SamplerEngine::Next n;
    do {
      n = s.run_next([&](SampleOut &o) {
        at::Tensor t;
        std::string why;
        if (auto x = tensor_from_buffer(o.latents, &why)) t = x->clone();
        out.samples[std::to_string(o.step) + ":" + std::to_string(o.prompt_index)] = t;
        gst_buffer_unref(o.latents);
        return true;
      });
    } while (n == SamplerEngine::Next::kSampled);
    last.set_value(n);
  });
  if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) s.set_flushing(true);
  branch.join();
  out.returned = done.get() == SamplerEngine::Next::kFinished;
  for (auto &m : s.take_messages())
    if (m.name == BusMessage::kWarning) out.warnings += m.strings["text"] + "\n";
  return out;
}

// The SamplerImageToVideo tests' steps. A trainer on `model` that ends before its first step (at-end
// samples the initial weights); null (a failure said) when it does not start or finish.
std::shared_ptr<TrainerEngine> finished_trainer(const std::string &model) {
  TrainerConfig tc;
  tc.model = model;
  tc.device = "cpu";
  tc.backend = "gloo";
  auto t = std::make_shared<TrainerEngine>(tc);
  if (t->start() && t->finish()) return t;
  ADD_FAILURE() << t->error();
  return nullptr;
}

// Prompt 0 of `frames` frames and its negative, the prompt's buffer with `image` when defined.
void feed_prompt(SamplerEngine &s, const at::Tensor &image, int64_t frames = 5) {
  for (int64_t role : {int64_t(kRolePrompt), int64_t(kRoleNegative)}) {
    GstBuffer *b = prompt_buffer(0, role, frames);
    if (image.defined() && role == kRolePrompt) buffer_append_tensor(b, "image", image);
    EXPECT_TRUE(s.add_prompt(b)) << s.error();
    gst_buffer_unref(b);
  }
}

// One run_next, expecting `expect`: the sample's latents (undefined when none came).
at::Tensor sample_once(SamplerEngine &s, SamplerEngine::Next expect = SamplerEngine::Next::kSampled) {
  at::Tensor out;
  EXPECT_EQ(s.run_next([&](SampleOut &o) {
              std::string why;
              if (auto x = tensor_from_buffer(o.latents, &why)) out = x->clone();
              gst_buffer_unref(o.latents);
              return true;
            }),
            expect)
      << s.error();
  return out;
}

// The loop given the image inputs directly: sample_latents on the prompt_buffer texts of prompt 0.
at::Tensor direct_sample(models::DitModel &dit, const models::SamplerOptions &so, const at::Tensor &noise,
                         double guidance, at::Generator &gen, const models::ImageInputs &in) {
  auto sampler = models::Sampler::make(so);
  const auto text = [](int64_t role) { return seeded({1, kTextLen, kTextDim}, 50 + role); };
  return models::sample_latents(dit, *sampler, noise, text(0), text(1), guidance, gen, {}, in)[0];
}

}  // namespace

TEST(SamplerLateAttach, AJoinAfterTheTrainersEndSamplesTheFinalWeightsAsASamplerThatWasThere) {
  // Reference: a sampler there from the start of the same 2-step run (at-end samples step 2).
  Sampled in_time;
  {
    auto trainer = started_trainer();
    SamplerEngine s(sconfig());
    ASSERT_TRUE(s.attach(trainer)) << s.error();
    train_steps(*trainer, 2);
    ASSERT_TRUE(trainer->finish()) << trainer->error();
    in_time = run_branch(s);
    ASSERT_TRUE(in_time.returned) << s.error();
    ASSERT_EQ(in_time.samples.size(), 2u);
  }
  auto trainer = started_trainer();
  train_steps(*trainer, 2);
  ASSERT_TRUE(trainer->finish()) << trainer->error();
  for (bool at_end : {true, false}) {
    auto c = sconfig();
    c.at_end = at_end;
    c.every = at_end ? 500 : 2;  // without at-end: the last step is due by `every`
    SamplerEngine s(c);
    ASSERT_TRUE(s.attach(trainer)) << s.error();
    const Sampled late = run_branch(s);
    EXPECT_TRUE(late.returned) << "at-end " << at_end << ": " << s.error();
    ASSERT_EQ(late.samples.size(), 2u) << "at-end " << at_end;
    for (const auto &[key, t] : in_time.samples) {
      ASSERT_TRUE(late.samples.count(key)) << key;
      EXPECT_TRUE(late.samples.at(key).equal(t)) << key;
    }
  }
  // Neither at-end nor a due last step: nothing to sample, and the branch ends.
  auto c = sconfig();
  c.at_end = false;
  c.every = 3;
  SamplerEngine s(c);
  ASSERT_TRUE(s.attach(trainer)) << s.error();
  const Sampled none = run_branch(s);
  EXPECT_TRUE(none.returned) << s.error();
  EXPECT_TRUE(none.samples.empty());
}

TEST(SamplerLateAttach, AFailedTrainerEndsTheSamplerWithAWarning) {
  auto trainer = started_trainer();
  train_steps(*trainer, 1);
  BatchInfo info;
  info.captions = {"x"};
  ModelInputs bad;
  bad.latents = seeded({4, 2, 8, 8}, 7);  // not a micro-batch: the step fails
  ASSERT_EQ(trainer->process_inputs(bad, info), ProcessResult::kError);
  SamplerEngine s(sconfig());
  ASSERT_TRUE(s.attach(trainer)) << s.error();
  const Sampled out = run_branch(s);
  EXPECT_TRUE(out.returned) << s.error();
  EXPECT_TRUE(out.samples.empty());
  EXPECT_NE(out.warnings.find("the trainer failed after step 1: no more samples"), std::string::npos) << out.warnings;
}

// Image-to-video (issue 43 item 4): a trainer whose model is the Wan 2.2 I2V layout (in_channels 12 = 4
// latents + 4 mask + 4 condition latents of the tiny Wan 2.1 VAE). Refused at attach without `vae`; a
// prompt without an image is an error naming it at the end of the prompts; with both, the sample is
// ddpsampler's loop with the condition built from the prompt buffer's image (a 40x24 image stretched to
// the prompt's 32x32), the same latents as sample_latents given that condition directly (the loop and
// condition that test diffusers-wan-i2v-sampling checks against WanImageToVideoPipeline), and not those
// of another image.
TEST(SamplerImageToVideo, AnI2VTrainerSamplesFromThePromptsImage) {
  vttest::TempDir dir;
  const std::string model = dir.file("wan_i2v");
  {
    std::string cfg = vttest::read_file(vttest::reference_dir() + "/dit/wan_t2v_tiny/config.json");
    cfg.replace(cfg.find("\"in_channels\": 4"), 16, "\"in_channels\": 12");
    at::manual_seed(3);
    models::build_dit(cfg, torch::kCPU)->save(model, at::kFloat, uint64_t(1) << 30);
  }
  auto trainer = finished_trainer(model);  // no step: at-end samples the initial weights
  ASSERT_TRUE(trainer);

  SamplerConfig c = sconfig();
  {
    SamplerEngine s(c);
    EXPECT_FALSE(s.attach(trainer));
    EXPECT_NE(s.error().find("set ddpsampler's vae"), std::string::npos) << s.error();
  }
  c.vae = vttest::reference_dir() + "/wan_vae/tiny_wan21";
  const at::Tensor image = (seeded({24, 40, 3}, 4).abs() * 80).clamp(0, 255).to(at::kByte);
  {
    SamplerEngine s(c);
    ASSERT_TRUE(s.attach(trainer)) << s.error();
    feed_prompt(s, at::Tensor());
    EXPECT_FALSE(s.prompts_done());
    EXPECT_NE(s.error().find("prompt 0 has no image"), std::string::npos) << s.error();
  }
  const auto sample = [&](const at::Tensor &img) {
    SamplerEngine s(c);
    EXPECT_TRUE(s.attach(trainer)) << s.error();
    feed_prompt(s, img);
    EXPECT_TRUE(s.prompts_done()) << s.error();
    return sample_once(s);
  };
  const at::Tensor got = sample(image);
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(got.sizes(), (at::IntArrayRef{4, 2, 4, 4}));  // prompt_buffer: 5 frames of 32x32

  // The same loop given the condition directly.
  torch::NoGradGuard ng;
  auto dit = models::open_dit(model, torch::kCPU);
  auto vae = vae::VaeEncoder::load(c.vae, torch::kCPU, torch::kFloat);
  const models::LatentEncode encode = [&](const at::Tensor &v) { return vae->latent(vae->encode(v)); };
  models::ImageInputs in;
  in.condition = models::i2v_condition(models::preprocess_image(image, 32, 32), at::Tensor(), 5, 4, encode);
  models::SamplerOptions so;
  so.steps = c.steps;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(100));  // prompt_buffer's seed
  const at::Tensor noise = at::randn({1, 4, 2, 4, 4}, gen, at::TensorOptions(at::kFloat));
  const at::Tensor want = direct_sample(*dit, so, noise, c.guidance, gen, in);
  EXPECT_LT((got - want).norm().item<double>(), 1e-5 * want.norm().item<double>());
  EXPECT_GT((sample(255 - image) - want).norm().item<double>(), 1e-3 * want.norm().item<double>())
      << "another image gives another sample";
}

// Wan 2.2 TI2V 5B (its pipeline's expand_timesteps, from ../model_index.json): a prompt with an image
// samples with the image's latents (tiny Wan 2.2 VAE, 16x spatial) as the clean first latent frame, as
// sample_latents given that first frame (the loop diffusers-wan-i2v-sampling checks against
// WanImageToVideoPipeline(expand_timesteps=True)); the result's first frame is those latents.
TEST(SamplerImageToVideo, ATi2vTrainerTakesThePromptsImageAsItsFirstFrame) {
  vttest::TempDir dir;
  const std::string model = dir.file("transformer");
  g_mkdir_with_parents(model.c_str(), 0755);
  const std::string src = vttest::reference_dir() + "/dit/wan22_ti2v_tiny";
  for (const char *f : {"config.json", "diffusion_pytorch_model.safetensors"})
    vttest::write_file(model + "/" + f, vttest::read_file(src + "/" + f));
  vttest::write_file(dir.file("model_index.json"), "{\"_class_name\": \"WanImageToVideoPipeline\", \"expand_timesteps\": true}");
  auto trainer = finished_trainer(model);
  ASSERT_TRUE(trainer);

  SamplerConfig c = sconfig();
  c.vae = vttest::reference_dir() + "/wan_vae/tiny_wan22";
  c.spatial_compression = 16;  // what a vaedecoder of that VAE answers
  const at::Tensor image = (seeded({32, 32, 3}, 6).abs() * 80).clamp(0, 255).to(at::kByte);
  SamplerEngine s(c);
  ASSERT_TRUE(s.attach(trainer)) << s.error();
  feed_prompt(s, image);
  ASSERT_TRUE(s.prompts_done()) << s.error();
  const at::Tensor got = sample_once(s);
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(got.sizes(), (at::IntArrayRef{8, 2, 2, 2}));

  torch::NoGradGuard ng;
  auto dit = models::open_dit(model, torch::kCPU);
  auto vae = vae::VaeEncoder::load(c.vae, torch::kCPU, torch::kFloat);
  const models::LatentEncode encode = [&](const at::Tensor &v) { return vae->latent(vae->encode(v)); };
  models::ImageInputs in;
  in.first_frame = models::ti2v_first_frame(models::preprocess_image(image, 32, 32), encode);
  models::SamplerOptions so;
  so.steps = c.steps;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(100));
  const at::Tensor noise = at::randn({1, 8, 2, 2, 2}, gen, at::TensorOptions(at::kFloat));
  const at::Tensor want = direct_sample(*dit, so, noise, c.guidance, gen, in);
  EXPECT_LT((got - want).norm().item<double>(), 1e-5 * want.norm().item<double>());
  EXPECT_TRUE(got.narrow(1, 0, 1).equal(in.first_frame[0])) << "the first latent frame is the image's";
}

// CogVideoX I2V (the tiny CogVideoX1.5-5B-I2V folder: patch_size_t 2, ofs): a prompt of 9 frames with an image
// samples as sample_latents given cogvideox_i2v_condition of the image through the tiny CogVideoX VAE, its
// posterior drawn from the prompt's generator before the noise (the loop and condition diffusers-wan-i2v-sampling
// checks against CogVideoXImageToVideoPipeline): 3 latent frames padded in front to 4, the padding frame dropped
// from the sample. A Wan VAE is refused naming what to set.
TEST(SamplerImageToVideo, ACogVideoXI2VTrainerSamplesFromThePromptsImage) {
  const std::string model = vttest::reference_dir() + "/dit/cogvideox15_i2v_tiny";
  auto trainer = finished_trainer(model);
  ASSERT_TRUE(trainer);

  SamplerConfig c = sconfig();
  {
    SamplerEngine s(c);
    EXPECT_FALSE(s.attach(trainer));
    EXPECT_NE(s.error().find("set ddpsampler's vae"), std::string::npos) << s.error();
  }
  const at::Tensor image = (seeded({32, 32, 3}, 8).abs() * 80).clamp(0, 255).to(at::kByte);
  const auto sample = [&](const SamplerConfig &cfg, SamplerEngine::Next expect, std::string *error) {
    SamplerEngine s(cfg);
    EXPECT_TRUE(s.attach(trainer)) << s.error();
    feed_prompt(s, image, 9);
    EXPECT_TRUE(s.prompts_done()) << s.error();
    const at::Tensor out = sample_once(s, expect);
    *error = s.error();
    return out;
  };
  std::string error;
  c.vae = vttest::reference_dir() + "/wan_vae/tiny_wan21";
  sample(c, SamplerEngine::Next::kError, &error);
  EXPECT_NE(error.find("is not the CogVideoX VAE of the trainer's model"), std::string::npos) << error;
  c.vae = vttest::reference_dir() + "/cogvideox_vae/tiny_a";
  const at::Tensor got = sample(c, SamplerEngine::Next::kSampled, &error);
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(got.sizes(), (at::IntArrayRef{4, 3, 4, 4}));  // [C, t, h, w]: 9 frames of 32x32

  torch::NoGradGuard ng;
  auto dit = models::open_dit(model, torch::kCPU);
  auto vae = vae::CogVideoXEncoder::load(c.vae, torch::kCPU, torch::kFloat);
  EXPECT_EQ(vae->image_latent_scale(),
            models::cogvideox_image_scale(vae->config().scaling_factor, vae->config().invert_scale_latents));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(100));  // prompt_buffer's seed
  models::ImageInputs in;
  in.condition = models::cogvideox_i2v_condition(
      vae->encode(models::preprocess_image(image, 32, 32).unsqueeze(2)), 3, 2,
      models::cogvideox_image_scale(vae->config().scaling_factor, vae->config().invert_scale_latents), gen);
  ASSERT_EQ(in.condition.sizes(), (at::IntArrayRef{1, 4, 4, 4, 4}));
  const at::Tensor noise = at::randn({1, 4, 4, 4, 4}, gen, at::TensorOptions(at::kFloat));
  models::SamplerOptions so;
  so.kind = models::SamplerKind::CogVideoXDPM;  // the family's default
  so.steps = c.steps;
  so.snr_shift_scale = dit->descriptor().default_shift;
  const at::Tensor want = direct_sample(*dit, so, noise, c.guidance, gen, in).slice(0, 1).permute({1, 0, 2, 3});
  EXPECT_LT((got - want).norm().item<double>(), 1e-5 * want.norm().item<double>());
}
