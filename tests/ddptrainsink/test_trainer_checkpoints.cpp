/* Failures that used to hang or lose work, on one rank: checkpoints that do not verify
 * (NaN bytes, truncation, a half-deleted folder) or that load NaN/Inf weights or optimizer
 * state are skipped at resume for the previous good one; checkpoints from before
 * manifests (legacy) resume with a warning; pruning keeps the last verified checkpoint;
 * non-finite weights are never written; non-finite gradients with a finite loss are not
 * applied; nan-policy=skip is bounded and a run that skipped every step fails; an
 * unwritable checkpoint-dir fails at start; metrics-file's folder is created;
 * checkpoint-interval writes checkpoints by the (injected) clock. */
#include <ATen/ATen.h>
#include <torch/torch.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddptrainsink/checkpoint_store.h"
#include "ddptrainsink/optimizer_file.h"
#include "engine_helpers.h"
#include "test_util.h"

using namespace videotrain;
using namespace enginetest;
namespace fs = std::filesystem;

namespace {

// Warnings that mention `about` (others, such as tune-malloc's, depend on the machine).
std::vector<std::string> warnings(TrainerEngine &e, const std::string &about = "checkpoint") {
  std::vector<std::string> out;
  for (auto &m : e.take_messages())
    if (m.name == "warning" && m.strings["text"].find(about) != std::string::npos) out.push_back(m.strings["text"]);
  return out;
}

std::string joined(const std::vector<std::string> &v) {
  std::string s;
  for (const auto &x : v) s += x + "\n";
  return s;
}

bool verifies(const std::string &dir) { return CheckpointStore::verify(dir, nullptr).empty(); }

// Checkpoints of builtin:linear-test at steps 2 and 4 in `root`.
void write_two_checkpoints(const std::string &root) {
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = root;
  c.checkpoint_every = 2;
  c.max_steps = 4;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  train(e, 0, 4, 1, 2);
  ASSERT_TRUE(verifies(root + "/step-00000002"));
  ASSERT_TRUE(verifies(root + "/step-00000004"));
}

// What a version before manifests left: no manifest.json, and a trainer.json that does
// not say a manifest seals the folder (otherwise the same files).
void make_legacy(const std::string &dir) {
  ASSERT_TRUE(fs::remove(dir + "/manifest.json"));
  auto state = nlohmann::json::parse(vttest::read_file(dir + "/trainer.json"));
  ASSERT_EQ(state.erase("sealed_by"), 1u);
  vttest::write_file(dir + "/trainer.json", state.dump(2) + "\n");
}

// Rewrites manifest.json for the files as they are now (damage the checksums cannot see).
void reseal(const std::string &dir) {
  auto manifest = nlohmann::json::parse(vttest::read_file(dir + "/manifest.json"));
  for (auto &[name, entry] : manifest["files"].items()) {
    const std::string bytes = vttest::read_file(dir + "/" + name);
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08x", crc32_update(0, bytes.data(), bytes.size()));
    entry["size"] = bytes.size();
    entry["crc32"] = hex;
  }
  vttest::write_file(dir + "/manifest.json", manifest.dump(2) + "\n");
}

TrainerConfig resume_config(const std::string &root) {
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = root;
  c.resume = true;
  c.checkpoint_every = 1;
  return c;
}

void nan_batch(TrainerEngine &e, uint64_t step, ProcessResult want) {
  auto bad = at::stack({sample(step, 0), sample(step, 1)});
  bad[0][0][0][0][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(e.process_tensor(bad, info_for(step, 0, 1, 2)), want) << "step " << step + 1 << ": " << e.error();
}

}  // namespace

TEST(CheckpointStore, Crc32IsZlibs) {
  EXPECT_EQ(crc32_update(0, "123456789", 9), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(crc32_update(0, "", 0), 0u);
  // Slices of 8 and the byte tail agree with one pass over an odd length.
  std::vector<uint8_t> data(1000003);
  for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  const uint32_t whole = crc32_update(0, data.data(), data.size());
  uint32_t parts = crc32_update(0, data.data(), 5);
  parts = crc32_update(parts, data.data() + 5, data.size() - 5);
  EXPECT_EQ(whole, parts);
  // Python's zlib.crc32 says the same (users can check a manifest with it).
  vttest::TempDir dir;
  {
    std::ofstream(dir.file("blob"), std::ios::binary).write(reinterpret_cast<const char *>(data.data()), data.size());
  }
  const std::string py = vttest::env_or("PYTHON", "/usr/bin/python3");
  ASSERT_EQ(std::system((py + " -c \"import sys, zlib; print(zlib.crc32(open(sys.argv[1], 'rb').read()))\" " +
                         dir.file("blob") + " > " + dir.file("crc.txt"))
                            .c_str()),
            0);
  EXPECT_EQ(std::stoull(vttest::read_file(dir.file("crc.txt"))), whole);
}

// A full disk while the optimizer state is written (issue 38 item 11): torch::save's archive writer
// threw from its destructor and the process aborted; now an exception names the file.
TEST(CheckpointStore, AFullDiskWhileWritingTheOptimizerIsAnErrorNotAnAbort) {
  auto w = torch::ones({64, 64}, torch::requires_grad());
  torch::optim::AdamW opt({w});
  (w * w).sum().backward();
  opt.step();
  try {
    save_optimizer(opt, "/dev/full");  // every write fails with ENOSPC
    FAIL() << "no error";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOSPC)), std::string::npos) << e.what();
  }
  vttest::TempDir dir;
  ASSERT_NO_THROW(save_optimizer(opt, dir.file("optimizer.pt")));
  torch::optim::AdamW back({w.detach().clone().requires_grad_()});
  torch::load(back, dir.file("optimizer.pt"));
  EXPECT_EQ(back.state().size(), 1u);
}

TEST(CheckpointStore, PruneKeepsTheNewestBelowTheOneJustWrittenAndLeavesLaterFolders) {
  vttest::TempDir dir;
  CheckpointStore store(dir.path());
  std::string why;
  ASSERT_TRUE(store.prepare(&why)) << why;
  auto commit = [&](uint64_t step) {
    const std::string tmp = store.begin(step);
    vttest::write_file(tmp + "/weights.bin", std::string(100, static_cast<char>(step)));
    return store.commit(tmp, step, {{"step", step}});
  };
  for (uint64_t s : {1, 2, 3}) EXPECT_TRUE(verifies(commit(s)));
  commit(9);
  vttest::write_file(dir.file("step-00000009/weights.bin"), "changed");  // fails to verify: kept, not counted
  fs::create_directories(dir.file("step-00000000"));                     // no manifest: not ours
  EXPECT_TRUE(verifies(commit(4)));
  // Ours with its manifest deleted (trainer.json says one sealed it): damaged, it goes too.
  ASSERT_TRUE(fs::remove(dir.file("step-00000001/manifest.json")));
  store.prune(2, 4);
  std::vector<std::string> left;
  for (const auto &[step, d] : store.step_folders()) left.push_back(fs::path(d).filename().string());
  EXPECT_EQ(left, (std::vector<std::string>{"step-00000009", "step-00000004", "step-00000003", "step-00000000"}));
  // Deletion goes through a .trash- name: nothing of it is left once it is done.
  for (const auto &e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().rfind(".trash-", 0), std::string::npos) << e.path();
}

TEST(TrainerEngine, ResumeSkipsANewestCheckpointThatDoesNotVerifyAndKeepsThePreviousOne) {
  struct Damage {
    const char *what;
    void (*apply)(const std::string &dir);
    const char *reason;
  };
  const Damage damages[] = {
      {"NaN bytes, length unchanged", [](const std::string &d) { vttest::nan_into_safetensors(d + "/model.safetensors"); },
       "CRC-32"},
      {"truncated optimizer state",
       [](const std::string &d) { fs::resize_file(d + "/optimizer.pt", fs::file_size(d + "/optimizer.pt") / 2); },
       "bytes, the manifest says"},
      {"deletion interrupted (weights gone, trainer.json left)",
       [](const std::string &d) { fs::remove(d + "/model.safetensors"); }, "model.safetensors"},
      {"deletion interrupted (manifest gone)", [](const std::string &d) { fs::remove(d + "/manifest.json"); },
       "no manifest.json"},
      // Hostile files: a FIFO is refused at once (reading one would block the start forever).
      {"trainer.json replaced by a FIFO",
       [](const std::string &d) {
         fs::remove(d + "/trainer.json");
         ASSERT_EQ(mkfifo((d + "/trainer.json").c_str(), 0600), 0);
       },
       "not a regular file"},
      {"optimizer state replaced by a FIFO",
       [](const std::string &d) {
         fs::remove(d + "/optimizer.pt");
         ASSERT_EQ(mkfifo((d + "/optimizer.pt").c_str(), 0600), 0);
       },
       "not a regular file"},
  };
  for (const auto &dmg : damages) {
    SCOPED_TRACE(dmg.what);
    vttest::TempDir dir;
    write_two_checkpoints(dir.path());
    if (HasFatalFailure()) return;
    dmg.apply(dir.file("step-00000004"));
    auto c = cpu_config("builtin:linear-test");
    c.checkpoint_dir = dir.path();
    c.resume = true;
    c.checkpoint_every = 1;
    c.keep_checkpoints = 2;
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    ASSERT_TRUE(e.resumed());
    EXPECT_EQ(e.resume_point().step, 2u);
    EXPECT_EQ(e.steps_done(), 2u);
    const auto w = warnings(e);
    ASSERT_EQ(w.size(), 1u) << joined(w);
    EXPECT_NE(w[0].find(dir.file("step-00000004")), std::string::npos) << w[0];
    EXPECT_NE(w[0].find(dmg.reason), std::string::npos) << w[0];
    // Step 3 is written; the good step 2 stays (keep-checkpoints=2), the damaged 4 is
    // left until training reaches step 4 again, which replaces it.
    train(e, 2, 1, 1, 2);
    EXPECT_TRUE(verifies(dir.file("step-00000002")));
    EXPECT_TRUE(verifies(dir.file("step-00000003")));
    EXPECT_TRUE(fs::exists(dir.file("step-00000004")));
    train(e, 3, 1, 1, 2);
    EXPECT_TRUE(verifies(dir.file("step-00000004")));
    EXPECT_FALSE(fs::exists(dir.file("step-00000002")));
  }
}

// Two runs in one checkpoint-dir would mix their checkpoints (issue 38 item 14): the second fails at
// start naming the holder; a lock left by a process that died is taken over with a warning; one
// released normally is taken without a word.
TEST(TrainerEngine, ASecondRunInTheSameCheckpointDirFailsNamingTheHolder) {
  vttest::TempDir dir;
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = dir.path();
  {
    TrainerEngine first(c);
    ASSERT_TRUE(first.start()) << first.error();
    TrainerEngine second(c);
    EXPECT_FALSE(second.start());
    EXPECT_NE(second.error().find("is in use by another run"), std::string::npos) << second.error();
    EXPECT_NE(second.error().find("pid " + std::to_string(getpid())), std::string::npos) << second.error();
    EXPECT_NE(second.error().find("checkpoint-dir"), std::string::npos) << second.error();
    first.stop();
  }
  {
    TrainerEngine again(c);  // released normally: no warning
    ASSERT_TRUE(again.start()) << again.error();
    EXPECT_TRUE(warnings(again, "lock").empty()) << joined(warnings(again, "lock"));
    again.stop();
  }
  vttest::write_file(dir.file(".lock"), "host elsewhere, pid 999999, since 1 (unix time)\n");  // died holding it
  TrainerEngine after(c);
  ASSERT_TRUE(after.start()) << after.error();
  const auto w = warnings(after, "lock");
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_NE(w[0].find("pid 999999"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("taken over"), std::string::npos) << w[0];
  after.stop();
}

// A trainer.json whose data position no run could have written (checksums recomputed) is skipped
// like a damaged checkpoint, for the previous one (issue 38 item 12: clip -5 or 1e9 made the source
// plan epoch after epoch, an epoch of 99999999999 wrapped).
TEST(TrainerEngine, ResumeSkipsACheckpointWhosePositionIsOutOfRange) {
  const std::pair<const char *, nlohmann::json> forged[] = {
      {"negative clip", {{"rank", 0}, {"epoch", 0}, {"clip", -5}}},
      {"clip no step reaches", {{"rank", 0}, {"epoch", 0}, {"clip", 1000000000}}},
      {"epoch past 2^32", {{"rank", 0}, {"epoch", 99999999999LL}, {"clip", 1}}},
      {"another rank", {{"rank", 3}, {"epoch", 0}, {"clip", 1}}},
  };
  for (const auto &[what, pos] : forged) {
    SCOPED_TRACE(what);
    vttest::TempDir dir;
    write_two_checkpoints(dir.path());
    if (HasFatalFailure()) return;
    auto state = nlohmann::json::parse(vttest::read_file(dir.file("step-00000004/trainer.json")));
    state["positions"] = nlohmann::json::array({pos});
    vttest::write_file(dir.file("step-00000004/trainer.json"), state.dump(2) + "\n");
    reseal(dir.file("step-00000004"));
    ASSERT_TRUE(verifies(dir.file("step-00000004")));
    TrainerEngine e(resume_config(dir.path()));
    ASSERT_TRUE(e.start()) << e.error();
    EXPECT_EQ(e.resume_point().step, 2u);
    const auto w = warnings(e);
    ASSERT_EQ(w.size(), 1u) << joined(w);
    EXPECT_NE(w[0].find("position"), std::string::npos) << w[0];
    e.stop();
  }
}

TEST(TrainerEngine, ResumeFailsWhenNoCheckpointVerifies) {
  vttest::TempDir dir;
  write_two_checkpoints(dir.path());
  ASSERT_FALSE(HasFatalFailure());
  vttest::nan_into_safetensors(dir.file("step-00000002/model.safetensors"));
  vttest::nan_into_safetensors(dir.file("step-00000004/model.safetensors"));
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = dir.path();
  c.resume = true;
  TrainerEngine e(c);
  EXPECT_FALSE(e.start());
  EXPECT_NE(e.error().find("none of the 2 checkpoint folders"), std::string::npos) << e.error();
  EXPECT_EQ(warnings(e).size(), 2u);
  EXPECT_TRUE(fs::exists(dir.file("step-00000002/model.safetensors"))) << "nothing is deleted";
}

TEST(TrainerEngine, NonFiniteWeightsAreNeverWrittenAndTheLastGoodCheckpointStays) {
  vttest::TempDir dir;
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = dir.path();
  c.checkpoint_every = 1;
  c.keep_checkpoints = 0;
  {
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    train(e, 0, 2, 1, 2);
  }
  ASSERT_TRUE(verifies(dir.file("step-00000002")));
  c.keep_checkpoints = 1;
  // A second run into the same folder whose first update makes weights NaN with a finite
  // loss: AdamW with eps=0 divides 0 by 0 for the caption rows no caption used.
  c.eps = 0;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  ASSERT_EQ(e.process_tensor(at::stack({sample(0, 0), sample(0, 1)}), info_for(0, 0, 1, 2)), ProcessResult::kError);
  EXPECT_NE(e.error().find("NaN/Inf at step 1"), std::string::npos) << e.error();
  EXPECT_TRUE(verifies(dir.file("step-00000001"))) << "the first run's step 1 must not be replaced";
  EXPECT_TRUE(verifies(dir.file("step-00000002"))) << "keep-checkpoints=1 must not delete the last good one";
  e.take_messages();
  e.stop();  // no rescue checkpoint of NaN weights either
  const auto w = warnings(e);
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_NE(w[0].find("steps 1 to 1 are not in a checkpoint (none was written); no rescue checkpoint: the weights "
                      "hold NaN/Inf"),
            std::string::npos)
      << w[0];
  EXPECT_TRUE(verifies(dir.file("step-00000001")));
}

TEST(TrainerEngine, MaxSkippedStepsInARowIsAnError) {
  auto c = cpu_config("builtin:linear-test");
  c.max_skipped_steps = 3;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  train(e, 0, 1, 1, 2);
  nan_batch(e, 1, ProcessResult::kOk);
  nan_batch(e, 2, ProcessResult::kOk);
  train(e, 3, 1, 1, 2);  // a good step starts the count again
  nan_batch(e, 4, ProcessResult::kOk);
  nan_batch(e, 5, ProcessResult::kOk);
  nan_batch(e, 6, ProcessResult::kError);
  EXPECT_NE(e.error().find("3 optimizer steps in a row (5 to 7)"), std::string::npos) << e.error();
  EXPECT_NE(e.error().find("max-skipped-steps=3"), std::string::npos) << e.error();
}

TEST(TrainerEngine, ARunThatSkippedEveryStepFails) {
  {
    auto c = cpu_config("builtin:linear-test");
    c.max_skipped_steps = 0;  // unbounded: the end of stream still fails
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    for (uint64_t s = 0; s < 12; s++) nan_batch(e, s, ProcessResult::kOk);
    EXPECT_FALSE(e.finish());
    EXPECT_NE(e.error().find("all 12 optimizer steps of this run"), std::string::npos) << e.error();
  }
  {
    vttest::TempDir dir;
    auto c = cpu_config("builtin:linear-test");
    c.checkpoint_dir = dir.path();
    c.max_steps = 2;
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    nan_batch(e, 0, ProcessResult::kOk);
    nan_batch(e, 1, ProcessResult::kError);  // max-steps reached with nothing trained
    EXPECT_NE(e.error().find("all 2 optimizer steps"), std::string::npos) << e.error();
    EXPECT_FALSE(fs::exists(dir.file("step-00000002")));
  }
  {
    auto c = cpu_config("builtin:linear-test");  // one skipped step among good ones is fine
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    nan_batch(e, 0, ProcessResult::kOk);
    train(e, 1, 1, 1, 2);
    EXPECT_TRUE(e.finish()) << e.error();
  }
}

TEST(TrainerEngine, AnUnwritableCheckpointDirFailsAtStart) {
  vttest::TempDir dir;
  vttest::write_file(dir.file("a-file"), "");
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = dir.file("a-file/ckpt");  // root ignores modes, not a file in the path
  TrainerEngine e(c);
  EXPECT_FALSE(e.start());
  EXPECT_NE(e.error().find("'" + c.checkpoint_dir + "'"), std::string::npos) << e.error();
  EXPECT_NE(e.error().find("Not a directory"), std::string::npos) << e.error();
  EXPECT_NE(e.error().find("checkpoint-dir"), std::string::npos) << e.error();
}

TEST(TrainerEngine, MetricsFileFolderIsCreated) {
  vttest::TempDir dir;
  auto c = cpu_config("builtin:linear-test");
  c.log_every = 1;
  c.metrics_file = dir.file("runs/today/metrics.jsonl");
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  train(e, 0, 2, 1, 2);
  EXPECT_EQ(warnings(e, "metrics-file"), std::vector<std::string>{});
  std::istringstream lines(vttest::read_file(c.metrics_file));
  int steps = 0;
  for (std::string l; std::getline(lines, l);) steps += l.find("\"type\":\"step\"") != std::string::npos;
  EXPECT_EQ(steps, 2);
}

TEST(TrainerEngine, CheckpointIntervalWritesByTheClock) {
  vttest::TempDir dir;
  double now = 1000;
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = dir.path();
  c.checkpoint_interval_s = 60;
  c.keep_checkpoints = 0;
  c.clock = [&now] { return now; };
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  std::vector<int64_t> written;
  for (double t : {1000.0, 1059.0, 1061.0, 1100.0, 1121.0, 1122.0}) {
    now = t;
    train(e, e.steps_done(), 1, 1, 2);
    for (auto &m : e.take_messages())
      if (m.name == "ddptrainsink-checkpoint") written.push_back(m.ints["step"]);
  }
  EXPECT_EQ(written, (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(verifies(dir.file("step-00000003")));
  EXPECT_TRUE(verifies(dir.file("step-00000005")));
}

TEST(TrainerEngine, StoppingWithoutEndOfStreamWritesARescueCheckpointThatResumes) {
  // No checkpoint-every, no checkpoint-interval: only the final checkpoint would be
  // written, and a stop without end of stream (Ctrl-C to gst-launch-1.0 without -e)
  // never gets there.
  vttest::TempDir dir;
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = dir.path();
  c.checkpoint_every = 0;
  c.checkpoint_interval_s = 0;
  std::map<std::string, std::vector<float>> at3;
  {
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    train(e, 0, 3, 1, 2);
    at3 = e.parameters_cpu(true);
    // Half of step 4 (2 micro-batches): dropped, and the weights are still step 3's.
    ASSERT_EQ(e.process_tensor(at::stack({sample(3, 0), sample(3, 1)}), info_for(3, 0, 2, 2)), ProcessResult::kOk);
    e.take_messages();
    EXPECT_FALSE(fs::exists(dir.file("step-00000003")));
    e.stop();
    std::vector<int64_t> rescued;
    std::vector<std::string> w;
    for (auto &m : e.take_messages()) {
      if (m.name == "ddptrainsink-checkpoint" && m.ints["rescue"] == 1) rescued.push_back(m.ints["step"]);
      if (m.name == "warning") w.push_back(m.strings["text"]);
    }
    EXPECT_EQ(rescued, (std::vector<int64_t>{3}));
    const std::string all = joined(w);
    EXPECT_NE(all.find("wrote a rescue checkpoint of step 3 to " + dir.file("step-00000003")), std::string::npos)
        << all;
    EXPECT_NE(all.find("stopped in the middle of step 4"), std::string::npos) << all;
    EXPECT_EQ(all.find("not in a checkpoint"), std::string::npos) << all;
  }
  ASSERT_TRUE(verifies(dir.file("step-00000003")));
  c.resume = true;
  TrainerEngine r(c);
  ASSERT_TRUE(r.start()) << r.error();
  EXPECT_TRUE(r.resumed());
  EXPECT_EQ(r.steps_done(), 3u);
  EXPECT_EQ(r.parameters_cpu(true), at3);
  EXPECT_EQ(r.resume_point().clip, 6u) << "the position after step 3, not after the dropped half of step 4";
}

TEST(TrainerEngine, AnErrorAfterTheStepsAllReduceRescuesTheStepBeforeWithItsOwnPosition) {
  // nan-policy=fail throws after the loss/position all-reduce of step 3: the rescue
  // checkpoint holds step 2 with the data position after step 2, not after step 3.
  vttest::TempDir dir;
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = dir.path();
  c.checkpoint_interval_s = 0;
  c.nan_policy = "fail";
  std::map<std::string, std::vector<float>> at2;
  {
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    train(e, 0, 2, 1, 2);
    at2 = e.parameters_cpu(true);
    nan_batch(e, 2, ProcessResult::kError);
    const auto w = warnings(e, "rescue");
    ASSERT_EQ(w.size(), 1u) << joined(w);
    EXPECT_NE(w[0].find("wrote a rescue checkpoint of step 2 to " + dir.file("step-00000002") +
                        " (the run failed in step 3;"),
              std::string::npos)
        << w[0];
  }
  c.resume = true;
  TrainerEngine r(c);
  ASSERT_TRUE(r.start()) << r.error();
  EXPECT_EQ(r.steps_done(), 2u);
  EXPECT_EQ(r.parameters_cpu(true), at2);
  EXPECT_EQ(r.resume_point().clip, 4u);
}

TEST(TrainerEngine, StoppingWithoutEndOfStreamSaysWhatIsNotSavedWhenNoRescueIsWritten) {
  vttest::TempDir dir;
  write_two_checkpoints(dir.path());  // steps 2 and 4 of an earlier run
  auto c = cpu_config("builtin:linear-test");
  c.checkpoint_dir = dir.path();
  c.checkpoint_interval_s = 0;
  c.keep_checkpoints = 0;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  train(e, 0, 3, 1, 2);  // resume=false: a new run, behind the folder's step 4
  e.take_messages();
  e.stop();
  const auto w = warnings(e);
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_NE(w[0].find("steps 1 to 3 are not in a checkpoint (none was written); no rescue checkpoint: "
                      "checkpoint-dir already holds '" + dir.file("step-00000004") + "'"),
            std::string::npos)
      << w[0];
  EXPECT_FALSE(fs::exists(dir.file("step-00000003")));
}

TEST(TrainerEngine, ALegacyCheckpointWithoutManifestResumesWithAWarning) {
  vttest::TempDir dir;
  write_two_checkpoints(dir.path());
  ASSERT_FALSE(HasFatalFailure());
  make_legacy(dir.file("step-00000004"));
  ASSERT_FALSE(HasFatalFailure());
  std::map<std::string, std::vector<float>> saved;
  {
    TrainerEngine e(resume_config(dir.path()));
    ASSERT_TRUE(e.start()) << e.error();
    ASSERT_TRUE(e.resumed());
    EXPECT_EQ(e.resume_point().step, 4u) << "the newest usable checkpoint, legacy or not";
    const auto w = warnings(e);
    ASSERT_EQ(w.size(), 1u) << joined(w);
    EXPECT_NE(w[0].find(dir.file("step-00000004")), std::string::npos) << w[0];
    EXPECT_NE(w[0].find("cannot be verified"), std::string::npos) << w[0];
    saved = e.parameters_cpu();
  }
  // The weights are those of step 4: a second resume from a verified copy of them agrees.
  fs::rename(dir.file("step-00000004"), dir.file("legacy-4"));
  {
    TrainerEngine e(resume_config(dir.path()));
    ASSERT_TRUE(e.start()) << e.error();
    EXPECT_EQ(e.resume_point().step, 2u);
    EXPECT_GT(max_rel_diff(saved, e.parameters_cpu()), 0.0) << "step 2's weights differ from step 4's";
  }
  // A legacy folder that lost a file, or whose trainer.json is gone, is passed over.
  fs::rename(dir.file("legacy-4"), dir.file("step-00000004"));
  make_legacy(dir.file("step-00000002"));
  fs::remove(dir.file("step-00000004/optimizer.pt"));
  TrainerEngine e(resume_config(dir.path()));
  ASSERT_TRUE(e.start()) << e.error();
  EXPECT_EQ(e.resume_point().step, 2u);
  const auto w = warnings(e);
  ASSERT_EQ(w.size(), 2u) << joined(w);
  EXPECT_NE(w[0].find("skipping checkpoint '" + dir.file("step-00000004") + "'"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("optimizer.pt"), std::string::npos) << w[0];
  EXPECT_NE(w[1].find("cannot be verified"), std::string::npos) << w[1];
}

TEST(TrainerEngine, ACheckpointWithNonFiniteWeightsIsSkippedLegacyOrVerified) {
  for (const bool legacy : {true, false}) {
    SCOPED_TRACE(legacy ? "legacy" : "verified (manifest rewritten after the NaN)");
    vttest::TempDir dir;
    write_two_checkpoints(dir.path());
    ASSERT_FALSE(HasFatalFailure());
    vttest::nan_into_safetensors(dir.file("step-00000004/model.safetensors"));  // length unchanged
    if (legacy) {
      make_legacy(dir.file("step-00000004"));
      make_legacy(dir.file("step-00000002"));
    } else {
      reseal(dir.file("step-00000004"));
      ASSERT_TRUE(verifies(dir.file("step-00000004")));
    }
    ASSERT_FALSE(HasFatalFailure());
    TrainerEngine e(resume_config(dir.path()));
    ASSERT_TRUE(e.start()) << e.error();
    ASSERT_TRUE(e.resumed());
    EXPECT_EQ(e.resume_point().step, 2u);
    const auto w = warnings(e);
    ASSERT_EQ(w.size(), legacy ? 2u : 1u) << joined(w);
    EXPECT_NE(w[0].find("skipping checkpoint '" + dir.file("step-00000004") + "'"), std::string::npos) << w[0];
    EXPECT_NE(w[0].find("weights hold NaN/Inf (first: "), std::string::npos) << w[0];
    if (legacy) {
      EXPECT_NE(w[1].find(dir.file("step-00000002") + "' has no manifest.json"), std::string::npos) << w[1];
    }
    for (const auto &[name, v] : e.parameters_cpu())
      for (float x : v) ASSERT_TRUE(std::isfinite(x)) << name;
    train(e, 2, 2, 1, 2);  // trains on from step 2 and replaces the bad step 4
    ASSERT_FALSE(HasFailure());
    EXPECT_TRUE(verifies(dir.file("step-00000004")));
  }
  // Nothing finite left: start fails, naming the folders in its warnings.
  vttest::TempDir dir;
  write_two_checkpoints(dir.path());
  ASSERT_FALSE(HasFatalFailure());
  for (const char *d : {"step-00000002", "step-00000004"}) {
    vttest::nan_into_safetensors(dir.file(std::string(d) + "/model.safetensors"));
    make_legacy(dir.file(d));
  }
  TrainerEngine e(resume_config(dir.path()));
  EXPECT_FALSE(e.start());
  EXPECT_NE(e.error().find("none of the 2 checkpoint folders"), std::string::npos) << e.error();
  EXPECT_EQ(warnings(e, "NaN/Inf").size(), 2u);
}

TEST(TrainerEngine, ACheckpointWithNonFiniteOptimizerStateIsSkipped) {
  vttest::TempDir dir;
  write_two_checkpoints(dir.path());
  ASSERT_FALSE(HasFatalFailure());
  // optimizer.pt is a zip archive with its tensors stored uncompressed: a NaN at the start
  // of the largest one's data (a moment of the largest parameter; length unchanged).
  vttest::write_file(dir.file("nan_tensors.py"), R"(
import struct, sys, zipfile
path = sys.argv[1]
i = max((i for i in zipfile.ZipFile(path).infolist() if '/data/' in i.filename), key=lambda i: i.file_size)
assert i.compress_type == zipfile.ZIP_STORED and i.file_size >= 4
with open(path, 'r+b') as f:
    f.seek(i.header_offset + 26)
    name_len, extra_len = struct.unpack('<HH', f.read(4))
    f.seek(i.header_offset + 30 + name_len + extra_len)
    f.write(struct.pack('<f', float('nan')))
)");
  const std::string py = vttest::env_or("PYTHON", "/usr/bin/python3");
  ASSERT_EQ(std::system((py + " " + dir.file("nan_tensors.py") + " " + dir.file("step-00000004/optimizer.pt")).c_str()),
            0);
  reseal(dir.file("step-00000004"));
  TrainerEngine e(resume_config(dir.path()));
  ASSERT_TRUE(e.start()) << e.error();
  EXPECT_EQ(e.resume_point().step, 2u);
  const auto w = warnings(e);
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_NE(w[0].find("optimizer state holds NaN/Inf (first: exp_avg"), std::string::npos) << w[0];
}

namespace {

// A TorchScript model whose loss stays finite while conv.weight's gradient is +Inf for a
// micro-batch whose first value is above 1000: sqrt(w - w.detach()) is 0 forward and
// has an infinite derivative at 0.
std::string make_inf_grad_model(const vttest::TempDir &dir) {
  return vttest::script_model(dir, "inf_grad", R"(
import sys, torch
from typing import List
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(4, 4, 1)
    @torch.jit.export
    def training_step(self, latents: torch.Tensor, captions: List[str]) -> torch.Tensor:
        loss = ((self.conv(latents) - latents.flip(1)) ** 2).mean()
        if bool(latents[0, 0, 0, 0, 0] > 1000.0):
            w = self.conv.weight
            loss = loss + torch.sqrt(w - w.detach()).sum()
        return loss
    def forward(self, x):
        return self.conv(x)
torch.jit.script(M()).save(sys.argv[1])
)");
}

at::Tensor inf_grad_batch(uint64_t step) {
  auto b = at::stack({sample(step, 0), sample(step, 1)});
  b[0][0][0][0][0] = 5000.0f;
  return b;
}

}  // namespace

TEST(TrainerEngine, NonFiniteGradientsWithAFiniteLossAreNotApplied) {
  vttest::TempDir dir;
  const std::string model = make_inf_grad_model(dir);
  ASSERT_FALSE(HasFailure());
  for (const double clip : {0.0, 1.0}) {
    SCOPED_TRACE(clip > 0 ? "grad-clip=1 (its total norm decides)" : "no grad-clip");
    auto c = cpu_config(model);
    c.grad_clip = clip;
    c.max_skipped_steps = 2;
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    std::vector<StepReport> reports;
    e.add_step_callback([&](const StepReport &r) {
      if (!r.model_built && !r.finished) reports.push_back(r);
    });
    train(e, 0, 1, 1, 2);
    const auto before = e.parameters_cpu();
    ASSERT_EQ(e.process_tensor(inf_grad_batch(1), info_for(1, 0, 1, 2)), ProcessResult::kOk) << e.error();
    EXPECT_EQ(e.steps_done(), 2u);
    EXPECT_TRUE(std::isfinite(e.last_loss())) << "the loss itself is finite";
    ASSERT_EQ(reports.size(), 2u);
    EXPECT_FALSE(reports[0].skipped);
    EXPECT_TRUE(reports[1].skipped) << "the step counts as skipped";
    EXPECT_EQ(max_rel_diff(before, e.parameters_cpu()), 0.0) << "weights unchanged";
    const auto w = warnings(e, "non-finite gradient");
    ASSERT_EQ(w.size(), 1u) << joined(w);
    EXPECT_NE(w[0].find(clip > 0 ? "gradient norm (inf)" : "(first: conv.weight)"), std::string::npos) << w[0];
    EXPECT_NE(w[0].find("optimizer step skipped"), std::string::npos) << w[0];
    // A good step afterwards trains; then two in a row reach max-skipped-steps=2.
    train(e, 2, 1, 1, 2);
    EXPECT_GT(max_rel_diff(before, e.parameters_cpu()), 0.0);
    for (const auto &[name, v] : e.parameters_cpu())
      for (float x : v) ASSERT_TRUE(std::isfinite(x)) << name;
    EXPECT_EQ(e.process_tensor(inf_grad_batch(3), info_for(3, 0, 1, 2)), ProcessResult::kOk) << e.error();
    EXPECT_EQ(e.process_tensor(inf_grad_batch(4), info_for(4, 0, 1, 2)), ProcessResult::kError);
    EXPECT_NE(e.error().find("2 optimizer steps in a row (4 to 5) had a non-finite loss or gradient"),
              std::string::npos)
        << e.error();
  }
  auto c = cpu_config(model);
  c.nan_policy = "fail";
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  train(e, 0, 1, 1, 2);
  const auto before = e.parameters_cpu();
  EXPECT_EQ(e.process_tensor(inf_grad_batch(1), info_for(1, 0, 1, 2)), ProcessResult::kError);
  EXPECT_NE(e.error().find("non-finite gradient (first: conv.weight)"), std::string::npos) << e.error();
  EXPECT_NE(e.error().find("nan-policy=fail"), std::string::npos) << e.error();
  EXPECT_EQ(max_rel_diff(before, e.parameters_cpu()), 0.0);
}
