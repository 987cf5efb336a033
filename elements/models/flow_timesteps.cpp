/* Timestep densities, shifts and loss weights of flow-matching training: see flow_timesteps.h. */
#include "flow_timesteps.h"

#include <algorithm>
#include <cmath>

#include "model_family.h"

namespace videotrain::models {

namespace {
constexpr double kPi = 3.14159265358979323846;
bool one_of(const std::string &v, std::initializer_list<const char *> names) {
  for (const char *n : names)
    if (v == n) return true;
  return false;
}
}  // namespace

std::string check_timestep_options(const ModelOptions &o) {
  if (!one_of(o.timestep_sampling, {"auto", "uniform", "logit-normal", "mode", "shifted"}))
    return "timestep-sampling '" + o.timestep_sampling + "' is not one of auto, uniform, logit-normal, mode, shifted";
  if (!one_of(o.loss_weighting, {"none", "sigma-sqrt", "cosmap"}))
    return "loss-weighting '" + o.loss_weighting + "' is not one of none, sigma-sqrt, cosmap";
  // Outside [-1, 2 / (pi - 2)] the mode density is not monotonic and leaves [0, 1] (SD3, section B.4).
  if (!(o.mode_scale >= -1 && o.mode_scale <= 2 / (kPi - 2)))
    return "mode-scale " + std::to_string(o.mode_scale) + " is outside [-1, 1.75] (2 / (pi - 2))";
  return "";
}

std::string check_family_timestep_options(const std::string &class_name, const ModelOptions &o) {
  const ModelFamily *f = family_of_class(class_name);
  if (!f || f->objective != Objective::kVPrediction) return "";
  if (!one_of(o.timestep_sampling, {"auto", "uniform"}))
    return "timestep-sampling=" + o.timestep_sampling +
           " is for flow-matching models (Wan); CogVideoX trains on its DDPM schedule with integer timesteps drawn "
           "uniformly (diffusers' and finetrainers' CogVideoX training do the same): leave timestep-sampling at auto "
           "or uniform, and narrow the timesteps with timestep-range";
  if (o.loss_weighting != "none")
    return "loss-weighting=" + o.loss_weighting +
           " is for flow-matching models (Wan); CogVideoX's v-prediction loss is weighted 1 / (1 - alphas_cumprod) as "
           "diffusers' CogVideoX training weighs it: leave loss-weighting at none";
  return "";
}

std::string flow_sampling(const ModelOptions &o) {
  return o.timestep_sampling == "auto" ? std::string("logit-normal") : o.timestep_sampling;
}

bool draws_normal(const ModelOptions &o) {
  const std::string s = flow_sampling(o);
  return s == "logit-normal" || s == "shifted";
}

double timestep_density(const ModelOptions &o, double draw) {
  if (draws_normal(o)) return 1.0 / (1.0 + std::exp(-(o.logit_mean + o.logit_std * draw)));
  if (flow_sampling(o) == "mode") {
    const double c = std::cos(kPi * draw / 2);
    return 1 - draw - o.mode_scale * (c * c - 1 + draw);
  }
  return draw;
}

double shift_sigma(double s, double shift) { return shift * s / (1 + (shift - 1) * s); }

int64_t frame_tokens(int64_t latent_h, int64_t latent_w) { return (latent_h / 2) * (latent_w / 2); }

double resolution_shift(int64_t tokens) {
  constexpr double base_tokens = 256, max_tokens = 4096, base_shift = 0.5, max_shift = 1.15;
  const double m = (max_shift - base_shift) / (max_tokens - base_tokens);
  return std::exp(static_cast<double>(tokens) * m + (base_shift - m * base_tokens));
}

double sample_shift(const ModelOptions &o, int64_t latent_h, int64_t latent_w) {
  return flow_sampling(o) == "shifted" ? resolution_shift(frame_tokens(latent_h, latent_w)) : o.flow_shift;
}

double flow_sigma(const ModelOptions &o, double u, double shift) {
  return (o.timestep_lo + (o.timestep_hi - o.timestep_lo) * shift_sigma(u, shift)) / 1000.0;
}

double flow_loss_weight(const std::string &weighting, double sigma) {
  if (weighting == "sigma-sqrt") {
    const double s = std::max(sigma, 1e-3);
    return 1.0 / (s * s);
  }
  if (weighting == "cosmap") return 2.0 / (kPi * (1 - 2 * sigma + 2 * sigma * sigma));
  return 1.0;
}

}  // namespace videotrain::models
