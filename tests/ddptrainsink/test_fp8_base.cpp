/* base-dtype=fp8 (layers.h LinearImpl::to_fp8): a LoRA run's frozen Linear weights as float8 e4m3
 * with a float32 scale per output row. Against the float32 base of the tiny Wan
 * (tests/reference/dit/wan_t2v_tiny): every weight within e4m3's rounding, the forward within the
 * quantisation error (and not equal), LoRA gradients flow, the stored bytes are numel + 4 per row
 * (half of bf16 at real widths), a few engine steps train, and the validators' snapshot rebuilds an
 * fp8 base. On LibTorch < 2.1 the same source checks the start error naming the requirement. */
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <string>
#include <vector>

#include "../models/ref_cases.h"
#include "ddptrainsink/trainer_engine.h"
#include "models/layers.h"
#include "models/native_model.h"
#include "models/param_snapshot.h"
#include "models/train_model.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::models;
using modeltest::rel_l2;

namespace {

std::string tiny() { return vttest::reference_dir() + "/dit/wan_t2v_tiny"; }

TrainerConfig wan_lora_config(const std::string &base_dtype) {
  TrainerConfig c;
  c.model = tiny();
  c.device = "cpu";
  c.seed = 5;
  c.lr = 1e-2;
  c.world_size = 1;
  c.rank = 0;
  c.native.lora_rank = 4;
  c.native.base_dtype = base_dtype;
  return c;
}

}  // namespace

TEST(Fp8Base, WithoutLoraIsAStartError) {
  auto c = wan_lora_config("fp8");
  c.native.lora_rank = 0;
  TrainerEngine e(c);
  EXPECT_FALSE(e.start());
  EXPECT_NE(e.error().find("base-dtype=fp8 stores a LoRA run's frozen base"), std::string::npos) << e.error();
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)

namespace {

// One fixed sample (the same noise and sigma every step: sample id and epoch fixed).
ModelInputs fixed_inputs() {
  auto g = at::detail::createCPUGenerator(77);
  ModelInputs in;
  in.latents = at::randn({1, 4, 2, 4, 4}, g);
  in.text_embeds = at::randn({1, 6, 32}, g);
  in.text_mask = torch::ones({1, 6}, torch::kLong);
  in.sample_ids = {3};
  return in;
}

}  // namespace

TEST(Fp8Base, EveryWeightWithinE4m3Rounding) {
  auto m = open_dit(tiny(), torch::kCPU);
  for (auto &p : m->module().parameters()) p.set_requires_grad(false);
  std::map<std::string, at::Tensor> before;
  for (auto &[n, l] : linear_modules(m->module())) before[n] = l->weight.clone();
  frozen_linears_to_fp8(m->module());
  ASSERT_FALSE(before.empty());
  at::Tensor all_ref, all_deq;
  std::vector<at::Tensor> refs, deqs;
  for (auto &[n, l] : linear_modules(m->module())) {
    ASSERT_TRUE(l->is_fp8()) << n;
    EXPECT_EQ(l->weight.scalar_type(), at::kFloat8_e4m3fn) << n;
    EXPECT_EQ(l->dtype(), at::kFloat) << n;
    const auto w = before[n], s = l->weight_scale;
    const auto deq = l->weight.to(at::kFloat) * s;
    // Round to nearest with 3 mantissa bits: at most 2^-4 of the value for normals; below e4m3's
    // smallest normal (2^-6) the spacing is the subnormals' 2^-9, so half of it (times the scale).
    const auto bound = (w.abs() * std::ldexp(1.0, -4) + s * std::ldexp(1.0, -10)) * 1.0001;
    EXPECT_TRUE(((deq - w).abs() <= bound).all().item<bool>()) << n;
    // The row's largest value is exact (it maps to 448).
    EXPECT_LT(rel_l2(deq.abs().amax(1), w.abs().amax(1)), 1e-6) << n;
    refs.push_back(w.flatten());
    deqs.push_back(deq.flatten());
  }
  // RMS of a uniform rounding error over a spacing of at most 2^-3 |w|: 2^-3 / sqrt(12) = 0.036.
  const double e = rel_l2(torch::cat(deqs), torch::cat(refs));
  std::printf("fp8 base weights: rel L2 %.3g over %zu Linears\n", e, refs.size());
  EXPECT_LT(e, 0.036);
  EXPECT_GT(e, 1e-3);  // they are quantised
}

TEST(Fp8Base, ForwardWithinQuantisationErrorAndLoraGradientsFlow) {
  auto ref = open_dit(tiny(), torch::kCPU);
  auto q = open_dit(tiny(), torch::kCPU);
  for (auto *m : {ref.get(), q.get()})
    for (auto &p : m->module().parameters()) p.set_requires_grad(false);
  frozen_linears_to_fp8(q->module());
  modeltest::RefFile cases("dit/wan_t2v_tiny/cases.safetensors");
  const std::string c = "b2_t3_h8_w12";
  const auto x = cases.get("input." + c + ".hidden_states"), t = cases.get("input." + c + ".timestep"),
             txt = cases.get("input." + c + ".encoder_hidden_states");
  const auto out_ref = ref->forward(x, t, txt), out_q = q->forward(x, t, txt);
  // Each Linear's output errs by about its weights' 0.036 (errors of many weights average); through
  // the blocks' residual stream and norms the tiny model stays near that: bound 5e-2.
  const double e = rel_l2(out_q, out_ref);
  std::printf("fp8 base forward: rel L2 %.3g against the float32 base\n", e);
  EXPECT_LT(e, 5e-2);
  EXPECT_GT(e, 1e-4);

  // LoRA on top: gradients reach every adapter, none the fp8 base.
  for (auto &[n, l] : linear_modules(q->module())) l->add_lora(4, 1.0);
  {
    torch::NoGradGuard ng;
    for (auto &[n, l] : linear_modules(q->module())) l->lora_b.normal_(0, 0.1);  // A's gradient is 0 while B is
  }
  const auto xg = x.clone().requires_grad_(true);
  q->forward(xg, t, txt).pow(2).mean().backward();
  size_t n_lora = 0;
  for (auto &[n, l] : linear_modules(q->module())) {
    ASSERT_TRUE(l->lora_a.grad().defined() && l->lora_b.grad().defined()) << n;
    EXPECT_GT(l->lora_a.grad().abs().sum().item<double>(), 0) << n;
    EXPECT_GT(l->lora_b.grad().abs().sum().item<double>(), 0) << n;
    EXPECT_FALSE(l->weight.grad().defined()) << n;
    n_lora++;
  }
  EXPECT_GT(n_lora, 10u);
  EXPECT_GT(xg.grad().abs().sum().item<double>(), 0);
}

TEST(Fp8Base, StoredBytesAreOnePerWeightPlusFourPerRow) {
  // The tiny model (widths 32..64) and Linears of Wan 1.3B's widths (1536, ffn 8960).
  auto m = open_dit(tiny(), torch::kCPU);
  for (auto &p : m->module().parameters()) p.set_requires_grad(false);
  auto measured = [](torch::nn::Module &mod, int64_t *numel) {
    int64_t bytes = 0;
    *numel = 0;
    for (auto &[n, l] : linear_modules(mod)) {
      bytes += l->weight.storage().nbytes() + (l->is_fp8() ? l->weight_scale.storage().nbytes() : 0);
      *numel += l->weight.numel();
    }
    return bytes;
  };
  int64_t numel = 0, rows = 0;
  const int64_t fp32_bytes = measured(m->module(), &numel);
  for (auto &[n, l] : linear_modules(m->module())) rows += l->out_features();
  EXPECT_EQ(fp32_bytes, 4 * numel);
  const int64_t reported = frozen_linears_to_fp8(m->module());
  int64_t numel2 = 0;
  const int64_t fp8_bytes = measured(m->module(), &numel2);
  EXPECT_EQ(numel2, numel);
  EXPECT_EQ(fp8_bytes, reported);
  EXPECT_EQ(fp8_bytes, numel + 4 * rows);
  const double tiny_ratio = double(fp8_bytes) / double(2 * numel);
  EXPECT_LT(tiny_ratio, 0.57);  // 1 byte + 4 / in (in >= 32) per weight against bf16's 2

  torch::nn::Sequential wide(Linear(1536, 1536), Linear(1536, 8960), Linear(8960, 1536));
  for (auto &p : wide->parameters()) p.set_requires_grad(false);
  int64_t wide_numel = 0;
  measured(*wide, &wide_numel);
  const double wide_ratio = double(frozen_linears_to_fp8(*wide)) / double(2 * wide_numel);
  int64_t check = 0;
  EXPECT_EQ(measured(*wide, &check), frozen_linears_to_fp8(*wide));  // a second call converts nothing again
  std::printf("fp8 base bytes / bf16 bytes: tiny Wan %.3f (%lld / %lld), 1.3B-width Linears %.4f\n", tiny_ratio,
              static_cast<long long>(fp8_bytes), static_cast<long long>(2 * numel), wide_ratio);
  EXPECT_LT(wide_ratio, 0.502);
  EXPECT_GT(wide_ratio, 0.5);
}

TEST(Fp8Base, EngineLoraRunTrainsAndItsSnapshotRebuildsAnFp8Base) {
  std::vector<double> first_loss;
  std::shared_ptr<const ParamSnapshot> snap;
  for (const std::string dt : {"bf16", "fp8"}) {
    TrainerEngine e(wan_lora_config(dt));
    ASSERT_TRUE(e.start()) << e.error();
    std::vector<double> losses;
    for (uint64_t s = 0; s < 4; s++) {
      BatchInfo info;
      info.sample_ids = {3};
      info.next_clip = s + 1;
      ASSERT_EQ(e.process_inputs(fixed_inputs(), info), ProcessResult::kOk) << e.error();
      losses.push_back(e.last_loss());
    }
    std::printf("base-dtype=%s: losses %.5f %.5f %.5f %.5f\n", dt.c_str(), losses[0], losses[1], losses[2], losses[3]);
    EXPECT_LT(losses[3], losses[0]) << dt;  // the LoRA trains on the fp8 base
    first_loss.push_back(losses[0]);
    if (dt == "fp8") snap = e.snapshot_state();
    ASSERT_TRUE(e.finish()) << e.error();
  }
  // Step 0 (B = 0): the base's forward alone, within the quantisation error of the float32 base.
  EXPECT_LT(std::abs(first_loss[1] - first_loss[0]), 5e-2 * first_loss[0]);
  EXPECT_NE(first_loss[1], first_loss[0]);

  // What ddpvalsink and ddpsampler do with the snapshot: build from its options (an fp8 base from the
  // folder), copy the LoRA in; the same loss as the same LoRA on a float32 base, to quantisation error.
  ASSERT_TRUE(snap);
  EXPECT_EQ(snap->options.base_dtype, "fp8");
  auto from_snap = make_model(snap->model, snap->dims, torch::kCPU, snap->options);
  load_snapshot(*from_snap, *snap);
  size_t fp8_linears = 0;
  for (auto &[n, l] : linear_modules(from_snap->dit()->module())) fp8_linears += l->is_fp8();
  EXPECT_EQ(fp8_linears, linear_modules(from_snap->dit()->module()).size());
  ModelOptions f32 = snap->options;
  f32.base_dtype = "bf16";
  auto on_f32 = make_model(snap->model, snap->dims, torch::kCPU, f32);
  load_snapshot(*on_f32, *snap);
  torch::NoGradGuard ng;
  const auto v8 = from_snap->validation_step(fixed_inputs(), {11});
  const auto v32 = on_f32->validation_step(fixed_inputs(), {11});
  ASSERT_TRUE(v8.defined() && v32.defined());
  EXPECT_TRUE(torch::isfinite(v8).all().item<bool>());
  const double e = rel_l2(v8, v32);
  std::printf("snapshot's validation loss on the fp8 base: rel L2 %.3g against the float32 base\n", e);
  EXPECT_LT(e, 5e-2);
  EXPECT_GT(e, 0);
}

// Wan 2.2 A14B in one model (model-2): both experts' bases are fp8 and both LoRAs train.
TEST(Fp8Base, TwoExpertsBothHoldAnFp8Base) {
  ModelOptions o;
  o.lora_rank = 4;
  o.base_dtype = "fp8";
  o.model_2 = tiny();
  o.boundary_ratio = 0.5;
  auto m = make_model(tiny(), {}, torch::kCPU, o);
  ASSERT_TRUE(m->dit() && m->dit_2());
  for (auto *d : {m->dit(), m->dit_2()})
    for (auto &[n, l] : linear_modules(d->module())) EXPECT_TRUE(l->is_fp8()) << n;
  auto in = fixed_inputs();
  in.latents = torch::cat({in.latents, in.latents});  // two samples: with ids 3 and 4 their sigmas differ
  in.text_embeds = torch::cat({in.text_embeds, in.text_embeds});
  in.text_mask = torch::cat({in.text_mask, in.text_mask});
  in.sample_ids = {3, 4};
  const auto loss = m->training_step(in);
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  size_t with_grad = 0;
  for (auto &[n, t] : m->named_parameters()) with_grad += t.grad().defined();
  EXPECT_EQ(with_grad, m->named_parameters().size());
}

#else

TEST(Fp8Base, StartFailsNamingTheLibTorchRequirement) {
  TrainerEngine e(wan_lora_config("fp8"));
  EXPECT_FALSE(e.start());
  EXPECT_NE(e.error().find("base-dtype=fp8 needs LibTorch 2.1 or later"), std::string::npos) << e.error();
  Linear l(4, 4);
  l->weight.set_requires_grad(false);
  EXPECT_THROW(l->to_fp8(), std::runtime_error);
  EXPECT_FALSE(fp8_unavailable().empty());
}

#endif
