/* Between imageencoder's face and its engine (the face has no torch): replaces a latent buffer's
 * condition_frames (vaeencoder condition=) by the named tensor image_embeds [n, tokens, dim]. The
 * face reads the engine's settings and counters as plain structs (image_options.h). */
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
  // kError with *error when they cannot be read or the encoder fails. *warning (whatever the
  // result): a cache-dir problem to report once (an unusable entry, a failed write), else "".
  Result attach(GstBuffer **buf, std::string *error, std::string *warning);

  const ImageEncoderInfo &info() const;  // what the engine resolved at start
  ImageEncoderStats stats() const;

 private:
  ImageBuffers() = default;
  Result replace_frames(GstBuffer **buf, std::string *error);
  std::unique_ptr<ImageEncoderEngine> engine_;
};

}  // namespace videotrain::image
