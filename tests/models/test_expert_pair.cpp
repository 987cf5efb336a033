/* Wan 2.2 A14B's two experts as one TrainModel (model-2): each sample trains the expert of its timestep,
 * checked against each expert trained alone on that sample (the one-model path); checkpoints, exports
 * and two-expert sampling. The experts: tests/reference/dit/wan_t2v_tiny and a perturbed copy. */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <set>

#include "models/expert_pair.h"
#include "models/native_model.h"
#include "models/samplers.h"
#include "models/train_model.h"
#include "ref_cases.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::models;
namespace fs = std::filesystem;

namespace {

constexpr double kBoundary = 0.875;
const std::vector<int64_t> kLatent{4, 2, 4, 6};

// A pipeline folder: transformer/ (the reference tiny Wan) and transformer_2/ (its weights perturbed).
struct Pipeline {
  vttest::TempDir tmp;
  std::string high, low;
  Pipeline() {
    high = tmp.file("transformer");
    low = tmp.file("transformer_2");
    torch::NoGradGuard ng;
    auto a = open_dit(vttest::reference_dir() + "/dit/wan_t2v_tiny", torch::kCPU);
    a->save(high, torch::kFloat, uint64_t(1) << 30);
    auto g = at::make_generator<at::CPUGeneratorImpl>(5);
    for (auto &p : a->module().parameters()) p.add_(0.05 * at::randn(p.sizes(), g, p.options()));
    a->save(low, torch::kFloat, uint64_t(1) << 30);
    vttest::write_file(tmp.file("model_index.json"), R"({"_class_name": "WanPipeline", "boundary_ratio": 0.875})");
  }
};

ModelOptions pair_options(const Pipeline &p) {
  ModelOptions o;
  o.seed = 3;
  o.model_2 = p.low;
  o.boundary_ratio = kBoundary;
  return o;
}

// Sample ids whose drawn sigma puts them above / below the boundary.
void ids_by_expert(const ModelOptions &o, uint64_t *high, uint64_t *low) {
  bool got_high = false, got_low = false;
  for (uint64_t id = 0; id < 1000 && !(got_high && got_low); id++) {
    at::Tensor sigma, noise;
    std::vector<int64_t> shape{1};
    shape.insert(shape.end(), kLatent.begin(), kLatent.end());
    draw_flow(torch::zeros(shape), {id}, 0, o, &sigma, &noise);
    const bool hi = high_noise_timestep(sigma.item<float>() * 1000.0f, o.boundary_ratio);
    if (hi && !got_high) *high = id, got_high = true;
    if (!hi && !got_low) *low = id, got_low = true;
  }
  ASSERT_TRUE(got_high && got_low);
}

ModelInputs inputs(const std::vector<uint64_t> &ids) {
  torch::manual_seed(11);
  const int64_t m = static_cast<int64_t>(ids.size());
  ModelInputs in;
  std::vector<int64_t> shape{m};
  shape.insert(shape.end(), kLatent.begin(), kLatent.end());
  in.latents = torch::randn(shape);
  in.text_embeds = torch::randn({m, 8, 32});
  in.text_mask = torch::ones({m, 8}, torch::kLong);
  in.text_mask.narrow(1, 5, 3).zero_();
  in.sample_ids = ids;
  return in;
}

std::map<std::string, at::Tensor> grads_of(TrainModel &m) {
  std::map<std::string, at::Tensor> out;
  for (auto &[n, p] : m.named_parameters()) out[n] = p.grad().defined() ? p.grad().clone() : torch::zeros_like(p);
  return out;
}

void zero_grads(TrainModel &m) {
  for (auto &[n, p] : m.named_parameters())
    if (p.grad().defined()) p.mutable_grad().zero_();
}

}  // namespace

TEST(ExpertPair, BoundaryFromModelIndex) {
  Pipeline p;
  std::string why;
  EXPECT_DOUBLE_EQ(pipeline_boundary_ratio(p.high, &why), 0.875);
  vttest::TempDir none;
  EXPECT_EQ(pipeline_boundary_ratio(none.file("transformer"), &why), 0.0);
  EXPECT_NE(why.find("model_index.json"), std::string::npos) << why;
  EXPECT_EQ(expert2_name("blocks.0.attn1.to_q.weight"), "transformer_2.blocks.0.attn1.to_q.weight");
  EXPECT_EQ(expert2_name("transformer.blocks.0.attn1.to_q.lora_A.weight"), "transformer_2.blocks.0.attn1.to_q.lora_A.weight");
  EXPECT_EQ(expert2_dir("out/transformer/"), "out/transformer_2");
}

// The pair's loss over a step's samples equals the mean of each sample's loss under its own expert
// trained alone; a sample's gradient reaches only its expert, and equals that expert's own.
TEST(ExpertPair, EachSampleTrainsItsExpert) {
  Pipeline p;
  for (const std::string weighting : {"none", "sigma-sqrt"}) {
    ModelOptions o = pair_options(p);
    o.loss_weighting = weighting;
    ModelOptions one = o;
    one.model_2.clear();
    uint64_t hi = 0, lo = 0;
    ids_by_expert(o, &hi, &lo);
    auto pair = make_model(p.high, {}, torch::kCPU, o);
    auto high = make_model(p.high, {}, torch::kCPU, one);
    auto low = make_model(p.low, {}, torch::kCPU, one);
    ASSERT_NE(pair->dit_2(), nullptr);
    const auto names = pair->named_parameters();
    std::set<std::string> unique;
    size_t second = 0;
    for (const auto &[n, t] : names) {
      unique.insert(n);
      second += n.rfind("transformer_2.", 0) == 0;
    }
    EXPECT_EQ(unique.size(), names.size());
    EXPECT_EQ(second, low->named_parameters().size());

    const auto in = inputs({hi, lo, lo});
    const auto loss = pair->training_step(in);
    const auto l_hi = high->training_step(in.narrow(0, 1));
    const auto l_lo1 = low->training_step(in.narrow(1, 1));
    const auto l_lo2 = low->training_step(in.narrow(2, 1));
    const double want = (l_hi.item<double>() + l_lo1.item<double>() + l_lo2.item<double>()) / 3.0;
    EXPECT_NEAR(loss.item<double>(), want, 1e-6 * std::abs(want)) << weighting;
    // The experts differ: the same sample through the other expert gives another loss.
    EXPECT_GT(std::abs(low->training_step(in.narrow(0, 1)).item<double>() - l_hi.item<double>()), 1e-4);

    for (int which = 0; which < 2; which++) {
      zero_grads(*pair);
      zero_grads(*high);
      zero_grads(*low);
      pair->training_step(in.narrow(which, 1)).backward();
      (which == 0 ? high : low)->training_step(in.narrow(which, 1)).backward();
      // The other expert's gradients are zeros, not undefined (its optimizer steps alike on any rank count).
      for (auto &[n, q] : pair->named_parameters()) EXPECT_TRUE(q.grad().defined()) << n;
      auto got = grads_of(*pair);
      auto own = grads_of(*(which == 0 ? high : low));
      double other = 0, mine = 0, diff = 0;
      for (const auto &[n, g] : got) {
        const bool is2 = n.rfind("transformer_2.", 0) == 0;
        if (is2 != (which == 1)) {
          other += g.abs().sum().item<double>();
          continue;
        }
        const std::string own_name = is2 ? n.substr(std::string("transformer_2.").size()) : n;
        mine += g.abs().sum().item<double>();
        diff = std::max(diff, (g - own.at(own_name)).abs().max().item<double>());
      }
      EXPECT_EQ(other, 0.0) << "sample " << which << " reached the other expert";
      EXPECT_GT(mine, 0.0);
      EXPECT_LT(diff, 1e-6) << weighting << " sample " << which;
    }
  }
}

// Validation at val-sigmas: each sigma by its expert, as each expert alone at its sigma.
TEST(ExpertPair, ValidationUsesTheExpertOfEachSigma) {
  Pipeline p;
  ModelOptions o = pair_options(p);
  o.val_sigmas = {0.95, 0.5};
  ModelOptions hi_o = o, lo_o = o;
  hi_o.model_2.clear();
  lo_o.model_2.clear();
  hi_o.val_sigmas = {0.95};
  lo_o.val_sigmas = {0.5};
  auto pair = make_model(p.high, {}, torch::kCPU, o);
  auto high = make_model(p.high, {}, torch::kCPU, hi_o);
  auto low = make_model(p.low, {}, torch::kCPU, lo_o);
  torch::NoGradGuard ng;
  const auto in = inputs({1, 2});
  const auto got = pair->validation_step(in, {7, 8});
  const auto want = (high->validation_step(in, {7, 8}) + low->validation_step(in, {7, 8})) / 2.0;
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-6);
}

// A checkpoint (save/load) restores both experts; the export writes transformer/ and transformer_2/
// (LoRA: lora/ and lora_2/), each loadable alone.
TEST(ExpertPair, CheckpointAndExportHoldBothExperts) {
  Pipeline p;
  for (const bool lora : {false, true}) {
    ModelOptions o = pair_options(p);
    if (lora) o.lora_rank = 4;
    auto a = make_model(p.high, {}, torch::kCPU, o);
    {
      torch::NoGradGuard ng;
      for (auto &[n, t] : a->named_parameters()) t.add_(0.01 * torch::randn_like(t));
    }
    vttest::TempDir ck;
    a->save(ck.path());
    EXPECT_TRUE(fs::exists(ck.file("transformer_2/" + std::string(lora ? "pytorch_lora_weights.safetensors" : "config.json"))));
    auto b = make_model(p.high, {}, torch::kCPU, o);
    b->load(ck.path());
    const auto pa = a->named_parameters(), pb = b->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); i++) EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
    // A one-model checkpoint is refused, naming why.
    vttest::TempDir single;
    ModelOptions one = o;
    one.model_2.clear();
    make_model(p.high, {}, torch::kCPU, one)->save(single.path());
    try {
      b->load(single.path());
      ADD_FAILURE() << "a one-model checkpoint loaded into two experts";
    } catch (const std::runtime_error &e) {
      EXPECT_NE(std::string(e.what()).find("model-2"), std::string::npos) << e.what();
    }
    vttest::TempDir out;
    const std::string dir = out.file(a->export_name());
    EXPECT_EQ(a->export_name(), lora ? "lora" : "transformer");
    ASSERT_TRUE(a->export_folder(dir, "fp32"));
    if (!lora) {
      auto low = open_dit(dir + "_2", torch::kCPU);
      auto want = make_model(p.low, {}, torch::kCPU, one);
      size_t n = 0;
      for (auto &[name, t] : a->named_parameters())
        if (name.rfind("transformer_2.", 0) == 0) {
          const auto key = name.substr(std::string("transformer_2.").size());
          for (auto &q : low->module().named_parameters(true))
            if (q.key() == key) {
              EXPECT_TRUE(torch::equal(q.value(), t)) << key;
              n++;
            }
        }
      EXPECT_EQ(n, want->named_parameters().size());
    } else {
      EXPECT_TRUE(fs::exists(dir + "/pytorch_lora_weights.safetensors"));
      EXPECT_TRUE(fs::exists(dir + "_2/pytorch_lora_weights.safetensors"));
    }
  }
}

// Two-expert sampling switches at the boundary: the steps at t >= 875 equal the high expert's loop
// with `guidance`, the rest continue with the low expert and `guidance-2`.
TEST(ExpertPair, SamplingSwitchesExpertsAtTheBoundary) {
  Pipeline p;
  auto high = open_dit(p.high, torch::kCPU);
  auto low = open_dit(p.low, torch::kCPU);
  SamplerOptions so;
  so.kind = SamplerKind::FlowEuler;
  so.steps = 6;
  auto s = Sampler::make(so);
  int switch_at = 0;
  while (s->schedule().timesteps[switch_at] >= 875.0) switch_at++;
  ASSERT_GT(switch_at, 0);
  ASSERT_LT(switch_at, 6);
  torch::manual_seed(2);
  const auto noise = torch::randn({1, 4, 3, 8, 12});
  const auto pe = torch::randn({1, 8, 32}), ne = torch::randn({1, 8, 32});
  at::Generator g1 = at::make_generator<at::CPUGeneratorImpl>(1);
  std::vector<at::Tensor> steps;
  const auto got = sample_latents_2(*high, *low, kBoundary, *s, noise, pe, ne, 5.0, 3.0, g1,
                                    [&](int, const at::Tensor &x) { steps.push_back(x.clone()); });
  // The same by hand: Euler steps x + (sigma_{k+1} - sigma_k) v with v guided by the step's expert.
  torch::NoGradGuard ng;
  at::Tensor x = noise;
  for (int k = 0; k < 6; k++) {
    auto &m = k < switch_at ? *high : *low;
    const double w = k < switch_at ? 5.0 : 3.0;
    const auto t = torch::full({1}, static_cast<float>(s->schedule().timesteps[k]));
    const auto c = m.forward(x, t, pe), u = m.forward(x, t, ne);
    const float dt = static_cast<float>(s->schedule().sigmas[k + 1]) - static_cast<float>(s->schedule().sigmas[k]);
    x = x + dt * (u + w * (c - u));
    EXPECT_LT((x - steps[k]).abs().max().item<double>(), 1e-5) << "step " << k;
  }
  EXPECT_LT((x - got).abs().max().item<double>(), 1e-5);
}

// ddpsampler's two-expert loop against diffusers' WanPipeline(transformer, transformer_2, boundary_ratio)
// stored by tests/reference/wan_experts/generate.py (the torch2 suite's diffusers-wan-experts runs it live).
TEST(ExpertPair, SamplingEqualsWanPipelineStored) {
  modeltest::RefFile f("wan_experts/experts_loop.safetensors");
  ASSERT_TRUE(f.ok());
  auto high = open_dit(vttest::reference_dir() + "/dit/wan_t2v_tiny", torch::kCPU);
  auto low = open_dit(vttest::reference_dir() + "/wan_experts/transformer_2", torch::kCPU);
  const auto pe = f.get("prompt_embeds"), ne = f.get("negative_prompt_embeds");
  for (const auto &[tag, kind] : {std::pair<std::string, SamplerKind>{"unipc", SamplerKind::UniPC},
                                  {"euler", SamplerKind::FlowEuler}}) {
    SamplerOptions so;
    so.kind = kind;
    so.steps = std::stoi(f.meta("steps"));
    auto s = Sampler::make(so);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(std::stoull(f.meta("seed")));
    const auto noise = at::randn({1, 4, 3, 8, 12}, gen, at::TensorOptions(at::kFloat));
    EXPECT_TRUE(torch::equal(noise, f.get("initial_noise")));
    const auto steps = f.get(tag + ".latents_after_step");
    const auto out = sample_latents_2(*high, *low, std::stod(f.meta("boundary_ratio")), *s, noise, pe, ne,
                                      std::stod(f.meta("guidance")), std::stod(f.meta("guidance_2")), gen,
                                      [&](int k, const at::Tensor &x) {
                                        EXPECT_LT(modeltest::rel_l2(x, steps[k]), 1e-5) << tag << " step " << k;
                                      });
    const double e = modeltest::rel_l2(out, f.get(tag + ".final_latents"));
    EXPECT_LT(e, 1e-5) << tag;
    // The first expert alone is far from it: the check sees the switch.
    at::Generator g2 = at::make_generator<at::CPUGeneratorImpl>(std::stoull(f.meta("seed")));
    auto s2 = Sampler::make(so);
    EXPECT_GT(modeltest::rel_l2(sample_latents(*high, *s2, noise, pe, ne, 5.0, g2), f.get(tag + ".final_latents")), 1e-3);
    std::printf("%s: two-expert final latents rel L2 %.2e\n", tag.c_str(), e);
  }
}
