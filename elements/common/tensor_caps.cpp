#include "tensor_caps.h"

#include <algorithm>
#include <cstring>

namespace {

const gchar *no_tags[] = {nullptr};

gboolean tensor_meta_init(GstMeta *meta, gpointer, GstBuffer *) {
  auto *m = reinterpret_cast<GstVideoTrainTensorMeta *>(meta);
  m->dtype[0] = m->device[0] = m->name[0] = '\0';
  m->ndim = 0;
  m->offset = 0;
  return TRUE;
}

gboolean tensor_meta_transform(GstBuffer *dest, GstMeta *meta, GstBuffer *, GQuark type, gpointer) {
  // Only a whole copy keeps the shape meaningful.
  if (!GST_META_TRANSFORM_IS_COPY(type)) return FALSE;
  auto *s = reinterpret_cast<GstVideoTrainTensorMeta *>(meta);
  if (videotrain::find_tensor_meta(dest, s->name)) return TRUE;
  auto *d = reinterpret_cast<GstVideoTrainTensorMeta *>(
      gst_buffer_add_meta(dest, gst_videotrain_tensor_meta_get_info(), nullptr));
  if (!d) return FALSE;
  std::memcpy(d->dtype, s->dtype, sizeof d->dtype);
  std::memcpy(d->device, s->device, sizeof d->device);
  d->ndim = s->ndim;
  std::memcpy(d->shape, s->shape, sizeof d->shape);
  std::memcpy(d->name, s->name, sizeof d->name);
  d->offset = s->offset;
  return TRUE;
}

}  // namespace

extern "C" {

GType gst_videotrain_tensor_meta_api_get_type(void) {
  static gsize once = 0;
  if (g_once_init_enter(&once)) {
    // Another copy of this code (test binary vs plugin) may have registered it.
    GType t = g_type_from_name("GstVideoTrainTensorMetaAPI");
    if (!t) t = gst_meta_api_type_register("GstVideoTrainTensorMetaAPI", no_tags);
    g_once_init_leave(&once, t);
  }
  return (GType)once;
}

const GstMetaInfo *gst_videotrain_tensor_meta_get_info(void) {
  static gsize once = 0;
  if (g_once_init_enter(&once)) {
    const GstMetaInfo *info = gst_meta_get_info("GstVideoTrainTensorMeta");
    if (!info)
      info = gst_meta_register(GST_VIDEOTRAIN_TENSOR_META_API_TYPE, "GstVideoTrainTensorMeta",
                          sizeof(GstVideoTrainTensorMeta), tensor_meta_init, nullptr, tensor_meta_transform);
    g_once_init_leave(&once, (gsize)info);
  }
  return (const GstMetaInfo *)once;
}

}  // extern "C"

namespace videotrain {

GstVideoTrainTensorMeta *add_tensor_meta(GstBuffer *buffer, const std::string &dtype, const std::string &device,
                                         const std::vector<int64_t> &shape, const std::string &name,
                                         uint64_t offset) {
  if (shape.size() > VIDEOTRAIN_TENSOR_MAX_DIMS) return nullptr;
  auto *m = reinterpret_cast<GstVideoTrainTensorMeta *>(
      gst_buffer_add_meta(buffer, gst_videotrain_tensor_meta_get_info(), nullptr));
  if (!m) return nullptr;
  g_strlcpy(m->dtype, dtype.c_str(), sizeof m->dtype);
  g_strlcpy(m->device, device.c_str(), sizeof m->device);
  m->ndim = static_cast<guint>(shape.size());
  for (size_t i = 0; i < shape.size(); i++) m->shape[i] = shape[i];
  g_strlcpy(m->name, name.c_str(), sizeof m->name);
  m->offset = offset;
  return m;
}

GstVideoTrainTensorMeta *find_tensor_meta(GstBuffer *buffer, const std::string &name) {
  gpointer state = nullptr;
  while (GstMeta *m = gst_buffer_iterate_meta_filtered(buffer, &state, GST_VIDEOTRAIN_TENSOR_META_API_TYPE)) {
    auto *t = reinterpret_cast<GstVideoTrainTensorMeta *>(m);
    if (name == t->name) return t;
  }
  return nullptr;
}

std::vector<std::string> tensor_names(GstBuffer *buffer) {
  std::vector<std::pair<guint64, std::string>> found;
  gpointer state = nullptr;
  while (GstMeta *m = gst_buffer_iterate_meta_filtered(buffer, &state, GST_VIDEOTRAIN_TENSOR_META_API_TYPE)) {
    auto *t = reinterpret_cast<GstVideoTrainTensorMeta *>(m);
    if (t->name[0]) found.emplace_back(t->offset, t->name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto &f : found) out.push_back(f.second);
  return out;
}

std::vector<int64_t> tensor_meta_shape(const GstVideoTrainTensorMeta *meta) {
  return std::vector<int64_t>(meta->shape, meta->shape + meta->ndim);
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
