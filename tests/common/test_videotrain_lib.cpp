// The public library (gst-libs/gst/videotrain) through its installed header only.
#include <gst/videotrain/videotrain.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

std::vector<std::string> names_of(GstBuffer *b) {
  gchar **names = gst_buffer_get_videotrain_tensor_names(b);
  std::vector<std::string> out;
  for (gchar **n = names; *n; n++) out.push_back(*n);
  g_strfreev(names);
  return out;
}

TEST(VideoTrainLib, TensorMetaFieldsSurviveACopy) {
  GstBuffer *b = gst_buffer_new_allocate(nullptr, 64, nullptr);
  const gint64 mask_dims[] = {7};
  const gint64 main_dims[] = {4, 3, 8, 8};
  // A named tensor added before the main one: the getter still answers the main one.
  ASSERT_NE(gst_buffer_add_videotrain_tensor_meta(b, "int64", nullptr, 1, mask_dims, "text_mask", 40), nullptr);
  ASSERT_NE(gst_buffer_add_videotrain_tensor_meta(b, "float32", "cpu", 4, main_dims, nullptr, 0), nullptr);
  const gint64 emb_dims[] = {7, 2};
  ASSERT_NE(gst_buffer_add_videotrain_tensor_meta(b, "bfloat16", "cuda:1", 2, emb_dims, "text_embeds", 12), nullptr);
  GstBuffer *c = gst_buffer_copy(b);
  GstVideoTrainTensorMeta *t = gst_buffer_get_videotrain_tensor_meta(c);
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->dtype, "float32");
  EXPECT_STREQ(t->device, "cpu");
  EXPECT_STREQ(t->name, "");
  ASSERT_EQ(t->ndim, 4u);
  EXPECT_EQ(std::vector<gint64>(t->dims, t->dims + t->ndim), std::vector<gint64>(main_dims, main_dims + 4));
  EXPECT_EQ(gst_videotrain_tensor_meta_get_nbytes(t), 4u * 3 * 8 * 8 * 4);
  GstVideoTrainTensorMeta *e = gst_buffer_get_videotrain_tensor_meta_by_name(c, "text_embeds");
  ASSERT_NE(e, nullptr);
  EXPECT_STREQ(e->device, "cuda:1");
  EXPECT_EQ(e->offset, 12u);
  EXPECT_EQ(gst_videotrain_tensor_meta_get_nbytes(e), 7u * 2 * 2);
  EXPECT_EQ(gst_videotrain_tensor_meta_get_nbytes(gst_buffer_get_videotrain_tensor_meta_by_name(c, "text_mask")),
            7u * 8);
  // Named tensors in buffer order (by offset), not in the order their metas were added.
  EXPECT_EQ(names_of(c), (std::vector<std::string>{"text_embeds", "text_mask"}));
  EXPECT_EQ(gst_buffer_get_videotrain_tensor_meta_by_name(c, "other"), nullptr);
  gst_buffer_unref(c);
  gst_buffer_unref(b);
}

TEST(VideoTrainLib, TensorMetaRefusesTooManyDims) {
  GstBuffer *b = gst_buffer_new();
  const gint64 dims[GST_VIDEOTRAIN_TENSOR_MAX_DIMS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(gst_buffer_add_videotrain_tensor_meta(b, "float32", "cpu", GST_VIDEOTRAIN_TENSOR_MAX_DIMS + 1, dims,
                                                  nullptr, 0),
            nullptr);
  EXPECT_EQ(gst_buffer_get_videotrain_tensor_meta(b), nullptr);
  EXPECT_TRUE(names_of(b).empty());
  gst_buffer_unref(b);
}

TEST(VideoTrainLib, ClipMetaAsAnAppAttachesIt) {
  GstBuffer *b = gst_buffer_new_allocate(nullptr, 12, nullptr);
  GstVideoTrainClipMeta *m = gst_buffer_add_videotrain_clip_meta(b, "a cat", "app", nullptr);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->frame_index, 0u);
  EXPECT_EQ(m->num_frames, 0u);
  m->sample_id = 5;
  m->frame_index = 2;
  m->num_frames = 9;
  GstBuffer *c = gst_buffer_copy_deep(b);
  GstVideoTrainClipMeta *n = gst_buffer_get_videotrain_clip_meta(c);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->sample_id, 5u);
  EXPECT_EQ(n->frame_index, 2u);
  EXPECT_EQ(n->num_frames, 9u);
  EXPECT_STREQ(n->caption, "a cat");
  EXPECT_EQ(n->split, nullptr);
  GstBuffer *latent = gst_buffer_new();
  GstVideoTrainSampleMeta *s = gst_buffer_add_videotrain_sample_meta_from_clip(latent, n);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(gst_buffer_get_videotrain_sample_meta(latent), s);
  EXPECT_EQ(s->sample_id, 5u);
  EXPECT_STREQ(s->path, "app");
  gst_buffer_unref(latent);
  gst_buffer_unref(c);
  gst_buffer_unref(b);
}

TEST(VideoTrainLib, BatchMetaSamples) {
  GstBuffer *b = gst_buffer_new();
  GstVideoTrainBatchMeta *m = gst_buffer_add_videotrain_batch_meta(b);
  gst_videotrain_batch_meta_append(m, 11, 2, 30, "first", FALSE);
  gst_videotrain_batch_meta_append(m, 12, 3, 0, nullptr, TRUE);
  EXPECT_EQ(gst_videotrain_batch_meta_get_n_samples(m), 2u);
  guint64 id = 0, clip = 1;
  guint epoch = 0;
  const gchar *caption = nullptr;
  gboolean padding = FALSE;
  ASSERT_TRUE(gst_videotrain_batch_meta_get_sample(m, 1, &id, &epoch, &clip, &caption, &padding));
  EXPECT_EQ(id, 12u);
  EXPECT_EQ(epoch, 3u);
  EXPECT_EQ(clip, 0u);
  EXPECT_STREQ(caption, "");
  EXPECT_TRUE(padding);
  EXPECT_FALSE(gst_videotrain_batch_meta_get_sample(m, 2, nullptr, nullptr, nullptr, nullptr, nullptr));
  gst_buffer_unref(b);
}

}  // namespace
