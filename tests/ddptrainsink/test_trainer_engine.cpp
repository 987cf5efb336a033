/* TrainerEngine on one rank: built-in models learn, gradient accumulation equals one
 * big batch, LR schedules, NaN policy, checkpoints (files readable from Python),
 * resume that repeats an uninterrupted run, snapshots and step callbacks. */
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "engine_helpers.h"
#include "multirank.h"
#include "test_util.h"
#include "ddptrainsink/trainer_engine.h"
#include "ddptrainsink/tfevents.h"
#include "models/param_snapshot.h"
#include "models/train_model.h"
#include "jit_load.h"

using namespace videotrain;
namespace fs = std::filesystem;

using namespace enginetest;

TEST(TrainerEngine, TinyUnet3dLearnsOnCpuAndPostsStepMessages) {
  auto c = cpu_config("builtin:tiny-unet3d");
  c.lr = 3e-3;
  c.log_every = 5;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  EXPECT_EQ(e.device_name(), "cpu");
  // The same two samples every step: the loss must fall.
  std::vector<double> losses;
  std::vector<TrainerEngine::Message> msgs;
  for (int s = 0; s < 40; s++) {
    auto x = at::stack({sample(0, 0), sample(0, 1)});
    ASSERT_EQ(e.process_tensor(x, info_for(s, 0, 1, 2)), ProcessResult::kOk) << e.error();
    losses.push_back(e.last_loss());
    for (auto &m : e.take_messages()) msgs.push_back(m);
  }
  double first = (losses[0] + losses[1] + losses[2] + losses[3] + losses[4]) / 5;
  double last = 0;
  for (int i = 35; i < 40; i++) last += losses[i] / 5;
  EXPECT_LT(last, 0.8 * first) << "loss did not fall: " << first << " -> " << last;
  EXPECT_EQ(e.steps_done(), 40u);
  ASSERT_EQ(msgs.size(), 8u);
  EXPECT_EQ(msgs[0].name, "ddptrainsink-step");
  EXPECT_EQ(msgs[0].ints.at("step"), 5);
  EXPECT_EQ(msgs[7].ints.at("step"), 40);
  for (const char *k : {"loss", "lr", "grad-norm", "samples-per-second", "data-wait"})
    EXPECT_TRUE(msgs[1].numbers.count(k)) << k;
  EXPECT_GT(msgs[1].numbers.at("samples-per-second"), 0);
  EXPECT_TRUE(std::isfinite(msgs[1].numbers.at("grad-norm")));
  EXPECT_DOUBLE_EQ(msgs[1].numbers.at("lr"), 3e-3);
}

TEST(TrainerEngine, CpuTrainingKeepsTensorMemoryInTheHeap) {
  // tune-malloc (default): tensor-sized blocks come from the heap and stay there when
  // freed, so the next step does not page-fault them again.
  TrainerEngine e(cpu_config("builtin:linear-test"));
  ASSERT_TRUE(e.start()) << e.error();
  auto x = at::stack({sample(0, 0), sample(0, 1)});
  ASSERT_EQ(e.process_tensor(x, info_for(0, 0, 1, 2)), ProcessResult::kOk) << e.error();
  EXPECT_EQ(vttest::heap_keeps_large_blocks(), "");
}

TEST(TrainerEngine, GradientAccumulationEqualsOneBatch) {
  // 2 micro-batches of 2 (sync on the second) == 1 micro-batch of 4, same samples.
  auto c = cpu_config("builtin:linear-test");
  TrainerEngine a(c), b(c);
  ASSERT_TRUE(a.start()) << a.error();
  ASSERT_TRUE(b.start()) << b.error();
  train(a, 0, 5, 2, 2);
  train(b, 0, 5, 1, 4);
  EXPECT_LT(max_rel_diff(a.parameters_cpu(), b.parameters_cpu()), 1e-5);
  EXPECT_NEAR(a.last_loss(), b.last_loss(), 1e-6 * std::abs(b.last_loss()));
}

TEST(TrainerEngine, UnequalMicroBatchesWeighTheirLossBySamples) {
  // 3 + 1 samples in one step == 4 in one: each micro-batch's loss counts m / S (with
  // 1 / micro_count the single sample would weigh as much as the other three).
  auto c = cpu_config("builtin:linear-test");
  c.lr = 1e-2;
  TrainerEngine a(c), b(c);
  ASSERT_TRUE(a.start()) << a.error();
  ASSERT_TRUE(b.start()) << b.error();
  std::vector<std::string> caps{"a cat on a mat", "a red car", "", "a red car"};
  for (uint64_t s = 0; s < 3; s++) {
    std::vector<at::Tensor> xs;
    for (int k = 0; k < 4; k++) xs.push_back(sample(s, k));
    auto x = at::stack(xs);
    for (auto [first, m] : {std::pair<int, int>{0, 3}, {3, 1}}) {
      BatchInfo i;
      i.micro_index = first == 0 ? 0 : 1;
      i.micro_count = 2;
      i.step_samples = 4;
      i.sync = first != 0;
      i.captions.assign(caps.begin() + first, caps.begin() + first + m);
      ASSERT_EQ(a.process_tensor(x.narrow(0, first, m), i), ProcessResult::kOk) << a.error();
    }
    BatchInfo whole;
    whole.step_samples = 4;
    whole.captions = caps;
    ASSERT_EQ(b.process_tensor(x, whole), ProcessResult::kOk) << b.error();
    EXPECT_NEAR(a.last_loss(), b.last_loss(), 1e-6 * std::abs(b.last_loss())) << "step " << s + 1;
  }
  EXPECT_LT(max_rel_diff(a.parameters_cpu(), b.parameters_cpu()), 1e-5);
}

TEST(TrainerEngine, SchedulesWarmupAndDecay) {
  for (std::string sched : {"constant", "linear", "cosine"}) {
    auto c = cpu_config("builtin:linear-test");
    c.lr = 1e-2;
    c.lr_schedule = sched;
    c.warmup_steps = 2;
    c.max_steps = 6;
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    std::vector<double> lrs;
    int id = e.add_step_callback([&](const StepReport &r) {
      if (!r.model_built) lrs.push_back(r.lr);
    });
    for (int s = 0; s < 6; s++) {
      auto r = e.process_tensor(at::stack({sample(s, 0)}), info_for(s, 0, 1, 1));
      ASSERT_EQ(r, s == 5 ? ProcessResult::kDone : ProcessResult::kOk) << e.error();
    }
    // Past max-steps nothing more is trained.
    EXPECT_EQ(e.process_tensor(at::stack({sample(9, 0)}), info_for(9, 0, 1, 1)), ProcessResult::kDone);
    e.remove_step_callback(id);
    ASSERT_EQ(lrs.size(), 6u) << sched;
    EXPECT_DOUBLE_EQ(lrs[0], 5e-3);
    EXPECT_DOUBLE_EQ(lrs[1], 1e-2);
    if (sched == "constant") {
      EXPECT_DOUBLE_EQ(lrs[5], 1e-2);
    }
    if (sched == "linear") {
      EXPECT_NEAR(lrs[2], 1e-2, 1e-12);
      EXPECT_NEAR(lrs[3], 0.75e-2, 1e-12);
      EXPECT_NEAR(lrs[5], 0.25e-2, 1e-12);
    }
    if (sched == "cosine") {
      EXPECT_NEAR(lrs[2], 1e-2, 1e-12);
      EXPECT_NEAR(lrs[4], 0.5e-2, 1e-12);
      EXPECT_LT(lrs[5], lrs[4]);
    }
  }
}

TEST(TrainerEngine, NonFiniteLossSkipsOrFails) {
  auto c = cpu_config("builtin:linear-test");
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  train(e, 0, 1, 1, 2);
  auto before = e.parameters_cpu();
  e.take_messages();
  auto bad = at::stack({sample(1, 0), sample(1, 1)});
  bad[0][0][0][0][0] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_EQ(e.process_tensor(bad, info_for(1, 0, 1, 2)), ProcessResult::kOk) << e.error();
  EXPECT_EQ(e.steps_done(), 2u);
  EXPECT_EQ(max_rel_diff(before, e.parameters_cpu()), 0.0) << "a skipped step must not move the weights";
  bool warned = false;
  for (auto &m : e.take_messages())
    if (m.name == "warning" && m.strings["text"].find("non-finite loss") != std::string::npos) warned = true;
  EXPECT_TRUE(warned);
  // Training goes on afterwards.
  train(e, 2, 1, 1, 2);
  EXPECT_GT(max_rel_diff(before, e.parameters_cpu()), 0.0);

  c.nan_policy = "fail";
  TrainerEngine f(c);
  ASSERT_TRUE(f.start()) << f.error();
  EXPECT_EQ(f.process_tensor(bad, info_for(0, 0, 1, 2)), ProcessResult::kError);
  EXPECT_NE(f.error().find("non-finite loss"), std::string::npos) << f.error();
}

TEST(TrainerEngine, AnUnwritableMetricsFileIsAnErrorAtStart) {
  // As checkpoint-dir (README): a run asked to keep records it cannot write fails at once,
  // naming the file and the property, not with a warning after hours of training.
  vttest::TempDir dir;
  auto c = cpu_config("builtin:linear-test");
  c.log_every = 1;
  vttest::write_file(dir.file("a-file"), "");
  c.metrics_file = dir.file("a-file/metrics.jsonl");  // a folder that cannot be made (root ignores modes)
  TrainerEngine e(c);
  EXPECT_FALSE(e.start());
  EXPECT_NE(e.error().find("metrics-file '" + c.metrics_file + "'"), std::string::npos) << e.error();
  EXPECT_NE(e.error().find("(property metrics-file)"), std::string::npos) << e.error();
  c.metrics_file = dir.path();  // a folder, not a file
  TrainerEngine f(c);
  EXPECT_FALSE(f.start());
  EXPECT_NE(f.error().find("cannot write metrics-file"), std::string::npos) << f.error();
}

TEST(TrainerEngine, EndOfStreamLogsTheLastStepThatLogEveryPassedOver) {
  // A run shorter than log-every (or ending between two logged steps) still leaves its last
  // step in the metrics file, the TensorBoard events and a message.
  vttest::TempDir dir;
  auto c = cpu_config("builtin:linear-test");
  c.log_every = 10;
  c.metrics_file = dir.file("metrics.jsonl");
  c.tensorboard_dir = dir.file("tb");
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  train(e, 0, 3, 1, 2);
  EXPECT_TRUE(e.take_messages().empty()) << "no step is logged before log-every";
  ASSERT_TRUE(e.finish()) << e.error();
  std::vector<int64_t> logged;
  for (auto &m : e.take_messages())
    if (m.name == "ddptrainsink-step") logged.push_back(m.ints.at("step"));
  EXPECT_EQ(logged, std::vector<int64_t>{3});
  const std::string metrics = vttest::read_file(c.metrics_file);
  EXPECT_NE(metrics.find("\"step\":3"), std::string::npos) << metrics;
  e.stop();
  std::string events;
  for (const auto &f : fs::directory_iterator(c.tensorboard_dir)) events += vttest::read_file(f.path());
  EXPECT_NE(events.find("train/loss"), std::string::npos) << "the events file holds no scalar";
}

TEST(TrainerEngine, BadConfigurationAndInputAreErrors) {
  {
    TrainerEngine e(cpu_config("builtin:nope"));
    ASSERT_TRUE(e.start());  // channels unknown until the first micro-batch
    EXPECT_EQ(e.process_tensor(at::zeros({1, 4, 2, 8, 8}), info_for(0, 0, 1, 1)), ProcessResult::kError);
    EXPECT_NE(e.error().find("unknown built-in model"), std::string::npos) << e.error();
  }
  {
    TrainerEngine e(cpu_config("/nonexistent/model.pt"));
    EXPECT_FALSE(e.start());
    EXPECT_NE(e.error().find("/nonexistent/model.pt"), std::string::npos) << e.error();
  }
  {
    auto c = cpu_config("builtin:linear-test");
    c.device = "cuda:0";
    TrainerEngine e(c);
    if (!torch::cuda::is_available()) {
      EXPECT_FALSE(e.start());
      EXPECT_NE(e.error().find("device"), std::string::npos) << e.error();
    }
  }
  {
    auto c = cpu_config("builtin:linear-test");
    c.rank = 3;
    c.world_size = 2;
    TrainerEngine e(c);
    EXPECT_FALSE(e.start());
    EXPECT_NE(e.error().find("world-size"), std::string::npos) << e.error();
  }
  {
    TrainerEngine e(cpu_config("builtin:linear-test"));
    ASSERT_TRUE(e.start());
    EXPECT_EQ(e.process_tensor(at::zeros({4, 8, 8}), info_for(0, 0, 1, 1)), ProcessResult::kError);
    EXPECT_NE(e.error().find("[m, C, t, h, w]"), std::string::npos) << e.error();
    ASSERT_EQ(e.process_tensor(at::zeros({1, 4, 2, 8, 8}), info_for(0, 0, 1, 1)), ProcessResult::kOk);
    EXPECT_EQ(e.process_tensor(at::zeros({1, 3, 2, 8, 8}), info_for(1, 0, 1, 1)), ProcessResult::kError);
    EXPECT_NE(e.error().find("latent channels"), std::string::npos) << e.error();
  }
}

TEST(TrainerEngine, ATorchScriptModelsOwnErrorNamesItsLineAndInputs) {
  // A model made for 16 latent channels fed 4: the element error must carry PyTorch's own
  // message, the model's source line and the shapes it got, not TorchScript's first line.
  vttest::TempDir dir;
  const std::string model = vttest::script_model(dir, "wrong_channels", R"(
import sys, torch
from typing import List
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(16, 8)
    def pooled(self, latents: torch.Tensor) -> torch.Tensor:
        return self.head(latents.mean([2, 3, 4]))
    @torch.jit.export
    def training_step(self, latents: torch.Tensor, captions: List[str]) -> torch.Tensor:
        return self.pooled(latents).pow(2).mean()
torch.jit.script(M()).save(sys.argv[1])
)");
  ASSERT_FALSE(model.empty());
  TrainerEngine e(cpu_config(model));
  ASSERT_TRUE(e.start()) << e.error();
  EXPECT_EQ(e.process_tensor(at::zeros({2, 4, 3, 8, 8}), info_for(0, 0, 1, 2)), ProcessResult::kError);
  const std::string err = e.error();
  EXPECT_NE(err.find("mat1 and mat2 shapes cannot be multiplied (2x4 and 16x8)"), std::string::npos) << err;
  EXPECT_NE(err.find("wrong_channels.py\", line 9, in pooled: return self.head(latents.mean([2, 3, 4]))"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("latents [2, 4, 3, 8, 8] Float"), std::string::npos) << err;
  EXPECT_EQ(err.find("The following operation failed"), std::string::npos) << err;
}

TEST(TrainerEngine, Bf16OnCpuTrainsBothBuiltinModels) {
  // precision=bf16 on CPU: autocast runs the convolutions and matmuls in bfloat16; the
  // norms (whose CPU kernels take one dtype) must still get a type they accept.
  for (const char *m : {"builtin:tiny-unet3d", "builtin:tiny-t2v"}) {
    auto c = cpu_config(m);
    c.precision = "bf16";
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << m << ": " << e.error();
    for (int s = 0; s < 3; s++) {
      auto info = info_for(s, 0, 1, 2);
      auto x = at::stack({sample(0, 2 * s), sample(0, 2 * s + 1)});
      ProcessResult r;
      if (std::string(m) == "builtin:tiny-t2v") {
        ModelInputs in;
        in.latents = x;
        in.text_embeds = at::randn({2, 5, 12});
        in.text_mask = at::ones({2, 5}, at::kLong);
        r = e.process_inputs(in, info);
      } else {
        r = e.process_tensor(x, info);
      }
      ASSERT_EQ(r, ProcessResult::kOk) << m << " step " << s + 1 << ": " << e.error();
      EXPECT_TRUE(std::isfinite(e.last_loss())) << m;
    }
    EXPECT_EQ(e.steps_done(), 3u) << m;
  }
}

TEST(TrainerEngine, ResumedRunRepeatsTheUninterruptedOne) {
  vttest::TempDir dir;
  auto c = cpu_config("builtin:tiny-unet3d");  // draws noise: checks the generator seeding too
  c.log_every = 0;
  // Uninterrupted: 20 steps.
  TrainerEngine full(c);
  ASSERT_TRUE(full.start()) << full.error();
  auto losses = train(full, 0, 20, 2, 1);
  ASSERT_EQ(losses.size(), 20u);

  // Stopped at step 10 (max-steps writes the checkpoint)...
  auto c1 = c;
  c1.checkpoint_dir = dir.path();
  c1.max_steps = 10;
  TrainerEngine first(c1);
  ASSERT_TRUE(first.start()) << first.error();
  auto l1 = train(first, 0, 10, 2, 1);
  EXPECT_EQ(first.steps_done(), 10u);
  bool posted = false;
  for (auto &m : first.take_messages())
    if (m.name == "ddptrainsink-checkpoint") {
      posted = true;
      EXPECT_EQ(m.ints["step"], 10);
      EXPECT_EQ(m.strings["path"], dir.path() + "/step-00000010");
    }
  EXPECT_TRUE(posted);
  first.stop();
  ASSERT_TRUE(fs::exists(dir.file("step-00000010/model.safetensors")));
  ASSERT_TRUE(fs::exists(dir.file("step-00000010/optimizer.pt")));

  // ...and resumed to 20.
  auto c2 = c;
  c2.checkpoint_dir = dir.path();
  c2.resume = true;
  c2.max_steps = 20;
  TrainerEngine second(c2);
  ASSERT_TRUE(second.start()) << second.error();
  ASSERT_TRUE(second.resumed());
  EXPECT_EQ(second.resume_point().step, 10u);
  EXPECT_EQ(second.resume_point().epoch, 0u);
  EXPECT_EQ(second.resume_point().clip, 20u);  // next_clip of step 10's last micro-batch
  auto l2 = train(second, 10, 10, 2, 1);
  ASSERT_EQ(l2.size(), 10u);
  for (int i = 0; i < 10; i++) {
    EXPECT_DOUBLE_EQ(l1[i], losses[i]) << i;
    EXPECT_NEAR(l2[i], losses[10 + i], 1e-6 * std::abs(losses[10 + i])) << "step " << 11 + i;
  }
  EXPECT_LT(max_rel_diff(full.parameters_cpu(), second.parameters_cpu()), 1e-6);
  EXPECT_TRUE(fs::exists(dir.file("step-00000020/trainer.json")));
}

TEST(TrainerEngine, ResumeWarnsOfAChangedScheduleAndClearsKilledRunsFolders) {
  vttest::TempDir dir;
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = dir.path();
  c.max_steps = 2;
  {
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    train(e, 0, 2, 1, 1);
    ASSERT_TRUE(fs::exists(dir.file("step-00000002/trainer.json")));
    EXPECT_FALSE(fs::exists(dir.file("step-00000002/rng.pt")));
  }
  // What a run killed while writing its checkpoint leaves.
  fs::create_directories(dir.file(".tmp-step-00000003-4242"));
  vttest::write_file(dir.file(".tmp-step-00000003-4242/trainer.json"), "{");
  c.resume = true;
  c.max_steps = 4;
  c.lr_schedule = "cosine";
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  EXPECT_TRUE(e.resumed());
  EXPECT_FALSE(fs::exists(dir.file(".tmp-step-00000003-4242")));
  std::string warning;
  for (auto &m : e.take_messages())
    if (m.name == "warning" && m.strings["text"].find("schedule") != std::string::npos) warning = m.strings["text"];
  EXPECT_NE(warning.find("lr-schedule \"constant\" -> \"cosine\""), std::string::npos) << warning;
  EXPECT_NE(warning.find("max-steps 2 -> 4"), std::string::npos) << warning;
  EXPECT_EQ(warning.find("warmup-steps"), std::string::npos) << warning;
}

TEST(TrainerEngine, TorchScriptCpuFusionIsOffUnlessAskedFor) {
  // LLVM builds of LibTorch stalled at the third step compiling fused CPU kernels.
  vttest::TempDir dir;
  const std::string model = vttest::make_script_model(dir);
  torch::jit::overrideCanFuseOnCPU(true);
  {
    TrainerEngine e(cpu_config(model));
    ASSERT_TRUE(e.start()) << e.error();
    EXPECT_FALSE(torch::jit::canFuseOnCPU());
  }
  setenv("VIDEOTRAIN_JIT_CPU_FUSION", "1", 1);
  {
    TrainerEngine e(cpu_config(model));
    ASSERT_TRUE(e.start()) << e.error();
    EXPECT_TRUE(torch::jit::canFuseOnCPU());
  }
  unsetenv("VIDEOTRAIN_JIT_CPU_FUSION");
  torch::jit::overrideCanFuseOnCPU(false);
}

TEST(TrainerEngine, CheckpointsRotateAndTorchScriptWeightsLoadInPython) {
  vttest::TempDir dir;
  const std::string py = vttest::env_or("PYTHON", "/usr/bin/python3");
  const std::string model = vttest::make_script_model(dir);
  ASSERT_FALSE(HasFailure());
  auto c = cpu_config(model);
  c.checkpoint_dir = dir.file("ckpt");
  c.checkpoint_every = 2;
  c.keep_checkpoints = 2;
  c.metrics_file = dir.file("metrics.jsonl");
  c.log_every = 1;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  train(e, 0, 7, 1, 2);
  ASSERT_TRUE(e.finish()) << e.error();  // EOS: final checkpoint at step 7
  std::vector<std::string> names;
  for (auto &d : fs::directory_iterator(c.checkpoint_dir)) names.push_back(d.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000006", "step-00000007"}));
  // Python sees the trained weights.
  auto params = e.parameters_cpu();
  vttest::write_file(dir.file("check.py"), R"(
import sys, torch
m = torch.jit.load(sys.argv[1])
print(repr(float(m.conv.weight.flatten()[0])), repr(float(m.conv.bias[3])))
)");
  std::string out_file = dir.file("out.txt");
  ASSERT_EQ(std::system((py + " " + dir.file("check.py") + " " + c.checkpoint_dir + "/step-00000007/model.pt > " +
                         out_file)
                            .c_str()),
            0);
  double w0 = 0, b3 = 0;
  std::istringstream(vttest::read_file(out_file)) >> w0 >> b3;
  EXPECT_NEAR(w0, params.at("conv.weight")[0], 1e-7);
  EXPECT_NEAR(b3, params.at("conv.bias")[3], 1e-7);
  // Metrics: one line per step and per checkpoint.
  std::istringstream lines(vttest::read_file(c.metrics_file));
  int steps = 0, ckpts = 0;
  for (std::string l; std::getline(lines, l);) {
    if (l.find("\"type\":\"step\"") != std::string::npos) steps++;
    if (l.find("\"type\":\"checkpoint\"") != std::string::npos) ckpts++;
  }
  EXPECT_EQ(steps, 7);
  EXPECT_EQ(ckpts, 4);  // steps 2, 4, 6 and the final 7
}

TEST(TrainerEngine, SnapshotIsACopyBetweenSteps) {
  TrainerEngine e(cpu_config("builtin:linear-test"));
  ASSERT_TRUE(e.start());
  EXPECT_EQ(e.snapshot_state(), nullptr);  // channels unknown yet: no model
  train(e, 0, 1, 1, 2);
  std::shared_ptr<const ParamSnapshot> at_step;
  int id = e.add_step_callback([&](const StepReport &r) {
    if (r.step == 2) at_step = e.snapshot_state();
  });
  auto snap = e.snapshot_state();
  ASSERT_NE(snap, nullptr);
  EXPECT_EQ(snap->step, 1u);
  EXPECT_EQ(snap->model, "builtin:linear-test");
  auto w = snap->parameters.front().second.clone();
  train(e, 1, 2, 1, 2);
  e.remove_step_callback(id);
  EXPECT_TRUE(at::equal(w, snap->parameters.front().second)) << "a snapshot must not follow training";
  ASSERT_NE(at_step, nullptr);
  EXPECT_EQ(at_step->step, 2u);
  EXPECT_FALSE(at::equal(w, at_step->parameters.front().second));
}

TEST(TfEvents, Crc32cAndRecordFraming) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  std::string rec = tf_record("abc");
  ASSERT_EQ(rec.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(rec[0], 3);
  uint32_t c = 0;
  std::memcpy(&c, rec.data() + 15, 4);
  EXPECT_EQ(c, masked_crc32c("abc", 3));
  // Event: wall_time (0x09), step (0x10) = 300 as a varint, summary (0x2a) with one value.
  std::string ev = tf_event_scalars(1.5, 300, {{"loss", 0.25f}});
  EXPECT_EQ(static_cast<uint8_t>(ev[0]), 0x09);
  EXPECT_EQ(static_cast<uint8_t>(ev[9]), 0x10);
  EXPECT_EQ(static_cast<uint8_t>(ev[10]), 0xAC);
  EXPECT_EQ(static_cast<uint8_t>(ev[11]), 0x02);
  EXPECT_EQ(static_cast<uint8_t>(ev[12]), 0x2a);
  EXPECT_NE(ev.find("loss"), std::string::npos);
}

TEST(TrainerEngine, ARankThatNeverComesIsReportedWhileWaitingAndAStopEndsTheWait) {
  // Rank 0 of 2, rank 1 never started: start() says every timeout/4 (here 2 s) which rank it
  // waits for and until when, and interrupt() ends the wait at once instead of at the timeout.
  auto c = cpu_config("builtin:linear-test");
  c.world_size = 2;
  c.rank = 0;
  c.master_addr = "127.0.0.1";
  c.master_port = vttest::free_port();
  c.timeout_s = 8;
  TrainerEngine e(c);
  std::mutex mu;
  std::vector<std::string> said;
  e.set_message_hook([&] {
    std::lock_guard<std::mutex> lock(mu);
    for (auto &m : e.take_messages()) said.push_back(m.strings["text"]);
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::thread stopper([&] {
    for (int i = 0; i < 100; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::lock_guard<std::mutex> lock(mu);
      if (!said.empty()) break;
    }
    e.interrupt(true);
  });
  EXPECT_FALSE(e.start());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stopper.join();
  ASSERT_FALSE(said.empty()) << "nothing said while waiting";
  EXPECT_NE(said[0].find("rank 0 of 2 is waiting for rank 1 to join: 2 s so far; gives up at "), std::string::npos)
      << said[0];
  EXPECT_NE(said[0].find("timeout 8 s"), std::string::npos) << said[0];
  EXPECT_NE(e.error().find("stopped while waiting for the other ranks to join (ranks missing: 1)"), std::string::npos)
      << e.error();
  EXPECT_LT(took, 4.0) << "the stop did not end the wait";
}
