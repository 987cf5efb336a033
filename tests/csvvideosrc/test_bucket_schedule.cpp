/* Buckets without video: parsing, the choice of bucket, and the group schedule's promises
 * (one bucket per step, full steps but one per bucket and epoch, equal steps per rank, order
 * independent of the world size, replacements from the same bucket). */
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "csvvideosrc/bucket_schedule.h"

using namespace videotrain;

TEST(BucketParse, SizesAndFrameCounts) {
  std::vector<FrameSize> s;
  std::string why;
  ASSERT_TRUE(parse_size_buckets(" 720x480, 480x720,640X640 ", &s, &why)) << why;
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1].width, 480);
  EXPECT_EQ(s[2].height, 640);
  ASSERT_TRUE(parse_size_buckets("", &s, &why));
  EXPECT_TRUE(s.empty());
  for (const char *bad : {"720", "720x", "x480", "720x480,", "1x480", "720x480,720x480", "7e2x480", "-720x480"}) {
    EXPECT_FALSE(parse_size_buckets(bad, &s, &why)) << bad;
    EXPECT_NE(why.find("buckets"), std::string::npos) << why;
  }
  std::vector<int> f;
  ASSERT_TRUE(parse_frame_buckets("17,49,33", &f, &why)) << why;
  EXPECT_EQ(f, (std::vector<int>{49, 33, 17}));  // longest first
  for (const char *bad : {"0", "49,,17", "49,49", "a", "200000"}) {
    EXPECT_FALSE(parse_frame_buckets(bad, &f, &why)) << bad;
    EXPECT_NE(why.find("frame-buckets"), std::string::npos) << why;
  }
}

TEST(BucketChoice, NearestLogAspectRatioTieToLargerArea) {
  const std::vector<FrameSize> b = {{64, 48}, {48, 48}, {48, 64}, {64, 32}};  // 4:3, 1:1, 3:4, 2:1
  EXPECT_EQ(nearest_size_bucket(b, 1920, 1080), 3);  // 16:9 -> 2:1 (log distance 0.118 vs 0.288)
  EXPECT_EQ(nearest_size_bucket(b, 640, 480), 0);
  EXPECT_EQ(nearest_size_bucket(b, 100, 101), 1);
  EXPECT_EQ(nearest_size_bucket(b, 1080, 1920), 2);  // 9:16 -> 3:4, the tallest
  // A square video is exactly between 1:2 and 2:1 in log ratio: the larger area wins, whichever
  // is listed first, and equal areas go to the first listed.
  EXPECT_EQ(nearest_size_bucket({{16, 32}, {64, 32}}, 100, 100), 1);
  EXPECT_EQ(nearest_size_bucket({{64, 32}, {16, 32}}, 100, 100), 0);
  EXPECT_EQ(nearest_size_bucket({{32, 64}, {64, 32}}, 100, 100), 0);
  EXPECT_EQ(nearest_size_bucket(b, 0, 10), -1);
}

TEST(BucketChoice, LongestLengthTheVideoSupplies) {
  const std::vector<int> f = {49, 33, 17};
  EXPECT_EQ(longest_frame_bucket(f, 49, 1, 0, 0), 0);
  EXPECT_EQ(longest_frame_bucket(f, 48, 1, 0, 0), 1);
  EXPECT_EQ(longest_frame_bucket(f, 17, 1, 0, 0), 2);
  EXPECT_EQ(longest_frame_bucket(f, 16, 1, 0, 0), -1);
  EXPECT_EQ(longest_frame_bucket(f, 97, 2, 0, 0), 0);   // (49-1)*2+1 = 97 frames
  EXPECT_EQ(longest_frame_bucket(f, 96, 2, 0, 0), 1);
  // fps=8 from a 24 fps video: 17 frames span 16/8 s = 48 source frames steps.
  EXPECT_EQ(longest_frame_bucket(f, 49, 1, 8, 24), 2);
  EXPECT_EQ(longest_frame_bucket(f, 48, 1, 8, 24), -1);
}

namespace {

struct RankSteps {
  std::vector<std::vector<BucketSlot>> steps;  // per step, its clips
};

// Steps of one rank in one epoch, cut at group changes as the microbatcher cuts them.
RankSteps rank_epoch(const BucketSchedule &s, uint32_t epoch) {
  RankSteps r;
  for (uint64_t c = 0; c < s.clips_in_epoch(epoch); c++) {
    const BucketSlot b = s.at(epoch, c);
    if (r.steps.empty() || r.steps.back().front().group != b.group ||
        r.steps.back().size() == r.steps.back().front().group_size)
      r.steps.emplace_back();
    r.steps.back().push_back(b);
  }
  return r;
}

std::vector<uint32_t> buckets_of(size_t rows, uint32_t nb, int left_out_every) {
  std::vector<uint32_t> b(rows);
  for (size_t i = 0; i < rows; i++)
    b[i] = (left_out_every && i % left_out_every == 0) ? BucketSchedule::kNoBucket : uint32_t((i * 7 + i / 3) % nb);
  return b;
}

}  // namespace

TEST(BucketScheduleTest, StepsAreOneBucketFullButOnePerBucketAndEqualAcrossRanks) {
  const uint32_t nb = 5, B = 4;
  const auto rb = buckets_of(203, nb, 10);
  for (int world : {1, 2, 3, 8}) {
    std::map<uint32_t, uint64_t> population;
    for (uint32_t b : rb)
      if (b != BucketSchedule::kNoBucket) population[b]++;
    for (uint32_t epoch : {0u, 1u, 5u}) {
      std::multiset<uint64_t> seen;
      std::map<uint32_t, int> partial;  // bucket -> partial steps over all ranks
      uint64_t steps0 = 0;
      for (int rank = 0; rank < world; rank++) {
        BucketSchedule s(rb, nb, rank, world, true, 11, B);
        const RankSteps r = rank_epoch(s, epoch);
        EXPECT_EQ(r.steps.size(), s.steps_per_epoch());
        if (rank == 0) steps0 = r.steps.size();
        EXPECT_EQ(r.steps.size(), steps0) << "world " << world << " rank " << rank;
        for (const auto &step : r.steps) {
          for (const auto &c : step) {
            EXPECT_EQ(c.bucket, step.front().bucket);
            EXPECT_EQ(rb[c.index], c.bucket);  // every clip in its row's bucket
            if (!c.padding) seen.insert(c.index);
          }
          EXPECT_LE(step.size(), B);
          EXPECT_EQ(step.size(), step.front().group_size);
          if (step.size() < B && !step.front().padding) partial[step.front().bucket]++;
        }
      }
      // Each usable row exactly once (padding aside); at most one partial step per bucket.
      EXPECT_EQ(seen.size(), rb.size() - (rb.size() + 9) / 10);
      EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), seen.size());
      for (auto &p : partial) EXPECT_LE(p.second, 1) << "bucket " << p.first;
      for (auto &p : population)
        EXPECT_EQ(partial.count(p.first) ? 1u : 0u, p.second % B ? 1u : 0u) << "bucket " << p.first;
    }
  }
}

TEST(BucketScheduleTest, OrderDoesNotDependOnTheWorldSize) {
  const auto rb = buckets_of(150, 3, 0);
  BucketSchedule one(rb, 3, 0, 1, true, 4, 4);
  const RankSteps all = rank_epoch(one, 2);
  for (int world : {2, 3, 4}) {
    std::vector<RankSteps> ranks;
    for (int r = 0; r < world; r++) ranks.push_back(rank_epoch(BucketSchedule(rb, 3, r, world, true, 4, 4), 2));
    // Global step g of the single rank is step g / W of rank g % W.
    for (size_t g = 0; g < all.steps.size(); g++) {
      const auto &mine = ranks[g % world].steps[g / world];
      ASSERT_EQ(mine.size(), all.steps[g].size());
      for (size_t k = 0; k < mine.size(); k++) EXPECT_EQ(mine[k].index, all.steps[g][k].index);
    }
  }
}

TEST(BucketScheduleTest, ReplacementsStayInTheBucketAndEpochsDiffer) {
  const auto rb = buckets_of(60, 4, 0);
  BucketSchedule s(rb, 4, 1, 2, true, 3, 3);
  for (uint64_t c = 0; c < s.clips_in_epoch(0); c++) {
    const BucketSlot a = s.at(0, c);
    for (uint64_t k = 1; k < 6; k++) {
      const BucketSlot r = s.replacement(0, c, k);
      EXPECT_EQ(r.bucket, a.bucket);
      EXPECT_EQ(rb[r.index], a.bucket);
      EXPECT_TRUE(r.padding);
      EXPECT_EQ(r.group, a.group);  // it takes the failed clip's place in its step
      EXPECT_NE(r.index, a.index);
    }
  }
  std::vector<uint64_t> e0, e1;
  for (uint64_t c = 0; c < 10; c++) e0.push_back(s.at(0, c).index), e1.push_back(s.at(1, c).index);
  EXPECT_NE(e0, e1);
  BucketSchedule again(rb, 4, 1, 2, true, 3, 3);
  for (uint64_t c = 0; c < 10; c++) EXPECT_EQ(again.at(1, c).index, e1[c]);  // a function of the epoch: resumable
}

TEST(BucketScheduleTest, ALoneRowIsStoodInForByOtherBucketsAtItsShape) {
  std::vector<uint32_t> rb(20, 0);
  rb[7] = 1;  // bucket 1 holds one row
  BucketSchedule s(rb, 2, 0, 1, false, 0, 4);
  uint64_t clip = 0;
  while (s.at(0, clip).index != 7) clip++;
  std::set<uint64_t> stand_ins;
  for (uint64_t k = 1; k < 20; k++) {
    const BucketSlot r = s.replacement(0, clip, k);
    EXPECT_EQ(r.bucket, 1u);  // the failed clip's shape
    EXPECT_EQ(r.group_size, 1u);
    EXPECT_TRUE(r.padding);
    stand_ins.insert(r.index);
  }
  EXPECT_EQ(stand_ins.size(), 19u);  // every other row, once
  EXPECT_EQ(stand_ins.count(7), 0u);
}
