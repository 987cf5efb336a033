/* ddpvalsink in a pipeline beside a ddptrainsink (appsrc-fed, CPU): results on the bus,
 * training goes on while a slow validation runs, bad trainer names are element errors,
 * padding flags of sample and batch metas keep padded samples out of the results, the run
 * travels as a GstContext (through nested bins, per pipeline). */
#include <ATen/ATen.h>
#include <gst/app/gstappsrc.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "metas.h"
#include "run_context_gst.h"
#include "tensor_buffer.h"
#include "test_util.h"

using namespace videotrain;

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char *kMicro = "application/x-videotrain-tensor,content=micro-batch,dtype=float32,device=cpu";
constexpr const char *kLatents = "application/x-videotrain-tensor,content=latents,dtype=float32,device=cpu";

GstBuffer *micro_batch(uint64_t step) {
  auto g = at::detail::createCPUGenerator(step + 1);
  GstBuffer *buf = buffer_from_tensor(at::randn({1, 4, 2, 8, 8}, g));
  auto *meta = gst_buffer_add_videotrain_batch_meta(buf);
  meta->step = step;
  meta->micro_count = 1;
  meta->step_samples = 1;
  meta->sync = TRUE;
  gst_videotrain_batch_meta_append(meta, step, 0, step, "a caption", FALSE);
  return buf;
}

at::Tensor val_tensor(uint64_t id, int size) {
  auto g = at::detail::createCPUGenerator(1000 + id);
  return at::randn({4, 2, size, size}, g);
}

GstBuffer *val_latent(uint64_t id, unsigned epoch, uint64_t clip, int size, bool padding = false) {
  GstBuffer *buf = buffer_from_tensor(val_tensor(id, size));
  auto *m = gst_buffer_add_videotrain_sample_meta(buf, "a val caption", "v.mp4");
  m->sample_id = id;
  m->epoch = epoch;
  m->clip_index = clip;
  m->padding = padding;
  return buf;
}

// Buffer k of validation epoch `epoch` (replaces val_latent(k, epoch, k, size)).
using ValBuffer = std::function<GstBuffer *(unsigned epoch, unsigned k)>;

struct RunResult {
  std::string error;
  std::vector<double> step_times;                    // when each ddptrainsink-step arrived
  std::vector<std::pair<uint64_t, double>> results;  // step, loss
  std::vector<std::pair<double, double>> windows;    // (result time - seconds, result time)
  uint64_t samples = 0;
};

// Trains `steps` steps while two ddpvalsinks validate every `every` steps on a looping
// validation stream of `val_n` samples of size x size latents.
RunResult run(unsigned steps, unsigned every, unsigned val_n, int size, const std::string &extra = "",
        const std::string &trainer_name = "trainer", const std::string &val_chain = "",
        const ValBuffer &val_buffer = {}, const char *val_caps = kLatents, bool nested = false,
        const std::string &val_extra = "") {
  // nested: the training and the validation branch each in a bin of their own.
  const std::string open = nested ? "( " : "", close = nested ? " ) " : " ";
  const std::string desc = open + "appsrc name=train format=time caps=\"" + kMicro +
                           "\" ! ddptrainsink name=trainer model=builtin:tiny-unet3d latent-channels=4 device=cpu "
                           "log-every=1 " + extra + close + open + "appsrc name=val format=time caps=\"" +
                           val_caps + "\" " + val_chain + " ! tee name=v v. ! queue ! ddpvalsink trainer=" + trainer_name +
                           " every=" + std::to_string(every) + " shard-index=0 num-shards=2 " + val_extra +
                           " v. ! queue ! ddpvalsink trainer=" + trainer_name + " every=" + std::to_string(every) +
                           " shard-index=1 num-shards=2 " + val_extra + close;
  RunResult r;
  GError *err = nullptr;
  GstElement *pipe = gst_parse_launch(desc.c_str(), &err);
  if (!pipe) {
    r.error = err ? err->message : "parse failed";
    g_clear_error(&err);
    return r;
  }
  GstElement *train = gst_bin_get_by_name(GST_BIN(pipe), "train");
  GstElement *val = gst_bin_get_by_name(GST_BIN(pipe), "val");
  gst_element_set_state(pipe, GST_STATE_PLAYING);
  std::atomic<bool> stop{false};
  std::thread tf([&] {
    for (unsigned s = 0; s < steps && !stop; s++)
      if (gst_app_src_push_buffer(GST_APP_SRC(train), micro_batch(s)) != GST_FLOW_OK) return;
    gst_app_src_end_of_stream(GST_APP_SRC(train));
  });
  std::thread vf([&] {
    // Bounded like a real source (4 queued), but never blocked inside appsrc: a push blocked
    // there can miss its wake-up when the pipeline shuts down after an error.
    for (unsigned ep = 0; !stop; ep++) {  // num-epochs=0: loops until the sinks are done
      for (unsigned k = 0; k < val_n && !stop; k++) {
        while (!stop && gst_app_src_get_current_level_buffers(GST_APP_SRC(val)) >= 4)
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        if (stop) break;
        if (gst_app_src_push_buffer(GST_APP_SRC(val), val_buffer ? val_buffer(ep, k) : val_latent(k, ep, k, size)) != GST_FLOW_OK) {
          gst_app_src_end_of_stream(GST_APP_SRC(val));
          return;
        }
      }
      // Like csvvideosrc: the epoch's end follows its last buffer (a microbatcher closes its step there).
      gst_element_send_event(val, gst_event_new_custom(GST_EVENT_CUSTOM_DOWNSTREAM,
                                                       gst_structure_new(GST_VIDEOTRAIN_EPOCH_EVENT, "epoch",
                                                                         G_TYPE_UINT, ep, nullptr)));
    }
  });
  GstBus *bus = gst_element_get_bus(pipe);
  const auto t0 = Clock::now();
  for (;;) {
    GstMessage *m = gst_bus_timed_pop(bus, 100 * GST_MSECOND);
    const double now = std::chrono::duration<double>(Clock::now() - t0).count();
    if (now > 90) {
      r.error = "timeout";
      break;
    }
    if (!m) continue;
    bool done = false;
    if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
      GError *e = nullptr;
      gst_message_parse_error(m, &e, nullptr);
      r.error = e->message;
      g_error_free(e);
      done = true;
    } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS) {
      done = true;
    } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ELEMENT) {
      const GstStructure *s = gst_message_get_structure(m);
      if (gst_structure_has_name(s, "ddptrainsink-step")) r.step_times.push_back(now);
      if (gst_structure_has_name(s, "ddpvalsink-result")) {
        guint64 step = 0, n = 0;
        double loss = 0, secs = 0;
        gst_structure_get_uint64(s, "step", &step);
        gst_structure_get_uint64(s, "samples", &n);
        gst_structure_get_double(s, "loss", &loss);
        gst_structure_get_double(s, "seconds", &secs);
        r.results.emplace_back(step, loss);
        r.windows.emplace_back(now - secs, now);
        r.samples = n;
      }
    }
    gst_message_unref(m);
    if (done) break;
  }
  stop = true;
  gst_element_set_state(pipe, GST_STATE_NULL);
  tf.join();
  vf.join();
  gst_object_unref(bus);
  gst_object_unref(train);
  gst_object_unref(val);
  gst_object_unref(pipe);
  return r;
}

}  // namespace

TEST(DdpValSinkElement, ValidatesEveryNStepsAndAtTheTrainersEosThenEnds) {
  vttest::TempDir dir;
  RunResult r = run(5, 2, 6, 8, "metrics-file=" + dir.file("m.jsonl"));
  ASSERT_EQ(r.error, "");
  std::vector<uint64_t> steps;
  for (auto &[s, l] : r.results) {
    steps.push_back(s);
    EXPECT_TRUE(std::isfinite(l));
  }
  EXPECT_EQ(steps, (std::vector<uint64_t>{2, 4, 5}));
  EXPECT_EQ(r.samples, 6u);
  EXPECT_NE(vttest::read_file(dir.file("m.jsonl")).find("\"type\":\"validation\""), std::string::npos);
}

// The validation branch may carry micro-batches (a microbatcher before the tee): the same
// weights give the same losses over the same samples as with single latents.
TEST(DdpValSinkElement, MicroBatchesGiveTheSameResultsAsLatents) {
  RunResult latents = run(5, 2, 6, 8);
  ASSERT_EQ(latents.error, "");
  RunResult micro = run(5, 2, 6, 8, "", "trainer", "! microbatcher batch-size=4 micro-batch-size=2");
  ASSERT_EQ(micro.error, "");
  ASSERT_EQ(micro.results.size(), latents.results.size());
  for (size_t i = 0; i < micro.results.size(); i++) {
    EXPECT_EQ(micro.results[i].first, latents.results[i].first);
    EXPECT_NEAR(micro.results[i].second, latents.results[i].second, 1e-6 * std::abs(latents.results[i].second))
        << "step " << latents.results[i].first;
  }
  EXPECT_EQ(micro.samples, 6u);
}

// The trainer's context goes up through its bin to the pipeline, which answers the
// validation bin's NEED_CONTEXT: the same results as in one flat pipeline.
TEST(DdpValSinkElement, FindsTheTrainerAcrossNestedBins) {
  RunResult flat = run(5, 2, 6, 8);
  ASSERT_EQ(flat.error, "");
  RunResult nested = run(5, 2, 6, 8, "", "trainer", "", {}, kLatents, true);
  ASSERT_EQ(nested.error, "");
  ASSERT_EQ(nested.results.size(), flat.results.size());
  for (size_t i = 0; i < flat.results.size(); i++) {
    EXPECT_EQ(nested.results[i].first, flat.results[i].first);
    EXPECT_NEAR(nested.results[i].second, flat.results[i].second, 1e-6 * std::abs(flat.results[i].second));
  }
}

// ddptrainsink posts its run as HAVE_CONTEXT "videotrain-run/<name>" at start: the pipeline
// keeps it, the trainer answers context queries for it, and once stopped the run is offered
// no more (the trainer posts an empty context of the same type; a pipeline also drops
// non-persistent contexts when it goes down to READY). Two pipelines with a trainer of the same name
// hold two runs.
TEST(DdpValSinkElement, TheTrainerPublishesItsRunAsAGstContext) {
  const char *desc = "appsrc caps=\"application/x-videotrain-tensor,content=micro-batch,dtype=float32,device=cpu\" ! "
                     "ddptrainsink name=t model=builtin:tiny-unet3d latent-channels=4 device=cpu";
  GstElement *a = gst_parse_launch(desc, nullptr);
  GstElement *b = gst_parse_launch(desc, nullptr);
  ASSERT_TRUE(a && b);
  ASSERT_NE(gst_element_set_state(a, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
  ASSERT_NE(gst_element_set_state(b, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
  GstBus *bus = gst_element_get_bus(a);
  GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_HAVE_CONTEXT);
  ASSERT_TRUE(m);
  GstContext *posted = nullptr;
  gst_message_parse_have_context(m, &posted);
  EXPECT_STREQ(gst_context_get_context_type(posted), "videotrain-run/t");
  auto run = run_context_get(posted);
  ASSERT_TRUE(run);
  EXPECT_EQ(run->rank(), 0);
  EXPECT_EQ(run->world_size(), 1);
  EXPECT_EQ(run->device_name(), "cpu");
  EXPECT_TRUE(run->has_model());
  EXPECT_EQ(run->steps_done(), 0u);
  gst_context_unref(posted);
  gst_message_unref(m);

  GstContext *kept = gst_element_get_context(a, "videotrain-run/t");
  ASSERT_TRUE(kept);
  EXPECT_EQ(run_context_get(kept), run);
  gst_context_unref(kept);
  GstContext *other = gst_element_get_context(b, "videotrain-run/t");
  ASSERT_TRUE(other);
  EXPECT_TRUE(run_context_get(other));
  EXPECT_NE(run_context_get(other), run);
  gst_context_unref(other);

  GstElement *t = gst_bin_get_by_name(GST_BIN(a), "t");
  GstQuery *q = gst_query_new_context("videotrain-run/t");
  ASSERT_TRUE(gst_element_query(t, q));
  GstContext *answered = nullptr;
  gst_query_parse_context(q, &answered);
  EXPECT_EQ(run_context_get(answered), run);
  gst_query_unref(q);
  q = gst_query_new_context("videotrain-run/someone-else");
  EXPECT_FALSE(gst_element_query(t, q));
  gst_query_unref(q);

  // The trainer alone stops (basesink stops in READY->NULL); the pipeline stays PAUSED.
  ASSERT_EQ(gst_element_set_state(t, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
  kept = gst_element_get_context(a, "videotrain-run/t");
  ASSERT_TRUE(kept);
  EXPECT_FALSE(run_context_get(kept)) << "the stopped run is still offered";
  gst_context_unref(kept);
  gst_element_set_state(a, GST_STATE_READY);
  kept = gst_element_get_context(a, "videotrain-run/t");
  EXPECT_FALSE(kept && run_context_get(kept));
  if (kept) gst_context_unref(kept);
  q = gst_query_new_context("videotrain-run/t");
  EXPECT_FALSE(gst_element_query(t, q));
  gst_query_unref(q);
  run.reset();

  gst_object_unref(t);
  gst_object_unref(bus);
  gst_element_set_state(a, GST_STATE_NULL);
  gst_element_set_state(b, GST_STATE_NULL);
  gst_object_unref(a);
  gst_object_unref(b);
}

// A trainer that starts after the ddpvalsink (here held back with a locked state): the sink
// starts without its run and asks again at its first buffer. Never started: that buffer is
// an element error saying so. Returns the first error, or the step of the first result,
// which is posted while the sink waits for the next snapshot (the trainer never trains).
std::string validate_with_late_trainer(bool start_trainer) {
  const std::string desc = std::string("appsrc name=val format=time caps=\"") + kLatents +
                           "\" ! ddpvalsink trainer=trainer every=0 at-start=true "
                           "appsrc name=train caps=\"" + kMicro + "\" ! ddptrainsink name=trainer "
                           "model=builtin:tiny-unet3d latent-channels=4 device=cpu";
  GstElement *pipe = gst_parse_launch(desc.c_str(), nullptr);
  if (!pipe) return "parse failed";
  GstElement *trainer = gst_bin_get_by_name(GST_BIN(pipe), "trainer");
  GstElement *val = gst_bin_get_by_name(GST_BIN(pipe), "val");
  gst_element_set_locked_state(trainer, TRUE);
  gst_element_set_state(pipe, GST_STATE_PLAYING);
  if (start_trainer) gst_element_sync_state_with_parent(trainer);
  for (unsigned k = 0; k < 3; k++) gst_app_src_push_buffer(GST_APP_SRC(val), val_latent(k, 0, k, 8));
  gst_app_src_push_buffer(GST_APP_SRC(val), val_latent(0, 1, 0, 8));  // ends the pass of epoch 0
  std::string out = "no message";
  GstBus *bus = gst_element_get_bus(pipe);
  while (GstMessage *m = gst_bus_timed_pop_filtered(bus, 60 * GST_SECOND,
                                                    GstMessageType(GST_MESSAGE_ERROR | GST_MESSAGE_ELEMENT))) {
    const GstStructure *s = gst_message_get_structure(m);
    guint64 step = 0;
    bool done = true;
    if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
      GError *e = nullptr;
      gst_message_parse_error(m, &e, nullptr);
      out = std::string("error: ") + e->message;
      g_error_free(e);
    } else if (gst_structure_has_name(s, "ddpvalsink-result") && gst_structure_get_uint64(s, "step", &step)) {
      out = "result of step " + std::to_string(step);
    } else {
      done = false;
    }
    gst_message_unref(m);
    if (done) break;
  }
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_element_set_state(trainer, GST_STATE_NULL);
  gst_object_unref(bus);
  gst_object_unref(val);
  gst_object_unref(trainer);
  gst_object_unref(pipe);
  return out;
}

TEST(DdpValSinkElement, AsksForTheRunAgainAtItsFirstBufferWhenTheTrainerStartsLater) {
  EXPECT_EQ(validate_with_late_trainer(true), "result of step 0");
  const std::string never = validate_with_late_trainer(false);
  EXPECT_NE(never.find("ddptrainsink 'trainer' has not started"), std::string::npos) << never;
}

// A very short run whose validation branch starts only after the trainer has ended (held back
// with a locked state until the trainer's EOS): it validates the final weights once, then ends,
// and so does the pipeline. It used to wait for steps that never come.
TEST(DdpValSinkElement, ABranchStartingAfterItsTrainerEndedValidatesTheFinalStepAndEnds) {
  const std::string desc = std::string("appsrc name=train format=time caps=\"") + kMicro +
                           "\" ! ddptrainsink name=trainer model=builtin:tiny-unet3d latent-channels=4 device=cpu "
                           "appsrc name=val format=time caps=\"" + kLatents +
                           "\" ! ddpvalsink name=vsink trainer=trainer every=2";
  GstElement *pipe = gst_parse_launch(desc.c_str(), nullptr);
  ASSERT_NE(pipe, nullptr);
  g_object_set(pipe, "message-forward", TRUE, nullptr);  // the trainer's own EOS message, forwarded
  GstElement *train = gst_bin_get_by_name(GST_BIN(pipe), "train");
  GstElement *val = gst_bin_get_by_name(GST_BIN(pipe), "val");
  GstElement *vsink = gst_bin_get_by_name(GST_BIN(pipe), "vsink");
  GstElement *trainer = gst_bin_get_by_name(GST_BIN(pipe), "trainer");
  gst_element_set_locked_state(vsink, TRUE);
  gst_element_set_state(pipe, GST_STATE_PLAYING);
  for (uint64_t s = 0; s < 2; s++) gst_app_src_push_buffer(GST_APP_SRC(train), micro_batch(s));
  gst_app_src_end_of_stream(GST_APP_SRC(train));
  GstBus *bus = gst_element_get_bus(pipe);
  std::vector<uint64_t> results;
  std::string error, warnings;
  bool trainer_done = false, eos = false;
  const auto t0 = Clock::now();
  while (!eos && error.empty() && Clock::now() - t0 < std::chrono::seconds(60)) {
    GstMessage *m = gst_bus_timed_pop(bus, 100 * GST_MSECOND);
    if (!m) continue;
    const GstStructure *s = gst_message_get_structure(m);
    if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
      GError *e = nullptr;
      gst_message_parse_error(m, &e, nullptr);
      error = e->message;
      g_error_free(e);
    } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_WARNING) {
      GError *e = nullptr;
      gst_message_parse_warning(m, &e, nullptr);
      warnings += std::string(e->message) + "\n";
      g_error_free(e);
    } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS) {
      eos = true;
    } else if (s && gst_structure_has_name(s, "GstBinForwarded") && !trainer_done) {
      GstMessage *inner = nullptr;
      gst_structure_get(s, "message", GST_TYPE_MESSAGE, &inner, nullptr);
      if (inner && GST_MESSAGE_TYPE(inner) == GST_MESSAGE_EOS && GST_MESSAGE_SRC(inner) == GST_OBJECT(trainer)) {
        trainer_done = true;  // finish() is done: now the validation branch starts
        gst_element_set_locked_state(vsink, FALSE);
        gst_element_sync_state_with_parent(vsink);
        for (unsigned k = 0; k < 3; k++) gst_app_src_push_buffer(GST_APP_SRC(val), val_latent(k, 0, k, 8));
        gst_app_src_push_buffer(GST_APP_SRC(val), val_latent(0, 1, 0, 8));  // ends the pass of epoch 0
        gst_app_src_end_of_stream(GST_APP_SRC(val));
      }
      if (inner) gst_message_unref(inner);
    } else if (s && gst_structure_has_name(s, "ddpvalsink-result")) {
      guint64 step = 0;
      gst_structure_get_uint64(s, "step", &step);
      results.push_back(step);
    }
    gst_message_unref(m);
  }
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_object_unref(bus);
  gst_object_unref(trainer);
  gst_object_unref(vsink);
  gst_object_unref(val);
  gst_object_unref(train);
  gst_object_unref(pipe);
  ASSERT_EQ(error, "");
  EXPECT_TRUE(trainer_done);
  EXPECT_TRUE(eos) << "the pipeline did not end: the late validation branch waited for steps (warnings: " << warnings
                   << ")";
  EXPECT_EQ(results, (std::vector<uint64_t>{2}));
}

TEST(DdpValSinkElement, TrainingKeepsCompletingStepsWhileASlowValidationRuns) {
  // Validation of 40 samples of 4x2x48x48 against training steps on 4x2x8x8.
  RunResult r = run(12, 2, 40, 40);
  ASSERT_EQ(r.error, "");
  ASSERT_FALSE(r.results.empty());
  ASSERT_EQ(r.results.front().first, 2u);
  const auto [from, to] = r.windows.front();
  int during = 0;
  for (double t : r.step_times) during += t > from && t < to;
  EXPECT_GE(during, 2) << "training steps completed while step 2 was validated (" << (to - from) << " s)";
}

TEST(DdpValSinkElement, AMissingOrWrongTrainerIsAnElementError) {
  RunResult r = run(2, 1, 2, 8, "", "nosuchtrainer");
  EXPECT_NE(r.error.find("nosuchtrainer"), std::string::npos) << r.error;
  r = run(2, 1, 2, 8, "", "v");
  EXPECT_NE(r.error.find("not a ddptrainsink"), std::string::npos) << r.error;
}

// weights=ema validates the trainer's EMA (ema-decay): other numbers than its weights at the same
// steps; without an EMA it is an element error naming weights=ema.
TEST(DdpValSinkElement, WeightsEmaValidatesTheTrainersEmaAndNeedsOne) {
  RunResult raw = run(4, 2, 4, 8, "ema-decay=0.5 lr=0.05");
  RunResult ema = run(4, 2, 4, 8, "ema-decay=0.5 lr=0.05", "trainer", "", {}, kLatents, false, "weights=ema");
  ASSERT_EQ(raw.error, "");
  ASSERT_EQ(ema.error, "");
  ASSERT_EQ(raw.results.size(), ema.results.size());
  for (size_t i = 0; i < raw.results.size(); i++) {
    EXPECT_EQ(raw.results[i].first, ema.results[i].first);
    EXPECT_TRUE(std::isfinite(ema.results[i].second));
    EXPECT_NE(raw.results[i].second, ema.results[i].second) << "step " << raw.results[i].first;
  }
  RunResult none = run(2, 1, 2, 8, "", "trainer", "", {}, kLatents, false, "weights=ema");
  EXPECT_NE(none.error.find("weights=ema"), std::string::npos) << none.error;
}

// 5 samples and a 6th that pads the epoch (as csvvideosrc pads a rank's shard): counted
// neither in `samples` nor in the loss.
TEST(DdpValSinkElement, PaddedLatentsAreNotValidated) {
  RunResult five = run(5, 2, 5, 8);
  ASSERT_EQ(five.error, "");
  RunResult padded = run(5, 2, 6, 8, "", "trainer", "", [](unsigned ep, unsigned k) {
    return val_latent(k % 5, ep, k, 8, k == 5);
  });
  ASSERT_EQ(padded.error, "");
  EXPECT_EQ(five.samples, 5u);
  EXPECT_EQ(padded.samples, 5u);
  ASSERT_EQ(padded.results.size(), five.results.size());
  for (size_t i = 0; i < five.results.size(); i++) {
    EXPECT_EQ(padded.results[i].first, five.results[i].first);
    EXPECT_NEAR(padded.results[i].second, five.results[i].second, 1e-6 * std::abs(five.results[i].second))
        << "step " << five.results[i].first;
  }
}

// Micro-batches of 2 whose batch meta flags the last sample of the epoch as padding (in a
// micro-batch with a real one): the same results as the 5 samples as latents.
TEST(DdpValSinkElement, PaddedSamplesOfMicroBatchesAreNotValidated) {
  RunResult five = run(5, 2, 5, 8);
  ASSERT_EQ(five.error, "");
  RunResult micro = run(5, 2, 3, 8, "", "trainer", "", [](unsigned ep, unsigned k) {
    const uint64_t ids[2] = {2 * k, (2 * k + 1) % 5};
    GstBuffer *buf = buffer_from_tensor(at::stack({val_tensor(ids[0], 8), val_tensor(ids[1], 8)}));
    auto *meta = gst_buffer_add_videotrain_batch_meta(buf);
    meta->step = ep * 3 + k;
    meta->micro_count = 1;
    meta->step_samples = 2;
    meta->sync = TRUE;
    meta->epoch = k == 2 ? ep + 1 : ep;  // the position after this micro-batch
    meta->next_clip = k == 2 ? 0 : 2 * (k + 1);
    for (int i = 0; i < 2; i++) gst_videotrain_batch_meta_append(meta, ids[i], ep, 2 * k + i, "a val caption", 2 * k + i == 5);
    return buf;
  }, kMicro);
  ASSERT_EQ(micro.error, "");
  EXPECT_EQ(micro.samples, 5u);
  ASSERT_EQ(micro.results.size(), five.results.size());
  for (size_t i = 0; i < five.results.size(); i++) {
    EXPECT_EQ(micro.results[i].first, five.results[i].first);
    EXPECT_NEAR(micro.results[i].second, five.results[i].second, 1e-6 * std::abs(five.results[i].second))
        << "step " << five.results[i].first;
  }
}
