/* What WanImageToVideoPipeline makes of a prompt's image(s) before its denoising loop, for
 * ddpsampler and `videotrain-model sample`: the preprocessed frame, the condition (mask + condition
 * latents, image_condition.h) and the image encoder's states. Torch TUs only. */
#pragma once

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

// encode_image: the image encoder's hidden_states[-2] for 8-bit RGB images [H, W, 3] through its
// processor, [n, tokens, hidden] (FLF2V: first and last image, n = 2), float32 on `device`.
at::Tensor i2v_image_embeds(const ClipVisionEncoder &encoder, const ClipImageProcessor &processor,
                            const std::vector<at::Tensor> &images, const c10::Device &device);

// The image_processor/ folder a pipeline keeps beside `encoder_dir` (image_encoder/), or "" when none.
std::string sibling_image_processor(const std::string &encoder_dir);

}  // namespace videotrain::models
