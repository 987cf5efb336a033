#include "metas.h"

#include <cstring>

namespace {

const gchar *no_tags[] = {nullptr};

/* Registers an API type once; thread-safe through g_once. */
GType register_api(const char *name, gsize *once) {
  if (g_once_init_enter(once)) {
    // A test binary and the plugin it loads each hold a copy of this code: reuse
    // the type when the other copy registered it first.
    GType t = g_type_from_name(name);
    if (!t) t = gst_meta_api_type_register(name, no_tags);
    g_once_init_leave(once, t);
  }
  return (GType)*once;
}

/* ---- clip meta ---- */

gboolean clip_init(GstMeta *meta, gpointer, GstBuffer *) {
  auto *m = reinterpret_cast<GstVideoTrainClipMeta *>(meta);
  m->sample_id = 0;
  m->epoch = 0;
  m->clip_index = 0;
  m->frame_index = 0;
  m->num_frames = 0;
  m->source_frame = 0;
  m->padding = FALSE;
  m->caption = m->path = m->split = nullptr;
  return TRUE;
}

void clip_free(GstMeta *meta, GstBuffer *) {
  auto *m = reinterpret_cast<GstVideoTrainClipMeta *>(meta);
  g_free(m->caption);
  g_free(m->path);
  g_free(m->split);
}

/* Kept on every transform (copy, scale, crop, flip): the clip identity does not
 * depend on pixels. */
gboolean clip_transform(GstBuffer *dest, GstMeta *meta, GstBuffer *, GQuark, gpointer) {
  auto *s = reinterpret_cast<GstVideoTrainClipMeta *>(meta);
  if (gst_buffer_get_videotrain_clip_meta(dest)) return TRUE;
  auto *d = gst_buffer_add_videotrain_clip_meta(dest, s->caption, s->path, s->split);
  if (!d) return FALSE;
  d->sample_id = s->sample_id;
  d->epoch = s->epoch;
  d->clip_index = s->clip_index;
  d->frame_index = s->frame_index;
  d->num_frames = s->num_frames;
  d->source_frame = s->source_frame;
  d->padding = s->padding;
  return TRUE;
}

/* ---- sample meta ---- */

gboolean sample_init(GstMeta *meta, gpointer, GstBuffer *) {
  auto *m = reinterpret_cast<GstVideoTrainSampleMeta *>(meta);
  m->sample_id = 0;
  m->epoch = 0;
  m->clip_index = 0;
  m->padding = FALSE;
  m->caption = m->path = nullptr;
  return TRUE;
}

void sample_free(GstMeta *meta, GstBuffer *) {
  auto *m = reinterpret_cast<GstVideoTrainSampleMeta *>(meta);
  g_free(m->caption);
  g_free(m->path);
}

gboolean sample_transform(GstBuffer *dest, GstMeta *meta, GstBuffer *, GQuark, gpointer) {
  auto *s = reinterpret_cast<GstVideoTrainSampleMeta *>(meta);
  if (gst_buffer_get_videotrain_sample_meta(dest)) return TRUE;
  auto *d = gst_buffer_add_videotrain_sample_meta(dest, s->caption, s->path);
  if (!d) return FALSE;
  d->sample_id = s->sample_id;
  d->epoch = s->epoch;
  d->clip_index = s->clip_index;
  d->padding = s->padding;
  return TRUE;
}

/* ---- batch meta ---- */

gboolean batch_init(GstMeta *meta, gpointer, GstBuffer *) {
  auto *m = reinterpret_cast<GstVideoTrainBatchMeta *>(meta);
  m->step = 0;
  m->micro_index = 0;
  m->micro_count = 0;
  m->step_samples = 0;
  m->sync = FALSE;
  m->epoch = 0;
  m->next_clip = 0;
  m->sample_ids = g_array_new(FALSE, FALSE, sizeof(guint64));
  m->captions = g_ptr_array_new_with_free_func(g_free);
  m->padding = g_array_new(FALSE, FALSE, sizeof(gboolean));
  m->clip_indices = g_array_new(FALSE, FALSE, sizeof(guint64));
  m->epochs = g_array_new(FALSE, FALSE, sizeof(guint));
  return TRUE;
}

void batch_free(GstMeta *meta, GstBuffer *) {
  auto *m = reinterpret_cast<GstVideoTrainBatchMeta *>(meta);
  g_array_unref(m->sample_ids);
  g_ptr_array_unref(m->captions);
  g_array_unref(m->padding);
  g_array_unref(m->clip_indices);
  g_array_unref(m->epochs);
}

gboolean batch_transform(GstBuffer *dest, GstMeta *meta, GstBuffer *, GQuark, gpointer) {
  auto *s = reinterpret_cast<GstVideoTrainBatchMeta *>(meta);
  if (gst_buffer_get_videotrain_batch_meta(dest)) return TRUE;
  auto *d = gst_buffer_add_videotrain_batch_meta(dest);
  if (!d) return FALSE;
  d->step = s->step;
  d->micro_index = s->micro_index;
  d->micro_count = s->micro_count;
  d->step_samples = s->step_samples;
  d->sync = s->sync;
  d->epoch = s->epoch;
  d->next_clip = s->next_clip;
  for (guint i = 0; i < s->sample_ids->len; i++)
    gst_videotrain_batch_meta_append(d, g_array_index(s->sample_ids, guint64, i), g_array_index(s->epochs, guint, i),
                                     g_array_index(s->clip_indices, guint64, i),
                                     (const char *)g_ptr_array_index(s->captions, i),
                                     g_array_index(s->padding, gboolean, i));
  return TRUE;
}

const GstMetaInfo *register_impl(GType api, const char *impl, gsize size, GstMetaInitFunction init,
                                 GstMetaFreeFunction fr, GstMetaTransformFunction tr, gsize *once) {
  if (g_once_init_enter(once)) {
    const GstMetaInfo *info = gst_meta_get_info(impl);  // registered by another copy?
    if (!info) info = gst_meta_register(api, impl, size, init, fr, tr);
    g_once_init_leave(once, (gsize)info);
  }
  return (const GstMetaInfo *)*once;
}

}  // namespace

extern "C" {

GType gst_videotrain_clip_meta_api_get_type(void) {
  static gsize once = 0;
  return register_api("GstVideoTrainClipMetaAPI", &once);
}

GType gst_videotrain_sample_meta_api_get_type(void) {
  static gsize once = 0;
  return register_api("GstVideoTrainSampleMetaAPI", &once);
}

GType gst_videotrain_batch_meta_api_get_type(void) {
  static gsize once = 0;
  return register_api("GstVideoTrainBatchMetaAPI", &once);
}

const GstMetaInfo *gst_videotrain_clip_meta_get_info(void) {
  static gsize once = 0;
  return register_impl(GST_VIDEOTRAIN_CLIP_META_API_TYPE, "GstVideoTrainClipMeta",
                       sizeof(GstVideoTrainClipMeta), clip_init, clip_free, clip_transform, &once);
}

const GstMetaInfo *gst_videotrain_sample_meta_get_info(void) {
  static gsize once = 0;
  return register_impl(GST_VIDEOTRAIN_SAMPLE_META_API_TYPE, "GstVideoTrainSampleMeta",
                       sizeof(GstVideoTrainSampleMeta), sample_init, sample_free, sample_transform, &once);
}

const GstMetaInfo *gst_videotrain_batch_meta_get_info(void) {
  static gsize once = 0;
  return register_impl(GST_VIDEOTRAIN_BATCH_META_API_TYPE, "GstVideoTrainBatchMeta",
                       sizeof(GstVideoTrainBatchMeta), batch_init, batch_free, batch_transform, &once);
}

GstVideoTrainClipMeta *gst_buffer_add_videotrain_clip_meta(GstBuffer *buffer, const char *caption,
                                                           const char *path, const char *split) {
  auto *m = reinterpret_cast<GstVideoTrainClipMeta *>(
      gst_buffer_add_meta(buffer, gst_videotrain_clip_meta_get_info(), nullptr));
  if (!m) return nullptr;
  m->caption = g_strdup(caption);
  m->path = g_strdup(path);
  m->split = g_strdup(split);
  return m;
}

GstVideoTrainSampleMeta *gst_buffer_add_videotrain_sample_meta(GstBuffer *buffer, const char *caption,
                                                               const char *path) {
  auto *m = reinterpret_cast<GstVideoTrainSampleMeta *>(
      gst_buffer_add_meta(buffer, gst_videotrain_sample_meta_get_info(), nullptr));
  if (!m) return nullptr;
  m->caption = g_strdup(caption);
  m->path = g_strdup(path);
  return m;
}

GstVideoTrainBatchMeta *gst_buffer_add_videotrain_batch_meta(GstBuffer *buffer) {
  return reinterpret_cast<GstVideoTrainBatchMeta *>(
      gst_buffer_add_meta(buffer, gst_videotrain_batch_meta_get_info(), nullptr));
}

void gst_videotrain_batch_meta_append(GstVideoTrainBatchMeta *meta, guint64 sample_id, guint epoch,
                                      guint64 clip_index, const char *caption, gboolean padding) {
  g_array_append_val(meta->sample_ids, sample_id);
  g_array_append_val(meta->epochs, epoch);
  g_array_append_val(meta->clip_indices, clip_index);
  g_ptr_array_add(meta->captions, g_strdup(caption ? caption : ""));
  g_array_append_val(meta->padding, padding);
}

GstVideoTrainSampleMeta *gst_buffer_add_videotrain_sample_meta_from_clip(GstBuffer *buffer,
                                                                         const GstVideoTrainClipMeta *clip) {
  auto *m = gst_buffer_add_videotrain_sample_meta(buffer, clip->caption, clip->path);
  if (!m) return nullptr;
  m->sample_id = clip->sample_id;
  m->epoch = clip->epoch;
  m->clip_index = clip->clip_index;
  m->padding = clip->padding;
  return m;
}

}  // extern "C"

namespace videotrain {

bool read_batch_meta(GstBuffer *buffer, BatchInfo *out) {
  const GstVideoTrainBatchMeta *m = gst_buffer_get_videotrain_batch_meta(buffer);
  if (!m) return false;
  BatchInfo b;
  b.step = m->step;
  b.micro_index = m->micro_index;
  b.micro_count = m->micro_count;
  b.step_samples = m->step_samples;
  b.sync = m->sync;
  b.epoch = m->epoch;
  b.next_clip = m->next_clip;
  const guint n = m->sample_ids->len;
  for (guint i = 0; i < n; i++) {
    b.sample_ids.push_back(g_array_index(m->sample_ids, guint64, i));
    const auto *caption = static_cast<const char *>(g_ptr_array_index(m->captions, i));
    b.captions.emplace_back(caption ? caption : "");
    b.padding.push_back(g_array_index(m->padding, gboolean, i));
    b.clip_indices.push_back(g_array_index(m->clip_indices, guint64, i));
    b.epochs.push_back(g_array_index(m->epochs, guint, i));
  }
  *out = std::move(b);
  return true;
}

bool read_sample_meta(GstBuffer *buffer, SampleInfo *out) {
  const GstVideoTrainSampleMeta *m = gst_buffer_get_videotrain_sample_meta(buffer);
  if (!m) return false;
  out->sample_id = m->sample_id;
  out->epoch = m->epoch;
  out->clip_index = m->clip_index;
  out->padding = m->padding;
  out->caption = m->caption ? m->caption : "";
  out->path = m->path ? m->path : "";
  return true;
}

GstVideoTrainBatchMeta *write_batch_meta(GstBuffer *buffer, const BatchInfo &info) {
  GstVideoTrainBatchMeta *m = gst_buffer_add_videotrain_batch_meta(buffer);
  if (!m) return nullptr;
  m->step = info.step;
  m->micro_index = info.micro_index;
  m->micro_count = info.micro_count;
  m->step_samples = info.step_samples;
  m->sync = info.sync;
  m->epoch = info.epoch;
  m->next_clip = info.next_clip;
  for (size_t i = 0; i < info.sample_ids.size(); i++) {
    const auto at = [&](const auto &v, auto fallback) { return i < v.size() ? v[i] : fallback; };
    gst_videotrain_batch_meta_append(m, info.sample_ids[i], at(info.epochs, info.epoch), at(info.clip_indices, uint64_t{0}),
                                     i < info.captions.size() ? info.captions[i].c_str() : "", at(info.padding, false));
  }
  return m;
}

}  // namespace videotrain
