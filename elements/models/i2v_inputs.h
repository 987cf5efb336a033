/* What WanImageToVideoPipeline and CogVideoXImageToVideoPipeline make of a prompt's image(s) before
 * their denoising loops, for ddpsampler and `videotrain-model sample`: the preprocessed frame, the
 * condition (Wan: mask + condition latents; CogVideoX: the image's latents; image_condition.h) and the
 * image encoder's states. Torch TUs only. */
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "models/image_condition.h"

namespace videotrain::models {

class ClipVisionEncoder;
class ClipImageProcessor;

// An 8-bit RGB image [H, W, 3] as VideoProcessor.preprocess(image, height, width) gives it:
// [1, 3, height, width] float32 in [-1, 1]. An image of another size is stretched to height x width
// with PIL's bicubic filter (diffusers resizes with PIL's lanczos: equal only when no resize is needed).
at::Tensor preprocess_image(const at::Tensor &rgb, int64_t height, int64_t width);

// prepare_latents' condition [1, tc + z, t, h, w] for a video of num_frames frames: the first image
// (and `last`, when defined: FLF2V) at the ends of zero frames, encoded by `encode`, after the mask.
// Images as preprocess_image gives them. Throws std::invalid_argument on shapes.
at::Tensor i2v_condition(const at::Tensor &first, const at::Tensor &last, int64_t num_frames, int64_t tc,
                         const LatentEncode &encode);

// Wan 2.2 TI2V 5B (expand_timesteps): the first frame's clean latents [1, z, 1, h, w], encode(image)
// of the image alone, as prepare_latents makes them.
at::Tensor ti2v_first_frame(const at::Tensor &first, const LatentEncode &encode);

// CogVideoX I2V (CogVideoXImageToVideoPipeline.prepare_latents as __call__ runs it): the image latents
// [1, F, C, h, w] the transformer takes after the noisy ones on channels. `moments` [1, 2C, 1, h, w]: the
// VAE's posterior of the preprocessed image encoded alone; the pipeline draws it (retrieve_latents'
// sample) from its generator `gen` before the initial noise, scales it by `scale` (cogvideox_image_scale)
// and zero-pads it to latent_frames, then to a multiple of patch_t (1.5) with the image at frame 0.
at::Tensor cogvideox_i2v_condition(const at::Tensor &moments, int64_t latent_frames, int64_t patch_t, double scale,
                                   at::Generator &gen);

// encode_image: the image encoder's hidden_states[-2] for 8-bit RGB images [H, W, 3] through its
// processor, [n, tokens, hidden] (FLF2V: first and last image, n = 2), float32 on `device`.
at::Tensor i2v_image_embeds(const ClipVisionEncoder &encoder, const ClipImageProcessor &processor,
                            const std::vector<at::Tensor> &images, const c10::Device &device);

// The image_processor/ folder a pipeline keeps beside `encoder_dir` (image_encoder/), or "" when none.
std::string sibling_image_processor(const std::string &encoder_dir);

}  // namespace videotrain::models
