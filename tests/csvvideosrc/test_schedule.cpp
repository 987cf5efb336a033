#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "csvvideosrc/schedule.h"

using videotrain::Schedule;

TEST(Schedule, ClipsPerEpochIsCeilOfRowsOverWorld) {
  EXPECT_EQ(Schedule(10, 0, 3, true, 1).clips_per_epoch(), 4u);
  EXPECT_EQ(Schedule(9, 2, 3, true, 1).clips_per_epoch(), 3u);
  EXPECT_EQ(Schedule(1, 0, 4, true, 1).clips_per_epoch(), 1u);
}

TEST(Schedule, EpochIsAPermutationDependingOnSeedAndEpoch) {
  Schedule s(100, 0, 1, true, 7);
  std::vector<uint64_t> e0, e1;
  for (uint64_t c = 0; c < 100; c++) e0.push_back(s.at(0, c).index), e1.push_back(s.at(1, c).index);
  std::vector<uint64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t i = 0; i < 100; i++) EXPECT_EQ(sorted[i], i);
  EXPECT_NE(e0, e1);
  Schedule again(100, 0, 1, true, 7), other(100, 0, 1, true, 8);
  int same_other = 0;
  for (uint64_t c = 0; c < 100; c++) {
    EXPECT_EQ(again.at(0, c).index, e0[c]);
    same_other += other.at(0, c).index == e0[c];
  }
  EXPECT_LT(same_other, 20);
}

TEST(Schedule, RanksAreDisjointAndGlobalOrderIndependentOfWorld) {
  const uint64_t n = 37;
  Schedule one(n, 0, 1, true, 3);
  for (int world : {2, 3, 4, 8}) {
    std::set<uint64_t> seen;
    uint64_t padding = 0;
    for (int r = 0; r < world; r++) {
      Schedule s(n, r, world, true, 3);
      EXPECT_EQ(s.clips_per_epoch(), (n + world - 1) / world);
      for (uint64_t c = 0; c < s.clips_per_epoch(); c++) {
        auto slot = s.at(5, c);
        uint64_t pos = r + c * world;
        if (pos < n) {
          EXPECT_FALSE(slot.padding);
          EXPECT_TRUE(seen.insert(slot.index).second) << "row visited twice, world " << world;
          EXPECT_EQ(slot.index, one.at(5, pos).index) << "global order changed with world " << world;
        } else {
          EXPECT_TRUE(slot.padding);
          EXPECT_EQ(slot.index, one.at(5, pos % n).index) << "padding wraps to the start";
          padding++;
        }
      }
    }
    EXPECT_EQ(seen.size(), n);
    EXPECT_EQ(padding, ((n + world - 1) / world) * world - n);
  }
}

TEST(Schedule, NoShuffleIsIdentity) {
  Schedule s(5, 1, 2, false, 0);
  EXPECT_EQ(s.at(0, 0).index, 1u);
  EXPECT_EQ(s.at(0, 1).index, 3u);
  EXPECT_EQ(s.at(3, 2).index, 0u);
  EXPECT_TRUE(s.at(3, 2).padding);
}

TEST(Schedule, ReplacementsComeFromTheSameShardAndAreMarkedAsPadding) {
  Schedule s(20, 1, 4, true, 9);
  std::set<uint64_t> shard;
  for (uint64_t c = 0; c < s.clips_per_epoch(); c++) shard.insert(s.at(2, c).index);
  for (uint64_t k = 1; k < 5; k++) {
    auto r = s.replacement(2, 3, k);
    EXPECT_TRUE(shard.count(r.index));
    EXPECT_EQ(r.index, s.at(2, (3 + k) % s.clips_per_epoch()).index);
    EXPECT_TRUE(r.padding);
  }
}
