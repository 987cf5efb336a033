#include "video_probe.h"

#include <cmath>

#include "frame_count.h"

namespace videotrain {

namespace {
// A local file's name (what the counters open) from a name or a file:// URI; "" for other URIs.
std::string path_of(const std::string &path) {
  if (!gst_uri_is_valid(path.c_str())) return path;
  gchar *f = g_filename_from_uri(path.c_str(), nullptr, nullptr);
  std::string out = f ? f : "";
  g_free(f);
  return out;
}
}  // namespace

// Size, frames and frame rate of the first video stream; false with a reason.
bool probe_video(GstDiscoverer *disc, const std::string &path, Probe *out, std::string *why) {
  gchar *uri = gst_uri_is_valid(path.c_str()) ? g_strdup(path.c_str()) : gst_filename_to_uri(path.c_str(), nullptr);
  if (!uri) {
    *why = "not a file name or URI";
    return false;
  }
  GError *err = nullptr;
  GstDiscovererInfo *info = gst_discoverer_discover_uri(disc, uri, &err);
  g_free(uri);
  bool ok = false;
  if (info && gst_discoverer_info_get_result(info) == GST_DISCOVERER_OK) {
    GList *videos = gst_discoverer_info_get_video_streams(info);
    if (videos) {
      auto *v = GST_DISCOVERER_VIDEO_INFO(videos->data);
      out->width = gst_discoverer_video_info_get_width(v);
      out->height = gst_discoverer_video_info_get_height(v);
      const guint num = gst_discoverer_video_info_get_framerate_num(v);
      const guint den = gst_discoverer_video_info_get_framerate_denom(v);
      if (num > 0 && den > 0) out->fps = double(num) / den;
      ok = out->width > 0 && out->height > 0;
      if (!ok) *why = "the video stream has no size";
      // The stream's own frames, not the container's duration x rate: another track may
      // outlast the video, and a variable rate has no single rate to multiply by.
      StreamFrames sf;
      std::string count_why;
      const std::string file = path_of(path);
      if (!ok) {
      } else if (!file.empty() && count_video_frames(file, 0, &sf, &count_why)) {
        out->num_frames = sf.frames;
        out->duration_s = sf.duration_s;
        if (out->fps <= 0 && sf.duration_s > 0) out->fps = double(sf.frames) / sf.duration_s;  // the mean rate
      } else if (!file.empty()) {
        *why = "cannot count its frames: " + count_why;
        ok = false;
      } else {  // not a local file: the container's duration x rate is all there is
        const GstClockTime dur = gst_discoverer_info_get_duration(info);
        if (out->fps > 0 && GST_CLOCK_TIME_IS_VALID(dur) && dur > 0) {
          out->num_frames = std::llround(double(dur) / GST_SECOND * out->fps);
          out->duration_s = double(dur) / GST_SECOND;
        }
      }
    } else {
      *why = "no video stream";
    }
    gst_discoverer_stream_info_list_free(videos);
  } else {
    *why = err ? err->message : "cannot be read";
  }
  g_clear_error(&err);
  if (info) g_object_unref(info);
  return ok;
}

}  // namespace videotrain
