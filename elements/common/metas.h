/* Metas that travel with frames, latents and micro-batches: the C metas are the public
 * library's (gst-libs/gst/videotrain); what the elements add here is their protocol names
 * and the C++ readers that hand plain values to engines. No torch. */
#pragma once

#include <gst/gst.h>
#include <gst/videotrain/videotrain-metas.h>

G_BEGIN_DECLS
/* csvvideosrc's end of an epoch: its bus message and the serialized custom downstream
 * event that follows the epoch's last frame (fields epoch, clips, replaced). */
#define GST_VIDEOTRAIN_EPOCH_EVENT "csvvideosrc-epoch"
/* The longest clip a clip meta may announce (csvvideosrc num-frames' maximum); vaeencoder
 * keeps a slot per frame, so it refuses longer ones before allocating. */
#define GST_VIDEOTRAIN_MAX_CLIP_FRAMES 100000

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
  uint64_t group = 0;        // csvvideosrc buckets: the step group and its size (0: none)
  uint32_t group_size = 0;
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
