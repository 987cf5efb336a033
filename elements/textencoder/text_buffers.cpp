#include "text_buffers.h"

#include <stdexcept>

#include "metas.h"
#include "tensor_buffer.h"
#include "text_encoder_engine.h"

namespace videotrain::text {

std::unique_ptr<TextBuffers> TextBuffers::create(const TextEncoderOptions &opts, std::string *error) {
  std::unique_ptr<TextBuffers> b(new TextBuffers());
  b->engine_ = TextEncoderEngine::create(opts, error);
  if (!b->engine_) return nullptr;
  return b;
}

TextBuffers::~TextBuffers() = default;

bool TextBuffers::attach(std::vector<GstBuffer *> &buffers, size_t *without_meta, std::string *error) {
  std::vector<TextRequest> requests;
  for (GstBuffer *b : buffers) {
    SampleInfo info;
    TextRequest r;
    if (read_sample_meta(b, &info)) {
      r.caption = info.caption;
      r.sample_id = info.sample_id;
      r.epoch = info.epoch;
    } else if (without_meta) {
      (*without_meta)++;
    }
    requests.push_back(std::move(r));
  }
  std::vector<TextEmbedding> out;
  try {
    out = engine_->encode(requests);
  } catch (const std::exception &e) {
    if (error) *error = e.what();
    return false;
  }
  for (size_t i = 0; i < buffers.size(); i++) {
    buffers[i] = gst_buffer_make_writable(buffers[i]);
    buffer_append_tensor(buffers[i], "text_embeds", out[i].embeds);
    buffer_append_tensor(buffers[i], "text_mask", out[i].mask);
  }
  return true;
}

int64_t TextBuffers::embed_dim() const { return engine_->embed_dim(); }
std::string TextBuffers::dtype_name() const { return engine_->dtype_name(); }
std::string TextBuffers::device_name() const { return engine_->device_name(); }
TextEncoderStats TextBuffers::stats() const { return engine_->stats(); }
bool TextBuffers::encoder_loaded() const { return engine_->encoder_loaded(); }
std::string TextBuffers::take_warning() { return engine_->take_warning(); }

}  // namespace videotrain::text
