// csvvideosrc as users run it: in pipelines, with standard elements around it.
#include <gst/app/gstappsink.h>
#include <gst/video/video.h>
#include <gtest/gtest.h>

#include <mutex>

#include "metas.h"
#include "test_util.h"

namespace {

class CsvVideoSrcElement : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new vttest::TempDir();
    std::string csv = "path,text,split\n";
    for (int i = 0; i < 4; i++) {
      std::string name = "v" + std::to_string(i) + ".mp4";
      ASSERT_TRUE(vttest::make_video(dir_->file(name), {15, 48, 32, 10, 5}));
      csv += name + ",clip " + std::to_string(i) + "," + (i < 3 ? "train" : "val") + "\n";
    }
    vttest::write_file(dir_->file("m.csv"), csv);
  }
  static void TearDownTestSuite() { delete dir_; }

  std::string src(const std::string &extra = "") {
    return "csvvideosrc name=src location=" + dir_->file("m.csv") +
           " num-frames=3 width=24 height=16 framerate=5/1 seed=2 " + extra;
  }

  struct Frame {
    guint64 sample, clip;
    guint index, epoch;
    GstClockTime pts;
    std::string caption, split;
  };

  // Pulls every frame from the appsink named "out"; records element messages.
  std::vector<Frame> pull_all(GstElement *pipe, std::vector<GstStructure *> *messages = nullptr,
                              std::string *error = nullptr) {
    GstElement *sink = gst_bin_get_by_name(GST_BIN(pipe), "out");
    EXPECT_NE(sink, nullptr);
    std::vector<Frame> frames;
    while (GstSample *s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 30 * GST_SECOND)) {
      GstBuffer *b = gst_sample_get_buffer(s);
      auto *m = gst_buffer_get_videotrain_clip_meta(b);
      EXPECT_NE(m, nullptr) << "every frame carries its clip meta";
      if (m)
        frames.push_back({m->sample_id, m->clip_index, m->frame_index, m->epoch, GST_BUFFER_PTS(b), m->caption,
                          m->split});
      gst_sample_unref(s);
    }
    GstBus *bus = gst_element_get_bus(pipe);
    while (GstMessage *msg = gst_bus_pop(bus)) {
      if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ELEMENT && messages)
        messages->push_back(gst_structure_copy(gst_message_get_structure(msg)));
      if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_WARNING && messages) {
        const GstStructure *d = nullptr;
        gst_message_parse_warning_details(msg, &d);
        if (d) messages->push_back(gst_structure_copy(d));
      }
      if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ERROR && error) {
        GError *e = nullptr;
        gst_message_parse_error(msg, &e, nullptr);
        *error = e->message;
        g_error_free(e);
      }
      gst_message_unref(msg);
    }
    gst_object_unref(bus);
    gst_object_unref(sink);
    return frames;
  }

  static vttest::TempDir *dir_;
};

vttest::TempDir *CsvVideoSrcElement::dir_ = nullptr;

GstElement *launch(const std::string &d) {
  GError *err = nullptr;
  GstElement *p = gst_parse_launch(d.c_str(), &err);
  EXPECT_EQ(err, nullptr) << (err ? err->message : "");
  g_clear_error(&err);
  return p;
}

}  // namespace

TEST_F(CsvVideoSrcElement, FramesKeepTheirMetaThroughConvertFlipAndScale) {
  GstElement *p = launch(src("num-epochs=2") +
                         " ! videoconvert ! videoflip method=horizontal-flip ! videoscale ! "
                         "video/x-raw,format=I420,width=12,height=8 ! appsink name=out sync=false");
  ASSERT_EQ(gst_element_set_state(p, GST_STATE_PLAYING), GST_STATE_CHANGE_ASYNC);
  std::vector<GstStructure *> msgs;
  auto frames = pull_all(p, &msgs);
  ASSERT_EQ(frames.size(), 2u * 4u * 3u);
  for (size_t i = 0; i < frames.size(); i++) {
    EXPECT_EQ(frames[i].index, i % 3);
    EXPECT_EQ(frames[i].clip, (i / 3) % 4);
    EXPECT_EQ(frames[i].epoch, i / 12);
    EXPECT_EQ(frames[i].pts, i * GST_SECOND / 5) << "timestamps run on across clips";
    EXPECT_EQ(frames[i].caption, "clip " + std::to_string(frames[i].sample));
  }
  int epochs = 0;
  for (auto *s : msgs) {
    if (gst_structure_has_name(s, "csvvideosrc-epoch")) {
      guint64 clips = 0;
      guint epoch = 99;
      EXPECT_TRUE(gst_structure_get_uint64(s, "clips", &clips));
      EXPECT_TRUE(gst_structure_get_uint(s, "epoch", &epoch));
      EXPECT_EQ(clips, 4u);
      EXPECT_EQ(epoch, guint(epochs));
      epochs++;
    }
    gst_structure_free(s);
  }
  EXPECT_EQ(epochs, 2);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
}

TEST_F(CsvVideoSrcElement, AnEpochEventFollowsEachEpochsLastFrameDownstream) {
  // Serialized, so that elements downstream (microbatcher, ddpvalsink) know where an epoch
  // ends without waiting for the next one.
  GstElement *p = launch(src("num-epochs=2") + " ! queue ! appsink name=out sync=false");
  GstElement *sink = gst_bin_get_by_name(GST_BIN(p), "out");
  GstPad *pad = gst_element_get_static_pad(sink, "sink");
  struct Seen {
    std::mutex m;
    guint64 frames = 0;
    std::vector<std::pair<guint, guint64>> events;  // (epoch, frames before it)
  } seen;
  gst_pad_add_probe(
      pad, GstPadProbeType(GST_PAD_PROBE_TYPE_BUFFER | GST_PAD_PROBE_TYPE_EVENT_DOWNSTREAM),
      [](GstPad *, GstPadProbeInfo *info, gpointer data) {
        auto *s = static_cast<Seen *>(data);
        std::lock_guard<std::mutex> g(s->m);
        if (GST_PAD_PROBE_INFO_TYPE(info) & GST_PAD_PROBE_TYPE_BUFFER) {
          s->frames++;
        } else {
          const GstStructure *st = gst_event_get_structure(GST_PAD_PROBE_INFO_EVENT(info));
          guint epoch = 99;
          if (st && gst_structure_has_name(st, "csvvideosrc-epoch") && gst_structure_get_uint(st, "epoch", &epoch))
            s->events.emplace_back(epoch, s->frames);
        }
        return GST_PAD_PROBE_OK;
      },
      &seen, nullptr);
  gst_element_set_state(p, GST_STATE_PLAYING);
  auto frames = pull_all(p);
  ASSERT_EQ(frames.size(), 2u * 4u * 3u);
  {
    std::lock_guard<std::mutex> g(seen.m);
    EXPECT_EQ(seen.events, (std::vector<std::pair<guint, guint64>>{{0, 12}, {1, 24}}));
  }
  gst_object_unref(pad);
  gst_object_unref(sink);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
}

TEST_F(CsvVideoSrcElement, NegotiatesRgbAtTheRequestedSize) {
  GstElement *p = launch(src() + " ! appsink name=out sync=false");
  gst_element_set_state(p, GST_STATE_PLAYING);
  GstElement *sink = gst_bin_get_by_name(GST_BIN(p), "out");
  GstSample *s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 30 * GST_SECOND);
  ASSERT_NE(s, nullptr);
  GstVideoInfo vi;
  ASSERT_TRUE(gst_video_info_from_caps(&vi, gst_sample_get_caps(s)));
  EXPECT_EQ(GST_VIDEO_INFO_FORMAT(&vi), GST_VIDEO_FORMAT_RGB);
  EXPECT_EQ(vi.width, 24);
  EXPECT_EQ(vi.height, 16);
  EXPECT_EQ(vi.fps_n, 5);
  EXPECT_EQ(gst_buffer_get_size(gst_sample_get_buffer(s)), vi.size);
  gst_sample_unref(s);
  gst_object_unref(sink);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
}

TEST_F(CsvVideoSrcElement, SplitPropertySelectsRows) {
  GstElement *p = launch(src("split=val") + " ! appsink name=out sync=false");
  gst_element_set_state(p, GST_STATE_PLAYING);
  auto frames = pull_all(p);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].sample, 3u);
  EXPECT_EQ(frames[0].split, "val");
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
}

TEST_F(CsvVideoSrcElement, BadRowIsAWarningWithDetailsAndAReplacement) {
  vttest::write_file(dir_->file("bad.csv"), "path\nv0.mp4\nnothere.mp4\n");
  GstElement *p = launch("csvvideosrc name=src location=" + dir_->file("bad.csv") +
                         " num-frames=2 width=8 height=8 ! appsink name=out sync=false");
  gst_element_set_state(p, GST_STATE_PLAYING);
  std::vector<GstStructure *> msgs;
  auto frames = pull_all(p, &msgs);
  EXPECT_EQ(frames.size(), 4u);
  bool replaced = false;
  for (auto *s : msgs) {
    if (gst_structure_has_name(s, "csvvideosrc-replaced")) {
      replaced = true;
      guint64 row = 0;
      EXPECT_TRUE(gst_structure_get_uint64(s, "row", &row));
      EXPECT_EQ(row, 1u);
      EXPECT_NE(std::string(gst_structure_get_string(s, "path")).find("nothere.mp4"), std::string::npos);
      EXPECT_STREQ(gst_structure_get_string(s, "reason"), "file not found");
    }
    gst_structure_free(s);
  }
  EXPECT_TRUE(replaced);
  GstElement *srcel = gst_bin_get_by_name(GST_BIN(p), "src");
  guint64 count = 0;
  g_object_get(srcel, "replaced", &count, nullptr);
  EXPECT_GE(count, 1u);
  gst_object_unref(srcel);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
}

TEST_F(CsvVideoSrcElement, UnreadableManifestIsAnErrorBeforeData) {
  std::string err = vttest::run_pipeline("csvvideosrc location=" + dir_->file("absent.csv") + " ! fakesink", 30);
  EXPECT_NE(err.find("absent.csv"), std::string::npos) << err;
  vttest::write_file(dir_->file("nopath.csv"), "caption,other\nx,y\n");
  err = vttest::run_pipeline("csvvideosrc location=" + dir_->file("nopath.csv") + " ! fakesink", 30);
  EXPECT_NE(err.find("path"), std::string::npos) << err;
  err = vttest::run_pipeline("csvvideosrc ! fakesink", 30);
  EXPECT_NE(err.find("location"), std::string::npos) << err;
}

TEST_F(CsvVideoSrcElement, PlayingToNullToPlayingStartsOver) {
  GstElement *p = launch(src("prefetch=2") + " ! appsink name=out sync=false");
  for (int round = 0; round < 2; round++) {
    gst_element_set_state(p, GST_STATE_PLAYING);
    auto frames = pull_all(p);
    ASSERT_EQ(frames.size(), 12u) << "round " << round;
    EXPECT_EQ(frames[0].pts, 0u);
    gst_element_set_state(p, GST_STATE_NULL);
  }
  // Stopping in the middle of decoding returns promptly.
  gst_element_set_state(p, GST_STATE_PLAYING);
  g_usleep(50000);
  auto t0 = g_get_monotonic_time();
  gst_element_set_state(p, GST_STATE_NULL);
  EXPECT_LT(g_get_monotonic_time() - t0, 5 * G_USEC_PER_SEC);
  gst_object_unref(p);
}

TEST_F(CsvVideoSrcElement, FlushingSeekGoesToTheClipOfThatTime) {
  GstElement *p = launch(src("shuffle=false") + " ! appsink name=out sync=false max-buffers=1");
  ASSERT_NE(gst_element_set_state(p, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
  ASSERT_EQ(gst_element_get_state(p, nullptr, nullptr, 30 * GST_SECOND), GST_STATE_CHANGE_SUCCESS);
  // Frame 7 at 5 fps is in clip 2 (3 frames per clip): playback restarts at frame 6.
  ASSERT_TRUE(gst_element_seek_simple(p, GST_FORMAT_TIME, GST_SEEK_FLAG_FLUSH, 7 * GST_SECOND / 5));
  gst_element_set_state(p, GST_STATE_PLAYING);
  auto frames = pull_all(p);
  ASSERT_EQ(frames.size(), 6u);
  EXPECT_EQ(frames[0].clip, 2u);
  EXPECT_EQ(frames[0].index, 0u);
  EXPECT_EQ(frames[0].pts, 6 * GST_SECOND / 5);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
}

namespace {

// Warnings of the per-video decoders (the plugin's own copy of the category), kept as text.
struct DecoderLog {
  static std::mutex m;
  static std::vector<std::string> lines;
  static void log(GstDebugCategory *cat, GstDebugLevel level, const gchar *, const gchar *, gint, GObject *,
                  GstDebugMessage *msg, gpointer) {
    if (level > GST_LEVEL_WARNING || std::string(gst_debug_category_get_name(cat)) != "csvvideosrc-decoder") return;
    std::lock_guard<std::mutex> g(m);
    lines.push_back(gst_debug_message_get(msg));
  }
  DecoderLog() {
    {
      std::lock_guard<std::mutex> g(m);
      lines.clear();
    }
    gst_debug_set_threshold_for_name("csvvideosrc-decoder", GST_LEVEL_WARNING);
    gst_debug_add_log_function(log, nullptr, nullptr);
  }
  ~DecoderLog() { gst_debug_remove_log_function(log); }
  bool has(const std::string &text, double wait_s = 0) {
    const gint64 end = g_get_monotonic_time() + gint64(wait_s * G_USEC_PER_SEC);
    do {
      {
        std::lock_guard<std::mutex> g(m);
        for (auto &l : lines)
          if (l.find(text) != std::string::npos) return true;
      }
      g_usleep(50000);
    } while (g_get_monotonic_time() < end);
    return false;
  }
};
std::mutex DecoderLog::m;
std::vector<std::string> DecoderLog::lines;

double seconds_since(gint64 t0) { return double(g_get_monotonic_time() - t0) / G_USEC_PER_SEC; }

}  // namespace

// A video whose read() blocks (a stalled mount; here a pipe that stalls after a video's first
// bytes): replaced at decode-timeout with a warning that says so, the other clips flow, and
// going to NULL does not wait for the read.
TEST_F(CsvVideoSrcElement, AReadThatBlocksIsReplacedAtDecodeTimeoutAndStopsPromptly) {
  DecoderLog log;
  std::string head = vttest::read_file(dir_->file("v0.mp4")).substr(0, 4096);
  vttest::StalledFifo fifo(dir_->file("stall.mp4"), true, head);
  ASSERT_TRUE(fifo.ok());
  vttest::write_file(dir_->file("stall.csv"), "path\nv0.mp4\nstall.mp4\nv1.mp4\nv2.mp4\n");
  GstElement *p = launch("csvvideosrc name=src location=" + dir_->file("stall.csv") +
                         " num-frames=3 width=8 height=8 decode-timeout=1 prefetch=2 ! appsink name=out sync=false");
  const gint64 t0 = g_get_monotonic_time();
  gst_element_set_state(p, GST_STATE_PLAYING);
  std::vector<GstStructure *> msgs;
  std::string error;
  auto frames = pull_all(p, &msgs, &error);
  EXPECT_LT(seconds_since(t0), 20.0) << "decode-timeout is 1 s";
  EXPECT_EQ(error, "");
  EXPECT_EQ(frames.size(), 12u) << "4 clips of 3 frames: the others still flow";
  int replaced = 0;
  for (auto *s : msgs) {
    if (gst_structure_has_name(s, "csvvideosrc-replaced")) {
      replaced++;
      EXPECT_NE(std::string(gst_structure_get_string(s, "path")).find("stall.mp4"), std::string::npos);
      std::string reason = gst_structure_get_string(s, "reason");
      EXPECT_NE(reason.find("timeout"), std::string::npos) << reason;
    }
    gst_structure_free(s);
  }
  EXPECT_EQ(replaced, 1);
  EXPECT_TRUE(log.has("abandoning the decoding chain")) << "the stuck chain is left behind, and it says so";
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
  fifo.release();
  EXPECT_TRUE(log.has("has stopped", 20)) << "the abandoned chain ends once its read returns";
}

TEST_F(CsvVideoSrcElement, GoingToNullDoesNotWaitForAReadThatBlocks) {
  DecoderLog log;
  std::string head = vttest::read_file(dir_->file("v0.mp4")).substr(0, 4096);
  vttest::StalledFifo fifo(dir_->file("stall-null.mp4"), true, head);
  ASSERT_TRUE(fifo.ok());
  vttest::write_file(dir_->file("stall-null.csv"), "path\nstall-null.mp4\n");
  GstElement *p = launch("csvvideosrc location=" + dir_->file("stall-null.csv") +
                         " num-frames=3 width=8 height=8 decode-timeout=600 ! fakesink");
  gst_element_set_state(p, GST_STATE_PLAYING);
  ASSERT_TRUE(fifo.prefix_read(30)) << "the decoder never read the pipe";
  const gint64 t0 = g_get_monotonic_time();
  gst_element_set_state(p, GST_STATE_NULL);
  EXPECT_LT(seconds_since(t0), 10.0) << "going to NULL waited for the blocked read";
  EXPECT_TRUE(log.has("abandoning the decoding chain"));
  gst_object_unref(p);
  fifo.release();
  EXPECT_TRUE(log.has("has stopped", 20));
}

// fps=5 on 10 fps videos takes every other frame by time; video-stream past a file's video
// streams makes every row bad, with a reason that names the property.
TEST_F(CsvVideoSrcElement, FpsAndVideoStreamProperties) {
  GstElement *p = launch(src("clip-start=start shuffle=false fps=5") + " ! appsink name=out sync=false");
  gst_element_set_state(p, GST_STATE_PLAYING);
  GstElement *sink = gst_bin_get_by_name(GST_BIN(p), "out");
  for (guint64 want : {0u, 2u, 4u}) {
    GstSample *s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 30 * GST_SECOND);
    ASSERT_NE(s, nullptr);
    auto *m = gst_buffer_get_videotrain_clip_meta(gst_sample_get_buffer(s));
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->source_frame, want);
    gst_sample_unref(s);
  }
  gst_object_unref(sink);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
  double fps = 0;
  gint stream = -1;
  GstElement *e = gst_element_factory_make("csvvideosrc", nullptr);
  ASSERT_NE(e, nullptr);
  g_object_get(e, "fps", &fps, "video-stream", &stream, nullptr);
  EXPECT_EQ(fps, 0.0);
  EXPECT_EQ(stream, 0);
  gst_object_unref(e);

  std::string err = vttest::run_pipeline(src("video-stream=1 on-error=fail") + " ! fakesink", 60);
  EXPECT_NE(err.find("video-stream=1 but the file has 1 video stream(s)"), std::string::npos) << err;
}
