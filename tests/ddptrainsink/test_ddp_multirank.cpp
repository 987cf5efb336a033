/* Two-process Gloo runs of TrainerEngine: the test binary starts itself twice (fork +
 * exec, one process per rank, MASTER_PORT picked free; tests/common/multirank.h) to
 * run the DdpWorker.Rank entry point, which drives the engine with synthetic micro-batches.
 *  - equivalence: 2 ranks x 2 micro-batches of 2 == 1 rank with batch 8 (5 steps);
 *  - a dead rank: rank 1 exits after step 1; rank 0 fails with an error naming the peer
 *    and the operation, within the timeout, and nobody hangs;
 *  - uneven ends: rank 0's data ends after 2.5 steps, rank 1's after 4; both end at
 *    step 4 with the weights of one rank trained on what was there (rank 0 joins the
 *    steps it has no samples for);
 *  - rendezvous: a rank that never starts is named within the timeout; ranks with
 *    different world sizes say so;
 *  - torchrun's agent store: the test serves the store as the elastic agent does and
 *    runs the ranks twice on it (a restart), as `torchrun --no-python` would;
 *  - a sharded run stopped without end of stream: every rank's shard in one rescue checkpoint;
 *  - buckets: after the first step they follow the gradients' arrival order, the same
 *    on both ranks, and all-reduces start while backward still has gradients to come.
 * What the ranks must agree on (NaN, initial weights, resume): test_ddp_ranks_agree.cpp. */
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "c10d_setup.h"

#include "ddptrainsink/trainer_engine.h"
#include "models/train_model.h"
#include "ddp_ranks.h"
#include "multirank.h"
#include "test_util.h"

using namespace videotrain;
using namespace ddptest;

namespace {

constexpr int kSteps = 5;
constexpr double kBucketCapMb = 0.25;
// Relative L2 (per tensor) of weights trained through bf16-rounded block weights against those of
// float32 ones: two bf16 ulps, 2^-7 (measured: up to 1.1e-3 with fp32 compute, 4.1e-3 under autocast).
constexpr double kBf16Rel = 0.0078125;

// The reducer after a step, one "key values..." line each (buckets as "i,j;k;").
std::string describe(const ReducerInfo &ri) {
  std::ostringstream o;
  auto list = [&](const char *key, const std::vector<size_t> &v) {
    o << key;
    for (size_t x : v) o << " " << x;
    o << "\n";
  };
  o << "rebuilt " << ri.rebuilt << "\nlayout ";
  for (const auto &b : ri.buckets) {
    for (size_t i = 0; i < b.size(); i++) o << (i ? "," : "") << b[i];
    o << ";";
  }
  o << "\n";
  list("bucket_bytes", ri.bucket_bytes);
  list("param_bytes", ri.param_bytes);
  list("launch", ri.launch_order);
  list("pending", ri.pending_at_launch);
  return o.str();
}

// "key" -> its line's values, from one describe().
std::map<std::string, std::vector<std::string>> parse(const std::string &text) {
  std::map<std::string, std::vector<std::string>> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string key, v;
    l >> key;
    while (l >> v) out[key].push_back(v);
  }
  return out;
}

std::vector<size_t> numbers(const std::vector<std::string> &v) {
  std::vector<size_t> out;
  for (const auto &s : v) out.push_back(std::stoull(s));
  return out;
}

// builtin:tiny-unet3d (its caption embedding, registered last, is used first), 2 steps
// of 2 micro-batches; the reducer after each step to OUT.1 and OUT.2.
void buckets_rank(const std::string &out) {
  auto c = config();
  c.model = "builtin:tiny-unet3d";
  c.latent_channels = 4;
  c.bucket_cap_mb = kBucketCapMb;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  const int r = e.rank();
  for (int s = 0; s < 2; s++) {
    for (unsigned i = 0; i < 2; i++) {
      auto g = at::detail::createCPUGenerator(700 + 10 * s + 2 * r + i);
      BatchInfo info;
      info.micro_index = i;
      info.micro_count = 2;
      info.step_samples = 4;
      info.sync = i == 1;
      info.captions = {"a cat", "a dog on a beach"};
      ASSERT_EQ(e.process_tensor(at::randn({2, 4, 2, 8, 8}, g), info), ProcessResult::kOk) << e.error();
    }
    std::ofstream(out + "." + std::to_string(s + 1)) << describe(e.reducer_info());
  }
  write_params(out + ".params", e.parameters_cpu());
  e.stop();
}

// uneven-wan: the tiny native Wan of tests/reference (2 blocks, so sharding=full gathers and reduces
// block by block), micro-batches of one sample (step, k): latents [4, 1, 4, 4] and 5 rows of text.
TrainerConfig wan_config() {
  auto c = config();
  c.model = vttest::reference_dir() + "/dit/wan_t2v_tiny";
  c.native.gradient_checkpointing = Checkpointing::full;  // as sharding=full raises it to
  c.lr = 1e-3;
  return c;
}

ProcessResult feed_wan(TrainerEngine &e, int step, int k, unsigned idx, unsigned count, unsigned step_samples) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(1000 * step + k);
  ModelInputs in;
  in.latents = at::randn({1, 4, 1, 4, 4}, g);
  in.text_embeds = at::randn({1, 5, 32}, g);
  in.text_mask = at::ones({1, 5}, at::kLong);
  in.sample_ids = {static_cast<uint64_t>(1000 * step + k)};
  BatchInfo info = micro_info(step, idx, count, step_samples);
  info.sample_ids = in.sample_ids;
  return e.process_inputs(in, info);
}

pid_t spawn(const std::string &mode, int rank, int port, const std::string &out,
            std::vector<std::pair<std::string, std::string>> env = {}) {
  return ddptest::spawn_worker("DdpWorker.Rank", mode, rank, port, out, std::move(env));
}

}  // namespace

// One rank of a two-process run (started by the tests below, never on its own).
TEST(DdpWorker, Rank) {
  const char *mode = std::getenv("VT_DDP_MODE");
  const std::string out = std::getenv("VT_DDP_OUT") ? std::getenv("VT_DDP_OUT") : "";
  ASSERT_TRUE(mode && !out.empty()) << "run by the Ddp tests only";
  if (std::string(mode) == "buckets") return buckets_rank(out);
  auto c = config();
  if (std::string(mode) == "join") {
    // The rendezvous alone (VT_DDP_WORLD: this rank's world size): verdict, seconds, error.
    c.timeout_s = std::atof(vttest::env_or("VT_DDP_TIMEOUT", "5").c_str());
    c.world_size = std::atoi(vttest::env_or("VT_DDP_WORLD", "2").c_str());
    TrainerEngine e(c);
    auto t0 = std::chrono::steady_clock::now();
    const bool ok = e.start();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ofstream(out) << (ok ? "ok" : "error") << "\n" << took << "\n" << e.error() << "\n";
    e.stop();
    return;
  }
  if (std::string(mode) == "uneven-wan") {
    // Rank 0's data ends after step 2, rank 1's after step 3; each step 2 micro-batches of 1.
    c = wan_config();
    if (vttest::env_or("VT_DDP_SHARDING", "") == "full") c.sharding = Sharding::full;
    c.gather_dtype = vttest::env_or("VT_DDP_GATHER", "auto");
    c.gather_prefetch = vttest::env_or("VT_DDP_PREFETCH", "true");  // auto would be false on the CPU
    c.precision = vttest::env_or("VT_DDP_PRECISION", "auto");
    c.timeout_s = 60;
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    const int r = e.rank();
    const int steps = r == 0 ? 2 : 3;
    for (int s = 0; s < steps; s++)
      for (unsigned i = 0; i < 2; i++) {
        // Rank 1's last step is one its peer joined with no samples: done after it (peer_ended).
        const auto got = feed_wan(e, s, 2 * r + int(i), i, 2, 2);
        EXPECT_TRUE(got == ProcessResult::kOk || (r == 1 && s + 1 == steps && i == 1 && got == ProcessResult::kDone))
            << "step " << s + 1 << ": " << e.error();
      }
    const bool ok = e.finish();
    write_params(out, e.parameters_cpu());
    std::ofstream(out + ".steps") << (ok ? "ok " : "error ") << e.steps_done() << " " << e.error() << "\n";
    const auto ri = e.reducer_info();
    std::ofstream(out + ".gathers") << ri.gathers << " " << ri.gathers_ahead << " " << ri.gather_dtype << "\n";
    e.stop();
    return;
  }
  if (std::string(mode) != "equivalence") c.timeout_s = std::atof(vttest::env_or("VT_DDP_TIMEOUT", "5").c_str());
  if (std::string(mode) == "uneven" || std::string(mode) == "rescue")
    c.checkpoint_dir = out.substr(0, out.find_last_of('/')) + "/ckpt";
  if (std::string(mode) == "rescue") c.checkpoint_every = 100;  // none but the rescue
  if (vttest::env_or("VT_DDP_SHARDING", "") == "optimizer") c.sharding = Sharding::optimizer;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  ASSERT_EQ(e.world_size(), 2);
  const int r = e.rank();
  if (std::string(mode) == "equivalence") {
    // Rank r holds samples [4r, 4r + 4) of each step, in 2 micro-batches of 2.
    for (int s = 0; s < kSteps; s++) {
      feed(e, s, 4 * r, 2, 0, 2, 4);
      feed(e, s, 4 * r + 2, 2, 1, 2, 4);
    }
    write_params(out, e.parameters_cpu());
    std::ofstream(out + ".loss") << e.last_loss();
    e.stop();
    return;
  }
  if (std::string(mode) == "uneven") {
    const int full = r == 0 ? 2 : 4;
    for (int s = 0; s < full; s++) {
      feed(e, s, 4 * r, 2, 0, 2, 4);
      // Rank 1's steps 3-4 are ones its peer joined with no samples: kDone says so (peer_ended).
      const auto last = feed_result(e, s, 4 * r + 2, 2, 1, 2, 4);
      EXPECT_TRUE(last == ProcessResult::kOk || (r == 1 && s >= 2 && last == ProcessResult::kDone))
          << "step " << s + 1 << ": " << e.error();
    }
    if (r == 0) feed(e, 2, 0, 2, 0, 2, 4);  // half of step 3, then end of stream
    const bool ok = e.finish();
    write_params(out, e.parameters_cpu());
    std::ofstream(out + ".steps") << (ok ? "ok " : "error ") << e.steps_done() << " " << e.error() << "\n";
    e.stop();
    return;
  }
  if (std::string(mode) == "leave") {
    // Both train step 1; rank 1 then stops (as on an error) without its end of stream.
    feed(e, 0, 4 * r, 2, 0, 2, 4);
    feed(e, 0, 4 * r + 2, 2, 1, 2, 4);
    if (r == 1) {
      e.stop();
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    const bool ok = e.finish();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ofstream(out) << (ok ? "ok" : "error") << "\n" << took << "\n" << e.error() << "\n";
    e.stop();
    return;
  }
  if (std::string(mode) == "rescue") {
    // Both train 2 steps and stop without end of stream (gst-launch without -e): each rank writes its
    // shard of step 2, rank 0 seals them.
    for (int s = 0; s < 2; s++) {
      feed(e, s, 4 * r, 2, 0, 2, 4);
      feed(e, s, 4 * r + 2, 2, 1, 2, 4);
    }
    write_params(out, e.parameters_cpu());
    e.stop();
    std::ofstream(out + ".msgs") << [&] {
      std::string all;
      for (auto &m : e.take_messages()) all += m.name + " " + m.strings["text"] + "\n";
      return all;
    }();
    return;
  }
  if (std::string(mode) == "agent") {
    for (int s = 0; s < 2; s++) {
      feed(e, s, 4 * r, 2, 0, 2, 4);
      feed(e, s, 4 * r + 2, 2, 1, 2, 4);
    }
    std::ofstream(out) << "ok " << e.last_loss() << "\n";
    e.stop();
    return;
  }
  // dead: one rank goes away after step 1 without a word; the other must fail, not hang.
  const int dead = std::string(mode) == "dead0" ? 0 : 1;
  feed(e, 0, 4 * r, 2, 0, 2, 4);
  feed(e, 0, 4 * r + 2, 2, 1, 2, 4);
  if (r == dead) _exit(0);
  std::vector<at::Tensor> xs{sample(1, 0), sample(1, 1)};
  BatchInfo info;
  info.micro_index = 1;
  info.micro_count = 2;
  info.step_samples = 4;
  info.sync = true;
  auto t0 = std::chrono::steady_clock::now();
  ProcessResult res = ProcessResult::kOk;
  for (int s = 1; s < 4 && res == ProcessResult::kOk; s++) res = e.process_tensor(at::stack(xs), info);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ofstream(out) << (res == ProcessResult::kError ? "error" : "ok") << "\n" << took << "\n" << e.error() << "\n";
  e.stop();
}

TEST(Ddp, TwoRanksWithAccumulationMatchOneRankWithTheWholeBatch) {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn("equivalence", 0, port, dir.file("r0")), spawn("equivalence", 1, port, dir.file("r1"))};
  // Meanwhile: one rank, batch 8 in one micro-batch.
  auto c = config();
  c.rank = 0;
  c.world_size = 1;
  TrainerEngine single(c);
  ASSERT_TRUE(single.start()) << single.error();
  for (int s = 0; s < kSteps; s++) feed(single, s, 0, 8, 0, 1, 8);
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 120)) << "a rank hung";
  for (int w : st) ASSERT_TRUE(WIFEXITED(w) && WEXITSTATUS(w) == 0) << "rank failed: " << w;
  auto want = single.parameters_cpu();
  for (const char *f : {"r0", "r1"}) {
    expect_params_near(read_params(dir.file(f)), want, f);
    double loss = 0;
    std::ifstream(dir.file(std::string(f) + ".loss")) >> loss;
    EXPECT_NEAR(loss, single.last_loss(), 1e-5 * std::abs(single.last_loss())) << "rank-averaged loss";
  }
  // And training moved the weights at all.
  TrainerEngine fresh(c);
  ASSERT_TRUE(fresh.start());
  feed(fresh, 0, 0, 8, 0, 1, 8);
  EXPECT_NE(fresh.parameters_cpu(), want);
}

// Rank 0's data ends in step 3, rank 1's after step 4 (see the file comment), with `sharding`.
static void expect_uneven_ends(const std::string &sharding) {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn("uneven", 0, port, dir.file("r0"), {{"VT_DDP_SHARDING", sharding}}),
                          spawn("uneven", 1, port, dir.file("r1"), {{"VT_DDP_SHARDING", sharding}})};
  // One rank: steps 1-2 on both ranks' 8 samples, steps 3-4 on rank 1's 4 only.
  auto c = config();
  c.rank = 0;
  c.world_size = 1;
  TrainerEngine single(c);
  ASSERT_TRUE(single.start()) << single.error();
  for (int s = 0; s < 2; s++) feed(single, s, 0, 8, 0, 1, 8);
  for (int s = 2; s < 4; s++) feed(single, s, 4, 4, 0, 1, 4);
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 120)) << "a rank hung at its end of stream";
  auto want = single.parameters_cpu();
  for (const char *f : {"r0", "r1"}) {
    std::istringstream in(vttest::read_file(dir.file(std::string(f) + ".steps")));
    std::string verdict;
    uint64_t steps = 0;
    in >> verdict >> steps;
    EXPECT_EQ(verdict, "ok") << f << ": " << in.str();
    EXPECT_EQ(steps, 4u) << f;
    expect_params_near(read_params(dir.file(f)), want, f);
  }
  // The final checkpoint's data positions: rank 0 trained 2 steps of 4 samples (its half of step 3
  // was dropped, not trained: it is not skipped on resume either), rank 1 all 4.
  const auto state = nlohmann::json::parse(vttest::read_file(dir.file("ckpt/step-00000004/trainer.json")));
  ASSERT_EQ(state["positions"].size(), 2u) << state.dump();
  EXPECT_EQ(state["positions"][0]["clip"], 8) << state["positions"].dump();
  EXPECT_EQ(state["positions"][1]["clip"], 16) << state["positions"].dump();
}

TEST(Ddp, RanksWhoseDataEndsEarlyJoinTheStepsOfThoseWithMore) { expect_uneven_ends("none"); }

// uneven-wan's 3 steps on one rank without sharding, at `precision`: what the 2 ranks should reach.
static Params uneven_wan_on_one_rank(const std::string &precision) {
  auto c = wan_config();
  c.rank = 0;
  c.world_size = 1;
  c.precision = precision;
  TrainerEngine single(c);
  EXPECT_TRUE(single.start()) << single.error();
  for (int s = 0; s < 2; s++)
    for (unsigned i = 0; i < 4; i++) EXPECT_EQ(feed_wan(single, s, int(i), i, 4, 4), ProcessResult::kOk) << single.error();
  for (unsigned i = 0; i < 2; i++) EXPECT_EQ(feed_wan(single, 2, 2 + int(i), i, 2, 2), ProcessResult::kOk) << single.error();
  return single.parameters_cpu();
}

// The uneven-wan ranks of sharding=full, one run per entry of `envs` (all at once; files `tag`N-rR).
struct ShardedWanRun {
  Params r0;                 // rank 0's exported weights
  std::string gathers[2];    // each rank's block gathers: "count ahead dtype"
};
static std::vector<ShardedWanRun> uneven_wan_full(const vttest::TempDir &dir,
                                                  const std::vector<std::vector<std::pair<std::string, std::string>>> &envs) {
  std::vector<pid_t> pids;
  for (size_t n = 0; n < envs.size(); n++) {
    const int port = vttest::free_port();
    for (int r = 0; r < 2; r++) {
      auto env = envs[n];
      env.emplace_back("VT_DDP_SHARDING", "full");
      pids.push_back(spawn("uneven-wan", r, port, dir.file("run" + std::to_string(n) + "-r" + std::to_string(r)), env));
    }
  }
  std::vector<int> st;
  EXPECT_TRUE(vttest::wait_all(pids, &st, 120)) << "a rank hung at its end of stream";
  std::vector<ShardedWanRun> out(envs.size());
  for (size_t n = 0; n < envs.size(); n++) {
    for (int r = 0; r < 2; r++) {
      const std::string f = dir.file("run" + std::to_string(n) + "-r" + std::to_string(r));
      std::istringstream in(vttest::read_file(f + ".steps"));
      std::string verdict;
      uint64_t steps = 0;
      in >> verdict >> steps;
      EXPECT_EQ(verdict, "ok") << f << ": " << in.str();
      EXPECT_EQ(steps, 3u) << f;
      std::getline(std::istringstream(vttest::read_file(f + ".gathers")), out[n].gathers[r]);
    }
    out[n].r0 = read_params(dir.file("run" + std::to_string(n) + "-r0"));
  }
  return out;
}

// sharding=full: a rank whose data ended takes part in the peers' block gathers and reductions
// (ParamShards::join_micro_batch), so the run goes on to step 3 as with DDP, with the weights of one
// rank that trained steps 1-2 on all 4 samples and step 3 on rank 1's 2. Rank 0 holds the exported
// (gathered) weights at the end. The next block's gather is issued while a block computes (forward
// and recompute: 1 of each pass's 2 gathers per micro-batch), by the joining rank too; without
// that prefetch the weights are the same bit for bit.
TEST(Ddp, UnderShardingFullARankWhoseDataEndedJoinsTheGathers) {
  vttest::TempDir dir;
  const auto runs = uneven_wan_full(dir, {{}, {{"VT_DDP_PREFETCH", "false"}}});
  expect_params_near(runs[0].r0, uneven_wan_on_one_rank("auto"), "r0");
  EXPECT_EQ(runs[1].r0, runs[0].r0) << "the weights differ without prefetch";
  // 6 micro-batches (each rank's 3 steps of 2; rank 0 joins the last 2) x 2 passes x 2 blocks, and
  // the export's gather of the 2 blocks; prefetched: the second block of each pass.
  EXPECT_EQ(runs[0].gathers[0], "26 12 fp32");
  EXPECT_EQ(runs[0].gathers[1], "26 12 fp32");
  EXPECT_EQ(runs[1].gathers[0], "26 0 fp32");
  EXPECT_EQ(runs[1].gathers[1], "26 0 fp32");
}

// gather-dtype=bf16: each rank's float32 slice is rounded to bf16 before the gather (half the
// traffic; Gloo carries the bytes). With fp32 compute the gathered block is used as float32, under
// bf16 autocast (gather-dtype=auto there) as bf16; the float32 master slices stay the optimizer's.
// Either run stays within bf16 rounding of the one rank without sharding at the same precision
// (whose Linear weights autocast rounds to bf16 too), and the fp32-compute one differs from it more
// than float32 rounding does (the gather rounded).
TEST(Ddp, UnderShardingFullBf16GathersStayWithinBf16RoundingOfTheFloat32Weights) {
  vttest::TempDir dir;
  const auto runs = uneven_wan_full(dir, {{{"VT_DDP_GATHER", "bf16"}, {"VT_DDP_PRECISION", "fp32"}},
                                          {{"VT_DDP_PRECISION", "bf16"}}});
  EXPECT_EQ(runs[0].gathers[0], "26 12 bf16");
  EXPECT_EQ(runs[1].gathers[1], "26 12 bf16");
  const auto fp32 = uneven_wan_on_one_rank("fp32"), bf16 = uneven_wan_on_one_rank("bf16");
  expect_params_near(runs[0].r0, fp32, "bf16 gathers, fp32 compute", kBf16Rel);
  expect_params_near(runs[1].r0, bf16, "bf16 gathers, bf16 autocast", kBf16Rel);
  double worst = 0;
  for (const auto &[name, v] : fp32)
    for (size_t i = 0; i < v.size(); i++) worst = std::max(worst, std::abs(double(runs[0].r0.at(name)[i]) - v[i]));
  EXPECT_GT(worst, 1e-6) << "bf16 gathers gave the float32 weights: nothing was rounded";
}

// sharding=optimizer: the rank whose data ended joins the per-unit reductions with zeros, in the
// same order, and the sharded checkpoint keeps both positions.
TEST(Ddp, UnderShardingOptimizerRanksWhoseDataEndsEarlyJoinToo) { expect_uneven_ends("optimizer"); }

// sharding=optimizer, stopped after step 2 without end of stream on both ranks: each writes its shard
// (no collective), rank 0 seals them into a rescue checkpoint, which resumes on 1 rank to the weights.
TEST(Ddp, AShardedRunStoppedWithoutEndOfStreamLeavesARescueCheckpointOfEveryRanksShard) {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn("rescue", 0, port, dir.file("r0"), {{"VT_DDP_SHARDING", "optimizer"}}),
                          spawn("rescue", 1, port, dir.file("r1"), {{"VT_DDP_SHARDING", "optimizer"}})};
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 60)) << "a rank hung in its rescue";
  const std::string step = dir.file("ckpt/step-00000002");
  for (const char *f : {"shard-00000.pt", "shard-00001.pt", "manifest.json"})
    EXPECT_TRUE(std::filesystem::exists(step + "/" + f)) << f << "; rank 0: " << vttest::read_file(dir.file("r0.msgs"));
  const auto state = nlohmann::json::parse(vttest::read_file(step + "/trainer.json"));
  EXPECT_TRUE(state.value("rescue", false)) << state.dump();
  EXPECT_EQ(state["sharding"]["world"], 2) << state.dump();
  EXPECT_NE(vttest::read_file(dir.file("r1.msgs")).find("this rank's shard of a rescue checkpoint of step 2"),
            std::string::npos);
  auto c = config();
  c.rank = 0;
  c.world_size = 1;
  c.resume = true;
  c.checkpoint_dir = dir.file("ckpt");
  TrainerEngine one(c);
  ASSERT_TRUE(one.start()) << one.error();
  ASSERT_TRUE(one.resumed());
  EXPECT_EQ(one.steps_done(), 2u);
  expect_params_near(one.parameters_cpu(), read_params(dir.file("r0")), "resumed rescue", 1e-7);
  one.stop();
}

TEST(Ddp, AtEndOfStreamAPeerThatStoppedIsReportedAtOnce) {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn("leave", 0, port, dir.file("r0"), {{"VT_DDP_TIMEOUT", "60"}}),
                          spawn("leave", 1, port, dir.file("r1"), {{"VT_DDP_TIMEOUT", "60"}})};
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 60)) << "rank 0 waited for a rank that had stopped";
  std::istringstream in(vttest::read_file(dir.file("r0")));
  std::string verdict, error;
  double took = 0;
  in >> verdict >> took;
  std::getline(in >> std::ws, error);
  EXPECT_EQ(verdict, "error");
  EXPECT_LT(took, 10.0) << "not at once (the timeout is 60 s)";
  EXPECT_NE(error.find("rank 1 stopped"), std::string::npos) << error;
}

// Rank `dead` exits after step 1; the other's verdict, time taken and error.
void run_dead(const char *mode, const std::string &survivor_out, const std::vector<std::string> &outs) {
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn(mode, 0, port, outs[0]), spawn(mode, 1, port, outs[1])};
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 60)) << "a rank hung after its peer died";
  std::istringstream in(vttest::read_file(survivor_out));
  std::string verdict, error;
  double took = 0;
  in >> verdict >> took;
  std::getline(in >> std::ws, error);
  EXPECT_EQ(verdict, "error");
  EXPECT_LT(took, 5 + 3.0) << "beyond the 5 s timeout";
  EXPECT_NE(error.find(std::string(mode) == "dead0" ? "rank 0" : "rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("all-reduce"), std::string::npos) << error;
}

TEST(Ddp, ADeadRankMakesTheOtherFailWithinTheTimeout) {
  vttest::TempDir dir;
  run_dead("dead", dir.file("r0"), {dir.file("r0"), dir.file("r1")});
}

TEST(Ddp, ADeadStoreServerRankMakesTheOtherFailWithinTheTimeout) {
  vttest::TempDir dir;
  run_dead("dead0", dir.file("r1"), {dir.file("r0"), dir.file("r1")});
}

struct Verdict {
  std::string verdict, error;
  double took = 0;
};
Verdict read_verdict(const std::string &path) {
  Verdict v;
  std::istringstream in(vttest::read_file(path));
  in >> v.verdict >> v.took;
  std::getline(in >> std::ws, v.error);
  return v;
}

TEST(Ddp, ARankThatNeverStartsIsNamedWithinTheTimeout) {
  // Rank 0 of 2 alone. Before: Gloo's "Socket Timeout" after twice the timeout.
  vttest::TempDir dir;
  const double timeout = 5;
  pid_t p = spawn("join", 0, vttest::free_port(), dir.file("r0"), {{"VT_DDP_TIMEOUT", "5"}});
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all({p}, &st, 6 * timeout)) << "rank 0 hung";
  Verdict v = read_verdict(dir.file("r0"));
  EXPECT_EQ(v.verdict, "error");
  EXPECT_NE(v.error.find("rank 1 never joined"), std::string::npos) << v.error;
  EXPECT_GE(v.took, 0.9 * timeout) << "gave up before the timeout";
  EXPECT_LT(v.took, 1.5 * timeout + 2) << "well beyond the timeout";
}

TEST(Ddp, RanksWithDifferentWorldSizesSaySo) {
  // Before: "[enforce fail at address.cc] ... 136 vs 272" from Gloo.
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn("join", 0, port, dir.file("r0"), {{"VT_DDP_WORLD", "2"}, {"VT_DDP_TIMEOUT", "60"}}),
                          spawn("join", 1, port, dir.file("r1"), {{"VT_DDP_WORLD", "3"}, {"VT_DDP_TIMEOUT", "60"}})};
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 50)) << "a rank waited for the timeout or hung";
  Verdict v0 = read_verdict(dir.file("r0")), v1 = read_verdict(dir.file("r1"));
  EXPECT_EQ(v0.verdict, "error");
  EXPECT_EQ(v1.verdict, "error") << "rank 1 of 3 went on";
  // Rank 0 serves the store, so it always sees rank 1's key; rank 1 may see rank 0's
  // or lose the store when rank 0 exits first.
  EXPECT_NE(v0.error.find("disagree on the world size: rank 0 of 2 has 2, rank 1 has 3"), std::string::npos)
      << v0.error;
  EXPECT_LT(v0.took, 30.0) << "not at once (the timeout is 60 s)";
}

TEST(Ddp, TorchrunAgentStoreServesTheRanksAcrossARestart) {
  // torchrun --no-python: its agent process serves the TCPStore (no rank does) and keeps
  // it when it restarts the workers, so attempt 1 must not read attempt 0's keys.
  const int port = vttest::free_port();
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(port);
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(30);
  auto agent = videotrain::make_tcp_store("127.0.0.1", so);
  for (int attempt = 0; attempt < 2; attempt++) {
    vttest::TempDir dir;
    const std::vector<std::pair<std::string, std::string>> env{
        {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)}};
    std::vector<pid_t> pids{spawn("agent", 0, port, dir.file("r0"), env), spawn("agent", 1, port, dir.file("r1"), env)};
    std::vector<int> st;
    ASSERT_TRUE(vttest::wait_all(pids, &st, 60)) << "attempt " << attempt << ": a rank hung";
    for (const char *f : {"r0", "r1"})
      EXPECT_EQ(vttest::read_file(dir.file(f)).substr(0, 3), "ok ")
          << "attempt " << attempt << " " << f << ": " << vttest::read_file(dir.file(f));
  }
}

TEST(Ddp, BucketsFollowTheGradientsArrivalOrderAndOverlapBackward) {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn("buckets", 0, port, dir.file("r0")), spawn("buckets", 1, port, dir.file("r1"))};
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 120)) << "a rank hung";
  for (int w : st) ASSERT_TRUE(WIFEXITED(w) && WEXITSTATUS(w) == 0) << "rank failed: " << w;
  auto r0 = parse(vttest::read_file(dir.file("r0.2")));
  auto r1 = parse(vttest::read_file(dir.file("r1.2")));
  ASSERT_EQ(r0["rebuilt"], std::vector<std::string>{"1"});
  EXPECT_EQ(parse(vttest::read_file(dir.file("r0.1")))["rebuilt"], std::vector<std::string>{"1"})
      << "rebuilt after the first step";
  // Both ranks launch the same buckets in the same order: rank 0's layout everywhere.
  EXPECT_EQ(r0["layout"], r1["layout"]);
  EXPECT_EQ(r0["bucket_bytes"], r1["bucket_bytes"]);
  const auto bytes = numbers(r0["bucket_bytes"]);
  const auto param_bytes = numbers(r0["param_bytes"]);
  ASSERT_GT(bytes.size(), 2u);
  std::vector<size_t> in_order(bytes.size());
  for (size_t b = 0; b < in_order.size(); b++) in_order[b] = b;
  for (auto *r : {&r0, &r1}) EXPECT_EQ(numbers((*r)["launch"]), in_order);
  // Every parameter in exactly one bucket; caps: 1 MB first, then bucket-cap-mb, unless
  // a bucket is one parameter bigger than that.
  ASSERT_EQ(r0["layout"].size(), 1u);
  std::vector<int> seen(param_bytes.size(), 0);
  std::istringstream layout(r0["layout"][0]);
  std::string bucket;
  for (size_t b = 0; std::getline(layout, bucket, ';'); b++) {
    std::istringstream in(bucket);
    std::string idx;
    size_t n = 0, sum = 0;
    while (std::getline(in, idx, ',')) {
      const size_t p = std::stoull(idx);
      ASSERT_LT(p, seen.size());
      seen[p]++;
      sum += param_bytes[p];
      n++;
    }
    ASSERT_LT(b, bytes.size());
    EXPECT_EQ(sum, bytes[b]) << "bucket " << b;
    const double cap = (b == 0 ? 1.0 : kBucketCapMb) * 1024 * 1024;
    if (n > 1) {
      EXPECT_LE(double(bytes[b]), cap) << "bucket " << b;
    }
  }
  for (size_t p = 0; p < seen.size(); p++) EXPECT_EQ(seen[p], 1) << "parameter " << p;
  // Overlap: some bucket went out while backward still had gradients to produce.
  for (auto *r : {&r0, &r1}) {
    const auto pending = numbers((*r)["pending"]);
    ASSERT_EQ(pending.size(), bytes.size());
    EXPECT_GT(*std::max_element(pending.begin(), pending.end()), 0u) << "every bucket waited for the whole backward";
  }
  EXPECT_EQ(read_params(dir.file("r0.params")), read_params(dir.file("r1.params")));
}
