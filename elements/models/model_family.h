/* What the project knows of each model family (Wan 2.1/2.2, CogVideoX 1.0/1.5), in one table: the
 * sampler, the trainer's objective, textencoder and the LoRA code ask it and hold no family names, so
 * a new family is one more entry here (and its transformer beside the others). No torch. */
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace videotrain::models {

// Where the frames sit in what the transformer takes (and the sampler draws its noise in).
enum class LatentLayout {
  kChannelsFirst,  // [B, C, T, H, W] (Wan)
  kFramesFirst,    // [B, F, C, H, W] (CogVideoX)
};

// How the family's pipelines pass the text encoder's output (textencoder embedding-convention).
// A TorchScript encoder without a named convention passes its output as returned.
enum class TextConvention {
  kAsReturned,  // no family: the output as the encoder returns it
  kUnmasked,    // the encoder run without the mask, every row kept (pipeline_cogvideox)
  kZeroPadded,  // run with the mask, the rows past the tokens zero (pipeline_wan)
};

// What training predicts, and so which schedule and samplers fit.
enum class Objective {
  kFlowMatching,  // rectified flow: target noise - x0, sigma-shifted timesteps (FlowMatch Euler, UniPC)
  kVPrediction,   // v on a DDPM scaled-linear schedule with an SNR shift (DDIM, DPM)
};

// Temporal patch padding: what happens when the latent frames are not a multiple of the transformer's
// patch_size_t.
enum class TemporalPadding {
  kNone,              // the family's temporal patch is 1
  kRepeatFirstFront,  // padded in front (training: the first frame repeated; sampling: noise, dropped after)
};

// How a layout's pipeline builds what the transformer takes from a prompt's image(s) before its denoising
// loop (models/i2v_inputs.h: image_inputs).
enum class ConditionBuild {
  kNone,             // nothing from an image
  kMaskAndLatents,   // a mask of the given frames, then the VAE's latents (mode) of the image(s) at the ends of
                     // zero frames (WanImageToVideoPipeline)
  kImageLatents,     // the image encoded alone, its posterior drawn from the generator before the noise, scaled
                     // (VaeEncoder::image_latent_scale) and zero-padded over the latent frames (CogVideoX I2V)
  kCleanFirstFrame,  // the image's latents are the clean first latent frame at every step (pipelines with
                     // expand_timesteps: Wan 2.2 TI2V 5B)
};

// One image-to-video layout of a family: what it takes beside the noisy latents (z channels). A
// text-to-video layout takes none of it.
struct ImageLayout {
  const char *name;         // as messages say it: "Wan 2.1 I2V"
  int64_t mask_channels;    // a mask of the given frames, one channel per frame of a latent frame (0: none)
  bool condition_latents;   // the VAE's latents of the conditioning video (z channels), after the mask
  bool image_embeddings;    // an image encoder's states (encoder_hidden_states_image)
  int images;               // conditioning frames per sample (first; FLF2V: first and last)
  ConditionBuild build;     // how its pipeline builds the condition from the image(s)
  // The channels concatenated after the noisy latents, and the transformer's in_channels.
  int64_t condition_channels(int64_t z) const { return mask_channels + (condition_latents ? z : 0); }
  int64_t in_channels(int64_t z) const { return z + condition_channels(z); }
};

struct LoraNameTable;  // lora_names.h

struct ModelFamily {
  const char *name;        // "wan": DitModel::family(), embedding-convention's value, LoRA key families
  const char *title;       // "Wan" in messages
  const char *class_name;  // the diffusers transformer class of its folders
  // The pipelines' default sample size.
  int64_t frames, width, height;
  LatentLayout layout;
  TemporalPadding temporal_padding;
  TextConvention text;
  const char *text_encoder_class;  // the transformers class of its text_encoder/
  int64_t text_length;             // the pipelines' max_sequence_length: rows the text is padded to
  bool cleans_prompts;             // the pipelines clean captions before tokenizing (HTML entities, spaces)
  Objective objective;
  double default_shift;            // the schedule's shift when the folder gives none (flow_shift, snr_shift_scale)
  const char *default_sampler;     // ddpsampler sampler=auto
  const char *samplers;            // the samplers of its objective, for messages: "euler or unipc"
  const LoraNameTable *lora_names;  // its LoRA-targetable modules' names in the ComfyUI/kohya namings
  std::vector<ImageLayout> image_layouts;  // the image-to-video layouts the code knows
  // A text-to-video transformer under a pipeline that says expand_timesteps (model_index.json): what an
  // image, when a prompt gives one, becomes (Wan 2.2 TI2V 5B: its clean first frame). build kNone: the
  // family has no such pipeline.
  ImageLayout expand_timesteps_layout;
};

// Every family, in a fixed order.
const std::vector<ModelFamily> &model_families();
// By name ("wan"), diffusers transformer class or text encoder class; null when none has it.
const ModelFamily *family_named(const std::string &name);
const ModelFamily *family_of_class(const std::string &class_name);
const ModelFamily *family_of_text_encoder(const std::string &class_name);
// Each family's item joined by `sep`, in the table's order (messages and blurbs that list the families).
std::string per_family(const std::function<std::string(const ModelFamily &)> &item, const std::string &sep = ", ");
// The families' names (or titles) joined by `sep`, for messages.
std::string family_names(const std::string &sep);
std::string family_titles(const std::string &sep);

// "flow matching" | "v-prediction"; what text_embeds holds under a convention (for blurbs).
const char *objective_name(Objective o);
const char *text_convention_text(TextConvention t);

// Each family's image-to-video layouts' item joined by `sep`, in the table's order, skipping empty
// items (messages that list the layouts, e.g. those that take an image encoder's states).
std::string per_image_layout(const std::function<std::string(const ModelFamily &, const ImageLayout &)> &item,
                             const std::string &sep = ", ");

// The family's known image-to-video layout of a transformer with these channels (two_images: FLF2V's
// pos_embed_seq_len), or null (a text-to-video layout, or one the code does not know).
const ImageLayout *image_layout(const ModelFamily &f, int64_t in_channels, int64_t out_channels, bool image_embeddings,
                                bool two_images);

// The layout whose build a sampler follows for a transformer with `condition_channels` beside its latents:
// the first of f's layouts that takes condition channels (their count is checked against the VAE where
// the condition is built; the prompt's images decide first or first and last), or null when none does.
const ImageLayout *condition_layout(const ModelFamily &f, int64_t condition_channels);

}  // namespace videotrain::models
