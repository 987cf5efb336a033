/* A video's size, frame rate and frame count from its headers (GstDiscoverer), without
 * decoding: what videotrain-probe writes into a manifest, and what csvvideosrc asks for rows
 * whose size columns are empty when buckets need them. */
#pragma once

#include <gst/pbutils/pbutils.h>

#include <cstdint>
#include <string>

namespace videotrain {

struct Probe {
  int64_t num_frames = 0, height = 0, width = 0;  // num_frames: duration x frame rate, rounded; 0 = unknown
  double fps = 0;
};

// Size, duration and frame rate of the first video stream; false with a reason.
bool probe_video(GstDiscoverer *disc, const std::string &path, Probe *out, std::string *why);

}  // namespace videotrain
