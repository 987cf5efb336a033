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

ImageBuffers::Result ImageBuffers::attach(GstBuffer **buf, std::string *error) {
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

int64_t ImageBuffers::tokens() const { return engine_->tokens(); }
int64_t ImageBuffers::embed_dim() const { return engine_->embed_dim(); }
int ImageBuffers::layer() const { return engine_->layer(); }
std::string ImageBuffers::dtype_name() const { return engine_->dtype_name(); }
std::string ImageBuffers::device_name() const { return engine_->device_name(); }
std::string ImageBuffers::processor_dir() const { return engine_->processor_dir(); }
ImageEncoderStats ImageBuffers::stats() const { return engine_->stats(); }
bool ImageBuffers::encoder_loaded() const { return engine_->encoder_loaded(); }
std::string ImageBuffers::take_warning() { return engine_->take_warning(); }

}  // namespace videotrain::image
