/* What WanImageToVideoPipeline and CogVideoXImageToVideoPipeline make of a prompt's image(s) before
 * their denoising loops, for ddpsampler and `videotrain-model sample`: image_inputs builds them as the
 * model's family descriptor says (model_family.h: ConditionBuild) from the preprocessed frame, the
 * condition (Wan: mask + condition latents; CogVideoX: the image's latents; image_condition.h) and the
 * image encoder's states. Torch TUs only. */
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "models/image_condition.h"

namespace videotrain::vae {
class VaeEncoder;
}

namespace videotrain::models {

class ClipVisionEncoder;
class ClipImageProcessor;
class DitModel;
struct ImageInputs;  // samplers.h

// One prompt's image(s) and the video they condition, for image_inputs.
struct ImagePrompt {
  at::Tensor image, last_image;  // 8-bit RGB [H, W, 3] (undefined: none; last_image: FLF2V's last frame)
  int64_t frames = 0, height = 0, width = 0;  // the video's pixels
  int64_t latent_frames = 0;                  // its latent frames, before any temporal patch padding
  std::vector<int64_t> noise_shape;           // the initial noise in the model's layout (what the condition fits)
};

// What image_inputs says in the caller's words (ddpsampler's properties, the tool's options).
struct ImageWords {
  std::string where;      // the prompt, "prompt 3"
  std::string model;      // "the trainer's model"
  std::string vae;        // the VAE folder as the user gave it
  std::string set_vae;    // "set vae to" (... the VAE the model was trained with)
  std::string set_sizes;  // how to make the latent sizes the VAE's
  std::string give_image; // how to give a prompt its image
};

// Where image_inputs gets its encoders: each loads on first use (the caller may keep it) and throws the
// caller's message when none is configured; `why` says what the model takes it for.
struct ImageEncoders {
  std::function<const vae::VaeEncoder &(const std::string &why)> vae;
  std::function<std::pair<const ClipVisionEncoder *, const ClipImageProcessor *>(const std::string &why)> clip;
};

// The inputs a prompt's image(s) give `dit` at every step, built as its layout's pipeline builds them
// (ModelFamily::image_layouts' ConditionBuild; `expand_timesteps`: its pipeline's flag, the family's
// expand_timesteps_layout), on `device`; the image encoder's states wherever the model takes them (image_dim).
// kImageLatents draws the image's posterior from `gen`: call it before drawing the noise, as the pipeline
// does. Empty for a text-to-video model (and an expand_timesteps one without an image). Throws
// std::runtime_error in `words` when an image, an encoder or a size does not fit.
ImageInputs image_inputs(const DitModel &dit, bool expand_timesteps, const ImagePrompt &prompt,
                         const ImageEncoders &encoders, const ImageWords &words, at::Generator &gen,
                         const c10::Device &device);

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
