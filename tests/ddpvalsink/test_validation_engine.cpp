/* ValidationEngine with a real TrainerEngine (one process, CPU): shard filter, padding,
 * deterministic loss per sample id, in-process combine of shards, snapshot slots. */
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <sstream>
#include <thread>

#include "test_util.h"
#include "valsink_test_util.h"

using namespace videotrain;
using namespace valtest;

namespace {

using R = ValidationEngine::Result;

ValidationConfig vconfig(unsigned index, unsigned shards, unsigned batch = 1) {
  ValidationConfig c;
  c.shard_index = index;
  c.num_shards = shards;
  c.every = 0;
  c.at_start = true;
  c.batch_size = batch;
  c.device = "cpu";
  return c;
}

// Feeds one epoch (and the first sample of the next, which ends the pass) to an engine
// whose trainer already finished: the pass of the at-start snapshot runs, then kEos.
R feed_epoch(ValidationEngine &e, const std::vector<ValSample> &epoch0) {
  for (const auto &s : epoch0) {
    R r = e.push(latent(s.sample_id), {s});
    if (r != R::kOk) return r;
  }
  ValSample next = epoch0.front();
  next.epoch++;
  return e.push(latent(next.sample_id), {next});
}

double loss_of(const ValidationEngine &e) { return e.last_loss(); }

// Trains 3 steps of 2 micro-batches alone, then again with a validation pass run between
// the two micro-batches of step 1 (the trainer seeds its generator once per step): the
// losses and weights must be the same, and the pass's result that of the same weights
// validated on their own.
void expect_validation_leaves_training_alone(const std::string &model) {
  auto micro = [](TrainerEngine &t, int s, unsigned k) {
    BatchInfo info;
    info.micro_index = k;
    info.micro_count = 2;
    info.step_samples = 4;
    info.sync = k == 1;
    info.captions = {"x", "y"};
    return t.process_tensor(at::stack({latent(4 * s + 2 * k), latent(4 * s + 2 * k + 1)}), info);
  };
  TrainerEngine alone(trainer_config(model));
  ASSERT_TRUE(alone.start()) << alone.error();
  std::vector<double> losses;
  for (int s = 0; s < 3; s++) {
    ASSERT_EQ(micro(alone, s, 0), ProcessResult::kOk) << alone.error();
    ASSERT_EQ(micro(alone, s, 1), ProcessResult::kOk) << alone.error();
    losses.push_back(alone.last_loss());
  }
  double step0 = 0;
  {
    TrainerEngine fresh(trainer_config(model));
    ASSERT_TRUE(fresh.start()) << fresh.error();
    auto t = borrowed(fresh);
    ValidationEngine e(vconfig(0, 1));
    ASSERT_TRUE(e.attach(t));
    e.trainer_finished();
    ASSERT_EQ(feed_epoch(e, rank_samples(3, 0, 1, 0)), R::kEos) << e.error();
    step0 = e.last_loss();
  }

  TrainerEngine trainer(trainer_config(model));
  ASSERT_TRUE(trainer.start()) << trainer.error();
  auto t = borrowed(trainer);
  ValidationEngine e(vconfig(0, 1));  // at-start, nothing else until the trainer's end
  ASSERT_TRUE(e.attach(t));
  for (int s = 0; s < 3; s++) {
    ASSERT_EQ(micro(trainer, s, 0), ProcessResult::kOk) << trainer.error();
    if (s == 0) {
      for (auto &v : rank_samples(3, 0, 1, 0)) ASSERT_EQ(e.push(latent(v.sample_id), {v}), R::kOk) << e.error();
    }
    ASSERT_EQ(micro(trainer, s, 1), ProcessResult::kOk) << trainer.error();
    EXPECT_DOUBLE_EQ(trainer.last_loss(), losses[s]) << "step " << s + 1;
  }
  EXPECT_TRUE(trainer.parameters_cpu() == alone.parameters_cpu());
  // The next epoch ends the pass of step 0 and is the final validation's (step 3).
  trainer.finish();
  ASSERT_EQ(feed_epoch(e, rank_samples(3, 0, 1, 1)), R::kEos) << e.error();
  std::map<int64_t, double> results;
  for (auto &m : e.take_messages())
    if (m.name == "ddpvalsink-result") results[m.ints["step"]] = m.numbers["loss"];
  ASSERT_TRUE(results.count(0));
  EXPECT_NEAR(results[0], step0, 1e-6 * std::abs(step0));
}


}  // namespace

TEST(ValidationEngine, TwoShardsGiveTheSameLossAsOneAndCountEachSampleOnce) {
  TrainerEngine trainer(trainer_config());
  ASSERT_TRUE(trainer.start()) << trainer.error();
  auto t = borrowed(trainer);
  // 7 samples over a "rank" of world 2: rank 0 gets 4 clips, rank 1 gets 3 + 1 padding.
  auto samples = rank_samples(7, 1, 2, 0);
  ASSERT_TRUE(samples.back().padding);
  double one = 0;
  {
    ValidationEngine e(vconfig(0, 1));
    ASSERT_TRUE(e.attach(t)) << e.error();
    e.trainer_finished();  // nothing after the at-start snapshot
    EXPECT_EQ(feed_epoch(e, samples), R::kEos) << e.error();
    EXPECT_EQ(e.passes_done(), 1u);
    EXPECT_EQ(e.evaluated_samples(), 3u) << "padding is not evaluated";
    one = loss_of(e);
    auto msgs = e.take_messages();
    bool got = false;
    for (auto &m : msgs)
      if (m.name == "ddpvalsink-result") {
        got = true;
        EXPECT_EQ(m.ints["samples"], 3);
        EXPECT_EQ(m.ints["step"], 0);
        EXPECT_DOUBLE_EQ(m.numbers["loss"], one);
      }
    EXPECT_TRUE(got);
  }
  ASSERT_TRUE(std::isfinite(one));
  ValidationEngine a(vconfig(0, 2)), b(vconfig(1, 2, 2));
  ASSERT_TRUE(a.attach(t)) << a.error();
  ASSERT_TRUE(b.attach(t)) << b.error();
  a.trainer_finished();
  EXPECT_EQ(feed_epoch(a, samples), R::kEos) << a.error();
  EXPECT_EQ(feed_epoch(b, samples), R::kEos) << b.error();
  EXPECT_EQ(a.evaluated_samples() + b.evaluated_samples(), 3u);
  EXPECT_EQ(a.evaluated_samples(), 2u);  // clips 0, 2 (clip 3 is padding... of shard 1)
  EXPECT_NEAR(loss_of(b), one, 1e-6 * std::abs(one));
  // Exactly one shard (the last to finish) posts the result.
  int results = 0;
  for (auto *e : {&a, &b})
    for (auto &m : e->take_messages()) results += m.name == "ddpvalsink-result";
  EXPECT_EQ(results, 1);
}

TEST(ValidationEngine, TheSameWeightsAlwaysGiveTheSameNumberWhateverTheBatching) {
  TrainerEngine trainer(trainer_config());
  ASSERT_TRUE(trainer.start()) << trainer.error();
  auto t = borrowed(trainer);
  auto samples = rank_samples(6, 0, 1, 3);
  double first = 0;
  for (unsigned batch : {1u, 4u, 6u}) {
    ValidationEngine e(vconfig(0, 1, batch));
    ASSERT_TRUE(e.attach(t));
    e.trainer_finished();
    ASSERT_EQ(feed_epoch(e, samples), R::kEos) << e.error();
    if (batch == 1)
      first = e.last_loss();
    else
      EXPECT_NEAR(e.last_loss(), first, 1e-6 * std::abs(first)) << "batch " << batch;
  }
  // The training generator in between does not change it.
  at::manual_seed(12345);
  (void)at::randn({100});
  ValidationEngine e(vconfig(0, 1));
  ASSERT_TRUE(e.attach(t));
  e.trainer_finished();
  ASSERT_EQ(feed_epoch(e, samples), R::kEos);
  EXPECT_NEAR(e.last_loss(), first, 1e-6 * std::abs(first));
}

TEST(ValidationEngine, StepsTriggerPassesAndANewerSnapshotWaitsInItsSlot) {
  TrainerEngine trainer(trainer_config("builtin:linear-test"));
  ASSERT_TRUE(trainer.start()) << trainer.error();
  auto t = borrowed(trainer);
  auto cfg = vconfig(0, 1);
  cfg.at_start = false;
  cfg.every = 2;
  ValidationEngine e(cfg);
  ASSERT_TRUE(e.attach(t));
  auto step = [&](int s) {
    BatchInfo info;
    info.captions = {"x", "y"};
    ASSERT_EQ(trainer.process_tensor(at::stack({latent(s), latent(s + 50)}), info), ProcessResult::kOk)
        << trainer.error();
  };
  step(0);
  step(1);  // step 2: its snapshot waits in the slot
  // A validation thread: epochs 0, 1, 2 of 3 samples (each epoch is a pass), then the
  // first sample of epoch 3, which ends the last pass and finds nothing more (EOS).
  std::thread val([&] {
    for (unsigned ep = 0; ep < 4; ep++)
      for (auto &s : rank_samples(3, 0, 1, ep))
        if (e.push(latent(s.sample_id), {s}) != R::kOk) return;
  });
  for (int s = 2; s < 6; s++) step(s);  // step 6 waits until the pass of step 4 took its slot
  trainer.finish();
  e.trainer_finished();  // step 6 was dispatched already: nothing more
  val.join();
  EXPECT_EQ(e.last_step(), 6u);
  std::vector<int64_t> steps;
  for (auto &m : e.take_messages())
    if (m.name == "ddpvalsink-result") steps.push_back(m.ints["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 6}));
}

TEST(ValidationEngine, ASlowButBusyValidationMakesTrainingWaitNotFail) {
  // Each pass takes longer than the timeout; only shards that make no progress for that
  // long are an error, so training waits (once warned) and every step gets validated.
  TrainerEngine trainer(trainer_config("builtin:linear-test"));
  ASSERT_TRUE(trainer.start()) << trainer.error();
  auto t = borrowed(trainer);
  auto cfg = vconfig(0, 1);
  cfg.at_start = false;
  cfg.every = 1;
  cfg.timeout_s = 0.4;
  ValidationEngine e(cfg);
  ASSERT_TRUE(e.attach(t));
  std::thread val([&] {
    for (unsigned ep = 0; ep < 4; ep++)
      for (auto &s : rank_samples(3, 0, 1, ep)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        if (e.push(latent(s.sample_id), {s}) != R::kOk) return;
      }
  });
  BatchInfo info;
  info.captions = {"x", "y"};
  for (int s = 0; s < 3; s++)
    ASSERT_EQ(trainer.process_tensor(at::stack({latent(s), latent(s + 50)}), info), ProcessResult::kOk)
        << "step " << s + 1 << ": " << trainer.error();
  trainer.finish();
  val.join();
  EXPECT_EQ(e.last_step(), 3u) << e.error();
  int waits = 0;
  std::vector<int64_t> steps;
  for (auto &m : e.take_messages()) {
    if (m.name == "ddpvalsink-result") steps.push_back(m.ints["step"]);
    if (m.name == "warning" && m.strings["text"].find("training waits") != std::string::npos) waits++;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(waits, 1);
}

TEST(ValidationEngine, AModelWithoutValidationStepLeavesTheTrainersNoiseAlone) {
  // The fallback seeds torch's default generator per sample.
  vttest::TempDir dir;
  const std::string model = vttest::make_script_model(dir);
  ASSERT_FALSE(model.empty());
  expect_validation_leaves_training_alone(model);
}

TEST(ValidationEngine, BuildingTheValidationModelLeavesTheTrainersNoiseAlone) {
  // A builtin model's initial weights come from torch's default generator.
  expect_validation_leaves_training_alone("builtin:tiny-unet3d");
}

TEST(ValidationEngine, ResultsGoToTheTrainersMetricsFileAndEventsFile) {
  // TensorBoard polls only the newest events file of a run directory: validation must
  // not open a second one beside the trainer's.
  vttest::TempDir dir;
  auto tc = trainer_config("builtin:linear-test");
  tc.metrics_file = dir.file("metrics.jsonl");
  tc.tensorboard_dir = dir.file("tb");
  TrainerEngine trainer(tc);
  ASSERT_TRUE(trainer.start()) << trainer.error();
  auto t = borrowed(trainer);
  ValidationEngine e(vconfig(0, 1));
  ASSERT_TRUE(e.attach(t));
  for (auto &v : rank_samples(3, 0, 1, 0)) ASSERT_EQ(e.push(latent(v.sample_id), {v}), R::kOk) << e.error();
  BatchInfo info;
  info.captions = {"x", "y"};
  ASSERT_EQ(trainer.process_tensor(at::stack({latent(0), latent(1)}), info), ProcessResult::kOk) << trainer.error();
  trainer.finish();
  // Epoch 1 ends the at-start pass and is the final validation's (step 1).
  ASSERT_EQ(feed_epoch(e, rank_samples(3, 0, 1, 1)), R::kEos) << e.error();
  trainer.stop();
  std::vector<std::string> events;
  for (const auto &f : std::filesystem::directory_iterator(tc.tensorboard_dir)) events.push_back(f.path());
  ASSERT_EQ(events.size(), 1u);
  const std::string bytes = vttest::read_file(events[0]);
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
  EXPECT_NE(bytes.find("val/loss"), std::string::npos);
  std::istringstream metrics(vttest::read_file(tc.metrics_file));
  std::vector<std::string> records;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    records.push_back(j.at("type").get<std::string>() + " " + std::to_string(j.at("step").get<int>()));
  }
  EXPECT_EQ(records, (std::vector<std::string>{"step 1", "validation 0", "validation 1"}));
}

TEST(ValidationEngine, EpochEndEventsCloseAPassAndAMidEpochEosDropsIt) {
  TrainerEngine trainer(trainer_config("builtin:linear-test"));
  ASSERT_TRUE(trainer.start()) << trainer.error();
  auto t = borrowed(trainer);
  auto cfg = vconfig(0, 1);
  cfg.every = 1;
  ValidationEngine e(cfg);
  ASSERT_TRUE(e.attach(t));
  for (auto &v : rank_samples(3, 0, 1, 0)) ASSERT_EQ(e.push(latent(v.sample_id), {v}), R::kOk) << e.error();
  ASSERT_EQ(e.end_of_epoch(0), R::kOk) << e.error();
  EXPECT_EQ(e.passes_done(), 1u) << "the event ends the pass; no need to wait for the next epoch";
  EXPECT_EQ(e.last_step(), 0u);
  BatchInfo info;
  info.captions = {"x", "y"};
  ASSERT_EQ(trainer.process_tensor(at::stack({latent(0), latent(1)}), info), ProcessResult::kOk) << trainer.error();
  auto ep1 = rank_samples(3, 0, 1, 1);
  ASSERT_EQ(e.push(latent(ep1[0].sample_id), {ep1[0]}), R::kOk) << e.error();
  ASSERT_EQ(e.push(latent(ep1[1].sample_id), {ep1[1]}), R::kOk) << e.error();
  // A stop (EOS sent to the pipeline) in the middle of the pass of step 1: the partial pass is
  // dropped with a message, and the shard's EOS waits for the trainer's end, not an error.
  std::atomic<int> eos{-1};
  std::thread val([&] { eos = static_cast<int>(e.end_of_stream()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the shard has ended
  // The trainer drains what was queued before its own EOS: its due step 2 does not wait for
  // the ended shard.
  ASSERT_EQ(trainer.process_tensor(at::stack({latent(2), latent(0)}), info), ProcessResult::kOk) << trainer.error();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(eos.load(), -1) << "the shard's EOS returned before the trainer ended";
  ASSERT_TRUE(trainer.finish()) << trainer.error();
  val.join();
  EXPECT_EQ(eos.load(), static_cast<int>(R::kOk)) << e.error();
  EXPECT_EQ(e.passes_done(), 1u) << "a partial pass is not reported";
  std::vector<std::string> skipped;
  for (auto &m : e.take_messages()) {
    if (m.name == "ddpvalsink-result") {
      EXPECT_EQ(m.ints.at("step"), 0) << "a partial pass reported";
    }
    if (m.name == "ddpvalsink-skipped") skipped.push_back(m.strings["text"]);
  }
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find("validation of step 1 dropped: the validation source ended (EOS) in the middle of epoch 1"),
            std::string::npos)
      << skipped[0];
  EXPECT_NE(skipped[1].find("validation of step 2 skipped: the validation source of shard-index 0 has ended"),
            std::string::npos)
      << skipped[1];
}

TEST(ValidationEngine, AStopBetweenPassesDropsTheFinalValidation) {
  // EOS between two passes (the last one done), then the trainer's end: its final snapshot
  // finds the shard ended and is skipped with a message; the shard's EOS is no error.
  TrainerEngine trainer(trainer_config("builtin:linear-test"));
  ASSERT_TRUE(trainer.start()) << trainer.error();
  auto t = borrowed(trainer);
  auto cfg = vconfig(0, 1);
  cfg.every = 5;
  ValidationEngine e(cfg);
  ASSERT_TRUE(e.attach(t));
  for (auto &v : rank_samples(3, 0, 1, 0)) ASSERT_EQ(e.push(latent(v.sample_id), {v}), R::kOk) << e.error();
  ASSERT_EQ(e.end_of_epoch(0), R::kOk) << e.error();
  ASSERT_EQ(e.passes_done(), 1u);
  BatchInfo info;
  info.captions = {"x", "y"};
  ASSERT_EQ(trainer.process_tensor(at::stack({latent(0), latent(1)}), info), ProcessResult::kOk) << trainer.error();
  std::atomic<int> eos{-1};
  std::thread val([&] { eos = static_cast<int>(e.end_of_stream()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the shard has ended
  ASSERT_TRUE(trainer.finish()) << trainer.error();
  val.join();
  EXPECT_EQ(eos.load(), static_cast<int>(R::kOk)) << e.error();
  std::string texts;
  for (auto &m : e.take_messages())
    if (m.name == "ddpvalsink-skipped") texts += m.strings["text"] + "\n";
  EXPECT_NE(texts.find("the final validation of step 1 skipped: the validation source of shard-index 0 has ended"),
            std::string::npos)
      << texts;
}

TEST(ValidationEngine, AtStartWaitsForABuiltinModelBuiltAtTheFirstMicroBatch) {
  // No latent-channels: the trainer builds its model when the first micro-batch shows
  // the channels. at-start validates those initial weights (step 0) all the same.
  auto tc = trainer_config("builtin:tiny-unet3d");
  tc.latent_channels = 0;
  TrainerEngine trainer(tc);
  ASSERT_TRUE(trainer.start()) << trainer.error();
  ASSERT_FALSE(trainer.has_model());
  auto t = borrowed(trainer);
  auto cfg = vconfig(0, 1);
  cfg.every = 2;
  ValidationEngine e(cfg);
  ASSERT_TRUE(e.attach(t));
  std::thread val([&] {
    for (unsigned ep = 0; ep < 3; ep++)
      for (auto &s : rank_samples(3, 0, 1, ep))
        if (e.push(latent(s.sample_id), {s}) != R::kOk) return;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(e.passes_done(), 0u) << "validated before the trainer had a model";
  BatchInfo info;
  info.captions = {"x", "y"};
  for (int s = 0; s < 2; s++)
    ASSERT_EQ(trainer.process_tensor(at::stack({latent(s), latent(s + 50)}), info), ProcessResult::kOk)
        << trainer.error();
  trainer.finish();
  e.trainer_finished();
  val.join();
  std::vector<int64_t> steps;
  for (auto &m : e.take_messages()) {
    if (m.name == "ddpvalsink-result") steps.push_back(m.ints["step"]);
    EXPECT_NE(m.name, "warning") << m.strings["text"];
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 2}));
}

TEST(ValidationEngine, SkipIfBusySkipsInsteadOfWaiting) {
  TrainerEngine trainer(trainer_config("builtin:linear-test"));
  ASSERT_TRUE(trainer.start()) << trainer.error();
  auto t = borrowed(trainer);
  auto cfg = vconfig(0, 1);
  cfg.at_start = false;
  cfg.every = 1;
  cfg.skip_if_busy = true;
  ValidationEngine e(cfg);
  ASSERT_TRUE(e.attach(t));
  BatchInfo info;
  info.captions = {"x"};
  for (int s = 0; s < 3; s++)
    ASSERT_EQ(trainer.process_tensor(latent(s).unsqueeze(0), info), ProcessResult::kOk);
  int skipped = 0;
  for (auto &m : e.take_messages()) skipped += m.name == "ddpvalsink-skipped";
  EXPECT_EQ(skipped, 2) << "step 1 pending, steps 2 and 3 skipped, the trainer never blocked";
}

TEST(ValidationEngine, BadShardIndexDuplicateShardsMismatchedSettingsAndBadDevicesAreErrors) {
  TrainerEngine trainer(trainer_config("builtin:linear-test"));
  ASSERT_TRUE(trainer.start());
  auto t = borrowed(trainer);
  ValidationEngine bad(vconfig(2, 2));
  EXPECT_FALSE(bad.attach(t));
  EXPECT_NE(bad.error().find("shard-index 2"), std::string::npos) << bad.error();
  ValidationEngine a(vconfig(0, 2)), b(vconfig(0, 2)), c(vconfig(1, 3));
  ASSERT_TRUE(a.attach(t));
  EXPECT_FALSE(b.attach(t));
  EXPECT_NE(b.error().find("two ddpvalsinks"), std::string::npos) << b.error();
  EXPECT_FALSE(c.attach(t));
  EXPECT_NE(c.error().find("num-shards"), std::string::npos) << c.error();
  auto other = vconfig(1, 2);
  other.every = 7;
  ValidationEngine d(other);
  EXPECT_FALSE(d.attach(t));
  EXPECT_NE(d.error().find("every/at-start/skip-if-busy"), std::string::npos) << d.error();
  auto gpu = vconfig(1, 2);
  gpu.device = "cuda:64";
  ValidationEngine g(gpu);
  EXPECT_FALSE(g.attach(t));
  EXPECT_NE(g.error().find("cuda:64"), std::string::npos) << g.error();
}

TEST(ValidationEngine, SourceEndingBeforeAValidationDropsItWithAMessage) {
  TrainerEngine trainer(trainer_config("builtin:linear-test"));
  ASSERT_TRUE(trainer.start());
  auto t = borrowed(trainer);
  auto cfg = vconfig(0, 1);
  cfg.every = 1;
  ValidationEngine e(cfg);
  ASSERT_TRUE(e.attach(t));
  for (auto &s : rank_samples(3, 0, 1, 0)) ASSERT_EQ(e.push(latent(s.sample_id), {s}), R::kOk);
  BatchInfo info;
  info.captions = {"x"};
  ASSERT_EQ(trainer.process_tensor(latent(0).unsqueeze(0), info), ProcessResult::kOk);  // step 1 dispatched
  // The pass of step 0 completes; step 1 has no data: dropped with a message, and the shard's
  // EOS waits for the trainer's end (a stop, or a source cut short by num-buffers).
  std::atomic<int> eos{-1};
  std::thread val([&] { eos = static_cast<int>(e.end_of_stream()); });
  ASSERT_TRUE(trainer.finish()) << trainer.error();
  val.join();
  EXPECT_EQ(eos.load(), static_cast<int>(R::kOk)) << e.error();
  EXPECT_EQ(e.passes_done(), 1u);
  std::string texts;
  for (auto &m : e.take_messages())
    if (m.name == "ddpvalsink-skipped") texts += m.strings["text"] + "\n";
  EXPECT_NE(texts.find("validation of step 1 not done: the validation source ended (EOS) before its pass"),
            std::string::npos)
      << texts;
}

/* ---- a validator that joins after its trainer ended (a very short run) ---- */

namespace {

// Runs a validation branch (`feed`) on a thread for at most `seconds`: false when it had not
// returned by then (it waits for snapshots that never come), after a flush has woken it.
bool returns_within(ValidationEngine &e, double seconds, const std::function<void()> &feed) {
  std::promise<void> done;
  auto returned = done.get_future();
  std::thread branch([&] {
    feed();
    done.set_value();
  });
  const bool ok = returned.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
  if (!ok) e.set_flushing(true);
  branch.join();
  return ok;
}

void train_steps(TrainerEngine &t, int steps) {
  BatchInfo info;
  info.captions = {"x", "y"};
  for (int s = 0; s < steps; s++)
    ASSERT_EQ(t.process_tensor(at::stack({latent(s), latent(s + 50)}), info), ProcessResult::kOk) << t.error();
}

// One epoch then the first sample of the next: the results of the passes, the warnings, and what
// the engine said last (kEos: the trainer is done and so is validation) and at its EOS.
struct Branch {
  std::map<int64_t, double> results;
  std::string warnings;
  R last = R::kError, eos = R::kError;
};

Branch run_branch(ValidationEngine &e) {
  Branch b;
  EXPECT_TRUE(returns_within(e, 20, [&] {
    b.last = feed_epoch(e, rank_samples(3, 0, 1, 0));
    b.eos = e.end_of_stream();
  })) << "the validation branch waited for snapshots that never come";
  for (auto &m : e.take_messages()) {
    if (m.name == "ddpvalsink-result") {
      EXPECT_EQ(b.results.count(m.ints["step"]), 0u) << "step " << m.ints["step"] << " validated twice";
      b.results[m.ints["step"]] = m.numbers["loss"];
    }
    if (m.name == "warning") b.warnings += m.strings["text"] + "\n";
  }
  return b;
}

}  // namespace

TEST(ValidationEngine, AValidatorJoiningAFinishedTrainerValidatesItsFinalWeightsOnceAndEnds) {
  auto cfg = vconfig(0, 1);
  cfg.every = 2;
  // Reference: the same 2-step run with its validator there from the start (step 2 is due).
  double in_time = NAN;
  {
    TrainerEngine trainer(trainer_config("builtin:linear-test"));
    ASSERT_TRUE(trainer.start()) << trainer.error();
    ValidationEngine e(cfg);
    ASSERT_TRUE(e.attach(borrowed(trainer)));
    train_steps(trainer, 2);
    ASSERT_TRUE(trainer.finish()) << trainer.error();
    const Branch b = run_branch(e);
    ASSERT_TRUE(b.results.count(2));  // (at-start: step 0 came and went before the branch's first buffer)
    in_time = b.results.at(2);
  }
  // The trainer reaches its end before the validation branch joins: the final snapshot is
  // validated once (it is what the schedule and the final validation ask for), then EOS.
  TrainerEngine trainer(trainer_config("builtin:linear-test"));
  ASSERT_TRUE(trainer.start()) << trainer.error();
  train_steps(trainer, 2);
  ASSERT_TRUE(trainer.finish()) << trainer.error();
  ValidationEngine e(cfg);
  ASSERT_TRUE(e.attach(borrowed(trainer))) << e.error();
  const Branch b = run_branch(e);
  EXPECT_EQ(b.last, R::kEos) << e.error();
  EXPECT_EQ(b.eos, R::kOk) << e.error();
  ASSERT_EQ(b.results.size(), 1u);
  ASSERT_TRUE(b.results.count(2));
  EXPECT_DOUBLE_EQ(b.results.at(2), in_time);
  EXPECT_NE(b.warnings.find("at-start: the trainer had already finished after 2 step(s) when validation started"),
            std::string::npos)
      << b.warnings;
}

TEST(ValidationEngine, AValidatorOfAFailedTrainerEndsWithAWarning) {
  // A step that fails ([C, t, h, w]: not a micro-batch) ends the run with no final state.
  auto fail_step = [](TrainerEngine &t) {
    BatchInfo info;
    info.captions = {"x"};
    EXPECT_EQ(t.process_tensor(latent(0), info), ProcessResult::kError);
  };
  auto cfg = vconfig(0, 1);
  cfg.at_start = false;
  const std::string said = "the trainer failed after step 1: no final validation";
  {  // there before the failure: its branch waits for a snapshot when the trainer fails
    TrainerEngine trainer(trainer_config("builtin:linear-test"));
    ASSERT_TRUE(trainer.start()) << trainer.error();
    ValidationEngine e(cfg);
    ASSERT_TRUE(e.attach(borrowed(trainer))) << e.error();
    train_steps(trainer, 1);
    std::thread fails([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      fail_step(trainer);
    });
    const Branch b = run_branch(e);
    fails.join();
    EXPECT_EQ(b.last, R::kEos) << e.error();
    EXPECT_EQ(b.eos, R::kOk) << e.error();
    EXPECT_TRUE(b.results.empty());
    EXPECT_NE(b.warnings.find(said), std::string::npos) << b.warnings;
  }
  {  // joining after the failure
    TrainerEngine trainer(trainer_config("builtin:linear-test"));
    ASSERT_TRUE(trainer.start()) << trainer.error();
    train_steps(trainer, 1);
    fail_step(trainer);
    ValidationEngine e(cfg);
    ASSERT_TRUE(e.attach(borrowed(trainer))) << e.error();
    const Branch b = run_branch(e);
    EXPECT_EQ(b.last, R::kEos) << e.error();
    EXPECT_EQ(b.eos, R::kOk) << e.error();
    EXPECT_TRUE(b.results.empty());
    EXPECT_NE(b.warnings.find(said), std::string::npos) << b.warnings;
  }
}

TEST(ValidationEngine, AValidatorJoiningAsItsTrainerFinishesValidatesTheFinalStepOnce) {
  // The trainer's end and the validator's subscription race: whichever comes first, the final
  // snapshot is validated once and the branch ends.
  for (int round = 0; round < 8; round++) {
    TrainerEngine trainer(trainer_config("builtin:linear-test"));
    ASSERT_TRUE(trainer.start()) << trainer.error();
    train_steps(trainer, 1);
    auto cfg = vconfig(0, 1);
    cfg.at_start = false;
    ValidationEngine e(cfg);
    std::thread finish([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(100 * round));
      EXPECT_TRUE(trainer.finish()) << trainer.error();
    });
    ASSERT_TRUE(e.attach(borrowed(trainer))) << e.error();
    finish.join();
    const Branch b = run_branch(e);
    EXPECT_EQ(b.last, R::kEos) << "round " << round << ": " << e.error();
    EXPECT_EQ(b.results.size(), 1u) << "round " << round;
    EXPECT_TRUE(b.results.count(1)) << "round " << round;
  }
}
