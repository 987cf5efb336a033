/* The VAE decoders of the families vaeencoder encodes with (CogVideoX, Wan 2.1, Wan 2.2), built
 * natively from a diffusers folder and decoding as diffusers' own decode does: CogVideoX latent
 * frames in chunks of 2 (the first takes the odd one) with the causal-conv cache carried across
 * chunks and GroupNorm statistics per chunk; Wan one latent frame at a time with its cache, 2.2's
 * 2x2 pixel patches unfolded, output clamped to [-1, 1]. Optional spatial tiles as diffusers'
 * enable_tiling. Each chunk's frames are handed on as soon as they are decoded, so memory does not
 * grow with the clip. Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/vae/vae_parts.h"

namespace videotrain::vae {

// Spatial tiles (diffusers' enable_tiling): tiles of tile_h x tile_w output pixels every
// stride_h x stride_w pixels, each its own temporal stream, blended linearly with the tile above
// and the one to the left over tile - stride pixels. Used only when the latent is larger than a
// tile. CogVideoX's overlap factors f map to stride = tile - int(tile * f).
struct DecodeTiles {
  int tile_h = 0, tile_w = 0, stride_h = 0, stride_w = 0;
  bool on() const { return tile_h > 0 && tile_w > 0; }
  // "" when usable with spatial compression s, else what to change.
  std::string check(int s) const;
};

class VaeDecoder {
 public:
  enum class Family { CogVideoX, Wan21, Wan22 };

  // Reads dir/config.json (the class decides the family) and the decoder tensors of
  // dir/diffusion_pytorch_model.safetensors. Throws std::runtime_error naming the file, the key or
  // the tensor (expected vs found shape).
  static std::unique_ptr<VaeDecoder> load(const std::string &dir, c10::Device device, c10::ScalarType dtype);
  virtual ~VaeDecoder() = default;

  Family family() const { return family_; }
  static const char *family_name(Family f);  // "CogVideoX", "Wan 2.1", "Wan 2.2"
  static std::string family_names(const std::string &sep);  // every family's, joined (messages)
  int latent_channels() const { return latent_channels_; }
  int spatial_compression() const { return spatial_; }  // output pixels per latent pixel
  // Frames decode() gives for this many latent frames (1 + 4 (T - 1) for 4x temporal compression
  // and odd CogVideoX lengths; CogVideoX's even lengths give what diffusers gives).
  virtual int64_t frames_for(int64_t latent_frames) const = 0;

  // The model's latents [B, C, T, h, w] (as vaeencoder emits them and the transformer denoises
  // them) to the decoder's input: CogVideoX / scaling_factor, Wan * latents_std + latents_mean.
  virtual at::Tensor denormalize(const at::Tensor &latents) const = 0;

  // Decodes z (the decoder's input, [1, C, T, h, w]) chunk by chunk; on_frames gets each chunk's
  // RGB frames [1, 3, n, H, W] (float32, on the decoder's device, nominally in [-1, 1]) in order.
  using FramesFn = std::function<void(const at::Tensor &)>;
  void decode(const at::Tensor &z, const DecodeTiles &tiles, const FramesFn &on_frames) const;
  // The whole clip at once (tests and benchmarks).
  at::Tensor decode_all(const at::Tensor &z, const DecodeTiles &tiles = {}) const;

  // What each temporal stream keeps between chunks (causal-conv inputs, upsampler state).
  using Cache = StreamCache;

 protected:
  VaeDecoder(Family f, int latent_channels, int spatial, int patch, bool clamp)
      : family_(f), latent_channels_(latent_channels), spatial_(spatial), patch_(patch), clamp_(clamp) {}
  // Latent frame ranges [begin, end) decoded together, in order.
  virtual std::vector<std::pair<int64_t, int64_t>> chunks(int64_t latent_frames) const = 0;
  // One chunk through the network: [1, 3 * patch^2, n, h * s / patch, w * s / patch].
  virtual at::Tensor forward(const at::Tensor &z, Cache &cache, bool first) const = 0;

 private:
  at::Tensor finish(const at::Tensor &x) const;  // unpatchify, clamp, float32

  Family family_;
  int latent_channels_, spatial_, patch_;
  bool clamp_;
};

// The families' decoders (load() picks one), and what their missing-tensor errors add.
constexpr const char *kNoDecoderHint = " (a VAE folder saved without its decoder?)";
std::unique_ptr<VaeDecoder> load_cogvideox_decoder(const std::string &dir, c10::Device device, c10::ScalarType dtype);
std::unique_ptr<VaeDecoder> load_wan_decoder(const std::string &dir, c10::Device device, c10::ScalarType dtype);

}  // namespace videotrain::vae
