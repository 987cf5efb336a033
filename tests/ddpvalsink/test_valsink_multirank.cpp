/* Two-process Gloo runs of ValidationEngine: the test binary starts itself twice (fork
 * + exec, RANK/WORLD_SIZE/MASTER_PORT; tests/common/multirank.h) to run ValWorker.Rank.
 *  - 2 ranks x 2 in-process shards give the validation loss of 1 rank x 1 shard over the
 *    same validation set and weights (1e-6 relative);
 *  - a rank that dies during validation makes the other fail within the timeout. */
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

pid_t spawn(const std::string &mode, int rank, int port, const std::string &out) {
  return vttest::spawn_rank("ValWorker.Rank", rank, 2, port, {{"VT_VAL_MODE", mode}, {"VT_VAL_OUT", out}});
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
