#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "csvvideosrc/source_engine.h"
#include "metas.h"
#include "test_util.h"

using namespace videotrain;

namespace {

struct ClipRecord {
  uint64_t sample, clip;
  uint32_t epoch;
  bool padding;
  std::string caption;
  bool operator==(const ClipRecord &o) const {
    return sample == o.sample && clip == o.clip && epoch == o.epoch && padding == o.padding && caption == o.caption;
  }
};

// Shared across tests: a handful of short videos and a manifest of them.
class SourceEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new vttest::TempDir();
    std::string csv = "path,text\n";
    for (int i = 0; i < 5; i++) {
      std::string name = "v" + std::to_string(i) + ".mp4";
      ASSERT_TRUE(vttest::make_video(dir_->file(name), {12 + i, 32, 24, 10, 5}));
      csv += name + ",\"caption " + std::to_string(i) + ", with comma\"\n";
    }
    vttest::write_file(dir_->file("good.csv"), csv);
  }
  static void TearDownTestSuite() { delete dir_; }

  SourceConfig config(const std::string &csv) {
    SourceConfig c;
    c.manifest.location = dir_->file(csv);
    c.num_frames = 4;
    c.width = 16;
    c.height = 16;
    c.clip_start = ClipStart::Random;
    c.seed = 11;
    c.decode_timeout_s = 30;
    return c;
  }

  // Runs an engine to the end; returns one record per clip and checks clip framing.
  std::vector<ClipRecord> run(SourceEngine &e, std::string *error = nullptr) {
    std::vector<ClipRecord> clips;
    GstBuffer *b = nullptr;
    std::string err;
    for (;;) {
      auto p = e.next(&b, &err);
      if (p == SourceEngine::Pull::Eos) break;
      if (p != SourceEngine::Pull::Frame) {
        if (error) *error = err;
        break;
      }
      auto *m = gst_buffer_get_videotrain_clip_meta(b);
      EXPECT_NE(m, nullptr);
      if (m) {
        EXPECT_EQ(m->num_frames, 4u);
        if (m->frame_index == 0) clips.push_back({m->sample_id, m->clip_index, m->epoch, bool(m->padding), m->caption});
        EXPECT_EQ(m->clip_index, clips.back().clip);
      }
      gst_buffer_unref(b);
    }
    return clips;
  }

  static vttest::TempDir *dir_;
};

vttest::TempDir *SourceEngineTest::dir_ = nullptr;

}  // namespace

TEST_F(SourceEngineTest, OrderIsDeterministicWhateverThePrefetch) {
  SourceConfig c = config("good.csv");
  c.num_epochs = 2;
  c.prefetch = 1;
  SourceEngine a(c, {});
  std::string err;
  ASSERT_TRUE(a.start(&err)) << err;
  auto one = run(a);
  c.prefetch = 4;
  SourceEngine b(c, {});
  ASSERT_TRUE(b.start(&err)) << err;
  auto four = run(b);
  ASSERT_EQ(one.size(), 10u);
  EXPECT_EQ(one, four);
  std::set<uint64_t> epoch0;
  for (int i = 0; i < 5; i++) {
    EXPECT_EQ(one[i].epoch, 0u);
    EXPECT_EQ(one[i].clip, uint64_t(i));
    EXPECT_EQ(one[i].caption, "caption " + std::to_string(one[i].sample) + ", with comma");
    epoch0.insert(one[i].sample);
  }
  EXPECT_EQ(epoch0.size(), 5u);
  EXPECT_EQ(one[5].epoch, 1u);
}

TEST_F(SourceEngineTest, RanksShareTheManifestAndPadToTheSameCount) {
  std::set<uint64_t> seen;
  int padding = 0;
  for (int r = 0; r < 2; r++) {
    SourceConfig c = config("good.csv");
    c.rank = r;
    c.world_size = 2;
    SourceEngine e(c, {});
    std::string err;
    ASSERT_TRUE(e.start(&err)) << err;
    auto clips = run(e);
    ASSERT_EQ(clips.size(), 3u) << "ceil(5 / 2) clips on every rank";
    for (auto &cl : clips) {
      if (cl.padding) padding++;
      else EXPECT_TRUE(seen.insert(cl.sample).second);
    }
  }
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(padding, 1);
}

TEST_F(SourceEngineTest, ResumeGivesTheClipsOfAnUninterruptedRun) {
  SourceConfig c = config("good.csv");
  c.num_epochs = 3;
  SourceEngine full(c, {});
  std::string err;
  ASSERT_TRUE(full.start(&err)) << err;
  auto all = run(full);
  ASSERT_EQ(all.size(), 15u);
  c.start_epoch = 0;
  c.start_clip = 8;  // clips consumed: rolls over to epoch 1, clip 3
  SourceEngine resumed(c, {});
  ASSERT_TRUE(resumed.start(&err)) << err;
  auto tail = run(resumed);
  ASSERT_EQ(tail.size(), 7u);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), all.begin() + 8));
}

TEST_F(SourceEngineTest, BadVideosAreReplacedAndReported) {
  vttest::write_file(dir_->file("junk.mp4"), "not a video");
  std::string csv = "video,caption\nv0.mp4,a\nmissing.mp4,b\nv1.mp4,c\njunk.mp4,d\n,no path\n";
  vttest::write_file(dir_->file("bad.csv"), csv);
  SourceConfig c = config("bad.csv");
  std::vector<ReplacedEvent> events;
  std::vector<uint64_t> epoch_replaced;
  std::mutex m;
  SourceCallbacks cb;
  cb.replaced = [&](const ReplacedEvent &e) {
    std::lock_guard<std::mutex> g(m);
    events.push_back(e);
  };
  cb.epoch_done = [&](uint32_t, uint64_t clips, uint64_t replaced, uint64_t decoded, uint64_t cached) {
    EXPECT_EQ(decoded, clips);
    EXPECT_EQ(cached, 0u);
    EXPECT_EQ(clips, 5u);
    epoch_replaced.push_back(replaced);
  };
  SourceEngine e(c, cb);
  std::string err;
  ASSERT_TRUE(e.start(&err)) << err;
  auto clips = run(e, &err);
  EXPECT_EQ(err, "");
  ASSERT_EQ(clips.size(), 5u) << "a bad sample never changes the clip count";
  for (auto &cl : clips) EXPECT_TRUE(cl.sample == 0 || cl.sample == 2) << "only good rows are emitted";
  std::multiset<uint64_t> counted;  // what validation counts: each good sample once
  for (auto &cl : clips)
    if (!cl.padding) counted.insert(cl.sample);
  EXPECT_EQ(counted, (std::multiset<uint64_t>{0, 2})) << "replacements must be flagged as padding";
  std::set<uint64_t> bad_rows;
  for (auto &ev : events) bad_rows.insert(ev.row);
  EXPECT_EQ(bad_rows, (std::set<uint64_t>{1, 3, 4}));
  EXPECT_EQ(e.stats().replaced, events.size());
  ASSERT_EQ(epoch_replaced.size(), 1u);
  EXPECT_EQ(epoch_replaced[0], events.size());
}

TEST_F(SourceEngineTest, OnErrorFailStopsWithTheRowAndReason) {
  vttest::write_file(dir_->file("fail.csv"), "path\nmissing.mp4\n");
  SourceConfig c = config("fail.csv");
  c.on_error = OnError::Fail;
  SourceEngine e(c, {});
  std::string err;
  ASSERT_TRUE(e.start(&err)) << err;
  run(e, &err);
  EXPECT_NE(err.find("missing.mp4"), std::string::npos) << err;
  EXPECT_NE(err.find("file not found"), std::string::npos) << err;
}

TEST_F(SourceEngineTest, AllBadIsAnErrorNotAHang) {
  vttest::write_file(dir_->file("allbad.csv"), "path\nx.mp4\ny.mp4\n");
  SourceEngine e(config("allbad.csv"), {});
  std::string err;
  ASSERT_TRUE(e.start(&err)) << err;
  run(e, &err);
  EXPECT_NE(err.find("no usable video"), std::string::npos) << err;
}

TEST_F(SourceEngineTest, PrefetchBoundsTheClipsHeld) {
  SourceConfig c = config("good.csv");
  c.num_epochs = 0;  // forever: only the bound stops the workers
  c.prefetch = 2;
  SourceEngine e(c, {});
  std::string err;
  ASSERT_TRUE(e.start(&err)) << err;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_LE(e.clips_held(), 2u);
  GstBuffer *b;
  ASSERT_EQ(e.next(&b, &err), SourceEngine::Pull::Frame);
  gst_buffer_unref(b);
  EXPECT_LE(e.clips_held(), 2u);
}

TEST_F(SourceEngineTest, FlushingUnblocksAndRestartSeeks) {
  SourceConfig c = config("good.csv");
  SourceEngine e(c, {});
  std::string err;
  ASSERT_TRUE(e.start(&err)) << err;
  e.set_flushing(true);
  GstBuffer *b = nullptr;
  EXPECT_EQ(e.next(&b, &err), SourceEngine::Pull::Flushing);
  e.set_flushing(false);
  e.restart_at(3);
  auto rest = run(e);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].clip, 3u);
}

TEST_F(SourceEngineTest, ConfigurationErrorsNameTheProblem) {
  std::string err;
  SourceConfig c = config("nope.csv");
  EXPECT_FALSE(SourceEngine(c, {}).start(&err));
  EXPECT_NE(err.find("nope.csv"), std::string::npos) << err;
  c = config("good.csv");
  c.start_clip = 5;  // 5 clips per epoch: the end of epoch 0 is the start of epoch 1, past num-epochs=1
  EXPECT_FALSE(SourceEngine(c, {}).start(&err));
  EXPECT_NE(err.find("past the last"), std::string::npos) << err;
  c = config("good.csv");
  c.rank = 2;
  c.world_size = 2;
  EXPECT_FALSE(SourceEngine(c, {}).start(&err));
  EXPECT_NE(err.find("rank"), std::string::npos) << err;
}

namespace {

// Collects replacement events from worker threads.
struct Replacements {
  std::mutex m;
  std::vector<ReplacedEvent> events;
  SourceCallbacks callbacks() {
    SourceCallbacks cb;
    cb.replaced = [this](const ReplacedEvent &e) {
      std::lock_guard<std::mutex> g(m);
      events.push_back(e);
    };
    return cb;
  }
};

double seconds_since(gint64 t0) { return double(g_get_monotonic_time() - t0) / G_USEC_PER_SEC; }

// Waits (bounded) until no abandoned chain is still stuck, as many as `running` before.
bool abandoned_chains_finish(uint64_t running, double timeout_s = 20) {
  const gint64 t0 = g_get_monotonic_time();
  while (abandoned_chains().running > running) {
    if (seconds_since(t0) > timeout_s) return false;
    g_usleep(50000);
  }
  return true;
}

}  // namespace

// A read() that blocks (a stalled mount, here a pipe whose writer stalls after the first bytes
// of a video): the clip is replaced at decode-timeout, the other clips flow, the stuck chain is
// left behind, and it frees itself once the read returns.
TEST_F(SourceEngineTest, AReadThatBlocksIsReplacedAtDecodeTimeout) {
  std::string head = vttest::read_file(dir_->file("v0.mp4")).substr(0, 4096);
  vttest::StalledFifo fifo(dir_->file("stall-read.mp4"), true, head);
  ASSERT_TRUE(fifo.ok());
  vttest::write_file(dir_->file("stall-read.csv"), "path\nv0.mp4\nv1.mp4\nstall-read.mp4\nv2.mp4\n");
  SourceConfig c = config("stall-read.csv");
  c.decode_timeout_s = 1;
  c.prefetch = 2;
  const AbandonedChains before = abandoned_chains();
  Replacements rep;
  SourceEngine e(c, rep.callbacks());
  std::string err;
  const gint64 t0 = g_get_monotonic_time();
  ASSERT_TRUE(e.start(&err)) << err;
  auto clips = run(e, &err);
  EXPECT_LT(seconds_since(t0), 20.0) << "the stuck row must not hold the source up past decode-timeout";
  EXPECT_EQ(err, "");
  EXPECT_EQ(clips.size(), 4u) << "the other clips still flow";
  for (auto &cl : clips) EXPECT_NE(cl.sample, 2u);
  ASSERT_EQ(rep.events.size(), 1u);
  EXPECT_EQ(rep.events[0].row, 2u);
  EXPECT_NE(rep.events[0].reason.find("timeout"), std::string::npos) << rep.events[0].reason;
  EXPECT_GT(abandoned_chains().total, before.total) << "the chain stuck in read() is abandoned, not joined";
  e.stop();
  fifo.release();  // the read returns (end of file): the abandoned chain stops by itself
  EXPECT_TRUE(abandoned_chains_finish(before.running));
}

// Without a writer, opening the pipe blocks (in filesrc's start, inside a state change).
TEST_F(SourceEngineTest, AnOpenThatBlocksIsReplacedAtDecodeTimeout) {
  vttest::StalledFifo fifo(dir_->file("stall-open.mp4"), false);
  ASSERT_TRUE(fifo.ok());
  vttest::write_file(dir_->file("stall-open.csv"), "path\nstall-open.mp4\nv1.mp4\nv2.mp4\n");
  SourceConfig c = config("stall-open.csv");
  c.decode_timeout_s = 1;
  const AbandonedChains before = abandoned_chains();
  Replacements rep;
  SourceEngine e(c, rep.callbacks());
  std::string err;
  const gint64 t0 = g_get_monotonic_time();
  ASSERT_TRUE(e.start(&err)) << err;
  auto clips = run(e, &err);
  EXPECT_LT(seconds_since(t0), 20.0);
  EXPECT_EQ(err, "");
  EXPECT_EQ(clips.size(), 3u);
  ASSERT_EQ(rep.events.size(), 1u);
  EXPECT_EQ(rep.events[0].row, 0u);
  EXPECT_NE(rep.events[0].reason.find("timeout"), std::string::npos) << rep.events[0].reason;
  EXPECT_NE(rep.events[0].reason.find("abandoned"), std::string::npos) << rep.events[0].reason;
  e.stop();
  fifo.release();
  EXPECT_TRUE(abandoned_chains_finish(before.running));
}

TEST_F(SourceEngineTest, StopDoesNotWaitForAReadThatBlocks) {
  std::string head = vttest::read_file(dir_->file("v0.mp4")).substr(0, 4096);
  vttest::StalledFifo fifo(dir_->file("stall-stop.mp4"), true, head);
  ASSERT_TRUE(fifo.ok());
  vttest::write_file(dir_->file("stall-stop.csv"), "path\nstall-stop.mp4\n");
  SourceConfig c = config("stall-stop.csv");
  c.decode_timeout_s = 600;  // stopping, not the timeout, must end it
  const AbandonedChains before = abandoned_chains();
  auto e = std::make_unique<SourceEngine>(c, SourceCallbacks{});
  std::string err;
  ASSERT_TRUE(e->start(&err)) << err;
  ASSERT_TRUE(fifo.prefix_read(30)) << "the decoder never read the pipe";
  const gint64 t0 = g_get_monotonic_time();
  e.reset();  // stops and joins the workers
  EXPECT_LT(seconds_since(t0), 10.0) << "stopping waited for the blocked read";
  EXPECT_GT(abandoned_chains().total, before.total);
  EXPECT_GT(abandoned_chains().running, before.running) << "the read is still blocked";
  fifo.release();
  EXPECT_TRUE(abandoned_chains_finish(before.running));
}

// Issue 14, item 10: 6 bad rows of 20 (missing, corrupt, truncated, too short). Each bad row
// is reported once per epoch, never chosen as a replacement, and the order does not depend
// on timing (prefetch) or on what was found bad before.
TEST_F(SourceEngineTest, BadRowsAreReportedOncePerEpochAndNeverReplaceOthers) {
  vttest::write_file(dir_->file("corrupt.mp4"), "not a video at all");
  std::string full = vttest::read_file(dir_->file("v4.mp4"));
  vttest::write_file(dir_->file("truncated.mp4"), full.substr(0, full.size() / 3));
  ASSERT_TRUE(vttest::make_video(dir_->file("short.mp4"), {2, 32, 24, 10, 5}));
  const std::set<uint64_t> bad = {1, 4, 8, 11, 15, 18};
  const char *bad_files[] = {"gone1.mp4", "corrupt.mp4", "truncated.mp4", "short.mp4", "gone2.mp4", "short.mp4"};
  std::string csv = "path,text\n";
  for (int i = 0, b = 0, g = 0; i < 20; i++)
    csv += std::string(bad.count(i) ? bad_files[b++] : "v" + std::to_string(g++ % 5) + ".mp4") + ",c\n";
  vttest::write_file(dir_->file("six-bad.csv"), csv);

  std::vector<std::vector<ClipRecord>> runs;
  for (int prefetch : {1, 4}) {
    SourceConfig c = config("six-bad.csv");
    c.num_epochs = 2;
    c.prefetch = prefetch;
    Replacements rep;
    SourceCallbacks cb = rep.callbacks();
    std::vector<uint64_t> per_epoch;
    cb.epoch_done = [&](uint32_t, uint64_t, uint64_t replaced, uint64_t, uint64_t) { per_epoch.push_back(replaced); };
    SourceEngine e(c, cb);
    std::string err;
    ASSERT_TRUE(e.start(&err)) << err;
    runs.push_back(run(e, &err));
    EXPECT_EQ(err, "");
    ASSERT_EQ(runs.back().size(), 40u) << "a bad row never changes the clip count";
    for (auto &cl : runs.back()) EXPECT_EQ(bad.count(cl.sample), 0u) << "clip " << cl.clip << " is bad row " << cl.sample;
    for (uint32_t epoch : {0u, 1u}) {
      std::multiset<uint64_t> rows;
      for (auto &ev : rep.events)
        if (ev.epoch == epoch) {
          rows.insert(ev.row);
          if (epoch == 1 && prefetch == 1) {
            // Too short is not banned (it may suit a shorter clip); its known length skips the decode.
            EXPECT_NE(ev.reason.find(ev.path.find("short.mp4") != std::string::npos ? "too few frames: the video has 2"
                                                                                     : "bad since epoch 0"),
                      std::string::npos)
                << ev.reason;
          }
        }
      EXPECT_EQ(rows, std::multiset<uint64_t>(bad.begin(), bad.end()))
          << "prefetch " << prefetch << ", epoch " << epoch << ": each bad row once";
    }
    EXPECT_EQ(per_epoch, (std::vector<uint64_t>{6, 6}));
    EXPECT_EQ(e.stats().replaced, 12u);
  }
  EXPECT_EQ(runs[0], runs[1]) << "replacements must not depend on timing";
  // A run that starts at epoch 1 knows no bad rows yet, and makes the same choices.
  SourceConfig c = config("six-bad.csv");
  c.num_epochs = 2;
  c.start_epoch = 1;
  SourceEngine resumed(c, {});
  std::string err;
  ASSERT_TRUE(resumed.start(&err)) << err;
  auto tail = run(resumed, &err);
  ASSERT_EQ(tail.size(), 20u);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), runs[0].begin() + 20));
}
