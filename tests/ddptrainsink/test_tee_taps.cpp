/* A tee tap beside training with default queues (issue 14): latents carry their clip's
 * duration, so a default queue (1 s) in front of a prerolling fakesink is full after one
 * latent while microbatcher needs batch-size of them before ddptrainsink sees anything.
 * When the trainer waited for a preroll buffer of its own, start-up never left PAUSED.
 * appsrc stands in for csvvideosrc ! vaeencoder (clips of 2 s). */
#include <ATen/ATen.h>
#include <gst/app/gstappsrc.h>
#include <gtest/gtest.h>

#include <string>

#include "metas.h"
#include "tensor_buffer.h"
#include "test_util.h"

using namespace videotrain;

namespace {

const char *kLatents = "appsrc name=src format=time caps=\"application/x-videotrain-tensor, "
                       "content=(string)latents, dtype=(string)float32, device=(string)cpu\"";
const char *kTrainer = "ddptrainsink name=tr model=builtin:tiny-unet3d device=cpu log-every=1 rank=0 world-size=1";

struct Outcome {
  std::string error;  // "" when EOS came
  guint64 steps = 0;
};

// Runs `tail` after the appsrc, feeds 12 latents of 2 s, waits for EOS (60 s at most).
Outcome run(const std::string &tail) {
  Outcome out;
  GError *err = nullptr;
  GstElement *pipe = gst_parse_launch_full((std::string(kLatents) + " ! " + tail).c_str(), nullptr,
                                           GST_PARSE_FLAG_FATAL_ERRORS, &err);
  if (!pipe) {
    out.error = err ? err->message : "parse failed";
    g_clear_error(&err);
    return out;
  }
  GstElement *src = gst_bin_get_by_name(GST_BIN(pipe), "src");
  GstElement *tr = gst_bin_get_by_name(GST_BIN(pipe), "tr");
  gst_element_set_state(pipe, GST_STATE_PLAYING);
  for (int k = 0; k < 12; k++) {
    auto g = at::detail::createCPUGenerator(k);
    GstBuffer *b = buffer_from_tensor(at::randn({4, 2, 8, 8}, g));
    auto *m = gst_buffer_add_videotrain_sample_meta(b, "a caption", "x.mp4");
    m->sample_id = k;
    m->clip_index = k;
    GST_BUFFER_PTS(b) = 2 * k * GST_SECOND;
    GST_BUFFER_DURATION(b) = 2 * GST_SECOND;
    gst_app_src_push_buffer(GST_APP_SRC(src), b);  // appsrc queues without limit
  }
  gst_app_src_end_of_stream(GST_APP_SRC(src));
  GstBus *bus = gst_element_get_bus(pipe);
  GstMessage *m =
      gst_bus_timed_pop_filtered(bus, 60 * GST_SECOND, GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  if (!m) {
    GstState state = GST_STATE_VOID_PENDING, pending = GST_STATE_VOID_PENDING;
    gst_element_get_state(pipe, &state, &pending, 0);
    out.error = std::string("no EOS within 60 s; the pipeline is ") + gst_element_state_get_name(state) +
                " (pending " + gst_element_state_get_name(pending) + ")";
  } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
    GError *e = nullptr;
    gst_message_parse_error(m, &e, nullptr);
    out.error = e->message;
    g_error_free(e);
  }
  if (m) gst_message_unref(m);
  g_object_get(tr, "steps", &out.steps, nullptr);
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_object_unref(bus);
  gst_object_unref(src);
  gst_object_unref(tr);
  gst_object_unref(pipe);
  return out;
}

}  // namespace

TEST(TeeTap, AfterTheEncoderWithDefaultQueuesTrainsToEos) {
  // sync=false only to keep the test short: the stall was the preroll, not the clock.
  Outcome o = run("tee name=t ! queue ! microbatcher batch-size=4 micro-batch-size=2 ! " + std::string(kTrainer) +
                  " t. ! queue ! fakesink sync=false");
  EXPECT_EQ(o.error, "");
  EXPECT_EQ(o.steps, 3u);
}

TEST(TeeTap, AfterTheMicrobatcherWithDefaultQueuesTrainsToEos) {
  Outcome o = run("microbatcher batch-size=4 micro-batch-size=2 ! tee name=t ! queue ! " + std::string(kTrainer) +
                  " t. ! queue ! fakesink sync=false");
  EXPECT_EQ(o.error, "");
  EXPECT_EQ(o.steps, 3u);
}
