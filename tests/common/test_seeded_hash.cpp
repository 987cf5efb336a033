// elements/common/seeded_hash.h against values computed independently (python3, from the published
// splitmix64 algorithm and from the formulas the trainer and validator used before they were shared):
// any change here changes existing runs' shuffles, windows and noise.
#include <gtest/gtest.h>

#include "seeded_hash.h"

using namespace videotrain;

TEST(SeededHash, SplitMix64StreamMatchesTheReferenceGenerator) {
  SplitMix64 g{1234567};
  EXPECT_EQ(g.next(), 0x599ed017fb08fc85ULL);
  EXPECT_EQ(g.next(), 0x2c73f08458540fa5ULL);
  EXPECT_EQ(g.next(), 0x883ebce5a3f27c77ULL);
  SplitMix64 u{9};
  for (int i = 0; i < 1000; i++) {
    const double x = u.uniform();
    ASSERT_TRUE(x >= 0.0 && x < 1.0) << x;
  }
}

TEST(SeededHash, Mix64AndHashCombine) {
  EXPECT_EQ(mix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(mix64(42), 0xbdd732262feb6e95ULL);
  EXPECT_EQ(hash_combine(7, 3), 0xa79698f2a0cde86dULL);
  EXPECT_NE(hash_combine(7, 3), hash_combine(3, 7));
  static_assert(mix64(1) == splitmix_finalize(1 + kGolden64), "usable at compile time");
}

TEST(SeededHash, StepAndValidationSeedsKeepTheirValues) {
  EXPECT_EQ(step_seed(0, 0, 0), 2200593912507688568ULL);
  EXPECT_EQ(step_seed(42, 1, 1000), 8014092190259258791ULL);
  EXPECT_EQ(validation_seed(0), 5379851145666825630LL);
  EXPECT_EQ(validation_seed(123456789), 5386418938804172138LL);
  EXPECT_GE(validation_seed(~0ULL), 0);
}
