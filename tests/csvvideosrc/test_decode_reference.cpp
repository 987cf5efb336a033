/* csvvideosrc's decoder against independent references: a video-decoding library's frame
 * (tests/reference/decode), the textbook colour equations applied by numpy to the planes
 * ffmpeg dumps (8 and 10 bits, full and limited range, BT.601/709/2020 and untagged),
 * ffmpeg's own choice of stream and its fps filter's choice of frames by timestamp.
 * Needs ffmpeg (scripts/deps.sh) and $PYTHON with numpy. */
#include <gtest/gtest.h>

#include <gst/video/video.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "clip_decoder.h"
#include "test_util.h"

using namespace videotrain;

namespace {

constexpr double kTolerance = 1.5;  // mean absolute difference per channel value

bool sh(const std::string &cmd) {
  int rc = std::system(cmd.c_str());
  if (rc != 0) ADD_FAILURE() << "failed (" << rc << "): " << cmd;
  return rc == 0;
}

std::string ffmpeg() { return "ffmpeg -hide_banner -loglevel error -y "; }

// Packed RGB rows of a decoded frame (without GstVideoInfo's row padding).
std::string packed(GstBuffer *b, int w, int h) {
  GstVideoInfo vi;
  gst_video_info_set_format(&vi, GST_VIDEO_FORMAT_RGB, w, h);
  EXPECT_EQ(gst_buffer_get_size(b), vi.size);
  std::string out(size_t(w) * h * 3, '\0');
  for (int y = 0; y < h; y++) gst_buffer_extract(b, y * vi.stride[0], &out[size_t(y) * w * 3], size_t(w) * 3);
  return out;
}

double mean_abs_diff(const std::string &a, const std::string &b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size() || a.empty()) return 1e9;
  double sum = 0;
  for (size_t i = 0; i < a.size(); i++) sum += std::abs(int(uint8_t(a[i])) - int(uint8_t(b[i])));
  return sum / a.size();
}

// HxWx3 uint8 array of a .npy file (format 1.0/2.0, C order); "" when it is not one.
std::string read_npy_rgb(const std::string &path, int *h, int *w) {
  std::string d = vttest::read_file(path);
  if (d.size() < 12 || d.compare(0, 6, "\x93NUMPY") != 0) return "";
  size_t hlen, off;
  if (d[6] == 1) {
    hlen = uint8_t(d[8]) | uint8_t(d[9]) << 8, off = 10;
  } else {
    hlen = uint8_t(d[8]) | uint8_t(d[9]) << 8 | uint8_t(d[10]) << 16 | size_t(uint8_t(d[11])) << 24, off = 12;
  }
  std::string header = d.substr(off, hlen);
  if (header.find("'|u1'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
    return "";
  size_t s = header.find("'shape': (");
  if (s == std::string::npos) return "";
  int c = 0;
  if (std::sscanf(header.c_str() + s + 10, "%d, %d, %d", h, w, &c) != 3 || c != 3) return "";
  std::string data = d.substr(off + hlen);
  return data.size() == size_t(*h) * *w * 3 ? data : "";
}

// numpy: the textbook (ITU-T H.273) YUV -> RGB equations on planar 4:2:0, 4:2:2 or 4:4:4
// samples, each chroma sample covering its pixels, optionally on planes halved first; prints
// the frame's lowest and highest luma sample.
const char *kReference = R"(
import sys, numpy as np
yuv, out, W, H, bits, matrix, rng, frame, sub = sys.argv[1:10]
W, H, bits, frame = int(W), int(H), int(bits), int(frame)
sx, sy = {'420': (2, 2), '422': (2, 1), '444': (1, 1)}[sub]  # chroma subsampling
grey = matrix == 'grey'  # one plane; chroma neutral
cw, ch = W // sx, H // sy
n = W * H if grey else W * H + 2 * cw * ch
a = np.fromfile(yuv, dtype=np.uint16 if bits > 8 else np.uint8)[frame * n:(frame + 1) * n].astype(np.float64)
Y = a[:W * H].reshape(H, W)
U = np.full((ch, cw), 2.0 ** (bits - 1)) if grey else a[W * H:W * H + cw * ch].reshape(ch, cw)
V = np.full((ch, cw), 2.0 ** (bits - 1)) if grey else a[W * H + cw * ch:].reshape(ch, cw)
lo, hi = int(Y.min()), int(Y.max())
if len(sys.argv) > 10:  # 4:2:0 planes halved (means of 2x2 samples) before the equations
    half = lambda p: p.reshape(p.shape[0] // 2, 2, p.shape[1] // 2, 2).mean((1, 3))
    Y, U, V = half(Y), half(U), half(V)
U, V = U.repeat(sy, 0).repeat(sx, 1), V.repeat(sy, 0).repeat(sx, 1)
kr, kb = {'grey': (0.299, 0.114), '601': (0.299, 0.114), '709': (0.2126, 0.0722), '2020': (0.2627, 0.0593)}[matrix]
s = 2 ** (bits - 8)
if rng == 'full':
    m = 2 ** bits - 1
    y, cb, cr = Y / m, (U - 2 ** (bits - 1)) / m, (V - 2 ** (bits - 1)) / m
else:
    y, cb, cr = (Y - 16 * s) / (219 * s), (U - 128 * s) / (224 * s), (V - 128 * s) / (224 * s)
r = y + 2 * (1 - kr) * cr
b = y + 2 * (1 - kb) * cb
g = (y - kr * r - kb * b) / (1 - kr - kb)
rgb = np.clip(np.round(np.stack([r, g, b], -1) * 255), 0, 255).astype(np.uint8)
rgb.tofile(out)
print(lo, hi)
)";

class DecodeReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(std::system("ffmpeg -version > /dev/null 2>&1"), 0) << "these tests need ffmpeg: run scripts/deps.sh";
    vttest::write_file(dir.file("reference.py"), kReference);
  }

  // Expected RGB of `frame` of `video`: its planes as ffmpeg dumps them (pix_fmt unchanged),
  // through the equations. *luma gets the lowest and highest luma sample.
  std::string expected(const std::string &video, const char *pix_fmt, int w, int h, int bits, const char *matrix,
                       const char *range, int frame, bool halve = false, std::pair<int, int> *luma = nullptr) {
    const std::string yuv = video + ".yuv", rgb = video + ".rgb", minmax = video + ".minmax";
    if (!sh(ffmpeg() + "-i " + video + " -pix_fmt " + pix_fmt + " -f rawvideo " + yuv)) return "";
    std::ostringstream cmd;
    cmd << vttest::env_or("PYTHON", "/usr/bin/python3") << " " << dir.file("reference.py") << " " << yuv << " " << rgb
        << " " << w << " " << h << " " << bits << " " << matrix << " " << range << " " << frame << " "
        << (std::strstr(pix_fmt, "444") ? "444" : std::strstr(pix_fmt, "422") ? "422" : "420")
        << (halve ? " halve" : "") << " > " << minmax;
    if (!sh(cmd.str())) return "";
    if (luma) std::istringstream(vttest::read_file(minmax)) >> luma->first >> luma->second;
    return vttest::read_file(rgb);
  }

  ClipRequest request(const std::string &path, int n, int w, int h) {
    ClipRequest r;
    r.path = path;
    r.num_frames = n;
    r.start = ClipStart::Start;
    r.width = w;
    r.height = h;
    r.timeout_s = 60;
    return r;
  }

  vttest::TempDir dir;
};

}  // namespace

// A library's frame 5 of an untagged limited-range HEVC clip: BT.601, limited, as ffmpeg.
TEST_F(DecodeReferenceTest, MatchesTheReferenceLibrarysFrameAtItsIndex) {
  const std::string ref = vttest::reference_dir() + "/decode/";
  int h = 0, w = 0;
  std::string want = read_npy_rgb(ref + "h265_video.frame5.npy", &h, &w);
  ASSERT_EQ(want.size(), size_t(128 * 128 * 3)) << "h265_video.frame5.npy is not a 128x128x3 uint8 array";
  for (ClipStart start : {ClipStart::Start, ClipStart::Center}) {
    // From the start, frame 5 is the sixth; centred, a 2-frame clip of 10 frames is 4 and 5.
    ClipRequest r = request(ref + "h265_video.mp4", start == ClipStart::Start ? 6 : 2, w, h);
    r.start = start;
    DecodedClip c;
    std::string why;
    ASSERT_EQ(decode_clip(r, nullptr, &c, &why), DecodeStatus::Ok) << why;
    const size_t i = c.frames.size() - 1;
    EXPECT_EQ(c.source_frames[i], 5u);
    double d = mean_abs_diff(packed(c.frames[i], w, h), want);
    EXPECT_LE(d, kTolerance) << "start " << int(start);
    std::printf("h265_video.mp4 frame 5 (%s): mean abs diff %.3f\n", c.stream.c_str(), d);
  }
}

struct ColourCase {
  const char *name, *codec, *pix_fmt, *range, *colorspace, *matrix;  // matrix: how the equations read it
  const char *container;
  int bits;
};

// Files made by ffmpeg with their tags in the bitstream (and in MP4's 'colr' box, which
// GStreamer's qtdemux reads as limited range) decode as the equations say for the tags.
TEST_F(DecodeReferenceTest, ColourFollowsTheStreamsMatrixAndRange) {
  const ColourCase cases[] = {
      {"h264-709-full", "libx264", "yuvj420p", "pc", "bt709", "709", "mp4", 8},
      {"h264-709-full-mkv", "libx264", "yuvj420p", "pc", "bt709", "709", "mkv", 8},
      {"h264-601-full", "libx264", "yuvj420p", "pc", "bt470bg", "601", "mp4", 8},
      {"h264-709-limited", "libx264", "yuv420p", "tv", "bt709", "709", "mp4", 8},
      {"h264-untagged", "libx264", "yuv420p", nullptr, nullptr, "601", "mkv", 8},
      {"h264-10bit-709-full", "libx264", "yuv420p10le", "pc", "bt709", "709", "mp4", 10},
      {"hevc-10bit-709-full", "libx265", "yuv420p10le", "pc", "bt709", "709", "mp4", 10},
      {"hevc-10bit-2020-limited", "libx265", "yuv420p10le", "tv", "bt2020nc", "2020", "mkv", 10},
      {"mjpeg-601-full", "mjpeg", "yuvj420p", "pc", "bt470bg", "601", "avi", 8},
      {"vp8-untagged", "libvpx", "yuv420p", nullptr, nullptr, "601", "webm", 8},
      {"av1-709-full", "libaom-av1", "yuv420p", "pc", "bt709", "709", "mkv", 8},
      {"h264-grey-untagged", "libx264", "gray", nullptr, nullptr, "grey", "mkv", 8},  // full range, as swscale
      {"h264-444-709-full", "libx264", "yuvj444p", "pc", "bt709", "709", "mkv", 8},
      {"h264-422-10bit-709-limited", "libx264", "yuv422p10le", "tv", "bt709", "709", "mp4", 10},
      {"hevc-444-10bit-709-full", "libx265", "yuv444p10le", "pc", "bt709", "709", "mp4", 10},
  };
  const int w = 128, h = 96;
  for (const ColourCase &k : cases) {
    SCOPED_TRACE(k.name);
    const std::string v = dir.file(std::string(k.name) + "." + k.container);
    const bool full = (k.range && std::strcmp(k.range, "pc") == 0) || std::strcmp(k.matrix, "grey") == 0;
    std::string tags;
    if (k.range)
      tags = std::string(" -color_range ") + k.range + " -colorspace " + k.colorspace + " -color_primaries " +
             (std::strcmp(k.colorspace, "bt470bg") == 0 ? "bt470bg" : std::strcmp(k.colorspace, "bt709") == 0
                                                                          ? "bt709"
                                                                          : "bt2020") +
             " -color_trc " + (std::strcmp(k.colorspace, "bt2020nc") == 0 ? "bt2020-10" : "bt709");
    // testsrc2's black and white reach the ends of the full range: clipping would show.
    const std::string scale = std::string("scale=out_range=") + (full ? "full" : "limited") + ":out_color_matrix=" +
                              (k.colorspace && std::strcmp(k.colorspace, "bt709") == 0 ? "bt709" : "bt601");
    ASSERT_TRUE(sh(ffmpeg() + "-f lavfi -i testsrc2=size=" + std::to_string(w) + "x" + std::to_string(h) +
                   ":rate=10 -frames:v 6 -vf " + scale + ",format=" + k.pix_fmt + " -c:v " + k.codec +
                   (std::strcmp(k.codec, "libx265") == 0      ? " -x265-params log-level=error"
                    : std::strcmp(k.codec, "libaom-av1") == 0 ? " -cpu-used 8"
                                                              : "") + tags + " " + v));
    std::pair<int, int> luma;
    std::string want = expected(v, k.pix_fmt, w, h, k.bits, k.matrix, full ? "full" : "limited", 3, false, &luma);
    ASSERT_FALSE(want.empty());
    const int s = 1 << (k.bits - 8);
    if (full) {
      EXPECT_TRUE(luma.first < 16 * s || luma.second > 235 * s) << luma.first << ".." << luma.second;
    }
    DecodedClip c;
    std::string why;
    ASSERT_EQ(decode_clip(request(v, 4, w, h), nullptr, &c, &why), DecodeStatus::Ok) << why;
    ASSERT_EQ(c.source_frames[3], 3u);
    double d = mean_abs_diff(packed(c.frames[3], w, h), want);
    EXPECT_LE(d, kTolerance);
    std::printf("%-24s %s: mean abs diff %.3f\n", k.name, c.stream.c_str(), d);
  }
}

// Scaling happens on the YUV planes (4:2:0 stays 4:2:0) before the conversion, which reads
// the stream's matrix and range as at full size.
TEST_F(DecodeReferenceTest, ResizingKeepsTheColourHandling) {
  const int w = 128, h = 96;
  const std::string v = dir.file("full.mp4");
  // Blurred, so that videoscale's bilinear kernel and the 2x2 means agree.
  ASSERT_TRUE(sh(ffmpeg() + "-f lavfi -i testsrc2=size=128x96:rate=10 -frames:v 4 -vf "
                            "gblur=sigma=3,scale=out_range=full:out_color_matrix=bt709,format=yuvj420p -c:v libx264 "
                            "-color_range pc -colorspace bt709 -color_primaries bt709 -color_trc bt709 " + v));
  std::string want = expected(v, "yuvj420p", w, h, 8, "709", "full", 2, true);
  ASSERT_FALSE(want.empty());
  ClipRequest r = request(v, 3, w / 2, h / 2);
  r.resize = ResizeMode::Stretch;
  DecodedClip c;
  std::string why;
  ASSERT_EQ(decode_clip(r, nullptr, &c, &why), DecodeStatus::Ok) << why;
  double d = mean_abs_diff(packed(c.frames[2], w / 2, h / 2), want);
  EXPECT_LE(d, kTolerance);
  std::printf("full range, halved (%s): mean abs diff %.3f\n", c.stream.c_str(), d);
}

// video-stream picks among the file's video streams in their order (an MKV with a 64x48 and
// a 96x72 stream); the reference is ffmpeg's decode of that stream (-map 0:v:N).
TEST_F(DecodeReferenceTest, VideoStreamChoosesTheStream) {
  const std::string v = dir.file("two.mkv");
  ASSERT_TRUE(sh(ffmpeg() + "-f lavfi -i smptebars=size=64x48:rate=10 -f lavfi -i testsrc2=size=96x72:rate=10 "
                            "-map 0:v -map 1:v -frames:v 5 -vf gblur=sigma=2 -c:v libx264 " + v));
  const int sizes[2][2] = {{64, 48}, {96, 72}};
  for (int stream = 0; stream < 2; stream++) {
    const int w = sizes[stream][0], h = sizes[stream][1];
    const std::string rgb = dir.file("two." + std::to_string(stream) + ".rgb");
    ASSERT_TRUE(sh(ffmpeg() + "-i " + v + " -map 0:v:" + std::to_string(stream) +
                   " -frames:v 1 -pix_fmt rgb24 -f rawvideo " + rgb));
    ClipRequest r = request(v, 1, w, h);
    r.video_stream = stream;
    DecodedClip c;
    std::string why;
    ASSERT_EQ(decode_clip(r, nullptr, &c, &why), DecodeStatus::Ok) << why;
    EXPECT_NE(c.stream.find("video stream " + std::to_string(stream) + " of 2, " + std::to_string(w) + "x" +
                            std::to_string(h)),
              std::string::npos)
        << c.stream;
    double d = mean_abs_diff(packed(c.frames[0], w, h), vttest::read_file(rgb));
    EXPECT_LE(d, kTolerance) << "stream " << stream;
  }
  ClipRequest r = request(v, 1, 64, 48);
  r.video_stream = 2;
  DecodedClip c;
  std::string why;
  EXPECT_EQ(decode_clip(r, nullptr, &c, &why), DecodeStatus::Failed);
  EXPECT_NE(why.find("video-stream=2 but the file has 2 video stream(s)"), std::string::npos) << why;
}

// A variable-rate file (frame n at n/10 + 0.03 (n mod 3) s, each frame its own grey): fps=4
// takes the frames that ffmpeg's fps filter takes; a later start takes the frame shown at
// each tick (the last one before tick + half a period), from the timestamps ffprobe lists.
TEST_F(DecodeReferenceTest, FpsSamplesByTimestamps) {
  const int w = 64, h = 48, n = 40;
  const std::string v = dir.file("vfr.mkv");
  ASSERT_TRUE(sh(ffmpeg() + "-f lavfi -i color=c=gray:size=64x48:rate=10 -frames:v " + std::to_string(n) +
                 " -vf \"geq=lum=mod(N*37\\,200)+20:cb=128:cr=128,settb=1/1000,setpts=(N/10+0.03*mod(N\\,3))/TB\" "
                 "-fps_mode passthrough -enc_time_base 1/1000 -c:v libx264 -g 8 " + v));
  // All frames as ffmpeg decodes them, their timestamps, and what its fps filter keeps.
  ASSERT_TRUE(sh(ffmpeg() + "-i " + v + " -fps_mode passthrough -pix_fmt rgb24 -f rawvideo " + dir.file("all.rgb")));
  ASSERT_TRUE(sh(ffmpeg() + "-i " + v + " -vf fps=4 -pix_fmt rgb24 -f rawvideo " + dir.file("fps4.rgb")));
  ASSERT_TRUE(sh("ffprobe -v error -select_streams v:0 -show_entries packet=pts_time -of csv=p=0 " + v + " | sort -g > " +
                 dir.file("pts.txt")));
  const std::string all = vttest::read_file(dir.file("all.rgb")), fps4 = vttest::read_file(dir.file("fps4.rgb"));
  const size_t fsize = size_t(w) * h * 3;
  ASSERT_EQ(all.size(), fsize * n);
  std::vector<double> pts;
  std::istringstream in(vttest::read_file(dir.file("pts.txt")));
  for (double t; in >> t;) pts.push_back(t);
  ASSERT_EQ(pts.size(), size_t(n));
  ASSERT_GT(pts[2] - pts[1], 0.12);  // irregular indeed

  const int clip = 10;
  ASSERT_GE(fps4.size(), fsize * clip);
  ClipRequest r = request(v, clip, w, h);
  r.fps = 4;
  DecodedClip c;
  std::string why;
  ASSERT_EQ(decode_clip(r, nullptr, &c, &why), DecodeStatus::Ok) << why;
  for (int k = 0; k < clip; k++)
    EXPECT_LE(mean_abs_diff(packed(c.frames[k], w, h), fps4.substr(k * fsize, fsize)), kTolerance) << "sample " << k;

  // Centred: sample k is the last frame whose time is before start + k/4 + 1/8.
  r.start = ClipStart::Center;
  r.num_frames = 6;
  ASSERT_EQ(decode_clip(r, nullptr, &c, &why), DecodeStatus::Ok) << why;
  const double t0 = c.start_time / 1e9;
  EXPECT_GT(t0, 1.0);
  for (int k = 0; k < 6; k++) {
    int shown = -1;
    for (int i = 0; i < n; i++)
      if (pts[i] < t0 + k * 0.25 + 0.125) shown = i;
    ASSERT_GE(shown, 0);
    EXPECT_LE(mean_abs_diff(packed(c.frames[k], w, h), all.substr(shown * fsize, fsize)), kTolerance)
        << "sample " << k << " at " << t0 + k * 0.25 << " s should be frame " << shown;
  }
}
