/* Image-to-video conditioning of Wan 2.1 I2V / FLF2V and Wan 2.2 I2V A14B, as diffusers'
 * WanImageToVideoPipeline.prepare_latents builds it (CogVideoX I2V's: cogvideox_image_latents below): the VAE encodes the clip's first frame followed
 * by zeros (FLF2V: first and last frames, zeros between) into condition latents, and a mask over the
 * latent frames marks the given frames. The transformer takes cat([noisy latents, mask, condition
 * latents]) on channels (16 + 4 + 16 = 36). Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

namespace videotrain::models {

// vaeencoder's condition property: which frames of the clip the model is given.
enum class ConditionFrames { none = 0, first = 1, first_last = 2 };

// A video [B, 3, T, H, W] in [-1, 1] to the VAE's latents as the model takes them: the posterior's
// mode, normalised like the training latents (Wan: (mean - latents_mean) / latents_std), [B, z, t, h, w].
using LatentEncode = std::function<at::Tensor(const at::Tensor &video)>;

// What the VAE encodes for the condition: frames[:, :, 0], zeros for the rest, and for first_last
// frames[:, :, T-1] at the end. frames [B, 3, T, H, W] in [-1, 1], T >= 2 for first_last.
at::Tensor condition_video(const at::Tensor &frames, ConditionFrames which);

// The mask [B, tc, t, h, w] (tc = temporal compression, t = (T - 1) / tc + 1) as diffusers makes it:
// one value per pixel frame (1 for a given frame), the first repeated tc times, then grouped tc at a
// time into the channels. float32 on `device`.
at::Tensor condition_mask(int64_t batch, int64_t num_frames, int64_t temporal_compression, int64_t height,
                          int64_t width, ConditionFrames which, const c10::Device &device);

// cat([mask, encode(condition_video(frames))], 1): [B, tc + z, t, h, w] in the latents' dtype, the
// channels the transformer takes after the noisy latents. Throws std::invalid_argument on shapes
// (T not 1 + tc * n, which none, an encoder whose latent frames or size disagree with the mask's).
at::Tensor image_condition(const at::Tensor &frames, ConditionFrames which, int64_t temporal_compression,
                           const LatentEncode &encode);

// CogVideoX I2V (CogVideoXImageToVideoPipeline.prepare_latents): the image latents the transformer takes after
// the noisy ones. image_z [B, C, 1, h, w]: the VAE's latent of the clip's first frame encoded alone (the
// posterior's draw or mode, not yet scaled), times `scale` (cogvideox_image_scale), then zeros to latent_frames
// frames: [B, C, latent_frames, h, w] in the latents' channels-first layout. cogvideox_latents (native_model.h)
// turns it frames-first and for 1.5's patch_size_t repeats its first frame in front, as the pipeline pads it.
// Throws std::invalid_argument on shapes.
at::Tensor cogvideox_image_latents(const at::Tensor &image_z, int64_t latent_frames, double scale);
// A CogVideoX condition [m, C, t, h, w] (cogvideox_image_latents) as the transformer takes it after the noisy
// latents: frames first, [m, F, C, h, w], with zero frames after it up to F, t rounded up to a multiple of
// patch_t. The image stays at frame 0: __call__ pads the latent frames to patch_size_t so that prepare_latents puts
// the image at frame 0 of them, and cogvideox_latents' padded x0 has the first frame there. Throws on shapes.
at::Tensor cogvideox_condition_frames(const at::Tensor &condition, int64_t patch_t);
// The pipeline's factor on the image latents: the VAE's scaling_factor, or its inverse where the VAE's config
// says invert_scale_latents (CogVideoX1.5's VAE: "the CogVideoX team forgot to multiply the scaling factor
// during training", diffusers' comment).
inline double cogvideox_image_scale(double scaling_factor, bool invert_scale_latents) {
  return invert_scale_latents ? 1.0 / scaling_factor : scaling_factor;
}

// The transformer's input in training and validation: cat([x_t, condition], 1) for a model with
// condition channels (in_channels - out_channels), x_t itself for one without. Throws
// std::runtime_error naming `model` and what to change when the condition is missing, is there for a
// text-to-video model, or does not fit x_t [m, C, t, h, w].
at::Tensor with_condition(const at::Tensor &x_t, const at::Tensor &condition, int64_t condition_channels,
                          const std::string &model);

}  // namespace videotrain::models
