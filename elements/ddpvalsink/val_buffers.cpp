/* See val_buffers.h. */
#include "val_buffers.h"

#include <optional>
#include <utility>

#include "metas.h"
#include "tensor_buffer.h"
#include "tensor_caps.h"

namespace videotrain {

ValidationEngine::Result validate_buffer(ValidationEngine &engine, GstBuffer *buf, std::string *error) {
  using R = ValidationEngine::Result;
  std::string why;
  auto t = tensor_from_buffer(buf, &why);
  if (!t) {
    *error = "validation buffer holds no tensor: " + why;
    return R::kError;
  }
  std::vector<ValSample> samples;
  BatchInfo batch;
  SampleInfo one;
  if (read_batch_meta(buf, &batch)) {
    // Each sample's clip index and epoch come with it (a micro-batch may span two epochs).
    for (size_t i = 0; i < batch.sample_ids.size(); i++) {
      ValSample s;
      s.sample_id = batch.sample_ids[i];
      s.epoch = batch.epochs[i];
      s.clip_index = batch.clip_indices[i];
      s.padding = batch.padding[i];
      s.caption = batch.captions[i];
      samples.push_back(std::move(s));
    }
  } else if (read_sample_meta(buf, &one)) {
    ValSample s;
    s.sample_id = one.sample_id;
    s.epoch = one.epoch;
    s.clip_index = one.clip_index;
    s.padding = one.padding;
    s.caption = std::move(one.caption);
    samples.push_back(std::move(s));
  } else {
    *error = "validation buffer has neither a sample meta (latents from vaeencoder) nor a batch meta "
             "(micro-batch): the sample ids and clip indices that shards and passes need are missing";
    return R::kError;
  }
  at::Tensor embeds, mask;
  if (!text_tensors_from_buffer(buf, &embeds, &mask, &why)) {
    *error = "validation buffer: " + why;
    return R::kError;
  }
  at::Tensor condition, image;  // image-to-video: vaeencoder condition=, imageencoder's image_embeds
  for (const auto &[name, out] : {std::pair<const char *, at::Tensor *>{"condition", &condition},
                                  {"image_embeds", &image}}) {
    if (!find_tensor_meta(buf, name)) continue;
    auto c = named_tensor_from_buffer(buf, name, &why);
    if (!c) {
      *error = std::string("validation buffer: tensor '") + name + "' cannot be read: " + why;
      return R::kError;
    }
    *out = *c;
  }
  R r = engine.push(*t, samples, embeds.defined() ? &embeds : nullptr, mask.defined() ? &mask : nullptr,
                    condition.defined() ? &condition : nullptr, image.defined() ? &image : nullptr);
  if (r == R::kError) *error = engine.error();
  return r;
}

}  // namespace videotrain
