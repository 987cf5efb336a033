/* videotrain-model timesteps: each sample's timestep draw, shift, sigma and loss weight, as a native
 * Wan model's training draws them (draw_flow), printed as JSON, so that other tools (and the interop
 * test against diffusers' training_utils) can check them. */
#include <torch/torch.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model_tool.h"
#include "models/flow_timesteps.h"
#include "models/native_model.h"

namespace videotrain::model_tool {

namespace {

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);) out.push_back(item);
  return out;
}

nlohmann::json as_json(const models::FlowDraw &d) {
  return {{"generator_seed", d.generator_seed}, {"draw", d.draw}, {"u", d.u}, {"shift", d.shift},
          {"sigma", d.sigma}, {"timestep", d.sigma * 1000.0}, {"weight", d.weight}};
}

}  // namespace

// timesteps [--sampling S] [--logit-mean M] [--logit-std S] [--mode-scale S] [--flow-shift S]
//   [--range LO,HI] [--weighting W] [--latent CxTxHxW] (--ids I,J,... [--seed N] [--epoch E] | --draws X,Y,...)
// --ids: the samples' own generators (seed, id, epoch) through draw_flow; --draws: the given first
// numbers (N(0,1) for logit-normal and shifted, U[0,1) otherwise) through the same formulas.
int timesteps_command(std::vector<std::string> args) {
  ModelOptions o;
  o.timestep_sampling = opt(args, "--sampling", o.timestep_sampling);
  o.logit_mean = std::stod(opt(args, "--logit-mean", "0"));
  o.logit_std = std::stod(opt(args, "--logit-std", "1"));
  o.mode_scale = std::stod(opt(args, "--mode-scale", "1.29"));
  o.flow_shift = std::stod(opt(args, "--flow-shift", "3"));
  o.loss_weighting = opt(args, "--weighting", o.loss_weighting);
  o.seed = std::stoull(opt(args, "--seed", "0"));
  const unsigned epoch = static_cast<unsigned>(std::stoul(opt(args, "--epoch", "0")));
  const auto range = split(opt(args, "--range", "0,1000"), ',');
  const auto latent = split(opt(args, "--latent", "16x1x60x104"), 'x');
  const std::string ids_text = opt(args, "--ids", ""), draws_text = opt(args, "--draws", "");
  if (!args.empty() || range.size() != 2 || latent.size() != 4 || ids_text.empty() == draws_text.empty())
    return usage();
  o.timestep_lo = std::stod(range[0]);
  o.timestep_hi = std::stod(range[1]);
  if (std::string why = models::check_timestep_options(o); !why.empty()) throw std::invalid_argument(why);
  if (!(o.timestep_lo >= 0 && o.timestep_lo < o.timestep_hi && o.timestep_hi <= 1000))
    throw std::invalid_argument("--range must be LO,HI with 0 <= LO < HI <= 1000");
  std::vector<int64_t> shape{1};
  for (const auto &d : latent) shape.push_back(std::stoll(d));
  nlohmann::json samples = nlohmann::json::array();
  if (!draws_text.empty()) {
    const double shift = models::sample_shift(o, shape[3], shape[4]);
    for (const auto &x : split(draws_text, ',')) {
      models::FlowDraw d;
      d.draw = std::stod(x);
      d.u = models::timestep_density(o, d.draw);
      d.shift = shift;
      d.sigma = models::flow_sigma(o, d.u, shift);
      d.weight = models::flow_loss_weight(o.loss_weighting, d.sigma);
      auto j = as_json(d);
      j.erase("generator_seed");
      samples.push_back(j);
    }
  } else {
    const auto x0 = torch::zeros(shape);  // one sample at a time: the noise of a large latent stays small
    for (const auto &id_text : split(ids_text, ',')) {
      const uint64_t id = std::stoull(id_text);
      at::Tensor sigma, noise;
      std::vector<models::FlowDraw> d;
      models::draw_flow(x0, {id}, epoch, o, &sigma, &noise, &d);
      auto j = as_json(d[0]);
      j["id"] = id;
      j["sigma_float32"] = sigma[0].item<double>();  // what flow_terms gets
      j["loss_weight_float32"] = models::flow_loss_weights(sigma, o.loss_weighting)[0].item<double>();
      samples.push_back(j);
    }
  }
  const nlohmann::json out = {{"sampling", models::flow_sampling(o)}, {"loss_weighting", o.loss_weighting},
                              {"seed", o.seed},  {"epoch", epoch},
                              {"frame_tokens", models::frame_tokens(shape[3], shape[4])},
                              {"samples", samples}};
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

}  // namespace videotrain::model_tool
