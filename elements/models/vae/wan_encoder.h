/* The Wan 2.1 / 2.2 VAE encoder (diffusers AutoencoderKLWan), built natively from a diffusers
 * folder. It streams exactly: frame 0 alone, then 4 frames at a time, each causal convolution
 * keeping the last 2 frames of its input and each temporal downsampler its last frame; the norms
 * are per position (RMS over channels), so no statistic spans a chunk and streaming equals
 * diffusers' own chunked encode. Tiles count pixels of the encoder's input (Wan 2.2: its 2x2-patch
 * frame), as diffusers' tile_sample_min_* / tile_sample_stride_* do. Torch TUs only. */
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/vae/vae_encoder.h"
#include "models/vae/wan_config.h"

namespace videotrain::vae {

class WanEncoder final : public VaeEncoder {
 public:
  // Reads dir/config.json and dir/diffusion_pytorch_model.safetensors. Throws
  // std::runtime_error naming the file, the key or the tensor (expected vs found shape).
  static std::unique_ptr<WanEncoder> load(const std::string &dir, c10::Device device, c10::ScalarType dtype);

  const WanConfig &config() const { return cfg_; }

  // One chunk of RGB frames [B, 3, t, H, W] in [-1, 1]: t = 1 for a stream's first chunk, then
  // 4 (H, W multiples of the spatial compression). Returns its moments [B, 2*z_dim, t', h, w]
  // (t' = 1) and updates `cache`.
  at::Tensor forward(const at::Tensor &x, StreamCache &cache) const override;
  // Frame 0 alone, then groups of 4 (frames after the last whole group are not encoded, as in diffusers).
  std::vector<std::pair<int, int>> chunks(int T, int chunk_frames) const override;
  bool uses_chunk_frames() const override { return false; }
  int frame_group() const override { return 4; }

  // diffusers' tiles: tile_h x tile_w at strides stride_h x stride_w, in pixels of the encoder's
  // input, each its own temporal stream, blended linearly over (tile - stride) / (compression /
  // patch) latent rows and columns, cropped to the untiled latent.
  TilePlan tile_plan(int H, int W, int tile_h, int tile_w, int stride_h, int stride_w) const;
  // Strides tile * (1 - overlap); tiled when the frame is larger than a tile's number (compared
  // as diffusers compares them).
  TilePlan plan_tiles(int H, int W, const TileRequest &r) const override;
  bool plan_fits(const TilePlan &p, int H, int W) const override;
  std::string tile_advice() const override;
  bool smaller_tiles(const TilePlan &cur, int H, int W, TilePlan *next) const override;

  std::string clip_scope_unsupported() const override;

  // = latent(): kept for callers written before VaeEncoder.
  at::Tensor normalized_latent(const at::Tensor &moments, const at::Tensor &noise = at::Tensor()) const {
    return latent(moments, noise);
  }

 protected:
  at::Tensor normalize(const at::Tensor &z) const override;  // (z - latents_mean) / latents_std

 private:
  WanEncoder() = default;
  at::Tensor conv(const std::string &p, const at::Tensor &x) const;
  at::Tensor causal_conv(const std::string &p, const at::Tensor &x, StreamCache &cache) const;
  at::Tensor rms(const std::string &p, const at::Tensor &x) const;
  at::Tensor resnet(const std::string &p, const at::Tensor &x, StreamCache &cache) const;
  at::Tensor resample(const std::string &p, const at::Tensor &x, bool time, StreamCache &cache) const;
  at::Tensor attention(const std::string &p, const at::Tensor &x) const;
  at::Tensor avg_down(const at::Tensor &x, int64_t out_channels, int ft, int fs) const;
  at::Tensor patchify(const at::Tensor &x) const;

  WanConfig cfg_;
  c10::Device device_ = c10::Device(c10::kCPU);
  c10::ScalarType dtype_ = c10::kFloat;
  TensorMap w_;
};

}  // namespace videotrain::vae
