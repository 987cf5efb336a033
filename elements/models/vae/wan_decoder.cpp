/* The Wan 2.1 / 2.2 decoder (diffusers WanDecoder3d): one latent frame at a time; each causal
 * convolution keeps its last 2 input frames (zeros before the first chunk), each temporal
 * upsampler passes the first chunk's frame through alone and doubles every later one (a causal
 * time convolution to twice the channels, interleaved into frames). Wan 2.2 adds residual up
 * blocks whose shortcut spreads channels over 2x2 pixels (and 2 frames) and unfolds 2x2 pixel
 * patches at the end. */
#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

#include "cpu_conv.h"
#include "models/vae/vae_config.h"
#include "models/vae/vae_decoder.h"
#include "models/vae/wan_config.h"
#include "regular_file.h"

namespace videotrain::vae {

namespace {

class WanDecoder final : public VaeDecoder {
 public:
  WanDecoder(const WanConfig &cfg, std::map<std::string, at::Tensor> w, c10::Device device, c10::ScalarType dtype)
      : VaeDecoder(cfg.patch_size > 1 ? Family::Wan22 : Family::Wan21, cfg.z_dim, cfg.spatial_compression(),
                   cfg.patch_size, true),
        cfg_(cfg), w_(std::move(w)), device_(device), dtype_(dtype) {
    for (int i = static_cast<int>(cfg.temperal_downsample.size()) - 1; i >= 0; i--)
      time_up_.push_back(cfg.temperal_downsample[static_cast<size_t>(i)]);
  }

  int64_t frames_for(int64_t latent_frames) const override {
    return latent_frames < 1 ? 0 : 1 + cfg_.temporal_compression() * (latent_frames - 1);
  }

  // As pipeline_wan: latents / (1 / std) + mean per channel.
  at::Tensor denormalize(const at::Tensor &latents) const override {
    std::vector<int64_t> shape(static_cast<size_t>(latents.dim()), 1);
    shape[1] = cfg_.z_dim;
    auto opts = at::TensorOptions().dtype(at::kDouble);
    at::Tensor mean = at::tensor(cfg_.latents_mean, opts).to(at::kFloat).view(shape).to(latents.device());
    at::Tensor inv_std = 1.0 / at::tensor(cfg_.latents_std, opts).to(at::kFloat).view(shape).to(latents.device());
    return latents.to(at::kFloat) / inv_std + mean;
  }

 protected:
  std::vector<std::pair<int64_t, int64_t>> chunks(int64_t t) const override {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int64_t k = 0; k < t; k++) out.emplace_back(k, k + 1);
    return out;
  }

  at::Tensor forward(const at::Tensor &z_in, Cache &cache, bool first) const override {
    at::Tensor x = conv("post_quant_conv", z_in.to(device_, dtype_));
    x = causal("decoder.conv_in", x, cache);
    x = resnet("decoder.mid_block.resnets.0", x, cache);
    x = attention("decoder.mid_block.attentions.0", x);
    x = resnet("decoder.mid_block.resnets.1", x, cache);
    const int levels = cfg_.levels();
    for (int i = 0; i < levels; i++) {
      const std::string p = "decoder.up_blocks." + std::to_string(i);
      const bool up = i != levels - 1, time = up && time_up_[static_cast<size_t>(i)];
      at::Tensor shortcut = x;
      for (int r = 0; r <= cfg_.num_res_blocks; r++) x = resnet(p + ".resnets." + std::to_string(r), x, cache);
      if (up) x = upsample(p + (cfg_.is_residual ? ".upsampler" : ".upsamplers.0"), x, time, cache);
      if (up && cfg_.is_residual) x = x + dup_up(shortcut, x.size(1), time ? 2 : 1, first);
    }
    x = at::silu(rms("decoder.norm_out", x));
    return causal("decoder.conv_out", x, cache);
  }

 private:
  at::Tensor conv(const std::string &p, const at::Tensor &x) const {
    return conv3d_fast(x, w_.at(p + ".weight"), w_.at(p + ".bias"), {1, 1, 1}, {0, 0, 0});
  }
  at::Tensor causal(const std::string &p, const at::Tensor &x, Cache &cache) const {
    return causal_conv3d(conv_of(w_, p), x, cache.next(), false);
  }
  // F.normalize over channels times sqrt(channels) times gamma.
  at::Tensor rms(const std::string &p, const at::Tensor &x) const {
    at::Tensor n = x / x.norm(2, {1}, true).clamp_min(1e-12);
    return n * std::sqrt(static_cast<double>(x.size(1))) * w_.at(p + ".gamma");
  }
  at::Tensor resnet(const std::string &p, const at::Tensor &x, Cache &cache) const {
    at::Tensor h = w_.count(p + ".conv_shortcut.weight") ? conv(p + ".conv_shortcut", x) : x;
    at::Tensor y = causal(p + ".conv1", at::silu(rms(p + ".norm1", x)), cache);
    y = causal(p + ".conv2", at::silu(rms(p + ".norm2", y)), cache);
    return y + h;
  }
  // Single-head self-attention over each frame's positions.
  at::Tensor attention(const std::string &p, const at::Tensor &x) const {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
    at::Tensor y = rms(p + ".norm", x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, w}));
    at::Tensor qkv = at::conv2d(y, w_.at(p + ".to_qkv.weight"), w_.at(p + ".to_qkv.bias"))
                         .reshape({b * t, 3 * c, h * w})
                         .transpose(1, 2);
    auto parts = qkv.chunk(3, -1);
    at::Tensor att =
        at::softmax(at::matmul(parts[0], parts[1].transpose(1, 2)) / std::sqrt(static_cast<double>(c)), -1);
    y = at::matmul(att, parts[2]).transpose(1, 2).reshape({b * t, c, h, w});
    y = at::conv2d(y, w_.at(p + ".proj.weight"), w_.at(p + ".proj.bias"));
    return y.view({b, t, c, h, w}).permute({0, 2, 1, 3, 4}) + x;
  }
  // 2x nearest in space then a 3x3 conv per frame; with `time`, frames doubled first (except
  // the first chunk's): a causal (3, 1, 1) conv to 2C channels, halves interleaved in time.
  at::Tensor upsample(const std::string &p, const at::Tensor &x_in, bool time, Cache &cache) const {
    at::Tensor x = x_in;
    const int64_t b = x.size(0), c = x.size(1), h = x.size(3), w = x.size(4);
    if (time) {
      at::Tensor &slot = cache.next();
      if (!slot.defined()) {
        slot = at::zeros({b, c, 2, h, w}, x.options());  // diffusers' "Rep": zeros before the next chunk
      } else {
        const int64_t t = x.size(2);
        at::Tensor y = causal_conv3d(conv_of(w_, p + ".time_conv"), x, slot, false);
        x = at::stack({y.narrow(1, 0, c), y.narrow(1, c, c)}, 3).reshape({b, c, 2 * t, h, w});
      }
    }
    x = at::upsample_nearest3d(x, {x.size(2), 2 * h, 2 * w});
    return conv3d_fast(x, w_.at(p + ".resample.1.weight").unsqueeze(2), w_.at(p + ".resample.1.bias"), {1, 1, 1},
                       {0, 1, 1});
  }
  // Wan 2.2's shortcut (DupUp3D): channels repeated, then spread over ft frames and 2x2 pixels;
  // the first chunk keeps only its last frame.
  at::Tensor dup_up(const at::Tensor &x, int64_t out, int64_t ft, bool first) const {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
    at::Tensor y = at::repeat_interleave(x, out * ft * 4 / c, 1)
                       .view({b, out, ft, 2, 2, t, h, w})
                       .permute({0, 1, 5, 2, 6, 3, 7, 4})
                       .reshape({b, out, t * ft, 2 * h, 2 * w});
    return first ? y.narrow(2, ft - 1, y.size(2) - (ft - 1)) : y;
  }

  WanConfig cfg_;
  std::map<std::string, at::Tensor> w_;
  c10::Device device_;
  c10::ScalarType dtype_;
  std::vector<bool> time_up_;  // per up block: temperal_downsample reversed
};

}  // namespace

std::unique_ptr<VaeDecoder> load_wan_decoder(const std::string &dir, c10::Device device, c10::ScalarType dtype) {
  const std::string cfg_path = dir + "/config.json", st_path = dir + "/diffusion_pytorch_model.safetensors";
  std::string text, err;
  if (!read_small_file(cfg_path, kMaxConfigBytes, &text, &err)) throw std::runtime_error("cannot read " + err);
  WanConfig cfg;
  if (!parse_wan_config(text, &cfg, &err)) throw std::runtime_error(cfg_path + ": " + err);
  auto w = load_tensor_table(st_path, cfg_path, wan_decoder_tensor_table(cfg), device, dtype, kNoDecoderHint);
  return std::make_unique<WanDecoder>(cfg, std::move(w), device, dtype);
}

}  // namespace videotrain::vae
