/* MicroBatcherEngine without GStreamer elements or torch: steps, grouping, marks. */
#include <gtest/gtest.h>

#include <set>

#include "microbatcher/microbatcher_engine.h"

using namespace videotrain;

namespace {

// Handles are ints allocated here; the release callback records what the engine drops.
struct Fixture {
  std::set<int *> live;
  std::vector<uint64_t> released_ids;
  std::unique_ptr<MicroBatcherEngine> engine;
  std::vector<MicroBatch> out;

  explicit Fixture(MicroBatcherConfig cfg) {
    engine = std::make_unique<MicroBatcherEngine>(cfg, [this](void *h) {
      auto *p = static_cast<int *>(h);
      released_ids.push_back(static_cast<uint64_t>(*p));
      live.erase(p);
      delete p;
    });
  }
  ~Fixture() {
    engine.reset();
    for (auto &mb : out) take(mb);
    for (int *p : live) delete p;
  }
  // Returns the ids of a micro-batch's samples and frees their handles (caller-owned).
  std::vector<uint64_t> take(MicroBatch &mb) {
    std::vector<uint64_t> ids;
    for (auto &s : mb.samples) {
      ids.push_back(s.sample_id);
      auto *p = static_cast<int *>(s.handle);
      live.erase(p);
      delete p;
      s.handle = nullptr;
    }
    return ids;
  }
  bool push(uint64_t id, std::vector<int64_t> shape, uint32_t epoch = 0, uint64_t clip = 0,
            std::string *why = nullptr, uint64_t group = 0, uint32_t group_size = 0) {
    MicroBatcherSample s;
    s.group = group;
    s.group_size = group_size;
    auto *h = new int(static_cast<int>(id));
    live.insert(h);
    s.handle = h;
    s.shape = std::move(shape);
    s.sample_id = id;
    s.epoch = epoch;
    s.clip_index = clip;
    s.caption = "caption " + std::to_string(id);
    std::string w;
    bool ok = engine->push(std::move(s), &out, why ? why : &w);
    return ok;
  }
};

const std::vector<int64_t> A = {4, 2, 8, 8};
const std::vector<int64_t> B = {4, 3, 8, 8};
const std::vector<int64_t> C = {4, 2, 6, 10};

}  // namespace

TEST(MicroBatcherEngine, ValidateRejectsNonDivisor) {
  std::string why;
  MicroBatcherConfig cfg;
  cfg.batch_size = 8;
  cfg.micro_batch_size = 3;
  EXPECT_FALSE(MicroBatcherEngine::validate(cfg, &why));
  EXPECT_NE(why.find("micro-batch-size=3"), std::string::npos) << why;
  EXPECT_NE(why.find("batch-size=8"), std::string::npos) << why;
  cfg.micro_batch_size = 16;
  EXPECT_FALSE(MicroBatcherEngine::validate(cfg, &why));
  cfg.micro_batch_size = 4;
  EXPECT_TRUE(MicroBatcherEngine::validate(cfg, &why));
  cfg.micro_batch_size = 0;  // = batch-size
  EXPECT_TRUE(MicroBatcherEngine::validate(cfg, &why));
  EXPECT_EQ(cfg.effective_micro_batch_size(), 8u);
  cfg.batch_size = 0;
  EXPECT_FALSE(MicroBatcherEngine::validate(cfg, &why));
}

TEST(MicroBatcherEngine, UniformShapeSplitsStepIntoMicroBatches) {
  MicroBatcherConfig cfg;
  cfg.batch_size = 6;
  cfg.micro_batch_size = 2;
  Fixture f(cfg);
  for (uint64_t i = 0; i < 5; i++) ASSERT_TRUE(f.push(i, A, 0, i));
  EXPECT_TRUE(f.out.empty());  // step not complete yet
  EXPECT_EQ(f.engine->held(), 5u);
  ASSERT_TRUE(f.push(5, A, 0, 5));
  ASSERT_EQ(f.out.size(), 3u);
  for (uint32_t i = 0; i < 3; i++) {
    EXPECT_EQ(f.out[i].step, 0u);
    EXPECT_EQ(f.out[i].micro_index, i);
    EXPECT_EQ(f.out[i].micro_count, 3u);
    EXPECT_EQ(f.out[i].step_samples, 6u);
    EXPECT_EQ(f.out[i].sync, i == 2);
    EXPECT_EQ(f.out[i].epoch, 0u);
    EXPECT_EQ(f.out[i].next_clip, 6u);
    EXPECT_EQ(f.take(f.out[i]), (std::vector<uint64_t>{2 * i, 2 * i + 1}));
  }
  EXPECT_EQ(f.engine->held(), 0u);
  EXPECT_EQ(f.engine->next_step(), 1u);
}

TEST(MicroBatcherEngine, BucketsGroupByShapeInOrderOfFirstAppearance) {
  MicroBatcherConfig cfg;
  cfg.batch_size = 8;
  cfg.micro_batch_size = 2;
  Fixture f(cfg);
  // Arrival: B A B C A A B B
  const std::vector<std::vector<int64_t>> shapes = {B, A, B, C, A, A, B, B};
  for (uint64_t i = 0; i < shapes.size(); i++) ASSERT_TRUE(f.push(i, shapes[i], 0, 10 + i));
  // Groups: B {0,2,6,7} -> [0,2] [6,7]; A {1,4,5} -> [1,4] [5]; C {3} -> [3]
  ASSERT_EQ(f.out.size(), 5u);
  const std::vector<std::vector<uint64_t>> want = {{0, 2}, {6, 7}, {1, 4}, {5}, {3}};
  const std::vector<std::vector<int64_t>> want_shape = {B, B, A, A, C};
  for (size_t i = 0; i < want.size(); i++) {
    EXPECT_EQ(f.out[i].micro_count, 5u);
    EXPECT_EQ(f.out[i].step_samples, 8u);
    EXPECT_EQ(f.out[i].sync, i == 4);
    EXPECT_EQ(f.out[i].next_clip, 18u);  // clip of the last arrival (7) + 1
    for (const auto &s : f.out[i].samples) EXPECT_EQ(s.shape, want_shape[i]);
    EXPECT_EQ(f.take(f.out[i]), want[i]);
  }
}

TEST(MicroBatcherEngine, SameInputsGiveSameBatches) {
  auto run = [] {
    MicroBatcherConfig cfg;
    cfg.batch_size = 4;
    cfg.micro_batch_size = 2;
    Fixture f(cfg);
    const std::vector<std::vector<int64_t>> shapes = {C, A, C, A, B, A, B, C};
    for (uint64_t i = 0; i < shapes.size(); i++) f.push(i, shapes[i], 0, i);
    std::vector<std::vector<uint64_t>> ids;
    for (auto &mb : f.out) ids.push_back(f.take(mb));
    return ids;
  };
  auto a = run();
  EXPECT_EQ(a, run());
  EXPECT_EQ(a, (std::vector<std::vector<uint64_t>>{{0, 2}, {1, 3}, {4, 6}, {5}, {7}}));
}

TEST(MicroBatcherEngine, StepsContinueAcrossEpochsAndStartStep) {
  MicroBatcherConfig cfg;
  cfg.batch_size = 4;
  cfg.micro_batch_size = 4;
  cfg.start_step = 100;
  Fixture f(cfg);
  // Epoch 0: 6 samples -> one full step (100) and a partial one (101) at the epoch end.
  for (uint64_t i = 0; i < 6; i++) ASSERT_TRUE(f.push(i, A, 0, i));
  ASSERT_EQ(f.out.size(), 1u);
  f.engine->finish(&f.out);  // the face's epoch-end event
  ASSERT_EQ(f.out.size(), 2u);
  for (uint64_t i = 0; i < 4; i++) ASSERT_TRUE(f.push(100 + i, A, 1, i));
  ASSERT_EQ(f.out.size(), 3u);
  EXPECT_EQ(f.out[0].step, 100u);
  EXPECT_EQ(f.out[1].step, 101u);
  EXPECT_EQ(f.out[1].step_samples, 2u);
  EXPECT_TRUE(f.out[1].sync);
  EXPECT_EQ(f.out[1].epoch, 0u);
  EXPECT_EQ(f.out[1].next_clip, 6u);
  EXPECT_EQ(f.take(f.out[1]), (std::vector<uint64_t>{4, 5}));
  EXPECT_EQ(f.out[2].step, 102u);
  EXPECT_EQ(f.out[2].epoch, 1u);
  EXPECT_EQ(f.out[2].next_clip, 4u);
  EXPECT_EQ(f.take(f.out[2]), (std::vector<uint64_t>{100, 101, 102, 103}));
}

TEST(MicroBatcherEngine, EpochChangeInMetasAloneDoesNotCloseAStep) {
  // Epoch ends arrive one way, as csvvideosrc's event (the face calls finish()).
  MicroBatcherConfig cfg;
  cfg.batch_size = 4;
  Fixture f(cfg);
  for (uint64_t i = 0; i < 6; i++) ASSERT_TRUE(f.push(i, A, 0, i));
  for (uint64_t i = 0; i < 2; i++) ASSERT_TRUE(f.push(100 + i, A, 1, i));
  ASSERT_EQ(f.out.size(), 2u);
  EXPECT_EQ(f.take(f.out[1]), (std::vector<uint64_t>{4, 5, 100, 101}));
  EXPECT_EQ(f.out[1].epoch, 1u);
  EXPECT_EQ(f.out[1].next_clip, 2u);
}

TEST(MicroBatcherEngine, FinishEmitsPartialStep) {
  MicroBatcherConfig cfg;
  cfg.batch_size = 8;
  cfg.micro_batch_size = 2;
  Fixture f(cfg);
  for (uint64_t i = 0; i < 5; i++) ASSERT_TRUE(f.push(i, i == 2 ? B : A, 0, i));
  f.engine->finish(&f.out);
  ASSERT_EQ(f.out.size(), 3u);  // A {0,1,3,4} -> 2, B {2} -> 1
  for (auto &mb : f.out) {
    EXPECT_EQ(mb.step_samples, 5u);
    EXPECT_EQ(mb.micro_count, 3u);
    EXPECT_EQ(mb.next_clip, 5u);
  }
  EXPECT_TRUE(f.out[2].sync);
  EXPECT_EQ(f.take(f.out[2]), (std::vector<uint64_t>{2}));
  f.engine->finish(&f.out);  // nothing held: nothing more
  EXPECT_EQ(f.out.size(), 3u);
}

TEST(MicroBatcherEngine, DropLastReleasesPartialStepWithoutUsingAStepNumber) {
  MicroBatcherConfig cfg;
  cfg.batch_size = 4;
  cfg.drop_last = true;
  Fixture f(cfg);
  for (uint64_t i = 0; i < 6; i++) ASSERT_TRUE(f.push(i, A, 0, i));
  f.engine->finish(&f.out);  // epoch end drops {4, 5}
  ASSERT_TRUE(f.push(50, A, 1, 0));
  EXPECT_EQ(f.released_ids, (std::vector<uint64_t>{4, 5}));
  for (uint64_t i = 1; i < 4; i++) ASSERT_TRUE(f.push(50 + i, A, 1, i));
  ASSERT_EQ(f.out.size(), 2u);
  EXPECT_EQ(f.out[1].step, 1u);
  ASSERT_TRUE(f.push(60, A, 1, 4));
  f.engine->finish(&f.out);
  EXPECT_EQ(f.out.size(), 2u);
  EXPECT_EQ(f.released_ids, (std::vector<uint64_t>{4, 5, 60}));
  EXPECT_EQ(f.engine->dropped_samples(), 3u);
}

TEST(MicroBatcherEngine, FlushReleasesHeldSamples) {
  MicroBatcherConfig cfg;
  cfg.batch_size = 4;
  Fixture f(cfg);
  for (uint64_t i = 0; i < 3; i++) ASSERT_TRUE(f.push(i, A, 0, i));
  f.engine->flush();
  EXPECT_EQ(f.engine->held(), 0u);
  EXPECT_EQ(f.released_ids, (std::vector<uint64_t>{0, 1, 2}));
  for (uint64_t i = 10; i < 14; i++) ASSERT_TRUE(f.push(i, A, 0, i));
  ASSERT_EQ(f.out.size(), 1u);
  EXPECT_EQ(f.out[0].step, 0u);
  EXPECT_EQ(f.take(f.out[0]), (std::vector<uint64_t>{10, 11, 12, 13}));
}

TEST(MicroBatcherEngine, DestructionReleasesHeldSamples) {
  MicroBatcherConfig cfg;
  cfg.batch_size = 4;
  Fixture f(cfg);
  ASSERT_TRUE(f.push(7, A));
  f.engine.reset();
  EXPECT_EQ(f.released_ids, (std::vector<uint64_t>{7}));
  EXPECT_TRUE(f.live.empty());
}

TEST(MicroBatcherEngine, NoBucketKeepsArrivalOrderAndRejectsMixedMicroBatch) {
  MicroBatcherConfig cfg;
  cfg.batch_size = 4;
  cfg.micro_batch_size = 2;
  cfg.bucket = false;
  Fixture f(cfg);
  ASSERT_TRUE(f.push(0, A));
  ASSERT_TRUE(f.push(1, A));
  ASSERT_TRUE(f.push(2, B));  // starts micro-batch 1: fine
  std::string why;
  EXPECT_FALSE(f.push(3, A, 0, 0, &why));
  EXPECT_NE(why.find("sample 2"), std::string::npos) << why;
  EXPECT_NE(why.find("sample 3"), std::string::npos) << why;
  EXPECT_NE(why.find("[4, 3, 8, 8]"), std::string::npos) << why;
  EXPECT_EQ(f.released_ids, (std::vector<uint64_t>{3}));
  EXPECT_EQ(f.engine->held(), 3u);
  ASSERT_TRUE(f.push(4, B));
  ASSERT_EQ(f.out.size(), 2u);
  EXPECT_EQ(f.take(f.out[0]), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(f.take(f.out[1]), (std::vector<uint64_t>{2, 4}));
}

// csvvideosrc buckets: a step is one group (one shape), closed at the group's size, or early when
// the next sample belongs to another group (a clip lost upstream); drop-last never drops a group,
// since every rank runs each of its groups as a step.
TEST(MicroBatcherEngineTest, BucketGroupsAreSteps) {
  MicroBatcherConfig cfg;
  cfg.batch_size = 4;
  cfg.micro_batch_size = 2;
  cfg.drop_last = true;
  Fixture f(cfg);
  const std::vector<int64_t> a = {4, 2, 3, 4}, b = {4, 3, 4, 3};
  f.push(1, a, 0, 0, nullptr, 5, 4);
  f.push(2, a, 0, 1, nullptr, 5, 4);
  f.push(3, a, 0, 2, nullptr, 5, 4);
  EXPECT_TRUE(f.out.empty());
  f.push(4, a, 0, 3, nullptr, 5, 4);  // group 5 complete: a full step
  ASSERT_EQ(f.out.size(), 2u);
  EXPECT_EQ(f.out[1].step_samples, 4u);
  f.push(5, b, 0, 4, nullptr, 7, 1);  // a partial group of one: a step of its own, not dropped
  ASSERT_EQ(f.out.size(), 3u);
  EXPECT_EQ(f.out[2].step, 1u);
  EXPECT_EQ(f.take(f.out[2]), (std::vector<uint64_t>{5}));
  EXPECT_TRUE(f.out[2].sync);
  f.push(6, a, 0, 5, nullptr, 9, 3);
  f.push(7, a, 0, 6, nullptr, 9, 3);
  f.push(8, b, 0, 7, nullptr, 11, 2);  // group 9 lost its third clip: closed when group 11 starts
  ASSERT_EQ(f.out.size(), 4u);
  EXPECT_EQ(f.out[3].step, 2u);
  EXPECT_EQ(f.out[3].step_samples, 2u);
  EXPECT_EQ(f.engine->dropped_samples(), 0u);
  f.engine->finish(&f.out);  // epoch end: group 11's partial step (no drop: it is a group)
  ASSERT_EQ(f.out.size(), 5u);
  EXPECT_EQ(f.out[4].step_samples, 1u);
}
