/* See trainer_buffers.h. */
#include "trainer_buffers.h"

#include <utility>

#include "metas.h"
#include "models/train_model.h"
#include "tensor_buffer.h"
#include "tensor_caps.h"

namespace videotrain {

ProcessResult train_on_buffer(TrainerEngine &engine, GstBuffer *buf, std::string *error) {
  std::string why;
  auto t = tensor_from_buffer(buf, &why);
  if (!t) {
    *error = "buffer holds no tensor: " + why;
    return ProcessResult::kError;
  }
  ModelInputs in;
  in.latents = *t;
  if (!text_tensors_from_buffer(buf, &in.text_embeds, &in.text_mask, &why)) {
    *error = "micro-batch: " + why;
    return ProcessResult::kError;
  }
  // Image-to-video: vaeencoder condition= and imageencoder's image_embeds, stacked by microbatcher.
  for (const auto &[name, out] : {std::pair<const char *, at::Tensor *>{"condition", &in.condition},
                                  {"image_embeds", &in.image_embeds}}) {
    if (!find_tensor_meta(buf, name)) continue;
    auto c = named_tensor_from_buffer(buf, name, &why);
    if (!c) {
      *error = std::string("micro-batch: tensor '") + name + "' cannot be read: " + why;
      return ProcessResult::kError;
    }
    *out = *c;
  }
  MicroBatchInfo info;
  BatchInfo meta;
  if (read_batch_meta(buf, &meta)) {
    info.step = meta.step;
    info.micro_index = meta.micro_index;
    info.micro_count = meta.micro_count;
    info.step_samples = meta.step_samples;
    info.sync = meta.sync;
    info.epoch = meta.epoch;
    info.next_clip = meta.next_clip;
    info.sample_ids = std::move(meta.sample_ids);
    info.captions = std::move(meta.captions);
  } else {
    // No batch meta: each buffer is a whole step on its own.
    info.step_samples = t->dim() > 0 ? static_cast<unsigned>(t->size(0)) : 0;
  }
  in.captions = info.captions;
  ProcessResult r = engine.process_inputs(in, info);
  if (r == ProcessResult::kError) *error = engine.error();
  return r;
}

}  // namespace videotrain
