/* The VAE encoders vaeencoder runs, behind one interface (VaeDecoder's counterpart): CogVideoX
 * and Wan 2.1 / 2.2 built natively from a diffusers folder (load() picks the family from
 * config.json's _class_name), or another encoder behind the same calls (vaeencoder's TorchScript
 * modules). An encoder knows its family's temporal chunks, tile plans and latent normalisation;
 * the caller streams chunks through forward() with one StreamCache per tile. Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/image_condition.h"
#include "models/vae/clip_scope_input.h"
#include "models/vae/vae_parts.h"

namespace videotrain::vae {

// Spatial tiles as asked for (vaeencoder's tile properties): sizes in the pixels the family's tiles
// count (tile_unit()), 0 = a tile spans the frame in that dimension; overlaps as fractions of a tile.
struct TileRequest {
  int height = 0, width = 0;
  double overlap_height = 1.0 / 6, overlap_width = 1.0 / 5;
  bool on() const { return height > 0 || width > 0; }
};

class VaeEncoder {
 public:
  // Reads dir/config.json (its _class_name picks the family: AutoencoderKLCogVideoX, also when it
  // names none, or AutoencoderKLWan) and the encoder tensors of dir/diffusion_pytorch_model.safetensors.
  // Throws std::runtime_error naming the file, the key or the tensor (expected vs found shape).
  static std::unique_ptr<VaeEncoder> load(const std::string &dir, c10::Device device, c10::ScalarType dtype);
  virtual ~VaeEncoder() = default;

  const std::string &name() const { return name_; }  // "CogVideoX", "Wan 2.1", "Wan 2.2", ...
  // A VAE with a posterior (moments: mean and log-variance, 2 * latent_channels()) and tiles;
  // false for an encoder whose output is the latent itself.
  bool native() const { return native_; }
  int latent_channels() const { return latent_channels_; }  // -1 when unknown
  int temporal_compression() const { return temporal_; }    // 1 when unknown
  int spatial_compression() const { return spatial_; }      // frame pixels per latent pixel; 1 when unknown
  // The latent cache's name for what this encoder computes: change it when its arithmetic changes.
  const std::string &cache_name() const { return cache_name_; }

  // The temporal chunks [begin, end) of a clip of T frames, in order, each one forward() call.
  // By default diffusers' chunked encode: [0, k + r), then [k i + r, k (i + 1) + r), r = T mod k.
  virtual std::vector<std::pair<int, int>> chunks(int T, int chunk_frames) const;
  virtual bool uses_chunk_frames() const { return true; }  // false: the family's own chunks
  // Clips take 1 + n * frame_group() frames (n >= 0) for latents that decode.
  virtual int frame_group() const { return temporal_; }

  // Tiles. Tile sizes count tile_unit() pixels per latent pixel (the family's input pixels; tile_note()
  // says so in messages where they are not the frame's).
  int tile_unit() const { return tile_unit_; }
  const std::string &tile_note() const { return tile_note_; }
  // The plan for H x W frames (untiled when the frame fits one tile, as diffusers does).
  virtual TilePlan plan_tiles(int H, int W, const TileRequest &r) const;
  // Whether the plan's tiles join into the untiled latent's shape; else tile_advice() says what to use.
  virtual bool plan_fits(const TilePlan &p, int H, int W) const;
  virtual std::string tile_advice() const { return ""; }
  // After running out of memory with `cur`: tiles of about half the size whose strides keep the
  // untiled shape; false when none smaller is left.
  virtual bool smaller_tiles(const TilePlan &cur, int H, int W, TilePlan *next) const;

  // One chunk of one temporal stream: frames [1, 3, n, h, w] in [-1, 1] (any dtype and device;
  // computed in the encoder's) to its moments [1, 2C, t, h', w'] (native(); else the output).
  virtual at::Tensor forward(const at::Tensor &x, StreamCache &cache) const = 0;
  // A whole clip [B, 3, T, H, W] through chunks() and the plan's tiles: its moments (tests,
  // benchmarks, image conditions).
  at::Tensor encode(const at::Tensor &video, const TilePlan &tiles = {}, int chunk_frames = 8) const;

  // The model's latents from moments [B, 2C, t, h, w]: the posterior's mode (noise undefined) or
  // the sample mean + exp(logvar / 2) * noise (log-variance clamped to [-30, 20]; noise the shape of
  // the mean), normalised as the family's pipelines normalise the latents the transformer takes.
  // An image-to-video condition is latent(encode(frames)): the mode, normalised like the latents.
  at::Tensor latent(const at::Tensor &moments, const at::Tensor &noise = at::Tensor()) const;
  // The moments as vaeencoder's latent=moments gives them.
  virtual at::Tensor moments_out(const at::Tensor &moments) const { return moments; }

  // Image-to-video conditions as the family's I2V pipelines build them (vaeencoder condition=,
  // models/image_condition.h). "" when they take `which`, else why not and what to use.
  virtual std::string condition_unsupported(models::ConditionFrames which) const;
  // The frames of a T-frame clip's condition video (models::condition_video) that go through the
  // encoder: by default all of them (the given frames and the zeros between).
  virtual int condition_frames(int T) const { return T; }
  // The condition of a T-frame clip from its condition video's moments [B, 2C, t', h, w] (float32):
  // what the transformer takes after the noisy latents, float32. By default cat([mask, latent(mode)])
  // [B, tc + C, t, h, w] (models::condition_mask).
  virtual at::Tensor condition(const at::Tensor &moments, int T, models::ConditionFrames which) const;
  // The factor on an image's posterior draw in an image-latents condition (models::ConditionBuild::
  // kImageLatents: scaling_factor, or its inverse where the config says invert_scale_latents); 0 for a VAE
  // whose latents no such condition takes.
  virtual double image_latent_scale() const { return 0.0; }

  // Whole-clip normalisation statistics (vaeencoder norm-scope=clip): "" when the family has them,
  // else why they do not apply.
  virtual std::string clip_scope_unsupported() const;
  // The moments of each tile of a whole clip given as its chunks, every normalisation over the
  // whole clip (see CogVideoXEncoder). Throws where clip_scope_unsupported() says why.
  virtual std::vector<at::Tensor> forward_clip_scope(const ClipScopeInput &in, SpillTo spill) const;

 protected:
  VaeEncoder() = default;
  // The z of the posterior (mode or sample, float32) as the transformer's latents.
  virtual at::Tensor normalize(const at::Tensor &z) const { return z; }

  std::string name_, cache_name_, tile_note_;
  bool native_ = true;
  int latent_channels_ = -1, temporal_ = 1, spatial_ = 1, tile_unit_ = 1;
};

}  // namespace videotrain::vae
