/* The CogVideoX causal 3D VAE encoder (diffusers AutoencoderKLCogVideoX's encoder), built natively
 * from a diffusers config and its safetensors weights (decoder tensors are ignored): chunks of
 * chunk-frames frames with GroupNorm statistics per chunk, as diffusers' chunked encode, or per clip
 * (forward_clip_scope); tiles as diffusers' tiled_encode; latents scaled by scaling_factor. */
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/vae/vae_config.h"
#include "models/vae/vae_encoder.h"

namespace videotrain::vae {

class CogVideoXEncoder final : public VaeEncoder {
 public:
  // Reads dir/config.json and dir/diffusion_pytorch_model.safetensors. Throws
  // std::runtime_error naming the file, the tensor and expected vs found shape on any mismatch,
  // and the config key for configs the encoder does not support.
  static std::unique_ptr<CogVideoXEncoder> load(const std::string &dir, c10::Device device, c10::ScalarType dtype);

  const VaeConfig &config() const { return cfg_; }

  // x: [B, 3, t, H, W] (any dtype; computed in the encoder's dtype on its device).
  // Returns the moments [B, 2*latent_channels, t', H/s, W/s]; `cache` is read and updated.
  at::Tensor forward(const at::Tensor &x, StreamCache &cache) const override;

  // diffusers' tiles: origins every int(tile * (1 - overlap)) pixels; latent tiles blend over
  // int(latent_tile * overlap) rows/columns and keep the rest. A frame that fits a tile is not tiled.
  TilePlan plan_tiles(int H, int W, const TileRequest &r) const override;
  bool plan_fits(const TilePlan &p, int H, int W) const override;
  std::string tile_advice() const override;
  bool smaller_tiles(const TilePlan &cur, int H, int W, TilePlan *next) const override;
  at::Tensor moments_out(const at::Tensor &moments) const override;  // log-variance clamped

  // CogVideoX I2V (models::cogvideox_image_latents): the first frame encoded alone, its mode scaled by
  // cogvideox_image_scale and zero-padded to the clip's t latent frames, [B, C, t, h, w]; no mask, and
  // no last frame.
  std::string condition_unsupported(models::ConditionFrames which) const override;
  int condition_frames(int) const override { return 1; }
  at::Tensor condition(const at::Tensor &moments, int T, models::ConditionFrames which) const override;
  double image_latent_scale() const override {
    return models::cogvideox_image_scale(cfg_.scaling_factor, cfg_.invert_scale_latents);
  }

  // norm-scope=clip: the moments of a whole clip given as its temporal chunks (the same chunks
  // forward() would get), with every GroupNorm using the statistics of all the clip's frames
  // (and of every tile's owned positions), as a single pass computes them, while convolutions
  // still run chunk by chunk with the causal cache. One streaming pass per GroupNorm: each reads
  // the previous pass's chunks (kept where `spill` says), normalises with the finished
  // statistics, and gathers the next norm's statistics (float32 per chunk, merged in float64)
  // while writing its own output. Returns each tile's moments [1, 2C, t, h', w'].
  std::string clip_scope_unsupported() const override { return ""; }
  std::vector<at::Tensor> forward_clip_scope(const ClipScopeInput &in, SpillTo spill) const override;
  // Untiled: the chunks given at once.
  at::Tensor forward_clip_scope(const std::vector<at::Tensor> &chunks, SpillTo spill) const;

  struct Norm {
    at::Tensor w, b;
  };
  struct Resnet {
    Norm norm1, norm2;
    Conv conv1, conv2, shortcut;  // shortcut undefined when channels match
  };
  struct Block {
    std::vector<Resnet> resnets;
    bool downsample = false, compress_time = false;
    Conv down;  // 2D weights viewed as [out, in, 1, 3, 3]
  };

 protected:
  at::Tensor normalize(const at::Tensor &z) const override { return z * cfg_.scaling_factor; }

 private:
  CogVideoXEncoder() = default;
  void pack_weights();
  at::Tensor resnet(const Resnet &r, const at::Tensor &x, StreamCache &cache) const;
  at::Tensor norm_silu(const Norm &n, const at::Tensor &x, double eps, int64_t head) const;
  at::Tensor downsample(const Block &b, const at::Tensor &x) const;

  VaeConfig cfg_;
  c10::Device device_ = c10::Device(c10::kCPU);
  c10::ScalarType dtype_ = c10::kFloat;
  Conv conv_in_, conv_out_, quant_conv_;
  std::vector<Block> blocks_;
  std::vector<Resnet> mid_;
  Norm norm_out_;
};

}  // namespace videotrain::vae
