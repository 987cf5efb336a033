/* val_buffers (ddpvalsink's buffers into ValidationEngine::push) and the run's shared state:
 * micro-batch samples keep the clip index and epoch their batch meta gives each of them;
 * validators of two runs keep two hubs. */
#include <gtest/gtest.h>

#include "ddpvalsink/val_buffers.h"
#include "metas.h"
#include "tensor_buffer.h"
#include "test_util.h"
#include "valsink_test_util.h"

using namespace videotrain;
using namespace valtest;

namespace {

using R = ValidationEngine::Result;

ValidationConfig one_of_two_shards() {
  ValidationConfig c;
  c.shard_index = 0;
  c.num_shards = 2;
  c.every = 0;
  c.at_start = true;
  c.device = "cpu";
  return c;
}

// A micro-batch buffer of the samples (id, epoch, clip index, padding); the batch meta's
// own epoch/next_clip (the position after the step) are set to something else on purpose.
GstBuffer *micro_batch(const std::vector<std::tuple<uint64_t, unsigned, uint64_t, bool>> &samples) {
  std::vector<at::Tensor> xs;
  BatchInfo info;
  info.micro_count = 1;
  info.sync = true;
  info.epoch = 7;
  info.next_clip = 99;
  for (auto [id, epoch, clip, pad] : samples) {
    xs.push_back(latent(id));
    info.sample_ids.push_back(id);
    info.captions.push_back(caption(id));
    info.padding.push_back(pad);
    info.clip_indices.push_back(clip);
    info.epochs.push_back(epoch);
  }
  info.step_samples = static_cast<uint32_t>(samples.size());
  GstBuffer *buf = buffer_from_tensor(at::stack(xs));
  write_batch_meta(buf, info);
  return buf;
}

}  // namespace

// Shard 0 of 2 takes the even clip indices the meta gives: 6, 8 and 10 of epoch 0 (counting
// positions in the stream would give 0 and 4: two samples); clip 4 is padding. The epoch-1
// sample in the second micro-batch ends the pass (the meta's own epoch says 7).
TEST(ValBuffers, MicroBatchSamplesKeepTheClipIndexAndEpochOfTheirBatchMeta) {
  TrainerEngine trainer(trainer_config());
  ASSERT_TRUE(trainer.start()) << trainer.error();
  ValidationEngine e(one_of_two_shards());
  ASSERT_TRUE(e.attach(borrowed(trainer)));
  e.trainer_finished();  // the at-start snapshot is the last one
  std::string error;
  GstBuffer *a = micro_batch({{10, 0, 1, false}, {11, 0, 3, false}, {12, 0, 4, true}, {13, 0, 6, false}});
  EXPECT_EQ(validate_buffer(e, a, &error), R::kOk) << error;
  gst_buffer_unref(a);
  GstBuffer *b = micro_batch({{14, 0, 8, false}, {15, 0, 10, false}, {10, 1, 0, false}});
  EXPECT_EQ(validate_buffer(e, b, &error), R::kEos) << error;
  gst_buffer_unref(b);
  EXPECT_EQ(e.passes_done(), 1u);
  EXPECT_EQ(e.evaluated_samples(), 3u);
}

TEST(ValBuffers, ABufferWithoutSampleOrBatchMetaIsAnError) {
  TrainerEngine trainer(trainer_config());
  ASSERT_TRUE(trainer.start()) << trainer.error();
  ValidationEngine e(one_of_two_shards());
  ASSERT_TRUE(e.attach(borrowed(trainer)));
  GstBuffer *plain = buffer_from_tensor(latent(0));
  std::string error;
  EXPECT_EQ(validate_buffer(e, plain, &error), R::kError);
  EXPECT_NE(error.find("neither a sample meta"), std::string::npos) << error;
  gst_buffer_unref(plain);
}

// The hub lives in the run (RunContext::shared_state), not in a process-wide registry:
// shard 0 of each of two runs attaches, a second shard 0 of the same run does not, and
// once every shard has left, a new one starts a new hub.
TEST(ValBuffers, ValidatorsOfTwoRunsKeepTwoHubs) {
  TrainerEngine one(trainer_config()), two(trainer_config());
  ASSERT_TRUE(one.start()) << one.error();
  ASSERT_TRUE(two.start()) << two.error();
  {
    ValidationEngine a(one_of_two_shards()), b(one_of_two_shards()), again(one_of_two_shards());
    EXPECT_TRUE(a.attach(borrowed(one)));
    EXPECT_TRUE(b.attach(borrowed(two)));
    EXPECT_FALSE(again.attach(borrowed(one)));
    EXPECT_NE(again.error().find("used by two ddpvalsinks"), std::string::npos) << again.error();
  }
  auto other = one_of_two_shards();
  other.every = 3;  // would disagree with a hub that outlived its shards
  ValidationEngine later(other);
  EXPECT_TRUE(later.attach(borrowed(one))) << later.error();

  int made = 0;
  std::function<std::shared_ptr<int>()> make = [&] { return std::make_shared<int>(++made); };
  auto held = one.shared_state<int>("test", make);
  EXPECT_EQ(*one.shared_state<int>("test", make), 1);
  EXPECT_EQ(*two.shared_state<int>("test", make), 2);
  held.reset();
  EXPECT_EQ(*one.shared_state<int>("test", make), 3);
}
