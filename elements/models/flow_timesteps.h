/* How a native model's training draws each sample's timestep and weighs its loss: the densities of
 * diffusers' training_utils.compute_density_for_timestep_sampling, the flow shift (fixed, or from the
 * sample's resolution as diffusers' calculate_shift), and compute_loss_weighting_for_sd3. Plain
 * arithmetic on the generator's first draw (the torch side, draw_flow, lives in native_model.h), so
 * that the formulas are testable alone. No torch. */
#pragma once

#include <cstdint>
#include <string>

#include "model_options.h"

namespace videotrain::models {

// The values of ddptrainsink's timestep-sampling and loss-weighting ("" when valid, else the reason).
std::string check_timestep_options(const ModelOptions &o);
// Start-time refusal of what a family cannot train with: CogVideoX (DDPM v-prediction) draws its
// integer timesteps uniformly and weighs its loss 1 / (1 - alphas_cumprod), so it takes
// timestep-sampling auto|uniform and loss-weighting none only. "" when the options fit `class_name`.
std::string check_family_timestep_options(const std::string &class_name, const ModelOptions &o);

// The sampling a flow model uses: "auto" is logit-normal.
std::string flow_sampling(const ModelOptions &o);
// Whether a sample's first draw is N(0, 1) (logit-normal, shifted) rather than U[0, 1).
bool draws_normal(const ModelOptions &o);
// u in [0, 1] from that draw, as compute_density_for_timestep_sampling turns its torch.normal /
// torch.rand numbers into u: sigmoid(logit-mean + logit-std * n); 1 - r - mode-scale * (cos^2(pi r/2) - 1 + r);
// or r itself.
double timestep_density(const ModelOptions &o, double draw);

// sigma' = s sigma / (1 + (s - 1) sigma) (FlowMatchEulerDiscreteScheduler's shift).
double shift_sigma(double sigma, double shift);
// Tokens per latent frame as the resolution shift counts them: (h / 2) * (w / 2), a 2x2 patch (Wan's;
// musubi-tuner's and diffusion-pipe's flux_shift count the same).
int64_t frame_tokens(int64_t latent_h, int64_t latent_w);
// exp(mu), mu = calculate_shift(tokens) with diffusers' defaults: linear from 0.5 at 256 tokens to
// 1.15 at 4096 (Wan 480p, 60x104 latents: 1560 tokens, shift 2.06; 720p, 90x160: 3600, 2.90).
double resolution_shift(int64_t tokens);
// The shift a sample gets: flow-shift, or resolution_shift for timestep-sampling=shifted.
double sample_shift(const ModelOptions &o, int64_t latent_h, int64_t latent_w);
// sigma = (lo + (hi - lo) * shift_sigma(u, shift)) / 1000 (timestep-range).
double flow_sigma(const ModelOptions &o, double u, double shift);

// compute_loss_weighting_for_sd3 for one sigma: none 1; sigma-sqrt sigma^-2 (sigma taken at least
// 1/1000, the smallest training sigma of the discrete schedule diffusers draws from, so that a
// uniform draw of exactly 0 cannot make the loss infinite); cosmap 2 / (pi (1 - 2 sigma + 2 sigma^2)).
double flow_loss_weight(const std::string &weighting, double sigma);

// One sample's draw, for videotrain-model timesteps and the tests.
struct FlowDraw {
  uint64_t generator_seed = 0;  // the sample's CPU generator (torch.Generator().manual_seed(it))
  double draw = 0;              // its first number: N(0, 1) or U[0, 1) (draws_normal)
  double u = 0, shift = 1, sigma = 0, weight = 1;
};

}  // namespace videotrain::models
