/* Two-process runs (DdpAgreeWorker.Rank, see test_ddp_multirank.cpp) of what the ranks
 * must agree on:
 *  - a non-finite loss on rank 1 only: nan-policy=skip skips the step on both ranks,
 *    nan-policy=fail fails both (neither hangs); non-finite losses on rank 1 alone
 *    reach max-skipped-steps on both at the same step; a finite loss with an infinite
 *    gradient on rank 1 only is skipped on both, or fails both;
 *  - initial weights: ranks built with different seeds, or loading TorchScript files whose
 *    parameters and buffers differ, all hold rank 0's after start();
 *  - resume: a rank that finds no checkpoint while rank 0 resumes makes both fail; so
 *    does one whose checkpoints all fail to verify; in a shared folder whose newest
 *    checkpoint is damaged, both resume from the one before;
 *  - checkpoint-interval: rank 0's clock decides, so when the weights have gone NaN both
 *    ranks find it at the same step and fail, instead of rank 1 waiting in a collective;
 *  - rescue checkpoint: rank 1 dies after step 2 of a run without periodic checkpoints;
 *    rank 0 fails in step 3's all-reduce naming rank 1, and alone writes step 2, which
 *    both ranks of a fresh run resume to the same weights. */
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "ddp_ranks.h"
#include "ddptrainsink/trainer_engine.h"
#include "multirank.h"
#include "test_util.h"

using namespace videotrain;
using namespace ddptest;

namespace {

pid_t spawn(const std::string &mode, int rank, int port, const std::string &out,
            std::vector<std::pair<std::string, std::string>> env = {}) {
  return ddptest::spawn_worker("DdpAgreeWorker.Rank", mode, rank, port, out, std::move(env));
}

// Runs both ranks of `mode` to their end; false when one hung or crashed.
bool run_ranks(const std::string &mode, const vttest::TempDir &dir,
               const std::vector<std::pair<std::string, std::string>> &env = {}) {
  const int port = vttest::free_port();
  std::vector<pid_t> pids{spawn(mode, 0, port, dir.file("r0"), env), spawn(mode, 1, port, dir.file("r1"), env)};
  std::vector<int> st;
  if (!vttest::wait_all(pids, &st, 60)) {
    ADD_FAILURE() << mode << ": a rank hung";
    return false;
  }
  for (int w : st)
    if (!WIFEXITED(w) || WEXITSTATUS(w) != 0) {
      ADD_FAILURE() << mode << ": a rank failed: " << w;
      return false;
    }
  return true;
}

// Each rank's result file (r0, r1) starts with `head` and holds every one of `parts`.
void expect_on_both(const vttest::TempDir &dir, const std::string &head, std::initializer_list<std::string> parts) {
  for (const char *f : {"r0", "r1"}) {
    const std::string got = vttest::read_file(dir.file(f));
    EXPECT_EQ(got.rfind(head, 0), 0u) << f << ": " << got;
    for (const auto &p : parts) EXPECT_NE(got.find(p), std::string::npos) << f << ": " << got;
  }
}

// Micro-batch of samples [first, first + 2) of `step` whose first value is 5000: the
// marker of the model make_inf_grad_model() writes (finite loss, +Inf gradient of b).
ProcessResult feed_inf_grad(TrainerEngine &e, int step, int first) {
  BatchInfo info;
  info.step = step;
  info.step_samples = 2;
  info.next_clip = (step + 1) * 2;
  std::vector<at::Tensor> xs;
  for (int k = first; k < first + 2; k++) {
    xs.push_back(sample(step, k));
    info.captions.push_back(caption(k));
  }
  auto x = at::stack(xs);
  x[0][0][0][0][0] = 5000.0f;
  return e.process_tensor(x, info);
}

// A TorchScript model for any channel count whose loss stays finite while b's gradient
// is +Inf for a micro-batch marked as feed_inf_grad() does.
std::string make_inf_grad_model(const vttest::TempDir &dir) {
  return vttest::script_model(dir, "inf_grad", R"(
import sys, torch
from typing import List
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.ones(1))
        self.b = torch.nn.Parameter(torch.zeros(1))
    @torch.jit.export
    def training_step(self, latents: torch.Tensor, captions: List[str]) -> torch.Tensor:
        loss = ((latents * self.a + self.b - latents.flip(1)) ** 2).mean()
        if bool(latents[0, 0, 0, 0, 0] > 1000.0):
            loss = loss + torch.sqrt(self.b - self.b.detach()).sum()
        return loss
    def forward(self, x):
        return x * self.a + self.b
torch.jit.script(M()).save(sys.argv[1])
)");
}

// Rank 1 alone feeds a NaN in step 2 of 3 (one micro-batch of 2 per rank and step), or
// with `inf_grad` a micro-batch with a finite loss and an infinite gradient.
void nan_rank(TrainerEngine &e, const std::string &out, bool inf_grad = false) {
  const int r = e.rank();
  std::vector<int> skipped;
  const int id = e.add_step_callback([&](const StepReport &rep) {
    if (!rep.model_built && !rep.finished && rep.skipped) skipped.push_back(static_cast<int>(rep.step));
  });
  std::ofstream o(out);
  Params before;
  for (int s = 0; s < 3; s++) {
    if (s == 1) before = e.parameters_cpu();
    const bool bad = s == 1 && r == 1;
    const ProcessResult res =
        inf_grad && bad ? feed_inf_grad(e, s, 2 * r) : feed_result(e, s, 2 * r, 2, 0, 1, 2, bad && !inf_grad);
    if (res != ProcessResult::kOk) {
      o << "error " << e.error() << "\n";
      e.remove_step_callback(id);
      return;
    }
    if (s == 1) o << "unchanged " << (e.parameters_cpu() == before) << "\n";
  }
  e.remove_step_callback(id);
  o << "ok " << e.steps_done() << " skipped";
  for (int s : skipped) o << " " << s;
  o << "\n";
  write_params(out + ".params", e.parameters_cpu());
}

}  // namespace

// One rank of a two-process run (started by the tests below, never on its own).
TEST(DdpAgreeWorker, Rank) {
  const std::string mode = vttest::env_or("VT_DDP_MODE", "");
  const std::string out = vttest::env_or("VT_DDP_OUT", "");
  ASSERT_TRUE(!mode.empty() && !out.empty()) << "run by the DdpAgree tests only";
  const int rank = std::atoi(vttest::env_or("RANK", "0").c_str());
  auto c = config();
  c.timeout_s = 10;
  if (mode == "nan-fail" || mode == "grad-fail") c.nan_policy = "fail";
  if (mode == "grad-skip" || mode == "grad-fail") c.model = vttest::env_or("VT_DDP_DIR", "") + "/inf_grad.pt";
  if (mode == "nan-bound") c.max_skipped_steps = 2;
  if (mode == "init") {
    c.seed = 3 + rank;         // rank 1 builds other weights...
    c.latent_channels = kC;    // ...at start()
  }
  if (mode == "init-script") c.model = vttest::env_or("VT_DDP_DIR", "") + "/m" + std::to_string(rank) + ".pt";
  if (mode == "ckpt" || mode == "resume") c.checkpoint_dir = out + ".ckpt";  // one per rank: no shared filesystem
  if (mode == "rescue" || mode == "rescue-resume") {
    c.checkpoint_dir = vttest::env_or("VT_DDP_DIR", "") + "/shared";
    c.checkpoint_every = 0;
    c.checkpoint_interval_s = 0;
    c.timeout_s = 5;
  }
  if (mode == "ckpt-shared" || mode == "resume-shared") {
    c.checkpoint_dir = vttest::env_or("VT_DDP_DIR", "") + "/shared";
    c.checkpoint_every = 2;
  }
  c.resume = mode == "resume" || mode == "resume-shared" || mode == "rescue-resume";
  if (mode == "interval-nan") {
    c.checkpoint_dir = out + ".ckpt";
    c.checkpoint_interval_s = 60;
    c.eps = 0;  // the first update makes NaN weights (0 / 0 for the caption rows no caption used)
    int calls = 0;
    // Rank 0's clock is past the interval after start(); rank 1's never moves.
    c.clock = [rank, calls]() mutable { return rank == 0 && calls++ > 0 ? 1000.0 : 0.0; };
  }
  TrainerEngine e(c);
  if (mode == "resume" || mode == "resume-shared" || mode == "rescue-resume") {
    const bool ok = e.start();
    std::ofstream o(out);
    o << (ok ? "ok" : "error") << "\n" << e.error() << "\n";
    if (ok) o << "resumed at " << e.steps_done() << "\n";
    if (ok) write_params(out + ".params", e.parameters_cpu(/*with_buffers=*/true));
    for (auto &m : e.take_messages())
      if (m.name == "warning") o << "warning " << m.strings["text"] << "\n";
    return;
  }
  ASSERT_TRUE(e.start()) << e.error();
  if (mode == "init" || mode == "init-script") {
    write_params(out + ".params", e.parameters_cpu(/*with_buffers=*/true));
  } else if (mode == "nan-bound") {
    // Rank 1 feeds NaN from step 2 on: steps 2 and 3 are skipped on both, then both stop.
    std::ofstream o(out);
    for (int s = 0; s < 5; s++)
      if (feed_result(e, s, 2 * e.rank(), 2, 0, 1, 2, s >= 1 && e.rank() == 1) != ProcessResult::kOk) {
        o << "error at " << s + 1 << ": " << e.error() << "\n";
        break;
      }
  } else if (mode == "interval-nan") {
    std::ofstream o(out);
    for (int s = 0; s < 3; s++)
      if (feed_result(e, s, 2 * e.rank(), 2, 0, 1, 2) != ProcessResult::kOk) {
        o << "error " << e.error() << "\n";
        break;
      }
  } else if (mode == "ckpt-shared") {
    for (int s = 0; s < 4; s++) feed(e, s, 2 * e.rank(), 2, 0, 1, 2);  // rank 0 writes steps 2 and 4
  } else if (mode == "rescue") {
    for (int s = 0; s < 2; s++) feed(e, s, 2 * e.rank(), 2, 0, 1, 2);
    if (e.rank() == 1) _exit(0);  // a crash: no stop(), no end of stream
    write_params(out + ".params", e.parameters_cpu(/*with_buffers=*/true));
    std::ofstream o(out);
    o << (feed_result(e, 2, 0, 2, 0, 1, 2) == ProcessResult::kError ? "error" : "ok") << "\n" << e.error() << "\n";
    e.stop();
    for (auto &m : e.take_messages()) {
      if (m.name == "warning") o << "warning " << m.strings["text"] << "\n";
      if (m.name == "ddptrainsink-checkpoint") o << "checkpoint " << m.ints["step"] << " rescue " << m.ints["rescue"] << "\n";
    }
    return;
  } else if (mode == "ckpt") {
    for (int s = 0; s < 2; s++) feed(e, s, 2 * e.rank(), 2, 0, 1, 2);
    ASSERT_TRUE(e.finish()) << e.error();  // rank 0 writes step-00000002 into its folder
  } else {
    nan_rank(e, out, mode == "grad-skip" || mode == "grad-fail");
  }
  e.stop();
}

TEST(DdpAgree, ANonFiniteLossOnOneRankSkipsTheStepOnBoth) {
  vttest::TempDir dir;
  ASSERT_TRUE(run_ranks("nan-skip", dir));
  for (const char *f : {"r0", "r1"}) {
    const std::string got = vttest::read_file(dir.file(f));
    EXPECT_NE(got.find("unchanged 1\n"), std::string::npos) << f << ": the skipped step moved the weights\n" << got;
    EXPECT_NE(got.find("ok 3 skipped 2\n"), std::string::npos) << f << ": " << got;
  }
  const auto p0 = read_params(dir.file("r0.params"));
  EXPECT_FALSE(p0.empty());
  EXPECT_EQ(p0, read_params(dir.file("r1.params")));
}

TEST(DdpAgree, ANonFiniteLossOnOneRankFailsBothWithNanPolicyFail) {
  vttest::TempDir dir;
  ASSERT_TRUE(run_ranks("nan-fail", dir));
  expect_on_both(dir, "error ", {"non-finite loss at step 2 on 1 of 2"});
}

TEST(DdpAgree, AnInfiniteGradientOnOneRankSkipsTheStepOnBothOrFailsBoth) {
  // The loss is finite on both ranks; rank 1's gradient is +Inf. After the all-reduce both
  // hold the same (infinite) gradient and decide alike, without another collective.
  vttest::TempDir dir;
  ASSERT_FALSE(make_inf_grad_model(dir).empty());
  ASSERT_TRUE(run_ranks("grad-skip", dir, {{"VT_DDP_DIR", dir.path()}}));
  for (const char *f : {"r0", "r1"}) {
    const std::string got = vttest::read_file(dir.file(f));
    EXPECT_NE(got.find("unchanged 1\n"), std::string::npos) << f << ": the skipped step moved the weights\n" << got;
    EXPECT_NE(got.find("ok 3 skipped 2\n"), std::string::npos) << f << ": " << got;
  }
  const auto p0 = read_params(dir.file("r0.params"));
  EXPECT_FALSE(p0.empty());
  EXPECT_EQ(p0, read_params(dir.file("r1.params")));
  ASSERT_TRUE(run_ranks("grad-fail", dir, {{"VT_DDP_DIR", dir.path()}}));
  expect_on_both(dir, "error ", {"non-finite gradient (first: b) with a finite loss"});
}

TEST(DdpAgree, EveryRankStartsFromRankZerosWeights) {
  vttest::TempDir dir;
  ASSERT_TRUE(run_ranks("init", dir));
  auto built = [](uint64_t seed) {
    auto c = config();
    c.rank = 0;
    c.world_size = 1;
    c.seed = seed;
    c.latent_channels = kC;
    TrainerEngine e(c);
    EXPECT_TRUE(e.start()) << e.error();
    return e.parameters_cpu();
  };
  const auto rank0 = built(3);
  ASSERT_NE(rank0, built(4)) << "the seeds must give rank 1 other weights to begin with";
  EXPECT_EQ(read_params(dir.file("r0.params")), rank0);
  EXPECT_EQ(read_params(dir.file("r1.params")), rank0);
}

TEST(DdpAgree, EveryRankStartsFromRankZerosParametersAndBuffersOfATorchScriptModel) {
  // The model files may differ per host; rank 0's parameters and buffers win.
  vttest::TempDir dir;
  vttest::write_file(dir.file("make.py"), R"(
import sys, torch
from typing import List
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(4, 4, 1)
        self.register_buffer("shift", torch.rand(4))
    @torch.jit.export
    def training_step(self, latents: torch.Tensor, captions: List[str]) -> torch.Tensor:
        return ((self.conv(latents) + self.shift.view(1, -1, 1, 1, 1) - latents.flip(1)) ** 2).mean()
    def forward(self, x):
        return self.conv(x)
for r in (0, 1):
    torch.manual_seed(10 + r)
    torch.jit.script(M()).save(sys.argv[1] + "/m%d.pt" % r)
)");
  const std::string py = vttest::env_or("PYTHON", "/usr/bin/python3");
  ASSERT_EQ(std::system((py + " " + dir.file("make.py") + " " + dir.path()).c_str()), 0);
  auto loaded = [&](int r) {
    auto c = config();
    c.rank = 0;
    c.world_size = 1;
    c.model = dir.file("m" + std::to_string(r) + ".pt");
    TrainerEngine e(c);
    EXPECT_TRUE(e.start()) << e.error();
    return e.parameters_cpu(/*with_buffers=*/true);
  };
  const auto rank0 = loaded(0), rank1 = loaded(1);
  ASSERT_TRUE(rank0.count("shift"));
  ASSERT_NE(rank0.at("shift"), rank1.at("shift"));
  ASSERT_TRUE(run_ranks("init-script", dir, {{"VT_DDP_DIR", dir.path()}}));
  EXPECT_EQ(read_params(dir.file("r0.params")), rank0);
  EXPECT_EQ(read_params(dir.file("r1.params")), rank0);
}

TEST(DdpAgree, ResumeFailsWhenTheRanksFindDifferentCheckpoints) {
  // Each rank has its own checkpoint-dir: rank 0 writes step 2, rank 1 finds nothing.
  vttest::TempDir dir;
  ASSERT_TRUE(run_ranks("ckpt", dir));
  ASSERT_TRUE(std::ifstream(dir.file("r0.ckpt/step-00000002/trainer.json")).good());
  ASSERT_TRUE(run_ranks("resume", dir));
  expect_on_both(dir, "error\n", {"rank 0: step 2", "rank 1: none"});
}

TEST(DdpAgree, TheCheckpointIntervalFollowsRankZerosClockOnEveryRank) {
  vttest::TempDir dir;
  ASSERT_TRUE(run_ranks("interval-nan", dir));
  expect_on_both(dir, "", {"error the weights hold NaN/Inf at step 1"});
}

TEST(DdpAgree, NonFiniteLossesOnOneRankReachMaxSkippedStepsOnBoth) {
  vttest::TempDir dir;
  ASSERT_TRUE(run_ranks("nan-bound", dir));
  expect_on_both(dir, "", {"error at 3: 2 optimizer steps in a row (2 to 3)"});
}

TEST(DdpAgree, ARankWhoseCheckpointsAllFailToVerifyMakesBothFail) {
  vttest::TempDir dir;
  ASSERT_TRUE(run_ranks("ckpt", dir));
  std::filesystem::create_directories(dir.file("r1.ckpt"));
  std::filesystem::copy(dir.file("r0.ckpt/step-00000002"), dir.file("r1.ckpt/step-00000002"));
  vttest::nan_into_safetensors(dir.file("r1.ckpt/step-00000002/model.safetensors"));
  ASSERT_TRUE(run_ranks("resume", dir));
  const std::string r0 = vttest::read_file(dir.file("r0")), r1 = vttest::read_file(dir.file("r1"));
  EXPECT_EQ(r0.rfind("error\n", 0), 0u) << r0;
  EXPECT_NE(r0.find("rank 1 cannot resume"), std::string::npos) << r0;
  EXPECT_EQ(r1.rfind("error\n", 0), 0u) << r1;
  EXPECT_NE(r1.find("none of the 1 checkpoint folders"), std::string::npos) << r1;
}

TEST(DdpAgree, APeerThatDiesLeavesARescueCheckpointOfTheLastCompletedStep) {
  vttest::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> env{{"VT_DDP_DIR", dir.path()}};
  ASSERT_TRUE(run_ranks("rescue", dir, env));
  const std::string r0 = vttest::read_file(dir.file("r0"));
  EXPECT_EQ(r0.rfind("error\n", 0), 0u) << r0;
  EXPECT_NE(r0.find("rank 1"), std::string::npos) << r0;
  EXPECT_NE(r0.find("all-reduce"), std::string::npos) << r0;
  EXPECT_NE(r0.find("checkpoint 2 rescue 1\n"), std::string::npos) << r0;
  EXPECT_NE(r0.find("warning wrote a rescue checkpoint of step 2 to " + dir.file("shared/step-00000002")),
            std::string::npos)
      << r0;
  EXPECT_EQ(r0.find("not in a checkpoint"), std::string::npos) << r0;
  ASSERT_TRUE(std::ifstream(dir.file("shared/step-00000002/manifest.json")).good()) << r0;
  EXPECT_FALSE(std::filesystem::exists(dir.file("shared/step-00000003")));
  const Params at2 = read_params(dir.file("r0.params"));
  ASSERT_TRUE(run_ranks("rescue-resume", dir, env));
  for (const char *f : {"r0", "r1"}) {
    const std::string got = vttest::read_file(dir.file(f));
    EXPECT_EQ(got.rfind("ok\n", 0), 0u) << f << ": " << got;
    EXPECT_NE(got.find("resumed at 2\n"), std::string::npos) << f << ": " << got;
    EXPECT_EQ(read_params(dir.file(std::string(f) + ".params")), at2) << f;
  }
}

TEST(DdpAgree, BothRanksResumeFromTheCheckpointBeforeADamagedNewestOne) {
  vttest::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> env{{"VT_DDP_DIR", dir.path()}};
  ASSERT_TRUE(run_ranks("ckpt-shared", dir, env));
  vttest::nan_into_safetensors(dir.file("shared/step-00000004/model.safetensors"));
  ASSERT_TRUE(run_ranks("resume-shared", dir, env));
  for (const char *f : {"r0", "r1"}) {
    const std::string got = vttest::read_file(dir.file(f));
    EXPECT_EQ(got.rfind("ok\n", 0), 0u) << f << ": " << got;
    EXPECT_NE(got.find("resumed at 2\n"), std::string::npos) << f << ": " << got;
    EXPECT_NE(got.find("warning resume: skipping checkpoint '" + dir.file("shared/step-00000004")), std::string::npos)
        << f << ": " << got;
  }
}
