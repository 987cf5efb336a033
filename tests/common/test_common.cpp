// elements/common: launcher environment, metas, tensor caps.
#include <gtest/gtest.h>

#include <cstdlib>

#include "device_rule.h"
#include "dist_env.h"
#include "gst_enum.h"
#include "metas.h"
#include "string_property.h"
#include "tensor_caps.h"

using namespace videotrain;

namespace {
const char *kVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                       "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT"};
struct CleanEnv : ::testing::Test {
  void SetUp() override {
    for (const char *v : kVars) unsetenv(v);
  }
  void TearDown() override { SetUp(); }
};
}  // namespace

TEST_F(CleanEnv, DefaultsToOneRank) {
  DistEnv e = dist_env_from_environment();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.source, "default");
}

TEST_F(CleanEnv, TorchrunComesBeforeSlurmAndOpenMpi) {
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
  EXPECT_EQ(dist_env_from_environment().source, "slurm");
  EXPECT_EQ(dist_env_from_environment().rank, 3);
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "10.1.2.3", 1);
  setenv("MASTER_PORT", "29555", 1);
  DistEnv e = dist_env_from_environment();
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.master_port, 29555);
}

TEST_F(CleanEnv, OpenMpiAndInvalidValues) {
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_EQ(dist_env_from_environment().rank, 2);
  setenv("RANK", "4", 1);  // rank outside the world: ignored, falls through
  setenv("WORLD_SIZE", "4", 1);
  EXPECT_EQ(dist_env_from_environment().source, "openmpi");
  setenv("RANK", "x", 1);
  EXPECT_EQ(dist_env_from_environment().source, "openmpi");
  EXPECT_FALSE(env_int("RANK").has_value());
}

TEST(Metas, ClipMetaSurvivesBufferCopies) {
  GstBuffer *b = gst_buffer_new_allocate(nullptr, 16, nullptr);
  auto *m = gst_buffer_add_videotrain_clip_meta(b, "a \"caption\"", "/x/y.mp4", "train");
  m->sample_id = 42;
  m->clip_index = 7;
  m->frame_index = 3;
  m->num_frames = 9;
  m->padding = TRUE;
  GstBuffer *c = gst_buffer_copy(b);
  auto *n = gst_buffer_get_videotrain_clip_meta(c);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->sample_id, 42u);
  EXPECT_EQ(n->clip_index, 7u);
  EXPECT_EQ(n->frame_index, 3u);
  EXPECT_EQ(n->num_frames, 9u);
  EXPECT_TRUE(n->padding);
  EXPECT_STREQ(n->caption, "a \"caption\"");
  EXPECT_STREQ(n->split, "train");
  EXPECT_NE(n->caption, m->caption) << "strings are owned by each meta";
  // No tags: video filters keep it.
  const gchar *const *tags = gst_meta_api_type_get_tags(GST_VIDEOTRAIN_CLIP_META_API_TYPE);
  EXPECT_TRUE(tags == nullptr || tags[0] == nullptr);
  gst_buffer_unref(b);
  gst_buffer_unref(c);
}

TEST(Metas, BatchMetaCopiesItsLists) {
  GstBuffer *b = gst_buffer_new();
  auto *m = gst_buffer_add_videotrain_batch_meta(b);
  m->step = 5;
  m->sync = TRUE;
  gst_videotrain_batch_meta_append(m, 11, 2, 30, "first", FALSE);
  gst_videotrain_batch_meta_append(m, 12, 3, 0, nullptr, TRUE);
  GstBuffer *c = gst_buffer_copy(b);
  gst_buffer_unref(b);
  auto *n = gst_buffer_get_videotrain_batch_meta(c);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->step, 5u);
  EXPECT_TRUE(n->sync);
  ASSERT_EQ(n->sample_ids->len, 2u);
  EXPECT_EQ(g_array_index(n->sample_ids, guint64, 1), 12u);
  EXPECT_STREQ((const char *)g_ptr_array_index(n->captions, 0), "first");
  EXPECT_STREQ((const char *)g_ptr_array_index(n->captions, 1), "");
  EXPECT_TRUE(g_array_index(n->padding, gboolean, 1));
  EXPECT_EQ(g_array_index(n->clip_indices, guint64, 0), 30u);
  EXPECT_EQ(g_array_index(n->epochs, guint, 1), 3u);
  BatchInfo info;
  ASSERT_TRUE(read_batch_meta(c, &info));
  EXPECT_EQ(info.step, 5u);
  EXPECT_EQ(info.sample_ids, (std::vector<uint64_t>{11, 12}));
  EXPECT_EQ(info.epochs, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(info.clip_indices, (std::vector<uint64_t>{30, 0}));
  EXPECT_EQ(info.captions, (std::vector<std::string>{"first", ""}));
  EXPECT_EQ(info.padding, (std::vector<bool>{false, true}));
  // write_batch_meta gives back what was read, also where it differs from BatchInfo's defaults
  // (a whole step: micro_count 1, sync).
  info.micro_index = 1;
  info.micro_count = 3;
  info.step_samples = 6;
  info.sync = false;
  GstBuffer *d = gst_buffer_new();
  ASSERT_NE(write_batch_meta(d, info), nullptr);
  BatchInfo again;
  ASSERT_TRUE(read_batch_meta(d, &again));
  EXPECT_EQ(again.sample_ids, info.sample_ids);
  EXPECT_EQ(again.clip_indices, info.clip_indices);
  EXPECT_EQ(again.epochs, info.epochs);
  EXPECT_EQ(again.padding, info.padding);
  EXPECT_EQ(again.step, 5u);
  EXPECT_EQ(again.micro_index, 1u);
  EXPECT_EQ(again.micro_count, 3u);
  EXPECT_EQ(again.step_samples, 6u);
  EXPECT_FALSE(again.sync);
  // No batch meta leaves the record as it was: a whole step on its own (ddptrainsink relies on it).
  BatchInfo none;
  GstBuffer *plain = gst_buffer_new();
  EXPECT_FALSE(read_batch_meta(plain, &none));
  EXPECT_EQ(none.micro_count, 1u);
  EXPECT_TRUE(none.sync);
  EXPECT_TRUE(none.sample_ids.empty());
  // A clip meta's bucket group reaches the sample meta and its reader.
  auto *clip = gst_buffer_add_videotrain_clip_meta(plain, "c", "v.mp4", nullptr);
  clip->sample_id = 4;
  clip->group = 9;
  clip->group_size = 3;
  GstBuffer *latent = gst_buffer_new();
  gst_buffer_add_videotrain_sample_meta_from_clip(latent, clip);
  GstBuffer *latent_copy = gst_buffer_copy(latent);
  SampleInfo si;
  ASSERT_TRUE(read_sample_meta(latent_copy, &si));
  EXPECT_EQ(si.sample_id, 4u);
  EXPECT_EQ(si.group, 9u);
  EXPECT_EQ(si.group_size, 3u);
  gst_buffer_unref(latent_copy);
  gst_buffer_unref(latent);
  gst_buffer_unref(plain);
  gst_buffer_unref(d);
  gst_buffer_unref(c);
}

TEST(TensorCaps, RoundTripAndRefusal) {
  GstCaps *caps = tensor_caps_new({"latents", "bfloat16", "cuda:1", ""});
  TensorCapsInfo info;
  std::string why;
  ASSERT_TRUE(tensor_caps_parse(caps, &info, &why)) << why;
  EXPECT_EQ(info.content, "latents");
  EXPECT_EQ(info.dtype, "bfloat16");
  EXPECT_EQ(info.device, "cuda:1");
  GstCaps *tmpl = tensor_caps_template("latents");
  EXPECT_TRUE(gst_caps_can_intersect(caps, tmpl));
  gst_caps_unref(tmpl);
  gst_caps_unref(caps);
  caps = gst_caps_from_string("application/x-videotrain-tensor, content=weights, dtype=float32, device=cpu");
  EXPECT_FALSE(tensor_caps_parse(caps, &info, &why));
  EXPECT_NE(why.find("weights"), std::string::npos) << why;
  gst_caps_unref(caps);
}

namespace {
VIDEOTRAIN_DEFINE_ENUM(test_enum_get_type, "VideotrainTestEnum", {0, "Zero", "zero"}, {5, "Five", "five"})
}  // namespace

TEST(GstEnum, RegistersOnceAndMapsNicks) {
  GType t = test_enum_get_type();
  ASSERT_TRUE(G_TYPE_IS_ENUM(t));
  EXPECT_EQ(t, test_enum_get_type());
  EXPECT_STREQ(g_type_name(t), "VideotrainTestEnum");
  EXPECT_EQ(enum_nick(t, 5), "five");
  EXPECT_EQ(enum_nick(t, 3), "");
  EXPECT_EQ(enum_value(t, "five"), 5);
  EXPECT_EQ(enum_value(t, "six", -1), -1);
}

TEST(DeviceRule, AutoSpreadsLocalRanksOverTheVisibleGpus) {
  std::string err;
  EXPECT_EQ(resolve_device("", 0, 0, &err), "cpu");
  EXPECT_EQ(resolve_device("auto", 3, 0, &err), "cpu");
  EXPECT_EQ(resolve_device("auto", 0, 4, &err), "cuda:0");
  EXPECT_EQ(resolve_device("", 5, 4, &err), "cuda:1");
  EXPECT_EQ(resolve_device("cuda", 6, 4, &err), "cuda:2");
  EXPECT_EQ(resolve_device("cpu", 1, 4, &err), "cpu");
  EXPECT_EQ(resolve_device("cuda:3", 0, 4, &err), "cuda:3");
  EXPECT_EQ(err, "");
}

TEST(DeviceRule, UnusableDevicesAreErrorsNamingTheProperty) {
  auto error_of = [](const std::string &requested, int cuda_devices) {
    std::string err;
    EXPECT_EQ(resolve_device(requested, 0, cuda_devices, &err), "") << requested;
    EXPECT_NE(err.find("property device"), std::string::npos) << err;
    EXPECT_NE(err.find("'" + requested + "'"), std::string::npos) << err;
    return err;
  };
  EXPECT_NE(error_of("cuda:4", 4).find("sees 4 CUDA device(s)"), std::string::npos);
  EXPECT_NE(error_of("cuda:0", 0).find("no CUDA device"), std::string::npos);
  EXPECT_NE(error_of("cuda", 0).find("no CUDA device"), std::string::npos);
  for (const char *bad : {"gpu", "cuda:", "cuda:x", "cuda0", "cuda:-1", "cuda:99999", "CPU", "mps"})
    EXPECT_NE(error_of(bad, 2).find("not a device name"), std::string::npos) << bad;
}

// Settings structs hold strings as std::string: a NULL set is "", and "" reads back as NULL (the specs' unset value).
TEST(StringProperty, EmptyIsNullBothWays) {
  GValue v = G_VALUE_INIT;
  g_value_init(&v, G_TYPE_STRING);
  EXPECT_EQ(string_property(&v), "");
  g_value_set_string(&v, "a.csv");
  EXPECT_EQ(string_property(&v), "a.csv");
  set_string_property(&v, "");
  EXPECT_EQ(g_value_get_string(&v), nullptr);
  set_string_property(&v, "b");
  EXPECT_STREQ(g_value_get_string(&v), "b");
  g_value_unset(&v);
}
