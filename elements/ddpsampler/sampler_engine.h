/* SamplerEngine: the work behind ddpsampler, without GObject (no torch types here).
 *
 * It keeps this rank's share of the prompts (prompt i on rank i mod world; no collective, so no
 * rank waits for another), takes the trainer's snapshots through the run context (step callbacks:
 * every `every` steps, at-start once the model exists, at-end when the trainer has finished) and
 * generates each prompt's latents with the family's sampler and classifier-free guidance, on its
 * own thread (the element's src task). Training waits for sampling only when a snapshot is
 * still pending (not yet taken) as the next is due: then the trainer holds at that step until the
 * sampler takes it, or with skip-if-busy the new one is skipped with a message. */
#pragma once

#include <gst/gst.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bus_message.h"
#include "follower_settings.h"
#include "models/attention_backend.h"

namespace videotrain {

class RunContext;

// every, at-start, skip-if-busy and weights: FollowerSettings.
struct SamplerConfig : FollowerSettings {
  bool at_end = true;
  std::string sampler = "auto";  // auto (Wan: unipc, CogVideoX: dpm) | euler | unipc | ddim | dpm
  int steps = 50;
  double guidance = 5.0;
  double guidance_2 = -1;        // Wan 2.2 A14B's low-noise expert (trainer model-2); < 0: = guidance
  double flow_shift = 3.0;
  double snr_shift_scale = 0.0;  // 0: the folder's family default (CogVideoX-2b 3.0, 5b 1.0)
  int64_t num_frames = 0, width = 0, height = 0;  // 0: the family's default (Wan 81x832x480, CogVideoX 49x720x480)
  int64_t seed = 42;            // for prompts whose file gives none
  // A prompt's size bound: video tokens (latent frames x latent pixels / 4) at most this; 0: four
  // times the family's default size (Wan 81x832x480: 131,040, which takes 720p).
  int64_t max_tokens = 0;
  unsigned temporal_compression = 4;
  unsigned spatial_compression = 0;  // 0: from the model (16 for Wan 2.2's 48 channels, else 8)
  std::string device;           // "" / "auto": the trainer's device
  // Image-to-video trainers: the VAE folder for the condition latents, the CLIP image encoder folder
  // (models with image embeddings) and its processor ("": image_processor/ beside it).
  std::string vae, image_encoder, image_processor;
  AttentionBackend attention_backend = AttentionBackend::automatic;  // native models' kernel, on `device`
};

// One generated sample, as the element pushes it.
struct SampleOut {
  uint64_t step = 0;
  uint32_t prompt_index = 0;
  int64_t seed = 0;
  int64_t frames = 0, width = 0, height = 0;
  std::string prompt;
  std::string sampler;
  double seconds = 0.0;
  GstBuffer *latents = nullptr;  // [C, t, h, w] float32 on the CPU, with a sample meta (owned by the receiver)
};

class SamplerEngine {
 public:
  explicit SamplerEngine(const SamplerConfig &config);
  ~SamplerEngine();
  SamplerEngine(const SamplerEngine &) = delete;
  SamplerEngine &operator=(const SamplerEngine &) = delete;

  // Subscribes to the trainer's steps. False with error() when the config cannot work.
  bool attach(std::shared_ptr<RunContext> run);
  bool attached() const;
  void detach();
  // What the vaedecoder downstream answered at start: false with error() when its latent channels
  // are not the model's; its spatial compression sizes the latents (unless spatial-compression is set).
  bool check_vae(int channels, int spatial, const std::string &family);

  // A textencoder-embedded promptsrc buffer (record, caption, text_embeds, text_mask; a prompt's own
  // buffer may also hold its images, uint8 [H, W, 3] "image" and "last_image"). Prompts of other
  // ranks are dropped. False with error() when the buffer is not one.
  bool add_prompt(GstBuffer *buffer);
  // The prompt stream ended. False with error() when a prompt lacks the image an image-to-video
  // trainer's model needs.
  bool prompts_done();

  enum class Next { kSampled, kFinished, kFlushing, kError };
  // Blocks until a snapshot is due (and the prompts are in), samples this rank's prompts from it
  // and hands each sample to emit (which may return false to stop early). kFinished once the
  // trainer has finished and its last snapshot is sampled, or once a step of the trainer failed
  // (a peer gone) and the snapshot in hand, if any, is sampled: no at-end sample then.
  Next run_next(const std::function<bool(SampleOut &)> &emit);
  void set_flushing(bool flushing);

  // ddpsampler-skipped | warning
  std::vector<BusMessage> take_messages();
  const std::string &error() const;
  size_t prompts_kept() const;
  uint64_t samples_done() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace videotrain
