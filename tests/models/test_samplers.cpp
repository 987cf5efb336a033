/* The inference samplers against diffusers' schedulers (tests/reference/schedulers): schedules,
 * single steps on shared model outputs (flow-matching Euler, UniPC, CogVideoX DDIM and the stochastic
 * DPM with its generator), and WanPipeline's whole guided loop over the tiny Wan transformer. */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/native_model.h"
#include "models/samplers.h"
#include "models/schedules.h"
#include "ref_cases.h"
#include "test_util.h"

using namespace videotrain::models;
using modeltest::RefFile;
using modeltest::rel_l2;

namespace {

at::Tensor as_tensor(const std::vector<double> &v, at::ScalarType t) {
  return at::tensor(v, at::kDouble).to(t);
}

SamplerOptions options(SamplerKind kind, int steps, double shift) {
  SamplerOptions o;
  o.kind = kind;
  o.steps = steps;
  o.flow_shift = shift;
  o.snr_shift_scale = shift;
  return o;
}

// Steps the shared model outputs through our sampler from the shared start; every step within 1e-5.
void check_steps(const RefFile &f, const std::string &tag, SamplerKind kind, double shift, uint64_t seed) {
  auto s = Sampler::make(options(kind, 8, shift));
  const at::Tensor outs = f.get(tag + ".n8.steps.model_outputs"), samples = f.get(tag + ".n8.steps.samples");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor x = samples[0];
  for (int k = 0; k < 8; ++k) {
    x = s->step(k, outs[k], x, gen);
    EXPECT_LT(rel_l2(x, samples[k + 1]), 1e-5) << tag << " step " << k;
  }
}

}  // namespace

TEST(Schedules, FlowMatchAndUniPCEqualDiffusers) {
  RefFile f("schedulers/schedules.safetensors");
  ASSERT_TRUE(f.ok());
  for (double shift : {3.0, 5.0}) {
    const std::string sh = "shift" + std::to_string(int(shift));
    for (int n : {8, 10, 50}) {
      const std::string fm = "flowmatch." + sh + ".n" + std::to_string(n), un = "unipc." + sh + ".n" + std::to_string(n);
      const auto a = flowmatch_schedule(n, shift);
      EXPECT_LT(rel_l2(as_tensor(a.timesteps, at::kFloat), f.get(fm + ".timesteps")), 1e-6) << fm;
      EXPECT_LT(rel_l2(as_tensor(a.sigmas, at::kFloat), f.get(fm + ".sigmas")), 1e-6) << fm;
      EXPECT_FALSE(a.integer_timesteps);
      const auto b = unipc_flow_schedule(n, shift);
      EXPECT_TRUE(torch::equal(as_tensor(b.timesteps, at::kLong), f.get(un + ".timesteps"))) << un;
      EXPECT_LT(rel_l2(as_tensor(b.sigmas, at::kFloat), f.get(un + ".sigmas")), 1e-6) << un;
    }
  }
}

TEST(Schedules, CogVideoXAlphasAndTimestepsEqualDiffusers) {
  RefFile f("schedulers/schedules.safetensors");
  ASSERT_TRUE(f.ok());
  for (const char *kind : {"ddim", "dpm"}) {
    for (double snr : {1.0, 3.0}) {
      const std::string tag = std::string("cogvideox_") + kind + ".snr" + std::to_string(int(snr));
      const at::Tensor ref = f.get(tag + ".alphas_cumprod");
      const at::Tensor ours = as_tensor(cogvideox_alphas_cumprod(snr), at::kDouble);
      EXPECT_LT((ours - ref).abs().max().item<double>(), 1e-15) << tag;
      EXPECT_EQ(ours[999].item<double>(), 0.0);
      for (int n : {8, 50})
        EXPECT_TRUE(torch::equal(as_tensor(trailing_schedule(n).timesteps, at::kLong),
                                 f.get(tag + ".n" + std::to_string(n) + ".timesteps")))
            << tag << " n" << n;
    }
  }
}

TEST(Samplers, StepsEqualDiffusersSchedulers) {
  RefFile f("schedulers/schedules.safetensors");
  ASSERT_TRUE(f.ok());
  const uint64_t dpm_seed = std::stoull(f.meta("dpm_generator_seed"));
  for (double s : {3.0, 5.0}) {
    const std::string sh = std::to_string(int(s));
    check_steps(f, "flowmatch.shift" + sh, SamplerKind::FlowEuler, s, 0);
    check_steps(f, "unipc.shift" + sh, SamplerKind::UniPC, s, 0);
  }
  for (double snr : {1.0, 3.0}) {
    const std::string sn = std::to_string(int(snr));
    check_steps(f, "cogvideox_ddim.snr" + sn, SamplerKind::CogVideoXDDIM, snr, 0);
    check_steps(f, "cogvideox_dpm.snr" + sn, SamplerKind::CogVideoXDPM, snr, dpm_seed);
  }
}

TEST(Samplers, DpmDrawsFromThePipelineGenerator) {
  // Another seed must change the result: the DPM step is stochastic even at eta 0.
  RefFile f("schedulers/schedules.safetensors");
  ASSERT_TRUE(f.ok());
  auto s = Sampler::make(options(SamplerKind::CogVideoXDPM, 8, 3.0));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor outs = f.get("cogvideox_dpm.snr3.n8.steps.model_outputs");
  const at::Tensor samples = f.get("cogvideox_dpm.snr3.n8.steps.samples");
  EXPECT_GT(rel_l2(s->step(0, outs[0], samples[0], gen), samples[1]), 1e-3);
}

TEST(Samplers, WanPipelineLoopEqualsDiffusers) {
  RefFile f("schedulers/wan_sampling_loop.safetensors");
  ASSERT_TRUE(f.ok());
  auto model = open_dit(vttest::reference_dir() + "/dit/wan_t2v_tiny", torch::kCPU);
  const at::Tensor prompt = f.get("prompt_embeds"), negative = f.get("negative_prompt_embeds");
  for (const auto &[tag, kind] : {std::pair<std::string, SamplerKind>{"flowmatch_shift3", SamplerKind::FlowEuler},
                                  {"unipc_shift3", SamplerKind::UniPC}}) {
    auto s = Sampler::make(options(kind, 8, 3.0));
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(std::stoull(f.meta("seed")));
    // The pipeline's initial noise: torch.randn(shape) from a CPU generator seeded with the seed.
    const at::Tensor noise = at::randn({1, 4, 3, 8, 12}, gen, at::TensorOptions(at::kFloat));
    EXPECT_TRUE(torch::equal(noise, f.get("initial_noise")));
    const at::Tensor steps = f.get(tag + ".latents_after_step");
    const at::Tensor out = sample_latents(*model, *s, noise, prompt, negative, 5.0, gen,
                                          [&](int k, const at::Tensor &x) {
                                            EXPECT_LT(rel_l2(x, steps[k]), 1e-5) << tag << " step " << k;
                                          });
    const double e = rel_l2(out, f.get(tag + ".final_latents"));
    EXPECT_LT(e, 1e-5) << tag;
    std::printf("%s: final latents rel L2 %.2e\n", tag.c_str(), e);
  }
}

TEST(Samplers, BadChoicesAreErrors) {
  EXPECT_THROW(parse_sampler("heun"), std::invalid_argument);
  EXPECT_THROW(Sampler::make(options(SamplerKind::UniPC, 0, 3.0)), std::invalid_argument);
  EXPECT_THROW(Sampler::make(options(SamplerKind::FlowEuler, 8, 0.0)), std::invalid_argument);
  EXPECT_THROW(Sampler::make(options(SamplerKind::CogVideoXDDIM, 8, -1.0)), std::invalid_argument);
  EXPECT_EQ(parse_sampler("dpm"), SamplerKind::CogVideoXDPM);
  EXPECT_STREQ(sampler_family(SamplerKind::UniPC), "wan");
}
