/* transformers' CLIP vision encoder config.json (CLIPVisionModel / CLIPVisionModelWithProjection: the
 * image_encoder/ folder of Wan 2.1 I2V / FLF2V) and its image processor's preprocessor_config.json
 * (CLIPImageProcessor: the image_processor/ folder), parsed strictly: no torch (the fuzz targets can
 * build it). */
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace videotrain::models {

struct ClipVisionConfig {
  std::string class_name = "CLIPVisionModel";  // architectures[0]; or the model_type's class
  bool with_projection = false;                 // CLIPVisionModelWithProjection: visual_projection
  // transformers' CLIPVisionConfig defaults (ViT-B/32); Wan's ViT-H/14: 1280, 5120, 32, 16, 14, gelu.
  int64_t hidden_size = 768, intermediate_size = 3072, num_hidden_layers = 12, num_attention_heads = 12;
  int64_t num_channels = 3, image_size = 224, patch_size = 32, projection_dim = 512;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "quick_gelu";  // quick_gelu | gelu | gelu_new | gelu_pytorch_tanh
  int64_t grid() const { return image_size / patch_size; }
  int64_t num_positions() const { return grid() * grid() + 1; }  // the class token, then the patches
};

// config.json of a CLIPVisionModel / CLIPVisionModelWithProjection folder (model_type
// "clip_vision_model"). Keys that do not change the forward (dropout, init) are ignored; a whole CLIP
// (model_type "clip"), another class or an activation this port does not implement is an error naming
// the key; false with a reason.
bool parse_clip_vision_config(const std::string &json_text, ClipVisionConfig *out, std::string *error);

// preprocessor_config.json of a CLIPImageProcessor: resize (the shortest edge to `shortest_edge`, the
// other by transformers' int(size * long / short); or to height x width), center crop, rescale,
// normalise, in that order, each when its do_* is true.
struct ClipProcessorConfig {
  bool do_resize = true, do_center_crop = true, do_rescale = true, do_normalize = true;
  int64_t shortest_edge = 224;             // size {"shortest_edge": N} (or an int); 0 with resize_height
  int64_t resize_height = 0, resize_width = 0;  // size {"height", "width"}
  int64_t crop_height = 224, crop_width = 224;
  int resample = 3;  // PIL's filter number: 2 bilinear, 3 bicubic (the CLIP processors' default)
  double rescale_factor = 1.0 / 255.0;
  std::array<double, 3> image_mean{0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN
  std::array<double, 3> image_std{0.26862954, 0.26130258, 0.27577711};  // OPENAI_CLIP_STD
};

// Keys absent keep CLIPImageProcessor's defaults; a processor type other than CLIP's, a resample
// filter other than bilinear / bicubic, a size or crop that is not positive is an error naming the
// key; false with a reason.
bool parse_clip_processor_config(const std::string &json_text, ClipProcessorConfig *out, std::string *error);

}  // namespace videotrain::models
