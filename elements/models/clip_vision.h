/* transformers' CLIP vision transformer (CLIPVisionModel, CLIPVisionModelWithProjection) in LibTorch,
 * loaded from a published image_encoder/ folder by transformers' tensor names (with the
 * `vision_model.` prefix as transformers 4 wrote them, or without it as transformers 5 writes a
 * CLIPVisionModel): patch convolution without bias, a class token, learned positions, pre-LayerNorm
 * (`pre_layrnorm`, sic), pre-norm blocks of multi-head attention and an MLP, post-LayerNorm of the
 * class token. Wan 2.1 I2V / FLF2V condition on hidden_states[-2] (ViT-H/14 at 224 px: 257 x 1280).
 * Inference only. */
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "clip_vision_config.h"

namespace videotrain::models {

class ClipVisionEncoder {
 public:
  // Opens `dir` (config.json + model.safetensors or shards; F32/F16/BF16) with the parameters on
  // `device` in `dtype`. Throws std::runtime_error naming the file (and the key or tensor) when
  // anything does not fit.
  static std::unique_ptr<ClipVisionEncoder> open(const std::string &dir, c10::Device device, c10::ScalarType dtype);
  // `dir`/config.json alone. Throws naming the file.
  static ClipVisionConfig read_config(const std::string &dir);
  ~ClipVisionEncoder();

  // transformers' hidden_states for pixel_values [B, C, image_size, image_size]: [0] the embeddings
  // after pre_layrnorm, [i] block i's output, [num_hidden_layers] = last_hidden_state; each
  // [B, num_positions, hidden_size] in the parameters' dtype. `layers` >= 0 stops after that many
  // blocks (Wan's hidden_states[-2] needs all but the last). Throws on a wrong shape.
  std::vector<at::Tensor> hidden_states(const at::Tensor &pixel_values, int64_t layers = -1) const;
  // hidden_states[-2]: what Wan's image encoder hands the transformer.
  at::Tensor penultimate_hidden_states(const at::Tensor &pixel_values) const;
  // pooler_output: post_layernorm of last_hidden_state's class token, [B, hidden_size].
  at::Tensor pooled(const at::Tensor &last_hidden_state) const;
  // image_embeds: visual_projection(pooled) [B, projection_dim]; only with_projection folders.
  at::Tensor image_embeds(const at::Tensor &pooled) const;
  const ClipVisionConfig &config() const;
  c10::Device device() const;

 private:
  ClipVisionEncoder();
  struct Impl;
  std::unique_ptr<Impl> im_;
};

}  // namespace videotrain::models
