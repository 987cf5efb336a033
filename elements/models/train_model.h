/* What the trainer trains: a TorchScript module with training_step(latents, captions), or
 * training_step(latents, text_embeds, text_mask) for streams that carry a textencoder's
 * embeddings, or one of the models built into the project (builtin:NAME). Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model_options.h"

namespace videotrain {

namespace models {
class DitModel;
}

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// What one forward gets for m samples: latents [m, C, t, h, w] and each sample's caption or,
// after a textencoder, its embedding [m, L, D] and mask [m, L] (int64, 1 on tokens).
struct ModelInputs {
  at::Tensor latents;
  std::vector<std::string> captions;
  at::Tensor text_embeds, text_mask;  // undefined without a textencoder
  // Image-to-video: each sample's mask and condition latents [m, tc + z, t, h, w] (vaeencoder
  // condition=, models/image_condition.h), which the model takes beside the noisy latents.
  at::Tensor condition;
  // Wan 2.1 I2V / FLF2V: each sample's image encoder states [m, n, N, D] (imageencoder; n = 1, FLF2V 2:
  // first then last frame), which the transformer's image path takes.
  at::Tensor image_embeds;
  // Each sample's manifest row and the epoch (the batch meta's), for noise drawn per sample; empty
  // when the caller has none (models then draw from the step's default generator).
  std::vector<uint64_t> sample_ids;
  unsigned epoch = 0;
  bool has_text() const { return text_embeds.defined(); }
  // Samples [start, start + n) (validation's per-sample fallback).
  ModelInputs narrow(int64_t start, int64_t n) const;
};

// The sizes a built-in model is built for (read from the first micro-batch, or a checkpoint).
struct ModelDims {
  int latent_channels = 0;
  int text_dim = 0;  // D of text_embeds; only text-conditioned built-ins need it
};

class TrainModel {
 public:
  virtual ~TrainModel() = default;
  virtual std::string spec() const = 0;  // the `model` property value
  virtual NamedTensors named_parameters() = 0;
  virtual NamedTensors named_buffers() = 0;
  // True when the model conditions on text embeddings (training_step(latents, text_embeds,
  // text_mask)), false when it takes captions.
  virtual bool takes_text() const = 0;
  // Scalar loss, mean over the samples of `in.latents` [m, C, t, h, w].
  virtual at::Tensor training_step(const ModelInputs &in) = 0;
  virtual void train(bool on) = 0;
  // Validation loss of each sample, [m] float, with noise and timesteps drawn from
  // generators seeded by seeds[i] (not the default generator, which the trainer's
  // thread seeds and draws from), so that a sample's loss depends only on the weights,
  // the sample and its seed. Undefined tensor: the model has no such method (ddpvalsink
  // then falls back to training_step under a seeded default generator).
  virtual at::Tensor validation_step(const ModelInputs &in, const std::vector<int64_t> &seeds) {
    (void)in, (void)seeds;
    return at::Tensor();
  }
  // Weights in a form Python reads (TorchScript: torch.jit.load; builtin: safetensors).
  // Returns the file name written in `dir`. Throws on error.
  virtual std::string save(const std::string &dir) = 0;
  // Copies weights saved by save() into this model (same architecture). Throws.
  virtual void load(const std::string &dir) = 0;
  // Native models: writes the folder their class loads from (diffusers: config.json + sharded
  // safetensors in `dtype`, "bf16" | "fp16" | "fp32"). False: this model has no such form.
  virtual bool export_folder(const std::string &dir, const std::string &dtype) {
    (void)dir, (void)dtype;
    return false;
  }
  // The export's default folder name under checkpoint-dir ("transformer", or "lora" for a LoRA run).
  virtual std::string export_name() const { return "transformer"; }
  // Native models: the transformer itself (its own call, for samplers); null for the others.
  virtual models::DitModel *dit() { return nullptr; }
  // Wan 2.2 A14B (model-2): the low-noise expert and the boundary ratio (expert_pair.h); dit() is then
  // the high-noise one. Null / 0 for one model.
  virtual models::DitModel *dit_2() { return nullptr; }
  virtual double boundary_ratio() const { return 0; }
};

// Name of the first defined floating-point tensor holding NaN/Inf; "" when all are finite.
// One host sync for all of them.
std::string first_non_finite(const NamedTensors &tensors);
// The same over the model's parameters and buffers.
std::string first_non_finite(TrainModel &model);

// "" when the model takes the inputs a stream carries (embeddings or captions), else what to change.
std::string check_model_inputs(const TrainModel &model, bool stream_has_text);

// Builtin names users can pick (without the "builtin:" prefix); make_model() also builds the
// test-only builtin:linear-test, which is not listed.
std::vector<std::string> builtin_model_names();
bool is_builtin_spec(const std::string &spec);
// Whether make_model() can build `spec` with these dims (TorchScript: always; builtins need the
// latent channels, text-conditioned ones the text dim too).
bool model_dims_known(const std::string &spec, const ModelDims &dims);

// A folder with a config.json: a diffusers transformer folder (native_model.cpp).
bool is_model_folder(const std::string &spec);
// config.json's _class_name of a model folder, or "" (no such key, or unreadable JSON).
std::string model_folder_class(const std::string &dir);

// Loads a TorchScript file, a diffusers transformer folder, or builds a builtin model on `device`
// (see model_dims_known). Throws std::runtime_error naming the file / name. Defined in make_model.cpp
// with the builtin names above, the only file that knows every kind of model.
std::unique_ptr<TrainModel> make_model(const std::string &spec, const ModelDims &dims, const c10::Device &device,
                                       const ModelOptions &options = {});

// Hashes caption words into `buckets` ids (builtin models' caption embedding).
std::vector<int64_t> caption_token_ids(const std::string &caption, int64_t buckets);

}  // namespace videotrain
