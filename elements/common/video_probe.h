/* A video's size and frame rate from its headers (GstDiscoverer) and its video stream's
 * frames (the container's sample table, else a demuxed count: frame_count.h), without
 * decoding: what videotrain-probe writes into a manifest, and what csvvideosrc asks for rows
 * whose size columns are empty when buckets need them. */
#pragma once

#include <gst/pbutils/pbutils.h>

#include <cstdint>
#include <string>

namespace videotrain {

struct Probe {
  int64_t num_frames = 0, height = 0, width = 0;  // num_frames: the video stream's frames; 0 = unknown
  double fps = 0;         // the stream's rate; a variable-rate stream's mean rate
  double duration_s = 0;  // the video stream's own duration
};

// Size, frames and frame rate of the first video stream; false with a reason.
bool probe_video(GstDiscoverer *disc, const std::string &path, Probe *out, std::string *why);

}  // namespace videotrain
