/* Between imageencoder's face and its engine (the face has no torch): replaces a latent buffer's
 * condition_frames (vaeencoder condition=) by the named tensor image_embeds [n, tokens, dim]. */
#pragma once

#include <gst/gst.h>

#include <memory>
#include <string>

#include "image_options.h"

namespace videotrain::image {

class ImageEncoderEngine;

class ImageBuffers {
 public:
  // Null with *error naming the property and file when the engine cannot start.
  static std::unique_ptr<ImageBuffers> create(const ImageEncoderOptions &opts, std::string *error);
  ~ImageBuffers();

  enum class Result { kOk, kNoFrames, kError };
  // Encodes *buf's condition_frames, appends image_embeds and drops condition_frames (*buf made
  // writable in place; every other tensor and meta kept). kNoFrames: the buffer has none;
  // kError with *error when they cannot be read or the encoder fails.
  Result attach(GstBuffer **buf, std::string *error);

  int64_t tokens() const;
  int64_t embed_dim() const;
  int layer() const;
  std::string dtype_name() const;
  std::string device_name() const;
  std::string processor_dir() const;
  ImageEncoderStats stats() const;
  bool encoder_loaded() const;
  std::string take_warning();

 private:
  ImageBuffers() = default;
  std::unique_ptr<ImageEncoderEngine> engine_;
};

}  // namespace videotrain::image
