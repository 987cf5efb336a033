/* WanTransformer3DModel's config.json, parsed strictly: no torch (the fuzz target builds it alone). */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace videotrain::models {

struct WanConfig {
  std::vector<int64_t> patch_size{1, 2, 2};
  int64_t num_attention_heads = 12, attention_head_dim = 128, in_channels = 16, out_channels = 16;
  int64_t text_dim = 4096, freq_dim = 256, ffn_dim = 8960, num_layers = 30, rope_max_seq_len = 1024;
  // Wan 2.1 I2V / FLF2V's image path (0: none): image_dim the image encoder's width, added_kv_proj_dim
  // the image keys' input width (= dim), pos_embed_seq_len FLF2V's two images' token count.
  int64_t image_dim = 0, added_kv_proj_dim = 0, pos_embed_seq_len = 0;
  bool cross_attn_norm = true;
  double eps = 1e-6;
  int64_t dim() const { return num_attention_heads * attention_head_dim; }
};

// config.json of a WanTransformer3DModel folder. Every key must be one this port knows, with a
// value it supports; false with a reason naming the key.
bool parse_wan_transformer_config(const std::string &json_text, WanConfig *out, std::string *error);
// The config.json diffusers writes for `c` (every key, so that from_pretrained reads it).
std::string wan_transformer_config_json(const WanConfig &c);

}  // namespace videotrain::models
