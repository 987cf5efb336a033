#include <gtest/gtest.h>

#include <gst/video/video.h>

#include <thread>

#include "clip_decoder.h"
#include "test_util.h"

using namespace videotrain;

namespace {

ClipRequest request(const std::string &path, int n, ClipStart start = ClipStart::Start) {
  ClipRequest r;
  r.path = path;
  r.num_frames = n;
  r.start = start;
  r.width = 32;
  r.height = 24;
  r.timeout_s = 30;
  return r;
}

std::string bytes_of(GstBuffer *b) {
  std::string s(gst_buffer_get_size(b), '\0');
  gst_buffer_extract(b, 0, s.data(), s.size());
  return s;
}

// Mean of channel values in one row of a packed RGB frame.
double row_mean(GstBuffer *b, int width, int row) {
  GstMapInfo m;
  EXPECT_TRUE(gst_buffer_map(b, &m, GST_MAP_READ));
  int stride = GST_ROUND_UP_4(width * 3);
  double sum = 0;
  for (int x = 0; x < width * 3; x++) sum += m.data[row * stride + x];
  gst_buffer_unmap(b, &m);
  return sum / (width * 3);
}

class ClipDecoderTest : public ::testing::Test {
 protected:
  vttest::TempDir dir;
};

}  // namespace

TEST_F(ClipDecoderTest, AccurateSeekGivesTheSameFramesAsDecodingFromTheStart) {
  std::string v = dir.file("a.mp4");
  ASSERT_TRUE(vttest::make_video(v, {60, 64, 48, 10, 10, "ball"}));
  DecodedClip all, mid;
  std::string why;
  ASSERT_EQ(decode_clip(request(v, 60), nullptr, &all, &why), DecodeStatus::Ok) << why;
  EXPECT_EQ(all.total_frames, 60);
  ASSERT_EQ(decode_clip(request(v, 8, ClipStart::Center), nullptr, &mid, &why), DecodeStatus::Ok) << why;
  ASSERT_EQ(mid.frames.size(), 8u);
  for (int i = 0; i < 8; i++) {
    EXPECT_EQ(mid.source_frames[i], uint64_t(26 + i));  // (60 - 8) / 2
    EXPECT_EQ(bytes_of(mid.frames[i]), bytes_of(all.frames[26 + i])) << "frame " << i;
  }
}

TEST_F(ClipDecoderTest, DecodesOnlyFromTheKeyframeBeforeTheClip) {
  std::string v = dir.file("long.mp4");
  ASSERT_TRUE(vttest::make_video(v, {300, 64, 48, 30, 30, "ball"}));
  DecodedClip c;
  std::string why;
  ASSERT_EQ(decode_clip(request(v, 8, ClipStart::Center), nullptr, &c, &why), DecodeStatus::Ok) << why;
  EXPECT_EQ(c.source_frames.front(), 146u);
  // At most one GOP before the clip, the clip, and what the bounded queues held.
  EXPECT_LE(c.frames_decoded, 30u + 8u + 12u) << "decoded " << c.frames_decoded << " of 300 frames";
}

TEST_F(ClipDecoderTest, RandomStartIsReproducibleAndStrideSkipsFrames) {
  std::string v = dir.file("s.mkv");
  ASSERT_TRUE(vttest::make_video(v, {50, 64, 48, 10, 5, "ball", "mkv"}));
  ClipRequest r = request(v, 5, ClipStart::Random);
  r.stride = 3;
  r.random_key = 12345;
  DecodedClip a, b;
  std::string why;
  ASSERT_EQ(decode_clip(r, nullptr, &a, &why), DecodeStatus::Ok) << why;
  ASSERT_EQ(decode_clip(r, nullptr, &b, &why), DecodeStatus::Ok) << why;
  ASSERT_EQ(a.source_frames, b.source_frames);
  uint64_t s0 = a.source_frames[0];
  EXPECT_EQ(s0, 12345u % (50 - 13 + 1));
  for (int i = 0; i < 5; i++) EXPECT_EQ(a.source_frames[i], s0 + 3 * i);
}

TEST_F(ClipDecoderTest, ShortVideoFailsOrPadsWithTheLastFrame) {
  std::string v = dir.file("short.mp4");
  ASSERT_TRUE(vttest::make_video(v, {6, 64, 48, 10, 10}));
  DecodedClip c;
  std::string why;
  EXPECT_EQ(decode_clip(request(v, 10), nullptr, &c, &why), DecodeStatus::Short);
  EXPECT_NE(why.find("too few frames"), std::string::npos) << why;
  ClipRequest r = request(v, 10);
  r.pad_short = true;
  ASSERT_EQ(decode_clip(r, nullptr, &c, &why), DecodeStatus::Ok) << why;
  ASSERT_EQ(c.frames.size(), 10u);
  for (int i = 6; i < 10; i++) {
    EXPECT_EQ(c.source_frames[i], 5u);
    EXPECT_EQ(bytes_of(c.frames[i]), bytes_of(c.frames[5]));
  }
}

TEST_F(ClipDecoderTest, BadFilesFailWithAReason) {
  DecodedClip c;
  std::string why;
  EXPECT_EQ(decode_clip(request(dir.file("missing.mp4"), 4), nullptr, &c, &why), DecodeStatus::Failed);
  EXPECT_EQ(why, "file not found");
  vttest::write_file(dir.file("text.mp4"), "this is not a video at all\n");
  EXPECT_EQ(decode_clip(request(dir.file("text.mp4"), 4), nullptr, &c, &why), DecodeStatus::Failed);
  EXPECT_NE(why.find("cannot decode"), std::string::npos) << why;
  // Truncated: the first part of a real file.
  std::string v = dir.file("full.mp4");
  ASSERT_TRUE(vttest::make_video(v, {40, 64, 48, 10, 10}));
  std::string data = vttest::read_file(v);
  vttest::write_file(dir.file("trunc.mp4"), data.substr(0, data.size() / 3));
  DecodeStatus st = decode_clip(request(dir.file("trunc.mp4"), 30), nullptr, &c, &why);
  EXPECT_EQ(why.find("timeout"), std::string::npos) << "a truncated file fails at once: " << why;
  EXPECT_EQ(why.find("timeout"), std::string::npos) << why;
  EXPECT_NE(st, DecodeStatus::Ok);
  EXPECT_FALSE(why.empty());
}

TEST_F(ClipDecoderTest, TimeoutIsReported) {
  std::string v = dir.file("t.mp4");
  ASSERT_TRUE(vttest::make_video(v, {20, 64, 48, 10, 10}));
  ClipRequest r = request(v, 10);
  r.timeout_s = 0.0;
  DecodedClip c;
  std::string why;
  EXPECT_EQ(decode_clip(r, nullptr, &c, &why), DecodeStatus::Timeout);
  EXPECT_NE(why.find("timeout"), std::string::npos) << why;
}

TEST_F(ClipDecoderTest, CancelStopsPromptly) {
  std::string v = dir.file("c.mp4");
  ASSERT_TRUE(vttest::make_video(v, {20, 64, 48, 10, 10}));
  std::atomic<bool> cancel{true};
  DecodedClip c;
  std::string why;
  EXPECT_EQ(decode_clip(request(v, 10), &cancel, &c, &why), DecodeStatus::Cancelled);
}

TEST_F(ClipDecoderTest, ResizeModesFitTheAspectRatio) {
  // A wide white video into a square output.
  std::string v = dir.file("wide.mp4");
  ASSERT_TRUE(vttest::make_video(v, {4, 128, 32, 10, 10, "white"}));
  for (ResizeMode mode : {ResizeMode::Crop, ResizeMode::Pad, ResizeMode::Stretch}) {
    ClipRequest r = request(v, 2);
    r.width = r.height = 32;
    r.resize = mode;
    DecodedClip c;
    std::string why;
    ASSERT_EQ(decode_clip(r, nullptr, &c, &why), DecodeStatus::Ok) << why;
    GstVideoInfo vi;
    gst_video_info_set_format(&vi, GST_VIDEO_FORMAT_RGB, 32, 32);
    ASSERT_EQ(gst_buffer_get_size(c.frames[0]), vi.size);
    double top = row_mean(c.frames[0], 32, 0), middle = row_mean(c.frames[0], 32, 16);
    EXPECT_GT(middle, 200) << "mode " << int(mode);
    if (mode == ResizeMode::Pad)
      EXPECT_LT(top, 30) << "pad adds black borders";
    else
      EXPECT_GT(top, 200) << "mode " << int(mode) << " fills the frame";
  }
}

// A named pipe is read as a stream: from the start, no seek. (A directory is still refused.)
TEST_F(ClipDecoderTest, ANamedPipeIsReadAsAStream) {
  for (std::string container : {"mkv", "mp4"}) {
    std::string v = dir.file("whole." + container);
    ASSERT_TRUE(vttest::make_video(v, {12, 32, 24, 10, 5, "smpte", container}));
    std::string data = vttest::read_file(v);
    ASSERT_LT(data.size(), 65536u) << "the pipe must hold the whole video";
    vttest::StalledFifo fifo(dir.file("pipe." + container), true, data);
    ASSERT_TRUE(fifo.ok());
    DecodedClip c;
    std::string why;
    DecodeStatus st = DecodeStatus::Failed;
    std::thread reader([&] { st = decode_clip(request(dir.file("pipe." + container), 4), nullptr, &c, &why); });
    EXPECT_TRUE(fifo.prefix_read(30));
    fifo.release();  // end of file after the data
    reader.join();
    EXPECT_EQ(st, DecodeStatus::Ok) << container << ": " << why;
    EXPECT_EQ(c.frames.size(), 4u) << container;
  }
  DecodedClip c;
  std::string why;
  EXPECT_EQ(decode_clip(request(dir.path(), 4), nullptr, &c, &why), DecodeStatus::Failed);
  EXPECT_EQ(why, "not a regular file");
}
