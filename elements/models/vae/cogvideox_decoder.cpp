/* The CogVideoX decoder (diffusers CogVideoXDecoder3D): every norm is a spatially conditioned
 * GroupNorm (SpatialNorm3D: GroupNorm of the features times and plus 1x1x1 convolutions of the
 * chunk's latent, resized to the features by nearest neighbour, its first frame apart when the
 * features have an odd frame count); upsamplers double space and, in the first
 * log2(temporal_compression) blocks, time (a lone first frame kept single). */
#include <ATen/ATen.h>

#include <stdexcept>

#include "cpu_conv.h"
#include "models/vae/vae_config.h"
#include "models/vae/vae_decoder.h"

namespace videotrain::vae {

namespace {

struct SpatialNorm {
  at::Tensor w, b;  // GroupNorm affine
  Conv y, bias;     // conv_y, conv_b (1x1x1 on the latent)
};
struct Resnet {
  SpatialNorm norm1, norm2;
  Conv conv1, conv2, shortcut;  // shortcut undefined when channels match
};
struct UpBlock {
  std::vector<Resnet> resnets;
  bool upsample = false, compress_time = false;
  Conv up;  // 2D 3x3 weights viewed as [out, in, 1, 3, 3]
};

class CogVideoXDecoder final : public VaeDecoder {
 public:
  CogVideoXDecoder(const VaeConfig &cfg, std::map<std::string, at::Tensor> w, c10::Device device,
                   c10::ScalarType dtype)
      : VaeDecoder(Family::CogVideoX, cfg.latent_channels, cfg.spatial_compression(), 1, false),
        cfg_(cfg), device_(device), dtype_(dtype) {
    auto conv = [&](const std::string &p) { return conv_of(w, p); };
    auto snorm = [&](const std::string &p) {
      return SpatialNorm{w.at(p + ".norm_layer.weight"), w.at(p + ".norm_layer.bias"), conv(p + ".conv_y.conv"),
                         conv(p + ".conv_b.conv")};
    };
    auto resnet = [&](const std::string &p) {
      Resnet r{snorm(p + ".norm1"), snorm(p + ".norm2"), conv(p + ".conv1.conv"), conv(p + ".conv2.conv"), Conv{}};
      if (w.count(p + ".conv_shortcut.weight")) r.shortcut = conv(p + ".conv_shortcut");
      return r;
    };
    conv_in_ = conv("decoder.conv_in.conv");
    for (int l = 0; l < 2; l++) mid_.push_back(resnet("decoder.mid_block.resnets." + std::to_string(l)));
    for (int i = 0; i < cfg.num_blocks(); i++) {
      const std::string p = "decoder.up_blocks." + std::to_string(i);
      UpBlock b;
      for (int l = 0; l <= cfg.layers_per_block; l++) b.resnets.push_back(resnet(p + ".resnets." + std::to_string(l)));
      b.upsample = i != cfg.num_blocks() - 1;
      b.compress_time = i < cfg.temporal_levels();
      if (b.upsample) {
        b.up = conv(p + ".upsamplers.0.conv");
        b.up.w = b.up.w.unsqueeze(2);
      }
      blocks_.push_back(std::move(b));
    }
    norm_out_ = snorm("decoder.norm_out");
    conv_out_ = conv("decoder.conv_out.conv");
    if (cfg.use_post_quant_conv) post_quant_ = conv("post_quant_conv");
  }

  int64_t frames_for(int64_t latent_frames) const override {
    int64_t n = 0;
    for (const auto &[a, b] : chunks(latent_frames)) {
      int64_t t = b - a;
      for (const auto &blk : blocks_)
        if (blk.upsample && blk.compress_time) t = t > 1 ? (t % 2 ? 1 + 2 * (t - 1) : 2 * t) : 1;
      n += t;
    }
    return n;
  }

  at::Tensor denormalize(const at::Tensor &latents) const override {
    return (1.0 / cfg_.scaling_factor) * latents;  // as pipeline_cogvideox's decode_latents
  }

 protected:
  // diffusers' frame batches of 2 latent frames, the odd one out in the first.
  std::vector<std::pair<int64_t, int64_t>> chunks(int64_t t) const override {
    std::vector<std::pair<int64_t, int64_t>> out;
    const int64_t r = t % 2, n = std::max<int64_t>(t / 2, 1);
    for (int64_t k = 0; k < n; k++) out.emplace_back(k == 0 ? 0 : 2 * k + r, std::min(t, 2 * (k + 1) + r));
    return out;
  }

  at::Tensor forward(const at::Tensor &z_in, Cache &cache, bool) const override {
    at::Tensor z = z_in.to(device_, dtype_);
    if (post_quant_.w.defined()) z = conv3d_fast(z, post_quant_.w, post_quant_.b, {1, 1, 1}, {0, 0, 0});
    at::Tensor x = causal_conv3d(conv_in_, z, cache.next(), true);
    for (const auto &r : mid_) x = resnet(r, x, z, cache);
    for (const auto &b : blocks_) {
      for (const auto &r : b.resnets) x = resnet(r, x, z, cache);
      if (b.upsample) x = upsample(b, x);
    }
    x = at::silu(spatial_norm(norm_out_, x, z));
    return causal_conv3d(conv_out_, x, cache.next(), true);
  }

 private:
  at::Tensor spatial_norm(const SpatialNorm &n, const at::Tensor &f, const at::Tensor &zq) const {
    const int64_t t = f.size(2), h = f.size(3), w = f.size(4);
    at::Tensor z;
    if (t > 1 && t % 2 == 1)
      z = at::cat({at::upsample_nearest3d(zq.narrow(2, 0, 1), {1, h, w}),
                   at::upsample_nearest3d(zq.narrow(2, 1, zq.size(2) - 1), {t - 1, h, w})},
                  2);
    else
      z = at::upsample_nearest3d(zq, {t, h, w});
    at::Tensor y = conv3d_fast(z, n.y.w, n.y.b, {1, 1, 1}, {0, 0, 0});
    at::Tensor b = conv3d_fast(z, n.bias.w, n.bias.b, {1, 1, 1}, {0, 0, 0});
    return at::group_norm(f, cfg_.norm_num_groups, n.w, n.b, 1e-6) * y + b;
  }

  at::Tensor resnet(const Resnet &r, const at::Tensor &x, const at::Tensor &zq, Cache &cache) const {
    at::Tensor h = causal_conv3d(r.conv1, at::silu(spatial_norm(r.norm1, x, zq)), cache.next(), true);
    h = causal_conv3d(r.conv2, at::silu(spatial_norm(r.norm2, h, zq)), cache.next(), true);
    if (r.shortcut.w.defined()) return h + conv3d_fast(x, r.shortcut.w, r.shortcut.b, {1, 1, 1}, {0, 0, 0});
    return h + x;
  }

  at::Tensor upsample(const UpBlock &b, const at::Tensor &x) const {
    const int64_t t = x.size(2), h2 = 2 * x.size(3), w2 = 2 * x.size(4);
    at::Tensor y;
    if (b.compress_time && t > 1 && t % 2 == 1)
      y = at::cat({at::upsample_nearest3d(x.narrow(2, 0, 1), {1, h2, w2}),
                   at::upsample_nearest3d(x.narrow(2, 1, t - 1), {2 * (t - 1), h2, w2})},
                  2);
    else if (b.compress_time && t > 1)
      y = at::upsample_nearest3d(x, {2 * t, h2, w2});
    else
      y = at::upsample_nearest3d(x, {t, h2, w2});
    return conv3d_fast(y, b.up.w, b.up.b, {1, 1, 1}, {0, 1, 1});
  }

  VaeConfig cfg_;
  c10::Device device_;
  c10::ScalarType dtype_;
  Conv conv_in_, conv_out_, post_quant_;
  std::vector<Resnet> mid_;
  std::vector<UpBlock> blocks_;
  SpatialNorm norm_out_;
};

}  // namespace

std::unique_ptr<VaeDecoder> load_cogvideox_decoder(const std::string &dir, c10::Device device, c10::ScalarType dtype) {
  const std::string cfg_path = dir + "/config.json", st_path = dir + "/diffusion_pytorch_model.safetensors";
  std::string err;
  VaeConfig cfg;
  if (!load_vae_config(cfg_path, &cfg, &err)) throw std::runtime_error(err);
  const std::string bad = check_supported(cfg);
  if (!bad.empty()) throw std::runtime_error(cfg_path + ": unsupported config: " + bad);
  auto w = load_tensor_table(st_path, cfg_path, decoder_tensor_table(cfg), device, dtype, kNoDecoderHint);
  return std::make_unique<CogVideoXDecoder>(cfg, std::move(w), device, dtype);
}

}  // namespace videotrain::vae
