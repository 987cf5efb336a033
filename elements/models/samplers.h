/* Inference samplers as diffusers' schedulers step them (flow-matching Euler and UniPC for Wan,
 * CogVideoX's DDIM and DPM for v-prediction), and the pipelines' classifier-free-guided loop over a
 * native model. Torch TUs only. */
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "schedules.h"

namespace videotrain::models {

class DitModel;

enum class SamplerKind { FlowEuler, UniPC, CogVideoXDDIM, CogVideoXDPM };

// "euler" | "unipc" | "ddim" | "dpm". Throws std::invalid_argument naming the choices.
SamplerKind parse_sampler(const std::string &name);
const char *sampler_name(SamplerKind kind);
// The family a sampler belongs to: "wan" (flow) or "cogvideox" (v-prediction).
const char *sampler_family(SamplerKind kind);

struct SamplerOptions {
  SamplerKind kind = SamplerKind::UniPC;
  int steps = 50;
  double flow_shift = 3.0;       // Wan: 3.0 at 480p, 5.0 at 720p
  double snr_shift_scale = 3.0;  // CogVideoX: 3.0 for 2b, 1.0 for 5b
};

class Sampler {
 public:
  // Throws std::invalid_argument on a steps count or shift out of range.
  static std::unique_ptr<Sampler> make(const SamplerOptions &o);
  virtual ~Sampler() = default;
  const StepSchedule &schedule() const { return schedule_; }
  int steps() const { return static_cast<int>(schedule_.timesteps.size()); }
  // The model's timestep at step k for a batch of b: float32, or int64 where the scheduler truncates.
  at::Tensor timestep(int k, int64_t b) const;
  // The sample after step k (steps run in order from 0) from the model's output at step k. `gen` is the
  // pipeline's generator: the DPM step draws its noise from it.
  virtual at::Tensor step(int k, const at::Tensor &model_output, const at::Tensor &sample, at::Generator &gen) = 0;

 protected:
  StepSchedule schedule_;
};

// Image-to-video inputs passed unchanged at every step, to both guidance branches (as
// WanImageToVideoPipeline and CogVideoXImageToVideoPipeline do): `condition` in the model's layout
// (Wan [B, condition_channels, t, h, w], CogVideoX [B, F, C, h, w]; image_condition.h, i2v_inputs.h)
// concatenated after the latents on channels, `image_embeds` the image encoder's states for
// forward_image. Wan 2.2 TI2V 5B (the pipeline's expand_timesteps) instead: `first_frame` [B, C, 1, h, w],
// the image's clean latents, stand in for the first latent frame at every step (its tokens at
// timestep 0) and in the result. All undefined: text-to-video.
struct ImageInputs {
  at::Tensor condition, image_embeds, first_frame;
};

// The pipelines' loop: at each step the model's prediction for the prompt and, when guidance > 1,
// for the negative prompt, combined as uncond + guidance (cond - uncond), then the sampler's step.
// `latents` is the initial noise in the model's layout. after_step(k, latents) is called after each step.
at::Tensor sample_latents(DitModel &model, Sampler &sampler, at::Tensor latents, const at::Tensor &prompt_embeds,
                          const at::Tensor &negative_embeds, double guidance, at::Generator &gen,
                          const std::function<void(int, const at::Tensor &)> &after_step = {},
                          const ImageInputs &image = {});
// Wan 2.2 A14B, as WanPipeline with transformer_2 and boundary_ratio: step k runs `high` with `guidance`
// when its timestep >= boundary_ratio * 1000, else `low` with `guidance_2`; classifier-free guidance
// when guidance > 1 (the pipeline's test, on the first scale).
at::Tensor sample_latents_2(DitModel &high, DitModel &low, double boundary_ratio, Sampler &sampler, at::Tensor latents,
                            const at::Tensor &prompt_embeds, const at::Tensor &negative_embeds, double guidance,
                            double guidance_2, at::Generator &gen,
                            const std::function<void(int, const at::Tensor &)> &after_step = {},
                            const ImageInputs &image = {});

}  // namespace videotrain::models
