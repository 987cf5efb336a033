/* CogVideoXTransformer3DModel's config.json, parsed strictly: no torch (the fuzz targets may build it alone). */
#pragma once

#include <cstdint>
#include <string>

namespace videotrain::models {

// The text-to-video layouts: CogVideoX-2b (sincos positions), CogVideoX-5b (3D rotary positions) and
// CogVideoX1.5-5B (rotary, temporal patches patch_size_t, Linear patch embedding); the image-to-video
// ones: CogVideoX-5b-I2V (in_channels 2 x out_channels: the image latents after the noisy ones, learned
// positional embeddings) and CogVideoX1.5-5B-I2V (in_channels 2 x out_channels, ofs_embed_dim).
struct CogVideoXConfig {
  int64_t num_attention_heads = 30, attention_head_dim = 64, in_channels = 16, out_channels = 16;
  bool flip_sin_to_cos = true;
  int64_t freq_shift = 0, time_embed_dim = 512, text_embed_dim = 4096, num_layers = 30;
  bool attention_bias = true;
  int64_t sample_width = 90, sample_height = 60, sample_frames = 49, patch_size = 2;
  int64_t patch_size_t = 0;  // 0: null (CogVideoX 1.0, Conv2d patches)
  int64_t temporal_compression_ratio = 4, max_text_seq_length = 226;
  double norm_eps = 1e-5, spatial_interpolation_scale = 1.875, temporal_interpolation_scale = 1.0;
  bool use_rotary_positional_embeddings = false, patch_bias = true;
  bool use_learned_positional_embeddings = false;  // 5b-I2V: patch_embed.pos_embedding, stored
  int64_t ofs_embed_dim = 0;                        // 0: null; 1.5-I2V: ofs_embedding (= time_embed_dim)
  int64_t dim() const { return num_attention_heads * attention_head_dim; }
};

// config.json of a CogVideoXTransformer3DModel folder. Every key must be one this port knows with a
// value it supports (image-to-video: in_channels twice out_channels; learned positions only with rotary
// ones and no patch_size_t, as in 5b-I2V; ofs_embed_dim equal to time_embed_dim, as in 1.5-I2V), else
// false with a reason naming the key.
bool parse_cogvideox_transformer_config(const std::string &json_text, CogVideoXConfig *out, std::string *error);
// The config.json diffusers writes for `c` (every key).
std::string cogvideox_transformer_config_json(const CogVideoXConfig &c);

}  // namespace videotrain::models
