/* vaedecoder's engine: one latent buffer per clip in ([C, t, h, w], as vaeencoder emits them),
 * RGB frames out as they are decoded (models/vae/vae_decoder.h: chunk by chunk with the causal
 * cache, optional tiles), so memory is set by the chunk and not the clip. Latents are the
 * model's (normalised, undone per family), or with `moments` vaeencoder's latent=moments (2C
 * channels: the posterior mean is decoded as it is).
 * No torch in this header: the GObject face includes it. */
#pragma once

#include <gst/gst.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace videotrain::vae {

struct DecodeOptions {
  std::string model;   // a diffusers VAE folder with its decoder tensors (models/vae/vae_decoder.h)
  int tile_height = 0, tile_width = 0;                // output pixels; 0 = no tiles
  int tile_stride_height = 0, tile_stride_width = 0;  // output pixels; 0 = 3/4 of the tile
  std::string device;  // "" = auto (device_rule.h)
  std::string dtype;   // "" = bfloat16 on CUDA, float32 on CPU
  bool moments = false;  // the input is vaeencoder's latent=moments (mean and log-variance)
  bool tune_malloc = true;  // on CPU: retain_large_cpu_blocks() (process-wide), as vaeencoder
  int fps_n = 8, fps_d = 1;  // the element's framerate (its frames' timestamps and caps); not the engine's
  // Test hook (VIDEOTRAIN_VAEDECODER_FAKE_OOM_PIXELS in the element): a decode whose tile (or frame,
  // untiled) is over this many pixels runs "out of memory" after its first new frame. 0 = off.
  int64_t fake_oom_pixels = 0;
};

class DecodeEngine {
 public:
  // Loads the decoder; null with a reason naming the property to change.
  static std::unique_ptr<DecodeEngine> create(const DecodeOptions &opts, std::string *error);
  ~DecodeEngine();

  std::string family_name() const;  // VaeDecoder::family_name() of the loaded VAE
  int latent_channels() const;
  int spatial_compression() const;
  std::string device_name() const;
  std::string dtype_name() const;

  // "" when a latent of this shape ([C, t, h, w]) can be decoded, else what is wrong and what to change.
  std::string check_latent(const std::vector<int64_t> &shape) const;
  // Frames a latent with t latent frames decodes to.
  int64_t frames_for(int64_t latent_frames) const;

  // Decodes the latent `buffer` holds; each frame goes to on_frame (a new buffer of packed RGB
  // rows, width * 3 bytes each, owned by the callee) as soon as its chunk is decoded. on_frame
  // returning false stops the clip. False with a reason on bad input or a failed decode.
  // A decode that runs out of memory is retried in smaller tiles (256 pixels, then halved, at most
  // three times), going on from the first frame not yet given; *note (when set) then says so in one line.
  using FrameFn = std::function<bool(GstBuffer *frame, int width, int height)>;
  bool decode(GstBuffer *latent, const FrameFn &on_frame, std::string *why, std::string *note = nullptr);

  int64_t frames_decoded() const { return frames_decoded_; }

  struct Impl;

 private:
  DecodeEngine();
  std::unique_ptr<Impl> impl_;
  int64_t frames_decoded_ = 0;
};

}  // namespace videotrain::vae
