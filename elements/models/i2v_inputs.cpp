/* See i2v_inputs.h. */
#include "models/i2v_inputs.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "models/clip_image_processor.h"
#include "models/clip_vision.h"

namespace videotrain::models {

at::Tensor preprocess_image(const at::Tensor &rgb, int64_t height, int64_t width) {
  if (rgb.scalar_type() != at::kByte || rgb.dim() != 3 || rgb.size(2) != 3 || rgb.size(0) < 1 || rgb.size(1) < 1)
    throw std::invalid_argument("an image-to-video image is an 8-bit RGB image [H, W, 3], not " +
                                std::string(c10::toString(rgb.scalar_type())) + " " + c10::str(rgb.sizes()));
  at::Tensor img = rgb.to(at::kCPU);
  if (img.size(0) != height || img.size(1) != width) img = resize_like_pil(img, height, width, 3);
  // VaeImageProcessor: to [0, 1], then normalize to [-1, 1].
  return (img.permute({2, 0, 1}).unsqueeze(0).to(at::kFloat) / 255.0) * 2.0 - 1.0;
}

at::Tensor i2v_condition(const at::Tensor &first, const at::Tensor &last, int64_t num_frames, int64_t tc,
                         const LatentEncode &encode) {
  if (first.dim() != 4 || first.size(0) != 1 || first.size(1) != 3 ||
      (last.defined() && last.sizes() != first.sizes()))
    throw std::invalid_argument("image-to-video images are [1, 3, H, W] (first and last the same size)");
  if (num_frames < (last.defined() ? 2 : 1))
    throw std::invalid_argument("a first-last-frame condition needs 2 frames or more");
  // The frames between stay zero (condition_video zeroes all but the ends anyway).
  auto frames = at::zeros({1, 3, num_frames, first.size(2), first.size(3)}, first.options());
  frames.select(2, 0).copy_(first);
  if (last.defined()) frames.select(2, num_frames - 1).copy_(last);
  return image_condition(frames, last.defined() ? ConditionFrames::first_last : ConditionFrames::first, tc, encode);
}

at::Tensor ti2v_first_frame(const at::Tensor &first, const LatentEncode &encode) {
  if (first.dim() != 4 || first.size(0) != 1 || first.size(1) != 3)
    throw std::invalid_argument("an image-to-video image is [1, 3, H, W]");
  return encode(first.unsqueeze(2));
}

at::Tensor cogvideox_i2v_condition(const at::Tensor &moments, int64_t latent_frames, int64_t patch_t, double scale,
                                   at::Generator &gen) {
  if (moments.dim() != 5 || moments.size(0) != 1 || moments.size(1) % 2 != 0 || moments.size(2) != 1)
    throw std::invalid_argument("a CogVideoX image's posterior is [1, 2C, 1, h, w] (the image encoded alone), not " +
                                c10::str(moments.sizes()));
  const int64_t C = moments.size(1) / 2;
  const at::Tensor m = moments.to(at::kFloat);
  // DiagonalGaussianDistribution.sample: N(0, 1) of the mean's shape from the CPU generator.
  const at::Tensor noise = at::randn(m.narrow(1, 0, C).sizes(), gen, m.options().device(at::kCPU)).to(m.device());
  const at::Tensor z = m.narrow(1, 0, C) + at::exp(0.5 * m.narrow(1, C, C).clamp(-30, 20)) * noise;
  return cogvideox_condition_frames(cogvideox_image_latents(z, latent_frames, scale), patch_t);
}

at::Tensor i2v_image_embeds(const ClipVisionEncoder &encoder, const ClipImageProcessor &processor,
                            const std::vector<at::Tensor> &images, const c10::Device &device) {
  std::vector<at::Tensor> pixels;
  for (const auto &img : images) pixels.push_back(processor.process(img));
  return encoder.penultimate_hidden_states(at::stack(pixels).to(device)).to(at::kFloat);
}

std::string sibling_image_processor(const std::string &encoder_dir) {
  const auto p = std::filesystem::path(encoder_dir).lexically_normal().parent_path() / "image_processor";
  return std::filesystem::exists(p / "preprocessor_config.json") ? p.string() : "";
}

}  // namespace videotrain::models
