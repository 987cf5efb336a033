#include "image_buffers.h"

#include <stdexcept>

#include "image_encoder_engine.h"
#include "tensor_buffer.h"
#include "tensor_caps.h"

namespace videotrain::image {

std::unique_ptr<ImageBuffers> ImageBuffers::create(const ImageEncoderOptions &opts, std::string *error) {
  std::unique_ptr<ImageBuffers> b(new ImageBuffers());
  b->engine_ = ImageEncoderEngine::create(opts, error);
  if (!b->engine_) return nullptr;
  return b;
}

ImageBuffers::~ImageBuffers() = default;

ImageBuffers::Result ImageBuffers::attach(GstBuffer **buf, std::string *error, std::string *warning) {
  const Result r = replace_frames(buf, error);
  *warning = engine_->take_warning();
  return r;
}

ImageBuffers::Result ImageBuffers::replace_frames(GstBuffer **buf, std::string *error) {
  if (!find_tensor_meta(*buf, "condition_frames")) return Result::kNoFrames;
  std::string why;
  auto frames = named_tensor_from_buffer(*buf, "condition_frames", &why);
  if (!frames) {
    *error = "tensor 'condition_frames' cannot be read: " + why;
    return Result::kError;
  }
  at::Tensor embeds;
  try {
    embeds = engine_->encode(*frames);
  } catch (const std::exception &e) {
    *error = e.what();
    return Result::kError;
  }
  *frames = at::Tensor();  // the buffer's memory may be ours: no view of it outlives the removal
  *buf = gst_buffer_make_writable(*buf);
  buffer_remove_tensor(*buf, "condition_frames");
  buffer_append_tensor(*buf, "image_embeds", embeds);
  return Result::kOk;
}

const ImageEncoderInfo &ImageBuffers::info() const { return engine_->info(); }
ImageEncoderStats ImageBuffers::stats() const { return engine_->stats(); }

}  // namespace videotrain::image
