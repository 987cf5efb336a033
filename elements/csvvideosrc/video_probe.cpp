#include "video_probe.h"

#include <cmath>

namespace videotrain {

// Size, duration and frame rate of the first video stream; false with a reason.
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
      const GstClockTime dur = gst_discoverer_info_get_duration(info);
      if (out->fps > 0 && GST_CLOCK_TIME_IS_VALID(dur) && dur > 0)
        out->num_frames = std::llround(double(dur) / GST_SECOND * out->fps);
      ok = out->width > 0 && out->height > 0;
      if (!ok) *why = "the video stream has no size";
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
