/* Native transformers from diffusers folders (Wan today): the family-independent face the trainer,
 * the validators and videotrain-model use, and the training objective each family trains with.
 * Torch TUs only. */
#pragma once

#include <torch/torch.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "block_hooks.h"
#include "flow_timesteps.h"
#include "model_family.h"
#include "model_options.h"
#include "train_model.h"

namespace videotrain::models {

// A transformer built from a folder's config.json and loaded from its weights, strictly.
class DitModel {
 public:
  virtual ~DitModel() = default;
  virtual std::string class_name() const = 0;  // "WanTransformer3DModel"
  // What the code knows of the class's family (model_family.h), and its name ("wan").
  const ModelFamily &descriptor() const;
  std::string family() const { return descriptor().name; }
  // The config's patch_size_t: latent frames per token (1 where the family patches frames one by one).
  virtual int64_t temporal_patch() const { return 1; }
  virtual torch::nn::Module &module() = 0;
  // The class's own call in diffusers' layout (Wan: hidden_states [B, C, T, H, W], timestep [B] or
  // [B, tokens], encoder_hidden_states [B, L, D]). Throws std::invalid_argument on shapes.
  virtual at::Tensor forward(const at::Tensor &hidden_states, const at::Tensor &timestep,
                             const at::Tensor &encoder_hidden_states) = 0;
  // The call of an image-to-video model (Wan 2.1 I2V / FLF2V) with the image encoder's states as well,
  // encoder_hidden_states_image [B, N, image_dim] (FLF2V: [2B, N, image_dim]). A model without an image
  // path takes an undefined one only. Throws std::invalid_argument on shapes.
  virtual at::Tensor forward_image(const at::Tensor &hidden_states, const at::Tensor &timestep,
                                   const at::Tensor &encoder_hidden_states, const at::Tensor &encoder_hidden_states_image) {
    if (encoder_hidden_states_image.defined())
      throw std::invalid_argument(class_name() + " has no image path: it takes no encoder_hidden_states_image");
    return forward(hidden_states, timestep, encoder_hidden_states);
  }
  // Image-to-video layouts: image_dim the image states' width (0: none); image_to_video also when the
  // input holds condition channels beside the latents (in_channels != out_channels).
  virtual int64_t image_dim() const { return 0; }
  // Images whose states each sample gives the image path: 1 (I2V), 2 (FLF2V: first, last), 0 without one.
  virtual int64_t images_per_sample() const { return 0; }
  // The config's patch_size (t, h, w): a token's latent frames, rows and columns.
  virtual std::vector<int64_t> patch_size() const { return {temporal_patch(), 2, 2}; }
  virtual bool image_to_video() const { return image_dim() > 0; }
  // Input channels beside the noisy latents (Wan I2V: the mask and condition latents of
  // image_condition.h, in_channels - out_channels); 0 for text-to-video.
  virtual int64_t condition_channels() const { return 0; }
  // none, full (each block recomputed in backward) or selective (attention kept, the rest recomputed).
  virtual void set_checkpointing(Checkpointing c) = 0;
  void set_gradient_checkpointing(bool on) { set_checkpointing(on ? Checkpointing::full : Checkpointing::none); }
  virtual Checkpointing checkpointing() const = 0;
  // Hooks around each block's use of its weights (sharded training, block_hooks.h); null: none.
  virtual void set_block_hooks(BlockHooks *hooks) = 0;
  // What the names of block i's parameters start with, before "i." ("blocks.").
  virtual std::string block_prefix() const = 0;
  // The attention kernel of every block (attention_backend.h), from the next forward on.
  virtual void set_attention_backend(AttentionBackend b) = 0;
  virtual std::string config_json() const = 0;
  virtual int64_t latent_channels() const = 0;
  virtual int64_t text_dim() const = 0;
  // Module names LoRA can target (Linear layers), e.g. blocks.0.attn1.to_q.
  std::vector<std::string> linear_names();
  // Writes the folder (config.json + weights in `dtype`, sharded over max_shard_bytes). Throws.
  std::string save(const std::string &dir, at::ScalarType dtype, uint64_t max_shard_bytes);
};

// Opens a diffusers transformer folder: its class from config.json, built on `device` in float32,
// weights loaded strictly. Throws std::runtime_error naming the folder, the key or the tensor.
std::unique_ptr<DitModel> open_dit(const std::string &dir, const c10::Device &device);
// Builds a model from config.json text alone, weights as initialised (seeded by torch's generator).
std::unique_ptr<DitModel> build_dit(const std::string &config_json, const c10::Device &device);

// Each sample's sigma [m] and noise [m, ...] from a CPU generator seeded by (seed, sample id, epoch):
// its first number gives u (timestep-sampling's density), then sigma = flow_sigma(u, shift) (see
// flow_timesteps.h; the resolution shift from x0's h and w), then the noise. `draws` (optional) gets
// each sample's numbers, with its loss-weighting weight.
void draw_flow(const at::Tensor &x0, const std::vector<uint64_t> &sample_ids, unsigned epoch, const ModelOptions &o,
               at::Tensor *sigma, at::Tensor *noise, std::vector<FlowDraw> *draws = nullptr);
// loss-weighting's weight of each sigma [m] (float32 [m]).
at::Tensor flow_loss_weights(const at::Tensor &sigma, const std::string &weighting);
// The weighted flow-matching loss as diffusers' scripts take it: mean over samples of
// w_i * mean((pred_i - target_i)^2), in float32.
at::Tensor flow_loss(const at::Tensor &pred, const at::Tensor &target, const at::Tensor &weights);
// x_t = (1 - sigma) x0 + sigma noise; the model's timestep sigma * 1000; target noise - x0.
void flow_terms(const at::Tensor &x0, const at::Tensor &noise, const at::Tensor &sigma, at::Tensor *x_t,
                at::Tensor *timestep, at::Tensor *target);
// Text embeddings with the positions the mask marks as padding zeroed (Wan's pipelines pass the
// encoder's output trimmed to the tokens and zero-padded).
at::Tensor zero_text_padding(const at::Tensor &text_embeds, const at::Tensor &text_mask);

// Whether a transformer folder's pipeline (its ../model_index.json) sets expand_timesteps: Wan 2.2 TI2V
// 5B, which takes per-token timesteps and, image-to-video, its first latent frame clean at timestep 0.
bool pipeline_expand_timesteps(const std::string &transformer_dir);

// snr_shift_scale of a CogVideoX transformer folder: its ../scheduler/scheduler_config.json's when
// there is one, else 3.0 (sincos layout, CogVideoX-2b) or 1.0 (rotary: 5b, 1.5).
double cogvideox_snr_shift_scale(const std::string &transformer_dir, bool rotary);
// Validation's noise [m, ...] like x0: sample i's from a CPU generator seeded by seeds[i] (the same
// numbers on any device), float32 drawn, in x0's dtype on its device.
at::Tensor seeded_noise(const at::Tensor &x0, const std::vector<int64_t> &seeds);
// Each sample's integer timestep, uniform in [timestep_lo, timestep_hi) within [0, 999], and noise,
// from a CPU generator seeded by (seed, sample id, epoch). timestep int64 [m].
void draw_ddpm(const at::Tensor &x0, const std::vector<uint64_t> &sample_ids, unsigned epoch, const ModelOptions &o,
               at::Tensor *timestep, at::Tensor *noise);
// x_t = sqrt(a_t) x0 + sqrt(1 - a_t) noise (diffusers' add_noise: a_t in x0's dtype); the loss weight
// 1 / (1 - a_t) (float64 [m]).
void vpred_terms(const at::Tensor &x0, const at::Tensor &noise, const at::Tensor &timestep,
                 const at::Tensor &alphas_cumprod, at::Tensor *x_t, at::Tensor *weight);
// The x0 estimate from the model's velocity: sqrt(a_t) x_t - sqrt(1 - a_t) v (diffusers'
// scheduler.get_velocity(v, x_t, t), as CogVideoX's training scripts use it).
at::Tensor vpred_x0(const at::Tensor &x_t, const at::Tensor &v, const at::Tensor &timestep,
                    const at::Tensor &alphas_cumprod);
// Each sample's mean(w (x0_pred - x0)^2) over its elements, float32 [m].
at::Tensor vpred_loss(const at::Tensor &x0_pred, const at::Tensor &x0, const at::Tensor &weight);
// Latents [m, C, T, H, W] as CogVideoX takes them, [m, F, C, H, W], with frames padded to a multiple
// of patch_t by repeating the first frame in front (CogVideoX's own fine-tuning code; its pipelines
// likewise drop the leading extra frames after sampling).
at::Tensor cogvideox_latents(const at::Tensor &latents, int64_t patch_t);

}  // namespace videotrain::models
