#include "yuv_to_rgb.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace videotrain {

namespace {

const char *matrix_name(GstVideoColorMatrix m) {
  switch (m) {
    case GST_VIDEO_COLOR_MATRIX_BT709: return "BT.709";
    case GST_VIDEO_COLOR_MATRIX_BT601: return "BT.601";
    case GST_VIDEO_COLOR_MATRIX_BT2020: return "BT.2020";
    case GST_VIDEO_COLOR_MATRIX_SMPTE240M: return "SMPTE 240M";
    case GST_VIDEO_COLOR_MATRIX_FCC: return "FCC";
    case GST_VIDEO_COLOR_MATRIX_RGB: return "RGB";
    default: return "unknown";
  }
}

// Parses a caps colorimetry string; all unknown when absent or unreadable.
GstVideoColorimetry parse(const char *s) {
  GstVideoColorimetry c{};
  if (!s || !gst_video_colorimetry_from_string(&c, s)) std::memset(&c, 0, sizeof c);
  return c;
}

}  // namespace

std::string Colour::describe() const {
  return std::string(matrix_name(matrix)) + (full_range ? " full range" : " limited range");
}

Colour resolve_colour(const char *decoded, const char *container) {
  GstVideoColorimetry d = parse(decoded), c = parse(container);
  Colour out;
  out.matrix = d.matrix != GST_VIDEO_COLOR_MATRIX_UNKNOWN ? d.matrix
               : c.matrix != GST_VIDEO_COLOR_MATRIX_UNKNOWN ? c.matrix
                                                           : GST_VIDEO_COLOR_MATRIX_BT601;
  GstVideoColorRange r = d.range != GST_VIDEO_COLOR_RANGE_UNKNOWN ? d.range : c.range;
  out.full_range = r == GST_VIDEO_COLOR_RANGE_0_255;
  out.range_tagged = r != GST_VIDEO_COLOR_RANGE_UNKNOWN;
  return out;
}

GstCaps *yuv_to_rgb_input_caps() {
  return gst_caps_from_string(
      "video/x-raw, format=(string){ I420, YV12, Y42B, Y444, I420_10LE, I422_10LE, Y444_10LE, I420_12LE, "
      "I422_12LE, Y444_12LE, Y444_16LE, GRAY8, GRAY16_LE, RGB }");
}

bool YuvToRgb::configure(const GstVideoInfo &in, const Colour &colour, std::string *error) {
  in_ = in;
  const GstVideoFormatInfo *f = in.finfo;
  rgb_ = GST_VIDEO_INFO_FORMAT(&in) == GST_VIDEO_FORMAT_RGB;
  if (rgb_) return true;
  grey_ = GST_VIDEO_FORMAT_INFO_IS_GRAY(f);
  // 16-bit samples are read in host order: little-endian formats on a little-endian host.
  const bool host_order = GST_VIDEO_FORMAT_INFO_IS_LE(f) == (G_BYTE_ORDER == G_LITTLE_ENDIAN) ||
                          GST_VIDEO_FORMAT_INFO_PSTRIDE(f, 0) == 1;
  if (!(GST_VIDEO_FORMAT_INFO_IS_YUV(f) || grey_) || !host_order) {
    *error = std::string("cannot convert ") + gst_video_format_to_string(GST_VIDEO_INFO_FORMAT(&in)) + " to RGB";
    return false;
  }
  const int depth = GST_VIDEO_FORMAT_INFO_DEPTH(f, 0);
  bytes_ = GST_VIDEO_FORMAT_INFO_PSTRIDE(f, 0);
  if (depth < 8 || depth > 16 || (bytes_ != 1 && bytes_ != 2) || (bytes_ == 1) != (depth == 8)) {
    *error = std::string("cannot convert ") + gst_video_format_to_string(GST_VIDEO_INFO_FORMAT(&in)) + " to RGB";
    return false;
  }
  // GBR planes come as GBR formats (videoconvert repacks them); an identity matrix on YUV
  // planes would be a mislabelled stream, read as BT.601 like an untagged one.
  double kr = 0.299, kb = 0.114;
  if (colour.matrix == GST_VIDEO_COLOR_MATRIX_RGB || !gst_video_color_matrix_get_Kr_Kb(colour.matrix, &kr, &kb))
    kr = 0.299, kb = 0.114;
  const double kg = 1 - kr - kb;
  // Untagged grey is full range, as swscale takes it.
  const bool full = colour.full_range || (grey_ && !colour.range_tagged);
  const int n = 1 << depth;
  const double s = double(n) / 256, m = n - 1, half = n / 2;
  auto luma = [&](int v) { return full ? v / m : (v - 16 * s) / (219 * s); };
  auto chroma = [&](int v) { return full ? (v - half) / m : (v - 128 * s) / (224 * s); };
  auto fixed = [](double x) { return int32_t(std::lround(x * 255 * 65536)); };
  y_.resize(n), rv_.resize(n), gu_.resize(n), gv_.resize(n), bu_.resize(n);
  for (int v = 0; v < n; v++) {
    double c = chroma(v);
    y_[v] = fixed(luma(v));
    rv_[v] = fixed(2 * (1 - kr) * c);
    bu_[v] = fixed(2 * (1 - kb) * c);
    gu_[v] = fixed(-2 * kb * (1 - kb) / kg * c);
    gv_[v] = fixed(-2 * kr * (1 - kr) / kg * c);
  }
  return true;
}

namespace {
inline uint8_t to8(int32_t v) {
  v = (v + 32768) >> 16;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}
}  // namespace

template <typename T>
void YuvToRgb::rows(const GstVideoFrame &in, GstVideoFrame &out) const {
  const GstVideoFormatInfo *f = in.info.finfo;
  const int w = GST_VIDEO_FRAME_WIDTH(&in), h = GST_VIDEO_FRAME_HEIGHT(&in);
  const unsigned mask = unsigned(y_.size() - 1);
  const int ws = grey_ ? 0 : GST_VIDEO_FORMAT_INFO_W_SUB(f, 1), hs = grey_ ? 0 : GST_VIDEO_FORMAT_INFO_H_SUB(f, 1);
  uint8_t *dst = static_cast<uint8_t *>(GST_VIDEO_FRAME_PLANE_DATA(&out, 0));
  const int dst_stride = GST_VIDEO_FRAME_PLANE_STRIDE(&out, 0);
  for (int yy = 0; yy < h; yy++) {
    const T *yp = reinterpret_cast<const T *>(static_cast<const uint8_t *>(GST_VIDEO_FRAME_COMP_DATA(&in, 0)) +
                                              yy * GST_VIDEO_FRAME_COMP_STRIDE(&in, 0));
    uint8_t *d = dst + yy * dst_stride;
    if (grey_) {
      for (int x = 0; x < w; x++) d[3 * x] = d[3 * x + 1] = d[3 * x + 2] = to8(y_[yp[x] & mask]);
      continue;
    }
    const int cy = yy >> hs;
    const T *up = reinterpret_cast<const T *>(static_cast<const uint8_t *>(GST_VIDEO_FRAME_COMP_DATA(&in, 1)) +
                                              cy * GST_VIDEO_FRAME_COMP_STRIDE(&in, 1));
    const T *vp = reinterpret_cast<const T *>(static_cast<const uint8_t *>(GST_VIDEO_FRAME_COMP_DATA(&in, 2)) +
                                              cy * GST_VIDEO_FRAME_COMP_STRIDE(&in, 2));
    for (int x = 0; x < w; x++) {
      const int32_t Y = y_[yp[x] & mask];
      const unsigned u = up[x >> ws] & mask, v = vp[x >> ws] & mask;
      d[3 * x] = to8(Y + rv_[v]);
      d[3 * x + 1] = to8(Y + gu_[u] + gv_[v]);
      d[3 * x + 2] = to8(Y + bu_[u]);
    }
  }
}

GstBuffer *YuvToRgb::convert(GstBuffer *in) const {
  GstVideoInfo oi;
  gst_video_info_set_format(&oi, GST_VIDEO_FORMAT_RGB, GST_VIDEO_INFO_WIDTH(&in_), GST_VIDEO_INFO_HEIGHT(&in_));
  GstVideoFrame src, dst;
  if (!gst_video_frame_map(&src, const_cast<GstVideoInfo *>(&in_), in, GST_MAP_READ)) return nullptr;
  GstBuffer *out = gst_buffer_new_allocate(nullptr, oi.size, nullptr);
  if (!out || !gst_video_frame_map(&dst, &oi, out, GST_MAP_WRITE)) {
    gst_video_frame_unmap(&src);
    if (out) gst_buffer_unref(out);
    return nullptr;
  }
  if (rgb_) {
    gst_video_frame_copy(&dst, &src);
  } else if (bytes_ == 1) {
    rows<uint8_t>(src, dst);
  } else {
    rows<uint16_t>(src, dst);
  }
  gst_video_frame_unmap(&dst);
  gst_video_frame_unmap(&src);
  gst_buffer_copy_into(out, in, GST_BUFFER_COPY_METADATA, 0, -1);
  return out;
}

}  // namespace videotrain
