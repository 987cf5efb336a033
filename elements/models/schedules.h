/* Inference schedules of diffusers' schedulers, as numbers (torch-free): the timesteps a pipeline
 * hands the model and the noise levels its step uses. Values are rounded the way diffusers rounds
 * them (float32 sigmas, integer timesteps where the scheduler truncates). */
#pragma once

#include <cstdint>
#include <vector>

namespace videotrain::models {

struct StepSchedule {
  std::vector<double> timesteps;  // [N], what the model gets
  std::vector<double> sigmas;     // [N + 1] for flow schedules (ending in 0), empty otherwise
  bool integer_timesteps = false; // the model gets int64 timesteps
};

// FlowMatchEulerDiscreteScheduler(shift): t from 1000 sigma_max to 1000 sigma_min in N steps, then shifted.
StepSchedule flowmatch_schedule(int steps, double shift);
// UniPCMultistepScheduler with use_flow_sigmas and flow_shift, final sigma 0.
StepSchedule unipc_flow_schedule(int steps, double shift);
// CogVideoX's DDIM/DPM schedule: "trailing" integer timesteps round(arange(1000, 0, -1000/N)) - 1.
StepSchedule trailing_schedule(int steps);

// CogVideoX's alphas_cumprod [1000] in float64: scaled_linear betas 0.00085..0.012, the SNR shift
// a / (s + (1 - s) a), then the zero-terminal-SNR rescale (so the last is 0).
std::vector<double> cogvideox_alphas_cumprod(double snr_shift_scale);

}  // namespace videotrain::models
