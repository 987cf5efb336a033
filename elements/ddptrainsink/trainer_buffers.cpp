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
  BatchInfo info;  // no batch meta: its defaults make the buffer a whole step on its own
  read_batch_meta(buf, &info);
  ProcessResult r = engine.process_inputs(in, info);
  if (r == ProcessResult::kError) *error = engine.error();
  return r;
}

}  // namespace videotrain
