/* ddptrainsink through GstHarness and in a pipeline: step and checkpoint messages,
 * max-steps -> EOS, the resume query answered after a restart, TensorBoard files,
 * errors for bad settings and bad input. */
#include <ATen/ATen.h>
#include <gst/app/gstappsrc.h>
#include <gst/check/gstharness.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ddptrainsink/tfevents.h"
#include "metas.h"
#include "resume_query.h"
#include "tensor_buffer.h"
#include "test_util.h"

using namespace videotrain;
namespace fs = std::filesystem;

namespace {

const char *kCaps = "application/x-videotrain-tensor, content=(string)micro-batch, dtype=(string)float32, "
                    "device=(string)cpu";

GstBuffer *micro_batch(uint64_t step, unsigned idx, unsigned count, unsigned m, unsigned epoch = 0) {
  auto g = at::detail::createCPUGenerator(step * 10 + idx);
  GstBuffer *buf = buffer_from_tensor(at::randn({m, 4, 2, 8, 8}, g));
  auto *meta = gst_buffer_add_videotrain_batch_meta(buf);
  meta->step = step;
  meta->micro_index = idx;
  meta->micro_count = count;
  meta->step_samples = m * count;
  meta->sync = idx + 1 == count;
  meta->epoch = epoch;
  meta->next_clip = (step + 1) * m * count;
  for (unsigned k = 0; k < m; k++) gst_videotrain_batch_meta_append(meta, step * 100 + k, epoch, (step * count + idx) * m + k, "a caption", FALSE);
  return buf;
}

struct Harness {
  GstHarness *h = nullptr;
  GstBus *bus = nullptr;
  explicit Harness(GstElement *sink) {
    h = gst_harness_new_with_element(sink, "sink", nullptr);
    bus = gst_bus_new();
    gst_element_set_bus(h->element, bus);
  }
  ~Harness() {
    gst_harness_teardown(h);
    gst_object_unref(bus);
  }
  std::vector<GstMessage *> drain() {
    std::vector<GstMessage *> out;
    while (GstMessage *m = gst_bus_pop(bus)) out.push_back(m);
    return out;
  }
};

GstElement *make_sink() {
  GstElement *e = gst_element_factory_make("ddptrainsink", nullptr);
  EXPECT_NE(e, nullptr) << "ddptrainsink not found (GST_PLUGIN_PATH?)";
  g_object_set(e, "model", "builtin:tiny-unet3d", "device", "cpu", "rank", 0, "world-size", 1u, nullptr);
  return e;
}

std::vector<const GstStructure *> named(const std::vector<GstMessage *> &msgs, const char *name) {
  std::vector<const GstStructure *> out;
  for (auto *m : msgs)
    if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ELEMENT && gst_structure_has_name(gst_message_get_structure(m), name))
      out.push_back(gst_message_get_structure(m));
  return out;
}

void unref_all(std::vector<GstMessage *> &msgs) {
  for (auto *m : msgs) gst_message_unref(m);
  msgs.clear();
}

}  // namespace

TEST(DdpTrainSink, TrainsPostsStepsAndStopsAtMaxSteps) {
  vttest::TempDir dir;
  GstElement *sink = make_sink();
  g_object_set(sink, "log-every", 2u, "max-steps", G_GUINT64_CONSTANT(4), "checkpoint-dir", dir.file("ckpt").c_str(),
               "tensorboard-dir", dir.file("tb").c_str(), "metrics-file", dir.file("m.jsonl").c_str(), nullptr);
  Harness hs(sink);
  gst_harness_set_src_caps_str(hs.h, kCaps);
  for (uint64_t s = 0; s < 4; s++)
    for (unsigned i = 0; i < 2; i++) {
      GstFlowReturn r = gst_harness_push(hs.h, micro_batch(s, i, 2, 1));
      ASSERT_EQ(r, (s == 3 && i == 1) ? GST_FLOW_EOS : GST_FLOW_OK) << "step " << s << " micro " << i;
    }
  EXPECT_EQ(gst_harness_push(hs.h, micro_batch(4, 0, 2, 1)), GST_FLOW_EOS);
  guint64 steps = 0;
  double loss = 0;
  g_object_get(sink, "steps", &steps, "loss", &loss, nullptr);
  EXPECT_EQ(steps, 4u);
  EXPECT_TRUE(std::isfinite(loss));
  auto msgs = hs.drain();
  auto st = named(msgs, "ddptrainsink-step");
  ASSERT_EQ(st.size(), 2u);
  guint64 step = 0;
  guint epoch = 9;
  double l = 0, lr = 0, gn = 0, sps = 0, wait = -1;
  ASSERT_TRUE(gst_structure_get(st[1], "step", G_TYPE_UINT64, &step, "epoch", G_TYPE_UINT, &epoch, "loss",
                                G_TYPE_DOUBLE, &l, "lr", G_TYPE_DOUBLE, &lr, "grad-norm", G_TYPE_DOUBLE, &gn,
                                "samples-per-second", G_TYPE_DOUBLE, &sps, "data-wait", G_TYPE_DOUBLE, &wait, NULL));
  EXPECT_EQ(step, 4u);
  EXPECT_EQ(epoch, 0u);
  EXPECT_DOUBLE_EQ(lr, 1e-4);
  EXPECT_GT(sps, 0);
  EXPECT_GE(wait, 0);
  EXPECT_LE(wait, 1);
  auto ck = named(msgs, "ddptrainsink-checkpoint");
  ASSERT_EQ(ck.size(), 1u);
  EXPECT_STREQ(gst_structure_get_string(ck[0], "path"), (dir.file("ckpt") + "/step-00000004").c_str());
  unref_all(msgs);
  // TensorBoard: one file of framed records whose CRCs check out.
  std::vector<fs::path> files;
  for (auto &f : fs::directory_iterator(dir.file("tb"))) files.push_back(f.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(files[0].filename().string().find("events.out.tfevents."), std::string::npos);
  std::string data = vttest::read_file(files[0].string());
  size_t pos = 0, records = 0;
  while (pos + 12 <= data.size()) {
    uint64_t len;
    uint32_t crc_len, crc_data;
    std::memcpy(&len, data.data() + pos, 8);
    std::memcpy(&crc_len, data.data() + pos + 8, 4);
    ASSERT_EQ(crc_len, masked_crc32c(data.data() + pos, 8));
    ASSERT_LE(pos + 12 + len + 4, data.size());
    std::memcpy(&crc_data, data.data() + pos + 12 + len, 4);
    ASSERT_EQ(crc_data, masked_crc32c(data.data() + pos + 12, len));
    pos += 12 + len + 4;
    records++;
  }
  EXPECT_EQ(pos, data.size());
  EXPECT_EQ(records, 3u);  // file_version + 2 logged steps
  EXPECT_NE(data.find("train/loss"), std::string::npos);
}

TEST(DdpTrainSink, AnswersTheResumeQueryFromItsCheckpoint) {
  vttest::TempDir dir;
  {
    GstElement *sink = make_sink();
    g_object_set(sink, "checkpoint-dir", dir.path().c_str(), nullptr);
    Harness hs(sink);
    gst_harness_set_src_caps_str(hs.h, kCaps);
    // No checkpoint yet: the query is not answered.
    GstQuery *q = videotrain_resume_query_new();
    EXPECT_FALSE(gst_pad_peer_query(hs.h->srcpad, q));
    gst_query_unref(q);
    for (uint64_t s = 0; s < 3; s++) ASSERT_EQ(gst_harness_push(hs.h, micro_batch(s, 0, 1, 2, 1)), GST_FLOW_OK);
    // EOS writes the final checkpoint.
    ASSERT_TRUE(gst_harness_push_event(hs.h, gst_event_new_eos()));
    auto msgs = hs.drain();
    EXPECT_EQ(named(msgs, "ddptrainsink-checkpoint").size(), 1u);
    unref_all(msgs);
  }
  GstElement *sink = make_sink();
  g_object_set(sink, "checkpoint-dir", dir.path().c_str(), "resume", TRUE, nullptr);
  Harness hs(sink);
  gst_harness_set_src_caps_str(hs.h, kCaps);
  GstQuery *q = videotrain_resume_query_new();
  ASSERT_TRUE(gst_pad_peer_query(hs.h->srcpad, q));
  VideoTrainResumePosition pos{};
  ASSERT_TRUE(videotrain_resume_query_parse(q, &pos));
  gst_query_unref(q);
  EXPECT_EQ(pos.step, 3u);
  EXPECT_EQ(pos.epoch, 1u);
  EXPECT_EQ(pos.clip, 6u);
  ASSERT_EQ(gst_harness_push(hs.h, micro_batch(3, 0, 1, 2, 1)), GST_FLOW_OK);
  guint64 steps = 0;
  g_object_get(sink, "steps", &steps, nullptr);
  EXPECT_EQ(steps, 4u);
}

TEST(DdpTrainSink, BadSettingsAndInputAreElementErrors) {
  {
    GstElement *sink = make_sink();
    g_object_set(sink, "model", "/no/such/model.pt", nullptr);
    GstBus *bus = gst_bus_new();
    gst_element_set_bus(sink, bus);
    EXPECT_EQ(gst_element_set_state(sink, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
    GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR);
    ASSERT_NE(m, nullptr);
    GError *err = nullptr;
    gst_message_parse_error(m, &err, nullptr);
    EXPECT_NE(std::string(err->message).find("/no/such/model.pt"), std::string::npos) << err->message;
    g_error_free(err);
    gst_message_unref(m);
    gst_element_set_state(sink, GST_STATE_NULL);
    gst_object_unref(sink);
    gst_object_unref(bus);
  }
  {
    // A CUDA-only (or, on LibTorch 1.13, a 2.x-only) attention kernel on the CPU: an error at start naming it.
    GstElement *sink = make_sink();
    const std::string model = vttest::reference_dir() + "/dit/wan_t2v_tiny";
    gst_util_set_object_arg(G_OBJECT(sink), "attention-backend", "efficient");
    g_object_set(sink, "model", model.c_str(), "device", "cpu", nullptr);
    GstBus *bus = gst_bus_new();
    gst_element_set_bus(sink, bus);
    EXPECT_EQ(gst_element_set_state(sink, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
    GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR);
    ASSERT_NE(m, nullptr);
    GError *err = nullptr;
    gchar *dbg = nullptr;
    gst_message_parse_error(m, &err, &dbg);
    const std::string text = std::string(err->message) + " " + (dbg ? dbg : "");
    EXPECT_NE(text.find("attention-backend=efficient"), std::string::npos) << text;
    g_error_free(err);
    g_free(dbg);
    gst_message_unref(m);
    gst_element_set_state(sink, GST_STATE_NULL);
    gst_object_unref(sink);
    gst_object_unref(bus);
  }
  {
    Harness hs(make_sink());
    gst_harness_set_src_caps_str(hs.h, kCaps);
    GstBuffer *bad = buffer_from_tensor(at::zeros({4, 8, 8}));
    // The error is posted; FLUSHING stops upstream without a second error of its own.
    EXPECT_EQ(gst_harness_push(hs.h, bad), GST_FLOW_FLUSHING);
    auto msgs = hs.drain();
    bool found = false;
    for (auto *m : msgs)
      if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
        GError *err = nullptr;
        gst_message_parse_error(m, &err, nullptr);
        found = std::string(err->message).find("[m, C, t, h, w]") != std::string::npos;
        g_error_free(err);
      }
    EXPECT_TRUE(found);
    unref_all(msgs);
  }
}

TEST(DdpTrainSink, AnUnwritableCheckpointDirFailsAtStartAndAStopWithoutEosWritesARescueCheckpoint) {
  vttest::TempDir dir;
  vttest::write_file(dir.file("a-file"), "");
  {
    GstElement *sink = make_sink();
    const std::string bad = dir.file("a-file/ckpt");  // root ignores modes, not a file in the path
    g_object_set(sink, "checkpoint-dir", bad.c_str(), nullptr);
    GstBus *bus = gst_bus_new();
    gst_element_set_bus(sink, bus);
    EXPECT_EQ(gst_element_set_state(sink, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
    GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR);
    ASSERT_NE(m, nullptr);
    GError *err = nullptr;
    gst_message_parse_error(m, &err, nullptr);
    EXPECT_NE(std::string(err->message).find("'" + bad + "': Not a directory"), std::string::npos) << err->message;
    g_error_free(err);
    gst_message_unref(m);
    gst_element_set_state(sink, GST_STATE_NULL);
    gst_object_unref(sink);
    gst_object_unref(bus);
  }
  // Two steps, no checkpoint yet, then a stop without EOS (gst-launch-1.0 without -e).
  GstElement *sink = make_sink();
  g_object_set(sink, "checkpoint-dir", dir.file("ckpt").c_str(), nullptr);
  Harness hs(sink);
  gst_harness_set_src_caps_str(hs.h, kCaps);
  for (uint64_t s = 0; s < 2; s++) ASSERT_EQ(gst_harness_push(hs.h, micro_batch(s, 0, 1, 2)), GST_FLOW_OK);
  auto msgs = hs.drain();
  unref_all(msgs);
  gst_element_set_state(hs.h->element, GST_STATE_NULL);
  msgs = hs.drain();
  std::string warning;
  bool rescue_message = false;
  for (auto *m : msgs) {
    if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_WARNING) {
      GError *err = nullptr;
      gst_message_parse_warning(m, &err, nullptr);
      warning += err->message;
      g_error_free(err);
    }
    const GstStructure *st = gst_message_get_structure(m);
    gboolean rescue = FALSE;
    guint64 step = 0;
    if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ELEMENT && gst_structure_has_name(st, "ddptrainsink-checkpoint") &&
        gst_structure_get_boolean(st, "rescue", &rescue) && rescue && gst_structure_get_uint64(st, "step", &step))
      rescue_message = step == 2;
  }
  // Nothing trained is lost: rank 0 writes the last completed step (no collective).
  EXPECT_NE(warning.find("wrote a rescue checkpoint of step 2 to " + dir.file("ckpt/step-00000002")),
            std::string::npos)
      << warning;
  EXPECT_EQ(warning.find("not in a checkpoint"), std::string::npos) << warning;
  EXPECT_TRUE(rescue_message) << "a ddptrainsink-checkpoint message with rescue=true and step=2";
  EXPECT_TRUE(std::filesystem::exists(dir.file("ckpt/step-00000002/manifest.json")));
  unref_all(msgs);
}

TEST(DdpTrainSink, TrainsInAPipelineFromMicrobatcher) {
  // appsrc of latents -> microbatcher -> ddptrainsink, to EOS.
  GError *err = nullptr;
  GstElement *pipe = gst_parse_launch(
      "appsrc name=src format=time caps=\"application/x-videotrain-tensor, content=(string)latents, "
      "dtype=(string)float32, device=(string)cpu\" ! microbatcher batch-size=4 micro-batch-size=2 ! "
      "ddptrainsink name=t model=builtin:tiny-unet3d device=cpu log-every=1 rank=0 world-size=1",
      &err);
  ASSERT_NE(pipe, nullptr) << (err ? err->message : "");
  GstElement *src = gst_bin_get_by_name(GST_BIN(pipe), "src");
  GstElement *t = gst_bin_get_by_name(GST_BIN(pipe), "t");
  ASSERT_EQ(gst_element_set_state(pipe, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE, true);
  for (int k = 0; k < 12; k++) {
    auto g = at::detail::createCPUGenerator(k);
    GstBuffer *b = buffer_from_tensor(at::randn({4, 2, 8, 8}, g));
    auto *m = gst_buffer_add_videotrain_sample_meta(b, "a caption", "x.mp4");
    m->sample_id = k;
    m->clip_index = k;
    GST_BUFFER_PTS(b) = k * GST_SECOND;
    GST_BUFFER_DURATION(b) = GST_SECOND;
    ASSERT_EQ(gst_app_src_push_buffer(GST_APP_SRC(src), b), GST_FLOW_OK);
  }
  gst_app_src_end_of_stream(GST_APP_SRC(src));
  GstBus *bus = gst_element_get_bus(pipe);
  int steps_seen = 0;
  bool eos = false;
  while (!eos) {
    GstMessage *m = gst_bus_timed_pop(bus, 60 * GST_SECOND);
    ASSERT_NE(m, nullptr) << "timeout";
    if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
      GError *e = nullptr;
      gst_message_parse_error(m, &e, nullptr);
      ADD_FAILURE() << e->message;
      g_error_free(e);
      eos = true;
    } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS) {
      eos = true;
    } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ELEMENT &&
               gst_structure_has_name(gst_message_get_structure(m), "ddptrainsink-step")) {
      steps_seen++;
    }
    gst_message_unref(m);
  }
  EXPECT_EQ(steps_seen, 3);
  guint64 steps = 0;
  g_object_get(t, "steps", &steps, nullptr);
  EXPECT_EQ(steps, 3u);
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_object_unref(bus);
  gst_object_unref(src);
  gst_object_unref(t);
  gst_object_unref(pipe);
}
