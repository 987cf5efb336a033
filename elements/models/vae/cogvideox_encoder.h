/* The CogVideoX causal 3D VAE encoder, built natively from a diffusers config and
 * its safetensors weights (decoder tensors are ignored). */
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/vae/vae_config.h"

namespace videotrain::vae {

// What each causal convolution keeps of its padded input (the last kernel-1 frames)
// so that the next temporal chunk continues where this one stopped. One entry per
// causal convolution, in call order; empty before the first chunk.
struct ConvCache {
  std::vector<at::Tensor> entries;
};

// Where forward_clip_scope keeps each level of activations between its passes: as computed (on
// the device), in host memory, or in an unlinked temporary file (resident memory stays bounded
// by the chunk; the page cache holds what fits).
enum class SpillTo { Device, Host, File };

// A clip for forward_clip_scope: `tiles` spatial regions (1 untiled), each cut into the same
// `chunks` temporal chunks that forward() would get.
struct ClipScopeInput {
  size_t tiles = 1, chunks = 0;
  // Tile t's chunk c, [1, 3, n, h, w]. Called once per (tile, chunk), in the first pass only, so
  // a caller can convert its frames one chunk at a time.
  std::function<at::Tensor(size_t tile, size_t chunk)> chunk;
  // The rows [0, 1) and columns [2, 3) (half-open) of tile t's activations of size h x w at
  // downscale d (1, 2, 4, ...) that count towards the statistics, so that overlapping tiles
  // count each position of the frame once. Unset: every position.
  std::function<std::array<int64_t, 4>(size_t tile, int64_t d, int64_t h, int64_t w)> owned;
};

class CogVideoXEncoder {
 public:
  // Reads dir/config.json and dir/diffusion_pytorch_model.safetensors. Throws
  // std::runtime_error naming the file, the tensor and expected vs found shape on any mismatch,
  // and the config key for configs the encoder does not support.
  static std::unique_ptr<CogVideoXEncoder> load(const std::string &dir, c10::Device device, c10::ScalarType dtype);

  const VaeConfig &config() const { return cfg_; }
  c10::Device device() const { return device_; }
  c10::ScalarType dtype() const { return dtype_; }

  // x: [B, 3, t, H, W] (any dtype; computed in the encoder's dtype on its device).
  // Returns the moments [B, 2*latent_channels, t', H/s, W/s]; `cache` is read and updated.
  at::Tensor forward(const at::Tensor &x, ConvCache &cache) const;

  // norm-scope=clip: the moments of a whole clip given as its temporal chunks (the same chunks
  // forward() would get), with every GroupNorm using the statistics of all the clip's frames
  // (and of every tile's owned positions), as a single pass computes them, while convolutions
  // still run chunk by chunk with the causal cache. One streaming pass per GroupNorm: each reads
  // the previous pass's chunks (kept where `spill` says), normalises with the finished
  // statistics, and gathers the next norm's statistics (float32 per chunk, merged in float64)
  // while writing its own output. Returns each tile's moments [1, 2C, t, h', w'].
  std::vector<at::Tensor> forward_clip_scope(const ClipScopeInput &in, SpillTo spill) const;
  // Untiled: the chunks given at once.
  at::Tensor forward_clip_scope(const std::vector<at::Tensor> &chunks, SpillTo spill) const;

  struct Conv {
    at::Tensor w, b;
    at::Tensor packed;  // w in oneDNN's blocked layout (CPU float, LibTorch 1.x); undefined: none
  };
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

 private:
  CogVideoXEncoder() = default;
  void pack_weights();
  at::Tensor resnet(const Resnet &r, const at::Tensor &x, ConvCache &cache, size_t &idx) const;
  at::Tensor causal_conv(const Conv &c, const at::Tensor &x, ConvCache &cache, size_t &idx) const;
  at::Tensor causal_conv_padded(const Conv &c, const at::Tensor &buf, int64_t head, ConvCache &cache,
                                size_t &idx) const;
  at::Tensor conv(const Conv &c, const at::Tensor &x, at::IntArrayRef stride, at::IntArrayRef padding) const;
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
