/* Between textencoder's face and its engine (the face has no torch): adds each latent buffer's
 * caption embedding and mask as the named tensors text_embeds [L, D] and text_mask [L] (int64). */
#pragma once

#include <gst/gst.h>

#include <memory>
#include <string>
#include <vector>

#include "text_options.h"

namespace videotrain::text {

class TextEncoderEngine;

class TextBuffers {
 public:
  // Null with *error naming the property and file when the engine cannot start.
  static std::unique_ptr<TextBuffers> create(const TextEncoderOptions &opts, std::string *error);
  ~TextBuffers();

  // Encodes the captions of the buffers' sample metas in one call and attaches the tensors;
  // each buffer is made writable in place. Buffers without a sample meta get the empty caption
  // (*without_meta counts them). False with *error when the model fails.
  bool attach(std::vector<GstBuffer *> &buffers, size_t *without_meta, std::string *error);

  int64_t embed_dim() const;
  std::string dtype_name() const;
  std::string device_name() const;
  TextEncoderStats stats() const;
  bool encoder_loaded() const;
  std::string take_warning();  // see TextEncoderEngine::take_warning

 private:
  TextBuffers() = default;
  std::unique_ptr<TextEncoderEngine> engine_;
};

}  // namespace videotrain::text
