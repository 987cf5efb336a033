/* Colour of decoded frames: which matrix and range a stream uses (its own tags, with
 * ffmpeg's fallbacks), and the conversion of its YUV planes to packed 8-bit RGB by the
 * textbook equations (ITU-T H.273), chroma repeated over the pixels it covers as
 * swscale does. videoconvert is not used for this: its 8-bit integer path is off by 1 to
 * 3 per channel value, and it takes the range from caps that demuxers get wrong. */
#pragma once

#include <gst/video/video.h>

#include <cstdint>
#include <string>
#include <vector>

namespace videotrain {

struct Colour {
  GstVideoColorMatrix matrix = GST_VIDEO_COLOR_MATRIX_BT601;
  bool full_range = false;
  bool range_tagged = false;  // false: full_range is the fallback
  std::string describe() const;  // "BT.709 full range"
};

// The colour of a stream from what its decoder reports (`decoded`, the colorimetry field of
// the decoder's caps, or null) and what its container says (`container`, or null): each of
// matrix and range is taken from the decoder (the bitstream), else from the container, else
// as ffmpeg does without tags: BT.601, limited range.
Colour resolve_colour(const char *decoded, const char *container);

// Caps the conversion reads (planar YUV of 8 to 16 bits, grey, packed RGB), for the
// capsfilter in front of it.
GstCaps *yuv_to_rgb_input_caps();

class YuvToRgb {
 public:
  // False (with *error) for a format the conversion does not read.
  bool configure(const GstVideoInfo &in, const Colour &colour, std::string *error);
  // A new buffer of packed RGB (GstVideoInfo's strides) of the same size, or null.
  GstBuffer *convert(GstBuffer *in) const;

 private:
  GstVideoInfo in_{};
  bool rgb_ = false, grey_ = false;
  int bytes_ = 1;  // per sample
  // Contributions to R, G, B in 1/65536 of a value: y_ of luma, rv_/gv_ of Cr, gu_/bu_ of Cb.
  std::vector<int32_t> y_, rv_, gu_, gv_, bu_;
  template <typename T> void rows(const GstVideoFrame &in, GstVideoFrame &out) const;
};

}  // namespace videotrain
