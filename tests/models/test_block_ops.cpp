/* The ops one transformer block runs per training step (models/op_count.h: dispatcher calls, leaf
 * kernels, casts of the weights), Wan and CogVideoX, float32 and bf16 autocast, with each kind of
 * checkpointing: a model of two blocks less the same model with one. What is checked: under bf16
 * autocast every trainable float32 weight is cast once per step, in the forward, and never again in
 * a checkpointed block's recompute (it reuses the forward's bf16 copy), with the gradients of no
 * checkpointing; a recompute runs no more kernels than the forward it repeats. The table printed is
 * the one in docs (performance). */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/autocast_guard.h"
#include "models/layers.h"
#include "models/native_model.h"
#include "models/op_count.h"
#include "ref_cases.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::models;

namespace {

struct Family {
  std::string folder;  // tests/reference/dit/<folder>/config.json
  std::function<std::vector<at::Tensor>(const nlohmann::json &c)> inputs;  // hidden_states, timestep, text
};

Family wan() {
  return {"wan_t2v_tiny", [](const nlohmann::json &c) {
            return std::vector<at::Tensor>{torch::randn({1, c["in_channels"].get<int64_t>(), 2, 4, 6}),
                                           torch::tensor({400.0}), torch::randn({1, 7, c["text_dim"].get<int64_t>()})};
          }};
}

Family cogvideox() {  // 5B's layout: rotary positions, text rows first in the joint sequence
  return {"cogvideox_5b_tiny", [](const nlohmann::json &c) {
            return std::vector<at::Tensor>{torch::randn({1, 2, c["in_channels"].get<int64_t>(), 4, 6}),
                                           torch::tensor({400.0}),
                                           torch::randn({1, 5, c["text_embed_dim"].get<int64_t>()})};
          }};
}

nlohmann::json config(const Family &f, int layers) {
  auto j = nlohmann::json::parse(std::ifstream(vttest::reference_dir() + "/dit/" + f.folder + "/config.json"));
  j["num_layers"] = layers;
  return j;
}

struct Step {
  OpCounts forward, backward;
  std::vector<std::pair<std::string, at::Tensor>> grads;
};

// One forward (under bf16 autocast when `bf16`) and backward of a `layers`-block model, counted.
Step run(const Family &f, int layers, Checkpointing mode, bool bf16) {
  const auto c = config(f, layers);
  torch::manual_seed(3);
  auto m = build_dit(c.dump(), torch::kCPU);
  m->set_checkpointing(mode);
  torch::manual_seed(4);
  const auto in = f.inputs(c);
  std::vector<at::Tensor> params;
  for (auto &p : m->module().parameters()) params.push_back(p);
  Step s;
  {
    OpCounter count(params);
    at::Tensor out;
    {
      AutocastGuard cast(bf16, false);
      out = m->forward(in[0], in[1], in[2]);
    }
    const auto loss = out.to(torch::kFloat).square().mean();
    s.forward = count.counts();
    loss.backward();
    s.backward = count.counts() - s.forward;
  }
  for (const auto &p : m->module().named_parameters(true)) s.grads.emplace_back(p.key(), p.value().grad());
  return s;
}

struct PerBlock {
  OpCounts forward, backward;
};

PerBlock per_block(const Family &f, Checkpointing mode, bool bf16) {
  const auto one = run(f, 1, mode, bf16), two = run(f, 2, mode, bf16);
  return {two.forward - one.forward, two.backward - one.backward};
}

// Float32 tensors of one block that autocast's linears would cast (Linear weights and biases).
int64_t castable_tensors(const Family &f) {
  auto m = build_dit(config(f, 1).dump(), torch::kCPU);
  int64_t n = 0;
  for (const auto &[name, l] : linear_modules(m->module()))
    if (name.find("blocks.0.") != std::string::npos) n += 1 + l->bias.defined();
  return n;
}

void report(const std::string &name, const PerBlock &b) {
  std::printf("%-44s forward %4lld ops %4lld kernels %3lld weight casts | backward %4lld ops %4lld kernels %3lld weight casts\n",
              name.c_str(), (long long)b.forward.ops, (long long)b.forward.kernels, (long long)b.forward.weight_casts,
              (long long)b.backward.ops, (long long)b.backward.kernels, (long long)b.backward.weight_casts);
}

void check_family(const Family &f) {
  const int64_t castable = castable_tensors(f);
  ASSERT_GT(castable, 8);
  for (const bool bf16 : {false, true}) {
    const auto none = per_block(f, Checkpointing::none, bf16);
    report(f.folder + (bf16 ? " bf16" : " fp32") + " none", none);
    EXPECT_EQ(none.forward.weight_casts, bf16 ? castable : 0);
    EXPECT_EQ(none.backward.weight_casts, 0);
    for (const auto mode : {Checkpointing::full, Checkpointing::selective}) {
      const auto b = per_block(f, mode, bf16);
      const std::string name = f.folder + (bf16 ? " bf16 " : " fp32 ") + checkpointing_name(mode);
      report(name, b);
      SCOPED_TRACE(name);
      // Each weight cast once, in the forward; the recompute takes the forward's casts.
      EXPECT_EQ(b.forward.weight_casts, bf16 ? castable : 0);
      EXPECT_EQ(b.backward.weight_casts, 0);
    }
  }
}

// bf16 autocast, full and selective checkpointing: the recompute on the forward's weight casts
// gives every parameter the gradient (bit for bit) that casting again gives, which autocast alone
// does (set_keep_weight_casts(false): one more cast per weight, in backward); and, to bf16
// rounding, the gradient of no checkpointing.
void check_bf16_gradients(const Family &f) {
  const auto none = run(f, 2, Checkpointing::none, true);
  for (const auto mode : {Checkpointing::full, Checkpointing::selective}) {
    SCOPED_TRACE(f.folder + " " + checkpointing_name(mode));
    const auto kept = run(f, 2, mode, true);
    set_keep_weight_casts(false);
    const auto again = run(f, 2, mode, true);
    set_keep_weight_casts(true);
    EXPECT_EQ(kept.backward.weight_casts, 0);
    EXPECT_EQ(again.backward.weight_casts, 2 * castable_tensors(f));  // two blocks
    EXPECT_LT(kept.backward.kernels, again.backward.kernels);
    ASSERT_EQ(kept.grads.size(), again.grads.size());
    double worst = 0;
    for (size_t i = 0; i < kept.grads.size(); i++) {
      const auto &[name, g] = kept.grads[i];
      ASSERT_TRUE(g.defined()) << name;
      EXPECT_TRUE(torch::equal(g, again.grads[i].second)) << name;
      const double e = modeltest::rel_l2(g, none.grads[i].second);
      EXPECT_LT(e, 2e-2) << name;
      worst = std::max(worst, e);
    }
    std::printf("%s bf16 %s: weight casts in backward %lld (cast again: %lld), gradients equal bit for bit; "
                "against no checkpointing at most %.2g (bf16 rounding)\n", f.folder.c_str(), checkpointing_name(mode),
                (long long)kept.backward.weight_casts, (long long)again.backward.weight_casts, worst);
  }
}

}  // namespace

TEST(BlockOps, Wan) { check_family(wan()); }
TEST(BlockOps, CogVideoX) { check_family(cogvideox()); }
TEST(BlockOps, Bf16CheckpointedGradientsWan) { check_bf16_gradients(wan()); }
TEST(BlockOps, Bf16CheckpointedGradientsCogVideoX) { check_bf16_gradients(cogvideox()); }
