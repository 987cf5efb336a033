/* Two-process Gloo runs of ValidationEngine: the test binary starts itself twice (fork
 * + exec, RANK/WORLD_SIZE/MASTER_PORT; tests/common/multirank.h) to run ValWorker.Rank.
 *  - 2 ranks x 2 in-process shards give the validation loss of 1 rank x 1 shard over the
 *    same validation set and weights (1e-6 relative);
 *  - skip-if-busy decides alike on every rank: a rank whose own validation is idle
 *    skips the steps that a busy peer skips; ranks whose training data ends after
 *    different steps all validate the same final step (ValStepsWorker.Rank);
 *  - validators that join a fast run at different steps (rank 1's after step 3) validate
 *    the same steps: the first that every rank's validator saw (ValJoinWorker.Rank);
 *  - a rank that dies before validating, or in the middle of a pass once the validation
 *    group exists (ValDeathWorker.Rank), makes the other fail within the timeout. */
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "multirank.h"
#include "test_util.h"
#include "valsink_test_util.h"

using namespace videotrain;
using namespace valtest;

namespace {

constexpr unsigned kTotal = 11;  // odd: rank 1 gets a padding clip

pid_t spawn(const std::string &mode, int rank, int port, const std::string &out,
            const std::string &worker = "ValWorker.Rank") {
  return vttest::spawn_rank(worker, rank, 2, port, {{"VT_VAL_MODE", mode}, {"VT_VAL_OUT", out}});
}

ValidationConfig vconfig(unsigned index, unsigned shards) {
  ValidationConfig c;
  c.shard_index = index;
  c.num_shards = shards;
  c.every = 0;
  c.at_start = true;
  c.device = "cpu";
  c.master_addr = "127.0.0.1";
  c.master_port = std::atoi(vttest::env_or("MASTER_PORT", "29500").c_str());
  c.timeout_s = 5;
  return c;
}

using R = ValidationEngine::Result;

R feed(ValidationEngine &e, int rank, int world) {
  auto samples = rank_samples(kTotal, rank, world, 0);
  for (const auto &s : samples)
    if (R r = e.push(latent(s.sample_id), {s}); r != R::kOk) return r;
  ValSample next = samples.front();
  next.epoch = 1;
  return e.push(latent(next.sample_id), {next});
}

}  // namespace

TEST(ValWorker, Rank) {
  const std::string mode = vttest::env_or("VT_VAL_MODE", "");
  const std::string out = vttest::env_or("VT_VAL_OUT", "");
  ASSERT_FALSE(mode.empty() || out.empty()) << "run by the ValMultiRank tests only";
  auto tc = trainer_config();
  tc.timeout_s = 5;
  auto trainer = std::make_shared<TrainerEngine>(tc);
  ASSERT_TRUE(trainer->start()) << trainer->error();
  const int rank = trainer->rank();
  if (mode == "dead" && rank == 1) _exit(0);  // goes away before validating
  ValidationEngine a(vconfig(0, 2)), b(vconfig(1, 2));
  ASSERT_TRUE(a.attach(trainer)) << a.error();
  ASSERT_TRUE(b.attach(trainer)) << b.error();
  a.trainer_finished();
  auto t0 = std::chrono::steady_clock::now();
  R ra = R::kOk, rb = R::kOk;
  std::thread tb([&] { rb = feed(b, rank, 2); });
  ra = feed(a, rank, 2);
  tb.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ofstream f(out);
  f.precision(17);
  const bool error = ra == R::kError || rb == R::kError;
  f << (error ? "error" : "ok") << "\n"
    << a.last_loss() << "\n"
    << took << "\n"
    << (ra == R::kError ? a.error() : b.error()) << "\n";
  f.close();
  trainer->stop();
  _exit(0);  // no static teardown racing Gloo threads
}


// A worker's verdict for its parent: "ok"/"error", the steps skipped and validated, steps
// trained, the last validated step and the error; then the process ends.
[[noreturn]] void write_verdict(const std::string &out, std::string error, R fed, ValidationEngine &e,
                                TrainerEngine &trainer) {
  if (error.empty() && fed == R::kError) error = e.error();
  std::ostringstream skipped, results;
  for (auto &m : e.take_messages()) {
    if (m.name == "ddpvalsink-skipped") skipped << m.ints["step"] << ",";
    if (m.name == "ddpvalsink-result") results << m.ints["step"] << ",";
  }
  std::ofstream f(out);
  f << (error.empty() ? "ok" : "error") << "\nskipped:" << skipped.str() << "\nresults:" << results.str()
    << "\ntrained:" << trainer.steps_done() << "\nlast:" << e.last_step() << "\n" << error << "\n";
  f.close();
  trainer.stop();
  _exit(0);
}

// Training steps with one validation shard per rank, as VT_VAL_MODE says:
//  skip: every=1, skip-if-busy. Rank 1 validates each snapshot at once, rank 0 only after
//        training steps 1-3: rank 0 is busy at steps 2 and 3 (its snapshot of step 1
//        still waits), rank 1 idle; both must skip 2 and 3, then validate the final 3.
//  end:  only the final validation. Rank 0's training data ends after step 1, rank 1's
//        after step 3: rank 0 joins steps 2 and 3 and both validate the weights of step 3.
// Writes "verdict", then "skipped:", "results:", "trained:", "last:" lines and the error.
TEST(ValStepsWorker, Rank) {
  const std::string mode = vttest::env_or("VT_VAL_MODE", "");
  const std::string out = vttest::env_or("VT_VAL_OUT", "");
  ASSERT_TRUE((mode == "skip" || mode == "end") && !out.empty()) << "run by the ValMultiRank tests only";
  auto tc = trainer_config();
  tc.timeout_s = 10;
  auto trainer = std::make_shared<TrainerEngine>(tc);
  ASSERT_TRUE(trainer->start()) << trainer->error();
  const int rank = trainer->rank();
  auto vc = vconfig(0, 1);
  vc.at_start = false;
  vc.timeout_s = 10;
  if (mode == "skip") {
    vc.every = 1;
    vc.skip_if_busy = true;
  }
  ValidationEngine e(vc);
  ASSERT_TRUE(e.attach(trainer)) << e.error();
  std::atomic<bool> go{mode == "end" || rank == 1};
  R fed = R::kOk;
  std::thread feeder([&] {
    while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (unsigned ep = 0; ep < (mode == "skip" ? 3u : 2u) && fed == R::kOk; ep++)
      for (auto &s : rank_samples(kTotal, rank, 2, ep))
        if ((fed = e.push(latent(s.sample_id), {s})) != R::kOk) break;
  });
  std::string error;
  BatchInfo info;
  info.captions = {"x", "y"};
  const int steps = mode == "end" && rank == 0 ? 1 : 3;
  for (int s = 0; s < steps && error.empty(); s++) {
    if (trainer->process_tensor(at::stack({latent(10 * s + rank), latent(10 * s + 5)}), info) != ProcessResult::kOk)
      error = trainer->error();
    if (mode == "skip" && s == 0 && rank == 1) {  // idle before step 2: its pass of step 1 is evaluated
      auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(8);
      while (e.passes_done() < 1 && std::chrono::steady_clock::now() < limit)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (e.passes_done() < 1) error = "rank 1 did not finish its pass of step 1";
    }
  }
  go = true;
  if (!trainer->finish() && error.empty()) error = trainer->error();
  feeder.join();
  write_verdict(out, error, fed, e, *trainer);
}

// every=2, at-start: rank 0's validator attaches before training, rank 1's only after
// step 3 (as a validation branch that starts late in a fast run). Both must skip step 0
// and step 2, which rank 1's validator never saw, and validate steps 4 and 6, instead of
// rank 0 reducing its step 0 with rank 1's step 4 ('ranks validated different steps').
// Writes "verdict", "skipped:", "results:", "trained:", "last:" lines and the error.
TEST(ValJoinWorker, Rank) {
  const std::string out = vttest::env_or("VT_VAL_OUT", "");
  ASSERT_FALSE(out.empty()) << "run by ValMultiRank.ValidatorsJoiningAtDifferentStepsValidateTheSameSteps only";
  auto tc = trainer_config();
  tc.timeout_s = 20;
  auto trainer = std::make_shared<TrainerEngine>(tc);
  ASSERT_TRUE(trainer->start()) << trainer->error();
  const int rank = trainer->rank();
  auto vc = vconfig(0, 1);
  vc.every = 2;
  vc.timeout_s = 20;
  ValidationEngine e(vc);
  R fed = R::kOk;
  std::thread feeder;
  auto join = [&] {
    EXPECT_TRUE(e.attach(trainer)) << e.error();
    feeder = std::thread([&] {
      for (unsigned ep = 0; ep < 10 && fed == R::kOk; ep++)
        for (auto &s : rank_samples(kTotal, rank, 2, ep))
          if ((fed = e.push(latent(s.sample_id), {s})) != R::kOk) break;
    });
  };
  if (rank == 0) join();
  std::string error;
  BatchInfo info;
  info.captions = {"x", "y"};
  for (int s = 0; s < 6 && error.empty(); s++) {
    if (s == 3 && rank == 1) join();
    if (trainer->process_tensor(at::stack({latent(10 * s + rank), latent(10 * s + 5)}), info) != ProcessResult::kOk)
      error = trainer->error();
  }
  if (!trainer->finish() && error.empty()) error = trainer->error();
  feeder.join();
  write_verdict(out, error, fed, e, *trainer);
}

// Rank 1 exits abruptly in the middle of its second pass (step 1), after the first pass
// (step 0) created the validation group: rank 0 must fail in the next all-reduce rather
// than wait for the peer. Writes "verdict passes seconds" and the error.
constexpr double kDeathTimeout = 20;

TEST(ValDeathWorker, Rank) {
  const std::string out = vttest::env_or("VT_VAL_OUT", "");
  ASSERT_FALSE(out.empty()) << "run by ValMultiRank.ARankDyingInAPassMakesTheOtherFailBeforeTheTimeout only";
  auto tc = trainer_config();
  tc.timeout_s = kDeathTimeout;
  auto trainer = std::make_shared<TrainerEngine>(tc);
  ASSERT_TRUE(trainer->start()) << trainer->error();
  const int rank = trainer->rank();
  auto vc = vconfig(0, 1);
  vc.every = 1;
  vc.timeout_s = kDeathTimeout;
  ValidationEngine e(vc);
  ASSERT_TRUE(e.attach(trainer)) << e.error();
  BatchInfo info;
  info.captions = {"x"};
  std::thread step([&] { trainer->process_tensor(latent(20 + rank).unsqueeze(0), info); });  // step 1
  auto t0 = std::chrono::steady_clock::now();
  R r = R::kOk;
  for (unsigned ep = 0; ep < 3 && r == R::kOk; ep++) {
    const auto samples = rank_samples(kTotal, rank, 2, ep);
    for (size_t k = 0; k < samples.size() && r == R::kOk; k++) {
      if (ep == 1 && k == 2 && rank == 1) _exit(0);  // mid pass of step 1
      if (ep == 1 && k == 0) t0 = std::chrono::steady_clock::now();
      r = e.push(latent(samples[k].sample_id), {samples[k]});
    }
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  step.join();
  std::ofstream f(out);
  f << (r == R::kError ? "error" : "ok") << " " << e.passes_done() << " " << took << "\n" << e.error() << "\n";
  f.close();
  _exit(0);
}

TEST(ValMultiRank, ARankDyingInAPassMakesTheOtherFailBeforeTheTimeout) {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn("", 0, port, dir.file("r0"), "ValDeathWorker.Rank"),
                          spawn("", 1, port, dir.file("r1"), "ValDeathWorker.Rank")};
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 3 * kDeathTimeout)) << "rank 0 hung after its peer died";
  std::istringstream in(vttest::read_file(dir.file("r0")));
  std::string verdict, error;
  uint64_t passes = 0;
  double took = 0;
  in >> verdict >> passes >> took;
  std::getline(in >> std::ws, error);
  EXPECT_EQ(verdict, "error") << error;
  EXPECT_EQ(passes, 2u) << "rank 0 completed the passes of steps 0 and 1";
  EXPECT_LT(took, kDeathTimeout) << "the all-reduce waited for the timeout instead of seeing the peer gone";
  EXPECT_NE(error.find("validation all-reduce of step 1"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 0 of 2"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1 failed or exited before reaching it"), std::string::npos) << error;
  std::cerr << "rank 0 after " << took << " s: " << error << "\n";
}

// Runs ValStepsWorker in `mode` on 2 ranks; per rank: verdict, skipped, results, trained, last.
static std::vector<std::vector<std::string>> run_steps_worker(const std::string &mode,
                                                              const std::string &worker = "ValStepsWorker.Rank") {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn(mode, 0, port, dir.file("r0"), worker), spawn(mode, 1, port, dir.file("r1"), worker)};
  std::vector<int> st;
  EXPECT_TRUE(vttest::wait_all(pids, &st, 120)) << "a rank hung";
  std::vector<std::vector<std::string>> out;
  for (const char *r : {"r0", "r1"}) {
    std::istringstream in(vttest::read_file(dir.file(r)));
    std::vector<std::string> fields(5);
    for (auto &f : fields) in >> f;
    EXPECT_EQ(fields[0], "ok") << r << ": " << in.str();
    out.push_back(fields);
  }
  return out;
}

TEST(ValMultiRank, SkipIfBusyDecidesAlikeOnEveryRank) {
  auto ranks = run_steps_worker("skip");
  for (int r = 0; r < 2; r++) {
    EXPECT_EQ(ranks[r][1], "skipped:2,3,") << "rank " << r;
    EXPECT_EQ(ranks[r][2], r == 0 ? "results:1,3," : "results:") << "rank " << r << " (rank 0 posts the results)";
    EXPECT_EQ(ranks[r][4], "last:3") << "rank " << r << " validated the final step";
  }
}

TEST(ValMultiRank, ValidatorsJoiningAtDifferentStepsValidateTheSameSteps) {
  auto ranks = run_steps_worker("join", "ValJoinWorker.Rank");
  for (int r = 0; r < 2; r++) {
    EXPECT_EQ(ranks[r][1], r == 0 ? "skipped:0,2," : "skipped:") << "rank " << r << " (rank 1 never saw them)";
    EXPECT_EQ(ranks[r][2], r == 0 ? "results:4,6," : "results:") << "rank " << r;
    EXPECT_EQ(ranks[r][3], "trained:6") << "rank " << r;
    EXPECT_EQ(ranks[r][4], "last:6") << "rank " << r;
  }
}

TEST(ValMultiRank, UnevenTrainingEndsValidateTheSameFinalStep) {
  auto ranks = run_steps_worker("end");
  for (int r = 0; r < 2; r++) {
    EXPECT_EQ(ranks[r][1], "skipped:") << "rank " << r;
    EXPECT_EQ(ranks[r][2], r == 0 ? "results:3," : "results:") << "rank " << r;
    EXPECT_EQ(ranks[r][3], "trained:3") << "rank " << r;
    EXPECT_EQ(ranks[r][4], "last:3") << "rank " << r;
  }
}

TEST(ValMultiRank, TwoRanksTimesTwoShardsEqualOneRankOneShard) {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn("equal", 0, port, dir.file("r0")), spawn("equal", 1, port, dir.file("r1"))};
  // Meanwhile the reference: 1 rank x 1 shard over the whole set, the same initial weights.
  auto tc = trainer_config();
  tc.rank = 0;
  tc.world_size = 1;
  auto trainer = std::make_shared<TrainerEngine>(tc);
  ASSERT_TRUE(trainer->start()) << trainer->error();
  ValidationEngine one(vconfig(0, 1));
  ASSERT_TRUE(one.attach(trainer));
  one.trainer_finished();
  ASSERT_EQ(feed(one, 0, 1), R::kEos) << one.error();
  const double want = one.last_loss();
  ASSERT_TRUE(std::isfinite(want));
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 120)) << "a rank hung";
  for (const char *r : {"r0", "r1"}) {
    std::istringstream in(vttest::read_file(dir.file(r)));
    std::string verdict;
    double loss = 0;
    in >> verdict >> loss;
    EXPECT_EQ(verdict, "ok") << r << ": " << vttest::read_file(dir.file(r));
    EXPECT_NEAR(loss, want, 1e-6 * std::abs(want)) << r;
  }
}

TEST(ValMultiRank, ADeadRankMakesTheOtherFailWithinTheTimeout) {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn("dead", 0, port, dir.file("r0")), spawn("dead", 1, port, dir.file("r1"))};
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 60)) << "a rank hung after its peer died";
  std::istringstream in(vttest::read_file(dir.file("r0")));
  std::string verdict, loss, error;  // loss: "nan" here
  double took = 0;
  in >> verdict >> loss >> took;
  std::getline(in >> std::ws, error);
  EXPECT_EQ(verdict, "error");
  EXPECT_LT(took, 5 + 5.0) << "beyond the 5 s timeout";
  EXPECT_NE(error.find("rank 0 of 2"), std::string::npos) << error;
  std::cerr << "rank 0: " << error << "\n";
}
