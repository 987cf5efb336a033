/* ddptrainsink's EMA (ema-decay, ema-start-step, ema-every, export-ema) and the validators' and
 * tools' use of it: the average equals its closed form over the weights recorded at each step, a
 * resume continues it bit for bit, a resume of a run without one starts it from the weights,
 * weights=ema validates exactly the EMA, and the exports (LoRA file, diffusers folder, and
 * videotrain-model export --ema) hold it. CPU, builtin and tiny Wan models: seconds. */
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../ddpvalsink/valsink_test_util.h"
#include "ddptrainsink/ema_weights.h"
#include "ddptrainsink/trainer_engine.h"
#include "ddpsampler/sampler_engine.h"
#include "ddpvalsink/validation_engine.h"
#include "models/lora.h"
#include "models/native_model.h"
#include "models/param_snapshot.h"
#include "models/train_model.h"
#include "models/weights_io.h"
#include "safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace videotrain;
using Weights = std::map<std::string, std::vector<float>>;

namespace {

// The EMA after `steps` optimizer steps, in closed form (double): the weights of step s0 =
// min(start, steps) (0: the initial ones), then each update k of K at steps s0 + every * k adds
// (1 - d) d^(K - k) w_k, the start weights keeping d^K.
Weights closed_form(const std::vector<Weights> &w, double d, uint64_t start, uint64_t every, uint64_t steps) {
  const uint64_t s0 = std::min(start, steps);
  std::vector<uint64_t> updates;
  for (uint64_t s = s0 + every; s <= steps; s += every) updates.push_back(s);
  const size_t K = updates.size();
  Weights out;
  for (const auto &[name, v0] : w[s0]) {
    std::vector<double> acc(v0.size());
    for (size_t i = 0; i < v0.size(); i++) acc[i] = std::pow(d, double(K)) * v0[i];
    for (size_t k = 0; k < K; k++) {
      const double c = (1 - d) * std::pow(d, double(K - 1 - k));
      const auto &wk = w[updates[k]].at(name);
      for (size_t i = 0; i < v0.size(); i++) acc[i] += c * wk[i];
    }
    out[name] = std::vector<float>(acc.begin(), acc.end());
  }
  return out;
}

double max_abs_diff(const Weights &a, const Weights &b) {
  double worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (const auto &[n, va] : a) {
    const auto it = b.find(n);
    if (it == b.end()) {
      ADD_FAILURE() << "missing " << n;
      continue;
    }
    EXPECT_EQ(va.size(), it->second.size()) << n;
    for (size_t i = 0; i < std::min(va.size(), it->second.size()); i++)
      worst = std::max(worst, std::abs(double(va[i]) - it->second[i]));
  }
  return worst;
}

Weights to_weights(const NamedTensors &ts) {
  Weights out;
  for (const auto &[n, t] : ts) {
    auto c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
    out[n] = std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

TrainerConfig ema_config(double decay, uint64_t start, uint64_t every) {
  TrainerConfig c = valtest::trainer_config("builtin:tiny-unet3d");
  c.lr = 3e-2;  // steps large enough for the average to lag visibly
  c.ema_decay = decay;
  c.ema_start_step = start;
  c.ema_every = every;
  return c;
}

// Step s of a deterministic stream (2 samples).
ProcessResult feed(TrainerEngine &e, uint64_t s) {
  BatchInfo info;
  info.step_samples = 2;
  info.captions = {valtest::caption(2 * s), valtest::caption(2 * s + 1)};
  info.next_clip = 2 * (s + 1);
  return e.process_tensor(at::stack({valtest::latent(2 * s), valtest::latent(2 * s + 1)}), info);
}

std::string fresh_dir(const std::string &name) {
  const std::string d = (fs::temp_directory_path() / ("vt-ema-" + name + "-" + std::to_string(::getpid()))).string();
  fs::remove_all(d);
  return d;
}

bool has_warning(std::vector<BusMessage> msgs, const std::string &part) {
  for (auto &m : msgs)
    if (m.name == "warning" && m.strings["text"].find(part) != std::string::npos) return true;
  return false;
}

// A run context that serves a fixed snapshot (a model "loaded" with weights the test chose).
class FixedRun : public RunContext {
 public:
  FixedRun(const TrainerEngine &t, std::shared_ptr<const ParamSnapshot> s) : t_(t), snap_(std::move(s)) {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string device_name() const override { return "cpu"; }
  std::string master_addr() const override { return t_.master_addr(); }
  int master_port() const override { return t_.master_port(); }
  double timeout_s() const override { return 30; }
  bool has_model() const override { return true; }
  uint64_t steps_done() const override { return snap_->step; }
  std::shared_ptr<const ParamSnapshot> snapshot_state() const override { return snap_; }
  int add_step_callback(StepCallback) override { return 1; }
  void remove_step_callback(int) override {}
  bool append_log(const std::string &, uint64_t, const std::vector<std::pair<std::string, float>> &) override {
    return true;
  }

 private:
  const TrainerEngine &t_;
  std::shared_ptr<const ParamSnapshot> snap_;
};

// One validation pass of the final snapshot over 3 samples: its loss.
double validate(std::shared_ptr<RunContext> run, bool ema, std::string *error = nullptr) {
  ValidationConfig c;
  c.every = 0;
  c.device = "cpu";
  c.ema = ema;
  ValidationEngine e(c);
  if (!e.attach(run)) {
    if (error) *error = e.error();
    return NAN;
  }
  e.trainer_finished();
  auto samples = valtest::rank_samples(3, 0, 1, 0);
  for (const auto &s : samples) EXPECT_EQ(e.push(valtest::latent(s.sample_id), {s}), ValidationEngine::Result::kOk);
  auto next = samples.front();
  next.epoch++;
  EXPECT_EQ(e.push(valtest::latent(next.sample_id), {next}), ValidationEngine::Result::kEos) << e.error();
  return e.last_loss();
}

}  // namespace

TEST(Ema, ScheduleCopiesUpToTheStartThenAveragesAtEveryNthStep) {
  EmaSchedule s{0.9, 2, 3};
  using A = EmaSchedule::Action;
  const std::vector<A> want{A::kCopy, A::kCopy, A::kNone, A::kNone, A::kAverage, A::kNone, A::kNone, A::kAverage};
  for (uint64_t step = 1; step <= want.size(); step++) EXPECT_EQ(s.action(step), want[step - 1]) << "step " << step;
  EXPECT_EQ(EmaSchedule{}.action(5), A::kNone);
  EXPECT_NE(EmaSchedule({1.0, 0, 1}).check().find("ema-decay"), std::string::npos);
  EXPECT_NE(EmaSchedule({0.5, 0, 0}).check().find("ema-every"), std::string::npos);
  EXPECT_EQ(EmaSchedule({0.5, 0, 1}).check(), "");

  // The update over random "weights" against the closed form.
  std::vector<Weights> w;
  std::vector<at::Tensor> p{torch::randn({5, 3}), torch::randn({7})};
  NamedTensors named{{"a", p[0]}, {"b", p[1]}};
  w.push_back(to_weights(named));
  EmaWeights ema(s, named);
  for (uint64_t step = 1; step <= 11; step++) {
    for (auto &t : p) t.copy_(torch::randn(t.sizes()));
    w.push_back(to_weights(named));
    ema.update(step, p);
    EXPECT_LT(max_abs_diff(to_weights(ema.tensors()), closed_form(w, 0.9, 2, 3, step)), 1e-6) << "step " << step;
  }
}

// tests/reference/ema: torch.optim.swa_utils.AveragedModel with the EMA average over stored weights,
// updated on ddptrainsink's schedule (its first update copies, at ema-start-step). Before the start
// AveragedModel keeps its initial copy where ours follows the weights: compared from the start on.
TEST(Ema, TheUpdateEqualsTorchsAveragedModelOverStoredWeights) {
  std::string err;
  auto f = SafetensorsFile::open(vttest::reference_dir() + "/ema/ema.safetensors", &err);
  ASSERT_TRUE(f) << err;
  const auto cases = nlohmann::json::parse(f->metadata().at("cases"));
  const uint64_t steps = std::stoull(f->metadata().at("steps"));
  auto weights_at = [&](uint64_t step) {
    NamedTensors out;
    const std::string prefix = "w." + std::to_string(step) + ".";
    for (const auto &[key, e] : f->entries())
      if (key.rfind(prefix, 0) == 0) out.emplace_back(key.substr(prefix.size()), models::tensor_of(e));
    return out;
  };
  ASSERT_EQ(cases.size(), 3u);
  for (const auto &[name, c] : cases.items()) {
    const EmaSchedule s{c[0].get<double>(), c[1].get<uint64_t>(), c[2].get<uint64_t>()};
    NamedTensors params = weights_at(0);
    ASSERT_EQ(params.size(), 4u);
    std::vector<at::Tensor> p;
    for (auto &[n, t] : params) p.push_back(t);
    EmaWeights ema(s, params);
    for (uint64_t step = 1; step <= steps; step++) {
      const NamedTensors w = weights_at(step);
      for (size_t i = 0; i < p.size(); i++) p[i].copy_(w[i].second);
      ema.update(step, p);
      if (step < s.start_step) continue;
      for (const auto &[n, t] : ema.tensors()) {
        const auto *e = f->find("ema." + name + "." + std::to_string(step) + "." + n);
        ASSERT_TRUE(e) << n;
        EXPECT_LT((t - models::tensor_of(*e)).abs().max().item<double>(), 1e-6) << name << " step " << step << " " << n;
      }
    }
  }
}

TEST(Ema, TheTrainersEmaEqualsTheFormulaOverItsRecordedWeights) {
  for (const auto &[start, every] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 1}, {2, 2}}) {
    TrainerEngine e(ema_config(0.8, start, every));
    ASSERT_TRUE(e.start()) << e.error();
    EXPECT_TRUE(e.has_ema());
    std::vector<Weights> w{e.parameters_cpu()};
    e.add_step_callback([&](const StepReport &r) {
      if (!r.model_built && !r.finished) w.push_back(e.parameters_cpu());
    });
    EXPECT_EQ(max_abs_diff(e.ema_cpu(), w[0]), 0.0) << "the EMA starts as the initial weights";
    for (uint64_t s = 0; s < 7; s++) ASSERT_EQ(feed(e, s), ProcessResult::kOk) << e.error();
    ASSERT_EQ(w.size(), 8u);
    const Weights ema = e.ema_cpu();
    EXPECT_LT(max_abs_diff(ema, closed_form(w, 0.8, start, every, 7)), 1e-6) << "start " << start << " every " << every;
    EXPECT_GT(max_abs_diff(ema, w[7]), 1e-3) << "the average lags the weights";
    // What validators and samplers get: the EMA in place of the trainable parameters.
    auto snap = e.snapshot_ema();
    ASSERT_TRUE(snap);
    EXPECT_EQ(snap->step, 7u);
    EXPECT_EQ(max_abs_diff(to_weights(snap->parameters), ema), 0.0);
    EXPECT_EQ(max_abs_diff(to_weights(e.snapshot_state()->parameters), w[7]), 0.0);
  }
}

TEST(Ema, AResumeContinuesTheEmaBitForBit) {
  const std::string a = fresh_dir("straight"), b = fresh_dir("resumed");
  Weights straight_ema, straight_w;
  {
    auto c = ema_config(0.7, 1, 2);
    c.checkpoint_dir = a;
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    for (uint64_t s = 0; s < 6; s++) ASSERT_EQ(feed(e, s), ProcessResult::kOk) << e.error();
    straight_ema = e.ema_cpu();
    straight_w = e.parameters_cpu();
  }
  {
    auto c = ema_config(0.7, 1, 2);
    c.checkpoint_dir = b;
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    for (uint64_t s = 0; s < 3; s++) ASSERT_EQ(feed(e, s), ProcessResult::kOk) << e.error();
    ASSERT_TRUE(e.finish()) << e.error();
  }
  // The EMA is a file of the step folder, sealed by its manifest like the others.
  const std::string step3 = b + "/step-00000003";
  ASSERT_TRUE(fs::exists(step3 + "/" + kEmaFile));
  std::ifstream mf(step3 + "/manifest.json");
  const auto manifest = nlohmann::json::parse(mf);
  EXPECT_TRUE(manifest.at("files").contains(kEmaFile)) << manifest.dump();
  std::ifstream tf(step3 + "/trainer.json");
  EXPECT_EQ(nlohmann::json::parse(tf).value("ema_file", ""), kEmaFile);
  {
    auto c = ema_config(0.7, 1, 2);
    c.checkpoint_dir = b;
    c.resume = true;
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    ASSERT_TRUE(e.resumed());
    for (uint64_t s = 3; s < 6; s++) ASSERT_EQ(feed(e, s), ProcessResult::kOk) << e.error();
    EXPECT_EQ(max_abs_diff(e.parameters_cpu(), straight_w), 0.0);
    EXPECT_EQ(max_abs_diff(e.ema_cpu(), straight_ema), 0.0) << "the EMA after a resume equals the uninterrupted one";
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Ema, AResumeOfARunWithoutEmaStartsItFromItsWeightsWithAWarning) {
  const std::string d = fresh_dir("noema");
  {
    auto c = ema_config(0, 0, 1);
    c.checkpoint_dir = d;
    TrainerEngine e(c);
    ASSERT_TRUE(e.start()) << e.error();
    EXPECT_FALSE(e.has_ema());
    EXPECT_EQ(e.snapshot_ema(), nullptr);
    for (uint64_t s = 0; s < 2; s++) ASSERT_EQ(feed(e, s), ProcessResult::kOk) << e.error();
    ASSERT_TRUE(e.finish()) << e.error();
  }
  EXPECT_FALSE(fs::exists(d + "/step-00000002/" + kEmaFile));
  auto c = ema_config(0.9, 0, 1);
  c.checkpoint_dir = d;
  c.resume = true;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  EXPECT_TRUE(has_warning(e.take_messages(), "holds no EMA")) << "a warning says where the EMA starts";
  const Weights w2 = e.parameters_cpu();
  EXPECT_EQ(max_abs_diff(e.ema_cpu(), w2), 0.0);
  ASSERT_EQ(feed(e, 2), ProcessResult::kOk) << e.error();
  // One update after the resume: 0.9 of the resumed weights and 0.1 of step 3's.
  EXPECT_LT(max_abs_diff(e.ema_cpu(), closed_form({w2, w2, w2, e.parameters_cpu()}, 0.9, 2, 1, 3)), 1e-6);
  ASSERT_TRUE(e.finish()) << e.error();
  // The other way round: a run without EMA resuming one that kept it says that it drops it.
  auto off = ema_config(0, 0, 1);
  off.checkpoint_dir = d;
  off.resume = true;
  TrainerEngine plain(off);
  ASSERT_TRUE(plain.start()) << plain.error();
  EXPECT_TRUE(has_warning(plain.take_messages(), "neither continues nor keeps"));
  fs::remove_all(d);
}

TEST(Ema, BadSettingsAreErrorsNamingTheProperty) {
  {
    TrainerEngine e(ema_config(1.0, 0, 1));
    EXPECT_FALSE(e.start());
    EXPECT_NE(e.error().find("ema-decay"), std::string::npos) << e.error();
  }
  {
    auto c = ema_config(0, 0, 1);
    c.export_ema = true;
    TrainerEngine e(c);
    EXPECT_FALSE(e.start());
    EXPECT_NE(e.error().find("export-ema"), std::string::npos) << e.error();
  }
  TrainerEngine e(ema_config(0, 0, 1));
  ASSERT_TRUE(e.start()) << e.error();
  std::string why;
  EXPECT_TRUE(std::isnan(validate(valtest::borrowed(e), true, &why)));
  EXPECT_NE(why.find("weights=ema"), std::string::npos) << why;
  EXPECT_NE(why.find("ema-decay"), std::string::npos) << why;
  SamplerConfig sc;
  sc.ema = true;
  SamplerEngine sampler(sc);
  EXPECT_FALSE(sampler.attach(valtest::borrowed(e)));
  EXPECT_NE(sampler.error().find("weights=ema"), std::string::npos) << sampler.error();
}

TEST(Ema, ValidationWithEmaWeightsIsTheLossOfAModelLoadedWithThem) {
  TrainerEngine e(ema_config(0.6, 0, 1));
  ASSERT_TRUE(e.start()) << e.error();
  for (uint64_t s = 0; s < 4; s++) ASSERT_EQ(feed(e, s), ProcessResult::kOk) << e.error();
  ASSERT_TRUE(e.finish()) << e.error();
  const double raw = validate(valtest::borrowed(e), false);
  const double ema = validate(valtest::borrowed(e), true);
  ASSERT_TRUE(std::isfinite(raw) && std::isfinite(ema));
  EXPECT_GT(std::abs(raw - ema), 1e-6 * std::abs(raw)) << "the EMA is other weights";
  // The same trainer's raw snapshot with the EMA's numbers (read back as floats) loaded into it.
  auto snap = std::make_shared<ParamSnapshot>(*e.snapshot_state());
  const Weights avg = e.ema_cpu();
  for (auto &[n, t] : snap->parameters) {
    const auto &v = avg.at(n);
    t = torch::from_blob(const_cast<float *>(v.data()), t.sizes(), torch::kFloat).clone();
  }
  const double loaded = validate(std::make_shared<FixedRun>(e, snap), false);
  EXPECT_NEAR(loaded, ema, 1e-6 * std::abs(ema));
}

namespace {

// A tiny Wan run (LoRA or full) of 2 steps with export-ema; returns its EMA and raw weights.
void wan_run(const std::string &dir, bool lora, Weights *ema, Weights *raw) {
  TrainerConfig c;
  c.model = vttest::reference_dir() + "/dit/wan_t2v_tiny";
  c.device = "cpu";
  c.seed = 5;
  c.lr = 1e-2;
  c.world_size = 1;
  c.rank = 0;
  c.checkpoint_dir = dir;
  c.save_dtype = "fp32";
  c.ema_decay = 0.5;
  c.export_ema = true;
  if (lora) {
    c.native.lora_rank = 2;
    c.native.lora_alpha = 2;
  }
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  for (uint64_t s = 0; s < 3; s++) {
    auto g = at::detail::createCPUGenerator(77 + s);
    ModelInputs in;
    in.latents = at::randn({1, 4, 2, 4, 4}, g);
    in.text_embeds = at::randn({1, 6, 32}, g);
    in.text_mask = torch::ones({1, 6}, torch::kLong);
    BatchInfo info;
    info.sample_ids = {s};
    info.next_clip = s + 1;
    ASSERT_EQ(e.process_inputs(in, info), ProcessResult::kOk) << e.error();
  }
  ASSERT_TRUE(e.finish()) << e.error();
  bool raw_msg = false, ema_msg = false;
  for (auto &m : e.take_messages())
    if (m.name == "ddptrainsink-export") (m.ints.count("ema") ? ema_msg : raw_msg) = true;
  EXPECT_TRUE(raw_msg && ema_msg) << "a ddptrainsink-export message for each export";
  *ema = e.ema_cpu();
  *raw = e.parameters_cpu();
  EXPECT_GT(max_abs_diff(*ema, *raw), 1e-5);
}

int model_tool(const std::string &args) {
  const std::string cmd = vttest::env_or("VIDEOTRAIN_BUILD_DIR", ".") + "/tools/videotrain-model " + args + " > /dev/null";
  return std::system(cmd.c_str());
}

Weights lora_weights(const std::string &path) {
  Weights out;
  for (auto &[name, m] : models::read_lora_file(path).modules) {
    NamedTensors t{{"transformer." + name + ".lora_A.weight", m.a}, {"transformer." + name + ".lora_B.weight", m.b}};
    for (auto &[n, v] : to_weights(t)) out[n] = v;
  }
  return out;
}

}  // namespace

TEST(Ema, ExportEmaWritesALoraFileBesideTheRawOneAndTheToolExportsTheSame) {
  const std::string d = fresh_dir("lora");
  Weights ema, raw;
  wan_run(d, true, &ema, &raw);
  EXPECT_EQ(max_abs_diff(lora_weights(d + "/lora/pytorch_lora_weights.safetensors"), raw), 0.0);
  EXPECT_EQ(max_abs_diff(lora_weights(d + "/lora_ema/pytorch_lora_weights.safetensors"), ema), 0.0);
  ASSERT_EQ(model_tool("export " + d + " " + d + "/tool-ema --ema"), 0);
  EXPECT_EQ(max_abs_diff(lora_weights(d + "/tool-ema/pytorch_lora_weights.safetensors"), ema), 0.0);
  fs::remove_all(d);
}

TEST(Ema, ExportEmaWritesATransformerFolderThatLoadsAndTheToolExportsTheSame) {
  const std::string d = fresh_dir("full");
  Weights ema, raw;
  wan_run(d, false, &ema, &raw);
  auto folder_weights = [](const std::string &dir) {
    auto m = models::open_dit(dir, torch::kCPU);
    NamedTensors t;
    for (auto &p : m->module().named_parameters(true)) t.emplace_back(p.key(), p.value());
    return to_weights(t);
  };
  EXPECT_EQ(max_abs_diff(folder_weights(d + "/transformer"), raw), 0.0);
  EXPECT_EQ(max_abs_diff(folder_weights(d + "/transformer_ema"), ema), 0.0);
  ASSERT_EQ(model_tool("export " + d + " " + d + "/tool-ema --ema --dtype fp32"), 0);
  EXPECT_EQ(max_abs_diff(folder_weights(d + "/tool-ema"), ema), 0.0);
  // A checkpoint without an EMA: --ema is an error saying so.
  EXPECT_NE(model_tool("export " + vttest::reference_dir() + "/dit/wan_t2v_tiny " + d + "/x --ema 2>/dev/null"), 0);
  fs::remove_all(d);
}
