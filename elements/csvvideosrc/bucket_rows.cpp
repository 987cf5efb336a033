#include "bucket_rows.h"

#include <gst/pbutils/pbutils.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "video_probe.h"

namespace videotrain {

FrameSize BucketSpec::size_of(uint32_t bucket) const {
  const uint32_t nf = uint32_t(std::max<size_t>(frames.size(), 1));
  return sizes.empty() ? FrameSize{width, height} : sizes[bucket / nf];
}

int BucketSpec::frames_of(uint32_t bucket) const {
  const uint32_t nf = uint32_t(std::max<size_t>(frames.size(), 1));
  return frames.empty() ? num_frames : frames[bucket % nf];
}

std::string BucketSpec::name(uint32_t bucket) const {
  const FrameSize s = size_of(bucket);
  return std::to_string(s.width) + "x" + std::to_string(s.height) + "x" + std::to_string(frames_of(bucket));
}

namespace {

bool needs_probe(const BucketSpec &spec, const VideoSize &v) {
  return (!spec.sizes.empty() && !v.known_shape()) || (!spec.frames.empty() && v.frames == 0);
}

}  // namespace

bool assign_buckets(Manifest &manifest, const BucketSpec &spec, int threads, const std::atomic<bool> *cancel,
                    BucketAssignment *out, std::string *why) {
  const size_t n = manifest.size();
  out->row_bucket.assign(n, BucketSchedule::kNoBucket);
  // Probe the rows the columns leave unknown, on `threads` threads, each with its discoverer.
  std::vector<size_t> todo;
  for (size_t i = 0; i < n; i++)
    if (needs_probe(spec, manifest.video_size(i))) todo.push_back(i);
  std::vector<std::string> failed(n);
  if (!todo.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < std::max(threads, 1); t++)
      pool.emplace_back([&] {
        GError *err = nullptr;
        GstDiscoverer *disc = gst_discoverer_new(30 * GST_SECOND, &err);
        for (size_t k; disc && !(cancel && cancel->load()) && (k = next++) < todo.size();) {
          const size_t i = todo[k];
          const ManifestRow row = manifest.row(i);
          Probe p;
          std::string reason = row.error;
          if (reason.empty() && probe_video(disc, row.path, &p, &reason)) {
            VideoSize v = manifest.video_size(i);
            if (!v.known_shape()) v.width = uint32_t(p.width), v.height = uint32_t(p.height);
            if (v.frames == 0) v.frames = uint32_t(std::max<int64_t>(p.num_frames, 0));
            if (v.fps <= 0) v.fps = float(p.fps);
            manifest.set_video_size(i, v);
          } else {
            failed[i] = row.path + ": " + reason;
          }
        }
        if (disc) g_object_unref(disc);
        g_clear_error(&err);
      });
    for (auto &t : pool) t.join();
    if (cancel && cancel->load()) {
      *why = "cancelled while probing video sizes";
      return false;
    }
    out->probed = todo.size();
    out->probe_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const uint32_t nf = uint32_t(std::max<size_t>(spec.frames.size(), 1));
  auto example = [&](const std::string &what) {
    if (std::count(out->examples.begin(), out->examples.end(), ';') < 3)
      out->examples += (out->examples.empty() ? "" : "; ") + what;
  };
  for (size_t i = 0; i < n; i++) {
    const VideoSize v = manifest.video_size(i);
    if (!failed[i].empty() || needs_probe(spec, v)) {
      out->unreadable++;
      example(failed[i].empty() ? "row " + std::to_string(i) + ": size unknown" : failed[i]);
      continue;
    }
    uint32_t s = 0, f = 0;
    if (!spec.sizes.empty()) s = uint32_t(nearest_size_bucket(spec.sizes, v.width, v.height));
    if (!spec.frames.empty()) {
      const int fb = longest_frame_bucket(spec.frames, v.frames, spec.frame_stride, spec.fps, v.fps);
      if (fb < 0 && !spec.pad_short) {
        out->too_short++;
        example("row " + std::to_string(i) + ": " + std::to_string(v.frames) + " frames");
        continue;
      }
      f = fb < 0 ? nf - 1 : uint32_t(fb);
    }
    out->row_bucket[i] = s * nf + f;
  }
  return true;
}

}  // namespace videotrain
