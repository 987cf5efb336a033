// Frame counts of the video stream itself (frame_count.h, video_probe.h): a variable-rate MP4
// and files whose audio track outlasts the video, where the container's duration x rate is wrong.
#include <gst/gst.h>
#include <gst/pbutils/pbutils.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "clip_decoder.h"
#include "frame_count.h"
#include "csvvideosrc/source_engine.h"
#include "video_probe.h"
#include "metas.h"
#include "test_util.h"

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace {

// Frames 0-44 at 30 fps, 45-89 at 10 fps (6 s) while the caps keep saying 30/1.
GstPadProbeReturn retime(GstPad *, GstPadProbeInfo *info, gpointer data) {
  auto *n = static_cast<int *>(data);
  GstBuffer *b = gst_buffer_make_writable(GST_PAD_PROBE_INFO_BUFFER(info));
  const int i = (*n)++;
  const bool fast = i < 45;
  GST_BUFFER_PTS(b) = fast ? gst_util_uint64_scale(i, GST_SECOND, 30)
                           : GST_SECOND * 3 / 2 + gst_util_uint64_scale(i - 45, GST_SECOND, 10);
  GST_BUFFER_DTS(b) = GST_BUFFER_PTS(b);
  GST_BUFFER_DURATION(b) = fast ? GST_SECOND / 30 : GST_SECOND / 10;
  GST_PAD_PROBE_INFO_DATA(info) = b;
  return GST_PAD_PROBE_OK;
}

bool make_vfr_mp4(const std::string &path) {
  GError *err = nullptr;
  GstElement *p = gst_parse_launch(
      ("videotestsrc num-buffers=90 ! video/x-raw,format=I420,width=64,height=48,framerate=30/1 ! "
       "identity name=retime ! openh264enc gop-size=10 ! h264parse ! mp4mux ! filesink location=\"" + path + "\"")
          .c_str(),
      &err);
  if (!p) {
    ADD_FAILURE() << (err ? err->message : "parse failed");
    g_clear_error(&err);
    return false;
  }
  int n = 0;
  GstElement *id = gst_bin_get_by_name(GST_BIN(p), "retime");
  GstPad *pad = gst_element_get_static_pad(id, "src");
  gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, retime, &n, nullptr);
  gst_object_unref(pad);
  gst_object_unref(id);
  gst_element_set_state(p, GST_STATE_PLAYING);
  GstBus *bus = gst_element_get_bus(p);
  GstMessage *m = gst_bus_timed_pop_filtered(bus, 60 * GST_SECOND, GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  const bool ok = m && GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS;
  if (m) gst_message_unref(m);
  gst_object_unref(bus);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
  EXPECT_TRUE(ok) << "could not make " << path;
  return ok;
}

// `frames` video frames at `fps` beside 5 s of audio.
bool make_long_audio(const std::string &path, const std::string &container, int frames = 60, int fps = 30) {
  const bool mp4 = container == "mp4";
  const std::string d =
      "videotestsrc num-buffers=" + std::to_string(frames) +
      " ! video/x-raw,format=I420,width=64,height=48,framerate=" + std::to_string(fps) + "/1 ! " +
      (mp4 ? "openh264enc gop-size=10 ! h264parse ! mp4mux name=m" : "vp8enc deadline=1 ! matroskamux name=m") +
      " ! filesink location=\"" + path + "\" audiotestsrc num-buffers=50 samplesperbuffer=4800 ! " +
      "audio/x-raw,rate=48000,channels=1 ! audioconvert ! " + (mp4 ? "avenc_aac ! aacparse" : "opusenc") + " ! m.";
  const std::string err = vttest::run_pipeline(d, 60);
  EXPECT_EQ(err, "") << "could not make " << path;
  return err.empty();
}

// What the probe wrote before: the container's duration x the stream's nominal rate.
int64_t duration_times_rate(const std::string &path) {
  GstDiscoverer *disc = gst_discoverer_new(10 * GST_SECOND, nullptr);
  gchar *uri = gst_filename_to_uri(path.c_str(), nullptr);
  GstDiscovererInfo *info = gst_discoverer_discover_uri(disc, uri, nullptr);
  g_free(uri);
  int64_t n = -1;
  if (info) {
    GList *v = gst_discoverer_info_get_video_streams(info);
    if (v) {
      auto *vi = GST_DISCOVERER_VIDEO_INFO(v->data);
      const double fps = double(gst_discoverer_video_info_get_framerate_num(vi)) /
                         std::max(1u, gst_discoverer_video_info_get_framerate_denom(vi));
      n = std::llround(double(gst_discoverer_info_get_duration(info)) / GST_SECOND * fps);
    }
    gst_discoverer_stream_info_list_free(v);
    g_object_unref(info);
  }
  g_object_unref(disc);
  return n;
}

videotrain::Probe probe(const std::string &path) {
  GstDiscoverer *disc = gst_discoverer_new(10 * GST_SECOND, nullptr);
  videotrain::Probe p;
  std::string why;
  EXPECT_TRUE(videotrain::probe_video(disc, path, &p, &why)) << why;
  g_object_unref(disc);
  return p;
}

TEST(FrameCount, VariableRateMp4FromTheSampleTable) {
  vttest::TempDir dir;
  const std::string v = dir.file("vfr.mp4");
  ASSERT_TRUE(make_vfr_mp4(v));
  videotrain::StreamFrames sf;
  ASSERT_TRUE(videotrain::sample_table_frames(v, 0, &sf));
  EXPECT_TRUE(sf.from_table);
  EXPECT_EQ(sf.frames, 90);
  EXPECT_NEAR(sf.duration_s, 6.0, 0.1);
  const videotrain::Probe p = probe(v);
  ASSERT_NE(duration_times_rate(v), 90) << "not a variable rate (nominal 30 fps, 6 s)";
  EXPECT_EQ(p.num_frames, 90);
  EXPECT_NEAR(p.duration_s, 6.0, 0.1);
  EXPECT_EQ(p.width, 64);
}

TEST(FrameCount, Mp4AudioOutlastsTheVideo) {
  vttest::TempDir dir;
  const std::string v = dir.file("long_audio.mp4");
  ASSERT_TRUE(make_long_audio(v, "mp4"));
  ASSERT_GT(duration_times_rate(v), 100) << "the container should last as long as its audio";
  const videotrain::Probe p = probe(v);
  EXPECT_EQ(p.num_frames, 60);
  EXPECT_NEAR(p.duration_s, 2.0, 0.05);
  EXPECT_DOUBLE_EQ(p.fps, 30.0);
}

TEST(FrameCount, MatroskaCountedByDemuxing) {
  vttest::TempDir dir;
  const std::string v = dir.file("long_audio.mkv");
  ASSERT_TRUE(make_long_audio(v, "mkv"));
  ASSERT_GT(duration_times_rate(v), 100) << "the container should last as long as its audio";
  videotrain::StreamFrames sf;
  EXPECT_FALSE(videotrain::sample_table_frames(v, 0, &sf));
  std::string why;
  ASSERT_TRUE(videotrain::count_video_frames(v, 0, &sf, &why)) << why;
  EXPECT_FALSE(sf.from_table);
  EXPECT_EQ(sf.frames, 60);
  EXPECT_NEAR(sf.duration_s, 2.0, 0.05);
  EXPECT_EQ(probe(v).num_frames, 60);
  EXPECT_FALSE(videotrain::count_video_frames(v, 1, &sf, &why));
  EXPECT_NE(why.find("video stream 1 not found"), std::string::npos) << why;
}

TEST(FrameCount, NotAVideo) {
  vttest::TempDir dir;
  const std::string f = dir.file("text.mp4");
  vttest::write_file(f, "not a video at all\n");
  videotrain::StreamFrames sf;
  std::string why;
  EXPECT_FALSE(videotrain::sample_table_frames(f, 0, &sf));
  EXPECT_FALSE(videotrain::count_video_frames(f, 0, &sf, &why));
  EXPECT_FALSE(why.empty());
}

// A clip placed by the container's duration (150 frames) past the video's real end (60): it
// is placed again within the frames that exist, not failed as too short.
TEST(FrameCount, AClipPlacedPastTheRealEndIsPlacedWithin) {
  vttest::TempDir dir;
  const std::string v = dir.file("long_audio.mp4");
  ASSERT_TRUE(make_long_audio(v, "mp4"));
  videotrain::ClipRequest req;
  req.path = v;
  req.num_frames = 8;
  req.start = videotrain::ClipStart::Center;  // frame 71 of the 150 the duration says
  req.width = req.height = 16;
  req.timeout_s = 30;
  videotrain::DecodedClip clip;
  std::string why;
  ASSERT_EQ(videotrain::decode_clip(req, nullptr, &clip, &why), videotrain::DecodeStatus::Ok) << why;
  EXPECT_EQ(clip.real_frames, 60);
  ASSERT_EQ(clip.frames.size(), 8u);
  EXPECT_EQ(clip.source_frames.front(), 26u);  // centred in the 60 frames: (60 - 8) / 2
  EXPECT_EQ(clip.source_frames.back(), 33u);
  // Once known, the length places it without a detour.
  req.known_frames = 60;
  videotrain::DecodedClip again;
  ASSERT_EQ(videotrain::decode_clip(req, nullptr, &again, &why), videotrain::DecodeStatus::Ok) << why;
  EXPECT_EQ(again.source_frames, clip.source_frames);
}

// A correctly probed manifest (60 frames) for videos whose audio outlasts the video (5 s against
// 2 s): with frame buckets, random starts and several epochs, no row is reported as changed, and
// every clip lies within the 60 frames (issue 38 item 3: the decoder sized the stream by the
// container's duration, found it "shorter" and warned that 60 frames were 60).
TEST(FrameCount, AContainerThatOutlastsItsVideoGivesNoWarning) {
  vttest::TempDir dir;
  ASSERT_TRUE(make_long_audio(dir.file("a.mp4"), "mp4"));
  ASSERT_TRUE(make_long_audio(dir.file("b.mkv"), "mkv"));
  ASSERT_GT(duration_times_rate(dir.file("a.mp4")), 100) << "the container should last as long as its audio";
  vttest::write_file(dir.file("m.csv"), "path,text,num_frames,fps\na.mp4,a,60,30\nb.mkv,b,60,30\n");
  videotrain::SourceConfig c;
  c.manifest.location = dir.file("m.csv");
  c.width = c.height = 16;
  c.frame_buckets = "49,33,17";
  c.num_epochs = 3;
  c.seed = 5;
  c.prefetch = 1;
  c.decode_timeout_s = 30;
  std::mutex mu;
  std::vector<std::string> warnings;
  uint64_t replaced = 0;
  videotrain::SourceCallbacks cb;
  cb.row_warning = [&](uint64_t, const std::string &path, const std::string &w) {
    std::lock_guard<std::mutex> g(mu);
    warnings.push_back(path + ": " + w);
  };
  cb.replaced = [&](const videotrain::ReplacedEvent &) {
    std::lock_guard<std::mutex> g(mu);
    replaced++;
  };
  videotrain::SourceEngine e(c, cb);
  std::string err;
  ASSERT_TRUE(e.start(&err)) << err;
  GstBuffer *b = nullptr;
  size_t clips = 0;
  for (;;) {
    auto p = e.next(&b, &err);
    if (p == videotrain::SourceEngine::Pull::Eos) break;
    ASSERT_EQ(p, videotrain::SourceEngine::Pull::Frame) << err;
    auto *m = gst_buffer_get_videotrain_clip_meta(b);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->num_frames, 49u);
    EXPECT_LT(m->source_frame, 60u) << "frame " << m->frame_index << " of a clip of " << m->caption;
    if (m->frame_index == 0) clips++;
    gst_buffer_unref(b);
  }
  e.stop();
  for (const auto &w : warnings) ADD_FAILURE() << "warning: " << w;
  EXPECT_EQ(replaced, 0u);
  EXPECT_EQ(clips, 6u);
}

// csvvideosrc with frame buckets 40 and 8 and a manifest that says 50 frames (duration x rate)
// for a video of 20: the row is not banned; it leaves the 40-frame bucket for the 8-frame one.
TEST(FrameCount, ARowShorterThanItsBucketMovesToOneItFills) {
  vttest::TempDir dir;
  ASSERT_TRUE(make_long_audio(dir.file("liar.mp4"), "mp4", 20, 10));
  ASSERT_TRUE(vttest::make_video(dir.file("long.mp4"), {45, 32, 24, 10, 10}));
  ASSERT_TRUE(vttest::make_video(dir.file("short.mp4"), {10, 32, 24, 10, 10}));
  vttest::write_file(dir.file("m.csv"),
                     "path,text,num_frames\nliar.mp4,liar,50\nlong.mp4,long,45\nshort.mp4,short,10\n");
  videotrain::SourceConfig c;
  c.manifest.location = dir.file("m.csv");
  c.width = c.height = 16;
  c.frame_buckets = "40,8";
  c.num_epochs = 4;
  c.seed = 3;
  c.prefetch = 1;
  c.decode_timeout_s = 30;
  std::mutex mu;
  std::vector<std::string> warnings;
  uint64_t replaced = 0;
  videotrain::SourceCallbacks cb;
  cb.row_warning = [&](uint64_t, const std::string &path, const std::string &w) {
    std::lock_guard<std::mutex> g(mu);
    warnings.push_back(path + ": " + w);
  };
  cb.replaced = [&](const videotrain::ReplacedEvent &) {
    std::lock_guard<std::mutex> g(mu);
    replaced++;
  };
  videotrain::SourceEngine e(c, cb);
  std::string err;
  ASSERT_TRUE(e.start(&err)) << err;
  // (epoch, caption) -> frames of its real (not padding) clips.
  std::map<std::pair<uint32_t, std::string>, std::vector<unsigned>> got;
  GstBuffer *b = nullptr;
  for (;;) {
    auto p = e.next(&b, &err);
    if (p == videotrain::SourceEngine::Pull::Eos) break;
    ASSERT_EQ(p, videotrain::SourceEngine::Pull::Frame) << err;
    auto *m = gst_buffer_get_videotrain_clip_meta(b);
    ASSERT_NE(m, nullptr);
    if (m->frame_index == 0 && !m->padding) got[std::make_pair(m->epoch, std::string(m->caption))].push_back(m->num_frames);
    gst_buffer_unref(b);
  }
  e.stop();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("liar.mp4: the manifest says 50 frames but its video stream has 20"), std::string::npos)
      << warnings[0];
  // From the epoch after the one whose clip showed it, whatever prefetch had planned.
  const size_t at = warnings[0].find("moves to bucket 16x16x8 from epoch ");
  ASSERT_NE(at, std::string::npos) << warnings[0];
  const uint32_t from = uint32_t(std::stoul(warnings[0].substr(at + 35)));
  EXPECT_EQ(from, 1u) << warnings[0];
  EXPECT_EQ(replaced, from);  // its 40-frame clip in each epoch before, replaced
  const std::vector<unsigned> none, eight{8}, forty{40};
  auto clips = [&](uint32_t epoch, const char *caption) { return got[std::make_pair(epoch, std::string(caption))]; };
  for (uint32_t epoch = 0; epoch < 4; epoch++) {
    EXPECT_EQ(clips(epoch, "liar"), epoch < from ? none : eight) << "epoch " << epoch;
    EXPECT_EQ(clips(epoch, "long"), forty) << "epoch " << epoch;
    EXPECT_EQ(clips(epoch, "short"), eight) << "epoch " << epoch;
  }
}

// Manifest size columns that lie (issue 28): a tall 24x48 video the manifest calls 480x48 starts in
// the wide bucket; its first decode shows its real size, and it moves to the tall bucket.
TEST(FrameCount, ARowWhoseSizeColumnsLieMovesToTheBucketOfItsRealAspect) {
  vttest::TempDir dir;
  ASSERT_TRUE(vttest::make_video(dir.file("liar.mp4"), {12, 24, 48, 10, 10}));
  ASSERT_TRUE(vttest::make_video(dir.file("wide.mp4"), {12, 48, 24, 10, 10}));
  ASSERT_TRUE(vttest::make_video(dir.file("tall.mp4"), {12, 24, 48, 10, 10}));
  vttest::write_file(dir.file("m.csv"), "path,text,num_frames,width,height\nliar.mp4,liar,12,480,48\n"
                                        "wide.mp4,wide,12,48,24\ntall.mp4,tall,12,24,48\n");
  videotrain::SourceConfig c;
  c.manifest.location = dir.file("m.csv");
  c.buckets = "48x16,16x32";
  c.num_frames = 4;
  c.num_epochs = 4;
  c.seed = 3;
  c.prefetch = 1;
  c.decode_timeout_s = 30;
  std::mutex mu;
  std::vector<std::string> warnings;
  videotrain::SourceCallbacks cb;
  cb.row_warning = [&](uint64_t, const std::string &path, const std::string &w) {
    std::lock_guard<std::mutex> g(mu);
    warnings.push_back(path + ": " + w);
  };
  videotrain::SourceEngine e(c, cb);
  std::string err;
  ASSERT_TRUE(e.start(&err)) << err;
  // (epoch, caption) -> frame bytes of its real clips (48x16 RGB: 2304, 16x32: 1536).
  std::map<std::pair<uint32_t, std::string>, std::vector<size_t>> got;
  GstBuffer *b = nullptr;
  for (;;) {
    auto p = e.next(&b, &err);
    if (p == videotrain::SourceEngine::Pull::Eos) break;
    ASSERT_EQ(p, videotrain::SourceEngine::Pull::Frame) << err;
    auto *m = gst_buffer_get_videotrain_clip_meta(b);
    ASSERT_NE(m, nullptr);
    if (m->frame_index == 0 && !m->padding)
      got[std::make_pair(m->epoch, std::string(m->caption))].push_back(gst_buffer_get_size(b));
    gst_buffer_unref(b);
  }
  e.stop();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("liar.mp4: the manifest says 480x48 but its video is 24x48"), std::string::npos)
      << warnings[0];
  const size_t at = warnings[0].find("moves to bucket 16x32x4 from epoch ");
  ASSERT_NE(at, std::string::npos) << warnings[0];
  const uint32_t from = uint32_t(std::stoul(warnings[0].substr(at + 35)));
  EXPECT_EQ(from, 1u) << warnings[0];
  const std::vector<size_t> wide{48 * 16 * 3}, tall{16 * 32 * 3};
  for (uint32_t epoch = 0; epoch < 4; epoch++) {
    EXPECT_EQ(got[std::make_pair(epoch, std::string("liar"))], epoch < from ? wide : tall) << "epoch " << epoch;
    EXPECT_EQ(got[std::make_pair(epoch, std::string("wide"))], wide) << "epoch " << epoch;
    EXPECT_EQ(got[std::make_pair(epoch, std::string("tall"))], tall) << "epoch " << epoch;
  }
}

}  // namespace

namespace {

// Two ranks' row facts met in memory, as ddptrainsink meets them in its c10d store.
struct Exchange {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint32_t, std::vector<std::vector<videotrain::RowFact>>> posted;  // epoch -> per rank
  int world = 2;
  videotrain::SourceCallbacks::Agreement agree(uint32_t epoch, const std::vector<videotrain::RowFact> &mine,
                                               std::vector<videotrain::RowFact> *all) {
    std::unique_lock<std::mutex> lk(mu);
    auto &v = posted[epoch];
    v.push_back(mine);
    cv.notify_all();
    if (!cv.wait_for(lk, std::chrono::seconds(60), [&] { return int(v.size()) == world; }))
      return videotrain::SourceCallbacks::Agreement::kFailed;
    for (const auto &p : v) all->insert(all->end(), p.begin(), p.end());
    return videotrain::SourceCallbacks::Agreement::kAgreed;
  }
};

struct RankRun {
  // (epoch, group) -> "caption:frames" of its real clips; warnings.
  std::map<std::pair<uint32_t, uint64_t>, std::vector<std::string>> groups;
  std::vector<std::string> warnings;
  std::string error;
};

// The liar (50 frames said, 20 real) among rows that fill their buckets, 4 epochs, on `world`
// ranks; with `exchange` the ranks agree through it, else they have nothing to agree through.
std::vector<RankRun> run_liar(const vttest::TempDir &dir, int world, Exchange *exchange,
                              const std::function<void(videotrain::SourceConfig &)> &shape = {}) {
  std::vector<RankRun> runs(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; rank++) {
    threads.emplace_back([&, rank] {
      RankRun &out = runs[size_t(rank)];
      videotrain::SourceConfig c;
      c.manifest.location = dir.file("m.csv");
      c.width = c.height = 16;
      c.frame_buckets = "40,8";
      c.num_epochs = 4;
      c.seed = 5;
      c.prefetch = 2;
      c.rank = rank;
      c.world_size = world;
      c.decode_timeout_s = 30;
      if (shape) shape(c);
      std::mutex mu;
      videotrain::SourceCallbacks cb;
      cb.row_warning = [&](uint64_t, const std::string &path, const std::string &w) {
        std::lock_guard<std::mutex> g(mu);
        out.warnings.push_back(path + ": " + w);
      };
      cb.warning = [&](const std::string &w) {
        std::lock_guard<std::mutex> g(mu);
        out.warnings.push_back(w);
      };
      if (exchange)
        cb.agree_rows = [exchange](uint32_t epoch, const std::vector<videotrain::RowFact> &mine,
                                   std::vector<videotrain::RowFact> *all, std::string *) {
          return exchange->agree(epoch, mine, all);
        };
      videotrain::SourceEngine e(c, cb);
      if (!e.start(&out.error)) return;
      GstBuffer *b = nullptr;
      for (;;) {
        auto p = e.next(&b, &out.error);
        if (p == videotrain::SourceEngine::Pull::Eos) break;
        if (p != videotrain::SourceEngine::Pull::Frame) return;
        auto *m = gst_buffer_get_videotrain_clip_meta(b);
        if (m && m->frame_index == 0 && !m->padding)
          out.groups[std::make_pair(m->epoch, m->group)].push_back(std::string(m->caption) + ":" +
                                                                     std::to_string(m->num_frames) + ":" +
                                                                     std::to_string(gst_buffer_get_size(b)));
        gst_buffer_unref(b);
      }
      e.stop();
    });
  }
  for (auto &t : threads) t.join();
  return runs;
}

void make_liar_set(const vttest::TempDir &dir) {
  ASSERT_TRUE(make_long_audio(dir.file("liar.mp4"), "mp4", 20, 10));
  ASSERT_TRUE(vttest::make_video(dir.file("long.mp4"), {45, 32, 24, 10, 10}));
  ASSERT_TRUE(vttest::make_video(dir.file("short.mp4"), {10, 32, 24, 10, 10}));
  vttest::write_file(dir.file("m.csv"), "path,text,num_frames\nliar.mp4,liar,50\nlong.mp4,long,45\n"
                                        "long.mp4,long2,45\nshort.mp4,short,10\nshort.mp4,short2,10\n");
}

}  // namespace

// Issues 27/28: with several ranks only the rank that decodes a lying row knows; the ranks agree
// on the row facts before each epoch, so every rank moves it from the same epoch and the group
// list (which group holds which row, in which bucket) is the one a single rank plans.
TEST(FrameCount, WithTwoRanksALyingRowMovesOnEveryRankAsWithOne) {
  vttest::TempDir dir;
  make_liar_set(dir);
  Exchange none;
  none.world = 1;
  const auto one = run_liar(dir, 1, &none);
  ASSERT_EQ(one[0].error, "");
  Exchange ex;
  const auto two = run_liar(dir, 2, &ex);
  std::map<std::pair<uint32_t, uint64_t>, std::vector<std::string>> both;
  int told = 0;
  for (const auto &r : two) {
    ASSERT_EQ(r.error, "");
    for (const auto &g : r.groups) {
      EXPECT_EQ(both.count(g.first), 0u) << "group " << g.first.second << " of epoch " << g.first.first
                                         << " on both ranks";
      both[g.first] = g.second;
    }
    for (const auto &w : r.warnings) {
      told += w.find("liar.mp4: the manifest says 50 frames but its video stream has 20") != std::string::npos;
      EXPECT_EQ(w.find("stays"), std::string::npos) << w;
      if (w.find("liar.mp4") != std::string::npos) {
        EXPECT_NE(w.find("moves to bucket 16x16x8 from epoch 1"), std::string::npos) << w;
      }
    }
  }
  EXPECT_GE(told, 1);
  EXPECT_EQ(both, one[0].groups) << "the two ranks planned other groups than one rank";
  for (const auto &g : both)
    for (const auto &clip : g.second)
      if (clip.rfind("liar:", 0) == 0) {
        EXPECT_TRUE(g.first.first >= 1 && clip.rfind("liar:8:", 0) == 0) << clip;
      }
  std::set<uint32_t> liar_epochs;
  for (const auto &g : both)
    for (const auto &clip : g.second)
      if (clip.rfind("liar:8:", 0) == 0) liar_epochs.insert(g.first.first);
  EXPECT_EQ(liar_epochs, (std::set<uint32_t>{1, 2, 3}));
}

// Without a trainer to agree through, the ranks cannot move it: it stays (and is replaced) on
// every rank alike, with a warning that says so, and the ranks still plan the same groups.
TEST(FrameCount, WithTwoRanksAndNothingToAgreeThroughALyingRowStays) {
  vttest::TempDir dir;
  make_liar_set(dir);
  const auto two = run_liar(dir, 2, nullptr);
  int stays = 0;
  for (const auto &r : two) {
    ASSERT_EQ(r.error, "");
    for (const auto &w : r.warnings) {
      EXPECT_EQ(w.find("moves"), std::string::npos) << w;
      stays += w.find("liar.mp4: the manifest says 50 frames but its video stream has 20") != std::string::npos &&
               w.find("with several ranks and no ddptrainsink downstream to agree through it stays there") !=
                   std::string::npos;
    }
    for (const auto &g : r.groups)
      for (const auto &clip : g.second) EXPECT_EQ(clip.rfind("liar:", 0), std::string::npos) << clip;
  }
  EXPECT_GE(stays, 1);
  // The same groups on both ranks as planned with one rank and no move: each group on one rank.
  std::set<std::pair<uint32_t, uint64_t>> seen;
  for (const auto &r : two)
    for (const auto &g : r.groups) EXPECT_TRUE(seen.insert(g.first).second) << "group " << g.first.second;
}

// The same for a row whose size columns lie (issue 28): a tall 24x48 video the manifest calls
// 480x48 moves from the wide bucket to the tall one from epoch 1 on both ranks, as with one.
TEST(FrameCount, WithTwoRanksARowWhoseSizeLiesMovesOnEveryRankAsWithOne) {
  vttest::TempDir dir;
  ASSERT_TRUE(vttest::make_video(dir.file("liar.mp4"), {12, 24, 48, 10, 10}));
  ASSERT_TRUE(vttest::make_video(dir.file("wide.mp4"), {12, 48, 24, 10, 10}));
  ASSERT_TRUE(vttest::make_video(dir.file("tall.mp4"), {12, 24, 48, 10, 10}));
  vttest::write_file(dir.file("m.csv"), "path,text,num_frames,width,height\nliar.mp4,liar,12,480,48\n"
                                        "wide.mp4,wide,12,48,24\ntall.mp4,tall,12,24,48\nwide.mp4,wide2,12,48,24\n");
  auto shape = [](videotrain::SourceConfig &c) {
    c.frame_buckets.clear();
    c.buckets = "48x16,16x32";
    c.num_frames = 4;
  };
  Exchange none;
  none.world = 1;
  const auto one = run_liar(dir, 1, &none, shape);
  ASSERT_EQ(one[0].error, "");
  Exchange ex;
  const auto two = run_liar(dir, 2, &ex, shape);
  std::map<std::pair<uint32_t, uint64_t>, std::vector<std::string>> both;
  for (const auto &r : two) {
    ASSERT_EQ(r.error, "");
    for (const auto &g : r.groups) EXPECT_TRUE(both.emplace(g.first, g.second).second);
  }
  EXPECT_EQ(both, one[0].groups) << "the two ranks planned other groups than one rank";
  std::set<uint32_t> tall_liar;
  for (const auto &g : both)
    for (const auto &clip : g.second)
      if (clip == "liar:4:" + std::to_string(16 * 32 * 3)) tall_liar.insert(g.first.first);
  EXPECT_EQ(tall_liar, (std::set<uint32_t>{1, 2, 3}));
}
