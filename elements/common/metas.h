/* Metas that travel with frames, latents and micro-batches.
 *
 * All three are registered with no tags, so that elements which drop tagged
 * metas on transform (videoconvert, videoscale, videoflip, videocrop) keep them.
 * This header is plain C-compatible GStreamer: no torch. */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS
/* csvvideosrc's end of an epoch: its bus message and the serialized custom downstream
 * event that follows the epoch's last frame (fields epoch, clips, replaced). */
#define GST_VIDEOTRAIN_EPOCH_EVENT "csvvideosrc-epoch"
/* The longest clip a clip meta may announce (csvvideosrc num-frames' maximum); vaeencoder
 * keeps a slot per frame, so it refuses longer ones before allocating. */
#define GST_VIDEOTRAIN_MAX_CLIP_FRAMES 100000

/* One per frame, from csvvideosrc. */
typedef struct {
  GstMeta meta;
  guint64 sample_id;    /* manifest row index (after split filtering: row in the index) */
  guint epoch;
  guint64 clip_index;   /* clip index in this rank's epoch */
  guint frame_index;    /* frame index within the clip */
  guint num_frames;     /* frames in the clip */
  guint64 source_frame; /* frame number in the source video */
  gboolean padding;     /* clip repeats a sample to even out the ranks */
  gchar *caption;
  gchar *path;
  gchar *split;
} GstVideoTrainClipMeta;

/* One per latent buffer, from vaeencoder. */
typedef struct {
  GstMeta meta;
  guint64 sample_id;
  guint epoch;
  guint64 clip_index;
  gboolean padding;
  gchar *caption;
  gchar *path;
} GstVideoTrainSampleMeta;

/* One per micro-batch buffer, from microbatcher. */
typedef struct {
  GstMeta meta;
  guint64 step;          /* optimizer step this micro-batch belongs to */
  guint micro_index;     /* index of the micro-batch in the step */
  guint micro_count;     /* micro-batches in the step */
  guint step_samples;    /* samples in the whole step */
  gboolean sync;         /* last micro-batch of the step: all-reduce on it */
  guint epoch;           /* data position after this step: epoch ... */
  guint64 next_clip;     /* ... and next clip index of that epoch */
  GArray *sample_ids;    /* guint64 */
  GPtrArray *captions;   /* gchar*, owned */
  GArray *padding;       /* gboolean per sample */
  GArray *clip_indices;  /* guint64 per sample: its clip index in its epoch on this rank */
  GArray *epochs;        /* guint per sample: the epoch it was drawn in */
} GstVideoTrainBatchMeta;

GType gst_videotrain_clip_meta_api_get_type(void);
GType gst_videotrain_sample_meta_api_get_type(void);
GType gst_videotrain_batch_meta_api_get_type(void);
const GstMetaInfo *gst_videotrain_clip_meta_get_info(void);
const GstMetaInfo *gst_videotrain_sample_meta_get_info(void);
const GstMetaInfo *gst_videotrain_batch_meta_get_info(void);

#define GST_VIDEOTRAIN_CLIP_META_API_TYPE (gst_videotrain_clip_meta_api_get_type())
#define GST_VIDEOTRAIN_SAMPLE_META_API_TYPE (gst_videotrain_sample_meta_api_get_type())
#define GST_VIDEOTRAIN_BATCH_META_API_TYPE (gst_videotrain_batch_meta_api_get_type())

#define gst_buffer_get_videotrain_clip_meta(b) \
  ((GstVideoTrainClipMeta *)gst_buffer_get_meta((b), GST_VIDEOTRAIN_CLIP_META_API_TYPE))
#define gst_buffer_get_videotrain_sample_meta(b) \
  ((GstVideoTrainSampleMeta *)gst_buffer_get_meta((b), GST_VIDEOTRAIN_SAMPLE_META_API_TYPE))
#define gst_buffer_get_videotrain_batch_meta(b) \
  ((GstVideoTrainBatchMeta *)gst_buffer_get_meta((b), GST_VIDEOTRAIN_BATCH_META_API_TYPE))

/* Adders copy the strings they are given. */
GstVideoTrainClipMeta *gst_buffer_add_videotrain_clip_meta(GstBuffer *buffer, const char *caption,
                                                           const char *path, const char *split);
GstVideoTrainSampleMeta *gst_buffer_add_videotrain_sample_meta(GstBuffer *buffer, const char *caption,
                                                               const char *path);
/* The per-sample arrays start empty; append a sample with the helper below. */
GstVideoTrainBatchMeta *gst_buffer_add_videotrain_batch_meta(GstBuffer *buffer);
void gst_videotrain_batch_meta_append(GstVideoTrainBatchMeta *meta, guint64 sample_id, guint epoch,
                                      guint64 clip_index, const char *caption, gboolean padding);

/* Sample meta filled from a clip meta (vaeencoder: first frame of the clip). */
GstVideoTrainSampleMeta *gst_buffer_add_videotrain_sample_meta_from_clip(GstBuffer *buffer,
                                                                         const GstVideoTrainClipMeta *clip);

G_END_DECLS

#ifdef __cplusplus
#include <cstdint>
#include <string>
#include <vector>

namespace videotrain {

/* What a face reads from the metas and hands to an engine, so that engines stay free of
 * GStreamer types. */
struct BatchInfo {
  uint64_t step = 0;
  uint32_t micro_index = 0;
  uint32_t micro_count = 0;
  uint32_t step_samples = 0;
  bool sync = false;
  uint32_t epoch = 0;      // data position after the step: epoch ...
  uint64_t next_clip = 0;  // ... and next clip index of that epoch
  // One entry per sample of the micro-batch.
  std::vector<uint64_t> sample_ids;
  std::vector<std::string> captions;
  std::vector<bool> padding;
  std::vector<uint64_t> clip_indices;
  std::vector<uint32_t> epochs;
};

struct SampleInfo {
  uint64_t sample_id = 0;
  uint32_t epoch = 0;
  uint64_t clip_index = 0;
  bool padding = false;
  std::string caption;
  std::string path;
};

// False when the buffer has no such meta.
bool read_batch_meta(GstBuffer *buffer, BatchInfo *out);
bool read_sample_meta(GstBuffer *buffer, SampleInfo *out);
// Adds a batch meta holding everything in info (micro-batch buffers made by an app or a test).
GstVideoTrainBatchMeta *write_batch_meta(GstBuffer *buffer, const BatchInfo &info);

}  // namespace videotrain
#endif
