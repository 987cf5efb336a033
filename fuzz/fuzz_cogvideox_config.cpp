// libFuzzer target: the CogVideoXTransformer3DModel config.json parser (elements/models/
// cogvideox_transformer_config.cpp): a config it accepts has sizes a model can be built from (and
// positions it can compute), and what it writes back parses to the same config.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "models/cogvideox_transformer_config.h"

using namespace videotrain::models;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  CogVideoXConfig c;
  std::string error;
  if (!parse_cogvideox_transformer_config(text, &c, &error)) {
    fuzzin::check(!error.empty());
    return 0;
  }
  // Text-to-video, or image-to-video with the image latents after the noisy ones (twice the channels).
  fuzzin::check(c.dim() >= 1 && c.dim() <= 65536 &&
                (c.in_channels == c.out_channels || c.in_channels == 2 * c.out_channels));
  fuzzin::check(c.ofs_embed_dim == 0 || c.ofs_embed_dim == c.time_embed_dim);
  fuzzin::check(!c.use_learned_positional_embeddings || (c.use_rotary_positional_embeddings && !c.patch_size_t));
  fuzzin::check(c.use_rotary_positional_embeddings ? c.attention_head_dim % 8 == 0 : c.dim() % 4 == 0);
  fuzzin::check(c.patch_size >= 1 && c.patch_size <= 64 && c.patch_size_t >= 0 && c.patch_size_t <= 64);
  CogVideoXConfig again;
  fuzzin::check(parse_cogvideox_transformer_config(cogvideox_transformer_config_json(c), &again, &error));
  fuzzin::check(cogvideox_transformer_config_json(again) == cogvideox_transformer_config_json(c));
  return 0;
}
