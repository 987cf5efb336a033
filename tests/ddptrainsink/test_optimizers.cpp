/* ddptrainsink's optimizers (elements/ddptrainsink/optimizers/) against the reference
 * trajectories of tests/reference/optimizers (generate.py: torch.optim's AdamW, SGD and
 * Adafactor, and plain-PyTorch Prodigy, CAME and blockwise 8-bit AdamW), their state save/load,
 * the 8-bit state's size and its distance from float32 AdamW. VIDEOTRAIN_OPTIMIZER_REFERENCE
 * names another reference file (tests/interop/torch_optimizers.py: torch.optim's live). */
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <cstdlib>
#include <sstream>

#include "ddptrainsink/lr_schedule.h"
#include "ddptrainsink/optimizers/blockwise_quant.h"
#include "ddptrainsink/optimizers/train_optimizer.h"
#include "models/train_model.h"
#include "safetensors.h"
#include "test_util.h"

using namespace videotrain;
using json = nlohmann::json;

namespace {

class Reference {
 public:
  Reference() {
    path_ = vttest::env_or("VIDEOTRAIN_OPTIMIZER_REFERENCE", vttest::reference_dir() + "/optimizers/optimizers.safetensors");
    std::string err;
    file_ = SafetensorsFile::open(path_, &err);
    if (!file_) {
      ADD_FAILURE() << err;
      return;
    }
    cases = json::parse(file_->metadata().at("cases"));
    steps = std::stoi(file_->metadata().at("steps"));
    lr.base = 1.0;
    lr.schedule = LrSchedule::kCosine;
    lr.warmup_steps = std::stoull(file_->metadata().at("warmup_steps"));
    lr.max_steps = std::stoull(file_->metadata().at("max_steps"));
    std::stringstream ns(file_->metadata().at("names"));
    for (std::string n; std::getline(ns, n, ',');) names.push_back(n);
  }
  bool ok() const { return file_ != nullptr; }
  at::Tensor get(const std::string &key) const {
    const auto *e = file_->find(key);
    if (!e) {
      ADD_FAILURE() << "no tensor " << key << " in " << path_;
      return at::zeros({0});
    }
    const auto dt = e->dtype == "F32" ? at::kFloat : e->dtype == "F64" ? at::kDouble : at::kByte;
    at::Tensor t = at::empty(e->shape, dt);
    std::memcpy(t.data_ptr(), e->data, e->nbytes);
    return t;
  }
  // The case's settings as ddptrainsink resolves them.
  OptimizerSettings settings(const std::string &name) const {
    const json &c = cases.at(name);
    OptimizerSettings s;
    s.kind = c.at("kind");
    s.lr = c.at("lr");
    s.weight_decay = c.value("weight_decay", 0.0);
    s.beta1 = c.value("beta1", s.beta1);
    s.beta2 = c.value("beta2", s.beta2);
    s.eps = c.value("eps", s.eps);
    s.x.beta3 = c.value("beta3", s.x.beta3);
    s.x.eps2 = c.value("eps2", s.x.eps2);
    s.x.momentum = c.value("momentum", s.x.momentum);
    s.x.nesterov = c.value("nesterov", s.x.nesterov);
    s.x.clip_threshold = c.value("clip_threshold", s.x.clip_threshold);
    s.x.beta2_decay = c.value("beta2_decay", s.x.beta2_decay);
    s.x.d0 = c.value("d0", s.x.d0);
    s.x.d_coef = c.value("d_coef", s.x.d_coef);
    s.x.safeguard_warmup = c.value("safeguard_warmup", false);
    s.x.use_bias_correction = c.value("use_bias_correction", false);
    EXPECT_EQ(resolve_optimizer_settings(&s), "") << name;
    return s;
  }
  std::vector<at::Tensor> initial() const {
    std::vector<at::Tensor> ps;
    for (const auto &n : names) ps.push_back(get("init." + n).clone().requires_grad_(true));
    return ps;
  }
  // Step s (0-based) of optimizer `o` over `ps` with the stored gradients and the schedule's lr.
  void step(TrainOptimizer &o, std::vector<at::Tensor> &ps, int s, double base_lr) const {
    for (size_t i = 0; i < ps.size(); i++) ps[i].mutable_grad() = get("grad." + std::to_string(s) + "." + names[i]);
    o.set_lr(base_lr * lr_at(lr, s));
    o.step();
  }

  json cases;
  int steps = 0;
  LrScheduleParams lr;
  std::vector<std::string> names;

 private:
  std::string path_;
  std::unique_ptr<SafetensorsFile> file_;
};

// max |a - b| / (1e-3 + max |b|) over the tensor: rounding-level differences of an update.
double rel_max(const at::Tensor &a, const at::Tensor &b) {
  return (a.detach() - b).abs().max().item<double>() / (1e-3 + b.abs().max().item<double>());
}

}  // namespace

TEST(OptimizerReference, EveryOptimizerFollowsItsReferenceTrajectory) {
  Reference ref;
  ASSERT_TRUE(ref.ok());
  ASSERT_FALSE(ref.cases.empty());
  std::set<std::string> kinds;
  for (const auto &[name, c] : ref.cases.items()) kinds.insert(c.at("kind").get<std::string>());
  if (!std::getenv("VIDEOTRAIN_OPTIMIZER_REFERENCE"))  // the stored file covers them all; a live one torch.optim's
    EXPECT_EQ(kinds.size(), 6u);
  const at::Tensor lrs = ref.get("lr");
  for (int s = 0; s < ref.steps; s++) EXPECT_NEAR(lr_at(ref.lr, s), lrs[s].item<double>(), 1e-15) << "lr schedule";
  for (const auto &[name, c] : ref.cases.items()) {
    const OptimizerSettings st = ref.settings(name);
    auto ps = ref.initial();
    auto opt = make_optimizer(st, ps);
    double worst = 0;
    for (int s = 0; s < ref.steps; s++) {
      ref.step(*opt, ps, s, st.lr);
      for (size_t i = 0; i < ps.size(); i++) {
        const double d = rel_max(ps[i], ref.get(name + "." + std::to_string(s) + "." + ref.names[i]));
        worst = std::max(worst, d);
        EXPECT_LT(d, 2e-6) << name << " step " << s + 1 << " " << ref.names[i];
      }
      // The moved weights are the reference's, not the initial ones.
      EXPECT_GT(rel_max(ref.get("init.w"), ref.get(name + "." + std::to_string(s) + ".w")), 1e-4) << name;
    }
    std::printf("%-22s %d steps: max |ours - reference| / max |reference| = %.2e\n", name.c_str(), ref.steps, worst);
  }
}

TEST(OptimizerReference, TheQuantisationMapsAreBitsandbytesDynamicMaps) {
  Reference ref;
  ASSERT_TRUE(ref.ok());
  EXPECT_TRUE(at::equal(dynamic_map(true), ref.get("map.signed")));
  EXPECT_TRUE(at::equal(dynamic_map(false), ref.get("map.unsigned")));
  EXPECT_EQ(dynamic_map(true).size(0), 256);
  EXPECT_EQ(dynamic_map(false).min().item<float>(), 0.0f);
}

TEST(Optimizers, BlockwiseQuantisationRoundsEachBlockToItsNearestMapValue) {
  const at::Tensor map = dynamic_map(true);
  at::Tensor x = at::randn({600}) * at::linspace(0.01, 10, 600);  // blocks of different scales; a partial last one
  x.slice(0, 256, 512).zero_();  // an all-zero block
  const Quantized q = quantize_blockwise(x, map);
  EXPECT_EQ(q.codes.numel(), 600);
  EXPECT_EQ(q.absmax.numel(), 3);
  EXPECT_EQ(q.absmax[1].item<float>(), 0.0f);
  const at::Tensor back = dequantize_blocks(q, map).reshape({-1}).slice(0, 0, 600);
  EXPECT_TRUE(at::equal(back.slice(0, 256, 512), x.slice(0, 256, 512)));
  // Every value lands on the map value nearest to it (relative to its block's absmax).
  for (int64_t b : {0, 2}) {
    const at::Tensor xs = x.slice(0, b * 256, std::min<int64_t>(600, (b + 1) * 256));
    const at::Tensor norm = xs / q.absmax[b];
    const at::Tensor nearest = (norm.unsqueeze(1) - map.unsqueeze(0)).abs().amin(1);
    const at::Tensor got = back.slice(0, b * 256, std::min<int64_t>(600, (b + 1) * 256)) / q.absmax[b];
    EXPECT_LE(((got - norm).abs() - nearest).abs().max().item<float>(), 1e-6f);
    EXPECT_EQ(xs.abs().max().item<float>(), q.absmax[b].item<float>());
  }
}

TEST(Optimizers, AdamW8bitTracksAdamWWithAQuarterOfItsState) {
  Reference ref;
  ASSERT_TRUE(ref.ok());
  OptimizerSettings s = ref.settings("adamw");
  auto p32 = ref.initial();
  auto a32 = make_optimizer(s, p32);
  s.kind = "adamw8bit";
  auto p8 = ref.initial();
  auto a8 = make_optimizer(s, p8);
  double worst = 0;
  for (int step = 0; step < ref.steps; step++) {
    ref.step(*a32, p32, step, s.lr);
    ref.step(*a8, p8, step, s.lr);
    for (size_t i = 0; i < p8.size(); i++) {
      // Against how far AdamW moved the weights: the quantised moments cost a few percent of it.
      const double moved = (p32[i] - ref.get("init." + ref.names[i])).abs().max().item<double>();
      const double off = (p8[i] - p32[i]).abs().max().item<double>();
      EXPECT_LT(off, 0.05 * moved) << "step " << step + 1 << " " << ref.names[i];
      worst = std::max(worst, off / moved);
    }
  }
  std::printf("adamw8bit vs adamw over %d steps: worst max|diff| / max|AdamW's movement| = %.4f\n", ref.steps, worst);
  const size_t b32 = state_bytes(a32->state(ref.names)), b8 = state_bytes(a8->state(ref.names));
  int64_t n = 0, blocks = 0;
  for (auto &p : p32) {
    n += p.numel();
    blocks += (p.numel() + 255) / 256;
  }
  std::printf("state bytes for %lld parameters: adamw %zu, adamw8bit %zu (ratio %.4f)\n", (long long)n, b32, b8,
              double(b8) / double(b32));
  EXPECT_EQ(b32, size_t(8 * n));
  EXPECT_EQ(b8, size_t(2 * n + 8 * blocks));  // codes plus one float absmax per block and moment
  // A large tensor: a quarter to within the absmax overhead (8 bytes per 256 values).
  std::vector<at::Tensor> big{at::zeros({1024, 1024}, at::requires_grad())};
  big[0].mutable_grad() = at::randn({1024, 1024});
  auto o = make_optimizer(s, big);
  o->step();
  const double ratio = double(state_bytes(o->state({"big"}))) / double(8 * big[0].numel());
  std::printf("adamw8bit state / adamw state for 1M values: %.5f\n", ratio);
  EXPECT_NEAR(ratio, 0.25 + 8.0 / 256 / 8, 1e-9);
}

namespace {

// Every optimizer of the reference, saved after k steps into a file and loaded into a fresh one
// over copies of the weights: the steps after equal the uninterrupted run's bit for bit.
void check_resume(const Reference &ref, const std::string &name, int k) {
  const OptimizerSettings s = ref.settings(name);
  auto ps = ref.initial();
  auto o = make_optimizer(s, ps);
  for (int step = 0; step < k; step++) ref.step(*o, ps, step, s.lr);
  vttest::TempDir dir;
  {
    torch::serialize::OutputArchive a;
    o->save(a);
    a.save_to(dir.file("optimizer.pt"));
  }
  std::vector<at::Tensor> qs;
  for (auto &p : ps) qs.push_back(p.detach().clone().requires_grad_(true));
  auto r = make_optimizer(s, qs);
  {
    torch::serialize::InputArchive a;
    a.load_from(dir.file("optimizer.pt"));
    r->load(a);
  }
  for (int step = k; step < ref.steps; step++) {
    ref.step(*o, ps, step, s.lr);
    ref.step(*r, qs, step, s.lr);
  }
  for (size_t i = 0; i < ps.size(); i++) EXPECT_TRUE(at::equal(ps[i], qs[i])) << name << " " << ref.names[i];
  EXPECT_EQ(state_bytes(o->state(ref.names)), state_bytes(r->state(ref.names))) << name;
}

}  // namespace

TEST(Optimizers, SavedAfterKStepsAndLoadedIntoAFreshOneEachContinuesExactly) {
  Reference ref;
  ASSERT_TRUE(ref.ok());
  for (const auto &[name, c] : ref.cases.items()) {
    check_resume(ref, name, 3);
    check_resume(ref, name, 0);  // saved before its first step: no state yet
  }
}

TEST(Optimizers, AnotherOptimizersStateOrAnotherModelsIsRefusedNamingIt) {
  Reference ref;
  ASSERT_TRUE(ref.ok());
  auto ps = ref.initial();
  auto adamw = make_optimizer(ref.settings("adamw"), ps);
  ref.step(*adamw, ps, 0, 1e-2);
  vttest::TempDir dir;
  torch::serialize::OutputArchive a;
  adamw->save(a);
  a.save_to(dir.file("adamw.pt"));
  auto came = make_optimizer(ref.settings("came"), ps);
  torch::serialize::InputArchive in;
  in.load_from(dir.file("adamw.pt"));
  try {
    came->load(in);
    FAIL() << "loaded";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("optimizer=adamw's and this run has optimizer=came"), std::string::npos)
        << e.what();
  }
  // The same optimizer over other shapes.
  ref.step(*came, ps, 0, 1e-2);
  torch::serialize::OutputArchive b;
  came->save(b);
  b.save_to(dir.file("came.pt"));
  std::vector<at::Tensor> other{at::zeros({3, 3}, at::requires_grad()), ps[1], ps[2]};
  auto came2 = make_optimizer(ref.settings("came"), other);
  torch::serialize::InputArchive in2;
  in2.load_from(dir.file("came.pt"));
  try {
    came2->load(in2);
    FAIL() << "loaded";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("of parameter 0 has shape"), std::string::npos) << e.what();
  }
}

TEST(Optimizers, EveryOptimizersStateIsCheckedForNonFiniteValues) {
  Reference ref;
  ASSERT_TRUE(ref.ok());
  for (const auto &[name, c] : ref.cases.items()) {
    auto ps = ref.initial();
    auto o = make_optimizer(ref.settings(name), ps);
    ref.step(*o, ps, 0, 1e-2);
    NamedTensors st = o->state(ref.names);
    if (st.empty()) {  // SGD without momentum keeps none
      EXPECT_EQ(c.at("kind"), "sgd") << name;
      EXPECT_EQ(c.at("momentum"), 0.0) << name;
      continue;
    }
    EXPECT_EQ(first_non_finite(st), "") << name;
    // The last floating state tensor of the vector b.
    std::string poisoned;
    for (auto it = st.rbegin(); it != st.rend(); ++it)
      if (it->second.defined() && it->second.is_floating_point() && it->first.find(" of b") != std::string::npos) {
        it->second.view({-1})[0] = NAN;
        poisoned = it->first;
        break;
      }
    ASSERT_NE(poisoned, "") << name;
    EXPECT_EQ(first_non_finite(o->state(ref.names)), poisoned) << name;
  }
}

TEST(Optimizers, SettingsResolveEachOptimizersDefaultsAndRefuseWhatCannotStep) {
  OptimizerSettings s;
  EXPECT_EQ(resolve_optimizer_settings(&s), "");
  EXPECT_EQ(s.eps, 1e-8);
  s = OptimizerSettings();
  s.kind = "came";
  EXPECT_EQ(resolve_optimizer_settings(&s), "");
  EXPECT_EQ(s.eps, 1e-30);
  EXPECT_EQ(s.x.eps2, 1e-16);
  EXPECT_EQ(s.x.beta3, 0.9999);
  s = OptimizerSettings();
  s.kind = "adafactor";
  EXPECT_EQ(resolve_optimizer_settings(&s), "");
  EXPECT_EQ(s.eps, double(std::numeric_limits<float>::epsilon()));
  EXPECT_EQ(s.x.eps2, 1e-3);
  s = OptimizerSettings();
  s.kind = "prodigy";
  EXPECT_EQ(resolve_optimizer_settings(&s), "");
  EXPECT_DOUBLE_EQ(s.x.beta3, std::sqrt(0.999));
  s = OptimizerSettings();
  s.kind = "sgd";
  s.x.nesterov = true;
  EXPECT_NE(resolve_optimizer_settings(&s).find("needs momentum > 0"), std::string::npos);
  s = OptimizerSettings();
  s.kind = "lion";
  EXPECT_EQ(resolve_optimizer_settings(&s), "optimizer 'lion' is not one of adamw, adamw8bit, adafactor, prodigy, came, sgd");
  s = OptimizerSettings();
  s.kind = "adamw8bit";
  s.beta2 = 1;
  EXPECT_NE(resolve_optimizer_settings(&s).find("beta1 and beta2 below 1"), std::string::npos);
}

// ---- through ddptrainsink's engine ----

#include "ddptrainsink/trainer_engine.h"
#include "engine_helpers.h"

namespace {

videotrain::TrainerConfig optimizer_config(const std::string &kind) {
  auto c = enginetest::cpu_config("builtin:linear-test");
  c.optimizer = kind;
  if (kind == "prodigy") c.lr = 1.0;  // its usual setting: lr multiplies the learned step size
  if (kind == "sgd") c.optim.momentum = 0.9;
  c.lr_schedule = "cosine";
  c.warmup_steps = 1;
  c.max_steps = 6;
  c.checkpoint_every = 2;
  c.checkpoint_interval_s = 0;
  return c;
}

}  // namespace

TEST(OptimizerEngine, EachOptimizerTrainsAndResumesFromACheckpointExactly) {
  for (const char *kind : {"adamw", "adamw8bit", "adafactor", "prodigy", "came", "sgd"}) {
    std::map<std::string, std::vector<float>> straight, initial;
    {
      vttest::TempDir dir;
      auto c = optimizer_config(kind);
      c.checkpoint_dir = dir.path();
      videotrain::TrainerEngine e(c);
      ASSERT_TRUE(e.start()) << kind << ": " << e.error();
      enginetest::train(e, 0, 1, 1, 2);
      enginetest::train(e, 1, 3, 1, 2);
      straight = e.parameters_cpu(true);
    }
    {
      vttest::TempDir dir;
      auto c = optimizer_config(kind);
      c.checkpoint_dir = dir.path();
      {
        videotrain::TrainerEngine e(c);
        ASSERT_TRUE(e.start()) << e.error();
        enginetest::train(e, 0, 2, 1, 2);  // checkpoint of step 2
      }
      c.resume = true;
      videotrain::TrainerEngine r(c);
      ASSERT_TRUE(r.start()) << kind << ": " << r.error();
      ASSERT_TRUE(r.resumed()) << kind;
      EXPECT_EQ(r.steps_done(), 2u);
      enginetest::train(r, 2, 2, 1, 2);
      EXPECT_EQ(r.parameters_cpu(true), straight) << kind << ": resumed at step 2 differs from the straight run";
    }
    {
      // Trained: the weights moved from the initial ones.
      auto c = optimizer_config(kind);
      videotrain::TrainerEngine e(c);
      ASSERT_TRUE(e.start()) << e.error();
      enginetest::train(e, 0, 1, 1, 2);
      initial = e.parameters_cpu(true);
    }
    EXPECT_GT(enginetest::max_rel_diff(straight, initial), 1e-5) << kind;
  }
}

TEST(OptimizerEngine, ACheckpointResumesOnlyWithTheOptimizerThatWroteIt) {
  vttest::TempDir dir;
  auto c = optimizer_config("adamw");
  c.checkpoint_dir = dir.path();
  {
    videotrain::TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    enginetest::train(e, 0, 2, 1, 2);
  }
  c = optimizer_config("came");
  c.checkpoint_dir = dir.path();
  c.resume = true;
  videotrain::TrainerEngine r(c);
  EXPECT_FALSE(r.start());
  EXPECT_NE(r.error().find("optimizer=adamw's and this run has optimizer=came"), std::string::npos) << r.error();
}

TEST(OptimizerEngine, BadOptimizerSettingsFailAtStartNamingTheProperty) {
  auto c = optimizer_config("sgd");
  c.optim.momentum = 0;
  c.optim.nesterov = true;
  videotrain::TrainerEngine e(c);
  EXPECT_FALSE(e.start());
  EXPECT_NE(e.error().find("property momentum"), std::string::npos) << e.error();
  c = optimizer_config("lamb");
  videotrain::TrainerEngine f(c);
  EXPECT_FALSE(f.start());
  EXPECT_NE(f.error().find("is not one of adamw, adamw8bit"), std::string::npos) << f.error();
}
