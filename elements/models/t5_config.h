/* transformers' T5 / umT5 encoder config.json (T5EncoderModel as CogVideoX ships t5-v1_1-xxl,
 * UMT5EncoderModel as Wan ships umt5-xxl), parsed strictly: no torch (the fuzz targets can build it). */
#pragma once

#include <cstdint>
#include <string>

namespace videotrain::models {

struct T5Config {
  bool umt5 = false;  // umT5: a relative-attention bias in every block; T5 v1.1: block 0's, shared
  std::string class_name;  // architectures[0], or the model_type's encoder class when absent
  int64_t vocab_size = 32128, d_model = 512, d_kv = 64, d_ff = 2048, num_layers = 6, num_heads = 8;
  int64_t relative_attention_num_buckets = 32, relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  int64_t inner_dim() const { return num_heads * d_kv; }
};

// config.json of a T5EncoderModel / UMT5EncoderModel folder (or model_type t5 / umt5). Keys that do
// not change the encoder's forward (dropout, decoder and generation settings) are ignored; a value
// this port does not implement (feed_forward_proj other than gated-gelu, is_decoder, another class)
// is an error naming the key; false with a reason.
bool parse_t5_config(const std::string &json_text, T5Config *out, std::string *error);

}  // namespace videotrain::models
