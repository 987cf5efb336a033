/* imageencoder's engine: a clip's conditioning frames (vaeencoder's condition_frames, uint8
 * [n, H, W, 3]) through transformers' CLIPImageProcessor and a CLIP vision encoder (the
 * image_encoder/ and image_processor/ folders of the image-to-video layouts that take image
 * embeddings, models/model_family.h's ImageLayout::image_embeddings; models/clip_vision.h,
 * models/clip_image_processor.h) to hidden_states[hidden_state], [n, tokens, dim]: what their
 * pipelines' encode_image hands the transformer as image_embeds (hidden_states[-2]).
 * With cache_dir the result is kept in the latent cache's store under a key of the frames' bytes,
 * the encoder folder's identity, the processor config, hidden_state, dtype and device type; the
 * encoder's weights are then loaded at the first miss. No GStreamer here. */
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "image_options.h"

namespace videotrain::image {

class ImageEncoderEngine {
 public:
  // Reads both configs (and, without cache_dir, loads the weights). Null with *error naming the
  // property and the file when anything does not fit.
  static std::unique_ptr<ImageEncoderEngine> create(const ImageEncoderOptions &opts, std::string *error);
  ~ImageEncoderEngine();

  // frames: uint8 [n, H, W, 3] (any device). Returns [n, tokens, dim] in the engine's dtype on its
  // device. Throws std::runtime_error naming what does not fit.
  at::Tensor encode(const at::Tensor &frames);
  // The processor's pixel_values [n, 3, S, S] float32 for those frames (what encode() feeds the encoder).
  at::Tensor pixel_values(const at::Tensor &frames) const;

  const ImageEncoderInfo &info() const;
  ImageEncoderStats stats() const;
  // A cache-dir problem to report once (an unusable entry, a failed write); "" when none.
  std::string take_warning();

 private:
  ImageEncoderEngine();
  struct Impl;
  std::unique_ptr<Impl> im_;
};

}  // namespace videotrain::image
