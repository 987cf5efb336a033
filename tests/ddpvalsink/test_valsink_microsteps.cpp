/* ddpvalsink's `every` counts optimizer steps, not micro-batches: with steps made of 2
 * or 3 micro-batches, validation happens only after a step's last (sync) micro-batch,
 * at exactly the steps every divides (and the final one), and each validates the
 * weights of that whole step: its loss equals an independent validation of a trainer
 * that stopped after that step. */
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "test_util.h"
#include "valsink_test_util.h"

using namespace videotrain;
using namespace valtest;

namespace {

using R = ValidationEngine::Result;
constexpr unsigned kSteps = 5;
constexpr unsigned kValSamples = 4;

unsigned micro_count(unsigned step) { return 2 + step % 2; }  // 2, 3, 2, 3, ...

// Trains `steps` steps of micro_count(s) one-sample micro-batches each.
void train(TrainerEngine &t, unsigned steps) {
  for (unsigned s = 0; s < steps; s++) {
    const unsigned c = micro_count(s);
    for (unsigned i = 0; i < c; i++) {
      BatchInfo info;
      info.step = s;
      info.micro_index = i;
      info.micro_count = c;
      info.step_samples = c;
      info.sync = i + 1 == c;
      info.next_clip = 0;
      info.captions = {caption(s + i)};
      ASSERT_EQ(t.process_tensor(latent(100 + 10 * s + i).unsqueeze(0), info), ProcessResult::kOk) << t.error();
    }
  }
}

std::shared_ptr<TrainerEngine> make_trainer() {
  auto tc = trainer_config();
  tc.rank = 0;
  tc.world_size = 1;
  tc.timeout_s = 30;
  auto t = std::make_shared<TrainerEngine>(tc);
  EXPECT_TRUE(t->start()) << t->error();
  return t;
}

ValidationConfig vconfig(uint64_t every) {
  ValidationConfig c;
  c.every = every;
  c.device = "cpu";
  c.timeout_s = 30;
  return c;
}

// Feeds validation epochs until the engine says everything is validated.
std::thread feeder(ValidationEngine &e, R *result) {
  return std::thread([&e, result] {
    for (unsigned ep = 0;; ep++)
      for (const auto &s : rank_samples(kValSamples, 0, 1, ep))
        if ((*result = e.push(latent(s.sample_id), {s})) != R::kOk) return;
  });
}

// (step, loss) of every ddpvalsink-result while training kSteps steps with `every`.
std::vector<std::pair<uint64_t, double>> validate_while_training(uint64_t every) {
  auto trainer = make_trainer();
  ValidationEngine e(vconfig(every));
  EXPECT_TRUE(e.attach(trainer)) << e.error();
  R fed = R::kOk;
  std::thread f = feeder(e, &fed);
  train(*trainer, kSteps);
  EXPECT_TRUE(trainer->finish()) << trainer->error();
  f.join();
  EXPECT_EQ(fed, R::kEos) << e.error();
  std::vector<std::pair<uint64_t, double>> out;
  for (auto &m : e.take_messages())
    if (m.name == "ddpvalsink-result") {
      out.emplace_back(m.ints["step"], m.numbers["loss"]);
      EXPECT_EQ(m.ints["samples"], kValSamples);
    }
  trainer->stop();
  return out;
}

// The validation loss of a trainer that stopped after `steps` steps (validated once, at its end).
double reference_loss(unsigned steps) {
  static std::map<unsigned, double> cache;
  if (auto it = cache.find(steps); it != cache.end()) return it->second;
  auto trainer = make_trainer();
  train(*trainer, steps);
  ValidationEngine e(vconfig(0));
  EXPECT_TRUE(e.attach(trainer)) << e.error();
  EXPECT_TRUE(trainer->finish()) << trainer->error();
  R fed = R::kOk;
  feeder(e, &fed).join();
  EXPECT_EQ(fed, R::kEos) << e.error();
  EXPECT_EQ(e.last_step(), steps);
  trainer->stop();
  return cache[steps] = e.last_loss();
}

void expect_steps(uint64_t every, const std::vector<uint64_t> &want) {
  auto results = validate_while_training(every);
  std::vector<uint64_t> steps;
  for (auto &[s, l] : results) steps.push_back(s);
  ASSERT_EQ(steps, want) << "every=" << every;
  for (auto &[s, loss] : results) {
    const double ref = reference_loss(static_cast<unsigned>(s));
    ASSERT_TRUE(std::isfinite(ref));
    EXPECT_NEAR(loss, ref, 1e-6 * std::abs(ref)) << "step " << s << ": not the weights after the whole step";
  }
}

}  // namespace

TEST(ValMicroSteps, EveryTwoValidatesWholeStepsOnly) { expect_steps(2, {2, 4, 5}); }

TEST(ValMicroSteps, EveryOneValidatesEachWholeStep) { expect_steps(1, {1, 2, 3, 4, 5}); }
