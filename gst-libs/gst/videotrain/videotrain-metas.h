/* Metas that travel with frames, latents and micro-batches.
 *
 * All are registered with no tags, so that elements which drop tagged metas on transform
 * (videoconvert, videoscale, videoflip, videocrop) keep them. */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

typedef struct _GstVideoTrainClipMeta GstVideoTrainClipMeta;
typedef struct _GstVideoTrainSampleMeta GstVideoTrainSampleMeta;
typedef struct _GstVideoTrainBatchMeta GstVideoTrainBatchMeta;

/**
 * GstVideoTrainClipMeta:
 * @meta: parent #GstMeta
 * @sample_id: manifest row index (after split filtering: the row in the index)
 * @epoch: epoch the clip was drawn in
 * @clip_index: clip index in this rank's epoch
 * @frame_index: frame index within the clip (0 starts a clip)
 * @num_frames: frames in the clip (vaeencoder: 1 + 4n for the Wan VAE)
 * @source_frame: frame number in the source video
 * @padding: the clip repeats a sample to even out the ranks
 * @group: with buckets: the optimizer step's group the clip belongs to, in its epoch
 * @group_size: with buckets: clips in that group (microbatcher ends a step with it); 0: no groups
 * @caption: (nullable): the clip's caption
 * @path: (nullable): the video it comes from
 * @split: (nullable): the manifest split (train, val)
 *
 * One per video frame. csvvideosrc attaches it; an app feeding vaeencoder from appsrc
 * attaches it with gst_buffer_add_videotrain_clip_meta() and sets the numbers.
 */
struct _GstVideoTrainClipMeta {
  GstMeta meta;
  guint64 sample_id;
  guint epoch;
  guint64 clip_index;
  guint frame_index;
  guint num_frames;
  guint64 source_frame;
  gboolean padding;
  gchar *caption;
  gchar *path;
  gchar *split;
  guint64 group;
  guint group_size;
};

/**
 * GstVideoTrainSampleMeta:
 * @meta: parent #GstMeta
 * @sample_id: the clip's sample id
 * @epoch: epoch the clip was drawn in
 * @clip_index: clip index in this rank's epoch
 * @padding: the clip repeats a sample to even out the ranks
 * @caption: (nullable): the clip's caption
 * @path: (nullable): the video it comes from
 * @group: the clip meta's group (buckets)
 * @group_size: the clip meta's group_size; 0: no groups
 *
 * One per latent buffer, from vaeencoder.
 */
struct _GstVideoTrainSampleMeta {
  GstMeta meta;
  guint64 sample_id;
  guint epoch;
  guint64 clip_index;
  gboolean padding;
  gchar *caption;
  gchar *path;
  guint64 group;
  guint group_size;
};

/**
 * GstVideoTrainBatchMeta:
 * @meta: parent #GstMeta
 * @step: optimizer step this micro-batch belongs to
 * @micro_index: index of the micro-batch in the step
 * @micro_count: micro-batches in the step
 * @step_samples: samples in the whole step
 * @sync: last micro-batch of the step (the trainer all-reduces on it)
 * @epoch: data position after this step: epoch ...
 * @next_clip: ... and next clip index of that epoch
 * @sample_ids: (element-type guint64): sample id per sample
 * @captions: (element-type utf8): caption per sample
 * @padding: (element-type gboolean): padding flag per sample
 * @clip_indices: (element-type guint64): clip index per sample, in its epoch on this rank
 * @epochs: (element-type guint): epoch each sample was drawn in
 *
 * One per micro-batch buffer, from microbatcher. The per-sample arrays have one entry per
 * sample of the micro-batch; gst_videotrain_batch_meta_get_n_samples() counts them.
 */
struct _GstVideoTrainBatchMeta {
  GstMeta meta;
  guint64 step;
  guint micro_index;
  guint micro_count;
  guint step_samples;
  gboolean sync;
  guint epoch;
  guint64 next_clip;
  GArray *sample_ids;
  GPtrArray *captions;
  GArray *padding;
  GArray *clip_indices;
  GArray *epochs;
};

GType gst_videotrain_clip_meta_api_get_type(void);
GType gst_videotrain_sample_meta_api_get_type(void);
GType gst_videotrain_batch_meta_api_get_type(void);
const GstMetaInfo *gst_videotrain_clip_meta_get_info(void);
const GstMetaInfo *gst_videotrain_sample_meta_get_info(void);
const GstMetaInfo *gst_videotrain_batch_meta_get_info(void);

#define GST_VIDEOTRAIN_CLIP_META_API_TYPE (gst_videotrain_clip_meta_api_get_type())
#define GST_VIDEOTRAIN_SAMPLE_META_API_TYPE (gst_videotrain_sample_meta_api_get_type())
#define GST_VIDEOTRAIN_BATCH_META_API_TYPE (gst_videotrain_batch_meta_api_get_type())

GstVideoTrainClipMeta *gst_buffer_get_videotrain_clip_meta(GstBuffer *buffer);
GstVideoTrainSampleMeta *gst_buffer_get_videotrain_sample_meta(GstBuffer *buffer);
GstVideoTrainBatchMeta *gst_buffer_get_videotrain_batch_meta(GstBuffer *buffer);

GstVideoTrainClipMeta *gst_buffer_add_videotrain_clip_meta(GstBuffer *buffer, const gchar *caption,
                                                           const gchar *path, const gchar *split);
GstVideoTrainSampleMeta *gst_buffer_add_videotrain_sample_meta(GstBuffer *buffer, const gchar *caption,
                                                               const gchar *path);
GstVideoTrainSampleMeta *gst_buffer_add_videotrain_sample_meta_from_clip(GstBuffer *buffer,
                                                                         const GstVideoTrainClipMeta *clip);
GstVideoTrainBatchMeta *gst_buffer_add_videotrain_batch_meta(GstBuffer *buffer);

void gst_videotrain_batch_meta_append(GstVideoTrainBatchMeta *meta, guint64 sample_id, guint epoch,
                                      guint64 clip_index, const gchar *caption, gboolean padding);
guint gst_videotrain_batch_meta_get_n_samples(const GstVideoTrainBatchMeta *meta);
gboolean gst_videotrain_batch_meta_get_sample(const GstVideoTrainBatchMeta *meta, guint index, guint64 *sample_id,
                                              guint *epoch, guint64 *clip_index, const gchar **caption,
                                              gboolean *padding);

G_END_DECLS
