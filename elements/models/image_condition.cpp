/* See image_condition.h. */
#include "image_condition.h"

#include <ATen/ATen.h>

#include <sstream>
#include <stdexcept>

namespace videotrain::models {

namespace {
void check_frames(const at::Tensor &frames, ConditionFrames which) {
  if (which == ConditionFrames::none) throw std::invalid_argument("no condition frames asked for (condition=none)");
  if (frames.dim() != 5 || frames.size(1) != 3 || frames.size(2) < (which == ConditionFrames::first_last ? 2 : 1)) {
    std::ostringstream s;
    s << "condition frames have shape " << frames.sizes() << "; expected [B, 3, T, H, W]"
      << (which == ConditionFrames::first_last ? " with T >= 2 (first and last frame)" : "");
    throw std::invalid_argument(s.str());
  }
}
}  // namespace

at::Tensor condition_video(const at::Tensor &frames, ConditionFrames which) {
  check_frames(frames, which);
  auto v = at::zeros_like(frames);
  v.narrow(2, 0, 1).copy_(frames.narrow(2, 0, 1));
  const int64_t T = frames.size(2);
  if (which == ConditionFrames::first_last) v.narrow(2, T - 1, 1).copy_(frames.narrow(2, T - 1, 1));
  return v;
}

at::Tensor condition_mask(int64_t batch, int64_t num_frames, int64_t tc, int64_t height, int64_t width,
                          ConditionFrames which, const c10::Device &device) {
  if (tc < 1 || num_frames < 1 || (num_frames - 1) % tc != 0)
    throw std::invalid_argument("a condition mask needs 1 + " + std::to_string(tc) + " n frames, not " +
                                std::to_string(num_frames));
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  auto per_frame = at::zeros({batch, 1, num_frames, height, width}, opts);
  per_frame.narrow(2, 0, 1).fill_(1);
  if (which == ConditionFrames::first_last) per_frame.narrow(2, num_frames - 1, 1).fill_(1);
  // The first frame stands for tc frames (the VAE encodes it alone into the first latent frame), so
  // with it repeated the pixel frames group tc to a latent frame.
  auto m = at::cat({per_frame.narrow(2, 0, 1).repeat_interleave(tc, 2), per_frame.narrow(2, 1, num_frames - 1)}, 2);
  return m.view({batch, -1, tc, height, width}).transpose(1, 2).contiguous();
}

at::Tensor image_condition(const at::Tensor &frames, ConditionFrames which, int64_t tc, const LatentEncode &encode) {
  check_frames(frames, which);
  const at::Tensor z = encode(condition_video(frames, which));
  const int64_t T = frames.size(2), t = (T - 1) / tc + 1;
  if (z.dim() != 5 || z.size(0) != frames.size(0) || z.size(2) != t) {
    std::ostringstream s;
    s << "the VAE gave condition latents of shape " << z.sizes() << " for frames " << frames.sizes()
      << "; expected [B, z, " << t << ", h, w]";
    throw std::invalid_argument(s.str());
  }
  const auto mask = condition_mask(frames.size(0), T, tc, z.size(3), z.size(4), which, z.device());
  return at::cat({mask.to(z.scalar_type()), z}, 1);
}

at::Tensor cogvideox_image_latents(const at::Tensor &z, int64_t latent_frames, double scale) {
  if (z.dim() != 5 || z.size(2) != 1 || latent_frames < 1) {
    std::ostringstream s;
    s << "CogVideoX image latents: the first frame's latents have shape " << z.sizes() << " for " << latent_frames
      << " latent frames; expected [B, C, 1, h, w] (the frame encoded alone) and at least 1 frame";
    throw std::invalid_argument(s.str());
  }
  return at::constant_pad_nd(z * scale, {0, 0, 0, 0, 0, latent_frames - 1});
}

at::Tensor cogvideox_condition_frames(const at::Tensor &condition, int64_t patch_t) {
  if (condition.dim() != 5 || patch_t < 1) {
    std::ostringstream s;
    s << "a CogVideoX condition has shape " << condition.sizes() << "; expected [m, C, t, h, w]";
    throw std::invalid_argument(s.str());
  }
  const int64_t t = condition.size(2), pad = (patch_t - t % patch_t) % patch_t;
  return at::constant_pad_nd(condition, {0, 0, 0, 0, 0, pad}).transpose(1, 2).contiguous();
}

at::Tensor with_condition(const at::Tensor &x_t, const at::Tensor &condition, int64_t channels, const std::string &model) {
  if (channels == 0 && !condition.defined()) return x_t;
  if (channels == 0)
    throw std::runtime_error("the micro-batches carry an image condition (vaeencoder condition=) but " + model +
                             " is a text-to-video transformer: set vaeencoder condition=none, or train an "
                             "image-to-video folder");
  if (!condition.defined())
    throw std::runtime_error(model + " is an image-to-video transformer (" + std::to_string(channels) +
                             " input channels of mask and condition latents beside the noisy latents): set vaeencoder "
                             "condition=first-frame (first-last-frame for FLF2V) so that each sample carries them");
  if (condition.dim() != 5 || condition.size(0) != x_t.size(0) || condition.size(1) != channels ||
      condition.sizes().slice(2) != x_t.sizes().slice(2)) {
    std::ostringstream s;
    s << "the micro-batch's condition has shape " << condition.sizes() << " beside latents " << x_t.sizes() << "; "
      << model << " takes [" << x_t.size(0) << ", " << channels << ", " << x_t.size(2) << ", " << x_t.size(3) << ", "
      << x_t.size(4) << "] (mask channels = the VAE's temporal compression, then its latent channels: the same VAE "
      << "as the latents)";
    throw std::runtime_error(s.str());
  }
  return at::cat({x_t, condition.to(x_t.device(), x_t.scalar_type())}, 1);
}

}  // namespace videotrain::models
