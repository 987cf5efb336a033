/* The CUDA paths, run where LibTorch sees a CUDA device (elsewhere each test skips with
 * the reason: CUDA behaviour cannot be exercised on a CPU-only machine, whose paths have
 * their own tests). Tolerances allow for TF32 convolutions (cuDNN's default) and bf16.
 *  - vaeencoder on cuda:0 matches diffusers' reference cases in float32 and bfloat16, also
 *    with norm-scope=clip (the single pass);
 *  - ddptrainsink defaults to cuda:LOCAL_RANK (bf16 there); its fp32 steps on cuda:0
 *    give the CPU engine's weights; bf16 autocast trains tiny-unet3d (the loss falls);
 *  - the native CogVideoX transformer on cuda:0 matches diffusers in float32 and runs forward and
 *    backward under bf16 autocast with checkpointing for each layout (2b, 5b, 1.5). */
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/autocast_guard.h"
#include "ddptrainsink/trainer_engine.h"
#include "models/native_model.h"
#include "models/ref_cases.h"
#include "vaeencoder/vae_test_util.h"

using namespace videotrain;
using namespace videotrain::vae;

namespace {

#define REQUIRE_CUDA()                                                                          \
  if (!torch::cuda::is_available())                                                             \
  GTEST_SKIP() << "no CUDA device visible to LibTorch: the CUDA paths cannot run on this machine"

EngineOptions vae_options(const std::string &device, const std::string &dtype) {
  EngineOptions o;
  o.model = vaetest::tiny_a_dir();
  o.device = device;
  o.dtype = dtype;
  return o;
}

at::Tensor sample(int step, int k) {
  auto g = at::detail::createCPUGenerator(700 + step * 13 + k);
  return at::randn({4, 2, 8, 8}, g);
}

BatchInfo info_for(int m) {
  BatchInfo i;
  i.step_samples = static_cast<unsigned>(m);
  for (int k = 0; k < m; k++) i.captions.push_back(k % 2 ? "a red car" : "a cat");
  return i;
}

TrainerConfig trainer_config(const std::string &model, const std::string &device, const std::string &precision) {
  TrainerConfig c;
  c.model = model;
  c.device = device;
  c.precision = precision;
  c.lr = 1e-3;
  c.seed = 5;
  c.rank = 0;
  c.world_size = 1;
  c.log_every = 0;
  return c;
}

std::vector<double> train(TrainerEngine &e, int steps, bool same_batch = false) {
  std::vector<double> losses;
  for (int s = 0; s < steps; s++) {
    const int d = same_batch ? 0 : s;
    EXPECT_EQ(e.process_tensor(at::stack({sample(d, 0), sample(d, 1)}), info_for(2)), ProcessResult::kOk) << e.error();
    losses.push_back(e.last_loss());
  }
  return losses;
}

}  // namespace

TEST(CudaVae, EncodeMatchesDiffusersInFloat32AndBfloat16) {
  REQUIRE_CUDA();
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  for (auto [dtype, tol] : {std::pair<std::string, double>{"float32", 1e-2}, {"bfloat16", 5e-2}}) {
    auto eng = vaetest::make_engine(vae_options("cuda:0", dtype));
    ASSERT_TRUE(eng);
    EXPECT_EQ(eng->device_name(), "cuda:0");
    for (int T : {1, 9, 25}) {
      const std::string s = ".T" + std::to_string(T);
      at::Tensor raw = encode_raw(*eng, cases.get("input" + s)).to(at::kCPU, at::kFloat);
      at::Tensor ref = cases.get("chunked" + s);
      ASSERT_EQ(raw.sizes(), ref.sizes()) << dtype << s;
      EXPECT_LT(vaetest::rel_l2(raw, ref), tol) << dtype << s;
    }
  }
}

// norm-scope=clip on cuda:0: whole-clip statistics (accumulated in float32 from bf16 activations),
// levels in host memory, against diffusers' single pass.
TEST(CudaVae, ClipScopeMatchesDiffusersSinglePassInFloat32AndBfloat16) {
  REQUIRE_CUDA();
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  for (auto [dtype, tol] : {std::pair<std::string, double>{"float32", 1e-2}, {"bfloat16", 5e-2}}) {
    EngineOptions o = vae_options("cuda:0", dtype);
    o.norm_scope = NormScope::Clip;
    auto eng = vaetest::make_engine(o);
    ASSERT_TRUE(eng);
    for (int T : {9, 25}) {
      const std::string s = ".T" + std::to_string(T);
      at::Tensor raw = encode_raw(*eng, cases.get("input" + s)).to(at::kCPU, at::kFloat);
      EXPECT_LT(vaetest::rel_l2(raw, cases.get("single_pass" + s)), tol) << dtype << s;
    }
  }
}

TEST(CudaTrainer, DefaultsToCudaLocalRank) {
  REQUIRE_CUDA();
  TrainerEngine e(trainer_config("builtin:linear-test", "", "auto"));
  ASSERT_TRUE(e.start()) << e.error();
  EXPECT_EQ(e.device_name(), "cuda:0");
  train(e, 2);
  EXPECT_TRUE(std::isfinite(e.last_loss()));
}

TEST(CudaTrainer, Fp32StepsGiveTheCpuWeights) {
  REQUIRE_CUDA();
  TrainerEngine cpu(trainer_config("builtin:linear-test", "cpu", "fp32"));
  TrainerEngine gpu(trainer_config("builtin:linear-test", "cuda:0", "fp32"));
  ASSERT_TRUE(cpu.start()) << cpu.error();
  ASSERT_TRUE(gpu.start()) << gpu.error();
  auto lc = train(cpu, 4), lg = train(gpu, 4);
  for (size_t i = 0; i < lc.size(); i++) EXPECT_NEAR(lg[i], lc[i], 1e-3 * std::abs(lc[i])) << "step " << i + 1;
  auto pc = cpu.parameters_cpu(), pg = gpu.parameters_cpu();
  ASSERT_EQ(pc.size(), pg.size());
  for (const auto &[name, v] : pc) {
    const auto &w = pg[name];
    ASSERT_EQ(w.size(), v.size()) << name;
    double d2 = 0, n2 = 0;
    for (size_t i = 0; i < v.size(); i++) {
      d2 += (double(w[i]) - v[i]) * (double(w[i]) - v[i]);
      n2 += double(v[i]) * v[i];
    }
    EXPECT_LT(std::sqrt(d2 / std::max(n2, 1e-30)), 1e-3) << name;
  }
}

TEST(CudaTrainer, Bf16AutocastTrainsTinyUnet3d) {
  REQUIRE_CUDA();
  TrainerEngine e(trainer_config("builtin:tiny-unet3d", "cuda:0", "bf16"));
  ASSERT_TRUE(e.start()) << e.error();
  auto l = train(e, 40, /*same_batch=*/true);
  double first = 0, last = 0;
  for (int i = 0; i < 5; i++) first += l[i] / 5, last += l[35 + i] / 5;
  EXPECT_LT(last, 0.8 * first) << "bf16 loss did not fall: " << first << " -> " << last;
  for (const auto &[name, v] : e.parameters_cpu())
    for (float x : v) ASSERT_TRUE(std::isfinite(x)) << name;
}

TEST(CudaCogVideoX, MatchesDiffusersInFloat32AndRunsInBf16) {
  REQUIRE_CUDA();
  const c10::Device dev("cuda:0");
  for (const std::string name : {"cogvideox_2b_tiny", "cogvideox_5b_tiny", "cogvideox15_tiny"}) {
    SCOPED_TRACE(name);
    auto m = models::open_dit(vttest::reference_dir() + "/dit/" + name, dev);
    m->set_gradient_checkpointing(true);
    modeltest::RefFile cases("dit/" + name + "/cases.safetensors");
    const std::string c = name == "cogvideox15_tiny" ? "b2_t4_h8_w12" : "b2_t3_h8_w12";
    const auto t = cases.get("input." + c + ".timestep").to(dev);
    const auto text = cases.get("input." + c + ".encoder_hidden_states").to(dev);
    for (const bool bf16 : {false, true}) {
      auto x = cases.get("input." + c + ".hidden_states").to(dev).requires_grad_(true);
      at::Tensor out;
      {
        AutocastGuard cast(bf16, true);
        out = m->forward(x, t, text);
      }
      (out.to(at::kFloat) * cases.get("cotangent." + c).to(dev)).sum().backward();
      const double e = modeltest::rel_l2(out.detach().cpu(), cases.get("output." + c));
      const double g = modeltest::rel_l2(x.grad().cpu(), cases.get("grad_input." + c + ".hidden_states"));
      std::printf("%s on cuda:0 %s: output %.2g, grad hidden_states %.2g\n", name.c_str(), bf16 ? "bf16 autocast" : "float32",
                  e, g);
      EXPECT_LT(e, bf16 ? 2e-2 : 1e-3);  // float32: cuDNN's TF32 convolution (2b's patch embedding)
      EXPECT_LT(g, bf16 ? 2e-2 : 1e-3);
      for (auto &p : m->module().parameters()) {
        ASSERT_TRUE(torch::isfinite(p.grad()).all().item<bool>());
        p.mutable_grad() = at::Tensor();
      }
    }
  }
}
