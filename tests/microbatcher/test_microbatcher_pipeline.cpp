// csvvideosrc ! vaeencoder ! microbatcher in one pipeline: real clips become latents,
// then steps of micro-batches with their batch metas, across two epochs, to EOS.
#include <gst/app/gstappsink.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "metas.h"
#include "tensor_caps.h"
#include "test_util.h"

TEST(MicroBatcherPipeline, FromCsvVideoSrcThroughVaeEncoder) {
  vttest::TempDir dir;
  std::string csv = "path,text\n";
  for (int i = 0; i < 4; i++) {
    std::string name = "v" + std::to_string(i) + ".mp4";
    ASSERT_TRUE(vttest::make_video(dir.file(name), {12, 48, 32, 10, 5}));
    csv += name + ",clip " + std::to_string(i) + "\n";
  }
  vttest::write_file(dir.file("m.csv"), csv);
  std::string tool = vttest::env_or("VIDEOTRAIN_BUILD_DIR", "build") + "/tools/videotrain-make-vae";
  ASSERT_EQ(std::system((tool + " " + dir.file("vae") + " --tiny --seed 2 >/dev/null").c_str()), 0);

  GError *err = nullptr;
  std::string desc = "csvvideosrc location=" + dir.file("m.csv") +
                     " num-frames=5 width=32 height=32 num-epochs=2 prefetch=2 ! vaeencoder model=" +
                     dir.file("vae") + " latent=mode ! microbatcher batch-size=2 micro-batch-size=1 ! "
                     "appsink name=out sync=false";
  GstElement *pipe = gst_parse_launch(desc.c_str(), &err);
  ASSERT_NE(pipe, nullptr) << (err ? err->message : "");
  GstElement *sink = gst_bin_get_by_name(GST_BIN(pipe), "out");
  gst_element_set_state(pipe, GST_STATE_PLAYING);
  std::vector<GstVideoTrainBatchMeta> metas;
  std::vector<std::vector<int64_t>> shapes;
  while (GstSample *s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 60 * GST_SECOND)) {
    GstBuffer *b = gst_sample_get_buffer(s);
    auto *m = gst_buffer_get_videotrain_batch_meta(b);
    auto *t = gst_buffer_get_videotrain_tensor_meta(b);
    EXPECT_NE(m, nullptr);
    EXPECT_NE(t, nullptr);
    if (m) metas.push_back(*m);
    if (t) shapes.push_back(videotrain::tensor_meta_shape(t));
    if (metas.size() == 1) {
      const GstStructure *st = gst_caps_get_structure(gst_sample_get_caps(s), 0);
      EXPECT_STREQ(gst_structure_get_string(st, "content"), "micro-batch");
    }
    gst_sample_unref(s);
  }
  EXPECT_TRUE(gst_app_sink_is_eos(GST_APP_SINK(sink))) << "the pipeline reaches EOS";
  // 4 clips an epoch, 2 epochs, steps of 2 in micro-batches of 1.
  ASSERT_EQ(metas.size(), 8u);
  for (size_t i = 0; i < metas.size(); i++) {
    EXPECT_EQ(metas[i].step, i / 2);
    EXPECT_EQ(metas[i].micro_index, i % 2);
    EXPECT_EQ(metas[i].micro_count, 2u);
    EXPECT_EQ(metas[i].step_samples, 2u);
    EXPECT_EQ(bool(metas[i].sync), i % 2 == 1);
    EXPECT_EQ(metas[i].epoch, i / 4);
    EXPECT_EQ(shapes[i], (std::vector<int64_t>{1, 4, 2, 4, 4})) << "[m, C, (T-1)/4+1, H/8, W/8]";
  }
  EXPECT_EQ(metas[3].next_clip, 4u);
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipe);
}
