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

#include "batch_info.h"  // BatchInfo: what a face reads from the batch meta

namespace videotrain {

/* What a face reads from a sample meta and hands to an engine, so that engines stay free of
 * GStreamer types. */
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

// False, leaving *out as it is, when the buffer has no such meta (a BatchInfo left at its
// defaults says that the buffer is a whole step on its own).
bool read_batch_meta(GstBuffer *buffer, BatchInfo *out);
bool read_sample_meta(GstBuffer *buffer, SampleInfo *out);
// Adds a batch meta holding everything in info (micro-batch buffers made by an app or a test).
GstVideoTrainBatchMeta *write_batch_meta(GstBuffer *buffer, const BatchInfo &info);

}  // namespace videotrain
#endif
