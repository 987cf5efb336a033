/* Caps and per-buffer shape of tensor streams (latents, micro-batches). No torch here. */
#pragma once

#include <gst/gst.h>

#include <cstdint>
#include <string>
#include <vector>

#define VIDEOTRAIN_TENSOR_MEDIA_TYPE "application/x-videotrain-tensor"
#define VIDEOTRAIN_TENSOR_MAX_DIMS 8

G_BEGIN_DECLS

/* Shape and dtype of a tensor a buffer holds, so that the shape survives elements that copy
 * memory (the buffer's memory may then be plain system memory). A buffer holds its main tensor
 * (latents, micro-batch; name "") first, and may hold named ones after it (text_embeds,
 * text_mask): one memory and one meta each, the meta giving the tensor's byte offset. */
typedef struct {
  GstMeta meta;
  gchar dtype[16];
  gchar device[24];
  guint ndim;
  gint64 shape[VIDEOTRAIN_TENSOR_MAX_DIMS];
  gchar name[32];  // "" for the main tensor
  guint64 offset;  // bytes from the start of the buffer
} GstVideoTrainTensorMeta;

GType gst_videotrain_tensor_meta_api_get_type(void);
const GstMetaInfo *gst_videotrain_tensor_meta_get_info(void);
#define GST_VIDEOTRAIN_TENSOR_META_API_TYPE (gst_videotrain_tensor_meta_api_get_type())
#define gst_buffer_get_videotrain_tensor_meta(b) \
  ((GstVideoTrainTensorMeta *)gst_buffer_get_meta((b), GST_VIDEOTRAIN_TENSOR_META_API_TYPE))

G_END_DECLS

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
