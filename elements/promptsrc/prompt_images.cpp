#include "prompt_images.h"

#include <gst/pbutils/pbutils.h>

#include <cstring>

#include "clip_decoder.h"
#include "video_probe.h"

namespace videotrain {

bool decode_prompt_image(const std::string &path, PromptImage *out, std::string *why) {
  // Its size first (the decoder scales to a size it is given: the image's own keeps every pixel).
  GError *err = nullptr;
  GstDiscoverer *disc = gst_discoverer_new(30 * GST_SECOND, &err);
  if (!disc) {
    *why = std::string("cannot make a GstDiscoverer: ") + (err ? err->message : "?");
    g_clear_error(&err);
    return false;
  }
  Probe probe;
  const bool probed = probe_video(disc, path, &probe, why);
  g_object_unref(disc);
  if (!probed) return false;
  if (probe.width < 1 || probe.height < 1 || probe.width > 16384 || probe.height > 16384) {
    *why = "its size " + std::to_string(probe.width) + "x" + std::to_string(probe.height) + " is not 1..16384 a side";
    return false;
  }
  ClipRequest req;
  req.path = path;
  req.num_frames = 1;
  req.start = ClipStart::Start;
  req.width = int(probe.width);
  req.height = int(probe.height);
  req.resize = ResizeMode::Stretch;
  req.timeout_s = 60;
  DecodedClip clip;
  const std::atomic<bool> cancel{false};
  if (decode_clip(req, &cancel, &clip, why) != DecodeStatus::Ok || clip.frames.empty()) {
    if (why->empty()) *why = "no frame decoded";
    return false;
  }
  GstMapInfo m;
  if (!gst_buffer_map(clip.frames[0], &m, GST_MAP_READ)) {
    *why = "cannot map the decoded frame";
    return false;
  }
  // Rows may be padded (GstVideoInfo's strides: RGB rows round up to 4 bytes).
  const size_t w = size_t(probe.width), h = size_t(probe.height), row = w * 3, stride = m.size / h;
  const bool ok = stride >= row;
  if (ok) {
    out->width = probe.width;
    out->height = probe.height;
    out->rgb.resize(row * h);
    for (size_t y = 0; y < h; y++) std::memcpy(out->rgb.data() + y * row, m.data + y * stride, row);
  }
  gst_buffer_unmap(clip.frames[0], &m);
  if (!ok) *why = "the decoded frame is smaller than its size";
  return ok;
}

}  // namespace videotrain
