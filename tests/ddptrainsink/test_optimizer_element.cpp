/* ddptrainsink's optimizer= in a pipeline: each optimizer trains builtin:tiny-unet3d from
 * microbatcher to EOS with its own properties set from the launch line, and writes its
 * checkpoint; a setting it cannot step with is an element error naming the property. */
#include <ATen/ATen.h>
#include <gst/app/gstappsrc.h>
#include <gst/gst.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "metas.h"
#include "tensor_buffer.h"
#include "test_util.h"

using namespace videotrain;

namespace {

struct PipelineRun {
  int steps = 0;
  double last_loss = NAN;
  std::string error;
};

// appsrc (12 latents) ! microbatcher (3 steps) ! ddptrainsink <props>, to EOS or the first error.
PipelineRun train(const std::string &props) {
  PipelineRun out;
  GError *err = nullptr;
  GstElement *pipe = gst_parse_launch(
      ("appsrc name=src format=time caps=\"application/x-videotrain-tensor, content=(string)latents, "
       "dtype=(string)float32, device=(string)cpu\" ! microbatcher batch-size=4 micro-batch-size=2 ! "
       "ddptrainsink name=t model=builtin:tiny-unet3d device=cpu log-every=1 rank=0 world-size=1 " +
       props)
          .c_str(),
      &err);
  if (!pipe) {
    out.error = err ? err->message : "no pipeline";
    return out;
  }
  GstElement *src = gst_bin_get_by_name(GST_BIN(pipe), "src");
  if (gst_element_set_state(pipe, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE) {
    for (int k = 0; k < 12; k++) {
      auto g = at::detail::createCPUGenerator(k);
      GstBuffer *b = buffer_from_tensor(at::randn({4, 2, 8, 8}, g));
      auto *m = gst_buffer_add_videotrain_sample_meta(b, "a caption", "x.mp4");
      m->sample_id = k;
      m->clip_index = k;
      GST_BUFFER_PTS(b) = k * GST_SECOND;
      GST_BUFFER_DURATION(b) = GST_SECOND;
      if (gst_app_src_push_buffer(GST_APP_SRC(src), b) != GST_FLOW_OK) break;
    }
    gst_app_src_end_of_stream(GST_APP_SRC(src));
  }
  GstBus *bus = gst_element_get_bus(pipe);
  for (bool done = false; !done;) {
    GstMessage *m = gst_bus_timed_pop(bus, 60 * GST_SECOND);
    if (!m) {
      out.error = "timeout";
      break;
    }
    if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
      GError *e = nullptr;
      gst_message_parse_error(m, &e, nullptr);
      out.error = e->message;
      g_error_free(e);
      done = true;
    } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS) {
      done = true;
    } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ELEMENT &&
               gst_structure_has_name(gst_message_get_structure(m), "ddptrainsink-step")) {
      out.steps++;
      gst_structure_get_double(gst_message_get_structure(m), "loss", &out.last_loss);
    }
    gst_message_unref(m);
  }
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_object_unref(bus);
  gst_object_unref(src);
  gst_object_unref(pipe);
  return out;
}

}  // namespace

TEST(DdpTrainSinkOptimizers, EachOptimizerTrainsInAPipelineAndCheckpoints) {
  const std::pair<const char *, const char *> runs[] = {
      {"adamw", "lr=1e-3 weight-decay=0.01 beta1=0.9 beta2=0.999 eps=1e-8"},
      {"adamw8bit", "lr=1e-3 weight-decay=0.01"},
      {"adafactor", "lr=1e-2 beta2-decay=-0.8 clip-threshold=1 eps2=1e-3 weight-decay=0"},
      {"prodigy", "lr=1 d0=1e-6 d-coef=1 use-bias-correction=true safeguard-warmup=true warmup-steps=1"},
      {"came", "lr=1e-4 beta1=0.9 beta2=0.999 beta3=0.9999 eps=1e-30 eps2=1e-16"},
      {"sgd", "lr=1e-2 momentum=0.9 nesterov=true"},
  };
  for (const auto &[kind, props] : runs) {
    vttest::TempDir dir;
    const PipelineRun r = train(std::string("optimizer=") + kind + " " + props + " checkpoint-dir=" + dir.file("ckpt"));
    EXPECT_EQ(r.error, "") << kind;
    EXPECT_EQ(r.steps, 3) << kind;
    EXPECT_TRUE(std::isfinite(r.last_loss)) << kind;
    EXPECT_TRUE(std::filesystem::is_regular_file(dir.file("ckpt/step-00000003/optimizer.pt"))) << kind;
  }
}

TEST(DdpTrainSinkOptimizers, ASettingTheOptimizerCannotStepWithIsAnElementError) {
  const PipelineRun r = train("optimizer=sgd nesterov=true");
  EXPECT_NE(r.error.find("property momentum"), std::string::npos) << r.error;
  EXPECT_EQ(r.steps, 0);
}
