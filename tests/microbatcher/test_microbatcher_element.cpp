/* microbatcher through GstHarness: stacked micro-batches, batch metas, steps across
 * epochs, EOS and flush handling, bad input, caps refusal, latency. */
#include <ATen/ATen.h>
#include <gst/app/gstappsink.h>
#include <gst/app/gstappsrc.h>
#include <gst/check/gstharness.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "metas.h"
#include "resume_query.h"
#include "tensor_buffer.h"
#include "tensor_caps.h"

using namespace videotrain;

namespace {

const char *kLatentCaps = "application/x-videotrain-tensor, content=(string)latents, dtype=(string)float32, "
                          "device=(string)cpu";
const std::vector<int64_t> A = {4, 2, 8, 8};
const std::vector<int64_t> B = {4, 3, 6, 10};
constexpr GstClockTime kDur = 40 * GST_MSECOND;

struct Latent {
  uint64_t id;
  std::vector<int64_t> shape = A;
  uint32_t epoch = 0;
  uint64_t clip = 0;
  bool padding = false;
};

// A latent buffer filled with its sample id (so the stacked rows can be told apart).
GstBuffer *latent(const Latent &l, GstClockTime pts) {
  GstBuffer *buf = buffer_from_tensor(at::full(l.shape, static_cast<double>(l.id), at::kFloat));
  std::string caption = "caption " + std::to_string(l.id);
  std::string path = "video" + std::to_string(l.id) + ".mp4";
  auto *m = gst_buffer_add_videotrain_sample_meta(buf, caption.c_str(), path.c_str());
  m->sample_id = l.id;
  m->epoch = l.epoch;
  m->clip_index = l.clip;
  m->padding = l.padding;
  GST_BUFFER_PTS(buf) = pts;
  GST_BUFFER_DURATION(buf) = kDur;
  return buf;
}

GstElement *make_batcher(guint batch, guint micro) {
  GstElement *e = gst_element_factory_make("microbatcher", nullptr);
  EXPECT_NE(e, nullptr) << "microbatcher not found (GST_PLUGIN_PATH?)";
  if (e) g_object_set(e, "batch-size", batch, "micro-batch-size", micro, nullptr);
  return e;
}

// Harness around an element whose properties are already set; a bus collects errors.
struct Harness {
  GstHarness *h = nullptr;
  GstBus *bus = nullptr;
  uint64_t pts = 0;

  explicit Harness(GstElement *e, const char *caps = kLatentCaps) {
    bus = gst_bus_new();
    gst_element_set_bus(e, bus);
    h = gst_harness_new_with_element(e, "sink", "src");
    gst_object_unref(e);
    if (caps) gst_harness_set_src_caps_str(h, caps);
  }
  ~Harness() {
    gst_bus_set_flushing(bus, TRUE);  // queued messages hold the element
    gst_harness_teardown(h);
    gst_object_unref(bus);
  }
  // csvvideosrc's epoch-end event, serialized after the epoch's last buffer.
  bool end_epoch(guint epoch) {
    return gst_harness_push_event(
        h, gst_event_new_custom(GST_EVENT_CUSTOM_DOWNSTREAM,
                                gst_structure_new(GST_VIDEOTRAIN_EPOCH_EVENT, "epoch", G_TYPE_UINT, epoch, nullptr)));
  }
  GstFlowReturn push(const Latent &l) {
    GstFlowReturn r = gst_harness_push(h, latent(l, pts));
    pts += kDur;
    return r;
  }
  std::vector<GstBuffer *> pull_all() {
    std::vector<GstBuffer *> out;
    while (GstBuffer *b = gst_harness_try_pull(h)) out.push_back(b);
    return out;
  }
  // Text of the first error on the bus ("" if none).
  std::string error() {
    GstMessage *msg = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR);
    if (!msg) return "";
    GError *err = nullptr;
    gchar *dbg = nullptr;
    gst_message_parse_error(msg, &err, &dbg);
    std::string s = std::string(err->message) + " | " + (dbg ? dbg : "");
    g_error_free(err);
    g_free(dbg);
    gst_message_unref(msg);
    return s;
  }
};

struct Batch {
  std::vector<int64_t> shape;
  std::vector<uint64_t> rows;  // value of each stacked row (= sample id)
  BatchInfo meta;
  std::vector<uint64_t> ids;
  std::vector<std::string> captions;
  std::vector<bool> padding;
  GstClockTime pts;
};

Batch inspect(GstBuffer *buf) {
  Batch b{};
  std::string why;
  auto t = tensor_from_buffer(buf, &why);
  EXPECT_TRUE(t.has_value()) << why;
  if (t) {
    b.shape = t->sizes().vec();
    for (int64_t i = 0; i < t->size(0); i++) {
      at::Tensor row = (*t)[i];
      double v = row.flatten()[0].item<double>();
      EXPECT_TRUE(row.eq(v).all().item<bool>()) << "row " << i << " mixes samples";
      b.rows.push_back(static_cast<uint64_t>(v));
    }
  }
  EXPECT_TRUE(read_batch_meta(buf, &b.meta));
  b.ids = b.meta.sample_ids;
  b.captions = b.meta.captions;
  b.padding = b.meta.padding;
  b.pts = GST_BUFFER_PTS(buf);
  gst_buffer_unref(buf);
  return b;
}

std::vector<Batch> inspect_all(Harness &h) {
  std::vector<Batch> out;
  for (GstBuffer *b : h.pull_all()) out.push_back(inspect(b));
  return out;
}

std::vector<int64_t> with_m(int64_t m, const std::vector<int64_t> &s) {
  std::vector<int64_t> r{m};
  r.insert(r.end(), s.begin(), s.end());
  return r;
}

bool saw_eos(Harness &h) {
  while (GstEvent *e = gst_harness_try_pull_event(h.h)) {
    bool eos = GST_EVENT_TYPE(e) == GST_EVENT_EOS;
    gst_event_unref(e);
    if (eos) return true;
  }
  return false;
}

// Fails each test cleanly (instead of aborting in the harness) when the plugin
// cannot be loaded.
class MicroBatcherElement : public ::testing::Test {
 protected:
  void SetUp() override {
    GstElementFactory *f = gst_element_factory_find("microbatcher");
    ASSERT_NE(f, nullptr) << "microbatcher not found: is libgstvideotrain built and loadable (GST_PLUGIN_PATH)?";
    gst_object_unref(f);
  }
};

}  // namespace

TEST_F(MicroBatcherElement, GroupsByShapeStacksAndMarksTheStep) {
  Harness h(make_batcher(4, 2));
  // Arrival: A B A A -> micro-batches [A: 0 2] [A: 3] [B: 1]
  ASSERT_EQ(h.push({0, A, 0, 0}), GST_FLOW_OK);
  ASSERT_EQ(h.push({1, B, 0, 1, true}), GST_FLOW_OK);
  ASSERT_EQ(h.push({2, A, 0, 2}), GST_FLOW_OK);
  EXPECT_EQ(gst_harness_buffers_in_queue(h.h), 0u);  // a step is emitted when complete
  ASSERT_EQ(h.push({3, A, 0, 3}), GST_FLOW_OK);
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 3u);

  EXPECT_EQ(out[0].shape, with_m(2, A));
  EXPECT_EQ(out[0].rows, (std::vector<uint64_t>{0, 2}));
  EXPECT_EQ(out[0].ids, out[0].rows);
  EXPECT_EQ(out[0].captions, (std::vector<std::string>{"caption 0", "caption 2"}));
  EXPECT_EQ(out[0].pts, 0u);
  EXPECT_EQ(out[1].shape, with_m(1, A));
  EXPECT_EQ(out[1].rows, (std::vector<uint64_t>{3}));
  EXPECT_EQ(out[1].pts, 3 * kDur);
  EXPECT_EQ(out[2].shape, with_m(1, B));
  EXPECT_EQ(out[2].rows, (std::vector<uint64_t>{1}));
  EXPECT_EQ(out[2].ids, (std::vector<uint64_t>{1}));
  EXPECT_EQ(out[2].padding, (std::vector<bool>{true}));
  EXPECT_EQ(out[2].pts, kDur);
  for (guint i = 0; i < 3; i++) {
    EXPECT_EQ(out[i].meta.step, 0u);
    EXPECT_EQ(out[i].meta.micro_index, i);
    EXPECT_EQ(out[i].meta.micro_count, 3u);
    EXPECT_EQ(out[i].meta.step_samples, 4u);
    EXPECT_EQ(out[i].meta.sync, i == 2);
    EXPECT_EQ(out[i].meta.epoch, 0u);
    EXPECT_EQ(out[i].meta.next_clip, 4u);
  }

  // Output caps: micro-batch with the input's dtype and device.
  GstCaps *caps = gst_pad_get_current_caps(h.h->sinkpad);
  ASSERT_NE(caps, nullptr);
  TensorCapsInfo info;
  std::string why;
  ASSERT_TRUE(tensor_caps_parse(caps, &info, &why)) << why;
  gst_caps_unref(caps);
  EXPECT_EQ(info.content, "micro-batch");
  EXPECT_EQ(info.dtype, "float32");
  EXPECT_EQ(info.device, "cpu");
}

TEST_F(MicroBatcherElement, StepNumbersContinueAcrossEpochs) {
  GstElement *e = make_batcher(2, 0);
  g_object_set(e, "start-step", (guint64)10, nullptr);
  Harness h(e);
  ASSERT_EQ(h.push({0, A, 0, 0}), GST_FLOW_OK);
  ASSERT_EQ(h.push({1, A, 0, 1}), GST_FLOW_OK);
  ASSERT_EQ(h.push({2, A, 0, 2}), GST_FLOW_OK);
  ASSERT_TRUE(h.end_epoch(0));  // closes step 11 = {2}
  ASSERT_EQ(h.push({3, A, 1, 0}), GST_FLOW_OK);
  ASSERT_EQ(h.push({4, A, 1, 1}), GST_FLOW_OK);
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[1].meta.clip_indices, (std::vector<uint64_t>{2}));
  EXPECT_EQ(out[2].meta.clip_indices, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(out[2].meta.epochs, (std::vector<uint32_t>{1, 1}));
  EXPECT_EQ(out[0].meta.step, 10u);
  EXPECT_EQ(out[0].rows, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(out[1].meta.step, 11u);
  EXPECT_EQ(out[1].rows, (std::vector<uint64_t>{2}));
  EXPECT_EQ(out[1].meta.step_samples, 1u);
  EXPECT_TRUE(out[1].meta.sync);
  EXPECT_EQ(out[1].meta.epoch, 0u);
  EXPECT_EQ(out[1].meta.next_clip, 3u);
  EXPECT_EQ(out[2].meta.step, 12u);
  EXPECT_EQ(out[2].rows, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(out[2].meta.epoch, 1u);
  EXPECT_EQ(out[2].meta.next_clip, 2u);
}

// Stands in for a resuming trainer.
static gboolean answer_resume(GstPad *pad, GstObject *parent, GstQuery *q) {
  if (!videotrain_is_resume_query(q)) return gst_pad_query_default(pad, parent, q);
  VideoTrainResumePosition pos{1, 4, 37};
  videotrain_resume_query_answer(q, &pos);
  return TRUE;
}

// A trainer resuming from a checkpoint answers the resume query: steps continue from its step.
TEST_F(MicroBatcherElement, ResumeQueryAnswerSetsTheNextStep) {
  Harness h(make_batcher(2, 0));
  gst_pad_set_query_function(h.h->sinkpad, answer_resume);
  GstQuery *q = videotrain_resume_query_new();
  ASSERT_TRUE(gst_pad_peer_query(h.h->srcpad, q)) << "microbatcher forwards the query downstream";
  VideoTrainResumePosition pos;
  ASSERT_TRUE(videotrain_resume_query_parse(q, &pos));
  EXPECT_EQ(pos.step, 37u);
  gst_query_unref(q);
  ASSERT_EQ(h.push({0, A, 1, 4}), GST_FLOW_OK);
  ASSERT_EQ(h.push({1, A, 1, 5}), GST_FLOW_OK);
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].meta.step, 37u);
}

TEST_F(MicroBatcherElement, EpochEndEventClosesStep) {
  Harness h(make_batcher(4, 2));
  ASSERT_EQ(h.push({0, A}), GST_FLOW_OK);
  ASSERT_TRUE(h.end_epoch(0));
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rows, (std::vector<uint64_t>{0}));
  EXPECT_TRUE(out[0].meta.sync);
}

// The epoch end arrives one way: an epoch change in the sample metas alone closes nothing,
// and the batch meta keeps each sample's own epoch and clip index.
TEST_F(MicroBatcherElement, EpochChangeWithoutEventKeepsTheStepOpen) {
  Harness h(make_batcher(2, 0));
  ASSERT_EQ(h.push({5, A, 0, 7}), GST_FLOW_OK);
  ASSERT_EQ(h.push({6, A, 1, 0}), GST_FLOW_OK);
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].meta.sample_ids, (std::vector<uint64_t>{5, 6}));
  EXPECT_EQ(out[0].meta.epochs, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(out[0].meta.clip_indices, (std::vector<uint64_t>{7, 0}));
}

TEST_F(MicroBatcherElement, EpochBoundaryOffIgnoresTheEvent) {
  GstElement *e = make_batcher(2, 0);
  g_object_set(e, "epoch-boundary", FALSE, nullptr);
  Harness h(e);
  ASSERT_EQ(h.push({0, A, 0, 0}), GST_FLOW_OK);
  ASSERT_TRUE(h.end_epoch(0));
  ASSERT_EQ(h.push({1, A, 1, 0}), GST_FLOW_OK);
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rows, (std::vector<uint64_t>{0, 1}));
}

TEST_F(MicroBatcherElement, DtypeChangeEmitsHeldSamplesUnderOldCaps) {
  Harness h(make_batcher(2, 1));
  ASSERT_EQ(h.push({0, A}), GST_FLOW_OK);
  gst_harness_set_src_caps_str(h.h, "application/x-videotrain-tensor, content=(string)latents, "
                                    "dtype=(string)float16, device=(string)cpu");
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rows, (std::vector<uint64_t>{0}));
  EXPECT_EQ(out[0].meta.step_samples, 1u);
  GstCaps *caps = gst_pad_get_current_caps(h.h->sinkpad);
  ASSERT_NE(caps, nullptr);
  EXPECT_STREQ(gst_structure_get_string(gst_caps_get_structure(caps, 0), "dtype"), "float16");
  gst_caps_unref(caps);
}

// vaeencoder's input may change size at any clip (buckets): the latent caps stay, each buffer
// carries its shape. Caps sent again unchanged in the middle of a step keep the step whole.
TEST_F(MicroBatcherElement, ReSentCapsKeepTheStepAndShapesChangePerBuffer) {
  Harness h(make_batcher(2, 1));
  ASSERT_EQ(h.push({0, A, 0, 0}), GST_FLOW_OK);
  GstCaps *caps = gst_caps_from_string(kLatentCaps);
  ASSERT_TRUE(gst_harness_push_event(h.h, gst_event_new_caps(caps)));
  gst_caps_unref(caps);
  ASSERT_EQ(h.push({1, B, 0, 1}), GST_FLOW_OK);
  ASSERT_EQ(h.push({2, B, 0, 2}), GST_FLOW_OK);
  ASSERT_EQ(h.push({3, A, 0, 3}), GST_FLOW_OK);
  auto out = inspect_all(h);
  EXPECT_EQ(h.error(), "");
  ASSERT_EQ(out.size(), 4u);
  const std::vector<std::vector<int64_t>> shapes{with_m(1, A), with_m(1, B), with_m(1, B), with_m(1, A)};
  for (size_t i = 0; i < out.size(); i++) {
    EXPECT_EQ(out[i].rows, (std::vector<uint64_t>{i}));
    EXPECT_EQ(out[i].shape, shapes[i]);
    EXPECT_EQ(out[i].meta.step, i / 2);
    EXPECT_EQ(out[i].meta.step_samples, 2u) << "the re-sent caps did not close step 0 early";
  }
}

TEST_F(MicroBatcherElement, EosEmitsPartialStepBeforeEos) {
  Harness h(make_batcher(8, 2));
  for (uint64_t i = 0; i < 3; i++) ASSERT_EQ(h.push({i, A, 0, i}), GST_FLOW_OK);
  EXPECT_EQ(gst_harness_buffers_in_queue(h.h), 0u);
  ASSERT_TRUE(gst_harness_push_event(h.h, gst_event_new_eos()));
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].rows, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(out[1].rows, (std::vector<uint64_t>{2}));
  EXPECT_EQ(out[1].meta.micro_count, 2u);
  EXPECT_EQ(out[1].meta.step_samples, 3u);
  EXPECT_TRUE(out[1].meta.sync);
  EXPECT_TRUE(saw_eos(h));
}

TEST_F(MicroBatcherElement, DropLastDropsPartialStep) {
  GstElement *e = make_batcher(2, 1);
  g_object_set(e, "drop-last", TRUE, nullptr);
  Harness h(e);
  for (uint64_t i = 0; i < 3; i++) ASSERT_EQ(h.push({i, A, 0, i}), GST_FLOW_OK);  // {0,1} full, {2} partial
  ASSERT_TRUE(h.end_epoch(0));                   // epoch end drops {2}
  ASSERT_EQ(h.push({3, A, 1, 0}), GST_FLOW_OK);
  ASSERT_TRUE(gst_harness_push_event(h.h, gst_event_new_eos()));  // EOS drops {3}
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].rows, (std::vector<uint64_t>{0}));
  EXPECT_EQ(out[1].rows, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(out[1].meta.sync);
  EXPECT_TRUE(saw_eos(h));
}

TEST_F(MicroBatcherElement, FlushDropsHeldSamples) {
  Harness h(make_batcher(4, 4));
  ASSERT_EQ(h.push({0, A}), GST_FLOW_OK);
  ASSERT_EQ(h.push({1, A}), GST_FLOW_OK);
  ASSERT_TRUE(gst_harness_push_event(h.h, gst_event_new_flush_start()));
  ASSERT_TRUE(gst_harness_push_event(h.h, gst_event_new_flush_stop(TRUE)));
  GstSegment seg;
  gst_segment_init(&seg, GST_FORMAT_TIME);
  ASSERT_TRUE(gst_harness_push_event(h.h, gst_event_new_segment(&seg)));
  for (uint64_t i = 10; i < 14; i++) ASSERT_EQ(h.push({i, A}), GST_FLOW_OK);
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rows, (std::vector<uint64_t>{10, 11, 12, 13}));
  EXPECT_EQ(out[0].meta.step, 0u);  // the flushed samples did not make a step
  ASSERT_TRUE(gst_harness_push_event(h.h, gst_event_new_eos()));
  EXPECT_EQ(gst_harness_buffers_in_queue(h.h), 0u);
}

TEST_F(MicroBatcherElement, BufferWithoutSampleMetaIsAnError) {
  Harness h(make_batcher(2, 1));
  GstBuffer *buf = buffer_from_tensor(at::zeros(A, at::kFloat));
  EXPECT_EQ(gst_harness_push(h.h, buf), GST_FLOW_ERROR);
  std::string err = h.error();
  EXPECT_NE(err.find("no sample meta"), std::string::npos) << err;
}

TEST_F(MicroBatcherElement, UnstackableTensorIsAnErrorNamingTheSample) {
  Harness h(make_batcher(2, 1));
  EXPECT_EQ(h.push({42, {4, 8, 8}}), GST_FLOW_ERROR);  // 3 dims
  std::string err = h.error();
  EXPECT_NE(err.find("sample 42"), std::string::npos) << err;
  EXPECT_NE(err.find("4 dims"), std::string::npos) << err;
}

TEST_F(MicroBatcherElement, DtypeOtherThanCapsIsAnError) {
  Harness h(make_batcher(2, 1));
  GstBuffer *buf = buffer_from_tensor(at::zeros(A, at::kHalf));
  auto *m = gst_buffer_add_videotrain_sample_meta(buf, "c", "p.mp4");
  m->sample_id = 7;
  EXPECT_EQ(gst_harness_push(h.h, buf), GST_FLOW_ERROR);
  std::string err = h.error();
  EXPECT_NE(err.find("sample 7"), std::string::npos) << err;
  EXPECT_NE(err.find("float16"), std::string::npos) << err;
}

TEST_F(MicroBatcherElement, NoBucketMixedShapesIsAnErrorNamingTheSamples) {
  GstElement *e = make_batcher(4, 2);
  g_object_set(e, "bucket", FALSE, nullptr);
  Harness h(e);
  ASSERT_EQ(h.push({5, A}), GST_FLOW_OK);
  EXPECT_EQ(h.push({6, B}), GST_FLOW_ERROR);
  std::string err = h.error();
  EXPECT_NE(err.find("sample 5"), std::string::npos) << err;
  EXPECT_NE(err.find("sample 6"), std::string::npos) << err;
}

TEST_F(MicroBatcherElement, NoBucketKeepsArrivalOrder) {
  GstElement *e = make_batcher(4, 2);
  g_object_set(e, "bucket", FALSE, nullptr);
  Harness h(e);
  // Arrival 3 1 | 2 0 with shapes A A | B B: each micro-batch is uniform, nothing is reordered.
  ASSERT_EQ(h.push({3, A}), GST_FLOW_OK);
  ASSERT_EQ(h.push({1, A}), GST_FLOW_OK);
  ASSERT_EQ(h.push({2, B}), GST_FLOW_OK);
  ASSERT_EQ(h.push({0, B}), GST_FLOW_OK);
  auto out = inspect_all(h);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].rows, (std::vector<uint64_t>{3, 1}));
  EXPECT_EQ(out[1].rows, (std::vector<uint64_t>{2, 0}));
  EXPECT_EQ(out[0].ids, (std::vector<uint64_t>{3, 1}));
  EXPECT_EQ(out[1].ids, (std::vector<uint64_t>{2, 0}));
}

TEST_F(MicroBatcherElement, UnknownContentIsRefusedAtNegotiation) {
  Harness h(make_batcher(2, 1), nullptr);
  GstPad *sink = gst_element_get_static_pad(h.h->element, "sink");
  GstCaps *bad = gst_caps_from_string(
      "application/x-videotrain-tensor, content=(string)frames, dtype=(string)float32, device=(string)cpu");
  GstCaps *mb = gst_caps_from_string(
      "application/x-videotrain-tensor, content=(string)micro-batch, dtype=(string)float32, device=(string)cpu");
  GstCaps *good = gst_caps_from_string(kLatentCaps);
  EXPECT_FALSE(gst_pad_query_accept_caps(sink, bad));
  EXPECT_FALSE(gst_pad_query_accept_caps(sink, mb));
  EXPECT_TRUE(gst_pad_query_accept_caps(sink, good));
  gst_pad_push_event(h.h->srcpad, gst_event_new_stream_start("mb-test"));
  EXPECT_FALSE(gst_pad_send_event(sink, gst_event_new_caps(bad)));
  // Sticky: stored on the harness pad, refused again when the buffer carries it over.
  gst_pad_push_event(h.h->srcpad, gst_event_new_caps(bad));
  GstSegment seg;
  gst_segment_init(&seg, GST_FORMAT_TIME);
  gst_pad_push_event(h.h->srcpad, gst_event_new_segment(&seg));
  EXPECT_EQ(h.push({0, A}), GST_FLOW_NOT_NEGOTIATED);
  gst_caps_unref(bad);
  gst_caps_unref(mb);
  gst_caps_unref(good);
  gst_object_unref(sink);
}

TEST_F(MicroBatcherElement, MicroBatchSizeNotDividingIsAnErrorAtStart) {
  GstElement *e = make_batcher(8, 3);
  GstBus *bus = gst_bus_new();
  gst_element_set_bus(e, bus);
  EXPECT_EQ(gst_element_set_state(e, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
  GstMessage *msg = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR);
  ASSERT_NE(msg, nullptr);
  GError *err = nullptr;
  gst_message_parse_error(msg, &err, nullptr);
  std::string text = err->message;
  EXPECT_NE(text.find("micro-batch-size=3"), std::string::npos) << text;
  EXPECT_NE(text.find("batch-size=8"), std::string::npos) << text;
  g_error_free(err);
  gst_message_unref(msg);
  gst_element_set_state(e, GST_STATE_NULL);
  gst_bus_set_flushing(bus, TRUE);
  gst_element_set_bus(e, nullptr);
  gst_object_unref(bus);
  gst_object_unref(e);
}

TEST_F(MicroBatcherElement, LatencyCoversOneStep) {
  Harness h(make_batcher(4, 2));
  gst_harness_set_upstream_latency(h.h, 10 * GST_MSECOND);
  GstQuery *q = gst_query_new_latency();
  // Before any buffer the per-sample duration is unknown: unlimited max.
  ASSERT_TRUE(gst_pad_peer_query(h.h->sinkpad, q));
  gboolean live;
  GstClockTime min, max;
  gst_query_parse_latency(q, &live, &min, &max);
  EXPECT_EQ(min, 10 * GST_MSECOND);
  EXPECT_EQ(max, GST_CLOCK_TIME_NONE);
  gst_query_unref(q);

  ASSERT_EQ(h.push({0, A}), GST_FLOW_OK);
  q = gst_query_new_latency();
  ASSERT_TRUE(gst_pad_peer_query(h.h->sinkpad, q));
  gst_query_parse_latency(q, &live, &min, &max);
  EXPECT_EQ(min, 10 * GST_MSECOND + 3 * kDur);
  gst_query_unref(q);
}

TEST_F(MicroBatcherElement, PropertiesHaveDocumentedDefaults) {
  GstElement *e = make_batcher(1, 0);
  ASSERT_NE(e, nullptr);
  GObjectClass *oc = G_OBJECT_GET_CLASS(e);
  for (const char *name : {"batch-size", "micro-batch-size", "bucket", "drop-last", "epoch-boundary", "start-step"}) {
    GParamSpec *p = g_object_class_find_property(oc, name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_TRUE(p->flags & GST_PARAM_MUTABLE_READY) << name;
    EXPECT_NE(g_param_spec_get_blurb(p), nullptr) << name;
  }
  gboolean bucket, drop_last, boundary;
  guint micro;
  g_object_get(e, "bucket", &bucket, "drop-last", &drop_last, "epoch-boundary", &boundary, "micro-batch-size",
               &micro, nullptr);
  EXPECT_TRUE(bucket);
  EXPECT_FALSE(drop_last);
  EXPECT_TRUE(boundary);
  EXPECT_EQ(micro, 0u);
  gst_object_unref(e);
}

// A real pipeline whose sink takes one buffer at a time: caps negotiate through the
// caps queries, every sample comes out once, and EOS flushes the partial step.
TEST_F(MicroBatcherElement, PipelineWithBlockingSinkReachesEos) {
  GError *err = nullptr;
  std::string desc = std::string("appsrc name=src format=time caps=\"") + kLatentCaps +
                     "\" ! microbatcher batch-size=4 micro-batch-size=2 ! queue max-size-buffers=1 ! "
                     "appsink name=sink sync=false max-buffers=1";
  GstElement *pipe = gst_parse_launch(desc.c_str(), &err);
  ASSERT_NE(pipe, nullptr) << (err ? err->message : "");
  GstElement *src = gst_bin_get_by_name(GST_BIN(pipe), "src");
  GstElement *sink = gst_bin_get_by_name(GST_BIN(pipe), "sink");
  ASSERT_NE(gst_element_set_state(pipe, GST_STATE_PLAYING), GST_STATE_CHANGE_FAILURE);
  for (uint64_t i = 0; i < 10; i++)
    ASSERT_EQ(gst_app_src_push_buffer(GST_APP_SRC(src), latent({i, i % 3 ? A : B, 0, i}, i * kDur)), GST_FLOW_OK);
  gst_app_src_end_of_stream(GST_APP_SRC(src));
  std::vector<uint64_t> seen;
  guint64 last_step = 0;
  while (GstSample *smp = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 10 * GST_SECOND)) {
    g_usleep(5000);  // a slow consumer
    Batch b = inspect(gst_buffer_ref(gst_sample_get_buffer(smp)));
    gst_sample_unref(smp);
    EXPECT_EQ(b.shape.size(), 5u);
    seen.insert(seen.end(), b.ids.begin(), b.ids.end());
    last_step = b.meta.step;
  }
  EXPECT_TRUE(gst_app_sink_is_eos(GST_APP_SINK(sink)));
  std::sort(seen.begin(), seen.end());
  std::vector<uint64_t> want(10);
  for (uint64_t i = 0; i < 10; i++) want[i] = i;
  EXPECT_EQ(seen, want);
  EXPECT_EQ(last_step, 2u);  // 4 + 4 + 2
  GstMessage *msg = gst_bus_pop_filtered(GST_ELEMENT_BUS(pipe), GST_MESSAGE_ERROR);
  EXPECT_EQ(msg, nullptr);
  if (msg) gst_message_unref(msg);
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_object_unref(src);
  gst_object_unref(sink);
  gst_object_unref(pipe);
}

// textencoder's named tensors (text_embeds [L, D], text_mask [L]) are stacked like the latents,
// row for row, and the caps keep naming them.
TEST_F(MicroBatcherElement, StacksNamedTextTensorsRowForRow) {
  Harness h(make_batcher(3, 3),
            "application/x-videotrain-tensor, content=(string)latents, dtype=(string)float32, device=(string)cpu, "
            "tensors=(string)\"text_embeds,text_mask\"");
  for (uint64_t id = 0; id < 3; id++) {
    GstBuffer *buf = latent({id}, id * kDur);
    buffer_append_tensor(buf, "text_embeds", at::full({5, 6}, 10.0 + id));
    buffer_append_tensor(buf, "text_mask", at::arange(5, at::kLong).lt(static_cast<int64_t>(id) + 1).to(at::kLong));
    ASSERT_EQ(gst_harness_push(h.h, buf), GST_FLOW_OK);
  }
  auto out = h.pull_all();
  ASSERT_EQ(out.size(), 1u);
  std::string why;
  auto emb = named_tensor_from_buffer(out[0], "text_embeds", &why);
  ASSERT_TRUE(emb) << why;
  EXPECT_EQ(emb->sizes(), (std::vector<int64_t>{3, 5, 6}));
  auto mask = named_tensor_from_buffer(out[0], "text_mask", &why);
  ASSERT_TRUE(mask) << why;
  EXPECT_EQ(mask->sizes(), (std::vector<int64_t>{3, 5}));
  auto lat = tensor_from_buffer(out[0], &why);
  ASSERT_TRUE(lat) << why;
  for (int64_t i = 0; i < 3; i++) {
    const double id = (*lat)[i].flatten()[0].item<double>();
    EXPECT_EQ((*emb)[i][0][0].item<double>(), 10.0 + id) << "row " << i << ": text of another sample";
    EXPECT_EQ((*mask)[i].sum().item<int64_t>(), static_cast<int64_t>(id) + 1);
  }
  GstCaps *caps = gst_pad_get_current_caps(h.h->sinkpad);
  ASSERT_NE(caps, nullptr);
  const GstStructure *s = gst_caps_get_structure(caps, 0);
  EXPECT_STREQ(gst_structure_get_string(s, "content"), "micro-batch");
  EXPECT_STREQ(gst_structure_get_string(s, "tensors"), "text_embeds,text_mask");
  gst_caps_unref(caps);
  for (GstBuffer *b : out) gst_buffer_unref(b);
}
