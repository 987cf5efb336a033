#include "videotrain-metas.h"

static const gchar *no_tags[] = {NULL};

/* ---- clip meta ---- */

static gboolean clip_init(GstMeta *meta, gpointer params, GstBuffer *buffer) {
  GstVideoTrainClipMeta *m = (GstVideoTrainClipMeta *)meta;
  (void)params;
  (void)buffer;
  m->sample_id = 0;
  m->epoch = 0;
  m->clip_index = 0;
  m->frame_index = 0;
  m->num_frames = 0;
  m->source_frame = 0;
  m->padding = FALSE;
  m->group = 0;
  m->group_size = 0;
  m->caption = m->path = m->split = NULL;
  return TRUE;
}

static void clip_free(GstMeta *meta, GstBuffer *buffer) {
  GstVideoTrainClipMeta *m = (GstVideoTrainClipMeta *)meta;
  (void)buffer;
  g_free(m->caption);
  g_free(m->path);
  g_free(m->split);
}

/* Kept on every transform (copy, scale, crop, flip): the clip identity does not depend on pixels. */
static gboolean clip_transform(GstBuffer *dest, GstMeta *meta, GstBuffer *buffer, GQuark type, gpointer data) {
  GstVideoTrainClipMeta *s = (GstVideoTrainClipMeta *)meta, *d;
  (void)buffer;
  (void)type;
  (void)data;
  if (gst_buffer_get_videotrain_clip_meta(dest)) return TRUE;
  d = gst_buffer_add_videotrain_clip_meta(dest, s->caption, s->path, s->split);
  if (!d) return FALSE;
  d->sample_id = s->sample_id;
  d->epoch = s->epoch;
  d->clip_index = s->clip_index;
  d->frame_index = s->frame_index;
  d->num_frames = s->num_frames;
  d->source_frame = s->source_frame;
  d->padding = s->padding;
  d->group = s->group;
  d->group_size = s->group_size;
  return TRUE;
}

/* ---- sample meta ---- */

static gboolean sample_init(GstMeta *meta, gpointer params, GstBuffer *buffer) {
  GstVideoTrainSampleMeta *m = (GstVideoTrainSampleMeta *)meta;
  (void)params;
  (void)buffer;
  m->sample_id = 0;
  m->epoch = 0;
  m->clip_index = 0;
  m->padding = FALSE;
  m->group = 0;
  m->group_size = 0;
  m->caption = m->path = NULL;
  return TRUE;
}

static void sample_free(GstMeta *meta, GstBuffer *buffer) {
  GstVideoTrainSampleMeta *m = (GstVideoTrainSampleMeta *)meta;
  (void)buffer;
  g_free(m->caption);
  g_free(m->path);
}

static gboolean sample_transform(GstBuffer *dest, GstMeta *meta, GstBuffer *buffer, GQuark type, gpointer data) {
  GstVideoTrainSampleMeta *s = (GstVideoTrainSampleMeta *)meta, *d;
  (void)buffer;
  (void)type;
  (void)data;
  if (gst_buffer_get_videotrain_sample_meta(dest)) return TRUE;
  d = gst_buffer_add_videotrain_sample_meta(dest, s->caption, s->path);
  if (!d) return FALSE;
  d->sample_id = s->sample_id;
  d->epoch = s->epoch;
  d->clip_index = s->clip_index;
  d->padding = s->padding;
  d->group = s->group;
  d->group_size = s->group_size;
  return TRUE;
}

/* ---- batch meta ---- */

static gboolean batch_init(GstMeta *meta, gpointer params, GstBuffer *buffer) {
  GstVideoTrainBatchMeta *m = (GstVideoTrainBatchMeta *)meta;
  (void)params;
  (void)buffer;
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

static void batch_free(GstMeta *meta, GstBuffer *buffer) {
  GstVideoTrainBatchMeta *m = (GstVideoTrainBatchMeta *)meta;
  (void)buffer;
  g_array_unref(m->sample_ids);
  g_ptr_array_unref(m->captions);
  g_array_unref(m->padding);
  g_array_unref(m->clip_indices);
  g_array_unref(m->epochs);
}

static gboolean batch_transform(GstBuffer *dest, GstMeta *meta, GstBuffer *buffer, GQuark type, gpointer data) {
  GstVideoTrainBatchMeta *s = (GstVideoTrainBatchMeta *)meta, *d;
  guint i;
  (void)buffer;
  (void)type;
  (void)data;
  if (gst_buffer_get_videotrain_batch_meta(dest)) return TRUE;
  d = gst_buffer_add_videotrain_batch_meta(dest);
  if (!d) return FALSE;
  d->step = s->step;
  d->micro_index = s->micro_index;
  d->micro_count = s->micro_count;
  d->step_samples = s->step_samples;
  d->sync = s->sync;
  d->epoch = s->epoch;
  d->next_clip = s->next_clip;
  for (i = 0; i < s->sample_ids->len; i++)
    gst_videotrain_batch_meta_append(d, g_array_index(s->sample_ids, guint64, i), g_array_index(s->epochs, guint, i),
                                     g_array_index(s->clip_indices, guint64, i),
                                     (const gchar *)g_ptr_array_index(s->captions, i),
                                     g_array_index(s->padding, gboolean, i));
  return TRUE;
}

/* ---- registration ---- */

GType gst_videotrain_clip_meta_api_get_type(void) {
  static GType type = 0;
  if (g_once_init_enter(&type)) g_once_init_leave(&type, gst_meta_api_type_register("GstVideoTrainClipMetaAPI", no_tags));
  return type;
}

GType gst_videotrain_sample_meta_api_get_type(void) {
  static GType type = 0;
  if (g_once_init_enter(&type))
    g_once_init_leave(&type, gst_meta_api_type_register("GstVideoTrainSampleMetaAPI", no_tags));
  return type;
}

GType gst_videotrain_batch_meta_api_get_type(void) {
  static GType type = 0;
  if (g_once_init_enter(&type))
    g_once_init_leave(&type, gst_meta_api_type_register("GstVideoTrainBatchMetaAPI", no_tags));
  return type;
}

/**
 * gst_videotrain_clip_meta_get_info:
 *
 * Returns: (transfer none): the clip meta's implementation
 */
const GstMetaInfo *gst_videotrain_clip_meta_get_info(void) {
  static gsize info = 0;
  if (g_once_init_enter(&info))
    g_once_init_leave(&info, (gsize)gst_meta_register(GST_VIDEOTRAIN_CLIP_META_API_TYPE, "GstVideoTrainClipMeta",
                                                       sizeof(GstVideoTrainClipMeta), clip_init, clip_free,
                                                       clip_transform));
  return (const GstMetaInfo *)info;
}

/**
 * gst_videotrain_sample_meta_get_info:
 *
 * Returns: (transfer none): the sample meta's implementation
 */
const GstMetaInfo *gst_videotrain_sample_meta_get_info(void) {
  static gsize info = 0;
  if (g_once_init_enter(&info))
    g_once_init_leave(&info, (gsize)gst_meta_register(GST_VIDEOTRAIN_SAMPLE_META_API_TYPE, "GstVideoTrainSampleMeta",
                                                       sizeof(GstVideoTrainSampleMeta), sample_init, sample_free,
                                                       sample_transform));
  return (const GstMetaInfo *)info;
}

/**
 * gst_videotrain_batch_meta_get_info:
 *
 * Returns: (transfer none): the batch meta's implementation
 */
const GstMetaInfo *gst_videotrain_batch_meta_get_info(void) {
  static gsize info = 0;
  if (g_once_init_enter(&info))
    g_once_init_leave(&info, (gsize)gst_meta_register(GST_VIDEOTRAIN_BATCH_META_API_TYPE, "GstVideoTrainBatchMeta",
                                                       sizeof(GstVideoTrainBatchMeta), batch_init, batch_free,
                                                       batch_transform));
  return (const GstMetaInfo *)info;
}

/* ---- getters ---- */

/**
 * gst_buffer_get_videotrain_clip_meta:
 * @buffer: a #GstBuffer
 *
 * Returns: (transfer none) (nullable): the buffer's clip meta, or %NULL when it has none
 */
GstVideoTrainClipMeta *gst_buffer_get_videotrain_clip_meta(GstBuffer *buffer) {
  return (GstVideoTrainClipMeta *)gst_buffer_get_meta(buffer, GST_VIDEOTRAIN_CLIP_META_API_TYPE);
}

/**
 * gst_buffer_get_videotrain_sample_meta:
 * @buffer: a #GstBuffer
 *
 * Returns: (transfer none) (nullable): the buffer's sample meta, or %NULL when it has none
 */
GstVideoTrainSampleMeta *gst_buffer_get_videotrain_sample_meta(GstBuffer *buffer) {
  return (GstVideoTrainSampleMeta *)gst_buffer_get_meta(buffer, GST_VIDEOTRAIN_SAMPLE_META_API_TYPE);
}

/**
 * gst_buffer_get_videotrain_batch_meta:
 * @buffer: a #GstBuffer
 *
 * Returns: (transfer none) (nullable): the buffer's batch meta, or %NULL when it has none
 */
GstVideoTrainBatchMeta *gst_buffer_get_videotrain_batch_meta(GstBuffer *buffer) {
  return (GstVideoTrainBatchMeta *)gst_buffer_get_meta(buffer, GST_VIDEOTRAIN_BATCH_META_API_TYPE);
}

/* ---- adders ---- */

/**
 * gst_buffer_add_videotrain_clip_meta:
 * @buffer: a writable #GstBuffer
 * @caption: (nullable): the clip's caption (copied)
 * @path: (nullable): the video it comes from (copied)
 * @split: (nullable): the manifest split (copied)
 *
 * Attaches a clip meta whose numbers are 0; set sample_id, frame_index and num_frames
 * (and epoch, clip_index) on the result.
 *
 * Returns: (transfer none) (nullable): the new meta
 */
GstVideoTrainClipMeta *gst_buffer_add_videotrain_clip_meta(GstBuffer *buffer, const gchar *caption,
                                                           const gchar *path, const gchar *split) {
  GstVideoTrainClipMeta *m =
      (GstVideoTrainClipMeta *)gst_buffer_add_meta(buffer, gst_videotrain_clip_meta_get_info(), NULL);
  if (!m) return NULL;
  m->caption = g_strdup(caption);
  m->path = g_strdup(path);
  m->split = g_strdup(split);
  return m;
}

/**
 * gst_buffer_add_videotrain_sample_meta:
 * @buffer: a writable #GstBuffer
 * @caption: (nullable): the clip's caption (copied)
 * @path: (nullable): the video it comes from (copied)
 *
 * Returns: (transfer none) (nullable): the new meta
 */
GstVideoTrainSampleMeta *gst_buffer_add_videotrain_sample_meta(GstBuffer *buffer, const gchar *caption,
                                                               const gchar *path) {
  GstVideoTrainSampleMeta *m =
      (GstVideoTrainSampleMeta *)gst_buffer_add_meta(buffer, gst_videotrain_sample_meta_get_info(), NULL);
  if (!m) return NULL;
  m->caption = g_strdup(caption);
  m->path = g_strdup(path);
  return m;
}

/**
 * gst_buffer_add_videotrain_sample_meta_from_clip:
 * @buffer: a writable #GstBuffer
 * @clip: the clip meta of the clip's first frame
 *
 * Returns: (transfer none) (nullable): a sample meta filled from @clip
 */
GstVideoTrainSampleMeta *gst_buffer_add_videotrain_sample_meta_from_clip(GstBuffer *buffer,
                                                                         const GstVideoTrainClipMeta *clip) {
  GstVideoTrainSampleMeta *m = gst_buffer_add_videotrain_sample_meta(buffer, clip->caption, clip->path);
  if (!m) return NULL;
  m->sample_id = clip->sample_id;
  m->epoch = clip->epoch;
  m->clip_index = clip->clip_index;
  m->padding = clip->padding;
  m->group = clip->group;
  m->group_size = clip->group_size;
  return m;
}

/**
 * gst_buffer_add_videotrain_batch_meta:
 * @buffer: a writable #GstBuffer
 *
 * The per-sample arrays start empty; gst_videotrain_batch_meta_append() adds a sample.
 *
 * Returns: (transfer none) (nullable): the new meta
 */
GstVideoTrainBatchMeta *gst_buffer_add_videotrain_batch_meta(GstBuffer *buffer) {
  return (GstVideoTrainBatchMeta *)gst_buffer_add_meta(buffer, gst_videotrain_batch_meta_get_info(), NULL);
}

/**
 * gst_videotrain_batch_meta_append:
 * @meta: a batch meta
 * @sample_id: the sample's id
 * @epoch: the epoch it was drawn in
 * @clip_index: its clip index in that epoch on this rank
 * @caption: (nullable): its caption (copied; %NULL is stored as "")
 * @padding: whether it repeats a sample to even out the ranks
 */
void gst_videotrain_batch_meta_append(GstVideoTrainBatchMeta *meta, guint64 sample_id, guint epoch,
                                      guint64 clip_index, const gchar *caption, gboolean padding) {
  g_array_append_val(meta->sample_ids, sample_id);
  g_array_append_val(meta->epochs, epoch);
  g_array_append_val(meta->clip_indices, clip_index);
  g_ptr_array_add(meta->captions, g_strdup(caption ? caption : ""));
  g_array_append_val(meta->padding, padding);
}

/**
 * gst_videotrain_batch_meta_get_n_samples:
 * @meta: a batch meta
 *
 * Returns: the number of samples in the micro-batch
 */
guint gst_videotrain_batch_meta_get_n_samples(const GstVideoTrainBatchMeta *meta) {
  return meta->sample_ids->len;
}

/**
 * gst_videotrain_batch_meta_get_sample:
 * @meta: a batch meta
 * @index: the sample's position in the micro-batch
 * @sample_id: (out) (optional): its sample id
 * @epoch: (out) (optional): the epoch it was drawn in
 * @clip_index: (out) (optional): its clip index
 * @caption: (out) (optional) (transfer none): its caption
 * @padding: (out) (optional): whether it is padding
 *
 * Returns: %FALSE when @index is past the last sample
 */
gboolean gst_videotrain_batch_meta_get_sample(const GstVideoTrainBatchMeta *meta, guint index, guint64 *sample_id,
                                              guint *epoch, guint64 *clip_index, const gchar **caption,
                                              gboolean *padding) {
  if (index >= meta->sample_ids->len) return FALSE;
  if (sample_id) *sample_id = g_array_index(meta->sample_ids, guint64, index);
  if (epoch) *epoch = g_array_index(meta->epochs, guint, index);
  if (clip_index) *clip_index = g_array_index(meta->clip_indices, guint64, index);
  if (caption) *caption = (const gchar *)g_ptr_array_index(meta->captions, index);
  if (padding) *padding = g_array_index(meta->padding, gboolean, index);
  return TRUE;
}
