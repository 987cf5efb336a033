#include "tensor_caps.h"

namespace videotrain {

GstVideoTrainTensorMeta *add_tensor_meta(GstBuffer *buffer, const std::string &dtype, const std::string &device,
                                         const std::vector<int64_t> &shape, const std::string &name,
                                         uint64_t offset) {
  return gst_buffer_add_videotrain_tensor_meta(buffer, dtype.c_str(), device.c_str(), static_cast<guint>(shape.size()),
                                               reinterpret_cast<const gint64 *>(shape.data()), name.c_str(), offset);
}

GstVideoTrainTensorMeta *find_tensor_meta(GstBuffer *buffer, const std::string &name) {
  return gst_buffer_get_videotrain_tensor_meta_by_name(buffer, name.c_str());
}

std::vector<std::string> tensor_names(GstBuffer *buffer) {
  gchar **names = gst_buffer_get_videotrain_tensor_names(buffer);
  std::vector<std::string> out;
  for (gchar **n = names; *n; n++) out.emplace_back(*n);
  g_strfreev(names);
  return out;
}

std::vector<int64_t> tensor_meta_shape(const GstVideoTrainTensorMeta *meta) {
  return std::vector<int64_t>(meta->dims, meta->dims + meta->ndim);
}

bool is_known_content(const std::string &c) { return c == "latents" || c == "micro-batch"; }

bool is_known_dtype(const std::string &d) { return d == "float32" || d == "bfloat16" || d == "float16"; }

GstCaps *tensor_caps_new(const TensorCapsInfo &info) {
  GstCaps *caps = gst_caps_new_simple(VIDEOTRAIN_TENSOR_MEDIA_TYPE, "content", G_TYPE_STRING, info.content.c_str(),
                                      "dtype", G_TYPE_STRING, info.dtype.c_str(), "device", G_TYPE_STRING,
                                      info.device.c_str(), nullptr);
  if (!info.tensors.empty()) gst_caps_set_simple(caps, "tensors", G_TYPE_STRING, info.tensors.c_str(), nullptr);
  return caps;
}

GstCaps *tensor_caps_template(const char *content) {
  std::string s = std::string(VIDEOTRAIN_TENSOR_MEDIA_TYPE) + ", content=(string)" +
                  (content ? std::string(content) : std::string("{ latents, micro-batch }")) +
                  ", dtype=(string){ float32, bfloat16, float16 }, device=(string)ANY";
  GstCaps *caps = gst_caps_from_string(s.c_str());
  // "ANY" is not a string set; drop the field so that any device matches.
  for (guint i = 0; i < gst_caps_get_size(caps); i++)
    gst_structure_remove_field(gst_caps_get_structure(caps, i), "device");
  return caps;
}

bool tensor_caps_parse(const GstCaps *caps, TensorCapsInfo *out, std::string *why) {
  if (!caps || gst_caps_get_size(caps) != 1) {
    if (why) *why = "caps are empty or not fixed";
    return false;
  }
  const GstStructure *s = gst_caps_get_structure(caps, 0);
  if (!gst_structure_has_name(s, VIDEOTRAIN_TENSOR_MEDIA_TYPE)) {
    if (why) *why = std::string("media type is ") + gst_structure_get_name(s) + ", expected " +
                    VIDEOTRAIN_TENSOR_MEDIA_TYPE;
    return false;
  }
  const char *c = gst_structure_get_string(s, "content");
  const char *d = gst_structure_get_string(s, "dtype");
  const char *dev = gst_structure_get_string(s, "device");
  if (!c || !is_known_content(c)) {
    if (why) *why = std::string("content is '") + (c ? c : "(none)") + "', expected latents or micro-batch";
    return false;
  }
  if (!d || !is_known_dtype(d)) {
    if (why) *why = std::string("dtype is '") + (d ? d : "(none)") + "', expected float32, bfloat16 or float16";
    return false;
  }
  out->content = c;
  out->dtype = d;
  out->device = dev ? dev : "cpu";
  const char *t = gst_structure_get_string(s, "tensors");
  out->tensors = t ? t : "";
  return true;
}

}  // namespace videotrain
