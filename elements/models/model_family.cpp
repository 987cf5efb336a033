/* The model families: see model_family.h. Sizes, lengths and shifts are the diffusers pipelines' and
 * schedulers' defaults (pipeline_wan.py, pipeline_cogvideox.py with CogVideoXTransformer3DModel's
 * sample_* config; the interop test model-families reads them from diffusers). */
#include "model_family.h"

#include "lora_names.h"

namespace videotrain::models {

namespace {

std::vector<ModelFamily> make_families() {
  ModelFamily wan{};
  wan.name = "wan";
  wan.title = "Wan";
  wan.class_name = "WanTransformer3DModel";
  wan.frames = 81, wan.width = 832, wan.height = 480;  // 480p
  wan.layout = LatentLayout::kChannelsFirst;
  wan.temporal_padding = TemporalPadding::kNone;
  wan.text = TextConvention::kZeroPadded;
  wan.text_encoder_class = "UMT5EncoderModel";
  wan.text_length = 512;
  wan.cleans_prompts = true;
  wan.objective = Objective::kFlowMatching;
  wan.default_shift = 3.0;  // flow_shift at 480p (5.0 at 720p)
  wan.default_sampler = "unipc";
  wan.samplers = "euler or unipc";
  wan.lora_names = &wan_lora_names();
  // pipeline_wan_i2v: a 4-channel frame mask and the VAE's latents of the conditioning video after
  // the noisy ones (16 + 4 + 16 = 36); Wan 2.1 adds CLIP's penultimate states (image_dim 1280).
  wan.image_layouts = {
      {"Wan 2.1 I2V", 4, true, true, 1, ConditionBuild::kMaskAndLatents},
      {"Wan 2.1 FLF2V", 4, true, true, 2, ConditionBuild::kMaskAndLatents},
      {"Wan 2.2 I2V", 4, true, false, 1, ConditionBuild::kMaskAndLatents},
  };
  // pipeline_wan_i2v with expand_timesteps (Wan 2.2 TI2V 5B): the T2V transformer, the image's latents as
  // the first frame.
  wan.expand_timesteps_layout = {"Wan 2.2 TI2V", 0, false, false, 1, ConditionBuild::kCleanFirstFrame};

  ModelFamily cog{};
  cog.name = "cogvideox";
  cog.title = "CogVideoX";
  cog.class_name = "CogVideoXTransformer3DModel";
  cog.frames = 49, cog.width = 720, cog.height = 480;  // sample_frames, sample_width/height x 8
  cog.layout = LatentLayout::kFramesFirst;
  cog.temporal_padding = TemporalPadding::kRepeatFirstFront;  // CogVideoX 1.5 (patch_size_t 2)
  cog.text = TextConvention::kUnmasked;
  cog.text_encoder_class = "T5EncoderModel";
  cog.text_length = 226;
  cog.cleans_prompts = false;
  cog.objective = Objective::kVPrediction;
  cog.default_shift = 3.0;  // snr_shift_scale of CogVideoX-2b's scheduler (5b: 1.0)
  cog.default_sampler = "dpm";
  cog.samplers = "ddim or dpm";
  cog.lora_names = &cogvideox_lora_names();
  // pipeline_cogvideox_image2video (5b-I2V, 1.5-5B-I2V): the first frame's latents, zero-padded over the
  // latent frames, after the noisy ones (16 + 16 = 32); no mask, no image encoder.
  cog.image_layouts = {{"CogVideoX I2V", 0, true, false, 1, ConditionBuild::kImageLatents}};
  cog.expand_timesteps_layout = {"", 0, false, false, 0, ConditionBuild::kNone};
  return {wan, cog};
}

template <typename Key>
const ModelFamily *find(const std::string &value, Key key) {
  for (const auto &f : model_families())
    if (value == key(f)) return &f;
  return nullptr;
}

}  // namespace

const std::vector<ModelFamily> &model_families() {
  static const std::vector<ModelFamily> families = make_families();
  return families;
}

const ModelFamily *family_named(const std::string &name) {
  return find(name, [](const ModelFamily &f) { return f.name; });
}

const ModelFamily *family_of_class(const std::string &class_name) {
  return find(class_name, [](const ModelFamily &f) { return f.class_name; });
}

const ModelFamily *family_of_text_encoder(const std::string &class_name) {
  return find(class_name, [](const ModelFamily &f) { return f.text_encoder_class; });
}

std::string per_family(const std::function<std::string(const ModelFamily &)> &item, const std::string &sep) {
  std::string out;
  for (const auto &f : model_families()) {
    const std::string s = item(f);
    if (!s.empty()) out += (out.empty() ? "" : sep) + s;
  }
  return out;
}

std::string family_names(const std::string &sep) {
  return per_family([](const ModelFamily &f) { return f.name; }, sep);
}

std::string family_titles(const std::string &sep) {
  return per_family([](const ModelFamily &f) { return f.title; }, sep);
}

std::string per_image_layout(const std::function<std::string(const ModelFamily &, const ImageLayout &)> &item,
                             const std::string &sep) {
  return per_family([&](const ModelFamily &f) {
    std::string out;
    for (const auto &l : f.image_layouts) {
      const std::string s = item(f, l);
      if (!s.empty()) out += (out.empty() ? "" : sep) + s;
    }
    return out;
  }, sep);
}

const char *objective_name(Objective o) { return o == Objective::kFlowMatching ? "flow matching" : "v-prediction"; }

const char *text_convention_text(TextConvention t) {
  switch (t) {
    case TextConvention::kUnmasked: return "the encoder run without the attention mask, every position kept";
    case TextConvention::kZeroPadded: return "the encoder run with the mask, rows past the tokens zero";
    case TextConvention::kAsReturned: break;
  }
  return "the encoder's output as returned";
}

const ImageLayout *image_layout(const ModelFamily &f, int64_t in_channels, int64_t out_channels, bool image_embeddings,
                                bool two_images) {
  for (const auto &l : f.image_layouts)
    if (l.in_channels(out_channels) == in_channels && l.image_embeddings == image_embeddings &&
        (l.images == 2) == two_images)
      return &l;
  return nullptr;
}

const ImageLayout *condition_layout(const ModelFamily &f, int64_t condition_channels) {
  if (condition_channels <= 0) return nullptr;
  for (const auto &l : f.image_layouts)
    if (l.condition_channels(1) > 0 && l.build != ConditionBuild::kNone) return &l;
  return nullptr;
}

}  // namespace videotrain::models
