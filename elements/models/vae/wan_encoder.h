/* The Wan 2.1 / 2.2 VAE encoder (diffusers AutoencoderKLWan), built natively from a diffusers
 * folder. It streams exactly: frame 0 alone, then 4 frames at a time, each causal convolution
 * keeping the last 2 frames of its input and each temporal downsampler its last frame; the norms
 * are per position (RMS over channels), so no statistic spans a chunk and streaming equals
 * diffusers' own chunked encode. Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/vae/wan_config.h"

namespace videotrain::vae {

// What the causal convolutions and temporal downsamplers keep between chunks, in call order.
// One per temporal stream (a clip, or a tile of it); empty before the first chunk.
struct WanCache {
  std::vector<at::Tensor> entries;
};

// Joins tiles (rows[i][j], [B, C, T, h, w]) as diffusers' VAEs do, in place: each tile blends
// linearly with the tile above and the one to the left, both as already blended, over as many rows
// (columns) as both have up to bh (bw); then each keeps its first sh x sw; the rows are concatenated.
// Wan's tiled encode and every tiled decode use it.
at::Tensor blend_tile_rows(std::vector<std::vector<at::Tensor>> &rows, int64_t bh, int64_t bw, int64_t sh, int64_t sw);

class WanEncoder {
 public:
  // Reads dir/config.json and dir/diffusion_pytorch_model.safetensors. Throws
  // std::runtime_error naming the file, the key or the tensor (expected vs found shape).
  static std::unique_ptr<WanEncoder> load(const std::string &dir, c10::Device device, c10::ScalarType dtype);

  const WanConfig &config() const { return cfg_; }

  // One chunk of RGB frames [B, 3, t, H, W] in [-1, 1]: t = 1 for a stream's first chunk, then
  // 4 (H, W multiples of the spatial compression). Returns its moments [B, 2*z_dim, t', h, w]
  // (t' = 1) and updates `cache`.
  at::Tensor forward(const at::Tensor &x, WanCache &cache) const;

  // Moments of a whole clip [B, 3, T, H, W], T = 1 + 4n, streamed chunk by chunk.
  at::Tensor encode(const at::Tensor &video) const;

  // Spatial tiles with diffusers' Wan semantics: tiles of tile_h x tile_w at strides
  // stride_h x stride_w, in pixels of the patchified frame (so with Wan 2.2's 2x2 patches a tile
  // covers twice as many frame pixels), each its own temporal stream, blended linearly over
  // (tile - stride) / (compression / patch) latent rows and columns.
  struct TileGrid {
    std::vector<int64_t> ys, xs;  // tile origins in frame pixels
    int64_t tile_h = 0, tile_w = 0;  // tile size in frame pixels
  };
  TileGrid tile_grid(int64_t height, int64_t width, int tile_h, int tile_w, int stride_h, int stride_w) const;
  // Joins the tiles' moments (rows[i][j] for grid.ys[i], grid.xs[j]) into the clip's.
  at::Tensor blend_tiles(std::vector<std::vector<at::Tensor>> rows, int64_t height, int64_t width, int tile_h,
                         int tile_w, int stride_h, int stride_w) const;
  // A whole clip through the tiles (tests and benchmarks; the engine streams the same way).
  at::Tensor encode_tiled(const at::Tensor &video, int tile_h, int tile_w, int stride_h, int stride_w) const;

  // (mean - latents_mean) / latents_std per channel, from moments; with `noise` (the shape of
  // the mean) a sample mean + std * noise (log-variance clamped to [-30, 20]) instead.
  at::Tensor normalized_latent(const at::Tensor &moments, const at::Tensor &noise = at::Tensor()) const;

 private:
  WanEncoder() = default;
  struct Run;
  at::Tensor conv(const std::string &p, const at::Tensor &x) const;
  at::Tensor causal_conv(const std::string &p, const at::Tensor &x, Run &run) const;
  at::Tensor rms(const std::string &p, const at::Tensor &x) const;
  at::Tensor resnet(const std::string &p, const at::Tensor &x, Run &run) const;
  at::Tensor resample(const std::string &p, const at::Tensor &x, bool time, Run &run) const;
  at::Tensor attention(const std::string &p, const at::Tensor &x) const;
  at::Tensor avg_down(const at::Tensor &x, int64_t out_channels, int ft, int fs) const;
  at::Tensor patchify(const at::Tensor &x) const;

  WanConfig cfg_;
  c10::Device device_ = c10::Device(c10::kCPU);
  c10::ScalarType dtype_ = c10::kFloat;
  std::map<std::string, at::Tensor> w_;
};

}  // namespace videotrain::vae
