/* vaeencoder's engine: frames in, one latent tensor per clip out.
 *
 * Frames arrive one at a time (uint8 RGB); the clip is encoded in the temporal chunks its
 * encoder makes (models/vae/vae_encoder.h: VaeEncoder::chunks, as the family's diffusers encode
 * makes them), each chunk as soon as its frames are in, each spatial tile its own stream with the
 * causal-convolution cache carried over, so memory is set by the chunk and not the clip.
 * With norm-scope=clip the uint8 frames are kept until the clip's last one is in, then the clip
 * goes through VaeEncoder::forward_clip_scope (same chunks, whole-clip statistics).
 * No torch in this header: the GObject face includes it. */
#pragma once

#include <gst/gst.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "latent_store.h"

namespace videotrain::vae {

enum class LatentKind { Sample, Mode, Moments };

// GroupNorm statistics per temporal chunk (diffusers' chunked encode) or over the whole clip
// (a single pass, SAT's context-parallel encoder).
enum class NormScope { Chunk, Clip };

// norm-scope=clip: where activations wait between passes. Auto: an unlinked temporary file on
// CPU (resident memory stays bounded by the chunk), host memory on CUDA (device memory stays
// bounded). Memory: host memory (faster on CPU while the clip's activations fit in RAM).
enum class ClipSpill { Auto, Memory, File };

// Image-to-video condition (models/image_condition.h, same values as models::ConditionFrames): the
// clip's first frame (and last) followed by zeros, encoded beside the latents as the named tensor
// `condition` [tc + C, t, h, w] (mask channels, then the posterior's mode, normalised), and those
// frames themselves as `condition_frames` uint8 [n, H, W, 3] (imageencoder's input).
enum class Condition { None = 0, First = 1, FirstLast = 2 };

struct EngineOptions {
  std::string model;            // a diffusers VAE folder, or a TorchScript file with an `encode` method
  bool per_frame = false;       // TorchScript image encoder: [N,3,H,W] -> [N,C,h,w]
  int micro_batch_size = 8;     // frames per call of a per-frame encoder
  int chunk_frames = 8;         // k, where the family chunks by it (VaeEncoder::uses_chunk_frames)
  int tile_height = 0, tile_width = 0;             // pixels the family's tiles count; 0 = no tiles
  double tile_overlap_height = 1.0 / 6, tile_overlap_width = 1.0 / 5;  // fractions of a tile
  LatentKind latent = LatentKind::Sample;
  NormScope norm_scope = NormScope::Chunk;
  Condition condition = Condition::None;
  ClipSpill clip_spill = ClipSpill::Auto;
  uint64_t seed = 0;
  std::string device;           // "" = auto: see device_rule.h (cuda:LOCAL_RANK % count, else cpu)
  std::string dtype;            // "" = bfloat16 on CUDA, float32 on CPU
  bool tune_malloc = true;      // on CPU: retain_cpu_heap() (process-wide)
  // Clips whose length the VAE cannot use (T mod temporal_compression != 1) are refused
  // unless this is set (diffusers itself runs them; the latents then do not decode).
  bool allow_any_length = false;
  // Keep a clip's uint8 frames until the clip is done so that an out-of-memory clip can be
  // retried with smaller tiles. -1: on CUDA devices only (CPU allocation failures are not
  // retried), 0: never, 1: always.
  int retain_frames = -1;
  // Test hook: any tile (or untiled frame) of more than this many pixels fails as if the
  // device ran out of memory. 0 = off.
  int64_t fake_oom_pixels = 0;
};

// One frame as the face reads it from its buffer and clip meta (plain values).
struct FrameInfo {
  uint64_t sample_id = 0;
  uint32_t epoch = 0;
  uint64_t clip_index = 0;
  uint32_t frame_index = 0;  // 0 starts a clip
  uint32_t num_frames = 0;
  int width = 0, height = 0;  // the negotiated frame size
  GstClockTime pts = GST_CLOCK_TIME_NONE, duration = GST_CLOCK_TIME_NONE;
  // Read at a clip's first frame only: they go into the latent's sample meta.
  bool padding = false;
  uint64_t group = 0;  // csvvideosrc buckets: the clip's step group and its size
  uint32_t group_size = 0;
  std::string caption, path;
};

// A clip that will not come out, and why (the face warns and posts vaeencoder-dropped).
struct DroppedClip {
  uint64_t sample_id = 0;
  uint32_t epoch = 0;
  uint64_t clip_index = 0;
  uint32_t num_frames = 0;
  std::string reason;
};

// What VaeEngine::push() made of a frame.
struct FrameOutcome {
  enum class Kind {
    kAccepted,       // taken into the clip, or skipped (see dropped)
    kLatent,         // the clip's last frame: its latent is ready
    kSettingsError,  // every clip would fail the same way (error names what to change)
    kOutOfMemory,    // out of memory even with the smallest tiles
  };
  Kind kind = Kind::kAccepted;
  std::vector<DroppedClip> dropped;  // clips given up on this frame, in order (whatever the kind)
  std::string error;                 // kSettingsError, kOutOfMemory
  // kLatent: the latent as a tensor buffer (the caller owns it; no metas, no timestamps), the
  // clip's first frame, and the time from its first frame's pts to its last frame's end.
  GstBuffer *latent = nullptr;
  FrameInfo clip;
  GstClockTime pts = GST_CLOCK_TIME_NONE, duration = GST_CLOCK_TIME_NONE;
};

class VaeEngine {
 public:
  // Loads the model; null with a reason (file, tensor, property) on failure.
  static std::unique_ptr<VaeEngine> create(const EngineOptions &opts, std::string *error);
  ~VaeEngine();

  const EngineOptions &options() const;
  std::string dtype_name() const;   // "float32" | "bfloat16" | "float16"
  std::string device_name() const;  // "cpu" | "cuda:N"
  bool native() const;              // a VAE folder (not TorchScript)
  int temporal_compression() const; // 1 for TorchScript encoders
  int spatial_compression() const;  // 1 for TorchScript encoders (unknown)

  // "" when a clip of this size can be encoded, else why not.
  std::string check_clip(int num_frames, int width, int height) const;

  // Clip framing, for the element: frames in stream order, each with its clip meta's values.
  // Starts, continues and finishes clips; drops a clip that arrives broken (no frame 0, a frame
  // out of place, another clip starting early, a buffer too small: rgb null, `bytes` its size)
  // and skips the rest of its frames quietly.
  FrameOutcome push(const FrameInfo &frame, const uint8_t *rgb, size_t stride, size_t bytes);
  // The clip in progress, given up: at end of stream, or when the frame size changes to
  // width x height in its middle (no drop when the size is the clip's).
  std::optional<DroppedClip> end_of_stream();
  std::optional<DroppedClip> frame_size_changed(int width, int height);
  // After a flush: no clip in progress, nothing being skipped.
  void reset_framing();

  // Streaming. begin_clip() then exactly num_frames push_frame() calls, then finish_clip().
  // A false return (reason in *why) abandons the clip; the engine is ready for the next one.
  // `epoch` with the seed and sample id draws latent=sample's noise.
  bool begin_clip(uint64_t sample_id, int num_frames, int width, int height, std::string *why, uint32_t epoch = 0);
  bool push_frame(const uint8_t *rgb, size_t stride, std::string *why);
  // The latent tensor [C, t, h, w] as a tensor buffer (no sample meta, no timestamps), with the
  // named tensors `condition` and `condition_frames` when options().condition asks for one.
  GstBuffer *finish_clip(std::string *why);
  void abort_clip();
  // After a false push_frame(): the device ran out of memory even with the smallest tiles
  // (or the clip could not be retried), so later clips would fail the same way.
  bool failure_is_fatal() const;
  // After a false begin_clip(), push_frame() or finish_clip(): the failure comes from the
  // settings (a clip length or frame size the VAE cannot use, from the source's properties)
  // or the model (it failed on the first clip), not from this clip's data, so every clip
  // would fail the same way; *why names what to change.
  bool failure_is_settings() const;
  bool in_clip() const;
  int frames_received() const;
  int frames_expected() const;
  bool clip_complete() const;

  // Latent cache (cache-dir). The encoder's part of every key: the model's content (digests of
  // config.json and the weights, or of the TorchScript file), family, dtype, device type, chunking,
  // tiles, norm-scope and the implementation's version. Reads the weights once; "" with *why when
  // they cannot be read.
  std::string cache_key(std::string *why);
  // What last_moments() holds for a clip of T frames of W x H (0: size unknown): float32
  // [1, 2C, t, h, w], with -1 where the encoder cannot tell in advance (TorchScript models).
  TensorSpec moments_spec(int num_frames, int width, int height) const;
  // The moments (float32) of the clip that finish_clip() last returned, as a cache entry (with its
  // `condition` and `condition_frames` when the engine makes one).
  bool last_moments(CacheEntry *out) const;
  // The latent that finish_clip() gives for these moments (and its cached condition): the same
  // bytes for the same seed, sample id and epoch. Null with *why when the entry does not fit.
  GstBuffer *latent_from_moments(const CacheEntry &entry, uint64_t sample_id, uint32_t epoch, std::string *why);

  // Called (in the streaming thread) with a human-readable warning, e.g. an OOM retry.
  void set_warning_callback(std::function<void(const std::string &)> cb);

  // Counters, for tests and benchmarks.
  int64_t chunks_encoded() const;
  int64_t oom_retries() const;
  int64_t peak_frames_held() const;  // most uint8 frames held at once in the last clip

  struct Impl;
  Impl *impl() { return impl_.get(); }

 private:
  VaeEngine();
  std::unique_ptr<Impl> impl_;

  // push()'s state (clip_framing.cpp): the clip in progress and the clip whose frames are skipped.
  struct Framing {
    FrameInfo clip;  // its first frame
    GstClockTime end = GST_CLOCK_TIME_NONE;
    bool skipping = false;
    uint64_t skip_sample = 0, skip_clip_index = 0;
  };
  Framing framing_;
  DroppedClip drop(const FrameInfo &clip, std::string reason);
};

const char *latent_kind_name(LatentKind k);

}  // namespace videotrain::vae
