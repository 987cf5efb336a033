/* StepAgreement (end-of-stream agreement) against scripted store marks: joining the steps
 * a peer starts, the step in progress at EOS, and the three ways it gives up (a peer gone,
 * the timeout, an interruption). The two-process runs: test_ddp_multirank.cpp. */
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddptrainsink/step_agreement.h"

using namespace videotrain;

namespace {

// Rank 0 of 2; rank 1's marks are set by the test (or by `on_join`).
struct Marks : PeerMarks {
  std::map<int, uint64_t> ended;
  uint64_t peer_begin = 0;
  int gone = -1;
  void mark_begin(uint64_t) override {}
  void mark_end(uint64_t steps) override { ended[0] = steps; }
  uint64_t max_peer_begin() override { return peer_begin; }
  bool all_ended_at(uint64_t steps) override {
    return ended.count(0) && ended[0] == steps && ended.count(1) && ended[1] == steps;
  }
  int peer_gone_before(uint64_t) override { return gone; }
  std::string describe_peers() override { return "rank 1 stopped responding (last finished step 2)"; }
};

std::string error_of(StepAgreement &a, uint64_t steps, bool mid, const std::function<uint64_t()> &join) {
  try {
    a.join_until_all_end(steps, mid, join);
  } catch (const std::runtime_error &e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(StepAgreement, JoinsTheStepsAPeerStartsUntilBothEndAtTheSameStep) {
  Marks m;
  m.peer_begin = 3;  // rank 0's data ended at step 2; rank 1 goes on with steps 3 and 4
  StepAgreement a(m, 30);
  uint64_t steps = 2;
  std::vector<uint64_t> joined;
  const uint64_t end = a.join_until_all_end(steps, false, [&] {
    joined.push_back(++steps);
    // A peer starts its next step only once the one before is done (both ranks in it).
    if (steps == 3) m.peer_begin = 4;
    if (steps == 4) m.ended[1] = 4;  // rank 1's data ends after step 4
    return steps;
  });
  EXPECT_EQ(end, 4u);
  EXPECT_EQ(m.ended[0], 4u);
  EXPECT_EQ(joined, (std::vector<uint64_t>{3, 4}));
}

TEST(StepAgreement, TheStepInProgressAtEndOfStreamIsJoinedFirst) {
  Marks m;
  StepAgreement a(m, 30);
  int joins = 0;
  const uint64_t end = a.join_until_all_end(5, true, [&] {
    joins++;
    m.ended[1] = 6;
    return uint64_t{6};
  });
  EXPECT_EQ(end, 6u);
  EXPECT_EQ(joins, 1);
}

TEST(StepAgreement, APeerGoneATimeoutOrAnInterruptionIsAnError) {
  {
    Marks m;
    m.gone = 1;
    StepAgreement a(m, 30);
    const std::string e = error_of(a, 2, false, [] { return uint64_t{3}; });
    EXPECT_NE(e.find("end of stream after step 2: rank 1 stopped without reaching it"), std::string::npos) << e;
  }
  {
    Marks m;
    StepAgreement a(m, 0.05);
    const std::string e = error_of(a, 2, false, [] { return uint64_t{3}; });
    EXPECT_NE(e.find("for the other ranks to end or start a step: rank 1 stopped responding"), std::string::npos) << e;
  }
  {
    Marks m;
    StepAgreement a(m, 30, [] { return true; });
    const std::string e = error_of(a, 2, false, [] { return uint64_t{3}; });
    EXPECT_NE(e.find("interrupted"), std::string::npos) << e;
  }
}
