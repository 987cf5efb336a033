/* Image-to-video conditioning (models/image_condition.h) and training on it.
 * - The condition against diffusers' WanImageToVideoPipeline.prepare_latents on the tiny Wan 2.1 VAE
 *   (tests/reference/wan_i2v_condition/condition.safetensors; generate.py beside it), first frame and
 *   first + last frame (FLF2V): the mask exactly, the condition latents within 1e-5.
 * - A native training step of a Wan 2.2 I2V-style folder (in_channels = noisy + mask + condition, no
 *   image_dim) against diffusers' forward on cat([x_t, condition]) with the loss on the noisy channels
 *   (training_step.safetensors): loss and every parameter gradient.
 * - CogVideoX I2V's image latents against CogVideoXImageToVideoPipeline.prepare_latents on the tiny CogVideoX VAE
 *   (tests/reference/cogvideox_i2v/condition.safetensors), 1.0 and 1.5 (patch_size_t, invert_scale_latents).
 * - The errors (a missing, unexpected or misshapen condition; Wan 2.1 I2V without image embeddings), Wan 2.2 A14B's
 *   expert pair on the same inputs, and a few engine steps that train.
 * VIDEOTRAIN_I2V_CONDITION_REFERENCE names another folder of the same files (the interop test's live
 * ones, tests/interop/diffusers_wan_i2v_condition.py). */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "../models/ref_cases.h"
#include "ddptrainsink/trainer_engine.h"
#include "models/image_condition.h"
#include "models/native_model.h"
#include "models/train_model.h"
#include "models/vae/cogvideox_encoder.h"
#include "models/vae/wan_encoder.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::models;
using modeltest::RefFile;
using modeltest::rel_l2;

using vttest::expect_error;

namespace {

// The folder under test, relative to the reference dir when it is the stored one.
std::string ref_folder() {
  const char *live = std::getenv("VIDEOTRAIN_I2V_CONDITION_REFERENCE");
  return live && *live ? std::string(live) : vttest::reference_dir() + "/wan_i2v_condition";
}

RefFile ref_file(const std::string &name) { return RefFile(ref_folder() + "/" + name, RefFile::kAbsolute); }

// A training_step.safetensors' inputs (Wan's carry a text mask, CogVideoX's none) and options.
ModelInputs step_inputs(const RefFile &r) {
  ModelInputs in;
  in.latents = r.get("x0");
  in.condition = r.get("condition");
  in.text_embeds = r.get("text_embeds");
  if (r.has("text_mask")) in.text_mask = r.get("text_mask");
  const auto ids = r.get("sample_ids");
  for (int64_t i = 0; i < ids.numel(); i++) in.sample_ids.push_back(static_cast<uint64_t>(ids[i].item<int64_t>()));
  in.epoch = static_cast<unsigned>(std::stoul(r.meta("epoch")));
  return in;
}

ModelOptions step_options(const RefFile &r) {
  ModelOptions o;
  o.seed = std::stoull(r.meta("seed"));
  return o;
}

std::unique_ptr<TrainModel> cpu_model(const std::string &dir, const ModelOptions &o = ModelOptions{}) {
  return make_model(dir, ModelDims{}, torch::kCPU, o);
}

// One training step on the reference's inputs against its loss (within 1e-5) and every parameter's
// gradient (grad.<name>, within 1e-4), backward run: what the step gave, for figures and more checks.
struct StepResult {
  at::Tensor loss;
  double loss_rel = 0, worst = 0;
  std::string worst_name;
  size_t parameters = 0;
};
void expect_step_matches(TrainModel &model, const ModelInputs &in, const RefFile &r, StepResult *out) {
  out->loss = model.training_step(in);
  out->loss_rel = rel_l2(out->loss.reshape({1}), r.get("loss"));
  EXPECT_LT(out->loss_rel, 1e-5) << out->loss.item<double>() << " vs " << r.get("loss");
  out->loss.backward();
  for (auto &[name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    const double e = rel_l2(p.grad(), r.get("grad." + name));
    if (e > out->worst) out->worst = e, out->worst_name = name;
    out->parameters++;
  }
  EXPECT_LT(out->worst, 1e-4) << out->worst_name;
}

// The condition reaches the loss (another condition, another loss) and validation takes it too (one
// loss per sample).
void expect_condition_used(TrainModel &model, const ModelInputs &in, const at::Tensor &loss) {
  ModelInputs other = in;
  other.condition = in.condition.flip(0);
  EXPECT_GT(std::abs(model.training_step(other).item<double>() - loss.item<double>()), 1e-6);
  EXPECT_EQ(model.validation_step(in, {1, 2}).sizes(), (std::vector<int64_t>{2}));
}

// An image-to-video model refuses inputs without a condition, naming vaeencoder's property.
void expect_condition_required(TrainModel &model, const ModelInputs &in) {
  ModelInputs none = in;
  none.condition = at::Tensor();
  expect_error([&] { model.training_step(none); }, "set vaeencoder condition=first-frame");
}

}  // namespace

TEST(ImageCondition, MatchesDiffusersPrepareLatents) {
  const RefFile r = ref_file("condition.safetensors");
  ASSERT_TRUE(r.ok());
  auto vae = vae::WanEncoder::load(vttest::reference_dir() + "/wan_vae/tiny_wan21", torch::kCPU, torch::kFloat);
  const LatentEncode encode = [&](const at::Tensor &v) { return vae->normalized_latent(vae->encode(v)); };
  int compared = 0;
  for (const std::string c : {"T9", "T5"}) {
    const auto frames = r.get("frames." + c);
    for (const auto &[key, which] : {std::pair<std::string, ConditionFrames>{"first-frame", ConditionFrames::first},
                                     {"first-last-frame", ConditionFrames::first_last}}) {
      const auto want = r.get(key + "." + c);
      const auto got = image_condition(frames, which, 4, encode);
      ASSERT_EQ(got.sizes(), want.sizes()) << key << " " << c;
      EXPECT_TRUE(torch::equal(got.narrow(1, 0, 4), want.narrow(1, 0, 4))) << key << " " << c << ": the mask";
      const double e = rel_l2(got.narrow(1, 4, got.size(1) - 4), want.narrow(1, 4, want.size(1) - 4));
      EXPECT_LT(e, 1e-5) << key << " " << c << ": condition latents";
      std::printf("FIGURE %s %s: condition latents rel L2 %.3g\n", key.c_str(), c.c_str(), e);
      compared++;
    }
  }
  EXPECT_EQ(compared, 4);
  // The clip's other frames are not what the VAE sees: encoding the whole clip gives other latents.
  const auto frames = r.get("frames.T9");
  const double whole = rel_l2(encode(frames).narrow(2, 1, 2), r.get("first-frame.T9").narrow(1, 4, 4).narrow(2, 1, 2));
  EXPECT_GT(whole, 1e-3);
  std::printf("FIGURE the whole clip's latent frames 1-2 are %.3g from the condition's\n", whole);
}

// CogVideoX I2V: CogVideoXImageToVideoPipeline.prepare_latents as __call__ runs it on the tiny CogVideoX VAE
// (tests/reference/cogvideox_i2v/condition.safetensors): the first frame encoded alone, the posterior drawn with
// the pipeline's noise, scaled (1.5: by 1 / scaling_factor, invert_scale_latents), zero-padded over the latent
// frames, frames first; for 1.5 the latent frames padded to patch_size_t with the image at frame 0.
TEST(ImageCondition, CogVideoXMatchesDiffusersPrepareLatents) {
  const RefFile r("cogvideox_i2v/condition.safetensors");
  ASSERT_TRUE(r.ok());
  auto vae = vae::CogVideoXEncoder::load(vttest::reference_dir() + "/cogvideox_vae/tiny_a", torch::kCPU, torch::kFloat);
  const auto frames = r.get("frames");
  const auto moments = vae->encode(frames.narrow(2, 0, 1));
  const auto cases = nlohmann::json::parse(r.meta("cases"));
  for (const auto &[c, info] : cases.items()) {
    SCOPED_TRACE(c);
    EXPECT_LT(rel_l2(moments, r.get("moments." + c)), 1e-5);
    const int64_t C = moments.size(1) / 2, t = (frames.size(2) - 1) / vae->temporal_compression() + 1;
    const auto z = moments.narrow(1, 0, C) + at::exp(0.5 * moments.narrow(1, C, C).clamp(-30, 20)) * r.get("noise." + c);
    const double scale = cogvideox_image_scale(vae->config().scaling_factor, info["invert_scale_latents"].get<bool>());
    const int64_t pt = info["patch_size_t"].is_number() ? info["patch_size_t"].get<int64_t>() : 1;
    const auto cond = cogvideox_image_latents(z, t, scale);  // [1, C, t, h, w] as vaeencoder gives it
    ASSERT_EQ(cond.size(2), t);
    const auto got = cogvideox_condition_frames(cond, pt), want = r.get("image_latents." + c);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LT(rel_l2(got, want), 1e-5);
    EXPECT_EQ(got.narrow(1, 1, got.size(1) - 1).abs().max().item<double>(), 0.0);  // zeros after the image
    std::printf("%s: moments %.2g, image latents %.2g (%lld frames)\n", c.c_str(), rel_l2(moments, r.get("moments." + c)),
                rel_l2(got, want), (long long)got.size(1));
  }
  expect_error([&] { cogvideox_image_latents(torch::zeros({1, 4, 2, 4, 6}), 3, 1.0); }, "encoded alone");
}

TEST(ImageCondition, MaskFramesAndErrors) {
  // FLF2V over 13 frames: latent frame 0 all given, the last latent frame's last pixel frame given.
  const auto m = condition_mask(2, 13, 4, 2, 3, ConditionFrames::first_last, torch::kCPU);
  ASSERT_EQ(m.sizes(), (std::vector<int64_t>{2, 4, 4, 2, 3}));
  const auto per = m.select(0, 0).select(-1, 0).select(-1, 0);  // [tc, t]
  // One value per pixel frame, the first repeated 4 times: 1 1 1 1 | 0 0 0 0 | 0 0 0 0 | 0 0 0 1.
  EXPECT_TRUE(torch::equal(per, torch::tensor({1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, torch::kFloat).view({4, 4}).t()))
      << per;
  const auto first = condition_mask(1, 9, 4, 1, 1, ConditionFrames::first, torch::kCPU);
  EXPECT_EQ(first.sum().item<float>(), 4.0f);
  EXPECT_EQ(first.select(2, 0).sum().item<float>(), 4.0f);
  expect_error([] { condition_mask(1, 10, 4, 1, 1, ConditionFrames::first, torch::kCPU); }, "1 + 4 n frames, not 10");
  const auto frames = torch::rand({1, 3, 5, 8, 8}) * 2 - 1;
  const auto v = condition_video(frames, ConditionFrames::first_last);
  EXPECT_TRUE(torch::equal(v.select(2, 0), frames.select(2, 0)));
  EXPECT_TRUE(torch::equal(v.select(2, 4), frames.select(2, 4)));
  EXPECT_EQ(v.narrow(2, 1, 3).abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(condition_video(frames, ConditionFrames::first).narrow(2, 1, 4).abs().sum().item<float>(), 0.0f);
  expect_error([&] { condition_video(frames.narrow(2, 0, 1), ConditionFrames::first_last); }, "T >= 2");
  expect_error([&] { condition_video(frames, ConditionFrames::none); }, "condition=none");
  expect_error([&] { image_condition(frames, ConditionFrames::first, 4, [](const at::Tensor &) { return torch::zeros({1, 4, 3, 1, 1}); }); },
               "expected [B, z, 2, h, w]");
  // The transformer's input.
  const auto x = torch::randn({2, 4, 3, 2, 2}), c = torch::randn({2, 8, 3, 2, 2});
  EXPECT_TRUE(torch::equal(with_condition(x, c, 8, "M"), torch::cat({x, c}, 1)));
  EXPECT_TRUE(torch::equal(with_condition(x, at::Tensor(), 0, "M"), x));
  expect_error([&] { with_condition(x, at::Tensor(), 8, "M"); }, "set vaeencoder condition=first-frame");
  expect_error([&] { with_condition(x, c, 0, "M"); }, "M is a text-to-video transformer");
  expect_error([&] { with_condition(x, c.narrow(1, 0, 6), 8, "M"); }, "M takes [2, 8, 3, 2, 2]");
  expect_error([&] { with_condition(x, c.narrow(0, 0, 1), 8, "M"); }, "condition has shape");
}

TEST(ImageConditionTraining, StepMatchesDiffusersForwardOnConcatenatedInput) {
  const RefFile r = ref_file("training_step.safetensors");
  ASSERT_TRUE(r.ok());
  auto model = cpu_model(ref_folder() + "/transformer", step_options(r));
  ASSERT_EQ(model->dit()->condition_channels(), 8);
  const ModelInputs in = step_inputs(r);
  StepResult s;
  ASSERT_NO_FATAL_FAILURE(expect_step_matches(*model, in, r, &s));
  EXPECT_GT(s.parameters, 30u);
  std::printf("FIGURE I2V training step vs diffusers: loss rel %.3g, worst parameter gradient %.3g (%s), %zu parameters\n",
              s.loss_rel, s.worst, s.worst_name.c_str(), s.parameters);
  expect_condition_used(*model, in, s.loss);
}

// CogVideoX1.5-I2V: a native v-prediction step on its condition (tests/reference/cogvideox_i2v/training_step:
// diffusers' forward in float64 on the noisy latents with the image latents after them, frames first, the
// 1.5 padding, ofs 2.0) — loss and every parameter gradient; its errors; the condition reaches the loss.
TEST(ImageConditionTraining, CogVideoXI2VStepMatchesDiffusers) {
  const RefFile r("cogvideox_i2v/training_step.safetensors");
  ASSERT_TRUE(r.ok());
  auto model = cpu_model(vttest::reference_dir() + "/dit/cogvideox15_i2v_tiny", step_options(r));
  ASSERT_EQ(model->dit()->condition_channels(), 4);
  const ModelInputs in = step_inputs(r);
  StepResult s;
  ASSERT_NO_FATAL_FAILURE(expect_step_matches(*model, in, r, &s));
  EXPECT_EQ(s.parameters, 2u * 24 + 16 + 4);
  std::printf("FIGURE CogVideoX I2V training step vs diffusers: loss rel %.3g, worst parameter gradient %.3g (%s)\n",
              s.loss_rel, s.worst, s.worst_name.c_str());
  expect_condition_used(*model, in, s.loss);
  expect_condition_required(*model, in);
  ModelInputs wan_style = in;
  wan_style.condition = torch::zeros({2, 8, 3, 8, 12});  // a Wan condition (mask + latents)
  expect_error([&] { model->training_step(wan_style); }, "condition=first-frame with the CogVideoX VAE");
  auto t2v = cpu_model(vttest::reference_dir() + "/dit/cogvideox15_tiny", step_options(r));
  expect_error([&] { t2v->training_step(in); }, "set vaeencoder condition=none");
}

TEST(ImageConditionTraining, ErrorsAndWan21WithoutImageEmbeds) {
  const RefFile r = ref_file("training_step.safetensors");
  ASSERT_TRUE(r.ok());
  auto model = cpu_model(ref_folder() + "/transformer", step_options(r));
  ModelInputs in = step_inputs(r);
  expect_condition_required(*model, in);
  ModelInputs wide = in;
  wide.latents = torch::cat({in.latents, in.condition}, 1);  // the condition given as latents
  expect_error([&] { model->training_step(wide); }, "takes 4: use the VAE");
  auto t2v = cpu_model(vttest::reference_dir() + "/dit/wan_t2v_tiny");
  expect_error([&] { t2v->training_step(in); }, "is a text-to-video transformer");
  // Wan 2.1 I2V trains now (test wan-i2v-training); without image embeddings it says what to add.
  auto i2v = cpu_model(vttest::reference_dir() + "/dit/wan21_i2v_tiny");
  expect_error([&] { i2v->training_step(in); }, "put an imageencoder");
}

TEST(ImageConditionTraining, ExpertPairTakesTheCondition) {
  // Wan 2.2 I2V A14B: two experts with condition channels. With the same weights in both, the pair's
  // loss is the single model's (same draws, each sample through one expert).
  const RefFile r = ref_file("training_step.safetensors");
  ASSERT_TRUE(r.ok());
  const std::string dir = ref_folder() + "/transformer";
  ModelOptions o = step_options(r);
  o.model_2 = dir;
  o.boundary_ratio = 0.5;
  auto pair = cpu_model(dir, o);
  const ModelInputs in = step_inputs(r);
  const double want = r.get("loss").item<double>();
  EXPECT_NEAR(pair->training_step(in).item<double>(), want, 1e-5 * want);
  expect_condition_required(*pair, in);
}

TEST(ImageConditionTraining, EngineStepsTrain) {
  const RefFile r = ref_file("training_step.safetensors");
  ASSERT_TRUE(r.ok());
  TrainerConfig c;
  c.model = ref_folder() + "/transformer";
  c.device = "cpu";
  c.seed = 5;
  c.lr = 3e-3;
  c.world_size = 1;
  c.rank = 0;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  ModelInputs in = step_inputs(r);
  std::vector<double> losses;
  for (uint64_t s = 0; s < 6; s++) {
    BatchInfo info;
    info.sample_ids = in.sample_ids;  // the same draws every step: the loss falls as the model fits them
    info.next_clip = s + 1;
    ASSERT_EQ(e.process_inputs(in, info), ProcessResult::kOk) << e.error();
    losses.push_back(e.last_loss());
  }
  std::printf("FIGURE I2V engine losses %.4f -> %.4f\n", losses.front(), losses.back());
  EXPECT_LT(losses.back(), 0.9 * losses.front());
  in.condition = at::Tensor();
  BatchInfo info;
  info.sample_ids = in.sample_ids;
  EXPECT_EQ(e.process_inputs(in, info), ProcessResult::kError);
  EXPECT_NE(e.error().find("condition=first-frame"), std::string::npos) << e.error();
  e.stop();
}
