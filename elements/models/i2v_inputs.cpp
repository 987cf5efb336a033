/* See i2v_inputs.h. */
#include "models/i2v_inputs.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "models/clip_image_processor.h"
#include "models/clip_vision.h"
#include "models/model_family.h"
#include "models/native_model.h"
#include "models/samplers.h"
#include "models/vae/vae_encoder.h"

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

namespace {

// The image through VideoProcessor.preprocess at the video's size, on `device`.
at::Tensor pixels(const at::Tensor &rgb, const ImagePrompt &p, const c10::Device &device) {
  return preprocess_image(rgb, p.height, p.width).to(device);
}

// WanImageToVideoPipeline: mask + the mode latents of the image(s) at the ends of zero frames.
at::Tensor mask_and_latents(const DitModel &dit, const vae::VaeEncoder &vae, const ImagePrompt &p,
                            const ImageWords &w, const c10::Device &device) {
  const int64_t tc = vae.temporal_compression(), sc = vae.spatial_compression();
  if (tc + vae.latent_channels() != dit.condition_channels())
    throw std::runtime_error("the VAE " + w.vae + " gives " + std::to_string(tc) + " mask + " +
                             std::to_string(vae.latent_channels()) + " latent channels but the model takes " +
                             std::to_string(dit.condition_channels()) + " condition channels: " + w.set_vae +
                             " the VAE the model was trained with");
  const LatentEncode encode = [&](const at::Tensor &v) { return vae.latent(vae.encode(v)); };
  at::Tensor c = i2v_condition(pixels(p.image, p, device),
                               p.last_image.defined() ? pixels(p.last_image, p, device) : at::Tensor(), p.frames, tc,
                               encode);
  if (c.sizes().slice(2) != at::IntArrayRef(p.noise_shape).slice(2))
    throw std::runtime_error(w.where + ": the condition latents " + c10::str(c.sizes()) + " do not fit the noise " +
                             c10::str(at::IntArrayRef(p.noise_shape)) + " (VAE " + std::to_string(sc) + "x spatial, " +
                             std::to_string(tc) + "x temporal: " + w.set_sizes + ")");
  return c;
}

// CogVideoXImageToVideoPipeline: the image encoded alone, its posterior drawn from `gen`, scaled and zero-padded
// over the latent frames and to the temporal patch ([1, F, C, h, w]).
at::Tensor image_latents(const DitModel &dit, const vae::VaeEncoder &vae, const ImagePrompt &p, const ImageWords &w,
                         at::Generator &gen, const c10::Device &device) {
  const ModelFamily &f = dit.descriptor();
  if (vae.image_latent_scale() == 0.0 || vae.latent_channels() != dit.condition_channels())
    throw std::runtime_error("the VAE " + w.vae + " (" + vae.name() + ", " + std::to_string(vae.latent_channels()) +
                             " latent channels) is not the " + f.title + " VAE of " + w.model + " (" +
                             std::to_string(dit.condition_channels()) + " image latent channels): " + w.set_vae +
                             " the VAE the model was trained with");
  const int64_t patch_t = f.temporal_padding == TemporalPadding::kNone ? 1 : dit.temporal_patch();
  const at::Tensor moments = vae.encode(pixels(p.image, p, device).unsqueeze(2));
  at::Tensor c = cogvideox_i2v_condition(moments, p.latent_frames, patch_t, vae.image_latent_scale(), gen);
  if (c.sizes() != at::IntArrayRef(p.noise_shape))
    throw std::runtime_error(w.where + ": the image latents " + c10::str(c.sizes()) + " do not fit the noise " +
                             c10::str(at::IntArrayRef(p.noise_shape)) + " (" + w.set_sizes + ")");
  return c;
}

// pipeline_wan_i2v with expand_timesteps: the image's latents [1, z, 1, h, w] as the clean first frame.
at::Tensor clean_first_frame(const vae::VaeEncoder &vae, const ImagePrompt &p, const ImageWords &w,
                             const c10::Device &device) {
  const LatentEncode encode = [&](const at::Tensor &v) { return vae.latent(vae.encode(v)); };
  at::Tensor first = ti2v_first_frame(pixels(p.image, p, device), encode);
  const at::IntArrayRef noise(p.noise_shape);
  if (first.size(1) != noise[1] || first.sizes().slice(3) != noise.slice(3))
    throw std::runtime_error(w.where + ": the VAE " + w.vae + " gives first-frame latents " + c10::str(first.sizes()) +
                             " for noise " + c10::str(noise) + ": " + w.set_vae + " the VAE the model was trained with");
  return first;
}

}  // namespace

ImageInputs image_inputs(const DitModel &dit, bool expand_timesteps, const ImagePrompt &p, const ImageEncoders &enc,
                         const ImageWords &w, at::Generator &gen, const c10::Device &device) {
  const ModelFamily &f = dit.descriptor();
  ImageInputs in;
  const ImageLayout &expanded = f.expand_timesteps_layout;
  if (expand_timesteps && expanded.build == ConditionBuild::kCleanFirstFrame && p.image.defined()) {
    const auto &vae = enc.vae(w.where + " has an image for " + w.model + " of the " + expanded.name +
                              " layout (expand_timesteps; without the image it samples text-to-video)");
    in.first_frame = clean_first_frame(vae, p, w, device);
    return in;
  }
  if (dit.condition_channels() == 0 && dit.image_dim() == 0) return in;
  const ImageLayout *layout = condition_layout(f, dit.condition_channels());
  if (dit.condition_channels() > 0 && !layout)
    throw std::runtime_error("no image-to-video layout of " + std::string(f.title) + " takes the " +
                             std::to_string(dit.condition_channels()) + " condition channels of " + w.model + " (" +
                             dit.class_name() + ")");
  if (!p.image.defined())
    throw std::runtime_error(w.where + " has no image, but " + w.model + " is image-to-video: " + w.give_image);
  if (layout && layout->build == ConditionBuild::kImageLatents) {
    in.condition = image_latents(dit, enc.vae(w.model + " takes an image's latents"), p, w, gen, device);
  } else if (layout && layout->build == ConditionBuild::kMaskAndLatents) {
    in.condition = mask_and_latents(dit, enc.vae(w.model + " takes an image condition"), p, w, device);
  } else if (layout) {
    throw std::runtime_error(std::string("the ") + layout->name + " layout builds no condition from an image");
  }
  if (dit.image_dim() > 0) {
    const auto [encoder, processor] = enc.clip(w.model + " takes image embeddings (image_dim " +
                                               std::to_string(dit.image_dim()) + ")");
    std::vector<at::Tensor> imgs{p.image};
    if (p.last_image.defined()) imgs.push_back(p.last_image);
    in.image_embeds = i2v_image_embeds(*encoder, *processor, imgs, device);
  }
  return in;
}

std::string sibling_image_processor(const std::string &encoder_dir) {
  const auto p = std::filesystem::path(encoder_dir).lexically_normal().parent_path() / "image_processor";
  return std::filesystem::exists(p / "preprocessor_config.json") ? p.string() : "";
}

}  // namespace videotrain::models
