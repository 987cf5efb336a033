/* Caps and per-buffer shape of tensor streams (latents, micro-batches). The tensor meta is the
 * public library's (gst-libs/gst/videotrain); these are C++ conveniences over it. No torch here. */
#pragma once

#include <gst/gst.h>
#include <gst/videotrain/videotrain-tensor-meta.h>

#include <cstdint>
#include <string>
#include <vector>

#define VIDEOTRAIN_TENSOR_MEDIA_TYPE GST_VIDEOTRAIN_TENSOR_MEDIA_TYPE
#define VIDEOTRAIN_TENSOR_MAX_DIMS GST_VIDEOTRAIN_TENSOR_MAX_DIMS

namespace videotrain {

GstVideoTrainTensorMeta *add_tensor_meta(GstBuffer *buffer, const std::string &dtype, const std::string &device,
                                         const std::vector<int64_t> &shape, const std::string &name = "",
                                         uint64_t offset = 0);
// The meta of the tensor called `name` ("" for the main one); null when there is none.
GstVideoTrainTensorMeta *find_tensor_meta(GstBuffer *buffer, const std::string &name);
// Names of the named tensors after the main one, in buffer order.
std::vector<std::string> tensor_names(GstBuffer *buffer);
std::vector<int64_t> tensor_meta_shape(const GstVideoTrainTensorMeta *meta);

struct TensorCapsInfo {
  std::string content;  // latents | micro-batch
  std::string dtype;    // float32 | bfloat16 | float16
  std::string device;   // cpu | cuda:N
  std::string tensors;  // named tensors after the main one, comma-separated ("text_embeds,text_mask"); "" = none
};

bool is_known_content(const std::string &content);
bool is_known_dtype(const std::string &dtype);
// Fixed caps for one stream.
GstCaps *tensor_caps_new(const TensorCapsInfo &info);
// Template caps: any dtype/device; content restricted when given (else both kinds).
GstCaps *tensor_caps_template(const char *content = nullptr);
// Parses fixed caps; false (with a reason) when a field is missing or unknown.
bool tensor_caps_parse(const GstCaps *caps, TensorCapsInfo *out, std::string *why);

}  // namespace videotrain
