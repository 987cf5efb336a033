/* Puts each manifest row in its shape bucket, from the manifest's size columns, probing (with
 * GstDiscoverer, in parallel) the rows whose columns are empty. */
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "bucket_schedule.h"
#include "manifest.h"

namespace videotrain {

struct BucketSpec {
  std::vector<FrameSize> sizes;  // empty: one size, `width` x `height`
  std::vector<int> frames;       // longest first; empty: one length, `num_frames`
  int width = 0, height = 0, num_frames = 0;
  int frame_stride = 1;
  double fps = 0;
  bool pad_short = false;  // a video shorter than every length takes the shortest (padded)

  uint32_t count() const { return uint32_t(std::max<size_t>(sizes.size(), 1) * std::max<size_t>(frames.size(), 1)); }
  FrameSize size_of(uint32_t bucket) const;
  int frames_of(uint32_t bucket) const;
  std::string name(uint32_t bucket) const;  // "720x480x49"
};

struct BucketAssignment {
  std::vector<uint32_t> row_bucket;  // per manifest index; BucketSchedule::kNoBucket: left out
  uint64_t probed = 0;               // rows whose size came from probing
  double probe_seconds = 0;
  uint64_t too_short = 0, unreadable = 0;  // rows left out, and why
  std::string examples;                    // a few of them, for the warning
};

// False (with a reason) only when the run was cancelled. Probed sizes are kept in the manifest.
bool assign_buckets(Manifest &manifest, const BucketSpec &spec, int threads, const std::atomic<bool> *cancel,
                    BucketAssignment *out, std::string *why);

}  // namespace videotrain
