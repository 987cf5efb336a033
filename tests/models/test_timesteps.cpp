/* ddptrainsink's timestep sampling and loss weighting for native flow (Wan) training against
 * tests/reference/timesteps/timesteps.json (make_timesteps.py: plain PyTorch and the published
 * formulas); diffusers' own functions check the same draws in tests/interop/diffusers_training_utils.py. */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "models/flow_timesteps.h"
#include "models/native_model.h"
#include "models/train_model.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::models;

namespace {

const nlohmann::json &reference() {
  static const nlohmann::json j =
      nlohmann::json::parse(vttest::read_file(vttest::reference_dir() + "/timesteps/timesteps.json"));
  return j;
}

ModelOptions options_of(const nlohmann::json &c) {
  ModelOptions o;
  o.timestep_sampling = c["sampling"];
  o.seed = c["seed"];
  o.logit_mean = c["logit_mean"];
  o.logit_std = c["logit_std"];
  o.mode_scale = c["mode_scale"];
  o.flow_shift = c["flow_shift"];
  o.timestep_lo = c["range"][0];
  o.timestep_hi = c["range"][1];
  o.loss_weighting = c["weighting"];
  return o;
}

}  // namespace

// Each sample's generator seed, first draw, u, shift, sigma and weight, through draw_flow (the
// trainer's own path) for the whole batch at once.
TEST(Timesteps, DrawsEqualTheReferenceFormulas) {
  for (const auto &c : reference()["cases"]) {
    const ModelOptions o = options_of(c);
    const std::string tag = c["sampling"].get<std::string>() + " " + o.loss_weighting;
    ASSERT_EQ(check_timestep_options(o), "") << tag;
    const std::vector<uint64_t> ids = c["ids"];
    std::vector<int64_t> shape{static_cast<int64_t>(ids.size())};
    for (const auto &d : c["latent"]) shape.push_back(d);
    at::Tensor sigma, noise;
    std::vector<FlowDraw> draws;
    draw_flow(torch::zeros(shape), ids, c["epoch"], o, &sigma, &noise, &draws);
    ASSERT_EQ(draws.size(), ids.size());
    const auto weights = flow_loss_weights(sigma, o.loss_weighting);
    for (size_t i = 0; i < ids.size(); i++) {
      const auto &r = c["samples"][i];
      const FlowDraw &d = draws[i];
      EXPECT_EQ(d.generator_seed, r["generator_seed"].get<uint64_t>()) << tag << " sample " << ids[i];
      EXPECT_NEAR(d.draw, r["draw"].get<double>(), 1e-12) << tag << " sample " << ids[i];
      EXPECT_NEAR(d.u, r["u"].get<double>(), 1e-12) << tag << " sample " << ids[i];
      EXPECT_NEAR(d.shift, r["shift"].get<double>(), 1e-12) << tag;
      EXPECT_NEAR(d.sigma, r["sigma"].get<double>(), 1e-12) << tag << " sample " << ids[i];
      EXPECT_NEAR(d.weight / r["weight"].get<double>(), 1.0, 1e-12) << tag << " sample " << ids[i];
      EXPECT_EQ(sigma[i].item<float>(), static_cast<float>(d.sigma)) << tag;
      EXPECT_NEAR(weights[i].item<double>() / d.weight, 1.0, 1e-6) << tag;  // from the float32 sigma
      EXPECT_GE(d.sigma, o.timestep_lo / 1000);
      EXPECT_LE(d.sigma, o.timestep_hi / 1000);
    }
  }
}

// The weighted loss as diffusers' scripts take it, and weighting none is plain MSE.
TEST(Timesteps, WeightedLossEqualsTheReference) {
  const auto &l = reference()["loss"];
  const std::vector<int64_t> shape = l["shape"];
  const auto pred = torch::tensor(l["pred"].get<std::vector<double>>(), torch::kDouble).view(shape).to(torch::kFloat);
  const auto target =
      torch::tensor(l["target"].get<std::vector<double>>(), torch::kDouble).view(shape).to(torch::kFloat);
  const auto sigma = torch::tensor(l["sigmas"].get<std::vector<double>>(), torch::kDouble).to(torch::kFloat);
  for (const std::string w : {"none", "sigma-sqrt", "cosmap"}) {
    const double ref = l["losses"][w];
    const double got = flow_loss(pred, target, flow_loss_weights(sigma, w)).item<double>();
    EXPECT_NEAR(got / ref, 1.0, 1e-5) << w;
  }
  EXPECT_NEAR(flow_loss(pred, target, flow_loss_weights(sigma, "none")).item<double>(),
              torch::mse_loss(pred, target).item<double>(), 1e-6);
  // sigma-sqrt at sigma 0 (a uniform draw of exactly 0) is finite: sigma is taken at least 1/1000.
  EXPECT_EQ(flow_loss_weight("sigma-sqrt", 0.0), 1e6);
}

// Densities over many samples: uniform's mean 1/2, logit-normal's median 1/2 (mean 0), mode with a
// positive scale puts more mass in the middle than uniform; shifts move sigma up.
TEST(Timesteps, DensitiesHaveTheirShapes) {
  ModelOptions o;
  o.flow_shift = 1;
  std::vector<uint64_t> ids(4000);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = i;
  auto middle_share = [&](const std::string &sampling, double shift) {
    o.timestep_sampling = sampling;
    o.flow_shift = shift;
    at::Tensor sigma, noise;
    draw_flow(torch::zeros({static_cast<int64_t>(ids.size()), 1, 1, 2, 2}), ids, 0, o, &sigma, &noise);
    return std::make_pair(((sigma > 0.25) & (sigma < 0.75)).to(torch::kDouble).mean().item<double>(),
                          sigma.to(torch::kDouble).mean().item<double>());
  };
  const auto uni = middle_share("uniform", 1), ln = middle_share("logit-normal", 1), mode = middle_share("mode", 1);
  EXPECT_NEAR(uni.first, 0.5, 0.03);
  EXPECT_NEAR(uni.second, 0.5, 0.02);
  EXPECT_NEAR(ln.second, 0.5, 0.02);
  EXPECT_GT(ln.first, 0.6);    // sigmoid(N(0,1)) in (1/4, 3/4): P(|n| < 1.0986) = 0.73
  EXPECT_GT(mode.first, 0.6);  // mode-scale 1.29 concentrates on the middle
  EXPECT_GT(middle_share("logit-normal", 3).second, ln.second + 0.15);
}

// Bad names and values are start errors naming the property; CogVideoX refuses what it cannot train.
TEST(Timesteps, BadOptionsAndCogVideoXAreRefusedNamingTheProperty) {
  ModelOptions o;
  EXPECT_EQ(check_timestep_options(o), "");
  EXPECT_EQ(o.timestep_sampling, "auto");
  EXPECT_EQ(flow_sampling(o), "logit-normal");  // the default of every run before these options
  o.timestep_sampling = "sigma";
  EXPECT_NE(check_timestep_options(o).find("timestep-sampling 'sigma' is not one of"), std::string::npos);
  o = ModelOptions{};
  o.loss_weighting = "logit_normal";
  EXPECT_NE(check_timestep_options(o).find("loss-weighting 'logit_normal'"), std::string::npos);
  o = ModelOptions{};
  o.mode_scale = 3;
  EXPECT_NE(check_timestep_options(o).find("mode-scale"), std::string::npos);
  for (const std::string s : {"auto", "uniform"}) {
    o = ModelOptions{};
    o.timestep_sampling = s;
    EXPECT_EQ(check_family_timestep_options("CogVideoXTransformer3DModel", o), "") << s;
  }
  for (const std::string s : {"logit-normal", "mode", "shifted"}) {
    o = ModelOptions{};
    o.timestep_sampling = s;
    EXPECT_NE(check_family_timestep_options("CogVideoXTransformer3DModel", o).find("timestep-sampling=" + s),
              std::string::npos);
    EXPECT_EQ(check_family_timestep_options("WanTransformer3DModel", o), "");
  }
  o = ModelOptions{};
  o.loss_weighting = "cosmap";
  EXPECT_NE(check_family_timestep_options("CogVideoXTransformer3DModel", o).find("loss-weighting=cosmap"),
            std::string::npos);
  // The model itself refuses them too (an app that builds it without ddptrainsink's start checks).
  o.loss_weighting = "none";
  o.timestep_sampling = "mode";
  const std::string cog = vttest::reference_dir() + "/dit/cogvideox_2b_tiny";
  EXPECT_EQ(model_folder_class(cog), "CogVideoXTransformer3DModel");
  try {
    make_model(cog, ModelDims{}, torch::kCPU, o);
    ADD_FAILURE() << "CogVideoX with timestep-sampling=mode was built";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("timestep-sampling=mode"), std::string::npos) << e.what();
  }
}

// The trainer's step on the tiny Wan folder: its loss is flow_loss over the sigmas draw_flow gives
// (weighting none: plain MSE, the loss of every run before loss-weighting), and a weighting changes it.
TEST(Timesteps, TrainingStepWeighsEachSamplesLoss) {
  const std::string dir = vttest::reference_dir() + "/dit/wan_t2v_tiny";
  ModelInputs in;
  torch::manual_seed(0);
  in.latents = torch::randn({3, 4, 3, 8, 12});
  in.text_embeds = torch::randn({3, 7, 32});
  in.text_mask = torch::ones({3, 7}, torch::kLong);
  in.sample_ids = {5, 9, 1000};
  in.epoch = 2;
  torch::NoGradGuard ng;
  std::map<std::string, float> losses;
  for (const std::string w : {"none", "sigma-sqrt", "cosmap"}) {
    ModelOptions o;
    o.seed = 3;
    o.timestep_sampling = "mode";
    o.loss_weighting = w;
    auto m = make_model(dir, ModelDims{}, torch::kCPU, o);
    auto *dit = m->dit();
    ASSERT_NE(dit, nullptr);
    at::Tensor sigma, noise, x_t, t, target;
    draw_flow(in.latents, in.sample_ids, in.epoch, o, &sigma, &noise);
    flow_terms(in.latents, noise, sigma, &x_t, &t, &target);
    const auto pred = dit->forward(x_t, t, zero_text_padding(in.text_embeds, in.text_mask));
    const float expect = flow_loss(pred, target, flow_loss_weights(sigma, w)).item<float>();
    losses[w] = m->training_step(in).item<float>();
    EXPECT_NEAR(losses[w] / expect, 1.0, 1e-5) << w;
  }
  EXPECT_GT(std::abs(losses["sigma-sqrt"] / losses["none"] - 1), 1e-3);
  EXPECT_GT(std::abs(losses["cosmap"] / losses["none"] - 1), 1e-3);
}
